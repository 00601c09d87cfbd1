/* The kernel parameter schema: one table per operation, from which everything else is made — the
 * host struct with named fields, the public names and bounds (clattn_param_name/_max), the values
 * clattn-tune tries, the names tuning files and CLATTN_PARAMS_<OP> accept, and the -D options
 * each launcher writes. A parameter's name is the kernel's own -D name (cl/<family>.cl).
 *
 * X(NAME, MAX, CANDIDATES, meaning): MAX is CLATTN_PARAM_MAX for a size (a hint each operation
 * fits to the device) or the largest value of a choice; CANDIDATES, written C(a, b, ...), are the
 * values clattn-tune tries (for a choice: every value). The order is the positional order of the
 * public API (clattn_set_params, version-1 tuning files). */
#ifndef CLATTN_PARAMS_H
#define CLATTN_PARAMS_H

/* Parameter values are integers in [0, CLATTN_PARAM_MAX]; a choice at most its largest value. */
#define CLATTN_PARAM_MAX 4096
#define CLATTN_MAX_PARAMS 12

/* The GEMMs of clattn_scores and the unfused path (gemm_tiled.cl on GPUs, gemm_direct.cl on
 * CPUs). Tile TM = WGY·RM rows, TN = WGX·VW·NS columns; direct: RM x 16·NS register tiles. */
#define CLATTN_GEMM_PARAMS(X)                                                                      \
    X(WGX, CLATTN_PARAM_MAX, C(1, 2, 4, 8, 16), "work-items across the tile's columns")            \
    X(WGY, CLATTN_PARAM_MAX, C(1, 2, 4, 8, 16), "work-items across the tile's rows")               \
    X(RM, CLATTN_PARAM_MAX, C(1, 2, 4, 6, 8, 16), "rows per work-item")                           \
    X(NS, CLATTN_PARAM_MAX, C(1, 2, 3, 4), "column blocks per work-item (direct: 16-wide)")        \
    X(TK, CLATTN_PARAM_MAX, C(8, 16, 32, 64), "depth of a local-memory tile (tiled)")              \
    X(VW, CLATTN_PARAM_MAX, C(4, 8, 16), "vector width of column blocks (tiled)")                   \
    X(KF, 1, C(0, 1), "scores: 1 stages all of head_dim in one tile (tiled)")                      \
    X(KT, 1, C(0, 1), "scores: 1 reads a transposed copy of K (transpose_k)")                      \
    X(DIRECT, 1, C(0, 1), "kernel: tiled | direct (CPUs: one work-item, register tile)")
/* P·V has the same slots; KF and KT are the scores' and take only 0. */
#define CLATTN_PV_PARAMS(X)                                                                        \
    X(WGX, CLATTN_PARAM_MAX, C(1, 2, 4, 8, 16), "work-items across the tile's columns")            \
    X(WGY, CLATTN_PARAM_MAX, C(1, 2, 4, 8, 16), "work-items across the tile's rows")               \
    X(RM, CLATTN_PARAM_MAX, C(1, 2, 4, 8, 16), "rows per work-item")                              \
    X(NS, CLATTN_PARAM_MAX, C(1, 2, 4), "column blocks per work-item (direct: 16-wide)")           \
    X(TK, CLATTN_PARAM_MAX, C(8, 16, 32, 64), "depth of a local-memory tile (tiled)")              \
    X(VW, CLATTN_PARAM_MAX, C(4, 8, 16), "vector width of column blocks (tiled)")                   \
    X(KF, 0, C(0), "unused (the scores' KF)")                                                      \
    X(KT, 0, C(0), "unused (the scores' KT)")                                                      \
    X(DIRECT, 1, C(0, 1), "kernel: tiled | direct (pv_direct, V read in place)")
#define CLATTN_SOFTMAX_PARAMS(X)                                                                   \
    X(WG, CLATTN_PARAM_MAX, C(1, 4, 8, 16, 32, 64, 128, 256), "work-items per row")               \
    X(ROWS, CLATTN_PARAM_MAX, C(0, 1, 2, 4, 8), "0: a work-group per row; N: a work-item per N rows")
/* Fused attention, seq_q > 16: fused_tiled.cl (BM = WGY·RM rows, BN = WGX·VW·NS keys) or, with
 * DIRECT 1, fused_direct.cl / fused_lanes.cl (RM rows x 16·NS-key register chunks). */
#define CLATTN_FUSED_PARAMS(X)                                                                     \
    X(WGX, CLATTN_PARAM_MAX, C(1, 2, 4, 8, 16), "work-items across keys and O columns (tiled)")    \
    X(WGY, CLATTN_PARAM_MAX, C(1, 2, 4, 8, 16), "work-items across query rows (tiled)")            \
    X(RM, CLATTN_PARAM_MAX, C(1, 2, 3, 4, 6, 8, 16), "query rows per work-item")                  \
    X(NS, CLATTN_PARAM_MAX, C(1, 2, 4), "key blocks per work-item")                                \
    X(VW, CLATTN_PARAM_MAX, C(4, 8, 16), "vector width of key and O column blocks (tiled)")         \
    X(DIRECT, 2, C(0, 1, 2), "kernel: tiled | direct | mma")
/* The matrix-unit kernel (kernel=mma, fused_mma.cl) reads WGY as its warps (16 query rows each)
 * and NS as its key tile in 16s (BN = 16·NS); the other slots do not apply to it. */
/* Fused attention with key splits, seq_q <= 16. The kernel choice changes which kernel the other
 * slots configure; decode_rows and decode_lanes call slots 1, 3 and 4 by their own -D names
 * (CLATTN_DECODE_ALIASES). */
#define CLATTN_DECODE_PARAMS(X)                                                                    \
    X(WGX, CLATTN_PARAM_MAX, C(1, 2, 8, 16, 32), "work-items across keys and O columns (tiled)")   \
    X(WGY, CLATTN_PARAM_MAX, C(1, 2, 4, 8), "work-items across rows (tiled); key groups KG (rows, lanes)") \
    X(RM, CLATTN_PARAM_MAX, C(0, 1, 4, 16), "packed query rows per work-item (0: cover the rows)") \
    X(NS, CLATTN_PARAM_MAX, C(1, 2, 4, 8, 16, 32), "key blocks (tiled, direct); KL (rows), LANES (lanes)") \
    X(VW, CLATTN_PARAM_MAX, C(4, 8, 16), "vector width (tiled); LC (rows), KU (lanes)")             \
    X(SPLITS, CLATTN_PARAM_MAX, C(0, 2, 8, 32, 128), "key splits (0: automatic, 1: none)")          \
    X(DIRECT, 6, C(0, 1, 2, 3, 4, 5, 6), "kernel: tiled | direct | rows | rows_sync | lanes | lanes_local | mma")
#define CLATTN_MERGE_PARAMS(X) X(WG, CLATTN_PARAM_MAX, C(1, 16, 32, 64, 128, 256), "work-items per row (1: a work-item merges a whole row)")

/* The kernel choice (DIRECT) by name: K(op, value, name, what runs). */
#define CLATTN_KERNEL_CHOICES(K)                                                                   \
    K(SCORES, 0, tiled, "gemm_tiled.cl: gemm_nt")                                                  \
    K(SCORES, 1, direct, "gemm_direct.cl: scores_direct / scores_in_place")                        \
    K(PV, 0, tiled, "gemm_tiled.cl: gemm_nn")                                                      \
    K(PV, 1, direct, "gemm_direct.cl: pv_direct")                                                  \
    K(FUSED, 0, tiled, "fused_tiled.cl: fused")                                                    \
    K(FUSED, 1, direct, "fused_direct.cl / fused_lanes.cl")                                        \
    K(FUSED, 2, mma, "fused_mma.cl: fused_mma, on the matrix units (mma.cl)")                     \
    K(DECODE, 0, tiled, "fused_tiled.cl: fused with key splits")                                   \
    K(DECODE, 1, direct, "fused_direct.cl / fused_lanes.cl, K and V in place")                     \
    K(DECODE, 2, rows, "decode.cl: decode_rows")                                                   \
    K(DECODE, 3, rows_sync, "decode.cl: decode_rows, key groups synchronised alone (PTX)")         \
    K(DECODE, 4, lanes, "decode_lanes.cl: decode_lanes, PTX shuffles on NVIDIA")                   \
    K(DECODE, 5, lanes_local, "decode_lanes.cl: decode_lanes through local memory")                \
    K(DECODE, 6, mma, "fused_mma.cl: fused_mma with key splits, on the matrix units")

/* Other names of decode's slots, the -D names of decode_rows and decode_lanes: A(alias, slot). */
#define CLATTN_DECODE_ALIASES(A) A(KG, 1) A(KL, 3) A(LANES, 3) A(LC, 4) A(KU, 4)

/* The host struct with named fields: one view per operation over the same values. */
#define CLATTN_PARAM_FIELD_(name, max, cand, meaning) int name;
typedef union clattn_params {
    int v[CLATTN_MAX_PARAMS];
    struct {
        CLATTN_GEMM_PARAMS(CLATTN_PARAM_FIELD_)
    } gemm; /* SCORES and PV */
    struct {
        CLATTN_SOFTMAX_PARAMS(CLATTN_PARAM_FIELD_)
    } softmax;
    struct {
        CLATTN_FUSED_PARAMS(CLATTN_PARAM_FIELD_)
    } fused;
    struct {
        CLATTN_DECODE_PARAMS(CLATTN_PARAM_FIELD_)
    } decode;
    struct { /* decode_rows' names of the same slots (CLATTN_DECODE_ALIASES) */
        int WGX_, KG, RM_, KL, LC, SPLITS_, DIRECT_;
    } decode_rows;
    struct { /* decode_lanes' names */
        int WGX_, KG, RM_, LANES, KU, SPLITS_, DIRECT_;
    } decode_lanes;
    struct {
        CLATTN_MERGE_PARAMS(CLATTN_PARAM_FIELD_)
    } merge;
} clattn_params;

/* Kernel choices: the values of DIRECT. */
enum {
    CLATTN_KERNEL_TILED = 0,
    CLATTN_KERNEL_DIRECT = 1,
    CLATTN_KERNEL_ROWS = 2,       /* decode only */
    CLATTN_KERNEL_ROWS_SYNC = 3,  /* decode only */
    CLATTN_KERNEL_LANES = 4,      /* decode only */
    CLATTN_KERNEL_LANES_LOCAL = 5, /* decode only */
    CLATTN_KERNEL_MMA_FUSED = 2,   /* fused (prefill) only: the matrix-unit kernel */
    CLATTN_KERNEL_MMA_DECODE = 6   /* decode only: the same kernel */
};

#endif
