/* Flash-style fused attention, the tiled kernel `fused` (GPUs): O = softmax(Q·Kᵀ·scale + mask)·V
 * without materialising scores. Shared rules (arguments, work ranges, masks): attn_common.cl.
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
 * at OWN_COL(tx, s) = VW·(tx + WGX·s); of O the NV column blocks of VW at OWN_COL(tx, c).
 * Interleaving keeps neighbouring work-items on neighbouring local-memory words. Q and P are row-major in local
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
#define floatV CAT(float, VW)
#define vloadV CAT(vload, VW)
#define vstoreV CAT(vstore, VW)
#if EXP2_POLY /* set for CPUs, where the built-in exp2 on wide vectors becomes per-lane calls */
#define exp2V CAT(exp2p, VW)
#else
#define exp2V exp2
#endif

/* The first of the VW keys of a tile (s < NS) or of the VW columns of O (s < NV) of block s of
 * work-item tx: the blocks interleaved across the WGX work-items of a row. */
#define OWN_COL(tx, s) (VW * ((tx) + WGX * (s)))
#if !KSEL || K_fused
__kernel __attribute__((reqd_work_group_size(WGX, WGY, 1))) void
fused(ATTN_KERNEL_ARGS(T_K, T_V) MFLAG_ARGS VARIANT_ARGS KVC_ARGS)
{
    const vparams vp = VP_MAKE;
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
    const kv_seqs seqs = KV_SEQS();
    const work_range w = work_range_of(GROUP_ID(2), splits, split_len, heads_kv, seq_q, seq_kv,
                                       causal, kvlen, r0, min(R, r0 + BM) - 1, 16, &vp, &seqs);
    const int split = w.split, b = w.b, hk = w.hk, L = w.L;
    int k_lo = w.k_lo, k_hi = w.k_hi, k_all = w.k_all;
    /* Every work-item reads every row's span: the range stays the work-group's. */
    NARROW_KEYS(r0, min(R, r0 + BM), 16);

    __global const T_K *Kb = KV_HEAD(K, k_off, k_sb, k_sh, b, hk) + (ulong)w.k0 * k_ss;
    __global const T_V *Vb = KV_HEAD(V, v_off, v_sb, v_sh, b, hk) + (ulong)w.k0 * v_ss;
    const kv_src ksrc = K_SRC(b, hk, w.k0), vsrc = V_SRC(b, hk, w.k0); /* paged rows, scales (kv_access.cl) */

    /* Stage Q once. */
    stage_q_rows(&Qs[0][0], DP + 4, BM, DP, lid, NWI, Q + q_off + (ulong)b * q_sb, q_sh, q_ss, hk,
                 group, seq_q, R, r0, D, &w);

    /* Per-row state of this work-item's rows: running max m and sum l of e^(s - m);
     * o is kept normalised (a convex combination of V rows, at half scale: it cannot overflow). */
    float m[RM], l[RM], keep[RM];
    int rend[RM]; /* one past the last key the row may see */
    vrow vr[RM];
    ulong mrow[RM];
    floatV o[RM][NV];
    for (int i = 0; i < RM; i++) {
        const int row = r0 + ty * RM + i;
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        m[i] = NEG_INF;
        l[i] = 0.0f;
        /* a row past R (never stored, rend 0) takes the last row's head: its ALiBi slope is read */
        const int end = row_span(causal, pos, w.sq, L, b, hk * group + min(row, R - 1) / seq_q, &vp, &vr[i]);
        rend[i] = row < R && pos < w.sq ? min(k_hi, end) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
        for (int c = 0; c < NV; c++)
            o[i][c] = (floatV)(0.0f);
    }

    if (TILE_TEST(has_mask)) {
        if (lid < 2)
            seen_kt[lid] = k_lo - 1; /* no tile's */
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int kt = k_lo; kt < k_hi; kt += BN) {
        /* A tile is guarded when some row hides some key in it: hidden entries get -inf, their
         * probabilities -0, and P·V skips those so NaN/Inf in hidden K/V rows cannot leak. */
        const int guarded = has_mask || kt + BN > k_all || VAR_PER_KEY;

        /* Neighbouring work-items take neighbouring keys, so that the transposing stores go to
         * neighbouring banks (along d they would all hit one bank). */
        for (int e = lid; e < BN * (DP / 4); e += NWI) {
            const int n = e % BN, d = 4 * (e / BN);
            const int key = kt + n;
            float4 x = (float4)(0.0f);
            if (key < k_hi) {
                x = row_load4_k(Kb + kv_row(&ksrc, key, k_sb, k_ss), d, D);
                if (!K_UNIT_SCALE)
                    x *= k_scale_of(&ksrc, key);
            }
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
         * which every work-item reaches after its read. The choice is the work-group's. With a
         * mask that heads or batches share (MFLAGS) the work-items test the mask's flags instead,
         * and the tiles before and after the rows' spans are not visited at all (NARROW_KEYS
         * above). On PoCL window 256 took 59 ms against 168; on an H200 it did not pay.
         * See docs/measurements.md#fused. */
        const int par = ((kt - k_lo) / BN) & 1;
        MARK_SEEN_TILE(BM, BN, NWI, lid, seen_kt[par]);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (TILE_TEST(has_mask) && seen_kt[par] != kt)
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
                    kv[j] = vloadV(0, &Ks(d + e, OWN_COL(tx, j)));
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
                    hide_keys(t, VW, kt + OWN_COL(tx, j), rend[i], has_mask, mask, mrow[i], &vr[i], &vp);
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
            float4 x = (float4)(0.0f);
            if (key < k_hi) {
                x = row_load4_v(Vb + kv_row(&vsrc, key, v_sb, v_ss), c, DV);
                if (!V_UNIT_SCALE)
                    x *= v_scale_of(&vsrc, key);
            }
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
                vstoreV(pj, 0, &Ps[ty * RM + i][OWN_COL(tx, j)]);
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
                        vv[c] = vloadV(0, &Vs(n + e, OWN_COL(tx, c)));
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
                        vv[c] = vloadV(0, &Vs(n + e, OWN_COL(tx, c)));
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
        const int hq = hk * group + row / seq_q, pos = row % seq_q;
        if (row >= R || pos >= w.sq)
            continue;
        /* the caller's rows of a packed sequence start at w.q0; split partials are not packed */
        const int opos = pos + (splits > 1 ? 0 : w.q0);
        /* No visible key: output exactly 0 and LSE -inf. A row whose scores were all NaN also
         * keeps m = -inf (fmax skips NaN) but has l = NaN: it is NaN, not empty. */
        const int empty = m[i] == NEG_INF && !isnan(l[i]);
        float lse;
        const float sf = sink_join(m[i], l[i], empty, hq, splits, &vp, &lse);
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)opos * o_ss;
        for (int c = 0; c < NV; c++) {
            float t[VW];
            vstoreV(empty ? (floatV)(0.0f) : o[i][c], 0, t);
            for (int q = 0; q < VW; q += 4)
                store4_row(orow, OWN_COL(tx, c) + q, o_from_half4(vload4(0, t + q)) * sf, DV);
        }
        if (has_lse && tx == 0)
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)opos * l_ss] = lse;
    }
}
#endif
#undef Ks
#undef Vs
