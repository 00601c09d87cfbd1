/* Shared test helpers; see testutil.h. */
#include "testutil.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

clattn_context *tu_context(void)
{
    clattn_context *ctx = NULL;
    const clattn_status st = clattn_create(NULL, &ctx);
    if (st == CLATTN_SUCCESS)
        return ctx;
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

static void check_cl(cl_int err, const char *what)
{
    if (err != CL_SUCCESS) {
        print_error("%s failed with OpenCL error %d\n", what, (int)err);
        fail();
    }
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
