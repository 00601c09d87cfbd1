/* Fused attention (fused.cl) for prefill and decode, with flash-decoding key splits merged by
 * merge.cl when one work-group per (row tile, kv head) would leave the device idle. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

typedef struct fused_cfg {
    int wgx, wgy, rm, ns, vw, nv, dp;
} fused_cfg;

/* Local memory of the tiled kernel: Qs, one buffer for Kᵀ then V, Ps, red and rsum (rows of Qs
 * and Ps padded by four words, which keeps them 16-byte aligned for vload4, rows of red and rsum
 * by one, against bank conflicts), and the two mask flags (seen_kt). Qs, KVs and Ps are 16-byte
 * aligned: red, rsum and the flags count as whole 16-byte units, an upper bound whatever order
 * the compiler lays the arrays out in. */
static size_t fused_local_bytes(const fused_cfg *c)
{
    const size_t bm = (size_t)c->wgy * c->rm, bn = (size_t)c->wgx * c->vw * c->ns,
                 dvp = (size_t)c->wgx * c->vw * c->nv, kv = (size_t)c->dp > dvp ? (size_t)c->dp : dvp;
    const size_t red = (bm * (c->wgx + 1) + 3) / 4 * 4;
    return 4 * ((c->dp + 4) * bm + kv * bn + (bn + 4) * bm + 2 * red + 4);
}

/* Floats of one split's partial result (O and LSE). */
static size_t part_floats(const clattn_problem *p)
{
    return (size_t)(p->batch * p->heads_q * p->seq_q) * (size_t)(p->head_dim_v + 1);
}

static int pow2_at_least(int x)
{
    int p = 1;
    while (p < x)
        p *= 2;
    return p;
}

/* Makes the configuration fit the device: work-groups of at most `cap` work-items (the device's
 * largest, or what a kernel compiled with more allowed) and local memory (48 KiB on many GPUs).
 * The key tile shrinks first, down to 16 keys (it sets how many keys a barrier covers), then the
 * row tile (how often a K/V tile is reused), then the work-group. */
static int fit(const clattn_context *ctx, fused_cfg *c, int dv, size_t cap)
{
    for (int guard = 0; guard < 64; guard++) {
        c->nv = (dv + c->vw * c->wgx - 1) / (c->vw * c->wgx);
        const int wg_ok = (size_t)c->wgx * c->wgy <= cap &&
                          (size_t)c->wgx <= ctx->dev.max_item[0] && (size_t)c->wgy <= ctx->dev.max_item[1];
        if (wg_ok && clattn__local_fits(ctx, fused_local_bytes(c)))
            return 1;
        const int bn = c->wgx * c->vw * c->ns;
        if (!wg_ok && c->wgy > 1 && (size_t)c->wgx <= ctx->dev.max_item[0])
            c->wgy /= 2; /* too many work-items: fewer rows of them */
        else if (!wg_ok && c->wgx > 1)
            c->wgx /= 2;
        else if (c->ns > 1)
            c->ns /= 2;
        else if (c->vw > 4)
            c->vw /= 2;
        else if (bn > 16 && c->wgx > 1)
            c->wgx /= 2;
        else if (c->rm > 1)
            c->rm /= 2;
        else if (c->wgy > 1)
            c->wgy /= 2;
        else if (c->wgx > 1)
            c->wgx /= 2;
        else
            return 0;
    }
    return 0;
}

/* ceil(a / b) for a >= 1, b >= 1, without forming a + b (packed rows R may be close to INT_MAX:
 * validation bounds heads_q / heads_kv x seq_q by it). */
static int ceil_div(int a, int b) { return (a - 1) / b + 1; }

/* Keys one split covers at most. Within a split the kernels keep O normalised and add each key's
 * share to it in fp32: late in a long range every share is tiny next to O, and their rounding
 * adds up. With identical keys (the worst case: the errors do not cancel) one split of 1e6 keys
 * is off by 3e-4, of 1e8 keys by 3%; 65536 keys stay at fp32 rounding. Splits are merged with
 * their LSE weights in compensated sums (merge.cl). The partials' workspace bounds the count;
 * MAX_SPLITS covers CLATTN_MAX_SEQ keys. Grid z (batch·heads_kv·splits) may exceed what the
 * device launches at once: clattn__enqueue then runs it in chunks. */
#define MAX_SPLIT_KEYS (1 << 16)
#define MAX_SPLITS 32768

/* Key splits (flash-decoding): `requested` (DECODE's SPLITS), or with 0 enough work-groups of
 * wg_items work-items to fill the device (CPUs: 4 per compute unit; GPUs: about 2048 work-items
 * per compute unit, 4 to 32 work-groups, the occupancy a GPU needs to hide memory latency); then
 * each split keeps at least 4 key blocks of bn and at most MAX_SPLIT_KEYS keys, and the partials
 * stay within a modest workspace (which wins over the key limit). split_len is a multiple of bn. */
static int choose_splits(const clattn_context *ctx, const clattn_problem *p, long long tiles, int bn,
                         int wg_items, int requested, int *split_len)
{
    int splits = requested > 0 ? requested : 1;
    int per_cu = 4;
    if (!(ctx->dev.type & CL_DEVICE_TYPE_CPU) && wg_items > 0) {
        per_cu = 2048 / wg_items;
        per_cu = per_cu < 4 ? 4 : per_cu > 32 ? 32 : per_cu;
    }
    const long long target = (long long)per_cu * ctx->dev.compute_units;
    if (requested <= 0 && tiles < target)
        splits = (int)((target + tiles - 1) / tiles);
    const long long max_by_len = (p->seq_kv + 4LL * bn - 1) / (4LL * bn);
    if (splits > max_by_len)
        splits = (int)max_by_len;
    if (splits > 256)
        splits = 256;
    const long long by_keys = (p->seq_kv + MAX_SPLIT_KEYS - 1) / MAX_SPLIT_KEYS;
    if (splits < by_keys)
        splits = by_keys < MAX_SPLITS ? (int)by_keys : MAX_SPLITS;
    /* In 64 bits whatever size_t is (a 32-bit host): the products must not wrap. */
    const uint64_t part_rows = (uint64_t)p->batch * (uint64_t)p->heads_q * (uint64_t)p->seq_q;
    const uint64_t part_bytes = clattn__mul_sat(part_rows, (uint64_t)(p->head_dim_v + 1) * 4);
    /* 256 MiB, or half the largest buffer the device allows (the workspace is one buffer). */
    const uint64_t part_cap = ctx->dev.max_alloc / 2 < ((uint64_t)256 << 20) ? ctx->dev.max_alloc / 2
                                                                              : ((uint64_t)256 << 20);
    while (splits > 1 && clattn__mul_sat((uint64_t)splits, part_bytes) > part_cap)
        splits /= 2;
    if (splits < 1)
        splits = 1;
    /* In 64 bits: seq_kv may be close to INT_MAX. len stays below it (validation keeps seq_kv
     * 2^20 below INT_MAX, and bn is smaller). */
    long long len = (p->seq_kv + splits - 1) / splits;
    len = (len + bn - 1) / bn * bn;
    *split_len = (int)len;
    return (int)((p->seq_kv + len - 1) / len);
}

/* The f32 partial results of split launches: O [split][B][Hq][Sq][Dv], then LSE [split][B][Hq][Sq],
 * at element offset base of the workspace ws. */
static void partial_views(const clattn_problem *p, cl_mem ws, uint64_t base, int splits,
                          clattn_view *out, clattn_view *lse, cl_ulong *o_split, cl_ulong *l_split)
{
    const cl_ulong dv = (cl_ulong)p->head_dim_v, sq = (cl_ulong)p->seq_q, hq = (cl_ulong)p->heads_q;
    const cl_ulong rows = (cl_ulong)p->batch * hq * sq;
    *out = (clattn_view){ws, CLATTN_F32, base, {hq * sq * dv, sq * dv, dv}};
    *lse = (clattn_view){ws, CLATTN_F32, base + (cl_ulong)splits * rows * dv, {hq * sq, sq, 1}};
    *o_split = rows * dv;
    *l_split = rows;
}

/* The mask's block flags (MFLAGS, fused.cl) in the workspace: slices nb·nh of `rows` rows of
 * `chunks` bytes (one per 16 keys), from byte `off`; strides in bytes, 0 where the mask
 * broadcasts. Then, from int s_off of the workspace, each row's span (two ints: its first chunk
 * with a visible key and one past its last), and with `unions` (fused_direct's K/V copies), from
 * int u_off, the hull of the spans of each kv head's rows (mask_union: its first chunk to the end
 * of its last). `bytes` covers them all. on 0: the kernels scan the mask itself. kflags, kspans
 * and kunion: the kernels that fill them (get_mask_kernels). */
typedef struct mask_flags {
    int on, nh, rows, chunks, unions;
    uint64_t slices, bytes;
    cl_ulong off, sb, sh, ss, s_off, u_off;
    cl_kernel kflags, kspans, kunion;
} mask_flags;

/* Launches kernel (fused or fused_direct, which take the same arguments) over global/local with
 * K and V as the views k and v, writing the outputs, or with splits > 1 the partials at element
 * offset part_off of ws, which are then merged. With mf on, the kernel also gets the mask's
 * flags (MFLAG_ARGS, fused.cl). */
static clattn_status launch(clattn_context *ctx, const clattn_problem *p, cl_kernel kernel, const char *name,
                            const clattn_view *k, const clattn_view *v, cl_mem ws, uint64_t part_off,
                            int splits, int split_len, const size_t global[3], const size_t local[3],
                            const mask_flags *mf, cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    clattn_view out = p->out, lse = p->lse;
    int has_lse = p->lse.buffer != NULL;
    cl_ulong o_split = 0, l_split = 0;
    if (splits > 1) {
        partial_views(p, ws, part_off, splits, &out, &lse, &o_split, &l_split);
        has_lse = 1;
    }
    const int seq_q = (int)p->seq_q, seq_kv = (int)p->seq_kv, hkv = (int)p->heads_kv,
              group = (int)(p->heads_q / p->heads_kv), D = (int)p->head_dim, dv = (int)p->head_dim_v,
              causal = p->causal, has_mask = p->has_mask;
    clattn_args a = {kernel, 0, CL_SUCCESS};
    clattn__arg_view(&a, &p->q);
    clattn__arg_view(&a, k);
    clattn__arg_view(&a, v);
    clattn__arg_view(&a, &out);
    clattn__arg_view(&a, has_lse ? &lse : NULL);
    clattn__arg_view(&a, has_mask ? &p->mask : NULL);
    clattn__arg(&a, sizeof(cl_mem), p->kv_lengths ? &p->kv_lengths : NULL);
    clattn__arg(&a, sizeof(cl_ulong), &o_split);
    clattn__arg(&a, sizeof(cl_ulong), &l_split);
    clattn__arg(&a, sizeof(int), &seq_q);
    clattn__arg(&a, sizeof(int), &seq_kv);
    clattn__arg(&a, sizeof(int), &hkv);
    clattn__arg(&a, sizeof(int), &group);
    clattn__arg(&a, sizeof(int), &D);
    clattn__arg(&a, sizeof(int), &dv);
    clattn__arg(&a, sizeof(int), &causal);
    clattn__arg(&a, sizeof(int), &has_mask);
    clattn__arg(&a, sizeof(int), &has_lse);
    clattn__arg(&a, sizeof(int), &splits);
    clattn__arg(&a, sizeof(int), &split_len);
    clattn__arg(&a, sizeof(float), &p->scale);
    if (mf && mf->on) {
        clattn__arg(&a, sizeof(cl_mem), &ws);
        clattn__arg(&a, sizeof(cl_ulong), &mf->off);
        clattn__arg(&a, sizeof(cl_ulong), &mf->sb);
        clattn__arg(&a, sizeof(cl_ulong), &mf->sh);
        clattn__arg(&a, sizeof(cl_ulong), &mf->ss);
        clattn__arg(&a, sizeof(cl_ulong), &mf->s_off);
        clattn__arg(&a, sizeof(int), &mf->chunks);
    }
    if (splits == 1)
        return clattn__enqueue(ctx, &a, 3, global, local, num_wait, wait, done, name);
    char what[64];
    snprintf(what, sizeof what, "%s (split)", name);
    clattn_status st = clattn__enqueue(ctx, &a, 3, global, local, num_wait, wait, NULL, what);
    if (st)
        return st;
    return clattn__run_merge(ctx, splits, p->batch, p->heads_q, p->seq_q, p->head_dim_v, &out, &lse,
                             &p->out, p->lse.buffer ? &p->lse : NULL, 0, NULL, done);
}

/* The most packed rows fused_lanes (fused.cl) takes in one block: 4 vectors of 16 lanes.
 * Measured on PoCL (2-core Zen 4, minima of 10 runs, decode GQA 32:8, seq_q 16, seq_kv 8192,
 * d128, f32): 64 rows in one block 11.4-11.6 ms, in two of 32 13.4-15.0, fused_direct in two
 * blocks of 32 16.6-21.1. */
#define LANES_ROWS 64
/* The fewest packed rows fused_lanes takes (one vector, up to 5 of its 16 lanes empty); fewer
 * stay on fused_direct, one block. Decode on PoCL (2-core Zen 4, seq_kv 8192, GQA over 8 kv
 * heads unless said, minima of 4 runs alternating, ms, fused_lanes against fused_direct):
 *   16 rows: d128 3.5 against 5.3, f16 3.0 against 4.7, bf16 3.8 against 4.5, d64 1.6 against
 *            2.8, d256 9.1 against 10.3; GQA 16:1 at seq_kv 65536 3.6 against 5.2;
 *   12 rows: d128 3.7 against 4.4, f16 3.6 against 4.9, d64 1.7 against 2.4, bf16 3.9 against 3.7;
 *   11 rows: d128 4.2 against 4.8, f16 3.1 against 3.7;
 *   10 rows: d128 3.6-4.0 against 3.5-3.6, f16 3.0 against 3.0, d64 (4 kv heads) 0.84 against 0.77;
 *    9 rows: d128 3.8 against 3.1; 8 rows: f16 3.0 against 2.7, d64 1.6 against 1.3, d256 9.5
 *            against 7.7; 4 rows: d128 3.8 against 1.9.
 * fused_lanes costs about the same from 4 rows to 16 (its lanes are multiplied either way, and
 * it streams K and V at about half the rate fused_direct reaches with few rows). */
#define LANES_MIN_ROWS 11

/* Prefill with at most LANES_ROWS rows per kv head reads K and V in place as decode does, in one
 * block of rows (fused_lanes, prefill having more than 16): the Kᵀ copy costs a read and a write
 * of K plus a second read, which so few rows do not repay. Measured on PoCL (2-core Zen 4, B1
 * H8 d64 f32, minima of 20 runs alternating, noisy): seq_q 64 against 8192 keys 6.3-6.4 ms in
 * place against 10.0-13.6 with the copy, against 1024 keys 0.78-1.39 against 0.96-1.42, 48
 * against 4096 2.2-4.2 against 3.4-4.7, 64 against 256 0.36-0.47 against 0.27-0.49 (even). With
 * fused_direct in two blocks of 32, before fused_lanes, the copy was faster from 33 rows unless
 * K and V were long (seq_kv 8192, seq_q 64: 11.3-12.5 in place against 10.3-11.1).
 * With AVX2's register tiles (NREG16 < 32), K and V with head_dim + head_dim_v <=
 * KV_IN_PLACE_DIMS and at least KV_IN_PLACE elements a kv head (8 MiB of f32: 16384 keys at
 * head_dim 64;
 * AVX-512: KV_IN_PLACE_512 below) are read in place with any number of rows, in blocks
 * of up to 64: fused_direct over the copies takes 4 to 6 rows a block (its register tile), and
 * streams all of K and V once a block, which long K and V make slow. Measured on PoCL (2-core AMD
 * EPYC, AVX2, 32 MiB cache, B1 H8 f32, minima of 2 runs alternating, ms, in place against the
 * copies in panels, non-causal then causal):
 *   d64,  seq_kv 32768, seq_q 256: 159 against 177, causal 146 against 192;
 *   d64,  seq_kv 16384, seq_q 256: 62 against 73; seq_q 512: 127-162 against 131-153 (even);
 *         seq_q 1024: 267 against 317, causal 250 against 236;
 *   d64,  seq_kv 8192, seq_q 1024: 144 against 125, causal 135 against 119 (copies);
 *   d128, seq_kv 16384, seq_q 1024: 690 against 598, causal 684 against 565; seq_q 512: 345
 *         against 297, causal 326 against 295 (copies);
 *   d128, seq_kv 8192, seq_q 512: 128 against 119, causal 161 against 115;
 *   d128, seq_kv 4096, seq_q 1024: 135 against 107, causal 120 against 93.
 * With the copies in rows (before the panels, see fused.cl) in place won from 4 MiB at both head
 * sizes (d128 seq_kv 16384 seq_q 1024: 543 against 960).
 * f16 and bf16 follow the same rule since fused_lanes converts each block of V to f32 once
 * (VF32_BLOCK, fused.cl); before that they kept the copies. Measured with AVX2 code on a 2-core
 * Intel Xeon (AVX-512 hardware, PoCL with POCL_LLVM_CPU_NAME=haswell POCL_KERNELLIB_NAME=avx2
 * and CLATTN_NREG16=8), B1 H8, minima of 2 runs alternating, ms, in place against the copies,
 * non-causal / causal:
 *   f16,  d64, seq_kv 16384, seq_q 256: 98 / 109 against 151 / 203; seq_q 512: 209 / 215
 *         against 308 / 366; seq_q 1024: 418 / 354 against 896 / 745;
 *   bf16, d64, seq_kv 16384, seq_q 512: 205 / 199 against 299 / 254; seq_kv 32768, seq_q 256:
 *         202 / 188 against 330 / 352;
 *   f16,  d64, seq_kv 8192, seq_q 512 (2^20 elements): 98 / 101 against 99 / 92; seq_q 1024:
 *         220 / 208 against 208 / 193 (even, as f32 is here: 212 / 208 against 197 / 184; bf16
 *         was not timed there).
 * The same emulation reads head_dim + head_dim_v > 128 differently from the EPYC (f32 d128
 * seq_kv 8192 seq_q 512: 223 / 234 in place against 297 / 291; f16 194 / 193 against 214 /
 * 256). Real AVX2 hardware confirms the KV_IN_PLACE_DIMS bound with the current kernels: on
 * PoCL (2-core AMD EPYC, Zen 3, AVX2, 512 KiB L2 a core, B1 H8, minima of 3 runs alternating
 * with the bound raised, ms, copies against in place, non-causal / causal):
 *   f32,  d128, seq_kv 8192, seq_q 512: 132 / 118 against 161 / 162; seq_q 1024: 307 / 263
 *         against 341 / 334; seq_kv 16384, seq_q 512: 289 / 297 against 319 / 351; seq_q
 *         1024: 545 / 505 against 585 / 596;
 *   f16,  d128, seq_kv 8192, seq_q 512: 150 / 147 against 176 / 167;
 *   bf16, d128, seq_kv 8192, seq_q 1024: 298 / 249 against 282 / 313;
 *   f32,  d96,  seq_kv 16384, seq_q 1024: 385 / 383 against 372 / 380 (even).
 * There, at d64 and the KV_IN_PLACE bound, in place and the copies are about even, where the
 * emulation had f16 in place well ahead (in place against the copies, the same runs): f16
 * seq_kv 16384, seq_q 512: 160 / 155 against 162 / 149; seq_q 1024: 310 / 326 against 328 /
 * 273; bf16 seq_kv 32768, seq_q 256: 141 / 142 against 150 / 174; f32 seq_kv 16384, seq_q 512:
 * 133 / 138 against 132 / 148. Two runs of one configuration (f16 seq_kv 8192, seq_q 1024,
 * copies either way) differed by up to 12%. */
#define KV_IN_PLACE (1 << 21)
#define KV_IN_PLACE_DIMS 128
/* With AVX-512's register tiles (NREG16 32: fused_lanes with 8 accumulators, fused_direct's
 * 6 x 64 score tile) f32 and bf16 K and V of more than KV_IN_PLACE_512 floats a kv head (2 MiB
 * in f32, one core's L2 on the machine measured) are read in place whatever head_dim +
 * head_dim_v: past that the copies stream from L3 for every 6-row block, where fused_lanes reads
 * K and V once per 64 rows. Measured on PoCL (2-core Intel Xeon, AVX-512, 2 MiB L2 a core; PoCL
 * reports the 260 MiB L3 as the cache, so the copies are not cut into key chunks), B1 H8
 * seq_q 1024 f32 unless noted, minima of 3 runs, ms, in place against the copies, non-causal /
 * causal:
 *   d64,  seq_kv 8192: 71.0 / 68.3 against 101.1 / 97.5; seq_q 256: 17.5 / 18.9 against
 *         28.2 / 29.7; seq_q 128: 10.5 / 9.3 against 17.5 / 18.1; 6144: 54.5 / 50.3 against
 *         80.3 / 73.6; 5120: 46.0 / 43.9 against 59.2 / 51.8; dv32 8192: 54.3 / 50.8 against
 *         79.8 / 76.1; bf16 8192: 75.6 / 72.7 against 100.9 / 96.4;
 *   d32,  seq_kv 12288: 63.0 / 60.8 against 82.7 / 78.9;
 *   d128, seq_kv 8192: 135.8 / 131.2 against 214.6 / 202.8 (bf16 143.6 / 140.6 against
 *         213.1 / 201.6); 4096: 67.0 / 62.3 against 101.6 / 88.0; seq_q 512, 3072: 25.9 /
 *         27.1 against 37.0 / 36.5; GQA 32:8, seq_q 256, 8192: 148 / 148 against 216 / 225;
 *   d256 (H4), seq_kv 4096: 83.2 / 83.0 against 103.2 / 95.6; 2048: 39.1 / 36.3 against
 *         47.2 / 34.3.
 * At 2^19 floats about even (d64 4096: 35.3 / 34.9 against 37.7 / 32.2; d128 2048: 63.7 /
 * 39.8 against 72.5 / 33.7; d32 8192: 41.9 / 39.3 against 44.9 / 44.5), below it the copies
 * win (d64 2048: 17.3 / 15.7 against 15.3 / 12.2). f16 follows the same rule since fused_lanes
 * converts each block of V to f32 16 elements at a time (VF32_BLOCK, fused.cl): d64 8192 78.3
 * / 77.0-82.4 against 106.4 / 99.4-107.1 with the copies, seq_q 256 19.6-19.9 / 20.3-22.6
 * against 30.1-30.5 / 30.0-31.6, 6144 59.6-61.7 / 57.5-59.6 against 76.7-80.4 / 70.0-71.0, d128
 * 4096 77.3-78.4 / 73.7-74.9 against 101.1-101.4 / 89.4-90.5 (2 runs alternating). Before it,
 * f16 in place was even with the copies at any length and kept them. Cutting the copies into
 * L2-sized key chunks (1024 or 2048 keys) was slower than in place above 2^19 floats and slower
 * than no chunks at or below it. The 2-core Zen 4 (AVX-512, 1 MiB L2) was not measured; AVX2
 * keeps the rule above. */
#define KV_IN_PLACE_512 (1 << 19)

int clattn__direct_in_place(const clattn_context *ctx, int64_t rows, int64_t seq_q, int64_t seq_kv,
                            int64_t dk_plus_dv)
{
    if (seq_q <= 16 || rows <= LANES_ROWS)
        return 1;
    if (ctx->dev.nreg16 >= 32)
        return seq_kv * dk_plus_dv > KV_IN_PLACE_512;
    return dk_plus_dv <= KV_IN_PLACE_DIMS && seq_kv * dk_plus_dv >= KV_IN_PLACE;
}

/* The most bytes of mask flags, spans and hulls: past it (a mask of 4·2^30 elements, or rows a
 * stride of 0 on the sequence does not share) the kernels scan the mask themselves. The kernels
 * count a row's flag offset in 32 bits (NARROW_KEYS, fused.cl). */
#define MASK_FLAGS_MAX ((uint64_t)1 << 28)

/* Whether the kernels that skip the blocks a mask hides (fused_direct, fused_lanes and the tiled
 * fused) read the mask's block flags (mask_flags, fused.cl), and where: when they would scan each
 * mask element for more than one row block, that is when batches or heads share the mask
 * (strides 0) or its rows (stride 0 on the sequence). The flags pass then reads the mask once,
 * and every later test of a block costs a byte a row and 16 keys instead of 16 mask entries. A
 * mask of finite values (nothing hidden) pays that one read and gains nothing. Flags start at
 * byte `at` of the workspace; unions: also each kv head's hull of spans, for the K/V copies. */
static void plan_mask_flags(const clattn_problem *p, uint64_t at, int unions, mask_flags *f)
{
    memset(f, 0, sizeof *f);
    if (!p->has_mask)
        return;
    const uint64_t nb = p->mask.stride[0] ? (uint64_t)p->batch : 1,
                   nh = p->mask.stride[1] ? (uint64_t)p->heads_q : 1,
                   rows = p->mask.stride[2] ? (uint64_t)p->seq_q : 1,
                   chunks = ((uint64_t)p->seq_kv + 15) / 16;
    const int shared = nb < (uint64_t)p->batch || nh < (uint64_t)p->heads_q || rows < (uint64_t)p->seq_q;
    const uint64_t nrows = clattn__mul_sat(nb * nh, rows),
                   bytes = clattn__mul_sat(nrows, chunks);
    /* The flags, padded to a multiple of 4 bytes of the workspace, then 8 bytes of span a row,
     * then 8 bytes of hull a kv head (unions). */
    const uint64_t zs = unions ? (uint64_t)p->batch * (uint64_t)p->heads_kv : 0,
                   span_at = clattn__add_sat(at, clattn__add_sat(bytes, 3)) / 4 * 4 - at,
                   all = clattn__add_sat(span_at, clattn__mul_sat(8, clattn__add_sat(nrows, zs)));
    if (!shared || all > MASK_FLAGS_MAX)
        return;
    f->on = 1;
    f->nh = (int)nh;
    f->rows = (int)rows;
    f->chunks = (int)chunks;
    f->slices = nb * nh;
    f->bytes = all;
    f->off = at;
    f->s_off = (at + span_at) / 4;
    f->unions = unions;
    f->u_off = f->s_off + 2 * nrows;
    f->ss = rows > 1 ? chunks : 0;
    f->sh = nh > 1 ? rows * chunks : 0;
    f->sb = nb > 1 ? nh * rows * chunks : 0;
}

/* With f on, gets (builds) the kernels that fill the flags, from the program of `opts`. */
static clattn_status get_mask_kernels(clattn_context *ctx, const char *opts, mask_flags *f)
{
    clattn_status st = CLATTN_SUCCESS;
    if (f->on && !(st = clattn__get_kernel(ctx, "fused.cl", opts, "mask_flags", &f->kflags)) &&
        !(st = clattn__get_kernel(ctx, "fused.cl", opts, "mask_spans", &f->kspans)) && f->unions)
        st = clattn__get_kernel(ctx, "fused.cl", opts, "mask_union", &f->kunion);
    return st;
}

/* The work-group of mask_spans and mask_union (fused.cl), which keep 64 work-items' values in
 * local memory: 64, or the largest power of 2 below that the device and the compiled kernel
 * allow. */
static size_t reduce_wg(const clattn_context *ctx, cl_kernel k)
{
    size_t kwg = 0, wg = 64;
    if (clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof kwg, &kwg, NULL) !=
        CL_SUCCESS)
        kwg = 0;
    while (wg > 1 && (wg > ctx->dev.max_wg || wg > ctx->dev.max_item[0] || (kwg > 0 && wg > kwg)))
        wg /= 2;
    return wg;
}

/* With f on, enqueues mask_flags, mask_spans and with f->unions mask_union (fused.cl), which
 * fill the flags, the spans and the unions f describes in ws, after the caller's wait list, and
 * empties that list: the queue is in order, so what the caller enqueues next waits for them.
 * Does nothing with f off. */
static clattn_status run_mask_flags(clattn_context *ctx, const clattn_problem *p, cl_mem ws,
                                    const mask_flags *f, cl_uint *num_wait, const cl_event **wait)
{
    if (!f->on)
        return CLATTN_SUCCESS;
    const int n = (int)p->seq_kv;
    clattn_args a = {f->kflags, 0, CL_SUCCESS};
    clattn__arg_view(&a, &p->mask);
    clattn__arg(&a, sizeof(int), &f->nh);
    clattn__arg(&a, sizeof(int), &f->rows);
    clattn__arg(&a, sizeof(int), &f->chunks);
    clattn__arg(&a, sizeof(int), &n);
    clattn__arg(&a, sizeof(cl_mem), &ws);
    clattn__arg(&a, sizeof(cl_ulong), &f->off);
    /* A work-group size, so that grids past the device's y and z limits (rows) run in chunks. */
    const size_t global[3] = {(size_t)(f->chunks + 15) / 16 * 16, (size_t)f->rows, (size_t)f->slices};
    const size_t local[3] = {16, 1, 1};
    clattn_status st = clattn__enqueue(ctx, &a, 3, global, ctx->dev.max_wg >= 16 ? local : NULL,
                                       *num_wait, *wait, NULL, "mask_flags");
    *num_wait = 0;
    *wait = NULL;
    if (st)
        return st;
    /* A work-group per row of flags. */
    size_t wg = reduce_wg(ctx, f->kspans);
    const size_t sglobal[2] = {wg, (size_t)f->slices * (size_t)f->rows}, slocal[2] = {wg, 1};
    clattn_args s = {f->kspans, 0, CL_SUCCESS};
    clattn__arg(&s, sizeof(cl_mem), &ws);
    clattn__arg(&s, sizeof(cl_ulong), &f->off);
    clattn__arg(&s, sizeof(int), &f->chunks);
    clattn__arg(&s, sizeof(cl_mem), &ws);
    clattn__arg(&s, sizeof(cl_ulong), &f->s_off);
    if ((st = clattn__enqueue(ctx, &s, 2, sglobal, slocal, 0, NULL, NULL, "mask_spans")) || !f->unions)
        return st;
    /* A work-group per kv head; the flag row strides in rows. */
    wg = reduce_wg(ctx, f->kunion);
    const cl_ulong rb = f->sb / (cl_ulong)f->chunks, rh = f->sh / (cl_ulong)f->chunks,
                   rs = f->ss / (cl_ulong)f->chunks;
    const int hkv = (int)p->heads_kv, group = (int)(p->heads_q / p->heads_kv), seq_q = (int)p->seq_q;
    const size_t uglobal[2] = {wg, (size_t)(p->batch * p->heads_kv)}, ulocal[2] = {wg, 1};
    clattn_args u = {f->kunion, 0, CL_SUCCESS};
    clattn__arg(&u, sizeof(cl_mem), &ws);
    clattn__arg(&u, sizeof(cl_ulong), &f->s_off);
    clattn__arg(&u, sizeof(cl_ulong), &f->u_off);
    clattn__arg(&u, sizeof(cl_ulong), &rb);
    clattn__arg(&u, sizeof(cl_ulong), &rh);
    clattn__arg(&u, sizeof(cl_ulong), &rs);
    clattn__arg(&u, sizeof(int), &hkv);
    clattn__arg(&u, sizeof(int), &group);
    clattn__arg(&u, sizeof(int), &seq_q);
    clattn__arg(&u, sizeof(int), &f->chunks);
    return clattn__enqueue(ctx, &u, 2, uglobal, ulocal, 0, NULL, NULL, "mask_union");
}

/* fused_direct (CPUs): one work-item per block of rm packed rows and key split. Prefill reads
 * f32 copies of K and V from the workspace, both in panels (fused.cl): Kᵀ by transpose_k16
 * with panels of bn keys, V zero-padded by pack_v with panels of 16 columns; decode, and prefill
 * with few rows per kv head or long K and V, read K and V in place (IN_PLACE: each key is
 * read once per row block, where a copy would triple the traffic; `in_place` asks for it,
 * clattn__direct_in_place says when it pays). The copies cover only the panels below their
 * batch's key length and, under a shared mask, those some row of the kv head sees (mask_union,
 * fused.cl). Sets *used = 0 (and enqueues nothing) when the copies and partials do not fit the
 * device's max allocation. */
static clattn_status run_direct(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                                int in_place, cl_uint num_wait, const cl_event *wait, cl_event *done,
                                int *used)
{
    *used = 0;
    const int group = (int)(p->heads_q / p->heads_kv), R = group * (int)p->seq_q;
    const int decode = p->seq_q <= 16;
    /* In place with automatic rows (prefill, or decode with RM 0): fewer than LANES_MIN_ROWS
     * packed rows in one block of fused_direct; that many or more in fused_lanes, in as few
     * blocks as LANES_ROWS allows, since each block reads K and V (all of them, but for causal
     * prefill). An explicit RM (the tuner's) keeps fused_direct, in blocks of at most 32 rows. */
    int rm0 = in_place && !decode ? 0 : pp->v[2], lanes = 0;
    if (in_place && rm0 <= 0) {
        if (R < LANES_MIN_ROWS) {
            rm0 = R;
        } else {
            lanes = ceil_div(ceil_div(R, ceil_div(R, LANES_ROWS)), 16);
            rm0 = 16 * lanes;
        }
    }
    int rm = rm0 < 1 ? 1 : rm0 > 32 && !lanes ? 32 : rm0, ns = 1;
    if (!in_place) { /* the scores' register tile, S[RM][NS] (fused.cl) */
        ns = pp->v[3];
        clattn__fit_fused_tile(ctx, p->head_dim_v, &rm, &ns);
    }
    const int bn = 16 * ns, dv16 = (int)((p->head_dim_v + 15) / 16);
    const uint64_t zs = (uint64_t)p->batch * (uint64_t)p->heads_kv;
    const uint64_t pitch = ((uint64_t)p->seq_kv + bn - 1) / bn * bn + 16; /* whole panels, and 16 floats of slack */
    const uint64_t vp_ss = 16u * (uint64_t)dv16;
    /* zs·head_dim and zs·vp_ss are below 2^40, pitch and seq_kv below 2^31: the products may
     * pass 2^64 (then total below sends the problem to the tiled kernel). */
    const uint64_t kt_floats = in_place ? 0 : clattn__mul_sat(zs * (uint64_t)p->head_dim, pitch),
                   vp_floats = in_place ? 0 : clattn__mul_sat(zs * vp_ss, (uint64_t)p->seq_kv);
    const int row_blocks = ceil_div(R, rm);
    int split_len;
    /* Long key ranges: chunks whose K/V copies take at most a quarter of the device's cache.
     * The split is the slowest grid dimension within a head, so consecutive work-groups (row
     * blocks) stream the same chunk while it is in cache instead of each sweeping all keys from
     * memory; the partials are then merged. */
    int want = decode ? pp->v[5] : 0;
    if (!in_place && ctx->dev.cache_size) {
        const uint64_t chunk = ctx->dev.cache_size / 4 / (4u * ((uint64_t)p->head_dim + vp_ss));
        if (chunk >= 16u * (uint64_t)bn && (uint64_t)p->seq_kv > chunk)
            want = (int)(((uint64_t)p->seq_kv + chunk - 1) / chunk);
    }
    const int splits = choose_splits(ctx, p, (long long)row_blocks * (long long)zs, bn, 1, want, &split_len);
    const uint64_t part = splits > 1 ? (uint64_t)splits * part_floats(p) : 0;
    uint64_t total = clattn__add_sat(clattn__add_sat(kt_floats, vp_floats), part);
    if (total > ctx->dev.max_alloc / 4 || total > (uint64_t)SIZE_MAX / 4)
        return CLATTN_SUCCESS;
    mask_flags mf;
    plan_mask_flags(p, total * 4, !in_place, &mf);
    if (mf.on) {
        const uint64_t with = clattn__add_sat(total, (mf.bytes + 3) / 4);
        if (with > ctx->dev.max_alloc / 4 || with > (uint64_t)SIZE_MAX / 4)
            mf.on = 0; /* the kernels scan the mask themselves */
        else
            total = with;
    }
    const int dp = in_place ? (int)((p->head_dim + 15) / 16 * 16) : (int)((p->head_dim + 3) / 4 * 4);
    const int kv_full = p->head_dim % 16 == 0 && p->head_dim_v % 16 == 0;

    /* Every kernel is built before anything is enqueued: a build failure leaves no partial work. */
    char dp16[24] = ""; /* in place: the query rows of qk16_row and qk16_tile (common.cl) */
    if (in_place)
        snprintf(dp16, sizeof dp16, " -DDP16=%d", dp);
    char lanes_opt[32] = ""; /* fused_lanes; LPF 1: software prefetches, on CPUs */
    if (lanes)
        snprintf(lanes_opt, sizeof lanes_opt, " -DLANES=%d -DLPF=%d", lanes,
                 (ctx->dev.type & CL_DEVICE_TYPE_CPU) != 0);
    /* The program holds the kernels taken from it below and no others (KSEL, common.cl). */
    char opts[400];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d -DWGX=1 -DWGY=1 "
             "-DRM=%d -DNS=%d -DVW=16 -DNV=1 -DDP=%d -DDV16=%d -DEXP2_POLY=1 -DIN_PLACE=%d -DKV_FULL=%d%s%s%s"
             " -DKSEL=1 -DK_%s=1%s%s",
             (int)p->dtype, splits > 1 ? (int)CLATTN_F32 : (int)p->out.dtype,
             p->has_mask ? (int)p->mask.dtype : 0, rm, ns, dp, dv16, in_place, kv_full,
             dp16, lanes_opt, mf.on ? " -DMFLAGS=1" : "", lanes ? "fused_lanes" : "fused_direct",
             in_place ? "" : " -DK_pack_v=1", mf.on ? " -DK_mask=1" : "");
    cl_kernel kpack = NULL, kdirect;
    clattn_status st;
    if ((!in_place && (st = clattn__get_kernel(ctx, "fused.cl", opts, "pack_v", &kpack))) ||
        (st = get_mask_kernels(ctx, opts, &mf)) ||
        (st = clattn__get_kernel(ctx, "fused.cl", opts, lanes ? "fused_lanes" : "fused_direct", &kdirect)))
        return st;
    cl_mem ws = NULL;
    if (total > 0 && (st = clattn__workspace(ctx, total * 4, &ws)))
        return st;
    *used = 1;
    /* Row blocks in y, kv heads and splits in z, flattened (row blocks fastest). */
    const size_t local[3] = {1, 1, 1};
    size_t global[3] = {1, (size_t)row_blocks, (size_t)zs * (size_t)splits};
    clattn__flatten_grid(global);
    if ((st = run_mask_flags(ctx, p, ws, &mf, &num_wait, &wait)))
        return st;
    if (in_place)
        return launch(ctx, p, kdirect, "fused_direct", &p->k, &p->v, ws, 0, splits, split_len, global,
                      local, &mf, num_wait, wait, done);
    /* The copies write only the panels below the batch's key length and, with a shared mask,
     * those some row of the kv head may see. */
    const cl_mem kspan = mf.on ? ws : NULL;
    const cl_ulong ks_off = mf.on ? mf.u_off : 0;
    if ((st = clattn__run_transpose_k(ctx, p, ws, 0, pitch, bn, kspan, ks_off, p->kv_lengths, num_wait,
                                      wait)))
        return st;
    /* The Kᵀ copy as a view: [z][key / bn][d][key % bn] in head blocks of head_dim·pitch floats,
     * z = b·heads_kv + hk (fused.cl reads a chunk's panel at its first key·head_dim). */
    const cl_ulong hk_n = (cl_ulong)p->heads_kv, kt_sz = (cl_ulong)p->head_dim * pitch;
    const clattn_view kt = {ws, CLATTN_F32, 0, {hk_n * kt_sz, kt_sz, (cl_ulong)bn}};
    const cl_ulong vp_off = kt_floats, vp_sz = (cl_ulong)p->seq_kv * vp_ss, vp_pitch = 16;
    const int n = (int)p->seq_kv, dv = (int)p->head_dim_v, hkv = (int)p->heads_kv;
    clattn_args a = {kpack, 0, CL_SUCCESS};
    clattn__arg_view(&a, &p->v);
    clattn__arg(&a, sizeof(cl_mem), &ws);
    clattn__arg(&a, sizeof(cl_ulong), &vp_off);
    clattn__arg(&a, sizeof(cl_ulong), &vp_sz);
    clattn__arg(&a, sizeof(int), &n);
    clattn__arg(&a, sizeof(int), &dv);
    clattn__arg(&a, sizeof(int), &hkv);
    clattn__arg(&a, sizeof(cl_mem), mf.on ? &kspan : NULL);
    clattn__arg(&a, sizeof(cl_ulong), &ks_off);
    clattn__arg(&a, sizeof(cl_mem), p->kv_lengths ? &p->kv_lengths : NULL);
    const size_t pglobal[2] = {(size_t)(((uint64_t)p->seq_kv + 15) / 16 * 16), (size_t)zs};
    const size_t plocal[2] = {16, 1};
    if ((st = clattn__enqueue(ctx, &a, 2, pglobal, ctx->dev.max_wg >= 16 ? plocal : NULL, 0, NULL,
                              NULL, "pack_v")))
        return st;

    /* The padded V copy as a view: [z][c / 16][key][c % 16] in head blocks of seq_kv·vp_ss floats
     * (fused.cl finds the panels from the head stride). */
    const clattn_view vpk = {ws, CLATTN_F32, vp_off, {hk_n * vp_sz, vp_sz, vp_pitch}};
    return launch(ctx, p, kdirect, "fused_direct", &kt, &vpk, ws, kt_floats + vp_floats, splits,
                  split_len, global, local, &mf, 0, NULL, done);
}

/* Whether a work-group of the decode kernels (decode_rows, decode_lanes) with `items`
 * work-items and `bytes` of local memory fits the device and `cap` (see fit). */
static int rows_fit(const clattn_context *ctx, size_t items, size_t bytes, size_t cap)
{
    return items <= cap && items <= ctx->dev.max_item[0] && clattn__local_fits(ctx, bytes);
}

/* The next smaller work-group of the decode kernels: fewer key groups, then fewer rows; 0 when
 * there is none. */
static int rows_shrink(int *kg, int *rm)
{
    if (*kg > 1)
        *kg /= 2;
    else if (*rm > 1)
        *rm = (*rm + 1) / 2;
    else
        return 0;
    return 1;
}

/* Builds kernel `name` of `file` with opts and launches it as the decode kernels run: work-groups
 * of wg work-items in x, row tiles in y, (batch, kv head, split) in z; sets *used once it has a
 * kernel and its workspace. */
static clattn_status launch_rows(clattn_context *ctx, const clattn_problem *p, const char *file,
                                 const char *name, const char *opts, int wg, int row_tiles, int splits,
                                 int split_len, cl_uint num_wait, const cl_event *wait, cl_event *done,
                                 int *used)
{
    cl_kernel k;
    clattn_status st = clattn__get_kernel(ctx, file, opts, name, &k);
    if (st)
        return st;
    cl_mem ws = NULL;
    if (splits > 1 && (st = clattn__workspace(ctx, (uint64_t)splits * part_floats(p) * 4, &ws)))
        return st;
    *used = 1;
    const size_t local[3] = {(size_t)wg, 1, 1};
    const size_t global[3] = {(size_t)wg, (size_t)row_tiles, (size_t)(p->batch * p->heads_kv) * (size_t)splits};
    return launch(ctx, p, k, name, &p->k, &p->v, ws, 0, splits, split_len, global, local, NULL, num_wait,
                  wait, done);
}

/* decode_rows (DECODE DIRECT 2 and 3, decode.cl; GPUs): KG key groups (WGY, a power of 2,
 * default 4) of W = ceil(head_dim_v / 4) work-items, RM packed rows per work-group (0: the packed
 * rows, up to 16), KL lanes reading each key row for the scores (NS; 1: a lane reads its own key's
 * row), LC loads in flight per lane (VW), K and V read from global memory without local tiles.
 * DIRECT 3 rounds W up to a power of 2 below 32 lanes, or to a multiple of 32 above (the extra
 * lanes own no O columns), so that on NVIDIA GPUs each group synchronises alone with PTX
 * barriers (GSYNC, see decode.cl); elsewhere it is DIRECT 2 with the rounded W. Sets *used = 0
 * (and enqueues nothing) when even one group does not fit the device's local memory or `cap`
 * work-items (see fit); the tiled kernel then runs instead. */
static clattn_status run_rows(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                              size_t cap, cl_uint num_wait, const cl_event *wait, cl_event *done,
                              int *used)
{
    *used = 0;
    const int R = (int)(p->heads_q / p->heads_kv) * (int)p->seq_q;
    const int group_sync = pp->v[6] == 3;
    const int dp = (int)((p->head_dim + 3) / 4 * 4);
    int w = (int)((p->head_dim_v + 3) / 4);
    if (group_sync)
        w = w <= 32 ? pow2_at_least(w) : (w + 31) / 32 * 32;
    int kg = 1;
    while (kg < 8 && 2 * kg <= (pp->v[1] > 0 ? pp->v[1] : 4))
        kg *= 2;
    int rm = pp->v[2] > 0 ? pp->v[2] : R;
    rm = rm < 1 ? 1 : rm > 16 ? 16 : rm;
    /* Lanes per key row (NS): a power of 2, at most W and at most the row's 16-byte chunks. */
    int kl = 1;
    while (kl < 32 && 2 * kl <= pp->v[3] && 2 * kl <= w && 2 * kl <= dp / 4)
        kl *= 2;
    /* Loads in flight per lane (VW): 4, 8 or 16. */
    const int lc = pp->v[4] == 4 || pp->v[4] == 16 ? pp->v[4] : 8;
    for (;;) {
        /* Sc and Pr, Sv, Pt (decode.cl: SP_FLOATS) */
        const size_t sp =
            (size_t)2 * kg * rm * w + (size_t)kg * w + (kl > 1 ? (size_t)kg * rm * w * (kl + 1) : 0);
        const size_t fin = (size_t)(kg / 2) * rm * (4 * w + 2);
        const size_t bytes = (size_t)16 * rm * (dp / 4) + 4 * (sp > fin ? sp : fin);
        if (rows_fit(ctx, (size_t)kg * w, bytes, cap))
            break;
        if (!rows_shrink(&kg, &rm))
            return CLATTN_SUCCESS;
    }
    const int bn = kg * w, row_tiles = ceil_div(R, rm);
    const long long tiles = (long long)row_tiles * p->batch * p->heads_kv;
    int split_len;
    /* Few registers and no local tiles: counted as half-size work-groups, so that twice as many
     * are in flight to hide memory latency (H100, B16 H32 kv8192 d128: 5 splits 1.47 TB/s,
     * 16 splits 1.68 TB/s). */
    const int splits =
        choose_splits(ctx, p, tiles, bn, bn / 2 > 0 ? bn / 2 : 1, pp->v[5], &split_len);

    /* PTX group barriers: NVIDIA GPUs only, groups of whole warps or within whole warps. */
    const int gsync = group_sync && (ctx->dev.type & CL_DEVICE_TYPE_GPU) && ctx->dev.vendor_id == 0x10de &&
                      (w % 32 == 0 || (32 % w == 0 && bn % 32 == 0));

    char opts[256];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d -DKG=%d -DW=%d -DRM=%d "
             "-DDP=%d -DKL=%d -DLC=%d -DKFULL=%d -DVFULL=%d -DGSYNC=%d",
             (int)p->dtype, splits > 1 ? (int)CLATTN_F32 : (int)p->out.dtype,
             p->has_mask ? (int)p->mask.dtype : 0, kg, w, rm, dp, kl, lc, p->head_dim % 4 == 0,
             4 * (int64_t)w == p->head_dim_v, gsync);
    return launch_rows(ctx, p, "decode.cl", "decode_rows", opts, bn, row_tiles, splits, split_len, num_wait,
                       wait, done, used);
}

/* decode_lanes (DECODE DIRECT 4 and 5, decode_lanes.cl; GPUs): KG key groups (WGY, a power of 2,
 * default 4) of LANES work-items (NS: a power of 2 up to 32 and up to the 16-byte chunks of the
 * longer of a K and a V row; 0 or 1: that many chunks, up to 32) that read every key row
 * together, RM packed rows (0: the packed rows; at most 16, and at most 16 O chunks a lane), KU
 * keys a step whose K and V rows are loaded before their use (VW: 1 to 16, default 8; fewer while
 * a lane would hold more than 16 row chunks or 64 scores). On NVIDIA GPUs with DIRECT 4 the lanes
 * sum their partial scores with PTX shuffles (SHFL), for which a work-group is made at least one
 * warp (more groups); elsewhere, and with DIRECT 5 (no inline PTX), through local memory. Sets
 * *used = 0 (and enqueues nothing) when one group does not fit the device's limits or `cap`
 * work-items; the tiled kernel then runs instead. */
static clattn_status run_lanes(clattn_context *ctx, const clattn_problem *p, const clattn_params *pp,
                               size_t cap, cl_uint num_wait, const cl_event *wait, cl_event *done,
                               int *used)
{
    *used = 0;
    const int R = (int)(p->heads_q / p->heads_kv) * (int)p->seq_q;
    const int dp = (int)((p->head_dim + 3) / 4 * 4), dvp = (int)((p->head_dim_v + 3) / 4 * 4);
    const int ptx = (ctx->dev.type & CL_DEVICE_TYPE_GPU) && ctx->dev.vendor_id == 0x10de && pp->v[6] == 4;
    const int chunks = (dp > dvp ? dp : dvp) / 4, most = pow2_at_least(chunks < 32 ? chunks : 32);
    int lanes = most;
    if (pp->v[3] >= 2) { /* at most one lane per chunk */
        lanes = 1;
        while (lanes < most && 2 * lanes <= pp->v[3])
            lanes *= 2;
    }
    int kg = 1;
    while (kg < 16 && 2 * kg <= (pp->v[1] > 0 ? pp->v[1] : 4))
        kg *= 2;
    if (ptx && kg * lanes < 32)
        kg = 32 / lanes; /* shuffles take whole warps */
    const int ckn = (dp / 4 + lanes - 1) / lanes, cvn = (dvp / 4 + lanes - 1) / lanes;
    /* Rows: the packed rows, at most 16 and at most 16 O chunks a lane, in tiles of equal size
     * (the work of a tile grows with RM whether its rows exist or not). */
    int rm = pp->v[2] > 0 ? pp->v[2] : R;
    rm = rm < 1 ? 1 : rm > R ? R : rm;
    while (rm > 1 && (rm > 16 || rm * cvn > 16))
        rm = (rm + 1) / 2;
    rm = ceil_div(R, ceil_div(R, rm));
    int ku = 1;
    while (ku < 16 && 2 * ku <= (pp->v[4] > 0 ? pp->v[4] : 8))
        ku *= 2;
    while (ku > 1 && (ku * (ckn + cvn) > 16 || rm * ku > 64))
        ku /= 2;
    int shfl;
    for (;;) {
        shfl = ptx && (kg * lanes) % 32 == 0;
        const size_t xch = shfl ? 0 : (size_t)2 * rm * ku * kg * lanes;
        const size_t fin = (size_t)(kg / 2) * rm * (4 * lanes * cvn + 4);
        const size_t bytes = (size_t)16 * rm * ckn * lanes + 4 * (xch > fin ? xch : fin);
        if (rows_fit(ctx, (size_t)kg * lanes, bytes, cap))
            break;
        if (!rows_shrink(&kg, &rm))
            return CLATTN_SUCCESS;
    }
    const int bn = kg * ku, wg = kg * lanes, row_tiles = ceil_div(R, rm);
    const long long tiles = (long long)row_tiles * p->batch * p->heads_kv;
    int split_len;
    /* Few registers and no local tiles, as decode_rows: counted as half-size work-groups. */
    const int splits =
        choose_splits(ctx, p, tiles, bn, wg / 2 > 0 ? wg / 2 : 1, pp->v[5], &split_len);

    char opts[256];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d -DKG=%d -DLANES=%d -DRM=%d "
             "-DDP=%d -DDVP=%d -DKU=%d -DKFULL=%d -DVFULL=%d -DSHFL=%d -DMASKED=%d",
             (int)p->dtype, splits > 1 ? (int)CLATTN_F32 : (int)p->out.dtype,
             p->has_mask ? (int)p->mask.dtype : 0, kg, lanes, rm, dp, dvp, ku, p->head_dim % 4 == 0,
             p->head_dim_v % 4 == 0, shfl, p->has_mask != 0);
    return launch_rows(ctx, p, "decode_lanes.cl", "decode_lanes", opts, wg, row_tiles, splits, split_len,
                       num_wait, wait, done, used);
}

/* The tiled kernel (fused.cl: fused) with configuration c, fitted to work-groups of at most cap
 * work-items. */
static clattn_status run_tiled(clattn_context *ctx, const clattn_problem *p, fused_cfg *c, size_t cap,
                               const clattn_params *pp, cl_uint num_wait, const cl_event *wait,
                               cl_event *done)
{
    const int R = (int)(p->heads_q / p->heads_kv) * (int)p->seq_q;
    const int decode = p->seq_q <= 16;
    if (!fit(ctx, c, (int)p->head_dim_v, cap))
        return clattn__fail(ctx, CLATTN_UNSUPPORTED,
                            "fused attention with head_dim %lld / head_dim_v %lld does not fit the "
                            "device's %llu bytes of local memory (%llu for a kernel's arrays)",
                            (long long)p->head_dim, (long long)p->head_dim_v,
                            (unsigned long long)ctx->dev.local_mem,
                            (unsigned long long)clattn__local_budget(ctx));
    const int bm = c->wgy * c->rm, bn = c->wgx * c->vw * c->ns;
    const int row_tiles = ceil_div(R, bm);
    const long long tiles = (long long)row_tiles * p->batch * p->heads_kv;

    int split_len;
    const int splits = choose_splits(ctx, p, tiles, bn, c->wgx * c->wgy,
                                     decode ? pp->v[5] : 0, &split_len);
    /* Workspace: the partials, then the mask's flags (bytes). */
    const uint64_t part_bytes = splits > 1 ? (uint64_t)splits * part_floats(p) * 4 : 0;
    mask_flags mf;
    plan_mask_flags(p, part_bytes, 0, &mf);
    if (mf.on && clattn__add_sat(part_bytes, mf.bytes) > ctx->dev.max_alloc)
        mf.on = 0; /* the kernel scans the mask itself */

    char opts[360];
    snprintf(opts, sizeof opts,
             "-cl-std=CL1.2 -cl-mad-enable -DDT_IN=%d -DDT_OUT=%d -DDT_MASK=%d -DWGX=%d -DWGY=%d -DRM=%d -DNS=%d "
             "-DVW=%d -DNV=%d -DDP=%d -DEXP2_POLY=%d%s -DKSEL=1 -DK_fused=1%s",
             (int)p->dtype, splits > 1 ? (int)CLATTN_F32 : (int)p->out.dtype,
             p->has_mask ? (int)p->mask.dtype : 0, c->wgx, c->wgy, c->rm, c->ns, c->vw, c->nv, c->dp,
             (ctx->dev.type & CL_DEVICE_TYPE_CPU) ? 1 : 0, mf.on ? " -DMFLAGS=1" : "",
             mf.on ? " -DK_mask=1" : "");
    cl_kernel k;
    clattn_status st;
    if ((st = get_mask_kernels(ctx, opts, &mf)) ||
        (st = clattn__get_kernel(ctx, "fused.cl", opts, "fused", &k)))
        return st;
    cl_mem ws = NULL;
    const uint64_t ws_bytes = part_bytes + (mf.on ? mf.bytes : 0);
    if (ws_bytes > 0 && (st = clattn__workspace(ctx, ws_bytes, &ws)))
        return st;
    if ((st = run_mask_flags(ctx, p, ws, &mf, &num_wait, &wait)))
        return st;
    const size_t local[3] = {(size_t)c->wgx, (size_t)c->wgy, 1};
    const size_t global[3] = {(size_t)c->wgx, (size_t)row_tiles * c->wgy,
                              (size_t)(p->batch * p->heads_kv) * (size_t)splits};
    return launch(ctx, p, k, "fused", &p->k, &p->v, ws, 0, splits, split_len, global, local, &mf, num_wait,
                  wait, done);
}

/* decode_lanes, the GPU defaults' decode kernel (DECODE DIRECT 4), takes at most 16 packed rows in
 * a block and keeps every row's scores and O in its lanes' registers; the tiled kernel shares each
 * K and V tile among its rows through local memory, and from 16 rows per kv head it is the faster
 * one. Measured on an H100 (NVIDIA driver 580, B16 H32/8 Skv8192 d128 f32, --check, median ms of
 * 20; decode_lanes with 4 and 8 key groups against the tiled kernel 8,4,4,1,4 and 8,8,4,1,4, row
 * tiles of 16 and 32): 8 rows (seq_q 2) 0.885 / 0.911 against 1.433 / 1.571; 16 rows (seq_q 4)
 * 2.234 / 1.848 against 1.448 / 1.579; 32 rows (seq_q 8) 4.099 / 3.432 against 2.694 / 1.654. On
 * an H200, 16 rows: 0.51 / 0.58 TB/s against 0.75 (row tile 16). With this rule, against
 * decode_lanes with 8 key groups in the same H100 session: 16 rows 1.458 against 1.876, 32 rows
 * 1.647 against 3.432, 64 rows (seq_q 16) 2.961 against 6.538; f16 16 rows 1.411 against 1.841,
 * 32 rows 1.555 against 3.392; 32 heads d64 seq_q 16 (16 rows) 2.108 against 3.595; 8 rows stay
 * on decode_lanes (0.895). The row tile covers the rows, up to 64 (the prefill default's). Wider
 * heads were not measured: they keep decode_lanes. The rule applies to the values the library
 * chose without a user's word (generic, vendor and built-in: tuning/nvidia-h200.tuning's decode
 * line was measured with one row per kv head, and a bucket says nothing of the heads' ratio). */
#define TILED_DECODE_ROWS 16

int clattn__decode_tiled_default(const clattn_context *ctx, int64_t rows, int64_t head_dim,
                                 int64_t head_dim_v, clattn_params_source source, int *v)
{
    if (!(ctx->dev.type & CL_DEVICE_TYPE_GPU) || source > CLATTN_SOURCE_BUILTIN || (v[6] != 4 && v[6] != 5) ||
        rows < TILED_DECODE_ROWS || head_dim > 128 || head_dim_v > 128)
        return 0;
    const int tiled[7] = {8, rows >= 64 ? 16 : (int)((rows + 3) / 4), 4, 1, 4, v[5], 0};
    memcpy(v, tiled, sizeof tiled);
    return 1;
}

clattn_status clattn__run_fused(clattn_context *ctx, const clattn_problem *p, cl_uint num_wait,
                                const cl_event *wait, cl_event *done)
{
    const int group = (int)(p->heads_q / p->heads_kv);
    const int R = group * (int)p->seq_q;
    const int decode = p->seq_q <= 16;
    clattn_bucket bucket = {decode ? CLATTN_OP_DECODE : CLATTN_OP_FUSED, p->dtype, (int)p->head_dim,
                            clattn__seq_q_class(p->seq_q), clattn__log2_ceil(p->seq_kv),
                            clattn__mask_kind(p->causal, p->has_mask || p->kv_lengths)};
    clattn_params pp;
    const clattn_params_source source = clattn__default_params(ctx, &bucket, &pp);
    if (decode)
        clattn__decode_tiled_default(ctx, R, p->head_dim, p->head_dim_v, source, pp.v);
    if (decode && pp.v[6] >= 2 && pp.v[6] <= 5) {
        /* A kernel compiled with more registers than its work-group allows is refitted to what it
         * allows (clattn__retry_cap); with no group left that fits, the tiled kernel runs. */
        int used;
        clattn_status st;
        for (size_t cap = ctx->dev.max_wg;;) {
            st = pp.v[6] >= 4 ? run_lanes(ctx, p, &pp, cap, num_wait, wait, done, &used)
                              : run_rows(ctx, p, &pp, cap, num_wait, wait, done, &used);
            if (used || !(cap = clattn__retry_cap(ctx, st, source, cap)))
                break;
        }
        if (st || used)
            return st;
    } else if (decode ? pp.v[6] > 0 : pp.v[5] > 0) {
        /* Copies of K and V that do not fit the max allocation: K and V read in place (only the
         * split partials, at most half of it, remain), before the tiled kernel, which is several
         * times slower on CPUs (PoCL, 2-core AMD EPYC, AVX2, B1 H8 Sq256 Skv8192 d64 causal, min
         * ms: copies 46-49, in place 33, tiled 375-411). */
        int used;
        for (int in_place = clattn__direct_in_place(ctx, R, p->seq_q, p->seq_kv, p->head_dim + p->head_dim_v);
             in_place <= 1; in_place++) {
            clattn_status st = run_direct(ctx, p, &pp, in_place, num_wait, wait, done, &used);
            if (st || used)
                return st;
        }
    }
    const int vw = pp.v[4] == 8 || pp.v[4] == 16 ? pp.v[4] : 4;
    /* RM and NS beyond the tuner's range (16, 2) only spill registers and can keep a kernel
     * compiler busy for minutes: at most 16 rows and 4 key blocks per work-item. */
    fused_cfg c = {pp.v[0] > 0 ? pp.v[0] : 8, pp.v[1] > 0 ? pp.v[1] : 1, pp.v[2] > 16 ? 16 : pp.v[2],
                   pp.v[3] <= 0 ? 1 : pp.v[3] > 4 ? 4 : pp.v[3], vw, 1, (int)((p->head_dim + 3) / 4 * 4)};
    if (c.rm <= 0) /* decode: one work-group row covers the packed rows, up to 16 */
        c.rm = pow2_at_least(R < 16 ? R : 16);
    for (size_t cap = ctx->dev.max_wg;;) {
        clattn_status st = run_tiled(ctx, p, &c, cap, &pp, num_wait, wait, done);
        if (!(cap = clattn__retry_cap(ctx, st, source, cap)))
            return st;
    }
}
