/* What the unfused path's GEMMs share (gemm_tiled.cl for GPUs, gemm_direct.cl for CPUs, and
 * layout.cl, whose copies they read; assembled after common.cl): batched C[z] = A[z] · op(B[z])
 * with a per-mode epilogue, the parameters they take and their argument list.
 *
 * MODE 0 (scores): A = Q [Sq][D], B = K [Skv][D] (so op(B) = Kᵀ), C = scores [Sq][Skv];
 *   epilogue: alpha·acc + mask, keys hidden by kv_lengths or causal set to -inf. With KT, B is
 *   Kᵀ [D][Skv] (f32, written once per call by transpose_k) and loads like P·V's B: no
 *   element-wise transposition per tile, which on CPUs costs as much as the tile's arithmetic.
 * MODE 1 (P·V):    A = P [Sq][Skv], B = V [Skv][Dv], C = out [Sq][Dv]; the key loop stops at the
 *   last key any row of the tile can see, and hidden keys never touch C (0·NaN would); C is
 *   summed at half scale (P times O_WEIGHT) and doubled at the store (o_from_half, common.cl).
 *
 * z = b·heads + h; B is read from kv head h / group. */

#ifndef RM
#define RM 4 /* rows of C per work-item */
#endif
#ifndef NS
#define NS 1 /* column blocks of C per work-item (VW floats each tiled, 16 direct) */
#endif
#ifndef MODE
#define MODE 0 /* 0: scores, 1: P·V */
#endif
#ifndef KT
#define KT 0 /* 1: scores read B = Kᵀ, pre-transposed by transpose_k ([D][Skv] per kv head) */
#endif
#ifndef KT_PANEL
#define KT_PANEL 0 /* scores_direct: Kᵀ in panels of 16·NS keys (transpose_k), else rows */
#endif

/* P·V over a long key range sums each PV_FOLD keys' products apart and adds that to the total
 * (gemm_tiled's MODE 1, pv_direct): one accumulator over every key rounds once a key at the
 * total's scale, and with weights alike (uniform attention, 1/N each) those errors take one sign:
 * 9e-3 over 10^6 keys, where the documented tolerance there is 1.6e-3. Folded, about
 * (PV_FOLD + N / PV_FOLD) roundings (test_scores: pv_uniform_long). */
#define PV_FOLD 1024

/* The argument list of gemm, scores_direct, scores_in_place and pv_direct (src/scores.c sets
 * them alike); TB is the element type of B. */
#define GEMM_KERNEL_ARGS(TB)                                                                     \
    __global const T_A *A, ulong a_off, ulong a_sb, ulong a_sh, ulong a_ss, __global const TB *B, \
        ulong b_off, ulong b_sb, ulong b_sh, ulong b_ss, __global T_OUT *C, ulong c_off,         \
        ulong c_sb, ulong c_sh, ulong c_ss, __global const T_MASK *mask, ulong m_off, ulong m_sb, \
        ulong m_sh, ulong m_ss, __global const int *kvlen, int M, int N, int K, int heads,       \
        int group, int seq_q, int seq_kv, int causal, int has_mask, float alpha

