/*
 * K and V as KV caches store them (issue 73, docs/kvcache.md): paged pools addressed by a block
 * table (vLLM's NHD and HND layouts, any page size), and the storage types i8 (per-token scales),
 * fp8 E4M3 / E5M2 (per-tensor scales), ggml's q8_0 and q4_0, each against the float64 reference on
 * exactly the stored values.
 *
 * The test writes K and V as bytes in their storage type and decodes them here, with its own
 * decoder of each format written from the format's definition (not from the kernels'), into the
 * logical [B][Hkv][Skv][D] doubles the reference reads. Rows of the pool no batch uses, and the
 * rows past each batch's key length, hold NaN in every format (a NaN scale, a NaN code), and the
 * block table's entries past a batch's last page point at such a page, so a kernel that reads a
 * key it must not shows NaN. Rows: decode and prefill, GQA, causal, masks, key lengths (one
 * sequence ending exactly on a page, an empty one), page size 1, pages shared between batches
 * (a common prefix), table entries outside the pool (read clamped into it, as documented), K and V
 * of different types, a sliding window and a softcap.
 *
 * Which kernel runs is the process's: the CPU's fused_direct by default; tests/CMakeLists.txt
 * runs the table again with the tiled kernel and decode_rows forced (CLATTN_TEST_DECODE_ONLY=1:
 * the rows with seq_q <= 16).
 *
 * Tolerances: the logits' and outputs' f32 rounding (atol 3e-5, rtol 2e-4), plus the output
 * type's rounding for f16 (2^-10) and bf16 (2^-7) outputs; LSE atol 2e-5, rtol 1e-5.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_ref.h"
#include "clattn_ref_kv.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

#define F32 CLATTN_F32
#define F16 CLATTN_F16
#define BF16 CLATTN_BF16
#define I8 CLATTN_I8
#define E4M3 CLATTN_FP8_E4M3
#define E5M2 CLATTN_FP8_E5M2
#define Q8 CLATTN_Q8_0
#define Q4 CLATTN_Q4_0

/* ---- rows of random stored values, decoded by the reference (ref/clattn_ref_kv.c) ---- */

/* Writes a random row of d elements of dt at p and its values (scale applied: the row's own for
 * i8, `fs` for fp8) to x. NaN rows: every value NaN (a NaN code, or a NaN scale or d). */
static void make_row(tu_rng *r, clattn_dtype dt, unsigned char *p, int d, float *row_scale, float fs, int nan,
                     double *x)
{
    double scale = 1.0;
    switch (dt) {
    case F32:
    case F16:
    case BF16:
        for (int i = 0; i < d; i++)
            tu_store(dt, p, (size_t)i, nan ? NAN : tu_uniform(r, -1.0, 1.0));
        break;
    case I8:
        *row_scale = nan ? NAN : (float)tu_uniform(r, 0.002, 0.012);
        scale = *row_scale;
        for (int i = 0; i < d; i++)
            p[i] = (unsigned char)(signed char)((int)(tu_next(r) % 255) - 127);
        break;
    case E4M3:
    case E5M2:
        scale = fs;
        for (int i = 0; i < d; i++) {
            /* magnitudes up to 2^4 (E4M3) / 2^2 (E5M2) before the scale; NaN rows: NaN codes */
            unsigned char c = (unsigned char)(tu_next(r) % (dt == E4M3 ? 0x5f : 0x47));
            if (tu_next(r) & 1)
                c |= 0x80;
            p[i] = nan ? (dt == E4M3 ? 0x7f : 0x7e) : c;
        }
        break;
    case Q8:
    case Q4:
        for (int b = 0; b < d / 32; b++) {
            unsigned char *blk = p + (size_t)b * (dt == Q8 ? 34 : 18);
            const uint16_t dh = nan ? 0x7e00
                                    : tu_f32_to_f16((float)tu_uniform(r, dt == Q8 ? 0.002 : 0.03, dt == Q8 ? 0.009 : 0.14));
            blk[0] = (unsigned char)(dh & 0xff); /* little-endian, as ggml stores it */
            blk[1] = (unsigned char)(dh >> 8);
            for (int j = 0; j < (dt == Q8 ? 32 : 16); j++)
                blk[2 + j] = (unsigned char)tu_next(r);
            if (dt == Q8)
                for (int j = 0; j < 32; j++)
                    if (blk[2 + j] == 0x80)
                        blk[2 + j] = 0x81; /* -127 .. 127, as ggml's quantizer writes */
        }
        break;
    }
    ref_kv_decode_row((int)dt, p, d, scale, x);
}

/* Whether fused attention runs on the matrix units (CLATTN_MATRIX=emulate here). */
static int matrix_path(void)
{
    return strncmp(clattn_matrix_report(tu_ctx_get()), "none", 4) != 0;
}

/* ---- the table ---- */

typedef struct kv_case {
    const char *name;
    clattn_dtype qt, kt, vt; /* q and out; K; V (non-KV types must be qt) */
    int B, Hq, Hkv, Sq, Skv, D, Dv;
    int causal;
    int page; /* 0: contiguous [B][Hkv][Skv][D] */
    int hnd;  /* paged: 1 [pages][Hkv][page][D], 0 [pages][page][Hkv][D] */
    int lens; /* 0 all Skv; 1 varied (one ending on a page, one short); 2 with an empty sequence */
    int mask;
    int shared;     /* batch 1's first pages are batch 0's (a shared prefix) */
    int clamp;      /* a table entry below 0 and one past the pool, inside a batch's keys */
    long long window_left;
    float softcap;
    float k_fs, v_fs; /* fp8 per-tensor scales (0: 1) */
} kv_case;

static const kv_case cases[] = {
    /* paged, the query's types */
    {"paged_f32_decode_nhd", F32, F32, F32, 2, 8, 2, 1, 100, 64, 0, 0, 16, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    {"paged_f32_decode_hnd", F32, F32, F32, 2, 8, 2, 1, 100, 64, 0, 0, 16, 1, 1, 0, 0, 0, 0, 0, 0, 0},
    {"paged_f16_prefill_causal", F16, F16, F16, 2, 4, 2, 23, 70, 64, 0, 1, 16, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    {"paged_bf16_decode_gqa", BF16, BF16, BF16, 2, 8, 1, 1, 90, 128, 0, 0, 32, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    {"paged_page1", F32, F32, F32, 2, 4, 2, 3, 37, 48, 40, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    {"paged_page5_mask", F32, F32, F32, 2, 4, 2, 9, 41, 40, 0, 0, 5, 1, 1, 1, 0, 0, 0, 0, 0, 0},
    {"paged_shared_prefix", F32, F32, F32, 3, 4, 2, 4, 64, 64, 0, 1, 16, 0, 2, 0, 1, 0, 0, 0, 0, 0},
    {"paged_clamped_entries", F32, F32, F32, 2, 4, 2, 1, 64, 32, 0, 0, 16, 1, 0, 0, 0, 1, 0, 0, 0, 0},
    {"paged_window_softcap", F32, F32, F32, 2, 4, 2, 12, 80, 64, 0, 1, 16, 0, 1, 0, 0, 0, 20, 30.0f, 0, 0},
    /* quantized, contiguous */
    {"q8_0_decode", F32, Q8, Q8, 2, 8, 2, 1, 77, 64, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    {"q4_0_decode", F32, Q4, Q4, 2, 8, 2, 1, 77, 128, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    {"q8_0_k_q4_0_v_prefill", F16, Q8, Q4, 1, 4, 2, 19, 50, 64, 96, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"i8_decode", F32, I8, I8, 2, 4, 2, 1, 70, 40, 24, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    {"fp8_e4m3_k_e5m2_v", BF16, E4M3, E5M2, 2, 4, 2, 5, 60, 48, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0.0625f, 0.5f},
    {"f16_k_q8_0_v", F16, F16, Q8, 2, 4, 4, 1, 50, 64, 32, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    /* one and three query rows a kv head: on CPUs, K's blocks through qk16_row (a scale a block)
     * and V's scales folded into p, with hidden keys (the checked P·V) and without */
    {"q4_0_decode_mha_mask", F16, Q4, Q4, 2, 4, 4, 1, 77, 64, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"q8_0_decode_group3_window", F32, Q8, Q8, 2, 6, 2, 1, 300, 96, 0, 0, 0, 0, 1, 0, 0, 0, 40, 0, 0, 0},
    /* quantized and paged */
    {"paged_q8_0_decode_gqa", F32, Q8, Q8, 2, 16, 2, 1, 150, 128, 0, 0, 16, 0, 1, 0, 0, 0, 0, 0, 0, 0},
    {"paged_q8_0_k_q4_0_v_decode_mha", F32, Q8, Q4, 2, 4, 4, 1, 150, 128, 0, 0, 16, 1, 1, 1, 0, 0, 0, 0, 0, 0},
    {"paged_q4_0_prefill_hnd", F16, Q4, Q4, 2, 4, 2, 17, 45, 64, 0, 1, 16, 1, 2, 1, 0, 0, 0, 0, 0, 0},
    {"paged_i8_page7", F32, I8, I8, 2, 4, 1, 3, 40, 32, 0, 1, 7, 0, 1, 0, 1, 0, 0, 0, 0, 0},
    {"paged_e4m3_decode", F32, E4M3, E4M3, 2, 8, 2, 1, 64, 64, 0, 0, 16, 1, 0, 0, 0, 0, 0, 0, 0.0625f, 0.125f},
};

/* A pool (or contiguous cache) of one of K and V, its bytes and its i8 scales. */
typedef struct store {
    clattn_dtype dt;
    int d;
    size_t rb;            /* bytes per row */
    unsigned char *bytes; /* rows: [pages][page][H] (NHD) or [pages][H][page] (HND), contiguous: [B][H][S] */
    float *scales;        /* one per row, same order (i8) */
    size_t rows;
} store;

/* Row index of (page or batch p, head h, token t). */
static size_t row_of(const kv_case *c, int p, int h, int t)
{
    const int rows_per = c->page ? c->page : c->Skv;
    if (c->page && !c->hnd)
        return ((size_t)p * rows_per + (size_t)t) * (size_t)c->Hkv + (size_t)h;
    return ((size_t)p * c->Hkv + (size_t)h) * rows_per + (size_t)t;
}

/* The view of a store in elements (blocks of 32 for q8_0/q4_0 are counted in elements). */
static clattn_tensor view_of(const kv_case *c, cl_mem buf, clattn_dtype dt, int npages, int d)
{
    clattn_tensor t = {buf, dt, 0, {0, 0, 0, 0}, {0, 0, 0}};
    const int64_t rows_per = c->page ? c->page : c->Skv;
    t.shape[0] = c->page ? npages : c->B;
    t.shape[1] = c->Hkv;
    t.shape[2] = rows_per;
    t.shape[3] = d;
    if (c->page && !c->hnd) {
        t.stride[0] = rows_per * c->Hkv * d;
        t.stride[1] = d;
        t.stride[2] = (int64_t)c->Hkv * d;
    } else {
        t.stride[0] = (int64_t)c->Hkv * rows_per * d;
        t.stride[1] = rows_per * d;
        t.stride[2] = d;
    }
    return t;
}

static void run_case(void **state)
{
    const kv_case *c = *state;
    clattn_context *ctx = tu_ctx_get();
    tu_rng r;
    tu_seed(&r, tu_seed_of(c->name));
    const int B = c->B, Hq = c->Hq, Hkv = c->Hkv, Sq = c->Sq, Skv = c->Skv, D = c->D, Dv = c->Dv ? c->Dv : c->D;
    const int page = c->page, nb = page ? (Skv + page - 1) / page : 0;
    /* pages: each batch's own, then a NaN page for the entries past a batch's last page, then one
     * more that only a clamped entry reaches */
    const int npages = page ? B * nb + 2 : 0, nan_page = B * nb;
    int lens[8];
    for (int b = 0; b < B; b++) {
        lens[b] = Skv;
        if (c->lens >= 1 && b == 0 && page)
            lens[b] = (Skv / page) * page; /* ends exactly on a page */
        if (c->lens >= 1 && b == 1)
            lens[b] = Skv / 2 + 1;
        if (c->lens == 2 && b == B - 1)
            lens[b] = 0;
    }
    /* block table: a shuffled assignment of the batches' pages; past a batch's last page the NaN page */
    int *bt = NULL;
    if (page) {
        bt = tu_xalloc(sizeof(int) * (size_t)B * (size_t)nb);
        int *perm = tu_xalloc(sizeof(int) * (size_t)B * (size_t)nb);
        for (int i = 0; i < B * nb; i++)
            perm[i] = i;
        for (int i = B * nb - 1; i > 0; i--) {
            const int j = (int)(tu_next(&r) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int b = 0; b < B; b++)
            for (int n = 0; n < nb; n++) {
                const int used = n * page < lens[b];
                bt[b * nb + n] = used ? perm[b * nb + n] : nan_page;
            }
        if (c->shared) /* batch 1 starts with batch 0's first pages */
            for (int n = 0; n < nb / 2; n++)
                bt[1 * nb + n] = bt[0 * nb + n];
        if (c->clamp) { /* inside batch 0's keys: -7 reads page 0, 1e6 the last page */
            bt[0 * nb + 0] = -7;
            bt[0 * nb + 1] = 1000000;
        }
    }
    /* K and V stores, their values per row */
    const clattn_dtype dts[2] = {c->kt, c->vt};
    const int dims[2] = {D, Dv};
    const float fss[2] = {c->k_fs ? c->k_fs : 1.0f, c->v_fs ? c->v_fs : 1.0f};
    store st[2];
    double *rowval[2];
    for (int w = 0; w < 2; w++) {
        store *s = &st[w];
        s->dt = dts[w];
        s->d = dims[w];
        s->rb = ref_kv_row_bytes((int)s->dt, s->d);
        s->rows = page ? (size_t)npages * (size_t)page * (size_t)Hkv : (size_t)B * (size_t)Hkv * (size_t)Skv;
        s->bytes = tu_xalloc(s->rows * s->rb + 64);
        s->scales = tu_xalloc(sizeof(float) * s->rows);
        rowval[w] = tu_xdoubles(s->rows * (size_t)s->d);
        for (size_t i = 0; i < s->rows; i++)
            s->scales[i] = 1.0f;
    }
    /* The rows some batch's visible keys reach (through the table, clamped as documented); every
     * other row holds NaN. */
    unsigned char *needed = tu_xalloc(st[0].rows);
    memset(needed, 0, st[0].rows);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hkv; h++)
            for (int j = 0; j < lens[b]; j++) {
                if (page) {
                    int pg = bt[b * nb + j / page];
                    pg = pg < 0 ? 0 : pg >= npages ? npages - 1 : pg;
                    needed[row_of(c, pg, h, j % page)] = 1;
                } else {
                    needed[row_of(c, b, h, j)] = 1;
                }
            }
    for (int w = 0; w < 2; w++) {
        store *s = &st[w];
        for (size_t row = 0; row < s->rows; row++)
            make_row(&r, s->dt, s->bytes + row * s->rb, s->d, &s->scales[row], fss[w], !needed[row],
                     rowval[w] + row * (size_t)s->d);
    }
    /* The logical K and V the reference reads: [B][Hkv][Skv][d]; keys past L stay NaN (hidden). */
    double *kl = tu_xdoubles((size_t)B * Hkv * Skv * D), *vl = tu_xdoubles((size_t)B * Hkv * Skv * Dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hkv; h++)
            for (int j = 0; j < Skv; j++) {
                size_t row;
                if (page) {
                    int pg = bt[b * nb + j / page];
                    pg = pg < 0 ? 0 : pg >= npages ? npages - 1 : pg;
                    row = row_of(c, pg, h, j % page);
                } else {
                    row = row_of(c, b, h, j);
                }
                memcpy(kl + (((size_t)b * Hkv + h) * Skv + j) * D, rowval[0] + row * (size_t)D, sizeof(double) * D);
                memcpy(vl + (((size_t)b * Hkv + h) * Skv + j) * Dv, rowval[1] + row * (size_t)Dv, sizeof(double) * Dv);
            }
    /* Q, mask */
    const size_t nq = (size_t)B * Hq * Sq * D, no = (size_t)B * Hq * Sq * Dv;
    void *qh = tu_xalloc(nq * clattn_dtype_size(c->qt));
    double *qd = tu_xdoubles(nq);
    tu_fill(&r, c->qt, qh, qd, nq, -1.0, 1.0);
    float *mh = NULL;
    double *md = NULL;
    const size_t nm = (size_t)B * Sq * Skv; /* [B][1][Sq][Skv] */
    if (c->mask) {
        mh = tu_xalloc(sizeof(float) * nm);
        md = tu_xdoubles(nm);
        for (size_t i = 0; i < nm; i++) {
            const double u = tu_uniform(&r, 0.0, 1.0);
            md[i] = u < 0.2 ? -INFINITY : tu_uniform(&r, -2.0, 2.0);
            mh[i] = (float)md[i];
        }
    }
    /* the reference */
    double *want = tu_xdoubles(no), *want_lse = tu_xdoubles((size_t)B * Hq * Sq);
    const double scale = 1.0 / sqrt((double)D);
    ref_attn ra = {0};
    ra.batch = B;
    ra.heads_q = Hq;
    ra.heads_kv = Hkv;
    ra.seq_q = Sq;
    ra.seq_kv = Skv;
    ra.head_dim = D;
    ra.head_dim_v = Dv;
    ra.scale = (double)(float)scale;
    ra.causal = c->causal;
    ra.kv_len = lens;
    if (c->mask) {
        ra.mask = md;
        ra.mask_shape[0] = B;
        ra.mask_shape[1] = 1;
        ra.mask_shape[2] = Sq;
        ra.mask_shape[3] = Skv;
    }
    if (c->window_left) {
        ra.window = 1;
        ra.window_left = c->window_left;
        ra.window_right = 0;
    }
    ra.softcap = c->softcap;
    ref_attention(&ra, qd, kl, vl, want, want_lse, NULL);

    /* device */
    cl_mem qb = tu_xbuffer(nq * clattn_dtype_size(c->qt), qh);
    cl_mem kb = tu_xbuffer(st[0].rows * st[0].rb + 64, st[0].bytes);
    cl_mem vb = tu_xbuffer(st[1].rows * st[1].rb + 64, st[1].bytes);
    const size_t ob_bytes = no * clattn_dtype_size(c->qt);
    unsigned char *sentinel = tu_xalloc(ob_bytes);
    memset(sentinel, 0x5a, ob_bytes);
    cl_mem ob = tu_xbuffer(ob_bytes, sentinel);
    float *lse_init = tu_xalloc(sizeof(float) * (size_t)B * Hq * Sq);
    for (size_t i = 0; i < (size_t)B * Hq * Sq; i++)
        lse_init[i] = 12345.0f;
    cl_mem lb = tu_xbuffer(sizeof(float) * (size_t)B * Hq * Sq, lse_init);
    cl_mem lenb = tu_xbuffer(sizeof(int) * (size_t)B, lens);
    cl_mem btb = page ? tu_xbuffer(sizeof(int) * (size_t)B * nb, bt) : NULL;
    cl_mem mb = c->mask ? tu_xbuffer(sizeof(float) * nm, mh) : NULL;
    cl_mem ksb = c->kt == I8 ? tu_xbuffer(sizeof(float) * st[0].rows, st[0].scales) : NULL;
    cl_mem vsb = c->vt == I8 ? tu_xbuffer(sizeof(float) * st[1].rows, st[1].scales) : NULL;

    clattn_tensor q = clattn_tensor_bhsd(qb, c->qt, B, Hq, Sq, D);
    clattn_tensor out = clattn_tensor_bhsd(ob, c->qt, B, Hq, Sq, Dv);
    clattn_tensor lse = clattn_tensor_bhsd(lb, F32, B, Hq, Sq, 1);
    clattn_tensor k = view_of(c, kb, c->kt, npages, D), v = view_of(c, vb, c->vt, npages, Dv);
    clattn_tensor ks = view_of(c, ksb, F32, npages, 1), vs = view_of(c, vsb, F32, npages, 1);
    clattn_tensor mask = clattn_tensor_bhsd(mb, F32, B, 1, Sq, Skv);
    clattn_kv_layout kv = {0};
    kv.page_size = page;
    kv.block_table = btb;
    kv.block_table_stride = nb;
    kv.k_scales = ksb ? &ks : NULL;
    kv.v_scales = vsb ? &vs : NULL;
    kv.k_scale = c->k_fs;
    kv.v_scale = c->v_fs;
    clattn_attention_desc desc = {0};
    desc.batch = B;
    desc.heads_q = Hq;
    desc.heads_kv = Hkv;
    desc.seq_q = Sq;
    desc.seq_kv = Skv;
    desc.head_dim = D;
    desc.head_dim_v = Dv;
    desc.causal = c->causal;
    desc.kv_lengths = lenb;
    desc.lse = &lse;
    desc.mask = c->mask ? &mask : NULL;
    if (c->window_left) {
        desc.window = 1;
        desc.window_left = c->window_left;
    }
    desc.softcap = c->softcap;
    desc.kv = &kv;
    const clattn_status s = clattn_attention(ctx, &desc, &q, &k, &v, &out, 0, NULL, NULL);
    if (s != CLATTN_SUCCESS)
        fail_msg("%s: %s: %s", c->name, clattn_status_name(s), clattn_last_error(ctx));
    tu_finish(ctx);
    void *oh = tu_xalloc(ob_bytes);
    tu_read(ctx, ob, ob_bytes, oh);
    float *lh = tu_xalloc(sizeof(float) * (size_t)B * Hq * Sq);
    tu_read(ctx, lb, sizeof(float) * (size_t)B * Hq * Sq, lh);
    double *got = tu_xdoubles(no), *got_lse = tu_xdoubles((size_t)B * Hq * Sq);
    for (size_t i = 0; i < no; i++)
        got[i] = tu_load(c->qt, oh, i);
    for (size_t i = 0; i < (size_t)B * Hq * Sq; i++)
        got_lse[i] = lh[i];
    const double o_eps = c->qt == F16 ? 0x1p-10 : c->qt == BF16 ? 0x1p-7 : 0.0;
    /* The matrix units (clattn_matrix_report not "none") multiply 16-bit tiles: K and V of a
     * KV-cache type are rounded to the query's 16-bit type on the way (docs/kvcache.md), a
     * relative u each; a logit then moves by at most scale·Σ|q_d·k_d|·u <= scale·D·max|k|·u
     * (|q| <= 1), the weights and out by twice that. */
    double m_eps = 0.0;
    if (matrix_path() && c->qt != F32 && (c->kt != c->qt || c->vt != c->qt)) {
        double kmax = 0.0;
        for (size_t i = 0; i < (size_t)B * Hkv * Skv * D; i++)
            if (isfinite(kl[i]) && fabs(kl[i]) > kmax)
                kmax = fabs(kl[i]);
        m_eps = scale * D * kmax * (c->qt == F16 ? 0x1p-11 : 0x1p-8);
    }
    tu_failures = 0;
    tu_check_close("out", got, want, no, 3e-5 + o_eps + 2.0 * m_eps, 2e-4 + o_eps + 2.0 * m_eps);
    tu_check_close("lse", got_lse, want_lse, (size_t)B * Hq * Sq, 2e-5 + m_eps, 1e-5);
    /* a row with no visible key: exactly 0 */
    for (size_t i = 0; i < (size_t)B * Hq * Sq; i++)
        if (want_lse[i] == -INFINITY)
            for (int e = 0; e < Dv; e++)
                if (got[i * (size_t)Dv + (size_t)e] != 0.0 || isnan(got[i * (size_t)Dv + (size_t)e])) {
                    print_error("%s: empty row %zu col %d is %g, not 0\n", c->name, i, e, got[i * (size_t)Dv + (size_t)e]);
                    tu_failures++;
                    break;
                }
    if (tu_failures)
        fail_msg("%s: %d checks failed", c->name, tu_failures);
}

/* ---- packed sequences (varlen) ---- */

typedef struct varlen_case {
    const char *name;
    clattn_dtype qt, kt; /* q and out; K and V */
    int B, Hq, Hkv, Sq, Skv, D;
    int causal;
    int packed_k; /* K and V packed by cu_seqlens_k too; else [B][Hkv][Skv][D], or paged */
    int page;     /* with !packed_k: paged K/V (page size) */
    int mask;
    int splits;   /* DECODE's SPLITS for this context: the partials' merge writes packed rows */
} varlen_case;

static const varlen_case varlen_cases[] = {
    {"varlen_prefill_causal", F32, F32, 3, 4, 2, 13, 40, 32, 1, 1, 0, 0, 0},
    {"varlen_q_only_mask", F16, F16, 3, 4, 4, 9, 33, 48, 0, 0, 0, 1, 0},
    {"varlen_paged_q8_0", F32, Q8, 3, 8, 2, 6, 50, 64, 1, 0, 16, 0, 0},
    {"varlen_decode", F32, F32, 4, 8, 2, 1, 70, 64, 0, 1, 0, 0, 0},
    {"varlen_decode_splits", BF16, BF16, 3, 4, 2, 2, 300, 64, 1, 1, 0, 0, 4},
    /* more than 64 packed rows a kv head: the CPU's copies of K and V (transpose_k16, pack_v) */
    {"varlen_prefill_copies", F32, F32, 3, 8, 2, 40, 60, 64, 1, 1, 0, 0, 0},
    {"varlen_prefill_copies_mask_f16", F16, F16, 4, 4, 1, 33, 70, 48, 0, 1, 0, 1, 0},
    /* int8 K/V: each packed sequence's scales from its first row, as its K and V rows */
    {"varlen_packed_i8", F32, I8, 3, 4, 2, 9, 40, 32, 1, 1, 0, 0, 0},
    {"varlen_packed_i8_decode_splits", F16, I8, 3, 8, 2, 1, 300, 64, 0, 1, 0, 0, 3},
    {"varlen_paged_i8", F32, I8, 3, 4, 2, 6, 50, 32, 1, 0, 16, 0, 0},
};

/* Sequence b's query rows and keys: varied, one sequence longer than seq_q (its rows past seq_q
 * are clamped away: neither read nor written), one empty. */
static int vq_len(const varlen_case *c, int b) { return b == 0 ? c->Sq + 2 : b == 1 ? (c->Sq + 1) / 2 : b == 2 ? 0 : 1; }
static int vk_len(const varlen_case *c, int b) { return b == 0 ? c->Skv : b == 1 ? c->Skv / 2 + 3 : b == 2 ? 5 : c->Skv - 1; }

static void run_varlen(void **state)
{
    const varlen_case *c = *state;
    clattn_context *ctx = tu_ctx_get();
    tu_rng r;
    tu_seed(&r, tu_seed_of(c->name));
    const int B = c->B, Hq = c->Hq, Hkv = c->Hkv, Sq = c->Sq, Skv = c->Skv, D = c->D, page = c->page;
    int cuq[9], cuk[9], lens[8];
    cuq[0] = cuk[0] = 0;
    for (int b = 0; b < B; b++) {
        cuq[b + 1] = cuq[b] + vq_len(c, b);
        lens[b] = vk_len(c, b);
        cuk[b + 1] = cuk[b] + lens[b];
    }
    const int total_q = cuq[B] + 3; /* 3 trailing rows no sequence has */
    const int total_k = cuk[B] + 2;
    /* Q [total_q][Hq][D] (FlashAttention's packed layout), out likewise, lse [Hq][total_q] */
    const size_t nq = (size_t)total_q * Hq * D, es = clattn_dtype_size(c->qt);
    void *qh = tu_xalloc(nq * es);
    double *qd = tu_xdoubles(nq);
    tu_fill(&r, c->qt, qh, qd, nq, -1.0, 1.0);
    /* K and V rows: packed [total_k][Hkv][D], or [B][Hkv][Skv][D], or pages (one batch's pages in
     * order, page b·nb + n) */
    const int nb = page ? (Skv + page - 1) / page : 0;
    const size_t nrows = c->packed_k ? (size_t)total_k * Hkv : page ? (size_t)B * nb * page * Hkv : (size_t)B * Hkv * Skv;
    const size_t rb = ref_kv_row_bytes((int)c->kt, D);
    unsigned char *kbytes = tu_xalloc(nrows * rb), *vbytes = tu_xalloc(nrows * rb);
    double *kv_[2] = {tu_xdoubles(nrows * (size_t)D), tu_xdoubles(nrows * (size_t)D)};
    float *ksc = tu_xalloc(sizeof(float) * nrows), *vsc = tu_xalloc(sizeof(float) * nrows); /* i8 */
    for (size_t row = 0; row < nrows; row++) {
        make_row(&r, c->kt, kbytes + row * rb, D, &ksc[row], 1.0f, 0, kv_[0] + row * (size_t)D);
        make_row(&r, c->kt, vbytes + row * rb, D, &vsc[row], 1.0f, 0, kv_[1] + row * (size_t)D);
    }
    int *bt = NULL;
    if (page) {
        bt = tu_xalloc(sizeof(int) * (size_t)B * nb);
        for (int i = 0; i < B * nb; i++)
            bt[i] = B * nb - 1 - i; /* reversed: batch b's pages from the top of the pool */
    }
    float *mh = NULL;
    double *md = NULL;
    const size_t nm = (size_t)B * Sq * Skv;
    if (c->mask) {
        mh = tu_xalloc(sizeof(float) * nm);
        md = tu_xdoubles(nm);
        for (size_t i = 0; i < nm; i++) {
            md[i] = tu_uniform(&r, 0.0, 1.0) < 0.2 ? -INFINITY : tu_uniform(&r, -2.0, 2.0);
            mh[i] = (float)md[i];
        }
    }
    /* the reference, one sequence at a time; rows outside every sequence keep the sentinel */
    const size_t no = (size_t)total_q * Hq * D, nl = (size_t)Hq * total_q;
    double *want = tu_xdoubles(no), *want_lse = tu_xdoubles(nl);
    unsigned char *covered = tu_xalloc((size_t)total_q);
    memset(covered, 0, (size_t)total_q);
    for (int b = 0; b < B; b++) {
        const int sq = vq_len(c, b) < Sq ? vq_len(c, b) : Sq, L = lens[b] < Skv ? lens[b] : Skv;
        if (sq == 0)
            continue;
        double *q1 = tu_xdoubles((size_t)Hq * sq * D), *k1 = tu_xdoubles((size_t)Hkv * Skv * D),
               *v1 = tu_xdoubles((size_t)Hkv * Skv * D), *o1 = tu_xdoubles((size_t)Hq * sq * D),
               *l1 = tu_xdoubles((size_t)Hq * sq), *m1 = c->mask ? tu_xdoubles((size_t)sq * Skv) : NULL;
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < sq; i++)
                memcpy(q1 + ((size_t)h * sq + i) * D, qd + (((size_t)cuq[b] + i) * Hq + h) * D, sizeof(double) * D);
        for (int h = 0; h < Hkv; h++)
            for (int j = 0; j < Skv; j++) {
                size_t row;
                if (c->packed_k)
                    row = j < L ? ((size_t)cuk[b] + j) * Hkv + h : 0;
                else if (page)
                    row = (((size_t)bt[b * nb + j / page] * page) + j % page) * Hkv + h; /* NHD pool */
                else
                    row = ((size_t)b * Hkv + h) * Skv + j;
                memcpy(k1 + ((size_t)h * Skv + j) * D, kv_[0] + row * D, sizeof(double) * D);
                memcpy(v1 + ((size_t)h * Skv + j) * D, kv_[1] + row * D, sizeof(double) * D);
            }
        if (m1)
            memcpy(m1, md + (size_t)b * Sq * Skv, sizeof(double) * (size_t)sq * Skv);
        ref_attn ra = {0};
        ra.batch = 1;
        ra.heads_q = Hq;
        ra.heads_kv = Hkv;
        ra.seq_q = sq;
        ra.seq_kv = Skv;
        ra.head_dim = D;
        ra.scale = (double)(float)(1.0 / sqrt((double)D));
        ra.causal = c->causal;
        ra.kv_len = &L;
        if (m1) {
            ra.mask = m1;
            ra.mask_shape[0] = ra.mask_shape[1] = 1;
            ra.mask_shape[2] = sq;
            ra.mask_shape[3] = Skv;
        }
        ref_attention(&ra, q1, k1, v1, o1, l1, NULL);
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < sq; i++) {
                const size_t t = (size_t)cuq[b] + i;
                covered[t] = 1;
                memcpy(want + (t * Hq + h) * D, o1 + ((size_t)h * sq + i) * D, sizeof(double) * D);
                want_lse[(size_t)h * total_q + t] = l1[(size_t)h * sq + i];
            }
    }
    /* device */
    unsigned char *osent = tu_xalloc(no * es);
    memset(osent, 0x5a, no * es);
    float *lsent = tu_xalloc(sizeof(float) * nl);
    for (size_t i = 0; i < nl; i++)
        lsent[i] = 12345.0f;
    cl_mem qb = tu_xbuffer(nq * es, qh), ob = tu_xbuffer(no * es, osent), lb = tu_xbuffer(sizeof(float) * nl, lsent);
    cl_mem kb = tu_xbuffer(nrows * rb, kbytes), vb = tu_xbuffer(nrows * rb, vbytes);
    cl_mem cuqb = tu_xbuffer(sizeof(int) * (size_t)(B + 1), cuq), cukb = tu_xbuffer(sizeof(int) * (size_t)(B + 1), cuk);
    cl_mem lenb = tu_xbuffer(sizeof(int) * (size_t)B, lens);
    cl_mem btb = page ? tu_xbuffer(sizeof(int) * (size_t)B * nb, bt) : NULL;
    cl_mem mb = c->mask ? tu_xbuffer(sizeof(float) * nm, mh) : NULL;
    clattn_tensor q = {qb, c->qt, 0, {1, Hq, total_q, D}, {0, D, (int64_t)Hq * D}};
    clattn_tensor out = {ob, c->qt, 0, {1, Hq, total_q, D}, {0, D, (int64_t)Hq * D}};
    clattn_tensor lse = {lb, F32, 0, {1, Hq, total_q, 1}, {0, total_q, 1}};
    clattn_tensor k, v;
    if (c->packed_k) {
        k = (clattn_tensor){kb, c->kt, 0, {1, Hkv, total_k, D}, {0, D, (int64_t)Hkv * D}};
    } else if (page) {
        k = (clattn_tensor){kb, c->kt, 0, {B * nb, Hkv, page, D}, {(int64_t)page * Hkv * D, D, (int64_t)Hkv * D}};
    } else {
        k = clattn_tensor_bhsd(kb, c->kt, B, Hkv, Skv, D);
    }
    v = k;
    v.buffer = vb;
    /* i8: the scales in the rows' order, one per (key row, kv head) */
    clattn_tensor kst = k, vst = k;
    if (c->kt == I8) {
        kst.buffer = tu_xbuffer(sizeof(float) * nrows, ksc);
        vst.buffer = tu_xbuffer(sizeof(float) * nrows, vsc);
        kst.dtype = vst.dtype = F32;
        kst.shape[3] = vst.shape[3] = 1;
        for (int d = 0; d < 3; d++)
            kst.stride[d] = vst.stride[d] = k.stride[d] / D;
    }
    clattn_tensor mask = clattn_tensor_bhsd(mb, F32, B, 1, Sq, Skv);
    clattn_kv_layout kv = {0};
    kv.k_scales = c->kt == I8 ? &kst : NULL;
    kv.v_scales = c->kt == I8 ? &vst : NULL;
    kv.cu_seqlens_q = cuqb;
    kv.cu_seqlens_k = c->packed_k ? cukb : NULL;
    kv.page_size = page;
    kv.block_table = btb;
    kv.block_table_stride = nb;
    clattn_attention_desc desc = {0};
    desc.batch = B;
    desc.heads_q = Hq;
    desc.heads_kv = Hkv;
    desc.seq_q = Sq;
    desc.seq_kv = Skv;
    desc.head_dim = D;
    desc.causal = c->causal;
    desc.kv_lengths = c->packed_k ? NULL : lenb;
    desc.mask = c->mask ? &mask : NULL;
    desc.lse = &lse;
    desc.kv = &kv;
    if (c->splits) {
        /* the call's decode parameters with SPLITS replaced, as an override on this context */
        const clattn_problem_class pc = {CLATTN_OPERATION_DECODE, c->qt, D, Sq, Skv, c->causal, 1};
        clattn_kernel_params kp;
        if (clattn_get_call_params(ctx, &pc, Hq, Hkv, D, &kp) != CLATTN_SUCCESS)
            fail_msg("clattn_get_call_params: %s", clattn_last_error(ctx));
        for (int i = 0; i < kp.count; i++)
            if (strcmp(clattn_param_name(CLATTN_OPERATION_DECODE, i), "SPLITS") == 0)
                kp.values[i] = c->splits;
        if (clattn_set_params(ctx, CLATTN_OPERATION_DECODE, kp.values, kp.count) != CLATTN_SUCCESS)
            fail_msg("clattn_set_params: %s", clattn_last_error(ctx));
    }
    const clattn_status s = clattn_attention(ctx, &desc, &q, &k, &v, &out, 0, NULL, NULL);
    if (c->splits)
        clattn_set_params(ctx, CLATTN_OPERATION_DECODE, NULL, 0);
    if (s != CLATTN_SUCCESS)
        fail_msg("%s: %s: %s", c->name, clattn_status_name(s), clattn_last_error(ctx));
    tu_finish(ctx);
    unsigned char *oh = tu_xalloc(no * es);
    float *lh = tu_xalloc(sizeof(float) * nl);
    tu_read(ctx, ob, no * es, oh);
    tu_read(ctx, lb, sizeof(float) * nl, lh);
    tu_failures = 0;
    double *got = tu_xdoubles(no), *got_lse = tu_xdoubles(nl);
    for (int t = 0; t < total_q; t++) {
        if (!covered[t]) { /* outside every sequence (or clamped away): untouched */
            if (memcmp(oh + (size_t)t * Hq * D * es, osent, (size_t)Hq * D * es) != 0)
                fail_msg("%s: packed row %d (no sequence's) was written", c->name, t);
            for (int h = 0; h < Hq; h++)
                if (lh[(size_t)h * total_q + t] != 12345.0f)
                    fail_msg("%s: lse of packed row %d (no sequence's) was written", c->name, t);
            continue;
        }
        for (int h = 0; h < Hq; h++) {
            for (int e = 0; e < D; e++) {
                const size_t i = ((size_t)t * Hq + h) * D + (size_t)e;
                got[i] = tu_load(c->qt, oh, i);
            }
            got_lse[(size_t)h * total_q + t] = lh[(size_t)h * total_q + t];
        }
    }
    for (int t = 0; t < total_q; t++)
        if (!covered[t]) {
            for (size_t i = (size_t)t * Hq * D; i < (size_t)(t + 1) * Hq * D; i++)
                got[i] = want[i] = 0.0;
            for (int h = 0; h < Hq; h++)
                got_lse[(size_t)h * total_q + t] = want_lse[(size_t)h * total_q + t] = 0.0;
        }
    const double o_eps = c->qt == F16 ? 0x1p-10 : c->qt == BF16 ? 0x1p-7 : 0.0;
    tu_check_close("out", got, want, no, 3e-5 + o_eps, 2e-4 + o_eps);
    tu_check_close("lse", got_lse, want_lse, nl, 2e-5, 1e-5);
    if (tu_failures)
        fail_msg("%s: %d checks failed", c->name, tu_failures);
}

/* ---- the decoders' own rules, checked against values known by heart ---- */
static void test_fp8_values(void **state)
{
    (void)state;
    assert_true(ref_fp8_value((int)E4M3, 0x7e) == 448.0);
    assert_true(ref_fp8_value((int)E4M3, 0x01) == ldexp(1.0, -9));
    assert_true(ref_fp8_value((int)E4M3, 0x38) == 1.0);
    assert_true(isnan(ref_fp8_value((int)E4M3, 0xff)));
    assert_true(ref_fp8_value((int)E5M2, 0x7b) == 57344.0);
    assert_true(ref_fp8_value((int)E5M2, 0x3c) == 1.0);
    assert_true(ref_fp8_value((int)E5M2, 0x01) == ldexp(1.0, -16));
    assert_true(isinf(ref_fp8_value((int)E5M2, 0xfc)) && ref_fp8_value((int)E5M2, 0xfc) < 0);
}

/* Every fp8 code through the kernels: one key per code with q = e_0 and V = K, so out (one row,
 * softmax over one visible key) is the decoded value of the code in dim 0. */
static void test_fp8_all_codes(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    for (int w = 0; w < 2; w++) {
        const clattn_dtype dt = w ? E5M2 : E4M3;
        unsigned char kv[256 * 32];
        memset(kv, 0, sizeof kv);
        float qv[256 * 32];
        memset(qv, 0, sizeof qv);
        for (int c = 0; c < 256; c++)
            kv[c * 32] = (unsigned char)c; /* batch c: its one key holds code c in dim 0 */
        cl_mem kb = tu_xbuffer(sizeof kv, kv), qb = tu_xbuffer(sizeof qv, qv);
        cl_mem ob = tu_xbuffer(sizeof qv, NULL);
        clattn_attention_desc desc = {0};
        desc.batch = 256;
        desc.heads_q = desc.heads_kv = 1;
        desc.seq_q = desc.seq_kv = 1;
        desc.head_dim = 32;
        clattn_tensor q = clattn_tensor_bhsd(qb, F32, 256, 1, 1, 32), out = clattn_tensor_bhsd(ob, F32, 256, 1, 1, 32);
        clattn_tensor k = clattn_tensor_bhsd(kb, dt, 256, 1, 1, 32);
        const clattn_status s = clattn_attention(ctx, &desc, &q, &k, &k, &out, 0, NULL, NULL);
        if (s)
            fail_msg("%s: %s", clattn_status_name(s), clattn_last_error(ctx));
        float o[256 * 32];
        tu_read(ctx, ob, sizeof o, o);
        for (int c = 0; c < 256; c++) {
            const double want = ref_fp8_value((int)dt, (unsigned char)c);
            const double got = o[c * 32];
            /* q = 0: the score is 0 for a finite key, so out is the key's value exactly; 0·NaN
             * and 0·inf are NaN scores, which make the row NaN */
            const int ok = isfinite(want) ? got == want : isnan(got);
            if (!ok)
                fail_msg("%s code 0x%02x: %g, want %g", clattn_dtype_name(dt), c, got, isfinite(want) ? want : NAN);
        }
    }
}

/* ---- refusals: each leaves the output untouched ---- */
typedef struct bad_case {
    const char *name;
    clattn_status want;
    const char *says; /* a word of the message */
} bad_case;

static const bad_case bad_cases[] = {
    {"i8_without_scales", CLATTN_INVALID_ARGUMENT, "k_scales"},
    {"scales_for_f32", CLATTN_INVALID_ARGUMENT, "not i8"},
    {"fp8_scale_for_q8_0", CLATTN_INVALID_ARGUMENT, "per-tensor"},
    {"fp8_scale_negative", CLATTN_INVALID_ARGUMENT, "positive"},
    {"page_without_table", CLATTN_INVALID_ARGUMENT, "block_table is NULL"},
    {"table_without_page", CLATTN_INVALID_ARGUMENT, "page_size > 0"},
    {"page_negative", CLATTN_INVALID_ARGUMENT, "page_size"},
    {"table_too_small", CLATTN_INVALID_ARGUMENT, "int32"},
    {"table_stride_short", CLATTN_INVALID_ARGUMENT, "block_table_stride"},
    {"q8_0_head_dim_48", CLATTN_UNSUPPORTED, "multiples of 32"},
    {"unfused_paged", CLATTN_UNSUPPORTED, "fused path"},
    {"probabilities_quantized", CLATTN_UNSUPPORTED, "fused path"},
    {"scores_paged", CLATTN_UNSUPPORTED, "clattn_scores"},
    {"scores_q8_0", CLATTN_UNSUPPORTED, "clattn_scores"},
    {"kv_reserved", CLATTN_INVALID_ARGUMENT, "reserved"},
    {"i8_q_types", CLATTN_INVALID_ARGUMENT, "q->dtype"},
    {"pool_too_small", CLATTN_INVALID_ARGUMENT, "needs"},
    {"cu_k_with_pages", CLATTN_INVALID_ARGUMENT, "cu_seqlens_k"},
    {"cu_q_too_small", CLATTN_INVALID_ARGUMENT, "cu_seqlens_q"},
    {"varlen_q_batch_2", CLATTN_INVALID_ARGUMENT, "q->shape[0]"},
    {"unfused_varlen", CLATTN_UNSUPPORTED, "packed"},
    /* the offsets are read while the outputs are written: none may share their bytes */
    {"cu_q_in_out", CLATTN_INVALID_ARGUMENT, "out overlaps desc->kv->cu_seqlens_q"},
    {"cu_k_in_lse", CLATTN_INVALID_ARGUMENT, "desc->lse overlaps desc->kv->cu_seqlens_k"},
};

static void test_refusal(void **state)
{
    const bad_case *bc = *state;
    clattn_context *ctx = tu_ctx_get();
    const int B = 2, H = 2, S = 16, D = 64, page = 8;
    float host[4096];
    for (int i = 0; i < 4096; i++)
        host[i] = 0.25f;
    cl_mem qb = tu_xbuffer(sizeof host, host), kb = tu_xbuffer(sizeof host, host), vb = tu_xbuffer(sizeof host, host);
    cl_mem ob = tu_xbuffer(sizeof host, host), sb = tu_xbuffer(sizeof host, host);
    int table[4] = {0, 1, 1, 0};
    cl_mem btb = tu_xbuffer(sizeof table, table), small = tu_xbuffer(sizeof(int) * 3, table);
    clattn_tensor q = clattn_tensor_bhsd(qb, F32, B, H, 1, D), out = clattn_tensor_bhsd(ob, F32, B, H, 1, D);
    clattn_tensor k = clattn_tensor_bhsd(kb, F32, B, H, S, D), v = clattn_tensor_bhsd(vb, F32, B, H, S, D);
    clattn_tensor sc = clattn_tensor_bhsd(sb, F32, B, H, S, 1);
    clattn_tensor probs = clattn_tensor_bhsd(sb, F32, B, H, 1, S), lse = clattn_tensor_bhsd(sb, F32, B, H, 1, 1);
    clattn_kv_layout kv = {0};
    clattn_attention_desc desc = {0};
    desc.batch = B;
    desc.heads_q = desc.heads_kv = H;
    desc.seq_q = 1;
    desc.seq_kv = S;
    desc.head_dim = D;
    desc.kv = &kv;
    int scores = 0;
    const char *n = bc->name;
    if (!strcmp(n, "i8_without_scales")) {
        k.dtype = I8;
    } else if (!strcmp(n, "scales_for_f32")) {
        kv.k_scales = &sc;
    } else if (!strcmp(n, "fp8_scale_for_q8_0")) {
        k.dtype = Q8;
        kv.k_scale = 0.5f;
    } else if (!strcmp(n, "fp8_scale_negative")) {
        k.dtype = E4M3;
        kv.k_scale = -0.5f;
    } else if (!strcmp(n, "page_without_table")) {
        kv.page_size = page;
    } else if (!strcmp(n, "table_without_page")) {
        kv.block_table = btb;
    } else if (!strcmp(n, "page_negative")) {
        kv.page_size = -16;
        kv.block_table = btb;
    } else if (!strcmp(n, "varlen_q_batch_2")) {
        kv.cu_seqlens_q = btb; /* q keeps its batch extent 2: refused */
    } else if (!strcmp(n, "cu_q_in_out")) {
        /* q and out packed: [1][H][2 rows][D] in [rows][H][D] order, the offsets in out's buffer */
        q.shape[0] = out.shape[0] = 1;
        q.shape[2] = out.shape[2] = 2;
        q.stride[2] = out.stride[2] = (int64_t)H * D;
        q.stride[1] = out.stride[1] = D;
        kv.cu_seqlens_q = ob;
    } else if (!strcmp(n, "cu_k_in_lse")) {
        /* k and v packed: [1][H][S keys][D] in [keys][H][D] order, the offsets in lse's buffer */
        k.shape[0] = v.shape[0] = 1;
        k.stride[2] = v.stride[2] = (int64_t)H * D;
        k.stride[1] = v.stride[1] = D;
        kv.cu_seqlens_k = sb;
        desc.lse = &lse;
    } else if (!strcmp(n, "cu_q_too_small") || !strcmp(n, "unfused_varlen")) {
        /* q and out packed: [1][H][2 rows][D] in [rows][H][D] order */
        q.shape[0] = out.shape[0] = 1;
        q.shape[2] = out.shape[2] = 2;
        q.stride[2] = out.stride[2] = (int64_t)H * D;
        q.stride[1] = out.stride[1] = D;
        kv.cu_seqlens_q = btb; /* {0, 1, 1, 0}: any values, they are read on the device */
        if (!strcmp(n, "cu_q_too_small")) {
            kv.cu_seqlens_q = small; /* 3 ints: batch 3 needs 4 */
            desc.batch = 3;
            k.shape[0] = v.shape[0] = 1; /* batch 3 of K/V would need 3: broadcast one */
            k.stride[0] = v.stride[0] = 0;
        } else {
            desc.algorithm = CLATTN_ALGORITHM_UNFUSED;
        }
    } else if (!strcmp(n, "table_too_small") || !strcmp(n, "table_stride_short") || !strcmp(n, "unfused_paged") ||
               !strcmp(n, "scores_paged") || !strcmp(n, "pool_too_small") || !strcmp(n, "cu_k_with_pages")) {
        if (!strcmp(n, "cu_k_with_pages"))
            kv.cu_seqlens_k = btb;
        kv.page_size = page;
        kv.block_table = !strcmp(n, "table_too_small") ? small : btb;
        kv.block_table_stride = !strcmp(n, "table_stride_short") ? 1 : 2;
        k.shape[0] = v.shape[0] = 2; /* 2 pages [2][H][8][D] */
        k.shape[2] = v.shape[2] = page;
        k.stride[0] = v.stride[0] = (int64_t)H * page * D;
        k.stride[1] = v.stride[1] = (int64_t)page * D;
        if (!strcmp(n, "pool_too_small"))
            k.shape[0] = 40;
        if (!strcmp(n, "unfused_paged"))
            desc.algorithm = CLATTN_ALGORITHM_UNFUSED;
        scores = !strcmp(n, "scores_paged");
    } else if (!strcmp(n, "q8_0_head_dim_48")) {
        desc.head_dim = 48;
        q.shape[3] = out.shape[3] = 48;
        k.shape[3] = v.shape[3] = 48;
        k.dtype = Q8;
        desc.head_dim_v = 64;
        out.shape[3] = 64;
        v.shape[3] = 64;
    } else if (!strcmp(n, "probabilities_quantized")) {
        v.dtype = Q8;
        v.stride[0] = v.stride[1] = v.stride[2] = 0; /* any view: refused before the buffer matters */
        v.stride[2] = D;
        v.stride[1] = (int64_t)S * D;
        v.stride[0] = (int64_t)H * S * D;
        desc.probabilities = &probs;
    } else if (!strcmp(n, "scores_q8_0")) {
        k.dtype = Q8;
        desc.kv = NULL;
        scores = 1;
    } else if (!strcmp(n, "kv_reserved")) {
        kv.reserved[3] = 1;
    } else if (!strcmp(n, "i8_q_types")) {
        v.dtype = F16; /* neither q's type nor a KV type */
        k.dtype = I8;
        kv.k_scales = &sc;
    }
    clattn_status s;
    if (scores)
        s = clattn_scores(ctx, &desc, &q, &k, &probs, 0, NULL, NULL);
    else
        s = clattn_attention(ctx, &desc, &q, &k, &v, &out, 0, NULL, NULL);
    if (s != bc->want || !strstr(clattn_last_error(ctx), bc->says))
        fail_msg("%s: %s (%s), want %s with \"%s\"", n, clattn_status_name(s), clattn_last_error(ctx),
                 clattn_status_name(bc->want), bc->says);
    float back[4096];
    tu_read(ctx, ob, sizeof back, back);
    assert_memory_equal(back, host, sizeof back);
    tu_read(ctx, sb, sizeof back, back);
    assert_memory_equal(back, host, sizeof back);
}

int main(void)
{
    const int decode_only = tu_getenv_int("CLATTN_TEST_DECODE_ONLY", 0) != 0;
    const int forced = tu_getenv_int("CLATTN_TEST_KV_FORCED", 0) != 0;
    tu_set_fixtures(NULL, tu_teardown);
    for (size_t i = 0; i < N_OF(cases); ++i) {
        if (decode_only && cases[i].Sq > 16)
            continue;
        tu_add_test("attention", cases[i].name, run_case, &cases[i]);
    }
    for (size_t i = 0; i < N_OF(varlen_cases); ++i) {
        if (decode_only && varlen_cases[i].Sq > 16)
            continue;
        tu_add_test("varlen", varlen_cases[i].name, run_varlen, &varlen_cases[i]);
    }
    if (!forced) {
        tu_add_test("fp8", "values", test_fp8_values, NULL);
        tu_add_test("fp8", "all_codes", test_fp8_all_codes, NULL);
        TU_ADD_TABLE("refuse", test_refusal, bad_cases);
    }
    const int failed = tu_run_tests("kvcache");
    clattn_release(tu_ctx);
    return failed;
}
