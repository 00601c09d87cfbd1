/*
 * The matrix-unit tile layer's per-lane layouts (cl/mma_layout.cl, included here as C), without a
 * device: every (lane, element) -> (row, col) map covers its fragment exactly once; a few lanes
 * against the positions NVIDIA's PTX ISA documents for mma.m16n8k16 and mma.m16n8k8 (written
 * out here, not derived from the maps); a model of a warp that multiplies through the maps (each
 * lane gathers its fragments, the product scatters them and each lane computes its own C
 * elements) equals a plain GEMM; and the chain fused_mma.cl runs, S = Q·Kᵀ in C fragments whose
 * probabilities become P's A fragments (P_TILE, P_ELEM) with V's B fragment read through P_KEY,
 * gives P·V of a plain GEMM, for both shapes; and the lane addresses of the ldmatrix loads give,
 * through a model of ldmatrix.x4 written from the PTX ISA, the same B fragments.
 *
 * Table-driven: one row per shape ("k16": f16/bf16 m16n8k16, "k8": tf32 m16n8k8).
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../cl/mma_layout.cl"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef struct shape_row {
    const char *name;
    int k, ae, be;
    int (*a_row)(int, int), (*a_col)(int, int), (*b_row)(int, int), (*b_col)(int, int);
    int (*p_tile)(int, int), (*p_elem)(int), (*p_key)(int);
} shape_row;

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

static shape_row shapes[] = {
    {"k16", MMA16_K, MMA16_AE, MMA16_BE, a16_row, a16_col, b16_row, b16_col, p16_tile, p16_elem, p16_key},
    {"k8", MMA8_K, MMA8_AE, MMA8_BE, a8_row, a8_col, b8_row, b8_col, p8_tile, p8_elem, p8_key},
};

/* Each cell of a rows x cols fragment is held by exactly one (lane, element). */
static void check_bijection(const char *what, int rows, int cols, int ne, int (*row)(int, int),
                            int (*col)(int, int))
{
    int seen[16 * 16];
    assert_true(rows * cols <= (int)N_OF(seen));
    assert_int_equal(MMA_LANES * ne, rows * cols);
    memset(seen, 0, sizeof seen);
    for (int l = 0; l < MMA_LANES; l++)
        for (int e = 0; e < ne; e++) {
            const int r = row(l, e), c = col(l, e);
            if (r < 0 || r >= rows || c < 0 || c >= cols)
                fail_msg("%s: lane %d element %d -> (%d, %d) outside %d x %d", what, l, e, r, c, rows, cols);
            if (seen[r * cols + c]++)
                fail_msg("%s: (%d, %d) held twice (again by lane %d element %d)", what, r, c, l, e);
        }
}

static void test_bijection(void **state)
{
    const shape_row *s = *state;
    check_bijection("A", MMA_M, s->k, s->ae, s->a_row, s->a_col);
    check_bijection("B", s->k, MMA_N, s->be, s->b_row, s->b_col);
    check_bijection("C", MMA_M, MMA_N, MMA_CE, c_row, c_col);
    /* P's key order is a permutation of the k-block. */
    int seen[16] = {0};
    for (int k = 0; k < s->k; k++) {
        const int key = s->p_key(k);
        assert_true(key >= 0 && key < s->k);
        assert_int_equal(seen[key]++, 0);
    }
}

/* Positions from the PTX ISA's fragment figures, for lanes 0, 5 and 31. */
typedef struct doc_pos {
    int lane, e, row, col;
} doc_pos;

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
    const int k16 = s->k == 16;
    const doc_pos *a = k16 ? a16 : a8, *b = k16 ? b16 : b8;
    const size_t na = k16 ? N_OF(a16) : N_OF(a8), nb = k16 ? N_OF(b16) : N_OF(b8);
    for (size_t i = 0; i < na; i++) {
        assert_int_equal(s->a_row(a[i].lane, a[i].e), a[i].row);
        assert_int_equal(s->a_col(a[i].lane, a[i].e), a[i].col);
    }
    for (size_t i = 0; i < nb; i++) {
        assert_int_equal(s->b_row(b[i].lane, b[i].e), b[i].row);
        assert_int_equal(s->b_col(b[i].lane, b[i].e), b[i].col);
    }
    for (size_t i = 0; i < N_OF(cc); i++) {
        assert_int_equal(c_row(cc[i].lane, cc[i].e), cc[i].row);
        assert_int_equal(c_col(cc[i].lane, cc[i].e), cc[i].col);
    }
}

/* ---- a warp model ---- */

typedef struct frags {
    double a[MMA_LANES][8], b[MMA_LANES][4], c[MMA_LANES][4];
} frags;

/* C += A·B for a warp whose lanes hold a, b and c: the fragments scattered to matrices through
 * the maps, then each lane's C elements computed (as the emulation in cl/mma.cl does). */
static void warp_mma(const shape_row *s, frags *f)
{
    double A[16][16], B[16][8];
    for (int l = 0; l < MMA_LANES; l++) {
        for (int e = 0; e < s->ae; e++)
            A[s->a_row(l, e)][s->a_col(l, e)] = f->a[l][e];
        for (int e = 0; e < s->be; e++)
            B[s->b_row(l, e)][s->b_col(l, e)] = f->b[l][e];
    }
    for (int l = 0; l < MMA_LANES; l++)
        for (int e = 0; e < MMA_CE; e++) {
            const int r = c_row(l, e), n = c_col(l, e);
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
    const shape_row *s = *state;
    unsigned seed = 7;
    double A[16][16], B[16][8], C[16][8];
    for (int r = 0; r < MMA_M; r++)
        for (int k = 0; k < s->k; k++)
            A[r][k] = rnd(&seed);
    for (int k = 0; k < s->k; k++)
        for (int n = 0; n < MMA_N; n++)
            B[k][n] = rnd(&seed);
    for (int r = 0; r < MMA_M; r++)
        for (int n = 0; n < MMA_N; n++)
            C[r][n] = rnd(&seed);
    frags f;
    memset(&f, 0, sizeof f);
    for (int l = 0; l < MMA_LANES; l++) {
        for (int e = 0; e < s->ae; e++)
            f.a[l][e] = A[s->a_row(l, e)][s->a_col(l, e)];
        for (int e = 0; e < s->be; e++)
            f.b[l][e] = B[s->b_row(l, e)][s->b_col(l, e)];
        for (int e = 0; e < MMA_CE; e++)
            f.c[l][e] = C[c_row(l, e)][c_col(l, e)];
    }
    warp_mma(s, &f);
    for (int l = 0; l < MMA_LANES; l++)
        for (int e = 0; e < MMA_CE; e++) {
            const int r = c_row(l, e), n = c_col(l, e);
            double want = C[r][n];
            for (int k = 0; k < s->k; k++)
                want += A[r][k] * B[k][n];
            if (fabs(f.c[l][e] - want) > 1e-12)
                fail_msg("lane %d element %d (%d, %d): %.17g, want %.17g", l, e, r, n, f.c[l][e], want);
        }
}

/* fused_mma.cl's chain for 16 rows, 2·K keys and 8 output columns: S's C fragments (n-tiles of 8
 * keys) packed into P's A fragments, V's B fragments read at P_KEY, O = P·V through the warp
 * model, against the plain product. */
static void test_p_chain(void **state)
{
    const shape_row *s = *state;
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
    for (int kb = 0; kb < KEYS / s->k; kb++) {
        for (int l = 0; l < MMA_LANES; l++) {
            for (int e = 0; e < s->ae; e++)
                f.a[l][e] = sfrag[s->p_tile(kb, e)][l][s->p_elem(e)];
            /* V stored n-major (Vt[n][key]) as the kernel stages it; k stands for key P_KEY(k). */
            for (int e = 0; e < s->be; e++)
                f.b[l][e] = V[kb * s->k + s->p_key(s->b_row(l, e))][s->b_col(l, e)];
        }
        warp_mma(s, &f);
    }
    for (int l = 0; l < MMA_LANES; l++)
        for (int e = 0; e < MMA_CE; e++) {
            const int r = c_row(l, e), n = c_col(l, e);
            double want = 0.0;
            for (int j = 0; j < KEYS; j++)
                want += P[r][j] * V[j][n];
            if (fabs(f.c[l][e] - want) > 1e-12)
                fail_msg("lane %d element %d (%d, %d): %.17g, want %.17g", l, e, r, n, f.c[l][e], want);
        }
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
    TU_ADD_TABLE("documented", test_documented, shapes);
    TU_ADD_TABLE("gemm", test_gemm, shapes);
    TU_ADD_TABLE("p_chain", test_p_chain, shapes);
    tu_add_test("ldmatrix", NULL, test_ldmatrix, NULL);
    return tu_run_tests("mma_layout");
}
