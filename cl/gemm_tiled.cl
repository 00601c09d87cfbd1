/* The tiled GEMM of the unfused path on GPUs (DIRECT 0; modes and arguments: gemm_common.cl).
 *
 * z = GROUP_ID(2) = b·heads + h; B is read from kv head h / group.
 * A work-group computes a TM x TN tile of C; work-item (tx, ty) owns rows ty·RM .. ty·RM+RM-1 and
 * the NS column blocks of VW floats starting at OWN_COL(tx, s) = VW·(tx + WGX·s): interleaved so
 * that neighbouring work-items read neighbouring local-memory words. K is walked in chunks of TK
 * staged in local memory: B k-major (Bs[k][n]) for vector reads along n, A row-major (its values
 * are broadcast). */

#ifndef WGX
#define WGX 16 /* work-items along C's columns */
#endif
#ifndef WGY
#define WGY 8 /* work-items along C's rows */
#endif
#ifndef VW
#define VW 4 /* vector width of the column blocks: 4, 8 or 16 (16 fills an AVX-512 register) */
#endif
#ifndef TK
#define TK 32 /* reduction (k) elements staged per step; a multiple of 4 */
#endif
#ifndef KFULL
#define KFULL 0 /* 1: TK >= K (scores with the whole head_dim staged at once) */
#endif

#define TM (WGY * RM)
#define TN (WGX * VW * NS)
#define floatV CAT(float, VW)
#define vloadV CAT(vload, VW)
#define vstoreV CAT(vstore, VW)
#define NWI (WGX * WGY)

/* The first of the VW columns of C (within the tile) of column block s of work-item tx. */
#define OWN_COL(tx, s) (VW * ((tx) + WGX * (s)))
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
#if MODE == 1
    floatV tot[RM][NS]; /* the chunks before the last PV_FOLD keys (gemm_common.cl) */
    for (int i = 0; i < RM; i++)
        for (int s = 0; s < NS; s++)
            tot[i][s] = (floatV)(0.0f);
#endif

    for (int k0 = 0; k0 < kend; k0 += TK) {
#if MODE == 1
        if (k0 > 0 && k0 % PV_FOLD < TK) { /* k0 just crossed a multiple of PV_FOLD */
            for (int i = 0; i < RM; i++)
                for (int s = 0; s < NS; s++) {
                    tot[i][s] += acc[i][s];
                    acc[i][s] = (floatV)(0.0f);
                }
        }
#endif
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
                    bv[s] = vloadV(0, &Bs[kk][OWN_COL(tx, s)]);
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
                    bv[s] = vloadV(0, &Bs[kk][OWN_COL(tx, s)]);
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
#if MODE == 1 && !KFULL
    for (int i = 0; i < RM; i++)
        for (int s = 0; s < NS; s++)
            acc[i][s] += tot[i][s];
#endif

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
                const int n = n0 + OWN_COL(tx, s) + q;
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

