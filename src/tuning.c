/* Kernel parameters per operation and problem bucket, and where they come from.
 *
 * Meaning of clattn_params.v[] per operation (all are compile-time -D values of the kernel):
 *   SCORES, PV : WGX, WGY, RM, NS, TK, VW, KF, KT, DIRECT
 *                (gemm.cl: tile TM = WGY·RM rows, TN = WGX·VW·NS cols; scores only: KF 1 stages
 *                all of head_dim at once, KT 1 reads a Kᵀ copy written by transpose_k; DIRECT 1
 *                (CPUs: one work-item, no local memory, WGX/WGY/TK/VW unused): scores with KT
 *                scores_direct, RM x 16·NS tiles over the Kᵀ copy, but for few query rows
 *                (scores.c: SCORES_IN_PLACE_ROWS) and without KT scores_in_place, RM rows x 256
 *                keys reading K in place (RM automatic up to 32 rows); P·V pv_direct, RM x 16·NS
 *                tiles of O reading V in place (at most 24 accumulators); P·V ignores KF and KT)
 *   SOFTMAX    : WG, ROWS  (softmax.cl: work-items per row; ROWS > 0: one work-item per ROWS rows)
 *   FUSED      : WGX, WGY, RM, NS, VW, DIRECT  (fused.cl: BM = WGY·RM rows, BN = WGX·VW·NS keys;
 *                DIRECT 1: fused_direct, one work-item per RM rows, 16·NS-key register chunks
 *                of 256-key softmax blocks, reading copies of Kᵀ and of V (zero-padded), both
 *                in panels (fused.cl), WGX/WGY/VW unused; with few rows per kv head (fused.c:
 *                LANES_ROWS), or long K and V (fused.c: clattn__direct_in_place: with AVX-512
 *                any dtype past 2 MiB of f32, with AVX2 any dtype from 8 MiB of f32 and
 *                head_dim + head_dim_v <= 128), K and V are read in place as by DECODE
 *                DIRECT 1 with RM 0, and RM/NS are unused too)
 *   DECODE     : WGX, WGY, RM, NS, VW, SPLITS, DIRECT  (fused.cl with key splits; RM 0 = cover the
 *                packed rows (up to 16), SPLITS 0 = automatic, N = N key splits (1: none;
 *                fitted to at least 4 key blocks and at most 65536 keys a split); DIRECT 1:
 *                fused_direct reading K and V in place, one work-item per RM rows and key
 *                split, 16-key blocks (RM 0:
 *                up to 10 rows in one block; more go to fused_lanes, the rows in the lanes of
 *                float16 vectors, in as few blocks of at most 64 as there can be),
 *                WGX/WGY/NS/VW unused; DIRECT 2: decode_rows (decode.cl), WGY key groups of
 *                ceil(head_dim_v / 4) work-items reading K and V from global memory, RM rows
 *                (0: all packed rows, up to 16), NS lanes reading one key row together for
 *                the scores (1: each lane its own key's row), VW loads in flight per
 *                work-item (4, 8 or 16), WGX unused; DIRECT 3: decode_rows with W rounded up
 *                so that each key group synchronises alone, through PTX barriers on NVIDIA
 *                GPUs; DIRECT 4: decode_lanes (decode_lanes.cl), WGY key groups of NS lanes
 *                (0: one per 16-byte chunk of a row, up to 32) that read every key row
 *                together, VW keys a step whose K and V rows are loaded before use, partial
 *                scores summed by PTX shuffles on NVIDIA GPUs, WGX unused; DIRECT 5:
 *                decode_lanes without PTX, the partial scores summed through local memory
 *                everywhere (on other devices the same as DIRECT 4); on a GPU, decode_lanes
 *                from the vendor or generic defaults gives way to the tiled kernel (DIRECT 0)
 *                from 16 packed rows per kv head: fused.c, clattn__decode_tiled_default)
 *   MERGE      : WG  (merge.cl)
 * Lookup order: clattn_set_params override, CLATTN_PARAMS_<OP>, the user tuning file of the
 * device, built-in tables (tuning/ in the source tree, embedded), vendor defaults, generic defaults. */
#define _POSIX_C_SOURCE 200809L /* open, fstat, O_CLOEXEC: the user file is read as cache.c reads */
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

static const char *const op_names[CLATTN_OP_COUNT] = {"scores", "pv", "softmax", "fused", "decode",
                                                      "merge"};

typedef struct op_space {
    int count;
    const char *names[CLATTN_MAX_PARAMS];
    int ncand[CLATTN_MAX_PARAMS];
    int cand[CLATTN_MAX_PARAMS][8];
    unsigned choices; /* bit i: parameter i picks a kernel or a variant; cand[i] lists every value */
} op_space;

/* Parameter names and the values clattn-tune tries (constraints are checked when a candidate is
 * built and run: each op clamps to the device, and the tuner drops what fails). Sizes are hints
 * that each op fits to the device; choices (DIRECT, KF, KT) accept only the values listed. */
static const op_space spaces[CLATTN_OP_COUNT] = {
    /* SCORES */
    {9,
     {"WGX", "WGY", "RM", "NS", "TK", "VW", "KF", "KT", "DIRECT"},
     {5, 5, 6, 4, 4, 3, 2, 2, 2},
     {{1, 2, 4, 8, 16}, {1, 2, 4, 8, 16}, {1, 2, 4, 6, 8, 16}, {1, 2, 3, 4}, {8, 16, 32, 64},
      {4, 8, 16}, {0, 1}, {0, 1}, {0, 1}},
     0x1c0},
    /* PV: KF and KT are the scores kernel's; DIRECT 1 is pv_direct */
    {9,
     {"WGX", "WGY", "RM", "NS", "TK", "VW", "KF", "KT", "DIRECT"},
     {5, 5, 5, 3, 4, 3, 1, 1, 2},
     {{1, 2, 4, 8, 16}, {1, 2, 4, 8, 16}, {1, 2, 4, 8, 16}, {1, 2, 4}, {8, 16, 32, 64}, {4, 8, 16},
      {0}, {0}, {0, 1}},
     0x1c0},
    /* SOFTMAX */
    {2, {"WG", "ROWS"}, {8, 5}, {{1, 4, 8, 16, 32, 64, 128, 256}, {0, 1, 2, 4, 8}}, 0},
    /* FUSED */
    {6,
     {"WGX", "WGY", "RM", "NS", "VW", "DIRECT"},
     {5, 5, 7, 3, 3, 2},
     {{1, 2, 4, 8, 16}, {1, 2, 4, 8, 16}, {1, 2, 3, 4, 6, 8, 16}, {1, 2, 4}, {4, 8, 16}, {0, 1}},
     0x20},
    /* DECODE */
    {7,
     {"WGX", "WGY", "RM", "NS", "VW", "SPLITS", "DIRECT"},
     {5, 4, 4, 6, 3, 5, 6},
     {{1, 2, 8, 16, 32}, {1, 2, 4, 8}, {0, 1, 4, 16}, {1, 2, 4, 8, 16, 32}, {4, 8, 16}, {0, 2, 8, 32, 128},
      {0, 1, 2, 3, 4, 5}},
     0x40},
    /* MERGE */
    {1, {"WG"}, {5}, {{16, 32, 64, 128, 256}}, 0},
};

const char *clattn__op_name(clattn_op op) { return op < CLATTN_OP_COUNT ? op_names[op] : "?"; }

int clattn__param_count(clattn_op op) { return op < CLATTN_OP_COUNT ? spaces[op].count : 0; }

int clattn__param_candidates(clattn_op op, int i, const int **vals)
{
    if (op >= CLATTN_OP_COUNT || i < 0 || i >= spaces[op].count)
        return 0;
    *vals = spaces[op].cand[i];
    return spaces[op].ncand[i];
}

/* The largest value of parameter i (< sp->count): a choice's last candidate, else any size. */
static int space_max(const op_space *sp, int i)
{
    return sp->choices >> i & 1 ? sp->cand[i][sp->ncand[i] - 1] : CLATTN_PARAM_MAX;
}

int clattn__param_max(clattn_op op, int i)
{
    if (op >= CLATTN_OP_COUNT || i < 0 || i >= spaces[op].count)
        return -1;
    return space_max(&spaces[op], i);
}

int clattn__seq_q_class(int64_t seq_q) { return seq_q <= 1 ? 0 : seq_q <= 16 ? 1 : seq_q <= 128 ? 2 : 3; }

int clattn__mask_kind(int causal, int masked) { return masked ? 2 : causal ? 1 : 0; }

int clattn__log2_ceil(int64_t x)
{
    int l = 0;
    while (l < 62 && ((int64_t)1 << l) < x)
        l++;
    return l;
}

/* ---- defaults ---- */

/* Generic: modest tiles any OpenCL 1.2 GPU runs (work-groups <= 256, little local memory). */
static void generic_defaults(clattn_op op, clattn_params *p)
{
    static const int v[CLATTN_OP_COUNT][CLATTN_MAX_PARAMS] = {
        {16, 16, 4, 1, 16, 4, 0, 0, 0}, /* scores */
        {16, 16, 4, 1, 16, 4, 0, 0, 0}, /* pv */
        {256, 0},                       /* softmax */
        {8, 8, 4, 1, 4, 0},             /* fused */
        {32, 4, 0, 0, 8, 0, 4},         /* decode: decode_lanes, 4 key groups, 8 keys a step */
        {64},                           /* merge */
    };
    memcpy(p->v, v[op], sizeof v[op]);
}

/* Vendor defaults: CPUs (PoCL, Intel's CPU runtime) want one work-item doing a lot with wide
 * vectors and no barriers; measured on PoCL, AVX-512. Returns 0 when there is no vendor table. */
static int vendor_defaults(const clattn_devinfo *d, clattn_op op, clattn_params *p, const char **what)
{
    if (d->type & CL_DEVICE_TYPE_CPU) {
        static const int v[CLATTN_OP_COUNT][CLATTN_MAX_PARAMS] = {
            {1, 1, 6, 4, 16, 16, 1, 1, 1}, /* scores: direct, 6 x 64 register tile */
            {1, 1, 6, 4, 16, 16, 0, 0, 1}, /* pv: direct, 6 x 64 register tile */
            {16, 2},                       /* softmax: one work-item per 2 rows */
            {1, 1, 6, 4, 16, 1},           /* fused: direct, 6 rows x 64-key chunks */
            {1, 1, 0, 4, 16, 0, 1},        /* decode: direct, K and V read in place */
            {16},                          /* merge */
        };
        memcpy(p->v, v[op], sizeof v[op]);
        /* fused: the 6 x 64 score tile (24 accumulators) keeps both of an Intel core's 512-bit
         * FMA units busy, where 6 x 16 (6 accumulators, 7 loads for 6 multiply-adds) waits on
         * their latency and on the loads. PoCL, 2-core Intel Xeon (AVX-512), B1 H8 S1024 f32
         * unless noted, minima of 2-4 runs alternating, ms, 6 x 64 against 6 x 16 and 4 x 32:
         * d64 7.6-8.4 against 9.3-9.5; d64 f16 8.4-8.5 against 9.9-10.2 and 8.9-9.0; d32
         * 4.8-5.1 against 5.4-5.7 and 5.4-5.5; d128 14.7 against 17.5-17.8 and 17.8-18.6; d256
         * (H4) 18.5-19.4 against 20.8-21.3 and 21.7-21.9; d64 seq_kv 4096 38.4-39.7 against
         * 43.3-44.5 and 47.3-48.5. With fewer vector registers (AVX2, NREG16 8; device.c) the
         * fitted tile (src/scores.c) is 6 x 16, which AVX2 favours (2-core AMD EPYC, B1 H8
         * S1024 d128 f32: 34.1 ms against 42.0 for 4 x 32, causal 18.2 against 23.3). At
         * head_dim_v 65 to 80 the fit takes 4 rows (O's accumulators, src/scores.c). */
        *what = "vendor defaults (CPU devices)";
        return 1;
    }
    if ((d->type & CL_DEVICE_TYPE_GPU) && d->vendor_id == 0x10de) {
        /* Measured on an H100 (OpenCL 3.0 CUDA, driver 580): fused 4,16,4,1,4 (64 rows x 16 keys,
         * 64 work-items) 21.4 TFLOP/s at B4 H16 S4096 d64 f32 against 15.2 for the generic
         * 8,8,4,1,4 and 20.3 for 8,16,4,1,4; with 16 other tilings in one run (2026-11-27, --check)
         * none faster beyond noise: 21.29 against 21.37 for 4,16,8,1,4 (128 rows) and 21.33 for
         * 8,16,8,1,4, 19.7 for 8,16,4,1,4, 4,16,4,2,4 and 16,16,4,1,4, 12.8-19.3 for the rest; d128
         * (H8) 13.29 against 13.25-13.28 (8,16,4,1,4; 4,16,4,2,4) and 10.6-11.7. Decode (the
         * generic decode_lanes with PTX shuffles, 4 key groups of 32 lanes, 8 keys a step), on an
         * H200 (driver 580), GB/s of Q+K+V+O, median of 30, against decode_rows (32,4,0,1,8,0,2,
         * the default before) in the same session: B16 H32 kv8192 d128 f32 4296 against 1717 (our
         * device copy 3602-3693; 2 key groups 4321, 8 groups 4368, without PTX 4078); f16 3315
         * against 906; 32/8 heads 2525 against 1508; 32/8 heads seq_q 4 511 against 494 (8 groups
         * 579). From 16 packed rows per kv head the tiled kernel runs instead (src/fused.c:
         * clattn__decode_tiled_default, with H100 measurements). The other operations keep the
         * generic values. */
        generic_defaults(op, p);
        if (op == CLATTN_OP_FUSED) {
            static const int f[6] = {4, 16, 4, 1, 4, 0};
            memcpy(p->v, f, sizeof f);
        }
        *what = "vendor defaults (NVIDIA GPUs)";
        return 1;
    }
    return 0;
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

/* "a,b,c" -> 1 to op's count of integers, each in [0, clattn__param_max]; returns 1 only for a
 * fully valid list. */
static int parse_list(const char *s, clattn_op op, clattn_params *p)
{
    const int want = spaces[op].count;
    clattn_params t;
    memset(&t, 0, sizeof t);
    int n = 0;
    while (*s && n < CLATTN_MAX_PARAMS) {
        char *end;
        if (!isdigit((unsigned char)*s)) /* no sign, no blank, no empty field */
            return 0;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || n >= want || v > space_max(&spaces[op], n))
            return 0;
        t.v[n++] = (int)v;
        s = end;
        if (*s == ',' && s[1])
            s++;
        else if (*s)
            return 0;
    }
    if (*s || n == 0 || n > want)
        return 0;
    /* A shorter list sets the leading parameters and keeps the rest. */
    for (int i = 0; i < n; i++)
        p->v[i] = t.v[i];
    return 1;
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
 * form, and each choice's largest value ("DIRECT<=4"). */
static void env_problem(clattn_op op, const char *env, char *buf, size_t size)
{
    char name[64];
    snprintf(buf, size, "%s=\"%.60s%s\" ignored: not 1 to %d comma-separated integers in [0, %d] (",
             env_name(op, name, sizeof name), env, strlen(env) > 60 ? "..." : "", spaces[op].count,
             CLATTN_PARAM_MAX);
    for (int i = 0; i < spaces[op].count; i++) {
        const size_t n = strlen(buf);
        const int hi = space_max(&spaces[op], i);
        if (hi < CLATTN_PARAM_MAX)
            snprintf(buf + n, size - n, "%s%s<=%d", i ? "," : "", spaces[op].names[i], hi);
        else
            snprintf(buf + n, size - n, "%s%s", i ? "," : "", spaces[op].names[i]);
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
    generic_defaults(b->op, p);
    const int has_vendor = vendor_defaults(&ctx->dev, b->op, p, &vendor);
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
        if (parse_list(env, b->op, p))
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

static void load_user(clattn_context *ctx)
{
    enum { MAX_FILE = 1 << 20 };
    char path[4200];
    if (!clattn__tuning_file(ctx, path, sizeof path)) {
        report(ctx, "no user tuning directory (set CLATTN_TUNING_DIR)");
        return;
    }
    /* Only a regular file is read, as in the binary cache (cache.c): opening a FIFO planted under
     * the file's name would block clattn_create for ever, and a directory or a device is no
     * tuning file either. O_NONBLOCK keeps the open of a FIFO from waiting for a writer. */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        report(ctx, "no user tuning file %.400s", path);
        return;
    }
    struct stat st;
    const char *why = NULL;
    char *buf = NULL;
    size_t len = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        why = "not a regular file";
    } else if (st.st_size > MAX_FILE) {
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
        report(ctx, "ignored user tuning file %.400s: %s", path, why);
    } else if (clattn__tuning_parse(buf, len, t, err, sizeof err) != 0) {
        report(ctx, "ignored user tuning file %.400s: %.400s", path, err);
    } else if (t->device_is_pattern || strcmp(t->device, ctx->dev.key) != 0) {
        report(ctx, "ignored user tuning file %.400s: written for another device (%.400s)", path, t->device);
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
        if (env && *env && !parse_list(env, (clattn_op)op, &p)) {
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
    return (unsigned)op < CLATTN_OP_COUNT ? op_names[op] : NULL;
}

int clattn_param_count(clattn_operation op)
{
    return (unsigned)op < CLATTN_OP_COUNT ? spaces[op].count : 0;
}

const char *clattn_param_name(clattn_operation op, int index)
{
    if ((unsigned)op >= CLATTN_OP_COUNT || index < 0 || index >= spaces[op].count)
        return NULL;
    return spaces[op].names[index];
}

int clattn_param_max(clattn_operation op, int index)
{
    return (unsigned)op < CLATTN_OP_COUNT ? clattn__param_max((clattn_op)op, index) : -1;
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
    if (count != spaces[op].count)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "count is %d; %s takes %d parameters", count,
                            op_names[op], spaces[op].count);
    for (int i = 0; i < count; i++)
        if (values[i] < 0 || values[i] > space_max(&spaces[op], i))
            return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "values[%d] (%s) is %d, not in [0, %d]", i,
                                spaces[op].names[i], values[i], space_max(&spaces[op], i));
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
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT, "pc->dtype is not a clattn_dtype (%d)",
                            (int)pc->dtype);
    if (pc->head_dim < 0 || pc->head_dim > CLATTN_MAX_HEAD_DIM || pc->seq_q < 0 || pc->seq_kv < 0)
        return clattn__fail(ctx, CLATTN_INVALID_ARGUMENT,
                            "pc sizes out of range (head_dim %lld, seq_q %lld, seq_kv %lld)",
                            (long long)pc->head_dim, (long long)pc->seq_q, (long long)pc->seq_kv);
    const clattn_bucket b = {(clattn_op)pc->operation, pc->dtype, (int)pc->head_dim,
                             clattn__seq_q_class(pc->seq_q), clattn__log2_ceil(pc->seq_kv),
                             clattn__mask_kind(pc->causal != 0, pc->masked != 0)};
    clattn_params p;
    memset(out, 0, sizeof *out);
    clattn__params_for(ctx, &b, &p, &out->source, out->origin, sizeof out->origin);
    out->count = spaces[pc->operation].count;
    memcpy(out->values, p.v, sizeof out->values);
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
