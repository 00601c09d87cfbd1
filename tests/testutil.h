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

/* 1 in a build with AddressSanitizer (CLATTN_SANITIZE, which adds UBSan with it), gcc or clang,
 * else 0. */
#if defined(__SANITIZE_ADDRESS__)
#define TU_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_SANITIZED 1
#endif
#endif
#ifndef TU_SANITIZED
#define TU_SANITIZED 0
#endif

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
 * it with clattn_last_error(NULL) when CLATTN_REQUIRE_DEVICE=1 (CI must never pass by skipping).
 * CLATTN_TEST_GPU_LIMITS=1: the context takes the device for a GPU with 48 KiB of local memory and
 * work-groups of at most 1024 (NVIDIA's OpenCL limits). CLATTN_TEST_MAX_GROUPS_YZ=n: grid y and
 * z take at most n work-groups (NVIDIA's 65535 scaled down), launches past it run in chunks. */
clattn_context *tu_context(void);
/* A second context on ctx's queue (clattn_create_from_queue: its own programs and workspace),
 * seeing the device as tu_context's do. Fails the test if it cannot be made. */
clattn_context *tu_context_sharing(clattn_context *ctx);
/* Makes ctx take its device's max allocation for `bytes` (only ever lower): the scratch copies
 * and workspaces a call sizes against it then do not fit, on shapes small enough to run, and the
 * library must take its paths without them. */
void tu_limit_max_alloc(clattn_context *ctx, unsigned long long bytes);
/* What a context plans its work for: the device's cache (CL_DEVICE_GLOBAL_MEM_CACHE_SIZE; CPUs:
 * fused_direct cuts its K/V copies into key chunks of a quarter of it, which a device that
 * reports a large cache never does for the shapes it copies, and the unfused scores read K in
 * place past a quarter of it, src/fused.c and src/scores.c) and its compute units (key splits
 * for occupancy below 4 work-groups a unit on CPUs: choose_splits, src/fused.c). */
typedef struct tu_plan {
    unsigned long long cache_bytes;
    unsigned compute_units;
} tu_plan;
/* Makes ctx plan for `plan` and returns what it planned for before. */
tu_plan tu_swap_plan(clattn_context *ctx, tu_plan plan);
/* The float16 values ctx's CPU kernels take the vector registers to hold (their register tiles,
 * src/device.c): 32 with AVX-512, 8 with AVX2, 4 with SSE. */
int tu_nreg16(const clattn_context *ctx);
/* A CL_MEM_READ_WRITE buffer of `bytes` (at least 1, since OpenCL refuses size 0), filled from host
 * when not NULL (blocking write). Asserts success. */
cl_mem tu_buffer(clattn_context *ctx, size_t bytes, const void *host);
/* Blocking read of the first `bytes` of buf through clattn_queue(ctx). Asserts success. */
void tu_read(clattn_context *ctx, cl_mem buf, size_t bytes, void *host);
/* clFinish on the context's queue. Asserts success. */
void tu_finish(clattn_context *ctx);
/* ctx's workspace (src/internal.h: the one buffer its operations keep K/V copies, mask flags and
 * partial results in; NULL before a call needed one) and its size in bytes. */
cl_mem tu_workspace(const clattn_context *ctx, size_t *bytes);

/* 1 when ctx's device rounds every float operation to float, as OpenCL requires; 0 when it
 * keeps wider intermediates (PoCL on 32-bit x86 computes on the x87 stack), where the same
 * arithmetic compiled twice (PoCL specialises kernels by launch) can differ in the last bits.
 * Runs a one-work-item kernel on the first call for a device. Asserts the kernel ran. */
int tu_device_rounds_floats(clattn_context *ctx);

/* Integer environment variable, or dflt when unset, empty or not a whole number. */
int tu_getenv_int(const char *name, int dflt);

/* ---- per-test resources (tests that register tu_teardown as their cmocka teardown) ---- */

/* The executable's context, created on first use by tu_ctx_get (NULL until then); main releases it. */
extern clattn_context *tu_ctx;
/* tu_ctx, created with tu_context() (skip or fail without a device) if not yet there. */
clattn_context *tu_ctx_get(void);
/* Zeroed host memory of `bytes` (at least 1), freed by tu_teardown. Asserts success. */
void *tu_xalloc(size_t bytes);
/* tu_xalloc of n doubles. */
double *tu_xdoubles(size_t n);
/* tu_buffer on tu_ctx, released by tu_teardown. */
cl_mem tu_xbuffer(size_t bytes, const void *host);
/* cmocka teardown: frees everything tu_xalloc/tu_xbuffer handed out since the last call. cmocka runs
 * it even when the test fails half-way (fail() longjmps out of it). */
int tu_teardown(void **state);
/* FNV-1a of the row name: a fixed seed per case that does not move when rows are reordered. */
uint64_t tu_seed_of(const char *name);

/* Runs n (<= 64) copies of this executable as "/proc/self/exe <flag> <ready_fd> <start_fd>" (argv[0]
 * = argv0): each writes one byte to ready_fd once set up, then waits for start_fd to close. All are
 * started together, then reaped. Returns how many failed (non-zero exit or signal, reported);
 * *forked and *ready say how many were started and how many reported ready. */
int tu_run_children(const char *argv0, const char *flag, int n, int *forked, int *ready);
/* The child's side of tu_run_children: reports ready on ready_fd, then blocks until start_fd
 * closes (every child is then set up). Returns 0, or 3 if the ready byte cannot be written. */
int tu_child_ready_then_wait(int ready_fd, int start_fd);
/* rm -r for the shallow trees the tests make (files and subdirectories; read-only ones too). */
void tu_remove_tree(const char *path);

/* ---- strided tensor views with guarded buffers ---- */

typedef enum tu_layout {
    LAYOUT_BHSD,   /* contiguous [b][h][s][d] */
    LAYOUT_BSHD,   /* [b][s][h][d] */
    LAYOUT_PADDED  /* nonzero offset and padded strides inside a bigger buffer */
} tu_layout;

/* A tensor view plus the host image of its whole buffer. `fshape` is the shape of the stored data
 * (broadcast dimensions 1); the view's shape may differ only for stride-0 broadcasting. */
typedef struct tu_view {
    clattn_tensor t;
    int64_t fshape[4];
    size_t n;   /* elements in fshape */
    size_t cap; /* elements in the buffer */
    size_t esz;
    unsigned char *img;
} tu_view;

enum { TU_GUARD = 7 }; /* elements past the view's end, to catch writes beyond it */

/* Buffer element index of view position (b, h, s, d). */
size_t tu_at(const tu_view *v, int64_t b, int64_t h, int64_t s, int64_t d);
/* Lays out shape {B, H, S, D} of dt; every buffer element starts as `pad` (NaN for inputs, a
 * sentinel for outputs). The host image comes from tu_xalloc. */
void tu_view_init(tu_view *v, tu_layout lay, clattn_dtype dt, int64_t B, int64_t H, int64_t S, int64_t D,
                  double pad);
/* Copies contiguous typed data (fshape order) into the image at the view's positions. */
void tu_scatter(tu_view *v, const void *src);
/* The view's elements of a read-back image, as doubles in fshape order. */
void tu_gather(const tu_view *v, const unsigned char *img, double *dst);
/* Fails unless every buffer element outside the view still holds what v->img held. */
void tu_assert_untouched(const char *what, const tu_view *v, const unsigned char *img);
/* v->t.buffer = a tu_xbuffer holding the whole image. */
void tu_upload(tu_view *v);
/* Reads the whole buffer back, checks the outside is untouched, returns the view as doubles. */
void tu_download(const char *what, const tu_view *v, double *dst);
/* Stores x as element i of contiguous typed data and keeps the stored value in as_double[i]. */
void tu_put(clattn_dtype dt, void *typed, double *as_double, size_t i, double x);

/* ---- soft comparisons ---- */

/* Checks tu_check_close found wrong; tests reset it to 0 and fail at the end when it is not. */
extern int tu_failures;
/* Like tu_assert_allclose, but prints the failure, counts it in tu_failures and returns, so one row
 * reports every algorithm's result before it fails. With CLATTN_TEST_VERBOSE=1 it prints the worst
 * |diff| / allowed ratio of passing checks too, to see how much margin a tolerance leaves. */
void tu_check_close(const char *what, const double *got, const double *want, size_t n, double atol,
                    double rtol);

/* Test registry shared by the table-driven suites: each test is named "<area>/<row>" ("<area>"
 * when row is NULL), runs with the fixtures set by the last tu_set_fixtures call, and
 * tu_run_tests refuses duplicate names (a copy-pasted table row would otherwise run twice under
 * one name and hide the other). */
void tu_set_fixtures(CMFixtureFunction setup, CMFixtureFunction teardown);
void tu_add_test(const char *area, const char *row, CMUnitTestFunction fn, const void *state);
#define TU_ADD_TABLE(area, fn, table)                                              \
    for (size_t tu_i_ = 0; tu_i_ < sizeof(table) / sizeof((table)[0]); ++tu_i_) \
    tu_add_test((area), (table)[tu_i_].name, (fn), &(table)[tu_i_])
/* Runs the registered tests as cmocka group `group`, frees the registry; 1 on duplicate names. */
int tu_run_tests(const char *group);
/* CLATTN_TEST_FILTER="underflow*,seq_*" (a comma list of fnmatch patterns: `*`, `?`, `[...]`)
 * runs only the tests whose names match one of them, and none that match a pattern written with
 * a leading '-' ("-long_*" alone: every test but those); CLATTN_TEST_FILTER_<GROUP> (the group in
 * capitals, e.g. CLATTN_TEST_FILTER_ATTENTION) does so for that program alone and takes
 * precedence, so one environment can pick a part of one program among several. tu_run_tests
 * applies them; programs that run their own array call this on it first. CLATTN_TEST_SHARD=i/n
 * then keeps every n-th of those, from the i-th (0-based), so that n processes share a program's
 * tests (scripts/test.sh warms the valgrind step's kernel caches so). It moves the n0 tests kept to
 * the front of tests, in their order, and returns n0; an invalid shard exits 1 with a message. */
size_t tu_filter_tests(const char *group, struct CMUnitTest *tests, size_t n);

/* Cache and tuning files the library must not trust (docs/guarantees.md), staged alike for the
 * trust rows of test_cache and test_tuning. TU_OTHER_UID is nobody's: CI runs as root and can give
 * files to it. */
enum { TU_OTHER_UID = 65534 };
typedef enum tu_trust_kind {
    TU_TRUST_FILE_OTHER_OWNER,           /* the file owned by uid 65534 */
    TU_TRUST_FILE_GROUP_WRITABLE,        /* mode 0664 */
    TU_TRUST_FILE_OTHER_WRITABLE,        /* mode 0646 */
    TU_TRUST_DIR_WORLD_WRITABLE,         /* the directory 0777, no sticky bit */
    TU_TRUST_DIR_GROUP_WRITABLE,         /* the directory 0770 */
    TU_TRUST_DIR_OTHER_OWNER,            /* the directory owned by uid 65534 */
    TU_TRUST_DIR_ROOT_STICKY,            /* root-owned 01777 (as /tmp) holding a good file: accepted */
    TU_TRUST_DIR_ROOT_STICKY_OTHER_FILE, /* the same, the file owned by uid 65534 */
    TU_TRUST_SYMLINK_OTHER_FILE,         /* the file a symbolic link to a valid file of uid 65534 */
    TU_TRUST_DIR_REPLACED                /* a 0777 directory holding a valid file renamed into the
                                            directory's place once the library has opened it */
} tu_trust_kind;
/* For the kinds that change only owners and modes: gives the file `path`, planted in `dir`, or dir
 * itself the owner or mode of `kind`, and returns 1; 0 for the two kinds the caller stages itself
 * (TU_TRUST_SYMLINK_OTHER_FILE: then tu_trust_link; TU_TRUST_DIR_REPLACED). */
int tu_trust_stage(tu_trust_kind kind, const char *dir, const char *path);
/* TU_TRUST_SYMLINK_OTHER_FILE: `target`, a valid file the caller wrote outside dir, given to
 * TU_OTHER_UID when running as root, and a symbolic link to it at `path`. */
void tu_trust_link(const char *target, const char *path);

#endif /* CLATTN_TESTS_TESTUTIL_H */
