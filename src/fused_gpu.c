/* The GPU launchers of fused attention: the tiled kernel (fused_tiled.cl, prefill and decode,
 * and every device's fallback) and the decode kernels decode_rows and decode_lanes (decode.cl,
 * decode_lanes.cl). */
#include "fused.h"

#include <stdio.h>
#include <string.h>

typedef struct fused_cfg {
    int wgx, wgy, rm, ns, vw, nv, dp;
} fused_cfg;

/* Local memory of the tiled kernel: Qs, one buffer for Kᵀ then V, Ps, red and rsum (rows of Qs
 * and Ps padded by four words, which keeps them 16-byte aligned for vload4, rows of red and rsum
 * by one, against bank conflicts), and the two mask flags (seen_kt). Qs, KVs and Ps are 16-byte
 * aligned: red, rsum and the flags count as whole 16-byte units, an upper bound whatever order
 * the compiler lays the arrays out in. */
static size_t fused_local_bytes(const fused_cfg *c)
{
    const size_t bm = (size_t)c->wgy * c->rm, bn = (size_t)c->wgx * c->vw * c->ns,
                 dvp = (size_t)c->wgx * c->vw * c->nv, kv = (size_t)c->dp > dvp ? (size_t)c->dp : dvp;
    const size_t red = (bm * (c->wgx + 1) + 3) / 4 * 4;
    return 4 * ((c->dp + 4) * bm + kv * bn + (bn + 4) * bm + 2 * red + 4);
}


/* Makes the configuration fit the device: work-groups of at most `cap` work-items (the device's
 * largest, or what a kernel compiled with more allowed) and local memory (48 KiB on many GPUs).
 * The key tile shrinks first, down to 16 keys (it sets how many keys a barrier covers), then the
 * row tile (how often a K/V tile is reused), then the work-group. */
static int fit(const clattn_context *ctx, fused_cfg *c, int dv, size_t cap)
{
    for (int guard = 0; guard < 64; guard++) {
        c->nv = (dv + c->vw * c->wgx - 1) / (c->vw * c->wgx);
        const int wg_ok = (size_t)c->wgx * c->wgy <= cap &&
                          (size_t)c->wgx <= ctx->dev.max_item[0] && (size_t)c->wgy <= ctx->dev.max_item[1];
        if (wg_ok && clattn__local_fits(ctx, fused_local_bytes(c)))
            return 1;
        const int bn = c->wgx * c->vw * c->ns;
        if (!wg_ok && c->wgy > 1 && (size_t)c->wgx <= ctx->dev.max_item[0])
            c->wgy /= 2; /* too many work-items: fewer rows of them */
        else if (!wg_ok && c->wgx > 1)
            c->wgx /= 2;
        else if (c->ns > 1)
            c->ns /= 2;
        else if (c->vw > 4)
            c->vw /= 2;
        else if (bn > 16 && c->wgx > 1)
            c->wgx /= 2;
        else if (c->rm > 1)
            c->rm /= 2;
        else if (c->wgy > 1)
            c->wgy /= 2;
        else if (c->wgx > 1)
            c->wgx /= 2;
        else
            return 0;
    }
    return 0;
}


/* Whether a work-group of the decode kernels (decode_rows, decode_lanes) with `items`
 * work-items and `bytes` of local memory fits the device and `cap` (see fit). */
static int rows_fit(const clattn_context *ctx, size_t items, size_t bytes, size_t cap)
{
    return items <= cap && items <= ctx->dev.max_item[0] && clattn__local_fits(ctx, bytes);
}

/* The next smaller work-group of the decode kernels: fewer key groups, then fewer rows; 0 when
 * there is none. */
static int rows_shrink(int *kg, int *rm)
{
    if (*kg > 1)
        *kg /= 2;
    else if (*rm > 1)
        *rm = (*rm + 1) / 2;
    else
        return 0;
    return 1;
}

/* Builds kernel `name` of `file` with opts and launches it as the decode kernels run: work-groups
 * of wg work-items in x, row tiles in y, (batch, kv head, split) in z; sets *used once it has a
 * kernel and its workspace. */
static clattn_status launch_rows(clattn_context *ctx, const clattn_problem *p, const char *file,
                                 const char *name, const char *opts, int wg, int row_tiles, int splits,
                                 int split_len, cl_uint num_wait, const cl_event *wait, cl_event *done,
                                 int *used)
{
    cl_kernel k;
    clattn_status st = clattn__get_kernel(ctx, file, opts, name, &k);
    if (st)
        return st;
    cl_mem ws = NULL;
    if (splits > 1 && (st = clattn__workspace(ctx, (uint64_t)splits * clattn__part_floats(p) * 4, &ws)))
        return st;
    *used = 1;
    const size_t local[3] = {(size_t)wg, 1, 1};
    const size_t global[3] = {(size_t)wg, (size_t)row_tiles, (size_t)(p->batch * p->heads_kv) * (size_t)splits};
    return clattn__fused_launch(ctx, p, k, name, &p->k, &p->v, ws, 0, splits, split_len, global, local, NULL, num_wait,
                  wait, done);
}

/* decode_rows (DECODE DIRECT 2 and 3, decode.cl; GPUs): KG key groups (WGY, a power of 2,
 * default 4) of W = ceil(head_dim_v / 4) work-items, RM packed rows per work-group (0: the packed
 * rows, up to 16), KL lanes reading each key row for the scores (NS; 1: a lane reads its own key's
 * row), LC loads in flight per lane (VW), K and V read from global memory without local tiles.
 * DIRECT 3 rounds W up to a power of 2 below 32 lanes, or to a multiple of 32 above (the extra
 * lanes own no O columns), so that on NVIDIA GPUs each group synchronises alone with PTX
 * barriers (GSYNC, see decode.cl); elsewhere it is DIRECT 2 with the rounded W. Sets *used = 0
 * (and enqueues nothing) when even one group does not fit the device's local memory or `cap`
 * work-items (see fit); the tiled kernel then runs instead. */
clattn_status clattn__fused_run_rows(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                              size_t cap, cl_uint num_wait, const cl_event *wait, cl_event *done,
                              int *used)
{
    *used = 0;
    const int R = (int)(p->heads_q / p->heads_kv) * (int)p->seq_q;
    const int group_sync = pp->decode.DIRECT == CLATTN_KERNEL_ROWS_SYNC;
    const int dp = (int)((p->head_dim + 3) / 4 * 4);
    int w = (int)((p->head_dim_v + 3) / 4);
    if (group_sync)
        w = w <= 32 ? clattn__pow2_at_least(w) : (w + 31) / 32 * 32;
    int kg = 1;
    while (kg < 8 && 2 * kg <= (pp->decode_rows.KG > 0 ? pp->decode_rows.KG : 4))
        kg *= 2;
    int rm = pp->decode.RM > 0 ? pp->decode.RM : R;
    rm = rm < 1 ? 1 : rm > 16 ? 16 : rm;
    /* Lanes per key row (NS): a power of 2, at most W and at most the row's 16-byte chunks. */
    int kl = 1;
    while (kl < 32 && 2 * kl <= pp->decode_rows.KL && 2 * kl <= w && 2 * kl <= dp / 4)
        kl *= 2;
    /* Loads in flight per lane (VW): 4, 8 or 16. */
    const int lc = pp->decode_rows.LC == 4 || pp->decode_rows.LC == 16 ? pp->decode_rows.LC : 8;
    for (;;) {
        /* Sc and Pr, Sv, Pt (decode.cl: SP_FLOATS) */
        const size_t sp =
            (size_t)2 * kg * rm * w + (size_t)kg * w + (kl > 1 ? (size_t)kg * rm * w * (kl + 1) : 0);
        const size_t fin = (size_t)(kg / 2) * rm * (4 * w + 2);
        const size_t bytes = (size_t)16 * rm * (dp / 4) + 4 * (sp > fin ? sp : fin);
        if (rows_fit(ctx, (size_t)kg * w, bytes, cap))
            break;
        if (!rows_shrink(&kg, &rm))
            return CLATTN_SUCCESS;
    }
    const int bn = kg * w, row_tiles = clattn__ceil_div_int(R, rm);
    const long long tiles = (long long)row_tiles * p->batch * p->heads_kv;
    int split_len;
    /* Few registers and no local tiles: counted as half-size work-groups, so that twice as many
     * are in flight to hide memory latency (H100, B16 H32 kv8192 d128: 5 splits 1.47 TB/s,
     * 16 splits 1.68 TB/s). */
    const int splits =
        clattn__choose_splits(ctx, p, tiles, bn, bn / 2 > 0 ? bn / 2 : 1, pp->decode.SPLITS, &split_len);

    /* PTX group barriers: NVIDIA GPUs only, groups of whole warps or within whole warps. */
    const int gsync = group_sync && (ctx->dev.type & CL_DEVICE_TYPE_GPU) && ctx->dev.vendor_id == 0x10de &&
                      (w % 32 == 0 || (32 % w == 0 && bn % 32 == 0));

    char opts[256];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d -DKG=%d -DW=%d -DRM=%d "
             "-DDP=%d -DKL=%d -DLC=%d -DKFULL=%d -DVFULL=%d -DGSYNC=%d",
             (int)p->dtype, splits > 1 ? (int)CLATTN_F32 : (int)p->out.dtype,
             p->has_mask ? (int)p->mask.dtype : 0, kg, w, rm, dp, kl, lc, p->head_dim % 4 == 0,
             4 * (int64_t)w == p->head_dim_v, gsync);
    return launch_rows(ctx, p, "decode.cl", "decode_rows", opts, bn, row_tiles, splits, split_len, num_wait,
                       wait, done, used);
}

/* decode_lanes (DECODE DIRECT 4 and 5, decode_lanes.cl; GPUs): KG key groups (WGY, a power of 2,
 * default 4) of LANES work-items (NS: a power of 2 up to 32 and up to the 16-byte chunks of the
 * longer of a K and a V row; 0 or 1: that many chunks, up to 32) that read every key row
 * together, RM packed rows (0: the packed rows; at most 16, and at most 16 O chunks a lane), KU
 * keys a step whose K and V rows are loaded before their use (VW: 1 to 16, default 8; fewer while
 * a lane would hold more than 16 row chunks or 64 scores). On NVIDIA GPUs with DIRECT 4 the lanes
 * sum their partial scores with PTX shuffles (SHFL), for which a work-group is made at least one
 * warp (more groups); elsewhere, and with DIRECT 5 (no inline PTX), through local memory. Sets
 * *used = 0 (and enqueues nothing) when one group does not fit the device's limits or `cap`
 * work-items; the tiled kernel then runs instead. */
clattn_status clattn__fused_run_lanes(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                               size_t cap, cl_uint num_wait, const cl_event *wait, cl_event *done,
                               int *used)
{
    *used = 0;
    const int R = (int)(p->heads_q / p->heads_kv) * (int)p->seq_q;
    const int dp = (int)((p->head_dim + 3) / 4 * 4), dvp = (int)((p->head_dim_v + 3) / 4 * 4);
    const int ptx = (ctx->dev.type & CL_DEVICE_TYPE_GPU) && ctx->dev.vendor_id == 0x10de &&
                    pp->decode.DIRECT == CLATTN_KERNEL_LANES;
    const int chunks = (dp > dvp ? dp : dvp) / 4, most = clattn__pow2_at_least(chunks < 32 ? chunks : 32);
    int lanes = most;
    if (pp->decode_lanes.LANES >= 2) { /* at most one lane per chunk */
        lanes = 1;
        while (lanes < most && 2 * lanes <= pp->decode_lanes.LANES)
            lanes *= 2;
    }
    int kg = 1;
    while (kg < 16 && 2 * kg <= (pp->decode_lanes.KG > 0 ? pp->decode_lanes.KG : 4))
        kg *= 2;
    if (ptx && kg * lanes < 32)
        kg = 32 / lanes; /* shuffles take whole warps */
    const int ckn = (dp / 4 + lanes - 1) / lanes, cvn = (dvp / 4 + lanes - 1) / lanes;
    /* Rows: the packed rows, at most 16 and at most 16 O chunks a lane, in tiles of equal size
     * (the work of a tile grows with RM whether its rows exist or not). */
    int rm = pp->decode.RM > 0 ? pp->decode.RM : R;
    rm = rm < 1 ? 1 : rm > R ? R : rm;
    while (rm > 1 && (rm > 16 || rm * cvn > 16))
        rm = (rm + 1) / 2;
    rm = clattn__ceil_div_int(R, clattn__ceil_div_int(R, rm));
    int ku = 1;
    while (ku < 16 && 2 * ku <= (pp->decode_lanes.KU > 0 ? pp->decode_lanes.KU : 8))
        ku *= 2;
    while (ku > 1 && (ku * (ckn + cvn) > 16 || rm * ku > 64))
        ku /= 2;
    int shfl;
    for (;;) {
        shfl = ptx && (kg * lanes) % 32 == 0;
        const size_t xch = shfl ? 0 : (size_t)2 * rm * ku * kg * lanes;
        const size_t fin = (size_t)(kg / 2) * rm * (4 * lanes * cvn + 4);
        const size_t bytes = (size_t)16 * rm * ckn * lanes + 4 * (xch > fin ? xch : fin);
        if (rows_fit(ctx, (size_t)kg * lanes, bytes, cap))
            break;
        if (!rows_shrink(&kg, &rm))
            return CLATTN_SUCCESS;
    }
    const int bn = kg * ku, wg = kg * lanes, row_tiles = clattn__ceil_div_int(R, rm);
    const long long tiles = (long long)row_tiles * p->batch * p->heads_kv;
    int split_len;
    /* Few registers and no local tiles, as decode_rows: counted as half-size work-groups. */
    const int splits =
        clattn__choose_splits(ctx, p, tiles, bn, wg / 2 > 0 ? wg / 2 : 1, pp->decode.SPLITS, &split_len);

    char opts[256];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d -DKG=%d -DLANES=%d -DRM=%d "
             "-DDP=%d -DDVP=%d -DKU=%d -DKFULL=%d -DVFULL=%d -DSHFL=%d -DMASKED=%d",
             (int)p->dtype, splits > 1 ? (int)CLATTN_F32 : (int)p->out.dtype,
             p->has_mask ? (int)p->mask.dtype : 0, kg, lanes, rm, dp, dvp, ku, p->head_dim % 4 == 0,
             p->head_dim_v % 4 == 0, shfl, p->has_mask != 0);
    return launch_rows(ctx, p, "decode_lanes.cl", "decode_lanes", opts, wg, row_tiles, splits, split_len,
                       num_wait, wait, done, used);
}

/* The tiled kernel (fused_tiled.cl: fused) with configuration c, fitted to work-groups of at most cap
 * work-items. */
static clattn_status run_tiled(clattn_context *ctx, const clattn_problem *p, fused_cfg *c, size_t cap,
                               const clattn_params *pp, cl_uint num_wait, const cl_event *wait,
                               cl_event *done)
{
    const int R = (int)(p->heads_q / p->heads_kv) * (int)p->seq_q;
    const int decode = p->seq_q <= 16;
    if (!fit(ctx, c, (int)p->head_dim_v, cap))
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "fused attention with head_dim %lld / head_dim_v %lld does not fit the "
                            "device's %llu bytes of local memory (%llu for a kernel's arrays)",
                            (long long)p->head_dim, (long long)p->head_dim_v,
                            (unsigned long long)ctx->dev.local_mem,
                            (unsigned long long)clattn__local_budget(ctx));
    const int bm = c->wgy * c->rm, bn = c->wgx * c->vw * c->ns;
    const int row_tiles = clattn__ceil_div_int(R, bm);
    const long long tiles = (long long)row_tiles * p->batch * p->heads_kv;

    int split_len;
    const int splits = clattn__choose_splits(ctx, p, tiles, bn, c->wgx * c->wgy,
                                     decode ? pp->decode.SPLITS : 0, &split_len);
    /* Workspace: the partials, then the mask's flags (bytes). */
    const uint64_t part_bytes = splits > 1 ? (uint64_t)splits * clattn__part_floats(p) * 4 : 0;
    clattn_mask_flags mf;
    clattn__plan_tile_flags(ctx, p, part_bytes, &mf);

    /* The fitted tile under the parameters' own names (WGX WGY RM NS VW), then what the fit derives. */
    clattn_params fitted;
    memset(&fitted, 0, sizeof fitted);
    fitted.fused.WGX = c->wgx;
    fitted.fused.WGY = c->wgy;
    fitted.fused.RM = c->rm;
    fitted.fused.NS = c->ns;
    fitted.fused.VW = c->vw;
    char tile[128];
    clattn__params_defines(CLATTN_OP_FUSED, &fitted, 0, 5, tile, sizeof tile);
    char opts[360];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d %s "
             "-DNV=%d -DDP=%d -DEXP2_POLY=%d%s -DKSEL=1 -DK_fused=1",
             (int)p->dtype, splits > 1 ? (int)CLATTN_F32 : (int)p->out.dtype,
             p->has_mask ? (int)p->mask.dtype : 0, tile, c->nv, c->dp,
             (ctx->dev.type & CL_DEVICE_TYPE_CPU) ? 1 : 0, mf.on ? " -DMFLAGS=1" : "");
    cl_kernel k;
    clattn_status st;
    if ((st = clattn__get_mask_kernels(ctx, p, &mf)) ||
        (st = clattn__get_kernel(ctx, "fused_tiled.cl", opts, "fused", &k)))
        return st;
    const size_t local[3] = {(size_t)c->wgx, (size_t)c->wgy, 1};
    const size_t global[3] = {(size_t)c->wgx, (size_t)row_tiles * c->wgy,
                              (size_t)(p->batch * p->heads_kv) * (size_t)splits};
    return clattn__fused_launch_tiles(ctx, p, k, "fused", part_bytes, &mf, splits, split_len, global, local,
                                      num_wait, wait, done);
}


clattn_status clattn__fused_run_tiled(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                                      clattn_params_source source, cl_uint num_wait, const cl_event *wait,
                                      cl_event *done)
{
    const int R = (int)(p->heads_q / p->heads_kv) * (int)p->seq_q;
    /* The same slots in FUSED and DECODE. */
    const int wgx = pp->fused.WGX, wgy = pp->fused.WGY, rm = pp->fused.RM, ns = pp->fused.NS;
    const int vw = pp->fused.VW == 8 || pp->fused.VW == 16 ? pp->fused.VW : 4;
    /* RM and NS beyond the tuner's range (16, 2) only spill registers and can keep a kernel
     * compiler busy for minutes: at most 16 rows and 4 key blocks per work-item. */
    fused_cfg c = {wgx > 0 ? wgx : 8, wgy > 0 ? wgy : 1, rm > 16 ? 16 : rm, ns <= 0 ? 1 : ns > 4 ? 4 : ns, vw, 1,
                   (int)((p->head_dim + 3) / 4 * 4)};
    if (c.rm <= 0) /* decode: one work-group row covers the packed rows, up to 16 */
        c.rm = clattn__pow2_at_least(R < 16 ? R : 16);
    for (size_t cap = ctx->dev.max_wg;;) {
        clattn_status st = run_tiled(ctx, p, &c, cap, pp, num_wait, wait, done);
        if (!(cap = clattn__retry_cap(ctx, st, source, cap)))
            return st;
    }
}
