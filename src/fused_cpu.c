/* The CPU launchers of fused attention: fused_direct and fused_lanes (fused_direct.cl,
 * fused_lanes.cl), with the rules for when K and V are read in place or from copies. */
#include "fused.h"

#include <stdio.h>
#include <string.h>

/* The most packed rows fused_lanes takes in one block: 4 vectors of 16 lanes (decode GQA 32:8 d128
 * f32 on PoCL: 64 rows in one block 11.4 ms, in two of 32 13.4). Journal:
 * docs/measurements.md#lanes-rows */
#define LANES_ROWS 64
/* The fewest packed rows fused_lanes takes (one vector, up to 5 of 16 lanes empty); fewer stay on
 * fused_direct, whose cost grows with the rows where fused_lanes' does not (decode d128 on PoCL,
 * 16 rows: 3.5 ms against 5.3; 9 rows: 3.8 against 3.1). Journal: docs/measurements.md#lanes-min-rows */
#define LANES_MIN_ROWS 11

/* Prefill with at most LANES_ROWS rows per kv head reads K and V in place (fused_lanes): a Kᵀ copy
 * costs more than so few rows repay. With AVX2's tiles, K and V of at least KV_IN_PLACE elements a
 * kv head and head_dim + head_dim_v <= KV_IN_PLACE_DIMS are read in place whatever the rows, since
 * the copies' small row blocks stream long K and V too often (d64 seq_kv 32768 seq_q 256: 159 ms
 * against 177). Journal: docs/measurements.md#kv-in-place */
#define KV_IN_PLACE (1 << 21)
#define KV_IN_PLACE_DIMS 128
/* With AVX-512's tiles (NREG16 32), K and V past KV_IN_PLACE_512 floats a kv head (2 MiB of f32,
 * one core's L2 on the machine measured) are read in place whatever the head sizes: the copies
 * would stream from L3 every 6-row block (d64 seq_kv 8192 seq_q 1024: 71 ms against 101).
 * Journal: docs/measurements.md#kv-in-place-512 */
#define KV_IN_PLACE_512 (1 << 19)

/* Packed rows per block of fused_direct for paged or quantized K/V (which fused_lanes does not
 * read) with more rows than LANES_MIN_ROWS: QK_TILE's multiple of 4 (common.cl). */
#define KV_ROWS 16

int clattn__direct_in_place(const clattn_context *ctx, int64_t rows, int64_t seq_q, int64_t seq_kv,
                            int64_t dk_plus_dv)
{
    if (seq_q <= 16 || rows <= LANES_ROWS)
        return 1;
    if (ctx->dev.nreg16 >= 32)
        return seq_kv * dk_plus_dv > KV_IN_PLACE_512;
    return dk_plus_dv <= KV_IN_PLACE_DIMS && seq_kv * dk_plus_dv >= KV_IN_PLACE;
}


/* fused_direct (CPUs): one work-item per block of rm packed rows and key split. Prefill reads
 * f32 copies of K and V from the workspace, both in panels (fused_direct.cl): Kᵀ by transpose_k16
 * with panels of bn keys, V zero-padded by pack_v with panels of 16 columns; decode, and prefill
 * with few rows per kv head or long K and V, read K and V in place (IN_PLACE: each key is
 * read once per row block, where a copy would triple the traffic; `in_place` asks for it,
 * clattn__direct_in_place says when it pays). The copies cover only the panels below their
 * batch's key length and, under a shared mask, those some row of the kv head sees (mask_union,
 * mask_pass.cl). Sets *used = 0 (and enqueues nothing) when the copies and partials do not fit the
 * device's max allocation. */
clattn_status clattn__fused_run_direct(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                                int in_place, cl_uint num_wait, const cl_event *wait, cl_event *done,
                                int *used)
{
    *used = 0;
    const int group = (int)(p->heads_q / p->heads_kv), R = group * (int)p->seq_q;
    const int decode = p->seq_q <= 16;
    /* In place with automatic rows (prefill, or decode with RM 0): fewer than LANES_MIN_ROWS
     * packed rows in one block of fused_direct; that many or more in fused_lanes, in as few
     * blocks as LANES_ROWS allows, since each block reads K and V (all of them, but for causal
     * prefill). An explicit RM (the tuner's) keeps fused_direct, in blocks of at most 32 rows. */
    int rm0 = in_place && !decode ? 0 : decode ? pp->decode.RM : pp->fused.RM, lanes = 0;
    if (in_place && rm0 <= 0) {
        if (R < LANES_MIN_ROWS || p->kv.on || p->drop.on) { /* fused_lanes reads plain K and V only, draws no dropout */
            rm0 = R < KV_ROWS ? R : KV_ROWS;
        } else {
            lanes = clattn__ceil_div_int(clattn__ceil_div_int(R, clattn__ceil_div_int(R, LANES_ROWS)), 16);
            rm0 = 16 * lanes;
        }
    }
    int rm = rm0 < 1 ? 1 : rm0 > 32 && !lanes ? 32 : rm0, ns = 1;
    if (!in_place) { /* the scores' register tile, S[RM][NS] (fused_direct.cl) */
        ns = decode ? pp->decode.NS : pp->fused.NS;
        clattn__fit_fused_tile(ctx, p->head_dim_v, &rm, &ns);
    }
    const int bn = 16 * ns, dv16 = (int)((p->head_dim_v + 15) / 16);
    const uint64_t zs = (uint64_t)p->batch * (uint64_t)p->heads_kv;
    const uint64_t pitch = ((uint64_t)p->seq_kv + bn - 1) / bn * bn + 16; /* whole panels, and 16 floats of slack */
    const uint64_t vp_ss = 16u * (uint64_t)dv16;
    /* zs·head_dim and zs·vp_ss are below 2^40, pitch and seq_kv below 2^31: the products may
     * pass 2^64 (then total below sends the problem to the tiled kernel). */
    const uint64_t kt_floats = in_place ? 0 : clattn__mul_sat(zs * (uint64_t)p->head_dim, pitch),
                   vp_floats = in_place ? 0 : clattn__mul_sat(zs * vp_ss, (uint64_t)p->seq_kv);
    const int row_blocks = clattn__ceil_div_int(R, rm);
    int split_len;
    /* Long key ranges: chunks whose K/V copies take at most a quarter of the device's cache.
     * The split is the slowest grid dimension within a head, so consecutive work-groups (row
     * blocks) stream the same chunk while it is in cache instead of each sweeping all keys from
     * memory; the partials are then merged. */
    int want = decode ? pp->decode.SPLITS : 0;
    if (!in_place && ctx->dev.cache_size) {
        const uint64_t chunk = ctx->dev.cache_size / 4 / (4u * ((uint64_t)p->head_dim + vp_ss));
        if (chunk >= 16u * (uint64_t)bn && (uint64_t)p->seq_kv > chunk)
            want = (int)(((uint64_t)p->seq_kv + chunk - 1) / chunk);
    }
    const int splits = clattn__choose_splits(ctx, p, (long long)row_blocks * (long long)zs, bn, 1, want, &split_len);
    const uint64_t part = splits > 1 ? (uint64_t)splits * clattn__part_floats(p) : 0;
    uint64_t total = clattn__add_sat(clattn__add_sat(kt_floats, vp_floats), part);
    if (total > ctx->dev.max_alloc / 4 || total > (uint64_t)SIZE_MAX / 4)
        return CLATTN_SUCCESS;
    clattn_mask_flags mf;
    clattn__plan_mask_flags(p, total * 4, !in_place, &mf);
    if (mf.on) {
        const uint64_t with = clattn__add_sat(total, (mf.bytes + 3) / 4);
        if (with > ctx->dev.max_alloc / 4 || with > (uint64_t)SIZE_MAX / 4)
            mf.on = 0; /* the kernels scan the mask themselves */
        else
            total = with;
    }
    const int dp = in_place ? (int)((p->head_dim + 15) / 16 * 16) : (int)((p->head_dim + 3) / 4 * 4);
    const int kv_full = p->head_dim % 16 == 0 && p->head_dim_v % 16 == 0;

    /* Every kernel is built before anything is enqueued: a build failure leaves no partial work. */
    char dp16[24] = ""; /* in place: the query rows of qk16_row and qk16_tile (common.cl) */
    if (in_place)
        snprintf(dp16, sizeof dp16, " -DDP16=%d", dp);
    char lanes_opt[32] = ""; /* fused_lanes; LPF 1: software prefetches, on CPUs */
    if (lanes)
        snprintf(lanes_opt, sizeof lanes_opt, " -DLANES=%d -DLPF=%d", lanes,
                 (ctx->dev.type & CL_DEVICE_TYPE_CPU) != 0);
    else if (in_place && (ctx->dev.type & CL_DEVICE_TYPE_CPU) &&
             (p->kv.page || clattn__kv_type(p->kv.kt) || clattn__kv_type(p->kv.vt) ||
              p->k.stride[2] > (cl_ulong)p->head_dim || p->v.stride[2] > (cl_ulong)p->head_dim_v))
        /* fused_direct in place: software prefetches for the KV-cache types, whose decoding
         * leaves the CPU's own prefetchers behind (q8_0 decode 3.1-3.5 ms with them, 6.1-7.7
         * without), and where a head's K or V rows are not one stream (pages, or rows of all
         * heads interleaved: BSHD, NHD; the strides compared are then in elements, those of
         * the KV-cache types being in bytes). Not for other contiguous K/V: f16 decode of 8 kv
         * heads took 1.4 ms with them against 1.05 (docs/measurements.md#kv-cache). */
        snprintf(lanes_opt, sizeof lanes_opt, " -DKV_PREFETCH=1");
    /* The program holds the kernels taken from it below and no others (KSEL, common.cl). */
    char opts[400];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d -DWGX=1 -DWGY=1 "
             "-DRM=%d -DNS=%d -DVW=16 -DNV=1 -DDP=%d -DDV16=%d -DEXP2_POLY=1 -DIN_PLACE=%d -DKV_FULL=%d%s%s%s%s"
             " -DKSEL=1 -DK_%s=1%s",
             (int)p->dtype, splits > 1 ? (int)CLATTN_F32 : (int)p->out.dtype,
             p->has_mask ? (int)p->mask.dtype : 0, rm, ns, dp, dv16, in_place, kv_full,
             dp16, lanes_opt, mf.on ? " -DMFLAGS=1" : "", p->drop.on ? " -DDROPOUT=1" : "",
             lanes ? "fused_lanes" : "fused_direct",
             in_place ? "" : " -DK_pack_v=1");
    cl_kernel kpack = NULL, kdirect;
    clattn_status st;
    if ((!in_place && (st = clattn__get_kernel(ctx, "fused_direct.cl", opts, "pack_v", &kpack))) ||
        (st = clattn__get_mask_kernels(ctx, p, &mf)) ||
        (st = clattn__get_kernel(ctx, lanes ? "fused_lanes.cl" : "fused_direct.cl", opts, lanes ? "fused_lanes" : "fused_direct", &kdirect)))
        return st;
    cl_mem ws = NULL;
    if (total > 0 && (st = clattn__workspace(ctx, total * 4, &ws)))
        return st;
    *used = 1;
    /* Row blocks in y, kv heads and splits in z, flattened (row blocks fastest). */
    const size_t local[3] = {1, 1, 1};
    size_t global[3] = {1, (size_t)row_blocks, (size_t)zs * (size_t)splits};
    clattn__flatten_grid(global);
    if ((st = clattn__run_mask_flags(ctx, p, ws, &mf, &num_wait, &wait)))
        return st;
    if (in_place)
        return clattn__fused_launch(ctx, p, kdirect, "fused_direct", &p->k, &p->v, ws, 0, splits, split_len, global,
                      local, &mf, num_wait, wait, done);
    /* The copies write only the panels below the batch's key length and, with a shared mask,
     * those some row of the kv head may see. */
    const cl_mem kspan = mf.on ? ws : NULL;
    const cl_ulong ks_off = mf.on ? mf.u_off : 0;
    if ((st = clattn__run_transpose_k(ctx, p, ws, 0, pitch, bn, kspan, ks_off, p->kv_lengths, num_wait,
                                      wait)))
        return st;
    /* The Kᵀ copy as a view: [z][key / bn][d][key % bn] in head blocks of head_dim·pitch floats,
     * z = b·heads_kv + hk (fused_direct.cl reads a chunk's panel at its first key·head_dim). */
    const cl_ulong hk_n = (cl_ulong)p->heads_kv, kt_sz = (cl_ulong)p->head_dim * pitch;
    const clattn_view kt = {ws, CLATTN_F32, 0, {hk_n * kt_sz, kt_sz, (cl_ulong)bn}};
    const cl_ulong vp_off = kt_floats, vp_sz = (cl_ulong)p->seq_kv * vp_ss, vp_pitch = 16;
    const int n = (int)p->seq_kv, dv = (int)p->head_dim_v, hkv = (int)p->heads_kv;
    clattn_args a = {kpack, 0, CL_SUCCESS};
    clattn__arg_view(&a, &p->v);
    clattn__arg(&a, sizeof(cl_mem), &ws);
    clattn__arg(&a, sizeof(cl_ulong), &vp_off);
    clattn__arg(&a, sizeof(cl_ulong), &vp_sz);
    clattn__arg(&a, sizeof(int), &n);
    clattn__arg(&a, sizeof(int), &dv);
    clattn__arg(&a, sizeof(int), &hkv);
    clattn__arg(&a, sizeof(cl_mem), mf.on ? &kspan : NULL);
    clattn__arg(&a, sizeof(cl_ulong), &ks_off);
    clattn__arg(&a, sizeof(cl_mem), p->kv_lengths ? &p->kv_lengths : NULL);
    clattn__arg(&a, sizeof(cl_mem), p->kv.cu_k ? &p->kv.cu_k : NULL); /* packed V (varlen) */
    clattn__arg(&a, sizeof(int), &p->kv.total_k);
    const size_t pglobal[2] = {(size_t)(((uint64_t)p->seq_kv + 15) / 16 * 16), (size_t)zs};
    const size_t plocal[2] = {16, 1};
    if ((st = clattn__enqueue(ctx, &a, 2, pglobal, ctx->dev.max_wg >= 16 ? plocal : NULL, 0, NULL,
                              NULL, "pack_v")))
        return st;

    /* The padded V copy as a view: [z][c / 16][key][c % 16] in head blocks of seq_kv·vp_ss floats
     * (fused_direct.cl finds the panels from the head stride). */
    const clattn_view vpk = {ws, CLATTN_F32, vp_off, {hk_n * vp_sz, vp_sz, vp_pitch}};
    return clattn__fused_launch(ctx, p, kdirect, "fused_direct", &kt, &vpk, ws, kt_floats + vp_floats, splits,
                  split_len, global, local, &mf, 0, NULL, done);
}

