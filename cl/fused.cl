/* Flash-style fused attention: O = softmax(Q·Kᵀ·scale + mask)·V without materialising scores.
 *
 * Rows. The query rows of one kv head's group are packed: row r in [0, R), R = group·seq_q, is
 * query head hk·group + r / seq_q, position r % seq_q. A K/V tile loaded once thus serves every
 * query head reading it (GQA), and decode (seq_q = 1) still fills a tile with heads.
 * Grid: x = WGX, y = ceil(R / BM)·WGY, z = batch · heads_kv · splits.
 *
 * Keys. Work-group split s covers keys [s·split_len, (s+1)·split_len) ∩ [0, L) and stops at the
 * last key its bottom row may see (causal), so tiles past the diagonal are never loaded. With a
 * shared mask's flags (MFLAGS) the range narrows further to the keys its rows' mask rows leave
 * visible (NARROW_KEYS). With
 * splits > 1 each split writes a partial (O normalised by its own sum, LSE) into f32 scratch
 * and merge.cl combines them (flash-decoding).
 *
 * Work-item (tx, ty) owns rows ty·RM .. ty·RM+RM-1; of each BN-key tile the NS key blocks of VW
 * at VW·(tx + WGX·s); of O the NV column blocks of VW at VW·(tx + WGX·c). Interleaving keeps
 * neighbouring work-items on neighbouring local-memory words. Q and P are row-major in local
 * memory (read 4 columns at a time, their values broadcast), K is transposed (Ks[d][key]) and V
 * row-major so both are read as VW-wide vectors; V takes K's buffer once the scores are
 * computed. The scale multiplies the dot products (as in the unfused path), and the row maximum
 * is subtracted before the multiplication by log2(e) that exp2 needs, so any finite logit works.
 * O is kept normalised after every tile, o' = o·(l·α/l') + Σ (p/l')·v with the tile's row sums
 * reduced before P·V: a convex combination of V rows, kept at half scale (O_WEIGHT, common.cl)
 * so that rounding cannot take it past FLT_MAX whatever seq_kv and |V| are. */

#ifndef WGX
#define WGX 8 /* work-items across keys (S) and across head_dim_v (O) */
#endif
#ifndef WGY
#define WGY 8 /* work-items across query rows */
#endif
#ifndef RM
#define RM 4 /* query rows per work-item */
#endif
#ifndef VW
#define VW 4 /* vector width of key and O column blocks: 4, 8 or 16 */
#endif
#ifndef NS
#define NS 1 /* key blocks per work-item: BN = WGX·VW·NS keys per tile */
#endif
#ifndef NV
#define NV 2 /* O column blocks per work-item: WGX·VW·NV >= head_dim_v */
#endif
#ifndef DP
#define DP 64 /* head_dim rounded up to a multiple of 4 */
#endif

#define BM (WGY * RM)
#define BN (WGX * VW * NS)
#define DVP (WGX * VW * NV)
#define NWI (WGX * WGY)
#define KV_FLOATS (DP * BN > BN * DVP ? DP * BN : BN * DVP)
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatV CAT(float, VW)
#define vloadV CAT(vload, VW)
#define vstoreV CAT(vstore, VW)
#if EXP2_POLY /* set for CPUs, where the built-in exp2 on wide vectors becomes per-lane calls */
#define exp2V CAT(exp2p, VW)
#else
#define exp2V exp2
#endif

/* Scores s with the mask values mv added, -inf where `hidden` (keys past a row's end) or where the
 * mask is -inf: a -inf mask hides the key even when its score is NaN. */
inline float16 add_mask16(float16 s, float16 mv, int16 hidden)
{
    return select(s + mv, (float16)(NEG_INF), hidden | (mv == (float16)(NEG_INF)));
}

/* Scores t[0..n) of one row for the keys key0..key0+n-1: -inf at or past rend (causal, key
 * lengths, the split's end), the mask (row offset mrow) added otherwise. A -inf mask hides the
 * key even when its score is NaN. */
inline void hide_keys(float *t, int n, int key0, int rend, int has_mask, __global const T_MASK *mask,
                      ulong mrow)
{
    /* Without a mask, keys below rend are visible. That case has a loop of its own: in one loop
     * with the mask's, PoCL vectorised the mask loads as masked AVX-512 loads, which with no
     * mask (a NULL buffer) spent the time of a cache miss or more each (most likely a microcode
     * assist: fault suppression on an unmapped page). Measured on PoCL (2-core Intel Xeon,
     * AVX-512, B1 d64 causal f32 prefill, medians of 3 runs alternating, ms): H16 S512 2.77-2.80
     * against 3.16-3.22, H8 S1024 4.60-4.72 against 4.91-5.08. */
    if (!has_mask) {
        for (int e = clamp(rend - key0, 0, n); e < n; e++)
            t[e] = NEG_INF;
        return;
    }
    int e = 0;
#ifdef IN_PLACE
    /* The direct programs only (CPUs; the tiled kernel passes its VW keys in a private array,
     * and its programs leave this out): whole vectors below rend 16 keys at a time. PoCL made the
     * loop below 8-wide masked code, a large part of a sliding window's time (every block of
     * its row blocks is guarded). With fused_direct's P·V checked vector by vector (see there),
     * measured on PoCL (2-core Intel Xeon, AVX-512, B1 H8 S1024 d64 f32 causal, a
     * [1][1][Sq][Skv] f32 window:128 mask, minima of 60 calls, 3 runs alternating, ms): the P·V
     * change alone 2.61-2.62, with this loop too 2.50-2.58, the kernels before both 2.78-3.04. */
    for (const int ev = clamp(rend - key0, 0, n) / 16 * 16; e < ev; e += 16) {
        const float16 mv = LD16_MASK(mask, mrow + (ulong)(key0 + e));
        vstore16(add_mask16(vload16(0, t + e), mv, (int16)(0)), 0, t + e);
    }
#endif
    for (; e < n; e++) {
        const int key = key0 + e;
        if (key >= rend) {
            t[e] = NEG_INF;
        } else {
            const float mv = LD_MASK(mask, mrow + key);
            t[e] = mv == NEG_INF ? NEG_INF : t[e] + mv;
        }
    }
}

/* 1 when the additive mask hides every key of kt .. kt+n-1 that one of the `rows` rows may see
 * (keys before rend[i]; row i's mask row at mrow[i]): the block then adds nothing to any row
 * (every p is 0, the row maxima and sums stay), so the CPU kernels skip it, dot products
 * included: blocks outside a sliding window, padding. The scan stops at the first 16 keys not
 * all -inf, so a mask of finite values costs one vector load a block. Measured on PoCL (2-core
 * Intel Xeon, AVX-512, B1 H8 d64 f32, a [1][1][Sq][Skv] window mask, medians, runs alternating
 * with the kernels before): S1024 window 256 6.2-7.6 ms against 9.3-11.1, causal 4.6-6.7
 * (minima 4.5-4.7) against 5.6-5.7; Sq1024 Skv4096 window 64 12.6-14.5 against 34.2-34.8 (what
 * is left is mostly reading the 16 MB mask once per head); fused_lanes, decode B1 H32/8 Sq16
 * Skv8192 d128 window 1024, 2.9-6.0 against 59. A bias mask: even (9.8-9.9 against 9.9-10.4). */
inline int mask_hides_block(int rows, const int *rend, const ulong *mrow, int kt, int n,
                            __global const T_MASK *mask)
{
    for (int i = 0; i < rows; i++) {
        const int e = min(kt + n, rend[i]);
        int key = kt;
        for (; key + 16 <= e; key += 16)
            if (any(LD16_MASK(mask, mrow[i] + key) != (float16)(NEG_INF)))
                return 0;
        for (; key < e; key++)
            if (LD_MASK(mask, mrow[i] + key) != NEG_INF)
                return 0;
    }
    return 1;
}

/* Mask block flags (MFLAGS): the library reads a mask that heads, batches or rows share once, in
 * mask_flags below, into one byte per mask row and 16-key chunk (1: every key of the chunk is
 * -inf), and fused_direct, fused_lanes and the tiled fused kernel decide from those bytes which
 * blocks the mask hides. Without them each head scans the mask's hidden blocks again: the scan
 * of a 16 MB mask was most of the time of a sliding window over 4096 keys (see mask_hides_block;
 * src/fused.c, plan_mask_flags, says when the flags are used). Measured on PoCL (2-core Zen 4,
 * AVX-512, B1 H8 d64 f32, a [1][1][Sq][Skv] window mask, medians of 5-20 calls, runs alternating
 * with the kernels before, ms): Sq1024 Skv4096 window 64 5.8-6.5 against 8.7-9.4 (causal
 * 4.9-5.5 against 7.4-8.4); S1024 window 128 4.3-4.5 against 4.6-5.5; decode Sq1 Skv65536 window
 * 1024 0.11-0.17 against 0.21-0.22; a bias mask even within noise (S1024 12.8-13.6 against
 * 12.6-13.2).
 * A second pass (mask_spans) finds each row's span, its first and last chunk with a key it sees,
 * and each kernel narrows its key range to its rows' spans (NARROW_KEYS) before its loop: blocks
 * outside them cost nothing, not even their flags, and the first block starts at the first
 * visible chunk (rounded down to the copies' panel), not at a 256-key block edge, so a narrow
 * window's row block computes about half the keys it did. Measured as above, medians of 10, 3
 * runs alternating with the flags alone, ms: Sq1024 Skv4096 window 64 4.9-5.2 against 8.1-10.9
 * (causal 4.9-5.1 against 6.3-9.3); S1024 window 128 4.2-7.4 (minima 3.5-3.9) against 5.3-5.5,
 * causal window 256 4.9-7.8 (minima 4.6-5.2) against 5.4-7.5 (4.9-5.5); decode window 1024
 * 0.17-0.19 against 0.18-0.21; fused_lanes (H32/8 Sq16 Skv8192 d128) window 1024 2.4-4.0 against
 * 4.4-6.0; a bias mask even (minima of 20 in 6 runs 12.6-14.3 against 12.4-13.9).
 * fused_direct's K and V copies then write only the panels some row of their kv head sees (the
 * hull of its rows' spans, mask_union below): with a window over a longer key cache (seq_q <
 * seq_kv) most keys are seen by no row. Measured as above, 3-4 runs alternating, minima ms:
 * Sq1024 Skv4096 window 64 3.3-3.5 against 4.2-5.0 (causal 3.1-3.5 against 4.2-4.4); f16 Sq512
 * Skv16384 window 1024 9.3-11.9 against 13.3-19.0 in 9 rounds of 10 (one: 17.0 against
 * 14.3-15.8); S1024 window 128 and a bias mask even.
 * The flags are an extra argument list after the common ones: byte base f_off and strides f_sb,
 * f_sh, f_ss (0 where the mask broadcasts), chunk c of a row at its row offset + c; then the
 * spans, two ints a flag row from int s_off of the same buffer, and f_nch, the chunks a row. */
#if MFLAGS
#define MFLAG_ARGS                                                                                 \
    , __global const uchar *mflags, ulong f_off, ulong f_sb, ulong f_sh, ulong f_ss, ulong s_off, \
        int f_nch
#define MFLAG_ROW(b, hq, pos) (f_off + (ulong)(b) * f_sb + (ulong)(hq) * f_sh + (ulong)(pos) * f_ss)
/* The keys of a row block that some row of it may see, from the rows' spans (mask_spans below):
 * k_lo moves up by whole steps of `step` keys (a multiple of 16; fused_direct's panels of the Kᵀ
 * copy start at multiples of its chunk), to the step holding the first 16-key chunk some row
 * sees, and the first block starts there; k_hi comes down to the end of the last such chunk. No
 * such chunk: k_hi <= k_lo. A row's flags lie less than 2^28 bytes from f_off (MASK_FLAGS_MAX,
 * src/fused.c), so its index is a 32-bit division (a 64-bit one is a long routine on GPUs). */
#define NARROW_KEYS(first_row, end_row, step)                                                       \
    do {                                                                                           \
        int c_lo = f_nch, c_hi = 0;                                                                \
        __global const int *sp_ = (__global const int *)mflags + s_off;                            \
        for (int row_ = (first_row); row_ < (end_row); row_++) {                                   \
            const ulong f_ = MFLAG_ROW(b, hk * group + row_ / seq_q, row_ % seq_q);                \
            const ulong at_ = 2 * (ulong)((uint)(f_ - f_off) / (uint)f_nch);                       \
            c_lo = min(c_lo, sp_[at_]);                                                            \
            c_hi = max(c_hi, sp_[at_ + 1]);                                                        \
        }                                                                                          \
        k_hi = min(k_hi, 16 * c_hi);                                                               \
        if (16 * c_lo > k_lo)                                                                      \
            k_lo += (16 * c_lo - k_lo) / (step) * (step);                                          \
        k_all = min(k_all, k_hi);                                                                  \
    } while (0)
/* mask_hides_block from the flags: a chunk that straddles the block's or a row's edge counts as
 * hidden only when all 16 of its keys are, so this may keep a block the mask hides, never skip
 * one it does not. */
#define HIDES_BLOCK(rows, rend, mrow, frow, kt, n)                                                 \
    flags_hide_block(rows, rend, frow, kt, n, mflags)
inline int flags_hide_block(int rows, const int *rend, const ulong *frow, int kt, int n,
                            __global const uchar *flags)
{
    for (int i = 0; i < rows; i++) {
        const int e = min(kt + n, rend[i]);
        for (int c = kt / 16; c * 16 < e; c++)
            if (!flags[frow[i] + (ulong)c])
                return 0;
    }
    return 1;
}
#else
#define MFLAG_ARGS
#define MFLAG_ROW(b, hq, pos) 0
#define NARROW_KEYS(first_row, end_row, step) ((void)0)
#define HIDES_BLOCK(rows, rend, mrow, frow, kt, n) mask_hides_block(rows, rend, mrow, kt, n, mask)
#endif

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
 * V copies (transpose_k in gemm.cl, pack_v) then write only the panels that meet it: with a
 * window over a long key cache (seq_q < seq_kv) most keys are seen by no row. The work-items take
 * rows in turn; at most 64 of them. */
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

#if !KSEL || K_fused
__kernel __attribute__((reqd_work_group_size(WGX, WGY, 1))) void
fused(ATTN_KERNEL_ARGS(T_IN) MFLAG_ARGS)
{
    /* Q and P are read 4 columns at a time (vload4): their rows are padded by 4 words, which
     * keeps every row 16-byte aligned (DP and BN are multiples of 4) so that the loads can be
     * 16-byte ones, and still shifts the banks from row to row (the work-items of a warp read RM
     * rows apart at the same column, which without a pad could all fall in one bank). The
     * arrays are 16-byte aligned for the same reason (vload4 itself asks only for 4). */
    __local float Qs[BM][DP + 4] __attribute__((aligned(16)));
    /* The tile's Kᵀ, then (after the barrier that ends the reads of K) its V: one buffer, so
     * that wide head dims keep big row tiles within 48 KiB and more work-groups fit a compute
     * unit. */
    __local float KVs[KV_FLOATS] __attribute__((aligned(16)));
#define Ks(d, n) KVs[(d) * BN + (n)]
#define Vs(n, c) KVs[(n) * DVP + (c)]
    __local float Ps[BM][BN + 4] __attribute__((aligned(16)));
    __local float red[BM][WGX + 1];  /* row maxima of each work-item's keys */
    __local float rsum[BM][WGX + 1]; /* row sums of each work-item's p */
    __local int seen_kt[2]; /* with a mask: the last even and odd tile in which a row sees a key */

    const int tx = get_local_id(0), ty = get_local_id(1);
    const int lid = ty * WGX + tx;
    const int R = group * seq_q;
    const int r0 = GROUP_ID(1) * BM;
    const work_range w = work_range_of(GROUP_ID(2), splits, split_len, heads_kv, seq_q, seq_kv,
                                       causal, kvlen, r0, min(R, r0 + BM) - 1);
    const int split = w.split, b = w.b, hk = w.hk, L = w.L;
    int k_lo = w.k_lo, k_hi = w.k_hi, k_all = w.k_all;
    /* Every work-item reads every row's span: the range stays the work-group's. */
    NARROW_KEYS(r0, min(R, r0 + BM), 16);

    __global const T_IN *Kb = K + k_off + (ulong)b * k_sb + (ulong)hk * k_sh;
    __global const T_IN *Vb = V + v_off + (ulong)b * v_sb + (ulong)hk * v_sh;

    /* Stage Q once. */
    stage_q_rows(&Qs[0][0], DP + 4, BM, DP, lid, NWI, Q + q_off + (ulong)b * q_sb, q_sh, q_ss, hk,
                 group, seq_q, R, r0, D);

    /* Per-row state of this work-item's rows: running max m and sum l of e^(s - m);
     * o is kept normalised (a convex combination of V rows, at half scale: it cannot overflow). */
    float m[RM], l[RM], keep[RM];
    int rend[RM]; /* one past the last key the row may see */
    ulong mrow[RM];
    floatV o[RM][NV];
    for (int i = 0; i < RM; i++) {
        const int row = r0 + ty * RM + i;
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        m[i] = NEG_INF;
        l[i] = 0.0f;
        rend[i] = row < R ? min(k_hi, causal_end(causal, pos, seq_q, L)) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
        for (int c = 0; c < NV; c++)
            o[i][c] = (floatV)(0.0f);
    }

    if (has_mask) {
        if (lid < 2)
            seen_kt[lid] = k_lo - 1; /* no tile's */
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int kt = k_lo; kt < k_hi; kt += BN) {
        /* A tile is guarded when some row hides some key in it: hidden entries get -inf, their
         * probabilities -0, and P·V skips those so NaN/Inf in hidden K/V rows cannot leak. */
        const int guarded = has_mask || kt + BN > k_all;

        /* Neighbouring work-items take neighbouring keys, so that the transposing stores go to
         * neighbouring banks (along d they would all hit one bank). */
        for (int e = lid; e < BN * (DP / 4); e += NWI) {
            const int n = e % BN, d = 4 * (e / BN);
            const int key = kt + n;
            const float4 x = key < k_hi ? row_load4(Kb + (ulong)key * k_ss, d, D) : (float4)(0.0f);
            Ks(d, n) = x.s0;
            Ks(d + 1, n) = x.s1;
            Ks(d + 2, n) = x.s2;
            Ks(d + 3, n) = x.s3;
        }
        /* With a mask, the work-items look for a (row, key) of the tile that the mask leaves
         * visible, neighbours at neighbouring keys, each stopping at its first; a tile the mask
         * hides from every row (outside a sliding window, padding) adds nothing to any row (every p
         * is 0, the maxima and sums stay), so it is skipped after the barrier: scores, V and P·V.
         * A seen tile writes its first key to the flag of its parity, so no flag needs clearing
         * and none is written while it is read: tile t's flag is read after the barrier below,
         * and the next write to it (tile t + 2's) comes after the same barrier of tile t + 1,
         * which every work-item reaches after its read. The choice is the work-group's. Measured
         * on PoCL (this kernel forced, 2-core Intel Xeon, f32, medians, ms): B1 H8 S1024 d64
         * window 256 59 against 168, bias mask even (160-174 against 166-167); decode B1 H32/8
         * Sq16 Skv8192 d128 window 1024 32-35 against 130-132. On an H200 it did not pay (window
         * 512 slower than no mask; README, Performance). With a mask that heads or batches share
         * (MFLAGS) the work-items test the mask's flags instead, a byte per row and 16 keys: on
         * PoCL (2-core Zen 4) window 256 44 against 53 ms; not yet measured on a GPU. There the
         * tiles before and after the rows' spans are not visited at all (NARROW_KEYS above), so
         * none of their K tiles is loaded. */
        const int par = ((kt - k_lo) / BN) & 1;
#if MFLAGS
        /* From the mask's flags (one byte a row and 16 keys): the chunks of the tile's keys that
         * each row may see (before its causal end and k_hi), a work-item a chunk. */
        {
            const int c0 = kt / 16, nch = (min(kt + BN, k_hi) - 1) / 16 - c0 + 1;
            for (int e = lid; e < BM * nch; e += NWI) {
                const int row = r0 + e / nch, c = c0 + e % nch;
                if (row >= R)
                    continue;
                const int pos = row % seq_q, hq = hk * group + row / seq_q;
                const int end = min(min(kt + BN, k_hi), causal_end(causal, pos, seq_q, L));
                if (max(16 * c, kt) < end && !mflags[MFLAG_ROW(b, hq, pos) + (ulong)c]) {
                    seen_kt[par] = kt;
                    break;
                }
            }
        }
#else
        if (has_mask) {
            for (int e = lid; e < BM * BN; e += NWI) {
                const int row = r0 + e / BN, key = kt + e % BN;
                if (row >= R || key >= k_hi)
                    continue;
                const int pos = row % seq_q, hq = hk * group + row / seq_q;
                const ulong mr = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
                if (key < causal_end(causal, pos, seq_q, L) && LD_MASK(mask, mr + key) != NEG_INF) {
                    seen_kt[par] = kt;
                    break;
                }
            }
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
        if (has_mask && seen_kt[par] != kt)
            continue;

        floatV s[RM][NS];
        for (int i = 0; i < RM; i++)
            for (int j = 0; j < NS; j++)
                s[i][j] = (floatV)(0.0f);
        /* Four d at a time: one 16-byte load of Q per row (local-memory load instructions, not
         * FMAs, bound this loop), then d, d+1, d+2, d+3 in order as one d at a time would. */
        for (int d = 0; d < DP; d += 4) {
            float qv[RM][4];
            for (int i = 0; i < RM; i++)
                vstore4(vload4(0, &Qs[ty * RM + i][d]), 0, qv[i]);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                floatV kv[NS];
                for (int j = 0; j < NS; j++)
                    kv[j] = vloadV(0, &Ks(d + e, VW * (tx + WGX * j)));
                for (int i = 0; i < RM; i++)
                    for (int j = 0; j < NS; j++)
                        s[i][j] = MAD((floatV)(qv[i][e]), kv[j], s[i][j]);
            }
        }

        for (int i = 0; i < RM; i++)
            for (int j = 0; j < NS; j++)
                s[i][j] *= scale;

        if (guarded) {
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < NS; j++) {
                    float t[VW];
                    vstoreV(s[i][j], 0, t);
                    hide_keys(t, VW, kt + VW * (tx + WGX * j), rend[i], has_mask, mask, mrow[i]);
                    s[i][j] = vloadV(0, t);
                }
        }

        for (int i = 0; i < RM; i++) {
            floatV mx = s[i][0];
            for (int j = 1; j < NS; j++)
                mx = fmax(mx, s[i][j]);
            float t[VW];
            vstoreV(mx, 0, t);
            float r = t[0];
            for (int e = 1; e < VW; e++)
                r = fmax(r, t[e]);
            red[ty * RM + i][tx] = r;
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* every read of K is done: V may take its place */

        for (int e = lid; e < BN * (DVP / 4); e += NWI) {
            const int n = e / (DVP / 4), c = 4 * (e % (DVP / 4));
            const int key = kt + n;
            const float4 x = key < k_hi ? row_load4(Vb + (ulong)key * v_ss, c, DV) : (float4)(0.0f);
            vstore4(x, 0, &Vs(n, c));
        }

        for (int i = 0; i < RM; i++) {
            float mt = red[ty * RM + i][0];
            for (int t = 1; t < WGX; t++)
                mt = fmax(mt, red[ty * RM + i][t]);
            const float mnew = fmax(m[i], mt);
            /* A row that has seen only -inf keeps a 0 reference so exp2 never sees -inf - -inf. */
            const float mref = mnew == NEG_INF ? 0.0f : mnew;
            keep[i] = exp2((m[i] - mref) * LOG2E); /* alpha, the old sum's rescaling */
            m[i] = mnew;
            floatV ps = (floatV)(0.0f);
            for (int j = 0; j < NS; j++) {
                floatV pj = exp2V((s[i][j] - mref) * LOG2E);
                if (guarded) /* hidden keys: -0, which P·V skips */
                    pj = select(pj, (floatV)(HIDDEN_P), s[i][j] == (floatV)(NEG_INF));
                ps += pj;
                vstoreV(pj, 0, &Ps[ty * RM + i][VW * (tx + WGX * j)]);
            }
            float t[VW];
            vstoreV(ps, 0, t);
            float r = t[0];
            for (int e = 1; e < VW; e++)
                r += t[e];
            rsum[ty * RM + i][tx] = r;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        /* New sum l' = l·alpha + Σ p; o' = o·(l·alpha/l') + Σ (p/l')·v, o at half scale (the
         * weights times O_WEIGHT, o_from_half4 at the store). l' is 0 while the row has seen no
         * key (o stays 0) and NaN once a score was NaN. */
        float inv[RM];
        for (int i = 0; i < RM; i++) {
            float ts = rsum[ty * RM + i][0];
            for (int t = 1; t < WGX; t++)
                ts += rsum[ty * RM + i][t];
            const float lnew = l[i] * keep[i] + ts;
            inv[i] = lnew > 0.0f ? 1.0f / lnew : 0.0f;
            keep[i] = isnan(lnew) ? lnew : l[i] * keep[i] * inv[i];
            inv[i] *= O_WEIGHT; /* the weights of P·V below: o at half scale */
            l[i] = lnew;
            for (int c = 0; c < NV; c++)
                o[i][c] *= keep[i];
        }

        /* P·V four keys at a time: one 16-byte load of P per row, then keys n..n+3 in order.
         * Guarded tiles skip each hidden key (p -0) so that NaN/Inf in their V never reaches O
         * (0·Inf = NaN); they stop at the tile's last key rounded up to 4, the keys past it
         * hidden (s = -inf) with zero V rows. */
        if (guarded) {
            const int nkeys4 = (min(BN, k_hi - kt) + 3) & ~3;
            for (int n = 0; n < nkeys4; n += 4) {
                float p[RM][4];
                for (int i = 0; i < RM; i++)
                    vstore4(vload4(0, &Ps[ty * RM + i][n]) * inv[i], 0, p[i]);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    floatV vv[NV];
                    for (int c = 0; c < NV; c++)
                        vv[c] = vloadV(0, &Vs(n + e, VW * (tx + WGX * c)));
                    for (int i = 0; i < RM; i++) {
                        if (!IS_HIDDEN(p[i][e])) {
                            for (int c = 0; c < NV; c++)
                                o[i][c] = MAD((floatV)(p[i][e]), vv[c], o[i][c]);
                        }
                    }
                }
            }
        } else {
            for (int n = 0; n < BN; n += 4) {
                float p[RM][4];
                for (int i = 0; i < RM; i++)
                    vstore4(vload4(0, &Ps[ty * RM + i][n]) * inv[i], 0, p[i]);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    floatV vv[NV];
                    for (int c = 0; c < NV; c++)
                        vv[c] = vloadV(0, &Vs(n + e, VW * (tx + WGX * c)));
                    for (int i = 0; i < RM; i++)
                        for (int c = 0; c < NV; c++)
                            o[i][c] = MAD((floatV)(p[i][e]), vv[c], o[i][c]);
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* before the next tile overwrites KVs, Ps, red */
    }

    O += o_off + (ulong)split * o_split;
    LSE += l_off + (ulong)split * l_split;
    for (int i = 0; i < RM; i++) {
        const int row = r0 + ty * RM + i;
        if (row >= R)
            continue;
        const int hq = hk * group + row / seq_q, pos = row % seq_q;
        /* No visible key: output exactly 0 and LSE -inf. A row whose scores were all NaN also
         * keeps m = -inf (fmax skips NaN) but has l = NaN: it is NaN, not empty. */
        const int empty = m[i] == NEG_INF && !isnan(l[i]);
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)pos * o_ss;
        for (int c = 0; c < NV; c++) {
            float t[VW];
            vstoreV(empty ? (floatV)(0.0f) : o[i][c], 0, t);
            for (int q = 0; q < VW; q += 4)
                store4_row(orow, VW * (tx + WGX * c) + q, o_from_half4(vload4(0, t + q)), DV);
        }
        if (has_lse && tx == 0)
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)pos * l_ss] =
                empty ? NEG_INF : m[i] + log(l[i]);
    }
}
#endif
#undef Ks
#undef Vs

/* ---- CPUs: fused_direct (FUSED DIRECT 1, DECODE DIRECT 1) ----
 *
 * One work-item per block of RM packed rows (as above) and key split, no local memory, no
 * barrier: on a CPU a work-group's work-items run one after another, so local tiles and barriers
 * only add copies and spills. Prefill reads keys from a Kᵀ copy (transpose_k16 in gemm.cl, f32)
 * as float16 vectors of 16 consecutive keys, V from a zero-padded f32 copy (pack_v) as float16
 * vectors of 16 columns; the copies cost O(seq_kv) and stay hot in cache while every row block of
 * the head streams them. Both are stored in panels, so that each loop over them reads one
 * sequential stream: Kᵀ in panels of BN keys, Kt[z][n / BN][d][n % BN] (k_ss = BN), which a
 * chunk's scores read as one block of head_dim·BN floats, where rows of Kᵀ took one cache line
 * of head_dim lines a page apart; V in panels of 16 columns (pack_v), which a P·V column tile
 * reads key by key. Measured on PoCL (2-core AMD EPYC, AVX2, B1 H8 f32, minima and medians of
 * 4-6 runs alternating, ms, panels against rows of Kᵀ and V in place): S1024 d64 15.8 / 18.4
 * against 15.7 / 16.7 (even), d128 28.0 / 28.8 against 33.8 / 35.7, d256 (H4) 27.2 / 29.3
 * against 33.6 / 34.9, seq_q 1024 seq_kv 4096 d64 60 / 70 against 67 / 75. Decode, and prefill
 * with few rows per kv head or long K and V (src/fused.c), read K and V in place instead
 * (IN_PLACE below; 11 or more such rows go to fused_lanes, further down). Keys go in chunks of
 * DBN = 16·NS through registers (S[RM][NS] float16 accumulators) into a block of NB keys (below),
 * whose p = e^(s - m) (exp2p16) are then read back as broadcast scalars for O += P·V. Where O has
 * more vectors than the registers (RM·DV16 > NREG16, common.cl; with AVX-512 32: head_dim_v
 * 256, or many packed rows in place), P·V goes in register tiles of O (PV_TILE), and in place,
 * blocks of 8 or more packed rows (a multiple of 4; with AVX2 2 or more, even) compute their
 * scores in register tiles too (QK_TILE). Measured on PoCL (2-core Zen 4, AVX-512,
 * medians of 8 runs alternating with the untiled kernel; single runs vary by 30%): B1 H4 S1024
 * d256 causal prefill 1.36x faster, decode at seq_kv 32768 with GQA 16:1 d256 1.1-1.5x and GQA
 * 8:1 d128 1.1-1.2x.
 *
 * Numerics: the scale and mask are applied in natural units and the maximum is subtracted before
 * the multiplication by log2(e), so any finite logit works (no overflow near FLT_MAX). O is kept
 * normalised after every block, o' = o·(l·α/l') + Σ (p/l')·v, a convex combination of V rows
 * at half scale (O_WEIGHT) that cannot overflow whatever seq_kv and |V| are. The reference m is
 * not always the running maximum: it moves only when a score passes it by more than REF_SLACK,
 * so most blocks skip the row maximum and the exponential of the rescaling; p <= 2^8 in between,
 * and the result is the same since the reference cancels. Hidden keys get s = -inf, p = -0, and
 * are skipped in P·V so NaN/Inf in their K/V never reach O; a visible key whose p underflows to
 * +0 is not skipped. */

/* Only the direct programs, whose options always define IN_PLACE (0 or 1), compile what follows:
 * the tiled programs (GPUs) leave it out, which saves a GPU compiler seconds per variant (and the
 * direct programs leave the tiled kernel out: KSEL, common.cl). */
#ifdef IN_PLACE
#ifndef DV16
#define DV16 4 /* O columns in float16 blocks: 16·DV16 >= head_dim_v */
#endif
#define DBN (16 * NS)
/* Softmax blocks of NB = 256 keys: NC chunks of DBN keys each go through the QK registers into
 * the block's score array (RM·1 KiB on the stack, in L1), then one pass per row finds the
 * maximum, one takes the exponentials and one normalises, so the per-block work (horizontal
 * sums, the division, rescaling O) is paid once per 256 keys and the passes are independent
 * vector loops. Measured on PoCL (AVX-512, B1 H8 S1024 d64): 32-key blocks 13.0-13.4 ms, 128-key
 * 11.4-11.7, 256-key 2-3% less, 512-key no better. */
#ifndef NC
#define NC (256 / DBN)
#endif
#define NB (DBN * NC)

/* IN_PLACE 1 (decode on CPUs, DECODE DIRECT 1, and prefill with few rows per kv head or long
 * K and V: clattn__direct_in_place, src/fused.c): K and V are read where they are, in their
 * storage type, instead of from the copies: a block of rows reads each key once, so with one or
 * two blocks per kv head copying would triple the traffic.
 * Chunks of 16 keys (NS 1), their scores from qk16_row or qk16_tile (common.cl; DP = DP16).
 * KV_FULL 1 when head_dim and head_dim_v are multiples of 16 (no tail loads). */
#if IN_PLACE
#define T_KV T_IN
#if NS != 1 || DP != DP16
#error "IN_PLACE needs NS 1 and DP = DP16"
#endif
/* The scores in register tiles (qk16_tile) where RM rows take them (QK_TILE_FOR, common.cl). */
#ifndef QK_TILE
#define QK_TILE QK_TILE_FOR(RM)
#endif
/* Vector c of a V row (c a constant after unrolling): only the last one can be short, since
 * 16·(DV16 - 1) < head_dim_v. */
#define LDV16(p, c) ((c) < DV16 - 1 ? LD16_IN((p), 16 * (c)) : ld16_row((p), 16 * (c), DV))
#else
#define T_KV float
/* Columns 16c..16c+15 of the V copy's key row at p: panel c of the head (v_sh = DV16 panels). */
#define LDV16(p, c) vload16(0, (p) + (ulong)(c) * (v_sh / DV16))
#endif
/* The loops over the rows that touch the O accumulators o[RM][DV16] (rescaling, the untiled
 * P·V, the stores): unrolled while those fit the registers or nearly (32 float16 vectors on
 * AVX-512), rolled beyond, where o lives in memory (L1) anyway: unrolled, 128 or 256 spilled
 * accumulators took PoCL 15-25 s to compile. */
#if RM * DV16 > 64
#define ROWS_LOOP _Pragma("unroll 1")
#else
#define ROWS_LOOP _Pragma("unroll")
#endif
/* P·V in register tiles (PV_TILE) when o has more vectors than the registers hold: PR rows (a
 * divisor of RM) by PC column vectors (a divisor of DV16), at most about half the registers: 16
 * accumulators with AVX-512; with AVX2 in place, 4 (8 ymm; PC V vectors and a broadcast beside
 * them), 2 x 2 where it divides, since every column tile reads the block's V rows once more (from
 * L2 after the first): decode on PoCL (2-core AMD EPYC, AVX2, B1 seq_kv 8192 d128 over 8 kv heads,
 * minima of 3 x 30 runs alternating, noisy): 8 rows 2 x 2 4.33 ms, 4 x 1 (eight column passes)
 * 6.60, 2 x 4 4.75, 1 x 8 4.78, 4 x 2 4.89, untiled (o in L1) 4.42, the AVX-512 tile 8 x 2 (32
 * ymm, every accumulator spilled at every key) 6.2; 4 rows 2 x 2 3.48, 4 x 1 3.98, 2 x 4 3.53,
 * untiled 3.81. That is in place, where V comes from memory. Prefill over the Kᵀ copy, where a
 * head's V stays in cache for all its row blocks and P·V is bound by the multiply-adds, takes up
 * to 3/4 of the registers in accumulators, 6 x 1 with RM 6 (12 ymm: 8 loads for 12 multiply-adds,
 * enough of them in flight): B1 H8 S1024 f32 (minima of 3-6 runs alternating), d64 15.5 ms against
 * 18.4 with 2 x 2, d128 34.1 against 37.3, d256 (H4) 32.8 against 38.6. */
#ifndef PV_TILE
#define PV_TILE (RM * DV16 > NREG16)
#endif
#if NREG16 >= 32
#define PV_ACC 16 /* accumulators a tile may have */
#define PV_ROWS 8 /* and rows */
#elif IN_PLACE
#define PV_ACC 4
#define PV_ROWS 2
#else
#define PV_ACC (3 * NREG16 / 4)
#define PV_ROWS PV_ACC
#endif
/* Whether PR x pc accumulators fit: at most PV_ACC of them and, with several rows (whose PC V
 * vectors stay in registers while the rows' probabilities are broadcast against them), the V
 * vectors and a broadcast beside them. */
#define PV_FITS(pc) ((pc) * PR <= PV_ACC && (PR == 1 || (pc) * (PR + 1) < NREG16))
#if !(defined(PR) && defined(PC)) /* else set by the build options (experiments) */
#if RM <= PV_ROWS
#define PR RM
#elif RM % 8 == 0 && PV_ROWS >= 8
#define PR 8
#elif RM % 6 == 0 && PV_ROWS >= 6
#define PR 6
#elif RM % 4 == 0 && PV_ROWS >= 4
#define PR 4
#elif RM % 3 == 0 && PV_ROWS >= 3
#define PR 3
#elif RM % 2 == 0
#define PR 2
#else
#define PR 1
#endif
#if PV_FITS(4) && DV16 % 4 == 0
#define PC 4
#elif PV_FITS(2) && DV16 % 2 == 0
#define PC 2
#else
#define PC 1
#endif
#endif /* PR, PC */
/* How far a score may exceed the row's reference before the reference moves: 8·ln 2, so
 * p = e^(s - m) <= 2^8 and the sums stay far from overflow (l <= 2^8·seq_kv). */
#define REF_SLACK 5.5451774f

/* Largest lane of v, which holds no NaN. */
inline float hmax16(float16 v)
{
    const float8 a = MAX_SKIP_NAN(v.lo, v.hi);
    const float4 b = MAX_SKIP_NAN(a.lo, a.hi);
    const float2 c = MAX_SKIP_NAN(b.lo, b.hi);
    return MAX_SKIP_NAN(c.x, c.y);
}

inline float hsum16(float16 v)
{
    const float8 a = v.lo + v.hi;
    const float4 b = a.lo + a.hi;
    const float2 c = b.lo + b.hi;
    return c.x + c.y;
}

/* The V copy of fused_direct, in panels of 16 columns: Vp[z][c / 16][n][c % 16] = V[b][hk][n][c]
 * as f32 for c < DV, 0 for DV <= c < 16·DV16; z = b·heads_kv + hk, head blocks of vp_sz floats
 * (DV16 panels of vp_sz / DV16). A column tile of P·V then reads its keys' 16 columns as one
 * sequential stream instead of a 64-byte piece of every V row. With kspan (a shared mask's, as
 * transpose_k in gemm.cl) only the keys of the DBN-key chunks that meet kv head z's span are
 * written, and with kvlen only those of the chunks that start below the batch's key length:
 * the chunks fused_direct reads; NULL: every key. One work-item per key. */
#if !KSEL || K_pack_v
__kernel void pack_v(__global const T_IN *V, ulong v_off, ulong v_sb, ulong v_sh, ulong v_ss,
                     __global float *Vp, ulong vp_off, ulong vp_sz, int N, int DV, int heads_kv,
                     __global const int *kspan, ulong ks_off, __global const int *kvlen)
{
    const int n = get_global_id(0), z = get_global_id(1);
    if (n >= N)
        return;
    const int b = z / heads_kv, hk = z % heads_kv, start = n / DBN * DBN;
    if (kvlen && start >= keys_of_batch(kvlen, b, N))
        return;
    if (kspan) {
        const ulong at = ks_off + 2 * (ulong)z;
        if (start + DBN <= 16 * kspan[at] || start >= 16 * kspan[at + 1])
            return;
    }
    __global const T_IN *src = V + v_off + (ulong)b * v_sb + (ulong)hk * v_sh + (ulong)n * v_ss;
    __global float *dst = Vp + vp_off + (ulong)z * vp_sz + (ulong)n * 16;
    for (int c = 0; c < DV16; c++)
        vstore16(16 * c + 16 <= DV ? LD16_IN(src, 16 * c) : ld16_tail(src, 16 * c, DV), 0,
                 dst + (ulong)c * (vp_sz / DV16));
}
#endif

#if NB > 512
#error "fused_direct keeps a bit per 16-key vector of a block in a uint: NB <= 512"
#endif
/* One past the run of 16-key vectors from key n (a multiple of 16) on that need no check: the
 * first key of the next vector whose bit is set in vhid, or nkeys. */
inline int run_end(uint vhid, int n, int nkeys)
{
    const uint rest = vhid >> (n / 16);
    if (!rest)
        return nkeys;
    return min(nkeys, n + 16 * (31 - (int)clz(rest & (0u - rest)))); /* its lowest set bit */
}

#if !KSEL || K_fused_direct
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
fused_direct(ATTN_KERNEL_ARGS(T_KV) MFLAG_ARGS)
{
    const int R = group * seq_q, nrb = (R + RM - 1) / RM; /* row blocks, grid y (or x, flat) */
    const int r0 = TILE_Y(1, nrb) * RM;
    const work_range w = work_range_of(TILE_Z(1, nrb), splits, split_len, heads_kv, seq_q, seq_kv,
                                       causal, kvlen, r0, min(R, r0 + RM) - 1);
    const int split = w.split, z = w.z, b = w.b, hk = w.hk, L = w.L;
    int k_lo = w.k_lo, k_hi = w.k_hi, k_all = w.k_all;
    NARROW_KEYS(r0, min(R, r0 + RM), DBN);

    /* The head's keys and values: K[key][d] and V[key][c] in place, or the panels of the
     * copies, Kt[key / BN][d][key % BN] (k_ss = BN) and Vp[c / 16][key][c % 16] (v_ss = 16). */
    __global const T_KV *Kb = K + k_off + (ulong)b * k_sb + (ulong)hk * k_sh;
    __global const T_KV *Vb = V + v_off + (ulong)b * v_sb + (ulong)hk * v_sh;

#if IN_PLACE
    qrow qs[RM]; /* DP = DP16 */
#else
    union {
        float f[DP];
        float16 v[(DP + 15) / 16];
    } qs[RM];
#endif
    float m[RM], l[RM];
    int rend[RM];
    ulong mrow[RM], frow[RM];
    float16 o[RM][DV16];
    ROWS_LOOP
    for (int i = 0; i < RM; i++) {
        const int row = min(r0 + i, R - 1); /* rows past R compute on a copy, never stored */
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        __global const T_IN *qrow = Q + q_off + (ulong)b * q_sb + (ulong)hq * q_sh + (ulong)pos * q_ss;
        for (int d = 0; d < DP; d++)
            qs[i].f[d] = d < D ? LD_IN(qrow, d) : 0.0f;
        m[i] = NEG_INF;
        l[i] = 0.0f;
        rend[i] = r0 + i < R ? min(k_hi, causal_end(causal, pos, seq_q, L)) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
        frow[i] = MFLAG_ROW(b, hq, pos);
#pragma unroll
        for (int c = 0; c < DV16; c++)
            o[i][c] = (float16)(0.0f);
    }

    for (int kt = k_lo; kt < k_hi; kt += NB) {
        const int nkeys = min(NB, k_hi - kt), nch = (nkeys + DBN - 1) / DBN;
        if (has_mask && HIDES_BLOCK(RM, rend, mrow, frow, kt, nkeys))
            continue;
        /* Scores of the block's chunks, then in place its p, row by row: written as whole vectors,
         * read back as scalars to broadcast in P·V (a plain float array would be written 4 floats
         * at a time). */
        union {
            float16 v[NC * NS];
            float f[NB];
        } sb[RM];
        for (int ch = 0; ch < nch; ch++) {
            const int kc = kt + ch * DBN;
#if IN_PLACE
            /* Keys past the range load the range's last key; they are hidden below (guarded).
             * The rows go through a rolled loop and only a row's last 16 elements can be short
             * (DP - 16 < head_dim): unrolled over the rows, with a tail check in every load,
             * RM 16 made programs that took PoCL one to three minutes to compile. */
#if QK_TILE
#pragma unroll 1
            for (int i0 = 0; i0 < RM; i0 += QT_R) {
                float16 t[QT_R];
                qk16_tile(qs + i0, Kb, k_ss, kc, k_hi - 1, D, t);
#pragma unroll
                for (int i = 0; i < QT_R; i++)
                    sb[i0 + i].v[ch] = t[i] * scale;
            }
#else
#pragma unroll 1
            for (int i = 0; i < RM; i++)
                sb[i].v[ch] = qk16_row(qs + i, Kb, k_ss, kc, k_hi - 1, D) * scale;
#endif
#else
            float16 s[RM][NS];
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int j = 0; j < NS; j++)
                    s[i][j] = (float16)(0.0f);
            /* The chunk's panel of the Kᵀ copy: kc is a multiple of DBN = BN, since k_lo is
             * (split_len a multiple of bn, choose_splits in src/fused.c; NARROW_KEYS moves it by
             * whole DBN steps) and NB is. */
            __global const float *kp = Kb + (ulong)kc * D;
            for (int d = 0; d < D; d++, kp += k_ss) {
                float16 kv[NS];
#pragma unroll
                for (int j = 0; j < NS; j++)
                    kv[j] = vload16(j, kp);
#pragma unroll
                for (int i = 0; i < RM; i++) {
                    const float a = qs[i].f[d];
#pragma unroll
                    for (int j = 0; j < NS; j++)
                        s[i][j] = MAD((float16)(a), kv[j], s[i][j]);
                }
            }
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int j = 0; j < NS; j++)
                    sb[i].v[ch * NS + j] = s[i][j] * scale;
#endif
        }

        /* A block is guarded when some row hides some key of it; keys below k_all are hidden
         * only by the mask. */
        const int guarded = has_mask || kt + NB > k_all;
        const int nv = nch * NS;
        /* The rows' passes go side by side, a vector of every row at a time: each row's running
         * maximum and sum is a chain of dependent operations, which one row at a time would wait
         * on (16 vectors a block: 64 cycles of vmaxps latency per row). */
        float16 acc[RM]; /* the rows' block maxima, then their sums of p */
        float mref[RM], alpha[RM], inv[RM];
        ROWS_LOOP
        for (int i = 0; i < RM; i++) {
            if (guarded)
                hide_keys(sb[i].f, nch * DBN, kt, rend[i], has_mask, mask, mrow[i]);
            acc[i] = (float16)(NEG_INF);
        }
        for (int v = 0; v < nv; v++) {
            ROWS_LOOP
            for (int i = 0; i < RM; i++)
                acc[i] = MAX_SKIP_NAN(acc[i], sb[i].v[v]);
        }
        ROWS_LOOP
        for (int i = 0; i < RM; i++) {
            /* The reference m moves only when the block's largest score passes it by more than
             * REF_SLACK (always while m is -inf, never for NaN): most blocks skip the rescaling.
             * A row that has seen only -inf keeps a 0 reference so that -inf - -inf never
             * occurs. */
            const float bmax = hmax16(acc[i]);
            alpha[i] = 1.0f;
            mref[i] = m[i] == NEG_INF ? 0.0f : m[i];
            if (bmax > m[i] + REF_SLACK) {
                alpha[i] = exp2p((m[i] - bmax) * LOG2E);
                mref[i] = bmax;
                m[i] = bmax;
            }
            acc[i] = (float16)(0.0f);
        }
        uint vhid = 0; /* bit v: some row hides some key of the block's 16-key vector v */
        for (int v = 0; v < nv; v++) {
            int16 some = (int16)(0);
            ROWS_LOOP
            for (int i = 0; i < RM; i++) {
                const float16 x = sb[i].v[v];
                float16 p = exp2p16((x - mref[i]) * LOG2E);
                if (guarded) { /* hidden keys: -0, which the checked P·V below skips */
                    const int16 h = x == (float16)(NEG_INF);
                    p = select(p, (float16)(HIDDEN_P), h);
                    some |= h;
                }
                acc[i] += p;
                sb[i].v[v] = p;
            }
            if (guarded)
                vhid |= (uint)(any(some) != 0) << v;
        }
        ROWS_LOOP
        for (int i = 0; i < RM; i++) {
            const float lnew = l[i] * alpha[i] + hsum16(acc[i]);
            /* lnew is 0 while the row has seen no key (o stays 0), NaN once a score was NaN. */
            inv[i] = lnew > 0.0f ? 1.0f / lnew : 0.0f;
            const float keep = isnan(lnew) ? lnew : l[i] * alpha[i] * inv[i];
            inv[i] *= O_WEIGHT; /* the weights of P·V: o at half scale (o_from_half16 at the store) */
#pragma unroll
            for (int c = 0; c < DV16; c++)
                o[i][c] *= keep;
            l[i] = lnew;
        }
        for (int v = 0; v < nv; v++) {
            ROWS_LOOP
            for (int i = 0; i < RM; i++)
                sb[i].v[v] *= inv[i];
        }

        /* P·V: the keys of 16-key vectors in which no row hides a key go without a check, those
         * of the other vectors skip each row's hidden keys (p -0) so that NaN/Inf in their V
         * never reaches O. A block in which no row hides a key goes unchecked in one run: with an
         * additive mask of finite values (biases) every block does. Measured on PoCL (2-core
         * Intel Xeon, AVX-512, B1 H8 S1024 d64 f32, a finite f32 mask broadcast over the heads,
         * minima of 10 calls, 3 runs alternating): 9.82-9.87 ms against 11.9-14.1 when every
         * masked block was checked (no mask: 8.4-9.6). The check used to cover every key of a
         * masked block in which some row hides a key, and without a mask every key from the
         * first that some row hides: a sliding window's row blocks, which hide keys at both ends
         * of their range only, were checked whole. Measured with hide_keys' vector loop, on PoCL
         * (2-core Intel Xeon, AVX-512, B1 H8 d64 f32 causal, a [1][1][Sq][Skv] f32 window mask,
         * medians of 20, 3 runs alternating with the kernels before, ms): S1024 window:128
         * 2.69-3.17 against 3.59-5.21, window:64 2.35-3.81 (minima 1.98-2.13 against 2.16-2.29),
         * window:512 even (minima 4.86-5.21 against 5.11-5.30); d128 window:256 6.20-6.80
         * against 7.61-7.87; f16 window:256 3.88-3.96 (one run 5.27) against 4.59-4.68; Sq1024
         * Skv4096 window:64 3.24-3.55 against 3.49-4.66; a bias mask 9.87-10.07 against
         * 10.23-10.32; no mask and causal even. */
        __global const T_KV *vp0 = Vb + (ulong)kt * v_ss;
#if PV_TILE
        /* O in register tiles of PR rows x PC vectors, each over all the block's keys: per key a
         * tile loads PC V vectors and PR probabilities for PR·PC multiply-adds, where a whole
         * row block of o (spilled past 32 vectors) would load and store o at every one. The
         * block's V rows are read once per tile, from L1/L2. */
#pragma unroll 1
        for (int i0 = 0; i0 < RM; i0 += PR) {
#pragma unroll 1
            for (int c0 = 0; c0 < DV16; c0 += PC) {
                float16 acc[PR][PC];
#pragma unroll
                for (int i = 0; i < PR; i++)
#pragma unroll
                    for (int c = 0; c < PC; c++)
                        acc[i][c] = o[i0 + i][c0 + c];
                int n = 0;
                while (n < nkeys) { /* n a multiple of 16: unchecked vectors, then one checked */
                    const int nfree = run_end(vhid, n, nkeys), n1 = min(nfree + 16, nkeys);
                    __global const T_KV *vp = vp0 + (ulong)n * v_ss;
                    for (; n < nfree; n++, vp += v_ss) {
                        float16 vv[PC];
#pragma unroll
                        for (int c = 0; c < PC; c++)
                            vv[c] = LDV16(vp, c0 + c);
#pragma unroll
                        for (int i = 0; i < PR; i++) {
                            const float16 p = (float16)(sb[i0 + i].f[n]);
#pragma unroll
                            for (int c = 0; c < PC; c++)
                                acc[i][c] = MAD(p, vv[c], acc[i][c]);
                        }
                    }
                    for (; n < n1; n++, vp += v_ss) {
                        float pn[PR];
                        int seen = 0;
#pragma unroll
                        for (int i = 0; i < PR; i++) {
                            pn[i] = sb[i0 + i].f[n];
                            seen |= !IS_HIDDEN(pn[i]);
                        }
                        if (!seen)
                            continue;
                        float16 vv[PC];
#pragma unroll
                        for (int c = 0; c < PC; c++)
                            vv[c] = LDV16(vp, c0 + c);
#pragma unroll
                        for (int i = 0; i < PR; i++)
                            if (!IS_HIDDEN(pn[i])) {
#pragma unroll
                                for (int c = 0; c < PC; c++)
                                    acc[i][c] = MAD((float16)(pn[i]), vv[c], acc[i][c]);
                            }
                    }
                }
#pragma unroll
                for (int i = 0; i < PR; i++)
#pragma unroll
                    for (int c = 0; c < PC; c++)
                        o[i0 + i][c0 + c] = acc[i][c];
            }
        }
#else
        int n = 0;
        while (n < nkeys) { /* n a multiple of 16: unchecked vectors, then one checked */
            const int nfree = run_end(vhid, n, nkeys), n1 = min(nfree + 16, nkeys);
            __global const T_KV *vp = vp0 + (ulong)n * v_ss;
            for (; n < nfree; n++, vp += v_ss) {
                float pn[RM];
                ROWS_LOOP
                for (int i = 0; i < RM; i++)
                    pn[i] = sb[i].f[n];
#pragma unroll
                for (int c = 0; c < DV16; c++) {
                    const float16 vv = LDV16(vp, c);
                    ROWS_LOOP
                    for (int i = 0; i < RM; i++)
                        o[i][c] = MAD((float16)(pn[i]), vv, o[i][c]);
                }
            }
            for (; n < n1; n++, vp += v_ss) {
                float pn[RM];
                int seen = 0;
                ROWS_LOOP
                for (int i = 0; i < RM; i++) {
                    pn[i] = sb[i].f[n];
                    seen |= !IS_HIDDEN(pn[i]);
                }
                if (!seen)
                    continue;
                /* Each V vector is loaded once for all rows (a load per row made RM copies of the
                 * tail loads: slow to compile). */
#pragma unroll
                for (int c = 0; c < DV16; c++) {
                    const float16 vv = LDV16(vp, c);
                    ROWS_LOOP
                    for (int i = 0; i < RM; i++)
                        if (!IS_HIDDEN(pn[i]))
                            o[i][c] = MAD((float16)(pn[i]), vv, o[i][c]);
                }
            }
        }
#endif
    }

    O += o_off + (ulong)split * o_split;
    LSE += l_off + (ulong)split * l_split;
    ROWS_LOOP
    for (int i = 0; i < RM; i++) {
        const int row = r0 + i;
        if (row >= R)
            continue;
        const int hq = hk * group + row / seq_q, pos = row % seq_q;
        /* No visible key: 0 and LSE -inf. A row whose scores were all NaN keeps m = -inf too
         * (fmax skips NaN) but has l = NaN: it is NaN, not empty. */
        const int empty = m[i] == NEG_INF && !isnan(l[i]);
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)pos * o_ss;
        /* f32 whole vectors are stored as they are; the rest of the row (f16/bf16 output, or
         * the f32 tail) goes through ob and a rolled loop of element stores. */
        float ob[16 * DV16];
#pragma unroll
        for (int c = 0; c < DV16; c++) {
            const float16 x = empty ? (float16)(0.0f) : o_from_half16(o[i][c]);
#if DT_OUT == 0
            if (16 * c + 15 < DV) {
                vstore16(x, 0, orow + 16 * c);
                continue;
            }
#endif
            vstore16(x, c, ob);
        }
#pragma unroll 1
        for (int col = DT_OUT == 0 ? DV / 16 * 16 : 0; col < DV; col++)
            ST_OUT(orow, col, ob[col]);
        if (has_lse)
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)pos * l_ss] =
                empty ? NEG_INF : m[i] + log(l[i]);
    }
}
#endif

#if IN_PLACE && defined(LANES)
/* ---- CPUs: fused_lanes (in place, 11 or more packed rows per kv head) ----
 *
 * fused_direct with the packed rows in the lanes of the vectors instead of keys or columns: RM =
 * 16·LANES rows, each per-row quantity LANES float16 vectors. A key's score is a vector over rows
 * built by multiply-adds of a Qᵀ column (d fixed, rows in lanes) with one K element broadcast; P·V
 * adds to a column of Oᵀ a P vector times one V element broadcast. So nothing is summed across
 * lanes (fused_direct sums each key's 16 partial products, hsum16x16), the row maxima and sums are
 * lane-wise, and head_dim and head_dim_v need no padding: f32 elements are loaded one by one as
 * broadcasts, which a CPU folds into the multiply-add; f16 and bf16 K rows are converted 16
 * elements at a time, and V a block of rows at a time (VF32_BLOCK). Per block of LNB keys: the
 * scores in tiles of LKT keys (LKT·LANES accumulators; each Qᵀ vector loaded serves LKT keys), the
 * softmax, then P·V in tiles of LCT columns of Oᵀ over the block's keys. The numerics are
 * fused_direct's: moving reference, O normalised after every block, hidden keys (p = -0) skipped
 * lane by lane. Measured on PoCL (2-core Zen 4, minima of 10-20 runs, f32 unless said): decode GQA
 * 32:8 seq_q 16 seq_kv 8192 d128 11.2-12.3 ms against 16.6-21 with fused_direct, f16 13.2 against
 * 15.8-17.8; prefill of 32 rows a head against 32768 keys (d64) 13.9-15.4 against 20.8-21.5.
 * With 11 to 16 rows (one vector, up to 5 lanes empty) see src/fused.c: LANES_MIN_ROWS. */
#define LNB 64
/* Keys per score tile and Oᵀ columns per P·V tile: 8 accumulators (6 with 3 vectors of rows)
 * with AVX-512; with fewer registers (AVX2, NREG16 8: 16 ymm) at most NREG16 / 2 accumulators,
 * at least one key: 8 of them (16 ymm) spill at every step. Measured on PoCL (2-core AMD EPYC,
 * AVX2 only, decode B1 H32/8 Skv8192 d128 f32, minima of 4 runs alternating, noisy): 16 rows
 * (LANES 1) LKT 8 8.4-8.9 ms, 4 5.2-6.7, 2 5.9-7.4; 32 rows (LANES 2) LKT 4 15.2, 2 7.5-9.1,
 * 1 9.7; 64 rows (LANES 4) LKT 2 29.1, 1 18.0-19.5 (LCT 1 or 2). */
/* With fewer registers and more than 2 vectors of rows (AVX2 and 33-64 packed rows: LANES 3 or
 * 4), both tiles take one vector of rows at a time (LSUB 1; the lanes loops below go over the
 * LANES vectors one after another): the score tile then has 4 keys (8 ymm accumulators; per d 2
 * loads of Qᵀ and 4 broadcasts of K for 8 multiply-adds) and P·V 4 columns of Oᵀ, where all the
 * lanes at once allowed 1 key and 1 column (8 loads and a broadcast for 8). With all the lanes,
 * each key of the block read the whole Qᵀ (32 KiB at d128, an L1), from L2; with one vector, 4
 * keys share each 8 KiB of it. Qᵀ is then stored a vector of rows after another (QT below), so
 * that a pass reads one sequential stream. Measured on PoCL (2-core AMD EPYC, AVX2, the medians of
 * 8 runs' medians and minima, alternating, ms, against all the lanes): decode GQA 32:8 seq_q 16
 * (64 rows) seq_kv 8192 d128 f32 21.8 / 17.8 against 23.5 / 18.2 (one thread: best 30.4 against
 * 33.6), f16 20.8 / 16.8 against 22.4 / 18.4, bf16 21.0 / 18.0 against 23.8 / 20.7, causal 22.7 /
 * 19.5 against 26.5 / 21.5, a window:1024 mask 4.5 / 3.2 against 5.5 / 3.8, a bias mask 29.1 /
 * 21.0 against 27.4 / 23.7; seq_q 12 (48 rows) 17.5 / 14.3 against 17.3 / 16.1; prefill of 64
 * rows a head (H8 seq_q 64 seq_kv 8192 d64) 10.3 / 9.2 against 14.9 / 10.1. Single runs vary by
 * 10-15%. With 2 vectors (32 rows), one at a time was slower (seq_q 8: 12.2 / 10.3 against 10.3 /
 * 8.4), and with 64 rows, 2 vectors by 2 keys (the tiles of 32 rows) spilled two P·V accumulators
 * at every key. */
#ifndef LSUB
#if NREG16 < 32 && LANES > 2
#define LSUB 1
#else
#define LSUB LANES
#endif
#endif
#ifndef LKT
#if NREG16 < 32
#define LKT (NREG16 / 2 / LSUB > 1 ? NREG16 / 2 / LSUB : 1)
#elif LANES == 1
#define LKT 8
#elif LANES == 2
#define LKT 4
#else
#define LKT 2
#endif
#endif
#ifndef LCT
#define LCT LKT
#endif
#if LANES % LSUB != 0
#error "LSUB must divide LANES"
#endif
/* Qᵀ column d of vector lv of rows: the vectors of a column side by side, or with LSUB 1 each
 * vector's columns side by side (above). */
#if LSUB < LANES
#define QT(d, lv) qt[(lv) * DP + (d)]
#else
#define QT(d, lv) qt[(d) * LANES + (lv)]
#endif
/* STMT once for each pass of LSUB vectors of rows, from vector l0; with all the lanes in one pass
 * no loop at all, so that the code stays what it was before the passes. */
#if LSUB < LANES
#define LSUB_PASSES(STMT) _Pragma("unroll 1") for (int l0 = 0; l0 < LANES; l0 += LSUB) { STMT }
#else
#define LSUB_PASSES(STMT) { const int l0 = 0; STMT }
#endif
/* whole tiles in a 128-column chunk (VF32_BLOCK) */
#if LCT != 1 && LCT != 2 && LCT != 4 && LCT != 8
#error "LCT must be 1, 2, 4 or 8"
#endif
typedef union lanes16 {
    float16 v;
    float f[16];
} lanes16;

#if defined(__clang__)
/* A mask's MASK_LANES rows of MASK_LANES keys in lanes order: r[i] is row i's keys on entry and
 * key i's rows on return. log2(MASK_LANES) rounds, each swapping one bit of the row index with the
 * same bit of the lane index (the off-diagonal blocks of MASK_LANES / 2, then of half that, down
 * to 1): with AVX-512's 32 registers 16 x 16 (64 two-vector shuffles, kept in registers). With 16
 * registers (AVX2's ymm, NREG16 8; SSE's xmm, NREG16 4) 16 x 16 spills, so 8 x 8 (float8: 24
 * shuffles, one instruction each with AVX2) or 4 x 4 (float4), a block of lanes at a time. Lane
 * by lane, PoCL built each key's 16 rows from scalar loads. Measured with 8 x 8 on PoCL 3.1
 * compiling for haswell on a 2-core Intel Xeon (AVX2 code on an AVX-512 machine: CLATTN_NREG16
 * 8, POCL_LLVM_CPU_NAME=haswell, POCL_KERNELLIB_NAME=avx2), f32, causal, a finite
 * [1][1][Sq][Skv] mask, 10 runs alternating: decode GQA 32:8 seq_q 4 seq_kv 8192 d128 (16 rows)
 * median of the runs' minima 8.49 ms against 9.25, the mask's share of the kernel's samples
 * (perf) 3.1% against 8.9%; 32 rows (H8 seq_q 32 seq_kv 8192 d64) 9.18 against 9.38, at most
 * 11% against 17%. */
#if NREG16 >= 32
#define MASK_LANES 16
#elif NREG16 >= 8
#define MASK_LANES 8
#else
#define MASK_LANES 4
#endif
#define floatMB CAT(float, MASK_LANES)
#define intMB CAT(int, MASK_LANES)
#define vloadMB CAT(vload, MASK_LANES)
#define vstoreMB CAT(vstore, MASK_LANES)
#if defined(DT_MASK) && DT_MASK != 0
#define LDMB_MASK(p, i) CAT(vload_half, MASK_LANES)(0, (p) + (i))
#else
#define LDMB_MASK(p, i) vloadMB(0, (p) + (i))
#endif
#define TR_ROUND(s, lo, hi)                                                                        \
    _Pragma("unroll") for (int i_ = 0; i_ < MASK_LANES; i_++) if (!(i_ & (s))) {                   \
        const floatMB a_ = r[i_], b_ = r[i_ + (s)];                                                \
        r[i_] = __builtin_shufflevector(a_, b_, lo);                                               \
        r[i_ + (s)] = __builtin_shufflevector(a_, b_, hi);                                         \
    }
/* Round s: lane j of row i (bit s of i clear) takes lane j - s of row i + s where j has bit s,
 * and lane j of row i + s takes lane j + s of row i where j has not. */
#define TR8_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define TR8_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define TR4_LO 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define TR4_HI 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define TR2_LO 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define TR2_HI 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define TR1_LO 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define TR1_HI 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
#define TRM8_4LO 0, 1, 2, 3, 8, 9, 10, 11
#define TRM8_4HI 4, 5, 6, 7, 12, 13, 14, 15
#define TRM8_2LO 0, 1, 8, 9, 4, 5, 12, 13
#define TRM8_2HI 2, 3, 10, 11, 6, 7, 14, 15
#define TRM8_1LO 0, 8, 2, 10, 4, 12, 6, 14
#define TRM8_1HI 1, 9, 3, 11, 5, 13, 7, 15
#define TRM4_2LO 0, 1, 4, 5
#define TRM4_2HI 2, 3, 6, 7
#define TRM4_1LO 0, 4, 2, 6
#define TRM4_1HI 1, 5, 3, 7
__attribute__((always_inline)) inline void transpose_mb(floatMB *r)
{
#if MASK_LANES == 16
    TR_ROUND(8, TR8_LO, TR8_HI)
    TR_ROUND(4, TR4_LO, TR4_HI)
    TR_ROUND(2, TR2_LO, TR2_HI)
    TR_ROUND(1, TR1_LO, TR1_HI)
#elif MASK_LANES == 8
    TR_ROUND(4, TRM8_4LO, TRM8_4HI)
    TR_ROUND(2, TRM8_2LO, TRM8_2HI)
    TR_ROUND(1, TRM8_1LO, TRM8_1HI)
#else
    TR_ROUND(2, TRM4_2LO, TRM4_2HI)
    TR_ROUND(1, TRM4_1LO, TRM4_1HI)
#endif
}
#if MASK_LANES == 16
#define add_mask_mb add_mask16
#else
/* add_mask16 on MASK_LANES lanes */
inline floatMB add_mask_mb(floatMB s, floatMB mv, intMB hidden)
{
    return select(s + mv, (floatMB)(NEG_INF), hidden | (mv == (floatMB)(NEG_INF)));
}
#endif
#else
#define MASK_LANES 0
#endif

/* f16 and bf16 V: each block's rows converted to f32 first, 16 elements at a time, into private
 * memory (VF32_BLOCK, rows VF_PITCH floats apart), where P·V broadcasts them. Converted in P·V,
 * LCT elements of a row at a time (2 with 64 rows), f16 went through scalar bit operations on
 * PoCL 3.1 (vload_half2), a dozen instructions for 8 multiply-adds, and every element took a
 * shuffle to broadcast. At most 128 columns a row (32 KiB a block): a wider head_dim_v is
 * converted and multiplied in chunks of 128 columns. Measured on PoCL (2-core Intel Xeon,
 * AVX-512, f16, head_dim 256, minima of 3-6 runs, 2 runs alternating, ms): H4 seq_q 1024
 * seq_kv 4096 128.4-133.6 non-causal / 132.6-134.8 causal against 144.8-184.4 / 137.1-162.0
 * converted in P·V; GQA 32:8 seq_q 16 seq_kv 8192 33.6-34.5 / 33.5-34.4 against 38.9-43.2 /
 * 45.5-46.4 (f32 28.8-35.0). */
#define VF_PITCH (16 * DV16 < 128 ? 16 * DV16 : 128)
#define VF32_BLOCK (DT_IN != 0)

/* Elements c0..c0 + ncol - 1 (ncol <= LCT) of an f32 V row in global memory, each broadcast to a
 * vector; 0 past ncol (f16 and bf16 V go through VF32_BLOCK and lanes_vrow_f32). */
__attribute__((always_inline)) inline void lanes_vrow(__global const T_KV *vp, int c0, int ncol,
                                                      float16 *vv)
{
#pragma unroll
    for (int c = 0; c < LCT; c++)
        vv[c] = (float16)(c < ncol ? LD_IN(vp, c0 + c) : 0.0f);
}

/* The same from a row of f32 values in private memory (lanes_pv_f32): broadcasts from there
 * cost the multiply-adds nothing, as f32 ones from global memory. The row holds the VF_PITCH
 * columns of one chunk (VF32_BLOCK), the one that column c0 is in. */
__attribute__((always_inline)) inline void lanes_vrow_f32(const float *vp, int c0, int ncol,
                                                          float16 *vv)
{
    vp += c0 % VF_PITCH;
#pragma unroll
    for (int c = 0; c < LCT; c++)
        vv[c] = (float16)(c < ncol ? vp[c] : 0.0f);
}

/* Oᵀ columns c0.. (ncol <= LCT of them, at ot[c·LANES + lv]) += Σ_n P[n]·V[key n][c0 + c] over
 * the block's nkeys keys (P at sbk[n·LANES + lv], V row n at vp + n·v_ss), for the LSUB vectors
 * of rows lv = 0 .. LSUB - 1 (the caller offsets ot and sbk by the first); keys from nfree on
 * are hidden from some rows, whose lanes (p = -0) keep their value. lanes_pv reads V in place,
 * lanes_pv_f32 a block of it converted to f32 (VF32_BLOCK). */
#define DEFINE_LANES_PV(NAME, VP_T, VROW)                                                        \
    __attribute__((always_inline)) inline void NAME(lanes16 *ot, int c0, int ncol, VP_T vp,      \
                                                    ulong v_ss, const lanes16 *sbk, int nfree,   \
                                                    int nkeys)                                   \
    {                                                                                            \
        float16 acc[LCT][LSUB];                                                                  \
        _Pragma("unroll") for (int c = 0; c < LCT; c++)                                          \
            _Pragma("unroll") for (int lv = 0; lv < LSUB; lv++)                                  \
                acc[c][lv] = c < ncol ? ot[(c0 + c) * LANES + lv].v : (float16)(0.0f);           \
        int n = 0;                                                                               \
        for (; n < nfree; n++, vp += v_ss) {                                                     \
            float16 vv[LCT];                                                                     \
            VROW(vp, c0, ncol, vv);                                                              \
            _Pragma("unroll") for (int lv = 0; lv < LSUB; lv++) {                                \
                const float16 p = sbk[n * LANES + lv].v;                                         \
                _Pragma("unroll") for (int c = 0; c < LCT; c++)                                  \
                    acc[c][lv] = MAD(p, vv[c], acc[c][lv]);                                      \
            }                                                                                    \
        }                                                                                        \
        for (; n < nkeys; n++, vp += v_ss) {                                                     \
            int16 hid[LSUB];                                                                     \
            int seen = 0;                                                                        \
            _Pragma("unroll") for (int lv = 0; lv < LSUB; lv++) {                                \
                hid[lv] = IS_HIDDEN16(sbk[n * LANES + lv].v);                                    \
                seen |= !all(hid[lv]);                                                           \
            }                                                                                    \
            if (!seen)                                                                           \
                continue;                                                                        \
            float16 vv[LCT];                                                                     \
            VROW(vp, c0, ncol, vv);                                                              \
            _Pragma("unroll") for (int lv = 0; lv < LSUB; lv++) {                                \
                const float16 p = sbk[n * LANES + lv].v;                                         \
                _Pragma("unroll") for (int c = 0; c < LCT; c++)                                  \
                    acc[c][lv] = select(MAD(p, vv[c], acc[c][lv]), acc[c][lv], hid[lv]);        \
            }                                                                                    \
        }                                                                                        \
        _Pragma("unroll") for (int c = 0; c < LCT; c++)                                          \
            _Pragma("unroll") for (int lv = 0; lv < LSUB; lv++)                                  \
                if (c < ncol)                                                                    \
                    ot[(c0 + c) * LANES + lv].v = acc[c][lv];                                    \
    }
DEFINE_LANES_PV(lanes_pv, __global const T_KV *, lanes_vrow)
DEFINE_LANES_PV(lanes_pv_f32, const float *, lanes_vrow_f32)

#if !KSEL || K_fused_lanes
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
fused_lanes(ATTN_KERNEL_ARGS(T_KV) MFLAG_ARGS)
{
    const int R = group * seq_q, nrb = (R + RM - 1) / RM; /* row blocks, grid y (or x, flat) */
    const int r0 = TILE_Y(1, nrb) * RM;
    const work_range w = work_range_of(TILE_Z(1, nrb), splits, split_len, heads_kv, seq_q, seq_kv,
                                       causal, kvlen, r0, min(R, r0 + RM) - 1);
    const int split = w.split, b = w.b, hk = w.hk, L = w.L;
    int k_lo = w.k_lo, k_hi = w.k_hi, k_all = w.k_all;
    NARROW_KEYS(r0, min(R, r0 + RM), 16);
    __global const T_KV *Kb = K + k_off + (ulong)b * k_sb + (ulong)hk * k_sh;
    __global const T_KV *Vb = V + v_off + (ulong)b * v_sb + (ulong)hk * v_sh;

    /* Quantity x of row 16·lv + i is lane i of x[lv]; Qᵀ column d is QT(d, lv). */
    lanes16 qt[DP * LANES], ot[16 * DV16 * LANES], m[LANES], l[LANES];
    int rend[RM];
    ulong mrow[RM], frow[RM];
    for (int i = 0; i < RM; i++) {
        const int row = min(r0 + i, R - 1); /* rows past R compute on a copy, never stored */
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        __global const T_IN *qrow = Q + q_off + (ulong)b * q_sb + (ulong)hq * q_sh + (ulong)pos * q_ss;
        for (int d = 0; d < DP; d++) /* zero past D: the f16 scores run to DP */
            QT(d, i / 16).f[i % 16] = d < D ? LD_IN(qrow, d) : 0.0f;
        rend[i] = r0 + i < R ? min(k_hi, causal_end(causal, pos, seq_q, L)) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
        frow[i] = MFLAG_ROW(b, hq, pos);
    }
    int16 rendv[LANES];
#pragma unroll
    for (int lv = 0; lv < LANES; lv++) {
        rendv[lv] = vload16(lv, rend);
        m[lv].v = (float16)(NEG_INF);
        l[lv].v = (float16)(0.0f);
    }
    for (int c = 0; c < 16 * DV16 * LANES; c++)
        ot[c].v = (float16)(0.0f);

    for (int kt = k_lo; kt < k_hi; kt += LNB) {
        const int nkeys = min(LNB, k_hi - kt);
        if (has_mask && HIDES_BLOCK(RM, rend, mrow, frow, kt, nkeys))
            continue;
        lanes16 sbk[LNB * LANES]; /* scores, then p, of key n at sbk[n·LANES + lv] */
        for (int n0 = 0; n0 < nkeys; n0 += LKT) {
            /* Keys past the range load the range's last key; their scores are never read. */
            __global const T_KV *kr[LKT];
#pragma unroll
            for (int e = 0; e < LKT; e++)
                kr[e] = Kb + (ulong)min(kt + n0 + e, k_hi - 1) * k_ss;
#if LPF && defined(__clang__)
            /* While the tile's scores are computed: the tile's V rows, used after the block's
             * softmax, and the K rows of the same keys of the next block, into L2 (locality 2).
             * The CPU's own prefetchers left the multiply-adds waiting on memory. Into L1
             * (locality 3), the next block's K and this block's V (32 KiB each at d128 f32) evict
             * each other and Qᵀ from a 32 KiB L1: with 16 rows (one vector of lanes, few
             * multiply-adds a byte) that made the kernel as slow as with 4. PoCL (2-core Zen 4),
             * minima of 4-5 runs alternating, L2 against L1: decode GQA 32:8 seq_q 4 seq_kv 8192
             * d128 3.5 ms against 5.4; prefill of 32 rows against 32768 keys (d64) 11.6 against
             * 13.8; decode GQA 32:8 seq_q 16 (64 rows, compute-bound) 11.2 against 11.1. No
             * prefetches at all: prefill 18.7-26 ms against 14.7-15.4 with L1 ones. Prefetches
             * made fused_direct slower (few rows, where the hardware keeps up): 25.3 ms against
             * 21.1, and into L2 3.7 against 3.4 (8 rows). */
#pragma unroll
            for (int e = 0; e < LKT; e++) {
                __global const T_KV *kn = Kb + (ulong)min(kt + LNB + n0 + e, k_hi - 1) * k_ss;
                __global const T_KV *vn = Vb + (ulong)min(kt + n0 + e, k_hi - 1) * v_ss;
                for (int x = 0; x < D; x += 64 / (int)sizeof(T_KV))
                    __builtin_prefetch((const void *)(uintptr_t)(kn + x), 0, 2);
                for (int x = 0; x < DV; x += 64 / (int)sizeof(T_KV))
                    __builtin_prefetch((const void *)(uintptr_t)(vn + x), 0, 2);
            }
#endif
            /* The tile's scores, LSUB vectors of rows at a time (one pass unless LSUB < LANES;
             * f16 and bf16 K rows are then converted once a pass). */
#if LSUB < LANES
#pragma unroll 1
            for (int l0 = 0; l0 < LANES; l0 += LSUB) {
#else
            {
                const int l0 = 0;
#endif
                float16 acc[LKT][LSUB];
#pragma unroll
                for (int e = 0; e < LKT; e++)
#pragma unroll
                    for (int lv = 0; lv < LSUB; lv++)
                        acc[e][lv] = (float16)(0.0f);
#if DT_IN != 0
                /* f16 and bf16: 16 elements of each key converted at once, zero past D as Qᵀ is,
                 * then broadcast from private memory. f16 converted an element at a time went
                 * through scalar bit operations (see VF32_BLOCK); bf16 took a shift and a
                 * broadcast from a general register for each multiply-add with 16 rows. Measured
                 * on PoCL (2-core Intel Xeon, AVX-512, minima of 10, 2 runs alternating, ms): bf16
                 * decode GQA 32:8 seq_q 4 Skv8192 d128 (16 rows) 3.29-3.58 against 3.82, H8 Sq16
                 * Skv8192 d64 causal 1.60-1.83 against 1.93-1.96, Sq64 5.24-5.32 against
                 * 5.49-6.84. */
#pragma unroll 1
                for (int d0 = 0; d0 < DP; d0 += 16) {
                    lanes16 kf[LKT];
#pragma unroll
                    for (int e = 0; e < LKT; e++)
                        kf[e].v = ld16_row(kr[e], d0, D);
#pragma unroll 4
                    for (int dd = 0; dd < 16; dd++) {
                        float16 q[LSUB];
#pragma unroll
                        for (int lv = 0; lv < LSUB; lv++)
                            q[lv] = QT(d0 + dd, l0 + lv).v;
#pragma unroll
                        for (int e = 0; e < LKT; e++)
#pragma unroll
                            for (int lv = 0; lv < LSUB; lv++)
                                acc[e][lv] = MAD(q[lv], (float16)(kf[e].f[dd]), acc[e][lv]);
                    }
                }
#else
#pragma unroll 2
                for (int d = 0; d < D; d++) {
                    float16 q[LSUB];
#pragma unroll
                    for (int lv = 0; lv < LSUB; lv++)
                        q[lv] = QT(d, l0 + lv).v;
#pragma unroll
                    for (int e = 0; e < LKT; e++) {
                        const float16 kv = (float16)(LD_IN(kr[e], d));
#pragma unroll
                        for (int lv = 0; lv < LSUB; lv++)
                            acc[e][lv] = MAD(q[lv], kv, acc[e][lv]);
                    }
                }
#endif
#pragma unroll
                for (int e = 0; e < LKT; e++)
#pragma unroll
                    for (int lv = 0; lv < LSUB; lv++)
                        sbk[(n0 + e) * LANES + l0 + lv].v = acc[e][lv] * scale;
            }
        }

        /* Keys below k_all are hidden only by the mask (see fused_direct). */
        const int guarded = has_mask || kt + LNB > k_all;
        int16 hid = (int16)(0); /* lanes (rows) that hide some key of the block */
#pragma unroll 1
        for (int lv = 0; lv < LANES; lv++) {
            if (guarded) {
                int n = 0;
#if MASK_LANES
                /* The mask 16 keys at a time: each row's 16 loaded as one vector and turned into
                 * the lanes order. Lane by lane (the loop below) PoCL gathered them 4 at a time
                 * through the stack: 30% of the kernel's time with a bias mask (perf). Measured
                 * on PoCL (2-core Intel Xeon, AVX-512, f32, causal, a finite [1][1][Sq][Skv]
                 * mask, minima of 30 calls, 3 runs alternating, ms): 32 rows (B1 H8 Sq32 Skv8192
                 * d64) 2.42-3.05 against 3.16-3.49; decode GQA 32:8 Skv8192 d128, seq_q 4 (16
                 * rows) 3.28-3.36 against 3.70-3.82, seq_q 16 (64 rows) 8.57-9.16 against
                 * 9.07-10.17, f16 seq_q 4 3.13-3.32 against 3.53-3.89; prefill in place (H8
                 * Sq1024 Skv8192 d64) 85.2-85.3 against 100.6-104.7. With fewer registers
                 * (MASK_LANES 8 or 4) blocks of 8 or 4 lanes, 8 or 4 keys (see transpose_mb). */
                if (has_mask) {
#pragma unroll 1
                    for (; n + MASK_LANES <= nkeys; n += MASK_LANES) {
#pragma unroll 1
                        for (int h = 0; h < 16; h += MASK_LANES) {
                            floatMB r[MASK_LANES];
#pragma unroll
                            for (int i = 0; i < MASK_LANES; i++)
                                r[i] = LDMB_MASK(mask, mrow[16 * lv + h + i] + (ulong)(kt + n));
                            transpose_mb(r);
                            const intMB re = vloadMB(0, rend + 16 * lv + h);
#pragma unroll
                            for (int e = 0; e < MASK_LANES; e++) {
                                float *sf = sbk[(n + e) * LANES + lv].f + h;
                                const intMB past = (intMB)(kt + n + e) >= re;
                                vstoreMB(add_mask_mb(vloadMB(0, sf), r[e], past), 0, sf);
                            }
                        }
                    }
                }
#endif
                for (; n < nkeys; n++) {
                    const int key = kt + n;
                    const float16 s = sbk[n * LANES + lv].v;
                    const int16 past = (int16)(key) >= rendv[lv];
                    if (has_mask) {
                        lanes16 mv;
                        for (int i = 0; i < 16; i++)
                            mv.f[i] = LD_MASK(mask, mrow[16 * lv + i] + key);
                        sbk[n * LANES + lv].v = add_mask16(s, mv.v, past);
                    } else {
                        sbk[n * LANES + lv].v = select(s, (float16)(NEG_INF), past);
                    }
                }
            }
            float16 mx = (float16)(NEG_INF);
            for (int n = 0; n < nkeys; n++)
                mx = MAX_SKIP_NAN(mx, sbk[n * LANES + lv].v);
            /* The reference moves, lane by lane, where the block's largest score passes it by
             * more than REF_SLACK; a row that has seen only -inf keeps a 0 reference. */
            const float16 mo = m[lv].v, lo = l[lv].v;
            const int16 up = mx > mo + (float16)(REF_SLACK);
            const float16 mref = select(select(mo, (float16)(0.0f), mo == (float16)(NEG_INF)), mx, up);
            const float16 alpha = select((float16)(1.0f), exp2p16((mo - mref) * LOG2E), up);
            float16 ps = (float16)(0.0f);
            for (int n = 0; n < nkeys; n++) {
                const float16 x = sbk[n * LANES + lv].v;
                float16 p = exp2p16((x - mref) * LOG2E);
                if (guarded) { /* hidden keys: -0, which lanes_pv skips */
                    const int16 h = x == (float16)(NEG_INF);
                    p = select(p, (float16)(HIDDEN_P), h);
                    hid |= h;
                }
                ps += p;
                sbk[n * LANES + lv].v = p;
            }
            const float16 lnew = lo * alpha + ps;
            const float16 inv = select((float16)(0.0f), (float16)(1.0f) / lnew, lnew > (float16)(0.0f));
            const float16 keep = select(lo * alpha * inv, lnew, isnan(lnew));
            const float16 w = inv * O_WEIGHT; /* o at half scale: o_from_half at the store */
            for (int c = 0; c < DV; c++)
                ot[c * LANES + lv].v *= keep;
            for (int n = 0; n < nkeys; n++)
                sbk[n * LANES + lv].v *= w;
            m[lv].v = select(mo, mx, up);
            l[lv].v = lnew;
        }

        __global const T_KV *vp0 = Vb + (ulong)kt * v_ss;
        /* As in fused_direct: a block in which no row hides a key goes unchecked. */
        const int nfree = !guarded || !any(hid) ? nkeys : has_mask ? 0 : clamp(k_all - kt, 0, nkeys);
        int c0 = 0;
#if VF32_BLOCK
        float vf[LNB * VF_PITCH];
#pragma unroll 1
        for (int cb = 0; cb < DV; cb += VF_PITCH) { /* one chunk unless head_dim_v > 128 */
            const int cend = min(DV, cb + VF_PITCH);
            for (int n = 0; n < nkeys; n++)
#pragma unroll
                for (int d0 = 0; d0 < VF_PITCH; d0 += 16)
                    if (cb + d0 < DV)
                        vstore16(ld16_row(vp0 + (ulong)n * v_ss, cb + d0, DV), 0,
                                 vf + n * VF_PITCH + d0);
#define LANES_PV(c, ncol) LSUB_PASSES(lanes_pv_f32(ot + l0, (c), (ncol), vf, VF_PITCH, sbk + l0, nfree, nkeys);)
#else
        {
            const int cend = DV;
#define LANES_PV(c, ncol) LSUB_PASSES(lanes_pv(ot + l0, (c), (ncol), vp0, v_ss, sbk + l0, nfree, nkeys);)
#endif
#pragma unroll 1
            for (; c0 + LCT <= cend; c0 += LCT)
                LANES_PV(c0, LCT);
            if (c0 < cend)
                LANES_PV(c0, cend - c0);
#undef LANES_PV
            c0 = cend;
        }
    }

    O += o_off + (ulong)split * o_split;
    LSE += l_off + (ulong)split * l_split;
#pragma unroll 1
    for (int i = 0; i < RM; i++) {
        const int row = r0 + i;
        if (row >= R)
            continue;
        const int hq = hk * group + row / seq_q, pos = row % seq_q, lv = i / 16, e = i % 16;
        const float mi = m[lv].f[e], li = l[lv].f[e];
        /* No visible key: 0 and LSE -inf (a row of NaN scores has l NaN: NaN, not empty). */
        const int empty = mi == NEG_INF && !isnan(li);
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)pos * o_ss;
        for (int c = 0; c < DV; c++)
            ST_OUT(orow, c, empty ? 0.0f : o_from_half(ot[c * LANES + lv].f[e]));
        if (has_lse)
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)pos * l_ss] = empty ? NEG_INF : mi + log(li);
    }
}
#endif
#endif /* fused_lanes */
#endif /* IN_PLACE: the CPU kernels */
