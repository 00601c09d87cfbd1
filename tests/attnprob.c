/* One small attention problem on a given context; see attnprob.h. */
#include "attnprob.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_ref.h"
#include "testutil.h"

#define SENTINEL 777.0

static int failf(char *why, size_t why_size, const char *fmt, ...)
{
    if (why != NULL && why_size > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_size, fmt, ap);
        va_end(ap);
    }
    return 1;
}

static cl_mem upload(clattn_context *ctx, const void *host, size_t bytes, cl_int *err)
{
    cl_mem m = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE, bytes, NULL, err);
    if (m == NULL || *err != CL_SUCCESS)
        return NULL;
    *err = clEnqueueWriteBuffer(clattn_queue(ctx), m, CL_TRUE, 0, bytes, host, 0, NULL, NULL);
    if (*err != CL_SUCCESS) {
        clReleaseMemObject(m);
        return NULL;
    }
    return m;
}

int ap_init(ap_problem *p, clattn_context *ctx, const ap_shape *s, uint64_t seed, char *why, size_t why_size)
{
    memset(p, 0, sizeof *p);
    p->s = *s;
    p->ctx = ctx;
    p->esz = clattn_dtype_size(s->dt);
    const size_t nq = (size_t)s->B * s->Hq * s->Sq * s->D, nk = (size_t)s->B * s->Hkv * s->Skv * s->D;
    const size_t nm = (size_t)s->B * s->Hq * s->Sq * s->Skv;
    p->nrow = (size_t)s->B * s->Hq * s->Sq;
    p->nout = p->nrow * (size_t)s->D;
    tu_rng rng;
    tu_seed(&rng, seed);
    double *xq = malloc(nq * sizeof *xq), *xk = malloc(nk * sizeof *xk), *xv = malloc(nk * sizeof *xv);
    double *xm = s->mask ? malloc(nm * sizeof *xm) : NULL;
    void *tq = malloc(nq * p->esz), *tk = malloc(nk * p->esz), *tv = malloc(nk * p->esz);
    float *tm = s->mask ? malloc(nm * sizeof *tm) : NULL;
    p->want_out = malloc(p->nout * sizeof(double));
    p->want_lse = malloc(p->nrow * sizeof(double));
    p->got = malloc(p->nout * p->esz);
    p->got_lse = malloc(p->nrow * sizeof(float));
    int kvl[64];
    int rc = 0;
    if (!xq || !xk || !xv || (s->mask && (!xm || !tm)) || !tq || !tk || !tv || !p->want_out || !p->want_lse ||
        !p->got || !p->got_lse || s->B > 64) {
        rc = failf(why, why_size, "%s: out of host memory (or batch > 64)", s->name);
        goto done;
    }
    tu_fill(&rng, s->dt, tq, xq, nq, -4.0, 4.0);
    tu_fill(&rng, s->dt, tk, xk, nk, -1.0, 1.0);
    tu_fill(&rng, s->dt, tv, xv, nk, -1.0, 1.0);
    if (s->mask) {
        for (size_t i = 0; i < nm; ++i) {
            tm[i] = tu_uniform(&rng, 0.0, 1.0) < 0.1 ? -INFINITY : (float)tu_uniform(&rng, -2.0, 2.0);
            xm[i] = tm[i];
        }
    }
    for (int b = 0; b < s->B; ++b)
        kvl[b] = b == 0 ? s->Skv : (b == s->B - 1 && s->B > 2) ? 0 : s->Skv - b * s->Skv / (s->B + 1);

    ref_attn a;
    memset(&a, 0, sizeof a);
    a.batch = s->B;
    a.heads_q = s->Hq;
    a.heads_kv = s->Hkv;
    a.seq_q = s->Sq;
    a.seq_kv = s->Skv;
    a.head_dim = s->D;
    a.scale = (double)(float)(1.0 / sqrt((double)s->D)); /* as the device resolves scale 0 */
    a.causal = s->causal;
    a.mask = xm;
    a.mask_shape[0] = s->B;
    a.mask_shape[1] = s->Hq;
    a.mask_shape[2] = s->Sq;
    a.mask_shape[3] = s->Skv;
    a.kv_len = s->kvlen ? kvl : NULL;
    ref_attention(&a, xq, xk, xv, p->want_out, p->want_lse, NULL);

    cl_int err = CL_SUCCESS;
    if (!(p->q = upload(ctx, tq, nq * p->esz, &err)) || !(p->k = upload(ctx, tk, nk * p->esz, &err)) ||
        !(p->v = upload(ctx, tv, nk * p->esz, &err)) ||
        !(p->out = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE, p->nout * p->esz, NULL, &err)) ||
        (s->lse && !(p->lse = clCreateBuffer(clattn_cl_context(ctx), CL_MEM_READ_WRITE, p->nrow * 4, NULL, &err))) ||
        (s->mask && !(p->mask = upload(ctx, tm, nm * sizeof(float), &err))) ||
        (s->kvlen && !(p->kvlen = upload(ctx, kvl, (size_t)s->B * sizeof(int), &err)))) {
        rc = failf(why, why_size, "%s: creating or writing a buffer failed with OpenCL error %d", s->name, (int)err);
        goto done;
    }
    p->tq = clattn_tensor_bhsd(p->q, s->dt, s->B, s->Hq, s->Sq, s->D);
    p->tk = clattn_tensor_bhsd(p->k, s->dt, s->B, s->Hkv, s->Skv, s->D);
    p->tv = clattn_tensor_bhsd(p->v, s->dt, s->B, s->Hkv, s->Skv, s->D);
    p->tout = clattn_tensor_bhsd(p->out, s->dt, s->B, s->Hq, s->Sq, s->D);
    p->tlse = clattn_tensor_bhsd(p->lse, CLATTN_F32, s->B, s->Hq, s->Sq, 1);
    p->tmask = clattn_tensor_bhsd(p->mask, CLATTN_F32, s->B, s->Hq, s->Sq, s->Skv);
    rc = ap_reset_outputs(p, why, why_size);
done:
    free(xq);
    free(xk);
    free(xv);
    free(xm);
    free(tq);
    free(tk);
    free(tv);
    free(tm);
    if (rc != 0)
        ap_free(p);
    return rc;
}

int ap_reset_outputs(ap_problem *p, char *why, size_t why_size)
{
    for (size_t i = 0; i < p->nout; ++i)
        tu_store(p->s.dt, p->got, i, SENTINEL);
    for (size_t i = 0; i < p->nrow; ++i)
        p->got_lse[i] = (float)SENTINEL;
    cl_int err = clEnqueueWriteBuffer(clattn_queue(p->ctx), p->out, CL_TRUE, 0, p->nout * p->esz, p->got, 0,
                                      NULL, NULL);
    if (err == CL_SUCCESS && p->lse != NULL)
        err = clEnqueueWriteBuffer(clattn_queue(p->ctx), p->lse, CL_TRUE, 0, p->nrow * 4, p->got_lse, 0, NULL,
                                   NULL);
    return err == CL_SUCCESS ? 0 : failf(why, why_size, "%s: writing the sentinel failed (%d)", p->s.name, (int)err);
}

clattn_status ap_run(ap_problem *p, cl_uint num_wait, const cl_event *wait, cl_event *done)
{
    clattn_attention_desc d;
    memset(&d, 0, sizeof d);
    d.batch = p->s.B;
    d.heads_q = p->s.Hq;
    d.heads_kv = p->s.Hkv;
    d.seq_q = p->s.Sq;
    d.seq_kv = p->s.Skv;
    d.head_dim = p->s.D;
    d.causal = p->s.causal;
    d.mask = p->mask != NULL ? &p->tmask : NULL;
    d.kv_lengths = p->kvlen;
    d.lse = p->lse != NULL ? &p->tlse : NULL;
    d.algorithm = p->s.alg;
    return clattn_attention(p->ctx, &d, &p->tq, &p->tk, &p->tv, &p->tout, num_wait, wait, done);
}

int ap_check(ap_problem *p, char *why, size_t why_size)
{
    cl_int err = clFinish(clattn_queue(p->ctx));
    if (err == CL_SUCCESS)
        err = clEnqueueReadBuffer(clattn_queue(p->ctx), p->out, CL_TRUE, 0, p->nout * p->esz, p->got, 0, NULL,
                                  NULL);
    if (err == CL_SUCCESS && p->lse != NULL)
        err = clEnqueueReadBuffer(clattn_queue(p->ctx), p->lse, CL_TRUE, 0, p->nrow * 4, p->got_lse, 0, NULL,
                                  NULL);
    if (err != CL_SUCCESS)
        return failf(why, why_size, "%s: reading the results failed (%d)", p->s.name, (int)err);
    double atol = 2e-5, rtol = 1e-4;
    if (p->s.dt == CLATTN_F16) {
        atol += 0x1p-10;
        rtol = 0x1p-11;
    } else if (p->s.dt == CLATTN_BF16) {
        atol += 0x1p-7;
        rtol = 0x1p-8;
    }
    for (size_t i = 0; i < p->nout; ++i) {
        const double got = tu_load(p->s.dt, p->got, i), want = p->want_out[i];
        const int empty_row = p->want_lse[i / (size_t)p->s.D] == -INFINITY;
        if (empty_row ? got != 0.0 : !tu_close(got, want, atol, rtol))
            return failf(why, why_size, "%s: out[%zu] is %.9g, want %.9g%s", p->s.name, i, got, want,
                         empty_row ? " exactly (row without a visible key)" : "");
    }
    for (size_t i = 0; p->lse != NULL && i < p->nrow; ++i)
        if (!tu_close(p->got_lse[i], p->want_lse[i], 1e-5, 4e-6))
            return failf(why, why_size, "%s: lse[%zu] is %.9g, want %.9g", p->s.name, i, (double)p->got_lse[i],
                         p->want_lse[i]);
    return 0;
}

void ap_free(ap_problem *p)
{
    cl_mem *mems[7] = {&p->q, &p->k, &p->v, &p->out, &p->lse, &p->mask, &p->kvlen};
    for (int i = 0; i < 7; ++i)
        if (*mems[i] != NULL) {
            clReleaseMemObject(*mems[i]);
            *mems[i] = NULL;
        }
    free(p->want_out);
    free(p->want_lse);
    free(p->got);
    free(p->got_lse);
    p->want_out = p->want_lse = NULL;
    p->got = NULL;
    p->got_lse = NULL;
}
