/* The unfused path's two GEMMs (gemm_tiled.cl on GPUs, gemm_direct.cl on CPUs) and their layout
 * copies (layout.cl): scale·QKᵀ with masks, and P·V. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* Clamps tile parameters to what the device can run, with work-groups of at most cap work-items
 * (the device's largest, or what a kernel compiled with more allowed). */
static void sane_gemm(const clattn_context *ctx, clattn_params *pp, size_t cap)
{
    int *const wgx = &pp->gemm.WGX, *const wgy = &pp->gemm.WGY, *const rm = &pp->gemm.RM, *const ns = &pp->gemm.NS,
              *const tk = &pp->gemm.TK, *const vw = &pp->gemm.VW;
    int *const sizes[5] = {wgx, wgy, rm, ns, tk};
    for (int i = 0; i < 5; i++) /* VW is checked below */
        if (*sizes[i] <= 0)
            *sizes[i] = 1;
    /* Register blocks and the unrolled k loop beyond the tuner's range (RM 16, NS 4, TK 64) only
     * spill, and can keep a kernel compiler busy for minutes. */
    *rm = *rm > 16 ? 16 : *rm;
    *ns = *ns > 4 ? 4 : *ns;
    *tk = *tk > 64 ? 64 : *tk;
    *tk = (*tk + 3) / 4 * 4; /* tiles are loaded as float4 along k */
    if (*vw != 8 && *vw != 16)
        *vw = 4;
    while ((size_t)*wgx * (size_t)*wgy > cap && *wgy > 1)
        *wgy /= 2;
    while ((size_t)*wgx * (size_t)*wgy > cap && *wgx > 1)
        *wgx /= 2;
    /* Local memory: As[TK][TM] + Bs[TK][TN] floats. */
    for (;;) {
        size_t bytes = 4u * ((size_t)(*tk + 4) * *wgy * *rm + (size_t)*tk * *wgx * *vw * *ns);
        if (clattn__local_fits(ctx, bytes) || *tk <= 4)
            break;
        *tk = (*tk / 2 + 3) / 4 * 4;
    }
}

/* The register tile: rm x ns float16 accumulators, with ns float16 of B (K, V) and a broadcast
 * value of A beside them, in NREG16 float16 values (device.c): rm·ns at most three quarters of
 * them and ns·(rm + 1) all but one, ns giving way first. AVX-512 (32) allows 6 x 64, AVX2 (8)
 * 6 x 16, where 6 x 64 spills at every k (scores, B1 H8 S1024 d64 on AVX2: 21.2 ms against 11.5).
 * fused_direct's scores tile is the same. Journal: docs/measurements.md#fit-register-tile */
void clattn__fit_register_tile(const clattn_context *ctx, int *rm, int *ns)
{
    const int n = ctx->dev.nreg16;
    while (*rm * *ns > 3 * n / 4 || *ns * (*rm + 1) > n - 1) {
        if (*ns > 1)
            --*ns;
        else if (*rm > 1)
            --*rm;
        else
            break;
    }
}

void clattn__fit_gemm_tile(const clattn_context *ctx, clattn_op op, int *v)
{
    clattn_params p;
    memcpy(p.v, v, sizeof p.gemm); /* v holds SCORES' or PV's values */
    if (p.gemm.DIRECT == CLATTN_KERNEL_DIRECT && (op == CLATTN_OP_PV || p.gemm.KT > 0)) {
        /* in place: rows tiled in common.cl */
        clattn__fit_register_tile(ctx, &p.gemm.RM, &p.gemm.NS);
        memcpy(v, p.v, sizeof p.gemm);
    }
}

/* fused_direct keeps a row block's O, rm x dv16 float16 vectors, in registers through P·V when
 * they fit (PV_TILE 0); past three quarters of the registers that spills (d64 with RM 8: 10.2 ms
 * against 7.9 with RM 6), so rm gives way to the most rows that keep O within three quarters;
 * larger blocks tile O (PV_TILE 1). Journal: docs/measurements.md#fit-fused-tile */
void clattn__fit_fused_tile(const clattn_context *ctx, int64_t head_dim_v, int *rm, int *ns)
{
    *rm = *rm < 1 ? 1 : *rm > 32 ? 32 : *rm;
    *ns = *ns < 1 ? 1 : *ns > 4 ? 4 : *ns;
    clattn__fit_register_tile(ctx, rm, ns);
    const int n = ctx->dev.nreg16;
    const int dv16 = head_dim_v < 1 ? 1 : head_dim_v > 256 ? 16 : (int)((head_dim_v + 15) / 16);
    if (*rm * dv16 > 3 * n / 4 && *rm * dv16 <= n && 3 * n / 4 >= dv16)
        *rm = 3 * n / 4 / dv16;
}

/* Tile parameters of one GEMM (see tuning.c), clamped to the device; returns their source. */
static clattn_params_source gemm_params(clattn_context *ctx, int mode, const clattn_problem *p,
                                        clattn_params *pp)
{
    clattn_bucket bucket = {mode == 0 ? CLATTN_OP_SCORES : CLATTN_OP_PV, p->dtype,
                            (int)p->head_dim, clattn__seq_q_class(p->seq_q),
                            clattn__log2_ceil(p->seq_kv),
                            clattn__mask_kind(p->causal, p->has_mask || p->kv_lengths)};
    const clattn_params_source source = clattn__default_params(ctx, &bucket, pp);
    sane_gemm(ctx, pp, ctx->dev.max_wg);
    if (mode != 0)
        pp->gemm.KF = pp->gemm.KT = 0; /* scores-only */
    clattn__fit_gemm_tile(ctx, mode == 0 ? CLATTN_OP_SCORES : CLATTN_OP_PV, pp->v);
    return source;
}

/* Scores with at most 16 query rows per head, or 32 when the heads' K exceed a quarter of the
 * device's cache (or its size is unknown), read K in place (scores_in_place) where DIRECT would
 * read a Kᵀ copy, which few rows do not repay (seq_kv 16384, seq_q 8: 2.6 ms against 8.2).
 * Journal: docs/measurements.md#scores-in-place-rows */
#define SCORES_IN_PLACE_ROWS 16

int clattn__scores_in_place(const clattn_context *ctx, const int *v, int64_t seq_q, uint64_t k_bytes)
{
    clattn_params p;
    memcpy(p.v, v, sizeof p.gemm); /* v holds SCORES' values */
    return p.gemm.DIRECT == CLATTN_KERNEL_DIRECT &&
           (p.gemm.KT <= 0 || seq_q <= SCORES_IN_PLACE_ROWS ||
            (seq_q <= 2 * SCORES_IN_PLACE_ROWS && k_bytes > ctx->dev.cache_size / 4));
}

static int scores_in_place(const clattn_context *ctx, const clattn_params *pp, const clattn_problem *p)
{
    const uint64_t k_bytes = clattn__mul_sat((uint64_t)p->batch * (uint64_t)p->heads_kv * (uint64_t)p->head_dim *
                                                 (uint64_t)clattn_dtype_size(p->dtype),
                                             (uint64_t)p->seq_kv);
    return clattn__scores_in_place(ctx, pp->v, p->seq_q, k_bytes);
}

/* Kᵀ scratch of KT scores: [batch·heads_kv][head_dim·pitch] floats, rows of pitch floats for
 * the gemm kernel (the pitch plus one cache line, so that rows of a power-of-two length do not
 * all fall into one L1 set), panels of 16·NS keys for scores_direct (which reads whole panels:
 * the pitch covers them). */
/* The keys of a Kᵀ panel: the tile's 16·NS for scores_direct (DIRECT), 0 (rows) for gemm. */
static int kt_panel(const clattn_params *pp)
{
    return pp->gemm.DIRECT == CLATTN_KERNEL_DIRECT ? 16 * pp->gemm.NS : 0;
}

static uint64_t kt_pitch(const clattn_problem *p, const clattn_params *pp)
{
    const uint64_t tn = 16u * (uint64_t)(pp->gemm.NS > 0 ? pp->gemm.NS : 1);
    return ((uint64_t)p->seq_kv + tn - 1) / tn * tn + 16;
}

/* Rows of 16·ceil(cols / 16) floats: the widen kernels' f32 copies. */
static uint64_t widen_pitch(int64_t cols) { return ((uint64_t)cols + 15) / 16 * 16; }

/* Bytes of the widen kernels' copy of a batch x heads x rows x cols tensor:
 * products below 2^45 x 2^31. */
static uint64_t widen_bytes(int64_t batch, int64_t heads, int64_t rows, int64_t cols)
{
    return clattn__mul_sat(4u * (uint64_t)batch * (uint64_t)heads * widen_pitch(cols), (uint64_t)rows);
}

/* The f16/bf16 tensor x (batch x heads x rows x cols) as f32 rows into scratch from element
 * `off` (kernel `name`: widen_q or widen_v, layout.cl), and *out its view. */
static clattn_status widen(clattn_context *ctx, const char *name, const clattn_view *x, int64_t batch,
                           int64_t heads, int64_t rows, int64_t cols, cl_mem scratch, uint64_t off,
                           clattn_view *out, cl_uint num_wait, const cl_event *wait)
{
    char opts[128]; /* one program for widen_q and widen_v (KSEL, common.cl) */
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDT_IN=%d -DDT_A=0 -DDT_OUT=0 -DDT_MASK=0 -DKSEL=1 -DK_widen=1",
             (int)x->dtype);
    cl_kernel k;
    clattn_status st = clattn__get_kernel(ctx, "layout.cl", opts, name, &k);
    if (st)
        return st;
    const cl_ulong pitch = widen_pitch(cols), xf_off = off;
    const int n = (int)rows, c = (int)cols, h = (int)heads;
    clattn_args a = {k, 0, CL_SUCCESS};
    clattn__arg_view(&a, x);
    clattn__arg(&a, sizeof(cl_mem), &scratch);
    clattn__arg(&a, sizeof(cl_ulong), &xf_off);
    clattn__arg(&a, sizeof(cl_ulong), &pitch);
    clattn__arg(&a, sizeof(int), &n);
    clattn__arg(&a, sizeof(int), &c);
    clattn__arg(&a, sizeof(int), &h);
    const size_t local[2] = {1, 1};
    const size_t global[2] = {(size_t)(((uint64_t)rows + 15) / 16), (size_t)(batch * heads)};
    const cl_ulong hsz = (cl_ulong)rows * pitch;
    *out = (clattn_view){scratch, CLATTN_F32, off, {hsz * (cl_ulong)heads, hsz, pitch}};
    return clattn__enqueue(ctx, &a, 2, global, local, num_wait, wait, NULL, name);
}

/* Bytes of scores_direct's f32 copy of an f16/bf16 Q (widen_q), with 64 of slack so that it
 * can start at a multiple of 16 floats; 0 for f32 Q or another kernel. */
static uint64_t q_copy_bytes(const clattn_problem *p, const clattn_params *pp)
{
    if (p->q.dtype == CLATTN_F32 || pp->gemm.DIRECT != CLATTN_KERNEL_DIRECT)
        return 0;
    return clattn__add_sat(widen_bytes(p->batch, p->heads_q, p->seq_q, p->head_dim), 64);
}

/* Bytes of the Kᵀ copy: batch·heads_kv blocks of head_dim x kt_pitch floats (2^41 x 2^31). */
static uint64_t kt_bytes(const clattn_problem *p, const clattn_params *pp)
{
    return clattn__mul_sat(4u * (uint64_t)p->batch * (uint64_t)p->heads_kv * (uint64_t)p->head_dim,
                           kt_pitch(p, pp));
}

uint64_t clattn__scores_scratch(clattn_context *ctx, const clattn_problem *p, uint64_t room)
{
    clattn_params pp;
    gemm_params(ctx, 0, p, &pp);
    if (pp.gemm.KT <= 0 || scores_in_place(ctx, &pp, p))
        return 0;
    const uint64_t bytes = kt_bytes(p, &pp);
    if (bytes > room)
        return 0; /* too big: transpose per tile */
    const uint64_t q = q_copy_bytes(p, &pp);
    return q && q <= room - bytes ? bytes + q : bytes; /* Q's copy where it fits too */
}

/* One GEMM with parameters pp from `source` (gemm_params). A kernel compiled with more registers
 * than its work-group allows is refitted to what it allows (clattn__retry_cap). */
static clattn_status gemm(clattn_context *ctx, int mode, const clattn_problem *p, clattn_params *pp,
                          clattn_params_source source, const clattn_view *a, const clattn_view *bm,
                          const clattn_view *c, int M, int N, int K, cl_uint num_wait,
                          const cl_event *wait, cl_event *done)
{
    int *const wgx = &pp->gemm.WGX, *const wgy = &pp->gemm.WGY, *const rm = &pp->gemm.RM, *const ns = &pp->gemm.NS,
              *const tk = &pp->gemm.TK, *const vw = &pp->gemm.VW;
    const int kt = mode == 0 && pp->gemm.KT > 0;
    const int direct = pp->gemm.DIRECT == CLATTN_KERNEL_DIRECT;
    /* The direct kernels: P·V (pv_direct) RM x 16·NS tiles as fitted (gemm_params), RM no more
     * rows than there are; scores in place (scores_in_place) RM rows (all of them up to 16,
     * up to 32 in one block rounded to a multiple of 4 for the 4 x 4 register tiles, else RM);
     * scores over Kᵀ (scores_direct) as fitted. */
    const char *kname = mode == 1 ? (direct ? "pv_direct" : "gemm")
                                  : (direct ? (kt ? "scores_direct" : "scores_in_place") : "gemm");
    char dp16[48] = "";
    if (direct && mode == 1) {
        *rm = *rm > M ? M : *rm;
    } else if (direct && !kt) {
        *rm = M <= 16 ? M : M <= 32 ? (M + 3) / 4 * 4 : *rm;
        snprintf(dp16, sizeof dp16, " -DDP16=%d -DKV_FULL=%d", (K + 15) / 16 * 16, K % 16 == 0);
    }
    cl_kernel k;
    for (size_t cap = ctx->dev.max_wg;;) {
        /* KF: scores stage the whole head_dim at once when it fits in local memory. */
        int kfull = 0;
        if (mode == 0 && pp->gemm.KF > 0) {
            const size_t tkf = (size_t)(K + 3) / 4 * 4;
            const size_t bytes = 4u * ((tkf + 4) * (size_t)*wgy * *rm + tkf * (size_t)*wgx * *vw * *ns);
            if (clattn__local_fits(ctx, bytes)) {
                kfull = 1;
                *tk = (int)tkf;
            }
        }
        /* The tile under the parameters' own names (WGX WGY RM NS TK VW), then the derived flags. */
        char tile[128];
        clattn__params_defines(mode == 0 ? CLATTN_OP_SCORES : CLATTN_OP_PV, pp, 0, 6, tile, sizeof tile);
        char opts[320];
        snprintf(opts, sizeof opts,
                 "-cl-std=CL1.2 -cl-mad-enable -DMODE=%d -DDT_A=%d -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d "
                 "%s -DKFULL=%d -DKT=%d -DDIRECT=%d -DKT_PANEL=%d%s -DKSEL=1 -DK_%s=1",
                 mode, (int)a->dtype, (int)bm->dtype, (int)c->dtype,
                 p->has_mask ? (int)p->mask.dtype : 0, tile, kfull, kt,
                 direct, kt ? kt_panel(pp) : 0, dp16, kname);
        const clattn_status st = clattn__get_kernel(ctx, direct ? "gemm_direct.cl" : "gemm_tiled.cl", opts, kname, &k);
        if (!st)
            break;
        if (!(cap = clattn__retry_cap(ctx, st, source, cap)))
            return st;
        sane_gemm(ctx, pp, cap);
    }
    const int tm = direct ? *rm : *wgy * *rm, tn = !direct ? *wgx * *vw * *ns : mode == 0 && !kt ? 256 : 16 * *ns;
    const int heads = (int)p->heads_q, group = (int)(p->heads_q / p->heads_kv);
    const int seq_q = (int)p->seq_q, seq_kv = (int)p->seq_kv, causal = p->causal,
              has_mask = p->has_mask; /* P·V: forces the NaN-safe path where P has masked zeros */
    const float alpha = mode == 0 ? p->scale : 1.0f;
    clattn_args args = {k, 0, CL_SUCCESS};
    clattn__arg_view(&args, a);
    clattn__arg_view(&args, bm);
    clattn__arg_view(&args, c);
    clattn__arg_view(&args, mode == 0 && has_mask ? &p->mask : NULL);
    clattn__arg(&args, sizeof(cl_mem), p->kv_lengths ? &p->kv_lengths : NULL);
    clattn__arg(&args, sizeof(int), &M);
    clattn__arg(&args, sizeof(int), &N);
    clattn__arg(&args, sizeof(int), &K);
    clattn__arg(&args, sizeof(int), &heads);
    clattn__arg(&args, sizeof(int), &group);
    clattn__arg(&args, sizeof(int), &seq_q);
    clattn__arg(&args, sizeof(int), &seq_kv);
    clattn__arg(&args, sizeof(int), &causal);
    clattn__arg(&args, sizeof(int), &has_mask);
    clattn__arg(&args, sizeof(float), &alpha);
    const size_t local[3] = {direct ? 1 : (size_t)*wgx, direct ? 1 : (size_t)*wgy, 1};
    size_t global[3] = {(size_t)((N + tn - 1) / tn) * local[0], (size_t)((M + tm - 1) / tm) * local[1],
                        (size_t)(p->batch * p->heads_q)};
    if (direct) /* tiles of keys (or O columns) fastest */
        clattn__flatten_grid(global);
    return clattn__enqueue(ctx, &args, 3, global, local, num_wait, wait, done,
                           mode == 0 ? "gemm scores" : "gemm pv");
}

/* Kt[z][d][n] = K[b][hk][n][d] as f32 (z = b·heads_kv + hk) into scratch at element offset off,
 * head blocks of head_dim·pitch: rows of pitch floats with panel 0, else panels of `panel` keys,
 * Kt[z][n / panel][d][n % panel]; with kspan only the panels that meet each head's span there,
 * with kvlen only those below the key lengths (internal.h). */
clattn_status clattn__run_transpose_k(clattn_context *ctx, const clattn_problem *p, cl_mem scratch,
                                      uint64_t off, uint64_t pitch, int panel, cl_mem kspan,
                                      cl_ulong ks_off, cl_mem kvlen, cl_uint num_wait,
                                      const cl_event *wait)
{
    /* CPUs: transpose_k16 (16x16 blocks in registers); elsewhere one work-item per key. */
    const int cpu = (ctx->dev.type & CL_DEVICE_TYPE_CPU) != 0;
    const char *name = cpu ? "transpose_k16" : "transpose_k";
    char opts[160];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDT_IN=%d -DDT_A=0 -DDT_OUT=0 -DDT_MASK=0 -DKT_PANEL=%d -DKSEL=1 -DK_%s=1",
             (int)p->k.dtype, panel, name);
    cl_kernel k;
    clattn_status st = clattn__get_kernel(ctx, "layout.cl", opts, name, &k);
    if (st)
        return st;
    const cl_ulong kt_sz = (cl_ulong)p->head_dim * pitch, kt_ss = pitch, kt_off = off;
    const int n = (int)p->seq_kv, d = (int)p->head_dim, hkv = (int)p->heads_kv;
    clattn_args a = {k, 0, CL_SUCCESS};
    clattn__arg_view(&a, &p->k);
    clattn__arg(&a, sizeof(cl_mem), &scratch);
    clattn__arg(&a, sizeof(cl_ulong), &kt_off);
    clattn__arg(&a, sizeof(cl_ulong), &kt_sz);
    clattn__arg(&a, sizeof(cl_ulong), &kt_ss);
    clattn__arg(&a, sizeof(int), &n);
    clattn__arg(&a, sizeof(int), &d);
    clattn__arg(&a, sizeof(int), &hkv);
    clattn__arg(&a, sizeof(cl_mem), kspan ? &kspan : NULL);
    clattn__arg(&a, sizeof(cl_ulong), &ks_off);
    clattn__arg(&a, sizeof(cl_mem), kvlen ? &kvlen : NULL);
    /* packed K (varlen: fused_direct's copies) */
    clattn__arg(&a, sizeof(cl_mem), p->kv.cu_k ? &p->kv.cu_k : NULL);
    clattn__arg(&a, sizeof(int), &p->kv.total_k);
    const size_t blocks = (size_t)(((uint64_t)p->seq_kv + 15) / 16),
                 zs = (size_t)(p->batch * p->heads_kv);
    const size_t local[2] = {cpu ? 1 : 16, 1};
    const size_t global[2] = {cpu ? blocks : blocks * 16, zs};
    return clattn__enqueue(ctx, &a, 2, global, cpu || ctx->dev.max_wg >= 16 ? local : NULL, num_wait,
                           wait, NULL, name);
}

static clattn_status run_scores_gemm(clattn_context *ctx, const clattn_problem *p, const clattn_view *dst,
                                     cl_mem scratch, uint64_t scratch_off, uint64_t scratch_bytes,
                                     cl_uint num_wait, const cl_event *wait, cl_event *done);

clattn_status clattn__run_scores(clattn_context *ctx, const clattn_problem *p, const clattn_view *dst,
                                 cl_mem scratch, uint64_t scratch_off, uint64_t scratch_bytes,
                                 cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    if (!p->var.bits)
        return run_scores_gemm(ctx, p, dst, scratch, scratch_off, scratch_bytes, num_wait, wait, done);
    /* Variants (f32 dst): scale·QKᵀ for every key, then the variants' pass in place, which hides
     * keys and adds the mask itself (the softcap comes before the mask). */
    clattn_problem raw = *p;
    raw.causal = 0;
    raw.has_mask = 0;
    raw.kv_lengths = NULL;
    clattn_status st;
    /* Rehearsed first (kernels built, nothing enqueued) unless the caller rehearses already: a
     * variant kernel that fails to build (the user's score_mod) must not leave dst holding the
     * GEMM's scores. */
    for (int pass = ctx->rehearse ? 1 : 0; pass < 2; pass++) {
        const int outer = ctx->rehearse;
        ctx->rehearse = pass == 0 ? 1 : outer;
        st = run_scores_gemm(ctx, &raw, dst, scratch, scratch_off, scratch_bytes, num_wait, wait, NULL);
        if (!st)
            st = clattn__run_scores_variant(ctx, p, dst, dst, 0, NULL, done);
        ctx->rehearse = pass == 0 ? 0 : outer;
        if (st)
            return st;
    }
    return st;
}

static clattn_status run_scores_gemm(clattn_context *ctx, const clattn_problem *p, const clattn_view *dst,
                                     cl_mem scratch, uint64_t scratch_off, uint64_t scratch_bytes,
                                     cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    clattn_params pp;
    const clattn_params_source source = gemm_params(ctx, 0, p, &pp);
    if (!scratch || scores_in_place(ctx, &pp, p))
        pp.gemm.KT = 0;
    if (pp.gemm.KT <= 0)
        return gemm(ctx, 0, p, &pp, source, &p->q, &p->k, dst, (int)p->seq_q, (int)p->seq_kv,
                    (int)p->head_dim, num_wait, wait, done);

    /* KT: Kᵀ into the scratch (in panels of the tile's 16·NS keys for scores_direct: NS is
     * final here, a retry in gemm() only narrows work-groups), then the GEMM reads it like P·V
     * reads V; after it, an f16/bf16 Q as f32 where the scratch holds it (clattn__scores_scratch). */
    const uint64_t pitch = kt_pitch(p, &pp), hsz = (uint64_t)p->head_dim * pitch;
    const uint64_t kt = kt_bytes(p, &pp), q_bytes = q_copy_bytes(p, &pp);
    clattn_status st = clattn__run_transpose_k(ctx, p, scratch, scratch_off, pitch,
                                               kt_panel(&pp), NULL, 0, NULL, num_wait, wait);
    if (st)
        return st;
    const clattn_view ktv = {scratch, CLATTN_F32, scratch_off,
                             {hsz * (uint64_t)p->heads_kv, hsz, pitch}};
    clattn_view qf = p->q;
    if (q_bytes && scratch_bytes >= kt + q_bytes &&
        (st = widen(ctx, "widen_q", &p->q, p->batch, p->heads_q, p->seq_q, p->head_dim, scratch,
                    (scratch_off + kt / 4 + 15) / 16 * 16, &qf, 0, NULL)))
        return st;
    return gemm(ctx, 0, p, &pp, source, &qf, &ktv, dst, (int)p->seq_q, (int)p->seq_kv, (int)p->head_dim,
                0, NULL, done);
}

uint64_t clattn__pv_scratch(clattn_context *ctx, const clattn_problem *p)
{
    if (p->v.dtype == CLATTN_F32)
        return 0;
    clattn_params pp;
    gemm_params(ctx, 1, p, &pp);
    return pp.gemm.DIRECT == CLATTN_KERNEL_DIRECT ? widen_bytes(p->batch, p->heads_kv, p->seq_kv, p->head_dim_v) : 0;
}

clattn_status clattn__run_widen_v(clattn_context *ctx, const clattn_problem *p, cl_mem scratch, uint64_t off,
                                  clattn_view *vf, cl_uint num_wait, const cl_event *wait)
{
    return widen(ctx, "widen_v", &p->v, p->batch, p->heads_kv, p->seq_kv, p->head_dim_v, scratch, off, vf,
                 num_wait, wait);
}

clattn_status clattn__run_pv(clattn_context *ctx, const clattn_problem *p, const clattn_view *probs,
                             const clattn_view *v, cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    clattn_params pp;
    const clattn_params_source source = gemm_params(ctx, 1, p, &pp);
    /* Keys hidden by a window, a chunk or the mods (-0 in P, like masked ones) must be skipped
     * too, not multiplied: P·V's NaN-safe path, which has_mask selects (MODE 1 reads no mask). */
    clattn_problem pv = *p;
    if (p->var.bits & (CLATTN_V_RANGE | CLATTN_V_MASK_MOD | CLATTN_V_SCORE_MOD | CLATTN_V_OFFSET))
        pv.has_mask = 1;
    /* A moved diagonal (q_offset, k_offset): P's -0 entries say which keys are hidden; P·V's own
     * causal range would cut the visible keys past the unmoved diagonal. */
    if (p->var.bits & CLATTN_V_OFFSET)
        pv.causal = 0;
    return gemm(ctx, 1, &pv, &pp, source, probs, v, &p->out, (int)p->seq_q, (int)p->head_dim_v,
                (int)p->seq_kv, num_wait, wait, done);
}

clattn_status clattn_scores(clattn_context *ctx, const clattn_attention_desc *desc,
                            const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *scores,
                            cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    if (done && !clattn__done_in_wait(num_wait, wait, done))
        *done = NULL;
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_scores: ctx must not be NULL");
    clattn__clear_error(ctx);
    clattn_problem p;
    clattn_status st = clattn__check_attention(ctx, desc, q, k, NULL, NULL, 0, &p);
    if (st)
        return st;
    const int64_t ss[4] = {p.batch, p.heads_q, p.seq_q, p.seq_kv};
    clattn_view dst;
    if ((st = clattn__check_view(ctx, "scores", scores, ss, CLATTN_VIEW_OUTPUT, CLATTN_DTYPES_ALL,
                                 &dst)) ||
        (st = clattn__check_wait(ctx, num_wait, wait, done)))
        return st;
    const clattn_tensor *ins[3] = {q, k, desc->mask};
    const char *const in_names[3] = {"q", "k", "desc->mask"};
    const char *hit = clattn__first_overlap(scores, 3, ins, in_names);
    if (hit)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "scores overlaps %s", hit);
    if (desc->kv_lengths && clattn__kvlen_overlaps(desc->kv_lengths, p.batch, scores))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->kv_lengths overlaps scores");
    cl_mem scratch = NULL;
    const uint64_t kt = clattn__scores_scratch(ctx, &p, ctx->dev.max_alloc / 2);
    clattn__variant_enter(ctx, &p);
    if (p.var.bits && dst.dtype != CLATTN_F32) {
        /* Variants with f16/bf16 scores: the f32 scores in the workspace after Kᵀ's scratch,
         * then the variants' pass rounds each logit once, into the caller's tensor. */
        const uint64_t elems = (uint64_t)p.batch * (uint64_t)p.heads_q * (uint64_t)p.seq_q * (uint64_t)p.seq_kv;
        const uint64_t at = (kt + 63) / 64 * 64;
        if (elems > (ctx->dev.max_alloc - at) / 4) {
            clattn__variant_leave(ctx);
            return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                                "%s scores with variants pass through %llu bytes of f32 scores, more than the "
                                "device's max allocation of %llu bytes; ask for f32 scores",
                                clattn_dtype_name(dst.dtype), (unsigned long long)(elems * 4),
                                (unsigned long long)ctx->dev.max_alloc);
        }
        if ((st = clattn__workspace(ctx, at + elems * 4, &scratch))) {
            clattn__variant_leave(ctx);
            return st;
        }
        const cl_ulong skv = (cl_ulong)p.seq_kv, sq = (cl_ulong)p.seq_q, hq = (cl_ulong)p.heads_q;
        const clattn_view f32 = {scratch, CLATTN_F32, at / 4, {hq * sq * skv, sq * skv, skv}};
        clattn_problem raw = p;
        raw.causal = 0;
        raw.has_mask = 0;
        raw.kv_lengths = NULL;
        raw.var.bits = 0;
        st = clattn__run_scores(ctx, &raw, &f32, kt ? scratch : NULL, 0, kt, num_wait, wait, NULL);
        if (!st)
            st = clattn__run_scores_variant(ctx, &p, &f32, &dst, 0, NULL, done);
        clattn__variant_leave(ctx);
        return st;
    }
    if (kt && (st = clattn__workspace(ctx, kt, &scratch))) {
        clattn__variant_leave(ctx);
        return st;
    }
    st = clattn__run_scores(ctx, &p, &dst, scratch, 0, kt, num_wait, wait, done);
    clattn__variant_leave(ctx);
    return st;
}
