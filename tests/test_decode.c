/*
 * Decode-shaped attention (seq_q 1, 4, 16 against up to 10^6 keys) and clattn_merge.
 *
 * Decode rows run fused (flash-decoding: key splits merged on the device) and unfused, each against
 * the float64 reference on exactly the stored inputs, and against each other. Merge rows split the
 * keys into disjoint ranges, compute each range with clattn_attention on K/V sub-views (offset
 * a·seq_stride, seq = b - a) asking for lse, merge the parts with clattn_merge and compare with
 * ref_merge on the very parts (the merge alone), with ref_attention over all keys, and with a
 * whole-range clattn_attention. A part with an empty range is a part computed with kv_lengths 0
 * (lse all -inf, its output then overwritten with NaN: it must contribute nothing), and a part
 * whose row holds NaN, or whose lse is +inf, must make that merged row NaN, whatever the other parts
 * hold.
 *
 * Tolerances as in test_attention.c: f32 out atol 2e-5, rtol 1e-4; lse atol 1e-5, rtol 4e-6; the
 * relative ones (and lse's atol) grow by sqrt(seq_kv / 4096) past 4096 keys, since the softmax
 * denominator is an fp32 sum of seq_kv positive terms. f16 storage: atol 2^-10, rtol 2^-11; bf16:
 * atol 2^-7, rtol 2^-8 (half an ulp of |out| <= 1, doubled). The merge alone is a handful of fp32
 * operations per element: atol and rtol 1e-6 plus the output's storage rounding; with one part it
 * is an exact copy.
 */
#include "testutil.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

#define F32 CLATTN_F32
#define F16 CLATTN_F16
#define BF16 CLATTN_BF16

enum { ALG_FUSED = 1, ALG_UNFUSED = 2 };

typedef struct dec_case {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D;
    clattn_dtype dt;
    int causal;
    int has_kv;
    int kv[4];
    tu_layout layout;
    unsigned algos; /* 0: fused and unfused */
} dec_case;

/* clang-format off */
static const dec_case dec_cases[] = {
    {"q1_kv1", 1, 1, 1, 1, 1, 64, F32, .causal = 0},
    {"q1_kv17", 2, 2, 2, 1, 17, 64, F32, .causal = 0},
    {"q1_kv1000", 2, 4, 4, 1, 1000, 64, F32, .causal = 0},
    {"q1_kv8192_hd128", 1, 4, 4, 1, 8192, 128, F32, .causal = 0},
    {"q1_kv100000", 1, 2, 2, 1, 100000, 64, F32, .causal = 0},
    {"q1_kv1000000", 1, 1, 1, 1, 1000000, 64, F32, .causal = 0},
    {"q4_kv17", 2, 2, 2, 4, 17, 64, F32, .causal = 0},
    {"q4_kv1000", 2, 2, 2, 4, 1000, 64, F32, .causal = 0},
    {"q4_kv100000", 1, 1, 1, 4, 100000, 64, F32, .causal = 0},
    {"q16_kv1", 1, 2, 2, 16, 1, 64, F32, .causal = 0},
    {"q16_kv8192", 1, 2, 2, 16, 8192, 64, F32, .causal = 0},

    /* grouped-query decode: the group's rows share one K/V stream */
    {"gqa8to1_q1_kv1000", 2, 8, 1, 1, 1000, 64, F32, .causal = 0},
    {"gqa8to1_q4_kv8192", 1, 8, 1, 4, 8192, 64, F32, .causal = 1},
    {"gqa32to8_q1_kv8192", 1, 32, 8, 1, 8192, 128, F32, .causal = 0},
    {"gqa32to8_q16_kv1000", 1, 32, 8, 16, 1000, 64, F32, .causal = 1},

    /* kv_lengths per batch, including 0 and seq_kv */
    {"kvlen_q1", 4, 4, 2, 1, 1000, 64, F32, .has_kv = 1, .kv = {0, 1, 517, 1000}},
    {"kvlen_q4_causal", 4, 2, 2, 4, 1000, 64, F32, .causal = 1, .has_kv = 1, .kv = {1000, 0, 2, 333}},
    {"kvlen_q16_causal", 4, 2, 1, 16, 1000, 64, F32, .causal = 1, .has_kv = 1, .kv = {10, 1000, 0, 999}},
    {"kvlen_q1_kv100000", 4, 2, 2, 1, 100000, 64, F32, .has_kv = 1, .kv = {100000, 0, 65537, 4097}},

    /* causal decode: seq_q < seq_kv, bottom-right aligned */
    {"causal_q4_kv1000", 2, 2, 2, 4, 1000, 64, F32, .causal = 1},
    {"causal_q4_kv4", 2, 2, 2, 4, 4, 64, F32, .causal = 1},
    {"causal_q16_kv8", 1, 2, 2, 16, 8, 64, F32, .causal = 1}, /* rows 0..7 see nothing */

    /* f16 / bf16 storage, BSHD caches */
    {"f16_q1_kv8192", 2, 4, 4, 1, 8192, 64, F16, .causal = 0},
    {"f16_gqa8to1_q1_kv100000", 1, 8, 1, 1, 100000, 64, F16, .causal = 0},
    {"f16_kvlen_causal_q4", 4, 4, 2, 4, 1000, 128, F16, .causal = 1, .has_kv = 1, .kv = {0, 1000, 4, 3}},
    {"bf16_q1_kv1000", 2, 4, 2, 1, 1000, 64, BF16, .causal = 0},
    {"bshd_q1_kv1000", 2, 4, 2, 1, 1000, 64, F32, .layout = LAYOUT_BSHD},
    {"bshd_f16_q4_kv8192", 1, 8, 2, 4, 8192, 64, F16, .causal = 1, .layout = LAYOUT_BSHD},
};

typedef struct merge_case {
    const char *name;
    int B, H, Hkv, Sq, Skv, D;
    clattn_dtype dt;     /* q, k, v and the parts */
    clattn_dtype out_dt; /* the merged output */
    int nparts;          /* key ranges */
    int cuts[9];         /* cuts[0] = 0 < ... < cuts[nparts] = Skv; all 0: an even split */
    int empty_at;        /* > 0: an extra part with lse all -inf (kv_lengths 0) at index empty_at - 1 */
    int batch0_empty;    /* every part and the whole run with kv_lengths {0, big}: batch 0 rows empty */
    int mask;            /* an f32 mask [B][H][Sq][Skv]; each part reads its column range */
    int no_lse;          /* merge without an lse output */
    int nan_row0;        /* part 0's row 0 overwritten: out NaN and lse NaN (1) or -3000, a weight
                          * that underflows to 0 (2), or only its lse, with +inf (3): merged row 0
                          * must be NaN in every case; or only its out's column 1 NaN (4): the
                          * merged row's column 1 NaN, the rest and the lse finite */
} merge_case;

static const merge_case merge_cases[] = {
    {"two_even", 1, 2, 2, 4, 1000, 64, F32, F32, 2, .mask = 0},
    {"three_uneven", 2, 2, 1, 4, 1000, 64, F32, F32, 3, {0, 1, 500, 1000}, .mask = 0},
    {"eight_gqa", 1, 8, 2, 16, 1024, 64, F32, F32, 8, .mask = 0},
    {"four_with_empty", 1, 2, 2, 4, 1000, 64, F32, F32, 4, .empty_at = 3},
    {"two_empty_first", 1, 2, 2, 4, 300, 64, F32, F32, 2, .empty_at = 1},
    {"three_batch0_empty", 2, 2, 2, 4, 600, 64, F32, F32, 3, .batch0_empty = 1},
    {"one_copies", 2, 2, 2, 4, 300, 64, F32, F32, 1, .mask = 0},
    {"one_copies_into_f16", 2, 2, 2, 4, 300, 64, F32, F16, 1, .mask = 0},
    {"three_into_f16", 1, 4, 2, 4, 1000, 64, F32, F16, 3, .mask = 0},
    {"four_f16_parts_f16_out", 1, 4, 2, 4, 1000, 64, F16, F16, 4, .empty_at = 2},
    {"three_into_bf16", 1, 2, 2, 4, 1000, 40, F32, BF16, 3, .mask = 0},
    {"two_mask", 2, 2, 2, 7, 500, 64, F32, F32, 2, {0, 123, 500}, .mask = 1},
    {"five_no_lse", 1, 2, 2, 4, 1000, 64, F32, F32, 5, .no_lse = 1},
    {"six_decode_kv100000", 1, 4, 1, 1, 100000, 64, F32, F32, 6, .mask = 0},
    {"nan_part_three", 1, 2, 2, 4, 300, 64, F32, F32, 3, .nan_row0 = 1},
    {"nan_part_with_empty", 1, 2, 2, 4, 300, 64, F32, F32, 1, .empty_at = 2, .nan_row0 = 1},
    {"one_copies_nan", 1, 2, 2, 4, 300, 64, F32, F32, 1, .nan_row0 = 1},
    {"nan_part_weight_0", 1, 2, 2, 4, 300, 64, F32, F32, 3, .nan_row0 = 2},
    {"nan_part_weight_0_f16", 1, 2, 2, 4, 300, 64, F16, F16, 2, .nan_row0 = 2},
    {"inf_lse_three", 1, 2, 2, 4, 300, 64, F32, F32, 3, .nan_row0 = 3},
    {"inf_lse_one", 1, 2, 2, 4, 300, 64, F32, F32, 1, .nan_row0 = 3},
    {"nan_column_three", 1, 2, 2, 4, 300, 64, F32, F32, 3, .nan_row0 = 4},
    {"nan_column_two_bf16", 1, 2, 2, 4, 300, 64, BF16, BF16, 2, .nan_row0 = 4},
    /* 40002 rows: more than the 32768 the merge grid puts in y, so rows also go in z */
    {"two_rows_40002", 1, 2, 2, 20001, 64, 8, F32, F32, 2, .mask = 0},
};
/* clang-format on */

typedef struct result {
    double *out, *lse, *probs;
} result;

/* =============================== shared pieces =============================== */

typedef struct qkv {
    tu_view q, k, v;
    double *xq, *xk, *xv;
    double scale; /* 1/sqrt(D) as the device resolves it (in float) */
} qkv;

/* q uniform in [-qa, qa] with qa = 6 (scaled logits of standard deviation ~2), k and v in [-1, 1]. */
static void make_qkv(qkv *t, const char *name, tu_layout lay, clattn_dtype dt, int B, int Hq, int Hkv, int Sq,
                     int Skv, int D)
{
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(name));
    const size_t esz = clattn_dtype_size(dt);
    t->scale = (double)(float)(1.0 / sqrt((double)D));
    tu_view_init(&t->q, lay, dt, B, Hq, Sq, D, NAN);
    tu_view_init(&t->k, lay, dt, B, Hkv, Skv, D, NAN);
    tu_view_init(&t->v, lay, dt, B, Hkv, Skv, D, NAN);
    tu_view *vs[3] = {&t->q, &t->k, &t->v};
    double **xs[3] = {&t->xq, &t->xk, &t->xv};
    for (int i = 0; i < 3; ++i) {
        void *typed = malloc(vs[i]->n * esz); /* freed at once: the big K/V images are not kept twice */
        assert_non_null(typed);
        *xs[i] = tu_xdoubles(vs[i]->n);
        tu_fill(&rng, dt, typed, *xs[i], vs[i]->n, i == 0 ? -6.0 : -1.0, i == 0 ? 6.0 : 1.0);
        tu_scatter(vs[i], typed);
        free(typed);
        tu_upload(vs[i]);
    }
}

typedef struct tols {
    double out_atol, out_rtol, lse_atol, lse_rtol;
} tols;

static tols attention_tols(int Skv, clattn_dtype dt)
{
    const double g = Skv > 4096 ? sqrt(Skv / 4096.0) : 1.0;
    tols t = {2e-5, 1e-4 * g, 1e-5 * g, 4e-6};
    if (dt == F16) {
        t.out_atol += 0x1p-10;
        t.out_rtol = 0x1p-11;
    } else if (dt == BF16) {
        t.out_atol += 0x1p-7;
        t.out_rtol = 0x1p-8;
    }
    return t;
}

static void check_exact_zeros(const char *what, const double *ref_lse, const double *out, size_t nrow, size_t dv)
{
    size_t bad = 0, first = 0;
    for (size_t r = 0; r < nrow; ++r)
        if (ref_lse[r] == -INFINITY)
            for (size_t d = 0; d < dv; ++d)
                if (out[r * dv + d] != 0.0 && bad++ == 0)
                    first = r * dv + d;
    if (bad != 0) {
        print_error("%s: %zu elements of rows without a visible key are not exactly 0, first at %zu: %.9g\n", what,
                    bad, first, out[first]);
        ++tu_failures;
    }
}

static const char *alg_name(clattn_algorithm a)
{
    return a == CLATTN_ALGORITHM_FUSED ? "fused" : a == CLATTN_ALGORITHM_UNFUSED ? "unfused" : "auto";
}

static void attention_or_fail(const clattn_attention_desc *desc, const clattn_tensor *q, const clattn_tensor *k,
                              const clattn_tensor *v, const clattn_tensor *out)
{
    cl_event done = NULL;
    const clattn_status st = clattn_attention(tu_ctx, desc, q, k, v, out, 0, NULL, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("%s clattn_attention returned %s: %s", alg_name(desc->algorithm), clattn_status_string(st),
                 clattn_last_error(tu_ctx));
    assert_non_null(done);
    clReleaseEvent(done);
}

/* =============================== decode =============================== */

static void test_decode(void **state)
{
    const dec_case *c = *state;
    tu_ctx_get();
    tu_failures = 0;
    qkv t;
    make_qkv(&t, c->name, c->layout, c->dt, c->B, c->Hq, c->Hkv, c->Sq, c->Skv, c->D);
    int kvl[4] = {0, 0, 0, 0};
    for (int b = 0; b < c->B; ++b)
        kvl[b] = c->kv[b];
    cl_mem kv_buf = c->has_kv ? tu_xbuffer(sizeof(int) * (size_t)c->B, kvl) : NULL;

    const size_t nrow = (size_t)c->B * (size_t)c->Hq * (size_t)c->Sq, nout = nrow * (size_t)c->D;
    ref_attn a;
    memset(&a, 0, sizeof a);
    a.batch = c->B;
    a.heads_q = c->Hq;
    a.heads_kv = c->Hkv;
    a.seq_q = c->Sq;
    a.seq_kv = c->Skv;
    a.head_dim = c->D;
    a.scale = t.scale;
    a.causal = c->causal;
    a.kv_len = c->has_kv ? kvl : NULL;
    double *ref_out = tu_xdoubles(nout), *ref_lse = tu_xdoubles(nrow);
    ref_attention(&a, t.xq, t.xk, t.xv, ref_out, ref_lse, NULL);

    const tols tl = attention_tols(c->Skv, c->dt);
    const unsigned algos = c->algos != 0 ? c->algos : (ALG_FUSED | ALG_UNFUSED);
    double *got_out[2] = {NULL, NULL}, *got_lse[2] = {NULL, NULL};
    for (int ai = 0; ai < 2; ++ai) {
        if (!(algos & (1u << ai)))
            continue;
        const clattn_algorithm alg = ai == 0 ? CLATTN_ALGORITHM_FUSED : CLATTN_ALGORITHM_UNFUSED;
        tu_view out, lse;
        tu_view_init(&out, c->layout, c->dt, c->B, c->Hq, c->Sq, c->D, 777.0);
        tu_view_init(&lse, c->layout, F32, c->B, c->Hq, c->Sq, 1, 777.0);
        tu_upload(&out);
        tu_upload(&lse);
        clattn_attention_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.batch = c->B;
        desc.heads_q = c->Hq;
        desc.heads_kv = c->Hkv;
        desc.seq_q = c->Sq;
        desc.seq_kv = c->Skv;
        desc.head_dim = c->D;
        desc.causal = c->causal;
        desc.kv_lengths = kv_buf;
        desc.lse = &lse.t;
        desc.algorithm = alg;
        attention_or_fail(&desc, &t.q.t, &t.k.t, &t.v.t, &out.t);
        tu_finish(tu_ctx);
        got_out[ai] = tu_xdoubles(nout);
        got_lse[ai] = tu_xdoubles(nrow);
        char what[96];
        snprintf(what, sizeof what, "%s out", alg_name(alg));
        tu_download(what, &out, got_out[ai]);
        snprintf(what, sizeof what, "%s lse", alg_name(alg));
        tu_download(what, &lse, got_lse[ai]);
        snprintf(what, sizeof what, "%s out vs reference", alg_name(alg));
        tu_check_close(what, got_out[ai], ref_out, nout, tl.out_atol, tl.out_rtol);
        snprintf(what, sizeof what, "%s lse vs reference", alg_name(alg));
        tu_check_close(what, got_lse[ai], ref_lse, nrow, tl.lse_atol, tl.lse_rtol);
        check_exact_zeros(alg_name(alg), ref_lse, got_out[ai], nrow, (size_t)c->D);
    }
    if (got_out[0] != NULL && got_out[1] != NULL) {
        /* fp32 error plus one storage ulp: each path rounds its own fp32 result once. */
        const tols t32 = attention_tols(c->Skv, F32);
        const double rtol = c->dt == F16 ? 0x1p-10 : c->dt == BF16 ? 0x1p-7 : t32.out_rtol;
        /* On the matrix units (CLATTN_MATRIX=emulate, or a device with them) the fused path rounds
         * each weight to a 16-bit input type first: half its ulp of the largest |V| (1 here) more
         * (docs/numerics.md). */
        const int matrix = strncmp(clattn_matrix_report(tu_ctx), "none", 4) != 0;
        const double mtol = !matrix ? 0.0 : c->dt == F16 ? 0x1p-11 : c->dt == BF16 ? 0x1p-8 : 0.0;
        tu_check_close("fused vs unfused out", got_out[0], got_out[1], nout, t32.out_atol + mtol, rtol);
        tu_check_close("fused vs unfused lse", got_lse[0], got_lse[1], nrow, 2 * t32.lse_atol, 2 * t32.lse_rtol);
    }
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* =============================== merge =============================== */

/* A [B][H][S][D] contiguous view of `buf` from element `offset`. */
static clattn_tensor sub_bhsd(cl_mem buf, clattn_dtype dt, int64_t offset, int B, int H, int S, int D)
{
    clattn_tensor t = clattn_tensor_bhsd(buf, dt, B, H, S, D);
    t.offset = offset;
    return t;
}

static void test_merge(void **state)
{
    const merge_case *m = *state;
    tu_ctx_get();
    tu_failures = 0;
    const int B = m->B, H = m->H, Sq = m->Sq, Skv = m->Skv, D = m->D;
    qkv t;
    make_qkv(&t, m->name, LAYOUT_BHSD, m->dt, B, H, m->Hkv, Sq, Skv, D);

    /* Optional mask: uniform [-2, 2] with ~10% -inf. */
    tu_view mask;
    double *xm = NULL;
    memset(&mask, 0, sizeof mask);
    if (m->mask) {
        tu_rng rng;
        tu_seed(&rng, tu_seed_of(m->name) ^ 1u);
        tu_view_init(&mask, LAYOUT_BHSD, F32, B, H, Sq, Skv, NAN);
        float *tm = tu_xalloc(mask.n * sizeof(float));
        xm = tu_xdoubles(mask.n);
        tu_fill(&rng, F32, tm, xm, mask.n, -2.0, 2.0);
        for (size_t i = 0; i < mask.n; ++i)
            if (tu_uniform(&rng, 0.0, 1.0) < 0.1)
                tu_put(F32, tm, xm, i, -INFINITY);
        tu_scatter(&mask, tm);
        tu_upload(&mask);
    }

    /* kv_lengths: all 0 for the empty part; {0, big, ...} for batch0_empty (clamped per part). */
    const int zeros[4] = {0, 0, 0, 0}, b0[4] = {0, INT32_MAX, INT32_MAX, INT32_MAX};
    cl_mem kv_zero = tu_xbuffer(sizeof zeros, zeros);
    cl_mem kv_b0 = m->batch0_empty ? tu_xbuffer(sizeof b0, b0) : NULL;

    int cuts[10];
    for (int i = 0; i <= m->nparts; ++i)
        cuts[i] = m->cuts[m->nparts] != 0 ? m->cuts[i] : (int)((long)i * Skv / m->nparts);
    const int P = m->nparts + (m->empty_at > 0);
    const int empty = m->empty_at - 1; /* -1: none */

    const size_t nrow = (size_t)B * (size_t)H * (size_t)Sq, nout = nrow * (size_t)D;
    const size_t esz = clattn_dtype_size(m->dt);
    tu_view parts, plse; /* P parts laid end to end: [P·B][H][Sq][D] and [P·B][H][Sq][1] */
    tu_view_init(&parts, LAYOUT_BHSD, m->dt, P * B, H, Sq, D, 777.0);
    tu_view_init(&plse, LAYOUT_BHSD, F32, P * B, H, Sq, 1, 777.0);
    tu_upload(&parts);
    tu_upload(&plse);
    clattn_tensor part_out[9], part_lse[9];
    for (int p = 0, r = 0; p < P; ++p) {
        part_out[p] = sub_bhsd(parts.t.buffer, m->dt, (int64_t)((size_t)p * nout), B, H, Sq, D);
        part_lse[p] = sub_bhsd(plse.t.buffer, F32, (int64_t)((size_t)p * nrow), B, H, Sq, 1);
        clattn_attention_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.batch = B;
        desc.heads_q = H;
        desc.heads_kv = m->Hkv;
        desc.seq_q = Sq;
        desc.head_dim = D;
        desc.lse = &part_lse[p];
        desc.algorithm = p % 2 ? CLATTN_ALGORITHM_UNFUSED : CLATTN_ALGORITHM_FUSED;
        clattn_tensor k = t.k.t, v = t.v.t, mk = mask.t;
        if (p == empty) {
            desc.seq_kv = Skv;
            desc.kv_lengths = kv_zero;
        } else {
            const int lo = cuts[r], hi = cuts[r + 1];
            ++r;
            desc.seq_kv = hi - lo;
            desc.kv_lengths = kv_b0;
            k.offset += lo * k.stride[2];
            k.shape[2] = hi - lo;
            v.offset += lo * v.stride[2];
            v.shape[2] = hi - lo;
            mk.offset += lo; /* the mask's key dimension is the contiguous one */
            mk.shape[3] = hi - lo;
        }
        desc.mask = m->mask ? &mk : NULL;
        attention_or_fail(&desc, &t.q.t, &k, &v, &part_out[p]);
    }
    tu_finish(tu_ctx);
    if (empty >= 0) {
        /* The empty part's output must not matter at all: make it NaN. */
        void *nan_img = tu_xalloc(nout * esz);
        for (size_t i = 0; i < nout; ++i)
            tu_store(m->dt, nan_img, i, NAN);
        assert_int_equal(clEnqueueWriteBuffer(clattn_queue(tu_ctx), parts.t.buffer, CL_TRUE,
                                              (size_t)empty * nout * esz, nout * esz, nan_img, 0, NULL, NULL),
                         CL_SUCCESS);
    }
    if (m->nan_row0) {
        /* NaN in a part propagates to its row, whatever the other parts hold (-inf included), and
         * whatever its weight, 0 included (a part with keys is multiplied, as in the reference).
         * An lse of +inf, which no attention produces, has no finite weight: NaN too. */
        void *nan_img = tu_xalloc((size_t)D * esz);
        for (size_t i = 0; i < (size_t)D; ++i)
            tu_store(m->dt, nan_img, i, NAN);
        const float nanf = m->nan_row0 == 2 ? -3000.0f : m->nan_row0 == 3 ? INFINITY : NAN;
        if (m->nan_row0 == 4)
            assert_int_equal(clEnqueueWriteBuffer(clattn_queue(tu_ctx), parts.t.buffer, CL_TRUE, esz, esz, nan_img, 0,
                                                  NULL, NULL),
                             CL_SUCCESS);
        else if (m->nan_row0 != 3)
            assert_int_equal(clEnqueueWriteBuffer(clattn_queue(tu_ctx), parts.t.buffer, CL_TRUE, 0,
                                                  (size_t)D * esz, nan_img, 0, NULL, NULL),
                             CL_SUCCESS);
        if (m->nan_row0 != 4)
            assert_int_equal(clEnqueueWriteBuffer(clattn_queue(tu_ctx), plse.t.buffer, CL_TRUE, 0, sizeof nanf,
                                                  &nanf, 0, NULL, NULL),
                             CL_SUCCESS);
    }
    double *all_out = tu_xdoubles((size_t)P * nout), *all_lse = tu_xdoubles((size_t)P * nrow);
    tu_download("part out", &parts, all_out);
    tu_download("part lse", &plse, all_lse);
    const double *po[9], *pl[9];
    for (int p = 0; p < P; ++p) {
        po[p] = all_out + (size_t)p * nout;
        pl[p] = all_lse + (size_t)p * nrow;
    }
    if (empty >= 0)
        for (size_t r = 0; r < nrow; ++r)
            assert_true(pl[empty][r] == -INFINITY);

    /* Merge. */
    tu_view out, lse;
    tu_view_init(&out, LAYOUT_BHSD, m->out_dt, B, H, Sq, D, 777.0);
    tu_view_init(&lse, LAYOUT_BHSD, F32, B, H, Sq, 1, 777.0);
    tu_upload(&out);
    tu_upload(&lse);
    cl_event done = NULL;
    const clattn_status st =
        clattn_merge(tu_ctx, P, part_out, part_lse, &out.t, m->no_lse ? NULL : &lse.t, 0, NULL, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_merge returned %s: %s", clattn_status_string(st), clattn_last_error(tu_ctx));
    assert_non_null(done);
    clReleaseEvent(done);
    tu_finish(tu_ctx);
    double *got = tu_xdoubles(nout), *got_lse = tu_xdoubles(nrow);
    tu_download("merged out", &out, got);
    tu_download("merged lse", &lse, got_lse); /* with no_lse: checks that nothing was written */

    /* 1. The merge alone, on exactly the parts it was given. */
    double *want = tu_xdoubles(nout), *want_lse = tu_xdoubles(nrow);
    ref_merge(P, (int)nrow, D, po, pl, want, want_lse);
    double atol = 1e-6, rtol = 1e-6;
    if (m->out_dt == F16) {
        atol += 0x1p-25;
        rtol += 0x1p-11;
    } else if (m->out_dt == BF16) {
        rtol += 0x1p-8;
    }
    if (P == 1) {
        /* One part: an exact copy, rounded once to the output type; but for a row whose lse is
         * +inf, NaN as with more parts (ref_merge's row). */
        for (size_t i = m->nan_row0 == 3 ? (size_t)D : 0; i < nout; ++i) {
            uint32_t tmp;
            tu_store(m->out_dt, &tmp, 0, po[0][i]);
            want[i] = tu_load(m->out_dt, &tmp, 0);
        }
        atol = rtol = 0.0;
    }
    tu_check_close("merge vs ref_merge of the parts", got, want, nout, atol, rtol);
    if (!m->no_lse)
        tu_check_close("merged lse vs ref_merge", got_lse, want_lse, nrow, P == 1 ? 0.0 : 1e-6, P == 1 ? 0.0 : 1e-6);

    if (m->nan_row0) {
        /* Row 0 no longer matches any attention; the merge itself is what this row checks. */
        if (m->nan_row0 == 4) /* the NaN column alone (got matched want element by element) */
            assert_true(isnan(want[1]) && isfinite(want[0]) && isfinite(want[2]) && isfinite(want_lse[0]));
        else
            assert_true(isnan(want[0]) && (m->nan_row0 == 2 ? isfinite(want_lse[0]) : isnan(want_lse[0])));
        if (tu_failures != 0)
            fail_msg("%d check(s) failed", tu_failures);
        return;
    }

    /* 2. Against the float64 attention over all keys. */
    int kvl[4] = {0, Skv, Skv, Skv};
    ref_attn a;
    memset(&a, 0, sizeof a);
    a.batch = B;
    a.heads_q = H;
    a.heads_kv = m->Hkv;
    a.seq_q = Sq;
    a.seq_kv = Skv;
    a.head_dim = D;
    a.scale = t.scale;
    a.mask = xm;
    a.mask_shape[0] = B;
    a.mask_shape[1] = H;
    a.mask_shape[2] = Sq;
    a.mask_shape[3] = Skv;
    a.kv_len = m->batch0_empty ? kvl : NULL;
    double *ref_out = tu_xdoubles(nout), *ref_lse = tu_xdoubles(nrow);
    ref_attention(&a, t.xq, t.xk, t.xv, ref_out, ref_lse, NULL);
    /* The parts' own error (their storage type) plus the merged output's storage rounding. */
    const tols tp = attention_tols(Skv, m->dt), to = attention_tols(Skv, m->out_dt);
    const double ref_atol = tp.out_atol + to.out_atol, ref_rtol = tp.out_rtol + to.out_rtol;
    tu_check_close("merged out vs reference attention", got, ref_out, nout, ref_atol, ref_rtol);
    if (!m->no_lse)
        tu_check_close("merged lse vs reference attention", got_lse, ref_lse, nrow, tp.lse_atol, tp.lse_rtol);
    check_exact_zeros("merged out", ref_lse, got, nrow, (size_t)D);

    /* 3. Against a whole-range clattn_attention (fused), which has the reference error once more. */
    tu_view whole, wlse;
    tu_view_init(&whole, LAYOUT_BHSD, m->dt, B, H, Sq, D, 777.0);
    tu_view_init(&wlse, LAYOUT_BHSD, F32, B, H, Sq, 1, 777.0);
    tu_upload(&whole);
    tu_upload(&wlse);
    clattn_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = B;
    desc.heads_q = H;
    desc.heads_kv = m->Hkv;
    desc.seq_q = Sq;
    desc.seq_kv = Skv;
    desc.head_dim = D;
    desc.mask = m->mask ? &mask.t : NULL;
    desc.kv_lengths = kv_b0;
    desc.lse = &wlse.t;
    desc.algorithm = CLATTN_ALGORITHM_FUSED;
    attention_or_fail(&desc, &t.q.t, &t.k.t, &t.v.t, &whole.t);
    tu_finish(tu_ctx);
    double *w = tu_xdoubles(nout), *wl = tu_xdoubles(nrow);
    tu_download("whole out", &whole, w);
    tu_download("whole lse", &wlse, wl);
    tu_check_close("merged out vs whole-range attention", got, w, nout, ref_atol + tp.out_atol,
                ref_rtol + tp.out_rtol);
    if (!m->no_lse)
        tu_check_close("merged lse vs whole-range attention", got_lse, wl, nrow, 2 * tp.lse_atol, 2 * tp.lse_rtol);
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* ====================== the longest key range accepted ====================== */

/* CLATTN_MAX_SEQ keys, all of them one K row and one V row (stride 0 broadcasts), three query
 * rows of a GQA group. Every visible key weighs 1/W, so out is that V row and lse is the row's
 * score plus ln W, both known in float64 without a reference over W keys. It catches key counters
 * that wrap near 2^31 (a split's keys dropped: lse off by the log of a fraction) and the rounding
 * of O updated key by key over one long split (out decaying towards 0, 87% at 2^31 keys).
 * The CPU's default kernels (test_decode and its _nreg, _nreg4 and _chunked runs, sanitized or
 * not) see every key, W = N: 11 s on 2 cores. The GPU kernels on PoCL take about 18 times as long
 * a key (test_decode_gpu's decode_lanes took 196 s over the whole range, a tenth of the Release
 * step's test time), and fused_direct forced on decode (test_decode_direct16) 68 s. There the
 * range stays whole, so that the split arithmetic (work_range_of, shared by every kernel) and each
 * kernel's key counters run up to CLATTN_MAX_SEQ, but a sliding window shows the row only its
 * last 2^24 keys, which the kernel's splits then share (a long split's rounding still counts), or
 * 2^22 for the emulated matrix kernel (CLATTN_MATRIX=emulate: every product through local
 * memory), still 2^18 of its 16-key tiles. */
static void test_longest_range(void **state)
{
    (void)state;
    tu_failures = 0;
    clattn_context *ctx = tu_ctx_get();
    const char *matrix = getenv("CLATTN_MATRIX"), *forced = getenv("CLATTN_PARAMS_DECODE");
    const int emulated = matrix && strncmp(matrix, "emulate", 7) == 0; /* any layout */
    const int slow = tu_getenv_int("CLATTN_TEST_GPU_LIMITS", 0) != 0 || (forced && *forced);
    const int64_t N = CLATTN_MAX_SEQ;
    const int64_t W = emulated ? INT64_C(1) << 22 : slow ? INT64_C(1) << 24 : N; /* visible keys */
    enum { HQ = 3, D = 16, DV = 16 };
    tu_rng rng;
    tu_seed(&rng, tu_seed_of("longest_range"));
    float q[HQ * D], k[D], v[DV];
    for (int i = 0; i < HQ * D; i++)
        q[i] = (float)tu_uniform(&rng, -1, 1);
    for (int i = 0; i < D; i++)
        k[i] = (float)tu_uniform(&rng, -1, 1);
    for (int i = 0; i < DV; i++)
        v[i] = (float)tu_uniform(&rng, -1, 1);
    cl_mem bq = tu_xbuffer(sizeof q, q), bk = tu_xbuffer(sizeof k, k), bv = tu_xbuffer(sizeof v, v);
    cl_mem bo = tu_xbuffer(HQ * DV * 4, NULL), bl = tu_xbuffer(HQ * 4, NULL);
    clattn_tensor tq = clattn_tensor_bhsd(bq, CLATTN_F32, 1, HQ, 1, D);
    clattn_tensor tk = clattn_tensor_bhsd(bk, CLATTN_F32, 1, 1, N, D);
    clattn_tensor tv = clattn_tensor_bhsd(bv, CLATTN_F32, 1, 1, N, DV);
    tk.stride[0] = tk.stride[1] = tk.stride[2] = 0;
    tv.stride[0] = tv.stride[1] = tv.stride[2] = 0;
    clattn_tensor to = clattn_tensor_bhsd(bo, CLATTN_F32, 1, HQ, 1, DV);
    clattn_tensor tl = clattn_tensor_bhsd(bl, CLATTN_F32, 1, HQ, 1, 1);
    clattn_attention_desc desc = {.batch = 1, .heads_q = HQ, .heads_kv = 1, .seq_q = 1, .seq_kv = N,
                                  .head_dim = D, .head_dim_v = DV, .lse = &tl,
                                  .algorithm = CLATTN_ALGORITHM_FUSED};
    if (W < N) { /* keys N - W .. N - 1 */
        desc.window = 1;
        desc.window_left = W - 1;
    }
    attention_or_fail(&desc, &tq, &tk, &tv, &to);
    float out[HQ * DV], lse[HQ];
    tu_read(ctx, bo, sizeof out, out);
    tu_read(ctx, bl, sizeof lse, lse);
    double got[HQ * DV], want[HQ * DV], got_l[HQ], want_l[HQ];
    for (int h = 0; h < HQ; h++) {
        double dot = 0;
        for (int d = 0; d < D; d++)
            dot += (double)q[h * D + d] * k[d];
        want_l[h] = dot / sqrt((double)D) + log((double)W);
        got_l[h] = lse[h];
        for (int c = 0; c < DV; c++) {
            want[h * DV + c] = v[c];
            got[h * DV + c] = out[h * DV + c];
        }
    }
    print_message("%lld keys, %lld visible: out[0] %.9g (exact %.9g), lse[0] %.9g (exact %.9g)\n",
                  (long long)N, (long long)W, got[0], want[0], got_l[0], want_l[0]);
    tu_check_close("out over the longest range", got, want, HQ * DV, 1e-6, 1e-4);
    tu_check_close("lse over the longest range", got_l, want_l, HQ, 1e-4, 1e-6);
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* =============================== registration =============================== */

int main(void)
{
    enum { MAX_TESTS = 128 };
    static struct CMUnitTest tests[MAX_TESTS];
    static char names[MAX_TESTS][96];
    size_t n = 0;
    for (size_t i = 0; i < N_OF(dec_cases) && n < MAX_TESTS; ++i, ++n) {
        snprintf(names[n], sizeof names[n], "decode/%s", dec_cases[i].name);
        tests[n] = (struct CMUnitTest){names[n], test_decode, NULL, tu_teardown, (void *)&dec_cases[i]};
    }
    for (size_t i = 0; i < N_OF(merge_cases) && n < MAX_TESTS; ++i, ++n) {
        snprintf(names[n], sizeof names[n], "merge/%s", merge_cases[i].name);
        tests[n] = (struct CMUnitTest){names[n], test_merge, NULL, tu_teardown, (void *)&merge_cases[i]};
    }
    if (n < MAX_TESTS) {
        snprintf(names[n], sizeof names[n], "decode/longest_range");
        tests[n] = (struct CMUnitTest){names[n], test_longest_range, NULL, tu_teardown, NULL};
        n++;
    }
    if (n != N_OF(dec_cases) + N_OF(merge_cases) + 1) {
        fprintf(stderr, "test_decode: more than %d tests, raise MAX_TESTS\n", MAX_TESTS);
        return 1;
    }
    for (size_t i = 0; i < n; ++i)
        for (size_t j = i + 1; j < n; ++j)
            if (strcmp(names[i], names[j]) == 0) {
                fprintf(stderr, "test_decode: duplicate test name %s\n", names[i]);
                return 1;
            }
    n = tu_filter_tests("decode", tests, n);
    const int failed = _cmocka_run_group_tests("decode", tests, n, NULL, NULL);
    clattn_release(tu_ctx);
    return failed;
}
