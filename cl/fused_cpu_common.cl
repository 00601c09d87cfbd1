/* What the CPU attention kernels share (fused_direct.cl, fused_lanes.cl; assembled after
 * common.cl and attn_common.cl). One work-item per block of packed rows and key split, no local
 * memory, no barrier: on a CPU a work-group's work-items run one after another, so local tiles and
 * barriers only add copies and spills.
 *
 * Numerics: the scale and mask are applied in natural units and the maximum is subtracted before
 * the multiplication by log2(e), so any finite logit works (no overflow near FLT_MAX). O is kept
 * normalised after every block, o' = o·(l·α/l') + Σ (p/l')·v, a convex combination of V rows
 * at half scale (O_WEIGHT) that cannot overflow whatever seq_kv and |V| are. The reference m is
 * not always the running maximum: it moves only when a score passes it by more than REF_SLACK,
 * so most blocks skip the row maximum and the exponential of the rescaling; p <= 2^8 in between,
 * and the result is the same since the reference cancels. Hidden keys get s = -inf, p = -0, and
 * are skipped in P·V so NaN/Inf in their K/V never reach O; a visible key whose p underflows to
 * +0 is not skipped.
 *
 * The direct programs' options always define IN_PLACE (0 or 1). */

#ifdef IN_PLACE
#ifndef RM
#define RM 4 /* packed query rows per work-item (fused_lanes: 16·LANES) */
#endif
#ifndef NS
#define NS 1 /* 16-key vectors per score chunk: DBN = 16·NS keys (in place: 1) */
#endif
#ifndef DP
#define DP 64 /* head_dim rounded up (copies: to a multiple of 4; in place: DP16) */
#endif
#ifndef DV16
#define DV16 4 /* O columns in float16 blocks: 16·DV16 >= head_dim_v */
#endif

/* IN_PLACE 1 (decode on CPUs, DECODE DIRECT 1, and prefill with few rows per kv head or long
 * K and V: clattn__direct_in_place, src/fused_cpu.c): K and V are read where they are, in their
 * storage type, instead of from the copies: a block of rows reads each key once, so with one or
 * two blocks per kv head copying would triple the traffic.
 * Chunks of 16 keys (NS 1), their scores from qk16_row or qk16_tile (common.cl; DP = DP16).
 * KV_FULL 1 when head_dim and head_dim_v are multiples of 16 (no tail loads). */
#if IN_PLACE
#define T_KV T_IN /* fused_lanes; fused_direct reads K and V as stored (T_K, T_V: kv_access.cl) */
#define T_KD T_K
#define T_VD T_V
#if NS != 1 || DP != DP16
#error "IN_PLACE needs NS 1 and DP = DP16"
#endif
#else
#define T_KV float /* the f32 copies (transpose_k16 in layout.cl, pack_v in fused_direct.cl) */
#define T_KD float
#define T_VD float
#endif

/* How far a score may exceed the row's reference before the reference moves: 8·ln 2, so
 * p = e^(s - m) <= 2^8 and the sums stay far from overflow (l <= 2^8·seq_kv). */
#define REF_SLACK 5.5451774f
#endif /* IN_PLACE */
