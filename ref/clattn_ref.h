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
 *     when the mask value at (b, h, i, j) is -inf; the attention variants (ref_attn, below) hide
 *     more: outside the window or the chunk of the row's diagonal position, or where mask_mod
 *     says 0;
 *   - a hidden key never touches an output, whatever K or V hold there (it is skipped, never
 *     multiplied by 0, so NaN/Inf there cannot leak);
 *   - a visible key whose score is -inf contributes nothing either (exp(-inf) = 0; skipping it keeps
 *     a NaN in its V row out of the result);
 *   - a row with no visible finite score gives out = 0, lse = -inf (the head's sink with sinks),
 *     probabilities 0;
 *   - NaN in a visible score is not special-cased: it propagates through max/exp/sum and makes its
 *     row NaN, as the contract asks.
 */
#ifndef CLATTN_REF_H
#define CLATTN_REF_H

#include <stddef.h>
#include <stdint.h>

/* User modifications, the reference's stand-ins for clattn_attention_desc's OpenCL C snippets
 * score_mod and mask_mod: b batch, h query head, q the row's diagonal position p (below), k the
 * key's index; user is ref_attn.mod_user. */
typedef double (*ref_score_mod)(double score, int b, int h, long long q, int k, void *user);
typedef int (*ref_mask_mod)(int b, int h, long long q, int k, void *user);

/*
 * One attention problem. The fields after kv_len are the attention variants (issue 71,
 * clattn_attention_desc); each is off when zero or NULL, so a zero-initialised tail is plain
 * attention. Row i of batch b sits at diagonal position p = i + L - seq_q (L: the batch's visible
 * keys), which may be negative. Key j is visible to row i iff j < L; causal: j <= p; window != 0:
 * (window_left < 0 or j >= p - window_left) and (window_right < 0 or j <= p + window_right);
 * chunk > 0: floor(j / chunk) == floor(p / chunk) (mathematical floor: a negative p sees no key);
 * mask_mod: mask_mod(b, h, p, j) != 0; and the additive mask at (b, h, i, j) is not -inf.
 * The logit of a visible key, in DESIGN.md's order: x = scale·q·k; softcap c > 0:
 * x = c·tanh(x / c); x += mask(b, h, i, j); x += -slope(b, h)·|p - j|; then score_mod:
 * x = score_mod(x, b, h, p, j).
 * Sinks join the softmax denominator only (see ref_attention).
 */
typedef struct ref_attn {
    int batch, heads_q, heads_kv, seq_q, seq_kv, head_dim;
    int head_dim_v;      /* 0 means head_dim, as in clattn_attention_desc */
    double scale;        /* 0 means 1/sqrt(head_dim), resolved inside */
    int causal;          /* bottom-right: row i sees key j iff j <= i + (L - seq_q) */
    const double *mask;  /* additive, contiguous, shape mask_shape; NULL: none */
    int mask_shape[4];   /* {B|1, Hq|1, Sq|1, Skv}; a dimension of extent 1 broadcasts */
    const int *kv_len;   /* [batch] visible keys, clamped to [0, seq_kv]; NULL: seq_kv */

    int window;                           /* nonzero: window_left/right apply (negative: unbounded) */
    long long window_left, window_right;
    long long chunk;                      /* > 0: chunked local attention */
    double softcap;                       /* > 0: logit = c·tanh(logit / c) */
    const double *sinks;                  /* [heads_q] sink logits (-inf: none for that head); NULL: none */
    const double *alibi;                  /* ALiBi slopes [heads_q], or [batch][heads_q] with
                                           * alibi_per_batch; NULL: none */
    int alibi_per_batch;
    ref_score_mod score_mod;              /* NULL: none */
    ref_mask_mod mask_mod;                /* NULL: none */
    void *mod_user;                       /* passed to score_mod and mask_mod */
    /* A slice of a longer sequence (issue 75): p = i + L - seq_q + q_offset - k_offset, causal
     * hides j > p, and chunks count from the keys' global origin (key j at k_offset + j):
     * floor((k_offset + j) / chunk) == floor((k_offset + p) / chunk). 0, 0: none. */
    long long q_offset, k_offset;
    /* Dropout (clattn_attention_desc.dropout_p), off at 0; else in (0, 1): ref_attention multiplies
     * the probability of each visible key in out's numerator by z = ref_dropout_z(dropout_seed,
     * dropout_offset, dropout_p, b, heads_q, h, r, c) with r = p + k_offset (the row's global
     * index, = i + L - seq_q + q_offset) and c = k_offset + j; lse, probs and the sinks ignore it.
     * A dropped key is multiplied by 0, not skipped: it is visible, so NaN/Inf in its V row
     * reaches out, as in dropout(P)·V. */
    double dropout_p;
    unsigned long long dropout_seed;
    unsigned dropout_offset;
} ref_attn;

/* The logits x of every visible key into s [B][Hq][Sq][Skv], as clattn_scores writes them:
 * hidden keys are -inf, sinks play no part. */
void ref_scores(const ref_attn *a, const double *q, const double *k, double *s);

/* The logit x of key j for query row (b, h, i), as ref_scores writes it: -inf with *visible 0 for
 * a hidden key (K there is never read). dx_ds (may be NULL) gets ∂x/∂s for s = scale·q·k:
 * 1 - tanh²(s / c) with softcap c, else 1 (score_mod's own derivative is not in it). */
double ref_logit(const ref_attn *a, const double *q, const double *k, int b, int h, int i, int j,
                 int *visible, double *dx_ds);

/*
 * out [B][Hq][Sq][Dv] = softmax(logits)·V over visible keys. lse [B][Hq][Sq] (natural log of the
 * sum of exp(logit) over visible keys) and probs [B][Hq][Sq][Skv] (0 at hidden keys) may be NULL.
 * With a sink s (a->sinks[h]): out = Σ e^(x_j - M)·v_j / (Σ e^(x_j - M) + e^(s - M)),
 * lse = log(Σ e^(x_j) + e^s) and probs e^(x_j - lse) (a row then sums to less than 1); a row
 * with no visible key (or only -inf logits) gives out 0 and lse = s; s = -inf is no sink.
 */
void ref_attention(const ref_attn *a, const double *q, const double *k, const double *v,
                   double *out, double *lse, double *probs);

/* ---- Training (clattn_attention_backward, clattn_dropout_mask; ref/clattn_ref_bwd.c) -------- */

/* Philox-4x32-10 (Salmon et al., SC'11; Random123's philox4x32_R with R = 10) of counter ctr and
 * key `key` into out. */
void ref_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/*
 * The dropout multiplier of (batch b, query head h, global row r, global key c) by clattn.h's
 * rule: with r and c as unsigned 32-bit words (mod 2^32), Philox-4x32-10 with key
 * (seed & 0xffffffff, seed >> 32) and counter (16·floor(c / 128) + c mod 16, r, b·heads_q + h,
 * offset); key c takes the 16-bit half floor(c / 16) mod 2 (0: low) of output word
 * floor(c / 32) mod 4 and is kept iff that half >= t = min(round(p·65536), 65535). Returns
 * 1 / (1 - p) when kept, 0 when dropped; p in [0, 1) (p 0: always 1).
 */
double ref_dropout_z(unsigned long long seed, unsigned offset, double p, int b, int heads_q, int h,
                     long long r, long long c);

/*
 * The gradients of loss = Σ dout ∘ out, out = ref_attention(a, q, k, v) (dout [B][Hq][Sq][Dv]),
 * from the definition: with P_ij = e^(x_ij - lse_i) and z_ij the dropout multipliers (1 without
 * dropout), D_i = dout_i·out_i, dv_j = Σ_i P_ij·z_ij·dout_i, dP_ij = z_ij·(dout_i·v_j),
 * dx_ij = P_ij·(dP_ij - D_i), ds_ij = dx_ij·∂x/∂s (softcap: 1 - tanh²(s / c)),
 * dq_i = scale·Σ_j ds_ij·k_j, dk_j = scale·Σ_i ds_ij·q_i; GQA: dk and dv of a kv head sum over
 * its query heads. With a->sinks, dsinks [Hq] (may be NULL) = -Σ_{b,i} e^(s_h - lse_i)·D_i
 * (0 for a -inf sink). dq, dk [B][Hkv][Skv][D] and dv [B][Hkv][Skv][Dv] are written whole (0
 * where nothing contributes). Hidden keys are skipped as in the forward, so NaN/Inf in hidden K,
 * V (or in the Q of a row that sees no key) reaches no gradient; a row with no visible finite
 * logit contributes nothing. a->score_mod must be NULL (its derivative is unknown; asserted);
 * mask_mod, which only hides keys, is supported.
 */
void ref_attention_backward(const ref_attn *a, const double *q, const double *k, const double *v,
                            const double *dout, double *dq, double *dk, double *dv, double *dsinks);

/* The standard ALiBi slopes of `heads` heads for max_bias, in double (clattn_alibi_slopes' formula):
 * n = 2^floor(log2 heads), m0 = 2^(-max_bias / n), m1 = 2^(-max_bias / (2n)); head h < n gets
 * m0^(h + 1), the others m1^(2(h - n) + 1). heads >= 1. */
void ref_alibi_slopes(int heads, double max_bias, double *slopes);

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

/* ---- KV append (clattn_kv_append, docs/kv-append.md; ref/clattn_ref_rope.c) ---------------- */

/* Rotary embedding of one head row. style 0: none; 1: interleaved pairs (2i, 2i + 1); 2: NeoX
 * pairs (i, i + rope_dims / 2). Pair i turns by pos·theta^(-2i / rope_dims) (theta 0: 10000), or
 * by the angle whose cos and sin are row pos of the tables (both [table_rows][rope_dims / 2]; pos
 * clamped into [0, table_rows)): (x, y) -> (x·cos - y·sin, x·sin + y·cos). Dims from rope_dims
 * on are copied. */
typedef struct ref_rope {
    int style;
    int head_dim; /* at most 1024 */
    int rope_dims;
    double theta;
    const double *cos_table, *sin_table; /* NULL: theta */
    long long table_rows;
} ref_rope;
double ref_rope_angle(const ref_rope *r, long long pos, int i);
/* x (head_dim values) of a token at pos rotated into out (may be x). */
void ref_rope_row(const ref_rope *r, long long pos, const double *x, double *out);

/* binary16 bits of x rounded to nearest even (overflow: inf; NaN: quiet NaN; the sign of zero
 * kept), and the value of such bits. */
unsigned short ref_f16_bits(double x);
double ref_f16_value(unsigned short h);
/* OCP fp8 codes of x, rounded to nearest even, |x| at or above the largest finite value (448,
 * 57344) saturated to it, NaN 0x7f with x's sign; and the values of codes. */
unsigned char ref_fp8_e4m3(double x);
unsigned char ref_fp8_e5m2(double x);
double ref_fp8_e4m3_value(unsigned char c);
double ref_fp8_e5m2_value(unsigned char c);
/* ggml's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) of n floats (a
 * multiple of 32) into n / 32 blocks of 34 / 18 bytes, in float arithmetic as ggml's; NaN
 * elements are skipped by the maximum and stored as q 0. And the blocks' values. */
void ref_quantize_q8_0(const float *x, int n, unsigned char *out);
void ref_quantize_q4_0(const float *x, int n, unsigned char *out);
void ref_dequantize_q8_0(const unsigned char *in, int n, double *x);
void ref_dequantize_q4_0(const unsigned char *in, int n, double *x);
/* clattn's i8 row: s = amax / 127 (float), q_j = round(x_j / s) (halves away from 0), 0 where s
 * is 0; returns s. */
float ref_quantize_i8(const float *x, int n, signed char *q);

#endif /* CLATTN_REF_H */
