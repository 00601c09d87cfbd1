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

/* AMD CDNA's matrix cores (gfx90a, gfx94x: v_mfma, a wavefront of 64 lanes), AMD's register
 * layouts (the CDNA3 ISA guide, "Matrix fused multiply-add"): for 16 x 16 outputs, lane l holds
 * column l % 16 of C in rows 4·(l / 16) + e; A's row l % 16 and B's column l % 16 at the k
 * indices AE·(l / 16) + e. v_mfma_f32_16x16x16{f16,bf16_1k}: AE = BE = 4; v_mfma_f32_16x16x4f32
 * (f32 inputs multiplied in f32): one element, k = l / 16. */
#define MFMA_LANES 64
#define MFMA_M 16
#define MFMA_N 16
#define MFMA_CE 4
#define MFMA_C_ROW(lane, e) (4 * ((lane) >> 4) + (e))
#define MFMA_C_COL(lane, e) ((lane) & 15)
#define MFMA16_K 16
#define MFMA16_AE 4
#define MFMA16_BE 4
#define MFMA16_A_ROW(lane, e) ((lane) & 15)
#define MFMA16_A_COL(lane, e) (4 * ((lane) >> 4) + (e))
#define MFMA16_B_ROW(lane, e) (4 * ((lane) >> 4) + (e))
#define MFMA16_B_COL(lane, e) ((lane) & 15)
#define MFMA4_K 4
#define MFMA4_AE 1
#define MFMA4_BE 1
#define MFMA4_A_ROW(lane, e) ((lane) & 15)
#define MFMA4_A_COL(lane, e) ((lane) >> 4)
#define MFMA4_B_ROW(lane, e) ((lane) >> 4)
#define MFMA4_B_COL(lane, e) ((lane) & 15)

/* Attention's roles on the two families. A warp (wavefront) takes 16 query rows and tiles of
 * S_N keys; a lane holds S_E scores a tile, in RS row slots, and O's elements likewise.
 *   NVIDIA (NVA_*): S = Q·Kᵀ (A = Q, B = K stored n-major), O = P·V (A = P, B = V); a row's
 *     scores lie in the 4 lanes of its group (reduced by xor 1 and 2), each lane two rows.
 *   AMD (MFA_*): the transposes, Sᵀ = K·Qᵀ (A = K, B = Q n-major) and Oᵀ = Vᵀ·Pᵀ (A = Vᵀ,
 *     B = Pᵀ): C's layout puts one query in a lane's column, so the C fragment of Sᵀ is already
 *     the B fragment of Pᵀ (no exchange between lanes), O's elements share that query, and a
 *     row's scores lie in lanes l, l + 16, l + 32, l + 48 (reduced by xor 16 and 32).
 * S_KEY(lane, e): the key (within the tile) of a lane's score e, S_RS(e) its row slot, ROW(lane,
 * i) the query row (within the warp's 16) of slot i; S_LANE(r, n), S_ELEM(r, n): the lane and
 * element holding row r's score of key n; O_COL(lane, e), O_RS(e) the same for O's columns;
 * LEADER(lane): one lane of each row (writes its LSE). */
#define NVA_RS 2
#define NVA_S_N MMA_N
#define NVA_S_KEY(lane, e) MMA_C_COL(lane, e)
#define NVA_S_RS(e) ((e) >> 1)
#define NVA_ROW(lane, i) (MMA_G(lane) + 8 * (i))
#define NVA_S_LANE(r, n) (4 * ((r) & 7) + (((n) & 7) >> 1))
#define NVA_S_ELEM(r, n) (2 * ((r) >> 3) + ((n) & 1))
#define NVA_O_N MMA_N
#define NVA_O_COL(lane, e) MMA_C_COL(lane, e)
#define NVA_O_RS(e) ((e) >> 1)
#define NVA_LEADER(lane) (MMA_T(lane) == 0)
#define NVA_RED0 1
#define NVA_RED1 2
#define MFA_RS 1
#define MFA_S_N MFMA_M
#define MFA_S_KEY(lane, e) MFMA_C_ROW(lane, e)
#define MFA_S_RS(e) 0
#define MFA_ROW(lane, i) ((lane) & 15)
#define MFA_S_LANE(r, n) ((r) + 16 * (((n) & 15) >> 2))
#define MFA_S_ELEM(r, n) ((n) & 3)
#define MFA_O_N MFMA_M
#define MFA_O_COL(lane, e) MFMA_C_ROW(lane, e)
#define MFA_O_RS(e) 0
#define MFA_LEADER(lane) ((lane) < 16)
#define MFA_RED0 16
#define MFA_RED1 32

/* P's fragment of k-block kb from S's tiles, and the keys its k indices stand for, on AMD:
 * 16x16x16: a tile is one k-block, element e of P's B fragment is element e of S's C (the same
 * lane's keys, in order); 16x16x4: a tile is four k-blocks, k-block kb takes element kb % 4 of
 * tile kb / 4, so its k index k stands for key 4k + kb % 4 of the tile (V's A fragment reads the
 * same). MFA*_P_KEY: the key within the tile (BN keys) for k index k of k-block kb. */
#define MFA16_P_TILE(kb, e) (kb)
#define MFA16_P_ELEM(kb, e) (e)
#define MFA16_P_KEY(kb, k) (16 * (kb) + (k))
#define MFA4_P_TILE(kb, e) ((kb) >> 2)
#define MFA4_P_ELEM(kb, e) ((kb) & 3)
#define MFA4_P_KEY(kb, k) (16 * ((kb) >> 2) + 4 * (k) + ((kb) & 3))

/* AMD RDNA3's WMMA (gfx11, a wavefront of 32; RDNA3's ISA guide, "WMMA"): 16 x 16 x 16, f16 and
 * bf16 only. A and B whole in each half-wave: lane l holds row (A) or column (B) l % 16 at all 16
 * k indices, lanes l and l + 16 the same values; C (f32) column l % 16 in rows 2e + l / 16, 8
 * elements. */
#define WMMA_LANES 32
#define WMMA_M 16
#define WMMA_N 16
#define WMMA_K 16
#define WMMA_AE 16
#define WMMA_BE 16
#define WMMA_CE 8
#define WMMA_A_ROW(lane, e) ((lane) & 15)
#define WMMA_A_COL(lane, e) (e)
#define WMMA_B_ROW(lane, e) (e)
#define WMMA_B_COL(lane, e) ((lane) & 15)
#define WMMA_C_ROW(lane, e) (2 * (e) + ((lane) >> 4))
#define WMMA_C_COL(lane, e) ((lane) & 15)

/* Its roles (WMA_*), oriented as MFMA's (Sᵀ = K·Qᵀ, Oᵀ = Vᵀ·Pᵀ: a lane's C elements share its
 * query l % 16). The kernel's tiles are halves of a product's (8 keys or columns, C elements
 * 4h .. 4h + 3 of half h: MMA_S and MMA_O take two at once): a lane holds keys 2e + l / 16 of
 * each, a row's scores lie in lanes l and l + 16 (reduced by xor 16 alone: RED1 0, none). P's B
 * fragment of k-block kb (half-tiles 2kb and 2kb + 1) needs all 16 keys in every lane: the pack
 * takes the other half-wave's (lane ^ 16) through an exchange; its k index is the key. */
#define WMA_RS 1
#define WMA_S_N 8
#define WMA_S_KEY(lane, e) (2 * (e) + ((lane) >> 4))
#define WMA_S_RS(e) 0
#define WMA_ROW(lane, i) ((lane) & 15)
#define WMA_S_LANE(r, n) ((r) + 16 * ((n) & 1))
#define WMA_S_ELEM(r, n) (((n) & 7) >> 1)
#define WMA_O_N 8
#define WMA_O_COL(lane, e) (2 * (e) + ((lane) >> 4))
#define WMA_O_RS(e) 0
#define WMA_LEADER(lane) ((lane) < 16)
#define WMA_RED0 16
#define WMA_RED1 0
#define WMA_P_TILE(kb, e) (2 * (kb) + ((e) >> 3))
#define WMA_P_KEY(kb, k) (16 * (kb) + (k))

/* Intel's XMX through cl_intel_subgroup_matrix_multiply_accumulate on sub-groups of 16 (Xe-HPC's
 * Data Center GPU Max, Xe2's Lunar Lake and Battlemage), intel_sub_group_{f16,bf16}_..._matrix_mad_k16
 * with M = 8 (the extension's text, "Subgroup Matrix Multiply Accumulate Instructions"): a
 * work-item contributes one 16-bit value of each of A's 8 rows (short8: element e is row e, the
 * work-item's index its column k), one column of B with all 16 k (int8: element e is k e, two a
 * word, the lower k in the low half), and receives one column of C (float8: element e is row e).
 * f16 and bf16 only (tf32 is another extension). */
#define XMX_LANES 16
#define XMX_M 8
#define XMX_N 16
#define XMX_K 16
#define XMX_AE 8
#define XMX_BE 16
#define XMX_CE 8
#define XMX_A_ROW(lane, e) (e)
#define XMX_A_COL(lane, e) (lane)
#define XMX_B_ROW(lane, e) (e)
#define XMX_B_COL(lane, e) (lane)
#define XMX_C_ROW(lane, e) (e)
#define XMX_C_COL(lane, e) (lane)

/* Its roles (XMA_*), oriented as AMD's (Sᵀ = K·Qᵀ, Oᵀ = Vᵀ·Pᵀ): a work-item's C elements are 8
 * keys (or O columns) of its own query, so a row's scores never leave their lane (no exchange:
 * RED0 and RED1 0) and P's B fragment of k-block kb is the lane's own 16 weights. The kernel's
 * tiles are halves of a product's (4 keys or columns, C elements 4h .. 4h + 3 of half h: MMA_S and
 * MMA_O take two at once), and P's fragment takes four of them (half tiles 4kb .. 4kb + 3). */
#define XMA_RS 1
#define XMA_S_N 4
#define XMA_S_KEY(lane, e) (e)
#define XMA_S_RS(e) 0
#define XMA_ROW(lane, i) (lane)
#define XMA_S_LANE(r, n) (r)
#define XMA_S_ELEM(r, n) ((n) & 3)
#define XMA_O_N 4
#define XMA_O_COL(lane, e) (e)
#define XMA_O_RS(e) 0
#define XMA_LEADER(lane) 1
#define XMA_RED0 0
#define XMA_RED1 0
#define XMA_P_TILE(kb, e) (4 * (kb) + ((e) >> 2))
#define XMA_P_KEY(kb, k) (16 * (kb) + (k))

/* The same builtins on sub-groups of 8 (Xe-HPG's Arc A-series and Data Center Flex): N = 8, and A
 * as int8, a work-item giving 32 bits of each of the 8 rows: k indices 2j (low half) and 2j + 1 of
 * work-item j. The kernel's warp is two such sub-groups, 16 lanes (lane 8s + j: work-item j of the
 * pair's sub-group s), each multiplying the same A by the B of its own 8 queries: in the warp's
 * view A is replicated in the two halves (lanes l and l + 8 hold the same values) and B, C and the
 * roles are XMX's (XMA_*). */
#define XMX8_AE 16
#define XMX8_A_ROW(lane, e) ((e) >> 1)
#define XMX8_A_COL(lane, e) (2 * ((lane) & 7) + ((e) & 1))
