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

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

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

typedef enum layout_kind {
    LAYOUT_BHSD,   /* contiguous [b][h][s][d] */
    LAYOUT_BSHD,   /* [b][s][h][d] */
    LAYOUT_PADDED  /* nonzero offset and padded strides inside a bigger buffer */
} layout_kind;

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
    layout_kind layout;     /* q, k and the mask */
    layout_kind out_layout; /* scores */
    float scale;            /* 0: 1/sqrt(D) */
    int poison;             /* NaN/Inf in K at keys past the kv length: their scores stay -inf */
} sc_case;

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

    /* kv lengths, alone and combined */
    {"kvlen", 3, 2, 2, 19, 129, 64, F32, F32, .has_kv = 1, .kv = {129, 40, 0}},
    {"kvlen_clamped", 2, 2, 2, 19, 129, 64, F32, F32, .has_kv = 1, .kv = {-3, 5000}},
    {"kvlen_causal", 3, 2, 2, 19, 129, 64, F32, F32, .causal = 1, .has_kv = 1, .kv = {129, 10, 77}},
    {"kvlen_poison", 2, 2, 2, 19, 129, 64, F32, F32, .has_kv = 1, .kv = {100, 7}, .poison = 1},
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
};
/* clang-format on */

/* =============================== resources =============================== */

/* Everything a test allocates is recorded here and released by teardown, which cmocka runs even
 * when the test fails half-way (fail() longjmps out of it). */
enum { MAX_RES = 256 };
static void *res_ptr[MAX_RES];
static size_t n_ptr;
static cl_mem res_mem[MAX_RES];
static size_t n_mem;
static clattn_context *g_ctx;

static void *xalloc(size_t bytes)
{
    assert_true(n_ptr < MAX_RES);
    void *p = calloc(bytes > 0 ? bytes : 1, 1);
    assert_non_null(p);
    res_ptr[n_ptr++] = p;
    return p;
}

static double *xdoubles(size_t n)
{
    return xalloc(n * sizeof(double));
}

static cl_mem xbuffer(size_t bytes, const void *host)
{
    assert_true(n_mem < MAX_RES);
    cl_mem m = tu_buffer(g_ctx, bytes, host);
    res_mem[n_mem++] = m;
    return m;
}

static int teardown(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_ptr; ++i)
        free(res_ptr[i]);
    for (size_t i = 0; i < n_mem; ++i)
        clReleaseMemObject(res_mem[i]);
    n_ptr = n_mem = 0;
    return 0;
}

static clattn_context *ctx_get(void)
{
    if (g_ctx == NULL)
        g_ctx = tu_context();
    return g_ctx;
}

/* FNV-1a of the row name: a fixed seed per case that does not move when rows are reordered. */
static uint64_t seed_of(const char *name)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (const char *p = name; *p; ++p)
        h = (h ^ (uint64_t)(unsigned char)*p) * UINT64_C(0x100000001b3);
    return h;
}

/* =============================== strided views =============================== */

/* A tensor view plus the host image of its whole buffer. `fshape` is the shape of the stored data
 * (broadcast dimensions 1); the view's shape may differ only for stride-0 broadcasting. */
typedef struct view {
    clattn_tensor t;
    int64_t fshape[4];
    size_t n;   /* elements in fshape */
    size_t cap; /* elements in the buffer */
    size_t esz;
    unsigned char *img;
} view;

enum { GUARD = 7 }; /* elements past the view's end, to catch writes beyond it */

static size_t at(const view *v, int64_t b, int64_t h, int64_t s, int64_t d)
{
    return (size_t)(v->t.offset + b * v->t.stride[0] + h * v->t.stride[1] + s * v->t.stride[2] + d);
}

/* Lays out shape {B, H, S, D} of dt; every buffer element starts as `pad` (NaN for inputs, a
 * sentinel for outputs). */
static void view_init(view *v, layout_kind lay, clattn_dtype dt, int64_t B, int64_t H, int64_t S, int64_t D,
                      double pad)
{
    memset(v, 0, sizeof *v);
    v->t.dtype = dt;
    v->t.shape[0] = v->fshape[0] = B;
    v->t.shape[1] = v->fshape[1] = H;
    v->t.shape[2] = v->fshape[2] = S;
    v->t.shape[3] = v->fshape[3] = D;
    switch (lay) {
    case LAYOUT_BHSD:
        v->t.stride[2] = D;
        v->t.stride[1] = S * D;
        v->t.stride[0] = H * S * D;
        break;
    case LAYOUT_BSHD:
        v->t.stride[1] = D;
        v->t.stride[2] = H * D;
        v->t.stride[0] = S * H * D;
        break;
    case LAYOUT_PADDED:
        v->t.offset = 37;
        v->t.stride[2] = D + 5;
        v->t.stride[1] = S * v->t.stride[2] + 3;
        v->t.stride[0] = H * v->t.stride[1] + 11;
        break;
    }
    v->n = (size_t)(B * H * S * D);
    v->cap = at(v, B - 1, H - 1, S - 1, D - 1) + 1 + GUARD;
    v->esz = clattn_dtype_size(dt);
    v->img = xalloc(v->cap * v->esz);
    for (size_t i = 0; i < v->cap; ++i)
        tu_store(dt, v->img, i, pad);
}

/* Copies contiguous typed data (fshape order) into the image at the view's positions. */
static void scatter(view *v, const void *src)
{
    const int64_t *s = v->fshape;
    size_t lin = 0;
    for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t h = 0; h < s[1]; ++h)
            for (int64_t i = 0; i < s[2]; ++i)
                for (int64_t d = 0; d < s[3]; ++d, ++lin)
                    memcpy(v->img + at(v, b, h, i, d) * v->esz, (const unsigned char *)src + lin * v->esz,
                           v->esz);
}

/* The view's elements of a read-back image, as doubles in fshape order. */
static void gather(const view *v, const unsigned char *img, double *dst)
{
    const int64_t *s = v->fshape;
    size_t lin = 0;
    for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t h = 0; h < s[1]; ++h)
            for (int64_t i = 0; i < s[2]; ++i)
                for (int64_t d = 0; d < s[3]; ++d, ++lin)
                    dst[lin] = tu_load(v->t.dtype, img, at(v, b, h, i, d));
}

/* Fails unless every buffer element outside the view still holds what v->img held. */
static void assert_untouched(const char *what, const view *v, const unsigned char *img)
{
    unsigned char *mark = xalloc(v->cap);
    const int64_t *s = v->t.shape;
    for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t h = 0; h < s[1]; ++h)
            for (int64_t i = 0; i < s[2]; ++i)
                for (int64_t d = 0; d < s[3]; ++d)
                    mark[at(v, b, h, i, d)] = 1;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < v->cap; ++i)
        if (!mark[i] && memcmp(img + i * v->esz, v->img + i * v->esz, v->esz) != 0)
            if (bad++ == 0)
                first = i;
    if (bad != 0) {
        print_error("%s: %zu buffer elements outside the view were modified, first at element %zu "
                    "(now %.9g, sentinel %.9g)\n",
                    what, bad, first, tu_load(v->t.dtype, img, first), tu_load(v->t.dtype, v->img, first));
        fail();
    }
}

static void upload(view *v)
{
    v->t.buffer = xbuffer(v->cap * v->esz, v->img);
}

/* Reads the whole buffer back, checks the outside is untouched, returns the view as doubles. */
static void download(const char *what, const view *v, double *dst)
{
    unsigned char *img = xalloc(v->cap * v->esz);
    tu_read(g_ctx, v->t.buffer, v->cap * v->esz, img);
    assert_untouched(what, v, img);
    gather(v, img, dst);
}

/* Stores x as element i of contiguous typed data and keeps the stored value in as_double[i]. */
static void put(clattn_dtype dt, void *typed, double *as_double, size_t i, double x)
{
    tu_store(dt, typed, i, x);
    as_double[i] = tu_load(dt, typed, i);
}

/* Like tu_assert_allclose, but records the failure and returns, so one row reports every
 * algorithm's result before it fails. With CLATTN_TEST_VERBOSE=1 it prints the worst
 * |diff| / allowed ratio of passing checks too, to see how much margin a tolerance leaves. */
static int g_failures;

static void check_close(const char *what, const double *got, const double *want, size_t n, double atol,
                        double rtol)
{
    size_t first;
    const size_t bad = tu_count_bad(got, want, n, atol, rtol, &first);
    if (bad != 0) {
        print_error("%s: element %zu: got %.9g, want %.9g (|diff| %.3g, allowed %.3g = atol %.3g + rtol %.3g * "
                    "|want|); %zu of %zu elements out of tolerance\n",
                    what, first, got[first], want[first], fabs(got[first] - want[first]),
                    atol + rtol * fabs(want[first]), atol, rtol, bad, n);
        ++g_failures;
        return;
    }
    if (tu_getenv_int("CLATTN_TEST_VERBOSE", 0)) {
        double worst = 0.0;
        for (size_t i = 0; i < n; ++i)
            if (isfinite(want[i])) {
                const double r = fabs(got[i] - want[i]) / (atol + rtol * fabs(want[i]));
                worst = r > worst ? r : worst;
            }
        print_message("    %-40s worst |diff|/allowed %.3f\n", what, worst);
    }
}

typedef struct result {
    double *out, *lse, *probs;
} result;

/* =============================== one row =============================== */

static void test_case(void **state)
{
    const sc_case *c = *state;
    ctx_get();
    g_failures = 0;
    tu_rng rng;
    tu_seed(&rng, seed_of(c->name));

    const double scale = c->scale != 0.0f ? (double)c->scale : (double)(float)(1.0 / sqrt((double)c->D));
    /* Scores of standard deviation ~2 (q·k over [-qa, qa] x [-1, 1] has sd qa·sqrt(D)/3). */
    double qa = 6.0 / (fabs(scale) * sqrt((double)c->D));
    qa = qa > 6.0 ? 6.0 : qa;

    const size_t esz = clattn_dtype_size(c->dt);
    view q, k, mask, out;
    memset(&mask, 0, sizeof mask);
    view_init(&q, c->layout, c->dt, c->B, c->Hq, c->Sq, c->D, NAN);
    view_init(&k, c->layout, c->dt, c->B, c->Hkv, c->Skv, c->D, NAN);
    void *tq = xalloc(q.n * esz), *tk = xalloc(k.n * esz);
    double *xq = xdoubles(q.n), *xk = xdoubles(k.n);
    tu_fill(&rng, c->dt, tq, xq, q.n, -qa, qa);
    tu_fill(&rng, c->dt, tk, xk, k.n, -1.0, 1.0);

    int kvl[4] = {0, 0, 0, 0};
    for (int b = 0; b < c->B; ++b)
        kvl[b] = c->kv[b];
    if (c->poison)
        for (int b = 0; b < c->B; ++b) {
            const int L = kvl[b] < 0 ? 0 : (kvl[b] > c->Skv ? c->Skv : kvl[b]);
            for (int g = 0; g < c->Hkv; ++g)
                for (int j = L; j < c->Skv; ++j)
                    for (int d = 0; d < c->D; ++d)
                        put(c->dt, tk, xk, (((size_t)b * (size_t)c->Hkv + (size_t)g) * (size_t)c->Skv + (size_t)j) *
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
        view_init(&mask, c->layout, c->mask_dt, ms[0], ms[1], ms[2], ms[3], NAN);
        void *tm = xalloc(mask.n * mask.esz);
        xm = xdoubles(mask.n);
        tu_fill(&rng, c->mask_dt, tm, xm, mask.n, -2.0, 2.0);
        for (size_t i = 0; i < mask.n; ++i)
            if (tu_uniform(&rng, 0.0, 1.0) < 0.1)
                put(c->mask_dt, tm, xm, i, -INFINITY);
        scatter(&mask, tm);
        if (c->mask == MASK_HEADS_STRIDE0) {
            mask.t.shape[1] = c->Hq;
            mask.t.stride[1] = 0;
        }
        upload(&mask);
    }
    scatter(&q, tq);
    scatter(&k, tk);
    upload(&q);
    upload(&k);
    cl_mem kv_buf = c->has_kv ? xbuffer(sizeof(int) * (size_t)c->B, kvl) : NULL;

    view_init(&out, c->out_layout, c->out_dt, c->B, c->Hq, c->Sq, c->Skv, 777.0);
    upload(&out);

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
    const clattn_status st = clattn_scores(g_ctx, &desc, &q.t, &k.t, &out.t, 0, NULL, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_scores returned %s: %s", clattn_status_string(st), clattn_last_error(g_ctx));
    assert_non_null(done);
    clReleaseEvent(done);
    tu_finish(g_ctx);

    const size_t n = out.n;
    double *got = xdoubles(n), *want = xdoubles(n), *bound = xdoubles(n);
    download("scores", &out, got);

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
    check_close("scores vs reference", got, want, n, atol, rtol);

    /* The reference must actually hide something where the row asks it to (a row that hides
     * nothing would pass an implementation that ignores causal or kv_lengths); causal 1x1 is the
     * one row that legitimately hides nothing. */
    if ((c->causal && c->Skv > 1) || c->has_kv || c->mask != MASK_NONE) {
        size_t hidden = 0;
        for (size_t i = 0; i < n; ++i)
            hidden += want[i] == -INFINITY;
        assert_true(hidden > 0);
    }
    if (g_failures != 0)
        fail_msg("%d check(s) failed", g_failures);
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
        tests[n++] = (struct CMUnitTest){cases[i].name, test_case, NULL, teardown, (void *)&cases[i]};
    }
    const int failed = _cmocka_run_group_tests("scores", tests, n, NULL, NULL);
    clattn_release(g_ctx);
    return failed;
}
