/* The mask pre-passes of fused attention (mask_pass.cl): where a mask is shared across batches,
 * heads or rows, one pass turns it into a flag per row and 16 keys, each row's span of visible
 * blocks and each kv head's hull of spans, which the fused kernels then read instead of the mask
 * to skip hidden blocks. */
#include "fused.h"

#include <stdio.h>
#include <string.h>

/* The most bytes of mask flags, spans and hulls: past it (a mask of 4·2^30 elements, or rows a
 * stride of 0 on the sequence does not share) the kernels scan the mask themselves. The kernels
 * count a row's flag offset in 32 bits (NARROW_KEYS, attn_common.cl). */
#define MASK_FLAGS_MAX ((uint64_t)1 << 28)

/* Whether the kernels that skip the blocks a mask hides (fused_direct, fused_lanes and the tiled
 * fused) read the mask's block flags (mask_flags, mask_pass.cl), and where: when they would scan each
 * mask element for more than one row block, that is when batches or heads share the mask
 * (strides 0) or its rows (stride 0 on the sequence). The flags pass then reads the mask once,
 * and every later test of a block costs a byte a row and 16 keys instead of 16 mask entries. A
 * mask of finite values (nothing hidden) pays that one read and gains nothing. Flags start at
 * byte `at` of the workspace; unions: also each kv head's hull of spans, for the K/V copies. */
void clattn__plan_mask_flags(const clattn_problem *p, uint64_t at, int unions, clattn_mask_flags *f)
{
    memset(f, 0, sizeof *f);
    if (!p->has_mask)
        return;
    const uint64_t nb = p->mask.stride[0] ? (uint64_t)p->batch : 1,
                   nh = p->mask.stride[1] ? (uint64_t)p->heads_q : 1,
                   rows = p->mask.stride[2] ? (uint64_t)p->seq_q : 1,
                   chunks = ((uint64_t)p->seq_kv + 15) / 16;
    const int shared = nb < (uint64_t)p->batch || nh < (uint64_t)p->heads_q || rows < (uint64_t)p->seq_q;
    const uint64_t nrows = clattn__mul_sat(nb * nh, rows),
                   bytes = clattn__mul_sat(nrows, chunks);
    /* The flags, padded to a multiple of 4 bytes of the workspace, then 8 bytes of span a row,
     * then 8 bytes of hull a kv head (unions). */
    const uint64_t zs = unions ? (uint64_t)p->batch * (uint64_t)p->heads_kv : 0,
                   span_at = clattn__add_sat(at, clattn__add_sat(bytes, 3)) / 4 * 4 - at,
                   all = clattn__add_sat(span_at, clattn__mul_sat(8, clattn__add_sat(nrows, zs)));
    if (!shared || all > MASK_FLAGS_MAX)
        return;
    f->on = 1;
    f->nh = (int)nh;
    f->rows = (int)rows;
    f->chunks = (int)chunks;
    f->slices = nb * nh;
    f->bytes = all;
    f->off = at;
    f->s_off = (at + span_at) / 4;
    f->unions = unions;
    f->u_off = f->s_off + 2 * nrows;
    f->ss = rows > 1 ? chunks : 0;
    f->sh = nh > 1 ? rows * chunks : 0;
    f->sb = nb > 1 ? nh * rows * chunks : 0;
}

/* With f on, gets (builds) the kernels that fill the flags. Their program depends on the mask's
 * storage type alone, so every attention configuration shares it. */
clattn_status clattn__get_mask_kernels(clattn_context *ctx, const clattn_problem *p, clattn_mask_flags *f)
{
    if (!f->on)
        return CLATTN_SUCCESS;
    char opts[96];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDT_MASK=%d -DKSEL=1 -DK_mask=1", (int)p->mask.dtype);
    clattn_status st = clattn__get_kernel(ctx, "mask_pass.cl", opts, "mask_flags", &f->kflags);
    if (!st)
        st = clattn__get_kernel(ctx, "mask_pass.cl", opts, "mask_spans", &f->kspans);
    if (!st && f->unions)
        st = clattn__get_kernel(ctx, "mask_pass.cl", opts, "mask_union", &f->kunion);
    return st;
}

/* The work-group of mask_spans and mask_union (mask_pass.cl), which keep 64 work-items' values in
 * local memory: 64, or the largest power of 2 below that the device and the compiled kernel
 * allow. */
static size_t reduce_wg(const clattn_context *ctx, cl_kernel k)
{
    size_t kwg = 0, wg = 64;
    if (clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) !=
        CL_SUCCESS)
        kwg = 0;
    while (wg > 1 && (wg > ctx->dev.max_wg || wg > ctx->dev.max_item[0] || (kwg > 0 && wg > kwg)))
        wg /= 2;
    return wg;
}

/* With f on, enqueues mask_flags, mask_spans and with f->unions mask_union (mask_pass.cl), which
 * fill the flags, the spans and the unions f describes in ws, after the caller's wait list, and
 * empties that list: the queue is in order, so what the caller enqueues next waits for them.
 * Does nothing with f off. */
clattn_status clattn__run_mask_flags(clattn_context *ctx, const clattn_problem *p, cl_mem ws,
                                    const clattn_mask_flags *f, cl_uint *num_wait, const cl_event **wait)
{
    if (!f->on)
        return CLATTN_SUCCESS;
    const int n = (int)p->seq_kv;
    clattn_args a = {f->kflags, 0, CL_SUCCESS};
    clattn__arg_view(&a, &p->mask);
    clattn__arg(&a, sizeof(int), &f->nh);
    clattn__arg(&a, sizeof(int), &f->rows);
    clattn__arg(&a, sizeof(int), &f->chunks);
    clattn__arg(&a, sizeof(int), &n);
    clattn__arg(&a, sizeof(cl_mem), &ws);
    clattn__arg(&a, sizeof(cl_ulong), &f->off);
    /* A work-group size, so that grids past the device's y and z limits (rows) run in chunks. */
    const size_t global[3] = {(size_t)(f->chunks + 15) / 16 * 16, (size_t)f->rows, (size_t)f->slices};
    const size_t local[3] = {16, 1, 1};
    clattn_status st = clattn__enqueue(ctx, &a, 3, global, ctx->dev.max_wg >= 16 ? local : NULL,
                                       *num_wait, *wait, NULL, "mask_flags");
    *num_wait = 0;
    *wait = NULL;
    if (st)
        return st;
    /* A work-group per row of flags. */
    size_t wg = reduce_wg(ctx, f->kspans);
    const size_t sglobal[2] = {wg, (size_t)f->slices * (size_t)f->rows}, slocal[2] = {wg, 1};
    clattn_args s = {f->kspans, 0, CL_SUCCESS};
    clattn__arg(&s, sizeof(cl_mem), &ws);
    clattn__arg(&s, sizeof(cl_ulong), &f->off);
    clattn__arg(&s, sizeof(int), &f->chunks);
    clattn__arg(&s, sizeof(cl_mem), &ws);
    clattn__arg(&s, sizeof(cl_ulong), &f->s_off);
    if ((st = clattn__enqueue(ctx, &s, 2, sglobal, slocal, 0, NULL, NULL, "mask_spans")) || !f->unions)
        return st;
    /* A work-group per kv head; the flag row strides in rows. */
    wg = reduce_wg(ctx, f->kunion);
    const cl_ulong rb = f->sb / (cl_ulong)f->chunks, rh = f->sh / (cl_ulong)f->chunks,
                   rs = f->ss / (cl_ulong)f->chunks;
    const int hkv = (int)p->heads_kv, group = (int)(p->heads_q / p->heads_kv), seq_q = (int)p->seq_q;
    const size_t uglobal[2] = {wg, (size_t)(p->batch * p->heads_kv)}, ulocal[2] = {wg, 1};
    clattn_args u = {f->kunion, 0, CL_SUCCESS};
    clattn__arg(&u, sizeof(cl_mem), &ws);
    clattn__arg(&u, sizeof(cl_ulong), &f->s_off);
    clattn__arg(&u, sizeof(cl_ulong), &f->u_off);
    clattn__arg(&u, sizeof(cl_ulong), &rb);
    clattn__arg(&u, sizeof(cl_ulong), &rh);
    clattn__arg(&u, sizeof(cl_ulong), &rs);
    clattn__arg(&u, sizeof(int), &hkv);
    clattn__arg(&u, sizeof(int), &group);
    clattn__arg(&u, sizeof(int), &seq_q);
    clattn__arg(&u, sizeof(int), &f->chunks);
    return clattn__enqueue(ctx, &u, 2, uglobal, ulocal, 0, NULL, NULL, "mask_union");
}

