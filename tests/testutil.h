/*
 * Helpers shared by every cmocka test executable: a fixed-seed generator, host-side f16/bf16
 * conversions written independently of the kernels, typed host arrays, an allclose assertion, and
 * device setup that skips (or, with CLATTN_REQUIRE_DEVICE=1 as CI sets it, fails) without a device.
 *
 * cmocka 1.1.5 needs these standard headers before <cmocka.h>; including them here lets every test
 * include "testutil.h" first and cmocka in the right order.
 */
#ifndef CLATTN_TESTS_TESTUTIL_H
#define CLATTN_TESTS_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "clattn.h"

/* ---- deterministic random numbers (splitmix64: tiny, full period, good enough for test data) ---- */

typedef struct {
    uint64_t s;
} tu_rng;

void tu_seed(tu_rng *rng, uint64_t seed);
/* Next raw 64-bit value. */
uint64_t tu_next(tu_rng *rng);
/* Uniform in [lo, hi). */
double tu_uniform(tu_rng *rng, double lo, double hi);

/* ---- storage conversions (round to nearest even, as the library's contract states) ---- */

/* binary32 -> binary16: RNE, subnormals, overflow to inf, NaN stays a (quiet) NaN with its sign. */
uint16_t tu_f32_to_f16(float x);
float tu_f16_to_f32(uint16_t h);
/* binary32 -> bfloat16 (upper 16 bits): RNE, NaN stays a (quiet) NaN. */
uint16_t tu_f32_to_bf16(float x);
float tu_bf16_to_f32(uint16_t h);

/* Element i of a typed host array. Storing goes through float first for f16/bf16 (double rounding
 * can differ from a direct double->f16 rounding only within 2^-24 relative of a tie; irrelevant for
 * test data, and tu_fill hands the reference the stored value anyway). */
void tu_store(clattn_dtype dt, void *dst, size_t i, double x);
double tu_load(clattn_dtype dt, const void *src, size_t i);

/* n random values in [lo, hi) rounded to dt into dst; as_double (may be NULL) receives exactly the
 * stored values, so the reference computes on the same inputs the device sees. */
void tu_fill(tu_rng *rng, clattn_dtype dt, void *dst, double *as_double, size_t n, double lo, double hi);

/* ---- comparisons ---- */

/* Whether got matches want: |got-want| <= atol + rtol*|want|, or both NaN, or the same infinity. */
int tu_close(double got, double want, double atol, double rtol);
/* Number of elements that are not close; *first_bad (may be NULL) gets the first such index (n if none). */
size_t tu_count_bad(const double *got, const double *want, size_t n, double atol, double rtol,
                    size_t *first_bad);
/* Fails the running test at the caller's file:line, naming `what`, the first bad index, got, want
 * and the total count of bad elements. */
void tu_assert_allclose_(const char *what, const double *got, const double *want, size_t n, double atol,
                         double rtol, const char *file, int line);
#define tu_assert_allclose(what, got, want, n, atol, rtol) \
    tu_assert_allclose_((what), (got), (want), (n), (atol), (rtol), __FILE__, __LINE__)

/* ---- device helpers ---- */

/* clattn_create(NULL, ...) so CLATTN_DEVICE picks the device. Without one: skip() the test, or fail
 * it with clattn_last_error(NULL) when CLATTN_REQUIRE_DEVICE=1 (CI must never pass by skipping). */
clattn_context *tu_context(void);
/* A CL_MEM_READ_WRITE buffer of `bytes` (at least 1, since OpenCL refuses size 0), filled from host
 * when not NULL (blocking write). Asserts success. */
cl_mem tu_buffer(clattn_context *ctx, size_t bytes, const void *host);
/* Blocking read of the first `bytes` of buf through clattn_queue(ctx). Asserts success. */
void tu_read(clattn_context *ctx, cl_mem buf, size_t bytes, void *host);
/* clFinish on the context's queue. Asserts success. */
void tu_finish(clattn_context *ctx);

/* Integer environment variable, or dflt when unset, empty or not a whole number. */
int tu_getenv_int(const char *name, int dflt);

#endif /* CLATTN_TESTS_TESTUTIL_H */
