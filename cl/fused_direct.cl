/* CPUs: fused_direct (FUSED DIRECT 1, DECODE DIRECT 1), one work-item per block of RM packed
 * rows (packed as in fused_tiled.cl) and key split; what it shares with fused_lanes (numerics,
 * IN_PLACE, REF_SLACK) is in fused_cpu_common.cl.
 *
 * Prefill reads keys from a Kᵀ copy (transpose_k16 in layout.cl, f32) in panels of DBN keys,
 * Kt[z][n / DBN][d][n % DBN] (k_ss = DBN), as float16 vectors of 16 consecutive keys, and V from
 * a zero-padded f32 copy in panels of 16 columns (pack_v), Vp[z][c / 16][n][c % 16], as float16
 * vectors of 16 columns: each loop over them reads one sequential stream, and the copies cost
 * O(seq_kv) and stay hot in cache while every row block of the head streams them. Decode, and
 * prefill with few rows per kv head or long K and V (src/fused_cpu.c), read K and V in place instead
 * (IN_PLACE 1; 11 or more such rows go to fused_lanes.cl). Keys go in chunks of DBN = 16·NS
 * through registers (S[RM][NS] float16 accumulators) into a block of NB keys (below), whose
 * p = e^(s - m) (exp2p16) are then read back as broadcast scalars for O += P·V. Where O has more
 * vectors than the registers (RM·DV16 > NREG16, common.cl; with AVX-512 32: head_dim_v 256, or
 * many packed rows in place), P·V goes in register tiles of O (PV_TILE), and in place, blocks of
 * 8 or more packed rows (a multiple of 4; with AVX2 2 or more, even) compute their scores in
 * register tiles too (QK_TILE).
 * Panels, because rows of Kᵀ took one cache line of head_dim lines a page apart per chunk (d128
 * prefill 28.0 ms against 33.8); the register tiles made d256 causal prefill 1.36x faster.
 * See docs/measurements.md#fused-direct. */

/* Only the direct programs, whose options always define IN_PLACE (0 or 1), compile what follows
 * (a build by hand without it holds nothing of this file; KSEL, common.cl). */
#ifdef IN_PLACE
#define DBN (16 * NS)
/* Softmax blocks of NB = 256 keys: NC chunks of DBN keys each go through the QK registers into
 * the block's score array (RM·1 KiB on the stack, in L1), then one pass per row finds the
 * maximum, one takes the exponentials and one normalises, so the per-block work (horizontal
 * sums, the division, rescaling O) is paid once per 256 keys and the passes are independent
 * vector loops (32-key blocks 13.0 ms, 128-key 11.4, 256-key 2-3% less, 512-key no better).
 * See docs/measurements.md#nc. */
#ifndef NC
#define NC (256 / DBN)
#endif
#define NB (DBN * NC)
#if IN_PLACE
/* The scores in register tiles (qk16_tile) where RM rows take them (QK_TILE_FOR, common.cl). */
#ifndef QK_TILE
#if DT_K >= 3
/* K of a KV-cache type (kv_access.cl): decoding costs more than the loads, and qk16_row decodes
 * a key's row once per query row; the tile decodes it once per QT_R rows. */
#define QK_TILE (RM % QT_R == 0)
#else
#define QK_TILE QK_TILE_FOR(RM)
#endif
#endif
/* Vector c of a V row (c a constant after unrolling): only the last one can be short, since
 * 16·(DV16 - 1) < head_dim_v. */
#define LDV16(p, c) ((c) < DV16 - 1 ? LD16_V((p), 16 * (c)) : ld16_row_v((p), 16 * (c), DV))
/* LDV16 without a block type's scale (whose rows are whole), and that scale, which the untiled
 * P·V folds into the key's p: a scalar multiply instead of a vector one; VRSC the type's factor
 * on top (RSC_V), folded into p once per key. */
#define LDV16R(p, c) (KV_BLOCKED(DT_V) ? LD16R_V((p), 16 * (c)) : LDV16(p, c))
#define VBSC(p, c) BSC_V((p), 16 * (c))
#define VRSC (KV_BLOCKED(DT_V) ? RSC_V : 1.0f)
#else
/* Columns 16c..16c+15 of the V copy's key row at p: panel c of the head (v_sh = DV16 panels). */
#define LDV16(p, c) vload16(0, (p) + (ulong)(c) * (v_sh / DV16))
#define LDV16R(p, c) LDV16(p, c)
#define VBSC(p, c) 1.0f
#define VRSC 1.0f
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
 * divisor of RM) by PC column vectors (a divisor of DV16). In place, where V comes from memory
 * and every column tile reads the block's V rows once more (from L2 after the first), at most
 * about half the registers: 16 accumulators with AVX-512; with AVX2 4, 2 x 2 where it divides
 * (AVX2 decode of 8 rows 4.33 ms against 6.60 with 4 x 1). Prefill over the Kᵀ copy, bound by
 * the multiply-adds, up to 3/4 of them (6 x 1 with RM 6: d64 15.5 ms against 18.4 with 2 x 2).
 * See docs/measurements.md#pv-tile. */
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
 * transpose_k in layout.cl) only the keys of the DBN-key chunks that meet kv head z's span are
 * written, and with kvlen only those of the chunks that start below the batch's key length:
 * the chunks fused_direct reads; NULL: every key. One work-item per key. */
#if !KSEL || K_pack_v
__kernel void pack_v(__global const T_IN *V, ulong v_off, ulong v_sb, ulong v_sh, ulong v_ss,
                     __global float *Vp, ulong vp_off, ulong vp_sz, int N, int DV, int heads_kv,
                     __global const int *kspan, ulong ks_off, __global const int *kvlen, __global const int *cu_k,
                     int total_k)
{
    const int n = get_global_id(0), z = get_global_id(1);
    if (n >= N)
        return;
    const int b = z / heads_kv, hk = z % heads_kv, start = n / DBN * DBN;
    /* packed V (cu_k, FlashAttention's cu_seqlens_k): sequence b's rows from cu_k[b] on */
    ulong base = (ulong)b * v_sb;
    if (cu_k) {
        const int2 seq = packed_seq(cu_k, b, N, total_k);
        if (n >= seq.y)
            return;
        base = (ulong)seq.x * v_ss;
    }
    if (kvlen && start >= keys_of_batch(kvlen, b, N))
        return;
    if (kspan) {
        const ulong at = ks_off + 2 * (ulong)z;
        if (start + DBN <= 16 * kspan[at] || start >= 16 * kspan[at + 1])
            return;
    }
    __global const T_IN *src = V + v_off + base + (ulong)hk * v_sh + (ulong)n * v_ss;
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
fused_direct(ATTN_KERNEL_ARGS(T_KD, T_VD) MFLAG_ARGS VARIANT_ARGS KVC_ARGS DROP_ARGS)
{
    const vparams vp = VP_MAKE;
#if DROPOUT
    const dparams dp = DP_MAKE;
#endif
    const int R = group * seq_q, nrb = (R + RM - 1) / RM; /* row blocks, grid y (or x, flat) */
    const int r0 = TILE_Y(1, nrb) * RM;
    const kv_seqs seqs = KV_SEQS();
    const work_range w = work_range_of(TILE_Z(1, nrb), splits, split_len, heads_kv, seq_q, seq_kv,
                                       causal, kvlen, r0, min(R, r0 + RM) - 1, 16, &vp, &seqs);
    const int split = w.split, z = w.z, b = w.b, hk = w.hk, L = w.L;
    int k_lo = w.k_lo, k_hi = w.k_hi, k_all = w.k_all;
    const int k_vis = w.k_vis;
    /* The range starts at the 16-key vector of the first key some row may see (a window's or a
     * mask's), not at a chunk's edge: the copies' chunks then straddle two panels (below). */
    NARROW_KEYS(r0, min(R, r0 + RM), 16);

    /* The head's keys and values: K[key][d] and V[key][c] in place, or the panels of the
     * copies, Kt[key / DBN][d][key % DBN] (k_ss = DBN) and Vp[c / 16][key][c % 16] (v_ss = 16). */
    /* Packed K/V (VARLEN): the sequence's rows from w.k0 on; the copies hold each batch's keys
     * from 0. */
    __global const T_KD *Kb = KV_HEAD(K, k_off, k_sb, k_sh, b, hk) + (ulong)(IN_PLACE ? w.k0 : 0) * k_ss;
    __global const T_VD *Vb = KV_HEAD(V, v_off, v_sb, v_sh, b, hk) + (ulong)(IN_PLACE ? w.k0 : 0) * v_ss;
    const kv_src ksrc = K_SRC(b, hk, IN_PLACE ? w.k0 : 0), vsrc = V_SRC(b, hk, IN_PLACE ? w.k0 : 0); /* in place: paged rows, scales */

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
    vrow vr[RM];
    ulong mrow[RM], frow[RM];
    float16 o[RM][DV16];
    ROWS_LOOP
    for (int i = 0; i < RM; i++) {
        const int row = min(r0 + i, R - 1); /* rows past R compute on a copy, never stored */
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        /* past a packed sequence's rows (VARLEN): its last row's copy (or its first), never stored */
        const int qpos = w.q0 + min(pos, max(w.sq - 1, 0));
        __global const T_IN *qrow = Q + q_off + (ulong)b * q_sb + (ulong)hq * q_sh + (ulong)qpos * q_ss;
        for (int d = 0; d < DP; d++)
            qs[i].f[d] = d < D ? LD_IN(qrow, d) : 0.0f;
        m[i] = NEG_INF;
        l[i] = 0.0f;
        const int end = row_span(causal, pos, w.sq, L, b, hq, &vp, &vr[i]);
        rend[i] = r0 + i < R && pos < w.sq ? min(k_hi, end) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
        frow[i] = MFLAG_ROW(b, hq, pos);
#pragma unroll
        for (int c = 0; c < DV16; c++)
            o[i][c] = (float16)(0.0f);
    }

    for (int kt = k_lo; kt < k_hi; kt += NB) {
        const int nkeys = min(NB, k_hi - kt), nch = (nkeys + DBN - 1) / DBN, nv = (nkeys + 15) / 16;
        if ((has_mask && HIDES_BLOCK(RM, rend, mrow, frow, kt, nkeys)) || var_hides_block(RM, rend, vr, kt, nkeys))
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
#if IN_PLACE && KV_PREFETCH && defined(__clang__)
            /* Paged K/V, rows of all heads interleaved (BSHD, NHD pools), or K/V of a KV-cache
             * type (src/fused_cpu.c says when): while the chunk's scores are computed, the K rows
             * of the same keys of the next block and the chunk's V rows (used after the block's
             * softmax) into L2: pages in table order are scattered, rows H·D apart leave a head's
             * stream thin, the CPU's own prefetchers stop at each page, and decoding leaves them
             * behind. */
#pragma unroll
            for (int e = 0; e < 16; e++) {
                __global const uchar *kn = (__global const uchar *)(Kb + kv_row(&ksrc, min(kc + NB + e, k_hi - 1), k_sb, k_ss));
                __global const uchar *vn = (__global const uchar *)(Vb + kv_row(&vsrc, min(kc + e, k_hi - 1), v_sb, v_ss));
                /* rows' bytes from the compile-time widths (a prefetch past a row's end, even
                 * past the buffer, cannot fault): constant trip counts, the loops unrolled */
                for (int x = 0; x < K_ROW_BYTES(DP16); x += 64)
                    __builtin_prefetch((const void *)(uintptr_t)(kn + x), 0, 2);
                for (int x = 0; x < V_ROW_BYTES(16 * DV16); x += 64)
                    __builtin_prefetch((const void *)(uintptr_t)(vn + x), 0, 2);
            }
#endif
#if IN_PLACE
            /* Keys past the range load the range's last key; they are hidden below (guarded).
             * The rows go through a rolled loop and only a row's last 16 elements can be short
             * (DP - 16 < head_dim): unrolled over the rows, with a tail check in every load,
             * RM 16 made programs that took PoCL one to three minutes to compile. */
#if QK_TILE
#pragma unroll 1
            for (int i0 = 0; i0 < RM; i0 += QT_R) {
                float16 t[QT_R];
                qk16_tile(qs + i0, Kb, &ksrc, k_sb, k_ss, kc, k_hi - 1, D, t);
#pragma unroll
                for (int i = 0; i < QT_R; i++)
                    sb[i0 + i].v[ch] = t[i] * scale;
            }
#else
#pragma unroll 1
            for (int i = 0; i < RM; i++)
                sb[i].v[ch] = qk16_row(qs + i, Kb, &ksrc, k_sb, k_ss, kc, k_hi - 1, D) * scale;
#endif
#else
            /* The chunk's 16-key vectors in the panels of the Kᵀ copy: vector j (keys kc + 16j on,
             * kc a multiple of 16) in panel (kc + 16j) / DBN, at column (kc + 16j) % DBN of each
             * of its head_dim rows of DBN floats. The last chunk of the range computes only the
             * vectors that hold its keys, one at a time. */
            const int nvt = min(NS, nv - ch * NS);
            ulong kvo[NS];
#pragma unroll
            for (int j = 0; j < NS; j++) {
                const int kj = kc + 16 * min(j, nvt - 1);
                kvo[j] = (ulong)(kj / DBN) * (ulong)(DBN * D) + (ulong)(kj % DBN);
            }
            if (nvt == NS) {
                float16 s[RM][NS];
#pragma unroll
                for (int i = 0; i < RM; i++)
#pragma unroll
                    for (int j = 0; j < NS; j++)
                        s[i][j] = (float16)(0.0f);
                __global const float *kp = Kb;
                for (int d = 0; d < D; d++, kp += k_ss) {
                    float16 kv[NS];
#pragma unroll
                    for (int j = 0; j < NS; j++)
                        kv[j] = vload16(0, kp + kvo[j]);
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
            } else {
#pragma unroll 1
                for (int j = 0; j < nvt; j++) {
                    float16 s[RM];
#pragma unroll
                    for (int i = 0; i < RM; i++)
                        s[i] = (float16)(0.0f);
                    __global const float *kp = Kb + kvo[j];
                    for (int d = 0; d < D; d++, kp += k_ss) {
                        const float16 kv = vload16(0, kp);
#pragma unroll
                        for (int i = 0; i < RM; i++)
                            s[i] = MAD((float16)(qs[i].f[d]), kv, s[i]);
                    }
#pragma unroll
                    for (int i = 0; i < RM; i++)
                        sb[i].v[ch * NS + j] = s[i] * scale;
                }
            }
#endif
        }

        /* A block is guarded when some row hides some key of it; keys in [k_vis, k_all) are
         * hidden only by the mask. */
        const int guarded = has_mask || kt + NB > k_all || kt < k_vis;
        /* The rows' passes go side by side, a vector of every row at a time: each row's running
         * maximum and sum is a chain of dependent operations, which one row at a time would wait
         * on (16 vectors a block: 64 cycles of vmaxps latency per row). */
        float16 acc[RM]; /* the rows' block maxima, then their sums of p */
        float mref[RM], alpha[RM], inv[RM];
        /* Without a mask or the mods, the vectors va..vb-1 of a guarded block lie in [k_vis, k_all),
         * which every row sees: only a window's edges go key by key (the window's first block
         * is guarded for its first rows' keys alone). */
        int va = nv, vb = nv;
#if VAR_PER_KEY && !VAR_GUARD
        if (guarded && !has_mask) {
            va = clamp((k_vis - kt + 15) / 16, 0, nv);
            vb = max(va, clamp((k_all - kt) / 16, 0, nv));
        }
#endif
        ROWS_LOOP
        for (int i = 0; i < RM; i++) {
            if (guarded) {
                hide_keys(sb[i].f, 16 * va, kt, rend[i], has_mask, mask, mrow[i], &vr[i], &vp);
                for (int v = va; v < vb; v++)
                    sb[i].v[v] = var_logits16(sb[i].v[v], kt + 16 * v, &vr[i], &vp);
                hide_keys(sb[i].f + 16 * vb, 16 * (nv - vb), kt + 16 * vb, rend[i], has_mask, mask, mrow[i], &vr[i], &vp);
            } else if (VAR_LOGIT) {
                for (int v = 0; v < nv; v++)
                    sb[i].v[v] = var_logits16(sb[i].v[v], kt + 16 * v, &vr[i], &vp);
            }
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
#if DROPOUT
        /* Dropout on the weights of P·V only (l, m and the LSE keep every key), with the
         * normalisation in the same pass: hidden keys stay -0, and skipped. */
#pragma unroll 1
        for (int i = 0; i < RM; i++) {
            const int row = min(r0 + i, R - 1);
            drop_row(sb[i].v, nv, kt, row % seq_q, w.sq, L, b, hk * group + row / seq_q, inv[i], &dp);
        }
#else
        for (int v = 0; v < nv; v++) {
            ROWS_LOOP
            for (int i = 0; i < RM; i++)
                sb[i].v[v] *= inv[i];
        }
#endif

        /* P·V: the keys of 16-key vectors in which no row hides a key go without a check, those
         * of the other vectors skip each row's hidden keys (p -0) so that NaN/Inf in their V
         * never reaches O. A block in which no row hides a key goes unchecked in one run: with an
         * additive mask of finite values (biases) every block does (9.82 ms against 11.9 when
         * every masked block was checked). See docs/measurements.md#fused-direct. */
        /* Key kt + n's V row (kv_row: the copies' too, never paged) and its scale (1 but for
         * int8 and fp8 V, where it multiplies the key's p). */
#define VROW(n) (Vb + kv_row(&vsrc, kt + (n), v_sb, v_ss))
#define VSCALE(n) (V_UNIT_SCALE ? 1.0f : v_scale_of(&vsrc, kt + (n)))
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
                        acc[i][c] = (float16)(0.0f);
                int n = 0;
                while (n < nkeys) { /* n a multiple of 16: unchecked vectors, then one checked */
                    const int nfree = run_end(vhid, n, nkeys), n1 = min(nfree + 16, nkeys);
                    for (; n < nfree; n++) {
                        __global const T_VD *vp = VROW(n);
                        const float vs = VSCALE(n);
                        float16 vv[PC];
#pragma unroll
                        for (int c = 0; c < PC; c++)
                            vv[c] = LDV16(vp, c0 + c);
#pragma unroll
                        for (int i = 0; i < PR; i++) {
                            const float16 p = (float16)(sb[i0 + i].f[n] * vs);
#pragma unroll
                            for (int c = 0; c < PC; c++)
                                acc[i][c] = MAD(p, vv[c], acc[i][c]);
                        }
                    }
                    for (; n < n1; n++) {
                        float pn[PR];
                        int seen = 0;
#pragma unroll
                        for (int i = 0; i < PR; i++) {
                            pn[i] = sb[i0 + i].f[n];
                            seen |= !IS_HIDDEN(pn[i]);
                        }
                        if (!seen)
                            continue;
                        __global const T_VD *vp = VROW(n);
                        const float vs = VSCALE(n);
                        float16 vv[PC];
#pragma unroll
                        for (int c = 0; c < PC; c++)
                            vv[c] = LDV16(vp, c0 + c);
#pragma unroll
                        for (int i = 0; i < PR; i++)
                            if (!IS_HIDDEN(pn[i])) {
#pragma unroll
                                for (int c = 0; c < PC; c++)
                                    acc[i][c] = MAD((float16)(pn[i] * vs), vv[c], acc[i][c]);
                            }
                    }
                }
#pragma unroll
                for (int i = 0; i < PR; i++)
#pragma unroll
                    for (int c = 0; c < PC; c++)
                        o[i0 + i][c0 + c] += acc[i][c];
            }
        }
#else
        /* The block's P·V summed from 0, then added to o (rescaled above): one rounding at o's
         * scale a block, not one a key (numerics.md, long key ranges). */
        float16 pa[RM][DV16];
        ROWS_LOOP
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int c = 0; c < DV16; c++)
                pa[i][c] = (float16)(0.0f);
        int n = 0;
        while (n < nkeys) { /* n a multiple of 16: unchecked vectors, then one checked */
            const int nfree = run_end(vhid, n, nkeys), n1 = min(nfree + 16, nkeys);
            for (; n < nfree; n++) {
                __global const T_VD *vp = VROW(n);
                const float vs = VSCALE(n) * VRSC;
                float pn[RM];
                ROWS_LOOP
                for (int i = 0; i < RM; i++)
                    pn[i] = sb[i].f[n] * vs;
#pragma unroll
                for (int c = 0; c < DV16; c++) {
                    const float16 vv = LDV16R(vp, c);
                    const float bs = VBSC(vp, c);
                    ROWS_LOOP
                    for (int i = 0; i < RM; i++)
                        pa[i][c] = MAD((float16)(pn[i] * bs), vv, pa[i][c]);
                }
            }
            for (; n < n1; n++) {
                float pn[RM];
                int seen = 0;
                ROWS_LOOP
                for (int i = 0; i < RM; i++) {
                    pn[i] = sb[i].f[n];
                    seen |= !IS_HIDDEN(pn[i]);
                }
                if (!seen)
                    continue;
                __global const T_VD *vp = VROW(n);
                const float vs = VSCALE(n) * VRSC;
                /* Each V vector is loaded once for all rows (a load per row made RM copies of the
                 * tail loads: slow to compile). */
#pragma unroll
                for (int c = 0; c < DV16; c++) {
                    const float16 vv = LDV16R(vp, c);
                    const float bs = VBSC(vp, c) * vs;
                    ROWS_LOOP
                    for (int i = 0; i < RM; i++)
                        if (!IS_HIDDEN(pn[i]))
                            pa[i][c] = MAD((float16)(pn[i] * bs), vv, pa[i][c]);
                }
            }
        }
        ROWS_LOOP
        for (int i = 0; i < RM; i++)
#pragma unroll
            for (int c = 0; c < DV16; c++)
                o[i][c] += pa[i][c];
#endif
#undef VROW
#undef VSCALE
    }

    O += o_off + (ulong)split * o_split;
    LSE += l_off + (ulong)split * l_split;
    ROWS_LOOP
    for (int i = 0; i < RM; i++) {
        const int row = r0 + i;
        const int hq = hk * group + row / seq_q, pos = row % seq_q;
        if (row >= R || pos >= w.sq)
            continue;
        /* the caller's rows of a packed sequence start at w.q0; split partials are not packed */
        const int opos = pos + (splits > 1 ? 0 : w.q0);
        /* No visible key: 0 and LSE -inf. A row whose scores were all NaN keeps m = -inf too
         * (fmax skips NaN) but has l = NaN: it is NaN, not empty. */
        const int empty = m[i] == NEG_INF && !isnan(l[i]);
        float lse;
        const float sf = sink_join(m[i], l[i], empty, hq, splits, &vp, &lse);
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)opos * o_ss;
        /* f32 whole vectors are stored as they are; the rest of the row (f16/bf16 output, or
         * the f32 tail) goes through ob and a rolled loop of element stores. */
        float ob[16 * DV16];
#pragma unroll
        for (int c = 0; c < DV16; c++) {
            const float16 x = empty ? (float16)(0.0f) : o_from_half16(o[i][c]) * sf;
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
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)opos * l_ss] = lse;
    }
}
#endif
#endif /* IN_PLACE */
