/*
 * Float64 reference; see clattn_ref.h for the rules. Everything is computed straight from the
 * definition, row by row, recomputing dot products instead of keeping a score row, so no
 * allocation is needed and nothing can fail.
 */
#include "clattn_ref.h"

#include <math.h>

/* Keys of batch b that exist at all: kv_len clamped to [0, n] (the contract clamps, never rejects). */
static int visible_len(const int *kv_len, int b, int n)
{
    if (kv_len == NULL)
        return n;
    int l = kv_len[b];
    return l < 0 ? 0 : (l > n ? n : l);
}

/* The causal rule, written once: bottom-right aligned, so the last query row sees all L keys. */
static int causal_hides(int causal, int i, int j, int rows, int len)
{
    return causal && (long)j > (long)i + ((long)len - (long)rows);
}

/* Mask value at (b, h, i, j); a dimension of extent 1 broadcasts (index 0 whatever the coordinate). */
static double mask_at(const double *mask, const int shape[4], int b, int h, int i, int j)
{
    if (mask == NULL)
        return 0.0;
    size_t bb = shape[0] == 1 ? 0 : (size_t)b;
    size_t hh = shape[1] == 1 ? 0 : (size_t)h;
    size_t ii = shape[2] == 1 ? 0 : (size_t)i;
    size_t jj = shape[3] == 1 ? 0 : (size_t)j;
    return mask[((bb * (size_t)shape[1] + hh) * (size_t)shape[2] + ii) * (size_t)shape[3] + jj];
}

/*
 * A max that propagates NaN (like numpy's max), so a NaN score reaches exp/sum and makes its row
 * NaN instead of being silently ignored by a `>` comparison.
 */
static double nan_max(double m, double x)
{
    if (isnan(m) || isnan(x))
        return NAN;
    return x > m ? x : m;
}

static double resolved_scale(const ref_attn *a)
{
    return a->scale != 0.0 ? a->scale : 1.0 / sqrt((double)a->head_dim);
}

/* Mathematical floor of n / d for d > 0 (C's division truncates towards 0). */
static long long floor_div(long long n, long long d)
{
    long long r = n / d;
    return (n % d != 0 && n < 0) ? r - 1 : r;
}

/* The variants' visibility rules (window, chunk, mask_mod) for key j of a row at diagonal
 * position pos; causal, key lengths and the mask are checked by the caller. */
static int variant_hides(const ref_attn *a, int b, int h, long long pos, int j)
{
    if (a->window != 0) {
        if (a->window_left >= 0 && (long long)j < pos - a->window_left)
            return 1;
        if (a->window_right >= 0 && (long long)j > pos + a->window_right)
            return 1;
    }
    if (a->chunk > 0 && floor_div(a->k_offset + j, a->chunk) != floor_div(a->k_offset + pos, a->chunk))
        return 1;
    if (a->mask_mod != NULL && a->mask_mod(b, h, pos, j, a->mod_user) == 0)
        return 1;
    return 0;
}

/* Logit of key j for row (b, h, i), or -inf with *visible = 0 for a hidden key. K at a hidden key
 * is never read, so NaN stored there cannot reach the logit. dx_ds (may be NULL): ∂x/∂(scale·q·k),
 * for the backward. */
static double score(const ref_attn *a, double scale, int len, const double *q, const double *k,
                    int b, int h, int i, int j, int *visible, double *dx_ds)
{
    *visible = 0;
    if (dx_ds != NULL)
        *dx_ds = 1.0;
    const long long pos = (long long)i + (long long)len - (long long)a->seq_q + a->q_offset - a->k_offset;
    if (j >= len || (a->causal && (long long)j > pos) || variant_hides(a, b, h, pos, j))
        return -INFINITY;
    double m = mask_at(a->mask, a->mask_shape, b, h, i, j);
    if (m == -INFINITY)
        return -INFINITY;
    *visible = 1;
    const int group = a->heads_q / a->heads_kv; /* GQA: query head h reads kv head h / group */
    const size_t D = (size_t)a->head_dim;
    const double *qr = q + (((size_t)b * (size_t)a->heads_q + (size_t)h) * (size_t)a->seq_q + (size_t)i) * D;
    const double *kr =
        k + (((size_t)b * (size_t)a->heads_kv + (size_t)(h / group)) * (size_t)a->seq_kv + (size_t)j) * D;
    double dot = 0.0;
    for (size_t d = 0; d < D; ++d)
        dot += qr[d] * kr[d];
    double x = scale * dot;
    if (a->softcap > 0.0) {
        const double t = tanh(x / a->softcap);
        x = a->softcap * t;
        if (dx_ds != NULL)
            *dx_ds = 1.0 - t * t; /* d/ds c·tanh(s / c) */
    }
    x += m;
    if (a->alibi != NULL) {
        const double slope = a->alibi[(a->alibi_per_batch ? (size_t)b * (size_t)a->heads_q : 0) + (size_t)h];
        const long long dist = pos > (long long)j ? pos - (long long)j : (long long)j - pos;
        x += -slope * (double)dist;
    }
    if (a->score_mod != NULL) /* last (DESIGN.md): on the logit with the mask and ALiBi */
        x = a->score_mod(x, b, h, pos, j, a->mod_user);
    return x;
}

void ref_scores(const ref_attn *a, const double *q, const double *k, double *s)
{
    const double scale = resolved_scale(a);
    for (int b = 0; b < a->batch; ++b) {
        const int len = visible_len(a->kv_len, b, a->seq_kv);
        for (int h = 0; h < a->heads_q; ++h)
            for (int i = 0; i < a->seq_q; ++i) {
                double *row = s + (((size_t)b * (size_t)a->heads_q + (size_t)h) * (size_t)a->seq_q + (size_t)i) *
                                      (size_t)a->seq_kv;
                for (int j = 0; j < a->seq_kv; ++j) {
                    int vis;
                    row[j] = score(a, scale, len, q, k, b, h, i, j, &vis, NULL);
                }
            }
    }
}

double ref_logit(const ref_attn *a, const double *q, const double *k, int b, int h, int i, int j,
                 int *visible, double *dx_ds)
{
    return score(a, resolved_scale(a), visible_len(a->kv_len, b, a->seq_kv), q, k, b, h, i, j, visible,
                 dx_ds);
}

void ref_attention(const ref_attn *a, const double *q, const double *k, const double *v,
                   double *out, double *lse, double *probs)
{
    const double scale = resolved_scale(a);
    const int group = a->heads_q / a->heads_kv;
    const size_t Dv = (size_t)(a->head_dim_v != 0 ? a->head_dim_v : a->head_dim);
    const size_t Skv = (size_t)a->seq_kv;
    const int dropout = a->dropout_p > 0.0;

    for (int b = 0; b < a->batch; ++b) {
        const int len = visible_len(a->kv_len, b, a->seq_kv);
        for (int h = 0; h < a->heads_q; ++h) {
            const double *vh = v + ((size_t)b * (size_t)a->heads_kv + (size_t)(h / group)) * Skv * Dv;
            const double sink = a->sinks != NULL ? a->sinks[h] : -INFINITY;
            for (int i = 0; i < a->seq_q; ++i) {
                const size_t row = ((size_t)b * (size_t)a->heads_q + (size_t)h) * (size_t)a->seq_q + (size_t)i;
                double *o = out + row * Dv;
                double *p = probs != NULL ? probs + row * Skv : NULL;
                /* The row's global index, dropout's r: diagonal position + k_offset. */
                const long long r = (long long)i + (long long)len - (long long)a->seq_q + a->q_offset;
                int vis;

                /* Pass 1: row max over visible keys; -inf scores cannot raise it. The sink takes
                 * part in the max only as the shift M (it is a term of the denominator). */
                double m = -INFINITY;
                for (int j = 0; j < a->seq_kv; ++j) {
                    double x = score(a, scale, len, q, k, b, h, i, j, &vis, NULL);
                    if (vis)
                        m = nan_max(m, x);
                }

                for (size_t d = 0; d < Dv; ++d)
                    o[d] = 0.0;
                /* int index: a size_t bound from the int seq_kv makes GCC 13+ warn (-Wstringop-overflow)
                 * about a memset it cannot bound. */
                if (p != NULL)
                    for (int j = 0; j < a->seq_kv; ++j)
                        p[j] = 0.0;
                if (m == -INFINITY) {
                    /* No visible finite score: the contract fixes this row to 0 and -inf, or the
                     * sink's logit when there is one (log of e^s alone). */
                    if (lse != NULL)
                        lse[row] = sink;
                    continue;
                }
                const double M = sink != -INFINITY ? nan_max(m, sink) : m;

                /* Pass 2: unnormalised sum and P·V, subtracting the max so exp cannot overflow. */
                double sum = 0.0;
                for (int j = 0; j < a->seq_kv; ++j) {
                    double x = score(a, scale, len, q, k, b, h, i, j, &vis, NULL);
                    if (!vis || x == -INFINITY)
                        continue; /* skipped, not multiplied by 0: V here may hold NaN/Inf */
                    double e = exp(x - M);
                    sum += e;
                    /* Dropout scales the numerator only: the sum (lse, probs) stays undropped. */
                    const double ez = dropout ? e * ref_dropout_z(a->dropout_seed, a->dropout_offset, a->dropout_p,
                                                                  b, a->heads_q, h, r, a->k_offset + j)
                                              : e;
                    const double *vr = vh + (size_t)j * Dv;
                    for (size_t d = 0; d < Dv; ++d)
                        o[d] += ez * vr[d];
                }
                if (sink != -INFINITY)
                    sum += exp(sink - M); /* once per row, in the denominator only */
                for (size_t d = 0; d < Dv; ++d)
                    o[d] /= sum;
                if (lse != NULL)
                    lse[row] = M + log(sum);

                /* Pass 3: probabilities, normalised by the same sum. A visible -inf score is
                 * computed, not skipped, so a NaN row stays NaN here as it does in the softmax. */
                if (p != NULL)
                    for (int j = 0; j < a->seq_kv; ++j) {
                        double x = score(a, scale, len, q, k, b, h, i, j, &vis, NULL);
                        if (vis)
                            p[j] = exp(x - M) / sum;
                    }
            }
        }
    }
}

void ref_alibi_slopes(int heads, double max_bias, double *slopes)
{
    int n = 1; /* 2^floor(log2 heads), by integers: no rounding of log2 at powers of two */
    while (n <= heads / 2)
        n *= 2;
    for (int h = 0; h < heads; ++h) {
        /* m0^(h+1) = 2^(-max_bias·(h+1)/n), m1^(2(h-n)+1) = 2^(-max_bias·(2(h-n)+1)/(2n)) */
        const double e = h < n ? -max_bias * (double)(h + 1) / (double)n
                               : -max_bias * (double)(2 * (h - n) + 1) / (2.0 * (double)n);
        slopes[h] = pow(2.0, e);
    }
}

void ref_softmax_rows(const ref_softmax *s, const double *in, double *out)
{
    const double scale = s->scale != 0.0 ? s->scale : 1.0;
    const size_t C = (size_t)s->cols;

    for (int b = 0; b < s->batch; ++b) {
        const int len = visible_len(s->kv_len, b, s->cols);
        for (int h = 0; h < s->heads; ++h)
            for (int i = 0; i < s->rows; ++i) {
                const size_t row = ((size_t)b * (size_t)s->heads + (size_t)h) * (size_t)s->rows + (size_t)i;
                const double *x = in + row * C;
                double *y = out + row * C;

                /* Pass 1 reads only; passes 2 and 3 read x[j] before writing y[j], so in == out works. */
                double m = -INFINITY;
                for (int j = 0; j < s->cols; ++j) {
                    double mk = mask_at(s->mask, s->mask_shape, b, h, i, j);
                    if (j < len && !causal_hides(s->causal, i, j, s->rows, len) && mk != -INFINITY)
                        m = nan_max(m, scale * x[j] + mk);
                }
                double sum = 0.0;
                if (m != -INFINITY)
                    for (int j = 0; j < s->cols; ++j) {
                        double mk = mask_at(s->mask, s->mask_shape, b, h, i, j);
                        if (j < len && !causal_hides(s->causal, i, j, s->rows, len) && mk != -INFINITY)
                            sum += exp(scale * x[j] + mk - m);
                    }
                for (int j = 0; j < s->cols; ++j) {
                    double mk = mask_at(s->mask, s->mask_shape, b, h, i, j);
                    int vis = j < len && !causal_hides(s->causal, i, j, s->rows, len) && mk != -INFINITY;
                    /* m == -inf: every visible entry is -inf, so the row is all zeros, not 0/0. */
                    y[j] = (vis && m != -INFINITY) ? exp(scale * x[j] + mk - m) / sum : 0.0;
                }
            }
    }
}

void ref_merge(int parts, int rows, int dv, const double *const *part_out,
               const double *const *part_lse, double *out, double *lse)
{
    for (int r = 0; r < rows; ++r) {
        double *o = out + (size_t)r * (size_t)dv;
        double m = -INFINITY;
        for (int p = 0; p < parts; ++p)
            m = nan_max(m, part_lse[p][r]);
        for (int d = 0; d < dv; ++d)
            o[d] = 0.0;
        if (m == -INFINITY) {
            if (lse != NULL)
                lse[r] = -INFINITY;
            continue;
        }
        /* log Σ exp(lse_i) evaluated as m + log Σ exp(lse_i - m): no overflow for large lse. */
        double sum = 0.0;
        for (int p = 0; p < parts; ++p)
            if (part_lse[p][r] != -INFINITY)
                sum += exp(part_lse[p][r] - m);
        const double total = m + log(sum);
        for (int p = 0; p < parts; ++p) {
            if (part_lse[p][r] == -INFINITY)
                continue; /* contributes nothing, whatever its out holds (0·NaN would leak) */
            /* exp(lse_i - m) / sum, not exp(lse_i - total): where the LSEs are large (3e38),
             * m + log(sum) rounds back to m, and equal parts would each get weight 1. */
            const double w = exp(part_lse[p][r] - m) / sum;
            for (int d = 0; d < dv; ++d)
                o[d] += w * part_out[p][(size_t)r * (size_t)dv + (size_t)d];
        }
        if (lse != NULL)
            lse[r] = total;
    }
}
