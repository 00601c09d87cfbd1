/* OpenCL interposition for tests; see clshim.h. */
#define _GNU_SOURCE /* RTLD_NEXT */
/* Declares every function wrapped here, the 2.x/3.0 creators included, with the 1.x ones not
 * marked deprecated. */
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include "clshim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* ---- the real functions, found once ---- */

#define CLSHIM_REAL_LIST(X)                                                                        \
    X(clCreateBuffer) X(clCreateBufferWithProperties) X(clCreateSubBuffer) X(clRetainMemObject)    \
    X(clReleaseMemObject) X(clCreateKernel) X(clCreateKernelsInProgram) X(clCloneKernel)          \
    X(clRetainKernel) X(clReleaseKernel) X(clCreateProgramWithSource)                             \
    X(clCreateProgramWithBinary) X(clCreateProgramWithBuiltInKernels) X(clCreateProgramWithIL)    \
    X(clLinkProgram) X(clRetainProgram) X(clReleaseProgram) X(clCreateCommandQueue)               \
    X(clCreateCommandQueueWithProperties) X(clRetainCommandQueue) X(clReleaseCommandQueue)        \
    X(clCreateContext) X(clCreateContextFromType) X(clRetainContext) X(clReleaseContext)          \
    X(clCreateUserEvent) X(clRetainEvent) X(clReleaseEvent) X(clEnqueueNDRangeKernel)             \
    X(clEnqueueTask) X(clEnqueueFillBuffer) X(clEnqueueReadBuffer) X(clEnqueueWriteBuffer)        \
    X(clEnqueueReadBufferRect) X(clEnqueueWriteBufferRect) X(clEnqueueCopyBuffer)                 \
    X(clEnqueueCopyBufferRect) X(clEnqueueMapBuffer) X(clEnqueueUnmapMemObject)                   \
    X(clEnqueueMigrateMemObjects) X(clEnqueueMarkerWithWaitList)                                  \
    X(clEnqueueBarrierWithWaitList) X(clEnqueueMarker) X(clGetKernelWorkGroupInfo)                \
    X(clGetMemObjectInfo) X(clGetDeviceInfo)

enum {
#define CLSHIM_ENUM_(name) R_##name,
    CLSHIM_REAL_LIST(CLSHIM_ENUM_)
#undef CLSHIM_ENUM_
    R_COUNT
};

static const char *const real_names[R_COUNT] = {
#define CLSHIM_NAME_(name) #name,
    CLSHIM_REAL_LIST(CLSHIM_NAME_)
#undef CLSHIM_NAME_
};

static void *real_fn[R_COUNT];
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve_all(void)
{
    /* A function the loader lacks (an old ICD loader without the 2.x creators) stays NULL; its
     * wrapper then reports CL_INVALID_OPERATION, as nothing here needs it. */
    for (int i = 0; i < R_COUNT; ++i)
        real_fn[i] = dlsym(RTLD_NEXT, real_names[i]);
}

static void *real(int i)
{
    pthread_once(&real_once, resolve_all);
    return real_fn[i];
}

/* Calls the real function `name` with the wrapper's own prototype, or returns `missing`. */
#define CALL_REAL(name, missing, ...)                                              \
    do {                                                                           \
        __typeof__(&name) fn_ = (__typeof__(&name))real(R_##name);                 \
        if (fn_ == NULL)                                                           \
            return missing;                                                        \
        return fn_(__VA_ARGS__);                                                   \
    } while (0)

/* ---- counters ---- */

static atomic_long n_created[CLSHIM_KINDS], n_retained[CLSHIM_KINDS], n_released[CLSHIM_KINDS];
static atomic_long n_calls[CLSHIM_FNS], n_injected[CLSHIM_FNS];
static atomic_long fail_index[CLSHIM_FNS] = {-1, -1, -1, -1, -1}; /* absolute call index, -1: none */
static atomic_int fail_error[CLSHIM_FNS];
static _Atomic(cl_event) last_ndrange; /* the event the last successful NDRange launch handed back */

static const char *const kind_names[CLSHIM_KINDS] = {"mem", "kernel", "program", "queue", "context", "event"};
static const char *const fn_names[CLSHIM_FNS] = {"clCreateBuffer", "clEnqueueNDRangeKernel", "clEnqueueFillBuffer",
                                                  "clCreateContext", "clCreateCommandQueue"};

const char *clshim_kind_name(clshim_kind k)
{
    return (unsigned)k < CLSHIM_KINDS ? kind_names[k] : "?";
}

const char *clshim_fn_name(clshim_fn fn)
{
    return (unsigned)fn < CLSHIM_FNS ? fn_names[fn] : "?";
}

int clshim_active(void)
{
    return real(R_clCreateBuffer) != NULL && real(R_clReleaseMemObject) != NULL &&
           real(R_clEnqueueNDRangeKernel) != NULL && real(R_clCreateContext) != NULL;
}

void clshim_get(clshim_counts *c)
{
    for (int k = 0; k < CLSHIM_KINDS; ++k) {
        c->created[k] = atomic_load(&n_created[k]);
        c->retained[k] = atomic_load(&n_retained[k]);
        c->released[k] = atomic_load(&n_released[k]);
    }
}

long clshim_live(const clshim_counts *c, clshim_kind k)
{
    return c->created[k] + c->retained[k] - c->released[k];
}

int clshim_same_live(const clshim_counts *a, const clshim_counts *b, char *why, size_t why_size)
{
    int same = 1;
    size_t used = 0;
    if (why != NULL && why_size > 0)
        why[0] = '\0';
    for (int k = 0; k < CLSHIM_KINDS; ++k) {
        const long la = clshim_live(a, (clshim_kind)k), lb = clshim_live(b, (clshim_kind)k);
        if (la == lb)
            continue;
        same = 0;
        if (why != NULL && used < why_size) {
            const int n = snprintf(why + used, why_size - used, "%s%s %ld -> %ld", used ? ", " : "",
                                   kind_names[k], la, lb);
            used += n > 0 ? (size_t)n : 0;
        }
    }
    return same;
}

long clshim_calls(clshim_fn fn)
{
    return atomic_load(&n_calls[fn]);
}

void clshim_fail_at(clshim_fn fn, long nth, cl_int err)
{
    atomic_store(&fail_error[fn], err);
    atomic_store(&fail_index[fn], nth < 0 ? -1 : atomic_load(&n_calls[fn]) + nth);
}

long clshim_injected(clshim_fn fn)
{
    return atomic_load(&n_injected[fn]);
}

void clshim_disarm(void)
{
    for (int f = 0; f < CLSHIM_FNS; ++f)
        atomic_store(&fail_index[f], -1);
}

/* Counts a call of fn; returns the error to inject, or CL_SUCCESS to go on to the driver. */
static cl_int count_call(clshim_fn fn)
{
    const long i = atomic_fetch_add(&n_calls[fn], 1);
    if (i != atomic_load(&fail_index[fn]))
        return CL_SUCCESS;
    atomic_fetch_add(&n_injected[fn], 1);
    return atomic_load(&fail_error[fn]);
}

static void add(atomic_long *counter, clshim_kind k, long n)
{
    atomic_fetch_add(&counter[k], n);
}

/* Creation through an errcode_ret out-parameter: counted when an object came back. */
#define COUNT_CREATED(kind, obj) \
    do {                         \
        if ((obj) != NULL)       \
            add(n_created, (kind), 1); \
    } while (0)

/* An enqueue that succeeded and handed back an event. */
static cl_int enqueued(cl_int err, cl_event *event)
{
    if (err == CL_SUCCESS && event != NULL && *event != NULL)
        add(n_created, CLSHIM_EVENT, 1);
    return err;
}

static cl_int released(cl_int err, clshim_kind k)
{
    if (err == CL_SUCCESS)
        add(n_released, k, 1);
    return err;
}

static cl_int retained(cl_int err, clshim_kind k)
{
    if (err == CL_SUCCESS)
        add(n_retained, k, 1);
    return err;
}

static void set_err(cl_int *errcode_ret, cl_int err)
{
    if (errcode_ret != NULL)
        *errcode_ret = err;
}

/* ---- memory objects ---- */

static cl_mem real_create_buffer(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr,
                                 cl_int *errcode_ret)
{
    CALL_REAL(clCreateBuffer, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), context, flags, size,
              host_ptr, errcode_ret);
}

cl_mem clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr,
                      cl_int *errcode_ret)
{
    const cl_int inject = count_call(CLSHIM_CREATE_BUFFER);
    if (inject != CL_SUCCESS) {
        set_err(errcode_ret, inject);
        return NULL;
    }
    cl_mem m = real_create_buffer(context, flags, size, host_ptr, errcode_ret);
    COUNT_CREATED(CLSHIM_MEM, m);
    return m;
}

static cl_mem real_create_buffer_props(cl_context context, const cl_mem_properties *properties,
                                       cl_mem_flags flags, size_t size, void *host_ptr, cl_int *errcode_ret)
{
    CALL_REAL(clCreateBufferWithProperties, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), context,
              properties, flags, size, host_ptr, errcode_ret);
}

cl_mem clCreateBufferWithProperties(cl_context context, const cl_mem_properties *properties,
                                    cl_mem_flags flags, size_t size, void *host_ptr, cl_int *errcode_ret)
{
    cl_mem m = real_create_buffer_props(context, properties, flags, size, host_ptr, errcode_ret);
    COUNT_CREATED(CLSHIM_MEM, m);
    return m;
}

static cl_mem real_create_sub_buffer(cl_mem buffer, cl_mem_flags flags, cl_buffer_create_type type,
                                     const void *info, cl_int *errcode_ret)
{
    CALL_REAL(clCreateSubBuffer, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), buffer, flags, type,
              info, errcode_ret);
}

cl_mem clCreateSubBuffer(cl_mem buffer, cl_mem_flags flags, cl_buffer_create_type type, const void *info,
                         cl_int *errcode_ret)
{
    cl_mem m = real_create_sub_buffer(buffer, flags, type, info, errcode_ret);
    COUNT_CREATED(CLSHIM_MEM, m);
    return m;
}

static cl_int real_retain_mem(cl_mem m)
{
    CALL_REAL(clRetainMemObject, CL_INVALID_OPERATION, m);
}

cl_int clRetainMemObject(cl_mem memobj)
{
    return retained(real_retain_mem(memobj), CLSHIM_MEM);
}

static cl_int real_release_mem(cl_mem m)
{
    CALL_REAL(clReleaseMemObject, CL_INVALID_OPERATION, m);
}

cl_int clReleaseMemObject(cl_mem memobj)
{
    return released(real_release_mem(memobj), CLSHIM_MEM);
}

/* ---- kernels ---- */

static cl_kernel real_create_kernel(cl_program program, const char *name, cl_int *errcode_ret)
{
    CALL_REAL(clCreateKernel, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), program, name,
              errcode_ret);
}

cl_kernel clCreateKernel(cl_program program, const char *kernel_name, cl_int *errcode_ret)
{
    cl_kernel k = real_create_kernel(program, kernel_name, errcode_ret);
    COUNT_CREATED(CLSHIM_KERNEL, k);
    return k;
}

static cl_int real_create_kernels(cl_program program, cl_uint num, cl_kernel *kernels, cl_uint *num_ret)
{
    CALL_REAL(clCreateKernelsInProgram, CL_INVALID_OPERATION, program, num, kernels, num_ret);
}

cl_int clCreateKernelsInProgram(cl_program program, cl_uint num_kernels, cl_kernel *kernels,
                                cl_uint *num_kernels_ret)
{
    cl_uint n = 0;
    const cl_int err = real_create_kernels(program, num_kernels, kernels, &n);
    if (num_kernels_ret != NULL)
        *num_kernels_ret = n;
    if (err == CL_SUCCESS && kernels != NULL)
        add(n_created, CLSHIM_KERNEL, (long)n);
    return err;
}

static cl_kernel real_clone_kernel(cl_kernel source, cl_int *errcode_ret)
{
    CALL_REAL(clCloneKernel, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), source, errcode_ret);
}

cl_kernel clCloneKernel(cl_kernel source_kernel, cl_int *errcode_ret)
{
    cl_kernel k = real_clone_kernel(source_kernel, errcode_ret);
    COUNT_CREATED(CLSHIM_KERNEL, k);
    return k;
}

static cl_int real_retain_kernel(cl_kernel k)
{
    CALL_REAL(clRetainKernel, CL_INVALID_OPERATION, k);
}

cl_int clRetainKernel(cl_kernel kernel)
{
    return retained(real_retain_kernel(kernel), CLSHIM_KERNEL);
}

static cl_int real_release_kernel(cl_kernel k)
{
    CALL_REAL(clReleaseKernel, CL_INVALID_OPERATION, k);
}

cl_int clReleaseKernel(cl_kernel kernel)
{
    return released(real_release_kernel(kernel), CLSHIM_KERNEL);
}

/* ---- programs ---- */

static cl_program real_program_source(cl_context context, cl_uint count, const char **strings,
                                      const size_t *lengths, cl_int *errcode_ret)
{
    CALL_REAL(clCreateProgramWithSource, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), context,
              count, strings, lengths, errcode_ret);
}

cl_program clCreateProgramWithSource(cl_context context, cl_uint count, const char **strings,
                                     const size_t *lengths, cl_int *errcode_ret)
{
    cl_program p = real_program_source(context, count, strings, lengths, errcode_ret);
    COUNT_CREATED(CLSHIM_PROGRAM, p);
    return p;
}

static cl_program real_program_binary(cl_context context, cl_uint num_devices, const cl_device_id *devices,
                                      const size_t *lengths, const unsigned char **binaries,
                                      cl_int *binary_status, cl_int *errcode_ret)
{
    CALL_REAL(clCreateProgramWithBinary, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), context,
              num_devices, devices, lengths, binaries, binary_status, errcode_ret);
}

cl_program clCreateProgramWithBinary(cl_context context, cl_uint num_devices, const cl_device_id *device_list,
                                     const size_t *lengths, const unsigned char **binaries,
                                     cl_int *binary_status, cl_int *errcode_ret)
{
    cl_program p =
        real_program_binary(context, num_devices, device_list, lengths, binaries, binary_status, errcode_ret);
    COUNT_CREATED(CLSHIM_PROGRAM, p);
    return p;
}

static cl_program real_program_builtin(cl_context context, cl_uint num_devices, const cl_device_id *devices,
                                       const char *names, cl_int *errcode_ret)
{
    CALL_REAL(clCreateProgramWithBuiltInKernels, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL),
              context, num_devices, devices, names, errcode_ret);
}

cl_program clCreateProgramWithBuiltInKernels(cl_context context, cl_uint num_devices,
                                             const cl_device_id *device_list, const char *kernel_names,
                                             cl_int *errcode_ret)
{
    cl_program p = real_program_builtin(context, num_devices, device_list, kernel_names, errcode_ret);
    COUNT_CREATED(CLSHIM_PROGRAM, p);
    return p;
}

static cl_program real_program_il(cl_context context, const void *il, size_t length, cl_int *errcode_ret)
{
    CALL_REAL(clCreateProgramWithIL, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), context, il, length,
              errcode_ret);
}

cl_program clCreateProgramWithIL(cl_context context, const void *il, size_t length, cl_int *errcode_ret)
{
    cl_program p = real_program_il(context, il, length, errcode_ret);
    COUNT_CREATED(CLSHIM_PROGRAM, p);
    return p;
}

static cl_program real_link_program(cl_context context, cl_uint num_devices, const cl_device_id *devices,
                                    const char *options, cl_uint num_inputs, const cl_program *inputs,
                                    void(CL_CALLBACK *notify)(cl_program, void *), void *user_data,
                                    cl_int *errcode_ret)
{
    CALL_REAL(clLinkProgram, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), context, num_devices,
              devices, options, num_inputs, inputs, notify, user_data, errcode_ret);
}

cl_program clLinkProgram(cl_context context, cl_uint num_devices, const cl_device_id *device_list,
                         const char *options, cl_uint num_input_programs, const cl_program *input_programs,
                         void(CL_CALLBACK *pfn_notify)(cl_program program, void *user_data), void *user_data,
                         cl_int *errcode_ret)
{
    cl_program p = real_link_program(context, num_devices, device_list, options, num_input_programs,
                                     input_programs, pfn_notify, user_data, errcode_ret);
    COUNT_CREATED(CLSHIM_PROGRAM, p);
    return p;
}

static cl_int real_retain_program(cl_program p)
{
    CALL_REAL(clRetainProgram, CL_INVALID_OPERATION, p);
}

cl_int clRetainProgram(cl_program program)
{
    return retained(real_retain_program(program), CLSHIM_PROGRAM);
}

static cl_int real_release_program(cl_program p)
{
    CALL_REAL(clReleaseProgram, CL_INVALID_OPERATION, p);
}

cl_int clReleaseProgram(cl_program program)
{
    return released(real_release_program(program), CLSHIM_PROGRAM);
}

/* ---- command queues ---- */

static cl_command_queue real_create_queue(cl_context context, cl_device_id device,
                                          cl_command_queue_properties properties, cl_int *errcode_ret)
{
    CALL_REAL(clCreateCommandQueue, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), context, device,
              properties, errcode_ret);
}

cl_command_queue clCreateCommandQueue(cl_context context, cl_device_id device,
                                      cl_command_queue_properties properties, cl_int *errcode_ret)
{
    const cl_int inject = count_call(CLSHIM_CREATE_QUEUE);
    if (inject != CL_SUCCESS) {
        set_err(errcode_ret, inject);
        return NULL;
    }
    cl_command_queue q = real_create_queue(context, device, properties, errcode_ret);
    COUNT_CREATED(CLSHIM_QUEUE, q);
    return q;
}

static cl_command_queue real_create_queue_props(cl_context context, cl_device_id device,
                                                const cl_queue_properties *properties, cl_int *errcode_ret)
{
    CALL_REAL(clCreateCommandQueueWithProperties, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL),
              context, device, properties, errcode_ret);
}

cl_command_queue clCreateCommandQueueWithProperties(cl_context context, cl_device_id device,
                                                    const cl_queue_properties *properties, cl_int *errcode_ret)
{
    cl_command_queue q = real_create_queue_props(context, device, properties, errcode_ret);
    COUNT_CREATED(CLSHIM_QUEUE, q);
    return q;
}

static cl_int real_retain_queue(cl_command_queue q)
{
    CALL_REAL(clRetainCommandQueue, CL_INVALID_OPERATION, q);
}

cl_int clRetainCommandQueue(cl_command_queue command_queue)
{
    return retained(real_retain_queue(command_queue), CLSHIM_QUEUE);
}

static cl_int real_release_queue(cl_command_queue q)
{
    CALL_REAL(clReleaseCommandQueue, CL_INVALID_OPERATION, q);
}

cl_int clReleaseCommandQueue(cl_command_queue command_queue)
{
    return released(real_release_queue(command_queue), CLSHIM_QUEUE);
}

/* ---- contexts ---- */

typedef void(CL_CALLBACK *clshim_ctx_notify)(const char *, const void *, size_t, void *);

static cl_context real_create_context(const cl_context_properties *properties, cl_uint num_devices,
                                      const cl_device_id *devices, clshim_ctx_notify notify, void *user_data,
                                      cl_int *errcode_ret)
{
    CALL_REAL(clCreateContext, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), properties, num_devices,
              devices, notify, user_data, errcode_ret);
}

cl_context clCreateContext(const cl_context_properties *properties, cl_uint num_devices,
                           const cl_device_id *devices,
                           void(CL_CALLBACK *pfn_notify)(const char *errinfo, const void *private_info,
                                                         size_t cb, void *user_data),
                           void *user_data, cl_int *errcode_ret)
{
    const cl_int inject = count_call(CLSHIM_CREATE_CONTEXT);
    if (inject != CL_SUCCESS) {
        set_err(errcode_ret, inject);
        return NULL;
    }
    cl_context c = real_create_context(properties, num_devices, devices, pfn_notify, user_data, errcode_ret);
    COUNT_CREATED(CLSHIM_CONTEXT, c);
    return c;
}

static cl_context real_create_context_type(const cl_context_properties *properties, cl_device_type type,
                                           clshim_ctx_notify notify, void *user_data, cl_int *errcode_ret)
{
    CALL_REAL(clCreateContextFromType, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), properties, type,
              notify, user_data, errcode_ret);
}

cl_context clCreateContextFromType(const cl_context_properties *properties, cl_device_type device_type,
                                   void(CL_CALLBACK *pfn_notify)(const char *errinfo, const void *private_info,
                                                                 size_t cb, void *user_data),
                                   void *user_data, cl_int *errcode_ret)
{
    cl_context c = real_create_context_type(properties, device_type, pfn_notify, user_data, errcode_ret);
    COUNT_CREATED(CLSHIM_CONTEXT, c);
    return c;
}

static cl_int real_retain_context(cl_context c)
{
    CALL_REAL(clRetainContext, CL_INVALID_OPERATION, c);
}

cl_int clRetainContext(cl_context context)
{
    return retained(real_retain_context(context), CLSHIM_CONTEXT);
}

static cl_int real_release_context(cl_context c)
{
    CALL_REAL(clReleaseContext, CL_INVALID_OPERATION, c);
}

cl_int clReleaseContext(cl_context context)
{
    return released(real_release_context(context), CLSHIM_CONTEXT);
}

/* ---- events ---- */

static cl_event real_create_user_event(cl_context context, cl_int *errcode_ret)
{
    CALL_REAL(clCreateUserEvent, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), context, errcode_ret);
}

cl_event clCreateUserEvent(cl_context context, cl_int *errcode_ret)
{
    cl_event e = real_create_user_event(context, errcode_ret);
    COUNT_CREATED(CLSHIM_EVENT, e);
    return e;
}

static cl_int real_retain_event(cl_event e)
{
    CALL_REAL(clRetainEvent, CL_INVALID_OPERATION, e);
}

cl_int clRetainEvent(cl_event event)
{
    return retained(real_retain_event(event), CLSHIM_EVENT);
}

static cl_int real_release_event(cl_event e)
{
    CALL_REAL(clReleaseEvent, CL_INVALID_OPERATION, e);
}

cl_int clReleaseEvent(cl_event event)
{
    return released(real_release_event(event), CLSHIM_EVENT);
}

/* ---- enqueues that hand back events ---- */

static cl_int real_ndrange(cl_command_queue q, cl_kernel k, cl_uint dim, const size_t *offset,
                           const size_t *global, const size_t *local, cl_uint nw, const cl_event *wait,
                           cl_event *event)
{
    CALL_REAL(clEnqueueNDRangeKernel, CL_INVALID_OPERATION, q, k, dim, offset, global, local, nw, wait, event);
}

/* ---- a work-group limit for kernels with a reqd_work_group_size ---- */

static atomic_size_t wg_limit;
/* What launched since the last clshim_limit_kernel_wg (launch_lock). */
static pthread_mutex_t launch_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t largest_group;
static char largest_kernel[64];
static cl_ulong largest_local;
static char largest_local_name[64];
static char launched_names[32][64];
static int n_launched_names;
static size_t largest_yz; /* since the last clshim_reset_grid_yz */
static char largest_yz_name[64];

void clshim_limit_kernel_wg(size_t n)
{
    atomic_store(&wg_limit, n);
    pthread_mutex_lock(&launch_lock);
    largest_group = 0;
    largest_kernel[0] = '\0';
    n_launched_names = 0;
    pthread_mutex_unlock(&launch_lock);
}

size_t clshim_largest_group(void)
{
    pthread_mutex_lock(&launch_lock);
    const size_t n = largest_group;
    pthread_mutex_unlock(&launch_lock);
    return n;
}

const char *clshim_largest_group_kernel(void) { return largest_kernel; }

void clshim_reset_grid_yz(void)
{
    pthread_mutex_lock(&launch_lock);
    largest_yz = 0;
    largest_yz_name[0] = '\0';
    pthread_mutex_unlock(&launch_lock);
}

size_t clshim_largest_grid_yz(void)
{
    pthread_mutex_lock(&launch_lock);
    const size_t n = largest_yz;
    pthread_mutex_unlock(&launch_lock);
    return n;
}

const char *clshim_largest_grid_yz_kernel(void) { return largest_yz_name; }

/* ---- compilers that add local memory ---- */

static _Atomic cl_ulong local_device, local_mul, local_add;

void clshim_inflate_kernel_local(cl_ulong device_bytes, cl_ulong mul, cl_ulong add)
{
    atomic_store(&local_device, device_bytes);
    atomic_store(&local_add, add);
    atomic_store(&local_mul, mul);
    pthread_mutex_lock(&launch_lock);
    largest_local = 0;
    largest_local_name[0] = '\0';
    pthread_mutex_unlock(&launch_lock);
}

cl_ulong clshim_largest_local(void)
{
    pthread_mutex_lock(&launch_lock);
    const cl_ulong n = largest_local;
    pthread_mutex_unlock(&launch_lock);
    return n;
}

const char *clshim_largest_local_kernel(void) { return largest_local_name; }

int clshim_launched(const char *kernel_name)
{
    int found = 0;
    pthread_mutex_lock(&launch_lock);
    for (int i = 0; i < n_launched_names && !found; i++)
        found = strcmp(launched_names[i], kernel_name) == 0;
    pthread_mutex_unlock(&launch_lock);
    return found;
}

/* Notes a successful launch of kernel with `items` work-items a group (0: no reqd size), `yz`
 * work-groups in its grid's y or z extent, whichever is larger (0: no local size given). */
static void note_launch(cl_kernel kernel, size_t items, cl_ulong local, size_t yz)
{
    char name[64] = "";
    if (clGetKernelInfo(kernel, CL_KERNEL_FUNCTION_NAME, sizeof name, name, NULL) != CL_SUCCESS)
        name[0] = '\0';
    name[sizeof name - 1] = '\0';
    pthread_mutex_lock(&launch_lock);
    if (yz > largest_yz) {
        largest_yz = yz;
        memcpy(largest_yz_name, name, sizeof name);
    }
    if (items > largest_group) {
        largest_group = items;
        memcpy(largest_kernel, name, sizeof name);
    }
    if (local > largest_local) {
        largest_local = local;
        memcpy(largest_local_name, name, sizeof name);
    }
    int seen = 0;
    for (int i = 0; i < n_launched_names && !seen; i++)
        seen = strcmp(launched_names[i], name) == 0;
    if (!seen && n_launched_names < 32)
        memcpy(launched_names[n_launched_names++], name, sizeof name);
    pthread_mutex_unlock(&launch_lock);
}

static cl_int real_kernel_wg_info(cl_kernel k, cl_device_id d, cl_kernel_work_group_info param, size_t size,
                                  void *value, size_t *size_ret)
{
    CALL_REAL(clGetKernelWorkGroupInfo, CL_INVALID_OPERATION, k, d, param, size, value, size_ret);
}

/* Work-items of the kernel's reqd_work_group_size on device d; 0 when it has none. */
static size_t reqd_items(cl_kernel k, cl_device_id d)
{
    size_t req[3] = {0, 0, 0};
    if (real_kernel_wg_info(k, d, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, sizeof req, req, NULL) != CL_SUCCESS)
        return 0;
    return req[0] * req[1] * req[2];
}

cl_int clGetKernelWorkGroupInfo(cl_kernel kernel, cl_device_id device, cl_kernel_work_group_info param_name,
                                size_t param_value_size, void *param_value, size_t *param_value_size_ret)
{
    const cl_int err =
        real_kernel_wg_info(kernel, device, param_name, param_value_size, param_value, param_value_size_ret);
    const size_t limit = atomic_load(&wg_limit);
    if (err == CL_SUCCESS && param_name == CL_KERNEL_WORK_GROUP_SIZE && param_value && limit > 0 &&
        reqd_items(kernel, device) > 0 && *(size_t *)param_value > limit)
        *(size_t *)param_value = limit;
    const cl_ulong mul = atomic_load(&local_mul);
    if (err == CL_SUCCESS && param_name == CL_KERNEL_LOCAL_MEM_SIZE && param_value && mul > 0 &&
        *(cl_ulong *)param_value > 0)
        *(cl_ulong *)param_value = mul * *(cl_ulong *)param_value + atomic_load(&local_add);
    return err;
}

/* ---- a device reported under another name or driver version ---- */

static _Atomic(const char *) fake_name, fake_driver;

void clshim_fake_device_name(const char *name) { atomic_store(&fake_name, name); }
void clshim_fake_driver_version(const char *version) { atomic_store(&fake_driver, version); }

cl_int clGetDeviceInfo(cl_device_id device, cl_device_info param_name, size_t param_value_size, void *param_value,
                       size_t *param_value_size_ret)
{
    __typeof__(&clGetDeviceInfo) fn = (__typeof__(&clGetDeviceInfo))real(R_clGetDeviceInfo);
    if (fn == NULL)
        return CL_INVALID_OPERATION;
    const char *name = param_name == CL_DEVICE_NAME     ? atomic_load(&fake_name)
                       : param_name == CL_DRIVER_VERSION ? atomic_load(&fake_driver)
                                                         : NULL;
    if (name == NULL)
        return fn(device, param_name, param_value_size, param_value, param_value_size_ret);
    size_t real_size = 0; /* the driver still checks the device */
    const cl_int err = fn(device, param_name, 0, NULL, &real_size);
    if (err != CL_SUCCESS)
        return err;
    const size_t n = strlen(name) + 1;
    if (param_value && param_value_size < n)
        return CL_INVALID_VALUE;
    if (param_value)
        memcpy(param_value, name, n);
    if (param_value_size_ret)
        *param_value_size_ret = n;
    return CL_SUCCESS;
}

/* ---- a buffer reported larger than it is ---- */

static _Atomic(cl_mem) fake_mem;
static atomic_size_t fake_size;

void clshim_fake_mem_size(cl_mem m, size_t size)
{
    atomic_store(&fake_size, size);
    atomic_store(&fake_mem, m);
}

cl_int clGetMemObjectInfo(cl_mem memobj, cl_mem_info param_name, size_t param_value_size, void *param_value,
                          size_t *param_value_size_ret)
{
    __typeof__(&clGetMemObjectInfo) fn = (__typeof__(&clGetMemObjectInfo))real(R_clGetMemObjectInfo);
    if (fn == NULL)
        return CL_INVALID_OPERATION;
    const cl_int err = fn(memobj, param_name, param_value_size, param_value, param_value_size_ret);
    if (err == CL_SUCCESS && param_name == CL_MEM_SIZE && param_value && memobj != NULL &&
        memobj == atomic_load(&fake_mem))
        *(size_t *)param_value = atomic_load(&fake_size);
    return err;
}

cl_int clEnqueueNDRangeKernel(cl_command_queue command_queue, cl_kernel kernel, cl_uint work_dim,
                              const size_t *global_work_offset, const size_t *global_work_size,
                              const size_t *local_work_size, cl_uint num_events_in_wait_list,
                              const cl_event *event_wait_list, cl_event *event)
{
    const cl_int inject = count_call(CLSHIM_ENQUEUE_NDRANGE);
    if (inject != CL_SUCCESS)
        return inject;
    cl_device_id device = NULL;
    size_t items = 0;
    if (clGetCommandQueueInfo(command_queue, CL_QUEUE_DEVICE, sizeof device, &device, NULL) == CL_SUCCESS)
        items = reqd_items(kernel, device);
    const size_t limit = atomic_load(&wg_limit);
    if (limit > 0 && items > limit)
        return CL_INVALID_WORK_GROUP_SIZE;
    cl_ulong local = 0;
    if (device && real_kernel_wg_info(kernel, device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof local, &local, NULL) !=
                      CL_SUCCESS)
        local = 0;
    const cl_ulong mul = atomic_load(&local_mul);
    if (mul > 0 && local > 0 && mul * local + atomic_load(&local_add) > atomic_load(&local_device))
        return CL_OUT_OF_RESOURCES;
    const cl_int err = real_ndrange(command_queue, kernel, work_dim, global_work_offset, global_work_size,
                                    local_work_size, num_events_in_wait_list, event_wait_list, event);
    if (err == CL_SUCCESS) {
        atomic_store(&last_ndrange, event ? *event : NULL);
        size_t yz = 0;
        for (cl_uint d = 1; d < work_dim && local_work_size && global_work_size; d++)
            if (local_work_size[d] > 0 && global_work_size[d] / local_work_size[d] > yz)
                yz = global_work_size[d] / local_work_size[d];
        note_launch(kernel, items, local, yz);
    }
    return enqueued(err, event);
}

cl_event clshim_last_ndrange_event(void) { return atomic_load(&last_ndrange); }

static cl_int real_task(cl_command_queue q, cl_kernel k, cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueTask, CL_INVALID_OPERATION, q, k, nw, wait, event);
}

cl_int clEnqueueTask(cl_command_queue command_queue, cl_kernel kernel, cl_uint num_events_in_wait_list,
                     const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_task(command_queue, kernel, num_events_in_wait_list, event_wait_list, event), event);
}

static cl_int real_fill(cl_command_queue q, cl_mem buffer, const void *pattern, size_t pattern_size,
                        size_t offset, size_t size, cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueFillBuffer, CL_INVALID_OPERATION, q, buffer, pattern, pattern_size, offset, size, nw,
              wait, event);
}

cl_int clEnqueueFillBuffer(cl_command_queue command_queue, cl_mem buffer, const void *pattern,
                           size_t pattern_size, size_t offset, size_t size, cl_uint num_events_in_wait_list,
                           const cl_event *event_wait_list, cl_event *event)
{
    const cl_int inject = count_call(CLSHIM_ENQUEUE_FILL);
    if (inject != CL_SUCCESS)
        return inject;
    return enqueued(real_fill(command_queue, buffer, pattern, pattern_size, offset, size,
                              num_events_in_wait_list, event_wait_list, event),
                    event);
}

static cl_int real_read(cl_command_queue q, cl_mem buffer, cl_bool blocking, size_t offset, size_t size,
                        void *ptr, cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueReadBuffer, CL_INVALID_OPERATION, q, buffer, blocking, offset, size, ptr, nw, wait,
              event);
}

cl_int clEnqueueReadBuffer(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_read, size_t offset,
                           size_t size, void *ptr, cl_uint num_events_in_wait_list,
                           const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_read(command_queue, buffer, blocking_read, offset, size, ptr, num_events_in_wait_list,
                              event_wait_list, event),
                    event);
}

static cl_int real_write(cl_command_queue q, cl_mem buffer, cl_bool blocking, size_t offset, size_t size,
                         const void *ptr, cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueWriteBuffer, CL_INVALID_OPERATION, q, buffer, blocking, offset, size, ptr, nw, wait,
              event);
}

cl_int clEnqueueWriteBuffer(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_write,
                            size_t offset, size_t size, const void *ptr, cl_uint num_events_in_wait_list,
                            const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_write(command_queue, buffer, blocking_write, offset, size, ptr,
                               num_events_in_wait_list, event_wait_list, event),
                    event);
}

static cl_int real_read_rect(cl_command_queue q, cl_mem buffer, cl_bool blocking, const size_t *buffer_origin,
                             const size_t *host_origin, const size_t *region, size_t buffer_row_pitch,
                             size_t buffer_slice_pitch, size_t host_row_pitch, size_t host_slice_pitch,
                             void *ptr, cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueReadBufferRect, CL_INVALID_OPERATION, q, buffer, blocking, buffer_origin, host_origin,
              region, buffer_row_pitch, buffer_slice_pitch, host_row_pitch, host_slice_pitch, ptr, nw, wait,
              event);
}

cl_int clEnqueueReadBufferRect(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_read,
                               const size_t *buffer_origin, const size_t *host_origin, const size_t *region,
                               size_t buffer_row_pitch, size_t buffer_slice_pitch, size_t host_row_pitch,
                               size_t host_slice_pitch, void *ptr, cl_uint num_events_in_wait_list,
                               const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_read_rect(command_queue, buffer, blocking_read, buffer_origin, host_origin, region,
                                   buffer_row_pitch, buffer_slice_pitch, host_row_pitch, host_slice_pitch, ptr,
                                   num_events_in_wait_list, event_wait_list, event),
                    event);
}

static cl_int real_write_rect(cl_command_queue q, cl_mem buffer, cl_bool blocking, const size_t *buffer_origin,
                              const size_t *host_origin, const size_t *region, size_t buffer_row_pitch,
                              size_t buffer_slice_pitch, size_t host_row_pitch, size_t host_slice_pitch,
                              const void *ptr, cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueWriteBufferRect, CL_INVALID_OPERATION, q, buffer, blocking, buffer_origin, host_origin,
              region, buffer_row_pitch, buffer_slice_pitch, host_row_pitch, host_slice_pitch, ptr, nw, wait,
              event);
}

cl_int clEnqueueWriteBufferRect(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_write,
                                const size_t *buffer_origin, const size_t *host_origin, const size_t *region,
                                size_t buffer_row_pitch, size_t buffer_slice_pitch, size_t host_row_pitch,
                                size_t host_slice_pitch, const void *ptr, cl_uint num_events_in_wait_list,
                                const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_write_rect(command_queue, buffer, blocking_write, buffer_origin, host_origin, region,
                                    buffer_row_pitch, buffer_slice_pitch, host_row_pitch, host_slice_pitch, ptr,
                                    num_events_in_wait_list, event_wait_list, event),
                    event);
}

static cl_int real_copy(cl_command_queue q, cl_mem src, cl_mem dst, size_t src_offset, size_t dst_offset,
                        size_t size, cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueCopyBuffer, CL_INVALID_OPERATION, q, src, dst, src_offset, dst_offset, size, nw, wait,
              event);
}

cl_int clEnqueueCopyBuffer(cl_command_queue command_queue, cl_mem src_buffer, cl_mem dst_buffer,
                           size_t src_offset, size_t dst_offset, size_t size, cl_uint num_events_in_wait_list,
                           const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_copy(command_queue, src_buffer, dst_buffer, src_offset, dst_offset, size,
                              num_events_in_wait_list, event_wait_list, event),
                    event);
}

static cl_int real_copy_rect(cl_command_queue q, cl_mem src, cl_mem dst, const size_t *src_origin,
                             const size_t *dst_origin, const size_t *region, size_t src_row_pitch,
                             size_t src_slice_pitch, size_t dst_row_pitch, size_t dst_slice_pitch, cl_uint nw,
                             const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueCopyBufferRect, CL_INVALID_OPERATION, q, src, dst, src_origin, dst_origin, region,
              src_row_pitch, src_slice_pitch, dst_row_pitch, dst_slice_pitch, nw, wait, event);
}

cl_int clEnqueueCopyBufferRect(cl_command_queue command_queue, cl_mem src_buffer, cl_mem dst_buffer,
                               const size_t *src_origin, const size_t *dst_origin, const size_t *region,
                               size_t src_row_pitch, size_t src_slice_pitch, size_t dst_row_pitch,
                               size_t dst_slice_pitch, cl_uint num_events_in_wait_list,
                               const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_copy_rect(command_queue, src_buffer, dst_buffer, src_origin, dst_origin, region,
                                   src_row_pitch, src_slice_pitch, dst_row_pitch, dst_slice_pitch,
                                   num_events_in_wait_list, event_wait_list, event),
                    event);
}

static void *real_map(cl_command_queue q, cl_mem buffer, cl_bool blocking, cl_map_flags flags, size_t offset,
                      size_t size, cl_uint nw, const cl_event *wait, cl_event *event, cl_int *errcode_ret)
{
    CALL_REAL(clEnqueueMapBuffer, (set_err(errcode_ret, CL_INVALID_OPERATION), NULL), q, buffer, blocking,
              flags, offset, size, nw, wait, event, errcode_ret);
}

void *clEnqueueMapBuffer(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_map,
                         cl_map_flags map_flags, size_t offset, size_t size, cl_uint num_events_in_wait_list,
                         const cl_event *event_wait_list, cl_event *event, cl_int *errcode_ret)
{
    cl_int err = CL_SUCCESS;
    void *p = real_map(command_queue, buffer, blocking_map, map_flags, offset, size, num_events_in_wait_list,
                       event_wait_list, event, &err);
    set_err(errcode_ret, err);
    enqueued(p != NULL ? err : CL_INVALID_VALUE, event);
    return p;
}

static cl_int real_unmap(cl_command_queue q, cl_mem memobj, void *mapped, cl_uint nw, const cl_event *wait,
                         cl_event *event)
{
    CALL_REAL(clEnqueueUnmapMemObject, CL_INVALID_OPERATION, q, memobj, mapped, nw, wait, event);
}

cl_int clEnqueueUnmapMemObject(cl_command_queue command_queue, cl_mem memobj, void *mapped_ptr,
                               cl_uint num_events_in_wait_list, const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_unmap(command_queue, memobj, mapped_ptr, num_events_in_wait_list, event_wait_list, event),
                    event);
}

static cl_int real_migrate(cl_command_queue q, cl_uint num, const cl_mem *objs, cl_mem_migration_flags flags,
                           cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueMigrateMemObjects, CL_INVALID_OPERATION, q, num, objs, flags, nw, wait, event);
}

cl_int clEnqueueMigrateMemObjects(cl_command_queue command_queue, cl_uint num_mem_objects,
                                  const cl_mem *mem_objects, cl_mem_migration_flags flags,
                                  cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                  cl_event *event)
{
    return enqueued(real_migrate(command_queue, num_mem_objects, mem_objects, flags, num_events_in_wait_list,
                                 event_wait_list, event),
                    event);
}

static cl_int real_marker_wl(cl_command_queue q, cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueMarkerWithWaitList, CL_INVALID_OPERATION, q, nw, wait, event);
}

cl_int clEnqueueMarkerWithWaitList(cl_command_queue command_queue, cl_uint num_events_in_wait_list,
                                   const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_marker_wl(command_queue, num_events_in_wait_list, event_wait_list, event), event);
}

static cl_int real_barrier_wl(cl_command_queue q, cl_uint nw, const cl_event *wait, cl_event *event)
{
    CALL_REAL(clEnqueueBarrierWithWaitList, CL_INVALID_OPERATION, q, nw, wait, event);
}

cl_int clEnqueueBarrierWithWaitList(cl_command_queue command_queue, cl_uint num_events_in_wait_list,
                                    const cl_event *event_wait_list, cl_event *event)
{
    return enqueued(real_barrier_wl(command_queue, num_events_in_wait_list, event_wait_list, event), event);
}

static cl_int real_marker(cl_command_queue q, cl_event *event)
{
    CALL_REAL(clEnqueueMarker, CL_INVALID_OPERATION, q, event);
}

cl_int clEnqueueMarker(cl_command_queue command_queue, cl_event *event)
{
    return enqueued(real_marker(command_queue, event), event);
}
