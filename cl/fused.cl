/* Flash-style fused attention: O = softmax(Q·Kᵀ·scale + mask)·V without materialising scores.
 *
 * Rows. The query rows of one kv head's group are packed: row r in [0, R), R = group·seq_q, is
 * query head hk·group + r / seq_q, position r % seq_q. A K/V tile loaded once thus serves every
 * query head reading it (GQA), and decode (seq_q = 1) still fills a tile with heads.
 * Grid: x = WGX, y = ceil(R / BM)·WGY, z = batch · heads_kv · splits.
 *
 * Keys. Work-group split s covers keys [s·split_len, (s+1)·split_len) ∩ [0, L) and stops at the
 * last key its bottom row may see (causal), so tiles past the diagonal are never loaded. With
 * splits > 1 each split writes a partial (O normalised by its own sum, LSE) into f32 scratch
 * and merge.cl combines them (flash-decoding).
 *
 * Work-item (tx, ty) owns rows ty·RM .. ty·RM+RM-1; of each BN-key tile the NS float4 key blocks
 * at 4·(tx + WGX·s); of O the NV float4 column blocks at 4·(tx + WGX·c). Q is pre-multiplied by
 * scale·log2(e) when staged, so scores are in log2 units and softmax uses exp2. */

#ifndef WGX
#define WGX 8 /* work-items across keys (S) and across head_dim_v (O) */
#endif
#ifndef WGY
#define WGY 8 /* work-items across query rows */
#endif
#ifndef RM
#define RM 4 /* query rows per work-item */
#endif
#ifndef NS
#define NS 1 /* float4 key blocks per work-item: BN = WGX·4·NS keys per tile */
#endif
#ifndef NV
#define NV 2 /* float4 O column blocks per work-item: covers WGX·4·NV >= head_dim_v */
#endif
#ifndef DP
#define DP 64 /* head_dim rounded up to a multiple of 4 */
#endif

#define BM (WGY * RM)
#define BN (WGX * 4 * NS)
#define DVP (WGX * 4 * NV)
#define NWI (WGX * WGY)

__kernel __attribute__((reqd_work_group_size(WGX, WGY, 1))) void
fused(__global const T_IN *Q, ulong q_off, ulong q_sb, ulong q_sh, ulong q_ss,
      __global const T_IN *K, ulong k_off, ulong k_sb, ulong k_sh, ulong k_ss,
      __global const T_IN *V, ulong v_off, ulong v_sb, ulong v_sh, ulong v_ss,
      __global T_OUT *O, ulong o_off, ulong o_sb, ulong o_sh, ulong o_ss,
      __global float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,
      __global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh, ulong m_ss,
      __global const int *kvlen, ulong o_split, ulong l_split, int seq_q, int seq_kv, int heads_kv,
      int group, int D, int DV, int causal, int has_mask, int has_lse, int splits, int split_len,
      float qscale)
{
    __local float Qs[DP][BM];
    __local float Ks[DP][BN];
    __local float Vs[BN][DVP];
    __local float Ps[BN][BM];
    __local float red[BM][WGX];

    const int tx = get_local_id(0), ty = get_local_id(1);
    const int lid = ty * WGX + tx;
    const int zz = get_group_id(2);
    const int split = zz % splits;
    const int bh = zz / splits;
    const int b = bh / heads_kv, hk = bh % heads_kv;
    const int R = group * seq_q;
    const int r0 = get_group_id(1) * BM;
    const int r1 = min(R, r0 + BM) - 1;

    const int L = keys_of_batch(kvlen, b, seq_kv);
    /* Positions of the tile's first and last rows bound the causal key range of all its rows. */
    const int spans = (r0 / seq_q) != (r1 / seq_q);
    const int i_min = spans ? 0 : r0 % seq_q;
    const int i_max = spans ? seq_q - 1 : r1 % seq_q;
    const int k_lo = split * split_len;
    const int k_hi = min(min(L, k_lo + split_len), causal_end(causal, i_max, seq_q, L));
    const int k_all = min(k_hi, causal_end(causal, i_min, seq_q, L)); /* every row sees k < k_all */

    __global const T_IN *Kb = K + k_off + (ulong)b * k_sb + (ulong)hk * k_sh;
    __global const T_IN *Vb = V + v_off + (ulong)b * v_sb + (ulong)hk * v_sh;

    /* Stage Q (scaled, transposed) once. */
    for (int e = lid; e < BM * DP; e += NWI) {
        const int r = e / DP, d = e % DP;
        const int row = r0 + r;
        float x = 0.0f;
        if (row < R && d < D) {
            const int hq = hk * group + row / seq_q, i = row % seq_q;
            x = LD_IN(Q, q_off + (ulong)b * q_sb + (ulong)hq * q_sh + (ulong)i * q_ss + d) * qscale;
        }
        Qs[d][r] = x;
    }

    /* Per-row state of this work-item's rows. */
    float m[RM], l[RM];
    int rend[RM]; /* one past the last key the row may see */
    ulong mrow[RM];
    float4 o[RM][NV];
    for (int i = 0; i < RM; i++) {
        const int row = r0 + ty * RM + i;
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        m[i] = NEG_INF;
        l[i] = 0.0f;
        rend[i] = row < R ? min(k_hi, causal_end(causal, pos, seq_q, L)) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
        for (int c = 0; c < NV; c++)
            o[i][c] = (float4)(0.0f);
    }

    for (int kt = k_lo; kt < k_hi; kt += BN) {
        /* A tile is guarded when some row hides some key in it: masked entries get -inf and
         * zero probabilities are skipped in P·V so NaN/Inf in hidden K/V rows cannot leak. */
        const int guarded = has_mask || kt + BN > k_all;

        for (int e = lid; e < BN * DP; e += NWI) {
            const int n = e / DP, d = e % DP;
            const int key = kt + n;
            Ks[d][n] = (key < k_hi && d < D) ? LD_IN(Kb, (ulong)key * k_ss + d) : 0.0f;
        }
        for (int e = lid; e < BN * DVP; e += NWI) {
            const int n = e / DVP, c = e % DVP;
            const int key = kt + n;
            Vs[n][c] = (key < k_hi && c < DV) ? LD_IN(Vb, (ulong)key * v_ss + c) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        float4 s[RM][NS];
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < NS; j++)
                s[i][j] = (float4)(0.0f);
        for (int d = 0; d < DP; d++) {
            float4 kv[NS];
            for (int j = 0; j < NS; j++)
                kv[j] = vload4(0, &Ks[d][4 * (tx + WGX * j)]);
            for (int i = 0; i < RM; i++) {
                const float qv = Qs[d][ty * RM + i];
                for (int j = 0; j < NS; j++)
                    s[i][j] = mad((float4)(qv), kv[j], s[i][j]);
            }
        }

        if (guarded) {
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < NS; j++) {
                    float t[4];
                    vstore4(s[i][j], 0, t);
                    for (int e = 0; e < 4; e++) {
                        const int key = kt + 4 * (tx + WGX * j) + e;
                        if (key >= rend[i])
                            t[e] = NEG_INF;
                        else if (has_mask)
                            t[e] += LD_MASK(mask, mrow[i] + key) * LOG2E;
                    }
                    s[i][j] = vload4(0, t);
                }
        }

        for (int i = 0; i < RM; i++) {
            float4 mx = s[i][0];
            for (int j = 1; j < NS; j++)
                mx = fmax(mx, s[i][j]);
            red[ty * RM + i][tx] = fmax(fmax(mx.s0, mx.s1), fmax(mx.s2, mx.s3));
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int i = 0; i < RM; i++) {
            float mt = red[ty * RM + i][0];
            for (int t = 1; t < WGX; t++)
                mt = fmax(mt, red[ty * RM + i][t]);
            const float mnew = fmax(m[i], mt);
            /* A row that has seen only -inf keeps a 0 reference so exp2 never sees -inf - -inf. */
            const float mref = mnew == NEG_INF ? 0.0f : mnew;
            const float alpha = exp2(m[i] - mref);
            m[i] = mnew;
            l[i] *= alpha;
            for (int c = 0; c < NV; c++)
                o[i][c] *= alpha;
            for (int j = 0; j < NS; j++) {
                const float4 p = exp2(s[i][j] - mref);
                const int n = 4 * (tx + WGX * j);
                Ps[n + 0][ty * RM + i] = p.s0;
                Ps[n + 1][ty * RM + i] = p.s1;
                Ps[n + 2][ty * RM + i] = p.s2;
                Ps[n + 3][ty * RM + i] = p.s3;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        const int nkeys = min(BN, k_hi - kt);
        if (guarded) {
            for (int n = 0; n < nkeys; n++) {
                float4 vv[NV];
                for (int c = 0; c < NV; c++)
                    vv[c] = vload4(0, &Vs[n][4 * (tx + WGX * c)]);
                for (int i = 0; i < RM; i++) {
                    const float p = Ps[n][ty * RM + i];
                    if (p != 0.0f) {
                        l[i] += p;
                        for (int c = 0; c < NV; c++)
                            o[i][c] = mad((float4)(p), vv[c], o[i][c]);
                    }
                }
            }
        } else {
            for (int n = 0; n < BN; n++) {
                float4 vv[NV];
                for (int c = 0; c < NV; c++)
                    vv[c] = vload4(0, &Vs[n][4 * (tx + WGX * c)]);
                for (int i = 0; i < RM; i++) {
                    const float p = Ps[n][ty * RM + i];
                    l[i] += p;
                    for (int c = 0; c < NV; c++)
                        o[i][c] = mad((float4)(p), vv[c], o[i][c]);
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* before the next tile overwrites Ks, Vs, Ps, red */
    }

    O += o_off + (ulong)split * o_split;
    LSE += l_off + (ulong)split * l_split;
    for (int i = 0; i < RM; i++) {
        const int row = r0 + ty * RM + i;
        if (row >= R)
            continue;
        const int hq = hk * group + row / seq_q, pos = row % seq_q;
        /* No visible key: output exactly 0 and LSE -inf. NaN in l (from a NaN score) propagates. */
        const int empty = m[i] == NEG_INF;
        const float inv = empty ? 0.0f : 1.0f / l[i];
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)pos * o_ss;
        for (int c = 0; c < NV; c++) {
            const int col = 4 * (tx + WGX * c);
            const float4 x = empty ? (float4)(0.0f) : o[i][c] * inv;
            if (col + 3 < DV) {
                ST4_OUT(orow, col, x);
            } else {
                float t[4];
                vstore4(x, 0, t);
                for (int e = 0; e < 4 && col + e < DV; e++)
                    ST_OUT(orow, col + e, t[e]);
            }
        }
        if (has_lse && tx == 0)
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)pos * l_ss] =
                empty ? NEG_INF : (m[i] + log2(l[i])) * LN2;
    }
}
