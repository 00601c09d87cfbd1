/* Training: clattn_attention_backward (cl/backward.cl), dropout's checks and kernel arguments,
 * clattn_dropout_mask, and Philox-4x32-10 on the host. docs/training.md. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

clattn_status clattn__check_dropout(clattn_context *ctx, const clattn_attention_desc *desc, clattn_problem *p)
{
    memset(&p->drop, 0, sizeof p->drop);
    const float d = desc->dropout_p;
    if (!(d >= 0.0f && d < 1.0f))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->dropout_p is %g: the drop probability lies in [0, 1) (0: no dropout)", (double)d);
    if (d == 0.0f)
        return CLATTN_SUCCESS;
    if (desc->kv && (desc->kv->cu_seqlens_q || desc->kv->cu_seqlens_k))
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "desc->dropout_p with packed sequences (desc->kv->cu_seqlens_q/k): dropout numbers "
                            "rows by batch, which packed sequences do not have");
    p->drop.on = 1;
    p->drop.k0 = (cl_uint)(desc->dropout_seed & 0xffffffffu);
    p->drop.k1 = (cl_uint)(desc->dropout_seed >> 32);
    p->drop.off = desc->dropout_offset;
    const double t = floor((double)d * 65536.0 + 0.5);
    p->drop.thr = t > 65535.0 ? 65535u : (cl_uint)t;
    p->drop.scale = (float)(1.0 / (1.0 - (double)d));
    p->drop.roff = (cl_uint)(uint64_t)desc->q_offset;
    p->drop.coff = (cl_uint)(uint64_t)desc->k_offset;
    p->drop.hq = (int)desc->heads_q;
    return CLATTN_SUCCESS;
}

void clattn__dropout_args(clattn_args *a, const clattn_problem *p)
{
    const clattn_dropout *d = &p->drop;
    if (!d->on)
        return;
    clattn__arg(a, sizeof(cl_uint), &d->k0);
    clattn__arg(a, sizeof(cl_uint), &d->k1);
    clattn__arg(a, sizeof(cl_uint), &d->off);
    clattn__arg(a, sizeof(cl_uint), &d->thr);
    clattn__arg(a, sizeof(float), &d->scale);
    clattn__arg(a, sizeof(cl_uint), &d->roff);
    clattn__arg(a, sizeof(cl_uint), &d->coff);
    clattn__arg(a, sizeof(int), &d->hq);
}

void clattn_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    if (!ctr || !key || !out)
        return;
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        const uint64_t m0 = (uint64_t)0xD2511F53u * c0, m1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(m1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(m0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)m1;
        c3 = (uint32_t)m0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The options every backward.cl program takes: the tensors' types and head sizes; with
 * `dropout`, DROPOUT. */
static void bwd_options(const clattn_context *ctx, char *buf, size_t size, int dt_in, int dt_o, int dt_g,
                        int dt_dq, int dt_dk, int dt_dv, int dt_mask, int dk16, int dv16, int dropout,
                        const char *kernels)
{
    snprintf(buf, size,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_O=%d -DDT_G=%d -DDT_DQ=%d -DDT_DK=%d -DDT_DV=%d "
             "-DDT_MASK=%d -DDK16=%d -DDV16=%d -DEXP2_POLY=%d%s -DKSEL=1%s",
             dt_in, dt_o, dt_g, dt_dq, dt_dk, dt_dv, dt_mask, dk16, dv16,
             (ctx->dev.type & CL_DEVICE_TYPE_CPU) != 0, dropout ? " -DDROPOUT=1" : "", kernels);
}

clattn_status clattn_dropout_mask(clattn_context *ctx, const clattn_attention_desc *desc,
                                  const clattn_tensor *mask, cl_uint num_wait, const cl_event *wait,
                                  cl_event *done)
{
    if (done && !clattn__done_in_wait(num_wait, wait, done))
        *done = NULL;
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_dropout_mask: ctx must not be NULL");
    clattn__clear_error(ctx);
    /* The mask reads batch, heads_q, seq_q, seq_kv, kv_lengths, the offsets and the dropout
     * fields, and checks those; the others play no part in it. */
    if (!desc)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc must not be NULL");
    const struct {
        const char *name;
        int64_t v, max;
    } n[4] = {{"batch", desc->batch, 0x7fffffffLL},
              {"heads_q", desc->heads_q, 0x7fffffffLL},
              {"seq_q", desc->seq_q, CLATTN_MAX_SEQ},
              {"seq_kv", desc->seq_kv, CLATTN_MAX_SEQ}};
    for (int i = 0; i < 4; i++)
        if (n[i].v < 1 || n[i].v > n[i].max)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->%s is %lld: 1 .. %lld", n[i].name,
                                (long long)n[i].v, (long long)n[i].max);
    if ((uint64_t)desc->batch * (uint64_t)desc->heads_q > 0x7fffffffu)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->batch x heads_q (%lld x %lld) exceeds 2^31 - 1",
                            (long long)desc->batch, (long long)desc->heads_q);
    /* A later option there may change the draw: refused as by clattn_attention. */
    clattn_status st = clattn__check_reserved(ctx, desc->reserved, sizeof desc->reserved / sizeof desc->reserved[0]);
    if (st)
        return st;
    st = clattn__check_offsets(ctx, desc);
    if (st)
        return st;
    clattn_problem p;
    memset(&p, 0, sizeof p);
    if ((st = clattn__check_dropout(ctx, desc, &p)))
        return st;
    if (!p.drop.on)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->dropout_p is 0: no dropout to draw");
    const int64_t ms[4] = {desc->batch, desc->heads_q, desc->seq_q, desc->seq_kv};
    clattn_view m;
    if ((st = clattn__check_view(ctx, "mask", mask, ms, CLATTN_VIEW_OUTPUT, CLATTN_DTYPES_ALL, &m)) ||
        (st = clattn__check_kvlen(ctx, desc->kv_lengths, desc->batch)) ||
        (st = clattn__check_wait(ctx, num_wait, wait, done)))
        return st;
    if (desc->kv_lengths && clattn__kvlen_overlaps(desc->kv_lengths, desc->batch, mask))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "mask overlaps desc->kv_lengths");
    char opts[512];
    bwd_options(ctx, opts, sizeof opts, 0, 0, 0, (int)m.dtype, 0, 0, 0, 1, 1, 1, " -DK_dropout_mask=1");
    cl_kernel k;
    if ((st = clattn__get_kernel(ctx, "backward.cl", opts, "dropout_mask", &k)))
        return st;
    const cl_ulong rows = (cl_ulong)desc->batch * (cl_ulong)desc->heads_q * (cl_ulong)desc->seq_q;
    const int heads_q = (int)desc->heads_q, seq_q = (int)desc->seq_q, seq_kv = (int)desc->seq_kv;
    size_t global[3], local[3];
    const int ny = clattn__row_grid(ctx, 1, (desc->seq_kv + 15) / 16, (int64_t)rows, global, local);
    clattn_args a = {k, 0, CL_SUCCESS};
    clattn__arg_view(&a, &m);
    clattn__arg(&a, sizeof(cl_mem), desc->kv_lengths ? &desc->kv_lengths : NULL);
    clattn__arg(&a, sizeof(int), &heads_q);
    clattn__arg(&a, sizeof(int), &seq_q);
    clattn__arg(&a, sizeof(int), &seq_kv);
    clattn__arg(&a, sizeof(cl_ulong), &rows);
    clattn__arg(&a, sizeof(int), &ny);
    clattn__dropout_args(&a, &p);
    return clattn__enqueue(ctx, &a, 3, global, local, num_wait, wait, done, "dropout_mask");
}

/* The key ranges of bwd_main: enough work-items for every compute unit twice over (each range
 * keeps a dQ partial of its own, summed by bwd_dq), at most one per 16-key block, fewer where
 * the partials would not fit the max allocation (with `fixed` bytes beside them). */
static int bwd_ranges(const clattn_context *ctx, const clattn_problem *p, uint64_t part_bytes, uint64_t fixed)
{
    const uint64_t heads = (uint64_t)p->batch * (uint64_t)p->heads_kv, blocks = ((uint64_t)p->seq_kv + 15) / 16;
    uint64_t want = (2u * (uint64_t)(ctx->dev.compute_units ? ctx->dev.compute_units : 1) + heads - 1) / heads;
    if (want > blocks)
        want = blocks;
    if (want > 64)
        want = 64;
    while (want > 1 && (fixed + want * part_bytes > ctx->dev.max_alloc || want * part_bytes / want != part_bytes))
        want--;
    return (int)(want < 1 ? 1 : want);
}

clattn_status clattn_attention_backward(clattn_context *ctx, const clattn_attention_desc *desc,
                                        const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                                        const clattn_tensor *out, const clattn_tensor *dout,
                                        const clattn_tensor *lse, const clattn_tensor *dq, const clattn_tensor *dk,
                                        const clattn_tensor *dv, const clattn_tensor *dsinks, cl_uint num_wait,
                                        const cl_event *wait, cl_event *done)
{
    if (done && !clattn__done_in_wait(num_wait, wait, done))
        *done = NULL;
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_attention_backward: ctx must not be NULL");
    clattn__clear_error(ctx);
    if (!desc)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc must not be NULL");
    if (desc->lse)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->lse must be NULL in clattn_attention_backward: the forward's LSE is the "
                            "lse argument");
    if (desc->probabilities)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->probabilities must be NULL in clattn_attention_backward");
    if (desc->algorithm == CLATTN_ALGORITHM_UNFUSED)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "desc->algorithm UNFUSED: the backward pass is fused only (no seq_q x seq_kv buffer)");
    if (desc->score_mod)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "desc->score_mod: its derivative cannot be known from its source, so the backward "
                            "pass refuses it (mask_mod, which only hides keys, is taken)");
    if (desc->kv)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "desc->kv: paged, quantized or packed K/V have no backward pass; give plain views");
    clattn_problem p;
    clattn_status st = clattn__check_attention(ctx, desc, q, k, v, out, 2, &p);
    if (st)
        return st;
    if (p.kv.on)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "k->dtype %s / v->dtype %s: the backward pass takes K and V of the query's type",
                            clattn_dtype_name(k->dtype), clattn_dtype_name(v->dtype));
    const int64_t rows_shape[4] = {p.batch, p.heads_q, p.seq_q, 1};
    const int64_t os[4] = {p.batch, p.heads_q, p.seq_q, p.head_dim_v};
    clattn_view vdo, vl, vdq, vdk, vdv, vds = {0};
    const unsigned same = CLATTN_DTYPE_BIT(p.dtype) | CLATTN_DTYPE_BIT(CLATTN_F32);
    const int64_t qs[4] = {p.batch, p.heads_q, p.seq_q, p.head_dim};
    const int64_t ks[4] = {p.batch, p.heads_kv, p.seq_kv, p.head_dim};
    const int64_t vs[4] = {p.batch, p.heads_kv, p.seq_kv, p.head_dim_v};
    const int64_t ss[4] = {1, p.heads_q, 1, 1};
    if ((st = clattn__check_view(ctx, "dout", dout, os, CLATTN_VIEW_INPUT, CLATTN_DTYPES_ALL, &vdo)) ||
        (st = clattn__check_view(ctx, "lse", lse, rows_shape, CLATTN_VIEW_INPUT, CLATTN_DTYPE_BIT(CLATTN_F32), &vl)) ||
        (st = clattn__check_view(ctx, "dq", dq, qs, CLATTN_VIEW_OUTPUT, same, &vdq)) ||
        (st = clattn__check_view(ctx, "dk", dk, ks, CLATTN_VIEW_OUTPUT, same, &vdk)) ||
        (st = clattn__check_view(ctx, "dv", dv, vs, CLATTN_VIEW_OUTPUT, same, &vdv)))
        return st;
    if (dsinks) {
        if (!desc->sinks)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "dsinks is given without desc->sinks");
        if ((st = clattn__check_view(ctx, "dsinks", dsinks, ss, CLATTN_VIEW_OUTPUT, CLATTN_DTYPE_BIT(CLATTN_F32),
                                     &vds)))
            return st;
    }
    /* The outputs are written while every input is read: none may share storage with another. */
    const clattn_tensor *outs[4] = {dq, dk, dv, dsinks};
    const char *const out_names[4] = {"dq", "dk", "dv", "dsinks"};
    const clattn_tensor *ins[13] = {q, k, v, out, dout, lse, desc->mask, desc->sinks, desc->alibi_slopes,
                                    dq, dk, dv, dsinks};
    const char *const in_names[13] = {"q", "k", "v", "out", "dout", "lse", "desc->mask", "desc->sinks",
                                      "desc->alibi_slopes", "dq", "dk", "dv", "dsinks"};
    for (int i = 0; i < 4; i++) {
        if (!outs[i])
            continue;
        const char *hit = clattn__first_overlap(outs[i], 9 + i, ins, in_names);
        if (hit)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                hit == in_names[9] || hit == in_names[10]
                                    ? "%s overlaps %s: their byte ranges meet (gradients interleaved in one "
                                      "range, as a packed [B][S][3][H][D] dqkv, are refused; docs/training.md)"
                                    : "%s overlaps %s",
                                out_names[i], hit);
        if (desc->kv_lengths && clattn__kvlen_overlaps(desc->kv_lengths, p.batch, outs[i]))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s overlaps desc->kv_lengths", out_names[i]);
    }
    if ((st = clattn__check_wait(ctx, num_wait, wait, done)))
        return st;

    /* Workspace, f32: q and dout rows (DPK, DPV wide), D and the sinks' shares per row, then the
     * G dQ partials. */
    const int dk16 = (int)((p.head_dim + 15) / 16), dv16 = (int)((p.head_dim_v + 15) / 16);
    const uint64_t rows = (uint64_t)p.batch * (uint64_t)p.heads_q * (uint64_t)p.seq_q;
    const uint64_t dpk = 16u * (uint64_t)dk16, dpv = 16u * (uint64_t)dv16;
    const uint64_t fixed = rows * (dpk + dpv + 2u) * 4u, part = rows * dpk * 4u;
    if (fixed + part > ctx->dev.max_alloc)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "the backward pass needs a %.4g-byte workspace (f32 rows of q, dout and dq), more "
                            "than the device's max allocation of %llu bytes; split the batch or the heads",
                            (double)(fixed + part), (unsigned long long)ctx->dev.max_alloc);
    const int G = bwd_ranges(ctx, &p, part, fixed);
    const int has_dsink = dsinks != NULL;

    clattn__variant_enter(ctx, &p);
    char opts[512];
    bwd_options(ctx, opts, sizeof opts, (int)p.dtype, (int)p.out.dtype, (int)vdo.dtype, (int)vdq.dtype,
                (int)vdk.dtype, (int)vdv.dtype, p.has_mask ? (int)p.mask.dtype : 0, dk16, dv16, p.drop.on,
                " -DK_bwd_pre=1 -DK_bwd_main=1 -DK_bwd_dq=1 -DK_bwd_dsinks=1");
    /* Every kernel is built and the workspace had before anything is enqueued. */
    cl_kernel kpre, kmain, kdq, kds = NULL;
    cl_mem ws = NULL;
    if ((st = clattn__get_kernel(ctx, "backward.cl", opts, "bwd_pre", &kpre)) ||
        (st = clattn__get_kernel(ctx, "backward.cl", opts, "bwd_main", &kmain)) ||
        (st = clattn__get_kernel(ctx, "backward.cl", opts, "bwd_dq", &kdq)) ||
        (has_dsink && (st = clattn__get_kernel(ctx, "backward.cl", opts, "bwd_dsinks", &kds))) ||
        (st = clattn__workspace(ctx, fixed + (uint64_t)G * part, &ws))) {
        clattn__variant_leave(ctx);
        return st;
    }
    clattn__variant_leave(ctx);
    /* The workspace's parts by element offset: q rows, dout rows, D, the sinks' shares, the dQ
     * partials. */
    const cl_ulong at[5] = {0, rows * dpk, rows * (dpk + dpv), rows * (dpk + dpv + 1), rows * (dpk + dpv + 2)};
    const int heads_q = (int)p.heads_q, seq_q = (int)p.seq_q, seq_kv = (int)p.seq_kv, hkv = (int)p.heads_kv,
              group = (int)(p.heads_q / p.heads_kv), D = (int)p.head_dim, DV = (int)p.head_dim_v,
              causal = p.causal, has_mask = p.has_mask;
    const cl_ulong rows_ul = rows;
    size_t global[3], local[3];
    st = CLATTN_SUCCESS;
    if (!st) { /* bwd_pre */
        const int ny = clattn__row_grid(ctx, 1, 1, (int64_t)rows, global, local);
        const cl_mem sb = p.var.sinks.buffer;
        const cl_ulong soff = p.var.sinks.offset, ssh = p.var.sinks.stride[1];
        clattn_args a = {kpre, 0, CL_SUCCESS};
        clattn__arg_view(&a, &p.q);
        clattn__arg_view(&a, &p.out);
        clattn__arg_view(&a, &vdo);
        clattn__arg_view(&a, &vl);
        clattn__arg(&a, sizeof(cl_mem), &ws);
        for (int i = 0; i < 4; i++)
            clattn__arg(&a, sizeof(cl_ulong), &at[i]);
        clattn__arg(&a, sizeof(int), &heads_q);
        clattn__arg(&a, sizeof(int), &seq_q);
        clattn__arg(&a, sizeof(int), &D);
        clattn__arg(&a, sizeof(int), &DV);
        clattn__arg(&a, sizeof(int), &has_dsink);
        clattn__arg(&a, sizeof(cl_mem), sb ? &sb : NULL);
        clattn__arg(&a, sizeof(cl_ulong), &soff);
        clattn__arg(&a, sizeof(cl_ulong), &ssh);
        clattn__arg(&a, sizeof(cl_ulong), &rows_ul);
        clattn__arg(&a, sizeof(int), &ny);
        st = clattn__enqueue(ctx, &a, 3, global, local, num_wait, wait, NULL, "bwd_pre");
    }
    if (!st) { /* bwd_main */
        clattn_args a = {kmain, 0, CL_SUCCESS};
        clattn__arg_view(&a, &p.k);
        clattn__arg_view(&a, &p.v);
        clattn__arg_view(&a, &vdk);
        clattn__arg_view(&a, &vdv);
        clattn__arg_view(&a, &vl);
        clattn__arg_view(&a, has_mask ? &p.mask : NULL);
        clattn__arg(&a, sizeof(cl_mem), p.kv_lengths ? &p.kv_lengths : NULL);
        clattn__arg(&a, sizeof(cl_mem), &ws);
        clattn__arg(&a, sizeof(cl_ulong), &at[0]);
        clattn__arg(&a, sizeof(cl_ulong), &at[1]);
        clattn__arg(&a, sizeof(cl_ulong), &at[2]);
        clattn__arg(&a, sizeof(cl_ulong), &at[4]);
        clattn__arg(&a, sizeof(int), &seq_q);
        clattn__arg(&a, sizeof(int), &seq_kv);
        clattn__arg(&a, sizeof(int), &hkv);
        clattn__arg(&a, sizeof(int), &group);
        clattn__arg(&a, sizeof(int), &D);
        clattn__arg(&a, sizeof(int), &DV);
        clattn__arg(&a, sizeof(int), &causal);
        clattn__arg(&a, sizeof(int), &has_mask);
        clattn__arg(&a, sizeof(int), &G);
        clattn__arg(&a, sizeof(cl_ulong), &rows_ul);
        clattn__arg(&a, sizeof(float), &p.scale);
        clattn__variant_args(&a, &p);
        clattn__dropout_args(&a, &p);
        const size_t g1[3] = {(size_t)G * (size_t)p.batch * (size_t)p.heads_kv, 1, 1}, l1[3] = {1, 1, 1};
        st = clattn__enqueue(ctx, &a, 1, g1, l1, 0, NULL, NULL, "bwd_main");
    }
    if (!st) { /* bwd_dq */
        const int wg = ctx->dev.max_wg >= 16 ? 16 : 1;
        const int ny = clattn__row_grid(ctx, wg, p.head_dim, (int64_t)rows, global, local);
        clattn_args a = {kdq, 0, CL_SUCCESS};
        clattn__arg(&a, sizeof(cl_mem), &ws);
        clattn__arg(&a, sizeof(cl_ulong), &at[4]);
        clattn__arg(&a, sizeof(cl_mem), &vdq.buffer);
        clattn__arg(&a, sizeof(cl_ulong), &vdq.offset);
        clattn__arg(&a, sizeof(cl_ulong), &vdq.stride[0]);
        clattn__arg(&a, sizeof(cl_ulong), &vdq.stride[1]);
        clattn__arg(&a, sizeof(cl_ulong), &vdq.stride[2]);
        clattn__arg(&a, sizeof(int), &heads_q);
        clattn__arg(&a, sizeof(int), &seq_q);
        clattn__arg(&a, sizeof(int), &D);
        clattn__arg(&a, sizeof(cl_ulong), &rows_ul);
        clattn__arg(&a, sizeof(int), &G);
        clattn__arg(&a, sizeof(int), &ny);
        st = clattn__enqueue(ctx, &a, 3, global, local, 0, NULL, has_dsink ? NULL : done, "bwd_dq");
    }
    if (!st && has_dsink) { /* bwd_dsinks */
        const int batch = (int)p.batch;
        clattn_args a = {kds, 0, CL_SUCCESS};
        clattn__arg(&a, sizeof(cl_mem), &ws);
        clattn__arg(&a, sizeof(cl_ulong), &at[3]);
        clattn__arg(&a, sizeof(cl_mem), &vds.buffer);
        clattn__arg(&a, sizeof(cl_ulong), &vds.offset);
        clattn__arg(&a, sizeof(cl_ulong), &vds.stride[1]);
        clattn__arg(&a, sizeof(int), &batch);
        clattn__arg(&a, sizeof(int), &heads_q);
        clattn__arg(&a, sizeof(int), &seq_q);
        const size_t g1[3] = {(size_t)p.heads_q, 1, 1};
        st = clattn__enqueue(ctx, &a, 1, g1, NULL, 0, NULL, done, "bwd_dsinks");
    }
    return st;
}
