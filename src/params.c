/* The parameter schema (params.h) as data: names, bounds, candidates and kernel-choice names per
 * operation, and the one reader and writer of parameter lists that the environment variables,
 * tuning files and clattn-tune share. */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define C(...) {__VA_ARGS__}

typedef struct param_info {
    const char *name;
    int max;
    int ncand;
    int cand[8];
    const char *meaning;
} param_info;

typedef struct op_schema {
    const char *name;
    int count;
    param_info p[CLATTN_MAX_PARAMS];
} op_schema;

#define CLATTN_PARAM_INFO_(name, max, cand, meaning)                                                 \
    {#name, max, (int)(sizeof(int[])cand / sizeof(int)), cand, meaning},
#define CLATTN_PARAM_ONE_(name, max, cand, meaning) +1

static const op_schema schema[CLATTN_OP_COUNT] = {
    {"scores", 0 CLATTN_GEMM_PARAMS(CLATTN_PARAM_ONE_), {CLATTN_GEMM_PARAMS(CLATTN_PARAM_INFO_)}},
    {"pv", 0 CLATTN_PV_PARAMS(CLATTN_PARAM_ONE_), {CLATTN_PV_PARAMS(CLATTN_PARAM_INFO_)}},
    {"softmax", 0 CLATTN_SOFTMAX_PARAMS(CLATTN_PARAM_ONE_), {CLATTN_SOFTMAX_PARAMS(CLATTN_PARAM_INFO_)}},
    {"fused", 0 CLATTN_FUSED_PARAMS(CLATTN_PARAM_ONE_), {CLATTN_FUSED_PARAMS(CLATTN_PARAM_INFO_)}},
    {"decode", 0 CLATTN_DECODE_PARAMS(CLATTN_PARAM_ONE_), {CLATTN_DECODE_PARAMS(CLATTN_PARAM_INFO_)}},
    {"merge", 0 CLATTN_MERGE_PARAMS(CLATTN_PARAM_ONE_), {CLATTN_MERGE_PARAMS(CLATTN_PARAM_INFO_)}},
};

/* The views of clattn_params line up with the tables. */
_Static_assert(sizeof(((clattn_params *)0)->gemm) == sizeof(int) * (0 CLATTN_GEMM_PARAMS(CLATTN_PARAM_ONE_)),
               "gemm view");
_Static_assert(sizeof(((clattn_params *)0)->decode) == sizeof(((clattn_params *)0)->decode_rows) &&
                   sizeof(((clattn_params *)0)->decode) == sizeof(((clattn_params *)0)->decode_lanes),
               "decode views");
_Static_assert(0 CLATTN_DECODE_PARAMS(CLATTN_PARAM_ONE_) <= CLATTN_MAX_PARAMS, "decode count");
_Static_assert(0 CLATTN_GEMM_PARAMS(CLATTN_PARAM_ONE_) <= CLATTN_MAX_PARAMS, "gemm count");

typedef struct choice_name {
    clattn_op op;
    int value;
    const char *name;
    const char *what;
} choice_name;

#define CLATTN_CHOICE_(op, value, name, what) {CLATTN_OP_##op, value, #name, what},
static const choice_name choices[] = {CLATTN_KERNEL_CHOICES(CLATTN_CHOICE_)};

typedef struct alias_name {
    const char *name;
    int slot;
} alias_name;
#define CLATTN_ALIAS_(name, slot) {#name, slot},
static const alias_name decode_aliases[] = {CLATTN_DECODE_ALIASES(CLATTN_ALIAS_)};

const char *clattn__op_name(clattn_op op) { return op < CLATTN_OP_COUNT ? schema[op].name : "?"; }

int clattn__param_count(clattn_op op) { return op < CLATTN_OP_COUNT ? schema[op].count : 0; }

const char *clattn__param_name(clattn_op op, int i)
{
    return op < CLATTN_OP_COUNT && i >= 0 && i < schema[op].count ? schema[op].p[i].name : NULL;
}

const char *clattn__param_meaning(clattn_op op, int i)
{
    return op < CLATTN_OP_COUNT && i >= 0 && i < schema[op].count ? schema[op].p[i].meaning : NULL;
}

int clattn__param_max(clattn_op op, int i)
{
    return op < CLATTN_OP_COUNT && i >= 0 && i < schema[op].count ? schema[op].p[i].max : -1;
}

int clattn__param_candidates(clattn_op op, int i, const int **vals)
{
    if (op >= CLATTN_OP_COUNT || i < 0 || i >= schema[op].count)
        return 0;
    *vals = schema[op].p[i].cand;
    return schema[op].p[i].ncand;
}

int clattn__param_choice_slot(clattn_op op)
{
    for (int i = 0; op < CLATTN_OP_COUNT && i < schema[op].count; i++)
        if (strcmp(schema[op].p[i].name, "DIRECT") == 0)
            return i;
    return -1;
}

const char *clattn__kernel_choice_name(clattn_op op, int value)
{
    for (size_t i = 0; i < sizeof choices / sizeof choices[0]; i++)
        if (choices[i].op == op && choices[i].value == value)
            return choices[i].name;
    return NULL;
}

/* The slot of `name` in op's table (any case; "kernel" is DIRECT; decode also takes the -D names
 * of decode_rows and decode_lanes), or -1. */
static int slot_of(clattn_op op, const char *name, size_t len)
{
    for (int i = 0; i < schema[op].count; i++)
        if (strlen(schema[op].p[i].name) == len && strncasecmp(schema[op].p[i].name, name, len) == 0)
            return i;
    if (len == 6 && strncasecmp(name, "kernel", 6) == 0)
        return clattn__param_choice_slot(op);
    if (op == CLATTN_OP_DECODE)
        for (size_t i = 0; i < sizeof decode_aliases / sizeof decode_aliases[0]; i++)
            if (strlen(decode_aliases[i].name) == len && strncasecmp(decode_aliases[i].name, name, len) == 0)
                return decode_aliases[i].slot;
    return -1;
}

/* A plain decimal integer in [0, max] (no sign, no blank) spanning [s, end). */
static int parse_value(const char *s, const char *end, int max, int *out)
{
    long v = 0;
    if (s == end)
        return 0;
    for (const char *c = s; c < end; c++) {
        if (!isdigit((unsigned char)*c))
            return 0;
        v = v * 10 + (*c - '0');
        if (v > max)
            return 0;
    }
    *out = (int)v;
    return 1;
}

int clattn__params_parse(clattn_op op, const char *text, int named_only, clattn_params *p, int *count,
                         char *err, size_t errsz)
{
    clattn_params t = *p;
    int n = 0, named = -1;
    unsigned seen = 0;
    const char *s = text;
    if (op >= CLATTN_OP_COUNT || !text) {
        snprintf(err, errsz, "no such operation");
        return 0;
    }
    const int want = schema[op].count;
    for (;;) {
        const char *end = s;
        while (*end && *end != ',')
            end++;
        const char *eq = memchr(s, '=', (size_t)(end - s));
        if (named < 0)
            named = eq != NULL;
        if ((eq != NULL) != named) {
            snprintf(err, errsz, "mixes NAME=value and positional values");
            return 0;
        }
        if (!named && named_only) {
            snprintf(err, errsz, "expected NAME=value pairs");
            return 0;
        }
        int slot = n, value = 0;
        const char *vs = s;
        if (named) {
            slot = slot_of(op, s, (size_t)(eq - s));
            if (slot < 0) {
                snprintf(err, errsz, "unknown parameter \"%.*s\" for %s", (int)(eq - s > 32 ? 32 : eq - s), s,
                         schema[op].name);
                return 0;
            }
            if (seen >> slot & 1u) {
                snprintf(err, errsz, "parameter %s given twice", schema[op].p[slot].name);
                return 0;
            }
            vs = eq + 1;
        } else if (n >= want) {
            snprintf(err, errsz, "more than %d values", want);
            return 0;
        }
        const param_info *pi = &schema[op].p[slot];
        int ok = parse_value(vs, end, pi->max, &value);
        if (!ok && !isdigit((unsigned char)*vs)) /* a kernel choice by name */
            for (size_t i = 0; i < sizeof choices / sizeof choices[0] && !ok; i++)
                if (choices[i].op == op && slot == clattn__param_choice_slot(op) &&
                    strlen(choices[i].name) == (size_t)(end - vs) &&
                    strncasecmp(choices[i].name, vs, (size_t)(end - vs)) == 0) {
                    value = choices[i].value;
                    ok = 1;
                }
        if (!ok) {
            snprintf(err, errsz, "%s=\"%.*s\" is not an integer in [0, %d]%s", pi->name,
                     (int)(end - vs > 32 ? 32 : end - vs), vs, pi->max,
                     slot == clattn__param_choice_slot(op) ? " or a kernel name" : "");
            return 0;
        }
        t.v[slot] = value;
        seen |= 1u << slot;
        n++;
        if (!*end)
            break;
        s = end + 1;
        if (!*s) {
            snprintf(err, errsz, "ends with a comma");
            return 0;
        }
    }
    *p = t;
    if (count)
        *count = named ? -n : n;
    return 1;
}

void clattn__params_format(clattn_op op, const clattn_params *p, int count, char *buf, size_t size)
{
    int n = 0;
    buf[0] = '\0';
    const int choice = clattn__param_choice_slot(op);
    for (int i = 0; op < CLATTN_OP_COUNT && i < count && i < schema[op].count && n >= 0 && (size_t)n < size;
         i++) {
        const char *kname = i == choice ? clattn__kernel_choice_name(op, p->v[i]) : NULL;
        if (kname)
            n += snprintf(buf + n, size - (size_t)n, "%s%s=%s", i ? "," : "", schema[op].p[i].name, kname);
        else
            n += snprintf(buf + n, size - (size_t)n, "%s%s=%d", i ? "," : "", schema[op].p[i].name, p->v[i]);
    }
}

int clattn__params_defines(clattn_op op, const clattn_params *p, int first, int count, char *buf, size_t size)
{
    int n = 0;
    buf[0] = '\0';
    for (int i = first; op < CLATTN_OP_COUNT && i < first + count && i < schema[op].count; i++) {
        const int w = snprintf(buf + n, size - (size_t)n, "%s-D%s=%d", i > first ? " " : "", schema[op].p[i].name,
                               p->v[i]);
        if (w < 0 || (size_t)w >= size - (size_t)n)
            return 0;
        n += w;
    }
    return 1;
}
