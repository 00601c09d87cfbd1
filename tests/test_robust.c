/*
 * Inputs at the edge of the storage types' range, against the float64 reference (the wide-logit,
 * -inf, NaN and all-masked cases live in test_attention.c and test_softmax.c).
 *
 * f16 tops out at 65504 and bf16 at 3.3895e38, the largest finite values; arithmetic is fp32 (largest
 * finite 3.4028e38). Rows put Q, K and/or V near those maxima (magnitudes uniform in [max/2, max],
 * random signs, or every element exactly max), with a scale that keeps the logits in a few units, so
 * the exact results are ordinary numbers and any overflow, inf or NaN is the library's. bf16 cannot
 * have Q and K both near its maximum with a finite fp32 dot product, so one of them is tiny
 * (1e-36..1e-35, still normal) while the other is near 3e38. An f16 mask at -65504, its lowest finite
 * value, must act as a large finite penalty (the key stays visible), not as -inf.
 *
 * f32 rows put V at FLT_MAX itself: every element +FLT_MAX (G_ALL_MAX) or -FLT_MAX (G_ALL_LOW),
 * or random among the 9 largest floats with one sign per column (G_TOP). The exact output, a
 * convex combination of a column of V, stays within FLT_MAX (exactly ±FLT_MAX where the column
 * is), but softmax weights rounded to fp32 add up to 1 + a few ulps, and O summed at full scale
 * rounds past FLT_MAX to inf (then NaN where inf - inf meets across key splits). Small shapes,
 * prefill (seq_q > 16, head_dim 16 and 64: fused_direct and unfused on CPUs) and decode (seq_q 1
 * and 4 against 600 and 20000 keys: key splits merged on the device).
 *
 * Each row runs fused and unfused. Tolerances scale test_attention.c's with the magnitudes:
 *   out: atol M·(2e-5 + s) + 2·e·M, rtol r, with M = max|V|, storage terms (s, r) = (0, 1e-4) for
 *        f32, (2^-10, 2^-11) for f16, (2^-7, 2^-8) for bf16, and e the largest fp32 error of one
 *        logit: (D+2)·2^-24·scale·Σ|q_d·k_d| for the dot product plus 2^-23·(|scale·q·k| + |mask|)
 *        for the scaling and the mask (a perturbation e of every logit moves the softmax weights by
 *        at most a factor e^{±2e}, and the output, a convex combination of V, by 2·e·M);
 *   lse: atol 1e-5 + 2·e, rtol 4e-6.
 * An output the reference has finite must not be inf or NaN (tu_close never matches them); at
 * M = FLT_MAX the allowance, about 2e-5·FLT_MAX + 1e-4·|out|, is finite in float64.
 * Softmax rows feed f16/bf16 values near the maxima straight in (scale 1) and scaled down to ordinary
 * logits; the tolerance of p_j is 1e-6 + 1e-5·p_j + p_j·(δ_j + Σ_k p_k·δ_k), δ_k the fp32 error of
 * logit k minus the row's largest (0 for ties), which the storage spacing makes 0 or irrelevant
 * for unscaled values near the maxima.
 * Merge rows hand clattn_merge parts whose outputs sit at FLT_MAX (G_ALL_MAX, G_ALL_LOW, G_TOP)
 * with finite LSEs (equal, spread over 1 to 3 units, or all 3e38) and compare with ref_merge: the
 * merged output is a convex combination of the parts, finite, exactly ±FLT_MAX for equal parts.
 * Rows with ordinary outputs and LSEs of 2^24 to 3e38 check the weights where an fp32 LSE can no
 * longer hold lse + log 2 (a merge chained through one would weigh equal parts 1/2, 1/4, ...).
 * Tolerances as test_decode.c's merge alone with atol scaled by M = max|part|: out atol 1e-6·M,
 * rtol 1e-6; lse atol and rtol 1e-6; with more parts (up to 4096) out atol max(1e-6, 3·2^-24·P)·M,
 * as each of the P - 1 chained merge steps may round by 3 ulp of M.
 * Former limits, now rows of the table: the fused kernels keep O normalised (a convex combination
 * of V rows), so V near FLT_MAX with many keys stays finite (G_LIMIT rows put V at
 * FLT_MAX/(2·seq_kv), the bf16 *_near_max rows up to bf16's maximum, 0.4% below FLT_MAX, and the
 * f32 rows at FLT_MAX itself); every kernel subtracts the row maximum before multiplying by
 * log2(e), so logits near FLT_MAX work (softmax bf16_near_max).
 */
#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

#define F32 CLATTN_F32
#define F16 CLATTN_F16
#define BF16 CLATTN_BF16

#define F16_MAX 65504.0
#define BF16_MAX 3.3895313892515355e38 /* 0x7F7F */

typedef enum gen {
    G_NORMAL,     /* uniform in [-1, 1] */
    G_NEAR_MAX,   /* magnitude uniform in [max/2, max], random sign */
    G_ALL_MAX,    /* every element exactly +max */
    G_ALL_LOW,    /* every element exactly -max, the lowest finite value */
    G_TOP,        /* magnitude uniform in [max·(1 - TOP_SPAN), max], the sign of the column (the
                   * index in the last dimension): + for even columns, - for odd ones */
    G_TINY,       /* magnitude uniform in [1e-36, 1e-35], random sign (bf16) */
    G_LIMIT       /* magnitude uniform in [limit/2, limit], random sign: the row's documented limit */
} gen;

/* G_TOP's span below the maximum: for f32, the 9 largest floats (FLT_MAX·2^-21 is 8 ulps). A
 * column of V with one sign then has a weighted average within 8 ulps of FLT_MAX, which the
 * rounded softmax weights (summing to 1 + a few ulps) must not push past it. Wider spans leave
 * room: with 2^-10 no row catches an accumulator without headroom, with 2^-19 only some do. */
#define TOP_SPAN 0x1p-21

static double dtype_max(clattn_dtype dt)
{
    return dt == F16 ? F16_MAX : dt == BF16 ? BF16_MAX : (double)FLT_MAX;
}

/* Typical magnitude of a generator's values, for choosing the scale. */
static double typical(gen g, clattn_dtype dt)
{
    switch (g) {
    case G_NORMAL:
        return 0.5;
    case G_NEAR_MAX:
        return 0.75 * dtype_max(dt);
    case G_ALL_MAX:
    case G_ALL_LOW:
    case G_TOP:
        return dtype_max(dt);
    case G_TINY:
        return 5e-36;
    case G_LIMIT:
        return 1.0; /* only used for V and softmax inputs, which do not set the scale */
    }
    return 1.0;
}

/* n elements whose last dimension has `cols` of them. */
static void generate(tu_rng *rng, gen g, clattn_dtype dt, double limit, int cols, void *typed, double *x,
                     size_t n)
{
    const double m = dtype_max(dt);
    for (size_t i = 0; i < n; ++i) {
        const double sign = tu_uniform(rng, 0.0, 1.0) < 0.5 ? -1.0 : 1.0;
        double v = 0.0;
        switch (g) {
        case G_NORMAL:
            v = tu_uniform(rng, -1.0, 1.0);
            break;
        case G_NEAR_MAX:
            v = sign * tu_uniform(rng, 0.5 * m, m);
            break;
        case G_ALL_MAX:
            v = m;
            break;
        case G_ALL_LOW:
            v = -m;
            break;
        case G_TOP:
            v = (i % (size_t)cols % 2 == 0 ? 1.0 : -1.0) * tu_uniform(rng, m * (1.0 - TOP_SPAN), m);
            break;
        case G_TINY:
            v = sign * tu_uniform(rng, 1e-36, 1e-35);
            break;
        case G_LIMIT:
            v = sign * tu_uniform(rng, 0.5 * limit, limit);
            break;
        }
        tu_put(dt, typed, x, i, v);
    }
}

/* =============================== attention =============================== */

typedef struct att_row {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D;
    clattn_dtype dt;
    gen q, k, v; /* G_LIMIT for V: seq_kv·max|V| = FLT_MAX/2 */
    int causal;
    int mask_lowest; /* f16 mask: -65504 at ~70% of entries, 0 elsewhere; row 0 all -65504 */
} att_row;

/* clang-format off */
static const att_row att_rows[] = {
    /* name                               B  Hq Hkv Sq  Skv    D   dt    q           k           v          causal mask */
    {"f16_qk_near_max",                   1, 2, 1,  5,  37,    16, F16,  G_NEAR_MAX, G_NEAR_MAX, G_NORMAL,   0,     0},
    {"f16_v_near_max",                    1, 2, 1,  5,  37,    16, F16,  G_NORMAL,   G_NORMAL,   G_NEAR_MAX, 1,     0},
    {"f16_v_all_max",                     1, 2, 2,  5,  37,    16, F16,  G_NORMAL,   G_NORMAL,   G_ALL_MAX,  0,     0},
    {"f16_all_near_max",                  2, 2, 2,  6,  29,    16, F16,  G_NEAR_MAX, G_NEAR_MAX, G_NEAR_MAX, 1,     0},
    {"f16_decode_all_near_max",           1, 4, 1,  1,  600,   32, F16,  G_NEAR_MAX, G_NEAR_MAX, G_NEAR_MAX, 0,     0},
    {"f16_mask_lowest_finite",            1, 2, 2,  5,  37,    16, F16,  G_NORMAL,   G_NORMAL,   G_NORMAL,   0,     1},
    {"bf16_q_near_max",                   1, 2, 1,  5,  37,    16, BF16, G_NEAR_MAX, G_TINY,     G_NORMAL,   0,     0},
    {"bf16_k_near_max",                   1, 2, 1,  5,  37,    16, BF16, G_TINY,     G_NEAR_MAX, G_NORMAL,   1,     0},
    {"bf16_v_at_accumulator_limit",       1, 2, 1,  5,  37,    16, BF16, G_NORMAL,   G_NORMAL,   G_LIMIT,    0,     0},
    {"bf16_qv_at_accumulator_limit",      2, 2, 2,  6,  29,    16, BF16, G_NEAR_MAX, G_TINY,     G_LIMIT,    1,     0},
    {"bf16_decode_v_at_accumulator_limit",1, 4, 1,  1,  600,   32, BF16, G_NORMAL,   G_NORMAL,   G_LIMIT,    0,     0},
    /* V at the maximum: an unnormalised accumulator Σ e^(s-m)·v would overflow fp32 where the exact
     * result is near -2e38. */
    {"bf16_v_near_max",                   1, 2, 1,  5,  37,    16, BF16, G_NORMAL,   G_NORMAL,   G_NEAR_MAX, 0,     0},
    {"bf16_qv_near_max",                  2, 2, 2,  6,  29,    16, BF16, G_NEAR_MAX, G_TINY,     G_NEAR_MAX, 1,     0},
    {"bf16_decode_v_near_max",            1, 4, 1,  1,  600,   32, BF16, G_NORMAL,   G_NORMAL,   G_NEAR_MAX, 0,     0},
    /* Prefill shapes (seq_q > 16): the kernels that CPUs use for prefill (fused_direct, unfused). */
    {"f16_prefill_all_near_max",          1, 2, 1,  40, 70,    16, F16,  G_NEAR_MAX, G_NEAR_MAX, G_NEAR_MAX, 1,     0},
    {"bf16_prefill_v_near_max",           1, 2, 2,  33, 90,    24, BF16, G_NORMAL,   G_NORMAL,   G_NEAR_MAX, 0,     0},
    {"bf16_prefill_qv_near_max",          1, 4, 2,  20, 41,    16, BF16, G_NEAR_MAX, G_TINY,     G_NEAR_MAX, 1,     1},
    /* f32 V at FLT_MAX itself, one sign down each column: the exact output is a convex combination
     * of the column, at most FLT_MAX in magnitude, but softmax weights rounded to fp32 add up to
     * 1 + a few ulps, so Σ p_j·v_j rounds past FLT_MAX unless the accumulator has headroom.
     * Small shapes, prefill (seq_q > 16: fused_direct, unfused), and decode against 600 and 20000
     * keys (seq_q 1 and 4: key splits, whose partials merge.cl combines). */
    {"f32_v_all_max",                     1, 2, 1,  5,  37,    16, F32,  G_NORMAL,   G_NORMAL,   G_ALL_MAX,  0,     0},
    {"f32_v_all_lowest",                  1, 2, 2,  5,  37,    16, F32,  G_NORMAL,   G_NORMAL,   G_ALL_LOW,  1,     0},
    {"f32_v_top",                         2, 2, 2,  5,  29,    16, F32,  G_NORMAL,   G_NORMAL,   G_TOP,      1,     0},
    {"f32_prefill_v_all_max",             1, 2, 1,  40, 70,    16, F32,  G_NORMAL,   G_NORMAL,   G_ALL_MAX,  1,     0},
    {"f32_prefill_hd64_v_all_lowest",     1, 2, 2,  33, 300,   64, F32,  G_NORMAL,   G_NORMAL,   G_ALL_LOW,  0,     0},
    {"f32_prefill_hd64_v_top",            1, 4, 2,  24, 300,   64, F32,  G_NORMAL,   G_NORMAL,   G_TOP,      0,     0},
    {"f32_decode_v_all_max",              1, 4, 1,  1,  600,   32, F32,  G_NORMAL,   G_NORMAL,   G_ALL_MAX,  0,     0},
    {"f32_decode_q4_v_all_lowest",        1, 2, 2,  4,  600,   32, F32,  G_NORMAL,   G_NORMAL,   G_ALL_LOW,  0,     0},
    {"f32_decode_kv20000_v_all_max",      1, 4, 1,  1,  20000, 32, F32,  G_NORMAL,   G_NORMAL,   G_ALL_MAX,  0,     0},
    {"f32_decode_q4_kv20000_v_top",       1, 2, 2,  4,  20000, 32, F32,  G_NORMAL,   G_NORMAL,   G_TOP,      0,     0},
};
/* clang-format on */

/* Largest fp32 error of one logit, as in the file comment. */
static double logit_error(const att_row *r, double scale, const double *xq, const double *xk, const double *xm)
{
    const int group = r->Hq / r->Hkv;
    double worst = 0.0;
    for (int b = 0; b < r->B; ++b)
        for (int h = 0; h < r->Hq; ++h)
            for (int i = 0; i < r->Sq; ++i)
                for (int j = 0; j < r->Skv; ++j) {
                    const double *q = xq + (((size_t)b * r->Hq + h) * r->Sq + i) * r->D;
                    const double *k = xk + (((size_t)b * r->Hkv + h / group) * r->Skv + j) * r->D;
                    double abs_sum = 0.0, dot = 0.0;
                    for (int d = 0; d < r->D; ++d) {
                        abs_sum += fabs(q[d] * k[d]);
                        dot += q[d] * k[d];
                    }
                    const double m = xm != NULL ? fabs(xm[(((size_t)b * r->Hq + h) * r->Sq + i) * r->Skv + j]) : 0.0;
                    const double e = (r->D + 2) * 0x1p-24 * scale * abs_sum + 0x1p-23 * (fabs(scale * dot) + m);
                    worst = e > worst ? e : worst;
                }
    return worst;
}

static void test_attention_edge(void **state)
{
    const att_row *r = *state;
    tu_ctx_get();
    tu_failures = 0;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(r->name));
    const size_t nq = (size_t)r->B * r->Hq * r->Sq * r->D, nk = (size_t)r->B * r->Hkv * r->Skv * r->D;
    const size_t nrow = (size_t)r->B * r->Hq * r->Sq, nm = nrow * (size_t)r->Skv;
    const size_t esz = clattn_dtype_size(r->dt);
    void *tq = tu_xalloc(nq * esz), *tk = tu_xalloc(nk * esz), *tv = tu_xalloc(nk * esz);
    double *xq = tu_xdoubles(nq), *xk = tu_xdoubles(nk), *xv = tu_xdoubles(nk);
    generate(&rng, r->q, r->dt, 0.0, r->D, tq, xq, nq);
    generate(&rng, r->k, r->dt, 0.0, r->D, tk, xk, nk);
    generate(&rng, r->v, r->dt, (double)FLT_MAX / (2.0 * r->Skv), r->D, tv, xv, nk);
    double *xm = NULL;
    cl_mem mbuf = NULL;
    clattn_tensor mask;
    if (r->mask_lowest) {
        uint16_t *tm = tu_xalloc(nm * sizeof *tm);
        xm = tu_xdoubles(nm);
        for (size_t i = 0; i < nm; ++i)
            tu_put(F16, tm, xm, i, (i < (size_t)r->Skv || tu_uniform(&rng, 0.0, 1.0) < 0.7) ? -F16_MAX : 0.0);
        mbuf = tu_xbuffer(nm * sizeof *tm, tm);
        mask = clattn_tensor_bhsd(mbuf, F16, r->B, r->Hq, r->Sq, r->Skv);
    }
    /* Scale: a few units of logit from the typical magnitudes; rounded to float as the device gets it. */
    const float scale = (float)(2.0 / (sqrt((double)r->D) * typical(r->q, r->dt) * typical(r->k, r->dt)));
    assert_true(isfinite(scale) && scale > 0.0f);

    ref_attn a;
    memset(&a, 0, sizeof a);
    a.batch = r->B;
    a.heads_q = r->Hq;
    a.heads_kv = r->Hkv;
    a.seq_q = r->Sq;
    a.seq_kv = r->Skv;
    a.head_dim = r->D;
    a.scale = (double)scale;
    a.causal = r->causal;
    a.mask = xm;
    a.mask_shape[0] = r->B;
    a.mask_shape[1] = r->Hq;
    a.mask_shape[2] = r->Sq;
    a.mask_shape[3] = r->Skv;
    double *want = tu_xdoubles(nq), *want_lse = tu_xdoubles(nrow);
    ref_attention(&a, xq, xk, xv, want, want_lse, NULL);
    for (size_t i = 0; i < nq; ++i)
        assert_true(isfinite(want[i])); /* the rows are built so that the exact result is finite */

    double vmax = 0.0;
    for (size_t i = 0; i < nk; ++i)
        vmax = fabs(xv[i]) > vmax ? fabs(xv[i]) : vmax;
    const double e = logit_error(r, (double)scale, xq, xk, xm);
    const double s_atol = r->dt == F16 ? 0x1p-10 : r->dt == BF16 ? 0x1p-7 : 0.0;
    const double rtol = r->dt == F16 ? 0x1p-11 : r->dt == BF16 ? 0x1p-8 : 1e-4;
    const double atol = vmax * (2e-5 + s_atol) + 2.0 * e * vmax;
    print_message("scale %.6g, max|V| %.6g, logit error bound %.3g: out atol %.6g rtol %.3g\n", (double)scale, vmax,
                  e, atol, rtol);

    cl_mem bq = tu_xbuffer(nq * esz, tq), bk = tu_xbuffer(nk * esz, tk), bv = tu_xbuffer(nk * esz, tv);
    const clattn_tensor q = clattn_tensor_bhsd(bq, r->dt, r->B, r->Hq, r->Sq, r->D);
    const clattn_tensor k = clattn_tensor_bhsd(bk, r->dt, r->B, r->Hkv, r->Skv, r->D);
    const clattn_tensor v = clattn_tensor_bhsd(bv, r->dt, r->B, r->Hkv, r->Skv, r->D);
    static const clattn_algorithm algs[2] = {CLATTN_ALGORITHM_FUSED, CLATTN_ALGORITHM_UNFUSED};
    for (int ai = 0; ai < 2; ++ai) {
        const char *alg = ai == 0 ? "fused" : "unfused";
        cl_mem bo = tu_xbuffer(nq * esz, NULL), bl = tu_xbuffer(nrow * 4, NULL);
        const clattn_tensor out = clattn_tensor_bhsd(bo, r->dt, r->B, r->Hq, r->Sq, r->D);
        const clattn_tensor lse = clattn_tensor_bhsd(bl, F32, r->B, r->Hq, r->Sq, 1);
        clattn_attention_desc d;
        memset(&d, 0, sizeof d);
        d.batch = r->B;
        d.heads_q = r->Hq;
        d.heads_kv = r->Hkv;
        d.seq_q = r->Sq;
        d.seq_kv = r->Skv;
        d.head_dim = r->D;
        d.scale = scale;
        d.causal = r->causal;
        d.mask = r->mask_lowest ? &mask : NULL;
        d.lse = &lse;
        d.algorithm = algs[ai];
        const clattn_status st = clattn_attention(tu_ctx, &d, &q, &k, &v, &out, 0, NULL, NULL);
        if (st != CLATTN_SUCCESS)
            fail_msg("%s: %s: %s", alg, clattn_status_name(st), clattn_last_error(tu_ctx));
        unsigned char *img = tu_xalloc(nq * esz);
        float *lse_img = tu_xalloc(nrow * 4);
        tu_read(tu_ctx, bo, nq * esz, img);
        tu_read(tu_ctx, bl, nrow * 4, lse_img);
        double *got = tu_xdoubles(nq), *got_lse = tu_xdoubles(nrow);
        for (size_t i = 0; i < nq; ++i)
            got[i] = tu_load(r->dt, img, i);
        for (size_t i = 0; i < nrow; ++i)
            got_lse[i] = lse_img[i];
        char what[64];
        snprintf(what, sizeof what, "%s out", alg);
        tu_check_close(what, got, want, nq, atol, rtol);
        snprintf(what, sizeof what, "%s lse", alg);
        tu_check_close(what, got_lse, want_lse, nrow, 1e-5 + 2.0 * e, 4e-6);
    }
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* =============================== softmax =============================== */

typedef struct sm_row {
    const char *name;
    int B, H, R, C;
    clattn_dtype dt; /* input; the output is f32 */
    gen in;          /* G_LIMIT: |scale·x| up to FLT_MAX/2 */
    float scale;     /* 0: 1 */
} sm_row;

/* clang-format off */
static const sm_row sm_rows[] = {
    {"f16_near_max",            1, 2, 5, 77,  F16,  G_NEAR_MAX, 0.0f},
    {"f16_near_max_scaled",     1, 2, 5, 77,  F16,  G_NEAR_MAX, 3e-5f},
    {"bf16_near_max_scaled",    2, 1, 5, 300, BF16, G_NEAR_MAX, 1e-38f},
    {"bf16_at_logit_limit",     1, 2, 5, 77,  BF16, G_LIMIT,    0.0f},
    /* Logits above FLT_MAX / log2(e): they would overflow if multiplied by log2(e) before the row
     * maximum is subtracted. */
    {"bf16_near_max",           1, 2, 5, 77,  BF16, G_NEAR_MAX, 0.0f},
    {"bf16_all_max",            1, 1, 3, 19,  BF16, G_ALL_MAX,  0.0f},
};
/* clang-format on */

static void test_softmax_edge(void **state)
{
    const sm_row *r = *state;
    tu_ctx_get();
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(r->name));
    const size_t n = (size_t)r->B * r->H * r->R * r->C, esz = clattn_dtype_size(r->dt);
    void *tin = tu_xalloc(n * esz);
    double *x = tu_xdoubles(n), *want = tu_xdoubles(n), *got = tu_xdoubles(n);
    generate(&rng, r->in, r->dt, (double)FLT_MAX / 2.0, r->C, tin, x, n);
    const ref_softmax s = {r->B, r->H, r->R, r->C, (double)r->scale, 0, NULL, {0, 0, 0, 0}, NULL};
    ref_softmax_rows(&s, x, want);
    /* Per element: p_j·(δ_j + Σ_k p_k·δ_k) for the fp32 error δ_k of the difference between logit k
     * and the row's largest, 2^-23·(|scale·x_k| + |scale·x_max|) (0 for a tie: equal inputs give
     * equal logits), on top of 1e-6 + 1e-5·p_j. Huge logits then cost nothing where the storage
     * spacing makes every difference either 0 or far beyond exp's range. */
    const double scale = r->scale != 0.0f ? (double)r->scale : 1.0;
    double *allowed = tu_xdoubles(n);
    for (size_t row = 0; row < n / (size_t)r->C; ++row) {
        const double *xr = x + row * (size_t)r->C, *pr = want + row * (size_t)r->C;
        double xmax = -INFINITY, mixed = 0.0;
        for (int j = 0; j < r->C; ++j)
            xmax = scale * xr[j] > xmax ? scale * xr[j] : xmax;
        for (int j = 0; j < r->C; ++j)
            if (scale * xr[j] != xmax)
                mixed += pr[j] * 0x1p-23 * (fabs(scale * xr[j]) + fabs(xmax));
        for (int j = 0; j < r->C; ++j) {
            const double dj = scale * xr[j] != xmax ? 0x1p-23 * (fabs(scale * xr[j]) + fabs(xmax)) : 0.0;
            allowed[row * (size_t)r->C + (size_t)j] = 1e-6 + 1e-5 * pr[j] + pr[j] * (dj + mixed);
        }
    }
    cl_mem bin = tu_xbuffer(n * esz, tin), bout = tu_xbuffer(n * 4, NULL);
    const clattn_tensor in = clattn_tensor_bhsd(bin, r->dt, r->B, r->H, r->R, r->C);
    const clattn_tensor out = clattn_tensor_bhsd(bout, F32, r->B, r->H, r->R, r->C);
    clattn_softmax_desc d;
    memset(&d, 0, sizeof d);
    d.batch = r->B;
    d.heads = r->H;
    d.rows = r->R;
    d.cols = r->C;
    d.scale = r->scale;
    const clattn_status st = clattn_softmax(tu_ctx, &d, &in, &out, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("%s: %s", clattn_status_name(st), clattn_last_error(tu_ctx));
    float *img = tu_xalloc(n * 4);
    tu_read(tu_ctx, bout, n * 4, img);
    for (size_t i = 0; i < n; ++i)
        got[i] = img[i];
    size_t bad = 0, first = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double diff = fabs(got[i] - want[i]);
        if (!(diff <= allowed[i]) && bad++ == 0) /* NaN fails too */
            first = i;
        if (diff / allowed[i] > worst)
            worst = diff / allowed[i];
    }
    print_message("worst |diff| / allowed %.3g\n", worst);
    if (bad != 0)
        fail_msg("softmax: element %zu: got %.9g, want %.9g (allowed %.3g); %zu of %zu elements out of tolerance",
                 first, got[first], want[first], allowed[first], bad, n);
}

/* =============================== merge =============================== */

typedef struct merge_row {
    const char *name;
    int P, B, H, S, D; /* P parts of [B][H][S][D] f32, merged into f32 */
    gen out;           /* the parts' outputs */
    double lse_lo;     /* each part's lse: uniform in [lse_lo, lse_lo + lse_spread], rounded to float */
    double lse_spread;
} merge_row;

/* clang-format off */
static const merge_row merge_rows[] = {
    /* name                             P  B  H  S   D   out         lse_lo      spread */
    {"f32_parts_all_max",             2, 1, 2, 5,  16, G_ALL_MAX,  0.5,        0.0},
    {"f32_parts_all_lowest",          2, 1, 4, 16, 16, G_ALL_LOW,  0.5,        2.0},
    {"f32_parts_all_max_three",       3, 1, 2, 5,  16, G_ALL_MAX,  -1.0,       3.0},
    {"f32_parts_all_lowest_three",    3, 2, 1, 7,  16, G_ALL_LOW,  2.0,        1.0},
    {"f32_parts_top_eight",           8, 1, 2, 5,  32, G_TOP,      -1.0,       3.0},
    {"f32_parts_all_max_big_lse",     4, 1, 2, 3,  16, G_ALL_MAX,  3e38,       0.0},
    /* LSEs from 2^24 on, where lse + log 2 rounds back to lse: with equal or near parts, the
     * weights are still exp(lse_i - m) / Σ exp(lse_j - m) (fp32 LSEs at 2^25 lie 4 apart), up to
     * 4096 parts, the most clattn_merge takes */
    {"f32_parts_equal_big_lse_three", 3, 1, 2, 3,  16, G_NORMAL,   1e30,       0.0},
    {"f32_parts_equal_big_lse_four",  4, 2, 1, 3,  16, G_NORMAL,   3e38,       0.0},
    {"f32_parts_equal_big_lse_eight", 8, 1, 2, 5,  32, G_NORMAL,   1e30,       0.0},
    {"f32_parts_lse_2p24_three",      3, 1, 2, 5,  16, G_NORMAL,   16777216.0, 3.0},
    {"f32_parts_lse_2p25_eight",      8, 1, 2, 5,  32, G_NORMAL,   33554432.0, 16.0},
    {"f32_parts_equal_big_lse_1000",  1000, 1, 2, 3, 16, G_NORMAL, 1e30,       0.0},
    {"f32_parts_lse_2p25_4096",       4096, 1, 1, 2, 16, G_NORMAL, 33554432.0, 64.0},
};
/* clang-format on */

/* Parts whose outputs sit at ±FLT_MAX with finite LSEs: the merged output is a convex combination
 * of them, finite, exactly FLT_MAX in magnitude where the parts are equal. Normalised weights
 * rounded to fp32 may add up to 1 + a few ulps; the merge must not round past FLT_MAX. Tolerance
 * as test_decode.c's merge alone (atol and rtol 1e-6), atol scaled by M = max|part|. */
static void test_merge_edge(void **state)
{
    const merge_row *r = *state;
    tu_ctx_get();
    tu_failures = 0;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(r->name));
    const size_t nrow = (size_t)r->B * r->H * r->S, nout = nrow * (size_t)r->D;
    float *tout = tu_xalloc((size_t)r->P * nout * 4), *tlse = tu_xalloc((size_t)r->P * nrow * 4);
    double *xout = tu_xdoubles((size_t)r->P * nout), *xlse = tu_xdoubles((size_t)r->P * nrow);
    generate(&rng, r->out, F32, 0.0, r->D, tout, xout, (size_t)r->P * nout);
    for (size_t i = 0; i < (size_t)r->P * nrow; ++i)
        tu_put(F32, tlse, xlse, i, r->lse_lo + tu_uniform(&rng, 0.0, r->lse_spread));
    const double **po = tu_xalloc((size_t)r->P * sizeof *po), **pl = tu_xalloc((size_t)r->P * sizeof *pl);
    clattn_tensor *part_out = tu_xalloc((size_t)r->P * sizeof *part_out);
    clattn_tensor *part_lse = tu_xalloc((size_t)r->P * sizeof *part_lse);
    assert_true(r->P >= 1 && r->P <= 4096);
    cl_mem bo = tu_xbuffer((size_t)r->P * nout * 4, tout), bl = tu_xbuffer((size_t)r->P * nrow * 4, tlse);
    for (int p = 0; p < r->P; ++p) {
        po[p] = xout + (size_t)p * nout;
        pl[p] = xlse + (size_t)p * nrow;
        part_out[p] = clattn_tensor_bhsd(bo, F32, r->B, r->H, r->S, r->D);
        part_out[p].offset = (int64_t)((size_t)p * nout);
        part_lse[p] = clattn_tensor_bhsd(bl, F32, r->B, r->H, r->S, 1);
        part_lse[p].offset = (int64_t)((size_t)p * nrow);
    }
    double *want = tu_xdoubles(nout), *want_lse = tu_xdoubles(nrow);
    ref_merge(r->P, (int)nrow, r->D, po, pl, want, want_lse);
    double vmax = 0.0;
    for (size_t i = 0; i < (size_t)r->P * nout; ++i)
        vmax = fabs(xout[i]) > vmax ? fabs(xout[i]) : vmax;
    for (size_t i = 0; i < nout; ++i) /* within max|part|, but for float64 rounding */
        assert_true(isfinite(want[i]) && fabs(want[i]) <= vmax * (1.0 + 0x1p-40));

    cl_mem bm = tu_xbuffer(nout * 4, NULL), bml = tu_xbuffer(nrow * 4, NULL);
    const clattn_tensor out = clattn_tensor_bhsd(bm, F32, r->B, r->H, r->S, r->D);
    const clattn_tensor lse = clattn_tensor_bhsd(bml, F32, r->B, r->H, r->S, 1);
    const clattn_status st = clattn_merge(tu_ctx, r->P, part_out, part_lse, &out, &lse, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_merge: %s: %s", clattn_status_name(st), clattn_last_error(tu_ctx));
    float *img = tu_xalloc(nout * 4), *lse_img = tu_xalloc(nrow * 4);
    tu_read(tu_ctx, bm, nout * 4, img);
    tu_read(tu_ctx, bml, nrow * 4, lse_img);
    double *got = tu_xdoubles(nout), *got_lse = tu_xdoubles(nrow);
    for (size_t i = 0; i < nout; ++i)
        got[i] = img[i];
    for (size_t i = 0; i < nrow; ++i)
        got_lse[i] = lse_img[i];
    const double chain = 3.0 * 0x1p-24 * r->P; /* P - 1 chained merge_pair steps, 3 ulp each */
    tu_check_close("merged out", got, want, nout, (chain > 1e-6 ? chain : 1e-6) * vmax, 1e-6);
    tu_check_close("merged lse", got_lse, want_lse, nrow, 1e-6, 1e-6);
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* =============================== registration =============================== */

int main(void)
{
    tu_set_fixtures(NULL, tu_teardown);
    for (size_t i = 0; i < N_OF(att_rows); ++i)
        tu_add_test("attention", att_rows[i].name, test_attention_edge, &att_rows[i]);
    for (size_t i = 0; i < N_OF(sm_rows); ++i)
        tu_add_test("softmax", sm_rows[i].name, test_softmax_edge, &sm_rows[i]);
    for (size_t i = 0; i < N_OF(merge_rows); ++i)
        tu_add_test("merge", merge_rows[i].name, test_merge_edge, &merge_rows[i]);
    const int failed = tu_run_tests("robust");
    clattn_release(tu_ctx);
    return failed;
}
