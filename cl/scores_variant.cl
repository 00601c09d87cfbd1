/* The attention variants on a scores matrix (the unfused path and clattn_scores; the fused
 * kernels apply the same rules, attn_common.cl, as they go): S holds scale·q·k for every (row,
 * key), computed without masks; Y gets the logits, -inf where the key is hidden (key lengths,
 * causal, window, chunk, mask_mod, a -inf mask), else the softcap, score_mod, the mask and ALiBi
 * (var_key). One work-group of WG work-items a row, the keys strided across them; rows =
 * batch·heads·seq_q in y and z as in merge.cl (row = y + ny·z). In place is fine: each element is
 * read, then written, by one work-item. */

#ifndef WG
#define WG 64
#endif

#if !KSEL || K_scores_variant
__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
scores_variant(__global const float *S, ulong s_off, ulong s_sb, ulong s_sh, ulong s_ss,
               __global T_OUT *Y, ulong y_off, ulong y_sb, ulong y_sh, ulong y_ss,
               __global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh, ulong m_ss,
               __global const int *kvlen, int rows, int ny, int heads, int seq_q, int seq_kv, int causal,
               int has_mask VARIANT_ARGS)
{
    const vparams vp = VP_MAKE;
    const long grow = (long)get_global_id(1) + (long)ny * (long)get_global_id(2);
    if (grow >= rows)
        return;
    const int row = (int)grow;
    const int i = row % seq_q, bh = row / seq_q, h = bh % heads, b = bh / heads;
    const int L = keys_of_batch(kvlen, b, seq_kv);
    vrow r;
    const int end = row_span(causal, i, seq_q, L, b, h, &vp, &r);
    const ulong srow = s_off + (ulong)b * s_sb + (ulong)h * s_sh + (ulong)i * s_ss;
    const ulong yrow = y_off + (ulong)b * y_sb + (ulong)h * y_sh + (ulong)i * y_ss;
    const ulong mrow = m_off + (ulong)b * m_sb + (ulong)h * m_sh + (ulong)i * m_ss;
    for (int j = get_local_id(0); j < seq_kv; j += WG)
        ST_OUT(Y, yrow + j, var_key(S[srow + j], j, end, &r, &vp, has_mask, mask, mrow));
}
#endif
