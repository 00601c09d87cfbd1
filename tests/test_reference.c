/*
 * Checks the float64 reference (ref/clattn_ref.c) and the host helpers (testutil.c) against
 * properties a real bug would break: closed-form results (uniform scores, one-hot scores,
 * hand-written softmax rows), structural rules (causal pattern, empty rows, GQA mapping, mask
 * broadcasting), invariances (logit shift, split + merge), isolation of hidden keys from NaN/Inf,
 * and known f16/bf16 bit patterns plus exhaustive round-to-nearest-even checks. Every device test
 * trusts this reference, so it gets its own tests. No OpenCL device is needed: nothing here creates
 * a context.
 *
 * Table-driven: each table row is one cmocka test named "<area>/<row>"; main() refuses duplicate names.
 */
#define _POSIX_C_SOURCE 200809L /* setenv/unsetenv, for the tu_getenv_int test only */

#include "testutil.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ln 2, ln 3: static initialisers cannot call log(). */
#define LN2 0.69314718055994530942
#define LN3 1.09861228866810969140

/* =============================== problem scaffolding =============================== */

typedef enum mask_kind {
    MASK_NONE,
    MASK_FULL,      /* {B, Hq, Sq, Skv} */
    MASK_SHARED,    /* {1, 1, Sq, Skv}: one mask for every batch and head */
    MASK_ROW1,      /* {B, Hq, 1, Skv}: one mask row for every query row */
    MASK_HEAD1,     /* {B, 1, Sq, Skv}: one mask for every head */
    MASK_BATCH_COL  /* {B, 1, 1, Skv}: per batch key mask */
} mask_kind;

typedef struct problem {
    ref_attn a;
    int kv_len[4];
    double *q, *k, *v, *mask, *out, *lse, *probs, *scores;
    size_t nq, nk, nv, nmask, nout, nrow, nprob;
} problem;

static double *alloc_doubles(size_t n)
{
    double *p = calloc(n > 0 ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static int dv_of(const ref_attn *a)
{
    return a->head_dim_v != 0 ? a->head_dim_v : a->head_dim;
}

static double scale_of(const ref_attn *a)
{
    return a->scale != 0.0 ? a->scale : 1.0 / sqrt((double)a->head_dim);
}

/* Keys of batch b, clamped as the contract says; the test's own copy of the rule. */
static int len_of(const ref_attn *a, int b)
{
    if (a->kv_len == NULL)
        return a->seq_kv;
    const int l = a->kv_len[b];
    return l < 0 ? 0 : (l > a->seq_kv ? a->seq_kv : l);
}

/* Index of query row (b, h, i) in [B][Hq][Sq]; of key row (b, g, j) in [B][Hkv][Skv]. */
static size_t q_row(const ref_attn *a, int b, int h, int i)
{
    return ((size_t)b * (size_t)a->heads_q + (size_t)h) * (size_t)a->seq_q + (size_t)i;
}

static size_t kv_row(const ref_attn *a, int b, int g, int j)
{
    return ((size_t)b * (size_t)a->heads_kv + (size_t)g) * (size_t)a->seq_kv + (size_t)j;
}

static void problem_init(problem *p, int B, int Hq, int Hkv, int Sq, int Skv, int D, int Dv)
{
    memset(p, 0, sizeof *p);
    p->a.batch = B;
    p->a.heads_q = Hq;
    p->a.heads_kv = Hkv;
    p->a.seq_q = Sq;
    p->a.seq_kv = Skv;
    p->a.head_dim = D;
    p->a.head_dim_v = Dv;
    const size_t dv = (size_t)dv_of(&p->a);
    p->nrow = (size_t)B * (size_t)Hq * (size_t)Sq;
    p->nq = p->nrow * (size_t)D;
    p->nk = (size_t)B * (size_t)Hkv * (size_t)Skv * (size_t)D;
    p->nv = (size_t)B * (size_t)Hkv * (size_t)Skv * dv;
    p->nout = p->nrow * dv;
    p->nprob = p->nrow * (size_t)Skv;
    p->q = alloc_doubles(p->nq);
    p->k = alloc_doubles(p->nk);
    p->v = alloc_doubles(p->nv);
    p->out = alloc_doubles(p->nout);
    p->lse = alloc_doubles(p->nrow);
    p->probs = alloc_doubles(p->nprob);
    p->scores = alloc_doubles(p->nprob);
}

static void problem_free(problem *p)
{
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->mask);
    free(p->out);
    free(p->lse);
    free(p->probs);
    free(p->scores);
}

static void fill_uniform(tu_rng *rng, double *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; ++i)
        x[i] = tu_uniform(rng, lo, hi);
}

static void problem_random(problem *p, tu_rng *rng)
{
    fill_uniform(rng, p->q, p->nq, -1.0, 1.0);
    fill_uniform(rng, p->k, p->nk, -1.0, 1.0);
    fill_uniform(rng, p->v, p->nv, -1.0, 1.0);
}

static void problem_kv_len(problem *p, const int *len)
{
    for (int b = 0; b < p->a.batch; ++b)
        p->kv_len[b] = len[b];
    p->a.kv_len = p->kv_len;
}

/* Random additive mask of the given broadcast kind, a fraction of it -inf. */
static void problem_mask(problem *p, mask_kind kind, tu_rng *rng, double neginf_frac)
{
    const ref_attn *a = &p->a;
    int shape[4] = {a->batch, a->heads_q, a->seq_q, a->seq_kv};
    switch (kind) {
    case MASK_NONE:
        return;
    case MASK_FULL:
        break;
    case MASK_SHARED:
        shape[0] = shape[1] = 1;
        break;
    case MASK_ROW1:
        shape[2] = 1;
        break;
    case MASK_HEAD1:
        shape[1] = 1;
        break;
    case MASK_BATCH_COL:
        shape[1] = shape[2] = 1;
        break;
    }
    memcpy(p->a.mask_shape, shape, sizeof shape);
    p->nmask = (size_t)shape[0] * (size_t)shape[1] * (size_t)shape[2] * (size_t)shape[3];
    p->mask = alloc_doubles(p->nmask);
    for (size_t i = 0; i < p->nmask; ++i)
        p->mask[i] = tu_uniform(rng, 0.0, 1.0) < neginf_frac ? -INFINITY : tu_uniform(rng, -2.0, 2.0);
    p->a.mask = p->mask;
}

/* The mask expanded to {B, Hq, Sq, Skv} with the test's own broadcast indexing (0 where none). */
static double *expand_mask(const problem *p)
{
    const ref_attn *a = &p->a;
    double *m = alloc_doubles(p->nprob);
    if (a->mask == NULL)
        return m;
    const int *s = a->mask_shape;
    for (int b = 0; b < a->batch; ++b)
        for (int h = 0; h < a->heads_q; ++h)
            for (int i = 0; i < a->seq_q; ++i)
                for (int j = 0; j < a->seq_kv; ++j) {
                    const int mb = s[0] > 1 ? b : 0, mh = s[1] > 1 ? h : 0, mi = s[2] > 1 ? i : 0;
                    const size_t src = (((size_t)mb * (size_t)s[1] + (size_t)mh) * (size_t)s[2] + (size_t)mi) *
                                           (size_t)s[3] +
                                       (size_t)j;
                    m[q_row(a, b, h, i) * (size_t)a->seq_kv + (size_t)j] = a->mask[src];
                }
    return m;
}

static void problem_run(problem *p)
{
    ref_scores(&p->a, p->q, p->k, p->scores);
    ref_attention(&p->a, p->q, p->k, p->v, p->out, p->lse, p->probs);
}

/* =============================== uniform scores =============================== */

/* q = 0 makes every visible score equal, so out is the plain mean of the visible V rows and
 * lse = log(count): exact closed forms that catch wrong visibility, GQA or normalisation. */
typedef struct uniform_row {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D, Dv, causal, has_len;
    int len[4];
} uniform_row;

static uniform_row uniform_rows[] = {
    {"plain", 1, 1, 1, 3, 5, 4, 4, 0, 0, {0}},
    {"head_dim_v_zero_means_head_dim", 1, 2, 1, 2, 3, 3, 0, 0, 0, {0}},
    {"kv_len", 2, 2, 2, 3, 5, 4, 3, 0, 1, {3, 5}},
    {"kv_len_zero_batch", 2, 1, 1, 2, 4, 2, 2, 0, 1, {0, 2}},
    {"kv_len_clamped", 2, 1, 1, 2, 4, 2, 2, 0, 1, {-3, 99}},
    {"causal_square", 1, 2, 1, 4, 4, 3, 5, 1, 0, {0}},
    {"causal_wide", 1, 1, 1, 2, 4, 2, 2, 1, 0, {0}},
    {"causal_tall", 1, 1, 1, 4, 2, 2, 2, 1, 0, {0}},
    {"causal_kv_len", 2, 4, 2, 3, 6, 4, 2, 1, 1, {4, 1}},
    {"decode_kv_len", 3, 2, 1, 1, 9, 8, 4, 1, 1, {9, 5, 0}},
};

static void test_uniform(void **state)
{
    const uniform_row *r = *state;
    problem p;
    problem_init(&p, r->B, r->Hq, r->Hkv, r->Sq, r->Skv, r->D, r->Dv);
    tu_rng rng;
    tu_seed(&rng, 101);
    problem_random(&p, &rng);
    memset(p.q, 0, p.nq * sizeof *p.q);
    p.a.causal = r->causal;
    if (r->has_len)
        problem_kv_len(&p, r->len);
    problem_run(&p);

    const ref_attn *a = &p.a;
    const int dv = dv_of(a), group = a->heads_q / a->heads_kv;
    double *want = alloc_doubles(p.nout), *want_lse = alloc_doubles(p.nrow), *want_p = alloc_doubles(p.nprob);
    for (int b = 0; b < a->batch; ++b)
        for (int h = 0; h < a->heads_q; ++h)
            for (int i = 0; i < a->seq_q; ++i) {
                const int L = len_of(a, b);
                /* Visible keys are the prefix 0..n-1: all L, or up to i + L - Sq when causal. */
                int n = L;
                if (a->causal) {
                    n = i + L - a->seq_q + 1;
                    n = n < 0 ? 0 : (n > L ? L : n);
                }
                const size_t row = q_row(a, b, h, i);
                for (int d = 0; d < dv; ++d) {
                    double s = 0.0;
                    for (int j = 0; j < n; ++j)
                        s += p.v[kv_row(a, b, h / group, j) * (size_t)dv + (size_t)d];
                    want[row * (size_t)dv + (size_t)d] = n > 0 ? s / n : 0.0;
                }
                want_lse[row] = n > 0 ? log((double)n) : -INFINITY;
                for (int j = 0; j < n; ++j)
                    want_p[row * (size_t)a->seq_kv + (size_t)j] = 1.0 / n;
            }
    tu_assert_allclose("out", p.out, want, p.nout, 1e-14, 1e-13);
    tu_assert_allclose("lse", p.lse, want_lse, p.nrow, 1e-14, 1e-13);
    tu_assert_allclose("probs", p.probs, want_p, p.nprob, 1e-14, 1e-13);
    free(want);
    free(want_lse);
    free(want_p);
    problem_free(&p);
}

/* =============================== one-hot scores =============================== */

/* One key scores `big`, the rest 0: out must be that key's V row and lse ≈ big. big = 1e6 would
 * overflow exp() in any implementation that does not subtract the row max. */
typedef struct onehot_row {
    const char *name;
    int Skv, D, Dv, hot;
    double big;
} onehot_row;

static onehot_row onehot_rows[] = {
    {"first", 5, 4, 3, 0, 200.0},
    {"middle", 7, 8, 8, 3, 200.0},
    {"last", 6, 1, 2, 5, 200.0},
    {"huge_logit", 4, 2, 2, 2, 1e6},
};

static void test_onehot(void **state)
{
    const onehot_row *r = *state;
    problem p;
    problem_init(&p, 1, 1, 1, 2, r->Skv, r->D, r->Dv);
    tu_rng rng;
    tu_seed(&rng, 202);
    problem_random(&p, &rng);
    p.a.scale = 1.0;
    memset(p.q, 0, p.nq * sizeof *p.q);
    memset(p.k, 0, p.nk * sizeof *p.k);
    for (int i = 0; i < 2; ++i)
        p.q[(size_t)i * (size_t)r->D] = r->big;
    p.k[(size_t)r->hot * (size_t)r->D] = 1.0;
    problem_run(&p);

    double want[2 * 8], want_lse[2] = {r->big, r->big}, want_p[2 * 8] = {0};
    for (int i = 0; i < 2; ++i) {
        for (int d = 0; d < r->Dv; ++d)
            want[i * r->Dv + d] = p.v[(size_t)r->hot * (size_t)r->Dv + (size_t)d];
        want_p[i * r->Skv + r->hot] = 1.0;
    }
    tu_assert_allclose("out", p.out, want, p.nout, 1e-14, 1e-14);
    tu_assert_allclose("lse", p.lse, want_lse, 2, 1e-14, 1e-14);
    tu_assert_allclose("probs", p.probs, want_p, p.nprob, 1e-14, 0.0);
    problem_free(&p);
}

/* =============================== random problems: internal consistency =============================== */

typedef struct random_row {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D, Dv, causal, has_len;
    int len[4];
    mask_kind mask;
    double neginf_frac;
    double scale;
} random_row;

static random_row random_rows[] = {
    {"plain", 1, 2, 2, 3, 5, 4, 4, 0, 0, {0}, MASK_NONE, 0.0, 0.0},
    {"causal_wide", 2, 2, 1, 3, 7, 8, 4, 1, 0, {0}, MASK_NONE, 0.0, 0.0},
    {"causal_tall", 1, 1, 1, 5, 3, 4, 4, 1, 0, {0}, MASK_NONE, 0.0, 0.0},
    {"kv_len_causal", 3, 4, 2, 4, 6, 4, 6, 1, 1, {6, 2, 0}, MASK_NONE, 0.0, 0.0},
    {"mask_full", 2, 2, 2, 3, 5, 4, 4, 0, 0, {0}, MASK_FULL, 0.2, 0.5},
    {"mask_shared", 2, 4, 2, 3, 6, 3, 5, 1, 0, {0}, MASK_SHARED, 0.2, 0.0},
    {"mask_row_broadcast", 2, 2, 1, 4, 5, 4, 4, 0, 1, {5, 3}, MASK_ROW1, 0.3, 0.0},
    {"mask_head_broadcast", 2, 3, 1, 2, 8, 5, 3, 1, 1, {8, 7}, MASK_HEAD1, 0.25, 2.0},
    {"mask_batch_col", 3, 2, 2, 3, 4, 2, 2, 0, 0, {0}, MASK_BATCH_COL, 0.3, 0.0},
    {"mask_mostly_neginf", 1, 2, 2, 4, 4, 4, 4, 0, 0, {0}, MASK_FULL, 0.8, 0.0},
};

static void random_problem(problem *p, const random_row *r, uint64_t seed)
{
    problem_init(p, r->B, r->Hq, r->Hkv, r->Sq, r->Skv, r->D, r->Dv);
    tu_rng rng;
    tu_seed(&rng, seed);
    problem_random(p, &rng);
    p->a.causal = r->causal;
    p->a.scale = r->scale;
    if (r->has_len)
        problem_kv_len(p, r->len);
    problem_mask(p, r->mask, &rng, r->neginf_frac);
}

/*
 * Scores, lse, probabilities and out must agree with each other and with the definitions computed
 * naively here (no max subtraction: inputs are small). Broadcast masks must give exactly what the
 * expanded mask gives.
 */
static void test_consistency(void **state)
{
    const random_row *r = *state;
    problem p;
    random_problem(&p, r, 303);
    problem_run(&p);
    const ref_attn *a = &p.a;
    const int dv = dv_of(a), group = a->heads_q / a->heads_kv;
    const size_t Skv = (size_t)a->seq_kv;
    const double scale = scale_of(a);
    double *mexp = expand_mask(&p);
    double *w_scores = alloc_doubles(p.nprob), *w_p = alloc_doubles(p.nprob);
    double *w_out = alloc_doubles(p.nout), *w_lse = alloc_doubles(p.nrow);
    double *sums = alloc_doubles(p.nrow), *ones = alloc_doubles(p.nrow);

    for (int b = 0; b < a->batch; ++b)
        for (int h = 0; h < a->heads_q; ++h)
            for (int i = 0; i < a->seq_q; ++i) {
                const size_t row = q_row(a, b, h, i);
                const int L = len_of(a, b);
                double z = 0.0;
                for (int j = 0; j < a->seq_kv; ++j) {
                    const double m = mexp[row * Skv + (size_t)j];
                    const int hidden = j >= L || (a->causal && j > i + L - a->seq_q) || m == -INFINITY;
                    double dot = 0.0;
                    for (int d = 0; d < a->head_dim; ++d)
                        dot += p.q[row * (size_t)a->head_dim + (size_t)d] *
                               p.k[kv_row(a, b, h / group, j) * (size_t)a->head_dim + (size_t)d];
                    w_scores[row * Skv + (size_t)j] = hidden ? -INFINITY : scale * dot + m;
                    if (!hidden)
                        z += exp(scale * dot + m);
                }
                w_lse[row] = log(z); /* log(0) = -inf: exactly the empty-row value */
                for (int j = 0; j < a->seq_kv; ++j) {
                    const double s = w_scores[row * Skv + (size_t)j];
                    const double pj = s == -INFINITY ? 0.0 : exp(s) / z;
                    w_p[row * Skv + (size_t)j] = pj;
                    sums[row] += p.probs[row * Skv + (size_t)j];
                    if (pj != 0.0)
                        for (int d = 0; d < dv; ++d)
                            w_out[row * (size_t)dv + (size_t)d] += pj * p.v[kv_row(a, b, h / group, j) * (size_t)dv + (size_t)d];
                }
                ones[row] = z > 0.0 ? 1.0 : 0.0; /* probabilities sum to 1, or 0 in an empty row */
            }
    tu_assert_allclose("scores", p.scores, w_scores, p.nprob, 1e-13, 1e-13);
    tu_assert_allclose("lse", p.lse, w_lse, p.nrow, 1e-13, 1e-13);
    tu_assert_allclose("probs", p.probs, w_p, p.nprob, 1e-14, 1e-12);
    tu_assert_allclose("row sums of probs", sums, ones, p.nrow, 1e-14, 0.0);
    tu_assert_allclose("out", p.out, w_out, p.nout, 1e-13, 1e-12);

    if (a->mask != NULL) {
        /* Same problem with the mask materialised at full shape: broadcasting changes nothing. */
        problem e;
        random_problem(&e, r, 303);
        free(e.mask);
        e.mask = mexp;
        mexp = NULL;
        e.a.mask = e.mask;
        e.a.mask_shape[0] = a->batch;
        e.a.mask_shape[1] = a->heads_q;
        e.a.mask_shape[2] = a->seq_q;
        e.a.mask_shape[3] = a->seq_kv;
        problem_run(&e);
        tu_assert_allclose("scores, expanded mask", e.scores, p.scores, p.nprob, 0.0, 0.0);
        tu_assert_allclose("out, expanded mask", e.out, p.out, p.nout, 0.0, 0.0);
        tu_assert_allclose("lse, expanded mask", e.lse, p.lse, p.nrow, 0.0, 0.0);
        tu_assert_allclose("probs, expanded mask", e.probs, p.probs, p.nprob, 0.0, 0.0);
        problem_free(&e);
    }
    free(mexp);
    free(w_scores);
    free(w_p);
    free(w_out);
    free(w_lse);
    free(sums);
    free(ones);
    problem_free(&p);
}

/*
 * The standalone softmax over the raw q·kᵀ, given the same scale, causal flag, mask and lengths,
 * must reproduce attention's probabilities: the two operations share one set of masking rules.
 * Run in place too, as clattn_softmax allows.
 */
static void test_softmax_matches_attention(void **state)
{
    const random_row *r = *state;
    problem p;
    random_problem(&p, r, 404);
    problem_run(&p);
    const ref_attn *a = &p.a;
    const int group = a->heads_q / a->heads_kv;
    double *raw = alloc_doubles(p.nprob), *got = alloc_doubles(p.nprob);
    for (int b = 0; b < a->batch; ++b)
        for (int h = 0; h < a->heads_q; ++h)
            for (int i = 0; i < a->seq_q; ++i)
                for (int j = 0; j < a->seq_kv; ++j) {
                    double dot = 0.0;
                    for (int d = 0; d < a->head_dim; ++d)
                        dot += p.q[q_row(a, b, h, i) * (size_t)a->head_dim + (size_t)d] *
                               p.k[kv_row(a, b, h / group, j) * (size_t)a->head_dim + (size_t)d];
                    raw[q_row(a, b, h, i) * (size_t)a->seq_kv + (size_t)j] = dot;
                }
    ref_softmax s = {
        .batch = a->batch,
        .heads = a->heads_q,
        .rows = a->seq_q,
        .cols = a->seq_kv,
        .scale = scale_of(a),
        .causal = a->causal,
        .mask = a->mask,
        .kv_len = a->kv_len,
    };
    memcpy(s.mask_shape, a->mask_shape, sizeof s.mask_shape);
    ref_softmax_rows(&s, raw, got);
    tu_assert_allclose("softmax vs attention probs", got, p.probs, p.nprob, 1e-14, 1e-12);
    ref_softmax_rows(&s, raw, raw);
    tu_assert_allclose("in-place softmax", raw, got, p.nprob, 0.0, 0.0);
    free(raw);
    free(got);
    problem_free(&p);
}

/* =============================== causal pattern, hand-written =============================== */

/* Visibility written out by hand per query row ('1' visible, '0' hidden), rows separated by '|'. */
typedef struct pattern_row {
    const char *name;
    int Sq, Skv, causal, len; /* len < 0: no kv_len */
    const char *pattern;
} pattern_row;

static pattern_row pattern_rows[] = {
    {"square_3", 3, 3, 1, -1, "100|110|111"},
    {"wide_2x4", 2, 4, 1, -1, "1110|1111"},
    {"tall_4x2", 4, 2, 1, -1, "00|00|10|11"},
    {"decode_1x5", 1, 5, 1, -1, "11111"},
    {"kv_len_3_of_4", 2, 4, 1, 3, "1100|1110"},
    {"kv_len_0", 2, 3, 1, 0, "000|000"},
    {"kv_len_over_seq_kv", 2, 3, 1, 7, "110|111"},
    {"not_causal_kv_len_2", 2, 4, 0, 2, "1100|1100"},
};

static void test_pattern(void **state)
{
    const pattern_row *r = *state;
    problem p;
    problem_init(&p, 1, 1, 1, r->Sq, r->Skv, 2, 2);
    tu_rng rng;
    tu_seed(&rng, 505);
    problem_random(&p, &rng);
    p.a.causal = r->causal;
    if (r->len >= 0)
        problem_kv_len(&p, &r->len);
    problem_run(&p);
    assert_int_equal(strlen(r->pattern), (size_t)(r->Sq * (r->Skv + 1) - 1)); /* the table itself */
    for (int i = 0; i < r->Sq; ++i)
        for (int j = 0; j < r->Skv; ++j) {
            const char c = r->pattern[i * (r->Skv + 1) + j];
            const double s = p.scores[i * r->Skv + j], pr = p.probs[i * r->Skv + j];
            if ((c == '1') != (s != -INFINITY) || (c == '0' && pr != 0.0)) {
                print_error("row %d key %d: expected %s, score %g, probability %g\n", i, j,
                            c == '1' ? "visible" : "hidden", s, pr);
                fail();
            }
        }
    problem_free(&p);
}

/* =============================== rows with no visible key =============================== */

/* 'E' marks a query row (of every head) that must come out empty: out 0, lse -inf, probabilities
 * 0, scores -inf. Rows per batch are separated by '|'. K and V beyond each batch's length hold
 * NaN, which must not matter. */
typedef struct empty_row {
    const char *name;
    int B, Sq, Skv, causal, has_len;
    int len[4];
    int neginf_row;  /* query row whose whole mask row is -inf, or -1 */
    int neginf_cols; /* leading key columns that are -inf in every mask row */
    const char *empty;
} empty_row;

static empty_row empty_rows[] = {
    {"kv_len_zero", 2, 3, 4, 0, 1, {0, 4}, -1, 0, "EEE|..."},
    {"causal_tall", 1, 4, 2, 1, 0, {0}, -1, 0, "EE.."},
    {"causal_kv_len", 2, 3, 5, 1, 1, {1, 2}, -1, 0, "EE.|E.."},
    {"mask_row", 1, 3, 4, 0, 0, {0}, 1, 0, ".E."},
    {"mask_cols_and_kv_len", 2, 2, 4, 0, 1, {2, 4}, -1, 2, "EE|.."},
};

static void test_empty(void **state)
{
    const empty_row *r = *state;
    problem p;
    problem_init(&p, r->B, 2, 1, r->Sq, r->Skv, 3, 2);
    tu_rng rng;
    tu_seed(&rng, 606);
    problem_random(&p, &rng);
    const ref_attn *a = &p.a;
    p.a.causal = r->causal;
    if (r->has_len)
        problem_kv_len(&p, r->len);
    if (r->neginf_row >= 0 || r->neginf_cols > 0) {
        problem_mask(&p, MASK_SHARED, &rng, 0.0);
        for (int i = 0; i < r->Sq; ++i)
            for (int j = 0; j < r->Skv; ++j)
                if (i == r->neginf_row || j < r->neginf_cols)
                    p.mask[i * r->Skv + j] = -INFINITY;
    }
    for (int b = 0; b < r->B; ++b)
        for (int j = len_of(a, b); j < r->Skv; ++j) {
            for (int d = 0; d < a->head_dim; ++d)
                p.k[kv_row(a, b, 0, j) * (size_t)a->head_dim + (size_t)d] = NAN;
            for (int d = 0; d < a->head_dim_v; ++d)
                p.v[kv_row(a, b, 0, j) * (size_t)a->head_dim_v + (size_t)d] = NAN;
        }
    problem_run(&p);
    assert_int_equal(strlen(r->empty), (size_t)(r->B * (r->Sq + 1) - 1));

    for (int b = 0; b < r->B; ++b)
        for (int h = 0; h < a->heads_q; ++h)
            for (int i = 0; i < r->Sq; ++i) {
                const size_t row = q_row(a, b, h, i);
                const int want_empty = r->empty[b * (r->Sq + 1) + i] == 'E';
                double sum = 0.0;
                int ok = 1;
                for (int j = 0; j < r->Skv; ++j) {
                    sum += p.probs[row * (size_t)r->Skv + (size_t)j];
                    if (want_empty && p.scores[row * (size_t)r->Skv + (size_t)j] != -INFINITY)
                        ok = 0;
                }
                for (int d = 0; d < a->head_dim_v; ++d) {
                    const double o = p.out[row * (size_t)a->head_dim_v + (size_t)d];
                    if (want_empty ? o != 0.0 : !isfinite(o))
                        ok = 0;
                }
                if (want_empty ? (p.lse[row] != -INFINITY || sum != 0.0)
                               : (!isfinite(p.lse[row]) || fabs(sum - 1.0) > 1e-14))
                    ok = 0;
                if (!ok) {
                    print_error("batch %d head %d row %d: expected %s; lse %g, probability sum %g, out[0] %g\n", b,
                                h, i, want_empty ? "empty" : "finite", p.lse[row], sum,
                                p.out[row * (size_t)a->head_dim_v]);
                    fail();
                }
            }
    problem_free(&p);
}

/* =============================== NaN / Inf isolation =============================== */

typedef enum poison_where {
    POISON_BEYOND_LEN,  /* keys j >= L_b: hidden from every row */
    POISON_MASK_COLUMN, /* keys whose mask column is -inf for the whole batch */
    POISON_CAUSAL_ROW   /* per query row: the keys causal hides from it */
} poison_where;

typedef struct poison_row {
    const char *name;
    poison_where where;
    int inf; /* 0: K and V become NaN; 1: K becomes +inf and V -inf */
} poison_row;

static poison_row poison_rows[] = {
    {"beyond_kv_len_nan", POISON_BEYOND_LEN, 0}, {"beyond_kv_len_inf", POISON_BEYOND_LEN, 1},
    {"mask_column_nan", POISON_MASK_COLUMN, 0},  {"mask_column_inf", POISON_MASK_COLUMN, 1},
    {"causal_per_row_nan", POISON_CAUSAL_ROW, 0}, {"causal_per_row_inf", POISON_CAUSAL_ROW, 1},
};

static void poison_key(problem *p, int b, int j, int inf)
{
    const ref_attn *a = &p->a;
    const int dv = dv_of(a);
    for (int g = 0; g < a->heads_kv; ++g) {
        for (int d = 0; d < a->head_dim; ++d)
            p->k[kv_row(a, b, g, j) * (size_t)a->head_dim + (size_t)d] = inf ? INFINITY : NAN;
        for (int d = 0; d < dv; ++d)
            p->v[kv_row(a, b, g, j) * (size_t)dv + (size_t)d] = inf ? -INFINITY : NAN;
    }
}

static void poison_problem(problem *p, const poison_row *r)
{
    static const int len[2] = {5, 2};
    problem_init(p, 2, 4, 2, 3, 7, 4, 3);
    tu_rng rng;
    tu_seed(&rng, 707);
    problem_random(p, &rng);
    p->a.causal = 1;
    problem_kv_len(p, len);
    if (r->where == POISON_MASK_COLUMN) {
        problem_mask(p, MASK_BATCH_COL, &rng, 0.0);
        p->mask[0 * 7 + 1] = p->mask[0 * 7 + 3] = p->mask[1 * 7 + 0] = -INFINITY;
    }
}

/* Poisoned keys that no row can see must leave every output bit-identical. */
static void test_poison(void **state)
{
    const poison_row *r = *state;
    problem base, p;
    poison_problem(&base, r);
    problem_run(&base);
    const ref_attn *a = &base.a;
    const int dv = dv_of(a);

    if (r->where != POISON_CAUSAL_ROW) {
        poison_problem(&p, r);
        for (int b = 0; b < a->batch; ++b)
            for (int j = 0; j < a->seq_kv; ++j)
                if (r->where == POISON_BEYOND_LEN ? j >= len_of(a, b) : p.mask[b * a->seq_kv + j] == -INFINITY)
                    poison_key(&p, b, j, r->inf);
        problem_run(&p);
        tu_assert_allclose("out", p.out, base.out, p.nout, 0.0, 0.0);
        tu_assert_allclose("lse", p.lse, base.lse, p.nrow, 0.0, 0.0);
        tu_assert_allclose("probs", p.probs, base.probs, p.nprob, 0.0, 0.0);
        tu_assert_allclose("scores", p.scores, base.scores, p.nprob, 0.0, 0.0);
        problem_free(&p);
    } else {
        /* Causal hides different keys from different rows, so poison per row and check that row. */
        for (int b = 0; b < a->batch; ++b)
            for (int i = 0; i < a->seq_q; ++i) {
                poison_problem(&p, r);
                for (int j = i + len_of(a, b) - a->seq_q + 1; j < a->seq_kv; ++j)
                    if (j >= 0)
                        poison_key(&p, b, j, r->inf);
                problem_run(&p);
                for (int h = 0; h < a->heads_q; ++h) {
                    const size_t row = q_row(a, b, h, i);
                    tu_assert_allclose("out row", p.out + row * (size_t)dv, base.out + row * (size_t)dv,
                                       (size_t)dv, 0.0, 0.0);
                    tu_assert_allclose("lse row", p.lse + row, base.lse + row, 1, 0.0, 0.0);
                    tu_assert_allclose("probs row", p.probs + row * (size_t)a->seq_kv,
                                       base.probs + row * (size_t)a->seq_kv, (size_t)a->seq_kv, 0.0, 0.0);
                }
                problem_free(&p);
            }
    }
    problem_free(&base);
}

/* NaN in a visible input reaches exactly the rows (and V columns) that use it. Shape: one head,
 * Sq 3, Skv 4, causal, so row 0 sees keys 0..1, row 1 keys 0..2, row 2 keys 0..3. */
typedef struct nan_row {
    const char *name;
    char target; /* 'q': q[a][b]; 'k': k[a][b]; 'v': v[a][b]; 'm': mask[row a][key b] */
    int a, b;
    const char *out; /* per row Dv = 2 chars, 'f' finite, 'N' NaN; rows separated by '|' */
    const char *lse; /* one char per row */
} nan_row;

static nan_row nan_rows[] = {
    {"q_row1", 'q', 1, 0, "ff|NN|ff", "fNf"},
    {"k_key2", 'k', 2, 1, "ff|NN|NN", "fNN"},
    {"k_key3_seen_by_last_row_only", 'k', 3, 0, "ff|ff|NN", "ffN"},
    {"v_key3_dim1", 'v', 3, 1, "ff|ff|fN", "fff"},
    {"v_key0_dim0", 'v', 0, 0, "Nf|Nf|Nf", "fff"},
    {"mask_row1_key0", 'm', 1, 0, "ff|NN|ff", "fNf"},
};

static void test_nan_visible(void **state)
{
    const nan_row *r = *state;
    problem p;
    problem_init(&p, 1, 1, 1, 3, 4, 3, 2);
    tu_rng rng;
    tu_seed(&rng, 808);
    problem_random(&p, &rng);
    p.a.causal = 1;
    if (r->target == 'm') {
        problem_mask(&p, MASK_SHARED, &rng, 0.0);
        p.mask[r->a * 4 + r->b] = NAN;
    } else if (r->target == 'q') {
        p.q[r->a * 3 + r->b] = NAN;
    } else if (r->target == 'k') {
        p.k[r->a * 3 + r->b] = NAN;
    } else {
        p.v[r->a * 2 + r->b] = NAN;
    }
    problem_run(&p);
    for (int i = 0; i < 3; ++i) {
        for (int d = 0; d < 2; ++d) {
            const double o = p.out[i * 2 + d];
            const int want_nan = r->out[i * 3 + d] == 'N';
            if (want_nan ? !isnan(o) : !isfinite(o)) {
                print_error("out row %d dim %d: expected %s, got %g\n", i, d, want_nan ? "NaN" : "finite", o);
                fail();
            }
        }
        const int want_nan = r->lse[i] == 'N';
        if (want_nan ? !isnan(p.lse[i]) : !isfinite(p.lse[i])) {
            print_error("lse row %d: expected %s, got %g\n", i, want_nan ? "NaN" : "finite", p.lse[i]);
            fail();
        }
    }
    problem_free(&p);
}

/* =============================== shift invariance =============================== */

/* Adding a constant to every logit (through the mask) changes lse by that constant and nothing
 * else. ±1e4 overflows/underflows exp() in double unless the row max is subtracted. */
typedef struct shift_row {
    const char *name;
    double shift;
    int causal, has_len;
    int len[4];
    double neginf_frac;
} shift_row;

static shift_row shift_rows[] = {
    {"plus_1e4", 1e4, 0, 0, {0}, 0.0},
    {"minus_1e4", -1e4, 0, 0, {0}, 0.0},
    {"plus_710_exp_overflow", 710.0, 0, 0, {0}, 0.0},
    {"plus_1e4_causal_kv_len", 1e4, 1, 1, {5, 2}, 0.2},
    {"minus_1e4_masked", -1e4, 0, 0, {0}, 0.3},
};

static void shift_problem(problem *p, const shift_row *r, double shift)
{
    problem_init(p, 2, 2, 1, 3, 5, 4, 4);
    tu_rng rng;
    tu_seed(&rng, 909);
    problem_random(p, &rng);
    p->a.causal = r->causal;
    if (r->has_len)
        problem_kv_len(p, r->len);
    problem_mask(p, MASK_SHARED, &rng, r->neginf_frac);
    for (size_t i = 0; i < p->nmask; ++i)
        p->mask[i] += shift; /* -inf stays -inf */
}

static void test_shift(void **state)
{
    const shift_row *r = *state;
    problem base, p;
    shift_problem(&base, r, 0.0);
    shift_problem(&p, r, r->shift);
    problem_run(&base);
    problem_run(&p);
    double *want_lse = alloc_doubles(p.nrow);
    for (size_t i = 0; i < p.nrow; ++i)
        want_lse[i] = base.lse[i] + r->shift;
    /* Logits near 1e4 carry ~2e-12 absolute rounding, hence the tolerances. */
    tu_assert_allclose("out", p.out, base.out, p.nout, 1e-10, 1e-10);
    tu_assert_allclose("probs", p.probs, base.probs, p.nprob, 1e-10, 1e-10);
    tu_assert_allclose("lse", p.lse, want_lse, p.nrow, 1e-9, 1e-12);
    free(want_lse);
    problem_free(&base);
    problem_free(&p);
}

/* =============================== grouped-query attention =============================== */

typedef struct gqa_row {
    const char *name;
    int Hq, Hkv;
} gqa_row;

static gqa_row gqa_rows[] = {
    {"4q_2kv", 4, 2}, {"4q_1kv", 4, 1}, {"6q_3kv", 6, 3}, {"8q_2kv", 8, 2}, {"mha_3", 3, 3},
};

static void gqa_problem(problem *p, int Hq, int Hkv)
{
    static const int len[2] = {5, 3};
    problem_init(p, 2, Hq, Hkv, 3, 5, 4, 2);
    tu_rng rng;
    tu_seed(&rng, 1010);
    problem_random(p, &rng);
    p->a.causal = 1;
    problem_kv_len(p, len);
}

static void test_gqa(void **state)
{
    const gqa_row *r = *state;
    const int group = r->Hq / r->Hkv;
    problem p;
    gqa_problem(&p, r->Hq, r->Hkv);
    const ref_attn *a = &p.a;

    /* (1) V constant per kv head: a query head's output names the kv head it read. */
    for (int b = 0; b < 2; ++b)
        for (int g = 0; g < r->Hkv; ++g)
            for (int j = 0; j < a->seq_kv; ++j)
                for (int d = 0; d < 2; ++d)
                    p.v[kv_row(a, b, g, j) * 2 + (size_t)d] = 1.0 + g + 10.0 * b;
    problem_run(&p);
    double *want = alloc_doubles(p.nout);
    for (int b = 0; b < 2; ++b)
        for (int h = 0; h < r->Hq; ++h)
            for (int i = 0; i < a->seq_q; ++i)
                for (int d = 0; d < 2; ++d)
                    want[q_row(a, b, h, i) * 2 + (size_t)d] = 1.0 + h / group + 10.0 * b;
    tu_assert_allclose("out with constant V per kv head", p.out, want, p.nout, 1e-14, 1e-14);
    free(want);
    problem_free(&p);

    /* (2) The same problem with K and V copied out to one kv head per query head is identical. */
    problem e;
    gqa_problem(&p, r->Hq, r->Hkv);
    problem_run(&p);
    gqa_problem(&e, r->Hq, r->Hq);
    for (int b = 0; b < 2; ++b)
        for (int h = 0; h < r->Hq; ++h)
            for (int j = 0; j < a->seq_kv; ++j) {
                memcpy(e.k + kv_row(&e.a, b, h, j) * 4, p.k + kv_row(&p.a, b, h / group, j) * 4, 4 * sizeof(double));
                memcpy(e.v + kv_row(&e.a, b, h, j) * 2, p.v + kv_row(&p.a, b, h / group, j) * 2, 2 * sizeof(double));
            }
    memcpy(e.q, p.q, p.nq * sizeof(double));
    problem_run(&e);
    tu_assert_allclose("out vs expanded heads", p.out, e.out, p.nout, 0.0, 0.0);
    tu_assert_allclose("lse vs expanded heads", p.lse, e.lse, p.nrow, 0.0, 0.0);
    tu_assert_allclose("probs vs expanded heads", p.probs, e.probs, p.nprob, 0.0, 0.0);
    tu_assert_allclose("scores vs expanded heads", p.scores, e.scores, p.nprob, 0.0, 0.0);
    problem_free(&e);
    problem_free(&p);
}

/* =============================== merge of key splits =============================== */

/*
 * Attention over keys [c_0, c_1) ∪ ... ∪ [c_{n-1}, c_n), each part computed alone and merged, equals
 * attention over all keys. Each part gets the raw length L - c (negative or past its end, so the
 * reference's clamp is exercised), and causal is handed to the parts as an explicit -inf mask.
 */
typedef struct merge_row {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D, Dv, causal, has_len;
    int len[4];
    mask_kind mask;
    double neginf_frac;
    int parts;
    int cuts[6];
} merge_row;

static merge_row merge_rows[] = {
    {"two_even", 1, 2, 2, 3, 8, 4, 4, 0, 0, {0}, MASK_NONE, 0.0, 2, {0, 4, 8}},
    {"three_uneven_causal", 2, 2, 1, 3, 11, 4, 3, 1, 0, {0}, MASK_NONE, 0.0, 3, {0, 1, 6, 11}},
    {"four_parts_mask", 1, 4, 2, 2, 16, 8, 8, 0, 0, {0}, MASK_FULL, 0.2, 4, {0, 3, 5, 9, 16}},
    {"kv_len_empty_tail", 2, 1, 1, 2, 9, 4, 4, 0, 1, {4, 9}, MASK_NONE, 0.0, 3, {0, 3, 6, 9}},
    {"mask_empty_parts", 1, 2, 2, 3, 8, 4, 4, 0, 0, {0}, MASK_FULL, 0.7, 2, {0, 4, 8}},
    {"all_empty", 2, 1, 1, 2, 6, 4, 4, 0, 1, {0, 0}, MASK_NONE, 0.0, 2, {0, 3, 6}},
    {"causal_tall_kv_len", 2, 2, 2, 5, 6, 4, 4, 1, 1, {6, 3}, MASK_SHARED, 0.2, 3, {0, 2, 4, 6}},
};

static void test_merge_split(void **state)
{
    const merge_row *r = *state;
    problem whole;
    problem_init(&whole, r->B, r->Hq, r->Hkv, r->Sq, r->Skv, r->D, r->Dv);
    tu_rng rng;
    tu_seed(&rng, 1111);
    problem_random(&whole, &rng);
    whole.a.causal = r->causal;
    if (r->has_len)
        problem_kv_len(&whole, r->len);
    problem_mask(&whole, r->mask, &rng, r->neginf_frac);
    problem_run(&whole);
    const ref_attn *a = &whole.a;
    const int dv = dv_of(a);

    /* Full-shape mask with causal folded in, sliced per part below. */
    double *m = expand_mask(&whole);
    for (int b = 0; b < r->B; ++b)
        for (int h = 0; h < r->Hq; ++h)
            for (int i = 0; i < r->Sq; ++i)
                for (int j = 0; j < r->Skv; ++j)
                    if (r->causal && j > i + len_of(a, b) - r->Sq)
                        m[q_row(a, b, h, i) * (size_t)r->Skv + (size_t)j] = -INFINITY;

    problem part[5];
    const double *outs[5], *lses[5];
    assert_true(r->parts >= 1 && r->parts <= 5 && r->cuts[0] == 0 && r->cuts[r->parts] == r->Skv);
    for (int pi = 0; pi < r->parts; ++pi) {
        const int c = r->cuts[pi], n = r->cuts[pi + 1] - c;
        problem *s = &part[pi];
        problem_init(s, r->B, r->Hq, r->Hkv, r->Sq, n, r->D, r->Dv);
        memcpy(s->q, whole.q, whole.nq * sizeof(double));
        for (int b = 0; b < r->B; ++b) {
            for (int g = 0; g < r->Hkv; ++g)
                for (int j = 0; j < n; ++j) {
                    memcpy(s->k + kv_row(&s->a, b, g, j) * (size_t)r->D, whole.k + kv_row(a, b, g, c + j) * (size_t)r->D,
                           (size_t)r->D * sizeof(double));
                    memcpy(s->v + kv_row(&s->a, b, g, j) * (size_t)dv, whole.v + kv_row(a, b, g, c + j) * (size_t)dv,
                           (size_t)dv * sizeof(double));
                }
            s->kv_len[b] = (r->has_len ? r->len[b] : r->Skv) - c;
        }
        s->a.kv_len = s->kv_len;
        s->nmask = s->nprob;
        s->mask = alloc_doubles(s->nmask);
        for (size_t row = 0; row < s->nrow; ++row)
            memcpy(s->mask + row * (size_t)n, m + row * (size_t)r->Skv + (size_t)c, (size_t)n * sizeof(double));
        s->a.mask = s->mask;
        s->a.mask_shape[0] = r->B;
        s->a.mask_shape[1] = r->Hq;
        s->a.mask_shape[2] = r->Sq;
        s->a.mask_shape[3] = n;
        problem_run(s);
        outs[pi] = s->out;
        lses[pi] = s->lse;
    }
    double *out = alloc_doubles(whole.nout), *lse = alloc_doubles(whole.nrow);
    ref_merge(r->parts, (int)whole.nrow, dv, outs, lses, out, lse);
    tu_assert_allclose("merged out", out, whole.out, whole.nout, 1e-13, 1e-12);
    tu_assert_allclose("merged lse", lse, whole.lse, whole.nrow, 1e-13, 1e-13);
    ref_merge(r->parts, (int)whole.nrow, dv, outs, lses, out, NULL); /* lse may be NULL */
    tu_assert_allclose("merged out, no lse", out, whole.out, whole.nout, 1e-13, 1e-12);

    for (int pi = 0; pi < r->parts; ++pi)
        problem_free(&part[pi]);
    free(out);
    free(lse);
    free(m);
    problem_free(&whole);
}

/* Hand-computed merges with Dv = 1, including garbage under an empty part and extreme lse. */
typedef struct merge_hand_row {
    const char *name;
    int parts;
    double lse[3], out[3];
    double want_out, want_lse;
} merge_hand_row;

static merge_hand_row merge_hand_rows[] = {
    {"two_parts", 2, {0.0, LN3}, {1.0, 5.0}, 4.0, 2 * LN2},
    {"empty_part_with_nan_out", 3, {-INFINITY, LN2, LN2}, {NAN, 1.0, 3.0}, 2.0, 2 * LN2},
    {"all_empty", 2, {-INFINITY, -INFINITY}, {NAN, 7.0}, 0.0, -INFINITY},
    {"huge_lse", 2, {1000.0, 1000.0}, {2.0, 4.0}, 3.0, 1000.0 + LN2},
    {"tiny_lse", 2, {-1000.0, -1000.0 + LN3}, {4.0, 0.0}, 1.0, -1000.0 + 2 * LN2},
    {"single", 1, {0.5}, {-3.0}, -3.0, 0.5},
};

static void test_merge_hand(void **state)
{
    const merge_hand_row *r = *state;
    const double *outs[3], *lses[3];
    for (int i = 0; i < r->parts; ++i) {
        outs[i] = &r->out[i];
        lses[i] = &r->lse[i];
    }
    double out = -1.0, lse = -1.0;
    ref_merge(r->parts, 1, 1, outs, lses, &out, &lse);
    tu_assert_allclose("out", &out, &r->want_out, 1, 1e-13, 1e-13);
    tu_assert_allclose("lse", &lse, &r->want_lse, 1, 1e-12, 1e-14);
}

/* =============================== softmax, hand-written rows =============================== */

typedef struct softmax_row {
    const char *name;
    int rows, cols;
    double scale;
    int causal, len; /* len < 0: no kv_len */
    int has_mask;    /* mask is one row {1, 1, 1, cols} shared by all rows */
    double mask[4];
    double in[12];
    double want[12]; /* NaN means NaN expected */
} softmax_row;

static softmax_row softmax_rows[] = {
    {"neginf_entries", 1, 4, 0, 0, -1, 0, {0}, {0.0, -INFINITY, LN3, -INFINITY}, {0.25, 0.0, 0.75, 0.0}},
    {"all_neginf", 1, 3, 0, 0, -1, 0, {0}, {-INFINITY, -INFINITY, -INFINITY}, {0.0, 0.0, 0.0}},
    {"nan_visible", 1, 3, 0, 0, -1, 0, {0}, {1.0, NAN, 2.0}, {NAN, NAN, NAN}},
    {"nan_hidden_by_len", 1, 3, 0, 0, 2, 0, {0}, {0.0, LN3, NAN}, {0.25, 0.75, 0.0}},
    {"nan_hidden_by_mask", 1, 3, 0, 0, -1, 1, {0.0, -INFINITY, 0.0}, {1.0, NAN, 1.0}, {0.5, 0.0, 0.5}},
    {"nan_hidden_by_causal", 2, 3, 0, 1, -1, 0, {0}, {0.0, 0.0, NAN, 0.0, 0.0, 0.0}, {0.5, 0.5, 0.0, 1.0 / 3, 1.0 / 3, 1.0 / 3}},
    {"scale", 1, 2, 2.0, 0, -1, 0, {0}, {0.0, LN3 / 2}, {0.25, 0.75}},
    {"scale_zero_means_one", 1, 2, 0.0, 0, -1, 0, {0}, {0.0, LN3}, {0.25, 0.75}},
    {"causal_wide", 2, 3, 0, 1, -1, 0, {0}, {0}, {0.5, 0.5, 0.0, 1.0 / 3, 1.0 / 3, 1.0 / 3}},
    {"causal_tall", 3, 2, 0, 1, -1, 0, {0}, {0}, {0.0, 0.0, 1.0, 0.0, 0.5, 0.5}},
    {"causal_kv_len", 2, 4, 0, 1, 3, 0, {0}, {0}, {0.5, 0.5, 0.0, 0.0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0.0}},
    {"mask_additive", 2, 3, 0, 0, -1, 1, {0.0, -INFINITY, LN2}, {0}, {1.0 / 3, 0.0, 2.0 / 3, 1.0 / 3, 0.0, 2.0 / 3}},
    {"kv_len_zero", 1, 3, 0, 0, 0, 0, {0}, {1.0, 2.0, 3.0}, {0.0, 0.0, 0.0}},
    {"shift_plus_1e4", 1, 2, 0, 0, -1, 0, {0}, {1e4, 1e4 + LN3}, {0.25, 0.75}},
    {"shift_minus_1e4", 1, 2, 0, 0, -1, 0, {0}, {-1e4, -1e4 + LN3}, {0.25, 0.75}},
};

static void test_softmax(void **state)
{
    const softmax_row *r = *state;
    ref_softmax s = {.batch = 1, .heads = 1, .rows = r->rows, .cols = r->cols, .scale = r->scale, .causal = r->causal};
    if (r->len >= 0)
        s.kv_len = &r->len;
    if (r->has_mask) {
        s.mask = r->mask;
        s.mask_shape[0] = s.mask_shape[1] = s.mask_shape[2] = 1;
        s.mask_shape[3] = r->cols;
    }
    double out[12];
    const size_t n = (size_t)(r->rows * r->cols);
    ref_softmax_rows(&s, r->in, out);
    /* 1e4 + ln 3 is stored with ~1e-12 error; everything else is exact to a few ulps. */
    tu_assert_allclose("softmax", out, r->want, n, 1e-11, 1e-12);
}

/* =============================== f16 / bf16 conversions =============================== */

typedef struct bits_row {
    const char *name;
    int bf16;      /* 0: f16, 1: bf16 */
    float value;
    uint16_t bits;
    int exact;     /* the value is representable, so bits -> value must hold too */
} bits_row;

static bits_row bits_rows[] = {
    /* f16: exact values */
    {"f16_one", 0, 1.0f, 0x3C00, 1},
    {"f16_minus_two", 0, -2.0f, 0xC000, 1},
    {"f16_half", 0, 0.5f, 0x3800, 1},
    {"f16_max", 0, 65504.0f, 0x7BFF, 1},
    {"f16_min_normal", 0, 0x1p-14f, 0x0400, 1},
    {"f16_min_subnormal_5.96e-8", 0, 0x1p-24f, 0x0001, 1},
    {"f16_max_subnormal", 0, 0x1.ff8p-15f, 0x03FF, 1},
    {"f16_neg_zero", 0, -0.0f, 0x8000, 1},
    {"f16_inf", 0, INFINITY, 0x7C00, 1},
    {"f16_neg_inf", 0, -INFINITY, 0xFC00, 1},
    {"f16_third_decoded", 0, 0.333251953125f, 0x3555, 1},
    /* f16: rounding. Ulp at 1 is 2^-10, so 1 + 2^-11 is a tie between mantissas 0 and 1. */
    {"f16_third", 0, 1.0f / 3.0f, 0x3555, 0},
    {"f16_tie_to_even_down", 0, 0x1.002p0f, 0x3C00, 0},     /* 1 + 2^-11 -> 1 */
    {"f16_tie_to_even_up", 0, 0x1.006p0f, 0x3C02, 0},       /* 1 + 3*2^-11 -> 1 + 2^-9 */
    {"f16_above_tie", 0, 0x1.002002p0f, 0x3C01, 0},         /* 1 + 2^-11 + 2^-23 -> 1 + 2^-10 */
    {"f16_carry_into_exponent", 0, 0x1.ffep0f, 0x4000, 0},  /* 2 - 2^-11: tie, 0x3BFF odd -> 2 */
    {"f16_overflow_tie_65520", 0, 65520.0f, 0x7C00, 0},
    {"f16_below_overflow_tie", 0, 65519.0f, 0x7BFF, 0},
    {"f16_overflow", 0, 1e5f, 0x7C00, 0},
    {"f16_neg_overflow", 0, -1e5f, 0xFC00, 0},
    {"f16_flt_max", 0, FLT_MAX, 0x7C00, 0},
    {"f16_subnormal_tie_to_zero", 0, 0x1p-25f, 0x0000, 0},  /* half the smallest subnormal */
    {"f16_just_above_half_subnormal", 0, 0x1.000002p-25f, 0x0001, 0},
    {"f16_subnormal_tie_up", 0, 0x1.8p-24f, 0x0002, 0},      /* 1.5 * 2^-24 -> 2 (even) */
    {"f16_subnormal_rounds_to_normal", 0, 0x1.ffcp-15f, 0x0400, 0}, /* 1023.5 * 2^-24 */
    {"f16_f32_subnormal", 0, 0x1p-140f, 0x0000, 0},
    {"f16_neg_tiny", 0, -0x1p-30f, 0x8000, 0},
    /* bf16: exact values */
    {"bf16_one", 1, 1.0f, 0x3F80, 1},
    {"bf16_minus_two", 1, -2.0f, 0xC000, 1},
    {"bf16_three", 1, 3.0f, 0x4040, 1},
    {"bf16_max", 1, 0x1.fep127f, 0x7F7F, 1},
    {"bf16_inf", 1, INFINITY, 0x7F80, 1},
    {"bf16_neg_inf", 1, -INFINITY, 0xFF80, 1},
    {"bf16_neg_zero", 1, -0.0f, 0x8000, 1},
    /* bf16: rounding. Ulp at 1 is 2^-7. */
    {"bf16_tie_to_even_down", 1, 0x1.01p0f, 0x3F80, 0},     /* 1 + 2^-8 -> 1 */
    {"bf16_tie_to_even_up", 1, 0x1.03p0f, 0x3F82, 0},       /* 1 + 3*2^-8 -> 1 + 2^-6 */
    {"bf16_above_tie", 1, 0x1.010002p0f, 0x3F81, 0},
    {"bf16_carry_into_exponent", 1, 0x1.ffp0f, 0x4000, 0},  /* 2 - 2^-8: tie, 0x3FFF odd -> 2 */
    {"bf16_third", 1, 1.0f / 3.0f, 0x3EAB, 0},
    {"bf16_flt_max_overflows", 1, FLT_MAX, 0x7F80, 0},
    {"bf16_min_f32_subnormal", 1, 0x1p-149f, 0x0000, 0},
    {"bf16_subnormal_tie_up", 1, 0x1.8p-133f, 0x0002, 0},   /* bits 0x00018000 */
};

static void test_bits(void **state)
{
    const bits_row *r = *state;
    const uint16_t got = r->bf16 ? tu_f32_to_bf16(r->value) : tu_f32_to_f16(r->value);
    if (got != r->bits) {
        print_error("%a encodes as 0x%04X, want 0x%04X\n", (double)r->value, got, r->bits);
        fail();
    }
    if (r->exact) {
        const float back = r->bf16 ? tu_bf16_to_f32(r->bits) : tu_f16_to_f32(r->bits);
        if (back != r->value || signbit(back) != signbit(r->value)) {
            print_error("0x%04X decodes as %a, want %a\n", r->bits, (double)back, (double)r->value);
            fail();
        }
    }
}

static float float_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int is_nan16(uint16_t h, int bf16)
{
    return bf16 ? ((h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0) : ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0);
}

/* A NaN whose payload is only in the low bits must not truncate to inf; the sign survives. */
static void test_nan_conversions(void **state)
{
    (void)state;
    const float payload_low = float_of_bits(0x7F800001u), neg_nan = float_of_bits(0xFFC00000u);
    for (int bf = 0; bf <= 1; ++bf) {
        uint16_t (*enc)(float) = bf ? tu_f32_to_bf16 : tu_f32_to_f16;
        float (*dec)(uint16_t) = bf ? tu_bf16_to_f32 : tu_f16_to_f32;
        assert_true(is_nan16(enc(NAN), bf));
        assert_true(is_nan16(enc(payload_low), bf));
        assert_true(is_nan16(enc(neg_nan), bf));
        assert_true((enc(neg_nan) & 0x8000u) != 0);
        assert_true(isnan(dec(bf ? 0x7FC0 : 0x7E00)));
        assert_true(isnan(dec(bf ? 0x7F81 : 0x7C01))); /* signalling patterns decode as NaN too */
    }
}

/* Every 16-bit pattern decodes and re-encodes to itself (NaNs: to some NaN of the same sign). */
static void test_roundtrip_all(void **state)
{
    (void)state;
    for (int bf = 0; bf <= 1; ++bf)
        for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
            const float f = bf ? tu_bf16_to_f32((uint16_t)h) : tu_f16_to_f32((uint16_t)h);
            const uint16_t back = bf ? tu_f32_to_bf16(f) : tu_f32_to_f16(f);
            const int ok = is_nan16((uint16_t)h, bf)
                               ? (isnan(f) && is_nan16(back, bf) && (back & 0x8000u) == (h & 0x8000u))
                               : back == h;
            if (!ok) {
                print_error("%s 0x%04X -> %a -> 0x%04X\n", bf ? "bf16" : "f16", (unsigned)h, (double)f, back);
                fail();
            }
        }
}

/*
 * Exhaustive round-to-nearest-even: for every pair of adjacent positive finite codes h, h+1, the
 * exact midpoint goes to the even one, one float ulp below it to h, one above it to h+1, and the
 * negated values to the same codes with the sign bit. h+1 may be inf (overflow rounding).
 */
static void check_mid(int bf, uint32_t h, float x, uint16_t want)
{
    const uint16_t got = bf ? tu_f32_to_bf16(x) : tu_f32_to_f16(x);
    const uint16_t got_neg = bf ? tu_f32_to_bf16(-x) : tu_f32_to_f16(-x);
    if (got != want || got_neg != (uint16_t)(want | 0x8000u)) {
        print_error("%s near code 0x%04X: %a -> 0x%04X / -x -> 0x%04X, want 0x%04X\n", bf ? "bf16" : "f16",
                    (unsigned)h, (double)x, got, got_neg, want);
        fail();
    }
}

static void test_rne_all(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x7BFFu + 1u; ++h) {
        /* Midpoints of adjacent f16 values need at most 12 significant bits: exact in float. */
        const double lo = tu_f16_to_f32((uint16_t)h);
        const double hi = h == 0x7BFFu ? 65536.0 : tu_f16_to_f32((uint16_t)(h + 1u));
        const float mid = (float)((lo + hi) / 2.0);
        const uint16_t even = (uint16_t)((h & 1u) ? h + 1u : h);
        check_mid(0, h, mid, even);
        check_mid(0, h, nextafterf(mid, 0.0f), (uint16_t)h);
        check_mid(0, h, nextafterf(mid, INFINITY), (uint16_t)(h + 1u));
    }
    for (uint32_t h = 0; h < 0x7F7Fu + 1u; ++h) {
        /* A bf16 midpoint is the float whose low 16 bits are 0x8000; neighbours are ±1 in bits. */
        const uint32_t mid = (h << 16) | 0x8000u;
        const uint16_t even = (uint16_t)((h & 1u) ? h + 1u : h);
        check_mid(1, h, float_of_bits(mid), even);
        check_mid(1, h, float_of_bits(mid - 1u), (uint16_t)h);
        check_mid(1, h, float_of_bits(mid + 1u), (uint16_t)(h + 1u));
    }
}

/* tu_store / tu_load address element i with the dtype's size and round like the encoders. */
static void test_store_load(void **state)
{
    (void)state;
    static const double vals[] = {0.0, 1.0, -2.5, 1.0 / 3.0, 65504.0, 1e-3, 1e5, -1e-7};
    for (int dt = CLATTN_F32; dt <= CLATTN_BF16; ++dt) {
        union {
            float f[8];
            uint16_t h[16];
        } buf;
        for (size_t i = 0; i < N_OF(vals); ++i) {
            memset(&buf, 0xA5, sizeof buf);
            tu_store((clattn_dtype)dt, &buf, 3, vals[i]);
            double want;
            if (dt == CLATTN_F32)
                want = (float)vals[i];
            else if (dt == CLATTN_F16)
                want = tu_f16_to_f32(tu_f32_to_f16((float)vals[i]));
            else
                want = tu_bf16_to_f32(tu_f32_to_bf16((float)vals[i]));
            const double got = tu_load((clattn_dtype)dt, &buf, 3);
            tu_assert_allclose("stored value", &got, &want, 1, 0.0, 0.0);
            /* Neighbours untouched: element 3 occupies exactly its own bytes. */
            const size_t size = dt == CLATTN_F32 ? 4 : 2;
            const unsigned char *bytes = (const unsigned char *)&buf;
            for (size_t byte = 0; byte < sizeof buf; ++byte)
                if (byte < 3 * size || byte >= 4 * size)
                    assert_int_equal(bytes[byte], 0xA5);
        }
    }
    uint16_t h[2] = {0, 0};
    tu_store(CLATTN_F16, h, 1, 1.0);
    assert_int_equal(h[1], 0x3C00);
    tu_store(CLATTN_BF16, h, 0, 1.0);
    assert_int_equal(h[0], 0x3F80);
}

/* tu_fill hands back exactly what it stored, within range, reproducibly for a fixed seed. */
static void test_fill(void **state)
{
    (void)state;
    enum { N = 1000 };
    for (int dt = CLATTN_F32; dt <= CLATTN_BF16; ++dt) {
        float store1[N], store2[N]; /* big enough for every dtype */
        double d1[N], d2[N], loaded[N];
        tu_rng r1, r2;
        tu_seed(&r1, 77);
        tu_seed(&r2, 77);
        tu_fill(&r1, (clattn_dtype)dt, store1, d1, N, -2.0, 3.0);
        tu_fill(&r2, (clattn_dtype)dt, store2, NULL, N, -2.0, 3.0);
        double lo = INFINITY, hi = -INFINITY;
        for (size_t i = 0; i < N; ++i) {
            loaded[i] = tu_load((clattn_dtype)dt, store1, i);
            d2[i] = tu_load((clattn_dtype)dt, store2, i);
            lo = fmin(lo, d1[i]);
            hi = fmax(hi, d1[i]);
        }
        tu_assert_allclose("as_double vs stored", d1, loaded, N, 0.0, 0.0);
        tu_assert_allclose("same seed, same data", d2, d1, N, 0.0, 0.0);
        /* Rounding to storage may reach hi itself, never beyond; the draws must actually spread. */
        assert_true(lo >= -2.0 && hi <= 3.0);
        assert_true(lo < -1.9 && hi > 2.9);
    }
}

/* =============================== random numbers, comparisons, environment =============================== */

static void test_rng(void **state)
{
    (void)state;
    tu_rng a, b;
    /* splitmix64's published first output for seed 0: pins the algorithm, so data stays fixed. */
    tu_seed(&a, 0);
    assert_true(tu_next(&a) == UINT64_C(0xE220A8397B1DCDAF));

    tu_seed(&a, 42);
    tu_seed(&b, 42);
    for (int i = 0; i < 100; ++i)
        assert_true(tu_next(&a) == tu_next(&b));
    tu_seed(&b, 43);
    assert_true(tu_next(&a) != tu_next(&b));

    tu_seed(&a, 7);
    double sum = 0.0;
    enum { N = 100000 };
    for (int i = 0; i < N; ++i) {
        const double u = tu_uniform(&a, -3.0, 5.0);
        assert_true(u >= -3.0 && u < 5.0);
        sum += u;
    }
    assert_true(fabs(sum / N - 1.0) < 0.05); /* mean 1, sd of the mean ~0.007 */
}

typedef struct close_row {
    const char *name;
    double got, want, atol, rtol;
    int expect;
} close_row;

static close_row close_rows[] = {
    {"equal", 1.0, 1.0, 0.0, 0.0, 1},
    {"within_atol", 1.05, 1.0, 0.1, 0.0, 1},
    {"outside_atol", 1.2, 1.0, 0.1, 0.0, 0},
    {"boundary_inclusive", 1.5, 1.0, 0.5, 0.0, 1},
    {"within_rtol", 101.0, 100.0, 0.0, 0.02, 1},
    {"rtol_scales_want_not_got", 100.0, 0.0, 0.0, 2.0, 0},
    {"both_nan", NAN, NAN, 0.0, 0.0, 1},
    {"nan_vs_number", NAN, 1.0, 1e300, 1e300, 0},
    {"number_vs_nan", 1.0, NAN, 1e300, 1e300, 0},
    {"same_inf", INFINITY, INFINITY, 0.0, 0.0, 1},
    {"same_neg_inf", -INFINITY, -INFINITY, 0.0, 0.0, 1},
    {"opposite_inf", INFINITY, -INFINITY, 1e300, 1e300, 0},
    {"inf_vs_finite", INFINITY, 1e308, 1e300, 1e300, 0},
    {"finite_vs_inf_with_rtol", 1e308, INFINITY, 0.0, 1.0, 0}, /* rtol*inf must not excuse it */
};

static void test_close(void **state)
{
    const close_row *r = *state;
    assert_int_equal(tu_close(r->got, r->want, r->atol, r->rtol), r->expect);
}

static void test_count_bad(void **state)
{
    (void)state;
    const double got[] = {1.0, 2.0, NAN, 4.0, 5.0}, want[] = {1.0, 2.5, NAN, 4.0, 6.0};
    size_t first = 99;
    assert_int_equal(tu_count_bad(got, want, 5, 0.1, 0.0, &first), 2);
    assert_int_equal(first, 1);
    assert_int_equal(tu_count_bad(got, want, 0, 0.0, 0.0, &first), 0);
    assert_int_equal(first, 0);
    assert_int_equal(tu_count_bad(got, want, 5, 1.0, 0.0, NULL), 0);
    tu_assert_allclose("passes quietly", got, want, 5, 1.0, 0.0);
}

static void test_getenv_int(void **state)
{
    (void)state;
    const char *name = "CLATTN_TEST_REFERENCE_GETENV_INT";
    unsetenv(name);
    assert_int_equal(tu_getenv_int(name, 7), 7);
    setenv(name, "42", 1);
    assert_int_equal(tu_getenv_int(name, 7), 42);
    setenv(name, "-3", 1);
    assert_int_equal(tu_getenv_int(name, 7), -3);
    setenv(name, "", 1);
    assert_int_equal(tu_getenv_int(name, 7), 7);
    setenv(name, "4x", 1);
    assert_int_equal(tu_getenv_int(name, 7), 7);
    setenv(name, "99999999999999999999", 1);
    assert_int_equal(tu_getenv_int(name, 7), 7);
    unsetenv(name);
}

/* =============================== registration =============================== */

int main(void)
{
    TU_ADD_TABLE("uniform", test_uniform, uniform_rows);
    TU_ADD_TABLE("one_hot", test_onehot, onehot_rows);
    TU_ADD_TABLE("consistency", test_consistency, random_rows);
    TU_ADD_TABLE("softmax_vs_attention", test_softmax_matches_attention, random_rows);
    TU_ADD_TABLE("causal_pattern", test_pattern, pattern_rows);
    TU_ADD_TABLE("empty_rows", test_empty, empty_rows);
    TU_ADD_TABLE("hidden_poison", test_poison, poison_rows);
    TU_ADD_TABLE("nan_visible", test_nan_visible, nan_rows);
    TU_ADD_TABLE("shift", test_shift, shift_rows);
    TU_ADD_TABLE("gqa", test_gqa, gqa_rows);
    TU_ADD_TABLE("merge_split", test_merge_split, merge_rows);
    TU_ADD_TABLE("merge_hand", test_merge_hand, merge_hand_rows);
    TU_ADD_TABLE("softmax", test_softmax, softmax_rows);
    TU_ADD_TABLE("bits", test_bits, bits_rows);
    TU_ADD_TABLE("close", test_close, close_rows);
    tu_add_test("conversion/nan", NULL, test_nan_conversions, NULL);
    tu_add_test("conversion/roundtrip_all_codes", NULL, test_roundtrip_all, NULL);
    tu_add_test("conversion/rne_all_midpoints", NULL, test_rne_all, NULL);
    tu_add_test("conversion/store_load", NULL, test_store_load, NULL);
    tu_add_test("conversion/fill", NULL, test_fill, NULL);
    tu_add_test("util/rng", NULL, test_rng, NULL);
    tu_add_test("util/count_bad", NULL, test_count_bad, NULL);
    tu_add_test("util/getenv_int", NULL, test_getenv_int, NULL);

    const int failed = tu_run_tests("reference");
    return failed;
}
