/*
 * OpenCL interposition for tests: counts the OpenCL objects a test executable creates, retains and
 * releases, and makes chosen calls fail on purpose, without changing the library.
 *
 * Tests link the static library, so a test executable that links clshim.c defines clCreateBuffer,
 * clReleaseMemObject, ... itself: the library's calls (and the test's own) bind to these wrappers,
 * which count and forward to the ICD loader's functions found with dlsym(RTLD_NEXT, ...). Nothing
 * else changes: an executable that does not link clshim.c calls OpenCL directly.
 *
 * Counted: memory objects, kernels, programs, command queues, contexts and events (clCreateUserEvent
 * and every event an enqueue function hands back). A kind is balanced when creations + retains ==
 * releases; a leak shows as a live count that grows. Counters are atomic: any thread may call OpenCL.
 *
 * Fault injection: clshim_fail_at(fn, n, err) makes the n-th call (0-based, counted from the arming)
 * of one wrapped function (clshim_fn below) return `err` without reaching the driver; nothing is
 * created and no event is handed back, as from a driver that ran out of memory.
 */
#ifndef CLATTN_TESTS_CLSHIM_H
#define CLATTN_TESTS_CLSHIM_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stddef.h>

typedef enum clshim_kind {
    CLSHIM_MEM,
    CLSHIM_KERNEL,
    CLSHIM_PROGRAM,
    CLSHIM_QUEUE,
    CLSHIM_CONTEXT,
    CLSHIM_EVENT,
    CLSHIM_KINDS
} clshim_kind;

typedef struct clshim_counts {
    long created[CLSHIM_KINDS];  /* successful clCreate* (and events handed back by enqueues) */
    long retained[CLSHIM_KINDS]; /* successful clRetain* */
    long released[CLSHIM_KINDS]; /* successful clRelease* */
} clshim_counts;

/* Functions whose calls are counted and can be made to fail. */
typedef enum clshim_fn {
    CLSHIM_CREATE_BUFFER,   /* clCreateBuffer */
    CLSHIM_ENQUEUE_NDRANGE, /* clEnqueueNDRangeKernel */
    CLSHIM_ENQUEUE_FILL,    /* clEnqueueFillBuffer */
    CLSHIM_CREATE_CONTEXT,  /* clCreateContext */
    CLSHIM_CREATE_QUEUE,    /* clCreateCommandQueue */
    CLSHIM_FNS
} clshim_fn;

/* "mem", "kernel", ... and "clCreateBuffer", ... for messages. */
const char *clshim_kind_name(clshim_kind k);
const char *clshim_fn_name(clshim_fn fn);

/* 1 when the wrappers are the ones the executable calls (they are, once clshim.c is linked) and the
 * real functions were found. Tests assert this first, so a build that lost the interposition fails
 * loudly instead of counting nothing. */
int clshim_active(void);

/* A snapshot of the counters. */
void clshim_get(clshim_counts *c);
/* created + retained - released of one kind in a snapshot. */
long clshim_live(const clshim_counts *c, clshim_kind k);
/* 1 when every kind has the same live count in a and b; otherwise 0, and `why` (may be NULL) names
 * each kind that differs, e.g. "mem 12 -> 13". */
int clshim_same_live(const clshim_counts *a, const clshim_counts *b, char *why, size_t why_size);

/* Calls of fn since the start of the process. */
long clshim_calls(clshim_fn fn);
/* From now on, call number `nth` (0 = the next one) of fn fails with err; disarms any earlier
 * arming of fn. nth < 0 disarms. */
void clshim_fail_at(clshim_fn fn, long nth, cl_int err);
/* Failures injected into fn since the start of the process. */
long clshim_injected(clshim_fn fn);
/* Disarms every function. */
void clshim_disarm(void);

/* The event the last successful clEnqueueNDRangeKernel handed back (NULL if it was asked for
 * none): the event a call's `done` must be when its last command is a kernel launch. Not retained;
 * only for comparison. */
cl_event clshim_last_ndrange_event(void);

/* Kernels compiled with more registers than their work-group allows: from now on, for kernels
 * with a reqd_work_group_size, clGetKernelWorkGroupInfo(CL_KERNEL_WORK_GROUP_SIZE) reports at most
 * n, and clEnqueueNDRangeKernel of such a kernel whose work-group is larger fails with
 * CL_INVALID_WORK_GROUP_SIZE without reaching the driver, as a driver would. 0 lifts the limit.
 * Also resets clshim_largest_group. */
void clshim_limit_kernel_wg(size_t n);
/* The largest work-group (work-items) of a kernel with a reqd_work_group_size that
 * clEnqueueNDRangeKernel launched since the last clshim_limit_kernel_wg, and the name of the first
 * kernel launched with it ("" when none; read it while no other thread launches). */
size_t clshim_largest_group(void);
const char *clshim_largest_group_kernel(void);
/* 1 when a kernel of that name was launched since the last clshim_limit_kernel_wg. */
int clshim_launched(const char *kernel_name);
/* The most work-groups in grid y or z of one clEnqueueNDRangeKernel given a local size (the
 * launches a grid limit applies to, see test_limits) since the last clshim_reset_grid_yz, and
 * the name of the first kernel launched with it ("" when none). */
void clshim_reset_grid_yz(void);
size_t clshim_largest_grid_yz(void);
const char *clshim_largest_grid_yz_kernel(void);

/* Compilers that add local memory to a kernel's arrays (Mesa's rusticl 22.3 reports twice their
 * size, NVIDIA's driver a few bytes more): from now on clGetKernelWorkGroupInfo
 * (CL_KERNEL_LOCAL_MEM_SIZE) reports mul·n + add for a kernel whose arrays take n > 0 bytes, and
 * clEnqueueNDRangeKernel of a kernel whose report exceeds device_bytes fails with
 * CL_OUT_OF_RESOURCES without reaching the driver, as a driver would. mul 0 lifts it. Also resets
 * clshim_largest_local. */
void clshim_inflate_kernel_local(cl_ulong device_bytes, cl_ulong mul, cl_ulong add);
/* The largest local memory (the driver's own account, before inflation) of a kernel that
 * clEnqueueNDRangeKernel launched since the last clshim_inflate_kernel_local, and that kernel's
 * name ("" when none launched with local memory). */
cl_ulong clshim_largest_local(void);
const char *clshim_largest_local_kernel(void);

/* From now on clGetDeviceInfo(CL_DEVICE_NAME) reports `name` for every device (the string must
 * outlive the faking); NULL ends it. */
void clshim_fake_device_name(const char *name);
/* The same for clGetDeviceInfo(CL_DRIVER_VERSION). */
void clshim_fake_driver_version(const char *version);

/* From now on clGetMemObjectInfo(m, CL_MEM_SIZE) reports `size` bytes (the buffer stays as it
 * is): for shapes that need more memory than the machine has, in calls that must refuse them
 * before touching the buffer. NULL ends it. */
void clshim_fake_mem_size(cl_mem m, size_t size);

#endif /* CLATTN_TESTS_CLSHIM_H */
