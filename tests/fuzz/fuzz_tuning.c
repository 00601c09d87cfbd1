/*
 * libFuzzer harness: the tuning-file reader (src/store.c). The input is the text of a tuning file,
 * given to clattn__tuning_parse as it is.
 *
 *   - Rejected: the table is empty (no entries, no allocation) and the message reads "line N: why".
 *   - Accepted: a header and a device (or match) line were there; every entry's op is valid, its
 *     value count is clattn__param_count(op) and its values are in [0, clattn__param_max]; every
 *     field is "*" (-1) or in range (dtype 0..2, head_dim 1..CLATTN_MAX_HEAD_DIM, mask 0..2, seq_q
 *     class 0..3, log2 seq_kv 0..62), and no two entries share a bucket (a later line replaces an
 *     earlier one).
 *   - Round trip: clattn__tuning_format of the table parses again to the same device, kind of
 *     device line, driver and entries, and formatting that gives the same text again.
 *   - Lookup (clattn__params_for, src/tuning.c): with the table as the user file, and again as a
 *     built-in table, each entry's bucket (wildcards made concrete) and a neighbour of it get the
 *     values of a best-scoring matching entry, as tuning.c documents the score (16 per field that
 *     is given, 8 - 2·|Δlog2 seq_kv| within 2, the rest "*"), from the right source; a bucket no
 *     entry matches falls through to the generic defaults.
 * No OpenCL device is needed: the lookup only reads a bare context's tables and overrides.
 */
#define _POSIX_C_SOURCE 200809L /* unsetenv */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_TEXT (64u << 10) /* longer inputs only repeat what shorter ones reach */

static clattn_context *ctx; /* a bare struct: user_tuning, builtin and the overrides are used */

static void die(const char *what, int line)
{
    fprintf(stderr, "\n==clattn-fuzz== contract violation: %s (entry %d)\n", what, line);
    abort();
}

static void setup(void)
{
    if (ctx != NULL)
        return;
    ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL)
        die("out of memory", -1);
    /* CLATTN_PARAMS_<OP> would beat the table. */
    for (int op = 0; op < CLATTN_OP_COUNT; ++op) {
        char name[64];
        snprintf(name, sizeof name, "CLATTN_PARAMS_%s", clattn__op_name((clattn_op)op));
        for (char *c = name; *c; ++c)
            if (*c >= 'a' && *c <= 'z')
                *c = (char)(*c - 'a' + 'A');
        unsetenv(name);
    }
}

static int in_range(int v, int lo, int hi)
{
    return v == -1 || (v >= lo && v <= hi);
}

static void check_entries(const clattn_tuning_table *t)
{
    if (t->n < 0 || t->n > t->cap || (t->n > 0 && t->e == NULL))
        die("entry count and storage disagree", -1);
    for (int i = 0; i < t->n; ++i) {
        const clattn_tuning_entry *e = &t->e[i];
        if ((unsigned)e->op >= CLATTN_OP_COUNT)
            die("an accepted entry has an invalid op", i);
        if (e->n != clattn__param_count(e->op))
            die("an accepted entry's value count is not the op's parameter count", i);
        for (int k = 0; k < CLATTN_MAX_PARAMS; ++k)
            if (k < e->n ? (e->v[k] < 0 || e->v[k] > clattn__param_max(e->op, k)) : e->v[k] != 0)
                die("an accepted entry has a value outside [0, clattn__param_max] (or garbage past its count)",
                    i);
        if (!in_range(e->dtype, 0, 2) || !in_range(e->head_dim, 1, CLATTN_MAX_HEAD_DIM) ||
            !in_range(e->mask_kind, 0, 2) || !in_range(e->sq_class, 0, 3) || !in_range(e->log2_skv, 0, 62))
            die("an accepted entry has a field out of range", i);
        for (int j = 0; j < i; ++j) {
            const clattn_tuning_entry *x = &t->e[j];
            if (x->op == e->op && x->dtype == e->dtype && x->head_dim == e->head_dim &&
                x->mask_kind == e->mask_kind && x->sq_class == e->sq_class && x->log2_skv == e->log2_skv)
                die("two accepted entries share one bucket", i);
        }
    }
}

static void check_same(const clattn_tuning_table *a, const clattn_tuning_table *b)
{
    if (strcmp(a->device, b->device) != 0 || a->device_is_pattern != b->device_is_pattern)
        die("the device line changed in a format/parse round trip", -1);
    if (strcmp(a->driver, b->driver) != 0)
        die("the driver changed in a format/parse round trip", -1);
    if (a->n != b->n)
        die("the entry count changed in a format/parse round trip", -1);
    for (int i = 0; i < a->n; ++i)
        if (memcmp(&a->e[i], &b->e[i], sizeof a->e[i]) != 0)
            die("an entry changed in a format/parse round trip", i);
}

/* The score tuning.c documents, written independently; -1 when e does not match b. */
static int oracle_score(const clattn_tuning_entry *e, const clattn_bucket *b)
{
    if (e->op != b->op)
        return -1;
    const int have[4] = {e->dtype, e->head_dim, e->mask_kind, e->sq_class};
    const int want[4] = {(int)b->dtype, b->head_dim, b->mask_kind, b->seq_q_class};
    int score = 0;
    for (int i = 0; i < 4; ++i) {
        if (have[i] == -1)
            continue;
        if (have[i] != want[i])
            return -1;
        score += 16;
    }
    if (e->log2_skv != -1) {
        const int d = e->log2_skv > b->log2_seq_kv ? e->log2_skv - b->log2_seq_kv : b->log2_seq_kv - e->log2_skv;
        if (d > 2)
            return -1;
        score += 8 - 2 * d;
    }
    return score;
}

static void check_lookup(const clattn_tuning_table *t, const clattn_bucket *b, clattn_params_source want_src,
                         int entry)
{
    int best = -1;
    for (int i = 0; i < t->n; ++i) {
        const int s = oracle_score(&t->e[i], b);
        best = s > best ? s : best;
    }
    clattn_params p;
    clattn_params_source src = (clattn_params_source)-1;
    char origin[512] = "";
    clattn__params_for(ctx, b, &p, &src, origin, sizeof origin);
    if (origin[0] == '\0')
        die("the lookup gave no origin text", entry);
    if (best < 0) {
        if (src != CLATTN_SOURCE_GENERIC)
            die("a bucket no entry matches did not fall through to the generic defaults", entry);
        return;
    }
    if (src != want_src)
        die("a bucket an entry matches did not come from the table", entry);
    for (int i = 0; i < t->n; ++i)
        if (oracle_score(&t->e[i], b) == best && memcmp(p.v, t->e[i].v, sizeof p.v) == 0)
            return;
    die("the lookup did not return the values of a best-matching entry", entry);
}

/* Each entry's bucket with its wildcards made concrete, and a neighbour (other log2 seq_kv and,
 * where the entry has a wildcard, another concrete value), under the table as `src`. */
static void check_lookups(clattn_tuning_table *t, clattn_params_source src)
{
    ctx->user_tuning = src == CLATTN_SOURCE_USER_FILE ? t : NULL;
    ctx->builtin[0] = t;
    ctx->nbuiltin = src == CLATTN_SOURCE_BUILTIN ? 1 : 0;
    for (int i = 0; i < t->n && i < 64; ++i) {
        const clattn_tuning_entry *e = &t->e[i];
        for (int variant = 0; variant < 2; ++variant) {
            clattn_bucket b;
            b.op = e->op;
            b.dtype = (clattn_dtype)(e->dtype >= 0 ? e->dtype : variant ? 2 : 0);
            b.head_dim = e->head_dim >= 0 ? e->head_dim : variant ? CLATTN_MAX_HEAD_DIM : 64;
            b.mask_kind = e->mask_kind >= 0 ? e->mask_kind : variant ? 2 : 0;
            b.seq_q_class = e->sq_class >= 0 ? e->sq_class : variant ? 0 : 3;
            const int l = e->log2_skv >= 0 ? e->log2_skv : 10;
            b.log2_seq_kv = variant ? (l + 1 + i % 3) % 63 : l;
            check_lookup(t, &b, src, i);
        }
    }
    /* An op without entries, if there is one. */
    for (int op = 0; op < CLATTN_OP_COUNT; ++op) {
        int used = 0;
        for (int i = 0; i < t->n && !used; ++i)
            used = t->e[i].op == (clattn_op)op;
        if (!used) {
            const clattn_bucket b = {(clattn_op)op, CLATTN_F32, 64, 3, 10, 0};
            check_lookup(t, &b, src, -1);
            break;
        }
    }
    ctx->user_tuning = NULL;
    ctx->builtin[0] = NULL;
    ctx->nbuiltin = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (size > MAX_TEXT)
        return 0;
    /* An exact-size copy, so AddressSanitizer sees any read past the end of the text. */
    char *text = malloc(size ? size : 1);
    if (text == NULL)
        die("out of memory", -1);
    if (size)
        memcpy(text, data, size);
    clattn_tuning_table t;
    memset(&t, 0x5a, sizeof t); /* the parser must set every field, whatever the outcome */
    char err[200];
    memset(err, 0x5a, sizeof err);
    const int rc = clattn__tuning_parse(text, size, &t, err, sizeof err);
    free(text);
    if (rc != 0) {
        if (rc != -1)
            die("clattn__tuning_parse returned neither 0 nor -1", -1);
        if (t.n != 0 || t.e != NULL || t.cap != 0)
            die("a rejected file left entries in the table", -1);
        if (memchr(err, '\0', sizeof err) == NULL || strncmp(err, "line ", 5) != 0)
            die("a rejected file has no \"line N: why\" message", -1);
        return 0;
    }
    if (memchr(t.device, '\0', sizeof t.device) == NULL || t.device[0] == '\0')
        die("an accepted file has no device", -1);
    if (memchr(t.driver, '\0', sizeof t.driver) == NULL)
        die("an accepted file has an unterminated driver", -1);
    check_entries(&t);

    char *again = clattn__tuning_format(&t);
    if (again == NULL)
        die("an accepted table could not be formatted", -1);
    clattn_tuning_table u;
    char err2[200] = "";
    if (clattn__tuning_parse(again, strlen(again), &u, err2, sizeof err2) != 0) {
        fprintf(stderr, "reparse: %s\n--- formatted ---\n%s---\n", err2, again);
        die("the formatted table does not parse", -1);
    }
    check_same(&t, &u);
    char *third = clattn__tuning_format(&u);
    if (third == NULL || strcmp(third, again) != 0)
        die("formatting the reparsed table gave another text", -1);
    free(third);
    free(again);
    clattn__tuning_free(&u);

    check_lookups(&t, CLATTN_SOURCE_USER_FILE);
    check_lookups(&t, CLATTN_SOURCE_BUILTIN);
    clattn__tuning_free(&t);
    return 0;
}
