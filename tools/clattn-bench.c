/*
 * clattn-bench — times clattn's operations on one device next to peers measured in the same run
 * (device copy bandwidth, fp32 multiply-add peak, CLBlast's batched SGEMM) and optionally checks
 * every timed result against a float64 host reference.
 *
 *   clattn-bench [--device SPEC] [--op LIST] [shape options] [--causal] [--mask KIND]
 *                [--kv-len LIST] [variant options] [KV-cache options] [--varlen LIST]
 *                [--iters N] [--warmup N] [--csv] [--check] [--help]
 *
 * Variant options (docs/variants.md) apply to the attention ops (unfused, fused, decode): each
 * such op then runs plain first and with the variants next, so the overhead is a ratio of the
 * same run; a window adds the same window as a dense -inf mask and attention over just its keys.
 *
 * KV-cache options (docs/kvcache.md), for fused and decode (unfused takes plain K/V only):
 *   --kv-type T | K,V   K and V stored as f32, f16, bf16 (the --dtype's own), i8 (random f32 scales
 *                       per (token, kv head)), fp8_e4m3, fp8_e5m2 (per-tensor scales 0.5 for K,
 *                       0.25 for V), q8_0 or q4_0 (ggml's blocks of 32: --dim multiples of 32)
 *   --page N            paged K/V: pools of N-key pages, shuffled, through a block table (each batch
 *                       its own pages; the pool exactly the pages the key lengths need); 0: contiguous
 *   --page-layout L     nhd (default: vLLM's [pages][page][heads][dim]) or hnd ([pages][heads][page][dim])
 * With any of them, fused and decode run their plain row (contiguous K/V of --dtype) and then the
 * KV row, the same problem with K/V stored so. Its peer is the plain row (with variant options:
 * the variant row, contiguous); its ratio is KV ms / peer ms, and both rows show the K/V bytes
 * streamed per second (KV GB/s: the stored bytes of the K and V rows the problem reads, q8_0/q4_0
 * block scales and i8 scales included), the KV row's over the peer's in the closing ratios. A paged
 * KV row also gets a same-layout peer, run just before it: K and V of its storage types, contiguous
 * in the row order of the pool's pages, [B][Skv][Hkv][D] ("BSHD", clattn_tensor_bshd, the mask
 * column's "bshd") for NHD, [B][Hkv][Skv][D] for HND (not run for HND with K and V of --dtype: the
 * plain row is that peer); the paged row's second ratio is paged ms / same-layout ms, and two
 * kv_read rows follow it (run_page_reads: the device's own cost of reading pages). --check
 * decodes the stored bytes with the reference's decoder (ref/clattn_ref_kv.c) for its reference.
 *
 * Packed sequences (docs/kvcache.md, varlen), for fused:
 *   --varlen L1,L2,...  self-attention prefill of sequences of these lengths (sequence b: L_b
 *                       queries, L_b keys; --causal typical), packed end to end in
 *                       FlashAttention's layout ([total][heads][dim]: shape {1, H, total, D},
 *                       stride {0, D, H·D}). Replaces the fused op's rows by two: one
 *                       clattn_attention call a sequence (batch 1, seq_q = seq_kv = L_b, views of
 *                       the same buffers), all enqueued then one clFinish, timed as one job; and
 *                       ONE call on the packed batch (cu_seqlens_q = cu_seqlens_k = the prefix
 *                       sums, batch = the number of lengths, seq_q = seq_kv = the longest), with
 *                       the ratio packed ms / one call each ms. --batch, --seq-q and --seq-kv are
 *                       not used; heads, dims, --dtype, --scale and --causal are; masks, key
 *                       lengths, variants, --mla and KV-cache options are refused. --check compares
 *                       both outputs with float64 per sequence and prints their largest difference.
 *
 * Training (clattn_attention_backward, dropout), on the fused op's problem (masks, key lengths,
 * variants, --mla; K/V contiguous of --dtype: the backward takes no desc->kv):
 *   --op backward       the training forward (fused, with the LSE), run once to give out and the
 *                       LSE; then it (row "forward") and clattn_attention_backward on them with a
 *                       generated dout (row "backward") timed in alternation, so that their ratio
 *                       shares the machine's noise. Backward GFLOP/s counts 2.5 times the
 *                       forward's FLOPs (FlashAttention's convention); its ratio is backward
 *                       GFLOP/s / forward GFLOP/s. --check: dq, dk, dv (and dsinks) against
 *                       ref_attention_backward, each as max |err| / max |ref| (the whole problem
 *                       when cheap, else the query heads of a kv head: dK and dV need every row).
 *   --dropout P         dropout_p for fused, backward and dropout (seed --dropout-seed, offset 0);
 *                       --check applies ref_dropout_z's multipliers.
 *   --op dropout        the fused forward without and with dropout (P: --dropout, default 0.1),
 *                       timed in alternation (rows "fused" and "dropout"), ratio dropout ms /
 *                       plain ms; --check: the dropout row against ref_attention.
 * The training ops are not in --op all.
 *
 * Method (see PERFORMANCE.md): each operation is enqueued and the queue drained with clFinish, with
 * a CLOCK_MONOTONIC wall clock around both, so every kernel an operation enqueues is timed (the
 * unfused path's three kernels, decode's split and merge), never one event. Warm-up runs (kernel
 * builds, CLBlast's compilation) are not timed; the median and the minimum of the timed runs are
 * reported. Absolute times on a shared machine are noise: the ratios against peers measured in
 * the same run are the figures to compare.
 *
 * Inputs are uniform in [-1, 1) from a counter-based generator (element index -> value), so any
 * element can be regenerated on the host: uploads go in chunks and the reference rebuilds only the
 * heads it checks, whatever the size of the device tensors.
 *
 * Exit status: 0 ok; 1 bad usage or a failure of clattn, OpenCL or the host; 2 no OpenCL device;
 * 3 --check found an error above tolerance.
 */
#define _POSIX_C_SOURCE 200809L

#include "clattn.h"
#include "clattn_ref.h"
#include "clattn_ref_kv.h"
#include "storage.h"

#ifdef CLATTN_HAVE_CLBLAST
#include <clblast_c.h>
#endif

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXIT_USAGE 1
#define EXIT_ERROR 1
#define EXIT_NO_DEVICE 2
#define EXIT_CHECK 3

/* Returned by an operation's enqueue function: the device cannot run this case (clattn said
 * UNSUPPORTED, CLBlast failed, a buffer exceeds the device's max allocation). The reason has been
 * printed; the suite goes on without it. */
#define OP_SKIPPED 1

#define SEED 0x5eedc1a7701ULL
/* Generator streams, one per input tensor, so Q, K, V and the softmax input differ. */
/* ID_DO: the backward's dout. */
enum { ID_Q = 1, ID_K = 2, ID_V = 3, ID_S = 4, ID_M = 5, ID_SINK = 6, ID_KS = 7, ID_VS = 8, ID_PAGE = 9, ID_DO = 10 };
/* fp8 K and V: the per-tensor scales (x = scale·fp8) of --kv-type fp8_*; codes of magnitude at most
 * 4, so |K| <= 2 and |V| <= 1. */
#define FP8_K_SCALE 0.5f
#define FP8_V_SCALE 0.25f

/* --mask: no additive mask; finite values in [-1, 1) (the mask is read, hides nothing); a
 * window of keys around each row's diagonal key, -inf elsewhere (--mask window:W: the W keys
 * ending at it; the dense twin of a --window row: any left and right extent). The mask tensor is
 * [1][1][Sq][Skv], broadcast over batch and heads, f16 with f16 storage and f32 otherwise. */
enum { MASK_NONE, MASK_BIAS, MASK_WINDOW };
/* --kv-len takes at most this many lengths (cycled over the batch). */
#define MAX_KV_LENS 64

/* Elements generated and uploaded per clEnqueueWriteBuffer: bounds host memory for big tensors. */
#define UPLOAD_CHUNK ((size_t)1 << 22)
/* A reference costing more multiply-adds than this checks a sample of rows instead of all rows. */
#define FULL_CHECK_COST ((double)(1 << 28))
/* Rows checked per sampled head: evenly spaced, the first and the last included. */
#define SAMPLE_ROWS 16

enum op_id {
    OP_COPY, OP_PEAK, OP_SCORES, OP_SOFTMAX, OP_UNFUSED, OP_FUSED, OP_DECODE, OP_CLBLAST,
    OP_BACKWARD, OP_DROPOUT, /* training: named in --op, not part of all */
    OP_COUNT
};
static const char *const op_names[OP_COUNT] = {"copy",  "peak",   "scores",  "softmax",  "unfused",
                                               "fused", "decode", "clblast", "backward", "dropout"};
/* --op all and the default: the inference ops and peers (a GPU script's time budget for --op all
 * predates the training ops, which cost a backward and its float64 reference). */
#define OPS_ALL (((1u << OP_COUNT) - 1) & ~((1u << OP_BACKWARD) | (1u << OP_DROPOUT)))

/* Dropout (--dropout P, clattn_attention_desc.dropout_p): the seed without --dropout-seed, the
 * offset (dropout_offset) of every call, and P for --op dropout without --dropout. */
#define DROPOUT_SEED 0xd50b0e7c1a77e5edULL
#define DROPOUT_OFFSET 0u
#define DROPOUT_DEFAULT_P 0.1f

typedef struct shape {
    long long b, hq, hkv, sq, skv, d, dv; /* softmax: b, hq = heads, sq = rows, skv = cols */
    clattn_dtype dt;
    int causal;
    int mask;         /* MASK_* */
    long long mask_left, mask_right; /* MASK_WINDOW: diag - left <= j <= diag + right; < 0 unbounded */
    int kv_lens;      /* 1: per-batch key lengths from --kv-len */
    float scale;      /* desc.scale: 0 is the library's 1/sqrt(D) */
    int mla;          /* 1: V is a view of K's first Dv dims (DeepSeek MLA), no V buffer */
    /* Variants (clattn_attention_desc), attention ops only; off when 0. */
    int window;
    long long win_left, win_right; /* < 0: unbounded */
    long long chunk;
    float softcap;
    int sinks;        /* SINKS_* */
    float sink_value; /* SINKS_VALUE */
    float alibi;      /* max_bias of clattn_alibi_slopes */
    int score_mod, mask_mod;
    /* KV-cache storage (clattn_kv_layout), fused and decode only: kv 1 for the KV row (desc.kv
     * given), K stored as kt and V as vt (a plain row: dt), paged with `page` keys a page (0:
     * contiguous), hnd 1 for [pages][heads][page][dim] pools, else [pages][page][heads][dim];
     * bshd 1 (page 0 only): contiguous K/V in [B][Skv][Hkv][D] order, the row order of an NHD
     * pool (the paged row's same-layout peer). */
    int kv;
    clattn_dtype kt, vt;
    long long page;
    int hnd;
    int bshd;
    /* --varlen rows (fused): 1 the packed call, 2 one call a sequence; 0 otherwise. */
    int varlen;
    /* Dropout probability (fused, backward and dropout rows; seed bench.opt.dropout_seed, offset
     * DROPOUT_OFFSET); off when 0. */
    float dropout;
} shape;

/* --sinks: SINKS_RANDOM gives per-head logits uniform in [0, ln Skv) (a sink then weighs between
 * one key and all of them), SINKS_VALUE one logit for every head. */
enum { SINKS_NONE, SINKS_RANDOM, SINKS_VALUE };

typedef struct options {
    const char *device;
    unsigned ops; /* bit per op_id */
    long long b, hq, hkv, sq, skv, d, dv; /* -1: per-op default */
    int dtype;                            /* -1: per-op default (f32) */
    int causal;                           /* 1: --causal given */
    int mask;                             /* MASK_*, from --mask */
    long long window;                     /* --mask window:W */
    float scale;                          /* --scale; 0: the library's default */
    int mla;                              /* --mla */
    shape var;                            /* the variant fields of --window ... --mask-mod */
    char *score_mod, *mask_mod;           /* --score-mod / --mask-mod file contents */
    long long kv_len[MAX_KV_LENS];        /* --kv-len, cycled over the batch */
    int n_kv_len;                         /* 0: no key lengths */
    long long varlen[MAX_KV_LENS];        /* --varlen: the packed sequences' lengths */
    int n_varlen;                         /* 0: no --varlen */
    int kv;                               /* 1: --kv-type, --page or --page-layout given */
    int kt, vt;                           /* --kv-type; -1: --dtype's */
    long long page;                       /* --page; 0: contiguous */
    int hnd;                              /* --page-layout hnd */
    float dropout;                        /* --dropout P; 0: none */
    unsigned long long dropout_seed;      /* --dropout-seed; DROPOUT_SEED */
    int iters, warmup, csv, check;
} options;

/* One line of output. NAN marks a figure that does not apply. */
typedef struct result {
    const char *op;
    int has_shape;
    shape s;
    const char *dtype;
    double ms_med, ms_min, gflops, gbps;
    const char *ratio_name;
    double ratio;
    double kv_gbps;      /* attention: K/V bytes read / time (kv_bytes) */
    double kv_ratio;     /* a KV row: its kv_gbps / its peer's */
    double layout_ratio; /* a paged row: its ms / the contiguous same-layout row's ms */
    int checked;
    double err, tol;
} result;

typedef struct bench {
    options opt;
    clattn_context *ctx;
    cl_context clctx;
    cl_command_queue queue;
    cl_device_id dev;
    char dev_name[256], plat_name[256], driver[128], dev_version[128];
    cl_uint compute_units;
    cl_ulong max_alloc;
    int gpu;
    int header_done;
    int check_failed;
    /* Peers, NAN until measured. */
    double copy_gbps, peak_gflops, clblast_ms, unfused_ms, fused_gflops;
    /* Ratios for the closing block, in the order measured. */
    struct {
        const char *what, *how;
        double v;
    } ratios[32];
    int n_ratios;
    int mask_width; /* of the text table's mask column: the longest description of this run */
    /* --check with --score-mod / --mask-mod: the snippets built with a kernel that evaluates
     * them for one row (the reference cannot run OpenCL C on the host). */
    cl_program mods_prog;
    cl_kernel mods_kernel;
    cl_mem mods_x, mods_vis;
    size_t mods_cap;
    int mods_failed;
    /* Host staging for uploads and row reads, grown on demand. */
    void *stage;
    size_t stage_size;
    /* The kernel parameters of the measured lines, printed after the ratios. */
    char params[4096];
} bench;

/* ------------------------------------------------------------------------------------------ */
/* Failure paths                                                                                */

static void die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("clattn-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

static void die_clattn(const bench *bn, const char *what, clattn_status st)
{
    die(EXIT_ERROR, "%s: %s (%s): %s", what, clattn_status_name(st), clattn_status_string(st),
        clattn_last_error(bn->ctx));
}

static void check_cl(cl_int err, const char *what)
{
    if (err != CL_SUCCESS)
        die(EXIT_ERROR, "%s failed (OpenCL error %d)", what, (int)err);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die(EXIT_ERROR, "out of host memory (%zu bytes)", n);
    return p;
}

/* n elements of `size` bytes, n counted in 64 bits: past a 32-bit size_t it is out of memory,
 * not a wrapped (small) allocation. */
static void *xmalloc_n(uint64_t n, size_t size)
{
    if (n > SIZE_MAX / size)
        die(EXIT_ERROR, "out of host memory (%llu elements of %zu bytes)", (unsigned long long)n, size);
    return xmalloc((size_t)n * size);
}

static void *stage(bench *bn, size_t bytes)
{
    if (bytes > bn->stage_size) {
        free(bn->stage);
        bn->stage = xmalloc(bytes);
        bn->stage_size = bytes;
    }
    return bn->stage;
}

/* ------------------------------------------------------------------------------------------ */
/* Inputs (storage types: storage.h)                                                          */

static uint64_t splitmix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Element `idx` of input stream `id`: uniform on a 2^-23 grid in [-1, 1), exact in binary32. */
static float gen(unsigned id, uint64_t idx)
{
    const uint64_t z = splitmix64(SEED ^ ((uint64_t)id << 56) ^ idx);
    return (float)((double)(z >> 40) / 8388608.0 - 1.0);
}

/* The value the device holds for that element after storage rounding. */
static double gen_stored(unsigned id, uint64_t idx, clattn_dtype dt)
{
    return stored(gen(id, idx), dt);
}

static size_t esize(clattn_dtype dt)
{
    return clattn_dtype_size(dt);
}

/* @return a buffer of `bytes`, or NULL (reason printed) when it exceeds the device's limit or,
 * on a 32-bit host, size_t. */
static cl_mem make_buffer(bench *bn, const char *op, uint64_t bytes)
{
    const int host = bytes > SIZE_MAX;
    if (host || bytes > bn->max_alloc) {
        fprintf(stderr, "%s: skipped: needs a %llu-byte buffer, more than the %s of %llu bytes\n", op,
                (unsigned long long)bytes, host ? "host's size_t" : "device's max allocation",
                host ? (unsigned long long)SIZE_MAX : (unsigned long long)bn->max_alloc);
        return NULL;
    }
    cl_int err;
    cl_mem m = clCreateBuffer(bn->clctx, CL_MEM_READ_WRITE, (size_t)bytes, NULL, &err);
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
        err == CL_OUT_OF_HOST_MEMORY || err == CL_INVALID_BUFFER_SIZE) {
        fprintf(stderr, "%s: skipped: clCreateBuffer of %llu bytes failed (OpenCL error %d)\n", op,
                (unsigned long long)bytes, (int)err);
        return NULL;
    }
    check_cl(err, "clCreateBuffer");
    return m;
}

static void release(cl_mem *m, int n)
{
    for (int i = 0; i < n; i++)
        if (m[i])
            clReleaseMemObject(m[i]);
}

/* Element i of a contiguous tensor being uploaded; ctx is the uploader's. */
typedef float (*value_fn)(const void *ctx, uint64_t i);

/* Fills a contiguous buffer with `count` elements value(ctx, i), in chunks of UPLOAD_CHUNK. */
static void upload_values(bench *bn, cl_mem buf, uint64_t count, clattn_dtype dt, value_fn value,
                          const void *ctx)
{
    const size_t es = esize(dt);
    void *h = stage(bn, UPLOAD_CHUNK * es);
    for (uint64_t at = 0; at < count; at += UPLOAD_CHUNK) {
        const size_t n = (size_t)(count - at < UPLOAD_CHUNK ? count - at : UPLOAD_CHUNK);
        for (size_t i = 0; i < n; i++)
            store(h, i, dt, value(ctx, at + i));
        check_cl(clEnqueueWriteBuffer(bn->queue, buf, CL_TRUE, (size_t)at * es, n * es, h, 0, NULL,
                                      NULL),
                 "clEnqueueWriteBuffer");
    }
}

static float stream_value(const void *id, uint64_t i)
{
    return gen(*(const unsigned *)id, i);
}

/* Fills a contiguous buffer with `count` elements of stream `id`. */
static void upload(bench *bn, cl_mem buf, unsigned id, uint64_t count, clattn_dtype dt)
{
    upload_values(bn, buf, count, dt, stream_value, &id);
}

static clattn_dtype mask_dtype(const shape *s);
static double mask_at(const shape *s, long long i, long long j);

/* Element e of shape s's [1][1][Sq][Skv] mask. */
static float mask_value(const void *shp, uint64_t e)
{
    const shape *s = shp;
    return (float)mask_at(s, (long long)(e / (uint64_t)s->skv), (long long)(e % (uint64_t)s->skv));
}

/* The view desc.mask takes of mask buffer m ([1][1][Sq][Skv], in *t), or NULL without one. */
static const clattn_tensor *mask_view(cl_mem m, const shape *s, clattn_tensor *t)
{
    if (!m)
        return NULL;
    *t = clattn_tensor_bhsd(m, mask_dtype(s), 1, 1, s->sq, s->skv);
    return t;
}

/* The --mask tensor ([1][1][Sq][Skv]) and the --kv-len buffer (int32[B]) of shape s, filled; NULL
 * where not asked for. @return 0, or OP_SKIPPED (a buffer beyond the device's limit, reason
 * printed; nothing left allocated). */
static int make_masks(bench *bn, const char *op, const shape *s, cl_mem *mask, cl_mem *lens)
{
    *mask = *lens = NULL;
    if (s->mask != MASK_NONE) {
        const uint64_t count = (uint64_t)(s->sq * s->skv);
        if (!(*mask = make_buffer(bn, op, count * esize(mask_dtype(s)))))
            return OP_SKIPPED;
        upload_values(bn, *mask, count, mask_dtype(s), mask_value, s);
    }
    if (s->kv_lens) {
        if (!(*lens = make_buffer(bn, op, (uint64_t)s->b * sizeof(cl_int)))) {
            release(mask, 1);
            *mask = NULL;
            return OP_SKIPPED;
        }
        cl_int *v = xmalloc_n((uint64_t)s->b, sizeof *v);
        for (long long b = 0; b < s->b; b++)
            v[b] = (cl_int)bn->opt.kv_len[b % bn->opt.n_kv_len];
        check_cl(clEnqueueWriteBuffer(bn->queue, *lens, CL_TRUE, 0, (size_t)s->b * sizeof *v, v, 0, NULL,
                                      NULL),
                 "clEnqueueWriteBuffer");
        free(v);
    }
    return 0;
}

/* Reads `n` elements at element offset `off` into dst as doubles. */
static void read_row(bench *bn, cl_mem buf, uint64_t off, size_t n, clattn_dtype dt, double *dst)
{
    const size_t es = esize(dt);
    void *h = stage(bn, n * es);
    check_cl(clEnqueueReadBuffer(bn->queue, buf, CL_TRUE, (size_t)off * es, n * es, h, 0, NULL, NULL),
             "clEnqueueReadBuffer");
    for (size_t i = 0; i < n; i++)
        dst[i] = load(h, i, dt);
}

/* ------------------------------------------------------------------------------------------ */
/* Float64 reference on sampled rows                                                            */

typedef struct rowpick {
    long long b, h, i;
} rowpick;

/* Every row when the reference is cheap; else SAMPLE_ROWS evenly spaced rows of every head of the
 * first batch and of the last head of the last batch (so batch and head offsets are exercised). */
static rowpick *pick_rows(long long B, long long H, long long S, double cost, size_t *n)
{
    const int all = cost <= FULL_CHECK_COST;
    const long long per = all || S <= SAMPLE_ROWS ? S : SAMPLE_ROWS;
    const long long heads = all ? B * H : H + (B > 1);
    rowpick *r = xmalloc_n((uint64_t)(heads * per), sizeof *r);
    size_t k = 0;
    for (long long hh = 0; hh < heads; hh++) {
        const long long b = all ? hh / H : hh < H ? 0 : B - 1, h = all ? hh % H : hh < H ? hh : H - 1;
        for (long long j = 0; j < per; j++) {
            const long long i = per == S ? j : j * (S - 1) / (per - 1);
            r[k++] = (rowpick){b, h, i};
        }
    }
    *n = k;
    return r;
}

/* Keys of batch b: its --kv-len entry clamped to 0..Skv, as the library clamps it. */
static long long batch_keys(const bench *bn, const shape *s, long long b)
{
    if (!s->kv_lens)
        return s->skv;
    const long long n = bn->opt.kv_len[b % bn->opt.n_kv_len];
    return n < 0 ? 0 : n > s->skv ? s->skv : n;
}

/* Keys 0 .. end - 1 are those row i of batch b sees under key lengths and bottom-right causal
 * masking; the additive mask may hide some of them. */
static long long row_end(const bench *bn, const shape *s, long long b, long long i)
{
    const long long n = batch_keys(bn, s, b);
    if (!s->causal)
        return n;
    const long long v = i + 1 + n - s->sq;
    return v < 0 ? 0 : v > n ? n : v;
}

/* 1 when the library files s under its "masked" problem class (an additive mask or key lengths). */
static int masked(const shape *s)
{
    return s->mask != MASK_NONE || s->kv_lens;
}

static clattn_dtype mask_dtype(const shape *s)
{
    return s->dt == CLATTN_F16 ? CLATTN_F16 : CLATTN_F32;
}

/* Element (i, j) of the additive mask as the device holds it: 0 without one. */
static double mask_at(const shape *s, long long i, long long j)
{
    if (s->mask == MASK_BIAS)
        return gen_stored(ID_M, (uint64_t)(i * s->skv + j), mask_dtype(s));
    if (s->mask == MASK_WINDOW) {
        const long long diag = i + s->skv - s->sq;
        return (s->mask_left < 0 || j >= diag - s->mask_left) &&
                       (s->mask_right < 0 || j <= diag + s->mask_right)
                   ? 0.0
                   : -INFINITY;
    }
    return 0.0;
}

/* 1 when s asks for a variant of attention (the plain row beside it has none). */
static int has_variant(const shape *s)
{
    return s->window || s->chunk || s->softcap > 0.0f || s->sinks || s->alibi > 0.0f || s->score_mod ||
           s->mask_mod;
}

/* s with K and V contiguous in its dtype: the peer of a KV row. */
static shape contiguous_shape(const shape *s)
{
    shape p = *s;
    p.kv = 0;
    p.kt = p.vt = p.dt;
    p.page = 0;
    p.hnd = 0;
    p.bshd = 0;
    return p;
}

/* s without its variants and KV storage: the plain row measured beside a variant or KV row. */
static shape plain_shape(const shape *s)
{
    shape p = contiguous_shape(s);
    p.window = 0;
    p.win_left = p.win_right = p.chunk = 0;
    p.softcap = p.alibi = p.sink_value = 0.0f;
    p.sinks = p.score_mod = p.mask_mod = 0;
    return p;
}

/* floor(a / b) for b > 0, as the chunk rule reads it for a negative diagonal position. */
static long long floor_div(long long a, long long b)
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

/* Diagonal position p of row i of batch b: the variants' q (docs/variants.md). */
static long long diag_pos(const bench *bn, const shape *s, long long b, long long i)
{
    return i + batch_keys(bn, s, b) - s->sq;
}

/* The keys row i of batch b attends to, *lo .. *hi (none when *hi < *lo): those before row_end
 * that the window mask, the window and the chunk leave visible (an interval each, so their
 * intersection is one run of keys whose ends grow with the row). A bias mask and mask_mod hide
 * nothing here. */
static void row_span(const bench *bn, const shape *s, long long b, long long i, long long *lo,
                     long long *hi)
{
    *lo = 0;
    *hi = row_end(bn, s, b, i) - 1;
    if (s->mask == MASK_WINDOW) {
        const long long diag = i + s->skv - s->sq;
        if (s->mask_left >= 0 && diag - s->mask_left > *lo)
            *lo = diag - s->mask_left;
        if (s->mask_right >= 0 && diag + s->mask_right < *hi)
            *hi = diag + s->mask_right;
    }
    const long long p = diag_pos(bn, s, b, i);
    if (s->window) {
        if (s->win_left >= 0 && p - s->win_left > *lo)
            *lo = p - s->win_left;
        if (s->win_right >= 0 && p + s->win_right < *hi)
            *hi = p + s->win_right;
    }
    if (s->chunk) {
        const long long c0 = floor_div(p, s->chunk) * s->chunk;
        if (c0 > *lo)
            *lo = c0;
        if (c0 + s->chunk - 1 < *hi)
            *hi = c0 + s->chunk - 1;
    }
}

/* Number of keys row i of batch b attends to (row_span). */
static long long row_visible(const bench *bn, const shape *s, long long b, long long i)
{
    long long lo, hi;
    row_span(bn, s, b, i, &lo, &hi);
    return hi >= lo ? hi - lo + 1 : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* KV-cache storage (--kv-type, --page)                                                         */

/* The storage types of K and V of shape s (its dtype in a plain row). */
static clattn_dtype k_type(const shape *s)
{
    return s->kv ? s->kt : s->dt;
}

static clattn_dtype v_type(const shape *s)
{
    return s->kv ? s->vt : s->dt;
}

/* Bytes of a row of d elements of dt (d a multiple of 32 for q8_0 and q4_0). */
static uint64_t row_bytes(clattn_dtype dt, long long d)
{
    return (uint64_t)d / (uint64_t)clattn_dtype_block(dt) * (uint64_t)clattn_dtype_size(dt);
}

static int is_fp8(clattn_dtype dt)
{
    return dt == CLATTN_FP8_E4M3 || dt == CLATTN_FP8_E5M2;
}

/* Element idx of stream id mapped to [lo, hi], as a float. */
static float gen_range(unsigned id, uint64_t idx, double lo, double hi)
{
    return (float)(lo + (hi - lo) * 0.5 * ((double)gen(id, idx) + 1.0));
}

/*
 * The stored bytes of logical row `row` ((b·Hkv + h)·Skv + j) of K (id ID_K) or V (ID_V): d
 * elements of dt at p, from the counter-based generator (element e of the row is element
 * row·d + e of the stream, its scales elements of ID_KS / ID_VS). f32/f16/bf16: the plain row's
 * values, so a paged row holds what the contiguous one does. i8: q = round(127·u), the row's scale
 * in [0.75, 1]/127; fp8: codes of magnitude at most 4 (never NaN or infinity) times the per-tensor
 * scale; q8_0: d in [0.75, 1]/127, q in -127 .. 127; q4_0: d in [0.75, 1]/8, nibbles 0 .. 15. So
 * every value lies in [-1, 1] (fp8 K: [-2, 2]).
 * @return the scale ref_kv_decode_row applies: the row's (i8), the tensor's (fp8), else 1.
 */
static double kv_row(unsigned id, clattn_dtype dt, uint64_t row, long long d, unsigned char *p)
{
    const unsigned sid = id == ID_K ? ID_KS : ID_VS;
    const uint64_t e0 = row * (uint64_t)d;
    switch (dt) {
    case CLATTN_I8:
        for (long long e = 0; e < d; e++)
            p[e] = (unsigned char)(signed char)lrint(127.0 * gen(id, e0 + (uint64_t)e));
        return gen_range(sid, row, 0.75 / 127, 1.0 / 127);
    case CLATTN_FP8_E4M3:
    case CLATTN_FP8_E5M2: {
        const unsigned top = dt == CLATTN_FP8_E4M3 ? 0x48 : 0x44; /* the code of 4.0 */
        for (long long e = 0; e < d; e++) {
            const float u = gen(id, e0 + (uint64_t)e);
            unsigned c = (unsigned)(fabsf(u) * (float)(top + 1));
            c = c > top ? top : c;
            p[e] = (unsigned char)(c | (u < 0.0f ? 0x80u : 0u));
        }
        return id == ID_K ? FP8_K_SCALE : FP8_V_SCALE;
    }
    case CLATTN_Q8_0:
    case CLATTN_Q4_0: {
        const int q8 = dt == CLATTN_Q8_0;
        const double top = q8 ? 127.0 : 8.0;
        for (long long blk = 0; blk < d / 32; blk++) {
            unsigned char *b = p + (size_t)blk * clattn_dtype_size(dt);
            const uint16_t h =
                f32_to_f16(gen_range(sid, row * (uint64_t)(d / 32) + (uint64_t)blk, 0.75 / top, 1.0 / top));
            b[0] = (unsigned char)(h & 0xff); /* little-endian, as ggml stores it */
            b[1] = (unsigned char)(h >> 8);
            if (!q8)
                memset(b + 2, 0, 16);
            for (int e = 0; e < 32; e++) {
                const float u = gen(id, e0 + (uint64_t)(blk * 32 + e));
                if (q8) {
                    b[2 + e] = (unsigned char)(signed char)lrint(127.0 * u);
                } else { /* byte j: element j in the low nibble, j + 16 in the high one */
                    unsigned nib = (unsigned)((u + 1.0f) * 8.0f);
                    nib = nib > 15 ? 15 : nib;
                    b[2 + e % 16] |= (unsigned char)(e < 16 ? nib : nib << 4);
                }
            }
        }
        return 1.0;
    }
    default: /* f32, f16, bf16 */
        for (long long e = 0; e < d; e++)
            store(p, (size_t)e, dt, gen(id, e0 + (uint64_t)e));
        return 1.0;
    }
}

/* Where the rows of a KV row's K or V store lie: contiguous [B][Hkv][Skv] (or [B][Skv][Hkv] with
 * bshd), or a pool of pages [pages][Hkv][page] (HND) or [pages][page][Hkv] (NHD) addressed by a
 * block table. */
typedef struct kv_pages {
    long long page;   /* keys a page; 0: contiguous */
    long long nb;     /* block-table entries per batch: ceil(Skv / page) */
    long long npages; /* pages in the pool */
    int hnd;
    int bshd;         /* contiguous only: [B][Skv][Hkv] rows */
    cl_int *table;    /* [B][nb]: batch b's n-th page; entries past its keys 0 (never read) */
    long long *owner; /* [npages]: b·nb + n of the entry naming the page; -1: none */
} kv_pages;

/* Each batch gets the pages its keys need (batch_keys), no more, at places in the pool shuffled
 * by the generator (stream ID_PAGE): neighbouring keys of a sequence are not neighbours in memory. */
static void kv_pages_make(const bench *bn, const shape *s, kv_pages *pg)
{
    memset(pg, 0, sizeof *pg);
    if (!s->kv)
        return;
    if (!s->page) {
        pg->bshd = s->bshd;
        return;
    }
    pg->page = s->page;
    pg->hnd = s->hnd;
    pg->nb = (s->skv + s->page - 1) / s->page;
    long long total = 0;
    for (long long b = 0; b < s->b; b++)
        total += (batch_keys(bn, s, b) + s->page - 1) / s->page;
    pg->npages = total ? total : 1; /* every batch empty: one page nobody reads */
    if (pg->npages > INT32_MAX)
        die(EXIT_USAGE, "--page %lld: %lld pages, more than a block table's int32 holds", s->page, pg->npages);
    long long *perm = xmalloc_n((uint64_t)pg->npages, sizeof *perm);
    for (long long i = 0; i < pg->npages; i++)
        perm[i] = i;
    for (long long i = pg->npages - 1; i > 0; i--) {
        const long long k = (long long)(splitmix64(SEED ^ ((uint64_t)ID_PAGE << 56) ^ (uint64_t)i) %
                                        (uint64_t)(i + 1)),
                        t = perm[i];
        perm[i] = perm[k];
        perm[k] = t;
    }
    pg->table = xmalloc_n((uint64_t)(s->b * pg->nb), sizeof *pg->table);
    pg->owner = xmalloc_n((uint64_t)pg->npages, sizeof *pg->owner);
    for (long long i = 0; i < pg->npages; i++)
        pg->owner[i] = -1;
    long long next = 0;
    for (long long b = 0; b < s->b; b++) {
        const long long need = (batch_keys(bn, s, b) + s->page - 1) / s->page;
        for (long long n = 0; n < pg->nb; n++) {
            const long long at = b * pg->nb + n;
            pg->table[at] = n < need ? (cl_int)perm[next] : 0;
            if (n < need)
                pg->owner[perm[next++]] = at;
        }
    }
    free(perm);
}

static void kv_pages_free(kv_pages *pg)
{
    free(pg->table);
    free(pg->owner);
    memset(pg, 0, sizeof *pg);
}

/* Rows (one per key and kv head) of a K or V store. */
static uint64_t kv_store_rows(const shape *s, const kv_pages *pg)
{
    return pg->page ? (uint64_t)(pg->npages * pg->page * s->hkv) : (uint64_t)(s->b * s->hkv * s->skv);
}

/* The logical row ((b·Hkv + h)·Skv + j) physical row r of a store holds, or -1 for a row no key
 * uses (the tail of a batch's last page, a page no batch owns). */
static int64_t kv_logical_row(const shape *s, const kv_pages *pg, uint64_t r)
{
    if (!pg->page && pg->bshd) { /* r = (b·Skv + j)·Hkv + h */
        const uint64_t H = (uint64_t)s->hkv, S = (uint64_t)s->skv;
        return (int64_t)((r / (S * H) * H + r % H) * S + r / H % S);
    }
    if (!pg->page)
        return (int64_t)r;
    const uint64_t P = (uint64_t)pg->page, H = (uint64_t)s->hkv;
    const uint64_t p = r / (P * H), h = pg->hnd ? r / P % H : r % H, t = pg->hnd ? r % P : r / H % P;
    const long long o = pg->owner[p];
    if (o < 0)
        return -1;
    const long long b = o / pg->nb, j = o % pg->nb * pg->page + (long long)t;
    return j < s->skv ? (int64_t)(((uint64_t)b * H + h) * (uint64_t)s->skv + (uint64_t)j) : -1;
}

/* The view of a store of d elements a row (d 1: the i8 scales beside it). */
static clattn_tensor kv_view(const shape *s, const kv_pages *pg, cl_mem buf, clattn_dtype dt, long long d)
{
    if (!pg->page)
        return pg->bshd ? clattn_tensor_bshd(buf, dt, s->b, s->skv, s->hkv, d)
                        : clattn_tensor_bhsd(buf, dt, s->b, s->hkv, s->skv, d);
    return pg->hnd ? clattn_tensor_bhsd(buf, dt, pg->npages, s->hkv, pg->page, d)
                   : clattn_tensor_bshd(buf, dt, pg->npages, pg->page, s->hkv, d);
}

/* Fills K's (id ID_K) or V's (ID_V) store of dt, d elements a row: each row's bytes from kv_row at
 * its place (a row no key uses: zero bytes), and with sbuf (i8) the rows' f32 scales in the same
 * order. */
static void upload_kv(bench *bn, cl_mem buf, cl_mem sbuf, unsigned id, clattn_dtype dt, long long d,
                      const shape *s, const kv_pages *pg)
{
    const uint64_t rb = row_bytes(dt, d), rows = kv_store_rows(s, pg);
    const uint64_t per = UPLOAD_CHUNK * 4 / (rb + 4) ? UPLOAD_CHUNK * 4 / (rb + 4) : 1;
    float *sc = stage(bn, (size_t)(per * (rb + 4)));
    unsigned char *h = (unsigned char *)(sc + per);
    for (uint64_t at = 0; at < rows; at += per) {
        const size_t n = (size_t)(rows - at < per ? rows - at : per);
        for (size_t i = 0; i < n; i++) {
            const int64_t lr = kv_logical_row(s, pg, at + i);
            if (lr < 0) {
                memset(h + i * rb, 0, (size_t)rb);
                sc[i] = 0.0f;
            } else {
                sc[i] = (float)kv_row(id, dt, (uint64_t)lr, d, h + i * rb);
            }
        }
        check_cl(clEnqueueWriteBuffer(bn->queue, buf, CL_TRUE, (size_t)(at * rb), n * (size_t)rb, h, 0, NULL,
                                      NULL),
                 "clEnqueueWriteBuffer");
        if (sbuf)
            check_cl(clEnqueueWriteBuffer(bn->queue, sbuf, CL_TRUE, (size_t)at * sizeof(float), n * sizeof(float),
                                          sc, 0, NULL, NULL),
                     "clEnqueueWriteBuffer");
    }
}

/* Bytes an attention op reads per visible key and kv head: K's row and V's (K's alone with
 * --mla), in their storage types, q8_0/q4_0 block scales and i8 row scales included. */
static double key_bytes(const shape *s)
{
    const clattn_dtype kt = k_type(s), vt = v_type(s);
    double n = (double)row_bytes(kt, s->d) + (kt == CLATTN_I8 ? 4.0 : 0.0);
    if (!s->mla)
        n += (double)row_bytes(vt, s->dv) + (vt == CLATTN_I8 ? 4.0 : 0.0);
    return n;
}

/* The dropout multiplier of key j for row p (its diagonal position, = the global row r: no
 * offsets) of query head h of batch b: the float64 reference's generator (ref_dropout_z) with the
 * p, seed and offset the calls are given; 1 without dropout. */
static double dropout_z(const bench *bn, const shape *s, long long b, long long h, long long p, long long j)
{
    if (!(s->dropout > 0.0f))
        return 1.0;
    return ref_dropout_z(bn->opt.dropout_seed, DROPOUT_OFFSET, (double)s->dropout, (int)b, (int)s->hq, (int)h, p, j);
}

/* |got - want| measured on O(1) values: absolute up to magnitude 1, relative above it. Matching
 * infinities count as exact; NaN or a lone infinity is an infinite error. */
static double elem_err(double got, double want, double norm)
{
    if (isinf(want) && got == want)
        return 0.0;
    const double e = fabs(got - want) / norm;
    return e == e ? e : INFINITY;
}

static double tolerance(clattn_dtype dt)
{
    return dt == CLATTN_F16 ? 2e-3 : dt == CLATTN_BF16 ? 2e-2 : 1e-4;
}

/* The --score-mod / --mask-mod text (NULL when s has none, or for a plain row). */
static const char *score_mod_src(const bench *bn, const shape *s)
{
    return s->score_mod ? bn->opt.score_mod : NULL;
}

static const char *mask_mod_src(const bench *bn, const shape *s)
{
    return s->mask_mod ? bn->opt.mask_mod : NULL;
}

/* Evaluates the snippets on the device for one row: x[k - k0] = score_mod(x, b, h, q, k) and
 * vis[k - k0] = mask_mod(b, h, q, k) != 0 for keys k0 .. k0 + n - 1. Built as the library builds
 * them, after nothing of its own but this kernel (docs/variants.md#mods). */
static const char mods_kernel_src[] =
    "\n__kernel void bench_eval_mods(__global float *x, __global int *vis, int b, int h, int q,\n"
    "                              int k0, int n)\n"
    "{\n"
    "    const int i = (int)get_global_id(0);\n"
    "    if (i >= n)\n"
    "        return;\n"
    "#ifdef BENCH_SCORE_MOD\n"
    "    x[i] = score_mod(x[i], b, h, q, k0 + i);\n"
    "#endif\n"
    "#ifdef BENCH_MASK_MOD\n"
    "    vis[i] = mask_mod(b, h, q, k0 + i) != 0;\n"
    "#endif\n"
    "}\n";

/* @return 0 with the evaluator built (once a run: every variant row has the same snippets), or -1
 * with the reason printed once (the check then says it cannot check the row). */
static int mods_ready(bench *bn, size_t n)
{
    if (bn->mods_failed)
        return -1;
    cl_int err;
    if (!bn->mods_kernel) {
        const char *parts[3] = {bn->opt.score_mod ? bn->opt.score_mod : "",
                                bn->opt.mask_mod ? bn->opt.mask_mod : "", mods_kernel_src};
        const char *nl[3] = {"\n", "\n", ""};
        const char *src[5] = {parts[0], nl[0], parts[1], nl[1], parts[2]};
        char opts[96];
        snprintf(opts, sizeof opts, "-cl-std=CL1.2%s%s", bn->opt.score_mod ? " -DBENCH_SCORE_MOD" : "",
                 bn->opt.mask_mod ? " -DBENCH_MASK_MOD" : "");
        bn->mods_prog = clCreateProgramWithSource(bn->clctx, 5, src, NULL, &err);
        check_cl(err, "clCreateProgramWithSource");
        if (clBuildProgram(bn->mods_prog, 1, &bn->dev, opts, NULL, NULL) != CL_SUCCESS ||
            !(bn->mods_kernel = clCreateKernel(bn->mods_prog, "bench_eval_mods", &err))) {
            static char log[4096];
            log[0] = '\0';
            clGetProgramBuildInfo(bn->mods_prog, bn->dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
            log[sizeof log - 1] = '\0';
            fprintf(stderr, "check: the score_mod/mask_mod snippets did not build on their own for the "
                            "reference; rows with them are not checked:\n%s\n", log);
            bn->mods_failed = 1;
            return -1;
        }
    }
    if (n > bn->mods_cap) {
        cl_mem m[2] = {bn->mods_x, bn->mods_vis};
        release(m, 2);
        bn->mods_x = clCreateBuffer(bn->clctx, CL_MEM_READ_WRITE, n * sizeof(float), NULL, &err);
        check_cl(err, "clCreateBuffer");
        bn->mods_vis = clCreateBuffer(bn->clctx, CL_MEM_READ_WRITE, n * sizeof(cl_int), NULL, &err);
        check_cl(err, "clCreateBuffer");
        bn->mods_cap = n;
    }
    return 0;
}

/* Evaluates the --score-mod / --mask-mod snippets on the device for keys k0 .. k0 + n - 1 of one
 * row (n >= 1): x[k] = score_mod(x[k], b, h, p, k0 + k), vis[k] = mask_mod(b, h, p, k0 + k) != 0
 * (each only where its snippet is given). @return 0, or -1 when the evaluator is unavailable. */
static int mods_eval(bench *bn, long long b, long long h, long long p, long long k0, long long n, float *x,
                     cl_int *vis)
{
    if (mods_ready(bn, (size_t)n))
        return -1;
    const cl_int a[5] = {(cl_int)b, (cl_int)h, (cl_int)p, (cl_int)k0, (cl_int)n};
    check_cl(clSetKernelArg(bn->mods_kernel, 0, sizeof(cl_mem), &bn->mods_x), "clSetKernelArg");
    check_cl(clSetKernelArg(bn->mods_kernel, 1, sizeof(cl_mem), &bn->mods_vis), "clSetKernelArg");
    for (int i = 0; i < 5; i++)
        check_cl(clSetKernelArg(bn->mods_kernel, (cl_uint)(2 + i), sizeof(cl_int), &a[i]), "clSetKernelArg");
    const size_t global = (size_t)n;
    check_cl(clEnqueueWriteBuffer(bn->queue, bn->mods_x, CL_FALSE, 0, global * sizeof(float), x, 0, NULL, NULL),
             "clEnqueueWriteBuffer");
    check_cl(clEnqueueNDRangeKernel(bn->queue, bn->mods_kernel, 1, NULL, &global, NULL, 0, NULL, NULL),
             "clEnqueueNDRangeKernel");
    check_cl(clEnqueueReadBuffer(bn->queue, bn->mods_x, CL_FALSE, 0, global * sizeof(float), x, 0, NULL, NULL),
             "clEnqueueReadBuffer");
    if (bn->opt.mask_mod)
        check_cl(clEnqueueReadBuffer(bn->queue, bn->mods_vis, CL_FALSE, 0, global * sizeof(cl_int), vis, 0,
                                     NULL, NULL),
                 "clEnqueueReadBuffer");
    check_cl(clFinish(bn->queue), "clFinish");
    return 0;
}

/* Applies the mods to keys k0 .. k0 + n - 1 of one row: sc[k] is the logit after the softcap, the
 * mask and ALiBi (-inf: hidden already, left alone); afterwards score_mod's value, or -inf where
 * mask_mod hides the key. @return 0, or -1 when the evaluator is unavailable. */
static int apply_mods(bench *bn, const shape *s, long long b, long long h, long long p, long long k0,
                      long long n, double *sc)
{
    if (n <= 0)
        return 0;
    float *x = xmalloc_n((uint64_t)n, sizeof *x);
    cl_int *vis = xmalloc_n((uint64_t)n, sizeof *vis);
    for (long long k = 0; k < n; k++)
        x[k] = (float)sc[k0 + k];
    const int r = mods_eval(bn, b, h, p, k0, n, x, vis);
    for (long long k = 0; k < n && !r; k++) {
        if (sc[k0 + k] == -INFINITY)
            continue;
        if (s->mask_mod && !vis[k])
            sc[k0 + k] = -INFINITY;
        else if (s->score_mod)
            sc[k0 + k] = (double)x[k];
    }
    free(x);
    free(vis);
    return r;
}

/* Host values of a run's per-head variant tensors, f32 as the device holds them (NULL: none). */
typedef struct variant_data {
    const float *sinks;  /* [Hq] */
    const float *slopes; /* [Hq] */
} variant_data;

/*
 * Checks scores (scores != 0: out is [B][Hq][Sq][Skv], scale·QKᵀ + mask with hidden keys -inf) or
 * attention (out is [B][Hq][Sq][Dv]; a row with no visible key is 0) against float64 on the sampled
 * rows, with the variants of s in docs/variants.md's order: scale, softcap, the additive mask,
 * ALiBi, then score_mod; visibility from key lengths, causal, the window, the chunk, -inf in the
 * mask and mask_mod; sinks in the denominator only; dropout's z (the reference's ref_dropout_z)
 * on each visible key's weight in the numerator. Q, K, V and the mask are regenerated from
 * their streams in s's layout, K and V with s->hkv heads (V from K's first Dv dims with --mla).
 * @return the largest element error; NAN when a row could not be checked (the mods' evaluator did
 * not build: said once).
 */
static double check_attention(bench *bn, const shape *s, cl_mem out, int scores, const variant_data *vd)
{
    const long long B = s->b, Hq = s->hq, Hkv = s->hkv, Sq = s->sq, Skv = s->skv, D = s->d,
                    Dv = s->dv, group = Hq / Hkv;
    /* what scale = 0 resolves to, or the float the desc holds */
    const double scale = s->scale > 0.0f ? (double)s->scale : (double)(float)(1.0 / sqrt((double)D));
    const double cap = (double)s->softcap;
    const double cost = (double)B * Hq * Sq * Skv * (scores ? D : D + Dv);
    size_t n;
    rowpick *rows = pick_rows(B, Hq, Sq, cost, &n);
    double *kh = xmalloc_n((uint64_t)(Skv * D), sizeof *kh);
    double *vh = scores ? NULL : xmalloc_n((uint64_t)(Skv * Dv), sizeof *vh);
    double *q = xmalloc_n((uint64_t)D, sizeof *q), *sc = xmalloc_n((uint64_t)Skv, sizeof *sc);
    /* a KV row's stored bytes of one K or V row (f32 is the widest type) */
    unsigned char *raw = s->kv ? xmalloc_n((uint64_t)(D > Dv ? D : Dv), 4) : NULL;
    const long long width = scores ? Skv : Dv;
    double *got = xmalloc_n((uint64_t)width, sizeof *got), *want = xmalloc_n((uint64_t)width, sizeof *want);
    long long cached_b = -1, cached_kvh = -1;
    double worst = 0.0;
    for (size_t r = 0; r < n; r++) {
        const long long b = rows[r].b, h = rows[r].h, i = rows[r].i, kvh = h / group;
        if (b != cached_b || kvh != cached_kvh) {
            const uint64_t kb = (uint64_t)((b * Hkv + kvh) * Skv);
            if (s->kv) { /* the stored bytes, decoded by the reference (ref/clattn_ref_kv.c) */
                for (long long j = 0; j < Skv; j++) {
                    double f = kv_row(ID_K, s->kt, kb + (uint64_t)j, D, raw);
                    ref_kv_decode_row((int)s->kt, raw, (int)D, f, kh + j * D);
                    if (!vh || s->mla)
                        continue;
                    f = kv_row(ID_V, s->vt, kb + (uint64_t)j, Dv, raw);
                    ref_kv_decode_row((int)s->vt, raw, (int)Dv, f, vh + j * Dv);
                }
            } else {
                for (long long j = 0; j < Skv * D; j++)
                    kh[j] = gen_stored(ID_K, kb * (uint64_t)D + (uint64_t)j, s->dt);
            }
            if (vh && s->mla)
                for (long long j = 0; j < Skv; j++)
                    for (long long e = 0; e < Dv; e++)
                        vh[j * Dv + e] = kh[j * D + e];
            else if (vh && !s->kv)
                for (long long j = 0; j < Skv; j++)
                    for (long long e = 0; e < Dv; e++)
                        vh[j * Dv + e] = gen_stored(ID_V, (kb + (uint64_t)j) * (uint64_t)Dv + (uint64_t)e, s->dt);
            cached_b = b;
            cached_kvh = kvh;
        }
        const uint64_t row = (uint64_t)((b * Hq + h) * Sq + i);
        for (long long d = 0; d < D; d++)
            q[d] = gen_stored(ID_Q, row * (uint64_t)D + (uint64_t)d, s->dt);
        const long long p = diag_pos(bn, s, b, i);
        long long lo, hi;
        row_span(bn, s, b, i, &lo, &hi);
        const double slope = vd && vd->slopes ? (double)vd->slopes[h] : 0.0;
        for (long long j = 0; j < Skv; j++)
            sc[j] = -INFINITY;
        for (long long j = lo; j <= hi; j++) {
            if (mask_at(s, i, j) == -INFINITY)
                continue;
            double acc = 0.0;
            for (long long d = 0; d < D; d++)
                acc += q[d] * kh[j * D + d];
            sc[j] = cap > 0.0 ? cap * tanh(acc * scale / cap) : acc * scale;
            sc[j] += mask_at(s, i, j) - slope * (double)llabs(p - j);
        }
        if ((s->score_mod || s->mask_mod) && apply_mods(bn, s, b, h, p, lo, hi - lo + 1, sc)) {
            worst = NAN;
            break;
        }
        double m = -INFINITY;
        for (long long j = lo; j <= hi; j++)
            if (sc[j] != -INFINITY && sc[j] > m)
                m = sc[j];
        if (scores) {
            for (long long j = 0; j < Skv; j++)
                want[j] = sc[j];
        } else {
            /* A sink joins the denominator only, and the running maximum: -inf is none. */
            const double sink = vd && vd->sinks ? (double)vd->sinks[h] : -INFINITY;
            if (sink > m)
                m = sink;
            for (long long e = 0; e < Dv; e++)
                want[e] = 0.0;
            double l = sink == -INFINITY ? 0.0 : exp(sink - m);
            for (long long j = lo; j <= hi; j++) {
                if (sc[j] == -INFINITY)
                    continue;
                const double w = exp(sc[j] - m);
                l += w; /* dropout leaves the denominator alone */
                const double z = dropout_z(bn, s, b, h, p, j);
                for (long long e = 0; e < Dv; e++)
                    want[e] += w * z * vh[j * Dv + e];
            }
            for (long long e = 0; e < Dv && l > 0.0; e++)
                want[e] /= l;
        }
        read_row(bn, out, row * (uint64_t)width, (size_t)width, s->dt, got);
        for (long long e = 0; e < width; e++) {
            const double err = elem_err(got[e], want[e], fabs(want[e]) > 1.0 ? fabs(want[e]) : 1.0);
            if (err > worst)
                worst = err;
        }
    }
    free(rows);
    free(kh);
    free(vh);
    free(raw);
    free(q);
    free(sc);
    free(got);
    free(want);
    return worst;
}

/* Softmax rows of in + mask: error relative to the row's largest probability (probabilities are
 * ~1/cols, so an absolute tolerance meant for O(1) values would check nothing); a row with no
 * visible column is 0. */
static double check_softmax(bench *bn, const shape *s, cl_mem out)
{
    const long long cols = s->skv;
    size_t n;
    rowpick *rows = pick_rows(s->b, s->hq, s->sq, (double)s->b * s->hq * s->sq * cols, &n);
    double *got = xmalloc_n((uint64_t)cols, sizeof *got), *want = xmalloc_n((uint64_t)cols, sizeof *want);
    double worst = 0.0;
    for (size_t r = 0; r < n; r++) {
        const uint64_t row = (uint64_t)((rows[r].b * s->hq + rows[r].h) * s->sq + rows[r].i);
        const long long end = row_end(bn, s, rows[r].b, rows[r].i);
        double m = -INFINITY, l = 0.0, top = 0.0;
        for (long long j = 0; j < end; j++) {
            want[j] = gen_stored(ID_S, row * (uint64_t)cols + (uint64_t)j, s->dt) + mask_at(s, rows[r].i, j);
            if (want[j] > m)
                m = want[j];
        }
        for (long long j = 0; j < end; j++)
            l += want[j] = want[j] == -INFINITY ? 0.0 : exp(want[j] - m);
        for (long long j = 0; j < cols; j++) {
            want[j] = j < end && l > 0.0 ? want[j] / l : 0.0;
            if (want[j] > top)
                top = want[j];
        }
        read_row(bn, out, row * (uint64_t)cols, (size_t)cols, s->dt, got);
        for (long long j = 0; j < cols; j++) {
            const double err = elem_err(got[j], want[j], top > 0.0 ? top : 1.0);
            if (err > worst)
                worst = err;
        }
    }
    free(rows);
    free(got);
    free(want);
    return worst;
}

/* ------------------------------------------------------------------------------------------ */
/* Timing                                                                                       */

typedef int (*enqueue_fn)(bench *bn, void *job);

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Warm-up, then `iters` timed runs of enqueue + clFinish. @return 0, or OP_SKIPPED. */
static int measure(bench *bn, enqueue_fn fn, void *job, double *med, double *mn)
{
    const int iters = bn->opt.iters, total = bn->opt.warmup + iters;
    double *t = xmalloc((size_t)iters * sizeof *t);
    for (int it = 0; it < total; it++) {
        const double t0 = now_ms();
        const int r = fn(bn, job);
        if (r) {
            free(t);
            return r;
        }
        check_cl(clFinish(bn->queue), "clFinish");
        const double t1 = now_ms();
        if (it >= bn->opt.warmup)
            t[it - bn->opt.warmup] = t1 - t0;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    *med = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
    *mn = t[0];
    free(t);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Output                                                                                       */

static void csv_field_text(const char *s)
{
    if (!strpbrk(s, ",\"\n")) {
        fputs(s, stdout);
        return;
    }
    putchar('"');
    for (; *s; s++) {
        if (*s == '"')
            putchar('"');
        putchar(*s == '\n' ? ' ' : *s);
    }
    putchar('"');
}

static void csv_num(double v, const char *fmt)
{
    putchar(',');
    if (!isnan(v))
        printf(fmt, v);
}

static void print_header(bench *bn)
{
    if (bn->header_done)
        return;
    bn->header_done = 1;
    if (bn->opt.csv) {
        /* the KV columns only in a run with KV options: other runs keep the columns readers know */
        printf("op,device,dtype,B,Hq,Hkv,Sq,Skv,D,causal,ms_median,ms_min,gflops,gbps,ratio_name,ratio,"
               "mask%s\n",
               bn->opt.kv ? ",kv_k,kv_v,page,page_layout,kv_gbps,kv_gbps_ratio,same_layout_ratio" : "");
        return;
    }
    printf("%-8s %-5s %3s %4s %4s %6s %7s %7s %6s %-*s %10s %10s %9s %8s%s%s\n", "op", "dtype", "B", "Hq",
           "Hkv", "Sq", "Skv", "D", "causal", bn->mask_width, "mask", "median ms", "min ms", "GFLOP/s",
           "GB/s", bn->opt.kv ? "   KV GB/s" : "", bn->opt.check ? "  check (max err / tol)" : "");
}

static void fmt_num(char *buf, size_t size, double v, const char *fmt)
{
    if (isnan(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, fmt, v);
}

/* Appends "+" (unless buf is empty) and the formatted text to buf, whose length is *n. */
static void desc_add(char *buf, size_t size, size_t *n, const char *fmt, ...)
{
    if (*n + 1 >= size)
        return;
    if (*n)
        buf[(*n)++] = '+';
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(buf + *n, size - *n, fmt, ap);
    va_end(ap);
    *n = w < 0 ? *n : *n + (size_t)w < size ? *n + (size_t)w : size - 1;
}

/* A window extent as the mask column shows it: "inf" when unbounded. */
static const char *extent(long long v, char *buf, size_t size)
{
    if (v < 0)
        snprintf(buf, size, "inf");
    else
        snprintf(buf, size, "%lld", v);
    return buf;
}

/* The masks and variants of s as the mask column shows them, joined by "+": none, bias, window:W
 * (the W keys ending at the diagonal) or window:L:R (a dense window mask of any extents), kvlen;
 * then the variants: win:L:R, chunk:C, softcap:c, sinks:rand or sinks:V, alibi:B, score_mod,
 * mask_mod, and mla (V a view of K); a KV row's storage, kv:T (kv:K/V where they differ), and
 * page:N:nhd or page:N:hnd, or bshd (contiguous in [B][Skv][Hkv][D] order); varlen:packed or
 * varlen:each (--varlen); drop:P (dropout). No commas: the CSV writes the column as it is. */
static void mask_desc(const shape *s, char *buf, size_t size)
{
    size_t n = 0;
    char a[24], b[24];
    buf[0] = '\0';
    if (s->mask == MASK_WINDOW && s->mask_left >= 0 && s->mask_right == 0)
        desc_add(buf, size, &n, "window:%lld", s->mask_left + 1);
    else if (s->mask == MASK_WINDOW)
        desc_add(buf, size, &n, "window:%s:%s", extent(s->mask_left, a, sizeof a),
                 extent(s->mask_right, b, sizeof b));
    else if (s->mask == MASK_BIAS)
        desc_add(buf, size, &n, "bias");
    if (s->kv_lens)
        desc_add(buf, size, &n, "kvlen");
    if (s->window)
        desc_add(buf, size, &n, "win:%s:%s", extent(s->win_left, a, sizeof a), extent(s->win_right, b, sizeof b));
    if (s->chunk)
        desc_add(buf, size, &n, "chunk:%lld", s->chunk);
    if (s->softcap > 0.0f)
        desc_add(buf, size, &n, "softcap:%g", (double)s->softcap);
    if (s->sinks == SINKS_RANDOM)
        desc_add(buf, size, &n, "sinks:rand");
    else if (s->sinks)
        desc_add(buf, size, &n, "sinks:%g", (double)s->sink_value);
    if (s->alibi > 0.0f)
        desc_add(buf, size, &n, "alibi:%g", (double)s->alibi);
    if (s->score_mod)
        desc_add(buf, size, &n, "score_mod");
    if (s->mask_mod)
        desc_add(buf, size, &n, "mask_mod");
    if (s->mla)
        desc_add(buf, size, &n, "mla");
    if (s->kv && s->kt == s->vt)
        desc_add(buf, size, &n, "kv:%s", clattn_dtype_name(s->kt));
    else if (s->kv)
        desc_add(buf, size, &n, "kv:%s/%s", clattn_dtype_name(s->kt), clattn_dtype_name(s->vt));
    if (s->kv && s->page)
        desc_add(buf, size, &n, "page:%lld:%s", s->page, s->hnd ? "hnd" : "nhd");
    else if (s->kv && s->bshd)
        desc_add(buf, size, &n, "bshd");
    if (s->varlen)
        desc_add(buf, size, &n, s->varlen == 1 ? "varlen:packed" : "varlen:each");
    if (s->dropout > 0.0f)
        desc_add(buf, size, &n, "drop:%g", (double)s->dropout);
    if (!n)
        snprintf(buf, size, "none");
}

static void emit(bench *bn, const result *r)
{
    print_header(bn);
    const shape *s = &r->s;
    char mask[160] = "";
    if (r->has_shape)
        mask_desc(s, mask, sizeof mask);
    if (bn->opt.csv) {
        csv_field_text(r->op);
        putchar(',');
        csv_field_text(bn->dev_name);
        printf(",%s", r->dtype);
        if (r->has_shape) {
            printf(",%lld,%lld,%lld,%lld,%lld,", s->b, s->hq, s->hkv, s->sq, s->skv);
            if (s->d > 0) /* softmax has no head dimension */
                printf("%lld", s->d);
            printf(",%d", s->causal);
        } else
            fputs(",,,,,,,", stdout);
        csv_num(r->ms_med, "%.6g");
        csv_num(r->ms_min, "%.6g");
        csv_num(r->gflops, "%.6g");
        csv_num(r->gbps, "%.6g");
        printf(",%s", r->ratio_name && !isnan(r->ratio) ? r->ratio_name : "");
        csv_num(r->ratio_name ? r->ratio : NAN, "%.4g");
        printf(",%s", mask);
        if (bn->opt.kv && !isnan(r->kv_gbps))
            printf(",%s,%s,%lld,%s", clattn_dtype_name(k_type(s)), clattn_dtype_name(v_type(s)),
                   s->kv ? s->page : 0LL,
                   s->kv && s->page ? (s->hnd ? "hnd" : "nhd") : s->kv && s->bshd ? "bshd" : "");
        else if (bn->opt.kv)
            fputs(",,,,", stdout);
        if (bn->opt.kv) {
            csv_num(r->kv_gbps, "%.6g");
            csv_num(r->kv_ratio, "%.4g");
            csv_num(r->layout_ratio, "%.4g");
        }
        putchar('\n');
        fflush(stdout);
        const int described = masked(s) || has_variant(s) || s->kv || s->varlen || s->dropout > 0.0f;
        if (r->checked)
            fprintf(stderr, "check %s%s%s%s %s: max err %.3g, tolerance %.3g: %s\n", r->op,
                    s->causal ? " causal" : "", described ? " mask " : "", described ? mask : "",
                    r->dtype, r->err, r->tol, r->err <= r->tol ? "ok" : "FAILED");
    } else {
        char n[8][32];
        if (r->has_shape) {
            snprintf(n[0], 32, "%lld", s->b);
            snprintf(n[1], 32, "%lld", s->hq);
            snprintf(n[2], 32, "%lld", s->hkv);
            snprintf(n[3], 32, "%lld", s->sq);
            snprintf(n[4], 32, "%lld", s->skv);
            if (s->d == 0)
                snprintf(n[5], 32, "-");
            else if (s->dv != s->d)
                snprintf(n[5], 32, "%lld/%lld", s->d, s->dv);
            else
                snprintf(n[5], 32, "%lld", s->d);
            snprintf(n[6], 32, "%s", s->causal ? "yes" : "no");
        } else {
            for (int i = 0; i < 7; i++)
                snprintf(n[i], 32, "-");
            snprintf(mask, sizeof mask, "-");
        }
        char ms[2][32], gf[32], gb[32], kvb[48] = "", chk[64] = "";
        fmt_num(ms[0], 32, r->ms_med, "%.3f");
        fmt_num(ms[1], 32, r->ms_min, "%.3f");
        fmt_num(gf, 32, r->gflops, "%.2f");
        fmt_num(gb, 32, r->gbps, "%.2f");
        if (bn->opt.kv) {
            char t[32];
            fmt_num(t, sizeof t, r->kv_gbps, "%.2f");
            snprintf(kvb, sizeof kvb, "  %8s", t);
        }
        if (r->checked)
            snprintf(chk, sizeof chk, "  %.2e / %.0e %s", r->err, r->tol,
                     r->err <= r->tol ? "ok" : "FAILED");
        printf("%-8s %-5s %3s %4s %4s %6s %7s %7s %6s %-*s %10s %10s %9s %8s%s%s\n", r->op, r->dtype,
               n[0], n[1], n[2], n[3], n[4], n[5], n[6], bn->mask_width, mask, ms[0], ms[1], gf, gb, kvb, chk);
    }
    fflush(stdout);
    if (r->checked && !(r->err <= r->tol))
        bn->check_failed = 1;
}

/* Appends the parameters that clattn gives operation `op` for this problem class ("decode f32
 * d128 kv8192: WGX=32 WGY=4 ... [vendor: vendor defaults (NVIDIA GPUs)]"), once per distinct
 * line: a sweep reads here which values it measured. */
static void note_params(bench *bn, clattn_operation op, clattn_dtype dt, long long d, long long sq,
                        long long skv, int causal, int masked, const shape *s)
{
    const clattn_problem_class pc = {
        .operation = op, .dtype = dt, .head_dim = d, .seq_q = sq, .seq_kv = skv, .causal = causal, .masked = masked};
    /* On GPUs decode's defaults depend on the query rows per kv head: given the head counts,
     * clattn_get_call_params answers with the values the call runs (and says so in origin). */
    clattn_kernel_params kp;
    const clattn_status st = op == CLATTN_OPERATION_DECODE && s
                                 ? clattn_get_call_params(bn->ctx, &pc, s->hq, s->hkv, s->dv, &kp)
                                 : clattn_get_params(bn->ctx, &pc, &kp);
    if (st != CLATTN_SUCCESS)
        return;
    char line[1024];
    int n;
    if (op == CLATTN_OPERATION_MERGE)
        n = snprintf(line, sizeof line, "  %-7s:", clattn_operation_name(op));
    else if (op == CLATTN_OPERATION_SOFTMAX)
        n = snprintf(line, sizeof line, "  %-7s %s rows %lld cols %lld%s%s:", clattn_operation_name(op),
                     clattn_dtype_name(dt), sq, skv, causal ? " causal" : "", masked ? " masked" : "");
    else
        n = snprintf(line, sizeof line, "  %-7s %s d%lld sq%lld kv%lld%s%s:", clattn_operation_name(op),
                     clattn_dtype_name(dt), d, sq, skv, causal ? " causal" : "", masked ? " masked" : "");
    for (int i = 0; i < kp.count && n > 0 && (size_t)n < sizeof line; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %s=%d", clattn_param_name(op, i), kp.values[i]);
    if (n > 0 && (size_t)n < sizeof line)
        snprintf(line + n, sizeof line - (size_t)n, "  [%s: %s]\n", clattn_params_source_name(kp.source),
                 kp.origin);
    const size_t have = strlen(bn->params);
    if (!strstr(bn->params, line) && have + strlen(line) < sizeof bn->params)
        memcpy(bn->params + have, line, strlen(line) + 1);
}

/* The parameters behind one measured line of kind `kind` (the library picks the decode
 * operation for fused attention of at most 16 query rows, as fused.c does; merge follows any
 * split launch, prefill included). */
static void note_attn_params(bench *bn, int kind, const shape *s)
{
    if (kind == OP_SCORES || kind == OP_UNFUSED) {
        note_params(bn, CLATTN_OPERATION_SCORES, s->dt, s->d, s->sq, s->skv, s->causal, masked(s), NULL);
        if (kind == OP_SCORES)
            return;
        /* the unfused path's softmax sees the masks in its input already */
        note_params(bn, CLATTN_OPERATION_SOFTMAX, CLATTN_F32, 0, s->sq, s->skv, 0, 0, NULL);
        note_params(bn, CLATTN_OPERATION_PV, s->dt, s->d, s->sq, s->skv, s->causal, masked(s), NULL);
        return;
    }
    note_params(bn, s->sq <= 16 ? CLATTN_OPERATION_DECODE : CLATTN_OPERATION_FUSED, s->dt, s->d, s->sq,
                s->skv, s->causal, masked(s), s);
    note_params(bn, CLATTN_OPERATION_MERGE, CLATTN_F32, 0, 0, 0, 0, 0, NULL); /* when the keys are split */
}

/* A CLATTN_PARAMS_<OP> list the library cannot use would leave a sweep measuring other values
 * than it names: refuse to run instead. */
static void check_env_params(bench *bn)
{
    for (int op = 0; op < CLATTN_OPERATION_COUNT; op++) {
        char name[64];
        snprintf(name, sizeof name, "CLATTN_PARAMS_%s", clattn_operation_name((clattn_operation)op));
        for (char *c = name; *c; c++)
            if (*c >= 'a' && *c <= 'z')
                *c = (char)(*c - 'a' + 'A');
        const char *env = getenv(name);
        if (!env || !*env)
            continue;
        const clattn_problem_class pc = {
            .operation = (clattn_operation)op, .dtype = CLATTN_F32,
            .head_dim = op == CLATTN_OPERATION_SOFTMAX || op == CLATTN_OPERATION_MERGE ? 0 : 64, .seq_q = 1,
            .seq_kv = 1024};
        clattn_kernel_params kp;
        if (clattn_get_params(bn->ctx, &pc, &kp) == CLATTN_SUCCESS && kp.source != CLATTN_SOURCE_ENVIRONMENT) {
            const char *why = strstr(kp.origin, name);
            if (why)
                die(EXIT_USAGE, "%s; refusing to measure other values than it names", why);
            die(EXIT_USAGE, "%s=\"%s\" is not a list of 1 to %d integers in [0, 4096], choices at most "
                "clattn_param_max (names: clattn-info); refusing to measure other values than it names",
                name, env,
                clattn_param_count((clattn_operation)op));
        }
    }
}

static void add_ratio(bench *bn, const char *what, const char *how, double v)
{
    if (isnan(v) || bn->n_ratios >= (int)(sizeof bn->ratios / sizeof bn->ratios[0]))
        return;
    bn->ratios[bn->n_ratios].what = what;
    bn->ratios[bn->n_ratios].how = how;
    bn->ratios[bn->n_ratios].v = v;
    bn->n_ratios++;
}

static result new_result(const char *op, const shape *s)
{
    result r;
    memset(&r, 0, sizeof r);
    r.op = op;
    if (s) {
        r.has_shape = 1;
        r.s = *s;
        r.dtype = clattn_dtype_name(s->dt);
    } else {
        r.dtype = "-";
    }
    r.gflops = r.gbps = r.ratio = r.err = r.kv_gbps = r.kv_ratio = r.layout_ratio = NAN;
    return r;
}

/* ------------------------------------------------------------------------------------------ */
/* Operations                                                                                   */

typedef struct copy_job {
    cl_mem src, dst;
    size_t bytes;
} copy_job;

static int enqueue_copy(bench *bn, void *job)
{
    const copy_job *j = job;
    check_cl(clEnqueueCopyBuffer(bn->queue, j->src, j->dst, 0, 0, j->bytes, 0, NULL, NULL),
             "clEnqueueCopyBuffer");
    return 0;
}

static void run_copy(bench *bn)
{
    copy_job j = {NULL, NULL, (size_t)(bn->gpu ? 256 : 64) << 20};
    if ((cl_ulong)j.bytes > bn->max_alloc)
        j.bytes = (size_t)bn->max_alloc;
    j.src = make_buffer(bn, "copy", j.bytes);
    j.dst = j.src ? make_buffer(bn, "copy", j.bytes) : NULL;
    if (j.dst) {
        const cl_uint pattern = 0x3f800000u; /* 1.0f: pages touched before timing */
        check_cl(clEnqueueFillBuffer(bn->queue, j.src, &pattern, sizeof pattern, 0, j.bytes, 0, NULL,
                                     NULL),
                 "clEnqueueFillBuffer");
        check_cl(clEnqueueFillBuffer(bn->queue, j.dst, &pattern, sizeof pattern, 0, j.bytes, 0, NULL,
                                     NULL),
                 "clEnqueueFillBuffer");
        result r = new_result("copy", NULL);
        if (measure(bn, enqueue_copy, &j, &r.ms_med, &r.ms_min) == 0) {
            r.gbps = 2.0 * (double)j.bytes / (r.ms_med * 1e6);
            bn->copy_gbps = r.gbps;
            emit(bn, &r);
        }
    }
    cl_mem m[2] = {j.src, j.dst};
    release(m, 2);
}

/* The device's fp32 multiply-add ceiling, measured in the same run as the operations it bounds.
 * Each work-item runs 8 independent fma chains (more than a multiply-add unit's latency
 * times its issue rate on current hardware) of float, float4, float8 or float16, 64 multiply-adds
 * a loop iteration so that the loop's own instructions are negligible; the fastest width counts:
 * a GPU wants scalar work-items, a CPU its SIMD width in one work-item (float8 with AVX2, whose
 * 16 registers cannot hold 8 float16 chains and their operands: those spill). b < 1 and c keep the chains
 * bounded and away from denormals; the sums are stored so nothing is dead code. */
static const char peak_src[] =
    "#define FMA8 a0 = fma(a0, b, c); a1 = fma(a1, b, c); a2 = fma(a2, b, c); a3 = fma(a3, b, c); \\\n"
    "             a4 = fma(a4, b, c); a5 = fma(a5, b, c); a6 = fma(a6, b, c); a7 = fma(a7, b, c);\n"
    "#define PEAK(NAME, T) \\\n"
    "__kernel void NAME(__global T *out, int iters, float bs, float cs) \\\n"
    "{ \\\n"
    "    const T b = (T)(bs), c = (T)(cs); \\\n"
    "    const T a = (T)((float)get_global_id(0) * 1e-6f); \\\n"
    "    T a0 = a, a1 = a + 0.1f, a2 = a + 0.2f, a3 = a + 0.3f, a4 = a + 0.4f, a5 = a + 0.5f, \\\n"
    "      a6 = a + 0.6f, a7 = a + 0.7f; \\\n"
    "    for (int i = 0; i < iters; i++) { \\\n"
    "        FMA8 FMA8 FMA8 FMA8 FMA8 FMA8 FMA8 FMA8 \\\n"
    "    } \\\n"
    "    out[get_global_id(0)] = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)); \\\n"
    "}\n"
    "PEAK(peak1, float)\n"
    "PEAK(peak4, float4)\n"
    "PEAK(peak8, float8)\n"
    "PEAK(peak16, float16)\n";
#define PEAK_FMAS_PER_ITER 64 /* peak_src's loop body: FMA8 (8 chains) 8 times */
/* Work-items: PEAK_ITEMS_PER_CU / width per compute unit (enough resident warps or wavefronts
 * on a GPU; on a CPU a few work-groups per thread). Runs are sized to about PEAK_TARGET_MS. */
#define PEAK_ITEMS_PER_CU 2048
#define PEAK_TARGET_MS 20.0

typedef struct peak_job {
    cl_kernel kernel;
    size_t global, local; /* local 0: the implementation's choice */
    cl_int iters;
} peak_job;

static int enqueue_peak(bench *bn, void *job)
{
    const peak_job *j = job;
    check_cl(clSetKernelArg(j->kernel, 1, sizeof j->iters, &j->iters), "clSetKernelArg");
    check_cl(clEnqueueNDRangeKernel(bn->queue, j->kernel, 1, NULL, &j->global,
                                    j->local ? &j->local : NULL, 0, NULL, NULL),
             "clEnqueueNDRangeKernel");
    return 0;
}

static void run_peak(bench *bn)
{
    static const int widths[4] = {1, 4, 8, 16};
    static const char *const kernels[4] = {"peak1", "peak4", "peak8", "peak16"};
    static const char *const dtypes[4] = {"f32", "f32x4", "f32x8", "f32x16"};
    const char *src = peak_src;
    cl_int err;
    cl_program prog = clCreateProgramWithSource(bn->clctx, 1, &src, NULL, &err);
    check_cl(err, "clCreateProgramWithSource");
    if (clBuildProgram(prog, 1, &bn->dev, "-cl-std=CL1.2", NULL, NULL) != CL_SUCCESS) {
        char log[2048] = "";
        clGetProgramBuildInfo(prog, bn->dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        log[sizeof log - 1] = '\0';
        fprintf(bn->opt.csv ? stderr : stdout, "peak: skipped: the kernel did not build: %s\n", log);
        clReleaseProgram(prog);
        return;
    }
    const size_t cus = bn->compute_units ? bn->compute_units : 1;
    result best = new_result("peak", NULL);
    for (int w = 0; w < 4; w++) {
        peak_job j = {NULL, cus * PEAK_ITEMS_PER_CU / (size_t)widths[w], 0, 1};
        j.kernel = clCreateKernel(prog, kernels[w], &err);
        check_cl(err, "clCreateKernel");
        size_t max_local = 0;
        if (bn->gpu && clGetKernelWorkGroupInfo(j.kernel, bn->dev, CL_KERNEL_WORK_GROUP_SIZE,
                                                sizeof max_local, &max_local, NULL) == CL_SUCCESS &&
            max_local >= 128)
            j.local = 128; /* divides global: PEAK_ITEMS_PER_CU / 16 is a multiple of 128 */
        cl_mem out = make_buffer(bn, "peak", j.global * (size_t)widths[w] * sizeof(float));
        if (!out) {
            clReleaseKernel(j.kernel);
            continue;
        }
        const float b = 0.999f, c = 0.001f;
        check_cl(clSetKernelArg(j.kernel, 0, sizeof out, &out), "clSetKernelArg");
        check_cl(clSetKernelArg(j.kernel, 2, sizeof b, &b), "clSetKernelArg");
        check_cl(clSetKernelArg(j.kernel, 3, sizeof c, &c), "clSetKernelArg");
        /* Calibration: a first launch (a CPU runtime may compile the work-group function now),
         * then timed launches scaled towards the target until one is long enough that launch
         * overhead no longer distorts the scaling. */
        j.iters = 16;
        for (int k = 0; k < 5; k++) {
            const double t0 = now_ms();
            enqueue_peak(bn, &j);
            check_cl(clFinish(bn->queue), "clFinish");
            const double t = now_ms() - t0;
            if (k == 0)
                continue;
            const double scaled = j.iters * PEAK_TARGET_MS / (t > 1e-3 ? t : 1e-3);
            j.iters = scaled < 16 ? 16 : scaled > (1 << 24) ? (1 << 24) : (cl_int)scaled;
            if (t >= PEAK_TARGET_MS / 4)
                break;
        }
        result r = new_result("peak", NULL);
        if (measure(bn, enqueue_peak, &j, &r.ms_med, &r.ms_min) == 0) {
            /* From the fastest run: a ceiling, which interference only ever lowers. */
            r.gflops = 2.0 * PEAK_FMAS_PER_ITER * widths[w] * (double)j.iters * (double)j.global /
                       (r.ms_min * 1e6);
            r.dtype = dtypes[w];
            if (isnan(best.gflops) || r.gflops > best.gflops)
                best = r;
        }
        clReleaseMemObject(out);
        clReleaseKernel(j.kernel);
    }
    clReleaseProgram(prog);
    if (!isnan(best.gflops)) {
        bn->peak_gflops = best.gflops;
        emit(bn, &best);
    }
}

/* Attention, scores and decode share one job: which call is made depends on `kind`. */
typedef struct attn_job {
    int kind; /* OP_SCORES, or an attention op */
    clattn_attention_desc desc;
    clattn_tensor q, k, v, o, mask, sinks, slopes;
    clattn_kv_layout kv;   /* a KV row's */
    clattn_tensor ks, vs;  /* its i8 scales */
} attn_job;

static int enqueue_attn(bench *bn, void *job)
{
    attn_job *j = job;
    const clattn_status st =
        j->kind == OP_SCORES
            ? clattn_scores(bn->ctx, &j->desc, &j->q, &j->k, &j->o, 0, NULL, NULL)
            : clattn_attention(bn->ctx, &j->desc, &j->q, &j->k, &j->v, &j->o, 0, NULL, NULL);
    if (st == CLATTN_UNSUPPORTED) {
        fprintf(stderr, "%s: skipped: %s\n", op_names[j->kind], clattn_last_error(bn->ctx));
        return OP_SKIPPED;
    }
    if (st != CLATTN_SUCCESS)
        die_clattn(bn, op_names[j->kind], st);
    return 0;
}

/* Query-key pairs that contribute, summed over the batch (per head): exact under causal masking,
 * key lengths, the window mask, the window and the chunk; mask_mod's hidden pairs count as
 * visible (the host cannot evaluate it). */
static double visible_pairs(const bench *bn, const shape *s)
{
    if (!s->causal && !s->kv_lens && s->mask != MASK_WINDOW && !s->window && !s->chunk)
        return (double)s->b * (double)s->sq * (double)s->skv;
    double n = 0.0;
    for (long long b = 0; b < s->b; b++)
        for (long long i = 0; i < s->sq; i++)
            n += (double)row_visible(bn, s, b, i);
    return n;
}

/* Bytes of K and V an operation has to read: each kv head's rows of the keys that some query row
 * of its batch sees (key lengths, causal masking, windows and chunks counted exactly; a bias mask
 * and mask_mod hide nothing). A window's hidden keys need no K or V read, so they must not count
 * as bytes moved. With --mla V is part of K's rows: K alone counts. A KV row counts the bytes its
 * storage types hold (key_bytes). */
static double kv_bytes(const bench *bn, const shape *s)
{
    double keys = 0.0;
    for (long long b = 0; b < s->b; b++) {
        /* Both ends of a row's run grow with the row: count the keys past the highest one an
         * earlier row saw. */
        long long seen = -1; /* highest key counted so far */
        for (long long i = 0; i < s->sq; i++) {
            long long lo, hi;
            row_span(bn, s, b, i, &lo, &hi);
            if (hi >= lo && hi > seen) {
                keys += (double)(hi - (lo > seen ? lo : seen + 1) + 1);
                seen = hi;
            }
        }
    }
    return keys * (double)s->hkv * key_bytes(s);
}

/* The slopes clattn_alibi_slopes should give (BLOOM's and ggml's formula, docs/variants.md), to
 * catch a library that drifts from it. */
static double alibi_formula(long long heads, double max_bias, long long h)
{
    long long n = 1;
    while (n * 2 <= heads)
        n *= 2;
    return h < n ? pow(pow(2.0, -max_bias / (double)n), (double)(h + 1))
                 : pow(pow(2.0, -max_bias / (2.0 * (double)n)), (double)(2 * (h - n) + 1));
}

/* Host values of s's sinks and ALiBi slopes into hs[0 .. hq) and ha[0 .. hq) (where s has them),
 * uploaded into m[0] and m[1] as f32 [1][Hq][1][1]. @return 0, or OP_SKIPPED. */
static int make_variant_tensors(bench *bn, const char *op, const shape *s, cl_mem *m, float **hs,
                                float **ha)
{
    *hs = *ha = NULL;
    const size_t bytes = (size_t)s->hq * sizeof(float);
    if (s->sinks) {
        *hs = xmalloc(bytes);
        for (long long h = 0; h < s->hq; h++)
            (*hs)[h] = s->sinks == SINKS_VALUE
                           ? s->sink_value
                           : (float)((gen(ID_SINK, (uint64_t)h) + 1.0) * 0.5 * log((double)s->skv));
        if (!(m[0] = make_buffer(bn, op, bytes)))
            return OP_SKIPPED;
        check_cl(clEnqueueWriteBuffer(bn->queue, m[0], CL_TRUE, 0, bytes, *hs, 0, NULL, NULL),
                 "clEnqueueWriteBuffer");
    }
    if (s->alibi > 0.0f) {
        *ha = xmalloc(bytes);
        if (s->hq > INT32_MAX)
            die(EXIT_USAGE, "--alibi: %lld heads do not fit clattn_alibi_slopes' int", s->hq);
        const clattn_status st = clattn_alibi_slopes((int)s->hq, s->alibi, *ha);
        if (st != CLATTN_SUCCESS)
            die_clattn(bn, "clattn_alibi_slopes", st);
        for (long long h = 0; h < s->hq && bn->opt.check; h++) {
            const double want = alibi_formula(s->hq, (double)s->alibi, h);
            if (!(fabs((double)(*ha)[h] - want) <= 1e-6 * want)) {
                fprintf(stderr, "check: clattn_alibi_slopes(%lld, %g) gives %.9g for head %lld, the formula %.9g\n",
                        s->hq, (double)s->alibi, (double)(*ha)[h], h, want);
                bn->check_failed = 1;
                break;
            }
        }
        if (!(m[1] = make_buffer(bn, op, bytes)))
            return OP_SKIPPED;
        check_cl(clEnqueueWriteBuffer(bn->queue, m[1], CL_TRUE, 0, bytes, *ha, 0, NULL, NULL),
                 "clEnqueueWriteBuffer");
    }
    return 0;
}

/* An attention op's device buffers and call on one shape, made by attn_setup, freed by
 * attn_free. Not moved once made: the job's descriptor points into it. */
typedef struct attn_run {
    attn_job j;
    /* q, k, v, out, mask, key lengths, sinks, ALiBi slopes; a KV row's block table, K and V
     * scales (i8) */
    cl_mem m[11];
    float *sinks, *slopes; /* host values of m[6] and m[7] (NULL: none) */
    kv_pages pg;
    uint64_t nq, no;       /* elements of q and out */
} attn_run;

static void attn_free(attn_run *a)
{
    release(a->m, 11);
    free(a->sinks);
    free(a->slopes);
    kv_pages_free(&a->pg);
    memset(a, 0, sizeof *a);
}

/* The buffers of scores, unfused, fused or decode on shape s, filled, and the call's descriptor
 * and views (fused: with s's dropout). A KV row (s->kv) stores K and V as its types say, in pages
 * with s->page. @return 0, or OP_SKIPPED (reason printed, nothing left allocated). */
static int attn_setup(bench *bn, int kind, const shape *s, attn_run *a)
{
    const size_t es = esize(s->dt);
    const int own_v = kind != OP_SCORES && !s->mla;
    const clattn_dtype kt = k_type(s), vt = v_type(s);
    memset(a, 0, sizeof *a);
    kv_pages *pg = &a->pg;
    kv_pages_make(bn, s, pg);
    const uint64_t rows = kv_store_rows(s, pg);
    const uint64_t nq = (uint64_t)(s->b * s->hq * s->sq * s->d),
                   nk = (uint64_t)(s->b * s->hkv * s->skv * s->d),
                   nv = (uint64_t)(s->b * s->hkv * s->skv * s->dv),
                   no = (uint64_t)(s->b * s->hq * s->sq * (kind == OP_SCORES ? s->skv : s->dv));
    const char *name = op_names[kind];
    cl_mem *m = a->m;
    a->nq = nq;
    a->no = no;
    if (!(m[0] = make_buffer(bn, name, nq * es)) || !(m[1] = make_buffer(bn, name, rows * row_bytes(kt, s->d))) ||
        (own_v && !(m[2] = make_buffer(bn, name, rows * row_bytes(vt, s->dv)))) ||
        !(m[3] = make_buffer(bn, name, no * es)) || make_masks(bn, name, s, &m[4], &m[5]) ||
        make_variant_tensors(bn, name, s, &m[6], &a->sinks, &a->slopes) ||
        (pg->page && !(m[8] = make_buffer(bn, name, (uint64_t)(s->b * pg->nb) * sizeof(cl_int)))) ||
        (kt == CLATTN_I8 && !(m[9] = make_buffer(bn, name, rows * sizeof(float)))) ||
        (own_v && vt == CLATTN_I8 && !(m[10] = make_buffer(bn, name, rows * sizeof(float))))) {
        attn_free(a);
        return OP_SKIPPED;
    }
    upload(bn, m[0], ID_Q, nq, s->dt);
    if (s->kv) {
        upload_kv(bn, m[1], m[9], ID_K, kt, s->d, s, pg);
        if (m[2])
            upload_kv(bn, m[2], m[10], ID_V, vt, s->dv, s, pg);
        if (m[8])
            check_cl(clEnqueueWriteBuffer(bn->queue, m[8], CL_TRUE, 0, (size_t)(s->b * pg->nb) * sizeof(cl_int),
                                          pg->table, 0, NULL, NULL),
                     "clEnqueueWriteBuffer");
    } else {
        upload(bn, m[1], ID_K, nk, s->dt);
        if (m[2])
            upload(bn, m[2], ID_V, nv, s->dt);
    }

    attn_job *j = &a->j;
    j->kind = kind;
    j->desc.batch = s->b;
    j->desc.heads_q = s->hq;
    j->desc.heads_kv = s->hkv;
    j->desc.seq_q = s->sq;
    j->desc.seq_kv = s->skv;
    j->desc.head_dim = s->d;
    j->desc.head_dim_v = s->dv;
    j->desc.scale = s->scale; /* 0: 1/sqrt(head_dim) */
    j->desc.causal = s->causal;
    j->desc.kv_lengths = m[5];
    j->desc.mask = mask_view(m[4], s, &j->mask);
    j->desc.algorithm = kind == OP_UNFUSED ? CLATTN_ALGORITHM_UNFUSED
                        : kind == OP_FUSED ? CLATTN_ALGORITHM_FUSED
                                           : CLATTN_ALGORITHM_AUTO;
    j->desc.window = s->window;
    j->desc.window_left = s->window ? s->win_left : 0;
    j->desc.window_right = s->window ? s->win_right : 0;
    j->desc.chunk = s->chunk;
    j->desc.softcap = s->softcap;
    if (kind == OP_FUSED && s->dropout > 0.0f) { /* the fused path's alone (clattn.h) */
        j->desc.dropout_p = s->dropout;
        j->desc.dropout_seed = bn->opt.dropout_seed;
        j->desc.dropout_offset = DROPOUT_OFFSET;
    }
    if (m[6]) {
        j->sinks = clattn_tensor_bhsd(m[6], CLATTN_F32, 1, s->hq, 1, 1);
        j->desc.sinks = &j->sinks;
    }
    if (m[7]) {
        j->slopes = clattn_tensor_bhsd(m[7], CLATTN_F32, 1, s->hq, 1, 1);
        j->desc.alibi_slopes = &j->slopes;
    }
    j->desc.score_mod = score_mod_src(bn, s);
    j->desc.mask_mod = mask_mod_src(bn, s);
    j->q = clattn_tensor_bhsd(m[0], s->dt, s->b, s->hq, s->sq, s->d);
    j->k = kv_view(s, pg, m[1], kt, s->d);
    if (m[2]) {
        j->v = kv_view(s, pg, m[2], vt, s->dv);
    } else if (kind != OP_SCORES) { /* --mla: K's view with the first Dv of each row */
        j->v = j->k;
        j->v.shape[3] = s->dv;
    }
    if (s->kv) {
        j->kv.page_size = pg->page;
        j->kv.block_table = m[8];
        j->kv.block_table_stride = pg->page ? pg->nb : 0;
        if (m[9]) {
            j->ks = kv_view(s, pg, m[9], CLATTN_F32, 1);
            j->kv.k_scales = &j->ks;
        }
        if (m[10]) {
            j->vs = kv_view(s, pg, m[10], CLATTN_F32, 1);
            j->kv.v_scales = &j->vs;
        } else if (m[9] && s->mla) { /* V is K's view: its scales too */
            j->kv.v_scales = &j->ks;
        }
        j->kv.k_scale = is_fp8(kt) ? FP8_K_SCALE : 0.0f;
        j->kv.v_scale = is_fp8(vt) ? (s->mla ? FP8_K_SCALE : FP8_V_SCALE) : 0.0f;
        j->desc.kv = &j->kv;
    }
    j->o = clattn_tensor_bhsd(m[3], s->dt, s->b, s->hq, s->sq, kind == OP_SCORES ? s->skv : s->dv);
    return 0;
}

/* Attention's floating-point operations on shape s: 2·Hq·pairs·(D + Dv), pairs the visible
 * (query, key) pairs of the batch (visible_pairs). */
static double attn_flops(const bench *bn, const shape *s)
{
    return 2.0 * s->hq * visible_pairs(bn, s) * (double)(s->d + s->dv);
}

/* The rates of attention kind `kind` on shape s run in r->ms_med (a, its buffers). */
static void attn_rates(bench *bn, int kind, const shape *s, const attn_run *a, result *r)
{
    const size_t es = esize(s->dt);
    if (kind == OP_SCORES) {
        r->gflops = 2.0 * s->b * s->hq * (double)s->sq * (double)s->skv * s->d / (r->ms_med * 1e6);
        r->gbps = (double)(a->no * es) / (r->ms_med * 1e6);
        return;
    }
    r->gflops = attn_flops(bn, s) / (r->ms_med * 1e6);
    r->kv_gbps = kv_bytes(bn, s) / (r->ms_med * 1e6);
    if (kind == OP_DECODE)
        r->gbps = ((double)((a->nq + a->no) * es) + kv_bytes(bn, s) +
                   (a->m[4] ? (double)(s->sq * s->skv) * (double)esize(mask_dtype(s)) : 0.0)) /
                  (r->ms_med * 1e6);
}

/* Runs scores, unfused, fused or decode on shape s into *out_r (ms_med NAN when skipped). The
 * caller adds the ratio against its peer and emits the line. A KV row (s->kv) stores K and V as
 * its types say, in pages with s->page. */
static void run_attn(bench *bn, int kind, const shape *s, result *out_r)
{
    attn_run a;
    *out_r = new_result(op_names[kind], s);
    out_r->ms_med = NAN;
    if (attn_setup(bn, kind, s, &a))
        return;
    result *r = out_r;
    if (measure(bn, enqueue_attn, &a.j, &r->ms_med, &r->ms_min) == 0) {
        note_attn_params(bn, kind, s);
        attn_rates(bn, kind, s, &a, r);
        if (bn->opt.check) {
            const variant_data vd = {a.sinks, a.slopes};
            r->tol = tolerance(s->dt);
            r->err = check_attention(bn, s, a.m[3], kind == OP_SCORES, &vd);
            r->checked = !isnan(r->err);
        }
    } else {
        r->ms_med = NAN;
    }
    attn_free(&a);
}

/* ------------------------------------------------------------------------------------------ */
/* Training: --op backward (clattn_attention_backward) and --op dropout, checked against the
 * float64 reference's ref_attention_backward and ref_attention (ref/clattn_ref.h)             */

/* A reference problem costing more multiply-adds than this (B·Hq·Sq·Skv·(D + Dv)) is checked on
 * one or two groups of query heads instead of whole: dK and dV need every row of a kv head, so
 * the backward cannot sample rows as the forward's check does. */
#define REF_WHOLE_COST (4.0 * FULL_CHECK_COST)

/*
 * A problem of the float64 reference (ref_attn over contiguous double arrays) that stands for
 * shape s: the whole problem (b < 0), or the query heads of kv head kvh of batch b (batch 1,
 * heads_q = the group, heads_kv 1), whose rows lie together in every device tensor: q, out, dout
 * and dq from query row qrow0 ((b·Hq + h)·Sq + i), k, v, dk and dv from key row kvrow0. Inputs are
 * regenerated from their streams as stored in s's dtype (V from K's first Dv dims with --mla), the
 * masks, key lengths and variants as the device has them. Dropout's counter holds b·heads_q + h,
 * which a group reproduces only as batch 0's kv head 0 (ref_groups picks no other with dropout).
 */
typedef struct ref_prob {
    ref_attn a;
    long long b, kvh;          /* the group; b < 0: the whole problem */
    long long nb, nh;          /* batches and query heads it holds */
    uint64_t qrow0, kvrow0;
    size_t nq, nk, nv, no;     /* elements of q (= dq), k, v, out (= dout) */
    double *q, *k, *v, *dout, *mask, *sinks, *alibi;
    int *kv_len;
    unsigned char *vis;        /* mask_mod's answers [nb][nh][Sq][Skv]; NULL: none */
    const bench *bn;
    const shape *s;
} ref_prob;

/* The reference's mask_mod: the device's answers, evaluated beforehand (ref_prob_make). q is the
 * row's diagonal position p = i + L - Sq. */
static int ref_vis(int b, int h, long long q, int k, void *user)
{
    const ref_prob *rp = user;
    const shape *s = rp->s;
    const long long bg = rp->b < 0 ? b : rp->b, i = q - batch_keys(rp->bn, s, bg) + s->sq;
    return rp->vis[(((size_t)b * (size_t)rp->nh + (size_t)h) * (size_t)s->sq + (size_t)i) * (size_t)s->skv +
                   (size_t)k];
}

static void ref_prob_free(ref_prob *rp)
{
    free(rp->q);
    free(rp->k);
    free(rp->v);
    free(rp->dout);
    free(rp->mask);
    free(rp->sinks);
    free(rp->alibi);
    free(rp->kv_len);
    free(rp->vis);
    memset(rp, 0, sizeof *rp);
}

/* The problem of group (b, kvh) of shape s, or the whole (b < 0), with dout when grads; vd: the
 * host values of the sinks and slopes the device got. @return 0, or -1 (mask_mod's evaluator
 * unavailable: said once; nothing left allocated). */
static int ref_prob_make(bench *bn, const shape *s, long long b, long long kvh, const variant_data *vd, int grads,
                         ref_prob *rp)
{
    memset(rp, 0, sizeof *rp);
    const long long group = s->hq / s->hkv, D = s->d, Dv = s->dv, Sq = s->sq, Skv = s->skv;
    const int whole = b < 0;
    rp->bn = bn;
    rp->s = s;
    rp->b = b;
    rp->kvh = kvh;
    rp->nb = whole ? s->b : 1;
    rp->nh = whole ? s->hq : group;
    const long long nkv = whole ? s->hkv : 1, h0 = whole ? 0 : kvh * group;
    rp->qrow0 = whole ? 0 : (uint64_t)((b * s->hq + h0) * Sq);
    rp->kvrow0 = whole ? 0 : (uint64_t)((b * s->hkv + kvh) * Skv);
    rp->nq = (size_t)(rp->nb * rp->nh * Sq * D);
    rp->no = (size_t)(rp->nb * rp->nh * Sq * Dv);
    rp->nk = (size_t)(rp->nb * nkv * Skv * D);
    rp->nv = (size_t)(rp->nb * nkv * Skv * Dv);
    rp->q = xmalloc_n(rp->nq, sizeof *rp->q);
    rp->k = xmalloc_n(rp->nk, sizeof *rp->k);
    rp->v = xmalloc_n(rp->nv, sizeof *rp->v);
    for (size_t e = 0; e < rp->nq; e++)
        rp->q[e] = gen_stored(ID_Q, rp->qrow0 * (uint64_t)D + e, s->dt);
    for (size_t e = 0; e < rp->nk; e++)
        rp->k[e] = gen_stored(ID_K, rp->kvrow0 * (uint64_t)D + e, s->dt);
    for (size_t r = 0; r < rp->nv / (size_t)Dv; r++)
        for (size_t e = 0; e < (size_t)Dv; e++)
            rp->v[r * (size_t)Dv + e] = s->mla ? rp->k[r * (size_t)D + e]
                                               : gen_stored(ID_V, (rp->kvrow0 + r) * (uint64_t)Dv + e, s->dt);
    if (grads) {
        rp->dout = xmalloc_n(rp->no, sizeof *rp->dout);
        for (size_t e = 0; e < rp->no; e++)
            rp->dout[e] = gen_stored(ID_DO, rp->qrow0 * (uint64_t)Dv + e, s->dt);
    }
    ref_attn *a = &rp->a;
    a->batch = (int)rp->nb;
    a->heads_q = (int)rp->nh;
    a->heads_kv = (int)nkv;
    a->seq_q = (int)Sq;
    a->seq_kv = (int)Skv;
    a->head_dim = (int)D;
    a->head_dim_v = (int)Dv;
    /* the float the descriptor holds: 0 resolves to 1/sqrt(D) in float */
    a->scale = s->scale > 0.0f ? (double)s->scale : (double)(float)(1.0 / sqrt((double)D));
    a->causal = s->causal;
    if (s->mask != MASK_NONE) {
        rp->mask = xmalloc_n((uint64_t)(Sq * Skv), sizeof *rp->mask);
        for (long long i = 0; i < Sq; i++)
            for (long long j = 0; j < Skv; j++)
                rp->mask[i * Skv + j] = mask_at(s, i, j);
        a->mask = rp->mask;
        a->mask_shape[0] = a->mask_shape[1] = 1;
        a->mask_shape[2] = (int)Sq;
        a->mask_shape[3] = (int)Skv;
    }
    if (s->kv_lens) {
        rp->kv_len = xmalloc_n((uint64_t)rp->nb, sizeof *rp->kv_len);
        for (long long bb = 0; bb < rp->nb; bb++)
            rp->kv_len[bb] = (int)batch_keys(bn, s, whole ? bb : b);
        a->kv_len = rp->kv_len;
    }
    a->window = s->window;
    a->window_left = s->window ? s->win_left : 0;
    a->window_right = s->window ? s->win_right : 0;
    a->chunk = s->chunk;
    a->softcap = (double)s->softcap;
    if (vd && vd->sinks) {
        rp->sinks = xmalloc_n((uint64_t)rp->nh, sizeof *rp->sinks);
        for (long long h = 0; h < rp->nh; h++)
            rp->sinks[h] = (double)vd->sinks[h0 + h];
        a->sinks = rp->sinks;
    }
    if (vd && vd->slopes) {
        rp->alibi = xmalloc_n((uint64_t)rp->nh, sizeof *rp->alibi);
        for (long long h = 0; h < rp->nh; h++)
            rp->alibi[h] = (double)vd->slopes[h0 + h];
        a->alibi = rp->alibi;
    }
    if (s->dropout > 0.0f) {
        a->dropout_p = (double)s->dropout;
        a->dropout_seed = bn->opt.dropout_seed;
        a->dropout_offset = DROPOUT_OFFSET;
    }
    if (s->mask_mod) { /* the device's answers for every (row, key) of the problem */
        rp->vis = xmalloc_n((uint64_t)(rp->nb * rp->nh * Sq * Skv), 1);
        float *x = xmalloc_n((uint64_t)Skv, sizeof *x);
        cl_int *vis = xmalloc_n((uint64_t)Skv, sizeof *vis);
        for (long long bb = 0; bb < rp->nb; bb++)
            for (long long h = 0; h < rp->nh; h++)
                for (long long i = 0; i < Sq; i++) {
                    const long long bg = whole ? bb : b;
                    for (long long j = 0; j < Skv; j++)
                        x[j] = 0.0f;
                    if (mods_eval(bn, bg, h0 + h, diag_pos(bn, s, bg, i), 0, Skv, x, vis)) {
                        free(x);
                        free(vis);
                        ref_prob_free(rp);
                        return -1;
                    }
                    unsigned char *row = rp->vis + ((bb * rp->nh + h) * Sq + i) * Skv;
                    for (long long j = 0; j < Skv; j++)
                        row[j] = vis[j] != 0;
                }
        free(x);
        free(vis);
        a->mask_mod = ref_vis;
        a->mod_user = rp;
    }
    return 0;
}

/* The reference problems a check of shape s runs: the whole problem when it costs at most
 * REF_WHOLE_COST (one entry, b = -1); else batch 0's kv head 0 and, without dropout (its counter,
 * ref_prob) and where it is another group costing at most REF_WHOLE_COST, the last batch's last
 * kv head. @return the number of entries in g (b, kvh each). */
static int ref_groups(const shape *s, long long g[2][2])
{
    const double group_cost = (double)(s->hq / s->hkv) * (double)s->sq * (double)s->skv * (double)(s->d + s->dv);
    if ((double)s->b * (double)s->hkv * group_cost <= REF_WHOLE_COST) {
        g[0][0] = g[0][1] = -1;
        return 1;
    }
    g[0][0] = g[0][1] = 0;
    if (s->dropout > 0.0f || (s->b == 1 && s->hkv == 1) || group_cost > REF_WHOLE_COST)
        return 1;
    g[1][0] = s->b - 1;
    g[1][1] = s->hkv - 1;
    return 2;
}

/* What ref_groups covers, for the check's line. */
static void ref_groups_desc(const shape *s, char *buf, size_t size)
{
    long long g[2][2];
    const int n = ref_groups(s, g);
    const long long group = s->hq / s->hkv;
    const char *heads = group == 1 ? "query head" : "query heads";
    if (g[0][0] < 0)
        snprintf(buf, size, "the whole problem");
    else if (n == 1)
        snprintf(buf, size, "batch 0 kv head 0 (%lld %s)", group, heads);
    else
        snprintf(buf, size, "batch 0 kv head 0 and batch %lld kv head %lld (%lld %s each)", g[1][0], g[1][1], group,
                 heads);
}

/* The largest |got - want| over a device tensor's n elements from element off, relative to the
 * largest |want| (the gradient's magnitude; 1 where every want is 0). NaN: infinite. */
static double grad_err(bench *bn, cl_mem buf, uint64_t off, size_t n, clattn_dtype dt, const double *want)
{
    double *got = xmalloc_n(n, sizeof *got), top = 0.0, worst = 0.0;
    read_row(bn, buf, off, n, dt, got);
    for (size_t e = 0; e < n; e++)
        if (fabs(want[e]) > top)
            top = fabs(want[e]);
    for (size_t e = 0; e < n; e++) {
        const double err = elem_err(got[e], want[e], top > 0.0 ? top : 1.0);
        if (err > worst)
            worst = err;
    }
    free(got);
    return worst;
}

/* Tolerance of a gradient, relative to its largest magnitude (grad_err): the forward's. */
static double grad_tolerance(clattn_dtype dt)
{
    return tolerance(dt);
}

/*
 * The backward's dq, dk, dv (and dsinks) on the device against ref_attention_backward of the
 * same inputs and dout, on the problems ref_groups picks; err[0..3]: each tensor's grad_err
 * (dsinks NAN where not compared: no sinks, or groups of a batch of several, whose dsinks the
 * device sums over every batch). @return the largest; NAN when not checked (score_mod, whose
 * derivative nobody knows, or mask_mod's evaluator unavailable).
 */
static double check_backward(bench *bn, const shape *s, const variant_data *vd, const cl_mem g[4], double err[4])
{
    err[0] = err[1] = err[2] = err[3] = NAN;
    if (s->score_mod)
        return NAN;
    long long groups[2][2];
    const int n = ref_groups(s, groups);
    double worst = 0.0;
    for (int t = 0; t < 4; t++)
        err[t] = t < 3 || (vd && vd->sinks && (groups[0][0] < 0 || s->b == 1)) ? 0.0 : NAN;
    for (int gi = 0; gi < n; gi++) {
        ref_prob rp;
        if (ref_prob_make(bn, s, groups[gi][0], groups[gi][1], vd, 1, &rp))
            return NAN;
        double *dq = xmalloc_n(rp.nq, sizeof *dq), *dk = xmalloc_n(rp.nk, sizeof *dk),
               *dv = xmalloc_n(rp.nv, sizeof *dv), *ds = rp.sinks ? xmalloc_n((uint64_t)rp.nh, sizeof *ds) : NULL;
        ref_attention_backward(&rp.a, rp.q, rp.k, rp.v, rp.dout, dq, dk, dv, ds);
        const double e[4] = {
            grad_err(bn, g[0], rp.qrow0 * (uint64_t)s->d, rp.nq, s->dt, dq),
            grad_err(bn, g[1], rp.kvrow0 * (uint64_t)s->d, rp.nk, s->dt, dk),
            grad_err(bn, g[2], rp.kvrow0 * (uint64_t)s->dv, rp.nv, s->dt, dv),
            !isnan(err[3]) ? grad_err(bn, g[3], rp.b < 0 ? 0 : (uint64_t)(rp.kvh * rp.nh), (size_t)rp.nh, CLATTN_F32, ds)
                           : NAN};
        for (int t = 0; t < 4; t++)
            if (!isnan(err[t])) {
                err[t] = e[t] > err[t] || isnan(e[t]) ? e[t] : err[t];
                worst = e[t] > worst || isnan(e[t]) ? e[t] : worst;
            }
        free(dq);
        free(dk);
        free(dv);
        free(ds);
        ref_prob_free(&rp);
    }
    return worst;
}

/* The forward's out with s's dropout against ref_attention with the dropout fields set, on the
 * problems ref_groups picks; errors as check_attention's. @return the largest; NAN when not
 * checked (score_mod, or mask_mod's evaluator unavailable). */
static double check_forward_ref(bench *bn, const shape *s, const variant_data *vd, cl_mem out)
{
    if (s->score_mod)
        return NAN;
    long long groups[2][2];
    const int n = ref_groups(s, groups);
    double worst = 0.0;
    for (int gi = 0; gi < n; gi++) {
        ref_prob rp;
        if (ref_prob_make(bn, s, groups[gi][0], groups[gi][1], vd, 0, &rp))
            return NAN;
        double *want = xmalloc_n(rp.no, sizeof *want), *got = xmalloc_n(rp.no, sizeof *got);
        ref_attention(&rp.a, rp.q, rp.k, rp.v, want, NULL, NULL);
        read_row(bn, out, rp.qrow0 * (uint64_t)s->dv, rp.no, s->dt, got);
        for (size_t e = 0; e < rp.no; e++) {
            const double err = elem_err(got[e], want[e], fabs(want[e]) > 1.0 ? fabs(want[e]) : 1.0);
            worst = err > worst || isnan(err) ? err : worst;
        }
        free(want);
        free(got);
        ref_prob_free(&rp);
    }
    return worst;
}

/* The backward's call: the forward's descriptor (lse NULL) and inputs, its out and LSE. */
typedef struct bwd_job {
    clattn_attention_desc desc;
    const attn_job *fwd;
    clattn_tensor dout, lse, dq, dk, dv, dsinks;
    int has_dsinks;
} bwd_job;

static int enqueue_backward(bench *bn, void *job)
{
    const bwd_job *j = job;
    const attn_job *f = j->fwd;
    const clattn_status st =
        clattn_attention_backward(bn->ctx, &j->desc, &f->q, &f->k, &f->v, &f->o, &j->dout, &j->lse, &j->dq, &j->dk,
                                  &j->dv, j->has_dsinks ? &j->dsinks : NULL, 0, NULL, NULL);
    if (st == CLATTN_UNSUPPORTED) {
        fprintf(stderr, "backward: skipped: %s\n", clattn_last_error(bn->ctx));
        return OP_SKIPPED;
    }
    if (st != CLATTN_SUCCESS)
        die_clattn(bn, "backward", st);
    return 0;
}

/* Two jobs timed in alternation, so that they share the machine's noise: each iteration runs
 * both, first a then b, then b then a; warm-up as measure's. @return 0, or OP_SKIPPED. */
static int measure_pair(bench *bn, enqueue_fn fa, void *ja, enqueue_fn fb, void *jb, double med[2], double mn[2])
{
    const int iters = bn->opt.iters, total = bn->opt.warmup + iters;
    double *t = xmalloc_n(2 * (uint64_t)iters, sizeof *t);
    for (int it = 0; it < total; it++)
        for (int k = 0; k < 2; k++) {
            const int which = (it + k) % 2;
            const double t0 = now_ms();
            const int r = which ? fb(bn, jb) : fa(bn, ja);
            if (r) {
                free(t);
                return r;
            }
            check_cl(clFinish(bn->queue), "clFinish");
            const double t1 = now_ms();
            if (it >= bn->opt.warmup)
                t[which * iters + it - bn->opt.warmup] = t1 - t0;
        }
    for (int w = 0; w < 2; w++) {
        double *x = t + w * iters;
        qsort(x, (size_t)iters, sizeof *x, cmp_double);
        med[w] = iters % 2 ? x[iters / 2] : 0.5 * (x[iters / 2 - 1] + x[iters / 2]);
        mn[w] = x[0];
    }
    free(t);
    return 0;
}

/*
 * --op backward on shape v (the fused op's problem: masks, key lengths, variants, --mla, --dropout;
 * K/V contiguous in the dtype, since the backward takes no desc->kv): the training forward, fused
 * with the LSE, run once untimed to give out and the LSE; then the forward (row "forward") and
 * the backward on them with dout from stream ID_DO (row "backward") timed in alternation
 * (measure_pair: every forward rewrites the same out and LSE), so that their ratio shares the
 * machine's noise. GFLOP/s: the forward's count (attn_flops), and 2.5 times it for the backward
 * (FlashAttention's convention); the backward row's ratio is its GFLOP/s over the forward's.
 * --check: the forward's out as the fused op's, dq, dk, dv (and dsinks) against
 * ref_attention_backward (check_backward).
 */
static void run_backward(bench *bn, const shape *v)
{
    FILE *info = bn->opt.csv ? stderr : stdout;
    if (v->kv)
        fprintf(info, "backward: --kv-type and --page not used: clattn_attention_backward takes plain K/V\n");
    const shape s = contiguous_shape(v);
    const size_t es = esize(s.dt);
    attn_run a;
    if (attn_setup(bn, OP_FUSED, &s, &a))
        return;
    const uint64_t nk = (uint64_t)(s.b * s.hkv * s.skv * s.d), nv = (uint64_t)(s.b * s.hkv * s.skv * s.dv),
                   nl = (uint64_t)(s.b * s.hq * s.sq);
    cl_mem t[6] = {NULL, NULL, NULL, NULL, NULL, NULL}; /* lse, dout, dq, dk, dv, dsinks */
    if (!(t[0] = make_buffer(bn, "backward", nl * sizeof(float))) ||
        !(t[1] = make_buffer(bn, "backward", a.no * es)) || !(t[2] = make_buffer(bn, "backward", a.nq * es)) ||
        !(t[3] = make_buffer(bn, "backward", nk * es)) || !(t[4] = make_buffer(bn, "backward", nv * es)) ||
        (a.m[6] && !(t[5] = make_buffer(bn, "backward", (uint64_t)s.hq * sizeof(float))))) {
        release(t, 6);
        attn_free(&a);
        return;
    }
    upload(bn, t[1], ID_DO, a.no, s.dt);
    bwd_job bj;
    memset(&bj, 0, sizeof bj);
    bj.lse = clattn_tensor_bhsd(t[0], CLATTN_F32, s.b, s.hq, s.sq, 1);
    bj.dout = clattn_tensor_bhsd(t[1], s.dt, s.b, s.hq, s.sq, s.dv);
    bj.dq = clattn_tensor_bhsd(t[2], s.dt, s.b, s.hq, s.sq, s.d);
    bj.dk = clattn_tensor_bhsd(t[3], s.dt, s.b, s.hkv, s.skv, s.d);
    bj.dv = clattn_tensor_bhsd(t[4], s.dt, s.b, s.hkv, s.skv, s.dv);
    if (t[5]) {
        bj.dsinks = clattn_tensor_bhsd(t[5], CLATTN_F32, 1, s.hq, 1, 1);
        bj.has_dsinks = 1;
    }
    bj.fwd = &a.j;
    bj.desc = a.j.desc; /* lse NULL: the backward takes it as an argument */
    a.j.desc.lse = &bj.lse;

    const variant_data vd = {a.sinks, a.slopes};
    result f = new_result("forward", &s), r = new_result("backward", &s);
    double med[2], mn[2];
    int bwd = 0; /* 1: the backward ran */
    f.ms_med = r.ms_med = NAN;
    if (enqueue_attn(bn, &a.j) == 0) {
        check_cl(clFinish(bn->queue), "clFinish");
        bwd = measure_pair(bn, enqueue_attn, &a.j, enqueue_backward, &bj, med, mn) == 0;
        /* the backward refused (reason printed): the forward alone */
        if (bwd || measure(bn, enqueue_attn, &a.j, &med[0], &mn[0]) == 0) {
            f.ms_med = med[0];
            f.ms_min = mn[0];
        }
    }
    if (!isnan(f.ms_med)) {
        note_attn_params(bn, OP_FUSED, &s);
        attn_rates(bn, OP_FUSED, &s, &a, &f);
        add_ratio(bn, "forward (LSE) vs FMA peak", "training forward GFLOP/s / peak GFLOP/s", f.gflops / bn->peak_gflops);
        if (bn->opt.check) {
            f.tol = tolerance(s.dt);
            f.err = check_attention(bn, &s, a.m[3], 0, &vd);
            f.checked = !isnan(f.err);
        }
        emit(bn, &f);
    }
    if (bwd) {
        r.ms_med = med[1];
        r.ms_min = mn[1];
        r.gflops = 2.5 * attn_flops(bn, &s) / (r.ms_med * 1e6);
        r.ratio_name = "bwd_gflops/fwd_gflops";
        r.ratio = r.gflops / f.gflops;
        add_ratio(bn, "backward vs forward", "backward GFLOP/s (2.5x fwd FLOPs) / forward GFLOP/s (target >= 0.6)",
                  r.ratio);
        add_ratio(bn, "backward vs FMA peak", "backward GFLOP/s / peak GFLOP/s", r.gflops / bn->peak_gflops);
        double err[4];
        if (bn->opt.check) {
            const cl_mem g[4] = {t[2], t[3], t[4], t[5]};
            r.tol = grad_tolerance(s.dt);
            r.err = check_backward(bn, &s, &vd, g, err);
            r.checked = !isnan(r.err);
        }
        emit(bn, &r);
        if (bn->opt.check && r.checked) {
            char cover[160];
            ref_groups_desc(&s, cover, sizeof cover);
            fprintf(info, "backward: check: max |err| / max |ref| of dq %.3g, dk %.3g, dv %.3g", err[0], err[1],
                    err[2]);
            if (!isnan(err[3]))
                fprintf(info, ", dsinks %.3g", err[3]);
            fprintf(info, " (ref_attention_backward on %s)\n", cover);
        } else if (bn->opt.check) {
            fprintf(info, "backward: not checked: %s\n",
                    s.score_mod ? "score_mod (its derivative is unknown)" : "the mask_mod evaluator did not build");
        }
    }
    release(t, 6);
    attn_free(&a);
}

/*
 * --op dropout on shape v (the fused op's problem with v->dropout; K/V contiguous in the dtype):
 * the fused forward without dropout (row "fused") and with it (row "dropout", mask column
 * drop:P), on the same inputs into two outputs, timed in alternation (measure_pair); the dropout
 * row's ratio is its ms over the plain row's (the overhead, target <= 1.15). --check: the plain
 * row as the fused op's, the dropout row against ref_attention with the dropout fields set.
 */
static void run_dropout(bench *bn, const shape *v)
{
    FILE *info = bn->opt.csv ? stderr : stdout;
    if (v->kv)
        fprintf(info, "dropout: --kv-type and --page not used: the rows compare contiguous K/V of the dtype\n");
    const shape s = contiguous_shape(v);
    shape p = s;
    p.dropout = 0.0f;
    attn_run a;
    if (attn_setup(bn, OP_FUSED, &s, &a))
        return;
    cl_mem o2 = make_buffer(bn, "dropout", a.no * esize(s.dt));
    if (!o2) {
        attn_free(&a);
        return;
    }
    attn_job pj = a.j; /* its pointers (mask, sinks, slopes) into a.j's views: the same */
    pj.desc.dropout_p = 0.0f;
    pj.desc.dropout_seed = 0;
    pj.desc.dropout_offset = 0;
    pj.o = clattn_tensor_bhsd(o2, s.dt, s.b, s.hq, s.sq, s.dv);
    result rp = new_result("fused", &p), rd = new_result("dropout", &s);
    double med[2], mn[2];
    if (measure_pair(bn, enqueue_attn, &pj, enqueue_attn, &a.j, med, mn) == 0) {
        note_attn_params(bn, OP_FUSED, &s);
        rp.ms_med = med[0];
        rp.ms_min = mn[0];
        rd.ms_med = med[1];
        rd.ms_min = mn[1];
        rp.gflops = attn_flops(bn, &p) / (rp.ms_med * 1e6);
        rd.gflops = attn_flops(bn, &s) / (rd.ms_med * 1e6);
        rd.ratio_name = "dropout_ms/plain_ms";
        rd.ratio = rd.ms_med / rp.ms_med;
        add_ratio(bn, "dropout vs none", "fused ms with dropout / without (target <= 1.15)", rd.ratio);
        add_ratio(bn, "dropout fused vs FMA peak", "GFLOP/s / peak GFLOP/s", rd.gflops / bn->peak_gflops);
        if (bn->opt.check) {
            const variant_data vd = {a.sinks, a.slopes};
            rp.tol = rd.tol = tolerance(s.dt);
            rp.err = check_attention(bn, &p, o2, 0, &vd);
            rp.checked = !isnan(rp.err);
            rd.err = check_forward_ref(bn, &s, &vd, a.m[3]);
            rd.checked = !isnan(rd.err);
        }
        emit(bn, &rp);
        emit(bn, &rd);
        if (bn->opt.check && rd.checked) {
            char cover[160];
            ref_groups_desc(&s, cover, sizeof cover);
            fprintf(info, "dropout: checked against ref_attention with dropout_p %g on %s\n", (double)s.dropout,
                    cover);
        } else if (bn->opt.check) {
            fprintf(info, "dropout: the dropout row not checked: %s\n",
                    s.score_mod ? "score_mod (the host reference cannot run it)" : "the mask_mod evaluator did not build");
        }
    }
    clReleaseMemObject(o2);
    attn_free(&a);
}

/* ------------------------------------------------------------------------------------------ */
/* --varlen: packed sequences (clattn_kv_layout.cu_seqlens_q / cu_seqlens_k) against one call a
 * sequence                                                                                     */

/* Both rows' calls: the packed call (one), or one call a sequence (n), each with its own
 * descriptor and views q, k, v, out. */
typedef struct varlen_job {
    long long calls;
    clattn_attention_desc *desc; /* [calls] */
    clattn_tensor *t;            /* [calls][4]: q, k, v, out */
} varlen_job;

static int enqueue_varlen(bench *bn, void *job)
{
    const varlen_job *j = job;
    for (long long c = 0; c < j->calls; c++) {
        const clattn_tensor *t = j->t + 4 * c;
        const clattn_status st = clattn_attention(bn->ctx, &j->desc[c], &t[0], &t[1], &t[2], &t[3], 0, NULL, NULL);
        if (st == CLATTN_UNSUPPORTED) {
            fprintf(stderr, "fused: varlen: skipped: %s\n", clattn_last_error(bn->ctx));
            return OP_SKIPPED;
        }
        if (st != CLATTN_SUCCESS)
            die_clattn(bn, "fused (varlen)", st);
    }
    return 0;
}

/* A view of rows r0 .. r0 + n - 1 of a packed [total][h][d] buffer: shape {1, h, n, d}, stride
 * {0, d, h·d} (FlashAttention's varlen layout). */
static clattn_tensor packed_view(cl_mem buf, clattn_dtype dt, long long h, long long r0, long long n, long long d)
{
    clattn_tensor t;
    memset(&t, 0, sizeof t);
    t.buffer = buf;
    t.dtype = dt;
    t.offset = r0 * h * d;
    t.shape[0] = 1;
    t.shape[1] = h;
    t.shape[2] = n;
    t.shape[3] = d;
    t.stride[0] = 0;
    t.stride[1] = d;
    t.stride[2] = h * d;
    return t;
}

/*
 * Checks the packed output `out` ([total][Hq][Dv]) against float64, sequence by sequence: sequence
 * b (rows cu[b] .. cu[b+1] - 1, L of them) is self-attention of its own L queries and L keys,
 * causal top-left (= bottom-right: as many keys as rows), element (t, h, e) of q, k and v being
 * element (t·H + h)·D + e of its stream (the packed buffers are the streams in order). Every row
 * when a sequence's reference is cheap, else SAMPLE_ROWS rows of each head (pick_rows).
 * @return the largest element error.
 */
static double check_varlen(bench *bn, const shape *s, const long long *cu, long long n, cl_mem out)
{
    const long long Hq = s->hq, Hkv = s->hkv, D = s->d, Dv = s->dv, group = Hq / Hkv;
    const double scale = s->scale > 0.0f ? (double)s->scale : (double)(float)(1.0 / sqrt((double)D));
    const long long Lmax = s->skv;
    double *kh = xmalloc_n((uint64_t)(Lmax * D), sizeof *kh), *vh = xmalloc_n((uint64_t)(Lmax * Dv), sizeof *vh);
    double *q = xmalloc_n((uint64_t)D, sizeof *q), *sc = xmalloc_n((uint64_t)Lmax, sizeof *sc);
    double *got = xmalloc_n((uint64_t)Dv, sizeof *got), *want = xmalloc_n((uint64_t)Dv, sizeof *want);
    double worst = 0.0;
    for (long long b = 0; b < n; b++) {
        const long long L = cu[b + 1] - cu[b], t0 = cu[b];
        size_t nr;
        rowpick *rows = pick_rows(1, Hq, L, (double)Hq * L * L * (double)(D + Dv), &nr);
        long long cached_kvh = -1;
        for (size_t r = 0; r < nr; r++) {
            const long long h = rows[r].h, i = rows[r].i, kvh = h / group;
            if (kvh != cached_kvh) {
                for (long long j = 0; j < L; j++) {
                    const uint64_t kr = (uint64_t)((t0 + j) * Hkv + kvh);
                    for (long long e = 0; e < D; e++)
                        kh[j * D + e] = gen_stored(ID_K, kr * (uint64_t)D + (uint64_t)e, s->dt);
                    for (long long e = 0; e < Dv; e++)
                        vh[j * Dv + e] = gen_stored(ID_V, kr * (uint64_t)Dv + (uint64_t)e, s->dt);
                }
                cached_kvh = kvh;
            }
            const uint64_t qr = (uint64_t)((t0 + i) * Hq + h);
            for (long long e = 0; e < D; e++)
                q[e] = gen_stored(ID_Q, qr * (uint64_t)D + (uint64_t)e, s->dt);
            const long long end = s->causal ? i + 1 : L;
            double m = -INFINITY;
            for (long long j = 0; j < end; j++) {
                double acc = 0.0;
                for (long long e = 0; e < D; e++)
                    acc += q[e] * kh[j * D + e];
                sc[j] = acc * scale;
                if (sc[j] > m)
                    m = sc[j];
            }
            double l = 0.0;
            for (long long e = 0; e < Dv; e++)
                want[e] = 0.0;
            for (long long j = 0; j < end; j++) {
                const double w = exp(sc[j] - m);
                l += w;
                for (long long e = 0; e < Dv; e++)
                    want[e] += w * vh[j * Dv + e];
            }
            for (long long e = 0; e < Dv; e++)
                want[e] /= l;
            read_row(bn, out, qr * (uint64_t)Dv, (size_t)Dv, s->dt, got);
            for (long long e = 0; e < Dv; e++) {
                const double err = elem_err(got[e], want[e], fabs(want[e]) > 1.0 ? fabs(want[e]) : 1.0);
                if (err > worst)
                    worst = err;
            }
        }
        free(rows);
    }
    free(kh);
    free(vh);
    free(q);
    free(sc);
    free(got);
    free(want);
    return worst;
}

/* The largest element difference between two outputs of `count` elements (elem_err). */
static double compare_outputs(bench *bn, cl_mem a, cl_mem b, uint64_t count, clattn_dtype dt)
{
    const size_t chunk = (size_t)1 << 20;
    double *x = xmalloc_n(chunk, sizeof *x), *y = xmalloc_n(chunk, sizeof *y), worst = 0.0;
    for (uint64_t at = 0; at < count; at += chunk) {
        const size_t n = (size_t)(count - at < chunk ? count - at : chunk);
        read_row(bn, a, at, n, dt, x);
        read_row(bn, b, at, n, dt, y);
        for (size_t i = 0; i < n; i++) {
            const double err = elem_err(x[i], y[i], fabs(y[i]) > 1.0 ? fabs(y[i]) : 1.0);
            if (err > worst)
                worst = err;
        }
    }
    free(x);
    free(y);
    return worst;
}

/*
 * --varlen L1,L2,...: the fused op on n sequences packed end to end, self-attention prefill
 * (sequence b: L_b queries and L_b keys), q, k, v and out in FlashAttention's layout
 * ([total][heads][dim]: packed_view). First one clattn_attention call per sequence (batch 1,
 * seq_q = seq_kv = L_b, views of the same packed buffers), all enqueued and then one clFinish,
 * timed as one job; then ONE call on the packed batch (batch n, seq_q = seq_kv = the longest,
 * cu_seqlens_q = cu_seqlens_k = the prefix sums), with the ratio packed ms / one call each ms.
 * s is the fused shape (heads, dims, dtype, causal, scale); its batch and lengths are replaced.
 */
static void run_varlen(bench *bn, const shape *s0)
{
    const options *o = &bn->opt;
    const long long n = o->n_varlen;
    long long *cu = xmalloc_n((uint64_t)n + 1, sizeof *cu);
    cl_int *cu32 = xmalloc_n((uint64_t)n + 1, sizeof *cu32);
    long long Lmax = 0;
    double pairs = 0.0;
    cu[0] = 0;
    for (long long b = 0; b < n; b++) {
        const long long L = o->varlen[b];
        cu[b + 1] = cu[b] + L;
        Lmax = L > Lmax ? L : Lmax;
        pairs += s0->causal ? (double)L * (double)(L + 1) / 2.0 : (double)L * (double)L;
    }
    const long long total = cu[n];
    if (total > INT32_MAX)
        die(EXIT_USAGE, "--varlen: %lld rows in all, more than cu_seqlens' int32 holds", total);
    for (long long b = 0; b <= n; b++)
        cu32[b] = (cl_int)cu[b];
    shape s = *s0;
    s.b = n;
    s.sq = s.skv = Lmax;
    const long long Hq = s.hq, Hkv = s.hkv, D = s.d, Dv = s.dv;
    const size_t es = esize(s.dt);
    const uint64_t nq = (uint64_t)(total * Hq * D), nk = (uint64_t)(total * Hkv * D),
                   nv = (uint64_t)(total * Hkv * Dv), no = (uint64_t)(total * Hq * Dv);
    /* q, k, v, out of the packed call, out of the calls each, cu_seqlens */
    cl_mem m[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    if (!(m[0] = make_buffer(bn, "fused", nq * es)) || !(m[1] = make_buffer(bn, "fused", nk * es)) ||
        !(m[2] = make_buffer(bn, "fused", nv * es)) || !(m[3] = make_buffer(bn, "fused", no * es)) ||
        !(m[4] = make_buffer(bn, "fused", no * es)) ||
        !(m[5] = make_buffer(bn, "fused", (uint64_t)(n + 1) * sizeof(cl_int)))) {
        release(m, 6);
        free(cu);
        free(cu32);
        return;
    }
    upload(bn, m[0], ID_Q, nq, s.dt);
    upload(bn, m[1], ID_K, nk, s.dt);
    upload(bn, m[2], ID_V, nv, s.dt);
    check_cl(clEnqueueWriteBuffer(bn->queue, m[5], CL_TRUE, 0, (size_t)(n + 1) * sizeof(cl_int), cu32, 0, NULL,
                                  NULL),
             "clEnqueueWriteBuffer");
    /* NaN in every output element first (all-ones bytes: NaN in f32, f16 and bf16), so a row a
     * call fails to write shows in --check */
    const cl_uchar ones = 0xff;
    for (int i = 3; i <= 4; i++)
        check_cl(clEnqueueFillBuffer(bn->queue, m[i], &ones, 1, 0, (size_t)(no * es), 0, NULL, NULL),
                 "clEnqueueFillBuffer");
    check_cl(clFinish(bn->queue), "clFinish");

    clattn_attention_desc base;
    memset(&base, 0, sizeof base);
    base.heads_q = Hq;
    base.heads_kv = Hkv;
    base.head_dim = D;
    base.head_dim_v = Dv;
    base.scale = s.scale;
    base.causal = s.causal;
    base.algorithm = CLATTN_ALGORITHM_FUSED;

    /* one call a sequence */
    varlen_job each = {n, xmalloc_n((uint64_t)n, sizeof(clattn_attention_desc)),
                       xmalloc_n((uint64_t)n * 4, sizeof(clattn_tensor))};
    for (long long b = 0; b < n; b++) {
        const long long L = cu[b + 1] - cu[b];
        each.desc[b] = base;
        each.desc[b].batch = 1;
        each.desc[b].seq_q = each.desc[b].seq_kv = L;
        each.t[4 * b + 0] = packed_view(m[0], s.dt, Hq, cu[b], L, D);
        each.t[4 * b + 1] = packed_view(m[1], s.dt, Hkv, cu[b], L, D);
        each.t[4 * b + 2] = packed_view(m[2], s.dt, Hkv, cu[b], L, Dv);
        each.t[4 * b + 3] = packed_view(m[4], s.dt, Hq, cu[b], L, Dv);
    }
    /* the packed call */
    clattn_kv_layout kv;
    memset(&kv, 0, sizeof kv);
    kv.cu_seqlens_q = kv.cu_seqlens_k = m[5];
    clattn_attention_desc pd = base;
    pd.batch = n;
    pd.seq_q = pd.seq_kv = Lmax;
    pd.kv = &kv;
    clattn_tensor pt[4] = {packed_view(m[0], s.dt, Hq, 0, total, D), packed_view(m[1], s.dt, Hkv, 0, total, D),
                           packed_view(m[2], s.dt, Hkv, 0, total, Dv), packed_view(m[3], s.dt, Hq, 0, total, Dv)};
    varlen_job packed = {1, &pd, pt};

    shape se = s, sp = s;
    se.varlen = 2;
    sp.varlen = 1;
    result re = new_result("fused", &se), rp = new_result("fused", &sp);
    re.ms_med = rp.ms_med = NAN;
    if (measure(bn, enqueue_varlen, &each, &re.ms_med, &re.ms_min) == 0) {
        re.gflops = 2.0 * (double)Hq * pairs * (double)(D + Dv) / (re.ms_med * 1e6);
        for (long long b = 0; b < n; b++) {
            shape one = s0[0];
            one.b = 1;
            one.sq = one.skv = cu[b + 1] - cu[b];
            note_attn_params(bn, OP_FUSED, &one);
        }
        if (o->check) {
            re.tol = tolerance(s.dt);
            re.err = check_varlen(bn, &s, cu, n, m[4]);
            re.checked = 1;
        }
        emit(bn, &re);
    } else {
        re.ms_med = NAN;
    }
    if (measure(bn, enqueue_varlen, &packed, &rp.ms_med, &rp.ms_min) == 0) {
        rp.gflops = 2.0 * (double)Hq * pairs * (double)(D + Dv) / (rp.ms_med * 1e6);
        note_attn_params(bn, OP_FUSED, &s);
        if (!isnan(re.ms_med)) {
            rp.ratio_name = "packed_ms/each_ms";
            rp.ratio = rp.ms_med / re.ms_med;
            add_ratio(bn, "fused: varlen packed vs one call each", "packed ms / one call each ms (<= 1: packing pays)",
                      rp.ratio);
        }
        if (o->check) {
            rp.tol = tolerance(s.dt);
            rp.err = check_varlen(bn, &s, cu, n, m[3]);
            rp.checked = 1;
        }
        emit(bn, &rp);
        if (o->check && !isnan(re.ms_med))
            fprintf(o->csv ? stderr : stdout,
                    "fused: varlen: packed output vs one call each's: max element difference %.3g\n",
                    compare_outputs(bn, m[3], m[4], no, s.dt));
    }
    release(m, 6);
    free(each.desc);
    free(each.t);
    free(cu);
    free(cu32);
}

typedef struct softmax_job {
    clattn_softmax_desc desc;
    clattn_tensor in, out, mask;
} softmax_job;

static int enqueue_softmax(bench *bn, void *job)
{
    softmax_job *j = job;
    const clattn_status st = clattn_softmax(bn->ctx, &j->desc, &j->in, &j->out, 0, NULL, NULL);
    if (st == CLATTN_UNSUPPORTED) {
        fprintf(stderr, "softmax: skipped: %s\n", clattn_last_error(bn->ctx));
        return OP_SKIPPED;
    }
    if (st != CLATTN_SUCCESS)
        die_clattn(bn, "softmax", st);
    return 0;
}

static void run_softmax(bench *bn, const shape *s)
{
    const uint64_t n = (uint64_t)(s->b * s->hq * s->sq * s->skv);
    const size_t es = esize(s->dt);
    cl_mem m[4] = {NULL, NULL, NULL, NULL}; /* in, out, mask, key lengths */
    if (!(m[0] = make_buffer(bn, "softmax", n * es)) || !(m[1] = make_buffer(bn, "softmax", n * es)) ||
        make_masks(bn, "softmax", s, &m[2], &m[3])) {
        release(m, 4);
        return;
    }
    upload(bn, m[0], ID_S, n, s->dt);
    softmax_job j;
    memset(&j, 0, sizeof j);
    j.desc.batch = s->b;
    j.desc.heads = s->hq;
    j.desc.rows = s->sq;
    j.desc.cols = s->skv;
    j.desc.causal = s->causal;
    j.desc.kv_lengths = m[3];
    j.desc.mask = mask_view(m[2], s, &j.mask);
    j.in = clattn_tensor_bhsd(m[0], s->dt, s->b, s->hq, s->sq, s->skv);
    j.out = clattn_tensor_bhsd(m[1], s->dt, s->b, s->hq, s->sq, s->skv);
    result r = new_result("softmax", s);
    if (measure(bn, enqueue_softmax, &j, &r.ms_med, &r.ms_min) == 0) {
        note_params(bn, CLATTN_OPERATION_SOFTMAX, s->dt, 0, s->sq, s->skv, s->causal, masked(s), NULL);
        r.gbps = (2.0 * (double)(n * es) +
                  (m[2] ? (double)(s->sq * s->skv) * (double)esize(mask_dtype(s)) : 0.0)) /
                 (r.ms_med * 1e6);
        r.ratio_name = "softmax_gbps/copy_gbps";
        r.ratio = r.gbps / bn->copy_gbps;
        add_ratio(bn, "softmax vs copy", "softmax GB/s / copy GB/s", r.ratio);
        if (bn->opt.check) {
            r.checked = 1;
            r.tol = tolerance(s->dt);
            r.err = check_softmax(bn, s, m[1]);
        }
        emit(bn, &r);
    }
    release(m, 4);
}

#ifdef CLATTN_HAVE_CLBLAST
typedef struct blas_job {
    cl_mem a, b, c;
    size_t m, n, k, batch;
    float alpha;
    CLBlastStatusCode status;
} blas_job;

static int enqueue_blas(bench *bn, void *job)
{
    blas_job *j = job;
    cl_event ev = NULL;
    /* C[b] = alpha · A[b] · B[b]ᵀ: A = Q [Sq][D], B = K [Skv][D], C = scores [Sq][Skv], row-major. */
    j->status = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, CLBlastTransposeNo,
                                           CLBlastTransposeYes, j->m, j->n, j->k, j->alpha, j->a, 0,
                                           j->k, j->m * j->k, j->b, 0, j->k, j->n * j->k, 0.0f, j->c,
                                           0, j->n, j->m * j->n, j->batch, &bn->queue, &ev);
    if (ev)
        clReleaseEvent(ev);
    if (j->status != CLBlastSuccess) {
        FILE *f = bn->opt.csv ? stderr : stdout; /* never inside the CSV */
        fprintf(f, "clblast: unavailable (status %d)\n", (int)j->status);
        fflush(f);
        return OP_SKIPPED;
    }
    return 0;
}
#endif

/* CLBlast's batched SGEMM on the QKᵀ shape of `sc` (f32; K with Hq heads since a strided batch
 * cannot express grouped heads). */
static void run_clblast(bench *bn, const shape *sc)
{
#ifdef CLATTN_HAVE_CLBLAST
    shape s = *sc;
    s.hkv = s.hq;
    s.dv = s.d;
    s.dt = CLATTN_F32;
    s.causal = 0;
    s.mask = MASK_NONE;
    s.kv_lens = 0;
    const uint64_t batch = (uint64_t)(s.b * s.hq), na = batch * (uint64_t)(s.sq * s.d),
                   nb = batch * (uint64_t)(s.skv * s.d), nc = batch * (uint64_t)(s.sq * s.skv);
    cl_mem m[3] = {NULL, NULL, NULL};
    if (!(m[0] = make_buffer(bn, "clblast", na * 4)) || !(m[1] = make_buffer(bn, "clblast", nb * 4)) ||
        !(m[2] = make_buffer(bn, "clblast", nc * 4))) {
        release(m, 3);
        return;
    }
    upload(bn, m[0], ID_Q, na, CLATTN_F32);
    upload(bn, m[1], ID_K, nb, CLATTN_F32);
    blas_job j = {m[0], m[1], m[2], (size_t)s.sq, (size_t)s.skv, (size_t)s.d, (size_t)batch,
                  s.scale > 0.0f ? s.scale : (float)(1.0 / sqrt((double)s.d)), CLBlastSuccess};
    result r = new_result("clblast", &s);
    if (measure(bn, enqueue_blas, &j, &r.ms_med, &r.ms_min) == 0) {
        r.gflops = 2.0 * (double)batch * (double)s.sq * (double)s.skv * s.d / (r.ms_med * 1e6);
        r.gbps = (double)(nc * 4) / (r.ms_med * 1e6);
        bn->clblast_ms = r.ms_med;
        if (bn->opt.check) { /* not clattn's result, but proves the peer computes the same thing */
            r.checked = 1;
            r.tol = tolerance(CLATTN_F32);
            r.err = check_attention(bn, &s, m[2], 1, NULL);
        }
        emit(bn, &r);
    }
    release(m, 3);
#else
    (void)sc;
    fputs("clblast: unavailable (clattn-bench was built without CLBlast)\n",
          bn->opt.csv ? stderr : stdout);
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* Shapes                                                                                       */

/* A shape of f32 with no masks or variants. */
static shape dims(long long b, long long hq, long long sq, long long skv, long long d)
{
    shape s;
    memset(&s, 0, sizeof s);
    s.b = b;
    s.hq = s.hkv = hq;
    s.sq = sq;
    s.skv = skv;
    s.d = s.dv = d;
    s.dt = CLATTN_F32;
    return s;
}

static shape default_shape(const bench *bn, int op)
{
    if (op == OP_SOFTMAX)
        return bn->gpu ? dims(1, 64, 4096, 4096, 0) : dims(1, 8, 1024, 1024, 0);
    if (op == OP_DECODE)
        return bn->gpu ? dims(16, 32, 1, 8192, 128) : dims(1, 8, 1, 65536, 64);
    return bn->gpu ? dims(4, 16, 4096, 4096, 64) : dims(1, 8, 1024, 1024, 64);
}

/* The per-op default with the command line's shape options applied. */
static shape op_shape(const bench *bn, int op)
{
    const options *o = &bn->opt;
    shape s = default_shape(bn, op);
    const int had_hkv_eq = s.hkv == s.hq, had_dv_eq = s.dv == s.d;
    if (o->b > 0)
        s.b = o->b;
    if (o->hq > 0)
        s.hq = o->hq;
    if (o->sq > 0)
        s.sq = o->sq;
    if (o->skv > 0)
        s.skv = o->skv;
    if (op == OP_SOFTMAX) {
        s.hkv = s.hq;
    } else {
        if (o->d > 0)
            s.d = o->d;
        s.hkv = o->hkv > 0 ? o->hkv : had_hkv_eq ? s.hq : s.hkv;
        s.dv = o->dv > 0 ? o->dv : had_dv_eq ? s.d : s.dv;
    }
    if (o->dtype >= 0)
        s.dt = (clattn_dtype)o->dtype;
    s.causal = o->causal;
    s.mask = o->mask;
    s.mask_left = o->window - 1; /* --mask window:W: the W keys ending at the diagonal */
    s.mask_right = 0;
    s.kv_lens = o->n_kv_len > 0;
    s.scale = o->scale;
    if (op == OP_FUSED || op == OP_BACKWARD)
        s.dropout = o->dropout;
    else if (op == OP_DROPOUT)
        s.dropout = o->dropout > 0.0f ? o->dropout : DROPOUT_DEFAULT_P;
    if (op == OP_UNFUSED || op == OP_FUSED || op == OP_DECODE || op == OP_BACKWARD || op == OP_DROPOUT) {
        s.mla = o->mla;
        s.window = o->var.window;
        s.win_left = o->var.win_left;
        s.win_right = o->var.win_right;
        s.chunk = o->var.chunk;
        s.softcap = o->var.softcap;
        s.sinks = o->var.sinks;
        s.sink_value = o->var.sink_value;
        s.alibi = o->var.alibi;
        s.score_mod = o->score_mod != NULL;
        s.mask_mod = o->mask_mod != NULL;
        if (s.mla && s.dv > s.d)
            die(EXIT_USAGE, "--mla: the value dimension %lld exceeds the key dimension %lld", s.dv, s.d);
        s.kv = o->kv;
        s.kt = o->kt >= 0 ? (clattn_dtype)o->kt : s.dt;
        s.vt = o->vt >= 0 ? (clattn_dtype)o->vt : s.dt;
        s.page = o->page;
        s.hnd = o->hnd;
        for (int w = 0; w < 2 && s.kv; w++) {
            const clattn_dtype t = w ? s.vt : s.kt;
            const long long d = w ? s.dv : s.d;
            if (t <= CLATTN_BF16 && t != s.dt)
                die(EXIT_USAGE, "--kv-type: %s %s needs --dtype %s (K and V of f32, f16 or bf16 are the "
                    "query's type)", w ? "V" : "K", clattn_dtype_name(t), clattn_dtype_name(t));
            if (clattn_dtype_block(t) > 1 && d % clattn_dtype_block(t))
                die(EXIT_USAGE, "--kv-type %s: %s's dimension %lld is not a multiple of %d", clattn_dtype_name(t),
                    w ? "V" : "K", d, clattn_dtype_block(t));
        }
        if (s.kv && s.mla && s.vt != s.kt)
            die(EXIT_USAGE, "--mla with --kv-type: V is a view of K, so it has K's type (one type, not K,V)");
        if (s.kv && s.mla)
            s.vt = s.kt;
    }
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* Command line                                                                                 */

static void usage(FILE *f)
{
    fputs("usage: clattn-bench [options]\n"
          "\n"
          "Times clattn's operations next to peers measured in the same run and prints ratios.\n"
          "\n"
          "  --device SPEC   device as clattn_create takes it: gpu, cpu, P:D, or a name substring\n"
          "                  (default: CLATTN_DEVICE, else the first GPU, else the first device)\n"
          "  --op LIST       comma list of copy, peak, scores, softmax, unfused, fused, decode,\n"
          "                  clblast, or all (default: all, these eight), and the training ops\n"
          "                  backward and dropout (named only: not in all)\n"
          "  --batch N --heads N --heads-kv N --seq-q N --seq-kv N --dim N --dim-v N\n"
          "                  override every selected op's default shape (softmax: heads, rows =\n"
          "                  seq-q, cols = seq-kv); --heads alone keeps heads-kv = heads\n"
          "  --dtype T       f32, f16 or bf16 storage for clattn's ops (CLBlast stays f32)\n"
          "  --causal        bottom-right causal masking for every op (default: off, and fused\n"
          "                  runs once more with causal to give the causal/non-causal ratio;\n"
          "                  where it runs on the matrix units, also once with the FMA kernel,\n"
          "                  the row fused_fma: see clattn-info's \"matrix units\")\n"
          "  --mask KIND     an additive mask [1][1][Sq][Skv] (f16 with --dtype f16, else f32) for\n"
          "                  scores, softmax, unfused, fused and decode: none (default); bias:\n"
          "                  values in [-1, 1), hiding nothing; window:W: each row sees the W keys\n"
          "                  ending at its diagonal key, -inf elsewhere (the diagonal taken against\n"
          "                  Skv: one mask for all batches, so it ignores --kv-len; causal does not)\n"
          "  --kv-len LIST   per-batch key lengths (kv_lengths), a comma list of counts cycled\n"
          "                  over the batch; the library clamps each to 0..Skv\n"
          "  --scale X       desc.scale (default: the library's 1/sqrt(D); needed above D 256)\n"
          "  --head-dim-v N  the same as --dim-v\n"
          "  --mla           V is a view of K's first Dv dims (DeepSeek MLA: --dim 576 --dim-v 512\n"
          "                  --heads-kv 1 --scale 1/sqrt(192), times YaRN's mscale^2 where the\n"
          "                  model sets it: docs/variants.md#head-sizes); decode's GB/s counts K once\n"
          "  --iters N       timed runs per op (default 10); the median and minimum are shown\n"
          "  --warmup N      untimed runs first, covering kernel builds (default 2)\n"
          "  --csv           one header line, then one line per measurement\n"
          "  --check         compare each timed result with a float64 host reference (a sample\n"
          "                  of rows for big shapes); exit 3 above tolerance\n"
          "                  (f32 1e-4, f16 2e-3, bf16 2e-2)\n"
          "  --help          this text\n",
          f);
    /* several literals: each within the 4095 characters C requires compilers to take */
    fputs("\n"
          "Variants (docs/variants.md), for unfused, fused and decode. Each such op runs plain,\n"
          "then with the variants (ratio variant ms / plain ms); a window adds the same window\n"
          "as a dense -inf mask and attention over just its L+R+1 keys (no causal):\n"
          "  --window L,R    row at diagonal position p sees keys p-L .. p+R (negative: unbounded)\n"
          "  --sliding W     a model's sliding_window W: --window W-1,0\n"
          "  --chunk C       chunked local attention: floor(k/C) == floor(p/C)\n"
          "  --softcap C     logit = C*tanh(logit/C) (Gemma 2: 50)\n"
          "  --sinks [V]     a sink logit per head: V for all, or (alone, or 'random') uniform in\n"
          "                  [0, ln Skv) per head\n"
          "  --alibi B       ALiBi with clattn_alibi_slopes(heads, B) (BLOOM: 8)\n"
          "  --score-mod FILE, --mask-mod FILE\n"
          "                  OpenCL C defining score_mod / mask_mod; --check evaluates them on the\n"
          "                  device for its reference; GFLOP/s counts mask_mod's pairs as visible\n"
          "\n"
          "KV caches (docs/kvcache.md), for fused and decode. Each runs its plain row, then the KV\n"
          "row (ratio KV ms / plain ms; with variants, against the variant row), and both show\n"
          "KV GB/s, the stored K and V bytes read per second (block and i8 scales included):\n"
          "  --kv-type T     K and V stored as T, or K,V (e.g. q8_0,q4_0): f32, f16, bf16 (= --dtype),\n"
          "                  i8 (random f32 scale per token and head), fp8_e4m3, fp8_e5m2 (per-tensor\n"
          "                  scales 0.5 for K, 0.25 for V), q8_0, q4_0 (dims multiples of 32)\n"
          "  --page N        paged K/V: N keys a page, pages shuffled in a pool of exactly the pages\n"
          "                  the key lengths need, through a block table (0: contiguous)\n"
          "  --page-layout L nhd ([pages][page][heads][dim], default) or hnd ([pages][heads][page][dim])\n"
          "A paged row gets a same-layout peer first: K/V of its types, contiguous in its pages'\n"
          "row order ([B][Skv][Hkv][D], mask column bshd, for nhd; [B][Hkv][Skv][D] for hnd, not\n"
          "run when that is the plain row), and the ratio paged ms / same-layout ms; after it two\n"
          "kv_read rows, a kernel that only reads the K/V rows (contiguous, then paged, timed in\n"
          "alternation): page-read ms / contiguous-read ms is the device's own cost of pages.\n"
          "--check decodes the stored bytes with the float64 reference's decoder. --csv adds the\n"
          "columns kv_k, kv_v, page, page_layout, kv_gbps, kv_gbps_ratio, same_layout_ratio (only\n"
          "with these options).\n"
          "\n",
          f);
    fputs("Training (clattn_attention_backward, dropout), on the fused op's problem (masks,\n"
          "key lengths, variants, --mla; K/V contiguous of --dtype):\n"
          "  --op backward   the fused forward with the LSE (row forward) and the backward on\n"
          "                  its out and LSE (row backward), timed in alternation; backward GFLOP/s counts\n"
          "                  2.5x the forward's FLOPs, its ratio backward / forward GFLOP/s (target\n"
          "                  >= 0.6). --check: dq, dk, dv (dsinks) against ref_attention_backward,\n"
          "                  max |err| / max |ref| per tensor (whole problem, or a kv head's group)\n"
          "  --dropout P     dropout probability in (0, 1) for fused, backward and dropout (mask\n"
          "                  column drop:P); --check applies the reference's Philox (ref_dropout_z)\n"
          "  --dropout-seed N  desc.dropout_seed, decimal or 0x hex (default 0xd50b0e7c1a77e5ed;\n"
          "                  offset 0)\n"
          "  --op dropout    fused without and with dropout (P: --dropout, default 0.1), timed in\n"
          "                  alternation, rows fused and dropout, ratio dropout ms / plain ms\n"
          "                  (target <= 1.15); --check: the dropout row against ref_attention\n"
          "\n"
          "Packed sequences (docs/kvcache.md), for fused:\n"
          "  --varlen LIST   self-attention prefill of sequences of these lengths (L_b queries and\n"
          "                  L_b keys each), packed [total][heads][dim]: one call a sequence (all\n"
          "                  enqueued, one clFinish), then ONE call with cu_seqlens_q/_k (ratio\n"
          "                  packed ms / one call each ms). --batch/--seq-q/--seq-kv unused; no\n"
          "                  masks, --kv-len, variants, --mla or KV options. --check compares both\n"
          "                  with float64 per sequence and prints their largest difference\n"
          "\n"
          "Default shapes, CPU devices: scores/unfused/fused B1 H8 S1024 d64 (fused also causal),\n"
          "softmax 8x1024 rows x 1024, decode B1 H8 Sq1 Skv65536 d64, copy 64 MiB.\n"
          "Other devices: B4 H16 S4096 d64, softmax 64x4096 rows x 4096, decode B16 H32 Sq1\n"
          "Skv8192 d128, copy 256 MiB. CLBlast runs SgemmStridedBatched on the scores shape.\n"
          "\n"
          "Timing is wall clock around enqueue + clFinish, so every kernel of an op counts.\n"
          "GFLOP/s: attention 2*Hq*pairs*(D+Dv), pairs = the (query, key) pairs of the batch\n"
          "that contribute (causal, key lengths, windows and chunks counted exactly); scores\n"
          "2*B*Hq*Sq*Skv*D; peak: the device's fp32 multiply-add rate (independent fma\n"
          "chains of float, float4, float8 and float16; the fastest width is shown, in the\n"
          "dtype column, its GFLOP/s from the fastest run), which bounds attention's GFLOP/s.\n"
          "GB/s (1e9 bytes): copy read+write, softmax in+out (+mask), decode Q+O (+mask) and\n"
          "the K and V rows of the keys some query row sees (key lengths, causal, windows and\n"
          "chunks counted; K alone with --mla), scores output written. Check errors are\n"
          "absolute up to magnitude 1 and relative above it; softmax's are relative to the\n"
          "row's largest probability.\n"
          "\n"
          "Each option once (--dim-v and --head-dim-v are one); --page-layout needs --page,\n"
          "--dropout-seed --dropout or --op dropout, --varlen fused in --op; --window and\n"
          "--sliding exclude each other.\n"
          "Exit status: 0 ok, 1 usage or failure, 2 no OpenCL device, 3 check above tolerance.\n",
          f);
}

static long long parse_count(const char *opt, const char *v, long long lo)
{
    char *end;
    errno = 0;
    const long long n = strtoll(v, &end, 10);
    if (errno || end == v || *end || n < lo) {
        fprintf(stderr, "clattn-bench: %s needs an integer >= %lld (got '%s')\n", opt, lo, v);
        exit(EXIT_USAGE);
    }
    return n;
}

static unsigned parse_ops(const char *list)
{
    unsigned ops = 0;
    const char *p = list;
    while (*p) {
        const size_t len = strcspn(p, ",");
        int found = 0;
        unsigned bits = 0;
        if (len == 3 && strncmp(p, "all", 3) == 0) {
            bits = OPS_ALL;
            found = 1;
        }
        for (int i = 0; i < OP_COUNT && !found; i++)
            if (strlen(op_names[i]) == len && strncmp(p, op_names[i], len) == 0) {
                bits = 1u << i;
                found = 1;
            }
        if (found && (ops & bits)) { /* "fused,fused" or "all,decode": each op once */
            fprintf(stderr, "clattn-bench: '%.*s' in --op names an op already listed (each once; all is",
                    (int)len, p);
            for (int i = 0, first = 1; i < OP_COUNT; i++)
                if (OPS_ALL & (1u << i)) {
                    fprintf(stderr, "%s%s", first ? " " : ",", op_names[i]);
                    first = 0;
                }
            fputs(")\n", stderr);
            exit(EXIT_USAGE);
        }
        ops |= bits;
        if (!found) {
            fprintf(stderr, "clattn-bench: unknown op '%.*s' in --op\n", (int)len, p);
            exit(EXIT_USAGE);
        }
        p += len;
        if (*p == ',')
            p++;
    }
    if (!ops) {
        fputs("clattn-bench: --op needs at least one op\n", stderr);
        exit(EXIT_USAGE);
    }
    return ops;
}

/* --mask none | bias | window:W */
static void parse_mask(const char *v, options *o)
{
    if (strcmp(v, "none") == 0) {
        o->mask = MASK_NONE;
    } else if (strcmp(v, "bias") == 0) {
        o->mask = MASK_BIAS;
    } else if (strncmp(v, "window:", 7) == 0) {
        o->mask = MASK_WINDOW;
        o->window = parse_count("--mask window:", v + 7, 1);
    } else {
        fprintf(stderr, "clattn-bench: --mask must be none, bias or window:W (got '%s')\n", v);
        exit(EXIT_USAGE);
    }
}

/* --kv-len N[,N...]: 1 to MAX_KV_LENS counts in 0 .. 2^31 - 1 (an int32 each). */
static void parse_kv_len(const char *v, options *o)
{
    o->n_kv_len = 0;
    for (const char *p = v;; p++) {
        char item[32];
        const size_t len = strcspn(p, ",");
        if (o->n_kv_len == MAX_KV_LENS || len == 0 || len >= sizeof item) {
            fprintf(stderr, "clattn-bench: --kv-len needs 1 to %d comma-separated counts (got '%s')\n",
                    MAX_KV_LENS, v);
            exit(EXIT_USAGE);
        }
        memcpy(item, p, len);
        item[len] = '\0';
        const long long n = parse_count("--kv-len", item, 0);
        if (n > INT32_MAX) {
            fprintf(stderr, "clattn-bench: --kv-len: %lld does not fit an int32\n", n);
            exit(EXIT_USAGE);
        }
        o->kv_len[o->n_kv_len++] = n;
        p += len;
        if (!*p)
            break;
    }
}

/* --varlen L[,L...]: 1 to MAX_KV_LENS sequence lengths, each 1 .. CLATTN_MAX_SEQ. */
static void parse_varlen(const char *v, options *o)
{
    o->n_varlen = 0;
    for (const char *p = v;; p++) {
        char item[32];
        const size_t len = strcspn(p, ",");
        if (o->n_varlen == MAX_KV_LENS || len == 0 || len >= sizeof item) {
            fprintf(stderr, "clattn-bench: --varlen needs 1 to %d comma-separated lengths (got '%s')\n", MAX_KV_LENS,
                    v);
            exit(EXIT_USAGE);
        }
        memcpy(item, p, len);
        item[len] = '\0';
        const long long n = parse_count("--varlen", item, 1);
        if (n > CLATTN_MAX_SEQ) {
            fprintf(stderr, "clattn-bench: --varlen: %lld is longer than CLATTN_MAX_SEQ (%lld)\n", n,
                    (long long)CLATTN_MAX_SEQ);
            exit(EXIT_USAGE);
        }
        o->varlen[o->n_varlen++] = n;
        p += len;
        if (!*p)
            break;
    }
}

/* A float option's value: finite, and > 0 unless any_sign. */
static float parse_float(const char *opt, const char *v, int any_sign)
{
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || (!any_sign && !(x > 0.0)) || fabs(x) > 3.4e38) {
        fprintf(stderr, "clattn-bench: %s needs a finite %snumber (got '%s')\n", opt, any_sign ? "" : "positive ",
                v);
        exit(EXIT_USAGE);
    }
    return (float)x;
}

/* --window L,R: each an integer, negative for unbounded (stored as -1). */
static void parse_window(const char *v, options *o)
{
    char *end;
    errno = 0;
    const long long l = strtoll(v, &end, 10);
    const int ok1 = !errno && end != v && *end == ',';
    const char *r = ok1 ? end + 1 : v;
    const long long rr = ok1 ? strtoll(r, &end, 10) : 0;
    if (!ok1 || errno || end == r || *end || l > ((long long)1 << 40) || rr > ((long long)1 << 40)) {
        fprintf(stderr, "clattn-bench: --window needs L,R: two integers, negative for unbounded (got '%s')\n", v);
        exit(EXIT_USAGE);
    }
    o->var.window = 1;
    o->var.win_left = l < 0 ? -1 : l;
    o->var.win_right = rr < 0 ? -1 : rr;
}

/* --sinks random|V: per-head random logits, or one logit (-inf: none, as the library reads it). */
static void parse_sinks(const char *v, options *o)
{
    if (strcmp(v, "random") == 0 || strcmp(v, "rand") == 0) {
        o->var.sinks = SINKS_RANDOM;
        return;
    }
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    if (errno || end == v || *end || !(x == -INFINITY || (isfinite(x) && fabs(x) <= 3.4e38))) {
        fprintf(stderr, "clattn-bench: --sinks needs random or a number (-inf: none) (got '%s')\n", v);
        exit(EXIT_USAGE);
    }
    o->var.sinks = SINKS_VALUE;
    o->var.sink_value = (float)x;
}

/* --kv-type T or K,V: storage types by clattn_dtype_name. */
static void parse_kv_type(const char *v, options *o)
{
    int t[2] = {-1, -1}, n = 0;
    for (const char *p = v;; p++) {
        const size_t len = strcspn(p, ",");
        for (int d = 0; n < 2 && clattn_dtype_name((clattn_dtype)d); d++)
            if (strlen(clattn_dtype_name((clattn_dtype)d)) == len &&
                strncmp(p, clattn_dtype_name((clattn_dtype)d), len) == 0)
                t[n] = d;
        if (n == 2 || t[n] < 0) {
            fprintf(stderr, "clattn-bench: --kv-type needs T or K,V, each f32, f16, bf16, i8, fp8_e4m3, fp8_e5m2, "
                            "q8_0 or q4_0 (got '%s')\n", v);
            exit(EXIT_USAGE);
        }
        n++;
        p += len;
        if (!*p)
            break;
    }
    o->kv = 1;
    o->kt = t[0];
    o->vt = t[n - 1];
}

/* The whole of a --score-mod / --mask-mod file, as text. */
static char *read_source(const char *opt, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "clattn-bench: %s %s: %s\n", opt, path, strerror(errno));
        exit(EXIT_USAGE);
    }
    size_t n = 0, cap = 4096;
    char *text = xmalloc(cap);
    for (size_t got; (got = fread(text + n, 1, cap - 1 - n, f)) > 0;) {
        n += got;
        if (n == cap - 1) {
            char *bigger = realloc(text, cap *= 2);
            if (!bigger)
                die(EXIT_ERROR, "out of host memory (%zu bytes)", cap);
            text = bigger;
        }
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad || n == 0 || memchr(text, '\0', n)) {
        fprintf(stderr, "clattn-bench: %s %s: %s\n", opt, path,
                bad ? "read failed" : n == 0 ? "empty file" : "holds a NUL byte: not source text");
        exit(EXIT_USAGE);
    }
    text[n] = '\0';
    return text;
}

static void parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->ops = OPS_ALL;
    o->dropout_seed = DROPOUT_SEED;
    o->b = o->hq = o->hkv = o->sq = o->skv = o->d = o->dv = -1;
    o->dtype = -1;
    o->kt = o->vt = -1;
    o->iters = 10;
    o->warmup = 2;
    static const struct {
        const char *name;
        int what;
    } valued[] = {{"--device", 0}, {"--op", 1},      {"--batch", 2},  {"--heads", 3},
                  {"--heads-kv", 4}, {"--seq-q", 5}, {"--seq-kv", 6}, {"--dim", 7},
                  {"--dim-v", 8},  {"--dtype", 9},   {"--iters", 10}, {"--warmup", 11},
                  {"--mask", 12},  {"--kv-len", 13}, {"--window", 14}, {"--sliding", 15},
                  {"--chunk", 16}, {"--softcap", 17}, {"--sinks", 18}, {"--alibi", 19},
                  {"--score-mod", 20}, {"--mask-mod", 21}, {"--scale", 22}, {"--head-dim-v", 8},
                  {"--kv-type", 23}, {"--page", 24}, {"--page-layout", 25}, {"--varlen", 26},
                  {"--dropout", 27}, {"--dropout-seed", 28}};
    /* Each valued option once (by its number: --dim-v and --head-dim-v are one): with two, the
     * last one won without a word. */
    const char *given[32] = {NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--csv") == 0) {
            o->csv = 1;
            continue;
        } else if (strcmp(a, "--check") == 0) {
            o->check = 1;
            continue;
        } else if (strcmp(a, "--causal") == 0) {
            o->causal = 1;
            continue;
        } else if (strcmp(a, "--mla") == 0) {
            o->mla = 1;
            continue;
        } else if (strcmp(a, "--sinks") == 0 && (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)) {
            if (given[18])
                die(EXIT_USAGE, "--sinks is given twice");
            given[18] = a;
            o->var.sinks = SINKS_RANDOM; /* --sinks alone: random per-head logits */
            continue;
        }
        int what = -1;
        const char *v = NULL;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0] && what < 0; k++) {
            const size_t len = strlen(valued[k].name);
            if (strcmp(a, valued[k].name) == 0) {
                if (i + 1 >= argc) {
                    fprintf(stderr, "clattn-bench: %s needs a value\n", a);
                    exit(EXIT_USAGE);
                }
                what = valued[k].what;
                v = argv[++i];
            } else if (strncmp(a, valued[k].name, len) == 0 && a[len] == '=') {
                what = valued[k].what;
                v = a + len + 1;
            }
        }
        if (what >= 0 && given[what]) {
            const int n = (int)strcspn(a, "="), m = (int)strcspn(given[what], "=");
            if (n == m && strncmp(a, given[what], (size_t)n) == 0)
                die(EXIT_USAGE, "%.*s is given twice (it takes one value)", n, a);
            die(EXIT_USAGE, "%.*s and %.*s are one option, given twice", m, given[what], n, a);
        }
        if (what >= 0)
            given[what] = a;
        if ((what == 14 && given[15]) || (what == 15 && given[14]))
            die(EXIT_USAGE, "--window and --sliding both set the window: give one");
        switch (what) {
        case 0:
            if (!*v)
                die(EXIT_USAGE, "--device '': an empty spec (leave --device out for the default device)");
            o->device = v;
            break;
        case 1: o->ops = parse_ops(v); break;
        case 2: o->b = parse_count("--batch", v, 1); break;
        case 3: o->hq = parse_count("--heads", v, 1); break;
        case 4: o->hkv = parse_count("--heads-kv", v, 1); break;
        case 5: o->sq = parse_count("--seq-q", v, 1); break;
        case 6: o->skv = parse_count("--seq-kv", v, 1); break;
        case 7: o->d = parse_count("--dim", v, 1); break;
        case 8: o->dv = parse_count("--dim-v", v, 1); break;
        case 9:
            if (strcmp(v, "f32") == 0)
                o->dtype = CLATTN_F32;
            else if (strcmp(v, "f16") == 0)
                o->dtype = CLATTN_F16;
            else if (strcmp(v, "bf16") == 0)
                o->dtype = CLATTN_BF16;
            else {
                fprintf(stderr, "clattn-bench: --dtype must be f32, f16 or bf16 (got '%s')\n", v);
                exit(EXIT_USAGE);
            }
            break;
        case 10: o->iters = (int)parse_count("--iters", v, 1); break;
        case 11: o->warmup = (int)parse_count("--warmup", v, 0); break;
        case 12: parse_mask(v, o); break;
        case 13: parse_kv_len(v, o); break;
        case 14: parse_window(v, o); break;
        case 15:
            o->var.window = 1;
            o->var.win_left = parse_count("--sliding", v, 1) - 1;
            o->var.win_right = 0;
            break;
        case 16: o->var.chunk = parse_count("--chunk", v, 1); break;
        case 17: o->var.softcap = parse_float("--softcap", v, 0); break;
        case 18: parse_sinks(v, o); break;
        case 19: o->var.alibi = parse_float("--alibi", v, 0); break;
        case 20:
            free(o->score_mod);
            o->score_mod = read_source("--score-mod", v);
            break;
        case 21:
            free(o->mask_mod);
            o->mask_mod = read_source("--mask-mod", v);
            break;
        case 22: o->scale = parse_float("--scale", v, 0); break;
        case 23: parse_kv_type(v, o); break;
        case 24:
            o->kv = 1;
            o->page = parse_count("--page", v, 0);
            if (o->page > INT32_MAX)
                die(EXIT_USAGE, "--page: %lld keys a page is more than clattn takes", o->page);
            break;
        case 25:
            o->kv = 1;
            if (strcmp(v, "nhd") == 0 || strcmp(v, "hnd") == 0) {
                o->hnd = v[0] == 'h';
            } else {
                fprintf(stderr, "clattn-bench: --page-layout must be nhd or hnd (got '%s')\n", v);
                exit(EXIT_USAGE);
            }
            break;
        case 26: parse_varlen(v, o); break;
        case 27:
            o->dropout = parse_float("--dropout", v, 1);
            if (!(o->dropout > 0.0f && o->dropout < 1.0f))
                die(EXIT_USAGE, "--dropout needs a probability in (0, 1) (got '%s')", v);
            break;
        case 28: {
            char *end;
            errno = 0;
            o->dropout_seed = strtoull(v, &end, 0);
            if (errno || end == v || *end || v[0] == '-')
                die(EXIT_USAGE, "--dropout-seed needs an unsigned 64-bit integer, decimal or 0x hex (got '%s')", v);
            break;
        }
        default:
            fprintf(stderr, "clattn-bench: unknown option '%s'\n", a);
            usage(stderr);
            exit(EXIT_USAGE);
        }
    }
    if (o->iters > 100000 || o->warmup > 100000)
        die(EXIT_USAGE, "--iters and --warmup must be at most 100000");
    /* Options that only mean something with another one are refused without it, not ignored. */
    if (given[25] && !given[24])
        die(EXIT_USAGE, "--page-layout needs --page (the layout is the page pool's)");
    if (given[28] && !given[27] && !(o->ops & (1u << OP_DROPOUT)))
        die(EXIT_USAGE, "--dropout-seed needs --dropout or --op dropout");
    if (o->n_varlen && !(o->ops & (1u << OP_FUSED)))
        die(EXIT_USAGE, "--varlen times the fused op, which --op leaves out");
    /* --varlen times plain attention of packed sequences: what else changes the problem is refused
     * rather than silently left out (its reference checks plain causal or non-causal attention) */
    if (o->n_varlen &&
        (o->mask != MASK_NONE || o->n_kv_len || o->mla || o->kv || o->var.window || o->var.chunk ||
         o->var.softcap > 0.0f || o->var.sinks || o->var.alibi > 0.0f || o->score_mod || o->mask_mod ||
         o->dropout > 0.0f))
        die(EXIT_USAGE, "--varlen takes the shape options (--heads, --heads-kv, --dim, --dim-v, --dtype, --scale) "
                        "and --causal only: not --mask, --kv-len, --mla, variants, KV-cache options or --dropout "
                        "(clattn refuses dropout with packed sequences)");
    /* Above 256 the library takes no default scale, since the right one is the model's (MLA). */
    if (o->d > 256 && o->scale == 0.0f)
        die(EXIT_USAGE, "--dim %lld needs --scale (the library's 1/sqrt(D) stops at 256; DeepSeek's MLA "
                        "uses 1/sqrt(192) = 0.0721688 times YaRN's mscale^2, never 1/sqrt(576))", o->d);
}

/* ------------------------------------------------------------------------------------------ */

static void device_string(cl_device_id d, cl_device_info what, char *buf, size_t size)
{
    buf[0] = '\0';
    if (clGetDeviceInfo(d, what, size - 1, buf, NULL) != CL_SUCCESS)
        snprintf(buf, size, "?");
    buf[size - 1] = '\0';
}

static void open_device(bench *bn)
{
    clattn_status st = clattn_create(bn->opt.device, &bn->ctx);
    if (st == CLATTN_NO_DEVICE)
        die(EXIT_NO_DEVICE, "no OpenCL device: %s", clattn_last_error(NULL));
    if (st != CLATTN_SUCCESS)
        die(EXIT_ERROR, "clattn_create: %s: %s", clattn_status_name(st), clattn_last_error(NULL));
    bn->clctx = clattn_cl_context(bn->ctx);
    bn->queue = clattn_queue(bn->ctx);
    bn->dev = clattn_device(bn->ctx);
    device_string(bn->dev, CL_DEVICE_NAME, bn->dev_name, sizeof bn->dev_name);
    device_string(bn->dev, CL_DRIVER_VERSION, bn->driver, sizeof bn->driver);
    device_string(bn->dev, CL_DEVICE_VERSION, bn->dev_version, sizeof bn->dev_version);
    cl_platform_id plat = NULL;
    bn->plat_name[0] = '\0';
    if (clGetDeviceInfo(bn->dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL) != CL_SUCCESS ||
        clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof bn->plat_name - 1, bn->plat_name, NULL) !=
            CL_SUCCESS)
        snprintf(bn->plat_name, sizeof bn->plat_name, "?");
    bn->plat_name[sizeof bn->plat_name - 1] = '\0';
    cl_device_type type = 0;
    check_cl(clGetDeviceInfo(bn->dev, CL_DEVICE_TYPE, sizeof type, &type, NULL), "clGetDeviceInfo");
    bn->gpu = !(type & CL_DEVICE_TYPE_CPU);
    check_cl(clGetDeviceInfo(bn->dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof bn->max_alloc,
                             &bn->max_alloc, NULL),
             "clGetDeviceInfo");
    if (clGetDeviceInfo(bn->dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof bn->compute_units,
                        &bn->compute_units, NULL) != CL_SUCCESS)
        bn->compute_units = 0;
}

static void print_ratios(const bench *bn)
{
    if (bn->params[0]) /* on stderr with --csv, never inside the CSV */
        fprintf(bn->opt.csv ? stderr : stdout,
                "\nkernel parameters (clattn_get_params; each operation then fits them to the device, "
                "merge runs when keys are split):\n%s",
                bn->params);
    if (bn->opt.csv || bn->n_ratios == 0)
        return;
    int ww = 22, hw = 37; /* the widths of the first runs' names, widened to the longest */
    for (int i = 0; i < bn->n_ratios; i++) {
        ww = (int)strlen(bn->ratios[i].what) > ww ? (int)strlen(bn->ratios[i].what) : ww;
        hw = (int)strlen(bn->ratios[i].how) > hw ? (int)strlen(bn->ratios[i].how) : hw;
    }
    puts("\nratios (same run):");
    for (int i = 0; i < bn->n_ratios; i++)
        printf("  %-*s %-*s %8.4g\n", ww, bn->ratios[i].what, hw, bn->ratios[i].how, bn->ratios[i].v);
}

/* Names of the variant and KV rows' ratios, per attention op. */
static const char *ratio_text(int kind, int which)
{
    static const char *const t[3][7] = {
        {"unfused: variants vs plain", "unfused: window vs dense mask", "unfused: window vs W keys",
         "unfused: KV time vs contiguous", "unfused: KV bytes/s vs contiguous",
         "unfused: contiguous same layout vs plain", "unfused: paged vs contiguous same layout"},
        {"fused: variants vs plain", "fused: window vs dense mask", "fused: window vs W keys",
         "fused: KV time vs contiguous", "fused: KV bytes/s vs contiguous",
         "fused: contiguous same layout vs plain", "fused: paged vs contiguous same layout"},
        {"decode: variants vs plain", "decode: window vs dense mask", "decode: window vs W keys",
         "decode: KV time vs contiguous", "decode: KV bytes/s vs contiguous",
         "decode: contiguous same layout vs plain", "decode: paged vs contiguous same layout"}};
    return t[kind == OP_UNFUSED ? 0 : kind == OP_FUSED ? 1 : 2][which];
}

/* The rows a variant shape s adds after its plain row (plain_ms: its median, NAN if skipped):
 * s itself, with the overhead ratio, into *vr (ms_med NAN if skipped); with a window, the same
 * window as a dense -inf mask
 * [1][1][Sq][Skv] (where no other mask and no key lengths are given: the dense mask is shared by
 * the batches, its diagonal taken against Skv) and attention over just the window's keys (both
 * extents bounded: Skv = L + R + 1, no window and no causal, every row seeing all of them). */
static void run_variant_rows(bench *bn, int kind, const shape *s, double plain_ms, result *vr)
{
    FILE *info = bn->opt.csv ? stderr : stdout;
    result r;
    run_attn(bn, kind, s, &r);
    *vr = r;
    if (isnan(r.ms_med))
        return;
    r.ratio_name = "variant_ms/plain_ms";
    r.ratio = r.ms_med / plain_ms;
    add_ratio(bn, ratio_text(kind, 0), "variant ms / plain ms (1: no overhead)", r.ratio);
    emit(bn, &r);
    if (!s->window)
        return;
    if (s->mask == MASK_NONE && !s->kv_lens) {
        shape m = *s;
        m.window = 0;
        m.mask = MASK_WINDOW;
        m.mask_left = s->win_left;
        m.mask_right = s->win_right;
        result d;
        run_attn(bn, kind, &m, &d);
        if (!isnan(d.ms_med)) {
            d.ratio_name = "mask_ms/window_ms";
            d.ratio = d.ms_med / r.ms_med;
            add_ratio(bn, ratio_text(kind, 1), "dense-mask ms / window ms (>1: window faster)", d.ratio);
            emit(bn, &d);
        }
    } else {
        fprintf(info, "%s: no dense-mask twin of the window: it needs no --mask and no --kv-len\n",
                op_names[kind]);
    }
    if (s->win_left >= 0 && s->win_right >= 0 && !s->kv_lens) {
        shape w = *s;
        w.window = 0;
        w.causal = 0;
        if (s->win_left + s->win_right + 1 < w.skv)
            w.skv = s->win_left + s->win_right + 1;
        result k;
        run_attn(bn, kind, &w, &k);
        if (!isnan(k.ms_med)) {
            k.ratio_name = "window_ms/wkeys_ms";
            k.ratio = r.ms_med / k.ms_med;
            add_ratio(bn, ratio_text(kind, 2), "window ms / W-keys ms (1: cost follows keys)", k.ratio);
            emit(bn, &k);
        }
    } else {
        fprintf(info, "%s: no W-keys row: it needs both window extents bounded and no --kv-len\n",
                op_names[kind]);
    }
}

/* The device's own cost of pages: a kernel that only reads K and V, the rows of every (batch, kv
 * head)'s keys (the union of its query rows' spans) in key order, through the block table, from
 * the paged row's pool and from the same-layout contiguous buffers (a one-entry table a batch,
 * a page of Skv keys); the two timed in alternation (measure_pair). A work-group takes a (batch, kv head) and
 * a share of its keys (splits, so that there are work-groups enough for the device); on a GPU its
 * lanes take consecutive words of a page's rows, on a CPU one work-item goes row by row (one
 * division a page). Words of 16, 4 or 1 bytes: the widest that divides both rows. Each row's
 * words are XORed, times an odd number of its (batch, kv head, key) (ROWF), into the output, whose
 * XOR over all work-items the two reads must agree on: a layout, table or span that reads other
 * rows, or the right ones in other places, would change it. */
static const char kvread_src[] =
    "#if W == 16\n"
    "typedef uint4 word;\n"
    "#elif W == 4\n"
    "typedef uint word;\n"
    "#else\n"
    "typedef uchar word;\n"
    "#endif\n"
    "/* an odd multiplier a row: the words of (batch, kv head) bh's key j, K's times ROWF, V's times\n"
    " * ROWF + 2 (a layout that reads other rows than it should changes the total) */\n"
    "#define ROWF(bh, j) (((uint)(bh) * 0x9E3779B1u + (uint)(j) * 0x85EBCA77u) | 1u)\n"
    "__kernel void kv_read(__global const word *K, __global const word *V, __global const int *table,\n"
    "                      int nb, int page, __global const int *span, int nsplit, int hkv,\n"
    "                      ulong kps, ulong khs, ulong krs, int kw, ulong vps, ulong vhs, ulong vrs, int vw,\n"
    "                      __global word *out)\n"
    "{\n"
    "    const int lane = get_local_id(0), g = get_group_id(0);\n"
    "    const int sp = g % nsplit, bh = g / nsplit, b = bh / hkv, h = bh % hkv;\n"
    "    const int lo = span[2 * b], hi = span[2 * b + 1];\n"
    "    const int per = ((hi - lo + nsplit - 1) / nsplit + 15) / 16 * 16;\n"
    "    const int k1 = min(hi, lo + (sp + 1) * per);\n"
    "    word acc = (word)(0);\n"
    "    for (int j = lo + sp * per; j < k1;) {\n"
    "        const ulong pg = (ulong)table[b * nb + j / page];\n"
    "        const int r0 = j % page, n = min(k1 - j, page - r0);\n"
    "        __global const word *kp = K + pg * kps + (ulong)h * khs + (ulong)r0 * krs;\n"
    "        __global const word *vp = V + pg * vps + (ulong)h * vhs + (ulong)r0 * vrs;\n"
    "#if LWS == 1\n"
    "        for (int r = 0; r < n; r++) {\n"
    "            word kx = (word)(0), vx = (word)(0);\n"
    "            for (int x = 0; x < kw; x++)\n"
    "                kx ^= kp[(ulong)r * krs + x];\n"
    "            for (int x = 0; x < vw; x++)\n"
    "                vx ^= vp[(ulong)r * vrs + x];\n"
    "            acc ^= kx * ROWF(bh, j + r) ^ vx * (ROWF(bh, j + r) + 2u);\n"
    "        }\n"
    "#else\n"
    "        for (int i = lane; i < n * kw; i += LWS)\n"
    "            acc ^= kp[(ulong)(i / kw) * krs + i % kw] * ROWF(bh, j + i / kw);\n"
    "        for (int i = lane; i < n * vw; i += LWS)\n"
    "            acc ^= vp[(ulong)(i / vw) * vrs + i % vw] * (ROWF(bh, j + i / vw) + 2u);\n"
    "#endif\n"
    "        j += n;\n"
    "    }\n"
    "    out[get_global_id(0)] = acc;\n"
    "}\n";

typedef struct kvread_job {
    cl_kernel kernel;
    size_t global, local;
} kvread_job;

static int enqueue_kvread(bench *bn, void *job)
{
    const kvread_job *j = job;
    check_cl(clEnqueueNDRangeKernel(bn->queue, j->kernel, 1, NULL, &j->global, &j->local, 0, NULL, NULL),
             "clEnqueueNDRangeKernel");
    return 0;
}

/* kv_read's arguments for the K and V of a (its buffers) stored as s says: paged (s->page, its
 * table) or contiguous (BHSD or, with s->bshd, BSHD: the identity table in *ident, made here);
 * rows of rk and rv bytes (rv 0: V is K's view, not read). */
static int kvread_args(bench *bn, cl_kernel k, const shape *s, attn_run *a, uint64_t rk, uint64_t rv, cl_mem span,
                       int nsplit, int w, cl_mem out, cl_mem *ident)
{
    const uint64_t H = (uint64_t)s->hkv, P = s->page ? (uint64_t)s->page : (uint64_t)s->skv;
    /* strides of a page, a head and a row in bytes, per unit of row bytes */
    const int rows_first = s->page ? !s->hnd : s->bshd; /* [page][row][head] order */
    const uint64_t ps = P * H, hs = rows_first ? 1 : P, rs = rows_first ? H : 1;
    cl_mem table = a->m[8];
    cl_int nb = s->page ? (cl_int)a->pg.nb : 1, page = (cl_int)P, ns = nsplit, hkv = (cl_int)s->hkv;
    if (!s->page) {
        cl_int *id = xmalloc_n((uint64_t)s->b, sizeof *id);
        for (long long b = 0; b < s->b; b++)
            id[b] = (cl_int)b;
        *ident = make_buffer(bn, "kv_read", (uint64_t)s->b * sizeof(cl_int));
        if (*ident)
            check_cl(clEnqueueWriteBuffer(bn->queue, *ident, CL_TRUE, 0, (size_t)s->b * sizeof(cl_int), id, 0,
                                          NULL, NULL),
                     "clEnqueueWriteBuffer");
        free(id);
        if (!*ident)
            return -1;
        table = *ident;
    }
    const cl_ulong kps = ps * rk / (uint64_t)w, khs = hs * rk / (uint64_t)w, krs = rs * rk / (uint64_t)w,
                   vps = ps * rv / (uint64_t)w, vhs = hs * rv / (uint64_t)w, vrs = rs * rv / (uint64_t)w;
    const cl_int kw = (cl_int)(rk / (uint64_t)w), vw = (cl_int)(rv / (uint64_t)w);
    cl_mem vbuf = a->m[2] ? a->m[2] : a->m[1];
    const struct {
        size_t size;
        const void *v;
    } args[] = {{sizeof(cl_mem), &a->m[1]}, {sizeof(cl_mem), &vbuf}, {sizeof(cl_mem), &table},
                {sizeof nb, &nb},           {sizeof page, &page},    {sizeof(cl_mem), &span},
                {sizeof ns, &ns},           {sizeof hkv, &hkv},      {sizeof kps, &kps},
                {sizeof khs, &khs},         {sizeof krs, &krs},      {sizeof kw, &kw},
                {sizeof vps, &vps},         {sizeof vhs, &vhs},      {sizeof vrs, &vrs},
                {sizeof vw, &vw},           {sizeof(cl_mem), &out}};
    for (cl_uint i = 0; i < sizeof args / sizeof args[0]; i++)
        check_cl(clSetKernelArg(k, i, args[i].size, args[i].v), "clSetKernelArg");
    return 0;
}

/* After a paged KV row (shape s): kv_read on its pool and on the same-layout contiguous buffers,
 * two rows "kv_read" (GB/s: the bytes read; the contiguous one first), and the ratio page-read ms
 * / contiguous-read ms, what pages cost the device's memory system itself, to set beside the
 * paged row's paged ms / same-layout ms. Not a ceiling of the attention's GB/s: one work-item
 * reading a head's rows in key order, without the prefetches the CPU kernels issue, reads NHD's
 * rows (H·D apart) slower than the decode does. */
static void run_page_reads(bench *bn, int kind, const shape *s)
{
    FILE *info = bn->opt.csv ? stderr : stdout;
    if (s->skv > INT32_MAX || s->b * s->hkv > INT32_MAX)
        return;
    shape cs = *s;
    cs.page = 0;
    cs.hnd = 0;
    cs.bshd = !s->hnd;
    attn_run *ar = xmalloc_n(2, sizeof *ar);
    memset(ar, 0, 2 * sizeof *ar);
    cl_mem span = NULL, out[2] = {NULL, NULL}, ident = NULL;
    cl_program prog = NULL;
    cl_kernel kk[2] = {NULL, NULL};
    if (attn_setup(bn, kind, s, &ar[0]) || attn_setup(bn, kind, &cs, &ar[1])) {
        fprintf(info, "kv_read: skipped: the buffers do not fit\n");
        goto done;
    }
    /* Each batch's keys: the union of its rows' spans. */
    cl_int *sp = xmalloc_n(2 * (uint64_t)s->b, sizeof *sp);
    double bytes = 0.0;
    const uint64_t rk = row_bytes(k_type(s), s->d), rv = s->mla ? 0 : row_bytes(v_type(s), s->dv);
    long long maxkeys = 0;
    for (long long b = 0; b < s->b; b++) {
        long long lo = LLONG_MAX, hi = -1;
        for (long long i = 0; i < s->sq; i++) {
            long long l, h;
            row_span(bn, s, b, i, &l, &h);
            if (h >= l) {
                lo = l < lo ? l : lo;
                hi = h > hi ? h : hi;
            }
        }
        if (hi < 0)
            lo = 0;
        sp[2 * b] = (cl_int)lo;
        sp[2 * b + 1] = (cl_int)(hi + 1);
        bytes += (double)(hi + 1 - lo) * (double)s->hkv * (double)(rk + rv);
        maxkeys = hi + 1 - lo > maxkeys ? hi + 1 - lo : maxkeys;
    }
    const int w = (rk % 16 == 0 && rv % 16 == 0) ? 16 : (rk % 4 == 0 && rv % 4 == 0) ? 4 : 1;
    const size_t lws = bn->gpu ? 64 : 1;
    const long long groups_bh = s->b * s->hkv, want = 8LL * (bn->compute_units ? bn->compute_units : 1);
    long long nsplit = (want + groups_bh - 1) / groups_bh;
    if (nsplit > (maxkeys + 15) / 16)
        nsplit = (maxkeys + 15) / 16 > 0 ? (maxkeys + 15) / 16 : 1;
    const size_t ngroups = (size_t)(groups_bh * nsplit);
    span = make_buffer(bn, "kv_read", 2 * (uint64_t)s->b * sizeof(cl_int));
    const uint64_t out_bytes = (uint64_t)ngroups * lws * (uint64_t)w;
    for (int i = 0; i < 2; i++)
        out[i] = span ? make_buffer(bn, "kv_read", out_bytes) : NULL;
    if (!out[0] || !out[1]) {
        free(sp);
        goto done;
    }
    check_cl(clEnqueueWriteBuffer(bn->queue, span, CL_TRUE, 0, 2 * (size_t)s->b * sizeof(cl_int), sp, 0, NULL, NULL),
             "clEnqueueWriteBuffer");
    free(sp);
    char opts[64];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DW=%d -DLWS=%zu", w, lws);
    const char *src = kvread_src;
    cl_int err;
    prog = clCreateProgramWithSource(bn->clctx, 1, &src, NULL, &err);
    check_cl(err, "clCreateProgramWithSource");
    if (clBuildProgram(prog, 1, &bn->dev, opts, NULL, NULL) != CL_SUCCESS) {
        fprintf(info, "kv_read: skipped: the kernel did not build\n");
        goto done;
    }
    for (int i = 0; i < 2; i++) {
        kk[i] = clCreateKernel(prog, "kv_read", &err);
        check_cl(err, "clCreateKernel");
        if (kvread_args(bn, kk[i], i ? &cs : s, &ar[i], rk, rv, span, (int)nsplit, w, out[i], &ident))
            goto done;
    }
    kvread_job jp = {kk[0], ngroups * lws, lws}, jc = {kk[1], ngroups * lws, lws};
    double med[2], mn[2];
    if (measure_pair(bn, enqueue_kvread, &jc, enqueue_kvread, &jp, med, mn))
        goto done;
    /* Both read the same rows: the XOR of everything each read must agree (wrong strides, table
     * entries or spans in either would not). */
    unsigned char *x = xmalloc_n(2, (size_t)out_bytes), fold[2][16] = {{0}};
    for (int i = 0; i < 2; i++) {
        check_cl(clEnqueueReadBuffer(bn->queue, out[i], CL_TRUE, 0, (size_t)out_bytes, x + i * out_bytes, 0, NULL,
                                     NULL),
                 "clEnqueueReadBuffer");
        for (uint64_t n = 0; n < out_bytes; n++)
            fold[i][n % (uint64_t)w] ^= x[i * out_bytes + n];
    }
    free(x);
    if (memcmp(fold[0], fold[1], sizeof fold[0])) {
        fprintf(stderr, "kv_read: FAILED: the paged and the contiguous reads did not read the same bytes\n");
        bn->check_failed = 1;
    }
    result rc = new_result("kv_read", &cs), rp = new_result("kv_read", s);
    rc.ms_med = med[0];
    rc.ms_min = mn[0];
    rp.ms_med = med[1];
    rp.ms_min = mn[1];
    rc.gbps = rc.kv_gbps = bytes / (med[0] * 1e6);
    rp.gbps = rp.kv_gbps = bytes / (med[1] * 1e6);
    rp.ratio_name = "page_read_ms/contig_read_ms";
    rp.ratio = med[1] / med[0];
    emit(bn, &rc);
    emit(bn, &rp);
    add_ratio(bn, kind == OP_DECODE ? "decode: page reads vs contiguous reads" : "fused: page reads vs contiguous reads",
              "page-read ms / contiguous-read ms (the device's own cost of pages)", rp.ratio);
done:
    for (int i = 0; i < 2; i++)
        if (kk[i])
            clReleaseKernel(kk[i]);
    if (prog)
        clReleaseProgram(prog);
    cl_mem m[4] = {span, out[0], out[1], ident};
    release(m, 4);
    attn_free(&ar[0]);
    attn_free(&ar[1]);
    free(ar);
}

/* The KV rows of shape s (s->kv: K and V in their storage types, paged with s->page) after its
 * peer, the same problem with contiguous K and V of s's dtype in [B][Hkv][Skv][D] order (the
 * plain row, or the variant row with variants). Paged, first the same-layout contiguous row: K
 * and V of s's storage types without pages, in the row order of the pool's pages
 * ([B][Skv][Hkv][D] for NHD, [B][Hkv][Skv][D] for HND), unless that is the peer itself (HND with
 * K and V of the dtype); its ratio is its ms / the peer's. Then the KV row: the time ratio KV ms /
 * peer ms, the K/V bytes streamed per second of both rows (kv_bytes / time) and their ratio, and
 * paged, its ms / the same-layout row's ms. */
static void run_kv_rows(bench *bn, int kind, const shape *s, const result *peer)
{
    /* 1: the same-layout row is a row of its own (else the peer is it) */
    const int own = s->page && (!s->hnd || s->kt != s->dt || s->vt != s->dt);
    result c;
    c.ms_med = NAN;
    if (own) {
        shape cs = *s;
        cs.page = 0;
        cs.hnd = 0;
        cs.bshd = !s->hnd;
        run_attn(bn, kind, &cs, &c);
        if (!isnan(c.ms_med)) {
            c.ratio_name = "kv_ms/peer_ms";
            c.ratio = c.ms_med / peer->ms_med;
            c.kv_ratio = c.kv_gbps / peer->kv_gbps;
            add_ratio(bn, ratio_text(kind, 5),
                      cs.bshd ? "contiguous BSHD KV ms / contiguous BHSD ms" : "contiguous BHSD KV ms / plain BHSD ms",
                      c.ratio);
            emit(bn, &c);
        }
    }
    result r;
    run_attn(bn, kind, s, &r);
    if (isnan(r.ms_med))
        return;
    r.ratio_name = "kv_ms/peer_ms";
    r.ratio = r.ms_med / peer->ms_med;
    r.kv_ratio = r.kv_gbps / peer->kv_gbps;
    add_ratio(bn, ratio_text(kind, 3), "KV ms / contiguous BHSD ms (1: no overhead)", r.ratio);
    add_ratio(bn, ratio_text(kind, 4), "KV GB/s / contiguous BHSD KV GB/s (K+V bytes/s)", r.kv_ratio);
    if (s->page) {
        r.layout_ratio = r.ms_med / (own ? c.ms_med : peer->ms_med);
        add_ratio(bn, ratio_text(kind, 6), "paged ms / contiguous same-layout ms (1: no overhead)", r.layout_ratio);
    }
    emit(bn, &r);
    if (s->page)
        run_page_reads(bn, kind, s);
}

/* What the run's kernel programs cost to get: built from source (clBuildProgram's wall time) or
 * loaded from the disk cache. Not part of any timing above (warm-up runs cover the builds); it
 * shows a variant whose build takes a compiler minutes, which slows every first use. PoCL
 * compiles each kernel for its work-group size at its first launch, which is not counted. */
static void print_builds(const bench *bn)
{
    static clattn_program_stats c; /* static: 1.1 KB of text */
    if (clattn_get_program_stats(bn->ctx, &c) != CLATTN_SUCCESS)
        return;
    FILE *f = bn->opt.csv ? stderr : stdout;
    /* Entries the cache does not trust (another owner, loose permissions, a symbolic link) are
     * rebuilt every run: worth a look when not 0 (docs/guarantees.md). */
    fprintf(f,
            "\nkernel programs: %u built from source (clBuildProgram: %.1f s), %u loaded from the disk cache, "
            "%u cache entries not trusted\n",
            c.builds, c.build_seconds, c.disk_hits, c.disk_untrusted);
    if (c.builds > 0)
        fprintf(f, "  longest build: %.1f s, %s\n", c.build_seconds_max, c.build_slowest);
}

int main(int argc, char **argv)
{
    static bench bn; /* static: zeroed, and its address is stable for the whole run */
    parse_args(argc, argv, &bn.opt);
    bn.copy_gbps = bn.peak_gflops = bn.clblast_ms = bn.unfused_ms = bn.fused_gflops = NAN;
    open_device(&bn);
    check_env_params(&bn);
    const options *o = &bn.opt;
    {
        /* The mask column's width: the longest description this run can print (a variant row's
         * or its dense-mask twin's). */
        char d[160];
        shape v = op_shape(&bn, OP_FUSED);
        mask_desc(&v, d, sizeof d);
        bn.mask_width = strlen(d) > 15 ? (int)strlen(d) : 15;
        if (v.window) {
            v.window = 0;
            v.mask = MASK_WINDOW;
            v.mask_left = v.win_left;
            v.mask_right = v.win_right;
            mask_desc(&v, d, sizeof d);
            bn.mask_width = (int)strlen(d) > bn.mask_width ? (int)strlen(d) : bn.mask_width;
        }
        if (o->ops & (1u << OP_DROPOUT)) { /* --op dropout's P without --dropout */
            v = op_shape(&bn, OP_DROPOUT);
            mask_desc(&v, d, sizeof d);
            bn.mask_width = (int)strlen(d) > bn.mask_width ? (int)strlen(d) : bn.mask_width;
        }
    }

    FILE *info = o->csv ? stderr : stdout;
    fprintf(info, "clattn-bench: clattn %s\n", clattn_version_string());
    fprintf(info, "device: %s (%s)\n", bn.dev_name, bn.plat_name);
    fprintf(info, "driver: %s, %s, %u compute units, %s default shapes\n", bn.driver, bn.dev_version,
            bn.compute_units, bn.gpu ? "GPU" : "CPU");
    fprintf(info, "timing: wall clock around enqueue + clFinish; median and min of %d runs after %d "
                  "warm-up\n\n",
            o->iters, o->warmup);
    fflush(info);

    /* Peers run before the ops compared with them, so every line can carry its ratio. */
    if (o->ops & (1u << OP_COPY))
        run_copy(&bn);
    if (o->ops & (1u << OP_PEAK))
        run_peak(&bn);
    shape sc = op_shape(&bn, OP_SCORES);
    sc.dv = sc.d; /* scores have no value dimension */
    if (o->ops & (1u << OP_CLBLAST))
        run_clblast(&bn, &sc);
    if (o->ops & (1u << OP_SCORES)) {
        result r;
        run_attn(&bn, OP_SCORES, &sc, &r);
        if (!isnan(r.ms_med)) {
            r.ratio_name = "clblast_ms/scores_ms";
            r.ratio = bn.clblast_ms / r.ms_med;
            add_ratio(&bn, "scores vs CLBlast", "clblast ms / scores ms (>1: faster)", r.ratio);
            emit(&bn, &r);
        }
    }
    if (o->ops & (1u << OP_SOFTMAX)) {
        const shape s = op_shape(&bn, OP_SOFTMAX);
        run_softmax(&bn, &s);
    }
    /* Each attention op runs its plain shape (no variants) with the peers' ratios as before, and
     * with variants asked for the variant rows right after it (run_variant_rows). */
    if (o->ops & (1u << OP_UNFUSED)) {
        const shape v = op_shape(&bn, OP_UNFUSED), s = plain_shape(&v);
        result r;
        run_attn(&bn, OP_UNFUSED, &s, &r);
        if (!isnan(r.ms_med)) {
            bn.unfused_ms = r.ms_med;
            add_ratio(&bn, "unfused vs FMA peak", "unfused GFLOP/s / peak GFLOP/s", r.gflops / bn.peak_gflops);
            emit(&bn, &r);
        }
        if (has_variant(&v)) {
            const shape cv = contiguous_shape(&v);
            result vr;
            run_variant_rows(&bn, OP_UNFUSED, &cv, r.ms_med, &vr);
        }
        if (v.kv)
            fprintf(info, "unfused: no KV row: paged and quantized K/V are the fused path's (fused, decode)\n");
    }
    if ((o->ops & (1u << OP_FUSED)) && o->n_varlen) {
        if (o->b > 0 || o->sq > 0 || o->skv > 0)
            fprintf(info, "fused: --varlen: --batch, --seq-q and --seq-kv are not used (the lengths give them)\n");
        const shape v = op_shape(&bn, OP_FUSED);
        run_varlen(&bn, &v);
    } else if (o->ops & (1u << OP_FUSED)) {
        const shape v = op_shape(&bn, OP_FUSED), s = plain_shape(&v);
        result r;
        run_attn(&bn, OP_FUSED, &s, &r);
        if (!isnan(r.ms_med)) {
            bn.fused_gflops = r.gflops;
            r.ratio_name = "unfused_ms/fused_ms";
            r.ratio = bn.unfused_ms / r.ms_med;
            add_ratio(&bn, "fused vs unfused", "unfused ms / fused ms", r.ratio);
            add_ratio(&bn, "fused vs FMA peak", "fused GFLOP/s / peak GFLOP/s", r.gflops / bn.peak_gflops);
            emit(&bn, &r);
        }
        /* the KV row's peer: the same problem with contiguous K/V of the dtype */
        result peer = r;
        if (has_variant(&v)) {
            const shape cv = contiguous_shape(&v);
            run_variant_rows(&bn, OP_FUSED, &cv, r.ms_med, &peer);
        }
        if (v.kv && !isnan(peer.ms_med))
            run_kv_rows(&bn, OP_FUSED, &v, &peer);
        /* Where fused attention runs on the matrix units (clattn_matrix_report), the FMA kernel
         * too, in the same run: its parameters (the defaults a class gets, kernel=tiled) set as
         * an override, which the library never replaces by the matrix kernel. */
        if (!isnan(r.ms_med) && strncmp(clattn_matrix_report(bn.ctx), "none", 4) != 0) {
            const clattn_problem_class pc = {CLATTN_OPERATION_FUSED, s.dt, s.d, s.sq, s.skv, s.causal,
                                             s.mask != MASK_NONE || s.kv_lens};
            clattn_kernel_params kp;
            result f;
            if (clattn_get_params(bn.ctx, &pc, &kp) == CLATTN_SUCCESS &&
                clattn_set_params(bn.ctx, CLATTN_OPERATION_FUSED, kp.values, kp.count) == CLATTN_SUCCESS) {
                const double mma_ms = r.ms_med;
                run_attn(&bn, OP_FUSED, &s, &f);
                clattn_set_params(bn.ctx, CLATTN_OPERATION_FUSED, NULL, 0);
                if (!isnan(f.ms_med)) {
                    f.op = "fused_fma";
                    f.ratio_name = "fma_ms/matrix_ms";
                    f.ratio = f.ms_med / mma_ms;
                    add_ratio(&bn, "fused: matrix units vs FMA kernel", "FMA kernel ms / matrix kernel ms", f.ratio);
                    add_ratio(&bn, "fused FMA kernel vs FMA peak", "GFLOP/s / peak GFLOP/s", f.gflops / bn.peak_gflops);
                    emit(&bn, &f);
                }
            }
        }
        if (!o->causal) {
            shape c = s;
            c.causal = 1;
            run_attn(&bn, OP_FUSED, &c, &r);
            if (!isnan(r.ms_med)) {
                r.ratio_name = "causal_gflops/noncausal_gflops";
                r.ratio = r.gflops / bn.fused_gflops;
                add_ratio(&bn, "causal vs non-causal", "fused causal / non-causal GFLOP/s", r.ratio);
                emit(&bn, &r);
            }
        }
    }
    if (o->ops & (1u << OP_DECODE)) {
        const shape v = op_shape(&bn, OP_DECODE), s = plain_shape(&v);
        result r;
        run_attn(&bn, OP_DECODE, &s, &r);
        if (!isnan(r.ms_med)) {
            r.ratio_name = "decode_gbps/copy_gbps";
            r.ratio = r.gbps / bn.copy_gbps;
            add_ratio(&bn, "decode vs copy", "decode GB/s / copy GB/s", r.ratio);
            emit(&bn, &r);
        }
        result peer = r;
        if (has_variant(&v)) {
            const shape cv = contiguous_shape(&v);
            run_variant_rows(&bn, OP_DECODE, &cv, r.ms_med, &peer);
        }
        if (v.kv && !isnan(peer.ms_med))
            run_kv_rows(&bn, OP_DECODE, &v, &peer);
    }
    /* Training (docs/tools.md): the backward, then dropout's overhead. */
    if (o->ops & (1u << OP_BACKWARD)) {
        const shape v = op_shape(&bn, OP_BACKWARD);
        run_backward(&bn, &v);
    }
    if (o->ops & (1u << OP_DROPOUT)) {
        const shape v = op_shape(&bn, OP_DROPOUT);
        run_dropout(&bn, &v);
    }
    if (o->dropout > 0.0f && (o->ops & ((1u << OP_UNFUSED) | (1u << OP_DECODE))))
        fprintf(info, "--dropout: unfused and decode run without it (clattn takes dropout on the fused path; "
                      "fused, backward and dropout have it)\n");
    print_ratios(&bn);
    print_builds(&bn);
    if (bn.check_failed)
        fputs("clattn-bench: --check: an error above tolerance (see the check column)\n", stderr);

    free(bn.stage);
    cl_mem mods[2] = {bn.mods_x, bn.mods_vis};
    release(mods, 2);
    if (bn.mods_kernel)
        clReleaseKernel(bn.mods_kernel);
    if (bn.mods_prog)
        clReleaseProgram(bn.mods_prog);
    free(bn.opt.score_mod);
    free(bn.opt.mask_mod);
    clattn_release(bn.ctx);
    return bn.check_failed ? EXIT_CHECK : 0;
}
