/* The tuning store's text format: parse, format, atomic write.
 *
 *   clattn-tuning 2
 *   device 10de:NVIDIA H100 80GB HBM3:132:233472    (user files: the exact device key)
 *   match pthread                                   (built-in files: a device-name substring)
 *   driver 550.54.15                                (a tag: a new driver re-checks, not a miss)
 *   # op  dtype head_dim mask seq_q log2_seq_kv = parameters
 *   fused f32   64       none >128  10          = WGX=1,WGY=1,RM=6,NS=4,VW=16,DIRECT=direct
 *   softmax *   *        *    *     *           = 16,2
 *
 * Values are either every parameter of the operation by name (params.h; the kernel choice DIRECT
 * by kernel name or number; what the library writes) or, as version 1 wrote them, the operation's
 * count of integers in the positional order of clattn_param_name. Version 1 and 2 files are both
 * read; the library writes version 2.
 * Every field but op may be "*". mask: none, causal, masked (an additive mask or key lengths,
 * with or without causal). seq_q: 1, <=16, <=128, >128. Lines are at most 1023 bytes (a device
 * value 511, a driver tag 255); '#' starts a comment, on a line of its own or after an entry
 * (device and driver values are taken whole: a device name may hold a '#'). Numbers are plain
 * decimal digits. Any other line makes the whole file malformed: a store is used whole or not at
 * all. */
#define _POSIX_C_SOURCE 200809L /* renameat, unlinkat: the store is written through its directory's descriptor */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *const mask_names[3] = {"none", "causal", "masked"};
static const char *const sq_names[4] = {"1", "<=16", "<=128", ">128"};
static const char *const dtype_names[3] = {"f32", "f16", "bf16"};

void clattn__tuning_free(clattn_tuning_table *t)
{
    free(t->e);
    memset(t, 0, sizeof *t);
}

static int add_entry(clattn_tuning_table *t, const clattn_tuning_entry *e)
{
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 16;
        clattn_tuning_entry *p = realloc(t->e, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        t->e = p;
        t->cap = cap;
    }
    t->e[t->n++] = *e;
    return 0;
}

int clattn__tuning_same_bucket(const clattn_tuning_entry *a, const clattn_tuning_entry *b)
{
    return a->op == b->op && a->dtype == b->dtype && a->head_dim == b->head_dim && a->mask_kind == b->mask_kind &&
           a->sq_class == b->sq_class && a->log2_skv == b->log2_skv;
}

int clattn__tuning_put(clattn_tuning_table *t, const clattn_tuning_entry *e)
{
    for (int i = 0; i < t->n; i++) {
        if (clattn__tuning_same_bucket(&t->e[i], e)) {
            t->e[i] = *e;
            return 0;
        }
    }
    return add_entry(t, e);
}

/* Parse-time index of a table's buckets: open addressing over entry numbers (+1; 0 is empty), so
 * that a file of n entries reads in O(n), where clattn__tuning_put's scan would take O(n^2): a
 * second for a 1 MiB file of 40,000 entries. */
typedef struct bucket_index {
    int *slot;
    size_t size; /* a power of two, at least twice the entries */
} bucket_index;

static size_t bucket_hash(const clattn_tuning_entry *e)
{
    const int f[6] = {(int)e->op, e->dtype, e->head_dim, e->mask_kind, e->sq_class, e->log2_skv};
    uint32_t h = 2166136261u; /* FNV-1a over the fields' low bytes */
    for (int i = 0; i < 6; i++)
        for (int b = 0; b < 2; b++) {
            h ^= (uint32_t)(f[i] >> (8 * b)) & 0xffu;
            h *= 16777619u;
        }
    return h;
}

static int *index_slot(const bucket_index *x, const clattn_tuning_table *t, const clattn_tuning_entry *e)
{
    size_t i = bucket_hash(e) & (x->size - 1);
    while (x->slot[i] && !clattn__tuning_same_bucket(&t->e[x->slot[i] - 1], e))
        i = (i + 1) & (x->size - 1);
    return &x->slot[i];
}

/* clattn__tuning_put through the index: a later entry replaces the earlier one of its bucket. */
static int index_put(bucket_index *x, clattn_tuning_table *t, const clattn_tuning_entry *e)
{
    if ((size_t)t->n + 1 > x->size / 2) {
        bucket_index y = {calloc(x->size ? 2 * x->size : 64, sizeof(int)), x->size ? 2 * x->size : 64};
        if (!y.slot)
            return -1;
        for (int i = 0; i < t->n; i++)
            *index_slot(&y, t, &t->e[i]) = i + 1;
        free(x->slot);
        *x = y;
    }
    int *s = index_slot(x, t, e);
    if (*s) {
        t->e[*s - 1] = *e;
        return 0;
    }
    if (add_entry(t, e) != 0)
        return -1;
    *s = t->n;
    return 0;
}

/* A field that is "*" (-1) or one of `names`. */
static int field_name(const char *s, const char *const *names, int n, int *out)
{
    if (strcmp(s, "*") == 0) {
        *out = -1;
        return 1;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 1;
        }
    return 0;
}

/* A decimal integer in [0, max] at s: ASCII digits only (no sign, blank or base prefix, so "-0"
 * or "+4" never pass), stopping at the first non-digit, which *end receives. Hand-written instead
 * of strtol: the range check cannot overflow, whatever the length or the width of long. */
static int parse_uint(const char *s, int max, int *out, const char **end)
{
    long v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = 10 * v + (*p - '0');
        if (v > max)
            return 0;
    }
    if (p == s)
        return 0;
    *out = (int)v;
    *end = p;
    return 1;
}

/* A field that is "*" (-1) or an integer in [lo, hi]. */
static int field_int(const char *s, int lo, int hi, int *out)
{
    if (strcmp(s, "*") == 0) {
        *out = -1;
        return 1;
    }
    const char *end;
    int v;
    if (!parse_uint(s, hi, &v, &end) || *end || v < lo)
        return 0;
    *out = v;
    return 1;
}

/* Splits s in place at blanks into at most max fields; returns the count, or max + 1 when there
 * are more. Hand-written: strtok keeps its position in one static for the whole process, so
 * contexts loading files on several threads at once would cut each other's lines (strtok_r is
 * POSIX, not C11). */
static int split_fields(char *s, char **field, int max)
{
    int n = 0;
    for (;;) {
        while (*s == ' ' || *s == '\t')
            s++;
        if (!*s)
            return n;
        if (n == max)
            return max + 1;
        field[n++] = s;
        while (*s && *s != ' ' && *s != '\t')
            s++;
        if (*s)
            *s++ = '\0';
    }
}

/* The six bucket fields: op dtype head_dim mask seq_q log2_seq_kv. */
static int parse_bucket(char **tok, clattn_tuning_entry *e, const char **why)
{
    int op = -1;
    for (int i = 0; i < CLATTN_OP_COUNT; i++)
        if (strcmp(tok[0], clattn__op_name((clattn_op)i)) == 0)
            op = i;
    if (op < 0) {
        *why = "unknown operation";
        return 0;
    }
    e->op = (clattn_op)op;
    if (!field_name(tok[1], dtype_names, 3, &e->dtype) || !field_int(tok[2], 1, CLATTN_MAX_HEAD_DIM, &e->head_dim) ||
        !field_name(tok[3], mask_names, 3, &e->mask_kind) ||
        !field_name(tok[4], sq_names, 4, &e->sq_class) || !field_int(tok[5], 0, 62, &e->log2_skv)) {
        *why = "bad dtype, head_dim, mask, seq_q or log2_seq_kv field";
        return 0;
    }
    return 1;
}

/* Values by name (what version 2 writes): "NAME=value,..." naming each of the operation's
 * parameters once, in any order, blanks allowed between pairs, a kernel choice by name or number. */
static int parse_named_values(const char *text, clattn_tuning_entry *e, const char **why)
{
    static _Thread_local char msg[200];
    char values[1024];
    size_t len = 0;
    for (const char *c = text; *c && len + 1 < sizeof values; c++)
        if (*c != ' ' && *c != '\t')
            values[len++] = *c;
    values[len] = '\0';
    clattn_params p;
    memset(&p, 0, sizeof p);
    int count = 0;
    char err[160];
    if (!clattn__params_parse(e->op, values, 1, &p, &count, err, sizeof err)) {
        snprintf(msg, sizeof msg, "values: %s", err);
        *why = msg;
        return 0;
    }
    if (-count != clattn__param_count(e->op)) {
        *why = "wrong number of values for the operation (each parameter named once)";
        return 0;
    }
    e->n = -count;
    memcpy(e->v, p.v, sizeof e->v);
    return 1;
}

static int parse_entry(char *line, clattn_tuning_entry *e, const char **why)
{
    memset(e, 0, sizeof *e);
    /* The comment goes first: an '=' in it ("# was =32") is no separator. */
    char *hash = strchr(line, '#');
    if (hash)
        *hash = '\0';
    /* The separator: the first '=' that is not part of a seq_q class ("<=16"); values named
     * "NAME=value" hold more. */
    char *eq = strchr(line, '=');
    while (eq && eq > line && eq[-1] == '<')
        eq = strchr(eq + 1, '=');
    if (!eq) {
        *why = "no '='";
        return 0;
    }
    *eq = '\0';
    char *tok[6];
    const int nt = split_fields(line, tok, 6);
    if (nt > 6) {
        *why = "too many fields before '='";
        return 0;
    }
    if (nt != 6) {
        *why = "expected: op dtype head_dim mask seq_q log2_seq_kv = values";
        return 0;
    }
    if (!parse_bucket(tok, e, why))
        return 0;
    /* Values: exactly the operation's count of integers in [0, 4096], choices at most their largest
     * value; or (version 2) each parameter by name. */
    const int want = clattn__param_count(e->op);
    const char *s = eq + 1;
    if (strchr(s, '='))
        return parse_named_values(s, e, why);
    for (;;) {
        while (*s == ' ' || *s == '\t')
            s++;
        if (e->n == CLATTN_MAX_PARAMS) {
            *why = "wrong number of values for the operation";
            return 0;
        }
        if (!parse_uint(s, CLATTN_PARAM_MAX, &e->v[e->n], &s)) {
            *why = "values must be integers in [0, 4096]";
            return 0;
        }
        e->n++;
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s == '\0')
            break;
        if (*s != ',') {
            *why = "values must be a comma-separated list";
            return 0;
        }
        s++;
    }
    if (e->n != want) {
        *why = "wrong number of values for the operation";
        return 0;
    }
    for (int i = 0; i < e->n; i++)
        if (e->v[i] > clattn__param_max(e->op, i)) {
            *why = "a choice (DIRECT, KF or KT) past its largest value (clattn_param_max)";
            return 0;
        }
    return 1;
}

int clattn__tuning_parse(const char *text, size_t len, clattn_tuning_table *t, char *err,
                         size_t errsz)
{
    memset(t, 0, sizeof *t);
    int lineno = 0, have_header = 0, have_device = 0, have_driver = 0;
    size_t pos = 0;
    char line[1024];
    const char *why = NULL;
    bucket_index index = {NULL, 0};
    while (pos < len) {
        size_t end = pos;
        while (end < len && text[end] != '\n')
            end++;
        lineno++;
        if (end - pos >= sizeof line) {
            why = "line too long";
            goto bad;
        }
        if (end == len && end > pos) {
            /* Writers end every line with '\n': a last line without one is a truncated file. */
            why = "truncated (last line has no newline)";
            goto bad;
        }
        memcpy(line, text + pos, end - pos);
        line[end - pos] = '\0';
        size_t n = end - pos;
        pos = end + 1;
        if (strlen(line) != n) {
            why = "NUL byte in a line";
            goto bad;
        }
        /* Strip a trailing '\r' and blanks, then leading blanks. */
        while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
            line[--n] = '\0';
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        if (!have_header) {
            if (strncmp(s, "clattn-tuning ", 14) != 0) {
                why = "not a clattn tuning file (first line must be \"clattn-tuning 2\" or \"clattn-tuning 1\")";
                goto bad;
            }
            if (strcmp(s + 14, "1") != 0 && strcmp(s + 14, "2") != 0) {
                why = "unsupported format version (this library reads versions 1 and 2)";
                goto bad;
            }
            have_header = 1;
            continue;
        }
        if (*s == '\0' || *s == '#')
            continue;
        /* The line's blanks are stripped: a keyword with an empty value is that word alone. */
        if (strcmp(s, "device") == 0 || strcmp(s, "match") == 0 || strcmp(s, "driver") == 0) {
            why = s[1] == 'r' ? "driver line without a tag" : "device/match line without a value";
            goto bad;
        }
        if (strncmp(s, "device ", 7) == 0 || strncmp(s, "match ", 6) == 0) {
            if (have_device) {
                why = "second device/match line";
                goto bad;
            }
            const int exact = s[0] == 'd';
            /* Cut short, a key could end in a blank the next read strips: refuse, never truncate. */
            if (strlen(s + (exact ? 7 : 6)) >= sizeof t->device) {
                why = "device key too long";
                goto bad;
            }
            snprintf(t->device, sizeof t->device, "%s", s + (exact ? 7 : 6));
            t->device_is_pattern = !exact;
            have_device = 1;
            continue;
        }
        if (strncmp(s, "driver ", 7) == 0) {
            if (have_driver) {
                why = "second driver line";
                goto bad;
            }
            have_driver = 1;
            if (strlen(s + 7) >= sizeof t->driver) {
                why = "driver tag too long";
                goto bad;
            }
            snprintf(t->driver, sizeof t->driver, "%s", s + 7);
            continue;
        }
        clattn_tuning_entry e;
        if (!parse_entry(s, &e, &why))
            goto bad;
        if (!have_device) {
            why = "entry before the device line";
            goto bad;
        }
        if (index_put(&index, t, &e) != 0) {
            why = "out of host memory";
            goto bad;
        }
    }
    if (!have_header) {
        why = "empty file";
        lineno = 1;
        goto bad;
    }
    if (!have_device) {
        why = "no device line";
        goto bad;
    }
    free(index.slot);
    return 0;
bad:
    if (err && errsz)
        snprintf(err, errsz, "line %d: %s", lineno, why);
    free(index.slot);
    clattn__tuning_free(t);
    return -1;
}

static void put_field(char *buf, size_t size, int v, const char *const *names)
{
    if (v < 0)
        snprintf(buf, size, "*");
    else if (names)
        snprintf(buf, size, "%s", names[v]);
    else
        snprintf(buf, size, "%d", v);
}

/* One entry line without the newline. */
void clattn__tuning_entry_text(const clattn_tuning_entry *e, char *buf, size_t size)
{
    char f[5][16];
    put_field(f[0], sizeof f[0], e->dtype, dtype_names);
    put_field(f[1], sizeof f[1], e->head_dim, NULL);
    put_field(f[2], sizeof f[2], e->mask_kind, mask_names);
    put_field(f[3], sizeof f[3], e->sq_class, sq_names);
    put_field(f[4], sizeof f[4], e->log2_skv, NULL);
    int n = snprintf(buf, size, "%-7s %-4s %-3s %-6s %-5s %-2s = ", clattn__op_name(e->op), f[0], f[1],
                     f[2], f[3], f[4]);
    if (n > 0 && (size_t)n < size) {
        clattn_params p;
        memcpy(p.v, e->v, sizeof p.v);
        clattn__params_format(e->op, &p, e->n, buf + n, size - (size_t)n);
    }
}

char *clattn__tuning_format(const clattn_tuning_table *t)
{
    size_t cap = 1024 + (size_t)t->n * 240, n = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    n += (size_t)snprintf(out + n, cap - n, "clattn-tuning 2\n%s %s\n", t->device_is_pattern ? "match" : "device",
                          t->device);
    if (t->driver[0])
        n += (size_t)snprintf(out + n, cap - n, "driver %s\n", t->driver);
    n += (size_t)snprintf(out + n, cap - n,
                          "# op     dtype hd mask   seq_q log2_seq_kv = parameters by name (clattn-info lists them)\n");
    for (int i = 0; i < t->n && n < cap; i++) {
        char line[240];
        clattn__tuning_entry_text(&t->e[i], line, sizeof line);
        n += (size_t)snprintf(out + n, cap - n, "%s\n", line);
    }
    if (n >= cap) {
        free(out);
        return NULL;
    }
    return out;
}

int clattn__tuning_write(const char *path, const clattn_tuning_table *t, char *err, size_t errsz)
{
    /* Through the directory's descriptor, checked once (cache.c): written only where the library
     * will read it back (docs/guarantees.md), and a directory renamed into its place meanwhile
     * changes nothing. */
    char dir[4200], why[300];
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    const size_t dn = !slash ? 0 : slash == path ? 1 : (size_t)(slash - path); /* "/name": "/" */
    if (!*name || dn >= sizeof dir) {
        snprintf(err, errsz, "cannot write %s: not a file name", path);
        return -1;
    }
    snprintf(dir, sizeof dir, "%.*s", (int)(dn ? dn : 1), dn ? path : ".");
    const int dfd = clattn__open_dir_for_write(dir, why, sizeof why);
    if (dfd < 0) {
        if (why[0])
            snprintf(err, errsz, "cannot write %s: its directory is not trusted: %s (docs/guarantees.md)", path, why);
        else
            snprintf(err, errsz, "cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    char *text = clattn__tuning_format(t);
    if (!text) {
        close(dfd);
        snprintf(err, errsz, "out of host memory");
        return -1;
    }
    /* Temporary name unique per process, thread and call; rename() replaces atomically, so a
     * reader sees the old file or the new one, never a mix (two tuners: the last rename wins). */
    static _Thread_local unsigned counter;
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s.%ld.%lx.%lx.%u.tmp", name, (long)getpid(),
             (unsigned long)(uintptr_t)&counter, (unsigned long)ts.tv_nsec, counter++);
    FILE *f = clattn__create_temp(dfd, tmp);
    int ok = f != NULL, saved = errno;
    if (ok) {
        const size_t len = strlen(text);
        ok = fwrite(text, 1, len, f) == len;
        ok = (fclose(f) == 0) && ok;
        ok = ok && renameat(dfd, tmp, dfd, name) == 0;
        saved = errno;
        if (!ok)
            unlinkat(dfd, tmp, 0);
    }
    if (!ok)
        snprintf(err, errsz, "cannot write %s: %s", path, strerror(saved));
    free(text);
    clattn__sweep_temps(dfd);
    close(dfd);
    return ok ? 0 : -1;
}
