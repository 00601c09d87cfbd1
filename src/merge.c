/* Merging partial (O, LSE) results (merge.cl): flash-decoding splits and the public clattn_merge. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Kernel `name` of merge.cl built with `opts` plus its work-group size (WG): the tuned one, at
 * most the device's largest, and smaller when the compiled kernel allows fewer work-items
 * (clattn__retry_cap). WG 1 (CPUs' default) makes a work-item merge a whole row of dv columns
 * (*cpw, merge.cl's CPW): a work-item per (row, column) made the merge a work-group scheduler's
 * benchmark on PoCL (0.6 GB/s) and took every part's exponential once per column. */
static clattn_status merge_kernel(clattn_context *ctx, const char *name, const char *opts, int64_t dv, int *wg,
                                  int *cpw, cl_kernel *k)
{
    const clattn_bucket b = CLATTN_MERGE_BUCKET;
    clattn_params pp;
    const clattn_params_source source = clattn__default_params(ctx, &b, &pp);
    *wg = pp.merge.WG > 0 ? pp.merge.WG : 64;
    for (size_t cap = ctx->dev.max_wg;;) {
        if ((size_t)*wg > cap)
            *wg = (int)cap;
        *cpw = *wg == 1 ? (int)dv : 1;
        char all[240];
        snprintf(all, sizeof all, "%s -DWG=%d -DCPW=%d -DKSEL=1 -DK_%s=1", opts, *wg, *cpw, name);
        const clattn_status st = clattn__get_kernel(ctx, "merge.cl", all, name, k);
        if (!st)
            return st;
        if (!(cap = clattn__retry_cap(ctx, st, source, cap)))
            return st;
    }
}

/* Work-items per (row, column): x covers DV in work-groups of wg, the rows go in y and z (row =
 * y + ny·z with ny = min(rows, 32768, the device's grid limit), returned), since CUDA-based drivers
 * cap y and z at 65535 work-groups; a longer z runs in chunks (clattn__enqueue). */
int clattn__row_grid(const clattn_context *ctx, int wg, int64_t dv, int64_t rows, size_t global[3],
                     size_t local[3])
{
    int64_t y = rows < 1 ? 1 : rows < 32768 ? rows : 32768;
    if (ctx->dev.max_groups_yz && (size_t)y > ctx->dev.max_groups_yz)
        y = (int64_t)ctx->dev.max_groups_yz;
    local[0] = (size_t)wg;
    local[1] = local[2] = 1;
    global[0] = (size_t)((dv + wg - 1) / wg * wg);
    global[1] = (size_t)y;
    global[2] = (size_t)((rows + y - 1) / y);
    return (int)y;
}

/* Parts lie contiguously as f32 [part][B][H][S][DV] and LSE [part][B][H][S] (see fused.c). */
clattn_status clattn__run_merge(clattn_context *ctx, int parts, int64_t batch, int64_t heads,
                                int64_t seq, int64_t dv, const clattn_view *part_out,
                                const clattn_view *part_lse, const clattn_view *out,
                                const clattn_view *lse, const clattn_view *sinks, cl_mem cu_q, int total_q,
                                cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    char opts[128];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDT_OUT=%d", (int)out->dtype);
    int wg;
    cl_kernel k;
    int cpw;
    clattn_status st = merge_kernel(ctx, "merge_strided", opts, dv, &wg, &cpw, &k);
    if (st)
        return st;
    const cl_ulong rows = (cl_ulong)(batch * heads * seq);
    const cl_ulong p_split = rows * (cl_ulong)dv, pl_split = rows;
    size_t global[3], local[3];
    const int ny = clattn__row_grid(ctx, wg, (dv + cpw - 1) / cpw, (int64_t)rows, global, local);
    const int h = (int)heads, s = (int)seq, d = (int)dv, has_lse = lse != NULL, nrows = (int)rows;
    clattn_args a = {k, 0, CL_SUCCESS};
    clattn__arg_view(&a, part_out);
    clattn__arg_view(&a, part_lse);
    clattn__arg_view(&a, out);
    clattn__arg_view(&a, lse);
    clattn__arg(&a, sizeof(cl_ulong), &p_split);
    clattn__arg(&a, sizeof(cl_ulong), &pl_split);
    clattn__arg(&a, sizeof(int), &parts);
    clattn__arg(&a, sizeof(int), &nrows);
    clattn__arg(&a, sizeof(int), &ny);
    clattn__arg(&a, sizeof(int), &h);
    clattn__arg(&a, sizeof(int), &s);
    clattn__arg(&a, sizeof(int), &d);
    clattn__arg(&a, sizeof(int), &has_lse);
    /* The sinks: buffer, offset and head stride (NULL: none). */
    const cl_mem sbuf = sinks ? sinks->buffer : NULL;
    const cl_ulong soff = sinks ? sinks->offset : 0, ssh = sinks ? sinks->stride[1] : 0;
    clattn__arg(&a, sizeof(cl_mem), sbuf ? &sbuf : NULL);
    clattn__arg(&a, sizeof(cl_ulong), &soff);
    clattn__arg(&a, sizeof(cl_ulong), &ssh);
    clattn__arg(&a, sizeof(cl_mem), cu_q ? &cu_q : NULL); /* a packed output (varlen) */
    clattn__arg(&a, sizeof(int), &total_q);
    return clattn__enqueue(ctx, &a, 3, global, local, num_wait, wait, done, "merge_strided");
}

static clattn_status merge_pair(clattn_context *ctx, const clattn_view *x, const clattn_view *xl,
                                const clattn_view *y, const clattn_view *yl, const clattn_view *o,
                                const clattn_view *ol, cl_ulong xs_delta, cl_ulong os_delta,
                                int64_t batch, int64_t heads, int64_t seq, int64_t dv,
                                cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    char opts[160];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DDT_A=%d -DDT_IN=%d -DDT_OUT=%d", (int)x->dtype,
             (int)y->dtype, (int)o->dtype);
    int wg;
    cl_kernel k;
    int cpw;
    clattn_status st = merge_kernel(ctx, "merge_pair", opts, dv, &wg, &cpw, &k);
    if (st)
        return st;
    const int64_t rows = batch * heads * seq;
    size_t global[3], local[3];
    const int ny = clattn__row_grid(ctx, wg, (dv + cpw - 1) / cpw, rows, global, local);
    const int h = (int)heads, s = (int)seq, d = (int)dv, has_lse = ol != NULL, nrows = (int)rows;
    clattn_args a = {k, 0, CL_SUCCESS};
    clattn__arg_view(&a, x);
    clattn__arg_view(&a, xl);
    clattn__arg_view(&a, y);
    clattn__arg_view(&a, yl);
    clattn__arg_view(&a, o);
    clattn__arg_view(&a, ol);
    clattn__arg(&a, sizeof(cl_ulong), &xs_delta);
    clattn__arg(&a, sizeof(cl_ulong), &os_delta);
    clattn__arg(&a, sizeof(int), &nrows);
    clattn__arg(&a, sizeof(int), &ny);
    clattn__arg(&a, sizeof(int), &h);
    clattn__arg(&a, sizeof(int), &s);
    clattn__arg(&a, sizeof(int), &d);
    clattn__arg(&a, sizeof(int), &has_lse);
    return clattn__enqueue(ctx, &a, 3, global, local, num_wait, wait, done, "merge_pair");
}

clattn_status clattn_merge(clattn_context *ctx, int num_parts, const clattn_tensor *part_out,
                           const clattn_tensor *part_lse, const clattn_tensor *out,
                           const clattn_tensor *lse, cl_uint num_wait, const cl_event *wait,
                           cl_event *done)
{
    if (done && !clattn__done_in_wait(num_wait, wait, done))
        *done = NULL;
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_merge: ctx must not be NULL");
    clattn__clear_error(ctx);
    if (num_parts < 1 || num_parts > 4096)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "num_parts must be 1..4096 (got %d)", num_parts);
    if (!part_out || !part_lse)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s must not be NULL",
                            !part_out && !part_lse ? "part_out and part_lse" : !part_out ? "part_out" : "part_lse");
    if (!out)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "out must not be NULL");
    for (int i = 0; i < 4; i++)
        if (out->shape[i] <= 0 || out->shape[i] > 0x7fffffffLL)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "out->shape[%d] is out of range (%lld)",
                                i, (long long)out->shape[i]);
    if (out->shape[3] > CLATTN_MAX_HEAD_DIM_V)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED, "out->shape[3] (%lld) exceeds %d",
                            (long long)out->shape[3], CLATTN_MAX_HEAD_DIM_V);
    if ((uint64_t)out->shape[0] * (uint64_t)out->shape[1] > 0x7fffffffULL ||
        (uint64_t)out->shape[0] * (uint64_t)out->shape[1] * (uint64_t)out->shape[2] > 0x7fffffffULL)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "out: batch x heads x seq (%lld x %lld x %lld) exceeds %d",
                            (long long)out->shape[0], (long long)out->shape[1], (long long)out->shape[2],
                            0x7fffffff);
    const int64_t B = out->shape[0], H = out->shape[1], S = out->shape[2], DV = out->shape[3];
    const int64_t os[4] = {B, H, S, DV}, ls[4] = {B, H, S, 1};
    clattn_view vo, vl;
    clattn_status st;
    if ((st = clattn__check_view(ctx, "out", out, os, CLATTN_VIEW_OUTPUT, CLATTN_DTYPES_ALL, &vo)))
        return st;
    if (lse && (st = clattn__check_view(ctx, "lse", lse, ls, CLATTN_VIEW_OUTPUT,
                                        CLATTN_DTYPE_BIT(CLATTN_F32), &vl)))
        return st;
    if (lse && clattn__views_overlap(lse, out))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "lse overlaps out");
    clattn_view *vpo = malloc(sizeof(clattn_view) * 2 * (size_t)num_parts);
    if (!vpo)
        return clattn__fail(ctx, CLATTN_OUT_OF_MEMORY, "out of host memory");
    clattn_view *vpl = vpo + num_parts;
    for (int i = 0; i < num_parts && st == CLATTN_SUCCESS; i++) {
        char name[48], lname[48];
        snprintf(name, sizeof name, "part_out[%d]", i);
        snprintf(lname, sizeof lname, "part_lse[%d]", i);
        if ((st = clattn__check_view(ctx, name, &part_out[i], os, CLATTN_VIEW_INPUT, CLATTN_DTYPES_ALL,
                                     &vpo[i])) ||
            (st = clattn__check_view(ctx, lname, &part_lse[i], ls, CLATTN_VIEW_INPUT,
                                     CLATTN_DTYPE_BIT(CLATTN_F32), &vpl[i])))
            break;
        /* out first, then lse; part_out before part_lse */
        const int hit[4] = {clattn__views_overlap(&part_out[i], out), clattn__views_overlap(&part_lse[i], out),
                            lse && clattn__views_overlap(&part_out[i], lse),
                            lse && clattn__views_overlap(&part_lse[i], lse)};
        for (int h = 0; h < 4 && !st; h++)
            if (hit[h])
                st = clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "part %d overlaps %s (%s[%d])", i,
                                  h < 2 ? "out" : "lse", h % 2 ? "part_lse" : "part_out", i);
    }
    if (!st)
        st = clattn__check_wait(ctx, num_wait, wait, done);
    if (st) {
        free(vpo);
        return st;
    }

    /* Fold the parts pairwise into an f32 accumulator: its output (normalised), and per row its
     * maximum m and weight sum s (merge.cl), which alternate between two slots [m0 m1 s0 s1]
     * because merge_pair must not overwrite a row's m or s that other work-groups still read.
     * One part needs only an LSE slot (below), two parts none. */
    const cl_ulong rows = (cl_ulong)(B * H * S);
    const cl_ulong dv = (cl_ulong)DV;
    const cl_ulong acc_floats = num_parts == 1 ? 0 : rows * dv;
    const cl_ulong s_delta = 2 * rows; /* from slot i's m to its s */
    cl_mem ws = NULL;
    if (num_parts != 2) {
        st = clattn__workspace(
            ctx, clattn__mul_sat(clattn__add_sat(acc_floats, (num_parts == 1 ? 1u : 4u) * rows), 4), &ws);
        if (st) {
            free(vpo);
            return st;
        }
    }
    const clattn_view acc = {ws, CLATTN_F32, 0, {(cl_ulong)(H * S) * dv, (cl_ulong)S * dv, dv}};
    clattn_view accl[2];
    for (int i = 0; i < 2; i++)
        accl[i] = (clattn_view){ws, CLATTN_F32, acc_floats + (cl_ulong)i * rows, {(cl_ulong)(H * S), (cl_ulong)S, 1}};

    if (num_parts == 1) {
        /* One part: pair it with an all -inf LSE slot, whose weight is exactly zero. */
        float ninf = -1.0f / 0.0f;
        cl_int err = clEnqueueFillBuffer(ctx->queue, ws, &ninf, sizeof ninf, (size_t)accl[0].offset * 4,
                                         (size_t)rows * 4, num_wait, num_wait ? wait : NULL, NULL);
        if (err != CL_SUCCESS) {
            free(vpo);
            return clattn__cl_fail(ctx, err, "clEnqueueFillBuffer(merge)");
        }
        st = merge_pair(ctx, &vpo[0], &vpl[0], &vpo[0], &accl[0], &vo, lse ? &vl : NULL, 0, 0, B,
                        H, S, DV, 0, NULL, done);
        free(vpo);
        return st;
    }
    const clattn_view *x = &vpo[0], *xl = &vpl[0];
    for (int i = 1; i < num_parts && !st; i++) {
        const int last = i == num_parts - 1;
        const clattn_view *o = last ? &vo : &acc;
        const clattn_view *ol = last ? (lse ? &vl : NULL) : &accl[i % 2];
        st = merge_pair(ctx, x, xl, &vpo[i], &vpl[i], o, ol, i == 1 ? 0 : s_delta,
                        last ? 0 : s_delta, B, H, S, DV, i == 1 ? num_wait : 0,
                        i == 1 ? wait : NULL, last ? done : NULL);
        x = &acc;
        xl = &accl[i % 2];
    }
    free(vpo);
    return st;
}
