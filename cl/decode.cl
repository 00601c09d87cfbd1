/* Decode on GPUs (DECODE DIRECT 2): a few query rows against a long key/value cache, bound by
 * the memory traffic of K and V, which must be streamed once at the device's bandwidth.
 *
 * The tiled kernel (fused_tiled.cl) transposes each K tile through local memory and gives a
 * work-item a few keys of every tile; with one query row that leaves tiny work-groups (48 KiB of local
 * memory hold few keys at head_dim 128) and little memory traffic in flight. Here a work-group
 * of KG key groups of W = ceil(head_dim_v / 4) work-items reads K and V straight from global
 * memory, with no K/V tile in local memory:
 *   - scores: lane j of group g takes key base + g·W + j of each step of KG·W keys and computes
 *     its RM rows' dot products from the key's row (its own 16-byte loads; the row's cache lines
 *     are used whole through L1), with Q (RM rows) read from local memory as broadcast float4;
 *   - softmax: the group's W scores per row go through local memory; every lane of the group
 *     keeps the same running maximum and sum;
 *   - P·V: lane j owns O columns 4j..4j+3 and reads, for each of the group's W keys, 16 bytes of
 *     the V row: the group reads whole V rows, coalesced.
 * With KL > 1 (lanes per key row) the scores are read coalesced instead: KL lanes read one key
 * row together (lane c of them its 16-byte chunks c, c + KL, ...), W / KL rows at a time, so a
 * load instruction of a group covers whole rows; each lane leaves its partial dot product in
 * local memory and lane j then adds the KL partials of its key (one more barrier per step).
 * Each group keeps its own running state over its keys; the KG states are combined at the end
 * through local memory (a tree of KG/2, KG/4, ... 1), and split partials (flash-decoding) by
 * merge.cl as for the tiled kernel. Same arguments, grid meaning, numerics and rules (masks,
 * key lengths, causal range, NaN, empty rows, convex O) as the tiled kernel `fused`. With a mask,
 * the K and V rows of keys that no row of the block sees are not read (key_seen, attn_common.cl).
 *
 * Everything a step shares through local memory (Pt, Sc, Pr, Sv) belongs to one key group, so the
 * step's three synchronisations need only cover the group. With GSYNC 1 (DECODE DIRECT 3 on
 * NVIDIA GPUs) they are PTX barriers of the group alone: bar.warp.sync when groups lie within a
 * warp (32 % W == 0, whole warps in the work-group), else the named barrier g + 1 of the group's
 * W work-items (W a multiple of 32; id 0 is barrier()'s). Groups then run apart instead of
 * waiting for the slowest of the work-group at every step. Otherwise they are barrier(). */

#ifndef KG
#define KG 4 /* key groups per work-group (a power of 2) */
#endif
#ifndef W
#define W 32 /* work-items per key group: ceil(head_dim_v / 4) */
#endif
#ifndef RM
#define RM 1 /* packed query rows per work-group */
#endif
#ifndef DP
#define DP 128 /* head_dim rounded up to a multiple of 4 */
#endif
#ifndef LC
#define LC 8 /* K and V loads a work-item issues before using them */
#endif
#ifndef KL
#define KL 1 /* lanes that read one key row together for the scores (a power of 2 <= W) */
#endif
#ifndef KFULL
#define KFULL 0 /* 1: head_dim is a multiple of 4 */
#endif
#ifndef VFULL
#define VFULL 0 /* 1: the lanes' columns cover head_dim_v exactly (4·W == head_dim_v) */
#endif

#ifndef GSYNC
#define GSYNC 0
#endif

#define WG (KG * W)
#if GSYNC && W % 32 == 0
#define GROUP_SYNC() asm volatile("bar.sync %0, %1;" ::"r"(g + 1), "r"(W) : "memory")
#elif GSYNC && 32 % W == 0 && WG % 32 == 0
#define GROUP_SYNC() asm volatile("bar.warp.sync 0xffffffff;" ::: "memory")
#elif GSYNC
#error "GSYNC needs key groups of whole warps or groups within whole warps"
#else
#define GROUP_SYNC() barrier(CLK_LOCAL_MEM_FENCE)
#endif
#define STEP (KG * W)
#if KL > W
#error "KL must not exceed W"
#endif
#define RP (W / KL)                              /* key rows a group reads per pass (KL > 1) */
#define NPASS ((W + RP - 1) / RP)                /* passes over the group's W keys */
#define CPL ((DP / 4 + KL - 1) / KL)             /* 16-byte chunks of a row per lane */
#define PB (LC / CPL > 0 ? LC / CPL : 1)         /* passes whose loads are issued together */
/* Scores and probabilities of one step: [KG][RM][W] each, then whether a row of the block sees
 * each key of the step, [KG][W] (the V rows of the others are not read). The final
 * combination of the groups reuses the same words: [KG/2][RM][4W + 2] (o, then m and l, per
 * row). */
/* KL > 1: the partial dot products of a step, [KG][RM][W][KL + 1] (padded against bank
 * conflicts), after Sc, Pr and Sv. */
#if KL > 1
#define PT_FLOATS (KG * RM * W * (KL + 1))
#else
#define PT_FLOATS 0
#endif
#define SP_FLOATS (2 * KG * RM * W + KG * W + PT_FLOATS)
#define FIN_FLOATS ((KG / 2) * RM * (4 * W + 2))
#define SCR_FLOATS (SP_FLOATS > FIN_FLOATS ? SP_FLOATS : FIN_FLOATS)

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
decode_rows(ATTN_KERNEL_ARGS(T_K, T_V) VARIANT_ARGS KVC_ARGS)
{
    const vparams vp = VP_MAKE;
    __local float4 Qs[RM][DP / 4];
    __local float scr[SCR_FLOATS];
#define Sc(g, i, n) scr[((g) * RM + (i)) * W + (n)]
#define Pr(g, i, n) scr[KG * RM * W + ((g) * RM + (i)) * W + (n)]
#define Sv(g, n) scr[2 * KG * RM * W + (g) * W + (n)]
#define Pt(g, i, n, u) scr[2 * KG * RM * W + KG * W + (((g) * RM + (i)) * W + (n)) * (KL + 1) + (u)]

    const int t = get_local_id(0), g = t / W, j = t % W;
    const int R = group * seq_q;
    const int r0 = GROUP_ID(1) * RM;
    const kv_seqs seqs = KV_SEQS();
    const work_range w = work_range_of(GROUP_ID(2), splits, split_len, heads_kv, seq_q, seq_kv,
                                       causal, kvlen, r0, min(R, r0 + RM) - 1, STEP, &vp, &seqs);
    const int b = w.b, hk = w.hk, k_hi = w.k_hi;

    __global const T_K *Kb = KV_HEAD(K, k_off, k_sb, k_sh, b, hk) + (ulong)w.k0 * k_ss;
    __global const T_V *Vb = KV_HEAD(V, v_off, v_sb, v_sh, b, hk) + (ulong)w.k0 * v_ss;
    const kv_src ksrc = K_SRC(b, hk, w.k0), vsrc = V_SRC(b, hk, w.k0); /* paged rows, scales (kv_access.cl) */

    stage_q_rows((__local float *)Qs, DP, RM, DP, t, WG, Q + q_off + (ulong)b * q_sb, q_sh, q_ss, hk,
                 group, seq_q, R, r0, D, &w);

    float m[RM], l[RM];
    int rend[RM];
    vrow vr[RM];
    ulong mrow[RM];
    float4 o[RM];
    for (int i = 0; i < RM; i++) {
        const int row = r0 + i;
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        m[i] = NEG_INF;
        l[i] = 0.0f;
        /* a row past R (never stored, rend 0) takes the last row's head: its ALiBi slope is read */
        const int end = row_span(causal, pos, w.sq, w.L, b, hk * group + min(row, R - 1) / seq_q, &vp, &vr[i]);
        rend[i] = row < R && pos < w.sq ? min(k_hi, end) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
        o[i] = (float4)(0.0f);
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    const int c = 4 * j; /* this lane's O columns */
    for (int base = w.k_lo; base < k_hi; base += STEP) {
        const int kg0 = base + g * W; /* the group's first key of this step */
        const int key = kg0 + j;
        float s[RM];
        for (int i = 0; i < RM; i++)
            s[i] = 0.0f;
#if KL > 1
        /* Lane (kr, kc) of the group reads chunks kc, kc + KL, ... of row n = pass·RP + kr of
         * the step, PB passes (LC loads) before their products. */
        {
            const int kr = j / KL, kc = j % KL;
            if (kr < RP) {
                for (int p0 = 0; p0 < NPASS; p0 += PB) {
                    float4 kv[PB][CPL];
#pragma unroll
                    for (int pb = 0; pb < PB; pb++) {
                        const int n = (p0 + pb) * RP + kr, kk = kg0 + n;
                        const int ok = p0 + pb < NPASS && n < W && kk < k_hi &&
                                       (!KEY_TEST(has_mask) || key_seen(mask, has_mask, mrow, rend, vr, RM, kk));
                        __global const T_K *kr_p = Kb + kv_row(&ksrc, ok ? kk : 0, k_sb, k_ss);
#pragma unroll
                        for (int u = 0; u < CPL; u++) {
                            const int ch = kc + KL * u;
#if KFULL
                            kv[pb][u] = ok && ch < DP / 4 ? LD4_K(kr_p, 4 * ch) : (float4)(0.0f);
#else
                            kv[pb][u] = ok && ch < DP / 4 ? row_load4_k(kr_p, 4 * ch, D) : (float4)(0.0f);
#endif
                        }
                    }
#pragma unroll
                    for (int pb = 0; pb < PB; pb++) {
                        const int n = (p0 + pb) * RP + kr;
                        if (p0 + pb >= NPASS || n >= W || kg0 + n >= k_hi)
                            break;
                        for (int i = 0; i < RM; i++) {
                            float acc = 0.0f;
#pragma unroll
                            for (int u = 0; u < CPL; u++) {
                                const int ch = kc + KL * u;
                                if (ch < DP / 4) {
                                    const float4 q = Qs[i][ch];
                                    acc = MAD(q.s0, kv[pb][u].s0, acc);
                                    acc = MAD(q.s1, kv[pb][u].s1, acc);
                                    acc = MAD(q.s2, kv[pb][u].s2, acc);
                                    acc = MAD(q.s3, kv[pb][u].s3, acc);
                                }
                            }
                            Pt(g, i, n, kc) = acc;
                        }
                    }
                }
            }
        }
        GROUP_SYNC();
        if (key < k_hi) {
            for (int i = 0; i < RM; i++)
                for (int u = 0; u < KL; u++)
                    s[i] += Pt(g, i, j, u);
        }
#else
        /* With a mask, a key no row of the block sees (key_seen) reads no K row: its scores
         * come out -inf from the mask below all the same. */
        if (key < k_hi && (!KEY_TEST(has_mask) || key_seen(mask, has_mask, mrow, rend, vr, RM, key))) {
            /* LC loads of the key's row are issued before their products, so that each
             * work-item has several requests in flight (the loop bounds are constants). */
            __global const T_K *kr = Kb + kv_row(&ksrc, key, k_sb, k_ss);
            for (int d0 = 0; d0 < DP / 4; d0 += LC) {
                float4 kv[LC];
#pragma unroll
                for (int e = 0; e < LC; e++) {
                    const int d = 4 * (d0 + e);
#if KFULL /* head_dim a multiple of 4: plain 16-byte loads the compiler can issue together */
                    kv[e] = d0 + e < DP / 4 ? LD4_K(kr, d) : (float4)(0.0f);
#else
                    kv[e] = d0 + e < DP / 4 ? row_load4_k(kr, d, D) : (float4)(0.0f);
#endif
                }
#pragma unroll
                for (int e = 0; e < LC; e++) {
                    if (d0 + e >= DP / 4)
                        break;
                    for (int i = 0; i < RM; i++) {
                        const float4 q = Qs[i][d0 + e];
                        s[i] = MAD(q.s0, kv[e].s0, s[i]);
                        s[i] = MAD(q.s1, kv[e].s1, s[i]);
                        s[i] = MAD(q.s2, kv[e].s2, s[i]);
                        s[i] = MAD(q.s3, kv[e].s3, s[i]);
                    }
                }
            }
        }
#endif
        /* int8 and fp8 K: the key's scale (read for keys of the range only) */
        const float ksc = K_UNIT_SCALE || key >= k_hi ? 1.0f : k_scale_of(&ksrc, key);
        for (int i = 0; i < RM; i++) {
            float x = s[i] * ksc * scale;
            if (VAR_PER_KEY) {
                x = var_key(x, key, rend[i], &vr[i], &vp, has_mask, mask, mrow[i]);
            } else if (key >= rend[i]) {
                x = NEG_INF;
            } else if (has_mask) {
                /* A -inf mask hides the key even when its score is NaN. */
                const float mv = LD_MASK(mask, mrow[i] + key);
                x = mv == NEG_INF ? NEG_INF : x + mv;
            }
            Sc(g, i, j) = x;
        }
        GROUP_SYNC();

        /* Every lane of the group: the new maximum; its own key's p. */
        float mref[RM], keep[RM];
        int seen = 0; /* a row's score of this lane's key is not -inf */
        for (int i = 0; i < RM; i++) {
            float mt = NEG_INF;
            for (int n = 0; n < W; n++)
                mt = fmax(mt, Sc(g, i, n));
            const float mnew = fmax(m[i], mt);
            /* A row that has seen only -inf keeps a 0 reference so exp2 never sees -inf - -inf. */
            mref[i] = mnew == NEG_INF ? 0.0f : mnew;
            keep[i] = exp2((m[i] - mref[i]) * LOG2E);
            m[i] = mnew;
            const float x = Sc(g, i, j);
            Pr(g, i, j) = x == NEG_INF ? HIDDEN_P : exp2((x - mref[i]) * LOG2E);
            seen |= x != NEG_INF;
        }
        /* Whether P·V reads the key's V row: not where every row's p is hidden (a key the mask
         * hides from the block, or past every row's end). Written with Pr: read after the next
         * synchronisation, rewritten after the one past it. */
        Sv(g, j) = seen ? 1.0f : 0.0f;
        GROUP_SYNC();

        /* l' = l·alpha + Σ p; o' = o·(l·alpha/l') + Σ (p/l')·v, skipping hidden keys (p -0: NaN/Inf
         * in their V rows must not leak). */
        const int nk = min(W, k_hi - kg0);
        float inv[RM];
        for (int i = 0; i < RM; i++) {
            float ts = 0.0f;
            for (int n = 0; n < W; n++)
                ts += Pr(g, i, n);
            const float lnew = l[i] * keep[i] + ts;
            inv[i] = lnew > 0.0f ? 1.0f / lnew : 0.0f;
            keep[i] = isnan(lnew) ? lnew : l[i] * keep[i] * inv[i];
            inv[i] *= O_WEIGHT; /* the weights of P·V below: o at half scale */
            l[i] = lnew;
            o[i] *= keep[i];
        }
        /* LC V rows at a time, their loads issued before their use (rows past nk, and rows of
         * keys no row sees, are not read). */
        for (int n0 = 0; n0 < W; n0 += LC) {
            if (n0 >= nk)
                break;
            float4 v[LC];
#pragma unroll
            for (int e = 0; e < LC; e++) {
                v[e] = (float4)(0.0f);
                if (n0 + e < nk && Sv(g, n0 + e) != 0.0f) {
                    __global const T_V *vr = Vb + kv_row(&vsrc, kg0 + n0 + e, v_sb, v_ss);
#if VFULL /* no lane past head_dim_v, which is a multiple of 4 */
                    v[e] = LD4_V(vr, c);
#else
                    v[e] = row_load4_v(vr, c, DV);
#endif
                    if (!V_UNIT_SCALE)
                        v[e] *= v_scale_of(&vsrc, kg0 + n0 + e);
                }
            }
#pragma unroll
            for (int e = 0; e < LC; e++) {
                if (n0 + e >= nk)
                    break;
                for (int i = 0; i < RM; i++) {
                    const float p = Pr(g, i, n0 + e) * inv[i];
                    if (!IS_HIDDEN(p))
                        o[i] = MAD((float4)(p), v[e], o[i]);
                }
            }
        }
    }

    /* Combine the groups' states, halving the live groups each round. */
    for (int h = KG / 2; h >= 1; h /= 2) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (g >= h && g < 2 * h) {
            for (int i = 0; i < RM; i++) {
                __local float *f = &scr[((g - h) * RM + i) * (4 * W + 2)];
                vstore4(o[i], 0, f + c);
                if (j == 0) {
                    f[4 * W] = m[i];
                    f[4 * W + 1] = l[i];
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (g < h) {
            for (int i = 0; i < RM; i++) {
                __local const float *f = &scr[(g * RM + i) * (4 * W + 2)];
                const state_merge u = merge_states(m[i], l[i], f[4 * W], f[4 * W + 1]);
                const float4 o2 = vload4(0, f + c);
                o[i] = (u.has1 ? o[i] * u.k1 : (float4)(0.0f)) + (u.has2 ? o2 * u.k2 : (float4)(0.0f));
                m[i] = u.m;
                l[i] = u.l;
            }
        }
    }
    if (g != 0)
        return;

    O += o_off + (ulong)w.split * o_split;
    LSE += l_off + (ulong)w.split * l_split;
    for (int i = 0; i < RM; i++) {
        const int row = r0 + i;
        const int hq = hk * group + row / seq_q, pos = row % seq_q;
        if (row >= R || pos >= w.sq)
            continue;
        /* the caller's rows of a packed sequence start at w.q0; split partials are not packed */
        const int opos = pos + (splits > 1 ? 0 : w.q0);
        /* No visible key: exactly 0 and LSE -inf; all-NaN scores leave m = -inf but l = NaN. */
        const int empty = m[i] == NEG_INF && !isnan(l[i]);
        float lse;
        const float sf = sink_join(m[i], l[i], empty, hq, splits, &vp, &lse);
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)opos * o_ss;
        store4_row(orow, c, empty ? (float4)(0.0f) : o_from_half4(o[i]) * sf, DV);
        if (has_lse && j == 0)
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)opos * l_ss] = lse;
    }
#undef Sc
#undef Pr
#undef Sv
#undef Pt
}
