/* Fused attention for prefill and decode: which kernel a call runs (the kernel choice of FUSED
 * or DECODE, then what fits), the flash-decoding key splits merged by merge.cl when one
 * work-group per (row tile, kv head) would leave the device idle, and the launch the kernels
 * share. The launchers: fused_cpu.c (CPUs), fused_gpu.c (GPUs and the tiled fallback), the mask
 * passes: mask_pass.c. docs/architecture.md maps them to their kernels. */
#include "fused.h"

#include <stdio.h>
#include <string.h>

/* Keys one split covers at most. Within a split the kernels keep O normalised and add each key's
 * share to it in fp32: late in a long range every share is tiny next to O, and their rounding
 * adds up. With identical keys (the worst case: the errors do not cancel) one split of 1e6 keys
 * is off by 3e-4, of 1e8 keys by 3%; 65536 keys stay at fp32 rounding. Splits are merged with
 * their LSE weights in compensated sums (merge.cl). The partials' workspace bounds the count;
 * MAX_SPLITS covers CLATTN_MAX_SEQ keys. Grid z (batch·heads_kv·splits) may exceed what the
 * device launches at once: clattn__enqueue then runs it in chunks. */
#define MAX_SPLIT_KEYS (1 << 16)
#define MAX_SPLITS 32768

/* Key splits (flash-decoding): `requested` (DECODE's SPLITS), or with 0 enough work-groups of
 * wg_items work-items to fill the device (CPUs: 4 per compute unit; GPUs: about 2048 work-items
 * per compute unit, 4 to 32 work-groups, the occupancy a GPU needs to hide memory latency); then
 * each split keeps at least 4 key blocks of bn and at most MAX_SPLIT_KEYS keys, and the partials
 * stay within a modest workspace (which wins over the key limit). split_len is a multiple of bn. */
int clattn__choose_splits(const clattn_context *ctx, const clattn_problem *p, long long tiles, int bn,
                         int wg_items, int requested, int *split_len)
{
    int splits = requested > 0 ? requested : 1;
    int per_cu = 4;
    if (!(ctx->dev.type & CL_DEVICE_TYPE_CPU) && wg_items > 0) {
        per_cu = 2048 / wg_items;
        per_cu = per_cu < 4 ? 4 : per_cu > 32 ? 32 : per_cu;
    }
    const long long target = (long long)per_cu * ctx->dev.compute_units;
    if (requested <= 0 && tiles < target)
        splits = (int)((target + tiles - 1) / tiles);
    const long long max_by_len = (p->seq_kv + 4LL * bn - 1) / (4LL * bn);
    if (splits > max_by_len)
        splits = (int)max_by_len;
    if (splits > 256)
        splits = 256;
    const long long by_keys = (p->seq_kv + MAX_SPLIT_KEYS - 1) / MAX_SPLIT_KEYS;
    if (splits < by_keys)
        splits = by_keys < MAX_SPLITS ? (int)by_keys : MAX_SPLITS;
    /* In 64 bits whatever size_t is (a 32-bit host): the products must not wrap. */
    const uint64_t part_rows = (uint64_t)p->batch * (uint64_t)p->heads_q * (uint64_t)p->seq_q;
    const uint64_t part_bytes = clattn__mul_sat(part_rows, (uint64_t)(p->head_dim_v + 1) * 4);
    /* 256 MiB, or half the largest buffer the device allows (the workspace is one buffer). */
    const uint64_t part_cap = ctx->dev.max_alloc / 2 < ((uint64_t)256 << 20) ? ctx->dev.max_alloc / 2
                                                                              : ((uint64_t)256 << 20);
    while (splits > 1 && clattn__mul_sat((uint64_t)splits, part_bytes) > part_cap)
        splits /= 2;
    if (splits < 1)
        splits = 1;
    /* In 64 bits: seq_kv may be close to INT_MAX. len stays below it (validation keeps seq_kv
     * 2^20 below INT_MAX, and bn is smaller). */
    long long len = (p->seq_kv + splits - 1) / splits;
    len = (len + bn - 1) / bn * bn;
    *split_len = (int)len;
    return (int)((p->seq_kv + len - 1) / len);
}


/* The f32 partial results of split launches: O [split][B][Hq][Sq][Dv], then LSE [split][B][Hq][Sq],
 * at element offset base of the workspace ws. */
static void partial_views(const clattn_problem *p, cl_mem ws, uint64_t base, int splits,
                          clattn_view *out, clattn_view *lse, cl_ulong *o_split, cl_ulong *l_split)
{
    const cl_ulong dv = (cl_ulong)p->head_dim_v, sq = (cl_ulong)p->seq_q, hq = (cl_ulong)p->heads_q;
    const cl_ulong rows = (cl_ulong)p->batch * hq * sq;
    *out = (clattn_view){ws, CLATTN_F32, base, {hq * sq * dv, sq * dv, dv}};
    *lse = (clattn_view){ws, CLATTN_F32, base + (cl_ulong)splits * rows * dv, {hq * sq, sq, 1}};
    *o_split = rows * dv;
    *l_split = rows;
}


/* Launches kernel (fused or fused_direct, which take the same arguments) over global/local with
 * K and V as the views k and v, writing the outputs, or with splits > 1 the partials at element
 * offset part_off of ws, which are then merged. With mf on, the kernel also gets the mask's
 * flags (MFLAG_ARGS, attn_common.cl). */
clattn_status clattn__fused_launch(clattn_context *ctx, const clattn_problem *p, cl_kernel kernel, const char *name,
                            const clattn_view *k, const clattn_view *v, cl_mem ws, uint64_t part_off,
                            int splits, int split_len, const size_t global[3], const size_t local[3],
                            const clattn_mask_flags *mf, cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    clattn_view out = p->out, lse = p->lse;
    int has_lse = p->lse.buffer != NULL;
    cl_ulong o_split = 0, l_split = 0;
    if (splits > 1) {
        partial_views(p, ws, part_off, splits, &out, &lse, &o_split, &l_split);
        has_lse = 1;
    }
    const int seq_q = (int)p->seq_q, seq_kv = (int)p->seq_kv, hkv = (int)p->heads_kv,
              group = (int)(p->heads_q / p->heads_kv), D = (int)p->head_dim, dv = (int)p->head_dim_v,
              causal = p->causal, has_mask = p->has_mask;
    clattn_args a = {kernel, 0, CL_SUCCESS};
    clattn__arg_view(&a, &p->q);
    clattn__arg_view(&a, k);
    clattn__arg_view(&a, v);
    clattn__arg_view(&a, &out);
    clattn__arg_view(&a, has_lse ? &lse : NULL);
    clattn__arg_view(&a, has_mask ? &p->mask : NULL);
    clattn__arg(&a, sizeof(cl_mem), p->kv_lengths ? &p->kv_lengths : NULL);
    clattn__arg(&a, sizeof(cl_ulong), &o_split);
    clattn__arg(&a, sizeof(cl_ulong), &l_split);
    clattn__arg(&a, sizeof(int), &seq_q);
    clattn__arg(&a, sizeof(int), &seq_kv);
    clattn__arg(&a, sizeof(int), &hkv);
    clattn__arg(&a, sizeof(int), &group);
    clattn__arg(&a, sizeof(int), &D);
    clattn__arg(&a, sizeof(int), &dv);
    clattn__arg(&a, sizeof(int), &causal);
    clattn__arg(&a, sizeof(int), &has_mask);
    clattn__arg(&a, sizeof(int), &has_lse);
    clattn__arg(&a, sizeof(int), &splits);
    clattn__arg(&a, sizeof(int), &split_len);
    clattn__arg(&a, sizeof(float), &p->scale);
    if (mf && mf->on) {
        clattn__arg(&a, sizeof(cl_mem), &ws);
        clattn__arg(&a, sizeof(cl_ulong), &mf->off);
        clattn__arg(&a, sizeof(cl_ulong), &mf->sb);
        clattn__arg(&a, sizeof(cl_ulong), &mf->sh);
        clattn__arg(&a, sizeof(cl_ulong), &mf->ss);
        clattn__arg(&a, sizeof(cl_ulong), &mf->s_off);
        clattn__arg(&a, sizeof(int), &mf->chunks);
    }
    clattn__variant_args(&a, p);
    clattn__kv_args(&a, p);
    clattn__dropout_args(&a, p);
    if (splits == 1)
        return clattn__enqueue(ctx, &a, 3, global, local, num_wait, wait, done, name);
    char what[64];
    snprintf(what, sizeof what, "%s (split)", name);
    clattn_status st = clattn__enqueue(ctx, &a, 3, global, local, num_wait, wait, NULL, what);
    if (st)
        return st;
    return clattn__run_merge(ctx, splits, p->batch, p->heads_q, p->seq_q, p->head_dim_v, &out, &lse,
                             &p->out, p->lse.buffer ? &p->lse : NULL, p->var.sinks.buffer ? &p->var.sinks : NULL,
                             p->kv.cu_q, p->kv.total_q, 0, NULL, done);
}


void clattn__plan_tile_flags(const clattn_context *ctx, const clattn_problem *p, uint64_t part_bytes,
                             clattn_mask_flags *mf)
{
    clattn__plan_mask_flags(p, part_bytes, 0, mf);
    if (mf->on && clattn__add_sat(part_bytes, mf->bytes) > ctx->dev.max_alloc)
        mf->on = 0; /* the kernel scans the mask itself */
}


clattn_status clattn__fused_launch_tiles(clattn_context *ctx, const clattn_problem *p, cl_kernel kernel,
                                         const char *name, uint64_t part_bytes, const clattn_mask_flags *mf,
                                         int splits, int split_len, const size_t global[3], const size_t local[3],
                                         cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    clattn_status st;
    cl_mem ws = NULL;
    const uint64_t ws_bytes = part_bytes + (mf->on ? mf->bytes : 0);
    if (ws_bytes > 0 && (st = clattn__workspace(ctx, ws_bytes, &ws)))
        return st;
    if ((st = clattn__run_mask_flags(ctx, p, ws, mf, &num_wait, &wait)))
        return st;
    return clattn__fused_launch(ctx, p, kernel, name, &p->k, &p->v, ws, 0, splits, split_len, global, local, mf,
                                num_wait, wait, done);
}


clattn_status clattn__run_fused(clattn_context *ctx, const clattn_problem *p, cl_uint num_wait,
                                const cl_event *wait, cl_event *done)
{
    const int group = (int)(p->heads_q / p->heads_kv);
    const int R = group * (int)p->seq_q;
    const int decode = p->seq_q <= 16;
    /* A window, a chunk or mask_mod hides keys as a mask does: such calls take the masked class's
     * parameters (what clattn-tune measures with --shape ...,kvlen or a masked --class). */
    clattn_bucket bucket = {decode ? CLATTN_OP_DECODE : CLATTN_OP_FUSED, p->dtype, (int)p->head_dim,
                            clattn__seq_q_class(p->seq_q), clattn__log2_ceil(p->seq_kv),
                            clattn__mask_kind(p->causal, p->has_mask || p->kv_lengths ||
                                                             (p->var.bits & (CLATTN_V_RANGE | CLATTN_V_MASK_MOD)))};
    clattn_params pp;
    const clattn_params_source source = clattn__default_params(ctx, &bucket, &pp);
    if (decode)
        clattn__decode_tiled_default(ctx, R, p->head_dim, p->head_dim_v, source, pp.v);
    int kernel = decode ? pp.decode.DIRECT : pp.fused.DIRECT;
    const int chosen = kernel == (decode ? CLATTN_KERNEL_MMA_DECODE : CLATTN_KERNEL_MMA_FUSED);
    /* Paged, packed or quantized K/V (p->kv.on) is read by fused_direct, decode_rows, the tiled
     * kernel and the matrix-unit kernel (cl/kv_access.cl); decode_lanes' choice gives way to
     * decode_rows, fused_lanes' to fused_direct (docs/kvcache.md#kernels). */
    /* Dropout is drawn in fused_direct alone (cl/attn_common.cl): every device runs it then. */
    if (p->drop.on)
        kernel = CLATTN_KERNEL_DIRECT;
    if (!p->drop.on && (chosen || clattn__matrix_auto(ctx, (int)p->dtype, p->seq_q, R, source))) {
        const int explicit_ = source >= CLATTN_SOURCE_ENVIRONMENT;
        const int emulate = ctx->matrix_mode == CLATTN_MATRIX_EMULATE;
        if (clattn__matrix_unavailable(ctx)) {
            if (explicit_)
                return clattn__fail(ctx, CLATTN_UNSUPPORTED, "kernel=mma (the matrix-unit kernel): %s",
                                    ctx->matrix_mode == CLATTN_MATRIX_OFF ? "CLATTN_MATRIX=off" : ctx->matrix_why);
        } else {
            /* The tuned or requested tile (WGY warps, NS·16 keys: slots 1 and 3 in FUSED and DECODE
             * alike), else the kernel's defaults. */
            int used;
            clattn_status st = clattn__fused_run_mma(ctx, p, chosen ? pp.fused.WGY : 0, chosen ? 16 * pp.fused.NS : 0,
                                                     decode ? pp.decode.SPLITS : 0, emulate, explicit_, num_wait,
                                                     wait, done, &used);
            if (st || used)
                return st;
        }
        if (chosen) { /* a tuned choice of the matrix kernel that cannot run: the FMA kernels' defaults */
            clattn__generic_defaults(bucket.op, &pp);
            const char *what;
            clattn__vendor_defaults(&ctx->dev, bucket.op, &pp, &what);
            if (decode)
                clattn__decode_tiled_default(ctx, R, p->head_dim, p->head_dim_v, CLATTN_SOURCE_VENDOR, pp.v);
            kernel = decode ? pp.decode.DIRECT : pp.fused.DIRECT;
        }
    }
    if (p->kv.on && decode && (kernel == CLATTN_KERNEL_LANES || kernel == CLATTN_KERNEL_LANES_LOCAL)) {
        /* decode_rows with each lane reading its own keys' rows, 8 loads in flight */
        kernel = pp.decode.DIRECT = CLATTN_KERNEL_ROWS;
        pp.decode_rows.KL = 1;
        pp.decode_rows.LC = 8;
    }
    if (decode && kernel >= CLATTN_KERNEL_ROWS && kernel <= CLATTN_KERNEL_LANES_LOCAL) {
        /* A kernel compiled with more registers than its work-group allows is refitted to what it
         * allows (clattn__retry_cap); with no group left that fits, the tiled kernel runs. */
        int used;
        clattn_status st;
        for (size_t cap = ctx->dev.max_wg;;) {
            st = kernel >= CLATTN_KERNEL_LANES ? clattn__fused_run_lanes(ctx, p, &pp, cap, num_wait, wait, done, &used)
                              : clattn__fused_run_rows(ctx, p, &pp, cap, num_wait, wait, done, &used);
            if (used || !(cap = clattn__retry_cap(ctx, st, source, cap)))
                break;
        }
        if (st || used)
            return st;
    } else if (kernel == CLATTN_KERNEL_DIRECT) {
        /* Copies of K and V that do not fit the max allocation: K and V read in place (only the
         * split partials, at most half of it, remain), before the tiled kernel, which is several
         * times slower on CPUs (PoCL, 2-core AMD EPYC, AVX2, B1 H8 Sq256 Skv8192 d64 causal, min
         * ms: copies 46-49, in place 33, tiled 375-411). */
        int used;
        /* Paged or quantized K/V is read in place; packed sequences of plain K/V (varlen) may take
         * the copies too (transpose_k16 and pack_v read each sequence's keys). */
        const int kv_in_place = p->kv.page || clattn__kv_type(p->kv.kt) || clattn__kv_type(p->kv.vt);
        /* A window or chunk bounds what a row block streams: B1 H8 S8192 d64 sliding 1024 took
         * 107-110 ms in place, 91-94 from the copies (docs/measurements.md#window-prefill). */
        for (int in_place = kv_in_place || clattn__direct_in_place(ctx, R, p->seq_q, clattn__row_keys_max(p), p->head_dim + p->head_dim_v);
             in_place <= 1; in_place++) {
            clattn_status st = clattn__fused_run_direct(ctx, p, &pp, in_place, num_wait, wait, done, &used);
            if (st || used)
                return st;
        }
    }
    if (p->drop.on)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "desc->dropout_p: the dropout kernel's partial results do not fit the device's "
                            "max allocation (%llu bytes)", (unsigned long long)ctx->dev.max_alloc);
    return clattn__fused_run_tiled(ctx, p, &pp, source, num_wait, wait, done);
}
