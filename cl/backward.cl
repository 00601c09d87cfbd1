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

/* One row of bwd_main's block: its q and dout rows (bwd_pre's f32 copies), its dQ partial, LSE,
 * D, variant context, end of keys and mask row, and its dropout coordinates. */
typedef struct bwd_row {
    __global const float *q, *go;
    __global float *qa;
    float lse, dr;
    vrow vr;
    int rend;
    ulong mrow;
    uint r, bh;
} bwd_row;

#if DROPOUT
#define DROP_P (&dp)
#define DROP_PARAM , const dparams *dp
#else
#define DROP_P 0
#define DROP_PARAM , int no_dropout_
#endif

/* The block of keys kt .. kt+15 (K transposed in ktr and as rows in kr, V transposed in vtr)
 * against NR (1 or 2, a constant after inlining) rows ar: their P, dP and dS, then dV += P∘z ·
 * dout and dK += dS·q into the block's dvt and dkt, and dQ += dS·K into the rows' partials. Two
 * rows share every load of the block's vectors and of its accumulators. */
__attribute__((always_inline)) inline void bwd_rows(const int NR, const bwd_row *restrict ar, int kt, const float16 *restrict ktr,
                     const float16 *restrict vtr, float16 *restrict dkt, float16 *restrict dvt,
                     float16 (*restrict kr)[DK16], float scale, const vparams *vp, int has_mask,
                     __global const T_MASK *mask DROP_PARAM)
{
    /* The rows' pointers in locals: read through ar inside the loops, they would be read again
     * at every store to the block's private accumulators (which might alias ar). */
    __global const float *const q0p = ar[0].q, *const q1p = ar[NR - 1].q;
    __global const float *const g0p = ar[0].go, *const g1p = ar[NR - 1].go;
#define QP(t) ((t) ? q1p : q0p)
#define GP(t) ((t) ? g1p : g0p)
    float16 s0[2], s1[2], g0[2], g1[2];
#pragma unroll
    for (int t = 0; t < NR; t++)
        s0[t] = s1[t] = g0[t] = g1[t] = (float16)(0.0f);
    /* two chains a row, so that two rows keep four multiply-adds in flight */
    for (int d = 0; d < DPK; d += 2) {
        const float16 k0 = ktr[d], k1 = ktr[d + 1];
#pragma unroll
        for (int t = 0; t < NR; t++) {
            s0[t] = MAD((float16)(QP(t)[d]), k0, s0[t]);
            s1[t] = MAD((float16)(QP(t)[d + 1]), k1, s1[t]);
        }
    }
    for (int c = 0; c < DPV; c += 2) {
        const float16 v0 = vtr[c], v1 = vtr[c + 1];
#pragma unroll
        for (int t = 0; t < NR; t++) {
            g0[t] = MAD((float16)(GP(t)[c]), v0, g0[t]);
            g1[t] = MAD((float16)(GP(t)[c + 1]), v1, g1[t]);
        }
    }
    float16 pz[2], ds[2];
    int16 hid[2];
    int some = 0;
#pragma unroll
    for (int t = 0; t < NR; t++) {
        /* The forward's logits (var_keys16: -inf where hidden, as a visible key of logit -inf,
         * which takes no weight either) and the softcapped scores for the softcap's derivative. */
        float16 sc;
        const float16 x = var_keys16((s0[t] + s1[t]) * scale, kt, ar[t].rend, &ar[t].vr, vp, has_mask, mask,
                                     ar[t].mrow, &sc);
        hid[t] = x == (float16)(NEG_INF);
        const float16 p = select(exp2p16((x - (float16)(ar[t].lse)) * LOG2E), (float16)(0.0f), hid[t]);
        const float16 dpv = g0[t] + g1[t];
#if DROPOUT
        const float16 zm = drop_any16((uint)kt + dp->coff, ar[t].r, ar[t].bh, dp);
        pz[t] = p * zm;
        float16 d_s = p * (dpv * zm - (float16)(ar[t].dr));
#else
        pz[t] = p;
        float16 d_s = p * (dpv - (float16)(ar[t].dr));
#endif
#if VARIANTS & V_SOFTCAP
        const float16 u = sc * (float16)(1.0f / vp->cap);
        d_s *= (float16)(1.0f) - u * u;
#endif
        ds[t] = select(d_s * scale, (float16)(0.0f), hid[t]);
        some |= any(hid[t]);
    }
    union {
        float16 v;
        float f[16];
    } dsu[2];
#pragma unroll
    for (int t = 0; t < NR; t++)
        dsu[t].v = ds[t];
    float16 dq[2][DK16];
#pragma unroll
    for (int t = 0; t < NR; t++)
#pragma unroll
        for (int c = 0; c < DK16; c++)
            dq[t][c] = (float16)(0.0f);
    if (!some) {
        for (int c = 0; c < DPV; c++) {
            float16 acc = dvt[c];
#pragma unroll
            for (int t = 0; t < NR; t++)
                acc = MAD((float16)(GP(t)[c]), pz[t], acc);
            dvt[c] = acc;
        }
        for (int d = 0; d < DPK; d++) {
            float16 acc = dkt[d];
#pragma unroll
            for (int t = 0; t < NR; t++)
                acc = MAD((float16)(QP(t)[d]), ds[t], acc);
            dkt[d] = acc;
        }
        for (int n = 0; n < 16; n++) {
#pragma unroll
            for (int c = 0; c < DK16; c++) {
                const float16 kv = kr[n][c];
#pragma unroll
                for (int t = 0; t < NR; t++)
                    dq[t][c] = MAD((float16)(dsu[t].f[n]), kv, dq[t][c]);
            }
        }
    } else {
        /* Hidden keys take nothing from a row: no 0·x, which NaN/Inf in the row's q or dout, or
         * in the key's K, would turn into NaN. */
#pragma unroll
        for (int t = 0; t < NR; t++) {
            for (int c = 0; c < DPV; c++)
                dvt[c] += select((float16)(GP(t)[c]) * pz[t], (float16)(0.0f), hid[t]);
            for (int d = 0; d < DPK; d++)
                dkt[d] += select((float16)(QP(t)[d]) * ds[t], (float16)(0.0f), hid[t]);
            union {
                int16 v;
                int i[16];
            } hu = {hid[t]};
            for (int n = 0; n < 16; n++) {
                if (hu.i[n])
                    continue;
                const float16 a = (float16)(dsu[t].f[n]);
#pragma unroll
                for (int c = 0; c < DK16; c++)
                    dq[t][c] = MAD(a, kr[n][c], dq[t][c]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NR; t++)
#pragma unroll
        for (int c = 0; c < DK16; c++)
            vstore16(vload16(c, ar[t].qa) + dq[t][c], c, ar[t].qa);
#undef QP
#undef GP
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
            /* The rows that see some key of the block, two at a time (bwd_rows). */
            bwd_row ar[2];
            int na = 0;
#pragma unroll 1
            for (int rr = 0; rr <= nrows; rr++) {
                if (rr < nrows) {
                    const int hq = hq0 + rr / seq_q, i = rr % seq_q;
                    bwd_row *a = &ar[na];
                    a->rend = row_span(causal, i, seq_q, L, b, hq, &vp, &a->vr);
                    if (a->rend <= kt || a->vr.beg >= kt + 16)
                        continue;
                    a->lse = LSE[l_off + (ulong)b * l_sb + (ulong)hq * l_sh + (ulong)i * l_ss];
                    if (a->lse == NEG_INF)
                        continue; /* no visible key (or only -inf logits): no gradient */
                    const ulong row = rows_all + (ulong)rr;
                    a->q = Qf + row * DPK;
                    a->go = Gf + row * DPV;
                    a->qa = qacc + (ulong)rr * DPK;
                    a->dr = Dr[row];
                    a->mrow = m_off + (ulong)b * m_sb + (ulong)hq * m_sh + (ulong)i * m_ss;
#if DROPOUT
                    a->r = (uint)(i + (L - seq_q)) + dp.roff;
                    a->bh = (uint)(b * dp.hq + hq);
#endif
                    if (++na < 2)
                        continue;
                }
                if (na == 2)
                    bwd_rows(2, ar, kt, ktr.v, vtr.v, dkt.v, dvt.v, kr, scale, &vp, has_mask, mask, DROP_P);
                else if (na == 1)
                    bwd_rows(1, ar, kt, ktr.v, vtr.v, dkt.v, dvt.v, kr, scale, &vp, has_mask, mask, DROP_P);
                na = 0;
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
