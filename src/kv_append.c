/* clattn_kv_append (docs/kv-append.md): rotary embedding of the new tokens' q and k, and the store
 * of k and v into a contiguous, paged or quantized KV cache (cl/kv_append.cl). Every argument is
 * checked and every kernel built before the first launch, so a refusal leaves the caller's
 * buffers as they were. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Counts that go into int kernel arguments. */
#define MAX_EXTENT 0x7fffffffLL

static const char *dt_name(clattn_dtype d)
{
    const char *name = clattn_dtype_name(d);
    return name ? name : "unknown";
}

static clattn_status check_size(clattn_context *ctx, const char *name, int64_t v, int64_t lo, int64_t max,
                                clattn_status above)
{
    if (v < lo)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->%s must be at least %lld (got %lld)", name,
                            (long long)lo, (long long)v);
    if (v > max)
        return clattn__fail(ctx, above, "desc->%s is too large (%lld > %lld)", name, (long long)v,
                            (long long)max);
    return CLATTN_SUCCESS;
}

/* A checked call, as the kernels take it. */
typedef struct append_plan {
    int64_t B, Hq, Hkv, S, D, Dv, RD;
    int style;
    float lhi, llo; /* log2(theta) as a pair of floats */
    int has_q, q_identity;
    clattn_view q, qo, k, v, kc, vc, ks, vs, tc, ts;
    int has_table, trows;
    int paged;
    int64_t page, nrows; /* paged: page size and slots in the pools; else 1 and max_seq */
    cl_mem pos, slot;
    float kdiv, vdiv; /* fp8 divisors */
} append_plan;

static clattn_status check_layout(clattn_context *ctx, const clattn_kv_append_desc *desc,
                                  const clattn_tensor *k_cache, const clattn_tensor *v_cache, append_plan *p)
{
    const clattn_kv_layout *kv = desc->kv;
    if (kv) {
        for (size_t i = 0; i < sizeof kv->reserved / sizeof kv->reserved[0]; i++)
            if (kv->reserved[i] != 0)
                return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                    "desc->kv->reserved[%zu] is %lld: the reserved fields must be zero", i,
                                    (long long)kv->reserved[i]);
        if (kv->page_size < 0 || kv->page_size > MAX_EXTENT)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->kv->page_size is out of range (%lld)",
                                (long long)kv->page_size);
        /* A packed cache's rows move with every sequence's length: the append writes plain or
         * paged caches only, and says so rather than write a packed one as if it were plain. */
        if (kv->cu_seqlens_q || kv->cu_seqlens_k)
            return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                                "desc->kv->%s is given: the append writes plain or paged caches, not packed "
                                "(varlen) ones",
                                kv->cu_seqlens_k ? "cu_seqlens_k" : "cu_seqlens_q");
    }
    p->paged = kv && kv->page_size > 0;
    if (p->paged && !desc->slot_mapping)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->slot_mapping is NULL but desc->kv->page_size is %lld (paged caches need it)",
                            (long long)kv->page_size);
    if (!p->paged && desc->slot_mapping)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->slot_mapping is given but the caches are not paged (desc->kv %s)",
                            kv ? "has page_size 0" : "is NULL");
    if (!k_cache || !v_cache)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s must not be NULL", !k_cache ? "k_cache" : "v_cache");
    /* The extent the caller chooses: pages of the pools, or rows of the contiguous cache. */
    const int lead = p->paged ? 0 : 2;
    const char *what = p->paged ? "pages" : "max_seq";
    const clattn_tensor *const caches[2] = {k_cache, v_cache};
    for (int i = 0; i < 2; i++)
        if (caches[i]->shape[lead] < 1 || caches[i]->shape[lead] > MAX_EXTENT)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s->shape[%d] (%s) is out of range (%lld)",
                                i ? "v_cache" : "k_cache", lead, what, (long long)caches[i]->shape[lead]);
    if (v_cache->shape[lead] != k_cache->shape[lead])
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "v_cache->shape[%d] (%s, %lld) differs from k_cache's (%lld)",
                            lead, what, (long long)v_cache->shape[lead], (long long)k_cache->shape[lead]);
    const int64_t n = k_cache->shape[lead];
    p->page = p->paged ? kv->page_size : 1;
    p->nrows = p->paged ? n * kv->page_size : n;
    int64_t ks[4] = {p->B, p->Hkv, n, p->D}, vs[4] = {p->B, p->Hkv, n, p->Dv};
    if (p->paged) {
        ks[0] = vs[0] = n;
        ks[2] = vs[2] = kv->page_size;
    }
    clattn_status st;
    if ((st = clattn__check_view(ctx, "k_cache", k_cache, ks, CLATTN_VIEW_OUTPUT, CLATTN_DTYPES_KV, &p->kc)) ||
        (st = clattn__check_view(ctx, "v_cache", v_cache, vs, CLATTN_VIEW_OUTPUT, CLATTN_DTYPES_KV, &p->vc)))
        return st;

    /* Scales: int8 per (token, kv head) views; fp8 per tensor. */
    const int k_i8 = k_cache->dtype == CLATTN_I8, v_i8 = v_cache->dtype == CLATTN_I8;
    const int k_fp8 = k_cache->dtype == CLATTN_FP8_E4M3 || k_cache->dtype == CLATTN_FP8_E5M2;
    const int v_fp8 = v_cache->dtype == CLATTN_FP8_E4M3 || v_cache->dtype == CLATTN_FP8_E5M2;
    const float fs[2] = {kv ? kv->k_scale : 0.0f, kv ? kv->v_scale : 0.0f};
    const int fp8[2] = {k_fp8, v_fp8};
    const clattn_tensor *const sc[2] = {kv ? kv->k_scales : NULL, kv ? kv->v_scales : NULL};
    const int i8[2] = {k_i8, v_i8};
    const char *const kvn[2] = {"k", "v"};
    for (int i = 0; i < 2; i++) {
        if (i8[i] && !sc[i])
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s_cache is i8 but desc->kv%s is NULL (i8 needs its scales)",
                                kvn[i], !kv ? "" : i ? "->v_scales" : "->k_scales");
        if (sc[i] && !i8[i])
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->kv->%s_scales is given but %s_cache is %s (only i8 caches have per-token scales)",
                                kvn[i], kvn[i], dt_name(caches[i]->dtype));
        if (fs[i] != 0.0f && !fp8[i])
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->kv->%s_scale is %g but %s_cache is %s (the per-tensor scale is for fp8 only)",
                                kvn[i], (double)fs[i], kvn[i], dt_name(caches[i]->dtype));
        if (!isfinite(fs[i]) || fs[i] < 0.0f)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->kv->%s_scale is %g: it must be positive and finite (0 means 1)", kvn[i],
                                (double)fs[i]);
    }
    p->kdiv = fs[0] != 0.0f ? fs[0] : 1.0f;
    p->vdiv = fs[1] != 0.0f ? fs[1] : 1.0f;
    int64_t ss[4] = {ks[0], ks[1], ks[2], 1};
    if (k_i8 && (st = clattn__check_view(ctx, "desc->kv->k_scales", kv->k_scales, ss, CLATTN_VIEW_OUTPUT,
                                         CLATTN_DTYPE_BIT(CLATTN_F32), &p->ks)))
        return st;
    if (v_i8 && (st = clattn__check_view(ctx, "desc->kv->v_scales", kv->v_scales, ss, CLATTN_VIEW_OUTPUT,
                                         CLATTN_DTYPE_BIT(CLATTN_F32), &p->vs)))
        return st;
    return CLATTN_SUCCESS;
}

static clattn_status check_rope(clattn_context *ctx, const clattn_kv_append_desc *desc, append_plan *p)
{
    const int has_tables = desc->rope_cos || desc->rope_sin;
    if (desc->rope == CLATTN_ROPE_NONE) {
        if (desc->rope_dims != 0 || desc->rope_theta != 0.0f || has_tables)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->rope is CLATTN_ROPE_NONE but %s is set (rotation parameters need a rope style)",
                                desc->rope_dims ? "desc->rope_dims"
                                : desc->rope_theta != 0.0f ? "desc->rope_theta"
                                : desc->rope_cos ? "desc->rope_cos" : "desc->rope_sin");
        p->style = 0;
        p->RD = 0;
        return CLATTN_SUCCESS;
    }
    if (desc->rope != CLATTN_ROPE_INTERLEAVED && desc->rope != CLATTN_ROPE_NEOX)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->rope %d is not a clattn_rope", (int)desc->rope);
    p->style = (int)desc->rope;
    p->RD = desc->rope_dims ? desc->rope_dims : p->D;
    if (desc->rope_dims < 0 || p->RD % 2 != 0 || p->RD > p->D)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->rope_dims is %lld: it must be even and at most head_dim (%lld), 0 meaning head_dim",
                            (long long)desc->rope_dims, (long long)p->D);
    if (!isfinite(desc->rope_theta) || desc->rope_theta < 0.0f)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->rope_theta is %g: it must be positive and finite (0 means 10000)",
                            (double)desc->rope_theta);
    if (has_tables) {
        if (!desc->rope_cos || !desc->rope_sin)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->%s is given without desc->%s (both or neither)",
                                desc->rope_cos ? "rope_cos" : "rope_sin", desc->rope_cos ? "rope_sin" : "rope_cos");
        if (desc->rope_theta != 0.0f)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->rope_theta is %g but the tables desc->rope_cos / rope_sin replace it (give 0)",
                                (double)desc->rope_theta);
        const int64_t P = desc->rope_cos->shape[2];
        if (P < 1 || P > MAX_EXTENT)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->rope_cos->shape[2] (positions) is out of range (%lld)",
                                (long long)P);
        const int64_t ts[4] = {1, 1, P, p->RD / 2};
        clattn_status st;
        if ((st = clattn__check_view(ctx, "desc->rope_cos", desc->rope_cos, ts, CLATTN_VIEW_INPUT,
                                     CLATTN_DTYPE_BIT(CLATTN_F32), &p->tc)) ||
            (st = clattn__check_view(ctx, "desc->rope_sin", desc->rope_sin, ts, CLATTN_VIEW_INPUT,
                                     CLATTN_DTYPE_BIT(CLATTN_F32), &p->ts)))
            return st;
        p->has_table = 1;
        p->trows = (int)P;
        return CLATTN_SUCCESS;
    }
    const double L = log2(desc->rope_theta != 0.0f ? (double)desc->rope_theta : 10000.0);
    p->lhi = (float)L;
    p->llo = (float)(L - (double)p->lhi);
    return CLATTN_SUCCESS;
}

/* The shapes, the rotation, the tensors and the layout; fills p. */
static clattn_status check_append(clattn_context *ctx, const clattn_kv_append_desc *desc, const clattn_tensor *q,
                                  const clattn_tensor *k_new, const clattn_tensor *v_new, const clattn_tensor *q_out,
                                  const clattn_tensor *k_cache, const clattn_tensor *v_cache, append_plan *p)
{
    memset(p, 0, sizeof *p);
    if (!desc)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc must not be NULL");
    clattn_status st;
    if ((st = check_size(ctx, "batch", desc->batch, 1, MAX_EXTENT, CLATTN_INVALID_ARGUMENT)) ||
        (st = check_size(ctx, "heads_q", desc->heads_q, 0, MAX_EXTENT, CLATTN_INVALID_ARGUMENT)) ||
        (st = check_size(ctx, "heads_kv", desc->heads_kv, 1, MAX_EXTENT, CLATTN_INVALID_ARGUMENT)) ||
        (st = check_size(ctx, "seq_new", desc->seq_new, 1, CLATTN_MAX_SEQ, CLATTN_INVALID_ARGUMENT)) ||
        (st = check_size(ctx, "head_dim", desc->head_dim, 1, CLATTN_MAX_HEAD_DIM, CLATTN_UNSUPPORTED)) ||
        (st = check_size(ctx, "head_dim_v", desc->head_dim_v, 0, CLATTN_MAX_HEAD_DIM_V, CLATTN_UNSUPPORTED)))
        return st;
    p->B = desc->batch;
    p->Hq = desc->heads_q;
    p->Hkv = desc->heads_kv;
    p->S = desc->seq_new;
    p->D = desc->head_dim;
    p->Dv = desc->head_dim_v ? desc->head_dim_v : desc->head_dim;
    /* The kernels number the rows of a launch, and the slots of slot_mapping, with int. */
    const uint64_t bs = (uint64_t)p->B * (uint64_t)p->S;
    if (bs > (uint64_t)MAX_EXTENT || bs * (uint64_t)p->Hkv > (uint64_t)MAX_EXTENT ||
        bs * (uint64_t)p->Hq > (uint64_t)MAX_EXTENT)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->batch x max(heads_q, heads_kv) x seq_new (%lld x %lld x %lld) exceeds %lld",
                            (long long)p->B, (long long)(p->Hq > p->Hkv ? p->Hq : p->Hkv), (long long)p->S,
                            MAX_EXTENT);
    if ((st = clattn__check_reserved(ctx, desc->reserved, sizeof desc->reserved / sizeof desc->reserved[0])))
        return st;
    if ((st = check_rope(ctx, desc, p)))
        return st;

    /* q and q_out: both or neither, with heads_q. */
    if (!q != !q_out)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s is NULL but %s is not (both or neither)",
                            q ? "q_out" : "q", q ? "q" : "q_out");
    if (!q && p->Hq != 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "q and q_out are NULL but desc->heads_q is %lld (give 0)",
                            (long long)p->Hq);
    if (q && p->Hq == 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->heads_q is 0 but q is given");
    p->has_q = q != NULL;
    const int64_t qs[4] = {p->B, p->Hq, p->S, p->D}, kn[4] = {p->B, p->Hkv, p->S, p->D},
                  vn[4] = {p->B, p->Hkv, p->S, p->Dv};
    if (q && ((st = clattn__check_view(ctx, "q", q, qs, CLATTN_VIEW_INPUT, CLATTN_DTYPES_ALL, &p->q)) ||
              (st = clattn__check_view(ctx, "q_out", q_out, qs, CLATTN_VIEW_OUTPUT, CLATTN_DTYPES_ALL, &p->qo))))
        return st;
    if ((st = clattn__check_view(ctx, "k_new", k_new, kn, CLATTN_VIEW_INPUT, CLATTN_DTYPES_ALL, &p->k)))
        return st;
    if (v_new && v_new->dtype != k_new->dtype)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "v_new->dtype (%s) differs from k_new->dtype (%s)",
                            dt_name(v_new->dtype), dt_name(k_new->dtype));
    if ((st = clattn__check_view(ctx, "v_new", v_new, vn, CLATTN_VIEW_INPUT, CLATTN_DTYPES_ALL, &p->v)))
        return st;
    if ((st = check_layout(ctx, desc, k_cache, v_cache, p)))
        return st;

    /* Outputs overlap neither inputs nor each other; q_out may be q itself (in place). */
    const clattn_kv_layout *kv = desc->kv;
    const clattn_tensor *outs[5] = {q ? q_out : NULL, k_cache, v_cache, p->ks.buffer ? kv->k_scales : NULL,
                                    p->vs.buffer ? kv->v_scales : NULL};
    const char *const out_names[5] = {"q_out", "k_cache", "v_cache", "desc->kv->k_scales", "desc->kv->v_scales"};
    const clattn_tensor *ins[5] = {q, k_new, v_new, desc->rope_cos, desc->rope_sin};
    const char *const in_names[5] = {"q", "k_new", "v_new", "desc->rope_cos", "desc->rope_sin"};
    if (q && clattn__views_overlap(q_out, q)) {
        if (!clattn__same_view(&p->qo, &p->q))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "q_out overlaps q without being the same view (in place needs the same buffer, "
                                "offset, strides and dtype)");
        p->q_identity = p->style == 0;
        ins[0] = NULL;
    }
    for (int i = 0; i < 5; i++) {
        if (!outs[i])
            continue;
        const char *hit = clattn__first_overlap(outs[i], 5, ins, in_names);
        if (hit)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s overlaps %s (an input)", out_names[i], hit);
        for (int j = i + 1; j < 5; j++)
            if (outs[j] && clattn__views_overlap(outs[i], outs[j]))
                return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s overlaps %s (both outputs)", out_names[i],
                                    out_names[j]);
        ins[0] = q; /* only q_out may share q's elements */
    }

    /* The int32 arrays: read, never written, so no output may hold them. */
    const cl_mem ints[2] = {desc->positions, desc->slot_mapping};
    const char *const int_names[2] = {"desc->positions", "desc->slot_mapping"};
    const int64_t counts[2] = {p->B, p->B * p->S};
    for (int i = 0; i < 2; i++) {
        if (!ints[i])
            continue;
        if ((st = clattn__check_ints(ctx, ints[i], int_names[i], (uint64_t)counts[i])))
            return st;
        for (int j = 0; j < 5; j++)
            if (outs[j] && clattn__kvlen_overlaps(ints[i], counts[i], outs[j]))
                return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s overlaps %s (an output)", int_names[i],
                                    out_names[j]);
    }
    p->pos = desc->positions;
    p->slot = desc->slot_mapping;
    return CLATTN_SUCCESS;
}

/* The three kernels come from one program (cl/kv_append.cl: the types are arguments). Division
 * correctly rounded where the device offers it: the quantizers' d = amax / 127 and 1 / d must be
 * ggml's to give its bytes (OpenCL otherwise allows 2.5 ulp). */
static clattn_status get_kernel(clattn_context *ctx, const char *name, cl_kernel *k, int *wg, int64_t cols)
{
    cl_device_fp_config fp = 0;
    if (clGetDeviceInfo(ctx->device, CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL) != CL_SUCCESS)
        fp = 0;
    char opts[200];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DKSEL=1 -DK_ap_elem=1 -DK_ap_block=1 -DK_ap_i8=1%s",
             (fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) ? " -cl-fp32-correctly-rounded-divide-sqrt" : "");
    clattn_status st = clattn__get_kernel(ctx, "kv_append.cl", opts, name, k);
    if (st)
        return st;
    /* Work-groups of up to 64 work-items along the row, fewer for short rows (blocks). */
    size_t kwg = 0;
    if (clGetKernelWorkGroupInfo(*k, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) != CL_SUCCESS ||
        kwg == 0)
        kwg = 1;
    int w = 1;
    while (w < 64 && w < cols)
        w *= 2;
    while ((size_t)w > kwg || (size_t)w > ctx->dev.max_wg)
        w /= 2;
    *wg = w < 1 ? 1 : w;
    return CLATTN_SUCCESS;
}

/* One launch: rows of src (heads, D, rotated as style / RD) into dst (mode 0: the same rows,
 * 1: cache rows at the positions, 2: slots). */
typedef struct launch {
    const clattn_view *src, *dst, *scales;
    int64_t heads, D, RD;
    int style, mode;
    float div;
} launch;

static clattn_status run(clattn_context *ctx, const append_plan *p, const launch *l, cl_uint num_wait,
                         const cl_event *wait, cl_event *done)
{
    const clattn_dtype dt = l->dst->dtype;
    const int blocked = dt == CLATTN_Q8_0 || dt == CLATTN_Q4_0, i8 = dt == CLATTN_I8;
    const char *name = blocked ? "ap_block" : i8 ? "ap_i8" : "ap_elem";
    const int64_t rows = p->B * l->heads * p->S;
    const int64_t cols = blocked ? l->D / 32 : i8 ? rows : l->RD / 2 + (l->D - l->RD);
    cl_kernel k;
    int wg;
    clattn_status st = get_kernel(ctx, name, &k, &wg, cols);
    if (st)
        return st;
    size_t global[3], local[3];
    int ny = 1;
    if (i8) {
        global[0] = clattn__ceil_div((size_t)rows, (size_t)wg) * (size_t)wg;
        local[0] = (size_t)wg;
    } else {
        ny = clattn__row_grid(ctx, wg, cols, rows, global, local);
    }
    if (ctx->rehearse)
        return CLATTN_SUCCESS;
    const int x_dt = (int)l->src->dtype, y_dt = (int)dt, nrows_i = (int)rows, heads = (int)l->heads,
              seq = (int)p->S, D = (int)l->D, RD = (int)l->RD, style = l->style, mode = l->mode,
              trows = p->has_table ? p->trows : 1, page = (int)p->page;
    const cl_long nrows = (cl_long)p->nrows;
    clattn_args a = {k, 0, CL_SUCCESS};
    clattn__arg_view(&a, l->src);
    clattn__arg(&a, sizeof(int), &x_dt);
    clattn__arg_view(&a, l->dst);
    if (i8) {
        clattn__arg_view(&a, l->scales);
    } else {
        clattn__arg(&a, sizeof(int), &y_dt);
        clattn__arg(&a, sizeof(float), &l->div);
    }
    clattn__arg(&a, sizeof(int), &nrows_i);
    clattn__arg(&a, sizeof(int), &ny);
    clattn__arg(&a, sizeof(int), &heads);
    clattn__arg(&a, sizeof(int), &seq);
    clattn__arg(&a, sizeof(int), &D);
    clattn__arg(&a, sizeof(int), &RD);
    clattn__arg(&a, sizeof(int), &style);
    clattn__arg(&a, sizeof(float), &p->lhi);
    clattn__arg(&a, sizeof(float), &p->llo);
    clattn__arg_view(&a, p->has_table ? &p->tc : NULL);
    clattn__arg_view(&a, p->has_table ? &p->ts : NULL);
    clattn__arg(&a, sizeof(int), &trows);
    clattn__arg(&a, sizeof(cl_mem), p->pos ? &p->pos : NULL);
    clattn__arg(&a, sizeof(int), &mode);
    clattn__arg(&a, sizeof(cl_mem), p->slot ? &p->slot : NULL);
    clattn__arg(&a, sizeof(cl_long), &nrows);
    clattn__arg(&a, sizeof(int), &page);
    return clattn__enqueue(ctx, &a, i8 ? 1 : 3, global, local, num_wait, wait, done, name);
}

clattn_status clattn_kv_append(clattn_context *ctx, const clattn_kv_append_desc *desc, const clattn_tensor *q,
                               const clattn_tensor *k_new, const clattn_tensor *v_new, const clattn_tensor *q_out,
                               const clattn_tensor *k_cache, const clattn_tensor *v_cache, cl_uint num_wait,
                               const cl_event *wait, cl_event *done)
{
    if (done && !clattn__done_in_wait(num_wait, wait, done))
        *done = NULL;
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_kv_append: ctx must not be NULL");
    clattn__clear_error(ctx);
    append_plan p;
    clattn_status st = check_append(ctx, desc, q, k_new, v_new, q_out, k_cache, v_cache, &p);
    if (st || (st = clattn__check_wait(ctx, num_wait, wait, done)))
        return st;
    const int cache_mode = p.paged ? 2 : 1;
    launch ls[3];
    int n = 0;
    if (p.has_q && !p.q_identity)
        ls[n++] = (launch){&p.q, &p.qo, NULL, p.Hq, p.D, p.RD, p.style, 0, 1.0f};
    ls[n++] = (launch){&p.k, &p.kc, &p.ks, p.Hkv, p.D, p.RD, p.style, cache_mode, p.kdiv};
    ls[n++] = (launch){&p.v, &p.vc, &p.vs, p.Hkv, p.Dv, 0, 0, cache_mode, p.vdiv};
    /* Build every kernel before the first launch: a build failure then leaves the caller's
     * buffers untouched. */
    ctx->rehearse = 1;
    for (int i = 0; i < n && !st; i++)
        st = run(ctx, &p, &ls[i], 0, NULL, NULL);
    ctx->rehearse = 0;
    /* The queue is in order: the first launch waits for the caller's list, the last gives done. */
    for (int i = 0; i < n && !st; i++)
        st = run(ctx, &p, &ls[i], i == 0 ? num_wait : 0, i == 0 ? wait : NULL, i == n - 1 ? done : NULL);
    return st;
}
