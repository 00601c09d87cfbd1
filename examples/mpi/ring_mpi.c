/*
 * Ring attention across MPI ranks (issue 75; docs/ring.md).
 *
 * One causal or full self-attention of N tokens, B batches, Hq query heads over Hkv key/value
 * heads (GQA), head_dim D, split over P ranks by sequence. The sequence is cut into 2P chunks of
 * c = N / 2P tokens and rank r owns chunks r and 2P-1-r of Q, K and V (the zig-zag assignment):
 * under a causal mask every rank then has the same number of visible (query, key) pairs at every
 * ring step, so none idles on the masked half. Local row layout on rank r, per (batch, head):
 * rows [0, c) are global positions [r·c, r·c + c), rows [c, 2c) are [(2P-1-r)·c, (2P-r)·c).
 *
 * Ring: at step s (0 <= s < P) rank r holds the K/V chunks of rank o = (r - s) mod P. It computes
 * its two query chunks against those two key chunks (a clattn_attention call per pair that any
 * row sees, q_offset / k_offset set to the chunks' global starts, f32 parts with their LSE), while
 * MPI_Isend / MPI_Irecv pass the block it holds to rank r + 1 and take the next one from rank
 * r - 1. Blocks are staged on the host, double-buffered: the
 * block received at step s is forwarded unchanged at step s + 1 (no device-to-host copy) and
 * written to the device on a second queue as soon as it arrives, so that copy overlaps the
 * compute too. After P steps each query chunk's parts (2P, or under a causal mask r + 1 and
 * 2P - r) are merged exactly with clattn_merge.
 *
 * Every iteration runs three passes with barriers between them: compute only (the P steps'
 * attention calls, no messages), transfer only (the P - 1 block exchanges and device writes, no
 * attention) and the ring itself (both at once). Over the P - 1 steps that move a block:
 *     overlap = 1 - (W - C) / T
 * W the ring's wall time, C the compute-only time, T the transfer-only time: the fraction of the
 * transfer hidden behind compute (1: wholly hidden, 0: the steps took compute + transfer). Where
 * C >> T the noise of C swamps that difference, so the ring also times each step's two sides:
 *     hidden = 1 - exposed / T_ring
 * exposed: how long after the compute the block was on the device (0 if before), T_ring: the
 * transfer's own time inside the ring (docs/ring.md).
 *
 * Check: every rank sends its merged output to rank 0, which computes the whole attention on its
 * own device in one clattn call (no offsets, no merge) and, when small enough, the float64
 * reference, from the same inputs: every element comes from a counter-based generator of
 * (tensor, batch, head, global position, dim), so any rank can make any chunk.
 */
#define _POSIX_C_SOURCE 200809L
#include <clattn.h>
#include <mpi.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef RING_MPI_REF
#include "clattn_ref.h"
#endif

/* Sanitized builds (CLATTN_SANITIZE): PoCL's LLVM gives each thread that builds a program an
 * alternate signal stack, which ASan then unmaps as its own when the thread ends; the tests turn
 * ASan's use of alternate stacks off for that reason (tests/testutil.c), and so does this program.
 * ASAN_OPTIONS still overrides it. */
#if defined(__SANITIZE_ADDRESS__)
#define RING_MPI_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RING_MPI_ASAN 1
#endif
#endif
#ifdef RING_MPI_ASAN
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "use_sigaltstack=0";
}
#endif

typedef struct options {
    long long seq, batch, heads, kv_heads, dim;
    int causal;
    clattn_dtype dtype;
    int iters;
    int ref; /* -1 auto (when small), 0 off, 1 on */
    int fault;
    unsigned long long seed;
    char device[256];
} options;

static int g_rank;

/* A failure after start-up: say where and take every rank down (mpirun then exits nonzero). */
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ring_mpi: rank %d: ", g_rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}

#define CL_CHECK(call)                                                                   \
    do {                                                                                 \
        const cl_int e_ = (call);                                                        \
        if (e_ != CL_SUCCESS)                                                            \
            die("%s failed: OpenCL error %d (%s:%d)", #call, (int)e_, __FILE__, __LINE__); \
    } while (0)

#define CLATTN_CHECK(ctx, call)                                                             \
    do {                                                                                    \
        const clattn_status s_ = (call);                                                    \
        if (s_ != CLATTN_SUCCESS)                                                           \
            die("%s: %s: %s", #call, clattn_status_name(s_), clattn_last_error(ctx));       \
    } while (0)

#define MPI_CHECK(call)                                      \
    do {                                                     \
        const int e_ = (call);                               \
        if (e_ != MPI_SUCCESS)                               \
            die("%s failed: MPI error %d", #call, e_);       \
    } while (0)

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of host memory (%zu bytes)", n);
    return p;
}

/* ---- inputs -------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Element (b, h, pos, d) of tensor t (0 q, 1 k, 2 v): uniform in [-1, 1) with 24 random bits, a
 * function of its global coordinates only. */
static float gen_value(const options *o, int t, long long b, long long h, long long pos, long long d)
{
    const long long heads = t == 0 ? o->heads : o->kv_heads;
    const uint64_t idx = (((uint64_t)b * (uint64_t)heads + (uint64_t)h) * (uint64_t)o->seq + (uint64_t)pos) *
                             (uint64_t)o->dim + (uint64_t)d;
    const uint64_t x = mix64(o->seed + 0x9e3779b97f4a7c15ULL * ((uint64_t)t + 1) + mix64(idx));
    return (float)((double)(x >> 40) * 0x1p-23 - 1.0);
}

/* binary16, round to nearest even */
static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* 65520 and above round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal (or 0), in units of 2^-24 */
        float a;
        memcpy(&a, &ax, sizeof a);
        return (uint16_t)(sign | (uint16_t)lrintf(a * 0x1p24f));
    }
    uint32_t h = ((((ax >> 23) - 127u + 15u) << 10) | ((ax & 0x7fffffu) >> 13));
    const uint32_t rest = ax & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right result */
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0)
        v = ldexpf((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000u) ? -v : v;
}

static void store(clattn_dtype dt, void *dst, size_t i, float x)
{
    if (dt == CLATTN_F16)
        ((uint16_t *)dst)[i] = f32_to_f16(x);
    else
        ((float *)dst)[i] = x;
}

static float load(clattn_dtype dt, const void *src, size_t i)
{
    return dt == CLATTN_F16 ? f16_to_f32(((const uint16_t *)src)[i]) : ((const float *)src)[i];
}

/* Rows [row0, row0 + count) of dst, a [B][heads][extent][D] array of o->dtype, get tensor t's
 * global positions [pos0, pos0 + count). */
static void fill_rows(const options *o, int t, void *dst, long long extent, long long row0, long long pos0,
                      long long count)
{
    const long long heads = t == 0 ? o->heads : o->kv_heads, D = o->dim;
    for (long long b = 0; b < o->batch; b++)
        for (long long h = 0; h < heads; h++)
            for (long long i = 0; i < count; i++) {
                const size_t base = (size_t)(((b * heads + h) * extent + row0 + i) * D);
                for (long long d = 0; d < D; d++)
                    store(o->dtype, dst, base + (size_t)d, gen_value(o, t, b, h, pos0 + i, d));
            }
}

/* ---- command line ------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np P ring_mpi [options]\n"
            "  --seq N          tokens of the whole sequence, a multiple of 2P (default 1024)\n"
            "  --batch B        batches (default 1)\n"
            "  --heads H        query heads (default 8)\n"
            "  --kv-heads H     key/value heads, dividing --heads (default: --heads)\n"
            "  --dim D          head_dim, 1..256 (default 64)\n"
            "  --causal | --no-causal   (default causal)\n"
            "  --dtype f32|f16  storage of Q, K, V and the output; parts stay f32 (default f32)\n"
            "  --iters I        timed iterations after one warm-up (default 3)\n"
            "  --ref auto|on|off  also check against the float64 reference on rank 0 (auto: when\n"
            "                   B*Hq*N*N*D <= 2^28)\n"
            "  --device SPEC    clattn_create's spec; %%l becomes the rank's index on its node\n"
            "                   (--device 0:%%l: one GPU per rank). Default: CLATTN_DEVICE, else the\n"
            "                   first GPU, else the first device\n"
            "  --seed S         input generator seed (default 1)\n"
            "  --fault          perturb one K value of the block rank 0 receives: the check must fail\n");
}

static int parse_ll(const char *s, long long lo, long long hi, long long *out)
{
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    const long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* 0 on success; otherwise a message in msg (the caller prints it once) */
static int parse_args(int argc, char **argv, int P, options *o, char *msg, size_t msg_size)
{
    memset(o, 0, sizeof *o);
    o->seq = 1024;
    o->batch = 1;
    o->heads = 8;
    o->kv_heads = 0;
    o->dim = 64;
    o->causal = 1;
    o->dtype = CLATTN_F32;
    o->iters = 3;
    o->ref = -1;
    o->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            snprintf(msg, msg_size, "help");
            return 1;
        } else if (!strcmp(a, "--causal")) {
            o->causal = 1;
        } else if (!strcmp(a, "--no-causal")) {
            o->causal = 0;
        } else if (!strcmp(a, "--fault")) {
            o->fault = 1;
        } else if (!v) {
            snprintf(msg, msg_size, "unknown option or missing value: %s", a);
            return 1;
        } else if (!strcmp(a, "--seq") || !strcmp(a, "--batch") || !strcmp(a, "--heads") ||
                   !strcmp(a, "--kv-heads") || !strcmp(a, "--dim") || !strcmp(a, "--iters")) {
            const long long hi = !strcmp(a, "--dim") ? 256 : !strcmp(a, "--iters") ? 100000 : INT_MAX;
            if (!parse_ll(v, 1, hi, &x)) {
                snprintf(msg, msg_size, "%s takes an integer from 1 to %lld, not '%s'", a, hi, v);
                return 1;
            }
            if (!strcmp(a, "--seq"))
                o->seq = x;
            else if (!strcmp(a, "--batch"))
                o->batch = x;
            else if (!strcmp(a, "--heads"))
                o->heads = x;
            else if (!strcmp(a, "--kv-heads"))
                o->kv_heads = x;
            else if (!strcmp(a, "--dim"))
                o->dim = x;
            else
                o->iters = (int)x;
            i++;
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "f32"))
                o->dtype = CLATTN_F32;
            else if (!strcmp(v, "f16"))
                o->dtype = CLATTN_F16;
            else {
                snprintf(msg, msg_size, "--dtype takes f32 or f16, not '%s'", v);
                return 1;
            }
            i++;
        } else if (!strcmp(a, "--ref")) {
            if (!strcmp(v, "auto"))
                o->ref = -1;
            else if (!strcmp(v, "on"))
                o->ref = 1;
            else if (!strcmp(v, "off"))
                o->ref = 0;
            else {
                snprintf(msg, msg_size, "--ref takes auto, on or off, not '%s'", v);
                return 1;
            }
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (!parse_ll(v, 0, LLONG_MAX, &x)) {
                snprintf(msg, msg_size, "--seed takes a nonnegative integer, not '%s'", v);
                return 1;
            }
            o->seed = (unsigned long long)x;
            i++;
        } else if (!strcmp(a, "--device")) {
            if (strlen(v) >= sizeof o->device - 16) {
                snprintf(msg, msg_size, "--device: spec too long");
                return 1;
            }
            snprintf(o->device, sizeof o->device, "%s", v);
            i++;
        } else {
            snprintf(msg, msg_size, "unknown option: %s", a);
            return 1;
        }
    }
    if (!o->kv_heads)
        o->kv_heads = o->heads;
    if (o->heads % o->kv_heads) {
        snprintf(msg, msg_size, "--kv-heads %lld does not divide --heads %lld", o->kv_heads, o->heads);
        return 1;
    }
    if (o->seq % (2LL * P)) {
        snprintf(msg, msg_size, "--seq %lld is not a multiple of 2P = %d (2 chunks per rank)", o->seq, 2 * P);
        return 1;
    }
    /* sizes the program indexes with size_t and sends with int counts */
    const double q_elems = (double)o->batch * (double)o->heads * (double)o->seq * (double)o->dim;
    const double block_bytes = 2.0 * (double)o->batch * (double)o->kv_heads * (double)(o->seq / P) *
                               (double)o->dim * (double)clattn_dtype_size(o->dtype);
    if (q_elems / P > (double)INT_MAX || block_bytes > (double)INT_MAX || q_elems * 4.0 > 0x1p62) {
        snprintf(msg, msg_size, "problem too large for this example (a rank's K/V block of %.0f bytes, "
                 "its output of %.0f floats: each must fit an int)", block_bytes, q_elems / P);
        return 1;
    }
    return 0;
}

/* ---- the ring ------------------------------------------------------------------------------ */

typedef struct ring {
    const options *o;
    int rank, P;
    long long c;             /* tokens per chunk */
    size_t nq, nkv;          /* elements of the local Q (and output) and of the local K (V) */
    size_t part_n, part_l;   /* elements of one part's output and LSE */
    size_t es;               /* bytes per element of the inputs */
    clattn_context *ctx;
    cl_command_queue queue;  /* the context's: attention and merge */
    cl_command_queue copyq;  /* the host-to-device writes of arriving blocks */
    cl_mem q, kv[2], parts, plse, out;
    void *own_kv, *host_kv[2]; /* K then V: [B][Hkv][2c][D] each */
} ring;

static long long chunk_start(const ring *R, int owner, int local_chunk)
{
    return (local_chunk == 0 ? owner : 2 * R->P - 1 - owner) * R->c;
}

/* Whether any row of query chunk qc sees a key of chunk kc of rank origin's block. A causal pair
 * wholly above the diagonal is neither computed nor merged (the library would only write rows of
 * 0 with LSE -inf for it, which the merge skips): with the zig-zag chunks that is half the pairs
 * of every step but the first. */
static int pair_visible(const ring *R, int qc, int origin, int kc)
{
    return !R->o->causal || chunk_start(R, origin, kc) <= chunk_start(R, R->rank, qc) + R->c - 1;
}

/* Step s: the two query chunks against the K/V chunks of rank (rank - s) mod P in kv[slot]; the
 * parts go to slots 2s and 2s + 1 of each query chunk. */
static void enqueue_step(ring *R, int s, int slot, cl_uint nwait, const cl_event *wait)
{
    const options *o = R->o;
    const long long B = o->batch, Hq = o->heads, Hkv = o->kv_heads, D = o->dim, c = R->c, P = R->P;
    const int origin = (int)((R->rank - s + P) % P);
    for (int qc = 0; qc < 2; qc++)
        for (int kc = 0; kc < 2; kc++) {
            if (!pair_visible(R, qc, origin, kc))
                continue;
            const size_t part = (size_t)qc * 2 * (size_t)P + 2 * (size_t)s + (size_t)kc;
            const clattn_tensor q = {R->q, o->dtype, qc * c * D, {B, Hq, c, D}, {Hq * 2 * c * D, 2 * c * D, D}};
            const clattn_tensor k = {R->kv[slot], o->dtype, kc * c * D, {B, Hkv, c, D}, {Hkv * 2 * c * D, 2 * c * D, D}};
            clattn_tensor v = k;
            v.offset += (int64_t)R->nkv;
            const clattn_tensor out = {R->parts, CLATTN_F32, (int64_t)(part * R->part_n), {B, Hq, c, D},
                                       {Hq * c * D, c * D, D}};
            const clattn_tensor lse = {R->plse, CLATTN_F32, (int64_t)(part * R->part_l), {B, Hq, c, 1},
                                       {Hq * c, c, 1}};
            clattn_attention_desc d = {0};
            d.batch = B;
            d.heads_q = Hq;
            d.heads_kv = Hkv;
            d.seq_q = c;
            d.seq_kv = c;
            d.head_dim = D;
            d.causal = o->causal;
            d.lse = &lse;
            /* equal blocks: the offsets are the chunks' global starts */
            d.q_offset = chunk_start(R, R->rank, qc);
            d.k_offset = chunk_start(R, origin, kc);
            CLATTN_CHECK(R->ctx, clattn_attention(R->ctx, &d, &q, &k, &v, &out, nwait, wait, NULL));
            nwait = 0; /* the rest follow in the in-order queue */
            wait = NULL;
        }
}

static void merge_all(ring *R)
{
    const options *o = R->o;
    const long long B = o->batch, Hq = o->heads, D = o->dim, c = R->c;
    const int n = 2 * R->P;
    clattn_tensor *po = xmalloc(sizeof *po * (size_t)n), *pl = xmalloc(sizeof *pl * (size_t)n);
    for (int qc = 0; qc < 2; qc++) {
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (!pair_visible(R, qc, (R->rank - i / 2 + R->P) % R->P, i % 2))
                continue;
            const size_t part = (size_t)qc * (size_t)n + (size_t)i;
            po[m] = (clattn_tensor){R->parts, CLATTN_F32, (int64_t)(part * R->part_n), {B, Hq, c, D}, {Hq * c * D, c * D, D}};
            pl[m] = (clattn_tensor){R->plse, CLATTN_F32, (int64_t)(part * R->part_l), {B, Hq, c, 1}, {Hq * c, c, 1}};
            m++;
        }
        /* m >= 1: every query chunk sees its own first keys (the first step's diagonal pair) */
        const clattn_tensor out = {R->out, o->dtype, qc * c * D, {B, Hq, c, D}, {Hq * 2 * c * D, 2 * c * D, D}};
        CLATTN_CHECK(R->ctx, clattn_merge(R->ctx, m, po, pl, &out, NULL, 0, NULL, NULL));
    }
    free(po);
    free(pl);
}

static cl_int event_status(cl_event ev)
{
    cl_int st;
    CL_CHECK(clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    if (st < 0)
        die("a device command failed with status %d", (int)st);
    return st;
}

static void nap(void)
{
    const struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* The host staging buffers and kv[0] get the rank's own block again (untimed). */
static void reset_blocks(ring *R)
{
    const size_t bytes = 2 * R->nkv * R->es;
    memcpy(R->host_kv[0], R->own_kv, bytes);
    CL_CHECK(clEnqueueWriteBuffer(R->queue, R->kv[0], CL_TRUE, 0, bytes, R->own_kv, 0, NULL, NULL));
}

/* One iteration's times in seconds: sums over the P - 1 steps that move a block, except the
 * last three. */
enum {
    T_COMPUTE,      /* pass 1: the attention calls alone */
    T_TRANSFER,     /* pass 2: post, MPI completion, block written to the device */
    T_TRANSFER_MPI, /* pass 2: post to MPI completion */
    T_RING,         /* pass 3: the step's wall time */
    T_RING_XFER,    /* pass 3: post to the block written to the device */
    T_EXPOSED,      /* pass 3: how long after the compute finished the block was on the device (0 if before) */
    T_COMPUTE_ALL,  /* pass 1, all P steps */
    T_RING_ALL,     /* pass 3, all P steps */
    T_MERGE,        /* the merge after pass 3 */
    T_COUNT
};

static void post_exchange(ring *R, int s, MPI_Request req[2])
{
    const int bytes = (int)(2 * R->nkv * R->es);
    const int next = (R->rank + 1) % R->P, prev = (R->rank - 1 + R->P) % R->P;
    MPI_CHECK(MPI_Irecv(R->host_kv[(s + 1) % 2], bytes, MPI_BYTE, prev, s, MPI_COMM_WORLD, &req[0]));
    MPI_CHECK(MPI_Isend(R->host_kv[s % 2], bytes, MPI_BYTE, next, s, MPI_COMM_WORLD, &req[1]));
}

/* The block that arrived at step s goes to the device on the copy queue; rank 0 perturbs it first
 * under --fault. */
static cl_event write_arrived(ring *R, int s)
{
    void *src = R->host_kv[(s + 1) % 2];
    if (R->o->fault && R->rank == 0 && s == 0)
        store(R->o->dtype, src, 0, load(R->o->dtype, src, 0) + 0.5f);
    cl_event ev;
    CL_CHECK(clEnqueueWriteBuffer(R->copyq, R->kv[(s + 1) % 2], CL_FALSE, 0, 2 * R->nkv * R->es, src, 0, NULL, &ev));
    CL_CHECK(clFlush(R->copyq));
    return ev;
}

static void run_iteration(ring *R, double t[T_COUNT])
{
    const int P = R->P;
    memset(t, 0, sizeof(double) * T_COUNT);

    /* 1. compute only: the same calls and offsets, on the rank's own block */
    reset_blocks(R);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    for (int s = 0; s < P; s++) {
        const double t0 = MPI_Wtime();
        enqueue_step(R, s, 0, 0, NULL);
        CL_CHECK(clFinish(R->queue));
        const double dt = MPI_Wtime() - t0;
        t[T_COMPUTE_ALL] += dt;
        if (s < P - 1)
            t[T_COMPUTE] += dt;
    }

    /* 2. transfer only */
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    for (int s = 0; s < P - 1; s++) {
        MPI_Request req[2];
        const double t0 = MPI_Wtime();
        post_exchange(R, s, req);
        MPI_CHECK(MPI_Waitall(2, req, MPI_STATUSES_IGNORE));
        const double t1 = MPI_Wtime();
        cl_event ev = write_arrived(R, s);
        CL_CHECK(clWaitForEvents(1, &ev));
        CL_CHECK(clReleaseEvent(ev));
        t[T_TRANSFER_MPI] += t1 - t0;
        t[T_TRANSFER] += MPI_Wtime() - t0;
    }

    /* 3. the ring */
    reset_blocks(R);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    cl_event arrived = NULL;
    for (int s = 0; s < P; s++) {
        MPI_Request req[2];
        const int moves = s < P - 1;
        const double t0 = MPI_Wtime();
        if (moves)
            post_exchange(R, s, req);
        enqueue_step(R, s, s % 2, arrived ? 1 : 0, arrived ? &arrived : NULL);
        cl_event computed;
        CL_CHECK(clEnqueueMarkerWithWaitList(R->queue, 0, NULL, &computed));
        CL_CHECK(clFlush(R->queue));
        if (arrived)
            CL_CHECK(clReleaseEvent(arrived));
        arrived = NULL;
        /* MPI moves large messages only inside MPI calls: poll it while the device computes, send
         * the block to the device the moment it is here, and note when each side finishes (to
         * within a poll, ~0.1 ms). Once only the compute is left, block on it. */
        int got = !moves;
        double t_comp = -1, t_xfer = moves ? -1 : t0;
        while (t_comp < 0 || t_xfer < 0) {
            if (!got) {
                MPI_CHECK(MPI_Testall(2, req, &got, MPI_STATUSES_IGNORE));
                if (got)
                    arrived = write_arrived(R, s);
            }
            if (got && t_xfer < 0 && event_status(arrived) == CL_COMPLETE)
                t_xfer = MPI_Wtime();
            if (t_comp < 0 && event_status(computed) == CL_COMPLETE)
                t_comp = MPI_Wtime();
            if (t_xfer >= 0 && t_comp < 0) {
                CL_CHECK(clWaitForEvents(1, &computed));
                t_comp = MPI_Wtime();
            } else if (t_comp < 0 || t_xfer < 0) {
                nap();
            }
        }
        CL_CHECK(clReleaseEvent(computed));
        const double dt = MPI_Wtime() - t0;
        t[T_RING_ALL] += dt;
        if (moves) {
            t[T_RING] += dt;
            t[T_RING_XFER] += t_xfer - t0;
            t[T_EXPOSED] += t_xfer > t_comp ? t_xfer - t_comp : 0.0;
        }
    }
    if (arrived)
        CL_CHECK(clReleaseEvent(arrived));
    const double t0 = MPI_Wtime();
    merge_all(R);
    CL_CHECK(clFinish(R->queue));
    t[T_MERGE] = MPI_Wtime() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- the check on rank 0 ------------------------------------------------------------------- */

typedef struct check_result {
    double err_clattn, err_ref; /* max |ring - x|; err_ref < 0: not run */
    double worst;               /* largest |err| / (atol + rtol·|want|) over both */
    double whole_seconds;       /* the single-device call, timed after a warm-up */
} check_result;

static void compare(const float *got, const float *want, size_t n, double atol, double rtol, double *max_err,
                    double *worst)
{
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - (double)want[i]);
        const double r = e / (atol + rtol * fabs((double)want[i]));
        if (!(e <= *max_err))
            *max_err = e; /* NaN sticks */
        if (!(r <= *worst))
            *worst = r;
    }
}

static check_result check_on_rank0(ring *R, const float *ring_out, double atol, double rtol)
{
    const options *o = R->o;
    const long long B = o->batch, Hq = o->heads, Hkv = o->kv_heads, N = o->seq, D = o->dim;
    const size_t nq = (size_t)(B * Hq * N * D), nk = (size_t)(B * Hkv * N * D), es = R->es;
    check_result res = {0, -1, 0, 0};
    void *qh = xmalloc(nq * es), *kh = xmalloc(nk * es), *vh = xmalloc(nk * es);
    fill_rows(o, 0, qh, N, 0, 0, N);
    fill_rows(o, 1, kh, N, 0, 0, N);
    fill_rows(o, 2, vh, N, 0, 0, N);
    cl_context clctx = clattn_cl_context(R->ctx);
    cl_int err;
    cl_mem qb = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, nq * es, qh, &err);
    CL_CHECK(err);
    cl_mem kb = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, nk * es, kh, &err);
    CL_CHECK(err);
    cl_mem vb = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, nk * es, vh, &err);
    CL_CHECK(err);
    cl_mem ob = clCreateBuffer(clctx, CL_MEM_WRITE_ONLY, nq * sizeof(float), NULL, &err);
    CL_CHECK(err);
    const clattn_tensor q = clattn_tensor_bhsd(qb, o->dtype, B, Hq, N, D);
    const clattn_tensor k = clattn_tensor_bhsd(kb, o->dtype, B, Hkv, N, D);
    const clattn_tensor v = clattn_tensor_bhsd(vb, o->dtype, B, Hkv, N, D);
    const clattn_tensor out = clattn_tensor_bhsd(ob, CLATTN_F32, B, Hq, N, D);
    clattn_attention_desc d = {0};
    d.batch = B;
    d.heads_q = Hq;
    d.heads_kv = Hkv;
    d.seq_q = N;
    d.seq_kv = N;
    d.head_dim = D;
    d.causal = o->causal;
    for (int rep = 0; rep < 2; rep++) { /* the first builds the kernels */
        const double t0 = MPI_Wtime();
        CLATTN_CHECK(R->ctx, clattn_attention(R->ctx, &d, &q, &k, &v, &out, 0, NULL, NULL));
        CL_CHECK(clFinish(R->queue));
        res.whole_seconds = MPI_Wtime() - t0;
    }
    float *want = xmalloc(nq * sizeof(float));
    CL_CHECK(clEnqueueReadBuffer(R->queue, ob, CL_TRUE, 0, nq * sizeof(float), want, 0, NULL, NULL));
    compare(ring_out, want, nq, atol, rtol, &res.err_clattn, &res.worst);

    const double work = (double)B * (double)Hq * (double)N * (double)N * (double)D;
    if (o->ref == 1 || (o->ref == -1 && work <= 0x1p28)) {
#ifdef RING_MPI_REF
        double *qd = xmalloc(nq * sizeof(double)), *kd = xmalloc(nk * sizeof(double)),
               *vd = xmalloc(nk * sizeof(double)), *od = xmalloc(nq * sizeof(double));
        for (size_t i = 0; i < nq; i++)
            qd[i] = load(o->dtype, qh, i);
        for (size_t i = 0; i < nk; i++) {
            kd[i] = load(o->dtype, kh, i);
            vd[i] = load(o->dtype, vh, i);
        }
        ref_attn ra = {0};
        ra.batch = (int)B;
        ra.heads_q = (int)Hq;
        ra.heads_kv = (int)Hkv;
        ra.seq_q = ra.seq_kv = (int)N;
        ra.head_dim = (int)D;
        ra.scale = (double)(float)(1.0 / sqrt((double)D));
        ra.causal = o->causal;
        ref_attention(&ra, qd, kd, vd, od, NULL, NULL);
        for (size_t i = 0; i < nq; i++)
            want[i] = (float)od[i];
        res.err_ref = 0;
        compare(ring_out, want, nq, atol, rtol, &res.err_ref, &res.worst);
        free(qd);
        free(kd);
        free(vd);
        free(od);
#else
        if (o->ref == 1)
            die("--ref on: this build has no float64 reference (clattn_ref)");
#endif
    }
    free(want);
    free(qh);
    free(kh);
    free(vh);
    clReleaseMemObject(qb);
    clReleaseMemObject(kb);
    clReleaseMemObject(vb);
    clReleaseMemObject(ob);
    return res;
}

/* ---- main --------------------------------------------------------------------------------- */

static const char *device_spec(const options *o, MPI_Comm world, char *buf, size_t size)
{
    if (!o->device[0])
        return NULL;
    const char *at = strstr(o->device, "%l");
    if (!at) {
        snprintf(buf, size, "%s", o->device);
        return buf;
    }
    MPI_Comm node;
    int local;
    MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &local));
    MPI_CHECK(MPI_Comm_free(&node));
    snprintf(buf, size, "%.*s%d%s", (int)(at - o->device), o->device, local, at + 2);
    return buf;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int P;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);

    options o;
    char msg[512];
    if (parse_args(argc, argv, P, &o, msg, sizeof msg)) {
        const int help = !strcmp(msg, "help");
        if (g_rank == 0) {
            if (help)
                usage(stdout);
            else
                fprintf(stderr, "ring_mpi: %s (--help lists the options)\n", msg);
        }
        MPI_Finalize();
        return help ? 0 : 2;
    }

    ring R = {0};
    R.o = &o;
    R.rank = g_rank;
    R.P = P;
    R.c = o.seq / (2 * P);
    R.es = clattn_dtype_size(o.dtype);
    R.nq = (size_t)(o.batch * o.heads * 2 * R.c * o.dim);
    R.nkv = (size_t)(o.batch * o.kv_heads * 2 * R.c * o.dim);
    R.part_n = (size_t)(o.batch * o.heads * R.c * o.dim);
    R.part_l = (size_t)(o.batch * o.heads * R.c);

    char spec_buf[300];
    const char *spec = device_spec(&o, MPI_COMM_WORLD, spec_buf, sizeof spec_buf);
    if (clattn_create(spec, &R.ctx) != CLATTN_SUCCESS)
        die("clattn_create(%s): %s", spec ? spec : "default", clattn_last_error(NULL));
    R.queue = clattn_queue(R.ctx);
    cl_context clctx = clattn_cl_context(R.ctx);
    cl_int err;
    R.copyq = clCreateCommandQueue(clctx, clattn_device(R.ctx), 0, &err);
    CL_CHECK(err);
    char devname[256] = "";
    CL_CHECK(clGetDeviceInfo(clattn_device(R.ctx), CL_DEVICE_NAME, sizeof devname - 1, devname, NULL));

    /* local inputs: chunks r and 2P-1-r */
    void *qh = xmalloc(R.nq * R.es);
    R.own_kv = xmalloc(2 * R.nkv * R.es);
    for (int lc = 0; lc < 2; lc++) {
        const long long pos0 = chunk_start(&R, g_rank, lc);
        fill_rows(&o, 0, qh, 2 * R.c, lc * R.c, pos0, R.c);
        fill_rows(&o, 1, R.own_kv, 2 * R.c, lc * R.c, pos0, R.c);
        fill_rows(&o, 2, (char *)R.own_kv + R.nkv * R.es, 2 * R.c, lc * R.c, pos0, R.c);
    }
    R.host_kv[0] = xmalloc(2 * R.nkv * R.es);
    R.host_kv[1] = xmalloc(2 * R.nkv * R.es);
    R.q = clCreateBuffer(clctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, R.nq * R.es, qh, &err);
    CL_CHECK(err);
    for (int i = 0; i < 2; i++) {
        R.kv[i] = clCreateBuffer(clctx, CL_MEM_READ_ONLY, 2 * R.nkv * R.es, NULL, &err);
        CL_CHECK(err);
    }
    R.parts = clCreateBuffer(clctx, CL_MEM_READ_WRITE, sizeof(float) * R.part_n * 4 * (size_t)P, NULL, &err);
    CL_CHECK(err);
    R.plse = clCreateBuffer(clctx, CL_MEM_READ_WRITE, sizeof(float) * R.part_l * 4 * (size_t)P, NULL, &err);
    CL_CHECK(err);
    R.out = clCreateBuffer(clctx, CL_MEM_READ_WRITE, R.nq * R.es, NULL, &err);
    CL_CHECK(err);

    /* one warm-up iteration (kernel builds), then the timed ones; each time is the median over
     * the timed iterations (the machine is shared: medians resist a descheduled rank) */
    double *iter_t = xmalloc(sizeof(double) * T_COUNT * (size_t)o.iters);
    run_iteration(&R, iter_t);
    for (int it = 0; it < o.iters; it++)
        run_iteration(&R, iter_t + (size_t)T_COUNT * (size_t)it);
    double times[T_COUNT], *col = xmalloc(sizeof(double) * (size_t)o.iters);
    for (int j = 0; j < T_COUNT; j++) {
        for (int it = 0; it < o.iters; it++)
            col[it] = iter_t[(size_t)T_COUNT * (size_t)it + (size_t)j];
        qsort(col, (size_t)o.iters, sizeof *col, cmp_double);
        times[j] = o.iters % 2 ? col[o.iters / 2] : 0.5 * (col[o.iters / 2 - 1] + col[o.iters / 2]);
    }
    free(col);
    free(iter_t);

    /* the last ring's output, as floats, to rank 0 */
    void *oh = xmalloc(R.nq * R.es);
    CL_CHECK(clEnqueueReadBuffer(R.queue, R.out, CL_TRUE, 0, R.nq * R.es, oh, 0, NULL, NULL));
    float *of = xmalloc(R.nq * sizeof(float));
    for (size_t i = 0; i < R.nq; i++)
        of[i] = load(o.dtype, oh, i);
    float *all = g_rank == 0 ? xmalloc(R.nq * (size_t)P * sizeof(float)) : NULL;
    MPI_CHECK(MPI_Gather(of, (int)R.nq, MPI_FLOAT, all, (int)R.nq, MPI_FLOAT, 0, MPI_COMM_WORLD));
    double *all_times = g_rank == 0 ? xmalloc(sizeof times * (size_t)P) : NULL;
    MPI_CHECK(MPI_Gather(times, T_COUNT, MPI_DOUBLE, all_times, T_COUNT, MPI_DOUBLE, 0, MPI_COMM_WORLD));

    int failed = 0;
    if (g_rank == 0) {
        /* back to global [B][Hq][N][D] order */
        const long long B = o.batch, Hq = o.heads, N = o.seq, D = o.dim, c = R.c;
        float *got = xmalloc((size_t)(B * Hq * N * D) * sizeof(float));
        for (int r = 0; r < P; r++)
            for (long long bh = 0; bh < B * Hq; bh++)
                for (long long i = 0; i < 2 * c; i++) {
                    const long long pos = chunk_start(&R, r, (int)(i / c)) + i % c;
                    memcpy(got + (size_t)((bh * N + pos) * D), all + (size_t)r * R.nq + (size_t)((bh * 2 * c + i) * D),
                           (size_t)D * sizeof(float));
                }
        /* f32 parts and merge as tests/test_positions.c; an f16 output adds its rounding */
        const double o_eps = o.dtype == CLATTN_F16 ? 0x1p-10 : 0.0;
        const double atol = 3e-5 + o_eps, rtol = 2e-4 + o_eps;
        const check_result cr = check_on_rank0(&R, got, atol, rtol);
        failed = !(cr.worst <= 1.0);

        const int steps = P - 1;
        printf("ring_mpi: %d rank%s, B=%lld Hq=%lld Hkv=%lld N=%lld D=%lld %s %s; zig-zag: 2 chunks of %lld "
               "tokens per rank; %d timed iteration%s after a warm-up\n",
               P, P > 1 ? "s" : "", o.batch, o.heads, o.kv_heads, o.seq, o.dim, clattn_dtype_name(o.dtype),
               o.causal ? "causal" : "not causal", R.c, o.iters, o.iters > 1 ? "s" : "");
        printf("device (rank 0): %s\n", devname);
        const double block = 2.0 * (double)R.nkv * (double)R.es;
        printf("K/V block per step: %.0f bytes. Per step, over the %d step%s that move a block (medians of the "
               "iterations), in ms:\n", block, steps, steps == 1 ? "" : "s");
        printf("      pass 1   pass 2           pass 3: the ring                           | all %d steps\n", P);
        printf("rank  compute  transfer  (mpi)     step  overlap  transfer  exposed  hidden  | compute     ring   merge\n");
        double mean[T_COUNT] = {0};
        for (int r = 0; r < P; r++)
            for (int j = 0; j < T_COUNT; j++)
                mean[j] += all_times[T_COUNT * r + j] / P;
        for (int r = 0; r <= P; r++) {
            const double *x = r < P ? all_times + T_COUNT * r : mean;
            char who[16];
            if (r < P)
                snprintf(who, sizeof who, "%4d", r);
            else
                snprintf(who, sizeof who, "mean");
            if (steps > 0)
                printf("%s  %7.2f  %8.2f  %5.2f  %7.2f  %7.3f  %8.2f  %7.2f  %6.3f  | %7.2f  %7.2f  %6.2f\n", who,
                       1e3 * x[T_COMPUTE] / steps, 1e3 * x[T_TRANSFER] / steps, 1e3 * x[T_TRANSFER_MPI] / steps,
                       1e3 * x[T_RING] / steps, 1.0 - (x[T_RING] - x[T_COMPUTE]) / x[T_TRANSFER],
                       1e3 * x[T_RING_XFER] / steps, 1e3 * x[T_EXPOSED] / steps,
                       1.0 - x[T_EXPOSED] / x[T_RING_XFER], 1e3 * x[T_COMPUTE_ALL], 1e3 * x[T_RING_ALL],
                       1e3 * x[T_MERGE]);
            else
                printf("%s  %7s  %8s  %5s  %7s  %7s  %8s  %7s  %6s  | %7.2f  %7.2f  %6.2f\n", who, "-", "-", "-", "-",
                       "n/a", "-", "-", "-", 1e3 * x[T_COMPUTE_ALL], 1e3 * x[T_RING_ALL], 1e3 * x[T_MERGE]);
        }
        if (steps > 0) {
            printf("overlap = 1 - (step - compute) / transfer across the passes; hidden = 1 - exposed / transfer "
                   "inside the ring (1: the transfer wholly behind the compute, 0: none of it)\n");
            printf("transfer bandwidth (block / pass-2 transfer, mean): %.3f GB/s; MPI alone: %.3f GB/s\n",
                   block * steps / mean[T_TRANSFER] * 1e-9, block * steps / mean[T_TRANSFER_MPI] * 1e-9);
        }
        const double flops = 4.0 * (double)o.batch * (double)o.heads * (double)o.seq * (double)o.seq *
                             (double)o.dim * (o.causal ? 0.5 : 1.0);
        printf("ring, all steps + merge: %.3f ms (%.2f GFLOP/s); single device, whole sequence: %.3f ms (%.2f GFLOP/s)\n",
               1e3 * (mean[T_RING_ALL] + mean[T_MERGE]), flops / (mean[T_RING_ALL] + mean[T_MERGE]) * 1e-9,
               1e3 * cr.whole_seconds,
               flops / cr.whole_seconds * 1e-9);
        printf("check (atol %.3g, rtol %.3g): max |ring - clattn whole| = %.3g", atol, rtol, cr.err_clattn);
        if (cr.err_ref >= 0)
            printf(", max |ring - float64 reference| = %.3g", cr.err_ref);
        else
            printf(" (float64 reference not run: --ref on to force)");
        printf("; %s\n", failed ? "check FAILED" : "check passed");
        fflush(stdout);
        free(got);
    }
    MPI_CHECK(MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD));

    free(all);
    free(all_times);
    free(of);
    free(oh);
    free(qh);
    free(R.own_kv);
    free(R.host_kv[0]);
    free(R.host_kv[1]);
    clReleaseMemObject(R.q);
    clReleaseMemObject(R.kv[0]);
    clReleaseMemObject(R.kv[1]);
    clReleaseMemObject(R.parts);
    clReleaseMemObject(R.plse);
    clReleaseMemObject(R.out);
    clReleaseCommandQueue(R.copyq);
    clattn_release(R.ctx);
    MPI_Finalize();
    return failed ? 1 : 0;
}
