/* The tuning store: text format round trip, rejected files (malformed, truncated, foreign,
 * unsupported version, out-of-range numbers, each with its line number), comments, parsing on
 * several threads at once, lookup order and fallbacks, user files that are no regular file (a FIFO
 * must not block) or sit at the 1 MiB limit, the public override and read-back, a wrong candidate
 * is never chosen by clattn-tune, which refuses bad numbers and an unwritable tuning directory up
 * front and escapes its --json strings, and concurrent writers leave a valid file. A user file or
 * tuning directory the user does not own, or that group or others can write, a symbolic link and a
 * directory swapped after it was opened are not trusted, and the store is written 0600 (directories
 * 0700) whatever the umask, never into a directory it would not be read back from. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"
#include "clattn_ref.h"
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[96];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/clattn-tuning-test-%ld", (long)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    assert_int_equal(system(cmd), 0);
    setenv("CLATTN_TUNING_DIR", dir, 1);
}

static void write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

/* ---- format ---- */

static void test_round_trip(void **state)
{
    (void)state;
    clattn_tuning_table t;
    memset(&t, 0, sizeof t);
    snprintf(t.device, sizeof t.device, "10de:NVIDIA_H100:132:228");
    snprintf(t.driver, sizeof t.driver, "550.54.15");
    clattn_tuning_entry a = {CLATTN_OP_FUSED, 0, 64, 1, 3, 12, 6, {8, 8, 4, 1, 4, 0}};
    clattn_tuning_entry b = {CLATTN_OP_SOFTMAX, -1, -1, -1, -1, -1, 2, {256, 0}};
    clattn_tuning_entry c = {CLATTN_OP_SCORES, 2, 128, 2, 0, 20, 9, {1, 1, 6, 4, 16, 16, 1, 1, 1}};
    assert_int_equal(clattn__tuning_put(&t, &a), 0);
    assert_int_equal(clattn__tuning_put(&t, &b), 0);
    assert_int_equal(clattn__tuning_put(&t, &c), 0);
    char *text = clattn__tuning_format(&t);
    assert_non_null(text);
    clattn_tuning_table u;
    char err[200] = "";
    assert_int_equal(clattn__tuning_parse(text, strlen(text), &u, err, sizeof err), 0);
    assert_string_equal(u.device, t.device);
    assert_string_equal(u.driver, t.driver);
    assert_int_equal(u.n, 3);
    for (int i = 0; i < 3; i++)
        assert_memory_equal(&u.e[i], &t.e[i], sizeof u.e[i]);
    /* Replacing an entry of the same bucket keeps one. */
    a.v[0] = 16;
    assert_int_equal(clattn__tuning_put(&u, &a), 0);
    assert_int_equal(u.n, 3);
    assert_int_equal(u.e[0].v[0], 16);
    free(text);
    clattn__tuning_free(&t);
    clattn__tuning_free(&u);
}

/* A file with thousands of entries, many of them for the same bucket, reads as the table that
 * clattn__tuning_put (a linear scan: the independent check) makes of the same entries in the same
 * order: one entry a bucket, where the bucket first appeared, holding its last values. The
 * parser indexes buckets by hash; this row covers its collisions, growth and replacements. */
static void test_many_entries(void **state)
{
    (void)state;
    static const int dims[5] = {-1, 1, 64, 128, 256};
    static const int logs[4] = {-1, 0, 10, 30};
    clattn_tuning_table want;
    memset(&want, 0, sizeof want);
    const size_t cap = 64 + 6000 * 160;
    char *text = malloc(cap);
    assert_non_null(text);
    size_t len = (size_t)snprintf(text, cap, "clattn-tuning 1\ndevice x\n");
    uint32_t seed = 12345;
    for (int k = 0; k < 6000; k++) {
        uint32_t r[8];
        for (int i = 0; i < 8; i++)
            r[i] = (seed = seed * 1664525u + 1013904223u) >> 8;
        clattn_tuning_entry e;
        memset(&e, 0, sizeof e);
        e.op = (clattn_op)(r[0] % CLATTN_OP_COUNT);
        e.dtype = (int)(r[1] % 4) - 1;
        e.head_dim = dims[r[2] % 5];
        e.mask_kind = (int)(r[3] % 4) - 1;
        e.sq_class = (int)(r[4] % 5) - 1;
        e.log2_skv = logs[r[5] % 4];
        e.n = clattn__param_count(e.op);
        for (int i = 0; i < e.n; i++)
            e.v[i] = (int)((r[6] >> i) % ((uint32_t)clattn__param_max(e.op, i) + 1));
        assert_int_equal(clattn__tuning_put(&want, &e), 0);
        char line[160];
        clattn__tuning_entry_text(&e, line, sizeof line);
        len += (size_t)snprintf(text + len, cap - len, "%s\n", line);
        assert_true(len < cap);
    }
    /* 6 ops x 4 x 5 x 4 x 5 x 4 buckets: the 6000 lines repeat some and miss others. */
    assert_true(want.n > 2000 && want.n < 5000);
    clattn_tuning_table got;
    char err[200] = "";
    if (clattn__tuning_parse(text, len, &got, err, sizeof err) != 0)
        fail_msg("parse: %s", err);
    assert_int_equal(got.n, want.n);
    for (int i = 0; i < got.n; i++)
        assert_memory_equal(&got.e[i], &want.e[i], sizeof got.e[i]);
    free(text);
    clattn__tuning_free(&want);
    clattn__tuning_free(&got);
}

typedef struct bad_row {
    const char *name;
    const char *text;
    int line;        /* the line the parser's message names */
    const char *why; /* substring of the parser's message */
} bad_row;

static const bad_row bad_rows[] = {
    {"empty", "", 1, "empty"},
    {"foreign_header", "hello world\n", 1, "not a clattn tuning file"},
    {"version_3", "clattn-tuning 3\ndevice x\n", 1, "unsupported format version"},
    {"truncated", "clattn-tuning 1\ndevice x\nfused f32 64 none >128 10 = 1,4,16", 3, "truncated"},
    {"no_device", "clattn-tuning 1\nfused f32 64 none >128 10 = 1,1,4,2,16,1\n", 2, "before the device"},
    {"two_devices", "clattn-tuning 1\ndevice x\ndevice y\n", 3, "second device"},
    {"two_drivers", "clattn-tuning 1\ndevice x\ndriver 1\ndriver 2\n", 4, "second driver"},
    {"empty_driver", "clattn-tuning 1\ndevice x\ndriver \n", 3, "driver line without a tag"},
    {"empty_device", "clattn-tuning 1\ndevice\t\n", 2, "device/match line without a value"},
    {"unknown_op", "clattn-tuning 1\ndevice x\nflash f32 64 none >128 10 = 1\n", 3, "unknown operation"},
    {"bad_dtype", "clattn-tuning 1\ndevice x\nfused f64 64 none >128 10 = 1,1,4,2,16,1\n", 3, "bad dtype"},
    {"bad_head_dim", "clattn-tuning 1\ndevice x\nfused f32 999 none >128 10 = 1,1,4,2,16,1\n", 3, "bad dtype"},
    {"bad_mask", "clattn-tuning 1\ndevice x\nfused f32 64 some >128 10 = 1,1,4,2,16,1\n", 3, "bad dtype"},
    {"few_values", "clattn-tuning 1\ndevice x\nfused f32 64 none >128 10 = 1,4,16\n", 3, "wrong number"},
    {"many_values", "clattn-tuning 1\ndevice x\nmerge * * * * * = 1,2\n", 3, "wrong number"},
    {"negative", "clattn-tuning 1\ndevice x\nmerge * * * * * = -4\n", 3, "integers"},
    {"huge", "clattn-tuning 1\ndevice x\nmerge * * * * * = 99999999999999999999\n", 3, "integers"},
    {"garbage_value", "clattn-tuning 1\ndevice x\nmerge * * * * * = 4x\n", 3, "comma-separated"},
    {"no_equals", "clattn-tuning 1\ndevice x\nmerge * * * * * 4\n", 3, "no '='"},
    {"few_fields", "clattn-tuning 1\ndevice x\nmerge * * = 4\n", 3, "expected"},
    /* Numbers: plain decimal digits in the field's range; nothing wraps or is clamped. */
    {"value_4097", "clattn-tuning 1\ndevice x\nmerge * * * * * = 4097\n", 3, "integers"},
    {"value_minus_zero", "clattn-tuning 1\ndevice x\nmerge * * * * * = -0\n", 3, "integers"},
    {"value_plus_sign", "clattn-tuning 1\ndevice x\nmerge * * * * * = +16\n", 3, "integers"},
    {"value_2_pow_32_plus_16", "clattn-tuning 1\ndevice x\nmerge * * * * * = 4294967312\n", 3, "integers"},
    {"value_missing", "clattn-tuning 1\ndevice x\nmerge * * * * * =\n", 3, "integers"},
    {"value_empty_in_list", "clattn-tuning 1\ndevice x\nsoftmax * * * * * = 16,,2\n", 3, "integers"},
    {"trailing_comma", "clattn-tuning 1\ndevice x\nmerge * * * * * = 16,\n", 3, "integers"},
    {"thirteen_values", "clattn-tuning 1\ndevice x\nscores * * * * * = 1,1,1,1,1,1,1,1,1,1,1,1,1\n", 3,
     "wrong number"},
    {"head_dim_zero", "clattn-tuning 1\ndevice x\nmerge * 0 * * * = 16\n", 3, "bad dtype"},
    {"head_dim_577", "clattn-tuning 1\ndevice x\nmerge * 577 * * * = 16\n", 3, "bad dtype"},
    {"head_dim_huge", "clattn-tuning 1\ndevice x\nmerge * 99999999999999999999 * * * = 16\n", 3, "bad dtype"},
    {"head_dim_negative", "clattn-tuning 1\ndevice x\nmerge * -64 * * * = 16\n", 3, "bad dtype"},
    {"log2_negative", "clattn-tuning 1\ndevice x\nmerge * * * * -1 = 16\n", 3, "bad dtype"},
    {"log2_63", "clattn-tuning 1\ndevice x\nmerge * * * * 63 = 16\n", 3, "bad dtype"},
    {"log2_plus_sign", "clattn-tuning 1\ndevice x\nmerge * * * * +10 = 16\n", 3, "bad dtype"},
    /* Comments: an '=' in one is no separator, and a commented-out value is no value. */
    {"equals_only_in_comment", "clattn-tuning 1\ndevice x\nmerge * * * * * 16 # =32\n", 3, "no '='"},
    {"values_only_in_comment", "clattn-tuning 1\ndevice x\nmerge * * * * * = # 16\n", 3, "integers"},
    {"line_after_comments", "clattn-tuning 1\ndevice x\n# a = b\n\n  # c\nmerge * * * * * = 16 17\n", 6,
     "comma-separated"},
};

static void test_bad_file(void **state)
{
    const bad_row *r = *state;
    clattn_tuning_table t;
    char err[200] = "", line[32];
    assert_int_equal(clattn__tuning_parse(r->text, strlen(r->text), &t, err, sizeof err), -1);
    if (!strstr(err, r->why))
        fail_msg("message \"%s\" lacks \"%s\"", err, r->why);
    snprintf(line, sizeof line, "line %d: ", r->line);
    if (strncmp(err, line, strlen(line)) != 0)
        fail_msg("message \"%s\" does not start with \"%s\"", err, line);
    assert_int_equal(t.n, 0);
    assert_null(t.e);
}

/* Comments after entries, also holding '=' (the separator is the last '=' before the comment) and
 * "<=16", and fields apart by several blanks or tabs. */
static const char comment_text[] = "clattn-tuning 1\n"
                                   "device x # y\n"
                                   "# op = values\n"
                                   "merge * * * * * = 16 # was =32\n"
                                   "fused\tf32  64 \t none <=16 10=1,2,3,4,5,0#seq_q <=16, a=b\n"
                                   "  softmax * * * * * = 16 , 2   # =\n";

static void test_comments(void **state)
{
    (void)state;
    clattn_tuning_table t;
    char err[200] = "";
    if (clattn__tuning_parse(comment_text, strlen(comment_text), &t, err, sizeof err) != 0)
        fail_msg("rejected: %s", err);
    assert_string_equal(t.device, "x # y"); /* a device value is taken whole */
    assert_int_equal(t.n, 3);
    assert_int_equal(t.e[0].op, CLATTN_OP_MERGE);
    assert_int_equal(t.e[0].n, 1);
    assert_int_equal(t.e[0].v[0], 16);
    const clattn_tuning_entry fused = {CLATTN_OP_FUSED, 0, 64, 0, 1, 10, 6, {1, 2, 3, 4, 5, 0}};
    assert_memory_equal(&t.e[1], &fused, sizeof fused);
    assert_int_equal(t.e[2].op, CLATTN_OP_SOFTMAX);
    assert_int_equal(t.e[2].n, 2);
    assert_int_equal(t.e[2].v[0], 16);
    assert_int_equal(t.e[2].v[1], 2);
    clattn__tuning_free(&t);
}

/* ---- parsing on several threads at once ---- */

enum { PARSE_THREADS = 4, PARSE_ROUNDS = 20000, PARSE_ENTRIES = 24 };

typedef struct parse_worker {
    const char *text;
    pthread_barrier_t *start;
    int bad; /* parses rejected or with wrong values */
    char first_err[200];
} parse_worker;

/* Entry i of the threads' file: merge, log2_seq_kv i, WG 16 + i. */
static void *parse_loop(void *arg)
{
    parse_worker *w = arg;
    pthread_barrier_wait(w->start); /* all parse at once, none done before the last starts */
    for (int r = 0; r < PARSE_ROUNDS; r++) {
        clattn_tuning_table t;
        char err[200] = "";
        int ok = clattn__tuning_parse(w->text, strlen(w->text), &t, err, sizeof err) == 0 &&
                 t.n == PARSE_ENTRIES;
        for (int i = 0; ok && i < PARSE_ENTRIES; i++)
            ok = t.e[i].op == CLATTN_OP_MERGE && t.e[i].dtype == 0 && t.e[i].log2_skv == i &&
                 t.e[i].n == 1 && t.e[i].v[0] == 16 + i;
        if (!ok && w->bad++ == 0)
            snprintf(w->first_err, sizeof w->first_err, "%s", err[0] ? err : "wrong values");
        clattn__tuning_free(&t);
    }
    return NULL;
}

/* Contexts on separate threads load their files at once (clattn_create, clattn_reload_tuning):
 * the parser must keep no state outside the call. */
static void test_parse_threads(void **state)
{
    (void)state;
    char text[PARSE_ENTRIES * 64 + 64];
    int n = snprintf(text, sizeof text, "clattn-tuning 1\ndevice x\n");
    for (int i = 0; i < PARSE_ENTRIES; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "merge  f32 *  *   *  %d = %d\n", i, 16 + i);
    assert_true(n > 0 && (size_t)n < sizeof text);
    parse_worker w[PARSE_THREADS];
    pthread_t th[PARSE_THREADS];
    pthread_barrier_t start;
    assert_int_equal(pthread_barrier_init(&start, NULL, PARSE_THREADS), 0);
    for (int i = 0; i < PARSE_THREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].text = text;
        w[i].start = &start;
        assert_int_equal(pthread_create(&th[i], NULL, parse_loop, &w[i]), 0);
    }
    int bad = 0;
    for (int i = 0; i < PARSE_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        if (w[i].bad)
            print_message("thread %d: %d of %d parses wrong, first: %s\n", i, w[i].bad, PARSE_ROUNDS,
                          w[i].first_err);
        bad += w[i].bad;
    }
    pthread_barrier_destroy(&start);
    assert_int_equal(bad, 0);
}

static void test_nul_and_long_lines(void **state)
{
    (void)state;
    clattn_tuning_table t;
    char err[200];
    const char nul[] = "clattn-tuning 1\ndevice x\0y\n";
    assert_int_equal(clattn__tuning_parse(nul, sizeof nul - 1, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "NUL"));
    char *big = malloc(5000);
    assert_non_null(big);
    memset(big, 'a', 4999);
    memcpy(big, "clattn-tuning 1\ndevice ", 23);
    big[4998] = '\n';
    assert_int_equal(clattn__tuning_parse(big, 4999, &t, err, sizeof err), -1);
    assert_non_null(strstr(err, "too long"));
    free(big);
    /* Random bytes: rejected or accepted, never a crash (the fuzz harness goes further). */
    tu_rng rng;
    tu_seed(&rng, 7);
    char buf[300];
    for (int i = 0; i < 2000; i++) {
        const size_t n = tu_next(&rng) % sizeof buf;
        for (size_t j = 0; j < n; j++)
            buf[j] = (char)(j < 16 ? "clattn-tuning 1\n"[j] : " \n=,*0123456789abcdefuscore"[tu_next(&rng) % 27]);
        if (clattn__tuning_parse(buf, n, &t, err, sizeof err) == 0)
            clattn__tuning_free(&t);
    }
}

/* ---- the context side ---- */

static void path_of(clattn_context *ctx, char *buf, size_t size)
{
    assert_int_equal(clattn_tuning_path(ctx, buf, size), CLATTN_SUCCESS);
    assert_non_null(strstr(buf, dir));
}

static clattn_kernel_params get(clattn_context *ctx, clattn_operation op)
{
    clattn_problem_class pc = {op, CLATTN_F32, 64, 1024, 1024, 0, 0};
    clattn_kernel_params kp;
    assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
    return kp;
}

static void test_lookup_order(void **state)
{
    (void)state;
    make_dir();
    unsetenv("CLATTN_PARAMS_FUSED");
    clattn_context *ctx = tu_context();
    clattn_kernel_params base = get(ctx, CLATTN_OPERATION_FUSED);
    assert_true(base.source <= CLATTN_SOURCE_BUILTIN); /* no user file yet */
    assert_int_equal(base.count, 6);
    assert_non_null(strstr(clattn_tuning_report(ctx), "no user tuning file"));

    /* A user file for this device wins over the defaults, for its bucket only. */
    char path[4200], text[1200];
    path_of(ctx, path, sizeof path);
    snprintf(text, sizeof text,
             "clattn-tuning 1\ndevice %s\ndriver %s\nfused f32 64 none >128 10 = 2,4,8,1,8,0\n", ctx->dev.key,
             ctx->dev.driver);
    write_file(path, text, strlen(text));
    assert_int_equal(clattn_reload_tuning(ctx), CLATTN_SUCCESS);
    clattn_kernel_params u = get(ctx, CLATTN_OPERATION_FUSED);
    assert_int_equal(u.source, CLATTN_SOURCE_USER_FILE);
    const int want[6] = {2, 4, 8, 1, 8, 0};
    assert_memory_equal(u.values, want, sizeof want);
    assert_non_null(strstr(u.origin, path));
    clattn_problem_class causal = {CLATTN_OPERATION_FUSED, CLATTN_F32, 64, 1024, 1024, 1, 0};
    clattn_kernel_params c;
    assert_int_equal(clattn_get_params(ctx, &causal, &c), CLATTN_SUCCESS);
    assert_int_not_equal(c.source, CLATTN_SOURCE_USER_FILE); /* other mask kind: not this entry */
    clattn_problem_class far = {CLATTN_OPERATION_FUSED, CLATTN_F32, 64, 1024, 1 << 20, 0, 0};
    assert_int_equal(clattn_get_params(ctx, &far, &c), CLATTN_SUCCESS);
    assert_int_not_equal(c.source, CLATTN_SOURCE_USER_FILE); /* log2 seq_kv 20 is too far from 10 */

    /* The environment beats the file; an override beats both; removing it restores the file. */
    setenv("CLATTN_PARAMS_FUSED", "1,8,4,1,4", 1);
    assert_int_equal(get(ctx, CLATTN_OPERATION_FUSED).source, CLATTN_SOURCE_ENVIRONMENT);
    const int ov[6] = {4, 4, 4, 1, 4, 0};
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_FUSED, ov, 6), CLATTN_SUCCESS);
    clattn_kernel_params o = get(ctx, CLATTN_OPERATION_FUSED);
    assert_int_equal(o.source, CLATTN_SOURCE_OVERRIDE);
    assert_memory_equal(o.values, ov, sizeof ov);
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_FUSED, NULL, 0), CLATTN_SUCCESS);
    unsetenv("CLATTN_PARAMS_FUSED");
    assert_int_equal(get(ctx, CLATTN_OPERATION_FUSED).source, CLATTN_SOURCE_USER_FILE);

    /* A driver change keeps the entries and says so. */
    snprintf(text, sizeof text, "clattn-tuning 1\ndevice %s\ndriver 0.0-old\nfused f32 64 none >128 10 = 2,4,8,1,8,0\n",
             ctx->dev.key);
    write_file(path, text, strlen(text));
    assert_int_equal(clattn_reload_tuning(ctx), CLATTN_SUCCESS);
    assert_int_equal(get(ctx, CLATTN_OPERATION_FUSED).source, CLATTN_SOURCE_USER_FILE);
    assert_non_null(strstr(clattn_tuning_report(ctx), "re-run clattn-tune"));

    /* A file's kernel=mma where the matrix kernel cannot run (a store tuned under emulation, or
     * CLATTN_MATRIX=off): the call runs the FMA kernels' defaults, and get_params says so. */
    snprintf(text, sizeof text,
             "clattn-tuning 2\ndevice %s\ndriver %s\nfused f32 64 none >128 10 = WGX=1,WGY=2,RM=1,NS=2,VW=4,DIRECT=mma\n",
             ctx->dev.key, ctx->dev.driver);
    write_file(path, text, strlen(text));
    assert_int_equal(clattn_reload_tuning(ctx), CLATTN_SUCCESS);
    clattn_kernel_params m = get(ctx, CLATTN_OPERATION_FUSED);
    if (clattn__matrix_unavailable(ctx)) {
        assert_true(m.source == CLATTN_SOURCE_VENDOR || m.source == CLATTN_SOURCE_GENERIC);
        assert_int_not_equal(m.values[5], CLATTN_KERNEL_MMA_FUSED);
        if (!strstr(m.origin, "names kernel=mma, which cannot run here"))
            fail_msg("origin does not say why the file's kernel=mma is not used: %s", m.origin);
    } else {
        assert_int_equal(m.source, CLATTN_SOURCE_USER_FILE);
        assert_int_equal(m.values[5], CLATTN_KERNEL_MMA_FUSED);
    }
    clattn_release(ctx);
}

/* CLATTN_PARAMS_<OP> lists the library cannot take: they are not used (the parameters are those
 * without the variable), clattn_get_params' origin and the tuning report of a new context name the
 * variable and why, and a valid list afterwards is taken again. */
typedef struct env_row {
    const char *name;
    const char *value;
} env_row;

static const env_row env_rows[] = {
    {"letter", "1,8,x"},         {"too_many", "1,8,4,1,4,0,7"}, {"negative", "1,-8"},
    {"too_big", "1,5000"},       {"empty_field", "1,,4"},       {"words", "fast"},
    {"separator", "1;8;4"},      {"trailing_text", "1,8 x"},    {"trailing_comma", "1,8,"},
    {"blank", "1, 8"},           {"plus_sign", "+1,8"},         {"direct_past_choices", "1,1,6,1,16,3"},
};

static void test_bad_env(void **state)
{
    const env_row *r = *state;
    make_dir();
    unsetenv("CLATTN_PARAMS_FUSED");
    clattn_context *ctx = tu_context();
    const clattn_kernel_params want = get(ctx, CLATTN_OPERATION_FUSED);
    assert_int_not_equal(want.source, CLATTN_SOURCE_ENVIRONMENT);
    assert_null(strstr(clattn_tuning_report(ctx), "CLATTN_PARAMS"));
    clattn_release(ctx);

    setenv("CLATTN_PARAMS_FUSED", r->value, 1);
    ctx = tu_context();
    char named[200];
    snprintf(named, sizeof named, "CLATTN_PARAMS_FUSED=\"%s\" ignored", r->value);
    if (!strstr(clattn_tuning_report(ctx), named))
        fail_msg("tuning report \"%s\" lacks \"%s\"", clattn_tuning_report(ctx), named);
    const clattn_kernel_params got = get(ctx, CLATTN_OPERATION_FUSED);
    assert_int_equal(got.source, want.source);
    assert_memory_equal(got.values, want.values, sizeof want.values);
    char names[80]; /* the schema's names, the kernel choice with its largest value */
    snprintf(names, sizeof names, "WGX,WGY,RM,NS,VW,DIRECT<=%d", clattn_param_max(CLATTN_OPERATION_FUSED, 5));
    if (!strstr(got.origin, named) || !strstr(got.origin, names))
        fail_msg("origin \"%s\" lacks \"%s\" or \"%s\"", got.origin, named, names);
    assert_null(strstr(clattn_tuning_report(ctx), "CLATTN_PARAMS_DECODE")); /* other ops unaffected */

    /* The variable is read at every call: a valid list now is taken, and named without blame. */
    setenv("CLATTN_PARAMS_FUSED", "1,8", 1);
    const clattn_kernel_params ok = get(ctx, CLATTN_OPERATION_FUSED);
    assert_int_equal(ok.source, CLATTN_SOURCE_ENVIRONMENT);
    assert_int_equal(ok.values[0], 1);
    assert_int_equal(ok.values[1], 8);
    assert_int_equal(ok.values[2], want.values[2]); /* a shorter list keeps the rest */
    assert_null(strstr(ok.origin, "ignored"));
    unsetenv("CLATTN_PARAMS_FUSED");
    clattn_release(ctx);
}

/* CLATTN_NREG16 (4, 8 or 32) replaces the CPU kernels' register budget that the device's native
 * float width gives (device.c); any other value, or a device that is not a CPU, leaves it, and the
 * tuning report names the variable and why. */
static void test_env_nreg16(void **state)
{
    (void)state;
    make_dir();
    unsetenv("CLATTN_NREG16");
    clattn_context *ctx = tu_context();
    const int native = ctx->dev.nreg16, cpu = (ctx->dev.type & CL_DEVICE_TYPE_CPU) != 0;
    assert_null(strstr(clattn_tuning_report(ctx), "CLATTN_NREG16"));
    clattn_release(ctx);
    static const char *const values[] = {"4", "8", "32", "16", "08", "8 ", "x", "-8", "320", "4,8"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        const int good = i < 3;
        setenv("CLATTN_NREG16", values[i], 1);
        ctx = tu_context();
        char named[120];
        snprintf(named, sizeof named, "CLATTN_NREG16=\"%s\" ignored: %s", values[i],
                 !cpu ? "the device is not a CPU" : "expected 4, 8 or 32");
        const int want = good && cpu ? atoi(values[i]) : native;
        if (ctx->dev.nreg16 != want)
            fail_msg("CLATTN_NREG16=\"%s\": nreg16 %d, expected %d", values[i], ctx->dev.nreg16, want);
        if (good && cpu ? strstr(clattn_tuning_report(ctx), "CLATTN_NREG16") != NULL
                        : strstr(clattn_tuning_report(ctx), named) == NULL)
            fail_msg("CLATTN_NREG16=\"%s\": tuning report \"%s\"", values[i], clattn_tuning_report(ctx));
        clattn_release(ctx);
    }
    /* A reload reads the variable again: without it, the device's own value, and programs built
     * for the other register tiles are dropped (-DNREG16 is not in the program cache's key). */
    const int other = native == 4 ? 8 : 4;
    char value[8];
    snprintf(value, sizeof value, "%d", other);
    setenv("CLATTN_NREG16", value, 1);
    ctx = tu_context();
    const int forced = ctx->dev.nreg16;
    assert_int_equal(forced, cpu ? other : native);
    cl_kernel k = NULL;
    if (clattn__get_kernel(ctx, "merge.cl", "-cl-std=CL1.2 -DDT_OUT=0 -DWG=16", "merge_strided", &k) != CLATTN_SUCCESS)
        fail_msg("merge.cl: %s", clattn_last_error(ctx));
    assert_int_equal(ctx->nprograms, 1);
    unsetenv("CLATTN_NREG16");
    assert_int_equal(clattn_reload_tuning(ctx), CLATTN_SUCCESS);
    assert_int_equal(ctx->dev.nreg16, native);
    assert_int_equal(ctx->nprograms, forced != native ? 0 : 1);
    clattn_release(ctx);
}

/* DECODE's SPLITS: 0 lets the library split the keys to fill the device, any other count is taken
 * (then fitted: at least 4 key blocks a split, at most 65536 keys, the partials' workspace).
 * SPLITS 1 is one split, no partials and no merge (it meant "automatic" as 0 did); 4 gives four
 * splits' partials. Each result matches a float64 reference. */
static void test_decode_splits(void **state)
{
    (void)state;
    enum { SKV = 5000, D = 64 };
    static float q[D], k[SKV * D], v[SKV * D], out[D];
    double want[D], s[SKV], mx = -INFINITY, sum = 0;
    for (int i = 0; i < D; i++)
        q[i] = (float)((i * 37 % 19) - 9) / 16.0f;
    for (int i = 0; i < SKV * D; i++) {
        k[i] = (float)((i * 53 % 29) - 14) / 32.0f;
        v[i] = (float)((i * 71 % 23) - 11) / 8.0f;
    }
    for (int j = 0; j < SKV; j++) {
        s[j] = 0;
        for (int d = 0; d < D; d++)
            s[j] += (double)q[d] * k[j * D + d];
        s[j] /= sqrt((double)D);
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int d = 0; d < D; d++)
        want[d] = 0;
    for (int j = 0; j < SKV; j++) {
        const double e = exp(s[j] - mx);
        sum += e;
        for (int d = 0; d < D; d++)
            want[d] += e * v[j * D + d];
    }
    static const int splits[3] = {1, 0, 4};
    for (int i = 0; i < 3; i++) {
        clattn_context *ctx = tu_context(); /* fresh: its workspace says what the call needed */
        const int vals[7] = {1, 1, 0, 4, 16, splits[i], 1}; /* fused_direct reading K and V in place */
        assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_DECODE, vals, 7), CLATTN_SUCCESS);
        clattn_attention_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.batch = desc.heads_q = desc.heads_kv = desc.seq_q = 1;
        desc.seq_kv = SKV;
        desc.head_dim = D;
        if (clattn_attention_host(ctx, &desc, CLATTN_F32, q, k, v, out, NULL) != CLATTN_SUCCESS)
            fail_msg("SPLITS %d: %s", splits[i], clattn_last_error(ctx));
        for (int d = 0; d < D; d++)
            if (fabs(out[d] - want[d] / sum) > 2e-5 + 1e-4 * fabs(want[d] / sum))
                fail_msg("SPLITS %d: out[%d] %.9g, expected %.9g", splits[i], d, out[d], want[d] / sum);
        const size_t partials = (size_t)(D + 1) * 4; /* one split's O row and LSE */
        print_message("SPLITS %d: workspace %zu bytes\n", splits[i], ctx->workspace_size);
        if (splits[i] == 1 && ctx->workspace_size != 0)
            fail_msg("SPLITS 1: a workspace of %zu bytes (partials of split keys)", ctx->workspace_size);
        if (splits[i] != 1 && ctx->workspace_size < (splits[i] ? (size_t)splits[i] : 2) * partials)
            fail_msg("SPLITS %d: a workspace of %zu bytes, too small for its partials", splits[i],
                     ctx->workspace_size);
        clattn_release(ctx);
    }
}

#if defined(CLATTN_TUNE_PATH) || defined(CLATTN_BENCH_PATH) || defined(CLATTN_INFO_PATH)
/* The file `name` of the test directory (a tool's output), NUL-terminated, cut at size - 1. */
static void read_text(const char *name, char *buf, size_t size)
{
    char path[400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    const size_t len = fread(buf, 1, size - 1, f);
    buf[len] = '\0';
    fclose(f);
}
#endif

#ifdef CLATTN_BENCH_PATH
/* Runs clattn-bench with `args` after the environment assignments `env`, its stdout into the
 * test directory's file `out` (NULL: discarded) and its stderr read back into log.
 * @return system()'s status. */
static int run_bench(const char *env, const char *args, const char *out, char *log, size_t size)
{
    char cmd[1200], out_path[400] = "/dev/null";
    if (out)
        snprintf(out_path, sizeof out_path, "%s/%s", dir, out);
    snprintf(cmd, sizeof cmd, "%s %s %s >%s 2>%s/bench.log", env, CLATTN_BENCH_PATH, args, out_path,
             dir);
    const int rc = system(cmd);
    read_text("bench.log", log, size);
    return rc;
}
#endif

/* clattn-bench refuses a list the library would ignore (a sweep would measure other values than
 * it names) and lists the parameters it measured, with their source. */
static void test_bench_env(void **state)
{
    (void)state;
#ifndef CLATTN_BENCH_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    clattn_release(tu_context()); /* skips (or fails, CLATTN_REQUIRE_DEVICE=1) without a device */
    char env[64], buf[8192];
    const char *runs[2] = {"1,1,0,4,16,0,x", "1,1,0,4,16,0,1"};
    for (int i = 0; i < 2; i++) {
        snprintf(env, sizeof env, "CLATTN_PARAMS_DECODE=%s", runs[i]);
        const int rc = run_bench(env,
                                 "--op decode --batch 1 --heads 2 --seq-kv 100 --dim 16 --iters 1 "
                                 "--warmup 0 --csv --check",
                                 NULL, buf, sizeof buf);
        if (i == 0) {
            assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
            if (!strstr(buf, "CLATTN_PARAMS_DECODE=\"1,1,0,4,16,0,x\" ignored") || strstr(buf, "check decode"))
                fail_msg("clattn-bench ran or did not name the bad list:\n%s", buf);
        } else {
            assert_int_equal(rc, 0);
            if (!strstr(buf, "[environment: CLATTN_PARAMS_DECODE=1,1,0,4,16,0,1]") || !strstr(buf, "check decode"))
                fail_msg("clattn-bench did not list the parameters it measured:\n%s", buf);
        }
    }
#endif
}

/* clattn-bench's peak: the multiply-add kernels build and run on this device and give one CSV
 * line with a finite positive rate, the winning vector width in the dtype column, and no shape. */
static void test_bench_peak(void **state)
{
    (void)state;
#ifndef CLATTN_BENCH_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    clattn_release(tu_context()); /* skips (or fails, CLATTN_REQUIRE_DEVICE=1) without a device */
    char buf[8192];
    const int rc = run_bench("", "--op peak --iters 2 --warmup 0 --csv", "peak.csv", buf, sizeof buf);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
        fail_msg("clattn-bench --op peak failed:\n%s", buf);
    read_text("peak.csv", buf, sizeof buf);
    const char *line = strstr(buf, "\npeak,");
    if (!line)
        fail_msg("no peak line:\n%s", buf);
    /* op,device,dtype,B,Hq,Hkv,Sq,Skv,D,causal,ms_median,ms_min,gflops,... */
    char field[16][64];
    int n = 0;
    const char *p = line + 1;
    while (n < 16 && *p && *p != '\n') {
        const size_t len = strcspn(p, ",\n");
        snprintf(field[n++], sizeof field[0], "%.*s", (int)(len < 63 ? len : 63), p);
        p += len;
        if (*p == ',')
            p++;
    }
    if (n < 13)
        fail_msg("short peak line: %s", line + 1);
    if (strcmp(field[2], "f32") && strcmp(field[2], "f32x4") && strcmp(field[2], "f32x8") &&
        strcmp(field[2], "f32x16"))
        fail_msg("peak width '%s'", field[2]);
    for (int i = 3; i < 10; i++)
        if (field[i][0])
            fail_msg("peak line has a shape field %d: '%s'", i, field[i]);
    const double gflops = strtod(field[12], NULL), ms = strtod(field[10], NULL);
    if (!(gflops > 0.0 && gflops < 1e7 && ms > 0.0))
        fail_msg("peak rate %s GFLOP/s in %s ms", field[12], field[10]);
#endif
}

/* clattn-bench --mask and --kv-len: every masked op is passed the masks (its float64 check, which
 * applies them, passes on every line: masks left out or key lengths off by one fail it), the CSV
 * names them in its last column, and a malformed value exits 1 before anything runs. */
static void test_bench_masks(void **state)
{
    (void)state;
#ifndef CLATTN_BENCH_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    clattn_release(tu_context()); /* skips (or fails, CLATTN_REQUIRE_DEVICE=1) without a device */
    static const struct {
        const char *args, *column;
    } runs[] = {
        /* key lengths 0 (a batch with no key), short, past seq_kv (clamped); rows whose window
         * lies past their batch's keys see nothing */
        {"--mask window:23 --kv-len 70,0,500", "window:23+kvlen"},
        {"--mask bias --dtype f16", "bias"},
        {"--kv-len 9,90 --dtype bf16", "kvlen"},
    };
    static const char *const ops[] = {"scores", "softmax", "unfused", "fused", "fused causal", "decode"};
    char args[512], buf[16384];
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        snprintf(args, sizeof args,
                 "--op scores,softmax,unfused,fused,decode --batch 3 --heads 4 --heads-kv 2 --seq-q 40 "
                 "--seq-kv 100 --dim 16 --iters 1 --warmup 0 --csv --check %s",
                 runs[r].args);
        const int rc = run_bench("", args, "masks.csv", buf, sizeof buf);
        if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0)
            fail_msg("clattn-bench %s: exit %d:\n%s", runs[r].args, rc, buf);
        char want[128];
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            snprintf(want, sizeof want, "check %s mask %s ", ops[o], runs[r].column);
            const char *line = strstr(buf, want), *end = line ? strchr(line, '\n') : NULL;
            if (!end || end - line < 4 || strncmp(end - 4, ": ok", 4) != 0)
                fail_msg("clattn-bench %s: no passing check line '%s':\n%s", runs[r].args, want, buf);
        }
        if (strstr(buf, "FAILED"))
            fail_msg("clattn-bench %s:\n%s", runs[r].args, buf);
        read_text("masks.csv", buf, sizeof buf);
        if (!strstr(buf, ",ratio,mask\n"))
            fail_msg("CSV header without the mask column:\n%s", buf);
        snprintf(want, sizeof want, ",%s\n", runs[r].column);
        int lines = 0;
        for (const char *p = strstr(buf, want); p; p = strstr(p + 1, want))
            lines++;
        if (lines != 6)
            fail_msg("%d CSV lines end in '%s', want 6:\n%s", lines, want, buf);
    }
    static const char *const bad[] = {"--mask window:0", "--mask window:", "--mask causal",
                                      "--kv-len 4,,5", "--kv-len 4,", "--kv-len -1",
                                      "--kv-len 2147483648", "--kv-len"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "--op fused --seq-q 4 --seq-kv 8 --dim 4 %s", bad[i]);
        const int rc = run_bench("", args, NULL, buf, sizeof buf);
        if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 1 || !strstr(buf, bad[i][2] == 'm' ? "--mask" : "--kv-len") ||
            strstr(buf, "check"))
            fail_msg("clattn-bench %s: exit %d, want 1 with a message:\n%s", bad[i], rc, buf);
    }
#endif
}

/* clattn-bench refuses, before anything runs, an option given twice (the last value used to win
 * without a word), options that mean nothing without another, and an op listed twice. */
static void test_bench_refused(void **state)
{
    (void)state;
#ifndef CLATTN_BENCH_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    static const char *const bad[][2] = {
        {"--op fused --batch 1 --batch 2", "--batch is given twice"},
        {"--op fused --dim-v 4 --head-dim-v 4", "--dim-v and --head-dim-v are one option"},
        {"--op fused --iters 1 --iters=2", "--iters is given twice"},
        {"--op fused --sinks --sinks 0.5", "--sinks is given twice"},
        {"--op fused --window 2,0 --sliding 5", "--window and --sliding"},
        {"--op fused --page-layout hnd", "--page-layout needs --page"},
        {"--op fused --dropout-seed 5", "--dropout-seed needs --dropout"},
        {"--op unfused --varlen 4,8", "--varlen times the fused op"},
        {"--op fused,fused", "already listed"},
        {"--op all,decode", "already listed"},
        {"--op fused --dropout 0", "probability in (0, 1)"},
        {"--op fused --device ''", "an empty spec"},
    };
    char args[512], buf[8192];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "--seq-q 4 --seq-kv 8 --dim 4 --warmup 0 %s", bad[i][0]);
        const int rc = run_bench("", args, NULL, buf, sizeof buf);
        if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 1 || !strstr(buf, bad[i][1]) || strstr(buf, "GFLOP"))
            fail_msg("clattn-bench %s: exit %d, want 1 and \"%s\":\n%s", bad[i][0], rc, bad[i][1], buf);
    }
#endif
}

/* clattn-bench --page: the paged KV row passes its float64 check, and its two kv_read rows (the
 * device's own cost of pages) follow, whose reads of the pool and of the contiguous buffers must
 * fold to the same value (the bench fails with "kv_read: FAILED" where a layout, the table or the
 * key spans read other rows): NHD and HND pools, quantized and i8 rows of 16, 4 and 1 byte words,
 * page sizes that do not divide the keys, key lengths with an empty batch, and MLA's V in K. */
static void test_bench_pages(void **state)
{
    (void)state;
#ifndef CLATTN_BENCH_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    clattn_release(tu_context()); /* skips (or fails, CLATTN_REQUIRE_DEVICE=1) without a device */
    /* (each option once: clattn-bench refuses one given twice) */
    static const char *const runs[] = {
        "--heads-kv 2 --seq-q 1 --dim 64 --page 16 --page-layout hnd",
        "--heads-kv 2 --seq-q 1 --dim 64 --page 5 --kv-type q4_0,q8_0 --kv-len 70,0,100",
        "--heads-kv 2 --page 3 --kv-type i8,fp8_e5m2 --page-layout hnd --dim 33 --causal --seq-q 4",
        "--seq-q 1 --page 8 --mla --heads-kv 1 --dim 96 --dim-v 64 --scale 0.1",
    };
    char args[512], buf[16384];
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        snprintf(args, sizeof args,
                 "--op decode --batch 3 --heads 4 --seq-kv 100 --dtype f16 --iters 1 --warmup 0 --csv --check %s",
                 runs[r]);
        const int rc = run_bench("", args, "pages.csv", buf, sizeof buf);
        if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0 || strstr(buf, "FAILED"))
            fail_msg("clattn-bench %s: exit %d:\n%s", runs[r], rc, buf);
        read_text("pages.csv", buf, sizeof buf);
        int reads = 0;
        for (const char *p = strstr(buf, "\nkv_read,"); p; p = strstr(p + 1, "\nkv_read,"))
            reads++;
        if (reads != 2 || !strstr(buf, ",page_read_ms/contig_read_ms,"))
            fail_msg("clattn-bench %s: %d kv_read lines, want 2 and the ratio:\n%s", runs[r], reads, buf);
    }
#endif
}

#ifdef CLATTN_INFO_PATH
/* 1 when s is one JSON value's worth of balanced braces and brackets outside strings, starting
 * with '{' and ending with '}' (and blanks): enough to catch a cut or mangled object. */
static int json_balanced(const char *s)
{
    while (*s == ' ' || *s == '\n')
        s++;
    if (*s != '{')
        return 0;
    int depth = 0, in_str = 0;
    const char *last = s;
    for (; *s; s++) {
        if (in_str) {
            if (*s == '\\' && s[1])
                s++;
            else if (*s == '"')
                in_str = 0;
            continue;
        }
        if (*s == '"')
            in_str = 1;
        else if (*s == '{' || *s == '[')
            depth++;
        else if ((*s == '}' || *s == ']') && --depth < 0)
            return 0;
        if (*s != ' ' && *s != '\n')
            last = s;
    }
    return depth == 0 && !in_str && *last == '}';
}
#endif

#ifdef CLATTN_INFO_PATH
/* clattn-info --class arg shows, on this device's line labelled `label`, what clattn_get_params
 * gives for pc: the values and their source, in the table and in --json. */
static void info_shows_class(clattn_context *ctx, const char *arg, const char *label, const clattn_problem_class *pc)
{
    clattn_kernel_params kp;
    assert_int_equal(clattn_get_params(ctx, pc, &kp), CLATTN_SUCCESS);
    char vals[512], want[640], head[160], key[200], cmd[1200];
    size_t n = 0;
    for (int i = 0; i < kp.count && n < sizeof vals; i++)
        n += (size_t)snprintf(vals + n, sizeof vals - n, "%s%s=%d", i ? " " : "", clattn_param_name(pc->operation, i),
                              kp.values[i]);
    snprintf(want, sizeof want, "%s  [%s: ", vals, clattn_params_source_name(kp.source));
    snprintf(head, sizeof head, "  %s : ", label);
    static char buf[1 << 16];
    for (int json = 0; json < 2; json++) {
        snprintf(cmd, sizeof cmd, "%s%s --class %s >%s/info.txt 2>&1", CLATTN_INFO_PATH, json ? " --json" : "", arg,
                 dir);
        assert_int_equal(system(cmd), 0);
        read_text("info.txt", buf, sizeof buf);
        if (json && !json_balanced(buf))
            fail_msg("clattn-info --json --class %s is not a whole object:\n%.3000s", arg, buf);
        /* from this device's key on: other devices have their own lines */
        snprintf(key, sizeof key, json ? "\"device_key\": \"%s\"" : "device key             : %s", ctx->dev.key);
        const char *dev = strstr(buf, key), *at = dev;
        if (at && !json) {
            at = strstr(at, head);
            if (at && strncmp(at + strlen(head), want, strlen(want)) != 0)
                at = NULL;
        } else if (at) {
            char fields[700];
            snprintf(fields, sizeof fields, "\"values\": \"%s\",\n", vals);
            at = strstr(at, "\"classes\": [");
            at = at ? strstr(at, fields) : NULL;
            snprintf(fields, sizeof fields, "\"source\": \"%s\"", clattn_params_source_name(kp.source));
            at = at ? strstr(at, fields) : NULL;
        }
        if (!at)
            fail_msg("clattn-info%s --class %s lacks \"%s%s\" on device %s:\n%.3000s", json ? " --json" : "", arg,
                     head, want, ctx->dev.key, dev ? dev : buf);
    }
}

/* clattn-info --class arg exits 1 and says want. */
static void info_refused(const char *arg, const char *want)
{
    char cmd[1200], log[8192];
    snprintf(cmd, sizeof cmd, "%s %s >%s/info.txt 2>&1", CLATTN_INFO_PATH, arg, dir);
    const int rc = system(cmd);
    read_text("info.txt", log, sizeof log);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 1 || !strstr(log, want))
        fail_msg("clattn-info %s: exit %d, want 1 and \"%s\":\n%.2000s", arg, WIFEXITED(rc) ? WEXITSTATUS(rc) : -1,
                 want, log);
}
#endif

/* clattn-info: the table and --json list this device (its key) and the default choice; a spec
 * that resolves to nothing, an unknown option and a context the default device refuses exit 1
 * with a message. */
static void test_info(void **state)
{
    (void)state;
#ifndef CLATTN_INFO_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    clattn_context *ctx = tu_context();
    char key[sizeof ctx->dev.key];
    snprintf(key, sizeof key, "%s", ctx->dev.key);
    clattn_release(ctx);
    static char buf[1 << 16];
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s >%s/info.txt 2>&1", CLATTN_INFO_PATH, dir);
    assert_int_equal(system(cmd), 0);
    read_text("info.txt", buf, sizeof buf);
    if (!strstr(buf, key) || !strstr(buf, "clattn_create(NULL) picks"))
        fail_msg("clattn-info lacks the device key %s or the default choice:\n%.2000s", key, buf);
    snprintf(cmd, sizeof cmd, "%s --json >%s/info.json 2>%s/info.err", CLATTN_INFO_PATH, dir, dir);
    assert_int_equal(system(cmd), 0);
    read_text("info.json", buf, sizeof buf);
    if (!json_balanced(buf) || !strstr(buf, "\"clattn_version\"") || !strstr(buf, key))
        fail_msg("clattn-info --json is not a whole object naming device key %s:\n%.2000s", key, buf);
    const char *bad[][2] = {
        {"--device no-such-device-anywhere", "matches no OpenCL device"},
        {"--bogus", "unknown option"},
        {"--class", "bad --class: needs a CLASS"},
        {"--class fused,f32,16,48", "fewer than 5 fields"},
        {"--class fused,f32,16,48,80,causal,masked,causal", "more than 7 fields"},
        {"--class fusedd,f32,16,48,80", "unknown operation"},
        {"--class fused,f64,16,48,80", "unknown dtype"},
        {"--class fused,f32,0,48,80", "HEAD_DIM must be an integer, 1 to 576"},
        {"--class fused,f32,577,48,80", "HEAD_DIM must be an integer, 1 to 576"},
        {"--class fused,f32,64x,48,80", "HEAD_DIM must be an integer, 1 to 576"},
        {"--class softmax,f32,16,48,80", "HEAD_DIM must be 0"},
        {"--class fused,f32,16,0,80", "SEQ_Q and SEQ_KV must be positive"},
        {"--class fused,f32,16,48,-80", "SEQ_Q and SEQ_KV must be positive"},
        {"--class fused,f32,16,48,99999999999999999999", "SEQ_Q and SEQ_KV must be positive"},
        {"--class fused,f32,16,48,80x", "SEQ_Q and SEQ_KV must be positive"},
        {"--class fused,f32,16,48,80,causal,causal", "a flag is given twice"},
        {"--class merge,f32,0,48,80,causal", "merge takes no causal or masked flag"},
        {"--class merge,f16,0,48,80,masked", "merge takes no causal or masked flag"},
        {"--class fused,f32,16,48,80,", "a flag is not causal or masked"},
        {"--class=fused,f32,16,48,80,kvlen", "a flag is not causal or masked"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        info_refused(bad[i][0], bad[i][1]);
    /* at most 16 classes */
    char many[1100] = "";
    for (int i = 0; i < 17; i++)
        strcat(many, "--class merge,f32,0,1,2 ");
    info_refused(many, "given more than 16 times");
    /* A device that resolves but refuses a context (here a bad CLATTN_MATRIX): exit 1, named. */
    const char *matrix = getenv("CLATTN_MATRIX");
    char saved[64] = "";
    if (matrix)
        snprintf(saved, sizeof saved, "%s", matrix);
    setenv("CLATTN_MATRIX", "bogus", 1);
    info_refused("", "clattn_create(NULL) fails on");
    info_refused("--json", "CLATTN_MATRIX=\"bogus\"");
    if (matrix)
        setenv("CLATTN_MATRIX", saved, 1);
    else
        unsetenv("CLATTN_MATRIX");
#endif
}

typedef struct file_row {
    const char *name;
    const char *body; /* after the header; %s is the device key */
    int header;       /* 1: write "clattn-tuning 1\n" first */
    const char *why;
} file_row;

static const file_row file_rows[] = {
    {"foreign", "device 0000:another_device:1:1\nfused f32 64 none >128 10 = 2,4,8,1,8,0\n", 1, "another device"},
    {"pattern_as_user", "match %s\nfused f32 64 none >128 10 = 2,4,8,1,8,0\n", 1, "another device"},
    {"truncated", "device %s\nfused f32 64 none >128 10 = 2,4,8", 1, "truncated"},
    {"malformed", "device %s\nfused f32 64 none >128 10 = 2,4,8,1,8,0,9\n", 1, "wrong number"},
    {"choice_too_big", "device %s\nfused f32 64 none >128 10 = 2,4,8,1,8,3\n", 1, "choice"},
    {"garbage", "\x7f" "ELF\x02\x01\x01 binary garbage %s\n", 0, "not a clattn tuning file"},
    {"stale_version", "clattn-tuning 0\ndevice %s\n", 0, "unsupported format version"},
};

static void test_bad_user_file(void **state)
{
    const file_row *r = *state;
    make_dir();
    clattn_context *ctx = tu_context();
    const clattn_kernel_params before = get(ctx, CLATTN_OPERATION_FUSED);
    char path[4200], body[1200], text[1300];
    path_of(ctx, path, sizeof path);
    snprintf(body, sizeof body, r->body, ctx->dev.key);
    snprintf(text, sizeof text, "%s%s", r->header ? "clattn-tuning 1\n" : "", body);
    write_file(path, text, strlen(text));
    assert_int_equal(clattn_reload_tuning(ctx), CLATTN_SUCCESS);
    const char *rep = clattn_tuning_report(ctx);
    if (!strstr(rep, "ignored") || !strstr(rep, r->why))
        fail_msg("report \"%s\" lacks \"ignored\" / \"%s\"", rep, r->why);
    clattn_kernel_params after = get(ctx, CLATTN_OPERATION_FUSED);
    assert_int_equal(after.source, before.source);
    assert_memory_equal(after.values, before.values, sizeof after.values);
    clattn_release(ctx);
    /* A new context on the same bad file is created normally. */
    ctx = tu_context();
    assert_non_null(strstr(clattn_tuning_report(ctx), "ignored"));
    clattn_release(ctx);
}

/* ---- user files that are no regular file, and the size limit ---- */

typedef enum odd_kind { ODD_FIFO, ODD_DIRECTORY, ODD_DEV_ZERO } odd_kind;

typedef struct odd_row {
    const char *name;
    odd_kind kind;
} odd_row;

static const odd_row odd_rows[] = {
    {"fifo", ODD_FIFO},            /* opening it for reading would wait for a writer for ever */
    {"directory", ODD_DIRECTORY},
    {"symlink_to_dev_zero", ODD_DEV_ZERO}, /* endless zeros */
};

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_tuning: creating or reloading a context blocked on the tuning file\n";
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(2);
    _exit(1);
}

/* clattn_create and clattn_reload_tuning return at once, report the file and use the parameters
 * they would use without it. A hang ends the whole executable (SIGALRM), not only this test. */
static void test_odd_user_file(void **state)
{
    const odd_row *r = *state;
    make_dir();
    clattn_context *ctx = tu_context();
    const clattn_kernel_params before = get(ctx, CLATTN_OPERATION_FUSED);
    char path[4200];
    path_of(ctx, path, sizeof path);
    clattn_release(ctx);
    switch (r->kind) {
    case ODD_FIFO:
        assert_int_equal(mkfifo(path, 0600), 0);
        break;
    case ODD_DIRECTORY:
        assert_int_equal(mkdir(path, 0700), 0);
        break;
    case ODD_DEV_ZERO:
        assert_int_equal(symlink("/dev/zero", path), 0);
        break;
    }
    void (*old)(int) = signal(SIGALRM, on_alarm);
    alarm(60);
    ctx = tu_context();
    const clattn_status st = clattn_reload_tuning(ctx);
    alarm(0);
    signal(SIGALRM, old);
    assert_int_equal(st, CLATTN_SUCCESS);
    const char *rep = clattn_tuning_report(ctx);
    if (!strstr(rep, path) || !strstr(rep, "not a regular file"))
        fail_msg("report \"%s\" does not name %s as not a regular file", rep, path);
    const clattn_kernel_params after = get(ctx, CLATTN_OPERATION_FUSED);
    assert_true(after.source <= CLATTN_SOURCE_BUILTIN);
    assert_int_equal(after.source, before.source);
    assert_memory_equal(after.values, before.values, sizeof after.values);
    clattn_release(ctx);
}

typedef struct size_row {
    const char *name;
    size_t size;
    int accepted;
} size_row;

static const size_row size_rows[] = {
    {"exactly_1_MiB", 1 << 20, 1},
    {"1_MiB_plus_1", (1 << 20) + 1, 0},
};

/* A valid file of exactly r->size bytes: one entry, then comment lines (at most 1000 bytes each,
 * the limit being 1023) filling it up. */
static void test_file_size(void **state)
{
    const size_row *r = *state;
    make_dir();
    clattn_context *ctx = tu_context();
    char path[4200];
    path_of(ctx, path, sizeof path);
    char *text = malloc(r->size);
    assert_non_null(text);
    size_t n = (size_t)snprintf(text, r->size, "clattn-tuning 1\ndevice %s\nfused f32 64 none >128 10 = 2,4,8,1,8,0\n",
                                ctx->dev.key);
    while (n < r->size) {
        const size_t line = r->size - n < 1000 ? r->size - n : 1000;
        memset(text + n, 'x', line);
        text[n] = line > 1 ? '#' : '\n';
        text[n + line - 1] = '\n';
        n += line;
    }
    write_file(path, text, r->size);
    free(text);
    assert_int_equal(clattn_reload_tuning(ctx), CLATTN_SUCCESS);
    const char *rep = clattn_tuning_report(ctx);
    const clattn_kernel_params kp = get(ctx, CLATTN_OPERATION_FUSED);
    if (r->accepted) {
        if (!strstr(rep, "1 entries"))
            fail_msg("report \"%s\" lacks \"1 entries\"", rep);
        assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    } else {
        if (!strstr(rep, "larger than 1 MiB"))
            fail_msg("report \"%s\" lacks \"larger than 1 MiB\"", rep);
        assert_int_not_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    }
    clattn_release(ctx);
}

/* ---- user files the user does not own: not trusted (docs/guarantees.md) ---- */


typedef tu_trust_kind trust_kind; /* testutil.h */

typedef struct trust_row {
    const char *name;
    trust_kind kind;
    int needs_root; /* stages a file or directory of another owner */
    const char *why; /* in the report after "not trusted: "; NULL: the file is used */
} trust_row;

static const trust_row trust_rows[] = {
    {"file_other_owner", TU_TRUST_FILE_OTHER_OWNER, 1, "owned by uid 65534, not by this user"},
    {"file_group_writable", TU_TRUST_FILE_GROUP_WRITABLE, 0, "writable by group or others (mode 0664)"},
    {"file_other_writable", TU_TRUST_FILE_OTHER_WRITABLE, 0, "writable by group or others (mode 0646)"},
    {"dir_world_writable_no_sticky", TU_TRUST_DIR_WORLD_WRITABLE, 0, "the directory is writable by group or others (mode 0777"},
    {"dir_other_owner", TU_TRUST_DIR_OTHER_OWNER, 1, "the directory is owned by uid 65534"},
    {"dir_root_sticky_good_file_accepted", TU_TRUST_DIR_ROOT_STICKY, 1, NULL},
    {"symlink_to_other_users_file", TU_TRUST_SYMLINK_OTHER_FILE, 0, "a symbolic link, not a regular file"},
    {"dir_replaced_after_open", TU_TRUST_DIR_REPLACED, 0, "the directory is writable by group or others (mode 0777"},
};

static char replaced_old[160], replaced_new[160];
static int replaced; /* 1 once done, -1 if a rename failed */

static void replace_dir_hook(const char *d)
{
    if (replaced != 0 || strcmp(d, dir) != 0)
        return;
    replaced = rename(dir, replaced_old) == 0 && rename(replaced_new, dir) == 0 ? 1 : -1;
}

static void remove_path(const char *path)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    assert_int_equal(system(cmd), 0);
}

/* clattn_softmax on the context, against a float64 softmax: whatever the tuning store held, the
 * call computes the right thing. */
static void check_softmax_correct(clattn_context *ctx)
{
    enum { ROWS = 3, COLS = 37 };
    float x[ROWS * COLS], y[ROWS * COLS];
    double got[ROWS * COLS], want[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++)
        x[i] = (float)((i * 7 % 13) - 6) * 0.375f;
    for (int r = 0; r < ROWS; r++) {
        double m = -INFINITY, sum = 0;
        for (int c = 0; c < COLS; c++)
            m = fmax(m, x[r * COLS + c]);
        for (int c = 0; c < COLS; c++)
            sum += exp(x[r * COLS + c] - m);
        for (int c = 0; c < COLS; c++)
            want[r * COLS + c] = exp(x[r * COLS + c] - m) / sum;
    }
    cl_mem bi = tu_buffer(ctx, sizeof x, x), bo = tu_buffer(ctx, sizeof y, NULL);
    const clattn_tensor ti = clattn_tensor_bhsd(bi, CLATTN_F32, 1, 1, ROWS, COLS);
    const clattn_tensor to = clattn_tensor_bhsd(bo, CLATTN_F32, 1, 1, ROWS, COLS);
    clattn_softmax_desc sd = {1, 1, ROWS, COLS, 0.0f, 0, NULL, NULL};
    const clattn_status st = clattn_softmax(ctx, &sd, &ti, &to, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_softmax: %s: %s", clattn_status_string(st), clattn_last_error(ctx));
    tu_read(ctx, bo, sizeof y, y);
    clReleaseMemObject(bi);
    clReleaseMemObject(bo);
    for (int i = 0; i < ROWS * COLS; i++)
        got[i] = y[i];
    tu_assert_allclose("softmax", got, want, ROWS * COLS, 1e-6, 1e-5);
}

static void test_user_file_trust(void **state)
{
    const trust_row *r = *state;
    if (r->needs_root && geteuid() != 0) {
        print_message("skipping %s: needs root to make a file or directory another user owns "
                      "(running as uid %ld)\n",
                      r->name, (long)geteuid());
        skip();
    }
    make_dir();
    assert_int_equal(chmod(dir, 0700), 0);
    unsetenv("CLATTN_PARAMS_FUSED");
    clattn_context *ctx = tu_context();
    char path[4200], text[1200], target[400], other[200];
    path_of(ctx, path, sizeof path);
    const char *name = strrchr(path, '/') + 1;
    /* The file test_lookup_order shows is used when it may be. */
    snprintf(text, sizeof text, "clattn-tuning 1\ndevice %s\ndriver %s\nfused f32 64 none >128 10 = 2,4,8,1,8,0\n",
             ctx->dev.key, ctx->dev.driver);
    snprintf(other, sizeof other, "%s-other", dir);
    snprintf(replaced_old, sizeof replaced_old, "%s-old", dir);
    snprintf(replaced_new, sizeof replaced_new, "%s-new", dir);
    remove_path(other);
    remove_path(replaced_old);
    remove_path(replaced_new);
    if (r->kind != TU_TRUST_SYMLINK_OTHER_FILE && r->kind != TU_TRUST_DIR_REPLACED) {
        write_file(path, text, strlen(text));
        assert_int_equal(chmod(path, 0644), 0);
    }
    switch (r->kind) {
    default:
        assert_true(tu_trust_stage(r->kind, dir, path));
        break;
    case TU_TRUST_SYMLINK_OTHER_FILE:
        assert_int_equal(mkdir(other, 0755), 0);
        snprintf(target, sizeof target, "%s/%s", other, name);
        write_file(target, text, strlen(text));
        tu_trust_link(target, path);
        break;
    case TU_TRUST_DIR_REPLACED:
        assert_int_equal(mkdir(replaced_new, 0700), 0);
        assert_int_equal(chmod(replaced_new, 0777), 0);
        snprintf(target, sizeof target, "%s/%s", replaced_new, name);
        write_file(target, text, strlen(text));
        assert_int_equal(chmod(target, 0644), 0);
        replaced = 0;
        clattn__entry_dir_hook = replace_dir_hook;
        break;
    }
    const clattn_status st = clattn_reload_tuning(ctx);
    clattn__entry_dir_hook = NULL;
    assert_int_equal(st, CLATTN_SUCCESS);
    const char *rep = clattn_tuning_report(ctx);
    print_message("report: %s\n", rep);
    const clattn_kernel_params kp = get(ctx, CLATTN_OPERATION_FUSED);
    if (r->why == NULL) {
        if (!strstr(rep, "1 entries") || strstr(rep, "ignored"))
            fail_msg("report \"%s\": the file is not used", rep);
        assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    } else if (r->kind == TU_TRUST_DIR_REPLACED) {
        /* Read through the directory opened, which has no file: the replacement's is never
         * looked at. Reloaded, the replacement is opened from the start, and not trusted. */
        assert_int_equal(replaced, 1);
        if (!strstr(rep, "no user tuning file") || strstr(rep, "1 entries"))
            fail_msg("report \"%s\": the replacement's file was read", rep);
        assert_int_not_equal(kp.source, CLATTN_SOURCE_USER_FILE);
        assert_int_equal(clattn_reload_tuning(ctx), CLATTN_SUCCESS);
        rep = clattn_tuning_report(ctx);
        print_message("reloaded: %s\n", rep);
    }
    if (r->why != NULL) {
        if (!strstr(rep, "ignored user tuning file") || !strstr(rep, "not trusted: ") || !strstr(rep, r->why))
            fail_msg("report \"%s\" lacks \"ignored user tuning file\", \"not trusted: \" or \"%s\"", rep, r->why);
        assert_int_not_equal(get(ctx, CLATTN_OPERATION_FUSED).source, CLATTN_SOURCE_USER_FILE);
    }
    check_softmax_correct(ctx);
    clattn_release(ctx);
    /* A new context says the same, and is created normally. */
    ctx = tu_context();
    if (r->why != NULL && !strstr(clattn_tuning_report(ctx), r->why))
        fail_msg("a new context's report \"%s\" lacks \"%s\"", clattn_tuning_report(ctx), r->why);
    clattn_release(ctx);
    if (r->kind == TU_TRUST_SYMLINK_OTHER_FILE) {
        struct stat lst;
        assert_int_equal(lstat(path, &lst), 0);
        assert_true(S_ISLNK(lst.st_mode));
    }
    remove_path(other);
    remove_path(replaced_old);
    remove_path(replaced_new);
}

/* The store is written 0600 and the directories made for it 0700 whatever the umask, and only
 * into a directory the library would read it back from. */
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

static void expect_mode(const char *path, int is_dir, unsigned want)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        fail_msg("lstat %s failed", path);
    if ((is_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) || (st.st_mode & 07777) != want ||
        st.st_uid != geteuid())
        fail_msg("%s: mode %o, uid %ld; want a %s of mode %o owned by uid %ld", path, (unsigned)st.st_mode,
                 (long)st.st_uid, is_dir ? "directory" : "regular file", want, (long)geteuid());
}

static void test_written_modes(void **state)
{
    const mode_row *r = *state;
    make_dir();
    char made[200], tdir[240], path[4200], err[512] = "";
    snprintf(made, sizeof made, "%s/made", dir);
    snprintf(tdir, sizeof tdir, "%s/made/tuning", dir);
    setenv("CLATTN_TUNING_DIR", tdir, 1);
    clattn_context *ctx = tu_context();
    path_of(ctx, path, sizeof path);
    clattn_tuning_table tab;
    memset(&tab, 0, sizeof tab);
    snprintf(tab.device, sizeof tab.device, "%s", ctx->dev.key);
    snprintf(tab.driver, sizeof tab.driver, "%s", ctx->dev.driver);
    const clattn_tuning_entry e = {CLATTN_OP_FUSED, 0, 64, 0, 3, 10, 6, {2, 4, 8, 1, 8, 0}};
    assert_int_equal(clattn__tuning_put(&tab, &e), 0);
    const mode_t saved = umask((mode_t)r->umask);
    const int made_ok = clattn__make_dirs(tdir);
    const int wrote = clattn__tuning_write(path, &tab, err, sizeof err);
    umask(saved);
    clattn__tuning_free(&tab);
    assert_int_equal(made_ok, 0);
    if (wrote != 0)
        fail_msg("clattn__tuning_write: %s", err);
    expect_mode(made, 1, 0700);
    expect_mode(tdir, 1, 0700);
    expect_mode(path, 0, 0600);
    /* Read back (clattn_reload_tuning reads CLATTN_TUNING_DIR again): used. */
    assert_int_equal(clattn_reload_tuning(ctx), CLATTN_SUCCESS);
    if (!strstr(clattn_tuning_report(ctx), "1 entries"))
        fail_msg("report \"%s\": the store written is not used", clattn_tuning_report(ctx));
    clattn_release(ctx);
    setenv("CLATTN_TUNING_DIR", dir, 1);
}

/* Into a directory that group or others can write, nothing is written (the library would not
 * read it back): the writer fails, naming why, and leaves no file. */
static void test_write_untrusted_dir(void **state)
{
    (void)state;
    make_dir();
    assert_int_equal(chmod(dir, 0777), 0);
    char path[200], err[512] = "";
    snprintf(path, sizeof path, "%s/0123456789abcdef.tuning", dir);
    clattn_tuning_table tab;
    memset(&tab, 0, sizeof tab);
    snprintf(tab.device, sizeof tab.device, "0000:some_device:1:1");
    const int rc = clattn__tuning_write(path, &tab, err, sizeof err);
    clattn__tuning_free(&tab);
    print_message("%s\n", err);
    assert_int_equal(rc, -1);
    if (!strstr(err, path) || !strstr(err, "not trusted") || !strstr(err, "writable by group or others"))
        fail_msg("message \"%s\" does not say why %s was not written", err, path);
    assert_int_not_equal(access(path, F_OK), 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", dir);
    assert_int_equal(system(cmd), 0); /* no temporary file either */
}

/* A successful clattn_tuning_path clears the message an earlier failure left, as every call does. */
static void test_tuning_path_clears_error(void **state)
{
    (void)state;
    make_dir();
    clattn_context *ctx = tu_context();
    assert_int_equal(clattn_set_params(ctx, (clattn_operation)99, NULL, 0), CLATTN_INVALID_ARGUMENT);
    assert_string_not_equal(clattn_last_error(ctx), "");
    char path[4200];
    path_of(ctx, path, sizeof path);
    assert_string_equal(clattn_last_error(ctx), "");
    assert_int_equal(clattn_last_cl_error(ctx), CL_SUCCESS);
    clattn_release(ctx);
}

static void test_set_params_errors(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    const int v[9] = {1, 1, 6, 4, 16, 16, 1, 1, 1};
    assert_int_equal(clattn_set_params(NULL, CLATTN_OPERATION_SCORES, v, 9), CLATTN_INVALID_ARGUMENT);
    assert_int_equal(clattn_set_params(ctx, (clattn_operation)99, v, 9), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "op"));
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_SCORES, v, 8), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "count"));
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_SCORES, NULL, 9), CLATTN_INVALID_ARGUMENT);
    const int neg[9] = {1, 1, -6, 4, 16, 16, 1, 1, 1};
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_SCORES, neg, 9), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "RM"));
    /* A choice past its largest value (scores' DIRECT is 0 or 1, decode's 0 to 6) is refused; a
     * size is a hint the op fits, taken up to 4096. */
    const int direct2[9] = {1, 1, 6, 4, 16, 16, 1, 1, 2};
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_SCORES, direct2, 9), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "DIRECT"));
    const int dec7[7] = {1, 1, 0, 4, 16, 0, 7}, dec5[7] = {1, 1, 0, 4, 16, 0, 5};
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_DECODE, dec7, 7), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "not in [0, 6]"));
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_DECODE, dec5, 7), CLATTN_SUCCESS);
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_DECODE, NULL, 0), CLATTN_SUCCESS);
    assert_int_equal(clattn_param_max(CLATTN_OPERATION_DECODE, 6), 6);
    assert_int_equal(clattn_param_max(CLATTN_OPERATION_SCORES, 6), 1); /* KF */
    assert_int_equal(clattn_param_max(CLATTN_OPERATION_PV, 8), 1);     /* P·V: gemm or pv_direct */
    assert_int_equal(clattn_param_max(CLATTN_OPERATION_PV, 7), 0);     /* KT is the scores' */
    assert_int_equal(clattn_param_max(CLATTN_OPERATION_FUSED, 2), 4096);
    assert_int_equal(clattn_param_max(CLATTN_OPERATION_FUSED, 6), -1);
    assert_int_equal(clattn_param_max((clattn_operation)99, 0), -1);
    clattn_kernel_params kp;
    assert_int_equal(clattn_get_params(ctx, NULL, &kp), CLATTN_INVALID_ARGUMENT);
    clattn_problem_class pc = {CLATTN_OPERATION_SCORES, (clattn_dtype)7, 64, 1, 1, 0, 0};
    assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_INVALID_ARGUMENT);
    assert_int_equal(clattn_get_params(NULL, &pc, &kp), CLATTN_INVALID_ARGUMENT);
    assert_int_equal(clattn_get_params(ctx, &pc, NULL), CLATTN_INVALID_ARGUMENT);
    clattn_problem_class neg_hd = {CLATTN_OPERATION_FUSED, CLATTN_F32, -1, 1, 1, 0, 0};
    assert_int_equal(clattn_get_params(ctx, &neg_hd, &kp), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "head_dim"));
    clattn_problem_class big_hd = {CLATTN_OPERATION_FUSED, CLATTN_F32, CLATTN_MAX_HEAD_DIM + 1, 1, 1, 0, 0};
    assert_int_equal(clattn_get_params(ctx, &big_hd, &kp), CLATTN_INVALID_ARGUMENT);
    assert_int_equal(clattn_reload_tuning(NULL), CLATTN_INVALID_ARGUMENT);
    assert_string_equal(clattn_tuning_report(NULL), "");
    char path[64];
    assert_int_equal(clattn_tuning_path(NULL, path, sizeof path), CLATTN_INVALID_ARGUMENT);
    assert_int_equal(clattn_tuning_path(ctx, NULL, 10), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "buf is NULL")); /* on ctx, not elsewhere */
    assert_int_equal(clattn_tuning_path(ctx, path, 0), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "size 0"));
    char tiny[4] = "abc";
    assert_int_equal(clattn_tuning_path(ctx, tiny, sizeof tiny), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "too small"));
    assert_string_equal(tiny, "abc"); /* untouched on failure */
    assert_int_equal(clattn_param_count((clattn_operation)-1), 0);
    assert_null(clattn_param_name(CLATTN_OPERATION_FUSED, -1));
    assert_string_equal(clattn_params_source_name((clattn_params_source)42), "?");
    assert_int_equal(clattn_param_count(CLATTN_OPERATION_SOFTMAX), 2);
    assert_string_equal(clattn_param_name(CLATTN_OPERATION_SOFTMAX, 1), "ROWS");
    assert_null(clattn_param_name(CLATTN_OPERATION_SOFTMAX, 2));
    assert_null(clattn_operation_name(CLATTN_OPERATION_COUNT));
}

/* A small f32 attention (B 1, H 2, seq_q = seq_kv = S, head_dim D) with random inputs, its
 * float64 reference and a descriptor for algo. */
typedef struct small_attn {
    size_t n;
    float *q, *k, *v, *o;
    double *want;
    clattn_attention_desc desc;
} small_attn;

static small_attn small_attn_make(int S, int D, int causal, clattn_algorithm algo, uint64_t seed)
{
    small_attn a;
    const int B = 1, H = 2;
    a.n = (size_t)B * H * S * D;
    a.q = tu_xalloc(a.n * 4);
    a.k = tu_xalloc(a.n * 4);
    a.v = tu_xalloc(a.n * 4);
    a.o = tu_xalloc(a.n * 4);
    double *qd = tu_xdoubles(a.n), *kd = tu_xdoubles(a.n), *vd = tu_xdoubles(a.n);
    a.want = tu_xdoubles(a.n);
    tu_rng rng;
    tu_seed(&rng, seed);
    tu_fill(&rng, CLATTN_F32, a.q, qd, a.n, -1, 1);
    tu_fill(&rng, CLATTN_F32, a.k, kd, a.n, -1, 1);
    tu_fill(&rng, CLATTN_F32, a.v, vd, a.n, -1, 1);
    ref_attn ra;
    memset(&ra, 0, sizeof ra);
    ra.batch = B;
    ra.heads_q = ra.heads_kv = H;
    ra.seq_q = ra.seq_kv = S;
    ra.head_dim = D;
    ra.causal = causal;
    ref_attention(&ra, qd, kd, vd, a.want, NULL, NULL);
    memset(&a.desc, 0, sizeof a.desc);
    a.desc.batch = B;
    a.desc.heads_q = a.desc.heads_kv = H;
    a.desc.seq_q = a.desc.seq_kv = S;
    a.desc.head_dim = D;
    a.desc.causal = causal;
    a.desc.algorithm = algo;
    return a;
}

/* Runs a on ctx; the largest absolute error against the reference (NaN counts as infinite), and
 * with check set, an allclose failure named what. */
static double small_attn_run(clattn_context *ctx, const small_attn *a, int check, const char *what)
{
    assert_int_equal(clattn_attention_host(ctx, &a->desc, CLATTN_F32, a->q, a->k, a->v, a->o, NULL),
                     CLATTN_SUCCESS);
    double *got = tu_xdoubles(a->n), err = 0;
    for (size_t i = 0; i < a->n; i++) {
        got[i] = a->o[i];
        const double e = fabs(got[i] - a->want[i]);
        if (!(e <= err))
            err = isnan(e) ? INFINITY : e;
    }
    if (check)
        tu_assert_allclose(what, got, a->want, a->n, 1e-5, 1e-4);
    return err;
}

/* An override that the device cannot run as given (huge work-group, huge tiles) is clamped, and
 * the result still matches the reference: overrides change speed, never answers. */
static void test_override_computes(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    const small_attn a = small_attn_make(37, 24, 1, CLATTN_ALGORITHM_FUSED, 11);
    /* Tiled (DIRECT 0) and direct (DIRECT 1) kernels, each with extreme and odd values. */
    const int ovs[6][6] = {{4096, 4096, 64, 2, 16, 0}, {1, 1, 1, 1, 4, 0}, {3, 5, 7, 2, 8, 0},
                           {1, 1, 4096, 4096, 4, 1},   {1, 1, 1, 1, 4, 1}, {1, 1, 3, 3, 8, 1}};
    for (int t = 0; t < 6; t++) {
        assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_FUSED, ovs[t], 6), CLATTN_SUCCESS);
        small_attn_run(ctx, &a, 1, "fused with override");
    }
    assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_FUSED, NULL, 0), CLATTN_SUCCESS);
}

/* clattn-tune end to end on a tiny problem: it writes a store this device accepts, every entry is
 * at least as fast as the defaults by its own report, a wrong candidate is never chosen, and the
 * merge task writes the bucket clattn_merge reads. */
#ifdef CLATTN_TUNE_PATH
static int run_tuner(const char *extra)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s --dir %s --budget 8 --iters 2 --seed 3 --shape 1,2,2,64,64,16 --ops scores,softmax %s "
             ">%s/report.json 2>%s/tune.log",
             CLATTN_TUNE_PATH, dir, extra, dir, dir);
    return system(cmd);
}

static void read_report(char *buf, size_t size) { read_text("report.json", buf, size); }

/* The report's task object (up to its closing brace) that starts with `head`, copied into obj;
 * the test fails without one. */
static void report_task(const char *report, const char *head, char *obj, size_t size)
{
    const char *t = strstr(report, head);
    if (!t)
        fail_msg("no task %s in the report:\n%s", head, report);
    const size_t n = strcspn(t, "}");
    assert_true(t[n] == '}' && n < size);
    memcpy(obj, t, n);
    obj[n] = '\0';
}

/* clattn-tune with args, --dir and a JSON report into report.json; the test fails with its log
 * unless it succeeds. */
static void tune_ok(const char *args)
{
    char cmd[4400], log[8192];
    snprintf(cmd, sizeof cmd, "%s --dir %s %s --json >%s/report.json 2>%s/tune.log", CLATTN_TUNE_PATH, dir, args,
             dir, dir);
    if (system(cmd) != 0) {
        read_text("tune.log", log, sizeof log);
        fail_msg("clattn-tune %s failed:\n%s", args, log);
    }
}

/* clattn-tune with args (a dry run) exits 1 and says want. */
static void tune_refused(const char *args, const char *want)
{
    char cmd[4400], log[8192];
    snprintf(cmd, sizeof cmd, "%s --dir %s %s --dry-run >/dev/null 2>%s/tune.log", CLATTN_TUNE_PATH, dir, args,
             dir);
    const int rc = system(cmd);
    assert_true(WIFEXITED(rc) && WEXITSTATUS(rc) == 1);
    read_text("tune.log", log, sizeof log);
    if (!strstr(log, want))
        fail_msg("%s: %s", args, log);
}
#endif

static void test_tuner(void **state)
{
    (void)state;
#ifndef CLATTN_TUNE_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    assert_int_equal(run_tuner("--json"), 0);
    clattn_context *ctx = tu_context();
    assert_non_null(strstr(clattn_tuning_report(ctx), "user tuning file"));
    assert_null(strstr(clattn_tuning_report(ctx), "ignored"));
    clattn_problem_class pc = {CLATTN_OPERATION_SCORES, CLATTN_F32, 16, 64, 64, 0, 0};
    clattn_kernel_params kp;
    assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    clattn_release(ctx);
    char buf[8192];
    read_report(buf, sizeof buf);
    assert_non_null(strstr(buf, "\"op\": \"scores\""));
    for (const char *p = strstr(buf, "\"speedup\": "); p; p = strstr(p + 1, "\"speedup\": "))
        assert_true(atof(p + 11) >= 1.0);

    /* merge on a decode shape (5 candidates, a few seconds): added to the same store, and the
     * library's merge lookup (src/merge.c: f32, head_dim 0, seq 1) now comes from it. */
    char cmd[4400];
    snprintf(cmd, sizeof cmd,
             "%s --dir %s --budget 3 --iters 2 --seed 3 --shape 1,2,2,1,64,16 --ops merge --json "
             ">%s/report.json 2>%s/tune.log",
             CLATTN_TUNE_PATH, dir, dir, dir);
    assert_int_equal(system(cmd), 0);
    read_report(buf, sizeof buf);
    const char *mt = strstr(buf, "\"op\": \"merge\"");
    assert_non_null(mt);
    const char *sp = strstr(mt, "\"speedup\": "), *wr = strstr(mt, "\"wrong\": "),
               *mp = strstr(mt, "\"params\": [");
    assert_true(sp && wr && mp && strstr(mt, "\"parts\": 4"));
    assert_true(atof(sp + 11) >= 1.0);
    assert_int_equal(atoi(wr + 9), 0);
    const int merge_wg = atoi(mp + 11);
    ctx = tu_context();
    assert_null(strstr(clattn_tuning_report(ctx), "ignored"));
    const clattn_problem_class mpc = {CLATTN_OPERATION_MERGE, CLATTN_F32, 0, 1, 1, 0, 0};
    assert_int_equal(clattn_get_params(ctx, &mpc, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    assert_int_equal(kp.values[0], merge_wg);
    /* merge runs that entry whatever its sizes and the parts' types; it has no masked class */
    const clattn_problem_class mpc_big = {CLATTN_OPERATION_MERGE, CLATTN_F16, 0, 4096, 65536, 0, 0};
    assert_int_equal(clattn_get_params(ctx, &mpc_big, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    assert_int_equal(kp.values[0], merge_wg);
    const clattn_problem_class mpc_causal = {CLATTN_OPERATION_MERGE, CLATTN_F32, 0, 1, 1, 1, 0};
    assert_int_equal(clattn_get_params(ctx, &mpc_causal, &kp), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "no causal or masked"));
    const clattn_problem_class spc_dim = {CLATTN_OPERATION_SOFTMAX, CLATTN_F32, 64, 16, 16, 0, 0};
    assert_int_equal(clattn_get_params(ctx, &spc_dim, &kp), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "head_dim must be 0"));
    assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE); /* the scores entry is kept */

    /* The same store as if written under another driver: tuning merge again keeps the merge entry
     * it writes and drops the scores entry, which stamped with this driver would pass as
     * re-checked. */
    char upath[4200];
    path_of(ctx, upath, sizeof upath);
    clattn_release(ctx);
    snprintf(cmd, sizeof cmd, "sed -i 's/^driver .*/driver 0.0-old/' %s", upath);
    assert_int_equal(system(cmd), 0);
    ctx = tu_context();
    assert_non_null(strstr(clattn_tuning_report(ctx), "differs from the driver in use"));
    clattn_release(ctx);
    snprintf(cmd, sizeof cmd,
             "%s --dir %s --budget 3 --iters 2 --seed 3 --shape 1,2,2,1,64,16 --ops merge "
             ">%s/report.json 2>%s/tune.log",
             CLATTN_TUNE_PATH, dir, dir, dir);
    assert_int_equal(system(cmd), 0);
    read_text("tune.log", buf, sizeof buf);
    /* the scores, softmax and merge entries */
    if (!strstr(buf, "dropping the 3 earlier entries") || !strstr(buf, "0.0-old"))
        fail_msg("clattn-tune did not say it dropped the other driver's entries:\n%s", buf);
    ctx = tu_context();
    assert_null(strstr(clattn_tuning_report(ctx), "differs from the driver in use"));
    assert_int_equal(clattn_get_params(ctx, &mpc, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
    assert_int_not_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    clattn_release(ctx);

    /* Poison: kernels (CLATTN_KERNEL_DIR) whose QKᵀ (MODE 0) products are doubled unless the tile
     * defines (WGX, WGY, RM, NS, TK, VW) are the defaults' values (doubled, not shifted: softmax
     * would hide a shift). Poisoning all six, not one, makes the search meet the poison on its
     * first candidate whatever the budget allows (a cold kernel cache leaves time for two).
     * Candidates that compile with the same six defines (the tiled kernel with a 1x1 work-group,
     * as a CI machine chose) are right and may be chosen, so the check on the choice is the one
     * that matters to users: it computes the right answer with these kernels. */
    make_dir();
    ctx = tu_context(); /* the defaults on this device, from an empty tuning directory */
    clattn_kernel_params dk;
    assert_int_equal(clattn_get_params(ctx, &pc, &dk), CLATTN_SUCCESS);
    const int *d6 = dk.values;
    /* The kernel is built with the defaults' register tile as fitted to the vector registers
     * (scores_direct: src/scores.c), which on AVX2 is not the tile the defaults name. DIRECT
     * tells the tiled GEMM (DIRECT 0) from scores_direct where the other defines agree (RM 6,
     * NS 1 is a tiled candidate too). */
    int f6[CLATTN_MAX_KERNEL_PARAMS];
    memcpy(f6, d6, sizeof f6);
    clattn__fit_gemm_tile(ctx, CLATTN_OP_SCORES, f6);
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/cl && cp %s/cl/*.cl %s/cl/ && { printf '#if defined(RM) && MODE == 0 && "
             "(WGX != %d || WGY != %d || RM != %d || NS != %d || TK != %d || VW != %d || DIRECT != %d)\\n"
             "#undef MAD\\n"
             "#define MAD(a, b, c) ((a) * (b) * 2.0f + (c))\\n#endif\\n'; cat %s/cl/gemm_common.cl; } "
             "> %s/cl/gemm.tmp && mv %s/cl/gemm.tmp %s/cl/gemm_common.cl",
             dir, CLATTN_SOURCE_DIR, dir, f6[0], f6[1], f6[2], f6[3], f6[4], f6[5], f6[8], CLATTN_SOURCE_DIR,
             dir, dir, dir);
    assert_int_equal(system(cmd), 0);
    char kdir[200];
    snprintf(kdir, sizeof kdir, "%s/cl", dir);
    setenv("CLATTN_KERNEL_DIR", kdir, 1);
    const int rc = run_tuner("--json");
    read_report(buf, sizeof buf);
    const char *sc = strstr(buf, "\"op\": \"scores\"");
    const char *wrong = sc ? strstr(sc, "\"wrong\": ") : NULL;
    /* Unfused attention on the tuned shape with the poisoned kernels: with the defaults it must be
     * right, with RM moved it must be wrong (the poison works), and with the store the tuner
     * wrote (its scores entry) right again. */
    clattn_release(ctx);
    const small_attn a = small_attn_make(64, 16, 0, CLATTN_ALGORITHM_UNFUSED, 5); /* the tuned shape */
    ctx = tu_context(); /* the poisoned kernels (read at build time) and the tuner's store */
    assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    int moved[CLATTN_MAX_KERNEL_PARAMS];
    memcpy(moved, d6, sizeof moved);
    moved[2] = moved[2] == 4 ? 2 : 4; /* RM off the defaults */
    const int *runs[3] = {d6, moved, NULL}; /* NULL: no override, the store's entry */
    static const char *const what[3] = {"poisoned kernels, defaults", "", "poisoned kernels, tuned choice"};
    double err[3];
    for (int t = 0; t < 3; t++) {
        assert_int_equal(clattn_set_params(ctx, CLATTN_OPERATION_SCORES, runs[t], runs[t] ? dk.count : 0),
                         CLATTN_SUCCESS);
        err[t] = small_attn_run(ctx, &a, t != 1, what[t]);
    }
    unsetenv("CLATTN_KERNEL_DIR");
    assert_true(err[1] > 1e-2); /* RM moved: the poison is active */
    clattn_release(ctx);
    assert_int_equal(rc, 0);
    assert_non_null(wrong);
    assert_true(atoi(wrong + 9) > 0); /* the poison was met and rejected */
#endif
}

/* Decode tuning where the defaults win (--candidates 0: they alone are timed) writes no entry and
 * drops the earlier entry of its bucket, since the defaults depend on the query rows per kv head,
 * which a bucket does not hold (on GPUs: decode_lanes or the tiled kernel, src/defaults.c); the
 * store's other entries, the decode one of another bucket included, stay. */
static void test_tuner_decode_no_entry(void **state)
{
    (void)state;
#ifndef CLATTN_TUNE_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    clattn_context *ctx = tu_context();
    char path[4200], text[1200];
    path_of(ctx, path, sizeof path);
    /* The tuned shape's bucket (seq_q 4: "<=16", log2 seq_kv 8), another decode bucket and a
     * scores entry. */
    snprintf(text, sizeof text,
             "clattn-tuning 1\ndevice %s\ndriver %s\ndecode f32 64 none <=16 8 = 1,1,2,4,16,0,1\n"
             "decode f32 64 none 1 8 = 1,1,2,4,16,0,1\nscores f32 16 none <=128 6 = 1,1,6,4,16,16,1,1,1\n",
             ctx->dev.key, ctx->dev.driver);
    write_file(path, text, strlen(text));
    clattn_release(ctx);
    const clattn_problem_class dq4 = {CLATTN_OPERATION_DECODE, CLATTN_F32, 64, 4, 256, 0, 0},
                               dq1 = {CLATTN_OPERATION_DECODE, CLATTN_F32, 64, 1, 256, 0, 0},
                               sc = {CLATTN_OPERATION_SCORES, CLATTN_F32, 16, 64, 64, 0, 0};
    char cmd[4400];
    snprintf(cmd, sizeof cmd,
             "%s --dir %s --candidates 0 --iters 1 --shape 1,4,1,4,256,64 --ops decode --json "
             ">%s/report.json 2>%s/tune.log",
             CLATTN_TUNE_PATH, dir, dir, dir);
    assert_int_equal(system(cmd), 0);
    char buf[8192];
    read_report(buf, sizeof buf);
    const char *dt = strstr(buf, "\"op\": \"decode\"");
    assert_non_null(dt);
    assert_non_null(strstr(dt, "\"tried\": 0,"));
    assert_non_null(strstr(dt, "\"entry\": false"));
    read_text("tune.log", buf, sizeof buf);
    if (!strstr(buf, "no entry") || !strstr(buf, "dropping the earlier decode entry"))
        fail_msg("clattn-tune did not say it writes no decode entry and drops the old one:\n%s", buf);
    ctx = tu_context();
    assert_null(strstr(clattn_tuning_report(ctx), "ignored"));
    clattn_kernel_params kp;
    assert_int_equal(clattn_get_params(ctx, &dq4, &kp), CLATTN_SUCCESS);
    assert_int_not_equal(kp.source, CLATTN_SOURCE_USER_FILE); /* dropped: the defaults again */
    assert_int_equal(clattn_get_params(ctx, &dq1, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    assert_int_equal(kp.values[2], 2);
    assert_int_equal(clattn_get_params(ctx, &sc, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.source, CLATTN_SOURCE_USER_FILE);
    clattn_release(ctx);
#endif
}

/* --dtype: f16 and bf16 tasks run on inputs (and outputs, but for scores) of that type, checked
 * against the reference within the output type's rounding (the defaults' results, or the tuner
 * exits), and write entries of their own dtype, which the library's lookups of that dtype take
 * and f32 lookups do not; the f32 softmax of the unfused path is added as a task of its own. A bad
 * list is refused, as is a bad --ops list. */
static void test_tuner_dtype(void **state)
{
    (void)state;
#ifndef CLATTN_TUNE_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    tune_ok("--candidates 0 --iters 1 --shape 1,2,2,64,64,16 --ops scores,softmax,fused --dtype f16,bf16");
    char buf[8192], obj[1024];
    read_report(buf, sizeof buf);
    static const char *const ops[3] = {"scores", "softmax", "fused"};
    static const char *const dts[2] = {"f16", "bf16"};
    for (int o = 0; o < 3; o++)
        for (int d = 0; d < 2; d++) {
            char head[64];
            snprintf(head, sizeof head, "{\"op\": \"%s\", \"dtype\": \"%s\"", ops[o], dts[d]);
            report_task(buf, head, obj, sizeof obj);
            assert_non_null(strstr(obj, "\"shape\": [1, 2, 2, 64, 64, 16], \"causal\": 0, \"kv_lengths\": 0,"));
            if (o == 1)
                assert_non_null(strstr(obj, "\"unfused_path\": false"));
        }
    /* f32: only the unfused path's softmax */
    report_task(buf, "{\"op\": \"softmax\", \"dtype\": \"f32\"", obj, sizeof obj);
    assert_non_null(strstr(obj, "\"unfused_path\": true"));
    const char *f32 = strstr(buf, "\"dtype\": \"f32\"");
    assert_null(strstr(f32 + 1, "\"dtype\": \"f32\""));
    clattn_context *ctx = tu_context();
    assert_null(strstr(clattn_tuning_report(ctx), "ignored"));
    const clattn_operation cops[3] = {CLATTN_OPERATION_SCORES, CLATTN_OPERATION_SOFTMAX, CLATTN_OPERATION_FUSED};
    const clattn_dtype cdts[3] = {CLATTN_F16, CLATTN_BF16, CLATTN_F32};
    for (int o = 0; o < 3; o++)
        for (int d = 0; d < 3; d++) {
            const clattn_problem_class pc = {cops[o], cdts[d], cops[o] == CLATTN_OPERATION_SOFTMAX ? 0 : 16,
                                             64, 64, 0, 0};
            clattn_kernel_params kp;
            assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
            const int tuned = cdts[d] != CLATTN_F32 || cops[o] == CLATTN_OPERATION_SOFTMAX;
            if ((kp.source == CLATTN_SOURCE_USER_FILE) != tuned)
                fail_msg("%s dtype %d: source %s (%s)", ops[o], (int)cdts[d],
                         clattn_params_source_name(kp.source), kp.origin);
        }
#ifdef CLATTN_INFO_PATH
    /* clattn-info shows them too: the f16 entry, and f32's defaults */
    const clattn_problem_class pc16 = {CLATTN_OPERATION_FUSED, CLATTN_F16, 16, 64, 64, 0, 0};
    const clattn_problem_class pc32 = {CLATTN_OPERATION_FUSED, CLATTN_F32, 16, 64, 64, 0, 0};
    const clattn_problem_class pcsm = {CLATTN_OPERATION_SOFTMAX, CLATTN_BF16, 0, 64, 64, 0, 0};
    info_shows_class(ctx, "fused,f16,16,64,64", "fused f16 d16 sq64 kv64", &pc16);
    info_shows_class(ctx, "fused,f32,16,64,64", "fused f32 d16 sq64 kv64", &pc32);
    info_shows_class(ctx, "softmax,bf16,0,64,64", "softmax bf16 rows 64 cols 64", &pcsm);
#endif
    clattn_release(ctx);
    /* and --ops, which took any list that contained a name ("fusedd": fused) */
    static const char *const bad[6] = {"--dtype f64", "--dtype f16,f16", "--dtype f16,",
                                       "--ops fusedd",  "--ops pv,pv",     "--ops scores,,pv"};
    for (int i = 0; i < 6; i++) {
        char want[16];
        snprintf(want, sizeof want, "bad %.*s", (int)strcspn(bad[i], " "), bad[i]);
        tune_refused(bad[i], want);
    }
#endif
}

/* --shape ...,kvlen: tasks pass per-batch key lengths, the sampled rows are checked with those
 * keys hidden (the defaults' results, or the tuner exits), and the entries are the masked
 * buckets', which masked lookups take and unmasked ones do not. Malformed flag lists are
 * refused. */
static void test_tuner_kvlen(void **state)
{
    (void)state;
#ifndef CLATTN_TUNE_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    tune_ok("--candidates 0 --iters 1 --shape 3,2,1,48,80,16,causal,kvlen --ops scores,fused");
    char buf[8192];
    read_report(buf, sizeof buf);
    static const char *const ops[2] = {"{\"op\": \"scores\"", "{\"op\": \"fused\""};
    char obj[1024];
    for (int o = 0; o < 2; o++) {
        report_task(buf, ops[o], obj, sizeof obj);
        assert_non_null(strstr(obj, "\"causal\": 1, \"kv_lengths\": 1,"));
    }
    clattn_context *ctx = tu_context();
    assert_null(strstr(clattn_tuning_report(ctx), "ignored"));
    const clattn_operation cops[2] = {CLATTN_OPERATION_SCORES, CLATTN_OPERATION_FUSED};
    for (int o = 0; o < 2; o++)
        for (int masked = 0; masked < 2; masked++) {
            const clattn_problem_class pc = {cops[o], CLATTN_F32, 16, 48, 80, 1, masked};
            clattn_kernel_params kp;
            assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
            if ((kp.source == CLATTN_SOURCE_USER_FILE) != masked)
                fail_msg("%s masked %d: source %s (%s)", ops[o], masked, clattn_params_source_name(kp.source),
                         kp.origin);
        }
#ifdef CLATTN_INFO_PATH
    /* clattn-info --class: the masked entry where a class is masked, the defaults where not */
    const clattn_problem_class masked = {CLATTN_OPERATION_FUSED, CLATTN_F32, 16, 48, 80, 1, 1};
    const clattn_problem_class unmasked = {CLATTN_OPERATION_FUSED, CLATTN_F32, 16, 48, 80, 1, 0};
    info_shows_class(ctx, "fused,f32,16,48,80,masked,causal", "fused f32 d16 sq48 kv80 causal masked", &masked);
    info_shows_class(ctx, "fused,f32,16,48,80,causal", "fused f32 d16 sq48 kv80 causal", &unmasked);
#endif
    clattn_release(ctx);
    static const char *const bad[4] = {"1,2,2,8,8,16,kvlen,kvlen", "1,2,2,8,8,16,kvlen,", "1,2,2,8,8,16,,causal",
                                       "1,2,2,8,8,16,causal,mask"};
    for (int i = 0; i < 4; i++) {
        char args[64];
        snprintf(args, sizeof args, "--shape %s", bad[i]);
        tune_refused(args, "bad --shape");
    }
#endif
}

#ifdef CLATTN_TUNE_PATH
/* A strict reader of JSON text, enough to tell whether a tool's report parses: each function takes
 * one item at *p, moves *p past it and returns 1, or returns 0 where the text is no JSON. */
static void json_blanks(const char **p)
{
    while (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r')
        (*p)++;
}

/* A string, its decoded bytes (UTF-8) into out (size bytes, cut there) unless out is NULL. Raw
 * control characters, unknown escapes and bytes that are not UTF-8 are refused. */
static int json_string_at(const char **p, char *out, size_t size)
{
    const unsigned char *s = (const unsigned char *)*p;
    size_t n = 0;
    if (*s++ != '"')
        return 0;
    for (;;) {
        unsigned cp = *s++;
        int more = 0; /* continuation bytes of a raw UTF-8 sequence */
        if (cp == '"')
            break;
        if (cp < 0x20) /* the terminator too: an unclosed string */
            return 0;
        if (cp >= 0x80) {
            more = cp >= 0xC2 && cp <= 0xDF ? 1 : cp >= 0xE0 && cp <= 0xEF ? 2 : cp >= 0xF0 && cp <= 0xF4 ? 3 : -1;
            for (int i = 0; i < more; i++)
                if (s[i] < 0x80 || s[i] > 0xBF)
                    return 0;
            if (more < 0)
                return 0;
        } else if (cp == '\\') {
            const char *const from = "\"\\/bfnrt", *const to = "\"\\/\b\f\n\r\t";
            const char *e = *s ? strchr(from, *s) : NULL;
            if (e) {
                cp = (unsigned char)to[e - from];
                s++;
            } else if (*s == 'u') {
                char hex[5] = {0}, *end = NULL;
                memcpy(hex, s + 1, strnlen((const char *)s + 1, 4));
                cp = (unsigned)strtoul(hex, &end, 16);
                if (strlen(hex) != 4 || *end || strspn(hex, "0123456789abcdefABCDEF") != 4 ||
                    (cp >= 0xD800 && cp <= 0xDFFF)) /* no surrogate pairs in these reports */
                    return 0;
                s += 5;
            } else {
                return 0;
            }
        }
        /* cp as UTF-8: a raw sequence as it is, an escape encoded */
        unsigned char u[4] = {(unsigned char)cp};
        size_t len = 1;
        if (more > 0) {
            memcpy(u + 1, s, (size_t)more);
            s += more;
            len += (size_t)more;
        } else if (cp >= 0x800) {
            u[0] = (unsigned char)(0xE0 | cp >> 12);
            u[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
            u[2] = (unsigned char)(0x80 | (cp & 0x3F));
            len = 3;
        } else if (cp >= 0x80) {
            u[0] = (unsigned char)(0xC0 | cp >> 6);
            u[1] = (unsigned char)(0x80 | (cp & 0x3F));
            len = 2;
        }
        for (size_t i = 0; i < len && out && n + 1 < size; i++)
            out[n++] = (char)u[i];
    }
    if (out && size)
        out[n] = '\0';
    *p = (const char *)s;
    return 1;
}

/* Any value, with the blanks around it. */
static int json_value_at(const char **p)
{
    json_blanks(p);
    const char *s = *p;
    if (*s == '{' || *s == '[') {
        const char close = *s == '{' ? '}' : ']';
        *p = s + 1;
        json_blanks(p);
        if (**p == close) {
            (*p)++;
        } else {
            for (;;) {
                if (close == '}') { /* "key": */
                    if (!json_string_at(p, NULL, 0))
                        return 0;
                    json_blanks(p);
                    if (*(*p)++ != ':')
                        return 0;
                }
                if (!json_value_at(p))
                    return 0;
                const char c = *(*p)++;
                if (c == close)
                    break;
                if (c != ',')
                    return 0;
                json_blanks(p);
            }
        }
    } else if (*s == '"') {
        if (!json_string_at(p, NULL, 0))
            return 0;
    } else if (!strncmp(s, "true", 4) || !strncmp(s, "null", 4)) {
        *p = s + 4;
    } else if (!strncmp(s, "false", 5)) {
        *p = s + 5;
    } else { /* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
        s += *s == '-';
        const size_t lead = strspn(s, "0123456789");
        if (lead == 0 || (lead > 1 && *s == '0'))
            return 0;
        s += lead;
        if (*s == '.') {
            const size_t frac = strspn(s + 1, "0123456789");
            if (frac == 0)
                return 0;
            s += 1 + frac;
        }
        if (*s == 'e' || *s == 'E') {
            s += 1 + (s[1] == '+' || s[1] == '-');
            const size_t exp = strspn(s, "0123456789");
            if (exp == 0)
                return 0;
            s += exp;
        }
        *p = s;
    }
    json_blanks(p);
    return 1;
}

/* 1 when text is one JSON object and nothing else. */
static int json_parses(const char *text)
{
    const char *p = text;
    json_blanks(&p);
    return *p == '{' && json_value_at(&p) && *p == '\0';
}

/* The decoded string value of the report's member "key" into out; the test fails without one. */
static void json_member(const char *report, const char *key, char *out, size_t size)
{
    char head[64];
    snprintf(head, sizeof head, "\"%s\": ", key);
    const char *p = strstr(report, head);
    if (!p)
        fail_msg("no \"%s\" in the report:\n%s", key, report);
    p += strlen(head);
    if (!json_string_at(&p, out, size))
        fail_msg("\"%s\" is no string in the report:\n%s", key, report);
}
#endif

/* clattn-tune --json escapes its strings: a tuning directory with a quote, a backslash, control
 * characters and a byte that is not UTF-8 (0xE9, a Latin-1 e acute) gives a report that parses
 * (the path and the device name went out raw, so a quote ended the string early), whose "store"
 * decodes to that path (the stray byte as U+FFFD) and names the file written there. */
static void test_tune_json_escape(void **state)
{
    (void)state;
#ifndef CLATTN_TUNE_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    clattn_context *ctx = tu_context(); /* skips (or fails, CLATTN_REQUIRE_DEVICE=1) without a device */
    char name[sizeof ctx->dev.name];
    snprintf(name, sizeof name, "%s", ctx->dev.name);
    clattn_release(ctx);
    char raw[200], want[220], cmd[1400], log[8192];
    static char report[1 << 14];
    snprintf(raw, sizeof raw, "%s/q\"b\\s\tt\001e\351", dir);
    snprintf(want, sizeof want, "%s/q\"b\\s\tt\001e\357\277\275/", dir);
    /* single-quoted for the shell, which keeps every byte but ' as it is */
    snprintf(cmd, sizeof cmd,
             "%s --dir '%s' --candidates 0 --iters 1 --shape 1,1,1,32,32,4 --ops softmax --json >%s/report.json "
             "2>%s/tune.log",
             CLATTN_TUNE_PATH, raw, dir, dir);
    if (system(cmd) != 0) {
        read_text("tune.log", log, sizeof log);
        fail_msg("clattn-tune failed:\n%s", log);
    }
    read_text("report.json", report, sizeof report);
    if (!json_parses(report))
        fail_msg("clattn-tune --json is no JSON object:\n%s", report);
    char store[400], device[sizeof name + 64], file[400];
    json_member(report, "store", store, sizeof store);
    json_member(report, "device", device, sizeof device);
    if (strncmp(store, want, strlen(want)) != 0 || strchr(store + strlen(want), '/'))
        fail_msg("\"store\": \"%s\", expected a file in \"%s\"", store, want);
    snprintf(file, sizeof file, "%s/%s", raw, store + strlen(want));
    if (access(file, R_OK) != 0 || !strstr(report, "\"written\": true"))
        fail_msg("no store %s written:\n%s", file, report);
    assert_string_equal(device, name);
#endif
}

/* clattn-tune with a tuning directory it cannot create (a path through a regular file, or the
 * file itself) stops at once, naming the directory, before it tunes anything: it used to find out
 * when it came to write the store, after its whole budget, and then never printed its --json
 * report. A dry run, which writes nothing, still tunes. */
/* clattn-tune with a CLATTN_PARAMS_<OP> set would time that list as the library's defaults and
 * could store it; under CLATTN_MATRIX=emulate it would store the emulation's timings: both refused
 * before any tuning, no store written; a dry run under emulation runs. */
static void test_tune_refused_env(void **state)
{
    (void)state;
#ifndef CLATTN_TUNE_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    clattn_release(tu_context()); /* skips (or fails, CLATTN_REQUIRE_DEVICE=1) without a device */
    static const char *const runs[4][3] = {
        {"CLATTN_PARAMS_FUSED=kernel=direct", "", "CLATTN_PARAMS_FUSED is set"},
        {"CLATTN_PARAMS_MERGE=16", "", "CLATTN_PARAMS_MERGE is set"},
        {"CLATTN_MATRIX=emulate", "", "CLATTN_MATRIX=emulate runs the emulated matrix kernel"},
        {"CLATTN_MATRIX=emulate", " --dry-run", NULL}};
    for (int i = 0; i < 4; i++) {
        char cmd[1400], log[8192], ls[4096];
        snprintf(cmd, sizeof cmd,
                 "env %s %s --dir %s/env --candidates 0 --iters 1 --shape 1,1,1,32,32,4 --ops softmax%s "
                 ">/dev/null 2>%s/tune.log",
                 runs[i][0], CLATTN_TUNE_PATH, dir, runs[i][1], dir);
        const int rc = system(cmd);
        read_text("tune.log", log, sizeof log);
        const int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
        if (runs[i][2] ? status != 1 || !strstr(log, runs[i][2]) || strstr(log, " ms  tuned ") : status != 0)
            fail_msg("%s clattn-tune%s: exit %d, want %s:\n%s", runs[i][0], runs[i][1], status,
                     runs[i][2] ? "1 and the reason before any tuning" : "0", log);
        snprintf(cmd, sizeof cmd, "ls %s/env/*.tuning 2>/dev/null >%s/ls.txt", dir, dir);
        if (system(cmd) == -1)
            fail_msg("ls failed");
        read_text("ls.txt", ls, sizeof ls);
        if (ls[0])
            fail_msg("%s clattn-tune%s wrote a store: %s", runs[i][0], runs[i][1], ls);
    }
#endif
}

static void test_tune_bad_dir(void **state)
{
    (void)state;
#ifndef CLATTN_TUNE_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    clattn_release(tu_context()); /* skips (or fails, CLATTN_REQUIRE_DEVICE=1) without a device */
    char file[200], bad[2][240], cmd[1400], log[8192];
    snprintf(file, sizeof file, "%s/file", dir);
    write_file(file, "x\n", 2);
    snprintf(bad[0], sizeof bad[0], "%s/sub", file);
    snprintf(bad[1], sizeof bad[1], "%s", file);
    for (int i = 0; i < 3; i++) {
        const int dry = i == 2; /* then bad[0] again */
        const char *const d = bad[dry ? 0 : i];
        snprintf(cmd, sizeof cmd,
                 "%s --dir %s --candidates 0 --iters 1 --shape 1,1,1,32,32,4 --ops softmax --json%s "
                 ">%s/report.json 2>%s/tune.log",
                 CLATTN_TUNE_PATH, d, dry ? " --dry-run" : "", dir, dir);
        const int rc = system(cmd);
        read_text("tune.log", log, sizeof log);
        const int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
        char want[sizeof bad + 32];
        snprintf(want, sizeof want, "tuning directory %s", d);
        /* " ms  tuned ": a task's line in the report that follows the search */
        if (dry ? status != 0 : status != 1 || !strstr(log, want) || strstr(log, " ms  tuned "))
            fail_msg("clattn-tune --dir %s%s: exit %d, want %s:\n%s", d, dry ? " --dry-run" : "", status,
                     dry ? "0" : "1 and a message naming it before any tuning", log);
    }
    /* An empty --dir (the library reads an empty CLATTN_TUNING_DIR as unset: the default store
     * was written instead) */
    snprintf(cmd, sizeof cmd, "%s --dir '' --shape 1,1,1,32,32,4 --ops softmax --dry-run >/dev/null 2>%s/tune.log",
             CLATTN_TUNE_PATH, dir);
    int rc = system(cmd);
    read_text("tune.log", log, sizeof log);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 1 || !strstr(log, "bad --dir ''"))
        fail_msg("clattn-tune --dir '': exit %d, want 1:\n%s", WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, log);
    /* A store there that the library does not read is not replaced by this run's entries alone
     * (its valid lines were lost): refused before any tuning, the file left as it was. */
    clattn_context *ctx = tu_context();
    char store[4200];
    assert_int_equal(clattn_tuning_path(ctx, store, sizeof store), CLATTN_SUCCESS);
    char text[600];
    const int n = snprintf(text, sizeof text, "clattn-tuning 2\ndevice %s\ndriver %s\nscores f32 16 none <=128 5 = "
                           "WGX=1,WGY=999999\n", ctx->dev.key, ctx->dev.driver);
    clattn_release(ctx);
    write_file(store, text, (size_t)n);
    snprintf(cmd, sizeof cmd,
             "%s --dir %s --candidates 0 --iters 1 --shape 1,1,1,32,32,4 --ops softmax >/dev/null 2>%s/tune.log",
             CLATTN_TUNE_PATH, dir, dir);
    rc = system(cmd);
    read_text("tune.log", log, sizeof log);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 1 || !strstr(log, "ignored user tuning file") ||
        !strstr(log, "dropping what it holds") || strstr(log, " ms  tuned "))
        fail_msg("clattn-tune over an unreadable store: exit %d, want 1 before any tuning:\n%s",
                 WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, log);
    char after[600];
    FILE *f = fopen(store, "rb");
    assert_non_null(f);
    const size_t got = fread(after, 1, sizeof after, f);
    fclose(f);
    if (got != (size_t)n || memcmp(after, text, (size_t)n) != 0)
        fail_msg("clattn-tune changed the unreadable store %s", store);
    /* an op named in --ops that no shape takes (decode: SQ <= 16) */
    tune_refused("--shape 1,2,2,32,32,16 --ops fused,decode", "--ops names decode, which no --shape takes");
#endif
}

/* clattn-tune's numbers are whole values in range: trailing text, values past the type's range,
 * nan, inf and negative ones are refused, naming the option and its value, before any device is
 * opened (a --device that matches none: what passes gets as far as that); a shape whose buffers'
 * sizes would overflow too, which on a 32-bit host is one of more than SIZE_MAX / 32 elements
 * (2^27: 4 merge parts of floats, or doubles). Good values at the ends of the ranges pass. */
static void test_tune_bad_numbers(void **state)
{
    (void)state;
#ifndef CLATTN_TUNE_PATH
    skip(); /* built without the tools */
#else
    make_dir();
    const char *const bad[][2] = {
        {"--iters 5x", "bad --iters 5x"},
        {"--iters 0", "bad --iters 0"},
        {"--iters 99999999999999999999", "bad --iters 99999999999999999999"},
        {"--budget 1e999", "bad --budget 1e999"},
        {"--budget nan", "bad --budget nan"},
        {"--budget inf", "bad --budget inf"},
        {"--budget -5", "bad --budget -5"},
        {"--budget 0x10", "bad --budget 0x10"},
        {"--budget 1e3", "bad --budget 1e3"},
        {"--budget 1.2.3", "bad --budget 1.2.3"},
        {"--budget 10s", "bad --budget 10s"},
        {"--budget 2e6", "bad --budget 2e6"},
        {"--seed 12abc", "bad --seed 12abc"},
        {"--seed -1", "bad --seed -1"},
        {"--seed 99999999999999999999", "bad --seed 99999999999999999999"},
        {"--candidates -1", "bad --candidates -1"},
        {"--bogus", "clattn-tune: unknown option '--bogus'"}, /* named first, before the usage */
        {"--budget 1 --budget 2", "--budget is given twice"},
        {"--device 0:0", "--device is given twice"},
        {"--shape 1,2,3,32,32,16", "HKV 3 does not divide H 2"},
        {"--shape 1,2,2,32,32,600", "D 600 is more than 512"},
        {"--shape 1,2,2", "fewer than six sizes"},
        {"--shape 1,2x,2,32,16,16", "H is not an integer"},
        {"--shape 1,2,2,32,16,16,causal", "causal with SQ 32 > SKV 16"},
        {"extra", "clattn-tune: unknown option 'extra'"},
        {"--shape 99999999999999999999,1,1,64,64,16", "bad --shape"},
        {"--shape 2147483647,2147483647,1,2147483647,2147483647,16", "bad --shape"},
        {sizeof(size_t) > 4 ? "--budget .5 --iters 64 --seed 18446744073709551615 --candidates 100000 "
                              "--shape 1,1,1,1,2147483647,1"
                            : "--budget .5 --iters 64 --seed 18446744073709551615 --candidates 100000 "
                              "--shape 1,1,1,1,134217727,1",
         "matches no OpenCL device"},
        /* just under and over the limit: 2^59 elements with 64 bits (SIZE_MAX / 32), 2^27 with 32 */
        {sizeof(size_t) > 4 ? "--shape 268435456,1,1,2147483647,1,1" : "--shape 1,1,1,1,134217727,1",
         "matches no OpenCL device"},
        {sizeof(size_t) > 4 ? "--shape 268435456,1,1,2147483647,2,1" : "--shape 1,1,1,1,134217728,1",
         "bad --shape"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[200];
        snprintf(args, sizeof args, "--device no-such-device-anywhere %s", bad[i][0]);
        tune_refused(args, bad[i][1]);
    }
#endif
}

/* Two tuners writing one store at once: the file ends valid and complete (one of the two). */
static void test_two_writers(void **state)
{
    (void)state;
    make_dir();
    clattn_context *ctx = tu_ctx_get();
    char path[4200];
    path_of(ctx, path, sizeof path);
    pid_t pids[2];
    for (int w = 0; w < 2; w++) {
        pids[w] = fork();
        assert_true(pids[w] >= 0);
        if (pids[w] == 0) {
            clattn_tuning_table t;
            memset(&t, 0, sizeof t);
            snprintf(t.device, sizeof t.device, "%s", ctx->dev.key);
            for (int i = 0; i < 200; i++) {
                clattn_tuning_entry e = {CLATTN_OP_MERGE, 0, -1, -1, -1, i % 40, 1, {16 + w}};
                clattn__tuning_put(&t, &e);
            }
            char err[300];
            for (int r = 0; r < 50; r++)
                if (clattn__tuning_write(path, &t, err, sizeof err) != 0)
                    _exit(1);
            _exit(0);
        }
    }
    for (int w = 0; w < 2; w++) {
        int status = 0;
        assert_int_equal(waitpid(pids[w], &status, 0), pids[w]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    assert_int_equal(clattn_reload_tuning(ctx), CLATTN_SUCCESS);
    assert_non_null(strstr(clattn_tuning_report(ctx), "40 entries"));
    /* No temporary file is left behind. */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp", dir);
    assert_int_not_equal(system(cmd), 0);
}

/* clattn__fit_fused_tile (src/scores.c) over every register count a CPU gets (SSE 4, AVX2 8,
 * AVX-512 32 float16 values), head_dim_v, RM and NS, out-of-range values included: what it
 * gives is a tile the kernel can build (1..32 rows, 1..4 chunks, never more than asked), fits the
 * registers (the score tile in three quarters of them, with its chunk vectors and a broadcast in
 * all but one; an untiled O in three quarters), and is a fixed point, since clattn-tune compares
 * candidates by their fitted form. Then the tiles the measurements chose (tuning.c). Needs no
 * device: the fit reads only the register count. */
static void test_fit_fused_tile(void **state)
{
    (void)state;
    clattn_context *ctx = calloc(1, sizeof *ctx);
    assert_non_null(ctx);
    static const int nregs[3] = {4, 8, 32};
    for (int k = 0; k < 3; k++) {
        const int n = nregs[k];
        ctx->dev.nreg16 = n;
        for (int dv = -1; dv <= 300; dv++)
            for (int rm0 = -2; rm0 <= 40; rm0++)
                for (int ns0 = -1; ns0 <= 6; ns0++) {
                    int rm = rm0, ns = ns0;
                    clattn__fit_fused_tile(ctx, dv, &rm, &ns);
                    const int dv16 = dv < 1 ? 1 : dv > 256 ? 16 : (dv + 15) / 16;
                    const int want_rm = rm0 < 1 ? 1 : rm0 > 32 ? 32 : rm0, want_ns = ns0 < 1 ? 1 : ns0 > 4 ? 4 : ns0;
                    if (rm < 1 || rm > want_rm || ns < 1 || ns > want_ns)
                        fail_msg("nreg16 %d dv %d RM %d NS %d: fitted to %d x %d", n, dv, rm0, ns0, rm, ns);
                    if ((rm * ns > 3 * n / 4 || ns * (rm + 1) > n - 1) && !(rm == 1 && ns == 1))
                        fail_msg("nreg16 %d dv %d RM %d NS %d: score tile %d x %d does not fit", n, dv, rm0,
                                 ns0, rm, ns);
                    if (rm * dv16 <= n && rm * dv16 > 3 * n / 4 && dv16 <= 3 * n / 4)
                        fail_msg("nreg16 %d dv %d RM %d NS %d: O of %d x %d vectors untiled past 3/4", n, dv,
                                 rm0, ns0, rm, dv16);
                    int rm2 = rm, ns2 = ns;
                    clattn__fit_fused_tile(ctx, dv, &rm2, &ns2);
                    if (rm2 != rm || ns2 != ns)
                        fail_msg("nreg16 %d dv %d: %d x %d refits to %d x %d", n, dv, rm, ns, rm2, ns2);
                }
    }
    /* The defaults RM 6, NS 4 (vendor defaults, CPUs): 6 x 64 with AVX-512, 4 rows at
     * head_dim_v 65..80 (O 5 vectors a row), 6 x 16 with AVX2; an explicit RM 8 at head_dim 64,
     * whose O would take all 32 registers, 6 rows. {nreg16, dv, RM, NS, fitted RM, NS} */
    static const int cases[][6] = {{32, 64, 6, 4, 6, 4},  {32, 80, 6, 4, 4, 4}, {32, 65, 6, 4, 4, 4},
                                   {32, 128, 6, 4, 6, 4}, {32, 48, 6, 4, 6, 4}, {8, 64, 6, 4, 6, 1},
                                   {8, 16, 6, 4, 6, 1},   {32, 64, 8, 2, 6, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int *t = cases[c];
        ctx->dev.nreg16 = t[0];
        int rm = t[2], ns = t[3];
        clattn__fit_fused_tile(ctx, t[1], &rm, &ns);
        if (rm != t[4] || ns != t[5])
            fail_msg("nreg16 %d dv %d RM %d NS %d: %d x %d, expected %d x %d", t[0], t[1], t[2], t[3], rm,
                     ns, t[4], t[5]);
    }
    free(ctx);
}

/* GPU decode with the defaults: decode_lanes up to 15 packed rows per kv head, the tiled kernel
 * (WGX 8, RM 4, a row tile covering the rows up to 64) from 16 (src/defaults.c); values from a tuning
 * file, a built-in table, the environment or an override, CPU devices and heads wider than 128
 * keep theirs. */
static void test_decode_tiled_default(void **state)
{
    (void)state;
    clattn_context *ctx = calloc(1, sizeof *ctx);
    assert_non_null(ctx);
    ctx->dev.type = CL_DEVICE_TYPE_GPU;
    const clattn_params lanes = {{32, 4, 0, 0, 8, 0, 4}}, lanes5 = {{32, 4, 0, 0, 8, 7, 5}};
    /* {rows, head_dim, head_dim_v, changed, WGY} */
    static const int rows[][5] = {{1, 128, 128, 0, 0},     {8, 64, 64, 0, 0},    {15, 128, 128, 0, 0},
                                  {16, 128, 128, 1, 4},    {17, 64, 64, 1, 5},   {32, 128, 128, 1, 8},
                                  {63, 128, 128, 1, 16},   {64, 32, 32, 1, 16},  {4096, 128, 128, 1, 16},
                                  {16, 129, 128, 0, 0},    {16, 128, 256, 0, 0}, {16, 256, 64, 0, 0}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const int *r = rows[i];
        for (int src = CLATTN_SOURCE_GENERIC; src <= CLATTN_SOURCE_OVERRIDE; src++)
            for (int k = 0; k < 2; k++) {
                clattn_params pp = k ? lanes5 : lanes;
                const clattn_params before = pp;
                const int changed = clattn__decode_tiled_default(ctx, r[0], r[1], r[2], (clattn_params_source)src, pp.v);
                const int want = r[3] && src <= CLATTN_SOURCE_BUILTIN;
                if (changed != want)
                    fail_msg("rows %d d %d/%d source %d DIRECT %d: changed %d, expected %d", r[0], r[1], r[2], src,
                             before.v[6], changed, want);
                if (!want) {
                    assert_memory_equal(pp.v, before.v, sizeof pp.v);
                    continue;
                }
                const int expect[7] = {8, r[4], 4, 1, 4, before.v[5], 0};
                if (memcmp(pp.v, expect, sizeof expect) != 0)
                    fail_msg("rows %d: %d,%d,%d,%d,%d,%d,%d", r[0], pp.v[0], pp.v[1], pp.v[2], pp.v[3], pp.v[4],
                             pp.v[5], pp.v[6]);
                /* The row tile (WGY x RM) covers the rows up to 64 and holds no 4-row block empty. */
                const int bm = pp.v[1] * pp.v[2];
                assert_true(bm >= (r[0] < 64 ? r[0] : 64) && bm - (r[0] < 64 ? r[0] : 64) < 4);
            }
    }
    /* Other decode kernels, and CPU devices, keep their values whatever the rows. */
    const clattn_params others[] = {{{32, 4, 0, 1, 8, 0, 2}}, {{32, 4, 0, 1, 8, 0, 3}}, {{1, 1, 0, 4, 16, 0, 1}},
                                    {{32, 1, 0, 1, 4, 0, 0}}};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        clattn_params pp = others[i];
        assert_int_equal(clattn__decode_tiled_default(ctx, 64, 128, 128, CLATTN_SOURCE_GENERIC, pp.v), 0);
        assert_memory_equal(pp.v, others[i].v, sizeof pp.v);
    }
    ctx->dev.type = CL_DEVICE_TYPE_CPU;
    clattn_params pp = lanes;
    assert_int_equal(clattn__decode_tiled_default(ctx, 64, 128, 128, CLATTN_SOURCE_VENDOR, pp.v), 0);
    free(ctx);
}

/* Where fused_direct (CPUs) reads K and V in place rather than over its Kᵀ/V copies (src/fused_cpu.c):
 * decode and up to 64 packed rows per kv head always; past that, by K and V's elements per kv
 * head, seq_kv x (head_dim + head_dim_v), whatever the dtype: with AVX-512's register tiles
 * (NREG16 32) more than 2^19, with AVX2's or SSE's (8, 4) at least 2^21 with head_dim +
 * head_dim_v <= 128. test_attention's cases check that the kernels take these paths; this
 * checks the edges on any machine. */
static void test_direct_in_place(void **state)
{
    (void)state;
    clattn_context *ctx = calloc(1, sizeof *ctx);
    assert_non_null(ctx);
    ctx->dev.type = CL_DEVICE_TYPE_CPU;
    /* {NREG16, packed rows, seq_q, seq_kv, head_dim + head_dim_v, in place} */
    static const long long rows[][6] = {
        {32, 1000, 16, 100, 128, 1},       {32, 64, 32, 100, 128, 1},         {32, 65, 65, 100, 128, 0},
        {32, 72, 72, 4096, 128, 0},        {32, 72, 72, 4097, 128, 1},        {32, 800, 200, 2048, 256, 0},
        {32, 800, 200, 2049, 256, 1},      {32, 4096, 4096, 1 << 20, 64, 1},  {8, 1000, 16, 100, 512, 1},
        {8, 64, 64, 100, 512, 1},          {8, 72, 72, 16383, 128, 0},        {8, 72, 72, 16384, 128, 1},
        {8, 72, 72, 32768, 64, 1},         {8, 72, 72, 1 << 20, 129, 0},      {8, 200, 50, 8192, 192, 0},
        {4, 72, 72, 16384, 128, 1},        {4, 72, 72, 1 << 20, 256, 0},      {4, 65, 65, 100, 32, 0}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const long long *r = rows[i];
        ctx->dev.nreg16 = (int)r[0];
        const int got = clattn__direct_in_place(ctx, r[1], r[2], r[3], r[4]);
        if (got != (int)r[5])
            fail_msg("NREG16 %lld, %lld rows, seq_q %lld, seq_kv %lld, head dims %lld: in place %d, expected %lld",
                     r[0], r[1], r[2], r[3], r[4], got, r[5]);
    }
    free(ctx);
}

/* The built-in tables (the .tuning files of tuning/, embedded with the kernels): each parses,
 * names its devices by a pattern and holds entries. nvidia-h200.tuning gives an H200's f16 decode
 * bucket (d128, one query row, no mask, about 8192 keys) its measured values, and leaves an H100,
 * the other dtypes and head sizes, a mask, a far key count and prefill to the vendor defaults. */
typedef struct builtin_row {
    const char *name; /* the device's name; the platform is NVIDIA CUDA */
    clattn_op op;
    clattn_dtype dtype;
    int head_dim, log2_skv, mask_kind, builtin; /* builtin: the table's entry is expected */
} builtin_row;

static void test_builtin_tables(void **state)
{
    (void)state;
    make_dir();
    unsetenv("CLATTN_PARAMS_DECODE");
    unsetenv("CLATTN_PARAMS_FUSED");
    int tables = 0, h200 = 0;
    for (int i = 0; i < clattn_kernel_source_count; i++) {
        const clattn_kernel_source *s = &clattn_kernel_sources[i];
        if (!clattn__is_builtin_table(s->name))
            continue;
        clattn_tuning_table t;
        memset(&t, 0, sizeof t);
        char err[200] = "";
        if (clattn__tuning_parse(s->text, s->length, &t, err, sizeof err) != 0)
            fail_msg("%s: %s", s->name, err);
        if (!t.device_is_pattern || t.n == 0)
            fail_msg("%s: no match line or no entries", s->name);
        clattn__tuning_free(&t);
        tables++;
        h200 += strstr(s->name, "nvidia-h200.tuning") != NULL;
    }
    assert_true(tables >= 2);
    assert_int_equal(h200, 1);

    static const builtin_row rows[] = {
        {"NVIDIA H200", CLATTN_OP_DECODE, CLATTN_F16, 128, 13, 0, 1},
        {"NVIDIA H200 NVL", CLATTN_OP_DECODE, CLATTN_F16, 128, 12, 0, 1},
        {"NVIDIA H200", CLATTN_OP_DECODE, CLATTN_F16, 128, 15, 0, 1},
        {"NVIDIA H100 80GB HBM3", CLATTN_OP_DECODE, CLATTN_F16, 128, 13, 0, 0},
        {"NVIDIA H200", CLATTN_OP_DECODE, CLATTN_F32, 128, 13, 0, 0},
        {"NVIDIA H200", CLATTN_OP_DECODE, CLATTN_BF16, 128, 13, 0, 0},
        {"NVIDIA H200", CLATTN_OP_DECODE, CLATTN_F16, 64, 13, 0, 0},
        {"NVIDIA H200", CLATTN_OP_DECODE, CLATTN_F16, 128, 20, 0, 0},
        {"NVIDIA H200", CLATTN_OP_DECODE, CLATTN_F16, 128, 13, 2, 0},
        {"NVIDIA H200", CLATTN_OP_FUSED, CLATTN_F16, 128, 13, 0, 0},
    };
    const int tuned[7] = {32, 8, 0, 0, 16, 0, 4};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const builtin_row *r = &rows[i];
        clattn_context *ctx = calloc(1, sizeof *ctx);
        assert_non_null(ctx);
        ctx->dev.type = CL_DEVICE_TYPE_GPU;
        ctx->dev.vendor_id = 0x10de;
        snprintf(ctx->dev.platform_name, sizeof ctx->dev.platform_name, "NVIDIA CUDA");
        snprintf(ctx->dev.name, sizeof ctx->dev.name, "%s", r->name);
        clattn__tuning_init(ctx);
        const int applies = strstr(ctx->tuning_report, "nvidia-h200.tuning applies") != NULL;
        assert_int_equal(applies, strstr(r->name, "H200") != NULL);
        const clattn_bucket b = {r->op, r->dtype, r->head_dim, 0, r->log2_skv, r->mask_kind};
        clattn_params p, vendor;
        const clattn_params_source src = clattn__default_params(ctx, &b, &p);
        const int builtin = src == CLATTN_SOURCE_BUILTIN;
        if (builtin != r->builtin)
            fail_msg("row %zu (%s): source %d", i, r->name, (int)src);
        if (builtin) {
            assert_memory_equal(p.v, tuned, sizeof tuned);
            /* From 16 packed rows per kv head the tiled kernel still runs (src/defaults.c). */
            assert_int_equal(clattn__decode_tiled_default(ctx, 16, 128, 128, src, p.v), 1);
            assert_int_equal(p.v[6], 0);
        }
        /* Without the tables, the vendor defaults: what every other row must have got. */
        clattn__tuning_release(ctx);
        assert_int_equal(clattn__default_params(ctx, &b, &vendor), CLATTN_SOURCE_VENDOR);
        assert_int_equal(memcmp(p.v, vendor.v, sizeof p.v) == 0, !builtin);
        free(ctx);
    }
}

/* Whether ctx built a program of `file` whose build options contain `opt` (NULL: any). */
static int built(const clattn_context *ctx, const char *file, const char *opt)
{
    for (int i = 0; i < ctx->nprograms; i++)
        if (!strcmp(ctx->programs[i].file, file) && (!opt || strstr(ctx->programs[i].options, opt)))
            return 1;
    return 0;
}

/* The choice above as calls make it: on a context that takes the device for a GPU
 * (CLATTN_TEST_GPU_LIMITS, tests/testutil.c), decode with 16 packed rows per kv head (seq_q 16, one
 * query head per kv head) builds the tiled kernel with the rule's tile and no decode_lanes, 8 rows
 * decode_lanes and no tiled kernel, and 16 rows with decode_lanes' values in CLATTN_PARAMS_DECODE
 * decode_lanes; each result matches the float64 reference. */
static void test_decode_kernel_choice(void **state)
{
    (void)state;
    make_dir(); /* no user tuning file */
    unsetenv("CLATTN_PARAMS_DECODE");
    setenv("CLATTN_TEST_GPU_LIMITS", "1", 1);
    static const struct {
        int seq_q;
        const char *env, *want, *want_opt, *not_want;
    } cases[] = {{16, NULL, "fused_tiled.cl", "-DWGX=8 -DWGY=4 -DRM=4 -DNS=1 -DVW=4 ", "decode_lanes.cl"},
                 {8, NULL, "decode_lanes.cl", NULL, "fused_tiled.cl"},
                 {16, "32,4,0,0,8,0,4", "decode_lanes.cl", NULL, "fused_tiled.cl"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (cases[c].env)
            setenv("CLATTN_PARAMS_DECODE", cases[c].env, 1);
        clattn_context *ctx = tu_context();
        assert_true(ctx->dev.type & CL_DEVICE_TYPE_GPU);
        const small_attn a = small_attn_make(cases[c].seq_q, 16, 0, CLATTN_ALGORITHM_FUSED, 21);
        small_attn_run(ctx, &a, 1, "decode on a GPU-limits context");
        if (!built(ctx, cases[c].want, cases[c].want_opt) || built(ctx, cases[c].not_want, NULL)) {
            for (int i = 0; i < ctx->nprograms; i++)
                print_message("built %s: %s\n", ctx->programs[i].file, ctx->programs[i].options);
            fail_msg("seq_q %d%s%s: expected %s %s and no %s", cases[c].seq_q, cases[c].env ? ", env " : "",
                     cases[c].env ? cases[c].env : "", cases[c].want, cases[c].want_opt ? cases[c].want_opt : "",
                     cases[c].not_want);
        }
        clattn_release(ctx);
        unsetenv("CLATTN_PARAMS_DECODE");
    }
    unsetenv("CLATTN_TEST_GPU_LIMITS");
}

/* ---- named parameters (src/params.h, src/params.c) ---- */

/* Every op's values written by name read back as the same values, in any order and case, and
 * equal the positional form; the kernel choice is written by its kernel's name. */
static void test_named_round_trip(void **state)
{
    (void)state;
    uint32_t seed = 12345u;
    for (int op = 0; op < CLATTN_OP_COUNT; op++) {
        const int n = clattn__param_count((clattn_op)op);
        assert_true(n > 0 && n <= CLATTN_MAX_PARAMS);
        for (int round = 0; round < 200; round++) {
            clattn_params want, got, pos;
            memset(&want, 0, sizeof want);
            char positional[256] = "", named[512], err[160];
            size_t len = 0;
            for (int i = 0; i < n; i++) {
                seed = seed * 1664525u + 1013904223u;
                want.v[i] = (int)((seed >> 8) % ((uint32_t)clattn__param_max((clattn_op)op, i) + 1));
                len += (size_t)snprintf(positional + len, sizeof positional - len, "%s%d", i ? "," : "", want.v[i]);
            }
            clattn__params_format((clattn_op)op, &want, n, named, sizeof named);
            memset(&got, 0x55, sizeof got);
            memset(&pos, 0x55, sizeof pos);
            int count = 0;
            if (!clattn__params_parse((clattn_op)op, named, 1, &got, &count, err, sizeof err))
                fail_msg("%s: \"%s\" refused: %s", clattn__op_name((clattn_op)op), named, err);
            assert_int_equal(count, -n);
            assert_true(clattn__params_parse((clattn_op)op, positional, 0, &pos, &count, err, sizeof err));
            assert_int_equal(count, n);
            assert_memory_equal(got.v, want.v, (size_t)n * sizeof(int));
            assert_memory_equal(pos.v, want.v, (size_t)n * sizeof(int));
            /* Positional lists are refused where names are required (tuning files' named form). */
            assert_int_equal(clattn__params_parse((clattn_op)op, positional, 1, &pos, NULL, err, sizeof err), 0);
            const int choice = clattn__param_choice_slot((clattn_op)op);
            if (choice >= 0 && !strstr(named, clattn__kernel_choice_name((clattn_op)op, want.v[choice])))
                fail_msg("%s: \"%s\" does not name kernel %d", clattn__op_name((clattn_op)op), named,
                         want.v[choice]);
        }
        /* Each public name is the table's, and parses to its own slot. */
        for (int i = 0; i < n; i++) {
            assert_string_equal(clattn_param_name((clattn_operation)op, i), clattn__param_name((clattn_op)op, i));
            assert_non_null(clattn__param_meaning((clattn_op)op, i));
            char one[64], err[160];
            clattn_params p;
            memset(&p, 0, sizeof p);
            snprintf(one, sizeof one, "%s=%d", clattn__param_name((clattn_op)op, i),
                     clattn__param_max((clattn_op)op, i));
            assert_true(clattn__params_parse((clattn_op)op, one, 1, &p, NULL, err, sizeof err));
            for (int k = 0; k < CLATTN_MAX_PARAMS; k++)
                assert_int_equal(p.v[k], k == i ? clattn__param_max((clattn_op)op, i) : 0);
        }
    }
}

/* Kernel names and decode's per-kernel names (KG, KL, LANES, LC, KU) set their slots; a list sets
 * what it names and keeps the rest. */
static void test_named_kernels(void **state)
{
    (void)state;
    char err[160];
    clattn_params p;
    const clattn_params base = {{32, 4, 0, 0, 8, 0, 4}};
    static const struct {
        const char *text;
        int v[7];
    } rows[] = {
        {"kernel=lanes,KG=8,KU=16", {32, 8, 0, 0, 16, 0, CLATTN_KERNEL_LANES}},
        {"DIRECT=rows,kg=2,kl=4,lc=16,RM=3", {32, 2, 3, 4, 16, 0, CLATTN_KERNEL_ROWS}},
        {"Kernel=ROWS_SYNC", {32, 4, 0, 0, 8, 0, CLATTN_KERNEL_ROWS_SYNC}},
        {"kernel=lanes_local,LANES=8", {32, 4, 0, 8, 8, 0, CLATTN_KERNEL_LANES_LOCAL}},
        {"kernel=tiled,WGX=8,WGY=16,RM=4,NS=1,VW=4,SPLITS=7", {8, 16, 4, 1, 4, 7, CLATTN_KERNEL_TILED}},
        {"kernel=1,SPLITS=0", {32, 4, 0, 0, 8, 0, CLATTN_KERNEL_DIRECT}},
        {"kernel=direct", {32, 4, 0, 0, 8, 0, CLATTN_KERNEL_DIRECT}},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        p = base;
        if (!clattn__params_parse(CLATTN_OP_DECODE, rows[i].text, 0, &p, NULL, err, sizeof err))
            fail_msg("\"%s\" refused: %s", rows[i].text, err);
        if (memcmp(p.v, rows[i].v, sizeof rows[i].v) != 0)
            fail_msg("\"%s\": %d,%d,%d,%d,%d,%d,%d", rows[i].text, p.v[0], p.v[1], p.v[2], p.v[3], p.v[4], p.v[5],
                     p.v[6]);
    }
    /* The views name the same slots. */
    p = base;
    assert_true(clattn__params_parse(CLATTN_OP_DECODE, "KG=2,LANES=8,KU=4", 0, &p, NULL, err, sizeof err));
    assert_int_equal(p.decode_lanes.KG, 2);
    assert_int_equal(p.decode.WGY, 2);
    assert_int_equal(p.decode_lanes.LANES, 8);
    assert_int_equal(p.decode_rows.KL, 8);
    assert_int_equal(p.decode.NS, 8);
    assert_int_equal(p.decode_lanes.KU, 4);
    assert_int_equal(p.decode.VW, 4);
    p = base;
    assert_true(clattn__params_parse(CLATTN_OP_SCORES, "kernel=direct,KT=1", 0, &p, NULL, err, sizeof err));
    assert_int_equal(p.gemm.DIRECT, CLATTN_KERNEL_DIRECT);
    assert_int_equal(p.gemm.KT, 1);
    assert_string_equal(clattn__kernel_choice_name(CLATTN_OP_DECODE, 5), "lanes_local");
    assert_string_equal(clattn__kernel_choice_name(CLATTN_OP_FUSED, 0), "tiled");
    assert_string_equal(clattn__kernel_choice_name(CLATTN_OP_FUSED, 2), "mma");
    assert_string_equal(clattn__kernel_choice_name(CLATTN_OP_DECODE, 6), "mma");
    assert_null(clattn__kernel_choice_name(CLATTN_OP_FUSED, 3));
    assert_null(clattn__kernel_choice_name(CLATTN_OP_SOFTMAX, 0));
    assert_int_equal(clattn__param_choice_slot(CLATTN_OP_MERGE), -1);
}

/* A bad list is refused with a reason and leaves the values as they were. */
static void test_named_errors(void **state)
{
    (void)state;
    static const struct {
        int op;
        const char *text, *why;
    } rows[] = {
        {CLATTN_OP_DECODE, "kernel=warp", "kernel name"},
        {CLATTN_OP_FUSED, "kernel=rows", "kernel name"}, /* a decode kernel */
        {CLATTN_OP_FUSED, "KG=4", "unknown parameter"},  /* decode's name only */
        {CLATTN_OP_DECODE, "WGX=4,wgx=8", "twice"},
        {CLATTN_OP_DECODE, "WGY=4,KG=8", "twice"}, /* one slot, two names */
        {CLATTN_OP_DECODE, "WGX=4,8", "mixes"},
        {CLATTN_OP_DECODE, "4,WGX=8", "mixes"},
        {CLATTN_OP_DECODE, "WGX=4,", "comma"},
        {CLATTN_OP_DECODE, "WGX=", "integer"},
        {CLATTN_OP_DECODE, "WGX=-1", "integer"},
        {CLATTN_OP_DECODE, "WGX=4097", "integer"},
        {CLATTN_OP_DECODE, "DIRECT=7", "integer"},
        {CLATTN_OP_SCORES, "KF=2", "integer"},
        {CLATTN_OP_PV, "KT=1", "integer"},
        {CLATTN_OP_MERGE, "WG=16,ROWS=1", "unknown parameter"},
        {CLATTN_OP_SOFTMAX, "1,2,3", "more than 2"},
        {CLATTN_OP_SOFTMAX, "=4", "unknown parameter"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        clattn_params p;
        memset(&p, 0x11, sizeof p);
        const clattn_params before = p;
        char err[160] = "";
        if (clattn__params_parse((clattn_op)rows[i].op, rows[i].text, 0, &p, NULL, err, sizeof err))
            fail_msg("%s \"%s\" was taken", clattn__op_name((clattn_op)rows[i].op), rows[i].text);
        if (!strstr(err, rows[i].why))
            fail_msg("%s \"%s\": \"%s\" does not say \"%s\"", clattn__op_name((clattn_op)rows[i].op), rows[i].text,
                     err, rows[i].why);
        assert_memory_equal(&p, &before, sizeof p);
    }
}

/* Version 2 files: the library writes every value by name under "clattn-tuning 2"; named entries
 * read in any order, version 1's positional entries too (in either version), and a named entry
 * must name each parameter once. */
static void test_named_file(void **state)
{
    (void)state;
    clattn_tuning_table t;
    memset(&t, 0, sizeof t);
    snprintf(t.device, sizeof t.device, "x");
    const clattn_tuning_entry d = {CLATTN_OP_DECODE, 1, 128, 0, 0, 13, 7, {32, 8, 0, 0, 16, 0, 4}};
    assert_int_equal(clattn__tuning_put(&t, &d), 0);
    char *text = clattn__tuning_format(&t);
    assert_non_null(text);
    if (strncmp(text, "clattn-tuning 2\n", 16) != 0 ||
        !strstr(text, "= WGX=32,WGY=8,RM=0,NS=0,VW=16,SPLITS=0,DIRECT=lanes\n"))
        fail_msg("written:\n%s", text);
    free(text);
    clattn__tuning_free(&t);
    static const struct {
        const char *text;
        int ok;
        const char *why;
    } rows[] = {
        {"clattn-tuning 2\ndevice x\ndecode f16 128 none 1 13 = DIRECT=lanes,KU=16,LANES=0,RM=0,KG=8,WGX=32,SPLITS=0\n",
         1, NULL},
        {"clattn-tuning 2\ndevice x\ndecode f16 128 none 1 13 = WGX=32, WGY=8, RM=0, NS=0, VW=16, SPLITS=0, DIRECT=4\n",
         1, NULL},
        {"clattn-tuning 2\ndevice x\ndecode f16 128 none 1 13 = 32,8,0,0,16,0,4\n", 1, NULL},
        {"clattn-tuning 1\ndevice x\ndecode f16 128 none 1 13 = WGX=32,WGY=8,RM=0,NS=0,VW=16,SPLITS=0,DIRECT=lanes\n",
         1, NULL},
        {"clattn-tuning 2\ndevice x\ndecode f16 128 none <=16 13 = WGX=32,WGY=8,RM=0,NS=0,VW=16,SPLITS=0,DIRECT=lanes\n",
         1, NULL},
        {"clattn-tuning 2\ndevice x\ndecode f16 128 none 1 13 = WGX=32,WGY=8,RM=0,NS=0,VW=16,DIRECT=lanes\n", 0,
         "wrong number"},
        {"clattn-tuning 2\ndevice x\ndecode f16 128 none 1 13 = WGX=32,WGY=8,RM=0,NS=0,VW=16,SPLITS=0,DIRECT=warp\n",
         0, "kernel name"},
        {"clattn-tuning 2\ndevice x\ndecode f16 128 none 1 13 = WGX=32,KG=8,WGY=8,RM=0,NS=0,VW=16,SPLITS=0\n", 0,
         "twice"},
        {"clattn-tuning 2\ndevice x\nmerge * * * * * = WG=16,WG=16\n", 0, "twice"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        clattn_tuning_table u;
        char err[200] = "";
        const int rc = clattn__tuning_parse(rows[i].text, strlen(rows[i].text), &u, err, sizeof err);
        if ((rc == 0) != rows[i].ok || (!rows[i].ok && !strstr(err, rows[i].why)))
            fail_msg("row %zu: rc %d, \"%s\"", i, rc, err);
        if (rows[i].ok) {
            assert_int_equal(u.n, 1);
            assert_int_equal(u.e[0].n, 7);
            const int want[7] = {32, 8, 0, 0, 16, 0, 4};
            assert_memory_equal(u.e[0].v, want, sizeof want);
        }
        clattn__tuning_free(&u);
    }
}

/* CLATTN_PARAMS_<OP> by name: used as given, named in the origin; a bad one is ignored with the
 * reason. */
static void test_named_env(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    const clattn_problem_class pc = {CLATTN_OPERATION_DECODE, CLATTN_F32, 64, 1, 1024, 0, 0};
    clattn_kernel_params kp;
    setenv("CLATTN_PARAMS_DECODE", "kernel=rows,KG=2,KL=4,LC=16,WGX=32,RM=0,SPLITS=3", 1);
    assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
    assert_int_equal(kp.source, CLATTN_SOURCE_ENVIRONMENT);
    const int want[7] = {32, 2, 0, 4, 16, 3, CLATTN_KERNEL_ROWS};
    assert_memory_equal(kp.values, want, sizeof want);
    assert_non_null(strstr(kp.origin, "kernel=rows"));
    setenv("CLATTN_PARAMS_DECODE", "kernel=rows,KG=2,KG=4", 1);
    assert_int_equal(clattn_get_params(ctx, &pc, &kp), CLATTN_SUCCESS);
    assert_true(kp.source != CLATTN_SOURCE_ENVIRONMENT);
    if (!strstr(kp.origin, "ignored") || !strstr(kp.origin, "twice"))
        fail_msg("origin: %s", kp.origin);
    unsetenv("CLATTN_PARAMS_DECODE");
}

/* clattn_get_call_params: decode with the head counts answers what the call runs (on a GPU the
 * tiled kernel from 16 packed rows per kv head); bad heads are refused; public dtype names. */
static void test_call_params(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    const clattn_problem_class pc = {CLATTN_OPERATION_DECODE, CLATTN_F32, 128, 4, 8192, 0, 0};
    clattn_kernel_params a, b;
    assert_int_equal(clattn_get_params(ctx, &pc, &a), CLATTN_SUCCESS);
    assert_int_equal(clattn_get_call_params(ctx, &pc, 32, 8, 0, &b), CLATTN_SUCCESS);
    if (!(ctx->dev.type & CL_DEVICE_TYPE_GPU)) {
        assert_memory_equal(a.values, b.values, sizeof a.values);
        assert_string_equal(a.origin, b.origin);
    }
    assert_int_equal(clattn_get_call_params(ctx, &pc, 32, 7, 0, &b), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "heads_kv"));
    assert_int_equal(clattn_get_call_params(ctx, &pc, 0, 0, 0, &b), CLATTN_INVALID_ARGUMENT);
    assert_int_equal(clattn_get_call_params(ctx, &pc, 8, 8, -1, &b), CLATTN_INVALID_ARGUMENT);
    assert_int_equal(clattn_get_call_params(NULL, &pc, 8, 8, 0, &b), CLATTN_INVALID_ARGUMENT);
    /* As a GPU with the defaults: the tiled kernel for 8·4 = 32 rows, decode_lanes for 2·4 = 8. */
    const cl_device_type type = ctx->dev.type;
    const cl_uint vendor = ctx->dev.vendor_id;
    ctx->dev.type = CL_DEVICE_TYPE_GPU;
    ctx->dev.vendor_id = 0x1002; /* no vendor table: the generic defaults, decode_lanes */
    assert_int_equal(clattn_get_call_params(ctx, &pc, 32, 4, 0, &b), CLATTN_SUCCESS);
    assert_int_equal(b.values[6], CLATTN_KERNEL_TILED);
    assert_non_null(strstr(b.origin, "tiled kernel for 32 query rows"));
    assert_int_equal(clattn_get_call_params(ctx, &pc, 8, 4, 0, &b), CLATTN_SUCCESS);
    assert_int_equal(b.values[6], CLATTN_KERNEL_LANES);
    ctx->dev.type = type;
    ctx->dev.vendor_id = vendor;
    assert_string_equal(clattn_dtype_name(CLATTN_F32), "f32");
    assert_string_equal(clattn_dtype_name(CLATTN_F16), "f16");
    assert_string_equal(clattn_dtype_name(CLATTN_BF16), "bf16");
    assert_string_equal(clattn_dtype_name(CLATTN_Q4_0), "q4_0");
    assert_null(clattn_dtype_name((clattn_dtype)8));
    /* Kernel names of the choice parameter only. */
    assert_string_equal(clattn_param_value_name(CLATTN_OPERATION_DECODE, 6, 4), "lanes");
    assert_string_equal(clattn_param_value_name(CLATTN_OPERATION_SCORES, 8, 1), "direct");
    assert_null(clattn_param_value_name(CLATTN_OPERATION_DECODE, 5, 4));
    assert_string_equal(clattn_param_value_name(CLATTN_OPERATION_DECODE, 6, 6), "mma");
    assert_null(clattn_param_value_name(CLATTN_OPERATION_DECODE, 6, 7));
    assert_null(clattn_param_value_name(CLATTN_OPERATION_MERGE, 0, 0));
    assert_null(clattn_param_value_name((clattn_operation)99, 6, 0));
    /* Program statistics: a build counts, and a second context's copy of the same values do too. */
    clattn_program_stats ps;
    assert_int_equal(clattn_get_program_stats(NULL, &ps), CLATTN_INVALID_ARGUMENT);
    assert_int_equal(clattn_get_program_stats(ctx, NULL), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "out"));
    assert_int_equal(clattn_get_program_stats(ctx, &ps), CLATTN_SUCCESS);
    assert_int_equal(ps.builds, ctx->stats.builds);
    assert_int_equal(ps.disk_hits, ctx->stats.disk_hits);
    assert_int_equal(ps.memory_hits, ctx->stats.memory_hits);
    assert_true(ps.build_seconds == ctx->build_seconds);
    for (size_t i = 0; i < sizeof ps.reserved / sizeof ps.reserved[0]; i++)
        assert_int_equal(ps.reserved[i], 0);
    const unsigned before = ps.builds + ps.disk_hits + ps.memory_hits;
    float in[16] = {0}, out[16];
    clattn_softmax_desc sd = {1, 1, 4, 4, 0.0f, 0, NULL, NULL};
    cl_int err;
    cl_mem bi = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof in, in, &err);
    assert_int_equal(err, CL_SUCCESS);
    const clattn_tensor t = clattn_tensor_bhsd(bi, CLATTN_F32, 1, 1, 4, 4);
    assert_int_equal(clattn_softmax(ctx, &sd, &t, &t, 0, NULL, NULL), CLATTN_SUCCESS);
    assert_int_equal(clEnqueueReadBuffer(clattn_queue(ctx), bi, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL), CL_SUCCESS);
    clReleaseMemObject(bi);
    assert_int_equal(clattn_get_program_stats(ctx, &ps), CLATTN_SUCCESS);
    assert_true(ps.builds + ps.disk_hits + ps.memory_hits > before);
    assert_true(out[0] > 0.2499f && out[0] < 0.2501f);
}

int main(void)
{
    /* Files the tests write (fopen: 0666 less the umask) and directories they make (mkdir -p) are
     * then 0644 and 0755, which the library trusts whatever umask the run started with (the trust
     * rows set their modes themselves). */
    umask(022);
    tu_add_test("format/round_trip", NULL, test_round_trip, NULL);
    tu_add_test("format/many_entries", NULL, test_many_entries, NULL);
    TU_ADD_TABLE("format/bad", test_bad_file, bad_rows);
    tu_add_test("format/comments", NULL, test_comments, NULL);
    tu_add_test("format/nul_long_random", NULL, test_nul_and_long_lines, NULL);
    tu_add_test("format/parse_threads", NULL, test_parse_threads, NULL);
    tu_add_test("lookup/order", NULL, test_lookup_order, NULL);
    TU_ADD_TABLE("lookup/bad_env", test_bad_env, env_rows);
    tu_add_test("lookup/env_nreg16", NULL, test_env_nreg16, NULL);
    tu_add_test("lookup/decode_splits", NULL, test_decode_splits, NULL);
    tu_add_test("tools/bench_env", NULL, test_bench_env, NULL);
    tu_add_test("tools/bench_peak", NULL, test_bench_peak, NULL);
    tu_add_test("tools/bench_masks", NULL, test_bench_masks, NULL);
    tu_add_test("tools/bench_refused", NULL, test_bench_refused, NULL);
    tu_add_test("tools/bench_pages", NULL, test_bench_pages, NULL);
    tu_add_test("tools/info", NULL, test_info, NULL);
    tu_add_test("tools/tune_bad_numbers", NULL, test_tune_bad_numbers, NULL);
    tu_add_test("tools/tune_bad_dir", NULL, test_tune_bad_dir, NULL);
    tu_add_test("tools/tune_refused_env", NULL, test_tune_refused_env, NULL);
    tu_add_test("tools/tune_json_escape", NULL, test_tune_json_escape, NULL);
    TU_ADD_TABLE("lookup/bad_user_file", test_bad_user_file, file_rows);
    TU_ADD_TABLE("lookup/odd_user_file", test_odd_user_file, odd_rows);
    TU_ADD_TABLE("lookup/file_size", test_file_size, size_rows);
    tu_add_test("api/tuning_path_clears_error", NULL, test_tuning_path_clears_error, NULL);
    tu_add_test("api/set_params_errors", NULL, test_set_params_errors, NULL);
    tu_add_test("api/override_computes", NULL, test_override_computes, NULL);
    tu_add_test("fit/fused_tile", NULL, test_fit_fused_tile, NULL);
    tu_add_test("fit/decode_tiled_default", NULL, test_decode_tiled_default, NULL);
    tu_add_test("fit/direct_in_place", NULL, test_direct_in_place, NULL);
    tu_add_test("lookup/builtin_tables", NULL, test_builtin_tables, NULL);
    tu_add_test("lookup/decode_kernel_choice", NULL, test_decode_kernel_choice, NULL);
    tu_add_test("tuner/end_to_end", NULL, test_tuner, NULL);
    tu_add_test("tuner/decode_no_entry", NULL, test_tuner_decode_no_entry, NULL);
    tu_add_test("tuner/dtype", NULL, test_tuner_dtype, NULL);
    tu_add_test("tuner/kvlen", NULL, test_tuner_kvlen, NULL);
    tu_add_test("store/two_writers", NULL, test_two_writers, NULL);
    tu_add_test("params/named_round_trip", NULL, test_named_round_trip, NULL);
    tu_add_test("params/named_kernels", NULL, test_named_kernels, NULL);
    tu_add_test("params/named_errors", NULL, test_named_errors, NULL);
    tu_add_test("params/named_file", NULL, test_named_file, NULL);
    tu_add_test("params/named_env", NULL, test_named_env, NULL);
    tu_add_test("params/call_params", NULL, test_call_params, NULL);
    TU_ADD_TABLE("trust/user_file", test_user_file_trust, trust_rows);
    TU_ADD_TABLE("trust/written_modes", test_written_modes, mode_rows);
    tu_add_test("trust/store_into_untrusted_dir", NULL, test_write_untrusted_dir, NULL);
    const int rc = tu_run_tests("tuning");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s-other %s-old %s-new", dir, dir, dir, dir);
    if (dir[0] && system(cmd) != 0)
        return 1;
    return rc;
}
