/*
 * clattn_attention against the float64 reference (ref/clattn_ref.c), fused and unfused paths.
 *
 * One table row is one problem (shapes, dtype, masks, layout, special inputs). The row runs with
 * every algorithm it names (FUSED and UNFUSED by default, AUTO where asked), each compared with the
 * reference computed on exactly the stored input values, and then fused and unfused are compared
 * with each other (they must agree to fp32 rounding plus one storage ulp). Every output buffer is
 * filled with a sentinel first and every element outside the output view must still hold it;
 * input buffers hold NaN outside their views, so a read outside a view shows up as NaN.
 *
 * Tolerances come from the storage precision (outputs are convex combinations of V in [-1, 1], so
 * |out| <= 1):
 *   f32 out: atol 2e-5, rtol 1e-4 (fp32 accumulation over a few hundred keys; long rows below).
 *   f16 out: the final store rounds to 2^-11 relative (|out| <= 1, so also 2^-11 absolute);
 *            atol 2^-10, rtol 2^-11.
 *   bf16 out: the same with 2^-8: atol 2^-7, rtol 2^-8.
 *   lse (always f32, computed in fp32 on exact stored inputs): atol 1e-5, rtol 4e-6 (~32 ulp).
 *   probabilities (f32): atol 1e-7, rtol 2e-5 (exp of a logit with ~1e-6 absolute error).
 *   fused vs unfused: fp32 error plus one storage ulp (2^-10 relative for f16, 2^-7 for bf16),
 *            since each path rounds its own fp32 result once. Requesting f16 probabilities must
 *            not cost the unfused output more than that (DESIGN: the paths agree to fp32 rounding).
 * Long rows: the softmax denominator, an fp32 sum of n positive terms, carries ~sqrt(n)·2^-24
 * relative error, so for seq_kv above 4096 the relative tolerances (and lse's atol, which is that
 * relative error) grow by sqrt(seq_kv / 4096). The numerator Σ e·v over V of random sign has
 * partial sums far below the denominator's, so its absolute error stays ~2^-24: atol does not grow.
 * Rows with logits shifted to ~1e4 add the fp32 rounding at that magnitude, see logit_error(), and
 * every row adds half an ulp of its largest logits (|lse|), which matters with scale -1e4.
 * Rows without a visible key must give exactly 0 and lse -inf; hidden probabilities exactly 0.
 */
#include "testutil.h"
#include "clshim.h" /* clshim_launched: whether fused_direct's K/V copies ran */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

#define F32 CLATTN_F32
#define F16 CLATTN_F16
#define BF16 CLATTN_BF16

/* =============================== the case table =============================== */

typedef enum mask_kind {
    MASK_NONE,
    MASK_FULL,          /* {B, Hq, Sq, Skv} */
    MASK_HEADS,         /* {B, 1, Sq, Skv}: broadcast over heads by a shape of 1 */
    MASK_SHARED,        /* {1, 1, Sq, Skv}: one mask for every batch and head */
    MASK_BATCH_ROWS,    /* {1, Hq, 1, Skv}: broadcast over batch and query rows */
    MASK_HEADS_STRIDE0, /* {B, Hq, Sq, Skv} with head stride 0: broadcast by stride */
    MASK_BATCH          /* {1, Hq, Sq, Skv}: broadcast over the batch */
} mask_kind;

typedef enum special_kind {
    SP_NONE,
    SP_SHIFT_MASK,  /* every finite mask entry + 1e4: logits ~1e4, same softmax */
    SP_SHIFT_QK,    /* q[.., D-1] = 100 and k[.., D-1] such that scale·q·k ~ 1e4 */
    SP_POISON,      /* NaN/Inf in K and V at keys hidden from every row (kv_lengths, -inf mask columns) */
    SP_POISON_DIAG, /* NaN in K and V at the last 2 keys of each batch: visible (NaN rows) only to the
                     * causal rows that reach them; every other row must stay finite and correct */
    SP_NAN_Q,       /* NaN in one visible Q row: that row NaN, every other row correct */
    SP_NAN_MASK,    /* NaN in one visible mask entry: its row(s) NaN, every other row correct */
    SP_UNDERFLOW_NAN,      /* odd keys ~3000 below the rest (weight 0, yet visible) with NaN in
                            * their V: the rows that see one are NaN */
    SP_UNDERFLOW_NAN_TAIL, /* every key but the first 4, NaN from key 16 on */
    SP_MASKED_ROW,  /* one mask row all -inf: that row exactly 0, lse -inf */
    SP_POISON_HIDDEN, /* NaN/Inf in K and V at every key hidden from all rows of its batch, by the
                       * mask (a window's past: whole blocks the CPU kernels skip) or kv_lengths */
    SP_NAN_V_ODD_HIDDEN /* NaN in V at key Skv/2 | 15, hidden by the mask from its odd rows only: the
                         * even rows NaN, the odd ones finite (their key groups must be checked) */
} special_kind;

enum { ALG_FUSED = 1, ALG_UNFUSED = 2, ALG_AUTO = 4 };

/* How a CPU's fused call reads K and V (src/fused_cpu.c: clattn__direct_in_place): PATH_ANY, not
 * checked; in place; over fused_direct's Kᵀ/V copies (pack_v); over the copies in key chunks
 * whose partials are merged (merge_strided); in place with AVX-512's register tiles and over the
 * copies with AVX2's or SSE's. */
typedef enum cpu_path { PATH_ANY, PATH_IN_PLACE, PATH_COPIES, PATH_CHUNKS, PATH_IN_PLACE_512 } cpu_path;

typedef struct att_case {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D, Dv; /* Dv 0: D */
    clattn_dtype dt;
    int causal;
    mask_kind mask;
    clattn_dtype mask_dt;
    int has_kv;
    int kv[4];
    tu_layout layout;
    float scale;
    special_kind special;
    int no_lse;
    int probs;       /* 0 none; 1 f32 probabilities (unfused/AUTO); 2 in the storage dtype */
    unsigned algos;  /* 0: FUSED | UNFUSED */
    float ramp;      /* mask entry of key j += ramp·j (contiguous mask): rows whose largest logit
                      * keeps rising along the keys (> 0), or sits in the first keys (< 0) */
    int bias;        /* a mask without -inf entries (a bias, as ALiBi's): it hides no key */
    int window;      /* > 0: mask row i hides every key outside the `window` keys ending at its
                      * diagonal key i + Skv - Sq (a sliding window; one mask row shared by the
                      * query rows takes row Sq - 1's) */
    int wshift;      /* the window's diagonal moves by wshift keys from one slice of the mask
                      * (batch, head) to the next, so that reading another slice's window is wrong */
    int sink;        /* with a window: keys 0 .. sink-1 stay visible too (attention sinks), a
                      * hidden gap between them and the window */
    int cache_kib;   /* > 0: the context plans for a device cache of this many KiB, so that
                      * fused_direct (CPUs) cuts its K/V copies into key chunks of a quarter of
                      * it, merged (src/fused.c), and for one compute unit, so that its key
                      * splits are those chunks alone; 0: the device as it is */
    cpu_path path;   /* where fused_direct or fused_lanes ran (CPUs), the path the fused call must
                      * have taken: check_cpu_path */
} att_case;

/* clang-format off */
static const att_case cases[] = {
    /* sequence lengths, head_dim 64, f32 */
    {"seq_1x1", 1, 1, 1, 1, 1, 64, 0, F32, .causal = 0},
    {"seq_7x7", 2, 2, 2, 7, 7, 64, 0, F32, .causal = 0},
    {"seq_7x7_causal", 2, 2, 2, 7, 7, 64, 0, F32, .causal = 1},
    {"seq_64x64", 2, 2, 2, 64, 64, 64, 0, F32, .causal = 0},
    {"seq_64x64_causal", 2, 2, 2, 64, 64, 64, 0, F32, .causal = 1},
    {"seq_113x203", 1, 2, 2, 113, 203, 64, 0, F32, .causal = 0},
    {"seq_113x203_causal", 1, 2, 2, 113, 203, 64, 0, F32, .causal = 1},
    {"seq_128x217_causal", 1, 2, 2, 128, 217, 64, 0, F32, .causal = 1},
    {"seq_217x128_causal", 1, 2, 1, 217, 128, 64, 0, F32, .causal = 1},
    {"seq_256x512", 1, 2, 2, 256, 512, 64, 0, F32, .causal = 0},
    {"seq_256x512_causal", 1, 2, 2, 256, 512, 64, 0, F32, .causal = 1},
    {"seq_512x256_causal", 1, 2, 2, 512, 256, 64, 0, F32, .causal = 1}, /* rows 0..255: no key */
    {"seq_1023x1024", 1, 1, 1, 1023, 1024, 64, 0, F32, .causal = 0},
    {"seq_1023x1024_causal", 1, 1, 1, 1023, 1024, 64, 0, F32, .causal = 1},

    /* head dimensions (33 x 47: a tail in every direction) */
    {"hd16", 1, 2, 1, 33, 47, 16, 0, F32, .causal = 0},
    {"hd32", 1, 2, 1, 33, 47, 32, 0, F32, .causal = 1},
    {"hd40", 1, 2, 1, 33, 47, 40, 0, F32, .causal = 0},
    {"hd59", 1, 2, 1, 33, 47, 59, 0, F32, .causal = 1},
    {"hd80", 1, 2, 1, 33, 47, 80, 0, F32, .causal = 0},
    {"hd96", 1, 2, 1, 33, 47, 96, 0, F32, .causal = 1},
    {"hd111", 1, 2, 1, 33, 47, 111, 0, F32, .causal = 0},
    {"hd128", 1, 2, 1, 33, 47, 128, 0, F32, .causal = 1},
    {"hd160", 1, 2, 1, 33, 47, 160, 0, F32, .causal = 0},
    {"hd256", 1, 2, 1, 33, 47, 256, 0, F32, .causal = 1},
    {"hd64_dv32", 1, 2, 2, 33, 47, 64, 32, F32, .causal = 1},
    {"hd40_dv128", 1, 2, 2, 33, 47, 40, 128, F32, .causal = 0},
    {"hd16_dv256", 1, 1, 1, 20, 37, 16, 256, F32, .causal = 0},
    {"hd256_dv16", 1, 1, 1, 20, 37, 256, 16, F32, .causal = 0},
    /* decode shapes (seq_q <= 16: on CPUs, K and V read in place, with tail loads when head_dim
     * or head_dim_v is not a multiple of 16) */
    {"decode_hd59", 1, 2, 1, 3, 47, 59, 0, F32, .causal = 1},
    {"decode_hd111_f16", 1, 2, 1, 1, 300, 111, 0, F16, .causal = 0},
    {"decode_hd40_dv128", 1, 2, 2, 4, 47, 40, 128, F32, .causal = 0},
    {"decode_hd256_dv16_bf16", 1, 1, 1, 2, 37, 256, 16, BF16, .causal = 1},
    {"decode_hd16_dv256_16rows", 1, 1, 1, 16, 37, 16, 256, F32, .causal = 0},
    {"decode_hd59_poison_kvlen", 2, 2, 2, 4, 70, 59, 0, F32, .has_kv = 1, .kv = {40, 3}, .special = SP_POISON},
    /* more than 16 packed rows: one block of 20 (with tails), two of 20 (fused_lanes on CPUs,
     * as from 11 rows: decode_hd16_dv256_16rows too) */
    {"decode_gqa5_sq4_rows20_mask_f16_hd72", 1, 10, 2, 4, 300, 72, 0, F16, .mask = MASK_HEADS,
     .mask_dt = F16},
    {"decode_gqa8_sq5_rows40_causal_kvlen_hd59", 2, 16, 2, 5, 200, 59, 0, F32, .causal = 1, .has_kv = 1,
     .kv = {200, 7}},
    {"decode_gqa8_sq4_rows32_hd256_f16", 1, 16, 2, 4, 300, 256, 0, F16, .causal = 1},

    /* prefill with few rows per kv head (up to 64): on CPUs, K and V read in place as for
     * decode, in one block of rows whose size is not the default row block's */
    {"few_rows_sq17_causal_mask_f16_kvlen", 2, 2, 2, 17, 90, 64, 0, F16, .causal = 1, .mask = MASK_FULL,
     .mask_dt = F16, .has_kv = 1, .kv = {90, 37}},
    {"few_rows_sq32_hd59_poison_kvlen", 2, 2, 2, 32, 70, 59, 0, F32, .has_kv = 1, .kv = {40, 3},
     .special = SP_POISON},
    {"few_rows_sq24_bf16_hd40_dv128_causal", 1, 2, 2, 24, 47, 40, 128, BF16, .causal = 1},
    /* K and V of 10 MB a head, 40 rows in place (three vectors of lanes on CPUs) */
    {"few_rows_sq40_kv20000_causal", 1, 1, 1, 40, 20000, 64, 0, F32, .causal = 1, .special = SP_POISON_DIAG},
    /* blocks of 32 rows with head_dim 256: P·V in register tiles, 100 KiB of private arrays */
    {"few_rows_sq32_hd256_causal_mask", 1, 2, 2, 32, 100, 256, 0, F32, .causal = 1, .mask = MASK_HEADS,
     .mask_dt = F32},

    /* more than 16 packed rows in place on CPUs: rows in vector lanes (fused_lanes), 2 to 4
     * vectors of 16 a block: tails of head_dim (f16 K converted 16 at a time) and head_dim_v (a
     * last O tile of 1 column), empty lanes (48 and 100 rows), the moving reference lane by
     * lane, hidden and underflowing keys skipped or not lane by lane */
    {"lanes_gqa6_sq4_rows24_f16_hd59_dv37_causal_kvlen", 2, 12, 2, 4, 300, 59, 37, F16, .causal = 1,
     .has_kv = 1, .kv = {300, 9}},
    {"lanes_gqa16_sq4_rows64_causal_mask_kvlen_hd128", 2, 32, 2, 4, 500, 128, 0, F32, .causal = 1,
     .mask = MASK_HEADS, .mask_dt = F32, .has_kv = 1, .kv = {77, 500}},
    {"lanes_gqa25_sq4_rows100_bf16_dv16", 1, 25, 1, 4, 300, 64, 16, BF16, .causal = 0},
    {"lanes_gqa12_sq4_rows48_ramp_up", 1, 12, 1, 4, 300, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32,
     .ramp = 0.5f},
    {"lanes_gqa5_sq4_ramp_down_f16", 1, 5, 1, 4, 300, 64, 0, F16, .mask = MASK_FULL, .mask_dt = F32,
     .ramp = -0.5f},
    {"lanes_gqa8_sq3_nan_q", 2, 16, 2, 3, 300, 64, 0, F32, .special = SP_NAN_Q},
    {"lanes_gqa8_sq3_underflow_nan_v_causal", 1, 8, 1, 3, 2500, 64, 0, F32, .causal = 1,
     .special = SP_UNDERFLOW_NAN},
    {"lanes_sq17_underflow_nan_v_tail_mask_f16", 1, 2, 2, 17, 256, 64, 0, F16, .mask = MASK_HEADS,
     .mask_dt = F16, .special = SP_UNDERFLOW_NAN_TAIL},
    {"lanes_sq32_poison_mask_columns_f16", 2, 2, 2, 32, 70, 64, 0, F16, .mask = MASK_BATCH_ROWS,
     .mask_dt = F32, .special = SP_POISON},
    {"lanes_gqa4_sq5_masked_row", 1, 4, 1, 5, 100, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32,
     .special = SP_MASKED_ROW},
    {"lanes_gqa8_sq5_poison_causal_diagonal_hd40", 2, 16, 2, 5, 70, 40, 0, F32, .causal = 1,
     .special = SP_POISON_DIAG},
    /* one vector of lanes with 11 to 16 rows (decode of 11 or more rows goes to fused_lanes):
     * 5 and 3 lanes empty, with tails, masks, per-batch key lengths and poisoned hidden keys */
    {"lanes_gqa11_sq1_rows11_f16_hd128_mask_kvlen", 2, 22, 2, 1, 300, 128, 0, F16, .mask = MASK_HEADS,
     .mask_dt = F16, .has_kv = 1, .kv = {300, 5}},
    {"lanes_gqa13_sq1_rows13_poison_kvlen_bf16_hd59_dv37", 2, 26, 2, 1, 70, 59, 37, BF16, .has_kv = 1,
     .kv = {40, 3}, .special = SP_POISON},
    /* f16 and bf16 V wider than 128 columns: converted and multiplied in chunks of 128 (the
     * second one 75 columns, ending in a tile of 3; or 16), hidden keys skipped in each */
    {"lanes_gqa8_sq4_rows32_f16_hd48_dv203_causal_mask_kvlen", 2, 16, 2, 4, 300, 48, 203, F16,
     .causal = 1, .mask = MASK_HEADS, .mask_dt = F16, .has_kv = 1, .kv = {300, 9}},
    {"lanes_gqa13_sq1_rows13_poison_kvlen_bf16_dv144", 2, 26, 2, 1, 70, 64, 144, BF16, .has_kv = 1,
     .kv = {40, 3}, .special = SP_POISON},
    /* the largest private arrays: 64 rows of head_dim 256 (Qᵀ and Oᵀ 64 KiB each) */
    {"lanes_mqa64_sq1_rows64_hd256_f16", 1, 64, 1, 1, 300, 256, 0, F16, .causal = 0},

    /* grouped-query attention */
    {"gqa_3to1", 2, 6, 2, 37, 53, 64, 0, F32, .causal = 1},
    {"gqa_8to1", 1, 16, 2, 20, 70, 64, 0, F32, .causal = 0},
    {"mqa_4to1", 2, 4, 1, 29, 41, 64, 0, F32, .causal = 1},
    {"mqa_4to1_mask_heads", 2, 4, 1, 29, 41, 64, 0, F32, .mask = MASK_HEADS},

    /* masks alone, f32 and f16, full and broadcast */
    {"mask_full_f32", 2, 2, 2, 33, 47, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32},
    {"mask_full_f16", 2, 2, 2, 33, 47, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F16},
    {"mask_heads", 2, 3, 3, 33, 47, 64, 0, F32, .mask = MASK_HEADS, .mask_dt = F32},
    {"mask_shared_f16", 2, 3, 3, 33, 47, 64, 0, F32, .mask = MASK_SHARED, .mask_dt = F16},
    {"mask_batch_rows", 2, 3, 3, 33, 47, 64, 0, F32, .mask = MASK_BATCH_ROWS, .mask_dt = F32},
    {"mask_heads_stride0", 2, 3, 3, 33, 47, 64, 0, F32, .mask = MASK_HEADS_STRIDE0, .mask_dt = F32},
    /* bias masks (no -inf): the CPU kernels multiply a block that hides no key without checks;
     * blocks that causal or key lengths cut still check, and a NaN in the bias still reaches its
     * row. Prefill over the copies (256-key blocks, a partial last one), in place with key
     * lengths, fused_lanes (32 rows a kv head), and with causal, key lengths and a NaN entry. */
    {"bias_mask_300x700", 1, 2, 2, 300, 700, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32, .bias = 1},
    {"bias_mask_decode_kvlen_hd128", 2, 4, 4, 1, 1000, 128, 0, F32, .mask = MASK_HEADS, .mask_dt = F32,
     .has_kv = 1, .kv = {1000, 300}, .bias = 1},
    {"bias_mask_lanes_gqa8_sq4_f16", 2, 16, 2, 4, 600, 64, 0, F16, .mask = MASK_FULL, .mask_dt = F16, .bias = 1},
    /* fused_lanes adds a mask 16 keys at a time (rows turned into lanes); causal hides a row's
     * last keys inside such a chunk when the key count is a multiple of 16 (512, and 400 by key
     * length), where a finite mask value must not make them visible */
    {"bias_mask_lanes_gqa4_sq8_causal_kvlen_kv512", 2, 4, 1, 8, 512, 64, 0, F32, .causal = 1,
     .mask = MASK_FULL, .mask_dt = F32, .has_kv = 1, .kv = {512, 400}, .bias = 1},
    /* with fewer registers (AVX2, SSE) 8 or 4 rows at a time: 18 rows of seq_q 3, so those
     * blocks of rows hold other positions (rows 0-7 positions 0,1,2,0,1,2,0,1; rows 8-15
     * 2,0,1,2,0,1,2,0) and end at other keys, inside the last 8-key block */
    {"bias_mask_lanes_gqa6_sq3_causal_kv304", 1, 12, 2, 3, 304, 64, 0, F32, .causal = 1,
     .mask = MASK_FULL, .mask_dt = F32, .bias = 1},
    {"bias_mask_causal_kvlen_nan", 2, 2, 1, 70, 600, 64, 0, F32, .causal = 1, .mask = MASK_FULL, .mask_dt = F32,
     .has_kv = 1, .kv = {600, 400}, .special = SP_NAN_MASK, .bias = 1},
    {"bias_mask_nan_v_odd_rows_hide", 1, 2, 2, 40, 300, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32,
     .bias = 1, .special = SP_NAN_V_ODD_HIDDEN},
    {"bias_mask_lanes_gqa8_sq4_nan_v_odd_rows_hide_f16", 1, 16, 2, 4, 300, 64, 0, F16, .mask = MASK_FULL,
     .mask_dt = F16, .bias = 1, .special = SP_NAN_V_ODD_HIDDEN},
    /* the same NaN in fused_direct, which checks the 16-key vectors where some row of its block
     * hides a key: over the copies (P·V untiled with d64, in register tiles with d128), and in
     * place (4 rows) */
    {"bias_mask_nan_v_odd_rows_hide_copies", 1, 2, 2, 300, 300, 64, 0, F32, .mask = MASK_FULL,
     .mask_dt = F32, .bias = 1, .special = SP_NAN_V_ODD_HIDDEN},
    {"bias_mask_nan_v_odd_rows_hide_copies_hd128", 1, 2, 2, 200, 300, 128, 0, F32,
     .mask = MASK_FULL, .mask_dt = F32, .bias = 1, .special = SP_NAN_V_ODD_HIDDEN},
    {"bias_mask_nan_v_odd_rows_hide_sq4", 1, 2, 2, 4, 300, 64, 0, F32, .mask = MASK_FULL,
     .mask_dt = F32, .bias = 1, .special = SP_NAN_V_ODD_HIDDEN},
    /* sliding-window masks: the fused kernels skip a block that the mask hides from all its rows
     * (dot products included), so K and V are poisoned wherever no row of the batch looks.
     * Prefill over the copies (the window's 100 keys end 400 past the row), few rows in place
     * (bf16, a window of 50: a 16-key scan tail), fused_lanes (32 rows a kv head), decode with
     * an f16 mask, and causal with key lengths that leave batch 1's rows no key at all. */
    {"window_300x700_w100", 1, 2, 2, 300, 700, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32, .bias = 1,
     .window = 100, .special = SP_POISON_HIDDEN},
    {"window_few_rows_sq32_w50_bf16", 2, 2, 2, 32, 500, 64, 0, BF16, .mask = MASK_FULL, .mask_dt = F32,
     .window = 50, .has_kv = 1, .kv = {500, 470}, .special = SP_POISON_HIDDEN},
    {"window_lanes_gqa8_sq4_w40", 2, 16, 2, 4, 600, 64, 0, F32, .mask = MASK_HEADS, .mask_dt = F32, .bias = 1,
     .window = 40, .special = SP_POISON_HIDDEN},
    {"window_decode_sq1_w33_f16mask_kvlen", 2, 4, 4, 1, 1000, 128, 0, F32, .mask = MASK_HEADS,
     .mask_dt = F16, .window = 33, .has_kv = 1, .kv = {1000, 500}, .special = SP_POISON_HIDDEN},
    /* decode over a long cache: the window's 3000 keys at its end leave whole key splits hidden,
     * and the GPU decode kernels read K and V only for keys one of their 16 rows sees (the
     * window's edges move one key a position) */
    {"window_decode_gqa4_sq4_kv40000_w3000", 1, 8, 2, 4, 40000, 128, 0, F32, .mask = MASK_HEADS,
     .mask_dt = F32, .bias = 1, .window = 3000, .special = SP_POISON_HIDDEN},
    /* a window of 1 key (the diagonal) cut by key lengths: in the row block whose first row's
     * key is its batch's last, that key alone is visible, at the end of the 16-key scan's tail */
    {"window1_kvlen_edges", 4, 1, 1, 64, 200, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32, .bias = 1,
     .window = 1, .has_kv = 1, .kv = {152, 153, 154, 155}, .special = SP_POISON_HIDDEN},
    {"window1_kvlen_edges_copies", 4, 1, 1, 300, 440, 64, 0, F32, .mask = MASK_SHARED, .mask_dt = F32,
     .bias = 1, .window = 1, .has_kv = 1, .kv = {327, 328, 329, 330}, .special = SP_POISON_HIDDEN},
    /* windows that move from one mask slice to the next, in masks shared by heads or batches:
     * the fused kernels (the CPUs' and the tiled one) then test blocks on flags the library
     * derives from the mask (mask_flags, mask_pass.cl), one slice per batch or head, and reading the
     * wrong slice's or row's flags would skip keys the row sees. Prefill over 80 packed rows of two heads each, fused_lanes
     * (16 rows, f16), decode with a head stride of 0 and key lengths. */
    {"window_shift_heads_gqa2_sq40", 2, 4, 2, 40, 900, 64, 0, F32, .mask = MASK_BATCH, .mask_dt = F32,
     .bias = 1, .window = 64, .wshift = -200, .special = SP_POISON_HIDDEN},
    {"window_shift_batch_lanes_gqa4_sq4_f16", 3, 8, 2, 4, 2000, 64, 0, F16, .mask = MASK_HEADS,
     .mask_dt = F16, .bias = 1, .window = 100, .wshift = -500, .special = SP_POISON_HIDDEN},
    {"window_shift_decode_stride0_kvlen", 2, 4, 4, 1, 3000, 128, 0, F32, .mask = MASK_HEADS_STRIDE0,
     .mask_dt = F32, .bias = 1, .window = 200, .wshift = -1000, .has_kv = 1, .kv = {3000, 2500},
     .special = SP_POISON_HIDDEN},
    /* the 3 keys a row sees lie in the last, short 16-key chunk (keys 992..1000) */
    {"window3_tail_chunk_decode_shared", 2, 2, 2, 1, 1001, 64, 0, F32, .mask = MASK_SHARED, .mask_dt = F32,
     .bias = 1, .window = 3, .special = SP_POISON_HIDDEN},
    {"window_causal_kvlen_shared_f16mask", 2, 2, 1, 200, 600, 64, 0, F32, .causal = 1, .mask = MASK_SHARED,
     .mask_dt = F16, .window = 77, .has_kv = 1, .kv = {600, 350}, .special = SP_POISON_HIDDEN},
    /* attention sinks: the first keys stay visible with the window, so a row's visible keys have a
     * hidden gap, and its span (first to last visible chunk, which the fused kernels narrow their
     * keys to) covers the gap; the windows move by slice, so some rows' windows end before the
     * last key. Prefill over the copies (80 packed rows a kv head, from two query heads),
     * fused_lanes. */
    {"window_sinks_shift_heads_gqa2_sq40", 2, 4, 2, 40, 900, 64, 0, F32, .mask = MASK_BATCH, .mask_dt = F32,
     .bias = 1, .window = 64, .wshift = -200, .sink = 5, .special = SP_POISON_HIDDEN},
    {"window_sinks_shift_lanes_gqa4_sq4_f16", 3, 8, 2, 4, 2000, 64, 0, F16, .mask = MASK_HEADS,
     .mask_dt = F16, .bias = 1, .window = 100, .wshift = -500, .sink = 20, .special = SP_POISON_HIDDEN},
    /* one window row shared by the query rows (a stride of 0 on the sequence), moving by head */
    {"window_bcast_rows_shift_heads_gqa2", 2, 4, 2, 40, 900, 64, 0, F32, .mask = MASK_BATCH_ROWS,
     .mask_dt = F32, .bias = 1, .window = 64, .wshift = -200, .special = SP_POISON_HIDDEN},
    /* a shared mask that hides every key from every row: each row block's span is empty */
    {"masked_row_shared_decode_gqa2", 2, 4, 2, 1, 300, 64, 0, F32, .mask = MASK_SHARED,
     .mask_dt = F32, .special = SP_MASKED_ROW},

    /* kv_lengths alone and together with causal and a mask */
    {"kvlen", 3, 2, 2, 19, 64, 64, 0, F32, .has_kv = 1, .kv = {64, 17, 40}},
    {"kvlen_zero", 2, 2, 2, 19, 64, 64, 0, F32, .has_kv = 1, .kv = {0, 30}},
    {"kvlen_clamped", 2, 2, 2, 19, 64, 64, 0, F32, .has_kv = 1, .kv = {-5, 1000}},
    {"kvlen_causal", 3, 2, 2, 19, 64, 64, 0, F32, .causal = 1, .has_kv = 1, .kv = {64, 17, 40}},
    {"causal_mask_kvlen", 3, 4, 2, 45, 77, 64, 0, F32, .causal = 1, .mask = MASK_FULL, .mask_dt = F32,
     .has_kv = 1, .kv = {77, 50, 0}},
    {"causal_mask_f16_kvlen_gqa", 2, 6, 2, 70, 150, 40, 0, F32, .causal = 1, .mask = MASK_HEADS,
     .mask_dt = F16, .has_kv = 1, .kv = {150, 101}},

    /* layouts */
    {"layout_bshd", 2, 4, 2, 33, 47, 64, 0, F32, .causal = 1, .layout = LAYOUT_BSHD},
    {"layout_bshd_mask_kvlen", 2, 4, 4, 33, 70, 32, 0, F32, .mask = MASK_FULL, .mask_dt = F32, .has_kv = 1,
     .kv = {70, 33}, .layout = LAYOUT_BSHD},
    {"layout_padded", 2, 2, 1, 33, 47, 59, 0, F32, .layout = LAYOUT_PADDED},
    {"layout_padded_causal_mask_kvlen", 2, 4, 2, 40, 90, 64, 48, F32, .causal = 1, .mask = MASK_BATCH_ROWS,
     .mask_dt = F16, .has_kv = 1, .kv = {90, 61}, .layout = LAYOUT_PADDED, .probs = 1},
    {"layout_padded_f16", 1, 2, 2, 33, 47, 64, 0, F16, .causal = 1, .layout = LAYOUT_PADDED},

    /* special values */
    {"masked_row", 2, 2, 2, 33, 47, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32, .special = SP_MASKED_ROW,
     .probs = 1},
    {"masked_row_heads_f16", 2, 2, 2, 33, 47, 64, 0, F16, .mask = MASK_HEADS, .mask_dt = F16,
     .special = SP_MASKED_ROW},
    {"shift_mask_1e4", 2, 2, 2, 33, 47, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32, .special = SP_SHIFT_MASK,
     .probs = 1},
    {"shift_qk_1e4", 1, 2, 2, 33, 47, 64, 0, F32, .causal = 1, .special = SP_SHIFT_QK},
    {"shift_qk_1e4_f16", 1, 2, 2, 33, 47, 64, 0, F16, .special = SP_SHIFT_QK},
    /* The fused kernels move a row's reference maximum only when a score passes it by a margin
     * (8·ln 2): rising by 16 per 32-key block (moves every block), by 3.2 (every other block,
     * probabilities up to 2^8 in between) and falling (never moves after the first block). */
    {"ramp_up", 1, 2, 2, 40, 300, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32, .ramp = 0.5f, .probs = 1},
    {"ramp_slow_causal", 1, 2, 2, 40, 300, 64, 0, F32, .causal = 1, .mask = MASK_FULL, .mask_dt = F32,
     .ramp = 0.1f},
    {"ramp_down_decode", 2, 4, 1, 3, 300, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32, .ramp = -0.5f},
    {"scale_neg_1e4", 2, 2, 2, 33, 47, 64, 0, F32, .scale = -1e4f, .probs = 1},
    {"scale_explicit", 2, 2, 1, 33, 47, 64, 0, F32, .scale = 0.3f},
    {"poison_kvlen", 2, 2, 2, 33, 70, 64, 0, F32, .has_kv = 1, .kv = {40, 3}, .special = SP_POISON},
    {"poison_kvlen_causal", 2, 2, 2, 33, 70, 64, 0, F32, .causal = 1, .has_kv = 1, .kv = {40, 61},
     .special = SP_POISON},
    {"poison_mask_columns", 2, 2, 2, 33, 70, 64, 0, F32, .mask = MASK_BATCH_ROWS, .mask_dt = F32,
     .special = SP_POISON, .probs = 1},
    {"poison_all_f16", 2, 4, 2, 33, 70, 64, 0, F16, .causal = 1, .mask = MASK_HEADS, .mask_dt = F16, .has_kv = 1,
     .kv = {50, 70}, .special = SP_POISON},
    {"poison_causal_diagonal", 2, 2, 2, 70, 70, 64, 0, F32, .causal = 1, .special = SP_POISON_DIAG},
    /* CPU kernels with O in register tiles (fused_direct PV_TILE) and, for 16 packed rows, the
     * scores too (QK_TILE, with tail loads at head_dim 59): the tiles' hidden-key path */
    {"poison_causal_33x70_gqa_hd256", 2, 4, 2, 33, 70, 256, 0, F32, .causal = 1, .special = SP_POISON_DIAG},
    {"poison_causal_decode_sq5_hd128", 1, 4, 2, 5, 70, 128, 0, F32, .causal = 1, .special = SP_POISON_DIAG},
    {"poison_mask_gqa16_decode_hd59", 1, 16, 1, 1, 70, 59, 0, F32, .mask = MASK_HEADS, .mask_dt = F32,
     .special = SP_POISON},
    {"decode_gqa8_sq2_causal_hd128", 1, 16, 2, 2, 70, 128, 0, F32, .causal = 1},
    /* O tiles carried over five 256-key blocks, 128 row tiles: not split on CPUs */
    {"hd256_256x1100_causal", 1, 2, 1, 256, 1100, 256, 0, F32, .causal = 1},
    {"poison_causal_33x70_gqa", 2, 4, 2, 33, 70, 64, 0, F32, .causal = 1, .special = SP_POISON_DIAG},
    {"poison_causal_kvlen_f16", 2, 2, 1, 40, 90, 64, 0, F16, .causal = 1, .has_kv = 1, .kv = {90, 37},
     .special = SP_POISON_DIAG},
    {"nan_q_row", 2, 4, 2, 33, 47, 64, 0, F32, .special = SP_NAN_Q},
    {"nan_q_row_causal_mask_f16", 2, 4, 2, 33, 47, 64, 0, F16, .causal = 1, .mask = MASK_FULL, .mask_dt = F32,
     .special = SP_NAN_Q, .probs = 1},
    {"nan_q_row_decode", 2, 4, 1, 1, 47, 64, 0, F32, .special = SP_NAN_Q},
    {"nan_mask_entry", 2, 2, 2, 33, 47, 64, 0, F32, .mask = MASK_FULL, .mask_dt = F32, .special = SP_NAN_MASK,
     .probs = 1},
    {"nan_mask_entry_decode_f16_heads", 1, 4, 2, 2, 300, 64, 0, F32, .causal = 1, .mask = MASK_HEADS,
     .mask_dt = F16, .special = SP_NAN_MASK},
    /* NaN in V at a visible key whose weight underflows: unchecked blocks (no mask), checked
     * ones (mask, causal diagonal, key lengths), probabilities, and decode key groups and splits
     * that merge with weight 0 */
    {"underflow_nan_v", 1, 2, 2, 33, 300, 64, 0, F32, .special = SP_UNDERFLOW_NAN},
    {"underflow_nan_v_causal_mask", 2, 2, 1, 40, 300, 64, 0, F32, .causal = 1, .mask = MASK_FULL,
     .mask_dt = F32, .special = SP_UNDERFLOW_NAN, .probs = 1},
    {"underflow_nan_v_tail_f16_kvlen", 2, 2, 2, 33, 300, 64, 0, F16, .has_kv = 1, .kv = {300, 130},
     .special = SP_UNDERFLOW_NAN_TAIL},
    {"underflow_nan_v_decode", 2, 4, 2, 1, 3000, 64, 0, F32, .has_kv = 1, .kv = {3000, 1700},
     .special = SP_UNDERFLOW_NAN},
    {"underflow_nan_v_decode_tail", 2, 4, 2, 1, 3000, 64, 0, F32, .has_kv = 1, .kv = {3000, 30},
     .special = SP_UNDERFLOW_NAN_TAIL},
    {"underflow_nan_v_decode_sq3_causal", 1, 4, 1, 3, 2500, 64, 0, F32, .causal = 1,
     .special = SP_UNDERFLOW_NAN},
    {"underflow_nan_v_decode_tail_sq2_mask", 1, 4, 2, 2, 256, 64, 0, F32, .mask = MASK_HEADS,
     .mask_dt = F32, .special = SP_UNDERFLOW_NAN_TAIL},

    /* f16 and bf16 storage */
    {"f16_64x64", 2, 2, 2, 64, 64, 64, 0, F16, .causal = 0},
    {"f16_113x203_causal_gqa_mask", 1, 4, 2, 113, 203, 64, 0, F16, .causal = 1, .mask = MASK_FULL,
     .mask_dt = F16},
    {"f16_hd128_kvlen", 2, 2, 2, 33, 47, 128, 0, F16, .has_kv = 1, .kv = {47, 20}},
    {"bf16_64x64", 2, 2, 2, 64, 64, 64, 0, BF16, .causal = 0},
    {"bf16_113x203_causal_gqa_mask", 1, 4, 2, 113, 203, 64, 0, BF16, .causal = 1, .mask = MASK_FULL,
     .mask_dt = F32},
    {"bf16_hd40_dv128", 1, 2, 1, 33, 47, 40, 128, BF16, .causal = 1},

    /* probabilities (unfused only), AUTO, no lse */
    {"probs", 2, 2, 2, 33, 47, 64, 0, F32, .probs = 1},
    {"probs_causal_mask_kvlen", 3, 2, 1, 33, 47, 64, 0, F32, .causal = 1, .mask = MASK_FULL, .mask_dt = F32,
     .has_kv = 1, .kv = {47, 10, 0}, .probs = 1},
    {"probs_f16_storage", 2, 2, 2, 33, 47, 64, 0, F16, .probs = 2},
    {"auto_probs", 2, 2, 2, 33, 47, 64, 0, F32, .causal = 1, .probs = 1,
     .algos = ALG_AUTO | ALG_FUSED | ALG_UNFUSED},
    {"auto", 2, 2, 2, 33, 47, 64, 0, F32, .causal = 1, .algos = ALG_AUTO | ALG_FUSED | ALG_UNFUSED},
    {"no_lse", 2, 2, 2, 33, 47, 64, 0, F32, .no_lse = 1},
    {"no_lse_decode_f16", 2, 4, 1, 3, 300, 64, 0, F16, .no_lse = 1},

    /* long key sequences, fused (the reference is O(Sq·Skv·D)); up to 64 rows a kv head read K
     * and V in place on CPUs */
    {"long_64x16384", 1, 1, 1, 64, 16384, 64, 0, F32, .causal = 0, .path = PATH_IN_PLACE},
    {"long_64x65536", 1, 1, 1, 64, 65536, 64, 0, F32, .algos = ALG_FUSED, .path = PATH_IN_PLACE},
    {"long_64x131072", 1, 1, 1, 64, 131072, 64, 0, F32, .algos = ALG_FUSED, .path = PATH_IN_PLACE},
    /* more rows than read in place on CPUs for short K and V (src/fused.c:
     * clattn__direct_in_place), each case checking the path its fused call took on CPUs (path):
     * copies_ cases over fused_direct's Kᵀ/V copies with either register tiles (at most 2^19
     * elements seq_kv × (head_dim + head_dim_v) a kv head), copies_chunks_ ones with a 2 MiB
     * cache planned (cache_kib), so that every CPU cuts the copies into key chunks of 1024 keys
     * (1056 with 48-key panels) and merges them; long_ cases with more than 2^19 elements, in
     * place with either tiles from 2^21 elements with head_dim + head_dim_v <= 128, in blocks of
     * rows, also with packed query groups, causal, head_dim_v != head_dim and key splits; below
     * 2^21 or with head_dim + head_dim_v > 128, in place with AVX-512's tiles (KV_IN_PLACE_512)
     * and over the copies with AVX2's. The copies_ cases also run with 48-key panels
     * (test_attention_ns3, tests/CMakeLists.txt). */
    {"copies_chunks_72x4096_f16", 1, 1, 1, 72, 4096, 64, 0, F16, .algos = ALG_FUSED, .cache_kib = 2048,
     .path = PATH_CHUNKS},
    {"long_72x40000_f16", 1, 1, 1, 72, 40000, 64, 0, F16, .algos = ALG_FUSED, .path = PATH_IN_PLACE},
    /* windows over the copies, so also in 48-key panels (test_attention_ns3): the first block
     * starts on a panel edge below the window (NARROW_KEYS, attn_common.cl); causal with key lengths
     * that leave some heads' windows past their batch's keys; a window that moves by batch in a
     * mask shared by the heads; a 1000-key window at the end of 4096 keys, in the key chunks of
     * a 2 MiB cache (the first two chunks hidden), and one of 3000 keys at the end of 40000, in
     * place. The copies cover only the panels some row of a kv head sees
     * (mask_union, mask_pass.cl), and the fused call runs on copies left NaN by an earlier call
     * (stale_workspace below), so a panel read but not copied shows where it reaches the
     * output. */
    {"copies_window_shift_causal_kvlen_gqa2", 2, 4, 2, 40, 1500, 64, 0, F32, .causal = 1, .mask = MASK_BATCH,
     .mask_dt = F32, .bias = 1, .window = 100, .wshift = -300, .has_kv = 1, .kv = {1500, 1100},
     .special = SP_POISON_HIDDEN, .path = PATH_COPIES},
    {"copies_window_shift_batch_gqa2", 3, 4, 2, 40, 1200, 64, 0, F32, .mask = MASK_HEADS, .mask_dt = F32,
     .bias = 1, .window = 64, .wshift = -300, .special = SP_POISON_HIDDEN, .path = PATH_COPIES},
    {"copies_chunks_window_2x72x4096_f16", 1, 2, 1, 72, 4096, 64, 0, F16, .mask = MASK_HEADS, .mask_dt = F16,
     .bias = 1, .window = 1000, .special = SP_POISON_HIDDEN, .algos = ALG_FUSED, .cache_kib = 2048,
     .path = PATH_CHUNKS},
    {"window_long_2x72x40000_f16", 1, 2, 1, 72, 40000, 64, 0, F16, .mask = MASK_HEADS, .mask_dt = F16,
     .bias = 1, .window = 3000, .special = SP_POISON_HIDDEN, .algos = ALG_FUSED, .path = PATH_IN_PLACE},
    /* key lengths over the copies, which cover only the panels that start below the batch's
     * length, on copies left NaN by an earlier call (stale_workspace): lengths on a panel edge
     * and one key past it, for 64-key panels (AVX-512's: 64, 65, 129), 48-key ones
     * (test_attention_ns3: 48, 49, 97, 289) and 16-key ones (AVX2's: all of them); no key at
     * all. copies_skip then checks that the panels past the lengths were not written. */
    {"copies_kvlen_panel_edges_gqa2", 4, 2, 1, 40, 300, 64, 0, F32, .has_kv = 1, .kv = {64, 65, 97, 289},
     .special = SP_POISON_HIDDEN, .path = PATH_COPIES},
    {"copies_kvlen_causal_f16_dv40_gqa2", 4, 4, 2, 40, 300, 64, 40, F16, .causal = 1, .has_kv = 1,
     .kv = {0, 48, 49, 129}, .special = SP_POISON_HIDDEN, .path = PATH_COPIES},
    {"long_72x40000", 1, 1, 1, 72, 40000, 64, 0, F32, .algos = ALG_FUSED, .path = PATH_IN_PLACE},
    {"long_72x12000_bf16", 1, 1, 1, 72, 12000, 64, 0, BF16, .algos = ALG_FUSED, .path = PATH_IN_PLACE_512},
    {"long_gqa_4x50x24576_causal_dv32", 1, 4, 1, 50, 24576, 64, 32, F32, .causal = 1, .algos = ALG_FUSED,
     .path = PATH_IN_PLACE},
    {"long_gqa_4x50x8192_causal_hd128_dv64", 1, 4, 1, 50, 8192, 128, 64, F32, .causal = 1, .algos = ALG_FUSED,
     .path = PATH_IN_PLACE_512},
    {"copies_gqa_4x50x2048_causal_hd128_dv64_f16", 1, 4, 1, 50, 2048, 128, 64, F16, .causal = 1,
     .algos = ALG_FUSED, .path = PATH_COPIES},
    /* copies with tails: head_dim 59 and head_dim_v 40 (pack_v's last panel), 120 packed rows per
     * kv head, two batches and kv heads, key lengths */
    {"copies_gqa3_b2_hd59_dv40_causal_kvlen", 2, 6, 2, 40, 301, 59, 40, F32, .causal = 1, .has_kv = 1,
     .kv = {301, 150}, .path = PATH_COPIES},
    /* 4096 rows over 2^19 elements: over the copies with either tiles */
    {"long_64x65536_f16_causal", 1, 1, 1, 64, 65536, 64, 0, F16, .causal = 1, .algos = ALG_FUSED,
     .path = PATH_IN_PLACE},
    {"long_4096x4096_causal", 1, 1, 1, 4096, 4096, 64, 0, F32, .causal = 1, .algos = ALG_FUSED,
     .path = PATH_COPIES},
};
/* clang-format on */

/* =============================== one problem =============================== */

typedef struct problem {
    const att_case *c;
    int Dv;
    double scale; /* resolved, as the device resolves it (in float) */
    ref_attn ra;
    tu_view q, k, v, mask;
    double *xq, *xk, *xv, *xmask;
    int kvl[4];
    cl_mem kv_buf;
    size_t nrow, nout, nprob;
    double *ref_out, *ref_lse, *ref_probs;
} problem;

static int kv_len_of(const problem *p, int b)
{
    if (!p->c->has_kv)
        return p->c->Skv;
    const int l = p->c->kv[b];
    return l < 0 ? 0 : (l > p->c->Skv ? p->c->Skv : l);
}

/* NaN and ±Inf across key j of batch b in every kv head's K and V (tk, tv: the staged storage
 * images; p->xk, p->xv: their values). */
static void poison_key(problem *p, void *tk, void *tv, int b, size_t j)
{
    const att_case *c = p->c;
    const size_t D = (size_t)c->D, Dv = (size_t)p->Dv;
    for (int g = 0; g < c->Hkv; ++g) {
        const size_t kr = ((size_t)b * (size_t)c->Hkv + (size_t)g) * (size_t)c->Skv + j;
        for (size_t d = 0; d < D; ++d)
            tu_put(c->dt, tk, p->xk, kr * D + d, d % 3 == 0 ? NAN : (d % 3 == 1 ? INFINITY : -INFINITY));
        for (size_t d = 0; d < Dv; ++d)
            tu_put(c->dt, tv, p->xv, kr * Dv + d, d % 3 == 1 ? NAN : (d % 3 == 2 ? INFINITY : -INFINITY));
    }
}

static size_t row_of(const att_case *c, int b, int h, int i)
{
    return ((size_t)b * (size_t)c->Hq + (size_t)h) * (size_t)c->Sq + (size_t)i;
}

/* Fills q (with amplitude qa), k, v in [-1, 1] and the mask, applies the special input. */
static void build(problem *p)
{
    const att_case *c = p->c;
    tu_rng rng;
    tu_seed(&rng, tu_seed_of(c->name));
    p->Dv = c->Dv != 0 ? c->Dv : c->D;
    p->scale = c->scale != 0.0f ? (double)c->scale : (double)(float)(1.0 / sqrt((double)c->D));

    /* q·k over uniform [-qa, qa] x [-1, 1] has standard deviation qa·sqrt(D)/3: make scaled logits
     * have standard deviation ~2, so the largest are ~5-6 and softmax is neither flat nor one-hot.
     * A scale of -1e4 keeps qa = 1: the logits are ~1e4 apart and the row is one-hot. */
    double qa = 6.0 / (fabs(p->scale) * sqrt((double)c->D));
    if (qa > 6.0 || c->scale == -1e4f)
        qa = c->scale == -1e4f ? 1.0 : 6.0;

    const clattn_dtype dt = c->dt;
    const size_t esz = clattn_dtype_size(dt);
    tu_view_init(&p->q, c->layout, dt, c->B, c->Hq, c->Sq, c->D, NAN);
    tu_view_init(&p->k, c->layout, dt, c->B, c->Hkv, c->Skv, c->D, NAN);
    tu_view_init(&p->v, c->layout, dt, c->B, c->Hkv, c->Skv, p->Dv, NAN);
    void *tq = tu_xalloc(p->q.n * esz), *tk = tu_xalloc(p->k.n * esz), *tv = tu_xalloc(p->v.n * esz);
    p->xq = tu_xdoubles(p->q.n);
    p->xk = tu_xdoubles(p->k.n);
    p->xv = tu_xdoubles(p->v.n);
    tu_fill(&rng, dt, tq, p->xq, p->q.n, -qa, qa);
    tu_fill(&rng, dt, tk, p->xk, p->k.n, -1.0, 1.0);
    tu_fill(&rng, dt, tv, p->xv, p->v.n, -1.0, 1.0);

    for (int b = 0; b < c->B; ++b)
        p->kvl[b] = c->kv[b];

    /* Mask: uniform [-2, 2] with about 10% -inf. */
    int ms[4] = {c->B, c->Hq, c->Sq, c->Skv};
    void *tm = NULL;
    if (c->mask != MASK_NONE) {
        switch (c->mask) {
        case MASK_HEADS:
        case MASK_HEADS_STRIDE0:
            ms[1] = 1;
            break;
        case MASK_SHARED:
            ms[0] = ms[1] = 1;
            break;
        case MASK_BATCH_ROWS:
            ms[0] = ms[2] = 1;
            break;
        case MASK_BATCH:
            ms[0] = 1;
            break;
        default:
            break;
        }
        tu_view_init(&p->mask, c->layout, c->mask_dt, ms[0], ms[1], ms[2], ms[3], NAN);
        const size_t n = p->mask.n;
        tm = tu_xalloc(n * p->mask.esz);
        p->xmask = tu_xdoubles(n);
        tu_fill(&rng, c->mask_dt, tm, p->xmask, n, -2.0, 2.0);
        for (size_t i = 0; i < n; ++i)
            if (tu_uniform(&rng, 0.0, 1.0) < 0.1 && !c->bias)
                tu_put(c->mask_dt, tm, p->xmask, i, -INFINITY);
        if (c->ramp != 0.0f)
            for (size_t i = 0; i < n; ++i)
                tu_put(c->mask_dt, tm, p->xmask, i, p->xmask[i] + c->ramp * (double)(i % (size_t)c->Skv));
        if (c->window > 0) {
            /* A mask row shared by the query rows (a shape of 1) takes the last row's window. */
            const size_t mrows = (size_t)ms[2];
            for (size_t i = 0; i < n; ++i) {
                const long long row = mrows == 1 ? c->Sq - 1 : (long long)(i / (size_t)c->Skv % mrows),
                                slice = (long long)(i / ((size_t)c->Skv * mrows)),
                                j = (long long)(i % (size_t)c->Skv),
                                diag = row + c->Skv - c->Sq + c->wshift * slice;
                if (j >= c->sink && (j > diag || j <= diag - c->window))
                    tu_put(c->mask_dt, tm, p->xmask, i, -INFINITY);
            }
        }
    }

    /* Special inputs. */
    const size_t D = (size_t)c->D, Dv = (size_t)p->Dv, Skv = (size_t)c->Skv;
    switch (c->special) {
    case SP_NONE:
        break;
    case SP_SHIFT_MASK:
        assert_non_null(tm);
        for (size_t i = 0; i < p->mask.n; ++i)
            if (isfinite(p->xmask[i]))
                tu_put(c->mask_dt, tm, p->xmask, i, p->xmask[i] + 1e4);
        break;
    case SP_SHIFT_QK: {
        /* One large component per vector: scale·100·kbig ~ 1e4 for every key, so every logit of
         * a row moves by about the same 1e4 (exactly what the stored values give). */
        const double kbig = 1e4 / (100.0 * p->scale);
        for (size_t r = 0; r < p->q.n / D; ++r)
            tu_put(dt, tq, p->xq, r * D + D - 1, 100.0);
        for (size_t r = 0; r < p->k.n / D; ++r)
            tu_put(dt, tk, p->xk, r * D + D - 1, kbig);
        break;
    }
    case SP_POISON: {
        /* Mask columns j % 5 == 2 become -inf everywhere, so those keys are hidden from every row;
         * so are keys at or past the batch's kv length. Their K and V get NaN and ±Inf. */
        if (tm != NULL)
            for (size_t i = 0; i < p->mask.n; ++i)
                if ((i % Skv) % 5 == 2)
                    tu_put(c->mask_dt, tm, p->xmask, i, -INFINITY);
        for (int b = 0; b < c->B; ++b) {
            const int L = kv_len_of(p, b);
            for (size_t j = 0; j < Skv; ++j)
                if ((int)j >= L || (tm != NULL && j % 5 == 2))
                    poison_key(p, tk, tv, b, j);
        }
        break;
    }
    case SP_POISON_DIAG:
        for (int b = 0; b < c->B; ++b) {
            const int L = kv_len_of(p, b);
            for (int g = 0; g < c->Hkv; ++g)
                for (int j = L - 2 > 0 ? L - 2 : 0; j < L; ++j) {
                    const size_t kr = (((size_t)b * (size_t)c->Hkv + (size_t)g) * Skv + (size_t)j);
                    tu_put(dt, tk, p->xk, kr * D, NAN);
                    for (size_t d = 0; d < Dv; ++d)
                        tu_put(dt, tv, p->xv, kr * Dv + d, NAN);
                }
        }
        break;
    case SP_NAN_MASK: {
        /* Mask element (0, 0, Sq/2, Skv/3) of the mask's own shape (broadcast or not): a visible
         * key of every row that reads it. */
        assert_non_null(tm);
        const size_t i = ms[2] == 1 ? 0 : (size_t)c->Sq / 2;
        tu_put(c->mask_dt, tm, p->xmask, i * Skv + Skv / 3, NAN);
        break;
    }
    case SP_UNDERFLOW_NAN:
    case SP_UNDERFLOW_NAN_TAIL: {
        /* q[.., D-1] = 1 in every row, and k[.., D-1] = -3000/scale at some keys: their scores are
         * ~3000 below the others', so their weights are exactly 0 in fp32 (and in double:
         * exp(-3000)), yet they are visible, and NaN in their V makes every row that sees one NaN
         * (0·NaN), as in the reference. A kernel that skipped every zero weight, not only hidden
         * keys, would give finite rows. SP_UNDERFLOW_NAN: the odd keys, NaN in V, among keys of
         * ordinary weight. _TAIL: every key but the first 4, NaN in V from key 16 on, so that
         * whole key groups (a decode's first group holds no NaN key while it reads at most 16
         * keys a step and the range fits one step) and splits have weight 0 where they are
         * merged with the rest. */
        for (size_t r = 0; r < p->q.n / D; ++r)
            tu_put(dt, tq, p->xq, r * D + D - 1, 1.0);
        const double kbig = -3000.0 / p->scale;
        const int tail = c->special == SP_UNDERFLOW_NAN_TAIL;
        for (int b = 0; b < c->B; ++b) {
            const int L = kv_len_of(p, b);
            for (int g = 0; g < c->Hkv; ++g) {
                const size_t kr0 = ((size_t)b * (size_t)c->Hkv + (size_t)g) * Skv;
                for (int j = tail ? 4 : 1; j < L; j += tail ? 1 : 2) {
                    tu_put(dt, tk, p->xk, (kr0 + (size_t)j) * D + D - 1, kbig);
                    for (size_t d = 0; d < Dv && (!tail || j >= 16); ++d)
                        tu_put(dt, tv, p->xv, (kr0 + (size_t)j) * Dv + d, NAN);
                }
            }
        }
        break;
    }
    case SP_NAN_Q: {
        /* Last row of the last head of batch 0: it sees every key of the batch. */
        const size_t r = row_of(c, 0, c->Hq - 1, c->Sq - 1);
        tu_put(dt, tq, p->xq, r * D + D / 2, NAN);
        break;
    }
    case SP_NAN_V_ODD_HIDDEN: {
        assert_non_null(tm);
        const size_t j0 = (Skv / 2) | 15; /* the last key of a 16-key group */
        for (size_t i = 0; i < p->mask.n / Skv; ++i)
            if (i % (size_t)ms[2] % 2 == 1)
                tu_put(c->mask_dt, tm, p->xmask, i * Skv + j0, -INFINITY);
        for (size_t kr = j0; kr < p->v.n / Dv; kr += Skv) /* key j0 of every batch and kv head */
            for (size_t d = 0; d < Dv; ++d)
                tu_put(dt, tv, p->xv, kr * Dv + d, NAN);
        break;
    }
    case SP_POISON_HIDDEN: {
        assert_true(tm != NULL || c->has_kv);
        const size_t rows = tm ? (size_t)ms[1] * (size_t)ms[2] : 0; /* mask rows of one mask batch */
        size_t poisoned = 0;
        for (int b = 0; b < c->B; ++b) {
            const int L = kv_len_of(p, b);
            const size_t mb = ms[0] == 1 ? 0 : (size_t)b;
            for (size_t j = 0; j < Skv; ++j) {
                /* past the key length, or -inf in every mask row of the batch */
                int hidden = (int)j >= L || rows > 0;
                for (size_t r = 0; r < rows && hidden && (int)j < L; ++r)
                    hidden = p->xmask[(mb * rows + r) * Skv + j] == -INFINITY;
                if (hidden) {
                    poison_key(p, tk, tv, b, j);
                    poisoned++;
                }
            }
        }
        assert_true(poisoned > 0); /* the case hides whole stretches of keys */
        break;
    }
    case SP_MASKED_ROW: {
        assert_non_null(tm);
        const size_t i = ms[2] == 1 ? 0 : (size_t)c->Sq / 2;
        for (size_t j = 0; j < Skv; ++j)
            tu_put(c->mask_dt, tm, p->xmask, i * Skv + j, -INFINITY); /* b = 0, h = 0 of the mask */
        break;
    }
    }

    tu_scatter(&p->q, tq);
    tu_scatter(&p->k, tk);
    tu_scatter(&p->v, tv);
    tu_upload(&p->q);
    tu_upload(&p->k);
    tu_upload(&p->v);
    if (tm != NULL) {
        tu_scatter(&p->mask, tm);
        if (c->mask == MASK_HEADS_STRIDE0) {
            p->mask.t.shape[1] = c->Hq; /* the same data, broadcast by a 0 stride */
            p->mask.t.stride[1] = 0;
        }
        tu_upload(&p->mask);
    }
    if (c->has_kv)
        p->kv_buf = tu_xbuffer(sizeof(int) * (size_t)c->B, p->kvl);

    /* Reference on exactly the stored values. */
    p->nrow = (size_t)c->B * (size_t)c->Hq * (size_t)c->Sq;
    p->nout = p->nrow * Dv;
    p->nprob = p->nrow * Skv;
    ref_attn *a = &p->ra;
    memset(a, 0, sizeof *a);
    a->batch = c->B;
    a->heads_q = c->Hq;
    a->heads_kv = c->Hkv;
    a->seq_q = c->Sq;
    a->seq_kv = c->Skv;
    a->head_dim = c->D;
    a->head_dim_v = p->Dv;
    a->scale = p->scale;
    a->causal = c->causal;
    a->mask = p->xmask;
    memcpy(a->mask_shape, ms, sizeof ms);
    a->kv_len = c->has_kv ? p->kvl : NULL;
    p->ref_out = tu_xdoubles(p->nout);
    p->ref_lse = tu_xdoubles(p->nrow);
    p->ref_probs = c->probs ? tu_xdoubles(p->nprob) : NULL;
    ref_attention(a, p->xq, p->xk, p->xv, p->ref_out, p->ref_lse, p->ref_probs);
}

/* =============================== tolerances =============================== */

typedef struct tols {
    double out_atol, out_rtol, lse_atol, lse_rtol, p_atol, p_rtol;
} tols;

/* Bound on the extra absolute error of logits near 1e4, where fp32 rounds at half an ulp = 2^-11:
 * with a mask shift a logit passes through up to two roundings at that magnitude (the product's
 * scaling and the add of the mask); q·k with one
 * large term rounds at that magnitude in every addition after it, ~sqrt(D) half ulps in a random
 * walk, plus the same two. A logit error of at most e moves lse by at most e, a probability by a
 * factor within 1 ± 2e, and the output (a mean of V in [-1, 1]) by at most 2e. */
static double logit_error(const att_case *c)
{
    const double half_ulp = 0x1p-11;
    if (c->special == SP_SHIFT_MASK)
        return 2.0 * half_ulp;
    if (c->special == SP_SHIFT_QK)
        return (sqrt((double)c->D) + 2.0) * half_ulp;
    return 0.0;
}

/* Largest |lse| of the problem's rows: a bound on the magnitude of each row's largest logits. */
static double max_abs_lse(const problem *p)
{
    double m = 0.0;
    for (size_t i = 0; i < p->nrow; i++)
        if (isfinite(p->ref_lse[i]) && fabs(p->ref_lse[i]) > m)
            m = fabs(p->ref_lse[i]);
    return m;
}

/* The largest finite |V| of the problem. */
static double max_abs_v(const problem *p)
{
    double m = 0.0;
    for (size_t i = 0; i < p->v.n; i++)
        if (isfinite(p->xv[i]) && fabs(p->xv[i]) > m)
            m = fabs(p->xv[i]);
    return m;
}

/* Whether fused attention runs on the matrix units (CLATTN_MATRIX=emulate, or a device with them):
 * there the weights P are rounded to a 16-bit input type before P·V (docs/numerics.md). */
static int matrix_path(void)
{
    return strncmp(clattn_matrix_report(tu_ctx_get()), "none", 4) != 0;
}

/* The output error the matrix kernel adds with 16-bit inputs: each weight rounded to the input
 * type, a relative error of at most half its ulp (2^-11 for f16, whose weights the kernel keeps
 * normal, 2^-8 for bf16), moves the output, a weighted mean of V rows, by at most that fraction of
 * the largest |V|. */
static double matrix_error(const problem *p, clattn_algorithm alg)
{
    if (alg == CLATTN_ALGORITHM_UNFUSED || p->c->dt == F32 || !matrix_path())
        return 0.0;
    return (p->c->dt == F16 ? 0x1p-11 : 0x1p-8) * max_abs_v(p);
}

static tols tolerances(const problem *p, clattn_dtype out_dt)
{
    const att_case *c = p->c;
    const double g = c->Skv > 4096 ? sqrt(c->Skv / 4096.0) : 1.0;
    /* Each fp32 logit is rounded once at its own magnitude (~|lse| for the logits that matter,
     * e.g. ~1e5 with scale -1e4): half an ulp, 2^-24·|lse|, for the row's largest and for each. */
    const double e = logit_error(c) + 2.0 * 0x1p-24 * max_abs_lse(p);
    tols t;
    t.out_atol = 2e-5 + 2.0 * e;
    t.out_rtol = 1e-4 * g;
    if (out_dt == F16) {
        t.out_atol += 0x1p-10;
        t.out_rtol = 0x1p-11;
    } else if (out_dt == BF16) {
        t.out_atol += 0x1p-7;
        t.out_rtol = 0x1p-8;
    }
    t.lse_atol = 1e-5 * g + e;
    t.lse_rtol = 4e-6;
    t.p_atol = 1e-7;
    t.p_rtol = 2e-5 * g + 2.0 * e;
    /* Probabilities stored in f16/bf16: half an ulp (2^-11 / 2^-8 relative, 2^-25 absolute among
     * f16 subnormals) on top of the fp32 error. */
    if (c->probs == 2 && c->dt == F16) {
        t.p_atol += 0x1p-25;
        t.p_rtol += 0x1p-11;
    } else if (c->probs == 2 && c->dt == BF16) {
        t.p_rtol += 0x1p-8;
    }
    return t;
}

/* =============================== running =============================== */

static const char *alg_name(clattn_algorithm a)
{
    return a == CLATTN_ALGORITHM_FUSED ? "fused" : a == CLATTN_ALGORITHM_UNFUSED ? "unfused" : "auto";
}

typedef struct result {
    double *out, *lse, *probs;
} result;

/* Rows with no visible key must give exactly 0 (not merely within atol); hidden probabilities too. */
static void assert_exact_zeros(const char *what, const problem *p, const result *r)
{
    size_t bad = 0, first = 0;
    for (size_t row = 0; row < p->nrow; ++row) {
        if (p->ref_lse[row] != -INFINITY)
            continue;
        for (size_t d = 0; d < (size_t)p->Dv; ++d)
            if (r->out[row * (size_t)p->Dv + d] != 0.0 && bad++ == 0)
                first = row * (size_t)p->Dv + d;
    }
    if (bad != 0) {
        print_error("%s out: %zu elements of rows without a visible key are not exactly 0, first at %zu: %.9g\n",
                    what, bad, first, r->out[first]);
        ++tu_failures;
        bad = 0;
    }
    if (r->probs == NULL)
        return;
    for (size_t i = 0; i < p->nprob; ++i)
        if (p->ref_probs[i] == 0.0 && r->probs[i] != 0.0 && bad++ == 0)
            first = i;
    if (bad != 0) {
        print_error("%s probabilities: %zu hidden entries are not exactly 0, first at %zu: %.9g\n", what, bad, first,
                    r->probs[first]);
        ++tu_failures;
    }
}

/* The descriptor of p's case for algorithm alg, without lse and probabilities. */
static void describe(const problem *p, clattn_algorithm alg, clattn_attention_desc *desc)
{
    const att_case *c = p->c;
    memset(desc, 0, sizeof *desc);
    desc->batch = c->B;
    desc->heads_q = c->Hq;
    desc->heads_kv = c->Hkv;
    desc->seq_q = c->Sq;
    desc->seq_kv = c->Skv;
    desc->head_dim = c->D;
    desc->head_dim_v = c->Dv;
    desc->scale = c->scale;
    desc->causal = c->causal;
    desc->mask = c->mask != MASK_NONE ? &p->mask.t : NULL;
    desc->kv_lengths = c->has_kv ? p->kv_buf : NULL;
    desc->algorithm = alg;
}

/* What a cache_kib case's contexts plan for (cache_kib > 0): that cache, and one compute unit. */
static tu_plan case_plan(const att_case *c)
{
    return (tu_plan){1024ull * (unsigned)c->cache_kib, 1};
}

/* SP_POISON_HIDDEN cases, before the fused call: the same problem once with every K and V
 * element NaN, a mask of zeros (hiding nothing) and every key length Skv, so that the
 * workspace's K and V copies (fused_direct's, which cover only the panels below the batch's
 * key length and, under a shared mask, those some row of a kv head sees: mask_union, mask_pass.cl)
 * hold NaN in every panel. A panel the real call reads without writing it first then shows as
 * NaN in its output wherever its values count (hidden keys' do not). */
static void stale_workspace(const problem *p)
{
    const att_case *c = p->c;
    tu_view k = p->k, v = p->v, m = p->mask, out, lse;
    k.img = tu_xalloc(k.cap * k.esz);
    v.img = tu_xalloc(v.cap * v.esz);
    for (size_t i = 0; i < k.cap; ++i)
        tu_store(c->dt, k.img, i, NAN);
    for (size_t i = 0; i < v.cap; ++i)
        tu_store(c->dt, v.img, i, NAN);
    tu_upload(&k);
    tu_upload(&v);
    if (c->mask != MASK_NONE) {
        m.img = tu_xalloc(m.cap * m.esz);
        for (size_t i = 0; i < m.cap; ++i)
            tu_store(c->mask_dt, m.img, i, 0.0);
        tu_upload(&m);
    }
    tu_view_init(&out, c->layout, c->dt, c->B, c->Hq, c->Sq, p->Dv, 777.0);
    tu_view_init(&lse, c->layout, F32, c->B, c->Hq, c->Sq, 1, 777.0);
    tu_upload(&out);
    tu_upload(&lse);
    problem decoy = *p;
    decoy.mask = m;
    clattn_attention_desc desc;
    describe(&decoy, CLATTN_ALGORITHM_FUSED, &desc);
    desc.lse = c->no_lse ? NULL : &lse.t;
    if (c->has_kv) { /* still key lengths, so that the call takes the same path */
        int full[N_OF(c->kv)];
        assert_true(c->B <= (int)N_OF(full));
        for (int b = 0; b < c->B; ++b)
            full[b] = c->Skv;
        desc.kv_lengths = tu_xbuffer(sizeof(int) * (size_t)c->B, full);
    }
    const clattn_status st = clattn_attention(tu_ctx, &desc, &p->q.t, &k.t, &v.t, &out.t, 0, NULL, NULL);
    if (st != CLATTN_SUCCESS) {
        print_error("stale workspace pass: clattn_attention returned %s: %s\n", clattn_status_string(st),
                    clattn_last_error(tu_ctx));
        fail();
    }
    tu_finish(tu_ctx);
}

static void run(clattn_context *ctx, const problem *p, clattn_algorithm alg, result *r)
{
    const att_case *c = p->c;
    const int with_probs = c->probs && alg != CLATTN_ALGORITHM_FUSED;
    char what[128];
    tu_view out, lse, probs;
    memset(&lse, 0, sizeof lse);
    memset(&probs, 0, sizeof probs);
    tu_view_init(&out, c->layout, c->dt, c->B, c->Hq, c->Sq, p->Dv, 777.0);
    tu_upload(&out);
    if (!c->no_lse) {
        tu_view_init(&lse, c->layout, F32, c->B, c->Hq, c->Sq, 1, 777.0);
        tu_upload(&lse);
    }
    if (with_probs) {
        tu_view_init(&probs, c->layout, c->probs == 2 ? c->dt : F32, c->B, c->Hq, c->Sq, c->Skv, 777.0);
        tu_upload(&probs);
    }

    clattn_attention_desc desc;
    describe(p, alg, &desc);
    desc.lse = c->no_lse ? NULL : &lse.t;
    desc.probabilities = with_probs ? &probs.t : NULL;

    cl_event done = NULL;
    const clattn_status st = clattn_attention(ctx, &desc, &p->q.t, &p->k.t, &p->v.t, &out.t, 0, NULL, &done);
    if (st != CLATTN_SUCCESS) {
        print_error("%s: clattn_attention returned %s: %s\n", alg_name(alg), clattn_status_string(st),
                    clattn_last_error(ctx));
        fail();
    }
    assert_non_null(done);
    clReleaseEvent(done);
    tu_finish(ctx);

    r->out = tu_xdoubles(p->nout);
    r->lse = c->no_lse ? NULL : tu_xdoubles(p->nrow);
    r->probs = with_probs ? tu_xdoubles(p->nprob) : NULL;
    snprintf(what, sizeof what, "%s out", alg_name(alg));
    tu_download(what, &out, r->out);
    if (r->lse != NULL) {
        snprintf(what, sizeof what, "%s lse", alg_name(alg));
        tu_download(what, &lse, r->lse);
    }
    if (r->probs != NULL) {
        snprintf(what, sizeof what, "%s probabilities", alg_name(alg));
        tu_download(what, &probs, r->probs);
    }

    tols t = tolerances(p, c->dt);
    t.out_atol += matrix_error(p, alg);
    snprintf(what, sizeof what, "%s out vs reference", alg_name(alg));
    tu_check_close(what, r->out, p->ref_out, p->nout, t.out_atol, t.out_rtol);
    if (r->lse != NULL) {
        snprintf(what, sizeof what, "%s lse vs reference", alg_name(alg));
        tu_check_close(what, r->lse, p->ref_lse, p->nrow, t.lse_atol, t.lse_rtol);
    }
    if (r->probs != NULL) {
        snprintf(what, sizeof what, "%s probabilities vs reference", alg_name(alg));
        tu_check_close(what, r->probs, p->ref_probs, p->nprob, t.p_atol, t.p_rtol);
    }
    assert_exact_zeros(alg_name(alg), p, r);
}

/* The most keys in a panel of fused_direct's K/V copies: 16·NS keys, NS at most 4
 * (clattn__fit_fused_tile, src/scores.c). */
enum { COPY_PANEL_MAX = 64 };

/* The most keys of kv head (b, hk) that fused_direct's K/V copies may write (run_direct,
 * src/fused.c): the panels that start below the batch's key length and, under a mask that
 * batches, heads or rows share (clattn__plan_mask_flags), meet the hull of the 16-key chunks the kv
 * head's rows see (mask_union, cl/mask_pass.cl). Those lie within the hull widened by a panel less
 * one key below, and within the key length (or the hull's end, if lower) plus a panel less one
 * key above. */
static int copied_keys_max(const problem *p, int b, int hk)
{
    const att_case *c = p->c;
    const int Skv = c->Skv, L = kv_len_of(p, b), group = c->Hq / c->Hkv, P = COPY_PANEL_MAX;
    const int64_t *ms = p->mask.fshape; /* the mask's own shape, 1 where it broadcasts */
    const int shared = (ms[0] == 1 && c->B > 1) || (ms[1] == 1 && c->Hq > 1) || (ms[2] == 1 && c->Sq > 1);
    int lo = 0, hi = Skv;
    if (c->mask != MASK_NONE && shared) {
        lo = Skv;
        hi = 0;
        for (int hq = hk * group; hq < (hk + 1) * group; ++hq)
            for (int i = 0; i < c->Sq; ++i) {
                const size_t mb = ms[0] == 1 ? 0 : (size_t)b, mh = ms[1] == 1 ? 0 : (size_t)hq,
                             mi = ms[2] == 1 ? 0 : (size_t)i;
                const size_t row = (mb * (size_t)ms[1] + mh) * (size_t)ms[2] + mi;
                for (int j = 0; j < Skv; ++j)
                    if (p->xmask[row * (size_t)Skv + (size_t)j] != -INFINITY) {
                        lo = j < lo ? j : lo;
                        hi = j + 1 > hi ? j + 1 : hi;
                    }
            }
        if (lo >= hi)
            return 0;
        lo = lo / 16 * 16;
        hi = (hi + 15) / 16 * 16;
    }
    const int end = hi < L ? hi : L;
    const int first = lo - P + 1 > 0 ? lo - P + 1 : 0, last = end + P - 1 < Skv ? end + P - 1 : Skv;
    return last > first ? last - first : 0;
}

/* A quiet NaN with a payload that no copy of K or V makes (the poisoned keys hold the default
 * NaN and ±Inf, whose copies keep those bits). */
#define WS_SENTINEL 0x7fc1b2c3u

/* copies_ cases that poison the keys no row sees (SP_POISON_HIDDEN): the fused call once more on
 * a second context of the same queue, whose workspace the call sized and then filled with
 * WS_SENTINEL. The output must match the reference (a panel of the K/V copies read but not
 * written shows as NaN), and where fused_direct's copies ran (pack_v launched: CPUs) the
 * sentinel must still fill at least the panels no row of a kv head can see (copied_keys_max):
 * copies of every key would pass every other test, only slower. */
static void copies_skip(const problem *p)
{
    const att_case *c = p->c;
    clattn_context *ctx = tu_context_sharing(tu_ctx);
    if (c->cache_kib > 0)
        tu_swap_plan(ctx, case_plan(c));
    result first = {0}, again = {0};
    run(ctx, p, CLATTN_ALGORITHM_FUSED, &first); /* sizes the workspace */
    size_t bytes = 0;
    cl_mem ws = tu_workspace(ctx, &bytes);
    if (ws == NULL) { /* K and V read in place, and no mask flags */
        clattn_release(ctx);
        return;
    }
    const cl_uint sentinel = WS_SENTINEL;
    assert_int_equal(clEnqueueFillBuffer(clattn_queue(ctx), ws, &sentinel, sizeof sentinel, 0, bytes, 0, NULL, NULL),
                     CL_SUCCESS);
    clshim_limit_kernel_wg(0); /* forgets the kernels launched so far */
    const int before = tu_failures;
    run(ctx, p, CLATTN_ALGORITHM_FUSED, &again);
    if (tu_failures > before)
        print_error("(those on a workspace filled with a NaN sentinel: copies_skip)\n");
    if (clshim_launched("pack_v")) {
        cl_uint *w = tu_xalloc(bytes);
        tu_read(ctx, ws, bytes, w);
        size_t left = 0, want = 0;
        for (size_t i = 0; i < bytes / sizeof *w; ++i)
            left += w[i] == WS_SENTINEL;
        const size_t per_key = (size_t)c->D + 16 * (((size_t)p->Dv + 15) / 16); /* Kᵀ, padded V */
        for (int b = 0; b < c->B; ++b)
            for (int hk = 0; hk < c->Hkv; ++hk)
                want += (size_t)(c->Skv - copied_keys_max(p, b, hk)) * per_key;
        assert_true(want > 0); /* the case hides whole panels from some kv head */
        if (left < want) {
            print_error("the K/V copies wrote keys no row sees: %zu words of the workspace left unwritten, "
                        "at least %zu expected\n", left, want);
            tu_failures++;
        }
    }
    clattn_release(ctx);
}

/* After a fused call: where the CPU kernels ran (fused_direct or fused_lanes launched), the call
 * took the case's path, so that a change of the rules (src/fused_cpu.c: clattn__direct_in_place)
 * cannot leave a path without its cases while they still pass on another. */
static void check_cpu_path(const att_case *c)
{
    if (!(clshim_launched("fused_direct") || clshim_launched("fused_lanes")))
        return; /* a GPU's kernels, or the tiled kernel asked for */
    /* Cases named for fused_lanes (rows in vector lanes: 11 to 64 packed rows a kv head, and
     * decode from 11 unless CLATTN_PARAMS_DECODE gives fused_direct an RM) must have run it. */
    const char *dec = getenv("CLATTN_PARAMS_DECODE");
    if (strstr(c->name, "lanes_") != NULL && !clshim_launched("fused_lanes") &&
        !(c->Sq <= 16 && dec != NULL && *dec != '\0')) {
        print_error("fused_lanes did not run: the case is named for it\n");
        tu_failures++;
    }
    if (c->path == PATH_ANY)
        return;
    const int in_place = c->path == PATH_IN_PLACE || (c->path == PATH_IN_PLACE_512 && tu_nreg16(tu_ctx) >= 32);
    const int copies = clshim_launched("pack_v"), merged = clshim_launched("merge_strided");
    const char *wrong = in_place && copies                          ? "copied K and V"
                        : !in_place && !copies                      ? "read K and V in place"
                        : c->path == PATH_CHUNKS && !merged         ? "merged no key chunks"
                                                                    : NULL;
    if (wrong != NULL) {
        print_error("the fused call %s: with %d registers' tiles the case is meant to %s\n", wrong,
                    tu_nreg16(tu_ctx), in_place ? "read K and V in place"
                                       : c->path == PATH_CHUNKS ? "run over the K/V copies in key chunks"
                                                                : "run over the K/V copies");
        tu_failures++;
    }
}

static void test_case(void **state)
{
    const att_case *c = *state;
    tu_ctx_get();
    tu_failures = 0;
    /* The device as it is, unless the case plans for another cache (set for every case, since a
     * case that fails leaves by longjmp). */
    static tu_plan device;
    static int have_device;
    if (!have_device) {
        device = tu_swap_plan(tu_ctx, (tu_plan){0, 1});
        have_device = 1;
    }
    tu_swap_plan(tu_ctx, c->cache_kib > 0 ? case_plan(c) : device);
    problem p;
    memset(&p, 0, sizeof p);
    p.c = c;
    build(&p);

    /* Sanity of the case itself: a special input must actually show up in the reference. */
    if (c->special == SP_NAN_Q)
        assert_true(isnan(p.ref_lse[row_of(c, 0, c->Hq - 1, c->Sq - 1)]));
    if (c->special == SP_MASKED_ROW)
        assert_true(p.ref_lse[row_of(c, 0, 0, c->Sq / 2)] == -INFINITY);
    if (c->special == SP_POISON_DIAG || c->special == SP_NAN_V_ODD_HIDDEN) {
        size_t nan_rows = 0;
        for (size_t r = 0; r < p.nrow; ++r)
            nan_rows += isnan(p.ref_out[r * (size_t)p.Dv]);
        assert_true(nan_rows > 0 && nan_rows < (c->special == SP_POISON_DIAG ? p.nrow / 2 : p.nrow));
    }

    const unsigned algos = c->algos != 0 ? c->algos : (ALG_FUSED | ALG_UNFUSED);
    result fused = {0}, unfused = {0}, autor = {0};
    if ((algos & ALG_FUSED) && c->special == SP_POISON_HIDDEN)
        stale_workspace(&p);
    if (algos & ALG_FUSED) {
        clshim_limit_kernel_wg(0); /* forgets the kernels launched so far */
        run(tu_ctx, &p, CLATTN_ALGORITHM_FUSED, &fused);
        check_cpu_path(c);
    }
    if ((algos & ALG_FUSED) && c->special == SP_POISON_HIDDEN && strncmp(c->name, "copies_", 7) == 0)
        copies_skip(&p);
    if (algos & ALG_UNFUSED)
        run(tu_ctx, &p, CLATTN_ALGORITHM_UNFUSED, &unfused);
    if (algos & ALG_AUTO)
        run(tu_ctx, &p, CLATTN_ALGORITHM_AUTO, &autor);

    if ((algos & ALG_FUSED) && (algos & ALG_UNFUSED)) {
        /* Both round fp32 results that differ by fp32 rounding to the storage type: they agree
         * within fp32 error plus one storage ulp (2^-10 relative for f16, 2^-7 for bf16). */
        const tols t = tolerances(&p, F32);
        const double rtol = c->dt == F16 ? 0x1p-10 : c->dt == BF16 ? 0x1p-7 : t.out_rtol;
        tu_check_close("fused vs unfused out", fused.out, unfused.out, p.nout,
                       t.out_atol + matrix_error(&p, CLATTN_ALGORITHM_FUSED), rtol);
        if (fused.lse != NULL)
            tu_check_close("fused vs unfused lse", fused.lse, unfused.lse, p.nrow, 2 * t.lse_atol,
                               2 * t.lse_rtol);
    }
    if (tu_failures != 0)
        fail_msg("%d check(s) failed", tu_failures);
}

/* =============================== registration =============================== */

int main(void)
{
    enum { MAX_TESTS = 192 };
    static struct CMUnitTest tests[MAX_TESTS];
    size_t n = 0;
    /* CLATTN_TEST_DECODE_ONLY=1 (the _rows runs, tests/CMakeLists.txt): only the cases that take
     * the decode path (seq_q <= 16). */
    const int decode_only = tu_getenv_int("CLATTN_TEST_DECODE_ONLY", 0) != 0;
    for (size_t i = 0; i < N_OF(cases); ++i) {
        if (decode_only && cases[i].Sq > 16)
            continue;
        if (n == MAX_TESTS) {
            fprintf(stderr, "test_attention: more than %d tests, raise MAX_TESTS\n", MAX_TESTS);
            return 1;
        }
        for (size_t j = 0; j < i; ++j)
            if (strcmp(cases[i].name, cases[j].name) == 0) {
                fprintf(stderr, "test_attention: duplicate case name %s\n", cases[i].name);
                return 1;
            }
        tests[n++] = (struct CMUnitTest){cases[i].name, test_case, NULL, tu_teardown, (void *)&cases[i]};
    }
    n = tu_filter_tests("attention", tests, n);
    const int failed = _cmocka_run_group_tests("attention", tests, n, NULL, NULL);
    clattn_release(tu_ctx);
    return failed;
}
