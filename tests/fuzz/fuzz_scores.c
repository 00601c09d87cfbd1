/*
 * libFuzzer harness: clattn_scores with descriptors, tensor views and wait lists built from the
 * input; see fuzz_common.h for what is checked. The scores output may be any storage type; the
 * reference is rounded to it before comparing.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "clattn_ref.h"
#include "testutil.h"

#define ALL_DTYPES 7u
#define BIT(d) (1u << (unsigned)(d))
#define GARBAGE_EVENT ((cl_event)(uintptr_t)1)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_state st_;
    fz_state *s = &st_;
    fz_begin(s, data, size);
    clattn_attention_desc d;
    fz_read_desc(s, &d);
    const int64_t wq[4] = {d.batch, d.heads_q, d.seq_q, d.head_dim};
    const int64_t wk[4] = {d.batch, d.heads_kv, d.seq_kv, d.head_dim};
    const int64_t wm[4] = {d.batch, d.heads_q, d.seq_q, d.seq_kv};
    const clattn_dtype dt = (clattn_dtype)(fz_u8(&s->in) % 3);
    fz_tensor q, k, scores, mask;
    fz_read_tensor(s, &q, wq, dt);
    fz_read_tensor(s, &k, wk, dt);
    fz_read_tensor(s, &scores, wm, (clattn_dtype)(fz_u8(&s->in) % 3));
    memset(&mask, 0, sizeof mask);
    const uint8_t opt = fz_u8(&s->in);
    if (opt % 3 == 0)
        fz_read_tensor(s, &mask, wm, (opt & 4) ? CLATTN_F16 : CLATTN_F32);
    const cl_mem kv = fz_read_kvlen(s, d.batch);
    d.mask = fz_ptr(&mask);
    d.kv_lengths = kv;
    fz_read_wait(s);
    fz_read_variants(s, &d);
    if (fz_desc_work(&d) > FZ_WORK_CAP)
        fz_validate_only(s);

    cl_event done = GARBAGE_EVENT;
    const clattn_status st =
        clattn_scores(s->ctx, &d, fz_ptr(&q), fz_ptr(&k), fz_ptr(&scores), s->num_wait, s->waitp, &done);
    const char *msg = clattn_last_error(s->ctx);
    const int accepted = st == CLATTN_SUCCESS || (st == CLATTN_OPENCL_ERROR && strstr(msg, "has failed") != NULL);
    fz_marks all, outs;
    fz_marks_init(&all, s);
    fz_marks_init(&outs, s);
    if (accepted) {
        /* lse, probabilities and algorithm are ignored by clattn_scores. */
        if (!fz_desc_valid(&d, 0))
            fz_die("accepted an invalid descriptor");
        if (!fz_view_valid(s, &q, wq, 0, ALL_DTYPES) || !fz_view_valid(s, &k, wk, 0, BIT(q.t.dtype)) ||
            !fz_view_valid(s, &scores, wm, 0, ALL_DTYPES) ||
            (mask.present && !fz_view_valid(s, &mask, wm, 1, BIT(CLATTN_F32) | BIT(CLATTN_F16))))
            fz_die("accepted an invalid tensor view");
        const int kb = kv != NULL ? fz_buf_index(s, kv) : -1;
        if (kv != NULL && (kb < 0 || s->buf[kb].bytes < 4 * (size_t)d.batch))
            fz_die("accepted kv_lengths without batch int32 values");
        /* The overlap checks come after the wait list in clattn_scores: judged on real runs only. */
        if (st == CLATTN_SUCCESS) {
            const int marked = fz_mark(&all, s, &q) && fz_mark(&all, s, &k) && fz_mark(&all, s, &scores) &&
                               (!mask.present || fz_mark(&all, s, &mask));
            if (kv != NULL)
                fz_mark_range(&all, s, kv, 0, 4 * (size_t)d.batch);
            if (marked && fz_marked_twice(&all, s, &scores))
                fz_die("accepted a scores view that overlaps itself or an input");
            if (!fz_mark(&outs, s, &scores))
                fz_die("a call within the work cap has an output too big to mark");
        }
    }
    unsigned char **imgs = fz_after_call(s, st, done, st == CLATTN_SUCCESS ? &outs : NULL);
    if (imgs != NULL) {
        double *xq = fz_gather(s, &q, NULL, wq, 0), *xk = fz_gather(s, &k, NULL, wk, 0),
               *xm = mask.present ? fz_gather(s, &mask, NULL, wm, 0) : NULL;
        int *kvl = kv != NULL ? fz_kvlen_values(s, kv, imgs, d.batch, 0) : NULL;
        double *got = fz_gather(s, &scores, imgs, wm, 1);
        const size_t n = (size_t)(d.batch * d.heads_q * d.seq_q * d.seq_kv);
        double *want = malloc(n * sizeof *want);
        if (want == NULL)
            fz_die("out of host memory");
        ref_attn a;
        memset(&a, 0, sizeof a);
        a.batch = (int)d.batch;
        a.heads_q = (int)d.heads_q;
        a.heads_kv = (int)d.heads_kv;
        a.seq_q = (int)d.seq_q;
        a.seq_kv = (int)d.seq_kv;
        a.head_dim = (int)d.head_dim;
        a.scale = d.scale != 0.0f ? (double)d.scale : (double)(float)(1.0 / sqrt((double)d.head_dim));
        a.causal = d.causal != 0;
        a.mask = xm;
        a.mask_shape[0] = (int)d.batch;
        a.mask_shape[1] = (int)d.heads_q;
        a.mask_shape[2] = (int)d.seq_q;
        a.mask_shape[3] = (int)d.seq_kv;
        a.kv_len = kvl;
        a.window = d.window;
        a.window_left = d.window_left;
        a.window_right = d.window_right;
        a.chunk = d.chunk;
        a.softcap = d.softcap;
        a.q_offset = d.q_offset;
        a.k_offset = d.k_offset;
        ref_scores(&a, xq, xk, want);
        /* Rounded to the output's storage type, as the device must store it. */
        for (size_t i = 0; i < n; ++i) {
            uint32_t tmp;
            tu_store(scores.t.dtype, &tmp, 0, want[i]);
            want[i] = tu_load(scores.t.dtype, &tmp, 0);
        }
        const double e = fz_logit_error(&d, a.scale, xq, xk, xm);
        const double rtol = scores.t.dtype == CLATTN_F16 ? 0x1p-10 : scores.t.dtype == CLATTN_BF16 ? 0x1p-7 : 1e-5;
        /* The softcap's fp32 tanh is a few ulp of the cap (docs/numerics.md#variants). */
        fz_compare("scores", got, want, n, 1e-6 + 2.0 * e + 16.0 * (double)d.softcap * FLT_EPSILON, rtol);
        free(xq);
        free(xk);
        free(xm);
        free(kvl);
        free(got);
        free(want);
        fz_free_images(s, imgs);
    }
    fz_marks_free(&all);
    fz_marks_free(&outs);
    fz_end(s);
    return 0;
}
