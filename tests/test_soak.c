/*
 * Soak: 10,000 clattn_attention calls of mixed small shapes on one context (fused and unfused,
 * masks, key lengths, causal, decode with key splits, grouped-query, f16 and bf16, with and without
 * lse, with and without `done`, some waiting on the previous call's event), showing that nothing
 * grows with the number of calls:
 *   - OpenCL objects: clshim.c counts every memory object, kernel, program, queue, context and
 *     event created, retained and released; after the warm-up (every kernel built, the workspace at
 *     its largest) the live count of each kind must be the same at every checkpoint, so no call
 *     leaks a buffer or an event or rebuilds a program;
 *   - host memory: the heap bytes in use (glibc's mallinfo2, or under AddressSanitizer the
 *     sanitizer's own count) must not grow by more than HEAP_GROWTH_LIMIT between the first and
 *     the last checkpoint: a leak of 30 bytes a call shows over the 9,000 measured calls. The
 *     resident set, which pages the allocator keeps make insensitive to small leaks, must not grow
 *     by more than RSS_GROWTH_LIMIT (not asserted under AddressSanitizer, whose quarantine of freed
 *     blocks grows it by design). Under valgrind neither is asserted: it replaces malloc and queues
 *     freed blocks itself, and its own leak check stands in;
 *   - results: at each checkpoint every shape runs once more from sentinel outputs and must match
 *     the float64 reference (attnprob.c, tolerances from test_attention.c).
 * CLATTN_SOAK_CALLS overrides the number of calls (at least 2000, for a development run).
 */
#define _GNU_SOURCE /* mallinfo2 */

#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attnprob.h"
#include "clshim.h"

#if TU_SANITIZED
/* From <sanitizer/allocator_interface.h>, which gcc does not install: heap bytes in use now. */
size_t __sanitizer_get_current_allocated_bytes(void);
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
#include <malloc.h>
#define SOAK_MALLINFO2 1
#endif

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

#define F32 CLATTN_F32
#define F16 CLATTN_F16
#define BF16 CLATTN_BF16
#define FUSED CLATTN_ALGORITHM_FUSED
#define UNFUSED CLATTN_ALGORITHM_UNFUSED
#define AUTO CLATTN_ALGORITHM_AUTO

enum { WARMUP_CALLS = 1000, CHECKPOINTS = 4, FINISH_EVERY = 16 };
#define MiB (1024.0 * 1024.0)
/* Heap bytes in use: exact, so a leak of 30 bytes a call shows over the 9,000 measured calls. */
#define HEAP_GROWTH_LIMIT (256.0 * 1024)
/* RSS: freed pages the allocator keeps absorb small leaks, so this only catches big ones. */
#define RSS_GROWTH_LIMIT (4.0 * MiB)
#if TU_SANITIZED
#define SOAK_RSS_ASSERTED 0 /* the quarantine of freed blocks grows RSS by design */
#else
#define SOAK_RSS_ASSERTED 1
#endif

/* clang-format off */
static const ap_shape shapes[] = {
    /* name             B  Hq Hkv Sq  Skv  D   dt    causal mask kvlen lse alg */
    {"fused_causal",    1, 2, 2,  16, 24,  16, F32,  1,     0,   0,    1,  FUSED},
    {"unfused_mask",    2, 2, 1,  5,  19,  8,  F32,  0,     1,   0,    1,  UNFUSED},
    {"decode_split",    1, 4, 1,  1,  700, 32, F32,  0,     0,   1,    1,  AUTO},
    {"decode_f16",      2, 2, 2,  4,  300, 16, F16,  1,     0,   1,    0,  FUSED},
    {"prefill_bf16",    1, 2, 1,  20, 20,  24, BF16, 1,     1,   0,    1,  FUSED},
    {"unfused_kvlen",   3, 2, 2,  3,  33,  8,  F32,  1,     0,   1,    0,  UNFUSED},
    {"gqa_mask_kvlen",  3, 4, 2,  7,  40,  16, F16,  0,     1,   1,    1,  AUTO},
    {"tiny",            1, 1, 1,  1,  1,   1,  F32,  0,     0,   0,    1,  UNFUSED},
};
/* clang-format on */

static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return 0;
    unsigned long size = 0, resident = 0;
    const int n = fscanf(f, "%lu %lu", &size, &resident);
    fclose(f);
    return n == 2 ? (size_t)resident * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

/* Heap bytes in use (see the file comment), or -1 where this build cannot tell. */
static double heap_bytes(void)
{
#if TU_SANITIZED
    return (double)__sanitizer_get_current_allocated_bytes();
#elif defined(SOAK_MALLINFO2)
    const struct mallinfo2 mi = mallinfo2();
    return (double)mi.uordblks + (double)mi.hblkhd;
#else
    return -1.0;
#endif
}

/* Valgrind replaces malloc (mallinfo2 then reads 0) and keeps freed blocks in a queue of its own
 * (RSS grows): under valgrind, memcheck's leak check stands in for the host-memory assertions.
 * Its preload libraries in LD_PRELOAD give it away without a header. */
static int under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p != NULL && strstr(p, "vgpreload") != NULL;
}

typedef struct checkpoint {
    int calls;
    double heap, rss;
    clshim_counts cl;
} checkpoint;

/* Every shape once more from sentinel outputs, compared with the reference. */
static void check_all(ap_problem *probs, size_t n, int calls)
{
    char why[512];
    for (size_t i = 0; i < n; ++i) {
        if (ap_reset_outputs(&probs[i], why, sizeof why) != 0)
            fail_msg("%s", why);
        const clattn_status st = ap_run(&probs[i], 0, NULL, NULL);
        if (st != CLATTN_SUCCESS)
            fail_msg("after %d calls, %s: %s: %s", calls, shapes[i].name, clattn_status_name(st),
                     clattn_last_error(probs[i].ctx));
        if (ap_check(&probs[i], why, sizeof why) != 0)
            fail_msg("after %d calls: %s", calls, why);
    }
}

static void take(checkpoint *c, clattn_context *ctx, int calls)
{
    tu_finish(ctx);
    c->calls = calls;
    c->heap = heap_bytes();
    c->rss = (double)rss_bytes();
    clshim_get(&c->cl);
}

static void test_soak(void **state)
{
    (void)state;
    assert_true(clshim_active());
    int total = tu_getenv_int("CLATTN_SOAK_CALLS", 10000);
    if (total < 2 * WARMUP_CALLS)
        total = 2 * WARMUP_CALLS;
    clshim_counts start;
    clshim_get(&start);
    clattn_context *ctx = tu_context();
    ap_problem probs[N_OF(shapes)];
    char why[512];
    for (size_t i = 0; i < N_OF(shapes); ++i)
        if (ap_init(&probs[i], ctx, &shapes[i], tu_seed_of(shapes[i].name), why, sizeof why) != 0)
            fail_msg("%s", why);

    checkpoint cp[CHECKPOINTS];
    int ncp = 0;
    cl_event prev = NULL;
    for (int call = 0; call < total; ++call) {
        ap_problem *p = &probs[(size_t)call % N_OF(shapes)];
        /* Vary the event handling: no event, an event released at once, or an event the next call
         * waits on. */
        const int mode = (call / (int)N_OF(shapes)) % 3;
        cl_event done = NULL;
        const clattn_status st = ap_run(p, prev != NULL ? 1 : 0, prev != NULL ? &prev : NULL,
                                        mode == 0 ? NULL : &done);
        if (st != CLATTN_SUCCESS)
            fail_msg("call %d (%s): %s: %s", call, p->s.name, clattn_status_name(st), clattn_last_error(ctx));
        if (prev != NULL)
            clReleaseEvent(prev);
        prev = mode == 2 ? done : NULL;
        if (mode == 1)
            clReleaseEvent(done);
        if ((call + 1) % FINISH_EVERY == 0 || call + 1 == total) {
            if (prev != NULL)
                clReleaseEvent(prev);
            prev = NULL;
            tu_finish(ctx);
        }
        const int next = call + 1;
        const int at = WARMUP_CALLS + (ncp == 0 ? 0 : (ncp * (total - WARMUP_CALLS)) / (CHECKPOINTS - 1));
        if (ncp < CHECKPOINTS && next == at) {
            check_all(probs, N_OF(shapes), next);
            take(&cp[ncp], ctx, next);
            print_message("after %5d calls: heap in use %.3f MiB, RSS %.2f MiB; live mem %ld, kernel %ld, "
                          "program %ld, event %ld\n",
                          next, cp[ncp].heap / MiB, cp[ncp].rss / MiB, clshim_live(&cp[ncp].cl, CLSHIM_MEM),
                          clshim_live(&cp[ncp].cl, CLSHIM_KERNEL), clshim_live(&cp[ncp].cl, CLSHIM_PROGRAM),
                          clshim_live(&cp[ncp].cl, CLSHIM_EVENT));
            ++ncp;
        }
    }
    assert_int_equal(ncp, CHECKPOINTS);

    for (int i = 1; i < CHECKPOINTS; ++i) {
        char diff[256];
        if (!clshim_same_live(&cp[0].cl, &cp[i].cl, diff, sizeof diff))
            fail_msg("live OpenCL objects changed between call %d and call %d: %s", cp[0].calls, cp[i].calls, diff);
    }
    /* The calls themselves created objects (events at least): the counters saw the library. */
    assert_true(cp[CHECKPOINTS - 1].cl.created[CLSHIM_EVENT] - cp[0].cl.created[CLSHIM_EVENT] > 0);
    const checkpoint *first = &cp[0], *last = &cp[CHECKPOINTS - 1];
    const int measured = last->calls - first->calls;
    print_message("growth over %d calls: heap in use %.3f MiB (limit %.3f), RSS %.3f MiB (limit %.1f%s)\n", measured,
                  (last->heap - first->heap) / MiB, HEAP_GROWTH_LIMIT / MiB, (last->rss - first->rss) / MiB,
                  RSS_GROWTH_LIMIT / MiB, SOAK_RSS_ASSERTED ? "" : ", not asserted under AddressSanitizer");
    if (under_valgrind()) {
        print_message("under valgrind: host memory not asserted (memcheck checks the heap)\n");
    } else {
        if (first->heap < 0.0 || first->rss <= 0.0)
            fail_msg("cannot measure host memory here (heap %.0f, RSS %.0f bytes)", first->heap, first->rss);
        if (last->heap - first->heap > HEAP_GROWTH_LIMIT)
            fail_msg("heap in use grew by %.3f MiB over %d calls", (last->heap - first->heap) / MiB, measured);
        if (SOAK_RSS_ASSERTED && last->rss - first->rss > RSS_GROWTH_LIMIT)
            fail_msg("RSS grew by %.3f MiB over %d calls", (last->rss - first->rss) / MiB, measured);
    }

    for (size_t i = 0; i < N_OF(shapes); ++i)
        ap_free(&probs[i]);
    clattn_release(ctx);
    clshim_counts end;
    clshim_get(&end);
    char diff[256];
    if (!clshim_same_live(&start, &end, diff, sizeof diff))
        fail_msg("OpenCL objects left after releasing everything: %s", diff);
}

int main(void)
{
    tu_add_test("soak/mixed_shapes", NULL, test_soak, NULL);
    return tu_run_tests("soak");
}
