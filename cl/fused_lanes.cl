#if IN_PLACE && defined(LANES)
/* CPUs: fused_lanes (in place, 11 or more packed rows per kv head); what it shares with
 * fused_direct (numerics, IN_PLACE, REF_SLACK) is in fused_cpu_common.cl.
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
 * lane by lane. Decode of 64 packed rows took 11.2 ms against 16.6 with fused_direct
 * (docs/measurements.md#fused-lanes). With 11 to 16 rows (one vector, up to 5 lanes empty) see
 * src/fused_cpu.c: LANES_MIN_ROWS. */
#define LNB 64
/* Keys per score tile and Oᵀ columns per P·V tile: 8 accumulators (6 with 3 vectors of rows)
 * with AVX-512; with fewer registers (AVX2, NREG16 8: 16 ymm) at most NREG16 / 2 accumulators,
 * at least one key: 8 of them (16 ymm) spill at every step (AVX2, 16 rows: LKT 4 5.2 ms, 8 8.4).
 * See docs/measurements.md#lkt. */
/* With fewer registers and more than 2 vectors of rows (AVX2 and 33-64 packed rows: LANES 3 or
 * 4), both tiles take one vector of rows at a time (LSUB 1; the lanes loops below go over the
 * LANES vectors one after another): the score tile then has 4 keys and P·V 4 columns of Oᵀ,
 * where all the lanes at once allowed 1 key and 1 column, and 4 keys share each 8 KiB of Qᵀ
 * (with all the lanes each key read the whole Qᵀ from L2). Qᵀ is then stored a vector of rows
 * after another (QT below), so that a pass reads one sequential stream. AVX2 decode of 64 rows:
 * 21.8 ms against 23.5; with 32 rows one vector at a time was slower.
 * See docs/measurements.md#lsub. */
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
 * by lane, PoCL built each key's 16 rows from scalar loads (8 x 8 on AVX2, 16 rows: 8.49 ms
 * against 9.25). See docs/measurements.md#mask-lanes. */
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
 * f16 went through scalar bit operations on PoCL 3.1, a dozen instructions for 8 multiply-adds
 * (d256 f16 prefill 128.4 ms against 144.8). At most 128 columns a row (32 KiB a block): a wider
 * head_dim_v is converted and multiplied in chunks of 128 columns.
 * See docs/measurements.md#vf32-block. */
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
                acc[c][lv] = (float16)(0.0f); /* the block's sum, added to ot at the end */       \
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
                    ot[(c0 + c) * LANES + lv].v += acc[c][lv];                                   \
    }
DEFINE_LANES_PV(lanes_pv, __global const T_KV *, lanes_vrow)
DEFINE_LANES_PV(lanes_pv_f32, const float *, lanes_vrow_f32)

#if !KSEL || K_fused_lanes
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
fused_lanes(ATTN_KERNEL_ARGS(T_KV, T_KV) MFLAG_ARGS VARIANT_ARGS)
{
    const vparams vp = VP_MAKE;
    const int R = group * seq_q, nrb = (R + RM - 1) / RM; /* row blocks, grid y (or x, flat) */
    const int r0 = TILE_Y(1, nrb) * RM;
    const kv_seqs seqs = KV_SEQS();
    const work_range w = work_range_of(TILE_Z(1, nrb), splits, split_len, heads_kv, seq_q, seq_kv,
                                       causal, kvlen, r0, min(R, r0 + RM) - 1, 16, &vp, &seqs);
    const int split = w.split, b = w.b, hk = w.hk, L = w.L;
    int k_lo = w.k_lo, k_hi = w.k_hi, k_all = w.k_all;
    const int k_vis = w.k_vis;
    NARROW_KEYS(r0, min(R, r0 + RM), 16);
    __global const T_KV *Kb = K + k_off + (ulong)b * k_sb + (ulong)hk * k_sh;
    __global const T_KV *Vb = V + v_off + (ulong)b * v_sb + (ulong)hk * v_sh;

    /* Quantity x of row 16·lv + i is lane i of x[lv]; Qᵀ column d is QT(d, lv). */
    lanes16 qt[DP * LANES], ot[16 * DV16 * LANES], m[LANES], l[LANES];
    int rend[RM];
    vrow vr[RM];
    ulong mrow[RM], frow[RM];
    for (int i = 0; i < RM; i++) {
        const int row = min(r0 + i, R - 1); /* rows past R compute on a copy, never stored */
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        __global const T_IN *qrow = Q + q_off + (ulong)b * q_sb + (ulong)hq * q_sh + (ulong)pos * q_ss;
        for (int d = 0; d < DP; d++) /* zero past D: the f16 scores run to DP */
            QT(d, i / 16).f[i % 16] = d < D ? LD_IN(qrow, d) : 0.0f;
        const int end = row_span(causal, pos, seq_q, L, b, hq, &vp, &vr[i]);
        rend[i] = r0 + i < R ? min(k_hi, end) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
        frow[i] = MFLAG_ROW(b, hq, pos);
    }
    int16 rendv[LANES];
#if VAR_PER_KEY
    /* The rows' first keys, positions and ALiBi slopes, as lanes (var_rows_key16). */
    int16 begv[LANES], posv[LANES];
    float16 slopev[LANES];
    for (int lv = 0; lv < LANES; lv++) {
        union {
            int16 v;
            int i[16];
        } bu, pu;
        union {
            float16 v;
            float f[16];
        } su;
        for (int e = 0; e < 16; e++) {
            bu.i[e] = vr[16 * lv + e].beg;
            pu.i[e] = vr[16 * lv + e].p;
            su.f[e] = vr[16 * lv + e].slope;
        }
        begv[lv] = bu.v;
        posv[lv] = pu.v;
        slopev[lv] = su.v;
    }
#endif
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
        if ((has_mask && HIDES_BLOCK(RM, rend, mrow, frow, kt, nkeys)) || var_hides_block(RM, rend, vr, kt, nkeys))
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
             * softmax, and the K rows of the same keys of the next block, into L2 (locality 2):
             * the CPU's own prefetchers left the multiply-adds waiting, and into L1 they evict
             * each other and Qᵀ (16 rows: 3.5 ms against 5.4). See docs/measurements.md#lpf. */
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
                 * then broadcast from private memory, not an element at a time (see VF32_BLOCK;
                 * bf16 decode of 16 rows 3.29 ms against 3.82).
                 * See docs/measurements.md#fused-lanes. */
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
        const int guarded = has_mask || kt + LNB > k_all || kt < k_vis;
        int16 hid = (int16)(0); /* lanes (rows) that hide some key of the block */
#pragma unroll 1
        for (int lv = 0; lv < LANES; lv++) {
#if VAR_PER_KEY
            /* The variants: a key's 16 rows at a time (var_rows_key16); unchecked blocks take the
             * softcap and ALiBi alone. */
            if (guarded) {
                for (int n = 0; n < nkeys; n++)
                    sbk[n * LANES + lv].v = var_rows_key16(sbk[n * LANES + lv].v, kt + n, rendv[lv], begv[lv], posv[lv],
                                                           slopev[lv], &vr[16 * lv], &vp, has_mask, mask, mrow + 16 * lv);
            } else if (VAR_LOGIT) {
                for (int n = 0; n < nkeys; n++)
                    sbk[n * LANES + lv].v = var_rows16(sbk[n * LANES + lv].v, kt + n, posv[lv], slopev[lv], &vp);
            }
#else
            if (guarded) {
                int n = 0;
#if MASK_LANES
                /* The mask 16 keys at a time: each row's 16 loaded as one vector and turned into
                 * the lanes order (transpose_mb; with fewer registers, MASK_LANES 8 or 4, blocks of
                 * 8 or 4 lanes and keys), where PoCL gathered them 4 at a time through the stack
                 * (32 rows: 2.42 ms against 3.16). See docs/measurements.md#mask-lanes. */
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
#endif
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
        const int nfree = !guarded || !any(hid) ? nkeys : has_mask || kt < k_vis ? 0 : clamp(k_all - kt, 0, nkeys);
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
        float lse;
        const float sf = sink_join(mi, li, empty, hq, splits, &vp, &lse);
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)pos * o_ss;
        for (int c = 0; c < DV; c++)
            ST_OUT(orow, c, empty ? 0.0f : o_from_half(ot[c * LANES + lv].f[e]) * sf);
        if (has_lse)
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)pos * l_ss] = lse;
    }
}
#endif
#endif /* fused_lanes */
