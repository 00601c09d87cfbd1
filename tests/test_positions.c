/*
 * Attention over slices of a longer sequence (issue 75): the descriptor's q_offset and k_offset
 * move every row's diagonal position p = i + L - seq_q + q_offset - k_offset, so that causal, a
 * sliding window, a chunk and ALiBi apply in global positions; and an f32 output for f16 and bf16
 * inputs, so that the parts of a split attention are merged before anything is rounded to 16 bits.
 *
 * The main check cuts one self-attention of N tokens into blocks of queries and keys, as ring
 * (sequence-parallel) attention does: each (query block, key block) pair is one clattn_attention
 * call with the blocks' first positions as offsets, writing an f32 part and its LSE; the parts of
 * a query block are merged with clattn_merge, and the merged rows must equal the float64
 * reference of the whole attention. Pairs that no row of the query block sees (above the
 * diagonal, outside the window) take the library's no-kernel path: rows exactly 0 and an LSE of
 * -inf (or the sink). Cases vary causal, windows, chunks, ALiBi, sinks (given to one part), GQA,
 * storage types and unequal block sizes (a query block against every key: chunked prefill).
 *
 * Tolerances: f32 parts and merge, as test_attention's f32 outputs (atol 3e-5, rtol 2e-4) plus the
 * 16-bit output's rounding when the merged output is f16 or bf16, and on the matrix units the
 * weights' rounding to the 16-bit input type; LSE atol 2e-5, rtol 1e-5.
 */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_ref.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
#define F32 CLATTN_F32
#define F16 CLATTN_F16
#define BF16 CLATTN_BF16

typedef struct pos_case {
    const char *name;
    clattn_dtype dt;     /* q, k, v */
    clattn_dtype out_dt; /* the merged output (the parts are f32) */
    int B, Hq, Hkv, N, D;
    int qblk, kblk; /* block sizes (queries, keys) */
    int causal;
    long long window_left; /* 0: no window */
    int chunk;
    int alibi, sinks;
    int unfused; /* the parts through the unfused path (scores, softmax, P·V) */
} pos_case;

static const pos_case cases[] = {
    {"ring_causal_f32", F32, F32, 2, 4, 2, 96, 32, 32, 32, 1, 0, 0, 0, 0, 0},
    {"ring_causal_f16_parts_f32_out_f16", F16, F16, 1, 8, 2, 80, 64, 16, 16, 1, 0, 0, 0, 0, 0},
    {"ring_causal_bf16_out_f32", BF16, F32, 1, 4, 4, 64, 48, 16, 16, 1, 0, 0, 0, 0, 0},
    {"ring_window_alibi", F32, F32, 1, 4, 2, 128, 32, 32, 32, 1, 40, 0, 1, 0, 0},
    {"ring_window_alibi_unfused", F32, F32, 1, 4, 2, 128, 32, 32, 32, 1, 40, 0, 1, 0, 1},
    {"ring_chunk_f16_unfused", F16, F32, 1, 4, 2, 96, 32, 32, 32, 1, 0, 20, 0, 1, 1},
    {"ring_chunk_sinks", F32, F32, 2, 4, 2, 96, 32, 32, 32, 1, 0, 24, 0, 1, 0},
    {"ring_not_causal_gqa", F16, F32, 1, 8, 1, 64, 64, 16, 32, 0, 0, 0, 0, 0, 0},
    {"chunked_prefill", F32, F32, 1, 4, 2, 100, 32, 25, 100, 1, 0, 0, 0, 0, 0},
    {"unequal_blocks_window", F32, F32, 1, 2, 2, 90, 48, 30, 45, 1, 17, 0, 0, 1, 0},
};

static void run_case(void **state)
{
    const pos_case *c = *state;
    clattn_context *ctx = tu_ctx_get();
    tu_rng r;
    tu_seed(&r, tu_seed_of(c->name));
    const int B = c->B, Hq = c->Hq, Hkv = c->Hkv, N = c->N, D = c->D;
    const size_t nq = (size_t)B * Hq * N * D, nk = (size_t)B * Hkv * N * D, es = clattn_dtype_size(c->dt);
    void *qh = tu_xalloc(nq * es), *kh = tu_xalloc(nk * es), *vh = tu_xalloc(nk * es);
    double *qd = tu_xdoubles(nq), *kd = tu_xdoubles(nk), *vd = tu_xdoubles(nk);
    tu_fill(&r, c->dt, qh, qd, nq, -1.0, 1.0);
    tu_fill(&r, c->dt, kh, kd, nk, -1.0, 1.0);
    tu_fill(&r, c->dt, vh, vd, nk, -1.0, 1.0);
    double slopes[16], sinks[16];
    float slopes_f[16], sinks_f[16];
    for (int h = 0; h < Hq; h++) {
        slopes_f[h] = (float)(0.05 * (h + 1));
        slopes[h] = slopes_f[h];
        sinks_f[h] = (float)tu_uniform(&r, -1.0, 2.0);
        sinks[h] = sinks_f[h];
    }
    /* the whole attention */
    const size_t no = (size_t)B * Hq * N * D, nl = (size_t)B * Hq * N;
    double *want = tu_xdoubles(no), *want_lse = tu_xdoubles(nl);
    ref_attn ra = {0};
    ra.batch = B;
    ra.heads_q = Hq;
    ra.heads_kv = Hkv;
    ra.seq_q = ra.seq_kv = N;
    ra.head_dim = D;
    ra.scale = (double)(float)(1.0 / sqrt((double)D));
    ra.causal = c->causal;
    if (c->window_left) {
        ra.window = 1;
        ra.window_left = c->window_left;
        ra.window_right = c->causal ? 0 : -1;
    }
    ra.chunk = c->chunk;
    ra.alibi = c->alibi ? slopes : NULL;
    ra.sinks = c->sinks ? sinks : NULL;
    ref_attention(&ra, qd, kd, vd, want, want_lse, NULL);

    cl_mem qb = tu_xbuffer(nq * es, qh), kb = tu_xbuffer(nk * es, kh), vb = tu_xbuffer(nk * es, vh);
    cl_mem slb = tu_xbuffer(sizeof slopes_f, slopes_f), skb = tu_xbuffer(sizeof sinks_f, sinks_f);
    clattn_tensor slope_t = clattn_tensor_bhsd(slb, F32, 1, Hq, 1, 1), sink_t = clattn_tensor_bhsd(skb, F32, 1, Hq, 1, 1);
    const int nqb = (N + c->qblk - 1) / c->qblk, nkb = (N + c->kblk - 1) / c->kblk;
    /* parts: [key block][B][Hq][qblk][D] f32 and their LSE, one query block at a time */
    const size_t part_n = (size_t)B * Hq * c->qblk * D, part_l = (size_t)B * Hq * c->qblk;
    cl_mem parts = tu_xbuffer(sizeof(float) * part_n * (size_t)nkb, NULL);
    cl_mem plse = tu_xbuffer(sizeof(float) * part_l * (size_t)nkb, NULL);
    const size_t oes = clattn_dtype_size(c->out_dt);
    cl_mem mb = tu_xbuffer(oes * part_n, NULL), mlb = tu_xbuffer(sizeof(float) * part_l, NULL);
    double *got = tu_xdoubles(no), *got_lse = tu_xdoubles(nl);
    void *mh = tu_xalloc(oes * part_n);
    float *mlh = tu_xalloc(sizeof(float) * part_l);
    int empty_parts = 0;
    for (int qi = 0; qi < nqb; qi++) {
        const int q0 = qi * c->qblk, sq = N - q0 < c->qblk ? N - q0 : c->qblk;
        clattn_tensor pout[64], plse_t[64];
        for (int kj = 0; kj < nkb; kj++) {
            const int k0 = kj * c->kblk, sk = N - k0 < c->kblk ? N - k0 : c->kblk;
            /* views of the slices inside the whole tensors: [b][h][s][d] with s from q0 / k0 */
            clattn_tensor q = {qb, c->dt, (int64_t)q0 * D, {B, Hq, sq, D}, {(int64_t)Hq * N * D, (int64_t)N * D, D}};
            clattn_tensor k = {kb, c->dt, (int64_t)k0 * D, {B, Hkv, sk, D}, {(int64_t)Hkv * N * D, (int64_t)N * D, D}};
            clattn_tensor v = k;
            v.buffer = vb;
            pout[kj] = (clattn_tensor){parts, F32, (int64_t)(part_n * (size_t)kj), {B, Hq, sq, D},
                                       {(int64_t)Hq * c->qblk * D, (int64_t)c->qblk * D, D}};
            plse_t[kj] = (clattn_tensor){plse, F32, (int64_t)(part_l * (size_t)kj), {B, Hq, sq, 1},
                                         {(int64_t)Hq * c->qblk, c->qblk, 1}};
            clattn_attention_desc d = {0};
            d.batch = B;
            d.heads_q = Hq;
            d.heads_kv = Hkv;
            d.seq_q = sq;
            d.seq_kv = sk;
            d.head_dim = D;
            d.causal = c->causal;
            d.lse = &plse_t[kj];
            /* p = i + L - seq_q + q_offset - k_offset must be the global q0 + i - (k0 + 0) for key
             * j = 0: the offsets absorb the slice's own L - seq_q */
            d.q_offset = q0 - (sk - sq);
            d.k_offset = k0;
            if (c->window_left) {
                d.window = 1;
                d.window_left = c->window_left;
                d.window_right = c->causal ? 0 : -1;
            }
            d.chunk = c->chunk;
            d.alibi_slopes = c->alibi ? &slope_t : NULL;
            d.sinks = c->sinks && kj == 0 ? &sink_t : NULL; /* the sinks go to exactly one part */
            d.algorithm = c->unfused ? CLATTN_ALGORITHM_UNFUSED : CLATTN_ALGORITHM_AUTO;
            const clattn_status s = clattn_attention(ctx, &d, &q, &k, &v, &pout[kj], 0, NULL, NULL);
            if (s != CLATTN_SUCCESS)
                fail_msg("%s q%d k%d: %s: %s", c->name, qi, kj, clattn_status_name(s), clattn_last_error(ctx));
            if (c->causal && k0 > q0 + sq - 1)
                empty_parts++;
        }
        clattn_tensor mo = {mb, c->out_dt, 0, {B, Hq, sq, D}, {(int64_t)Hq * c->qblk * D, (int64_t)c->qblk * D, D}};
        clattn_tensor ml = {mlb, F32, 0, {B, Hq, sq, 1}, {(int64_t)Hq * c->qblk, c->qblk, 1}};
        clattn_status s = clattn_merge(ctx, nkb, pout, plse_t, &mo, &ml, 0, NULL, NULL);
        if (s != CLATTN_SUCCESS)
            fail_msg("%s merge q%d: %s: %s", c->name, qi, clattn_status_name(s), clattn_last_error(ctx));
        tu_read(ctx, mb, oes * part_n, mh);
        tu_read(ctx, mlb, sizeof(float) * part_l, mlh);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < Hq; h++)
                for (int i = 0; i < sq; i++) {
                    const size_t src = ((size_t)(b * Hq + h) * c->qblk + i), dst = ((size_t)(b * Hq + h) * N + q0 + i);
                    for (int e = 0; e < D; e++)
                        got[dst * D + e] = tu_load(c->out_dt, mh, src * D + e);
                    got_lse[dst] = mlh[src];
                }
    }
    if (c->causal && !empty_parts && nkb > 1)
        fail_msg("%s: no part above the diagonal was exercised", c->name);
    tu_failures = 0;
    double o_eps = c->out_dt == F16 ? 0x1p-10 : c->out_dt == BF16 ? 0x1p-7 : 0.0;
    /* The matrix units (clattn_matrix_report not "none") round the weights to the 16-bit input
     * type before P·V (docs/numerics.md): half an ulp of it times the largest |V| (1 here). */
    if (strncmp(clattn_matrix_report(ctx), "none", 4) != 0 && c->dt != F32)
        o_eps += c->dt == F16 ? 0x1p-11 : 0x1p-8;
    tu_check_close("merged out", got, want, no, 3e-5 + o_eps, 2e-4 + o_eps);
    tu_check_close("merged lse", got_lse, want_lse, nl, 2e-5, 1e-5);
    if (tu_failures)
        fail_msg("%s: %d checks failed", c->name, tu_failures);
}

/* A self-attention descriptor of B batches, H heads (query and kv), S rows and keys, head_dim D. */
static clattn_attention_desc square_desc(int B, int H, int S, int D)
{
    clattn_attention_desc d = {0};
    d.batch = B;
    d.heads_q = d.heads_kv = H;
    d.seq_q = d.seq_kv = S;
    d.head_dim = D;
    return d;
}

/* A block above the diagonal: no key for any row, so the call writes exactly 0 and LSE -inf (the
 * head's sink with sinks), whatever q, k and v hold (NaN here), and with an f32 output of f16 q. */
static void test_hidden_block(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    enum { B = 1, H = 2, S = 8, D = 16 };
    uint16_t nanh[B * H * S * D];
    for (size_t i = 0; i < N_OF(nanh); i++)
        nanh[i] = 0x7e00; /* f16 NaN */
    float init[B * H * S * D], linit[B * H * S];
    for (size_t i = 0; i < N_OF(init); i++)
        init[i] = 7.0f;
    for (size_t i = 0; i < N_OF(linit); i++)
        linit[i] = 7.0f;
    const float sink_v[H] = {0.5f, -1.25f};
    cl_mem qb = tu_xbuffer(sizeof nanh, nanh), ob = tu_xbuffer(sizeof init, init), lb = tu_xbuffer(sizeof linit, linit);
    cl_mem sb = tu_xbuffer(sizeof sink_v, sink_v);
    clattn_tensor q = clattn_tensor_bhsd(qb, F16, B, H, S, D), out = clattn_tensor_bhsd(ob, F32, B, H, S, D);
    clattn_tensor lse = clattn_tensor_bhsd(lb, F32, B, H, S, 1), sinks = clattn_tensor_bhsd(sb, F32, 1, H, 1, 1);
    for (int with_sinks = 0; with_sinks < 2; with_sinks++) {
        clattn_attention_desc d = square_desc(B, H, S, D);
        d.causal = 1;
        d.q_offset = 0;
        d.k_offset = S; /* keys [8, 16) against queries [0, 8): all above the diagonal */
        d.lse = &lse;
        d.sinks = with_sinks ? &sinks : NULL;
        const clattn_status s = clattn_attention(ctx, &d, &q, &q, &q, &out, 0, NULL, NULL);
        if (s != CLATTN_SUCCESS)
            fail_msg("%s: %s", clattn_status_name(s), clattn_last_error(ctx));
        float o[B * H * S * D], l[B * H * S];
        tu_read(ctx, ob, sizeof o, o);
        tu_read(ctx, lb, sizeof l, l);
        for (size_t i = 0; i < N_OF(o); i++)
            if (o[i] != 0.0f)
                fail_msg("out[%zu] = %g, not 0", i, o[i]);
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const float want = with_sinks ? sink_v[h] : -INFINITY;
                if (l[h * S + i] != want)
                    fail_msg("lse[%d][%d] = %g, want %g", h, i, l[h * S + i], want);
            }
    }
}

/* Offsets far from 0 (the header: each within CLATTN_MAX_SEQ of 0, their difference bounded):
 * equal offsets of 2^30, -2^30 and CLATTN_MAX_SEQ give what offsets 0 give, bit for bit (causal,
 * a window and ALiBi see only the difference), and so does a difference of 3 at 2^30 and at 0;
 * an offset past CLATTN_MAX_SEQ is refused naming that offset, a difference past the limit
 * naming both, INT64_MAX against INT64_MIN without overflow (UBSan's CI run checks it). */
static void test_far_offsets(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    enum { B = 1, H = 2, S = 12, D = 16 };
    tu_rng rng;
    tu_seed(&rng, tu_seed_of("far_offsets"));
    float x[3][B * H * S * D];
    for (int t = 0; t < 3; t++)
        tu_fill(&rng, F32, x[t], NULL, N_OF(x[t]), -1.0, 1.0);
    const float slopes[H] = {0.25f, 0.0625f};
    cl_mem qb = tu_xbuffer(sizeof x[0], x[0]), kb = tu_xbuffer(sizeof x[1], x[1]), vb = tu_xbuffer(sizeof x[2], x[2]);
    cl_mem ob = tu_xbuffer(sizeof x[0], NULL), ab = tu_xbuffer(sizeof slopes, slopes);
    clattn_tensor q = clattn_tensor_bhsd(qb, F32, B, H, S, D), k = clattn_tensor_bhsd(kb, F32, B, H, S, D);
    clattn_tensor v = clattn_tensor_bhsd(vb, F32, B, H, S, D), out = clattn_tensor_bhsd(ob, F32, B, H, S, D);
    clattn_tensor alibi = clattn_tensor_bhsd(ab, F32, 1, H, 1, 1);
    static const long long big = 1LL << 30;
    const long long pairs[][2] = {{0, 0},          {big, big},     {CLATTN_MAX_SEQ, CLATTN_MAX_SEQ}, {-CLATTN_MAX_SEQ, -CLATTN_MAX_SEQ},
                                  {-big, -big},    {3, 0},         {big + 3, big},                   {-CLATTN_MAX_SEQ + 3, -CLATTN_MAX_SEQ},
                                  {CLATTN_MAX_SEQ, CLATTN_MAX_SEQ - 3}};
    float base[2][B * H * S * D];
    for (size_t c = 0; c < N_OF(pairs); c++) {
        clattn_attention_desc d = square_desc(B, H, S, D);
        d.causal = 1;
        d.window = 1;
        d.window_left = 4;
        d.alibi_slopes = &alibi;
        d.q_offset = pairs[c][0];
        d.k_offset = pairs[c][1];
        const clattn_status st = clattn_attention(ctx, &d, &q, &k, &v, &out, 0, NULL, NULL);
        if (st != CLATTN_SUCCESS)
            fail_msg("offsets %lld, %lld: %s: %s", pairs[c][0], pairs[c][1], clattn_status_name(st), clattn_last_error(ctx));
        float o[B * H * S * D];
        tu_read(ctx, ob, sizeof o, o);
        const int diff3 = pairs[c][0] != pairs[c][1];
        if (c == 0 || c == 5) {
            memcpy(base[diff3], o, sizeof o);
        } else if (memcmp(o, base[diff3], sizeof o) != 0) {
            fail_msg("offsets %lld, %lld differ from %s", pairs[c][0], pairs[c][1], diff3 ? "3, 0" : "0, 0");
        }
    }
    if (memcmp(base[0], base[1], sizeof base[0]) == 0)
        fail_msg("a difference of 3 changed nothing: the offsets were not applied");
    const long long far[][2] = {{INT64_MAX, INT64_MIN}, {INT64_MIN, INT64_MAX}, {INT64_MIN, 0}, {0, INT64_MIN},
                                {INT64_MAX, -1},        {CLATTN_MAX_SEQ + 1, CLATTN_MAX_SEQ + 1}, {CLATTN_MAX_SEQ, 0},
                                {-big, big}};
    const char *names[] = {"q_offset (9223372036854775807)", "q_offset (-9223372036854775808)",
                           "q_offset (-9223372036854775808)", "k_offset (-9223372036854775808)",
                           "q_offset (9223372036854775807)", "q_offset (2146435073)", "too far", "too far"};
    for (size_t c = 0; c < N_OF(far); c++) {
        clattn_attention_desc d = square_desc(B, H, S, D);
        d.q_offset = far[c][0];
        d.k_offset = far[c][1];
        if (clattn_attention(ctx, &d, &q, &k, &v, &out, 0, NULL, NULL) != CLATTN_INVALID_ARGUMENT)
            fail_msg("offsets %lld, %lld were not refused", far[c][0], far[c][1]);
        if (!strstr(clattn_last_error(ctx), names[c]))
            fail_msg("offsets %lld, %lld: \"%s\" does not say %s", far[c][0], far[c][1], clattn_last_error(ctx), names[c]);
    }
}

/* Refusals: an offset difference too large for the kernels' ints; a 16-bit output of another
 * 16-bit type (only the query's type or f32 is accepted). */
static void test_refusals(void **state)
{
    (void)state;
    clattn_context *ctx = tu_ctx_get();
    enum { B = 1, H = 1, S = 4, D = 16 };
    float x[B * H * S * D];
    for (size_t i = 0; i < N_OF(x); i++)
        x[i] = 1.0f;
    cl_mem qb = tu_xbuffer(sizeof x, x), ob = tu_xbuffer(sizeof x, x);
    clattn_tensor q = clattn_tensor_bhsd(qb, F16, B, H, S, D), out = clattn_tensor_bhsd(ob, BF16, B, H, S, D);
    clattn_attention_desc d = square_desc(B, H, S, D);
    assert_int_equal(clattn_attention(ctx, &d, &q, &q, &q, &out, 0, NULL, NULL), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "nor f32"));
    out.dtype = F16;
    d.q_offset = CLATTN_MAX_SEQ;
    d.k_offset = -1;
    assert_int_equal(clattn_attention(ctx, &d, &q, &q, &q, &out, 0, NULL, NULL), CLATTN_INVALID_ARGUMENT);
    assert_non_null(strstr(clattn_last_error(ctx), "q_offset"));
    d.q_offset = (long long)CLATTN_MAX_SEQ + 1;
    d.k_offset = 0;
    assert_int_equal(clattn_attention(ctx, &d, &q, &q, &q, &out, 0, NULL, NULL), CLATTN_INVALID_ARGUMENT);
    float back[B * H * S * D];
    tu_read(ctx, ob, sizeof back, back);
    assert_memory_equal(back, x, sizeof back);
}

int main(void)
{
    tu_set_fixtures(NULL, tu_teardown);
    const int forced = tu_getenv_int("CLATTN_TEST_POS_FORCED", 0);
    for (size_t i = 0; i < N_OF(cases); ++i)
        if (!forced || !cases[i].unfused)
            tu_add_test("slices", cases[i].name, run_case, &cases[i]);
    if (!forced) {
        tu_add_test("slices", "hidden_block", test_hidden_block, NULL);
        tu_add_test("refuse", "offsets_and_out_dtype", test_refusals, NULL);
        tu_add_test("slices", "far_offsets", test_far_offsets, NULL);
    }
    const int failed = tu_run_tests("positions");
    clattn_release(tu_ctx);
    return failed;
}
