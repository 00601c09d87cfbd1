/*
 * Bad input to every public entry point: each table row starts from a valid baseline call, applies
 * one mutation, and expects INVALID_ARGUMENT or UNSUPPORTED with a message naming the argument (and,
 * where the message can, the offending value). For every failing row the test also checks the rest
 * of the failure contract in clattn.h:
 *   - `*done` is set to NULL (it starts as a non-NULL garbage handle);
 *   - nothing is enqueued and nothing the caller owns is modified: every buffer the call could see
 *     (the baseline's and any a mutation made, in this and in a second OpenCL context) is filled
 *     with its own byte pattern first and compared after a clFinish, and so are the host arrays of
 *     clattn_attention_host;
 *   - the context still works: the valid baseline call then succeeds and clattn_last_error() is "".
 * A few rows expect SUCCESS (the baselines, in-place softmax, views sharing a buffer without
 * overlapping) so that validation is shown not to refuse what the contract allows.
 *
 * A cl_mem that is not a memory object at all is not tested: passing one is undefined behaviour in
 * OpenCL itself. One context is shared by all rows (PoCL builds are slow, and the follow-up valid
 * call proves a failure left it usable).
 *
 * Table-driven: each row is one cmocka test named "<entry point>/<row>"; main() refuses duplicates.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The baseline problem: grouped-query attention with every optional tensor, small enough for PoCL. */
enum { B = 2, HQ = 4, HKV = 2, SQ = 3, SKV = 5, D = 8, DV = 4 };
#define NQ ((size_t)B * HQ * SQ * D)    /* 192 */
#define NK ((size_t)B * HKV * SKV * D)  /* 160 */
#define NV ((size_t)B * HKV * SKV * DV) /*  80 */
#define NO ((size_t)B * HQ * SQ * DV)   /*  96 */
#define NM ((size_t)B * HQ * SQ * SKV)  /* 120: mask, probabilities, scores, softmax tensors */
#define NL ((size_t)B * HQ * SQ)        /*  24: lse */

#define BIG 0x7fffffffLL /* the largest extent an operation accepts (int kernel arguments) */

/* A handle that is neither NULL nor valid: out-parameters must be overwritten on failure. */
#define GARBAGE_EVENT ((cl_event)(uintptr_t)1)
#define GARBAGE_CTX ((clattn_context *)(uintptr_t)1)

typedef enum entry {
    E_ATTENTION,
    E_SCORES,
    E_SOFTMAX,
    E_MERGE,
    E_HOST,
    E_CREATE,
    E_CREATE_FROM_QUEUE
} entry;

static const char *const entry_names[] = {"attention", "scores", "softmax", "merge",
                                          "attention_host", "create", "create_from_queue"};

/* Buffers every row gets; the order fixes each one's fill byte. */
enum {
    BUF_Q, BUF_K, BUF_V, BUF_OUT, BUF_MASK, BUF_LSE, BUF_PROBS, BUF_SCORES, BUF_KVLEN,
    BUF_SIN, BUF_SOUT, BUF_SMASK, BUF_PO0, BUF_PO1, BUF_PL0, BUF_PL1, BUF_MOUT, BUF_MLSE,
    NBASE
};
static const size_t base_bytes[NBASE] = {
    NQ * 4, NK * 4, NV * 4, NO * 4, NM * 4, NL * 4, NM * 4, NM * 4, B * 4,
    NM * 4, NM * 4, NM * 4, NO * 4, NO * 4, NL * 4, NL * 4, NO * 4, NL * 4};

#define MAX_BUFS 40
/* Fill bytes 0x30 + index: every float they make is finite, so the follow-up valid call computes on
 * ordinary numbers, and kv_lengths reads as a large positive count (clamped to seq_kv). */
#define PATTERN(i) ((unsigned char)(0x30 + (i)))
#define HOST_PATTERN 0x5A

typedef struct tracked {
    cl_mem mem;
    size_t bytes;
    int foreign; /* created in the second OpenCL context */
} tracked;

struct row;

typedef struct fixture {
    const struct row *row;
    clattn_context *ctx;      /* the shared, valid context */
    clattn_context *call_ctx; /* what the call under test receives */
    tracked buf[MAX_BUFS];
    int nbuf;
    cl_context ctx2; /* a second OpenCL context for foreign buffers, made on demand */
    cl_command_queue queue2;
    cl_command_queue ooo_queue;
    cl_event user_event;

    /* clattn_attention / clattn_scores */
    clattn_attention_desc desc;
    const clattn_attention_desc *descp;
    clattn_tensor q, k, v, out, mask, lse, probs, scores;
    const clattn_tensor *qp, *kp, *vp, *outp, *scoresp;

    /* clattn_softmax */
    clattn_softmax_desc sdesc;
    const clattn_softmax_desc *sdescp;
    clattn_tensor sin, sout, smask;
    const clattn_tensor *sinp, *soutp;

    /* clattn_merge */
    int num_parts;
    clattn_tensor part_out[2], part_lse[2], mout, mlse;
    const clattn_tensor *part_outp, *part_lsep, *moutp, *mlsep;

    /* clattn_attention_host */
    clattn_attention_desc hdesc;
    const clattn_attention_desc *hdescp;
    clattn_dtype hdtype;
    float hq[NQ], hk[NK], hv[NV], hout[NO], hlse[NL];
    const void *hqp, *hkp, *hvp;
    void *houtp;
    float *hlsep;

    /* clattn_create / clattn_create_from_queue */
    const char *create_spec;
    cl_command_queue create_queue;
    clattn_context **create_out;
    clattn_context *created;

    /* wait list for every enqueuing entry point */
    cl_uint num_wait;
    const cl_event *wait;
    cl_event wait_list[2];
    int done_in_wait; /* the call's done points to wait_list[0] */

    /* sub-buffers and host-pointer buffers a row makes: released, not checked (their storage is a
     * tracked buffer's, or host_mem) */
    cl_mem extra[4];
    int nextra;
    float host_mem[NQ + NO];
} fixture;

typedef struct row {
    const char *name;
    entry entry;
    void (*mutate)(fixture *f); /* NULL: the baseline itself */
    clattn_status status;
    const char *what;  /* the message must contain this (the argument); NULL: no message (ctx NULL) */
    const char *value; /* and this (the offending value); NULL: nothing more */
} row;

static clattn_context *g_ctx;

/* ================================= fixture ================================= */

static void check_cl(cl_int err, const char *what)
{
    if (err != CL_SUCCESS) {
        print_error("%s failed with OpenCL error %d\n", what, (int)err);
        fail();
    }
}

static cl_command_queue queue_of(const fixture *f, const tracked *t)
{
    return t->foreign ? f->queue2 : clattn_queue(f->ctx);
}

static void make_second_context(fixture *f)
{
    if (f->ctx2)
        return;
    cl_device_id dev = clattn_device(f->ctx);
    cl_platform_id plat;
    check_cl(clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL), "clGetDeviceInfo");
    const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0};
    cl_int err;
    f->ctx2 = clCreateContext(props, 1, &dev, NULL, NULL, &err);
    check_cl(err, "clCreateContext (second context)");
    f->queue2 = clCreateCommandQueue(f->ctx2, dev, 0, &err);
    check_cl(err, "clCreateCommandQueue (second context)");
}

/* A new buffer of exactly `bytes`, filled with its own pattern and checked like the baseline's. */
static cl_mem fx_new(fixture *f, size_t bytes, int foreign)
{
    assert_true(f->nbuf < MAX_BUFS);
    if (foreign)
        make_second_context(f);
    tracked *t = &f->buf[f->nbuf];
    cl_int err;
    t->mem = clCreateBuffer(foreign ? f->ctx2 : clattn_cl_context(f->ctx), CL_MEM_READ_WRITE, bytes,
                            NULL, &err);
    check_cl(err, "clCreateBuffer");
    t->bytes = bytes;
    t->foreign = foreign;
    unsigned char *fill = malloc(bytes);
    assert_non_null(fill);
    memset(fill, PATTERN(f->nbuf), bytes);
    err = clEnqueueWriteBuffer(queue_of(f, t), t->mem, CL_TRUE, 0, bytes, fill, 0, NULL, NULL);
    free(fill);
    f->nbuf++;
    check_cl(err, "clEnqueueWriteBuffer");
    return t->mem;
}

static cl_mem base(const fixture *f, int i)
{
    return f->buf[i].mem;
}

/* A tracked buffer of `bytes` made with the given access flags (filled and checked as fx_new's). */
static cl_mem fx_new_flags(fixture *f, size_t bytes, cl_mem_flags flags)
{
    cl_mem m = fx_new(f, bytes, 0);
    tracked *t = &f->buf[f->nbuf - 1];
    unsigned char *fill = malloc(bytes);
    assert_non_null(fill);
    memset(fill, PATTERN(f->nbuf - 1), bytes);
    cl_int err;
    t->mem = clCreateBuffer(clattn_cl_context(f->ctx), flags | CL_MEM_COPY_HOST_PTR, bytes, fill, &err);
    free(fill);
    check_cl(err, "clCreateBuffer (flags)");
    clReleaseMemObject(m);
    return t->mem;
}

/* Bytes [origin, origin + bytes) of parent as a sub-buffer; origin must be a multiple of the
 * device's base address alignment. */
static cl_mem fx_sub(fixture *f, cl_mem parent, size_t origin, size_t bytes)
{
    assert_true(f->nextra < (int)N_OF(f->extra));
    const cl_buffer_region region = {origin, bytes};
    cl_int err;
    cl_mem m = clCreateSubBuffer(parent, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    check_cl(err, "clCreateSubBuffer");
    f->extra[f->nextra++] = m;
    return m;
}

/* The device's sub-buffer origin alignment in bytes. */
static size_t sub_align(const fixture *f)
{
    cl_uint bits = 0;
    check_cl(clGetDeviceInfo(clattn_device(f->ctx), CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL),
             "clGetDeviceInfo(CL_DEVICE_MEM_BASE_ADDR_ALIGN)");
    return bits >= 8 ? bits / 8 : 1;
}

/* A CL_MEM_USE_HOST_PTR buffer over bytes [at, at + bytes) of the fixture's host_mem. */
static cl_mem fx_host(fixture *f, size_t at, size_t bytes)
{
    assert_true(f->nextra < (int)N_OF(f->extra));
    cl_int err;
    cl_mem m = clCreateBuffer(clattn_cl_context(f->ctx), CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, bytes,
                              (char *)f->host_mem + at, &err);
    check_cl(err, "clCreateBuffer (CL_MEM_USE_HOST_PTR)");
    f->extra[f->nextra++] = m;
    return m;
}

/* A 64 x 64 single-channel float image (4096 elements, more than any baseline view needs); the
 * row is skipped on a device without images. */
static cl_mem fx_image(fixture *f)
{
    assert_true(f->nextra < (int)N_OF(f->extra));
    cl_bool images = CL_FALSE;
    check_cl(clGetDeviceInfo(clattn_device(f->ctx), CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL),
             "clGetDeviceInfo(CL_DEVICE_IMAGE_SUPPORT)");
    const cl_image_format format = {CL_R, CL_FLOAT};
    cl_image_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = desc.image_height = 64;
    cl_int err = CL_INVALID_OPERATION;
    cl_mem m = images ? clCreateImage(clattn_cl_context(f->ctx), CL_MEM_READ_WRITE, &format, &desc, NULL, &err)
                      : NULL;
    if (!m) {
        print_message("skipping: the device has no CL_R float images (%d)\n", (int)err);
        skip();
    }
    f->extra[f->nextra++] = m;
    return m;
}

/* Points every call argument at the valid baseline (buffers made earlier are kept). */
static void fx_baseline(fixture *f)
{
    f->call_ctx = f->ctx;
    f->num_wait = 0;
    f->wait = NULL;

    f->q = clattn_tensor_bhsd(base(f, BUF_Q), CLATTN_F32, B, HQ, SQ, D);
    f->k = clattn_tensor_bhsd(base(f, BUF_K), CLATTN_F32, B, HKV, SKV, D);
    f->v = clattn_tensor_bhsd(base(f, BUF_V), CLATTN_F32, B, HKV, SKV, DV);
    f->out = clattn_tensor_bhsd(base(f, BUF_OUT), CLATTN_F32, B, HQ, SQ, DV);
    f->mask = clattn_tensor_bhsd(base(f, BUF_MASK), CLATTN_F32, B, HQ, SQ, SKV);
    f->lse = clattn_tensor_bhsd(base(f, BUF_LSE), CLATTN_F32, B, HQ, SQ, 1);
    f->probs = clattn_tensor_bhsd(base(f, BUF_PROBS), CLATTN_F32, B, HQ, SQ, SKV);
    f->scores = clattn_tensor_bhsd(base(f, BUF_SCORES), CLATTN_F32, B, HQ, SQ, SKV);
    memset(&f->desc, 0, sizeof f->desc);
    f->desc.batch = B;
    f->desc.heads_q = HQ;
    f->desc.heads_kv = HKV;
    f->desc.seq_q = SQ;
    f->desc.seq_kv = SKV;
    f->desc.head_dim = D;
    f->desc.head_dim_v = DV;
    f->desc.causal = 1;
    f->desc.mask = &f->mask;
    f->desc.kv_lengths = base(f, BUF_KVLEN);
    f->desc.lse = &f->lse;
    f->desc.probabilities = NULL; /* rows that want them add them (they force the unfused path) */
    f->desc.algorithm = CLATTN_ALGORITHM_AUTO;
    f->descp = &f->desc;
    f->qp = &f->q;
    f->kp = &f->k;
    f->vp = &f->v;
    f->outp = &f->out;
    f->scoresp = &f->scores;

    f->sin = clattn_tensor_bhsd(base(f, BUF_SIN), CLATTN_F32, B, HQ, SQ, SKV);
    f->sout = clattn_tensor_bhsd(base(f, BUF_SOUT), CLATTN_F32, B, HQ, SQ, SKV);
    f->smask = clattn_tensor_bhsd(base(f, BUF_SMASK), CLATTN_F32, B, HQ, SQ, SKV);
    memset(&f->sdesc, 0, sizeof f->sdesc);
    f->sdesc.batch = B;
    f->sdesc.heads = HQ;
    f->sdesc.rows = SQ;
    f->sdesc.cols = SKV;
    f->sdesc.causal = 1;
    f->sdesc.mask = &f->smask;
    f->sdesc.kv_lengths = base(f, BUF_KVLEN);
    f->sdescp = &f->sdesc;
    f->sinp = &f->sin;
    f->soutp = &f->sout;

    f->num_parts = 2;
    for (int i = 0; i < 2; i++) {
        f->part_out[i] = clattn_tensor_bhsd(base(f, BUF_PO0 + i), CLATTN_F32, B, HQ, SQ, DV);
        f->part_lse[i] = clattn_tensor_bhsd(base(f, BUF_PL0 + i), CLATTN_F32, B, HQ, SQ, 1);
    }
    f->mout = clattn_tensor_bhsd(base(f, BUF_MOUT), CLATTN_F32, B, HQ, SQ, DV);
    f->mlse = clattn_tensor_bhsd(base(f, BUF_MLSE), CLATTN_F32, B, HQ, SQ, 1);
    f->part_outp = f->part_out;
    f->part_lsep = f->part_lse;
    f->moutp = &f->mout;
    f->mlsep = &f->mlse;

    f->hdesc = f->desc;
    f->hdesc.mask = NULL;
    f->hdesc.kv_lengths = NULL;
    f->hdesc.lse = NULL;
    f->hdescp = &f->hdesc;
    f->hdtype = CLATTN_F32;
    f->hqp = f->hq;
    f->hkp = f->hk;
    f->hvp = f->hv;
    f->houtp = f->hout;
    f->hlsep = f->hlse;

    f->create_spec = NULL;
    f->create_queue = clattn_queue(f->ctx);
    f->create_out = &f->created;
}

static void fx_init(fixture *f)
{
    if (!g_ctx)
        g_ctx = tu_context();
    f->ctx = g_ctx;
    for (int i = 0; i < NBASE; i++)
        fx_new(f, base_bytes[i], 0);
    for (size_t i = 0; i < NQ; i++)
        f->hq[i] = (float)((int)(i % 7) - 3) * 0.125f;
    for (size_t i = 0; i < NK; i++)
        f->hk[i] = (float)((int)(i % 5) - 2) * 0.25f;
    for (size_t i = 0; i < NV; i++)
        f->hv[i] = (float)(i % 11) * 0.0625f;
    memset(f->hout, HOST_PATTERN, sizeof f->hout);
    memset(f->hlse, HOST_PATTERN, sizeof f->hlse);
    fx_baseline(f);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    f->row = *state;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    if (f->user_event) {
        clSetUserEventStatus(f->user_event, CL_COMPLETE);
        clReleaseEvent(f->user_event);
    }
    if (f->ctx)
        clFinish(clattn_queue(f->ctx));
    if (f->queue2)
        clFinish(f->queue2);
    for (int i = 0; i < f->nextra; i++) /* sub-buffers before their parents */
        clReleaseMemObject(f->extra[i]);
    for (int i = 0; i < f->nbuf; i++)
        clReleaseMemObject(f->buf[i].mem);
    if (f->ooo_queue)
        clReleaseCommandQueue(f->ooo_queue);
    if (f->queue2)
        clReleaseCommandQueue(f->queue2);
    if (f->ctx2)
        clReleaseContext(f->ctx2);
    if (f->created != NULL && f->created != GARBAGE_CTX)
        clattn_release(f->created);
    free(f);
    return 0;
}

/* ================================ the call ================================= */

static int has_done(entry e)
{
    return e == E_ATTENTION || e == E_SCORES || e == E_SOFTMAX || e == E_MERGE;
}

static clattn_status invoke(fixture *f, entry e, cl_event *done)
{
    switch (e) {
    case E_ATTENTION:
        return clattn_attention(f->call_ctx, f->descp, f->qp, f->kp, f->vp, f->outp, f->num_wait,
                                f->wait, done);
    case E_SCORES:
        return clattn_scores(f->call_ctx, f->descp, f->qp, f->kp, f->scoresp, f->num_wait, f->wait,
                             done);
    case E_SOFTMAX:
        return clattn_softmax(f->call_ctx, f->sdescp, f->sinp, f->soutp, f->num_wait, f->wait, done);
    case E_MERGE:
        return clattn_merge(f->call_ctx, f->num_parts, f->part_outp, f->part_lsep, f->moutp, f->mlsep,
                            f->num_wait, f->wait, done);
    case E_HOST:
        return clattn_attention_host(f->call_ctx, f->hdescp, f->hdtype, f->hqp, f->hkp, f->hvp,
                                     f->houtp, f->hlsep);
    case E_CREATE:
        return clattn_create(f->create_spec, f->create_out);
    case E_CREATE_FROM_QUEUE:
        return clattn_create_from_queue(f->create_queue, f->create_out);
    }
    fail_msg("unknown entry %d", (int)e);
    return CLATTN_INVALID_ARGUMENT;
}

static const char *message_of(const fixture *f, entry e)
{
    if (e == E_CREATE || e == E_CREATE_FROM_QUEUE)
        return clattn_last_error(NULL);
    return f->call_ctx ? clattn_last_error(f->call_ctx) : NULL;
}

/* Every buffer still holds its fill byte, every host output its pattern. */
static void check_untouched(fixture *f, const char *name)
{
    tu_finish(f->ctx);
    if (f->queue2)
        check_cl(clFinish(f->queue2), "clFinish (second context)");
    for (int i = 0; i < f->nbuf; i++) {
        const tracked *t = &f->buf[i];
        unsigned char *got = malloc(t->bytes);
        assert_non_null(got);
        const cl_int err = clEnqueueReadBuffer(queue_of(f, t), t->mem, CL_TRUE, 0, t->bytes, got, 0,
                                               NULL, NULL);
        size_t bad = t->bytes;
        for (size_t j = 0; err == CL_SUCCESS && j < t->bytes; j++)
            if (got[j] != PATTERN(i)) {
                bad = j;
                break;
            }
        const unsigned char byte = bad < t->bytes ? got[bad] : 0;
        free(got);
        check_cl(err, "clEnqueueReadBuffer");
        if (bad < t->bytes)
            fail_msg("%s: buffer %d (%zu bytes) was modified at byte %zu: 0x%02x, filled with 0x%02x", name,
                     i, t->bytes, bad, byte, PATTERN(i));
    }
    const unsigned char *h[2] = {(const unsigned char *)f->hout, (const unsigned char *)f->hlse};
    const size_t hn[2] = {sizeof f->hout, sizeof f->hlse};
    for (int a = 0; a < 2; a++)
        for (size_t j = 0; j < hn[a]; j++)
            if (h[a][j] != HOST_PATTERN)
                fail_msg("%s: host %s was modified at byte %zu", name, a ? "lse" : "out", j);
}

/* A valid call of the same entry point after the failure: succeeds, and clears the message. */
static void check_context_usable(fixture *f, entry e, const char *name)
{
    fx_baseline(f);
    if (e == E_CREATE || e == E_CREATE_FROM_QUEUE) {
        clattn_context *c = NULL;
        const clattn_status st = clattn_create_from_queue(clattn_queue(f->ctx), &c);
        if (st != CLATTN_SUCCESS)
            fail_msg("%s: follow-up clattn_create_from_queue failed: %s", name, clattn_last_error(NULL));
        assert_non_null(c);
        assert_string_equal(clattn_last_error(c), "");
        clattn_release(c);
        return;
    }
    cl_event done = GARBAGE_EVENT;
    const clattn_status st = invoke(f, e, has_done(e) ? &done : NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("%s: the valid follow-up call failed with %s: %s", name, clattn_status_name(st),
                 clattn_last_error(f->ctx));
    assert_string_equal(clattn_last_error(f->ctx), "");
    if (has_done(e)) {
        assert_true(done != NULL && done != GARBAGE_EVENT);
        check_cl(clWaitForEvents(1, &done), "clWaitForEvents");
        clReleaseEvent(done);
    }
}

static void test_row(void **state)
{
    fixture *f = *state;
    const row *r = f->row;
    const char *name = r->name;
    fx_init(f);
    if (r->mutate)
        r->mutate(f);

    cl_event done = GARBAGE_EVENT;
    f->created = GARBAGE_CTX;
    cl_event *donep = f->done_in_wait ? &f->wait_list[0] : &done;
    const clattn_status st = invoke(f, r->entry, has_done(r->entry) ? donep : NULL);
    if (f->done_in_wait) {
        /* done is the caller's wait event: a failure must leave it as it was. */
        if (f->wait_list[0] != f->user_event)
            fail_msg("%s: the event done points to (wait[0]) was changed to %p", name, (void *)f->wait_list[0]);
        done = NULL;
    }
    /* Release anything a wait list held before waiting on the queue. */
    if (f->user_event)
        check_cl(clSetUserEventStatus(f->user_event, CL_COMPLETE), "clSetUserEventStatus");
    const char *msg = message_of(f, r->entry);
    if (st == CLATTN_SUCCESS && has_done(r->entry) && done != NULL && done != GARBAGE_EVENT) {
        clWaitForEvents(1, &done);
        clReleaseEvent(done);
        done = NULL;
    }
    if (st != r->status)
        fail_msg("%s: returned %s, expected %s (message: \"%s\")", name, clattn_status_name(st),
                 clattn_status_name(r->status), msg ? msg : "(none)");

    if (r->status == CLATTN_SUCCESS) {
        if (msg)
            assert_string_equal(msg, "");
        check_context_usable(f, r->entry, name);
        return;
    }

    /* The failure contract. */
    if (has_done(r->entry) && done != NULL)
        fail_msg("%s: *done is %p after a failure, expected NULL", name, (void *)done);
    if (r->entry == E_CREATE || r->entry == E_CREATE_FROM_QUEUE) {
        if (f->create_out && f->created != NULL)
            fail_msg("%s: *ctx is %p after a failure, expected NULL", name, (void *)f->created);
    }
    if (r->what) {
        assert_non_null(msg);
        if (!strstr(msg, r->what) || (r->value && !strstr(msg, r->value)))
            fail_msg("%s: message \"%s\" does not contain \"%s\"%s%s%s", name, msg, r->what,
                     r->value ? " and \"" : "", r->value ? r->value : "", r->value ? "\"" : "");
    }
    check_untouched(f, name);
    check_context_usable(f, r->entry, name);
}

/* =============================== mutations ================================= */

/* One statement list per mutation; `f` is the fixture. */
#define MUT(fn, ...)              \
    static void fn(fixture *f)    \
    {                             \
        __VA_ARGS__;              \
    }

static void wait_with_null(fixture *f)
{
    cl_int err;
    f->user_event = clCreateUserEvent(clattn_cl_context(f->ctx), &err);
    check_cl(err, "clCreateUserEvent");
    f->wait_list[0] = f->user_event;
    f->wait_list[1] = NULL;
    f->wait = f->wait_list;
    f->num_wait = 2;
}

/* ---- clattn_attention ---- */
MUT(a_null_ctx, f->call_ctx = NULL)
MUT(a_null_desc, f->descp = NULL)
MUT(a_null_q, f->qp = NULL)
MUT(a_null_k, f->kp = NULL)
MUT(a_null_v, f->vp = NULL)
MUT(a_null_out, f->outp = NULL)
MUT(a_q_null_buffer, f->q.buffer = NULL)
MUT(a_k_null_buffer, f->k.buffer = NULL)
MUT(a_v_null_buffer, f->v.buffer = NULL)
MUT(a_out_null_buffer, f->out.buffer = NULL)
MUT(a_mask_null_buffer, f->mask.buffer = NULL)
MUT(a_lse_null_buffer, f->lse.buffer = NULL)
MUT(a_probs_null_buffer, f->probs.buffer = NULL; f->desc.probabilities = &f->probs)
MUT(a_batch_zero, f->desc.batch = 0)
MUT(a_batch_negative, f->desc.batch = -1)
MUT(a_heads_q_zero, f->desc.heads_q = 0)
MUT(a_heads_q_negative, f->desc.heads_q = -1)
MUT(a_heads_kv_zero, f->desc.heads_kv = 0)
MUT(a_heads_kv_negative, f->desc.heads_kv = -1)
MUT(a_seq_q_zero, f->desc.seq_q = 0)
MUT(a_seq_q_negative, f->desc.seq_q = -1)
MUT(a_seq_kv_zero, f->desc.seq_kv = 0)
MUT(a_seq_kv_negative, f->desc.seq_kv = -1)
MUT(a_head_dim_zero, f->desc.head_dim = 0)
MUT(a_head_dim_negative, f->desc.head_dim = -1)
MUT(a_head_dim_v_negative, f->desc.head_dim_v = -1)
MUT(a_heads_q_not_multiple, f->desc.heads_q = 3)
MUT(a_heads_kv_not_divisor, f->desc.heads_kv = 3)
MUT(a_heads_kv_above_heads_q, f->desc.heads_kv = 8)
MUT(a_head_dim_577, f->desc.head_dim = 577; f->desc.scale = 0.05f; f->q.shape[3] = 577; f->k.shape[3] = 577)
MUT(a_head_dim_v_513, f->desc.head_dim_v = 513; f->v.shape[3] = 513; f->out.shape[3] = 513)
MUT(a_batch_above_int32, f->desc.batch = BIG + 1)
MUT(a_seq_q_above_int32, f->desc.seq_q = BIG + 1)
MUT(a_seq_kv_above_int32, f->desc.seq_kv = BIG + 1)
MUT(a_heads_kv_int64_max, f->desc.heads_kv = INT64_MAX)
MUT(a_head_dim_above_int32, f->desc.head_dim = BIG + 1)

/* Every extent at its limit with tensors whose shapes match: B*Hq*Sq overflows 64 bits. */
static void a_rows_overflow_64(fixture *f)
{
    const int64_t S = CLATTN_MAX_SEQ;
    f->desc.batch = f->desc.heads_q = BIG;
    f->desc.seq_q = S;
    f->desc.heads_kv = 1;
    const int64_t qs[4] = {BIG, BIG, S, D}, ks[4] = {BIG, 1, SKV, D}, vs[4] = {BIG, 1, SKV, DV};
    const int64_t os[4] = {BIG, BIG, S, DV}, ms[4] = {BIG, BIG, S, SKV}, ls[4] = {BIG, BIG, S, 1};
    memcpy(f->q.shape, qs, sizeof qs);
    memcpy(f->k.shape, ks, sizeof ks);
    memcpy(f->v.shape, vs, sizeof vs);
    memcpy(f->out.shape, os, sizeof os);
    memcpy(f->mask.shape, ms, sizeof ms);
    memcpy(f->lse.shape, ls, sizeof ls);
}

/* 2^40 query rows: fits 64 bits, but more rows than any launch can index. */
static void a_rows_above_limit(fixture *f)
{
    const int64_t n = INT64_C(1) << 20;
    f->desc.batch = f->desc.heads_q = n;
    f->desc.seq_q = 1;
    f->desc.heads_kv = 1;
    f->q.shape[0] = f->q.shape[1] = f->out.shape[0] = f->out.shape[1] = n;
    f->mask.shape[0] = f->mask.shape[1] = f->lse.shape[0] = f->lse.shape[1] = n;
    f->q.shape[2] = f->out.shape[2] = f->mask.shape[2] = f->lse.shape[2] = 1;
    f->k.shape[0] = f->v.shape[0] = n;
    f->k.shape[1] = f->v.shape[1] = 1;
}

/* Accepted extents and products, matching shapes, but the baseline's small buffers: the size check. */
static void a_huge_batch_heads(fixture *f)
{
    const int64_t n = 32768;
    f->desc.batch = f->desc.heads_q = n;
    f->q.shape[0] = f->q.shape[1] = f->out.shape[0] = f->out.shape[1] = n;
    f->mask.shape[0] = f->mask.shape[1] = f->lse.shape[0] = f->lse.shape[1] = n;
    f->k.shape[0] = f->v.shape[0] = n;
}

static void a_huge_seq_kv(fixture *f)
{
    f->desc.seq_kv = CLATTN_MAX_SEQ;
    f->k.shape[2] = f->v.shape[2] = f->mask.shape[3] = CLATTN_MAX_SEQ;
}

MUT(a_q_shape0, f->q.shape[0] = B + 1)
MUT(a_q_shape1, f->q.shape[1] = HQ + 1)
MUT(a_q_shape2, f->q.shape[2] = SQ + 1)
MUT(a_q_shape3, f->q.shape[3] = D + 1)
MUT(a_k_shape0, f->k.shape[0] = B + 1)
MUT(a_k_shape1, f->k.shape[1] = HKV + 1)
MUT(a_k_shape2, f->k.shape[2] = SKV + 1)
MUT(a_k_shape3, f->k.shape[3] = D + 1)
MUT(a_v_shape0, f->v.shape[0] = B + 1)
MUT(a_v_shape1, f->v.shape[1] = HKV + 1)
MUT(a_v_shape2, f->v.shape[2] = SKV + 1)
MUT(a_v_shape3, f->v.shape[3] = DV + 1)
MUT(a_out_shape0, f->out.shape[0] = B + 1)
MUT(a_out_shape1, f->out.shape[1] = HQ + 1)
MUT(a_out_shape2, f->out.shape[2] = SQ + 1)
MUT(a_out_shape3, f->out.shape[3] = DV + 1)
MUT(a_k_shape1_is_heads_q, f->k.shape[1] = HQ) /* GQA: k has heads_kv heads, not heads_q */
MUT(a_q_shape_zero, f->q.shape[2] = 0)
MUT(a_q_offset_negative, f->q.offset = -1)
MUT(a_mask_offset_negative, f->mask.offset = -5)
MUT(a_k_stride_negative, f->k.stride[2] = -D)
MUT(a_v_stride_negative, f->v.stride[1] = -1)
MUT(a_out_stride_negative, f->out.stride[0] = -1)
MUT(a_q_one_short_offset, f->q.offset = 1)
MUT(a_k_one_short_offset, f->k.offset = 1)
MUT(a_v_one_short_offset, f->v.offset = 1)
MUT(a_out_one_short_offset, f->out.offset = 1)
MUT(a_mask_one_short_offset, f->mask.offset = 1)
MUT(a_lse_one_short_offset, f->lse.offset = 1)
MUT(a_probs_one_short_offset, f->probs.offset = 1; f->desc.probabilities = &f->probs)
/* Last element (1, 3, 2, 7) at 97 + 72 + 16 + 7 = 192: one past the 192-float buffer. */
MUT(a_q_one_short_stride, f->q.stride[0] = HQ * SQ * D + 1)
MUT(a_v_one_short_buffer, f->v.buffer = fx_new(f, NV * 4 - 4, 0))
MUT(a_mask_f16_one_byte_short, f->mask.dtype = CLATTN_F16; f->mask.buffer = fx_new(f, NM * 2 - 1, 0))
MUT(a_q_offset_int64_max, f->q.offset = INT64_MAX)
MUT(a_q_stride_2_62, f->q.stride[0] = INT64_C(1) << 62)
MUT(a_out_stride_2_62, f->out.stride[1] = INT64_C(1) << 62)
MUT(a_v_offset_and_stride_2_62, f->v.offset = INT64_C(1) << 62; f->v.stride[0] = INT64_C(1) << 62)
MUT(a_k_stride_int64_max, f->k.stride[2] = INT64_MAX)
MUT(a_mask_stride_2_62, f->mask.stride[1] = INT64_C(1) << 62)
MUT(a_k_f16, f->k.dtype = CLATTN_F16)
MUT(a_v_f16, f->v.dtype = CLATTN_F16)
MUT(a_out_bf16, f->out.dtype = CLATTN_BF16)
MUT(a_q_dtype_99, f->q.dtype = (clattn_dtype)99)
MUT(a_q_dtype_negative, f->q.dtype = (clattn_dtype)-1)
MUT(a_k_dtype_99, f->k.dtype = (clattn_dtype)99)
/* KV-cache types (issue 73) where only f32/f16/bf16 go */
MUT(a_q_q8_0, f->q.dtype = CLATTN_Q8_0)
MUT(a_out_i8, f->out.dtype = CLATTN_I8)
MUT(a_mask_fp8, f->mask.dtype = CLATTN_FP8_E4M3)
MUT(a_k_i8_no_scales, f->k.dtype = CLATTN_I8)
MUT(a_mask_bf16, f->mask.dtype = CLATTN_BF16)
MUT(a_mask_dtype_99, f->mask.dtype = (clattn_dtype)99)
MUT(a_mask_keys, f->mask.shape[3] = SKV - 1)
MUT(a_mask_heads_2, f->mask.shape[1] = 2)
MUT(a_mask_rows, f->mask.shape[2] = 2)
MUT(a_mask_batch, f->mask.shape[0] = B + 1)
MUT(a_lse_dim_2, f->lse.shape[3] = 2)
MUT(a_lse_rows, f->lse.shape[2] = SQ + 1)
MUT(a_lse_f16, f->lse.dtype = CLATTN_F16)
MUT(a_lse_self_overlap, f->lse.stride[2] = 0)
MUT(a_probs_fused, f->desc.probabilities = &f->probs; f->desc.algorithm = CLATTN_ALGORITHM_FUSED)
MUT(a_probs_shape, f->desc.probabilities = &f->probs; f->probs.shape[3] = SKV - 1)
MUT(a_probs_self_overlap, f->desc.probabilities = &f->probs; f->probs.stride[2] = 1)
MUT(a_probs_overlaps_q, f->desc.probabilities = &f->probs; f->probs.buffer = base(f, BUF_Q))
MUT(a_algorithm_9, f->desc.algorithm = (clattn_algorithm)9)
MUT(a_algorithm_negative, f->desc.algorithm = (clattn_algorithm)-1)
MUT(a_scale_nan, f->desc.scale = NAN)
MUT(a_scale_inf, f->desc.scale = INFINITY)
MUT(a_scale_neg_inf, f->desc.scale = -INFINITY)

/* batch 4 with tensors to match, but the baseline's kv_lengths holds only 2 int32 (8 bytes). */
static void a_kvlen_too_small(fixture *f)
{
    f->desc.batch = 4;
    f->q = clattn_tensor_bhsd(fx_new(f, 2 * NQ * 4, 0), CLATTN_F32, 4, HQ, SQ, D);
    f->k = clattn_tensor_bhsd(fx_new(f, 2 * NK * 4, 0), CLATTN_F32, 4, HKV, SKV, D);
    f->v = clattn_tensor_bhsd(fx_new(f, 2 * NV * 4, 0), CLATTN_F32, 4, HKV, SKV, DV);
    f->out = clattn_tensor_bhsd(fx_new(f, 2 * NO * 4, 0), CLATTN_F32, 4, HQ, SQ, DV);
    f->mask.shape[0] = 1; /* one mask for every batch */
    f->desc.lse = NULL;
}

MUT(a_kvlen_foreign, f->desc.kv_lengths = fx_new(f, B * 4, 1))
MUT(a_kvlen_image, f->desc.kv_lengths = fx_image(f))
MUT(a_out_image, f->out.buffer = fx_image(f))
MUT(a_q_image, f->q.buffer = fx_image(f))
MUT(a_out_self_overlap_seq, f->out.stride[2] = DV - 1)
MUT(a_out_batch_stride_zero, f->out.stride[0] = 0)
MUT(a_out_heads_alias_rows, f->out.stride[1] = DV) /* head h+1 starts at row 1 of head h */
MUT(a_out_overlaps_q, f->out.buffer = base(f, BUF_Q); f->out.offset = (int64_t)(NQ - NO))
MUT(a_out_is_k, f->out.buffer = base(f, BUF_K))
MUT(a_out_overlaps_v, f->v.buffer = base(f, BUF_OUT); f->v.offset = 0;
    f->out.buffer = base(f, BUF_OUT))
MUT(a_lse_overlaps_out, f->lse.buffer = base(f, BUF_OUT); f->lse.offset = 10)
MUT(a_lse_overlaps_q, f->lse.buffer = base(f, BUF_Q))
MUT(a_out_overlaps_mask, f->out.buffer = base(f, BUF_MASK))
MUT(a_lse_overlaps_mask, f->lse.buffer = base(f, BUF_MASK))

/* Writing out must not clobber the key lengths the same kernels read. */
static void a_out_is_kv_lengths(fixture *f)
{
    cl_mem m = fx_new(f, NO * 4, 0);
    f->out.buffer = m;
    f->desc.kv_lengths = m;
}

/* q and out in one buffer, disjoint ranges: allowed. */
static void a_out_shares_buffer_disjoint(fixture *f)
{
    cl_mem m = fx_new(f, (NQ + NO) * 4, 0);
    f->q.buffer = m;
    f->out.buffer = m;
    f->out.offset = (int64_t)NQ;
}

/* done points to wait[0], an event the caller owns (OpenCL forbids this for an enqueue). */
static void wait_done_alias(fixture *f)
{
    cl_int err;
    f->user_event = clCreateUserEvent(clattn_cl_context(f->ctx), &err);
    check_cl(err, "clCreateUserEvent");
    f->wait_list[0] = f->user_event;
    f->wait = f->wait_list;
    f->num_wait = 1;
    f->done_in_wait = 1;
}

/* q is a sub-buffer over the same bytes as out's buffer: two handles, one storage. */
static void a_q_subbuffer_of_out(fixture *f)
{
    cl_mem parent = fx_new(f, NQ * 4, 0);
    f->out.buffer = parent;
    f->q.buffer = fx_sub(f, parent, 0, NQ * 4);
}

/* out and q are disjoint sub-buffers of one buffer: allowed. */
static void a_out_q_disjoint_subbuffers(fixture *f)
{
    const size_t a = sub_align(f), at = (NO * 4 + a - 1) / a * a;
    cl_mem parent = fx_new(f, at + NQ * 4, 0);
    f->out.buffer = fx_sub(f, parent, 0, NO * 4);
    f->q.buffer = fx_sub(f, parent, at, NQ * 4);
}

/* kv_lengths is a sub-buffer over the first bytes of out's buffer. */
static void a_kvlen_subbuffer_of_out(fixture *f)
{
    cl_mem parent = fx_new(f, NO * 4, 0);
    f->out.buffer = parent;
    f->desc.kv_lengths = fx_sub(f, parent, 0, B * 4);
}

/* q and out are CL_MEM_USE_HOST_PTR buffers over overlapping host memory. */
static void a_out_host_overlaps_q(fixture *f)
{
    f->q.buffer = fx_host(f, 0, NQ * 4);
    f->out.buffer = fx_host(f, (NQ - NO / 2) * 4, NO * 4);
}

/* ... and over disjoint host memory: allowed. */
static void a_out_host_disjoint_q(fixture *f)
{
    f->q.buffer = fx_host(f, 0, NQ * 4);
    f->out.buffer = fx_host(f, NQ * 4, NO * 4);
}

MUT(a_out_read_only, f->out.buffer = fx_new_flags(f, NO * 4, CL_MEM_READ_ONLY))
MUT(a_lse_read_only, f->lse.buffer = fx_new_flags(f, NL * 4, CL_MEM_READ_ONLY))
MUT(a_v_write_only, f->v.buffer = fx_new_flags(f, NV * 4, CL_MEM_WRITE_ONLY))
MUT(a_kvlen_write_only, f->desc.kv_lengths = fx_new_flags(f, B * 4, CL_MEM_WRITE_ONLY))
MUT(a_inputs_read_only_ok, f->q.buffer = fx_new_flags(f, NQ * 4, CL_MEM_READ_ONLY);
    f->k.buffer = fx_new_flags(f, NK * 4, CL_MEM_READ_ONLY);
    f->out.buffer = fx_new_flags(f, NO * 4, CL_MEM_WRITE_ONLY))
/* f32 probabilities the unfused path must not read back for P·V. */
MUT(a_unfused_probs_write_only_ok, f->desc.probabilities = &f->probs;
    f->probs.buffer = fx_new_flags(f, NM * 4, CL_MEM_WRITE_ONLY); f->desc.algorithm = CLATTN_ALGORITHM_UNFUSED)
MUT(a_seq_kv_above_max, f->desc.seq_kv = CLATTN_MAX_SEQ + 1)
MUT(a_seq_q_above_max, f->desc.seq_q = CLATTN_MAX_SEQ + 1)
/* 2^16 query heads over one kv head, 2^16 rows each: 2^32 packed rows of one kv head. */
MUT(a_group_rows_above_int32, f->desc.batch = 1; f->desc.heads_q = 65536; f->desc.heads_kv = 1;
    f->desc.seq_q = 65536)
/* 2 x 1073217537 = 2^31 - 2^20 + 2: within int32, past the rows a group may have. */
MUT(a_group_rows_above_max_seq, f->desc.batch = 1; f->desc.heads_q = 2; f->desc.heads_kv = 1;
    f->desc.seq_q = 1073217537)
MUT(a_batch_heads_above_int32, f->desc.batch = 65536; f->desc.heads_q = 65536; f->desc.heads_kv = 1;
    f->desc.seq_q = 1)

MUT(a_wait_null, f->num_wait = 1; f->wait = NULL)
MUT(a_wait_contains_null, wait_with_null(f))
MUT(a_q_foreign, f->q.buffer = fx_new(f, NQ * 4, 1))
MUT(a_v_foreign, f->v.buffer = fx_new(f, NV * 4, 1))
MUT(a_out_foreign, f->out.buffer = fx_new(f, NO * 4, 1))
MUT(a_mask_foreign, f->mask.buffer = fx_new(f, NM * 4, 1))
MUT(a_lse_foreign, f->lse.buffer = fx_new(f, NL * 4, 1))
MUT(a_unfused_probs_ok, f->desc.probabilities = &f->probs; f->desc.algorithm = CLATTN_ALGORITHM_UNFUSED)

/* ---- clattn_scores ---- */
MUT(s_null_scores, f->scoresp = NULL)
MUT(s_scores_null_buffer, f->scores.buffer = NULL)
MUT(s_scores_keys, f->scores.shape[3] = SKV - 1)
MUT(s_scores_heads, f->scores.shape[1] = HKV)
MUT(s_scores_rows, f->scores.shape[2] = SQ + 1)
MUT(s_scores_is_q, f->scores.buffer = base(f, BUF_Q))
MUT(s_scores_overlaps_q, f->scores.buffer = base(f, BUF_Q); f->scores.offset = (int64_t)(NQ - NM))
MUT(s_scores_is_k, f->scores.buffer = base(f, BUF_K))
MUT(s_scores_is_mask, f->scores.buffer = base(f, BUF_MASK))
MUT(s_scores_self_overlap, f->scores.stride[2] = SKV - 1)
MUT(s_scores_one_short, f->scores.offset = 1)
MUT(s_scores_dtype_99, f->scores.dtype = (clattn_dtype)99)
MUT(s_scores_foreign, f->scores.buffer = fx_new(f, NM * 4, 1))
MUT(s_kvlen_too_small, f->desc.kv_lengths = fx_new(f, 4, 0))
MUT(s_scores_read_only, f->scores.buffer = fx_new_flags(f, NM * 4, CL_MEM_READ_ONLY))

/* kv_lengths is a sub-buffer over the first bytes of the scores buffer. */
static void s_kvlen_subbuffer_of_scores(fixture *f)
{
    f->desc.kv_lengths = fx_sub(f, base(f, BUF_SCORES), 0, B * 4);
}

/* ---- clattn_softmax ---- */
MUT(x_null_desc, f->sdescp = NULL)
MUT(x_null_in, f->sinp = NULL)
MUT(x_null_out, f->soutp = NULL)
MUT(x_in_null_buffer, f->sin.buffer = NULL)
MUT(x_out_null_buffer, f->sout.buffer = NULL)
MUT(x_batch_zero, f->sdesc.batch = 0)
MUT(x_batch_negative, f->sdesc.batch = -1)
MUT(x_heads_zero, f->sdesc.heads = 0)
MUT(x_heads_negative, f->sdesc.heads = -1)
MUT(x_rows_zero, f->sdesc.rows = 0)
MUT(x_rows_negative, f->sdesc.rows = -1)
MUT(x_cols_zero, f->sdesc.cols = 0)
MUT(x_cols_negative, f->sdesc.cols = -1)
MUT(x_cols_above_int32, f->sdesc.cols = BIG + 1)
MUT(x_batch_heads_too_large, f->sdesc.batch = BIG; f->sdesc.heads = BIG)
MUT(x_in_shape0, f->sin.shape[0] = B + 1)
MUT(x_in_shape1, f->sin.shape[1] = HQ + 1)
MUT(x_in_shape2, f->sin.shape[2] = SQ + 1)
MUT(x_in_shape3, f->sin.shape[3] = SKV + 1)
MUT(x_out_shape0, f->sout.shape[0] = 1)
MUT(x_out_shape1, f->sout.shape[1] = 1)
MUT(x_out_shape2, f->sout.shape[2] = 1)
MUT(x_out_shape3, f->sout.shape[3] = SKV - 1)
MUT(x_scale_nan, f->sdesc.scale = NAN)
MUT(x_scale_inf, f->sdesc.scale = INFINITY)

/* in and out on one buffer, five floats apart: neither the same view nor disjoint. */
static void x_out_overlaps_in(fixture *f)
{
    cl_mem m = fx_new(f, (NM + 5) * 4, 0);
    f->sin.buffer = m;
    f->sout.buffer = m;
    f->sout.offset = 5;
}

/* in is a sub-buffer over the same bytes as out's buffer, five floats on: they overlap. */
static void x_in_subbuffer_overlaps_out(fixture *f)
{
    cl_mem parent = fx_new(f, (NM + 5) * 4, 0);
    f->sout.buffer = parent;
    f->sout.offset = 5;
    f->sin.buffer = fx_sub(f, parent, 0, (NM + 5) * 4);
}

MUT(x_rows_above_max, f->sdesc.rows = CLATTN_MAX_SEQ + 1)
MUT(x_in_write_only, f->sin.buffer = fx_new_flags(f, NM * 4, CL_MEM_WRITE_ONLY))
MUT(x_out_same_buffer_other_dtype, f->sout = f->sin; f->sout.dtype = CLATTN_F16)
/* in reads batch 0 twice (stride 0 broadcasts an input); out is in's baseline view. */
MUT(x_out_same_buffer_other_strides, f->sout = f->sin; f->sin.stride[0] = 0)
MUT(x_in_place, f->sout = f->sin)
/* One head: in and out address the same elements although their (unused) head strides differ. */
MUT(x_in_place_unused_stride, f->sdesc.heads = 1; f->sin.shape[1] = 1; f->smask.shape[1] = 1; f->sout = f->sin;
    f->sout.stride[1] = 12345)
MUT(x_mask_cols, f->smask.shape[3] = SKV - 1)
MUT(x_mask_heads_2, f->smask.shape[1] = 2)
MUT(x_mask_bf16, f->smask.dtype = CLATTN_BF16)
MUT(x_mask_overlaps_out, f->smask.buffer = base(f, BUF_SOUT))
MUT(x_mask_broadcast_ok, f->smask.shape[0] = 1; f->smask.shape[1] = 1; f->smask.shape[2] = 1)
MUT(x_out_self_overlap, f->sout.stride[2] = SKV - 1)
MUT(x_out_one_short, f->sout.offset = 1)
MUT(x_in_dtype_99, f->sin.dtype = (clattn_dtype)99)
MUT(x_in_stride_negative, f->sin.stride[1] = -1)
MUT(x_kvlen_too_small, f->sdesc.kv_lengths = fx_new(f, 4, 0))
MUT(x_in_foreign, f->sin.buffer = fx_new(f, NM * 4, 1))
MUT(x_wait_null, f->num_wait = 3; f->wait = NULL)

/* ---- clattn_merge ---- */
MUT(m_parts_zero, f->num_parts = 0)
MUT(m_parts_negative, f->num_parts = -1)
MUT(m_parts_too_many, f->num_parts = 4097)
MUT(m_one_part, f->num_parts = 1)
MUT(m_null_part_out, f->part_outp = NULL)
MUT(m_null_part_lse, f->part_lsep = NULL)
MUT(m_null_out, f->moutp = NULL)
MUT(m_out_shape_zero, f->mout.shape[0] = 0)
MUT(m_out_shape_negative, f->mout.shape[2] = -3)
MUT(m_out_dim_513, f->mout.shape[3] = 513)
MUT(m_out_rows_too_large, f->mout.shape[0] = BIG; f->mout.shape[1] = BIG)
/* 2^21 * 2^21 * 2^22 = 2^64: a product computed without an overflow check wraps to 0. */
MUT(m_out_rows_wrap, f->mout.shape[0] = INT64_C(1) << 21; f->mout.shape[1] = INT64_C(1) << 21;
    f->mout.shape[2] = INT64_C(1) << 22)
MUT(m_part_out_shape, f->part_out[1].shape[2] = SQ + 1)
MUT(m_part_lse_shape, f->part_lse[0].shape[3] = 2)
MUT(m_part_lse_f16, f->part_lse[1].dtype = CLATTN_F16)
MUT(m_lse_f16, f->mlse.dtype = CLATTN_F16)
MUT(m_lse_shape, f->mlse.shape[2] = SQ + 1)
MUT(m_out_is_part, f->mout.buffer = base(f, BUF_PO0))
MUT(m_part_lse_is_out, f->part_lse[1].buffer = base(f, BUF_MOUT))
MUT(m_part_lse_is_lse, f->part_lse[0].buffer = base(f, BUF_MLSE))
MUT(m_lse_overlaps_out, f->mlse.buffer = base(f, BUF_MOUT); f->mlse.offset = (int64_t)(NO - NL))
MUT(m_part_null_buffer, f->part_out[1].buffer = NULL)
MUT(m_part_one_short, f->part_out[1].offset = 1)
MUT(m_part_dtype_99, f->part_out[0].dtype = (clattn_dtype)99)
MUT(m_out_self_overlap, f->mout.stride[2] = DV / 2)
MUT(m_part_foreign, f->part_out[0].buffer = fx_new(f, NO * 4, 1))
MUT(m_null_lse_ok, f->mlsep = NULL)
MUT(m_wait_null, f->num_wait = 1; f->wait = NULL)
MUT(m_part_subbuffer_of_out, f->part_out[0].buffer = fx_sub(f, base(f, BUF_MOUT), 0, NO * 4))
MUT(m_out_read_only, f->mout.buffer = fx_new_flags(f, NO * 4, CL_MEM_READ_ONLY))

/* ---- clattn_attention_host ---- */
MUT(h_null_desc, f->hdescp = NULL)
MUT(h_null_q, f->hqp = NULL)
MUT(h_null_k, f->hkp = NULL)
MUT(h_null_v, f->hvp = NULL)
MUT(h_null_out, f->houtp = NULL)
MUT(h_mask, f->hdesc.mask = &f->mask)
MUT(h_kv_lengths, f->hdesc.kv_lengths = base(f, BUF_KVLEN))
MUT(h_lse_tensor, f->hdesc.lse = &f->lse)
MUT(h_probabilities, f->hdesc.probabilities = &f->probs)
MUT(h_dtype_99, f->hdtype = (clattn_dtype)99)
MUT(h_dtype_q4_0, f->hdtype = CLATTN_Q4_0)
MUT(h_dtype_negative, f->hdtype = (clattn_dtype)-1)
MUT(h_seq_q_zero, f->hdesc.seq_q = 0)
MUT(h_head_dim_577, f->hdesc.head_dim = 577; f->hdesc.scale = 0.05f)
MUT(h_heads_q_not_multiple, f->hdesc.heads_q = 3)
MUT(h_scale_nan, f->hdesc.scale = NAN)
MUT(h_null_lse_ok, f->hlsep = NULL)
/* K of 2^12 x heads_kv x 2^30 x 256 f32 values: past 2^52 bytes, no host array that large. */
MUT(h_k_past_host_memory, (f->hdesc.batch = 1 << 12, f->hdesc.seq_kv = 1 << 30, f->hdesc.head_dim = 256))
/* K of 2 x 2 x seq_kv x 256 f32 values, 4 KiB a key: one key more than the device's largest
 * allocation holds, within the host bound (else skipped: a 32-bit host whose device allocates
 * 2 GiB). The host arrays are the fixture's small ones: nothing may read them. */
static void h_k_past_max_alloc(fixture *f)
{
    cl_ulong max_alloc = 0;
    check_cl(clGetDeviceInfo(clattn_device(f->ctx), CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc,
                             NULL),
             "clGetDeviceInfo(CL_DEVICE_MAX_MEM_ALLOC_SIZE)");
    const double keys = floor((double)max_alloc / 4096) + 1;
    if (keys * 4096 > (double)SIZE_MAX / 2 || keys > (double)CLATTN_MAX_SEQ) {
        print_message("skipping: one key past the %llu-byte max allocation is past the host bound\n",
                      (unsigned long long)max_alloc);
        skip();
    }
    f->hdesc.seq_kv = (int64_t)keys;
    f->hdesc.head_dim = 256;
}

/* ---- clattn_create / clattn_create_from_queue ---- */
MUT(c_null_out, f->create_out = NULL)
MUT(c_null_queue, f->create_queue = NULL)

static void c_out_of_order(fixture *f)
{
    cl_int err;
    f->ooo_queue = clCreateCommandQueue(clattn_cl_context(f->ctx), clattn_device(f->ctx),
                                        CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    if (err != CL_SUCCESS) {
        f->ooo_queue = NULL;
        print_message("skipping: the device refuses out-of-order queues (%d)\n", (int)err);
        skip();
    }
    f->create_queue = f->ooo_queue;
}

/* ================================= the table ================================= */

#define INV CLATTN_INVALID_ARGUMENT
#define UNS CLATTN_UNSUPPORTED
#define OK CLATTN_SUCCESS

static const row rows[] = {
    /* clattn_attention */
    {"baseline", E_ATTENTION, NULL, OK, "", NULL},
    {"unfused_with_probabilities", E_ATTENTION, a_unfused_probs_ok, OK, "", NULL},
    {"out_shares_buffer_disjoint", E_ATTENTION, a_out_shares_buffer_disjoint, OK, "", NULL},
    {"null_ctx", E_ATTENTION, a_null_ctx, INV, NULL, NULL},
    {"null_desc", E_ATTENTION, a_null_desc, INV, "desc must not be NULL", NULL},
    {"null_q", E_ATTENTION, a_null_q, INV, "q must not be NULL", NULL},
    {"null_k", E_ATTENTION, a_null_k, INV, "k must not be NULL", NULL},
    {"null_v", E_ATTENTION, a_null_v, INV, "v must not be NULL", NULL},
    {"null_out", E_ATTENTION, a_null_out, INV, "out must not be NULL", NULL},
    {"q_null_buffer", E_ATTENTION, a_q_null_buffer, INV, "q->buffer", "NULL"},
    {"k_null_buffer", E_ATTENTION, a_k_null_buffer, INV, "k->buffer", "NULL"},
    {"v_null_buffer", E_ATTENTION, a_v_null_buffer, INV, "v->buffer", "NULL"},
    {"out_null_buffer", E_ATTENTION, a_out_null_buffer, INV, "out->buffer", "NULL"},
    {"mask_null_buffer", E_ATTENTION, a_mask_null_buffer, INV, "desc->mask->buffer", "NULL"},
    {"lse_null_buffer", E_ATTENTION, a_lse_null_buffer, INV, "desc->lse->buffer", "NULL"},
    {"probabilities_null_buffer", E_ATTENTION, a_probs_null_buffer, INV, "desc->probabilities->buffer", "NULL"},
    {"batch_zero", E_ATTENTION, a_batch_zero, INV, "desc->batch", "0"},
    {"batch_negative", E_ATTENTION, a_batch_negative, INV, "desc->batch", "-1"},
    {"heads_q_zero", E_ATTENTION, a_heads_q_zero, INV, "desc->heads_q", "0"},
    {"heads_q_negative", E_ATTENTION, a_heads_q_negative, INV, "desc->heads_q", "-1"},
    {"heads_kv_zero", E_ATTENTION, a_heads_kv_zero, INV, "desc->heads_kv", "0"},
    {"heads_kv_negative", E_ATTENTION, a_heads_kv_negative, INV, "desc->heads_kv", "-1"},
    {"seq_q_zero", E_ATTENTION, a_seq_q_zero, INV, "desc->seq_q", "0"},
    {"seq_q_negative", E_ATTENTION, a_seq_q_negative, INV, "desc->seq_q", "-1"},
    {"seq_kv_zero", E_ATTENTION, a_seq_kv_zero, INV, "desc->seq_kv", "0"},
    {"seq_kv_negative", E_ATTENTION, a_seq_kv_negative, INV, "desc->seq_kv", "-1"},
    {"head_dim_zero", E_ATTENTION, a_head_dim_zero, INV, "desc->head_dim", "0"},
    {"head_dim_negative", E_ATTENTION, a_head_dim_negative, INV, "desc->head_dim", "-1"},
    {"head_dim_v_negative", E_ATTENTION, a_head_dim_v_negative, INV, "desc->head_dim_v", "-1"},
    {"heads_q_not_multiple_of_heads_kv", E_ATTENTION, a_heads_q_not_multiple, INV, "heads_q", "3"},
    {"heads_kv_not_a_divisor", E_ATTENTION, a_heads_kv_not_divisor, INV, "heads_kv", "3"},
    {"heads_kv_above_heads_q", E_ATTENTION, a_heads_kv_above_heads_q, INV, "heads_kv", "8"},
    {"head_dim_577", E_ATTENTION, a_head_dim_577, UNS, "head_dim", "577"},
    {"head_dim_v_513", E_ATTENTION, a_head_dim_v_513, UNS, "head_dim_v", "513"},
    {"batch_above_int32", E_ATTENTION, a_batch_above_int32, INV, "desc->batch", "2147483648"},
    {"seq_q_above_int32", E_ATTENTION, a_seq_q_above_int32, INV, "desc->seq_q", "2147483648"},
    {"seq_kv_above_int32", E_ATTENTION, a_seq_kv_above_int32, INV, "desc->seq_kv", "2147483648"},
    {"heads_kv_int64_max", E_ATTENTION, a_heads_kv_int64_max, INV, "desc->heads_kv", "9223372036854775807"},
    {"head_dim_above_int32", E_ATTENTION, a_head_dim_above_int32, INV, "desc->head_dim", "2147483648"},
    {"rows_product_overflows_64_bits", E_ATTENTION, a_rows_overflow_64, INV, "batch x heads_q x seq_q", NULL},
    {"rows_product_above_limit", E_ATTENTION, a_rows_above_limit, INV, "batch x heads_q x seq_q", NULL},
    {"huge_batch_heads_small_buffers", E_ATTENTION, a_huge_batch_heads, INV, "q needs", "768"},
    {"huge_seq_kv_small_buffers", E_ATTENTION, a_huge_seq_kv, INV, "k needs", "640"},
    {"q_shape_batch", E_ATTENTION, a_q_shape0, INV, "q->shape[0]", "3"},
    {"q_shape_heads", E_ATTENTION, a_q_shape1, INV, "q->shape[1]", "5"},
    {"q_shape_seq", E_ATTENTION, a_q_shape2, INV, "q->shape[2]", "4"},
    {"q_shape_dim", E_ATTENTION, a_q_shape3, INV, "q->shape[3]", "9"},
    {"k_shape_batch", E_ATTENTION, a_k_shape0, INV, "k->shape[0]", "3"},
    {"k_shape_heads", E_ATTENTION, a_k_shape1, INV, "k->shape[1]", "3"},
    {"k_shape_seq", E_ATTENTION, a_k_shape2, INV, "k->shape[2]", "6"},
    {"k_shape_dim", E_ATTENTION, a_k_shape3, INV, "k->shape[3]", "9"},
    {"v_shape_batch", E_ATTENTION, a_v_shape0, INV, "v->shape[0]", "3"},
    {"v_shape_heads", E_ATTENTION, a_v_shape1, INV, "v->shape[1]", "3"},
    {"v_shape_seq", E_ATTENTION, a_v_shape2, INV, "v->shape[2]", "6"},
    {"v_shape_dim", E_ATTENTION, a_v_shape3, INV, "v->shape[3]", "5"},
    {"out_shape_batch", E_ATTENTION, a_out_shape0, INV, "out->shape[0]", "3"},
    {"out_shape_heads", E_ATTENTION, a_out_shape1, INV, "out->shape[1]", "5"},
    {"out_shape_seq", E_ATTENTION, a_out_shape2, INV, "out->shape[2]", "4"},
    {"out_shape_dim", E_ATTENTION, a_out_shape3, INV, "out->shape[3]", "5"},
    {"k_heads_equal_heads_q", E_ATTENTION, a_k_shape1_is_heads_q, INV, "k->shape[1]", "4"},
    {"q_shape_zero", E_ATTENTION, a_q_shape_zero, INV, "q->shape[2]", "0"},
    {"q_offset_negative", E_ATTENTION, a_q_offset_negative, INV, "q->offset", "-1"},
    {"mask_offset_negative", E_ATTENTION, a_mask_offset_negative, INV, "desc->mask->offset", "-5"},
    {"k_stride_negative", E_ATTENTION, a_k_stride_negative, INV, "k->stride[2]", "-8"},
    {"v_stride_negative", E_ATTENTION, a_v_stride_negative, INV, "v->stride[1]", "-1"},
    {"out_stride_negative", E_ATTENTION, a_out_stride_negative, INV, "out->stride[0]", "-1"},
    {"q_one_element_short_offset", E_ATTENTION, a_q_one_short_offset, INV, "q needs 772", "768"},
    {"k_one_element_short_offset", E_ATTENTION, a_k_one_short_offset, INV, "k needs 644", "640"},
    {"v_one_element_short_offset", E_ATTENTION, a_v_one_short_offset, INV, "v needs 324", "320"},
    {"out_one_element_short_offset", E_ATTENTION, a_out_one_short_offset, INV, "out needs 388", "384"},
    {"mask_one_element_short_offset", E_ATTENTION, a_mask_one_short_offset, INV, "desc->mask needs 484", "480"},
    {"lse_one_element_short_offset", E_ATTENTION, a_lse_one_short_offset, INV, "desc->lse needs 100", "96"},
    {"probabilities_one_element_short", E_ATTENTION, a_probs_one_short_offset, INV, "desc->probabilities needs 484", "480"},
    {"q_one_element_short_stride", E_ATTENTION, a_q_one_short_stride, INV, "q needs 772", "768"},
    {"v_buffer_one_element_short", E_ATTENTION, a_v_one_short_buffer, INV, "v needs 320", "316"},
    {"mask_f16_buffer_one_byte_short", E_ATTENTION, a_mask_f16_one_byte_short, INV, "desc->mask needs 240", "239"},
    {"q_offset_int64_max", E_ATTENTION, a_q_offset_int64_max, INV, "q: offset", "overflow"},
    {"q_stride_2_62", E_ATTENTION, a_q_stride_2_62, INV, "q: offset", "overflow"},
    {"out_stride_2_62", E_ATTENTION, a_out_stride_2_62, INV, "out: offset", "overflow"},
    {"v_offset_plus_stride_2_62", E_ATTENTION, a_v_offset_and_stride_2_62, INV, "v: offset", "overflow"},
    {"k_stride_int64_max", E_ATTENTION, a_k_stride_int64_max, INV, "k: offset", "overflow"},
    {"mask_stride_2_62", E_ATTENTION, a_mask_stride_2_62, INV, "desc->mask: offset", "overflow"},
    {"k_f16_q_f32", E_ATTENTION, a_k_f16, INV, "k->dtype", "f16"},
    {"v_f16_q_f32", E_ATTENTION, a_v_f16, INV, "v->dtype", "f16"},
    {"out_bf16_q_f32", E_ATTENTION, a_out_bf16, INV, "out->dtype", "bf16"},
    {"q_dtype_99", E_ATTENTION, a_q_dtype_99, INV, "q->dtype", "99"},
    {"q_dtype_negative", E_ATTENTION, a_q_dtype_negative, INV, "q->dtype", "-1"},
    {"k_dtype_99", E_ATTENTION, a_k_dtype_99, INV, "k->dtype", "99"},
    {"q_q8_0", E_ATTENTION, a_q_q8_0, INV, "q->dtype", "q8_0"},
    {"out_i8", E_ATTENTION, a_out_i8, INV, "out->dtype", "i8"},
    {"mask_fp8", E_ATTENTION, a_mask_fp8, INV, "desc->mask->dtype", "fp8_e4m3"},
    {"k_i8_no_scales", E_ATTENTION, a_k_i8_no_scales, INV, "k_scales", "i8"},
    {"mask_bf16", E_ATTENTION, a_mask_bf16, INV, "desc->mask->dtype", "bf16"},
    {"mask_dtype_99", E_ATTENTION, a_mask_dtype_99, INV, "desc->mask->dtype", "99"},
    {"mask_keys_not_seq_kv", E_ATTENTION, a_mask_keys, INV, "desc->mask->shape[3]", "4"},
    {"mask_heads_2_of_4", E_ATTENTION, a_mask_heads_2, INV, "desc->mask->shape[1]", "2"},
    {"mask_rows_2_of_3", E_ATTENTION, a_mask_rows, INV, "desc->mask->shape[2]", "2"},
    {"mask_batch_3_of_2", E_ATTENTION, a_mask_batch, INV, "desc->mask->shape[0]", "3"},
    {"lse_dim_2", E_ATTENTION, a_lse_dim_2, INV, "desc->lse->shape[3]", "2"},
    {"lse_rows", E_ATTENTION, a_lse_rows, INV, "desc->lse->shape[2]", "4"},
    {"lse_f16", E_ATTENTION, a_lse_f16, INV, "desc->lse->dtype", "f16"},
    {"lse_self_overlap", E_ATTENTION, a_lse_self_overlap, INV, "desc->lse", "stride 0"},
    {"probabilities_with_fused", E_ATTENTION, a_probs_fused, INV, "probabilities", "FUSED"},
    {"probabilities_shape", E_ATTENTION, a_probs_shape, INV, "desc->probabilities->shape[3]", "4"},
    {"probabilities_self_overlap", E_ATTENTION, a_probs_self_overlap, INV, "desc->probabilities", "stride 1"},
    {"probabilities_overlap_q", E_ATTENTION, a_probs_overlaps_q, INV, "desc->probabilities overlaps", NULL},
    {"algorithm_9", E_ATTENTION, a_algorithm_9, INV, "desc->algorithm", "9"},
    {"algorithm_negative", E_ATTENTION, a_algorithm_negative, INV, "desc->algorithm", "-1"},
    {"scale_nan", E_ATTENTION, a_scale_nan, INV, "desc->scale", "nan"},
    {"scale_inf", E_ATTENTION, a_scale_inf, INV, "desc->scale", "inf"},
    {"scale_negative_inf", E_ATTENTION, a_scale_neg_inf, INV, "desc->scale", "-inf"},
    {"kv_lengths_too_small", E_ATTENTION, a_kvlen_too_small, INV, "kv_lengths", "8 bytes"},
    {"kv_lengths_other_context", E_ATTENTION, a_kvlen_foreign, INV, "kv_lengths", "another OpenCL context"},
    {"kv_lengths_image", E_ATTENTION, a_kvlen_image, INV, "kv_lengths is an image", "not a buffer"},
    {"out_image", E_ATTENTION, a_out_image, INV, "out->buffer is an image", "not a buffer"},
    {"q_image", E_ATTENTION, a_q_image, INV, "q->buffer is an image", "not a buffer"},
    {"out_overlaps_itself_seq", E_ATTENTION, a_out_self_overlap_seq, INV, "out is an output", "seq stride 3"},
    {"out_overlaps_itself_batch_stride_0", E_ATTENTION, a_out_batch_stride_zero, INV, "out is an output", "batch stride 0"},
    {"out_overlaps_itself_heads", E_ATTENTION, a_out_heads_alias_rows, INV, "out is an output", "stride 4"},
    {"out_overlaps_q", E_ATTENTION, a_out_overlaps_q, INV, "out overlaps", NULL},
    {"out_is_k", E_ATTENTION, a_out_is_k, INV, "out overlaps", NULL},
    {"out_overlaps_v", E_ATTENTION, a_out_overlaps_v, INV, "out overlaps", NULL},
    {"lse_overlaps_out", E_ATTENTION, a_lse_overlaps_out, INV, "desc->lse overlaps", NULL},
    {"lse_overlaps_q", E_ATTENTION, a_lse_overlaps_q, INV, "desc->lse overlaps", NULL},
    {"out_overlaps_mask", E_ATTENTION, a_out_overlaps_mask, INV, "mask", NULL},
    {"lse_overlaps_mask", E_ATTENTION, a_lse_overlaps_mask, INV, "mask", NULL},
    {"out_is_kv_lengths", E_ATTENTION, a_out_is_kv_lengths, INV, "kv_lengths", NULL},
    {"seq_kv_above_max", E_ATTENTION, a_seq_kv_above_max, INV, "desc->seq_kv", "2146435073"},
    {"seq_q_above_max", E_ATTENTION, a_seq_q_above_max, INV, "desc->seq_q", "2146435073"},
    {"group_rows_above_int32", E_ATTENTION, a_group_rows_above_int32, INV, "heads_q / heads_kv x seq_q", "65536"},
    {"group_rows_above_max_seq", E_ATTENTION, a_group_rows_above_max_seq, INV, "heads_q / heads_kv x seq_q", "1073217537"},
    {"batch_x_heads_q_above_int32", E_ATTENTION, a_batch_heads_above_int32, INV, "batch x heads_q", "65536"},
    {"q_subbuffer_of_out", E_ATTENTION, a_q_subbuffer_of_out, INV, "out overlaps", NULL},
    {"out_q_disjoint_subbuffers", E_ATTENTION, a_out_q_disjoint_subbuffers, OK, "", NULL},
    {"kv_lengths_subbuffer_of_out", E_ATTENTION, a_kvlen_subbuffer_of_out, INV, "kv_lengths overlaps", NULL},
    {"out_host_memory_overlaps_q", E_ATTENTION, a_out_host_overlaps_q, INV, "out overlaps", NULL},
    {"out_host_memory_disjoint_q", E_ATTENTION, a_out_host_disjoint_q, OK, "", NULL},
    {"out_read_only", E_ATTENTION, a_out_read_only, INV, "out is written", "CL_MEM_READ_ONLY"},
    {"lse_read_only", E_ATTENTION, a_lse_read_only, INV, "desc->lse is written", "CL_MEM_READ_ONLY"},
    {"v_write_only", E_ATTENTION, a_v_write_only, INV, "v is read", "CL_MEM_WRITE_ONLY"},
    {"kv_lengths_write_only", E_ATTENTION, a_kvlen_write_only, INV, "kv_lengths is read", "CL_MEM_WRITE_ONLY"},
    {"inputs_read_only_out_write_only", E_ATTENTION, a_inputs_read_only_ok, OK, "", NULL},
    {"unfused_probabilities_write_only", E_ATTENTION, a_unfused_probs_write_only_ok, OK, "", NULL},
    {"done_is_wait_0", E_ATTENTION, wait_done_alias, INV, "done points to wait[0]", NULL},
    {"wait_null_num_wait_1", E_ATTENTION, a_wait_null, INV, "wait", "1"},
    {"wait_contains_null", E_ATTENTION, a_wait_contains_null, INV, "wait[1]", "NULL"},
    {"q_other_context", E_ATTENTION, a_q_foreign, INV, "q->buffer", "another OpenCL context"},
    {"v_other_context", E_ATTENTION, a_v_foreign, INV, "v->buffer", "another OpenCL context"},
    {"out_other_context", E_ATTENTION, a_out_foreign, INV, "out->buffer", "another OpenCL context"},
    {"mask_other_context", E_ATTENTION, a_mask_foreign, INV, "desc->mask->buffer", "another OpenCL context"},
    {"lse_other_context", E_ATTENTION, a_lse_foreign, INV, "desc->lse->buffer", "another OpenCL context"},

    /* clattn_scores */
    {"baseline", E_SCORES, NULL, OK, "", NULL},
    {"null_ctx", E_SCORES, a_null_ctx, INV, NULL, NULL},
    {"null_desc", E_SCORES, a_null_desc, INV, "desc must not be NULL", NULL},
    {"null_q", E_SCORES, a_null_q, INV, "q must not be NULL", NULL},
    {"null_k", E_SCORES, a_null_k, INV, "k must not be NULL", NULL},
    {"null_scores", E_SCORES, s_null_scores, INV, "scores must not be NULL", NULL},
    {"scores_null_buffer", E_SCORES, s_scores_null_buffer, INV, "scores->buffer", "NULL"},
    {"scores_shape_keys", E_SCORES, s_scores_keys, INV, "scores->shape[3]", "4"},
    {"scores_shape_heads", E_SCORES, s_scores_heads, INV, "scores->shape[1]", "2"},
    {"scores_shape_rows", E_SCORES, s_scores_rows, INV, "scores->shape[2]", "4"},
    {"scores_is_q", E_SCORES, s_scores_is_q, INV, "scores overlaps", NULL},
    {"scores_overlaps_q_tail", E_SCORES, s_scores_overlaps_q, INV, "scores overlaps", NULL},
    {"scores_is_k", E_SCORES, s_scores_is_k, INV, "scores overlaps", NULL},
    {"scores_is_mask", E_SCORES, s_scores_is_mask, INV, "scores overlaps", NULL},
    {"scores_overlaps_itself", E_SCORES, s_scores_self_overlap, INV, "scores is an output", "stride 4"},
    {"scores_one_element_short", E_SCORES, s_scores_one_short, INV, "scores needs 484", "480"},
    {"scores_dtype_99", E_SCORES, s_scores_dtype_99, INV, "scores->dtype", "99"},
    {"scores_other_context", E_SCORES, s_scores_foreign, INV, "scores->buffer", "another OpenCL context"},
    {"seq_kv_zero", E_SCORES, a_seq_kv_zero, INV, "desc->seq_kv", "0"},
    {"heads_q_not_multiple_of_heads_kv", E_SCORES, a_heads_q_not_multiple, INV, "heads_q", "3"},
    {"head_dim_577", E_SCORES, a_head_dim_577, UNS, "head_dim", "577"},
    {"k_f16_q_f32", E_SCORES, a_k_f16, INV, "k->dtype", "f16"},
    {"q_shape_dim", E_SCORES, a_q_shape3, INV, "q->shape[3]", "9"},
    {"mask_bf16", E_SCORES, a_mask_bf16, INV, "desc->mask->dtype", "bf16"},
    {"mask_heads_2_of_4", E_SCORES, a_mask_heads_2, INV, "desc->mask->shape[1]", "2"},
    {"kv_lengths_too_small", E_SCORES, s_kvlen_too_small, INV, "kv_lengths", "4 bytes"},
    {"scale_nan", E_SCORES, a_scale_nan, INV, "desc->scale", "nan"},
    {"scores_read_only", E_SCORES, s_scores_read_only, INV, "scores is written", "CL_MEM_READ_ONLY"},
    {"kv_lengths_subbuffer_of_scores", E_SCORES, s_kvlen_subbuffer_of_scores, INV, "kv_lengths overlaps", NULL},
    {"done_is_wait_0", E_SCORES, wait_done_alias, INV, "done points to wait[0]", NULL},
    {"wait_null_num_wait_1", E_SCORES, a_wait_null, INV, "wait", "1"},
    {"wait_contains_null", E_SCORES, a_wait_contains_null, INV, "wait[1]", "NULL"},

    /* clattn_softmax */
    {"baseline", E_SOFTMAX, NULL, OK, "", NULL},
    {"in_place_same_view", E_SOFTMAX, x_in_place, OK, "", NULL},
    {"in_place_unused_head_stride", E_SOFTMAX, x_in_place_unused_stride, OK, "", NULL},
    {"mask_broadcast", E_SOFTMAX, x_mask_broadcast_ok, OK, "", NULL},
    {"null_ctx", E_SOFTMAX, a_null_ctx, INV, NULL, NULL},
    {"null_desc", E_SOFTMAX, x_null_desc, INV, "desc must not be NULL", NULL},
    {"null_in", E_SOFTMAX, x_null_in, INV, "in must not be NULL", NULL},
    {"null_out", E_SOFTMAX, x_null_out, INV, "out must not be NULL", NULL},
    {"in_null_buffer", E_SOFTMAX, x_in_null_buffer, INV, "in->buffer", "NULL"},
    {"out_null_buffer", E_SOFTMAX, x_out_null_buffer, INV, "out->buffer", "NULL"},
    {"batch_zero", E_SOFTMAX, x_batch_zero, INV, "desc->batch", "0"},
    {"batch_negative", E_SOFTMAX, x_batch_negative, INV, "desc->batch", "-1"},
    {"heads_zero", E_SOFTMAX, x_heads_zero, INV, "desc->heads", "0"},
    {"heads_negative", E_SOFTMAX, x_heads_negative, INV, "desc->heads", "-1"},
    {"rows_zero", E_SOFTMAX, x_rows_zero, INV, "desc->rows", "0"},
    {"rows_negative", E_SOFTMAX, x_rows_negative, INV, "desc->rows", "-1"},
    {"cols_zero", E_SOFTMAX, x_cols_zero, INV, "desc->cols", "0"},
    {"cols_negative", E_SOFTMAX, x_cols_negative, INV, "desc->cols", "-1"},
    {"cols_above_int32", E_SOFTMAX, x_cols_above_int32, INV, "desc->cols", "2147483648"},
    {"batch_x_heads_too_large", E_SOFTMAX, x_batch_heads_too_large, INV, "batch x heads", NULL},
    {"in_shape_batch", E_SOFTMAX, x_in_shape0, INV, "in->shape[0]", "3"},
    {"in_shape_heads", E_SOFTMAX, x_in_shape1, INV, "in->shape[1]", "5"},
    {"in_shape_rows", E_SOFTMAX, x_in_shape2, INV, "in->shape[2]", "4"},
    {"in_shape_cols", E_SOFTMAX, x_in_shape3, INV, "in->shape[3]", "6"},
    {"out_shape_batch", E_SOFTMAX, x_out_shape0, INV, "out->shape[0]", "1"},
    {"out_shape_heads", E_SOFTMAX, x_out_shape1, INV, "out->shape[1]", "1"},
    {"out_shape_rows", E_SOFTMAX, x_out_shape2, INV, "out->shape[2]", "1"},
    {"out_shape_cols", E_SOFTMAX, x_out_shape3, INV, "out->shape[3]", "4"},
    {"scale_nan", E_SOFTMAX, x_scale_nan, INV, "desc->scale", "nan"},
    {"scale_inf", E_SOFTMAX, x_scale_inf, INV, "desc->scale", "inf"},
    {"out_overlaps_in_other_view", E_SOFTMAX, x_out_overlaps_in, INV, "out overlaps in", NULL},
    {"out_same_buffer_other_dtype", E_SOFTMAX, x_out_same_buffer_other_dtype, INV, "out overlaps in", NULL},
    {"out_same_buffer_other_strides", E_SOFTMAX, x_out_same_buffer_other_strides, INV, "out overlaps in", NULL},
    {"mask_cols", E_SOFTMAX, x_mask_cols, INV, "desc->mask->shape[3]", "4"},
    {"mask_heads_2_of_4", E_SOFTMAX, x_mask_heads_2, INV, "desc->mask->shape[1]", "2"},
    {"mask_bf16", E_SOFTMAX, x_mask_bf16, INV, "desc->mask->dtype", "bf16"},
    {"mask_overlaps_out", E_SOFTMAX, x_mask_overlaps_out, INV, "desc->mask overlaps out", NULL},
    {"out_overlaps_itself", E_SOFTMAX, x_out_self_overlap, INV, "out is an output", "stride 4"},
    {"out_one_element_short", E_SOFTMAX, x_out_one_short, INV, "out needs 484", "480"},
    {"in_dtype_99", E_SOFTMAX, x_in_dtype_99, INV, "in->dtype", "99"},
    {"in_stride_negative", E_SOFTMAX, x_in_stride_negative, INV, "in->stride[1]", "-1"},
    {"kv_lengths_too_small", E_SOFTMAX, x_kvlen_too_small, INV, "kv_lengths", "4 bytes"},
    {"in_other_context", E_SOFTMAX, x_in_foreign, INV, "in->buffer", "another OpenCL context"},
    {"in_subbuffer_overlaps_out", E_SOFTMAX, x_in_subbuffer_overlaps_out, INV, "out overlaps in", NULL},
    {"rows_above_max", E_SOFTMAX, x_rows_above_max, INV, "desc->rows", "2146435073"},
    {"in_write_only", E_SOFTMAX, x_in_write_only, INV, "in is read", "CL_MEM_WRITE_ONLY"},
    {"done_is_wait_0", E_SOFTMAX, wait_done_alias, INV, "done points to wait[0]", NULL},
    {"wait_null_num_wait_3", E_SOFTMAX, x_wait_null, INV, "wait", "3"},
    {"wait_contains_null", E_SOFTMAX, a_wait_contains_null, INV, "wait[1]", "NULL"},

    /* clattn_merge */
    {"baseline", E_MERGE, NULL, OK, "", NULL},
    {"one_part", E_MERGE, m_one_part, OK, "", NULL},
    {"lse_null", E_MERGE, m_null_lse_ok, OK, "", NULL},
    {"null_ctx", E_MERGE, a_null_ctx, INV, NULL, NULL},
    {"num_parts_0", E_MERGE, m_parts_zero, INV, "num_parts", "0"},
    {"num_parts_negative", E_MERGE, m_parts_negative, INV, "num_parts", "-1"},
    {"num_parts_4097", E_MERGE, m_parts_too_many, INV, "num_parts", "4097"},
    {"null_part_out", E_MERGE, m_null_part_out, INV, "part_out", "NULL"},
    {"null_part_lse", E_MERGE, m_null_part_lse, INV, "part_lse", "NULL"},
    {"null_out", E_MERGE, m_null_out, INV, "out must not be NULL", NULL},
    {"out_shape_zero", E_MERGE, m_out_shape_zero, INV, "out->shape[0]", "0"},
    {"out_shape_negative", E_MERGE, m_out_shape_negative, INV, "out->shape[2]", "-3"},
    {"out_dim_513", E_MERGE, m_out_dim_513, UNS, "out->shape[3]", "513"},
    {"out_rows_too_large", E_MERGE, m_out_rows_too_large, INV, "batch x heads x seq", NULL},
    {"out_rows_product_wraps", E_MERGE, m_out_rows_wrap, INV, "out", NULL},
    {"part_out_wrong_shape", E_MERGE, m_part_out_shape, INV, "part_out[1]->shape[2]", "4"},
    {"part_lse_wrong_shape", E_MERGE, m_part_lse_shape, INV, "part_lse[0]->shape[3]", "2"},
    {"part_lse_f16", E_MERGE, m_part_lse_f16, INV, "part_lse[1]->dtype", "f16"},
    {"lse_f16", E_MERGE, m_lse_f16, INV, "lse->dtype", "f16"},
    {"lse_wrong_shape", E_MERGE, m_lse_shape, INV, "lse->shape[2]", "4"},
    {"out_is_part_0", E_MERGE, m_out_is_part, INV, "part 0 overlaps", NULL},
    {"part_lse_1_is_out", E_MERGE, m_part_lse_is_out, INV, "part 1 overlaps", NULL},
    {"part_lse_0_is_lse", E_MERGE, m_part_lse_is_lse, INV, "part 0 overlaps", NULL},
    {"lse_overlaps_out", E_MERGE, m_lse_overlaps_out, INV, "lse overlaps out", NULL},
    {"part_null_buffer", E_MERGE, m_part_null_buffer, INV, "part_out[1]->buffer", "NULL"},
    {"part_one_element_short", E_MERGE, m_part_one_short, INV, "part_out[1] needs 388", "384"},
    {"part_dtype_99", E_MERGE, m_part_dtype_99, INV, "part_out[0]->dtype", "99"},
    {"out_overlaps_itself", E_MERGE, m_out_self_overlap, INV, "out is an output", "stride 2"},
    {"part_other_context", E_MERGE, m_part_foreign, INV, "part_out[0]->buffer", "another OpenCL context"},
    {"part_subbuffer_of_out", E_MERGE, m_part_subbuffer_of_out, INV, "part 0 overlaps", NULL},
    {"out_read_only", E_MERGE, m_out_read_only, INV, "out is written", "CL_MEM_READ_ONLY"},
    {"done_is_wait_0", E_MERGE, wait_done_alias, INV, "done points to wait[0]", NULL},
    {"wait_null_num_wait_1", E_MERGE, m_wait_null, INV, "wait", "1"},
    {"wait_contains_null", E_MERGE, a_wait_contains_null, INV, "wait[1]", "NULL"},

    /* clattn_attention_host */
    {"baseline", E_HOST, NULL, OK, "", NULL},
    {"lse_null", E_HOST, h_null_lse_ok, OK, "", NULL},
    {"null_ctx", E_HOST, a_null_ctx, INV, NULL, NULL},
    {"null_desc", E_HOST, h_null_desc, INV, "desc must not be NULL", NULL},
    {"null_q", E_HOST, h_null_q, INV, "q, k, v and out", "NULL"},
    {"null_k", E_HOST, h_null_k, INV, "q, k, v and out", "NULL"},
    {"null_v", E_HOST, h_null_v, INV, "q, k, v and out", "NULL"},
    {"null_out", E_HOST, h_null_out, INV, "q, k, v and out", "NULL"},
    {"mask_given", E_HOST, h_mask, INV, "mask", NULL},
    {"kv_lengths_given", E_HOST, h_kv_lengths, INV, "kv_lengths", NULL},
    {"lse_tensor_given", E_HOST, h_lse_tensor, INV, "lse", NULL},
    {"probabilities_given", E_HOST, h_probabilities, INV, "probabilities", NULL},
    {"dtype_99", E_HOST, h_dtype_99, INV, "dtype", "99"},
    {"dtype_q4_0", E_HOST, h_dtype_q4_0, INV, "dtype", "q4_0"},
    {"dtype_negative", E_HOST, h_dtype_negative, INV, "dtype", "-1"},
    {"seq_q_zero", E_HOST, h_seq_q_zero, INV, "seq_q", "0"},
    {"head_dim_577", E_HOST, h_head_dim_577, UNS, "head_dim", "577"},
    {"heads_q_not_multiple_of_heads_kv", E_HOST, h_heads_q_not_multiple, INV, "heads_q", "3"},
    {"scale_nan", E_HOST, h_scale_nan, INV, "desc->scale", "nan"},
    {"k_past_host_memory", E_HOST, h_k_past_host_memory, INV, "bytes of host memory", NULL},
    {"k_past_max_alloc", E_HOST, h_k_past_max_alloc, UNS, "k needs", "max allocation"},

    /* clattn_create, clattn_create_from_queue */
    {"null_ctx_out", E_CREATE, c_null_out, INV, "ctx must not be NULL", NULL},
    {"null_queue", E_CREATE_FROM_QUEUE, c_null_queue, INV, "queue must not be NULL", NULL},
    {"null_ctx_out", E_CREATE_FROM_QUEUE, c_null_out, INV, "ctx must not be NULL", NULL},
    {"out_of_order_queue", E_CREATE_FROM_QUEUE, c_out_of_order, UNS, "out-of-order", NULL},
};

/* ================================== main ================================== */

int main(void)
{
    static struct CMUnitTest tests[N_OF(rows)];
    static char names[N_OF(rows)][96];
    for (size_t i = 0; i < N_OF(rows); i++) {
        snprintf(names[i], sizeof names[i], "%s/%s", entry_names[rows[i].entry], rows[i].name);
        tests[i] = (struct CMUnitTest){names[i], test_row, setup, teardown, (void *)&rows[i]};
    }
    /* A copy-pasted row would otherwise run twice under one name and hide the other. */
    for (size_t i = 0; i < N_OF(rows); i++)
        for (size_t j = i + 1; j < N_OF(rows); j++)
            if (strcmp(names[i], names[j]) == 0) {
                fprintf(stderr, "test_bad_input: duplicate test name %s\n", names[i]);
                return 1;
            }
    const size_t n = tu_filter_tests("bad_input", tests, N_OF(rows));
    const int failed = _cmocka_run_group_tests("bad_input", tests, n, NULL, NULL);
    clattn_release(g_ctx);
    return failed;
}
