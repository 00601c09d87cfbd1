/*
 * The C side of bench_overhead.py: the same clattn_attention call the Python binding makes, timed
 * in C, inside the Python process, on the same context and buffers (so that both sides see the same
 * machine load, caches and library copy, runs interleaved). Built as a shared library; the
 * function pointers come from the libclattn the package loaded, so this file links nothing but
 * libOpenCL.
 */
#define _POSIX_C_SOURCE 199309L
#include <clattn.h>
#include <time.h>

typedef clattn_status (*attention_fn)(clattn_context *, const clattn_attention_desc *, const clattn_tensor *,
                                      const clattn_tensor *, const clattn_tensor *, const clattn_tensor *,
                                      cl_uint, const cl_event *, cl_event *);
typedef cl_command_queue (*queue_fn)(const clattn_context *);

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/*
 * Runs `iters` causal f32 attention calls on q, k, v into out and returns microseconds per call:
 * mode 0 "issue" (the calls back to back, the clock stopped before the clFinish that follows),
 * 1 "enqueue" (the same, the clFinish included), 2 "sync" (clFinish after each call), 3 "held"
 * (as issue, with the queue held behind a user event until the clock stops, so that no kernel runs
 * meanwhile and competes for the cores: the cost of the call alone).
 * The descriptor is built per call, as the binding does. Returns -1 when a call fails.
 */
double bench_attention(attention_fn attention, queue_fn get_queue, clattn_context *ctx, const clattn_tensor *q,
                       const clattn_tensor *k, const clattn_tensor *v, const clattn_tensor *out, int iters,
                       int mode)
{
    cl_command_queue queue = get_queue(ctx);
    cl_event gate = NULL;
    if (mode == 3) {
        cl_int err = CL_SUCCESS;
        cl_context context = NULL;
        clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof context, &context, NULL);
        gate = clCreateUserEvent(context, &err);
        if (err != CL_SUCCESS || clEnqueueBarrierWithWaitList(queue, 1, &gate, NULL) != CL_SUCCESS)
            return -1.0;
    }
    double t0 = now_us(), t1 = t0;
    for (int i = 0; i < iters; i++) {
        const clattn_attention_desc desc = {.batch = q->shape[0], .heads_q = q->shape[1], .heads_kv = k->shape[1],
                                            .seq_q = q->shape[2], .seq_kv = k->shape[2], .head_dim = q->shape[3],
                                            .causal = 1};
        if (attention(ctx, &desc, q, k, v, out, 0, NULL, NULL) != CLATTN_SUCCESS) {
            if (gate) {
                clSetUserEventStatus(gate, CL_COMPLETE);
                clReleaseEvent(gate);
            }
            return -1.0;
        }
        if (mode == 2)
            clFinish(queue);
    }
    t1 = now_us();
    if (gate) {
        clSetUserEventStatus(gate, CL_COMPLETE);
        clReleaseEvent(gate);
    }
    clFinish(queue);
    if (mode == 1)
        t1 = now_us();
    return (t1 - t0) / iters;
}
