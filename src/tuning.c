/* Which kernel parameters a call uses, and where they come from. Lookup order: clattn_set_params
 * override, CLATTN_PARAMS_<OP>, the user tuning file of the device, built-in tables (tuning/ in
 * the source tree, embedded), vendor defaults, generic defaults (defaults.c). What each parameter
 * means, per operation and kernel: params.h and docs/tuning.md. */
#define _POSIX_C_SOURCE 200809L /* read, struct stat: the user file is opened as cache.c opens entries */
#include "internal.h"

#include <ctype.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

int clattn__seq_q_class(int64_t seq_q) { return seq_q <= 1 ? 0 : seq_q <= 16 ? 1 : seq_q <= 128 ? 2 : 3; }

int clattn__mask_kind(int causal, int masked) { return masked ? 2 : causal ? 1 : 0; }

int clattn__log2_ceil(int64_t x)
{
    int l = 0;
    while (l < 62 && ((int64_t)1 << l) < x)
        l++;
    return l;
}

/* ---- matching a table ---- */

/* Higher is better; -1: no match. Fields must equal unless "*"; log2 seq_kv may be off by 2. */
static int entry_score(const clattn_tuning_entry *e, const clattn_bucket *b)
{
    if (e->op != b->op)
        return -1;
    const int have[4] = {e->dtype, e->head_dim, e->mask_kind, e->sq_class};
    const int want[4] = {(int)b->dtype, b->head_dim, b->mask_kind, b->seq_q_class};
    int score = 0;
    for (int i = 0; i < 4; i++) {
        if (have[i] < 0)
            continue;
        if (have[i] != want[i])
            return -1;
        score += 16;
    }
    if (e->log2_skv >= 0) {
        const int d = abs(e->log2_skv - b->log2_seq_kv);
        if (d > 2)
            return -1;
        score += 8 - 2 * d;
    }
    return score;
}

static const clattn_tuning_entry *best_entry(const clattn_tuning_table *t, const clattn_bucket *b)
{
    const clattn_tuning_entry *best = NULL;
    int best_score = -1;
    for (int i = 0; t && i < t->n; i++) {
        const int s = entry_score(&t->e[i], b);
        if (s >= 0 && s >= best_score) {
            best = &t->e[i];
            best_score = s;
        }
    }
    return best;
}

/* The environment variable of an op: CLATTN_PARAMS_<OP>. */
static const char *env_name(clattn_op op, char *buf, size_t size)
{
    snprintf(buf, size, "CLATTN_PARAMS_%s", clattn__op_name(op));
    for (char *c = buf; *c; c++)
        *c = (char)toupper((unsigned char)*c);
    return buf;
}

/* What is wrong with the list `env` of op's variable, for the origin and the tuning report: the
 * reason, and the names with each choice's largest value ("DIRECT<=5"). */
static void env_problem(clattn_op op, const char *env, char *buf, size_t size)
{
    char name[64], why[160];
    clattn_params t;
    memset(&t, 0, sizeof t);
    if (clattn__params_parse(op, env, 0, &t, NULL, why, sizeof why))
        why[0] = '\0';
    snprintf(buf, size,
             "%s=\"%.60s%s\" ignored: %s%snot 1 to %d comma-separated integers in [0, %d] or NAME=value pairs (",
             env_name(op, name, sizeof name), env, strlen(env) > 60 ? "..." : "", why, why[0] ? "; " : "",
             clattn__param_count(op), CLATTN_PARAM_MAX);
    for (int i = 0; i < clattn__param_count(op); i++) {
        const size_t n = strlen(buf);
        const int hi = clattn__param_max(op, i);
        if (hi < CLATTN_PARAM_MAX)
            snprintf(buf + n, size - n, "%s%s<=%d", i ? "," : "", clattn__param_name(op, i), hi);
        else
            snprintf(buf + n, size - n, "%s%s", i ? "," : "", clattn__param_name(op, i));
    }
    const size_t n = strlen(buf);
    snprintf(buf + n, size - n, ")");
}

/* Sources in priority order; the first that applies wins. The origin text is only formatted when
 * asked for (clattn_get_params), not on every launch. */
void clattn__params_for(const clattn_context *ctx, const clattn_bucket *b, clattn_params *p,
                        clattn_params_source *source, char *origin, size_t origin_size)
{
    clattn_params_source src;
    char line[200];
    const clattn_tuning_entry *e = NULL;
    const clattn_tuning_table *from = NULL;
    const char *vendor = NULL;
    char name[64];
    const char *env = getenv(env_name(b->op, name, sizeof name));
    memset(p, 0, sizeof *p);
    /* Defaults first: a shorter environment list keeps the trailing values of what it replaces. */
    clattn__generic_defaults(b->op, p);
    const int has_vendor = clattn__vendor_defaults(&ctx->dev, b->op, p, &vendor);
    if (ctx->override_n[b->op] > 0) {
        memcpy(p->v, ctx->override_v[b->op], sizeof p->v);
        src = CLATTN_SOURCE_OVERRIDE;
    } else if ((e = best_entry(ctx->user_tuning, b)) != NULL) {
        from = ctx->user_tuning;
        src = CLATTN_SOURCE_USER_FILE;
    } else {
        for (int i = 0; i < ctx->nbuiltin && !e; i++)
            if ((e = best_entry(ctx->builtin[i], b)) != NULL)
                from = ctx->builtin[i];
        src = e ? CLATTN_SOURCE_BUILTIN : has_vendor ? CLATTN_SOURCE_VENDOR : CLATTN_SOURCE_GENERIC;
    }
    if (e)
        memcpy(p->v, e->v, sizeof p->v);
    /* The environment beats the files and defaults, not an override. An invalid list is not
     * used; the origin says so (and clattn_tuning_report, when the context was created). */
    int env_bad = 0;
    if (src != CLATTN_SOURCE_OVERRIDE && env && *env) {
        char why[160];
        if (clattn__params_parse(b->op, env, 0, p, NULL, why, sizeof why))
            src = CLATTN_SOURCE_ENVIRONMENT;
        else
            env_bad = 1;
    }
    if (source)
        *source = src;
    if (!origin || !origin_size)
        return;
    if (e)
        clattn__tuning_entry_text(e, line, sizeof line);
    char path[4200] = "";
    switch (src) {
    case CLATTN_SOURCE_OVERRIDE:
        snprintf(origin, origin_size, "clattn_set_params");
        break;
    case CLATTN_SOURCE_ENVIRONMENT:
        snprintf(origin, origin_size, "%s=%.200s", name, env);
        break;
    case CLATTN_SOURCE_USER_FILE:
        if (!clattn__tuning_file(ctx, path, sizeof path))
            path[0] = '\0';
        snprintf(origin, origin_size, "%.300s%s: %s", path,
                 ctx->user_driver_changed ? " (written under another driver)" : "", line);
        break;
    case CLATTN_SOURCE_BUILTIN:
        snprintf(origin, origin_size, "built-in table for \"%.200s\": %.180s", from->device, line);
        break;
    case CLATTN_SOURCE_VENDOR:
        snprintf(origin, origin_size, "%s", vendor);
        break;
    case CLATTN_SOURCE_GENERIC:
        snprintf(origin, origin_size, "generic defaults");
        break;
    }
    if (env_bad) {
        char why[256];
        env_problem(b->op, env, why, sizeof why);
        const size_t n = strlen(origin);
        snprintf(origin + n, origin_size - n, "; %s", why);
    }
}

clattn_params_source clattn__default_params(const clattn_context *ctx, const clattn_bucket *b,
                                            clattn_params *p)
{
    clattn_params_source src;
    clattn__params_for(ctx, b, p, &src, NULL, 0);
    return src;
}

/* ---- the context's tables ---- */

int clattn__tuning_file(const clattn_context *ctx, char *buf, size_t size)
{
    if (!ctx->tuning_dir[0])
        return 0;
    clattn_hash h;
    clattn__hash_init(&h);
    clattn__hash_str(&h, ctx->dev.key);
    char hex[33];
    clattn__hash_hex(&h, hex);
    int n = snprintf(buf, size, "%s/%.16s.tuning", ctx->tuning_dir, hex);
    return n > 0 && (size_t)n < size;
}

/* Appends "; <message>" to the context's tuning report (truncated when full). */
static void report(clattn_context *ctx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void report(clattn_context *ctx, const char *fmt, ...)
{
    char *r = ctx->tuning_report;
    const size_t size = sizeof ctx->tuning_report;
    size_t n = strlen(r);
    if (n && n + 2 < size) {
        r[n++] = ';';
        r[n++] = ' ';
        r[n] = '\0';
    }
    if (n + 1 < size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r + n, size - n, fmt, ap);
        va_end(ap);
    }
}

/* Every part of `pattern` separated by " & " is a case-insensitive substring of `hay`. */
static int pattern_matches(const char *pattern, const char *hay)
{
    char pat[512];
    snprintf(pat, sizeof pat, "%s", pattern);
    for (char *part = pat; part && *part;) {
        char *next = strstr(part, " & ");
        if (next) {
            *next = '\0';
            next += 3;
        }
        const size_t n = strlen(part);
        int found = 0;
        for (const char *h = hay; *h && !found; h++)
            found = strncasecmp(h, part, n) == 0;
        if (!found)
            return 0;
        part = next;
    }
    return 1;
}

int clattn__is_builtin_table(const char *name)
{
    const size_t n = strlen(name);
    return n > 7 && strcmp(name + n - 7, ".tuning") == 0;
}

static void load_builtin(clattn_context *ctx)
{
    char hay[600];
    snprintf(hay, sizeof hay, "%s | %s", ctx->dev.platform_name, ctx->dev.name);
    for (int i = 0; i < clattn_kernel_source_count && ctx->nbuiltin < 4; i++) {
        const clattn_kernel_source *s = &clattn_kernel_sources[i];
        if (!clattn__is_builtin_table(s->name))
            continue;
        clattn_tuning_table *t = calloc(1, sizeof *t);
        char err[200];
        if (!t)
            return;
        if (clattn__tuning_parse(s->text, s->length, t, err, sizeof err) != 0 ||
            !t->device_is_pattern || !pattern_matches(t->device, hay)) {
            clattn__tuning_free(t);
            free(t);
            continue;
        }
        ctx->builtin[ctx->nbuiltin++] = t;
        report(ctx, "built-in table %s applies", s->name);
    }
}

/* A user file that exists but is not read: in the report, and kept apart for clattn-tune, which
 * must not replace such a file without a word (it would drop what the file holds). */
#define IGNORED(...)                                                                               \
    do {                                                                                           \
        snprintf(ctx->user_tuning_ignored, sizeof ctx->user_tuning_ignored, __VA_ARGS__);          \
        report(ctx, "%s", ctx->user_tuning_ignored);                                               \
    } while (0)

static void load_user(clattn_context *ctx)
{
    enum { MAX_FILE = 1 << 20 };
    ctx->user_tuning_ignored[0] = '\0';
    char path[4200];
    if (!clattn__tuning_file(ctx, path, sizeof path)) {
        report(ctx, "no user tuning directory (set CLATTN_TUNING_DIR)");
        return;
    }
    /* Only a trusted regular file is read, as in the binary cache (cache.c, clattn__open_entry):
     * opening a FIFO planted under the file's name would block clattn_create for ever, a directory
     * or a device is no tuning file either, and one that anyone but the user (or root) could have
     * written would steer which kernels run. */
    struct stat st;
    const char *why = NULL;
    char untrusted[300];
    int fd = -1;
    switch (clattn__open_entry(ctx->tuning_dir, strrchr(path, '/') + 1, &fd, &st, untrusted, sizeof untrusted)) {
    case CLATTN_ENTRY_ABSENT:
        report(ctx, "no user tuning file %.400s", path);
        return;
    case CLATTN_ENTRY_NOT_FILE:
        IGNORED("ignored user tuning file %.300s: %s", path, untrusted);
        return;
    case CLATTN_ENTRY_UNTRUSTED:
        IGNORED("ignored user tuning file %.300s: not trusted: %s (docs/guarantees.md)", path, untrusted);
        return;
    case CLATTN_ENTRY_OK:
        break;
    }
    char *buf = NULL;
    size_t len = 0;
    if (st.st_size > MAX_FILE) {
        why = "larger than 1 MiB";
    } else if ((buf = malloc((size_t)st.st_size + 1)) != NULL) {
        /* One byte more than fstat said: a file that grew meanwhile is being rewritten in place. */
        const size_t size = (size_t)st.st_size;
        ssize_t r = 0;
        while (len <= size && (r = read(fd, buf + len, size + 1 - len)) > 0)
            len += (size_t)r;
        if (r < 0)
            why = "read error";
        else if (len > size)
            why = "changed while being read";
    }
    close(fd);
    clattn_tuning_table *t = NULL;
    char err[200];
    if (!why && (!buf || !(t = calloc(1, sizeof *t))))
        why = "out of host memory";
    if (why) {
        IGNORED("ignored user tuning file %.300s: %s", path, why);
    } else if (clattn__tuning_parse(buf, len, t, err, sizeof err) != 0) {
        IGNORED("ignored user tuning file %.300s: %.300s", path, err);
    } else if (t->device_is_pattern || strcmp(t->device, ctx->dev.key) != 0) {
        IGNORED("ignored user tuning file %.300s: written for another device (%.300s)", path, t->device);
    } else {
        ctx->user_tuning = t;
        ctx->user_driver_changed = strcmp(t->driver, ctx->dev.driver) != 0;
        report(ctx, "user tuning file %.400s: %d entries", path, t->n);
        if (ctx->user_driver_changed)
            report(ctx, "its driver tag \"%.200s\" differs from the driver in use: entries are "
                        "still used, re-run clattn-tune to re-check them",
                   t->driver);
        t = NULL;
    }
    if (t) {
        clattn__tuning_free(t);
        free(t);
    }
    free(buf);
}
#undef IGNORED

void clattn__tuning_release(clattn_context *ctx)
{
    if (ctx->user_tuning) {
        clattn__tuning_free(ctx->user_tuning);
        free(ctx->user_tuning);
        ctx->user_tuning = NULL;
    }
    for (int i = 0; i < ctx->nbuiltin; i++) {
        clattn__tuning_free(ctx->builtin[i]);
        free(ctx->builtin[i]);
    }
    ctx->nbuiltin = 0;
    ctx->user_driver_changed = 0;
    ctx->user_tuning_ignored[0] = '\0';
    ctx->tuning_report[0] = '\0';
}

void clattn__tuning_init(clattn_context *ctx)
{
    const char *dir = getenv("CLATTN_TUNING_DIR");
    int n;
    if (dir && *dir)
        n = snprintf(ctx->tuning_dir, sizeof ctx->tuning_dir, "%s", dir);
    else if (ctx->cache_dir[0])
        n = snprintf(ctx->tuning_dir, sizeof ctx->tuning_dir, "%s/tuning", ctx->cache_dir);
    else
        n = -1;
    if (n < 0 || (size_t)n >= sizeof ctx->tuning_dir)
        ctx->tuning_dir[0] = '\0';
    /* The variables are read again for every call; a bad one is named here once, first,
     * so that a long report of the files cannot crowd it out. */
    for (int op = 0; op < CLATTN_OP_COUNT; op++) {
        char name[64], why[256];
        const char *env = getenv(env_name((clattn_op)op, name, sizeof name));
        clattn_params p;
        memset(&p, 0, sizeof p);
        if (env && *env && !clattn__params_parse((clattn_op)op, env, 0, &p, NULL, why, sizeof why)) {
            env_problem((clattn_op)op, env, why, sizeof why);
            report(ctx, "%s", why);
        }
    }
    /* CLATTN_NREG16 (experiments): the CPU kernels' register tiles for another vector register
     * file than the one the device reports (device.c), e.g. AVX2's (8) on an AVX-512 machine
     * with PoCL compiling for haswell (POCL_LLVM_CPU_NAME=haswell POCL_KERNELLIB_NAME=avx2,
     * where PoCL still reports the host's native width). */
    const char *nreg = getenv("CLATTN_NREG16");
    ctx->dev.nreg16 = ctx->dev.nreg16_device; /* a reload without the variable undoes it */
    if (nreg && *nreg) {
        if (!(ctx->dev.type & CL_DEVICE_TYPE_CPU))
            report(ctx, "CLATTN_NREG16=\"%.40s\" ignored: the device is not a CPU", nreg);
        else if (strcmp(nreg, "4") == 0 || strcmp(nreg, "8") == 0 || strcmp(nreg, "32") == 0)
            ctx->dev.nreg16 = atoi(nreg);
        else
            report(ctx, "CLATTN_NREG16=\"%.40s\" ignored: expected 4, 8 or 32", nreg);
    }
    load_user(ctx);
    load_builtin(ctx);
}

/* ---- public API ---- */

const char *clattn_operation_name(clattn_operation op)
{
    return (unsigned)op < CLATTN_OP_COUNT ? clattn__op_name((clattn_op)op) : NULL;
}

int clattn_param_count(clattn_operation op)
{
    return (unsigned)op < CLATTN_OP_COUNT ? clattn__param_count((clattn_op)op) : 0;
}

const char *clattn_param_name(clattn_operation op, int index)
{
    return (unsigned)op < CLATTN_OP_COUNT ? clattn__param_name((clattn_op)op, index) : NULL;
}

int clattn_param_max(clattn_operation op, int index)
{
    return (unsigned)op < CLATTN_OP_COUNT ? clattn__param_max((clattn_op)op, index) : -1;
}

const char *clattn_param_value_name(clattn_operation op, int index, int value)
{
    if ((unsigned)op >= CLATTN_OP_COUNT || index < 0 || index != clattn__param_choice_slot((clattn_op)op))
        return NULL;
    return clattn__kernel_choice_name((clattn_op)op, value);
}

const char *clattn_params_source_name(clattn_params_source source)
{
    static const char *const names[] = {"generic", "vendor", "built-in", "user file", "environment",
                                        "override"};
    return (unsigned)source < sizeof names / sizeof names[0] ? names[source] : "?";
}

clattn_status clattn_set_params(clattn_context *ctx, clattn_operation op, const int *values, int count)
{
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_set_params: ctx must not be NULL");
    clattn__clear_error(ctx);
    if ((unsigned)op >= CLATTN_OP_COUNT)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "op is not a clattn_operation (%d)", (int)op);
    if (!values && count == 0) {
        ctx->override_n[op] = 0;
        return CLATTN_SUCCESS;
    }
    if (!values)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "values is NULL but count is %d", count);
    const clattn_op o = (clattn_op)op;
    if (count != clattn__param_count(o))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "count is %d; %s takes %d parameters", count,
                            clattn__op_name(o), clattn__param_count(o));
    for (int i = 0; i < count; i++)
        if (values[i] < 0 || values[i] > clattn__param_max(o, i))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "values[%d] (%s) is %d, not in [0, %d]", i,
                                clattn__param_name(o, i), values[i], clattn__param_max(o, i));
    memset(ctx->override_v[op], 0, sizeof ctx->override_v[op]);
    memcpy(ctx->override_v[op], values, (size_t)count * sizeof *values);
    ctx->override_n[op] = count;
    return CLATTN_SUCCESS;
}

clattn_status clattn_get_params(clattn_context *ctx, const clattn_problem_class *pc,
                                clattn_kernel_params *out)
{
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_get_params: ctx must not be NULL");
    clattn__clear_error(ctx);
    if (!pc || !out)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "%s must not be NULL", pc ? "out" : "pc");
    if ((unsigned)pc->operation >= CLATTN_OP_COUNT)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "pc->operation is not a clattn_operation (%d)",
                            (int)pc->operation);
    if ((unsigned)pc->dtype > CLATTN_BF16)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "pc->dtype must be f32, f16 or bf16, the query's type (got %d)",
                            (int)pc->dtype);
    if (pc->head_dim < 0 || pc->head_dim > CLATTN_MAX_HEAD_DIM || pc->seq_q < 0 || pc->seq_kv < 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "pc sizes out of range (head_dim %lld, seq_q %lld, seq_kv %lld)",
                            (long long)pc->head_dim, (long long)pc->seq_q, (long long)pc->seq_kv);
    const int merge = pc->operation == CLATTN_OPERATION_MERGE;
    if ((merge || pc->operation == CLATTN_OPERATION_SOFTMAX) && pc->head_dim != 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "pc->head_dim must be 0 for %s (got %lld)",
                            clattn__op_name((clattn_op)pc->operation), (long long)pc->head_dim);
    if (merge && (pc->causal || pc->masked))
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "merge has no causal or masked class (pc->causal %d, pc->masked %d)", pc->causal,
                            pc->masked);
    /* merge looks its parameters up in one bucket whatever the sizes and the parts' types
     * (merge.c): answer from that one, as the call would run. */
    const clattn_bucket b = merge ? CLATTN_MERGE_BUCKET
                                  : (clattn_bucket){(clattn_op)pc->operation, pc->dtype, (int)pc->head_dim,
                                                    clattn__seq_q_class(pc->seq_q), clattn__log2_ceil(pc->seq_kv),
                                                    clattn__mask_kind(pc->causal != 0, pc->masked != 0)};
    clattn_params p;
    memset(out, 0, sizeof *out);
    clattn__params_for(ctx, &b, &p, &out->source, out->origin, sizeof out->origin);
    /* A tuning file's or table's kernel=mma where the matrix kernel cannot run (no matrix units,
     * CLATTN_MATRIX=off) gives way to the FMA kernels' defaults, as the call does (fused.c). */
    const int decode = pc->operation == CLATTN_OPERATION_DECODE;
    if ((decode || pc->operation == CLATTN_OPERATION_FUSED) && out->source < CLATTN_SOURCE_ENVIRONMENT &&
        (decode ? p.decode.DIRECT == CLATTN_KERNEL_MMA_DECODE : p.fused.DIRECT == CLATTN_KERNEL_MMA_FUSED) &&
        clattn__matrix_unavailable(ctx)) {
        const char *what;
        clattn__generic_defaults(b.op, &p);
        out->source = clattn__vendor_defaults(&ctx->dev, b.op, &p, &what) ? CLATTN_SOURCE_VENDOR
                                                                          : CLATTN_SOURCE_GENERIC;
        const size_t len = strlen(out->origin);
        snprintf(out->origin + len, sizeof out->origin - len,
                 " names kernel=mma, which cannot run here (%.150s): %s instead",
                 ctx->matrix_mode == CLATTN_MATRIX_OFF ? "CLATTN_MATRIX=off" : ctx->matrix_why,
                 out->source == CLATTN_SOURCE_VENDOR ? what : "generic defaults");
    }
    out->count = clattn__param_count((clattn_op)pc->operation);
    memcpy(out->values, p.v, sizeof out->values);
    return CLATTN_SUCCESS;
}

clattn_status clattn_get_call_params(clattn_context *ctx, const clattn_problem_class *pc, int64_t heads_q,
                                     int64_t heads_kv, int64_t head_dim_v, clattn_kernel_params *out)
{
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_get_call_params: ctx must not be NULL");
    if (heads_q < 1 || heads_kv < 1 || heads_q % heads_kv != 0 || head_dim_v < 0 ||
        head_dim_v > CLATTN_MAX_HEAD_DIM_V) {
        clattn__clear_error(ctx);
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "heads_q %lld, heads_kv %lld, head_dim_v %lld: heads must be positive, heads_kv "
                            "dividing heads_q, head_dim_v in [0, %d]",
                            (long long)heads_q, (long long)heads_kv, (long long)head_dim_v, CLATTN_MAX_HEAD_DIM_V);
    }
    const clattn_status st = clattn_get_params(ctx, pc, out);
    if (st != CLATTN_SUCCESS)
        return st;
    /* GPUs' defaults run the tiled kernel for decode with many query rows per kv head
     * (defaults.c): what the call runs, which a problem class alone does not say. */
    const int64_t rows = heads_q / heads_kv * (pc->seq_q > 0 ? pc->seq_q : 1);
    if (pc->operation == CLATTN_OPERATION_DECODE &&
        clattn__decode_tiled_default(ctx, rows, pc->head_dim, head_dim_v > 0 ? head_dim_v : pc->head_dim,
                                     out->source, out->values)) {
        const size_t len = strlen(out->origin);
        snprintf(out->origin + len, sizeof out->origin - len,
                 "; the tiled kernel for %lld query rows per kv head", (long long)rows);
    }
    /* The matrix kernel where the library picks it itself (matrix.c), with its own tile (WGY and
     * NS 0: the kernel's defaults). */
    clattn_params mp;
    memcpy(mp.v, out->values, sizeof mp.v);
    const int decode = pc->operation == CLATTN_OPERATION_DECODE;
    int *direct = decode ? &mp.decode.DIRECT : &mp.fused.DIRECT;
    const int mma = decode ? CLATTN_KERNEL_MMA_DECODE : CLATTN_KERNEL_MMA_FUSED;
    if ((decode || pc->operation == CLATTN_OPERATION_FUSED) && *direct != mma &&
        clattn__matrix_auto(ctx, (int)pc->dtype, pc->seq_q > 0 ? pc->seq_q : 1, rows, out->source)) {
        *direct = mma;
        mp.fused.WGY = mp.fused.NS = 0; /* slots 1 and 3 in FUSED and DECODE alike */
        memcpy(out->values, mp.v, sizeof mp.v);
        const size_t len = strlen(out->origin);
        snprintf(out->origin + len, sizeof out->origin - len, "; the matrix kernel (%s)",
                 clattn_matrix_report(ctx));
    }
    return CLATTN_SUCCESS;
}

const char *clattn_tuning_report(const clattn_context *ctx) { return ctx ? ctx->tuning_report : ""; }

clattn_status clattn_reload_tuning(clattn_context *ctx)
{
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_reload_tuning: ctx must not be NULL");
    clattn__clear_error(ctx);
    const int nreg16 = ctx->dev.nreg16;
    clattn__tuning_release(ctx);
    clattn__tuning_init(ctx);
    /* Programs are cached by file and operation options; -DNREG16 comes from the context, so
     * programs built for other register tiles go (no call holds a kernel between calls). */
    if (ctx->dev.nreg16 != nreg16)
        clattn__release_programs(ctx);
    return CLATTN_SUCCESS;
}

clattn_status clattn_tuning_path(const clattn_context *ctx, char *buf, size_t size)
{
    if (!ctx)
        return clattn__fail(NULL, CLATTN_INVALID_ARGUMENT, "clattn_tuning_path: ctx must not be NULL");
    /* Like every call, this one resets the last error; ctx is const only because the call changes
     * no setting. */
    clattn_context *c = (clattn_context *)ctx;
    clattn__clear_error(c);
    if (!buf || size == 0)
        return clattn__fail(c, CLATTN_INVALID_ARGUMENT, "clattn_tuning_path: buf is %s and size %zu",
                            buf ? "given" : "NULL", size);
    char path[4200];
    if (!clattn__tuning_file(ctx, path, sizeof path))
        return clattn__fail(c, CLATTN_IO_ERROR,
                            "no tuning directory: no cache directory and no CLATTN_TUNING_DIR, or a path "
                            "longer than %zu bytes", sizeof path - 1);
    if (strlen(path) >= size)
        return clattn__fail(c, CLATTN_INVALID_ARGUMENT, "buf of %zu bytes is too small for the path (needs %zu)",
                            size, strlen(path) + 1);
    memcpy(buf, path, strlen(path) + 1); /* buf is untouched on failure */
    return CLATTN_SUCCESS;
}
