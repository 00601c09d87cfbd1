/* Fused attention on the matrix units, `fused_mma`, written once over the tile layer (mma.cl,
 * mma_layout.cl): NVIDIA's mma.sync on GPUs with compute capability 8.0 and up, the emulation of
 * the same fragments everywhere else (CLATTN_MATRIX=emulate). Shared rules (arguments, work
 * ranges, masks, key splits): attn_common.cl; the host side: src/fused_mma.c.
 *
 * Rows are packed as in the tiled kernel (row r of kv head hk is query head hk·group + r / seq_q,
 * position r % seq_q). A work-group of NW warps takes BM = 16·NW packed rows, each warp 16 of
 * them, so a row's softmax never leaves its warp: lane (g, t) holds columns 2t, 2t + 1 of every
 * 8-key n-tile in rows g and g + 8 (mma_layout.cl), and the row maximum and sum are reduced over
 * the 4 lanes of a row (xor 1, 2). Per tile of BN keys:
 *   K (row-major, = Bᵀ) and V (transposed) are staged in local memory as stored (16-bit values'
 *   bits, or f32); S = Q·Kᵀ on the matrix unit, Q's fragments kept in registers (QREG) or
 *   reloaded from local memory (wide heads); scale, hidden keys -inf (causal, key lengths, the
 *   mask added), the online softmax on the C fragments; P packed into A fragments in registers
 *   (mma_p_pack: rounded to the input type; f32 inputs: split for 3xTF32); O += P·V on the
 *   matrix unit, O in f32 accumulators.
 * Wide f32 heads: a work-group may take DVP of head_dim_v's columns only (grid x: the column
 * blocks, each computing S again), which keeps 3xTF32's two accumulators within the registers.
 * Weights. f16: P is scaled by 2^15 before its rounding to f16, which keeps weights down to
 * 2^-29 normal (f16 subnormals start at 2^-14), and O is summed unnormalised (|V| <= 65504
 * keeps it far from overflow) and divided by the row sum at the end. bf16 and f32, whose V may
 * reach FLT_MAX: O is kept normalised at half scale as in the tiled kernel, o' = o·(l·α/l') +
 * (p·O_WEIGHT/l')·V, with the weights normalised before their rounding (bf16 keeps f32's range).
 * Hidden keys: weight -0 (HIDDEN_P). A product with the matrix unit cannot skip them, and
 * 0·Inf = NaN: a tile whose keys some row hides (guarded) and whose V holds Inf or NaN takes an
 * exact path instead, each lane summing its O elements key by key from the weights it fetches
 * from the lanes that hold them, skipping hidden keys (the tiled kernel's rule). */

#ifndef NW
#define NW 4 /* warps: BM = 16·NW packed rows */
#endif
#ifndef BN
#define BN 64 /* keys a tile, a multiple of 16 */
#endif
#ifndef DP
#define DP 64 /* head_dim rounded up to MMA_K */
#endif
#ifndef DVP
#define DVP 64 /* O columns a work-group: head_dim_v rounded up to 8, or a block of them */
#endif
#ifndef QREG
#define QREG 1 /* Q's fragments in registers */
#endif

#define BM (MMA_M * NW)
#define NWI (MMA_LANES * NW)
#define QP (DP + MMA_PAD) /* row pitches in local memory */
#define KP (DP + MMA_PAD)
#define VP (BN + MMA_PAD)
/* V in local memory: transposed (element (key n, column c) at c·VP + n), or with MMA_LDSM row by
 * row as stored (n·VR + c), which ldmatrix's .trans reads as the transposed fragments. */
#if MMA_LDSM
/* a pitch of an odd number of 16-byte units: the 8 rows an ldmatrix reads hit 8 different
 * 4-bank groups (DVP + 8 with DVP / 8 odd shared banks between rows: 2- to 8-way) */
#define VR ((DVP + 15) / 16 * 16 + MMA_PAD)
#define V_ELEMS (BN * VR)
#define V_AT(n, c) (V_OFF + (n) * VR + (c))
#else
#define V_ELEMS (DVP * VP)
#define V_AT(n, c) (V_OFF + (c) * VP + (n))
#endif
#define NT (BN / MMA_N)  /* n-tiles of S */
#define KB (BN / MMA_K)  /* k-blocks of P */
#define DT (DVP / MMA_N) /* n-tiles of O */
#define QK (DP / MMA_K)  /* k-steps of S */
#if QREG /* Q is staged once, then K and V take its place */
#define Q_OFF 0
#define K_OFF 0
#define SM_ELEMS (BM * QP > BN * KP + V_ELEMS ? BM * QP : BN * KP + V_ELEMS)
#else
#define Q_OFF 0
#define K_OFF (BM * QP)
#define SM_ELEMS (BM * QP + BN * KP + V_ELEMS)
#endif
#define V_OFF (K_OFF + BN * KP)

/* Chunks of a row as stored: 4 floats, or 8 16-bit values as a uint4 (element 2j the low half
 * of word j): 16-bit vectors of 8 became pairs of 8-byte loads and stores in PTX. */
#if DT_IN == 0
#define CH 4
#define tlv float4
#define TLV_NONFINITE(x) any((as_uint4(x) & 0x7f800000u) == 0x7f800000u)
#else
#define CH 8
#define tlv uint4
#if DT_IN == 1
#define TLV_EXP 0x7c00u
#else
#define TLV_EXP 0x7f80u
#endif
#define TLV_NONFINITE(x) any(((x) & TLV_EXP) == TLV_EXP || ((x) & (TLV_EXP << 16)) == (TLV_EXP << 16))
#endif

/* A loop over the chunks 0 .. total - 1 of a staging, the work-group's NWI work-items taking
 * them in turn (e, unsigned), rolled: unrolled, or with a trip count counted apart, ptxas took
 * more registers (up to 255 at d128 against 245). */
#define STAGE_LOOP(total, e) _Pragma("unroll 1") for (uint e = lid; e < (uint)(total); e += NWI)
/* A chunk into local memory at p, 16 bytes aligned (pitches and offsets are multiples of 16
 * bytes). */
#define ST_CHUNK(x, p) (*(__local uint4 *)(p) = as_uint4(x))
/* V's staging: keys a work-item takes together (16-bit values: a pair, one word a column), and
 * the work-items over a column chunk's keys. */
#if DT_IN == 0
#define V_PER 1
#else
#define V_PER 2
#endif
#define V_KEYS (BN / V_PER)

/* CH elements of a row from element i, zero past element n. With MMA_ALIGN16 (the host's: every
 * row of Q, and of K and V where they are of the query's type, starts on 16 bytes) a whole chunk
 * is one 16-byte load; vload of 16-bit values, which need only their own alignment, were 8 loads
 * of 2 bytes and 12 byte permutes in SASS. */
#ifndef MMA_ALIGN16
#define MMA_ALIGN16 0
#endif
#if DT_IN == 0
#define VLOAD_CH(p) vload4(0, p)
#define TL_BITS(x) as_uint(x)
#else
#define VLOAD_CH(p) as_uint4(vload8(0, p))
#define TL_BITS(x) (uint)(x)
#endif
inline tlv ld_chunk(__global const TL *p, int i, int n)
{
    if (i + CH <= n)
#if MMA_ALIGN16
        return *(__global const tlv *)(p + i);
#else
        return VLOAD_CH(p + i);
#endif
    uint x[CH]; /* the elements' bits (a vload from a private array kept it on the stack) */
    MMA_UNROLL
    for (int k = 0; k < CH; k++)
        x[k] = i + k < n ? TL_BITS(p[i + k]) : 0u;
#if DT_IN == 0
    return as_float4((uint4)(x[0], x[1], x[2], x[3]));
#else
    return (uint4)(x[0] | x[1] << 16, x[2] | x[3] << 16, x[4] | x[5] << 16, x[6] | x[7] << 16);
#endif
}

/* A chunk of K (V) for the tiles: CH elements from element i (of n) of a key's row. K/V of the
 * query's type as stored; of a KV-cache type (kv_access.cl) decoded, times the key's scale, and
 * rounded to the tiles' type (f16 and bf16 to nearest even: the tiles hold what the matrix units
 * multiply). V's rows are read from this work-group's column c0 on. */
#if DT_IN == 0
#define TILE_FROM_F32(x) (x)
inline float4 kv_chunk_f32_k(__global const T_K *p, int i, int n) { return row_load4_k(p, i, n); }
inline float4 kv_chunk_f32_v(__global const T_V *p, int i, int n) { return row_load4_v(p, i, n); }
#else
__attribute__((always_inline)) inline float8 kv_chunk_f32_k(__global const T_K *p, int i, int n)
{
    return (float8)(row_load4_k(p, i, n), row_load4_k(p, i + 4, n));
}
__attribute__((always_inline)) inline float8 kv_chunk_f32_v(__global const T_V *p, int i, int n)
{
    return (float8)(row_load4_v(p, i, n), row_load4_v(p, i + 4, n));
}
#if DT_IN == 1
__attribute__((always_inline)) inline ushort8 tile_from_f32(float8 x)
{
    ushort t[8];
    vstore_half8_rte(x, 0, (__private half *)t);
    return vload8(0, t);
}
#define TILE_FROM_F32(x) as_uint4(tile_from_f32(x))
#else
#define TILE_FROM_F32(x) as_uint4(f32_to_bf16_8(x))
#endif
#endif
#if DT_K == DT_IN
#define TILE_K(p, i, n, src, key) ld_chunk((__global const TL *)(p), i, n)
#else
#define TILE_K(p, i, n, src, key) TILE_FROM_F32(kv_chunk_f32_k(p, i, n) * k_scale_of(src, key))
#endif
#if DT_V == DT_IN
#define TILE_V(p, c0, i, n, src, key) ld_chunk((__global const TL *)(p) + (c0), i, n)
#else
#define TILE_V(p, c0, i, n, src, key) TILE_FROM_F32(kv_chunk_f32_v(p, (c0) + (i), (c0) + (n)) * v_scale_of(src, key))
#endif

#if MMA_3X
#define mma_c_add(c, v) ((mma_c)((c).lo + (v), (c).hi))
#else
#define mma_c_add(c, v) ((c) + (v))
#endif

#if !KSEL || K_fused_mma
__kernel __attribute__((reqd_work_group_size(NWI, 1, 1))) void
fused_mma(ATTN_KERNEL_ARGS(T_K, T_V) MFLAG_ARGS VARIANT_ARGS KVC_ARGS)
{
    const vparams vp = VP_MAKE;
    __local TL sm[SM_ELEMS] __attribute__((aligned(16)));
    /* With a mask: the last even and odd tile in which a row sees a key; and the last even and
     * odd tile whose V holds Inf or NaN (the exact path's test). */
    __local int seen_kt[2], bad_kt[2];
#if !MMA_NV
    __local float4 mscr[MMA_SCRATCH_FLOATS(NW) / 4];
#endif
    const int lid = get_local_id(0), warp = lid / MMA_LANES, lane = lid % MMA_LANES;
#if !MMA_NV
    mma_ctx mctx;
    mctx.lane = lane;
    mctx.lid = lid;
    mctx.scr = (__local float *)mscr + warp * MMA_WARP_FLOATS;
    mctx.xch = mscr + NW * MMA_WARP_FLOATS / 4;
#endif
    const int R = group * seq_q;
    const int r0 = GROUP_ID(1) * BM;
    const kv_seqs seqs = KV_SEQS();
    const work_range w = work_range_of(GROUP_ID(2), splits, split_len, heads_kv, seq_q, seq_kv,
                                       causal, kvlen, r0, min(R, r0 + BM) - 1, 16, &vp, &seqs);
    const int split = w.split, b = w.b, hk = w.hk, L = w.L;
    int k_lo = w.k_lo, k_hi = w.k_hi, k_all = w.k_all;
    NARROW_KEYS(r0, min(R, r0 + BM), 16);

    /* K and V rows through kv_access.cl: paged, packed (from w.k0) or of a KV-cache type. */
    __global const T_K *Kb = KV_HEAD(K, k_off, k_sb, k_sh, b, hk) + (ulong)w.k0 * k_ss;
    __global const T_V *Vb = KV_HEAD(V, v_off, v_sb, v_sh, b, hk) + (ulong)w.k0 * v_ss;
    const kv_src ksrc = K_SRC(b, hk, w.k0), vsrc = V_SRC(b, hk, w.k0);
    /* This work-group's block of O columns: c0 .. c0 + DVP, DVr of them within head_dim_v. */
    const int c0 = get_group_id(0) * DVP, DVr = DV - c0;
    __global const TL *Qb = (__global const TL *)(Q + q_off + (ulong)b * q_sb);

    /* Q as stored, zero past head_dim and for rows past R. */
    STAGE_LOOP(BM * (DP / CH), e) {
        const int r = e / (DP / CH), d = CH * (e % (DP / CH)), row = r0 + r;
        tlv x = (tlv)(0);
        const int hq = hk * group + row / seq_q, i = row % seq_q;
        if (row < R && i < w.sq) /* a packed sequence's rows from w.q0 (VARLEN) */
            x = ld_chunk(Qb + (ulong)hq * q_sh + (ulong)(w.q0 + i) * q_ss, d, D);
        ST_CHUNK(x, sm + Q_OFF + r * QP + d);
    }
    if (lid < 2) {
        seen_kt[lid] = k_lo - 1; /* no tile's */
        bad_kt[lid] = k_lo - 1;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    __local const TL *Qw = sm + Q_OFF + MMA_M * warp * QP;
#if QREG
    mma_a qa[QK];
    MMA_UNROLL
    for (int kk = 0; kk < QK; kk++)
        qa[kk] = mma_load_a(Qw + kk * MMA_K, QP, lane);
    barrier(CLK_LOCAL_MEM_FENCE); /* K and V take Q's place */
#endif

    /* This lane's rows: g and g + 8 of its warp's 16. */
    float m[2], l[2];
    int rend[2], rows[2];
    vrow vr[2];
    ulong mrow[2];
    MMA_UNROLL
    for (int i = 0; i < 2; i++) {
        const int row = r0 + MMA_M * warp + MMA_G(lane) + 8 * i;
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        rows[i] = row;
        m[i] = NEG_INF;
        l[i] = 0.0f;
        /* a row past R (never stored, rend 0) takes the last row's head: its ALiBi slope is read */
        const int end = row_span(causal, pos, w.sq, L, b, hk * group + min(row, R - 1) / seq_q, &vp, &vr[i]);
        rend[i] = row < R && pos < w.sq ? min(k_hi, end) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
    }
    mma_c o[DT];
    MMA_UNROLL
    for (int j = 0; j < DT; j++)
        o[j] = mma_c_zero();

    for (int kt = k_lo; kt < k_hi; kt += BN) {
        /* Guarded: some row may hide some key of the tile (see fused_tiled.cl). */
        const int guarded = has_mask || kt + BN > k_all || VAR_PER_KEY;
        const int par = ((kt - k_lo) / BN) & 1;
        /* K as stored, key-major (B of S stored n-major), zero past k_hi and head_dim. */
        STAGE_LOOP(BN * (DP / CH), e) {
            const int n = e / (DP / CH), d = CH * (e % (DP / CH)), key = kt + n;
            const tlv x = key < k_hi ? TILE_K(Kb + kv_row(&ksrc, key, k_sb, k_ss), d, D, &ksrc, key) : (tlv)(0);
            ST_CHUNK(x, sm + K_OFF + n * KP + d);
        }
#if MMA_LDSM
        /* V as stored, row by row (ldmatrix transposes its fragments). */
        STAGE_LOOP(BN * (DVP / CH), e) {
            const int n = e / (DVP / CH), c = CH * (e % (DVP / CH)), key = kt + n;
            const tlv x = key < k_hi ? TILE_V(Vb + kv_row(&vsrc, key, v_sb, v_ss), c0, c, DVr, &vsrc, key) : (tlv)(0);
            ST_CHUNK(x, sm + V_AT(n, c));
            if (guarded && TLV_NONFINITE(x))
                bad_kt[par] = kt;
        }
#else
        /* V transposed (B of P·V stored n-major): read along rows, written across, the lanes of a
         * warp on consecutive keys of one column chunk, so that each store of a column covers
         * consecutive words (banks). 16-bit values: a work-item takes keys n and n + 1 and writes
         * their two values of a column as one word. (Lanes on the chunks of one key's row, as
         * first written, put the 8 lanes of a key on one bank: 8-way conflicts in each of 32
         * 2-byte stores.) */
        STAGE_LOOP(V_KEYS * (DVP / CH), e) {
            const int n = V_PER * (e % V_KEYS), c = CH * (e / V_KEYS), key = kt + n;
            const tlv x = key < k_hi ? TILE_V(Vb + kv_row(&vsrc, key, v_sb, v_ss), c0, c, DVr, &vsrc, key) : (tlv)(0);
#if DT_IN == 0
            const float t[CH] = {x.s0, x.s1, x.s2, x.s3};
            MMA_UNROLL
            for (int q = 0; q < CH; q++)
                sm[V_OFF + (c + q) * VP + n] = t[q];
            if (guarded && TLV_NONFINITE(x))
                bad_kt[par] = kt;
#else
            const tlv x1 = key + 1 < k_hi ? TILE_V(Vb + kv_row(&vsrc, key + 1, v_sb, v_ss), c0, c, DVr, &vsrc, key + 1)
                                          : (tlv)(0);
            /* column c + 2j: the low halves of word j of x and x1; c + 2j + 1: their high halves */
            const uint4 lo = (x & 0xffffu) | (x1 << 16), hi = (x >> 16) | (x1 & 0xffff0000u);
            const uint t[CH] = {lo.s0, hi.s0, lo.s1, hi.s1, lo.s2, hi.s2, lo.s3, hi.s3};
            MMA_UNROLL
            for (int q = 0; q < CH; q++)
                *(__local uint *)(sm + V_OFF + (c + q) * VP + n) = t[q];
            if (guarded && (TLV_NONFINITE(x) || TLV_NONFINITE(x1)))
                bad_kt[par] = kt;
#endif
        }
#endif
        /* A tile the mask hides from every row is skipped (fused_tiled.cl), from the mask's
         * flags (MFLAGS) or from the mask itself. */
        MARK_SEEN_TILE(BM, BN, NWI, lid, seen_kt[par]);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (TILE_TEST(has_mask) && seen_kt[par] != kt)
            continue;
        const int vbad = guarded && bad_kt[par] == kt;

        /* S = Q·Kᵀ */
        mma_c s[NT];
        MMA_UNROLL
        for (int nt = 0; nt < NT; nt++)
            s[nt] = mma_c_zero();
        MMA_UNROLL
        for (int kk = 0; kk < QK; kk++) {
#if QREG
            const mma_a a = qa[kk];
#else
            const mma_a a = mma_load_a(Qw + kk * MMA_K, QP, lane);
#endif
            /* n-tiles in pairs (NT is even): one ldmatrix a pair with MMA_LDSM */
            MMA_UNROLL
            for (int nt = 0; nt < NT; nt += 2) {
                mma_b b0, b1;
                mma_load_b_pair(sm + K_OFF + nt * MMA_N * KP + kk * MMA_K, KP, lane, &b0, &b1);
                s[nt] = MMA(s[nt], a, b0);
                s[nt + 1] = MMA(s[nt + 1], a, b1);
            }
        }
        float p[NT][MMA_CE];
        MMA_UNROLL
        for (int nt = 0; nt < NT; nt++)
            vstore4(mma_c_value(s[nt]) * scale, 0, p[nt]);
        if (guarded) {
            MMA_UNROLL
            for (int nt = 0; nt < NT; nt++)
                MMA_UNROLL
                for (int e = 0; e < MMA_CE; e++) {
                    const int key = kt + nt * MMA_N + MMA_C_COL(lane, e), i = e >> 1;
                    if (VAR_PER_KEY) {
                        p[nt][e] = var_key(p[nt][e], key, rend[i], &vr[i], &vp, has_mask, mask, mrow[i]);
                    } else if (key >= rend[i]) {
                        p[nt][e] = NEG_INF;
                    } else if (has_mask) {
                        const float mv = LD_MASK(mask, mrow[i] + key);
                        p[nt][e] = mv == NEG_INF ? NEG_INF : p[nt][e] + mv;
                    }
                }
        }

        /* The online softmax on the fragments: row maxima over the 4 lanes of a row. */
        float2 mx = (float2)(NEG_INF);
        MMA_UNROLL
        for (int nt = 0; nt < NT; nt++) {
            mx.x = fmax(mx.x, fmax(p[nt][0], p[nt][1]));
            mx.y = fmax(mx.y, fmax(p[nt][2], p[nt][3]));
        }
        mx = fmax(mx, MMA_XOR2(mx, 1));
        mx = fmax(mx, MMA_XOR2(mx, 2));
        float mref[2], alpha[2];
        MMA_UNROLL
        for (int i = 0; i < 2; i++) {
            const float mnew = fmax(m[i], i ? mx.y : mx.x);
            mref[i] = mnew == NEG_INF ? 0.0f : mnew; /* no -inf - -inf */
            alpha[i] = mma_exp2((m[i] - mref[i]) * LOG2E);
            m[i] = mnew;
        }
        /* The weights; in a guarded tile hidden keys get -0 (HIDDEN_P). Two copies of the loop,
         * so that an unguarded tile has no compare and select a weight. */
        float2 ps = (float2)(0.0f);
#define MMA_WEIGHTS(HIDE)                                                                         \
    MMA_UNROLL                                                                                   \
    for (int nt = 0; nt < NT; nt++)                                                              \
        MMA_UNROLL                                                                               \
        for (int e = 0; e < MMA_CE; e++) {                                                       \
            const int i = e >> 1;                                                                \
            float pe = mma_exp2((p[nt][e] - mref[i]) * LOG2E);                                   \
            if (HIDE && p[nt][e] == NEG_INF)                                                     \
                pe = HIDDEN_P;                                                                   \
            p[nt][e] = pe;                                                                       \
            if (i)                                                                               \
                ps.y += pe;                                                                      \
            else                                                                                 \
                ps.x += pe;                                                                      \
        }
        if (guarded) {
            MMA_WEIGHTS(1)
        } else {
            MMA_WEIGHTS(0)
        }
#undef MMA_WEIGHTS
        ps += MMA_XOR2(ps, 1);
        ps += MMA_XOR2(ps, 2);
        float keep[2], wp[2];
        MMA_UNROLL
        for (int i = 0; i < 2; i++) {
            const float lnew = l[i] * alpha[i] + (i ? ps.y : ps.x);
#if DT_IN == 1
            keep[i] = alpha[i];
            wp[i] = 32768.0f; /* 2^15 */
#else
            const float inv = lnew > 0.0f ? 1.0f / lnew : 0.0f;
            keep[i] = isnan(lnew) ? lnew : l[i] * alpha[i] * inv;
            wp[i] = inv * O_WEIGHT;
#endif
            l[i] = lnew;
        }
        const float4 keep4 = (float4)(keep[0], keep[0], keep[1], keep[1]);
        const float4 wp4 = (float4)(wp[0], wp[0], wp[1], wp[1]);
        MMA_UNROLL
        for (int j = 0; j < DT; j++)
            o[j] = mma_c_scale(o[j], keep4);

        if (!vbad) {
            /* O += P·V on the matrix unit, P from S's fragments. */
            MMA_UNROLL
            for (int kb = 0; kb < KB; kb++) {
                const mma_a a = mma_p_pack(vload4(0, p[MMA_P_TILE(kb, 0)]) * wp4,
                                           vload4(0, p[MMA_P_TILE(kb, MMA_AE - 1)]) * wp4);
#if MMA_LDSM
                /* column tiles in pairs, an odd last one alone */
                MMA_UNROLL
                for (int j = 0; j < DT; j += 2) {
                    mma_b b0, b1;
                    mma_load_b_km_pair(sm + V_AT(kb * MMA_K, j * MMA_N), VR, lane, j + 1 == DT, &b0, &b1);
                    o[j] = MMA(o[j], a, b0);
                    if (j + 1 < DT)
                        o[j + 1] = MMA(o[j + 1], a, b1);
                }
#else
                MMA_UNROLL
                for (int j = 0; j < DT; j++)
                    o[j] = MMA(o[j], a, mma_load_b_pv(sm + V_OFF + j * MMA_N * VP + kb * MMA_K, VP, lane));
#endif
            }
        } else {
            /* Inf or NaN in V where some row hides a key: key by key, each weight fetched from
             * the lane that holds it, hidden keys skipped. Rare: a rolled loop, the n-tile
             * picked by selects (an indexed register array would live in memory). */
#pragma unroll 1
            for (int n = 0; n < BN; n++) {
                const int nt = n / MMA_N, h = n & 1;
                float4 pn = vload4(0, p[0]);
MMA_UNROLL
                for (int u = 1; u < NT; u++)
                    pn = u == nt ? vload4(0, p[u]) : pn;
                const float4 q = MMA_IDX4(pn, MMA_G(lane) * 4 + (n % MMA_N) / 2) * wp4;
                const float pa = h ? q.s1 : q.s0, pb = h ? q.s3 : q.s2;
MMA_UNROLL
                for (int j = 0; j < DT; j++) {
                    float t[MMA_CE];
MMA_UNROLL
                    for (int e = 0; e < MMA_CE; e++) {
                        const float pr = e >> 1 ? pb : pa;
                        const float v = tl_to_f(sm + V_AT(n, j * MMA_N + MMA_C_COL(lane, e)));
                        t[e] = IS_HIDDEN(pr) ? 0.0f : pr * v;
                    }
                    o[j] = mma_c_add(o[j], vload4(0, t));
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE); /* before the next tile overwrites K and V */
    }

    O += o_off + (ulong)split * o_split;
    LSE += l_off + (ulong)split * l_split;
    MMA_UNROLL
    for (int i = 0; i < 2; i++) {
        const int row = rows[i];
        const int hq = hk * group + row / seq_q, pos = row % seq_q;
        if (row >= R || pos >= w.sq)
            continue;
        /* the caller's rows of a packed sequence start at w.q0; split partials are not packed */
        const int opos = pos + (splits > 1 ? 0 : w.q0);
        /* No visible key: exactly 0 and LSE -inf (all-NaN scores: l NaN, not empty). */
        const int empty = m[i] == NEG_INF && !isnan(l[i]);
        float lse;
        const float sf = sink_join(m[i], l[i], empty, hq, splits, &vp, &lse);
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)opos * o_ss;
#if DT_IN == 1
        const float fin = sf / (l[i] * 32768.0f);
#endif
        MMA_UNROLL
        for (int j = 0; j < DT; j++) {
            const float4 v = mma_c_value(o[j]);
            MMA_UNROLL
            for (int h = 0; h < 2; h++) {
                const int col = j * MMA_N + MMA_C_COL(lane, 2 * i + h);
                if (col >= DVr)
                    continue;
                const float x = i ? (h ? v.s3 : v.s2) : (h ? v.s1 : v.s0);
#if DT_IN == 1
                ST_OUT(orow, c0 + col, empty ? 0.0f : x * fin);
#else
                ST_OUT(orow, c0 + col, empty ? 0.0f : o_from_half(x) * sf);
#endif
            }
        }
        if (has_lse && MMA_T(lane) == 0 && c0 == 0)
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)opos * l_ss] = lse;
    }
}
#endif

#if KSEL && K_ldsm_probe && DT_IN != 0
/* The device's check of the ldmatrix loads (src/matrix.c, clattn__matrix_ldsm): one warp takes B
 * fragments through mma_load_b_pair and mma_load_b_km_pair (ldmatrix with MMA_NV and MMA_LDSM)
 * and through the plain loads, from a tile of distinct values 16 bytes into local memory, and
 * writes for each lane how many fragments differ: 0 on every lane means the driver's ldmatrix,
 * and its form of a __local address, give what the kernel assumes. */
inline int mma_b_differ(mma_b x, mma_b y)
{
#if MMA_NV
    return any(x != y);
#else
    int d = 0;
    for (int e = 0; e < MMA_BE * MMA_PARTS; e++)
        d |= x.v[e] != y.v[e];
    return d;
#endif
}

__kernel __attribute__((reqd_work_group_size(MMA_LANES, 1, 1))) void ldsm_probe(__global int *bad, uint local_bytes)
{
    __local TL t[16 * 24] __attribute__((aligned(16)));
    const int lane = get_local_id(0);
    /* The address ldmatrix gets (mma.cl: the 32-bit value of a __local pointer) must look like an
     * offset in the device's local memory, 16 bytes aligned and in elements' bytes, before any
     * ldmatrix runs: a driver whose __local pointers are something else would make it fault, and
     * a fault can take the whole context down, not just fail the probe. */
#if MMA_NV
    const uint a0 = (uint)(size_t)t, a1 = (uint)(size_t)(t + 8);
    if ((a0 & 15u) || a1 - a0 != 16u || a0 >= local_bytes || local_bytes - a0 < sizeof t) {
        bad[lane] = 100;
        return;
    }
#else
    (void)local_bytes; /* the emulation's loads take no such address */
#endif
    for (int i = lane; i < 16 * 24; i += MMA_LANES)
        t[i] = (TL)(i * 37 + 11);
    barrier(CLK_LOCAL_MEM_FENCE);
    mma_b k0, k1, v0, v1, w0, w1;
    mma_load_b_pair(t + 8, 24, lane, &k0, &k1);
    mma_load_b_km_pair(t + 8, 24, lane, 0, &v0, &v1);
    mma_load_b_km_pair(t, 24, lane, 1, &w0, &w1); /* one tile: w0 only */
    bad[lane] = mma_b_differ(k0, mma_load_b(t + 8, 24, lane)) + mma_b_differ(k1, mma_load_b(t + 8 + 8 * 24, 24, lane)) +
                mma_b_differ(v0, mma_load_b_km(t + 8, 24, lane)) + mma_b_differ(v1, mma_load_b_km(t + 16, 24, lane)) +
                mma_b_differ(w0, mma_load_b_km(t, 24, lane));
}
#endif
