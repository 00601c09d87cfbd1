/*
 * The matrix-unit tile layer's per-lane layouts (cl/mma_layout.cl, included here as C), without a
 * device: every (lane, element) -> (row, col) map covers its fragment exactly once, for NVIDIA's
 * warps of 32 and AMD CDNA's wavefronts of 64, and RDNA3's WMMA (wavefront of 32) has its A and
 * B replicated (each cell in exactly two (lane, element)s: lanes l and l + 16, the same element)
 * and its C a bijection; a few lanes against the positions NVIDIA's PTX ISA documents for
 * mma.m16n8k16 and mma.m16n8k8, AMD's CDNA ISA for v_mfma_f32_16x16x16f16 and
 * v_mfma_f32_16x16x4f32, and AMD's GPUOpen WMMA example for v_wmma_f32_16x16x16_f16 (written out
 * here, not derived from the maps); a model of a warp that multiplies through the maps (each lane
 * gathers its fragments, the product scatters them, a cell written twice only with one value,
 * and each lane computes its own C elements), generic over lanes, M, N, K and the maps, equals a
 * plain GEMM for all seven shapes; and the chain fused_mma.cl runs, S = Q·Kᵀ in C fragments whose
 * probabilities become P's A fragments (P_TILE, P_ELEM) with V's B fragment read through P_KEY,
 * gives P·V of a plain GEMM, for both NVIDIA shapes; and the lane addresses of the ldmatrix loads
 * give, through a model of ldmatrix.x4 written from the PTX ISA, the same B fragments.
 * The attention roles (NVA_*, MFA_*, WMA_*), per family and shape: S computed through the warp
 * model in the family's orientation (NVIDIA S = Q·Kᵀ, AMD Sᵀ = K·Qᵀ) holds at each lane's element
 * e the score of query row ROW(lane, S_RS(e)) and key S_KEY(lane, e) (WMMA: of a logical tile of
 * 8 keys, half a product's C: elements 4h .. 4h + 3 of product t are logical tile 2t + h);
 * S_LANE / S_ELEM invert that; the lanes of a row are a lane and its xor partners RED0, RED1,
 * RED0 ^ RED1 (RED1 0: a lane and its RED0 partner alone), with one LEADER; P packed from those
 * scores through P_TILE / P_ELEM (NVIDIA: A of P·V, AMD: B of Vᵀ·Pᵀ; WMMA: every lane's B element
 * k the key 16kb + k, found through S_KEY in the lane's own tiles or its RED0 partner's, the two
 * disjoint and together the k-block), with V's operand read at P_KEY, gives O whose element e is
 * P·V at (ROW(lane, O_RS(e)), O_COL(lane, e)) (WMMA: of a logical O tile of 8 columns).
 *
 * Table-driven: one row per shape ("k16": f16/bf16 m16n8k16, "k8": tf32 m16n8k8, "mfma16":
 * f16/bf16 16x16x16, "mfma4": f32 16x16x4, "wmma": f16/bf16 16x16x16 on RDNA3, "xmx": f16/bf16
 * 8x16x16 on Intel's sub-groups of 16, whose maps are bijections and whose attention roles keep a
 * row in one lane: XMA_*, RED0 0, P's fragment from four 4-key half tiles of the lane's own; "xmx8":
 * the same on two sub-groups of 8, A replicated in the two), and
 * per family and shape for the attention roles.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../cl/mma_layout.cl"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---- the products ---- */

/* One warp-level product C (m x n) += A (m x k) · B (k x n) on `lanes` lanes, each holding ae,
 * be and ce elements of A, B and C at the (row, col) its maps give. */
typedef struct mma_shape {
    const char *name;
    int lanes, m, n, k, ae, be, ce;
    int (*a_row)(int, int), (*a_col)(int, int), (*b_row)(int, int), (*b_col)(int, int);
    int (*c_row)(int, int), (*c_col)(int, int);
} mma_shape;

static int a16_row(int l, int e) { return MMA16_A_ROW(l, e); }
static int a16_col(int l, int e) { return MMA16_A_COL(l, e); }
static int b16_row(int l, int e) { return MMA16_B_ROW(l, e); }
static int b16_col(int l, int e) { return (void)e, MMA16_B_COL(l, e); }
static int p16_tile(int kb, int e) { return MMA16_P_TILE(kb, e); }
static int p16_elem(int e) { return MMA16_P_ELEM(e); }
static int p16_key(int k) { return MMA16_P_KEY(k); }
static int a8_row(int l, int e) { return MMA8_A_ROW(l, e); }
static int a8_col(int l, int e) { return MMA8_A_COL(l, e); }
static int b8_row(int l, int e) { return MMA8_B_ROW(l, e); }
static int b8_col(int l, int e) { return (void)e, MMA8_B_COL(l, e); }
static int p8_tile(int kb, int e) { return (void)e, MMA8_P_TILE(kb, e); }
static int p8_elem(int e) { return MMA8_P_ELEM(e); }
static int p8_key(int k) { return MMA8_P_KEY(k); }
static int c_row(int l, int e) { return MMA_C_ROW(l, e); }
static int c_col(int l, int e) { return MMA_C_COL(l, e); }

static int mf16_a_row(int l, int e) { return (void)e, MFMA16_A_ROW(l, e); }
static int mf16_a_col(int l, int e) { return MFMA16_A_COL(l, e); }
static int mf16_b_row(int l, int e) { return MFMA16_B_ROW(l, e); }
static int mf16_b_col(int l, int e) { return (void)e, MFMA16_B_COL(l, e); }
static int mf4_a_row(int l, int e) { return (void)e, MFMA4_A_ROW(l, e); }
static int mf4_a_col(int l, int e) { return (void)e, MFMA4_A_COL(l, e); }
static int mf4_b_row(int l, int e) { return (void)e, MFMA4_B_ROW(l, e); }
static int mf4_b_col(int l, int e) { return (void)e, MFMA4_B_COL(l, e); }
static int mf_c_row(int l, int e) { return MFMA_C_ROW(l, e); }
static int mf_c_col(int l, int e) { return (void)e, MFMA_C_COL(l, e); }
static int wm_a_row(int l, int e) { return (void)e, WMMA_A_ROW(l, e); }
static int wm_a_col(int l, int e) { return (void)l, WMMA_A_COL(l, e); }
static int wm_b_row(int l, int e) { return (void)l, WMMA_B_ROW(l, e); }
static int wm_b_col(int l, int e) { return (void)e, WMMA_B_COL(l, e); }
static int wm_c_row(int l, int e) { return WMMA_C_ROW(l, e); }
static int wm_c_col(int l, int e) { return (void)e, WMMA_C_COL(l, e); }
static int xm_a_row(int l, int e) { return (void)l, XMX_A_ROW(l, e); }
static int xm_a_col(int l, int e) { return (void)e, XMX_A_COL(l, e); }
static int xm_b_row(int l, int e) { return (void)l, XMX_B_ROW(l, e); }
static int xm_b_col(int l, int e) { return (void)e, XMX_B_COL(l, e); }
static int xm_c_row(int l, int e) { return (void)l, XMX_C_ROW(l, e); }
static int xm_c_col(int l, int e) { return (void)e, XMX_C_COL(l, e); }
static int xm8_a_row(int l, int e) { return (void)l, XMX8_A_ROW(l, e); }
static int xm8_a_col(int l, int e) { return XMX8_A_COL(l, e); }

enum { NV16, NV8, MF16, MF4, WM, XM, XM8 };
static const mma_shape products[] = {
    [NV16] = {"k16", MMA_LANES, MMA_M, MMA_N, MMA16_K, MMA16_AE, MMA16_BE, MMA_CE, a16_row, a16_col, b16_row,
              b16_col, c_row, c_col},
    [NV8] = {"k8", MMA_LANES, MMA_M, MMA_N, MMA8_K, MMA8_AE, MMA8_BE, MMA_CE, a8_row, a8_col, b8_row, b8_col,
             c_row, c_col},
    [MF16] = {"mfma16", MFMA_LANES, MFMA_M, MFMA_N, MFMA16_K, MFMA16_AE, MFMA16_BE, MFMA_CE, mf16_a_row,
              mf16_a_col, mf16_b_row, mf16_b_col, mf_c_row, mf_c_col},
    [MF4] = {"mfma4", MFMA_LANES, MFMA_M, MFMA_N, MFMA4_K, MFMA4_AE, MFMA4_BE, MFMA_CE, mf4_a_row, mf4_a_col,
             mf4_b_row, mf4_b_col, mf_c_row, mf_c_col},
    [WM] = {"wmma", WMMA_LANES, WMMA_M, WMMA_N, WMMA_K, WMMA_AE, WMMA_BE, WMMA_CE, wm_a_row, wm_a_col, wm_b_row,
            wm_b_col, wm_c_row, wm_c_col},
    [XM] = {"xmx", XMX_LANES, XMX_M, XMX_N, XMX_K, XMX_AE, XMX_BE, XMX_CE, xm_a_row, xm_a_col, xm_b_row, xm_b_col,
            xm_c_row, xm_c_col},
    [XM8] = {"xmx8", XMX_LANES, XMX_M, XMX_N, XMX_K, XMX8_AE, XMX_BE, XMX_CE, xm8_a_row, xm8_a_col, xm_b_row,
             xm_b_col, xm_c_row, xm_c_col},
};

/* Positions a vendor documents: lane's element e is (row, col) of the fragment. */
typedef struct doc_pos {
    int lane, e, row, col;
} doc_pos;

/* NVIDIA's shapes, with P's fragments from S's (fused_mma.cl's chain). */
typedef struct shape_row {
    const char *name;
    const mma_shape *mm;
    int (*p_tile)(int, int), (*p_elem)(int), (*p_key)(int);
} shape_row;

static shape_row shapes[] = {
    {"k16", &products[NV16], p16_tile, p16_elem, p16_key},
    {"k8", &products[NV8], p8_tile, p8_elem, p8_key},
};

/* AMD's shapes, with the positions the CDNA ISA documents, written out from its formulas (not
 * from the maps): v_mfma_f32_16x16x16f16: A[i][k] in lane i + 16·(k / 4), element k % 4; B[k][j]
 * in lane j + 16·(k / 4), element k % 4; D[i][j] in lane j + 16·(i / 4), element i % 4.
 * v_mfma_f32_16x16x4f32: A[i][k] in lane i + 16·k, B[k][j] in lane j + 16·k, D as above. */
static const doc_pos mf16_doc_a[] = {{0, 0, 0, 0}, {0, 3, 0, 3}, {16, 0, 0, 4}, {17, 2, 1, 6},
                                     {47, 1, 15, 9}, {63, 3, 15, 15}};
static const doc_pos mf16_doc_b[] = {{0, 0, 0, 0}, {0, 3, 3, 0}, {16, 0, 4, 0}, {17, 2, 6, 1},
                                     {35, 1, 9, 3}, {63, 3, 15, 15}};
static const doc_pos mf4_doc_a[] = {{0, 0, 0, 0}, {5, 0, 5, 0}, {16, 0, 0, 1}, {47, 0, 15, 2}, {63, 0, 15, 3}};
static const doc_pos mf4_doc_b[] = {{0, 0, 0, 0}, {15, 0, 0, 15}, {33, 0, 2, 1}, {63, 0, 3, 15}};
static const doc_pos mf_doc_c[] = {{0, 0, 0, 0}, {0, 1, 1, 0}, {15, 0, 0, 15}, {16, 0, 4, 0},
                                   {37, 2, 10, 5}, {63, 3, 15, 15}};

typedef struct mfma_row {
    const char *name;
    const mma_shape *mm;
    const doc_pos *doc_a, *doc_b;
    size_t n_doc_a, n_doc_b;
} mfma_row;

static mfma_row mfma_shapes[] = {
    {"mfma16", &products[MF16], mf16_doc_a, mf16_doc_b, N_OF(mf16_doc_a), N_OF(mf16_doc_b)},
    {"mfma4", &products[MF4], mf4_doc_a, mf4_doc_b, N_OF(mf4_doc_a), N_OF(mf4_doc_b)},
};

/* RDNA3's v_wmma_f32_16x16x16_f16, the positions AMD's GPUOpen WMMA example documents, written
 * out from its loops (not from the maps): a_frag[e] = A[lane % 16][e], b_frag[e] =
 * B[e][lane % 16], c_frag[e] = C[2e + lane / 16][lane % 16]. */
static const doc_pos wm_doc_a[] = {{0, 0, 0, 0}, {3, 5, 3, 5}, {19, 5, 3, 5}, {16, 0, 0, 0},
                                   {10, 12, 10, 12}, {31, 15, 15, 15}};
static const doc_pos wm_doc_b[] = {{0, 0, 0, 0}, {7, 2, 2, 7}, {23, 2, 2, 7}, {16, 15, 15, 0},
                                   {12, 3, 3, 12}, {31, 15, 15, 15}};
static const doc_pos wm_doc_c[] = {{0, 0, 0, 0}, {16, 0, 1, 0}, {5, 3, 6, 5}, {21, 2, 5, 5},
                                   {15, 7, 14, 15}, {31, 7, 15, 15}};

/* Intel's intel_sub_group_f16_f16_matrix_mad_k16 (float8 acc: M = 8) on sub-groups of 16, as the
 * extension's text describes its operands, written out here (not from the maps): work-item j gives
 * one 16-bit value of each row m of a (component m: A[m][j]; its coding sample multiplies row m's
 * k block j by the value sub_group_broadcast(a.m, j)), one column of b with all K values in order
 * (B[k][n] in work-item n, element k), and receives one column of the result (component m:
 * C[m][n] in work-item n). */
static const doc_pos xm_doc_a[] = {{0, 0, 0, 0}, {5, 3, 3, 5}, {15, 0, 0, 15}, {9, 7, 7, 9}};
static const doc_pos xm_doc_b[] = {{0, 0, 0, 0}, {3, 9, 9, 3}, {15, 15, 15, 15}, {0, 15, 15, 0}};
static const doc_pos xm_doc_c[] = {{0, 0, 0, 0}, {7, 2, 2, 7}, {15, 7, 7, 15}, {4, 0, 0, 4}};
/* On sub-groups of 8 (the same text: 32 bits a work-item and row, so K = 16 over 8 work-items,
 * the lower k in the low half, as its coding sample's as_char4 reads bytes), in the warp of two
 * sub-groups: lane 8s + j holds A[m][2j] at element 2m and A[m][2j + 1] at element 2m + 1. */
static const doc_pos xm8_doc_a[] = {{0, 0, 0, 0}, {0, 1, 0, 1}, {3, 4, 2, 6}, {3, 5, 2, 7},
                                    {11, 4, 2, 6}, {7, 15, 7, 15}, {15, 14, 7, 14}, {8, 0, 0, 0}};

/* Each cell of a rows x cols fragment is held by exactly one (lane, element) of `lanes` lanes. */
static void check_bijection(const char *what, int lanes, int rows, int cols, int ne, int (*row)(int, int),
                            int (*col)(int, int))
{
    int seen[16 * 16];
    assert_true(rows * cols <= (int)N_OF(seen));
    if (lanes * ne != rows * cols)
        fail_msg("%s: %d lanes x %d elements for a %d x %d fragment", what, lanes, ne, rows, cols);
    memset(seen, 0, sizeof seen);
    for (int l = 0; l < lanes; l++)
        for (int e = 0; e < ne; e++) {
            const int r = row(l, e), c = col(l, e);
            if (r < 0 || r >= rows || c < 0 || c >= cols)
                fail_msg("%s: lane %d element %d -> (%d, %d) outside %d x %d", what, l, e, r, c, rows, cols);
            if (seen[r * cols + c]++)
                fail_msg("%s: (%d, %d) held twice (again by lane %d element %d)", what, r, c, l, e);
        }
}

static void check_product_bijection(const mma_shape *s)
{
    check_bijection("A", s->lanes, s->m, s->k, s->ae, s->a_row, s->a_col);
    check_bijection("B", s->lanes, s->k, s->n, s->be, s->b_row, s->b_col);
    check_bijection("C", s->lanes, s->m, s->n, s->ce, s->c_row, s->c_col);
}

static void test_bijection(void **state)
{
    const shape_row *s = *state;
    check_product_bijection(s->mm);
    /* P's key order is a permutation of the k-block. */
    int seen[16] = {0};
    for (int k = 0; k < s->mm->k; k++) {
        const int key = s->p_key(k);
        assert_true(key >= 0 && key < s->mm->k);
        assert_int_equal(seen[key]++, 0);
    }
}

static void test_mfma_bijection(void **state)
{
    const mfma_row *s = *state;
    check_product_bijection(s->mm);
}

/* Each cell of a rows x cols fragment is held by exactly two (lane, element)s of `lanes` lanes:
 * lanes l and l + half, at the same element. */
static void check_replicated(const char *what, int lanes, int half, int rows, int cols, int ne,
                             int (*row)(int, int), int (*col)(int, int))
{
    int seen[16 * 16], lane[16 * 16][2], elem[16 * 16][2];
    assert_true(rows * cols <= (int)N_OF(seen));
    if (lanes * ne != 2 * rows * cols)
        fail_msg("%s: %d lanes x %d elements for twice a %d x %d fragment", what, lanes, ne, rows, cols);
    memset(seen, 0, sizeof seen);
    for (int l = 0; l < lanes; l++)
        for (int e = 0; e < ne; e++) {
            const int r = row(l, e), c = col(l, e), i = r * cols + c;
            if (r < 0 || r >= rows || c < 0 || c >= cols)
                fail_msg("%s: lane %d element %d -> (%d, %d) outside %d x %d", what, l, e, r, c, rows, cols);
            if (seen[i] == 2)
                fail_msg("%s: (%d, %d) held a third time (by lane %d element %d)", what, r, c, l, e);
            lane[i][seen[i]] = l;
            elem[i][seen[i]++] = e;
        }
    for (int i = 0; i < rows * cols; i++) {
        if (seen[i] != 2)
            fail_msg("%s: (%d, %d) held %d times, not 2", what, i / cols, i % cols, seen[i]);
        if (lane[i][1] != lane[i][0] + half || elem[i][1] != elem[i][0])
            fail_msg("%s: (%d, %d) in lane %d element %d and lane %d element %d, not l and l + %d at one e", what,
                     i / cols, i % cols, lane[i][0], elem[i][0], lane[i][1], elem[i][1], half);
    }
}

/* WMMA: A and B whole in each half-wave, C a bijection. */
static void test_wmma_bijection(void **state)
{
    const mma_shape *s = *state;
    check_replicated("A", s->lanes, s->lanes / 2, s->m, s->k, s->ae, s->a_row, s->a_col);
    check_replicated("B", s->lanes, s->lanes / 2, s->k, s->n, s->be, s->b_row, s->b_col);
    check_bijection("C", s->lanes, s->m, s->n, s->ce, s->c_row, s->c_col);
}

static void check_documented(const char *what, const doc_pos *d, size_t n, int (*row)(int, int),
                             int (*col)(int, int))
{
    for (size_t i = 0; i < n; i++) {
        const int r = row(d[i].lane, d[i].e), c = col(d[i].lane, d[i].e);
        if (r != d[i].row || c != d[i].col)
            fail_msg("%s: lane %d element %d -> (%d, %d), documented (%d, %d)", what, d[i].lane, d[i].e, r, c,
                     d[i].row, d[i].col);
    }
}

/* Positions from the PTX ISA's fragment figures, for lanes 0, 5 and 31. */
static void test_documented(void **state)
{
    const shape_row *s = *state;
    static const doc_pos a16[] = {{0, 0, 0, 0}, {0, 1, 0, 1}, {0, 2, 8, 0}, {0, 3, 8, 1}, {0, 4, 0, 8},
                                  {0, 7, 8, 9}, {5, 0, 1, 2}, {5, 6, 9, 10}, {31, 7, 15, 15}};
    static const doc_pos b16[] = {{0, 0, 0, 0}, {0, 1, 1, 0}, {0, 2, 8, 0}, {0, 3, 9, 0},
                                  {5, 0, 2, 1}, {31, 3, 15, 7}};
    static const doc_pos a8[] = {{0, 0, 0, 0}, {0, 1, 8, 0}, {0, 2, 0, 4}, {0, 3, 8, 4},
                                 {5, 0, 1, 1}, {31, 3, 15, 7}};
    static const doc_pos b8[] = {{0, 0, 0, 0}, {0, 1, 4, 0}, {5, 0, 1, 1}, {31, 1, 7, 7}};
    static const doc_pos cc[] = {{0, 0, 0, 0}, {0, 1, 0, 1}, {0, 2, 8, 0}, {0, 3, 8, 1},
                                 {5, 0, 1, 2}, {31, 3, 15, 7}};
    const mma_shape *m = s->mm;
    const int k16 = m->k == 16;
    check_documented("A", k16 ? a16 : a8, k16 ? N_OF(a16) : N_OF(a8), m->a_row, m->a_col);
    check_documented("B", k16 ? b16 : b8, k16 ? N_OF(b16) : N_OF(b8), m->b_row, m->b_col);
    check_documented("C", cc, N_OF(cc), m->c_row, m->c_col);
}

/* Positions from AMD's formulas (mfma_shapes' tables). */
static void test_mfma_documented(void **state)
{
    const mfma_row *s = *state;
    check_documented("A", s->doc_a, s->n_doc_a, s->mm->a_row, s->mm->a_col);
    check_documented("B", s->doc_b, s->n_doc_b, s->mm->b_row, s->mm->b_col);
    check_documented("C", mf_doc_c, N_OF(mf_doc_c), s->mm->c_row, s->mm->c_col);
}

/* Intel XMX: every map a bijection, and the positions the extension describes (xm_doc_*). */
static void test_xmx(void **state)
{
    const mma_shape *s = *state;
    check_product_bijection(s);
    check_documented("A", xm_doc_a, N_OF(xm_doc_a), s->a_row, s->a_col);
    check_documented("B", xm_doc_b, N_OF(xm_doc_b), s->b_row, s->b_col);
    check_documented("C", xm_doc_c, N_OF(xm_doc_c), s->c_row, s->c_col);
}

/* Intel XMX on sub-groups of 8: A replicated in the warp's two sub-groups (lanes l and l + 8),
 * B and C bijections, and the positions above. */
static void test_xmx8(void **state)
{
    const mma_shape *s = *state;
    check_replicated("A", s->lanes, 8, s->m, s->k, s->ae, s->a_row, s->a_col);
    check_bijection("B", s->lanes, s->k, s->n, s->be, s->b_row, s->b_col);
    check_bijection("C", s->lanes, s->m, s->n, s->ce, s->c_row, s->c_col);
    check_documented("A", xm8_doc_a, N_OF(xm8_doc_a), s->a_row, s->a_col);
    check_documented("B", xm_doc_b, N_OF(xm_doc_b), s->b_row, s->b_col);
}

/* What the XMX backend's loads (cl/mma.cl, xmx_col8 and ld16x2) assume of the maps: a lane's A
 * elements in one column, at rows A_ROW (sub-groups of 16), or in one pair of adjacent columns
 * starting at an even one (4-byte loads), elements 2m and 2m + 1 in one row (sub-groups of 8); B's
 * element e at k e of one column (two 16-byte loads). And that the roles never fetch across a
 * sub-group (sg lanes): a row's scores for the exact path come from a lane of the same sub-group
 * (the GPU's shuffle index is taken modulo its size). */
typedef struct xmx_row {
    const char *name;
    const mma_shape *mm;
    int sg;
} xmx_row;

static void test_xmx_loads(void **state)
{
    const xmx_row *x = *state;
    const mma_shape *s = x->mm;
    for (int l = 0; l < s->lanes; l++) {
        const int c0 = s->a_col(l, 0);
        for (int e = 0; e < s->ae; e++) {
            const int pair = x->sg == 8, m = pair ? e >> 1 : e;
            const int want_col = c0 + (pair ? (e & 1) : 0);
            if (s->a_row(l, e) != s->a_row(l, pair ? 2 * m : m) || s->a_col(l, e) != want_col)
                fail_msg("%s A: lane %d element %d at (%d, %d), the loads read column %d of row %d", x->name, l, e,
                         s->a_row(l, e), s->a_col(l, e), want_col, s->a_row(l, pair ? 2 * m : m));
        }
        if (x->sg == 8 && c0 % 2 != 0)
            fail_msg("%s A: lane %d's pair starts at odd column %d", x->name, l, c0);
        for (int e = 0; e < s->be; e++)
            if (s->b_row(l, e) != e || s->b_col(l, e) != s->b_col(l, 0))
                fail_msg("%s B: lane %d element %d at (%d, %d)", x->name, l, e, s->b_row(l, e), s->b_col(l, e));
        for (int n = 0; n < XMA_S_N; n++) {
            const int src = XMA_S_LANE(XMA_ROW(l, 0), n);
            if (src / x->sg != l / x->sg)
                fail_msg("%s: lane %d fetches key %d's score from lane %d, another sub-group", x->name, l, n, src);
        }
    }
}

static xmx_row xmx_rows[] = {
    {"xmx", &products[XM], 16},
    {"xmx8", &products[XM8], 8},
};

/* Positions from AMD's WMMA example (wm_doc_*). */
static void test_wmma_documented(void **state)
{
    const mma_shape *s = *state;
    check_documented("A", wm_doc_a, N_OF(wm_doc_a), s->a_row, s->a_col);
    check_documented("B", wm_doc_b, N_OF(wm_doc_b), s->b_row, s->b_col);
    check_documented("C", wm_doc_c, N_OF(wm_doc_c), s->c_row, s->c_col);
}

/* ---- a warp model ---- */

typedef struct frags {
    double a[MFMA_LANES][16], b[MFMA_LANES][16], c[MFMA_LANES][8];
} frags;

/* Cell (r, c) of an operand M gets x from lane l's element e; one written before (WMMA's
 * replicated lanes) must have had the same value. */
static void scatter(const char *name, const char *what, double M[16][16], int r, int c, double x, int l, int e)
{
    if (!isnan(M[r][c]) && M[r][c] != x)
        fail_msg("%s %s: lane %d element %d writes %.17g to (%d, %d), which holds %.17g", name, what, l, e, x, r, c,
                 M[r][c]);
    M[r][c] = x;
}

/* C += A·B for a warp whose lanes hold a, b and c: the fragments scattered to matrices through
 * the maps (lanes that hold the same cell with the same value), then each lane's C elements
 * computed (as the emulation in cl/mma.cl does). Cells no lane holds stay NaN. */
static void warp_mma(const mma_shape *s, frags *f)
{
    double A[16][16], B[16][16];
    assert_true(s->lanes <= MFMA_LANES && s->m <= 16 && s->n <= 16 && s->k <= 16);
    assert_true(s->ae <= (int)N_OF(f->a[0]) && s->be <= (int)N_OF(f->b[0]) && s->ce <= (int)N_OF(f->c[0]));
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            A[i][j] = B[i][j] = NAN;
    for (int l = 0; l < s->lanes; l++) {
        for (int e = 0; e < s->ae; e++) {
            const int r = s->a_row(l, e), c = s->a_col(l, e);
            if (r < 0 || r >= s->m || c < 0 || c >= s->k)
                fail_msg("%s A: lane %d element %d -> (%d, %d)", s->name, l, e, r, c);
            scatter(s->name, "A", A, r, c, f->a[l][e], l, e);
        }
        for (int e = 0; e < s->be; e++) {
            const int r = s->b_row(l, e), c = s->b_col(l, e);
            if (r < 0 || r >= s->k || c < 0 || c >= s->n)
                fail_msg("%s B: lane %d element %d -> (%d, %d)", s->name, l, e, r, c);
            scatter(s->name, "B", B, r, c, f->b[l][e], l, e);
        }
    }
    for (int l = 0; l < s->lanes; l++)
        for (int e = 0; e < s->ce; e++) {
            const int r = s->c_row(l, e), n = s->c_col(l, e);
            if (r < 0 || r >= s->m || n < 0 || n >= s->n)
                fail_msg("%s C: lane %d element %d -> (%d, %d)", s->name, l, e, r, n);
            for (int k = 0; k < s->k; k++)
                f->c[l][e] += A[r][k] * B[k][n];
        }
}

static double rnd(unsigned *x)
{
    *x = *x * 1103515245u + 12345u;
    return (double)((*x >> 8) & 0xffff) / 65536.0 - 0.5;
}

/* One product through the lanes' fragments against a plain GEMM. */
static void test_gemm(void **state)
{
    const mma_shape *s = *state;
    unsigned seed = 7;
    double A[16][16], B[16][16], C[16][16];
    for (int r = 0; r < s->m; r++)
        for (int k = 0; k < s->k; k++)
            A[r][k] = rnd(&seed);
    for (int k = 0; k < s->k; k++)
        for (int n = 0; n < s->n; n++)
            B[k][n] = rnd(&seed);
    for (int r = 0; r < s->m; r++)
        for (int n = 0; n < s->n; n++)
            C[r][n] = rnd(&seed);
    frags f;
    memset(&f, 0, sizeof f);
    for (int l = 0; l < s->lanes; l++) {
        for (int e = 0; e < s->ae; e++)
            f.a[l][e] = A[s->a_row(l, e)][s->a_col(l, e)];
        for (int e = 0; e < s->be; e++)
            f.b[l][e] = B[s->b_row(l, e)][s->b_col(l, e)];
        for (int e = 0; e < s->ce; e++)
            f.c[l][e] = C[s->c_row(l, e)][s->c_col(l, e)];
    }
    warp_mma(s, &f);
    for (int l = 0; l < s->lanes; l++)
        for (int e = 0; e < s->ce; e++) {
            const int r = s->c_row(l, e), n = s->c_col(l, e);
            double want = C[r][n];
            for (int k = 0; k < s->k; k++)
                want += A[r][k] * B[k][n];
            if (!(fabs(f.c[l][e] - want) <= 1e-12))
                fail_msg("lane %d element %d (%d, %d): %.17g, want %.17g", l, e, r, n, f.c[l][e], want);
        }
}

/* fused_mma.cl's chain for 16 rows, 2·K keys and 8 output columns: S's C fragments (n-tiles of 8
 * keys) packed into P's A fragments, V's B fragments read at P_KEY, O = P·V through the warp
 * model, against the plain product. */
static void test_p_chain(void **state)
{
    const shape_row *s = *state;
    const mma_shape *m = s->mm;
    enum { KEYS = 32 };
    unsigned seed = 11;
    double P[16][KEYS], V[KEYS][8];
    for (int r = 0; r < MMA_M; r++)
        for (int j = 0; j < KEYS; j++)
            P[r][j] = rnd(&seed);
    for (int j = 0; j < KEYS; j++)
        for (int n = 0; n < MMA_N; n++)
            V[j][n] = rnd(&seed);
    /* S's fragments: n-tile nt holds keys 8·nt .. 8·nt + 7 in the C layout. */
    double sfrag[KEYS / 8][MMA_LANES][4];
    for (int nt = 0; nt < KEYS / 8; nt++)
        for (int l = 0; l < MMA_LANES; l++)
            for (int e = 0; e < MMA_CE; e++)
                sfrag[nt][l][e] = P[c_row(l, e)][8 * nt + c_col(l, e)];
    frags f;
    memset(&f, 0, sizeof f);
    for (int kb = 0; kb < KEYS / m->k; kb++) {
        for (int l = 0; l < MMA_LANES; l++) {
            for (int e = 0; e < m->ae; e++)
                f.a[l][e] = sfrag[s->p_tile(kb, e)][l][s->p_elem(e)];
            /* V stored n-major (Vt[n][key]) as the kernel stages it; k stands for key P_KEY(k). */
            for (int e = 0; e < m->be; e++)
                f.b[l][e] = V[kb * m->k + s->p_key(m->b_row(l, e))][m->b_col(l, e)];
        }
        warp_mma(m, &f);
    }
    for (int l = 0; l < MMA_LANES; l++)
        for (int e = 0; e < MMA_CE; e++) {
            const int r = c_row(l, e), n = c_col(l, e);
            double want = 0.0;
            for (int j = 0; j < KEYS; j++)
                want += P[r][j] * V[j][n];
            if (!(fabs(f.c[l][e] - want) <= 1e-12))
                fail_msg("lane %d element %d (%d, %d): %.17g, want %.17g", l, e, r, n, f.c[l][e], want);
        }
}

/* ---- attention's roles on both families ---- */

/* A family's roles (NVA_*, MFA_*, WMA_*) over one shape, which makes both S and O. p_key(kb, k):
 * the key within the BN-key tile that k index k of k-block kb stands for. half: a product's C is
 * two logical tiles of S_N keys (O_N columns), elements 0 .. CE / 2 - 1 and CE / 2 .. CE - 1
 * (WMMA). p_elem NULL: P's element e (k index k) is the score of key K·kb + k, taken from the
 * lane's own tile P_TILE(kb, e) or its RED0 partner's, whichever S_KEY says holds it (WMMA). */
typedef struct attn_row {
    const char *name;
    const mma_shape *mm;
    int amd;  /* 0: S = Q·Kᵀ, O = P·V (NVIDIA); 1: Sᵀ = K·Qᵀ, Oᵀ = Vᵀ·Pᵀ (AMD) */
    int half; /* 1: logical tiles are halves of a product's */
    int rs, s_n, o_n, red0, red1;
    int (*s_key)(int, int), (*s_rs)(int), (*row)(int, int), (*s_lane)(int, int), (*s_elem)(int, int);
    int (*o_col)(int, int), (*o_rs)(int), (*leader)(int);
    int (*p_tile)(int, int), (*p_elem)(int, int), (*p_key)(int, int);
} attn_row;

static int nva_s_key(int l, int e) { return NVA_S_KEY(l, e); }
static int nva_s_rs(int e) { return NVA_S_RS(e); }
static int nva_row(int l, int i) { return NVA_ROW(l, i); }
static int nva_s_lane(int r, int n) { return NVA_S_LANE(r, n); }
static int nva_s_elem(int r, int n) { return NVA_S_ELEM(r, n); }
static int nva_o_col(int l, int e) { return NVA_O_COL(l, e); }
static int nva_o_rs(int e) { return NVA_O_RS(e); }
static int nva_leader(int l) { return NVA_LEADER(l); }
static int nva16_p_elem(int kb, int e) { return (void)kb, MMA16_P_ELEM(e); }
static int nva16_p_key(int kb, int k) { return kb * MMA16_K + MMA16_P_KEY(k); }
static int nva8_p_elem(int kb, int e) { return (void)kb, MMA8_P_ELEM(e); }
static int nva8_p_key(int kb, int k) { return kb * MMA8_K + MMA8_P_KEY(k); }
static int mfa_s_key(int l, int e) { return MFA_S_KEY(l, e); }
static int mfa_s_rs(int e) { return (void)e, MFA_S_RS(e); }
static int mfa_row(int l, int i) { return (void)i, MFA_ROW(l, i); }
static int mfa_s_lane(int r, int n) { return MFA_S_LANE(r, n); }
static int mfa_s_elem(int r, int n) { return (void)r, MFA_S_ELEM(r, n); }
static int mfa_o_col(int l, int e) { return MFA_O_COL(l, e); }
static int mfa_o_rs(int e) { return (void)e, MFA_O_RS(e); }
static int mfa_leader(int l) { return MFA_LEADER(l); }
static int mfa16_p_tile(int kb, int e) { return (void)e, MFA16_P_TILE(kb, e); }
static int mfa16_p_elem(int kb, int e) { return (void)kb, MFA16_P_ELEM(kb, e); }
static int mfa16_p_key(int kb, int k) { return MFA16_P_KEY(kb, k); }
static int mfa4_p_tile(int kb, int e) { return (void)e, MFA4_P_TILE(kb, e); }
static int mfa4_p_elem(int kb, int e) { return (void)e, MFA4_P_ELEM(kb, e); }
static int mfa4_p_key(int kb, int k) { return MFA4_P_KEY(kb, k); }
static int wma_s_key(int l, int e) { return WMA_S_KEY(l, e); }
static int wma_s_rs(int e) { return (void)e, WMA_S_RS(e); }
static int wma_row(int l, int i) { return (void)i, WMA_ROW(l, i); }
static int wma_s_lane(int r, int n) { return WMA_S_LANE(r, n); }
static int wma_s_elem(int r, int n) { return (void)r, WMA_S_ELEM(r, n); }
static int wma_o_col(int l, int e) { return WMA_O_COL(l, e); }
static int wma_o_rs(int e) { return (void)e, WMA_O_RS(e); }
static int wma_leader(int l) { return WMA_LEADER(l); }
static int wma_p_tile(int kb, int e) { return WMA_P_TILE(kb, e); }
static int wma_p_key(int kb, int k) { return WMA_P_KEY(kb, k); }
static int xma_s_key(int l, int e) { return (void)l, XMA_S_KEY(l, e); }
static int xma_s_rs(int e) { return (void)e, XMA_S_RS(e); }
static int xma_row(int l, int i) { return (void)i, XMA_ROW(l, i); }
static int xma_s_lane(int r, int n) { return (void)n, XMA_S_LANE(r, n); }
static int xma_s_elem(int r, int n) { return (void)r, XMA_S_ELEM(r, n); }
static int xma_o_col(int l, int e) { return (void)l, XMA_O_COL(l, e); }
static int xma_o_rs(int e) { return (void)e, XMA_O_RS(e); }
static int xma_leader(int l) { return (void)l, XMA_LEADER(l); }
static int xma_p_tile(int kb, int e) { return XMA_P_TILE(kb, e); }
static int xma_p_key(int kb, int k) { return XMA_P_KEY(kb, k); }

#define NVA_ROLES NVA_RS, NVA_S_N, NVA_O_N, NVA_RED0, NVA_RED1, nva_s_key, nva_s_rs, nva_row, nva_s_lane, \
                  nva_s_elem, nva_o_col, nva_o_rs, nva_leader
#define MFA_ROLES MFA_RS, MFA_S_N, MFA_O_N, MFA_RED0, MFA_RED1, mfa_s_key, mfa_s_rs, mfa_row, mfa_s_lane, \
                  mfa_s_elem, mfa_o_col, mfa_o_rs, mfa_leader
#define WMA_ROLES WMA_RS, WMA_S_N, WMA_O_N, WMA_RED0, WMA_RED1, wma_s_key, wma_s_rs, wma_row, wma_s_lane, \
                  wma_s_elem, wma_o_col, wma_o_rs, wma_leader
#define XMA_ROLES XMA_RS, XMA_S_N, XMA_O_N, XMA_RED0, XMA_RED1, xma_s_key, xma_s_rs, xma_row, xma_s_lane, \
                  xma_s_elem, xma_o_col, xma_o_rs, xma_leader
static attn_row attn_rows[] = {
    {"nv_k16", &products[NV16], 0, 0, NVA_ROLES, p16_tile, nva16_p_elem, nva16_p_key},
    {"nv_k8", &products[NV8], 0, 0, NVA_ROLES, p8_tile, nva8_p_elem, nva8_p_key},
    {"amd_k16", &products[MF16], 1, 0, MFA_ROLES, mfa16_p_tile, mfa16_p_elem, mfa16_p_key},
    {"amd_k4", &products[MF4], 1, 0, MFA_ROLES, mfa4_p_tile, mfa4_p_elem, mfa4_p_key},
    {"amd_wmma", &products[WM], 1, 1, WMA_ROLES, wma_p_tile, NULL, wma_p_key},
    {"intel_xmx", &products[XM], 1, 1, XMA_ROLES, xma_p_tile, NULL, xma_p_key},
    {"intel_xmx8", &products[XM8], 1, 1, XMA_ROLES, xma_p_tile, NULL, xma_p_key},
};

/* The row (0..15) of a lane's slot i, failing when either is out of range. */
static int attn_row_of(const attn_row *a, int l, int i)
{
    if (i < 0 || i >= a->rs)
        fail_msg("lane %d: row slot %d outside 0..%d", l, i, a->rs - 1);
    const int r = a->row(l, i);
    if (r < 0 || r >= 16)
        fail_msg("ROW(%d, %d) = %d outside 0..15", l, i, r);
    return r;
}

/* 16 queries, BN = 32 keys, D = 32: S's tiles through the warp model in the family's
 * orientation (WMMA: a product makes two logical tiles), checked against Q·Kᵀ through the S
 * roles; S_LANE / S_ELEM, RED0 / RED1 and LEADER; those scores as P packed through P_TILE /
 * P_ELEM (WMMA: by key, from the lane or its RED0 partner), V's operand read at P_KEY, O
 * through the warp model against the plain P·V through the O roles. */
static void test_attention(void **state)
{
    const attn_row *a = *state;
    const mma_shape *s = a->mm;
    enum { ROWS = 16, BN = 32, D = 32 };
    /* pt logical tiles a product, se elements of a lane's in each; a product spans pw keys of S
     * and ow columns of O. */
    const int pt = a->half ? 2 : 1, se = s->ce / pt, pw = pt * a->s_n, ow = pt * a->o_n;
    const int nt = BN / a->s_n, nk = BN / s->k, lanes = s->lanes;
    assert_true(a->s_n >= 4 && BN % pw == 0 && BN % s->k == 0 && D % s->k == 0 && ow <= 16 && se <= 4);
    assert_int_equal(se * pt, s->ce);
    /* S: NVIDIA's C is queries x keys, AMD's keys x queries; O: NVIDIA's rows x columns, AMD's
     * columns x rows. */
    assert_int_equal(a->amd ? s->n : s->m, ROWS);
    assert_int_equal(a->amd ? s->m : s->n, pw);
    assert_int_equal(a->amd ? s->m : s->n, ow);
    unsigned seed = 23;
    double Q[ROWS * D], Km[BN * D], V[BN][16], S[ROWS][BN];
    for (int i = 0; i < ROWS * D; i++)
        Q[i] = rnd(&seed);
    for (int i = 0; i < BN * D; i++)
        Km[i] = rnd(&seed);
    for (int j = 0; j < BN; j++)
        for (int c = 0; c < ow; c++)
            V[j][c] = rnd(&seed);
    for (int r = 0; r < ROWS; r++)
        for (int j = 0; j < BN; j++) {
            S[r][j] = 0.0;
            for (int d = 0; d < D; d++)
                S[r][j] += Q[r * D + d] * Km[j * D + d];
        }

    /* S's products: A's rows and B's columns (B stored n-major) index Q and the product's keys,
     * or the other way round; product pp's C element se·h + e is element e of logical tile
     * pt·pp + h. */
    double sfrag[BN / 4][MFMA_LANES][4];
    frags f;
    for (int pp = 0; pp < BN / pw; pp++) {
        const double *x = a->amd ? Km + pp * pw * D : Q, *y = a->amd ? Q : Km + pp * pw * D;
        memset(&f, 0, sizeof f);
        for (int ks = 0; ks < D; ks += s->k) {
            for (int l = 0; l < lanes; l++) {
                for (int e = 0; e < s->ae; e++)
                    f.a[l][e] = x[s->a_row(l, e) * D + ks + s->a_col(l, e)];
                for (int e = 0; e < s->be; e++)
                    f.b[l][e] = y[s->b_col(l, e) * D + ks + s->b_row(l, e)];
            }
            warp_mma(s, &f);
        }
        for (int h = 0; h < pt; h++)
            for (int l = 0; l < lanes; l++)
                for (int e = 0; e < se; e++)
                    sfrag[pt * pp + h][l][e] = f.c[l][se * h + e];
    }
    if (lanes * se != ROWS * a->s_n)
        fail_msg("%d lanes x %d scores for %d rows x %d keys", lanes, se, ROWS, a->s_n);
    for (int t = 0; t < nt; t++)
        for (int l = 0; l < lanes; l++)
            for (int e = 0; e < se; e++) {
                const int n = a->s_key(l, e), r = attn_row_of(a, l, a->s_rs(e));
                if (n < 0 || n >= a->s_n)
                    fail_msg("S_KEY(%d, %d) = %d outside 0..%d", l, e, n, a->s_n - 1);
                const double want = S[r][t * a->s_n + n];
                if (!(fabs(sfrag[t][l][e] - want) <= 1e-12))
                    fail_msg("S tile %d: lane %d element %d holds %.17g, the roles say row %d key %d: %.17g", t, l,
                             e, sfrag[t][l][e], r, n, want);
            }
    /* S_LANE / S_ELEM: where row r's score of key n is (with the count above, every (lane,
     * element) holds one), in every tile. */
    for (int r = 0; r < ROWS; r++)
        for (int n = 0; n < a->s_n; n++) {
            const int l = a->s_lane(r, n), e = a->s_elem(r, n);
            if (l < 0 || l >= lanes || e < 0 || e >= se)
                fail_msg("S_LANE, S_ELEM(%d, %d) = lane %d element %d: no such", r, n, l, e);
            const int hr = attn_row_of(a, l, a->s_rs(e)), hn = a->s_key(l, e);
            if (hr != r || hn != n)
                fail_msg("S_LANE, S_ELEM(%d, %d) = lane %d element %d, which holds row %d key %d", r, n, l, e, hr,
                         hn);
            for (int t = 0; t < nt; t++)
                if (!(fabs(sfrag[t][l][e] - S[r][t * a->s_n + n]) <= 1e-12))
                    fail_msg("S_LANE, S_ELEM(%d, %d) = lane %d element %d: tile %d %.17g, want %.17g", r, n, l, e,
                             t, sfrag[t][l][e], S[r][t * a->s_n + n]);
        }
    /* The exact path fetches a key's scores of all a lane's rows from one lane: S_LANE(ROW(l, i),
     * n) is the same for every slot i. */
    for (int l = 0; l < lanes; l++)
        for (int n = 0; n < a->s_n; n++)
            for (int i = 1; i < a->rs; i++)
                if (a->s_lane(a->row(l, i), n) != a->s_lane(a->row(l, 0), n))
                    fail_msg("lane %d key %d: slot %d's scores in lane %d, slot 0's in lane %d", l, n, i,
                             a->s_lane(a->row(l, i), n), a->s_lane(a->row(l, 0), n));
    /* The lanes of a row: a lane and its partners xor RED0, RED1 and both (RED1 0: xor RED0
     * alone; RED0 0 too: the lane alone, Intel's), in the same slot, and no other; one of them
     * the LEADER. */
    const int red0 = a->red0, red1 = a->red1, np = red0 == 0 ? 0 : red1 ? 3 : 1;
    if ((red0 == 0 && red1 != 0) || red0 < 0 || red0 >= lanes ||
        (red1 != 0 && (red1 < 0 || red1 == red0 || red1 >= lanes)))
        fail_msg("RED0 %d, RED1 %d: neither two distinct lane bits, nor one and 0, nor none", red0, red1);
    int holders[ROWS] = {0}, leaders[ROWS] = {0};
    for (int l = 0; l < lanes; l++)
        for (int i = 0; i < a->rs; i++) {
            const int r = attn_row_of(a, l, i), part[3] = {l ^ red0, l ^ red1, l ^ red0 ^ red1};
            holders[r]++;
            leaders[r] += a->leader(l) != 0;
            for (int p = 0; p < np; p++) {
                if (part[p] >= lanes)
                    fail_msg("lane %d: xor partner %d outside the %d lanes", l, part[p], lanes);
                const int pr = attn_row_of(a, part[p], i);
                if (pr != r)
                    fail_msg("lane %d slot %d holds row %d, its xor partner lane %d row %d", l, i, r, part[p], pr);
            }
        }
    for (int r = 0; r < ROWS; r++) {
        if (holders[r] != np + 1)
            fail_msg("row %d held in %d (lane, slot)s, not the %d of RED0 / RED1", r, holders[r], np + 1);
        if (leaders[r] != 1)
            fail_msg("row %d has %d LEADER lanes", r, leaders[r]);
    }

    /* P: the k-blocks' keys cover the BN-key tile once. */
    int seen[BN] = {0};
    for (int kb = 0; kb < nk; kb++)
        for (int k = 0; k < s->k; k++) {
            const int key = a->p_key(kb, k);
            if (key < 0 || key >= BN)
                fail_msg("P_KEY(%d, %d) = %d outside 0..%d", kb, k, key, BN - 1);
            if (seen[key]++)
                fail_msg("P_KEY(%d, %d) = %d: that key again", kb, k, key);
        }
    /* O += P·V (NVIDIA: A = P, B = V) or Oᵀ += Vᵀ·Pᵀ (AMD: A = Vᵀ, B = Pᵀ), P the scores. Without
     * P_ELEM (WMMA) element e, k index k, of every lane is the score of key K·kb + k of its row,
     * in tile P_TILE(kb, e): S_KEY puts it in exactly one of the lane and its RED0 partner (the
     * keys each holds disjoint, together the tile's). */
    assert_true(a->p_elem || a->rs == 1);
    memset(&f, 0, sizeof f);
    for (int kb = 0; kb < nk; kb++) {
        for (int l = 0; l < lanes; l++) {
            const int pe = a->amd ? s->be : s->ae;
            double *pf = a->amd ? f.b[l] : f.a[l];
            for (int e = 0; e < pe; e++) {
                const int t = a->p_tile(kb, e);
                if (t < 0 || t >= nt)
                    fail_msg("P_TILE(%d, %d) = tile %d: no such", kb, e, t);
                if (a->p_elem) {
                    const int te = a->p_elem(kb, e);
                    if (te < 0 || te >= se)
                        fail_msg("P_TILE, P_ELEM(%d, %d) = tile %d element %d: no such", kb, e, t, te);
                    pf[e] = sfrag[t][l][te];
                    continue;
                }
                const int key = kb * s->k + (a->amd ? s->b_row(l, e) : s->a_col(l, e)), n = key - t * a->s_n;
                if (n < 0 || n >= a->s_n)
                    fail_msg("P_TILE(%d, %d) = tile %d, which lacks key %d", kb, e, t, key);
                int found = 0, hl = 0, he = 0;
                for (int p = 0; p < (red0 ? 2 : 1); p++)
                    for (int x = 0; x < se; x++)
                        if (a->s_key(p ? l ^ red0 : l, x) == n) {
                            found++;
                            hl = p ? l ^ red0 : l;
                            he = x;
                        }
                if (found != 1)
                    fail_msg("P k-block %d: lanes %d and %d hold key %d %d times (S_KEY), not once", kb, l, l ^ red0,
                             key, found);
                pf[e] = sfrag[t][hl][he];
            }
            if (a->amd)
                for (int e = 0; e < s->ae; e++) /* (row c, k) = V[P_KEY(kb, k)][c] */
                    f.a[l][e] = V[a->p_key(kb, s->a_col(l, e))][s->a_row(l, e)];
            else
                for (int e = 0; e < s->be; e++) /* (k, n) = V[P_KEY(kb, k)][n] */
                    f.b[l][e] = V[a->p_key(kb, s->b_row(l, e))][s->b_col(l, e)];
        }
        warp_mma(s, &f);
    }
    /* O's logical tile j (columns o_n·j ..): element e of a lane's is the product's C element
     * se·j + e. */
    int oseen[ROWS][16];
    memset(oseen, 0, sizeof oseen);
    for (int l = 0; l < lanes; l++)
        for (int j = 0; j < pt; j++)
            for (int e = 0; e < se; e++) {
                const int c = a->o_col(l, e), r = attn_row_of(a, l, a->o_rs(e)), oc = j * a->o_n + c;
                if (c < 0 || c >= a->o_n)
                    fail_msg("O_COL(%d, %d) = %d outside 0..%d", l, e, c, a->o_n - 1);
                if (oseen[r][oc]++)
                    fail_msg("O (%d, %d) held twice (again by lane %d element %d)", r, oc, l, se * j + e);
                double want = 0.0;
                for (int k = 0; k < BN; k++)
                    want += S[r][k] * V[k][oc];
                if (!(fabs(f.c[l][se * j + e] - want) <= 1e-12))
                    fail_msg("O tile %d: lane %d element %d holds %.17g, the roles say row %d column %d: %.17g", j,
                             l, e, f.c[l][se * j + e], r, oc, want);
            }
    if (lanes * se != ROWS * a->o_n)
        fail_msg("%d lanes x %d O elements for %d rows x %d columns", lanes, se, ROWS, a->o_n);
}

/* ldmatrix.x4 as the PTX ISA describes it, written out here: lane l gives the address of row
 * l % 8 of matrix l / 8; register i of lane l holds matrix i's row l / 4, columns 2(l % 4) and
 * 2(l % 4) + 1, or with .trans its rows 2(l % 4) and 2(l % 4) + 1 of column l / 4. The tile is
 * 16 x 16 with unique values; each lane's address is given as (row, col) of it. */
static void ldmatrix_x4(const int tile[16][16], const int addr_row[MMA_LANES], const int addr_col[MMA_LANES],
                        int trans, int out[MMA_LANES][8])
{
    for (int l = 0; l < MMA_LANES; l++)
        for (int i = 0; i < 4; i++)
            for (int h = 0; h < 2; h++) {
                const int r = trans ? 2 * (l % 4) + h : l / 4, c = trans ? l / 4 : 2 * (l % 4) + h;
                const int src = 8 * i + r; /* the lane whose address is row r of matrix i */
                out[l][2 * i + h] = tile[addr_row[src]][addr_col[src] + c];
            }
}

/* The lane addresses of MMA_LDSM_K_* and MMA_LDSM_V_* give, through ldmatrix, the B fragments of
 * two 8-wide tiles in the m16n8k16 layout: K stored n-major (K[key][k]), V k-major (V[key][col])
 * with .trans. */
static void test_ldmatrix(void **state)
{
    (void)state;
    int tile[16][16], ar[MMA_LANES], ac[MMA_LANES], out[MMA_LANES][8];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            tile[r][c] = 100 * r + c;
    for (int l = 0; l < MMA_LANES; l++) {
        ar[l] = MMA_LDSM_K_ROW(l);
        ac[l] = MMA_LDSM_K_COL(l);
        assert_true(ar[l] < 16 && ac[l] + 8 <= 16);
    }
    ldmatrix_x4(tile, ar, ac, 0, out);
    for (int l = 0; l < MMA_LANES; l++)
        for (int nt = 0; nt < 2; nt++)
            for (int e = 0; e < MMA16_BE; e++) { /* S's B: (k, n) = K[8·nt + n][k] */
                const int want = tile[8 * nt + MMA16_B_COL(l, e)][MMA16_B_ROW(l, e)];
                if (out[l][4 * nt + e] != want)
                    fail_msg("K: lane %d n-tile %d element %d: %d, want %d", l, nt, e, out[l][4 * nt + e], want);
            }
    for (int l = 0; l < MMA_LANES; l++) {
        ar[l] = MMA_LDSM_V_ROW(l);
        ac[l] = MMA_LDSM_V_COL(l);
        assert_true(ar[l] < 16 && ac[l] + 8 <= 16);
    }
    ldmatrix_x4(tile, ar, ac, 1, out);
    for (int l = 0; l < MMA_LANES; l++)
        for (int j = 0; j < 2; j++)
            for (int e = 0; e < MMA16_BE; e++) { /* P·V's B: (k, n) = V[k][8·j + n] */
                const int want = tile[MMA16_B_ROW(l, e)][8 * j + MMA16_B_COL(l, e)];
                if (out[l][4 * j + e] != want)
                    fail_msg("V: lane %d column tile %d element %d: %d, want %d", l, j, e, out[l][4 * j + e], want);
            }
}

int main(void)
{
    TU_ADD_TABLE("bijection", test_bijection, shapes);
    TU_ADD_TABLE("bijection", test_mfma_bijection, mfma_shapes);
    tu_add_test("bijection", "wmma", test_wmma_bijection, &products[WM]);
    TU_ADD_TABLE("documented", test_documented, shapes);
    TU_ADD_TABLE("documented", test_mfma_documented, mfma_shapes);
    tu_add_test("documented", "wmma", test_wmma_documented, &products[WM]);
    tu_add_test("documented", "xmx", test_xmx, &products[XM]);
    tu_add_test("documented", "xmx8", test_xmx8, &products[XM8]);
    TU_ADD_TABLE("xmx_loads", test_xmx_loads, xmx_rows);
    TU_ADD_TABLE("gemm", test_gemm, products);
    TU_ADD_TABLE("p_chain", test_p_chain, shapes);
    TU_ADD_TABLE("attention", test_attention, attn_rows);
    tu_add_test("ldmatrix", NULL, test_ldmatrix, NULL);
    return tu_run_tests("mma_layout");
}
