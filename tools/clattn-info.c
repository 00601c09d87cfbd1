/*
 * clattn-info — lists the OpenCL platforms and devices with the properties that decide how
 * attention kernels run on them (memory, work-group limits, vector widths, fp16/fp64, subgroups),
 * and says which device clattn_create(NULL) or a given device spec resolves to and why.
 *
 *   clattn-info [--json] [--device SPEC] [--class CLASS]... [--help]
 *
 * For each device it also shows which kernel parameters clattn would use (clattn_get_params) and
 * where they come from: for one representative f32 problem per operation, and for each --class
 * given (any dtype, head_dim, sizes and mask kind, e.g. the f16 or masked entries a tuning run
 * wrote).
 *
 * Exit status: 0 ok; 1 bad usage, a device spec (or CLATTN_DEVICE) that does not resolve, or
 * another failure of the tool itself; 2 no OpenCL platform or device at all.
 *
 * Only the public clattn API and plain OpenCL 1.2 calls are used, so the tool shows what an
 * outside program would see. Every property is queried independently: a driver that refuses one
 * query shows "n/a" (null in JSON) for that property instead of hiding the whole device.
 */
#include "clattn.h"
#include "json.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Not in the OpenCL 1.2 view of the headers (cl_ext.h / CL_VERSION_2_1); the values are fixed by
 * the Khronos registry, so defining them here keeps the tool building against any header set. */
#define INFO_PLATFORM_NOT_FOUND_KHR (-1001)      /* ICD loader: no platform installed */
#define INFO_DEVICE_MAX_NUM_SUB_GROUPS 0x105C    /* cl_uint, core in OpenCL 2.1 and 3.0 */

#define EXIT_USAGE 1
#define EXIT_NO_DEVICE 2

/* A driver can report any size for a string; beyond this it is surely garbage, not a name. */
#define MAX_INFO_STRING ((size_t)1 << 20)
/* The device key is "vendorid:name:cu:kib"; grown up to this when clattn_device_key says too small. */
#define MAX_DEVICE_KEY ((size_t)1 << 16)
#define WHY_SIZE 512

/* A numeric property that may be missing (the query failed). All OpenCL integer properties
 * (cl_uint, cl_ulong, size_t, bitfields) fit in 64 bits, so one type serves them all. */
typedef struct info_num {
    int ok;
    uint64_t v;
} info_num;

/* Yes / no / unknown: a capability that could not be queried must not read as "no". */
typedef enum info_tri { TRI_UNKNOWN = -1, TRI_NO = 0, TRI_YES = 1 } info_tri;

typedef struct dev_info {
    cl_device_id id;
    char *name, *vendor, *version, *c_version, *driver, *extensions, *key;
    info_num type, vendor_id, compute_units, clock_mhz, global_mem, local_mem, local_mem_type;
    info_num max_alloc, max_const, max_wg, timer_res_ns, double_cfg, max_sub_groups;
    info_num pref_float, pref_half, native_float, native_half;
    size_t *wi_sizes; /* NULL when the query failed */
    size_t n_wi_sizes;
    info_tri fp16, fp64, sg_khr, sg_intel, subgroups;
    int is_default;
} dev_info;

typedef struct plat_info {
    cl_platform_id id;
    char *name, *vendor, *version;
    cl_int dev_err; /* CL_SUCCESS, or why the device list is empty */
    cl_uint n_devs;
    dev_info *devs;
} plat_info;

/* Outcome of clattn_select_device for one spec, kept so both output formats render the same facts. */
typedef struct selection {
    int asked;         /* 0: this selection was not requested (no --device) */
    const char *spec;  /* what was passed; NULL for the default */
    clattn_status status;
    cl_device_id device;
    long plat_index, dev_index; /* position in our listing, -1 if not found there */
    char why[WHY_SIZE];
    const char *error; /* message on failure (static or points into why) */
} selection;

/* ------------------------------------------------------------------------------------------ */
/* Queries                                                                                      */

static cl_int get_info(int is_platform, void *obj, cl_uint param, size_t size, void *value,
                       size_t *size_ret)
{
    return is_platform
               ? clGetPlatformInfo((cl_platform_id)obj, (cl_platform_info)param, size, value, size_ret)
               : clGetDeviceInfo((cl_device_id)obj, (cl_device_info)param, size, value, size_ret);
}

/* Drivers pad names with spaces (Intel) or end them with a newline; neither belongs in a table. */
static void trim(char *s)
{
    size_t len = strlen(s), start = 0;
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        s[--len] = '\0';
    while (start < len && isspace((unsigned char)s[start]))
        start++;
    if (start > 0)
        memmove(s, s + start, len - start + 1);
}

/* @return a malloc'd copy of a string property, or NULL. The size is asked first because names and
 * extension lists have no fixed bound; the terminator is added here because not every driver
 * counts or writes it. */
static char *query_string(int is_platform, void *obj, cl_uint param)
{
    size_t size = 0;
    if (get_info(is_platform, obj, param, 0, NULL, &size) != CL_SUCCESS || size == 0 ||
        size > MAX_INFO_STRING)
        return NULL;
    char *s = calloc(size + 1, 1);
    if (s == NULL)
        return NULL;
    if (get_info(is_platform, obj, param, size, s, NULL) != CL_SUCCESS) {
        free(s);
        return NULL;
    }
    s[size] = '\0';
    trim(s);
    return s;
}

/* One function per C type, because the size passed must match the type the spec gives the
 * property; a zero-initialised value keeps a driver that writes fewer bytes harmless. */
static info_num query_uint(cl_device_id d, cl_device_info param)
{
    cl_uint v = 0;
    info_num n = {0, 0};
    if (clGetDeviceInfo(d, param, sizeof v, &v, NULL) == CL_SUCCESS) {
        n.ok = 1;
        n.v = v;
    }
    return n;
}

static info_num query_ulong(cl_device_id d, cl_device_info param)
{
    cl_ulong v = 0;
    info_num n = {0, 0};
    if (clGetDeviceInfo(d, param, sizeof v, &v, NULL) == CL_SUCCESS) {
        n.ok = 1;
        n.v = v;
    }
    return n;
}

static info_num query_size(cl_device_id d, cl_device_info param)
{
    size_t v = 0;
    info_num n = {0, 0};
    if (clGetDeviceInfo(d, param, sizeof v, &v, NULL) == CL_SUCCESS) {
        n.ok = 1;
        n.v = v;
    }
    return n;
}

/* The number of entries comes from the returned size rather than CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS,
 * so a driver that disagrees with itself cannot make us read past the buffer. */
static void query_wi_sizes(dev_info *di)
{
    size_t bytes = 0;
    di->wi_sizes = NULL;
    di->n_wi_sizes = 0;
    if (clGetDeviceInfo(di->id, CL_DEVICE_MAX_WORK_ITEM_SIZES, 0, NULL, &bytes) != CL_SUCCESS ||
        bytes < sizeof(size_t) || bytes > 64 * sizeof(size_t))
        return;
    size_t n = bytes / sizeof(size_t);
    size_t *v = calloc(n, sizeof *v);
    if (v == NULL)
        return;
    if (clGetDeviceInfo(di->id, CL_DEVICE_MAX_WORK_ITEM_SIZES, n * sizeof *v, v, NULL) != CL_SUCCESS) {
        free(v);
        return;
    }
    di->wi_sizes = v;
    di->n_wi_sizes = n;
}

/* Whole-token match: "cl_khr_fp16" must not match inside "cl_khr_fp16_something". */
static info_tri has_extension(const char *extensions, const char *name)
{
    if (extensions == NULL)
        return TRI_UNKNOWN;
    size_t len = strlen(name);
    for (const char *p = extensions; (p = strstr(p, name)) != NULL; p += len) {
        int starts = p == extensions || isspace((unsigned char)p[-1]);
        int ends = p[len] == '\0' || isspace((unsigned char)p[len]);
        if (starts && ends)
            return TRI_YES;
    }
    return TRI_NO;
}

/* "OpenCL <major>.<minor> <vendor-specific>" per the spec. @return major*10+minor, 0 if unknown. */
static int parse_cl_version(const char *version)
{
    int major = 0, minor = 0;
    if (version == NULL || sscanf(version, "OpenCL %d.%d", &major, &minor) != 2 || major < 0 ||
        minor < 0 || minor > 9)
        return 0;
    return major * 10 + minor;
}

/* @return a malloc'd device key, or NULL. The key embeds the device name, which has no fixed
 * length, so the buffer grows while the library reports it too small. */
static char *query_key(cl_device_id d)
{
    for (size_t cap = 256; cap <= MAX_DEVICE_KEY; cap *= 2) {
        char *buf = calloc(cap, 1);
        if (buf == NULL)
            return NULL;
        clattn_status st = clattn_device_key(d, buf, cap);
        if (st == CLATTN_SUCCESS) {
            buf[cap - 1] = '\0';
            return buf;
        }
        free(buf);
        if (st != CLATTN_INVALID_ARGUMENT)
            return NULL;
    }
    return NULL;
}

static void collect_device(dev_info *di, cl_device_id id)
{
    memset(di, 0, sizeof *di);
    di->id = id;
    di->name = query_string(0, id, CL_DEVICE_NAME);
    di->vendor = query_string(0, id, CL_DEVICE_VENDOR);
    di->version = query_string(0, id, CL_DEVICE_VERSION);
    di->c_version = query_string(0, id, CL_DEVICE_OPENCL_C_VERSION);
    di->driver = query_string(0, id, CL_DRIVER_VERSION);
    di->extensions = query_string(0, id, CL_DEVICE_EXTENSIONS);
    di->key = query_key(id);

    di->type = query_ulong(id, CL_DEVICE_TYPE); /* cl_device_type is a cl_bitfield (cl_ulong) */
    di->vendor_id = query_uint(id, CL_DEVICE_VENDOR_ID);
    di->compute_units = query_uint(id, CL_DEVICE_MAX_COMPUTE_UNITS);
    di->clock_mhz = query_uint(id, CL_DEVICE_MAX_CLOCK_FREQUENCY);
    di->global_mem = query_ulong(id, CL_DEVICE_GLOBAL_MEM_SIZE);
    di->local_mem = query_ulong(id, CL_DEVICE_LOCAL_MEM_SIZE);
    di->local_mem_type = query_uint(id, CL_DEVICE_LOCAL_MEM_TYPE);
    di->max_alloc = query_ulong(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    di->max_const = query_ulong(id, CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE);
    di->max_wg = query_size(id, CL_DEVICE_MAX_WORK_GROUP_SIZE);
    di->timer_res_ns = query_size(id, CL_DEVICE_PROFILING_TIMER_RESOLUTION);
    di->double_cfg = query_ulong(id, CL_DEVICE_DOUBLE_FP_CONFIG); /* cl_device_fp_config bitfield */
    di->pref_float = query_uint(id, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT);
    di->pref_half = query_uint(id, CL_DEVICE_PREFERRED_VECTOR_WIDTH_HALF);
    di->native_float = query_uint(id, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT);
    di->native_half = query_uint(id, CL_DEVICE_NATIVE_VECTOR_WIDTH_HALF);
    query_wi_sizes(di);

    di->fp16 = has_extension(di->extensions, "cl_khr_fp16");
    /* fp64 is core-optional since 1.2: a non-zero CL_DEVICE_DOUBLE_FP_CONFIG says so even where
     * the extension string omits cl_khr_fp64, so either source counts. */
    info_tri fp64_ext = has_extension(di->extensions, "cl_khr_fp64");
    if (fp64_ext == TRI_YES || (di->double_cfg.ok && di->double_cfg.v != 0))
        di->fp64 = TRI_YES;
    else if (fp64_ext == TRI_NO || di->double_cfg.ok)
        di->fp64 = TRI_NO;
    else
        di->fp64 = TRI_UNKNOWN;

    di->sg_khr = has_extension(di->extensions, "cl_khr_subgroups");
    di->sg_intel = has_extension(di->extensions, "cl_intel_subgroups");
    /* Subgroups are core (optional) in 2.1+ without any extension string; the property does not
     * exist before 2.1, and some 2.x/3.0 drivers still reject it, so a failure is only "n/a". */
    di->max_sub_groups.ok = 0;
    if (parse_cl_version(di->version) >= 21)
        di->max_sub_groups = query_uint(id, (cl_device_info)INFO_DEVICE_MAX_NUM_SUB_GROUPS);
    if (di->sg_khr == TRI_YES || di->sg_intel == TRI_YES ||
        (di->max_sub_groups.ok && di->max_sub_groups.v > 0))
        di->subgroups = TRI_YES;
    else if (di->extensions == NULL && !di->max_sub_groups.ok)
        di->subgroups = TRI_UNKNOWN;
    else
        di->subgroups = TRI_NO;
}

static void free_platforms(plat_info *plats, cl_uint n)
{
    if (plats == NULL)
        return;
    for (cl_uint p = 0; p < n; p++) {
        for (cl_uint d = 0; d < plats[p].n_devs; d++) {
            dev_info *di = &plats[p].devs[d];
            free(di->name);
            free(di->vendor);
            free(di->version);
            free(di->c_version);
            free(di->driver);
            free(di->extensions);
            free(di->key);
            free(di->wi_sizes);
        }
        free(plats[p].devs);
        free(plats[p].name);
        free(plats[p].vendor);
        free(plats[p].version);
    }
    free(plats);
}

/* @return 0, or EXIT_NO_DEVICE when there is no platform or no device at all (the caller prints
 * the message and frees whatever *out holds), or EXIT_USAGE when out of memory. */
static int collect_platforms(plat_info **out, cl_uint *n_out, size_t *total_devs)
{
    *out = NULL;
    *n_out = 0;
    *total_devs = 0;

    cl_uint n = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &n);
    /* The ICD loader answers -1001 when no vendor ICD is installed; some loaders answer
     * CL_SUCCESS with 0 platforms instead. Both mean the same to the user. */
    if (err == INFO_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && n == 0))
        return EXIT_NO_DEVICE;
    if (err != CL_SUCCESS) {
        fprintf(stderr, "clattn-info: clGetPlatformIDs failed (OpenCL error %d)\n", (int)err);
        return EXIT_NO_DEVICE;
    }

    cl_platform_id *ids = calloc(n, sizeof *ids);
    plat_info *plats = calloc(n, sizeof *plats);
    if (ids == NULL || plats == NULL) {
        free(ids);
        free(plats);
        fprintf(stderr, "clattn-info: out of memory\n");
        return EXIT_USAGE;
    }
    err = clGetPlatformIDs(n, ids, NULL);
    if (err != CL_SUCCESS) {
        free(ids);
        free(plats);
        fprintf(stderr, "clattn-info: clGetPlatformIDs failed (OpenCL error %d)\n", (int)err);
        return EXIT_NO_DEVICE;
    }

    for (cl_uint p = 0; p < n; p++) {
        plat_info *pi = &plats[p];
        pi->id = ids[p];
        pi->name = query_string(1, ids[p], CL_PLATFORM_NAME);
        pi->vendor = query_string(1, ids[p], CL_PLATFORM_VENDOR);
        pi->version = query_string(1, ids[p], CL_PLATFORM_VERSION);

        /* CL_DEVICE_TYPE_ALL and this order are what clattn's "P:D" indices count. */
        cl_uint nd = 0;
        pi->dev_err = clGetDeviceIDs(ids[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd);
        if (pi->dev_err != CL_SUCCESS || nd == 0)
            continue;
        cl_device_id *dids = calloc(nd, sizeof *dids);
        pi->devs = calloc(nd, sizeof *pi->devs);
        if (dids == NULL || pi->devs == NULL) {
            free(dids);
            free(ids);
            free_platforms(plats, n); /* later entries are still zeroed by calloc */
            fprintf(stderr, "clattn-info: out of memory\n");
            return EXIT_USAGE;
        }
        pi->dev_err = clGetDeviceIDs(ids[p], CL_DEVICE_TYPE_ALL, nd, dids, NULL);
        if (pi->dev_err == CL_SUCCESS) {
            for (cl_uint d = 0; d < nd; d++)
                collect_device(&pi->devs[d], dids[d]);
            pi->n_devs = nd;
            *total_devs += nd;
        }
        free(dids);
    }
    free(ids);
    *out = plats;
    *n_out = n;
    return *total_devs == 0 ? EXIT_NO_DEVICE : 0;
}

/* Resolves `spec` through the library (the same code path as clattn_create) and locates the
 * result in our listing by handle: the ICD loader hands out the same cl_device_id to every caller. */
static void select_device(selection *sel, const char *spec, plat_info *plats, cl_uint n_plats)
{
    cl_platform_id platform = NULL;
    sel->spec = spec;
    sel->device = NULL;
    sel->plat_index = sel->dev_index = -1;
    sel->why[0] = '\0';
    sel->error = NULL;
    sel->status = clattn_select_device(spec, &platform, &sel->device, sel->why, sizeof sel->why);
    sel->why[sizeof sel->why - 1] = '\0';
    if (sel->status != CLATTN_SUCCESS) {
        /* Where the library put its explanation is not pinned down for failures; take the most
         * specific text available. No clattn_create ran in this process, so it cannot be stale. */
        const char *last = clattn_last_error(NULL);
        if (sel->why[0] != '\0')
            sel->error = sel->why;
        else if (last != NULL && last[0] != '\0')
            sel->error = last;
        else
            sel->error = clattn_status_string(sel->status);
        sel->device = NULL;
        return;
    }
    for (cl_uint p = 0; p < n_plats; p++)
        for (cl_uint d = 0; d < plats[p].n_devs; d++)
            if (plats[p].devs[d].id == sel->device) {
                sel->plat_index = (long)p;
                sel->dev_index = (long)d;
            }
}

static const dev_info *selected_info(const selection *sel, const plat_info *plats)
{
    if (sel->plat_index < 0)
        return NULL;
    return &plats[sel->plat_index].devs[sel->dev_index];
}

/* ------------------------------------------------------------------------------------------ */
/* Formatting shared by both outputs                                                            */

/* Writes the device type bits as "GPU", "CPU|ACCELERATOR", ... into buf. CL_DEVICE_TYPE_DEFAULT is
 * left out: it is the platform's notion of default, which would be confused with clattn's. */
static void type_string(info_num type, char *buf, size_t size)
{
    static const struct {
        cl_device_type bit;
        const char *name;
    } names[] = {{CL_DEVICE_TYPE_GPU, "GPU"},
                 {CL_DEVICE_TYPE_CPU, "CPU"},
                 {CL_DEVICE_TYPE_ACCELERATOR, "ACCELERATOR"},
                 {CL_DEVICE_TYPE_CUSTOM, "CUSTOM"}};
    size_t used = 0;
    buf[0] = '\0';
    if (!type.ok) {
        snprintf(buf, size, "n/a");
        return;
    }
    uint64_t rest = type.v & ~(uint64_t)CL_DEVICE_TYPE_DEFAULT;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if ((rest & names[i].bit) == 0)
            continue;
        rest &= ~(uint64_t)names[i].bit;
        int w = snprintf(buf + used, size - used, "%s%s", used ? "|" : "", names[i].name);
        if (w < 0 || (size_t)w >= size - used)
            return; /* truncated, still terminated */
        used += (size_t)w;
    }
    if (rest != 0 || used == 0)
        snprintf(buf + used, size - used, "%s0x%" PRIx64, used ? "|" : "", rest ? rest : type.v);
}

static const char *local_mem_type_string(info_num t)
{
    if (!t.ok)
        return NULL;
    switch (t.v) {
    case CL_LOCAL:
        return "local"; /* dedicated on-chip memory: tiles in __local pay off */
    case CL_GLOBAL:
        return "global"; /* emulated in global memory (CPUs, some embedded GPUs) */
    case CL_NONE:
        return "none";
    default:
        return "unknown";
    }
}

/* "512 KiB", "15.7 GiB": exact when a whole number of the unit, else one decimal. */
static void bytes_string(uint64_t v, char *buf, size_t size)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    size_t u = 0;
    uint64_t div = 1;
    while (u + 1 < sizeof units / sizeof units[0] && v / div >= 1024) {
        div *= 1024;
        u++;
    }
    if (v % div == 0)
        snprintf(buf, size, "%" PRIu64 " %s", v / div, units[u]);
    else
        snprintf(buf, size, "%.1f %s", (double)v / (double)div, units[u]);
}

/* ------------------------------------------------------------------------------------------ */
/* Human output                                                                                 */

#define LABEL_WIDTH 22

/* Driver strings and specs go to a terminal; control characters in them must not move the
 * cursor or rewrite what was printed before. */
static void fput_text(const char *s, FILE *f)
{
    if (s == NULL) {
        fputs("n/a", f);
        return;
    }
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        fputc(c < 0x20 || c == 0x7f ? '?' : c, f);
    }
}

static void put_text(const char *s)
{
    fput_text(s, stdout);
}

static void h_label(const char *label)
{
    printf("    %-*s : ", LABEL_WIDTH, label);
}

static void h_text(const char *label, const char *value)
{
    h_label(label);
    put_text(value);
    putchar('\n');
}

static void h_num(const char *label, info_num n, const char *unit)
{
    h_label(label);
    if (n.ok)
        printf("%" PRIu64 "%s%s\n", n.v, unit ? " " : "", unit ? unit : "");
    else
        puts("n/a");
}

static void h_bytes(const char *label, info_num n)
{
    char buf[48];
    h_label(label);
    if (n.ok) {
        bytes_string(n.v, buf, sizeof buf);
        puts(buf);
    } else {
        puts("n/a");
    }
}

static const char *tri_word(info_tri t)
{
    return t == TRI_YES ? "yes" : t == TRI_NO ? "no" : "n/a";
}

static void h_widths(const char *label, info_num pref, info_num native)
{
    h_label(label);
    fputs("preferred ", stdout);
    if (pref.ok)
        printf("%" PRIu64, pref.v);
    else
        fputs("n/a", stdout);
    fputs(", native ", stdout);
    if (native.ok)
        printf("%" PRIu64 "\n", native.v);
    else
        puts("n/a");
}


/* The problem classes whose kernel parameters every device shows, and from where (tuning store,
 * defaults): first a representative one per operation, labelled with its name (add_representative:
 * d 64, f32, seq 1024; decode one query against 16384 keys), then each --class. */
#define MAX_CLASSES 16
#define MAX_PROBLEMS (CLATTN_OPERATION_COUNT + MAX_CLASSES)
typedef struct problem {
    clattn_problem_class pc;
    char label[128]; /* "fused", or "fused f16 d128 sq1024 kv8192 causal" */
} problem;
static problem problems[MAX_PROBLEMS];
static int n_problems;

static void add_representative(void)
{
    for (int op = 0; op < CLATTN_OPERATION_COUNT; op++) {
        problem *r = &problems[n_problems++];
        const int no_dim = op == CLATTN_OPERATION_SOFTMAX || op == CLATTN_OPERATION_MERGE;
        const int decode = op == CLATTN_OPERATION_DECODE;
        r->pc = (clattn_problem_class){.operation = (clattn_operation)op, .dtype = CLATTN_F32,
                                       .head_dim = no_dim ? 0 : 64, .seq_q = decode ? 1 : 1024,
                                       .seq_kv = decode ? 16384 : 1024};
        snprintf(r->label, sizeof r->label, "%s", clattn_operation_name((clattn_operation)op));
    }
}

/* A decimal integer in [lo, hi], the whole field. */
static int parse_size(const char *field, long long lo, long long hi, long long *v)
{
    if (!isdigit((unsigned char)field[0]))
        return 0;
    char *end;
    errno = 0;
    *v = strtoll(field, &end, 10);
    return errno == 0 && *end == '\0' && *v >= lo && *v <= hi;
}

/* "OP,DTYPE,HEAD_DIM,SEQ_Q,SEQ_KV[,causal][,masked]" into *c. Returns NULL, or what is wrong. */
static const char *parse_class(const char *arg, problem *c)
{
    char buf[256];
    if (strlen(arg) >= sizeof buf)
        return "longer than 255 characters";
    memcpy(buf, arg, strlen(arg) + 1);
    char *f[7];
    int n = 0;
    for (char *s = buf;;) {
        if (n == 7)
            return "more than 7 fields";
        f[n++] = s;
        char *comma = strchr(s, ',');
        if (!comma)
            break;
        *comma = '\0';
        s = comma + 1;
    }
    if (n < 5)
        return "fewer than 5 fields";
    memset(c, 0, sizeof *c);
    int op = -1, dt = -1;
    for (int i = 0; i < CLATTN_OPERATION_COUNT; i++)
        if (strcmp(f[0], clattn_operation_name((clattn_operation)i)) == 0)
            op = i;
    if (op < 0)
        return "unknown operation (scores, pv, softmax, fused, decode or merge)";
    for (int i = CLATTN_F32; i <= CLATTN_BF16; i++)
        if (strcmp(f[1], clattn_dtype_name((clattn_dtype)i)) == 0)
            dt = i;
    if (dt < 0)
        return "unknown dtype (f32, f16 or bf16)";
    const int no_dim = op == CLATTN_OPERATION_SOFTMAX || op == CLATTN_OPERATION_MERGE;
    long long d, sq, skv;
    if (!parse_size(f[2], no_dim ? 0 : 1, no_dim ? 0 : CLATTN_MAX_HEAD_DIM, &d))
        return no_dim ? "HEAD_DIM must be 0 for softmax and merge" : "HEAD_DIM must be an integer, 1 to 576";
    if (!parse_size(f[3], 1, INT64_MAX, &sq) || !parse_size(f[4], 1, INT64_MAX, &skv))
        return "SEQ_Q and SEQ_KV must be positive integers";
    c->pc.operation = (clattn_operation)op;
    c->pc.dtype = (clattn_dtype)dt;
    c->pc.head_dim = d;
    c->pc.seq_q = sq;
    c->pc.seq_kv = skv;
    for (int i = 5; i < n; i++) {
        int *flag = strcmp(f[i], "causal") == 0 ? &c->pc.causal : strcmp(f[i], "masked") == 0 ? &c->pc.masked : NULL;
        if (!flag)
            return "a flag is not causal or masked";
        if (*flag)
            return "a flag is given twice";
        *flag = 1;
    }
    if (op == CLATTN_OPERATION_MERGE && (c->pc.causal || c->pc.masked))
        return "merge takes no causal or masked flag";
    const char *flags = c->pc.causal ? (c->pc.masked ? " causal masked" : " causal") : c->pc.masked ? " masked" : "";
    const char *dn = clattn_dtype_name((clattn_dtype)dt);
    if (op == CLATTN_OPERATION_SOFTMAX)
        snprintf(c->label, sizeof c->label, "softmax %s rows %lld cols %lld%s", dn, sq, skv, flags);
    else if (op == CLATTN_OPERATION_MERGE)
        snprintf(c->label, sizeof c->label, "merge %s sq%lld kv%lld%s", dn, sq, skv, flags);
    else
        snprintf(c->label, sizeof c->label, "%s %s d%lld sq%lld kv%lld%s", f[0], dn, d, sq, skv, flags);
    return NULL;
}

/* Which kernel parameters apply on this device, and from where, for each of problems[]. */
typedef struct tuning_view {
    int ok;
    char report[1100];
    char cache[1200]; /* clattn_cache_report */
    char matrix[1000]; /* clattn_matrix_report */
    char error[1100]; /* why clattn_create failed on the device ("" when it did not) */
    clattn_kernel_params params[MAX_PROBLEMS];
} tuning_view;

/* The default device [0] and the --device one [1], by listing position (-1: none), and why
 * clattn_create refused them when the listing's query_tuning tried ("" if it did not): a device
 * that resolves can still refuse a context (a bad CLATTN_MATRIX), which main reports as a failure
 * without creating the context again. */
static struct {
    long p, d;
    char error[1100];
} watched[2] = {{-1, -1, ""}, {-1, -1, ""}};

static void query_tuning(cl_uint p, cl_uint d, tuning_view *tv)
{
    memset(tv, 0, sizeof *tv);
    char spec[32];
    snprintf(spec, sizeof spec, "%u:%u", (unsigned)p, (unsigned)d);
    clattn_context *ctx = NULL;
    if (clattn_create(spec, &ctx) != CLATTN_SUCCESS) {
        snprintf(tv->error, sizeof tv->error, "%s", clattn_last_error(NULL));
        for (int i = 0; i < 2; i++)
            if (watched[i].p == (long)p && watched[i].d == (long)d)
                snprintf(watched[i].error, sizeof watched[i].error, "%s", tv->error);
        return;
    }
    snprintf(tv->report, sizeof tv->report, "%s", clattn_tuning_report(ctx));
    snprintf(tv->cache, sizeof tv->cache, "%s", clattn_cache_report(ctx));
    snprintf(tv->matrix, sizeof tv->matrix, "%s", clattn_matrix_report(ctx));
    tv->ok = 1;
    for (int i = 0; i < n_problems; i++)
        if (clattn_get_params(ctx, &problems[i].pc, &tv->params[i]) != CLATTN_SUCCESS)
            tv->ok = 0;
    clattn_release(ctx);
}

static void params_text(const clattn_kernel_params *kp, clattn_operation op, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < kp->count && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s=%d", i ? " " : "", clattn_param_name(op, i),
                              kp->values[i]);
}

static void print_tuning_human(cl_uint p, cl_uint d)
{
    tuning_view tv;
    query_tuning(p, d, &tv);
    if (!tv.ok) {
        h_text("tuning", "n/a (no context on this device)");
        if (tv.error[0])
            h_text("clattn_create", tv.error);
        return;
    }
    h_text("matrix units", tv.matrix);
    h_text("kernel cache", tv.cache);
    h_text("tuning store", tv.report);
    for (int i = 0; i < n_problems; i++) {
        const clattn_kernel_params *kp = &tv.params[i];
        char label[140], vals[256];
        snprintf(label, sizeof label, "  %s", problems[i].label);
        params_text(kp, problems[i].pc.operation, vals, sizeof vals);
        h_label(label);
        printf("%s  [%s: ", vals, clattn_params_source_name(kp->source));
        put_text(kp->origin);
        puts("]");
    }
}

static void print_device_human(const dev_info *di, cl_uint p, cl_uint d)
{
    char type[64], buf[64];
    type_string(di->type, type, sizeof type);
    printf("  Device %u:%u  [%s]  ", (unsigned)p, (unsigned)d, type);
    put_text(di->name);
    puts(di->is_default ? "   <- clattn default" : "");

    h_text("vendor", di->vendor);
    h_label("vendor id");
    if (di->vendor_id.ok)
        printf("0x%04" PRIx64 "\n", di->vendor_id.v);
    else
        puts("n/a");
    h_num("compute units", di->compute_units, NULL);
    h_num("max clock", di->clock_mhz, "MHz");
    h_bytes("global memory", di->global_mem);

    h_label("local memory");
    if (di->local_mem.ok) {
        bytes_string(di->local_mem.v, buf, sizeof buf);
        fputs(buf, stdout);
    } else {
        fputs("n/a", stdout);
    }
    const char *lmt = local_mem_type_string(di->local_mem_type);
    printf(" (%s)\n", lmt ? lmt : "type n/a");

    h_bytes("max allocation", di->max_alloc);
    h_bytes("max constant buffer", di->max_const);
    h_num("max work-group size", di->max_wg, NULL);
    h_label("max work-item sizes");
    if (di->wi_sizes == NULL) {
        puts("n/a");
    } else {
        for (size_t i = 0; i < di->n_wi_sizes; i++)
            printf("%s%zu", i ? " x " : "", di->wi_sizes[i]);
        putchar('\n');
    }
    h_widths("float vector width", di->pref_float, di->native_float);
    h_widths("half vector width", di->pref_half, di->native_half);
    h_text("fp16 (cl_khr_fp16)", tri_word(di->fp16));
    h_text("fp64", tri_word(di->fp64));

    h_label("subgroups");
    fputs(tri_word(di->subgroups), stdout);
    if (di->subgroups == TRI_YES || di->max_sub_groups.ok) {
        const char *sep = " (";
        if (di->sg_khr == TRI_YES) {
            printf("%scl_khr_subgroups", sep);
            sep = ", ";
        }
        if (di->sg_intel == TRI_YES) {
            printf("%scl_intel_subgroups", sep);
            sep = ", ";
        }
        if (di->max_sub_groups.ok) {
            printf("%smax %" PRIu64 " per work-group", sep, di->max_sub_groups.v);
            sep = ", ";
        }
        if (sep[0] == ',')
            putchar(')');
    }
    putchar('\n');

    h_text("device version", di->version);
    h_text("OpenCL C version", di->c_version);
    h_text("driver version", di->driver);
    h_num("timer resolution", di->timer_res_ns, "ns");
    h_text("device key", di->key);
    h_text("clattn_create(NULL)", di->is_default ? "picks this device" : "no");
    print_tuning_human(p, d);
}

static void print_selection_human(const char *title, const selection *sel, const plat_info *plats)
{
    put_text(title); /* may hold a spec from the command line */
    fputs(": ", stdout);
    if (sel->status != CLATTN_SUCCESS) {
        printf("none (%s)\n  error: ", clattn_status_string(sel->status));
        put_text(sel->error);
        putchar('\n');
        return;
    }
    const dev_info *di = selected_info(sel, plats);
    if (di != NULL) {
        printf("%ld:%ld  ", sel->plat_index, sel->dev_index);
        put_text(di->name);
        putchar('\n');
    } else {
        /* A device outside our CL_DEVICE_TYPE_ALL listing would mean the library and this tool
         * enumerate differently; show its name so the mismatch is visible rather than hidden. */
        char *name = query_string(0, sel->device, CL_DEVICE_NAME);
        fputs("(not in the list above) ", stdout);
        put_text(name);
        putchar('\n');
        free(name);
    }
    fputs("  why: ", stdout);
    put_text(sel->why[0] ? sel->why : "n/a");
    putchar('\n');
}

static void print_human(const plat_info *plats, cl_uint n_plats, const selection *def,
                        const selection *req)
{
    printf("clattn-info (clattn %s)\n", clattn_version_string());
    for (cl_uint p = 0; p < n_plats; p++) {
        const plat_info *pi = &plats[p];
        printf("\nPlatform %u: ", (unsigned)p);
        put_text(pi->name);
        putchar('\n');
        printf("  %-*s : ", LABEL_WIDTH + 2, "vendor");
        put_text(pi->vendor);
        printf("\n  %-*s : ", LABEL_WIDTH + 2, "version");
        put_text(pi->version);
        putchar('\n');
        if (pi->n_devs == 0) {
            if (pi->dev_err == CL_SUCCESS || pi->dev_err == CL_DEVICE_NOT_FOUND)
                puts("  (no devices)");
            else
                printf("  (devices n/a: OpenCL error %d)\n", (int)pi->dev_err);
        }
        for (cl_uint d = 0; d < pi->n_devs; d++) {
            putchar('\n');
            print_device_human(&pi->devs[d], p, d);
        }
    }

    putchar('\n');
    const char *env = getenv("CLATTN_DEVICE");
    printf("CLATTN_DEVICE: ");
    if (env != NULL) {
        putchar('"');
        put_text(env);
        puts("\"");
    } else {
        puts("unset");
    }
    print_selection_human("clattn_create(NULL) picks", def, plats);
    if (req->asked) {
        char title[128];
        int n = snprintf(title, sizeof title, "--device \"%s\" resolves to", req->spec);
        if (n < 0 || (size_t)n >= sizeof title) /* long spec: keep the line bounded */
            snprintf(title, sizeof title, "--device (%zu chars) resolves to", strlen(req->spec));
        print_selection_human(title, req, plats);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* JSON output                                                                                  */

/* Minimal pretty-printing writer: tracks nesting so commas and indentation are always right. */
typedef struct json_writer {
    FILE *f;
    int depth;
    int first[16]; /* no member written yet at this depth */
} json_writer;


static void jw_sep(json_writer *w, const char *key)
{
    if (w->depth > 0) {
        if (!w->first[w->depth])
            fputc(',', w->f);
        fputc('\n', w->f);
        for (int i = 0; i < w->depth; i++)
            fputs("  ", w->f);
    }
    w->first[w->depth] = 0;
    if (key != NULL) {
        json_string(w->f, key);
        fputs(": ", w->f);
    }
}

static void jw_open(json_writer *w, const char *key, char bracket)
{
    jw_sep(w, key);
    fputc(bracket, w->f);
    if (w->depth + 1 < (int)(sizeof w->first / sizeof w->first[0]))
        w->depth++;
    w->first[w->depth] = 1;
}

static void jw_close(json_writer *w, char bracket)
{
    int empty = w->first[w->depth];
    if (w->depth > 0)
        w->depth--;
    if (!empty) {
        fputc('\n', w->f);
        for (int i = 0; i < w->depth; i++)
            fputs("  ", w->f);
    }
    fputc(bracket, w->f);
}

static void jw_str(json_writer *w, const char *key, const char *value)
{
    jw_sep(w, key);
    json_string(w->f, value);
}

static void jw_num(json_writer *w, const char *key, info_num n)
{
    jw_sep(w, key);
    if (n.ok)
        fprintf(w->f, "%" PRIu64, n.v);
    else
        fputs("null", w->f);
}

static void jw_int(json_writer *w, const char *key, long v)
{
    jw_sep(w, key);
    fprintf(w->f, "%ld", v);
}

static void jw_bool(json_writer *w, const char *key, info_tri t)
{
    jw_sep(w, key);
    fputs(t == TRI_YES ? "true" : t == TRI_NO ? "false" : "null", w->f);
}

/* The "values", "source" and "origin" fields of an operation's kernel parameters. */
static void jw_params(json_writer *w, const clattn_kernel_params *kp, clattn_operation op)
{
    char vals[256];
    params_text(kp, op, vals, sizeof vals);
    jw_str(w, "values", vals);
    jw_str(w, "source", clattn_params_source_name(kp->source));
    jw_str(w, "origin", kp->origin);
}

static void print_device_json(json_writer *w, const dev_info *di, cl_uint p, cl_uint d)
{
    char buf[64];
    jw_open(w, NULL, '{');
    snprintf(buf, sizeof buf, "%u:%u", (unsigned)p, (unsigned)d);
    jw_str(w, "index", buf);
    jw_int(w, "platform_index", (long)p);
    jw_int(w, "device_index", (long)d);
    type_string(di->type, buf, sizeof buf);
    jw_str(w, "type", di->type.ok ? buf : NULL);
    jw_str(w, "name", di->name);
    jw_str(w, "vendor", di->vendor);
    jw_num(w, "vendor_id", di->vendor_id);
    /* The hex form too, because that is how vendor ids are written everywhere else (PCI ids). */
    if (di->vendor_id.ok)
        snprintf(buf, sizeof buf, "0x%04" PRIx64, di->vendor_id.v);
    jw_str(w, "vendor_id_hex", di->vendor_id.ok ? buf : NULL);
    jw_num(w, "compute_units", di->compute_units);
    jw_num(w, "max_clock_mhz", di->clock_mhz);
    jw_num(w, "global_mem_bytes", di->global_mem);
    jw_num(w, "local_mem_bytes", di->local_mem);
    jw_str(w, "local_mem_type", local_mem_type_string(di->local_mem_type));
    jw_num(w, "max_alloc_bytes", di->max_alloc);
    jw_num(w, "max_constant_buffer_bytes", di->max_const);
    jw_num(w, "max_work_group_size", di->max_wg);
    if (di->wi_sizes == NULL) {
        jw_str(w, "max_work_item_sizes", NULL);
    } else {
        /* Inline: three small numbers read better on one line. */
        jw_sep(w, "max_work_item_sizes");
        fputc('[', w->f);
        for (size_t i = 0; i < di->n_wi_sizes; i++)
            fprintf(w->f, "%s%zu", i ? ", " : "", di->wi_sizes[i]);
        fputc(']', w->f);
    }
    jw_open(w, "vector_width_float", '{');
    jw_num(w, "preferred", di->pref_float);
    jw_num(w, "native", di->native_float);
    jw_close(w, '}');
    jw_open(w, "vector_width_half", '{');
    jw_num(w, "preferred", di->pref_half);
    jw_num(w, "native", di->native_half);
    jw_close(w, '}');
    jw_bool(w, "fp16", di->fp16);
    jw_bool(w, "fp64", di->fp64);
    jw_open(w, "subgroups", '{');
    jw_bool(w, "supported", di->subgroups);
    jw_bool(w, "cl_khr_subgroups", di->sg_khr);
    jw_bool(w, "cl_intel_subgroups", di->sg_intel);
    jw_num(w, "max_num_sub_groups", di->max_sub_groups);
    jw_close(w, '}');
    jw_str(w, "device_version", di->version);
    jw_str(w, "opencl_c_version", di->c_version);
    jw_str(w, "driver_version", di->driver);
    jw_num(w, "profiling_timer_resolution_ns", di->timer_res_ns);
    jw_str(w, "device_key", di->key);
    jw_bool(w, "default", di->is_default ? TRI_YES : TRI_NO);
    tuning_view tv;
    query_tuning(p, d, &tv);
    if (tv.error[0])
        jw_str(w, "create_error", tv.error);
    if (tv.ok) {
        jw_str(w, "matrix_units", tv.matrix);
        jw_open(w, "tuning", '{');
        jw_str(w, "report", tv.report);
        jw_open(w, "params", '[');
        for (int op = 0; op < CLATTN_OPERATION_COUNT; op++) {
            jw_open(w, NULL, '{');
            jw_str(w, "operation", clattn_operation_name((clattn_operation)op));
            jw_params(w, &tv.params[op], (clattn_operation)op);
            jw_close(w, '}');
        }
        jw_close(w, ']');
        if (n_problems > CLATTN_OPERATION_COUNT) {
            jw_open(w, "classes", '[');
            for (int i = CLATTN_OPERATION_COUNT; i < n_problems; i++) {
                const clattn_problem_class *pc = &problems[i].pc;
                jw_open(w, NULL, '{');
                jw_str(w, "operation", clattn_operation_name(pc->operation));
                jw_str(w, "dtype", clattn_dtype_name(pc->dtype));
                /* sizes past 32 bits on ILP32 too */
                jw_num(w, "head_dim", (info_num){1, (uint64_t)pc->head_dim});
                jw_num(w, "seq_q", (info_num){1, (uint64_t)pc->seq_q});
                jw_num(w, "seq_kv", (info_num){1, (uint64_t)pc->seq_kv});
                jw_bool(w, "causal", pc->causal ? TRI_YES : TRI_NO);
                jw_bool(w, "masked", pc->masked ? TRI_YES : TRI_NO);
                jw_params(w, &tv.params[i], pc->operation);
                jw_close(w, '}');
            }
            jw_close(w, ']');
        }
        jw_close(w, '}');
    }
    jw_close(w, '}');
}

static void print_selection_json(json_writer *w, const char *key, const selection *sel,
                                 const plat_info *plats)
{
    char buf[64];
    jw_open(w, key, '{');
    if (key != NULL && strcmp(key, "requested") == 0)
        jw_str(w, "spec", sel->spec);
    else
        jw_str(w, "CLATTN_DEVICE", getenv("CLATTN_DEVICE"));
    jw_bool(w, "ok", sel->status == CLATTN_SUCCESS ? TRI_YES : TRI_NO);
    jw_str(w, "status", clattn_status_name(sel->status));
    if (sel->status == CLATTN_SUCCESS) {
        const dev_info *di = selected_info(sel, plats);
        if (di != NULL) {
            snprintf(buf, sizeof buf, "%ld:%ld", sel->plat_index, sel->dev_index);
            jw_str(w, "index", buf);
            jw_str(w, "name", di->name);
        } else {
            char *name = query_string(0, sel->device, CL_DEVICE_NAME);
            jw_str(w, "index", NULL);
            jw_str(w, "name", name);
            free(name);
        }
        jw_str(w, "why", sel->why[0] ? sel->why : NULL);
    } else {
        jw_str(w, "error", sel->error);
    }
    jw_close(w, '}');
}

static void print_json(const plat_info *plats, cl_uint n_plats, const selection *def,
                       const selection *req)
{
    json_writer w = {stdout, 0, {1}};
    jw_open(&w, NULL, '{');
    jw_str(&w, "clattn_version", clattn_version_string());
    jw_open(&w, "platforms", '[');
    for (cl_uint p = 0; p < n_plats; p++) {
        const plat_info *pi = &plats[p];
        jw_open(&w, NULL, '{');
        jw_int(&w, "index", (long)p);
        jw_str(&w, "name", pi->name);
        jw_str(&w, "vendor", pi->vendor);
        jw_str(&w, "version", pi->version);
        if (pi->dev_err != CL_SUCCESS && pi->dev_err != CL_DEVICE_NOT_FOUND)
            jw_int(&w, "device_error", (long)pi->dev_err);
        jw_open(&w, "devices", '[');
        for (cl_uint d = 0; d < pi->n_devs; d++)
            print_device_json(&w, &pi->devs[d], p, d);
        jw_close(&w, ']');
        jw_close(&w, '}');
    }
    jw_close(&w, ']');
    print_selection_json(&w, "default", def, plats);
    if (req->asked)
        print_selection_json(&w, "requested", req, plats);
    jw_close(&w, '}');
    fputc('\n', stdout);
}

/* ------------------------------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clattn-info [--json] [--device SPEC] [--class CLASS]... [--help]\n"
            "\n"
            "Lists OpenCL platforms and devices with the properties that matter for attention,\n"
            "which device clattn_create(NULL) picks (honouring CLATTN_DEVICE) and why, and per\n"
            "device the kernel parameters of one f32 problem per operation and their source.\n"
            "\n"
            "  --json          print one JSON object instead of the table\n"
            "  --device SPEC   also show what SPEC resolves to: \"gpu\", \"cpu\", \"P:D\",\n"
            "                  or a case-insensitive substring of a platform or device name\n"
            "  --class OP,DTYPE,HEAD_DIM,SEQ_Q,SEQ_KV[,causal][,masked]\n"
            "                  also show, per device, the parameters a call of that class\n"
            "                  looks up (clattn_get_params: before the operation fits them to\n"
            "                  the device) and where they come from; up to 16 times.\n"
            "                  OP: scores, pv, softmax, fused, decode or merge; DTYPE: f32,\n"
            "                  f16 or bf16; HEAD_DIM 1 to 576, 0 for softmax and merge;\n"
            "                  softmax's SEQ_Q and SEQ_KV are its rows and columns; masked:\n"
            "                  an additive mask or key lengths\n"
            "  --help          this text\n"
            "\n"
            "Exit status: 0 ok, 1 bad usage, a spec that does not resolve or a context that the\n"
            "default or the given device refuses, 2 no OpenCL device.\n");
}

int main(int argc, char **argv)
{
    int json = 0;
    const char *spec = NULL;
    int have_spec = 0;
    add_representative();

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--device") == 0 || strncmp(a, "--device=", 9) == 0) {
            if (a[8] != '=' && i + 1 >= argc) {
                fprintf(stderr, "clattn-info: --device needs a SPEC\n");
                usage(stderr);
                return EXIT_USAGE;
            }
            /* One spec: with two, the last one won without a word; an empty one is no spec. */
            const char *why = have_spec ? "given twice" : NULL;
            spec = a[8] == '=' ? a + 9 : argv[++i];
            if (!why && !*spec)
                why = "an empty SPEC (leave --device out for the default device)";
            if (why) {
                fprintf(stderr, "clattn-info: --device: %s\n", why);
                usage(stderr);
                return EXIT_USAGE;
            }
            have_spec = 1;
        } else if (strcmp(a, "--class") == 0 || strncmp(a, "--class=", 8) == 0) {
            const char *arg = a[7] == '=' ? a + 8 : i + 1 < argc ? argv[++i] : NULL;
            const char *why = !arg                        ? "needs a CLASS"
                              : n_problems == MAX_PROBLEMS ? "given more than 16 times"
                                                           : parse_class(arg, &problems[n_problems]);
            if (why) {
                fputs("clattn-info: bad --class", stderr);
                if (arg) {
                    fputs(" '", stderr);
                    fput_text(arg, stderr);
                    fputc('\'', stderr);
                }
                fprintf(stderr, ": %s\n", why);
                usage(stderr);
                return EXIT_USAGE;
            }
            n_problems++;
        } else {
            fputs("clattn-info: unknown option '", stderr);
            fput_text(a, stderr);
            fputs("'\n", stderr);
            usage(stderr);
            return EXIT_USAGE;
        }
    }

    plat_info *plats = NULL;
    cl_uint n_plats = 0;
    size_t total_devs = 0;
    int rc = collect_platforms(&plats, &n_plats, &total_devs);
    if (rc != 0) {
        if (rc == EXIT_NO_DEVICE) {
            fprintf(stderr, "clattn-info: no OpenCL platform/device found\n"
                            "hint: install an OpenCL ICD for your hardware (e.g. pocl-opencl-icd on "
                            "Debian/Ubuntu for the CPU) and check that /etc/OpenCL/vendors lists it\n");
        }
        free_platforms(plats, n_plats);
        return rc;
    }

    /* Static: the why buffers are a few hundred bytes each and need not live on the stack. */
    static selection def, req;
    def.asked = 1;
    select_device(&def, NULL, plats, n_plats);
    if (def.plat_index >= 0)
        plats[def.plat_index].devs[def.dev_index].is_default = 1;
    req.asked = have_spec;
    if (have_spec)
        select_device(&req, spec, plats, n_plats);

    for (int i = 0; i < 2; i++) {
        const selection *sel = i == 0 ? &def : &req;
        if (sel->asked && sel->status == CLATTN_SUCCESS) {
            watched[i].p = sel->plat_index;
            watched[i].d = sel->dev_index;
        }
    }
    if (json)
        print_json(plats, n_plats, &def, &req);
    else
        print_human(plats, n_plats, &def, &req);

    /* The listing is printed even when a spec fails, so the user sees what exists; the failure
     * itself goes to stderr for scripts that only check the exit status and stderr. */
    rc = 0;
    if (def.status != CLATTN_SUCCESS) {
        fputs("clattn-info: clattn_create(NULL) would fail: ", stderr);
        fput_text(def.error, stderr);
        fputc('\n', stderr);
        rc = EXIT_USAGE;
    }
    if (req.asked && req.status != CLATTN_SUCCESS) {
        fputs("clattn-info: --device \"", stderr);
        fput_text(spec, stderr);
        fputs("\": ", stderr);
        fput_text(req.error, stderr);
        fputc('\n', stderr);
        rc = EXIT_USAGE;
    }
    for (int i = 0; i < 2; i++)
        if (watched[i].error[0] && (i == 0 || watched[1].p != watched[0].p || watched[1].d != watched[0].d)) {
            fprintf(stderr, "clattn-info: clattn_create(%s) fails on %ld:%ld: ", i == 0 ? "NULL" : "--device",
                    watched[i].p, watched[i].d);
            fput_text(watched[i].error, stderr);
            fputc('\n', stderr);
            rc = EXIT_USAGE;
        }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "clattn-info: writing the output failed\n");
        rc = EXIT_USAGE;
    }
    free_platforms(plats, n_plats);
    return rc;
}
