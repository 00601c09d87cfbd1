/*
 * Device limits the library works around because OpenCL cannot report them: NVIDIA's driver runs
 * on CUDA grids, whose y and z extents stop at 65535 work-groups (the context's max_groups_yz).
 * A launch with more work-groups there runs in chunks, each with a global offset that the kernels
 * add to their work-group index (GROUP_ID, cl/common.cl).
 *
 * The test lowers the limit of a context to 1, 2 or 3 work-groups, so that ordinary shapes cross
 * it in the kernels that use grid y and z (the CPU kernels run on grids flattened into x, which
 * has no such limit: TILE_X in cl/common.cl), and checks for each operation that
 *   - no launch has more work-groups in y or z than the limit (clshim records them), and at
 *     limit 1 the call launches more kernels than the unchunked one (the limit was crossed),
 *   - its outputs are bit for bit those of the unchunked call (same kernels and parameters, so
 *     the same arithmetic; a wrong offset moves or drops rows; within 1e-5 where the device does
 *     not round each float operation, see assert_same), and none is left unwritten,
 *   - `done` is the last chunk's event (the queue is in order: it completes after all of them),
 *     with a user event in the wait list nothing runs until it is set, and no event is leaked,
 *   - a chunk that fails to launch half-way gives CLATTN_OUT_OF_MEMORY naming the chunk, no
 *     `done`, no leaked event, and the next call computes.
 * The unchunked results are checked against the float64 reference by the other tests; the ctest
 * variants test_*_chunked run those tables themselves with the limit lowered
 * (CLATTN_TEST_MAX_GROUPS_YZ, tests/CMakeLists.txt).
 *
 * The second limit is one OpenCL does report, per kernel and only once it is compiled: a kernel
 * whose registers leave room for fewer work-items than its reqd_work_group_size
 * (CL_KERNEL_WORK_GROUP_SIZE) cannot be launched. clshim lowers that report and refuses larger
 * launches; each operation, running work-group kernels chosen by a user tuning file, must refit
 * and match the float64 reference (test_kernel_wg), and values the application or environment set
 * must be refused instead (test_kernel_wg_strict).
 *
 * The last limit is the host's: a grid past 2^32 work-items in x does not fit a 32-bit size_t
 * (test_softmax_grid_32, run by scripts/test32.sh), and one past 2^31 must still count as one
 * launch (test_ceil_div).
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp */

#include "testutil.h"
#include "clshim.h"
#include "internal.h" /* the context's device limits */
#include "clattn_ref.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Bit for bit; where the device keeps floats wider than float (tu_device_rounds_floats), within
 * 1e-5 of the element or of the output's largest finite magnitude, whichever is larger: the
 * chunks' kernels are compiled apart from the unchunked one's and round differently there (an
 * element that nearly cancels, -8.14e-8 against -8.25e-8 among values near 1, differs by far more
 * than 1e-5 of itself), while a moved or dropped row is off by far more. */
static void assert_same(const inst *I, float *const want[MAX_OUT], float *const got[MAX_OUT], const char *when)
{
    const int exact = tu_device_rounds_floats(I->ctx);
    for (int o = 0; o < I->outs; o++) {
        double amax = 0.0;
        for (size_t i = 0; i < I->n_out[o] && !exact; i++)
            if (isfinite(want[o][i]) && fabs(want[o][i]) > amax)
                amax = fabs(want[o][i]);
        for (size_t i = 0; i < I->n_out[o]; i++) {
            const double w = want[o][i], g = got[o][i];
            const int same = exact ? memcmp(&want[o][i], &got[o][i], sizeof(float)) == 0
                                   : (isnan(w) && isnan(g)) || w == g ||
                                         fabs(g - w) <= 1e-5 * (fabs(w) > amax ? fabs(w) : amax);
            if (!same)
                fail_msg("%s, %s: output %d element %zu is %.9g, unchunked %.9g", I->r->name, when, o, i,
                         (double)got[o][i], (double)want[o][i]);
            if (memcmp(&got[o][i], &FILL, sizeof FILL) == 0)
                fail_msg("%s, %s: output %d element %zu was not written", I->r->name, when, o, i);
        }
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
        clshim_reset_grid_yz();
        const long chunked = call_with_limit(&I, limit, got);
        assert_no_leak(&I, &before, when);
        /* No launch may pass the limit. Each row's call has a kernel with more than one
         * work-group in y or z (a merge, which fits its grid to the limit, still puts the
         * rest in z), so at limit 1 some launch must be chunked; at 2 and 3 none may need it
         * (the CPU kernels' flat grids, TILE_X in cl/common.cl, and the merge). */
        if (clshim_largest_grid_yz() > limit)
            fail_msg("%s, %s: %s was launched with %zu work-groups in grid y or z", r->name, when,
                     clshim_largest_grid_yz_kernel(), clshim_largest_grid_yz());
        if (limit == 1 && chunked <= whole)
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

/* ---- kernels that allow smaller work-groups than they were built for ---- */

/* Where the kernel_wg tests keep their user tuning file; empty until the first writes it. */
static char wg_dir[64];

/* Parameters that give every operation work-group kernels (on a CPU device too, whose defaults
 * run one work-item a group), as a user tuning file: parameters the library chose, which it may
 * refit, unlike an override or CLATTN_PARAMS_<OP>. Decode runs decode_rows without a mask and
 * decode_lanes (without PTX) with causal. */
static const char wg_entries[] = "scores  * * *      * * = 8,8,2,1,16,4,0,0,0\n"
                                 "pv      * * *      * * = 8,8,2,1,16,4,0,0,0\n"
                                 "softmax * * *      * * = 64,0\n"
                                 "fused   * * *      * * = 8,8,2,1,4,0\n"
                                 "decode  * * none   * * = 32,4,0,1,8,0,2\n"
                                 "decode  * * causal * * = 32,4,0,0,8,0,5\n"
                                 "merge   * * *      * * = 16\n";

/* A context on the test context's queue (so that the row's buffers serve it) that reads the user
 * tuning file above; its device limits are the test context's. */
static clattn_context *wg_context(void)
{
    clattn_context *base = tu_ctx_get();
    if (!wg_dir[0]) {
        snprintf(wg_dir, sizeof wg_dir, "/tmp/clattn-wg-XXXXXX");
        assert_non_null(mkdtemp(wg_dir));
    }
    /* The directory is read from the environment at creation and by clattn_reload_tuning; it
     * is restored before anything here can fail (a failure leaves the function). */
    const char *old = getenv("CLATTN_TUNING_DIR");
    char saved[4096] = "";
    if (old)
        snprintf(saved, sizeof saved, "%s", old);
    setenv("CLATTN_TUNING_DIR", wg_dir, 1);
    clattn_context *c = NULL;
    const clattn_status st = clattn_create_from_queue(clattn_queue(base), &c);
    char path[4200] = "";
    int written = 0;
    if (st == CLATTN_SUCCESS && clattn_tuning_path(c, path, sizeof path) == CLATTN_SUCCESS) {
        FILE *f = fopen(path, "w");
        if (f) {
            fprintf(f, "clattn-tuning 1\ndevice %s\ndriver %s\n%s", c->dev.key, c->dev.driver, wg_entries);
            written = fclose(f) == 0 && clattn_reload_tuning(c) == CLATTN_SUCCESS;
        }
    }
    if (old)
        setenv("CLATTN_TUNING_DIR", saved, 1);
    else
        unsetenv("CLATTN_TUNING_DIR");
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_create_from_queue: %s: %s", clattn_status_name(st), clattn_last_error(NULL));
    if (!written) {
        clattn_release(c);
        fail_msg("cannot write the tuning file \"%s\"", path);
    }
    c->dev = base->dev;
    const clattn_problem_class pc = {CLATTN_OPERATION_FUSED, CLATTN_F32, 64, 1024, 1024, 0, 0};
    clattn_kernel_params kp;
    assert_int_equal(clattn_get_params(c, &pc, &kp), CLATTN_SUCCESS);
    if (kp.source != CLATTN_SOURCE_USER_FILE)
        fail_msg("the kernel_wg tuning file %s is not used: %s (%s)", path, kp.origin, clattn_tuning_report(c));
    return c;
}

static double *read_doubles(const inst *I, cl_mem m, size_t n)
{
    float *h = tu_xalloc(n * sizeof *h);
    tu_read(I->ctx, m, n * sizeof *h, h);
    double *d = tu_xdoubles(n);
    for (size_t i = 0; i < n; i++)
        d[i] = h[i];
    return d;
}

/* The row's outputs from the float64 reference (ref/clattn_ref.c), in the order of inst_init. */
static void reference(const inst *I, double *want[MAX_OUT])
{
    const row *r = I->r;
    const size_t B = (size_t)r->B, Hq = (size_t)r->Hq, Hkv = (size_t)r->Hkv, Sq = (size_t)r->Sq,
                 Skv = (size_t)r->Skv, D = (size_t)r->D, Dv = (size_t)r->Dv;
    for (int o = 0; o < I->outs; o++)
        want[o] = tu_xdoubles(I->n_out[o]);
    switch (r->op) {
    case OP_FUSED:
    case OP_UNFUSED:
    case OP_SCORES: {
        const double *q = read_doubles(I, I->in[0], B * Hq * Sq * D),
                     *k = read_doubles(I, I->in[1], B * Hkv * Skv * D);
        const ref_attn a = {.batch = r->B, .heads_q = r->Hq, .heads_kv = r->Hkv, .seq_q = r->Sq, .seq_kv = r->Skv,
                            .head_dim = r->D, .head_dim_v = r->Dv, .causal = r->causal};
        if (r->op == OP_SCORES)
            ref_scores(&a, q, k, want[0]);
        else
            ref_attention(&a, q, k, read_doubles(I, I->in[2], B * Hkv * Skv * Dv), want[0], want[1],
                          r->op == OP_UNFUSED ? want[2] : NULL);
        break;
    }
    case OP_SOFTMAX: {
        const ref_softmax sm = {r->B, r->Hq, r->Sq, r->Skv, 0.5, r->causal, NULL, {0}, NULL};
        ref_softmax_rows(&sm, read_doubles(I, I->in[0], B * Hq * Sq * Skv), want[0]);
        break;
    }
    case OP_MERGE: {
        const size_t rows_n = B * Hq * Sq;
        const double *po = read_doubles(I, I->in[0], PARTS * rows_n * Dv),
                     *pl = read_doubles(I, I->in[1], PARTS * rows_n);
        const double *parts[PARTS], *lses[PARTS];
        for (int p = 0; p < PARTS; p++) {
            parts[p] = po + (size_t)p * rows_n * Dv;
            lses[p] = pl + (size_t)p * rows_n;
        }
        ref_merge(PARTS, (int)rows_n, r->Dv, parts, lses, want[0], want[1]);
        break;
    }
    }
}

/* One call on I->ctx with the kernels' work-group limit `limit` (0: none); its outputs checked
 * against want, and kernel `must_launch` (unless NULL) among its launches. Returns the largest
 * work-group it launched, and in largest_kernel[64] (unless NULL) the kernel launched with it. */
static size_t call_checked(const inst *I, size_t limit, double *const want[MAX_OUT], float *got[MAX_OUT],
                           const char *when, const char *must_launch, char *largest_kernel)
{
    reset_outputs(I);
    clshim_limit_kernel_wg(limit);
    cl_event done = NULL;
    const clattn_status st = inst_call(I, 0, NULL, &done);
    const size_t largest = clshim_largest_group();
    if (largest_kernel)
        snprintf(largest_kernel, 64, "%s", clshim_largest_group_kernel());
    const int launched = !must_launch || clshim_launched(must_launch);
    clshim_limit_kernel_wg(0);
    if (st == CLATTN_SUCCESS && !launched)
        fail_msg("%s, %s: %s did not run (refitted, it should have)", I->r->name, when, must_launch);
    if (st != CLATTN_SUCCESS)
        fail_msg("%s, %s: %s: %s", I->r->name, when, clattn_status_name(st), clattn_last_error(I->ctx));
    if (clattn_last_error(I->ctx)[0])
        fail_msg("%s, %s: succeeded with the message \"%s\" left", I->r->name, when, clattn_last_error(I->ctx));
    assert_non_null(done);
    assert_int_equal(clWaitForEvents(1, &done), CL_SUCCESS);
    assert_int_equal(clReleaseEvent(done), CL_SUCCESS);
    read_outputs(I, got);
    tu_failures = 0;
    for (int o = 0; o < I->outs; o++) {
        double *g = tu_xdoubles(I->n_out[o]);
        for (size_t i = 0; i < I->n_out[o]; i++)
            g[i] = got[o][i];
        char what[160];
        snprintf(what, sizeof what, "%s, %s, output %d", I->r->name, when, o);
        tu_check_close(what, g, want[o], I->n_out[o], 2e-5, 2e-4);
    }
    if (tu_failures)
        fail_msg("%s, %s: %d outputs differ from the float64 reference", I->r->name, when, tu_failures);
    return largest;
}

/* After a context's two calls of the row: the second call's outputs (again) equal the first's
 * (got); the context released leaves as many live OpenCL objects as `before`. */
static void release_checked(const inst *I, float *const got[MAX_OUT], float *const again[MAX_OUT],
                            const clshim_counts *before, const char *when)
{
    for (int o = 0; o < I->outs; o++)
        if (memcmp(got[o], again[o], I->n_out[o] * sizeof(float)) != 0)
            fail_msg("%s, %s: the second call's output %d differs from the first's", I->r->name, when, o);
    clattn_release(I->ctx);
    char why[256];
    clshim_counts after;
    clshim_get(&after);
    if (!clshim_same_live(before, &after, why, sizeof why))
        fail_msg("%s, %s: OpenCL objects leaked: %s", I->r->name, when, why);
}

/* A kernel whose registers leave room for fewer work-items than its reqd_work_group_size (the
 * compiler says so in CL_KERNEL_WORK_GROUP_SIZE; clshim makes it say so here) cannot be launched.
 * Where the library chose the parameters, every operation must then refit its work-groups to what
 * the kernel allows and compute the same result: with a limit of half the largest work-group the
 * row launches without one, less one (not a power of two), and with 1. Each limit gets a new
 * context (the library remembers what each kernel allows); its second call takes the remembered
 * refusal and gives the same outputs; no launch exceeds the limit; released, the context leaves no
 * OpenCL object behind, refused kernels included. */
static void test_kernel_wg(void **state)
{
    const row *r = *state;
    assert_true(clshim_active());
    inst I;
    inst_init(&I, r, tu_ctx_get());
    double *want[MAX_OUT] = {0};
    reference(&I, want);
    float *got[MAX_OUT] = {0}, *again[MAX_OUT] = {0};

    clshim_counts before;
    clshim_get(&before);
    I.ctx = wg_context();
    char main_kernel[64];
    const size_t free_largest = call_checked(&I, 0, want, got, "no limit", NULL, main_kernel);
    clattn_release(I.ctx);
    print_message("%s: work-groups of up to %zu work-items (%s) without a limit\n", r->name, free_largest,
                  main_kernel);
    if (free_largest < 4)
        fail_msg("%s: the largest work-group is %zu: the tuning file did not give work-group kernels",
                 r->name, free_largest);

    const size_t limits[2] = {free_largest / 2 - 1, 1};
    for (int l = 0; l < 2; l++) {
        char when[64];
        snprintf(when, sizeof when, "kernels allowing %zu work-items", limits[l]);
        I.ctx = wg_context();
        /* At half the largest work-group the kernel that had it runs refitted (decode_rows and
         * decode_lanes too, rather than the tiled kernel in their place); at 1 the decode kernels
         * give way to the tiled one, which fits anything. */
        const char *must = l == 0 ? main_kernel : NULL;
        const size_t largest = call_checked(&I, limits[l], want, got, when, must, NULL);
        if (largest == 0 || largest > limits[l])
            fail_msg("%s, %s: launched work-groups of up to %zu", r->name, when, largest);
        (void)call_checked(&I, limits[l], want, again, when, must, NULL);
        release_checked(&I, got, again, &before, when);
    }
}

/* The parameters of the tuning file above for the operation whose kernel the row runs first,
 * with the kernel's name and the work-items it needs; values set by the application or the
 * environment must be run as given or refused. */
typedef struct strict_params {
    clattn_operation op;
    const char *env;
    int n;
    int v[9];
    const char *kernel;
    size_t wg;
} strict_params;

static strict_params strict_params_of(const row *r)
{
    switch (r->op) {
    case OP_FUSED: {
        if (r->Sq > 16) /* the tiled kernel: WGX x WGY */
            return (strict_params){CLATTN_OPERATION_FUSED, "CLATTN_PARAMS_FUSED", 6, {8, 8, 2, 1, 4, 0},
                                   "fused", 64};
        if (!r->causal) /* decode_rows: WGY key groups of ceil(head_dim_v / 4) */
            return (strict_params){CLATTN_OPERATION_DECODE, "CLATTN_PARAMS_DECODE", 7, {32, 4, 0, 1, 8, 0, 2},
                                   "decode_rows", 4 * (size_t)((r->Dv + 3) / 4)};
        /* decode_lanes (NS 0): WGY key groups of a lane per 16-byte chunk of the longer row, a
         * power of 2 up to 32 */
        size_t lanes = 1;
        while (lanes < 32 && lanes < (size_t)((r->D > r->Dv ? r->D : r->Dv) + 3) / 4)
            lanes *= 2;
        return (strict_params){CLATTN_OPERATION_DECODE, "CLATTN_PARAMS_DECODE", 7, {32, 4, 0, 0, 8, 0, 5},
                               "decode_lanes", 4 * lanes};
    }
    case OP_UNFUSED:
    case OP_SCORES: /* the scores GEMM comes first */
        return (strict_params){CLATTN_OPERATION_SCORES, "CLATTN_PARAMS_SCORES", 9,
                               {8, 8, 2, 1, 16, 4, 0, 0, 0}, "gemm", 64};
    case OP_SOFTMAX:
        return (strict_params){CLATTN_OPERATION_SOFTMAX, "CLATTN_PARAMS_SOFTMAX", 2, {64, 0}, "softmax", 64};
    case OP_MERGE:
        /* three parts: merged pairwise */
        return (strict_params){CLATTN_OPERATION_MERGE, "CLATTN_PARAMS_MERGE", 1, {16}, "merge_pair", 16};
    }
    return (strict_params){CLATTN_OPERATION_COUNT, NULL, 0, {0}, NULL, 0}; /* not reached */
}

/* Sets the strict parameters on I->ctx: with clattn_set_params (how 0) or in CLATTN_PARAMS_<OP>
 * (how 1; the caller unsets it after the call). Returns which, for messages. */
static const char *set_strict(const inst *I, const strict_params *sp, int how)
{
    if (how == 0) {
        assert_int_equal(clattn_set_params(I->ctx, sp->op, sp->v, sp->n), CLATTN_SUCCESS);
        return "clattn_set_params";
    }
    char list[64];
    int len = 0;
    for (int i = 0; i < sp->n; i++)
        len += snprintf(list + len, sizeof list - (size_t)len, "%s%d", i ? "," : "", sp->v[i]);
    setenv(sp->env, list, 1);
    return sp->env;
}

/* The message of a call that must have been refused with UNSUPPORTED. */
static const char *refused_message(const inst *I, clattn_status st, const char *how_s)
{
    const char *msg = clattn_last_error(I->ctx);
    if (st != CLATTN_UNSUPPORTED)
        fail_msg("%s, %s: returned %s, expected CLATTN_UNSUPPORTED (\"%s\")", I->r->name, how_s,
                 clattn_status_name(st), msg);
    return msg;
}

/* A refused call handed back no event, launched nothing (`launched`: its largest work-group) and
 * left every output as reset_outputs filled it. */
static void assert_untouched(const inst *I, cl_event done, size_t launched, const char *how_s)
{
    assert_null(done);
    assert_int_equal(launched, 0);
    float *out[MAX_OUT] = {0};
    read_outputs(I, out);
    for (int o = 0; o < I->outs; o++)
        for (size_t i = 0; i < I->n_out[o]; i++)
            if (memcmp(&out[o][i], &FILL, sizeof FILL) != 0)
                fail_msg("%s, %s: output %d element %zu was modified", I->r->name, how_s, o, i);
}

/* Parameters the application or the environment set are run as given or refused: each row's
 * operation, with the tuning file's parameters as an override and in CLATTN_PARAMS_<OP>, fails
 * with UNSUPPORTED naming the kernel, its work-group and its limit, launches nothing, leaves the
 * outputs alone and hands back no event, where the tuning file's own values were refitted. */
static void test_kernel_wg_strict(void **state)
{
    const row *r = *state;
    assert_true(clshim_active());
    const strict_params sp = strict_params_of(r);
    assert_non_null(sp.env);
    inst I;
    inst_init(&I, r, tu_ctx_get());
    const size_t limit = sp.wg / 2 - 1;
    for (int how = 0; how < 2; how++) {
        I.ctx = wg_context();
        const char *how_s = set_strict(&I, &sp, how);
        reset_outputs(&I);
        clshim_limit_kernel_wg(limit);
        cl_event done = (cl_event)(uintptr_t)0x5; /* must come back NULL */
        const clattn_status st = inst_call(&I, 0, NULL, &done);
        const size_t largest = clshim_largest_group();
        clshim_limit_kernel_wg(0);
        unsetenv(sp.env);
        const char *msg = refused_message(&I, st, how_s);
        char needs[64], allows[64], kernel[64];
        snprintf(needs, sizeof needs, "needs work-groups of %zu work-items", sp.wg);
        snprintf(allows, sizeof allows, "allows %zu (CL_KERNEL_WORK_GROUP_SIZE)", limit);
        snprintf(kernel, sizeof kernel, "kernel %s built ", sp.kernel);
        if (!strstr(msg, needs) || !strstr(msg, allows) || strncmp(msg, kernel, strlen(kernel)) != 0)
            fail_msg("%s, %s: the message \"%s\" does not name the kernel (%s), its work-group (%zu) "
                     "and its limit (%zu)", r->name, how_s, msg, sp.kernel, sp.wg, limit);
        assert_untouched(&I, done, largest, how_s);
        clattn_release(I.ctx);
    }
}

/* ---- compilers that add local memory to a kernel's arrays ---- */

/* A compiler may give a kernel more local memory than its arrays take (Mesa's rusticl 22.3
 * reports twice their size, NVIDIA's driver a few bytes more), and a kernel over the device's
 * local memory cannot be launched. Where the library chose the parameters, every operation must
 * then fit its arrays to less (or, for arrays the fits do not size, run smaller work-groups) and
 * compute the same result. The row runs first as it is, which gives its largest local arrays L;
 * then on contexts whose device has L + CLATTN_LOCAL_RESERVE + 64 bytes (the fits leave the reserve
 * free, so the same kernels come first) with clshim reporting each kernel's local memory twice,
 * then plus 384 bytes. Each call must match the float64 reference and launch only
 * kernels whose reported size fits, with less than L (the first choice was refused); a second
 * call gives the same outputs; released, the context leaves no OpenCL object behind. With the
 * row's parameters set by the application or in CLATTN_PARAMS_<OP> instead, a kernel reported
 * over the device's local memory is refused: UNSUPPORTED naming it and both sizes, nothing
 * launched, the outputs untouched, no event. */
static void test_kernel_local(void **state)
{
    const row *r = *state;
    assert_true(clshim_active());
    inst I;
    inst_init(&I, r, tu_ctx_get());
    double *want[MAX_OUT] = {0};
    reference(&I, want);
    float *got[MAX_OUT] = {0}, *again[MAX_OUT] = {0};

    clshim_counts before;
    clshim_get(&before);
    I.ctx = wg_context();
    clshim_inflate_kernel_local(0, 0, 0);
    (void)call_checked(&I, 0, want, got, "as compiled", NULL, NULL);
    const cl_ulong L = clshim_largest_local();
    char first[64];
    snprintf(first, sizeof first, "%s", clshim_largest_local_kernel());
    clattn_release(I.ctx);
    print_message("%s: local arrays of up to %llu bytes (%s)\n", r->name, (unsigned long long)L, first);
    if (L == 0)
        fail_msg("%s: no kernel with local memory ran: the tuning file did not give work-group kernels", r->name);
    /* 64 bytes more: the fits' account of the arrays may round up what the compiler reports. */
    const cl_ulong device = L + CLATTN_LOCAL_RESERVE + 64;

    static const struct {
        cl_ulong mul, add;
        const char *what;
    } inflations[2] = {{2, 0, "twice the arrays"}, {1, CLATTN_LOCAL_RESERVE + 128, "the arrays + 384 bytes"}};
    for (int m = 0; m < 2; m++) {
        char when[128];
        snprintf(when, sizeof when, "a compiler reporting %s, %llu bytes of local memory", inflations[m].what,
                 (unsigned long long)device);
        if (inflations[m].mul * L + inflations[m].add <= device) {
            print_message("%s, %s: the first choice still fits\n", r->name, when);
            continue;
        }
        for (int call = 0; call < 2; call++) {
            I.ctx = call == 0 ? wg_context() : I.ctx;
            I.ctx->dev.local_mem = device;
            clshim_inflate_kernel_local(device, inflations[m].mul, inflations[m].add);
            (void)call_checked(&I, 0, want, call == 0 ? got : again, when, NULL, NULL);
            const cl_ulong largest = clshim_largest_local();
            clshim_inflate_kernel_local(0, 0, 0);
            if (largest == 0 || largest >= L || inflations[m].mul * largest + inflations[m].add > device)
                fail_msg("%s, %s, call %d: launched local arrays of up to %llu bytes (%s)", r->name, when, call + 1,
                         (unsigned long long)largest, clshim_largest_local_kernel());
        }
        release_checked(&I, got, again, &before, when);
    }

    const strict_params sp = strict_params_of(r);
    assert_non_null(sp.env);
    for (int how = 0; how < 2; how++) {
        I.ctx = wg_context();
        I.ctx->dev.local_mem = device;
        const char *how_s = set_strict(&I, &sp, how);
        reset_outputs(&I);
        /* Every kernel with local arrays is reported over the device's local memory. */
        clshim_inflate_kernel_local(device, 1, device);
        clshim_limit_kernel_wg(0);
        cl_event done = (cl_event)(uintptr_t)0x5; /* must come back NULL */
        const clattn_status st = inst_call(&I, 0, NULL, &done);
        const size_t launched = clshim_largest_group();
        clshim_inflate_kernel_local(0, 0, 0);
        unsetenv(sp.env);
        const char *msg = refused_message(&I, st, how_s);
        char kernel[64], has[64];
        snprintf(kernel, sizeof kernel, "kernel %s built ", sp.kernel);
        snprintf(has, sizeof has, "bytes of local memory; the device has %llu", (unsigned long long)device);
        if (strncmp(msg, kernel, strlen(kernel)) != 0 || !strstr(msg, has) || !strstr(msg, " needs "))
            fail_msg("%s, %s: the message \"%s\" does not name the kernel (%s) and the local memory", r->name,
                     how_s, msg, sp.kernel);
        assert_untouched(&I, done, launched, how_s);
        clattn_release(I.ctx);
    }
}

/* ---- a 32-bit host's grid ---- */

/* clattn_softmax's work-group kernel runs rows·WG work-items in grid x. Where size_t has 32 bits
 * that product passes 2^32 from rows = 2^32 / WG on (2^22 rows at WG 1024), and a wrapped grid
 * would run a few work-groups and leave the other rows unwritten (the library takes one row a
 * work-item there instead). With WG set as large as the device allows and ROWS 0, 2^32 / WG + 3
 * rows of 2 columns, the output filled with NaN beforehand, must all match the float64 softmax
 * (to 1e-6). Skipped where size_t has 64 bits: the product cannot wrap, and the launch would take
 * minutes on a CPU. scripts/test32.sh runs it. */
static void test_softmax_grid_32(void **state)
{
    (void)state;
    if (sizeof(size_t) > 4)
        skip();
    clattn_context *ctx = tu_context_sharing(tu_ctx_get());
    const int pmax = clattn_param_max(CLATTN_OPERATION_SOFTMAX, 0);
    int wg = 1;
    while (wg * 2 <= pmax && (size_t)(wg * 2) <= ctx->dev.max_wg)
        wg *= 2;
    const int values[2] = {wg, 0};
    assert_int_equal(clattn_param_count(CLATTN_OPERATION_SOFTMAX), 2);
    if (clattn_set_params(ctx, CLATTN_OPERATION_SOFTMAX, values, 2) != CLATTN_SUCCESS)
        fail_msg("clattn_set_params: %s", clattn_last_error(ctx));
    const uint64_t rows = (((uint64_t)1 << 32) / (uint64_t)wg) + 3;
    const size_t n = (size_t)rows * 2;
    float *in = tu_xalloc(n * 4), *out = tu_xalloc(n * 4);
    tu_rng rng;
    tu_seed(&rng, tu_seed_of("softmax_grid_32"));
    for (size_t i = 0; i < n; i++) {
        in[i] = (float)tu_uniform(&rng, -4.0, 4.0);
        out[i] = NAN;
    }
    cl_mem bi = tu_xbuffer(n * 4, in), bo = tu_xbuffer(n * 4, out);
    const clattn_softmax_desc sd = {1, 1, (int64_t)rows, 2, 1.0f, 0, NULL, NULL};
    const clattn_tensor ti = clattn_tensor_bhsd(bi, CLATTN_F32, 1, 1, (int64_t)rows, 2);
    const clattn_tensor to = clattn_tensor_bhsd(bo, CLATTN_F32, 1, 1, (int64_t)rows, 2);
    const clattn_status st = clattn_softmax(ctx, &sd, &ti, &to, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_softmax (WG %d, %llu rows): %s: %s", wg, (unsigned long long)rows,
                 clattn_status_name(st), clattn_last_error(ctx));
    tu_read(ctx, bo, n * 4, out);
    size_t bad = 0, first = 0;
    for (size_t r = 0; r < (size_t)rows; r++) {
        const double a = in[2 * r], b = in[2 * r + 1];
        const double p0 = 1.0 / (1.0 + exp(b - a)), p1 = 1.0 / (1.0 + exp(a - b));
        if (!(fabs(out[2 * r] - p0) <= 1e-6) || !(fabs(out[2 * r + 1] - p1) <= 1e-6))
            if (bad++ == 0)
                first = r;
    }
    clattn_release(ctx);
    if (bad)
        fail_msg("WG %d, %llu rows: %zu rows wrong, the first %zu (got %g %g)", wg,
                 (unsigned long long)rows, bad, first, (double)out[2 * first], (double)out[2 * first + 1]);
}

/* clattn__enqueue counts the chunks of each grid dimension with clattn__ceil_div: the usual
 * (g + step - 1) / step wraps a 32-bit size_t once g passes 2^31 (the softmax work-group kernel's
 * grid reaches 2^32 - 1 work-items in x), and a count of 0 left `done` without the last launch's
 * event. The values below are where that formula fails with 32 bits. */
static void test_ceil_div(void **state)
{
    (void)state;
    static const struct {
        size_t a, b, want;
    } cases[] = {
        {1, 1, 1},
        {7, 2, 4},
        {8, 2, 4},
        {3221225472u, 3221225472u, 1}, /* 12582912 rows x WG 256: one grid, one launch */
        {0xffffffffu, 0xffffffffu, 1},
        {0xffffffffu, 0x80000000u, 2},
        {0x80000001u, 0x80000000u, 2},
        {0xffffffffu, 1, 0xffffffffu},
        {0xfffffffeu, 0x10000u, 0x10000u},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        const size_t got = clattn__ceil_div(cases[i].a, cases[i].b);
        if (got != cases[i].want)
            fail_msg("ceil(%zu / %zu): got %zu, want %zu", cases[i].a, cases[i].b, got, cases[i].want);
    }
}

int main(void)
{
    static char names[N_OF(rows)][80];
    static char wg_names[N_OF(rows)][80];
    static char strict_names[N_OF(rows)][80];
    static char local_names[N_OF(rows)][80];
    struct CMUnitTest tests[5 * N_OF(rows) + 2];
    size_t n = 0;
    for (size_t i = 0; i < N_OF(rows); i++)
        tests[n++] = (struct CMUnitTest){rows[i].name, test_chunks, NULL, tu_teardown, (void *)&rows[i]};
    for (size_t i = 0; i < N_OF(rows); i++) {
        snprintf(names[i], sizeof names[i], "%s, a chunk failing", rows[i].name);
        tests[n++] = (struct CMUnitTest){names[i], test_chunk_failure, NULL, tu_teardown, (void *)&rows[i]};
    }
    /* The kernel_wg tests bring their own parameters (a tuning file), which CLATTN_PARAMS_<OP>
     * would override: they run in the plain test_limits, not in its GPU-parameter variants. */
    const int own_params = !getenv("CLATTN_PARAMS_FUSED") && !getenv("CLATTN_PARAMS_DECODE") &&
                           !getenv("CLATTN_PARAMS_SCORES") && !getenv("CLATTN_PARAMS_PV") &&
                           !getenv("CLATTN_PARAMS_SOFTMAX") && !getenv("CLATTN_PARAMS_MERGE");
    for (size_t i = 0; own_params && i < N_OF(rows); i++) {
        snprintf(wg_names[i], sizeof wg_names[i], "%s, kernels allowing smaller work-groups", rows[i].name);
        tests[n++] = (struct CMUnitTest){wg_names[i], test_kernel_wg, NULL, tu_teardown, (void *)&rows[i]};
    }
    for (size_t i = 0; own_params && i < N_OF(rows); i++) {
        snprintf(strict_names[i], sizeof strict_names[i], "%s, explicit parameters a kernel refuses",
                 rows[i].name);
        tests[n++] = (struct CMUnitTest){strict_names[i], test_kernel_wg_strict, NULL, tu_teardown,
                                         (void *)&rows[i]};
    }
    /* merge has no local arrays */
    for (size_t i = 0; own_params && i < N_OF(rows); i++)
        if (rows[i].op != OP_MERGE) {
            snprintf(local_names[i], sizeof local_names[i], "%s, a compiler adding local memory", rows[i].name);
            tests[n++] = (struct CMUnitTest){local_names[i], test_kernel_local, NULL, tu_teardown,
                                             (void *)&rows[i]};
        }
    tests[n++] = (struct CMUnitTest){"softmax past a 32-bit grid", test_softmax_grid_32, NULL,
                                     tu_teardown, NULL};
    tests[n++] = (struct CMUnitTest){"grid chunk count past 2^31 work-items", test_ceil_div, NULL, NULL, NULL};
    n = tu_filter_tests("limits", tests, n);
    const int failed = _cmocka_run_group_tests("limits", tests, n, NULL, NULL);
    clattn_release(tu_ctx);
    if (wg_dir[0])
        tu_remove_tree(wg_dir);
    return failed;
}
