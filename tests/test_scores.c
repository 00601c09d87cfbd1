/*
 * clattn_scores against ref_scores: scale·Q·Kᵀ + mask into [B][Hq][Sq][Skv], with keys hidden by
 * causal or kv_lengths (and -inf mask entries) exactly -inf.
 *
 * Table-driven, one cmocka test per row; inputs are fixed-seed uniform values stored in the row's
 * dtype, and the reference computes on exactly the stored values. Output buffers start as a
 * sentinel that must survive outside the output view; input buffers hold NaN outside their views.
 *
 * Tolerance: an fp32 dot product of D terms, in any order, is within γ_D = D·2^-24/(1 - D·2^-24)
 * of scale·Σ|q_d·k_d|, and the scale and the mask add one rounding each. So atol is
 * (D + 2)·2^-24 times the largest scale·Σ|q_d·k_d| of the problem and rtol 2^-23; an f16 or bf16
 * scores tensor adds half an ulp of its own (rtol 2^-11 or 2^-8, atol 2^-25 for f16 subnormals).
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

typedef enum mask_kind {
    MASK_NONE,
    MASK_FULL,          /* {B, Hq, Sq, Skv} */
    MASK_HEADS,         /* {B, 1, Sq, Skv} */
    MASK_SHARED,        /* {1, 1, Sq, Skv} */
    MASK_BATCH_ROWS,    /* {1, Hq, 1, Skv} */
    MASK_HEADS_STRIDE0  /* {B, Hq, Sq, Skv} with head stride 0 */
} mask_kind;

typedef struct sc_case {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D;
    clattn_dtype dt;     /* q and k */
    clattn_dtype out_dt; /* scores */
    int causal;
    mask_kind mask;
    clattn_dtype mask_dt;
    int has_kv;
    int kv[4];
    tu_layout layout;     /* q, k and the mask */
    tu_layout out_layout; /* scores */
    float scale;            /* 0: 1/sqrt(D) */
    int poison;             /* NaN/Inf in K at keys past the kv length: their scores stay -inf;
                             * 2: also at every fifth key (j % 5 == 2), which the mask hides from
                             * every row (a -inf mask hides the key even when its score is NaN) */
    const int *params;      /* clattn_set_params(SCORES) for this call; NULL: the defaults */
} sc_case;

/* In the accepted range ([0, 4096]) but far past what a kernel can hold: 128 x 64 register tiles
 * and a 4096-deep k step. The library clamps them (RM 16, NS 4, TK 64); unclamped, PoCL's compiler
 * ran for minutes. Tiled (DIRECT 0) and direct (DIRECT 1, with the Kᵀ copy). */
static const int huge_tiled[9] = {16, 16, 128, 64, 4096, 16, 1, 0, 0};
static const int huge_direct[9] = {1, 1, 128, 64, 4096, 16, 1, 1, 1};
/* DIRECT 1 without KT: K read in place (scores_in_place) at any seq_q, RM rows a work-item up to
 * 32 query rows (all of them, in 4 x 4 register tiles from 8 rows on), else RM 6 (row by row) or
 * 8 (tiles). */
static const int in_place_rm6[9] = {1, 1, 6, 4, 16, 16, 1, 0, 1};
static const int in_place_rm8[9] = {1, 1, 8, 4, 16, 16, 1, 0, 1};
/* The tiled kernel (gemm, DIRECT 0: the GPUs') in small 8 x 16 tiles, so that many tiles are
 * hidden from all their rows (causal, key lengths) and skip their dot products: head_dim staged
 * at once (KF 1), in 16-deep steps (KF 0), and over the Kᵀ copy (KT 1). */
static const int tiled_kf[9] = {4, 4, 2, 1, 16, 4, 1, 0, 0};
static const int tiled_k16[9] = {4, 4, 2, 1, 16, 4, 0, 0, 0};
static const int tiled_kt[9] = {4, 4, 2, 1, 16, 4, 0, 1, 0};

/* clang-format off */
static const sc_case cases[] = {
    /* shapes with tails */
    {"s1x1", 1, 1, 1, 1, 1, 64, F32, F32, .causal = 0},
    {"s7x13", 2, 2, 2, 7, 13, 64, F32, F32, .causal = 0},
    {"s65x129", 1, 2, 2, 65, 129, 64, F32, F32, .causal = 0},
    {"s113x203", 1, 2, 1, 113, 203, 64, F32, F32, .causal = 0},
    {"s256x300", 1, 1, 1, 256, 300, 64, F32, F32, .causal = 0},

    /* head dimensions */
    {"hd1", 2, 2, 2, 7, 13, 1, F32, F32, .causal = 0},
    {"hd3", 1, 2, 2, 65, 129, 3, F32, F32, .causal = 0},
    {"hd16", 1, 2, 2, 65, 129, 16, F32, F32, .causal = 0},
    {"hd59", 1, 2, 2, 113, 203, 59, F32, F32, .causal = 0},
    {"hd128", 1, 2, 2, 65, 129, 128, F32, F32, .causal = 0},
    {"hd256", 1, 2, 2, 33, 47, 256, F32, F32, .causal = 0},

    /* grouped-query attention */
    {"gqa_3to1", 2, 6, 2, 33, 47, 64, F32, F32, .causal = 0},
    {"mqa_8to1", 1, 8, 1, 65, 129, 32, F32, F32, .causal = 1},

    /* causal (bottom-right), including rows that see no key */
    {"causal_65x129", 1, 2, 2, 65, 129, 64, F32, F32, .causal = 1},
    {"causal_129x65", 1, 2, 2, 129, 65, 64, F32, F32, .causal = 1},
    {"causal_1x1", 1, 1, 1, 1, 1, 16, F32, F32, .causal = 1},

    /* masks */
    {"mask_full_f32", 2, 2, 2, 33, 47, 64, F32, F32, .mask = MASK_FULL, .mask_dt = F32},
    {"mask_full_f16", 2, 2, 2, 33, 47, 64, F32, F32, .mask = MASK_FULL, .mask_dt = F16},
    {"mask_heads", 2, 3, 3, 33, 47, 64, F32, F32, .mask = MASK_HEADS, .mask_dt = F32},
    {"mask_shared", 2, 3, 1, 33, 47, 64, F32, F32, .mask = MASK_SHARED, .mask_dt = F32},
    {"mask_batch_rows_f16", 2, 3, 3, 33, 47, 64, F32, F32, .mask = MASK_BATCH_ROWS, .mask_dt = F16},
    {"mask_heads_stride0", 2, 3, 3, 33, 47, 64, F32, F32, .mask = MASK_HEADS_STRIDE0, .mask_dt = F32},
    /* -inf mask columns over NaN/Inf keys, in whole 16-key groups and in tails (100 keys) */
    {"mask_poison_columns", 2, 2, 2, 33, 100, 64, F32, F32, .mask = MASK_HEADS, .mask_dt = F32, .poison = 2},
    {"mask_poison_columns_f16_kvlen", 2, 2, 1, 40, 100, 64, F16, F32, .mask = MASK_FULL, .mask_dt = F16,
     .has_kv = 1, .kv = {100, 61}, .poison = 2},

    /* kv lengths, alone and combined */
    {"kvlen", 3, 2, 2, 19, 129, 64, F32, F32, .has_kv = 1, .kv = {129, 40, 0}},
    {"kvlen_clamped", 2, 2, 2, 19, 129, 64, F32, F32, .has_kv = 1, .kv = {-3, 5000}},
    {"kvlen_causal", 3, 2, 2, 19, 129, 64, F32, F32, .causal = 1, .has_kv = 1, .kv = {129, 10, 77}},
    {"kvlen_poison", 2, 2, 2, 19, 129, 64, F32, F32, .has_kv = 1, .kv = {100, 7}, .poison = 1},
    {"kvlen_causal_poison_65x300", 2, 2, 2, 65, 300, 64, F32, F32, .causal = 1, .has_kv = 1,
     .kv = {300, 120}, .poison = 1},
    {"causal_mask_kvlen_gqa", 3, 4, 2, 45, 77, 40, F32, F32, .causal = 1, .mask = MASK_FULL, .mask_dt = F32,
     .has_kv = 1, .kv = {77, 50, 0}},

    /* storage types */
    {"in_f16", 2, 2, 2, 65, 129, 64, F16, F32, .causal = 0},
    {"in_bf16", 2, 2, 2, 65, 129, 64, BF16, F32, .causal = 0},
    {"out_f16", 2, 2, 2, 65, 129, 64, F32, F16, .causal = 0},
    {"out_bf16", 2, 2, 2, 65, 129, 64, F32, BF16, .causal = 0},
    {"f16_causal_mask_f16", 2, 2, 1, 65, 129, 64, F16, F16, .causal = 1, .mask = MASK_FULL, .mask_dt = F16},
    {"bf16_in_f16_out_kvlen", 2, 2, 2, 33, 47, 59, BF16, F16, .has_kv = 1, .kv = {20, 47}},
    {"f16_in_bf16_out_hd256", 1, 2, 2, 33, 47, 256, F16, BF16, .causal = 1},

    /* layouts */
    {"bshd", 2, 4, 2, 33, 47, 64, F32, F32, .layout = LAYOUT_BSHD},
    {"bshd_mask_causal_out_padded", 2, 4, 4, 33, 47, 64, F32, F32, .causal = 1, .mask = MASK_FULL,
     .mask_dt = F32, .layout = LAYOUT_BSHD, .out_layout = LAYOUT_PADDED},
    {"padded", 2, 2, 1, 33, 47, 59, F16, F32, .layout = LAYOUT_PADDED, .out_layout = LAYOUT_PADDED},

    /* scale */
    {"scale_explicit", 2, 2, 2, 33, 47, 64, F32, F32, .scale = 0.5f},
    {"scale_negative", 2, 2, 2, 33, 47, 64, F32, F32, .scale = -0.25f, .mask = MASK_FULL, .mask_dt = F32},

    /* K read in place on CPUs (up to 16 query rows by default; KT 0 at any count): keys in
     * several 256-key work-items, head_dim tails in f16 and bf16, rows in tiles or one by one,
     * NaN in keys past the key length */
    {"in_place_1x5000_gqa", 1, 3, 1, 1, 5000, 64, F32, F32, .causal = 0},
    {"in_place_16x300_hd59_f16_causal_kvlen", 2, 2, 2, 16, 300, 59, F16, F32, .causal = 1, .has_kv = 1,
     .kv = {300, 123}},
    {"in_place_12x97_hd111_bf16_mask_f16", 1, 2, 1, 12, 97, 111, BF16, F16, .mask = MASK_FULL,
     .mask_dt = F16},
    {"in_place_5x77_hd256_poison", 2, 2, 2, 5, 77, 256, F32, F32, .has_kv = 1, .kv = {50, 3}, .poison = 1},
    {"in_place_kt0_24x129_causal", 1, 2, 2, 24, 129, 64, F32, F32, .causal = 1, .params = in_place_rm6},
    {"in_place_kt0_45x203_hd40_mask_heads", 2, 2, 1, 45, 203, 40, F32, F32, .mask = MASK_HEADS,
     .mask_dt = F32, .params = in_place_rm6},
    {"in_place_kt0_70x90_bshd_kvlen_out_bf16", 2, 4, 2, 70, 90, 64, F32, BF16, .has_kv = 1, .kv = {90, 41},
     .layout = LAYOUT_BSHD, .params = in_place_rm8},

    /* the tiled kernel: hidden tiles next to visible ones, in every combination with masks,
     * key lengths (NaN/Inf in the keys they hide), f16 output and BSHD */
    {"tiled_kf_causal_65x129", 1, 2, 2, 65, 129, 64, F32, F32, .causal = 1, .params = tiled_kf},
    {"tiled_kf_causal_129x65_kvlen_mask_out_f16", 2, 2, 1, 129, 65, 64, F32, F16, .causal = 1,
     .has_kv = 1, .kv = {65, 30}, .mask = MASK_FULL, .mask_dt = F32, .params = tiled_kf},
    {"tiled_k16_causal_40x150_kvlen_poison", 2, 2, 2, 40, 150, 48, F32, F32, .causal = 1,
     .has_kv = 1, .kv = {150, 70}, .poison = 1, .params = tiled_k16},
    {"tiled_kt_causal_33x100_bshd_mask_f16", 2, 4, 2, 33, 100, 64, F16, F32, .causal = 1,
     .mask = MASK_HEADS, .mask_dt = F16, .layout = LAYOUT_BSHD, .params = tiled_kt},
    {"tiled_kt_kvlen_poison_out_bf16", 2, 2, 2, 19, 129, 64, F32, BF16, .has_kv = 1, .kv = {100, 7},
     .poison = 1, .params = tiled_kt},

    /* tuning values the kernels cannot take as they are */
    {"huge_params_tiled", 1, 2, 1, 33, 47, 64, F32, F32, .causal = 1, .params = huge_tiled},
    {"huge_params_direct", 1, 2, 1, 33, 47, 64, F32, F32, .causal = 1, .params = huge_direct},
};
/* clang-format on */

typedef struct result {
    double *out, *lse, *probs;
} result;

/* =============================== one row =============================== */

static void test_case(void **state)
{
    const sc_case *c = *state;
    tu_ctx_get();
    tu_failures = 0;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(c->name));

    const double scale = c->scale != 0.0f ? (double)c->scale : (double)(float)(1.0 / sqrt((double)c->D));
    /* Scores of standard deviation ~2 (q·k over [-qa, qa] x [-1, 1] has sd qa·sqrt(D)/3). */
    double qa = 6.0 / (fabs(scale) * sqrt((double)c->D));
    qa = qa > 6.0 ? 6.0 : qa;

    const size_t esz = clattn_dtype_size(c->dt);
    tu_view q, k, mask, out;
    memset(&mask, 0, sizeof mask);
    tu_view_init(&q, c->layout, c->dt, c->B, c->Hq, c->Sq, c->D, NAN);
    tu_view_init(&k, c->layout, c->dt, c->B, c->Hkv, c->Skv, c->D, NAN);
    void *tq = tu_xalloc(q.n * esz), *tk = tu_xalloc(k.n * esz);
    double *xq = tu_xdoubles(q.n), *xk = tu_xdoubles(k.n);
    tu_fill(&rng, c->dt, tq, xq, q.n, -qa, qa);
    tu_fill(&rng, c->dt, tk, xk, k.n, -1.0, 1.0);

    int kvl[4] = {0, 0, 0, 0};
    for (int b = 0; b < c->B; ++b)
        kvl[b] = c->kv[b];
    if (c->poison)
        for (int b = 0; b < c->B; ++b) {
            const int L = !c->has_kv ? c->Skv : kvl[b] < 0 ? 0 : (kvl[b] > c->Skv ? c->Skv : kvl[b]);
            for (int g = 0; g < c->Hkv; ++g)
                for (int j = 0; j < c->Skv; ++j)
                    for (int d = 0; d < c->D && (j >= L || (c->poison == 2 && j % 5 == 2)); ++d)
                        tu_put(c->dt, tk, xk, (((size_t)b * (size_t)c->Hkv + (size_t)g) * (size_t)c->Skv + (size_t)j) *
                                                   (size_t)c->D + (size_t)d,
                            d % 2 ? NAN : INFINITY);
        }

    int ms[4] = {c->B, c->Hq, c->Sq, c->Skv};
    double *xm = NULL;
    if (c->mask != MASK_NONE) {
        if (c->mask == MASK_HEADS || c->mask == MASK_HEADS_STRIDE0)
            ms[1] = 1;
        else if (c->mask == MASK_SHARED)
            ms[0] = ms[1] = 1;
        else if (c->mask == MASK_BATCH_ROWS)
            ms[0] = ms[2] = 1;
        tu_view_init(&mask, c->layout, c->mask_dt, ms[0], ms[1], ms[2], ms[3], NAN);
        void *tm = tu_xalloc(mask.n * mask.esz);
        xm = tu_xdoubles(mask.n);
        tu_fill(&rng, c->mask_dt, tm, xm, mask.n, -2.0, 2.0);
        for (size_t i = 0; i < mask.n; ++i)
            if (tu_uniform(&rng, 0.0, 1.0) < 0.1 || (c->poison == 2 && i % (size_t)c->Skv % 5 == 2))
                tu_put(c->mask_dt, tm, xm, i, -INFINITY);
        tu_scatter(&mask, tm);
        if (c->mask == MASK_HEADS_STRIDE0) {
            mask.t.shape[1] = c->Hq;
            mask.t.stride[1] = 0;
        }
        tu_upload(&mask);
    }
    tu_scatter(&q, tq);
    tu_scatter(&k, tk);
    tu_upload(&q);
    tu_upload(&k);
    cl_mem kv_buf = c->has_kv ? tu_xbuffer(sizeof(int) * (size_t)c->B, kvl) : NULL;

    tu_view_init(&out, c->out_layout, c->out_dt, c->B, c->Hq, c->Sq, c->Skv, 777.0);
    tu_upload(&out);

    clattn_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = c->B;
    desc.heads_q = c->Hq;
    desc.heads_kv = c->Hkv;
    desc.seq_q = c->Sq;
    desc.seq_kv = c->Skv;
    desc.head_dim = c->D;
    desc.scale = c->scale;
    desc.causal = c->causal;
    desc.mask = c->mask != MASK_NONE ? &mask.t : NULL;
    desc.kv_lengths = kv_buf;
    cl_event done = NULL;
    if (c->params && clattn_set_params(tu_ctx, CLATTN_OPERATION_SCORES, c->params, 9) != CLATTN_SUCCESS)
        fail_msg("clattn_set_params: %s", clattn_last_error(tu_ctx));
    const clattn_status st = clattn_scores(tu_ctx, &desc, &q.t, &k.t, &out.t, 0, NULL, &done);
    if (c->params)
        clattn_set_params(tu_ctx, CLATTN_OPERATION_SCORES, NULL, 0);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_scores returned %s: %s", clattn_status_string(st), clattn_last_error(tu_ctx));
    assert_non_null(done);
    clReleaseEvent(done);
    tu_finish(tu_ctx);

    const size_t n = out.n;
    double *got = tu_xdoubles(n), *want = tu_xdoubles(n), *bound = tu_xdoubles(n);
    tu_download("scores", &out, got);

    ref_attn a;
    memset(&a, 0, sizeof a);
    a.batch = c->B;
    a.heads_q = c->Hq;
    a.heads_kv = c->Hkv;
    a.seq_q = c->Sq;
    a.seq_kv = c->Skv;
    a.head_dim = c->D;
    a.scale = scale;
    a.causal = c->causal;
    a.mask = xm;
    memcpy(a.mask_shape, ms, sizeof ms);
    a.kv_len = c->has_kv ? kvl : NULL;
    ref_scores(&a, xq, xk, want);

    /* scale·Σ|q_d·k_d| for every entry: the same product on |q| and |k|, nothing hidden. */
    for (size_t i = 0; i < q.n; ++i)
        xq[i] = fabs(xq[i]);
    for (size_t i = 0; i < k.n; ++i)
        xk[i] = isfinite(xk[i]) ? fabs(xk[i]) : 0.0; /* poisoned keys are -inf anyway */
    ref_attn ab = a;
    ab.scale = fabs(scale);
    ab.causal = 0;
    ab.mask = NULL;
    ab.kv_len = NULL;
    ref_scores(&ab, xq, xk, bound);
    double big = 0.0;
    for (size_t i = 0; i < n; ++i)
        big = bound[i] > big ? bound[i] : big;

    double atol = (c->D + 2) * 0x1p-24 * big, rtol = 0x1p-23;
    if (c->out_dt == F16) {
        atol += 0x1p-25;
        rtol += 0x1p-11;
    } else if (c->out_dt == BF16) {
        rtol += 0x1p-8;
    }
    tu_check_close("scores vs reference", got, want, n, atol, rtol);

    /* The reference must actually hide something where the row asks it to (a row that hides
     * nothing would pass an implementation that ignores causal or kv_lengths); causal 1x1 is the
     * one row that legitimately hides nothing. */
    if ((c->causal && c->Skv > 1) || c->has_kv || c->mask != MASK_NONE) {
        size_t hidden = 0;
        for (size_t i = 0; i < n; ++i)
            hidden += want[i] == -INFINITY;
        assert_true(hidden > 0);
    }
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* x rounded to nearest, ties to even, in a binary format of `prec` significant bits, smallest
 * normal exponent emin (x = m·2^e, 1 <= m < 2) and largest finite value max: the IEEE rule,
 * computed in double (which holds every f32 exactly) independently of the library's kernels. */
static double round_rne(double x, int prec, int emin, double max)
{
    if (isnan(x) || isinf(x) || x == 0.0)
        return x;
    int e;
    (void)frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    const int ulp_exp = (e - 1 < emin ? emin : e - 1) - (prec - 1);
    const double y = ldexp(nearbyint(ldexp(x, -ulp_exp)), ulp_exp); /* the default mode: even */
    return fabs(y) > max ? copysign(INFINITY, x) : y;
}

/* f16 and bf16 scores are rounded to nearest even exactly, in the kernels' 16-key chunks and in
 * their tails: f32 inputs, head_dim 1 and scale 1 make each score q·k exact in f32, and the keys
 * hold ties, values just either side of ties, the overflow threshold (a tie at max + half an ulp
 * goes to infinity: max's last bit is odd), f16 subnormals, infinities and NaN. Rows q = 1 and
 * q = -1 give both signs. Run with the defaults (on CPUs scores_direct over the Kᵀ copy), K read
 * in place (scores_in_place) and the GPUs' tiled kernel. */
static void test_rounding(void **state)
{
    const clattn_dtype out_dt = *(const clattn_dtype *)state[0];
    tu_ctx_get();
    tu_failures = 0;
    const double bmax = ldexp(2.0 - 0x1p-7, 127); /* largest finite bf16 */
    const double special[] = {
        1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, 1.0 + 0x1p-8 + 0x1p-20, 1.0 + 0x1p-8 - 0x1p-20,
        1.0 + 0x1p-11, 1.0 + 3 * 0x1p-11, 1.0 + 0x1p-11 + 0x1p-20, 1.0 + 0x1p-11 - 0x1p-20,
        65504.0 + 16.0, 65504.0 + 16.0 - 0x1p-8, 65504.0 + 32.0, 0x1p-25, 3 * 0x1p-25, 3 * 0x1p-26,
        0x1p-25 + 0x1p-32, bmax + 0x1p119, bmax + 0x1p119 - 0x1p104, (double)FLT_MAX, 3.0, 0.0,
        INFINITY, NAN, 0.1f, 1e-3f, 12345.678f, 0x1p-14 + 0x1p-25, 0x1p-14 - 0x1p-25, 2.5 * 0x1p-24};
    enum { SQ = 2, SKV = 40 }; /* two chunks of 16 keys and a tail of 8 */
    const size_t ns = sizeof special / sizeof special[0];
    tu_view q, k, out;
    tu_view_init(&q, LAYOUT_BHSD, F32, 1, 1, SQ, 1, NAN);
    tu_view_init(&k, LAYOUT_BHSD, F32, 1, 1, SKV, 1, NAN);
    float tq[SQ] = {1.0f, -1.0f}, tk[SKV];
    double kd[SKV];
    for (int j = 0; j < SKV; ++j) {
        /* The specials in the first chunk, again from key 13 (across the chunk boundary and into
         * the tail). */
        kd[j] = j < (int)ns ? special[j] : special[(j - 13 + (int)ns) % (int)ns];
        tk[j] = (float)kd[j];
        assert_true(isnan(kd[j]) || (double)tk[j] == kd[j]); /* exact in f32 */
    }
    /* NaNs whose payload fills the mantissa: rounded as numbers, they would carry into the
     * exponent and the sign (0x7fffffff + 0x7fff: -0 in bf16). */
    const uint32_t nan_bits[2] = {0x7fffffffu, 0xffffffffu};
    for (int i = 0; i < 2; ++i) {
        memcpy(&tk[SKV - 1 - 9 * i], &nan_bits[i], sizeof(float));
        kd[SKV - 1 - 9 * i] = NAN;
    }
    tu_scatter(&q, tq);
    tu_scatter(&k, tk);
    tu_upload(&q);
    tu_upload(&k);
    const int prec = out_dt == F16 ? 11 : 8, emin = out_dt == F16 ? -14 : -126;
    const double max = out_dt == F16 ? 65504.0 : bmax;
    double want[SQ * SKV];
    for (int i = 0; i < SQ; ++i)
        for (int j = 0; j < SKV; ++j)
            want[i * SKV + j] = round_rne((double)tq[i] * kd[j], prec, emin, max);

    const int *variants[] = {NULL, in_place_rm6, tiled_kf};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; ++v) {
        tu_view_init(&out, LAYOUT_PADDED, out_dt, 1, 1, SQ, SKV, 777.0);
        tu_upload(&out);
        clattn_attention_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.batch = desc.heads_q = desc.heads_kv = 1;
        desc.seq_q = SQ;
        desc.seq_kv = SKV;
        desc.head_dim = 1;
        desc.scale = 1.0f;
        if (variants[v] && clattn_set_params(tu_ctx, CLATTN_OPERATION_SCORES, variants[v], 9) != CLATTN_SUCCESS)
            fail_msg("clattn_set_params: %s", clattn_last_error(tu_ctx));
        const clattn_status st = clattn_scores(tu_ctx, &desc, &q.t, &k.t, &out.t, 0, NULL, NULL);
        clattn_set_params(tu_ctx, CLATTN_OPERATION_SCORES, NULL, 0);
        if (st != CLATTN_SUCCESS)
            fail_msg("clattn_scores returned %s: %s", clattn_status_string(st), clattn_last_error(tu_ctx));
        tu_finish(tu_ctx);
        double got[SQ * SKV];
        tu_download("scores", &out, got);
        int bad = 0;
        for (int i = 0; i < SQ * SKV; ++i)
            if (!(got[i] == want[i] || (isnan(got[i]) && isnan(want[i])))) {
                if (bad++ < 8)
                    fprintf(stderr, "  variant %zu, row %d key %d: q·k %.17g rounded to %.17g, want %.17g\n",
                            v, i / SKV, i % SKV, (double)tq[i / SKV] * kd[i % SKV], got[i], want[i]);
                tu_failures++;
            }
    }
    if (tu_failures != 0)
        fail_msg("%d score(s) not rounded to nearest even", tu_failures);
}

static const clattn_dtype rounding_f16 = F16, rounding_bf16 = BF16;

/* The unfused path's P·V over a long key range with every weight alike: q = 0 makes every logit
 * 0 and every probability 1/N, V is one row (seq stride 0) of a value that is not a short binary
 * fraction, so the exact output is that row and every product is the same. Summed in one
 * accumulator those products round at the total's scale, all one way: 1.5e-2 relative over 2^20
 * keys. Held to numerics.md's f32 tolerance for that length (rtol 1e-4·sqrt(N / 4096)), with
 * pv_direct (the CPUs' default) and the tiled GEMM (the GPUs', small tiles here); the fused
 * results too, on the device's default kernels (on CPUs fused_direct for 3 rows, fused_lanes for
 * 16 query heads of one kv head). */
static void test_pv_uniform_long(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    tu_failures = 0;
    enum { ROWS = 16, D = 16 }; /* query rows (heads_q x seq_q) of the largest run */
    const int64_t N = (INT64_C(1) << 20) + 3;
    float q[ROWS * D] = {0}, k[D], v[D];
    tu_rng rng;
    tu_seed(&rng, tu_seed_of("pv_uniform_long"));
    for (int d = 0; d < D; d++) {
        k[d] = (float)tu_uniform(&rng, -1, 1);
        v[d] = (float)tu_uniform(&rng, 0.5, 1); /* same sign: no cancellation to hide the drift */
    }
    cl_mem bq = tu_xbuffer(sizeof q, q), bk = tu_xbuffer(sizeof k, k), bv = tu_xbuffer(sizeof v, v);
    cl_mem bo = tu_xbuffer(ROWS * D * 4, NULL);
    clattn_tensor tk = clattn_tensor_bhsd(bk, CLATTN_F32, 1, 1, N, D);
    clattn_tensor tv = clattn_tensor_bhsd(bv, CLATTN_F32, 1, 1, N, D);
    tk.stride[0] = tk.stride[1] = tk.stride[2] = 0;
    tv.stride[0] = tv.stride[1] = tv.stride[2] = 0;
    double want[ROWS * D];
    for (int i = 0; i < ROWS * D; i++)
        want[i] = v[i % D];
    const double rtol = 1e-4 * sqrt((double)N / 4096.0);
    static const int pv_tiled[9] = {4, 4, 2, 1, 16, 4, 0, 0, 0};
    const struct {
        const char *name;
        clattn_algorithm algo;
        const int *pv;
        int hq, sq;
    } runs[] = {{"unfused, default P·V", CLATTN_ALGORITHM_UNFUSED, NULL, 1, 3},
                {"unfused, tiled P·V", CLATTN_ALGORITHM_UNFUSED, pv_tiled, 1, 3},
                {"fused, 3 rows", CLATTN_ALGORITHM_FUSED, NULL, 1, 3},
                {"fused, 16 query heads of 1 kv head", CLATTN_ALGORITHM_FUSED, NULL, 16, 1}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        const int hq = runs[r].hq, sq = runs[r].sq, n = hq * sq * D;
        clattn_tensor tq = clattn_tensor_bhsd(bq, CLATTN_F32, 1, hq, sq, D);
        clattn_tensor to = clattn_tensor_bhsd(bo, CLATTN_F32, 1, hq, sq, D);
        clattn_attention_desc desc = {.batch = 1, .heads_q = hq, .heads_kv = 1, .seq_q = sq, .seq_kv = N,
                                      .head_dim = D, .algorithm = runs[r].algo};
        if (runs[r].pv && clattn_set_params(ctx, CLATTN_OPERATION_PV, runs[r].pv, 9) != CLATTN_SUCCESS)
            fail_msg("clattn_set_params: %s", clattn_last_error(ctx));
        const clattn_status st = clattn_attention(ctx, &desc, &tq, &tk, &tv, &to, 0, NULL, NULL);
        clattn_set_params(ctx, CLATTN_OPERATION_PV, NULL, 0);
        if (st != CLATTN_SUCCESS)
            fail_msg("%s: %s: %s", runs[r].name, clattn_status_string(st), clattn_last_error(ctx));
        float out[ROWS * D];
        tu_read(ctx, bo, (size_t)n * sizeof(float), out);
        double got[ROWS * D], worst = 0;
        for (int i = 0; i < n; i++) {
            got[i] = out[i];
            worst = fmax(worst, fabs(got[i] - want[i]) / want[i]);
        }
        print_message("%s over %lld keys: largest relative error %.3g (allowed %.3g)\n", runs[r].name,
                      (long long)N, worst, rtol);
        tu_check_close(runs[r].name, got, want, (size_t)n, 0.0, rtol);
    }
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

int main(void)
{
    enum { MAX_TESTS = 128 };
    static struct CMUnitTest tests[MAX_TESTS];
    size_t n = 0;
    for (size_t i = 0; i < N_OF(cases); ++i) {
        if (n == MAX_TESTS) {
            fprintf(stderr, "test_scores: more than %d tests, raise MAX_TESTS\n", MAX_TESTS);
            return 1;
        }
        for (size_t j = 0; j < i; ++j)
            if (strcmp(cases[i].name, cases[j].name) == 0) {
                fprintf(stderr, "test_scores: duplicate case name %s\n", cases[i].name);
                return 1;
            }
        tests[n++] = (struct CMUnitTest){cases[i].name, test_case, NULL, tu_teardown, (void *)&cases[i]};
    }
    tests[n++] = (struct CMUnitTest){"rounding_f16", test_rounding, NULL, tu_teardown, (void *)&rounding_f16};
    tests[n++] = (struct CMUnitTest){"rounding_bf16", test_rounding, NULL, tu_teardown, (void *)&rounding_bf16};
    tests[n++] = (struct CMUnitTest){"pv_uniform_long", test_pv_uniform_long, NULL, tu_teardown, NULL};
    n = tu_filter_tests("scores", tests, n);
    const int failed = _cmocka_run_group_tests("scores", tests, n, NULL, NULL);
    clattn_release(tu_ctx);
    return failed;
}
