/* Shared test helpers; see testutil.h. */
#define _POSIX_C_SOURCE 200809L /* fork, pipe, waitpid, dirent, lstat */
#include "testutil.h"
#include "internal.h" /* CLATTN_TEST_GPU_LIMITS: the device limits a context sees */

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- AddressSanitizer's defaults for the tests ---- */

/* use_sigaltstack=0: the first program a thread builds makes LLVM (inside PoCL) give that thread an
 * alternate signal stack from malloc; when the thread ends, ASan takes that stack for its own and
 * unmaps it, and aborts ("failed to deallocate": test_threads' processes/first_create) or, where
 * the block happens to be page-aligned, unmaps part of its own heap. Here, every sanitized test
 * and every fuzz harness that runs kernels (they link this file) has it, under scripts/test.sh or
 * run by hand; ASAN_OPTIONS still overrides it. */
#if defined(__SANITIZE_ADDRESS__)
#define TU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_ASAN 1
#endif
#endif
#ifdef TU_ASAN
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "use_sigaltstack=0";
}
#endif

/* ---- random numbers ---- */

void tu_seed(tu_rng *rng, uint64_t seed)
{
    rng->s = seed;
}

uint64_t tu_next(tu_rng *rng)
{
    /* splitmix64 (Steele, Lea, Flood 2014): any seed, including 0, gives a full-quality stream. */
    uint64_t z = (rng->s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

double tu_uniform(tu_rng *rng, double lo, double hi)
{
    /* The top 53 bits give every double in [0, 1) on a 2^-53 grid, exactly. */
    const double u = (double)(tu_next(rng) >> 11) * 0x1.0p-53;
    const double x = lo + (hi - lo) * u;
    /* lo + (hi-lo)*u can round up to hi; keep the half-open promise. */
    return (x < hi || !(hi > lo)) ? x : lo;
}

/* ---- conversions ---- */

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Shifts `mant` right by `shift` bits rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t mant, unsigned shift)
{
    const uint32_t kept = mant >> shift;
    const uint32_t rest = mant & ((UINT32_C(1) << shift) - 1u);
    const uint32_t half = UINT32_C(1) << (shift - 1u);
    return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

uint16_t tu_f32_to_f16(float x)
{
    const uint32_t u = f32_bits(x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t exp = (u >> 23) & 0xFFu;
    const uint32_t mant = u & 0x7FFFFFu;

    if (exp == 0xFFu) {
        if (mant == 0)
            return (uint16_t)(sign | 0x7C00u);
        /* Keep the payload's top bits and force the quiet bit, so the result cannot become inf. */
        return (uint16_t)(sign | 0x7E00u | (mant >> 13));
    }
    /* Unbiased exponent rebased to f16's bias 15. */
    const int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7C00u);
    if (e >= 1) {
        /* Normal: round 23 mantissa bits to 10. A carry out of the mantissa bumps the exponent, and
         * a carry out of exponent 30 lands exactly on 0x7C00 = inf, which is the right overflow. */
        const uint32_t m = shift_rne(((uint32_t)e << 23) | mant, 13);
        return (uint16_t)(sign | m);
    }
    /* Subnormal result: value = m * 2^-24 with m = (1.mant * 2^23) >> (14 - e). Below e = -10 even
     * the largest input is under half the smallest subnormal (2^-25), so it rounds to 0. An f32
     * subnormal input (exp 0) lands here with e = -112 and rounds to 0 too. */
    if (e < -10)
        return sign;
    const uint32_t m = shift_rne(mant | 0x800000u, (unsigned)(14 - e));
    /* m may round up to 0x400, which is exactly the encoding of the smallest normal. */
    return (uint16_t)(sign | m);
}

float tu_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    const uint32_t mant = h & 0x3FFu;

    if (exp == 0x1Fu)
        return bits_f32(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) {
        /* Subnormal (or zero): m * 2^-24 is exact in float. */
        const float mag = ldexpf((float)mant, -24);
        return sign ? -mag : mag;
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t tu_f32_to_bf16(float x)
{
    const uint32_t u = f32_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu) != 0)
        /* A NaN whose payload sits in the low 16 bits would truncate to inf; force the quiet bit. */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Same rounding as shift_rne, on the whole word: a carry into the exponent is the next binade,
     * a carry from the largest finite into 0x7F80 is overflow to inf. */
    return (uint16_t)(shift_rne(u, 16));
}

float tu_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

void tu_store(clattn_dtype dt, void *dst, size_t i, double x)
{
    switch (dt) {
    case CLATTN_F32:
        ((float *)dst)[i] = (float)x;
        break;
    case CLATTN_F16:
        ((uint16_t *)dst)[i] = tu_f32_to_f16((float)x);
        break;
    case CLATTN_BF16:
        ((uint16_t *)dst)[i] = tu_f32_to_bf16((float)x);
        break;
    default:
        print_error("tu_store: unknown dtype %d\n", (int)dt);
        fail();
    }
}

double tu_load(clattn_dtype dt, const void *src, size_t i)
{
    switch (dt) {
    case CLATTN_F32:
        return ((const float *)src)[i];
    case CLATTN_F16:
        return tu_f16_to_f32(((const uint16_t *)src)[i]);
    case CLATTN_BF16:
        return tu_bf16_to_f32(((const uint16_t *)src)[i]);
    default:
        print_error("tu_load: unknown dtype %d\n", (int)dt);
        fail();
    }
    return NAN; /* not reached: fail() longjmps out of the test */
}

void tu_fill(tu_rng *rng, clattn_dtype dt, void *dst, double *as_double, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; ++i) {
        tu_store(dt, dst, i, tu_uniform(rng, lo, hi));
        if (as_double != NULL)
            as_double[i] = tu_load(dt, dst, i); /* read back: the rounded value, not the drawn one */
    }
}

/* ---- comparisons ---- */

int tu_close(double got, double want, double atol, double rtol)
{
    if (isnan(got) || isnan(want))
        return isnan(got) && isnan(want);
    if (isinf(got) || isinf(want))
        return got == want; /* an infinity matches only the same infinity, never a tolerance */
    return fabs(got - want) <= atol + rtol * fabs(want);
}

size_t tu_count_bad(const double *got, const double *want, size_t n, double atol, double rtol,
                    size_t *first_bad)
{
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; ++i)
        if (!tu_close(got[i], want[i], atol, rtol)) {
            if (bad == 0)
                first = i;
            ++bad;
        }
    if (first_bad != NULL)
        *first_bad = first;
    return bad;
}

void tu_assert_allclose_(const char *what, const double *got, const double *want, size_t n, double atol,
                         double rtol, const char *file, int line)
{
    size_t first;
    const size_t bad = tu_count_bad(got, want, n, atol, rtol, &first);
    if (bad == 0)
        return;
    print_error("%s: element %zu: got %.9g, want %.9g (|diff| %.3g, allowed %.3g = atol %.3g + rtol %.3g * |want|); "
                "%zu of %zu elements out of tolerance\n",
                what, first, got[first], want[first], fabs(got[first] - want[first]),
                atol + rtol * fabs(want[first]), atol, rtol, bad, n);
    _fail(file, line); /* the caller's location, not this helper's */
}

/* ---- device helpers ---- */

/* The device limits and register tiles the CLATTN_TEST_* variables ask a test context to see. */
static void apply_test_device(clattn_context *ctx)
{
    if (tu_getenv_int("CLATTN_TEST_GPU_LIMITS", 0)) {
        /* Pretend to be a GPU with NVIDIA's OpenCL limits (48 KiB of local memory, work-groups
         * of 1024): the tiled kernels then run with the configurations fit() makes for them,
         * and key splits follow the GPU occupancy rule. */
        ctx->dev.type = CL_DEVICE_TYPE_GPU;
        if (ctx->dev.local_mem > 49152)
            ctx->dev.local_mem = 49152;
        if (ctx->dev.max_wg > 1024)
            ctx->dev.max_wg = 1024;
        for (int i = 0; i < 3; i++)
            if (ctx->dev.max_item[i] > (i < 2 ? 1024u : 64u))
                ctx->dev.max_item[i] = i < 2 ? 1024u : 64u;
        ctx->dev.max_groups_yz = 65535;
    }
    /* CLATTN_TEST_NREG16=swap: the CPU kernels' register tiles of the other vector width
     * (device.c): AVX2's (8) where the device has AVX-512's (32) or more, AVX-512's where
     * it has fewer, so that every machine checks both sets of tiles (the results must not
     * change; the speed does). CLATTN_TEST_NREG16=4, 8 or 32: that width's tiles (4: SSE's
     * 16 xmm registers). */
    const char *nreg = getenv("CLATTN_TEST_NREG16");
    if (nreg && strcmp(nreg, "swap") == 0)
        ctx->dev.nreg16 = ctx->dev.nreg16 >= 32 ? 8 : 32;
    else if (nreg && (!strcmp(nreg, "4") || !strcmp(nreg, "8") || !strcmp(nreg, "32")))
        ctx->dev.nreg16 = atoi(nreg);
    else if (nreg && *nreg) {
        fprintf(stderr, "CLATTN_TEST_NREG16=%s: expected swap, 4, 8 or 32\n", nreg);
        exit(2);
    }
    /* CLATTN_TEST_MAX_GROUPS_YZ=n: grid y and z take n work-groups, so that every launch
     * larger than that runs in chunks (clattn__enqueue). */
    const int groups = tu_getenv_int("CLATTN_TEST_MAX_GROUPS_YZ", 0);
    if (groups > 0)
        ctx->dev.max_groups_yz = (size_t)groups;
    /* CLATTN_TEST_MMA_LDSM=0: the 16-bit matrix kernel without ldmatrix's layout (V transposed in
     * local memory), which NVIDIA gets where its probe fails; 1 (the emulation's default): with. */
    const char *ldsm = getenv("CLATTN_TEST_MMA_LDSM");
    if (ldsm && (!strcmp(ldsm, "0") || !strcmp(ldsm, "1")))
        ctx->matrix_ldsm = atoi(ldsm);
    else if (ldsm && *ldsm) {
        fprintf(stderr, "CLATTN_TEST_MMA_LDSM=%s: expected 0 or 1\n", ldsm);
        exit(2);
    }
}

clattn_context *tu_context(void)
{
    clattn_context *ctx = NULL;
    const clattn_status st = clattn_create(NULL, &ctx);
    if (st == CLATTN_SUCCESS) {
        apply_test_device(ctx);
        return ctx;
    }
    const char *msg = clattn_last_error(NULL);
    const char *req = getenv("CLATTN_REQUIRE_DEVICE");
    if (req != NULL && strcmp(req, "1") == 0) {
        print_error("CLATTN_REQUIRE_DEVICE=1 but clattn_create failed (%s): %s\n", clattn_status_string(st),
                    msg != NULL ? msg : "");
        fail();
    }
    print_message("skipping: no OpenCL device (%s: %s)\n", clattn_status_string(st), msg != NULL ? msg : "");
    skip();
    return NULL; /* not reached: skip() longjmps out of the test */
}

clattn_context *tu_context_sharing(clattn_context *ctx)
{
    clattn_context *other = NULL;
    const clattn_status st = clattn_create_from_queue(clattn_queue(ctx), &other);
    if (st != CLATTN_SUCCESS) {
        print_error("clattn_create_from_queue returned %s: %s\n", clattn_status_string(st),
                    clattn_last_error(NULL));
        fail();
    }
    apply_test_device(other);
    return other;
}

static void check_cl(cl_int err, const char *what)
{
    if (err != CL_SUCCESS) {
        print_error("%s failed with OpenCL error %d\n", what, (int)err);
        fail();
    }
}

int tu_device_rounds_floats(clattn_context *ctx)
{
    static cl_device_id known = NULL;
    static int rounds = 1;
    assert_non_null(ctx);
    if (known == clattn_device(ctx))
        return rounds;
    /* 0.25 + 1.5·2^23 rounded to float is 1.5·2^23: the difference is 0 where the sum is rounded,
     * 0.25 where it is kept wider. The operands come from the buffer, so that nothing folds. */
    static const char *src = "__kernel void probe(__global float *x)\n"
                             "{ x[0] = (x[0] + x[1]) - x[1]; }\n";
    cl_int err = CL_SUCCESS;
    cl_context cl = clattn_cl_context(ctx);
    cl_device_id dev = clattn_device(ctx);
    cl_program prog = clCreateProgramWithSource(cl, 1, &src, NULL, &err);
    check_cl(err, "clCreateProgramWithSource");
    check_cl(clBuildProgram(prog, 1, &dev, "", NULL, NULL), "clBuildProgram");
    cl_kernel k = clCreateKernel(prog, "probe", &err);
    check_cl(err, "clCreateKernel");
    const float in[2] = {0.25f, 12582912.0f};
    cl_mem buf = tu_buffer(ctx, sizeof in, in);
    check_cl(clSetKernelArg(k, 0, sizeof buf, &buf), "clSetKernelArg");
    const size_t one = 1;
    check_cl(clEnqueueNDRangeKernel(clattn_queue(ctx), k, 1, NULL, &one, NULL, 0, NULL, NULL),
             "clEnqueueNDRangeKernel");
    float out = -1.0f;
    tu_read(ctx, buf, sizeof out, &out);
    clReleaseMemObject(buf);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    assert_true(out == 0.0f || out == 0.25f);
    known = dev;
    rounds = out == 0.0f;
    return rounds;
}

void tu_limit_max_alloc(clattn_context *ctx, unsigned long long bytes)
{
    assert_non_null(ctx);
    if (bytes < ctx->dev.max_alloc)
        ctx->dev.max_alloc = bytes;
}

tu_plan tu_swap_plan(clattn_context *ctx, tu_plan plan)
{
    assert_non_null(ctx);
    const tu_plan before = {ctx->dev.cache_size, ctx->dev.compute_units};
    ctx->dev.cache_size = plan.cache_bytes;
    ctx->dev.compute_units = plan.compute_units;
    return before;
}

int tu_nreg16(const clattn_context *ctx)
{
    return ctx->dev.nreg16;
}

cl_mem tu_buffer(clattn_context *ctx, size_t bytes, const void *host)
{
    cl_int err = CL_SUCCESS;
    /* Size 0 is CL_INVALID_BUFFER_SIZE; tests of empty shapes still need a valid handle. */
    cl_mem buf = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE, bytes > 0 ? bytes : 1, NULL, &err);
    check_cl(err, "clCreateBuffer");
    /* A blocking write rather than CL_MEM_COPY_HOST_PTR keeps host const-correct. */
    if (host != NULL && bytes > 0) {
        err = clEnqueueWriteBuffer(clattn_queue(ctx), buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            clReleaseMemObject(buf);
        check_cl(err, "clEnqueueWriteBuffer");
    }
    return buf;
}

void tu_read(clattn_context *ctx, cl_mem buf, size_t bytes, void *host)
{
    if (bytes == 0)
        return;
    check_cl(clEnqueueReadBuffer(clattn_queue(ctx), buf, CL_TRUE, 0, bytes, host, 0, NULL, NULL),
             "clEnqueueReadBuffer");
}

void tu_finish(clattn_context *ctx)
{
    check_cl(clFinish(clattn_queue(ctx)), "clFinish");
}

cl_mem tu_workspace(const clattn_context *ctx, size_t *bytes)
{
    *bytes = ctx->workspace ? ctx->workspace_size : 0;
    return ctx->workspace;
}

int tu_getenv_int(const char *name, int dflt)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0')
        return dflt;
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < INT_MIN || v > INT_MAX)
        return dflt;
    return (int)v;
}

/* ---- per-test resources ---- */

/* Everything a test allocates is recorded here and released by tu_teardown, which cmocka runs even
 * when the test fails half-way (fail() longjmps out of it). */
enum { TU_MAX_RES = 256 };
static void *res_ptr[TU_MAX_RES];
static size_t n_ptr;
static cl_mem res_mem[TU_MAX_RES];
static size_t n_mem;
clattn_context *tu_ctx;

void *tu_xalloc(size_t bytes)
{
    assert_true(n_ptr < TU_MAX_RES);
    void *p = calloc(bytes > 0 ? bytes : 1, 1);
    assert_non_null(p);
    res_ptr[n_ptr++] = p;
    return p;
}

double *tu_xdoubles(size_t n)
{
    return tu_xalloc(n * sizeof(double));
}

cl_mem tu_xbuffer(size_t bytes, const void *host)
{
    assert_true(n_mem < TU_MAX_RES);
    cl_mem m = tu_buffer(tu_ctx, bytes, host);
    res_mem[n_mem++] = m;
    return m;
}

int tu_teardown(void **state)
{
    (void)state;
    for (size_t i = 0; i < n_ptr; ++i)
        free(res_ptr[i]);
    for (size_t i = 0; i < n_mem; ++i)
        clReleaseMemObject(res_mem[i]);
    n_ptr = n_mem = 0;
    return 0;
}

clattn_context *tu_ctx_get(void)
{
    if (tu_ctx == NULL)
        tu_ctx = tu_context();
    return tu_ctx;
}

/* FNV-1a of the row name: a fixed seed per case that does not move when rows are reordered. */
uint64_t tu_seed_of(const char *name)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (const char *p = name; *p; ++p)
        h = (h ^ (uint64_t)(unsigned char)*p) * UINT64_C(0x100000001b3);
    return h;
}

/* ---- strided views ---- */

size_t tu_at(const tu_view *v, int64_t b, int64_t h, int64_t s, int64_t d)
{
    return (size_t)(v->t.offset + b * v->t.stride[0] + h * v->t.stride[1] + s * v->t.stride[2] + d);
}

/* Lays out shape {B, H, S, D} of dt; every buffer element starts as `pad` (NaN for inputs, a
 * sentinel for outputs). */
void tu_view_init(tu_view *v, tu_layout lay, clattn_dtype dt, int64_t B, int64_t H, int64_t S, int64_t D,
                  double pad)
{
    memset(v, 0, sizeof *v);
    v->t.dtype = dt;
    v->t.shape[0] = v->fshape[0] = B;
    v->t.shape[1] = v->fshape[1] = H;
    v->t.shape[2] = v->fshape[2] = S;
    v->t.shape[3] = v->fshape[3] = D;
    switch (lay) {
    case LAYOUT_BHSD:
        v->t.stride[2] = D;
        v->t.stride[1] = S * D;
        v->t.stride[0] = H * S * D;
        break;
    case LAYOUT_BSHD:
        v->t.stride[1] = D;
        v->t.stride[2] = H * D;
        v->t.stride[0] = S * H * D;
        break;
    case LAYOUT_PADDED:
        v->t.offset = 37;
        v->t.stride[2] = D + 5;
        v->t.stride[1] = S * v->t.stride[2] + 3;
        v->t.stride[0] = H * v->t.stride[1] + 11;
        break;
    }
    v->n = (size_t)(B * H * S * D);
    v->cap = tu_at(v, B - 1, H - 1, S - 1, D - 1) + 1 + TU_GUARD;
    v->esz = clattn_dtype_size(dt);
    v->img = tu_xalloc(v->cap * v->esz);
    for (size_t i = 0; i < v->cap; ++i)
        tu_store(dt, v->img, i, pad);
}

/* Copies contiguous typed data (fshape order) into the image at the view's positions. */
void tu_scatter(tu_view *v, const void *src)
{
    const int64_t *s = v->fshape;
    size_t lin = 0;
    for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t h = 0; h < s[1]; ++h)
            for (int64_t i = 0; i < s[2]; ++i)
                for (int64_t d = 0; d < s[3]; ++d, ++lin)
                    memcpy(v->img + tu_at(v, b, h, i, d) * v->esz, (const unsigned char *)src + lin * v->esz,
                           v->esz);
}

/* The view's elements of a read-back image, as doubles in fshape order. */
void tu_gather(const tu_view *v, const unsigned char *img, double *dst)
{
    const int64_t *s = v->fshape;
    size_t lin = 0;
    for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t h = 0; h < s[1]; ++h)
            for (int64_t i = 0; i < s[2]; ++i)
                for (int64_t d = 0; d < s[3]; ++d, ++lin)
                    dst[lin] = tu_load(v->t.dtype, img, tu_at(v, b, h, i, d));
}

/* Fails unless every buffer element outside the view still holds what v->img held. */
void tu_assert_untouched(const char *what, const tu_view *v, const unsigned char *img)
{
    unsigned char *mark = tu_xalloc(v->cap);
    const int64_t *s = v->t.shape;
    for (int64_t b = 0; b < s[0]; ++b)
        for (int64_t h = 0; h < s[1]; ++h)
            for (int64_t i = 0; i < s[2]; ++i)
                for (int64_t d = 0; d < s[3]; ++d)
                    mark[tu_at(v, b, h, i, d)] = 1;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < v->cap; ++i)
        if (!mark[i] && memcmp(img + i * v->esz, v->img + i * v->esz, v->esz) != 0)
            if (bad++ == 0)
                first = i;
    if (bad != 0) {
        print_error("%s: %zu buffer elements outside the view were modified, first at element %zu "
                    "(now %.9g, sentinel %.9g)\n",
                    what, bad, first, tu_load(v->t.dtype, img, first), tu_load(v->t.dtype, v->img, first));
        fail();
    }
}

void tu_upload(tu_view *v)
{
    v->t.buffer = tu_xbuffer(v->cap * v->esz, v->img);
}

/* Reads the whole buffer back, checks the outside is untouched, returns the view as doubles. */
void tu_download(const char *what, const tu_view *v, double *dst)
{
    unsigned char *img = tu_xalloc(v->cap * v->esz);
    tu_read(tu_ctx, v->t.buffer, v->cap * v->esz, img);
    tu_assert_untouched(what, v, img);
    tu_gather(v, img, dst);
}

/* Stores x as element i of contiguous typed data and keeps the stored value in as_double[i]. */
void tu_put(clattn_dtype dt, void *typed, double *as_double, size_t i, double x)
{
    tu_store(dt, typed, i, x);
    as_double[i] = tu_load(dt, typed, i);
}

/* ---- soft comparisons ---- */

/* Like tu_assert_allclose, but records the failure and returns, so one row reports every
 * algorithm's result before it fails. With CLATTN_TEST_VERBOSE=1 it prints the worst
 * |diff| / allowed ratio of passing checks too, to see how much margin a tolerance leaves. */
int tu_failures;

void tu_check_close(const char *what, const double *got, const double *want, size_t n, double atol,
                    double rtol)
{
    size_t first;
    const size_t bad = tu_count_bad(got, want, n, atol, rtol, &first);
    if (bad != 0) {
        print_error("%s: element %zu: got %.9g, want %.9g (|diff| %.3g, allowed %.3g = atol %.3g + rtol %.3g * "
                    "|want|); %zu of %zu elements out of tolerance\n",
                    what, first, got[first], want[first], fabs(got[first] - want[first]),
                    atol + rtol * fabs(want[first]), atol, rtol, bad, n);
        ++tu_failures;
        return;
    }
    if (tu_getenv_int("CLATTN_TEST_VERBOSE", 0)) {
        double worst = 0.0;
        for (size_t i = 0; i < n; ++i)
            if (isfinite(want[i])) {
                const double r = fabs(got[i] - want[i]) / (atol + rtol * fabs(want[i]));
                worst = r > worst ? r : worst;
            }
        print_message("    %-40s worst |diff|/allowed %.3f\n", what, worst);
    }
}

/* ---- test registry ---- */

static struct CMUnitTest *reg_tests;
static size_t reg_count, reg_cap;
static CMFixtureFunction reg_setup, reg_teardown;

void tu_set_fixtures(CMFixtureFunction setup, CMFixtureFunction teardown)
{
    reg_setup = setup;
    reg_teardown = teardown;
}

void tu_add_test(const char *area, const char *row, CMUnitTestFunction fn, const void *state)
{
    if (reg_count == reg_cap) {
        reg_cap = reg_cap ? 2 * reg_cap : 64;
        reg_tests = realloc(reg_tests, reg_cap * sizeof *reg_tests);
        if (reg_tests == NULL)
            exit(1);
    }
    const size_t n = strlen(area) + 1 + (row != NULL ? strlen(row) : 0) + 1;
    char *name = malloc(n);
    if (name == NULL)
        exit(1);
    snprintf(name, n, row != NULL ? "%s/%s" : "%s", area, row != NULL ? row : "");
    reg_tests[reg_count++] = (struct CMUnitTest){name, fn, reg_setup, reg_teardown, (void *)state};
}

/* 1 when name matches one of the comma-separated patterns of list that do not start with '-' (or
 * there are none) and none of those that do (with the '-' taken off). */
static int matches_list(const char *list, const char *name)
{
    char pat[256];
    int any_pos = 0, pos = 0;
    for (const char *p = list; *p;) {
        const size_t len = strcspn(p, ",");
        if (len >= sizeof pat) {
            fprintf(stderr, "test filter: a pattern of %zu characters is too long\n", len);
            exit(1);
        }
        memcpy(pat, p, len);
        pat[len] = '\0';
        p += len + (p[len] == ',');
        const int neg = pat[0] == '-';
        if (pat[neg] == '\0')
            continue;
        const int hit = fnmatch(pat + neg, name, 0) == 0;
        if (neg && hit)
            return 0;
        if (!neg) {
            any_pos = 1;
            pos |= hit;
        }
    }
    return pos || !any_pos;
}

size_t tu_filter_tests(const char *group, struct CMUnitTest *tests, size_t n)
{
    char var[64] = "CLATTN_TEST_FILTER_";
    size_t at = strlen(var);
    for (const char *g = group; *g && at + 1 < sizeof var; ++g)
        var[at++] = (char)toupper((unsigned char)*g);
    var[at] = '\0';
    const char *filter = getenv(var);
    if (filter == NULL || !*filter)
        filter = getenv("CLATTN_TEST_FILTER");
    /* CLATTN_TEST_SHARD=i/n: of the tests the filter keeps, those at positions i, i + n, ... */
    unsigned shard = 0, shards = 1;
    const char *sh = getenv("CLATTN_TEST_SHARD");
    if (sh != NULL && *sh) {
        char end = '\0';
        if (sscanf(sh, "%u/%u%c", &shard, &shards, &end) != 2 || shards == 0 || shards > 1000 ||
            shard >= shards) {
            fprintf(stderr, "CLATTN_TEST_SHARD must be i/n with 0 <= i < n <= 1000 (got '%s')\n", sh);
            exit(1);
        }
    }
    size_t kept = 0, seen = 0;
    for (size_t i = 0; i < n; ++i)
        if ((filter == NULL || !*filter || matches_list(filter, tests[i].name)) &&
            seen++ % shards == shard) {
            const struct CMUnitTest t = tests[kept];
            tests[kept++] = tests[i];
            tests[i] = t;
        }
    return kept;
}

int tu_run_tests(const char *group)
{
    int failed = 0;
    for (size_t i = 0; i < reg_count && !failed; ++i)
        for (size_t j = i + 1; j < reg_count; ++j)
            if (strcmp(reg_tests[i].name, reg_tests[j].name) == 0) {
                fprintf(stderr, "%s: duplicate test name %s\n", group, reg_tests[i].name);
                failed = 1;
                break;
            }
    /* The tests left out are swapped behind the kept ones, so every name is still freed below. */
    if (!failed)
        failed = _cmocka_run_group_tests(group, reg_tests, tu_filter_tests(group, reg_tests, reg_count),
                                         NULL, NULL);
    for (size_t i = 0; i < reg_count; ++i)
        free((char *)reg_tests[i].name);
    free(reg_tests);
    reg_tests = NULL;
    reg_count = reg_cap = 0;
    return failed;
}

int tu_child_ready_then_wait(int ready_fd, int start_fd)
{
    const char one = 1;
    if (write(ready_fd, &one, 1) != 1)
        return 3;
    close(ready_fd);
    char c;
    while (read(start_fd, &c, 1) > 0) {
    }
    close(start_fd);
    return 0;
}

int tu_run_children(const char *argv0, const char *flag, int n, int *forked_out, int *ready_out)
{
    int ready[2], start[2];
    if (pipe(ready) != 0 || pipe(start) != 0)
        fail_msg("pipe: %s", strerror(errno));
    pid_t pids[64];
    int forked = 0;
    for (int i = 0; i < n && i < 64; ++i) {
        fflush(NULL);
        pids[i] = fork();
        if (pids[i] < 0)
            break; /* the children already started still get their start signal and are reaped */
        ++forked;
        if (pids[i] == 0) {
            close(ready[0]);
            close(start[1]);
            char rfd[16], sfd[16];
            snprintf(rfd, sizeof rfd, "%d", ready[1]);
            snprintf(sfd, sizeof sfd, "%d", start[0]);
            execl("/proc/self/exe", argv0, flag, rfd, sfd, (char *)NULL);
            _exit(127);
        }
    }
    close(ready[1]);
    close(start[0]);
    /* Every child has reported ready before any starts, so their work overlaps. */
    int got = 0;
    char buf[64];
    while (got < forked) {
        const ssize_t r = read(ready[0], buf, (size_t)(forked - got));
        if (r <= 0)
            break; /* a child died before reporting; its exit status tells */
        got += (int)r;
    }
    close(ready[0]);
    close(start[1]); /* go */
    int failures = 0;
    for (int i = 0; i < forked; ++i) {
        int status = 0;
        if (waitpid(pids[i], &status, 0) != pids[i] || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            print_error("child %d (pid %ld) failed: %s %d\n", i, (long)pids[i],
                        WIFEXITED(status) ? "exit" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            ++failures;
        }
    }
    *forked_out = forked;
    *ready_out = got;
    return failures;
}

void tu_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    chmod(path, 0700); /* the read-only case */
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char sub[PATH_MAX + 256];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            tu_remove_tree(sub);
        }
        closedir(d);
    }
    rmdir(path);
}

int tu_trust_stage(tu_trust_kind kind, const char *dir, const char *path)
{
    switch (kind) {
    case TU_TRUST_FILE_OTHER_OWNER:
        assert_int_equal(chown(path, TU_OTHER_UID, TU_OTHER_UID), 0);
        return 1;
    case TU_TRUST_FILE_GROUP_WRITABLE:
        assert_int_equal(chmod(path, 0664), 0);
        return 1;
    case TU_TRUST_FILE_OTHER_WRITABLE:
        assert_int_equal(chmod(path, 0646), 0);
        return 1;
    case TU_TRUST_DIR_WORLD_WRITABLE:
        assert_int_equal(chmod(dir, 0777), 0);
        return 1;
    case TU_TRUST_DIR_GROUP_WRITABLE:
        assert_int_equal(chmod(dir, 0770), 0);
        return 1;
    case TU_TRUST_DIR_OTHER_OWNER:
        assert_int_equal(chown(dir, TU_OTHER_UID, TU_OTHER_UID), 0);
        return 1;
    case TU_TRUST_DIR_ROOT_STICKY:
        assert_int_equal(chmod(dir, 01777), 0); /* dir is root's: the row runs as root */
        return 1;
    case TU_TRUST_DIR_ROOT_STICKY_OTHER_FILE:
        assert_int_equal(chown(path, TU_OTHER_UID, TU_OTHER_UID), 0);
        assert_int_equal(chmod(dir, 01777), 0);
        return 1;
    case TU_TRUST_SYMLINK_OTHER_FILE:
    case TU_TRUST_DIR_REPLACED:
        break;
    }
    return 0;
}

void tu_trust_link(const char *target, const char *path)
{
    if (geteuid() == 0)
        assert_int_equal(chown(target, TU_OTHER_UID, TU_OTHER_UID), 0);
    else
        print_message("not root: the link's target stays this user's; the link alone is refused\n");
    assert_int_equal(symlink(target, path), 0);
}
