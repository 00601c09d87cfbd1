/* Row-wise numerically stable softmax of scale·x + mask, one work-group per row.
 *
 * in/out are [batch][heads][rows][cols] views; a work-group handles row i of head h of batch b
 * (grid x = rows·WG, y = batch·heads). Columns hidden by kv_lengths or causal (bottom-right, see
 * common.cl) and -inf entries give 0. Pass 1 keeps a running (max, sum) per work-item over
 * float4 chunks at 4·(lid + WG·t), combined by a local tree; pass 2 writes exp(x - max) / sum.
 * Optional LSE (natural log) per row. In place is fine: each element is read then written by
 * the same work-item. */

#ifndef WG
#define WG 64 /* work-items per row */
#endif

/* Running (max, sum) in log2 units; -inf entries do not count, NaN poisons the sum. */
inline void online(float x, float *m, float *s)
{
    if (x == NEG_INF)
        return;
    if (x > *m) {
        *s = *s * exp2(*m - x) + 1.0f;
        *m = x;
    } else {
        *s += exp2(x - *m);
    }
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
softmax(__global const T_A *X, ulong x_off, ulong x_sb, ulong x_sh, ulong x_ss,
        __global T_OUT *Y, ulong y_off, ulong y_sb, ulong y_sh, ulong y_ss,
        __global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh, ulong m_ss,
        __global float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,
        __global const int *kvlen, int rows, int cols, int heads, int causal, int has_mask,
        int has_lse, float scale)
{
    __local float lm[WG], ls[WG];
    const int lid = get_local_id(0);
    const int i = get_group_id(0);
    const int z = get_group_id(1);
    const int b = z / heads, h = z % heads;
    const int L = keys_of_batch(kvlen, b, cols);
    const int cend = causal_end(causal, i, rows, L);

    __global const T_A *x = X + x_off + (ulong)b * x_sb + (ulong)h * x_sh + (ulong)i * x_ss;
    __global T_OUT *y = Y + y_off + (ulong)b * y_sb + (ulong)h * y_sh + (ulong)i * y_ss;
    __global const T_MASK *mk = mask + m_off + (ulong)b * m_sb + (ulong)h * m_sh + (ulong)i * m_ss;
    const float sc = scale * LOG2E;

    float m = NEG_INF, s = 0.0f;
    for (int j = 4 * lid; j < cend; j += 4 * WG) {
        if (j + 3 < cend) {
            float4 v = LD4_A(x, j) * sc;
            if (has_mask)
                v += (float4)(LD_MASK(mk, j), LD_MASK(mk, j + 1), LD_MASK(mk, j + 2),
                              LD_MASK(mk, j + 3)) * LOG2E;
            online(v.s0, &m, &s);
            online(v.s1, &m, &s);
            online(v.s2, &m, &s);
            online(v.s3, &m, &s);
        } else {
            for (int e = j; e < cend; e++)
                online(LD_A(x, e) * sc + (has_mask ? LD_MASK(mk, e) * LOG2E : 0.0f), &m, &s);
        }
    }
    lm[lid] = m;
    ls[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = WG / 2; w > 0; w /= 2) {
        if (lid < w) {
            const float m1 = lm[lid], m2 = lm[lid + w];
            const float mm = fmax(m1, m2);
            if (mm != NEG_INF) {
                ls[lid] = ls[lid] * exp2(m1 - mm) + ls[lid + w] * exp2(m2 - mm);
                lm[lid] = mm;
            } else {
                ls[lid] += ls[lid + w]; /* both empty; keeps a NaN if one is there */
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float M = lm[0], S = ls[0];
    /* No finite visible entry: zeros. Otherwise 1/S, NaN if a NaN entered the sum. */
    const int empty = M == NEG_INF && !isnan(S);
    const float inv = 1.0f / S;

    for (int j = 4 * lid; j < cols; j += 4 * WG) {
        if (j + 3 < cend) {
            float4 v = LD4_A(x, j) * sc;
            if (has_mask)
                v += (float4)(LD_MASK(mk, j), LD_MASK(mk, j + 1), LD_MASK(mk, j + 2),
                              LD_MASK(mk, j + 3)) * LOG2E;
            const float4 p = empty ? (float4)(0.0f) : exp2(v - M) * inv;
            ST4_OUT(y, j, p);
        } else {
            for (int e = j; e < min(j + 4, cols); e++) {
                float p = 0.0f;
                if (e < cend && !empty)
                    p = exp2(LD_A(x, e) * sc + (has_mask ? LD_MASK(mk, e) * LOG2E : 0.0f) - M) * inv;
                ST_OUT(y, e, p);
            }
        }
    }
    if (has_lse && lid == 0)
        LSE[l_off + (ulong)b * l_sb + (ulong)h * l_sh + (ulong)i * l_ss] =
            empty ? NEG_INF : (M + log2(S)) * LN2;
}
