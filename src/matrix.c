/* The matrix units (tensor cores): which backend of the tile layer (cl/mma.cl) a device gets,
 * CLATTN_MATRIX, and clattn_matrix_report. The kernel's launcher is src/fused_mma.c; which calls
 * run it, src/fused.c. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV /* cl_nv_device_attribute_query */
#define CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV 0x4000
#define CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV 0x4001
#endif

static int has_extension(cl_device_id d, const char *name)
{
    size_t n = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, 0, NULL, &n) != CL_SUCCESS || n == 0)
        return 0;
    char *ext = malloc(n + 1);
    if (!ext)
        return 0;
    int found = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, n, ext, NULL) == CL_SUCCESS) {
        ext[n] = '\0';
        const size_t len = strlen(name);
        for (const char *s = ext; (s = strstr(s, name)) != NULL; s += len)
            if ((s == ext || s[-1] == ' ') && (s[len] == ' ' || s[len] == '\0')) {
                found = 1;
                break;
            }
    }
    free(ext);
    return found;
}

#ifndef CL_DEVICE_SUB_GROUP_SIZES_INTEL /* cl_intel_required_subgroup_size */
#define CL_DEVICE_SUB_GROUP_SIZES_INTEL 0x4108
#endif

/* Intel's matrix units as the XMX backend takes them (cl/mma.cl, MMA_INTEL), where the driver
 * offers cl_intel_subgroup_matrix_multiply_accumulate, by the device's smallest sub-group, for
 * which alone the builtins are defined: 16 (Xe-HPC's Data Center GPU Max, Xe2's Lunar Lake and
 * Battlemage) layout 3, 8 (Xe-HPG's Arc A-series and Data Center Flex) layout 4; 0 otherwise,
 * with why. */
int clattn__intel_layout(int has_ext, const size_t *sizes, size_t n, char *why, size_t why_size)
{
    size_t lo = 0;
    for (size_t i = 0; i < n; i++)
        if (sizes[i] && (lo == 0 || sizes[i] < lo))
            lo = sizes[i];
    if (has_ext && (lo == 16 || lo == 8))
        return lo == 16 ? 3 : 4;
    if (!has_ext)
        snprintf(why, why_size, "the driver does not offer cl_intel_subgroup_matrix_multiply_accumulate");
    else if (lo == 0)
        snprintf(why, why_size, "the driver does not report its sub-group sizes (cl_intel_required_subgroup_size)");
    else
        snprintf(why, why_size, "Intel XMX with sub-groups of %zu: the backend is written for sub-groups of 8 and 16",
                 lo);
    return 0;
}

static int intel_layout(cl_device_id d, char *why, size_t why_size)
{
    size_t sizes[16] = {0}, bytes = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_SUB_GROUP_SIZES_INTEL, sizeof sizes, sizes, &bytes) != CL_SUCCESS ||
        bytes > sizeof sizes)
        bytes = 0;
    return clattn__intel_layout(has_extension(d, "cl_intel_subgroup_matrix_multiply_accumulate"), sizes,
                                bytes / sizeof sizes[0], why, why_size);
}

/* NVIDIA's compute capability (10·major + minor), 0 where the device does not report one. */
static int nv_compute_capability(cl_device_id d)
{
    if (!has_extension(d, "cl_nv_device_attribute_query"))
        return 0;
    cl_uint major = 0, minor = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major, NULL) != CL_SUCCESS ||
        clGetDeviceInfo(d, CL_DEVICE_COMPUTE_CAPABILITY_MINOR_NV, sizeof minor, &minor, NULL) != CL_SUCCESS)
        return 0;
    return (int)(10 * major + (minor < 10 ? minor : 9));
}

/* The AMD GPUs the matrix kernel takes, for which tests/mma_check.sh compiles it: 1 for CDNA2
 * (gfx90a) and CDNA3 (gfx940, gfx941, gfx942), whose matrix cores take v_mfma_f32_16x16x16f16,
 * _16x16x16bf16_1k and _16x16x4f32 on wavefronts of 64; 2 for RDNA3 and 3.5 (gfx1100-1103,
 * gfx1150-1153): v_wmma_f32_16x16x16_f16 and _bf16 on wavefronts of 32; 0 for the others
 * (CDNA4's gfx950, 160 KiB of local memory, and RDNA4's gfx12, another WMMA layout, until
 * checked). AMD's OpenCL names the device by its target ("gfx90a:sramecc+:xnack-"). */
int clattn__amd_layout(const char *name)
{
    static const char *const arch[] = {"gfx90a", "gfx940", "gfx941", "gfx942",
                                       "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"};
    for (size_t i = 0; i < sizeof arch / sizeof arch[0]; i++) {
        const size_t n = strlen(arch[i]);
        if (strncmp(name, arch[i], n) == 0 && (name[n] == '\0' || name[n] == ':'))
            return i < 4 ? 1 : 2;
    }
    return 0;
}

clattn_status clattn__matrix_init(clattn_context *ctx)
{
    const char *env = getenv("CLATTN_MATRIX");
    ctx->matrix_mode = CLATTN_MATRIX_AUTO;
    ctx->matrix_layout = 0;
    if (env && *env) {
        if (clattn__same_word(env, "auto"))
            ctx->matrix_mode = CLATTN_MATRIX_AUTO;
        else if (clattn__same_word(env, "off"))
            ctx->matrix_mode = CLATTN_MATRIX_OFF;
        else if (clattn__same_word(env, "emulate"))
            ctx->matrix_mode = CLATTN_MATRIX_EMULATE;
        else if (clattn__same_word(env, "emulate-amd"))
            ctx->matrix_mode = CLATTN_MATRIX_EMULATE, ctx->matrix_layout = 1;
        else if (clattn__same_word(env, "emulate-wmma"))
            ctx->matrix_mode = CLATTN_MATRIX_EMULATE, ctx->matrix_layout = 2;
        else if (clattn__same_word(env, "emulate-intel"))
            ctx->matrix_mode = CLATTN_MATRIX_EMULATE, ctx->matrix_layout = 3;
        else if (clattn__same_word(env, "emulate-intel8"))
            ctx->matrix_mode = CLATTN_MATRIX_EMULATE, ctx->matrix_layout = 4;
        else
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "CLATTN_MATRIX=\"%.100s\": expected auto, off, emulate, emulate-amd, emulate-wmma, "
                                "emulate-intel or emulate-intel8",
                                env);
    }
    ctx->matrix_backend = CLATTN_MMA_NONE;
    ctx->nv_cc = 0;
    ctx->matrix_ldsm = ctx->matrix_mode == CLATTN_MATRIX_EMULATE ? 1 : -1;
    ctx->matrix_ldsm_why[0] = '\0';
    for (int i = 0; i < 3; i++)
        ctx->matrix_checked[i] = -1;
    ctx->matrix_check_why[0] = '\0';
    ctx->matrix_big_grf = -1;
    const int nvidia_gpu = (ctx->dev.type & CL_DEVICE_TYPE_GPU) && ctx->dev.vendor_id == 0x10de;
    if (nvidia_gpu)
        ctx->nv_cc = nv_compute_capability(ctx->device);
    if (nvidia_gpu && ctx->nv_cc >= 80) {
        ctx->matrix_backend = CLATTN_MMA_NV;
        ctx->matrix_why[0] = '\0';
    } else if (nvidia_gpu && ctx->nv_cc > 0) {
        snprintf(ctx->matrix_why, sizeof ctx->matrix_why,
                 "compute capability %d.%d: mma.sync m16n8k16 with f32 accumulation needs 8.0", ctx->nv_cc / 10,
                 ctx->nv_cc % 10);
    } else if (nvidia_gpu) {
        snprintf(ctx->matrix_why, sizeof ctx->matrix_why,
                 "the driver does not report a compute capability (cl_nv_device_attribute_query)");
    } else if (ctx->dev.type & CL_DEVICE_TYPE_CPU) {
        snprintf(ctx->matrix_why, sizeof ctx->matrix_why, "a CPU device");
    } else if (ctx->dev.vendor_id == 0x1002 && clattn__amd_layout(ctx->dev.name)) {
        ctx->matrix_backend = CLATTN_MMA_AMD;
        if (ctx->matrix_mode != CLATTN_MATRIX_EMULATE)
            ctx->matrix_layout = clattn__amd_layout(ctx->dev.name);
        ctx->matrix_why[0] = '\0';
    } else if (ctx->dev.vendor_id == 0x1002) {
        snprintf(ctx->matrix_why, sizeof ctx->matrix_why,
                 "AMD %.60s: the AMD backends cover CDNA2 and CDNA3 (gfx90a, gfx940-942: MFMA) and RDNA3 "
                 "(gfx1100-1103, gfx1150-1153: WMMA); MI100's gfx908 lacks the bf16 product, gfx950 and "
                 "RDNA4 are not checked yet",
                 ctx->dev.name);
    } else if (ctx->dev.vendor_id == 0x8086 && (ctx->dev.type & CL_DEVICE_TYPE_GPU)) {
        const int layout = intel_layout(ctx->device, ctx->matrix_why, sizeof ctx->matrix_why);
        if (layout) {
            ctx->matrix_backend = CLATTN_MMA_INTEL;
            if (ctx->matrix_mode != CLATTN_MATRIX_EMULATE)
                ctx->matrix_layout = layout;
            ctx->matrix_why[0] = '\0';
        }
    } else {
        snprintf(ctx->matrix_why, sizeof ctx->matrix_why,
                 "no backend for this device's matrix units (NVIDIA sm_80 and up, AMD CDNA2, CDNA3 and RDNA3, "
                 "Intel XMX only)");
    }
    return CLATTN_SUCCESS;
}

int clattn__matrix_auto(const clattn_context *ctx, int dtype, int64_t seq_q, int64_t rows,
                        clattn_params_source source)
{
    if (source >= CLATTN_SOURCE_ENVIRONMENT || ctx->matrix_mode == CLATTN_MATRIX_OFF)
        return 0;
    /* RDNA3's WMMA and Intel's XMX have no f32 product; an AMD or Intel type whose probe failed
     * runs the FMA kernels */
    if ((ctx->matrix_layout >= 2 && dtype == CLATTN_F32) ||
        (ctx->matrix_backend >= CLATTN_MMA_AMD && ctx->matrix_mode != CLATTN_MATRIX_EMULATE && dtype >= 0 &&
         dtype <= 2 && ctx->matrix_checked[dtype] == 0))
        return 0;
    if (ctx->matrix_mode == CLATTN_MATRIX_EMULATE)
        return 1;
    return ctx->matrix_backend != CLATTN_MMA_NONE && source <= CLATTN_SOURCE_VENDOR && (seq_q > 16 || rows >= 16);
}

/* Builds kernel kname of fused_mma.cl with opts, without the call's variants, KV storage and the
 * user's snippets, which clattn__get_kernel would add to any program over attn_common.cl (a
 * snippet that does not compile is the call's failure, not the probe's), and runs it on one warp
 * of `lanes` work-items, on a queue of its own (the context's may hold the caller's commands
 * behind events not yet set); its arguments: a buffer of an int a lane, and with local_arg the
 * device's local memory size. *bad_lanes: the lanes that wrote other than 0. */
static clattn_status run_probe(clattn_context *ctx, const char *opts, const char *kname, const char *what, size_t lanes,
                               int local_arg, int *bad_lanes)
{
    *bad_lanes = 0;
    char opts_saved[sizeof ctx->variant_opts];
    const char *src_saved[2] = {ctx->variant_src[0], ctx->variant_src[1]};
    memcpy(opts_saved, ctx->variant_opts, sizeof opts_saved);
    clattn__variant_leave(ctx);
    cl_kernel k;
    clattn_status st = clattn__get_kernel(ctx, "fused_mma.cl", opts, kname, &k);
    memcpy(ctx->variant_opts, opts_saved, sizeof opts_saved);
    ctx->variant_src[0] = src_saved[0];
    ctx->variant_src[1] = src_saved[1];
    if (st != CLATTN_SUCCESS)
        return st;
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(ctx->context, ctx->device, 0, &err);
    if (!q) {
        char where[96];
        snprintf(where, sizeof where, "clCreateCommandQueue (%s)", what);
        return clattn__cl_fail(ctx, err, where);
    }
    cl_int out[64] = {0};
    if (lanes > 64)
        lanes = 64;
    cl_mem buf = clCreateBuffer(ctx->context, CL_MEM_WRITE_ONLY, sizeof out, NULL, &err);
    if (buf) {
        const cl_uint local_bytes = ctx->dev.local_mem > 0xffffffffu ? 0xffffffffu : (cl_uint)ctx->dev.local_mem;
        err = clSetKernelArg(k, 0, sizeof buf, &buf);
        if (err == CL_SUCCESS && local_arg)
            err = clSetKernelArg(k, 1, sizeof local_bytes, &local_bytes);
        if (err == CL_SUCCESS)
            err = clEnqueueNDRangeKernel(q, k, 1, NULL, &lanes, &lanes, 0, NULL, NULL);
        if (err == CL_SUCCESS)
            err = clEnqueueReadBuffer(q, buf, CL_TRUE, 0, lanes * sizeof(cl_int), out, 0, NULL, NULL);
        clReleaseMemObject(buf);
    }
    clReleaseCommandQueue(q);
    if (err != CL_SUCCESS)
        return clattn__cl_fail(ctx, err, what);
    for (size_t i = 0; i < lanes; i++)
        *bad_lanes += out[i] != 0;
    return CLATTN_SUCCESS;
}

clattn_status clattn__ldsm_probe(clattn_context *ctx, int nv, int *bad_lanes)
{
    char opts[200];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -DDT_IN=1 -DDT_OUT=0 -DDT_MASK=0 -DMMA_NV=%d -DMMA_LDSM=1 -DKSEL=1 -DK_ldsm_probe=1", nv);
    return run_probe(ctx, opts, "ldsm_probe", "the ldmatrix probe", 32, 1, bad_lanes);
}

void clattn__mma_probe_opts(int backend, int layout, int dtype, char *opts, size_t size)
{
    /* as src/fused_mma.c builds the kernel: MMA_AMD names the AMD layout (1 MFMA, 2 WMMA) */
    snprintf(opts, size,
             "-cl-std=CL1.2 -DDT_IN=%d -DDT_OUT=0 -DDT_MASK=0 -DMMA_NV=%d -DMMA_AMD=%d -DMMA_INTEL=%d -DMMA_LAYOUT=%d "
             "-DMMA_3X=1 -DKSEL=1 -DK_mma_probe=1",
             dtype, backend == CLATTN_MMA_NV, backend == CLATTN_MMA_AMD ? layout : 0,
             backend == CLATTN_MMA_INTEL ? layout - 2 : 0, layout);
}

int clattn__mma_lanes(int layout) { return layout == 1 ? 64 : layout >= 3 ? 16 : 32; }

clattn_status clattn__mma_probe(clattn_context *ctx, int backend, int layout, int dtype, int *bad_lanes)
{
    char opts[240];
    clattn__mma_probe_opts(backend, layout, dtype, opts, sizeof opts);
    return run_probe(ctx, opts, "mma_probe", "the matrix-unit probe", (size_t)clattn__mma_lanes(layout), 0, bad_lanes);
}

int clattn__matrix_checked(clattn_context *ctx, int dtype)
{
    if (dtype < 0 || dtype > 2 || (ctx->matrix_layout >= 2 && dtype == 0))
        return 0;
    if (ctx->matrix_checked[dtype] >= 0)
        return ctx->matrix_checked[dtype];
    static const char *const names[3] = {"f32", "f16", "bf16"};
    int bad = 0;
    const clattn_status st = clattn__mma_probe(ctx, ctx->matrix_backend, ctx->matrix_layout, dtype, &bad);
    ctx->matrix_checked[dtype] = st == CLATTN_SUCCESS && bad == 0;
    if (st != CLATTN_SUCCESS) {
        snprintf(ctx->matrix_check_why, sizeof ctx->matrix_check_why, "%s: the probe failed (%s): %.200s",
                 names[dtype], clattn_status_name(st), ctx->error);
        clattn__clear_error(ctx);
    } else if (bad) {
        snprintf(ctx->matrix_check_why, sizeof ctx->matrix_check_why,
                 "%s: its products or exchanges differed from the plain ones on %d of %d lanes", names[dtype], bad,
                 clattn__mma_lanes(ctx->matrix_layout));
    }
    return ctx->matrix_checked[dtype];
}

int clattn__matrix_ldsm(clattn_context *ctx, int emulate)
{
    if (emulate || ctx->matrix_ldsm >= 0)
        return ctx->matrix_ldsm > 0;
    int bad = 0;
    const clattn_status st = clattn__ldsm_probe(ctx, 1, &bad);
    ctx->matrix_ldsm = st == CLATTN_SUCCESS && bad == 0;
    if (st != CLATTN_SUCCESS) {
        snprintf(ctx->matrix_ldsm_why, sizeof ctx->matrix_ldsm_why, "the probe failed (%s): %.200s",
                 clattn_status_name(st), ctx->error);
        clattn__clear_error(ctx);
    } else if (bad) {
        snprintf(ctx->matrix_ldsm_why, sizeof ctx->matrix_ldsm_why,
                 "its fragments differed from the plain loads' on %d of 32 lanes", bad);
    }
    return ctx->matrix_ldsm;
}

void clattn__matrix_drop(clattn_context *ctx, const char *why)
{
    ctx->matrix_backend = CLATTN_MMA_NONE;
    snprintf(ctx->matrix_why, sizeof ctx->matrix_why, "%s", why);
}

static const char *check_word(int state) { return state < 0 ? "not yet" : state ? "passed" : "failed (FMA kernels)"; }

const char *clattn_matrix_report(const clattn_context *ctx)
{
    if (!ctx)
        return "";
    clattn_context *c = (clattn_context *)ctx; /* the report's buffer only */
    const char *mode = ctx->matrix_mode == CLATTN_MATRIX_OFF       ? "off"
                       : ctx->matrix_mode == CLATTN_MATRIX_EMULATE ? "emulate"
                                                                   : "auto";
    if (ctx->matrix_mode == CLATTN_MATRIX_EMULATE && ctx->matrix_layout == 1)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "emulated (CLATTN_MATRIX=emulate-amd): fused attention runs the matrix kernel with AMD's "
                 "MFMA fragment layouts (64 lanes) through local memory, for tests; f16, bf16, f32%s%s",
                 ctx->matrix_backend ? "" : "; the device itself: none, ", ctx->matrix_backend ? "" : ctx->matrix_why);
    else if (ctx->matrix_mode == CLATTN_MATRIX_EMULATE && ctx->matrix_layout == 2)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "emulated (CLATTN_MATRIX=emulate-wmma): fused attention runs the matrix kernel with AMD RDNA3's "
                 "WMMA fragment layouts (32 lanes) through local memory, for tests; f16, bf16 (f32: the FMA "
                 "kernels)%s%s",
                 ctx->matrix_backend ? "" : "; the device itself: none, ", ctx->matrix_backend ? "" : ctx->matrix_why);
    else if (ctx->matrix_mode == CLATTN_MATRIX_EMULATE && ctx->matrix_layout >= 3)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "emulated (CLATTN_MATRIX=emulate-intel%s): fused attention runs the matrix kernel with Intel XMX's "
                 "fragment layouts (sub-groups of %d) through local memory, for tests; f16, bf16 (f32: the FMA "
                 "kernels)%s%s",
                 ctx->matrix_layout == 4 ? "8" : "", ctx->matrix_layout == 4 ? 8 : 16,
                 ctx->matrix_backend ? "" : "; the device itself: none, ", ctx->matrix_backend ? "" : ctx->matrix_why);
    else if (ctx->matrix_mode == CLATTN_MATRIX_EMULATE)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "emulated (CLATTN_MATRIX=emulate): fused attention runs the matrix kernel with NVIDIA's "
                 "fragment layouts through local memory, for tests; f16, bf16, f32 (3xTF32)%s%s",
                 ctx->matrix_backend ? "" : "; the device itself: none, ", ctx->matrix_backend ? "" : ctx->matrix_why);
    else if (ctx->matrix_backend == CLATTN_MMA_AMD && ctx->matrix_mode == CLATTN_MATRIX_AUTO)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "%s (%.60s): fused attention in %s on the matrix cores (CLATTN_MATRIX=%s); self-check of each "
                 "type at its first call: f32 %s, f16 %s, bf16 %s%s%.300s",
                 ctx->matrix_layout == 2 ? "amd wmma" : "amd mfma", ctx->dev.name,
                 ctx->matrix_layout == 2 ? "f16 and bf16 (16x16x16; f32 on the FMA kernels)"
                                         : "f16, bf16 (16x16x16) and f32 (16x16x4, multiplied in f32)",
                 mode, ctx->matrix_layout == 2 ? "not used" : check_word(ctx->matrix_checked[0]),
                 check_word(ctx->matrix_checked[1]), check_word(ctx->matrix_checked[2]),
                 ctx->matrix_check_why[0] ? "; " : "", ctx->matrix_check_why);
    else if (ctx->matrix_backend == CLATTN_MMA_AMD)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "none: CLATTN_MATRIX=off (the device has amd %s, %.60s)", ctx->matrix_layout == 2 ? "wmma" : "mfma",
                 ctx->dev.name);
    else if (ctx->matrix_backend == CLATTN_MMA_INTEL && ctx->matrix_mode == CLATTN_MATRIX_AUTO)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "intel xmx (%.60s, sub-groups of %d): fused attention in f16 and bf16 (8x%dx16; f32 on the FMA "
                 "kernels) on the matrix engines (CLATTN_MATRIX=%s); self-check of each type at its first call: "
                 "f16 %s, bf16 %s%s%.300s",
                 ctx->dev.name, ctx->matrix_layout == 4 ? 8 : 16, ctx->matrix_layout == 4 ? 8 : 16, mode, check_word(ctx->matrix_checked[1]), check_word(ctx->matrix_checked[2]),
                 ctx->matrix_check_why[0] ? "; " : "", ctx->matrix_check_why);
    else if (ctx->matrix_backend == CLATTN_MMA_INTEL)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "none: CLATTN_MATRIX=off (the device has intel xmx, %.60s)", ctx->dev.name);
    else if (ctx->matrix_backend == CLATTN_MMA_NV && ctx->matrix_mode == CLATTN_MATRIX_AUTO)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "nvidia mma.sync (compute capability %d.%d): fused attention in f16, bf16 (m16n8k16) and f32 "
                 "(3xTF32, m16n8k8) on the tensor cores (CLATTN_MATRIX=%s); ldmatrix: %s%.300s",
                 ctx->nv_cc / 10, ctx->nv_cc % 10, mode,
                 ctx->matrix_ldsm < 0 ? "probed at the first 16-bit call" : ctx->matrix_ldsm ? "on (probed)" : "off: ",
                 ctx->matrix_ldsm == 0 ? ctx->matrix_ldsm_why : "");
    else if (ctx->matrix_backend == CLATTN_MMA_NV)
        snprintf(c->matrix_report, sizeof c->matrix_report,
                 "none: CLATTN_MATRIX=off (the device has nvidia mma.sync, compute capability %d.%d)",
                 ctx->nv_cc / 10, ctx->nv_cc % 10);
    else
        snprintf(c->matrix_report, sizeof c->matrix_report, "none: %s", ctx->matrix_why);
    return c->matrix_report;
}
