/*
 * One small attention problem on a given context, for tests that run many of them (test_soak) or
 * run them from several threads (test_threads): inputs from a fixed seed, the float64 reference
 * computed once on exactly the stored values, device buffers, the call, and the comparison.
 *
 * Nothing here calls cmocka (its assertions longjmp and must stay on the main thread): every
 * function that can fail returns nonzero and writes a one-line reason into `why`.
 *
 * Tolerances as in test_attention.c: f32 out atol 2e-5, rtol 1e-4; f16 adds atol 2^-10 with rtol
 * 2^-11, bf16 atol 2^-7 with rtol 2^-8 (one storage rounding of |out| <= 1); lse atol 1e-5, rtol
 * 4e-6. Rows with no visible key must be exactly 0 with lse -inf.
 */
#ifndef CLATTN_TESTS_ATTNPROB_H
#define CLATTN_TESTS_ATTNPROB_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

typedef struct ap_shape {
    const char *name;
    int B, Hq, Hkv, Sq, Skv, D;
    clattn_dtype dt;
    int causal;
    int mask;   /* an f32 additive mask [B][Hq][Sq][Skv] in [-2, 2] with ~10% -inf */
    int kvlen;  /* per-batch key lengths: batch b sees Skv - b*(Skv/ (B+1)) keys (batch 0 all) */
    int lse;    /* also ask for the log-sum-exp */
    clattn_algorithm alg;
} ap_shape;

typedef struct ap_problem {
    ap_shape s;
    clattn_context *ctx;
    cl_mem q, k, v, out, lse, mask, kvlen;
    clattn_tensor tq, tk, tv, tout, tlse, tmask;
    size_t nout, nrow, esz;
    double *want_out, *want_lse;
    unsigned char *got; /* read-back space for out */
    float *got_lse;
} ap_problem;

/* Builds the inputs (seeded by `seed`), uploads them to buffers of ctx and computes the reference.
 * Returns 0, or nonzero with `why` filled (and nothing left allocated). */
int ap_init(ap_problem *p, clattn_context *ctx, const ap_shape *s, uint64_t seed, char *why, size_t why_size);
/* Fills out (and lse) with a sentinel, blocking. Returns 0 or nonzero with `why`. */
int ap_reset_outputs(ap_problem *p, char *why, size_t why_size);
/* clattn_attention on the problem. */
clattn_status ap_run(ap_problem *p, cl_uint num_wait, const cl_event *wait, cl_event *done);
/* Reads out (and lse) back after a clFinish and compares with the reference. Returns 0 or nonzero
 * with `why` naming the first bad element. */
int ap_check(ap_problem *p, char *why, size_t why_size);
/* Releases the buffers and frees the host memory; the context is the caller's. */
void ap_free(ap_problem *p);

#endif /* CLATTN_TESTS_ATTNPROB_H */
