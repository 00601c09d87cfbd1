/*
 * Failure paths of every enqueuing entry point, made deterministic with the OpenCL interposition of
 * clshim.c, and the contract clattn.h states for them: a clear status and a message naming the
 * failed call, `*done` NULL, nothing the caller owns modified, no OpenCL object leaked, and a
 * context that works afterwards (the same call then succeeds and matches the float64 reference).
 *
 *   shim/sees_the_library  the interposition counts the library's own OpenCL calls (so the other
 *                          tests here cannot pass by counting nothing).
 *   create/context_and_queue_refused  clCreateContext or clCreateCommandQueue failing with a
 *                          memory error or another: clattn_create's status for it, a message
 *                          naming the call and the error, *ctx NULL, no object leaked.
 *   create/llvmpipe_refused  a device named like Mesa's llvmpipe, which stops a kernel's loops
 *                          after 65535 iterations in all without an error (wrong results, not a
 *                          failure): clattn_create with no spec, "cpu", "P:D" or the name, and
 *                          clattn_create_from_queue on a queue of it, give CLATTN_UNSUPPORTED with
 *                          a message that names the device and the reason, *ctx NULL, no object
 *                          leaked; clattn_select_device the same; the real name again works.
 *                          Where a real llvmpipe device is present (rusticl with
 *                          RUSTICL_ENABLE=llvmpipe), clattn_create(NULL) must not pick it.
 *   create/odd_device_strings  a driver version ending in blanks, made of them, or holding control
 *                          characters: the driver tag clattn-tune writes from it reads back equal
 *                          to the context's, and a store written with it is used without the
 *                          "differs" warning; a device name of 399 bytes is cut to the 255 the
 *                          context keeps (also in its key) instead of failing clattn_create.
 *   oom/<row>              device memory exhaustion. A probe call counts the row's calls of
 *                          clCreateBuffer, clEnqueueNDRangeKernel and clEnqueueFillBuffer; then for
 *                          each function, each call index and each of CL_MEM_OBJECT_ALLOCATION_FAILURE
 *                          and CL_OUT_OF_RESOURCES, a new context runs the row with that one call
 *                          failing. Expected: CLATTN_OUT_OF_MEMORY, the message naming the function
 *                          and the error, clattn_last_cl_error() the injected error, `*done` NULL,
 *                          every buffer (inputs and outputs, each filled with its own pattern or a
 *                          sentinel) or host array unchanged, then the same call succeeding and
 *                          matching the reference, and after releasing everything exactly as many
 *                          live OpenCL objects of each kind as before the context existed.
 *                          One documented exception (docs/guarantees.md): on the unfused path a
 *                          failed launch after the softmax launch that writes desc->lse and
 *                          desc->probabilities (P·V, or the second softmax of f16/bf16 or write-only
 *                          probabilities) leaves them written; `out` is still untouched (row field
 *                          late_from).
 *   wait/<row>             a wait list holding a failed event (clCreateUserEvent +
 *                          clSetUserEventStatus(ev, -1)), alone or after a pending event: OPENCL_ERROR
 *                          naming wait[i], nothing enqueued (no launch reached the driver), nothing
 *                          modified; an event of another OpenCL context: INVALID_ARGUMENT; a wait
 *                          list with num_wait 0 is ignored; a pending event is honoured (the call's
 *                          `done` completes only after it) and the result matches the reference.
 *   build/<row>            a kernel that fails to compile (CLATTN_KERNEL_DIR holding a broken copy
 *                          of one file), also as the second kernel of a multi-kernel operation:
 *                          BUILD_FAILED with the file name, the build log, nothing modified, no
 *                          leak, and the call working once the broken file is gone.
 *   oom_real/device_memory real exhaustion: allocate device memory until the device refuses, then
 *                          call (OUT_OF_MEMORY, or SUCCESS where the driver still finds room), give
 *                          the memory back, and the call must work. Only on a GPU, or an accelerator
 *                          reporting less than 8 GiB; never on a CPU device, whose memory is the
 *                          host's whatever it reports (skipped with a message).
 *   sizes/scores_matrix_past_2_64  a scores matrix past 2^64 bytes is refused, not wrapped
 *                          (skipped where size_t has 32 bits: its output cannot exist there).
 *   sizes/scores_matrix_past_2_32  one past 2^32 bytes, with the max allocation lowered to 1 GiB:
 *                          refused, not wrapped to 4 MiB where size_t has 32 bits.
 *   copies_past_max_alloc/<row>  a max allocation too small for the Kᵀ/V copies of the CPU
 *                          kernels, or for the f32 copies of f16 Q and V: the call succeeds
 *                          without them and matches the reference.
 *
 * Each row builds its inputs from a fixed seed; all shapes are tiny.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */

#include "testutil.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clshim.h"
#include "internal.h"
#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

#define F32 CLATTN_F32
#define F16 CLATTN_F16
#define FUSED CLATTN_ALGORITHM_FUSED
#define UNFUSED CLATTN_ALGORITHM_UNFUSED
#define AUTO CLATTN_ALGORITHM_AUTO

#define SENTINEL 777.0
#define GARBAGE_EVENT ((cl_event)(uintptr_t)1)

/* =============================== rows =============================== */

typedef enum op {
    OP_ATTENTION,
    OP_SCORES,
    OP_SOFTMAX, /* [B][Hq][Sq][Skv] rows */
    OP_MERGE,   /* parts of shape [B][Hq][Sq][D] */
    OP_HOST     /* clattn_attention_host */
} op;

typedef struct op_row {
    const char *name;
    op op;
    int B, Hq, Hkv, Sq, Skv, D;
    clattn_algorithm alg;
    int causal, lse, probs;
    clattn_dtype probs_dt;
    int parts;     /* OP_MERGE */
    int late_from; /* launch index from which lse/probabilities may already be written; -1 never,
                    * LATE_LAST the last launch of the call (whose index depends on the device) */
    clattn_dtype in_dt; /* OP_ATTENTION and OP_SCORES: q, k, v (and attention's out); F32 if left out */
} op_row;
#define LATE_LAST (-2)

/* clang-format off */
static const op_row rows[] = {
    /* name                 op            B  Hq Hkv Sq Skv  D   alg      causal lse probs probs_dt parts late_from  in_dt */
    {"fused",               OP_ATTENTION, 1, 2, 1,  8, 24,  16, FUSED,   1,     1,  0,    F32,     0,    -1,         F32},
    {"fused_split",         OP_ATTENTION, 1, 4, 1,  1, 700, 32, FUSED,   0,     1,  0,    F32,     0,    -1,         F32},
    {"fused_prefill",       OP_ATTENTION, 1, 2, 1,  20, 37, 16, FUSED,   1,     1,  0,    F32,     0,    -1,         F32},
    {"unfused",             OP_ATTENTION, 2, 2, 1,  5, 19,  8,  UNFUSED, 1,     1,  1,    F32,     0,    2,          F32},
    {"unfused_f16_probs",   OP_ATTENTION, 2, 2, 2,  5, 19,  8,  AUTO,    0,     1,  1,    F16,     0,    2,          F32},
    /* f16 inputs: on CPUs the f32 copies of V (first) and Q (after Kᵀ) come before the scores,
     * so P·V, the only launch after softmax, is the sixth (earlier on GPUs, which make no copies) */
    {"unfused_f16_in",      OP_ATTENTION, 1, 2, 1,  40, 19, 8,  UNFUSED, 1,     1,  0,    F32,     0,    LATE_LAST,  F16},
    {"scores",              OP_SCORES,    2, 2, 1,  5, 19,  8,  AUTO,    1,     0,  0,    F32,     0,    -1,         F32},
    {"softmax",             OP_SOFTMAX,   2, 2, 2,  5, 19,  8,  AUTO,    1,     0,  0,    F32,     0,    -1,         F32},
    {"merge_one",           OP_MERGE,     2, 2, 2,  3, 1,   8,  AUTO,    0,     1,  0,    F32,     1,    -1,         F32},
    {"merge_two",           OP_MERGE,     2, 2, 2,  3, 1,   8,  AUTO,    0,     1,  0,    F32,     2,    -1,         F32},
    {"merge_three",         OP_MERGE,     2, 2, 2,  3, 1,   8,  AUTO,    0,     0,  0,    F32,     3,    -1,         F32},
    {"host",                OP_HOST,      1, 2, 1,  4, 9,   8,  AUTO,    1,     0,  0,    F32,     0,    -1,         F32},
    {"host_unfused_lse",    OP_HOST,      1, 2, 2,  4, 9,   8,  UNFUSED, 0,     1,  0,    F32,     0,    -1,         F32},
};
/* clang-format on */

static const op_row *row_named(const char *name)
{
    for (size_t i = 0; i < N_OF(rows); ++i)
        if (strcmp(rows[i].name, name) == 0)
            return &rows[i];
    fail_msg("no row named %s", name);
    return NULL;
}

/* =============================== one problem on one context =============================== */

enum role { R_Q, R_K, R_V, R_OUT, R_LSE, R_PROBS, R_PO0, R_PO1, R_PO2, R_PL0, R_PL1, R_PL2, R_COUNT };
static const char *const role_names[R_COUNT] = {"q/in",   "k",        "v",        "out",      "lse",     "probabilities",
                                                "part_out[0]", "part_out[1]", "part_out[2]", "part_lse[0]",
                                                "part_lse[1]", "part_lse[2]"};

typedef struct inst {
    const op_row *r;
    clattn_context *ctx;
    int used[R_COUNT];
    int output[R_COUNT];
    cl_mem mem[R_COUNT];         /* NULL for OP_HOST, whose tensors are host arrays */
    clattn_tensor t[R_COUNT];
    size_t n[R_COUNT];           /* elements */
    clattn_dtype dt[R_COUNT];
    unsigned char *img[R_COUNT]; /* the bytes before any call: random inputs, sentinel outputs */
    unsigned char *host[R_COUNT];/* OP_HOST outputs: the arrays the call writes */
    double *x[R_COUNT];          /* inputs as stored */
    double *want[R_COUNT];       /* reference outputs */
    void *allocs[128];           /* host memory of this instance, freed by inst_free */
    int nallocs;
} inst;

/* Zeroed host memory owned by the instance (tu_xalloc's per-test budget would not last through the
 * dozens of instances one oom row makes). */
static void *inst_alloc(inst *I, size_t bytes)
{
    assert_true(I->nallocs < (int)N_OF(I->allocs));
    void *p = calloc(bytes > 0 ? bytes : 1, 1);
    assert_non_null(p);
    I->allocs[I->nallocs++] = p;
    return p;
}

static double *inst_doubles(inst *I, size_t n)
{
    return inst_alloc(I, n * sizeof(double));
}

static void add_role(inst *I, int role, clattn_dtype dt, int b, int h, int s, int d, tu_rng *rng, double lo, double hi)
{
    const size_t n = (size_t)b * h * s * d, esz = clattn_dtype_size(dt);
    I->used[role] = 1;
    I->output[role] = rng == NULL;
    I->n[role] = n;
    I->dt[role] = dt;
    I->img[role] = inst_alloc(I, n * esz);
    I->x[role] = inst_doubles(I, n);
    if (rng != NULL)
        tu_fill(rng, dt, I->img[role], I->x[role], n, lo, hi);
    else
        for (size_t i = 0; i < n; ++i)
            tu_store(dt, I->img[role], i, SENTINEL);
    if (I->r->op == OP_HOST) {
        if (rng == NULL) {
            I->host[role] = inst_alloc(I, n * esz);
            memcpy(I->host[role], I->img[role], n * esz);
        }
        return;
    }
    I->mem[role] = tu_buffer(I->ctx, n * esz, I->img[role]);
    I->t[role] = clattn_tensor_bhsd(I->mem[role], dt, b, h, s, d);
}

static ref_attn ref_of(const op_row *r)
{
    ref_attn a;
    memset(&a, 0, sizeof a);
    a.batch = r->B;
    a.heads_q = r->Hq;
    a.heads_kv = r->Hkv;
    a.seq_q = r->Sq;
    a.seq_kv = r->Skv;
    a.head_dim = r->D;
    a.scale = (double)(float)(1.0 / sqrt((double)r->D));
    a.causal = r->causal;
    return a;
}

/* Inputs and sentinel outputs on ctx, and the reference; inst_free releases it all. */
static void inst_init(inst *I, const op_row *r, clattn_context *ctx)
{
    memset(I, 0, sizeof *I);
    I->r = r;
    I->ctx = ctx;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(r->name));
    const size_t nrow = (size_t)r->B * r->Hq * r->Sq;
    switch (r->op) {
    case OP_ATTENTION:
    case OP_HOST: {
        const clattn_dtype in = r->op == OP_ATTENTION ? r->in_dt : F32;
        add_role(I, R_Q, in, r->B, r->Hq, r->Sq, r->D, &rng, -3.0, 3.0);
        add_role(I, R_K, in, r->B, r->Hkv, r->Skv, r->D, &rng, -1.0, 1.0);
        add_role(I, R_V, in, r->B, r->Hkv, r->Skv, r->D, &rng, -1.0, 1.0);
        add_role(I, R_OUT, in, r->B, r->Hq, r->Sq, r->D, NULL, 0, 0);
        if (r->lse)
            add_role(I, R_LSE, F32, r->B, r->Hq, r->Sq, 1, NULL, 0, 0);
        if (r->probs)
            add_role(I, R_PROBS, r->probs_dt, r->B, r->Hq, r->Sq, r->Skv, NULL, 0, 0);
        const ref_attn a = ref_of(r);
        I->want[R_OUT] = inst_doubles(I, I->n[R_OUT]);
        I->want[R_LSE] = inst_doubles(I, nrow);
        I->want[R_PROBS] = r->probs ? inst_doubles(I, nrow * (size_t)r->Skv) : NULL;
        ref_attention(&a, I->x[R_Q], I->x[R_K], I->x[R_V], I->want[R_OUT], I->want[R_LSE], I->want[R_PROBS]);
        break;
    }
    case OP_SCORES: {
        add_role(I, R_Q, r->in_dt, r->B, r->Hq, r->Sq, r->D, &rng, -3.0, 3.0);
        add_role(I, R_K, r->in_dt, r->B, r->Hkv, r->Skv, r->D, &rng, -1.0, 1.0);
        add_role(I, R_OUT, F32, r->B, r->Hq, r->Sq, r->Skv, NULL, 0, 0);
        const ref_attn a = ref_of(r);
        I->want[R_OUT] = inst_doubles(I, I->n[R_OUT]);
        ref_scores(&a, I->x[R_Q], I->x[R_K], I->want[R_OUT]);
        break;
    }
    case OP_SOFTMAX: {
        add_role(I, R_Q, F32, r->B, r->Hq, r->Sq, r->Skv, &rng, -4.0, 4.0);
        add_role(I, R_OUT, F32, r->B, r->Hq, r->Sq, r->Skv, NULL, 0, 0);
        const ref_softmax s = {r->B, r->Hq, r->Sq, r->Skv, 0.0, r->causal, NULL, {0, 0, 0, 0}, NULL};
        I->want[R_OUT] = inst_doubles(I, I->n[R_OUT]);
        ref_softmax_rows(&s, I->x[R_Q], I->want[R_OUT]);
        break;
    }
    case OP_MERGE: {
        const double *po[3], *pl[3];
        for (int p = 0; p < r->parts; ++p) {
            add_role(I, R_PO0 + p, F32, r->B, r->Hq, r->Sq, r->D, &rng, -1.0, 1.0);
            add_role(I, R_PL0 + p, F32, r->B, r->Hq, r->Sq, 1, &rng, -2.0, 2.0);
            po[p] = I->x[R_PO0 + p];
            pl[p] = I->x[R_PL0 + p];
        }
        add_role(I, R_OUT, F32, r->B, r->Hq, r->Sq, r->D, NULL, 0, 0);
        if (r->lse)
            add_role(I, R_LSE, F32, r->B, r->Hq, r->Sq, 1, NULL, 0, 0);
        I->want[R_OUT] = inst_doubles(I, I->n[R_OUT]);
        I->want[R_LSE] = inst_doubles(I, nrow);
        ref_merge(r->parts, (int)nrow, r->D, po, pl, I->want[R_OUT], I->want[R_LSE]);
        break;
    }
    }
}

static void inst_free(inst *I)
{
    for (int i = 0; i < R_COUNT; ++i)
        if (I->mem[i] != NULL) {
            clReleaseMemObject(I->mem[i]);
            I->mem[i] = NULL;
        }
    for (int i = 0; i < I->nallocs; ++i)
        free(I->allocs[i]);
    I->nallocs = 0;
}

static clattn_status inst_call(inst *I, cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    const op_row *r = I->r;
    switch (r->op) {
    case OP_ATTENTION:
    case OP_SCORES:
    case OP_HOST: {
        clattn_attention_desc d;
        memset(&d, 0, sizeof d);
        d.batch = r->B;
        d.heads_q = r->Hq;
        d.heads_kv = r->Hkv;
        d.seq_q = r->Sq;
        d.seq_kv = r->Skv;
        d.head_dim = r->D;
        d.causal = r->causal;
        d.algorithm = r->alg;
        if (r->op == OP_SCORES)
            return clattn_scores(I->ctx, &d, &I->t[R_Q], &I->t[R_K], &I->t[R_OUT], num_wait, wait, done);
        if (r->op == OP_HOST)
            return clattn_attention_host(I->ctx, &d, F32, I->img[R_Q], I->img[R_K], I->img[R_V], I->host[R_OUT],
                                         r->lse ? (float *)I->host[R_LSE] : NULL);
        d.lse = r->lse ? &I->t[R_LSE] : NULL;
        d.probabilities = r->probs ? &I->t[R_PROBS] : NULL;
        return clattn_attention(I->ctx, &d, &I->t[R_Q], &I->t[R_K], &I->t[R_V], &I->t[R_OUT], num_wait, wait, done);
    }
    case OP_SOFTMAX: {
        clattn_softmax_desc s;
        memset(&s, 0, sizeof s);
        s.batch = r->B;
        s.heads = r->Hq;
        s.rows = r->Sq;
        s.cols = r->Skv;
        s.causal = r->causal;
        return clattn_softmax(I->ctx, &s, &I->t[R_Q], &I->t[R_OUT], num_wait, wait, done);
    }
    case OP_MERGE: {
        const clattn_tensor po[3] = {I->t[R_PO0], I->t[R_PO1], I->t[R_PO2]};
        const clattn_tensor pl[3] = {I->t[R_PL0], I->t[R_PL1], I->t[R_PL2]};
        return clattn_merge(I->ctx, r->parts, po, pl, &I->t[R_OUT], r->lse ? &I->t[R_LSE] : NULL, num_wait, wait,
                            done);
    }
    }
    return CLATTN_INVALID_ARGUMENT;
}

/* The bytes a role holds now (device buffer read back, or the host array). */
static unsigned char *role_now(inst *I, int role)
{
    const size_t bytes = I->n[role] * clattn_dtype_size(I->dt[role]);
    if (I->r->op == OP_HOST)
        return I->host[role] != NULL ? I->host[role] : I->img[role];
    unsigned char *now = inst_alloc(I, bytes);
    tu_read(I->ctx, I->mem[role], bytes, now);
    return now;
}

/* Every input and output still holds its initial bytes; with late_ok, lse and probabilities may
 * differ (see the file comment). */
static void assert_untouched(inst *I, const char *when, int late_ok)
{
    if (I->r->op != OP_HOST)
        tu_finish(I->ctx);
    int late_written[R_COUNT] = {0};
    for (int role = 0; role < R_COUNT; ++role) {
        if (!I->used[role])
            continue;
        const size_t bytes = I->n[role] * clattn_dtype_size(I->dt[role]);
        const unsigned char *now = role_now(I, role);
        if (memcmp(now, I->img[role], bytes) == 0)
            continue;
        if (late_ok && (role == R_LSE || role == R_PROBS)) {
            print_message("    %s: %s was written before the failing launch (allowed, docs/guarantees.md)\n",
                          when, role_names[role]);
            late_written[role] = 1;
            continue;
        }
        size_t first = 0;
        while (first < bytes && now[first] == I->img[role][first])
            ++first;
        fail_msg("%s: %s was modified (first changed byte %zu of %zu)", when, role_names[role], first, bytes);
    }
    /* One launch writes both, so a failure never leaves one written and the other not. */
    if (I->used[R_LSE] && I->used[R_PROBS] && late_written[R_LSE] != late_written[R_PROBS])
        fail_msg("%s: %s was written before the failing launch but %s was not", when,
                 role_names[late_written[R_LSE] ? R_LSE : R_PROBS], role_names[late_written[R_LSE] ? R_PROBS : R_LSE]);
}

/* The outputs match the reference. */
static void assert_results(inst *I, const char *when)
{
    if (I->r->op != OP_HOST)
        tu_finish(I->ctx);
    static const int outs[3] = {R_OUT, R_LSE, R_PROBS};
    for (int i = 0; i < 3; ++i) {
        const int role = outs[i];
        if (!I->used[role])
            continue;
        const unsigned char *now = role_now(I, role);
        double *got = inst_doubles(I, I->n[role]);
        for (size_t j = 0; j < I->n[role]; ++j)
            got[j] = tu_load(I->dt[role], now, j);
        double atol = 2e-5, rtol = 1e-4; /* attention out, as test_attention.c */
        if (role == R_LSE) {
            atol = 1e-5;
            rtol = 4e-6;
        } else if (role == R_PROBS) {
            atol = I->dt[role] == F16 ? 1e-6 : 1e-7;
            rtol = I->dt[role] == F16 ? 0x1p-10 : 2e-5;
        } else if (I->r->op == OP_SCORES || I->r->op == OP_SOFTMAX || I->r->op == OP_MERGE) {
            atol = 1e-6;
            rtol = 1e-5;
        } else if (I->dt[role] == F16) { /* attention out rounded to f16 */
            atol = 1e-5;
            rtol = 0x1p-10;
        }
        char what[128];
        snprintf(what, sizeof what, "%s: %s %s vs reference", when, I->r->name, role_names[role]);
        tu_assert_allclose(what, got, I->want[role], I->n[role], atol, rtol);
    }
}

/* A call that must succeed: status, `done`, results. */
static void call_ok(inst *I, const char *when)
{
    cl_event done = GARBAGE_EVENT;
    const clattn_status st = inst_call(I, 0, NULL, I->r->op == OP_HOST ? NULL : &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("%s: %s returned %s: %s", when, I->r->name, clattn_status_name(st), clattn_last_error(I->ctx));
    assert_string_equal(clattn_last_error(I->ctx), "");
    if (I->r->op != OP_HOST) {
        assert_true(done != NULL && done != GARBAGE_EVENT);
        assert_int_equal(clWaitForEvents(1, &done), CL_SUCCESS);
        clReleaseEvent(done);
    }
    assert_results(I, when);
}

static void assert_no_leak(const clshim_counts *before, const char *when)
{
    clshim_counts after;
    clshim_get(&after);
    char diff[256];
    if (!clshim_same_live(before, &after, diff, sizeof diff))
        fail_msg("%s: OpenCL objects leaked: %s", when, diff);
}

/* =============================== shim sanity =============================== */

static void test_shim_sees_library(void **state)
{
    (void)state;
    assert_true(clshim_active());
    clattn_release(tu_context()); /* the platform's one-time set-up happens outside the counts */
    clshim_counts c0, c1, c2;
    clshim_get(&c0);
    clattn_context *ctx = tu_context();
    clshim_get(&c1);
    assert_int_equal(c1.created[CLSHIM_CONTEXT] - c0.created[CLSHIM_CONTEXT], 1);
    assert_int_equal(c1.created[CLSHIM_QUEUE] - c0.created[CLSHIM_QUEUE], 1);
    inst I;
    inst_init(&I, row_named("fused_split"), ctx);
    const long launches = clshim_calls(CLSHIM_ENQUEUE_NDRANGE), buffers = clshim_calls(CLSHIM_CREATE_BUFFER);
    call_ok(&I, "probe");
    clshim_get(&c2);
    print_message("one split decode call: %ld launches, %ld buffers; %ld programs, %ld kernels, %ld events created\n",
                  clshim_calls(CLSHIM_ENQUEUE_NDRANGE) - launches, clshim_calls(CLSHIM_CREATE_BUFFER) - buffers,
                  c2.created[CLSHIM_PROGRAM] - c1.created[CLSHIM_PROGRAM],
                  c2.created[CLSHIM_KERNEL] - c1.created[CLSHIM_KERNEL],
                  c2.created[CLSHIM_EVENT] - c1.created[CLSHIM_EVENT]);
    assert_true(clshim_calls(CLSHIM_ENQUEUE_NDRANGE) - launches >= 2); /* split + merge */
    assert_true(c2.created[CLSHIM_KERNEL] - c1.created[CLSHIM_KERNEL] >= 2);
    assert_true(c2.created[CLSHIM_PROGRAM] - c1.created[CLSHIM_PROGRAM] >= 2);
    assert_int_equal(c2.created[CLSHIM_EVENT] - c1.created[CLSHIM_EVENT], 1); /* done, released by call_ok */
    inst_free(&I);
    clattn_release(ctx);
    assert_no_leak(&c0, "create, call, release");
}

/* =============================== clattn_create =============================== */

/* clCreateContext or clCreateCommandQueue refused: clattn_create returns the status the error
 * means (OUT_OF_MEMORY for the memory errors, OPENCL_ERROR otherwise) with a message naming the
 * call and the error, leaves *ctx NULL, releases the context it had made, and the next
 * clattn_create works. */
static void test_create_failures(void **state)
{
    (void)state;
    assert_true(clshim_active());
    clattn_release(tu_context()); /* skips without a device; the platform's set-up happens here */
    const clshim_fn fns[2] = {CLSHIM_CREATE_CONTEXT, CLSHIM_CREATE_QUEUE};
    const cl_int errs[3] = {CL_OUT_OF_HOST_MEMORY, CL_OUT_OF_RESOURCES, CL_INVALID_VALUE};
    const char *const err_names[3] = {"CL_OUT_OF_HOST_MEMORY", "CL_OUT_OF_RESOURCES", "CL_INVALID_VALUE"};
    const clattn_status want[3] = {CLATTN_OUT_OF_MEMORY, CLATTN_OUT_OF_MEMORY, CLATTN_OPENCL_ERROR};
    for (int f = 0; f < 2; ++f)
        for (int e = 0; e < 3; ++e) {
            char when[128];
            snprintf(when, sizeof when, "%s failing with %s", clshim_fn_name(fns[f]), err_names[e]);
            clshim_counts before;
            clshim_get(&before);
            const long injected = clshim_injected(fns[f]);
            clattn_context *ctx = (clattn_context *)&before; /* must come back NULL */
            clshim_fail_at(fns[f], 0, errs[e]);
            const clattn_status st = clattn_create(NULL, &ctx);
            clshim_disarm();
            const char *msg = clattn_last_error(NULL);
            if (clshim_injected(fns[f]) != injected + 1)
                fail_msg("%s: clattn_create did not reach the armed call (%s)", when, clattn_status_name(st));
            if (st != want[e])
                fail_msg("%s: returned %s, expected %s (message \"%s\")", when, clattn_status_name(st),
                         clattn_status_name(want[e]), msg);
            if (ctx != NULL)
                fail_msg("%s: *ctx is %p after the failure, expected NULL", when, (void *)ctx);
            if (!strstr(msg, clshim_fn_name(fns[f])) || !strstr(msg, err_names[e]))
                fail_msg("%s: the message \"%s\" does not name the call and the error", when, msg);
            assert_no_leak(&before, when);
            ctx = tu_context(); /* the next one works */
            clattn_release(ctx);
        }
}

/* A driver version with trailing blanks or control characters, a long device name
 * (create/odd_device_strings). */
static void test_odd_device_strings(void **state)
{
    (void)state;
    clattn_release(tu_context()); /* skips without a device */
    char dir[] = "/tmp/clattn-driver-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *old_dir = getenv("CLATTN_TUNING_DIR");
    char *saved = old_dir ? strdup(old_dir) : NULL;
    assert_int_equal(setenv("CLATTN_TUNING_DIR", dir, 1), 0);
    static const char *const versions[5] = {"3.1+debian ", " ", "\t\t", "1.2\n", "a\r\nb  "};
    for (int i = 0; i < 5; i++) {
        clshim_fake_driver_version(versions[i]);
        clattn_context *ctx = NULL;
        const clattn_status st = clattn_create(NULL, &ctx);
        clshim_fake_driver_version(NULL);
        if (st != CLATTN_SUCCESS)
            fail_msg("driver version %d: clattn_create: %s", i, clattn_last_error(NULL));
        /* The tag as clattn-tune writes it, read back, is the driver in use. */
        clattn_tuning_table tab, back;
        memset(&tab, 0, sizeof tab);
        memset(&back, 0, sizeof back);
        snprintf(tab.device, sizeof tab.device, "%s", ctx->dev.key);
        snprintf(tab.driver, sizeof tab.driver, "%s", ctx->dev.driver);
        char *text = clattn__tuning_format(&tab);
        assert_non_null(text);
        char err[256] = "";
        if (clattn__tuning_parse(text, strlen(text), &back, err, sizeof err) != 0)
            fail_msg("driver version %d: the written store does not parse (%s):\n%s", i, err, text);
        if (strcmp(back.driver, ctx->dev.driver) != 0)
            fail_msg("driver version %d: tag \"%s\" reads back as \"%s\"", i, ctx->dev.driver, back.driver);
        free(text);
        clattn__tuning_free(&back);
        /* And a context reading that file takes it as written under its own driver. */
        char path[1024];
        assert_int_equal(clattn_tuning_path(ctx, path, sizeof path), CLATTN_SUCCESS);
        if (clattn__tuning_write(path, &tab, err, sizeof err) != 0)
            fail_msg("driver version %d: %s", i, err);
        clattn_release(ctx);
        clshim_fake_driver_version(versions[i]);
        ctx = NULL;
        const clattn_status st2 = clattn_create(NULL, &ctx);
        clshim_fake_driver_version(NULL);
        assert_int_equal(st2, CLATTN_SUCCESS);
        const char *report = clattn_tuning_report(ctx);
        if (!strstr(report, "user tuning file") || strstr(report, "ignored") || strstr(report, "differs"))
            fail_msg("driver version %d: the store is not taken as this driver's: %s", i, report);
        clattn_release(ctx);
        assert_int_equal(unlink(path), 0);
    }
    if (saved) {
        setenv("CLATTN_TUNING_DIR", saved, 1);
        free(saved);
    } else {
        unsetenv("CLATTN_TUNING_DIR");
    }
    assert_int_equal(rmdir(dir), 0);

    /* A device name longer than the context keeps (256 bytes with its terminator): cut, not a
     * failed query that made clattn_create fail. */
    static char long_name[400];
    for (size_t i = 0; i + 1 < sizeof long_name; i++)
        long_name[i] = (char)('a' + i % 26);
    clshim_fake_device_name(long_name);
    clattn_context *ctx = NULL;
    const clattn_status st = clattn_create(NULL, &ctx);
    char key[600] = "";
    const clattn_status kst = st == CLATTN_SUCCESS ? clattn_device_key(clattn_device(ctx), key, sizeof key)
                                                   : CLATTN_INVALID_ARGUMENT;
    clshim_fake_device_name(NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("a %zu-byte device name: clattn_create: %s", strlen(long_name), clattn_last_error(NULL));
    if (kst != CLATTN_SUCCESS || strncmp(ctx->dev.name, long_name, 255) != 0 || strlen(ctx->dev.name) != 255 ||
        !strstr(key, ctx->dev.name))
        fail_msg("a %zu-byte device name: name \"%s\", key \"%s\"", strlen(long_name), ctx->dev.name, key);
    clattn_release(ctx);
}

/* Devices the library passes over: see the header comment (create/llvmpipe_refused). */
static void test_llvmpipe_refused(void **state)
{
    (void)state;
    assert_true(clshim_active());
    clattn_context *base = tu_context(); /* skips without a device */
    const cl_device_id dev = clattn_device(base);
    char real_name[256] = "";
    assert_int_equal(clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof real_name, real_name, NULL), CL_SUCCESS);
    /* rusticl's name for it, and zink's over lavapipe (the same loop limit) */
    static const char *const names[2] = {"llvmpipe (LLVM 15.0.6, 256 bits)",
                                         "zink Vulkan 1.3(llvmpipe (LLVM 19.1.7, 256 bits) (LLVMPIPE))"};
    /* The test device's "P:D" spec. */
    cl_platform_id plats[16];
    cl_uint nplat = 0;
    assert_int_equal(clGetPlatformIDs(16, plats, &nplat), CL_SUCCESS);
    char index_spec[32] = "";
    for (cl_uint p = 0; p < nplat && p < 16 && !index_spec[0]; p++) {
        cl_device_id devs[16];
        cl_uint nd = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, devs, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint d = 0; d < nd && d < 16; d++)
            if (devs[d] == dev)
                snprintf(index_spec, sizeof index_spec, "%u:%u", (unsigned)p, (unsigned)d);
    }
    assert_true(index_spec[0] != '\0');
    const char *specs[4] = {NULL, "cpu", index_spec, "llvmpipe"};
    for (int n = 0; n < 2; n++) {
        clshim_fake_device_name(names[n]);
        for (int k = 0; k < 5; k++) {
            char when[160];
            snprintf(when, sizeof when, "device named \"%s\", %s%s%s", names[n],
                     k == 4 ? "clattn_create_from_queue" : "clattn_create(", k == 4 ? "" : specs[k] ? specs[k] : "NULL",
                     k == 4 ? "" : ")");
            clshim_counts before;
            clshim_get(&before);
            clattn_context *ctx = (clattn_context *)&before; /* must come back NULL */
            /* Where the machine has other devices (a GPU, or a spec that matches another device),
             * they may be chosen instead: every device here carries the fake name, so none is. */
            const clattn_status st = k == 4 ? clattn_create_from_queue(clattn_queue(base), &ctx)
                                            : clattn_create(specs[k], &ctx);
            const char *msg = clattn_last_error(NULL);
            if (st != CLATTN_UNSUPPORTED)
                fail_msg("%s: returned %s, expected CLATTN_UNSUPPORTED (\"%s\")", when, clattn_status_name(st), msg);
            if (ctx != NULL)
                fail_msg("%s: *ctx is %p after the failure, expected NULL", when, (void *)ctx);
            if (!strstr(msg, names[n]) || !strstr(msg, "65535"))
                fail_msg("%s: the message \"%s\" does not name the device and the reason", when, msg);
            if (k < 4) {
                cl_platform_id pl = (cl_platform_id)&before;
                cl_device_id dv = (cl_device_id)&before;
                if (clattn_select_device(specs[k], &pl, &dv, NULL, 0) != CLATTN_UNSUPPORTED)
                    fail_msg("%s: clattn_select_device does not refuse it", when);
                if (pl != (cl_platform_id)&before || dv != (cl_device_id)&before)
                    fail_msg("%s: clattn_select_device refused it but wrote its outputs", when);
            }
            assert_no_leak(&before, when);
        }
        clshim_fake_device_name(NULL);
        clattn_context *ctx = NULL;
        if (clattn_create(index_spec, &ctx) != CLATTN_SUCCESS)
            fail_msg("\"%s\" under its own name: %s", real_name, clattn_last_error(NULL));
        clattn_release(ctx);
    }

    /* A real llvmpipe device next to others: passed over by the default choice. */
    cl_platform_id pl;
    cl_device_id dv;
    char why[512];
    const clattn_status sel = clattn_select_device("llvmpipe", &pl, &dv, why, sizeof why);
    if (sel == CLATTN_NO_DEVICE) {
        print_message("no real llvmpipe device here (rusticl with RUSTICL_ENABLE=llvmpipe has one)\n");
    } else {
        if (sel != CLATTN_UNSUPPORTED)
            fail_msg("the real llvmpipe device: clattn_select_device returned %s", clattn_status_name(sel));
        if (clattn_select_device(NULL, &pl, &dv, why, sizeof why) == CLATTN_SUCCESS) {
            char name[256] = "";
            clGetDeviceInfo(dv, CL_DEVICE_NAME, sizeof name, name, NULL);
            print_message("with a real llvmpipe device present, clattn_create(NULL) picks %s\n", name);
            if (strstr(name, "llvmpipe"))
                fail_msg("clattn_create(NULL) picks the llvmpipe device: %s", why);
        }
    }
    clattn_release(base);
}

/* =============================== injected exhaustion =============================== */

static const clshim_fn fault_fns[] = {CLSHIM_CREATE_BUFFER, CLSHIM_ENQUEUE_NDRANGE, CLSHIM_ENQUEUE_FILL};
static const cl_int fault_errors[] = {CL_MEM_OBJECT_ALLOCATION_FAILURE, CL_OUT_OF_RESOURCES};
static const char *const fault_error_names[] = {"CL_MEM_OBJECT_ALLOCATION_FAILURE", "CL_OUT_OF_RESOURCES"};

static void test_oom(void **state)
{
    const op_row *r = *state;
    assert_true(clshim_active());
    clattn_release(tu_context());

    /* Probe: how many calls of each function one call makes on a new context. */
    long n[CLSHIM_FNS];
    {
        clattn_context *ctx = tu_context();
        inst I;
        inst_init(&I, r, ctx);
        long before[CLSHIM_FNS];
        for (int f = 0; f < CLSHIM_FNS; ++f)
            before[f] = clshim_calls((clshim_fn)f);
        call_ok(&I, "probe");
        long total = 0;
        for (int f = 0; f < CLSHIM_FNS; ++f)
            total += n[f] = clshim_calls((clshim_fn)f) - before[f];
        print_message("%s: %ld clCreateBuffer, %ld clEnqueueNDRangeKernel, %ld clEnqueueFillBuffer per call\n",
                      r->name, n[CLSHIM_CREATE_BUFFER], n[CLSHIM_ENQUEUE_NDRANGE], n[CLSHIM_ENQUEUE_FILL]);
        assert_true(n[CLSHIM_ENQUEUE_NDRANGE] >= 1);
        assert_true(total >= 1);
        inst_free(&I);
        clattn_release(ctx);
    }

    int runs = 0;
    for (size_t fi = 0; fi < N_OF(fault_fns); ++fi) {
        const clshim_fn fn = fault_fns[fi];
        for (long at = 0; at < n[fn]; ++at)
            for (size_t ei = 0; ei < N_OF(fault_errors); ++ei) {
                char when[160];
                snprintf(when, sizeof when, "%s call %ld failing with %s", clshim_fn_name(fn), at,
                         fault_error_names[ei]);
                clshim_counts before;
                clshim_get(&before);
                clattn_context *ctx = tu_context();
                inst I;
                inst_init(&I, r, ctx);
                const long injected = clshim_injected(fn);
                cl_event done = GARBAGE_EVENT;
                clshim_fail_at(fn, at, fault_errors[ei]);
                const clattn_status st = inst_call(&I, 0, NULL, r->op == OP_HOST ? NULL : &done);
                clshim_disarm();
                const char *msg = clattn_last_error(ctx);
                if (clshim_injected(fn) != injected + 1)
                    fail_msg("%s: the call did not reach the armed call (status %s)", when, clattn_status_name(st));
                if (st != CLATTN_OUT_OF_MEMORY)
                    fail_msg("%s: returned %s, expected CLATTN_OUT_OF_MEMORY (message \"%s\")", when,
                             clattn_status_name(st), msg);
                if (strstr(msg, clshim_fn_name(fn)) == NULL || strstr(msg, fault_error_names[ei]) == NULL)
                    fail_msg("%s: the message \"%s\" does not name the call and the error", when, msg);
                assert_int_equal(clattn_last_cl_error(ctx), fault_errors[ei]);
                if (r->op != OP_HOST)
                    assert_null(done);
                const int late_ok = fn == CLSHIM_ENQUEUE_NDRANGE &&
                                    (r->late_from == LATE_LAST ? at == n[fn] - 1
                                                               : r->late_from >= 0 && at >= r->late_from);
                assert_untouched(&I, when, late_ok);
                call_ok(&I, "the call after the failure");
                inst_free(&I);
                clattn_release(ctx);
                assert_no_leak(&before, when);
                ++runs;
            }
    }
    print_message("%s: %d injected failures, each followed by a correct call, no object leaked\n", r->name, runs);
}

/* =============================== failed events in the wait list =============================== */

static void expect_refused(inst *I, cl_uint num_wait, const cl_event *wait, clattn_status want, const char *what,
                           const char *also)
{
    const long launches = clshim_calls(CLSHIM_ENQUEUE_NDRANGE), fills = clshim_calls(CLSHIM_ENQUEUE_FILL),
               buffers = clshim_calls(CLSHIM_CREATE_BUFFER);
    cl_event done = GARBAGE_EVENT;
    const clattn_status st = inst_call(I, num_wait, wait, &done);
    const char *msg = clattn_last_error(I->ctx);
    if (st != want)
        fail_msg("%s: returned %s, expected %s (message \"%s\")", what, clattn_status_name(st),
                 clattn_status_name(want), msg);
    if (strstr(msg, what) == NULL || strstr(msg, also) == NULL)
        fail_msg("the message \"%s\" does not contain \"%s\" and \"%s\"", msg, what, also);
    assert_null(done);
    /* Refused before anything reached the driver. */
    assert_int_equal(clshim_calls(CLSHIM_ENQUEUE_NDRANGE), launches);
    assert_int_equal(clshim_calls(CLSHIM_ENQUEUE_FILL), fills);
    assert_int_equal(clshim_calls(CLSHIM_CREATE_BUFFER), buffers);
    assert_untouched(I, what, 0);
}

/* Writes every output's sentinel back, so the next call's results are its own. */
static void reset_outputs(inst *I)
{
    for (int role = 0; role < R_COUNT; ++role)
        if (I->used[role] && I->output[role])
            assert_int_equal(clEnqueueWriteBuffer(clattn_queue(I->ctx), I->mem[role], CL_TRUE, 0,
                                                  I->n[role] * clattn_dtype_size(I->dt[role]), I->img[role], 0,
                                                  NULL, NULL),
                             CL_SUCCESS);
}

static void test_wait(void **state)
{
    const op_row *r = *state;
    assert_true(clshim_active());
    clattn_release(tu_context());
    clshim_counts before;
    clshim_get(&before);
    clattn_context *ctx = tu_context();
    inst I;
    inst_init(&I, r, ctx);
    cl_int err;
    cl_event failed = clCreateUserEvent(clattn_cl_context(ctx), &err);
    assert_int_equal(err, CL_SUCCESS);
    assert_int_equal(clSetUserEventStatus(failed, -1), CL_SUCCESS);
    cl_event pending = clCreateUserEvent(clattn_cl_context(ctx), &err);
    assert_int_equal(err, CL_SUCCESS);

    const cl_event alone[1] = {failed};
    expect_refused(&I, 1, alone, CLATTN_OPENCL_ERROR, "wait[0]", "failed");
    assert_int_equal(clattn_last_cl_error(ctx), CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST);
    const cl_event second[2] = {pending, failed};
    expect_refused(&I, 2, second, CLATTN_OPENCL_ERROR, "wait[1]", "failed");

    /* An event of another OpenCL context on the same device. */
    cl_device_id dev = clattn_device(ctx);
    cl_platform_id plat;
    assert_int_equal(clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL), CL_SUCCESS);
    const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0};
    cl_context other = clCreateContext(props, 1, &dev, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_event foreign = clCreateUserEvent(other, &err);
    assert_int_equal(err, CL_SUCCESS);
    const cl_event foreign_list[1] = {foreign};
    expect_refused(&I, 1, foreign_list, CLATTN_INVALID_ARGUMENT, "wait[0]", "another OpenCL context");
    clSetUserEventStatus(foreign, CL_COMPLETE);
    clReleaseEvent(foreign);
    clReleaseContext(other);

    /* num_wait 0: the list is not looked at, failed event or not. */
    cl_event done = GARBAGE_EVENT;
    clattn_status st = inst_call(&I, 0, alone, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("num_wait 0 with a failed event in wait: %s: %s", clattn_status_name(st), clattn_last_error(ctx));
    assert_int_equal(clWaitForEvents(1, &done), CL_SUCCESS);
    clReleaseEvent(done);
    assert_results(&I, "num_wait 0");

    /* A pending event is waited for: nothing completes before it does. */
    reset_outputs(&I);
    done = GARBAGE_EVENT;
    const cl_event wait_pending[1] = {pending};
    st = inst_call(&I, 1, wait_pending, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("waiting on a pending event: %s: %s", clattn_status_name(st), clattn_last_error(ctx));
    assert_true(done != NULL && done != GARBAGE_EVENT);
    clFlush(clattn_queue(ctx));
    const struct timespec pause = {0, 20 * 1000 * 1000};
    nanosleep(&pause, NULL);
    cl_int exec = CL_COMPLETE;
    assert_int_equal(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof exec, &exec, NULL), CL_SUCCESS);
    assert_true(exec > CL_COMPLETE); /* queued or submitted, still waiting */
    assert_int_equal(clSetUserEventStatus(pending, CL_COMPLETE), CL_SUCCESS);
    assert_int_equal(clWaitForEvents(1, &done), CL_SUCCESS);
    clReleaseEvent(done);
    assert_results(&I, "after the pending event completed");

    clReleaseEvent(failed);
    clReleaseEvent(pending);
    inst_free(&I);
    clattn_release(ctx);
    assert_no_leak(&before, "wait list tests");
}

/* =============================== build failures =============================== */

typedef struct build_row {
    const char *name;
    const char *op_row; /* a row of `rows` */
    const char *file;   /* the kernel file replaced by a broken one */
} build_row;

static const build_row build_rows[] = {
    {"softmax_public", "softmax", "softmax.cl"},
    {"scores_public", "scores", "gemm_common.cl"},
    {"merge_public", "merge_three", "merge.cl"},
    {"unfused_second_kernel", "unfused", "softmax.cl"},  /* after the scores launch */
    {"split_merge_kernel", "fused_split", "merge.cl"},   /* after the split launch */
};

static char g_kernel_dir[PATH_MAX];

static int teardown_kernel_dir(void **state)
{
    unsetenv("CLATTN_KERNEL_DIR");
    if (g_kernel_dir[0] != '\0') {
        char path[PATH_MAX + 64];
        for (size_t i = 0; i < N_OF(build_rows); ++i) {
            snprintf(path, sizeof path, "%s/%s", g_kernel_dir, build_rows[i].file);
            unlink(path);
        }
        rmdir(g_kernel_dir);
        g_kernel_dir[0] = '\0';
    }
    return tu_teardown(state);
}

static void test_build(void **state)
{
    const build_row *b = *state;
    const op_row *r = row_named(b->op_row);
    assert_true(clshim_active());
    clattn_release(tu_context());
    const char *base = getenv("TMPDIR");
    snprintf(g_kernel_dir, sizeof g_kernel_dir, "%s/clattn-broken-kernel-XXXXXX", base && *base ? base : "/tmp");
    if (mkdtemp(g_kernel_dir) == NULL)
        fail_msg("mkdtemp: %s", strerror(errno));
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", g_kernel_dir, b->file);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("#error clattn test: this kernel file is broken on purpose\n", f);
    assert_int_equal(fclose(f), 0);

    clshim_counts before;
    clshim_get(&before);
    clattn_context *ctx = tu_context();
    inst I;
    inst_init(&I, r, ctx);
    setenv("CLATTN_KERNEL_DIR", g_kernel_dir, 1);
    cl_event done = GARBAGE_EVENT;
    const clattn_status st = inst_call(&I, 0, NULL, &done);
    unsetenv("CLATTN_KERNEL_DIR");
    const char *msg = clattn_last_error(ctx);
    print_message("%s: %s: %.200s\n", b->name, clattn_status_name(st), msg);
    if (st != CLATTN_BUILD_FAILED)
        fail_msg("returned %s, expected CLATTN_BUILD_FAILED", clattn_status_name(st));
    assert_non_null(strstr(msg, b->file));
    assert_non_null(strstr(clattn_last_build_log(ctx), "broken on purpose"));
    assert_int_equal(clattn_last_cl_error(ctx), CL_BUILD_PROGRAM_FAILURE);
    assert_null(done);
    assert_untouched(&I, "after the build failure", 0);
    call_ok(&I, "with the embedded kernel again");
    inst_free(&I);
    clattn_release(ctx);
    assert_no_leak(&before, b->name);
}

/* =============================== real exhaustion =============================== */

static void test_real_exhaustion(void **state)
{
    (void)state;
    clattn_context *ctx = tu_context();
    cl_device_id dev = clattn_device(ctx);
    cl_device_type type = 0;
    cl_ulong global = 0, max_alloc = 0;
    assert_int_equal(clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL), CL_SUCCESS);
    assert_int_equal(clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL), CL_SUCCESS);
    assert_int_equal(clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL),
                     CL_SUCCESS);
    const double gib = (double)global / (1024.0 * 1024.0 * 1024.0);
    /* A CPU device's memory is the host's, whatever it reports (PoCL reports a share of the free host
     * memory, 4 to 12 GiB of a 24 GiB host here, and hands out more without refusing): exhausting it
     * would take the whole machine down. */
    if ((type & CL_DEVICE_TYPE_CPU) || !((type & CL_DEVICE_TYPE_GPU) || global < ((cl_ulong)8 << 30))) {
        print_message("skipping: a %s device reporting %.1f GiB: exhausting its memory is only safe on a GPU or "
                      "an accelerator with less than 8 GiB of its own; oom/* covers the path by injection\n",
                      (type & CL_DEVICE_TYPE_CPU) ? "CPU" : "non-GPU", gib);
        clattn_release(ctx);
        skip();
    }
    /* An unfused problem that needs a fresh 64 MiB workspace once the device is full. */
    static const op_row big = {"exhaustion", OP_ATTENTION, 1, 8, 8, 1024, 2048, 16, UNFUSED, 0, 1, 0, F32, 0, -1, F32};
    inst I;
    inst_init(&I, &big, ctx);
    const size_t chunk = (size_t)(max_alloc < ((cl_ulong)256 << 20) ? max_alloc : ((cl_ulong)256 << 20));
    enum { MAX_HOGS = 4096 };
    static cl_mem hogs[MAX_HOGS];
    int nhogs = 0, refused = 0;
    const unsigned char zero = 0;
    while (nhogs < MAX_HOGS && (cl_ulong)nhogs * chunk < 2 * global + chunk) {
        cl_int err;
        cl_mem m = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE, chunk, NULL, &err);
        if (m == NULL || err != CL_SUCCESS) {
            refused = 1;
            break;
        }
        hogs[nhogs++] = m;
        /* Drivers allocate on first use: touch it. */
        err = clEnqueueFillBuffer(clattn_queue(ctx), m, &zero, 1, 0, chunk, 0, NULL, NULL);
        if (err == CL_SUCCESS)
            err = clFinish(clattn_queue(ctx));
        if (err != CL_SUCCESS) {
            refused = 1;
            break;
        }
    }
    print_message("%.1f GiB device: %d buffers of %zu MiB allocated, %s\n", gib, nhogs, chunk >> 20,
                  refused ? "then refused" : "never refused");
    if (refused) {
        cl_event done = GARBAGE_EVENT;
        const clattn_status st = inst_call(&I, 0, NULL, &done);
        print_message("call with the device full: %s: %s\n", clattn_status_name(st), clattn_last_error(ctx));
        if (st == CLATTN_OUT_OF_MEMORY) {
            assert_null(done);
            assert_true(strstr(clattn_last_error(ctx), "failed") != NULL);
        } else if (st == CLATTN_SUCCESS) {
            /* The driver found room after all, or fails the launch later: then the event says so. */
            assert_non_null(done);
            const cl_int wait = clWaitForEvents(1, &done);
            cl_int exec = CL_COMPLETE;
            clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof exec, &exec, NULL);
            print_message("  succeeded to enqueue; event status %d (wait %d)\n", (int)exec, (int)wait);
            clReleaseEvent(done);
        } else {
            fail_msg("with the device full: %s, expected OUT_OF_MEMORY or SUCCESS", clattn_status_name(st));
        }
    }
    for (int i = 0; i < nhogs; ++i)
        clReleaseMemObject(hogs[i]);
    clFinish(clattn_queue(ctx));
    reset_outputs(&I);
    call_ok(&I, "after the memory was given back");
    inst_free(&I);
    clattn_release(ctx);
    if (!refused)
        skip(); /* the driver overcommits: nothing was exhausted, nothing to conclude */
}

/* =============================== sizes past 2^64 =============================== */

/* The unfused path's scores matrix (batch x heads_q x seq_q x seq_kv floats) of a shape that
 * validation accepts must not wrap: the call is refused (UNSUPPORTED, the size in the message as
 * `bytes`, e.g. "e+19-byte") before anything is allocated or launched, where a wrapped size would
 * fit the max allocation and size the workspace that the kernels then write past. Q, K and V are
 * broadcast from one element; the f16 output is a 64-byte buffer that the shim reports as large
 * enough, and must keep its contents. */
static void scores_matrix_refused(clattn_context *ctx, int64_t B, int64_t S, int64_t SKV, const char *bytes)
{
    assert_true(clshim_active());
    const unsigned char pattern[64] = {0x5a, 0x5a, 0x5a, 0x5a, 0xa5};
    cl_mem in = tu_buffer(ctx, 64, pattern), out = tu_buffer(ctx, 64, pattern);
    clattn_tensor q = clattn_tensor_bhsd(in, CLATTN_F16, B, 1, S, 1);
    clattn_tensor k = clattn_tensor_bhsd(in, CLATTN_F16, B, 1, SKV, 1);
    clattn_tensor v = k;
    for (int i = 0; i < 3; i++)
        q.stride[i] = k.stride[i] = v.stride[i] = 0;
    const clattn_tensor o = clattn_tensor_bhsd(out, CLATTN_F16, B, 1, S, 1);
    const clattn_attention_desc d = {.batch = B, .heads_q = 1, .heads_kv = 1, .seq_q = S, .seq_kv = SKV,
                                     .head_dim = 1, .algorithm = CLATTN_ALGORITHM_UNFUSED};
    const long launches = clshim_calls(CLSHIM_ENQUEUE_NDRANGE), fills = clshim_calls(CLSHIM_ENQUEUE_FILL),
               buffers = clshim_calls(CLSHIM_CREATE_BUFFER);
    cl_event done = GARBAGE_EVENT;
    assert_true((uint64_t)(B * S * 2) <= SIZE_MAX);
    clshim_fake_mem_size(out, (size_t)(B * S * 2));
    const clattn_status st = clattn_attention(ctx, &d, &q, &k, &v, &o, 0, NULL, &done);
    clshim_fake_mem_size(NULL, 0);
    const char *msg = clattn_last_error(ctx);
    if (st != CLATTN_UNSUPPORTED || strstr(msg, "scores matrix") == NULL || strstr(msg, bytes) == NULL)
        fail_msg("returned %s (message \"%s\"), expected CLATTN_UNSUPPORTED for a %.4g-byte scores matrix",
                 clattn_status_name(st), msg, 4.0 * (double)B * (double)S * (double)SKV);
    assert_null(done);
    assert_int_equal(clshim_calls(CLSHIM_ENQUEUE_NDRANGE), launches);
    assert_int_equal(clshim_calls(CLSHIM_ENQUEUE_FILL), fills);
    assert_int_equal(clshim_calls(CLSHIM_CREATE_BUFFER), buffers);
    unsigned char after[64];
    tu_read(ctx, out, sizeof after, after);
    clReleaseMemObject(in);
    clReleaseMemObject(out);
    assert_memory_equal(after, pattern, sizeof after);
}

/* 7 x 1 x 1227733102 x 2146434880 floats: 7.379e19 bytes, which wraps 2^64 to 2136930816, within
 * this device's max allocation. The output, 17 GB, cannot exist where size_t has 32 bits (a
 * cl_mem's size is a size_t): skipped there, where the next test covers the wrap. */
static void test_scores_matrix_past_2_64(void **state)
{
    (void)state;
    const int64_t B = 7, S = 1227733102, SKV = 2146434880;
    if ((uint64_t)(B * S * 2) > SIZE_MAX) {
        print_message("skipping: a %lld-byte output does not fit this host's size_t\n", (long long)(B * S * 2));
        skip();
    }
    scores_matrix_refused(tu_ctx_get(), B, S, SKV, "e+19-byte");
}

/* 1 x 1 x 2^20 x 4097 floats: 1.718e10 bytes, which wraps a 32-bit size_t to 4 MiB. The max
 * allocation is lowered to 1 GiB (a 32-bit device's is at most 4 GiB anyway), so that every host
 * refuses it; with 32-bit sizes, only a size kept in 64 bits does. */
static void test_scores_matrix_past_2_32(void **state)
{
    (void)state;
    clattn_context *ctx = tu_context();
    tu_limit_max_alloc(ctx, 1ull << 30);
    scores_matrix_refused(ctx, 1, 1 << 20, 4097, "e+10-byte");
    clattn_release(ctx);
}

/* =============================== scratch copies past the max allocation =============================== */

/* On CPUs, prefill attention and scores with many query rows per head first copy K transposed
 * (fused attention also V, padded, in panels) into a workspace; the unfused
 * path puts that copy after its scores matrix, in the same allocation. When the device's max
 * allocation cannot hold the copies, the call must still succeed and match the reference, with
 * kernels that read K where it is. Each row runs on two new contexts: one as the device is, which
 * shows whether this device copies at all for the shape (a CPU must; on a GPU none may, and the
 * row then checks the results only), and one whose max allocation is lowered to `limit` bytes,
 * where no copy may run and a CPU must run `cpu_kernel`. */
typedef struct alloc_row {
    op_row r;
    unsigned long long limit;
    const char *cpu_kernel;
    const char *copy; /* the one copy kernel the limit drops; NULL: each of the Kᵀ/V copies */
} alloc_row;

/* The Kᵀ copy is head_dim x (seq_kv rounded up to the key tile, + 16) floats a kv head: at least
 * 64 x 2064 x 4 = 528384 bytes for these rows.
 *   fused_prefill: 80 rows a kv head (more than fused_direct reads in place) with their Kᵀ copy
 *     in 512 KiB: the copies do not fit; K and V are read in place (fused_lanes) instead.
 *   scores: the scratch may take half of the max allocation, 512 KiB of 1 MiB: it does not fit,
 *     and the scores kernel reads K in place.
 *   unfused_probs: the 2 MiB scores matrix fits 2.25 MiB, the copy after it does not (until this
 *     test, the call was refused with CLATTN_UNSUPPORTED instead of running without the copy).
 * With f16 inputs, Q's f32 copy (64 x 64 floats a query head, and 64 bytes) follows the Kᵀ copy
 * in the scores' scratch, and in the unfused path V's (2048 x 64 floats) follows both:
 *   scores_f16_q_copy: half of 1100000 bytes holds Kᵀ (528384) but not Kᵀ and Q (561216):
 *     scores_direct converts Q itself.
 *   unfused_f16_v_copy: after the 2 MiB scores matrix, 768 KiB hold Kᵀ and Q's copy (593984) but
 *     not V's after them (524288 more): pv_direct converts V itself. */
/* clang-format off */
static const alloc_row alloc_rows[] = {
    /* name                 op            B  Hq Hkv Sq   Skv   D   alg      causal lse probs probs_dt parts late_from  in_dt  limit                      must run           dropped copy */
    {{"fused_prefill",      OP_ATTENTION, 1, 2, 1,  40,  2048, 64, FUSED,   1,     1,  0,    F32,     0,    -1,         F32}, 512u << 10,                "fused_lanes",     NULL},
    {{"scores",             OP_SCORES,    1, 2, 1,  64,  2048, 64, AUTO,    0,     0,  0,    F32,     0,    -1,         F32}, 1u << 20,                  "scores_in_place", NULL},
    {{"unfused_probs",      OP_ATTENTION, 1, 1, 1,  256, 2048, 64, UNFUSED, 0,     1,  1,    F32,     0,    2,          F32}, (2u << 20) + (256u << 10), "scores_in_place", NULL},
    {{"scores_f16_q_copy",  OP_SCORES,    1, 2, 1,  64,  2048, 64, AUTO,    0,     0,  0,    F32,     0,    -1,         F16}, 1100000u,                  "scores_direct",   "widen_q"},
    {{"unfused_f16_v_copy", OP_ATTENTION, 1, 1, 1,  256, 2048, 64, UNFUSED, 0,     1,  0,    F32,     0,    -1,         F16}, (2u << 20) + (768u << 10), "pv_direct",       "widen_v"},
};
/* clang-format on */

static void test_alloc(void **state)
{
    const alloc_row *a = *state;
    static const char *const kv_copies[] = {"transpose_k16", "transpose_k", "pack_v"};
    const char *const *copies = a->copy ? &a->copy : kv_copies;
    const size_t ncopies = a->copy ? 1 : N_OF(kv_copies);
    int copied_as_is = 0;
    for (int limited = 0; limited < 2; ++limited) {
        clattn_context *ctx = tu_context();
        cl_device_type type = 0;
        assert_int_equal(clGetDeviceInfo(clattn_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL), CL_SUCCESS);
        const int cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
        if (limited)
            tu_limit_max_alloc(ctx, a->limit);
        inst I;
        inst_init(&I, &a->r, ctx);
        clshim_limit_kernel_wg(0); /* forgets the kernels launched so far */
        call_ok(&I, limited ? "max allocation lowered" : "device as it is");
        const char *copy = NULL;
        for (size_t i = 0; i < ncopies && !copy; ++i)
            if (clshim_launched(copies[i]))
                copy = copies[i];
        print_message("%s, max allocation %s: %s\n", a->r.name, limited ? "lowered" : "as it is",
                      copy ? copy : "no copy");
        if (!limited) {
            if (!copy && cpu)
                fail_msg("%s: no copy kernel ran on a CPU device: the row no longer tests the fallback", a->r.name);
            copied_as_is = copy != NULL;
        } else if (copy) {
            fail_msg("%s: %s ran with a max allocation of %llu bytes, too small for the copy", a->r.name, copy,
                     a->limit);
        } else if (cpu && !clshim_launched(a->cpu_kernel)) {
            fail_msg("%s: %s did not run with the max allocation lowered", a->r.name, a->cpu_kernel);
        }
        inst_free(&I);
        clattn_release(ctx);
    }
    if (!copied_as_is)
        print_message("%s: this device makes no copy for the shape; only the results were checked\n", a->r.name);
}

/* =============================== registration =============================== */

int main(void)
{
    tu_set_fixtures(NULL, tu_teardown);
    tu_add_test("shim/sees_the_library", NULL, test_shim_sees_library, NULL);
    tu_add_test("create/context_and_queue_refused", NULL, test_create_failures, NULL);
    tu_add_test("create/llvmpipe_refused", NULL, test_llvmpipe_refused, NULL);
    tu_add_test("create/odd_device_strings", NULL, test_odd_device_strings, NULL);
    TU_ADD_TABLE("oom", test_oom, rows);
    for (size_t i = 0; i < N_OF(rows); ++i)
        if (rows[i].op != OP_HOST) /* clattn_attention_host takes no wait list */
            tu_add_test("wait", rows[i].name, test_wait, &rows[i]);
    tu_set_fixtures(NULL, teardown_kernel_dir);
    TU_ADD_TABLE("build", test_build, build_rows);
    tu_set_fixtures(NULL, tu_teardown);
    tu_add_test("oom_real/device_memory", NULL, test_real_exhaustion, NULL);
    tu_add_test("sizes/scores_matrix_past_2_64", NULL, test_scores_matrix_past_2_64, NULL);
    tu_add_test("sizes/scores_matrix_past_2_32", NULL, test_scores_matrix_past_2_32, NULL);
    for (size_t i = 0; i < N_OF(alloc_rows); ++i)
        tu_add_test("copies_past_max_alloc", alloc_rows[i].r.name, test_alloc, &alloc_rows[i]);
    return tu_run_tests("failures");
}
