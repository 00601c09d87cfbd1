/* Row-wise softmax (softmax.cl): the public entry point and the unfused path's middle step. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

clattn_status clattn__run_softmax(clattn_context *ctx, int64_t batch, int64_t heads,
                                  int64_t rows, int64_t cols, float scale, int causal,
                                  const clattn_view *mask, cl_mem kvlen, const clattn_view *in,
                                  const clattn_view *out, const clattn_view *lse, clattn_dtype in_dt,
                                  const clattn_view *sinks, cl_uint num_wait, const cl_event *wait,
                                  cl_event *done)
{
    clattn_bucket bucket = {CLATTN_OP_SOFTMAX, in_dt, 0, clattn__seq_q_class(rows),
                            clattn__log2_ceil(cols), clattn__mask_kind(causal, mask || kvlen)};
    clattn_params pp;
    const clattn_params_source source = clattn__default_params(ctx, &bucket, &pp);
    /* ROWS > 0: one work-item per ROWS rows (softmax_rows), used while that still gives every
     * compute unit several work-groups; long rows of few heads go to the work-group kernel. */
    int per_wi = pp.softmax.ROWS > 0 ? pp.softmax.ROWS : 0;
    if (per_wi && (uint64_t)(rows + per_wi - 1) / per_wi * (uint64_t)(batch * heads) <
                      4u * ctx->dev.compute_units)
        per_wi = 0;
    int wg = 1;
    cl_kernel k;
    for (size_t cap = ctx->dev.max_wg;;) {
        /* The local reduction halves the group: keep it a power of two the device (and, when one
         * was refused, the kernel compiled for a larger group) accepts. */
        wg = 1;
        while (wg * 2 <= pp.softmax.WG && (size_t)(wg * 2) <= cap)
            wg *= 2;
        /* The work-group kernel's grid is rows·WG work-items in x, which a 32-bit size_t cannot
         * hold from 2^32 on (rows >= 2^22 at WG 1024): one row a work-item there instead. */
        if (!per_wi && (uint64_t)rows * (uint64_t)wg > SIZE_MAX)
            per_wi = 1;
        char opts[200];
        if (per_wi)
            snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDT_A=%d -DDT_OUT=%d -DDT_MASK=%d -DWG=1 -DROWS=%d "
                     "-DKSEL=1 -DK_softmax_rows=1",
                     (int)in->dtype, (int)out->dtype, mask ? (int)mask->dtype : 0, per_wi);
        else
            snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDT_A=%d -DDT_OUT=%d -DDT_MASK=%d -DWG=%d -DKSEL=1 -DK_softmax=1",
                     (int)in->dtype, (int)out->dtype, mask ? (int)mask->dtype : 0, wg);
        const clattn_status st =
            clattn__get_kernel(ctx, "softmax.cl", opts, per_wi ? "softmax_rows" : "softmax", &k);
        if (!st)
            break;
        if (!(cap = clattn__retry_cap(ctx, st, source, cap)))
            return st;
    }
    const int r = (int)rows, c = (int)cols, h = (int)heads, has_mask = mask != NULL,
              has_lse = lse != NULL;
    clattn_args a = {k, 0, CL_SUCCESS};
    clattn__arg_view(&a, in);
    clattn__arg_view(&a, out);
    clattn__arg_view(&a, mask);
    clattn__arg_view(&a, lse);
    clattn__arg(&a, sizeof(cl_mem), kvlen ? &kvlen : NULL);
    clattn__arg(&a, sizeof(int), &r);
    clattn__arg(&a, sizeof(int), &c);
    clattn__arg(&a, sizeof(int), &h);
    clattn__arg(&a, sizeof(int), &causal);
    clattn__arg(&a, sizeof(int), &has_mask);
    clattn__arg(&a, sizeof(int), &has_lse);
    clattn__arg(&a, sizeof(float), &scale);
    const cl_mem sbuf = sinks ? sinks->buffer : NULL;
    const cl_ulong soff = sinks ? sinks->offset : 0, ssh = sinks ? sinks->stride[1] : 0;
    clattn__arg(&a, sizeof(cl_mem), sbuf ? &sbuf : NULL);
    clattn__arg(&a, sizeof(cl_ulong), &soff);
    clattn__arg(&a, sizeof(cl_ulong), &ssh);
    const size_t local[2] = {per_wi ? 1 : (size_t)wg, 1};
    const size_t global[2] = {per_wi ? (size_t)((rows + per_wi - 1) / per_wi)
                                     : (size_t)rows * (size_t)wg,
                              (size_t)(batch * heads)};
    return clattn__enqueue(ctx, &a, 2, global, local, num_wait, wait, done, "softmax");
}

clattn_status clattn_softmax(clattn_context *ctx, const clattn_softmax_desc *desc,
                             const clattn_tensor *in, const clattn_tensor *out, cl_uint num_wait,
                             const cl_event *wait, cl_event *done)
{
    if (done && !clattn__done_in_wait(num_wait, wait, done))
        *done = NULL;
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_softmax: ctx must not be NULL");
    clattn__clear_error(ctx);
    if (!desc)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc must not be NULL");
    const struct {
        const char *name;
        int64_t v;
    } counts[4] = {{"batch", desc->batch}, {"heads", desc->heads}, {"rows", desc->rows}, {"cols", desc->cols}};
    for (int i = 0; i < 4; i++) {
        if (counts[i].v <= 0)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->%s must be positive (got %lld)",
                                counts[i].name, (long long)counts[i].v);
        if (counts[i].v > (i < 2 ? 0x7fffffffLL : CLATTN_MAX_SEQ))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->%s is too large (%lld)",
                                counts[i].name, (long long)counts[i].v);
    }
    if ((uint64_t)desc->batch * (uint64_t)desc->heads > 0x7fffffffULL)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->batch x heads (%lld x %lld) exceeds %d",
                            (long long)desc->batch, (long long)desc->heads, 0x7fffffff);
    if (!isfinite(desc->scale))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->scale is not finite (%g)",
                            (double)desc->scale);
    const int64_t shape[4] = {desc->batch, desc->heads, desc->rows, desc->cols};
    clattn_view vin, vout, vmask;
    clattn_status st;
    if ((st = clattn__check_view(ctx, "in", in, shape, CLATTN_VIEW_INPUT, CLATTN_DTYPES_ALL, &vin)) ||
        (st = clattn__check_view(ctx, "out", out, shape, CLATTN_VIEW_OUTPUT, CLATTN_DTYPES_ALL, &vout)))
        return st;
    if (!clattn__same_view(&vin, &vout) && clattn__views_overlap(in, out))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "out overlaps in without being the same view (in place needs identical views)");
    if (desc->mask) {
        if ((st = clattn__check_view(ctx, "desc->mask", desc->mask, shape, CLATTN_VIEW_BROADCAST,
                                     CLATTN_DTYPE_BIT(CLATTN_F32) | CLATTN_DTYPE_BIT(CLATTN_F16),
                                     &vmask)))
            return st;
        if (clattn__views_overlap(desc->mask, out))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->mask overlaps out");
    }
    if ((st = clattn__check_kvlen(ctx, desc->kv_lengths, desc->batch)))
        return st;
    if (desc->kv_lengths && clattn__kvlen_overlaps(desc->kv_lengths, desc->batch, out))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->kv_lengths overlaps out");
    if ((st = clattn__check_wait(ctx, num_wait, wait, done)))
        return st;
    const float scale = desc->scale != 0.0f ? desc->scale : 1.0f;
    return clattn__run_softmax(ctx, desc->batch, desc->heads, desc->rows, desc->cols, scale,
                               desc->causal != 0, desc->mask ? &vmask : NULL, desc->kv_lengths, &vin,
                               &vout, NULL, in->dtype, NULL, num_wait, wait, done);
}
