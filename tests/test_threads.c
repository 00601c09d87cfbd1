/*
 * Concurrency, as clattn.h states it: a context is used by one thread at a time, and separate
 * contexts may be used from separate threads at once, sharing a device and a cache directory.
 *
 *   threads/contexts_in_parallel   THREADS threads each create their own context at the same moment
 *                                  and run ROUNDS rounds of mixed attention problems (fused,
 *                                  unfused, decode with key splits, masks, f16) while the others do;
 *                                  every result must match the float64 reference (attnprob.c), and
 *                                  once every context is released no OpenCL object is left
 *                                  (clshim.c counts them across all threads).
 *   threads/shared_queue           the same with contexts made by clattn_create_from_queue on one
 *                                  in-order queue of the caller's, all enqueueing on it at once.
 *   threads/fresh_cache_dir        the same with an empty cache directory, so the threads build the
 *                                  same programs and write the same cache entries at once; then a
 *                                  new context must find every entry on disk and build nothing.
 *   threads/create_errors          clattn_create failing in every thread at once: each thread's
 *                                  clattn_last_error(NULL) names its own spec (the message without
 *                                  a context is per thread).
 *   processes/shared_cache_dir     two processes (fork + exec of this binary, so each starts OpenCL
 *                                  from scratch) share one fresh cache directory, start together,
 *                                  both build, both check their results against the reference; the
 *                                  directory then holds only whole, valid entries (no temporary
 *                                  file; a new context loads every program from it and builds none).
 *
 * Threads never call cmocka (its assertions longjmp): each records a status and a message, and the
 * main thread asserts on them after joining.
 */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier, setenv, mkdtemp, fork, pipe */

#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attnprob.h"
#include "clshim.h"
#include "internal.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

#define F32 CLATTN_F32
#define F16 CLATTN_F16
#define FUSED CLATTN_ALGORITHM_FUSED
#define UNFUSED CLATTN_ALGORITHM_UNFUSED
#define AUTO CLATTN_ALGORITHM_AUTO

enum { THREADS = 4, ROUNDS = 20, PROCESSES = 2 };

/* clang-format off */
static const ap_shape shapes[] = {
    /* name             B  Hq Hkv Sq  Skv  D   dt   causal mask kvlen lse alg */
    {"fused_causal",    2, 2, 1,  17, 40,  16, F32, 1,     0,   0,    1,  FUSED},
    {"unfused_mask",    1, 2, 2,  6,  23,  8,  F32, 0,     1,   0,    1,  UNFUSED},
    {"decode_split",    1, 4, 2,  1,  600, 32, F32, 0,     0,   1,    1,  AUTO},
    {"f16_kvlen",       3, 2, 2,  5,  64,  16, F16, 1,     0,   1,    0,  FUSED},
};
/* The processes' share: one fused and one unfused problem, so each process builds a few programs. */
static const ap_shape process_shapes[] = {
    {"p_fused",         1, 2, 1,  9,  33,  16, F32, 1,     1,   0,    1,  FUSED},
    {"p_unfused",       2, 2, 2,  4,  21,  8,  F32, 0,     0,   1,    1,  UNFUSED},
};
/* clang-format on */

/* =============================== files =============================== */

static char *saved_cache_dir; /* the environment the run started with, restored after each test */

static void restore_cache_dir(void)
{
    if (saved_cache_dir != NULL)
        setenv("CLATTN_CACHE_DIR", saved_cache_dir, 1);
    else
        unsetenv("CLATTN_CACHE_DIR");
}

static void make_tmpdir(char *out, size_t size)
{
    const char *base = getenv("TMPDIR");
    if (base == NULL || *base == '\0')
        base = "/tmp";
    snprintf(out, size, "%s/clattn-threads-test-XXXXXX", base);
    if (mkdtemp(out) == NULL)
        fail_msg("mkdtemp(%s): %s", out, strerror(errno));
}

/* Removes a flat directory of files. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char path[PATH_MAX + 256];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Entries of dir whose names end in suffix ("" counts everything but . and ..). */
static int count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    const size_t m = strlen(suffix);
    while ((e = readdir(d)) != NULL) {
        const size_t len = strlen(e->d_name);
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && len >= m &&
            strcmp(e->d_name + len - m, suffix) == 0)
            ++n;
    }
    closedir(d);
    return n;
}

/* A new context on `dir` runs every shape from the cache alone: disk hits, no build, no reject,
 * and results that match the reference. */
static void expect_all_from_disk(const char *dir, const ap_shape *list, size_t n)
{
    setenv("CLATTN_CACHE_DIR", dir, 1);
    clattn_context *ctx = tu_context();
    restore_cache_dir();
    char why[512];
    for (size_t i = 0; i < n; ++i) {
        ap_problem p;
        if (ap_init(&p, ctx, &list[i], tu_seed_of(list[i].name), why, sizeof why) != 0)
            fail_msg("%s", why);
        const clattn_status st = ap_run(&p, 0, NULL, NULL);
        if (st != CLATTN_SUCCESS)
            fail_msg("%s: %s: %s", list[i].name, clattn_status_name(st), clattn_last_error(ctx));
        const int bad = ap_check(&p, why, sizeof why);
        ap_free(&p);
        if (bad)
            fail_msg("%s", why);
    }
    const clattn_cache_stats s = ctx->stats;
    print_message("new context on the shared directory: disk_hits %u builds %u disk_rejects %u\n", s.disk_hits,
                  s.builds, s.disk_rejects);
    clattn_release(ctx);
    assert_int_equal(s.builds, 0);
    assert_int_equal(s.disk_rejects, 0);
    assert_true(s.disk_hits > 0);
}

/* =============================== threads =============================== */

typedef struct worker {
    int index;
    pthread_barrier_t *start;
    const char *bad_spec; /* create_errors: the spec this thread fails with */
    cl_command_queue shared; /* shared_queue: every thread's context enqueues on this one queue */
    /* results, read by the main thread after the join */
    int failed;
    char why[512];
    unsigned builds, disk_hits;
} worker;

static void *attention_worker(void *arg)
{
    worker *w = arg;
    ap_problem probs[N_OF(shapes)];
    size_t ready = 0;
    clattn_context *ctx = NULL;
    /* Everybody creates a context at the same moment, then starts computing at the same moment. */
    pthread_barrier_wait(w->start);
    const clattn_status cst = w->shared != NULL ? clattn_create_from_queue(w->shared, &ctx) : clattn_create(NULL, &ctx);
    if (cst != CLATTN_SUCCESS) {
        w->failed = 1;
        snprintf(w->why, sizeof w->why, "thread %d: clattn_create: %s: %s", w->index, clattn_status_name(cst),
                 clattn_last_error(NULL));
    }
    for (; !w->failed && ready < N_OF(shapes); ++ready) {
        /* Each thread its own inputs (seed), so a mix-up between contexts would show. */
        const uint64_t seed = tu_seed_of(shapes[ready].name) + (uint64_t)w->index;
        if (ap_init(&probs[ready], ctx, &shapes[ready], seed, w->why, sizeof w->why) != 0)
            w->failed = 1;
    }
    pthread_barrier_wait(w->start);
    for (int round = 0; round < ROUNDS && !w->failed; ++round)
        for (size_t i = 0; i < ready && !w->failed; ++i) {
            /* Thread t starts at shape t, so different kernels run at the same time. */
            ap_problem *p = &probs[(i + (size_t)w->index) % ready];
            clattn_status st;
            if (ap_reset_outputs(p, w->why, sizeof w->why) != 0) {
                w->failed = 1;
            } else if ((st = ap_run(p, 0, NULL, NULL)) != CLATTN_SUCCESS) {
                w->failed = 1;
                snprintf(w->why, sizeof w->why, "thread %d round %d %s: %s: %s", w->index, round, p->s.name,
                         clattn_status_name(st), clattn_last_error(ctx));
            } else if (ap_check(p, w->why, sizeof w->why) != 0) {
                w->failed = 1;
            }
        }
    for (size_t i = 0; i < ready; ++i)
        ap_free(&probs[i]);
    if (ctx != NULL) {
        w->builds = ctx->stats.builds;
        w->disk_hits = ctx->stats.disk_hits;
    }
    clattn_release(ctx);
    return NULL;
}

static void run_workers(void *(*fn)(void *), worker *w, int n)
{
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, (unsigned)n), 0);
    pthread_t tid[THREADS];
    assert_true(n <= THREADS);
    int started = 0;
    for (int i = 0; i < n; ++i) {
        w[i].index = i;
        w[i].start = &start;
        if (pthread_create(&tid[i], NULL, fn, &w[i]) != 0)
            break;
        ++started;
    }
    /* A thread that could not start would leave the others waiting at the barrier for ever. */
    if (started != n) {
        fprintf(stderr, "test_threads: pthread_create failed after %d threads\n", started);
        abort();
    }
    for (int i = 0; i < n; ++i)
        assert_int_equal(pthread_join(tid[i], NULL), 0);
    pthread_barrier_destroy(&start);
}

static void contexts_in_parallel(const char *cache_dir, cl_command_queue shared)
{
    assert_true(clshim_active());
    clattn_release(tu_context()); /* skip (or fail) here without a device, not in the threads */
    if (cache_dir != NULL)
        setenv("CLATTN_CACHE_DIR", cache_dir, 1);
    clshim_counts before, after;
    clshim_get(&before);
    worker w[THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < THREADS; ++i)
        w[i].shared = shared;
    run_workers(attention_worker, w, THREADS);
    clshim_get(&after);
    restore_cache_dir();
    int failures = 0;
    for (int i = 0; i < THREADS; ++i) {
        print_message("thread %d: %s; builds %u, disk hits %u\n", i, w[i].failed ? w[i].why : "all results match",
                      w[i].builds, w[i].disk_hits);
        failures += w[i].failed;
    }
    assert_int_equal(failures, 0);
    char diff[256];
    if (!clshim_same_live(&before, &after, diff, sizeof diff))
        fail_msg("OpenCL objects left after every thread released its context: %s", diff);
    /* The counters saw the threads' contexts or, on a shared queue, their retains of it (the
     * interposition is not silently off). */
    if (shared == NULL)
        assert_true(after.created[CLSHIM_CONTEXT] - before.created[CLSHIM_CONTEXT] >= THREADS);
    else
        assert_true(after.retained[CLSHIM_QUEUE] - before.retained[CLSHIM_QUEUE] >= THREADS);
}

static void test_contexts_in_parallel(void **state)
{
    (void)state;
    contexts_in_parallel(NULL, NULL); /* the suite's cache directory: mostly loads */
}

static void test_shared_queue(void **state)
{
    (void)state;
    clattn_release(tu_context());
    cl_platform_id p;
    cl_device_id dev;
    assert_int_equal(clattn_select_device(NULL, &p, &dev, NULL, 0), CLATTN_SUCCESS);
    const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)p, 0};
    cl_int err;
    cl_context cl = clCreateContext(props, 1, &dev, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    cl_command_queue q = clCreateCommandQueue(cl, dev, 0, &err);
    assert_int_equal(err, CL_SUCCESS);
    contexts_in_parallel(NULL, q);
    clReleaseCommandQueue(q);
    clReleaseContext(cl);
}

static void test_fresh_cache_dir(void **state)
{
    (void)state;
    clattn_release(tu_context());
    char dir[PATH_MAX];
    make_tmpdir(dir, sizeof dir);
    contexts_in_parallel(dir, NULL);
    const int tmp = count_files(dir, ".tmp"), bins = count_files(dir, ".clbin"), all = count_files(dir, "");
    print_message("cache directory after the threads: %d entries, %d temporary files, %d in all\n", bins, tmp, all);
    if (tmp != 0 || bins <= 0 || all != bins) {
        remove_dir(dir);
        fail_msg("the shared cache directory holds %d entries, %d temporary files, %d files in all", bins, tmp, all);
    }
    expect_all_from_disk(dir, shapes, N_OF(shapes));
    remove_dir(dir);
}

static void *create_error_worker(void *arg)
{
    worker *w = arg;
    pthread_barrier_wait(w->start);
    for (int round = 0; round < 50 && !w->failed; ++round) {
        clattn_context *ctx = (clattn_context *)&w; /* must be overwritten with NULL */
        const clattn_status st = clattn_create(w->bad_spec, &ctx);
        const char *msg = clattn_last_error(NULL);
        if (st != CLATTN_NO_DEVICE || ctx != NULL || msg == NULL || strstr(msg, w->bad_spec) == NULL) {
            w->failed = 1;
            snprintf(w->why, sizeof w->why, "thread %d round %d: clattn_create(\"%s\") gave %s, message \"%s\"",
                     w->index, round, w->bad_spec, clattn_status_name(st), msg != NULL ? msg : "(null)");
        }
    }
    return NULL;
}

static void test_create_errors(void **state)
{
    (void)state;
    clattn_release(tu_context());
    static const char *const specs[THREADS] = {"no-such-device-alpha", "no-such-device-bravo",
                                               "no-such-device-charlie", "no-such-device-delta"};
    worker w[THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < THREADS; ++i)
        w[i].bad_spec = specs[i];
    run_workers(create_error_worker, w, THREADS);
    int failures = 0;
    for (int i = 0; i < THREADS; ++i)
        if (w[i].failed) {
            print_error("%s\n", w[i].why);
            ++failures;
        }
    assert_int_equal(failures, 0);
}

/* =============================== processes =============================== */

/* Child mode: context, "ready" on ready_fd, wait for EOF on start_fd, run and check every process
 * shape. Exit status 0 when every result matched. */
static int child_main(int ready_fd, int start_fd)
{
    clattn_context *ctx = NULL;
    if (clattn_create(NULL, &ctx) != CLATTN_SUCCESS) {
        fprintf(stderr, "child %ld: clattn_create: %s\n", (long)getpid(), clattn_last_error(NULL));
        return 2;
    }
    const char one = 1;
    if (write(ready_fd, &one, 1) != 1)
        return 3;
    close(ready_fd);
    char c;
    while (read(start_fd, &c, 1) > 0) {
    }
    close(start_fd);
    int failed = 0;
    char why[512] = "";
    for (size_t i = 0; i < N_OF(process_shapes) && !failed; ++i) {
        ap_problem p;
        if (ap_init(&p, ctx, &process_shapes[i], tu_seed_of(process_shapes[i].name), why, sizeof why) != 0) {
            failed = 1;
            break;
        }
        const clattn_status st = ap_run(&p, 0, NULL, NULL);
        if (st != CLATTN_SUCCESS) {
            failed = 1;
            snprintf(why, sizeof why, "%s: %s: %s", process_shapes[i].name, clattn_status_name(st),
                     clattn_last_error(ctx));
        } else if (ap_check(&p, why, sizeof why) != 0) {
            failed = 1;
        }
        ap_free(&p);
    }
    fprintf(stderr, "child %ld: %s; builds %u disk_hits %u disk_rejects %u disk_writes %u\n", (long)getpid(),
            failed ? why : "all results match", ctx->stats.builds, ctx->stats.disk_hits, ctx->stats.disk_rejects,
            ctx->stats.disk_writes);
    clattn_release(ctx);
    return failed ? 1 : 0;
}

static void test_shared_cache_dir(void **state)
{
    (void)state;
    clattn_release(tu_context()); /* skip here, not in the children, without a device */
    char dir[PATH_MAX];
    make_tmpdir(dir, sizeof dir);
    setenv("CLATTN_CACHE_DIR", dir, 1); /* inherited by the children */
    int forked = 0, got = 0;
    const int failures = tu_run_children("test_threads", "--process-child", PROCESSES, &forked, &got);
    restore_cache_dir();
    const int tmp = count_files(dir, ".tmp"), bins = count_files(dir, ".clbin"), all = count_files(dir, "");
    print_message("shared cache directory: %d entries, %d temporary files, %d in all\n", bins, tmp, all);
    if (forked != PROCESSES || got != PROCESSES || failures != 0 || tmp != 0 || bins <= 0 || all != bins) {
        remove_dir(dir);
        fail_msg("forked %d of %d, %d ready, %d failed; directory: %d entries, %d temporary, %d in all", forked,
                 PROCESSES, got, failures, bins, tmp, all);
    }
    expect_all_from_disk(dir, process_shapes, N_OF(process_shapes));
    remove_dir(dir);
    /* The tuning-directory half (two processes tuning into one CLATTN_TUNING_DIR, the file valid
     * afterwards) belongs here, once clattn-tune exists: add it as processes/shared_tuning_dir. */
}

/* =============================== registration =============================== */

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--process-child") == 0)
        return child_main(atoi(argv[2]), atoi(argv[3]));
    const char *e = getenv("CLATTN_CACHE_DIR");
    saved_cache_dir = e != NULL ? strdup(e) : NULL;

    tu_add_test("threads/contexts_in_parallel", NULL, test_contexts_in_parallel, NULL);
    tu_add_test("threads/fresh_cache_dir", NULL, test_fresh_cache_dir, NULL);
    tu_add_test("threads/shared_queue", NULL, test_shared_queue, NULL);
    tu_add_test("threads/create_errors", NULL, test_create_errors, NULL);
    tu_add_test("processes/shared_cache_dir", NULL, test_shared_cache_dir, NULL);
    const int failed = tu_run_tests("threads");
    free(saved_cache_dir);
    return failed;
}
