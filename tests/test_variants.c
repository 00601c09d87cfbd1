/*
 * Attention variants (issue 71): sliding windows, chunked attention, logit softcap, attention
 * sinks, ALiBi slopes, MLA head sizes (576/512, V a view of K) and user score_mod / mask_mod
 * snippets, each against the float64 reference (ref/clattn_ref.c) on exactly the stored inputs.
 *
 * One row of `cases` is one problem. It runs fused (whatever kernel the process is set to: the
 * CPU's fused_direct / fused_lanes by default, a GPU kernel forced by the registrations in
 * tests/CMakeLists.txt), unfused with f32 probabilities, and where asked clattn_scores, and fused
 * and unfused are compared with each other. A row may name a twin (same_as): another row's
 * descriptor, run on this row's inputs, must give the same result, bit for bit (a window wider
 * than the keys and causal; sinks all -inf and none) or within a few ulp (a user snippet and the
 * built-in it reproduces). Rows with poison put NaN and ±Inf in K and V at every key that no row
 * of its batch sees, so a kernel that lets a hidden key touch a result shows NaN. Rows with no
 * visible key must give exactly 0 and an LSE of -inf, or the head's sink. Hidden probabilities
 * must be -0.0, hidden scores -inf.
 *
 * Beside the table: sinks over 1, 2 and many key splits (DECODE's SPLITS, set per context),
 * merging two key ranges with the sinks given to one of them, clattn_alibi_slopes against the
 * formula, refusals (INVALID_ARGUMENT, or BUILD_FAILED for a snippet that does not compile, with
 * the caller's outputs untouched), and self-checks of the reference's variant rules.
 *
 * CLATTN_TEST_VARIANTS_FORCED=1 (the runs with a GPU kernel forced): the fused calls only, on the
 * rows marked gpu (a cold PoCL build costs 2 to 8 seconds a program, and every kernel, dtype and
 * set of variants is a program of its own), and no refusal, snippet-failure or reference rows,
 * which the plain run covers; CLATTN_TEST_DECODE_ONLY=1: rows with seq_q <= 16 only (the decode
 * kernels).
 *
 * Tolerances, as in test_attention.c: f32 out atol 2e-5, rtol 1e-4; f16 storage atol + 2^-10,
 * rtol 2^-11; bf16 atol + 2^-7, rtol 2^-8; lse atol 1e-5, rtol 4e-6; probabilities atol 1e-7,
 * rtol 2e-5 (relative ones grow by sqrt(seq_kv / 4096) past 4096 keys). Every logit carries an
 * absolute error e: half an ulp of the row's largest logits (|lse|) twice, plus 8 ulp of the cap
 * for a softcap (c·tanh(x / c) in fp32: tanh's few ulp times c, c capped at 64, above which the
 * cap is relatively accurate and these logits stay below 64) and 4 half-ulps of |lse| + 30 for
 * ALiBi (the product slope·|p - j| and the add); lse gets e, out 2e, probabilities 2e relative.
 * The matrix path (clattn_matrix_report not "none") adds its bound: half an ulp of the 16-bit
 * input type times the largest |V|. Twins: bitwise where the built-in and the variant hide the
 * same keys; a mask_mod against its built-in within 4 fp32 ulp (rtol 2^-21, atol 2^-22), one
 * storage ulp for 16-bit outputs; score_mod's softcap against the built-in softcap also within
 * the logit error of two fp32 tanh (atol 2·8 ulp of 30); 1e-5 more, and no bitwise checks, where
 * the device keeps floats wider than float (tu_device_rounds_floats).
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

enum { ALG_FUSED = 1, ALG_UNFUSED = 2, ALG_SCORES = 4 };
enum { MAX_B = 4 };

/* =============================== user snippets =============================== */

typedef enum mod_kind {
    MOD_NONE,
    MOD_CAUSAL,    /* mask_mod k <= q: causal */
    MOD_WINDOW,    /* mask_mod q - 5 <= k <= q + 2: window_left 5, window_right 2 */
    MOD_SOFTCAP30, /* score_mod 30·tanh(score / 30): softcap 30 */
    MOD_HIDE_ALL,  /* mask_mod 0: no key anywhere */
    MOD_MIX,       /* both, using b, h, q and k, so that a swapped or misplaced argument shows */
    MOD_COUNT
} mod_kind;

static double ref_score_softcap30(double s, int b, int h, long long q, int k, void *u)
{
    (void)b, (void)h, (void)q, (void)k, (void)u;
    return 30.0 * tanh(s / 30.0);
}

static double ref_score_mix(double s, int b, int h, long long q, int k, void *u)
{
    (void)u;
    return s + 0.25 * (double)((h + 2 * b) % 3) - 0.01 * (double)(q - k);
}

static int ref_mask_causal(int b, int h, long long q, int k, void *u)
{
    (void)b, (void)h, (void)u;
    return k <= q;
}

static int ref_mask_window(int b, int h, long long q, int k, void *u)
{
    (void)b, (void)h, (void)u;
    return k >= q - 5 && k <= q + 2;
}

static int ref_mask_none(int b, int h, long long q, int k, void *u)
{
    (void)b, (void)h, (void)q, (void)k, (void)u;
    return 0;
}

static int ref_mask_mix(int b, int h, long long q, int k, void *u)
{
    (void)u;
    return (k + h) % 4 != 3 && k <= q + b;
}

typedef struct mod_def {
    const char *score_src, *mask_src; /* OpenCL C given to the library */
    ref_score_mod score;              /* the same in the reference */
    ref_mask_mod mask;
} mod_def;

static const mod_def mods[MOD_COUNT] = {
    [MOD_NONE] = {NULL, NULL, NULL, NULL},
    [MOD_CAUSAL] = {NULL, "int mask_mod(int b, int h, int q, int k) { return k <= q; }\n", NULL, ref_mask_causal},
    [MOD_WINDOW] = {NULL, "int mask_mod(int b, int h, int q, int k) { return k >= q - 5 && k <= q + 2; }\n", NULL,
                    ref_mask_window},
    [MOD_SOFTCAP30] = {"float score_mod(float score, int b, int h, int q, int k) "
                       "{ return 30.0f * tanh(score / 30.0f); }\n",
                       NULL, ref_score_softcap30, NULL},
    [MOD_HIDE_ALL] = {NULL, "int mask_mod(int b, int h, int q, int k) { return 0; }\n", NULL, ref_mask_none},
    [MOD_MIX] = {"float score_mod(float score, int b, int h, int q, int k)\n"
                 "{\n"
                 "    return score + 0.25f * (float)((h + 2 * b) % 3) - 0.01f * (float)(q - k);\n"
                 "}\n",
                 "int mask_mod(int b, int h, int q, int k) { return (k + h) % 4 != 3 && k <= q + b; }\n",
                 ref_score_mix, ref_mask_mix},
};

/* =============================== the case table =============================== */

typedef enum mask_kind {
    MASK_NONE,
    MASK_HOLES, /* f32 {B, 1, Sq, Skv}: uniform [-2, 2], ~10% -inf, and every key j % 5 == 2 -inf in
                 * every row (hidden from all: poisoned with .poison) */
    MASK_BIAS16 /* f16 {1, Hq, Sq, Skv}: uniform [-2, 2], no -inf (a bias) */
} mask_kind;

typedef enum sink_kind {
    SINK_NONE,
    SINK_VALUES, /* uniform [-1, 4] a head, head 1 -inf (no sink for that head) */
    SINK_FAR,    /* 60 + h: far above every logit (out ~ e^-50, lse ~ the sink) */
    SINK_NEGINF, /* every head -inf: exactly no sink */
    SINK_BAD     /* head 0 +inf, head 1 NaN (no logits: their rows with a visible key NaN, empty rows 0
                  * and the sink), head 2 -inf, the others as SINK_VALUES */
} sink_kind;

typedef enum alibi_kind {
    ALIBI_NONE,
    ALIBI_HEADS, /* clattn_alibi_slopes(Hq, 8), f32 [1][Hq][1][1] */
    ALIBI_BATCH  /* those times (b + 1), f32 [B][Hq][1][1] */
} alibi_kind;

typedef enum same_kind {
    SAME_BITS,   /* bit for bit */
    SAME_ULPS,   /* a few fp32 ulp, one storage ulp */
    SAME_SOFTCAP /* and the error of two fp32 tanh of logits up to 30 */
} same_kind;

typedef struct var_case {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D, Dv; /* Dv 0: D */
    clattn_dtype dt;
    int causal;
    mask_kind mask;
    int has_kv;
    int kv[MAX_B];
    float scale;     /* 0: 1/sqrt(D) */
    double sd;       /* standard deviation of the scaled logits q·k·scale; 0: 2 */
    int window;      /* window_left = wl, window_right = wr (negative: unbounded) */
    int wl, wr;
    int chunk;
    float softcap;
    sink_kind sinks;
    alibi_kind alibi;
    mod_kind mod;
    int mla;         /* V is the first Dv columns of K: the same buffer, K's strides */
    int poison;      /* NaN / ±Inf in K and V at keys hidden from every row of their batch */
    unsigned algos;  /* 0: ALG_FUSED | ALG_UNFUSED */
    const char *same_as; /* a row whose descriptor gives the same result on these inputs */
    same_kind same;
    int gpu;         /* also in the runs that force a GPU kernel (each program costs seconds) */
} var_case;

#define MLA_SCALE 0.0721687836f /* 1/sqrt(192), DeepSeek's (MLA's head_dim 576 is not what scales) */

/* clang-format off */
static const var_case cases[] = {
    /* plain rows that twins compare with (they run against the reference themselves too) */
    {"causal_33x47_holes_kvlen", 2, 4, 2, 33, 47, 64, 0, F32, .causal = 1, .mask = MASK_HOLES, .has_kv = 1,
     .kv = {47, 30}, .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"causal_decode_gqa4_3x1500_f16", 2, 8, 2, 3, 1500, 64, 0, F16, .causal = 1, .has_kv = 1, .kv = {1500, 777}},

    /* ---- windows ---- */
    /* W = 1: each row sees its own position alone */
    {"win1_self_gqa2_40x64_f16_kvlen", 2, 4, 2, 40, 64, 64, 0, F16, .window = 1, .wl = 0, .wr = 0, .has_kv = 1,
     .kv = {64, 50}, .poison = 1, .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES, .gpu = 1},
    {"win1_self_decode_gqa4_4x2000_kvlen", 2, 8, 2, 4, 2000, 64, 0, F32, .window = 1, .wl = 0, .wr = 0,
     .has_kv = 1, .kv = {2000, 1234}, .poison = 1},
    /* W >= Skv with right 0 is causal: bit for bit */
    {"win_ge_skv_is_causal_33x47", 2, 4, 2, 33, 47, 64, 0, F32, .window = 1, .wl = 47, .wr = 0,
     .mask = MASK_HOLES, .has_kv = 1, .kv = {47, 30}, .same_as = "causal_33x47_holes_kvlen", .same = SAME_BITS,
     .gpu = 1},
    {"win_ge_skv_is_causal_decode_3x1500_f16", 2, 8, 2, 3, 1500, 64, 0, F16, .window = 1, .wl = 5000, .wr = 0,
     .has_kv = 1, .kv = {1500, 777}, .same_as = "causal_decode_gqa4_3x1500_f16", .same = SAME_BITS, .gpu = 1},
    /* seq_q > seq_kv: positions p = i - 24 < 0 see no key (left 3, right 0); with right 2 the rows
     * p = -1, -2 see the first keys */
    {"win_rows_before_keys_40x16", 1, 2, 1, 40, 16, 32, 0, F32, .window = 1, .wl = 3, .wr = 0,
     .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"win_rows_before_keys_right2_40x16_bf16", 1, 2, 1, 40, 16, 32, 0, BF16, .window = 1, .wl = 3, .wr = 2},
    /* both sides bounded, a bias mask, key lengths, hidden keys poisoned */
    {"win_l20_r7_bf16_bias_kvlen", 2, 4, 1, 50, 200, 64, 0, BF16, .window = 1, .wl = 20, .wr = 7,
     .mask = MASK_BIAS16, .has_kv = 1, .kv = {200, 120}, .poison = 1},
    {"win_l5_r2_33x47_holes_kvlen", 2, 4, 2, 33, 47, 64, 0, F32, .window = 1, .wl = 5, .wr = 2,
     .mask = MASK_HOLES, .has_kv = 1, .kv = {47, 30}},
    /* one side unbounded */
    {"win_left_unbounded_r3_20x60", 1, 2, 2, 20, 60, 64, 0, F32, .window = 1, .wl = -1, .wr = 3},
    {"win_right_unbounded_l100_decode_gqa4_4x1500_f16", 1, 8, 2, 4, 1500, 64, 0, F16, .window = 1, .wl = 100,
     .wr = -1, .poison = 1},
    {"win_causal_l16_r5_30x90", 1, 2, 1, 30, 90, 64, 0, F32, .causal = 1, .window = 1, .wl = 16, .wr = 5,
     .poison = 1},

    /* ---- chunks ---- */
    {"chunk8_causal_gqa2_24x40_kvlen", 2, 4, 2, 24, 40, 64, 0, F32, .causal = 1, .chunk = 8, .has_kv = 1,
     .kv = {40, 29}, .poison = 1, .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"chunk256_decode_gqa4_4x1000_kvlen_f16", 2, 8, 2, 4, 1000, 64, 0, F16, .chunk = 256, .has_kv = 1,
     .kv = {1000, 500}, .poison = 1},
    {"chunk4_rows_before_keys_20x10", 1, 2, 2, 20, 10, 32, 0, F32, .chunk = 4}, /* p < 0: no key */
    {"chunk32_window_l10_r10_40x100", 1, 2, 1, 40, 100, 64, 0, F32, .chunk = 32, .window = 1, .wl = 10, .wr = 10},

    /* ---- softcap ---- */
    /* a cap of 1 squeezes every logit into (-1, 1): a -inf mask entry must still hide its key */
    {"softcap1_holes_33x70", 2, 4, 2, 33, 70, 64, 0, F32, .softcap = 1.0f, .mask = MASK_HOLES, .poison = 1,
     .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"softcap1_holes_decode_2x300", 2, 4, 2, 2, 300, 64, 0, F32, .softcap = 1.0f, .mask = MASK_HOLES, .poison = 1},
    {"softcap30_decode_gqa4_1x2000_f16", 1, 8, 2, 1, 2000, 64, 0, F16, .softcap = 30.0f, .sd = 20},
    {"softcap50_causal_kvlen_64x128_bf16", 2, 2, 2, 64, 128, 64, 0, BF16, .softcap = 50.0f, .sd = 30,
     .causal = 1, .has_kv = 1, .kv = {128, 70}},
    {"softcap30_33x47", 2, 4, 2, 33, 47, 64, 0, F32, .softcap = 30.0f, .sd = 20},
    /* caps far above the logits: c·tanh(x / c) -> x, to a few ulp of x (not of c: from 1e10 the
     * exponential form alone returned 0 for every logit) */
    {"softcap1e8_33x47", 2, 4, 2, 33, 47, 64, 0, F32, .softcap = 1e8f, .sd = 8,
     .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"softcap1e30_decode_gqa4_2x300", 2, 8, 2, 2, 300, 64, 0, F32, .softcap = 1e30f, .sd = 8},
    {"softcap1000_causal_40x64_f16", 1, 4, 2, 40, 64, 64, 0, F16, .softcap = 1000.0f, .sd = 20, .causal = 1},

    /* ---- sinks ---- */
    {"sinks_neginf_is_none_33x47", 2, 4, 2, 33, 47, 64, 0, F32, .causal = 1, .mask = MASK_HOLES, .has_kv = 1,
     .kv = {47, 30}, .sinks = SINK_NEGINF, .same_as = "causal_33x47_holes_kvlen", .same = SAME_BITS},
    {"sinks_neginf_is_none_decode_3x1500_f16", 2, 8, 2, 3, 1500, 64, 0, F16, .causal = 1, .has_kv = 1,
     .kv = {1500, 777}, .sinks = SINK_NEGINF, .same_as = "causal_decode_gqa4_3x1500_f16", .same = SAME_BITS},
    {"sinks_far_decode_gqa2_2x500", 1, 4, 2, 2, 500, 64, 0, F32, .sinks = SINK_FAR},
    {"sinks_far_prefill_20x50", 1, 2, 2, 20, 50, 64, 0, F32, .causal = 1, .sinks = SINK_FAR},
    /* batch 1 has no key: its rows give 0 and the sink */
    {"sinks_causal_bias_kvlen0_gqa2_40x100", 2, 4, 2, 40, 100, 64, 0, F32, .causal = 1, .mask = MASK_BIAS16,
     .has_kv = 1, .kv = {100, 0}, .sinks = SINK_VALUES, .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"sinks_decode_causal_kvlen0_4x2000_f16", 3, 8, 2, 4, 2000, 64, 0, F16, .causal = 1, .has_kv = 1,
     .kv = {2000, 0, 3}, .sinks = SINK_VALUES},
    /* +inf and NaN sinks: NaN rows but for those with no visible key (batch 1's) */
    {"sinks_bad_causal_kvlen0_gqa2_40x100", 2, 4, 2, 40, 100, 64, 0, F32, .causal = 1, .has_kv = 1,
     .kv = {100, 0}, .sinks = SINK_BAD, .gpu = 1},
    {"sinks_bad_decode_causal_kvlen0_4x2000_f16", 3, 8, 2, 4, 2000, 64, 0, F16, .causal = 1, .has_kv = 1,
     .kv = {2000, 0, 3}, .sinks = SINK_BAD, .gpu = 1},
    {"sinks_window_rows_before_keys_40x16", 1, 4, 2, 40, 16, 32, 0, F32, .window = 1, .wl = 3, .wr = 0,
     .sinks = SINK_VALUES},

    /* ---- ALiBi ---- */
    {"alibi_heads_causal_gqa4_40x100", 1, 8, 2, 40, 100, 64, 0, F32, .causal = 1, .alibi = ALIBI_HEADS,
     .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"alibi_batch_decode_gqa2_1x1000_kvlen_f16", 3, 8, 4, 1, 1000, 64, 0, F16, .alibi = ALIBI_BATCH, .has_kv = 1,
     .kv = {1000, 10, 600}},
    {"alibi_batch_prefill_30x60", 2, 4, 4, 30, 60, 64, 0, F32, .alibi = ALIBI_BATCH, .causal = 1},
    /* everything at once; the -inf holes of the mask hide keys whose K and V are NaN, so a softcap
     * applied after the mask (c·tanh(-inf / c) = -c, finite) shows as NaN */
    {"all_softcap_alibi_window_chunk_sinks_holes_kvlen_bf16", 2, 4, 2, 40, 160, 64, 0, BF16, .softcap = 30.0f,
     .sd = 10, .alibi = ALIBI_HEADS, .window = 1, .wl = 63, .wr = 0, .chunk = 128, .sinks = SINK_VALUES,
     .mask = MASK_HOLES, .has_kv = 1, .kv = {160, 90}, .poison = 1, .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES,
     .gpu = 1},
    {"all_decode_softcap_alibi_chunk_sinks_holes_3x1200_f16", 2, 8, 2, 3, 1200, 64, 0, F16, .softcap = 50.0f,
     .sd = 10, .alibi = ALIBI_BATCH, .chunk = 512, .sinks = SINK_VALUES, .mask = MASK_HOLES, .causal = 1, .has_kv = 1,
     .kv = {1200, 700}, .poison = 1, .gpu = 1},

    /* ---- MLA: head_dim 576, head_dim_v 512, one kv head, V a view of K ---- */
    {"mla_decode_16q_1x300_f16", 1, 16, 1, 1, 300, 576, 512, F16, .scale = MLA_SCALE, .mla = 1},
    {"mla_decode_16q_2x600_causal_kvlen_bf16", 2, 16, 1, 2, 600, 576, 512, BF16, .scale = MLA_SCALE, .mla = 1,
     .causal = 1, .has_kv = 1, .kv = {600, 123}},
    {"mla_decode_window_sinks_1x600_f16", 1, 16, 1, 1, 600, 576, 512, F16, .scale = MLA_SCALE, .mla = 1,
     .window = 1, .wl = 127, .wr = 0, .sinks = SINK_VALUES, .poison = 1, .gpu = 1},
    {"mla_prefill_16q_24x48_causal_f16", 1, 16, 1, 24, 48, 576, 512, F16, .scale = MLA_SCALE, .mla = 1,
     .causal = 1, .gpu = 1},

    /* ---- user snippets ---- */
    {"mod_causal_33x47", 2, 4, 2, 33, 47, 64, 0, F32, .mod = MOD_CAUSAL, .mask = MASK_HOLES, .has_kv = 1,
     .kv = {47, 30}, .same_as = "causal_33x47_holes_kvlen", .same = SAME_ULPS,
     .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES, .gpu = 1},
    {"mod_causal_decode_3x1500_f16", 2, 8, 2, 3, 1500, 64, 0, F16, .mod = MOD_CAUSAL, .has_kv = 1,
     .kv = {1500, 777}, .same_as = "causal_decode_gqa4_3x1500_f16", .same = SAME_ULPS},
    {"mod_window_33x47", 2, 4, 2, 33, 47, 64, 0, F32, .mod = MOD_WINDOW, .mask = MASK_HOLES, .has_kv = 1,
     .kv = {47, 30}, .same_as = "win_l5_r2_33x47_holes_kvlen", .same = SAME_ULPS},
    {"mod_softcap30_33x47", 2, 4, 2, 33, 47, 64, 0, F32, .mod = MOD_SOFTCAP30, .sd = 20,
     .same_as = "softcap30_33x47", .same = SAME_SOFTCAP, .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"mod_mix_causal_kvlen_gqa2_30x70", 2, 4, 2, 30, 70, 64, 0, F32, .mod = MOD_MIX, .causal = 1, .has_kv = 1,
     .kv = {70, 41}, .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"mod_mix_decode_gqa4_4x1000_kvlen_f16", 2, 8, 2, 4, 1000, 64, 0, F16, .mod = MOD_MIX, .has_kv = 1,
     .kv = {1000, 500}, .gpu = 1},
    {"mod_hide_all_20x40", 1, 2, 2, 20, 40, 64, 0, F32, .mod = MOD_HIDE_ALL,
     .algos = ALG_FUSED | ALG_UNFUSED | ALG_SCORES},
    {"mod_hide_all_decode_2x500", 1, 4, 2, 2, 500, 64, 0, F32, .mod = MOD_HIDE_ALL},
};
/* clang-format on */

static const var_case *case_named(const char *name)
{
    for (size_t i = 0; i < N_OF(cases); ++i)
        if (strcmp(cases[i].name, name) == 0)
            return &cases[i];
    return NULL;
}

/* =============================== one problem =============================== */

typedef struct prob {
    const var_case *c;
    int Dv;
    double scale; /* as the device resolves it (in float) */
    tu_view q, k, v, mask, sinks, alibi;
    double *xq, *xk, *xv, *xmask;
    double xsinks[64], xalibi[MAX_B * 64];
    int kvl[MAX_B];
    cl_mem kv_buf;
    ref_attn ra;
    size_t nrow, nout, nprob;
    double *ref_out, *ref_lse, *ref_probs, *ref_scores;
    unsigned char *empty; /* [nrow]: the row has no visible key */
    double max_abs_lse;
} prob;

static int forced_run(void)
{
    return tu_getenv_int("CLATTN_TEST_VARIANTS_FORCED", 0) != 0;
}

/* Whether fused attention runs on the matrix units (docs/numerics.md: weights rounded to the
 * 16-bit input type before P·V). */
static int matrix_path(void)
{
    return strncmp(clattn_matrix_report(tu_ctx_get()), "none", 4) != 0;
}

static size_t qrow(const var_case *c, int b, int h, int i)
{
    return ((size_t)b * (size_t)c->Hq + (size_t)h) * (size_t)c->Sq + (size_t)i;
}

/* NaN and ±Inf across key j of kv head g of batch b in K (and V unless it is K's view). */
static void poison_key(prob *p, void *tk, void *tv, int b, int g, size_t j)
{
    const var_case *c = p->c;
    const size_t D = (size_t)c->D, Dv = (size_t)p->Dv;
    const size_t kr = ((size_t)b * (size_t)c->Hkv + (size_t)g) * (size_t)c->Skv + j;
    for (size_t d = 0; d < D; ++d)
        tu_put(c->dt, tk, p->xk, kr * D + d, d % 3 == 0 ? NAN : (d % 3 == 1 ? INFINITY : -INFINITY));
    if (!c->mla)
        for (size_t d = 0; d < Dv; ++d)
            tu_put(c->dt, tv, p->xv, kr * Dv + d, d % 3 == 1 ? NAN : (d % 3 == 2 ? INFINITY : -INFINITY));
}

/* V as the reference sees it when V is K's view: the first Dv columns of each K row. */
static void mla_values(prob *p)
{
    const size_t rows = p->k.n / (size_t)p->c->D;
    for (size_t r = 0; r < rows; ++r)
        for (size_t d = 0; d < (size_t)p->Dv; ++d)
            p->xv[r * (size_t)p->Dv + d] = p->xk[r * (size_t)p->c->D + d];
}

static void fill_ref_desc(prob *p)
{
    const var_case *c = p->c;
    ref_attn *a = &p->ra;
    memset(a, 0, sizeof *a);
    a->batch = c->B;
    a->heads_q = c->Hq;
    a->heads_kv = c->Hkv;
    a->seq_q = c->Sq;
    a->seq_kv = c->Skv;
    a->head_dim = c->D;
    a->head_dim_v = p->Dv;
    a->scale = p->scale;
    a->causal = c->causal;
    if (c->mask != MASK_NONE) {
        a->mask = p->xmask;
        for (int i = 0; i < 4; ++i)
            a->mask_shape[i] = (int)p->mask.fshape[i];
    }
    a->kv_len = c->has_kv ? p->kvl : NULL;
    a->window = c->window;
    a->window_left = c->wl;
    a->window_right = c->wr;
    a->chunk = c->chunk;
    a->softcap = c->softcap;
    a->sinks = c->sinks != SINK_NONE ? p->xsinks : NULL;
    a->alibi = c->alibi != ALIBI_NONE ? p->xalibi : NULL;
    a->alibi_per_batch = c->alibi == ALIBI_BATCH;
    a->score_mod = mods[c->mod].score;
    a->mask_mod = mods[c->mod].mask;
}

/* Inputs (fixed seed from the row's name), the variants' tensors, and the reference. */
static void build(prob *p, const var_case *c)
{
    memset(p, 0, sizeof *p);
    p->c = c;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(c->name));
    assert_true(c->B <= MAX_B && c->Hq <= 64);
    p->Dv = c->Dv != 0 ? c->Dv : c->D;
    p->scale = c->scale != 0.0f ? (double)c->scale : (double)(float)(1.0 / sqrt((double)c->D));
    /* q·k over uniform [-qa, qa] x [-1, 1] has standard deviation qa·sqrt(D)/3 */
    const double sd = c->sd > 0 ? c->sd : 2.0;
    const double qa = 3.0 * sd / (p->scale * sqrt((double)c->D));

    const clattn_dtype dt = c->dt;
    const size_t esz = clattn_dtype_size(dt);
    tu_view_init(&p->q, LAYOUT_BHSD, dt, c->B, c->Hq, c->Sq, c->D, NAN);
    tu_view_init(&p->k, LAYOUT_BHSD, dt, c->B, c->Hkv, c->Skv, c->D, NAN);
    void *tq = tu_xalloc(p->q.n * esz), *tk = tu_xalloc(p->k.n * esz), *tv = NULL;
    p->xq = tu_xdoubles(p->q.n);
    p->xk = tu_xdoubles(p->k.n);
    tu_fill(&rng, dt, tq, p->xq, p->q.n, -qa, qa);
    tu_fill(&rng, dt, tk, p->xk, p->k.n, -1.0, 1.0);
    if (c->mla) {
        p->v = p->k; /* the same image and, once uploaded, buffer; only the view differs */
        p->v.t.shape[3] = p->Dv;
        p->xv = tu_xdoubles(p->k.n / (size_t)c->D * (size_t)p->Dv);
        mla_values(p);
    } else {
        tu_view_init(&p->v, LAYOUT_BHSD, dt, c->B, c->Hkv, c->Skv, p->Dv, NAN);
        tv = tu_xalloc(p->v.n * esz);
        p->xv = tu_xdoubles(p->v.n);
        tu_fill(&rng, dt, tv, p->xv, p->v.n, -1.0, 1.0);
    }
    for (int b = 0; b < c->B; ++b)
        p->kvl[b] = c->kv[b];

    /* The mask. */
    void *tm = NULL;
    if (c->mask != MASK_NONE) {
        const int holes = c->mask == MASK_HOLES;
        const clattn_dtype mdt = holes ? F32 : F16;
        tu_view_init(&p->mask, LAYOUT_BHSD, mdt, holes ? c->B : 1, holes ? 1 : c->Hq, c->Sq, c->Skv, NAN);
        tm = tu_xalloc(p->mask.n * p->mask.esz);
        p->xmask = tu_xdoubles(p->mask.n);
        tu_fill(&rng, mdt, tm, p->xmask, p->mask.n, -2.0, 2.0);
        if (holes)
            for (size_t i = 0; i < p->mask.n; ++i)
                if (tu_uniform(&rng, 0.0, 1.0) < 0.1 || (i % (size_t)c->Skv) % 5 == 2)
                    tu_put(mdt, tm, p->xmask, i, -INFINITY);
    }

    /* Sinks, f32 [1][Hq][1][1]. */
    if (c->sinks != SINK_NONE) {
        float s[64];
        for (int h = 0; h < c->Hq; ++h) {
            s[h] = c->sinks == SINK_FAR                 ? 60.0f + (float)h
                   : c->sinks == SINK_NEGINF            ? -INFINITY
                   : c->sinks == SINK_BAD && h == 0     ? INFINITY
                   : c->sinks == SINK_BAD && h == 1     ? NAN
                   : h == (c->sinks == SINK_BAD ? 2 : 1) ? -INFINITY
                                                        : (float)tu_uniform(&rng, -1.0, 4.0);
            p->xsinks[h] = s[h];
        }
        tu_view_init(&p->sinks, LAYOUT_BHSD, F32, 1, c->Hq, 1, 1, NAN);
        tu_scatter(&p->sinks, s);
        tu_upload(&p->sinks);
    }

    /* ALiBi slopes, f32 [1 or B][Hq][1][1]. */
    if (c->alibi != ALIBI_NONE) {
        float base[64], s[MAX_B * 64];
        const clattn_status st = clattn_alibi_slopes(c->Hq, 8.0f, base);
        if (st != CLATTN_SUCCESS)
            fail_msg("clattn_alibi_slopes(%d, 8) returned %s", c->Hq, clattn_status_string(st));
        const int nb = c->alibi == ALIBI_BATCH ? c->B : 1;
        for (int b = 0; b < nb; ++b)
            for (int h = 0; h < c->Hq; ++h) {
                s[b * c->Hq + h] = base[h] * (float)(b + 1);
                p->xalibi[b * c->Hq + h] = s[b * c->Hq + h];
            }
        tu_view_init(&p->alibi, LAYOUT_BHSD, F32, nb, c->Hq, 1, 1, NAN);
        tu_scatter(&p->alibi, s);
        tu_upload(&p->alibi);
    }

    p->nrow = (size_t)c->B * (size_t)c->Hq * (size_t)c->Sq;
    p->nout = p->nrow * (size_t)p->Dv;
    p->nprob = p->nrow * (size_t)c->Skv;
    fill_ref_desc(p);
    p->ref_scores = tu_xdoubles(p->nprob);
    ref_scores(&p->ra, p->xq, p->xk, p->ref_scores);

    /* Poison: keys that no query row of the kv head's group sees (scores -inf in every row:
     * visibility does not depend on K, so the clean inputs' scores tell). */
    if (c->poison) {
        const int group = c->Hq / c->Hkv;
        size_t poisoned = 0;
        for (int b = 0; b < c->B; ++b)
            for (int g = 0; g < c->Hkv; ++g)
                for (int j = 0; j < c->Skv; ++j) {
                    int seen = 0;
                    for (int h = g * group; h < (g + 1) * group && !seen; ++h)
                        for (int i = 0; i < c->Sq && !seen; ++i)
                            seen = p->ref_scores[qrow(c, b, h, i) * (size_t)c->Skv + (size_t)j] != -INFINITY;
                    if (!seen) {
                        poison_key(p, tk, tv, b, g, (size_t)j);
                        poisoned++;
                    }
                }
        assert_true(poisoned > 0); /* the row is meant to hide whole keys */
        if (c->mla)
            mla_values(p);
        ref_scores(&p->ra, p->xq, p->xk, p->ref_scores);
    }

    tu_scatter(&p->q, tq);
    tu_scatter(&p->k, tk);
    tu_upload(&p->q);
    tu_upload(&p->k);
    if (c->mla) {
        p->v.img = p->k.img;
        p->v.t.buffer = p->k.t.buffer;
    } else {
        tu_scatter(&p->v, tv);
        tu_upload(&p->v);
    }
    if (tm != NULL) {
        tu_scatter(&p->mask, tm);
        tu_upload(&p->mask);
    }
    if (c->has_kv)
        p->kv_buf = tu_xbuffer(sizeof(int) * (size_t)c->B, p->kvl);

    p->ref_out = tu_xdoubles(p->nout);
    p->ref_lse = tu_xdoubles(p->nrow);
    p->ref_probs = tu_xdoubles(p->nprob);
    ref_attention(&p->ra, p->xq, p->xk, p->xv, p->ref_out, p->ref_lse, p->ref_probs);
    p->empty = tu_xalloc(p->nrow);
    for (size_t r = 0; r < p->nrow; ++r) {
        int any = 0;
        for (size_t j = 0; j < (size_t)c->Skv && !any; ++j)
            any = p->ref_scores[r * (size_t)c->Skv + j] != -INFINITY;
        p->empty[r] = !any;
        if (isfinite(p->ref_lse[r]) && fabs(p->ref_lse[r]) > p->max_abs_lse)
            p->max_abs_lse = fabs(p->ref_lse[r]);
    }
}

/* The descriptor of case c (its variants) over p's tensors. */
static void describe(const prob *p, const var_case *c, clattn_algorithm alg, clattn_attention_desc *d)
{
    /* A twin's descriptor must not need tensors p lacks. */
    assert_true(c->mask == MASK_NONE || c->mask == p->c->mask);
    assert_true(c->sinks == SINK_NONE || c->sinks == p->c->sinks);
    assert_true(c->alibi == ALIBI_NONE || c->alibi == p->c->alibi);
    memset(d, 0, sizeof *d);
    d->batch = c->B;
    d->heads_q = c->Hq;
    d->heads_kv = c->Hkv;
    d->seq_q = c->Sq;
    d->seq_kv = c->Skv;
    d->head_dim = c->D;
    d->head_dim_v = c->Dv;
    d->scale = c->scale;
    d->causal = c->causal;
    d->mask = c->mask != MASK_NONE ? &p->mask.t : NULL;
    d->kv_lengths = c->has_kv ? p->kv_buf : NULL;
    d->algorithm = alg;
    d->window = c->window;
    d->window_left = c->wl;
    d->window_right = c->wr;
    d->chunk = c->chunk;
    d->softcap = c->softcap;
    d->sinks = c->sinks != SINK_NONE ? &p->sinks.t : NULL;
    d->alibi_slopes = c->alibi != ALIBI_NONE ? &p->alibi.t : NULL;
    d->score_mod = mods[c->mod].score_src;
    d->mask_mod = mods[c->mod].mask_src;
}

/* =============================== tolerances =============================== */

typedef struct tols {
    double out_atol, out_rtol, lse_atol, lse_rtol, p_atol, p_rtol;
} tols;

/* Absolute error of an fp32 logit (see the top of the file). */
static double logit_error(const prob *p, const var_case *c)
{
    double e = 2.0 * 0x1p-24 * p->max_abs_lse;
    if (c->softcap > 0.0f) /* above 64 the cap is relatively accurate: logits here stay below 64 */
        e += 8.0 * 0x1p-24 * fmin(c->softcap, 64.0);
    if (c->mod == MOD_SOFTCAP30)
        e += 8.0 * 0x1p-24 * 30.0;
    if (c->mod == MOD_MIX)
        e += 1e-6; /* the snippet's own float arithmetic against the reference's double */
    if (c->alibi != ALIBI_NONE)
        e += 4.0 * 0x1p-24 * (p->max_abs_lse + 30.0);
    return e;
}

static tols tolerances(const prob *p, clattn_dtype out_dt)
{
    const var_case *c = p->c;
    const double g = c->Skv > 4096 ? sqrt(c->Skv / 4096.0) : 1.0;
    const double e = logit_error(p, c);
    tols t;
    t.out_atol = 2e-5 + 2.0 * e;
    t.out_rtol = 1e-4 * g;
    if (out_dt == F16) {
        t.out_atol += 0x1p-10;
        t.out_rtol = 0x1p-11;
    } else if (out_dt == BF16) {
        t.out_atol += 0x1p-7;
        t.out_rtol = 0x1p-8;
    }
    t.lse_atol = 1e-5 * g + e;
    t.lse_rtol = 4e-6;
    t.p_atol = 1e-7;
    t.p_rtol = 2e-5 * g + 2.0 * e;
    return t;
}

/* Half an ulp of the 16-bit input type times the largest |V| (1 here) on the matrix path. */
static double matrix_error(const prob *p, clattn_algorithm alg)
{
    if (alg != CLATTN_ALGORITHM_FUSED || p->c->dt == F32 || !matrix_path())
        return 0.0;
    return p->c->dt == F16 ? 0x1p-11 : 0x1p-8;
}

/* =============================== running =============================== */

static const char *alg_name(clattn_algorithm a)
{
    return a == CLATTN_ALGORITHM_FUSED ? "fused" : a == CLATTN_ALGORITHM_UNFUSED ? "unfused" : "auto";
}

typedef struct result {
    double *out, *lse, *probs;
} result;

/* Runs case c's descriptor (c is p's row or its twin) with algorithm alg on ctx; out, lse and,
 * unfused, f32 probabilities. */
static void run(clattn_context *ctx, const prob *p, const var_case *c, clattn_algorithm alg, result *r)
{
    const int with_probs = alg == CLATTN_ALGORITHM_UNFUSED;
    tu_view out, lse, probs;
    memset(&probs, 0, sizeof probs);
    tu_view_init(&out, LAYOUT_BHSD, c->dt, c->B, c->Hq, c->Sq, p->Dv, 777.0);
    tu_view_init(&lse, LAYOUT_BHSD, F32, c->B, c->Hq, c->Sq, 1, 777.0);
    tu_upload(&out);
    tu_upload(&lse);
    if (with_probs) {
        tu_view_init(&probs, LAYOUT_BHSD, F32, c->B, c->Hq, c->Sq, c->Skv, 777.0);
        tu_upload(&probs);
    }
    clattn_attention_desc desc;
    describe(p, c, alg, &desc);
    desc.lse = &lse.t;
    desc.probabilities = with_probs ? &probs.t : NULL;
    cl_event done = NULL;
    const clattn_status st = clattn_attention(ctx, &desc, &p->q.t, &p->k.t, &p->v.t, &out.t, 0, NULL, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("%s (%s): clattn_attention returned %s: %s", alg_name(alg), c->name, clattn_status_string(st),
                 clattn_last_error(ctx));
    assert_non_null(done);
    clReleaseEvent(done);
    tu_finish(ctx);
    char what[160];
    r->out = tu_xdoubles(p->nout);
    r->lse = tu_xdoubles(p->nrow);
    r->probs = with_probs ? tu_xdoubles(p->nprob) : NULL;
    snprintf(what, sizeof what, "%s out", alg_name(alg));
    tu_download(what, &out, r->out);
    snprintf(what, sizeof what, "%s lse", alg_name(alg));
    tu_download(what, &lse, r->lse);
    if (with_probs) {
        snprintf(what, sizeof what, "%s probabilities", alg_name(alg));
        tu_download(what, &probs, r->probs);
    }
}

/* Rows with no visible key: out exactly 0, lse exactly -inf or (with a sink) the sink's value;
 * hidden probabilities -0.0. */
static void check_empty_rows(const char *what, const prob *p, const result *r)
{
    const var_case *c = p->c;
    size_t bad = 0, first = 0;
    for (size_t row = 0; row < p->nrow; ++row) {
        if (!p->empty[row])
            continue;
        for (size_t d = 0; d < (size_t)p->Dv; ++d)
            if (r->out[row * (size_t)p->Dv + d] != 0.0 && bad++ == 0)
                first = row * (size_t)p->Dv + d;
    }
    if (bad != 0) {
        print_error("%s out: %zu elements of rows without a visible key are not exactly 0, first at %zu: %.9g\n",
                    what, bad, first, r->out[first]);
        ++tu_failures;
    }
    bad = 0;
    for (size_t row = 0; row < p->nrow; ++row) {
        if (!p->empty[row])
            continue;
        const double want = c->sinks != SINK_NONE ? p->xsinks[row / (size_t)c->Sq % (size_t)c->Hq] : -INFINITY;
        const int ok = want == -INFINITY ? r->lse[row] == -INFINITY : tu_close(r->lse[row], want, 0.0, 0x1p-22);
        if (!ok && bad++ == 0)
            first = row;
    }
    if (bad != 0) {
        print_error("%s lse: %zu rows without a visible key do not give -inf or their sink, first row %zu: %.9g\n",
                    what, bad, first, r->lse[first]);
        ++tu_failures;
    }
    if (r->probs == NULL)
        return;
    bad = 0;
    for (size_t i = 0; i < p->nprob; ++i)
        if (p->ref_scores[i] == -INFINITY && !(r->probs[i] == 0.0 && signbit(r->probs[i])) && bad++ == 0)
            first = i;
    if (bad != 0) {
        print_error("%s probabilities: %zu hidden entries are not -0.0, first at %zu: %.9g\n", what, bad, first,
                    r->probs[first]);
        ++tu_failures;
    }
}

static void check_result(const prob *p, clattn_algorithm alg, const result *r)
{
    char what[128];
    tols t = tolerances(p, p->c->dt);
    t.out_atol += matrix_error(p, alg);
    snprintf(what, sizeof what, "%s out vs reference", alg_name(alg));
    tu_check_close(what, r->out, p->ref_out, p->nout, t.out_atol, t.out_rtol);
    snprintf(what, sizeof what, "%s lse vs reference", alg_name(alg));
    tu_check_close(what, r->lse, p->ref_lse, p->nrow, t.lse_atol, t.lse_rtol);
    if (r->probs != NULL) {
        snprintf(what, sizeof what, "%s probabilities vs reference", alg_name(alg));
        tu_check_close(what, r->probs, p->ref_probs, p->nprob, t.p_atol, t.p_rtol);
    }
    check_empty_rows(alg_name(alg), p, r);
}

/* clattn_scores: the logits, hidden keys -inf, sinks ignored. An fp32 dot product of D terms is
 * within (D + 2)·2^-24 of scale·Σ|q_d·k_d| (test_scores.c); the variants add the logit error. */
static void check_scores(const prob *p)
{
    const var_case *c = p->c;
    tu_view out;
    tu_view_init(&out, LAYOUT_BHSD, F32, c->B, c->Hq, c->Sq, c->Skv, 777.0);
    tu_upload(&out);
    clattn_attention_desc desc;
    describe(p, c, CLATTN_ALGORITHM_AUTO, &desc);
    cl_event done = NULL;
    const clattn_status st = clattn_scores(tu_ctx, &desc, &p->q.t, &p->k.t, &out.t, 0, NULL, &done);
    if (st != CLATTN_SUCCESS) {
        print_error("clattn_scores returned %s: %s\n", clattn_status_string(st), clattn_last_error(tu_ctx));
        ++tu_failures;
        return;
    }
    clReleaseEvent(done);
    tu_finish(tu_ctx);
    double *got = tu_xdoubles(p->nprob);
    tu_download("scores", &out, got);
    const int group = c->Hq / c->Hkv;
    double big = 0.0, bias = 0.0;
    for (int b = 0; b < c->B; ++b)
        for (int h = 0; h < c->Hq; ++h)
            for (int i = 0; i < c->Sq; ++i)
                for (int j = 0; j < c->Skv; ++j) {
                    const double *qr = p->xq + qrow(c, b, h, i) * (size_t)c->D;
                    const double *kr =
                        p->xk + (((size_t)b * (size_t)c->Hkv + (size_t)(h / group)) * (size_t)c->Skv + (size_t)j) *
                                    (size_t)c->D;
                    double s = 0.0;
                    for (int d = 0; d < c->D; ++d)
                        s += fabs(qr[d] * kr[d]);
                    if (isfinite(s) && p->scale * s > big)
                        big = p->scale * s;
                    const double x = p->ref_scores[qrow(c, b, h, i) * (size_t)c->Skv + (size_t)j];
                    if (isfinite(x) && fabs(x) > bias)
                        bias = fabs(x);
                }
    double atol = (c->D + 2) * 0x1p-24 * big + 4.0 * 0x1p-24 * bias, rtol = 0x1p-21;
    if (c->softcap > 0.0f || c->mod == MOD_SOFTCAP30)
        atol += 8.0 * 0x1p-24 * (c->softcap > 0.0f ? fmin(c->softcap, 64.0) : 30.0);
    if (c->mod == MOD_MIX)
        atol += 1e-6;
    if (c->alibi != ALIBI_NONE)
        atol += 4.0 * 0x1p-24 * bias;
    tu_check_close("scores vs reference", got, p->ref_scores, p->nprob, atol, rtol);
}

/* Bitwise, or within `how`'s tolerance: got (this row's call) against want (the twin's). */
static void check_same(const char *what, const prob *p, same_kind how, const result *got, const result *want)
{
    char msg[256];
    /* A device that keeps floats wider than float (PoCL on 32-bit x86) rounds two programs'
     * arithmetic differently: 1e-5 more there (|out| <= 1; test_limits.c), bits elsewhere. */
    const int exact = tu_device_rounds_floats(tu_ctx);
    if (how == SAME_BITS && exact) {
        if (memcmp(got->out, want->out, p->nout * sizeof(double)) != 0 ||
            memcmp(got->lse, want->lse, p->nrow * sizeof(double)) != 0) {
            size_t i = 0;
            while (i < p->nout && memcmp(&got->out[i], &want->out[i], sizeof(double)) == 0)
                ++i;
            print_error("%s: not bitwise equal to the twin: out[%zu] %.9g vs %.9g (lse equal: %d)\n", what,
                        i < p->nout ? i : 0, got->out[i < p->nout ? i : 0], want->out[i < p->nout ? i : 0],
                        memcmp(got->lse, want->lse, p->nrow * sizeof(double)) == 0);
            ++tu_failures;
        }
        if (got->probs != NULL && want->probs != NULL &&
            memcmp(got->probs, want->probs, p->nprob * sizeof(double)) != 0) {
            print_error("%s: probabilities not bitwise equal to the twin's\n", what);
            ++tu_failures;
        }
        return;
    }
    double atol = 0x1p-22, rtol = 0x1p-21, lse_atol = 0x1p-22;
    if (p->c->dt == F16) {
        atol += 0x1p-11;
        rtol = 0x1p-10;
    } else if (p->c->dt == BF16) {
        atol += 0x1p-8;
        rtol = 0x1p-7;
    }
    if (how == SAME_SOFTCAP) {
        atol += 4.0 * 8.0 * 0x1p-24 * 30.0; /* out moves by at most 2e, e = two tanh's 8 ulp of 30 */
        lse_atol += 2.0 * 8.0 * 0x1p-24 * 30.0;
    }
    if (!exact) {
        atol += 1e-5;
        lse_atol += 1e-5;
    }
    snprintf(msg, sizeof msg, "%s out vs the twin", what);
    tu_check_close(msg, got->out, want->out, p->nout, atol, rtol);
    snprintf(msg, sizeof msg, "%s lse vs the twin", what);
    tu_check_close(msg, got->lse, want->lse, p->nrow, lse_atol, 0x1p-21);
    if (got->probs != NULL && want->probs != NULL) {
        snprintf(msg, sizeof msg, "%s probabilities vs the twin", what);
        tu_check_close(msg, got->probs, want->probs, p->nprob, 1e-9 + (how == SAME_SOFTCAP ? 1e-6 : 0.0),
                       how == SAME_SOFTCAP ? 1e-5 : 0x1p-20);
    }
}

static void test_case(void **state)
{
    const var_case *c = *state;
    tu_ctx_get();
    tu_failures = 0;
    prob p;
    build(&p, c);
    /* The row's own premise, in the reference: the rows meant to have empty rows have some. */
    if (strstr(c->name, "rows_before_keys") || strstr(c->name, "kvlen0") || strstr(c->name, "hide_all")) {
        size_t n = 0;
        for (size_t r = 0; r < p.nrow; ++r)
            n += p.empty[r];
        assert_true(n > 0 && (n < p.nrow || c->mod == MOD_HIDE_ALL));
    }

    unsigned algos = c->algos != 0 ? c->algos : (ALG_FUSED | ALG_UNFUSED);
    if (forced_run())
        algos &= ALG_FUSED;
    result res[2] = {{0}, {0}};
    for (int ai = 0; ai < 2; ++ai) {
        if (!(algos & (1u << ai)))
            continue;
        const clattn_algorithm alg = ai == 0 ? CLATTN_ALGORITHM_FUSED : CLATTN_ALGORITHM_UNFUSED;
        run(tu_ctx, &p, c, alg, &res[ai]);
        check_result(&p, alg, &res[ai]);
    }
    if (res[0].out != NULL && res[1].out != NULL) {
        /* Each path rounds its own fp32 result once: fp32 error plus one storage ulp. */
        const tols t = tolerances(&p, F32);
        const double rtol = c->dt == F16 ? 0x1p-10 : c->dt == BF16 ? 0x1p-7 : t.out_rtol;
        tu_check_close("fused vs unfused out", res[0].out, res[1].out, p.nout,
                       t.out_atol + matrix_error(&p, CLATTN_ALGORITHM_FUSED), rtol);
        tu_check_close("fused vs unfused lse", res[0].lse, res[1].lse, p.nrow, 2 * t.lse_atol, 2 * t.lse_rtol);
    }
    if (algos & ALG_SCORES)
        check_scores(&p);

    if (c->same_as != NULL) {
        const var_case *twin = case_named(c->same_as);
        assert_non_null(twin);
        assert_true(twin->B == c->B && twin->Hq == c->Hq && twin->Hkv == c->Hkv && twin->Sq == c->Sq &&
                    twin->Skv == c->Skv && twin->D == c->D && twin->Dv == c->Dv && twin->dt == c->dt &&
                    twin->has_kv == c->has_kv && memcmp(twin->kv, c->kv, sizeof c->kv) == 0);
        for (int ai = 0; ai < 2; ++ai) {
            if (res[ai].out == NULL)
                continue;
            const clattn_algorithm alg = ai == 0 ? CLATTN_ALGORITHM_FUSED : CLATTN_ALGORITHM_UNFUSED;
            result tw = {0};
            run(tu_ctx, &p, twin, alg, &tw);
            char what[128];
            snprintf(what, sizeof what, "%s as %.100s", alg_name(alg), twin->name);
            check_same(what, &p, c->same, &res[ai], &tw);
        }
    }
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* ============================ sinks over key splits ============================ */

typedef struct split_case {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D;
    clattn_dtype dt;
    int causal;
    int splits; /* DECODE's SPLITS for the call */
    int has_kv;
    int kv[MAX_B];
    int gpu;    /* also in the runs that force a GPU kernel */
    int bad;    /* SINK_BAD's +inf and NaN sinks, else SINK_VALUES */
} split_case;

/* Key lengths: batch 1 has no key (0 and the sink), batch 2 a few keys (in the first split). */
/* clang-format off */
static const split_case split_cases[] = {
    {"sinks_splits1_gqa4_2x3000_kvlen_f16", 3, 8, 2, 2, 3000, 64, F16, 1, 1, 1, {3000, 0, 2}, 1, 0},
    {"sinks_splits2_gqa4_2x3000_kvlen_f16", 3, 8, 2, 2, 3000, 64, F16, 1, 2, 1, {3000, 0, 2}, 1, 0},
    {"sinks_splits7_gqa4_2x3000_kvlen_f16", 3, 8, 2, 2, 3000, 64, F16, 1, 7, 1, {3000, 0, 2}, 1, 0},
    {"sinks_splits5_mqa_1x4000", 2, 4, 1, 1, 4000, 64, F32, 0, 5, 0, {0}, 0, 0},
    {"sinks_bad_splits1_gqa4_2x3000_kvlen", 3, 8, 2, 2, 3000, 64, F32, 1, 1, 1, {3000, 0, 2}, 1, 1},
    {"sinks_bad_splits3_gqa4_2x3000_kvlen", 3, 8, 2, 2, 3000, 64, F32, 1, 3, 1, {3000, 0, 2}, 1, 1},
};
/* clang-format on */

/* Index of DECODE's parameter `name`. */
static int decode_param(const char *name)
{
    for (int i = 0; i < clattn_param_count(CLATTN_OPERATION_DECODE); ++i)
        if (strcmp(clattn_param_name(CLATTN_OPERATION_DECODE, i), name) == 0)
            return i;
    fail_msg("DECODE has no parameter %s", name);
    return -1;
}

/* The decode parameters a call of this shape runs with (environment, tuning or defaults), with
 * SPLITS replaced, as an override on ctx. An override takes the kernel it names, never the
 * matrix kernel by itself: under CLATTN_MATRIX=emulate or another emulated layout (and no
 * CLATTN_PARAMS_DECODE) it names kernel=mma, one warp and 16-key tiles (test_decode_mmatiles'
 * decode tile). */
static void force_splits(clattn_context *ctx, const var_case *c, int splits)
{
    const clattn_problem_class pc = {CLATTN_OPERATION_DECODE, c->dt, c->D, c->Sq, c->Skv, c->causal,
                                     c->has_kv || c->mask != MASK_NONE};
    clattn_kernel_params kp;
    clattn_status st = clattn_get_call_params(ctx, &pc, c->Hq, c->Hkv, c->Dv, &kp);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_get_call_params returned %s: %s", clattn_status_string(st), clattn_last_error(ctx));
    kp.values[decode_param("SPLITS")] = splits;
    const char *matrix = getenv("CLATTN_MATRIX"), *dec = getenv("CLATTN_PARAMS_DECODE");
    /* (RDNA3's and Intel's layouts have no f32 product: kernel=mma with f32 inputs is refused) */
    const int no_f32 = matrix != NULL &&
                       (strcmp(matrix, "emulate-wmma") == 0 || strncmp(matrix, "emulate-intel", 13) == 0) &&
                       c->dt == F32;
    if (matrix != NULL && strncmp(matrix, "emulate", 7) == 0 && !no_f32 && (dec == NULL || *dec == '\0')) {
        const int k = decode_param("DIRECT");
        int mma = -1;
        for (int v = 0; v <= clattn_param_max(CLATTN_OPERATION_DECODE, k); ++v) {
            const char *vn = clattn_param_value_name(CLATTN_OPERATION_DECODE, k, v);
            if (vn != NULL && strcmp(vn, "mma") == 0)
                mma = v;
        }
        assert_true(mma >= 0);
        kp.values[k] = mma;
        kp.values[decode_param("WGX")] = 1;
        kp.values[decode_param("WGY")] = 1;
        kp.values[decode_param("RM")] = 1;
        kp.values[decode_param("NS")] = 1;
        kp.values[decode_param("VW")] = 4;
    }
    st = clattn_set_params(ctx, CLATTN_OPERATION_DECODE, kp.values, kp.count);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_set_params returned %s: %s", clattn_status_string(st), clattn_last_error(ctx));
}

/* Sinks join each row's denominator once, however many key splits the call is cut into: each
 * count against the reference, on a context of its own (so that its workspace shows the split
 * partials: at least two parts' worth of [rows][Dv + 1] floats when splits > 1). */
static void test_splits(void **state)
{
    const split_case *s = *state;
    tu_ctx_get();
    tu_failures = 0;
    var_case c = {.name = s->name, .B = s->B, .Hq = s->Hq, .Hkv = s->Hkv, .Sq = s->Sq, .Skv = s->Skv,
                  .D = s->D, .dt = s->dt, .causal = s->causal, .has_kv = s->has_kv,
                  .sinks = s->bad ? SINK_BAD : SINK_VALUES};
    memcpy(c.kv, s->kv, sizeof c.kv);
    prob p;
    build(&p, &c);
    clattn_context *ctx = tu_context_sharing(tu_ctx);
    force_splits(ctx, &c, s->splits);
    result r = {0};
    run(ctx, &p, &c, CLATTN_ALGORITHM_FUSED, &r);
    check_result(&p, CLATTN_ALGORITHM_FUSED, &r);
    size_t bytes = 0;
    const cl_mem ws = tu_workspace(ctx, &bytes);
    const size_t part = p.nrow * (size_t)(p.Dv + 1) * sizeof(float);
    print_message("%d splits asked: workspace %zu bytes, %.1f parts of %zu\n", s->splits, ws ? bytes : 0,
                  ws ? (double)bytes / (double)part : 0.0, part);
    if (s->splits > 1 && (ws == NULL || bytes < 2 * part)) {
        print_error("the call was not cut into key splits (workspace %zu bytes, 2 parts take %zu): the row checks "
                    "no split\n", ws ? bytes : 0, 2 * part);
        ++tu_failures;
    }
    clattn_release(ctx);
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* ============================ merge with sinks ============================ */

/* The keys in two ranges, the sinks given to the first part only, merged: the whole with sinks. */
static void test_merge_sinks(void **state)
{
    (void)state;
    tu_ctx_get();
    tu_failures = 0;
    const var_case c = {.name = "merge_sinks", .B = 2, .Hq = 4, .Hkv = 2, .Sq = 3, .Skv = 600, .D = 64,
                        .dt = F32, .sinks = SINK_VALUES};
    prob p;
    build(&p, &c);
    const int cut = 250;
    tu_view parts, plse;
    tu_view_init(&parts, LAYOUT_BHSD, F32, 2 * c.B, c.Hq, c.Sq, c.D, 777.0);
    tu_view_init(&plse, LAYOUT_BHSD, F32, 2 * c.B, c.Hq, c.Sq, 1, 777.0);
    tu_upload(&parts);
    tu_upload(&plse);
    clattn_tensor po[2], pl[2];
    for (int part = 0; part < 2; ++part) {
        const int lo = part == 0 ? 0 : cut, hi = part == 0 ? cut : c.Skv;
        po[part] = clattn_tensor_bhsd(parts.t.buffer, F32, c.B, c.Hq, c.Sq, c.D);
        po[part].offset = (int64_t)part * (int64_t)p.nout;
        pl[part] = clattn_tensor_bhsd(plse.t.buffer, F32, c.B, c.Hq, c.Sq, 1);
        pl[part].offset = (int64_t)part * (int64_t)p.nrow;
        clattn_attention_desc d;
        describe(&p, &c, part == 0 || forced_run() ? CLATTN_ALGORITHM_FUSED : CLATTN_ALGORITHM_UNFUSED, &d);
        d.seq_kv = hi - lo;
        d.sinks = part == 0 ? &p.sinks.t : NULL;
        d.lse = &pl[part];
        clattn_tensor k = p.k.t, v = p.v.t;
        k.offset += lo * k.stride[2];
        k.shape[2] = hi - lo;
        v.offset += lo * v.stride[2];
        v.shape[2] = hi - lo;
        const clattn_status st = clattn_attention(tu_ctx, &d, &p.q.t, &k, &v, &po[part], 0, NULL, NULL);
        if (st != CLATTN_SUCCESS)
            fail_msg("part %d: clattn_attention returned %s: %s", part, clattn_status_string(st),
                     clattn_last_error(tu_ctx));
    }
    tu_view out, lse;
    tu_view_init(&out, LAYOUT_BHSD, F32, c.B, c.Hq, c.Sq, c.D, 777.0);
    tu_view_init(&lse, LAYOUT_BHSD, F32, c.B, c.Hq, c.Sq, 1, 777.0);
    tu_upload(&out);
    tu_upload(&lse);
    const clattn_status st = clattn_merge(tu_ctx, 2, po, pl, &out.t, &lse.t, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_merge returned %s: %s", clattn_status_string(st), clattn_last_error(tu_ctx));
    tu_finish(tu_ctx);
    double *got = tu_xdoubles(p.nout), *got_lse = tu_xdoubles(p.nrow);
    tu_download("merged out", &out, got);
    tu_download("merged lse", &lse, got_lse);
    /* Two parts' error plus the merge's few fp32 operations. */
    const tols t = tolerances(&p, F32);
    tu_check_close("merged out vs the reference with sinks", got, p.ref_out, p.nout, 2 * t.out_atol + 1e-6,
                   2 * t.out_rtol);
    tu_check_close("merged lse vs the reference with sinks", got_lse, p.ref_lse, p.nrow, 2 * t.lse_atol + 1e-6,
                   t.lse_rtol);
    /* And a whole-range call with the sinks. */
    result whole = {0};
    run(tu_ctx, &p, &c, CLATTN_ALGORITHM_FUSED, &whole);
    tu_check_close("merged out vs the whole call", got, whole.out, p.nout, 3 * t.out_atol, 3 * t.out_rtol);
    tu_check_close("merged lse vs the whole call", got_lse, whole.lse, p.nrow, 3 * t.lse_atol, 2 * t.lse_rtol);
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* ====================== clattn_scores ignores the sinks ====================== */

/* clattn_scores takes an attention descriptor and ignores its sinks and LSE (clattn.h): sinks and
 * an LSE that would be refused where they count (f16, the wrong shape, overlapping the output)
 * give the same logits, bit for bit, as the call without them. */
static void test_scores_ignores_sinks(void **state)
{
    (void)state;
    tu_ctx_get();
    const var_case *c = case_named("sinks_causal_bias_kvlen0_gqa2_40x100");
    assert_non_null(c);
    prob p;
    build(&p, c);
    tu_view plain, odd;
    tu_view_init(&plain, LAYOUT_BHSD, F32, c->B, c->Hq, c->Sq, c->Skv, 777.0);
    tu_view_init(&odd, LAYOUT_BHSD, F32, c->B, c->Hq, c->Sq, c->Skv, 777.0);
    tu_upload(&plain);
    tu_upload(&odd);
    clattn_attention_desc desc;
    describe(&p, c, CLATTN_ALGORITHM_AUTO, &desc);
    desc.sinks = NULL;
    clattn_status st = clattn_scores(tu_ctx, &desc, &p.q.t, &p.k.t, &plain.t, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_scores without sinks returned %s: %s", clattn_status_string(st), clattn_last_error(tu_ctx));
    clattn_tensor bad_sinks = clattn_tensor_bhsd(p.sinks.t.buffer, F16, 1, 1, 1, 3);
    clattn_tensor bad_lse = odd.t; /* the output itself, f16 and one column */
    bad_lse.dtype = F16;
    bad_lse.shape[3] = 1;
    desc.sinks = &bad_sinks;
    desc.lse = &bad_lse;
    st = clattn_scores(tu_ctx, &desc, &p.q.t, &p.k.t, &odd.t, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_scores with sinks and an lse it ignores returned %s: %s", clattn_status_string(st),
                 clattn_last_error(tu_ctx));
    tu_finish(tu_ctx);
    double *a = tu_xdoubles(p.nprob), *b = tu_xdoubles(p.nprob);
    tu_download("scores", &plain, a);
    tu_download("scores with ignored fields", &odd, b);
    assert_memory_equal(a, b, p.nprob * sizeof(double));
}

/* =============================== ALiBi slopes =============================== */

/* clattn_alibi_slopes against the formula in double. The library works in float: m0 or m1
 * (rounded, half an ulp) raised to up to the 2n-th power carries up to 2n half-ulps, so
 * rtol 1e-5 (about 80 ulp) for up to 48 heads. */
static void test_alibi_slopes(void **state)
{
    (void)state;
    tu_failures = 0;
    const struct {
        int heads;
        float max_bias;
    } rows[] = {{8, 8.0f}, {12, 8.0f}, {48, 8.0f}, {1, 8.0f}, {12, 4.0f}, {48, 0.5f}};
    for (size_t r = 0; r < N_OF(rows); ++r) {
        float got[64];
        double gotd[64], want[64];
        for (int h = 0; h < 64; ++h)
            got[h] = -1.0f;
        const clattn_status st = clattn_alibi_slopes(rows[r].heads, rows[r].max_bias, got);
        if (st != CLATTN_SUCCESS) {
            print_error("clattn_alibi_slopes(%d, %g) returned %s\n", rows[r].heads, (double)rows[r].max_bias,
                        clattn_status_string(st));
            ++tu_failures;
            continue;
        }
        ref_alibi_slopes(rows[r].heads, rows[r].max_bias, want);
        for (int h = 0; h < rows[r].heads; ++h)
            gotd[h] = got[h];
        char what[64];
        snprintf(what, sizeof what, "slopes of %d heads, max_bias %g", rows[r].heads, (double)rows[r].max_bias);
        tu_check_close(what, gotd, want, (size_t)rows[r].heads, 0.0, 1e-5);
        if (got[rows[r].heads] != -1.0f) {
            print_error("%s: wrote past heads\n", what);
            ++tu_failures;
        }
    }
    /* Closed forms: 8 heads, max_bias 8: 1/2, 1/4, ..., 1/256 exactly. */
    float s8[8];
    assert_int_equal(clattn_alibi_slopes(8, 8.0f, s8), CLATTN_SUCCESS);
    for (int h = 0; h < 8; ++h)
        if (s8[h] != ldexpf(1.0f, -(h + 1))) {
            print_error("8 heads: slope %d is %.9g, not 2^-%d\n", h, (double)s8[h], h + 1);
            ++tu_failures;
        }
    /* Refused: heads < 1, no array, max_bias not finite and positive. */
    float s[4];
    const struct {
        int heads;
        float mb;
        float *out;
    } bad[] = {{0, 8.0f, s}, {-3, 8.0f, s}, {4, 8.0f, NULL}, {4, 0.0f, s},
               {4, -1.0f, s}, {4, NAN, s}, {4, INFINITY, s}};
    for (size_t i = 0; i < N_OF(bad); ++i) {
        const clattn_status st = clattn_alibi_slopes(bad[i].heads, bad[i].mb, bad[i].out);
        if (st != CLATTN_INVALID_ARGUMENT) {
            print_error("clattn_alibi_slopes(%d, %g, %s) returned %s, not INVALID_ARGUMENT\n", bad[i].heads,
                        (double)bad[i].mb, bad[i].out ? "slopes" : "NULL", clattn_status_string(st));
            ++tu_failures;
        }
    }
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* =============================== refusals =============================== */

typedef enum bad_kind {
    BAD_WINDOW0_LEFT,      /* window 0 with window_left 3 */
    BAD_WINDOW0_RIGHT,     /* window 0 with window_right -1 */
    BAD_SOFTCAP_NEG,
    BAD_SOFTCAP_NAN,
    BAD_SOFTCAP_INF,
    BAD_SINKS_F16,         /* dtype f16 */
    BAD_SINKS_HEADS,       /* [1][Hq + 1][1][1] */
    BAD_SINKS_SEQ,         /* [1][Hq][2][1] */
    BAD_SINKS_DIM,         /* [1][Hq][1][2] */
    BAD_SINKS_BATCH,       /* [B][Hq][1][1]: sinks are per head only */
    BAD_ALIBI_HEADS,       /* [1][Hq - 1][1][1] */
    BAD_ALIBI_BATCH,       /* [B + 1][Hq][1][1] */
    BAD_ALIBI_DIM,         /* [1][Hq][1][2] */
    BAD_ALIBI_F16,
    BAD_HEAD_DIM_577,      /* head_dim 577 (scale given) */
    BAD_HEAD_DIM_V_513,    /* head_dim 576, head_dim_v 513 */
    BAD_HEAD_DIM_320_SCALE0, /* head_dim 320 with scale 0: the model's scale must be given */
    BAD_CHUNK_NEG,         /* chunk -4 */
    BAD_SCORE_MOD_EMPTY,   /* "" (NULL is none) */
    BAD_MASK_MOD_EMPTY
} bad_kind;

typedef struct bad_case {
    const char *name;
    bad_kind kind;
    const char *word;       /* the message names it */
    clattn_status expected;
} bad_case;

static const bad_case bad_cases[] = {
    {"window0_with_left", BAD_WINDOW0_LEFT, "window", CLATTN_INVALID_ARGUMENT},
    {"window0_with_right", BAD_WINDOW0_RIGHT, "window", CLATTN_INVALID_ARGUMENT},
    {"softcap_negative", BAD_SOFTCAP_NEG, "softcap", CLATTN_INVALID_ARGUMENT},
    {"softcap_nan", BAD_SOFTCAP_NAN, "softcap", CLATTN_INVALID_ARGUMENT},
    {"softcap_inf", BAD_SOFTCAP_INF, "softcap", CLATTN_INVALID_ARGUMENT},
    {"sinks_f16", BAD_SINKS_F16, "sinks", CLATTN_INVALID_ARGUMENT},
    {"sinks_heads", BAD_SINKS_HEADS, "sinks", CLATTN_INVALID_ARGUMENT},
    {"sinks_seq", BAD_SINKS_SEQ, "sinks", CLATTN_INVALID_ARGUMENT},
    {"sinks_dim", BAD_SINKS_DIM, "sinks", CLATTN_INVALID_ARGUMENT},
    {"sinks_batch", BAD_SINKS_BATCH, "sinks", CLATTN_INVALID_ARGUMENT},
    {"alibi_heads", BAD_ALIBI_HEADS, "alibi", CLATTN_INVALID_ARGUMENT},
    {"alibi_batch", BAD_ALIBI_BATCH, "alibi", CLATTN_INVALID_ARGUMENT},
    {"alibi_dim", BAD_ALIBI_DIM, "alibi", CLATTN_INVALID_ARGUMENT},
    {"alibi_f16", BAD_ALIBI_F16, "alibi", CLATTN_INVALID_ARGUMENT},
    /* sizes past the limits are UNSUPPORTED, as head_dim 257 was (test_bad_input.c) */
    {"head_dim_577", BAD_HEAD_DIM_577, "head_dim", CLATTN_UNSUPPORTED},
    {"head_dim_v_513", BAD_HEAD_DIM_V_513, "head_dim_v", CLATTN_UNSUPPORTED},
    {"head_dim_320_scale0", BAD_HEAD_DIM_320_SCALE0, "scale", CLATTN_INVALID_ARGUMENT},
    {"chunk_negative", BAD_CHUNK_NEG, "chunk", CLATTN_INVALID_ARGUMENT},
    {"score_mod_empty", BAD_SCORE_MOD_EMPTY, "score_mod", CLATTN_INVALID_ARGUMENT},
    {"mask_mod_empty", BAD_MASK_MOD_EMPTY, "mask_mod", CLATTN_INVALID_ARGUMENT},
};

/* A small valid problem (B 2, Hq 4, Hkv 2, Sq 3, Skv 20) spoiled in one way: INVALID_ARGUMENT
 * (UNSUPPORTED for sizes past the limits) on the fused, unfused and scores calls, a message
 * naming the argument, no event, and out, lse and probabilities untouched. */
static void test_refusal(void **state)
{
    const bad_case *bc = *state;
    tu_ctx_get();
    tu_failures = 0;
    int D = 16, Dv = 16;
    if (bc->kind == BAD_HEAD_DIM_577)
        D = Dv = 577;
    if (bc->kind == BAD_HEAD_DIM_V_513)
        D = 576, Dv = 513;
    if (bc->kind == BAD_HEAD_DIM_320_SCALE0)
        D = Dv = 320;
    const int B = 2, Hq = 4, Hkv = 2, Sq = 3, Skv = 20;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(bc->name));
    tu_view q, k, v, sinks, alibi;
    tu_view_init(&q, LAYOUT_BHSD, F32, B, Hq, Sq, D, 0.5);
    tu_view_init(&k, LAYOUT_BHSD, F32, B, Hkv, Skv, D, 0.25);
    tu_view_init(&v, LAYOUT_BHSD, F32, B, Hkv, Skv, Dv, 0.125);
    tu_upload(&q);
    tu_upload(&k);
    tu_upload(&v);
    const int sinks_f16 = bc->kind == BAD_SINKS_F16, alibi_f16 = bc->kind == BAD_ALIBI_F16;
    tu_view_init(&sinks, LAYOUT_BHSD, sinks_f16 ? F16 : F32, bc->kind == BAD_SINKS_BATCH ? B : 1,
                 Hq + (bc->kind == BAD_SINKS_HEADS), 1 + (bc->kind == BAD_SINKS_SEQ), 1 + (bc->kind == BAD_SINKS_DIM),
                 1.0);
    tu_view_init(&alibi, LAYOUT_BHSD, alibi_f16 ? F16 : F32, bc->kind == BAD_ALIBI_BATCH ? B + 1 : 1,
                 Hq - (bc->kind == BAD_ALIBI_HEADS), 1, 1 + (bc->kind == BAD_ALIBI_DIM), 0.5);
    tu_upload(&sinks);
    tu_upload(&alibi);

    clattn_attention_desc d;
    memset(&d, 0, sizeof d);
    d.batch = B;
    d.heads_q = Hq;
    d.heads_kv = Hkv;
    d.seq_q = Sq;
    d.seq_kv = Skv;
    d.head_dim = D;
    d.head_dim_v = Dv;
    d.scale = bc->kind == BAD_HEAD_DIM_320_SCALE0 ? 0.0f : 0.125f;
    switch (bc->kind) {
    case BAD_WINDOW0_LEFT:
        d.window_left = 3;
        break;
    case BAD_WINDOW0_RIGHT:
        d.window_right = -1;
        break;
    case BAD_SOFTCAP_NEG:
        d.softcap = -30.0f;
        break;
    case BAD_CHUNK_NEG:
        d.chunk = -4;
        break;
    case BAD_SCORE_MOD_EMPTY:
        d.score_mod = "";
        break;
    case BAD_MASK_MOD_EMPTY:
        d.mask_mod = "";
        break;
    case BAD_SOFTCAP_NAN:
        d.softcap = NAN;
        break;
    case BAD_SOFTCAP_INF:
        d.softcap = INFINITY;
        break;
    case BAD_SINKS_F16:
    case BAD_SINKS_HEADS:
    case BAD_SINKS_SEQ:
    case BAD_SINKS_DIM:
    case BAD_SINKS_BATCH:
        d.sinks = &sinks.t;
        break;
    case BAD_ALIBI_HEADS:
    case BAD_ALIBI_BATCH:
    case BAD_ALIBI_DIM:
    case BAD_ALIBI_F16:
        d.alibi_slopes = &alibi.t;
        break;
    default:
        break;
    }
    /* clattn_scores ignores sinks and head_dim_v: those refusals are attention's alone. */
    const int ncalls = d.sinks != NULL || bc->kind == BAD_HEAD_DIM_V_513 ? 2 : 3;
    for (int call = 0; call < ncalls; ++call) {
        tu_view out, lse, probs;
        tu_view_init(&out, LAYOUT_BHSD, F32, B, Hq, Sq, call == 2 ? Skv : Dv, 777.0);
        tu_view_init(&lse, LAYOUT_BHSD, F32, B, Hq, Sq, 1, 777.0);
        tu_view_init(&probs, LAYOUT_BHSD, F32, B, Hq, Sq, Skv, 777.0);
        tu_upload(&out);
        tu_upload(&lse);
        tu_upload(&probs);
        d.algorithm = call == 1 ? CLATTN_ALGORITHM_UNFUSED : CLATTN_ALGORITHM_FUSED;
        d.lse = call == 2 ? NULL : &lse.t;
        d.probabilities = call == 1 ? &probs.t : NULL;
        cl_event done = (cl_event)&d; /* must come back NULL */
        const clattn_status st =
            call == 2 ? clattn_scores(tu_ctx, &d, &q.t, &k.t, &out.t, 0, NULL, &done)
                      : clattn_attention(tu_ctx, &d, &q.t, &k.t, &v.t, &out.t, 0, NULL, &done);
        const char *what = call == 0 ? "fused" : call == 1 ? "unfused" : "scores";
        const char *msg = clattn_last_error(tu_ctx);
        const clattn_status want = bc->expected;
        if (st != want) {
            print_error("%s: returned %s, not %s (%s)\n", what, clattn_status_name(st), clattn_status_name(want),
                        msg);
            ++tu_failures;
            if (st == CLATTN_SUCCESS) {
                clReleaseEvent(done);
                tu_finish(tu_ctx);
            }
            continue;
        }
        if (done != NULL) {
            print_error("%s: *done is not NULL after a refusal\n", what);
            ++tu_failures;
        }
        if (msg == NULL || strstr(msg, bc->word) == NULL) {
            print_error("%s: the message does not name %s: \"%s\"\n", what, bc->word, msg ? msg : "(null)");
            ++tu_failures;
        }
        tu_finish(tu_ctx);
        const tu_view *outs[3] = {&out, &lse, &probs};
        for (int o = 0; o < 3; ++o) {
            double *got = tu_xdoubles(outs[o]->n);
            tu_download(what, outs[o], got);
            for (size_t i = 0; i < outs[o]->n; ++i)
                if (got[i] != 777.0) {
                    print_error("%s: output %d written at %zu (%.9g) by a refused call\n", what, o, i, got[i]);
                    ++tu_failures;
                    break;
                }
        }
    }
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* A score_mod that does not compile: BUILD_FAILED with the log, outputs untouched. */
static void test_bad_snippet(void **state)
{
    (void)state;
    tu_ctx_get();
    tu_failures = 0;
    const var_case c = {.name = "bad_snippet", .B = 1, .Hq = 2, .Hkv = 1, .Sq = 3, .Skv = 40, .D = 32, .dt = F32};
    prob p;
    build(&p, &c);
    const char *snippets[2][2] = {
        {"float score_mod(float score, int b, int h, int q, int k) { return score + ; }\n", NULL},
        {NULL, "int mask_mod(int b, int h, int q, int k) { return undefined_name(k); }\n"},
    };
    for (int s = 0; s < 2; ++s)
        for (int alg = 0; alg < (forced_run() ? 1 : 2); ++alg) {
            tu_view out, lse;
            tu_view_init(&out, LAYOUT_BHSD, F32, c.B, c.Hq, c.Sq, c.D, 777.0);
            tu_view_init(&lse, LAYOUT_BHSD, F32, c.B, c.Hq, c.Sq, 1, 777.0);
            tu_upload(&out);
            tu_upload(&lse);
            clattn_attention_desc d;
            describe(&p, &c, alg == 0 ? CLATTN_ALGORITHM_FUSED : CLATTN_ALGORITHM_UNFUSED, &d);
            d.score_mod = snippets[s][0];
            d.mask_mod = snippets[s][1];
            d.lse = &lse.t;
            const clattn_status st = clattn_attention(tu_ctx, &d, &p.q.t, &p.k.t, &p.v.t, &out.t, 0, NULL, NULL);
            const char *what = s == 0 ? "score_mod" : "mask_mod";
            if (st != CLATTN_BUILD_FAILED) {
                print_error("%s (%s): returned %s, not BUILD_FAILED: %s\n", what, alg ? "unfused" : "fused",
                            clattn_status_string(st), clattn_last_error(tu_ctx));
                ++tu_failures;
            } else if (clattn_last_build_log(tu_ctx)[0] == '\0') {
                print_error("%s (%s): BUILD_FAILED with an empty build log\n", what, alg ? "unfused" : "fused");
                ++tu_failures;
            }
            tu_finish(tu_ctx);
            double *got = tu_xdoubles(p.nout), *gl = tu_xdoubles(p.nrow);
            tu_download("out", &out, got);
            tu_download("lse", &lse, gl);
            for (size_t i = 0; i < p.nout; ++i)
                if (got[i] != 777.0 || (i < p.nrow && gl[i] != 777.0)) {
                    print_error("%s: an output was written by a failed call\n", what);
                    ++tu_failures;
                    break;
                }
        }
    /* The context still works after the failed builds. */
    result r = {0};
    run(tu_ctx, &p, &c, CLATTN_ALGORITHM_FUSED, &r);
    check_result(&p, CLATTN_ALGORITHM_FUSED, &r);
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* ============================ the reference itself ============================ */

/* A small random problem on the host (no device): q, k, v doubles, a mask with -inf holes. */
typedef struct host_prob {
    ref_attn a;
    double *q, *k, *v, *mask;
    int kvl[MAX_B];
    size_t nrow, nout, nprob;
} host_prob;

static void host_build(host_prob *h, uint64_t seed, int B, int Hq, int Hkv, int Sq, int Skv, int D)
{
    memset(h, 0, sizeof *h);
    tu_rng rng;
    tu_seed(&rng, seed);
    ref_attn *a = &h->a;
    a->batch = B;
    a->heads_q = Hq;
    a->heads_kv = Hkv;
    a->seq_q = Sq;
    a->seq_kv = Skv;
    a->head_dim = D;
    h->nrow = (size_t)B * (size_t)Hq * (size_t)Sq;
    h->nout = h->nrow * (size_t)D;
    h->nprob = h->nrow * (size_t)Skv;
    const size_t nk = (size_t)B * (size_t)Hkv * (size_t)Skv * (size_t)D;
    h->q = tu_xdoubles(h->nout);
    h->k = tu_xdoubles(nk);
    h->v = tu_xdoubles(nk);
    h->mask = tu_xdoubles(h->nprob);
    for (size_t i = 0; i < h->nout; ++i)
        h->q[i] = tu_uniform(&rng, -2.0, 2.0);
    for (size_t i = 0; i < nk; ++i) {
        h->k[i] = tu_uniform(&rng, -1.0, 1.0);
        h->v[i] = tu_uniform(&rng, -1.0, 1.0);
    }
    for (size_t i = 0; i < h->nprob; ++i)
        h->mask[i] = tu_uniform(&rng, 0.0, 1.0) < 0.15 ? -INFINITY : tu_uniform(&rng, -1.0, 1.0);
    for (int b = 0; b < B; ++b)
        h->kvl[b] = Skv - 3 * b;
}

typedef struct host_res {
    double *out, *lse, *probs, *scores;
} host_res;

static void host_run(const host_prob *h, const ref_attn *a, host_res *r)
{
    r->out = tu_xdoubles(h->nout);
    r->lse = tu_xdoubles(h->nrow);
    r->probs = tu_xdoubles(h->nprob);
    r->scores = tu_xdoubles(h->nprob);
    ref_attention(a, h->q, h->k, h->v, r->out, r->lse, r->probs);
    ref_scores(a, h->q, h->k, r->scores);
}

static int host_same(const host_prob *h, const host_res *x, const host_res *y)
{
    return memcmp(x->out, y->out, h->nout * sizeof(double)) == 0 &&
           memcmp(x->lse, y->lse, h->nrow * sizeof(double)) == 0 &&
           memcmp(x->probs, y->probs, h->nprob * sizeof(double)) == 0;
}

/* Windows, chunks and the mask_mod against their definitions, and their equivalences. */
static void test_ref_visibility(void **state)
{
    (void)state;
    host_prob h;
    host_build(&h, tu_seed_of("ref_visibility"), 2, 4, 2, 9, 13, 8);
    h.a.kv_len = h.kvl;
    h.a.mask = h.mask;
    for (int i = 0; i < 4; ++i)
        h.a.mask_shape[i] = i == 0 ? 2 : i == 1 ? 4 : i == 2 ? 9 : 13;
    host_res causal, win, plain, r;

    /* W >= Skv (right 0) is causal, bit for bit; window_right -1 with left unbounded is plain. */
    ref_attn a = h.a;
    a.causal = 1;
    host_run(&h, &a, &causal);
    a = h.a;
    a.window = 1;
    a.window_left = 13;
    a.window_right = 0;
    host_run(&h, &a, &win);
    assert_true(host_same(&h, &causal, &win));
    a.window_left = -1;
    a.window_right = -1;
    host_run(&h, &a, &r);
    host_run(&h, &h.a, &plain);
    assert_true(host_same(&h, &plain, &r));
    /* window 0 ignores the sides (the API refuses them; the reference just does not look). */
    a.window = 0;
    a.window_left = 2;
    host_run(&h, &a, &r);
    assert_true(host_same(&h, &plain, &r));
    /* mask_mod k <= q is causal, bit for bit. */
    a = h.a;
    a.mask_mod = ref_mask_causal;
    host_run(&h, &a, &r);
    assert_true(host_same(&h, &causal, &r));
    /* A chunk wider than every position is plain. */
    a = h.a;
    a.chunk = 1000;
    host_run(&h, &a, &r);
    assert_true(host_same(&h, &plain, &r));

    /* Visible sets by brute force, from the definitions. */
    const struct {
        int causal, window;
        long long wl, wr, chunk;
    } v[] = {{0, 1, 0, 0, 0}, {0, 1, 3, 1, 0}, {1, 1, -1, 2, 0}, {0, 1, 2, -1, 0}, {0, 0, 0, 0, 4}, {1, 0, 0, 0, 3},
             {0, 1, 1, 1, 5}};
    for (size_t t = 0; t < N_OF(v); ++t) {
        a = h.a;
        a.mask = NULL;
        a.causal = v[t].causal;
        a.window = v[t].window;
        a.window_left = v[t].wl;
        a.window_right = v[t].wr;
        a.chunk = v[t].chunk;
        host_run(&h, &a, &r);
        for (int b = 0; b < 2; ++b) {
            const int L = h.kvl[b];
            for (int hh = 0; hh < 4; ++hh)
                for (int i = 0; i < 9; ++i) {
                    const long long p = i + L - 9;
                    int any = 0;
                    for (int j = 0; j < 13; ++j) {
                        int vis = j < L;
                        if (v[t].causal && j > p)
                            vis = 0;
                        if (v[t].window && v[t].wl >= 0 && j < p - v[t].wl)
                            vis = 0;
                        if (v[t].window && v[t].wr >= 0 && j > p + v[t].wr)
                            vis = 0;
                        if (v[t].chunk > 0) {
                            /* floor by hand: p + 1000·chunk is positive */
                            const long long off = 1000 * v[t].chunk;
                            if ((j + off) / v[t].chunk != (p + off) / v[t].chunk)
                                vis = 0;
                        }
                        any |= vis;
                        const double s = r.scores[(((size_t)b * 4 + (size_t)hh) * 9 + (size_t)i) * 13 + (size_t)j];
                        if (vis != (s != -INFINITY))
                            fail_msg("rule %zu: b %d h %d i %d (p %lld) key %d: visible %d, score %g", t, b, hh, i,
                                     p, j, vis, s);
                    }
                    const size_t row = ((size_t)b * 4 + (size_t)hh) * 9 + (size_t)i;
                    if (!any) {
                        assert_true(r.lse[row] == -INFINITY);
                        for (int d = 0; d < 8; ++d)
                            assert_true(r.out[row * 8 + (size_t)d] == 0.0);
                    }
                }
        }
    }
}

/* Sinks: -inf is none, bit for bit; a hand-computed row; splitting the keys with the sink in
 * one part and merging is the whole; an empty row gives the sink. */
static void test_ref_sinks(void **state)
{
    (void)state;
    host_prob h;
    host_build(&h, tu_seed_of("ref_sinks"), 2, 4, 2, 5, 11, 8);
    h.a.kv_len = h.kvl;
    h.a.causal = 1;
    host_res plain, r;
    host_run(&h, &h.a, &plain);
    double none[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    ref_attn a = h.a;
    a.sinks = none;
    host_run(&h, &a, &r);
    assert_true(host_same(&h, &plain, &r));

    /* By hand: row (b 0, h 2, i 4) sees keys 0..p with p = 4 + 11 - 5 = 10. */
    double sk[4] = {0.5, -INFINITY, 2.0, -1.0};
    a.sinks = sk;
    host_run(&h, &a, &r);
    {
        const size_t row = (0 * 4 + 2) * 5 + 4;
        const double *qr = h.q + row * 8;
        double num[8] = {0}, den = exp(sk[2]), l;
        for (int j = 0; j <= 10; ++j) {
            const double *kr = h.k + ((size_t)(0 * 2 + 1) * 11 + (size_t)j) * 8;
            const double *vr = h.v + ((size_t)(0 * 2 + 1) * 11 + (size_t)j) * 8;
            double x = 0.0;
            for (int d = 0; d < 8; ++d)
                x += qr[d] * kr[d];
            x /= sqrt(8.0);
            den += exp(x);
            for (int d = 0; d < 8; ++d)
                num[d] += exp(x) * vr[d];
        }
        l = log(den);
        assert_true(fabs(r.lse[row] - l) < 1e-12 * (1 + fabs(l)));
        double psum = 0.0;
        for (int j = 0; j < 11; ++j)
            psum += r.probs[row * 11 + (size_t)j];
        assert_true(fabs(psum + exp(sk[2] - l) - 1.0) < 1e-12);
        for (int d = 0; d < 8; ++d)
            assert_true(fabs(r.out[row * 8 + (size_t)d] - num[d] / den) < 1e-12);
    }

    /* Empty rows: batch 1 with no key gives out 0 and lse = the sink (-inf for head 1). */
    int kz[2] = {11, 0};
    a.kv_len = kz;
    host_run(&h, &a, &r);
    for (int hh = 0; hh < 4; ++hh)
        for (int i = 0; i < 5; ++i) {
            const size_t row = ((size_t)1 * 4 + (size_t)hh) * 5 + (size_t)i;
            assert_true(r.lse[row] == sk[hh]);
            for (int d = 0; d < 8; ++d)
                assert_true(r.out[row * 8 + (size_t)d] == 0.0);
        }

    /* Split at key 4 (no causal: a part's positions would move), the sinks in part 0; ref_merge of
     * the parts is the whole. The parts are computed on copies of K and V holding their keys. */
    a = h.a;
    a.causal = 0;
    a.kv_len = NULL;
    a.sinks = sk;
    host_res whole;
    host_run(&h, &a, &whole);
    const int cut = 4;
    double *po[2], *pl[2];
    for (int part = 0; part < 2; ++part) {
        const int lo = part ? cut : 0, n = part ? 11 - cut : cut;
        double *kk = tu_xdoubles((size_t)2 * 2 * (size_t)n * 8), *vv = tu_xdoubles((size_t)2 * 2 * (size_t)n * 8);
        for (int bg = 0; bg < 4; ++bg)
            for (int j = 0; j < n; ++j)
                for (int d = 0; d < 8; ++d) {
                    kk[((size_t)bg * (size_t)n + (size_t)j) * 8 + (size_t)d] =
                        h.k[((size_t)bg * 11 + (size_t)(lo + j)) * 8 + (size_t)d];
                    vv[((size_t)bg * (size_t)n + (size_t)j) * 8 + (size_t)d] =
                        h.v[((size_t)bg * 11 + (size_t)(lo + j)) * 8 + (size_t)d];
                }
        ref_attn ap = a;
        ap.seq_kv = n;
        ap.sinks = part == 0 ? sk : NULL;
        po[part] = tu_xdoubles(h.nout);
        pl[part] = tu_xdoubles(h.nrow);
        ref_attention(&ap, h.q, kk, vv, po[part], pl[part], NULL);
    }
    double *mo = tu_xdoubles(h.nout), *ml = tu_xdoubles(h.nrow);
    const double *cpo[2] = {po[0], po[1]}, *cpl[2] = {pl[0], pl[1]};
    ref_merge(2, (int)h.nrow, 8, cpo, cpl, mo, ml);
    tu_assert_allclose("merged parts vs whole", mo, whole.out, h.nout, 1e-12, 1e-12);
    tu_assert_allclose("merged lse vs whole", ml, whole.lse, h.nrow, 1e-12, 1e-12);
}

/* Softcap, mask, ALiBi and score_mod in the contract's order (DESIGN.md), on one key, by hand. */
static void test_ref_logits(void **state)
{
    (void)state;
    host_prob h;
    host_build(&h, tu_seed_of("ref_logits"), 2, 4, 2, 5, 11, 8);
    h.a.kv_len = h.kvl;
    h.a.mask = h.mask;
    h.a.mask_shape[0] = 2;
    h.a.mask_shape[1] = 4;
    h.a.mask_shape[2] = 5;
    h.a.mask_shape[3] = 11;
    double slopes[8];
    ref_alibi_slopes(4, 8.0, slopes);
    assert_true(slopes[0] == 0.25 && slopes[3] == 1.0 / 256.0);
    ref_alibi_slopes(6, 8.0, slopes); /* n 4: m0 = 1/4, m1 = 1/2: 1/4 .. 1/256, then 1/2, 1/8 */
    assert_true(slopes[3] == 1.0 / 256.0 && slopes[4] == 0.5 && slopes[5] == 0.125);
    for (int i = 0; i < 8; ++i)
        slopes[i] = 0.1 * (i + 1);
    ref_attn a = h.a;
    a.softcap = 3.0;
    a.score_mod = ref_score_mix;
    a.alibi = slopes;
    a.alibi_per_batch = 1;
    host_res r;
    host_run(&h, &a, &r);
    size_t checked = 0;
    for (int b = 0; b < 2; ++b)
        for (int hh = 0; hh < 4; ++hh)
            for (int i = 0; i < 5; ++i)
                for (int j = 0; j < 11; ++j) {
                    const size_t row = ((size_t)b * 4 + (size_t)hh) * 5 + (size_t)i;
                    const double m = h.mask[row * 11 + (size_t)j], got = r.scores[row * 11 + (size_t)j];
                    const long long p = i + h.kvl[b] - 5;
                    if (j >= h.kvl[b] || m == -INFINITY) {
                        assert_true(got == -INFINITY);
                        continue;
                    }
                    double x = 0.0;
                    for (int d = 0; d < 8; ++d)
                        x += h.q[row * 8 + (size_t)d] *
                             h.k[((size_t)(b * 2 + hh / 2) * 11 + (size_t)j) * 8 + (size_t)d];
                    x = 3.0 * tanh(x / sqrt(8.0) / 3.0);
                    x += m - slopes[b * 4 + hh] * (double)llabs(p - j);
                    x = ref_score_mix(x, b, hh, p, j, NULL);
                    assert_true(fabs(got - x) < 1e-12);
                    checked++;
                }
    assert_true(checked > 100);
    /* A cap of 1 with a -inf mask: masked keys have probability 0. */
    a = h.a;
    a.softcap = 1.0;
    host_run(&h, &a, &r);
    for (size_t i = 0; i < h.nprob; ++i)
        if (h.mask[i] == -INFINITY)
            assert_true(r.probs[i] == 0.0);
}

/* =============================== registration =============================== */

int main(void)
{
    const int forced = forced_run();
    const int decode_only = tu_getenv_int("CLATTN_TEST_DECODE_ONLY", 0) != 0;
    tu_set_fixtures(NULL, tu_teardown);
    for (size_t i = 0; i < N_OF(cases); ++i) {
        if (decode_only && cases[i].Sq > 16)
            continue;
        if (forced && !cases[i].gpu)
            continue;
        tu_add_test("attention", cases[i].name, test_case, &cases[i]);
    }
    for (size_t i = 0; i < N_OF(split_cases); ++i)
        if (!forced || split_cases[i].gpu)
            tu_add_test("splits", split_cases[i].name, test_splits, &split_cases[i]);
    /* The merge takes the parts whatever kernel made them: once with the CPU kernels, once tiled. */
    if (!forced || !decode_only)
        tu_add_test("merge", "sinks_two_parts", test_merge_sinks, NULL);
    if (!forced) {
        tu_add_test("mods", "bad_snippet", test_bad_snippet, NULL);
        tu_add_test("scores", "ignores_sinks", test_scores_ignores_sinks, NULL);
        tu_add_test("alibi", "slopes", test_alibi_slopes, NULL);
        TU_ADD_TABLE("refuse", test_refusal, bad_cases);
        tu_add_test("reference", "visibility", test_ref_visibility, NULL);
        tu_add_test("reference", "sinks", test_ref_sinks, NULL);
        tu_add_test("reference", "logits", test_ref_logits, NULL);
    }
    const int failed = tu_run_tests("variants");
    clattn_release(tu_ctx);
    return failed;
}
