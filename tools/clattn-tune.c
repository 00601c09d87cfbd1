/* clattn-tune: searches each kernel's parameters for one device and writes the tuning store.
 *
 * For every (shape, dtype, operation) task: the defaults (what the library uses without a user
 * file) are timed first; then candidates from the operation's parameter space (all of it when
 * small, else a random walk around the best so far) are each run once, dropped if the run fails
 * (build failure, work-group or local-memory limits) or if sampled output rows differ from a
 * float64 reference, and otherwise timed (wall clock around every kernel the operation enqueues:
 * warm-up, median of N). A kernel that needs private memory (spills, on GPUs) is timed like any
 * other: NVIDIA's OpenCL reports private memory for every tiled GEMM candidate tried on an H200
 * (144 to 528 bytes), so dropping them, as the tuner did, left nothing to tune there. The winner,
 * or the defaults when nothing beats them, goes into the device's user tuning file, written
 * atomically; but for decode, whose defaults on GPUs depend on the query rows per kv head
 * (src/defaults.c: clattn__decode_tiled_default), which a bucket does not hold, no entry is written
 * where the defaults win, and an earlier entry of that bucket is dropped: the library keeps
 * choosing per call.
 *
 * A task of dtype f16 or bf16 stores its inputs in that type (rounded on the host, so that the
 * reference sees what the device reads) and its output too, but for scores, which the unfused
 * path writes to its f32 workspace; its entry is of that dtype, since the library looks a call up
 * by its inputs' type and takes no entry of another. Sampled rows are checked within the output
 * type's rounding.
 *
 * merge is tuned as applications run it: clattn_merge of MERGE_PARTS f32 partials (O, LSE) of the
 * shape's [B][H][Sq][D] rows, prepared once, checked against ref_merge. The library looks merge's
 * parameters up in one bucket whatever the shape (src/merge.c, merge_wg), so a run tunes merge once. */
#define _POSIX_C_SOURCE 200809L
#include "clattn.h"
#include "internal.h"
#include "clattn_ref.h" /* the float64 reference (ref/), the tests' too */
#include "json.h"
#include "storage.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Partials a merge task combines; part MERGE_PARTS-1 has LSE -inf on every other row. */
#define MERGE_PARTS 4

/* The most --budget takes, in seconds (11.6 days): more is a typo, not a plan. */
#define MAX_BUDGET_S 1000000

/* The most elements one host buffer of a --shape may have (scores: B x H x SQ x SKV): well past
 * what allocates, which then fails with its own message, but small enough that no size computed
 * from the shape overflows, in bytes either: SIZE_MAX over the largest bytes per element any array
 * takes (MERGE_PARTS floats, or a double), 2^59 with a 64-bit size_t and 2^27 with a 32-bit one. */
#define MAX_SHAPE_ELEMENTS ((double)SIZE_MAX / (8.0 * MERGE_PARTS))

typedef struct shape {
    long long b, h, hkv, sq, skv, d;
    int causal;
    int kvlen; /* per-batch key lengths (kv_lengths): the bucket of masked problems */
} shape;

typedef struct task {
    shape s;
    clattn_operation op;
    clattn_dtype dt; /* storage of the inputs, as the bucket's dtype (merge: f32) */
    int unfused;     /* a softmax task added for the unfused path's bucket (main) */
    /* results */
    clattn_dtype timed_dt; /* the inputs' type as timed (make_data), which the report gives */
    int tried, pruned, rejected;
    double default_ms, best_ms;
    int best[CLATTN_MAX_KERNEL_PARAMS], defaults[CLATTN_MAX_KERNEL_PARAMS];
    int best_is_default; /* nothing beat the defaults */
} task;

/* A decode task whose defaults won gets no store entry (see the top of this file). */
static int no_entry(const task *t) { return t->op == CLATTN_OPERATION_DECODE && t->best_is_default; }

static clattn_context *ctx;
static cl_command_queue queue;
static int iters = 5, tty, verbose, max_candidates = -1; /* -1: no limit */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "clattn-tune: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* The value v of option opt as a decimal integer in lo..hi: digits alone (no blank, sign or
 * trailing text, which strtoll would pass over); anything else exits, naming both. */
static long long int_arg(const char *opt, const char *v, long long lo, long long hi)
{
    char *end = NULL;
    errno = 0;
    const long long n = strtoll(v, &end, 10);
    if (*v < '0' || *v > '9' || *end || errno == ERANGE || n < lo || n > hi)
        die("bad %s %s (an integer %lld..%lld)", opt, v, lo, hi);
    return n;
}

static const char *const shape_fields[6] = {"B", "H", "HKV", "SQ", "SKV", "D"};

/* The sizes B,H,HKV,SQ,SKV,D that open p (a --shape value), each digits alone and at most
 * INT32_MAX, the library's limit, into s; returns the rest of p (the flags), or NULL when they
 * are malformed, with *bad the field at fault (6: fewer than six). */
static const char *shape_sizes(const char *p, shape *s, int *bad)
{
    long long *const v[6] = {&s->b, &s->h, &s->hkv, &s->sq, &s->skv, &s->d};
    for (int k = 0; k < 6; k++) {
        char *end = NULL;
        errno = 0;
        *v[k] = strtoll(p, &end, 10);
        if (*p < '0' || *p > '9' || errno == ERANGE || *v[k] > INT32_MAX || (k < 5 && *end != ',')) {
            *bad = k < 5 && *end == '\0' && end != p ? 6 : k;
            return NULL;
        }
        p = k < 5 ? end + 1 : end;
    }
    return p;
}

/* The elements of a shape's largest host buffer, in double: the products of its sizes may not
 * fit in 64 bits. */
static double shape_elements(const shape *s)
{
    const double q = (double)s->b * (double)s->h * (double)s->sq;
    const double k = (double)s->b * (double)s->hkv * (double)s->skv;
    return fmax(fmax(q, k) * (double)s->d, q * (double)s->skv);
}

/* Creates the tuning directory and makes (and removes) a file there, so that a store that cannot
 * be written fails before the search has spent its budget, not after. */
static void check_tuning_dir(const char *dir)
{
    errno = 0;
    if (clattn__make_dirs(dir) != 0) /* errno EEXIST (or none): it is there, but no directory */
        die("cannot create the tuning directory %s: %s", dir,
            errno && errno != EEXIST ? strerror(errno) : "not a directory");
    /* A store the library would not read (docs/guarantees.md) is no store to spend the budget on. */
    char why[300];
    const int dfd = clattn__open_dir_for_write(dir, why, sizeof why);
    if (dfd < 0 && why[0])
        die("the tuning directory %s is not trusted: %s; the library would ignore a store written there "
            "(docs/guarantees.md)", dir, why);
    if (dfd >= 0)
        close(dfd);
    char tmp[sizeof ctx->tuning_dir + 32];
    snprintf(tmp, sizeof tmp, "%s/.clattn-tune.XXXXXX", dir);
    const int fd = mkstemp(tmp);
    if (fd < 0)
        die("cannot write to the tuning directory %s: %s", dir, strerror(errno));
    close(fd);
    unlink(tmp);
}


static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float frand(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0); }

/* ---- buffers and the float64 reference on sampled rows ---- */

typedef struct data {
    float *q, *k, *v, *x;        /* host copies as stored (x: softmax input) */
    cl_mem dq, dk, dv, dx, dout; /* device, inputs of type dt, dout of type out_dt */
    int *kvl;                    /* kv_lengths, host and device (NULL without) */
    cl_mem dkvl;
    clattn_dtype dt, out_dt;
    size_t nq, nk, nout;
    /* merge: partials [part][B][H][Sq][D] and LSEs [part][B][H][Sq], one buffer per part */
    float *po, *pl;
    cl_mem dpo[MERGE_PARTS], dpl[MERGE_PARTS], dlse;
    size_t nrows_all;
    long long rows[8][3]; /* sampled (b, h, i) */
    int nrows;
} data;

/* A device buffer holding the n floats of h stored as dt. */
static cl_mem upload(const float *h, size_t n, clattn_dtype dt)
{
    const size_t es = clattn_dtype_size(dt);
    void *bytes = malloc(n * es);
    if (!bytes)
        die("out of host memory");
    for (size_t i = 0; i < n; i++)
        store(bytes, i, dt, h[i]);
    cl_int err;
    cl_mem m = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * es,
                              bytes, &err);
    free(bytes);
    if (err != CL_SUCCESS)
        die("clCreateBuffer (%zu %s elements): %d", n, clattn_dtype_name(dt), err);
    return m;
}

/* n values uniform in [-1, 1) times mul, as stored as dt (so the reference sees what the device
 * reads). */
static float *random_floats(size_t n, float mul, clattn_dtype dt)
{
    float *p = malloc(n * sizeof *p);
    if (!p)
        die("out of host memory");
    for (size_t i = 0; i < n; i++)
        p[i] = stored(mul * frand(), dt);
    return p;
}

/* The type of an operation's output: the unfused path's scores go to its f32 workspace, merge
 * combines f32 partials; the others write the inputs' type, as applications that store f16 or
 * bf16 do. */
static clattn_dtype out_dtype(clattn_operation op, clattn_dtype dt)
{
    return op == CLATTN_OPERATION_SCORES || op == CLATTN_OPERATION_MERGE ? CLATTN_F32 : dt;
}

static void make_data(const shape *s, clattn_operation op, clattn_dtype dt, data *dd)
{
    memset(dd, 0, sizeof *dd);
    dd->dt = op == CLATTN_OPERATION_MERGE ? CLATTN_F32 : dt;
    dd->out_dt = out_dtype(op, dd->dt);
    dd->nq = (size_t)(s->b * s->h * s->sq * s->d);
    dd->nk = (size_t)(s->b * s->hkv * s->skv * s->d);
    dd->nout = op == CLATTN_OPERATION_SCORES || op == CLATTN_OPERATION_SOFTMAX
                   ? (size_t)(s->b * s->h * s->sq * s->skv)
                   : dd->nq;
    if (op == CLATTN_OPERATION_MERGE) {
        dd->nrows_all = (size_t)(s->b * s->h * s->sq);
        dd->po = random_floats(MERGE_PARTS * dd->nout, 1.0f, CLATTN_F32);
        dd->pl = random_floats(MERGE_PARTS * dd->nrows_all, 1.0f, CLATTN_F32);
        for (size_t i = 0; i < MERGE_PARTS * dd->nrows_all; i++)
            dd->pl[i] = 10.0f + 8.0f * dd->pl[i]; /* weights spread over e^16 */
        for (size_t r = 0; r < dd->nrows_all; r += 2)
            dd->pl[(MERGE_PARTS - 1) * dd->nrows_all + r] = -INFINITY;
    } else if (op == CLATTN_OPERATION_SOFTMAX) {
        dd->x = random_floats(dd->nout, 8.0f, dd->dt);
        dd->dx = upload(dd->x, dd->nout, dd->dt);
    } else {
        dd->q = random_floats(dd->nq, 1.0f, dd->dt);
        dd->k = random_floats(dd->nk, 1.0f, dd->dt);
        dd->v = random_floats(dd->nk, 1.0f, dd->dt);
        dd->dq = upload(dd->q, dd->nq, dd->dt);
        dd->dk = upload(dd->k, dd->nk, dd->dt);
        dd->dv = upload(dd->v, dd->nk, dd->dt);
    }
    cl_int err;
    if (s->kvlen && op != CLATTN_OPERATION_MERGE) {
        /* Spread over the last quarter of seq_kv, the longest first: every batch hides some keys
         * (the sampled rows check that they stay hidden), and the bucket is seq_kv's. */
        dd->kvl = malloc((size_t)s->b * sizeof *dd->kvl);
        if (!dd->kvl)
            die("out of host memory");
        for (long long b = 0; b < s->b; b++)
            dd->kvl[b] = (int)(s->skv - (b + 1) * s->skv / (4 * s->b));
        dd->dkvl = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                  (size_t)s->b * sizeof *dd->kvl, dd->kvl, &err);
        if (err != CL_SUCCESS)
            die("clCreateBuffer (kv_lengths): %d", err);
    }
    dd->dout = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE,
                              dd->nout * clattn_dtype_size(dd->out_dt), NULL, &err);
    if (err != CL_SUCCESS)
        die("clCreateBuffer (output): %d", err);
    dd->nrows = 8;
    for (int r = 0; r < 8; r++) {
        dd->rows[r][0] = (long long)(rnd() % (uint64_t)s->b);
        dd->rows[r][1] = (long long)(rnd() % (uint64_t)s->h);
        dd->rows[r][2] = r == 0 ? 0 : r == 1 ? s->sq - 1 : (long long)(rnd() % (uint64_t)s->sq);
    }
    if (op == CLATTN_OPERATION_MERGE) {
        /* The first sampled row has no visible key in any part: out 0, LSE -inf. */
        const size_t r0 = (size_t)((dd->rows[0][0] * s->h + dd->rows[0][1]) * s->sq + dd->rows[0][2]);
        for (int p = 0; p < MERGE_PARTS; p++)
            dd->pl[(size_t)p * dd->nrows_all + r0] = -INFINITY;
        for (int p = 0; p < MERGE_PARTS; p++) {
            dd->dpo[p] = upload(dd->po + (size_t)p * dd->nout, dd->nout, CLATTN_F32);
            dd->dpl[p] = upload(dd->pl + (size_t)p * dd->nrows_all, dd->nrows_all, CLATTN_F32);
        }
        dd->dlse = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE, dd->nrows_all * sizeof(float),
                                  NULL, &err);
        if (err != CL_SUCCESS)
            die("clCreateBuffer (lse): %d", err);
    }
}

static void free_data(data *dd)
{
    cl_mem ms[7] = {dd->dq, dd->dk, dd->dv, dd->dx, dd->dout, dd->dlse, dd->dkvl};
    for (int i = 0; i < 7; i++)
        if (ms[i])
            clReleaseMemObject(ms[i]);
    for (int p = 0; p < MERGE_PARTS; p++) {
        if (dd->dpo[p])
            clReleaseMemObject(dd->dpo[p]);
        if (dd->dpl[p])
            clReleaseMemObject(dd->dpl[p]);
    }
    free(dd->po);
    free(dd->pl);
    free(dd->q);
    free(dd->k);
    free(dd->v);
    free(dd->x);
    free(dd->kvl);
}

static double *to_doubles(const float *src, size_t n)
{
    double *d = malloc((n ? n : 1) * sizeof *d);
    if (!d)
        die("out of host memory");
    for (size_t i = 0; i < n; i++)
        d[i] = src[i];
    return d;
}

/* Reference row (b, h, i) of the task's output into ref, from ref/clattn_ref.c on a one-row
 * problem: the row's visible keys (key length, causal bottom-right) become that problem's key length.
 * merge: the row of every part through ref_merge, its merged LSE into *lse. */
static void ref_row(const shape *s, clattn_operation op, const data *dd, long long b, long long h,
                    long long i, double *ref, double *lse)
{
    if (op == CLATTN_OPERATION_MERGE) {
        const size_t row = (size_t)((b * s->h + h) * s->sq + i);
        double *po[MERGE_PARTS], pl[MERGE_PARTS];
        const double *cpo[MERGE_PARTS], *cpl[MERGE_PARTS];
        for (int p = 0; p < MERGE_PARTS; p++) {
            cpo[p] = po[p] = to_doubles(dd->po + (size_t)p * dd->nout + row * (size_t)s->d, (size_t)s->d);
            pl[p] = dd->pl[(size_t)p * dd->nrows_all + row];
            cpl[p] = &pl[p];
        }
        ref_merge(MERGE_PARTS, 1, (int)s->d, cpo, cpl, ref, lse);
        for (int p = 0; p < MERGE_PARTS; p++)
            free(po[p]);
        return;
    }
    const long long hk = h / (s->h / s->hkv);
    /* The batch's keys, L (kv_lengths, else seq_kv); causal: those up to i + (L - seq_q). */
    const long long len = dd->kvl ? dd->kvl[b] : s->skv;
    long long vis = s->causal ? i + 1 + (len - s->sq) : len;
    int kvlen = (int)(vis < 0 ? 0 : vis > len ? len : vis);
    if (op == CLATTN_OPERATION_SOFTMAX) {
        double *in = to_doubles(dd->x + ((b * s->h + h) * s->sq + i) * s->skv, (size_t)s->skv);
        const ref_softmax rs = {1, 1, 1, (int)s->skv, 1.0, 0, NULL, {0, 0, 0, 0}, &kvlen};
        ref_softmax_rows(&rs, in, ref);
        free(in);
        return;
    }
    const size_t kv = (size_t)(s->skv * s->d), kv_off = (size_t)((b * s->hkv + hk) * s->skv * s->d);
    double *q = to_doubles(dd->q + ((b * s->h + h) * s->sq + i) * s->d, (size_t)s->d);
    double *k = to_doubles(dd->k + kv_off, kv);
    const ref_attn a = {.batch = 1, .heads_q = 1, .heads_kv = 1, .seq_q = 1, .seq_kv = (int)s->skv,
                        .head_dim = (int)s->d, .kv_len = &kvlen};
    if (op == CLATTN_OPERATION_SCORES) {
        ref_scores(&a, q, k, ref);
    } else {
        double *v = to_doubles(dd->v + kv_off, kv);
        ref_attention(&a, q, k, v, ref, NULL, NULL);
        free(v);
    }
    free(q);
    free(k);
}

/* Max error of the sampled rows of the device output, relative to the row's largest value (merge:
 * and of the merged LSE, relative to max(1, |LSE|); -inf must be exact). */
static double check_rows(const shape *s, clattn_operation op, const data *dd)
{
    const size_t len = (size_t)(op == CLATTN_OPERATION_SCORES || op == CLATTN_OPERATION_SOFTMAX ? s->skv : s->d);
    const size_t es = clattn_dtype_size(dd->out_dt);
    double *ref = malloc(len * sizeof *ref);
    void *got = malloc(len * es);
    if (!ref || !got)
        die("out of host memory");
    double worst = 0;
    for (int r = 0; r < dd->nrows; r++) {
        const long long b = dd->rows[r][0], h = dd->rows[r][1], i = dd->rows[r][2];
        double ref_lse = 0;
        ref_row(s, op, dd, b, h, i, ref, &ref_lse);
        const size_t row = (size_t)((b * s->h + h) * s->sq + i), off = row * len;
        if (op == CLATTN_OPERATION_MERGE) {
            float got_lse;
            if (clEnqueueReadBuffer(queue, dd->dlse, CL_TRUE, row * sizeof(float), sizeof(float), &got_lse, 0,
                                    NULL, NULL) != CL_SUCCESS)
                die("clEnqueueReadBuffer failed");
            const double scale = fabs(ref_lse) > 1 ? fabs(ref_lse) : 1;
            const double e = isinf(ref_lse)    ? (got_lse == ref_lse ? 0.0 : INFINITY)
                             : isfinite(got_lse) ? fabs(got_lse - ref_lse) / scale
                                                 : INFINITY;
            if (e > worst)
                worst = e;
        }
        if (clEnqueueReadBuffer(queue, dd->dout, CL_TRUE, off * es, len * es, got, 0, NULL, NULL) !=
            CL_SUCCESS)
            die("clEnqueueReadBuffer failed");
        double norm = 1e-30;
        for (size_t j = 0; j < len; j++)
            if (isfinite(ref[j]) && fabs(ref[j]) > norm)
                norm = fabs(ref[j]);
        for (size_t j = 0; j < len; j++) {
            const double g = load(got, j, dd->out_dt);
            double e;
            if (isinf(ref[j]))
                e = g == ref[j] ? 0.0 : INFINITY;
            else
                e = isfinite(g) ? fabs(g - ref[j]) / norm : INFINITY;
            if (e > worst)
                worst = e;
        }
    }
    free(ref);
    free(got);
    return worst;
}

/* ---- running one operation ---- */

static clattn_status run_once(const shape *s, clattn_operation op, const data *dd)
{
    clattn_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = s->b;
    desc.heads_q = s->h;
    desc.heads_kv = s->hkv;
    desc.seq_q = s->sq;
    desc.seq_kv = s->skv;
    desc.head_dim = s->d;
    desc.scale = (float)(1.0 / sqrt((double)s->d)); /* given: above 256 the library asks for it */
    desc.causal = s->causal;
    desc.kv_lengths = dd->dkvl;
    desc.algorithm = op == CLATTN_OPERATION_SCORES || op == CLATTN_OPERATION_PV || op == CLATTN_OPERATION_SOFTMAX
                         ? CLATTN_ALGORITHM_UNFUSED
                         : CLATTN_ALGORITHM_FUSED;
    clattn_tensor q = clattn_tensor_bhsd(dd->dq, dd->dt, s->b, s->h, s->sq, s->d);
    clattn_tensor k = clattn_tensor_bhsd(dd->dk, dd->dt, s->b, s->hkv, s->skv, s->d);
    clattn_tensor v = clattn_tensor_bhsd(dd->dv, dd->dt, s->b, s->hkv, s->skv, s->d);
    clattn_status st;
    if (op == CLATTN_OPERATION_MERGE) {
        clattn_tensor po[MERGE_PARTS], pl[MERGE_PARTS];
        for (int p = 0; p < MERGE_PARTS; p++) {
            po[p] = clattn_tensor_bhsd(dd->dpo[p], CLATTN_F32, s->b, s->h, s->sq, s->d);
            pl[p] = clattn_tensor_bhsd(dd->dpl[p], CLATTN_F32, s->b, s->h, s->sq, 1);
        }
        clattn_tensor o = clattn_tensor_bhsd(dd->dout, CLATTN_F32, s->b, s->h, s->sq, s->d);
        clattn_tensor l = clattn_tensor_bhsd(dd->dlse, CLATTN_F32, s->b, s->h, s->sq, 1);
        st = clattn_merge(ctx, MERGE_PARTS, po, pl, &o, &l, 0, NULL, NULL);
    } else if (op == CLATTN_OPERATION_SCORES) {
        clattn_tensor sc = clattn_tensor_bhsd(dd->dout, CLATTN_F32, s->b, s->h, s->sq, s->skv);
        st = clattn_scores(ctx, &desc, &q, &k, &sc, 0, NULL, NULL);
    } else if (op == CLATTN_OPERATION_SOFTMAX) {
        clattn_softmax_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.batch = s->b;
        sd.heads = s->h;
        sd.rows = s->sq;
        sd.cols = s->skv;
        sd.causal = s->causal;
        sd.kv_lengths = dd->dkvl;
        clattn_tensor in = clattn_tensor_bhsd(dd->dx, dd->dt, s->b, s->h, s->sq, s->skv);
        clattn_tensor out = clattn_tensor_bhsd(dd->dout, dd->out_dt, s->b, s->h, s->sq, s->skv);
        st = clattn_softmax(ctx, &sd, &in, &out, 0, NULL, NULL);
    } else {
        clattn_tensor o = clattn_tensor_bhsd(dd->dout, dd->out_dt, s->b, s->h, s->sq, s->d);
        st = clattn_attention(ctx, &desc, &q, &k, &v, &o, 0, NULL, NULL);
    }
    if (st == CLATTN_SUCCESS && clFinish(queue) != CL_SUCCESS)
        st = CLATTN_OPENCL_ERROR;
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median wall time (ms) of `iters` runs after one warm-up; < 0 on failure. */
static double time_op(const shape *s, clattn_operation op, const data *dd)
{
    if (run_once(s, op, dd) != CLATTN_SUCCESS)
        return -1;
    double t[64];
    const int n = iters < 64 ? iters : 64;
    for (int i = 0; i < n; i++) {
        const double t0 = now_s();
        if (run_once(s, op, dd) != CLATTN_SUCCESS)
            return -1;
        t[i] = 1e3 * (now_s() - t0);
    }
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return t[n / 2];
}

/* The most private memory a work-item of a kernel built since programs_before needs (on GPUs,
 * registers spilled to memory), for --verbose. */
static cl_ulong private_bytes(int programs_before)
{
    cl_ulong most = 0;
    for (int i = programs_before; i < ctx->nprograms; i++)
        for (int j = 0; j < ctx->programs[i].nkernels; j++) {
            cl_ulong priv = 0;
            if (ctx->programs[i].kernels[j] && /* NULL: a kernel the device refused */
                clGetKernelWorkGroupInfo(ctx->programs[i].kernels[j], ctx->device,
                                         CL_KERNEL_PRIVATE_MEM_SIZE, sizeof priv, &priv, NULL) == CL_SUCCESS &&
                priv > most)
                most = priv;
        }
    return most;
}

/* ---- the search ---- */

static int same(const int *a, const int *b, int n) { return memcmp(a, b, (size_t)n * sizeof *a) == 0; }

/* 1 on an NVIDIA GPU, where decode's DIRECT 4 (PTX shuffles) and 5 (none) differ. */
static int g_ptx_device;

/* Removes choices that cannot matter, so equivalent candidates compare equal. */
static void canonical(const task *t, int *values)
{
    const clattn_operation op = t->op;
    const shape *s = &t->s;
    clattn_params p, d; /* the candidate and the defaults, by name (src/params.h) */
    memcpy(p.v, values, sizeof p.v);
    memcpy(d.v, t->defaults, sizeof d.v);
    if ((op == CLATTN_OPERATION_FUSED && p.fused.DIRECT == CLATTN_KERNEL_MMA_FUSED) ||
        (op == CLATTN_OPERATION_DECODE && p.decode.DIRECT == CLATTN_KERNEL_MMA_DECODE)) {
        /* fused_mma: WGY (warps), NS (16-key blocks a tile) and, for decode, SPLITS count */
        p.fused.WGX = 1;
        p.fused.RM = 1;
        p.fused.VW = 4;
    } else if (op == CLATTN_OPERATION_FUSED && p.fused.DIRECT == CLATTN_KERNEL_DIRECT) {
        /* fused_direct: WGX, WGY and VW unused */
        p.fused.WGX = p.fused.WGY = 1;
        p.fused.VW = 16;
        /* Read in place for this shape (few rows per kv head, or long K and V), where RM and NS
         * are unused too: the defaults' values stay, for the shapes of the bucket that take the
         * Kᵀ copy. */
        if (clattn__direct_in_place(ctx, s->h / s->hkv * s->sq, s->sq, s->skv, 2 * s->d)) {
            p.fused.RM = d.fused.RM;
            p.fused.NS = d.fused.NS;
        } else {
            /* Over the Kᵀ copy: the scores' tile S[RM][NS] as src/fused_cpu.c builds it, so that on
             * AVX2 RM 6 with NS 1 to 4 is one kernel, timed once. */
            clattn__fit_fused_tile(ctx, s->d, &p.fused.RM, &p.fused.NS);
        }
    } else if (op == CLATTN_OPERATION_SCORES) {
        if (p.gemm.DIRECT == CLATTN_KERNEL_DIRECT) { /* direct: KT, RM and NS count */
            p.gemm.WGX = p.gemm.WGY = 1;
            p.gemm.TK = 16;
            p.gemm.VW = 16;
            p.gemm.KF = 1;
            /* K read in place (KT 0, or few rows whatever KT says): RM (up to 32 rows) and NS
             * unused, KT too for few rows; the defaults' values stay. */
            const uint64_t k_bytes = clattn__mul_sat((uint64_t)(s->b * s->hkv * s->d) * clattn_dtype_size(t->dt),
                                                     (uint64_t)s->skv); /* as src/scores.c */
            if (clattn__scores_in_place(ctx, p.v, s->sq, k_bytes)) {
                clattn_params with_kt = p;
                with_kt.gemm.KT = 1;
                if (clattn__scores_in_place(ctx, with_kt.v, s->sq, k_bytes))
                    p.gemm.KT = d.gemm.KT;
                if (s->sq <= 32)
                    p.gemm.RM = d.gemm.RM;
                p.gemm.NS = d.gemm.NS;
            }
        }
    } else if (op == CLATTN_OPERATION_PV) {
        if (p.gemm.DIRECT == CLATTN_KERNEL_DIRECT) { /* pv_direct: WGX, WGY, TK and VW unused (RM x NS:
                                                         fitted in tune()) */
            p.gemm.WGX = p.gemm.WGY = 1;
            p.gemm.TK = 16;
            p.gemm.VW = 16;
        }
    } else if (op == CLATTN_OPERATION_DECODE) {
        if (p.decode.DIRECT == CLATTN_KERNEL_DIRECT) { /* fused_direct: RM and SPLITS count */
            p.decode.WGX = p.decode.WGY = p.decode.NS = 1;
            p.decode.VW = 16;
        } else if (p.decode.DIRECT >= CLATTN_KERNEL_ROWS) {
            /* decode_rows, decode_lanes: KG, RM, KL or LANES, LC or KU, and SPLITS count */
            p.decode.WGX = 32;
            if (p.decode.DIRECT == CLATTN_KERNEL_LANES_LOCAL && !g_ptx_device)
                p.decode.DIRECT = CLATTN_KERNEL_LANES; /* the same kernel where there is no PTX */
        } else if (p.decode.NS > 4) { /* the tiled kernel: NS 8 to 32 are decode_rows values */
            p.decode.NS = 4;
        }
    }
    memcpy(values, p.v, (size_t)clattn_param_count(op) * sizeof *values);
}

/* A candidate as its kernel is built: the GEMMs' register tiles fitted to the vector registers
 * (src/scores.c), so that on AVX2 NS 1 to 4 with RM 6 are one kernel, timed once. */
static void as_built(clattn_operation op, const int *v, int *built)
{
    memcpy(built, v, CLATTN_MAX_KERNEL_PARAMS * sizeof *built);
    if (op == CLATTN_OPERATION_SCORES || op == CLATTN_OPERATION_PV)
        clattn__fit_gemm_tile(ctx, (clattn_op)op, built);
}

static size_t space_size(clattn_operation op)
{
    size_t n = 1;
    for (int i = 0; i < clattn_param_count(op); i++) {
        const int *vals;
        n *= (size_t)clattn__param_candidates((clattn_op)op, i, &vals);
    }
    return n;
}

static void nth_candidate(const task *t, size_t idx, int *v)
{
    const clattn_operation op = t->op;
    for (int i = 0; i < clattn_param_count(op); i++) {
        const int *vals;
        const int n = clattn__param_candidates((clattn_op)op, i, &vals);
        v[i] = vals[idx % (size_t)n];
        idx /= (size_t)n;
    }
    canonical(t, v);
}

/* A neighbour of `from`: one or two parameters moved to another candidate value. */
static void mutate(const task *t, const int *from, int *v)
{
    const clattn_operation op = t->op;
    const int np = clattn_param_count(op);
    memcpy(v, from, (size_t)np * sizeof *v);
    const int moves = 1 + (int)(rnd() % 2);
    for (int m = 0; m < moves; m++) {
        const int i = (int)(rnd() % (uint64_t)np);
        const int *vals;
        const int n = clattn__param_candidates((clattn_op)op, i, &vals);
        v[i] = vals[rnd() % (uint64_t)n];
    }
    canonical(t, v);
}

static const char *task_text(const task *t, char *buf, size_t size)
{
    const shape *s = &t->s;
    if (t->op == CLATTN_OPERATION_MERGE)
        snprintf(buf, size, "f32 B%lld H%lld Sq%lld d%lld, %d parts", s->b, s->h, s->sq, s->d, MERGE_PARTS);
    else
        snprintf(buf, size, "%s B%lld H%lld/%lld Sq%lld Skv%lld d%lld%s%s", clattn_dtype_name(t->dt), s->b, s->h,
                 s->hkv, s->sq, s->skv, s->d, s->causal ? " causal" : "", s->kvlen ? " kvlen" : "");
    if (t->unfused) {
        const size_t n = strlen(buf);
        snprintf(buf + n, size - n, " (unfused path)");
    }
    return buf;
}

/* The problem class whose bucket the library looks the task's parameters up in: the inputs'
 * dtype, as the library's calls name it (the unfused path's softmax runs on its f32 workspace, so
 * a softmax task of another dtype tunes clattn_softmax on such inputs). merge: the fixed bucket of
 * src/merge.c (f32, head_dim 0, no mask, seq_q 1, seq_kv 1), whatever the shape. */
static clattn_problem_class class_of(const task *t)
{
    const shape *s = &t->s;
    clattn_problem_class pc = {.operation = t->op, .dtype = t->dt, .head_dim = s->d, .seq_q = s->sq,
                               .seq_kv = s->skv, .causal = s->causal, .masked = s->kvlen};
    if (t->op == CLATTN_OPERATION_SOFTMAX)
        pc.head_dim = 0;
    if (t->op == CLATTN_OPERATION_MERGE) {
        pc.head_dim = 0;
        pc.seq_q = pc.seq_kv = 1;
        pc.causal = pc.masked = 0;
    }
    return pc;
}

static void progress(double done, double total, int ti, int nt, const char *what)
{
    if (!tty)
        return;
    const double f = total > 0 ? (done / total > 1 ? 1 : done / total) : 1;
    char bar[31];
    for (int i = 0; i < 30; i++)
        bar[i] = i < (int)(f * 30) ? '#' : '.';
    bar[30] = '\0';
    const double eta = total - done > 0 ? total - done : 0;
    fprintf(stderr, "\r[%s] %3.0f%%  task %d/%d %-12s ETA %dm%02ds ", bar, 100 * f, ti + 1, nt, what,
            (int)eta / 60, (int)eta % 60);
    fflush(stderr);
}

/* --verbose: one line per candidate on stderr, its values and what became of it. */
static void say_candidate(clattn_operation op, const int *v, int np, const char *fmt, ...)
{
    fprintf(stderr, "%-8s", clattn_operation_name(op));
    for (int i = 0; i < np; i++)
        fprintf(stderr, "%s%d", i ? "," : " ", v[i]);
    fprintf(stderr, "  ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

static void tune(task *t, double budget, double t_start, double total_budget, int ti, int nt)
{
    const shape *s = &t->s;
    const clattn_operation op = t->op;
    const int np = clattn_param_count(op);
    data dd;
    make_data(s, op, t->dt, &dd);
    t->timed_dt = dd.dt;
    /* Relative to a row's largest value: f32 arithmetic, then the output's rounding (2^-11 for
     * f16, 2^-8 for bf16). */
    const double tol = dd.out_dt == CLATTN_F16 ? 2e-3 : dd.out_dt == CLATTN_BF16 ? 2e-2 : 1e-4;

    /* Defaults: what the library picks with no user file (and no environment override). */
    clattn_set_params(ctx, op, NULL, 0);
    clattn_tuning_table *saved = ctx->user_tuning;
    ctx->user_tuning = NULL;
    const clattn_problem_class pc = class_of(t);
    clattn_kernel_params kp;
    /* What a call of this shape runs (clattn_get_call_params): on GPUs decode with 16 or more
     * rows per kv head runs the tiled kernel in place of the defaults' decode_lanes, and where
     * the device has matrix units the matrix kernel in place of the FMA kernels (which the
     * class alone does not say). Those are the defaults for this shape, as reported, as the
     * search skips them, and as written when nothing beats them. */
    const int attention = op == CLATTN_OPERATION_FUSED || op == CLATTN_OPERATION_DECODE;
    if ((attention ? clattn_get_call_params(ctx, &pc, t->s.h, t->s.hkv, t->s.d, &kp)
                   : clattn_get_params(ctx, &pc, &kp)) != CLATTN_SUCCESS)
        die("clattn_get_params: %s", clattn_last_error(ctx));
    memcpy(t->defaults, kp.values, sizeof t->defaults);
    /* Timed as the library runs them, chosen rather than set: a kernel the device allows fewer
     * work-items than the defaults ask for is then fitted to what it allows, as in any call
     * (candidates below are set, and such a one is pruned instead). */
    t->default_ms = time_op(s, op, &dd);
    const double derr = t->default_ms < 0 ? 0 : check_rows(s, op, &dd);
    ctx->user_tuning = saved;
    if (t->default_ms < 0)
        die("the defaults fail on %s %s: %s", clattn_dtype_name(t->dt), clattn_operation_name(op),
            clattn_last_error(ctx));
    if (derr > tol)
        die("the defaults give wrong results on %s %s (error %.3g)", clattn_dtype_name(t->dt),
            clattn_operation_name(op), derr);
    memcpy(t->best, t->defaults, sizeof t->best);
    t->best_ms = t->default_ms;

    const size_t space = space_size(op);
    const int exhaustive = space <= 96;
    /* The candidates as their kernels are built (as_built), the defaults first. */
    int seen[512][CLATTN_MAX_KERNEL_PARAMS];
    int nseen = 0;
    int defaults[CLATTN_MAX_KERNEL_PARAMS];
    memcpy(defaults, t->defaults, sizeof defaults);
    canonical(t, defaults);
    as_built(op, defaults, seen[nseen++]);
    const double t0 = now_s();
    for (size_t iter = 0;; iter++) {
        if (now_s() - t0 > budget || nseen == 512 || (exhaustive && iter >= space) ||
            (max_candidates >= 0 && t->tried >= max_candidates))
            break;
        int v[CLATTN_MAX_KERNEL_PARAMS] = {0};
        if (exhaustive)
            nth_candidate(t, iter, v);
        else if (rnd() % 3 == 0)
            nth_candidate(t, (size_t)(rnd() % space), v);
        else
            mutate(t, t->best, v);
        int built[CLATTN_MAX_KERNEL_PARAMS];
        as_built(op, v, built);
        int dup = 0;
        for (int i = 0; i < nseen && !dup; i++)
            dup = same(seen[i], built, np);
        if (dup)
            continue;
        memcpy(seen[nseen++], built, sizeof seen[0]);
        t->tried++;
        progress(now_s() - t_start, total_budget, ti, nt, clattn_operation_name(op));
        clattn_set_params(ctx, op, v, np);
        const int before = ctx->nprograms;
        /* One run first: a failure (build, launch limits) prunes the candidate. */
        if (run_once(s, op, &dd) != CLATTN_SUCCESS) {
            t->pruned++;
            if (verbose)
                say_candidate(op, v, np, "pruned: %s", clattn_last_error(ctx));
            continue;
        }
        const cl_ulong priv = verbose ? private_bytes(before) : 0;
        const double err = check_rows(s, op, &dd);
        if (err > tol) {
            t->rejected++;
            if (verbose)
                say_candidate(op, v, np, "wrong: error %.3g", err);
            continue;
        }
        const double ms = time_op(s, op, &dd);
        if (ms < 0) {
            t->pruned++;
            if (verbose)
                say_candidate(op, v, np, "pruned: %s", clattn_last_error(ctx));
            continue;
        }
        if (verbose)
            say_candidate(op, v, np, "%.4f ms, %llu bytes of private memory a work-item", ms,
                          (unsigned long long)priv);
        if (ms < t->best_ms) {
            /* Re-time before believing a win: these machines are noisy. */
            const double again = time_op(s, op, &dd);
            if (again > 0 && again < t->best_ms) {
                t->best_ms = ms > again ? ms : again;
                memcpy(t->best, v, sizeof t->best);
            }
        }
    }
    /* The defaults again, in the same conditions as the end of the search, and as before. */
    clattn_set_params(ctx, op, NULL, 0);
    ctx->user_tuning = NULL;
    const double d2 = time_op(s, op, &dd);
    ctx->user_tuning = saved;
    if (d2 > 0 && d2 < t->default_ms)
        t->default_ms = d2;
    t->best_is_default = t->best_ms >= t->default_ms;
    if (t->best_is_default) {
        memcpy(t->best, t->defaults, sizeof t->best);
        t->best_ms = t->default_ms;
    }
    clattn_set_params(ctx, op, NULL, 0);
    free_data(&dd);
}

/* The store entry of the task's bucket (class_of). head_dim 0 (softmax, merge) is written "*":
 * the store's head_dim field is 1..256 or "*". */
static clattn_tuning_entry entry_of(const task *t)
{
    const clattn_problem_class pc = class_of(t);
    clattn_tuning_entry e;
    memset(&e, 0, sizeof e);
    e.op = (clattn_op)t->op;
    e.dtype = (int)pc.dtype;
    e.head_dim = pc.head_dim > 0 ? (int)pc.head_dim : -1;
    e.mask_kind = clattn__mask_kind(pc.causal, pc.masked);
    e.sq_class = clattn__seq_q_class(pc.seq_q);
    e.log2_skv = clattn__log2_ceil(pc.seq_kv);
    e.n = clattn_param_count(t->op);
    memcpy(e.v, t->best, sizeof e.v);
    return e;
}

/* The items of the comma list p, each one of names[0..n-1] (n <= 32) and at most once, as their
 * indices in the list's order into idx[n]; returns how many, or -1 for an empty, unknown or
 * repeated item. */
static int name_list(const char *p, const char *const *names, int n, int *idx)
{
    int count = 0;
    unsigned seen = 0;
    for (;;) {
        const size_t len = strcspn(p, ",");
        int k = 0;
        while (k < n && (strlen(names[k]) != len || strncmp(p, names[k], len)))
            k++;
        if (k == n || (seen & (1u << k)))
            return -1;
        seen |= 1u << k;
        idx[count++] = k;
        if (!p[len])
            return count;
        p += len + 1;
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: clattn-tune [options]\n\n"
            "Tunes every kernel's parameters for one device and writes its user tuning file\n"
            "(CLATTN_TUNING_DIR, default <cache dir>/tuning), which the library then reads.\n\n"
            "  --device SPEC    device as clattn_create takes it (default: CLATTN_DEVICE / first GPU)\n"
            "  --shape B,H,HKV,SQ,SKV,D[,causal][,kvlen]\n"
            "                   a problem to tune for (repeatable, at most 16); default: a set per\n"
            "                   device type. Sizes 1..2147483647, HKV dividing H, D (head_dim and\n"
            "                   head_dim_v) at most %d.\n"
            "                   kvlen passes per-batch key lengths (kv_lengths, spread over the\n"
            "                   last quarter of SKV): the bucket of masked problems, which key\n"
            "                   lengths and additive masks share\n"
            "  --ops LIST       comma list of scores, softmax, pv, fused, decode, merge (default: all\n"
            "                   that apply: seq_q <= 16 tunes decode and merge, otherwise the\n"
            "                   others). merge (clattn_merge of %d f32 partials) has one bucket for\n"
            "                   all shapes: it is tuned once, on the first shape that has it\n"
            "  --dtype LIST     comma list of the inputs' storage types to tune for: f32, f16,\n"
            "                   bf16 (default f32). Each is a bucket of its own: the library\n"
            "                   looks f16 calls up in f16 entries only. Outputs have the inputs'\n"
            "                   type, but for scores (f32, as the unfused path's workspace).\n"
            "                   The unfused path's softmax runs on f32 scores without a mask:\n"
            "                   for a softmax task of f16, bf16, causal or kvlen, that f32 task\n"
            "                   of the same sizes is added unless a task has its bucket\n"
            "  --budget SEC     total search time in decimal seconds (default 300, more than 0, at most %d),\n"
            "                   shared between tasks\n"
            "  --iters N        timed runs per candidate (default 5, 1..64), median\n"
            "  --candidates N   at most N candidates a task besides the defaults, 0..100000\n"
            "                   (default: what the budget allows; 0 times the defaults alone)\n"
            "  --dir DIR        tuning directory (sets CLATTN_TUNING_DIR). An existing store there\n"
            "                   that the library does not read (corrupt, another device's) is not\n"
            "                   replaced: the run stops and says why\n"
            "  --dry-run        search and report, write nothing\n"
            "  --json           print a JSON report on stdout\n"
            "  --verbose        one line per candidate on stderr: its values and its time, or why\n"
            "                   it was dropped\n"
            "  --seed N         random search seed\n"
            "  --help           this text\n\n"
            "Options other than --shape are given at most once.\n"
            "Exit status: 0 ok; 1 bad usage, a device spec that resolves to nothing, a store that\n"
            "cannot be written or would be replaced unread, a CLATTN_PARAMS_<OP> set, CLATTN_MATRIX\n"
            "=emulate without --dry-run, or a failed tuning run.\n",
            CLATTN_MAX_HEAD_DIM_V, MERGE_PARTS, MAX_BUDGET_S);
}


/* Whether a is option name, which takes a value: the next argument (val), or a message and exit 1
 * when there is none, or when an option other than --shape comes a second time (the last one
 * would win without a word: "--device gpu --device cpu" ran on the CPU). */
static int valued_option(const char *a, const char *name, const char *val)
{
    static const char *given[16];
    static int n_given;
    if (strcmp(a, name) != 0)
        return 0;
    if (!val) {
        fprintf(stderr, "clattn-tune: %s needs a value\n", a);
        usage(stderr);
        exit(1);
    }
    if (strcmp(name, "--shape") != 0) {
        for (int k = 0; k < n_given; k++)
            if (strcmp(given[k], name) == 0)
                die("%s is given twice (it takes one value; --shape is the option to repeat)", name);
        if (n_given < 16)
            given[n_given++] = name;
    }
    return 1;
}
int main(int argc, char **argv)
{
    const char *device = NULL;
    unsigned ops = 0; /* --ops: bit op set per operation; 0: the default choice */
    double budget = 300;
    int json = 0, dry = 0;
    shape shapes[16];
    int nshapes = 0;
    clattn_dtype dtypes[3] = {CLATTN_F32};
    int ndtypes = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--verbose")) {
            verbose = 1;
        } else if (!strcmp(a, "--dry-run")) {
            dry = 1;
        } else if (valued_option(a, "--device", val)) {
            device = argv[++i];
            if (!*device)
                die("bad --device '' (an empty spec: leave --device out for the default device)");
        } else if (valued_option(a, "--ops", val)) {
            const char *names[CLATTN_OPERATION_COUNT];
            for (int k = 0; k < CLATTN_OPERATION_COUNT; k++)
                names[k] = clattn_operation_name((clattn_operation)k);
            int idx[CLATTN_OPERATION_COUNT];
            const int n = name_list(argv[++i], names, CLATTN_OPERATION_COUNT, idx);
            if (n < 0)
                die("bad --ops %s (a comma list of scores, softmax, pv, fused, decode, merge, each once)",
                    argv[i]);
            ops = 0;
            for (int k = 0; k < n; k++)
                ops |= 1u << idx[k];
        } else if (valued_option(a, "--dtype", val)) {
            const char *const names[3] = {clattn_dtype_name(CLATTN_F32), clattn_dtype_name(CLATTN_F16),
                                          clattn_dtype_name(CLATTN_BF16)};
            int idx[3];
            ndtypes = name_list(argv[++i], names, 3, idx);
            if (ndtypes < 0)
                die("bad --dtype %s (a comma list of f32, f16, bf16, each once)", argv[i]);
            for (int k = 0; k < ndtypes; k++)
                dtypes[k] = (clattn_dtype)idx[k];
        } else if (valued_option(a, "--budget", val)) {
            const char *v = argv[++i];
            char *end = NULL;
            errno = 0;
            budget = strtod(v, &end);
            /* Plain decimal seconds: strtod would take blanks, signs, "inf", "nan", hexadecimal
             * ("0x10") and exponents ("1e3") too. */
            if (!*v || strspn(v, "0123456789.") != strlen(v) || *end || errno == ERANGE ||
                !(budget > 0 && budget <= MAX_BUDGET_S))
                die("bad --budget %s (seconds, more than 0 and at most %d)", v, MAX_BUDGET_S);
        } else if (valued_option(a, "--iters", val)) {
            iters = (int)int_arg(a, argv[++i], 1, 64);
        } else if (valued_option(a, "--candidates", val)) {
            max_candidates = (int)int_arg(a, argv[++i], 0, 100000);
        } else if (valued_option(a, "--seed", val)) {
            const char *v = argv[++i];
            char *end = NULL;
            errno = 0;
            const unsigned long long n = strtoull(v, &end, 10);
            if (*v < '0' || *v > '9' || *end || errno == ERANGE)
                die("bad --seed %s (an integer 0..%llu)", v, (unsigned long long)UINT64_MAX);
            rng_state = (uint64_t)n;
        } else if (valued_option(a, "--dir", val)) {
            if (!*val) /* the library takes an empty CLATTN_TUNING_DIR as unset */
                die("bad --dir '' (an empty path: leave --dir out for the default directory)");
            if (setenv("CLATTN_TUNING_DIR", argv[++i], 1) != 0)
                die("setenv failed");
        } else if (valued_option(a, "--shape", val)) {
            shape s = {0, 0, 0, 0, 0, 0, 0, 0};
            int bad = 0;
            const char *flags = shape_sizes(argv[++i], &s, &bad);
            /* then ",causal" and ",kvlen", each at most once, in any order */
            int flags_ok = 1;
            if (flags && *flags) {
                static const char *const names[2] = {"causal", "kvlen"};
                int idx[2];
                const int nf = *flags == ',' ? name_list(flags + 1, names, 2, idx) : -1;
                flags_ok = nf > 0;
                for (int k = 0; k < nf; k++)
                    *(idx[k] ? &s.kvlen : &s.causal) = 1;
            }
            /* The first fault, named: one message for every fault left the user guessing. */
            char why[160] = "";
            const long long sizes[6] = {s.b, s.h, s.hkv, s.sq, s.skv, s.d};
            if (!flags && bad == 6)
                snprintf(why, sizeof why, "fewer than six sizes");
            else if (!flags)
                snprintf(why, sizeof why, "%s is not an integer 1..2147483647", shape_fields[bad]);
            else if (!flags_ok)
                snprintf(why, sizeof why, "after D come only the flags causal and kvlen, each at most once");
            for (int k = 0; k < 6 && flags && flags_ok && !why[0]; k++)
                if (sizes[k] < 1)
                    snprintf(why, sizeof why, "%s is not an integer 1..2147483647", shape_fields[k]);
            if (!why[0] && s.h % s.hkv)
                snprintf(why, sizeof why, "HKV %lld does not divide H %lld", s.hkv, s.h);
            else if (!why[0] && s.d > CLATTN_MAX_HEAD_DIM_V)
                snprintf(why, sizeof why, "D %lld is more than %d: D is head_dim and head_dim_v here, and "
                         "head_dim_v stops at %d", s.d, CLATTN_MAX_HEAD_DIM_V, CLATTN_MAX_HEAD_DIM_V);
            else if (!why[0] && s.causal && s.sq > s.skv)
                snprintf(why, sizeof why, "causal with SQ %lld > SKV %lld", s.sq, s.skv);
            if (why[0])
                die("bad --shape %s: %s (B,H,HKV,SQ,SKV,D[,causal][,kvlen], each size 1..2147483647, HKV "
                    "dividing H, D <= %d)", argv[i], why, CLATTN_MAX_HEAD_DIM_V);
            if (shape_elements(&s) > MAX_SHAPE_ELEMENTS)
                die("bad --shape %s (a buffer of more than %.4g elements, the most this host's sizes hold)",
                    argv[i], MAX_SHAPE_ELEMENTS);
            if (nshapes == 16)
                die("at most 16 --shape");
            shapes[nshapes++] = s;
        } else {
            /* The problem first, where a terminal shows it, then the usage. */
            fprintf(stderr, "clattn-tune: unknown option '%s'\n", a);
            usage(stderr);
            exit(1);
        }
    }
    /* The tuner times the library's own choice as the defaults and writes the winners: a
     * CLATTN_PARAMS_<OP> list would be timed, labelled and stored as the defaults. */
    for (int op = 0; op < CLATTN_OPERATION_COUNT; op++) {
        char name[40];
        snprintf(name, sizeof name, "CLATTN_PARAMS_%s", clattn_operation_name((clattn_operation)op));
        for (char *c = name + 14; *c; c++)
            *c = (char)toupper((unsigned char)*c);
        const char *env = getenv(name);
        if (env && *env)
            die("%s is set: the tuner would time it as the library's defaults and could store it; "
                "unset it to tune", name);
    }
    clattn_status st = clattn_create(device, &ctx);
    if (st != CLATTN_SUCCESS)
        die("%s", clattn_last_error(NULL));
    /* The emulated matrix kernel is for tests, never for speed: its timings must not become the
     * device's store (a kernel=mma entry that the device then cannot run). */
    if (ctx->matrix_mode == CLATTN_MATRIX_EMULATE && !dry)
        die("CLATTN_MATRIX=%s runs the emulated matrix kernel, which is never chosen for speed: a store "
            "tuned under it would be wrong for the device; unset it, or use --dry-run",
            getenv("CLATTN_MATRIX") ? getenv("CLATTN_MATRIX") : "emulate");
    queue = clattn_queue(ctx);
    tty = isatty(2);
    const int cpu = (ctx->dev.type & CL_DEVICE_TYPE_CPU) != 0;
    g_ptx_device = (ctx->dev.type & CL_DEVICE_TYPE_GPU) && ctx->dev.vendor_id == 0x10de;
    if (nshapes == 0) {
        const shape cpu_set[3] = {{1, 8, 8, 1024, 1024, 64, 0, 0}, {1, 8, 8, 1024, 1024, 64, 1, 0},
                                  {1, 8, 8, 1, 16384, 64, 0, 0}};
        const shape gpu_set[3] = {{4, 16, 16, 4096, 4096, 64, 0, 0}, {4, 16, 16, 4096, 4096, 64, 1, 0},
                                  {16, 32, 32, 1, 8192, 128, 0, 0}};
        for (int i = 0; i < 3; i++)
            shapes[nshapes++] = cpu ? cpu_set[i] : gpu_set[i];
    }
    task tasks[16 * 3 * 5 + 1]; /* full shapes: 4 ops each per dtype and an unfused softmax, one merge */
    int nt = 0;
    int have_merge = 0;
    for (int i = 0; i < nshapes; i++) {
        const clattn_operation decode_ops[2] = {CLATTN_OPERATION_DECODE, CLATTN_OPERATION_MERGE};
        const clattn_operation full_ops[5] = {CLATTN_OPERATION_FUSED, CLATTN_OPERATION_SCORES,
                                              CLATTN_OPERATION_SOFTMAX, CLATTN_OPERATION_PV,
                                              CLATTN_OPERATION_MERGE};
        const int decode = shapes[i].sq <= 16;
        for (int di = 0; di < ndtypes; di++)
            for (int j = 0; j < (decode ? 2 : 5); j++) {
                const clattn_operation op = decode ? decode_ops[j] : full_ops[j];
                if (ops && !(ops & (1u << op)))
                    continue;
                if (op == CLATTN_OPERATION_MERGE) {
                    /* By default with decode only; one task per run (the bucket ignores the shape
                     * and the dtype: partials are f32). */
                    if ((!decode && !ops) || have_merge)
                        continue;
                    have_merge = 1;
                }
                memset(&tasks[nt], 0, sizeof tasks[nt]);
                tasks[nt].s = shapes[i];
                tasks[nt].op = op;
                tasks[nt].dt = op == CLATTN_OPERATION_MERGE ? CLATTN_F32 : dtypes[di];
                nt++;
            }
    }
    /* The unfused path runs its softmax on f32 scores with the masks already applied, so a
     * softmax task of another dtype, causal or with key lengths (which tunes clattn_softmax on
     * such inputs) leaves its bucket untuned: the f32 task without a mask of the same sizes is
     * added, unless a task has that bucket already. */
    for (int i = 0, n = nt; i < n; i++) {
        if (tasks[i].op != CLATTN_OPERATION_SOFTMAX ||
            (tasks[i].dt == CLATTN_F32 && !tasks[i].s.causal && !tasks[i].s.kvlen))
            continue;
        task u = tasks[i];
        u.dt = CLATTN_F32;
        u.s.causal = u.s.kvlen = 0;
        u.unfused = 1;
        const clattn_tuning_entry ue = entry_of(&u);
        int have = 0;
        for (int k = 0; k < nt && !have; k++) {
            const clattn_tuning_entry e = entry_of(&tasks[k]);
            have = clattn__tuning_same_bucket(&e, &ue);
        }
        if (!have)
            tasks[nt++] = u;
    }
    /* An op named in --ops that no shape takes would be left out without a word. */
    for (int op = 0; op < CLATTN_OPERATION_COUNT; op++) {
        int have = !(ops & (1u << op));
        for (int k = 0; k < nt && !have; k++)
            have = tasks[k].op == (clattn_operation)op;
        if (!have)
            die("--ops names %s, which no --shape takes: decode tunes shapes of SQ <= 16; scores, softmax, "
                "pv and fused tune SQ > 16; merge any", clattn_operation_name((clattn_operation)op));
    }
    if (nt == 0)
        die("nothing to tune (check --ops)");
    char path[4200];
    if (clattn_tuning_path(ctx, path, sizeof path) != CLATTN_SUCCESS)
        die("%s", clattn_last_error(ctx));
    if (!dry)
        check_tuning_dir(ctx->tuning_dir);
    /* A store that is there but that the library does not read (corrupt, another device's, not
     * trusted) would be replaced by this run's entries alone, dropping what it holds. */
    if (ctx->user_tuning_ignored[0] && !dry)
        die("%s. clattn-tune would replace it with this run's entries, dropping what it holds: fix it, "
            "or move it away and run again", ctx->user_tuning_ignored);
    if (ctx->user_tuning_ignored[0])
        fprintf(stderr, "clattn-tune: note: %s (a run without --dry-run refuses to replace it)\n",
                ctx->user_tuning_ignored);
    fprintf(stderr, "clattn-tune: %s, %d task(s), budget %.0f s, store %s\n", ctx->dev.name, nt, budget,
            path);
    const double t_start = now_s();
    for (int i = 0; i < nt; i++) {
        const double left = budget - (now_s() - t_start);
        tune(&tasks[i], left > 0 ? left / (nt - i) : 0.1, t_start, budget, i, nt);
    }
    if (tty)
        fprintf(stderr, "\n");

    /* Report: tuned vs default per bucket. */
    for (int i = 0; i < nt; i++) {
        const task *t = &tasks[i];
        char sh[128];
        clattn_tuning_entry e = entry_of(t);
        char line[200];
        clattn__tuning_entry_text(&e, line, sizeof line);
        if (no_entry(t))
            snprintf(line, sizeof line, "no entry: the defaults won, and they depend on the query rows per kv head");
        fprintf(stderr, "%-8s %-44s default %8.3f ms  tuned %8.3f ms  x%.2f  (%d tried, %d pruned, %d wrong)\n  %s\n",
                clattn_operation_name(t->op), task_text(t, sh, sizeof sh), t->default_ms, t->best_ms,
                t->default_ms / t->best_ms, t->tried, t->pruned, t->rejected, line);
    }
    int written = 0;
    if (!dry) {
        if (clattn__make_dirs(ctx->tuning_dir) != 0)
            die("cannot create the tuning directory for %s", path);
        clattn_tuning_table tab;
        memset(&tab, 0, sizeof tab);
        /* The store's other entries are kept, unless they were tuned under another driver:
         * stamped with this one they would pass as re-checked. */
        if (ctx->user_tuning && !ctx->user_tuning->device_is_pattern && ctx->user_driver_changed) {
            fprintf(stderr, "dropping the %d earlier entries of %s: tuned under driver \"%s\", not \"%s\" "
                    "(re-run clattn-tune for their operations)\n", ctx->user_tuning->n, path,
                    ctx->user_tuning->driver[0] ? ctx->user_tuning->driver : "(no tag)", ctx->dev.driver);
        } else if (ctx->user_tuning && !ctx->user_tuning->device_is_pattern) {
            for (int i = 0; i < ctx->user_tuning->n; i++) {
                const clattn_tuning_entry *old = &ctx->user_tuning->e[i];
                int dropped = 0; /* the bucket of a decode task whose defaults won */
                for (int k = 0; k < nt && !dropped; k++) {
                    const clattn_tuning_entry e = entry_of(&tasks[k]);
                    dropped = no_entry(&tasks[k]) && clattn__tuning_same_bucket(old, &e);
                }
                if (dropped)
                    fprintf(stderr, "dropping the earlier decode entry of the bucket whose defaults won\n");
                else if (clattn__tuning_put(&tab, old) != 0)
                    die("out of host memory");
            }
        }
        snprintf(tab.device, sizeof tab.device, "%s", ctx->dev.key);
        snprintf(tab.driver, sizeof tab.driver, "%s", ctx->dev.driver);
        for (int i = 0; i < nt; i++) {
            clattn_tuning_entry e = entry_of(&tasks[i]);
            if (!no_entry(&tasks[i]) && clattn__tuning_put(&tab, &e) != 0)
                die("out of host memory");
        }
        char err[512];
        if (clattn__tuning_write(path, &tab, err, sizeof err) != 0)
            die("%s", err);
        clattn__tuning_free(&tab);
        written = 1;
        fprintf(stderr, "wrote %s\n", path);
    }
    if (json) {
        /* Every string through json_string: the path and the device name may hold anything. */
        printf("{\"device\": ");
        json_string(stdout, ctx->dev.name);
        printf(", \"store\": ");
        json_string(stdout, path);
        printf(", \"written\": %s, \"budget_s\": %.1f, \"tasks\": [", written ? "true" : "false", budget);
        for (int i = 0; i < nt; i++) {
            const task *t = &tasks[i];
            const int merge = t->op == CLATTN_OPERATION_MERGE; /* no mask, whatever the shape */
            printf("%s\n  {\"op\": ", i ? "," : "");
            json_string(stdout, clattn_operation_name(t->op));
            printf(", \"dtype\": ");
            json_string(stdout, clattn_dtype_name(t->timed_dt));
            printf(", \"shape\": [%lld, %lld, %lld, %lld, %lld, %lld], \"causal\": %d, \"kv_lengths\": %d, "
                   "\"default_ms\": %.4f, \"tuned_ms\": %.4f, \"speedup\": %.3f, \"tried\": %d, \"pruned\": %d, "
                   "\"wrong\": %d, ",
                   t->s.b, t->s.h, t->s.hkv, t->s.sq, t->s.skv, t->s.d, merge ? 0 : t->s.causal,
                   merge ? 0 : t->s.kvlen, t->default_ms, t->best_ms, t->default_ms / t->best_ms, t->tried, t->pruned,
                   t->rejected);
            if (t->op == CLATTN_OPERATION_MERGE)
                printf("\"parts\": %d, ", MERGE_PARTS);
            if (t->op == CLATTN_OPERATION_SOFTMAX) /* added for the unfused path's bucket */
                printf("\"unfused_path\": %s, ", t->unfused ? "true" : "false");
            printf("\"entry\": %s, \"params\": [", no_entry(t) ? "false" : "true");
            for (int j = 0; j < clattn_param_count(t->op); j++)
                printf("%s%d", j ? ", " : "", t->best[j]);
            printf("]}");
        }
        printf("\n]}\n");
    }
    clattn_release(ctx);
    return 0;
}
