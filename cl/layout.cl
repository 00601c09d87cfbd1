/* Layout copies that other kernels read: Kᵀ for the scores GEMMs and fused_direct (transpose_k
 * on GPUs, transpose_k16 on CPUs, optionally in panels of KT_PANEL keys), f32 rows of an f16 or
 * bf16 Q or V for the CPU GEMMs (widen_q, widen_v). Assembled after common.cl and gemm_common.cl
 * (KT_PANEL). */

/* Keys of batch b whose rows the copies read: packed K (cu_k, FlashAttention's cu_seqlens_k, NULL
 * otherwise) holds sequence b's rows from cu_k[b] on (packed_seq, common.cl), else the batch's N
 * rows from b·k_sb. packed_keys: .y the keys (N unpacked); packed_base: the first row's offset. */
inline int2 packed_keys(__global const int *cu_k, int b, int N, int total_k)
{
    return cu_k ? packed_seq(cu_k, b, N, total_k) : (int2)(0, N);
}
inline ulong packed_base(__global const int *cu_k, int b, int N, int total_k, ulong k_sb, ulong k_ss)
{
    return cu_k ? (ulong)packed_seq(cu_k, b, N, total_k).x * k_ss : (ulong)b * k_sb;
}

/* Whether the panel of KT_PANEL keys (16 without panels) holding key n of kv head z (batch
 * z / heads_kv) is copied (transpose_k below): it starts below the batch's key length (kvlen,
 * NULL: N) and meets the head's span in kspan (NULL: every key). */
inline int panel_seen(__global const int *kspan, ulong ks_off, __global const int *kvlen, int heads_kv,
                      int N, int z, int n)
{
    const int p = KT_PANEL ? KT_PANEL : 16, start = n / p * p;
    if (kvlen && start >= keys_of_batch(kvlen, z / heads_kv, N))
        return 0;
    if (!kspan)
        return 1;
    const ulong at = ks_off + 2 * (ulong)z;
    return start + p > 16 * kspan[at] && start < 16 * kspan[at + 1];
}

/* Kᵀ for KT scores: Kt[z][d][n] = K[b][hk][n][d] as f32, z = b·heads_kv + hk, rows of pitch
 * kt_ss; only d < D and n < N are written (the GEMM never reads beyond). With -DKT_PANEL=P
 * (the copies of scores_direct and fused_direct) in panels of P keys instead, P a
 * multiple of 16: Kt[z][n / P][d][n % P], kt_ss unused. With kspan (fused_direct's copies under
 * a shared mask, src/mask_pass.c) only the panels that meet keys [16·kspan[ks_off + 2z],
 * 16·kspan[ks_off + 2z + 1]) are written: from the first to the last 16-key chunk some query row
 * of kv head z may see (mask_union, mask_pass.cl). With kvlen (fused_direct's copies with key
 * lengths) only the panels that start below batch b's length. Those are the only panels
 * fused_direct reads; NULL: every key. One work-item per key: neighbouring work-items write
 * neighbouring words. Grid x = N rounded up, y = batch·heads_kv. */
#if !KSEL || K_transpose_k
__kernel void transpose_k(__global const T_IN *K, ulong k_off, ulong k_sb, ulong k_sh, ulong k_ss,
                          __global float *Kt, ulong kt_off, ulong kt_sz, ulong kt_ss, int N, int D,
                          int heads_kv, __global const int *kspan, ulong ks_off, __global const int *kvlen,
                          __global const int *cu_k, int total_k)
{
    const int n = get_global_id(0), z = get_global_id(1);
    if (n >= N || !panel_seen(kspan, ks_off, kvlen, heads_kv, N, z, n))
        return;
    const int b = z / heads_kv, hk = z % heads_kv;
    if (n >= packed_keys(cu_k, b, N, total_k).y)
        return;
    __global const T_IN *src = K + k_off + packed_base(cu_k, b, N, total_k, k_sb, k_ss) + (ulong)hk * k_sh +
                               (ulong)n * k_ss;
#if KT_PANEL
    __global float *dst =
        Kt + kt_off + (ulong)z * kt_sz + (ulong)(n / KT_PANEL) * KT_PANEL * D + n % KT_PANEL;
    kt_ss = KT_PANEL;
#else
    __global float *dst = Kt + kt_off + (ulong)z * kt_sz + n;
#endif
    for (int d = 0; d < D; d++)
        dst[(ulong)d * kt_ss] = LD_IN(src, d);
}
#endif

/* transpose_k for CPUs, same arguments and output (kspan and kvlen too): one work-item per 16 keys
 * (x) and kv head (y). A 16x16 block (16 key rows, 16 of their elements) is loaded as float16 rows,
 * transposed in registers and stored as 16 float16 rows of Kᵀ: vector loads and stores instead of
 * the 16-lane gathers that the per-key kernel becomes. Keys past N repeat key N-1 (never read, or
 * read as hidden keys by fused_direct), so writes go up to 16·ceil(N/16) - 1, which every pitch
 * covers. Each of the four rounds takes the even lanes of rows 2k and 2k+1 into row k and their odd
 * lanes into row k + 8: with (row, lane) as the 8 bits r3..r0 c3..c0 of the element's index, a
 * round rotates them right by one, so four rounds swap row and lane. */
#if !KSEL || K_transpose_k16
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
transpose_k16(__global const T_IN *K, ulong k_off, ulong k_sb, ulong k_sh, ulong k_ss,
              __global float *Kt, ulong kt_off, ulong kt_sz, ulong kt_ss, int N, int D, int heads_kv,
              __global const int *kspan, ulong ks_off, __global const int *kvlen, __global const int *cu_k,
              int total_k)
{
    const int n0 = get_group_id(0) * 16, z = GROUP_ID(1);
    if (!panel_seen(kspan, ks_off, kvlen, heads_kv, N, z, n0))
        return;
    const int b = z / heads_kv, hk = z % heads_kv;
    /* packed K (cu_k): the sequence's keys only, repeated past its last one like keys past N */
    __global const T_IN *src = K + k_off + packed_base(cu_k, b, N, total_k, k_sb, k_ss) + (ulong)hk * k_sh;
    N = packed_keys(cu_k, b, N, total_k).y;
    if (n0 >= N)
        return;
#if KT_PANEL
    __global float *dst =
        Kt + kt_off + (ulong)z * kt_sz + (ulong)(n0 / KT_PANEL) * KT_PANEL * D + n0 % KT_PANEL;
    kt_ss = KT_PANEL; /* between the rows of a panel */
#else
    __global float *dst = Kt + kt_off + (ulong)z * kt_sz + n0;
#endif
    for (int d0 = 0; d0 < D; d0 += 16) {
        float16 a[16], t[16];
#pragma unroll
        for (int e = 0; e < 16; e++) {
            __global const T_IN *row = src + (ulong)min(n0 + e, N - 1) * k_ss;
            a[e] = d0 + 16 <= D ? LD16_IN(row, d0) : ld16_tail(row, d0, D);
        }
#pragma unroll
        for (int round = 0; round < 2; round++) {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                t[k] = (float16)(a[2 * k].even, a[2 * k + 1].even);
                t[k + 8] = (float16)(a[2 * k].odd, a[2 * k + 1].odd);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) {
                a[k] = (float16)(t[2 * k].even, t[2 * k + 1].even);
                a[k + 8] = (float16)(t[2 * k].odd, t[2 * k + 1].odd);
            }
        }
        /* Unrolled with constant indices so that a[] stays in registers. */
#pragma unroll
        for (int e = 0; e < 16; e++)
            if (d0 + e < D)
                vstore16(a[e], 0, dst + (ulong)(d0 + e) * kt_ss);
    }
}
#endif

/* An f16 or bf16 tensor as f32 rows for the CPU kernels (Q for scores_direct, V for pv_direct):
 * Xf[z][n][c] = X[b][h][n][c] in rows of xf_ss floats (z = b·heads + h, head blocks of N·xf_ss
 * floats). The conversion is exact, so the result is the same; done once here, an O(rows) pass,
 * instead of in every tile of those kernels, where the conversions spill accumulators (unfused
 * f16 11.3 ms against 13.6). One work-item per 16 rows (x) and head (y).
 * See docs/measurements.md#widen-rows. */
#define WIDEN_ARGS                                                                               \
    __global const T_IN *X, ulong x_off, ulong x_sb, ulong x_sh, ulong x_ss, __global float *Xf,   \
        ulong xf_off, ulong xf_ss, int N, int C, int heads
__attribute__((always_inline)) inline void widen_rows(WIDEN_ARGS)
{
    const int n0 = get_group_id(0) * 16, z = GROUP_ID(1);
    const int b = z / heads, h = z % heads;
    __global const T_IN *src = X + x_off + (ulong)b * x_sb + (ulong)h * x_sh;
    __global float *dst = Xf + xf_off + (ulong)z * (ulong)N * xf_ss;
    for (int n = n0; n < min(N, n0 + 16); n++) {
        __global const T_IN *row = src + (ulong)n * x_ss;
        __global float *out = dst + (ulong)n * xf_ss;
        for (int c = 0; c < C; c += 16)
            vstore16(c + 16 <= C ? LD16_IN(row, c) : ld16_tail(row, c, C), 0, out + c);
    }
}
/* One name per tensor, so that profiles and tests tell them apart. */
#if !KSEL || K_widen
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void widen_q(WIDEN_ARGS)
{
    widen_rows(X, x_off, x_sb, x_sh, x_ss, Xf, xf_off, xf_ss, N, C, heads);
}
#endif
#if !KSEL || K_widen
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void widen_v(WIDEN_ARGS)
{
    widen_rows(X, x_off, x_sb, x_sh, x_ss, Xf, xf_off, xf_ss, N, C, heads);
}
#endif
