/* The rules the attention kernels share (fused_tiled.cl, fused_direct.cl, fused_lanes.cl,
 * decode.cl, decode_lanes.cl, fused_mma.cl, scores_variant.cl; assembled after common.cl, and the
 * user's score_mod / mask_mod, by src/program.c): the variants (windows, softcap, ALiBi, sinks,
 * the mods), the kernels' argument list, the work range of a work-group, which keys a row sees
 * (key lengths, causal range, window, mask) and how hidden keys are kept out, the mask flags
 * (MFLAGS) that mask_pass.cl computes, and the merge of two online-softmax states. */

/* ---- Variants (docs/variants.md): sliding and chunked windows, softcap, ALiBi, sinks and the
 * user's score_mod / mask_mod, compiled in by VARIANTS (bits V_*, src/variant.c sets them) with
 * their values as the arguments VARIANT_ARGS, which follow the kernel's others. Defined once
 * here: which keys a row sees (row_span: one interval [beg, end) per row, then mask_mod key by
 * key), the logit of a visible key (var_logit: softcap, the additive mask, ALiBi, score_mod), and
 * the sink's share of a finished row (sink_join). The kernels call these where they apply the
 * causal end and the mask; without VARIANTS they reduce to the plain rules. */
#define V_RANGE 1    /* window or chunk: a row's first key can be above 0 */
#define V_SOFTCAP 2
#define V_ALIBI 4
#define V_SINKS 8
#define V_SCORE_MOD 16
#define V_MASK_MOD 32
#define V_OFFSET 64 /* a slice of a longer sequence: p moves by q_offset - k_offset */
#ifndef VARIANTS
#define VARIANTS 0
#endif
/* Variants that change keys one by one: VAR_PER_KEY, all of them (the GPU kernels check every
 * tile then); VAR_GUARD, those that may hide a key (every block is checked: k_all 0), where
 * VAR_LOGIT (softcap, ALiBi) only change the logits of visible keys, which the CPU kernels apply
 * as vectors to blocks they do not check (var_logits16). */
#define VAR_PER_KEY (VARIANTS & (V_RANGE | V_SOFTCAP | V_ALIBI | V_SCORE_MOD | V_MASK_MOD))
#define VAR_GUARD (VARIANTS & (V_SCORE_MOD | V_MASK_MOD))
#define VAR_LOGIT (VARIANTS & (V_SOFTCAP | V_ALIBI))

#if VARIANTS
/* v_left / v_right: the window's sides, INT_MAX where unbounded (the host maps every side that
 * bounds nothing to it); v_chunk: 0 for none, else at most max(seq_kv, seq_q) + |v_delta| (without
 * a k_offset; CLATTN_MAX_SEQ with one); v_delta: q_offset - k_offset (V_OFFSET); v_korg: k_offset
 * mod chunk, where the call's keys start in chunk numbering; v_cap: the softcap,
 * 0 for none; ALiBi slopes f32 at v_a_off + b·v_a_sb + h·v_a_sh (v_a_sb 0 when batches share them);
 * sinks at v_s_off + h·v_s_sh. */
#define VARIANT_ARGS                                                                               \
    , int v_left, int v_right, int v_chunk, int v_delta, int v_korg, float v_cap,                      \
        __global const float *v_alibi,                                                                 \
        ulong v_a_off, ulong v_a_sb, ulong v_a_sh, __global const float *v_sinks, ulong v_s_off, ulong v_s_sh
typedef struct vparams {
    int left, right, chunk, delta, korg;
    float cap;
    __global const float *alibi;
    ulong a_off, a_sb, a_sh;
    __global const float *sinks;
    ulong s_off, s_sh;
} vparams;
#define VP_MAKE {v_left, v_right, v_chunk, v_delta, v_korg, v_cap, v_alibi, v_a_off, v_a_sb, v_a_sh, v_sinks, v_s_off, v_s_sh}
#else
#define VARIANT_ARGS
typedef struct vparams {
    int none;
} vparams;
#define VP_MAKE {0}
#endif

/* A row's context for the per-key rules: batch, query head, diagonal position p = i + L - seq_q,
 * first visible key, ALiBi slope. */
typedef struct vrow {
    int b, h, p, beg;
    float slope;
} vrow;

/* Row i (of seq_q; query head hq of batch b, L keys): fills *r and returns one past the last key
 * it may see (causal, the window's right side, its chunk; may be <= r->beg: no key). In 32-bit
 * ints without overflow: p lies in (-2^31, 2^31 - 2^20), the window's sides are compared before
 * they are added, and a chunk's bounds are computed in 64 bits. */
/* The diagonal position of row i (of seq_q; L keys): i + L - seq_q, moved by q_offset - k_offset
 * (V_OFFSET). */
inline int row_pos(int i, int seq_q, int L, const vparams *vp)
{
#if VARIANTS & V_OFFSET
    return i + (L - seq_q) + vp->delta;
#else
    return i + (L - seq_q);
#endif
}

inline int row_span(int causal, int i, int seq_q, int L, int b, int hq, const vparams *vp, vrow *r)
{
    r->b = b;
    r->h = hq;
    r->p = row_pos(i, seq_q, L, vp);
    r->beg = 0;
    r->slope = 0.0f;
#if VARIANTS & V_OFFSET
    int end = causal ? clamp(r->p + 1, 0, L) : L;
#else
    int end = causal_end(causal, i, seq_q, L);
#endif
#if VARIANTS & V_RANGE
    const int p = r->p;
    if (vp->left < p)
        r->beg = p - vp->left;
    if ((long)vp->right < (long)L - 1 - (long)p) /* p + right + 1 < L */
        end = min(end, p + vp->right + 1);
    if (vp->chunk > 0) {
        /* chunks counted from the keys' global origin: key j at korg + j (k_offset mod chunk) */
        const long pg = (long)p + vp->korg;
        const long c = pg >= 0 ? pg / vp->chunk : -((-pg - 1) / vp->chunk) - 1;
        const long cs = c * vp->chunk - vp->korg, ce = cs + vp->chunk;
        r->beg = max(r->beg, (int)clamp(cs, 0L, (long)L));
        end = min(end, (int)clamp(ce, 0L, (long)L));
    }
#endif
#if VARIANTS & V_ALIBI
    r->slope = vp->alibi[vp->a_off + (ulong)b * vp->a_sb + (ulong)hq * vp->a_sh];
#endif
    return end;
}

/* One past the last key row i may see by the causal rule alone (p moved by V_OFFSET). */
inline int row_end(int causal, int i, int seq_q, int L, const vparams *vp)
{
#if VARIANTS & V_OFFSET
    return causal ? clamp(row_pos(i, seq_q, L, vp) + 1, 0, L) : L;
#else
    return causal_end(causal, i, seq_q, L);
#endif
}

/* Whether key (below the row's end) is visible: at or past its first key, and mask_mod. */
inline int var_visible(int key, const vrow *r)
{
#if VARIANTS & V_MASK_MOD
    return key >= r->beg && mask_mod(r->b, r->h, r->p, key) != 0;
#else
    return key >= r->beg;
#endif
}

/* The softcap c·tanh(s / c) in a form that vectorises (the built-in tanh is a library call per
 * lane on PoCL: softcap cost 4.2 times plain attention): c·(1 - t)/(1 + t) with t = e^(-2|s|/c)
 * from exp2p, the sign of s put back. Its error is absolute, about an ulp of c whatever s is
 * (near 0, where 1 - t cancels, the logit is itself below an ulp of c's order of error), which is
 * what a softmax sees: logits shift-invariant, their absolute errors alone matter. An odd Taylor
 * polynomial below |s/c| = 1/4, for relative accuracy there, took softcap from 1.09-1.11 times
 * plain attention to 1.15-1.16 (B1 H8 S1024 d64, PoCL) and bought nothing the output can show;
 * Newton's reciprocal instead of the division was no faster, a rational x·P(x²)/Q(x²) no faster
 * and 3 times less accurate (docs/measurements.md#softcap).
 * +-c at +-inf; NaN stays NaN. k2 = -2·log2(e)/c from the host's c: multiplications, no
 * division by c.
 * Above SOFTCAP_POLY_MIN that absolute error outgrows the logits (c 1e8: 1.5 on logits of 33; from
 * 1e10 every logit came out 0), so a cap that large, which no model uses, takes the odd Taylor
 * polynomial of tanh to y^11 for |y| = |s/c| < 1/4 (relative error below 1e-9 there) and the form
 * above elsewhere, where |c·tanh(y)| >= 0.24·c: relative accuracy throughout. The branch is on c
 * alone, uniform, so caps of models' sizes (30, 50) pay nothing. */
#define SOFTCAP_POLY_MIN 64.0f
#define DEFINE_SOFTCAP(NAME, FT, EXP2)                                                            \
    inline FT NAME(FT s, float c)                                                                 \
    {                                                                                             \
        const float k2 = -2.0f * LOG2E / c;                                                       \
        const FT t = EXP2(fabs(s) * (FT)(k2));                                                    \
        FT r = copysign((FT)(c) * ((FT)(1.0f) - t) / ((FT)(1.0f) + t), s);                       \
        if (c > SOFTCAP_POLY_MIN) { /* c·tanh(y) = s·(1 + y²·P(y²)): from s, so that y = s/c  \
                                       * flushed to 0 (c past 2^126) still gives s */             \
            const FT y = s * (FT)(1.0f / c), y2 = y * y;                                         \
            const FT p = MAD(y2, MAD(y2, MAD(y2, MAD(y2, (FT)(-1382.0f / 155925.0f), (FT)(62.0f / 2835.0f)), \
                                             (FT)(-17.0f / 315.0f)), (FT)(2.0f / 15.0f)), (FT)(-1.0f / 3.0f)); \
            r = select(r, MAD(s * y2, p, s), fabs(y) < (FT)(0.25f));                             \
        }                                                                                         \
        return r;                                                                                 \
    }
DEFINE_SOFTCAP(softcap1, float, exp2p)
DEFINE_SOFTCAP(softcap16, float16, exp2p16)

/* The logit of a visible key from its scaled score s, in DESIGN.md's order: the softcap, the mask
 * value mv (-inf hides the key whatever s is), ALiBi, -slope·|p - key|, then score_mod. */
inline float var_logit(float s, float mv, int key, const vrow *r, const vparams *vp)
{
#if VARIANTS & V_SOFTCAP
    s = softcap1(s, vp->cap);
#endif
    if (mv == NEG_INF)
        return NEG_INF;
    s += mv;
#if VARIANTS & V_ALIBI
    s -= r->slope * (float)abs((long)r->p - (long)key);
#endif
#if VARIANTS & V_SCORE_MOD
    s = score_mod(s, r->b, r->h, r->p, key);
#endif
    return s;
}

/* The final logit of key for a row whose keys end at rend: -inf when hidden (past rend, before
 * the row's first key, mask_mod, mask -inf), else var_logit with the row's mask entry. */
inline float var_key(float s, int key, int rend, const vrow *r, const vparams *vp, int has_mask,
                     __global const T_MASK *mask, ulong mrow)
{
    if (key >= rend || !var_visible(key, r))
        return NEG_INF;
    return var_logit(s, has_mask ? LD_MASK(mask, mrow + key) : 0.0f, key, r, vp);
}

/* |p - key| lane by lane, as floats: wrapping differences (as_uint), exact for every key a row
 * sees (p - key lies in (-seq_q, 2^31) there); the other lanes are hidden anyway. */
inline float16 alibi_dist16(int16 p, int16 key)
{
    return convert_float16(abs(as_int16(as_uint16(p) - as_uint16(key))));
}

/* The softcap and ALiBi (VAR_LOGIT) on the scores of 16 visible keys key0 .. key0+15 of one row,
 * or (var_rows16) of one key for 16 rows of positions p and slopes slope. */
inline float16 var_logits16(float16 s, int key0, const vrow *r, const vparams *vp)
{
#if VARIANTS & V_SOFTCAP
    s = softcap16(s, vp->cap);
#endif
#if VARIANTS & V_ALIBI
    s -= (float16)(r->slope) *
         alibi_dist16((int16)(r->p), (int16)(key0) + (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
#endif
    return s;
}
inline float16 var_rows16(float16 s, int key, int16 p, float16 slope, const vparams *vp)
{
#if VARIANTS & V_SOFTCAP
    s = softcap16(s, vp->cap);
#endif
#if VARIANTS & V_ALIBI
    s -= slope * alibi_dist16(p, (int16)(key));
#endif
    return s;
}

/* var_key on one key for 16 rows (fused_lanes: lane i is row 16·lv + i, vr the first of them):
 * their ends rend, first keys beg, positions p and slopes; the mask entries are read lane by
 * lane. */
inline float16 var_rows_key16(float16 s, int key, int16 rend, int16 beg, int16 p, float16 slope, const vrow *vr,
                              const vparams *vp, int has_mask, __global const T_MASK *mask, const ulong *mrow)
{
#if VARIANTS & V_SOFTCAP
    s = softcap16(s, vp->cap);
#endif
    union {
        float16 v;
        float f[16];
    } su = {s}, mu = {(float16)(0.0f)};
    union {
        int16 v;
        int i[16];
    } hu = {((int16)(key) >= rend) | ((int16)(key) < beg)};
    for (int e = 0; e < 16; e++) {
        if (hu.i[e])
            continue;
#if VARIANTS & V_MASK_MOD
        hu.i[e] = mask_mod(vr[e].b, vr[e].h, vr[e].p, key) ? 0 : -1;
#endif
        if (has_mask && !hu.i[e])
            mu.f[e] = LD_MASK(mask, mrow[e] + (ulong)key);
    }
    hu.v |= mu.v == (float16)(NEG_INF);
    su.v += mu.v;
#if VARIANTS & V_ALIBI
    su.v -= slope * alibi_dist16(p, (int16)(key));
#endif
#if VARIANTS & V_SCORE_MOD
    for (int e = 0; e < 16; e++)
        if (!hu.i[e])
            su.f[e] = score_mod(su.f[e], vr[e].b, vr[e].h, vr[e].p, key);
#endif
    return select(su.v, (float16)(NEG_INF), hu.v);
}

/* var_key on the 16 keys key0 .. key0+15 of one row (fused_direct, fused_tiled on CPUs, the
 * backward's bwd_rows): the softcap, mask and ALiBi as vectors, mask_mod and score_mod lane by
 * lane. */
inline float16 var_keys16(float16 s, int key0, int rend, const vrow *r, const vparams *vp, int has_mask,
                          __global const T_MASK *mask, ulong mrow, float16 *capped)
{
    const int16 key = (int16)(key0) + (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int16 hid = (key >= (int16)(rend)) | (key < (int16)(r->beg));
#if VARIANTS & V_SOFTCAP
    s = softcap16(s, vp->cap);
#endif
    if (capped) /* the softcapped scores, for the backward's derivative (NULL: not wanted) */
        *capped = s;
#if VARIANTS & V_MASK_MOD
    union {
        int16 v;
        int i[16];
    } hu = {hid};
    for (int e = 0; e < 16; e++)
        if (!hu.i[e])
            hu.i[e] = mask_mod(r->b, r->h, r->p, key0 + e) ? 0 : -1;
    hid = hu.v;
#endif
    if (has_mask) {
        float16 mv;
        if (key0 + 15 < rend) {
            mv = LD16_MASK(mask, mrow + (ulong)key0);
        } else {
            float t[16];
            for (int e = 0; e < 16; e++)
                t[e] = key0 + e < rend ? LD_MASK(mask, mrow + (ulong)(key0 + e)) : 0.0f;
            mv = vload16(0, t);
        }
        hid |= mv == (float16)(NEG_INF);
        s += mv;
    }
#if VARIANTS & V_ALIBI
    s -= (float16)(r->slope) * alibi_dist16((int16)(r->p), key);
#endif
#if VARIANTS & V_SCORE_MOD
    union {
        float16 v;
        float f[16];
    } su = {s};
    union {
        int16 v;
        int i[16];
    } vu = {hid};
    for (int e = 0; e < 16; e++)
        if (!vu.i[e])
            su.f[e] = score_mod(su.f[e], r->b, r->h, r->p, key0 + e);
    s = su.v;
#endif
    return select(s, (float16)(NEG_INF), hid);
}

/* A finished row (running maximum m, sum l, empty: no visible key) with the sink of query head
 * hq: returns the factor of its normalised output and writes its LSE, the sink included:
 * lse' = log(e^lse + e^s), o' = o·e^(lse - lse'). Without sinks, or with splits (merge.cl adds
 * the sink then), the factor is 1 and the LSE m + log(l). s = -inf changes nothing, bit for bit;
 * an empty row gets LSE s (its o is 0), whatever s holds; s = +inf or NaN makes the other rows NaN
 * (docs/variants.md). */
inline float sink_join(float m, float l, int empty, int hq, int splits, const vparams *vp, float *lse)
{
    const float lse0 = empty ? NEG_INF : m + log(l);
    *lse = lse0;
#if VARIANTS & V_SINKS
    if (splits == 1) {
        const float s = vp->sinks[vp->s_off + (ulong)hq * vp->s_sh];
        if (s == NEG_INF || isnan(lse0))
            return 1.0f;
        if (empty) {
            *lse = s;
            return 0.0f;
        }
        /* +inf is no logit: e^(s - M) / e^(s - M) is NaN, and so is the row, as with NaN s */
        if (s == INFINITY) {
            *lse = NAN;
            return NAN;
        }
        const float d = s - lse0; /* NaN s: NaN row */
        if (d <= 0.0f) {
            const float e = exp(d);
            *lse = lse0 + log1p(e);
            return 1.0f / (1.0f + e);
        }
        const float e = exp(-d);
        *lse = s + log1p(e);
        return isnan(d) ? d : e / (1.0f + e);
    }
#endif
    return 1.0f;
}

/* 1 when key is visible to one of the nr rows whose ends (causal range, key length, window;
 * 0 for a row past the block) are rend[], whose variant contexts are vr[] (first key, mask_mod)
 * and whose mask rows start at mask[mrow[]]: the key lies in the row's span and its mask entry
 * is not -inf. The GPU decode kernels read the K and V rows of such keys only, so that a sliding
 * window's hidden past costs a mask entry per row, not its K and V rows. */
inline int key_seen(__global const T_MASK *mask, int has_mask, const ulong *mrow, const int *rend,
                    const vrow *vr, int nr, int key)
{
    for (int i = 0; i < nr; i++)
        if (key < rend[i] && var_visible(key, &vr[i]) && (!has_mask || LD_MASK(mask, mrow[i] + key) != NEG_INF))
            return 1;
    return 0;
}
/* Whether the decode kernels test keys one by one before reading their K rows. */
#define KEY_TEST(has_mask) ((has_mask) || (VARIANTS & (V_RANGE | V_MASK_MOD)))

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
 * decode.cl), set in this order by clattn__fused_launch in src/fused.c; TK and TV are the
 * element types of K and V (kv_access.cl: T_K and T_V as stored, float for the CPU copies). */
#define ATTN_KERNEL_ARGS(TK, TV)                                                                \
    __global const T_IN *Q, ulong q_off, ulong q_sb, ulong q_sh, ulong q_ss,                    \
        __global const TK *K, ulong k_off, ulong k_sb, ulong k_sh, ulong k_ss,                  \
        __global const TV *V, ulong v_off, ulong v_sb, ulong v_sh, ulong v_ss,                  \
        __global T_OUT *O, ulong o_off, ulong o_sb, ulong o_sh, ulong o_ss,                     \
        __global float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,                   \
        __global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh, ulong m_ss,           \
        __global const int *kvlen, ulong o_split, ulong l_split, int seq_q, int seq_kv,         \
        int heads_kv, int group, int D, int DV, int causal, int has_mask, int has_lse,          \
        int splits, int split_len, float scale

/* What one work-group covers: grid z = (batch·heads_kv + kv head)·splits + split, packed rows
 * r0..r1, and the keys [k_lo, k_hi) of its split that those rows may see (causal: the positions
 * of the first and last rows bound the range of all), every row seeing the keys in
 * [k_vis, k_all) (k_vis 0 but with a window or chunk, whose rows start at different keys).
 * The batch's query rows: sq (seq_q, or its packed sequence's length, VARLEN) from row q0 of Q,
 * O and LSE; its keys from row k0 of K and V (0 but for packed K/V). */
typedef struct work_range {
    int split, z, b, hk, L, k_lo, k_hi, k_all, k_vis;
    int q0, sq, k0;
} work_range;

/* Copies the nr packed query rows r0.. of kv head (b, hk) to local memory, row r at
 * dst + r·pitch (pitch a multiple of 4 floats, dst 16-byte aligned), as dp / 4 float4 each:
 * zero past head_dim D and for rows at or past R = group·seq_q or past the batch's w->sq. Qb =
 * Q + q_off + b·q_sb, row i of the batch at w->q0 + i; the nwi work-items of the group share the
 * copy (lid their index); the caller's barrier follows. */
inline void stage_q_rows(__local float *dst, int pitch, int nr, int dp, int lid, int nwi,
                         __global const T_IN *Qb, ulong q_sh, ulong q_ss, int hk, int group,
                         int seq_q, int R, int r0, int D, const work_range *w)
{
    for (int e = lid; e < nr * (dp / 4); e += nwi) {
        const int r = e / (dp / 4), d = 4 * (e % (dp / 4));
        const int row = r0 + r;
        float4 x = (float4)(0.0f);
        const int hq = hk * group + row / seq_q, i = row % seq_q;
        if (row < R && i < w->sq)
            x = row_load4(Qb + (ulong)hq * q_sh + (ulong)(w->q0 + i) * q_ss, d, D);
        vstore4(x, 0, dst + r * pitch + d);
    }
}


inline work_range work_range_of(int zz, int splits, int split_len, int heads_kv, int seq_q,
                                int seq_kv, int causal, __global const int *kvlen, int r0, int r1,
                                int step, const vparams *vp, const kv_seqs *ks)
{
    work_range w;
    w.split = zz % splits;
    w.z = zz / splits;
    w.b = w.z / heads_kv;
    w.hk = w.z % heads_kv;
    w.L = keys_of_batch(kvlen, w.b, seq_kv);
    w.q0 = 0;
    w.sq = seq_q;
    w.k0 = 0;
#if VARLEN
    if (ks->cu_q) {
        const int2 s = packed_seq(ks->cu_q, w.b, seq_q, ks->total_q);
        w.q0 = s.x;
        w.sq = s.y;
    }
    if (ks->cu_k) {
        const int2 s = packed_seq(ks->cu_k, w.b, seq_kv, ks->total_k);
        w.k0 = s.x;
        w.L = min(w.L, s.y);
    }
#endif
    const int spans = (r0 / seq_q) != (r1 / seq_q);
    const int i_min = spans ? 0 : r0 % seq_q;
    /* A packed sequence shorter than seq_q (VARLEN): its rows past w.sq are dead, and a block of
     * dead rows alone has no keys to see (its range below comes out empty). */
    const int i_max = min(spans ? seq_q - 1 : r1 % seq_q, max(w.sq - 1, i_min));
    w.k_lo = w.split * split_len; /* below seq_kv: the host makes (splits - 1)·split_len < seq_kv */
    /* k_lo + split_len may pass INT_MAX for the last split of a long range: compare instead. */
    const int end = split_len >= w.L - w.k_lo ? w.L : w.k_lo + split_len;
    vrow first, last;
    const int end_min = row_span(causal, i_min, w.sq, w.L, w.b, 0, vp, &first);
    const int end_max = row_span(causal, i_max, w.sq, w.L, w.b, 0, vp, &last);
    w.k_hi = min(end, end_max);
    w.k_all = min(w.k_hi, end_min);
    w.k_vis = last.beg; /* the first key the last row sees: every row sees it on */
#if VARIANTS & V_RANGE
    /* A window's or chunk's first key grows with the row: the first row's is the block's. The
     * range starts at it, rounded down to the kernel's step from the split's start. */
    if (first.beg > w.k_lo)
        w.k_lo += (first.beg - w.k_lo) / step * step;
#endif
#if VAR_GUARD
    w.k_all = 0; /* every block is checked key by key */
#endif
#if VARLEN
    if (i_min >= w.sq)
        w.k_hi = w.k_lo;
#endif
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
                      ulong mrow, const vrow *vr, const vparams *vp)
{
#if VAR_PER_KEY
    /* The variants: one rule a key, mask and all, 16 keys a vector (var_keys16), then var_key. */
    {
        int e = 0;
        for (; e + 16 <= n; e += 16)
            vstore16(var_keys16(vload16(0, t + e), key0 + e, rend, vr, vp, has_mask, mask, mrow, NULL), 0, t + e);
        for (; e < n; e++)
            t[e] = var_key(t[e], key0 + e, rend, vr, vp, has_mask, mask, mrow);
        return;
    }
#endif
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

/* 1 when no row of the block sees a key of kt .. kt+n-1 by the variants' rules (its first key,
 * mask_mod; the mask aside): the CPU kernels skip such blocks as they skip those the mask hides.
 * mask_mod is evaluated key by key up to the first visible one. */
inline int var_hides_block(int rows, const int *rend, const vrow *vr, int kt, int n)
{
#if VARIANTS & (V_RANGE | V_MASK_MOD)
    for (int i = 0; i < rows; i++)
        for (int key = max(kt, vr[i].beg), e = min(kt + n, rend[i]); key < e; key++) {
#if VARIANTS & V_MASK_MOD
            if (var_visible(key, &vr[i]))
                return 0;
#else
            return 0;
#endif
        }
    return 1;
#else
    return 0;
#endif
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
 * causal, L, R, r0, kt, k_hi, w and mask (or flag) arguments. */
#if MFLAGS
#define MARK_SEEN_TILE(bm, bn, nwi, lid, seen)                                                     \
    do {                                                                                           \
        const int c0_ = kt / 16, nch_ = (min(kt + (bn), k_hi) - 1) / 16 - c0_ + 1;                 \
        for (int e_ = (lid); e_ < (bm) * nch_; e_ += (nwi)) {                                      \
            const int row_ = r0 + e_ / nch_, c_ = c0_ + e_ % nch_;                                 \
            if (row_ >= R)                                                                         \
                continue;                                                                          \
            const int pos_ = row_ % seq_q, hq_ = hk * group + row_ / seq_q;                        \
            const int end_ = min(min(kt + (bn), k_hi), row_end(causal, pos_, w.sq, L, &vp));       \
            if (max(16 * c_, kt) < end_ && !mflags[MFLAG_ROW(b, hq_, pos_) + (ulong)c_]) {         \
                (seen) = kt;                                                                       \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#else
#define MARK_SEEN_TILE(bm, bn, nwi, lid, seen)                                                     \
    do {                                                                                           \
        for (int e_ = (lid); TILE_TEST(has_mask) && e_ < (bm) * (bn); e_ += (nwi)) {               \
            const int row_ = r0 + e_ / (bn), key_ = kt + e_ % (bn);                                \
            if (row_ >= R || key_ >= k_hi)                                                         \
                continue;                                                                          \
            const int pos_ = row_ % seq_q, hq_ = hk * group + row_ / seq_q;                        \
            const ulong mr_ = m_off + (ulong)b * m_sb + (ulong)hq_ * m_sh + (ulong)pos_ * m_ss;    \
            vrow vr_;                                                                              \
            if (key_ < row_span(causal, pos_, w.sq, L, b, hq_, &vp, &vr_) && var_visible(key_, &vr_) && \
                (!has_mask || LD_MASK(mask, mr_ + key_) != NEG_INF)) {                             \
                (seen) = kt;                                                                       \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#endif
/* Whether the tile kernels test their tiles with MARK_SEEN_TILE: a mask, or mask_mod (with the
 * mask's flags, MFLAGS, the test reads the flags alone: a tile mask_mod hides may then run, its
 * keys hidden one by one). */
#define TILE_TEST(has_mask) ((has_mask) || (VARIANTS & V_MASK_MOD))

#if MFLAGS
#define MFLAG_ARGS                                                                                 \
    , __global const uchar *mflags, ulong f_off, ulong f_sb, ulong f_sh, ulong f_ss, ulong s_off, \
        int f_nch
#define MFLAG_ROW(b, hq, pos) (f_off + (ulong)(b) * f_sb + (ulong)(hq) * f_sh + (ulong)(pos) * f_ss)
/* The keys of a row block that some row of it may see, from the rows' spans (mask_spans below):
 * k_lo moves up by whole steps of `step` keys (a multiple of 16; every kernel now takes 16, and
 * fused_direct reads its Kᵀ panels from any 16-key vector), to the step holding the first 16-key
 * chunk some row sees, and the first block starts there; k_hi comes down to the end of the last
 * such chunk. No such chunk: k_hi <= k_lo. A row's flags lie less than 2^28 bytes from f_off
 * (MASK_FLAGS_MAX, src/fused.c), so its index is a 32-bit division (a 64-bit one is a long
 * routine on GPUs). */
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

/* ---- Dropout (docs/training.md#dropout): DROPOUT 1 (the host's, with desc->dropout_p > 0) adds
 * DROP_ARGS after the kernel's others. Key c (global: j + k_offset) of the row with global index
 * r (p + k_offset) of query head h of batch b is kept iff a 16-bit half of Philox-4x32-10's output
 * is at least d_thr; all words 32-bit and wrapping. The counter's first word is
 * 16·floor(c / 128) + c mod 16 and the output word (c / 32) mod 4, half (c / 16) mod 2 (0 the
 * low one): the 16 keys of an aligned vector take one half of one word of 16 consecutive
 * counters, so 128 keys cost one Philox evaluation of 16 lanes (drop_group16), where one per
 * 16 keys cost PoCL ... of a forward's time; the other counter words are r, b·heads_q + h and
 * the caller's offset; the key, the caller's seed. */
#ifndef DROPOUT
#define DROPOUT 0
#endif
#if DROPOUT
#define DROP_ARGS , uint d_k0, uint d_k1, uint d_off, uint d_thr, float d_scale, uint d_roff, uint d_coff, int d_hq
typedef struct dparams {
    uint k0, k1, off, thr;
    float scale;     /* 1 / (1 - p) */
    uint roff, coff; /* q_offset and k_offset mod 2^32: r = i + L - seq_q + q_offset, c = j + k_offset */
    int hq;          /* heads_q */
} dparams;
#define DP_MAKE {d_k0, d_k1, d_off, d_thr, d_scale, d_roff, d_coff, d_hq}
#else
#define DROP_ARGS
#endif

/* Philox-4x32-10 of 16 counters (c0 per lane; c1, c2, c3 shared) under key (k0, k1). The state
 * lives in 64-bit lanes (two ulong8 a word), where each round's 32x32 -> 64-bit products are one
 * multiplication each (vpmuludq) and their halves a shift and a mask: with uint16 state, mul_hi
 * and the low product cost PoCL 1.5 times as much alone and 3 times with two evaluations side by
 * side (84 against 120 and 237 ns an evaluation of 16 lanes, 2-core AMD EPYC, AVX-512). */
inline void philox16(uint16 c0, uint c1, uint c2, uint c3, uint k0, uint k1, uint16 *x)
{
    const ulong8 lo32 = (ulong8)(0xffffffffUL);
    ulong8 a0 = convert_ulong8(c0.lo), a1 = convert_ulong8(c0.hi);
    ulong8 b0 = (ulong8)(c1), b1 = b0, c0_ = (ulong8)(c2), c1_ = c0_, d0 = (ulong8)(c3), d1 = d0;
#pragma unroll
    for (int n = 0; n < 10; n++) {
        const ulong8 p0 = a0 * (ulong8)(0xD2511F53u), p1 = a1 * (ulong8)(0xD2511F53u);
        const ulong8 q0 = c0_ * (ulong8)(0xCD9E8D57u), q1 = c1_ * (ulong8)(0xCD9E8D57u);
        a0 = (q0 >> 32) ^ b0 ^ (ulong8)(k0);
        a1 = (q1 >> 32) ^ b1 ^ (ulong8)(k0);
        b0 = q0 & lo32;
        b1 = q1 & lo32;
        c0_ = (p0 >> 32) ^ d0 ^ (ulong8)(k1);
        c1_ = (p1 >> 32) ^ d1 ^ (ulong8)(k1);
        d0 = p0 & lo32;
        d1 = p1 & lo32;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    x[0] = (uint16)(convert_uint8(a0), convert_uint8(a1));
    x[1] = (uint16)(convert_uint8(b0), convert_uint8(b1));
    x[2] = (uint16)(convert_uint8(c0_), convert_uint8(c1_));
    x[3] = (uint16)(convert_uint8(d0), convert_uint8(d1));
}

#define LANES16 ((uint16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))

#if DROPOUT
/* The multipliers (0 or 1 / (1 - p)) of 16 halves u against the threshold, times w. */
inline float16 drop_keep16(uint16 u, float w, const dparams *dp)
{
    return select((float16)(0.0f), (float16)(w * dp->scale), u >= (uint16)(dp->thr));
}

/* The outputs of the 128-key group g (keys 128·g .. 128·g + 127, global and mod 2^32) of row r of
 * head bh (b·heads_q + h). */
inline void drop_group16(uint g, uint r, uint bh, const dparams *dp, uint16 *x)
{
    philox16((uint16)(g << 4) + LANES16, r, bh, dp->off, dp->k0, dp->k1, x);
}

/* The multipliers of the aligned vector of global keys c0 .. c0 + 15 (c0 a multiple of 16) from
 * its group's outputs x. */
inline float16 drop_pick16(const uint16 *x, uint c0, float wt, const dparams *dp)
{
    const uint16 w = x[(c0 >> 5) & 3];
    return drop_keep16((c0 >> 4) & 1 ? w >> 16 : w & (uint16)(0xffff), wt, dp);
}

/* The multipliers of any 16 consecutive global keys c0 .. c0 + 15 of row r, head bh: one Philox
 * evaluation per lane's own counter (keys an offset not a multiple of 16 puts across groups). */
inline float16 drop_any16(uint c0, uint r, uint bh, const dparams *dp)
{
    if ((c0 & 15) == 0) {
        uint16 x[4];
        drop_group16(c0 >> 7, r, bh, dp, x);
        return drop_pick16(x, c0, 1.0f, dp);
    }
    const uint16 c = (uint16)(c0) + LANES16;
    uint16 x[4];
    philox16(((c >> 7) << 4) + (c & (uint16)(15)), r, bh, dp->off, dp->k0, dp->k1, x);
    const uint16 wi = (c >> 5) & (uint16)(3);
    const uint16 w = select(select(x[0], x[1], wi == (uint16)(1)), select(x[2], x[3], wi == (uint16)(3)),
                            wi >= (uint16)(2));
    return drop_keep16(select(w & (uint16)(0xffff), w >> 16, ((c >> 4) & (uint16)(1)) != (uint16)(0)), 1.0f, dp);
}

/* Multiplies the nv vectors of probabilities t[] of the keys key0 .. of row i (of seq_q, L keys)
 * of query head hq of batch b by their dropout multipliers times w (the normalisation). */
inline void drop_row(float16 *t, int nv, int key0, int i, int seq_q, int L, int b, int hq, float w,
                     const dparams *dp)
{
    const uint r = (uint)(i + (L - seq_q)) + dp->roff, bh = (uint)(b * dp->hq + hq);
    const uint c0 = (uint)key0 + dp->coff;
    if ((c0 & 15) != 0) {
        for (int v = 0; v < nv; v++)
            t[v] *= drop_any16(c0 + 16u * (uint)v, r, bh, dp) * w;
        return;
    }
    /* the keys' 128-key groups two at a time: g and g + 1 into x[0..3] and x[4..7] */
    uint16 x[8];
    uint g = 0;
    for (int v = 0; v < nv; v++) {
        const uint c = c0 + 16u * (uint)v;
        if (v == 0 || (c >> 7) - g >= 2u) {
            g = c >> 7;
            philox16((uint16)(g << 4) + LANES16, r, bh, dp->off, dp->k0, dp->k1, x);
            philox16((uint16)((g + 1u) << 4) + LANES16, r, bh, dp->off, dp->k0, dp->k1, x + 4);
        }
        t[v] *= drop_pick16(x + 4 * ((c >> 7) - g), c, w, dp);
    }
}
#endif
