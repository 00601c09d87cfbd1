/* Host-memory convenience: copy in, compute, copy out, for small programs and the run script. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

clattn_status clattn_attention_host(clattn_context *ctx, const clattn_attention_desc *desc,
                                    clattn_dtype dtype, const void *q, const void *k, const void *v,
                                    void *out, float *lse)
{
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_attention_host: ctx must not be NULL");
    clattn__clear_error(ctx);
    if (!desc)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc must not be NULL");
    if (!q || !k || !v || !out)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "q, k, v and out must not be NULL");
    if (desc->mask || desc->kv_lengths || desc->lse || desc->probabilities || desc->sinks || desc->alibi_slopes ||
        desc->kv)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "clattn_attention_host takes no mask, kv_lengths, lse, probabilities, sinks, "
                            "alibi_slopes or kv in desc (use clattn_attention)");
    const size_t es = clattn_dtype_size(dtype);
    if (es == 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "dtype %d is not a clattn_dtype", (int)dtype);
    if (clattn__kv_type(dtype))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "dtype %s: clattn_attention_host takes f32, f16 or bf16 arrays (KV-cache types: "
                            "clattn_attention)", clattn_dtype_name(dtype));
    clattn_status st = clattn__check_desc(ctx, desc, 1);
    if (st)
        return st;
    const int64_t B = desc->batch, HQ = desc->heads_q, HK = desc->heads_kv, SQ = desc->seq_q,
                  SK = desc->seq_kv, D = desc->head_dim,
                  DV = desc->head_dim_v ? desc->head_dim_v : desc->head_dim;
    /* Host arrays must be addressable: bound each byte count well inside size_t (10^15 bytes,
     * or half of SIZE_MAX where size_t has 32 bits). */
    const double nq = (double)B * HQ * SQ * D, nk = (double)B * HK * SK * D,
                 nv = (double)B * HK * SK * DV, no = (double)B * HQ * SQ * DV, nl = (double)B * HQ * SQ;
    const double limit = (double)SIZE_MAX / 2 < 1e15 ? (double)SIZE_MAX / 2 : 1e15;
    if (nq * es > limit || nk * es > limit || nv * es > limit || no * es > limit || nl * 4 > limit)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc sizes need more than %.3g bytes of host memory in one array (q %.3g, "
                            "k %.3g, v %.3g, out %.3g elements)", limit, nq, nk, nv, no);
    const size_t bq = (size_t)nq * es, bk = (size_t)nk * es, bv = (size_t)nv * es, bo = (size_t)no * es,
                 bl = (size_t)nl * 4;
    /* Each array becomes one device buffer: past the device's largest allocation the driver would
     * refuse it with an OpenCL error; say what it is. */
    static const char *const names[5] = {"q", "k", "v", "out", "lse"};
    const size_t need[5] = {bq, bk, bv, bo, lse ? bl : 0};
    for (int i = 0; i < 5; i++)
        if ((uint64_t)need[i] > ctx->dev.max_alloc)
            return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                                "clattn_attention_host: %s needs %zu bytes in one buffer, more than the "
                                "device's max allocation of %llu bytes (split the batch or heads, or use "
                                "clattn_attention on buffers of your own)",
                                names[i], need[i], (unsigned long long)ctx->dev.max_alloc);
    cl_int err = CL_SUCCESS;
    cl_mem m[5] = {NULL, NULL, NULL, NULL, NULL};
    const size_t sizes[5] = {bq, bk, bv, bo, bl};
    const void *src[3] = {q, k, v};
    for (int i = 0; i < (lse ? 5 : 4) && !st; i++) {
        cl_mem_flags f = i < 3 ? (CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR) : CL_MEM_WRITE_ONLY;
        m[i] = clCreateBuffer(ctx->context, f, sizes[i], i < 3 ? (void *)src[i] : NULL, &err);
        if (!m[i] || err != CL_SUCCESS)
            st = clattn__cl_fail(ctx, err ? err : CL_MEM_OBJECT_ALLOCATION_FAILURE, "clCreateBuffer");
    }
    if (!st) {
        clattn_tensor tq = clattn_tensor_bhsd(m[0], dtype, B, HQ, SQ, D);
        clattn_tensor tk = clattn_tensor_bhsd(m[1], dtype, B, HK, SK, D);
        clattn_tensor tv = clattn_tensor_bhsd(m[2], dtype, B, HK, SK, DV);
        clattn_tensor to = clattn_tensor_bhsd(m[3], dtype, B, HQ, SQ, DV);
        clattn_tensor tl = clattn_tensor_bhsd(m[4], CLATTN_F32, B, HQ, SQ, 1);
        clattn_attention_desc d = *desc;
        d.lse = lse ? &tl : NULL;
        st = clattn_attention(ctx, &d, &tq, &tk, &tv, &to, 0, NULL, NULL);
        if (!st) {
            /* LSE goes through a copy read first, so that a failed read leaves out and lse as
             * they were: out is read last, straight into place. */
            float *lse_copy = lse ? malloc(bl) : NULL;
            if (lse && !lse_copy)
                st = clattn__fail(ctx, CLATTN_OUT_OF_MEMORY, "out of host memory (%zu bytes for lse)", bl);
            if (!st && lse)
                err = clEnqueueReadBuffer(ctx->queue, m[4], CL_TRUE, 0, bl, lse_copy, 0, NULL, NULL);
            if (!st && err == CL_SUCCESS)
                err = clEnqueueReadBuffer(ctx->queue, m[3], CL_TRUE, 0, bo, out, 0, NULL, NULL);
            if (!st && err != CL_SUCCESS)
                st = clattn__cl_fail(ctx, err, "clEnqueueReadBuffer");
            if (!st && lse)
                memcpy(lse, lse_copy, bl);
            free(lse_copy);
        }
    }
    for (int i = 0; i < 5; i++)
        if (m[i])
            clReleaseMemObject(m[i]);
    return st;
}

/* Saturating product: huge extents give an INT64_MAX stride that validation then reports,
 * instead of signed overflow here. */
static int64_t sat_mul(int64_t a, int64_t b)
{
    if (a < 0 || b < 0)
        return -1;
    if (a != 0 && b > INT64_MAX / a)
        return INT64_MAX;
    return a * b;
}

clattn_tensor clattn_tensor_bhsd(cl_mem buffer, clattn_dtype dtype, int64_t b, int64_t h, int64_t s,
                                 int64_t d)
{
    clattn_tensor t;
    memset(&t, 0, sizeof t);
    t.buffer = buffer;
    t.dtype = dtype;
    t.shape[0] = b;
    t.shape[1] = h;
    t.shape[2] = s;
    t.shape[3] = d;
    t.stride[2] = d;
    t.stride[1] = sat_mul(s, d);
    t.stride[0] = sat_mul(h, sat_mul(s, d));
    return t;
}

clattn_tensor clattn_tensor_bshd(cl_mem buffer, clattn_dtype dtype, int64_t b, int64_t s, int64_t h,
                                 int64_t d)
{
    clattn_tensor t;
    memset(&t, 0, sizeof t);
    t.buffer = buffer;
    t.dtype = dtype;
    t.shape[0] = b;
    t.shape[1] = h;
    t.shape[2] = s;
    t.shape[3] = d;
    t.stride[1] = d;
    t.stride[2] = sat_mul(h, d);
    t.stride[0] = sat_mul(s, sat_mul(h, d));
    return t;
}
