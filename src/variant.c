/* The attention variants (docs/variants.md): validation of the descriptor's fields, and what the
 * kernels of a call with variants take: the VARIANTS bits and the user's source (program.c puts
 * both into every program that includes attn_common.cl while the call runs), and the arguments
 * VARIANT_ARGS. The rules themselves are written once, in attn_common.cl. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Longest score_mod or mask_mod source accepted. */
#define MOD_MAX 65536

static clattn_status check_mod(clattn_context *ctx, const char *name, const char *src)
{
    if (!src)
        return CLATTN_SUCCESS;
    const size_t n = strnlen(src, MOD_MAX + 1);
    if (n == 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->%s is empty (NULL means none)", name);
    if (n > MOD_MAX)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->%s is longer than %d bytes", name, MOD_MAX);
    return CLATTN_SUCCESS;
}

/* A slice of a longer sequence (q_offset, k_offset): p moves by delta = q_offset - k_offset.
 * Each offset within CLATTN_MAX_SEQ of 0 (global positions past 2^31 tokens: none exist) keeps
 * every position the reference and the host form in int64; |delta| + max(seq_q, seq_kv) <=
 * CLATTN_MAX_SEQ keeps p, p + 1 and the window's bounds in int, as without it. */
clattn_status clattn__check_offsets(clattn_context *ctx, const clattn_attention_desc *desc)
{
    const int64_t big = desc->seq_kv > desc->seq_q ? desc->seq_kv : desc->seq_q;
    const int64_t q = desc->q_offset, k = desc->k_offset;
    const int q_out = q < -CLATTN_MAX_SEQ || q > CLATTN_MAX_SEQ;
    if (q_out || k < -CLATTN_MAX_SEQ || k > CLATTN_MAX_SEQ)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->%s (%lld) is out of range: q_offset and k_offset must lie in [-%lld, %lld]",
                            q_out ? "q_offset" : "k_offset", (long long)(q_out ? q : k), (long long)CLATTN_MAX_SEQ,
                            (long long)CLATTN_MAX_SEQ);
    if (llabs(q - k) > CLATTN_MAX_SEQ - big)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->q_offset (%lld) - k_offset (%lld) is too far: |q_offset - k_offset| + max(seq_q, "
                            "seq_kv) must not exceed %lld",
                            (long long)q, (long long)k, (long long)CLATTN_MAX_SEQ);
    return CLATTN_SUCCESS;
}

clattn_status clattn__check_variants(clattn_context *ctx, const clattn_attention_desc *desc,
                                     const clattn_tensor *out, clattn_problem *p)
{
    clattn_variant *v = &p->var;
    memset(v, 0, sizeof *v);
    v->left = v->right = INT_MAX;
    if (!desc->window && (desc->window_left != 0 || desc->window_right != 0))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->window_left (%lld) and window_right (%lld) are set but desc->window is "
                            "0 (off): set window = 1 to use them",
                            (long long)desc->window_left, (long long)desc->window_right);
    clattn_status st = clattn__check_offsets(ctx, desc);
    if (st)
        return st;
    const int64_t delta = desc->q_offset - desc->k_offset;
    if (delta) {
        v->delta = (int)delta;
        v->bits |= CLATTN_V_OFFSET;
    }
    if (desc->window) {
        /* A side that bounds no row is unbounded: left >= seq_kv + max(delta, 0) (p - left < 0 for
         * every row, p < seq_kv + delta), right >= seq_q - min(delta, 0) (p + right >= L - 1 for
         * every row, p >= L - seq_q + delta). */
        if (desc->window_left >= 0 && desc->window_left < p->seq_kv + (delta > 0 ? delta : 0))
            v->left = (int)desc->window_left;
        if (desc->window_right >= 0 && desc->window_right < p->seq_q - (delta < 0 ? delta : 0))
            v->right = (int)desc->window_right;
        if (v->left != INT_MAX || v->right != INT_MAX)
            v->bits |= CLATTN_V_RANGE;
    }
    if (desc->chunk < 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->chunk is negative (%lld)", (long long)desc->chunk);
    if (desc->chunk > 0 && desc->k_offset == 0) {
        /* Every chunk of at least max(seq_kv, seq_q) + |delta| keys gives the same rows the same
         * keys (a row at p in [0, cap) sees [0, L), one at p in [-cap, 0) none): the kernels'
         * ints hold it. */
        const int64_t big = p->seq_kv > p->seq_q ? p->seq_kv : p->seq_q;
        const int64_t cap = big + (delta < 0 ? -delta : delta);
        v->chunk = (int)(desc->chunk < cap ? desc->chunk : cap);
        v->bits |= CLATTN_V_RANGE;
    } else if (desc->chunk > 0) {
        /* Keys from k_offset on: chunks are counted from global position 0, so the call's key j
         * sits at k_offset + j; the kernels take the origin k_offset mod chunk (korg). */
        if (desc->chunk > CLATTN_MAX_SEQ)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->chunk (%lld) with a k_offset must not exceed %lld", (long long)desc->chunk,
                                (long long)CLATTN_MAX_SEQ);
        v->chunk = (int)desc->chunk;
        v->korg = (int)(((desc->k_offset % desc->chunk) + desc->chunk) % desc->chunk);
        v->bits |= CLATTN_V_RANGE;
    }
    if (!isfinite(desc->softcap) || desc->softcap < 0.0f)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->softcap must be finite and positive, or 0 for none (got %g)",
                            (double)desc->softcap);
    /* The kernels take 1/c: below FLT_MIN (subnormal) it would be Inf. */
    if (desc->softcap > 0.0f && desc->softcap < FLT_MIN)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->softcap %g is subnormal (below %g)",
                            (double)desc->softcap, (double)FLT_MIN);
    if (desc->softcap > 0.0f) {
        v->softcap = desc->softcap;
        v->bits |= CLATTN_V_SOFTCAP;
    }
    const unsigned f32 = CLATTN_DTYPE_BIT(CLATTN_F32);
    if (desc->sinks) {
        const int64_t shape[4] = {1, p->heads_q, 1, 1};
        if ((st = clattn__check_view(ctx, "desc->sinks", desc->sinks, shape, CLATTN_VIEW_INPUT, f32, &v->sinks)))
            return st;
        if (out && clattn__views_overlap(out, desc->sinks))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "out overlaps desc->sinks");
        if (desc->lse && clattn__views_overlap(desc->lse, desc->sinks))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->lse overlaps desc->sinks");
        v->bits |= CLATTN_V_SINKS;
    }
    if (desc->alibi_slopes) {
        const int64_t shape[4] = {p->batch, p->heads_q, 1, 1};
        if ((st = clattn__check_view(ctx, "desc->alibi_slopes", desc->alibi_slopes, shape, CLATTN_VIEW_BROADCAST, f32,
                                     &v->alibi)))
            return st;
        if (out && clattn__views_overlap(out, desc->alibi_slopes))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "out overlaps desc->alibi_slopes");
        if (desc->lse && clattn__views_overlap(desc->lse, desc->alibi_slopes))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->lse overlaps desc->alibi_slopes");
        v->bits |= CLATTN_V_ALIBI;
    }
    if ((st = check_mod(ctx, "score_mod", desc->score_mod)) || (st = check_mod(ctx, "mask_mod", desc->mask_mod)))
        return st;
    if (desc->score_mod) {
        v->score_mod = desc->score_mod;
        v->bits |= CLATTN_V_SCORE_MOD;
    }
    if (desc->mask_mod) {
        v->mask_mod = desc->mask_mod;
        v->bits |= CLATTN_V_MASK_MOD;
    }
    return CLATTN_SUCCESS;
}

void clattn__variant_enter(clattn_context *ctx, const clattn_problem *p)
{
    ctx->variant_opts[0] = '\0';
    ctx->variant_src[0] = ctx->variant_src[1] = NULL;
    /* The KV storage's options (src/kv.c) go with the variants' to every attention program. */
    char kv[64];
    clattn__kv_options(p, kv, sizeof kv);
    if (!p->var.bits) {
        snprintf(ctx->variant_opts, sizeof ctx->variant_opts, "%s", kv);
        return;
    }
    /* The user's source goes into the program text, hence the binary cache's key; its hash in
     * the options keeps programs with different sources apart in the context's own cache. */
    char hex[33] = "0";
    if (p->var.score_mod || p->var.mask_mod) {
        clattn_hash h;
        clattn__hash_init(&h);
        clattn__hash_str(&h, p->var.score_mod ? p->var.score_mod : "");
        clattn__hash_str(&h, "\n--\n");
        clattn__hash_str(&h, p->var.mask_mod ? p->var.mask_mod : "");
        clattn__hash_hex(&h, hex);
    }
    snprintf(ctx->variant_opts, sizeof ctx->variant_opts, " -DVARIANTS=%u -DVARIANT_SRC=0x%.16s%s", p->var.bits, hex, kv);
    ctx->variant_src[0] = p->var.score_mod;
    ctx->variant_src[1] = p->var.mask_mod;
}

void clattn__variant_leave(clattn_context *ctx)
{
    ctx->variant_opts[0] = '\0';
    ctx->variant_src[0] = ctx->variant_src[1] = NULL;
}

void clattn__variant_args(clattn_args *a, const clattn_problem *p)
{
    const clattn_variant *v = &p->var;
    if (!v->bits)
        return;
    clattn__arg(a, sizeof(int), &v->left);
    clattn__arg(a, sizeof(int), &v->right);
    clattn__arg(a, sizeof(int), &v->chunk);
    clattn__arg(a, sizeof(int), &v->delta);
    clattn__arg(a, sizeof(int), &v->korg);
    clattn__arg(a, sizeof(float), &v->softcap);
    /* ALiBi: buffer, offset and the batch and head strides (0 where a dimension broadcasts). */
    const cl_mem abuf = v->alibi.buffer;
    const cl_ulong aoff = v->alibi.offset, asb = v->alibi.stride[0], ash = v->alibi.stride[1];
    clattn__arg(a, sizeof(cl_mem), abuf ? &abuf : NULL);
    clattn__arg(a, sizeof(cl_ulong), &aoff);
    clattn__arg(a, sizeof(cl_ulong), &asb);
    clattn__arg(a, sizeof(cl_ulong), &ash);
    const cl_mem sbuf = v->sinks.buffer;
    const cl_ulong soff = v->sinks.offset, ssh = v->sinks.stride[1];
    clattn__arg(a, sizeof(cl_mem), sbuf ? &sbuf : NULL);
    clattn__arg(a, sizeof(cl_ulong), &soff);
    clattn__arg(a, sizeof(cl_ulong), &ssh);
}

clattn_status clattn_alibi_slopes(int heads, float max_bias, float *slopes)
{
    if (heads < 1)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_alibi_slopes: heads must be positive (got %d)", heads);
    if (!slopes)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_alibi_slopes: slopes must not be NULL");
    if (!isfinite(max_bias) || max_bias <= 0.0f)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT,
                            "clattn_alibi_slopes: max_bias must be finite and positive (got %g)", (double)max_bias);
    int n = 1; /* 2^floor(log2 heads) */
    while (n <= heads / 2)
        n *= 2;
    const double m0 = pow(2.0, -(double)max_bias / n), m1 = pow(2.0, -(double)max_bias / (2.0 * n));
    for (int h = 0; h < heads; h++)
        slopes[h] = (float)(h < n ? pow(m0, h + 1) : pow(m1, 2 * (h - n) + 1));
    return CLATTN_SUCCESS;
}

clattn_status clattn__run_scores_variant(clattn_context *ctx, const clattn_problem *p, const clattn_view *src,
                                         const clattn_view *dst, cl_uint num_wait, const cl_event *wait,
                                         cl_event *done)
{
    const int wg0 = 64;
    int wg = (size_t)wg0 > ctx->dev.max_wg ? (int)ctx->dev.max_wg : wg0;
    cl_kernel k = NULL;
    clattn_status st;
    for (;;) {
        char opts[160];
        snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDT_OUT=%d -DDT_MASK=%d -DWG=%d -DKSEL=1 -DK_scores_variant=1",
                 (int)dst->dtype, p->has_mask ? (int)p->mask.dtype : 0, wg);
        st = clattn__get_kernel(ctx, "scores_variant.cl", opts, "scores_variant", &k);
        if (!st)
            break;
        const size_t cap = clattn__retry_cap(ctx, st, CLATTN_SOURCE_GENERIC, (size_t)wg);
        if (!cap)
            return st;
        wg = (int)cap;
    }
    const int64_t rows = p->batch * p->heads_q * p->seq_q;
    size_t global[3], local[3];
    const int ny = clattn__row_grid(ctx, wg, wg, rows, global, local);
    const int nrows = (int)rows, h = (int)p->heads_q, sq = (int)p->seq_q, skv = (int)p->seq_kv,
              causal = p->causal, has_mask = p->has_mask;
    clattn_args a = {k, 0, CL_SUCCESS};
    clattn__arg_view(&a, src);
    clattn__arg_view(&a, dst);
    clattn__arg_view(&a, has_mask ? &p->mask : NULL);
    clattn__arg(&a, sizeof(cl_mem), p->kv_lengths ? &p->kv_lengths : NULL);
    clattn__arg(&a, sizeof(int), &nrows);
    clattn__arg(&a, sizeof(int), &ny);
    clattn__arg(&a, sizeof(int), &h);
    clattn__arg(&a, sizeof(int), &sq);
    clattn__arg(&a, sizeof(int), &skv);
    clattn__arg(&a, sizeof(int), &causal);
    clattn__arg(&a, sizeof(int), &has_mask);
    clattn__variant_args(&a, p);
    return clattn__enqueue(ctx, &a, 3, global, local, num_wait, wait, done, "scores_variant");
}

/* floor(a / b), b > 0 */
static int64_t floor_div(int64_t a, int64_t b)
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

int clattn__all_keys_hidden(const clattn_problem *p)
{
    const clattn_variant *v = &p->var;
    if (p->kv_lengths || p->kv.varlen || !(p->causal || (v->bits & CLATTN_V_RANGE)))
        return 0;
    /* Rows' diagonal positions run from p0 (row 0) to pn (the last); every rule's first and
     * last visible key grow with p, so the union of the rows' keys lies in [beg(p0), end(pn)). */
    const int64_t L = p->seq_kv, p0 = L - p->seq_q + v->delta, pn = p0 + p->seq_q - 1;
    int64_t beg = 0, end = L;
    if (p->causal && pn + 1 < end)
        end = pn + 1;
    if (v->left != INT_MAX && p0 - v->left > beg)
        beg = p0 - v->left;
    if (v->right != INT_MAX && pn + v->right + 1 < end)
        end = pn + v->right + 1;
    if (v->chunk > 0) {
        const int64_t c0 = floor_div(p0 + v->korg, v->chunk) * v->chunk - v->korg,
                      c1 = (floor_div(pn + v->korg, v->chunk) + 1) * v->chunk - v->korg;
        if (c0 > beg)
            beg = c0;
        if (c1 < end)
            end = c1;
    }
    return end <= beg || end <= 0;
}

int64_t clattn__row_keys_max(const clattn_problem *p)
{
    const clattn_variant *v = &p->var;
    int64_t n = p->seq_kv;
    if (!(v->bits & CLATTN_V_RANGE))
        return n;
    /* A row at p sees at most [p - left, p + right] (right 0 when causal hides the keys past p)
     * and the keys of one chunk. */
    const int64_t right = p->causal ? 0 : v->right;
    if (v->left != INT_MAX && right != INT_MAX && v->left + right + 1 < n)
        n = v->left + right + 1;
    if (v->chunk > 0 && v->chunk < n)
        n = v->chunk;
    return n;
}
