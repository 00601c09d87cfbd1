/*
 * No kernel reads or writes outside the views it is given, checked with guard pages.
 *
 * On a CPU device (PoCL) a CL_MEM_USE_HOST_PTR buffer is the host memory itself, also at an
 * unaligned address. Every tensor of a call here (inputs, outputs, mask, kv_lengths, lse,
 * probabilities, merge parts) gets its own mmap'd region between two PROT_NONE pages, placed so
 * that its last byte ends right before the upper guard ("end" rows) or its first byte starts right
 * after the lower one ("start" rows). A kernel touching one element past either end of any tensor
 * then takes a SIGSEGV, which the handler below turns into a message naming the tensor and the
 * distance before the process exits. Without guards a stray access lands in other host memory and
 * goes unnoticed, since sanitizers do not instrument the kernels PoCL compiles.
 *
 * Each shape runs with the device's defaults (on CPUs fused_direct, fused_lanes, the direct GEMMs)
 * and with the generic GPU parameters forced through clattn_set_params (the tiled kernels,
 * decode_lanes, work-group softmax and merge), whose edge tiles are the ones GPUs run. Shapes have
 * tails everywhere: keys, rows and head dims that are not multiples of any tile or vector width.
 * Every result is compared with the float64 reference (ref/clattn_ref.c) on the stored inputs.
 * sweep/random_shapes then runs CLATTN_GUARD_SWEEP (default 16) random shapes the same way.
 *
 * Whether the device uses the host memory directly is probed first (a kernel's write must show in
 * the host array with no map or read); where it does not (a GPU copies), the guards are not reached
 * and the rows only check results, which the log says.
 */
#define _DEFAULT_SOURCE /* sigaction, mmap with MAP_ANONYMOUS */

#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
#define F32 CLATTN_F32
#define F16 CLATTN_F16
#define BF16 CLATTN_BF16

/* =============================== guarded memory =============================== */

typedef struct guarded {
    const char *name;
    unsigned char *map; /* guard page, data pages, guard page */
    size_t map_len;
    unsigned char *p; /* the tensor's bytes */
    size_t bytes;
    cl_mem mem;
} guarded;

enum { MAX_GUARDED = 16 };
static guarded g_bufs[MAX_GUARDED];
static volatile sig_atomic_t g_nbufs;
static const char *volatile g_row = "";

static void on_segv(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    const uintptr_t a = (uintptr_t)info->si_addr;
    char msg[400];
    int n = snprintf(msg, sizeof msg, "test_guard %s: %s at %p", g_row, sig == SIGSEGV ? "SIGSEGV" : "SIGBUS",
                     info->si_addr);
    for (int i = 0; i < g_nbufs; i++) {
        const guarded *g = &g_bufs[i];
        const uintptr_t lo = (uintptr_t)g->p, hi = lo + g->bytes;
        if (a >= (uintptr_t)g->map && a < lo)
            n += snprintf(msg + n, sizeof msg - (size_t)n, ": %zu byte(s) before %s (%zu bytes)", (size_t)(lo - a),
                          g->name, g->bytes);
        else if (a >= hi && a < (uintptr_t)g->map + g->map_len)
            n += snprintf(msg + n, sizeof msg - (size_t)n, ": %zu byte(s) past the end of %s (%zu bytes)",
                          (size_t)(a - hi + 1), g->name, g->bytes);
    }
    if (n > 0 && (size_t)n < sizeof msg - 1)
        msg[n++] = '\n';
    if (write(2, msg, (size_t)n) < 0)
        _exit(3);
    _exit(2);
}

/* A guarded region of `bytes` holding a copy of `init`, its first byte after the lower guard page
 * (at_start) or its last byte before the upper one, and a CL_MEM_USE_HOST_PTR buffer on it. */
static cl_mem guard_buffer(const char *name, const void *init, size_t bytes, int at_start)
{
    assert_true(g_nbufs < MAX_GUARDED);
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), data = (bytes + pg - 1) / pg * pg;
    guarded *g = &g_bufs[g_nbufs];
    memset(g, 0, sizeof *g);
    g->name = name;
    g->map_len = data + 2 * pg;
    g->map = mmap(NULL, g->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(g->map != MAP_FAILED);
    assert_int_equal(mprotect(g->map, pg, PROT_NONE), 0);
    assert_int_equal(mprotect(g->map + pg + data, pg, PROT_NONE), 0);
    g->p = at_start ? g->map + pg : g->map + pg + data - bytes;
    g->bytes = bytes;
    memcpy(g->p, init, bytes);
    cl_int err;
    g->mem = clCreateBuffer(clattn_cl_context(tu_ctx), CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, bytes, g->p, &err);
    if (err != CL_SUCCESS || !g->mem) {
        munmap(g->map, g->map_len);
        fail_msg("clCreateBuffer(CL_MEM_USE_HOST_PTR, %zu bytes) for %s: %d", bytes, name, (int)err);
    }
    g_nbufs++;
    return g->mem;
}

/* The bytes of a guarded buffer as the device left them, into host memory of the test's own. */
static void *read_back(cl_mem m, size_t bytes)
{
    void *host = tu_xalloc(bytes);
    tu_read(tu_ctx, m, bytes, host);
    return host;
}

static void release_guarded(void)
{
    for (int i = 0; i < g_nbufs; i++) {
        if (g_bufs[i].mem)
            clReleaseMemObject(g_bufs[i].mem);
        munmap(g_bufs[i].map, g_bufs[i].map_len);
    }
    g_nbufs = 0;
}

/* 1 when the device computes in the host memory of a CL_MEM_USE_HOST_PTR buffer (the guards are
 * then what a kernel would touch). */
static int probe_direct(void)
{
    const char *src = "__kernel void probe(__global float *x) { x[get_global_id(0)] = 7.0f; }";
    cl_int err;
    cl_program prog = clCreateProgramWithSource(clattn_cl_context(tu_ctx), 1, &src, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_device_id dev = clattn_device(tu_ctx);
    assert_int_equal(clBuildProgram(prog, 1, &dev, "", NULL, NULL), CL_SUCCESS);
    cl_kernel k = clCreateKernel(prog, "probe", &err);
    assert_int_equal(err, CL_SUCCESS);
    const float zeros[3] = {0, 0, 0};
    cl_mem m = guard_buffer("probe", zeros, sizeof zeros, 0);
    assert_int_equal(clSetKernelArg(k, 0, sizeof m, &m), CL_SUCCESS);
    const size_t n = 3;
    assert_int_equal(clEnqueueNDRangeKernel(clattn_queue(tu_ctx), k, 1, NULL, &n, NULL, 0, NULL, NULL), CL_SUCCESS);
    tu_finish(tu_ctx);
    float seen[3];
    memcpy(seen, g_bufs[g_nbufs - 1].p, sizeof seen);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    release_guarded();
    return seen[0] == 7.0f && seen[2] == 7.0f;
}

/* =============================== rows =============================== */

typedef enum gop { G_FUSED, G_UNFUSED, G_SCORES, G_SOFTMAX, G_MERGE } gop;

typedef struct grow {
    const char *name;
    gop op;
    int B, Hq, Hkv, Sq, Skv, D, Dv;
    clattn_dtype dt;
    int causal, mask, kvlen, lse, probs;
    clattn_dtype probs_dt;
    int parts; /* G_MERGE */
} grow;

/* clang-format off */
static const grow rows[] = {
    /* name                    op         B  Hq Hkv  Sq   Skv   D   Dv  dt    causal mask kvlen lse probs probs_dt parts */
    {"prefill_f32",            G_FUSED,   2, 2, 1,   37,  33,   59, 61, F32,  1,     1,   1,    1,  0,    F32,     0},
    {"prefill_f16_gqa",        G_FUSED,   1, 4, 2,   19,  45,   40, 40, F16,  0,     0,   0,    1,  0,    F32,     0},
    {"prefill_bf16",           G_FUSED,   1, 1, 1,   70,  129,  24, 20, BF16, 1,     0,   1,    1,  0,    F32,     0},
    {"decode_f32_split",       G_FUSED,   1, 2, 2,   1,   1000, 64, 64, F32,  0,     0,   1,    1,  0,    F32,     0},
    {"decode_gqa_lanes_f16",   G_FUSED,   1, 8, 1,   5,   300,  40, 33, F16,  1,     1,   0,    1,  0,    F32,     0},
    {"decode_gqa_64_rows",     G_FUSED,   1, 16, 2,  8,   77,   17, 17, F32,  0,     0,   0,    1,  0,    F32,     0},
    {"unfused_probs_f32",      G_UNFUSED, 2, 2, 1,   9,   23,   13, 11, F32,  1,     1,   1,    1,  1,    F32,     0},
    {"unfused_probs_f16",      G_UNFUSED, 1, 2, 2,   7,   31,   16, 5,  F16,  0,     0,   0,    1,  1,    F16,     0},
    {"scores_masked",          G_SCORES,  2, 2, 1,   11,  29,   21, 21, F32,  1,     1,   1,    0,  0,    F32,     0},
    {"softmax_masked",         G_SOFTMAX, 2, 3, 3,   7,   45,   1,  1,  F32,  1,     1,   1,    0,  0,    F32,     0},
    {"merge_three",            G_MERGE,   2, 3, 3,   5,   1,    1,  27, F32,  0,     0,   0,    1,  0,    F32,     3},
};
/* clang-format on */

typedef struct gcase {
    const grow *r;
    int at_start; /* the tensors begin right after a guard page (else they end right before one) */
    int tiled;    /* 1: the generic GPU parameters instead of the device's defaults; 2: those
                   * with decode_rows (DECODE DIRECT 2) for decode shapes */
    char name[256];
} gcase;

static gcase g_cases[N_OF(rows) * 6];
static int g_direct = -1;

/* The generic parameters (src/defaults.c) of every operation: the GPU kernels; with mode 2 decode's
 * decode_rows (4 key groups, all packed rows, 8 loads in flight) instead of decode_lanes. */
static void force_tiled(int on)
{
    static const int scores[9] = {16, 16, 4, 1, 16, 4, 0, 0, 0}, softmax[2] = {256, 0}, fused[6] = {8, 8, 4, 1, 4, 0},
                     decode[7] = {32, 4, 0, 0, 8, 0, 4}, rows[7] = {32, 4, 0, 1, 8, 0, 2}, merge[1] = {64};
    const struct {
        clattn_operation op;
        const int *v;
        int n;
    } ops[6] = {{CLATTN_OPERATION_SCORES, scores, 9}, {CLATTN_OPERATION_PV, scores, 9},
                {CLATTN_OPERATION_SOFTMAX, softmax, 2}, {CLATTN_OPERATION_FUSED, fused, 6},
                {CLATTN_OPERATION_DECODE, on == 2 ? rows : decode, 7}, {CLATTN_OPERATION_MERGE, merge, 1}};
    for (int i = 0; i < 6; i++)
        assert_int_equal(clattn_set_params(tu_ctx, ops[i].op, on ? ops[i].v : NULL, on ? ops[i].n : 0),
                         CLATTN_SUCCESS);
}

static int teardown_guard(void **state)
{
    if (tu_ctx)
        tu_finish(tu_ctx);
    release_guarded();
    if (tu_ctx)
        force_tiled(0);
    g_row = "";
    return tu_teardown(state);
}

/* n values of dt in [lo, hi): the stored bytes, and their exact values as doubles. */
static void *fill(tu_rng *rng, clattn_dtype dt, size_t n, double lo, double hi, double **as_double)
{
    void *typed = tu_xalloc(n * clattn_dtype_size(dt));
    *as_double = tu_xdoubles(n);
    tu_fill(rng, dt, typed, *as_double, n, lo, hi);
    return typed;
}

/* The doubles of a guarded buffer's n values of dt, as the device left them. */
static double *result(cl_mem m, clattn_dtype dt, size_t n)
{
    const unsigned char *bytes = read_back(m, n * clattn_dtype_size(dt));
    double *d = tu_xdoubles(n);
    for (size_t i = 0; i < n; i++)
        d[i] = tu_load(dt, bytes, i);
    return d;
}

static void tolerances(clattn_dtype dt, double *atol, double *rtol)
{
    *atol = dt == F16 ? 2e-5 + 0x1p-10 : dt == BF16 ? 2e-5 + 0x1p-7 : 2e-5;
    *rtol = dt == F16 ? 0x1p-11 : dt == BF16 ? 0x1p-8 : 1e-4;
}

/* The call and its float64 reference for a row's shape (no mask, lse or key lengths yet). */
static void describe(const grow *r, clattn_attention_desc *desc, ref_attn *a)
{
    memset(desc, 0, sizeof *desc);
    desc->batch = r->B;
    desc->heads_q = r->Hq;
    desc->heads_kv = r->Hkv;
    desc->seq_q = r->Sq;
    desc->seq_kv = r->Skv;
    desc->head_dim = r->D;
    desc->head_dim_v = r->Dv;
    desc->causal = r->causal;
    memset(a, 0, sizeof *a);
    a->batch = r->B;
    a->heads_q = r->Hq;
    a->heads_kv = r->Hkv;
    a->seq_q = r->Sq;
    a->seq_kv = r->Skv;
    a->head_dim = r->D;
    a->head_dim_v = r->Dv;
    a->causal = r->causal;
}

static void run_attention(const gcase *c, tu_rng *rng)
{
    const grow *r = c->r;
    const int s = c->at_start;
    const size_t nq = (size_t)r->B * r->Hq * r->Sq * r->D, nk = (size_t)r->B * r->Hkv * r->Skv * r->D,
                 nv = (size_t)r->B * r->Hkv * r->Skv * r->Dv, no = (size_t)r->B * r->Hq * r->Sq * r->Dv,
                 nl = (size_t)r->B * r->Hq * r->Sq, nm = (size_t)r->Sq * r->Skv,
                 np = (size_t)r->B * r->Hq * r->Sq * r->Skv;
    double *xq, *xk, *xv, *xm = NULL;
    const void *q = fill(rng, r->dt, nq, -1, 1, &xq), *k = fill(rng, r->dt, nk, -1, 1, &xk),
               *v = fill(rng, r->dt, nv, -1, 1, &xv);
    const size_t es = clattn_dtype_size(r->dt);
    cl_mem mq = guard_buffer("q", q, nq * es, s), mk = guard_buffer("k", k, nk * es, s),
           mv = guard_buffer("v", v, nv * es, s);
    void *zeros = tu_xalloc((np > no ? np : no) * 4 + 4 * (size_t)r->B);
    cl_mem mo = guard_buffer("out", zeros, no * es, s);
    clattn_attention_desc desc;
    ref_attn a;
    describe(r, &desc, &a);
    desc.algorithm = r->op == G_UNFUSED ? CLATTN_ALGORITHM_UNFUSED : CLATTN_ALGORITHM_FUSED;
    clattn_tensor tmask, tlse, tprobs;
    if (r->mask) { /* [1][1][Sq][Skv], a tenth of the keys hidden but the first */
        float *m = fill(rng, F32, nm, -2, 2, &xm);
        for (size_t i = 0; i < nm; i++)
            if (i % (size_t)r->Skv != 0 && tu_uniform(rng, 0, 1) < 0.1)
                tu_put(F32, m, xm, i, -INFINITY);
        tmask = clattn_tensor_bhsd(guard_buffer("mask", m, nm * 4, s), F32, 1, 1, r->Sq, r->Skv);
        desc.mask = &tmask;
        a.mask = xm;
        a.mask_shape[0] = a.mask_shape[1] = 1;
        a.mask_shape[2] = r->Sq;
        a.mask_shape[3] = r->Skv;
    }
    int kvl[4];
    if (r->kvlen) {
        for (int b = 0; b < r->B; b++)
            kvl[b] = b == 0 ? r->Skv - r->Skv / 3 : r->Skv; /* a shorter first batch */
        desc.kv_lengths = guard_buffer("kv_lengths", kvl, 4 * (size_t)r->B, s);
        a.kv_len = kvl;
    }
    if (r->lse) {
        tlse = clattn_tensor_bhsd(guard_buffer("lse", zeros, nl * 4, s), F32, r->B, r->Hq, r->Sq, 1);
        desc.lse = &tlse;
    }
    if (r->probs) {
        tprobs = clattn_tensor_bhsd(guard_buffer("probabilities", zeros, np * clattn_dtype_size(r->probs_dt), s),
                                    r->probs_dt, r->B, r->Hq, r->Sq, r->Skv);
        desc.probabilities = &tprobs;
    }
    const clattn_tensor tq = clattn_tensor_bhsd(mq, r->dt, r->B, r->Hq, r->Sq, r->D),
                        tk = clattn_tensor_bhsd(mk, r->dt, r->B, r->Hkv, r->Skv, r->D),
                        tv = clattn_tensor_bhsd(mv, r->dt, r->B, r->Hkv, r->Skv, r->Dv),
                        to = clattn_tensor_bhsd(mo, r->dt, r->B, r->Hq, r->Sq, r->Dv);
    if (clattn_attention(tu_ctx, &desc, &tq, &tk, &tv, &to, 0, NULL, NULL) != CLATTN_SUCCESS)
        fail_msg("clattn_attention: %s", clattn_last_error(tu_ctx));
    tu_finish(tu_ctx);
    double *want = tu_xdoubles(no), *want_lse = tu_xdoubles(nl), *want_p = r->probs ? tu_xdoubles(np) : NULL;
    ref_attention(&a, xq, xk, xv, want, want_lse, want_p);
    double atol, rtol;
    tolerances(r->dt, &atol, &rtol);
    tu_check_close("out", result(mo, r->dt, no), want, no, atol, rtol);
    if (r->lse)
        tu_check_close("lse", result(tlse.buffer, F32, nl), want_lse, nl, 1e-5, 4e-6);
    if (r->probs) {
        tolerances(r->probs_dt, &atol, &rtol);
        tu_check_close("probabilities", result(tprobs.buffer, r->probs_dt, np), want_p, np, atol, rtol);
    }
}

static void run_scores(const gcase *c, tu_rng *rng)
{
    const grow *r = c->r;
    const int s = c->at_start;
    const size_t nq = (size_t)r->B * r->Hq * r->Sq * r->D, nk = (size_t)r->B * r->Hkv * r->Skv * r->D,
                 nm = (size_t)r->Sq * r->Skv, ns = (size_t)r->B * r->Hq * r->Sq * r->Skv;
    double *xq, *xk, *xm;
    const void *q = fill(rng, r->dt, nq, -1, 1, &xq), *k = fill(rng, r->dt, nk, -1, 1, &xk);
    float *m = fill(rng, F32, nm, -2, 2, &xm);
    int kvl[4];
    for (int b = 0; b < r->B; b++)
        kvl[b] = b == 0 ? r->Skv / 2 : r->Skv;
    clattn_attention_desc desc;
    ref_attn a;
    describe(r, &desc, &a);
    clattn_tensor tmask = clattn_tensor_bhsd(guard_buffer("mask", m, nm * 4, s), F32, 1, 1, r->Sq, r->Skv);
    desc.mask = &tmask;
    desc.kv_lengths = guard_buffer("kv_lengths", kvl, 4 * (size_t)r->B, s);
    const clattn_tensor tq = clattn_tensor_bhsd(guard_buffer("q", q, nq * 4, s), F32, r->B, r->Hq, r->Sq, r->D),
                        tk = clattn_tensor_bhsd(guard_buffer("k", k, nk * 4, s), F32, r->B, r->Hkv, r->Skv, r->D),
                        ts = clattn_tensor_bhsd(guard_buffer("scores", tu_xalloc(ns * 4), ns * 4, s), F32, r->B,
                                                r->Hq, r->Sq, r->Skv);
    if (clattn_scores(tu_ctx, &desc, &tq, &tk, &ts, 0, NULL, NULL) != CLATTN_SUCCESS)
        fail_msg("clattn_scores: %s", clattn_last_error(tu_ctx));
    tu_finish(tu_ctx);
    a.mask = xm;
    a.mask_shape[0] = a.mask_shape[1] = 1;
    a.mask_shape[2] = r->Sq;
    a.mask_shape[3] = r->Skv;
    a.kv_len = kvl;
    double *want = tu_xdoubles(ns);
    ref_scores(&a, xq, xk, want);
    tu_check_close("scores", result(ts.buffer, F32, ns), want, ns, 1e-5, 1e-5);
}

static void run_softmax(const gcase *c, tu_rng *rng)
{
    const grow *r = c->r;
    const int s = c->at_start;
    const size_t n = (size_t)r->B * r->Hq * r->Sq * r->Skv, nm = (size_t)r->Hq * r->Sq * r->Skv;
    double *xin, *xm;
    const void *in = fill(rng, F32, n, -4, 4, &xin);
    float *m = fill(rng, F32, nm, -2, 2, &xm);
    for (size_t i = 0; i < nm; i++)
        if (i % (size_t)r->Skv != 0 && tu_uniform(rng, 0, 1) < 0.1)
            tu_put(F32, m, xm, i, -INFINITY);
    int kvl[4];
    for (int b = 0; b < r->B; b++)
        kvl[b] = b == 0 ? r->Skv - 5 : r->Skv;
    clattn_softmax_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = r->B;
    desc.heads = r->Hq;
    desc.rows = r->Sq;
    desc.cols = r->Skv;
    desc.scale = 0.75f;
    desc.causal = r->causal;
    clattn_tensor tmask = clattn_tensor_bhsd(guard_buffer("mask", m, nm * 4, s), F32, 1, r->Hq, r->Sq, r->Skv);
    desc.mask = &tmask;
    desc.kv_lengths = guard_buffer("kv_lengths", kvl, 4 * (size_t)r->B, s);
    const clattn_tensor tin = clattn_tensor_bhsd(guard_buffer("in", in, n * 4, s), F32, r->B, r->Hq, r->Sq, r->Skv),
                        tout = clattn_tensor_bhsd(guard_buffer("out", tu_xalloc(n * 4), n * 4, s), F32, r->B, r->Hq,
                                                  r->Sq, r->Skv);
    if (clattn_softmax(tu_ctx, &desc, &tin, &tout, 0, NULL, NULL) != CLATTN_SUCCESS)
        fail_msg("clattn_softmax: %s", clattn_last_error(tu_ctx));
    tu_finish(tu_ctx);
    ref_softmax rs;
    memset(&rs, 0, sizeof rs);
    rs.batch = r->B;
    rs.heads = r->Hq;
    rs.rows = r->Sq;
    rs.cols = r->Skv;
    rs.scale = 0.75;
    rs.causal = r->causal;
    rs.mask = xm;
    rs.mask_shape[0] = 1;
    rs.mask_shape[1] = r->Hq;
    rs.mask_shape[2] = r->Sq;
    rs.mask_shape[3] = r->Skv;
    rs.kv_len = kvl;
    double *want = tu_xdoubles(n);
    ref_softmax_rows(&rs, xin, want);
    tu_check_close("softmax", result(tout.buffer, F32, n), want, n, 1e-6, 1e-5);
}

static void run_merge(const gcase *c, tu_rng *rng)
{
    const grow *r = c->r;
    const int s = c->at_start;
    const size_t rowsn = (size_t)r->B * r->Hq * r->Sq, no = rowsn * r->Dv;
    static const char *const out_names[3] = {"part_out[0]", "part_out[1]", "part_out[2]"},
                             *const lse_names[3] = {"part_lse[0]", "part_lse[1]", "part_lse[2]"};
    clattn_tensor po[3], pl[3];
    const double *xo[3], *xl[3];
    for (int i = 0; i < r->parts; i++) {
        double *o, *l;
        const void *ho = fill(rng, F32, no, -1, 1, &o), *hl = fill(rng, F32, rowsn, -3, 3, &l);
        po[i] = clattn_tensor_bhsd(guard_buffer(out_names[i], ho, no * 4, s), F32, r->B, r->Hq, r->Sq, r->Dv);
        pl[i] = clattn_tensor_bhsd(guard_buffer(lse_names[i], hl, rowsn * 4, s), F32, r->B, r->Hq, r->Sq, 1);
        xo[i] = o;
        xl[i] = l;
    }
    const clattn_tensor to = clattn_tensor_bhsd(guard_buffer("out", tu_xalloc(no * 4), no * 4, s), F32, r->B, r->Hq,
                                                r->Sq, r->Dv),
                        tl = clattn_tensor_bhsd(guard_buffer("lse", tu_xalloc(rowsn * 4), rowsn * 4, s), F32, r->B,
                                                r->Hq, r->Sq, 1);
    if (clattn_merge(tu_ctx, r->parts, po, pl, &to, &tl, 0, NULL, NULL) != CLATTN_SUCCESS)
        fail_msg("clattn_merge: %s", clattn_last_error(tu_ctx));
    tu_finish(tu_ctx);
    double *want = tu_xdoubles(no), *want_l = tu_xdoubles(rowsn);
    ref_merge(r->parts, (int)rowsn, r->Dv, xo, xl, want, want_l);
    tu_check_close("merged out", result(to.buffer, F32, no), want, no, 1e-6, 1e-6);
    tu_check_close("merged lse", result(tl.buffer, F32, rowsn), want_l, rowsn, 1e-6, 1e-6);
}

static void test_guard(void **state)
{
    const gcase *c = *state;
    tu_ctx_get();
    if (g_direct < 0) {
        g_direct = probe_direct();
        print_message("%s\n", g_direct ? "the device computes in CL_MEM_USE_HOST_PTR memory: guard pages armed"
                                       : "the device copies CL_MEM_USE_HOST_PTR buffers: guard pages not reached, "
                                         "results checked only");
    }
    /* Here, not in main: cmocka installs its own handlers around each test, and a fault in one
     * of the driver's threads is not one it can recover from. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    g_row = c->name;
    force_tiled(c->tiled);
    tu_failures = 0;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(c->r->name));
    switch (c->r->op) {
    case G_FUSED:
    case G_UNFUSED: run_attention(c, &rng); break;
    case G_SCORES: run_scores(c, &rng); break;
    case G_SOFTMAX: run_softmax(c, &rng); break;
    case G_MERGE: run_merge(c, &rng); break;
    }
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* Random shapes (CLATTN_GUARD_SWEEP of them, default 16; 150 ran clean when this was written;
 * CLATTN_GUARD_SEED picks another sequence)
 * from a few head dims, so that kernel builds stay few: each runs as a table row would, with a
 * random end and parameter mode, its shape printed first. */
static void test_sweep(void **state)
{
    (void)state;
    const int n = tu_getenv_int("CLATTN_GUARD_SWEEP", 16);
    static const int dims[4] = {16, 59, 64, 128};
    static const clattn_dtype dts[3] = {F32, F16, BF16};
    tu_rng rng;
    tu_seed(&rng, tu_seed_of("sweep") + (uint64_t)tu_getenv_int("CLATTN_GUARD_SEED", 0));
    for (int it = 0; it < n; it++) {
        grow r;
        memset(&r, 0, sizeof r);
        r.name = "sweep";
        const double pick = tu_uniform(&rng, 0, 1);
        r.op = pick < 0.7 ? G_FUSED : pick < 0.85 ? G_UNFUSED : pick < 0.93 ? G_SOFTMAX : G_MERGE;
        r.Hkv = 1 + (int)tu_uniform(&rng, 0, 3);
        r.Hq = r.Hkv * (1 + (int)tu_uniform(&rng, 0, tu_uniform(&rng, 0, 1) < 0.3 ? 16 : 3));
        r.B = 1 + (int)tu_uniform(&rng, 0, 3);
        r.Sq = tu_uniform(&rng, 0, 1) < 0.5 ? 1 + (int)tu_uniform(&rng, 0, 16) : 17 + (int)tu_uniform(&rng, 0, 120);
        r.Skv = 1 + (int)tu_uniform(&rng, 0, tu_uniform(&rng, 0, 1) < 0.2 ? 3000 : 300);
        r.D = dims[(int)tu_uniform(&rng, 0, 4)];
        r.Dv = tu_uniform(&rng, 0, 1) < 0.7 ? r.D : dims[(int)tu_uniform(&rng, 0, 4)];
        r.dt = r.op == G_FUSED || r.op == G_UNFUSED ? dts[(int)tu_uniform(&rng, 0, 3)] : F32;
        r.causal = tu_uniform(&rng, 0, 1) < 0.4;
        r.mask = tu_uniform(&rng, 0, 1) < 0.3;
        r.kvlen = r.B <= 4 && tu_uniform(&rng, 0, 1) < 0.3;
        r.lse = tu_uniform(&rng, 0, 1) < 0.7;
        r.probs = r.op == G_UNFUSED && tu_uniform(&rng, 0, 1) < 0.7;
        r.probs_dt = tu_uniform(&rng, 0, 1) < 0.5 ? F32 : F16;
        r.parts = 1 + (int)tu_uniform(&rng, 0, 3);
        if (r.op == G_MERGE)
            r.Hkv = r.Hq;
        gcase c;
        memset(&c, 0, sizeof c);
        c.r = &r;
        c.at_start = tu_uniform(&rng, 0, 1) < 0.5;
        c.tiled = (int)tu_uniform(&rng, 0, 3);
        snprintf(c.name, sizeof c.name, "sweep %d: op %d B%d Hq%d Hkv%d Sq%d Skv%d D%d Dv%d dt %d causal %d mask %d "
                 "kvlen %d lse %d probs %d/%d parts %d %s mode %d", it, (int)r.op, r.B, r.Hq, r.Hkv, r.Sq, r.Skv,
                 r.D, r.Dv, (int)r.dt, r.causal, r.mask, r.kvlen, r.lse, r.probs, (int)r.probs_dt, r.parts,
                 c.at_start ? "start" : "end", c.tiled);
        print_message("%s\n", c.name);
        void *st = &c;
        test_guard(&st);
        tu_finish(tu_ctx);
        release_guarded();
        force_tiled(0);
        tu_teardown(NULL); /* this shape's host arrays */
    }
}

int main(void)
{
    tu_set_fixtures(NULL, teardown_guard);
    size_t n = 0;
    static const char *const modes[3] = {"defaults", "tiled", "decode_rows"};
    for (int tiled = 0; tiled < 3; tiled++)
        for (int at_start = 0; at_start < 2; at_start++)
            for (size_t i = 0; i < N_OF(rows); i++) {
                if (tiled == 2 && !(rows[i].op == G_FUSED && rows[i].Sq <= 16))
                    continue; /* the same kernels as "tiled" */
                gcase *c = &g_cases[n++];
                c->r = &rows[i];
                c->at_start = at_start;
                c->tiled = tiled;
                snprintf(c->name, sizeof c->name, "%s_%s/%s", modes[tiled], at_start ? "start" : "end", rows[i].name);
                tu_add_test(c->name, NULL, test_guard, c);
            }
    tu_add_test("sweep/random_shapes", NULL, test_sweep, NULL);
    const int failed = tu_run_tests("guard");
    clattn_release(tu_ctx);
    return failed;
}
