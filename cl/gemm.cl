/* Batched tiled GEMM for the unfused path: C[z] = A[z] · op(B[z]) with a per-mode epilogue.
 *
 * MODE 0 (scores): A = Q [Sq][D], B = K [Skv][D] (so op(B) = Kᵀ), C = scores [Sq][Skv];
 *   epilogue: alpha·acc + mask, keys hidden by kv_lengths or causal set to -inf. With KT, B is
 *   Kᵀ [D][Skv] (f32, written once per call by transpose_k) and loads like P·V's B: no
 *   element-wise transposition per tile, which on CPUs costs as much as the tile's arithmetic.
 * MODE 1 (P·V):    A = P [Sq][Skv], B = V [Skv][Dv], C = out [Sq][Dv]; the key loop stops at the
 *   last key any row of the tile can see, and hidden keys never touch C (0·NaN would); C is
 *   summed at half scale (P times O_WEIGHT) and doubled at the store (o_from_half, common.cl).
 *
 * z = GROUP_ID(2) = b·heads + h; B is read from kv head h / group.
 * A work-group computes a TM x TN tile of C; work-item (tx, ty) owns rows ty·RM .. ty·RM+RM-1 and
 * the NS column blocks of VW floats starting at VW·(tx + WGX·s): interleaved so that neighbouring
 * work-items read neighbouring local-memory words. K is walked in chunks of TK staged in local
 * memory: B k-major (Bs[k][n]) for vector reads along n, A row-major (its values are broadcast). */

#ifndef WGX
#define WGX 16 /* work-items along C's columns */
#endif
#ifndef WGY
#define WGY 8 /* work-items along C's rows */
#endif
#ifndef RM
#define RM 4 /* rows of C per work-item */
#endif
#ifndef NS
#define NS 1 /* VW-wide column blocks of C per work-item */
#endif
#ifndef VW
#define VW 4 /* vector width of the column blocks: 4, 8 or 16 (16 fills an AVX-512 register) */
#endif
#ifndef TK
#define TK 32 /* reduction (k) elements staged per step; a multiple of 4 */
#endif
#ifndef MODE
#define MODE 0
#endif
#ifndef KT
#define KT 0 /* 1: scores read B = Kᵀ, pre-transposed by transpose_k ([D][Skv] per kv head) */
#endif
#ifndef KT_PANEL
#define KT_PANEL 0 /* scores_direct: Kᵀ in panels of 16·NS keys (transpose_k), else rows */
#endif
#ifndef KFULL
#define KFULL 0 /* 1: TK >= K (scores with the whole head_dim staged at once) */
#endif

#define TM (WGY * RM)
#define TN (WGX * VW * NS)
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatV CAT(float, VW)
#define vloadV CAT(vload, VW)
#define vstoreV CAT(vstore, VW)
#define NWI (WGX * WGY)

/* The argument list of gemm, scores_direct, scores_in_place and pv_direct (src/scores.c sets
 * them alike); TB is the element type of B. */
#define GEMM_KERNEL_ARGS(TB)                                                                     \
    __global const T_A *A, ulong a_off, ulong a_sb, ulong a_sh, ulong a_ss, __global const TB *B, \
        ulong b_off, ulong b_sb, ulong b_sh, ulong b_ss, __global T_OUT *C, ulong c_off,         \
        ulong c_sb, ulong c_sh, ulong c_ss, __global const T_MASK *mask, ulong m_off, ulong m_sb, \
        ulong m_sh, ulong m_ss, __global const int *kvlen, int M, int N, int K, int heads,       \
        int group, int seq_q, int seq_kv, int causal, int has_mask, float alpha

#if !KSEL || K_gemm
__kernel __attribute__((reqd_work_group_size(WGX, WGY, 1))) void
gemm(GEMM_KERNEL_ARGS(T_IN))
{
    __local float As[TM][TK + 4]; /* row-major: A values are read as broadcast scalars */
    __local float Bs[TK][TN];

    const int tx = get_local_id(0), ty = get_local_id(1);
    const int lid = ty * WGX + tx;
    const int z = GROUP_ID(2);
    const int b = z / heads, h = z % heads, hk = h / group;
    const int m0 = GROUP_ID(1) * TM, n0 = get_group_id(0) * TN;

    __global const T_A *Ab = A + a_off + (ulong)b * a_sb + (ulong)h * a_sh;
    __global const T_IN *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh;
    const int L = keys_of_batch(kvlen, b, seq_kv);

#if MODE == 1
    /* Keys beyond the last one the tile's bottom row can see contribute nothing. */
    const int last_row = min(M, m0 + TM) - 1;
    const int kend = causal_end(causal, last_row, seq_q, L);
    const int kfull = has_mask ? 0 : causal_end(causal, m0, seq_q, L); /* all rows see k < kfull */
#else
    /* A scores tile whose keys all its rows hide (causal, key lengths: the last row sees the
     * most) is all -inf: no dot products (kend 0; uniform across the work-group, so no barrier is
     * skipped by some work-items only). */
    const int kend = n0 >= causal_end(causal, min(M, m0 + TM) - 1, seq_q, L) ? 0 : K;
#endif

#if KFULL
    /* TK covers the whole reduction: one staging step, and the accumulators live only between
     * the barrier and the epilogue, so PoCL keeps them in registers instead of spilling them to
     * its per-work-item context arrays at every barrier. */
    if (kend > 0) {
        const int k0 = 0;
#else
    floatV acc[RM][NS];
    for (int i = 0; i < RM; i++)
        for (int s = 0; s < NS; s++)
            acc[i][s] = (floatV)(0.0f);

    for (int k0 = 0; k0 < kend; k0 += TK) {
#endif
        /* Tiles are loaded 4 consecutive elements at a time (TK and TN are multiples of 4). */
        for (int e = lid; e < TM * (TK / 4); e += NWI) {
            const int r = e / (TK / 4), c = 4 * (e % (TK / 4));
            const int m = m0 + r, k = k0 + c;
            float4 x = (float4)(0.0f);
            if (m < M) {
                __global const T_A *src = Ab + (ulong)m * a_ss + k;
                if (k + 3 < kend)
                    x = LD4_A(src, 0);
                else
                    x = (float4)(k < kend ? LD_A(src, 0) : 0.0f, k + 1 < kend ? LD_A(src, 1) : 0.0f,
                                 k + 2 < kend ? LD_A(src, 2) : 0.0f, 0.0f);
            }
#if MODE == 1 /* C at half scale (common.cl, o_from_half): -0 stays -0 */
            x *= O_WEIGHT;
#endif
            vstore4(x, 0, &As[r][c]);
        }
#if MODE == 0 && !KT
        for (int e = lid; e < TN * (TK / 4); e += NWI) {
            const int r = e / (TK / 4), c = 4 * (e % (TK / 4));
            const int n = n0 + r, k = k0 + c;
            float4 x = (float4)(0.0f);
            if (n < N) {
                __global const T_IN *src = Bb + (ulong)n * b_ss + k;
                if (k + 3 < K)
                    x = LD4_IN(src, 0);
                else
                    x = (float4)(k < K ? LD_IN(src, 0) : 0.0f, k + 1 < K ? LD_IN(src, 1) : 0.0f,
                                 k + 2 < K ? LD_IN(src, 2) : 0.0f, 0.0f);
            }
            Bs[c][r] = x.s0;
            Bs[c + 1][r] = x.s1;
            Bs[c + 2][r] = x.s2;
            Bs[c + 3][r] = x.s3;
        }
#else
        for (int e = lid; e < TK * (TN / 4); e += NWI) {
            const int r = e / (TN / 4), c = 4 * (e % (TN / 4));
            const int n = n0 + c, k = k0 + r;
            float4 x = (float4)(0.0f);
            if (k < kend) {
                __global const T_IN *src = Bb + (ulong)k * b_ss + n;
                if (n + 3 < N)
                    x = LD4_IN(src, 0);
                else
                    x = (float4)(n < N ? LD_IN(src, 0) : 0.0f, n + 1 < N ? LD_IN(src, 1) : 0.0f,
                                 n + 2 < N ? LD_IN(src, 2) : 0.0f, 0.0f);
            }
            vstore4(x, 0, &Bs[r][c]);
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
#if KFULL
    }
    floatV acc[RM][NS];
    for (int i = 0; i < RM; i++)
        for (int s = 0; s < NS; s++)
            acc[i][s] = (floatV)(0.0f);
    if (kend > 0) {
#endif
#if MODE == 1
        if (k0 + TK > kfull) {
            /* Some row of the tile hides some key of this chunk: skip hidden keys (probability -0,
             * see softmax.cl) so that NaN or Inf in their V rows cannot reach C. */
            for (int kk = 0; kk < TK; kk++) {
                floatV bv[NS];
                for (int s = 0; s < NS; s++)
                    bv[s] = vloadV(0, &Bs[kk][VW * (tx + WGX * s)]);
                for (int i = 0; i < RM; i++) {
                    const float a = As[ty * RM + i][kk];
                    if (!IS_HIDDEN(a))
                        for (int s = 0; s < NS; s++)
                            acc[i][s] = MAD((floatV)(a), bv[s], acc[i][s]);
                }
            }
        } else
#endif
        {
            for (int kk = 0; kk < TK; kk++) {
                floatV bv[NS];
#pragma unroll
                for (int s = 0; s < NS; s++)
                    bv[s] = vloadV(0, &Bs[kk][VW * (tx + WGX * s)]);
                /* Unrolled so that acc stays in registers. */
#pragma unroll
                for (int i = 0; i < RM; i++) {
                    const float a = As[ty * RM + i][kk];
#pragma unroll
                    for (int s = 0; s < NS; s++)
                        acc[i][s] = MAD((floatV)(a), bv[s], acc[i][s]);
                }
            }
        }
#if !KFULL
        barrier(CLK_LOCAL_MEM_FENCE); /* before the next chunk overwrites As/Bs */
#endif
    }

    __global T_OUT *Cb = C + c_off + (ulong)b * c_sb + (ulong)h * c_sh;
#if MODE == 0
    __global const T_MASK *Mb = mask + m_off + (ulong)b * m_sb + (ulong)h * m_sh;
#endif
    for (int i = 0; i < RM; i++) {
        const int m = m0 + ty * RM + i;
        if (m >= M)
            continue;
#if MODE == 0
        const int cend = causal_end(causal, m, seq_q, L);
#endif
        for (int s = 0; s < NS; s++) {
            float v[VW];
            vstoreV(acc[i][s], 0, v);
            for (int q = 0; q < VW; q += 4) {
                const int n = n0 + VW * (tx + WGX * s) + q;
#if MODE == 0
                const float4 x = vload4(0, v + q) * alpha;
                if (n + 3 < N && ((n + 3 < cend && !has_mask) || n >= cend)) {
                    ST4_OUT(Cb, (ulong)m * c_ss + n, n >= cend ? (float4)(NEG_INF) : x);
                    continue;
                }
                for (int e = 0; e < 4 && n + e < N; e++) {
                    float y = v[q + e] * alpha;
                    if (has_mask) {
                        /* A -inf mask hides the key even when its score is NaN. */
                        const float mv = LD_MASK(Mb, (ulong)m * m_ss + n + e);
                        y = mv == NEG_INF ? NEG_INF : y + mv;
                    }
                    ST_OUT(Cb, (ulong)m * c_ss + n + e, n + e < cend ? y : NEG_INF);
                }
#else
                const float4 x = o_from_half4(vload4(0, v + q));
                if (n + 3 < N) {
                    ST4_OUT(Cb, (ulong)m * c_ss + n, x);
                    continue;
                }
                const float xs[4] = {x.s0, x.s1, x.s2, x.s3};
                for (int e = 0; e < 4 && n + e < N; e++)
                    ST_OUT(Cb, (ulong)m * c_ss + n + e, xs[e]);
#endif
            }
        }
    }
}
#endif

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
 * (the copies of scores_direct and fused_direct, fused.cl) in panels of P keys instead, P a
 * multiple of 16: Kt[z][n / P][d][n % P], kt_ss unused. With kspan (fused_direct's copies under
 * a shared mask, src/fused.c) only the panels that meet keys [16·kspan[ks_off + 2z],
 * 16·kspan[ks_off + 2z + 1]) are written: from the first to the last 16-key chunk some query row
 * of kv head z may see (mask_union, fused.cl). With kvlen (fused_direct's copies with key
 * lengths) only the panels that start below batch b's length. Those are the only panels
 * fused_direct reads; NULL: every key. One work-item per key: neighbouring work-items write
 * neighbouring words. Grid x = N rounded up, y = batch·heads_kv. */
#if !KSEL || K_transpose_k
__kernel void transpose_k(__global const T_IN *K, ulong k_off, ulong k_sb, ulong k_sh, ulong k_ss,
                          __global float *Kt, ulong kt_off, ulong kt_sz, ulong kt_ss, int N, int D,
                          int heads_kv, __global const int *kspan, ulong ks_off, __global const int *kvlen)
{
    const int n = get_global_id(0), z = get_global_id(1);
    if (n >= N || !panel_seen(kspan, ks_off, kvlen, heads_kv, N, z, n))
        return;
    const int b = z / heads_kv, hk = z % heads_kv;
    __global const T_IN *src = K + k_off + (ulong)b * k_sb + (ulong)hk * k_sh + (ulong)n * k_ss;
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
              __global const int *kspan, ulong ks_off, __global const int *kvlen)
{
    const int n0 = get_group_id(0) * 16, z = GROUP_ID(1);
    if (!panel_seen(kspan, ks_off, kvlen, heads_kv, N, z, n0))
        return;
    const int b = z / heads_kv, hk = z % heads_kv;
    __global const T_IN *src = K + k_off + (ulong)b * k_sb + (ulong)hk * k_sh;
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
 * instead of in every tile of those kernels, where the conversions spill accumulators (pv_direct
 * on f16 V: two half loads and an insert per vector, and an accumulator stored and reloaded at
 * every key). Measured on PoCL (2-core Intel Xeon, AVX-512, B1 H8 S1024 d64, minima of 10, 3
 * runs alternating, ms, both copies against none): unfused f16 11.3-11.7 against 13.6-14.5,
 * bf16 11.7-11.9 against 13.5-13.8 (f32: 11.0-11.2); clattn_scores f16 5.8-6.1 against 6.6-7.8,
 * bf16 5.8-6.1 against 6.5-8.2. One work-item per 16 rows (x) and head (y). */
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

/* The direct kernels' indices: z = b·heads + h (kv head hk), rows from m0, keys (or O columns)
 * from n0 in blocks of NB_, L keys in batch b, Ab the head's rows of A. */
#define DIRECT_INDICES(NB_)                                                                      \
    const int nx_ = (N + (NB_)-1) / (NB_), ny_ = (M + RM - 1) / RM; /* the grid's tiles */       \
    const int z = TILE_Z(nx_, ny_);                                                              \
    const int b = z / heads, h = z % heads, hk = h / group;                                      \
    const int m0 = TILE_Y(nx_, ny_) * RM, n0 = TILE_X(nx_) * (NB_);                              \
    const int L = keys_of_batch(kvlen, b, seq_kv);                                               \
    __global const T_A *Ab = A + a_off + (ulong)b * a_sb + (ulong)h * a_sh

/* acc[i][s] += w·A[row i][k] · bv[s] over a direct kernel's RM x NS register tile (arow: the
 * rows of A, w 1 or O_WEIGHT); a macro, so that acc stays in registers whatever the compiler
 * inlines. */
#define MAD_TILE(acc, arow, k, bv, w)                                                            \
    _Pragma("unroll") for (int i_ = 0; i_ < RM; i_++) {                                          \
        const float a_ = LD_A((arow)[i_], (k)) * (w);                                            \
        _Pragma("unroll") for (int s_ = 0; s_ < NS; s_++)                                        \
            (acc)[i_][s_] = MAD((float16)(a_), (bv)[s_], (acc)[i_][s_]);                         \
    }

#if DT_A != 0
/* acc[i][s] += a16[i][kk] · (16 values of row brow at 16·s) over scores_direct's tile. */
#define MAD_TILE16(acc, a16, kk, brow)                                                           \
    {                                                                                            \
        float16 bv_[NS];                                                                         \
        _Pragma("unroll") for (int s_ = 0; s_ < NS; s_++) bv_[s_] = vload16(0, (brow) + 16 * s_); \
        _Pragma("unroll") for (int i_ = 0; i_ < RM; i_++)                                        \
            _Pragma("unroll") for (int s_ = 0; s_ < NS; s_++)                                    \
                (acc)[i_][s_] = MAD((float16)((a16)[i_][kk]), bv_[s_], (acc)[i_][s_]);           \
    }

/* Elements col..col+15 of a row of A (n elements) as float16, 0 past n. Always inlined: see
 * qk16_row in common.cl for what PoCL 3.1 made of vload_half16 in a called function. */
__attribute__((always_inline)) inline float16 ld16_a(__global const T_A *p, int col, int n)
{
    if (col + 15 < n)
        return LD16_A(p, col);
    float t[16];
    for (int e = 0; e < 16; e++)
        t[e] = col + e < n ? LD_A(p, col + e) : 0.0f;
    return vload16(0, t);
}
#endif

/* The scores x (scaled) of keys n..n+15 into row m of C (Cb, rows c_ss apart): the mask row
 * added (Mb, rows m_ss apart), keys at or past cend -inf (causal, key lengths), nothing past N.
 * Sixteen keys all hidden (n >= cend) are -inf whatever the mask and x; sixteen all before cend
 * take the mask as one vector (element by element, as the tails still do, scores with a finite
 * f32 mask took 10.8-11.9 ms instead of 6.2-7.4 on PoCL, B1 H8 S1024 d64; none: 5.6-6.4). */
__attribute__((always_inline)) inline void store_scores16(__global T_OUT *Cb, ulong c_ss,
                                                          __global const T_MASK *Mb, ulong m_ss, int m,
                                                          int n, int N, int cend, int has_mask,
                                                          float16 x)
{
    const int hidden = n >= cend;
    if (n + 15 < N && (n + 15 < cend || hidden)) {
        if (hidden) {
            x = (float16)(NEG_INF);
        } else if (has_mask) {
            /* A -inf mask hides the key even when its score is NaN. */
            const float16 mv = LD16_MASK(Mb, (ulong)m * m_ss + n);
            x = select(x + mv, (float16)(NEG_INF), mv == (float16)(NEG_INF));
        }
#if DT_OUT == 0
        vstore16(x, 0, Cb + (ulong)m * c_ss + n);
#elif DT_OUT == 1
        vstore_half16_rte(x, 0, Cb + (ulong)m * c_ss + n);
#else
        ST_BF16X16(Cb + (ulong)m * c_ss + n, f32_to_bf16_16(x));
#endif
        return;
    }
    float v[16];
    vstore16(x, 0, v);
    for (int e = 0; e < 16 && n + e < N; e++) {
        float y = v[e];
        if (has_mask) {
            /* A -inf mask hides the key even when its score is NaN. */
            const float mv = LD_MASK(Mb, (ulong)m * m_ss + n + e);
            y = mv == NEG_INF ? NEG_INF : y + mv;
        }
        ST_OUT(Cb, (ulong)m * c_ss + n + e, n + e < cend ? y : NEG_INF);
    }
}

/* Scores on CPUs (DIRECT): one work-item per RM x (16·NS) tile, no local memory, no barrier.
 * Q is read in place (its values broadcast from L1), Kᵀ as float16 vectors from the tile's panel
 * (transpose_k with KT_PANEL = 16·NS: head_dim rows of 16·NS keys, one contiguous block, where
 * rows of Kᵀ took a cache line from each of head_dim rows seq_kv floats apart). Measured on PoCL
 * (2-core Intel Xeon, AVX-512, B1 H8 f32, minima of 3 runs alternating, ms, panels against
 * rows): S1024 d64 even (4.9-5.3 against 5.0-6.2), d128 even, d256 (H4) 8.1-8.3 against 8.8-9.0,
 * seq_kv 4096 20.7-21.3 against 22.1-22.6, seq_q 512 seq_kv 16384 64.7-66.0 against 99.7-124,
 * d128 seq_q 512 seq_kv 8192 58.8-60.4 against 97.7-98.3. The accumulators stay in registers.
 * Rows beyond M and keys beyond N are computed from clamped/padded data and never stored. Grid
 * x = ceil(N / (16·NS)), y = ceil(M / RM), z = batch·heads (work-group 1x1x1). */
#if !KSEL || K_scores_direct
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
scores_direct(GEMM_KERNEL_ARGS(float))
{
    DIRECT_INDICES(16 * NS);
#if KT_PANEL
#if KT && KT_PANEL != 16 * NS /* (transpose_k's builds set KT_PANEL alone) */
#error "scores_direct reads one panel of Kᵀ a tile: KT_PANEL must be 16·NS"
#endif
    __global const float *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh + (ulong)n0 * K;
    b_ss = 16 * NS; /* between the rows of a panel */
#else
    __global const float *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh + n0;
#endif

    __global const T_A *arow[RM];
#pragma unroll
    for (int i = 0; i < RM; i++)
        arow[i] = Ab + (ulong)min(m0 + i, M - 1) * a_ss;
    float16 acc[RM][NS];
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
        for (int s = 0; s < NS; s++)
            acc[i][s] = (float16)(0.0f);
    /* A tile whose keys all its rows hide (causal, key lengths: the last row sees the most) is
     * all -inf: its dot products are skipped, which halves the work of causal scores. */
    const int tile_end = causal_end(causal, min(M, m0 + RM) - 1, seq_q, L);
    const int depth = n0 < tile_end ? K : 0;
#if DT_A == 0
    for (int k = 0; k < depth; k++) {
        float16 bv[NS];
#pragma unroll
        for (int s = 0; s < NS; s++)
            bv[s] = vload16(0, Bb + (ulong)k * b_ss + 16 * s);
        MAD_TILE(acc, arow, k, bv, 1.0f)
    }
#else
    /* f16 and bf16 Q, where the scratch had no room for widen_q's f32 copy (src/scores.c):
     * 16 values of each row converted as one vector into private memory, then broadcast from
     * there. Converted one at a time at every k (vload_half: a dozen scalar bit
     * operations on PoCL 3.1), f16 Q took longer than the multiply-adds. Measured on PoCL
     * (2-core Intel Xeon, AVX-512, B1 H8 S1024 d64, minima of 20, 2 runs alternating, ms):
     * clattn_scores f16 6.2-6.4 against 12.5-12.8 (with the vector bf16 stores, common.cl: bf16
     * 6.5-6.6 against 12.0-12.3); unfused f16 13.0-13.4 against 19.0-19.1, bf16 even. */
    for (int k0 = 0; k0 < depth; k0 += 16) {
        float a16[RM][16];
#pragma unroll
        for (int i = 0; i < RM; i++)
            vstore16(ld16_a(arow[i], k0, K), 0, a16[i]);
        if (k0 + 16 <= depth) {
#pragma unroll
            for (int kk = 0; kk < 16; kk++)
                MAD_TILE16(acc, a16, kk, Bb + (ulong)(k0 + kk) * b_ss)
        } else {
            for (int kk = 0; kk < depth - k0; kk++)
                MAD_TILE16(acc, a16, kk, Bb + (ulong)(k0 + kk) * b_ss)
        }
    }
#endif

    __global T_OUT *Cb = C + c_off + (ulong)b * c_sb + (ulong)h * c_sh;
    __global const T_MASK *Mb = mask + m_off + (ulong)b * m_sb + (ulong)h * m_sh;
    for (int i = 0; i < RM && m0 + i < M; i++) {
        const int m = m0 + i;
        const int cend = causal_end(causal, m, seq_q, L);
        for (int s = 0; s < NS; s++)
            store_scores16(Cb, c_ss, Mb, m_ss, m, n0 + 16 * s, N, cend, has_mask, acc[i][s] * alpha);
    }
}
#endif

#if defined(DP16)
/* Scores on CPUs with K read in place (DIRECT 1 with KT 0, or with few query rows: see
 * src/scores.c): one work-item per RM rows and 256 keys, in chunks of 16 keys through
 * qk16_tile (where QK_TILE_FOR(RM), common.cl) or qk16_row. With few rows the Kᵀ
 * copy's write and second read of K cost more than the horizontal sums of in-place dot
 * products. Grid x = ceil(N / 256), y = ceil(M / RM), z = batch·heads (work-group 1x1x1). */
#define SIP_KEYS 256
#if !KSEL || K_scores_in_place
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
scores_in_place(GEMM_KERNEL_ARGS(T_IN))
{
    DIRECT_INDICES(SIP_KEYS);
    __global const T_IN *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh;
    qrow q[RM];
#pragma unroll 1
    for (int i = 0; i < RM; i++) {
        __global const T_A *arow = Ab + (ulong)min(m0 + i, M - 1) * a_ss; /* rows past M: not stored */
        for (int d = 0; d < DP16; d++)
            q[i].f[d] = d < K ? LD_A(arow, d) : 0.0f;
    }
    __global T_OUT *Cb = C + c_off + (ulong)b * c_sb + (ulong)h * c_sh;
    __global const T_MASK *Mb = mask + m_off + (ulong)b * m_sb + (ulong)h * m_sh;
    const int n_end = min(N, n0 + SIP_KEYS);
    /* Chunks at or past the last row's end are hidden from every row: -inf, not computed. */
    const int tile_end = causal_end(causal, min(M, m0 + RM) - 1, seq_q, L);
    for (int kc = n0; kc < n_end; kc += 16) {
        float16 s[RM];
        if (kc >= tile_end) {
#pragma unroll 1
            for (int i = 0; i < RM && m0 + i < M; i++)
                store_scores16(Cb, c_ss, Mb, m_ss, m0 + i, kc, N, tile_end, has_mask, (float16)(0.0f));
            continue;
        }
#if QK_TILE_FOR(RM)
#pragma unroll 1
        for (int i0 = 0; i0 < RM; i0 += QT_R)
            qk16_tile(q + i0, Bb, b_ss, kc, N - 1, K, s + i0);
#else
#pragma unroll 1
        for (int i = 0; i < RM; i++)
            s[i] = qk16_row(q + i, Bb, b_ss, kc, N - 1, K);
#endif
#pragma unroll 1
        for (int i = 0; i < RM && m0 + i < M; i++) {
            const int m = m0 + i;
            store_scores16(Cb, c_ss, Mb, m_ss, m, kc, N, causal_end(causal, m, seq_q, L), has_mask,
                           s[i] * alpha);
        }
    }
}
#endif
#endif

#if MODE == 1
/* The NS float16 vectors of a V row's columns from vr, ncols of them existing (0 beyond). */
__attribute__((always_inline)) inline void load_v16s(__global const T_IN *vr, int ncols, float16 *bv)
{
#pragma unroll
    for (int s = 0; s < NS; s++)
        bv[s] = 16 * s + 15 < ncols ? LD16_IN(vr, 16 * s) : ld16_tail(vr, 16 * s, ncols);
}

/* P·V on CPUs (P·V DIRECT 1): one work-item per RM rows x 16·NS columns of O over every key its
 * rows see, no local memory, no barrier: V rows read in place as float16 vectors, P's values
 * broadcast, the accumulators in registers. Keys some row of the block hides are checked row by
 * row (IS_HIDDEN, see gemm's MODE 1) so that NaN or Inf in their V never reach O. Rows past M
 * compute on a copy of row M - 1 and are not stored. Grid x = ceil(N / (16·NS)),
 * y = ceil(M / RM), z = batch·heads (work-group 1x1x1).
 * O is summed at full scale, and again at half scale (o_from_half16, common.cl) only where the
 * first sum came out Inf or NaN somewhere in the tile: Inf or NaN in a visible V row (the second
 * sum gives them again), or V rows near ±FLT_MAX that the rounded weights took past it. Halving
 * the weights in the one sum costs a multiply per row and key, a fourth as many as the
 * multiply-adds: measured on PoCL (2-core Xeon, AVX-512, B1 H8 S1024 d64 f32, minima of 6 runs
 * alternating with the kernel before; a noisy machine) unfused took 13.5 ms against 11.4, and
 * 13.2 against 13.6 with the second sum instead. */
#define PV_DIRECT_SUM(W)                                                                         \
    {                                                                                            \
        _Pragma("unroll") for (int i = 0; i < RM; i++)                                           \
            _Pragma("unroll") for (int s = 0; s < NS; s++) acc[i][s] = (float16)(0.0f);          \
        int k = 0;                                                                               \
        for (; k < kfull; k++) {                                                                 \
            float16 bv[NS];                                                                      \
            load_v16s(Bb + (ulong)k * b_ss, ncols, bv);                                          \
            MAD_TILE(acc, arow, k, bv, W)                                                        \
        }                                                                                        \
        /* The rest 16 keys at a time: 16 keys that no row hides (with a mask of finite values, \
         * all of them) go unchecked, the others key by key. Measured on PoCL (2-core Intel    \
         * Xeon, AVX-512, B1 H8 S1024 d64 f32, a finite [1][1][S][S] f32 mask, medians, 2 runs  \
         * alternating): unfused 16.4-17.4 ms against 22.6-25.8 when every key was checked. */  \
        while (k < kend) {                                                                       \
            if (k + 16 <= kend) {                                                                \
                int16 hid = (int16)(0);                                                          \
                _Pragma("unroll") for (int i = 0; i < RM; i++) hid |= IS_HIDDEN16(LD16_A(arow[i], k)); \
                if (!any(hid)) {                                                                 \
                    for (const int stop = k + 16; k < stop; k++) {                               \
                        float16 bv[NS];                                                          \
                        load_v16s(Bb + (ulong)k * b_ss, ncols, bv);                              \
                        MAD_TILE(acc, arow, k, bv, W)                                            \
                    }                                                                            \
                    continue;                                                                    \
                }                                                                                \
            }                                                                                    \
            for (const int stop = min(k + 16, kend); k < stop; k++) {                            \
                float a[RM];                                                                     \
                int seen = 0;                                                                    \
                _Pragma("unroll") for (int i = 0; i < RM; i++) {                                 \
                    a[i] = LD_A(arow[i], k) * (W); /* -0 stays -0 */                             \
                    seen |= !IS_HIDDEN(a[i]);                                                    \
                }                                                                                \
                if (!seen)                                                                       \
                    continue;                                                                    \
                float16 bv[NS];                                                                  \
                load_v16s(Bb + (ulong)k * b_ss, ncols, bv);                                      \
                _Pragma("unroll") for (int i = 0; i < RM; i++) if (!IS_HIDDEN(a[i]))             \
                    _Pragma("unroll") for (int s = 0; s < NS; s++)                               \
                        acc[i][s] = MAD((float16)(a[i]), bv[s], acc[i][s]);                      \
            }                                                                                    \
        }                                                                                        \
    }

#if !KSEL || K_pv_direct
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
pv_direct(GEMM_KERNEL_ARGS(T_IN))
{
    DIRECT_INDICES(16 * NS);
    const int kend = causal_end(causal, min(M, m0 + RM) - 1, seq_q, L);
    const int kfull = min(kend, has_mask ? 0 : causal_end(causal, m0, seq_q, L)); /* all rows see k < kfull */
    __global const T_IN *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh + n0;
    __global const T_A *arow[RM];
#pragma unroll
    for (int i = 0; i < RM; i++)
        arow[i] = Ab + (ulong)min(m0 + i, M - 1) * a_ss;
    const int ncols = N - n0; /* columns of this block's V rows that exist */
    float16 acc[RM][NS];
    PV_DIRECT_SUM(1.0f)
    int16 odd = (int16)(0);
#pragma unroll
    for (int i = 0; i < RM; i++)
#pragma unroll
        for (int s = 0; s < NS; s++)
            odd |= isinf(acc[i][s]) | isnan(acc[i][s]);
    if (any(odd)) {
        PV_DIRECT_SUM(O_WEIGHT)
#pragma unroll
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int s = 0; s < NS; s++)
                acc[i][s] = o_from_half16(acc[i][s]);
    }
    __global T_OUT *Cb = C + c_off + (ulong)b * c_sb + (ulong)h * c_sh;
    for (int i = 0; i < RM && m0 + i < M; i++) {
        __global T_OUT *crow = Cb + (ulong)(m0 + i) * c_ss;
#pragma unroll
        for (int s = 0; s < NS; s++) {
            const int n = n0 + 16 * s;
            store4_row(crow, n, acc[i][s].s0123, N);
            store4_row(crow, n + 4, acc[i][s].s4567, N);
            store4_row(crow, n + 8, acc[i][s].s89ab, N);
            store4_row(crow, n + 12, acc[i][s].scdef, N);
        }
    }
}
#endif
#undef PV_DIRECT_SUM
#endif
