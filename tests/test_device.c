/*
 * Device choice and context lifetime: every form of device spec (none, type word, "P:D", device or
 * platform name substring, the CLATTN_DEVICE variable and its precedence), the failures a bad spec
 * gives, the device key's format, create/release without leaks, and contexts on a caller's queue.
 *
 * The expected device of each spec comes from this file's own walk over the platforms (an oracle
 * written from the header's rules), so the tests hold on any machine: "gpu" expects NO_DEVICE only
 * where no GPU exists. Device tests get a context through tu_context() first, which skips without a
 * device, or fails with CLATTN_REQUIRE_DEVICE=1.
 *
 * Table-driven: each table row is one cmocka test named "<area>/<row>"; main() refuses duplicate names.
 */
#define _POSIX_C_SOURCE 200809L /* setenv/unsetenv, sysconf */

#include "testutil.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The CLATTN_DEVICE value the test run started with, restored after every test that changes it. */
static char *saved_env_device;
static int had_env_device;

static void restore_env_device(void)
{
    if (had_env_device)
        setenv("CLATTN_DEVICE", saved_env_device, 1);
    else
        unsetenv("CLATTN_DEVICE");
}

/* Both ends: cmocka 1.1.5 skips the teardown of a test that failed or skipped. */
static int setup_env(void **state)
{
    (void)state;
    restore_env_device();
    return 0;
}

static int teardown_env(void **state)
{
    (void)state;
    restore_env_device();
    return 0;
}

/* Skips (or fails under CLATTN_REQUIRE_DEVICE=1) when there is no device at all. */
static void require_device(void)
{
    clattn_context *ctx = tu_context();
    clattn_release(ctx);
}

/* =============================== the oracle =============================== */

static int contains_ci(const char *hay, const char *needle)
{
    const size_t n = strlen(needle);
    if (n == 0)
        return 1;
    for (; *hay; ++hay) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
            ++i;
        if (i == n)
            return 1;
    }
    return 0;
}

static void device_name(cl_device_id d, char *buf, size_t size)
{
    buf[0] = '\0';
    if (clGetDeviceInfo(d, CL_DEVICE_NAME, size, buf, NULL) != CL_SUCCESS)
        buf[0] = '\0';
    buf[size - 1] = '\0';
}

static void platform_name(cl_platform_id p, char *buf, size_t size)
{
    buf[0] = '\0';
    if (clGetPlatformInfo(p, CL_PLATFORM_NAME, size, buf, NULL) != CL_SUCCESS)
        buf[0] = '\0';
    buf[size - 1] = '\0';
}

/* "P:D": decimal digits only on both sides of one colon, each index within an unsigned. */
static int index_spec(const char *spec, unsigned *p, unsigned *d)
{
    const char *colon = strchr(spec, ':');
    if (colon == NULL || colon == spec || colon[1] == '\0')
        return 0;
    for (const char *c = spec; *c; c++)
        if (c != colon && !isdigit((unsigned char)*c))
            return 0;
    errno = 0;
    const unsigned long long a = strtoull(spec, NULL, 10), b = strtoull(colon + 1, NULL, 10);
    if (errno != 0 || a > UINT_MAX || b > UINT_MAX)
        return 0;
    *p = (unsigned)a;
    *d = (unsigned)b;
    return 1;
}

/* The device the header's rules pick for `spec` (after the CLATTN_DEVICE fallback), or NULL. */
static cl_device_id expected_device(const char *spec)
{
    if (spec == NULL || *spec == '\0') {
        spec = getenv("CLATTN_DEVICE");
        if (spec != NULL && *spec == '\0')
            spec = NULL;
    }
    cl_platform_id plats[16];
    cl_uint nplat = 0;
    if (clGetPlatformIDs(16, plats, &nplat) != CL_SUCCESS)
        return NULL;
    if (nplat > 16)
        nplat = 16;
    unsigned ip = 0, id = 0;
    const int is_index = spec != NULL && index_spec(spec, &ip, &id);
    cl_device_type want = 0;
    if (spec != NULL && (strcmp(spec, "gpu") == 0 || strcmp(spec, "GPU") == 0))
        want = CL_DEVICE_TYPE_GPU;
    else if (spec != NULL && (strcmp(spec, "cpu") == 0 || strcmp(spec, "CPU") == 0))
        want = CL_DEVICE_TYPE_CPU;
    else if (spec != NULL && strcmp(spec, "accelerator") == 0)
        want = CL_DEVICE_TYPE_ACCELERATOR;
    cl_device_id first = NULL;
    for (cl_uint p = 0; p < nplat; ++p) {
        cl_device_id devs[64];
        cl_uint ndev = 0;
        if (clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 64, devs, &ndev) != CL_SUCCESS)
            continue;
        if (ndev > 64)
            ndev = 64;
        char pname[256];
        platform_name(plats[p], pname, sizeof pname);
        for (cl_uint d = 0; d < ndev; ++d) {
            cl_device_type type = 0;
            clGetDeviceInfo(devs[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
            char dname[256];
            device_name(devs[d], dname, sizeof dname);
            if (first == NULL)
                first = devs[d];
            if (spec == NULL) {
                if (type & CL_DEVICE_TYPE_GPU)
                    return devs[d];
            } else if (want != 0) {
                if (type & want)
                    return devs[d];
            } else if (is_index) {
                if (p == ip && d == id)
                    return devs[d];
            } else if (contains_ci(dname, spec) || contains_ci(pname, spec)) {
                return devs[d];
            }
        }
    }
    return spec == NULL ? first : NULL;
}

/* The first device of the first platform that has one: the source of derived name specs. */
static void first_device(cl_platform_id *p, cl_device_id *d)
{
    *p = NULL;
    *d = NULL;
    cl_platform_id plats[16];
    cl_uint nplat = 0;
    assert_int_equal(clGetPlatformIDs(16, plats, &nplat), CL_SUCCESS);
    for (cl_uint i = 0; i < nplat && i < 16; ++i) {
        cl_uint ndev = 0;
        if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, 1, d, &ndev) == CL_SUCCESS && ndev > 0) {
            *p = plats[i];
            return;
        }
    }
    fail_msg("no platform with a device");
}

/* "@device": a middle slice of the first device's name with its letter case swapped.
 * "@platform": the first word of that device's platform name, lower-cased. Else the text itself. */
static void resolve_spec(const char *text, char *buf, size_t size)
{
    if (text == NULL || text[0] != '@') {
        snprintf(buf, size, "%s", text != NULL ? text : "");
        return;
    }
    cl_platform_id p;
    cl_device_id d;
    first_device(&p, &d);
    char name[256];
    if (strcmp(text, "@device") == 0) {
        device_name(d, name, sizeof name);
        const size_t n = strlen(name);
        assert_true(n > 0);
        /* The middle half (at least 1 character) proves a substring, not a prefix, is enough. */
        const size_t start = n / 4, len = n / 2 > 0 ? n / 2 : 1;
        snprintf(buf, size, "%.*s", (int)len, name + start);
        for (char *c = buf; *c; ++c)
            *c = (char)(isupper((unsigned char)*c) ? tolower((unsigned char)*c) : toupper((unsigned char)*c));
    } else if (strcmp(text, "@platform") == 0) {
        platform_name(p, name, sizeof name);
        size_t n = 0;
        while (name[n] != '\0' && !isspace((unsigned char)name[n]))
            ++n;
        assert_true(n > 0);
        snprintf(buf, size, "%.*s", (int)n, name);
        for (char *c = buf; *c; ++c)
            *c = (char)tolower((unsigned char)*c);
    } else {
        fail_msg("unknown spec placeholder %s", text);
    }
}

/* =============================== device specs =============================== */

#define ENV_UNSET ((const char *)0)

typedef struct spec_row {
    const char *name;
    int null_spec;         /* pass NULL instead of the spec text */
    const char *spec;      /* literal, or "@device" / "@platform" */
    const char *env;       /* CLATTN_DEVICE for this row; ENV_UNSET removes it */
    int must_succeed;      /* the oracle must find a device (guards the oracle itself) */
    int must_fail;         /* the oracle must find none */
} spec_row;

static const spec_row spec_rows[] = {
    {"null", 1, NULL, ENV_UNSET, 1, 0},
    {"empty", 0, "", ENV_UNSET, 1, 0},
    {"cpu", 0, "cpu", ENV_UNSET, 0, 0},
    {"CPU_upper", 0, "CPU", ENV_UNSET, 0, 0},
    {"gpu", 0, "gpu", ENV_UNSET, 0, 0},
    {"GPU_upper", 0, "GPU", ENV_UNSET, 0, 0},
    {"accelerator", 0, "accelerator", ENV_UNSET, 0, 0},
    {"index_0_0", 0, "0:0", ENV_UNSET, 1, 0},
    {"device_name_substring_swapped_case", 0, "@device", ENV_UNSET, 1, 0},
    {"platform_name_substring", 0, "@platform", ENV_UNSET, 1, 0},
    {"bad_index_9_9", 0, "9:9", ENV_UNSET, 0, 1},
    {"bad_index_0_99", 0, "0:99", ENV_UNSET, 0, 1},
    {"bad_index_trailing", 0, "0:0x", ENV_UNSET, 0, 1},
    {"index_leading_zeros", 0, "00:000", ENV_UNSET, 1, 0},
    {"bad_index_platform_2_32", 0, "4294967296:0", ENV_UNSET, 0, 1},
    {"bad_index_device_2_32", 0, "0:4294967296", ENV_UNSET, 0, 1},
    {"bad_index_device_minus_2_32", 0, "0:-4294967296", ENV_UNSET, 0, 1},
    {"bad_index_device_20_digits", 0, "0:18446744073709551616", ENV_UNSET, 0, 1},
    {"bad_index_blank", 0, "0: 0", ENV_UNSET, 0, 1},
    {"bad_index_plus", 0, "0:+0", ENV_UNSET, 0, 1},
    {"bad_name", 0, "no-such-device-xyz", ENV_UNSET, 0, 1},
    {"env_used_for_null", 1, NULL, "0:0", 1, 0},
    {"env_used_for_empty", 0, "", "0:0", 1, 0},
    {"env_device_name", 1, NULL, "@device", 1, 0},
    {"env_empty_value_means_default", 1, NULL, "", 1, 0},
    {"env_bad_for_null", 1, NULL, "no-such-device-xyz", 0, 1},
    {"env_bad_for_empty", 0, "", "9:9", 0, 1},
    {"env_ignored_by_explicit_index", 0, "0:0", "no-such-device-xyz", 1, 0},
    {"env_ignored_by_explicit_platform", 0, "@platform", "9:9", 1, 0},
    {"env_ignored_by_explicit_bad", 0, "no-such-device-xyz", "0:0", 0, 1},
};

static void test_spec(void **state)
{
    const spec_row *r = *state;
    require_device();

    char env[256], spec_buf[256];
    if (r->env == ENV_UNSET) {
        unsetenv("CLATTN_DEVICE");
    } else {
        resolve_spec(r->env, env, sizeof env);
        setenv("CLATTN_DEVICE", env, 1);
    }
    resolve_spec(r->spec, spec_buf, sizeof spec_buf);
    const char *spec = r->null_spec ? NULL : spec_buf;
    /* The spec the library actually resolves, for the failure message. */
    const char *effective = (spec != NULL && *spec) ? spec : getenv("CLATTN_DEVICE");

    const cl_device_id want = expected_device(spec);
    if (r->must_succeed)
        assert_non_null(want);
    if (r->must_fail)
        assert_null(want);

    char why[512] = "stale";
    cl_platform_id p = (cl_platform_id)&why; /* poison: left as it was on failure */
    cl_device_id d = (cl_device_id)&why;
    const clattn_status sel = clattn_select_device(spec, &p, &d, why, sizeof why);

    clattn_context *ctx = (clattn_context *)&ctx; /* poison: must be NULL on failure */
    const clattn_status st = clattn_create(spec, &ctx);
    const char *msg = clattn_last_error(NULL);
    print_message("spec %s%s%s, CLATTN_DEVICE %s: %s; why: %s%s%s\n", spec ? "\"" : "",
                  spec ? spec : "NULL", spec ? "\"" : "", r->env == ENV_UNSET ? "unset" : env,
                  clattn_status_name(st), why, st ? "; error: " : "", st ? msg : "");

    if (want == NULL) {
        assert_int_equal(sel, CLATTN_NO_DEVICE);
        /* nothing the caller owns is modified on failure */
        assert_ptr_equal(p, (cl_platform_id)&why);
        assert_ptr_equal(d, (cl_device_id)&why);
        assert_string_equal(why, "stale");
        assert_int_equal(st, CLATTN_NO_DEVICE);
        assert_null(ctx);
        assert_non_null(msg);
        assert_non_null(effective);
        assert_non_null(strstr(msg, effective));
        if (spec == NULL || *spec == '\0')
            assert_non_null(strstr(msg, "CLATTN_DEVICE"));
        return;
    }
    assert_int_equal(sel, CLATTN_SUCCESS);
    assert_ptr_equal(d, want);
    assert_non_null(p);
    cl_platform_id dp = NULL;
    assert_int_equal(clGetDeviceInfo(d, CL_DEVICE_PLATFORM, sizeof dp, &dp, NULL), CL_SUCCESS);
    assert_ptr_equal(p, dp);
    /* `why` explains the pick and names the device it picked. */
    assert_true(why[0] != '\0');
    char dname[256];
    device_name(d, dname, sizeof dname);
    assert_non_null(strstr(why, dname));

    assert_int_equal(st, CLATTN_SUCCESS);
    assert_non_null(ctx);
    assert_ptr_equal(clattn_device(ctx), want);
    assert_non_null(clattn_queue(ctx));
    assert_non_null(clattn_cl_context(ctx));
    assert_string_equal(clattn_last_error(ctx), "");
    assert_int_equal(clattn_last_cl_error(ctx), CL_SUCCESS);
    assert_string_equal(clattn_last_build_log(ctx), "");
    clattn_release(ctx);
}

/* `why` is optional, and a short buffer is truncated, never overrun. */
static void test_select_why_buffer(void **state)
{
    (void)state;
    require_device();
    cl_platform_id p;
    cl_device_id d;
    assert_int_equal(clattn_select_device("0:0", &p, &d, NULL, 0), CLATTN_SUCCESS);
    assert_non_null(d);
    char small[9];
    memset(small, 'x', sizeof small);
    assert_int_equal(clattn_select_device("0:0", &p, &d, small, 6), CLATTN_SUCCESS);
    assert_true(strlen(small) < 6);
    assert_int_equal(small[6], 'x');
    char big[512];
    memset(big, 'x', sizeof big);
    assert_int_equal(clattn_select_device("0:0", &p, &d, big, 0), CLATTN_SUCCESS);
    assert_int_equal(big[0], 'x'); /* size 0: not written at all */
}

static void test_select_null_out(void **state)
{
    (void)state;
    cl_platform_id p = (cl_platform_id)&p;
    cl_device_id d = (cl_device_id)&d;
    char why[64] = "stale";
    /* refused: the outputs it was given are left as they were */
    assert_int_equal(clattn_select_device("0:0", NULL, &d, why, sizeof why), CLATTN_INVALID_ARGUMENT);
    assert_ptr_equal(d, (cl_device_id)&d);
    assert_string_equal(why, "stale");
    assert_int_equal(clattn_select_device("0:0", &p, NULL, NULL, 0), CLATTN_INVALID_ARGUMENT);
    assert_ptr_equal(p, (cl_platform_id)&p);
}

static void test_create_null_ctx(void **state)
{
    (void)state;
    assert_int_equal(clattn_create(NULL, NULL), CLATTN_INVALID_ARGUMENT);
    assert_true(clattn_last_error(NULL)[0] != '\0');
    assert_int_equal(clattn_create("0:0", NULL), CLATTN_INVALID_ARGUMENT);
}

/* =============================== device key =============================== */

static void sanitize(char *s)
{
    for (; *s; ++s)
        if (!(isalnum((unsigned char)*s) || *s == '.' || *s == '-' || *s == '_'))
            *s = '_';
}

static void test_key_format(void **state)
{
    (void)state;
    clattn_context *ctx = tu_context();
    cl_device_id d = clattn_device(ctx);
    char key[512];
    assert_int_equal(clattn_device_key(d, key, sizeof key), CLATTN_SUCCESS);
    print_message("device key: %s\n", key);

    /* Exactly three ':' separators: the name part had its own ':' replaced. */
    size_t colons = 0;
    for (const char *c = key; *c; ++c)
        colons += *c == ':';
    assert_int_equal(colons, 3);
    const char *c1 = strchr(key, ':');
    const char *c3 = strrchr(key, ':');
    assert_non_null(c1);
    const char *c2 = strchr(c1 + 1, ':');
    assert_non_null(c2);
    assert_true(c2 < c3);

    cl_uint vendor = 0, cus = 0;
    cl_ulong local = 0;
    char name[256];
    assert_int_equal(clGetDeviceInfo(d, CL_DEVICE_VENDOR_ID, sizeof vendor, &vendor, NULL), CL_SUCCESS);
    assert_int_equal(clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus, &cus, NULL), CL_SUCCESS);
    assert_int_equal(clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL), CL_SUCCESS);
    device_name(d, name, sizeof name);

    /* vvvv: lower-case hex, at least 4 digits (exactly 4 for a PCI vendor id). */
    const size_t vlen = (size_t)(c1 - key);
    assert_true(vlen >= 4);
    if (vendor <= 0xffffu)
        assert_int_equal(vlen, 4);
    for (size_t i = 0; i < vlen; ++i)
        assert_true(isdigit((unsigned char)key[i]) || (key[i] >= 'a' && key[i] <= 'f'));
    assert_int_equal(strtoul(key, NULL, 16), vendor);

    /* name: the device name with everything outside [A-Za-z0-9._-] replaced by '_'. */
    char want_name[256];
    snprintf(want_name, sizeof want_name, "%s", name);
    sanitize(want_name);
    assert_int_equal((size_t)(c2 - c1 - 1), strlen(want_name));
    assert_memory_equal(c1 + 1, want_name, strlen(want_name));
    for (const char *c = c1 + 1; c < c2; ++c)
        assert_true(isalnum((unsigned char)*c) || *c == '.' || *c == '-' || *c == '_');

    /* compute units and local memory in KiB, decimal. */
    char *end;
    assert_int_equal(strtoul(c2 + 1, &end, 10), cus);
    assert_ptr_equal(end, c3);
    assert_int_equal(strtoull(c3 + 1, &end, 10), local / 1024);
    assert_int_equal(*end, '\0');
    clattn_release(ctx);
}

typedef struct key_size_row {
    const char *name;
    int absolute; /* size is `size` itself, else strlen(key) + 1 + size */
    int size;
    int ok;
} key_size_row;

static const key_size_row key_size_rows[] = {
    {"size_zero", 1, 0, 0},
    {"size_one", 1, 1, 0},
    {"two_short", 0, -2, 0},
    {"one_short_no_terminator_room", 0, -1, 0},
    {"exact", 0, 0, 1},
    {"one_spare", 0, 1, 1},
};

static void test_key_size(void **state)
{
    const key_size_row *r = *state;
    clattn_context *ctx = tu_context();
    cl_device_id d = clattn_device(ctx);
    char key[512];
    assert_int_equal(clattn_device_key(d, key, sizeof key), CLATTN_SUCCESS);
    const size_t need = strlen(key) + 1;
    const size_t size = r->absolute ? (size_t)r->size : (size_t)((long)need + r->size);
    char buf[520];
    memset(buf, 'x', sizeof buf);
    const clattn_status st = clattn_device_key(d, buf, size);
    if (r->ok) {
        assert_int_equal(st, CLATTN_SUCCESS);
        assert_string_equal(buf, key);
    } else {
        assert_int_equal(st, CLATTN_INVALID_ARGUMENT);
        for (size_t i = 0; i < size; i++) /* refused: no byte of the buffer written */
            assert_int_equal(buf[i], 'x');
        if (size > 0) { /* the message says the size needed */
            char want[64];
            snprintf(want, sizeof want, "needs %zu", need);
            assert_non_null(strstr(clattn_last_error(NULL), want));
        }
    }
    assert_int_equal(buf[size], 'x'); /* nothing past the buffer touched */
    clattn_release(ctx);
}

static void test_key_null(void **state)
{
    (void)state;
    char buf[64] = "stale";
    assert_int_equal(clattn_device_key(NULL, buf, sizeof buf), CLATTN_INVALID_ARGUMENT);
    assert_string_equal(buf, "stale"); /* refused: left as it was */
    clattn_context *ctx = tu_context();
    assert_int_equal(clattn_device_key(clattn_device(ctx), NULL, 64), CLATTN_INVALID_ARGUMENT);
    clattn_release(ctx);
}

/* =============================== lifetime =============================== */

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

static void create_release(int times)
{
    for (int i = 0; i < times; ++i) {
        clattn_context *ctx = NULL;
        const clattn_status st = clattn_create(NULL, &ctx);
        if (st != CLATTN_SUCCESS)
            fail_msg("clattn_create failed on round %d: %s", i, clattn_last_error(NULL));
        clattn_release(ctx);
    }
}

static void test_create_release_no_growth(void **state)
{
    (void)state;
    require_device();
    if (rss_bytes() == 0)
        skip(); /* no /proc: nothing to measure with */
    create_release(50); /* warm-up: the driver's one-time allocations happen here */
    const size_t before = rss_bytes();
    create_release(1000);
    const size_t after = rss_bytes();
    const double growth = ((double)after - (double)before) / (1024.0 * 1024.0);
    print_message("RSS after 50 warm-up rounds %.2f MiB, after 1000 more %.2f MiB, growth %.3f MiB\n",
                  (double)before / (1024.0 * 1024.0), (double)after / (1024.0 * 1024.0), growth);
#if TU_SANITIZED
    /* AddressSanitizer quarantines freed memory, so RSS grows by design; LeakSanitizer checks
     * this build for leaks instead. */
    print_message("AddressSanitizer build: RSS growth not asserted\n");
#else
    assert_true(growth < 8.0);
#endif
}

/* =============================== caller's queue =============================== */

typedef struct user_cl {
    cl_context context;
    cl_command_queue queue;
    cl_device_id device;
} user_cl;

/* The caller's own context and queue on the device clattn_create(NULL) would pick. */
static cl_int make_user_cl(cl_command_queue_properties props, user_cl *u)
{
    memset(u, 0, sizeof *u);
    cl_platform_id p;
    cl_device_id d;
    assert_int_equal(clattn_select_device(NULL, &p, &d, NULL, 0), CLATTN_SUCCESS);
    cl_int err;
    cl_context_properties cprops[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)p, 0};
    u->context = clCreateContext(cprops, 1, &d, NULL, NULL, &err);
    assert_int_equal(err, CL_SUCCESS);
    u->device = d;
    u->queue = clCreateCommandQueue(u->context, d, props, &err);
    if (err != CL_SUCCESS) {
        clReleaseContext(u->context);
        u->context = NULL;
        u->queue = NULL;
    }
    return err;
}

static cl_uint queue_refcount(cl_command_queue q)
{
    cl_uint n = 0;
    assert_int_equal(clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof n, &n, NULL), CL_SUCCESS);
    return n;
}

static void test_from_queue_attention(void **state)
{
    (void)state;
    require_device();
    user_cl u;
    assert_int_equal(make_user_cl(0, &u), CL_SUCCESS);
    const cl_uint refs_before = queue_refcount(u.queue);

    clattn_context *ctx = NULL;
    assert_int_equal(clattn_create_from_queue(u.queue, &ctx), CLATTN_SUCCESS);
    assert_non_null(ctx);
    assert_ptr_equal(clattn_queue(ctx), u.queue);
    assert_ptr_equal(clattn_cl_context(ctx), u.context);
    assert_ptr_equal(clattn_device(ctx), u.device);
    assert_string_equal(clattn_last_error(ctx), "");

    enum { B = 1, H = 2, S = 33, D = 32 };
    const size_t n = (size_t)B * H * S * D;
    float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v),
          *o = malloc(n * sizeof *o);
    double *qd = malloc(n * sizeof *qd), *kd = malloc(n * sizeof *kd), *vd = malloc(n * sizeof *vd),
           *od = malloc(n * sizeof *od), *want = malloc(n * sizeof *want);
    assert_true(q && k && v && o && qd && kd && vd && od && want);
    tu_rng rng;
    tu_seed(&rng, 20240601);
    tu_fill(&rng, CLATTN_F32, q, qd, n, -1.0, 1.0);
    tu_fill(&rng, CLATTN_F32, k, kd, n, -1.0, 1.0);
    tu_fill(&rng, CLATTN_F32, v, vd, n, -1.0, 1.0);

    cl_mem bq = tu_buffer(ctx, n * 4, q), bk = tu_buffer(ctx, n * 4, k), bv = tu_buffer(ctx, n * 4, v),
           bo = tu_buffer(ctx, n * 4, NULL);
    const clattn_tensor tq = clattn_tensor_bhsd(bq, CLATTN_F32, B, H, S, D),
                        tk = clattn_tensor_bhsd(bk, CLATTN_F32, B, H, S, D),
                        tv = clattn_tensor_bhsd(bv, CLATTN_F32, B, H, S, D),
                        to = clattn_tensor_bhsd(bo, CLATTN_F32, B, H, S, D);
    clattn_attention_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.batch = B;
    desc.heads_q = H;
    desc.heads_kv = H;
    desc.seq_q = S;
    desc.seq_kv = S;
    desc.head_dim = D;
    desc.algorithm = CLATTN_ALGORITHM_FUSED;
    cl_event done = NULL;
    const clattn_status st = clattn_attention(ctx, &desc, &tq, &tk, &tv, &to, 0, NULL, &done);
    if (st != CLATTN_SUCCESS)
        fail_msg("clattn_attention: %s: %s", clattn_status_name(st), clattn_last_error(ctx));
    assert_non_null(done);
    /* The event belongs to the caller's queue. */
    cl_command_queue eq = NULL;
    assert_int_equal(clGetEventInfo(done, CL_EVENT_COMMAND_QUEUE, sizeof eq, &eq, NULL), CL_SUCCESS);
    assert_ptr_equal(eq, u.queue);
    assert_int_equal(clWaitForEvents(1, &done), CL_SUCCESS);
    clReleaseEvent(done);
    tu_read(ctx, bo, n * 4, o);

    const ref_attn a = {.batch = B, .heads_q = H, .heads_kv = H, .seq_q = S, .seq_kv = S, .head_dim = D};
    ref_attention(&a, qd, kd, vd, want, NULL, NULL);
    for (size_t i = 0; i < n; ++i)
        od[i] = o[i];
    tu_assert_allclose("attention on the caller's queue", od, want, n, 1e-5, 1e-4);

    /* Releasing the clattn context leaves the caller's queue and context alive and usable, and
     * gives back exactly the one reference it took. (Commands that ran may hold references of their
     * own inside the driver for a while, so compare with the count just before the release.) */
    assert_int_equal(clFinish(u.queue), CL_SUCCESS);
    const cl_uint refs_held = queue_refcount(u.queue);
    print_message("queue references: %u before clattn_create_from_queue, %u before clattn_release\n",
                  refs_before, refs_held);
    assert_true(refs_held >= refs_before + 1);
    clattn_release(ctx);
    assert_int_equal(queue_refcount(u.queue), refs_held - 1);
    assert_int_equal(clFinish(u.queue), CL_SUCCESS);
    float back[4] = {0, 0, 0, 0};
    assert_int_equal(clEnqueueReadBuffer(u.queue, bo, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL),
                     CL_SUCCESS);
    assert_memory_equal(back, o, sizeof back);
    assert_int_equal(clFinish(u.queue), CL_SUCCESS);

    clReleaseMemObject(bq);
    clReleaseMemObject(bk);
    clReleaseMemObject(bv);
    clReleaseMemObject(bo);
    assert_int_equal(clReleaseCommandQueue(u.queue), CL_SUCCESS);
    assert_int_equal(clReleaseContext(u.context), CL_SUCCESS);
    free(q);
    free(k);
    free(v);
    free(o);
    free(qd);
    free(kd);
    free(vd);
    free(od);
    free(want);
}

static void test_from_queue_null(void **state)
{
    (void)state;
    clattn_context *ctx = (clattn_context *)&ctx;
    assert_int_equal(clattn_create_from_queue(NULL, &ctx), CLATTN_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(clattn_last_error(NULL), "queue"));
}

static void test_from_queue_out_of_order(void **state)
{
    (void)state;
    require_device();
    user_cl u;
    const cl_int err = make_user_cl(CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &u);
    if (err != CL_SUCCESS) {
        print_message("skipping: the device refuses out-of-order queues (OpenCL error %d)\n", (int)err);
        skip();
    }
    const cl_uint refs_before = queue_refcount(u.queue);
    clattn_context *ctx = (clattn_context *)&ctx;
    assert_int_equal(clattn_create_from_queue(u.queue, &ctx), CLATTN_UNSUPPORTED);
    assert_null(ctx);
    assert_non_null(strstr(clattn_last_error(NULL), "out-of-order"));
    /* A refused queue is not retained. */
    assert_int_equal(queue_refcount(u.queue), refs_before);
    assert_int_equal(clReleaseCommandQueue(u.queue), CL_SUCCESS);
    assert_int_equal(clReleaseContext(u.context), CL_SUCCESS);
}

/* Several clattn contexts on one caller's queue, released in any order. */
static void test_from_queue_shared(void **state)
{
    (void)state;
    require_device();
    user_cl u;
    assert_int_equal(make_user_cl(CL_QUEUE_PROFILING_ENABLE, &u), CL_SUCCESS);
    const cl_uint refs_before = queue_refcount(u.queue);
    clattn_context *a = NULL, *b = NULL;
    assert_int_equal(clattn_create_from_queue(u.queue, &a), CLATTN_SUCCESS);
    assert_int_equal(clattn_create_from_queue(u.queue, &b), CLATTN_SUCCESS);
    assert_ptr_equal(clattn_queue(a), clattn_queue(b));
    clattn_release(a);
    assert_int_equal(clFinish(u.queue), CL_SUCCESS);
    clattn_release(b);
    assert_int_equal(queue_refcount(u.queue), refs_before);
    assert_int_equal(clFinish(u.queue), CL_SUCCESS);
    assert_int_equal(clReleaseCommandQueue(u.queue), CL_SUCCESS);
    assert_int_equal(clReleaseContext(u.context), CL_SUCCESS);
}

/* =============================== registration =============================== */

int main(void)
{
    const char *env = getenv("CLATTN_DEVICE");
    had_env_device = env != NULL;
    saved_env_device = env != NULL ? strdup(env) : NULL;

    /* Every test starts from the CLATTN_DEVICE the run started with, whatever the last one did. */
    tu_set_fixtures(setup_env, teardown_env);
    TU_ADD_TABLE("spec", test_spec, spec_rows);
    TU_ADD_TABLE("key_size", test_key_size, key_size_rows);
    tu_add_test("select/why_buffer", NULL, test_select_why_buffer, NULL);
    tu_add_test("select/null_out", NULL, test_select_null_out, NULL);
    tu_add_test("create/null_ctx", NULL, test_create_null_ctx, NULL);
    tu_add_test("key/format", NULL, test_key_format, NULL);
    tu_add_test("key/null", NULL, test_key_null, NULL);
    tu_add_test("lifetime/create_release_1000", NULL, test_create_release_no_growth, NULL);
    tu_add_test("from_queue/attention_then_release", NULL, test_from_queue_attention, NULL);
    tu_add_test("from_queue/null", NULL, test_from_queue_null, NULL);
    tu_add_test("from_queue/out_of_order", NULL, test_from_queue_out_of_order, NULL);
    tu_add_test("from_queue/two_contexts_one_queue", NULL, test_from_queue_shared, NULL);

    const int failed = tu_run_tests("device");
    free(saved_env_device);
    return failed;
}
