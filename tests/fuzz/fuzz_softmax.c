/*
 * libFuzzer harness: clattn_softmax with descriptors, tensor views (in place or not) and wait lists
 * built from the input; see fuzz_common.h for what is checked. The tolerance of each probability
 * p_j is 1e-6 + (1e-5 + storage)·p_j + p_j·(δ_j + Σ_k p_k·δ_k), δ_k the fp32 error of logit k minus
 * the row's largest (tests/test_robust.c); hidden entries must be exactly 0.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "clattn_ref.h"
#include "testutil.h"

#define ALL_DTYPES 7u
#define BIT(d) (1u << (unsigned)(d))
#define GARBAGE_EVENT ((cl_event)(uintptr_t)1)

static int count_ok(int64_t v)
{
    return v >= 1 && v <= 0x7fffffffLL;
}

static int same_view(const fz_tensor *a, const fz_tensor *b)
{
    if (!(a->present && b->present && a->t.buffer == b->t.buffer && a->t.dtype == b->t.dtype &&
          a->t.offset == b->t.offset && memcmp(a->t.shape, b->t.shape, sizeof a->t.shape) == 0))
        return 0;
    /* The stride of a dimension of extent 1 never multiplies a nonzero index: views that differ
     * only there address the same elements, and the header calls them the same view. */
    for (int i = 0; i < 3; i++)
        if (a->t.shape[i] != 1 && a->t.stride[i] != b->t.stride[i])
            return 0;
    return 1;
}

static void compare(const clattn_softmax_desc *d, const double *x, const double *xm, const int *kvl,
                    const double *got, clattn_dtype out_dt)
{
    const size_t C = (size_t)d->cols, n = (size_t)(d->batch * d->heads * d->rows) * C;
    double *want = malloc(n * sizeof *want);
    if (want == NULL)
        fz_die("out of host memory");
    const ref_softmax r = {(int)d->batch, (int)d->heads, (int)d->rows, (int)d->cols, (double)d->scale, d->causal != 0,
                           xm, {(int)d->batch, (int)d->heads, (int)d->rows, (int)d->cols}, kvl};
    ref_softmax_rows(&r, x, want);
    const double scale = d->scale != 0.0f ? (double)d->scale : 1.0;
    const double st_rtol = out_dt == CLATTN_F16 ? 0x1p-11 : out_dt == CLATTN_BF16 ? 0x1p-8 : 0.0;
    for (size_t row = 0; row < n / C; ++row) {
        const double *xr = x + row * C, *mr = xm != NULL ? xm + row * C : NULL, *p = want + row * C,
                     *g = got + row * C;
        /* The largest logit among the row's visible entries (p > 0) and the error terms. */
        size_t jmax = C;
        for (size_t j = 0; j < C; ++j)
            if (p[j] > 0.0 && (jmax == C || scale * xr[j] + (mr ? mr[j] : 0.0) >
                                                scale * xr[jmax] + (mr ? mr[jmax] : 0.0)))
                jmax = j;
        double mixed = 0.0;
        double *delta = malloc(C * sizeof *delta);
        if (delta == NULL)
            fz_die("out of host memory");
        for (size_t j = 0; j < C; ++j) {
            const int tie = jmax < C && xr[j] == xr[jmax] && (mr == NULL || mr[j] == mr[jmax]);
            delta[j] = jmax == C || tie ? 0.0
                                        : 0x1p-22 * (fabs(scale * xr[j]) + (mr ? fabs(mr[j]) : 0.0) +
                                                     fabs(scale * xr[jmax]) + (mr ? fabs(mr[jmax]) : 0.0));
            mixed += p[j] * delta[j];
        }
        for (size_t j = 0; j < C; ++j) {
            const double allowed = 1e-6 + (1e-5 + st_rtol) * p[j] + p[j] * (delta[j] + mixed);
            if (p[j] == 0.0 ? g[j] != 0.0 : !(fabs(g[j] - p[j]) <= allowed))
                fz_die("softmax row %zu column %zu: got %.9g, the reference %.9g (allowed %.3g)", row, j, g[j], p[j],
                       p[j] == 0.0 ? 0.0 : allowed);
        }
        free(delta);
    }
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_state st_;
    fz_state *s = &st_;
    fz_begin(s, data, size);
    clattn_softmax_desc d;
    memset(&d, 0, sizeof d);
    d.batch = fz_count(&s->in);
    d.heads = fz_count(&s->in);
    d.rows = fz_count(&s->in);
    d.cols = fz_count(&s->in);
    d.scale = fz_scale(&s->in);
    const uint8_t c = fz_u8(&s->in);
    d.causal = c < 240 ? c % 2 : (int)fz_u64(&s->in);
    const int64_t w[4] = {d.batch, d.heads, d.rows, d.cols};
    fz_tensor in, out, mask;
    fz_read_tensor(s, &in, w, (clattn_dtype)(fz_u8(&s->in) % 3));
    const uint8_t how = fz_u8(&s->in) % 8;
    if (how < 3)
        out = in; /* in place */
    else
        fz_read_tensor(s, &out, w, (clattn_dtype)(fz_u8(&s->in) % 3));
    memset(&mask, 0, sizeof mask);
    const uint8_t opt = fz_u8(&s->in);
    if (opt % 3 == 0)
        fz_read_tensor(s, &mask, w, (opt & 4) ? CLATTN_F16 : CLATTN_F32);
    d.mask = fz_ptr(&mask);
    d.kv_lengths = fz_read_kvlen(s, d.batch);
    fz_read_wait(s);
    const unsigned __int128 work = (unsigned __int128)(count_ok(d.batch) ? d.batch : 1) *
                                   (unsigned __int128)(count_ok(d.heads) ? d.heads : 1) *
                                   (unsigned __int128)(count_ok(d.rows) ? d.rows : 1) *
                                   (unsigned __int128)(count_ok(d.cols) ? d.cols : 1);
    if (work > FZ_WORK_CAP)
        fz_validate_only(s);
    const clattn_softmax_desc *dp = fz_u8(&s->in) == 255 ? NULL : &d;

    cl_event done = GARBAGE_EVENT;
    const clattn_status st = clattn_softmax(s->ctx, dp, fz_ptr(&in), fz_ptr(&out), s->num_wait, s->waitp, &done);
    const char *msg = clattn_last_error(s->ctx);
    const int accepted = st == CLATTN_SUCCESS || (st == CLATTN_OPENCL_ERROR && strstr(msg, "has failed") != NULL);
    fz_marks all, outs;
    fz_marks_init(&all, s);
    fz_marks_init(&outs, s);
    const int in_place = same_view(&in, &out);
    if (accepted) {
        if (dp == NULL || !count_ok(d.batch) || !count_ok(d.heads) || !count_ok(d.rows) || !count_ok(d.cols) ||
            (uint64_t)d.batch * (uint64_t)d.heads > 0x7fffffffULL || !isfinite(d.scale))
            fz_die("accepted an invalid descriptor");
        if (!fz_view_valid(s, &in, w, 0, ALL_DTYPES) || !fz_view_valid(s, &out, w, 0, ALL_DTYPES) ||
            (mask.present && !fz_view_valid(s, &mask, w, 1, BIT(CLATTN_F32) | BIT(CLATTN_F16))))
            fz_die("accepted an invalid tensor view");
        const int kb = d.kv_lengths != NULL ? fz_buf_index(s, d.kv_lengths) : -1;
        if (d.kv_lengths != NULL && (kb < 0 || s->buf[kb].bytes < 4 * (size_t)d.batch))
            fz_die("accepted kv_lengths without batch int32 values");
        const int marked = (in_place || fz_mark(&all, s, &in)) && fz_mark(&all, s, &out) &&
                           (!mask.present || fz_mark(&all, s, &mask));
        if (d.kv_lengths != NULL)
            fz_mark_range(&all, s, d.kv_lengths, 0, 4 * (size_t)d.batch);
        if (marked && fz_marked_twice(&all, s, &out))
            fz_die("accepted an output that overlaps itself, the mask, kv_lengths or (not in place) the input");
        if (!fz_mark(&outs, s, &out) && st == CLATTN_SUCCESS)
            fz_die("a call within the work cap has an output too big to mark");
    }
    unsigned char **imgs = fz_after_call(s, st, done, st == CLATTN_SUCCESS ? &outs : NULL);
    if (imgs != NULL) {
        double *x = fz_gather(s, &in, NULL, w, 0), *xm = mask.present ? fz_gather(s, &mask, NULL, w, 0) : NULL;
        int *kvl = d.kv_lengths != NULL ? fz_kvlen_values(s, d.kv_lengths, imgs, d.batch, 0) : NULL;
        double *got = fz_gather(s, &out, imgs, w, 1);
        compare(&d, x, xm, kvl, got, out.t.dtype);
        free(x);
        free(xm);
        free(kvl);
        free(got);
        fz_free_images(s, imgs);
    }
    fz_marks_free(&all);
    fz_marks_free(&outs);
    fz_end(s);
    return 0;
}
