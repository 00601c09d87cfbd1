/*
 * Concurrency, as clattn.h states it: a context is used by one thread at a time, and separate
 * contexts may be used from separate threads at once, sharing a device and a cache directory.
 *
 *   threads/contexts_in_parallel   THREADS threads each create their own context at the same moment
 *                                  and run ROUNDS rounds of mixed attention problems (fused,
 *                                  unfused, decode with key splits, masks, f16) while the others do;
 *                                  every result must match the float64 reference (attnprob.c), and
 *                                  once every context is released no OpenCL object is left
 *                                  (clshim.c counts them across all threads). Before the threads,
 *                                  the main thread runs every shape once (a PoCL 3.1 bug, see
 *                                  contexts_in_parallel); so do the next two tests.
 *   threads/shared_queue           the same with contexts made by clattn_create_from_queue on one
 *                                  in-order queue of the caller's, all enqueueing on it at once.
 *   threads/fresh_cache_dir        the same with an empty cache directory, so the threads build the
 *                                  same programs and write the same cache entries at once; then a
 *                                  new context must find every entry on disk and build nothing.
 *   threads/create_errors          clattn_create failing in every thread at once: each thread's
 *                                  clattn_last_error(NULL) names its own spec (the message without
 *                                  a context is per thread).
 *   processes/first_create         OpenCL's first use in a process from several threads at once: in
 *                                  each of PROCESSES fresh processes (fork + exec, nothing of
 *                                  OpenCL touched before), THREADS threads call clattn_create at
 *                                  the same moment; every one must succeed (PoCL 3.1 set up its
 *                                  devices unlocked: the threads saw no device, or it crashed), and
 *                                  each context then runs a problem that matches the reference.
 *   processes/shared_cache_dir     two processes (fork + exec of this binary, so each starts OpenCL
 *                                  from scratch) share one fresh cache directory, start together,
 *                                  both build, both check their results against the reference; the
 *                                  directory then holds only whole, valid entries (no temporary
 *                                  file; a new context loads every program from it and builds none).
 *   processes/shared_tuning_dir    two processes share one fresh cache directory and one tuning
 *                                  directory; in each, one thread builds and checks the process
 *                                  problems while another, on its own context, does what clattn-tune
 *                                  does when it writes, over and over: read the store (the library's
 *                                  reader, clattn_reload_tuning), merge in its own results (buckets
 *                                  of its own, one more per round up to TUNE_ROUNDS), write it
 *                                  atomically (clattn__tuning_write). Every read, in both processes,
 *                                  must find a valid store once the process wrote it. The writer
 *                                  promises atomic replacement, not merging (the last rename wins,
 *                                  a result the other process wrote after the read is lost), so
 *                                  afterwards: one .tuning file and nothing else in the directory;
 *                                  it parses, names this device and driver, and holds only entries
 *                                  the processes wrote, with their values; each process's entries
 *                                  are a prefix of its rounds, and one process's are all there. A
 *                                  new context reports the file without a problem, clattn_get_params
 *                                  gives every entry in it as USER_FILE, and the process problems
 *                                  run from the cache alone and match the reference.
 *
 * Threads never call cmocka (its assertions longjmp): each records a status and a message, and the
 * main thread asserts on them after joining.
 */
#define _POSIX_C_SOURCE 200809L /* pthread_barrier, setenv, mkdtemp, fork, pipe */

#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
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

enum { THREADS = 4, ROUNDS = 20, PROCESSES = 2, TUNE_ROUNDS = 8 };

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

/* The environment the run started with, restored after each test. */
static char *saved_cache_dir, *saved_tuning_dir;

static void restore_env(const char *name, const char *saved)
{
    if (saved != NULL)
        setenv(name, saved, 1);
    else
        unsetenv(name);
}

static void restore_cache_dir(void)
{
    restore_env("CLATTN_CACHE_DIR", saved_cache_dir);
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

/* Runs every shape of list once on ctx, on this thread, and checks it against the reference. */
static void run_and_check_all(clattn_context *ctx, const ap_shape *list, size_t n)
{
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
}

/* A new context on `dir` runs every shape from the cache alone: disk hits, no build, no reject,
 * and results that match the reference. */
static void expect_all_from_disk(const char *dir, const ap_shape *list, size_t n)
{
    setenv("CLATTN_CACHE_DIR", dir, 1);
    clattn_context *ctx = tu_context();
    restore_cache_dir();
    run_and_check_all(ctx, list, n);
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
    /* Every shape once on this thread first, on the suite's cache directory (so that a fresh
     * directory still starts empty for the threads). This works around a PoCL 3.1 bug outside
     * clattn: PoCL's CPU driver keeps one entry per kernel, local size and widest grid seen so
     * far; a launch takes the entry that fits but gives back the first entry that matches the
     * kernel and local size. A launch on a wider grid than any before adds a new first entry, and
     * a launch of the same kernel still running on another queue at that moment gives back the
     * wrong one: `pocl_release_dlhandle_cache: Assertion 'found->ref_count > 0' failed` (docs/guarantees.md,
     * "Threads and processes"). Once each kernel has run on its widest grid, the threads'
     * launches find the entries they take and give back. */
    clattn_release(tu_context()); /* skip (or fail) here without a device, not in the threads */
    clattn_context *warm = NULL;
    assert_int_equal(clattn_create(NULL, &warm), CLATTN_SUCCESS); /* as the threads make theirs */
    run_and_check_all(warm, shapes, N_OF(shapes));
    clattn_release(warm);
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
        tu_remove_tree(dir);
        fail_msg("the shared cache directory holds %d entries, %d temporary files, %d files in all", bins, tmp, all);
    }
    expect_all_from_disk(dir, shapes, N_OF(shapes));
    tu_remove_tree(dir);
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

/* Runs and checks every process shape on ctx, starting at shape `first`. 0, or 1 with `why`. */
static int run_process_shapes(clattn_context *ctx, size_t first, char *why, size_t why_size)
{
    for (size_t j = 0; j < N_OF(process_shapes); ++j) {
        const ap_shape *s = &process_shapes[(first + j) % N_OF(process_shapes)];
        ap_problem p;
        if (ap_init(&p, ctx, s, tu_seed_of(s->name), why, why_size) != 0)
            return 1;
        const clattn_status st = ap_run(&p, 0, NULL, NULL);
        int failed = 0;
        if (st != CLATTN_SUCCESS) {
            failed = 1;
            snprintf(why, why_size, "%s: %s: %s", s->name, clattn_status_name(st), clattn_last_error(ctx));
        } else if (ap_check(&p, why, why_size) != 0) {
            failed = 1;
        }
        ap_free(&p);
        if (failed)
            return 1;
    }
    return 0;
}

/* Child mode: context, "ready" on ready_fd, wait for EOF on start_fd, run and check every process
 * shape. Exit status 0 when every result matched. */
static int child_main(int ready_fd, int start_fd)
{
    clattn_context *ctx = NULL;
    if (clattn_create(NULL, &ctx) != CLATTN_SUCCESS) {
        fprintf(stderr, "child %ld: clattn_create: %s\n", (long)getpid(), clattn_last_error(NULL));
        return 2;
    }
    if (tu_child_ready_then_wait(ready_fd, start_fd))
        return 3;
    char why[512] = "";
    const int failed = run_process_shapes(ctx, 0, why, sizeof why);
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
        tu_remove_tree(dir);
        fail_msg("forked %d of %d, %d ready, %d failed; directory: %d entries, %d temporary, %d in all", forked,
                 PROCESSES, got, failures, bins, tmp, all);
    }
    expect_all_from_disk(dir, process_shapes, N_OF(process_shapes));
    tu_remove_tree(dir);
}

/* ---- processes/first_create ---- */

typedef struct creator {
    pthread_barrier_t *start;
    clattn_context *ctx;
    clattn_status status;
    char why[512];
} creator;

static void *first_create_worker(void *arg)
{
    creator *c = arg;
    pthread_barrier_wait(c->start);
    c->status = clattn_create(NULL, &c->ctx);
    if (c->status != CLATTN_SUCCESS)
        snprintf(c->why, sizeof c->why, "%s", clattn_last_error(NULL));
    return NULL;
}

/* Child mode: wait for the start, then THREADS threads create this process's first contexts at
 * once; then, one context at a time (the PoCL 3.1 launch bug in the header of this file), each
 * runs a problem. Exit status 0 when every creation succeeded and every result matched. */
static int first_create_child_main(int ready_fd, int start_fd)
{
    if (tu_child_ready_then_wait(ready_fd, start_fd))
        return 3;
    pthread_barrier_t start;
    if (pthread_barrier_init(&start, NULL, THREADS) != 0)
        return 4;
    creator c[THREADS];
    memset(c, 0, sizeof c);
    pthread_t tid[THREADS];
    for (int i = 0; i < THREADS; ++i) {
        c[i].start = &start;
        if (pthread_create(&tid[i], NULL, first_create_worker, &c[i]) != 0) {
            fprintf(stderr, "child %ld: pthread_create failed\n", (long)getpid());
            _exit(5); /* the threads already started wait at the barrier for ever */
        }
    }
    for (int i = 0; i < THREADS; ++i)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&start);
    int failed = 0;
    for (int i = 0; i < THREADS; ++i) {
        char why[512] = "";
        if (c[i].status != CLATTN_SUCCESS) {
            fprintf(stderr, "child %ld thread %d: clattn_create: %s: %s\n", (long)getpid(), i,
                    clattn_status_name(c[i].status), c[i].why);
            failed = 1;
        } else if (run_process_shapes(c[i].ctx, (size_t)i, why, sizeof why) != 0) {
            fprintf(stderr, "child %ld thread %d: %s\n", (long)getpid(), i, why);
            failed = 1;
        }
        clattn_release(c[i].ctx);
    }
    return failed;
}

static void test_first_create(void **state)
{
    (void)state;
    clattn_release(tu_context()); /* skip here, not in the children, without a device */
    int forked = 0, got = 0;
    const int failures = tu_run_children("test_threads", "--first-create-child", PROCESSES, &forked, &got);
    if (forked != PROCESSES || got != PROCESSES || failures != 0)
        fail_msg("forked %d of %d, %d ready, %d failed", forked, PROCESSES, got, failures);
}

/* ---- processes/shared_tuning_dir ---- */

/* Process k's result of round r: its own operation (fused, or decode with its seventh value),
 * f32, head_dim 64, no mask, and a log2 seq_kv no process shape comes within 2 of, so the store
 * never changes which programs the process shapes build. Values tell process and round apart. */
static clattn_tuning_entry tune_entry(int k, int r)
{
    clattn_tuning_entry e;
    memset(&e, 0, sizeof e);
    e.op = k == 0 ? CLATTN_OP_FUSED : CLATTN_OP_DECODE;
    e.dtype = CLATTN_F32;
    e.head_dim = 64;
    e.mask_kind = 0;
    e.sq_class = k == 0 ? 3 : 0;
    e.log2_skv = (k == 0 ? 24 : 40) + r;
    e.n = clattn__param_count(e.op);
    for (int i = 0; i < e.n; ++i) {
        /* choices (DIRECT) stop below their largest value, the matrix kernel, which a device
         * without matrix units reports as the defaults it runs instead; the sizes still tell
         * entries apart */
        const int v = 100 * (k + 1) + 10 * r + i, hi = clattn__param_max(e.op, i);
        e.v[i] = v < hi ? v : hi - 1;
    }
    return e;
}

/* The problem class whose bucket is exactly tune_entry(k, r). */
static clattn_problem_class tune_class(int k, int r)
{
    const clattn_tuning_entry e = tune_entry(k, r);
    const clattn_problem_class pc = {(clattn_operation)e.op, CLATTN_F32, 64, k == 0 ? 1024 : 1,
                                     (int64_t)1 << e.log2_skv, 0, 0};
    return pc;
}

/* Checks a store's entries against what the processes write: every entry is tune_entry(k, r) of
 * some process k and round r, value for value; have[k] gets the rounds present as a bit mask.
 * 0, or 1 with `why`. */
static int check_store_entries(const clattn_tuning_table *t, unsigned have[PROCESSES], char *why, size_t why_size)
{
    for (int k = 0; k < PROCESSES; ++k)
        have[k] = 0;
    for (int i = 0; i < t->n; ++i) {
        int found = 0;
        for (int k = 0; k < PROCESSES && !found; ++k)
            for (int r = 0; r < TUNE_ROUNDS && !found; ++r) {
                const clattn_tuning_entry e = tune_entry(k, r);
                if (memcmp(&e, &t->e[i], sizeof e) == 0) {
                    found = 1;
                    have[k] |= 1u << r;
                }
            }
        if (!found) {
            char line[200];
            clattn__tuning_entry_text(&t->e[i], line, sizeof line);
            snprintf(why, why_size, "the store holds an entry no process wrote: %s", line);
            return 1;
        }
    }
    return 0;
}

typedef struct tune_writer {
    clattn_context *ctx; /* the writer's own context */
    int k;
    atomic_int *attention_done;
    /* results */
    int failed;
    char why[512];
    int writes;
} tune_writer;

/* What clattn-tune does when it writes, in a loop: read the store through the library (the
 * context's user file), take its entries, put this process's results over them, write it. Keeps
 * going until it has written every round and the attention thread has finished. */
static void *tune_writer_main(void *arg)
{
    tune_writer *w = arg;
    char path[4200], err[512];
    if (clattn_tuning_path(w->ctx, path, sizeof path) != CLATTN_SUCCESS) {
        w->failed = 1;
        snprintf(w->why, sizeof w->why, "clattn_tuning_path: %s", clattn_last_error(w->ctx));
        return NULL;
    }
    for (int iter = 0; !w->failed && (iter < TUNE_ROUNDS || !atomic_load(w->attention_done)); ++iter) {
        clattn_reload_tuning(w->ctx);
        const char *report = clattn_tuning_report(w->ctx);
        const clattn_tuning_table *cur = w->ctx->user_tuning;
        unsigned have[PROCESSES];
        if (strstr(report, "ignored") != NULL || (w->writes > 0 && cur == NULL)) {
            w->failed = 1;
            snprintf(w->why, sizeof w->why, "read %d: %.400s", iter, report);
            break;
        }
        if (cur != NULL && check_store_entries(cur, have, w->why, sizeof w->why) != 0) {
            w->failed = 1;
            break;
        }
        clattn_tuning_table tab;
        memset(&tab, 0, sizeof tab);
        snprintf(tab.device, sizeof tab.device, "%s", w->ctx->dev.key);
        snprintf(tab.driver, sizeof tab.driver, "%s", w->ctx->dev.driver);
        int bad = 0;
        for (int i = 0; cur != NULL && i < cur->n && !bad; ++i)
            bad = clattn__tuning_put(&tab, &cur->e[i]) != 0;
        for (int r = 0; r < TUNE_ROUNDS && r <= iter && !bad; ++r) {
            const clattn_tuning_entry e = tune_entry(w->k, r);
            bad = clattn__tuning_put(&tab, &e) != 0;
        }
        if (bad || clattn__tuning_write(path, &tab, err, sizeof err) != 0) {
            w->failed = 1;
            snprintf(w->why, sizeof w->why, "write %d: %.400s", iter, bad ? "out of host memory" : err);
        } else {
            ++w->writes;
        }
        clattn__tuning_free(&tab);
        const struct timespec pause = {0, 2000000}; /* 2 ms: many writes, yet the builds progress */
        nanosleep(&pause, NULL);
    }
    return NULL;
}

/* Child mode (--tuning-child): claim an index in $CLATTN_TEST_SLOT_DIR, make two contexts, report
 * ready, wait for the start, then build and check the process shapes on one thread while the
 * other writes the tuning store. Exit status 0 when everything held. */
static int tuning_child_main(int ready_fd, int start_fd)
{
    const char *slots = getenv("CLATTN_TEST_SLOT_DIR");
    int k = -1;
    for (int i = 0; slots != NULL && i < PROCESSES && k < 0; ++i) {
        char slot[PATH_MAX];
        snprintf(slot, sizeof slot, "%s/slot-%d", slots, i);
        const int fd = open(slot, O_CREAT | O_EXCL | O_WRONLY, 0600);
        if (fd >= 0) {
            close(fd);
            k = i;
        }
    }
    if (k < 0) {
        fprintf(stderr, "tuning child %ld: no free slot in %s\n", (long)getpid(), slots ? slots : "(unset)");
        return 2;
    }
    clattn_context *ctx = NULL, *wctx = NULL;
    if (clattn_create(NULL, &ctx) != CLATTN_SUCCESS || clattn_create(NULL, &wctx) != CLATTN_SUCCESS) {
        fprintf(stderr, "tuning child %d: clattn_create: %s\n", k, clattn_last_error(NULL));
        clattn_release(ctx);
        return 2;
    }
    if (tu_child_ready_then_wait(ready_fd, start_fd))
        return 3;

    atomic_int done = 0;
    tune_writer w;
    memset(&w, 0, sizeof w);
    w.ctx = wctx;
    w.k = k;
    w.attention_done = &done;
    pthread_t tid;
    if (pthread_create(&tid, NULL, tune_writer_main, &w) != 0) {
        fprintf(stderr, "tuning child %d: pthread_create failed\n", k);
        return 4;
    }
    char why[512] = "";
    const int failed = run_process_shapes(ctx, (size_t)k, why, sizeof why);
    atomic_store(&done, 1);
    pthread_join(tid, NULL);
    fprintf(stderr, "tuning child %d: attention: %s (builds %u, disk_hits %u); store: %s, %d writes\n", k,
            failed ? why : "all results match", ctx->stats.builds, ctx->stats.disk_hits,
            w.failed ? w.why : "every read valid", w.writes);
    clattn_release(ctx);
    clattn_release(wctx);
    return failed || w.failed ? 1 : 0;
}

/* Checks the tuning directory after the children; the caller removes the directories. */
static void expect_valid_store(const char *tdir)
{
    const int tmp = count_files(tdir, ".tmp"), stores = count_files(tdir, ".tuning"), all = count_files(tdir, "");
    print_message("tuning directory: %d store file(s), %d temporary, %d in all\n", stores, tmp, all);
    if (tmp != 0 || stores != 1 || all != 1)
        fail_msg("the tuning directory holds %d store files, %d temporary files, %d files in all", stores, tmp, all);

    clattn_context *ctx = tu_context(); /* CLATTN_TUNING_DIR is still the shared directory */
    char path[4200];
    assert_int_equal(clattn_tuning_path(ctx, path, sizeof path), CLATTN_SUCCESS);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open the store %s: %s", path, strerror(errno));
    static char text[1 << 16];
    const size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    assert_true(len > 0 && len < sizeof text);
    clattn_tuning_table t;
    char err[200] = "";
    if (clattn__tuning_parse(text, len, &t, err, sizeof err) != 0)
        fail_msg("the store does not parse: %s", err);
    char why[512] = "";
    unsigned have[PROCESSES];
    const int bad = check_store_entries(&t, have, why, sizeof why);
    const int pattern = t.device_is_pattern, same_device = strcmp(t.device, ctx->dev.key) == 0,
              same_driver = strcmp(t.driver, ctx->dev.driver) == 0, n = t.n;
    /* The entries the get_params check below expects, before the table goes. */
    int rounds[PROCESSES];
    for (int k = 0; k < PROCESSES; ++k) {
        rounds[k] = 0;
        while (rounds[k] < TUNE_ROUNDS && ((have[k] >> rounds[k]) & 1u))
            ++rounds[k];
        print_message("process %d: %d of %d rounds in the store (mask 0x%x)\n", k, rounds[k], TUNE_ROUNDS, have[k]);
    }
    clattn__tuning_free(&t);
    if (bad)
        fail_msg("%s", why);
    assert_false(pattern);
    assert_true(same_device);
    assert_true(same_driver);
    /* Each process's results are a prefix of its rounds (every write of it held all earlier ones),
     * and the last writer's are all there. */
    int complete = 0;
    for (int k = 0; k < PROCESSES; ++k) {
        if (have[k] != (1u << rounds[k]) - 1u)
            fail_msg("process %d's entries are not a prefix of its rounds (mask 0x%x)", k, have[k]);
        complete += rounds[k] == TUNE_ROUNDS;
    }
    assert_true(complete >= 1);
    assert_int_equal(n, rounds[0] + rounds[1]);

    const char *report = clattn_tuning_report(ctx);
    char want[64];
    snprintf(want, sizeof want, ": %d entries", n);
    print_message("new context: %s\n", report);
    if (strstr(report, "user tuning file") == NULL || strstr(report, want) == NULL ||
        strstr(report, "ignored") != NULL || strstr(report, "differs") != NULL)
        fail_msg("the tuning report of a new context is \"%s\"", report);
    for (int k = 0; k < PROCESSES; ++k)
        for (int r = 0; r < rounds[k]; ++r) {
            const clattn_problem_class pc = tune_class(k, r);
            const clattn_tuning_entry e = tune_entry(k, r);
            clattn_kernel_params kp;
            assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
            if (kp.source != CLATTN_SOURCE_USER_FILE || kp.count != e.n ||
                memcmp(kp.values, e.v, sizeof e.v) != 0)
                fail_msg("process %d round %d: clattn_get_params gives %s values (%d, %d, ...): %s", k, r,
                         clattn_params_source_name(kp.source), kp.values[0], kp.values[1], kp.origin);
        }
    clattn_release(ctx);
}

static void test_shared_tuning_dir(void **state)
{
    (void)state;
    clattn_release(tu_context()); /* skip here, not in the children, without a device */
    char cdir[PATH_MAX], tdir[PATH_MAX], sdir[PATH_MAX];
    make_tmpdir(cdir, sizeof cdir);
    make_tmpdir(tdir, sizeof tdir);
    make_tmpdir(sdir, sizeof sdir);
    /* Inherited by the children; an environment override would hide the store's entries. */
    setenv("CLATTN_CACHE_DIR", cdir, 1);
    setenv("CLATTN_TUNING_DIR", tdir, 1);
    setenv("CLATTN_TEST_SLOT_DIR", sdir, 1);
    unsetenv("CLATTN_PARAMS_FUSED");
    unsetenv("CLATTN_PARAMS_DECODE");
    int forked = 0, got = 0;
    const int failures = tu_run_children("test_threads", "--tuning-child", PROCESSES, &forked, &got);
    unsetenv("CLATTN_TEST_SLOT_DIR");
    tu_remove_tree(sdir);
    const int ctmp = count_files(cdir, ".tmp"), bins = count_files(cdir, ".clbin"), call = count_files(cdir, "");
    if (forked != PROCESSES || got != PROCESSES || failures != 0 || ctmp != 0 || bins <= 0 || call != bins) {
        restore_cache_dir();
        restore_env("CLATTN_TUNING_DIR", saved_tuning_dir);
        tu_remove_tree(cdir);
        tu_remove_tree(tdir);
        fail_msg("forked %d of %d, %d ready, %d failed; cache directory: %d entries, %d temporary, %d in all",
                 forked, PROCESSES, got, failures, bins, ctmp, call);
    }
    /* The directories stay behind if a check fails, for a look at them. */
    expect_valid_store(tdir);
    expect_all_from_disk(cdir, process_shapes, N_OF(process_shapes)); /* with the store in place */
    restore_env("CLATTN_TUNING_DIR", saved_tuning_dir);
    tu_remove_tree(cdir);
    tu_remove_tree(tdir);
}

/* =============================== registration =============================== */

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--process-child") == 0)
        return child_main(atoi(argv[2]), atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "--first-create-child") == 0)
        return first_create_child_main(atoi(argv[2]), atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "--tuning-child") == 0)
        return tuning_child_main(atoi(argv[2]), atoi(argv[3]));
    const char *e = getenv("CLATTN_CACHE_DIR");
    saved_cache_dir = e != NULL ? strdup(e) : NULL;
    e = getenv("CLATTN_TUNING_DIR");
    saved_tuning_dir = e != NULL ? strdup(e) : NULL;
    /* These tests are of the disk cache (its directory shared by threads and processes): on, whatever
     * the run's CLATTN_CACHE (scripts/test.sh turns it off for the rest of the suite). The children
     * inherit it. */
    unsetenv("CLATTN_CACHE");

    tu_add_test("threads/contexts_in_parallel", NULL, test_contexts_in_parallel, NULL);
    tu_add_test("threads/fresh_cache_dir", NULL, test_fresh_cache_dir, NULL);
    tu_add_test("threads/shared_queue", NULL, test_shared_queue, NULL);
    tu_add_test("threads/create_errors", NULL, test_create_errors, NULL);
    tu_add_test("processes/first_create", NULL, test_first_create, NULL);
    tu_add_test("processes/shared_cache_dir", NULL, test_shared_cache_dir, NULL);
    tu_add_test("processes/shared_tuning_dir", NULL, test_shared_tuning_dir, NULL);
    const int failed = tu_run_tests("threads");
    free(saved_cache_dir);
    free(saved_tuning_dir);
    return failed;
}
