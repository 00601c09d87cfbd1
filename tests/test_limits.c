/*
 * Device limits the library works around because OpenCL cannot report them: NVIDIA's driver runs
 * on CUDA grids, whose y and z extents stop at 65535 work-groups (the context's max_groups_yz).
 * A launch with more work-groups there runs in chunks, each with a global offset that the kernels
 * add to their work-group index (GROUP_ID, cl/common.cl).
 *
 * The test lowers the limit of a context to 1, 2 or 3 work-groups, so that ordinary shapes cross
 * it in every kernel of every operation, and checks for each operation that
 *   - the chunked call launches more kernels than the unchunked one (the limit was crossed),
 *   - its outputs are bit for bit those of the unchunked call (same kernels and parameters, so
 *     the same arithmetic; a wrong offset moves or drops rows), and none is left unwritten,
 *   - `done` is the last chunk's event (the queue is in order: it completes after all of them),
 *     with a user event in the wait list nothing runs until it is set, and no event is leaked,
 *   - a chunk that fails to launch half-way gives CLATTN_OUT_OF_MEMORY naming the chunk, no
 *     `done`, no leaked event, and the next call computes.
 * The unchunked results are checked against the float64 reference by the other tests; the ctest
 * variants test_*_chunked run those tables themselves with the limit lowered
 * (CLATTN_TEST_MAX_GROUPS_YZ, tests/CMakeLists.txt).
 */
#include "testutil.h"
#include "clshim.h"
#include "internal.h" /* the context's device limits */

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef enum op { OP_FUSED, OP_UNFUSED, OP_SCORES, OP_SOFTMAX, OP_MERGE } op;

typedef struct row {
    const char *name;
    op op;
    int B, Hq, Hkv, Sq, Skv, D, Dv, causal;
} row;

static const row rows[] = {
    /* fused prefill: grid y = row blocks, z = batch · kv heads · splits */
    {"fused prefill", OP_FUSED, 2, 4, 2, 37, 45, 16, 8, 1},
    /* decode: key splits in z, then merge_strided */
    {"fused decode", OP_FUSED, 2, 4, 1, 1, 3000, 32, 32, 0},
    {"fused decode seq_q 4", OP_FUSED, 1, 6, 3, 4, 2100, 8, 16, 1},
    /* scores GEMM, softmax, P·V GEMM, with the probabilities */
    {"unfused", OP_UNFUSED, 2, 3, 3, 33, 40, 8, 8, 1},
    {"scores", OP_SCORES, 2, 4, 2, 50, 70, 16, 16, 0},
    {"softmax", OP_SOFTMAX, 3, 2, 2, 45, 33, 0, 0, 1},
    /* merge_pair: rows in y, and in z once y reaches the grid limit */
    {"merge", OP_MERGE, 2, 3, 3, 7, 0, 0, 20, 0},
};

enum { PARTS = 3, MAX_OUT = 3 };
static const float FILL = 7.0f;

/* One operation's buffers: inputs written once, outputs reset to FILL before each call. */
typedef struct inst {
    const row *r;
    clattn_context *ctx;
    cl_mem in[3];
    cl_mem out[MAX_OUT];
    size_t n_out[MAX_OUT];
    int outs;
    float *fill;
    size_t fill_n;
} inst;

static cl_mem random_buffer(tu_rng *rng, size_t n, double lo, double hi)
{
    float *h = tu_xalloc(n * sizeof *h);
    tu_fill(rng, CLATTN_F32, h, NULL, n, lo, hi);
    return tu_xbuffer(n * sizeof *h, h);
}

static void inst_init(inst *I, const row *r, clattn_context *ctx)
{
    memset(I, 0, sizeof *I);
    I->r = r;
    I->ctx = ctx;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(r->name));
    const size_t B = (size_t)r->B, Hq = (size_t)r->Hq, Hkv = (size_t)r->Hkv, Sq = (size_t)r->Sq,
                 Skv = (size_t)r->Skv, D = (size_t)r->D, Dv = (size_t)r->Dv;
    switch (r->op) {
    case OP_FUSED:
    case OP_UNFUSED:
    case OP_SCORES:
        I->in[0] = random_buffer(&rng, B * Hq * Sq * D, -2, 2);
        I->in[1] = random_buffer(&rng, B * Hkv * Skv * D, -2, 2);
        I->in[2] = random_buffer(&rng, B * Hkv * Skv * (Dv ? Dv : 1), -1, 1);
        break;
    case OP_SOFTMAX:
        I->in[0] = random_buffer(&rng, B * Hq * Sq * Skv, -4, 4);
        break;
    case OP_MERGE:
        I->in[0] = random_buffer(&rng, PARTS * B * Hq * Sq * Dv, -1, 1);
        I->in[1] = random_buffer(&rng, PARTS * B * Hq * Sq, -3, 3);
        break;
    }
    switch (r->op) {
    case OP_FUSED:
        I->n_out[0] = B * Hq * Sq * Dv; /* out */
        I->n_out[1] = B * Hq * Sq;      /* lse */
        I->outs = 2;
        break;
    case OP_UNFUSED:
        I->n_out[0] = B * Hq * Sq * Dv;
        I->n_out[1] = B * Hq * Sq;
        I->n_out[2] = B * Hq * Sq * Skv; /* probabilities */
        I->outs = 3;
        break;
    case OP_SCORES:
    case OP_SOFTMAX:
        I->n_out[0] = B * Hq * Sq * Skv;
        I->outs = 1;
        break;
    case OP_MERGE:
        I->n_out[0] = B * Hq * Sq * Dv;
        I->n_out[1] = B * Hq * Sq;
        I->outs = 2;
        break;
    }
    for (int o = 0; o < I->outs; o++)
        if (I->n_out[o] > I->fill_n)
            I->fill_n = I->n_out[o];
    I->fill = tu_xalloc(I->fill_n * sizeof *I->fill);
    for (size_t i = 0; i < I->fill_n; i++)
        I->fill[i] = FILL;
    for (int o = 0; o < I->outs; o++)
        I->out[o] = tu_xbuffer(I->n_out[o] * sizeof(float), I->fill);
}

static void reset_outputs(const inst *I)
{
    for (int o = 0; o < I->outs; o++)
        assert_int_equal(clEnqueueWriteBuffer(clattn_queue(I->ctx), I->out[o], CL_TRUE, 0,
                                              I->n_out[o] * sizeof(float), I->fill, 0, NULL, NULL),
                         CL_SUCCESS);
}

static clattn_status inst_call(const inst *I, cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    const row *r = I->r;
    const int64_t B = r->B, Hq = r->Hq, Hkv = r->Hkv, Sq = r->Sq, Skv = r->Skv, D = r->D, Dv = r->Dv;
    const clattn_tensor q = clattn_tensor_bhsd(I->in[0], CLATTN_F32, B, Hq, Sq, D);
    const clattn_tensor k = clattn_tensor_bhsd(I->in[1], CLATTN_F32, B, Hkv, Skv, D);
    const clattn_tensor v = clattn_tensor_bhsd(I->in[2], CLATTN_F32, B, Hkv, Skv, Dv);
    clattn_attention_desc desc = {.batch = B, .heads_q = Hq, .heads_kv = Hkv, .seq_q = Sq, .seq_kv = Skv,
                                  .head_dim = D, .head_dim_v = Dv, .causal = r->causal};
    switch (r->op) {
    case OP_FUSED:
    case OP_UNFUSED: {
        const clattn_tensor out = clattn_tensor_bhsd(I->out[0], CLATTN_F32, B, Hq, Sq, Dv);
        const clattn_tensor lse = clattn_tensor_bhsd(I->out[1], CLATTN_F32, B, Hq, Sq, 1);
        const clattn_tensor probs = clattn_tensor_bhsd(I->out[2], CLATTN_F32, B, Hq, Sq, Skv);
        desc.lse = &lse;
        desc.algorithm = r->op == OP_FUSED ? CLATTN_ALGORITHM_FUSED : CLATTN_ALGORITHM_UNFUSED;
        desc.probabilities = r->op == OP_UNFUSED ? &probs : NULL;
        return clattn_attention(I->ctx, &desc, &q, &k, &v, &out, num_wait, wait, done);
    }
    case OP_SCORES: {
        const clattn_tensor s = clattn_tensor_bhsd(I->out[0], CLATTN_F32, B, Hq, Sq, Skv);
        return clattn_scores(I->ctx, &desc, &q, &k, &s, num_wait, wait, done);
    }
    case OP_SOFTMAX: {
        const clattn_softmax_desc sd = {.batch = B, .heads = Hq, .rows = Sq, .cols = Skv, .scale = 0.5f,
                                        .causal = r->causal};
        const clattn_tensor in = clattn_tensor_bhsd(I->in[0], CLATTN_F32, B, Hq, Sq, Skv);
        const clattn_tensor out = clattn_tensor_bhsd(I->out[0], CLATTN_F32, B, Hq, Sq, Skv);
        return clattn_softmax(I->ctx, &sd, &in, &out, num_wait, wait, done);
    }
    case OP_MERGE: {
        clattn_tensor po[PARTS], pl[PARTS];
        for (int p = 0; p < PARTS; p++) {
            po[p] = clattn_tensor_bhsd(I->in[0], CLATTN_F32, B, Hq, Sq, Dv);
            po[p].offset = p * B * Hq * Sq * Dv;
            pl[p] = clattn_tensor_bhsd(I->in[1], CLATTN_F32, B, Hq, Sq, 1);
            pl[p].offset = p * B * Hq * Sq;
        }
        const clattn_tensor out = clattn_tensor_bhsd(I->out[0], CLATTN_F32, B, Hq, Sq, Dv);
        const clattn_tensor lse = clattn_tensor_bhsd(I->out[1], CLATTN_F32, B, Hq, Sq, 1);
        return clattn_merge(I->ctx, PARTS, po, pl, &out, &lse, num_wait, wait, done);
    }
    }
    return CLATTN_INVALID_ARGUMENT;
}

/* Reads the outputs back into got[o] (tu_xalloc'd here). */
static void read_outputs(const inst *I, float *got[MAX_OUT])
{
    for (int o = 0; o < I->outs; o++) {
        got[o] = tu_xalloc(I->n_out[o] * sizeof(float));
        tu_read(I->ctx, I->out[o], I->n_out[o] * sizeof(float), got[o]);
    }
}

/* One call with the grid limit `limit` (0: none): outputs reset first, `done` waited for and
 * released. Returns the kernel launches it made. */
static long call_with_limit(const inst *I, size_t limit, float *got[MAX_OUT])
{
    reset_outputs(I);
    I->ctx->dev.max_groups_yz = limit;
    const long launches = clshim_calls(CLSHIM_ENQUEUE_NDRANGE);
    cl_event done = NULL;
    const clattn_status st = inst_call(I, 0, NULL, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("%s, grid limit %zu: %s: %s", I->r->name, limit, clattn_status_name(st),
                 clattn_last_error(I->ctx));
    assert_non_null(done);
    if (done != clshim_last_ndrange_event())
        fail_msg("%s, grid limit %zu: done is not the event of the last kernel launch", I->r->name, limit);
    assert_int_equal(clWaitForEvents(1, &done), CL_SUCCESS);
    cl_int status = -1;
    assert_int_equal(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL),
                     CL_SUCCESS);
    assert_int_equal(status, CL_COMPLETE);
    assert_int_equal(clReleaseEvent(done), CL_SUCCESS);
    read_outputs(I, got);
    return clshim_calls(CLSHIM_ENQUEUE_NDRANGE) - launches;
}

static void assert_same(const inst *I, float *const want[MAX_OUT], float *const got[MAX_OUT], const char *when)
{
    for (int o = 0; o < I->outs; o++)
        for (size_t i = 0; i < I->n_out[o]; i++) {
            if (memcmp(&want[o][i], &got[o][i], sizeof(float)) != 0)
                fail_msg("%s, %s: output %d element %zu is %.9g, unchunked %.9g", I->r->name, when, o, i,
                         (double)got[o][i], (double)want[o][i]);
            if (memcmp(&got[o][i], &FILL, sizeof FILL) == 0)
                fail_msg("%s, %s: output %d element %zu was not written", I->r->name, when, o, i);
        }
}

static void assert_no_leak(const inst *I, const clshim_counts *before, const char *when)
{
    clshim_counts after;
    clshim_get(&after);
    char why[256];
    if (!clshim_same_live(before, &after, why, sizeof why))
        fail_msg("%s, %s: OpenCL objects leaked: %s", I->r->name, when, why);
}

/* The row's buffers on the test context, and its unchunked results in want; returns the launches
 * the unchunked call made. */
static long start(void **state, inst *I, float *want[MAX_OUT])
{
    assert_true(clshim_active());
    inst_init(I, *state, tu_ctx_get());
    return call_with_limit(I, 0, want);
}

static void test_chunks(void **state)
{
    const row *r = *state;
    inst I;
    float *want[MAX_OUT] = {0}, *got[MAX_OUT] = {0};
    const long whole = start(state, &I, want);
    clattn_context *ctx = I.ctx;
    const size_t saved = ctx->dev.max_groups_yz;
    print_message("%s: %ld launches without a grid limit\n", r->name, whole);
    for (size_t limit = 1; limit <= 3; limit++) {
        char when[64];
        snprintf(when, sizeof when, "grid limit %zu", limit);
        clshim_counts before;
        clshim_get(&before);
        const long chunked = call_with_limit(&I, limit, got);
        assert_no_leak(&I, &before, when);
        if (chunked <= whole)
            fail_msg("%s, %s: %ld launches, no more than the %ld without a limit: nothing was chunked",
                     r->name, when, chunked, whole);
        assert_same(&I, want, got, when);
    }

    /* A user event in the wait list holds back every chunk and `done`. */
    reset_outputs(&I);
    ctx->dev.max_groups_yz = 1;
    cl_int err;
    cl_event gate = clCreateUserEvent(clattn_cl_context(ctx), &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_event done = NULL;
    const clattn_status st = inst_call(&I, 1, &gate, &done);
    ctx->dev.max_groups_yz = saved;
    if (st != CLATTN_SUCCESS) {
        clSetUserEventStatus(gate, CL_COMPLETE);
        clReleaseEvent(gate);
        fail_msg("%s, gated: %s: %s", r->name, clattn_status_name(st), clattn_last_error(ctx));
    }
    if (done != clshim_last_ndrange_event())
        fail_msg("%s, gated: done is not the event of the last kernel launch", r->name);
    assert_int_equal(clFlush(clattn_queue(ctx)), CL_SUCCESS);
    cl_int status = -1;
    assert_int_equal(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL),
                     CL_SUCCESS);
    const int early = status == CL_COMPLETE;
    assert_int_equal(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    assert_int_equal(clWaitForEvents(1, &done), CL_SUCCESS);
    clReleaseEvent(done);
    clReleaseEvent(gate);
    if (early)
        fail_msg("%s: done completed before the event in the wait list was set", r->name);
    read_outputs(&I, got);
    assert_same(&I, want, got, "gated by a user event, grid limit 1");
}

/* A chunk that fails to launch: the next-to-last launch of the call, where the call's last kernel
 * has been split in several. */
static void test_chunk_failure(void **state)
{
    const row *r = *state;
    inst I;
    float *want[MAX_OUT] = {0}, *got[MAX_OUT] = {0};
    (void)start(state, &I, want);
    clattn_context *ctx = I.ctx;
    const size_t saved = ctx->dev.max_groups_yz;
    const long launches = call_with_limit(&I, 1, got);
    assert_true(launches >= 2);

    reset_outputs(&I);
    clshim_counts before;
    clshim_get(&before);
    ctx->dev.max_groups_yz = 1;
    cl_event done = (cl_event)(uintptr_t)0x5; /* must come back NULL */
    clshim_fail_at(CLSHIM_ENQUEUE_NDRANGE, launches - 2, CL_OUT_OF_RESOURCES);
    const clattn_status st = inst_call(&I, 0, NULL, &done);
    clshim_disarm();
    ctx->dev.max_groups_yz = saved;
    tu_finish(ctx);
    assert_no_leak(&I, &before, "after the failed chunk");
    const char *msg = clattn_last_error(ctx);
    if (st != CLATTN_OUT_OF_MEMORY)
        fail_msg("%s: returned %s, expected CLATTN_OUT_OF_MEMORY (\"%s\")", r->name, clattn_status_name(st), msg);
    if (!strstr(msg, "chunk") || !strstr(msg, "CL_OUT_OF_RESOURCES"))
        fail_msg("%s: the message \"%s\" does not name the chunk and the error", r->name, msg);
    assert_null(done);

    (void)call_with_limit(&I, 1, got);
    ctx->dev.max_groups_yz = saved;
    assert_same(&I, want, got, "after a failed chunk");
}

int main(void)
{
    static char names[N_OF(rows)][80];
    struct CMUnitTest tests[2 * N_OF(rows)];
    size_t n = 0;
    for (size_t i = 0; i < N_OF(rows); i++)
        tests[n++] = (struct CMUnitTest){rows[i].name, test_chunks, NULL, tu_teardown, (void *)&rows[i]};
    for (size_t i = 0; i < N_OF(rows); i++) {
        snprintf(names[i], sizeof names[i], "%s, a chunk failing", rows[i].name);
        tests[n++] = (struct CMUnitTest){names[i], test_chunk_failure, NULL, tu_teardown, (void *)&rows[i]};
    }
    const int failed = cmocka_run_group_tests_name("limits", tests, NULL, NULL);
    clattn_release(tu_ctx);
    return failed;
}
