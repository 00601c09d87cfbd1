/*
 * Float64 CPU reference for clattn's operations, written from the semantics in DESIGN.md and not
 * from any kernel, so a bug shared by the kernels and the reference is unlikely. Plain C11 with
 * no OpenCL, so anything (tests, tools) can link it without a device: the static library
 * clattn_ref (ref/CMakeLists.txt), built but not installed.
 *
 * Every tensor here is a contiguous double array [B][H][S][D]. Strided views, broadcasting inputs
 * and storage types are the tests' business: they convert to this one layout first.
 *
 * Masking rules shared by every function (L = visible keys of the batch):
 *   - key j is hidden when j >= L, when causal and j > i + (L - seq_q) (bottom-right alignment), or
 *     when the mask value at (b, h, i, j) is -inf;
 *   - a hidden key never touches an output, whatever K or V hold there (it is skipped, never
 *     multiplied by 0, so NaN/Inf there cannot leak);
 *   - a visible key whose score is -inf contributes nothing either (exp(-inf) = 0; skipping it keeps
 *     a NaN in its V row out of the result);
 *   - a row with no visible finite score gives out = 0, lse = -inf, probabilities 0;
 *   - NaN in a visible score is not special-cased: it propagates through max/exp/sum and makes its
 *     row NaN, as the contract asks.
 */
#ifndef CLATTN_REF_H
#define CLATTN_REF_H

#include <stddef.h>

typedef struct ref_attn {
    int batch, heads_q, heads_kv, seq_q, seq_kv, head_dim;
    int head_dim_v;      /* 0 means head_dim, as in clattn_attention_desc */
    double scale;        /* 0 means 1/sqrt(head_dim), resolved inside */
    int causal;          /* bottom-right: row i sees key j iff j <= i + (L - seq_q) */
    const double *mask;  /* additive, contiguous, shape mask_shape; NULL: none */
    int mask_shape[4];   /* {B|1, Hq|1, Sq|1, Skv}; a dimension of extent 1 broadcasts */
    const int *kv_len;   /* [batch] visible keys, clamped to [0, seq_kv]; NULL: seq_kv */
} ref_attn;

/* scale·q·kᵀ + mask into s [B][Hq][Sq][Skv]; hidden keys (length, causal, -inf mask) are -inf. */
void ref_scores(const ref_attn *a, const double *q, const double *k, double *s);

/*
 * out [B][Hq][Sq][Dv] = softmax(scores)·V over visible keys. lse [B][Hq][Sq] (natural log of the
 * sum of exp(score) over visible keys) and probs [B][Hq][Sq][Skv] (0 at hidden keys) may be NULL.
 */
void ref_attention(const ref_attn *a, const double *q, const double *k, const double *v,
                   double *out, double *lse, double *probs);

typedef struct ref_softmax {
    int batch, heads, rows, cols;
    double scale;        /* inputs are multiplied by scale first; 0 means 1 */
    int causal;          /* row i sees column j iff j <= i + (L - rows) */
    const double *mask;  /* additive, shape mask_shape = {B|1, H|1, rows|1, cols}; NULL: none */
    int mask_shape[4];
    const int *kv_len;   /* [batch] visible columns, clamped to [0, cols]; NULL: cols */
} ref_softmax;

/* Row-wise stable softmax of scale·in + mask, in and out [B][H][rows][cols]; hidden and -inf
 * entries give 0, a row with no visible finite entry gives all zeros. in == out is allowed. */
void ref_softmax_rows(const ref_softmax *s, const double *in, double *out);

/*
 * Combines attention over disjoint key ranges: lse = log Σ exp(lse_i), out = Σ exp(lse_i - lse)·out_i.
 * part_out[i] is [rows][dv], part_lse[i] is [rows]; parts with lse -inf are skipped; a row where
 * every part is -inf gives out 0 and lse -inf. lse may be NULL.
 */
void ref_merge(int parts, int rows, int dv, const double *const *part_out,
               const double *const *part_lse, double *out, double *lse);

#endif /* CLATTN_REF_H */
