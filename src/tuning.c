/* Kernel parameters per operation and problem bucket.
 *
 * Meaning of clattn_params.v[] per operation (all are compile-time -D values of the kernel):
 *   SCORES, PV : WGX, WGY, RM, NS, TK, VW, KF, KT, DIRECT
 *                                             (gemm.cl: tile TM = WGY·RM rows, TN = WGX·VW·NS cols;
 *                                              scores only: KF 1 stages all of head_dim at once,
 *                                              KT 1 reads a Kᵀ copy written by transpose_k,
 *                                              DIRECT 1 (with KT) uses scores_direct: one
 *                                              work-item per RM x 16·NS tile, no local memory)
 *   SOFTMAX    : WG, ROWS                      (softmax.cl: work-items per row; ROWS > 0: one
 *                                              work-item per ROWS rows instead)
 *   FUSED      : WGX, WGY, RM, NS, VW          (fused.cl: BM = WGY·RM rows, BN = WGX·VW·NS keys)
 *   DECODE     : WGX, WGY, RM, NS, VW, splits  (fused.cl with key splits; RM 0 = cover the packed
 *                                              rows, splits 0 = automatic)
 *   MERGE      : WG                            (merge.cl)
 * Lookup: CLATTN_PARAMS_<OP> environment override, then defaults by device type. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[CLATTN_OP_COUNT] = {"scores", "pv", "softmax", "fused", "decode",
                                                      "merge"};

const char *clattn__op_name(clattn_op op) { return op < CLATTN_OP_COUNT ? op_names[op] : "?"; }

int clattn__seq_q_class(int64_t seq_q) { return seq_q <= 1 ? 0 : seq_q <= 16 ? 1 : seq_q <= 128 ? 2 : 3; }

int clattn__log2_ceil(int64_t x)
{
    int l = 0;
    while (l < 62 && ((int64_t)1 << l) < x)
        l++;
    return l;
}

/* "a,b,c" -> up to CLATTN_MAX_PARAMS integers; returns 1 only for a fully valid list. */
static int parse_list(const char *s, clattn_params *p)
{
    clattn_params t;
    memset(&t, 0, sizeof t);
    int n = 0;
    while (*s && n < CLATTN_MAX_PARAMS) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 4096)
            return 0;
        t.v[n++] = (int)v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return 0;
    }
    if (*s || n == 0)
        return 0;
    for (int i = 0; i < n; i++)
        p->v[i] = t.v[i];
    return 1;
}

void clattn__default_params(const clattn_context *ctx, const clattn_bucket *b, clattn_params *p)
{
    memset(p, 0, sizeof *p);
    const int cpu = (ctx->dev.type & CL_DEVICE_TYPE_CPU) != 0;
    switch (b->op) {
    case CLATTN_OP_SCORES:
    case CLATTN_OP_PV: {
        const int gpu_v[9] = {16, 16, 4, 1, 16, 4, 0, 0, 0};
        const int cpu_v[9] = {1, 1, 6, 4, 16, 16, 1, 1, 1};
        memcpy(p->v, cpu ? cpu_v : gpu_v, sizeof gpu_v);
        break;
    }
    case CLATTN_OP_SOFTMAX:
        p->v[0] = cpu ? 16 : 256;
        p->v[1] = cpu ? 2 : 0;
        break;
    case CLATTN_OP_FUSED: {
        const int gpu_v[5] = {8, 8, 4, 1, 4};
        const int cpu_v[5] = {1, 4, 16, 1, 16};
        memcpy(p->v, cpu ? cpu_v : gpu_v, sizeof gpu_v);
        break;
    }
    case CLATTN_OP_DECODE: {
        const int gpu_v[6] = {32, 1, 0, 1, 4, 0};
        const int cpu_v[6] = {1, 1, 0, 4, 16, 0};
        memcpy(p->v, cpu ? cpu_v : gpu_v, sizeof gpu_v);
        break;
    }
    case CLATTN_OP_MERGE:
        p->v[0] = cpu ? 16 : 64;
        break;
    case CLATTN_OP_COUNT:
        break;
    }
    char name[64];
    snprintf(name, sizeof name, "CLATTN_PARAMS_%s", clattn__op_name(b->op));
    for (char *c = name; *c; c++)
        if (*c >= 'a' && *c <= 'z')
            *c = (char)(*c - 'a' + 'A');
    const char *env = getenv(name);
    if (env && *env)
        parse_list(env, p); /* an invalid list leaves the defaults in place */
}
