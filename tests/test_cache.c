/*
 * The program cache: memory hits, disk misses and hits, files that must be ignored (corrupt,
 * truncated, foreign, garbage, a header claiming a huge payload, or no regular file at all: a FIFO,
 * a directory, a device) and healed, CLATTN_CACHE=0 and its other spellings, directories that
 * cannot be written or read or whose path is too long (then no tuning directory is derived either),
 * several processes writing one entry at once, kernels that fail to compile, and the time a warm
 * cache saves (printed, not asserted), and that a build writes nothing to stderr. Entries and
 * directories the user does not own, or that group or others can write, a symbolic link as an
 * entry and a directory swapped after it was opened are not trusted (rows that give files to
 * another user need root, as in CI, and skip otherwise); files are written 0600 and directories
 * 0700 whatever the umask.
 *
 * Every test gets a fresh mkdtemp directory as CLATTN_CACHE_DIR, set before clattn_create (the
 * context reads it once, at creation), and reads the context's private counters (ctx->stats) to tell
 * a disk hit from a build. PoCL builds take seconds, so the tests share two option strings, and
 * tests that need a valid file start from a copy of one built once ("seed") instead of rebuilding.
 *
 * The multi-process test re-executes this binary (/proc/self/exe --cache-child ...) after fork(), so
 * each child starts OpenCL from scratch instead of inheriting the parent's driver threads and locks.
 *
 * Table-driven: each table row is one cmocka test named "<area>/<row>"; main() refuses duplicate names.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkdtemp, fork, pipe, clock_gettime, dirent */

#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The softmax kernel clattn_softmax itself builds for f32 on a CPU (WG 16; forced on other devices
 * through CLATTN_PARAMS_SOFTMAX), so a public call can prove a cached binary computes correctly. */
#define OPT_A "-cl-std=CL1.2 -DDT_A=0 -DDT_OUT=0 -DDT_MASK=0 -DWG=16 -DKSEL=1 -DK_softmax=1"
/* The same source with other options: a different cache key, for the "foreign file" case. */
#define OPT_B "-cl-std=CL1.2 -DDT_A=0 -DDT_OUT=0 -DDT_MASK=0 -DWG=32 -DKSEL=1 -DK_softmax=1"
#define OPT_FUSED \
    "-cl-std=CL1.2 -DDT_IN=0 -DDT_OUT=0 -DDT_MASK=0 -DWGX=4 -DWGY=4 -DRM=8 -DNS=2 -DNV=4 -DDP=64"

/* =============================== files and directories =============================== */

static char g_dir[PATH_MAX];   /* this test's cache directory */
static char *saved_cache_dir;  /* the environment the run started with, restored after each test */
static char *saved_cache;
static char *saved_xdg;
static char *saved_tuning_dir;

static void restore_env(const char *name, const char *saved)
{
    if (saved != NULL)
        setenv(name, saved, 1);
    else
        unsetenv(name);
}

/* TU_TRUST_DIR_REPLACED: g_dir is renamed to replaced_old and replaced_new to g_dir when the
 * library has opened g_dir to read an entry, before it opens the entry. */
static char replaced_old[PATH_MAX + 16], replaced_new[PATH_MAX + 16];
static int replaced; /* 1 once done, -1 if a rename failed */

/* Leftovers of a failed TU_TRUST_DIR_REPLACED row (setup) or of this one (the row itself). */
static void remove_replaced_dirs(void)
{
    if (replaced_old[0] != '\0')
        tu_remove_tree(replaced_old);
    if (replaced_new[0] != '\0')
        tu_remove_tree(replaced_new);
    replaced_old[0] = replaced_new[0] = '\0';
}

static void make_tmpdir(char *out, size_t size)
{
    const char *base = getenv("TMPDIR");
    if (base == NULL || *base == '\0')
        base = "/tmp";
    snprintf(out, size, "%s/clattn-cache-test-XXXXXX", base);
    if (mkdtemp(out) == NULL)
        fail_msg("mkdtemp(%s): %s", out, strerror(errno));
}

static int ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Number of entries of `dir` ending in `suffix`; the first one's full path into `first`. */
static int count_files(const char *dir, const char *suffix, char *first, size_t first_size)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!ends_with(e->d_name, suffix))
            continue;
        if (n == 0 && first != NULL)
            snprintf(first, first_size, "%s/%s", dir, e->d_name);
        ++n;
    }
    closedir(d);
    return n;
}

/* Every entry of `dir` except . and .. */
static int count_entries(const char *dir)
{
    return count_files(dir, "", NULL, 0) - 2;
}

typedef struct blob {
    unsigned char *data;
    size_t size;
} blob;

static blob read_whole(const char *path)
{
    blob b = {NULL, 0};
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("open %s: %s", path, strerror(errno));
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    const long n = ftell(f);
    assert_true(n >= 0);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    b.size = (size_t)n;
    b.data = malloc(b.size > 0 ? b.size : 1);
    assert_non_null(b.data);
    assert_int_equal(fread(b.data, 1, b.size, f), b.size);
    fclose(f);
    return b;
}

static void write_whole(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        fail_msg("create %s: %s", path, strerror(errno));
    if (size > 0)
        assert_int_equal(fwrite(data, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
}

/* The cache file layout (src/cache.c): magic, key, payload size (8 bytes, little-endian), hash. */
enum { HEADER_BYTES = 16 + 32 + 8 + 8 };
#define HUGE_PAYLOAD (512ull << 20)

static void put_size(unsigned char *header, unsigned long long size)
{
    for (int i = 0; i < 8; ++i)
        header[48 + i] = (unsigned char)(size >> (8 * i));
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* =============================== fixtures =============================== */

static int setup_dir(void **state)
{
    (void)state;
    /* cmocka 1.1.5 skips the teardown of a test that failed or skipped: clean up after it here. */
    if (g_dir[0] != '\0')
        tu_remove_tree(g_dir);
    remove_replaced_dirs(); /* trust/dir_replaced_after_open's, when it failed */
    const char *base = getenv("TMPDIR");
    if (base == NULL || *base == '\0')
        base = "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/clattn-cache-test-XXXXXX", base);
    if (mkdtemp(g_dir) == NULL) {
        fprintf(stderr, "mkdtemp(%s): %s\n", g_dir, strerror(errno));
        return -1;
    }
    setenv("CLATTN_CACHE_DIR", g_dir, 1);
    unsetenv("CLATTN_CACHE");
    return 0;
}

static int teardown_dir(void **state)
{
    (void)state;
    tu_remove_tree(g_dir);
    g_dir[0] = '\0';
    restore_env("CLATTN_CACHE_DIR", saved_cache_dir);
    restore_env("CLATTN_CACHE", saved_cache);
    restore_env("XDG_CACHE_HOME", saved_xdg);
    restore_env("CLATTN_TUNING_DIR", saved_tuning_dir);
    return 0;
}

/* A context on the current CLATTN_CACHE_DIR; skips (or fails under CLATTN_REQUIRE_DEVICE=1)
 * without a device. Its counters start at zero. */
static clattn_context *new_context(void)
{
    clattn_context *ctx = tu_context();
    const clattn_cache_stats zero = {0, 0, 0, 0, 0, 0};
    assert_memory_equal(&ctx->stats, &zero, sizeof zero);
    assert_true(ctx->build_seconds == 0 && ctx->build_seconds_max == 0);
    assert_string_equal(ctx->build_slowest, "");
    return ctx;
}

static cl_kernel get_kernel_ok(clattn_context *ctx, const char *file, const char *options,
                               const char *name)
{
    cl_kernel k = NULL;
    const clattn_status st = clattn__get_kernel(ctx, file, options, name, &k);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn__get_kernel(%s, \"%s\"): %s: %s", file, options, clattn_status_name(st),
                 clattn_last_error(ctx));
    assert_non_null(k);
    char fn[64];
    assert_int_equal(clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof fn, fn, NULL), CL_SUCCESS);
    assert_string_equal(fn, name);
    return k;
}

static void print_stats(const char *what, const clattn_context *ctx)
{
    const clattn_cache_stats *s = &ctx->stats;
    print_message("%s: memory_hits %u disk_hits %u disk_rejects %u disk_writes %u builds %u disk_untrusted %u\n",
                  what, s->memory_hits, s->disk_hits, s->disk_rejects, s->disk_writes, s->builds, s->disk_untrusted);
}

/* clattn_softmax on a small f32 problem, checked against the float64 reference: proves the kernel
 * the context holds (built or loaded from disk) computes, and that a successful public call clears
 * the last error. */
static void check_softmax_runs(clattn_context *ctx)
{
    enum { ROWS = 3, COLS = 37 };
    float x[ROWS * COLS], y[ROWS * COLS];
    double xd[ROWS * COLS], yd[ROWS * COLS], want[ROWS * COLS];
    tu_rng rng;
    tu_seed(&rng, 77);
    tu_fill(&rng, CLATTN_F32, x, xd, ROWS * COLS, -3.0, 3.0);
    cl_mem bin = tu_buffer(ctx, sizeof x, x), bout = tu_buffer(ctx, sizeof y, NULL);
    const clattn_tensor tin = clattn_tensor_bhsd(bin, CLATTN_F32, 1, 1, ROWS, COLS);
    const clattn_tensor tout = clattn_tensor_bhsd(bout, CLATTN_F32, 1, 1, ROWS, COLS);
    clattn_softmax_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = 1;
    desc.heads = 1;
    desc.rows = ROWS;
    desc.cols = COLS;
    const unsigned builds = ctx->stats.builds;
    const clattn_status st = clattn_softmax(ctx, &desc, &tin, &tout, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_softmax: %s: %s", clattn_status_name(st), clattn_last_error(ctx));
    assert_string_equal(clattn_last_error(ctx), "");
    assert_int_equal(clattn_last_cl_error(ctx), CL_SUCCESS);
    tu_read(ctx, bout, sizeof y, y);
    clReleaseMemObject(bin);
    clReleaseMemObject(bout);
    if (ctx->stats.builds != builds)
        print_message("note: clattn_softmax built its own kernel; its options differ from OPT_A\n");
    const ref_softmax r = {1, 1, ROWS, COLS, 0.0, 0, NULL, {0, 0, 0, 0}, NULL};
    ref_softmax_rows(&r, xd, want);
    for (size_t i = 0; i < ROWS * COLS; ++i)
        yd[i] = y[i];
    tu_assert_allclose("softmax with the cached kernel", yd, want, ROWS * COLS, 1e-6, 1e-5);
}

/* =============================== seeds: valid files built once =============================== */

typedef struct seed {
    int ready;
    char file[128]; /* "<key>.clbin" */
    blob content;
} seed;

static seed seed_a, seed_b;

static void build_seed(seed *s, const char *options)
{
    clattn_release(tu_context()); /* skip before making a directory nobody would remove */
    char dir[PATH_MAX];
    make_tmpdir(dir, sizeof dir);
    setenv("CLATTN_CACHE_DIR", dir, 1);
    clattn_context *ctx = tu_context();
    setenv("CLATTN_CACHE_DIR", g_dir, 1);
    get_kernel_ok(ctx, "softmax.cl", options, "softmax");
    assert_int_equal(ctx->stats.disk_writes, 1);
    clattn_release(ctx);
    char path[PATH_MAX + 256];
    assert_int_equal(count_files(dir, ".clbin", path, sizeof path), 1);
    s->content = read_whole(path);
    snprintf(s->file, sizeof s->file, "%s", strrchr(path, '/') + 1);
    tu_remove_tree(dir);
    s->ready = 1;
}

static const seed *get_seed_a(void)
{
    if (!seed_a.ready)
        build_seed(&seed_a, OPT_A);
    return &seed_a;
}

static const seed *get_seed_b(void)
{
    if (!seed_b.ready)
        build_seed(&seed_b, OPT_B);
    return &seed_b;
}

/* Copies a seed into g_dir under its own name (or `as`); returns the path in `path`. */
static void plant(const seed *s, const char *as, char *path, size_t size)
{
    snprintf(path, size, "%s/%s", g_dir, as != NULL ? as : s->file);
    write_whole(path, s->content.data, s->content.size);
}

/* A further context on g_dir finds the entry on disk and builds nothing. */
static void expect_disk_hit(void)
{
    clattn_context *ctx = new_context();
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    print_stats("next context", ctx);
    assert_int_equal(ctx->stats.disk_hits, 1);
    assert_int_equal(ctx->stats.builds, 0);
    assert_int_equal(ctx->stats.disk_rejects, 0);
    assert_int_equal(ctx->stats.disk_writes, 0);
    /* A load is not a build: no build time, no slowest build (clattn-bench reports both). */
    assert_true(ctx->build_seconds == 0);
    assert_string_equal(ctx->build_slowest, "");
    check_softmax_runs(ctx);
    clattn_release(ctx);
}

/* =============================== miss, hit, memory hit =============================== */

static void test_miss_then_hit(void **state)
{
    (void)state;
    clattn_context *ctx = new_context();
    cl_kernel k1 = get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    print_stats("first context", ctx);
    assert_int_equal(ctx->stats.builds, 1);
    assert_int_equal(ctx->stats.disk_writes, 1);
    assert_int_equal(ctx->stats.disk_hits, 0);
    assert_int_equal(ctx->stats.disk_rejects, 0);
    assert_int_equal(ctx->stats.memory_hits, 0);
    /* The build's time is counted, and the one build is the slowest, named by file and options. */
    const double built_in = ctx->build_seconds;
    print_message("built in %.3f s: %s\n", built_in, ctx->build_slowest);
    assert_true(built_in > 0 && built_in < 3600);
    assert_true(ctx->build_seconds_max == built_in);
    assert_true(strncmp(ctx->build_slowest, "softmax.cl \"", strlen("softmax.cl \"")) == 0);
    assert_non_null(strstr(ctx->build_slowest, OPT_A));

    /* One entry, named by a 32-hex-digit key, and no temporary file left behind. */
    char path[PATH_MAX + 256];
    assert_int_equal(count_files(g_dir, ".clbin", path, sizeof path), 1);
    assert_int_equal(count_files(g_dir, ".tmp", NULL, 0), 0);
    assert_int_equal(count_entries(g_dir), 1);
    const char *base = strrchr(path, '/') + 1;
    assert_int_equal(strlen(base), 32 + strlen(".clbin"));
    for (int i = 0; i < 32; ++i)
        assert_non_null(strchr("0123456789abcdefABCDEF", base[i]));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > 64);

    /* Asking the same context again: the same kernel, from memory, nothing read or built. */
    cl_kernel k2 = get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    assert_ptr_equal(k1, k2);
    assert_int_equal(ctx->stats.memory_hits, 1);
    assert_int_equal(ctx->stats.builds, 1);
    assert_true(ctx->build_seconds == built_in);
    assert_int_equal(ctx->stats.disk_hits, 0);
    assert_int_equal(ctx->stats.disk_writes, 1);
    clattn_release(ctx);

    /* A second context with the same options: from disk. */
    expect_disk_hit();
    assert_int_equal(count_files(g_dir, ".clbin", NULL, 0), 1);
}

/* =============================== damaged files =============================== */

typedef enum damage {
    DAMAGE_FLIP_MIDDLE,     /* 16 bytes in the middle of the payload inverted */
    DAMAGE_FLIP_FIRST_BYTE, /* the header's first byte inverted */
    DAMAGE_TRUNCATE_HALF,
    DAMAGE_TRUNCATE_64,
    DAMAGE_EMPTY,
    DAMAGE_TRAILING_BYTE,   /* one byte appended */
    DAMAGE_FOREIGN,         /* a valid file of another key, renamed to this key */
    DAMAGE_GARBAGE,         /* random bytes of the same length */
    DAMAGE_HUGE_SIZE        /* the header's payload size 512 MiB, the most the loader accepts */
} damage;

typedef struct damage_row {
    const char *name;
    damage kind;
} damage_row;

static const damage_row damage_rows[] = {
    {"corrupt_middle", DAMAGE_FLIP_MIDDLE},
    {"corrupt_first_byte", DAMAGE_FLIP_FIRST_BYTE},
    {"truncated_half", DAMAGE_TRUNCATE_HALF},
    {"truncated_64_bytes", DAMAGE_TRUNCATE_64},
    {"empty", DAMAGE_EMPTY},
    {"trailing_byte", DAMAGE_TRAILING_BYTE},
    {"foreign", DAMAGE_FOREIGN},
    {"garbage", DAMAGE_GARBAGE},
    {"huge_payload_size", DAMAGE_HUGE_SIZE},
};

static void test_damaged(void **state)
{
    const damage_row *r = *state;
    const seed *a = get_seed_a();
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", g_dir, a->file);
    blob b = {malloc(a->content.size + 1), a->content.size};
    assert_non_null(b.data);
    memcpy(b.data, a->content.data, a->content.size);
    switch (r->kind) {
    case DAMAGE_FLIP_MIDDLE:
        for (size_t i = b.size / 2; i < b.size / 2 + 16 && i < b.size; ++i)
            b.data[i] ^= 0xFF;
        break;
    case DAMAGE_FLIP_FIRST_BYTE:
        b.data[0] ^= 0xFF;
        break;
    case DAMAGE_TRUNCATE_HALF:
        b.size /= 2;
        break;
    case DAMAGE_TRUNCATE_64:
        b.size = 64;
        break;
    case DAMAGE_EMPTY:
        b.size = 0;
        break;
    case DAMAGE_TRAILING_BYTE:
        b.data[b.size++] = 0;
        break;
    case DAMAGE_FOREIGN: {
        const seed *other = get_seed_b();
        assert_string_not_equal(other->file, a->file);
        /* Put the other key's file in place under its own name, then rename it over ours. */
        char other_path[PATH_MAX + 256];
        plant(other, NULL, other_path, sizeof other_path);
        assert_int_equal(rename(other_path, path), 0);
        free(b.data);
        b.data = NULL;
        break;
    }
    case DAMAGE_GARBAGE: {
        tu_rng rng;
        tu_seed(&rng, 0xC0FFEE);
        for (size_t i = 0; i < b.size; ++i)
            b.data[i] = (unsigned char)tu_next(&rng);
        break;
    }
    case DAMAGE_HUGE_SIZE:
        put_size(b.data, HUGE_PAYLOAD);
        break;
    }
    if (b.data != NULL) {
        write_whole(path, b.data, b.size);
        free(b.data);
    }
    assert_int_equal(count_files(g_dir, ".clbin", NULL, 0), 1);

    clattn_context *ctx = new_context();
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    print_stats(r->name, ctx);
    assert_int_equal(ctx->stats.builds, 1);
    assert_true(ctx->stats.disk_rejects >= 1);
    assert_int_equal(ctx->stats.disk_hits, 0);
    assert_int_equal(ctx->stats.disk_writes, 1); /* the rebuilt binary replaces the bad file */
    check_softmax_runs(ctx);
    clattn_release(ctx);

    assert_int_equal(count_files(g_dir, ".clbin", NULL, 0), 1);
    assert_int_equal(count_files(g_dir, ".tmp", NULL, 0), 0);
    expect_disk_hit();
}

/* A header claiming a huge payload is refused before anything is allocated for it: the loader,
 * run in a child process (whose peak virtual size starts at its size when forked), returns
 * nothing and its peak grows by far less than the claim. */
static long vm_peak_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f != NULL && kib < 0 && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "VmPeak:", 7) == 0)
            kib = atol(line + 7);
    if (f != NULL)
        fclose(f);
    return kib;
}

static void test_huge_payload_no_allocation(void **state)
{
    (void)state;
    static const char hex[] = "00112233445566778899aabbccddeeff";
    enum { PAYLOAD = 4096 };
    unsigned char file[HEADER_BYTES + PAYLOAD];
    memset(file, 0x5A, sizeof file);
    memcpy(file, "CLATTN-BINARY-1", 16); /* with its terminating NUL: the 16-byte magic */
    memcpy(file + 16, hex, 32);
    put_size(file, HUGE_PAYLOAD);
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s.clbin", g_dir, hex);
    write_whole(path, file, sizeof file);

    clattn_context *ctx = new_context();
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        const long before = vm_peak_kib();
        size_t size = 0;
        unsigned char *bin = clattn__cache_load(ctx, hex, &size);
        const long grew = vm_peak_kib() - before;
        fprintf(stderr, "huge payload: loaded %s, rejects %u, peak virtual size grew by %ld KiB\n",
                bin ? "a binary" : "nothing", ctx->stats.disk_rejects, grew);
        _exit(before > 0 && bin == NULL && ctx->stats.disk_rejects == 1 && grew < (64 << 10) ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    clattn_release(ctx);
}

/* =============================== cache off, unwritable directories =============================== */

static void test_cache_off(void **state)
{
    (void)state;
    setenv("CLATTN_CACHE", "0", 1);
    clattn_context *ctx = new_context();
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    print_stats("CLATTN_CACHE=0", ctx);
    assert_int_equal(ctx->stats.builds, 1);
    assert_int_equal(ctx->stats.disk_writes, 0);
    assert_int_equal(count_entries(g_dir), 0);
    check_softmax_runs(ctx);
    clattn_release(ctx);

    /* Nor is a valid file read. */
    char path[PATH_MAX + 256];
    plant(get_seed_a(), NULL, path, sizeof path);
    ctx = new_context();
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    assert_int_equal(ctx->stats.builds, 1);
    assert_int_equal(ctx->stats.disk_hits, 0);
    assert_int_equal(ctx->stats.disk_rejects, 0);
    assert_int_equal(ctx->stats.disk_writes, 0);
    assert_int_equal(count_entries(g_dir), 1);
    clattn_release(ctx);
}

/* CLATTN_CACHE (any clattn__env_flag variable) in other spellings: case does not matter, and a
 * value that is none of the words keeps the default rather than flipping it. */
typedef struct flag_row {
    const char *name;
    const char *value; /* NULL: unset */
    int if_default_0;  /* clattn__env_flag(name, 0) */
    int if_default_1;  /* clattn__env_flag(name, 1) */
} flag_row;

static const flag_row flag_rows[] = {
    {"0", "0", 0, 0},
    {"1", "1", 1, 1},
    {"off", "off", 0, 0},
    {"OFF_upper", "OFF", 0, 0},
    {"Off_mixed", "Off", 0, 0},
    {"on", "on", 1, 1},
    {"ON_upper", "ON", 1, 1},
    {"false", "false", 0, 0},
    {"False_mixed", "False", 0, 0},
    {"FALSE_upper", "FALSE", 0, 0},
    {"true", "true", 1, 1},
    {"TRUE_upper", "TRUE", 1, 1},
    {"no", "no", 0, 0},
    {"NO_upper", "NO", 0, 0},
    {"yes", "yes", 1, 1},
    {"Yes_mixed", "Yes", 1, 1},
    {"unset", NULL, 0, 1},
    {"empty", "", 0, 1},
    {"2", "2", 0, 1},
    {"typo_offf", "offf", 0, 1},
    {"prefix_of", "of", 0, 1},
    {"blank_0", " 0", 0, 1},
    {"word_disabled", "disabled", 0, 1},
};

static void test_env_flag(void **state)
{
    const flag_row *r = *state;
    if (r->value != NULL)
        setenv("CLATTN_CACHE", r->value, 1);
    else
        unsetenv("CLATTN_CACHE");
    assert_int_equal(clattn__env_flag("CLATTN_CACHE", 0), r->if_default_0);
    assert_int_equal(clattn__env_flag("CLATTN_CACHE", 1), r->if_default_1);
    /* The cache defaults to on. */
    clattn_context *ctx = new_context();
    assert_int_equal(ctx->cache_enabled, r->if_default_1);
    clattn_release(ctx);
}

typedef enum unwritable {
    UNWRITABLE_PROC,      /* /proc/clattn-nonexistent: mkdir fails */
    UNWRITABLE_UNDER_FILE, /* <tmp>/file/sub with <tmp>/file a regular file */
    UNWRITABLE_READONLY,  /* <tmp>/ro with mode 0500 (meaningless as root: skipped) */
    UNWRITABLE_PROC_DIR,  /* /proc/self/fdinfo: exists, but no file can be created there, root or not */
    UNWRITABLE_TOO_LONG,  /* a path longer than any buffer the library keeps */
    UNWRITABLE_XDG_TOO_LONG, /* the same through XDG_CACHE_HOME, CLATTN_CACHE_DIR unset */
    UNWRITABLE_IS_FILE,   /* CLATTN_CACHE_DIR names a regular file: nothing can be read or written */
    UNWRITABLE_UNREADABLE /* <tmp>/locked with mode 0 holding a valid entry (meaningless as root: skipped) */
} unwritable;

typedef struct unwritable_row {
    const char *name;
    unwritable kind;
} unwritable_row;

static const unwritable_row unwritable_rows[] = {
    {"proc", UNWRITABLE_PROC},
    {"under_regular_file", UNWRITABLE_UNDER_FILE},
    {"read_only_dir", UNWRITABLE_READONLY},
    {"existing_dir_no_create", UNWRITABLE_PROC_DIR},
    {"path_too_long", UNWRITABLE_TOO_LONG},
    {"xdg_path_too_long", UNWRITABLE_XDG_TOO_LONG},
    {"dir_is_a_regular_file", UNWRITABLE_IS_FILE},
    {"unreadable_dir", UNWRITABLE_UNREADABLE},
};

static void test_unwritable(void **state)
{
    const unwritable_row *r = *state;
    static char dir[6000];
    char file[PATH_MAX + 256] = "";
    switch (r->kind) {
    case UNWRITABLE_PROC:
        snprintf(dir, sizeof dir, "/proc/clattn-nonexistent");
        break;
    case UNWRITABLE_UNDER_FILE:
        snprintf(file, sizeof file, "%s/file", g_dir);
        write_whole(file, "x", 1);
        snprintf(dir, sizeof dir, "%s/sub", file);
        break;
    case UNWRITABLE_READONLY:
        if (geteuid() == 0) {
            print_message("skipping: root writes into read-only directories\n");
            skip();
        }
        snprintf(dir, sizeof dir, "%s/ro", g_dir);
        assert_int_equal(mkdir(dir, 0500), 0);
        break;
    case UNWRITABLE_PROC_DIR:
        snprintf(dir, sizeof dir, "/proc/self/fdinfo");
        break;
    case UNWRITABLE_TOO_LONG:
    case UNWRITABLE_XDG_TOO_LONG: {
        int n = snprintf(dir, sizeof dir, "%s/", g_dir);
        while (n < 5000)
            dir[n++] = 'd';
        dir[n] = '\0';
        break;
    }
    case UNWRITABLE_IS_FILE:
        snprintf(dir, sizeof dir, "%s/file", g_dir);
        write_whole(dir, "x", 1);
        break;
    case UNWRITABLE_UNREADABLE: {
        if (geteuid() == 0) {
            print_message("skipping: root reads directories of mode 0\n");
            skip();
        }
        /* A valid entry inside, so a directory that could be read would give a disk hit. */
        const seed *a = get_seed_a();
        snprintf(dir, sizeof dir, "%s/locked", g_dir);
        assert_int_equal(mkdir(dir, 0700), 0);
        snprintf(file, sizeof file, "%s/locked/%s", g_dir, a->file);
        write_whole(file, a->content.data, a->content.size);
        assert_int_equal(chmod(dir, 0), 0);
        break;
    }
    }
    const int too_long = r->kind == UNWRITABLE_TOO_LONG || r->kind == UNWRITABLE_XDG_TOO_LONG;
    if (r->kind == UNWRITABLE_XDG_TOO_LONG) {
        unsetenv("CLATTN_CACHE_DIR");
        setenv("XDG_CACHE_HOME", dir, 1);
    } else {
        setenv("CLATTN_CACHE_DIR", dir, 1);
    }
    if (too_long)
        unsetenv("CLATTN_TUNING_DIR"); /* the tuning directory would be <cache dir>/tuning */
    clattn_context *ctx = new_context();
    if (too_long) {
        /* No cut-off path is kept, for the cache nor for the tuning directory derived from it. */
        assert_false(ctx->cache_enabled);
        if (ctx->cache_dir[0] != '\0' || ctx->tuning_dir[0] != '\0')
            fail_msg("kept a cut-off cache directory (%zu bytes) or tuning directory (%zu bytes)",
                     strlen(ctx->cache_dir), strlen(ctx->tuning_dir));
        if (!strstr(clattn_tuning_report(ctx), "no user tuning directory"))
            fail_msg("tuning report \"%s\" lacks \"no user tuning directory\"", clattn_tuning_report(ctx));
    }
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    print_stats(r->name, ctx);
    assert_int_equal(ctx->stats.builds, 1);
    assert_int_equal(ctx->stats.disk_writes, 0);
    assert_int_equal(ctx->stats.disk_hits, 0);
    check_softmax_runs(ctx);
    if ((r->kind == UNWRITABLE_UNDER_FILE || r->kind == UNWRITABLE_IS_FILE) &&
        (!strstr(clattn_cache_report(ctx), "not usable") || !strstr(clattn_cache_report(ctx), "Not a directory")))
        fail_msg("clattn_cache_report does not say why there is no disk cache: \"%s\"", clattn_cache_report(ctx));
    clattn_release(ctx);

    struct stat st;
    switch (r->kind) {
    case UNWRITABLE_UNDER_FILE:
        assert_int_equal(stat(file, &st), 0);
        assert_true(S_ISREG(st.st_mode)); /* not replaced by a directory */
        assert_int_equal(count_entries(g_dir), 1);
        break;
    case UNWRITABLE_READONLY:
        assert_int_equal(count_entries(dir), 0);
        break;
    case UNWRITABLE_TOO_LONG:
    case UNWRITABLE_XDG_TOO_LONG:
        assert_int_equal(count_entries(g_dir), 0);
        break;
    case UNWRITABLE_PROC:
        assert_int_not_equal(stat(dir, &st), 0);
        break;
    case UNWRITABLE_PROC_DIR:
        assert_int_equal(count_files(dir, ".clbin", NULL, 0), 0);
        assert_int_equal(count_files(dir, ".tmp", NULL, 0), 0);
        break;
    case UNWRITABLE_IS_FILE:
        assert_int_equal(stat(dir, &st), 0);
        assert_true(S_ISREG(st.st_mode) && st.st_size == 1); /* left alone */
        assert_int_equal(count_entries(g_dir), 1);
        break;
    case UNWRITABLE_UNREADABLE:
        assert_int_equal(chmod(dir, 0700), 0);
        assert_int_equal(count_entries(dir), 1); /* the planted entry, nothing added */
        assert_int_equal(count_files(dir, ".tmp", NULL, 0), 0);
        break;
    }
}

/* =============================== entries that are not files =============================== */

typedef enum not_file {
    NOT_FILE_FIFO,      /* a FIFO under the entry's name: reading it would block for ever */
    NOT_FILE_DIRECTORY, /* a directory under the entry's name: cannot be read nor replaced */
    NOT_FILE_DEV_ZERO   /* a symbolic link to /dev/zero */
} not_file;

typedef struct not_file_row {
    const char *name;
    not_file kind;
} not_file_row;

static const not_file_row not_file_rows[] = {
    {"fifo", NOT_FILE_FIFO},
    {"directory", NOT_FILE_DIRECTORY},
    {"symlink_to_dev_zero", NOT_FILE_DEV_ZERO},
};

static void test_not_a_file(void **state)
{
    const not_file_row *r = *state;
    const seed *a = get_seed_a();
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s", g_dir, a->file);
    switch (r->kind) {
    case NOT_FILE_FIFO:
        assert_int_equal(mkfifo(path, 0600), 0);
        break;
    case NOT_FILE_DIRECTORY:
        assert_int_equal(mkdir(path, 0700), 0);
        break;
    case NOT_FILE_DEV_ZERO:
        assert_int_equal(symlink("/dev/zero", path), 0);
        break;
    }
    clattn_context *ctx = new_context();
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    print_stats(r->name, ctx);
    assert_int_equal(ctx->stats.builds, 1);
    assert_int_equal(ctx->stats.disk_rejects, 1);
    assert_int_equal(ctx->stats.disk_hits, 0);
    check_softmax_runs(ctx);
    clattn_release(ctx);
    assert_int_equal(count_files(g_dir, ".tmp", NULL, 0), 0);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    if (r->kind == NOT_FILE_DIRECTORY) {
        /* A directory cannot be renamed over: still there, nothing cached, and the next context
         * rejects it again and still works. */
        assert_true(S_ISDIR(st.st_mode));
        clattn_context *again = new_context();
        get_kernel_ok(again, "softmax.cl", OPT_A, "softmax");
        assert_int_equal(again->stats.disk_rejects, 1);
        assert_int_equal(again->stats.disk_writes, 0);
        clattn_release(again);
    } else {
        /* The rebuilt binary replaced the odd entry with a regular file, which the next context uses. */
        assert_true(S_ISREG(st.st_mode));
        expect_disk_hit();
    }
}

/* =============================== concurrent writers =============================== */

enum { CHILDREN = 4 };

/* Child mode: create a context, report ready, wait for the start signal (EOF on start_fd), build. */
static int child_main(int ready_fd, int start_fd)
{
    clattn_context *ctx = NULL;
    if (clattn_create(NULL, &ctx) != CLATTN_SUCCESS) {
        fprintf(stderr, "child %ld: clattn_create: %s\n", (long)getpid(), clattn_last_error(NULL));
        return 2;
    }
    if (tu_child_ready_then_wait(ready_fd, start_fd))
        return 3;
    cl_kernel k = NULL;
    const clattn_status st = clattn__get_kernel(ctx, "softmax.cl", OPT_A, "softmax", &k);
    const clattn_cache_stats s = ctx->stats;
    fprintf(stderr, "child %ld: %s, builds %u disk_hits %u disk_rejects %u disk_writes %u\n",
            (long)getpid(), clattn_status_name(st), s.builds, s.disk_hits, s.disk_rejects,
            s.disk_writes);
    const int ok = st == CLATTN_SUCCESS && k != NULL;
    clattn_release(ctx);
    return ok ? 0 : 1;
}

static void test_concurrent_writers(void **state)
{
    (void)state;
    clattn_release(tu_context()); /* skip here, not in the children, without a device */
    int forked = 0, got = 0;
    const int failures = tu_run_children("test_cache", "--cache-child", CHILDREN, &forked, &got);
    assert_int_equal(forked, CHILDREN);
    assert_int_equal(got, CHILDREN);
    assert_int_equal(failures, 0);
    assert_int_equal(count_files(g_dir, ".clbin", NULL, 0), 1);
    assert_int_equal(count_files(g_dir, ".tmp", NULL, 0), 0);
    assert_int_equal(count_entries(g_dir), 1);
    expect_disk_hit();
}

/* =============================== build failures =============================== */

typedef struct bad_build_row {
    const char *name;
    const char *options;
} bad_build_row;

static const bad_build_row bad_build_rows[] = {
    {"wg_zero", "-cl-std=CL1.2 -DDT_A=0 -DDT_OUT=0 -DDT_MASK=0 -DWG=0"},
    {"wg_open_paren", "-cl-std=CL1.2 -DDT_A=0 -DDT_OUT=0 -DDT_MASK=0 -DWG=("},
};

static void test_build_failure(void **state)
{
    const bad_build_row *r = *state;
    char path[PATH_MAX + 256];
    plant(get_seed_a(), NULL, path, sizeof path); /* the good build afterwards is then a disk hit */
    clattn_context *ctx = new_context();

    cl_kernel k = (cl_kernel)&k;
    clattn_status st = clattn__get_kernel(ctx, "softmax.cl", r->options, "softmax", &k);
    print_stats(r->name, ctx);
    assert_int_equal(st, CLATTN_BUILD_FAILED);
    assert_null(k);
    assert_int_equal(ctx->stats.builds, 1);
    assert_int_equal(ctx->stats.disk_writes, 0);
    assert_int_equal(clattn_last_cl_error(ctx), CL_BUILD_PROGRAM_FAILURE);

    const char *log = clattn_last_build_log(ctx);
    assert_non_null(log);
    assert_true(log[0] != '\0');
    assert_non_null(strstr(log, "error"));
    char *log_copy = strdup(log);
    assert_non_null(log_copy);
    const char *err = clattn_last_error(ctx);
    print_message("last error: %.400s%s\n", err, strlen(err) > 400 ? "..." : "");
    assert_non_null(strstr(err, "softmax.cl"));
    assert_non_null(strstr(err, log_copy)); /* message, newline, build log */
    assert_non_null(strchr(err, '\n'));
    /* Asking again fails again: a failure is not cached as a program. */
    k = (cl_kernel)&k;
    st = clattn__get_kernel(ctx, "softmax.cl", r->options, "softmax", &k);
    assert_int_equal(st, CLATTN_BUILD_FAILED);
    assert_null(k);
    assert_int_equal(ctx->stats.builds, 2);
    assert_int_equal(ctx->stats.memory_hits, 0);
    free(log_copy);

    /* The context stays usable: a good kernel (from the planted file), then a public call that
     * succeeds and clears the error. */
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    assert_int_equal(ctx->stats.disk_hits, 1);
    assert_int_equal(ctx->stats.disk_writes, 0);
    check_softmax_runs(ctx);
    assert_string_equal(clattn_last_error(ctx), "");
    clattn_release(ctx);
    /* Nothing written for the failed builds. */
    assert_int_equal(count_entries(g_dir), 1);
}

/* =============================== cold vs warm =============================== */

static void test_cold_warm(void **state)
{
    (void)state;
    clattn_release(tu_context()); /* the platform's one-time start-up is not part of either time */
    double t0 = now_ms();
    clattn_context *ctx = new_context();
    get_kernel_ok(ctx, "fused_tiled.cl", OPT_FUSED, "fused");
    const double cold = now_ms() - t0;
    assert_int_equal(ctx->stats.builds, 1);
    assert_int_equal(ctx->stats.disk_writes, 1);
    clattn_release(ctx);

    t0 = now_ms();
    ctx = new_context();
    get_kernel_ok(ctx, "fused_tiled.cl", OPT_FUSED, "fused");
    const double warm = now_ms() - t0;
    assert_int_equal(ctx->stats.builds, 0);
    assert_int_equal(ctx->stats.disk_hits, 1);
    clattn_release(ctx);
    /* "cold" is clattn's cold start; a driver with a cache of its own (PoCL keeps one in
     * ~/.cache/pocl) makes it look warmer on reruns: run with POCL_KERNEL_CACHE=0 for a true one. */
    print_message("time to first ready fused kernel: cold %.1f ms, warm %.1f ms\n", cold, warm);
}

/* =============================== a quiet build =============================== */

/* A build writes nothing to the application's stderr (README: the library never prints). PoCL
 * prints a count of its compiler's warnings itself ("23 warnings generated.": on AVX2, float16
 * arguments change the ABI) unless the options carry -w. A -D of this process's id and the time
 * makes PoCL compile rather than take the binary from its own cache. */
static void test_quiet_build(void **state)
{
    (void)state;
    if (getenv("CLATTN_BUILD_LOG") != NULL && strcmp(getenv("CLATTN_BUILD_LOG"), "1") == 0)
        skip(); /* the log is asked for, warnings included */
    clattn_release(tu_context());
    clattn_context *ctx = new_context();
    char opt[256], path[PATH_MAX + 16];
    snprintf(opt, sizeof opt, "%s -DQUIET_PROBE=%ld%ld", OPT_FUSED, (long)getpid(), (long)time(NULL));
    snprintf(path, sizeof path, "%s/stderr.txt", g_dir);
    fflush(stderr);
    const int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    assert_true(dup2(fd, 2) == 2);
    close(fd);
    cl_kernel k = NULL;
    const clattn_status st = clattn__get_kernel(ctx, "fused_tiled.cl", opt, "fused", &k);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn__get_kernel: %s: %s", clattn_status_name(st), clattn_last_error(ctx));
    assert_int_equal(ctx->stats.builds, 1);
    clattn_release(ctx);
    char text[512] = "";
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    if (n > 0)
        fail_msg("a kernel build wrote %zu bytes to stderr, beginning: %s", n, text);
}

/* =============================== default directories =============================== */

/* Without CLATTN_CACHE_DIR the cache is $XDG_CACHE_HOME/clattn, else $HOME/.cache/clattn, and the
 * tuning directory <cache dir>/tuning (DESIGN, README): a kernel built lands there, and
 * clattn_tuning_path points there. */
static void test_default_dirs(void **state)
{
    (void)state;
    char xdg[4200], home[4200], cache[4300], want[4400], got[4200];
    snprintf(xdg, sizeof xdg, "%s/xdg", g_dir);
    snprintf(home, sizeof home, "%s/home", g_dir);
    const char *h = getenv("HOME");
    char *saved_home = h != NULL ? strdup(h) : NULL;
    unsetenv("CLATTN_CACHE_DIR");
    unsetenv("CLATTN_TUNING_DIR");
    setenv("HOME", home, 1);
    /* 2: a relative XDG_CACHE_HOME, which the XDG rules say to ignore (HOME then applies). */
    for (int use_xdg = 2; use_xdg >= 0; use_xdg--) {
        if (use_xdg == 2)
            setenv("XDG_CACHE_HOME", "relative-xdg", 1);
        else if (use_xdg)
            setenv("XDG_CACHE_HOME", xdg, 1);
        else
            unsetenv("XDG_CACHE_HOME");
        snprintf(cache, sizeof cache, use_xdg == 1 ? "%s/clattn" : "%s/.cache/clattn", use_xdg == 1 ? xdg : home);
        clattn_context *ctx = new_context();
        assert_int_equal(clattn_tuning_path(ctx, got, sizeof got), CLATTN_SUCCESS);
        snprintf(want, sizeof want, "%s/tuning/", cache);
        if (strncmp(got, want, strlen(want)) != 0)
            fail_msg("XDG_CACHE_HOME %s: tuning path %s is not under %s", use_xdg == 2 ? "relative" : "absolute",
                     got, want);
        if (use_xdg == 2) {
            assert_string_equal(ctx->cache_dir, cache);
            clattn_release(ctx);
            continue; /* the build below is the HOME case's */
        }
        get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
        clattn_release(ctx);
        assert_int_equal(count_files(cache, ".clbin", NULL, 0), 1);
    }
    if (saved_home != NULL)
        setenv("HOME", saved_home, 1);
    else
        unsetenv("HOME");
    free(saved_home);
}

/* =============================== a re-stamped binary =============================== */

/* A file whose header, key and payload hash check out but whose payload is another program's
 * binary (softmax.cl's, stored under merge.cl's key: only someone writing to the directory makes
 * one). The driver loads it and the kernel is missing: the library builds from source once,
 * replaces the file, and the next context loads the right binary. */
#define OPT_MERGE "-cl-std=CL1.2 -DDT_OUT=0 -DWG=16"
static void test_restamped_other_program(void **state)
{
    (void)state;
    char softmax_key[33], merge_key[33], path[PATH_MAX + 256];
    const seed *a = get_seed_a();
    snprintf(softmax_key, sizeof softmax_key, "%.32s", a->file);
    clattn_context *ctx = new_context();
    get_kernel_ok(ctx, "merge.cl", OPT_MERGE, "merge_strided");
    assert_int_equal(count_files(g_dir, ".clbin", path, sizeof path), 1);
    snprintf(merge_key, sizeof merge_key, "%.32s", strrchr(path, '/') + 1);
    plant(a, NULL, path, sizeof path);
    size_t size = 0;
    unsigned char *bin = clattn__cache_load(ctx, softmax_key, &size);
    assert_non_null(bin);
    clattn__cache_store(ctx, merge_key, bin, size);
    free(bin);
    clattn_release(ctx);
    for (int round = 0; round < 2; round++) {
        ctx = new_context();
        get_kernel_ok(ctx, "merge.cl", OPT_MERGE, "merge_strided");
        print_stats(round ? "next context" : "re-stamped file", ctx);
        /* the re-stamped file is a reject, not a hit as well (it loaded, then lacked the kernel) */
        assert_int_equal(ctx->stats.disk_hits, round ? 1 : 0);
        assert_int_equal(ctx->stats.builds, round ? 0 : 1);
        assert_int_equal(ctx->stats.disk_rejects, round ? 0 : 1);
        clattn_release(ctx);
    }
}

/* =============================== temporary files left behind =============================== */

/* A writer that died between creating its temporary file and renaming it leaves the file: the
 * next store removes such files of ours once they are an hour old, and leaves a fresh one (a live
 * writer's) and files that are not ours alone. */
static void test_stale_temps_swept(void **state)
{
    (void)state;
    enum { N = 9 };
    static const char *const names[N] = {
        "0123456789abcdef0123456789abcdef.clbin.4242.7f00.1234.0.tmp", /* ours, 2 hours old */
        "0123456789abcdef.tuning.4242.7f00.1234.0.tmp",                 /* ours, 2 hours old */
        "fedcba9876543210fedcba9876543210.clbin.4243.7f00.99.1.tmp",    /* ours, fresh */
        "notes.tmp",                                                    /* not ours, 2 hours old */
        /* the user's, with our words in them, 2 hours old: not ours */
        "my-notes.tuning.draft.tmp",
        "old.clbin.keep.tmp",
        "0123456789abcdef.tuning.tmp",
        "0123456789abcdef0123456789abcdef.clbin.4242.7f00.1234.0.tmp.bak",
        "0123456789abcdef.tuning.42x.7f00.1234.0.tmp",
    };
    char path[PATH_MAX + 128];
    for (int i = 0; i < N; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
        write_whole(path, (const unsigned char *)"partial", 7);
        if (i != 2) {
            const struct timespec times[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
            assert_int_equal(utimensat(AT_FDCWD, path, times, 0), 0);
        }
    }
    clattn_context *ctx = new_context();
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax"); /* builds and stores an entry */
    assert_int_equal(ctx->stats.disk_writes, 1);
    clattn_release(ctx);
    for (int i = 0; i < N; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
        const int gone = access(path, F_OK) != 0;
        if (gone != (i < 2))
            fail_msg("%s was %s", names[i], gone ? "removed" : "left");
    }
}

/* =============================== development variables =============================== */

/* CLATTN_BUILD_OPTIONS too long for the options the library passes: a clear BUILD_FAILED naming
 * the variable, never a build with the options cut short (-DX=128 read as -DX=1). */
static void test_build_options_too_long(void **state)
{
    (void)state;
    static char opts[4000];
    memset(opts, ' ', sizeof opts - 16);
    snprintf(opts + sizeof opts - 16, 16, "-DUNUSED_X=128");
    setenv("CLATTN_BUILD_OPTIONS", opts, 1);
    clattn_context *ctx = new_context();
    cl_kernel k = NULL;
    const clattn_status st = clattn__get_kernel(ctx, "softmax.cl", OPT_A, "softmax", &k);
    unsetenv("CLATTN_BUILD_OPTIONS");
    if (st != CLATTN_BUILD_FAILED || !strstr(clattn_last_error(ctx), "CLATTN_BUILD_OPTIONS"))
        fail_msg("a %zu-byte CLATTN_BUILD_OPTIONS gave %s: %s", strlen(opts), clattn_status_name(st),
                 clattn_last_error(ctx));
    assert_int_equal(ctx->stats.builds, 0);
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax"); /* without it: builds */
    clattn_release(ctx);
}

/* CLATTN_KERNEL_DIR holding a FIFO under a kernel's name, or too long a path: the embedded source
 * is used, and the FIFO's open does not wait for a writer. */
static void test_kernel_dir_not_a_file(void **state)
{
    (void)state;
    char kdir[PATH_MAX + 16], fifo[PATH_MAX + 32];
    snprintf(kdir, sizeof kdir, "%s/kernels", g_dir);
    assert_int_equal(mkdir(kdir, 0700), 0);
    snprintf(fifo, sizeof fifo, "%s/softmax.cl", kdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    static char longdir[5000];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[0] = '/';
    const char *dirs[2] = {kdir, longdir};
    for (int i = 0; i < 2; i++) {
        setenv("CLATTN_KERNEL_DIR", dirs[i], 1);
        size_t len = 0;
        char *src = clattn__load_source("softmax.cl", &len);
        unsetenv("CLATTN_KERNEL_DIR");
        assert_non_null(src);
        if (!strstr(src, "softmax"))
            fail_msg("%s: the source read is not softmax.cl's", i ? "long path" : "FIFO");
        free(src);
    }
    clattn_context *ctx = new_context();
    setenv("CLATTN_KERNEL_DIR", kdir, 1);
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    unsetenv("CLATTN_KERNEL_DIR");
    clattn_release(ctx);
    assert_int_equal(unlink(fifo), 0);
    assert_int_equal(rmdir(kdir), 0);
}

/* =============================== trust: only entries the user owns =============================== */

/* Another user for the rows that need one: nobody. CI runs as root, which can give files away. */
enum { OTHER_UID = TU_OTHER_UID };

/* A row that needs a file or directory of another owner cannot be staged without root: skipped
 * with the reason, which is no missing device (CLATTN_REQUIRE_DEVICE=1 does not fail it). */
static void need_root(const char *row)
{
    if (geteuid() != 0) {
        print_message("skipping %s: needs root to make a file or directory another user owns "
                      "(running as uid %ld)\n",
                      row, (long)geteuid());
        skip();
    }
}

typedef tu_trust_kind trust_kind; /* testutil.h */

typedef struct trust_row {
    const char *name;
    trust_kind kind;
    int needs_root;  /* stages a file or directory of another owner */
    const char *why; /* expected in the context's reason (ctx->cache_untrusted); NULL: accepted */
    int rewritten;   /* the directory is trusted: the rebuilt binary replaces the entry */
} trust_row;

static const trust_row trust_rows[] = {
    {"file_other_owner", TU_TRUST_FILE_OTHER_OWNER, 1, "owned by uid 65534, not by this user", 1},
    {"file_group_writable", TU_TRUST_FILE_GROUP_WRITABLE, 0, "writable by group or others (mode 0664)", 1},
    {"file_other_writable", TU_TRUST_FILE_OTHER_WRITABLE, 0, "writable by group or others (mode 0646)", 1},
    {"dir_world_writable_no_sticky", TU_TRUST_DIR_WORLD_WRITABLE, 0,
     "the directory is writable by group or others (mode 0777", 0},
    {"dir_group_writable", TU_TRUST_DIR_GROUP_WRITABLE, 0, "the directory is writable by group or others (mode 0770", 0},
    {"dir_other_owner", TU_TRUST_DIR_OTHER_OWNER, 1, "the directory is owned by uid 65534", 0},
    {"dir_root_sticky_good_file_accepted", TU_TRUST_DIR_ROOT_STICKY, 1, NULL, 0},
    {"dir_root_sticky_other_owner_file", TU_TRUST_DIR_ROOT_STICKY_OTHER_FILE, 1, "owned by uid 65534, not by this user",
     1},
    {"symlink_to_other_users_file", TU_TRUST_SYMLINK_OTHER_FILE, 0, "a symbolic link, not a regular file", 1},
    {"dir_replaced_after_open", TU_TRUST_DIR_REPLACED, 0, "the directory is writable by group or others (mode 0777", 0},
};

static void replace_dir_hook(const char *dir)
{
    if (replaced != 0 || strcmp(dir, g_dir) != 0)
        return;
    replaced = rename(g_dir, replaced_old) == 0 && rename(replaced_new, g_dir) == 0 ? 1 : -1;
}

static void test_trust(void **state)
{
    const trust_row *r = *state;
    if (r->needs_root)
        need_root(r->name);
    const seed *a = get_seed_a();
    char path[PATH_MAX + 256], other[PATH_MAX], target[PATH_MAX + 256];
    other[0] = '\0';
    snprintf(path, sizeof path, "%s/%s", g_dir, a->file);
    if (r->kind != TU_TRUST_SYMLINK_OTHER_FILE && r->kind != TU_TRUST_DIR_REPLACED)
        plant(a, NULL, path, sizeof path);
    switch (r->kind) {
    default:
        assert_true(tu_trust_stage(r->kind, g_dir, path));
        break;
    case TU_TRUST_SYMLINK_OTHER_FILE:
        /* A valid entry elsewhere, which the link would make a disk hit if it were followed. */
        make_tmpdir(other, sizeof other);
        snprintf(target, sizeof target, "%s/%s", other, a->file);
        write_whole(target, a->content.data, a->content.size);
        tu_trust_link(target, path);
        break;
    case TU_TRUST_DIR_REPLACED:
        remove_replaced_dirs();
        snprintf(replaced_old, sizeof replaced_old, "%s-old", g_dir);
        snprintf(replaced_new, sizeof replaced_new, "%s-new", g_dir);
        assert_int_equal(mkdir(replaced_new, 0700), 0);
        assert_int_equal(chmod(replaced_new, 0777), 0);
        snprintf(target, sizeof target, "%s/%s", replaced_new, a->file);
        write_whole(target, a->content.data, a->content.size);
        break;
    }

    clattn_context *ctx = new_context();
    if (r->kind == TU_TRUST_DIR_REPLACED) {
        replaced = 0;
        clattn__entry_dir_hook = replace_dir_hook;
    }
    get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
    clattn__entry_dir_hook = NULL;
    print_stats(r->name, ctx);
    print_message("reason: \"%s\"\n", ctx->cache_untrusted);
    clattn_program_stats ps;
    assert_int_equal(clattn_get_program_stats(ctx, &ps), CLATTN_SUCCESS);
    assert_int_equal(ps.disk_untrusted, ctx->stats.disk_untrusted);
    if (r->why == NULL) {
        assert_int_equal(ctx->stats.disk_hits, 1);
        assert_int_equal(ctx->stats.builds, 0);
        assert_int_equal(ctx->stats.disk_rejects, 0);
        assert_int_equal(ctx->stats.disk_untrusted, 0);
        assert_string_equal(ctx->cache_untrusted, "");
    } else {
        /* The planted entry of a replacing directory is never looked at: the library reads
         * through the directory it opened, which has none; it then writes nothing into the
         * replacement, which it does not trust (and says why). */
        const unsigned seen = r->kind == TU_TRUST_DIR_REPLACED ? 0 : 1;
        if (r->kind == TU_TRUST_DIR_REPLACED)
            assert_int_equal(replaced, 1);
        assert_int_equal(ctx->stats.builds, 1);
        assert_int_equal(ctx->stats.disk_hits, 0);
        assert_int_equal(ctx->stats.disk_untrusted, seen);
        assert_int_equal(ctx->stats.disk_rejects, seen); /* untrusted entries are rejected ones too */
        assert_int_equal(ctx->stats.disk_writes, r->rewritten ? 1 : 0);
        if (!strstr(ctx->cache_untrusted, r->why))
            fail_msg("reason \"%s\" lacks \"%s\"", ctx->cache_untrusted, r->why);
        /* The public report names it too (clattn-info prints it). */
        const char *rep = clattn_cache_report(ctx);
        if (!strstr(rep, r->why) || !strstr(rep, "not trusted"))
            fail_msg("clattn_cache_report \"%s\" lacks \"%s\"", rep, r->why);
    }
    if (r->why == NULL && strstr(clattn_cache_report(ctx), "not trusted"))
        fail_msg("clattn_cache_report of a trusted cache: \"%s\"", clattn_cache_report(ctx));
    check_softmax_runs(ctx);
    clattn_release(ctx);
    assert_int_equal(count_files(g_dir, ".tmp", NULL, 0), 0);

    struct stat st;
    switch (r->kind) {
    case TU_TRUST_SYMLINK_OTHER_FILE: {
        /* The rebuilt binary replaced the link, not the file it named. */
        assert_int_equal(lstat(path, &st), 0);
        assert_true(S_ISREG(st.st_mode));
        blob t = read_whole(target);
        assert_int_equal(t.size, a->content.size);
        assert_memory_equal(t.data, a->content.data, t.size);
        free(t.data);
        assert_int_equal(stat(target, &st), 0);
        if (geteuid() == 0)
            assert_int_equal(st.st_uid, OTHER_UID);
        tu_remove_tree(other);
        expect_disk_hit();
        break;
    }
    case TU_TRUST_DIR_REPLACED:
        /* Nothing was written into either directory; a context that opens the replacement from
         * the start finds its entry and does not trust it either. */
        assert_int_equal(count_files(replaced_old, ".clbin", NULL, 0), 0);
        assert_int_equal(count_files(g_dir, ".clbin", NULL, 0), 1);
        ctx = new_context();
        get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
        print_stats("next context, on the replacement", ctx);
        assert_int_equal(ctx->stats.disk_untrusted, 1);
        assert_int_equal(ctx->stats.disk_hits, 0);
        if (!strstr(ctx->cache_untrusted, r->why))
            fail_msg("reason \"%s\" lacks \"%s\"", ctx->cache_untrusted, r->why);
        clattn_release(ctx);
        remove_replaced_dirs();
        break;
    default:
        if (r->rewritten) {
            /* Replaced by this user's file, mode 0600, which the next context uses. */
            assert_int_equal(lstat(path, &st), 0);
            assert_int_equal(st.st_uid, geteuid());
            assert_int_equal(st.st_mode & 07777, 0600);
            expect_disk_hit();
        } else if (r->why != NULL) {
            /* Left as it was: the directory is not written into, and the next context ignores
             * the entry again. */
            assert_int_equal(count_entries(g_dir), 1);
            ctx = new_context();
            get_kernel_ok(ctx, "softmax.cl", OPT_A, "softmax");
            assert_int_equal(ctx->stats.disk_untrusted, 1);
            assert_int_equal(ctx->stats.disk_writes, 0);
            clattn_release(ctx);
        }
        break;
    }
}

/* The rule for another effective user than root, which CI (root) cannot be itself: a child
 * process becomes uid 65534 and asks clattn__open_entry about a directory and a file of the owners
 * and modes of the row. The first rows are the documented way to share a cache read-only: a
 * root-owned directory that only root can write, filled by an administrator with root-owned files
 * (docs/guarantees.md). */
typedef struct rule_row {
    const char *name;
    unsigned dir_mode;
    unsigned dir_uid;
    unsigned file_mode;
    unsigned file_uid;
    clattn_entry_status want;
    const char *why; /* in the reason; NULL: none */
} rule_row;

static const rule_row rule_rows[] = {
    {"shared_root_dir_root_file", 0755, 0, 0644, 0, CLATTN_ENTRY_OK, NULL},
    {"root_dir_own_file", 0755, 0, 0644, OTHER_UID, CLATTN_ENTRY_OK, NULL},
    {"root_sticky_dir_own_file", 01777, 0, 0600, OTHER_UID, CLATTN_ENTRY_OK, NULL},
    {"root_sticky_dir_root_file", 01777, 0, 0644, 0, CLATTN_ENTRY_UNTRUSTED,
     "owned by uid 0, not by this user (uid 65534); root's files are trusted only in a root-owned directory"},
    {"root_group_writable_dir_root_file", 0775, 0, 0644, 0, CLATTN_ENTRY_UNTRUSTED,
     "the directory is writable by group or others (mode 0775, root-owned without the sticky bit)"},
    {"own_dir_root_file", 0755, OTHER_UID, 0644, 0, CLATTN_ENTRY_UNTRUSTED, "owned by uid 0, not by this user"},
    {"own_sticky_world_writable_dir", 01777, OTHER_UID, 0600, OTHER_UID, CLATTN_ENTRY_UNTRUSTED,
     "the directory is writable by group or others (mode 1777)"},
    {"third_user_dir", 0755, 1, 0644, OTHER_UID, CLATTN_ENTRY_UNTRUSTED,
     "the directory is owned by uid 1, neither this user (uid 65534) nor root"},
    {"own_dir_third_user_file", 0755, OTHER_UID, 0644, 1, CLATTN_ENTRY_UNTRUSTED,
     "owned by uid 1, not by this user (uid 65534)"},
};

static void test_rule_as_other_user(void **state)
{
    const rule_row *r = *state;
    need_root(r->name);
    char dir[PATH_MAX + 16], file[PATH_MAX + 32];
    assert_int_equal(chmod(g_dir, 0755), 0); /* the child must reach dir */
    snprintf(dir, sizeof dir, "%s/d", g_dir);
    snprintf(file, sizeof file, "%s/x.clbin", dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    write_whole(file, "entry", 5);
    assert_int_equal(chown(file, r->file_uid, r->file_uid), 0);
    assert_int_equal(chmod(file, r->file_mode), 0);
    assert_int_equal(chown(dir, r->dir_uid, r->dir_uid), 0);
    assert_int_equal(chmod(dir, r->dir_mode), 0);
    fflush(stderr);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setgid(OTHER_UID) != 0 || setuid(OTHER_UID) != 0 || geteuid() != OTHER_UID)
            _exit(3);
        int fd = -1;
        struct stat st;
        char why[300];
        const clattn_entry_status got = clattn__open_entry(dir, "x.clbin", &fd, &st, why, sizeof why);
        fprintf(stderr, "as uid %ld: status %d (want %d), reason \"%s\"\n", (long)geteuid(), (int)got, (int)r->want,
                why);
        const int ok = got == r->want && (r->why ? strstr(why, r->why) != NULL : why[0] == '\0') &&
                       (got == CLATTN_ENTRY_OK) == (fd >= 0);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 3)
        fail_msg("the child could not become uid %d", OTHER_UID);
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Files the library writes are 0600 and the directories it makes 0700, whatever the umask: an
 * entry stored under a cache directory that does not exist yet (two levels made), and a
 * temporary file. Only the library's file calls run under the umask, no build (the OpenCL
 * driver's own files are none of this test's business). The entry then loads as trusted. */
typedef struct mode_row {
    const char *name;
    unsigned umask;
} mode_row;

static const mode_row mode_rows[] = {
    {"umask_000", 0},
    {"umask_022", 022},
    {"umask_077", 077},
    {"umask_277", 0277}, /* takes the owner's write bit too: the library puts it back */
};

static void assert_mode(const char *path, int dir, unsigned want)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        fail_msg("lstat %s: %s", path, strerror(errno));
    if ((dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) || (st.st_mode & 07777) != want ||
        st.st_uid != geteuid())
        fail_msg("%s: mode %o, uid %ld; want a %s of mode %o owned by uid %ld", path, (unsigned)st.st_mode,
                 (long)st.st_uid, dir ? "directory" : "regular file", want, (long)geteuid());
}

static void test_written_modes(void **state)
{
    const mode_row *r = *state;
    const seed *a = get_seed_a();
    char made[PATH_MAX + 16], cache[PATH_MAX + 32], path[PATH_MAX + 256], hex[33];
    snprintf(made, sizeof made, "%s/made", g_dir);
    snprintf(cache, sizeof cache, "%s/made/cache", g_dir);
    snprintf(hex, sizeof hex, "%.32s", a->file);
    setenv("CLATTN_CACHE_DIR", cache, 1);
    clattn_context *ctx = new_context();
    const mode_t saved = umask((mode_t)r->umask);
    clattn__cache_store(ctx, hex, a->content.data + HEADER_BYTES, a->content.size - HEADER_BYTES);
    const int dfd = clattn__open_dir_for_write(cache, NULL, 0);
    FILE *tmp = dfd >= 0 ? clattn__create_temp(dfd, "probe.clbin.1.tmp") : NULL;
    umask(saved);
    assert_int_equal(ctx->stats.disk_writes, 1);
    clattn_release(ctx);
    assert_true(dfd >= 0);
    assert_non_null(tmp);
    struct stat st;
    assert_int_equal(fstat(fileno(tmp), &st), 0);
    fclose(tmp);
    assert_int_equal(unlinkat(dfd, "probe.clbin.1.tmp", 0), 0);
    close(dfd);
    if ((st.st_mode & 07777) != 0600)
        fail_msg("temporary file of mode %o under umask %03o", (unsigned)(st.st_mode & 07777), r->umask);
    assert_mode(made, 1, 0700);
    assert_mode(cache, 1, 0700);
    snprintf(path, sizeof path, "%s/%s", cache, a->file);
    assert_mode(path, 0, 0600);
    assert_int_equal(count_entries(cache), 1);
    expect_disk_hit(); /* CLATTN_CACHE_DIR is still `cache` */
}

/* A temporary file is never created through a symbolic link planted under its name, whether the
 * link names nothing yet or an existing file. */
static void test_temp_not_through_symlink(void **state)
{
    (void)state;
    char outside[PATH_MAX], missing[PATH_MAX + 32], existing[PATH_MAX + 32], link[2][PATH_MAX + 64];
    make_tmpdir(outside, sizeof outside);
    snprintf(missing, sizeof missing, "%s/made-through-a-link", outside);
    snprintf(existing, sizeof existing, "%s/existing", outside);
    write_whole(existing, "keep", 4);
    static const char *const names[2] = {"a.clbin.1.2.3.0.tmp", "b.tuning.1.2.3.0.tmp"};
    snprintf(link[0], sizeof link[0], "%s/%s", g_dir, names[0]);
    snprintf(link[1], sizeof link[1], "%s/%s", g_dir, names[1]);
    assert_int_equal(symlink(missing, link[0]), 0);
    assert_int_equal(symlink(existing, link[1]), 0);
    const int dfd = clattn__open_dir_for_write(g_dir, NULL, 0);
    assert_true(dfd >= 0);
    FILE *f0 = clattn__create_temp(dfd, names[0]);
    FILE *f1 = clattn__create_temp(dfd, names[1]);
    close(dfd);
    const int made = access(missing, F_OK) == 0;
    blob kept = read_whole(existing);
    const int changed = kept.size != 4 || memcmp(kept.data, "keep", 4) != 0;
    free(kept.data);
    if (f0)
        fclose(f0);
    if (f1)
        fclose(f1);
    tu_remove_tree(outside);
    assert_null(f0);
    assert_null(f1);
    assert_false(made);
    assert_false(changed);
    struct stat st;
    assert_int_equal(lstat(link[0], &st), 0);
    assert_true(S_ISLNK(st.st_mode));
}

/* =============================== registration =============================== */

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--cache-child") == 0)
        return child_main(atoi(argv[2]), atoi(argv[3]));

    const char *e = getenv("CLATTN_CACHE_DIR");
    saved_cache_dir = e != NULL ? strdup(e) : NULL;
    e = getenv("CLATTN_CACHE");
    saved_cache = e != NULL ? strdup(e) : NULL;
    e = getenv("XDG_CACHE_HOME");
    saved_xdg = e != NULL ? strdup(e) : NULL;
    e = getenv("CLATTN_TUNING_DIR");
    saved_tuning_dir = e != NULL ? strdup(e) : NULL;
    /* Files the tests plant (fopen: 0666 less the umask) are then 0644, which the cache trusts
     * whatever umask the run started with (the trust rows set their modes themselves). */
    umask(022);
    /* clattn_softmax then asks for exactly OPT_A on any device (16 is clamped where too large). */
    setenv("CLATTN_PARAMS_SOFTMAX", "16", 1);

    tu_set_fixtures(setup_dir, teardown_dir);
    tu_add_test("hit/miss_then_disk_then_memory", NULL, test_miss_then_hit, NULL);
    TU_ADD_TABLE("damaged", test_damaged, damage_rows);
    tu_add_test("damaged/huge_payload_size_no_allocation", NULL, test_huge_payload_no_allocation, NULL);
    tu_add_test("damaged/restamped_other_program", NULL, test_restamped_other_program, NULL);
    tu_add_test("damaged/stale_temporary_files_swept", NULL, test_stale_temps_swept, NULL);
    tu_add_test("off/no_file_written_none_read", NULL, test_cache_off, NULL);
    TU_ADD_TABLE("off/env_flag", test_env_flag, flag_rows);
    TU_ADD_TABLE("unwritable", test_unwritable, unwritable_rows);
    TU_ADD_TABLE("not_a_file", test_not_a_file, not_file_rows);
    tu_add_test("concurrent/four_processes_one_entry", NULL, test_concurrent_writers, NULL);
    TU_ADD_TABLE("build_failure", test_build_failure, bad_build_rows);
    tu_add_test("timing/cold_vs_warm", NULL, test_cold_warm, NULL);
    tu_add_test("quiet/build_writes_nothing_to_stderr", NULL, test_quiet_build, NULL);
    tu_add_test("dirs/xdg_then_home", NULL, test_default_dirs, NULL);
    tu_add_test("env/build_options_too_long", NULL, test_build_options_too_long, NULL);
    tu_add_test("env/kernel_dir_fifo_and_long_path", NULL, test_kernel_dir_not_a_file, NULL);
    TU_ADD_TABLE("trust", test_trust, trust_rows);
    TU_ADD_TABLE("trust/rule_as_uid_65534", test_rule_as_other_user, rule_rows);
    TU_ADD_TABLE("trust/written_modes", test_written_modes, mode_rows);
    tu_add_test("trust/temp_not_through_symlink", NULL, test_temp_not_through_symlink, NULL);

    const int failed = tu_run_tests("cache");
    if (g_dir[0] != '\0')
        tu_remove_tree(g_dir); /* the last test's, when it failed or skipped */
    free(seed_a.content.data);
    free(seed_b.content.data);
    free(saved_cache_dir);
    free(saved_cache);
    free(saved_xdg);
    remove_replaced_dirs();
    free(saved_tuning_dir);
    return failed;
}
