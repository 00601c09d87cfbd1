/*
 * Training (issue 74): clattn_attention_backward against the float64 reference's gradients
 * (ref_attention_backward, written from the definition), dropout in the forward and backward
 * passes against the reference's Philox (ref_dropout_z), clattn_dropout_mask, bitwise
 * repeatability, a finite-difference check of the library's own forward and backward, and the
 * refusals.
 *
 * Each case runs the forward (clattn_attention with the LSE) on the device, then the backward
 * with its out and LSE; the reference computes its gradients from the same stored inputs in
 * float64. The device's out, LSE and D = rowsum(dout ∘ out) carry f32 rounding (and the rounding
 * of a 16-bit out), so the tolerances are those of the forward scaled by the gradients' size:
 * f32 atol 1e-4 and rtol 1e-3 of the largest |gradient|; a 16-bit out or gradient adds its
 * rounding.
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

typedef struct bwd_case {
    const char *name;
    clattn_dtype dt;      /* q, k, v, dout */
    clattn_dtype out_dt;  /* out (the forward's), and the gradients' type */
    int B, Hq, Hkv, Sq, Skv, D, Dv;
    int causal;
    int mask;             /* 1: additive f32 mask [B][1][Sq][Skv] with some -inf; 2: f16 [1][Hq][1][Skv] */
    int kvlen;            /* per-batch lengths (batch 0: Skv - 5, then 0 when B > 2, ...) */
    long long wl, wr;     /* window (wl or wr nonzero; -1 unbounded; wl 0 wr 0 with `window_on`) */
    int window_on;
    int chunk;
    float softcap;
    int alibi, sinks;
    int mask_mod;
    long long q_offset, k_offset;
    float dropout;
    int poison;           /* NaN in the K and V rows of keys no row sees (past kv_lengths) */
    int bshd;             /* q, k, v, dout and the gradients as [b][s][h][d] */
} bwd_case;

static const bwd_case cases[] = {
    {"plain", F32, F32, 1, 2, 2, 40, 40, 32, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"causal_cross", F32, F32, 2, 2, 2, 24, 50, 32, 32, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"causal_more_rows", F32, F32, 1, 2, 1, 50, 30, 16, 16, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"gqa_dv", F32, F32, 2, 6, 2, 33, 47, 40, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mask_kvlen", F32, F32, 3, 2, 1, 20, 37, 24, 24, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    {"mask_f16_heads", F32, F32, 1, 3, 3, 18, 29, 16, 16, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"f16_out_f32", F16, F32, 1, 4, 2, 32, 48, 64, 64, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"f16", F16, F16, 1, 2, 2, 32, 32, 32, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"bf16_out_f32", BF16, F32, 2, 2, 1, 17, 33, 48, 16, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"softcap", F32, F32, 1, 2, 2, 30, 30, 32, 32, 1, 0, 0, 0, 0, 0, 0, 2.5f, 0, 0, 0, 0, 0, 0, 0, 0},
    {"alibi_sinks", F32, F32, 2, 4, 2, 28, 28, 16, 16, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0},
    {"sinks_empty_rows", F32, F32, 3, 2, 2, 12, 20, 16, 16, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0},
    {"window", F32, F32, 1, 2, 2, 64, 64, 16, 16, 1, 0, 0, 9, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"window_two_sided", F32, F32, 1, 2, 1, 40, 52, 16, 24, 0, 0, 0, 5, 7, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"chunk_softcap_alibi", F32, F32, 1, 2, 2, 48, 48, 16, 16, 1, 0, 0, 0, 0, 0, 20, 3.0f, 1, 0, 0, 0, 0, 0, 0, 0},
    {"mask_mod", F32, F32, 1, 2, 2, 36, 36, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0},
    {"offsets", F32, F32, 1, 2, 2, 24, 32, 16, 16, 1, 0, 0, 12, 0, 1, 0, 0, 0, 0, 0, 40, 64, 0, 0, 0},
    {"dropout", F32, F32, 2, 2, 1, 40, 70, 32, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.25f, 0, 0},
    {"dropout_causal_offsets", F32, F32, 1, 3, 3, 30, 45, 16, 16, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 5, 11, 0.4f, 0, 0},
    {"dropout_decode_gqa", F32, F32, 2, 8, 2, 3, 300, 32, 32, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0.3f, 0, 0},
    {"poison_kvlen", F32, F32, 2, 2, 2, 16, 40, 16, 16, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0},
    {"bshd", F32, F32, 2, 4, 2, 21, 35, 24, 24, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    {"odd_dims", F32, F32, 1, 2, 2, 19, 23, 7, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"mla_576_512", F32, F32, 1, 2, 1, 9, 20, 576, 512, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};

/* mask_mod's OpenCL C and its reference: the query sees keys whose index differs from its
 * position by a multiple of 3 or by less than 4. */
static const char *const mask_mod_src =
    "int mask_mod(int b, int h, int q, int k) { int d = q - k; return d % 3 == 0 || (d < 4 && d > -4); }\n";
static int ref_mask_mod_fn(int b, int h, long long q, int k, void *user)
{
    (void)b, (void)h, (void)user;
    const long long d = q - k;
    return d % 3 == 0 || (d < 4 && d > -4);
}

/* Index of element (b, h, s, d) of a [B][H][S][D] tensor stored as BHSD or BSHD. */
static size_t at(int bshd, int H, int S, int D, int b, int h, int s, int d)
{
    return bshd ? (((size_t)b * S + s) * H + h) * D + d : (((size_t)b * H + h) * S + s) * D + d;
}
static clattn_tensor view(cl_mem m, clattn_dtype dt, int bshd, int B, int H, int S, int D)
{
    return bshd ? clattn_tensor_bshd(m, dt, B, S, H, D) : clattn_tensor_bhsd(m, dt, B, H, S, D);
}

/* Everything one case needs on the host and the device. */
typedef struct run {
    const bwd_case *c;
    size_t nq, nk, nv, no, nl;
    double *qd, *kd, *vd, *god;   /* stored inputs as doubles, BHSD */
    cl_mem qb, kb, vb, ob, gb, lb, mb, klb, slb, skb;
    clattn_tensor q, k, v, o, go, lse, mask, slope_t, sink_t;
    double *maskd, *slopes, *sinks;
    int *kvl;
    ref_attn ra;
    clattn_attention_desc d;
} run;

static void setup_run(run *r, const bwd_case *c, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    tu_rng g;
    tu_seed(&g, seed);
    const int B = c->B, Hq = c->Hq, Hkv = c->Hkv, Sq = c->Sq, Skv = c->Skv, D = c->D, Dv = c->Dv;
    r->nq = (size_t)B * Hq * Sq * D;
    r->nk = (size_t)B * Hkv * Skv * D;
    r->nv = (size_t)B * Hkv * Skv * Dv;
    r->no = (size_t)B * Hq * Sq * Dv;
    r->nl = (size_t)B * Hq * Sq;
    const size_t es = clattn_dtype_size(c->dt);
    void *qh = tu_xalloc(r->nq * es), *kh = tu_xalloc(r->nk * es), *vh = tu_xalloc(r->nv * es),
         *gh = tu_xalloc(r->no * es);
    r->qd = tu_xdoubles(r->nq);
    r->kd = tu_xdoubles(r->nk);
    r->vd = tu_xdoubles(r->nv);
    r->god = tu_xdoubles(r->no);
    /* BHSD doubles; the device images in the case's layout */
    double *tmp = tu_xdoubles(r->nq > r->nk ? (r->nq > r->nv ? r->nq : r->nv) : (r->nk > r->nv ? r->nk : r->nv));
    const struct {
        double *dst;
        void *img;
        int H, S, DD;
        double amp;
    } t[4] = {{r->qd, qh, Hq, Sq, D, 1.0}, {r->kd, kh, Hkv, Skv, D, 1.0}, {r->vd, vh, Hkv, Skv, Dv, 1.0},
              {r->god, gh, Hq, Sq, Dv, 1.0}};
    for (int x = 0; x < 4; x++) {
        const size_t n = (size_t)B * t[x].H * t[x].S * t[x].DD;
        void *lin = tu_xalloc(n * es);
        tu_fill(&g, c->dt, lin, t[x].dst, n, -t[x].amp, t[x].amp);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < t[x].H; h++)
                for (int s = 0; s < t[x].S; s++)
                    for (int e = 0; e < t[x].DD; e++) {
                        const size_t src = (((size_t)b * t[x].H + h) * t[x].S + s) * t[x].DD + e;
                        tu_store(c->dt, t[x].img, at(c->bshd, t[x].H, t[x].S, t[x].DD, b, h, s, e),
                                 tu_load(c->dt, lin, src));
                    }
    }
    (void)tmp;
    r->kvl = tu_xalloc(sizeof(int) * (size_t)B);
    for (int b = 0; b < B; b++)
        r->kvl[b] = b == 0 ? Skv - 5 : b == 1 ? (Skv > 3 ? 3 : Skv) : 0;
    if (c->poison) /* NaN in the rows past each batch's length: hidden from every row */
        for (int b = 0; b < B; b++)
            for (int h = 0; h < Hkv; h++)
                for (int s = r->kvl[b]; s < Skv; s++) {
                    for (int e = 0; e < D; e++)
                        tu_store(c->dt, kh, at(c->bshd, Hkv, Skv, D, b, h, s, e), NAN);
                    for (int e = 0; e < Dv; e++)
                        tu_store(c->dt, vh, at(c->bshd, Hkv, Skv, Dv, b, h, s, e), NAN);
                }
    r->qb = tu_xbuffer(r->nq * es, qh);
    r->kb = tu_xbuffer(r->nk * es, kh);
    r->vb = tu_xbuffer(r->nv * es, vh);
    r->gb = tu_xbuffer(r->no * es, gh);
    r->ob = tu_xbuffer(r->no * clattn_dtype_size(c->out_dt), NULL);
    r->lb = tu_xbuffer(r->nl * sizeof(float), NULL);
    r->q = view(r->qb, c->dt, c->bshd, B, Hq, Sq, D);
    r->k = view(r->kb, c->dt, c->bshd, B, Hkv, Skv, D);
    r->v = view(r->vb, c->dt, c->bshd, B, Hkv, Skv, Dv);
    r->go = view(r->gb, c->dt, c->bshd, B, Hq, Sq, Dv);
    r->o = clattn_tensor_bhsd(r->ob, c->out_dt, B, Hq, Sq, Dv);
    r->lse = clattn_tensor_bhsd(r->lb, F32, B, Hq, Sq, 1);

    ref_attn *ra = &r->ra;
    ra->batch = B;
    ra->heads_q = Hq;
    ra->heads_kv = Hkv;
    ra->seq_q = Sq;
    ra->seq_kv = Skv;
    ra->head_dim = D;
    ra->head_dim_v = Dv;
    const float scale = D > 256 ? 0.0721687836f : (float)(1.0 / sqrt((double)D)); /* 1/sqrt(192) for MLA */
    ra->scale = (double)scale;
    ra->causal = c->causal;
    clattn_attention_desc *d = &r->d;
    d->batch = B;
    d->heads_q = Hq;
    d->heads_kv = Hkv;
    d->seq_q = Sq;
    d->seq_kv = Skv;
    d->head_dim = D;
    d->head_dim_v = Dv;
    d->scale = D > 256 ? scale : 0.0f;
    d->causal = c->causal;
    if (c->mask) {
        const int per_head = c->mask == 2;
        const int mB = per_head ? 1 : B, mH = per_head ? Hq : 1, mS = per_head ? 1 : Sq;
        const size_t n = (size_t)mB * mH * mS * Skv;
        const clattn_dtype mdt = per_head ? F16 : F32;
        void *mh = tu_xalloc(n * clattn_dtype_size(mdt));
        r->maskd = tu_xdoubles(n);
        for (size_t i = 0; i < n; i++) {
            const double x = tu_next(&g) % 7 == 0 ? -INFINITY : tu_uniform(&g, -2.0, 1.0);
            tu_put(mdt, mh, r->maskd, i, x);
        }
        r->mb = tu_xbuffer(n * clattn_dtype_size(mdt), mh);
        r->mask = (clattn_tensor){r->mb, mdt, 0, {B, Hq, Sq, Skv},
                                  {per_head ? 0 : (int64_t)Sq * Skv, per_head ? Skv : 0, per_head ? 0 : Skv}};
        d->mask = &r->mask;
        ra->mask = r->maskd;
        ra->mask_shape[0] = mB;
        ra->mask_shape[1] = mH;
        ra->mask_shape[2] = mS;
        ra->mask_shape[3] = Skv;
    }
    if (c->kvlen || c->poison) {
        r->klb = tu_xbuffer(sizeof(int) * (size_t)B, r->kvl);
        d->kv_lengths = r->klb;
        ra->kv_len = r->kvl;
    }
    if (c->window_on) {
        d->window = ra->window = 1;
        d->window_left = ra->window_left = c->wl;
        d->window_right = ra->window_right = c->wr;
    }
    d->chunk = ra->chunk = c->chunk;
    d->softcap = c->softcap;
    ra->softcap = c->softcap;
    float sl[16], sk[16];
    r->slopes = tu_xdoubles(16);
    r->sinks = tu_xdoubles(16);
    for (int h = 0; h < Hq; h++) {
        sl[h] = (float)(0.04 * (h + 1));
        r->slopes[h] = sl[h];
        sk[h] = (float)tu_uniform(&g, -1.0, 1.5);
        r->sinks[h] = sk[h];
    }
    if (c->alibi) {
        r->slb = tu_xbuffer(sizeof sl, sl);
        r->slope_t = clattn_tensor_bhsd(r->slb, F32, 1, Hq, 1, 1);
        d->alibi_slopes = &r->slope_t;
        ra->alibi = r->slopes;
    }
    if (c->sinks) {
        r->skb = tu_xbuffer(sizeof sk, sk);
        r->sink_t = clattn_tensor_bhsd(r->skb, F32, 1, Hq, 1, 1);
        d->sinks = &r->sink_t;
        ra->sinks = r->sinks;
    }
    if (c->mask_mod) {
        d->mask_mod = mask_mod_src;
        ra->mask_mod = ref_mask_mod_fn;
    }
    d->q_offset = ra->q_offset = c->q_offset;
    d->k_offset = ra->k_offset = c->k_offset;
    if (c->dropout > 0.0f) {
        d->dropout_p = c->dropout;
        d->dropout_seed = seed ^ 0x9e3779b97f4a7c15ull;
        d->dropout_offset = (unsigned)(seed >> 40);
        ra->dropout_p = (double)c->dropout;
        ra->dropout_seed = d->dropout_seed;
        ra->dropout_offset = d->dropout_offset;
    }
}

/* The forward with the LSE, on the device. */
static void forward(clattn_context *ctx, run *r)
{
    clattn_attention_desc d = r->d;
    d.lse = &r->lse;
    const clattn_status s = clattn_attention(ctx, &d, &r->q, &r->k, &r->v, &r->o, 0, NULL, NULL);
    if (s != CLATTN_SUCCESS)
        fail_msg("%s forward: %s: %s", r->c->name, clattn_status_name(s), clattn_last_error(ctx));
}

/* The gradients' buffers (the case's layout and out_dt), filled with 7 first. */
typedef struct grads {
    cl_mem qb, kb, vb, sb;
    clattn_tensor dq, dk, dv, ds;
} grads;

static void make_grads(run *r, grads *gr)
{
    const bwd_case *c = r->c;
    const size_t es = clattn_dtype_size(c->out_dt);
    const size_t n[3] = {r->nq, r->nk, r->nv};
    cl_mem *m[3] = {&gr->qb, &gr->kb, &gr->vb};
    for (int x = 0; x < 3; x++) {
        void *h = tu_xalloc(n[x] * es);
        for (size_t i = 0; i < n[x]; i++)
            tu_store(c->out_dt, h, i, 7.0);
        *m[x] = tu_xbuffer(n[x] * es, h);
    }
    gr->dq = view(gr->qb, c->out_dt, c->bshd, c->B, c->Hq, c->Sq, c->D);
    gr->dk = view(gr->kb, c->out_dt, c->bshd, c->B, c->Hkv, c->Skv, c->D);
    gr->dv = view(gr->vb, c->out_dt, c->bshd, c->B, c->Hkv, c->Skv, c->Dv);
    const float seven[16] = {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
    gr->sb = tu_xbuffer(sizeof seven, seven);
    gr->ds = clattn_tensor_bhsd(gr->sb, F32, 1, c->Hq, 1, 1);
}

static clattn_status backward(clattn_context *ctx, run *r, grads *gr)
{
    return clattn_attention_backward(ctx, &r->d, &r->q, &r->k, &r->v, &r->o, &r->go, &r->lse, &gr->dq, &gr->dk,
                                     &gr->dv, r->c->sinks ? &gr->ds : NULL, 0, NULL, NULL);
}

/* A device tensor of the case's layout read back as BHSD doubles. */
static void read_bhsd(clattn_context *ctx, const bwd_case *c, cl_mem m, clattn_dtype dt, int H, int S, int D,
                      double *dst)
{
    const size_t n = (size_t)c->B * H * S * D, es = clattn_dtype_size(dt);
    void *h = tu_xalloc(n * es);
    tu_read(ctx, m, n * es, h);
    for (int b = 0; b < c->B; b++)
        for (int hh = 0; hh < H; hh++)
            for (int s = 0; s < S; s++)
                for (int e = 0; e < D; e++)
                    dst[(((size_t)b * H + hh) * S + s) * D + e] = tu_load(dt, h, at(c->bshd, H, S, D, b, hh, s, e));
}

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(x[i]) > m)
            m = fabs(x[i]);
    return m;
}

static void run_case(void **state)
{
    const bwd_case *c = *state;
    clattn_context *ctx = tu_ctx_get();
    run r;
    setup_run(&r, c, tu_seed_of(c->name));
    forward(ctx, &r);
    grads gr;
    make_grads(&r, &gr);
    clattn_status s = backward(ctx, &r, &gr);
    if (s != CLATTN_SUCCESS)
        fail_msg("%s backward: %s: %s", c->name, clattn_status_name(s), clattn_last_error(ctx));
    double *dq = tu_xdoubles(r.nq), *dk = tu_xdoubles(r.nk), *dv = tu_xdoubles(r.nv), ds[16] = {0};
    double *wq = tu_xdoubles(r.nq), *wk = tu_xdoubles(r.nk), *wv = tu_xdoubles(r.nv), wds[16] = {0};
    read_bhsd(ctx, c, gr.qb, c->out_dt, c->Hq, c->Sq, c->D, dq);
    read_bhsd(ctx, c, gr.kb, c->out_dt, c->Hkv, c->Skv, c->D, dk);
    read_bhsd(ctx, c, gr.vb, c->out_dt, c->Hkv, c->Skv, c->Dv, dv);
    /* The reference's forward sees the 16-bit inputs exactly as stored; the device's out is
     * rounded to out_dt before D = rowsum(dout ∘ out). */
    ref_attention_backward(&r.ra, r.qd, r.kd, r.vd, r.god, wq, wk, wv, c->sinks ? wds : NULL);
    if (c->sinks) {
        float f[16];
        tu_read(ctx, gr.sb, sizeof f, f);
        for (int h = 0; h < c->Hq; h++)
            ds[h] = f[h];
    }
    tu_failures = 0;
    const double o_eps = c->out_dt == F16 ? 0x1p-10 : c->out_dt == BF16 ? 0x1p-7 : 0.0;
    const double in_eps = c->dt == F16 ? 0x1p-10 : c->dt == BF16 ? 0x1p-7 : 0.0;
    if (c->dropout > 0.0f) {
        /* the forward's dropout: the reference draws z with ref_dropout_z, as the backward above */
        double *got = tu_xdoubles(r.no), *want = tu_xdoubles(r.no);
        float *oh = tu_xalloc(r.no * sizeof(float));
        tu_read(ctx, r.ob, r.no * sizeof(float), oh);
        for (size_t i = 0; i < r.no; i++)
            got[i] = oh[i];
        ref_attention(&r.ra, r.qd, r.kd, r.vd, want, NULL, NULL);
        tu_check_close("forward out with dropout", got, want, r.no, 3e-5 * (max_abs(want, r.no) + 1.0), 2e-4);
    }
    const double e = 2e-4 + 4.0 * (o_eps + in_eps);
    tu_check_close("dq", dq, wq, r.nq, e * (max_abs(wq, r.nq) + 1e-3), e);
    tu_check_close("dk", dk, wk, r.nk, e * (max_abs(wk, r.nk) + 1e-3), e);
    tu_check_close("dv", dv, wv, r.nv, e * (max_abs(wv, r.nv) + 1e-3), e);
    if (c->sinks)
        tu_check_close("dsinks", ds, wds, (size_t)c->Hq, e * (max_abs(wds, (size_t)c->Hq) + 1e-3), e);
    if (tu_failures)
        fail_msg("%s: %d checks failed", c->name, tu_failures);
    /* No NaN where the reference has none (poison: NaN K/V rows hidden from every row). */
    for (size_t i = 0; i < r.nk; i++)
        if (isnan(dk[i]) != isnan(wk[i]))
            fail_msg("%s: dk[%zu] %g against %g", c->name, i, dk[i], wk[i]);
}

/* The same inputs twice, and once more after other work: bitwise the same gradients. */
static void test_repeat(void **state)
{
    const bwd_case *c = *state;
    clattn_context *ctx = tu_ctx_get();
    run r;
    setup_run(&r, c, tu_seed_of(c->name));
    forward(ctx, &r);
    grads g1, g2;
    make_grads(&r, &g1);
    make_grads(&r, &g2);
    assert_int_equal(backward(ctx, &r, &g1), CLATTN_SUCCESS);
    assert_int_equal(backward(ctx, &r, &g2), CLATTN_SUCCESS);
    const size_t es = clattn_dtype_size(c->out_dt);
    const size_t n[3] = {r.nq, r.nk, r.nv};
    cl_mem a[3] = {g1.qb, g1.kb, g1.vb}, b[3] = {g2.qb, g2.kb, g2.vb};
    for (int x = 0; x < 3; x++) {
        void *ha = tu_xalloc(n[x] * es), *hb = tu_xalloc(n[x] * es);
        tu_read(ctx, a[x], n[x] * es, ha);
        tu_read(ctx, b[x], n[x] * es, hb);
        assert_memory_equal(ha, hb, n[x] * es);
    }
}

/* Dropout: clattn_dropout_mask equals the reference's z element by element, its kept fraction
 * lies within 5 binomial sigmas of 1 - round(p·65536) / 65536, and the forward with dropout
 * equals the reference's (which draws the same z): the forward and the mask agree. */
static void test_dropout_mask(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    const int B = 2, Hq = 3, Sq = 37, Skv = 301;
    const int kvl[2] = {290, 301};
    clattn_attention_desc d = {0};
    d.batch = B;
    d.heads_q = Hq;
    d.heads_kv = 1;
    d.seq_q = Sq;
    d.seq_kv = Skv;
    d.head_dim = 16;
    d.dropout_p = 0.3f;
    d.dropout_seed = 0xfeedfacecafebeefull;
    d.dropout_offset = 77;
    d.q_offset = -5;
    d.k_offset = 3; /* keys from global 3: vectors across 16-key groups */
    cl_mem kl = tu_xbuffer(sizeof kvl, kvl);
    d.kv_lengths = kl;
    const size_t n = (size_t)B * Hq * Sq * Skv;
    for (int pass = 0; pass < 2; pass++) {
        const clattn_dtype dt = pass ? F16 : F32;
        cl_mem mb = tu_xbuffer(n * clattn_dtype_size(dt), NULL);
        clattn_tensor m = clattn_tensor_bhsd(mb, dt, B, Hq, Sq, Skv);
        const clattn_status s = clattn_dropout_mask(ctx, &d, &m, 0, NULL, NULL);
        if (s != CLATTN_SUCCESS)
            fail_msg("dropout_mask: %s: %s", clattn_status_name(s), clattn_last_error(ctx));
        void *h = tu_xalloc(n * clattn_dtype_size(dt));
        tu_read(ctx, mb, n * clattn_dtype_size(dt), h);
        long kept = 0;
        const double p = (double)d.dropout_p;
        for (int b = 0; b < B; b++)
            for (int hq = 0; hq < Hq; hq++)
                for (int i = 0; i < Sq; i++)
                    for (int j = 0; j < Skv; j++) {
                        const long long rr = i + (kvl[b] - Sq) + d.q_offset, cc = j + d.k_offset;
                        double want = ref_dropout_z(d.dropout_seed, d.dropout_offset, p, b, Hq, hq, rr, cc);
                        if (dt == F16)
                            want = tu_f16_to_f32(tu_f32_to_f16((float)want));
                        else
                            want = (double)(float)want;
                        const double got = tu_load(dt, h, (((size_t)b * Hq + hq) * Sq + i) * Skv + j);
                        if (got != want)
                            fail_msg("dropout_mask %s (%d,%d,%d,%d): %g against %g", dt == F16 ? "f16" : "f32", b,
                                     hq, i, j, got, want);
                        kept += got != 0.0;
                    }
        const double t = floor(p * 65536.0 + 0.5) / 65536.0, mean = (1.0 - t) * (double)n;
        const double sigma = sqrt((double)n * t * (1.0 - t));
        if (fabs((double)kept - mean) > 5.0 * sigma)
            fail_msg("dropout_mask: %ld kept of %zu, expected %.0f +- %.0f", kept, n, mean, 5.0 * sigma);
    }
}

/* Central differences of the library's own forward in f32 against its backward, on a few
 * elements of q, k and v: loss = Σ dout ∘ out. Steps of 1e-2 on inputs of size 1 leave f32's
 * rounding and the curvature near 1e-4 of the gradient, so the check asks for 2e-2. */
static void test_finite_differences(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    static const bwd_case c = {"fd", F32, F32, 1, 2, 1, 12, 17, 8, 8, 1, 0, 0, 0, 0, 0, 0, 4.0f, 1, 1,
                               0, 0, 0, 0, 0, 0};
    run r;
    setup_run(&r, &c, 1234);
    forward(ctx, &r);
    grads gr;
    make_grads(&r, &gr);
    assert_int_equal(backward(ctx, &r, &gr), CLATTN_SUCCESS);
    double *g[3] = {tu_xdoubles(r.nq), tu_xdoubles(r.nk), tu_xdoubles(r.nv)};
    read_bhsd(ctx, &c, gr.qb, F32, c.Hq, c.Sq, c.D, g[0]);
    read_bhsd(ctx, &c, gr.kb, F32, c.Hkv, c.Skv, c.D, g[1]);
    read_bhsd(ctx, &c, gr.vb, F32, c.Hkv, c.Skv, c.Dv, g[2]);
    const size_t n[3] = {r.nq, r.nk, r.nv};
    cl_mem bufs[3] = {r.qb, r.kb, r.vb};
    const double *base[3] = {r.qd, r.kd, r.vd};
    float *go = tu_xalloc(r.no * sizeof(float)), *o = tu_xalloc(r.no * sizeof(float));
    tu_read(ctx, r.gb, r.no * sizeof(float), go);
    tu_rng rng;
    tu_seed(&rng, 99);
    const double h = 1e-2;
    for (int x = 0; x < 3; x++)
        for (int t = 0; t < 6; t++) {
            const size_t i = (size_t)(tu_next(&rng) % n[x]);
            double loss[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                float val = (float)(base[x][i] + (sgn ? -h : h));
                clEnqueueWriteBuffer(clattn_queue(ctx), bufs[x], CL_TRUE, i * sizeof(float), sizeof(float), &val, 0,
                                     NULL, NULL);
                forward(ctx, &r);
                tu_read(ctx, r.ob, r.no * sizeof(float), o);
                double l = 0.0;
                for (size_t e = 0; e < r.no; e++)
                    l += (double)go[e] * (double)o[e];
                loss[sgn] = l;
            }
            float orig = (float)base[x][i];
            clEnqueueWriteBuffer(clattn_queue(ctx), bufs[x], CL_TRUE, i * sizeof(float), sizeof(float), &orig, 0,
                                 NULL, NULL);
            const double fd = (loss[0] - loss[1]) / (2.0 * h);
            const double got = g[x][i], scale = fmax(fabs(fd), 0.05 * max_abs(g[x], n[x]) + 1e-6);
            if (fabs(got - fd) > 2e-2 * scale)
                fail_msg("finite differences: %s[%zu]: backward %g, differences %g", x == 0 ? "q" : x == 1 ? "k" : "v",
                         i, got, fd);
        }
}

/* Refusals: clear messages, and the gradients untouched. */
static void test_refusals(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    static const bwd_case c = {"refuse", F32, F32, 1, 2, 2, 8, 8, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                               0, 0, 0, 0, 0, 0};
    run r;
    setup_run(&r, &c, 5);
    forward(ctx, &r);
    grads gr;
    make_grads(&r, &gr);
    float before[8 * 16 * 2];
    tu_read(ctx, gr.qb, sizeof before, before);
    clattn_attention_desc d = r.d;
#define EXPECT(st, ...)                                                                                        \
    do {                                                                                                       \
        const clattn_status got_ = clattn_attention_backward(ctx, &d, __VA_ARGS__, 0, NULL, NULL);            \
        if (got_ != (st))                                                                                      \
            fail_msg("line %d: %s, expected %s (%s)", __LINE__, clattn_status_name(got_), clattn_status_name(st), \
                     clattn_last_error(ctx));                                                                  \
        if (!clattn_last_error(ctx)[0])                                                                        \
            fail_msg("line %d: no message", __LINE__);                                                         \
        d = r.d;                                                                                               \
    } while (0)
    EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, NULL, &r.lse, &gr.dq, &gr.dk, &gr.dv, NULL);
    EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, &r.go, NULL, &gr.dq, &gr.dk, &gr.dv, NULL);
    EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, NULL, &gr.dk, &gr.dv, NULL);
    d.lse = &r.lse;
    EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &gr.dq, &gr.dk, &gr.dv, NULL);
    d.score_mod = "float score_mod(float s, int b, int h, int q, int k) { return s; }\n";
    EXPECT(CLATTN_UNSUPPORTED, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &gr.dq, &gr.dk, &gr.dv, NULL);
    d.algorithm = CLATTN_ALGORITHM_UNFUSED;
    EXPECT(CLATTN_UNSUPPORTED, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &gr.dq, &gr.dk, &gr.dv, NULL);
    /* dsinks without sinks; gradients overlapping an input or each other; a wrong dtype */
    EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &gr.dq, &gr.dk, &gr.dv, &gr.ds);
    EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &r.q, &gr.dk, &gr.dv, NULL);
    EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &gr.dq, &gr.dk, &gr.dk, NULL);
    assert_non_null(strstr(clattn_last_error(ctx), "dv overlaps dk: their byte ranges meet"));
    clattn_tensor bad = gr.dq;
    bad.dtype = F16;
    EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &bad, &gr.dk, &gr.dv, NULL);
    bad = gr.dq;
    bad.shape[2] = 9; /* past the buffer */
    EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &bad, &gr.dk, &gr.dv, NULL);
    const float bad_p[4] = {1.0f, -0.1f, NAN, 1.5f};
    for (int i = 0; i < 4; i++) {
        d.dropout_p = bad_p[i];
        EXPECT(CLATTN_INVALID_ARGUMENT, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &gr.dq, &gr.dk, &gr.dv, NULL);
    }
#undef EXPECT
    float after[8 * 16 * 2];
    tu_read(ctx, gr.qb, sizeof after, after);
    assert_memory_equal(before, after, sizeof before);
    /* the forward's dropout refusals: the unfused path and the probabilities */
    d = r.d;
    d.dropout_p = 0.5f;
    d.algorithm = CLATTN_ALGORITHM_UNFUSED;
    assert_int_equal(clattn_attention(ctx, &d, &r.q, &r.k, &r.v, &r.o, 0, NULL, NULL), CLATTN_UNSUPPORTED);
    d.algorithm = CLATTN_ALGORITHM_AUTO;
    cl_mem pb = tu_xbuffer(sizeof(float) * 2 * 8 * 8, NULL);
    clattn_tensor probs = clattn_tensor_bhsd(pb, F32, 1, 2, 8, 8);
    d.probabilities = &probs;
    assert_int_equal(clattn_attention(ctx, &d, &r.q, &r.k, &r.v, &r.o, 0, NULL, NULL), CLATTN_UNSUPPORTED);
    d = r.d;
    clattn_tensor m = clattn_tensor_bhsd(pb, F32, 1, 2, 8, 8);
    assert_int_equal(clattn_dropout_mask(ctx, &d, &m, 0, NULL, NULL), CLATTN_INVALID_ARGUMENT); /* p 0 */
    assert_int_equal(clattn_dropout_mask(ctx, NULL, &m, 0, NULL, NULL), CLATTN_INVALID_ARGUMENT);
    /* reserved fields must be zero here too: a later option there may change the draw */
    d.dropout_p = 0.5f;
    d.reserved[10] = 1;
    float mask_before[2 * 8 * 8], mask_after[2 * 8 * 8];
    tu_read(ctx, pb, sizeof mask_before, mask_before);
    assert_int_equal(clattn_dropout_mask(ctx, &d, &m, 0, NULL, NULL), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "reserved[10]"));
    tu_read(ctx, pb, sizeof mask_after, mask_after);
    assert_memory_equal(mask_before, mask_after, sizeof mask_before);
    d.reserved[10] = 0;
    assert_int_equal(clattn_dropout_mask(ctx, &d, &m, 0, NULL, NULL), CLATTN_SUCCESS);
    d = r.d;
    assert_int_equal(clattn_attention_backward(NULL, &d, &r.q, &r.k, &r.v, &r.o, &r.go, &r.lse, &gr.dq, &gr.dk,
                                               &gr.dv, NULL, 0, NULL, NULL),
                     CLATTN_INVALID_ARGUMENT);
}

/* clattn_philox4x32_10 on the host: Random123's known answers (tests/kat_vectors, philox4x32 10). */
static void test_philox_host(void **state)
{
    (void)state;
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                       {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
    static const uint32_t key[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
    static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    for (int i = 0; i < 3; i++) {
        uint32_t out[4];
        clattn_philox4x32_10(ctr[i], key[i], out);
        assert_memory_equal(out, want[i], sizeof out);
    }
}

int main(void)
{
    tu_set_fixtures(NULL, tu_teardown);
    TU_ADD_TABLE("grad", run_case, cases);
    tu_add_test("repeat", "gqa_dv", test_repeat, &cases[3]);
    tu_add_test("repeat", "dropout_causal_offsets", test_repeat, &cases[18]);
    tu_add_test("dropout", "mask", test_dropout_mask, NULL);
    tu_add_test("fd", "softcap_alibi_sinks", test_finite_differences, NULL);
    tu_add_test("refuse", "backward", test_refusals, NULL);
    tu_add_test("philox", "host", test_philox_host, NULL);
    const int failed = tu_run_tests("backward");
    clattn_release(tu_ctx);
    return failed;
}
