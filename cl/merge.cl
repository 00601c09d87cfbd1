/* Merging partial attention results over disjoint key ranges:
 *   lse = log Σ_p exp(lse_p),  out = Σ_p exp(lse_p - lse) · out_p
 * A part with lse = -inf (no visible key) contributes nothing; all -inf gives 0 and -inf. NaN
 * in any other part's lse, or lse = +inf (no finite weight: exp(inf - inf)), makes the row NaN;
 * NaN in its out, the elements of those columns.
 *
 * merge_strided: the parts lie in one f32 buffer at a fixed stride (flash-decoding splits). With
 *                attention sinks (SK not NULL: query head h's at SK[sk_off + h·sk_sh]) the sink
 *                is one more part, of lse s_h and output 0: it joins the denominator once,
 *                however many splits there are (docs/variants.md). CU (not NULL): the output is
 *                packed by cu_seqlens_q (docs/kvcache.md#varlen).
 * merge_pair:    folds one more part (any storage type) into an accumulator; clattn_merge chains
 *                it over the caller's parts, which may live in separate buffers. The accumulator
 *                keeps its row maximum m and weight sum s = Σ exp(lse_p - m) apart, not an LSE
 *                m + log s: from |lse| = 2^24 on, m + log 2 rounds back to m in fp32, and chained
 *                LSEs would weigh equal parts 1/2, 1/4, 1/8, ...
 * One work-item per (row, CPW columns); grid x = ceil(DV / CPW / WG)·WG, rows = batch·heads·seq in y and z
 * (row = y + ny·z, ny = min(rows, 32768)): some drivers (CUDA-based ones) cap a grid dimension
 * other than x at 65535 work-groups, and clattn__enqueue splits a longer z into chunks. */

#ifndef WG
#define WG 64
#endif
/* Columns a work-item merges: 1 (a work-item per row and column), or a whole row with WG 1 (CPUs'
 * default, src/merge.c), where the weights' exponentials are then taken once a row and part, and
 * one work-group a row replaces DV / WG of them. */
#ifndef CPW
#define CPW 1
#endif

#if !KSEL || K_merge_strided
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
merge_strided(__global const float *P, ulong p_off, ulong p_sb, ulong p_sh, ulong p_ss,
              __global const float *PL, ulong pl_off, ulong pl_sb, ulong pl_sh, ulong pl_ss,
              __global T_OUT *O, ulong o_off, ulong o_sb, ulong o_sh, ulong o_ss,
              __global float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,
              ulong p_split, ulong pl_split, int parts, int rows, int ny, int heads, int seq,
              int DV, int has_lse, __global const float *SK, ulong sk_off, ulong sk_sh,
              __global const int *CU, int total)
{
    const int c0 = get_global_id(0) * CPW; /* this work-item's columns: c0 .. c0 + CPW - 1 */
    const long grow = (long)get_global_id(1) + (long)ny * (long)get_global_id(2);
    if (grow >= rows)
        return;
    const int row = (int)grow;
    const int i = row % seq, bh = row / seq, h = bh % heads, b = bh / heads;
    /* Packed output (CU: cu_seqlens_q of the attention, total its rows): row i of batch b goes to
     * row CU[b] + i, rows past the sequence nowhere (their parts were never written). */
    int oi = i;
    if (CU) {
        const int2 sq = packed_seq(CU, b, seq, total);
        if (i >= sq.y)
            return;
        oi = sq.x + i;
    }
    const ulong lrow = pl_off + (ulong)b * pl_sb + (ulong)h * pl_sh + (ulong)i * pl_ss;
    const ulong prow = p_off + (ulong)b * p_sb + (ulong)h * p_sh + (ulong)i * p_ss;

    /* fmax skips NaN, so a NaN part is tracked on its own: it makes the row NaN. */
    float mx = NEG_INF;
    int nan_part = 0;
    for (int p = 0; p < parts; p++) {
        const float lp = PL[lrow + p * pl_split];
        mx = fmax(mx, lp);
        nan_part |= isnan(lp);
    }
    const float sink = SK ? SK[sk_off + (ulong)h * sk_sh] : NEG_INF;
    /* A row no part saw gives 0 and the sink's LSE, whatever the sink holds; in the others a sink
     * of +inf or NaN (no logit) makes the row NaN (docs/variants.md). */
    const int empty = !nan_part && mx == NEG_INF;
    nan_part |= !empty && (isnan(sink) || sink == INFINITY);
    mx = fmax(mx, sink);
    /* Up to thousands of parts (long key ranges): both sums are compensated (Kahan), so that
     * equal parts, whose rounding errors would all have the same sign, stay at fp32 accuracy. */
    float sum = 0.0f, sum_c = 0.0f, acc[CPW], acc_c[CPW];
    for (int e = 0; e < CPW; e++)
        acc[e] = acc_c[e] = 0.0f;
    if (nan_part) {
        mx = sum = NAN;
        for (int e = 0; e < CPW; e++)
            acc[e] = NAN;
    } else if (!empty) {
        for (int p = 0; p < parts; p++) {
            const float lp = PL[lrow + p * pl_split];
            if (lp != NEG_INF) {
                const float y = exp(lp - mx) - sum_c, t = sum + y;
                sum_c = (t - sum) - y;
                sum = t;
            }
        }
        if (sink != NEG_INF) {
            const float y = exp(sink - mx) - sum_c;
            sum += y;
        }
        /* Normalised weights: out is a convex combination of the parts, summed at half scale
         * (O_WEIGHT, o_from_half at the store) so that parts at ±FLT_MAX cannot overflow. */
        const float inv = O_WEIGHT / sum;
        for (int p = 0; p < parts && c0 < DV; p++) {
            const float lp = PL[lrow + p * pl_split];
            if (lp != NEG_INF) {
                const float wp = exp(lp - mx) * inv; /* once a part, for all the columns */
                for (int e = 0; e < CPW && c0 + e < DV; e++) {
                    const float y = wp * P[prow + p * p_split + c0 + e] - acc_c[e], t = acc[e] + y;
                    acc_c[e] = (t - acc[e]) - y;
                    acc[e] = t;
                }
            }
        }
    }
    for (int e = 0; e < CPW && c0 + e < DV; e++)
        ST_OUT(O, o_off + (ulong)b * o_sb + (ulong)h * o_sh + (ulong)oi * o_ss + c0 + e,
               empty ? 0.0f : o_from_half(acc[e]));
    if (has_lse && c0 == 0)
        LSE[l_off + (ulong)b * l_sb + (ulong)h * l_sh + (ulong)oi * l_ss] = empty ? sink : mx + log(sum);
}
#endif

#if defined(DT_A) && defined(DT_IN) /* merge_pair is built with its own storage types */
#if !KSEL || K_merge_pair
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
merge_pair(__global const T_A *X, ulong x_off, ulong x_sb, ulong x_sh, ulong x_ss,
           __global const float *XL, ulong xl_off, ulong xl_sb, ulong xl_sh, ulong xl_ss,
           __global const T_IN *Y, ulong y_off, ulong y_sb, ulong y_sh, ulong y_ss,
           __global const float *YL, ulong yl_off, ulong yl_sb, ulong yl_sh, ulong yl_ss,
           __global T_OUT *O, ulong o_off, ulong o_sb, ulong o_sh, ulong o_ss,
           __global float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,
           ulong xs_delta, ulong os_delta, int rows, int ny, int heads, int seq, int DV, int has_lse)
{
    /* xs_delta > 0: X is the accumulator, XL holds its m and XL[+xs_delta] its s; 0: X is a part,
     * XL its lse (s = 1). os_delta > 0: write m to LSE and s to LSE[+os_delta]; 0: the lse. */
    const int c0 = get_global_id(0) * CPW; /* this work-item's columns: c0 .. c0 + CPW - 1 */
    const long grow = (long)get_global_id(1) + (long)ny * (long)get_global_id(2);
    if (grow >= rows)
        return;
    const int row = (int)grow;
    const int i = row % seq, bh = row / seq, h = bh % heads, b = bh / heads;
    const ulong xl_at = xl_off + (ulong)b * xl_sb + (ulong)h * xl_sh + (ulong)i * xl_ss;
    const float lx = XL[xl_at], sx = xs_delta ? XL[xl_at + xs_delta] : 1.0f;
    const float ly = YL[yl_off + (ulong)b * yl_sb + (ulong)h * yl_sh + (ulong)i * yl_ss];
    float mx = fmax(lx, ly), wx = 0.0f, wy = 0.0f, sum = 0.0f;
    if (isnan(lx) || isnan(ly)) {
        mx = wx = wy = sum = NAN; /* fmax would skip the NaN part */
    } else if (mx != NEG_INF) {
        /* sx >= 1 (it counts the maximum's own exp(0)) and at most the number of parts */
        wx = lx == NEG_INF ? 0.0f : sx * exp(lx - mx);
        wy = ly == NEG_INF ? 0.0f : exp(ly - mx);
        sum = wx + wy;
        const float inv = O_WEIGHT / sum; /* half scale: o_from_half at the store */
        wx *= inv;
        wy *= inv;
    }
    /* O may be X (each element is read, then written, by one work-item); LSE must not be XL,
     * since column 0 would overwrite it while other work-groups of the row still read it. */
    const ulong xr = x_off + (ulong)b * x_sb + (ulong)h * x_sh + (ulong)i * x_ss,
                yr = y_off + (ulong)b * y_sb + (ulong)h * y_sh + (ulong)i * y_ss,
                orow = o_off + (ulong)b * o_sb + (ulong)h * o_sh + (ulong)i * o_ss;
    for (int c = c0; c < c0 + CPW && c < DV; c++) {
        float x = 0.0f;
        /* A part without keys (lse -inf) is skipped; any other is multiplied even when its
         * weight underflows, so NaN in it stays NaN (as in merge_strided). */
        if (lx != NEG_INF)
            x += wx * LD_A(X, xr + c);
        if (ly != NEG_INF)
            x += wy * LD_IN(Y, yr + c);
        ST_OUT(O, orow + c, o_from_half(x));
    }
    if (has_lse && c0 == 0) {
        const ulong l_at = l_off + (ulong)b * l_sb + (ulong)h * l_sh + (ulong)i * l_ss;
        if (os_delta) {
            LSE[l_at] = mx;
            LSE[l_at + os_delta] = sum;
        } else {
            LSE[l_at] = mx == NEG_INF ? NEG_INF : mx + log(sum);
        }
    }
}
#endif
#endif
