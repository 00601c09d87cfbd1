/* Fused attention on the matrix units, `fused_mma`, written once over the tile layer (mma.cl,
 * mma_layout.cl): NVIDIA's mma.sync on GPUs with compute capability 8.0 and up, AMD's MFMA on
 * CDNA (gfx90a, gfx94x) and WMMA on RDNA3, Intel's XMX on sub-groups of 16, the emulation of any
 * family's fragments everywhere else (CLATTN_MATRIX=emulate, emulate-amd, emulate-wmma,
 * emulate-intel). Shared rules (arguments, work ranges,
 * masks, key splits): attn_common.cl; the host side: src/fused_mma.c.
 *
 * Rows are packed as in the tiled kernel (row r of kv head hk is query head hk·group + r / seq_q,
 * position r % seq_q). A work-group of NW warps (wavefronts) takes BM = 16·NW packed rows, each
 * warp 16 of them, so a row's softmax never leaves its warp: a lane holds the scores of MMA_RS
 * rows (MMA_ROW) in each MMA_SN-key tile of S (NVIDIA: lane (g, t) columns 2t, 2t + 1 of rows g
 * and g + 8 of 8-key n-tiles; MFMA: 4 keys of one row of 16-key tiles; WMMA: 4 keys of one row
 * of 8-key half tiles; XMX: the 4 keys of 4-key half tiles of its own row), and the row maximum
 * and sum are reduced over the lanes of a row (xor MMA_RED0 and MMA_RED1: 4 lanes; WMMA's 2,
 * MMA_RED1 0; XMX's 1, MMA_RED0 0). Per tile of BN keys:
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
#define NT (BN / MMA_SN)  /* tiles of S */
#define KB (BN / MMA_K)   /* k-blocks of P */
#define DT (DVP / MMA_ON) /* tiles of O */
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
__kernel __attribute__((reqd_work_group_size(NWI, 1, 1))) MMA_SG_ATTR void
fused_mma(ATTN_KERNEL_ARGS(T_K, T_V) MFLAG_ARGS VARIANT_ARGS KVC_ARGS)
{
    const vparams vp = VP_MAKE;
    __local TL sm[SM_ELEMS] __attribute__((aligned(16)));
    /* With a mask: the last even and odd tile in which a row sees a key; and the last even and
     * odd tile whose V holds Inf or NaN (the exact path's test). */
    __local int seen_kt[2], bad_kt[2];
#if !MMA_GPU
    __local float4 mscr[MMA_SCRATCH_FLOATS(NW) / 4];
#endif
    const int lid = get_local_id(0), warp = MMA_WARP_OF(lid), lane = MMA_LANE_OF(lid);
#if !MMA_GPU
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
    mma_q qa[QK];
    MMA_UNROLL
    for (int kk = 0; kk < QK; kk++)
        qa[kk] = mma_load_q(Qw + kk * MMA_K, QP, lane);
    barrier(CLK_LOCAL_MEM_FENCE); /* K and V take Q's place */
#endif

    /* This lane's rows (NVIDIA: g and g + 8 of its warp's 16; AMD: lane % 16). */
    float m[MMA_RS], l[MMA_RS];
    int rend[MMA_RS], rows[MMA_RS];
    vrow vr[MMA_RS];
    ulong mrow[MMA_RS];
    MMA_UNROLL
    for (int i = 0; i < MMA_RS; i++) {
        const int row = r0 + MMA_M * warp + MMA_ROW(lane, i);
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

        /* S = Q·Kᵀ (AMD: Sᵀ = K·Qᵀ) */
        mma_c s[NT];
        MMA_UNROLL
        for (int nt = 0; nt < NT; nt++)
            s[nt] = mma_c_zero();
        MMA_UNROLL
        for (int kk = 0; kk < QK; kk++) {
#if QREG
            const mma_q a = qa[kk];
#else
            const mma_q a = mma_load_q(Qw + kk * MMA_K, QP, lane);
#endif
#if MMA_LAYOUT == 0
            /* n-tiles in pairs (NT is even): one ldmatrix a pair with MMA_LDSM */
            MMA_UNROLL
            for (int nt = 0; nt < NT; nt += 2) {
                mma_b b0, b1;
                mma_load_b_pair(sm + K_OFF + nt * MMA_N * KP + kk * MMA_K, KP, lane, &b0, &b1);
                s[nt] = MMA(s[nt], a, b0);
                s[nt + 1] = MMA(s[nt + 1], a, b1);
            }
#elif MMA_PAIR
            MMA_UNROLL
            for (int nt = 0; nt < NT; nt += 2)
                MMA_S2(s[nt], s[nt + 1], a, mma_load_k(sm + K_OFF + nt * MMA_SN * KP + kk * MMA_K, KP, lane));
#else
            MMA_UNROLL
            for (int nt = 0; nt < NT; nt++)
                s[nt] = MMA_S(s[nt], a, mma_load_k(sm + K_OFF + nt * MMA_SN * KP + kk * MMA_K, KP, lane));
#endif
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
                    const int key = kt + nt * MMA_SN + MMA_S_KEY(lane, e), i = MMA_S_RS(e);
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
        mma_rv mx = (mma_rv)(NEG_INF);
        MMA_UNROLL
        for (int nt = 0; nt < NT; nt++)
            MMA_UNROLL
            for (int e = 0; e < MMA_CE; e += 2) /* elements e, e + 1 share a slot */
                RV_SET(mx, MMA_S_RS(e), fmax(RV_GET(mx, MMA_S_RS(e)), fmax(p[nt][e], p[nt][e + 1])));
#if MMA_RED0 /* Intel: a row in one lane */
        mx = fmax(mx, MMA_XORR(mx, MMA_RED0));
#endif
#if MMA_RED1
        mx = fmax(mx, MMA_XORR(mx, MMA_RED1));
#endif
        float mref[MMA_RS], alpha[MMA_RS];
        MMA_UNROLL
        for (int i = 0; i < MMA_RS; i++) {
            const float mnew = fmax(m[i], RV_GET(mx, i));
            mref[i] = mnew == NEG_INF ? 0.0f : mnew; /* no -inf - -inf */
            alpha[i] = mma_exp2((m[i] - mref[i]) * LOG2E);
            m[i] = mnew;
        }
        /* The weights; in a guarded tile hidden keys get -0 (HIDDEN_P). Two copies of the loop,
         * so that an unguarded tile has no compare and select a weight. */
        mma_rv ps = (mma_rv)(0.0f);
#define MMA_WEIGHTS(HIDE)                                                                         \
    MMA_UNROLL                                                                                   \
    for (int nt = 0; nt < NT; nt++)                                                              \
        MMA_UNROLL                                                                               \
        for (int e = 0; e < MMA_CE; e++) {                                                       \
            const int i = MMA_S_RS(e);                                                           \
            float pe = mma_exp2((p[nt][e] - mref[i]) * LOG2E);                                   \
            if (HIDE && p[nt][e] == NEG_INF)                                                     \
                pe = HIDDEN_P;                                                                   \
            p[nt][e] = pe;                                                                       \
            RV_SET(ps, i, RV_GET(ps, i) + pe);                                                   \
        }
        if (guarded) {
            MMA_WEIGHTS(1)
        } else {
            MMA_WEIGHTS(0)
        }
#undef MMA_WEIGHTS
#if MMA_RED0
        ps += MMA_XORR(ps, MMA_RED0);
#endif
#if MMA_RED1 /* WMMA: two lanes a row */
        ps += MMA_XORR(ps, MMA_RED1);
#endif
        float keep[MMA_RS], wp[MMA_RS];
        MMA_UNROLL
        for (int i = 0; i < MMA_RS; i++) {
            const float lnew = l[i] * alpha[i] + RV_GET(ps, i);
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
        const float4 keep4 = MMA_RS4(keep), wp4 = MMA_RS4(wp); /* by element (MMA_O_RS = MMA_S_RS) */
        MMA_UNROLL
        for (int j = 0; j < DT; j++)
            o[j] = mma_c_scale(o[j], keep4);

        if (!vbad) {
            /* O += P·V on the matrix unit (AMD: Oᵀ += Vᵀ·Pᵀ), P from S's fragments. */
            MMA_UNROLL
            for (int kb = 0; kb < KB; kb++) {
                const mma_p a = MMA_P_OF(p, kb, wp4);
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
#elif MMA_PAIR
                MMA_UNROLL
                for (int j = 0; j < DT; j += 2)
                    MMA_O2(o[j], o[j + 1], a, mma_load_v(sm + V_OFF + j * MMA_ON * VP, VP, lane, kb));
#else
                MMA_UNROLL
                for (int j = 0; j < DT; j++)
                    o[j] = MMA_O(o[j], a, mma_load_v(sm + V_OFF + j * MMA_ON * VP, VP, lane, kb));
#endif
            }
        } else {
            /* Inf or NaN in V where some row hides a key: key by key, each weight fetched from
             * the lane that holds it, hidden keys skipped. Rare: a rolled loop, the tile picked
             * by selects (an indexed register array would live in memory). */
#pragma unroll 1
            for (int n = 0; n < BN; n++) {
                const int nt = n / MMA_SN, ns = n % MMA_SN;
                float4 pn = vload4(0, p[0]);
MMA_UNROLL
                for (int u = 1; u < NT; u++)
                    pn = u == nt ? vload4(0, p[u]) : pn;
                /* the lane holding key n of this lane's rows (one lane for all its slots) */
                const float4 q = MMA_IDX4(pn, MMA_S_LANE(MMA_ROW(lane, 0), ns));
                float pr[MMA_RS];
MMA_UNROLL
                for (int i = 0; i < MMA_RS; i++) {
                    const int se = MMA_S_ELEM(MMA_ROW(lane, i), ns);
                    pr[i] = (se == 0 ? q.s0 : se == 1 ? q.s1 : se == 2 ? q.s2 : q.s3) * wp[i];
                }
MMA_UNROLL
                for (int j = 0; j < DT; j++) {
                    float t[MMA_CE];
MMA_UNROLL
                    for (int e = 0; e < MMA_CE; e++) {
                        const float w = pr[MMA_O_RS(e)];
                        const float v = tl_to_f(sm + V_AT(n, j * MMA_ON + MMA_O_COL(lane, e)));
                        t[e] = IS_HIDDEN(w) ? 0.0f : w * v;
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
    for (int i = 0; i < MMA_RS; i++) {
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
            float v[MMA_CE];
            vstore4(mma_c_value(o[j]), 0, v);
            MMA_UNROLL
            for (int e = 0; e < MMA_CE; e++) {
                const int col = j * MMA_ON + MMA_O_COL(lane, e);
                if (MMA_O_RS(e) != i || col >= DVr)
                    continue;
                const float x = v[e];
#if DT_IN == 1
                ST_OUT(orow, c0 + col, empty ? 0.0f : x * fin);
#else
                ST_OUT(orow, c0 + col, empty ? 0.0f : o_from_half(x) * sf);
#endif
            }
        }
        if (has_lse && MMA_LEADER(lane) && c0 == 0)
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

#if KSEL && K_mma_probe
/* The device's check of the tile layer itself (src/matrix.c, clattn__mma_probe; run once per
 * context and input type before AMD's or Intel's backend is used, and under emulation by the
 * tests): one
 * warp multiplies S = Q·Kᵀ and O = P·V through the layer's roles (mma_load_q, mma_load_k, MMA_S,
 * mma_p_pack, mma_load_v, MMA_O) on 16 queries, 16 keys and 16 dimensions of small integers
 * (every product and sum exact in each input type), exchanges values through MMA_XORR and
 * MMA_IDX4 as the softmax and the exact path do, and writes for each lane how many of its
 * elements differ from the plain products:
 * 0 on every lane means the builtins, the layouts and the exchanges do on this device what the
 * kernel assumes. */
#define PR_D 16
#define PR_N 16
#define PR_QP (PR_D + MMA_PAD)
#define PR_VP (PR_N + MMA_PAD)
#define PR_DV (MMA_ON * (1 + MMA_PAIR))
inline float pr_q(int r, int d) { return (float)((r * 3 + d * 5) % 7 - 3); }
inline float pr_k(int n, int d) { return (float)((n * 5 + d * 3) % 9 - 4); }
inline float pr_v(int c, int n) { return (float)((c * 7 + n) % 5 - 2); }
inline float pr_w(int r, int n) { return 0.5f * (float)((r + 2 * n) % 4); }
/* row r's score of key n, exact */
inline float pr_s(int r, int n)
{
    float s = 0.0f;
    for (int d = 0; d < PR_D; d++)
        s += pr_q(r, d) * pr_k(n, d);
    return s;
}
inline void pr_put(__local TL *p, float x)
{
#if DT_IN == 0
    *p = x;
#elif DT_IN == 1
    vstore_half(x, 0, (__local half *)p);
#else
    *p = f32_to_bf16(x);
#endif
}

__kernel __attribute__((reqd_work_group_size(MMA_LANES, 1, 1))) MMA_SG_ATTR void mma_probe(__global int *bad)
{
    __local TL q[16 * PR_QP] __attribute__((aligned(16)));
    __local TL k[PR_N * PR_QP] __attribute__((aligned(16)));
    __local TL vt[PR_DV * PR_VP] __attribute__((aligned(16)));
    const int lane = MMA_LANE_OF((int)get_local_id(0));
#if !MMA_GPU
    __local float4 mscr[MMA_SCRATCH_FLOATS(1) / 4];
    mma_ctx mctx;
    mctx.lane = lane;
    mctx.lid = lane;
    mctx.scr = (__local float *)mscr;
    mctx.xch = mscr + MMA_WARP_FLOATS / 4;
#endif
    for (int i = lane; i < 16 * PR_QP; i += MMA_LANES) {
        const int r = i / PR_QP, d = i % PR_QP;
        pr_put(q + i, d < PR_D ? pr_q(r, d) : 0.0f);
        pr_put(k + i, d < PR_D ? pr_k(r, d) : 0.0f);
    }
    for (int i = lane; i < PR_DV * PR_VP; i += MMA_LANES) {
        const int c = i / PR_VP, n = i % PR_VP;
        pr_put(vt + i, n < PR_N ? pr_v(c, n) : 0.0f);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int nbad = 0;
    mma_c s[PR_N / MMA_SN];
    for (int nt = 0; nt < PR_N / MMA_SN; nt++)
        s[nt] = mma_c_zero();
    for (int kk = 0; kk < PR_D / MMA_K; kk++) {
        const mma_q a = mma_load_q(q + kk * MMA_K, PR_QP, lane);
#if MMA_PAIR
        for (int nt = 0; nt < PR_N / MMA_SN; nt += 2)
            MMA_S2(s[nt], s[nt + 1], a, mma_load_k(k + nt * MMA_SN * PR_QP + kk * MMA_K, PR_QP, lane));
#else
        for (int nt = 0; nt < PR_N / MMA_SN; nt++)
            s[nt] = MMA_S(s[nt], a, mma_load_k(k + nt * MMA_SN * PR_QP + kk * MMA_K, PR_QP, lane));
#endif
    }
    float p[PR_N / MMA_SN][MMA_CE];
    for (int nt = 0; nt < PR_N / MMA_SN; nt++) {
        float got[MMA_CE];
        vstore4(mma_c_value(s[nt]), 0, got);
        for (int e = 0; e < MMA_CE; e++) {
            const int r = MMA_ROW(lane, MMA_S_RS(e)), n = nt * MMA_SN + MMA_S_KEY(lane, e);
            nbad += got[e] != pr_s(r, n);
            p[nt][e] = pr_w(r, n);
        }
    }
    mma_c o[2] = {mma_c_zero(), mma_c_zero()}; /* O's tile (two half tiles with WMMA) */
    for (int kb = 0; kb < PR_N / MMA_K; kb++) {
        const mma_p a = MMA_P_OF(p, kb, 1.0f);
#if MMA_PAIR
        MMA_O2(o[0], o[1], a, mma_load_v(vt, PR_VP, lane, kb));
#else
        o[0] = MMA_O(o[0], a, mma_load_v(vt, PR_VP, lane, kb));
#endif
    }
    for (int j = 0; j <= MMA_PAIR; j++) {
        float got[MMA_CE];
        vstore4(mma_c_value(o[j]), 0, got);
        for (int e = 0; e < MMA_CE; e++) {
            const int r = MMA_ROW(lane, MMA_O_RS(e)), c = j * MMA_ON + MMA_O_COL(lane, e);
            float want = 0.0f;
            for (int n = 0; n < PR_N; n++)
                want += pr_w(r, n) * pr_v(c, n);
            nbad += got[e] != want;
        }
    }
    /* The rows' exchanges: lane ^ MMA_RED0 and lane ^ MMA_RED1 hold the same rows in each slot
     * (the reductions' partners), and a value exchanged comes from the lane named. */
    mma_rv v = (mma_rv)(0.0f), w = (mma_rv)(0.0f);
    for (int i = 0; i < MMA_RS; i++) {
        RV_SET(v, i, (float)(MMA_ROW(lane, i) + 1000 * i));
        RV_SET(w, i, (float)(lane + 1000 * i));
    }
    const mma_rv x0 = MMA_XORR(v, MMA_RED0), x1 = MMA_XORR(v, MMA_RED1), y0 = MMA_XORR(w, MMA_RED0);
    for (int i = 0; i < MMA_RS; i++) {
        nbad += RV_GET(x0, i) != RV_GET(v, i);
        nbad += RV_GET(x1, i) != RV_GET(v, i);
        nbad += RV_GET(y0, i) != (float)((lane ^ MMA_RED0) + 1000 * i);
    }
    /* The exact path's fetch: row r's score of key n from lane MMA_S_LANE(r, n), element
     * MMA_S_ELEM(r, n), one lane for all of a lane's rows. */
    for (int n = 0; n < PR_N; n++) {
        const int nt = n / MMA_SN, ns = n % MMA_SN;
        const float4 f = MMA_IDX4(mma_c_value(s[nt]), MMA_S_LANE(MMA_ROW(lane, 0), ns));
        for (int i = 0; i < MMA_RS; i++) {
            const int r = MMA_ROW(lane, i), se = MMA_S_ELEM(r, ns);
            nbad += (se == 0 ? f.s0 : se == 1 ? f.s1 : se == 2 ? f.s2 : f.s3) != pr_s(r, n);
        }
    }
    bad[lane] = nbad;
}
#endif
