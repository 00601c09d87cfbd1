/*
 * The device-free corners of the public API: status strings and names (every code from
 * CLATTN_STATUS_LIST, so a new code is covered without touching this file), the runtime version
 * against the header's macros, dtype sizes, and the NULL-safety the header promises for
 * clattn_release and the accessors. No OpenCL device is needed: nothing here creates a context.
 *
 * Table-driven: each table row is one cmocka test named "<area>/<row>"; main() refuses duplicate names.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* =============================== status codes =============================== */

typedef struct status_row {
    const char *name;      /* test row name: the enum's suffix, e.g. "INVALID_ARGUMENT" */
    clattn_status status;
    int value;             /* the number the list gives it */
    const char *symbol;    /* "CLATTN_" #name */
    const char *text;      /* the list's English description */
} status_row;

static status_row status_rows[] = {
#define STATUS_ROW_(name, value, text) {#name, CLATTN_##name, value, "CLATTN_" #name, text},
    CLATTN_STATUS_LIST(STATUS_ROW_)
#undef STATUS_ROW_
};

/* Each code maps to the list's own text and name, both non-empty, and the enum value is the list's. */
static void test_status_row(void **state)
{
    const status_row *r = *state;
    assert_int_equal((int)r->status, r->value);
    const char *s = clattn_status_string(r->status);
    const char *n = clattn_status_name(r->status);
    assert_non_null(s);
    assert_non_null(n);
    assert_true(s[0] != '\0');
    assert_true(n[0] != '\0');
    assert_string_equal(s, r->text);
    assert_string_equal(n, r->symbol);
    assert_string_not_equal(s, "unknown status");
    assert_string_not_equal(n, "CLATTN_UNKNOWN");
}

/* No two codes share a value, a string or a name (a copy-pasted X() line would). */
static void test_status_distinct(void **state)
{
    (void)state;
    const size_t n = N_OF(status_rows);
    assert_true(n >= 8);
    for (size_t i = 0; i < n; ++i)
        for (size_t j = i + 1; j < n; ++j) {
            assert_int_not_equal(status_rows[i].value, status_rows[j].value);
            assert_string_not_equal(clattn_status_string(status_rows[i].status),
                                    clattn_status_string(status_rows[j].status));
            assert_string_not_equal(clattn_status_name(status_rows[i].status),
                                    clattn_status_name(status_rows[j].status));
        }
    /* SUCCESS is 0 so that `if (st)` tests for failure, as the library itself does. */
    assert_int_equal(CLATTN_SUCCESS, 0);
}

typedef struct unknown_row {
    const char *name;
    int value;
} unknown_row;

static const unknown_row unknown_rows[] = {
    {"minus_one", -1},
    {"past_last", 8},
    {"hundred", 100},
    {"int_max", 0x7fffffff},
    {"int_min", -0x7fffffff - 1},
};

static void test_status_unknown(void **state)
{
    const unknown_row *r = *state;
    /* Make sure the row really is outside the list, whatever the list grows into. */
    for (size_t i = 0; i < N_OF(status_rows); ++i)
        if (status_rows[i].value == r->value)
            skip();
    const clattn_status st = (clattn_status)r->value;
    assert_string_equal(clattn_status_string(st), "unknown status");
    const char *n = clattn_status_name(st);
    assert_non_null(n);
    assert_true(n[0] != '\0');
    for (size_t i = 0; i < N_OF(status_rows); ++i)
        assert_string_not_equal(n, status_rows[i].symbol);
}

/* =============================== version =============================== */

static void test_version_number(void **state)
{
    (void)state;
    assert_int_equal(clattn_version_number(), CLATTN_VERSION_NUMBER);
    assert_int_equal(CLATTN_VERSION_NUMBER,
                     CLATTN_VERSION_MAJOR * 10000 + CLATTN_VERSION_MINOR * 100 + CLATTN_VERSION_PATCH);
}

static void test_version_string(void **state)
{
    (void)state;
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", CLATTN_VERSION_MAJOR, CLATTN_VERSION_MINOR,
             CLATTN_VERSION_PATCH);
    const char *got = clattn_version_string();
    assert_non_null(got);
    assert_string_equal(got, want);
    /* The number and the string describe the same release. */
    unsigned ma = 0, mi = 0, pa = 0;
    assert_int_equal(sscanf(got, "%u.%u.%u", &ma, &mi, &pa), 3);
    assert_int_equal(ma * 10000 + mi * 100 + pa, clattn_version_number());
}

/* =============================== dtypes =============================== */

typedef struct dtype_row {
    const char *name;
    int dtype;
    size_t size;     /* bytes per element, or per block */
    int block;       /* elements per block */
    const char *str; /* clattn_dtype_name */
} dtype_row;

static const dtype_row dtype_rows[] = {
    {"f32", CLATTN_F32, 4, 1, "f32"},
    {"f16", CLATTN_F16, 2, 1, "f16"},
    {"bf16", CLATTN_BF16, 2, 1, "bf16"},
    {"i8", CLATTN_I8, 1, 1, "i8"},
    {"fp8_e4m3", CLATTN_FP8_E4M3, 1, 1, "fp8_e4m3"},
    {"fp8_e5m2", CLATTN_FP8_E5M2, 1, 1, "fp8_e5m2"},
    {"q8_0", CLATTN_Q8_0, 34, 32, "q8_0"}, /* ggml's block: f16 d and 32 int8 */
    {"q4_0", CLATTN_Q4_0, 18, 32, "q4_0"}, /* f16 d and 16 bytes of nibbles */
    {"unknown_8", 8, 0, 0, NULL},
    {"unknown_minus_1", -1, 0, 0, NULL},
    {"unknown_1000", 1000, 0, 0, NULL},
};

static void test_dtype_size(void **state)
{
    const dtype_row *r = *state;
    assert_int_equal(clattn_dtype_size((clattn_dtype)r->dtype), r->size);
    assert_int_equal(clattn_dtype_block((clattn_dtype)r->dtype), r->block);
    if (r->str)
        assert_string_equal(clattn_dtype_name((clattn_dtype)r->dtype), r->str);
    else
        assert_null(clattn_dtype_name((clattn_dtype)r->dtype));
}

/* =============================== NULL safety =============================== */

static void test_release_null(void **state)
{
    (void)state;
    clattn_release(NULL);
    clattn_release(NULL); /* twice: nothing is remembered between calls */
}

static void test_accessors_null(void **state)
{
    (void)state;
    /* With NULL, last_error reports clattn_create's failures: a string, possibly empty. */
    const char *e = clattn_last_error(NULL);
    assert_non_null(e);
    assert_int_equal(clattn_last_cl_error(NULL), CL_SUCCESS);
    const char *log = clattn_last_build_log(NULL);
    assert_non_null(log);
    assert_string_equal(log, "");
    assert_null(clattn_queue(NULL));
    assert_null(clattn_cl_context(NULL));
    assert_null(clattn_device(NULL));
}

/* The thread's create error is set by a failing create and readable through last_error(NULL);
 * a failed argument check needs no device. */
static void test_create_null_out(void **state)
{
    (void)state;
    assert_int_equal(clattn_create(NULL, NULL), CLATTN_INVALID_ARGUMENT);
    const char *e = clattn_last_error(NULL);
    assert_non_null(e);
    assert_non_null(strstr(e, "ctx"));
    assert_int_equal(clattn_create_from_queue(NULL, NULL), CLATTN_INVALID_ARGUMENT);
    clattn_context *ctx = (clattn_context *)&ctx; /* poison: must come back NULL */
    assert_int_equal(clattn_create_from_queue(NULL, &ctx), CLATTN_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(clattn_last_error(NULL), "queue"));
}

/* Public entry points given a NULL context refuse it rather than crash. */
static void test_ops_null_context(void **state)
{
    (void)state;
    clattn_attention_desc ad;
    memset(&ad, 0, sizeof ad);
    clattn_softmax_desc sd;
    memset(&sd, 0, sizeof sd);
    cl_event ev = (cl_event)&ev; /* poison: must come back NULL */
    assert_int_equal(clattn_softmax(NULL, &sd, NULL, NULL, 0, NULL, &ev), CLATTN_INVALID_ARGUMENT);
    assert_null(ev);
    /* With no context to hold it, the message is the thread's: it names the call. */
    assert_non_null(strstr(clattn_last_error(NULL), "clattn_softmax: ctx"));
    ev = (cl_event)&ev;
    assert_int_equal(clattn_attention(NULL, &ad, NULL, NULL, NULL, NULL, 0, NULL, &ev),
                     CLATTN_INVALID_ARGUMENT);
    assert_null(ev);
    assert_non_null(strstr(clattn_last_error(NULL), "clattn_attention: ctx"));
    float x = 0.0f;
    assert_int_equal(clattn_attention_host(NULL, &ad, CLATTN_F32, &x, &x, &x, &x, NULL),
                     CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(NULL), "clattn_attention_host: ctx"));
    char key[8];
    assert_int_equal(clattn_device_key(NULL, key, sizeof key), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(NULL), "clattn_device_key"));
}

/* =============================== registration =============================== */

int main(void)
{
    TU_ADD_TABLE("status", test_status_row, status_rows);
    TU_ADD_TABLE("status_unknown", test_status_unknown, unknown_rows);
    TU_ADD_TABLE("dtype_size", test_dtype_size, dtype_rows);
    tu_add_test("status/all_distinct", NULL, test_status_distinct, NULL);
    tu_add_test("version/number", NULL, test_version_number, NULL);
    tu_add_test("version/string", NULL, test_version_string, NULL);
    tu_add_test("null/release", NULL, test_release_null, NULL);
    tu_add_test("null/accessors", NULL, test_accessors_null, NULL);
    tu_add_test("null/create_out", NULL, test_create_null_out, NULL);
    tu_add_test("null/ops_context", NULL, test_ops_null_context, NULL);

    return tu_run_tests("status");
}
