/* Program assembly (the shared files a kernel file needs, then the file), build, in-memory
 * program/kernel cache. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


char *clattn__load_source(const char *file, size_t *len)
{
    /* Development override: edit the kernels in cl/ and rerun without rebuilding the library. A
     * file missing there, or not a regular file (a FIFO would block the open), or a path too long
     * for the buffer (cut short it names another file), falls back to the embedded copy. */
    const char *dir = getenv("CLATTN_KERNEL_DIR");
    char path[4096];
    const int n = dir && *dir ? snprintf(path, sizeof path, "%s/%s", dir, file) : -1;
    const int fd = n > 0 && (size_t)n < sizeof path ? open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
    struct stat st;
    FILE *f = NULL;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !(f = fdopen(fd, "rb"))))
        close(fd);
    if (f) {
        char *buf = NULL;
        long size = -1;
        if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
            (buf = malloc((size_t)size + 1)) && fread(buf, 1, (size_t)size, f) == (size_t)size) {
            buf[size] = '\0';
            fclose(f);
            *len = (size_t)size;
            return buf;
        }
        free(buf);
        fclose(f);
    }
    for (int i = 0; i < clattn_kernel_source_count; i++)
        if (strcmp(clattn_kernel_sources[i].name, file) == 0) {
            char *buf = malloc(clattn_kernel_sources[i].length + 1);
            if (!buf)
                return NULL;
            memcpy(buf, clattn_kernel_sources[i].text, clattn_kernel_sources[i].length);
            buf[clattn_kernel_sources[i].length] = '\0';
            *len = clattn_kernel_sources[i].length;
            return buf;
        }
    return NULL;
}

/* The files a program of each kernel file is assembled from, in order, before the file itself:
 * one kernel family a file, the rules several families share in files of their own. A file not
 * listed takes common.cl alone (a file added through CLATTN_KERNEL_DIR); common.cl takes nothing. */
#define MAX_SHARED 5
static const struct {
    const char *file;
    const char *shared[MAX_SHARED]; /* NULL-terminated when shorter */
} program_parts[] = {
    {"common.cl", {NULL}},
    {"softmax.cl", {"common.cl"}},
    {"merge.cl", {"common.cl"}},
    {"mask_pass.cl", {"common.cl"}},
    {"layout.cl", {"common.cl", "gemm_common.cl"}},
    {"gemm_tiled.cl", {"common.cl", "gemm_common.cl"}},
    {"gemm_direct.cl", {"common.cl", "kv_access.cl", "gemm_common.cl"}},
    {"fused_tiled.cl", {"common.cl", "kv_access.cl", "attn_common.cl"}},
    {"scores_variant.cl", {"common.cl", "kv_access.cl", "attn_common.cl"}},
    {"fused_direct.cl", {"common.cl", "kv_access.cl", "attn_common.cl", "fused_cpu_common.cl"}},
    {"fused_lanes.cl", {"common.cl", "kv_access.cl", "attn_common.cl", "fused_cpu_common.cl"}},
    {"decode.cl", {"common.cl", "kv_access.cl", "attn_common.cl"}},
    {"decode_lanes.cl", {"common.cl", "kv_access.cl", "attn_common.cl"}},
    {"fused_mma.cl", {"common.cl", "kv_access.cl", "attn_common.cl", "mma_layout.cl", "mma.cl"}},
    {"kv_append.cl", {"common.cl", "kv_access.cl"}},
    {"backward.cl", {"common.cl", "kv_access.cl", "attn_common.cl"}},
};
static const char *const default_parts[MAX_SHARED] = {"common.cl"};

/* The shared files of `file` (at most MAX_SHARED, NULL past the last). */
static const char *const *shared_parts(const char *file)
{
    for (size_t i = 0; i < sizeof program_parts / sizeof program_parts[0]; i++)
        if (strcmp(program_parts[i].file, file) == 0)
            return program_parts[i].shared;
    return default_parts;
}

static int uses_attn_common(const char *file)
{
    const char *const *shared = shared_parts(file);
    for (int i = 0; i < MAX_SHARED && shared[i]; i++)
        if (strcmp(shared[i], "attn_common.cl") == 0)
            return 1;
    return 0;
}

/* The program text of `file`: each shared file, then the file, each after a "#line 1" marker so
 * that build-log lines point into the right file; during a call with the user's score_mod or
 * mask_mod (ctx->variant_src), their text goes before attn_common.cl, marked "score_mod" and
 * "mask_mod". NULL when a file is missing (*missing names it) or memory is short (*missing NULL). */
static char *assemble(const clattn_context *ctx, const char *file, const char **missing)
{
    const char *const *shared = shared_parts(file);
    const char *names[MAX_SHARED + 3];
    char *texts[MAX_SHARED + 3] = {NULL};
    const char *user[MAX_SHARED + 3] = {NULL}; /* the user's text in place of a file's */
    size_t lens[MAX_SHARED + 3], cap = 1;
    int n = 0;
    for (int i = 0; i < MAX_SHARED && shared[i]; i++) {
        if (strcmp(shared[i], "attn_common.cl") == 0) {
            if (ctx->variant_src[0]) {
                user[n] = ctx->variant_src[0];
                names[n++] = "score_mod";
            }
            if (ctx->variant_src[1]) {
                user[n] = ctx->variant_src[1];
                names[n++] = "mask_mod";
            }
        }
        names[n++] = shared[i];
    }
    names[n++] = file;
    char *src = NULL;
    *missing = NULL;
    for (int i = 0; i < n; i++) {
        if (user[i]) {
            lens[i] = strlen(user[i]);
        } else if (!(texts[i] = clattn__load_source(names[i], &lens[i]))) {
            *missing = names[i];
            goto done;
        }
        cap += lens[i] + strlen(names[i]) + 16;
    }
    src = malloc(cap);
    if (src) {
        size_t at = 0;
        for (int i = 0; i < n; i++)
            at += (size_t)snprintf(src + at, cap - at, "#line 1 \"%s\"\n%s\n", names[i], user[i] ? user[i] : texts[i]);
    }
done:
    for (int i = 0; i < n; i++)
        free(texts[i]);
    return src;
}

/* " (after a.cl, b.cl)" naming the shared files of `file` besides common.cl, which every program
 * starts with (empty without), for messages: a build that fails in a shared file says so. */
static void parts_note(const char *file, char *buf, size_t size)
{
    const char *const *shared = shared_parts(file);
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < MAX_SHARED && shared[i] && at < size; i++) {
        if (strcmp(shared[i], "common.cl") == 0)
            continue;
        const int k = snprintf(buf + at, size - at, "%s%s", at ? ", " : " (after ", shared[i]);
        if (k < 0)
            break;
        at += (size_t)k;
    }
    if (at > 0 && at < size)
        snprintf(buf + at, size - at, ")");
}

static void cache_key(const clattn_context *ctx, const char *src, const char *options, char hex[33])
{
    clattn_hash h;
    clattn__hash_init(&h);
    clattn__hash_str(&h, CLATTN_VERSION_STRING);
    clattn__hash_str(&h, src);
    clattn__hash_str(&h, options);
    clattn__hash_str(&h, ctx->dev.platform_name);
    clattn__hash_str(&h, ctx->dev.platform_version);
    clattn__hash_str(&h, ctx->dev.name);
    clattn__hash_str(&h, ctx->dev.version);
    clattn__hash_str(&h, ctx->dev.driver);
    clattn__hash_bytes(&h, &ctx->dev.vendor_id, sizeof ctx->dev.vendor_id);
    clattn__hash_hex(&h, hex);
}

static void keep_build_log(clattn_context *ctx, cl_program prog)
{
    size_t n = 0;
    if (clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS)
        return;
    char *log = malloc(n + 1);
    if (!log)
        return;
    if (clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, n, log, NULL) != CL_SUCCESS)
        n = 0;
    log[n] = '\0';
    free(ctx->build_log);
    ctx->build_log = log;
}

static cl_program from_binary(clattn_context *ctx, const char *hex, const char *options)
{
    size_t size = 0;
    unsigned char *bin = clattn__cache_load(ctx, hex, &size);
    if (!bin)
        return NULL;
    cl_int status = CL_SUCCESS, err;
    const unsigned char *bins[1] = {bin};
    cl_program prog =
        clCreateProgramWithBinary(ctx->context, 1, &ctx->device, &size, bins, &status, &err);
    free(bin);
    if (!prog || err != CL_SUCCESS || status != CL_SUCCESS ||
        clBuildProgram(prog, 1, &ctx->device, options, NULL, NULL) != CL_SUCCESS) {
        /* A binary the driver refuses (other driver build, damaged file) is rebuilt from source. */
        if (prog)
            clReleaseProgram(prog);
        ctx->stats.disk_rejects++;
        return NULL;
    }
    ctx->stats.disk_hits++;
    return prog;
}

static void to_disk(clattn_context *ctx, cl_program prog, const char *hex)
{
    size_t size = 0;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS ||
        size == 0)
        return;
    unsigned char *bin = malloc(size);
    if (!bin)
        return;
    unsigned char *bins[1] = {bin};
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS)
        clattn__cache_store(ctx, hex, bin, size);
    free(bin);
}

/* *from_disk (may be NULL) says whether the program came from the binary cache; read_cache 0
 * builds from source whatever the cache holds (and replaces its file). */
static clattn_status build(clattn_context *ctx, const char *file, const char *op_options, int read_cache,
                           cl_program *out, int *from_disk)
{
    if (from_disk)
        *from_disk = 0;
    /* Device-wide definitions every kernel may use (common.cl). */
    char options[2048];
    /* Development: CLATTN_BUILD_OPTIONS adds compiler options (e.g. -cl-nv-verbose), part of the
     * cache key like the rest; CLATTN_BUILD_LOG=1 prints every source build's time and log to
     * stderr. */
    const char *extra = getenv("CLATTN_BUILD_OPTIONS");
    /* -w (a standard option): the compiler's warnings stay out of the application's stderr.
     * PoCL prints a count of them itself ("23 warnings generated.") on every build; on AVX2 its
     * clang warns that float16 arguments change the ABI without AVX-512. Kept when the log is
     * asked for. */
    const int show_log = clattn__env_flag("CLATTN_BUILD_LOG", 0);
    const int n = snprintf(options, sizeof options, "%s -DHAS_FMA=%d -DNREG16=%d -DCPU_DEVICE=%d%s%s%s",
                           op_options, ctx->dev.has_fma, ctx->dev.nreg16,
                           (ctx->dev.type & CL_DEVICE_TYPE_CPU) != 0, show_log ? "" : " -w",
                           extra && *extra ? " " : "", extra ? extra : "");
    /* Cut short, an option would change meaning (-DTILE=128 becoming -DTILE=1): refuse. */
    if (n < 0 || (size_t)n >= sizeof options)
        return clattn__fail(ctx, CLATTN_BUILD_FAILED,
                            "building %s: CLATTN_BUILD_OPTIONS (%zu bytes) makes the options longer "
                            "than the %zu bytes this library passes to clBuildProgram",
                            file, extra ? strlen(extra) : (size_t)0, sizeof options - 1);
    const char *missing = NULL;
    char *src = assemble(ctx, file, &missing);
    if (!src && missing && strcmp(missing, file) != 0)
        return clattn__fail(ctx, CLATTN_BUILD_FAILED, "kernel source \"%s\" (needed by %s) is missing",
                            missing, file);
    if (!src)
        return clattn__fail(ctx, CLATTN_BUILD_FAILED, "kernel source \"%s\" is missing", file);
    char hex[33];
    cache_key(ctx, src, options, hex);
    cl_program prog = ctx->cache_enabled && read_cache ? from_binary(ctx, hex, options) : NULL;
    if (prog) {
        free(src);
        *out = prog;
        if (from_disk)
            *from_disk = 1;
        return CLATTN_SUCCESS;
    }
    cl_int err;
    const char *srcs[1] = {src};
    prog = clCreateProgramWithSource(ctx->context, 1, srcs, NULL, &err);
    free(src);
    if (!prog || err != CL_SUCCESS)
        return clattn__cl_fail(ctx, err, "clCreateProgramWithSource");
    ctx->stats.builds++;
    struct timespec t0, t1;
    const int timed = clock_gettime(CLOCK_MONOTONIC, &t0) == 0;
    err = clBuildProgram(prog, 1, &ctx->device, options, NULL, NULL);
    double seconds = 0;
    if (timed && clock_gettime(CLOCK_MONOTONIC, &t1) == 0)
        seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ctx->build_seconds += seconds;
    if (seconds >= ctx->build_seconds_max) {
        ctx->build_seconds_max = seconds;
        snprintf(ctx->build_slowest, sizeof ctx->build_slowest, "%.60s \"%.1023s\"", file, options);
    }
    if (err != CL_SUCCESS) {
        keep_build_log(ctx, prog);
        clReleaseProgram(prog);
        ctx->cl_error = err;
        char parts[128];
        parts_note(file, parts, sizeof parts);
        return clattn__fail(ctx, CLATTN_BUILD_FAILED, "building %s%s with \"%s\" failed: %s (%d)",
                            file, parts, options, clattn__cl_error_name(err), (int)err);
    }
    if (show_log) {
        keep_build_log(ctx, prog);
        fprintf(stderr, "clattn: built %s in %.2f s with \"%s\"\n%s\n", file, seconds, options,
                ctx->build_log ? ctx->build_log : "");
    }
    if (ctx->cache_enabled)
        to_disk(ctx, prog, hex);
    *out = prog;
    return CLATTN_SUCCESS;
}

/* The failure for a kernel the device cannot launch as built: its local memory exceeds the
 * device's, or its reqd_work_group_size exceeds what the compiled kernel allows (registers). */
static clattn_status refuse(clattn_context *ctx, const char *kernel_name, const char *options,
                            const clattn_kernel_refusal *r, int again)
{
    ctx->refused = *r;
    ctx->refused_again = again;
    if (r->kmem > ctx->dev.local_mem)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "kernel %s built with \"%s\" needs %llu bytes of local memory; the device "
                            "has %llu",
                            kernel_name, options, (unsigned long long)r->kmem,
                            (unsigned long long)ctx->dev.local_mem);
    return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                        "kernel %s built with \"%s\" needs work-groups of %zu work-items; as compiled "
                        "for this device it allows %zu (CL_KERNEL_WORK_GROUP_SIZE)",
                        kernel_name, options, r->req_wg, r->kwg);
}

size_t clattn__retry_cap(clattn_context *ctx, clattn_status st, clattn_params_source source, size_t cap)
{
    /* The refusal is answered here either way: an operation that launches another (the fused
     * kernels' merge) must not retry its own kernel for the other's refusal. */
    const clattn_kernel_refusal r = ctx->refused;
    const int again = ctx->refused_again;
    memset(&ctx->refused, 0, sizeof ctx->refused);
    ctx->refused_again = 0;
    if (st != CLATTN_UNSUPPORTED || (r.kwg == 0 && r.kmem == 0) || source == CLATTN_SOURCE_OVERRIDE ||
        source == CLATTN_SOURCE_ENVIRONMENT)
        return 0;
    size_t next;
    if (r.kmem > ctx->dev.local_mem) {
        /* The compiler added local memory to arrays that fitted: Mesa's rusticl (22.3) reports
         * twice their size, NVIDIA's driver 16 bytes more for decode_rows. The first time, the
         * fits may declare less from now on, in proportion to the excess and by at least 1/32
         * (few rounds), at the same work-group size. The same kernel refused again (its arrays do
         * not follow the fits, or no smaller tile exists), or a budget that cannot shrink: a
         * smaller work-group, whose arrays are smaller. */
        const cl_ulong budget = clattn__local_budget(ctx);
        const cl_ulong usable = ctx->dev.local_mem > CLATTN_LOCAL_RESERVE ? ctx->dev.local_mem - CLATTN_LOCAL_RESERVE : 0;
        cl_ulong lower = (cl_ulong)((double)budget * (double)usable / (double)r.kmem);
        if (lower > budget - budget / 32)
            lower = budget - budget / 32;
        if (!again && lower > 0 && lower < budget) {
            ctx->local_budget = lower;
            next = cap;
        } else {
            next = (r.req_wg > 0 && r.req_wg < cap ? r.req_wg : cap) / 2;
        }
    } else {
        next = r.kwg; /* the work-group the compiled kernel allows */
        if (next >= cap)
            return 0;
    }
    if (next == 0)
        return 0;
    clattn__clear_error(ctx);
    return next;
}

clattn_status clattn__get_kernel(clattn_context *ctx, const char *file, const char *options,
                                 const char *kernel_name, cl_kernel *out)
{
    *out = NULL;
    memset(&ctx->refused, 0, sizeof ctx->refused);
    ctx->refused_again = 0;
    /* During a call with variants, the attention programs take its VARIANTS (src/variant.c). */
    char with_variants[2048];
    if (ctx->variant_opts[0] && uses_attn_common(file)) {
        const int n = snprintf(with_variants, sizeof with_variants, "%s%s", options, ctx->variant_opts);
        if (n < 0 || (size_t)n >= sizeof with_variants)
            return clattn__fail(ctx, CLATTN_BUILD_FAILED, "building %s: options too long", file);
        options = with_variants;
    }
    clattn_program_entry *e = NULL;
    for (int i = 0; i < ctx->nprograms; i++)
        if (strcmp(ctx->programs[i].file, file) == 0 && strcmp(ctx->programs[i].options, options) == 0) {
            e = &ctx->programs[i];
            break;
        }
    if (e) {
        ctx->stats.memory_hits++;
    } else {
        if (ctx->nprograms == ctx->cap_programs) {
            int cap = ctx->cap_programs ? 2 * ctx->cap_programs : 16;
            clattn_program_entry *p = realloc(ctx->programs, (size_t)cap * sizeof *p);
            if (!p)
                return clattn__fail(ctx, CLATTN_OUT_OF_MEMORY, "out of host memory (program cache)");
            ctx->programs = p;
            ctx->cap_programs = cap;
        }
        cl_program prog = NULL;
        int from_disk = 0;
        clattn_status st = build(ctx, file, options, 1, &prog, &from_disk);
        if (st != CLATTN_SUCCESS)
            return st;
        e = &ctx->programs[ctx->nprograms];
        memset(e, 0, sizeof *e);
        e->file = clattn__strdup(file);
        e->options = clattn__strdup(options);
        e->program = prog;
        e->from_disk = from_disk;
        if (!e->file || !e->options) {
            free(e->file);
            free(e->options);
            clReleaseProgram(prog);
            return clattn__fail(ctx, CLATTN_OUT_OF_MEMORY, "out of host memory (program cache)");
        }
        ctx->nprograms++;
    }
    for (int i = 0; i < e->nkernels; i++)
        if (strcmp(e->kernel_names[i], kernel_name) == 0) {
            if (!e->kernels[i])
                return refuse(ctx, kernel_name, options, &e->refused[i], 1);
            *out = e->kernels[i];
            return CLATTN_SUCCESS;
        }
    if (e->nkernels == (int)(sizeof e->kernels / sizeof e->kernels[0]))
        return clattn__fail(ctx, CLATTN_BUILD_FAILED, "too many kernels requested from %s", file);
    cl_int err;
    cl_kernel k = clCreateKernel(e->program, kernel_name, &err);
    if ((!k || err != CL_SUCCESS) && e->from_disk && e->nkernels == 0) {
        /* A cached binary the driver loaded but that lacks the kernel is no binary of this source
         * (a file crafted to pass the checks): build from source, replace the file, try again.
         * Only before any kernel came from it, so no kernel of the old program is in use. */
        cl_program prog = NULL;
        clattn_status st = build(ctx, file, options, 0, &prog, NULL);
        if (st != CLATTN_SUCCESS)
            return st;
        clReleaseProgram(e->program);
        e->program = prog;
        e->from_disk = 0;
        ctx->stats.disk_rejects++;
        if (ctx->stats.disk_hits) /* counted when it loaded: it was no hit after all */
            ctx->stats.disk_hits--;
        k = clCreateKernel(e->program, kernel_name, &err);
    }
    if (!k || err != CL_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "clCreateKernel(%s)", kernel_name);
        return clattn__cl_fail(ctx, err, what);
    }
    /* The compiler's account of the kernel, once when it is created: a required work-group
     * (reqd_work_group_size) larger than the kernel allows (registers) or more local memory than
     * the device has would fail at launch; say which here. */
    size_t req[3] = {0, 0, 0}, kwg = 0;
    cl_ulong kmem = 0;
    if (clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, sizeof req, req,
                                 NULL) != CL_SUCCESS)
        req[0] = req[1] = req[2] = 0;
    if (clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) !=
        CL_SUCCESS)
        kwg = 0;
    if (clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof kmem, &kmem, NULL) !=
        CL_SUCCESS)
        kmem = 0;
    const clattn_kernel_refusal r = {req[0] * req[1] * req[2], kwg, kmem};
    const int refused = kmem > ctx->dev.local_mem || (kwg > 0 && r.req_wg > kwg);
    if (refused) {
        clReleaseKernel(k);
        k = NULL;
    }
    e->kernel_names[e->nkernels] = clattn__strdup(kernel_name);
    if (!e->kernel_names[e->nkernels]) {
        if (k)
            clReleaseKernel(k);
        return clattn__fail(ctx, CLATTN_OUT_OF_MEMORY, "out of host memory (kernel cache)");
    }
    e->refused[e->nkernels] = r;
    e->kernels[e->nkernels++] = k;
    if (refused)
        return refuse(ctx, kernel_name, options, &r, 0);
    *out = k;
    return CLATTN_SUCCESS;
}

void clattn__release_programs(clattn_context *ctx)
{
    for (int i = 0; i < ctx->nprograms; i++) {
        clattn_program_entry *e = &ctx->programs[i];
        for (int j = 0; j < e->nkernels; j++) {
            if (e->kernels[j])
                clReleaseKernel(e->kernels[j]);
            free(e->kernel_names[j]);
        }
        clReleaseProgram(e->program);
        free(e->file);
        free(e->options);
    }
    free(ctx->programs);
    ctx->programs = NULL;
    ctx->nprograms = ctx->cap_programs = 0;
}
