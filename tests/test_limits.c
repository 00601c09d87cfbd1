/*
 * Device limits the library enforces itself because OpenCL cannot report them: NVIDIA's driver
 * runs on CUDA grids, whose y and z extents stop at 65535 work-groups (clattn_devinfo's
 * max_groups_yz). The test lowers the limit of a context to a few work-groups, so that ordinary
 * shapes cross it, and checks that a launch past it fails with UNSUPPORTED and a message naming
 * the grid, before the caller's output is touched, while a shape within it still computes.
 */
#include "testutil.h"
#include "internal.h" /* the context's device limits */

#include <math.h>
#include <string.h>

/* B1, Hq = Hkv = heads, seq_q = seq_kv = s, d = 8, f32; out starts as a fill pattern. */
static clattn_status run(clattn_context *ctx, int heads, int s, float *out, size_t nout)
{
    enum { D = 8 };
    const size_t n = (size_t)heads * (size_t)s * D;
    float *x = tu_xalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((int)(i % 13) - 6) * 0.125f;
    for (size_t i = 0; i < nout; i++)
        out[i] = 7.0f;
    cl_mem bq = tu_xbuffer(n * 4, x), bo = tu_xbuffer(nout * 4, out);
    clattn_tensor q = clattn_tensor_bhsd(bq, CLATTN_F32, 1, heads, s, D);
    clattn_tensor o = clattn_tensor_bhsd(bo, CLATTN_F32, 1, heads, s, D);
    clattn_attention_desc desc = {.batch = 1, .heads_q = heads, .heads_kv = heads, .seq_q = s, .seq_kv = s,
                                  .head_dim = D, .causal = 1, .algorithm = CLATTN_ALGORITHM_FUSED};
    const clattn_status st = clattn_attention(ctx, &desc, &q, &q, &q, &o, 0, NULL, NULL);
    tu_read(ctx, bo, nout * 4, out);
    return st;
}

static void test_grid_limit(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    const size_t saved = ctx->dev.max_groups_yz;
    enum { HEADS = 2, S = 64 };
    float out[HEADS * S * 8];

    /* A limit far above the grid: the call computes (causal row 0 sees key 0 only: out = v). */
    ctx->dev.max_groups_yz = 65535;
    clattn_status st = run(ctx, HEADS, S, out, (sizeof out / sizeof out[0]));
    if (st != CLATTN_SUCCESS)
        fail_msg("within the limit: %s: %s", clattn_status_string(st), clattn_last_error(ctx));
    for (int d = 0; d < 8; d++)
        assert_float_equal(out[d], (float)((d % 13) - 6) * 0.125f, 1e-6);

    /* One work-group per grid dimension: every kernel of the fused path has more in y or z. */
    ctx->dev.max_groups_yz = 1;
    st = run(ctx, HEADS, S, out, (sizeof out / sizeof out[0]));
    ctx->dev.max_groups_yz = saved;
    assert_int_equal(st, CLATTN_UNSUPPORTED);
    const char *msg = clattn_last_error(ctx);
    if (!strstr(msg, "work-groups in grid dimension") || !strstr(msg, "more than the 1"))
        fail_msg("message \"%s\" does not name the grid and the limit", msg);
    for (size_t i = 0; i < (sizeof out / sizeof out[0]); i++)
        if (out[i] != 7.0f)
            fail_msg("out[%zu] is %g after the refused call, expected the fill 7", i, (double)out[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test_teardown(test_grid_limit, tu_teardown)};
    const int failed = cmocka_run_group_tests_name("limits", tests, NULL, NULL);
    clattn_release(tu_ctx);
    return failed;
}
