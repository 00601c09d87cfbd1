/*
 * libFuzzer harness: clattn_attention_backward and clattn_dropout_mask with descriptors (the
 * scalar variants, sinks, ALiBi, mask_mod and dropout included), tensor views and wait lists built
 * from the input; see fuzz_common.h for what is checked after every call.
 *
 * First byte, mod 64:
 *   0..31  the backward after the forward: q, k, v, dout and the gradients are views from the
 *          input; out and the LSE are fresh buffers of the harness that clattn_attention fills
 *          first, from the same descriptor. An accepted backward's gradients are then compared
 *          with ref_attention_backward, and a backward the documented rules allow must be
 *          accepted (a wrong refusal is a violation too);
 *   32..59 the backward with out and lse views from the input as well: their content is
 *          arbitrary, so only the contract is checked (acceptance, messages, untouched bytes);
 *   60     the backward with a NULL context;
 *   61, 62 clattn_dropout_mask, compared with ref_dropout_z element by element; 63 with a NULL
 *          context.
 *
 * The backward's documented rules (include/clattn.h): desc->lse and desc->probabilities NULL;
 * score_mod, desc->kv and CLATTN_ALGORITHM_UNFUSED refused with CLATTN_UNSUPPORTED; dq, dk and dv
 * of their input's shape, each of the query's dtype or f32; dsinks only with desc->sinks, f32
 * [1][heads_q][1][1]; out of the query's dtype or f32, lse f32 [B][Hq][Sq][1]; no gradient
 * overlapping itself, another gradient, an input or kv_lengths.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "clattn_ref.h"
#include "testutil.h"

#define ALL_DTYPES 7u
#define BIT(d) (1u << (unsigned)(d))
#define GARBAGE_EVENT ((cl_event)(uintptr_t)1)

/* mask_mod, the one the tests use, and its reference: the query sees keys whose index differs from
 * its position by a multiple of 3 or by less than 4. */
static const char *const mask_mod_src =
    "int mask_mod(int b, int h, int q, int k) { int d = q - k; return d % 3 == 0 || (d < 4 && d > -4); }\n";
static int ref_mask_mod_fn(int b, int h, long long q, int k, void *user)
{
    (void)b, (void)h, (void)user;
    const long long d = q - k;
    return d % 3 == 0 || (d < 4 && d > -4);
}
static const char *const score_mod_src = "float score_mod(float s, int b, int h, int q, int k) { return s; }\n";

/* Storage rounding of a dtype (half an ulp of 1, relative) and test_backward.c's eps for it. */
static double storage_rtol(clattn_dtype dt)
{
    return dt == CLATTN_F16 ? 0x1p-11 : dt == CLATTN_BF16 ? 0x1p-8 : 0x1p-24;
}
static double storage_eps(clattn_dtype dt)
{
    return dt == CLATTN_F16 ? 0x1p-10 : dt == CLATTN_BF16 ? 0x1p-7 : 0.0;
}

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

static int64_t clip64(int64_t v)
{
    return v < 1 ? 1 : v > 64 ? 64 : v;
}

/* A fresh contiguous [b][h][s][d] buffer of the harness for out or the LSE: exactly the size of a
 * valid shape within the work cap, else of the shape clipped to 1..64 per dim. */
static void own_view(fz_state *s, fz_tensor *ft, const int64_t want[4], clattn_dtype dt)
{
    memset(ft, 0, sizeof *ft);
    ft->present = 1;
    ft->t.dtype = dt;
    int64_t c[4];
    uint64_t n = 1;
    int exact = 1;
    for (int i = 0; i < 4; ++i) {
        ft->t.shape[i] = want[i];
        if (want[i] < 1 || want[i] > (int64_t)FZ_MAX_BYTES)
            exact = 0;
        else if (exact && (n *= (uint64_t)want[i]) > FZ_MAX_BYTES / 4)
            exact = 0;
    }
    n = 1;
    for (int i = 0; i < 4; ++i)
        n *= (uint64_t)(c[i] = exact ? want[i] : clip64(want[i]));
    ft->t.stride[2] = c[3];
    ft->t.stride[1] = c[2] * c[3];
    ft->t.stride[0] = c[1] * c[2] * c[3];
    ft->buf = fz_new_buffer(s, (size_t)n * clattn_dtype_size(dt), 0);
    ft->t.buffer = ft->buf >= 0 ? s->buf[ft->buf].mem : NULL;
}

/* Byte range [lo, hi) of a valid view in its buffer, as the library judges overlaps. */
static void view_range(const fz_tensor *ft, uint64_t *lo, uint64_t *hi)
{
    const clattn_tensor *t = &ft->t;
    const uint64_t es = clattn_dtype_size(t->dtype);
    uint64_t last = (uint64_t)t->offset + (uint64_t)(t->shape[3] - 1);
    for (int i = 0; i < 3; ++i)
        last += (uint64_t)(t->shape[i] - 1) * (uint64_t)t->stride[i];
    *lo = (uint64_t)t->offset * es;
    *hi = (last + 1) * es;
}

static int ranges_meet(const fz_tensor *a, const fz_tensor *b)
{
    if (!a->present || !b->present || a->buf < 0 || a->buf != b->buf)
        return 0;
    uint64_t alo, ahi, blo, bhi;
    view_range(a, &alo, &ahi);
    view_range(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

/* clattn_tensor's rule for outputs: taken by increasing stride, each dimension of extent above 1
 * steps past everything the dimensions below it span. */
static int output_layout_ok(const clattn_tensor *t)
{
    int order[3] = {0, 1, 2};
    for (int i = 0; i < 3; ++i)
        for (int j = i + 1; j < 3; ++j)
            if (t->stride[order[j]] < t->stride[order[i]]) {
                const int x = order[i];
                order[i] = order[j];
                order[j] = x;
            }
    uint64_t span = (uint64_t)t->shape[3];
    for (int i = 0; i < 3; ++i) {
        const int d = order[i];
        if (t->shape[d] <= 1)
            continue;
        if ((uint64_t)t->stride[d] < span)
            return 0;
        span += (uint64_t)t->stride[d] * (uint64_t)(t->shape[d] - 1);
    }
    return 1;
}

/* A wait list the library takes (or refuses only because an event in it has failed). */
static int wait_ok(const fz_state *s)
{
    if (s->num_wait > 0 && s->waitp == NULL)
        return 0;
    for (cl_uint i = 0; i < s->num_wait; ++i)
        if (s->waitp[i] == NULL)
            return 0;
    return 1;
}

/* Reads buffer i back into its image: what it holds before the call under test. */
static void refresh_image(fz_state *s, int i)
{
    if (i < 0)
        return;
    const cl_int err = clEnqueueReadBuffer(clattn_queue(s->ctx), s->buf[i].mem, CL_TRUE, 0, s->buf[i].bytes,
                                           s->buf[i].img, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        fz_die("clEnqueueReadBuffer failed: %d", (int)err);
}

/* Everything one backward call has. */
typedef struct bwd {
    clattn_attention_desc d;
    const clattn_attention_desc *dp;
    int64_t wq[4], wk[4], wv[4], wo[4], wl[4], wm[4], ws[4], wa[4];
    fz_tensor q, k, v, out, dout, lse, dq, dk, dv, dsinks, mask, sinks, alibi;
    cl_mem kv;
} bwd;

/* ---- the gradients against the reference ---- */

/*
 * Bounds of the device's error on each gradient element, for the fuzz's inputs that the tests'
 * tolerance (relative to the largest |gradient|) cannot cover: huge scales, ALiBi at far
 * positions, broadcast K or Q whose gradients cancel to 0 exactly. The device recomputes
 * P = e^(x - lse) from its own f32 logit x and the forward's f32 LSE: with e the logit's error
 * (fz_logit_error's terms, plus the mask, ALiBi and softcap) and the LSE's, each P is off by a
 * factor within e^(±(e_x + e_lse)); its dot products round by (dims + 8)·2^-24 of their absolute
 * sums and its sums over keys or rows by (count + 16)·2^-24; D = dout·out reads the forward's out,
 * which is off by what fuzz_attention.c allows; the softcap's derivative 1 - tanh² is a few 2^-24
 * off in absolute terms. Every term goes in with its absolute value, so a
 * sum that cancels keeps the error of its terms. Returns 0 (no value check) when some P may be off
 * by more than e^1: f32 cannot recompute the softmax of such logits.
 */
static int error_bounds(const bwd *c, const ref_attn *a, const double *xq, const double *xk, const double *xv,
                        const double *xdo, const double *xm, const double *ro, const double *rl, double *mq, double *mk,
                        double *mv, double *ms)
{
    const clattn_attention_desc *d = &c->d;
    const int B = a->batch, Hq = a->heads_q, Hkv = a->heads_kv, Sq = a->seq_q, Skv = a->seq_kv, D = a->head_dim,
              Dv = a->head_dim_v, group = Hq / Hkv;
    const double scale = a->scale;
    const double eta_dot = (double)((D > Dv ? D : Dv) + 8) * 0x1p-24;
    const double eta_sum = (double)(Skv + group * Sq + 16) * 0x1p-24;
    const double cap_err = d->softcap > 0.0f ? 16.0 * (double)d->softcap * FLT_EPSILON : 0.0;
    const double vmax = max_abs(xv, (size_t)B * (size_t)Hkv * (size_t)Skv * (size_t)Dv);
    const size_t nrow = (size_t)B * (size_t)Hq * (size_t)Sq;
    double *erow = calloc(nrow, sizeof *erow), *frow = calloc(nrow, sizeof *frow);
    if (erow == NULL || frow == NULL)
        fz_die("out of host memory");
    /* Pass 0: each row's largest logit error (its LSE's error follows from it), the largest, and
     * the sum f of the row's weights P·z (at most 1 without dropout, up to 1/(1 - p) with). */
    double emax = 0.0;
    for (int pass = 0; pass < 2; ++pass) {
        const double out_rel = 1e-5 + storage_rtol(c->out.t.dtype);
        for (int b = 0; b < B; ++b) {
            int L = a->kv_len != NULL ? a->kv_len[b] : Skv;
            L = L < 0 ? 0 : L > Skv ? Skv : L;
            for (int h = 0; h < Hq; ++h)
                for (int i = 0; i < Sq; ++i) {
                    const size_t r = ((size_t)b * (size_t)Hq + (size_t)h) * (size_t)Sq + (size_t)i;
                    const double *qr = xq + r * (size_t)D, *dor = xdo + r * (size_t)Dv, *orow = ro + r * (size_t)Dv;
                    const long long p = (long long)i + L - Sq + (long long)(d->q_offset - d->k_offset);
                    /* The forward's out error, for D: its arithmetic's (fuzz_attention.c's absolute
                     * term, times f) and out's storage rounding. */
                    const double out_abs = (frow[r] > 1.0 ? frow[r] : 1.0) * vmax * (2e-5 + 2.0 * emax);
                    double Drow = 0.0, Dabs = 0.0, dD = 0.0;
                    for (int x = 0; x < Dv; ++x) {
                        Drow += dor[x] * orow[x];
                        Dabs += fabs(dor[x] * orow[x]);
                        dD += fabs(dor[x]) * (out_rel * fabs(orow[x]) + out_abs);
                    }
                    const double e_lse = 2.0 * erow[r] + 1e-5 + 5e-6 * (isfinite(rl[r]) ? fabs(rl[r]) : 0.0);
                    if (pass == 1 && erow[r] + e_lse > 1.0) {
                        free(erow);
                        free(frow);
                        return 0;
                    }
                    for (int j = 0; j < Skv; ++j) {
                        int visible;
                        double dxds;
                        const double x = ref_logit(a, xq, xk, b, h, i, j, &visible, &dxds);
                        if (!visible || x == -INFINITY)
                            continue;
                        const size_t kr = ((size_t)b * (size_t)Hkv + (size_t)(h / group)) * (size_t)Skv + (size_t)j;
                        const double *kr_ = xk + kr * (size_t)D, *vr = xv + kr * (size_t)Dv;
                        double dot = 0.0, sabs = 0.0;
                        for (int y = 0; y < D; ++y) {
                            dot += qr[y] * kr_[y];
                            sabs += fabs(qr[y] * kr_[y]);
                        }
                        const double m =
                            xm != NULL
                                ? fabs(
                                      xm[(((size_t)b * (size_t)Hq + (size_t)h) * (size_t)Sq + (size_t)i) * (size_t)Skv +
                                         (size_t)j])
                                : 0.0;
                        const double al = a->alibi != NULL ? fabs(a->alibi[(size_t)b * (size_t)Hq + (size_t)h]) *
                                                                 fabs((double)(p - j))
                                                           : 0.0;
                        const double e = (double)(D + 2) * 0x1p-24 * fabs(scale) * sabs +
                                         0x1p-22 * (fabs(scale * dot) + m + al + fabs(x)) + cap_err;
                        const double P = exp(x - rl[r]);
                        const double z = ref_dropout_z(a->dropout_seed, a->dropout_offset, a->dropout_p, b, Hq, h,
                                                       p + a->k_offset, (long long)j + a->k_offset);
                        if (pass == 0) {
                            erow[r] = e > erow[r] ? e : erow[r];
                            emax = e > emax ? e : emax;
                            frow[r] += P * z;
                            continue;
                        }
                        const double eps = expm1(e + e_lse) + 4e-6;
                        double dP = 0.0, dPabs = 0.0;
                        for (int y = 0; y < Dv; ++y) {
                            dP += dor[y] * vr[y];
                            dPabs += fabs(dor[y] * vr[y]);
                        }
                        dP *= z;
                        dPabs *= z;
                        const double g = fabs(dxds);
                        const double dS = fabs(P * (dP - Drow) * dxds);
                        /* The softcap's 1 - u², u the device's capped logit over c: a few 2^-24
                         * absolute (it cancels where tanh saturates), and the logit's error. */
                        const double dg = d->softcap > 0.0f ? 0x1p-20 + 2.0 * g * e / (double)d->softcap : 0.0;
                        const double dSerr = g * (eps * P * fabs(dP - Drow) + P * (eta_dot * (dPabs + Dabs) + dD)) +
                                             dg * P * (dPabs + Dabs);
                        for (int y = 0; y < D; ++y) {
                            mq[r * (size_t)D + (size_t)y] += fabs(scale) * (dSerr + eta_sum * dS) * fabs(kr_[y]);
                            mk[kr * (size_t)D + (size_t)y] += fabs(scale) * (dSerr + eta_sum * dS) * fabs(qr[y]);
                        }
                        for (int y = 0; y < Dv; ++y)
                            mv[kr * (size_t)Dv + (size_t)y] += (eps + eta_sum) * P * z * fabs(dor[y]);
                    }
                    if (pass == 1 && a->sinks != NULL && ms != NULL && isfinite(rl[r]) && a->sinks[h] > -INFINITY) {
                        const double es = exp(a->sinks[h] - rl[r]);
                        ms[h] += es * ((expm1(e_lse) + 4e-6 + eta_sum) * fabs(Drow) + dD + eta_dot * Dabs);
                    }
                }
        }
    }
    free(erow);
    free(frow);
    return 1;
}

static void check_gradients(const fz_state *s, const bwd *c, unsigned char **imgs)
{
    const clattn_attention_desc *d = &c->d;
    const int64_t dvv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    double *xq = fz_gather(s, &c->q, NULL, c->wq, 0), *xk = fz_gather(s, &c->k, NULL, c->wk, 0),
           *xv = fz_gather(s, &c->v, NULL, c->wv, 0), *xdo = fz_gather(s, &c->dout, NULL, c->wo, 0),
           *xm = c->mask.present ? fz_gather(s, &c->mask, NULL, c->wm, 0) : NULL,
           *xs = c->sinks.present ? fz_gather(s, &c->sinks, NULL, c->ws, 0) : NULL,
           *xa = c->alibi.present ? fz_gather(s, &c->alibi, NULL, c->wa, 0) : NULL;
    int *kvl = c->kv != NULL ? fz_kvlen_values(s, c->kv, imgs, d->batch, 0) : NULL;
    /* The forward's out must be finite for D to be (a 16-bit out that overflowed with dropout's
     * 1/(1 - p) is fuzz_attention.c's to judge). */
    double *fo = fz_gather(s, &c->out, NULL, c->wo, 0);
    const size_t nrow = (size_t)(d->batch * d->heads_q * d->seq_q);
    const size_t nq = nrow * (size_t)d->head_dim, no = nrow * (size_t)dvv;
    const size_t nk = (size_t)(d->batch * d->heads_kv * d->seq_kv * d->head_dim),
                 nv = (size_t)(d->batch * d->heads_kv * d->seq_kv * dvv), ns = (size_t)d->heads_q;
    int finite = 1;
    for (size_t i = 0; i < no; ++i)
        finite &= isfinite(fo[i]);

    ref_attn a;
    fz_ref_attn(d, xm, kvl, &a);
    a.sinks = xs;
    a.alibi = xa;
    a.alibi_per_batch = 1;
    a.mask_mod = d->mask_mod != NULL ? ref_mask_mod_fn : NULL;

    double *ro = malloc(no * sizeof *ro), *rl = malloc(nrow * sizeof *rl), *wq = malloc(nq * sizeof *wq),
           *wk = malloc(nk * sizeof *wk), *wv = malloc(nv * sizeof *wv), *wds = calloc(ns, sizeof *wds),
           *mq = calloc(nq, sizeof *mq), *mk = calloc(nk, sizeof *mk), *mv = calloc(nv, sizeof *mv),
           *mds = calloc(ns, sizeof *mds);
    if (!ro || !rl || !wq || !wk || !wv || !wds || !mq || !mk || !mv || !mds)
        fz_die("out of host memory");
    ref_attention(&a, xq, xk, xv, ro, rl, NULL);
    ref_attention_backward(&a, xq, xk, xv, xdo, wq, wk, wv, xs != NULL ? wds : NULL);
    static int verbose = -1;
    if (verbose < 0) {
        const char *e = getenv("CLATTN_FUZZ_VERBOSE");
        verbose = e != NULL && strcmp(e, "1") == 0;
    }
    if (finite && error_bounds(c, &a, xq, xk, xv, xdo, xm, ro, rl, mq, mk, mv, mds)) {
        double *gq = fz_gather(s, &c->dq, imgs, c->wq, 1), *gk = fz_gather(s, &c->dk, imgs, c->wk, 1),
               *gv = fz_gather(s, &c->dv, imgs, c->wv, 1),
               *gs = c->dsinks.present ? fz_gather(s, &c->dsinks, imgs, c->ws, 1) : NULL;
        /* test_backward.c's tolerance, relative to the largest |gradient|, with the rounding of
         * 16-bit inputs, out and gradients; plus twice the bound above, element by element. */
        const double base = 2e-4 + 4.0 * (storage_eps(c->q.t.dtype) + storage_eps(c->out.t.dtype));
        for (size_t i = 0; i < nq; ++i)
            mq[i] *= 2.0;
        for (size_t i = 0; i < nk; ++i)
            mk[i] *= 2.0;
        for (size_t i = 0; i < nv; ++i)
            mv[i] *= 2.0;
        for (size_t i = 0; i < ns; ++i)
            mds[i] *= 2.0;
        const fz_tensor *g3[3] = {&c->dq, &c->dk, &c->dv};
        const double *got[3] = {gq, gk, gv}, *want[3] = {wq, wk, wv}, *bound[3] = {mq, mk, mv};
        const size_t n3[3] = {nq, nk, nv};
        const char *names[3] = {"dq", "dk", "dv"};
        for (int x = 0; x < 3; ++x) {
            const clattn_dtype gdt = g3[x]->t.dtype;
            const double e = base + 4.0 * storage_eps(gdt);
            fz_compare_stored(names[x], got[x], want[x], n3[x], e * (max_abs(want[x], n3[x]) + 1e-3), bound[x],
                              2.0 * storage_rtol(gdt), gdt);
        }
        if (gs != NULL)
            fz_compare_stored("dsinks", gs, wds, ns, base * (max_abs(wds, ns) + 1e-3), mds,
                              2.0 * storage_rtol(CLATTN_F32), CLATTN_F32);
        if (verbose) /* how tight the check was: the largest tolerance over the largest |gradient| */
            fprintf(stderr,
                    "clattn-fuzz: gradients compared (%zu + %zu + %zu + %zu values; largest tolerance / largest "
                    "|gradient|: dq %.2g, dk %.2g, dv %.2g)\n",
                    nq, nk, nv, gs != NULL ? ns : (size_t)0, max_abs(mq, nq) / (max_abs(wq, nq) + 1e-300),
                    max_abs(mk, nk) / (max_abs(wk, nk) + 1e-300), max_abs(mv, nv) / (max_abs(wv, nv) + 1e-300));
        free(gq);
        free(gk);
        free(gv);
        free(gs);
    } else if (verbose) {
        fprintf(stderr, "clattn-fuzz: gradients not compared (%s)\n",
                finite ? "logits too large for f32 to recompute P" : "the forward's out is not finite");
    }
    free(xq);
    free(xk);
    free(xv);
    free(xdo);
    free(xm);
    free(xs);
    free(xa);
    free(kvl);
    free(fo);
    free(ro);
    free(rl);
    free(wq);
    free(wk);
    free(wv);
    free(wds);
    free(mq);
    free(mk);
    free(mv);
    free(mds);
}

/* ---- clattn_attention_backward ---- */

/* mode 0: out and lse from the input; 1: from the forward; 2: a NULL context. */
static void fuzz_backward(fz_state *s, int mode)
{
    bwd c_;
    bwd *c = &c_;
    memset(c, 0, sizeof *c);
    clattn_attention_desc *d = &c->d;
    fz_read_desc(s, d);
    const int64_t dvv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    const int64_t wq[4] = {d->batch, d->heads_q, d->seq_q, d->head_dim};
    const int64_t wk[4] = {d->batch, d->heads_kv, d->seq_kv, d->head_dim};
    const int64_t wv[4] = {d->batch, d->heads_kv, d->seq_kv, dvv};
    const int64_t wo[4] = {d->batch, d->heads_q, d->seq_q, dvv};
    const int64_t wl[4] = {d->batch, d->heads_q, d->seq_q, 1};
    const int64_t wm[4] = {d->batch, d->heads_q, d->seq_q, d->seq_kv};
    const int64_t ws[4] = {1, d->heads_q, 1, 1};
    const int64_t wa[4] = {d->batch, d->heads_q, 1, 1};
    memcpy(c->wq, wq, sizeof wq);
    memcpy(c->wk, wk, sizeof wk);
    memcpy(c->wv, wv, sizeof wv);
    memcpy(c->wo, wo, sizeof wo);
    memcpy(c->wl, wl, sizeof wl);
    memcpy(c->wm, wm, sizeof wm);
    memcpy(c->ws, ws, sizeof ws);
    memcpy(c->wa, wa, sizeof wa);
    const clattn_dtype dt = (clattn_dtype)(fz_u8(&s->in) % 3);
    /* Bit 0: out f32 (else the query's type); bits 1-3: dq, dk, dv f32. */
    const uint8_t types = fz_u8(&s->in);
    const clattn_dtype odt = (types & 1) ? CLATTN_F32 : dt;
    fz_read_tensor(s, &c->q, wq, dt);
    fz_read_tensor(s, &c->k, wk, dt);
    fz_read_tensor(s, &c->v, wv, dt);
    const int trained = mode == 1;
    if (trained) {
        own_view(s, &c->out, wo, odt);
        own_view(s, &c->lse, wl, CLATTN_F32);
    } else {
        fz_read_tensor(s, &c->out, wo, odt);
        fz_read_tensor(s, &c->lse, wl, CLATTN_F32);
    }
    fz_read_tensor(s, &c->dout, wo, dt);
    fz_read_tensor(s, &c->dq, wq, (types & 2) ? CLATTN_F32 : dt);
    fz_read_tensor(s, &c->dk, wk, (types & 4) ? CLATTN_F32 : dt);
    fz_read_tensor(s, &c->dv, wv, (types & 8) ? CLATTN_F32 : dt);
    /* mask; ALiBi; sinks and dsinks: 0-1 both, 2 sinks only, 3 dsinks only (refused), else none. */
    const uint8_t opt = fz_u8(&s->in);
    if (opt % 4 == 0)
        fz_read_tensor(s, &c->mask, wm, (opt & 4) ? CLATTN_F16 : CLATTN_F32);
    if ((opt >> 3) % 4 == 0)
        fz_read_tensor(s, &c->alibi, wa, CLATTN_F32);
    const int sk = opt >> 5;
    if (sk <= 2)
        fz_read_tensor(s, &c->sinks, ws, CLATTN_F32);
    if (sk <= 1 || sk == 3)
        fz_read_tensor(s, &c->dsinks, ws, CLATTN_F32);
    c->kv = fz_read_kvlen(s, d->batch);
    d->mask = fz_ptr(&c->mask);
    d->sinks = fz_ptr(&c->sinks);
    d->alibi_slopes = fz_ptr(&c->alibi);
    d->kv_lengths = c->kv;
    /* What the backward refuses in the descriptor, applied after the forward (mode 1); mask_mod,
     * which it takes, to both. */
    const uint8_t misuse = fz_u8(&s->in);
    if (misuse >= 238 && misuse < 250)
        d->mask_mod = mask_mod_src;
    fz_read_wait(s);
    if (fz_desc_work(d) > FZ_WORK_CAP)
        fz_validate_only(s);
    c->dp = fz_u8(&s->in) == 255 ? NULL : d;
    fz_read_variants(s, d);

    if (mode == 2) {
        cl_event done = GARBAGE_EVENT;
        const clattn_status st =
            clattn_attention_backward(NULL, c->dp, fz_ptr(&c->q), fz_ptr(&c->k), fz_ptr(&c->v), fz_ptr(&c->out),
                                      fz_ptr(&c->dout), fz_ptr(&c->lse), fz_ptr(&c->dq), fz_ptr(&c->dk), fz_ptr(&c->dv),
                                      fz_ptr(&c->dsinks), s->num_wait, s->waitp, &done);
        const char *msg = clattn_last_error(NULL);
        if (st != CLATTN_INVALID_ARGUMENT || done != NULL || msg == NULL || strstr(msg, "ctx") == NULL)
            fz_die("clattn_attention_backward(NULL, ...) gave %s, done %p, message \"%s\"", clattn_status_name(st),
                   (void *)done, msg ? msg : "(null)");
        return;
    }

    /* Mode 1: the forward, with the harness's out and LSE, on the same descriptor. */
    int fwd_ok = 0;
    if (trained && !s->validate_only && c->dp != NULL && c->out.buf >= 0 && c->lse.buf >= 0) {
        clattn_attention_desc fd = *d;
        fd.lse = &c->lse.t;
        const clattn_status fs =
            clattn_attention(s->ctx, &fd, fz_ptr(&c->q), fz_ptr(&c->k), fz_ptr(&c->v), &c->out.t, 0, NULL, NULL);
        if (fs == CLATTN_SUCCESS) {
            /* The forward wrote out and the LSE only; they are what the backward's call finds. */
            fz_marks om;
            fz_marks_init(&om, s);
            if (!fz_mark(&om, s, &c->out) || !fz_mark(&om, s, &c->lse))
                fz_die("a forward within the work cap has an output too big to mark");
            unsigned char **imgs = calloc(FZ_MAX_BUFS, sizeof *imgs);
            if (imgs == NULL)
                fz_die("out of host memory");
            fz_read_all(s, imgs);
            fz_check_untouched(s, imgs, &om, "after the forward, outside out and lse");
            fz_free_images(s, imgs);
            fz_marks_free(&om);
            refresh_image(s, c->out.buf);
            refresh_image(s, c->lse.buf);
            fwd_ok = 1;
        } else if (fs != CLATTN_INVALID_ARGUMENT && fs != CLATTN_UNSUPPORTED) {
            fz_die("the forward failed with %s (%s)", clattn_status_name(fs), clattn_last_error(s->ctx));
        }
    }
    static const clattn_kv_layout zero_kv; /* any desc->kv is refused */
    if (misuse >= 208 && misuse < 214)
        d->lse = &c->lse.t;
    else if (misuse >= 214 && misuse < 220)
        d->probabilities = &c->lse.t;
    else if (misuse >= 220 && misuse < 226)
        d->score_mod = score_mod_src;
    else if (misuse >= 226 && misuse < 232)
        d->kv = &zero_kv;
    else if (misuse >= 232 && misuse < 238)
        d->algorithm = CLATTN_ALGORITHM_UNFUSED;

    cl_event done = GARBAGE_EVENT;
    const clattn_status st = clattn_attention_backward(
        s->ctx, c->dp, fz_ptr(&c->q), fz_ptr(&c->k), fz_ptr(&c->v), fz_ptr(&c->out), fz_ptr(&c->dout), fz_ptr(&c->lse),
        fz_ptr(&c->dq), fz_ptr(&c->dk), fz_ptr(&c->dv), fz_ptr(&c->dsinks), s->num_wait, s->waitp, &done);
    const char *msg = clattn_last_error(s->ctx);
    /* Every check of the backward comes before its wait list: a failed event there means that
     * everything else was accepted. */
    const int accepted = st == CLATTN_SUCCESS || (st == CLATTN_OPENCL_ERROR && strstr(msg, "has failed") != NULL);
    /* (q's dtype may be anything: no shift by it unless it is one of the three) */
    const unsigned same = (unsigned)c->q.t.dtype < 3u ? BIT(c->q.t.dtype) : 0u, grad = same | BIT(CLATTN_F32);
    const fz_tensor *ins[9] = {&c->q, &c->k, &c->v, &c->out, &c->dout, &c->lse, &c->mask, &c->sinks, &c->alibi};
    const fz_tensor *outs_t[4] = {&c->dq, &c->dk, &c->dv, &c->dsinks};
    const int kb = c->kv != NULL ? fz_buf_index(s, c->kv) : -1;

    fz_marks all, outs;
    fz_marks_init(&all, s);
    fz_marks_init(&outs, s);
    if (accepted) {
        if (c->dp == NULL || !fz_desc_valid(d, 1))
            fz_die("accepted an invalid descriptor (%s)", c->dp == NULL ? "NULL" : "fields");
        if (d->lse != NULL || d->probabilities != NULL)
            fz_die("accepted desc->lse or desc->probabilities");
        if (d->algorithm == CLATTN_ALGORITHM_UNFUSED || d->score_mod != NULL || d->kv != NULL)
            fz_die("accepted UNFUSED, score_mod or desc->kv (documented as UNSUPPORTED)");
        if (!fz_view_valid(s, &c->q, wq, 0, ALL_DTYPES) || !fz_view_valid(s, &c->k, wk, 0, same) ||
            !fz_view_valid(s, &c->v, wv, 0, same) || !fz_view_valid(s, &c->out, wo, 0, grad) ||
            !fz_view_valid(s, &c->dout, wo, 0, ALL_DTYPES) || !fz_view_valid(s, &c->lse, wl, 0, BIT(CLATTN_F32)) ||
            (c->mask.present && !fz_view_valid(s, &c->mask, wm, 1, BIT(CLATTN_F32) | BIT(CLATTN_F16))) ||
            (c->sinks.present && !fz_view_valid(s, &c->sinks, ws, 0, BIT(CLATTN_F32))) ||
            (c->alibi.present && !fz_view_valid(s, &c->alibi, wa, 1, BIT(CLATTN_F32))))
            fz_die("accepted an invalid input view");
        if (!fz_view_valid(s, &c->dq, wq, 0, grad) || !fz_view_valid(s, &c->dk, wk, 0, grad) ||
            !fz_view_valid(s, &c->dv, wv, 0, grad))
            fz_die("accepted an invalid gradient view");
        if (c->dsinks.present && (!c->sinks.present || !fz_view_valid(s, &c->dsinks, ws, 0, BIT(CLATTN_F32))))
            fz_die("accepted dsinks %s", c->sinks.present ? "with an invalid view" : "without desc->sinks");
        if (c->kv != NULL && (kb < 0 || s->buf[kb].bytes < 4 * (size_t)d->batch))
            fz_die("accepted kv_lengths without batch int32 values");
        int marked = 1;
        for (int i = 0; i < 9; ++i)
            marked = marked && (!ins[i]->present || fz_mark(&all, s, ins[i]));
        for (int i = 0; i < 4; ++i)
            marked = marked && (!outs_t[i]->present || fz_mark(&all, s, outs_t[i]));
        if (c->kv != NULL)
            fz_mark_range(&all, s, c->kv, 0, 4 * (size_t)d->batch);
        for (int i = 0; i < 4 && marked; ++i)
            if (outs_t[i]->present && fz_marked_twice(&all, s, outs_t[i]))
                fz_die("accepted a gradient (argument %d of dq, dk, dv, dsinks) that overlaps itself, another "
                       "gradient, an input or kv_lengths",
                       i);
        marked = 1;
        for (int i = 0; i < 4; ++i)
            marked = marked && (!outs_t[i]->present || fz_mark(&outs, s, outs_t[i]));
        if (!marked && st == CLATTN_SUCCESS)
            fz_die("a call within the work cap has an output too big to mark");
    } else if (fwd_ok) {
        /* The forward took this descriptor and these q, k, v (and mask, sinks, ALiBi, key
         * lengths); out and lse are the harness's. What else the documented rules ask: */
        int valid = c->dp != NULL && d->lse == NULL && d->probabilities == NULL &&
                    d->algorithm != CLATTN_ALGORITHM_UNFUSED && d->score_mod == NULL && d->kv == NULL &&
                    fz_view_valid(s, &c->dout, wo, 0, ALL_DTYPES) && wait_ok(s);
        for (int i = 0; i < 3 && valid; ++i)
            valid = fz_view_valid(s, outs_t[i],
                                  i == 0   ? wq
                                  : i == 1 ? wk
                                           : wv,
                                  0, grad) &&
                    output_layout_ok(&outs_t[i]->t);
        if (valid && c->dsinks.present)
            valid = c->sinks.present && fz_view_valid(s, &c->dsinks, ws, 0, BIT(CLATTN_F32)) &&
                    output_layout_ok(&c->dsinks.t);
        for (int i = 0; i < 4 && valid; ++i) {
            if (!outs_t[i]->present)
                continue;
            for (int j = 0; j < 9; ++j)
                valid = valid && !ranges_meet(outs_t[i], ins[j]);
            for (int j = 0; j < 4; ++j)
                valid = valid && (j == i || !ranges_meet(outs_t[i], outs_t[j]));
            if (valid && kb >= 0 && outs_t[i]->buf == kb) {
                uint64_t lo, hi;
                view_range(outs_t[i], &lo, &hi);
                valid = lo >= 4 * (uint64_t)d->batch;
            }
        }
        if (valid)
            fz_die("refused a backward the documented rules allow, after its forward succeeded: %s: %s",
                   clattn_status_name(st), msg);
    }
    unsigned char **imgs = fz_after_call(s, st, done, st == CLATTN_SUCCESS ? &outs : NULL);
    if (imgs != NULL) {
        if (fwd_ok)
            check_gradients(s, c, imgs);
        fz_free_images(s, imgs);
    }
    fz_marks_free(&all);
    fz_marks_free(&outs);
}

/* ---- clattn_dropout_mask ---- */

static void fuzz_dropout_mask(fz_state *s, int null_ctx)
{
    clattn_attention_desc d;
    fz_read_desc(s, &d);
    const int64_t wm[4] = {d.batch, d.heads_q, d.seq_q, d.seq_kv};
    fz_tensor m;
    fz_read_tensor(s, &m, wm, (clattn_dtype)(fz_u8(&s->in) % 3));
    const cl_mem kv = fz_read_kvlen(s, d.batch);
    d.kv_lengths = kv;
    fz_read_wait(s);
    uint64_t n = 1; /* elements, saturating past the cap */
    for (int i = 0; i < 4 && n <= FZ_WORK_CAP; ++i)
        n = wm[i] < 1 || wm[i] > (int64_t)FZ_WORK_CAP ? FZ_WORK_CAP + 1 : n * (uint64_t)wm[i];
    if (n > FZ_WORK_CAP)
        fz_validate_only(s);
    const clattn_attention_desc *dp = fz_u8(&s->in) == 255 ? NULL : &d;
    fz_read_variants(s, &d);

    cl_event done = GARBAGE_EVENT;
    if (null_ctx) {
        const clattn_status st = clattn_dropout_mask(NULL, dp, fz_ptr(&m), s->num_wait, s->waitp, &done);
        const char *msg = clattn_last_error(NULL);
        if (st != CLATTN_INVALID_ARGUMENT || done != NULL || msg == NULL || strstr(msg, "ctx") == NULL)
            fz_die("clattn_dropout_mask(NULL, ...) gave %s, done %p, message \"%s\"", clattn_status_name(st),
                   (void *)done, msg ? msg : "(null)");
        return;
    }
    const clattn_status st = clattn_dropout_mask(s->ctx, dp, fz_ptr(&m), s->num_wait, s->waitp, &done);
    const char *msg = clattn_last_error(s->ctx);
    const int accepted = st == CLATTN_SUCCESS || (st == CLATTN_OPENCL_ERROR && strstr(msg, "has failed") != NULL);
    fz_marks all, outs;
    fz_marks_init(&all, s);
    fz_marks_init(&outs, s);
    if (accepted) {
        /* The mask reads and checks batch, heads_q, seq_q, seq_kv, kv_lengths, the offsets and
         * the dropout fields (include/clattn.h); the others play no part. */
        const int64_t big = d.seq_q > d.seq_kv ? d.seq_q : d.seq_kv;
        const int shape_ok = d.batch >= 1 && d.batch <= 0x7fffffffLL && d.heads_q >= 1 &&
                             d.heads_q <= 0x7fffffffLL && d.seq_q >= 1 && d.seq_q <= CLATTN_MAX_SEQ &&
                             d.seq_kv >= 1 && d.seq_kv <= CLATTN_MAX_SEQ &&
                             (uint64_t)d.batch * (uint64_t)d.heads_q <= 0x7fffffffu;
        const int offsets_ok = d.q_offset >= -CLATTN_MAX_SEQ && d.q_offset <= CLATTN_MAX_SEQ &&
                               d.k_offset >= -CLATTN_MAX_SEQ && d.k_offset <= CLATTN_MAX_SEQ &&
                               llabs(d.q_offset - d.k_offset) <= CLATTN_MAX_SEQ - big;
        if (dp == NULL || !shape_ok || !offsets_ok || !fz_dropout_valid(&d) || !(d.dropout_p > 0.0f))
            fz_die("accepted an invalid descriptor (%s, dropout_p %g)", dp == NULL ? "NULL" : "fields",
                   (double)d.dropout_p);
        if (!fz_view_valid(s, &m, wm, 0, ALL_DTYPES))
            fz_die("accepted an invalid mask view");
        const int kb = kv != NULL ? fz_buf_index(s, kv) : -1;
        if (kv != NULL && (kb < 0 || s->buf[kb].bytes < 4 * (size_t)d.batch))
            fz_die("accepted kv_lengths without batch int32 values");
        const int marked = fz_mark(&all, s, &m);
        if (kv != NULL)
            fz_mark_range(&all, s, kv, 0, 4 * (size_t)d.batch);
        if (marked && fz_marked_twice(&all, s, &m))
            fz_die("accepted a mask view that overlaps itself or kv_lengths");
        if (!fz_mark(&outs, s, &m) && st == CLATTN_SUCCESS)
            fz_die("a call within the work cap has an output too big to mark");
    }
    unsigned char **imgs = fz_after_call(s, st, done, st == CLATTN_SUCCESS ? &outs : NULL);
    if (imgs != NULL) {
        int *kvl = kv != NULL ? fz_kvlen_values(s, kv, imgs, d.batch, 0) : NULL;
        const double p = (double)d.dropout_p;
        for (int64_t b = 0; b < d.batch; ++b) {
            int64_t L = kvl != NULL ? kvl[b] : d.seq_kv;
            L = L < 0 ? 0 : L > d.seq_kv ? d.seq_kv : L;
            for (int64_t h = 0; h < d.heads_q; ++h)
                for (int64_t i = 0; i < d.seq_q; ++i)
                    for (int64_t j = 0; j < d.seq_kv; ++j) {
                        /* r = p + k_offset = i + L - seq_q + q_offset, c = j + k_offset, both mod 2^32. */
                        const long long r = (long long)((uint64_t)(i + L - d.seq_q) + (uint64_t)d.q_offset);
                        const long long col = (long long)((uint64_t)j + (uint64_t)d.k_offset);
                        const double z =
                            ref_dropout_z(d.dropout_seed, d.dropout_offset, p, (int)b, (int)d.heads_q, (int)h, r, col);
                        uint32_t tmp;
                        tu_store(m.t.dtype, &tmp, 0, z);
                        const double want = tu_load(m.t.dtype, &tmp, 0);
                        const double got = fz_get(s, &m, imgs, b, h, i, j);
                        if (got != want)
                            fz_die("dropout mask (%lld, %lld, %lld, %lld), %s, p %g, seed 0x%llx, offset %u: %.9g, the "
                                   "reference %.9g",
                                   (long long)b, (long long)h, (long long)i, (long long)j, clattn_dtype_name(m.t.dtype),
                                   p, (unsigned long long)d.dropout_seed, (unsigned)d.dropout_offset, got, want);
                    }
        }
        free(kvl);
        fz_free_images(s, imgs);
    }
    fz_marks_free(&all);
    fz_marks_free(&outs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_state s;
    fz_begin(&s, data, size);
    const uint8_t which = fz_u8(&s.in) % 64;
    if (which < 32)
        fuzz_backward(&s, 1);
    else if (which < 60)
        fuzz_backward(&s, 0);
    else if (which == 60)
        fuzz_backward(&s, 2);
    else
        fuzz_dropout_mask(&s, which == 63);
    fz_end(&s);
    return 0;
}
