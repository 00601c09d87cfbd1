/*
 * Checks the float64 training reference (ref/clattn_ref_bwd.c): Philox-4x32-10 against Random123's
 * known answers, ref_dropout_z's bit layout (pinned to those answers), its statistics and its
 * dependence on every coordinate, dropout in ref_attention's forward, and ref_attention_backward
 * against central finite differences of ref_attention (so forward and backward must agree on every
 * variant), plus the isolation of hidden keys and empty rows from NaN. No OpenCL device is needed.
 *
 * Table-driven: each table row is one cmocka test named "<area>/<row>".
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* =============================== Philox-4x32-10 =============================== */

/*
 * Random123's known-answer vectors: tests/kat_vectors of github.com/DEShawResearch/random123
 * (commit 9545ff6413f258be2f04c1d319d99aaef7521150, the v1.14.0 file), lines 27-29, the
 * "philox4x32 10" lines; columns CTR (4 words), KEY (2 words), EXPECTED (4 words):
 *
 *   philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
 *   philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
 *   philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
 */
typedef struct kat_row {
    const char *name;
    uint32_t ctr[4], key[2], want[4];
} kat_row;

static const kat_row kat_rows[] = {
    {"zeros", {0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {"ones",
     {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {"pi",
     {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

static void test_kat(void **state)
{
    const kat_row *row = *state;
    uint32_t out[4];
    ref_philox4x32_10(row->ctr, row->key, out);
    for (int w = 0; w < 4; ++w)
        assert_int_equal(out[w], row->want[w]);
}

/* =============================== ref_dropout_z =============================== */

/*
 * The dropout rule's bit layout. Key c (as an unsigned 32-bit word) uses counter word
 * 16·floor(c / 128) + c mod 16, and takes half floor(c / 16) mod 2 of word floor(c / 32) mod 4:
 * the 8 keys c0 + 16·m (m = 0..7, c0 mod 128 < 16) share one counter and key m takes half m mod 2
 * of word m / 2. The "zeros" row reaches Random123's all-zero known answer; the others compare
 * with ref_philox4x32_10 (checked against the known answers above) of the counter written out by
 * hand: "wrap_negative" through 32-bit wrapping (r = -1, c0 = -113, so c = 0xffffff8f + 16·m and
 * counter word 0x1fffffff; b·heads_q + h = 65537·65535 = 2^32 - 1). The first word never has its
 * top 3 bits (c >> 7 has 25), so Random123's other two answers are out of reach.
 */
/* 1 / (1 - p) rounded to a double, as ref_dropout_z returns it: through a volatile, since x87
 * (32-bit x86) would otherwise compare its 80-bit quotient with the returned double. */
static double kept_z(double p)
{
    volatile double z = 1.0 / (1.0 - p);
    return z;
}

typedef struct layout_row {
    const char *name;
    unsigned long long seed;
    unsigned offset;
    int b, heads_q, h;
    long long r, c0;
    uint32_t ctr0;    /* the counter's first word, by hand */
    int known;        /* words below are the known answer (else computed from ctr0) */
    uint32_t words[4];
} layout_row;

static const layout_row layout_rows[] = {
    {"zeros", 0, 0, 0, 1, 0, 0, 0, 0, 1, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {"wrap_negative", 0xffffffffffffffffull, 0xffffffffu, 65537, 65535, 0, -1, -113, 0x1fffffffu, 0, {0}},
    {"pi", 0x299f31d0a4093822ull, 0x03707344u, 0, 0x13198a2f, 0x13198a2e, 0x85a308d3ll, 128ll * 0x043f6a8 + 8,
     0x043f6a88u, 0, {0}},
};

static void test_layout(void **state)
{
    const layout_row *row = *state;
    uint32_t w4[4];
    if (row->known) {
        memcpy(w4, row->words, sizeof w4);
    } else {
        const uint32_t ctr[4] = {row->ctr0, (uint32_t)row->r, (uint32_t)row->b * (uint32_t)row->heads_q + (uint32_t)row->h,
                                 row->offset};
        const uint32_t key[2] = {(uint32_t)row->seed, (uint32_t)(row->seed >> 32)};
        ref_philox4x32_10(ctr, key, w4);
    }
    for (int m = 0; m < 8; ++m) {
        const uint32_t w = w4[m / 2];
        const unsigned half = (m & 1) ? w >> 16 : w & 0xffffu;
        const long long c = row->c0 + 16 * m;
        /* The threshold at the half itself keeps the key (half >= t); one above drops it. p = t / 65536
         * is exact, so round(p·65536) = t; half 0 is kept even at p = 0. */
        const double p_keep = (double)half / 65536.0, p_drop = (double)(half + 1) / 65536.0;
        const double zk = ref_dropout_z(row->seed, row->offset, p_keep, row->b, row->heads_q, row->h, row->r, c);
        const double zd = ref_dropout_z(row->seed, row->offset, p_drop, row->b, row->heads_q, row->h, row->r, c);
        if (half > 0)
            assert_true(zk == kept_z(p_keep));
        else
            assert_true(zk == 1.0);
        if (half < 0xffffu)
            assert_true(zd == 0.0);
    }
}

/* The zeros block by hand at p = 45000 / 65536 (t = 45000): halves e8d5 6627 c58d e169 ac4c bc57
 * dbd8 9b00 for c = 0, 16, .., 112 are kept, dropped, kept, kept, dropped, kept, kept, dropped. */
static void test_zeros_block(void **state)
{
    (void)state;
    const double p = 45000.0 / 65536.0;
    const int kept[8] = {1, 0, 1, 1, 0, 1, 1, 0};
    for (int m = 0; m < 8; ++m)
        assert_true(ref_dropout_z(0, 0, p, 0, 1, 0, 0, 16 * m) == (kept[m] ? kept_z(p) : 0.0));
}

/* The kept fraction over 400 x 400 (row, key) pairs (160000 draws) lies within 5 binomial sigmas
 * of 1 - t / 65536, and every kept z is exactly 1 / (1 - p). */
typedef struct frac_row {
    const char *name;
    double p;
} frac_row;

static const frac_row frac_rows[] = {{"p0.1", 0.1}, {"p0.5", 0.5}, {"p0.9", 0.9}};

static void test_fraction(void **state)
{
    const frac_row *row = *state;
    const int n_r = 400, n_c = 400;
    const double zk = kept_z(row->p);
    long kept = 0;
    for (int r = 0; r < n_r; ++r)
        for (int c = 0; c < n_c; ++c) {
            const double z = ref_dropout_z(0x0123456789abcdefull, 7, row->p, 1, 4, 2, r - 100, c - 50);
            assert_true(z == 0.0 || z == zk);
            kept += z != 0.0;
        }
    const double n = (double)n_r * n_c;
    const double keep = 1.0 - round(row->p * 65536.0) / 65536.0;
    const double sigma = sqrt(n * keep * (1.0 - keep));
    printf("  %s: kept %ld of %.0f, expected %.1f +- %.1f\n", row->name, kept, n, n * keep, sigma);
    assert_true(fabs((double)kept - n * keep) <= 5.0 * sigma);
}

/* p = 0 keeps every key with weight exactly 1, whatever the coordinates. */
static void test_p_zero(void **state)
{
    (void)state;
    for (int r = -20; r < 20; ++r)
        for (int c = -20; c < 20; ++c)
            assert_true(ref_dropout_z(0xdeadbeefull, 3, 0.0, 1, 2, 1, r, c) == 1.0);
}

/* Each coordinate of the counter and key changes the mask: over 64 x 64 pairs at p = 0.5 the masks
 * of two settings differing in one input must disagree on about half of them (independent masks:
 * 2048 +- 32); at least a quarter is required. */
typedef struct coord {
    unsigned long long seed;
    unsigned offset;
    int b, h;
    long long dr, dc; /* shifts of r and c */
} coord;

typedef struct diff_row {
    const char *name;
    coord x, y;
} diff_row;

static const diff_row diff_rows[] = {
    {"seed_lo", {1, 0, 0, 0, 0, 0}, {2, 0, 0, 0, 0, 0}},
    {"seed_hi", {1, 0, 0, 0, 0, 0}, {1 | (1ull << 32), 0, 0, 0, 0, 0}},
    {"offset", {5, 0, 0, 0, 0, 0}, {5, 1, 0, 0, 0, 0}},
    {"batch", {5, 0, 0, 1, 0, 0}, {5, 0, 1, 1, 0, 0}},
    {"head", {5, 0, 0, 0, 0, 0}, {5, 0, 0, 1, 0, 0}},
    {"batch_vs_head", {5, 0, 1, 0, 0, 0}, {5, 0, 0, 3, 0, 0}}, /* b·heads_q + h: 4 vs 3 */
    {"row", {5, 0, 0, 0, 0, 0}, {5, 0, 0, 0, 1, 0}},
    {"key_block", {5, 0, 0, 0, 0, 0}, {5, 0, 0, 0, 0, 8}},
};

static void test_differ(void **state)
{
    const diff_row *row = *state;
    const int heads_q = 4;
    int differ = 0;
    for (int r = 0; r < 64; ++r)
        for (int c = 0; c < 64; ++c) {
            const coord *x = &row->x, *y = &row->y;
            const double zx = ref_dropout_z(x->seed, x->offset, 0.5, x->b, heads_q, x->h, r + x->dr, c + x->dc);
            const double zy = ref_dropout_z(y->seed, y->offset, 0.5, y->b, heads_q, y->h, r + y->dr, c + y->dc);
            differ += zx != zy;
        }
    assert_true(differ >= 1024);
}

/* =============================== problems =============================== */

typedef struct bwd_case {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D, Dv;
    int causal;
    int kv_len[2];   /* used when use_kv_len */
    int use_kv_len;
    double neginf;   /* > 0: a full additive mask, this fraction -inf */
    int empty_mask_row; /* the mask hides every key of row (0, 0, 1) */
    double softcap;
    int alibi;
    int sinks;       /* random sinks, head 1 -inf when heads_q > 1 */
    int window;
    long long wl, wr;
    long long chunk;
    long long q_offset, k_offset;
    double dropout_p;
    int want_empty;  /* the case must have a row with no visible key */
} bwd_case;

typedef struct prob {
    ref_attn a;
    int kv_len[2];
    double *q, *k, *v, *mask, *sinks, *alibi, *dout, *out;
    double *dq, *dk, *dv, *dsinks;
    size_t nq, nk, nv, nout, nrow;
} prob;

static int dv_of(const ref_attn *a)
{
    return a->head_dim_v != 0 ? a->head_dim_v : a->head_dim;
}

static void fill(tu_rng *rng, double *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; ++i)
        x[i] = tu_uniform(rng, lo, hi);
}

static void prob_init(prob *p, const bwd_case *c)
{
    memset(p, 0, sizeof *p);
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(c->name));
    ref_attn *a = &p->a;
    a->batch = c->B;
    a->heads_q = c->Hq;
    a->heads_kv = c->Hkv;
    a->seq_q = c->Sq;
    a->seq_kv = c->Skv;
    a->head_dim = c->D;
    a->head_dim_v = c->Dv;
    a->causal = c->causal;
    a->softcap = c->softcap;
    a->window = c->window;
    a->window_left = c->wl;
    a->window_right = c->wr;
    a->chunk = c->chunk;
    a->q_offset = c->q_offset;
    a->k_offset = c->k_offset;
    a->dropout_p = c->dropout_p;
    a->dropout_seed = 0x5eed0000cafef00dull;
    a->dropout_offset = 11;
    const size_t Dv = (size_t)dv_of(a);
    p->nrow = (size_t)c->B * (size_t)c->Hq * (size_t)c->Sq;
    p->nq = p->nrow * (size_t)c->D;
    p->nk = (size_t)c->B * (size_t)c->Hkv * (size_t)c->Skv * (size_t)c->D;
    p->nv = (size_t)c->B * (size_t)c->Hkv * (size_t)c->Skv * Dv;
    p->nout = p->nrow * Dv;
    p->q = tu_xdoubles(p->nq);
    p->k = tu_xdoubles(p->nk);
    p->v = tu_xdoubles(p->nv);
    p->dout = tu_xdoubles(p->nout);
    p->out = tu_xdoubles(p->nout);
    p->dq = tu_xdoubles(p->nq);
    p->dk = tu_xdoubles(p->nk);
    p->dv = tu_xdoubles(p->nv);
    fill(&rng, p->q, p->nq, -1.0, 1.0);
    fill(&rng, p->k, p->nk, -1.0, 1.0);
    fill(&rng, p->v, p->nv, -1.0, 1.0);
    fill(&rng, p->dout, p->nout, -1.0, 1.0);
    if (c->use_kv_len) {
        p->kv_len[0] = c->kv_len[0];
        p->kv_len[1] = c->kv_len[1];
        a->kv_len = p->kv_len;
    }
    if (c->neginf > 0.0 || c->empty_mask_row) {
        const size_t n = p->nrow * (size_t)c->Skv;
        p->mask = tu_xdoubles(n);
        for (size_t x = 0; x < n; ++x)
            p->mask[x] = tu_uniform(&rng, 0.0, 1.0) < c->neginf ? -INFINITY : tu_uniform(&rng, -1.0, 1.0);
        if (c->empty_mask_row)
            for (int j = 0; j < c->Skv; ++j)
                p->mask[1 * (size_t)c->Skv + (size_t)j] = -INFINITY; /* (b 0, h 0, i 1) */
        a->mask = p->mask;
        a->mask_shape[0] = c->B;
        a->mask_shape[1] = c->Hq;
        a->mask_shape[2] = c->Sq;
        a->mask_shape[3] = c->Skv;
    }
    if (c->alibi) {
        p->alibi = tu_xdoubles((size_t)c->Hq);
        ref_alibi_slopes(c->Hq, 8.0, p->alibi);
        a->alibi = p->alibi;
    }
    if (c->sinks) {
        p->sinks = tu_xdoubles((size_t)c->Hq);
        p->dsinks = tu_xdoubles((size_t)c->Hq);
        fill(&rng, p->sinks, (size_t)c->Hq, -1.0, 1.0);
        if (c->Hq > 1)
            p->sinks[1] = -INFINITY;
        a->sinks = p->sinks;
    }
}

static double loss(prob *p)
{
    ref_attention(&p->a, p->q, p->k, p->v, p->out, NULL, NULL);
    double s = 0.0;
    for (size_t x = 0; x < p->nout; ++x)
        s += p->dout[x] * p->out[x];
    return s;
}

/* Central differences of loss over every element of x, against the analytic gradient g. */
static void check_fd(prob *p, const char *what, double *x, const double *g, size_t n)
{
    const double h = 1e-6, rtol = 1e-6, atol = 1e-8;
    size_t bad = 0, first = n;
    double worst = 0.0;
    for (size_t e = 0; e < n; ++e) {
        const double x0 = x[e];
        x[e] = x0 + h;
        const double lp = loss(p);
        x[e] = x0 - h;
        const double lm = loss(p);
        x[e] = x0;
        const double fd = (lp - lm) / (2.0 * h);
        const double err = fabs(fd - g[e]) / (atol + rtol * fabs(g[e]));
        worst = err > worst ? err : worst;
        if (!(err <= 1.0)) {
            if (bad++ == 0)
                first = e;
        }
    }
    if (bad != 0) {
        const double x0 = x[first];
        x[first] = x0 + h;
        const double lp = loss(p);
        x[first] = x0 - h;
        const double lm = loss(p);
        x[first] = x0;
        fail_msg("%s: %zu of %zu gradients off the finite differences; first [%zu] analytic %.17g fd %.17g",
                 what, bad, n, first, g[first], (lp - lm) / (2.0 * h));
    }
    if (tu_getenv_int("CLATTN_TEST_VERBOSE", 0))
        printf("  %s: worst error / tolerance %.3g\n", what, worst);
}

static void backward(prob *p)
{
    ref_attention_backward(&p->a, p->q, p->k, p->v, p->dout, p->dq, p->dk, p->dv, p->dsinks);
}

/* Whether row (b, h, i) sees a key with a finite logit, and whether key (b, kv head g, j) is seen by
 * any row, by ref_logit (the rule ref_attention applies). */
static int row_sees(const prob *p, int b, int h, int i)
{
    for (int j = 0; j < p->a.seq_kv; ++j) {
        int vis;
        const double x = ref_logit(&p->a, p->q, p->k, b, h, i, j, &vis, NULL);
        if (vis && x != -INFINITY)
            return 1;
    }
    return 0;
}

static int key_seen(const prob *p, int b, int g, int j)
{
    const int group = p->a.heads_q / p->a.heads_kv;
    for (int h = g * group; h < (g + 1) * group; ++h)
        for (int i = 0; i < p->a.seq_q; ++i) {
            int vis;
            const double x = ref_logit(&p->a, p->q, p->k, b, h, i, j, &vis, NULL);
            if (vis && x != -INFINITY)
                return 1;
        }
    return 0;
}

/* Empty rows have dq exactly 0, unseen keys dk and dv exactly 0; returns the number of empty rows. */
static int check_structure(const prob *p)
{
    const ref_attn *a = &p->a;
    const size_t D = (size_t)a->head_dim, Dv = (size_t)dv_of(a);
    int empty = 0;
    for (int b = 0; b < a->batch; ++b) {
        for (int h = 0; h < a->heads_q; ++h)
            for (int i = 0; i < a->seq_q; ++i) {
                if (row_sees(p, b, h, i))
                    continue;
                ++empty;
                const size_t row = ((size_t)b * (size_t)a->heads_q + (size_t)h) * (size_t)a->seq_q + (size_t)i;
                for (size_t d = 0; d < D; ++d)
                    assert_true(p->dq[row * D + d] == 0.0);
            }
        for (int g = 0; g < a->heads_kv; ++g)
            for (int j = 0; j < a->seq_kv; ++j) {
                if (key_seen(p, b, g, j))
                    continue;
                const size_t kr = ((size_t)b * (size_t)a->heads_kv + (size_t)g) * (size_t)a->seq_kv + (size_t)j;
                for (size_t d = 0; d < D; ++d)
                    assert_true(p->dk[kr * D + d] == 0.0);
                for (size_t d = 0; d < Dv; ++d)
                    assert_true(p->dv[kr * Dv + d] == 0.0);
            }
    }
    return empty;
}

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t e = 0; e < n; ++e)
        m = fabs(x[e]) > m ? fabs(x[e]) : m;
    return m;
}

/* Shapes: B, Hq, Hkv, Sq, Skv, D, Dv (0: D). */
#define SHAPE(b_, hq_, hkv_, sq_, skv_, d_, dv_) \
    .B = (b_), .Hq = (hq_), .Hkv = (hkv_), .Sq = (sq_), .Skv = (skv_), .D = (d_), .Dv = (dv_)

static const bwd_case bwd_rows[] = {
    {"plain", SHAPE(2, 2, 2, 4, 5, 3, 0)},
    {"causal_square", SHAPE(1, 2, 2, 5, 5, 4, 0), .causal = 1},
    {"causal_q_lt_kv", SHAPE(2, 1, 1, 3, 7, 3, 0), .causal = 1},
    {"causal_q_gt_kv", SHAPE(1, 2, 1, 7, 4, 3, 0), .causal = 1, .want_empty = 1},
    {"mask_neginf", SHAPE(2, 2, 1, 4, 6, 3, 0), .neginf = 0.3},
    {"mask_empty_row", SHAPE(1, 1, 1, 3, 5, 3, 0), .neginf = 0.2, .empty_mask_row = 1, .want_empty = 1},
    {"kv_len", SHAPE(2, 2, 2, 4, 6, 3, 0), .kv_len = {3, 0}, .use_kv_len = 1, .want_empty = 1},
    {"kv_len_causal", SHAPE(2, 1, 1, 4, 6, 3, 0), .causal = 1, .kv_len = {6, 2}, .use_kv_len = 1,
     .want_empty = 1},
    {"gqa", SHAPE(2, 4, 2, 3, 5, 3, 0)},
    {"dk_ne_dv", SHAPE(1, 2, 1, 4, 5, 3, 5), .causal = 1},
    {"softcap", SHAPE(2, 2, 2, 4, 5, 4, 0), .softcap = 0.7},
    {"alibi", SHAPE(1, 4, 2, 4, 6, 3, 0), .causal = 1, .alibi = 1},
    {"sinks", SHAPE(2, 2, 1, 4, 5, 3, 0), .sinks = 1},
    {"sinks_causal_empty", SHAPE(1, 2, 2, 6, 4, 3, 0), .causal = 1, .sinks = 1, .want_empty = 1},
    {"window", SHAPE(1, 2, 2, 6, 8, 3, 0), .window = 1, .wl = 2, .wr = 1},
    {"window_left_only", SHAPE(1, 1, 1, 6, 8, 3, 0), .causal = 1, .window = 1, .wl = 1, .wr = -1},
    {"chunk", SHAPE(1, 2, 1, 6, 8, 3, 0), .causal = 1, .chunk = 3},
    {"offsets", SHAPE(2, 2, 2, 3, 6, 3, 0), .causal = 1, .q_offset = 4, .k_offset = 2},
    {"offsets_chunk", SHAPE(1, 2, 2, 4, 7, 3, 0), .causal = 1, .chunk = 3, .q_offset = 5, .k_offset = 2},
    {"dropout", SHAPE(2, 2, 2, 5, 9, 3, 0), .dropout_p = 0.4},
    {"dropout_causal_offsets", SHAPE(1, 4, 2, 4, 11, 3, 4), .causal = 1, .sinks = 1, .q_offset = 3,
     .k_offset = -5, .dropout_p = 0.3},
    {"everything", SHAPE(2, 4, 2, 5, 9, 3, 4), .causal = 1, .kv_len = {9, 6}, .use_kv_len = 1,
     .neginf = 0.15, .softcap = 0.9, .alibi = 1, .sinks = 1, .window = 1, .wl = 4, .wr = 1, .chunk = 4,
     .q_offset = 2, .k_offset = 1, .dropout_p = 0.25},
};

static void test_backward_fd(void **state)
{
    const bwd_case *c = *state;
    prob p;
    prob_init(&p, c);
    backward(&p);

    /* Not vacuous: some gradient is far from 0 (the tolerance's atol is 1e-8). */
    assert_true(max_abs(p.dq, p.nq) > 1e-2 && max_abs(p.dk, p.nk) > 1e-2 && max_abs(p.dv, p.nv) > 1e-2);
    const int empty = check_structure(&p);
    if (c->want_empty)
        assert_true(empty > 0);

    check_fd(&p, "dq", p.q, p.dq, p.nq);
    check_fd(&p, "dk", p.k, p.dk, p.nk);
    check_fd(&p, "dv", p.v, p.dv, p.nv);
    if (p.sinks != NULL) {
        check_fd(&p, "dsinks", p.sinks, p.dsinks, (size_t)c->Hq);
        if (c->Hq > 1)
            assert_true(p.dsinks[1] == 0.0); /* a -inf sink */
        assert_true(p.dsinks[0] != 0.0);
    }

    /* Dropout must drop some visible keys and keep others. */
    if (c->dropout_p > 0.0) {
        int kept = 0, dropped = 0;
        for (int b = 0; b < c->B; ++b)
            for (int h = 0; h < c->Hq; ++h)
                for (int i = 0; i < c->Sq; ++i) {
                    const int len = c->use_kv_len ? c->kv_len[b] : c->Skv;
                    const long long r = i + len - c->Sq + c->q_offset;
                    for (int j = 0; j < c->Skv; ++j) {
                        int vis;
                        ref_logit(&p.a, p.q, p.k, b, h, i, j, &vis, NULL);
                        if (vis) {
                            const double z = ref_dropout_z(p.a.dropout_seed, p.a.dropout_offset, c->dropout_p, b,
                                                           c->Hq, h, r, c->k_offset + j);
                            kept += z != 0.0;
                            dropped += z == 0.0;
                        }
                    }
                }
        assert_true(kept > 0 && dropped > 0);
    }
}

/* =============================== dropout in the forward =============================== */

/* out with dropout = Σ_j probs_ij·z_ij·v_j, probs and lse those without dropout, by the test's own
 * r = i + L - seq_q + q_offset and c = j + k_offset (negative c here: k_offset -3). */
static void test_forward_dropout(void **state)
{
    (void)state;
    const bwd_case c = {"fwd", SHAPE(2, 2, 1, 5, 9, 3, 4), .causal = 1, .kv_len = {9, 7}, .use_kv_len = 1,
                        .sinks = 1, .q_offset = 2, .k_offset = -3, .dropout_p = 0.5};
    prob p;
    prob_init(&p, &c);
    const size_t Dv = 4, Skv = 9;
    double *out0 = tu_xdoubles(p.nout), *lse0 = tu_xdoubles(p.nrow), *probs0 = tu_xdoubles(p.nrow * Skv);
    double *out1 = tu_xdoubles(p.nout), *lse1 = tu_xdoubles(p.nrow), *probs1 = tu_xdoubles(p.nrow * Skv);
    ref_attention(&p.a, p.q, p.k, p.v, out1, lse1, probs1);
    ref_attn off = p.a;
    off.dropout_p = 0.0;
    ref_attention(&off, p.q, p.k, p.v, out0, lse0, probs0);
    assert_memory_equal(lse0, lse1, p.nrow * sizeof(double));
    assert_memory_equal(probs0, probs1, p.nrow * Skv * sizeof(double));

    double *want = tu_xdoubles(p.nout);
    int dropped = 0;
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.Hq; ++h)
            for (int i = 0; i < c.Sq; ++i) {
                const size_t row = ((size_t)b * (size_t)c.Hq + (size_t)h) * (size_t)c.Sq + (size_t)i;
                const long long r = i + c.kv_len[b] - c.Sq + c.q_offset;
                for (int j = 0; j < c.Skv; ++j) {
                    const double pr = probs1[row * Skv + (size_t)j];
                    if (pr == 0.0)
                        continue;
                    const double z =
                        ref_dropout_z(p.a.dropout_seed, p.a.dropout_offset, 0.5, b, c.Hq, h, r, c.k_offset + j);
                    dropped += z == 0.0;
                    for (size_t d = 0; d < Dv; ++d)
                        want[row * Dv + d] += pr * z * p.v[((size_t)b * Skv + (size_t)j) * Dv + d];
                }
            }
    assert_true(dropped > 0);
    tu_assert_allclose("out with dropout", out1, want, p.nout, 1e-14, 1e-12);
    /* and it differs from the undropped output */
    assert_true(tu_count_bad(out1, out0, p.nout, 1e-9, 0.0, NULL) > 0);
}

/* =============================== isolation =============================== */

/*
 * NaN and Inf in K and V rows no row sees (past kv_len; a column the mask hides everywhere) and in
 * the Q of rows that see no key (causal with seq_q > L): every gradient is finite and bitwise what
 * it is with those values replaced by 0.
 */
static void poison(prob *p, double val)
{
    const ref_attn *a = &p->a;
    const size_t D = (size_t)a->head_dim, Dv = (size_t)dv_of(a);
    for (int b = 0; b < a->batch; ++b) {
        for (int g = 0; g < a->heads_kv; ++g)
            for (int j = 0; j < a->seq_kv; ++j)
                if (!key_seen(p, b, g, j)) {
                    const size_t kr = ((size_t)b * (size_t)a->heads_kv + (size_t)g) * (size_t)a->seq_kv + (size_t)j;
                    for (size_t d = 0; d < D; ++d)
                        p->k[kr * D + d] = (d & 1) ? val : -val;
                    for (size_t d = 0; d < Dv; ++d)
                        p->v[kr * Dv + d] = val;
                }
        for (int h = 0; h < a->heads_q; ++h)
            for (int i = 0; i < a->seq_q; ++i)
                if (!row_sees(p, b, h, i)) {
                    const size_t row = ((size_t)b * (size_t)a->heads_q + (size_t)h) * (size_t)a->seq_q + (size_t)i;
                    for (size_t d = 0; d < D; ++d)
                        p->q[row * D + d] = val;
                }
    }
}

typedef struct poison_row {
    const char *name;
    double val;
} poison_row;

static const poison_row poison_rows[] = {{"nan", NAN}, {"inf", INFINITY}};

static void test_poison(void **state)
{
    const poison_row *pr = *state;
    /* causal, seq_q 6 > L: batch 0 (L 4) has 2 empty rows and keys 4, 5 unseen; the mask hides
     * key 1 from every row; dropout and sinks on, so no path is left out. */
    const bwd_case c = {"poison", SHAPE(2, 2, 1, 6, 6, 3, 4), .causal = 1, .kv_len = {4, 6}, .use_kv_len = 1,
                        .softcap = 0.8, .alibi = 1, .sinks = 1, .dropout_p = 0.3};
    prob clean, dirty;
    prob_init(&clean, &c);
    prob_init(&dirty, &c);
    double *mask = tu_xdoubles(clean.nrow * 6);
    for (size_t r = 0; r < clean.nrow; ++r)
        mask[r * 6 + 1] = -INFINITY;
    for (prob *p = &clean; p != NULL; p = p == &clean ? &dirty : NULL) {
        p->a.mask = mask;
        p->a.mask_shape[0] = 2;
        p->a.mask_shape[1] = 2;
        p->a.mask_shape[2] = 6;
        p->a.mask_shape[3] = 6;
    }
    poison(&clean, 0.0);
    poison(&dirty, pr->val);
    assert_true(isnan(dirty.k[1 * 3]) || isinf(dirty.k[1 * 3])); /* key 1, batch 0: poisoned */
    backward(&clean);
    backward(&dirty);
    const double *g0[] = {clean.dq, clean.dk, clean.dv, clean.dsinks};
    const double *g1[] = {dirty.dq, dirty.dk, dirty.dv, dirty.dsinks};
    const size_t n[] = {clean.nq, clean.nk, clean.nv, 2};
    for (int t = 0; t < 4; ++t)
        for (size_t e = 0; e < n[t]; ++e) {
            assert_true(isfinite(g1[t][e]));
            assert_true(g1[t][e] == g0[t][e]);
        }
    assert_true(check_structure(&dirty) > 0);
    /* The forward agrees: out is finite too. */
    loss(&dirty);
    for (size_t e = 0; e < dirty.nout; ++e)
        assert_true(isfinite(dirty.out[e]));
}

/* =============================== registration =============================== */

int main(void)
{
    tu_set_fixtures(NULL, tu_teardown);
    TU_ADD_TABLE("philox_kat", test_kat, kat_rows);
    TU_ADD_TABLE("dropout_layout", test_layout, layout_rows);
    tu_add_test("dropout_layout", "zeros_by_hand", test_zeros_block, NULL);
    TU_ADD_TABLE("dropout_fraction", test_fraction, frac_rows);
    tu_add_test("dropout", "p_zero", test_p_zero, NULL);
    TU_ADD_TABLE("dropout_differ", test_differ, diff_rows);
    tu_add_test("dropout", "forward", test_forward_dropout, NULL);
    TU_ADD_TABLE("backward_fd", test_backward_fd, bwd_rows);
    TU_ADD_TABLE("backward_poison", test_poison, poison_rows);
    return tu_run_tests("ref_backward");
}
