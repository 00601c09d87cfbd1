/* Batched tiled GEMM for the unfused path: C[z] = A[z] · op(B[z]) with a per-mode epilogue.
 *
 * MODE 0 (scores): A = Q [Sq][D], B = K [Skv][D] (so op(B) = Kᵀ), C = scores [Sq][Skv];
 *   epilogue: alpha·acc + mask, keys hidden by kv_lengths or causal set to -inf.
 * MODE 1 (P·V):    A = P [Sq][Skv], B = V [Skv][Dv], C = out [Sq][Dv]; the key loop stops at the
 *   last key any row of the tile can see, and hidden keys never touch C (0·NaN would).
 *
 * z = get_group_id(2) = b·heads + h; B is read from kv head h / group.
 * A work-group computes a TM x TN tile of C; work-item (tx, ty) owns rows ty·RM .. ty·RM+RM-1 and
 * the NS float4 column blocks starting at 4·(tx + WGX·s): interleaved so that neighbouring
 * work-items read neighbouring local-memory words. K is walked in chunks of TK staged in local
 * memory, A and B both stored k-major (As[k][m], Bs[k][n]) for vector reads. */

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
#define NS 1 /* float4 column blocks of C per work-item */
#endif
#ifndef TK
#define TK 32 /* reduction (k) elements staged per step */
#endif
#ifndef MODE
#define MODE 0
#endif

#define TM (WGY * RM)
#define TN (WGX * 4 * NS)
#define NWI (WGX * WGY)

__kernel __attribute__((reqd_work_group_size(WGX, WGY, 1))) void
gemm(__global const T_A *A, ulong a_off, ulong a_sb, ulong a_sh, ulong a_ss,
     __global const T_IN *B, ulong b_off, ulong b_sb, ulong b_sh, ulong b_ss,
     __global T_OUT *C, ulong c_off, ulong c_sb, ulong c_sh, ulong c_ss,
     __global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh, ulong m_ss,
     __global const int *kvlen, int M, int N, int K, int heads, int group, int seq_q, int seq_kv,
     int causal, int has_mask, float alpha)
{
    __local float As[TK][TM];
    __local float Bs[TK][TN];

    const int tx = get_local_id(0), ty = get_local_id(1);
    const int lid = ty * WGX + tx;
    const int z = get_group_id(2);
    const int b = z / heads, h = z % heads, hk = h / group;
    const int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;

    __global const T_A *Ab = A + a_off + (ulong)b * a_sb + (ulong)h * a_sh;
    __global const T_IN *Bb = B + b_off + (ulong)b * b_sb + (ulong)hk * b_sh;
    const int L = keys_of_batch(kvlen, b, seq_kv);

#if MODE == 1
    /* Keys beyond the last one the tile's bottom row can see contribute nothing. */
    const int last_row = min(M, m0 + TM) - 1;
    const int kend = causal_end(causal, last_row, seq_q, L);
    const int kfull = has_mask ? 0 : causal_end(causal, m0, seq_q, L); /* all rows see k < kfull */
#else
    const int kend = K;
#endif

    float4 acc[RM][NS];
    for (int i = 0; i < RM; i++)
        for (int s = 0; s < NS; s++)
            acc[i][s] = (float4)(0.0f);

    for (int k0 = 0; k0 < kend; k0 += TK) {
        for (int e = lid; e < TM * TK; e += NWI) {
            const int r = e / TK, c = e % TK;
            const int m = m0 + r, k = k0 + c;
            As[c][r] = (m < M && k < kend) ? LD_A(Ab, (ulong)m * a_ss + k) : 0.0f;
        }
#if MODE == 0
        for (int e = lid; e < TN * TK; e += NWI) {
            const int r = e / TK, c = e % TK;
            const int n = n0 + r, k = k0 + c;
            Bs[c][r] = (n < N && k < K) ? LD_IN(Bb, (ulong)n * b_ss + k) : 0.0f;
        }
#else
        for (int e = lid; e < TN * TK; e += NWI) {
            const int r = e / TN, c = e % TN;
            const int n = n0 + c, k = k0 + r;
            Bs[r][c] = (n < N && k < kend) ? LD_IN(Bb, (ulong)k * b_ss + n) : 0.0f;
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
#if MODE == 1
        if (k0 + TK > kfull) {
            /* Some row of the tile hides some key of this chunk: skip zero probabilities so that
             * NaN or Inf in a hidden V row cannot reach C. */
            for (int kk = 0; kk < TK; kk++) {
                float4 bv[NS];
                for (int s = 0; s < NS; s++)
                    bv[s] = vload4(0, &Bs[kk][4 * (tx + WGX * s)]);
                for (int i = 0; i < RM; i++) {
                    const float a = As[kk][ty * RM + i];
                    if (a != 0.0f)
                        for (int s = 0; s < NS; s++)
                            acc[i][s] = mad((float4)(a), bv[s], acc[i][s]);
                }
            }
        } else
#endif
        {
            for (int kk = 0; kk < TK; kk++) {
                float4 bv[NS];
                for (int s = 0; s < NS; s++)
                    bv[s] = vload4(0, &Bs[kk][4 * (tx + WGX * s)]);
                for (int i = 0; i < RM; i++) {
                    const float a = As[kk][ty * RM + i];
                    for (int s = 0; s < NS; s++)
                        acc[i][s] = mad((float4)(a), bv[s], acc[i][s]);
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* before the next chunk overwrites As/Bs */
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
            float v[4];
            vstore4(acc[i][s], 0, v);
            for (int e = 0; e < 4; e++) {
                const int n = n0 + 4 * (tx + WGX * s) + e;
                if (n >= N)
                    continue;
#if MODE == 0
                float x = v[e] * alpha;
                if (has_mask)
                    x += LD_MASK(Mb, (ulong)m * m_ss + n);
                if (n >= cend)
                    x = NEG_INF;
                ST_OUT(Cb, (ulong)m * c_ss + n, x);
#else
                ST_OUT(Cb, (ulong)m * c_ss + n, v[e]);
#endif
            }
        }
    }
}
