/*
 * Float64 reference for training (clattn_attention_backward, clattn_dropout_mask): the Philox
 * generator and dropout rule of clattn.h, and the gradients of ref_attention written from the
 * definition (see clattn_ref.h). Like clattn_ref.c it works row by row, recomputing logits instead
 * of keeping P, so nothing is allocated and nothing can fail.
 */
#include "clattn_ref.h"

#include <assert.h>
#include <math.h>

/* ---- Philox-4x32-10 -------------------------------------------------------------------------- */

/* Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3" (SC'11), in Random123's
 * order: round 1 uses the key as given, each later round first adds the Weyl increments to it. */
void ref_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u; /* golden ratio */
            k1 += 0xBB67AE85u; /* sqrt(3) - 1 */
        }
        /* 32 x 32 -> 64-bit products, split into high and low words. */
        const uint64_t p0 = (uint64_t)0xD2511F53u * x0;
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * x2;
        const uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0;
        const uint32_t y1 = (uint32_t)p1;
        const uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1;
        const uint32_t y3 = (uint32_t)p0;
        x0 = y0;
        x1 = y1;
        x2 = y2;
        x3 = y3;
    }
    out[0] = x0;
    out[1] = x1;
    out[2] = x2;
    out[3] = x3;
}

/* ---- dropout ---------------------------------------------------------------------------------- */


double ref_dropout_z(unsigned long long seed, unsigned offset, double p, int b, int heads_q, int h,
                     long long r, long long c)
{
    if (!(p > 0.0))
        return 1.0; /* off: every key kept with weight 1, no generator call */
    /* r and c as unsigned 32-bit words (conversions to uint32_t reduce modulo 2^32): the
     * counter's first word is 16·floor(c / 128) + c mod 16, the output word floor(c / 32) mod 4
     * and the half floor(c / 16) mod 2 (0: low), all of that word. */
    const uint32_t cw = (uint32_t)c;
    const uint32_t ctr[4] = {((cw >> 7) << 4) | (cw & 15u), (uint32_t)r,
                             (uint32_t)b * (uint32_t)heads_q + (uint32_t)h, (uint32_t)offset};
    const uint32_t key[2] = {(uint32_t)(seed & 0xffffffffu), (uint32_t)(seed >> 32)};
    uint32_t w[4];
    ref_philox4x32_10(ctr, key, w);
    const uint32_t word = w[(cw >> 5) & 3u];
    const uint32_t bits = ((cw >> 4) & 1u) ? word >> 16 : word & 0xffffu;
    /* round() halves away from zero, as OpenCL C's round; 65535 at most, so p near 1 still keeps
     * the keys whose half is 0xffff. */
    double t = round(p * 65536.0);
    if (t > 65535.0)
        t = 65535.0;
    return (double)bits >= t ? 1.0 / (1.0 - p) : 0.0;
}

/* ---- backward --------------------------------------------------------------------------------- */

/* A max that propagates NaN, as clattn_ref.c's: a NaN logit makes its row's gradients NaN. */
static double nan_max(double m, double x)
{
    if (isnan(m) || isnan(x))
        return NAN;
    return x > m ? x : m;
}

static double dot(const double *x, const double *y, size_t n)
{
    double s = 0.0;
    for (size_t d = 0; d < n; ++d)
        s += x[d] * y[d];
    return s;
}

static void zero(double *x, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        x[i] = 0.0;
}

void ref_attention_backward(const ref_attn *a, const double *q, const double *k, const double *v,
                            const double *dout, double *dq, double *dk, double *dv, double *dsinks)
{
    assert(a->score_mod == NULL); /* its derivative is unknown: the contract refuses it */
    const double scale = a->scale != 0.0 ? a->scale : 1.0 / sqrt((double)a->head_dim);
    const int group = a->heads_q / a->heads_kv;
    const size_t D = (size_t)a->head_dim;
    const size_t Dv = (size_t)(a->head_dim_v != 0 ? a->head_dim_v : a->head_dim);
    const size_t Sq = (size_t)a->seq_q, Skv = (size_t)a->seq_kv;
    const size_t rows = (size_t)a->batch * (size_t)a->heads_q * Sq;
    const size_t kv_rows = (size_t)a->batch * (size_t)a->heads_kv * Skv;
    const int dropout = a->dropout_p > 0.0;

    zero(dq, rows * D);
    zero(dk, kv_rows * D);
    zero(dv, kv_rows * Dv);
    if (dsinks != NULL && a->sinks != NULL)
        zero(dsinks, (size_t)a->heads_q);

    for (int b = 0; b < a->batch; ++b) {
        int len = a->kv_len != NULL ? a->kv_len[b] : a->seq_kv; /* clamped as the forward's */
        len = len < 0 ? 0 : (len > a->seq_kv ? a->seq_kv : len);
        for (int h = 0; h < a->heads_q; ++h) {
            const size_t kvh = ((size_t)b * (size_t)a->heads_kv + (size_t)(h / group)) * Skv;
            const double sink = a->sinks != NULL ? a->sinks[h] : -INFINITY;
            for (int i = 0; i < a->seq_q; ++i) {
                const size_t row = ((size_t)b * (size_t)a->heads_q + (size_t)h) * Sq + (size_t)i;
                const double *qi = q + row * D;
                const double *gi = dout + row * Dv;
                double *dqi = dq + row * D;
                const long long r = (long long)i + (long long)len - (long long)a->seq_q + a->q_offset;
                int vis;

                /* The forward's softmax: max over visible keys, shifted by the sink too, then the
                 * sum; P_ij = e^(x_ij - M) / sum, as ref_attention's probs. */
                double m = -INFINITY;
                for (int j = 0; j < a->seq_kv; ++j) {
                    const double x = ref_logit(a, q, k, b, h, i, j, &vis, NULL);
                    if (vis)
                        m = nan_max(m, x);
                }
                if (m == -INFINITY)
                    continue; /* out is fixed at 0 (lse at the sink): no gradient from this row */
                const double M = sink != -INFINITY ? nan_max(m, sink) : m;
                double sum = 0.0;
                for (int j = 0; j < a->seq_kv; ++j) {
                    const double x = ref_logit(a, q, k, b, h, i, j, &vis, NULL);
                    if (vis && x != -INFINITY)
                        sum += exp(x - M);
                }
                if (sink != -INFINITY)
                    sum += exp(sink - M);

                /* D_i = dout_i·out_i with out_i = Σ_j P_ij·z_ij·v_j (the dropped output), summed
                 * over keys instead of over out's columns: the same number, without a row buffer. */
                double Di = 0.0;
                for (int j = 0; j < a->seq_kv; ++j) {
                    const double x = ref_logit(a, q, k, b, h, i, j, &vis, NULL);
                    if (!vis || x == -INFINITY)
                        continue; /* skipped, never multiplied by 0: V here may hold NaN/Inf */
                    const double z = dropout ? ref_dropout_z(a->dropout_seed, a->dropout_offset, a->dropout_p, b,
                                                             a->heads_q, h, r, a->k_offset + j)
                                             : 1.0;
                    Di += exp(x - M) / sum * z * dot(gi, v + (kvh + (size_t)j) * Dv, Dv);
                }
                /* ∂loss/∂sink: ∂P_ij/∂s = -P_ij·P_sink, so Σ_j dP_ij·(-P_ij·P_sink) = -P_sink·D_i. */
                if (dsinks != NULL && sink != -INFINITY)
                    dsinks[h] -= exp(sink - M) / sum * Di;

                for (int j = 0; j < a->seq_kv; ++j) {
                    double dx_ds;
                    const double x = ref_logit(a, q, k, b, h, i, j, &vis, &dx_ds);
                    if (!vis || x == -INFINITY)
                        continue;
                    const double P = exp(x - M) / sum;
                    const double z = dropout ? ref_dropout_z(a->dropout_seed, a->dropout_offset, a->dropout_p, b,
                                                             a->heads_q, h, r, a->k_offset + j)
                                             : 1.0;
                    const double *kj = k + (kvh + (size_t)j) * D;
                    const double *vj = v + (kvh + (size_t)j) * Dv;
                    double *dkj = dk + (kvh + (size_t)j) * D;
                    double *dvj = dv + (kvh + (size_t)j) * Dv;
                    const double dP = z * dot(gi, vj, Dv);
                    /* Softmax's Jacobian, then the softcap's (mask and ALiBi add constants). */
                    const double ds = P * (dP - Di) * dx_ds;
                    for (size_t d = 0; d < Dv; ++d)
                        dvj[d] += P * z * gi[d];
                    for (size_t d = 0; d < D; ++d) {
                        dqi[d] += scale * ds * kj[d];
                        dkj[d] += scale * ds * qi[d];
                    }
                }
            }
        }
    }
}
