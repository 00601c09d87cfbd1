/* Row-wise numerically stable softmax of scale·x + mask, one work-group per row.
 *
 * in/out are [batch][heads][rows][cols] views; a work-group handles row i of head h of batch b
 * (grid x = rows·WG, y = batch·heads). Columns hidden by kv_lengths or causal (bottom-right, see
 * common.cl), a -inf mask and -inf entries give -0 (HIDDEN_P: equal to 0, and the unfused path's
 * P·V skips exactly these). Work-item lid reads float4 chunks at 4·(lid + WG·t) so the work-group
 * streams the row contiguously. Three branch-free passes, each a local-memory tree reduction:
 * row max (NaN is ignored by fmax here but re-enters through the sum), sum of
 * exp2((x - max)·log2 e), then the normalised write. The maximum is subtracted before the
 * multiplication by log2 e, so logits anywhere up to FLT_MAX work. Short rows stay in cache
 * between passes; long rows (up to and beyond 10^6) just stream. Optional LSE (natural log) per row. In place is fine: each element
 * is read, then written, by the same work-item. */

#ifndef WG
#define WG 64 /* work-items per row; a power of two */
#endif

#if DT_MASK == 0
#define LD4_MASK(p, i) vload4(0, (p) + (i))
#else
#define LD4_MASK(p, i) vload_half4(0, (p) + (i))
#endif

/* Element j..j+3 of the row (scale·x + mask, natural units); hidden columns are -inf. */
inline float4 row4(__global const T_A *x, __global const T_MASK *mk, int j, int cend, float sc,
                   int has_mask)
{
    float4 v;
    if (j + 3 < cend) {
        v = LD4_A(x, j) * sc;
        if (has_mask) {
            const float4 mv = LD4_MASK(mk, j);
            /* A -inf mask hides the entry even when it is NaN. */
            v = select(v + mv, (float4)(NEG_INF), mv == (float4)(NEG_INF));
        }
    } else {
        float t[4];
        for (int e = 0; e < 4; e++) {
            const float mv = has_mask && j + e < cend ? LD_MASK(mk, j + e) : 0.0f;
            t[e] = j + e < cend && mv != NEG_INF ? LD_A(x, j + e) * sc + mv : NEG_INF;
        }
        v = vload4(0, t);
    }
    return v;
}

#if !KSEL || K_softmax
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
softmax(__global const T_A *X, ulong x_off, ulong x_sb, ulong x_sh, ulong x_ss,
        __global T_OUT *Y, ulong y_off, ulong y_sb, ulong y_sh, ulong y_ss,
        __global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh, ulong m_ss,
        __global float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,
        __global const int *kvlen, int rows, int cols, int heads, int causal, int has_mask,
        int has_lse, float scale, __global const float *SK, ulong sk_off, ulong sk_sh)
{
    __local float red[WG];
    const int lid = get_local_id(0);
    const int i = get_group_id(0);
    const int z = GROUP_ID(1);
    const int b = z / heads, h = z % heads;
    const int L = keys_of_batch(kvlen, b, cols);
    const int cend = max(0, causal_end(causal, i, rows, L));

    __global const T_A *x = X + x_off + (ulong)b * x_sb + (ulong)h * x_sh + (ulong)i * x_ss;
    __global T_OUT *y = Y + y_off + (ulong)b * y_sb + (ulong)h * y_sh + (ulong)i * y_ss;
    __global const T_MASK *mk = mask + m_off + (ulong)b * m_sb + (ulong)h * m_sh + (ulong)i * m_ss;
    const float sc = scale;

    float4 m4 = (float4)(NEG_INF);
    for (int j = 4 * lid; j < cend; j += 4 * WG)
        m4 = fmax(m4, row4(x, mk, j, cend, sc, has_mask));
    red[lid] = fmax(fmax(m4.s0, m4.s1), fmax(m4.s2, m4.s3));
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = WG / 2; w > 0; w /= 2) {
        if (lid < w)
            red[lid] = fmax(red[lid], red[lid + w]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    /* An attention sink (SK not NULL: head h's logit at SK[sk_off + h·sk_sh]) joins the maximum
     * and the sum, not the row: its probabilities sum to less than 1 (docs/variants.md). */
    const float sink = SK ? SK[sk_off + (ulong)h * sk_sh] : NEG_INF;
    const float Mrow = red[0], M = fmax(Mrow, sink);
    /* A row whose visible entries are all -inf (or that has none) uses 0 as reference so that
     * exp2(-inf - ref) is 0, never NaN; it then outputs zeros. */
    const float ref = M == NEG_INF ? 0.0f : M;
    barrier(CLK_LOCAL_MEM_FENCE); /* everyone has read red[0] before it is reused */

    float4 s4 = (float4)(0.0f);
    for (int j = 4 * lid; j < cend; j += 4 * WG)
        s4 += exp2((row4(x, mk, j, cend, sc, has_mask) - ref) * LOG2E);
    red[lid] = (s4.s0 + s4.s1) + (s4.s2 + s4.s3);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = WG / 2; w > 0; w /= 2) {
        if (lid < w)
            red[lid] += red[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    /* A row with no visible finite entry (Mrow -inf, entries' sum 0, not NaN) gives LSE s, whatever
     * the sink holds; a sink of +inf (e^(s - M) NaN) or NaN makes any other row NaN. */
    const int empty = Mrow == NEG_INF && red[0] == 0.0f;
    const float S = red[0] + (sink == NEG_INF ? 0.0f : exp2((sink - ref) * LOG2E));
    /* S is 0 for an empty row (zeros out), NaN if a NaN is visible (NaN row). */
    const float inv = S == 0.0f ? 0.0f : 1.0f / S;

    for (int j = 4 * lid; j < cols; j += 4 * WG) {
        const float4 v = row4(x, mk, j, cend, sc, has_mask);
        /* Hidden and -inf entries are exactly -0, also in a NaN row (where inv is NaN). */
        const float4 p = select(exp2((v - ref) * LOG2E) * inv, (float4)(HIDDEN_P), v == (float4)(NEG_INF));
        if (j + 3 < cols) {
            ST4_OUT(y, j, p);
        } else {
            float t[4];
            vstore4(p, 0, t);
            for (int e = 0; j + e < cols; e++)
                ST_OUT(y, j + e, t[e]);
        }
    }
    if (has_lse && lid == 0)
        LSE[l_off + (ulong)b * l_sb + (ulong)h * l_sh + (ulong)i * l_ss] =
            empty ? sink : S == 0.0f ? NEG_INF : ref + log(S);
}
#endif

/* CPU variant: one work-item walks ROWS whole rows alone, 16 columns at a time, with no local
 * memory and no barrier (PoCL pays for every barrier region and every work-group). Same three
 * passes and the same rules as above; grid x = ceil(rows / ROWS), y = batch·heads. */
#ifdef ROWS

#if DT_OUT == 0
#define LD16_OUT(p, i) vload16(0, (p) + (i))
#elif DT_OUT == 1
#define LD16_OUT(p, i) vload_half16(0, (p) + (i))
#else
#define LD16_OUT(p, i) as_float16(convert_uint16(vload16(0, (p) + (i))) << 16)
#endif
#if DT_OUT == 0
#define ST16_OUT(p, i, x) vstore16((x), 0, (p) + (i))
#elif DT_OUT == 1
#define ST16_OUT(p, i, x) vstore_half16_rte((x), 0, (p) + (i))
#else
#define ST16_OUT(p, i, x) ST_BF16X16((p) + (i), f32_to_bf16_16(x))
#endif

/* Columns j..j+15, all visible (j + 15 < cend), natural units. */
inline float16 row16(__global const T_A *x, __global const T_MASK *mk, int j, float sc,
                     int has_mask)
{
    float16 v = LD16_A(x, j) * sc;
    if (has_mask) {
        const float16 mv = LD16_MASK(mk, j);
        v = select(v + mv, (float16)(NEG_INF), mv == (float16)(NEG_INF));
    }
    return v;
}

/* Column j alone (any j < cols), -inf when hidden. */
inline float col1(__global const T_A *x, __global const T_MASK *mk, int j, int cend, float sc,
                  int has_mask)
{
    if (j >= cend)
        return NEG_INF;
    const float mv = has_mask ? LD_MASK(mk, j) : 0.0f;
    return mv == NEG_INF ? NEG_INF : LD_A(x, j) * sc + mv;
}

#if !KSEL || K_softmax_rows
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
softmax_rows(__global const T_A *X, ulong x_off, ulong x_sb, ulong x_sh, ulong x_ss,
             __global T_OUT *Y, ulong y_off, ulong y_sb, ulong y_sh, ulong y_ss,
             __global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh, ulong m_ss,
             __global float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,
             __global const int *kvlen, int rows, int cols, int heads, int causal, int has_mask,
             int has_lse, float scale, __global const float *SK, ulong sk_off, ulong sk_sh)
{
    const float sink = SK ? SK[sk_off + (ulong)(GROUP_ID(1) % heads) * sk_sh] : NEG_INF; /* as in softmax */
    const int z = GROUP_ID(1);
    const int b = z / heads, h = z % heads;
    const int L = keys_of_batch(kvlen, b, cols);
    const float sc = scale;
    const int i0 = get_group_id(0) * ROWS;
    for (int i = i0; i < min(rows, i0 + ROWS); i++) {
        const int cend = max(0, causal_end(causal, i, rows, L));
        const int vend = cend & ~15; /* columns below vend come in whole visible chunks */
        __global const T_A *x = X + x_off + (ulong)b * x_sb + (ulong)h * x_sh + (ulong)i * x_ss;
        __global T_OUT *y = Y + y_off + (ulong)b * y_sb + (ulong)h * y_sh + (ulong)i * y_ss;
        __global const T_MASK *mk = mask + m_off + (ulong)b * m_sb + (ulong)h * m_sh + (ulong)i * m_ss;

        /* Four running maxima side by side: one was a chain of dependent compares and blends
         * (about 6 cycles a vector). MAX_SKIP_NAN keeps the maximum of the non-NaN values (the
         * running maxima start at -inf and never become NaN), as fmax does, in 2 instructions. */
        float16 mq[4] = {(float16)(NEG_INF), (float16)(NEG_INF), (float16)(NEG_INF), (float16)(NEG_INF)};
        int j4 = 0;
        for (; j4 + 48 < vend; j4 += 64)
#pragma unroll
            for (int u = 0; u < 4; u++)
                mq[u] = MAX_SKIP_NAN(mq[u], row16(x, mk, j4 + 16 * u, sc, has_mask));
        for (int u = 0; j4 < vend; j4 += 16, u++)
            mq[u] = MAX_SKIP_NAN(mq[u], row16(x, mk, j4, sc, has_mask));
        const float16 m16 = fmax(fmax(mq[0], mq[1]), fmax(mq[2], mq[3]));
        float8 m8 = fmax(m16.lo, m16.hi);
        float4 m4 = fmax(m8.lo, m8.hi);
        float M = fmax(fmax(m4.s0, m4.s1), fmax(m4.s2, m4.s3));
        for (int j = vend; j < cend; j++)
            M = fmax(M, col1(x, mk, j, cend, sc, has_mask));
        const float Mrow = M;
        M = fmax(M, sink);
        /* As above: a row with nothing visible uses 0 as reference and outputs zeros. */
        const float ref = M == NEG_INF ? 0.0f : M;

        /* f32 output: the second pass keeps exp2(v - ref) in y (hidden entries as -0, so that
         * they still give exactly 0 in a NaN row, where visible underflowed entries give NaN as
         * 0·NaN) and the third only scales y. In place is fine: x[j] is read before y[j] is
         * written. f16/bf16 output recomputes the exponential rather than round twice. */
        float16 s16 = (float16)(0.0f);
        for (int j = 0; j < vend; j += 16) {
            const float16 v = row16(x, mk, j, sc, has_mask);
            const float16 e = exp2p16((v - ref) * LOG2E);
            s16 += e;
#if DT_OUT == 0
            ST16_OUT(y, j, select(e, (float16)(HIDDEN_P), v == (float16)(NEG_INF)));
#endif
        }
        float8 s8 = s16.lo + s16.hi;
        float4 s4 = s8.lo + s8.hi;
        float S = (s4.s0 + s4.s1) + (s4.s2 + s4.s3);
        for (int j = vend; j < cend; j++)
            S += exp2p((col1(x, mk, j, cend, sc, has_mask) - ref) * LOG2E);
        const int empty = Mrow == NEG_INF && S == 0.0f; /* as above: LSE s */
        if (sink != NEG_INF)
            S += exp2p((sink - ref) * LOG2E);
        const float inv = S == 0.0f ? 0.0f : 1.0f / S;

        for (int j = 0; j < vend; j += 16) {
#if DT_OUT == 0
            const float16 e = LD16_OUT(y, j);
            ST16_OUT(y, j, select(e * inv, (float16)(HIDDEN_P), as_int16(e) == (int16)(INT_MIN)));
#else
            const float16 v = row16(x, mk, j, sc, has_mask);
            ST16_OUT(y, j, select(exp2p16((v - ref) * LOG2E) * inv, (float16)(HIDDEN_P), v == (float16)(NEG_INF)));
#endif
        }
        for (int j = vend; j < cols;) {
            if (j >= cend && j + 15 < cols) { /* hidden columns (causal, key lengths) */
                ST16_OUT(y, j, (float16)(HIDDEN_P));
                j += 16;
                continue;
            }
            const float v = col1(x, mk, j, cend, sc, has_mask);
            ST_OUT(y, j, v == NEG_INF ? HIDDEN_P : exp2p((v - ref) * LOG2E) * inv);
            j++;
        }
        if (has_lse)
            LSE[l_off + (ulong)b * l_sb + (ulong)h * l_sh + (ulong)i * l_ss] =
                empty ? sink : S == 0.0f ? NEG_INF : ref + log(S);
    }
}
#endif
#endif
