/* Argument validation shared by every entry point. Runs before anything is enqueued, so a failure
 * leaves the caller's buffers untouched; every message names the argument and its value. */
#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* Messages name an out-of-range dtype too. */
static const char *dtype_name(clattn_dtype d)
{
    const char *name = clattn_dtype_name(d);
    return name ? name : "unknown";
}

/* Highest element index the view touches, or 0 with *ok = 0 on overflow. */
static uint64_t last_index(const clattn_tensor *t, const int64_t shape[4], int *ok)
{
    uint64_t hi = (uint64_t)t->offset, term;
    *ok = 1;
    for (int i = 0; i < 3; i++)
        if (!clattn__mul_ok((uint64_t)(shape[i] - 1), (uint64_t)t->stride[i], &term) || !clattn__add_ok(hi, term, &hi))
            *ok = 0;
    if (!clattn__add_ok(hi, (uint64_t)(shape[3] - 1), &hi))
        *ok = 0;
    return hi;
}

/* Kernels writing a read-only buffer, or reading a write-only one, are undefined in OpenCL. */
static clattn_status check_access(clattn_context *ctx, cl_mem m, const char *name, int output)
{
    cl_mem_flags mf = 0;
    if (clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof mf, &mf, NULL) != CL_SUCCESS)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s is not a valid cl_mem", name);
    if (output && (mf & CL_MEM_READ_ONLY))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "%s is written but its buffer was created CL_MEM_READ_ONLY", name);
    if (!output && (mf & CL_MEM_WRITE_ONLY))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "%s is read but its buffer was created CL_MEM_WRITE_ONLY", name);
    return CLATTN_SUCCESS;
}

/* A cl_mem of this context that is a plain buffer (an image's storage has no layout the kernels
 * could index), and its size. */
static clattn_status check_mem(clattn_context *ctx, cl_mem m, const char *label, size_t *size)
{
    cl_context mem_ctx = NULL;
    cl_mem_object_type type = 0;
    if (clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof *size, size, NULL) != CL_SUCCESS ||
        clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof mem_ctx, &mem_ctx, NULL) != CL_SUCCESS ||
        clGetMemObjectInfo(m, CL_MEM_TYPE, sizeof type, &type, NULL) != CL_SUCCESS)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s is not a valid cl_mem", label);
    if (mem_ctx != ctx->context)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s belongs to another OpenCL context", label);
    if (type != CL_MEM_OBJECT_BUFFER)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "%s is an image or pipe (CL_MEM_TYPE 0x%x), not a buffer object", label,
                            (unsigned)type);
    return CLATTN_SUCCESS;
}

clattn_status clattn__check_view(clattn_context *ctx, const char *name, const clattn_tensor *t,
                                 const int64_t want[4], unsigned flags, unsigned dtypes,
                                 clattn_view *out)
{
    static const char *dims[4] = {"batch", "heads", "seq", "dim"};
    if (!t)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s must not be NULL", name);
    if (!t->buffer)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s->buffer is NULL", name);
    if (clattn_dtype_size(t->dtype) == 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s->dtype %d is not a clattn_dtype", name,
                            (int)t->dtype);
    if (!(dtypes & CLATTN_DTYPE_BIT(t->dtype)))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s->dtype %s is not allowed here", name,
                            dtype_name(t->dtype));
    int64_t shape[4];
    for (int i = 0; i < 4; i++) {
        int bcast = (flags & CLATTN_VIEW_BROADCAST) && i < 3 && t->shape[i] == 1;
        if (t->shape[i] != want[i] && !bcast)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "%s->shape[%d] (%s) is %lld, expected %lld%s", name, i, dims[i],
                                (long long)t->shape[i], (long long)want[i],
                                (flags & CLATTN_VIEW_BROADCAST) && i < 3 ? " or 1" : "");
        shape[i] = t->shape[i];
    }
    if (t->offset < 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s->offset is negative (%lld)", name,
                            (long long)t->offset);
    for (int i = 0; i < 3; i++)
        if (t->stride[i] < 0)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s->stride[%d] (%s) is negative (%lld)",
                                name, i, dims[i], (long long)t->stride[i]);
    /* Block types (q8_0, q4_0): rows start on a block and hold whole blocks. */
    const int64_t blk = clattn_dtype_block(t->dtype);
    if (blk > 1) {
        if (shape[3] % blk || t->offset % blk || t->stride[0] % blk || t->stride[1] % blk || t->stride[2] % blk)
            return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                                "%s is %s, stored in blocks of %lld along dim: its dim (%lld), offset (%lld) and "
                                "strides (%lld/%lld/%lld) must be multiples of %lld",
                                name, dtype_name(t->dtype), (long long)blk, (long long)shape[3],
                                (long long)t->offset, (long long)t->stride[0], (long long)t->stride[1],
                                (long long)t->stride[2], (long long)blk);
    }
    int ok;
    uint64_t hi = last_index(t, shape, &ok), bytes = 0;
    if (!ok || !clattn__add_ok(hi, 1, &bytes) ||
        !clattn__mul_ok(bytes / (uint64_t)blk, clattn_dtype_size(t->dtype), &bytes))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "%s: offset + strides x shape overflows 64 bits", name);
    char label[64];
    snprintf(label, sizeof label, "%s->buffer", name);
    size_t mem_size = 0;
    clattn_status st = check_mem(ctx, t->buffer, label, &mem_size);
    if (st || (st = check_access(ctx, t->buffer, name, (flags & CLATTN_VIEW_OUTPUT) != 0)))
        return st;
    if (bytes > mem_size)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "%s needs %llu bytes (offset %lld, strides %lld/%lld/%lld, shape "
                            "%lldx%lldx%lldx%lld, %s) but its buffer has %zu",
                            name, (unsigned long long)bytes, (long long)t->offset,
                            (long long)t->stride[0], (long long)t->stride[1], (long long)t->stride[2],
                            (long long)shape[0], (long long)shape[1], (long long)shape[2],
                            (long long)shape[3], dtype_name(t->dtype), mem_size);
    if (flags & CLATTN_VIEW_OUTPUT) {
        /* Distinct elements must land on distinct addresses. The rule, exact for the layouts
         * tensors have and simple to state: taken by increasing stride, each dimension of extent
         * above 1 steps past everything the dimensions below it span. Interleaved layouts whose
         * addresses happen not to collide are refused too. */
        int order[3] = {0, 1, 2};
        for (int i = 0; i < 3; i++)
            for (int j = i + 1; j < 3; j++)
                if (t->stride[order[j]] < t->stride[order[i]]) {
                    int tmp = order[i];
                    order[i] = order[j];
                    order[j] = tmp;
                }
        uint64_t span = (uint64_t)shape[3];
        for (int i = 0; i < 3; i++) {
            int d = order[i];
            if (shape[d] <= 1)
                continue;
            if ((uint64_t)t->stride[d] < span)
                return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                    "%s is an output but its %s stride %lld is less than the %llu "
                                    "elements spanned by its dimensions of smaller stride (outputs may "
                                    "not overlap or interleave themselves)",
                                    name, dims[d], (long long)t->stride[d], (unsigned long long)span);
            span = (uint64_t)t->stride[d] * (uint64_t)(shape[d] - 1) + span;
        }
    }
    /* In the kernels' units: elements, bytes for the block types. */
    const cl_ulong unit = blk > 1 ? (cl_ulong)clattn_dtype_size(t->dtype) : 1;
    out->buffer = t->buffer;
    out->dtype = t->dtype;
    out->offset = (cl_ulong)t->offset / (cl_ulong)blk * unit;
    for (int i = 0; i < 3; i++)
        out->stride[i] = shape[i] == 1 ? 0 : (cl_ulong)t->stride[i] / (cl_ulong)blk * unit;
    return CLATTN_SUCCESS;
}

int clattn__same_view(const clattn_view *a, const clattn_view *b)
{
    return a->buffer == b->buffer && a->dtype == b->dtype && a->offset == b->offset &&
           memcmp(a->stride, b->stride, sizeof a->stride) == 0;
}

/* Where a buffer's bytes live: a sub-buffer's are its parent's from CL_MEM_OFFSET on, and a
 * CL_MEM_USE_HOST_PTR buffer's are the caller's host memory (host, else NULL), which two buffers
 * may share. */
typedef struct mem_place {
    cl_mem root;
    uint64_t base;
    uintptr_t host;
} mem_place;

static mem_place place_of(cl_mem m)
{
    mem_place p = {m, 0, 0};
    cl_mem parent = NULL;
    size_t off = 0;
    if (clGetMemObjectInfo(m, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) == CL_SUCCESS &&
        parent && clGetMemObjectInfo(m, CL_MEM_OFFSET, sizeof off, &off, NULL) == CL_SUCCESS) {
        p.root = parent;
        p.base = off;
    }
    cl_mem_flags flags = 0;
    void *host = NULL;
    if (clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof flags, &flags, NULL) == CL_SUCCESS &&
        (flags & CL_MEM_USE_HOST_PTR) &&
        clGetMemObjectInfo(m, CL_MEM_HOST_PTR, sizeof host, &host, NULL) == CL_SUCCESS)
        p.host = (uintptr_t)host;
    return p;
}

int clattn__buffer_align16(cl_mem m)
{
    /* a device allocation starts on CL_DEVICE_MEM_BASE_ADDR_ALIGN, a sub-buffer on a multiple of
     * it; the caller's host memory where the device computes in it, wherever the caller put it */
    const mem_place p = place_of(m);
    return !p.host || (p.host & 15u) == 0;
}

int clattn__bytes_overlap(cl_mem a, uint64_t a_lo, uint64_t a_hi, cl_mem b, uint64_t b_lo, uint64_t b_hi)
{
    if (a == b)
        return a_lo < b_hi && b_lo < a_hi;
    const mem_place pa = place_of(a), pb = place_of(b);
    if (pa.host && pb.host)
        return pa.host + a_lo < pb.host + b_hi && pb.host + b_lo < pa.host + a_hi;
    return pa.root == pb.root && pa.base + a_lo < pb.base + b_hi && pb.base + b_lo < pa.base + a_hi;
}

/* Byte range [lo, hi) of a checked view in its buffer. */
static void view_bytes(const clattn_tensor *t, uint64_t *lo, uint64_t *hi)
{
    int ok;
    const uint64_t e = clattn_dtype_size(t->dtype), blk = (uint64_t)clattn_dtype_block(t->dtype);
    *lo = (uint64_t)t->offset / blk * e;
    *hi = (last_index(t, t->shape, &ok) + blk) / blk * e;
}

/* Conservative: the byte ranges of two checked views intersect, in one buffer or in storage two
 * buffers share (sub-buffers of one buffer, host memory of CL_MEM_USE_HOST_PTR buffers). */
int clattn__views_overlap(const clattn_tensor *a, const clattn_tensor *b)
{
    uint64_t a_lo, a_hi, b_lo, b_hi;
    view_bytes(a, &a_lo, &a_hi);
    view_bytes(b, &b_lo, &b_hi);
    return clattn__bytes_overlap(a->buffer, a_lo, a_hi, b->buffer, b_lo, b_hi);
}

clattn_status clattn__check_reserved(clattn_context *ctx, const int64_t *reserved, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (reserved[i] != 0)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "desc->reserved[%zu] is %lld: the reserved fields must be zero (zero-initialise "
                                "the descriptor)",
                                i, (long long)reserved[i]);
    return CLATTN_SUCCESS;
}

const char *clattn__first_overlap(const clattn_tensor *t, int n, const clattn_tensor *const *ts,
                                  const char *const *names)
{
    for (int i = 0; i < n; i++)
        if (ts[i] && clattn__views_overlap(t, ts[i]))
            return names[i];
    return NULL;
}

int clattn__table_overlaps(const clattn_kvstore *kv, const clattn_tensor *t)
{
    uint64_t lo, hi;
    view_bytes(t, &lo, &hi);
    return clattn__bytes_overlap(kv->bt, 4u * kv->bt_off, 4u * kv->bt_hi, t->buffer, lo, hi);
}

int clattn__kvlen_overlaps(cl_mem kvlen, int64_t batch, const clattn_tensor *t)
{
    uint64_t lo, hi;
    view_bytes(t, &lo, &hi);
    return clattn__bytes_overlap(kvlen, 0, 4u * (uint64_t)batch, t->buffer, lo, hi);
}

int clattn__done_in_wait(cl_uint num_wait, const cl_event *wait, const cl_event *done)
{
    for (cl_uint i = 0; done && wait && i < num_wait; i++)
        if (done == &wait[i])
            return 1;
    return 0;
}

clattn_status clattn__check_wait(clattn_context *ctx, cl_uint num_wait, const cl_event *wait,
                                 const cl_event *done)
{
    if (num_wait > 0 && !wait)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "wait is NULL but num_wait is %u",
                            (unsigned)num_wait);
    /* OpenCL forbids an enqueue's event to be an element of its wait list (PoCL asserts). */
    if (clattn__done_in_wait(num_wait, wait, done))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "done points to wait[%u]: pass a separate cl_event for done",
                            (unsigned)(done - wait));
    /* With num_wait 0 the list is ignored (enqueues get NULL), as OpenCL itself requires. */
    for (cl_uint i = 0; i < num_wait; i++) {
        if (!wait[i])
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "wait[%u] is NULL", (unsigned)i);
        cl_context ev_ctx = NULL;
        cl_int exec = CL_COMPLETE;
        if (clGetEventInfo(wait[i], CL_EVENT_CONTEXT, sizeof ev_ctx, &ev_ctx, NULL) != CL_SUCCESS ||
            clGetEventInfo(wait[i], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof exec, &exec, NULL) !=
                CL_SUCCESS)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "wait[%u] is not a valid cl_event",
                                (unsigned)i);
        if (ev_ctx != ctx->context)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "wait[%u] belongs to another OpenCL context", (unsigned)i);
        /* A command that waits on a failed event would never run (or run on garbage, depending
         * on the driver): refuse before enqueueing anything. An event that fails later, while
         * our commands wait on it, is the driver's business. */
        if (exec < 0) {
            ctx->cl_error = CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST;
            return clattn__fail(ctx, CLATTN_OPENCL_ERROR,
                                "wait[%u] has failed (execution status %d); nothing was enqueued",
                                (unsigned)i, (int)exec);
        }
    }
    return CLATTN_SUCCESS;
}

clattn_status clattn__check_kvlen(clattn_context *ctx, cl_mem kvlen, int64_t batch)
{
    if (!kvlen)
        return CLATTN_SUCCESS;
    size_t size = 0;
    clattn_status st = check_mem(ctx, kvlen, "kv_lengths", &size);
    if (st)
        return st;
    if ((uint64_t)size < (uint64_t)batch * 4u)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "kv_lengths has %zu bytes, needs %lld int32 values (batch)", size,
                            (long long)batch);
    return check_access(ctx, kvlen, "kv_lengths", 0);
}

clattn_status clattn__check_ints(clattn_context *ctx, cl_mem m, const char *name, uint64_t count)
{
    size_t size = 0;
    clattn_status st = check_mem(ctx, m, name, &size);
    if (st)
        return st;
    if (count > (uint64_t)size / 4u)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s has %zu bytes, needs %llu int32 values", name,
                            size, (unsigned long long)count);
    return check_access(ctx, m, name, 0);
}

/* The descriptor's kv slot keeps the size of the reserved int64 it replaced (ABI 0.2), pointers
 * of 4 bytes included. */
_Static_assert(sizeof(((clattn_attention_desc *)0)->kv_slot_) == 8, "the kv slot is 8 bytes");
_Static_assert(sizeof(clattn_attention_desc) - offsetof(clattn_attention_desc, kv_slot_) == 16 * sizeof(int64_t),
               "the descriptor ends with 16 int64 slots");

/* Sequence lengths and counts go into int kernel arguments. */
#define MAX_EXTENT 0x7fffffffLL

static clattn_status check_count(clattn_context *ctx, const char *name, int64_t v, int64_t max)
{
    if (v <= 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->%s must be positive (got %lld)",
                            name, (long long)v);
    if (v > max)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->%s is too large (%lld > %lld)", name,
                            (long long)v, (long long)max);
    return CLATTN_SUCCESS;
}

clattn_status clattn__check_desc(clattn_context *ctx, const clattn_attention_desc *desc,
                                 int check_algorithm)
{
    if (!desc)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc must not be NULL");
    clattn_status st;
    if ((st = check_count(ctx, "batch", desc->batch, MAX_EXTENT)) ||
        (st = check_count(ctx, "heads_q", desc->heads_q, MAX_EXTENT)) ||
        (st = check_count(ctx, "heads_kv", desc->heads_kv, MAX_EXTENT)) ||
        (st = check_count(ctx, "seq_q", desc->seq_q, CLATTN_MAX_SEQ)) ||
        (st = check_count(ctx, "seq_kv", desc->seq_kv, CLATTN_MAX_SEQ)) ||
        (st = check_count(ctx, "head_dim", desc->head_dim, MAX_EXTENT)))
        return st;
    if (desc->heads_q % desc->heads_kv != 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->heads_q (%lld) is not a multiple of desc->heads_kv (%lld)",
                            (long long)desc->heads_q, (long long)desc->heads_kv);
    int64_t dv = desc->head_dim_v ? desc->head_dim_v : desc->head_dim;
    if (desc->head_dim_v < 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->head_dim_v is negative (%lld)",
                            (long long)desc->head_dim_v);
    if (desc->head_dim > CLATTN_MAX_HEAD_DIM || dv > CLATTN_MAX_HEAD_DIM_V)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "desc->head_dim %lld / head_dim_v %lld exceeds the maximum of %d / %d",
                            (long long)desc->head_dim, (long long)dv, CLATTN_MAX_HEAD_DIM,
                            CLATTN_MAX_HEAD_DIM_V);
    if (!isfinite(desc->scale))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->scale is not finite (%g)",
                            (double)desc->scale);
    /* Models with heads this wide scale by another size (DeepSeek's MLA: 1/sqrt(192) with
     * head_dim 576), so no default can be right. */
    if (desc->scale == 0.0f && desc->head_dim > 256)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->scale is 0 with head_dim %lld: above 256 give the model's scale (MLA's "
                            "is 1/sqrt(192) for DeepSeek-V3, not 1/sqrt(%lld))",
                            (long long)desc->head_dim, (long long)desc->head_dim);
    if ((st = clattn__check_reserved(ctx, desc->reserved, sizeof desc->reserved / sizeof desc->reserved[0])))
        return st;
    if (check_algorithm && (desc->algorithm < CLATTN_ALGORITHM_AUTO || desc->algorithm > CLATTN_ALGORITHM_UNFUSED))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->algorithm %d is not a clattn_algorithm",
                            (int)desc->algorithm);
    uint64_t total;
    if (!clattn__mul_ok((uint64_t)desc->batch, (uint64_t)desc->heads_q, &total) ||
        !clattn__mul_ok(total, (uint64_t)desc->seq_q, &total) || total > MAX_EXTENT * 64)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->batch x heads_q x seq_q (%lld x %lld x %lld) exceeds %lld",
                            (long long)desc->batch, (long long)desc->heads_q, (long long)desc->seq_q,
                            (long long)(MAX_EXTENT * 64));
    /* Kernels index (batch, head) pairs and the rows of a kv head's query group with int. */
    if ((uint64_t)desc->batch * (uint64_t)desc->heads_q > (uint64_t)MAX_EXTENT)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->batch x heads_q (%lld x %lld) exceeds %lld", (long long)desc->batch,
                            (long long)desc->heads_q, MAX_EXTENT);
    /* and the rows of a kv head's query group like seq_q, with room for a row tile past the
     * last row (r0 + RM in the kernels). */
    if ((uint64_t)(desc->heads_q / desc->heads_kv) * (uint64_t)desc->seq_q > (uint64_t)CLATTN_MAX_SEQ)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->heads_q / heads_kv x seq_q (%lld x %lld) exceeds %lld",
                            (long long)(desc->heads_q / desc->heads_kv), (long long)desc->seq_q,
                            (long long)CLATTN_MAX_SEQ);

    return CLATTN_SUCCESS;
}

clattn_status clattn__check_attention(clattn_context *ctx, const clattn_attention_desc *desc,
                                      const clattn_tensor *q, const clattn_tensor *k,
                                      const clattn_tensor *v, const clattn_tensor *out,
                                      int need_v, clattn_problem *p)
{
    memset(p, 0, sizeof *p);
    clattn_status st = clattn__check_desc(ctx, desc, need_v);
    if (st)
        return st;
    const int64_t dv = desc->head_dim_v ? desc->head_dim_v : desc->head_dim;
    p->batch = desc->batch;
    p->heads_q = desc->heads_q;
    p->heads_kv = desc->heads_kv;
    p->seq_q = desc->seq_q;
    p->seq_kv = desc->seq_kv;
    p->head_dim = desc->head_dim;
    p->head_dim_v = dv;
    p->scale = desc->scale != 0.0f ? desc->scale : (float)(1.0 / sqrt((double)desc->head_dim));
    p->causal = desc->causal != 0;
    p->kv_lengths = desc->kv_lengths;

    /* Packed query rows (varlen, src/kv.c): q, out and lse are [1][heads_q][total_q][.], total_q
     * the rows q has. */
    const int packed_q = need_v && desc->kv && desc->kv->cu_seqlens_q;
    const int64_t qb = packed_q ? 1 : p->batch, qn = packed_q && q ? q->shape[2] : p->seq_q;
    if (packed_q && (qn < 1 || qn > MAX_EXTENT))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->kv->cu_seqlens_q: q->shape[2] holds the packed rows, 1 .. %lld (got %lld)",
                            (long long)MAX_EXTENT, (long long)qn);
    const int64_t qs[4] = {qb, p->heads_q, qn, p->head_dim};
    const int64_t ks[4] = {p->batch, p->heads_kv, p->seq_kv, p->head_dim};
    const int64_t vs[4] = {p->batch, p->heads_kv, p->seq_kv, dv};
    const int64_t os[4] = {qb, p->heads_q, qn, dv};
    const int64_t ms[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
    const int64_t ls[4] = {qb, p->heads_q, qn, 1};
    if ((st = clattn__check_view(ctx, "q", q, qs, CLATTN_VIEW_INPUT, CLATTN_DTYPES_ALL, &p->q)))
        return st;
    p->dtype = q->dtype;
    unsigned same = CLATTN_DTYPE_BIT(q->dtype);
    /* K and V of the KV-cache types (src/kv.c, attention only) each may have its own type. */
    const int kv_types = need_v && ((k && clattn__kv_type(k->dtype)) || (v && clattn__kv_type(v->dtype)));
    if (!need_v && desc->kv)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "desc->kv: clattn_scores reads K as one plain view (paged or quantized K is "
                            "read by clattn_attention's fused path)");
    if (!need_v && k && clattn__kv_type(k->dtype))
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "k->dtype %s: clattn_scores reads K of the query's type (KV-cache types are "
                            "read by clattn_attention's fused path)", dtype_name(k->dtype));
    if (k && k->buffer && clattn_dtype_size(k->dtype) != 0 && k->dtype != q->dtype && !clattn__kv_type(k->dtype))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "k->dtype (%s) differs from q->dtype (%s)",
                            dtype_name(k->dtype), dtype_name(q->dtype));
    if (need_v && v && v->buffer && clattn_dtype_size(v->dtype) != 0 && v->dtype != q->dtype &&
        !clattn__kv_type(v->dtype))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "v->dtype (%s) differs from q->dtype (%s)",
                            dtype_name(v->dtype), dtype_name(q->dtype));
    if (need_v && (desc->kv || kv_types)) {
        if ((st = clattn__check_kv(ctx, desc, k, v, p)))
            return st;
        if (packed_q)
            p->kv.total_q = (int)qn;
    } else {
        memset(&p->kv, 0, sizeof p->kv);
        if ((st = clattn__check_view(ctx, "k", k, ks, CLATTN_VIEW_INPUT, same, &p->k)) ||
            (need_v && (st = clattn__check_view(ctx, "v", v, vs, CLATTN_VIEW_INPUT, same, &p->v))))
            return st;
    }
    if (need_v) {
        /* out: the query's type, or f32 whatever it is (the parts of a split attention keep f32
         * until they are merged). */
        if (out && out->buffer && clattn_dtype_size(out->dtype) != 0 && out->dtype != q->dtype &&
            out->dtype != CLATTN_F32)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                                "out->dtype (%s) is neither q->dtype (%s) nor f32", dtype_name(out->dtype),
                                dtype_name(q->dtype));
        /* need_v 2 (the backward pass): out is the forward's output, read as an input. */
        if ((st = clattn__check_view(ctx, "out", out, os, need_v == 2 ? CLATTN_VIEW_INPUT : CLATTN_VIEW_OUTPUT,
                                     same | CLATTN_DTYPE_BIT(CLATTN_F32), &p->out)))
            return st;
        const clattn_tensor *ins[5] = {q, k, v, desc->kv ? desc->kv->k_scales : NULL,
                                       desc->kv ? desc->kv->v_scales : NULL};
        const char *const in_names[5] = {"q", "k", "v", "desc->kv->k_scales", "desc->kv->v_scales"};
        const char *hit = need_v == 2 ? NULL : clattn__first_overlap(out, 5, ins, in_names);
        if (hit)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "out overlaps %s (an input)", hit);
        if (p->kv.page && clattn__table_overlaps(&p->kv, out))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "out overlaps desc->kv->block_table");
    }
    if (desc->mask) {
        p->has_mask = 1;
        if ((st = clattn__check_view(ctx, "desc->mask", desc->mask, ms, CLATTN_VIEW_BROADCAST,
                                     CLATTN_DTYPE_BIT(CLATTN_F32) | CLATTN_DTYPE_BIT(CLATTN_F16),
                                     &p->mask)))
            return st;
    }
    if ((st = clattn__check_kvlen(ctx, desc->kv_lengths, p->batch)))
        return st;
    if (need_v == 1 && desc->mask && clattn__views_overlap(out, desc->mask))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "out overlaps desc->mask");
    if (need_v && desc->lse) {
        if ((st = clattn__check_view(ctx, "desc->lse", desc->lse, ls, CLATTN_VIEW_OUTPUT,
                                     CLATTN_DTYPE_BIT(CLATTN_F32), &p->lse)))
            return st;
        const clattn_tensor *ts[7] = {out, q, k, v, desc->mask, desc->kv ? desc->kv->k_scales : NULL,
                                      desc->kv ? desc->kv->v_scales : NULL};
        const char *const names[7] = {"out", "q", "k", "v", "desc->mask", "desc->kv->k_scales",
                                      "desc->kv->v_scales"};
        const char *hit = clattn__first_overlap(desc->lse, 7, ts, names);
        if (hit)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->lse overlaps %s", hit);
        if (p->kv.page && clattn__table_overlaps(&p->kv, desc->lse))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->lse overlaps desc->kv->block_table");
    }
    if (need_v && desc->probabilities) {
        if ((st = clattn__check_view(ctx, "desc->probabilities", desc->probabilities, ms,
                                     CLATTN_VIEW_OUTPUT, CLATTN_DTYPES_ALL, &p->probs)))
            return st;
        const clattn_tensor *ts[6] = {out, q, k, v, desc->lse, desc->mask};
        const char *const names[6] = {"out", "q", "k", "v", "desc->lse", "desc->mask"};
        const char *hit = clattn__first_overlap(desc->probabilities, 6, ts, names);
        if (hit)
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "desc->probabilities overlaps %s", hit);
    }
    /* clattn_scores ignores the sinks (not a key's logit) and the LSE (clattn.h): not checked. */
    clattn_attention_desc vd = *desc;
    if (!need_v)
        vd.sinks = vd.lse = NULL;
    if ((st = clattn__check_variants(ctx, &vd, need_v == 1 ? out : NULL, p)))
        return st;
    if (need_v && (st = clattn__check_dropout(ctx, desc, p)))
        return st;
    /* After the outputs' views are checked: the overlap test reads their shapes and strides. */
    if (need_v && desc->kv_lengths &&
        ((need_v == 1 && clattn__kvlen_overlaps(desc->kv_lengths, p->batch, out)) ||
         (desc->lse && clattn__kvlen_overlaps(desc->kv_lengths, p->batch, desc->lse)) ||
         (desc->probabilities && clattn__kvlen_overlaps(desc->kv_lengths, p->batch, desc->probabilities))))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "desc->kv_lengths overlaps an output (out, lse or probabilities)");
    /* The packed sequences' offsets (batch + 1 int32 each, from byte 0) are read while the
     * outputs are written. */
    if (need_v == 1 && desc->kv) {
        const cl_mem cu[2] = {desc->kv->cu_seqlens_q, desc->kv->cu_seqlens_k};
        const char *const cu_names[2] = {"desc->kv->cu_seqlens_q", "desc->kv->cu_seqlens_k"};
        const clattn_tensor *outs[3] = {out, desc->lse, desc->probabilities};
        const char *const out_names[3] = {"out", "desc->lse", "desc->probabilities"};
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++)
                if (cu[i] && outs[j] && clattn__kvlen_overlaps(cu[i], p->batch + 1, outs[j]))
                    return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s overlaps %s (an input)", out_names[j],
                                        cu_names[i]);
    }
    return CLATTN_SUCCESS;
}
