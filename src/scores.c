/* The unfused path's two GEMMs (gemm.cl): scale·QKᵀ with masks, and P·V. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* Clamps tile parameters to what the device can run. */
static void sane_gemm(const clattn_context *ctx, clattn_params *pp)
{
    int *v = pp->v;
    for (int i = 0; i < 5; i++) /* v[5] (VW) is checked below */
        if (v[i] <= 0)
            v[i] = 1;
    v[4] = (v[4] + 3) / 4 * 4; /* tiles are loaded as float4 along k */
    if (v[5] != 8 && v[5] != 16)
        v[5] = 4;
    while ((size_t)v[0] * (size_t)v[1] > ctx->dev.max_wg && v[1] > 1)
        v[1] /= 2;
    while ((size_t)v[0] * (size_t)v[1] > ctx->dev.max_wg && v[0] > 1)
        v[0] /= 2;
    /* Local memory: As[TK][TM] + Bs[TK][TN] floats. */
    for (;;) {
        size_t bytes = 4u * ((size_t)(v[4] + 4) * v[1] * v[2] + (size_t)v[4] * v[0] * v[5] * v[3]);
        if (bytes <= ctx->dev.local_mem || v[4] <= 4)
            break;
        v[4] = (v[4] / 2 + 3) / 4 * 4;
    }
}

static clattn_status gemm(clattn_context *ctx, int mode, const clattn_problem *p, const clattn_view *a,
                          const clattn_view *bm, const clattn_view *c, int M, int N, int K,
                          cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    clattn_bucket bucket = {mode == 0 ? CLATTN_OP_SCORES : CLATTN_OP_PV, p->dtype,
                            (int)p->head_dim, clattn__seq_q_class(p->seq_q),
                            clattn__log2_ceil(p->seq_kv)};
    clattn_params pp;
    clattn__default_params(ctx, &bucket, &pp);
    sane_gemm(ctx, &pp);
    const int *v = pp.v;
    char opts[256];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -DMODE=%d -DDT_A=%d -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d -DWGX=%d "
             "-DWGY=%d -DRM=%d -DNS=%d -DTK=%d -DVW=%d",
             mode, (int)a->dtype, (int)bm->dtype, (int)c->dtype,
             p->has_mask ? (int)p->mask.dtype : 0, v[0], v[1], v[2], v[3], v[4], v[5]);
    cl_kernel k;
    clattn_status st = clattn__get_kernel(ctx, "gemm.cl", opts, "gemm", &k);
    if (st)
        return st;
    const int tm = v[1] * v[2], tn = v[0] * v[5] * v[3];
    const int heads = (int)p->heads_q, group = (int)(p->heads_q / p->heads_kv);
    const int seq_q = (int)p->seq_q, seq_kv = (int)p->seq_kv, causal = p->causal,
              has_mask = p->has_mask; /* P·V: forces the NaN-safe path where P has masked zeros */
    const float alpha = mode == 0 ? p->scale : 1.0f;
    clattn_args args = {k, 0, CL_SUCCESS};
    clattn__arg_view(&args, a);
    clattn__arg_view(&args, bm);
    clattn__arg_view(&args, c);
    clattn__arg_view(&args, mode == 0 && has_mask ? &p->mask : NULL);
    clattn__arg(&args, sizeof(cl_mem), p->kv_lengths ? &p->kv_lengths : NULL);
    clattn__arg(&args, sizeof(int), &M);
    clattn__arg(&args, sizeof(int), &N);
    clattn__arg(&args, sizeof(int), &K);
    clattn__arg(&args, sizeof(int), &heads);
    clattn__arg(&args, sizeof(int), &group);
    clattn__arg(&args, sizeof(int), &seq_q);
    clattn__arg(&args, sizeof(int), &seq_kv);
    clattn__arg(&args, sizeof(int), &causal);
    clattn__arg(&args, sizeof(int), &has_mask);
    clattn__arg(&args, sizeof(float), &alpha);
    const size_t local[3] = {(size_t)v[0], (size_t)v[1], 1};
    const size_t global[3] = {(size_t)((N + tn - 1) / tn) * v[0], (size_t)((M + tm - 1) / tm) * v[1],
                              (size_t)(p->batch * p->heads_q)};
    return clattn__enqueue(ctx, &args, 3, global, local, num_wait, wait, done,
                           mode == 0 ? "gemm scores" : "gemm pv");
}

clattn_status clattn__run_scores(clattn_context *ctx, const clattn_problem *p, const clattn_view *dst,
                                 cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    return gemm(ctx, 0, p, &p->q, &p->k, dst, (int)p->seq_q, (int)p->seq_kv, (int)p->head_dim,
                num_wait, wait, done);
}

clattn_status clattn__run_pv(clattn_context *ctx, const clattn_problem *p, const clattn_view *probs,
                             cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    return gemm(ctx, 1, p, probs, &p->v, &p->out, (int)p->seq_q, (int)p->head_dim_v, (int)p->seq_kv,
                num_wait, wait, done);
}

clattn_status clattn_scores(clattn_context *ctx, const clattn_attention_desc *desc,
                            const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *scores,
                            cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    if (done)
        *done = NULL;
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_scores: ctx must not be NULL");
    clattn__clear_error(ctx);
    clattn_problem p;
    clattn_status st = clattn__check_attention(ctx, desc, q, k, NULL, NULL, 0, &p);
    if (st)
        return st;
    const int64_t ss[4] = {p.batch, p.heads_q, p.seq_q, p.seq_kv};
    clattn_view dst;
    if ((st = clattn__check_view(ctx, "scores", scores, ss, CLATTN_VIEW_OUTPUT, CLATTN_DTYPES_ALL,
                                 &dst)) ||
        (st = clattn__check_wait(ctx, num_wait, wait)))
        return st;
    if (clattn__views_overlap(scores, q) || clattn__views_overlap(scores, k) ||
        (desc->mask && clattn__views_overlap(scores, desc->mask)))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "scores overlaps q, k or the mask");
    if (desc->kv_lengths && scores->buffer == desc->kv_lengths)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->kv_lengths is also the scores buffer");
    return clattn__run_scores(ctx, &p, &dst, num_wait, wait, done);
}
