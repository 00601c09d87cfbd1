/*
 * libFuzzer harness: clattn_attention (and clattn_attention_host) with descriptors, tensor views
 * and wait lists built from the input; see fuzz_common.h for what is checked.
 *
 * First byte: 0..61 clattn_attention, 62 clattn_attention with a NULL context, 63 the host form.
 * Descriptors take dropout too (fz_read_variants): an accepted call with dropout_p > 0 is compared
 * with the reference's dropout, which draws the same multipliers.
 */
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

static double storage_atol(clattn_dtype dt)
{
    return dt == CLATTN_F16 ? 0x1p-10 : dt == CLATTN_BF16 ? 0x1p-7 : 0.0;
}

static double storage_rtol(clattn_dtype dt)
{
    return dt == CLATTN_F16 ? 0x1p-11 : dt == CLATTN_BF16 ? 0x1p-8 : 0.0;
}

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; ++i)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* The reference of a valid problem and the comparison with what the device wrote. */
static void compare(const clattn_attention_desc *d, const double *xq, const double *xk, const double *xv,
                    const double *xm, const int *kvl, const double *got_out, clattn_dtype out_dt,
                    const double *got_lse, const double *got_probs, clattn_dtype probs_dt)
{
    const int64_t dv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    const size_t nrow = (size_t)(d->batch * d->heads_q * d->seq_q);
    ref_attn a;
    fz_ref_attn(d, xm, kvl, &a);
    double *out = malloc(nrow * (size_t)dv * sizeof *out), *lse = malloc(nrow * sizeof *lse),
           *probs = malloc(nrow * (size_t)d->seq_kv * sizeof *probs);
    if (!out || !lse || !probs)
        fz_die("out of host memory");
    ref_attention(&a, xq, xk, xv, out, lse, probs);
    const double e = fz_logit_error(d, a.scale, xq, xk, xm);
    const double vmax = max_abs(xv, (size_t)(d->batch * d->heads_kv * d->seq_kv * dv));
    const double g = d->seq_kv > 4096 ? sqrt((double)d->seq_kv / 4096.0) : 1.0;
    /* test_attention.c's tolerances, scaled by max|V| and widened by the logit error (see
     * tests/test_robust.c). */
    const double atol = vmax * (2e-5 + storage_atol(out_dt)) + 2.0 * e * vmax + 1e-30;
    const double rtol = fmax(1e-4 * g, storage_rtol(out_dt));
    double *atol_rows = NULL;
    if (a.dropout_p > 0.0) {
        /* With dropout a row's weights sum to f = Σ_j P_ij·z_ij instead of at most 1: its error
         * scales by f (up to 1/(1 - p), which is 2^24 for the largest p below 1). */
        atol_rows = malloc(nrow * (size_t)dv * sizeof *atol_rows);
        if (atol_rows == NULL)
            fz_die("out of host memory");
        for (int64_t b = 0; b < d->batch; ++b) {
            int64_t L = kvl != NULL ? kvl[b] : d->seq_kv;
            L = L < 0 ? 0 : L > d->seq_kv ? d->seq_kv : L;
            for (int64_t h = 0; h < d->heads_q; ++h)
                for (int64_t i = 0; i < d->seq_q; ++i) {
                    const size_t r = (size_t)((b * d->heads_q + h) * d->seq_q + i);
                    const long long row = (long long)(i + L - d->seq_q + d->q_offset);
                    double f = 0.0;
                    for (int64_t j = 0; j < d->seq_kv; ++j)
                        f += probs[r * (size_t)d->seq_kv + (size_t)j] *
                             ref_dropout_z(a.dropout_seed, a.dropout_offset, a.dropout_p, (int)b, (int)d->heads_q,
                                           (int)h, row, (long long)(j + d->k_offset));
                    for (int64_t x = 0; x < dv; ++x)
                        atol_rows[r * (size_t)dv + (size_t)x] = (f > 1.0 ? f - 1.0 : 0.0) * (atol - 1e-30);
                }
        }
    }
    fz_compare_stored("out", got_out, out, nrow * (size_t)dv, atol, atol_rows, rtol, out_dt);
    free(atol_rows);
    for (size_t r = 0; r < nrow; ++r)
        if (lse[r] == -INFINITY)
            for (int64_t j = 0; j < dv; ++j)
                if (got_out[r * (size_t)dv + (size_t)j] != 0.0)
                    fz_die("row %zu has no visible key but out holds %.9g, not 0", r,
                           got_out[r * (size_t)dv + (size_t)j]);
    if (got_lse != NULL)
        fz_compare("lse", got_lse, lse, nrow, 1e-5 * g + 2.0 * e, 4e-6);
    if (got_probs != NULL)
        fz_compare("probabilities", got_probs, probs, nrow * (size_t)d->seq_kv, 1e-6 + 2.0 * e,
                   2e-5 * g + 2.0 * storage_rtol(probs_dt));
    free(out);
    free(lse);
    free(probs);
}

static void fuzz_attention(fz_state *s, int null_ctx)
{
    clattn_attention_desc d;
    fz_read_desc(s, &d);
    const int64_t dv = d.head_dim_v ? d.head_dim_v : d.head_dim;
    const int64_t wq[4] = {d.batch, d.heads_q, d.seq_q, d.head_dim};
    const int64_t wk[4] = {d.batch, d.heads_kv, d.seq_kv, d.head_dim};
    const int64_t wv[4] = {d.batch, d.heads_kv, d.seq_kv, dv};
    const int64_t wo[4] = {d.batch, d.heads_q, d.seq_q, dv};
    const int64_t wm[4] = {d.batch, d.heads_q, d.seq_q, d.seq_kv};
    const int64_t wl[4] = {d.batch, d.heads_q, d.seq_q, 1};
    const clattn_dtype dt = (clattn_dtype)(fz_u8(&s->in) % 3);
    fz_tensor q, k, v, out, mask, lse, probs;
    fz_read_tensor(s, &q, wq, dt);
    fz_read_tensor(s, &k, wk, dt);
    fz_read_tensor(s, &v, wv, dt);
    fz_read_tensor(s, &out, wo, dt);
    const uint8_t opt = fz_u8(&s->in);
    memset(&mask, 0, sizeof mask);
    memset(&lse, 0, sizeof lse);
    memset(&probs, 0, sizeof probs);
    if (opt % 4 == 0)
        fz_read_tensor(s, &mask, wm, (opt & 4) ? CLATTN_F16 : CLATTN_F32);
    if ((opt >> 3) % 3 == 0)
        fz_read_tensor(s, &lse, wl, CLATTN_F32);
    if ((opt >> 5) == 0)
        fz_read_tensor(s, &probs, wm, (clattn_dtype)(fz_u8(&s->in) % 3));
    const cl_mem kv = fz_read_kvlen(s, d.batch);
    d.mask = fz_ptr(&mask);
    d.lse = fz_ptr(&lse);
    d.probabilities = fz_ptr(&probs);
    d.kv_lengths = kv;
    fz_read_wait(s);
    if (fz_desc_work(&d) > FZ_WORK_CAP)
        fz_validate_only(s);
    const clattn_attention_desc *dp = fz_u8(&s->in) == 255 ? NULL : &d;
    fz_read_variants(s, &d);

    cl_event done = GARBAGE_EVENT;
    if (null_ctx) {
        const clattn_status st = clattn_attention(NULL, dp, fz_ptr(&q), fz_ptr(&k), fz_ptr(&v), fz_ptr(&out),
                                                  s->num_wait, s->waitp, &done);
        const char *msg = clattn_last_error(NULL);
        if (st != CLATTN_INVALID_ARGUMENT || done != NULL || msg == NULL || strstr(msg, "ctx") == NULL)
            fz_die("clattn_attention(NULL, ...) gave %s, done %p, message \"%s\"", clattn_status_name(st),
                   (void *)done, msg ? msg : "(null)");
        return;
    }
    const clattn_status st = clattn_attention(s->ctx, dp, fz_ptr(&q), fz_ptr(&k), fz_ptr(&v), fz_ptr(&out),
                                              s->num_wait, s->waitp, &done);
    const char *msg = clattn_last_error(s->ctx);
    const int accepted = st == CLATTN_SUCCESS || (st == CLATTN_OPENCL_ERROR && strstr(msg, "has failed") != NULL);

    fz_marks all, outs;
    fz_marks_init(&all, s);
    fz_marks_init(&outs, s);
    if (accepted) {
        if (dp == NULL || !fz_desc_valid(&d, 1))
            fz_die("accepted an invalid descriptor (%s)", dp == NULL ? "NULL" : "fields");
        const unsigned same = BIT(q.t.dtype);
        if (!fz_view_valid(s, &q, wq, 0, ALL_DTYPES) || !fz_view_valid(s, &k, wk, 0, same) ||
            !fz_view_valid(s, &v, wv, 0, same) || !fz_view_valid(s, &out, wo, 0, same) ||
            (mask.present && !fz_view_valid(s, &mask, wm, 1, BIT(CLATTN_F32) | BIT(CLATTN_F16))) ||
            (lse.present && !fz_view_valid(s, &lse, wl, 0, BIT(CLATTN_F32))) ||
            (probs.present && !fz_view_valid(s, &probs, wm, 0, ALL_DTYPES)))
            fz_die("accepted an invalid tensor view");
        const int kb = kv != NULL ? fz_buf_index(s, kv) : -1;
        if (kv != NULL && (kb < 0 || s->buf[kb].bytes < 4 * (size_t)d.batch))
            fz_die("accepted kv_lengths without batch int32 values");
        if (st == CLATTN_SUCCESS && probs.present && d.algorithm == CLATTN_ALGORITHM_FUSED)
            fz_die("computed probabilities on the fused path");
        if (st == CLATTN_SUCCESS && !fz_dropout_path_ok(&d))
            fz_die("ran dropout_p %g on the unfused path (algorithm %d, probabilities %s)", (double)d.dropout_p,
                   (int)d.algorithm, probs.present ? "asked for" : "not asked for");
        int marked = fz_mark(&all, s, &q) && fz_mark(&all, s, &k) && fz_mark(&all, s, &v) && fz_mark(&all, s, &out) &&
                     (!mask.present || fz_mark(&all, s, &mask)) && (!lse.present || fz_mark(&all, s, &lse)) &&
                     (!probs.present || fz_mark(&all, s, &probs));
        if (kv != NULL)
            fz_mark_range(&all, s, kv, 0, 4 * (size_t)d.batch);
        if (marked && (fz_marked_twice(&all, s, &out) || (lse.present && fz_marked_twice(&all, s, &lse)) ||
                       (probs.present && fz_marked_twice(&all, s, &probs))))
            fz_die("accepted an output that overlaps itself or another tensor");
        marked = fz_mark(&outs, s, &out) && (!lse.present || fz_mark(&outs, s, &lse)) &&
                 (!probs.present || fz_mark(&outs, s, &probs));
        if (!marked && st == CLATTN_SUCCESS)
            fz_die("a call within the work cap has an output too big to mark");
    }
    unsigned char **imgs = fz_after_call(s, st, done, st == CLATTN_SUCCESS ? &outs : NULL);
    if (imgs != NULL) {
        double *xq = fz_gather(s, &q, NULL, wq, 0), *xk = fz_gather(s, &k, NULL, wk, 0),
               *xv = fz_gather(s, &v, NULL, wv, 0), *xm = mask.present ? fz_gather(s, &mask, NULL, wm, 0) : NULL;
        int *kvl = kv != NULL ? fz_kvlen_values(s, kv, imgs, d.batch, 0) : NULL;
        double *go = fz_gather(s, &out, imgs, wo, 1), *gl = lse.present ? fz_gather(s, &lse, imgs, wl, 1) : NULL,
               *gp = probs.present ? fz_gather(s, &probs, imgs, wm, 1) : NULL;
        compare(&d, xq, xk, xv, xm, kvl, go, out.t.dtype, gl, gp, probs.t.dtype);
        free(xq);
        free(xk);
        free(xv);
        free(xm);
        free(kvl);
        free(go);
        free(gl);
        free(gp);
        fz_free_images(s, imgs);
    }
    fz_marks_free(&all);
    fz_marks_free(&outs);
}

/* clattn_attention_host: host arrays of exactly the size a valid descriptor needs; 1-byte arrays
 * for an invalid one (reading past them, if it were accepted, is AddressSanitizer's to report). */
static void fuzz_host(fz_state *s)
{
    clattn_attention_desc d;
    fz_read_desc(s, &d);
    const clattn_dtype dt = fz_dtype(&s->in, (clattn_dtype)(fz_u8(&s->in) % 3));
    const uint8_t extra = fz_u8(&s->in);
    clattn_tensor dummy;
    memset(&dummy, 0, sizeof dummy);
    if (extra % 16 == 1)
        d.mask = &dummy;
    else if (extra % 16 == 2)
        d.lse = &dummy;
    else if (extra % 16 == 3)
        d.probabilities = &dummy;
    const int with_lse = (extra >> 4) % 2, null_arg = (extra >> 5) % 8 == 0 ? 1 + (extra >> 6) % 4 : 0;
    const int valid = fz_desc_valid(&d, 1) && clattn_dtype_size(dt) != 0 && !d.mask && !d.lse && !d.probabilities &&
                      !null_arg;
    const uint64_t work = fz_desc_work(&d);
    if (valid && work > FZ_WORK_CAP)
        return; /* a valid call too big to run here; no wait list to stop it with */
    const size_t es = clattn_dtype_size(dt) ? clattn_dtype_size(dt) : 1;
    const int64_t dv = d.head_dim_v ? d.head_dim_v : d.head_dim;
    size_t nq = 1, nk = 1, nv = 1, no = 1, nl = 1;
    if (fz_desc_valid(&d, 1) && work <= FZ_WORK_CAP) {
        nq = (size_t)(d.batch * d.heads_q * d.seq_q * d.head_dim);
        nk = (size_t)(d.batch * d.heads_kv * d.seq_kv * d.head_dim);
        nv = (size_t)(d.batch * d.heads_kv * d.seq_kv * dv);
        no = (size_t)(d.batch * d.heads_q * d.seq_q * dv);
        nl = (size_t)(d.batch * d.heads_q * d.seq_q);
    }
    unsigned char *hq = malloc(nq * es), *hk = malloc(nk * es), *hv = malloc(nv * es), *ho = malloc(no * es),
                  *ho0 = malloc(no * es);
    float *hl = malloc(nl * sizeof(float)), *hl0 = malloc(nl * sizeof(float));
    if (!hq || !hk || !hv || !ho || !ho0 || !hl || !hl0)
        fz_die("out of host memory");
    const uint32_t seed = fz_u8(&s->in);
    fz_fill_moderate(hq, nq * es, seed);
    fz_fill_moderate(hk, nk * es, seed + 1);
    fz_fill_moderate(hv, nv * es, seed + 2);
    fz_fill_moderate(ho, no * es, seed + 3);
    fz_fill_moderate((unsigned char *)hl, nl * sizeof(float), seed + 4);
    memcpy(ho0, ho, no * es);
    memcpy(hl0, hl, nl * sizeof(float));
    const clattn_status st =
        clattn_attention_host(s->ctx, &d, dt, null_arg == 1 ? NULL : hq, null_arg == 2 ? NULL : hk,
                              null_arg == 3 ? NULL : hv, null_arg == 4 ? NULL : ho, with_lse ? hl : NULL);
    const char *msg = clattn_last_error(s->ctx);
    if (st != CLATTN_SUCCESS) {
        if (valid)
            fz_die("clattn_attention_host refused a valid, small call: %s: %s", clattn_status_name(st), msg);
        if ((st != CLATTN_INVALID_ARGUMENT && st != CLATTN_UNSUPPORTED) || msg[0] == '\0')
            fz_die("clattn_attention_host failed with %s (\"%s\")", clattn_status_name(st), msg);
        if (memcmp(ho, ho0, no * es) != 0 || memcmp(hl, hl0, nl * sizeof(float)) != 0)
            fz_die("clattn_attention_host failed but wrote its output");
    } else {
        if (!valid)
            fz_die("clattn_attention_host accepted an invalid call");
        double *xq = malloc(nq * sizeof(double)), *xk = malloc(nk * sizeof(double)), *xv = malloc(nv * sizeof(double)),
               *go = malloc(no * sizeof(double)), *gl = malloc(nl * sizeof(double));
        if (!xq || !xk || !xv || !go || !gl)
            fz_die("out of host memory");
        for (size_t i = 0; i < nq; ++i)
            xq[i] = tu_load(dt, hq, i);
        for (size_t i = 0; i < nk; ++i)
            xk[i] = tu_load(dt, hk, i);
        for (size_t i = 0; i < nv; ++i)
            xv[i] = tu_load(dt, hv, i);
        for (size_t i = 0; i < no; ++i)
            go[i] = tu_load(dt, ho, i);
        for (size_t i = 0; i < nl; ++i)
            gl[i] = hl[i];
        compare(&d, xq, xk, xv, NULL, NULL, go, dt, with_lse ? gl : NULL, NULL, CLATTN_F32);
        free(xq);
        free(xk);
        free(xv);
        free(go);
        free(gl);
    }
    free(hq);
    free(hk);
    free(hv);
    free(ho);
    free(ho0);
    free(hl);
    free(hl0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_state s;
    fz_begin(&s, data, size);
    const uint8_t which = fz_u8(&s.in) % 64;
    if (which == 63)
        fuzz_host(&s);
    else
        fuzz_attention(&s, which == 62);
    fz_end(&s);
    return 0;
}
