/*
 * multi_device: one attention split across several OpenCL devices of one process
 * (docs/distributed.md).
 *
 * One cl_context holds N devices of one platform; each device gets its own in-order queue and
 * its own clattn context on that queue (clattn_create_from_queue). Q, K and V live once, in
 * buffers of the shared context, and every device reads them through views. Two splits:
 *
 *   --split keys     device i takes key range [k_i, k_i+1) against every query and writes an f32
 *                    part and its log-sum-exp; device 0 merges the parts (clattn_merge) after the
 *                    other devices' `done` events. With causal, the key ranges are cut so that
 *                    each device sees the same number of (query, key) pairs.
 *   --split queries  device i takes query rows against the keys they see and writes those rows
 *                    of the output; nothing to merge. With causal, the rows are cut into 2N
 *                    chunks and device i takes chunks i and 2N-1-i (zig-zag), so that the cheap
 *                    early rows and the expensive late rows even out.
 *
 * Between the devices there are only events: every device's calls are enqueued at once, the
 * queues are flushed, and the one host wait is on the last command of device 0. (--threads
 * enqueues each device from a host thread of its own, for drivers whose enqueue does the work,
 * such as PoCL's "basic" CPU device; the devices still meet only through events.) The result is
 * checked against device 0 computing the whole attention in one call, and against a float64
 * reference on the host at small sizes; both runs are timed (median of --reps runs after a
 * warm-up) and the speedup printed, with the share of the split run that the merge (or the
 * gather, below) takes.
 *
 * Why this is an example and not a library call: how to cut the work, which device gets what,
 * and where the data lives are the application's decisions (devices of different speeds, memory
 * that is or is not shared, an existing context with its own queues). The library supplies the
 * pieces: slice offsets (q_offset / k_offset), f32 parts with their LSE, and an exact merge that
 * waits on events from any queue of the same cl_context.
 *
 * Exit status: 0 success, 1 the split result does not match, 2 bad command line, 3 an OpenCL or
 * clattn failure (the message says which call).
 */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif

#include <clattn.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEVICES 16
#define EXIT_MISMATCH 1
#define EXIT_USAGE 2
#define EXIT_RUNTIME 3

enum split_kind { SPLIT_KEYS, SPLIT_QUERIES };

typedef struct options {
    enum split_kind split;
    const char *platform; /* index or a substring of the platform's name or vendor; NULL: 0 */
    int devices;          /* 0: every device of the platform */
    int64_t batch, heads_q, heads_kv, seq, dim;
    int causal;
    clattn_dtype dtype;
    int reps;
    int reference; /* -1: when small enough; 0 / 1 */
    int gather;    /* queries split: -1 auto, 0 write rows in place, 1 own buffers then copy */
    int fault;     /* leave the last device's share out, to show that the check catches it */
    int threads;   /* enqueue each device's calls from a host thread of its own */
    unsigned seed;
} options;

/* One attention call of a device: query rows [q0, q0 + nq) against keys [k0, k0 + nk), into the
 * output itself (direct) or, keys split, into the device's f32 part and LSE at the same rows. */
typedef struct slice {
    int64_t q0, nq, k0, nk;
    int direct;
} slice;

typedef struct plan {
    int ncalls[MAX_DEVICES];
    slice call[MAX_DEVICES][2];
    int64_t cut[MAX_DEVICES + 1]; /* keys split: device i's keys are [cut[i], cut[i + 1]) */
} plan;

typedef struct rig {
    int n;
    cl_platform_id platform;
    cl_device_id dev[MAX_DEVICES];
    cl_context cl;
    cl_command_queue queue[MAX_DEVICES];
    clattn_context *ctx[MAX_DEVICES];
} rig;

typedef struct buffers {
    cl_mem q, k, v;
    cl_mem out_split, out_single;
    cl_mem part[MAX_DEVICES], part_lse[MAX_DEVICES]; /* keys: f32 [B][Hq][S][D], [B][Hq][S][1] */
    cl_mem rows[MAX_DEVICES];                        /* queries with gather: [B][Hq][rows of i][D] */
} buffers;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: multi_device [options]\n"
            "  --split keys|queries   how to divide the attention (default keys)\n"
            "  --platform P           platform index, or a substring of its name or vendor (default 0)\n"
            "  --devices N            use the platform's first N devices (default: all, at most %d)\n"
            "  --batch B --heads-q H --heads-kv H --seq S --dim D   (default 1 8 8 1024 64;\n"
            "                         --heads-kv: 8 where it divides --heads-q, else --heads-q)\n"
            "  --causal               causal (bottom-right) mask\n"
            "  --dtype f32|f16        storage of q, k, v and the output (default f32)\n"
            "  --reps R               timed runs of each kind after a warm-up (default 3)\n"
            "  --reference on|off|auto  also compare with a float64 host reference (auto: small sizes)\n"
            "  --gather on|off|auto   queries split: each device writes its own buffer and device 0\n"
            "                         copies the rows in (auto: when a device does not share host memory)\n"
            "  --threads              enqueue each device's calls from a host thread of its own (for\n"
            "                         drivers that run a command inside its enqueue: PoCL's basic device)\n"
            "  --seed N               input seed (default 1)\n"
            "  --fault                leave the last device's share out: the check must then fail\n"
            "PoCL 3: POCL_DEVICES=\"basic basic\" and --threads: two devices of one thread each (pthread\n"
            "devices share one pool of worker threads; docs/distributed.md).\n",
            MAX_DEVICES);
}

static int parse_int(const char *name, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!s) {
        fprintf(stderr, "multi_device: %s needs a value\n", name);
        return 0;
    }
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "multi_device: %s '%s': want an integer in [%lld, %lld]\n", name, s,
                (long long)lo, (long long)hi);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_tristate(const char *name, const char *s, int *out)
{
    if (s && !strcmp(s, "on"))
        *out = 1;
    else if (s && !strcmp(s, "off"))
        *out = 0;
    else if (s && !strcmp(s, "auto"))
        *out = -1;
    else {
        fprintf(stderr, "multi_device: %s '%s': want on, off or auto\n", name, s ? s : "");
        return 0;
    }
    return 1;
}

/* 1 on success, 0 after a message (exit 2), -1 for --help. */
static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){SPLIT_KEYS, NULL, 0, 1, 8, 8, 1024, 64, 0, CLATTN_F32, 3, -1, -1, 0, 0, 1};
    int64_t v;
    int kv_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return -1;
        if (!strcmp(a, "--causal")) {
            o->causal = 1;
            continue;
        }
        if (!strcmp(a, "--fault")) {
            o->fault = 1;
            continue;
        }
        if (!strcmp(a, "--threads")) {
            o->threads = 1;
            continue;
        }
        int ok = 1;
        if (!strcmp(a, "--split")) {
            if (val && !strcmp(val, "keys"))
                o->split = SPLIT_KEYS;
            else if (val && !strcmp(val, "queries"))
                o->split = SPLIT_QUERIES;
            else {
                fprintf(stderr, "multi_device: --split '%s': want keys or queries\n", val ? val : "");
                ok = 0;
            }
        } else if (!strcmp(a, "--platform")) {
            if (!val || !*val) {
                fprintf(stderr, "multi_device: --platform needs a value\n");
                ok = 0;
            }
            o->platform = val;
        } else if (!strcmp(a, "--devices")) {
            if ((ok = parse_int(a, val, 1, MAX_DEVICES, &v)))
                o->devices = (int)v;
        } else if (!strcmp(a, "--batch"))
            ok = parse_int(a, val, 1, 1 << 16, &o->batch);
        else if (!strcmp(a, "--heads-q"))
            ok = parse_int(a, val, 1, 1 << 12, &o->heads_q);
        else if (!strcmp(a, "--heads-kv")) {
            ok = parse_int(a, val, 1, 1 << 12, &o->heads_kv);
            kv_given = 1;
        }
        else if (!strcmp(a, "--seq"))
            ok = parse_int(a, val, 1, 1 << 22, &o->seq);
        else if (!strcmp(a, "--dim"))
            ok = parse_int(a, val, 1, CLATTN_MAX_HEAD_DIM_V, &o->dim);
        else if (!strcmp(a, "--dtype")) {
            if (val && !strcmp(val, "f32"))
                o->dtype = CLATTN_F32;
            else if (val && !strcmp(val, "f16"))
                o->dtype = CLATTN_F16;
            else {
                fprintf(stderr, "multi_device: --dtype '%s': want f32 or f16\n", val ? val : "");
                ok = 0;
            }
        } else if (!strcmp(a, "--reps")) {
            if ((ok = parse_int(a, val, 1, 1000, &v)))
                o->reps = (int)v;
        } else if (!strcmp(a, "--reference"))
            ok = parse_tristate(a, val, &o->reference);
        else if (!strcmp(a, "--gather"))
            ok = parse_tristate(a, val, &o->gather);
        else if (!strcmp(a, "--seed")) {
            if ((ok = parse_int(a, val, 0, UINT32_MAX, &v)))
                o->seed = (unsigned)v;
        } else {
            fprintf(stderr, "multi_device: unknown option '%s' (--help lists them)\n", a);
            return 0;
        }
        if (!ok)
            return 0;
        i++; /* the option's value */
    }
    if (!kv_given && o->heads_q % o->heads_kv) /* the default 8 where it divides --heads-q */
        o->heads_kv = o->heads_q;
    if (o->heads_q % o->heads_kv) {
        fprintf(stderr, "multi_device: --heads-kv %lld must divide --heads-q %lld\n",
                (long long)o->heads_kv, (long long)o->heads_q);
        return 0;
    }
    /* Each tensor must fit a size_t and stay sensible for a host that also holds a copy. */
    if ((double)o->batch * (double)o->heads_q * (double)o->seq * (double)o->dim > (double)(1LL << 32)) {
        fprintf(stderr, "multi_device: batch x heads-q x seq x dim above 2^32 elements\n");
        return 0;
    }
    if (o->batch * o->heads_q > INT32_MAX) {
        fprintf(stderr, "multi_device: batch x heads-q above 2^31 - 1\n");
        return 0;
    }
    return 1;
}

/* ---- host data ------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* binary32 -> binary16, round to nearest even (inputs here are finite and small). */
static uint16_t to_half(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const int32_t e = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t m = x & 0x7fffffu;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal or zero */
        if (e < -10)
            return (uint16_t)sign;
        m |= 0x800000u;
        const int shift = 14 - e;
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (m >> 13);
    const uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the correct rounding */
    return (uint16_t)(sign | h);
}

static double from_half(uint16_t h)
{
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0)
        v = ldexp(m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(m + 1024, e - 25);
    return (h & 0x8000) ? -v : v;
}

static double load(clattn_dtype dt, const void *p, size_t i)
{
    if (dt == CLATTN_F16)
        return from_half(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* n values uniform in [-1, 1), stored as dt. */
static void fill(uint64_t *s, clattn_dtype dt, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float f = (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0);
        if (dt == CLATTN_F16)
            ((uint16_t *)p)[i] = to_half(f);
        else
            ((float *)p)[i] = f;
    }
}

/* float64 attention of contiguous [B][H][S][D] arrays; row i sees key j iff j <= i when causal. */
static int reference(const options *o, float scale, const void *q, const void *k, const void *v,
                     double *out)
{
    const int64_t B = o->batch, Hq = o->heads_q, Hkv = o->heads_kv, S = o->seq, D = o->dim;
    double *p = malloc(sizeof(double) * (size_t)S);
    if (!p)
        return 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            const size_t qb = (size_t)((b * Hq + h) * S * D), kb = (size_t)((b * Hkv + hk) * S * D);
            for (int64_t i = 0; i < S; i++) {
                const int64_t nk = o->causal ? i + 1 : S;
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < nk; j++) {
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        dot += load(o->dtype, q, qb + (size_t)(i * D + d)) * load(o->dtype, k, kb + (size_t)(j * D + d));
                    p[j] = dot * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int64_t j = 0; j < nk; j++)
                    sum += (p[j] = exp(p[j] - mx));
                double *row = out + qb + (size_t)(i * D);
                for (int64_t d = 0; d < D; d++)
                    row[d] = 0.0;
                for (int64_t j = 0; j < nk; j++)
                    for (int64_t d = 0; d < D; d++)
                        row[d] += p[j] / sum * load(o->dtype, v, kb + (size_t)(j * D + d));
            }
        }
    free(p);
    return 1;
}

/* |got - want| <= atol + rtol·|want| everywhere (NaN fails); reports the first bad element. */
static int compare(const char *what, clattn_dtype dt, const void *got, const double *want_d,
                   const void *want_raw, size_t n, double atol, double rtol)
{
    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double g = load(dt, got, i), w = want_d ? want_d[i] : load(dt, want_raw, i);
        const double err = fabs(g - w);
        if (!(err <= atol + rtol * fabs(w))) {
            if (!bad++)
                first = i;
        }
        if (err > worst || err != err)
            worst = err;
    }
    if (bad) {
        const double w = want_d ? want_d[first] : load(dt, want_raw, first);
        printf("MISMATCH %s: %zu of %zu elements outside atol %.1e rtol %.1e; first at %zu: got %.8g want %.8g\n",
               what, bad, n, atol, rtol, first, load(dt, got, first), w);
        return 0;
    }
    printf("check %s: %zu elements match (largest |difference| %.3g)\n", what, n, worst);
    return 1;
}

/* ---- OpenCL set-up --------------------------------------------------------------------------- */

static int lower_contains(const char *hay, const char *needle)
{
    for (size_t i = 0; hay[i]; i++) {
        size_t j = 0;
        while (needle[j] && hay[i + j] && tolower((unsigned char)hay[i + j]) == tolower((unsigned char)needle[j]))
            j++;
        if (!needle[j])
            return 1;
    }
    return 0;
}

static int pick_platform(const char *spec, cl_platform_id *out)
{
    cl_uint np = 0;
    cl_platform_id ps[16];
    cl_int err = clGetPlatformIDs(16, ps, &np);
    if (err != CL_SUCCESS || np == 0) {
        fprintf(stderr, "multi_device: no OpenCL platform (clGetPlatformIDs: %d)\n", (int)err);
        return 0;
    }
    if (np > 16)
        np = 16;
    if (!spec) {
        *out = ps[0];
        return 1;
    }
    char *end = NULL;
    const long idx = strtol(spec, &end, 10);
    if (end != spec && !*end) {
        if (idx < 0 || idx >= (long)np) {
            fprintf(stderr, "multi_device: --platform %ld: there are %u platforms\n", idx, (unsigned)np);
            return 0;
        }
        *out = ps[idx];
        return 1;
    }
    for (cl_uint i = 0; i < np; i++) {
        char name[256] = "", vendor[256] = "";
        clGetPlatformInfo(ps[i], CL_PLATFORM_NAME, sizeof name - 1, name, NULL);
        clGetPlatformInfo(ps[i], CL_PLATFORM_VENDOR, sizeof vendor - 1, vendor, NULL);
        if (lower_contains(name, spec) || lower_contains(vendor, spec)) {
            *out = ps[i];
            return 1;
        }
    }
    fprintf(stderr, "multi_device: no platform's name or vendor contains '%s'\n", spec);
    return 0;
}

static void rig_release(rig *r)
{
    for (int i = 0; i < r->n; i++) {
        clattn_release(r->ctx[i]);
        if (r->queue[i])
            clReleaseCommandQueue(r->queue[i]);
    }
    if (r->cl)
        clReleaseContext(r->cl);
}

/* One cl_context over the chosen devices, a queue and a clattn context per device. */
static int rig_create(const options *o, rig *r)
{
    memset(r, 0, sizeof *r);
    if (!pick_platform(o->platform, &r->platform))
        return EXIT_USAGE;
    cl_uint nd = 0;
    cl_int err = clGetDeviceIDs(r->platform, CL_DEVICE_TYPE_ALL, MAX_DEVICES, r->dev, &nd);
    if (err != CL_SUCCESS || nd == 0) {
        fprintf(stderr, "multi_device: the platform has no devices (clGetDeviceIDs: %d)\n", (int)err);
        return EXIT_RUNTIME;
    }
    if (nd > MAX_DEVICES)
        nd = MAX_DEVICES;
    if (o->devices > (int)nd) {
        fprintf(stderr, "multi_device: --devices %d but the platform has %u (PoCL: set POCL_DEVICES)\n",
                o->devices, (unsigned)nd);
        return EXIT_USAGE;
    }
    const int n = o->devices ? o->devices : (int)nd;
    r->cl = clCreateContext(NULL, (cl_uint)n, r->dev, NULL, NULL, &err);
    if (!r->cl) {
        fprintf(stderr, "multi_device: clCreateContext over %d devices: %d\n", n, (int)err);
        return EXIT_RUNTIME;
    }
    for (int i = 0; i < n; i++) {
        r->n = i + 1;
        r->queue[i] = clCreateCommandQueue(r->cl, r->dev[i], 0, &err);
        if (!r->queue[i]) {
            fprintf(stderr, "multi_device: clCreateCommandQueue(device %d): %d\n", i, (int)err);
            return EXIT_RUNTIME;
        }
        const clattn_status s = clattn_create_from_queue(r->queue[i], &r->ctx[i]);
        if (s != CLATTN_SUCCESS) {
            fprintf(stderr, "multi_device: clattn_create_from_queue(device %d): %s: %s\n", i,
                    clattn_status_name(s), clattn_last_error(NULL));
            return EXIT_RUNTIME;
        }
        char name[256] = "";
        cl_uint cu = 0;
        clGetDeviceInfo(r->dev[i], CL_DEVICE_NAME, sizeof name - 1, name, NULL);
        clGetDeviceInfo(r->dev[i], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
        printf("device %d: %s, %u compute units\n", i, name, (unsigned)cu);
    }
    return 0;
}

/* ---- the split ------------------------------------------------------------------------------- */

/* Who computes what. Keys: device i gets keys [k_i, k_i+1). Without causal it takes every query
 * into its part and device 0 merges all rows. With causal, key j is seen by the S - j queries
 * from row j on, so the cuts make the areas equal, k_i = S·(1 - sqrt(1 - i/N)); device i computes
 * only rows [k_i, S) (the rows above see none of its keys), device 0 writes rows [0, k_1) (which
 * see no other device's keys) straight into the output, and only rows [k_1, S) are merged.
 * Queries: contiguous equal rows, or with causal 2N chunks dealt as i and 2N-1-i, each against
 * the keys [0, q0 + nq) its rows can see. */
static void make_plan(const options *o, int n, plan *pl)
{
    const int64_t S = o->seq;
    memset(pl, 0, sizeof *pl);
    if (o->split == SPLIT_KEYS) {
        int64_t *cut = pl->cut;
        for (int i = 0; i <= n; i++) {
            const double f = (double)i / n;
            cut[i] = (int64_t)llround(o->causal ? (double)S * (1.0 - sqrt(1.0 - f)) : (double)S * f);
        }
        for (int i = 1; i <= n; i++) /* every device at least one key (S >= 2N) */
            if (cut[i] <= cut[i - 1])
                cut[i] = cut[i - 1] + 1;
        cut[n] = S;
        for (int i = n - 1; i > 0; i--)
            if (cut[i] >= cut[i + 1])
                cut[i] = cut[i + 1] - 1;
        for (int i = 0; i < n; i++) {
            const int64_t k0 = cut[i], nk = cut[i + 1] - cut[i];
            if (!o->causal) {
                pl->ncalls[i] = 1;
                pl->call[i][0] = (slice){0, S, k0, nk, 0};
            } else if (i == 0) {
                pl->ncalls[0] = n > 1 ? 2 : 1;
                pl->call[0][0] = (slice){0, nk, 0, nk, 1};
                pl->call[0][1] = (slice){nk, S - nk, 0, nk, 0};
            } else {
                pl->ncalls[i] = 1;
                pl->call[i][0] = (slice){k0, S - k0, k0, nk, 0};
            }
        }
    } else if (!o->causal) {
        for (int i = 0; i < n; i++) {
            const int64_t a = S * i / n, b = S * (i + 1) / n;
            pl->ncalls[i] = 1;
            pl->call[i][0] = (slice){a, b - a, 0, S, 1};
        }
    } else {
        const int c = 2 * n;
        for (int i = 0; i < n; i++) {
            const int chunks[2] = {i, c - 1 - i};
            pl->ncalls[i] = 2;
            for (int t = 0; t < 2; t++) {
                const int64_t a = S * chunks[t] / c, b = S * (chunks[t] + 1) / c;
                pl->call[i][t] = (slice){a, b - a, 0, b, 1};
            }
        }
    }
}

/* A [B][H][rows][D] view of rows [row0, row0 + nrows) of a [B][H][total][D] buffer. */
static clattn_tensor rows_view(cl_mem buf, clattn_dtype dt, int64_t B, int64_t H, int64_t total,
                               int64_t row0, int64_t nrows, int64_t D)
{
    clattn_tensor t = {buf, dt, row0 * D, {B, H, nrows, D}, {H * total * D, total * D, D}};
    return t;
}

/* The call for slice sl. Every slice is a block of one self-attention of S tokens, so the offsets
 * put causal in global positions (docs/usage.md#slices): q_offset = q0 - (nk - nq), k_offset = k0. */
static clattn_attention_desc slice_desc(const options *o, const slice *sl, float scale)
{
    clattn_attention_desc d = {0};
    d.batch = o->batch;
    d.heads_q = o->heads_q;
    d.heads_kv = o->heads_kv;
    d.seq_q = sl->nq;
    d.seq_kv = sl->nk;
    d.head_dim = o->dim;
    d.scale = scale;
    d.causal = o->causal;
    d.q_offset = sl->q0 - (sl->nk - sl->nq);
    d.k_offset = sl->k0;
    return d;
}

static double now(void)
{
#if defined(CLOCK_MONOTONIC)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
#endif
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CL_TRY(call, what)                                                             \
    do {                                                                               \
        const cl_int e_ = (call);                                                      \
        if (e_ != CL_SUCCESS) {                                                        \
            fprintf(stderr, "multi_device: %s: OpenCL error %d\n", what, (int)e_);     \
            goto fail;                                                                 \
        }                                                                              \
    } while (0)

#define CLATTN_TRY(ctx, call, what)                                                                 \
    do {                                                                                            \
        const clattn_status s_ = (call);                                                            \
        if (s_ != CLATTN_SUCCESS) {                                                                 \
            fprintf(stderr, "multi_device: %s: %s: %s\n", what, clattn_status_name(s_),             \
                    clattn_last_error(ctx));                                                        \
            goto fail;                                                                              \
        }                                                                                           \
    } while (0)

static void release_events(cl_event *ev, int n)
{
    for (int i = 0; i < n; i++)
        if (ev[i]) {
            clReleaseEvent(ev[i]);
            ev[i] = NULL;
        }
}

/* One device's share of a split run: its calls, enqueued on its own queue and clattn context. */
typedef struct device_job {
    const options *o;
    const rig *r;
    const plan *pl;
    const buffers *bf;
    float scale;
    int gather;
    int i;
    cl_event done; /* the device's last command */
    int ok;
} device_job;

/* Enqueues device job->i's calls without waiting for anything: the devices are independent
 * until the merge. The queue is in order, so the device's second call follows its first by
 * itself, and the last call's event stands for the device. */
static void *enqueue_device(void *arg)
{
    device_job *job = arg;
    const options *o = job->o;
    const int64_t B = o->batch, Hq = o->heads_q, Hkv = o->heads_kv, S = o->seq, D = o->dim;
    const int i = job->i, ncalls = job->pl->ncalls[i];
    const buffers *bf = job->bf;
    clattn_context *ctx = job->r->ctx[i];
    int64_t own = 0, row_in_own = 0;
    for (int c = 0; c < ncalls; c++)
        own += job->pl->call[i][c].nq;
    job->ok = 0;
    for (int c = 0; c < ncalls; c++) {
        const slice *sl = &job->pl->call[i][c];
        clattn_attention_desc d = slice_desc(o, sl, job->scale);
        const clattn_tensor q = rows_view(bf->q, o->dtype, B, Hq, S, sl->q0, sl->nq, D);
        const clattn_tensor k = rows_view(bf->k, o->dtype, B, Hkv, S, sl->k0, sl->nk, D);
        const clattn_tensor v = rows_view(bf->v, o->dtype, B, Hkv, S, sl->k0, sl->nk, D);
        clattn_tensor dst, lse;
        if (o->split == SPLIT_KEYS && !sl->direct) {
            dst = rows_view(bf->part[i], CLATTN_F32, B, Hq, S, sl->q0, sl->nq, D);
            lse = rows_view(bf->part_lse[i], CLATTN_F32, B, Hq, S, sl->q0, sl->nq, 1);
            d.lse = &lse;
        } else if (job->gather) {
            dst = rows_view(bf->rows[i], o->dtype, B, Hq, own, row_in_own, sl->nq, D);
            row_in_own += sl->nq;
        } else {
            dst = rows_view(bf->out_split, o->dtype, B, Hq, S, sl->q0, sl->nq, D);
        }
        cl_event ev = NULL;
        const clattn_status s = clattn_attention(ctx, &d, &q, &k, &v, &dst, 0, NULL, &ev);
        if (s != CLATTN_SUCCESS) {
            fprintf(stderr, "multi_device: clattn_attention(device %d): %s: %s\n", i, clattn_status_name(s),
                    clattn_last_error(ctx));
            return NULL;
        }
        release_events(&job->done, 1);
        job->done = ev;
    }
    job->ok = 1;
    return NULL;
}

/* Queries with gather: device 0 copies each chunk's rows from device i's own buffer into place,
 * one rectangle per chunk (rows of D·es bytes, Hq of them a slice, B slices), after `wait`. */
static int enqueue_gather(const options *o, const rig *r, const plan *pl, const buffers *bf, int i,
                          cl_uint num_wait, const cl_event *wait, cl_event *last)
{
    const int64_t B = o->batch, Hq = o->heads_q, S = o->seq;
    const size_t row = (size_t)o->dim * clattn_dtype_size(o->dtype);
    int64_t own = 0, at = 0;
    for (int c = 0; c < pl->ncalls[i]; c++)
        own += pl->call[i][c].nq;
    for (int c = 0; c < pl->ncalls[i]; c++) {
        const slice *sl = &pl->call[i][c];
        const size_t src_origin[3] = {(size_t)at * row, 0, 0}, dst_origin[3] = {(size_t)sl->q0 * row, 0, 0};
        const size_t region[3] = {(size_t)sl->nq * row, (size_t)Hq, (size_t)B};
        cl_event ev = NULL;
        const cl_int err = clEnqueueCopyBufferRect(r->queue[0], bf->rows[i], bf->out_split, src_origin, dst_origin,
                                                   region, (size_t)own * row, (size_t)(Hq * own) * row,
                                                   (size_t)S * row, (size_t)(Hq * S) * row, num_wait, wait,
                                                   last ? &ev : NULL);
        if (err != CL_SUCCESS) {
            fprintf(stderr, "multi_device: clEnqueueCopyBufferRect: OpenCL error %d\n", (int)err);
            return 0;
        }
        if (last) {
            release_events(last, 1);
            *last = ev;
        }
        at += sl->nq;
    }
    return 1;
}

/* Keys split: device 0 merges the parts, after `wait` (the devices' done events; NULL: none).
 * Without causal, all rows over the active devices' parts; with causal, row block j = [k_j, k_j+1)
 * over the parts of devices 0..j, the only ones whose keys its rows see (rows [0, k_1) were
 * written by device 0 directly). *last: the last merge's event (the queue is in order). */
static int enqueue_merges(const options *o, const rig *r, const plan *pl, const buffers *bf, int active,
                          const cl_event *wait, cl_event *last)
{
    const int64_t B = o->batch, Hq = o->heads_q, S = o->seq, D = o->dim;
    clattn_tensor parts[MAX_DEVICES], lses[MAX_DEVICES];
    const int blocks = o->causal ? r->n : 1;
    for (int j = o->causal ? 1 : 0; j < blocks; j++) {
        const int64_t r0 = o->causal ? pl->cut[j] : 0, nr = o->causal ? pl->cut[j + 1] - r0 : S;
        const int np = o->causal ? (j + 1 < active ? j + 1 : active) : active;
        for (int p = 0; p < np; p++) {
            parts[p] = rows_view(bf->part[p], CLATTN_F32, B, Hq, S, r0, nr, D);
            lses[p] = rows_view(bf->part_lse[p], CLATTN_F32, B, Hq, S, r0, nr, 1);
        }
        const clattn_tensor out = rows_view(bf->out_split, o->dtype, B, Hq, S, r0, nr, D);
        cl_event ev = NULL;
        const clattn_status s =
            clattn_merge(r->ctx[0], np, parts, lses, &out, NULL, wait ? (cl_uint)np : 0, wait, last ? &ev : NULL);
        if (s != CLATTN_SUCCESS) {
            fprintf(stderr, "multi_device: clattn_merge: %s: %s\n", clattn_status_name(s), clattn_last_error(r->ctx[0]));
            return 0;
        }
        if (last) {
            release_events(last, 1);
            *last = ev;
        }
    }
    return 1;
}

/* One split run: every device's calls enqueued without a host wait (from one host thread per
 * device with --threads), then device 0's merge (keys), row copies (queries with gather) or a
 * marker (queries in place) after the devices' done events, and one wait for that. Seconds in
 * *seconds; *merge_s: the merge or gather alone, run again on the finished parts (0 for queries
 * in place). */
static int run_split(const options *o, const rig *r, const plan *pl, buffers *bf, float scale, int gather,
                     int threads, double *seconds, double *merge_s)
{
    const int64_t B = o->batch, Hq = o->heads_q, S = o->seq, D = o->dim;
    const size_t es = clattn_dtype_size(o->dtype);
    const int n = r->n, active = o->fault ? n - 1 : n;
    device_job job[MAX_DEVICES];
    pthread_t thread[MAX_DEVICES];
    int started[MAX_DEVICES] = {0};
    cl_event done[MAX_DEVICES] = {0}, final = NULL;
    int ok = 0;
    for (int i = 0; i < active; i++)
        job[i] = (device_job){o, r, pl, bf, scale, gather, i, NULL, 0};

    /* Fill the output with NaN (all-ones bits in f32 and f16) so that rows nobody wrote fail the
     * check. Finished before the clock starts: it is not part of the split. */
    const uint32_t nan_bits = 0xffffffffu;
    CL_TRY(clEnqueueFillBuffer(r->queue[0], bf->out_split, &nan_bits, es, 0, (size_t)(B * Hq * S * D) * es, 0,
                               NULL, NULL),
           "clEnqueueFillBuffer(out)");
    CL_TRY(clFinish(r->queue[0]), "clFinish");

    const double t0 = now();
    /* With --threads device i > 0 is enqueued from a thread of its own while this thread does
     * device 0; joining waits only for the enqueues (for drivers that run a command inside its
     * enqueue, PoCL's "basic" CPU device, that is the work itself). */
    for (int i = 1; i < active; i++)
        if (threads) {
            if (pthread_create(&thread[i], NULL, enqueue_device, &job[i])) {
                fprintf(stderr, "multi_device: pthread_create failed\n");
                goto fail;
            }
            started[i] = 1;
        }
    enqueue_device(&job[0]);
    for (int i = 1; i < active; i++) {
        if (started[i]) {
            pthread_join(thread[i], NULL);
            started[i] = 0;
        } else if (job[i - 1].ok) {
            enqueue_device(&job[i]);
        }
    }
    for (int i = 0; i < active; i++) {
        if (!job[i].ok)
            goto fail;
        done[i] = job[i].done;
        job[i].done = NULL;
    }
    /* Queues must be flushed before queue 0 waits on their events, or they may never start. */
    for (int i = 0; i < n; i++)
        CL_TRY(clFlush(r->queue[i]), "clFlush");

    if (o->split == SPLIT_KEYS) {
        if (!enqueue_merges(o, r, pl, bf, active, done, &final))
            goto fail;
    } else if (gather) {
        for (int i = 0; i < active; i++)
            if (!enqueue_gather(o, r, pl, bf, i, 1, &done[i], &final))
                goto fail;
    }
    /* Queries in place, or keys with causal on one device (all its rows are the first block,
     * which that device writes in place: no merge ran): a marker after the devices' work. */
    if (!final)
        CL_TRY(clEnqueueMarkerWithWaitList(r->queue[0], (cl_uint)active, done, &final), "clEnqueueMarkerWithWaitList");
    CL_TRY(clFlush(r->queue[0]), "clFlush");
    CL_TRY(clWaitForEvents(1, &final), "clWaitForEvents");
    *seconds = now() - t0;

    /* The merge (gather) alone, on the parts just made, for its share of the run. */
    *merge_s = 0.0;
    if (o->split == SPLIT_KEYS) {
        const double m0 = now();
        if (!enqueue_merges(o, r, pl, bf, active, NULL, NULL))
            goto fail;
        CL_TRY(clFinish(r->queue[0]), "clFinish(merge)");
        *merge_s = now() - m0;
    } else if (gather) {
        const double m0 = now();
        for (int i = 0; i < active; i++)
            if (!enqueue_gather(o, r, pl, bf, i, 0, NULL, NULL))
                goto fail;
        CL_TRY(clFinish(r->queue[0]), "clFinish");
        *merge_s = now() - m0;
    }
    ok = 1;
fail:
    for (int i = 1; i < active; i++)
        if (started[i])
            pthread_join(thread[i], NULL);
    if (!ok) /* leave no command running on memory the caller is about to free */
        for (int i = 0; i < n; i++)
            clFinish(r->queue[i]);
    for (int i = 0; i < active; i++)
        release_events(&job[i].done, 1);
    release_events(done, MAX_DEVICES);
    release_events(&final, 1);
    return ok;
}

/* The whole attention on device 0 in one call. */
static int run_single(const options *o, const rig *r, buffers *bf, float scale, double *seconds)
{
    const int64_t B = o->batch, Hq = o->heads_q, Hkv = o->heads_kv, S = o->seq, D = o->dim;
    const slice all = {0, S, 0, S, 1};
    const clattn_attention_desc d = slice_desc(o, &all, scale);
    const clattn_tensor q = rows_view(bf->q, o->dtype, B, Hq, S, 0, S, D);
    const clattn_tensor k = rows_view(bf->k, o->dtype, B, Hkv, S, 0, S, D);
    const clattn_tensor v = rows_view(bf->v, o->dtype, B, Hkv, S, 0, S, D);
    const clattn_tensor out = rows_view(bf->out_single, o->dtype, B, Hq, S, 0, S, D);
    cl_event ev = NULL;
    int ok = 0;
    CL_TRY(clFinish(r->queue[0]), "clFinish");
    const double t0 = now();
    CLATTN_TRY(r->ctx[0], clattn_attention(r->ctx[0], &d, &q, &k, &v, &out, 0, NULL, &ev), "clattn_attention");
    CL_TRY(clWaitForEvents(1, &ev), "clWaitForEvents");
    *seconds = now() - t0;
    ok = 1;
fail:
    release_events(&ev, 1);
    return ok;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static cl_mem make_buffer(const rig *r, cl_mem_flags flags, size_t bytes, void *host)
{
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(r->cl, flags, bytes, host, &err);
    if (!m)
        fprintf(stderr, "multi_device: clCreateBuffer(%zu bytes): %d\n", bytes, (int)err);
    return m;
}

static int all_share_host_memory(const rig *r)
{
    for (int i = 0; i < r->n; i++) {
        cl_bool unified = CL_FALSE;
        if (clGetDeviceInfo(r->dev[i], CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof unified, &unified, NULL) != CL_SUCCESS ||
            !unified)
            return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    options o;
    const int parsed = parse_args(argc, argv, &o);
    if (parsed < 0) {
        usage(stdout);
        return 0;
    }
    if (!parsed)
        return EXIT_USAGE;

    rig r;
    int rc = rig_create(&o, &r);
    if (rc) {
        rig_release(&r);
        return rc;
    }
    const int n = r.n;
    if (o.seq < 2 * n) {
        fprintf(stderr, "multi_device: --seq %lld is too short for %d devices (at least 2 per device)\n",
                (long long)o.seq, n);
        rig_release(&r);
        return EXIT_USAGE;
    }
    if (o.fault && n < 2) {
        fprintf(stderr, "multi_device: --fault needs at least two devices\n");
        rig_release(&r);
        return EXIT_USAGE;
    }
    const int gather = o.split == SPLIT_QUERIES && (o.gather < 0 ? !all_share_host_memory(&r) : o.gather);
    const int64_t B = o.batch, Hq = o.heads_q, Hkv = o.heads_kv, S = o.seq, D = o.dim;
    const size_t es = clattn_dtype_size(o.dtype);
    const size_t nq = (size_t)(B * Hq * S * D), nk = (size_t)(B * Hkv * S * D), nl = (size_t)(B * Hq * S);
    const float scale = (float)(1.0 / sqrt((double)D));
    const double pairs = (double)B * Hq * (o.causal ? (double)S * (S + 1) / 2 : (double)S * S);
    const int use_ref = o.reference < 0 ? pairs * (double)D <= 0x1p27 : o.reference;

    plan pl;
    make_plan(&o, n, &pl);
    printf("attention B %lld Hq %lld Hkv %lld S %lld D %lld %s %s, split %s over %d devices%s\n", (long long)B,
           (long long)Hq, (long long)Hkv, (long long)S, (long long)D, clattn_dtype_name(o.dtype),
           o.causal ? "causal" : "not causal", o.split == SPLIT_KEYS ? "by keys" : "by queries", n,
           o.split == SPLIT_QUERIES ? (gather ? " (own buffers, gathered)" : " (rows in place)") : "");
    for (int i = 0; i < n; i++)
        for (int c = 0; c < pl.ncalls[i]; c++)
            printf("  device %d: queries [%lld, %lld) x keys [%lld, %lld) -> %s\n", i, (long long)pl.call[i][c].q0,
                   (long long)(pl.call[i][c].q0 + pl.call[i][c].nq), (long long)pl.call[i][c].k0,
                   (long long)(pl.call[i][c].k0 + pl.call[i][c].nk),
                   pl.call[i][c].direct ? (gather ? "own buffer" : "output") : "f32 part + LSE");

    buffers bf;
    memset(&bf, 0, sizeof bf);
    void *qh = malloc(nq * es), *kh = malloc(nk * es), *vh = malloc(nk * es);
    void *got = malloc(nq * es), *single = malloc(nq * es);
    double *want = use_ref ? malloc(sizeof(double) * nq) : NULL;
    double *t_split = malloc(sizeof(double) * (size_t)o.reps), *t_single = malloc(sizeof(double) * (size_t)o.reps);
    double *t_merge = malloc(sizeof(double) * (size_t)o.reps);
    rc = EXIT_RUNTIME;
    if (!qh || !kh || !vh || !got || !single || (use_ref && !want) || !t_split || !t_single || !t_merge) {
        fprintf(stderr, "multi_device: out of host memory\n");
        goto done;
    }
    uint64_t seed = 0x9E3779B97F4A7C15ULL ^ ((uint64_t)o.seed << 1 | 1);
    fill(&seed, o.dtype, qh, nq);
    fill(&seed, o.dtype, kh, nk);
    fill(&seed, o.dtype, vh, nk);

    const cl_mem_flags in = CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR;
    if (!(bf.q = make_buffer(&r, in, nq * es, qh)) || !(bf.k = make_buffer(&r, in, nk * es, kh)) ||
        !(bf.v = make_buffer(&r, in, nk * es, vh)) || !(bf.out_split = make_buffer(&r, CL_MEM_READ_WRITE, nq * es, NULL)) ||
        !(bf.out_single = make_buffer(&r, CL_MEM_READ_WRITE, nq * es, NULL)))
        goto done;
    for (int i = 0; i < n; i++) {
        if (o.split == SPLIT_KEYS) {
            if (!(bf.part[i] = make_buffer(&r, CL_MEM_READ_WRITE, nq * 4, NULL)) ||
                !(bf.part_lse[i] = make_buffer(&r, CL_MEM_READ_WRITE, nl * 4, NULL)))
                goto done;
        } else if (gather) {
            int64_t own = 0;
            for (int c = 0; c < pl.ncalls[i]; c++)
                own += pl.call[i][c].nq;
            if (!(bf.rows[i] = make_buffer(&r, CL_MEM_READ_WRITE, (size_t)(B * Hq * own * D) * es, NULL)))
                goto done;
        }
    }

    /* Warm-up: builds (or loads from the cache) every kernel on every device, from this thread
     * alone even with --threads: PoCL's CPU devices of one kind share a build, and two threads
     * building it at once for two of them is asking its compiler cache for trouble. */
    double ts, tm;
    if (!run_split(&o, &r, &pl, &bf, scale, gather, 0, &ts, &tm) || !run_single(&o, &r, &bf, scale, &ts))
        goto done;
    for (int rep = 0; rep < o.reps; rep++)
        if (!run_split(&o, &r, &pl, &bf, scale, gather, o.threads, &t_split[rep], &t_merge[rep]) ||
            !run_single(&o, &r, &bf, scale, &t_single[rep]))
            goto done;

    cl_int err = clEnqueueReadBuffer(r.queue[0], bf.out_split, CL_TRUE, 0, nq * es, got, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueReadBuffer(r.queue[0], bf.out_single, CL_TRUE, 0, nq * es, single, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "multi_device: clEnqueueReadBuffer: %d\n", (int)err);
        goto done;
    }

    /* Split against the single call: the same kernels on the same inputs, so only the merge's
     * rounding (f32) and the output's own (f16: one unit in the last place) differ. Against the
     * float64 reference: the tests' tolerance for f32 outputs plus the f16 rounding. */
    const double o_eps = o.dtype == CLATTN_F16 ? 0x1p-10 : 0.0;
    int match = compare("split vs one device", o.dtype, got, NULL, single, nq, 2e-5 + o_eps, 2e-4 + o_eps);
    if (use_ref) {
        if (!reference(&o, scale, qh, kh, vh, want)) {
            fprintf(stderr, "multi_device: out of host memory\n");
            goto done;
        }
        match &= compare("split vs float64", o.dtype, got, want, NULL, nq, 3e-5 + o_eps, 2e-4 + o_eps);
        match &= compare("one device vs float64", o.dtype, single, want, NULL, nq, 3e-5 + o_eps, 2e-4 + o_eps);
    }

    double min_split = t_split[0], min_single = t_single[0];
    for (int i = 1; i < o.reps; i++) {
        min_split = t_split[i] < min_split ? t_split[i] : min_split;
        min_single = t_single[i] < min_single ? t_single[i] : min_single;
    }
    const double med_split = median(t_split, o.reps), med_single = median(t_single, o.reps);
    const double med_merge = median(t_merge, o.reps);
    printf("one device: median %.4f s (min %.4f)  split over %d: median %.4f s (min %.4f)  speedup %.2fx "
           "(min/min %.2fx)\n",
           med_single, min_single, n, med_split, min_split, med_single / med_split, min_single / min_split);
    if (o.split == SPLIT_KEYS || gather)
        printf("%s alone: median %.4f s = %.1f%% of the split run\n", o.split == SPLIT_KEYS ? "merge" : "gather",
               med_merge, 100.0 * med_merge / med_split);
    rc = match ? 0 : EXIT_MISMATCH;
    printf("%s\n", match ? "OK" : "FAILED: the split result does not match");

done:
    for (int i = 0; i < MAX_DEVICES; i++) {
        const cl_mem per_device[3] = {bf.part[i], bf.part_lse[i], bf.rows[i]};
        for (int j = 0; j < 3; j++)
            if (per_device[j])
                clReleaseMemObject(per_device[j]);
    }
    cl_mem ms[5] = {bf.q, bf.k, bf.v, bf.out_split, bf.out_single};
    for (int j = 0; j < 5; j++)
        if (ms[j])
            clReleaseMemObject(ms[j]);
    free(qh);
    free(kh);
    free(vh);
    free(got);
    free(single);
    free(want);
    free(t_split);
    free(t_single);
    free(t_merge);
    rig_release(&r);
    return rc;
}
