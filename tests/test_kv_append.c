/*
 * clattn_kv_append (issue 73 item 4, docs/kv-append.md) against the float64 reference
 * (ref/clattn_ref_rope.c) on exactly the stored inputs.
 *
 * One row of `cases` is one call: rope style (none, interleaved, NeoX), rotated dims, theta or
 * caller-given cos/sin tables (positions inside and outside them: clamped), positions NULL or
 * given, q rotated into another buffer, in place, or absent, the input and output storage types,
 * and the cache: contiguous ([b][h][m][d] or [b][m][h][d]) or paged (HND or NHD pools, pages of
 * 1 or 16 slots, a slot of -1 and one past the pools skipped), of each of the 8 storage types.
 *
 * Every output buffer starts as a byte pattern, with a page (or batch) of guard space before and
 * after the views;
 * afterwards every byte that no written row covers must still hold it (rows past max_seq, at
 * negative positions and at skipped slots included). Written rows are checked:
 *   - rows stored without rotation (v always, k with CLATTN_ROPE_NONE, dims past rope_dims do
 *     not count): bit for bit against the host's encoding of the same f32 values (f16 / bf16
 *     rounding, fp8 by search over the codes, ggml's q8_0 / q4_0 quantizers, the i8 rule);
 *   - rotated rows: within the rotation's f32 error, per pair (|x| + |y|)·(2^-20 + 2^-20·|angle|)
 *     (the angle pos·f_i in f32, f_i to a few ulp, sin/cos 4 ulp), plus the storage format's:
 *     half an ulp for f16 / bf16, one fp8 quantum, half a step for i8 and q8_0 (with the f16
 *     rounding of d), one step for q4_0 (whose largest element of the opposite sign clips at 15).
 * Then refusals: each bad input gets its status and a message naming it, no event, and no output
 * byte changed; and the wait list and done event.
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
#define I8 CLATTN_I8
#define E4M3 CLATTN_FP8_E4M3
#define E5M2 CLATTN_FP8_E5M2
#define Q8 CLATTN_Q8_0
#define Q4 CLATTN_Q4_0

#define NONE CLATTN_ROPE_NONE
#define INTER CLATTN_ROPE_INTERLEAVED
#define NEOX CLATTN_ROPE_NEOX

enum { Q_NONE, Q_OUT, Q_INPLACE };
enum { FILL_UNIFORM, FILL_WIDE, FILL_INTS };

typedef struct ap_case {
    const char *name;
    int B, Hq, Hkv, S, D, Dv;
    clattn_rope rope;
    int rope_dims; /* 0: head_dim */
    float theta;   /* 0: 10000 */
    int table;     /* rows of caller-given cos/sin tables; 0: theta */
    const int *pos; /* [B]; NULL: desc->positions NULL */
    clattn_dtype in; /* q, k_new, v_new */
    int qmode;
    clattn_dtype qo; /* Q_OUT's type */
    clattn_dtype kc, vc;
    int page;       /* 0: contiguous */
    int nhd;        /* [lead][row][head][dim] rather than [lead][head][row][dim] */
    int extent;     /* pages, or max_seq */
    int skip_slots; /* paged: token (0, 1) at slot -1, the last token one past the pools */
    float k_scale, v_scale;
    int fill;
} ap_case;

static const int POS_A[] = {3, 1000, 0, 4093};
static const int POS_SMALL[] = {0, 5, 2, 9};
static const int POS_EDGE[] = {-2, 6, 60, 3};    /* max_seq 8: negative rows, rows past it; table 40 */
static const int POS_PAGED[] = {0, 17, 40, 5};

/* clang-format off */
static const ap_case cases[] = {
    /* name                        B Hq Hkv S  D  Dv  rope  rd  theta    table pos        in    qmode      qo    kc    vc    page nhd ext skip ks vs fill */
    {"f32_interleaved_bhsd",       2, 4, 2, 3, 32, 32, INTER, 0, 0.0f,     0, POS_A,     F32,  Q_OUT,     F32,  F32,  F32,  0,  0, 4100, 0, 0, 0, FILL_UNIFORM},
    {"f32_neox_partial_inplace",   2, 2, 1, 4, 48, 16, NEOX, 16, 500000.f, 0, NULL,      F32,  Q_INPLACE, F32,  F32,  F32,  0,  1, 6,    0, 0, 0, FILL_UNIFORM},
    {"f32_interleaved_partial",    1, 3, 3, 2, 20, 20, INTER, 8, 0.0f,     0, POS_A,     F32,  Q_OUT,     F32,  F32,  F32,  0,  0, 16,   0, 0, 0, FILL_UNIFORM},
    {"f16_neox_table_bf16_out",    2, 4, 2, 3, 32, 24, NEOX, 0, 0.0f,     64, POS_SMALL, F16,  Q_OUT,     BF16, F16,  F16,  0,  1, 16,   0, 0, 0, FILL_UNIFORM},
    {"bf16_inter_table_clamped",   4, 2, 2, 5, 16, 16, INTER, 0, 0.0f,    40, POS_EDGE,  BF16, Q_OUT,     F32,  BF16, BF16, 0,  0, 8,    0, 0, 0, FILL_UNIFORM},
    {"f32_theta_rows_past_max",    4, 2, 1, 5, 16, 8, NEOX, 0, 0.0f,       0, POS_EDGE,  F32,  Q_INPLACE, F32,  F32,  F16,  0,  1, 8,    0, 0, 0, FILL_UNIFORM},
    {"f16_inplace_theta",          1, 8, 2, 7, 64, 64, NEOX, 0, 1.0e6f,    0, POS_A,     F16,  Q_INPLACE, F16,  F32,  BF16, 0,  0, 1100, 0, 0, 0, FILL_UNIFORM},
    {"none_copy_mixed_types",      2, 2, 2, 3, 24, 40, NONE, 0, 0.0f,      0, POS_SMALL, F32,  Q_OUT,     F16,  BF16, F16,  0,  0, 12,   0, 0, 0, FILL_UNIFORM},
    {"none_inplace_bf16",          1, 2, 1, 2, 8, 8, NONE, 0, 0.0f,        0, NULL,      BF16, Q_INPLACE, BF16, F32,  F32,  0,  0, 2,    0, 0, 0, FILL_UNIFORM},
    {"kv_only_no_q",               2, 0, 2, 3, 32, 32, INTER, 0, 0.0f,     0, POS_SMALL, F32,  Q_NONE,    F32,  F32,  F32,  0,  1, 12,   0, 0, 0, FILL_UNIFORM},
    {"paged_nhd_p16_f16",          3, 4, 2, 6, 32, 32, NEOX, 0, 0.0f,      0, POS_PAGED, F16,  Q_OUT,     F16,  F16,  F16,  16, 1, 9,    1, 0, 0, FILL_UNIFORM},
    {"paged_hnd_p1_f32",           2, 2, 2, 4, 16, 16, INTER, 0, 0.0f,     0, POS_SMALL, F32,  Q_OUT,     F32,  F32,  F32,  1,  0, 19,   1, 0, 0, FILL_UNIFORM},
    {"paged_hnd_p16_table",        2, 2, 1, 5, 32, 32, INTER, 16, 0.0f,   30, POS_PAGED, BF16, Q_INPLACE, BF16, BF16, F32,  16, 0, 9,    0, 0, 0, FILL_UNIFORM},
    {"i8_none_exact",              2, 2, 2, 3, 40, 24, NONE, 0, 0.0f,      0, POS_SMALL, F32,  Q_OUT,     F32,  I8,   I8,   0,  0, 12,   0, 0, 0, FILL_UNIFORM},
    {"i8_neox_paged_hnd",          2, 2, 2, 4, 32, 32, NEOX, 0, 0.0f,      0, POS_PAGED, F16,  Q_OUT,     F32,  I8,   I8,   16, 0, 9,    1, 0, 0, FILL_UNIFORM},
    {"fp8_none_exact_wide",        2, 0, 2, 4, 64, 32, NONE, 0, 0.0f,      0, POS_SMALL, F32,  Q_NONE,    F32,  E4M3, E5M2, 0,  0, 16,   0, 0.5f, 0, FILL_WIDE},
    {"fp8_e5m2_k_e4m3_v_rope",     2, 2, 2, 3, 32, 32, INTER, 0, 0.0f,     0, POS_PAGED, BF16, Q_OUT,     F32,  E5M2, E4M3, 16, 1, 9,    1, 2.0f, 0.25f, FILL_WIDE},
    {"fp8_e4m3_k_rope_contig",     2, 2, 1, 3, 16, 16, NEOX, 0, 0.0f,      0, POS_A,     F32,  Q_OUT,     F32,  E4M3, F32,  0,  0, 4100, 0, 0.01f, 0, FILL_UNIFORM},
    {"q8_0_none_exact",            2, 2, 2, 3, 64, 32, NONE, 0, 0.0f,      0, POS_SMALL, F32,  Q_OUT,     F32,  Q8,   Q8,   0,  0, 12,   0, 0, 0, FILL_UNIFORM},
    {"q4_0_none_exact_ints",       2, 2, 2, 3, 64, 32, NONE, 0, 0.0f,      0, POS_SMALL, F16,  Q_OUT,     F32,  Q4,   Q4,   0,  1, 12,   0, 0, 0, FILL_INTS},
    {"q4_0_none_exact_wide",       1, 0, 2, 3, 32, 64, NONE, 0, 0.0f,      0, NULL,      F32,  Q_NONE,    F32,  Q4,   Q8,   0,  0, 3,    0, 0, 0, FILL_WIDE},
    {"q8_0_neox_paged_hnd_p16",    2, 2, 2, 5, 64, 32, NEOX, 0, 0.0f,      0, POS_PAGED, F32,  Q_OUT,     F32,  Q8,   Q4,   16, 0, 9,    1, 0, 0, FILL_UNIFORM},
    {"q4_0_inter_partial_nhd",     2, 2, 1, 3, 64, 64, INTER, 32, 0.0f,    0, POS_SMALL, BF16, Q_INPLACE, BF16, Q4,   Q8,   0,  1, 12,   0, 0, 0, FILL_UNIFORM},
    {"q8_0_table_paged_p1",        2, 2, 2, 3, 32, 32, INTER, 0, 0.0f,    50, POS_SMALL, F16,  Q_OUT,     F16,  Q8,   I8,   1,  1, 29,   1, 0, 0, FILL_UNIFORM},
};
/* clang-format on */

/* ---- host images ---- */

static size_t byte_of(clattn_dtype dt, int64_t e)
{
    return (size_t)(e / clattn_dtype_block(dt)) * clattn_dtype_size(dt);
}

static unsigned char pattern(size_t i) { return (unsigned char)(0xa5u ^ (unsigned)(i * 37u)); }

/* An output view [lead][H][rows][D] with guard space before and after, its initial bytes, the
 * bytes read back, and which bytes written rows cover. */
typedef struct out_img {
    clattn_tensor t;
    size_t bytes;
    unsigned char *init, *got, *mask;
} out_img;

static void out_make(out_img *o, clattn_dtype dt, int64_t lead, int64_t H, int64_t rows, int64_t D, int nhd)
{
    memset(o, 0, sizeof *o);
    o->t.dtype = dt;
    /* a whole lead step (page, batch) of guard on each side: a store one page or row past the
     * view, or before it, lands in the guard */
    o->t.offset = 32 + H * rows * D;
    o->t.shape[0] = lead;
    o->t.shape[1] = H;
    o->t.shape[2] = rows;
    o->t.shape[3] = D;
    o->t.stride[0] = H * rows * D;
    o->t.stride[1] = nhd ? D : rows * D;
    o->t.stride[2] = nhd ? H * D : D;
    o->bytes = byte_of(dt, o->t.offset + (lead + 1) * H * rows * D + 32);
    o->init = tu_xalloc(o->bytes);
    o->got = tu_xalloc(o->bytes);
    o->mask = tu_xalloc(o->bytes);
    for (size_t i = 0; i < o->bytes; i++)
        o->init[i] = pattern(i);
    o->t.buffer = tu_xbuffer(o->bytes, o->init);
}

static size_t row_at(const out_img *o, int64_t l, int64_t h, int64_t r)
{
    return byte_of(o->t.dtype, o->t.offset + l * o->t.stride[0] + h * o->t.stride[1] + r * o->t.stride[2]);
}

/* Marks a row as written, failing if another token wrote it already. */
static void mark(out_img *o, size_t at, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(o->mask[at + i], 0);
        o->mask[at + i] = 1;
    }
}

static void read_back(out_img *o)
{
    tu_read(tu_ctx, o->t.buffer, o->bytes, o->got);
}

static int untouched(const char *what, const out_img *o)
{
    for (size_t i = 0; i < o->bytes; i++)
        if (!o->mask[i] && o->got[i] != o->init[i]) {
            print_error("%s: byte %zu outside the written rows changed (0x%02x, was 0x%02x)\n", what, i, o->got[i],
                        o->init[i]);
            return 0;
        }
    return 1;
}

static void fill(tu_rng *rng, int kind, clattn_dtype dt, void *typed, double *as_double, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double x;
        if (kind == FILL_WIDE) /* 2^-24 .. 2^12 with either sign: fp8 subnormals and saturation */
            x = (tu_uniform(rng, 0, 1) < 0.5 ? -1 : 1) * exp2(tu_uniform(rng, -24, 12));
        else if (kind == FILL_INTS) /* small integers: ties in magnitude, exact halves */
            x = floor(tu_uniform(rng, -8, 9));
        else
            x = tu_uniform(rng, -2, 2);
        tu_put(dt, typed, as_double, i, x);
    }
}

/* ---- expectations ---- */

/* The rotation's error bound for each dim of a row (0 where copied). */
static void rope_tol(const ref_rope *r, long long pos, const double *x, double *tol)
{
    for (int d = 0; d < r->head_dim; d++)
        tol[d] = 0.0;
    if (r->style == 0)
        return;
    const int half = r->rope_dims / 2;
    for (int i = 0; i < half; i++) {
        const int lo = r->style == 1 ? 2 * i : i, hi = r->style == 1 ? 2 * i + 1 : i + half;
        const double a = r->cos_table ? 0.0 : fabs(ref_rope_angle(r, pos, i));
        tol[lo] = tol[hi] = (fabs(x[lo]) + fabs(x[hi])) * (0x1p-20 + 0x1p-20 * a);
    }
}

static double storage_tol(clattn_dtype dt, double e)
{
    return dt == F32 ? fabs(e) * 0x1p-23 : dt == F16 ? fabs(e) * 0x1p-11 + 0x1p-25 : fabs(e) * 0x1p-8 + 0x1p-130;
}

static int fp8_code(clattn_dtype dt, double x) { return dt == E4M3 ? ref_fp8_e4m3(x) : ref_fp8_e5m2(x); }
static double fp8_value(clattn_dtype dt, unsigned char c)
{
    return dt == E4M3 ? ref_fp8_e4m3_value(c) : ref_fp8_e5m2_value(c);
}

/* One written row of D elements at `row` (the image's bytes) of type dt: x the row's input
 * (exact f32 values), e the reference (x rotated, or x), tol the rotation's bound, exact when
 * the row was not rotated; sc the row's i8 scale. Returns 0 (and prints) on a mismatch. */
static int check_row(const char *what, clattn_dtype dt, const unsigned char *row, int D, const double *x,
                     const double *e, const double *tol, int exact, float div, const float *sc)
{
    float xf[1024];
    for (int d = 0; d < D; d++)
        xf[d] = (float)x[d];
    if (dt <= BF16) {
        for (int d = 0; d < D; d++) {
            const double got = tu_load(dt, row, (size_t)d);
            if (exact) {
                unsigned char want[4];
                tu_store(dt, want, 0, xf[d]);
                if (memcmp(want, row + d * clattn_dtype_size(dt), clattn_dtype_size(dt)) != 0) {
                    print_error("%s: dim %d is %.9g, want %.9g (stored exactly)\n", what, d, got, (double)xf[d]);
                    return 0;
                }
            } else if (!(fabs(got - e[d]) <= tol[d] + storage_tol(dt, e[d]))) {
                print_error("%s: dim %d is %.9g, want %.9g (tolerance %.3g)\n", what, d, got, e[d],
                            tol[d] + storage_tol(dt, e[d]));
                return 0;
            }
        }
        return 1;
    }
    if (dt == E4M3 || dt == E5M2) {
        const double maxv = dt == E4M3 ? 448.0 : 57344.0;
        const int mb = dt == E4M3 ? 3 : 2, emin = dt == E4M3 ? -6 : -14;
        for (int d = 0; d < D; d++) {
            const unsigned char c = row[d];
            if (exact) {
                const float q = xf[d] / div;
                if (c != fp8_code(dt, q)) {
                    print_error("%s: dim %d has code 0x%02x, want 0x%02x (x / scale = %.9g)\n", what, d, c,
                                fp8_code(dt, q), (double)q);
                    return 0;
                }
                continue;
            }
            const double ex = e[d] / div, et = tol[d] / div, got = fp8_value(dt, c);
            if (fabs(ex) - et > maxv) {
                if (got != copysign(maxv, ex)) {
                    print_error("%s: dim %d is %.9g, want saturated %.9g\n", what, d, got, copysign(maxv, ex));
                    return 0;
                }
                continue;
            }
            int be;
            frexp(fabs(ex) + et, &be);
            const double quantum = ldexp(1.0, (be - 1 > emin ? be - 1 : emin) - mb);
            if (!(fabs(got - ex) <= et + quantum)) {
                print_error("%s: dim %d is %.9g, want %.9g (tolerance %.3g)\n", what, d, got, ex, et + quantum);
                return 0;
            }
        }
        return 1;
    }
    if (dt == I8) {
        if (exact) {
            signed char q[1024];
            const float s = ref_quantize_i8(xf, D, q);
            if (memcmp(&s, sc, 4) != 0 || memcmp(q, row, (size_t)D) != 0) {
                print_error("%s: i8 row differs from the host's (scale %.9g, want %.9g)\n", what, (double)*sc, (double)s);
                return 0;
            }
            return 1;
        }
        double amax = 0.0, tmax = 0.0;
        for (int d = 0; d < D; d++) {
            amax = fmax(amax, fabs(e[d]));
            tmax = fmax(tmax, tol[d]);
        }
        const double s = *sc, sref = amax / 127.0;
        if (!(fabs(s - sref) <= sref * 0x1p-22 + tmax / 127.0)) {
            print_error("%s: i8 scale %.9g, want %.9g\n", what, s, sref);
            return 0;
        }
        for (int d = 0; d < D; d++) {
            const double got = s * (double)(signed char)row[d];
            if (!(fabs(got - e[d]) <= 0.5 * s * (1 + 0x1p-18) + tol[d])) {
                print_error("%s: i8 dim %d is %.9g, want %.9g (scale %.9g)\n", what, d, got, e[d], s);
                return 0;
            }
        }
        return 1;
    }
    /* q8_0, q4_0 */
    const int q8 = dt == Q8, bs = q8 ? 34 : 18;
    if (exact) {
        unsigned char want[(1024 / 32) * 34];
        if (q8)
            ref_quantize_q8_0(xf, D, want);
        else
            ref_quantize_q4_0(xf, D, want);
        for (int i = 0; i < D / 32 * bs; i++)
            if (want[i] != row[i]) {
                print_error("%s: %s byte %d (block %d) is 0x%02x, ggml's quantizer gives 0x%02x\n", what,
                            q8 ? "q8_0" : "q4_0", i, i / bs, row[i], want[i]);
                return 0;
            }
        return 1;
    }
    double got[1024];
    if (q8)
        ref_dequantize_q8_0(row, D, got);
    else
        ref_dequantize_q4_0(row, D, got);
    for (int b = 0; b < D / 32; b++) {
        const double d16 = ref_f16_value((unsigned short)(row[b * bs] | row[b * bs + 1] << 8));
        double amax = 0.0, tmax = 0.0;
        for (int j = 0; j < 32; j++) {
            amax = fmax(amax, fabs(e[32 * b + j]));
            tmax = fmax(tmax, tol[32 * b + j]);
        }
        const double dref = amax / (q8 ? 127.0 : 8.0);
        if (!(fabs(fabs(d16) - dref) <= dref * 0x1p-11 + tmax / (q8 ? 127.0 : 8.0) + 0x1p-24)) {
            print_error("%s: block %d has d %.9g, want magnitude %.9g\n", what, b, d16, dref);
            return 0;
        }
        for (int j = 0; j < 32; j++) {
            const int d = 32 * b + j;
            const double bound = (q8 ? 0.57 : 1.01) * fabs(d16) + tol[d] + 0x1p-20;
            if (!(fabs(got[d] - e[d]) <= bound)) {
                print_error("%s: block %d dim %d is %.9g, want %.9g (d %.9g)\n", what, b, j, got[d], e[d], d16);
                return 0;
            }
        }
    }
    return 1;
}

/* The cos/sin table row p, pair i: the caller's own rule (linear position scaling 1/2, base
 * 500000), so that tables and theta differ. */
static double table_angle(int p, int i, int rd) { return 0.5 * p * pow(500000.0, -2.0 * i / rd); }

static void test_case(void **state)
{
    const ap_case *c = *state;
    clattn_context *ctx = tu_ctx_get();
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(c->name));
    const int B = c->B, Hq = c->Hq, Hkv = c->Hkv, S = c->S, D = c->D, Dv = c->Dv;
    const int RD = c->rope == NONE ? 0 : c->rope_dims ? c->rope_dims : D, half = RD / 2;
    const size_t nq = (size_t)B * Hq * S * D, nk = (size_t)B * Hkv * S * D, nv = (size_t)B * Hkv * S * Dv;
    const size_t esz = clattn_dtype_size(c->in);
    void *hq = tu_xalloc(nq * esz + 1), *hk = tu_xalloc(nk * esz), *hv = tu_xalloc(nv * esz);
    double *dq = tu_xdoubles(nq + 1), *dk = tu_xdoubles(nk), *dv = tu_xdoubles(nv);
    fill(&rng, c->fill, c->in, hq, dq, nq);
    fill(&rng, c->fill, c->in, hk, dk, nk);
    fill(&rng, c->fill, c->in, hv, dv, nv);

    /* q: rotated into another view (offset, guards), in place, or absent */
    clattn_tensor tq, tqo;
    out_img qo;
    memset(&qo, 0, sizeof qo);
    const clattn_tensor *pq = NULL, *pqo = NULL;
    cl_mem qbuf = NULL;
    if (c->qmode != Q_NONE) {
        qbuf = tu_xbuffer(nq * esz, hq);
        tq = clattn_tensor_bhsd(qbuf, c->in, B, Hq, S, D);
        pq = &tq;
        if (c->qmode == Q_OUT) {
            out_make(&qo, c->qo, B, Hq, S, D, 0);
            tqo = qo.t;
            pqo = &tqo;
        } else {
            pqo = &tq;
        }
    }
    const clattn_tensor tk = clattn_tensor_bhsd(tu_xbuffer(nk * esz, hk), c->in, B, Hkv, S, D);
    const clattn_tensor tv = clattn_tensor_bhsd(tu_xbuffer(nv * esz, hv), c->in, B, Hkv, S, Dv);

    /* positions, slots and the caches */
    long long P[64];
    assert_true(B * S <= 64);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++)
            P[b * S + t] = (c->pos ? c->pos[b] : 0) + t;
    cl_mem posbuf = c->pos ? tu_xbuffer(sizeof(int) * (size_t)B, c->pos) : NULL;
    const int paged = c->page > 0, lead = paged ? c->extent : B, rows = paged ? c->page : c->extent;
    int slot[64];
    cl_mem slotbuf = NULL;
    if (paged) {
        /* batch b's page lp sits at pool page (b·ppb + lp)·7 + 3 mod pages: scattered, distinct */
        long long maxpos = 0;
        for (int i = 0; i < B * S; i++)
            maxpos = P[i] > maxpos ? P[i] : maxpos;
        const int ppb = (int)(maxpos / c->page) + 1;
        assert_true(B * ppb <= c->extent && c->extent % 7 != 0);
        for (int i = 0; i < B * S; i++) {
            const int b = i / S, lp = (int)(P[i] / c->page);
            slot[i] = ((b * ppb + lp) * 7 + 3) % c->extent * c->page + (int)(P[i] % c->page);
        }
        if (c->skip_slots) {
            slot[1] = -1;
            slot[B * S - 1] = c->extent * c->page;
        }
        slotbuf = tu_xbuffer(sizeof(int) * (size_t)(B * S), slot);
    }
    out_img kc, vc, ks, vs;
    out_make(&kc, c->kc, lead, Hkv, rows, D, c->nhd);
    out_make(&vc, c->vc, lead, Hkv, rows, Dv, !c->nhd);
    clattn_kv_layout kv;
    memset(&kv, 0, sizeof kv);
    kv.page_size = c->page;
    kv.k_scale = c->k_scale;
    kv.v_scale = c->v_scale;
    memset(&ks, 0, sizeof ks);
    memset(&vs, 0, sizeof vs);
    if (c->kc == I8) {
        out_make(&ks, F32, lead, Hkv, rows, 1, c->nhd);
        kv.k_scales = &ks.t;
    }
    if (c->vc == I8) {
        out_make(&vs, F32, lead, Hkv, rows, 1, 0);
        kv.v_scales = &vs.t;
    }

    /* tables */
    double *tcos = NULL, *tsin = NULL;
    clattn_tensor tc, ts;
    if (c->table) {
        float *fc = tu_xalloc(sizeof(float) * (size_t)(c->table * half)),
              *fs = tu_xalloc(sizeof(float) * (size_t)(c->table * half));
        tcos = tu_xdoubles((size_t)(c->table * half));
        tsin = tu_xdoubles((size_t)(c->table * half));
        for (int p = 0; p < c->table; p++)
            for (int i = 0; i < half; i++) {
                fc[p * half + i] = (float)cos(table_angle(p, i, RD));
                fs[p * half + i] = (float)sin(table_angle(p, i, RD));
                tcos[p * half + i] = fc[p * half + i];
                tsin[p * half + i] = fs[p * half + i];
            }
        tc = clattn_tensor_bhsd(tu_xbuffer(sizeof(float) * (size_t)(c->table * half), fc), F32, 1, 1, c->table, half);
        ts = clattn_tensor_bhsd(tu_xbuffer(sizeof(float) * (size_t)(c->table * half), fs), F32, 1, 1, c->table, half);
    }

    clattn_kv_append_desc d;
    memset(&d, 0, sizeof d);
    d.batch = B;
    d.heads_q = Hq;
    d.heads_kv = Hkv;
    d.seq_new = S;
    d.head_dim = D;
    d.head_dim_v = Dv == D ? 0 : Dv;
    d.rope = c->rope;
    d.rope_dims = c->rope_dims;
    d.rope_theta = c->theta;
    d.rope_cos = c->table ? &tc : NULL;
    d.rope_sin = c->table ? &ts : NULL;
    d.positions = posbuf;
    d.kv = &kv;
    d.slot_mapping = slotbuf;
    cl_event done = NULL;
    const clattn_status st = clattn_kv_append(ctx, &d, pq, &tk, &tv, pqo, &kc.t, &vc.t, 0, NULL, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_kv_append: %s: %s", clattn_status_string(st), clattn_last_error(ctx));
    assert_non_null(done);
    assert_int_equal(clWaitForEvents(1, &done), CL_SUCCESS);
    clReleaseEvent(done);

    const ref_rope rr = {c->rope, D, RD, c->theta, tcos, tsin, c->table};
    const ref_rope rv = {0, Dv, 0, 0.0, NULL, NULL, 0};
    double e[1024], tol[1024];
    int ok = 1;
    char what[160];

    /* q */
    if (c->qmode != Q_NONE) {
        unsigned char *img = NULL;
        if (c->qmode == Q_OUT) {
            read_back(&qo);
            img = qo.got;
        } else {
            img = tu_xalloc(nq * esz);
            tu_read(ctx, qbuf, nq * esz, img);
        }
        const clattn_dtype qdt = c->qmode == Q_OUT ? c->qo : c->in;
        for (int r = 0; r < B * Hq * S && ok; r++) {
            const int b = r / (Hq * S), t = r % S;
            const double *x = dq + (size_t)r * D;
            ref_rope_row(&rr, P[b * S + t], x, e);
            rope_tol(&rr, P[b * S + t], x, tol);
            const size_t at = c->qmode == Q_OUT ? row_at(&qo, b, r / S % Hq, t) : (size_t)r * D * esz;
            if (c->qmode == Q_OUT)
                mark(&qo, at, (size_t)D * clattn_dtype_size(qdt));
            snprintf(what, sizeof what, "q_out row (b %d, h %d, t %d, pos %lld)", b, r / S % Hq, t, P[b * S + t]);
            ok = check_row(what, qdt, img + at, D, x, e, tol, c->rope == NONE, 1.0f, NULL);
        }
        if (ok && c->qmode == Q_OUT)
            ok = untouched("q_out", &qo);
    }

    /* k and v */
    read_back(&kc);
    read_back(&vc);
    if (c->kc == I8)
        read_back(&ks);
    if (c->vc == I8)
        read_back(&vs);
    for (int kvi = 0; kvi < 2 && ok; kvi++) {
        out_img *o = kvi ? &vc : &kc, *so = kvi ? &vs : &ks;
        const int dim = kvi ? Dv : D;
        const clattn_dtype dt = kvi ? c->vc : c->kc;
        const ref_rope *rp = kvi ? &rv : &rr;
        const float sc = kvi ? c->v_scale : c->k_scale, div = sc != 0.0f ? sc : 1.0f;
        for (int r = 0; r < B * Hkv * S && ok; r++) {
            const int b = r / (Hkv * S), h = r / S % Hkv, t = r % S;
            const long long pos = P[b * S + t];
            long long l = b, row = pos;
            if (paged) {
                const int s = slot[b * S + t];
                if (s < 0 || s >= c->extent * c->page)
                    continue;
                l = s / c->page;
                row = s % c->page;
            } else if (pos < 0 || pos >= c->extent) {
                continue;
            }
            const double *x = (kvi ? dv : dk) + (size_t)r * dim;
            ref_rope_row(rp, pos, x, e);
            rope_tol(rp, pos, x, tol);
            const size_t at = row_at(o, l, h, row);
            mark(o, at, byte_of(dt, dim));
            const float *scale = NULL;
            float sval = 0.0f;
            if (dt == I8) {
                const size_t sat = row_at(so, l, h, row);
                mark(so, sat, 4);
                memcpy(&sval, so->got + sat, 4);
                scale = &sval;
            }
            snprintf(what, sizeof what, "%s_cache row (b %d, h %d, t %d, pos %lld) at (%lld, %lld)", kvi ? "v" : "k", b,
                     h, t, pos, l, row);
            ok = check_row(what, dt, o->got + at, dim, x, e, tol, rp->style == NONE, div, scale);
        }
        if (ok)
            ok = untouched(kvi ? "v_cache" : "k_cache", o);
        if (ok && dt == I8)
            ok = untouched(kvi ? "v_scales" : "k_scales", so);
    }
    if (!ok)
        fail_msg("%s: mismatch (see above)", c->name);
}

/* ---- refusals ---- */

typedef enum bad_kind {
    BAD_DESC_NULL,
    BAD_BATCH_0,
    BAD_HEADS_KV_0,
    BAD_HEADS_Q_NEG,
    BAD_SEQ_0,
    BAD_HEAD_DIM_0,
    BAD_HEAD_DIM_577,
    BAD_HEAD_DIM_V_NEG,
    BAD_RESERVED,
    BAD_ROPE_ENUM,
    BAD_NONE_DIMS,
    BAD_NONE_THETA,
    BAD_NONE_TABLES,
    BAD_DIMS_ODD,
    BAD_DIMS_WIDE,
    BAD_DIMS_NEG,
    BAD_THETA_NEG,
    BAD_THETA_NAN,
    BAD_THETA_INF,
    BAD_COS_ONLY,
    BAD_TABLES_AND_THETA,
    BAD_TABLE_F16,
    BAD_TABLE_SHAPE,
    BAD_TABLE_ROWS_DIFFER,
    BAD_Q_WITHOUT_OUT,
    BAD_Q_HEADS_0,
    BAD_NO_Q_HEADS,
    BAD_Q_SHAPE,
    BAD_Q_OUT_SHIFTED,
    BAD_Q_OUT_I8,
    BAD_Q_OUT_ON_K_CACHE,
    BAD_K_NEW_NULL,
    BAD_V_NEW_DTYPE,
    BAD_V_NEW_SHAPE,
    BAD_K_CACHE_NULL,
    BAD_K_CACHE_HEADS,
    BAD_MAX_SEQ_0,
    BAD_MAX_SEQ_DIFFER,
    BAD_K_CACHE_SMALL,
    BAD_K_CACHE_OVER_V,
    BAD_K_CACHE_OVER_K_NEW,
    BAD_I8_NO_SCALES,
    BAD_I8_NO_LAYOUT,
    BAD_SCALES_NOT_I8,
    BAD_SCALES_SHAPE,
    BAD_FP8_SCALE_F32,
    BAD_FP8_SCALE_NEG,
    BAD_FP8_SCALE_NAN,
    BAD_KV_RESERVED,
    BAD_KV_PACKED,
    BAD_PAGE_NEG,
    BAD_PAGED_NO_SLOTS,
    BAD_SLOTS_NOT_PAGED,
    BAD_SLOTS_SMALL,
    BAD_POSITIONS_SMALL,
    BAD_POSITIONS_OVER_K_CACHE,
    BAD_Q8_DIM_48,
    BAD_WAIT_NULL
} bad_kind;

typedef struct bad_case {
    const char *name;
    bad_kind kind;
    const char *names; /* in the message */
    clattn_status want;
} bad_case;

static const bad_case bad_cases[] = {
    {"desc_null", BAD_DESC_NULL, "desc", CLATTN_INVALID_ARGUMENT},
    {"batch_0", BAD_BATCH_0, "batch", CLATTN_INVALID_ARGUMENT},
    {"heads_kv_0", BAD_HEADS_KV_0, "heads_kv", CLATTN_INVALID_ARGUMENT},
    {"heads_q_negative", BAD_HEADS_Q_NEG, "heads_q", CLATTN_INVALID_ARGUMENT},
    {"seq_new_0", BAD_SEQ_0, "seq_new", CLATTN_INVALID_ARGUMENT},
    {"head_dim_0", BAD_HEAD_DIM_0, "head_dim", CLATTN_INVALID_ARGUMENT},
    {"head_dim_577", BAD_HEAD_DIM_577, "head_dim", CLATTN_UNSUPPORTED},
    {"head_dim_v_negative", BAD_HEAD_DIM_V_NEG, "head_dim_v", CLATTN_INVALID_ARGUMENT},
    {"reserved", BAD_RESERVED, "reserved[3]", CLATTN_INVALID_ARGUMENT},
    {"rope_enum", BAD_ROPE_ENUM, "rope", CLATTN_INVALID_ARGUMENT},
    {"none_with_rope_dims", BAD_NONE_DIMS, "rope_dims", CLATTN_INVALID_ARGUMENT},
    {"none_with_theta", BAD_NONE_THETA, "rope_theta", CLATTN_INVALID_ARGUMENT},
    {"none_with_tables", BAD_NONE_TABLES, "rope_cos", CLATTN_INVALID_ARGUMENT},
    {"rope_dims_odd", BAD_DIMS_ODD, "rope_dims", CLATTN_INVALID_ARGUMENT},
    {"rope_dims_past_head_dim", BAD_DIMS_WIDE, "rope_dims", CLATTN_INVALID_ARGUMENT},
    {"rope_dims_negative", BAD_DIMS_NEG, "rope_dims", CLATTN_INVALID_ARGUMENT},
    {"theta_negative", BAD_THETA_NEG, "rope_theta", CLATTN_INVALID_ARGUMENT},
    {"theta_nan", BAD_THETA_NAN, "rope_theta", CLATTN_INVALID_ARGUMENT},
    {"theta_inf", BAD_THETA_INF, "rope_theta", CLATTN_INVALID_ARGUMENT},
    {"cos_without_sin", BAD_COS_ONLY, "rope_sin", CLATTN_INVALID_ARGUMENT},
    {"tables_and_theta", BAD_TABLES_AND_THETA, "rope_theta", CLATTN_INVALID_ARGUMENT},
    {"table_f16", BAD_TABLE_F16, "rope_cos", CLATTN_INVALID_ARGUMENT},
    {"table_shape", BAD_TABLE_SHAPE, "rope_cos", CLATTN_INVALID_ARGUMENT},
    {"table_rows_differ", BAD_TABLE_ROWS_DIFFER, "rope_sin", CLATTN_INVALID_ARGUMENT},
    {"q_without_q_out", BAD_Q_WITHOUT_OUT, "q_out", CLATTN_INVALID_ARGUMENT},
    {"q_with_heads_q_0", BAD_Q_HEADS_0, "heads_q", CLATTN_INVALID_ARGUMENT},
    {"no_q_with_heads_q", BAD_NO_Q_HEADS, "heads_q", CLATTN_INVALID_ARGUMENT},
    {"q_shape", BAD_Q_SHAPE, "q->shape", CLATTN_INVALID_ARGUMENT},
    {"q_out_overlaps_q_as_f16", BAD_Q_OUT_SHIFTED, "q_out overlaps q", CLATTN_INVALID_ARGUMENT},
    {"q_out_i8", BAD_Q_OUT_I8, "q_out->dtype", CLATTN_INVALID_ARGUMENT},
    {"q_out_overlaps_k_cache", BAD_Q_OUT_ON_K_CACHE, "k_cache", CLATTN_INVALID_ARGUMENT},
    {"k_new_null", BAD_K_NEW_NULL, "k_new", CLATTN_INVALID_ARGUMENT},
    {"v_new_dtype", BAD_V_NEW_DTYPE, "v_new->dtype", CLATTN_INVALID_ARGUMENT},
    {"v_new_shape", BAD_V_NEW_SHAPE, "v_new->shape", CLATTN_INVALID_ARGUMENT},
    {"k_cache_null", BAD_K_CACHE_NULL, "k_cache", CLATTN_INVALID_ARGUMENT},
    {"k_cache_heads", BAD_K_CACHE_HEADS, "k_cache->shape[1]", CLATTN_INVALID_ARGUMENT},
    {"max_seq_0", BAD_MAX_SEQ_0, "max_seq", CLATTN_INVALID_ARGUMENT},
    {"max_seq_differ", BAD_MAX_SEQ_DIFFER, "v_cache->shape[2]", CLATTN_INVALID_ARGUMENT},
    {"k_cache_buffer_small", BAD_K_CACHE_SMALL, "k_cache needs", CLATTN_INVALID_ARGUMENT},
    {"k_cache_overlaps_v_cache", BAD_K_CACHE_OVER_V, "v_cache", CLATTN_INVALID_ARGUMENT},
    {"k_cache_overlaps_k_new", BAD_K_CACHE_OVER_K_NEW, "k_new", CLATTN_INVALID_ARGUMENT},
    {"i8_without_scales", BAD_I8_NO_SCALES, "k_scales", CLATTN_INVALID_ARGUMENT},
    {"i8_without_layout", BAD_I8_NO_LAYOUT, "desc->kv", CLATTN_INVALID_ARGUMENT},
    {"scales_with_f32_cache", BAD_SCALES_NOT_I8, "k_scales", CLATTN_INVALID_ARGUMENT},
    {"scales_shape", BAD_SCALES_SHAPE, "k_scales->shape", CLATTN_INVALID_ARGUMENT},
    {"fp8_scale_with_f32_cache", BAD_FP8_SCALE_F32, "k_scale", CLATTN_INVALID_ARGUMENT},
    {"fp8_scale_negative", BAD_FP8_SCALE_NEG, "v_scale", CLATTN_INVALID_ARGUMENT},
    {"fp8_scale_nan", BAD_FP8_SCALE_NAN, "k_scale", CLATTN_INVALID_ARGUMENT},
    {"kv_reserved", BAD_KV_RESERVED, "kv->reserved[7]", CLATTN_INVALID_ARGUMENT},
    {"kv_packed", BAD_KV_PACKED, "cu_seqlens_k", CLATTN_UNSUPPORTED},
    {"page_size_negative", BAD_PAGE_NEG, "page_size", CLATTN_INVALID_ARGUMENT},
    {"paged_without_slots", BAD_PAGED_NO_SLOTS, "slot_mapping", CLATTN_INVALID_ARGUMENT},
    {"slots_without_paging", BAD_SLOTS_NOT_PAGED, "slot_mapping", CLATTN_INVALID_ARGUMENT},
    {"slots_buffer_small", BAD_SLOTS_SMALL, "slot_mapping", CLATTN_INVALID_ARGUMENT},
    {"positions_buffer_small", BAD_POSITIONS_SMALL, "positions", CLATTN_INVALID_ARGUMENT},
    {"positions_overlap_k_cache", BAD_POSITIONS_OVER_K_CACHE, "positions overlaps k_cache", CLATTN_INVALID_ARGUMENT},
    {"q8_0_head_dim_48", BAD_Q8_DIM_48, "k_cache", CLATTN_UNSUPPORTED},
    {"wait_null", BAD_WAIT_NULL, "wait", CLATTN_INVALID_ARGUMENT},
};

/* A valid call (B 2, Hq 4, Hkv 2, S 3, D 32, NeoX from theta, positions, contiguous f32 caches
 * of max_seq 8) spoiled in one way; every output buffer must keep its bytes. */
static void test_refusal(void **state)
{
    const bad_case *bc = *state;
    clattn_context *ctx = tu_ctx_get();
    const int B = 2, Hq = 4, Hkv = 2, S = 3, D = bc->kind == BAD_Q8_DIM_48 ? 48 : 32, M = 8;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(bc->name));
    const size_t nq = (size_t)B * Hq * S * D, nk = (size_t)B * Hkv * S * D;
    float *hq = tu_xalloc(4 * nq), *hk = tu_xalloc(4 * nk);
    for (size_t i = 0; i < nq; i++)
        hq[i] = (float)tu_uniform(&rng, -1, 1);
    for (size_t i = 0; i < nk; i++)
        hk[i] = (float)tu_uniform(&rng, -1, 1);
    const int pos[2] = {1, 4};
    clattn_tensor q = clattn_tensor_bhsd(tu_xbuffer(4 * nq, hq), F32, B, Hq, S, D);
    clattn_tensor k = clattn_tensor_bhsd(tu_xbuffer(4 * nk, hk), F32, B, Hkv, S, D);
    clattn_tensor v = clattn_tensor_bhsd(tu_xbuffer(4 * nk, hk), F32, B, Hkv, S, D);
    const clattn_dtype kdt = bc->kind == BAD_I8_NO_SCALES || bc->kind == BAD_I8_NO_LAYOUT ? I8
                             : bc->kind == BAD_FP8_SCALE_NEG || bc->kind == BAD_FP8_SCALE_NAN ? E4M3
                             : bc->kind == BAD_Q8_DIM_48 ? Q8
                             : bc->kind == BAD_SCALES_SHAPE ? I8
                                                         : F32;
    out_img qo, kc, vc, sc, big;
    out_make(&qo, F32, B, Hq, S, D, 0);
    out_make(&kc, kdt, B, Hkv, M, D, 0);
    out_make(&vc, bc->kind == BAD_FP8_SCALE_NEG ? E5M2 : F32, B, Hkv, M, D, 0);
    out_make(&sc, F32, B, Hkv, M, 1, 0);
    out_make(&big, F32, 2 * B, Hkv, M, D, 0); /* for overlapping views */
    float tabv[8 * 32];
    for (int i = 0; i < 8 * 32; i++)
        tabv[i] = 0.5f;
    clattn_tensor tc = clattn_tensor_bhsd(tu_xbuffer(sizeof tabv, tabv), F32, 1, 1, 8, D / 2);
    clattn_tensor ts = clattn_tensor_bhsd(tu_xbuffer(sizeof tabv, tabv), F32, 1, 1, 8, D / 2);
    clattn_tensor tq = q, tqo = qo.t, tk = k, tv = v, tkc = kc.t, tvc = vc.t, tsc = sc.t;
    const clattn_tensor *pq = &tq, *pqo = &tqo, *pk = &tk, *pv = &tv, *pkc = &tkc, *pvc = &tvc;
    clattn_kv_layout kv;
    memset(&kv, 0, sizeof kv);
    clattn_kv_append_desc d;
    memset(&d, 0, sizeof d);
    d.batch = B;
    d.heads_q = Hq;
    d.heads_kv = Hkv;
    d.seq_new = S;
    d.head_dim = D;
    d.rope = NEOX;
    d.positions = tu_xbuffer(sizeof pos, pos);
    d.kv = &kv;
    const clattn_kv_append_desc *pd = &d;
    cl_uint num_wait = 0;
    int slots[6] = {0, 1, 2, 3, 4, 5};

    switch (bc->kind) {
    case BAD_DESC_NULL: pd = NULL; break;
    case BAD_BATCH_0: d.batch = 0; break;
    case BAD_HEADS_KV_0: d.heads_kv = 0; break;
    case BAD_HEADS_Q_NEG: d.heads_q = -1; break;
    case BAD_SEQ_0: d.seq_new = 0; break;
    case BAD_HEAD_DIM_0: d.head_dim = 0; break;
    case BAD_HEAD_DIM_577: d.head_dim = 577; break;
    case BAD_HEAD_DIM_V_NEG: d.head_dim_v = -1; break;
    case BAD_RESERVED: d.reserved[3] = 1; break;
    case BAD_ROPE_ENUM: d.rope = (clattn_rope)7; break;
    case BAD_NONE_DIMS: d.rope = NONE; d.rope_dims = 4; break;
    case BAD_NONE_THETA: d.rope = NONE; d.rope_theta = 100.0f; break;
    case BAD_NONE_TABLES: d.rope = NONE; d.rope_cos = &tc; d.rope_sin = &ts; break;
    case BAD_DIMS_ODD: d.rope_dims = 3; break;
    case BAD_DIMS_WIDE: d.rope_dims = D + 2; break;
    case BAD_DIMS_NEG: d.rope_dims = -2; break;
    case BAD_THETA_NEG: d.rope_theta = -10000.0f; break;
    case BAD_THETA_NAN: d.rope_theta = NAN; break;
    case BAD_THETA_INF: d.rope_theta = INFINITY; break;
    case BAD_COS_ONLY: d.rope_cos = &tc; break;
    case BAD_TABLES_AND_THETA: d.rope_cos = &tc; d.rope_sin = &ts; d.rope_theta = 10000.0f; break;
    case BAD_TABLE_F16: tc.dtype = F16; d.rope_cos = &tc; d.rope_sin = &ts; break;
    case BAD_TABLE_SHAPE: tc.shape[3] = D / 2 - 1; d.rope_cos = &tc; d.rope_sin = &ts; break;
    case BAD_TABLE_ROWS_DIFFER: ts.shape[2] = 7; d.rope_cos = &tc; d.rope_sin = &ts; break;
    case BAD_Q_WITHOUT_OUT: pqo = NULL; break;
    case BAD_Q_HEADS_0: d.heads_q = 0; break;
    case BAD_NO_Q_HEADS: pq = pqo = NULL; break;
    case BAD_Q_SHAPE: tq.shape[2] = S + 1; break;
    case BAD_Q_OUT_SHIFTED: tqo = q; tqo.dtype = F16; break; /* q's bytes as f16: not the same view */
    case BAD_Q_OUT_I8: tqo.dtype = I8; break;
    case BAD_Q_OUT_ON_K_CACHE: tqo = clattn_tensor_bhsd(kc.t.buffer, F32, B, Hq, S, D); break;
    case BAD_K_NEW_NULL: pk = NULL; break;
    case BAD_V_NEW_DTYPE: tv.dtype = F16; break;
    case BAD_V_NEW_SHAPE: tv.shape[1] = Hkv + 1; break;
    case BAD_K_CACHE_NULL: pkc = NULL; break;
    case BAD_K_CACHE_HEADS: tkc.shape[1] = Hkv + 1; break;
    case BAD_MAX_SEQ_0: tkc.shape[2] = 0; tvc.shape[2] = 0; break;
    case BAD_MAX_SEQ_DIFFER: tvc.shape[2] = M - 1; break;
    case BAD_K_CACHE_SMALL: tkc.offset += 2 * tkc.stride[0] + 1; break;
    case BAD_K_CACHE_OVER_V: tkc = big.t; tvc = big.t; tkc.shape[0] = B; tvc.shape[0] = B; tvc.offset += big.t.stride[0]; break;
    case BAD_K_CACHE_OVER_K_NEW: tkc = clattn_tensor_bhsd(k.buffer, F32, B, Hkv, S, D); tvc.shape[2] = S; break;
    case BAD_I8_NO_SCALES: break;
    case BAD_I8_NO_LAYOUT: d.kv = NULL; break;
    case BAD_SCALES_NOT_I8: kv.k_scales = &tsc; break;
    case BAD_SCALES_SHAPE: tsc.shape[3] = 2; kv.k_scales = &tsc; break;
    case BAD_FP8_SCALE_F32: kv.k_scale = 2.0f; break;
    case BAD_FP8_SCALE_NEG: tvc.dtype = E5M2; kv.v_scale = -1.0f; break;
    case BAD_FP8_SCALE_NAN: kv.k_scale = NAN; break;
    case BAD_KV_RESERVED: kv.reserved[7] = 1; break;
    case BAD_KV_PACKED: kv.cu_seqlens_k = tu_xbuffer(sizeof slots, slots); break;
    case BAD_PAGE_NEG: kv.page_size = -4; break;
    case BAD_PAGED_NO_SLOTS: kv.page_size = 4; break;
    case BAD_SLOTS_NOT_PAGED: d.slot_mapping = tu_xbuffer(sizeof slots, slots); break;
    case BAD_SLOTS_SMALL:
        kv.page_size = 4;
        tkc.shape[0] = tvc.shape[0] = 2;
        tkc.shape[2] = tvc.shape[2] = 4;
        d.slot_mapping = tu_xbuffer(sizeof slots - 4, slots);
        break;
    case BAD_POSITIONS_SMALL: d.positions = tu_xbuffer(4, pos); break;
    case BAD_POSITIONS_OVER_K_CACHE: d.positions = kc.t.buffer; tkc.offset = 0; break;
    case BAD_Q8_DIM_48: break;
    case BAD_WAIT_NULL: num_wait = 1; break;
    }
    cl_event done = (cl_event)(uintptr_t)1; /* must come back NULL */
    const clattn_status st = clattn_kv_append(ctx, pd, pq, pk, pv, pqo, pkc, pvc, num_wait, NULL, &done);
    const char *msg = clattn_last_error(ctx);
    if (st != bc->want || !strstr(msg, bc->names))
        fail_msg("%s: got %s \"%s\", want %s naming \"%s\"", bc->name, clattn_status_string(st), msg,
                 clattn_status_string(bc->want), bc->names);
    assert_null(done);
    out_img *outs[5] = {&qo, &kc, &vc, &sc, &big};
    for (int i = 0; i < 5; i++) {
        read_back(outs[i]);
        if (memcmp(outs[i]->got, outs[i]->init, outs[i]->bytes) != 0)
            fail_msg("%s: output %d changed although the call was refused", bc->name, i);
    }
    float *qback = tu_xalloc(4 * nq);
    tu_read(ctx, q.buffer, 4 * nq, qback);
    assert_memory_equal(qback, hq, 4 * nq);
}

static void test_null_ctx(void **state)
{
    (void)state;
    clattn_kv_append_desc d;
    memset(&d, 0, sizeof d);
    cl_event done = (cl_event)(uintptr_t)1;
    assert_int_equal(clattn_kv_append(NULL, &d, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, &done),
                     CLATTN_INVALID_ARGUMENT);
    assert_null(done);
    assert_non_null(strstr(clattn_last_error(NULL), "ctx"));
}

/* An append of k and v alone (no q, no rotation) of S tokens, B batches, H kv heads, D dims. */
static clattn_kv_append_desc kv_only_desc(int64_t B, int64_t H, int64_t S, int64_t D)
{
    clattn_kv_append_desc d;
    memset(&d, 0, sizeof d);
    d.batch = B;
    d.heads_kv = H;
    d.seq_new = S;
    d.head_dim = D;
    return d;
}

/* The call waits for its wait list (a user event, completed after the call) and its done event
 * completes after the stores. */
static void test_events(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    enum { B = 1, H = 2, S = 2, D = 32 };
    float x[B * H * S * D];
    for (int i = 0; i < B * H * S * D; i++)
        x[i] = (float)(i % 7) - 3.0f;
    clattn_tensor k = clattn_tensor_bhsd(tu_xbuffer(sizeof x, x), F32, B, H, S, D);
    out_img kc, vc;
    out_make(&kc, Q8, B, H, 4, D, 0);
    out_make(&vc, F32, B, H, 4, D, 0);
    clattn_kv_append_desc d = kv_only_desc(B, H, S, D);
    cl_context clctx = NULL;
    assert_int_equal(clGetCommandQueueInfo(clattn_queue(ctx), CL_QUEUE_CONTEXT, sizeof clctx, &clctx, NULL),
                     CL_SUCCESS);
    cl_int err;
    cl_event gate = clCreateUserEvent(clctx, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_event done = NULL;
    const clattn_status st = clattn_kv_append(ctx, &d, NULL, &k, &k, NULL, &kc.t, &vc.t, 1, &gate, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("%s", clattn_last_error(ctx));
    assert_non_null(done);
    clFlush(clattn_queue(ctx));
    cl_int status = CL_COMPLETE;
    assert_int_equal(clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL), CL_SUCCESS);
    assert_true(status != CL_COMPLETE); /* still waiting for the gate */
    assert_int_equal(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    assert_int_equal(clWaitForEvents(1, &done), CL_SUCCESS);
    clReleaseEvent(done);
    clReleaseEvent(gate);
    read_back(&kc);
    read_back(&vc);
    /* rows 0 and 1 of each head hold the tokens */
    for (int h = 0; h < H; h++)
        for (int t = 0; t < S; t++) {
            unsigned char want[34];
            ref_quantize_q8_0(x + (h * S + t) * D, D, want);
            assert_memory_equal(kc.got + row_at(&kc, 0, h, t), want, 34);
            assert_memory_equal(vc.got + row_at(&vc, 0, h, t), x + (h * S + t) * D, 4 * D);
        }
}

/* q4_0's x·id + 8.5 is a rounded product, then the add, as ggml computes it: blocks whose products
 * fall exactly on a half step (x·id = -6.5 in f32 for x = 2.4375, id = 1 / -0.375 rounded), where
 * a fused multiply-add (OpenCL contracts a·b + c by default) rounds once and truncates to one step
 * lower. Every element of the first block is such a product or 0, of the second a spread of
 * them; the bytes must be ggml's, and the tie's nibble 2 (independent of the reference). */
static void test_q4_ties(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    enum { B = 1, H = 1, S = 2, D = 32 };
    float x[S * D] = {0};
    x[0] = 3.0f; /* the largest magnitude: d = 3 / -8 = -0.375, id = -2.6666667f */
    for (int j = 1; j < D; j += 2)
        x[j] = 2.4375f;
    for (int j = 0; j < D; j++) /* block 2: multiples of 1/16 up to 2, then the largest, 3 */
        x[D + j] = j == 17 ? -3.0f : (float)(j - 16) / 16.0f * 2.0f;
    clattn_tensor k = clattn_tensor_bhsd(tu_xbuffer(sizeof x, x), F32, B, H, S, D);
    out_img kc, vc;
    out_make(&kc, Q4, B, H, S, D, 0);
    out_make(&vc, F32, B, H, S, D, 0);
    clattn_kv_append_desc d = kv_only_desc(B, H, S, D);
    const clattn_status st = clattn_kv_append(ctx, &d, NULL, &k, &k, NULL, &kc.t, &vc.t, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("%s", clattn_last_error(ctx));
    assert_int_equal(clFinish(clattn_queue(ctx)), CL_SUCCESS);
    read_back(&kc);
    const unsigned char *b0 = kc.got + row_at(&kc, 0, 0, 0);
    /* byte 1 (after d): element 1 low, element 17 high; 2.4375 · -2.6666667f = -6.5, + 8.5 = 2 */
    assert_int_equal(b0[2 + 1] & 0xf, 2);
    assert_int_equal(b0[2 + 1] >> 4, 2);
    for (int t = 0; t < S; t++) {
        unsigned char want[18];
        ref_quantize_q4_0(x + t * D, D, want);
        const unsigned char *got = kc.got + row_at(&kc, 0, 0, t);
        for (int i = 0; i < 18; i++)
            if (got[i] != want[i])
                fail_msg("token %d: q4_0 byte %d is 0x%02x, ggml's quantizer gives 0x%02x", t, i, got[i], want[i]);
    }
}

/* The reference's encoders on values whose codes are known from the formats' definitions. */
static void test_ref_encoders(void **state)
{
    (void)state;
    assert_int_equal(ref_fp8_e4m3(448.0), 0x7e);
    assert_int_equal(ref_fp8_e4m3(1e9), 0x7e);
    assert_int_equal(ref_fp8_e4m3(-INFINITY), 0xfe);
    assert_int_equal(ref_fp8_e4m3(1.0), 0x38);
    assert_int_equal(ref_fp8_e4m3(0x1p-9), 0x01);       /* smallest subnormal */
    assert_int_equal(ref_fp8_e4m3(0x1p-10), 0x00);      /* tie with 0: even */
    assert_int_equal(ref_fp8_e4m3(1.0625), 0x38);       /* tie between 1 and 1.125: even */
    assert_int_equal(ref_fp8_e4m3(NAN) & 0x7f, 0x7f);
    assert_int_equal(ref_fp8_e5m2(57344.0), 0x7b);
    assert_int_equal(ref_fp8_e5m2(INFINITY), 0x7b);
    assert_int_equal(ref_fp8_e5m2(1.0), 0x3c);
    assert_int_equal(ref_fp8_e5m2(-0x1p-16), 0x81);
    assert_int_equal(ref_f16_bits(1.0), 0x3c00);
    assert_int_equal(ref_f16_bits(65520.0), 0x7c00);
    assert_int_equal(ref_f16_bits(-0.0), 0x8000);
    assert_int_equal(ref_f16_bits(0x1p-24), 0x0001);
    for (unsigned c = 0; c < 256; c++) {
        const double v4 = ref_fp8_e4m3_value((unsigned char)c), v5 = ref_fp8_e5m2_value((unsigned char)c);
        if (!isnan(v4) && fabs(v4) <= 448.0 && (c & 0x7f) != 0)
            assert_int_equal(ref_fp8_e4m3(v4), c);
        if (isfinite(v5) && (c & 0x7f) != 0)
            assert_int_equal(ref_fp8_e5m2(v5), c);
    }
    /* q4_0: the largest magnitude's sign sets d's; its element stores 0, the opposite extreme clips */
    float x[32] = {0};
    x[3] = -4.0f;
    x[20] = 4.0f;
    x[5] = 1.0f;
    unsigned char b[18];
    ref_quantize_q4_0(x, 32, b);
    assert_int_equal(b[0] | b[1] << 8, 0x3800); /* d = -4 / -8 = 0.5 */
    assert_int_equal(b[2 + 3] & 0xf, 0);        /* -4 / 0.5 + 8.5 = 0.5 -> 0 */
    assert_int_equal(b[2 + 4] >> 4, 15);        /* 4 / 0.5 + 8.5 = 16.5 -> 16 -> 15 */
    assert_int_equal(b[2 + 5] & 0xf, 10);       /* 1 / 0.5 + 8.5 = 10.5 -> 10 */
    /* rotation: a quarter turn of pair 0 */
    const double in[4] = {1.0, 2.0, 3.0, 4.0};
    double out[4];
    const double c0[2] = {0.0, 1.0}, s0[2] = {1.0, 0.0};
    const ref_rope ri = {1, 4, 4, 0.0, c0, s0, 1};
    ref_rope_row(&ri, 0, in, out);
    assert_true(out[0] == -2.0 && out[1] == 1.0 && out[2] == 3.0 && out[3] == 4.0);
    const ref_rope rn = {2, 4, 4, 0.0, c0, s0, 1};
    ref_rope_row(&rn, 5, in, out); /* row 5 clamps to row 0 */
    assert_true(out[0] == -3.0 && out[2] == 1.0 && out[1] == 2.0 && out[3] == 4.0);
}

int main(void)
{
    tu_set_fixtures(NULL, tu_teardown);
    TU_ADD_TABLE("append", test_case, cases);
    TU_ADD_TABLE("refuse", test_refusal, bad_cases);
    tu_add_test("refuse", "null_ctx", test_null_ctx, NULL);
    tu_add_test("events", "wait_and_done", test_events, NULL);
    tu_add_test("append", "q4_0_ties", test_q4_ties, NULL);
    tu_add_test("reference", "encoders", test_ref_encoders, NULL);
    const int failed = tu_run_tests("kv_append");
    clattn_release(tu_ctx);
    return failed;
}
