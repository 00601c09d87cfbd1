/* Context lifetime: device choice, OpenCL context and queue, error accessors. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static clattn_status finish_create(clattn_context *c, clattn_context **out)
{
    if (clattn__read_devinfo(c->platform, c->device, &c->dev) != CLATTN_SUCCESS) {
        clattn__fail(NULL, CLATTN_OPENCL_ERROR, "could not read the properties of device \"%.200s\"",
                     c->dev.name[0] ? c->dev.name : "(name unreadable)");
        clattn_release(c);
        return CLATTN_OPENCL_ERROR;
    }
    const char *refusal = clattn__device_refusal(c->dev.name);
    if (refusal) { /* a queue on it (clattn_create passes over such devices) */
        clattn__fail(NULL, CLATTN_UNSUPPORTED, "device \"%.200s\": %s", c->dev.name, refusal);
        clattn_release(c);
        return CLATTN_UNSUPPORTED;
    }
    const clattn_status st = clattn__matrix_init(c);
    if (st != CLATTN_SUCCESS) {
        clattn__fail(NULL, st, "%s", c->error);
        clattn_release(c);
        return st;
    }
    clattn__cache_init(c);
    clattn__tuning_init(c); /* never fails: problems are described by clattn_tuning_report */
    *out = c;
    return CLATTN_SUCCESS;
}

clattn_status clattn_create(const char *device, clattn_context **ctx)
{
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_create: ctx must not be NULL");
    *ctx = NULL;
    cl_platform_id p;
    cl_device_id d;
    clattn_status st = clattn_select_device(device, &p, &d, NULL, 0);
    if (st != CLATTN_SUCCESS)
        return st;

    clattn_context *c = calloc(1, sizeof *c);
    if (!c)
        return clattn__fail(NULL, CLATTN_OUT_OF_MEMORY, "clattn_create: out of host memory");
    c->platform = p;
    c->device = d;
    cl_int err;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)p, 0};
    c->context = clCreateContext(props, 1, &d, NULL, NULL, &err);
    if (!c->context || err != CL_SUCCESS) {
        free(c);
        return clattn__cl_fail(NULL, err, "clCreateContext"); /* OUT_OF_MEMORY for the memory errors */
    }
    /* Profiling is on so that clattn-bench and clattn-tune can time kernels from events. */
    c->queue = clCreateCommandQueue(c->context, d, CL_QUEUE_PROFILING_ENABLE, &err);
    if (!c->queue || err != CL_SUCCESS) {
        clReleaseContext(c->context);
        free(c);
        return clattn__cl_fail(NULL, err, "clCreateCommandQueue");
    }
    return finish_create(c, ctx);
}

clattn_status clattn_create_from_queue(cl_command_queue queue, clattn_context **ctx)
{
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT,
                            "clattn_create_from_queue: ctx must not be NULL");
    *ctx = NULL;
    if (!queue)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT,
                            "clattn_create_from_queue: queue must not be NULL");
    cl_context context;
    cl_device_id device;
    cl_command_queue_properties props = 0;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof context, &context, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof device, &device, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof props, &props, NULL);
    if (err != CL_SUCCESS)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT,
                            "clattn_create_from_queue: queue is not a valid command queue (%s)",
                            clattn__cl_error_name(err));
    /* The workspace is shared between consecutive calls; only an in-order queue orders them. */
    if (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        return clattn__fail(NULL, CLATTN_UNSUPPORTED,
                            "clattn_create_from_queue: out-of-order queues are not supported");
    cl_platform_id platform;
    if (clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL) != CL_SUCCESS)
        return clattn__fail(NULL, CLATTN_OPENCL_ERROR,
                            "clattn_create_from_queue: cannot read the queue's platform");
    clattn_context *c = calloc(1, sizeof *c);
    if (!c)
        return clattn__fail(NULL, CLATTN_OUT_OF_MEMORY, "clattn_create_from_queue: out of host memory");
    clRetainCommandQueue(queue);
    clRetainContext(context);
    c->queue = queue;
    c->context = context;
    c->device = device;
    c->platform = platform;
    return finish_create(c, ctx);
}

void clattn_release(clattn_context *ctx)
{
    if (!ctx)
        return;
    clattn__release_programs(ctx);
    clattn__tuning_release(ctx);
    if (ctx->workspace)
        clReleaseMemObject(ctx->workspace);
    if (ctx->queue)
        clReleaseCommandQueue(ctx->queue);
    if (ctx->context)
        clReleaseContext(ctx->context);
    free(ctx->build_log);
    free(ctx->error_full);
    free(ctx);
}

const char *clattn_last_error(const clattn_context *ctx)
{
    extern const char *clattn__create_error(void);
    if (!ctx)
        return clattn__create_error();
    if (ctx->build_log && ctx->build_log[0] && ctx->error[0]) {
        /* Built lazily so that the hot path never formats more than the one-line message. */
        clattn_context *c = (clattn_context *)ctx;
        size_t n = strlen(c->error) + strlen(c->build_log) + 2;
        char *full = realloc(c->error_full, n);
        if (full) {
            snprintf(full, n, "%s\n%s", c->error, c->build_log);
            c->error_full = full;
            return full;
        }
    }
    return ctx->error;
}

cl_int clattn_last_cl_error(const clattn_context *ctx) { return ctx ? ctx->cl_error : CL_SUCCESS; }

const char *clattn_last_build_log(const clattn_context *ctx)
{
    return ctx && ctx->build_log ? ctx->build_log : "";
}

cl_command_queue clattn_queue(const clattn_context *ctx) { return ctx ? ctx->queue : NULL; }
cl_context clattn_cl_context(const clattn_context *ctx) { return ctx ? ctx->context : NULL; }
cl_device_id clattn_device(const clattn_context *ctx) { return ctx ? ctx->device : NULL; }

clattn_status clattn_get_program_stats(const clattn_context *ctx, clattn_program_stats *out)
{
    if (!ctx || !out) {
        if (ctx)
            clattn__clear_error((clattn_context *)ctx);
        return clattn__fail((clattn_context *)ctx, CLATTN_INVALID_ARGUMENT, "clattn_get_program_stats: %s is NULL",
                            ctx ? "out" : "ctx");
    }
    clattn__clear_error((clattn_context *)ctx); /* const only because no setting changes */
    memset(out, 0, sizeof *out);
    out->memory_hits = ctx->stats.memory_hits;
    out->disk_hits = ctx->stats.disk_hits;
    out->disk_rejects = ctx->stats.disk_rejects;
    out->disk_untrusted = ctx->stats.disk_untrusted;
    out->disk_writes = ctx->stats.disk_writes;
    out->builds = ctx->stats.builds;
    out->build_seconds = ctx->build_seconds;
    out->build_seconds_max = ctx->build_seconds_max;
    snprintf(out->build_slowest, sizeof out->build_slowest, "%s", ctx->build_slowest);
    return CLATTN_SUCCESS;
}
