/* Device discovery and selection ("gpu", "cpu", "P:D", name substring), device facts, device key. */
#include "internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PLATFORMS 16
#define MAX_DEVICES 64

/* ASCII only, whatever the application's locale: keys and tags must not depend on it. */
static int ascii_alnum(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static char ascii_lower(char c)
{
    return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

/* A driver version as one line of a tuning file reads it back: control characters become blanks
 * and trailing blanks go (the reader strips them, and a blank-only tag would leave a bare
 * "driver" line). */
static void tidy_tag(char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if ((unsigned char)s[n] < 0x20 || s[n] == 0x7f)
            s[n] = ' ';
    while (n > 0 && s[n - 1] == ' ')
        s[--n] = '\0';
}

/* A string query into buf, cut to size - 1 bytes where the value is longer (a driver may report
 * names of any length; a plain query into a short buffer would fail as a whole). "" on failure. */
static cl_int read_str(cl_device_id d, cl_platform_id p, cl_uint what, char *buf, size_t size)
{
    buf[0] = '\0';
    size_t n = 0;
    cl_int err = d ? clGetDeviceInfo(d, what, 0, NULL, &n) : clGetPlatformInfo(p, what, 0, NULL, &n);
    if (err != CL_SUCCESS)
        return err;
    char *tmp = n > size ? malloc(n) : NULL;
    if (n > size && !tmp)
        return CL_OUT_OF_HOST_MEMORY;
    char *dst = tmp ? tmp : buf;
    const size_t cap = tmp ? n : size;
    err = d ? clGetDeviceInfo(d, what, cap, dst, NULL) : clGetPlatformInfo(p, what, cap, dst, NULL);
    if (err == CL_SUCCESS && tmp)
        snprintf(buf, size, "%.*s", (int)(size - 1), tmp);
    free(tmp);
    if (err != CL_SUCCESS)
        buf[0] = '\0';
    buf[size - 1] = '\0';
    return err;
}

static void get_str(cl_device_id d, cl_device_info what, char *buf, size_t size)
{
    read_str(d, NULL, what, buf, size);
}

static void get_pstr(cl_platform_id p, cl_platform_info what, char *buf, size_t size)
{
    read_str(NULL, p, what, buf, size);
}

clattn_status clattn__read_devinfo(cl_platform_id p, cl_device_id d, clattn_devinfo *info)
{
    memset(info, 0, sizeof *info);
    get_pstr(p, CL_PLATFORM_NAME, info->platform_name, sizeof info->platform_name);
    get_pstr(p, CL_PLATFORM_VERSION, info->platform_version, sizeof info->platform_version);
    get_str(d, CL_DEVICE_NAME, info->name, sizeof info->name);
    get_str(d, CL_DEVICE_VENDOR, info->vendor, sizeof info->vendor);
    get_str(d, CL_DEVICE_VERSION, info->version, sizeof info->version);
    get_str(d, CL_DRIVER_VERSION, info->driver, sizeof info->driver);
    tidy_tag(info->driver);
    cl_int err = clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof info->type, &info->type, NULL);
    err |= clGetDeviceInfo(d, CL_DEVICE_VENDOR_ID, sizeof info->vendor_id, &info->vendor_id, NULL);
    err |= clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof info->compute_units,
                           &info->compute_units, NULL);
    err |= clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof info->local_mem, &info->local_mem, NULL);
    err |= clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof info->global_mem, &info->global_mem,
                           NULL);
    err |= clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof info->max_alloc, &info->max_alloc,
                           NULL);
    if (clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_CACHE_SIZE, sizeof info->cache_size, &info->cache_size,
                        NULL) != CL_SUCCESS)
        info->cache_size = 0; /* optional: fused_direct's key chunks and its choice to read in place */
    err |= clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof info->max_wg, &info->max_wg, NULL);
    err |= clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof info->max_item, info->max_item,
                           NULL);
    err |= clGetDeviceInfo(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof info->mem_align_bits,
                           &info->mem_align_bits, NULL);
    if (err != CL_SUCCESS)
        return CLATTN_OPENCL_ERROR;
    cl_device_fp_config fp = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL) == CL_SUCCESS)
        info->has_fma = (fp & CL_FP_FMA) != 0;
    /* The CPU kernels' register tiles (-DNREG16, common.cl) follow the vector registers: a native
     * float width of 16 is AVX-512's 32 zmm (32 float16 values), 8 is AVX or AVX2's 16 ymm (8),
     * 4 is SSE's 16 xmm (4; for AArch64 see below). PoCL reports the width of the instruction set
     * it compiles for (8 on an AVX2-only AMD EPYC, where it compiles for haswell). GPUs, and CPUs
     * reporting 16 or more or nothing, get 32, the value the tiles were first measured with (on
     * AVX-512); the GPU kernels do not use it. */
    cl_uint vw = 0;
    info->nreg16 = 32;
    if ((info->type & CL_DEVICE_TYPE_CPU) &&
        clGetDeviceInfo(d, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT, sizeof vw, &vw, NULL) == CL_SUCCESS &&
        vw > 0 && vw < 16)
        info->nreg16 = vw >= 8 ? 8 : 4;
#if defined(__aarch64__)
    /* A CPU device is this host: AArch64's NEON has 32 registers of 4 floats, as many values as
     * AVX2's 16 of 8, so a native width of 4 there gets AVX2's tiles (not measured: no AArch64
     * machine was at hand). */
    if ((info->type & CL_DEVICE_TYPE_CPU) && info->nreg16 == 4)
        info->nreg16 = 8;
#endif
    info->nreg16_device = info->nreg16;
    if (info->compute_units == 0)
        info->compute_units = 1;
    /* OpenCL has no query for it, but NVIDIA's driver runs on CUDA grids, whose y and z extents
     * stop at 65535 blocks. */
    info->max_groups_yz = (info->type & CL_DEVICE_TYPE_GPU) && info->vendor_id == 0x10de ? 65535 : 0;
    return clattn_device_key(d, info->key, sizeof info->key);
}

clattn_status clattn_device_key(cl_device_id device, char *buf, size_t size)
{
    if (!buf || size == 0)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_device_key: buf is NULL or size is 0");
    char name[256];
    cl_uint vendor = 0, cus = 0;
    cl_ulong local = 0;
    if (!device || read_str(device, NULL, CL_DEVICE_NAME, name, sizeof name) != CL_SUCCESS ||
        clGetDeviceInfo(device, CL_DEVICE_VENDOR_ID, sizeof vendor, &vendor, NULL) != CL_SUCCESS ||
        clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL) != CL_SUCCESS ||
        clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL) != CL_SUCCESS)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT,
                            "clattn_device_key: device is NULL or not a valid cl_device_id");
    name[sizeof name - 1] = '\0';
    /* Names carry spaces and punctuation; the key is also a file name, so keep it tame. */
    for (char *c = name; *c; c++)
        if (!(ascii_alnum(*c) || *c == '.' || *c == '-' || *c == '_'))
            *c = '_';
    /* formed apart, so that a buffer too small is left as it was (nothing the caller owns is
     * modified on failure) */
    char key[sizeof name + 64];
    const int n = snprintf(key, sizeof key, "%04x:%s:%u:%llu", vendor, name, cus, (unsigned long long)(local / 1024));
    if (n < 0 || (size_t)n >= size)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT,
                            "clattn_device_key: buffer of %zu bytes is too small (needs %d)", size, n + 1);
    memcpy(buf, key, (size_t)n + 1);
    return CLATTN_SUCCESS;
}

/* "P:D", two decimal indices that fit an unsigned, digits only: sscanf's %u would skip blanks,
 * take a sign and wrap 4294967296 to 0. */
static int parse_index_spec(const char *s, unsigned *p, unsigned *d)
{
    unsigned *out[2] = {p, d};
    for (int i = 0; i < 2; i++) {
        unsigned long long v = 0;
        const char *start = s;
        while (*s >= '0' && *s <= '9') {
            v = v * 10 + (unsigned long long)(*s++ - '0');
            if (v > UINT_MAX)
                return 0;
        }
        if (s == start || *s != (i == 0 ? ':' : '\0'))
            return 0;
        *out[i] = (unsigned)v;
        s++;
    }
    return 1;
}

static int contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] &&
               ascii_lower(hay[i]) == ascii_lower(needle[i]))
            i++;
        if (i == n)
            return 1;
    }
    return n == 0;
}

static int equal_ci(const char *a, const char *b)
{
    while (*a && *b && ascii_lower(*a) == ascii_lower(*b))
        a++, b++;
    return *a == '\0' && *b == '\0';
}

const char *clattn__device_refusal(const char *name)
{
    /* Mesa's gallivm (llvmpipe, and lavapipe under zink) counts the iterations of all of a
     * kernel's loops together and leaves every loop once 65535 have run, without an error
     * (LP_MAX_TGSI_LOOP_ITERATIONS; seen on rusticl 22.3: fused attention over 900 keys of head
     * dim 256, the P·V GEMM over 36000 keys). Attention loops over the keys. */
    if (contains_ci(name, "llvmpipe"))
        return "Mesa's llvmpipe stops a kernel's loops after 65535 iterations in all, without an "
               "error, so attention over long sequences would come out wrong; use PoCL "
               "(pocl-opencl-icd) for a CPU device";
    return NULL;
}

/* OpenCL's first use in a process, once, before any thread's own queries. PoCL 3.1 initialises its
 * devices on the first clGetPlatformIDs or clGetDeviceIDs without a lock: threads that get there
 * at once see no device (CL_DEVICE_NOT_FOUND) or crash in its device setup (SIGSEGV). Measured
 * here: four threads creating their first contexts together failed in 20 of 20 processes, with
 * this in none. Other implementations do the same work once for nothing. */
static pthread_once_t opencl_first_use = PTHREAD_ONCE_INIT;

static void opencl_start(void)
{
    cl_platform_id plats[MAX_PLATFORMS];
    cl_uint nplat = 0;
    if (clGetPlatformIDs(MAX_PLATFORMS, plats, &nplat) != CL_SUCCESS)
        return;
    for (cl_uint pi = 0; pi < nplat && pi < MAX_PLATFORMS; pi++) {
        cl_device_id devs[MAX_DEVICES];
        cl_uint ndev = 0;
        (void)clGetDeviceIDs(plats[pi], CL_DEVICE_TYPE_ALL, MAX_DEVICES, devs, &ndev);
    }
}

static void say(char *why, size_t size, const char *fmt, const char *a, const char *b,
                unsigned p, unsigned d)
{
    if (why && size)
        snprintf(why, size, fmt, a, b, p, d);
}

clattn_status clattn_select_device(const char *spec, cl_platform_id *platform, cl_device_id *device,
                                   char *why, size_t why_size)
{
    /* *platform, *device and why are written on success only */
    if (!platform || !device)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT,
                            "clattn_select_device: platform and device must not be NULL");

    const char *source = "argument";
    if (!spec || !*spec) {
        spec = getenv("CLATTN_DEVICE");
        source = "CLATTN_DEVICE";
        if (spec && !*spec)
            spec = NULL;
    }

    pthread_once(&opencl_first_use, opencl_start);
    cl_platform_id plats[MAX_PLATFORMS];
    cl_uint nplat = 0;
    cl_int err = clGetPlatformIDs(MAX_PLATFORMS, plats, &nplat);
    if (err != CL_SUCCESS || nplat == 0)
        return clattn__fail(NULL, CLATTN_NO_DEVICE,
                            "no OpenCL platform found (clGetPlatformIDs: %s); install an OpenCL "
                            "driver (ICD), e.g. pocl-opencl-icd",
                            clattn__cl_error_name(err));
    if (nplat > MAX_PLATFORMS)
        nplat = MAX_PLATFORMS;

    /* Parse the spec once: a type word, an index pair, or a name substring. */
    enum { ANY, TYPE, INDEX, NAME } kind = ANY;
    cl_device_type want_type = CL_DEVICE_TYPE_ALL;
    unsigned want_p = 0, want_d = 0;
    if (spec) {
        if (equal_ci(spec, "gpu")) {
            kind = TYPE;
            want_type = CL_DEVICE_TYPE_GPU;
        } else if (equal_ci(spec, "cpu")) {
            kind = TYPE;
            want_type = CL_DEVICE_TYPE_CPU;
        } else if (equal_ci(spec, "accelerator")) {
            kind = TYPE;
            want_type = CL_DEVICE_TYPE_ACCELERATOR;
        } else if (parse_index_spec(spec, &want_p, &want_d)) {
            kind = INDEX;
        } else {
            kind = NAME;
        }
    }

    cl_platform_id first_p = NULL;
    cl_device_id first_d = NULL;
    unsigned first_pi = 0, first_di = 0;
    /* The first device that matched but that clattn does not run on (clattn__device_refusal). */
    char refused[1024] = "";
    /* The first platform whose devices could not be listed, for a message if nothing matches (a
     * platform without devices answers CL_DEVICE_NOT_FOUND, which is no error). */
    char unlisted[160] = "";
    for (cl_uint pi = 0; pi < nplat; pi++) {
        cl_device_id devs[MAX_DEVICES];
        cl_uint ndev = 0;
        err = clGetDeviceIDs(plats[pi], CL_DEVICE_TYPE_ALL, MAX_DEVICES, devs, &ndev);
        if (err != CL_SUCCESS) {
            if (err != CL_DEVICE_NOT_FOUND && !unlisted[0])
                snprintf(unlisted, sizeof unlisted, "; listing the devices of platform %u failed (clGetDeviceIDs: %s)",
                         (unsigned)pi, clattn__cl_error_name(err));
            continue;
        }
        if (ndev > MAX_DEVICES)
            ndev = MAX_DEVICES;
        char pname[256];
        get_pstr(plats[pi], CL_PLATFORM_NAME, pname, sizeof pname);
        for (cl_uint di = 0; di < ndev; di++) {
            char dname[256];
            cl_device_type type = 0;
            get_str(devs[di], CL_DEVICE_NAME, dname, sizeof dname);
            clGetDeviceInfo(devs[di], CL_DEVICE_TYPE, sizeof type, &type, NULL);
            int match = 0;
            const char *refusal = clattn__device_refusal(dname);
            switch (kind) {
            case ANY:
                match = (type & CL_DEVICE_TYPE_GPU) != 0;
                if (!first_d && !refusal) {
                    first_p = plats[pi];
                    first_d = devs[di];
                    first_pi = pi;
                    first_di = di;
                }
                break;
            case TYPE:
                match = (type & want_type) != 0;
                break;
            case INDEX:
                match = pi == want_p && di == want_d;
                break;
            case NAME:
                match = contains_ci(dname, spec) || contains_ci(pname, spec);
                break;
            }
            if (refusal && (match || kind == ANY)) { /* passed over: another device may match */
                if (!refused[0])
                    snprintf(refused, sizeof refused, "%.255s on %.255s (%u:%u): %.400s", dname, pname,
                             (unsigned)pi, (unsigned)di, refusal);
                continue;
            }
            if (match) {
                *platform = plats[pi];
                *device = devs[di];
                if (kind == ANY)
                    say(why, why_size, "first GPU: %s on %s (%u:%u; no device spec given)", dname,
                        pname, pi, di);
                else if (why && why_size)
                    snprintf(why, why_size, "%s on %s (%u:%u) matches %s \"%s\"", dname, pname,
                             (unsigned)pi, (unsigned)di, source, spec);
                return CLATTN_SUCCESS;
            }
        }
    }
    if (kind == ANY && first_d) {
        char dname[256], pname[256];
        get_str(first_d, CL_DEVICE_NAME, dname, sizeof dname);
        get_pstr(first_p, CL_PLATFORM_NAME, pname, sizeof pname);
        *platform = first_p;
        *device = first_d;
        say(why, why_size, "first device: %s on %s (%u:%u; no GPU present, no device spec given)",
            dname, pname, first_pi, first_di);
        return CLATTN_SUCCESS;
    }
    if (refused[0])
        return clattn__fail(NULL, CLATTN_UNSUPPORTED, "%s device clattn can run on: %s%s",
                            spec ? "the device spec matches no" : "no", refused, unlisted);
    if (kind == ANY)
        return clattn__fail(NULL, CLATTN_NO_DEVICE, "no OpenCL device found on %u platform(s)%s",
                            (unsigned)nplat, unlisted);
    return clattn__fail(NULL, CLATTN_NO_DEVICE, "device spec \"%s\" (from %s) matches no OpenCL device%s",
                        spec, source, unlisted);
}
