/* The mask pre-pass (MFLAGS; src/mask_pass.c, clattn__plan_mask_flags, says when): a mask that
 * heads, batches or rows share is read once, by mask_flags, into one byte per mask row and 16-key chunk
 * (1: every key of the chunk is -inf); mask_spans then finds each flag row's span (its first and
 * one past its last chunk with a visible key), and mask_union each kv head's hull of its query
 * rows' spans. The attention kernels read the flags and spans (attn_common.cl: MFLAG_ARGS,
 * NARROW_KEYS, HIDES_BLOCK), fused_direct's K and V copies (transpose_k in layout.cl, pack_v in
 * fused_direct.cl) the hulls. Built once per mask dtype (DT_MASK, K_mask), whatever the
 * attention kernel they serve. */
/* One work-item per 16-key chunk (x), mask row (y) and mask slice (z = b·nh + h, b < nb, h <
 * nh: the batches and heads the mask does not broadcast over): flag byte
 * f_off + (z·rows + y)·nchunks + x is 1 when every key of the chunk below seq_kv is -inf. */
#if !KSEL || K_mask
__kernel void mask_flags(__global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh,
                         ulong m_ss, int nh, int rows, int nchunks, int seq_kv,
                         __global uchar *flags, ulong f_off)
{
    const int c = get_global_id(0), y = get_global_id(1), z = get_global_id(2);
    if (c >= nchunks || y >= rows)
        return;
    const ulong mr = m_off + (ulong)(z / nh) * m_sb + (ulong)(z % nh) * m_sh + (ulong)y * m_ss;
    const int k0 = 16 * c;
    int hidden;
    if (k0 + 16 <= seq_kv) {
        hidden = all(LD16_MASK(mask, mr + k0) == (float16)(NEG_INF));
    } else {
        hidden = 1;
        for (int key = k0; key < seq_kv; key++)
            hidden &= LD_MASK(mask, mr + key) == NEG_INF;
    }
    flags[f_off + ((ulong)z * rows + y) * nchunks + c] = (uchar)hidden;
}
#endif

/* The work-group's hull of its work-items' [lo, hi) (lo the least, hi the greatest) at dst[0]
 * and dst[1], written by work-item 0; lo_s and hi_s hold one int per work-item (mask_spans and
 * mask_union, at most 64 work-items). Every work-item of the group calls it (a barrier). */
inline void store_hull(int lo, int hi, __local int *lo_s, __local int *hi_s, __global int *dst)
{
    const int lid = get_local_id(0), n = get_local_size(0);
    lo_s[lid] = lo;
    hi_s[lid] = hi;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid == 0) {
        for (int i = 1; i < n; i++) {
            lo = min(lo, lo_s[i]);
            hi = max(hi, hi_s[i]);
        }
        dst[0] = lo;
        dst[1] = hi;
    }
}

/* One work-group per row of flags (row y = get_global_id(1) of them all, slice by slice): the
 * row's span, its first 16-key chunk that is not all -inf and one past its last, at spans[s_off +
 * 2y] and [s_off + 2y + 1]; nchunks and 0 when every chunk is hidden. The kernels narrow their key
 * range to their rows' spans (NARROW_KEYS), so the blocks before a sliding window or after a
 * row's last visible key cost nothing, not even a test of their flags. The work-items take
 * neighbouring bytes; at most 64 of them. */
#if !KSEL || K_mask
__kernel void mask_spans(__global const uchar *flags, ulong f_off, int nchunks, __global int *spans,
                         ulong s_off)
{
    __local int lo_s[64], hi_s[64];
    const int lid = get_local_id(0), n = get_local_size(0);
    const ulong y = get_global_id(1);
    __global const uchar *f = flags + f_off + y * (ulong)nchunks;
    int lo = nchunks, hi = 0;
    for (int c = lid; c < nchunks; c += n)
        if (!f[c]) {
            lo = min(lo, c);
            hi = c + 1;
        }
    store_hull(lo, hi, lo_s, hi_s, spans + s_off + 2 * y);
}
#endif

/* One work-group per kv head z = b·heads_kv + hk (get_global_id(1)): the hull of the spans of
 * its query rows' flag rows (heads hk·group + j, positions 0..seq_q-1; flag row b·rb + hq·rh +
 * pos·rs, strides in rows, 0 where the mask broadcasts), written as [first chunk, one past the
 * last) at spans[u_off + 2z]; nchunks and 0 when every row hides every key. fused_direct's K and
 * V copies (transpose_k in layout.cl, pack_v in fused_direct.cl) then write only the panels that
 * meet it: with a window over a long key cache (seq_q < seq_kv) most keys are seen by no row. The
 * work-items take rows in turn; at most 64 of them. */
#if !KSEL || K_mask
__kernel void mask_union(__global int *spans, ulong s_off, ulong u_off, ulong rb, ulong rh, ulong rs,
                         int heads_kv, int group, int seq_q, int nchunks)
{
    __local int lo_s[64], hi_s[64];
    const int lid = get_local_id(0), n = get_local_size(0);
    const int z = get_global_id(1), b = z / heads_kv, hk = z % heads_kv;
    const int nhq = rh ? group : 1, npos = rs ? seq_q : 1;
    int lo = nchunks, hi = 0;
    for (int i = lid; i < nhq * npos; i += n) {
        const ulong row = (ulong)b * rb + (ulong)(hk * group + i / npos) * rh + (ulong)(i % npos) * rs;
        lo = min(lo, spans[s_off + 2 * row]);
        hi = max(hi, spans[s_off + 2 * row + 1]);
    }
    store_hull(lo, hi, lo_s, hi_s, spans + u_off + 2 * (ulong)z);
}
#endif
