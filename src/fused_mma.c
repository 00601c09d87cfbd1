/* The launcher of the matrix-unit kernel (fused_mma.cl over the tile layer mma.cl): its tile
 * fitted to local memory, the backend (NVIDIA's mma.sync, AMD's MFMA or WMMA, Intel's XMX, or the
 * emulation of any of their layouts), key splits and the mask's flags as the tiled kernel has
 * them. Which calls run it: src/fused.c. */
#include "fused.h"

#include <stdio.h>
#include <string.h>

typedef struct mma_cfg {
    int nw, bn, dp, dvp, qreg, ldsm;
    int layout; /* 0 NVIDIA's; AMD's 16 x 16 tiles: 1 MFMA (64 lanes, f32 without 3xTF32), 2 WMMA;
                 * Intel XMX: 3 on sub-groups of 16, 4 of 8 (8 x 16 x 16 products a warp of 16) */
} mma_cfg;

/* Local memory of fused_mma: the one array of Q, K and V (Q's place taken by K and V when Q's
 * fragments stay in registers), the two tile flags, and under emulation the warps' product
 * scratch and a float4 exchange slot per work-item (MMA_SCRATCH_FLOATS, mma.cl). */
static size_t mma_local_bytes(const mma_cfg *c, int elem, int emulate)
{
    const size_t pad = elem == 4 ? 4 : 8;
    const size_t k = elem == 4 ? (c->layout ? 4 : 8) : 16, parts = elem == 4 && !c->layout ? 2 : 1; /* 3xTF32 */
    const size_t n = c->layout ? 16 : 8, lanes = (size_t)clattn__mma_lanes(c->layout);
    const size_t bm = 16 * (size_t)c->nw, qp = (size_t)c->dp + pad, vp = (size_t)c->bn + pad;
    /* V transposed (dvp rows of bn keys), or with ldmatrix as stored (bn rows of dvp rounded up
     * to 16, then padded: VR in fused_mma.cl) */
    const size_t v = c->ldsm ? (size_t)c->bn * (((size_t)c->dvp + 15) / 16 * 16 + pad) : (size_t)c->dvp * vp;
    const size_t q = bm * qp, kv = (size_t)c->bn * qp + v;
    size_t bytes = elem * (c->qreg ? (q > kv ? q : kv) : q + kv) + 16 + 16;
    if (emulate)
        bytes += 4 * (size_t)c->nw * (parts * (16 * k + k * n) + 4 * lanes);
    return bytes;
}

/* Whether every row of Q, and of K and V where they are of the query's type (a KV-cache type is
 * decoded by its own loads), starts on 16 bytes: offsets and strides multiples of 16 bytes and
 * the buffers so aligned (clattn__buffer_align16). The kernel then loads whole chunks of 16
 * bytes at once (MMA_ALIGN16). */
static int views_align16(const clattn_context *ctx, const clattn_problem *p, int elem)
{
    if (ctx->dev.mem_align_bits < 128)
        return 0;
    const cl_ulong u = (cl_ulong)(16 / elem);
    const clattn_view *vs[3] = {&p->q, &p->k, &p->v};
    for (int i = 0; i < 3; i++) {
        if (i > 0 && vs[i]->dtype != p->dtype)
            continue;
        if (vs[i]->offset % u || vs[i]->stride[0] % u || vs[i]->stride[1] % u || vs[i]->stride[2] % u ||
            !clattn__buffer_align16(vs[i]->buffer))
            return 0;
    }
    return 1;
}

clattn_status clattn__fused_run_mma(clattn_context *ctx, const clattn_problem *p, int nw, int bn, int splits_req,
                                    int emulate, int explicit_, cl_uint num_wait, const cl_event *wait,
                                    cl_event *done, int *used)
{
    *used = 0;
    const int R = (int)(p->heads_q / p->heads_kv) * (int)p->seq_q;
    mma_cfg c;
    /* The layout: AMD's or Intel's where the device's backend is theirs or the emulation was
     * asked for it. */
    c.layout = emulate || ctx->matrix_backend >= CLATTN_MMA_AMD ? ctx->matrix_layout : 0;
    if (c.layout >= 2 && p->dtype == CLATTN_F32) {
        if (explicit_)
            return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                                "kernel=mma (the matrix-unit kernel): %s multiplies f16 and bf16 only, not f32 inputs",
                                c.layout == 2 ? "RDNA3's WMMA" : "Intel's XMX");
        return CLATTN_SUCCESS; /* *used 0: the FMA kernel runs */
    }
    /* AMD's and Intel's backends run an input type only once its probe passed on the device. */
    if (!emulate && c.layout && !clattn__matrix_checked(ctx, (int)p->dtype)) {
        if (explicit_)
            return clattn__fail(ctx, CLATTN_UNSUPPORTED, "kernel=mma (the matrix-unit kernel): %s",
                                ctx->matrix_check_why);
        return CLATTN_SUCCESS; /* *used 0: the FMA kernel runs */
    }
    const int lanes = clattn__mma_lanes(c.layout);
    /* head_dim rounded up to the k of a product and to a 16-byte chunk of staging: NVIDIA f32
     * (tf32 m16n8k8) 8, AMD f32 (16x16x4) 4, 16-bit 16; head_dim_v to the columns of an O tile
     * (Intel: of a product's 8 rows) */
    const int elem = p->dtype == CLATTN_F32 ? 4 : 2, kdim = elem == 4 ? (c.layout ? 4 : 8) : 16;
    const int on = c.layout == 1 || c.layout == 2 ? 16 : 8;
    c.dp = (int)((p->head_dim + kdim - 1) / kdim * kdim);
    c.dvp = (int)((p->head_dim_v + on - 1) / on * on);
    /* NVIDIA f32 (3xTF32: two accumulators) above 64 columns: blocks of 64 columns, a work-group
     * each (S computed once per block), which keeps the accumulators in registers (ptxas spilled
     * at 128 columns). See docs/measurements.md#fused-mma. */
    if (elem == 4 && !c.layout && c.dvp > 64)
        c.dvp = 64;
    /* RDNA3's WMMA (16 registers an operand, all 256 a wave may have at 64-key tiles or Q's
     * fragments kept at 128): blocks of 128 columns, tests/mma_check.sh. */
    if (c.layout == 2 && c.dvp > 128)
        c.dvp = 128;
    /* Intel's XMX (sub-groups of 16: O's 128 columns take 128 registers of a work-item, half the
     * large register file the kernel is built for): blocks of 128 columns. Not yet compiled by
     * Intel's compiler nor measured on a device. */
    if (c.layout >= 3 && c.dvp > 128)
        c.dvp = 128;
    const int col_blocks = clattn__ceil_div_int((int)p->head_dim_v, c.dvp);
    /* Warps (16 rows each): up to 4, no more than the packed rows need. */
    if (nw <= 0) {
        nw = 4;
        while (nw > 1 && 16 * (nw / 2) >= R)
            nw /= 2;
    }
    c.nw = nw >= 8 ? 8 : nw >= 4 ? 4 : nw >= 2 ? 2 : 1;
    /* Keys a tile: NVIDIA 64 for 16-bit heads up to 64 wide, 32 above, 16 for f32 (3xTF32's split
     * operands and two accumulators: 32 keys spilled registers in ptxas for sm_90); AMD MFMA 64,
     * WMMA 32 (halved below to fit local memory). Not yet measured on a GPU. See
     * docs/measurements.md#fused-mma. */
    if (bn <= 0)
        bn = c.layout == 1 ? 64 : c.layout >= 2 ? 32 : elem == 2 ? (c.dp <= 64 ? 64 : 32) : 16;
    c.bn = bn >= 128 ? 128 : bn >= 64 ? 64 : bn >= 32 ? 32 : 16;
    if (c.layout >= 2 && c.bn > 64) /* WMMA: 128 keys spilled (docs/measurements.md#fused-mma) */
        c.bn = 64;
    /* Q's fragments in registers: 16-bit heads up to 128 (32 registers a lane); NVIDIA f32's
     * split operands would take twice that, so it reloads Q from local memory at each tile; AMD
     * MFMA any type up to 128, WMMA (whole rows a lane: 64 registers at 128) up to 64. */
    c.qreg = c.layout >= 2 ? c.dp <= 64 : (elem == 2 || c.layout) && c.dp <= 128;
    /* B fragments through ldmatrix: 16-bit types, up to 128 columns of O (at 256 ptxas spilled
     * for sm_80: tests/mma_check.sh), on NVIDIA once the probe passed */
    c.ldsm = !c.layout && elem == 2 && c.dvp <= 128 && clattn__matrix_ldsm(ctx, emulate);
    size_t cap = ctx->dev.max_wg < ctx->dev.max_item[0] ? ctx->dev.max_wg : ctx->dev.max_item[0];
    for (;;) {
        if ((size_t)lanes * c.nw <= cap && clattn__local_fits(ctx, mma_local_bytes(&c, elem, emulate)))
            break;
        if ((size_t)lanes * c.nw > cap && c.nw > 1)
            c.nw /= 2;
        else if (c.bn > 16)
            c.bn /= 2;
        else if (c.nw > 1)
            c.nw /= 2;
        else if (explicit_)
            return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                                "the matrix kernel with head_dim %lld / head_dim_v %lld does not fit the device's "
                                "%llu bytes of local memory or %llu work-items",
                                (long long)p->head_dim, (long long)p->head_dim_v,
                                (unsigned long long)ctx->dev.local_mem, (unsigned long long)cap);
        else
            return CLATTN_SUCCESS; /* *used 0: the FMA kernel runs */
    }
    const int bm = 16 * c.nw, row_tiles = clattn__ceil_div_int(R, bm);
    const long long tiles = (long long)row_tiles * col_blocks * p->batch * p->heads_kv;
    int split_len;
    const int splits = clattn__choose_splits(ctx, p, tiles, c.bn, lanes * c.nw, splits_req, &split_len);
    const uint64_t part_bytes = splits > 1 ? (uint64_t)splits * clattn__part_floats(p) * 4 : 0;
    clattn_mask_flags mf;
    clattn__plan_tile_flags(ctx, p, part_bytes, &mf);

    char opts[400];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d -DNW=%d -DBN=%d -DDP=%d -DDVP=%d "
             "-DQREG=%d -DMMA_NV=%d -DMMA_AMD=%d -DMMA_INTEL=%d -DMMA_LAYOUT=%d -DMMA_3X=1 -DMMA_ALIGN16=%d "
             "-DMMA_LDSM=%d%s -DKSEL=1 -DK_fused_mma=1",
             (int)p->dtype, splits > 1 ? (int)CLATTN_F32 : (int)p->out.dtype, p->has_mask ? (int)p->mask.dtype : 0,
             c.nw, c.bn, c.dp, c.dvp, c.qreg, !emulate && !c.layout, emulate || c.layout > 2 ? 0 : c.layout,
             !emulate && c.layout >= 3 ? c.layout - 2 : 0, c.layout,
             views_align16(ctx, p, elem), c.ldsm,
             mf.on ? " -DMFLAGS=1" : "");
    cl_kernel k;
    clattn_status st;
    if (!emulate && c.layout >= 3 && ctx->matrix_big_grf != 0) {
        /* Intel: the large register file (256 registers a thread, half the threads), which O's
         * accumulators and Q's fragments need (docs/architecture.md, matrix units); where the
         * build with it fails and without it succeeds, the context stops asking for it. */
        char big[sizeof opts + 40];
        snprintf(big, sizeof big, "%s -cl-intel-256-GRF-per-thread", opts);
        st = clattn__get_kernel(ctx, "fused_mma.cl", big, "fused_mma", &k);
        if (st == CLATTN_BUILD_FAILED) {
            char first[sizeof ctx->error];
            snprintf(first, sizeof first, "%s", ctx->error);
            clattn__clear_error(ctx);
            st = clattn__get_kernel(ctx, "fused_mma.cl", opts, "fused_mma", &k);
            if (st == CLATTN_SUCCESS)
                ctx->matrix_big_grf = 0;
            else if (st == CLATTN_BUILD_FAILED) /* the first build's log, which names the fault */
                clattn__fail(ctx, CLATTN_BUILD_FAILED, "%s", first);
        }
    } else {
        st = clattn__get_kernel(ctx, "fused_mma.cl", opts, "fused_mma", &k);
    }
    if (st == CLATTN_BUILD_FAILED && !explicit_ && (p->var.score_mod || p->var.mask_mod)) {
        /* With the user's score_mod or mask_mod the fault may be theirs: the FMA kernel runs
         * this call (and reports a snippet that does not compile), the matrix units stay. */
        clattn__clear_error(ctx);
        return CLATTN_SUCCESS;
    }
    if (st != CLATTN_SUCCESS && !emulate && !explicit_) {
        /* The driver refused the inline PTX (an older PTX version, say) or the kernel as built:
         * the matrix units are given up for this context, the FMA kernel runs. */
        char why[600];
        snprintf(why, sizeof why, "the driver refused the matrix kernel (%s): %.400s", clattn_status_name(st),
                 ctx->error);
        clattn__matrix_drop(ctx, why);
        clattn__clear_error(ctx);
        return CLATTN_SUCCESS;
    }
    if (st || (st = clattn__get_mask_kernels(ctx, p, &mf)))
        return st;
    *used = 1;
    const size_t local[3] = {(size_t)lanes * c.nw, 1, 1};
    const size_t global[3] = {(size_t)lanes * c.nw * col_blocks, (size_t)row_tiles,
                              (size_t)(p->batch * p->heads_kv) * (size_t)splits};
    return clattn__fused_launch_tiles(ctx, p, k, "fused_mma", part_bytes, &mf, splits, split_len, global, local,
                                      num_wait, wait, done);
}
