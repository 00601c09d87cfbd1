/* The rules the attention kernels share (fused_tiled.cl, fused_direct.cl, fused_lanes.cl,
 * decode.cl, decode_lanes.cl; assembled after common.cl by src/program.c): the kernels' argument
 * list, the work range of a work-group, which keys a row sees (key lengths, causal range, mask)
 * and how hidden keys are kept out, the mask flags (MFLAGS) that mask_pass.cl computes, and the
 * merge of two online-softmax states. */

/* 1 when key is visible to one of the nr rows whose ends (causal range, key length; 0 for a row
 * past the block) are rend[] and whose mask rows start at mask[mrow[]]: the key lies before the
 * row's end and its mask entry is not -inf. The GPU decode kernels read the K and V rows of such
 * keys only, so that a sliding window's hidden past costs a mask entry per row, not its K and V
 * rows. */
inline int key_seen(__global const T_MASK *mask, const ulong *mrow, const int *rend, int nr, int key)
{
    for (int i = 0; i < nr; i++)
        if (key < rend[i] && LD_MASK(mask, mrow[i] + key) != NEG_INF)
            return 1;
    return 0;
}

#if defined(DT_IN)
/* Loads 4 consecutive elements starting at index i < n of a row, zero beyond n. */
inline float4 row_load4(__global const T_IN *p, int i, int n)
{
    if (i + 3 < n)
        return LD4_IN(p, i);
    return (float4)(i < n ? LD_IN(p, i) : 0.0f, i + 1 < n ? LD_IN(p, i + 1) : 0.0f,
                    i + 2 < n ? LD_IN(p, i + 2) : 0.0f, 0.0f);
}

/* The argument list of the attention kernels (fused, fused_direct, fused_lanes, decode_rows in
 * decode.cl), set in this order by clattn__fused_launch in src/fused.c; TKV is the element type of K and V. */
#define ATTN_KERNEL_ARGS(TKV)                                                                   \
    __global const T_IN *Q, ulong q_off, ulong q_sb, ulong q_sh, ulong q_ss,                    \
        __global const TKV *K, ulong k_off, ulong k_sb, ulong k_sh, ulong k_ss,                 \
        __global const TKV *V, ulong v_off, ulong v_sb, ulong v_sh, ulong v_ss,                 \
        __global T_OUT *O, ulong o_off, ulong o_sb, ulong o_sh, ulong o_ss,                     \
        __global float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,                   \
        __global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh, ulong m_ss,           \
        __global const int *kvlen, ulong o_split, ulong l_split, int seq_q, int seq_kv,         \
        int heads_kv, int group, int D, int DV, int causal, int has_mask, int has_lse,          \
        int splits, int split_len, float scale

/* Copies the nr packed query rows r0.. of kv head (b, hk) to local memory, row r at
 * dst + r·pitch (pitch a multiple of 4 floats, dst 16-byte aligned), as dp / 4 float4 each:
 * zero past head_dim D and for rows at or past R = group·seq_q. Qb = Q + q_off + b·q_sb; the
 * nwi work-items of the group share the copy (lid their index); the caller's barrier follows. */
inline void stage_q_rows(__local float *dst, int pitch, int nr, int dp, int lid, int nwi,
                         __global const T_IN *Qb, ulong q_sh, ulong q_ss, int hk, int group,
                         int seq_q, int R, int r0, int D)
{
    for (int e = lid; e < nr * (dp / 4); e += nwi) {
        const int r = e / (dp / 4), d = 4 * (e % (dp / 4));
        const int row = r0 + r;
        float4 x = (float4)(0.0f);
        if (row < R) {
            const int hq = hk * group + row / seq_q, i = row % seq_q;
            x = row_load4(Qb + (ulong)hq * q_sh + (ulong)i * q_ss, d, D);
        }
        vstore4(x, 0, dst + r * pitch + d);
    }
}

/* What one work-group covers: grid z = (batch·heads_kv + kv head)·splits + split, packed rows
 * r0..r1, and the keys [k_lo, k_hi) of its split that those rows may see (causal: the positions
 * of the first and last rows bound the range of all), every row seeing keys below k_all. */
typedef struct work_range {
    int split, z, b, hk, L, k_lo, k_hi, k_all;
} work_range;

inline work_range work_range_of(int zz, int splits, int split_len, int heads_kv, int seq_q,
                                int seq_kv, int causal, __global const int *kvlen, int r0, int r1)
{
    work_range w;
    w.split = zz % splits;
    w.z = zz / splits;
    w.b = w.z / heads_kv;
    w.hk = w.z % heads_kv;
    w.L = keys_of_batch(kvlen, w.b, seq_kv);
    const int spans = (r0 / seq_q) != (r1 / seq_q);
    const int i_min = spans ? 0 : r0 % seq_q;
    const int i_max = spans ? seq_q - 1 : r1 % seq_q;
    w.k_lo = w.split * split_len; /* below seq_kv: the host makes (splits - 1)·split_len < seq_kv */
    /* k_lo + split_len may pass INT_MAX for the last split of a long range: compare instead. */
    const int end = split_len >= w.L - w.k_lo ? w.L : w.k_lo + split_len;
    w.k_hi = min(end, causal_end(causal, i_max, seq_q, w.L));
    w.k_all = min(w.k_hi, causal_end(causal, i_min, seq_q, w.L));
    return w;
}
#endif

/* Two softmax states (running maximum m, sum l of exp(score - m)) over disjoint keys, made one:
 * the union's m and l, and the weights of the two normalised outputs, o = k1·o1 + k2·o2. A state
 * without keys (l 0, has1/has2 0) is skipped, so nothing in its o can leak; any other is
 * multiplied even when its weight underflows to 0 (NaN in its o stays NaN, as a visible key's
 * does). A NaN sum (NaN scores) makes both weights NaN; an empty union gives weights 0. */
typedef struct state_merge {
    float m, l, k1, k2;
    int has1, has2;
} state_merge;

inline state_merge merge_states(float m1, float l1, float m2, float l2)
{
    state_merge r;
    r.m = fmax(m1, m2);
    const float mref = r.m == NEG_INF ? 0.0f : r.m;
    const float w1 = l1 * exp2((m1 - mref) * LOG2E), w2 = l2 * exp2((m2 - mref) * LOG2E);
    r.l = w1 + w2;
    const float inv = r.l > 0.0f ? 1.0f / r.l : 0.0f;
    r.k1 = isnan(r.l) ? r.l : w1 * inv;
    r.k2 = isnan(r.l) ? r.l : w2 * inv;
    r.has1 = l1 != 0.0f; /* NaN too */
    r.has2 = l2 != 0.0f;
    return r;
}

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
    /* Without a mask, keys below rend are visible: a loop of its own, since in one loop with the
     * mask's PoCL made masked AVX-512 loads of the NULL mask, each as slow as a cache miss
     * (causal prefill 2.77 ms against 3.16). See docs/measurements.md#hide-keys. */
    if (!has_mask) {
        for (int e = clamp(rend - key0, 0, n); e < n; e++)
            t[e] = NEG_INF;
        return;
    }
    int e = 0;
#ifdef IN_PLACE
    /* The direct programs only (CPUs; the tiled kernel passes its VW keys in a private array,
     * and its programs leave this out): whole vectors below rend 16 keys at a time, where PoCL
     * made the loop below 8-wide masked code (window mask 2.50 ms against 2.61).
     * See docs/measurements.md#hide-keys. */
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
 * all -inf, so a mask of finite values costs one vector load a block (window 256: 6.2 ms
 * against 9.3). See docs/measurements.md#mask-hides-block. */
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

/* Mask block flags (MFLAGS; filled by mask_pass.cl, src/mask_pass.c: clattn__plan_mask_flags says when): a
 * mask that heads, batches or rows share is read once into one byte per mask row and 16-key
 * chunk (1: every key of the chunk is -inf) and a span per flag row (its first and one past its
 * last chunk with a visible key). fused_direct, fused_lanes and the tiled fused kernel decide
 * from the bytes which blocks the mask hides (HIDES_BLOCK), and first narrow their key range to
 * their rows' spans (NARROW_KEYS): blocks outside them cost nothing, and the first block starts
 * at the first visible chunk (rounded down to the copies' panel), not at a 256-key block edge.
 * fused_direct's K and V copies write only the panels some row of their kv head sees (the hull
 * of its rows' spans, mask_union).
 * Read once, not once a head: window 64 over 4096 keys 5.8 ms against 8.7; with the spans 4.9
 * against 8.1, with the copies' hulls 3.3 against 4.2. See docs/measurements.md#mflags.
 * The flags are an extra argument list after the common ones: byte base f_off and strides f_sb,
 * f_sh, f_ss (0 where the mask broadcasts), chunk c of a row at its row offset + c; then the
 * spans, two ints a flag row from int s_off of the same buffer, and f_nch, the chunks a row. */
/* Tile skipping in the kernels that cover a tile of packed rows (fused_tiled.cl, fused_mma.cl):
 * the nwi work-items (this one: lid) look for a (row, key) of rows r0 .. r0 + bm - 1 (below R)
 * and keys kt .. min(kt + bn, k_hi) - 1 that the mask leaves visible (before the row's causal
 * end), each stopping at its first, and write kt to `seen` when they find one: from the mask's
 * flags (MFLAGS: a work-item a row's 16-key chunk) or, with a mask, from the mask itself
 * (neighbouring work-items at neighbouring keys). Reads the kernel's own b, hk, group, seq_q,
 * causal, L, R, r0, kt, k_hi and mask (or flag) arguments. */
#if MFLAGS
#define MARK_SEEN_TILE(bm, bn, nwi, lid, seen)                                                     \
    do {                                                                                           \
        const int c0_ = kt / 16, nch_ = (min(kt + (bn), k_hi) - 1) / 16 - c0_ + 1;                 \
        for (int e_ = (lid); e_ < (bm) * nch_; e_ += (nwi)) {                                      \
            const int row_ = r0 + e_ / nch_, c_ = c0_ + e_ % nch_;                                 \
            if (row_ >= R)                                                                         \
                continue;                                                                          \
            const int pos_ = row_ % seq_q, hq_ = hk * group + row_ / seq_q;                        \
            const int end_ = min(min(kt + (bn), k_hi), causal_end(causal, pos_, seq_q, L));        \
            if (max(16 * c_, kt) < end_ && !mflags[MFLAG_ROW(b, hq_, pos_) + (ulong)c_]) {         \
                (seen) = kt;                                                                       \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#else
#define MARK_SEEN_TILE(bm, bn, nwi, lid, seen)                                                     \
    do {                                                                                           \
        for (int e_ = (lid); has_mask && e_ < (bm) * (bn); e_ += (nwi)) {                          \
            const int row_ = r0 + e_ / (bn), key_ = kt + e_ % (bn);                                \
            if (row_ >= R || key_ >= k_hi)                                                         \
                continue;                                                                          \
            const int pos_ = row_ % seq_q, hq_ = hk * group + row_ / seq_q;                        \
            const ulong mr_ = m_off + (ulong)b * m_sb + (ulong)hq_ * m_sh + (ulong)pos_ * m_ss;    \
            if (key_ < causal_end(causal, pos_, seq_q, L) && LD_MASK(mask, mr_ + key_) != NEG_INF) { \
                (seen) = kt;                                                                       \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#endif

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
