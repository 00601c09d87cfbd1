/* Error recording, OpenCL error names, kernel-argument and launch helpers, the workspace. */
#include "internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* clattn_create has no context to hold its message yet: keep it per thread. */
static _Thread_local char create_error[CLATTN_MSG_MAX + 1];

void clattn__set_create_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(create_error, sizeof create_error, fmt, ap);
    va_end(ap);
}

clattn_status clattn__fail(clattn_context *ctx, clattn_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (ctx)
        vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
    else
        vsnprintf(create_error, sizeof create_error, fmt, ap);
    va_end(ap);
    return st;
}

const char *clattn__cl_error_name(cl_int err)
{
    switch (err) {
#define E(x) \
    case x:  \
        return #x;
        E(CL_SUCCESS) E(CL_DEVICE_NOT_FOUND) E(CL_DEVICE_NOT_AVAILABLE) E(CL_COMPILER_NOT_AVAILABLE)
        E(CL_MEM_OBJECT_ALLOCATION_FAILURE) E(CL_OUT_OF_RESOURCES) E(CL_OUT_OF_HOST_MEMORY)
        E(CL_PROFILING_INFO_NOT_AVAILABLE) E(CL_MEM_COPY_OVERLAP) E(CL_BUILD_PROGRAM_FAILURE)
        E(CL_MAP_FAILURE) E(CL_MISALIGNED_SUB_BUFFER_OFFSET)
        E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) E(CL_INVALID_VALUE)
        E(CL_INVALID_DEVICE_TYPE) E(CL_INVALID_PLATFORM) E(CL_INVALID_DEVICE) E(CL_INVALID_CONTEXT)
        E(CL_INVALID_QUEUE_PROPERTIES) E(CL_INVALID_COMMAND_QUEUE) E(CL_INVALID_HOST_PTR)
        E(CL_INVALID_MEM_OBJECT) E(CL_INVALID_BINARY) E(CL_INVALID_BUILD_OPTIONS)
        E(CL_INVALID_PROGRAM) E(CL_INVALID_PROGRAM_EXECUTABLE) E(CL_INVALID_KERNEL_NAME)
        E(CL_INVALID_KERNEL) E(CL_INVALID_ARG_INDEX) E(CL_INVALID_ARG_VALUE) E(CL_INVALID_ARG_SIZE)
        E(CL_INVALID_KERNEL_ARGS) E(CL_INVALID_WORK_DIMENSION) E(CL_INVALID_WORK_GROUP_SIZE)
        E(CL_INVALID_WORK_ITEM_SIZE) E(CL_INVALID_GLOBAL_OFFSET) E(CL_INVALID_EVENT_WAIT_LIST)
        E(CL_INVALID_EVENT) E(CL_INVALID_OPERATION) E(CL_INVALID_BUFFER_SIZE)
        E(CL_INVALID_GLOBAL_WORK_SIZE)
#undef E
    case -1001:
        return "CL_PLATFORM_NOT_FOUND_KHR";
    }
    return "unknown OpenCL error";
}

clattn_status clattn__cl_fail(clattn_context *ctx, cl_int err, const char *what)
{
    clattn_status st = CLATTN_OPENCL_ERROR;
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_HOST_MEMORY ||
        err == CL_OUT_OF_RESOURCES || err == CL_INVALID_BUFFER_SIZE)
        st = CLATTN_OUT_OF_MEMORY;
    if (ctx)
        ctx->cl_error = err;
    return clattn__fail(ctx, st, "%s failed: %s (%d)", what, clattn__cl_error_name(err), (int)err);
}

void clattn__clear_error(clattn_context *ctx)
{
    ctx->error[0] = '\0';
    ctx->cl_error = CL_SUCCESS;
    if (ctx->build_log)
        ctx->build_log[0] = '\0';
}

char *clattn__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* Whether s is word ignoring ASCII case (the words are ASCII; no locale, no strcasecmp, which is
 * POSIX, not C11). */
int clattn__same_word(const char *s, const char *word)
{
    for (; *s && *word; s++, word++) {
        const char c = *s >= 'A' && *s <= 'Z' ? (char)(*s - 'A' + 'a') : *s;
        if (c != *word)
            return 0;
    }
    return *s == *word;
}

/* 0/off/false/no and 1/on/true/yes in any case; unset, empty or anything else keeps dflt, so a
 * typo never turns a feature on or off by accident. */
int clattn__env_flag(const char *name, int dflt)
{
    static const char *const words[4][2] = {{"0", "1"}, {"off", "on"}, {"false", "true"}, {"no", "yes"}};
    const char *v = getenv(name);
    if (!v)
        return dflt;
    for (int i = 0; i < 4; i++)
        for (int on = 0; on < 2; on++)
            if (clattn__same_word(v, words[i][on]))
                return on;
    return dflt;
}

void clattn__arg(clattn_args *a, size_t size, const void *value)
{
    if (a->err == CL_SUCCESS)
        a->err = clSetKernelArg(a->kernel, a->index, size, value);
    a->index++;
}

void clattn__arg_view(clattn_args *a, const clattn_view *v)
{
    static const clattn_view absent = {NULL, CLATTN_F32, 0, {0, 0, 0}};
    if (!v)
        v = &absent;
    clattn__arg(a, sizeof(cl_mem), v->buffer ? &v->buffer : NULL);
    clattn__arg(a, sizeof(cl_ulong), &v->offset);
    for (int i = 0; i < 3; i++)
        clattn__arg(a, sizeof(cl_ulong), &v->stride[i]);
}

void clattn__flatten_grid(size_t global[3])
{
    const uint64_t wgs = clattn__mul_sat((uint64_t)global[0] * global[1], (uint64_t)global[2]);
    if (wgs <= INT_MAX) {
        global[0] = (size_t)wgs;
        global[1] = global[2] = 1;
    }
}

clattn_status clattn__enqueue(clattn_context *ctx, clattn_args *a, cl_uint dims, const size_t *global,
                              const size_t *local, cl_uint num_wait, const cl_event *wait,
                              cl_event *done, const char *what)
{
    char where[160];
    if (a->err != CL_SUCCESS) {
        snprintf(where, sizeof where, "clSetKernelArg(%s, arg %u)", what, a->index - 1);
        return clattn__cl_fail(ctx, a->err, where);
    }
    /* Validation makes every grid dimension positive; a zero here is a size that overflowed on
     * the way, and succeeding without the launch would leave the output unwritten. */
    for (cl_uint i = 0; i < dims; i++)
        if (global[i] == 0)
            return clattn__fail(ctx, CLATTN_UNSUPPORTED, "%s: grid dimension %u is 0 (a size is out of range)",
                                what, (unsigned)i);
    /* Past the driver's grid limit (y and z, max_groups_yz work-groups) a launch fails or, worse,
     * runs part of the grid. It runs instead in chunks of at most the limit, each with a global
     * offset that the kernels add to their work-group index (GROUP_ID, common.cl). local NULL
     * (only where max_wg < 16, never on NVIDIA) leaves the grouping to the driver: no chunks. */
    size_t full[3] = {1, 1, 1}, step[3] = {1, 1, 1}, count = 1;
    for (cl_uint i = 0; i < dims; i++) {
        full[i] = step[i] = global[i];
        if (i > 0 && local && ctx->dev.max_groups_yz && global[i] / local[i] > ctx->dev.max_groups_yz)
            step[i] = ctx->dev.max_groups_yz * local[i];
        count *= clattn__ceil_div(global[i], step[i]);
    }
    if (ctx->rehearse)
        return CLATTN_SUCCESS;
    /* Every chunk waits for the caller's list. The queue is in order (clattn_create_from_queue
     * refuses others), so the last chunk's event is `done`: it completes after all of them. */
    size_t n = 0, off[3] = {0, 0, 0}, size[3];
    cl_int err = CL_SUCCESS;
    for (off[2] = 0; err == CL_SUCCESS && off[2] < full[2]; off[2] += step[2])
        for (off[1] = 0; err == CL_SUCCESS && off[1] < full[1]; off[1] += step[1]) {
            for (int i = 0; i < 3; i++)
                size[i] = full[i] - off[i] < step[i] ? full[i] - off[i] : step[i];
            err = clEnqueueNDRangeKernel(ctx->queue, a->kernel, dims, count > 1 ? off : NULL, size, local,
                                         num_wait, num_wait ? wait : NULL, n + 1 == count ? done : NULL);
            if (err == CL_SUCCESS)
                n++;
        }
    if (err == CL_SUCCESS)
        return CLATTN_SUCCESS;
    if (count > 1)
        snprintf(where, sizeof where, "clEnqueueNDRangeKernel(%s, chunk %zu of %zu)", what, n + 1, count);
    else
        snprintf(where, sizeof where, "clEnqueueNDRangeKernel(%s)", what);
    return clattn__cl_fail(ctx, err, where);
}

clattn_status clattn__workspace(clattn_context *ctx, uint64_t need, cl_mem *out)
{
    if (need == 0)
        need = 4;
    if (ctx->workspace && ctx->workspace_size >= need) {
        *out = ctx->workspace;
        return CLATTN_SUCCESS;
    }
    if (need > ctx->dev.max_alloc || need > SIZE_MAX)
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "workspace of %llu bytes exceeds the device's max allocation of %llu bytes%s",
                            (unsigned long long)need, (unsigned long long)ctx->dev.max_alloc,
                            need > SIZE_MAX ? " or this host's size_t" : "");
    const size_t bytes = (size_t)need;
    /* Grow by at least 1.5x so a slowly growing sequence does not reallocate every call. Releasing
     * the old buffer is safe while kernels still use it: OpenCL frees it after they finish. */
    size_t want = bytes;
    if (ctx->workspace_size && want < ctx->workspace_size + ctx->workspace_size / 2)
        want = ctx->workspace_size + ctx->workspace_size / 2;
    if (want > ctx->dev.max_alloc)
        want = bytes;
    cl_int err;
    cl_mem m = clCreateBuffer(ctx->context, CL_MEM_READ_WRITE, want, NULL, &err);
    if (!m || err != CL_SUCCESS)
        return clattn__cl_fail(ctx, err == CL_SUCCESS ? CL_MEM_OBJECT_ALLOCATION_FAILURE : err,
                               "clCreateBuffer(workspace)");
    if (ctx->workspace)
        clReleaseMemObject(ctx->workspace);
    ctx->workspace = m;
    ctx->workspace_size = want;
    *out = m;
    return CLATTN_SUCCESS;
}

const char *clattn__create_error(void);
const char *clattn__create_error(void) { return create_error; }
