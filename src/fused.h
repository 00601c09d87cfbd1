/* Private to the fused-attention files: fused.c (dispatch, key splits, the common launch),
 * fused_cpu.c (fused_direct and fused_lanes launchers), fused_gpu.c (the tiled kernel and the
 * decode kernels' launchers), fused_mma.c (the matrix kernel) and mask_pass.c (the mask's block
 * flags). */
#ifndef CLATTN_FUSED_H
#define CLATTN_FUSED_H

#include "internal.h"

/* ceil(a / b) for a >= 1, b >= 1, without forming a + b (packed rows R may be close to INT_MAX:
 * validation bounds heads_q / heads_kv x seq_q by it). */
static inline int clattn__ceil_div_int(int a, int b) { return (a - 1) / b + 1; }


/* Floats of one split's partial result (O and LSE). */
static inline size_t clattn__part_floats(const clattn_problem *p)
{
    return (size_t)(p->batch * p->heads_q * p->seq_q) * (size_t)(p->head_dim_v + 1);
}


static inline int clattn__pow2_at_least(int x)
{
    int p = 1;
    while (p < x)
        p *= 2;
    return p;
}


/* The mask's block flags (MFLAGS, mask_pass.cl) in the workspace: slices nb·nh of `rows` rows of
 * `chunks` bytes (one per 16 keys), from byte `off`; strides in bytes, 0 where the mask
 * broadcasts. Then, from int s_off of the workspace, each row's span (two ints: its first chunk
 * with a visible key and one past its last), and with `unions` (fused_direct's K/V copies), from
 * int u_off, the hull of the spans of each kv head's rows (mask_union: its first chunk to the end
 * of its last). `bytes` covers them all. on 0: the kernels scan the mask itself. kflags, kspans
 * and kunion: the kernels that fill them (clattn__get_mask_kernels). */
typedef struct clattn_mask_flags {
    int on, nh, rows, chunks, unions;
    uint64_t slices, bytes;
    cl_ulong off, sb, sh, ss, s_off, u_off;
    cl_kernel kflags, kspans, kunion;
} clattn_mask_flags;


/* fused.c: key splits (flash-decoding) and the launch every fused kernel shares. */
int clattn__choose_splits(const clattn_context *ctx, const clattn_problem *p, long long tiles, int bn,
                          int wg_items, int requested, int *split_len);
clattn_status clattn__fused_launch(clattn_context *ctx, const clattn_problem *p, cl_kernel kernel, const char *name,
                                   const clattn_view *k, const clattn_view *v, cl_mem ws, uint64_t part_off,
                                   int splits, int split_len, const size_t global[3], const size_t local[3],
                                   const clattn_mask_flags *mf, cl_uint num_wait, const cl_event *wait,
                                   cl_event *done);

/* fused.c, for the kernels that cover row tiles (fused_tiled.cl, fused_mma.cl): the mask's flags
 * planned after part_bytes of split partials in the workspace (off where both would not fit one
 * allocation), then the workspace, the mask passes and the kernel's launch. */
void clattn__plan_tile_flags(const clattn_context *ctx, const clattn_problem *p, uint64_t part_bytes,
                             clattn_mask_flags *mf);
clattn_status clattn__fused_launch_tiles(clattn_context *ctx, const clattn_problem *p, cl_kernel kernel,
                                         const char *name, uint64_t part_bytes, const clattn_mask_flags *mf,
                                         int splits, int split_len, const size_t global[3], const size_t local[3],
                                         cl_uint num_wait, const cl_event *wait, cl_event *done);

/* mask_pass.c: plans, builds and enqueues mask_flags, mask_spans and mask_union (mask_pass.cl). */
void clattn__plan_mask_flags(const clattn_problem *p, uint64_t at, int unions, clattn_mask_flags *f);
clattn_status clattn__get_mask_kernels(clattn_context *ctx, const clattn_problem *p, clattn_mask_flags *f);
clattn_status clattn__run_mask_flags(clattn_context *ctx, const clattn_problem *p, cl_mem ws,
                                     const clattn_mask_flags *f, cl_uint *num_wait, const cl_event **wait);

/* fused_cpu.c: fused_direct / fused_lanes (CPUs). Sets *used = 0 and enqueues nothing where the
 * copies do not fit; the caller then tries in place, then the tiled kernel. */
clattn_status clattn__fused_run_direct(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                                       int in_place, cl_uint num_wait, const cl_event *wait, cl_event *done,
                                       int *used);

/* fused_gpu.c: decode_rows and decode_lanes (GPU decode; *used = 0 when one group does not fit,
 * the tiled kernel then runs), and the tiled kernel for prefill and decode. */
clattn_status clattn__fused_run_rows(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                                     size_t cap, cl_uint num_wait, const cl_event *wait, cl_event *done,
                                     int *used);
clattn_status clattn__fused_run_lanes(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                                      size_t cap, cl_uint num_wait, const cl_event *wait, cl_event *done,
                                      int *used);
clattn_status clattn__fused_run_tiled(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                                      clattn_params_source source, cl_uint num_wait, const cl_event *wait,
                                      cl_event *done);


/* fused_mma.c: the matrix-unit kernel (fused_mma.cl): nw warps and bn keys a tile (0: its own
 * defaults), splits_req key splits (0: automatic), the emulated layer or the device's backend.
 * Sets *used = 0 and enqueues nothing where no tile fits, or where the driver refuses the kernel
 * (the context then gives up its matrix backend), unless the choice was explicit_ (an error then). */
clattn_status clattn__fused_run_mma(clattn_context *ctx, const clattn_problem *p, int nw, int bn, int splits_req,
                                    int emulate, int explicit_, cl_uint num_wait, const cl_event *wait,
                                    cl_event *done, int *used);

#endif
