/*
 * clattn_softmax against ref_softmax_rows: row-wise stable softmax of scale·in + mask, with causal
 * and kv_lengths hiding columns, in place and out of place, over f32/f16/bf16 storage.
 *
 * Table-driven, one cmocka test per row; inputs are fixed-seed uniform values in [-4, 4] (plus the
 * row's offset) stored in the input dtype, and the reference computes on exactly the stored values.
 * The output buffer starts as a sentinel that must survive outside the output view (for in place,
 * the input's NaN padding must survive). Rows with nothing visible must be exactly 0, and so must
 * every hidden or -inf entry.
 *
 * Tolerance (relative; probabilities are positive): the kernel forms t = x·scale + mask in fp32
 * (|t| <= ~8 here, so ~2^-24·8 absolute each), takes exp2((t - max)·log2 e) (a few ulp) and
 * divides by a sum of C positive terms (~sqrt(C)·2^-24 relative): rtol 1e-5, times
 * sqrt(C / 1024) for longer rows. An offset of ±1e4 makes t ~1e4, rounded to half an ulp = 2^-11
 * there: each probability and the sum move by at most that (times log2 e in exp2's argument), so
 * rtol grows by 2·|offset·scale|·2^-23 (≈ 2.4e-3 for 1e4).
 * f16 output adds half an ulp (rtol 2^-11, atol 2^-25 among subnormals); bf16 output rtol 2^-8.
 */
#include "testutil.h"

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
    MASK_FULL,          /* {B, H, R, C} */
    MASK_HEADS,         /* {B, 1, R, C} */
    MASK_SHARED,        /* {1, 1, R, C} */
    MASK_BATCH_ROWS,    /* {1, H, 1, C} */
    MASK_HEADS_STRIDE0  /* {B, H, R, C} with head stride 0 */
} mask_kind;

typedef struct sm_case {
    const char *name;
    int B, H, R, C;
    clattn_dtype in_dt, out_dt;
    float scale; /* 0: 1 */
    int causal;
    mask_kind mask;
    clattn_dtype mask_dt;
    int has_kv;
    int kv[4];
    tu_layout layout;
    int in_place;       /* out is the very same view as in (2: with H 1, out's unused head stride differs) */
    double offset;      /* added to every input value */
    double neginf_frac; /* fraction of input entries set to -inf */
    int inf_rows;       /* row 0 of (b 0, h 0) all -inf, row 1 all -inf but one entry */
    int nan_row;        /* one NaN at a visible entry of row 1 of (b 0, h 0) */
    double spike;       /* added to one entry of every row: a maximum the kernel must find */
} sm_case;

/* clang-format off */
static const sm_case cases[] = {
    /* row lengths */
    {"len1", 1, 1, 3, 1, F32, F32, .causal = 0},
    {"len2", 2, 1, 3, 2, F32, F32, .causal = 0},
    {"len3", 1, 2, 4, 3, F32, F32, .causal = 0},
    {"len5", 2, 2, 3, 5, F32, F32, .causal = 0},
    {"len64", 2, 2, 8, 64, F32, F32, .causal = 0},
    {"len1000", 1, 2, 5, 1000, F32, F32, .causal = 0},
    {"len4097", 1, 1, 3, 4097, F32, F32, .causal = 0},
    {"len65536", 1, 1, 1, 65536, F32, F32, .causal = 0},
    {"len1000000", 1, 1, 1, 1000000, F32, F32, .causal = 0},
    {"len65536_f16", 1, 1, 1, 65536, F16, F16, .causal = 0},

    /* One entry of each row 100 above the rest, in the first columns, the last (the 16-column
     * tail) and between (every chunk position of the maximum pass): a maximum that missed it would
     * leave e^96 > FLT_MAX in the sum, and the row would come out NaN. The rest are e^-96 and
     * below: 0 or subnormal in fp32, within atol. Rows of 100, 1040 and 1073 columns end the
     * pass (softmax_rows) with 2, 1 and 3 16-column chunks after its groups of 4, then 4, 0 and 1
     * columns one at a time. */
    {"spike_100", 2, 2, 40, 100, F32, F32, .spike = 100.0},
    {"spike_1000", 1, 2, 64, 1000, F32, F32, .spike = 100.0},
    {"spike_1040_f16_in", 1, 1, 70, 1040, F16, F32, .spike = 100.0},
    {"spike_1073_mask", 1, 1, 70, 1073, F32, F32, .spike = 100.0, .mask = MASK_SHARED, .mask_dt = F32},

    /* large offsets: the max subtraction must keep exp in range */
    {"offset_plus_1e4", 1, 2, 5, 1000, F32, F32, .offset = 1e4},
    {"offset_minus_1e4", 2, 1, 7, 64, F32, F32, .offset = -1e4},
    {"offset_plus_1e4_f16_in", 1, 1, 4, 100, F16, F32, .offset = 1e4},
    {"offset_minus_1e4_long", 1, 1, 1, 65536, F32, F32, .offset = -1e4},

    /* -inf, all -inf, NaN */
    {"neg_inf_entries", 1, 2, 5, 1000, F32, F32, .neginf_frac = 0.2},
    {"neg_inf_entries_short", 2, 2, 4, 7, F32, F32, .neginf_frac = 0.3},
    {"all_neg_inf_row", 1, 2, 4, 64, F32, F32, .inf_rows = 1},
    {"all_neg_inf_row_f16", 1, 2, 4, 13, F16, F16, .inf_rows = 1},
    {"nan_row", 2, 2, 4, 64, F32, F32, .nan_row = 1},
    {"nan_row_long", 1, 1, 3, 5000, F32, F32, .nan_row = 1},
    {"nan_row_causal", 1, 2, 4, 64, F32, F32, .causal = 1, .nan_row = 1},
    {"nan_row_mask", 1, 2, 4, 64, F32, F32, .mask = MASK_FULL, .mask_dt = F32, .nan_row = 1},

    /* in place and out of place */
    {"in_place", 1, 2, 5, 1000, F32, F32, .in_place = 1},
    {"in_place_f16", 2, 2, 3, 77, F16, F16, .in_place = 1},
    {"in_place_one_head_other_head_stride", 2, 1, 9, 33, F32, F32, .in_place = 2},
    {"in_place_bf16_mask_causal", 2, 2, 9, 33, BF16, BF16, .in_place = 1, .causal = 1, .mask = MASK_HEADS,
     .mask_dt = F16},
    {"in_place_padded_kvlen", 2, 2, 9, 33, F32, F32, .in_place = 1, .layout = LAYOUT_PADDED, .has_kv = 1,
     .kv = {20, 0}},

    /* scale */
    {"scale_0_37", 1, 2, 5, 1000, F32, F32, .scale = 0.37f},
    {"scale_negative", 2, 1, 4, 64, F32, F32, .scale = -1.5f},

    /* causal, mask, kv_lengths */
    {"causal_7x13", 2, 2, 7, 13, F32, F32, .causal = 1},
    {"causal_13x7", 2, 2, 13, 7, F32, F32, .causal = 1}, /* rows 0..5 see nothing */
    {"causal_kvlen", 3, 2, 13, 40, F32, F32, .causal = 1, .has_kv = 1, .kv = {40, 4, 0}},
    {"mask_full_f32", 2, 2, 5, 64, F32, F32, .mask = MASK_FULL, .mask_dt = F32},
    {"mask_full_f16", 2, 2, 5, 64, F32, F32, .mask = MASK_FULL, .mask_dt = F16},
    {"mask_heads", 2, 3, 5, 64, F32, F32, .mask = MASK_HEADS, .mask_dt = F32},
    {"mask_shared", 2, 3, 5, 64, F32, F32, .mask = MASK_SHARED, .mask_dt = F32},
    {"mask_batch_rows", 2, 3, 5, 64, F32, F32, .mask = MASK_BATCH_ROWS, .mask_dt = F16},
    {"mask_heads_stride0", 2, 3, 5, 64, F32, F32, .mask = MASK_HEADS_STRIDE0, .mask_dt = F32},
    {"kvlen", 3, 2, 4, 64, F32, F32, .has_kv = 1, .kv = {0, 64, 17}},
    {"kvlen_clamped", 2, 2, 4, 64, F32, F32, .has_kv = 1, .kv = {-1, 99}},
    {"causal_mask_kvlen", 3, 2, 9, 50, F32, F32, .causal = 1, .mask = MASK_FULL, .mask_dt = F32, .has_kv = 1,
     .kv = {50, 30, 3}},

    /* storage types */
    {"f16_in_f32_out", 2, 2, 5, 100, F16, F32, .causal = 0},
    {"f32_in_f16_out", 2, 2, 5, 100, F32, F16, .causal = 0},
    {"bf16_in_bf16_out", 2, 2, 5, 100, BF16, BF16, .causal = 0},
    {"f16_in_bf16_out", 2, 2, 5, 100, F16, BF16, .causal = 1},
    {"bf16_in_f16_out_mask_f16", 2, 2, 5, 100, BF16, F16, .mask = MASK_FULL, .mask_dt = F16},

    /* layouts */
    {"layout_padded", 2, 2, 5, 61, F32, F16, .layout = LAYOUT_PADDED},
    {"layout_bshd", 2, 3, 5, 64, F32, F32, .layout = LAYOUT_BSHD, .mask = MASK_FULL, .mask_dt = F32},
};
/* clang-format on */

typedef struct result {
    double *out, *lse, *probs;
} result;

/* =============================== one row =============================== */

static size_t row_index(const sm_case *c, int b, int h, int i)
{
    return ((size_t)b * (size_t)c->H + (size_t)h) * (size_t)c->R + (size_t)i;
}

static void test_case(void **state)
{
    const sm_case *c = *state;
    tu_ctx_get();
    tu_failures = 0;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(c->name));
    const size_t C = (size_t)c->C;

    tu_view in, out, mask;
    memset(&mask, 0, sizeof mask);
    tu_view_init(&in, c->layout, c->in_dt, c->B, c->H, c->R, c->C, NAN);
    void *tin = tu_xalloc(in.n * in.esz);
    double *x = tu_xdoubles(in.n);
    tu_fill(&rng, c->in_dt, tin, x, in.n, -4.0 + c->offset, 4.0 + c->offset);
    if (c->neginf_frac > 0.0)
        for (size_t i = 0; i < in.n; ++i)
            if (tu_uniform(&rng, 0.0, 1.0) < c->neginf_frac)
                tu_put(c->in_dt, tin, x, i, -INFINITY);
    if (c->inf_rows) {
        for (size_t j = 0; j < C; ++j) {
            tu_put(c->in_dt, tin, x, row_index(c, 0, 0, 0) * C + j, -INFINITY);
            tu_put(c->in_dt, tin, x, row_index(c, 0, 0, 1) * C + j, j == C / 2 ? 0.5 : -INFINITY);
        }
    }
    if (c->nan_row)
        tu_put(c->in_dt, tin, x, row_index(c, 0, 0, 1) * C, NAN); /* column 0: visible in every row kind here */
    if (c->spike != 0.0)
        for (int b = 0; b < c->B; ++b)
            for (int h = 0; h < c->H; ++h)
                for (int r = 0; r < c->R; ++r) {
                    const size_t col = r < 8 ? C - 1 - (size_t)r : r < 12 ? (size_t)r - 8 : ((size_t)r * 53 + 11) % C;
                    const size_t i = row_index(c, b, h, r) * C + col;
                    tu_put(c->in_dt, tin, x, i, x[i] + c->spike);
                }

    int kvl[4] = {0, 0, 0, 0};
    for (int b = 0; b < c->B; ++b)
        kvl[b] = c->kv[b];
    int ms[4] = {c->B, c->H, c->R, c->C};
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
            if (i % C != 0 && tu_uniform(&rng, 0.0, 1.0) < 0.1) /* column 0 stays visible */
                tu_put(c->mask_dt, tm, xm, i, -INFINITY);
        tu_scatter(&mask, tm);
        if (c->mask == MASK_HEADS_STRIDE0) {
            mask.t.shape[1] = c->H;
            mask.t.stride[1] = 0;
        }
        tu_upload(&mask);
    }
    tu_scatter(&in, tin);
    tu_upload(&in);
    if (c->in_place) {
        out = in;
        if (c->in_place == 2) {
            assert_int_equal(c->H, 1);
            out.t.stride[1] += 999; /* never multiplied by a head index: the same elements */
        }
    } else {
        tu_view_init(&out, c->layout, c->out_dt, c->B, c->H, c->R, c->C, 777.0);
        tu_upload(&out);
    }
    cl_mem kv_buf = c->has_kv ? tu_xbuffer(sizeof(int) * (size_t)c->B, kvl) : NULL;

    clattn_softmax_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = c->B;
    desc.heads = c->H;
    desc.rows = c->R;
    desc.cols = c->C;
    desc.scale = c->scale;
    desc.causal = c->causal;
    desc.mask = c->mask != MASK_NONE ? &mask.t : NULL;
    desc.kv_lengths = kv_buf;
    cl_event done = NULL;
    const clattn_status st = clattn_softmax(tu_ctx, &desc, &in.t, &out.t, 0, NULL, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_softmax returned %s: %s", clattn_status_string(st), clattn_last_error(tu_ctx));
    assert_non_null(done);
    clReleaseEvent(done);
    tu_finish(tu_ctx);

    const size_t n = in.n;
    double *got = tu_xdoubles(n), *want = tu_xdoubles(n);
    tu_download("softmax out", &out, got);

    ref_softmax r;
    memset(&r, 0, sizeof r);
    r.batch = c->B;
    r.heads = c->H;
    r.rows = c->R;
    r.cols = c->C;
    r.scale = c->scale;
    r.causal = c->causal;
    r.mask = xm;
    memcpy(r.mask_shape, ms, sizeof ms);
    r.kv_len = c->has_kv ? kvl : NULL;
    ref_softmax_rows(&r, x, want);

    const double scale = c->scale != 0.0f ? fabs((double)c->scale) : 1.0;
    double rtol = 1e-5 * (C > 1024 ? sqrt((double)C / 1024.0) : 1.0) + 2.0 * fabs(c->offset) * scale * 0x1p-23;
    double atol = 1e-30;
    if (c->out_dt == F16) {
        atol += 0x1p-25;
        rtol += 0x1p-11;
    } else if (c->out_dt == BF16) {
        rtol += 0x1p-8;
    }
    tu_check_close("softmax vs reference", got, want, n, atol, rtol);

    /* Hidden, -inf and empty-row entries are exactly 0, not merely within atol. */
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
        if (want[i] == 0.0 && got[i] != 0.0 && bad++ == 0)
            first = i;
    if (bad != 0) {
        print_error("%zu entries that must be exactly 0 are not, first at %zu: %.9g\n", bad, first, got[first]);
        ++tu_failures;
    }
    /* The special inputs must show up in the reference, or the row tests nothing. */
    if (c->inf_rows)
        assert_true(want[row_index(c, 0, 0, 0) * C] == 0.0 && want[row_index(c, 0, 0, 1) * C + C / 2] == 1.0);
    if (c->nan_row)
        assert_true(isnan(want[row_index(c, 0, 0, 1) * C]));
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* =============================== invalid views =============================== */

/* A view of `buf` with shape {1, 1, rows, cols}, rows `ld` apart, from element `offset`. */
static clattn_tensor tensor_at(cl_mem buf, clattn_dtype dt, int64_t offset, int64_t rows, int64_t cols, int64_t ld)
{
    clattn_tensor t;
    memset(&t, 0, sizeof t);
    t.buffer = buf;
    t.dtype = dt;
    t.offset = offset;
    t.shape[0] = t.shape[1] = 1;
    t.shape[2] = rows;
    t.shape[3] = cols;
    t.stride[0] = t.stride[1] = rows * ld;
    t.stride[2] = ld;
    return t;
}

typedef struct overlap_row {
    const char *name;
    int64_t in_off, out_off, out_ld;
    clattn_dtype out_dt;
    int expect_ok; /* disjoint views of one buffer are fine */
} overlap_row;

enum { OV_ROWS = 4, OV_COLS = 16, OV_CAP = 2 * OV_ROWS * OV_COLS + 64 };

static const overlap_row overlap_rows[] = {
    {"shifted_by_one", 0, 1, OV_COLS, F32, 0},
    {"inside_other_rows", 0, OV_COLS, OV_COLS, F32, 0},
    {"same_offset_other_stride", 0, 0, OV_COLS + 1, F32, 0},
    {"same_offset_other_dtype", 0, 0, OV_COLS, F16, 0},
    {"out_before_in", 8, 0, OV_COLS, F32, 0},
    {"disjoint_after", 0, OV_ROWS * OV_COLS, OV_COLS, F32, 1},
    {"disjoint_before", OV_ROWS * OV_COLS + 3, 0, OV_COLS, F32, 1},
};

static void test_overlap(void **state)
{
    const overlap_row *o = *state;
    tu_ctx_get();
    float host[OV_CAP];
    double x[OV_ROWS * OV_COLS], want[OV_ROWS * OV_COLS], got[OV_ROWS * OV_COLS];
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(o->name));
    for (size_t i = 0; i < OV_CAP; ++i)
        host[i] = (float)tu_uniform(&rng, -3.0, 3.0);
    cl_mem buf = tu_xbuffer(sizeof host, host);
    const clattn_tensor in = tensor_at(buf, F32, o->in_off, OV_ROWS, OV_COLS, OV_COLS);
    const clattn_tensor out = tensor_at(buf, o->out_dt, o->out_off, OV_ROWS, OV_COLS, o->out_ld);
    clattn_softmax_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = desc.heads = 1;
    desc.rows = OV_ROWS;
    desc.cols = OV_COLS;
    cl_event done = (cl_event)(uintptr_t)1; /* must be overwritten either way */
    const clattn_status st = clattn_softmax(tu_ctx, &desc, &in, &out, 0, NULL, &done);
    if (!o->expect_ok) {
        assert_int_equal(st, CLATTN_INVALID_ARGUMENT);
        assert_null(done);
        assert_true(strlen(clattn_last_error(tu_ctx)) > 0);
        float after[OV_CAP];
        tu_read(tu_ctx, buf, sizeof after, after);
        assert_memory_equal(after, host, sizeof host); /* nothing enqueued, nothing modified */
        return;
    }
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_softmax returned %s: %s", clattn_status_string(st), clattn_last_error(tu_ctx));
    assert_non_null(done);
    clReleaseEvent(done);
    float after[OV_CAP];
    tu_read(tu_ctx, buf, sizeof after, after);
    for (size_t i = 0; i < (size_t)(OV_ROWS * OV_COLS); ++i) {
        x[i] = host[(size_t)o->in_off + i];
        got[i] = after[(size_t)o->out_off + i];
    }
    ref_softmax r;
    memset(&r, 0, sizeof r);
    r.batch = r.heads = 1;
    r.rows = OV_ROWS;
    r.cols = OV_COLS;
    ref_softmax_rows(&r, x, want);
    tu_assert_allclose("softmax into a disjoint view of its input's buffer", got, want, (size_t)(OV_ROWS * OV_COLS),
                       1e-30, 1e-5);
    for (size_t i = 0; i < (size_t)(OV_ROWS * OV_COLS); ++i)
        assert_true(after[(size_t)o->in_off + i] == host[(size_t)o->in_off + i]); /* input untouched */
}

/* =============================== registration =============================== */

int main(void)
{
    enum { MAX_TESTS = 128 };
    static struct CMUnitTest tests[MAX_TESTS];
    static char names[MAX_TESTS][96];
    size_t n = 0;
    for (size_t i = 0; i < N_OF(cases) && n < MAX_TESTS; ++i, ++n) {
        snprintf(names[n], sizeof names[n], "softmax/%s", cases[i].name);
        tests[n] = (struct CMUnitTest){names[n], test_case, NULL, tu_teardown, (void *)&cases[i]};
    }
    for (size_t i = 0; i < N_OF(overlap_rows) && n < MAX_TESTS; ++i, ++n) {
        snprintf(names[n], sizeof names[n], "overlap/%s", overlap_rows[i].name);
        tests[n] = (struct CMUnitTest){names[n], test_overlap, NULL, tu_teardown, (void *)&overlap_rows[i]};
    }
    if (n != N_OF(cases) + N_OF(overlap_rows)) {
        fprintf(stderr, "test_softmax: more than %d tests, raise MAX_TESTS\n", MAX_TESTS);
        return 1;
    }
    for (size_t i = 0; i < n; ++i)
        for (size_t j = i + 1; j < n; ++j)
            if (strcmp(names[i], names[j]) == 0) {
                fprintf(stderr, "test_softmax: duplicate test name %s\n", names[i]);
                return 1;
            }
    n = tu_filter_tests("softmax", tests, n);
    const int failed = _cmocka_run_group_tests("softmax", tests, n, NULL, NULL);
    clattn_release(tu_ctx);
    return failed;
}
