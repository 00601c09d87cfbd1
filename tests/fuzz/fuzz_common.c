/* Shared pieces of the entry-point fuzz harnesses; see fuzz_common.h. */
#include "fuzz_common.h"

#include "clattn_ref.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h" /* tu_load, tu_close: plain functions, no cmocka state involved */

/* =============================== bytes =============================== */

uint8_t fz_u8(fz_reader *r)
{
    if (r->n == 0)
        return 0;
    r->n--;
    return *r->p++;
}

uint64_t fz_u64(fz_reader *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
        v |= (uint64_t)fz_u8(r) << (8 * i);
    return v;
}

static const int64_t edges[] = {0x7fffffffLL,
                                0x80000000LL,
                                0xffffffffLL,
                                0x100000000LL,
                                INT64_MAX,
                                INT64_MIN,
                                (int64_t)1 << 40,
                                (int64_t)1 << 62,
                                -((int64_t)1 << 62),
                                65,
                                257,
                                4097,
                                (int64_t)0x7fffffff * 64 + 1,
                                INT64_MAX / 2 + 1};

static int64_t edge(fz_reader *r)
{
    return edges[fz_u8(r) % (sizeof edges / sizeof edges[0])];
}

int64_t fz_count(fz_reader *r)
{
    const uint8_t sel = fz_u8(r) % 16;
    if (sel < 10)
        return 1 + fz_u8(r) % 8;
    switch (sel) {
    case 10:
        return 0;
    case 11:
        return -1 - (int64_t)(fz_u8(r) % 4);
    case 12:
        return edge(r);
    case 13:
        return 9 + fz_u8(r) % 56;
    case 14:
        return (int64_t)fz_u64(r);
    default:
        return 1;
    }
}

int64_t fz_int(fz_reader *r)
{
    const uint8_t sel = fz_u8(r) % 8;
    if (sel < 4)
        return fz_u8(r) % 16;
    switch (sel) {
    case 4:
        return -1 - (int64_t)(fz_u8(r) % 4);
    case 5:
        return edge(r);
    case 6:
        return (int64_t)fz_u64(r);
    default:
        return 16 + (int64_t)fz_u8(r) * 3;
    }
}

clattn_dtype fz_dtype(fz_reader *r, clattn_dtype usual)
{
    const uint8_t sel = fz_u8(r) % 16;
    if (sel < 12)
        return usual;
    if (sel < 15)
        return (clattn_dtype)(((int)usual + 1 + sel % 2) % 3);
    static const int invalid[] = {8, -1, 255, 0x7fffffff}; /* 3-7: the KV-cache types */
    return (clattn_dtype)invalid[fz_u8(r) % 4];
}

float fz_scale(fz_reader *r)
{
    static const float choices[] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.5f,
                                    -1.0f, 3.0f, 1e-30f, 1e30f, INFINITY, NAN, -INFINITY, 0.0f};
    const uint8_t sel = fz_u8(r) % 16;
    if (sel != 15)
        return choices[sel];
    uint32_t bits = (uint32_t)fz_u64(r);
    float x;
    memcpy(&x, &bits, sizeof x);
    /* Finite scales stay where |logit| < FLT_MAX/2, the documented limit (|q·k| < 2^10 here). */
    if (isfinite(x) && fabsf(x) > 1e30f)
        x = copysignf(1e30f, x);
    return x;
}

/* =============================== context, buffers, events =============================== */

void fz_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\n==clattn-fuzz== contract violation: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

clattn_context *fz_context(void)
{
    static clattn_context *ctx;
    if (ctx == NULL && clattn_create(NULL, &ctx) != CLATTN_SUCCESS) {
        fprintf(stderr, "clattn fuzz: no OpenCL device: %s\n", clattn_last_error(NULL));
        abort();
    }
    return ctx;
}

void fz_begin(fz_state *s, const uint8_t *data, size_t size)
{
    memset(s, 0, sizeof *s);
    s->ctx = fz_context();
    s->in.p = data;
    s->in.n = size;
}

void fz_end(fz_state *s)
{
    clFinish(clattn_queue(s->ctx));
    for (int i = 0; i < s->nbuf; ++i) {
        clReleaseMemObject(s->buf[i].mem);
        free(s->buf[i].img);
    }
    for (int i = 0; i < s->nevents; ++i)
        clReleaseEvent(s->events[i]);
    s->nbuf = s->nevents = 0;
}

/* A tiny generator for buffer contents beyond the few bytes the input spends on them. */
static uint32_t lcg(uint32_t *x)
{
    *x = *x * 1664525u + 1013904223u;
    return *x >> 8;
}

void fz_fill_moderate(unsigned char *p, size_t bytes, uint32_t seed)
{
    /* 16-bit words sign | [0x3000, 0x3fff]: as f16 in [2^-3, 2), as bf16 in [2^-31, 2), and a pair
     * as f32 with the high word's exponent, in [2^-31, 2). */
    uint32_t x = seed;
    for (size_t i = 0; i + 2 <= bytes; i += 2) {
        const uint32_t r = lcg(&x);
        const uint16_t w = (uint16_t)(((r & 1u) << 15) | (0x3000u + ((r >> 1) & 0xfffu)));
        memcpy(p + i, &w, 2);
    }
    if (bytes % 2)
        p[bytes - 1] = 0x30;
}

int fz_new_buffer(fz_state *s, size_t bytes, int ints)
{
    if (s->nbuf == FZ_MAX_BUFS)
        return -1;
    if (bytes == 0)
        bytes = 1;
    if (bytes > FZ_MAX_BYTES)
        bytes = FZ_MAX_BYTES;
    fz_buf *b = &s->buf[s->nbuf];
    b->img = malloc(bytes);
    if (b->img == NULL)
        fz_die("out of host memory");
    uint32_t x = fz_u8(&s->in) * 2654435761u + (uint32_t)s->nbuf;
    if (ints) {
        /* Key lengths: the first few from the input (-2..29), the rest from the generator. */
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
            const int32_t v = i < 32 ? (int32_t)(fz_u8(&s->in) % 32) - 2 : (int32_t)(lcg(&x) % 40) - 2;
            memcpy(b->img + i, &v, 4);
        }
        for (size_t i = bytes / 4 * 4; i < bytes; ++i)
            b->img[i] = 0;
    } else {
        fz_fill_moderate(b->img, bytes, x);
    }
    cl_int err;
    b->mem = clCreateBuffer(clattn_cl_context(s->ctx), CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (b->mem == NULL || err != CL_SUCCESS)
        fz_die("clCreateBuffer(%zu) failed: %d", bytes, (int)err);
    err = clEnqueueWriteBuffer(clattn_queue(s->ctx), b->mem, CL_TRUE, 0, bytes, b->img, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        fz_die("clEnqueueWriteBuffer failed: %d", (int)err);
    b->bytes = bytes;
    return s->nbuf++;
}

static int64_t clip(int64_t v)
{
    return v < 1 ? 1 : v > 64 ? 64 : v;
}

static size_t esize(clattn_dtype dt)
{
    const size_t e = clattn_dtype_size(dt);
    return e != 0 ? e : 4;
}

/* Canonical [b][h][s][d] (or [b][s][h][d]) strides for the clipped shape, on a new buffer sized
 * for it plus or minus a few elements. */
static void canonical(fz_state *s, fz_tensor *ft, const int64_t want[4], int bshd)
{
    int64_t c[4];
    for (int i = 0; i < 4; ++i) {
        c[i] = clip(want[i]);
        ft->t.shape[i] = want[i];
    }
    if (bshd) {
        ft->t.stride[1] = c[3];
        ft->t.stride[2] = c[1] * c[3];
        ft->t.stride[0] = c[2] * c[1] * c[3];
    } else {
        ft->t.stride[2] = c[3];
        ft->t.stride[1] = c[2] * c[3];
        ft->t.stride[0] = c[1] * c[2] * c[3];
    }
    const uint8_t o = fz_u8(&s->in);
    ft->t.offset = o < 200 ? 0 : o % 8;
    const uint8_t slack = fz_u8(&s->in); /* usually exact or a few spare elements, sometimes one short */
    const int64_t elems = ft->t.offset + c[0] * c[1] * c[2] * c[3] + (slack % 8 == 7 ? -1 : slack % 4);
    ft->buf = fz_new_buffer(s, (size_t)(elems > 0 ? elems : 1) * esize(ft->t.dtype), 0);
}

void fz_read_tensor(fz_state *s, fz_tensor *ft, const int64_t want[4], clattn_dtype usual)
{
    memset(ft, 0, sizeof *ft);
    ft->present = 1;
    ft->buf = -1;
    ft->t.dtype = fz_dtype(&s->in, usual);
    const uint8_t mode = fz_u8(&s->in) % 16;
    switch (mode) {
    case 8:
        canonical(s, ft, want, 1);
        break;
    case 9: { /* canonical, then one field replaced */
        canonical(s, ft, want, 0);
        const uint8_t f = fz_u8(&s->in) % 8;
        if (f == 0)
            ft->t.offset = fz_int(&s->in);
        else if (f <= 4)
            ft->t.shape[f - 1] = fz_count(&s->in);
        else
            ft->t.stride[f - 5] = fz_int(&s->in);
        break;
    }
    case 10: /* canonical strides on a buffer some earlier tensor has */
        if (s->nbuf > 0) {
            for (int i = 0; i < 4; ++i)
                ft->t.shape[i] = want[i];
            ft->t.stride[2] = clip(want[3]);
            ft->t.stride[1] = clip(want[2]) * ft->t.stride[2];
            ft->t.stride[0] = clip(want[1]) * ft->t.stride[1];
            ft->t.offset = fz_int(&s->in);
            ft->buf = fz_u8(&s->in) % s->nbuf;
        } else {
            canonical(s, ft, want, 0);
        }
        break;
    case 11: /* everything from the input */
        ft->t.offset = fz_int(&s->in);
        for (int i = 0; i < 4; ++i)
            ft->t.shape[i] = fz_count(&s->in);
        for (int i = 0; i < 3; ++i)
            ft->t.stride[i] = fz_int(&s->in);
        ft->buf = s->nbuf > 0 && fz_u8(&s->in) % 2 ? fz_u8(&s->in) % s->nbuf
                                                   : fz_new_buffer(s, 1 + (size_t)fz_u8(&s->in) * 16, 0);
        break;
    case 12:
        ft->present = 0;
        break;
    case 13: /* NULL buffer */
        canonical(s, ft, want, 0);
        ft->buf = -1;
        break;
    case 14: /* stride 0 in one dimension */
        canonical(s, ft, want, 0);
        ft->t.stride[fz_u8(&s->in) % 3] = 0;
        break;
    case 15: /* extent 1 in one dimension */
        canonical(s, ft, want, 0);
        ft->t.shape[fz_u8(&s->in) % 3] = 1;
        break;
    default:
        canonical(s, ft, want, 0);
        break;
    }
    ft->t.buffer = ft->buf >= 0 ? s->buf[ft->buf].mem : NULL;
}

cl_mem fz_read_kvlen(fz_state *s, int64_t batch)
{
    const uint8_t sel = fz_u8(&s->in) % 8;
    int b = -1;
    if (sel == 4 || sel == 5)
        b = fz_new_buffer(s, 4 * (size_t)(clip(batch) + (int64_t)(fz_u8(&s->in) % 3) - 1), 1);
    else if (sel == 6 && s->nbuf > 0)
        b = fz_u8(&s->in) % s->nbuf;
    else if (sel == 7)
        b = fz_new_buffer(s, 4 * (size_t)(fz_u8(&s->in) % 4), 1);
    return b >= 0 ? s->buf[b].mem : NULL;
}

static cl_event user_event(fz_state *s, int failed)
{
    if (s->nevents == FZ_MAX_EVENTS)
        return NULL;
    cl_int err;
    cl_event e = clCreateUserEvent(clattn_cl_context(s->ctx), &err);
    if (e == NULL || err != CL_SUCCESS)
        fz_die("clCreateUserEvent failed: %d", (int)err);
    clSetUserEventStatus(e, failed ? -1 : CL_COMPLETE);
    s->events[s->nevents++] = e;
    return e;
}

void fz_read_wait(fz_state *s)
{
    const uint8_t sel = fz_u8(&s->in) % 8;
    s->num_wait = 0;
    s->waitp = NULL;
    s->wait_failed = 0;
    if (sel < 5)
        return;
    const cl_uint k = 1 + fz_u8(&s->in) % 3;
    if (sel == 6) { /* NULL list with a count */
        s->num_wait = k;
        return;
    }
    int failed_at[FZ_MAX_EVENTS] = {0};
    for (cl_uint i = 0; i < k; ++i) {
        const uint8_t kind = fz_u8(&s->in) % 4;
        failed_at[i] = kind == 1;
        s->wait[i] = kind == 2 ? NULL : user_event(s, kind == 1);
    }
    s->waitp = s->wait;
    s->num_wait = sel == 7 ? 0 : k; /* sel 7: a list with num_wait 0, which must be ignored */
    for (cl_uint i = 0; i < s->num_wait; ++i)
        s->wait_failed |= failed_at[i];
}

void fz_validate_only(fz_state *s)
{
    s->wait[0] = user_event(s, 1);
    s->waitp = s->wait;
    s->num_wait = 1;
    s->wait_failed = 1;
    s->validate_only = 1;
}

/* =============================== oracle =============================== */

int fz_view_valid(const fz_state *s, const fz_tensor *ft, const int64_t want[4], int broadcast, unsigned dtypes)
{
    if (!ft->present || ft->buf < 0)
        return 0;
    const clattn_tensor *t = &ft->t;
    if (clattn_dtype_size(t->dtype) == 0 || !(dtypes & (1u << (unsigned)t->dtype)))
        return 0;
    for (int i = 0; i < 4; ++i)
        if (t->shape[i] != want[i] && !(broadcast && i < 3 && t->shape[i] == 1))
            return 0;
    if (t->offset < 0 || t->stride[0] < 0 || t->stride[1] < 0 || t->stride[2] < 0)
        return 0;
    for (int i = 0; i < 4; ++i)
        if (t->shape[i] < 1)
            return 0;
    unsigned __int128 hi = (unsigned __int128)t->offset + (unsigned __int128)(t->shape[3] - 1);
    for (int i = 0; i < 3; ++i)
        hi += (unsigned __int128)(t->shape[i] - 1) * (unsigned __int128)t->stride[i];
    return (hi + 1) * clattn_dtype_size(t->dtype) <= (unsigned __int128)s->buf[ft->buf].bytes;
}

void fz_marks_init(fz_marks *mk, const fz_state *s)
{
    memset(mk, 0, sizeof *mk);
    for (int i = 0; i < s->nbuf; ++i) {
        mk->m[i] = calloc(s->buf[i].bytes, 1);
        if (mk->m[i] == NULL)
            fz_die("out of host memory");
    }
}

void fz_marks_free(fz_marks *mk)
{
    for (int i = 0; i < FZ_MAX_BUFS; ++i)
        free(mk->m[i]);
    memset(mk, 0, sizeof *mk);
}

/* Buffer element index of (b, h, i, d); dims of extent 1 read index 0. */
static uint64_t elem(const clattn_tensor *t, int64_t b, int64_t h, int64_t i, int64_t d)
{
    return (uint64_t)t->offset + (uint64_t)(t->shape[0] == 1 ? 0 : b) * (uint64_t)t->stride[0] +
           (uint64_t)(t->shape[1] == 1 ? 0 : h) * (uint64_t)t->stride[1] +
           (uint64_t)(t->shape[2] == 1 ? 0 : i) * (uint64_t)t->stride[2] + (uint64_t)d;
}

#define FZ_MARK_CAP ((uint64_t)1 << 20)

int fz_mark(fz_marks *mk, const fz_state *s, const fz_tensor *ft)
{
    (void)s;
    const clattn_tensor *t = &ft->t;
    const uint64_t n = (uint64_t)t->shape[0] * (uint64_t)t->shape[1] * (uint64_t)t->shape[2] * (uint64_t)t->shape[3];
    if (n > FZ_MARK_CAP)
        return 0;
    const size_t es = clattn_dtype_size(t->dtype);
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t i = 0; i < t->shape[2]; ++i)
                for (int64_t d = 0; d < t->shape[3]; ++d) {
                    const uint64_t e = elem(t, b, h, i, d);
                    for (size_t k = 0; k < es; ++k)
                        if (mk->m[ft->buf][e * es + k] < 255)
                            mk->m[ft->buf][e * es + k]++;
                }
    return 1;
}

int fz_marked_twice(const fz_marks *mk, const fz_state *s, const fz_tensor *ft)
{
    (void)s;
    const clattn_tensor *t = &ft->t;
    const size_t es = clattn_dtype_size(t->dtype);
    for (int64_t b = 0; b < t->shape[0]; ++b)
        for (int64_t h = 0; h < t->shape[1]; ++h)
            for (int64_t i = 0; i < t->shape[2]; ++i)
                for (int64_t d = 0; d < t->shape[3]; ++d) {
                    const uint64_t e = elem(t, b, h, i, d);
                    for (size_t k = 0; k < es; ++k)
                        if (mk->m[ft->buf][e * es + k] > 1)
                            return 1;
                }
    return 0;
}

int fz_buf_index(const fz_state *s, cl_mem mem)
{
    for (int i = 0; i < s->nbuf; ++i)
        if (s->buf[i].mem == mem)
            return i;
    return -1;
}

void fz_mark_range(fz_marks *mk, const fz_state *s, cl_mem mem, size_t from, size_t to)
{
    const int bi = fz_buf_index(s, mem);
    if (bi < 0)
        return;
    for (size_t j = from; j < to && j < s->buf[bi].bytes; ++j)
        if (mk->m[bi][j] < 255)
            mk->m[bi][j]++;
}

void fz_read_all(const fz_state *s, unsigned char **imgs)
{
    if (clFinish(clattn_queue(s->ctx)) != CL_SUCCESS)
        fz_die("clFinish failed after the call");
    for (int i = 0; i < s->nbuf; ++i) {
        imgs[i] = malloc(s->buf[i].bytes);
        if (imgs[i] == NULL)
            fz_die("out of host memory");
        const cl_int err = clEnqueueReadBuffer(clattn_queue(s->ctx), s->buf[i].mem, CL_TRUE, 0, s->buf[i].bytes,
                                               imgs[i], 0, NULL, NULL);
        if (err != CL_SUCCESS)
            fz_die("clEnqueueReadBuffer failed: %d", (int)err);
    }
}

void fz_free_images(const fz_state *s, unsigned char **imgs)
{
    for (int i = 0; i < s->nbuf; ++i)
        free(imgs[i]);
    free(imgs);
}

void fz_check_untouched(const fz_state *s, unsigned char **imgs, const fz_marks *outs, const char *what)
{
    for (int i = 0; i < s->nbuf; ++i)
        for (size_t j = 0; j < s->buf[i].bytes; ++j)
            if ((outs == NULL || outs->m[i][j] == 0) && imgs[i][j] != s->buf[i].img[j])
                fz_die("%s: byte %zu of buffer %d (%zu bytes) changed from 0x%02x to 0x%02x", what, j, i,
                       s->buf[i].bytes, s->buf[i].img[j], imgs[i][j]);
}

double fz_get(const fz_state *s, const fz_tensor *ft, unsigned char *const *imgs, int64_t b, int64_t h, int64_t i,
              int64_t d)
{
    const unsigned char *img = imgs != NULL ? imgs[ft->buf] : s->buf[ft->buf].img;
    return tu_load(ft->t.dtype, img, (size_t)elem(&ft->t, b, h, i, d));
}

double *fz_gather(const fz_state *s, const fz_tensor *ft, unsigned char *const *imgs, const int64_t shape[4],
                  int use_images)
{
    const size_t n = (size_t)(shape[0] * shape[1] * shape[2] * shape[3]);
    double *x = malloc((n > 0 ? n : 1) * sizeof *x);
    if (x == NULL)
        fz_die("out of host memory");
    size_t k = 0;
    for (int64_t b = 0; b < shape[0]; ++b)
        for (int64_t h = 0; h < shape[1]; ++h)
            for (int64_t i = 0; i < shape[2]; ++i)
                for (int64_t d = 0; d < shape[3]; ++d)
                    x[k++] = fz_get(s, ft, use_images ? imgs : NULL, b, h, i, d);
    return x;
}

int *fz_kvlen_values(const fz_state *s, cl_mem kv, unsigned char *const *imgs, int64_t batch, int use_images)
{
    int *v = malloc((size_t)batch * sizeof *v);
    if (v == NULL)
        fz_die("out of host memory");
    int bi = -1;
    for (int i = 0; i < s->nbuf; ++i)
        if (s->buf[i].mem == kv)
            bi = i;
    if (bi < 0 || s->buf[bi].bytes < 4 * (size_t)batch)
        fz_die("kv_lengths accepted without %lld int32 values", (long long)batch);
    const unsigned char *img = use_images ? imgs[bi] : s->buf[bi].img;
    for (int64_t b = 0; b < batch; ++b) {
        int32_t x;
        memcpy(&x, img + 4 * b, 4);
        v[b] = x;
    }
    return v;
}

void fz_compare(const char *what, const double *got, const double *want, size_t n, double atol, double rtol)
{
    for (size_t i = 0; i < n; ++i)
        if (!tu_close(got[i], want[i], atol, rtol))
            fz_die("%s: element %zu of %zu is %.9g, the reference %.9g (atol %.3g, rtol %.3g)", what, i, n, got[i],
                   want[i], atol, rtol);
}

unsigned char **fz_after_call(fz_state *s, clattn_status st, cl_event done, const fz_marks *outs)
{
    const char *msg = clattn_last_error(s->ctx);
    /* CLATTN_FUZZ_VERBOSE=1: one line per call, to see what a corpus exercises. */
    static int verbose = -1;
    if (verbose < 0) {
        const char *v = getenv("CLATTN_FUZZ_VERBOSE");
        verbose = v != NULL && strcmp(v, "1") == 0;
    }
    if (verbose)
        fprintf(stderr, "clattn-fuzz: %s%s: %.160s\n", clattn_status_name(st),
                s->validate_only ? " (validate only)" : "", msg != NULL ? msg : "(null)");
    unsigned char **imgs = calloc(FZ_MAX_BUFS, sizeof *imgs);
    if (imgs == NULL)
        fz_die("out of host memory");
    if (st != CLATTN_SUCCESS) {
        if (!(st == CLATTN_INVALID_ARGUMENT || st == CLATTN_UNSUPPORTED || (st == CLATTN_OPENCL_ERROR && s->wait_failed)))
            fz_die("failed with %s (%s)", clattn_status_name(st), msg != NULL ? msg : "(null)");
        if (msg == NULL || msg[0] == '\0')
            fz_die("failed with %s but no message", clattn_status_name(st));
        if (done != NULL)
            fz_die("failed with %s but *done is not NULL", clattn_status_name(st));
        fz_read_all(s, imgs);
        fz_check_untouched(s, imgs, NULL, "after a refused call");
        fz_free_images(s, imgs);
        return NULL;
    }
    if (s->wait_failed)
        fz_die("succeeded with a failed event in its wait list");
    if (msg == NULL || msg[0] != '\0')
        fz_die("succeeded but clattn_last_error is \"%s\"", msg != NULL ? msg : "(null)");
    if (done == NULL)
        fz_die("succeeded without a done event");
    if (clWaitForEvents(1, &done) != CL_SUCCESS)
        fz_die("the done event failed");
    clReleaseEvent(done);
    fz_read_all(s, imgs);
    fz_check_untouched(s, imgs, outs, "after a successful call, outside the outputs");
    return imgs;
}

/* =============================== attention descriptors =============================== */

void fz_read_desc(fz_state *s, clattn_attention_desc *d)
{
    memset(d, 0, sizeof *d);
    d->batch = fz_count(&s->in);
    d->heads_kv = fz_count(&s->in);
    /* Mostly a multiple of heads_kv, so grouped-query shapes are reached. */
    const uint8_t g = fz_u8(&s->in);
    d->heads_q = g < 192 && d->heads_kv >= 1 && d->heads_kv <= 0x7fffffffLL ? d->heads_kv * (1 + g % 4)
                                                                              : fz_count(&s->in);
    d->seq_q = fz_count(&s->in);
    d->seq_kv = fz_count(&s->in);
    d->head_dim = fz_count(&s->in);
    const uint8_t v = fz_u8(&s->in);
    d->head_dim_v = v < 160 ? 0 : v < 224 ? 1 + v % 12 : fz_count(&s->in);
    d->scale = fz_scale(&s->in);
    const uint8_t c = fz_u8(&s->in);
    d->causal = c < 240 ? c % 2 : (int)fz_u64(&s->in);
    const uint8_t a = fz_u8(&s->in);
    d->algorithm = (clattn_algorithm)(a < 240 ? a % 3 : (int)(int32_t)fz_u64(&s->in));
}

/* Dropout (dropout_p, dropout_seed, dropout_offset), after the variants: off when the input ends
 * (fz_u8 gives 0), so inputs written before it keep their meaning. */
static void read_dropout(fz_state *s, clattn_attention_desc *d)
{
    const uint8_t sel = fz_u8(&s->in);
    if (sel < 128)
        return;
    /* Valid: ordinary rates, a threshold of 1 (2^-16), of 65535 (0.99999: z = 1e5), one that rounds
     * to 0 (2^-18: nothing dropped but everything scaled), a subnormal, the largest float below 1
     * (z = 2^24), and 0 and -0 (off). Invalid: negative, NaN, 1, above 1, infinities. */
    static const float ps[16] = {0.1f,        0.5f, 0.25f, 0.9f,  0x1p-16f, 0.99999f, 0x1p-18f, 0x1p-149f,
                                 0.99999994f, 0.0f, -0.0f, -0.1f, NAN,      1.0f,     1.5f,     -INFINITY};
    d->dropout_p = ps[sel & 15];
    if ((sel & 0x70) == 0x70) { /* any float from the input */
        uint32_t bits = (uint32_t)fz_u64(&s->in);
        memcpy(&d->dropout_p, &bits, sizeof bits);
    }
    static const uint64_t seeds[4] = {UINT64_MAX, 0xffffffffu, (uint64_t)1 << 32, 0x9e3779b97f4a7c15ull};
    const uint8_t k = fz_u8(&s->in);
    d->dropout_seed = k < 128 ? (uint64_t)k : k < 224 ? fz_u64(&s->in) : seeds[k % 4];
    const uint8_t o = fz_u8(&s->in);
    d->dropout_offset = o < 192 ? (uint32_t)(o % 8) : o < 240 ? (uint32_t)fz_u64(&s->in) : UINT32_MAX - (o % 2);
}

void fz_read_variants(fz_state *s, clattn_attention_desc *d)
{
    /* Read last, so that inputs written before the variants existed (which end earlier: fz_u8
     * gives 0 past the end) keep their meaning with every variant off. */
    const uint8_t sel = fz_u8(&s->in);
    if (sel < 128) {
        read_dropout(s, d);
        return;
    }
    static const int64_t sides[8] = {0, 1, 3, 16, -1, -5, 0x7fffffffLL, INT64_MIN};
    static const float caps[8] = {0.0f, 0.5f, 30.0f, 50.0f, -1.0f, NAN, INFINITY, 1e-40f};
    const uint8_t w = fz_u8(&s->in), c = fz_u8(&s->in), f = fz_u8(&s->in);
    d->window = (sel & 1) ? (int)(sel >> 1 & 3) : 0;
    /* Mostly consistent with window; sometimes set without it (refused). */
    if (d->window || (sel & 8)) {
        d->window_left = sides[w & 7];
        d->window_right = sides[w >> 3 & 7];
        if (w >> 6 == 3)
            d->window_left = (int64_t)fz_u64(&s->in);
    }
    d->chunk = c < 128 ? 0 : c < 240 ? (int64_t)(c % 17) : (int64_t)fz_u64(&s->in);
    d->softcap = caps[f & 7];
    /* A slice of a longer sequence (q_offset, k_offset), read after the others for the same
     * reason: small shifts mostly, sometimes any 64-bit value (refused past CLATTN_MAX_SEQ). */
    static const int64_t offs[8] = {0, 1, 5, 16, -3, -17, 0x7ff00000LL, INT64_MIN};
    const uint8_t o = fz_u8(&s->in);
    if (o >= 128) {
        d->q_offset = o >= 240 ? (int64_t)fz_u64(&s->in) : offs[o & 7];
        d->k_offset = offs[o >> 3 & 7];
    }
    read_dropout(s, d);
}

static int count_ok(int64_t v)
{
    return v >= 1 && v <= 0x7fffffffLL;
}

int fz_desc_valid(const clattn_attention_desc *d, int check_algorithm)
{
    if (!count_ok(d->batch) || !count_ok(d->heads_q) || !count_ok(d->heads_kv) || !count_ok(d->seq_q) ||
        !count_ok(d->seq_kv) || !count_ok(d->head_dim))
        return 0;
    const int64_t dv = d->head_dim_v ? d->head_dim_v : d->head_dim;
    if (d->heads_q % d->heads_kv != 0 || d->head_dim > CLATTN_MAX_HEAD_DIM || d->head_dim_v < 0 ||
        dv > CLATTN_MAX_HEAD_DIM_V || !isfinite(d->scale))
        return 0;
    if (d->scale == 0.0f && d->head_dim > 256) /* wide heads: the caller gives the scale */
        return 0;
    /* The variants (docs/variants.md): window sides only with window, chunk >= 0, softcap 0 or a
     * finite normal positive number. */
    if (!d->window && (d->window_left != 0 || d->window_right != 0))
        return 0;
    if (d->chunk < 0 || !isfinite(d->softcap) || d->softcap < 0.0f || (d->softcap > 0.0f && d->softcap < FLT_MIN))
        return 0;
    /* Offsets: each within CLATTN_MAX_SEQ, their difference plus the longer sequence too; a chunk
     * with a k_offset at most CLATTN_MAX_SEQ. */
    const int64_t big = d->seq_q > d->seq_kv ? d->seq_q : d->seq_kv;
    if (d->q_offset < -CLATTN_MAX_SEQ || d->q_offset > CLATTN_MAX_SEQ || d->k_offset < -CLATTN_MAX_SEQ ||
        d->k_offset > CLATTN_MAX_SEQ || llabs(d->q_offset - d->k_offset) > CLATTN_MAX_SEQ - big)
        return 0;
    if (d->k_offset != 0 && d->chunk > CLATTN_MAX_SEQ)
        return 0;
    if (check_algorithm && (d->algorithm < CLATTN_ALGORITHM_AUTO || d->algorithm > CLATTN_ALGORITHM_UNFUSED))
        return 0;
    if (check_algorithm && !fz_dropout_valid(d))
        return 0;
    return (unsigned __int128)d->batch * (unsigned __int128)d->heads_q * (unsigned __int128)d->seq_q <=
           (unsigned __int128)0x7fffffffULL * 64u;
}

int fz_dropout_valid(const clattn_attention_desc *d)
{
    if (!(d->dropout_p >= 0.0f && d->dropout_p < 1.0f))
        return 0;
    return !(d->dropout_p > 0.0f && d->kv != NULL && (d->kv->cu_seqlens_q != NULL || d->kv->cu_seqlens_k != NULL));
}

int fz_dropout_path_ok(const clattn_attention_desc *d)
{
    return !(d->dropout_p > 0.0f && (d->algorithm == CLATTN_ALGORITHM_UNFUSED || d->probabilities != NULL));
}

/* The smallest magnitude dt stores as an infinity (round to nearest even): 65520 for f16, the
 * bf16 midpoint above its largest finite value; f32's own. */
static double overflow_at(clattn_dtype dt)
{
    return dt == CLATTN_F16 ? 65520.0 : dt == CLATTN_BF16 ? 0x1.ffp127 : 0x1.ffffffp127;
}

void fz_compare_stored(const char *what, const double *got, const double *want, size_t n, double atol,
                       const double *atol_each, double rtol, clattn_dtype dt)
{
    for (size_t i = 0; i < n; ++i) {
        const double at = atol + (atol_each != NULL ? atol_each[i] : 0.0);
        if (isinf(got[i]) && isfinite(want[i]) && (got[i] > 0) == (want[i] > 0) &&
            fabs(want[i]) + at + rtol * fabs(want[i]) >= overflow_at(dt))
            continue;
        if (!tu_close(got[i], want[i], at, rtol))
            fz_die("%s: element %zu of %zu is %.9g, the reference %.9g (atol %.3g, rtol %.3g, %s)", what, i, n, got[i],
                   want[i], at, rtol, clattn_dtype_name(dt) ? clattn_dtype_name(dt) : "?");
    }
}

uint64_t fz_desc_work(const clattn_attention_desc *d)
{
    const int64_t dv = d->head_dim_v > 0 ? d->head_dim_v : d->head_dim;
    const int64_t f[4] = {d->batch, d->heads_q, d->seq_q, d->seq_kv};
    unsigned __int128 w = (unsigned __int128)(d->head_dim < 1 ? 1 : d->head_dim) + (unsigned __int128)(dv < 1 ? 1 : dv);
    for (int i = 0; i < 4; ++i) {
        w *= (unsigned __int128)(f[i] < 1 ? 1 : f[i]); /* < 2^64 · 2^63: no overflow */
        if (w > (unsigned __int128)UINT64_MAX)
            return UINT64_MAX;
    }
    return (uint64_t)w;
}

double fz_logit_error(const clattn_attention_desc *d, double scale, const double *q, const double *k,
                      const double *mask)
{
    const int64_t B = d->batch, Hq = d->heads_q, Hkv = d->heads_kv, Sq = d->seq_q, Skv = d->seq_kv, D = d->head_dim;
    const int64_t group = Hq / Hkv;
    double worst = 0.0;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
            for (int64_t i = 0; i < Sq; ++i)
                for (int64_t j = 0; j < Skv; ++j) {
                    const double *qr = q + ((b * Hq + h) * Sq + i) * D;
                    const double *kr = k + ((b * Hkv + h / group) * Skv + j) * D;
                    double abs_sum = 0.0, dot = 0.0;
                    for (int64_t x = 0; x < D; ++x) {
                        abs_sum += fabs(qr[x] * kr[x]);
                        dot += qr[x] * kr[x];
                    }
                    const double m = mask != NULL ? fabs(mask[((b * Hq + h) * Sq + i) * Skv + j]) : 0.0;
                    const double e = (double)(D + 2) * 0x1p-24 * fabs(scale) * abs_sum +
                                     0x1p-23 * (fabs(scale * dot) + m);
                    worst = e > worst ? e : worst;
                }
    return worst;
}

void fz_ref_attn(const clattn_attention_desc *d, const double *mask, const int *kv_len, ref_attn *a)
{
    memset(a, 0, sizeof *a);
    a->batch = (int)d->batch;
    a->heads_q = (int)d->heads_q;
    a->heads_kv = (int)d->heads_kv;
    a->seq_q = (int)d->seq_q;
    a->seq_kv = (int)d->seq_kv;
    a->head_dim = (int)d->head_dim;
    a->head_dim_v = (int)(d->head_dim_v ? d->head_dim_v : d->head_dim);
    a->scale = d->scale != 0.0f ? (double)d->scale : (double)(float)(1.0 / sqrt((double)d->head_dim));
    a->causal = d->causal != 0;
    a->mask = mask;
    a->mask_shape[0] = (int)d->batch;
    a->mask_shape[1] = (int)d->heads_q;
    a->mask_shape[2] = (int)d->seq_q;
    a->mask_shape[3] = (int)d->seq_kv;
    a->kv_len = kv_len;
    a->window = d->window;
    a->window_left = d->window_left;
    a->window_right = d->window_right;
    a->chunk = d->chunk;
    a->softcap = d->softcap;
    a->q_offset = d->q_offset;
    a->k_offset = d->k_offset;
    a->dropout_p = (double)d->dropout_p;
    a->dropout_seed = d->dropout_seed;
    a->dropout_offset = d->dropout_offset;
}
