/* The backward pass of fused attention (clattn_attention_backward, src/backward.c; assembled
 * after common.cl, kv_access.cl and attn_common.cl, so that which keys a row sees, the logits,
 * the sinks and dropout follow the forward's rules to the letter), and clattn_dropout_mask.
 *
 * FlashAttention 2's algorithm with P recomputed from the forward's LSE. bwd_pre stages each row
 * of q and dout as f32 (zero-padded to whole float16 vectors: the main kernel reads them as
 * broadcast scalars, whatever their storage type) and D = rowsum(dout ∘ out), with the sinks'
 * per-row share of their gradient. bwd_main then takes one kv head's keys (of one of G ranges) in
 * blocks of 16, one key per float16 lane, and for each block streams every row of the kv head's
 * query group: s = q·Kᵀ, the logits, P = e^(x - lse), dP = dout·Vᵀ, dS = P ∘ (z·dP - D) (z the
 * dropout multipliers, the softcap's 1 - tanh² applied), then dV += (P∘z)ᵀ·dout and
 * dK += dSᵀ·q in the block's accumulators and dQ += dS·K into the row's f32 partial of range g.
 * dK and dV of a block are complete when its rows are done (no other work-item touches them),
 * and each dQ partial is written by one work-item in the order of its keys: with bwd_dq summing
 * the G partials in order, every gradient is a fixed sequence of operations, bitwise the same
 * from run to run, with no atomics. Five multiply-adds per (row, key, dim), as FlashAttention 2
 * (2.5 times the forward's two). */

#if defined(DT_IN)
/* Element loads and stores of the backward's other tensors, by their storage types: out (DT_O)
 * and dout (DT_G) are read, dq, dk and dv (DT_DQ, DT_DK, DT_DV) written. */
#if DT_O == 0
#define T_O float
#define LD_O(p, i) ((p)[i])
#elif DT_O == 1
#define T_O half
#define LD_O(p, i) vload_half((i), (p))
#else
#define T_O ushort
#define LD_O(p, i) bf16_to_f32((p)[i])
#endif
#if DT_G == 0
#define T_G float
#define LD_G(p, i) ((p)[i])
#elif DT_G == 1
#define T_G half
#define LD_G(p, i) vload_half((i), (p))
#else
#define T_G ushort
#define LD_G(p, i) bf16_to_f32((p)[i])
#endif
#define DEFINE_STORE(R, DT)                                                                      \
    inline void st_##R(__global void *p, ulong i, float x)                                      \
    {                                                                                            \
        if (DT == 0)                                                                             \
            ((__global float *)p)[i] = x;                                                        \
        else if (DT == 1)                                                                        \
            vstore_half_rte(x, i, (__global half *)p);                                           \
        else                                                                                     \
            ((__global ushort *)p)[i] = f32_to_bf16(x);                                          \
    }
DEFINE_STORE(dq, DT_DQ)
DEFINE_STORE(dk, DT_DK)
DEFINE_STORE(dv, DT_DV)
#endif

#ifndef DK16
#define DK16 4 /* head_dim in float16 vectors: 16·DK16 >= head_dim */
#endif
#ifndef DV16
#define DV16 4 /* head_dim_v likewise */
#endif
#define DPK (16 * DK16)
#define DPV (16 * DV16)

/* bwd_pre: one work-item per row (b·heads_q + hq)·seq_q + i = y + ny·z of the grid (x 1). Writes the row's q and dout as f32 at Qf + row·DPK and Gf + row·DPV (zero past
 * head_dim and head_dim_v), D = Σ dout·out at Dr[row], and with sinks (has_dsink) the row's share
 * of its head's sink gradient, -e^(s_h - lse)·D, at Sr[row] (0 where the head has no sink). */
#if !KSEL || K_bwd_pre
__kernel void bwd_pre(__global const T_IN *Q, ulong q_off, ulong q_sb, ulong q_sh, ulong q_ss,
                      __global const T_O *O, ulong o_off, ulong o_sb, ulong o_sh, ulong o_ss,
                      __global const T_G *G, ulong g_off, ulong g_sb, ulong g_sh, ulong g_ss,
                      __global const float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,
                      __global float *W, ulong qf_off, ulong gf_off, ulong dr_off, ulong sr_off, int heads_q, int seq_q, int D, int DV, int has_dsink,
                      __global const float *sinks, ulong s_off, ulong s_sh, ulong rows, int ny)
{
    const ulong row = get_global_id(1) + (ulong)ny * get_global_id(2);
    if (row >= rows)
        return;
    __global float *Qf = W + qf_off, *Gf = W + gf_off, *Dr = W + dr_off, *Sr = W + sr_off;
    const int i = (int)(row % (ulong)seq_q), bh = (int)(row / (ulong)seq_q), hq = bh % heads_q, b = bh / heads_q;
    __global const T_IN *q = Q + q_off + (ulong)b * q_sb + (ulong)hq * q_sh + (ulong)i * q_ss;
    __global const T_O *o = O + o_off + (ulong)b * o_sb + (ulong)hq * o_sh + (ulong)i * o_ss;
    __global const T_G *g = G + g_off + (ulong)b * g_sb + (ulong)hq * g_sh + (ulong)i * g_ss;
    __global float *qf = Qf + row * DPK, *gf = Gf + row * DPV;
    for (int d = 0; d < DPK; d++)
        qf[d] = d < D ? LD_IN(q, d) : 0.0f;
    float acc = 0.0f;
    for (int c = 0; c < DPV; c++) {
        const float x = c < DV ? LD_G(g, c) : 0.0f;
        gf[c] = x;
        if (c < DV)
            acc = MAD(x, LD_O(o, c), acc);
    }
    Dr[row] = acc;
    if (has_dsink) {
        float share = 0.0f;
        if (sinks) {
            const float s = sinks[s_off + (ulong)hq * s_sh];
            const float lse = LSE[l_off + (ulong)b * l_sb + (ulong)hq * l_sh + (ulong)i * l_ss];
            /* no sink (-inf): no share; an empty row (lse = s) has out 0 and D 0 */
            if (s != NEG_INF)
                share = -exp(s - lse) * acc;
        }
        Sr[row] = share;
    }
}
#endif

/* The 16 logits of keys kt .. kt+15 for row i (diagonal context r, keys before rend, mask row
 * mrow) from their scaled scores s, as the forward takes them (var_keys16 and var_logit in
 * attn_common.cl): the softcap, whose value is kept in *sc for its derivative, the additive mask
 * and ALiBi; *hid marks the hidden keys (their logits are then meaningless). */
inline float16 bwd_logits16(float16 s, int kt, int rend, const vrow *r, const vparams *vp, int has_mask,
                            __global const T_MASK *mask, ulong mrow, float16 *sc, int16 *hid)
{
    const int16 key = (int16)(kt) + (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int16 h = (key >= (int16)(rend)) | (key < (int16)(r->beg));
#if VARIANTS & V_SOFTCAP
    s = softcap16(s, vp->cap);
#endif
    *sc = s;
#if VARIANTS & V_MASK_MOD
    union {
        int16 v;
        int i[16];
    } hu = {h};
    for (int e = 0; e < 16; e++)
        if (!hu.i[e])
            hu.i[e] = mask_mod(r->b, r->h, r->p, kt + e) ? 0 : -1;
    h = hu.v;
#endif
    if (has_mask) {
        float t[16];
        for (int e = 0; e < 16; e++)
            t[e] = kt + e < rend ? LD_MASK(mask, mrow + (ulong)(kt + e)) : 0.0f;
        const float16 mv = vload16(0, t);
        h |= mv == (float16)(NEG_INF);
        s += mv;
    }
#if VARIANTS & V_ALIBI
    s -= (float16)(r->slope) * alibi_dist16((int16)(r->p), key);
#endif
    *hid = h;
    return s;
}

/* bwd_main: one work-item per (kv head z = b·heads_kv + hk, key range g of G): x = z·G + g. Qf, Gf, Dr: bwd_pre's rows; Qacc: the f32 dQ partials [G][batch·heads_q·seq_q][DPK],
 * zeroed here for the work-item's rows first. */
#if !KSEL || K_bwd_main
__kernel __attribute__((reqd_work_group_size(1, 1, 1))) void
bwd_main(__global const T_IN *K, ulong k_off, ulong k_sb, ulong k_sh, ulong k_ss,
         __global const T_IN *V, ulong v_off, ulong v_sb, ulong v_sh, ulong v_ss,
         __global void *DK, ulong dk_off, ulong dk_sb, ulong dk_sh, ulong dk_ss,
         __global void *DV_, ulong dv_off, ulong dv_sb, ulong dv_sh, ulong dv_ss,
         __global const float *LSE, ulong l_off, ulong l_sb, ulong l_sh, ulong l_ss,
         __global const T_MASK *mask, ulong m_off, ulong m_sb, ulong m_sh, ulong m_ss,
         __global const int *kvlen, __global float *W, ulong qf_off, ulong gf_off, ulong dr_off,
         ulong qa_off, int seq_q, int seq_kv, int heads_kv,
         int group, int D, int DV, int causal, int has_mask, int G, ulong rows_total, float scale
         VARIANT_ARGS DROP_ARGS)
{
    const vparams vp = VP_MAKE;
#if DROPOUT
    const dparams dp = DP_MAKE;
#endif
    const int g = (int)(get_global_id(0) % (ulong)G), z = (int)(get_global_id(0) / (ulong)G);
    __global const float *Qf = W + qf_off, *Gf = W + gf_off, *Dr = W + dr_off;
    __global float *Qacc = W + qa_off;
    const int b = z / heads_kv, hk = z % heads_kv, hq0 = hk * group;
    const int L = keys_of_batch(kvlen, b, seq_kv);
    const int nkb = (seq_kv + 15) / 16, kb0 = (int)((long)nkb * g / G), kb1 = (int)((long)nkb * (g + 1) / G);
    const ulong rows_all = (ulong)(b * heads_kv + hk) * (ulong)group * (ulong)seq_q; /* first row of the group */
    const int nrows = group * seq_q;
    __global float *qacc = Qacc + ((ulong)g * rows_total + rows_all) * DPK;
    for (ulong e = 0; e < (ulong)nrows * DPK; e++)
        qacc[e] = 0.0f;

    __global const T_IN *Kb = K + k_off + (ulong)b * k_sb + (ulong)hk * k_sh;
    __global const T_IN *Vb = V + v_off + (ulong)b * v_sb + (ulong)hk * v_sh;
    for (int kb = kb0; kb < kb1; kb++) {
        const int kt = 16 * kb;
        /* The block's K as rows (kr, for dQ) and transposed (kt_, one float16 of 16 keys per
         * dim, for the scores and dK), V transposed; keys at or past L (hidden from every row)
         * as 0. */
        union {
            float16 v[DPK];
            float f[DPK * 16];
        } ktr, dkt;
        union {
            float16 v[DPV];
            float f[DPV * 16];
        } vtr, dvt;
        float16 kr[16][DK16];
        for (int d = 0; d < DPK; d++)
            dkt.v[d] = (float16)(0.0f);
        for (int c = 0; c < DPV; c++)
            dvt.v[c] = (float16)(0.0f);
        for (int n = 0; n < 16; n++) {
            const int key = kt + n;
            __global const T_IN *kp = Kb + (ulong)key * k_ss;
            __global const T_IN *vq = Vb + (ulong)key * v_ss;
            for (int d = 0; d < DPK; d++) {
                const float x = key < L && d < D ? LD_IN(kp, d) : 0.0f;
                ktr.f[d * 16 + n] = x;
                ((float *)kr[n])[d] = x;
            }
            for (int c = 0; c < DPV; c++)
                vtr.f[c * 16 + n] = key < L && c < DV ? LD_IN(vq, c) : 0.0f;
        }
        if (kt < L) {
#pragma unroll 1
            for (int rr = 0; rr < nrows; rr++) {
                const int hq = hq0 + rr / seq_q, i = rr % seq_q;
                vrow vr;
                const int rend = row_span(causal, i, seq_q, L, b, hq, &vp, &vr);
                if (rend <= kt || vr.beg >= kt + 16)
                    continue;
                const float lse = LSE[l_off + (ulong)b * l_sb + (ulong)hq * l_sh + (ulong)i * l_ss];
                if (lse == NEG_INF)
                    continue; /* no visible key (or only -inf logits): no gradient */
                const ulong row = rows_all + (ulong)rr;
                __global const float *q = Qf + row * DPK, *go = Gf + row * DPV;
                /* four chains of multiply-adds, not one waiting on each */
                float16 s0 = (float16)(0.0f), s1 = s0, s2 = s0, s3 = s0;
                for (int d = 0; d < DPK; d += 4) {
                    s0 = MAD((float16)(q[d]), ktr.v[d], s0);
                    s1 = MAD((float16)(q[d + 1]), ktr.v[d + 1], s1);
                    s2 = MAD((float16)(q[d + 2]), ktr.v[d + 2], s2);
                    s3 = MAD((float16)(q[d + 3]), ktr.v[d + 3], s3);
                }
                const float16 s = (s0 + s1) + (s2 + s3);
                float16 sc;
                int16 hid;
                const ulong mrow = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)i * m_ss;
                const float16 x = bwd_logits16(s * scale, kt, rend, &vr, &vp, has_mask, mask, mrow, &sc, &hid);
                const float16 p = select(exp2p16((x - (float16)(lse)) * LOG2E), (float16)(0.0f), hid);
                float16 p0 = (float16)(0.0f), p1 = p0, p2 = p0, p3 = p0;
                for (int c = 0; c < DPV; c += 4) {
                    p0 = MAD((float16)(go[c]), vtr.v[c], p0);
                    p1 = MAD((float16)(go[c + 1]), vtr.v[c + 1], p1);
                    p2 = MAD((float16)(go[c + 2]), vtr.v[c + 2], p2);
                    p3 = MAD((float16)(go[c + 3]), vtr.v[c + 3], p3);
                }
                const float16 dpv = (p0 + p1) + (p2 + p3);
#if DROPOUT
                const float16 zm = drop_any16((uint)kt + dp.coff, (uint)(i + (L - seq_q)) + dp.roff,
                                              (uint)(b * dp.hq + hq), &dp);
                const float16 pz = p * zm;
                float16 ds = p * (dpv * zm - (float16)(Dr[row]));
#else
                const float16 pz = p;
                float16 ds = p * (dpv - (float16)(Dr[row]));
#endif
#if VARIANTS & V_SOFTCAP
                {
                    const float16 t = sc * (float16)(1.0f / vp.cap);
                    ds *= (float16)(1.0f) - t * t;
                }
#endif
                ds = select(ds * scale, (float16)(0.0f), hid);
                union {
                    float16 v;
                    float f[16];
                } dsu = {ds};
                float16 dq[DK16];
#pragma unroll
                for (int c = 0; c < DK16; c++)
                    dq[c] = (float16)(0.0f);
                if (!any(hid)) {
                    for (int c = 0; c < DPV; c++)
                        dvt.v[c] = MAD((float16)(go[c]), pz, dvt.v[c]);
                    for (int d = 0; d < DPK; d++)
                        dkt.v[d] = MAD((float16)(q[d]), ds, dkt.v[d]);
                    for (int n = 0; n < 16; n++) {
                        const float16 a = (float16)(dsu.f[n]);
#pragma unroll
                        for (int c = 0; c < DK16; c++)
                            dq[c] = MAD(a, kr[n][c], dq[c]);
                    }
                } else {
                    /* Hidden keys take nothing from this row: no 0·x, which NaN/Inf in the row's
                     * q or dout, or in the key's K, would turn into NaN. */
                    for (int c = 0; c < DPV; c++)
                        dvt.v[c] += select((float16)(go[c]) * pz, (float16)(0.0f), hid);
                    for (int d = 0; d < DPK; d++)
                        dkt.v[d] += select((float16)(q[d]) * ds, (float16)(0.0f), hid);
                    union {
                        int16 v;
                        int i[16];
                    } hu = {hid};
                    for (int n = 0; n < 16; n++) {
                        if (hu.i[n])
                            continue;
                        const float16 a = (float16)(dsu.f[n]);
#pragma unroll
                        for (int c = 0; c < DK16; c++)
                            dq[c] = MAD(a, kr[n][c], dq[c]);
                    }
                }
                __global float *qa = qacc + (ulong)rr * DPK;
#pragma unroll
                for (int c = 0; c < DK16; c++)
                    vstore16(vload16(c, qa) + dq[c], c, qa);
            }
        }
        /* The block's dK and dV rows (zero for keys no row sees). */
        for (int n = 0; n < 16 && kt + n < seq_kv; n++) {
            const ulong kr_ = dk_off + (ulong)b * dk_sb + (ulong)hk * dk_sh + (ulong)(kt + n) * dk_ss;
            const ulong vr_ = dv_off + (ulong)b * dv_sb + (ulong)hk * dv_sh + (ulong)(kt + n) * dv_ss;
            for (int d = 0; d < D; d++)
                st_dk(DK, kr_ + (ulong)d, dkt.f[d * 16 + n]);
            for (int c = 0; c < DV; c++)
                st_dv(DV_, vr_ + (ulong)c, dvt.f[c * 16 + n]);
        }
    }
}
#endif

/* bwd_dq: one work-item per element: grid x = column c (< D), row (b·heads_q + hq)·seq_q + i =
 * y + ny·z; dq = the sum of the partials Qacc[g][row] in the order of g. */
#if !KSEL || K_bwd_dq
__kernel void bwd_dq(__global const float *W, ulong qa_off, __global void *DQ, ulong q_off, ulong q_sb, ulong q_sh,
                     ulong q_ss, int heads_q, int seq_q, int D, ulong rows, int G, int ny)
{
    const int c = (int)get_global_id(0);
    const ulong row = get_global_id(1) + (ulong)ny * get_global_id(2);
    if (c >= D || row >= rows)
        return;
    const int i = (int)(row % (ulong)seq_q), bh = (int)(row / (ulong)seq_q), hq = bh % heads_q, b = bh / heads_q;
    __global const float *Qacc = W + qa_off;
    float acc = 0.0f;
    for (int g = 0; g < G; g++)
        acc += Qacc[((ulong)g * (ulong)rows + row) * DPK + (ulong)c];
    st_dq(DQ, q_off + (ulong)b * q_sb + (ulong)hq * q_sh + (ulong)i * q_ss + (ulong)c, acc);
}
#endif

/* bwd_dsinks: one work-item per query head: the sum of its rows' shares (bwd_pre) over the
 * batch and the rows, in that order. */
#if !KSEL || K_bwd_dsinks
__kernel void bwd_dsinks(__global const float *W, ulong sr_off, __global float *DS, ulong ds_off, ulong ds_sh, int batch,
                         int heads_q, int seq_q)
{
    const int hq = (int)get_global_id(0);
    if (hq >= heads_q)
        return;
    __global const float *Sr = W + sr_off;
    float acc = 0.0f;
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < seq_q; i++)
            acc += Sr[((ulong)b * (ulong)heads_q + (ulong)hq) * (ulong)seq_q + (ulong)i];
    DS[ds_off + (ulong)hq * ds_sh] = acc;
}
#endif

/* dropout_mask (clattn_dropout_mask): the multipliers of 16 keys of one row per work-item:
 * grid x = the keys' vector, row y + ny·z; M of the type DT_DQ. */
#if DROPOUT && (!KSEL || K_dropout_mask)
__kernel void dropout_mask(__global void *M, ulong m_off_, ulong m_sb_, ulong m_sh_, ulong m_ss_,
                           __global const int *kvlen, int heads_q, int seq_q, int seq_kv, ulong rows, int ny
                           DROP_ARGS)
{
    const dparams dp = DP_MAKE;
    const int kt = 16 * (int)get_global_id(0);
    const ulong row = get_global_id(1) + (ulong)ny * get_global_id(2);
    if (kt >= seq_kv || row >= rows)
        return;
    const int i = (int)(row % (ulong)seq_q), bh = (int)(row / (ulong)seq_q), hq = bh % heads_q, b = bh / heads_q;
    const int L = keys_of_batch(kvlen, b, seq_kv);
    union {
        float16 v;
        float f[16];
    } z = {drop_any16((uint)kt + dp.coff, (uint)(i + (L - seq_q)) + dp.roff, (uint)(b * heads_q + hq), &dp)};
    const ulong at = m_off_ + (ulong)b * m_sb_ + (ulong)hq * m_sh_ + (ulong)i * m_ss_ + (ulong)kt;
    for (int e = 0; e < 16 && kt + e < seq_kv; e++)
        st_dq(M, at + (ulong)e, z.f[e]);
}
#endif
