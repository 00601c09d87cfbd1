/* clattn_attention: validation, choice of algorithm, and the unfused path (scores -> softmax -> P·V). */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static clattn_status unfused_launches(clattn_context *ctx, const clattn_problem *p, cl_uint num_wait,
                                      const cl_event *wait, cl_event *done);

/* The softmax launch writes the caller's lse and probabilities before P·V runs, so every kernel
 * is built, the workspace allocated and every argument set (a rehearsal that enqueues nothing)
 * before the first launch: a build failure or an allocation failure then leaves the caller's
 * tensors untouched. */
static clattn_status run_unfused(clattn_context *ctx, const clattn_problem *p, cl_uint num_wait,
                                 const cl_event *wait, cl_event *done)
{
    ctx->rehearse = 1;
    clattn_status st = unfused_launches(ctx, p, num_wait, wait, NULL);
    ctx->rehearse = 0;
    if (st)
        return st;
    return unfused_launches(ctx, p, num_wait, wait, done);
}

static clattn_status unfused_launches(clattn_context *ctx, const clattn_problem *p, cl_uint num_wait,
                                      const cl_event *wait, cl_event *done)
{
    /* batch x heads_q x seq_q is below 2^37 (validation), seq_kv below 2^31: the product may
     * pass 2^64. */
    const uint64_t elems = clattn__mul_sat((uint64_t)p->batch * (uint64_t)p->heads_q * (uint64_t)p->seq_q,
                                           (uint64_t)p->seq_kv);
    if (elems > (uint64_t)SIZE_MAX / 4 || elems * 4 > ctx->dev.max_alloc)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "the unfused path needs a %.4g-byte scores matrix (batch x heads_q x "
                            "seq_q x seq_kv floats), more than the device's max allocation of %llu "
                            "bytes; use CLATTN_ALGORITHM_FUSED (O(seq) memory)",
                            4.0 * (double)p->batch * (double)p->heads_q * (double)p->seq_q * (double)p->seq_kv,
                            (unsigned long long)ctx->dev.max_alloc);
    /* One workspace: the scores matrix, then the transposed K of the KT scores variant when
     * both fit one allocation (as clattn_scores, at most half of it), then P·V's f32 copy of an
     * f16/bf16 V (clattn__pv_scratch, from a 64-byte boundary) when that fits too; else without
     * them. */
    const uint64_t room = ctx->dev.max_alloc - elems * 4, half = ctx->dev.max_alloc / 2;
    const uint64_t kt = clattn__scores_scratch(ctx, p, room < half ? room : half);
    const uint64_t vf_at = (elems * 4 + kt + 63) / 64 * 64;
    uint64_t vf = clattn__pv_scratch(ctx, p);
    if (vf > ctx->dev.max_alloc || vf_at > ctx->dev.max_alloc - vf)
        vf = 0;
    cl_mem ws;
    clattn_status st = clattn__workspace(ctx, vf ? vf_at + vf : elems * 4 + kt, &ws);
    if (st)
        return st;
    const cl_ulong skv = (cl_ulong)p->seq_kv, sq = (cl_ulong)p->seq_q, hq = (cl_ulong)p->heads_q;
    const clattn_view scores = {ws, CLATTN_F32, 0, {hq * sq * skv, sq * skv, skv}};
    /* The scale and the mask are applied once, by the scores kernel. P·V reads f32
     * probabilities: the caller's tensor when it is f32, else the workspace, so that f16/bf16
     * probabilities (a second, rounded copy) do not degrade the output. */
    const clattn_view *lse = p->lse.buffer ? &p->lse : NULL;
    const clattn_view *sinks = p->var.sinks.buffer ? &p->var.sinks : NULL;
    /* The copy of V first: a launch refused there comes before anything of the caller's is
     * written (softmax writes lse and the probabilities). */
    clattn_view v = p->v;
    if (vf) {
        if ((st = clattn__run_widen_v(ctx, p, ws, vf_at / 4, &v, num_wait, wait)))
            return st;
        num_wait = 0; /* the queue is in order */
        wait = NULL;
    }
    if ((st = clattn__run_scores(ctx, p, &scores, kt ? ws : NULL, elems, kt, num_wait, wait, NULL)))
        return st;
    const clattn_view *probs = &scores;
    cl_mem_flags pf = 0;
    if (p->probs.buffer &&
        clGetMemObjectInfo(p->probs.buffer, CL_MEM_FLAGS, sizeof pf, &pf, NULL) != CL_SUCCESS)
        pf = CL_MEM_WRITE_ONLY;
    /* A CL_MEM_WRITE_ONLY probabilities buffer must not be read back by P·V either. Such a
     * buffer, or an f16/bf16 one, takes a softmax of its own before the in-place one P·V reads;
     * that first softmax writes lse too, so that the caller's outputs are all written by one
     * launch and a refused launch after it leaves them written together (docs/guarantees.md). */
    if (p->probs.buffer && p->probs.dtype == CLATTN_F32 && !(pf & CL_MEM_WRITE_ONLY)) {
        probs = &p->probs;
    } else if (p->probs.buffer) {
        if ((st = clattn__run_softmax(ctx, p->batch, p->heads_q, p->seq_q, p->seq_kv, 1.0f, 0, NULL,
                                      NULL, &scores, &p->probs, lse, CLATTN_F32, sinks, 0, NULL, NULL)))
            return st;
        lse = NULL;
    }
    if ((st = clattn__run_softmax(ctx, p->batch, p->heads_q, p->seq_q, p->seq_kv, 1.0f, 0, NULL,
                                  NULL, &scores, probs, lse, CLATTN_F32, sinks, 0, NULL, NULL)))
        return st;
    return clattn__run_pv(ctx, p, probs, &v, 0, NULL, done);
}

clattn_status clattn_attention(clattn_context *ctx, const clattn_attention_desc *desc,
                               const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                               const clattn_tensor *out, cl_uint num_wait, const cl_event *wait,
                               cl_event *done)
{
    if (done && !clattn__done_in_wait(num_wait, wait, done))
        *done = NULL;
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_attention: ctx must not be NULL");
    clattn__clear_error(ctx);
    clattn_problem p;
    clattn_status st = clattn__check_attention(ctx, desc, q, k, v, out, 1, &p);
    if (st || (st = clattn__check_wait(ctx, num_wait, wait, done)))
        return st;
    clattn_algorithm algo = desc->algorithm;
    if (desc->probabilities) {
        if (algo == CLATTN_ALGORITHM_FUSED)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->probabilities needs CLATTN_ALGORITHM_UNFUSED or AUTO (the fused "
                                "path never forms them)");
        algo = CLATTN_ALGORITHM_UNFUSED;
    }
    if (p.drop.on && algo == CLATTN_ALGORITHM_UNFUSED)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "desc->dropout_p %g: dropout is drawn by the fused path only (%s)",
                            (double)desc->dropout_p,
                            desc->probabilities ? "desc->probabilities asks for the unfused one"
                                                : "desc->algorithm is CLATTN_ALGORITHM_UNFUSED");
    if (p.kv.on && algo == CLATTN_ALGORITHM_UNFUSED)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "%s K/V (%s, %s) are read by the fused path only: the unfused path%s needs plain Q, K "
                            "and V, K and V of the query's type",
                            p.kv.page ? "paged" : p.kv.varlen ? "packed (varlen)" : "quantized",
                            clattn_dtype_name(p.kv.kt), clattn_dtype_name(p.kv.vt),
                            desc->probabilities ? " (desc->probabilities)" : "");
    if (!desc->probabilities && clattn__all_keys_hidden(&p))
        /* A block no row sees any key of (a slice above the diagonal, outside the window): no
         * attention kernel runs; every row is empty, 0 and an LSE of -inf (or its sink), written
         * by the merge of no parts. */
        return clattn__run_merge(ctx, 0, p.batch, p.heads_q, p.seq_q, p.head_dim_v, &p.out, &p.out, &p.out,
                                 p.lse.buffer ? &p.lse : NULL, p.var.sinks.buffer ? &p.var.sinks : NULL, NULL, 0,
                                 num_wait, wait, done);
    clattn__variant_enter(ctx, &p);
    st = algo == CLATTN_ALGORITHM_UNFUSED ? run_unfused(ctx, &p, num_wait, wait, done)
                                          : clattn__run_fused(ctx, &p, num_wait, wait, done);
    clattn__variant_leave(ctx);
    return st;
}
