/* The last two sources of kernel parameters (after overrides, the environment, the user file and
 * the built-in tables: tuning.c): vendor defaults by device class, then generic defaults. Values
 * are in the order of params.h's tables; the comment beside each names its kernel. */
#include "internal.h"

#include <string.h>

/* Generic: modest tiles any OpenCL 1.2 GPU runs (work-groups <= 256, little local memory). */
void clattn__generic_defaults(clattn_op op, clattn_params *p)
{
    static const int v[CLATTN_OP_COUNT][CLATTN_MAX_PARAMS] = {
        /* scores: WGX WGY RM NS TK VW KF KT DIRECT=tiled */
        {16, 16, 4, 1, 16, 4, 0, 0, CLATTN_KERNEL_TILED},
        /* pv: the same */
        {16, 16, 4, 1, 16, 4, 0, 0, CLATTN_KERNEL_TILED},
        /* softmax: WG ROWS, a work-group of 256 per row */
        {256, 0},
        /* fused: WGX WGY RM NS VW DIRECT=tiled */
        {8, 8, 4, 1, 4, CLATTN_KERNEL_TILED},
        /* decode: decode_lanes, KG 4 key groups, LANES automatic, KU 8 keys a step */
        {32, 4, 0, 0, 8, 0, CLATTN_KERNEL_LANES},
        /* merge: WG */
        {64},
    };
    memcpy(p->v, v[op], sizeof v[op]);
}

/* Vendor defaults: CPUs (PoCL, Intel's CPU runtime) want one work-item doing a lot with wide
 * vectors and no barriers; measured on PoCL, AVX-512. Returns 0 when there is no vendor table. */
int clattn__vendor_defaults(const clattn_devinfo *d, clattn_op op, clattn_params *p, const char **what)
{
    if (d->type & CL_DEVICE_TYPE_CPU) {
        static const int v[CLATTN_OP_COUNT][CLATTN_MAX_PARAMS] = {
            {1, 1, 6, 4, 16, 16, 1, 1, CLATTN_KERNEL_DIRECT}, /* scores: direct, 6 x 64 register tile */
            {1, 1, 6, 4, 16, 16, 0, 0, CLATTN_KERNEL_DIRECT}, /* pv: direct, 6 x 64 register tile */
            {16, 2},                                          /* softmax: one work-item per 2 rows */
            {1, 1, 6, 4, 16, CLATTN_KERNEL_DIRECT},           /* fused: direct, 6 rows x 64-key chunks */
            {1, 1, 0, 4, 16, 0, CLATTN_KERNEL_DIRECT},        /* decode: direct, K and V read in place */
            {1},                                              /* merge: a work-item a row */
        };
        memcpy(p->v, v[op], sizeof v[op]);
        /* fused: the 6 x 64 score tile (24 accumulators) keeps both 512-bit FMA units busy, where
         * 6 x 16 waits on their latency (B1 H8 S1024 d64 f32: 7.6-8.4 ms against 9.3-9.5). With
         * AVX2 the fit (scores.c) gives 6 x 16. Journal: docs/measurements.md#vendor-defaults-cpu */
        *what = "vendor defaults (CPU devices)";
        return 1;
    }
    if ((d->type & CL_DEVICE_TYPE_GPU) && d->vendor_id == 0x10de) {
        /* fused 4,16,4,1,4 (64 rows x 16 keys): 21.4 TFLOP/s on an H100 at B4 H16 S4096 d64 f32
         * against 15.2 for the generic tile; decode keeps the generic decode_lanes (H200, B16 H32
         * kv8192 d128 f32: 4296 GB/s against 1717 for decode_rows). The other operations keep the
         * generic values. Journal: docs/measurements.md#vendor-defaults-nvidia */
        clattn__generic_defaults(op, p);
        if (op == CLATTN_OP_FUSED) {
            p->fused.WGX = 4;
            p->fused.WGY = 16;
            p->fused.RM = 4;
            p->fused.NS = 1;
            p->fused.VW = 4;
            p->fused.DIRECT = CLATTN_KERNEL_TILED;
        }
        *what = "vendor defaults (NVIDIA GPUs)";
        return 1;
    }
    return 0;
}

/* On GPUs decode_lanes (the defaults' decode kernel) keeps every row in its lanes' registers; the
 * tiled kernel shares each K and V tile among its rows through local memory and wins from 16
 * packed rows per kv head (H100, B16 H32/8 Skv8192 d128 f32, 32 rows: 1.65 ms against 3.43). Only
 * for values the library chose (generic, vendor, built-in), and heads up to 128 (not measured
 * wider). Journal: docs/measurements.md#tiled-decode-rows */
#define TILED_DECODE_ROWS 16

int clattn__decode_tiled_default(const clattn_context *ctx, int64_t rows, int64_t head_dim,
                                 int64_t head_dim_v, clattn_params_source source, int *v)
{
    clattn_params p;
    memcpy(p.v, v, sizeof(p.decode)); /* v holds DECODE's values */
    if (!(ctx->dev.type & CL_DEVICE_TYPE_GPU) || source > CLATTN_SOURCE_BUILTIN ||
        (p.decode.DIRECT != CLATTN_KERNEL_LANES && p.decode.DIRECT != CLATTN_KERNEL_LANES_LOCAL) ||
        rows < TILED_DECODE_ROWS || head_dim > 128 || head_dim_v > 128)
        return 0;
    /* The row tile covers the rows, up to 64 (the prefill default's); SPLITS is kept. */
    p.decode.WGX = 8;
    p.decode.WGY = rows >= 64 ? 16 : (int)((rows + 3) / 4);
    p.decode.RM = 4;
    p.decode.NS = 1;
    p.decode.VW = 4;
    p.decode.DIRECT = CLATTN_KERNEL_TILED;
    memcpy(v, p.v, sizeof(p.decode));
    return 1;
}
