/* The per-lane layouts of the matrix-unit tile layer (mma.cl): which (row, col) of a fragment
 * each lane of a warp of 32 holds as its element e. NVIDIA's mma.sync layouts (PTX ISA,
 * "Matrix fragments for mma.m16n8k16 / mma.m16n8k8"), which the emulation (mma.cl, MMA_NV 0)
 * keeps too, so that the kernel written over them runs unchanged on any OpenCL device.
 * Pure integer macros, valid C as well as OpenCL C: tests/test_mma_layout.c includes this file
 * and checks each map is a bijection and that a warp model multiplying through them equals a
 * plain GEMM. g = lane / 4 (the row group), t = lane % 4 (the lane within it).
 *
 * Shapes: m16n8k16 for f16 and bf16 (MMA16_*), m16n8k8 for tf32 (MMA8_*). A is M x K row-major
 * in the maths (row = query row, col = k), B is K x N (row = k, col = n), C is M x N. */
#define MMA_LANES 32
#define MMA_M 16
#define MMA_N 8
#define MMA_G(lane) ((lane) >> 2)
#define MMA_T(lane) ((lane) & 3)

/* C (and D), both shapes: 4 elements a lane, two adjacent columns in rows g and g + 8. */
#define MMA_CE 4
#define MMA_C_ROW(lane, e) (MMA_G(lane) + 8 * ((e) >> 1))
#define MMA_C_COL(lane, e) (2 * MMA_T(lane) + ((e) & 1))

/* m16n8k16 (f16, bf16): A 8 elements a lane in 4 registers of 2 (register j = elements 2j and
 * 2j+1, adjacent columns), B 4 elements in 2 registers (adjacent k). */
#define MMA16_K 16
#define MMA16_AE 8
#define MMA16_BE 4
#define MMA16_A_ROW(lane, e) (MMA_G(lane) + 8 * (((e) >> 1) & 1))
#define MMA16_A_COL(lane, e) (2 * MMA_T(lane) + ((e) & 1) + 8 * ((e) >> 2))
#define MMA16_B_ROW(lane, e) (2 * MMA_T(lane) + ((e) & 1) + 8 * ((e) >> 1))
#define MMA16_B_COL(lane, e) MMA_G(lane)

/* m16n8k8 (tf32): A 4 elements a lane, B 2, one 32-bit register each. */
#define MMA8_K 8
#define MMA8_AE 4
#define MMA8_BE 2
#define MMA8_A_ROW(lane, e) (MMA_G(lane) + 8 * ((e) & 1))
#define MMA8_A_COL(lane, e) (MMA_T(lane) + 4 * ((e) >> 1))
#define MMA8_B_ROW(lane, e) (MMA_T(lane) + 4 * (e))
#define MMA8_B_COL(lane, e) MMA_G(lane)

/* P from S without leaving the registers: the C fragments of S (rows x keys, n-tiles of 8 keys)
 * become the A fragment of P for O += P·V. Element e of the A fragment of k-block kb takes
 * element P_ELEM(e) of S's n-tile P_TILE(kb, e), and its k index k stands for key P_KEY(k) of
 * the block, which the B fragment of V (mma_load_b_pv) must read for the same k.
 * m16n8k16: two n-tiles a k-block, keys in order. m16n8k8: one n-tile; C holds keys 2t and
 * 2t + 1 of a row where A wants k = t and t + 4, so k t stands for key 2t and k t + 4 for key
 * 2t + 1 (a permutation of the block's keys, which the sum over k does not see). */
#define MMA16_P_TILE(kb, e) (2 * (kb) + ((e) >> 2))
#define MMA16_P_ELEM(e) (((e) & 1) + 2 * (((e) >> 1) & 1))
#define MMA16_P_KEY(k) (k)
#define MMA8_P_TILE(kb, e) (kb)
#define MMA8_P_ELEM(e) ((((e) & 1) << 1) | ((e) >> 1))
#define MMA8_P_KEY(k) ((k) < 4 ? 2 * (k) : 2 * ((k) - 4) + 1)

/* ldmatrix (m8n8, .x4, 16-bit elements), PTX's per-lane rule: lane l gives the address of row
 * LDSM_ROW(l) of matrix LDSM_MAT(l) (8 contiguous elements, 16 bytes aligned); register i of lane
 * (g, t) then holds matrix i's row g, columns 2t and 2t + 1 (low half first), or with .trans its
 * rows 2t and 2t + 1 of column g. The B fragments of two 8-wide tiles come from one x4:
 *   K, stored n-major (key rows; S's B: element (k, n) = K[n][k]): matrix i is keys
 *     8·(i >> 1) + r, elements 8·(i & 1) + c of the 16-element k-step: registers 0, 1 the first
 *     n-tile's fragment, 2, 3 the second's (LDSM_K_ROW, LDSM_K_COL: lane l's row and column);
 *   V, stored k-major (key rows; P·V's B: element (k, n) = V[k][n]), with .trans: matrix i is
 *     keys 8·(i & 1) + r of the k-block, columns 8·(i >> 1) + c: registers 0, 1 the first 8
 *     columns' fragment, 2, 3 the next 8's (LDSM_V_ROW, LDSM_V_COL). */
#define MMA_LDSM_MAT(lane) ((lane) >> 3)
#define MMA_LDSM_ROW(lane) ((lane) & 7)
#define MMA_LDSM_K_ROW(lane) (8 * (MMA_LDSM_MAT(lane) >> 1) + MMA_LDSM_ROW(lane))
#define MMA_LDSM_K_COL(lane) (8 * (MMA_LDSM_MAT(lane) & 1))
#define MMA_LDSM_V_ROW(lane) (8 * (MMA_LDSM_MAT(lane) & 1) + MMA_LDSM_ROW(lane))
#define MMA_LDSM_V_COL(lane) (8 * (MMA_LDSM_MAT(lane) >> 1))
