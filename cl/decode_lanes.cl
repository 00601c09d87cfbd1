/* Decode on GPUs with the lanes of a key group sharing every key row (DECODE DIRECT 4): a few
 * query rows against a long key/value cache, with no barrier in the key loop where the device
 * has lane shuffles.
 *
 * decode_rows (decode.cl) gives each lane a key of its group's step: the scores need the K rows
 * one lane each, and the softmax and P·V share scores and probabilities through local memory,
 * three synchronisations per step, between which no load is in flight. Here a key group is LANES
 * work-items (a power of 2, at most 32) that read each key row together, lane j its 16-byte
 * chunks j, j + LANES, ...: every load instruction of the group covers whole rows. A step of the
 * group takes KU consecutive keys:
 *   - loads: the KU rows of K and the KU rows of V are all issued before any is used, so
 *     2·KU row chunks per lane are in flight, and V does not wait for the scores;
 *   - scores: each lane adds its chunks' products for every row and key, and the group sums the
 *     LANES partials, after which every lane holds the same scores bit for bit;
 *   - softmax and P·V: every lane keeps the same running maximum and sum in registers and
 *     updates its own O columns (the chunks of V it loaded).
 * With SHFL 1 (NVIDIA GPUs: groups of whole warps or within whole warps, work-groups of whole
 * warps) the sum is a butterfly of PTX shfl.sync.bfly (x = 1, 2, 4, ... LANES/2: s += s of lane
 * j ^ x; both lanes of a pair add the same two values, so all end equal), and the key loop has no
 * barrier: the groups and warps run apart. Otherwise the partials go through local memory, one
 * barrier a step, and every lane adds its group's in the same order.
 *
 * KG groups per work-group take interleaved steps of the work-group's keys; their states are
 * combined at the end through local memory (a tree of KG/2, KG/4, ... 1), and split partials
 * (flash-decoding) by merge.cl. Same arguments, grid meaning, numerics and rules (masks, key
 * lengths, causal range, NaN, empty rows, O kept a convex combination of V rows) as decode_rows
 * and the tiled kernel `fused`. With a mask, the K and V rows of keys that no row of the block
 * sees are not read (key_seen, attn_common.cl).
 *
 * MASKED 1 (a mask is passed; src/fused_gpu.c sets it): without a mask the program holds no
 * visibility test at all, every key up to k_hi is read (an H200 ran f16 decode at 2.74 TB/s, not
 * 3.3, while that program held the scan behind has_mask). With SHFL the lanes of a group share
 * the step's mask reads, a load a lane where every lane read all RM·KU entries one after another
 * (key_seen stops at a row that sees the key), and a warp skips a step that none of its rows sees;
 * the softmax reads no mask entry of a key hidden from every row (H200, window 1024: 0.162 ms
 * against 0.529). See docs/measurements.md#masked. */

#ifndef KG
#define KG 4 /* key groups per work-group (a power of 2) */
#endif
#ifndef LANES
#define LANES 32 /* work-items per key group, reading each key row together (a power of 2) */
#endif
#ifndef RM
#define RM 1 /* packed query rows per work-group */
#endif
#ifndef DP
#define DP 128 /* head_dim rounded up to a multiple of 4 */
#endif
#ifndef DVP
#define DVP 128 /* head_dim_v rounded up to a multiple of 4 */
#endif
#ifndef KU
#define KU 8 /* keys per step of a group, whose K and V rows are loaded before their use */
#endif
#ifndef KFULL
#define KFULL 0 /* 1: head_dim is a multiple of 4 */
#endif
#ifndef VFULL
#define VFULL 0 /* 1: head_dim_v is a multiple of 4 */
#endif
#ifndef SHFL
#define SHFL 0
#endif
#ifndef MASKED
#define MASKED 0 /* 1: the caller passes a mask (has_mask 1) */
#endif

#define WG (KG * LANES)
#define CKN ((DP / 4 + LANES - 1) / LANES)  /* 16-byte chunks of a K row per lane */
#define CVN ((DVP / 4 + LANES - 1) / LANES) /* 16-byte chunks of a V row (O columns) per lane */
#define QP (CKN * LANES)                    /* float4 per staged Q row: zero past head_dim */
/* Local memory besides Q: without SHFL, the partial scores [2][RM·KU][WG] (two buffers, used by
 * alternate steps); after the key loop the combination of the groups, [KG/2][RM][FP] (o, then m
 * and l, per row; FP keeps rows 16-byte aligned). */
#if SHFL
#define XCH_FLOATS 0
#else
#define XCH_FLOATS (2 * RM * KU * WG)
#endif
#define FP (4 * LANES * CVN + 4)
#define FIN_FLOATS ((KG / 2) * RM * FP)
#define SCR_MAX (XCH_FLOATS > FIN_FLOATS ? XCH_FLOATS : FIN_FLOATS)
#define SCR_FLOATS (SCR_MAX > 0 ? SCR_MAX : 1)

#if KFULL
#define K_CHUNK(p, d) LD4_IN(p, d)
#else
#define K_CHUNK(p, d) row_load4(p, d, D)
#endif
#if VFULL
#define V_CHUNK(p, d) LD4_IN(p, d)
#else
#define V_CHUNK(p, d) row_load4(p, d, DV)
#endif

#if SHFL
/* The value v of lane (lane id ^ x) of the warp; every lane of the warp must take part. */
inline uint lane_xor_u(uint v, int x)
{
    uint r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(v), "r"(x));
    return r;
}
inline float lane_xor(float v, int x)
{
    return as_float(lane_xor_u(as_uint(v), x));
}
#endif
#define MSCAN (SHFL && MASKED) /* the lanes share the mask reads */
#if MSCAN
/* The (row, key) mask entries of a step that each lane reads: pairs j, j + LANES, ... of the
 * RM·KU, pair p being row p / KU and key p % KU of the step. */
#define NPL ((RM * KU + LANES - 1) / LANES)
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1))) void
decode_lanes(ATTN_KERNEL_ARGS(T_IN, T_IN) VARIANT_ARGS)
{
    const vparams vp = VP_MAKE;
    __local float4 Qs[RM][QP];
    __local float scr[SCR_FLOATS];

    const int t = get_local_id(0), g = t / LANES, j = t % LANES;
    const int R = group * seq_q;
    const int r0 = GROUP_ID(1) * RM;
    const kv_seqs seqs = KV_SEQS();
    const work_range w = work_range_of(GROUP_ID(2), splits, split_len, heads_kv, seq_q, seq_kv,
                                       causal, kvlen, r0, min(R, r0 + RM) - 1, KG * KU, &vp, &seqs);
    const int b = w.b, hk = w.hk, k_hi = w.k_hi;

    __global const T_IN *Kb = K + k_off + (ulong)b * k_sb + (ulong)hk * k_sh;
    __global const T_IN *Vb = V + v_off + (ulong)b * v_sb + (ulong)hk * v_sh;

    stage_q_rows((__local float *)Qs, 4 * QP, RM, 4 * QP, t, WG, Q + q_off + (ulong)b * q_sb, q_sh, q_ss,
                 hk, group, seq_q, R, r0, D, &w);

    float m[RM], l[RM];
    int rend[RM];
    vrow vr[RM];
    ulong mrow[RM];
    float4 o[RM][CVN];
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int row = r0 + i;
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        m[i] = NEG_INF;
        l[i] = 0.0f;
        /* a row past R (never stored, rend 0) takes the last row's head: its ALiBi slope is read */
        const int end = row_span(causal, pos, seq_q, w.L, b, hk * group + min(row, R - 1) / seq_q, &vp, &vr[i]);
        rend[i] = row < R ? min(k_hi, end) : 0;
        mrow[i] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
#pragma unroll
        for (int c = 0; c < CVN; c++)
            o[i][c] = (float4)(0.0f);
    }
#if MSCAN
    /* This lane's share of the step's mask entries: pair p's row end (0 past the block or the
     * pairs) and mask row, and its key within the step. */
    int pend[NPL], pkey[NPL];
    ulong pmrow[NPL];
#pragma unroll
    for (int s = 0; s < NPL; s++) {
        const int p = j + LANES * s, row = r0 + p / KU;
        const int pos = row % seq_q, hq = hk * group + row / seq_q;
        pkey[s] = p % KU;
        pend[s] = p < RM * KU && row < R ? min(k_hi, row_end(causal, pos, seq_q, w.L, &vp)) : 0;
        pmrow[s] = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)pos * m_ss;
    }
#endif
#if !SHFL
    int par = 0;
#endif
    barrier(CLK_LOCAL_MEM_FENCE);

    /* Every group runs the same number of steps (the shuffles need all lanes of a warp); keys
     * at or past k_hi are neither loaded nor visible. */
    for (int b0 = w.k_lo; b0 < k_hi; b0 += KG * KU) {
        const int kb = b0 + g * KU; /* the group's first key of this step */
        /* With a mask, bit u: key kb + u is visible to a row of the block (key_seen); the K and
         * V rows of the other keys are not read (their scores come out -inf from the mask
         * below). The group's lanes read the same mask entries, so they agree on every bit. */
#if MASKED
        uint vis = ~0u;
        if (has_mask) {
            vis = 0u;
#if MSCAN
            /* Each lane reads its share of the entries, all in flight together, and the group
             * ORs the bits by the butterfly: a load a lane, not RM·KU. */
#pragma unroll
            for (int s = 0; s < NPL; s++) {
                const int key = kb + pkey[s];
                vis |= (uint)(key < pend[s] && LD_MASK(mask, pmrow[s] + key) != NEG_INF) << pkey[s];
            }
#pragma unroll
            for (int x = 1; x < LANES; x *= 2)
                vis |= lane_xor_u(vis, x);
            /* A step that no row of any group of the warp sees adds nothing (every p 0, the
             * maxima and sums stay): the whole warp skips it, loads, scores, shuffles and all.
             * The groups of a warp decide together, so every shuffle still has all 32 lanes. */
            uint wvis = vis;
#pragma unroll
            for (int x = LANES; x < 32; x *= 2)
                wvis |= lane_xor_u(wvis, x);
            if (wvis == 0u)
                continue;
#else
#pragma unroll
            for (int u = 0; u < KU; u++)
                vis |= (uint)key_seen(mask, has_mask, mrow, rend, vr, RM, kb + u) << u;
#endif
        }
#else
        const uint vis = ~0u; /* no mask passed: every key up to k_hi is read */
#endif
        float4 kv[KU][CKN], vv[KU][CVN];
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int ok = kb + u < k_hi && (vis >> u & 1u);
            __global const T_IN *kr = Kb + (ulong)(ok ? kb + u : 0) * k_ss;
            __global const T_IN *vr = Vb + (ulong)(ok ? kb + u : 0) * v_ss;
#pragma unroll
            for (int c = 0; c < CKN; c++) {
                const int ch = j + LANES * c;
                kv[u][c] = ok && ch < DP / 4 ? K_CHUNK(kr, 4 * ch) : (float4)(0.0f);
            }
#pragma unroll
            for (int c = 0; c < CVN; c++) {
                const int ch = j + LANES * c;
                vv[u][c] = ok && ch < DVP / 4 ? V_CHUNK(vr, 4 * ch) : (float4)(0.0f);
            }
        }

        /* This lane's part of every score (Qs is zero past head_dim, kv past the row). */
        float s[RM][KU];
#pragma unroll
        for (int i = 0; i < RM; i++) {
#pragma unroll
            for (int u = 0; u < KU; u++)
                s[i][u] = 0.0f;
#pragma unroll
            for (int c = 0; c < CKN; c++) {
                const float4 q = Qs[i][j + LANES * c];
#pragma unroll
                for (int u = 0; u < KU; u++) {
                    s[i][u] = MAD(q.s0, kv[u][c].s0, s[i][u]);
                    s[i][u] = MAD(q.s1, kv[u][c].s1, s[i][u]);
                    s[i][u] = MAD(q.s2, kv[u][c].s2, s[i][u]);
                    s[i][u] = MAD(q.s3, kv[u][c].s3, s[i][u]);
                }
            }
        }
#if SHFL
        /* The butterfly over the group's lanes. */
#pragma unroll
        for (int x = 1; x < LANES; x *= 2) {
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int u = 0; u < KU; u++)
                    s[i][u] += lane_xor(s[i][u], x);
        }
#else
        /* Buffer `par` of the exchange: a lane writing it again two steps later has passed the
         * next step's barrier, which every lane reaches only after this step's reads. */
        {
            __local float *xb = scr + par * (RM * KU * WG);
            par ^= 1;
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int u = 0; u < KU; u++)
                    xb[(i * KU + u) * WG + t] = s[i][u];
            barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
            for (int i = 0; i < RM; i++)
#pragma unroll
                for (int u = 0; u < KU; u++) {
                    __local const float *xr = xb + (i * KU + u) * WG + g * LANES;
                    float a = 0.0f;
                    for (int n = 0; n < LANES; n++)
                        a += xr[n];
                    s[i][u] = a;
                }
        }
#endif

        /* Online softmax over the step's keys, the same in every lane of the group; then
         * l' = l·alpha + Σ p; o' = o·(l·alpha/l') + Σ (p/l')·v, skipping hidden keys (p -0: NaN
         * or Inf in their V rows must not leak). */
#pragma unroll
        for (int i = 0; i < RM; i++) {
            float mt = NEG_INF;
#pragma unroll
            for (int u = 0; u < KU; u++) {
                const int key = kb + u;
                float x = s[i][u] * scale;
#if MASKED
                if (key >= rend[i] || !(vis >> u & 1u)) { /* past the row, or hidden from all */
#else
                if (key >= rend[i]) {
#endif
                    x = NEG_INF;
                } else if (VAR_PER_KEY) {
                    x = var_key(x, key, rend[i], &vr[i], &vp, has_mask, mask, mrow[i]);
                } else if (has_mask) {
                    /* A -inf mask hides the key even when its score is NaN. */
                    const float mv = LD_MASK(mask, mrow[i] + key);
                    x = mv == NEG_INF ? NEG_INF : x + mv;
                }
                s[i][u] = x;
                mt = fmax(mt, x);
            }
            const float mnew = fmax(m[i], mt);
            /* A row that has seen only -inf keeps a 0 reference so exp2 never sees -inf - -inf. */
            const float mref = mnew == NEG_INF ? 0.0f : mnew;
            float keep = exp2((m[i] - mref) * LOG2E);
            m[i] = mnew;
            float ts = 0.0f;
#pragma unroll
            for (int u = 0; u < KU; u++) {
                s[i][u] = s[i][u] == NEG_INF ? HIDDEN_P : exp2((s[i][u] - mref) * LOG2E);
                ts += s[i][u];
            }
            const float lnew = l[i] * keep + ts;
            const float inv = lnew > 0.0f ? 1.0f / lnew : 0.0f;
            keep = isnan(lnew) ? lnew : l[i] * keep * inv;
            const float w = inv * O_WEIGHT; /* the weights of P·V below: o at half scale */
            l[i] = lnew;
#pragma unroll
            for (int c = 0; c < CVN; c++)
                o[i][c] *= keep;
#pragma unroll
            for (int u = 0; u < KU; u++) {
                const float p = s[i][u] * w;
                if (!IS_HIDDEN(p)) {
#pragma unroll
                    for (int c = 0; c < CVN; c++)
                        o[i][c] = MAD((float4)(p), vv[u][c], o[i][c]);
                }
            }
        }
    }

    /* Combine the groups' states, halving the live groups each round. */
    for (int h = KG / 2; h >= 1; h /= 2) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (g >= h && g < 2 * h) {
#pragma unroll
            for (int i = 0; i < RM; i++) {
                __local float *f = &scr[((g - h) * RM + i) * FP];
#pragma unroll
                for (int c = 0; c < CVN; c++)
                    vstore4(o[i][c], 0, f + 4 * (j + LANES * c));
                if (j == 0) {
                    f[FP - 4] = m[i];
                    f[FP - 3] = l[i];
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (g < h) {
#pragma unroll
            for (int i = 0; i < RM; i++) {
                __local const float *f = &scr[(g * RM + i) * FP];
                const state_merge u = merge_states(m[i], l[i], f[FP - 4], f[FP - 3]);
#pragma unroll
                for (int c = 0; c < CVN; c++) {
                    const float4 o2 = vload4(0, f + 4 * (j + LANES * c));
                    o[i][c] = (u.has1 ? o[i][c] * u.k1 : (float4)(0.0f)) + (u.has2 ? o2 * u.k2 : (float4)(0.0f));
                }
                m[i] = u.m;
                l[i] = u.l;
            }
        }
    }
    if (g != 0)
        return;

    O += o_off + (ulong)w.split * o_split;
    LSE += l_off + (ulong)w.split * l_split;
#pragma unroll
    for (int i = 0; i < RM; i++) {
        const int row = r0 + i;
        if (row >= R)
            continue;
        const int hq = hk * group + row / seq_q, pos = row % seq_q;
        /* No visible key: exactly 0 and LSE -inf; all-NaN scores leave m = -inf but l = NaN. */
        const int empty = m[i] == NEG_INF && !isnan(l[i]);
        float lse;
        const float sf = sink_join(m[i], l[i], empty, hq, splits, &vp, &lse);
        __global T_OUT *orow = O + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)pos * o_ss;
#pragma unroll
        for (int c = 0; c < CVN; c++)
            store4_row(orow, 4 * (j + LANES * c), empty ? (float4)(0.0f) : o_from_half4(o[i][c]) * sf, DV);
        if (has_lse && j == 0)
            LSE[(ulong)b * l_sb + (ulong)hq * l_sh + (ulong)pos * l_ss] = lse;
    }
}
