/*
 * CLATTN_MATRIX and the choice of the matrix-unit kernel (fused_mma, src/matrix.c, src/fused.c):
 * a value it does not know makes clattn_create fail; clattn_matrix_report says what applies; the
 * kernel asked for by name (kernel=mma) is refused under CLATTN_MATRIX=off and on a device
 * without matrix units, with the output untouched, and runs (emulated) under
 * CLATTN_MATRIX=emulate with the tile it is given, against the float64 reference;
 * clattn_get_call_params reports the kernel where the library picks it. The numerics of the
 * kernel itself are the test tables' (test_attention_mma, test_decode_mma, test_robust_mma).
 *
 * the tile layer's probe (mma_probe) of both layouts and every input type under emulation, and on
 * the device where it has a backend.
 * Each test sets CLATTN_MATRIX before making its own context and unsets it after.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_ref.h"
#include "internal.h" /* the ldmatrix probe */

static clattn_context *context_with(const char *matrix)
{
    if (matrix)
        setenv("CLATTN_MATRIX", matrix, 1);
    else
        unsetenv("CLATTN_MATRIX");
    clattn_context *ctx = tu_context();
    unsetenv("CLATTN_MATRIX");
    return ctx;
}

static void test_bad_value(void **state)
{
    (void)state;
    clattn_context *probe = tu_context(); /* skips without a device */
    clattn_release(probe);
    setenv("CLATTN_MATRIX", "sometimes", 1);
    clattn_context *ctx = (clattn_context *)1;
    const clattn_status st = clattn_create(NULL, &ctx);
    unsetenv("CLATTN_MATRIX");
    assert_int_equal(st, CLATTN_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(clattn_last_error(NULL), "CLATTN_MATRIX"));
    assert_string_equal(clattn_matrix_report(NULL), "");
}

static void test_reports(void **state)
{
    (void)state;
    clattn_context *ctx = context_with(NULL);
    const char *r = clattn_matrix_report(ctx);
    assert_true(strncmp(r, "none: ", 6) == 0 || strncmp(r, "nvidia mma.sync", 15) == 0 ||
                strncmp(r, "amd mfma", 8) == 0);
    clattn_release(ctx);
    ctx = context_with("OFF");
    assert_true(strncmp(clattn_matrix_report(ctx), "none: ", 6) == 0);
    clattn_release(ctx);
    ctx = context_with("emulate");
    assert_true(strncmp(clattn_matrix_report(ctx), "emulated", 8) == 0);
    assert_null(strstr(clattn_matrix_report(ctx), "AMD"));
    assert_int_equal(ctx->matrix_layout, 0);
    clattn_release(ctx);
    /* the other layouts' emulations, values in any case */
    static const struct {
        const char *env, *report;
        int layout;
    } emu[] = {{"Emulate-AMD", "emulated (CLATTN_MATRIX=emulate-amd)", 1},
               {"emulate-wmma", "emulated (CLATTN_MATRIX=emulate-wmma)", 2},
               {"EMULATE-INTEL", "emulated (CLATTN_MATRIX=emulate-intel)", 3},
               {"emulate-intel8", "emulated (CLATTN_MATRIX=emulate-intel8)", 4}};
    for (size_t i = 0; i < sizeof emu / sizeof emu[0]; i++) {
        ctx = context_with(emu[i].env);
        assert_true(strncmp(clattn_matrix_report(ctx), emu[i].report, strlen(emu[i].report)) == 0);
        assert_int_equal(ctx->matrix_layout, emu[i].layout);
        clattn_release(ctx);
    }
}

/* Intel's devices: the XMX backend where the driver offers the extension, by the smallest
 * sub-group (16: layout 3, 8: layout 4); otherwise a reason naming what is missing. */
static void test_intel_layout(void **state)
{
    (void)state;
    char why[200];
    const size_t pvc[] = {16, 32}, dg2[] = {8, 16, 32}, odd[] = {32, 16}, dg2_odd[] = {32, 8, 16}, gen[] = {32},
                 none[] = {0};
    why[0] = '\0';
    assert_int_equal(clattn__intel_layout(1, pvc, 2, why, sizeof why), 3);
    assert_int_equal(clattn__intel_layout(1, odd, 2, why, sizeof why), 3); /* any order */
    assert_int_equal(clattn__intel_layout(1, dg2, 3, why, sizeof why), 4);
    assert_int_equal(clattn__intel_layout(1, dg2_odd, 3, why, sizeof why), 4);
    assert_int_equal(clattn__intel_layout(0, dg2, 3, why, sizeof why), 0);
    assert_int_equal(clattn__intel_layout(1, gen, 1, why, sizeof why), 0);
    assert_non_null(strstr(why, "sub-groups of 32"));
    assert_int_equal(clattn__intel_layout(0, pvc, 2, why, sizeof why), 0);
    assert_non_null(strstr(why, "cl_intel_subgroup_matrix_multiply_accumulate"));
    assert_int_equal(clattn__intel_layout(1, none, 0, why, sizeof why), 0);
    assert_non_null(strstr(why, "sub-group sizes"));
    assert_int_equal(clattn__intel_layout(1, none, 1, why, sizeof why), 0);
    assert_int_equal(clattn__mma_lanes(3), 16);
    assert_int_equal(clattn__mma_lanes(4), 16);
    assert_int_equal(clattn__mma_lanes(1), 64);
    assert_int_equal(clattn__mma_lanes(0), 32);
}

/* The AMD targets of the MFMA backend, by the device names AMD's OpenCL gives. */
static void test_amd_arch(void **state)
{
    (void)state;
    static const char *const mfma[] = {"gfx90a", "gfx90a:sramecc+:xnack-", "gfx940", "gfx941:xnack+",
                                       "gfx942:sramecc+:xnack-"};
    static const char *const wmma[] = {"gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151:xnack-", "gfx1153"};
    static const char *const no[] = {"gfx908:sramecc+:xnack-", "gfx906", "gfx1030", "gfx1201", "gfx9400", "gfx90", "",
                                     "Radeon RX 7900 XTX", "gfx90ab", "gfx950", "gfx11000", "gfx110"};
    for (size_t i = 0; i < sizeof mfma / sizeof mfma[0]; i++)
        if (clattn__amd_layout(mfma[i]) != 1)
            fail_msg("%s: layout %d, not MFMA's", mfma[i], clattn__amd_layout(mfma[i]));
    for (size_t i = 0; i < sizeof wmma / sizeof wmma[0]; i++)
        if (clattn__amd_layout(wmma[i]) != 2)
            fail_msg("%s: layout %d, not WMMA's", wmma[i], clattn__amd_layout(wmma[i]));
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (clattn__amd_layout(no[i]))
            fail_msg("%s: taken", no[i]);
}

enum { B = 1, HQ = 4, HKV = 2, SQ = 40, SKV = 70, D = 24 };

/* kernel=mma with 2 warps and 32-key tiles, as an override. */
static void ask_for_mma(clattn_context *ctx)
{
    int v[CLATTN_MAX_KERNEL_PARAMS] = {0};
    const int n = clattn_param_count(CLATTN_OPERATION_FUSED);
    for (int i = 0; i < n; i++) {
        const char *name = clattn_param_name(CLATTN_OPERATION_FUSED, i);
        v[i] = strcmp(name, "WGY") == 0 ? 2 : strcmp(name, "NS") == 0 ? 2 : strcmp(name, "DIRECT") == 0 ? 2 : 1;
    }
    assert_string_equal(clattn_param_value_name(CLATTN_OPERATION_FUSED, n - 1, 2), "mma");
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_FUSED, v, n), CLATTN_SUCCESS);
}

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (float)((double)((seed >> 8) & 0xffff) / 32768.0 - 1.0);
    }
}

static clattn_attention_desc small_desc(void)
{
    clattn_attention_desc d;
    memset(&d, 0, sizeof d);
    d.batch = B;
    d.heads_q = HQ;
    d.heads_kv = HKV;
    d.seq_q = SQ;
    d.seq_kv = SKV;
    d.head_dim = D;
    d.causal = 1;
    d.algorithm = CLATTN_ALGORITHM_FUSED;
    return d;
}

static void test_refused(void **state)
{
    (void)state;
    static float q[B * HQ * SQ * D], k[B * HKV * SKV * D], v[B * HKV * SKV * D], out[B * HQ * SQ * D];
    fill(q, sizeof q / sizeof q[0], 1);
    fill(k, sizeof k / sizeof k[0], 2);
    fill(v, sizeof v / sizeof v[0], 3);
    const clattn_attention_desc d = small_desc();
    /* without the units, under CLATTN_MATRIX=off, and f32 inputs on RDNA3's and Intel's layouts
     * (WMMA and XMX have no f32 product) */
    for (int mode = 0; mode < 5; mode++) {
        clattn_context *ctx = context_with(mode == 0   ? NULL
                                           : mode == 1 ? "off"
                                           : mode == 2 ? "emulate-wmma"
                                           : mode == 3 ? "emulate-intel"
                                                       : "emulate-intel8");
        if (mode == 0 && strncmp(clattn_matrix_report(ctx), "none", 4) != 0) {
            clattn_release(ctx); /* the device has the units: nothing to refuse */
            continue;
        }
        ask_for_mma(ctx);
        for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
            out[i] = 777.0f;
        const clattn_status st = clattn_attention_host(ctx, &d, CLATTN_F32, q, k, v, out, NULL);
        assert_int_equal(st, CLATTN_UNSUPPORTED);
        assert_non_null(strstr(clattn_last_error(ctx), "kernel=mma"));
        if (mode == 1)
            assert_non_null(strstr(clattn_last_error(ctx), "CLATTN_MATRIX=off"));
        if (mode == 2)
            assert_non_null(strstr(clattn_last_error(ctx), "WMMA"));
        if (mode >= 3)
            assert_non_null(strstr(clattn_last_error(ctx), "XMX"));
        for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
            assert_true(out[i] == 777.0f);
        clattn_release(ctx);
    }
}

static void test_emulated_override(void **state)
{
    const char *mode = *state; /* emulate: NVIDIA's layouts; emulate-amd: AMD's */
    static float q[B * HQ * SQ * D], k[B * HKV * SKV * D], v[B * HKV * SKV * D], out[B * HQ * SQ * D];
    static double xq[B * HQ * SQ * D], xk[B * HKV * SKV * D], xv[B * HKV * SKV * D], ref[B * HQ * SQ * D];
    fill(q, sizeof q / sizeof q[0], 4);
    fill(k, sizeof k / sizeof k[0], 5);
    fill(v, sizeof v / sizeof v[0], 6);
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        xq[i] = q[i];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        xk[i] = k[i];
        xv[i] = v[i];
    }
    clattn_context *ctx = context_with(mode);
    ask_for_mma(ctx);
    const clattn_attention_desc d = small_desc();
    assert_int_equal(clattn_attention_host(ctx, &d, CLATTN_F32, q, k, v, out, NULL), CLATTN_SUCCESS);
    const ref_attn ra = {.batch = B, .heads_q = HQ, .heads_kv = HKV, .seq_q = SQ, .seq_kv = SKV, .head_dim = D, .causal = 1};
    ref_attention(&ra, xq, xk, xv, ref, NULL, NULL);
    for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
        if (!tu_close(out[i], ref[i], 2e-5, 1e-4))
            fail_msg("out[%zu] %.9g, reference %.9g", i, (double)out[i], ref[i]);
    clattn_release(ctx);
}

/* Where the library picks the matrix kernel itself, clattn_get_call_params says so. */
static void test_call_params(void **state)
{
    (void)state;
    clattn_context *ctx = context_with("emulate");
    const clattn_problem_class pc = {CLATTN_OPERATION_FUSED, CLATTN_F16, 64, 256, 256, 0, 0};
    clattn_kernel_params kp;
    assert_int_equal(clattn_get_call_params(ctx, &pc, 8, 8, 64, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.values[kp.count - 1], 2);
    assert_non_null(strstr(kp.origin, "the matrix kernel"));
    clattn_release(ctx);
    ctx = context_with("off");
    assert_int_equal(clattn_get_call_params(ctx, &pc, 8, 8, 64, &kp), CLATTN_SUCCESS);
    assert_true(kp.values[kp.count - 1] != 2);
    clattn_release(ctx);
}

/* The ldmatrix probe's host side and its kernel, built as the emulation (plain loads on both
 * sides: every lane must agree) on whatever device runs the tests; on NVIDIA also as the device
 * runs it, where every lane must agree too (else the kernels would be built without ldmatrix:
 * the report says so). */
static void test_ldsm_probe(void **state)
{
    (void)state;
    clattn_context *ctx = context_with(NULL);
    int bad = -1;
    assert_int_equal(clattn__ldsm_probe(ctx, 0, &bad), CLATTN_SUCCESS);
    assert_int_equal(bad, 0);
    /* inside a call with a user's snippet that does not compile (the call's variants set on the
     * context): the probe builds without them, and leaves them as they were */
    static const char bad_mod[] = "float score_mod(float s, int b, int h, int q, int k) { return s +; }";
    snprintf(ctx->variant_opts, sizeof ctx->variant_opts, " -DVARIANTS=16 -DVARIANT_SRC=0x0123456789abcdef");
    ctx->variant_src[0] = bad_mod;
    bad = -1;
    assert_int_equal(clattn__ldsm_probe(ctx, 0, &bad), CLATTN_SUCCESS);
    assert_int_equal(bad, 0);
    assert_string_equal(ctx->variant_opts, " -DVARIANTS=16 -DVARIANT_SRC=0x0123456789abcdef");
    assert_ptr_equal(ctx->variant_src[0], bad_mod);
    ctx->variant_opts[0] = '\0';
    ctx->variant_src[0] = NULL;
    if (ctx->matrix_backend == CLATTN_MMA_NV) {
        assert_int_equal(clattn__ldsm_probe(ctx, 1, &bad), CLATTN_SUCCESS);
        print_message("ldmatrix probe on the device: %d of 32 lanes differ\n", bad);
        assert_int_equal(bad, 0);
        assert_int_equal(clattn__matrix_ldsm(ctx, 0), 1);
        assert_non_null(strstr(clattn_matrix_report(ctx), "ldmatrix: on"));
    } else {
        assert_int_equal(clattn__matrix_ldsm(ctx, 1), ctx->matrix_ldsm > 0);
    }
    clattn_release(ctx);
}

/* The tile layer's probe (mma_probe), built as the emulation of each layout for each input type:
 * every lane's products and exchanges must equal the plain ones; on a device with a backend, as
 * the device runs it too. */
static void test_mma_probe(void **state)
{
    (void)state;
    clattn_context *ctx = context_with(NULL);
    for (int layout = 0; layout <= 4; layout++)
        for (int dt = layout >= 2; dt <= 2; dt++) { /* WMMA, XMX: f16 and bf16 */
            int bad = -1;
            const clattn_status st = clattn__mma_probe(ctx, CLATTN_MMA_NONE, layout, dt, &bad);
            if (st != CLATTN_SUCCESS || bad != 0)
                fail_msg("layout %d type %d: %s, %d lanes differ: %s", layout, dt, clattn_status_string(st), bad,
                         clattn_last_error(ctx));
        }
    /* built as the kernel is for each backend: MMA_AMD names the AMD layout */
    char opts[240];
    clattn__mma_probe_opts(CLATTN_MMA_AMD, 2, 1, opts, sizeof opts);
    assert_non_null(strstr(opts, "-DMMA_NV=0 -DMMA_AMD=2 -DMMA_INTEL=0 -DMMA_LAYOUT=2 "));
    clattn__mma_probe_opts(CLATTN_MMA_AMD, 1, 0, opts, sizeof opts);
    assert_non_null(strstr(opts, "-DDT_IN=0 "));
    assert_non_null(strstr(opts, "-DMMA_NV=0 -DMMA_AMD=1 -DMMA_INTEL=0 -DMMA_LAYOUT=1 "));
    clattn__mma_probe_opts(CLATTN_MMA_NV, 0, 2, opts, sizeof opts);
    assert_non_null(strstr(opts, "-DMMA_NV=1 -DMMA_AMD=0 -DMMA_INTEL=0 -DMMA_LAYOUT=0 "));
    clattn__mma_probe_opts(CLATTN_MMA_NONE, 2, 2, opts, sizeof opts);
    assert_non_null(strstr(opts, "-DMMA_NV=0 -DMMA_AMD=0 -DMMA_INTEL=0 -DMMA_LAYOUT=2 "));
    clattn__mma_probe_opts(CLATTN_MMA_INTEL, 3, 1, opts, sizeof opts);
    assert_non_null(strstr(opts, "-DMMA_NV=0 -DMMA_AMD=0 -DMMA_INTEL=1 -DMMA_LAYOUT=3 "));
    clattn__mma_probe_opts(CLATTN_MMA_INTEL, 4, 2, opts, sizeof opts);
    assert_non_null(strstr(opts, "-DMMA_NV=0 -DMMA_AMD=0 -DMMA_INTEL=2 -DMMA_LAYOUT=4 "));
    if (ctx->matrix_backend != CLATTN_MMA_NONE)
        for (int dt = ctx->matrix_layout >= 2; dt <= 2; dt++) {
            assert_int_equal(clattn__matrix_checked(ctx, dt), 1);
            print_message("matrix-unit probe on the device, type %d: passed\n", dt);
        }
    clattn_release(ctx);
}

int main(void)
{
    tu_add_test("env/bad_value", NULL, test_bad_value, NULL);
    tu_add_test("report/modes", NULL, test_reports, NULL);
    tu_add_test("kernel/refused", NULL, test_refused, NULL);
    tu_add_test("report/amd_arch", NULL, test_amd_arch, NULL);
    tu_add_test("report/intel_layout", NULL, test_intel_layout, NULL);
    tu_add_test("kernel/emulated_override", "nvidia", test_emulated_override, "emulate");
    tu_add_test("kernel/emulated_override", "amd", test_emulated_override, "emulate-amd");
    tu_add_test("kernel/call_params", NULL, test_call_params, NULL);
    tu_add_test("kernel/ldsm_probe", NULL, test_ldsm_probe, NULL);
    tu_add_test("kernel/mma_probe", NULL, test_mma_probe, NULL);
    return tu_run_tests("matrix");
}
