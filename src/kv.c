/* K and V as a KV cache stores them (docs/kvcache.md): paged pools addressed through a block
 * table, the KV-cache storage types (int8 with per-token scales, fp8 with per-tensor scales,
 * ggml's q8_0 and q4_0), which the fused kernels read and decode in place (cl/kv_access.cl), and
 * sequences of different lengths packed end to end (varlen). */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int clattn__kv_type(clattn_dtype dtype)
{
    return dtype >= CLATTN_I8 && dtype <= CLATTN_Q4_0;
}

static const char *name_of(clattn_dtype d)
{
    const char *n = clattn_dtype_name(d);
    return n ? n : "unknown";
}

/* The scales of one of K and V: an int8 table (required for I8, refused otherwise), an fp8
 * per-tensor scale (0 means 1; only for fp8). `shape` is the K or V view's with dim 1. */
static clattn_status check_scales(clattn_context *ctx, const char *which, clattn_dtype dt,
                                  const clattn_tensor *table, float fs, const int64_t shape[4],
                                  clattn_view *view, float *scale)
{
    char name[32];
    snprintf(name, sizeof name, "desc->kv->%s_scales", which);
    memset(view, 0, sizeof *view);
    *scale = 1.0f;
    if (dt == CLATTN_I8) {
        if (!table)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "%s is i8: %s (f32, one scale per token and kv head) is required", which, name);
        const int64_t want[4] = {shape[0], shape[1], shape[2], 1};
        clattn_status st = clattn__check_view(ctx, name, table, want, CLATTN_VIEW_INPUT,
                                              CLATTN_DTYPE_BIT(CLATTN_F32), view);
        if (st)
            return st;
    } else if (table) {
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s is given but %s is %s, not i8", name, which,
                            name_of(dt));
    }
    if (fs != 0.0f) {
        if (dt != CLATTN_FP8_E4M3 && dt != CLATTN_FP8_E5M2)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->kv->%s_scale is %g but %s is %s: only fp8 takes a per-tensor scale",
                                which, (double)fs, which, name_of(dt));
        if (!isfinite(fs) || fs < 0.0f)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->kv->%s_scale must be finite and positive (got %g)", which, (double)fs);
        *scale = fs;
    }
    return CLATTN_SUCCESS;
}

clattn_status clattn__check_kv(clattn_context *ctx, const clattn_attention_desc *desc, const clattn_tensor *k,
                               const clattn_tensor *v, clattn_problem *p)
{
    static const clattn_kv_layout none;
    const clattn_kv_layout *kv = desc->kv ? desc->kv : &none;
    clattn_kvstore *s = &p->kv;
    memset(s, 0, sizeof *s);
    for (size_t i = 0; i < sizeof kv->reserved / sizeof kv->reserved[0]; i++)
        if (kv->reserved[i] != 0)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->kv->reserved[%zu] is %lld: the reserved fields must be zero", i,
                                (long long)kv->reserved[i]);
    if (!k || !v)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s must not be NULL", k ? "v" : "k");
    const int64_t dv = p->head_dim_v;
    int64_t ks[4] = {p->batch, p->heads_kv, p->seq_kv, p->head_dim};
    int64_t vs[4] = {p->batch, p->heads_kv, p->seq_kv, dv};
    if (kv->page_size < 0 || kv->page_size > CLATTN_MAX_SEQ)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->kv->page_size must be 0 .. %lld (got %lld)",
                            (long long)CLATTN_MAX_SEQ, (long long)kv->page_size);
    /* Packed sequences: cu_seqlens of batch + 1 int32 each; packed K and V are [1][heads_kv][total_k][.]. */
    if (kv->cu_seqlens_q || kv->cu_seqlens_k) {
        clattn_status st;
        if ((kv->cu_seqlens_q &&
             (st = clattn__check_ints(ctx, kv->cu_seqlens_q, "desc->kv->cu_seqlens_q", (uint64_t)p->batch + 1))) ||
            (kv->cu_seqlens_k &&
             (st = clattn__check_ints(ctx, kv->cu_seqlens_k, "desc->kv->cu_seqlens_k", (uint64_t)p->batch + 1))))
            return st;
        if (kv->cu_seqlens_k && kv->page_size)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->kv->cu_seqlens_k with page_size %lld: paged keys are addressed by the block "
                                "table (give each batch's length in desc->kv_lengths)",
                                (long long)kv->page_size);
        s->varlen = 1;
        s->cu_q = kv->cu_seqlens_q;
        s->cu_k = kv->cu_seqlens_k;
        if (kv->cu_seqlens_k) {
            const int64_t total = k->shape[2];
            if (total < 1 || total > 0x7fffffffLL)
                return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                    "desc->kv->cu_seqlens_k: k->shape[2] holds the packed keys, 1 .. %d (got %lld)",
                                    0x7fffffff, (long long)total);
            ks[0] = vs[0] = 1;
            ks[2] = vs[2] = total;
            s->total_k = (int)total;
        }
    }
    if (kv->page_size == 0) {
        if (kv->block_table || kv->block_table_offset || kv->block_table_stride)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->kv->block_table, block_table_offset and block_table_stride need "
                                "page_size > 0 (paged KV)");
    } else {
        /* Pools: [pages][heads_kv][page_size][dim], any number of pages (at most INT_MAX: the
         * kernels clamp page indices in int). */
        const int64_t page = kv->page_size;
        const int64_t blocks = (p->seq_kv + page - 1) / page;
        if (k->shape[0] < 1 || k->shape[0] > 0x7fffffffLL || v->shape[0] < 1 || v->shape[0] > 0x7fffffffLL)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "paged KV: k->shape[0] and v->shape[0] are the pools' pages, 1 .. %d (got %lld "
                                "and %lld)", 0x7fffffff, (long long)k->shape[0], (long long)v->shape[0]);
        ks[0] = k->shape[0];
        vs[0] = v->shape[0];
        ks[2] = vs[2] = page;
        if (!kv->block_table)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->kv->page_size is %lld but block_table is NULL",
                                (long long)page);
        if (kv->block_table_offset < 0)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->kv->block_table_offset is negative (%lld)",
                                (long long)kv->block_table_offset);
        if (p->batch > 1 && kv->block_table_stride < blocks)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->kv->block_table_stride (%lld) is less than the %lld pages seq_kv %lld "
                                "spans at page_size %lld",
                                (long long)kv->block_table_stride, (long long)blocks, (long long)p->seq_kv,
                                (long long)page);
        uint64_t hi;
        if (!clattn__mul_ok((uint64_t)(p->batch - 1), (uint64_t)(p->batch > 1 ? kv->block_table_stride : 0), &hi) ||
            !clattn__add_ok(hi, (uint64_t)kv->block_table_offset, &hi) || !clattn__add_ok(hi, (uint64_t)blocks, &hi) ||
            hi > ((uint64_t)1 << 60))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->kv->block_table: offset + strides overflow");
        clattn_status st = clattn__check_ints(ctx, kv->block_table, "desc->kv->block_table", hi);
        if (st)
            return st;
        s->page = (int)page;
        s->bt = kv->block_table;
        s->bt_off = (cl_ulong)kv->block_table_offset;
        s->bt_sb = (cl_ulong)(p->batch > 1 ? kv->block_table_stride : 0);
        s->bt_hi = hi;
        s->k_np = (int)k->shape[0];
        s->v_np = (int)v->shape[0];
    }
    const unsigned ktypes = CLATTN_DTYPE_BIT(p->dtype) | 0xf8u, vtypes = ktypes;
    clattn_status st;
    if ((st = clattn__check_view(ctx, "k", k, ks, CLATTN_VIEW_INPUT, ktypes, &p->k)) ||
        (st = clattn__check_view(ctx, "v", v, vs, CLATTN_VIEW_INPUT, vtypes, &p->v)) ||
        (st = check_scales(ctx, "k", k->dtype, kv->k_scales, kv->k_scale, ks, &s->ks, &s->k_fs)) ||
        (st = check_scales(ctx, "v", v->dtype, kv->v_scales, kv->v_scale, vs, &s->vs, &s->v_fs)))
        return st;
    s->kt = k->dtype;
    s->vt = v->dtype;
    s->on = s->page > 0 || clattn__kv_type(s->kt) || clattn__kv_type(s->vt) || s->varlen;
    return CLATTN_SUCCESS;
}

void clattn__kv_options(const clattn_problem *p, char *buf, size_t size)
{
    if (!p->kv.on) {
        if (size)
            buf[0] = '\0';
        return;
    }
    snprintf(buf, size, " -DKVC=1 -DPAGE=%d -DDT_K=%d -DDT_V=%d -DVARLEN=%d", p->kv.page, (int)p->kv.kt,
             (int)p->kv.vt, p->kv.varlen);
}

void clattn__kv_args(clattn_args *a, const clattn_problem *p)
{
    const clattn_kvstore *s = &p->kv;
    if (!s->on)
        return;
    clattn__arg(a, sizeof(cl_mem), s->bt ? &s->bt : NULL);
    clattn__arg(a, sizeof(cl_ulong), &s->bt_off);
    clattn__arg(a, sizeof(cl_ulong), &s->bt_sb);
    clattn__arg(a, sizeof(int), &s->k_np);
    clattn__arg(a, sizeof(int), &s->v_np);
    const clattn_view *sc[2] = {&s->ks, &s->vs};
    for (int i = 0; i < 2; i++) {
        clattn__arg(a, sizeof(cl_mem), sc[i]->buffer ? &sc[i]->buffer : NULL);
        clattn__arg(a, sizeof(cl_ulong), &sc[i]->offset);
        for (int d = 0; d < 3; d++)
            clattn__arg(a, sizeof(cl_ulong), &sc[i]->stride[d]);
    }
    clattn__arg(a, sizeof(float), &s->k_fs);
    clattn__arg(a, sizeof(float), &s->v_fs);
    clattn__arg(a, sizeof(cl_mem), s->cu_q ? &s->cu_q : NULL);
    clattn__arg(a, sizeof(cl_mem), s->cu_k ? &s->cu_k : NULL);
    clattn__arg(a, sizeof(int), &s->total_q);
    clattn__arg(a, sizeof(int), &s->total_k);
}
