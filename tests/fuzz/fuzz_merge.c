/*
 * libFuzzer harness: clattn_merge with part counts, tensor views and wait lists built from the
 * input; see fuzz_common.h for what is checked. Part arrays always hold num_parts entries when
 * num_parts is in the accepted range (the fifth and later copy the first four), as the contract
 * requires of the caller.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "clattn_ref.h"
#include "testutil.h"

#define ALL_DTYPES 7u
#define BIT(d) (1u << (unsigned)(d))
#define GARBAGE_EVENT ((cl_event)(uintptr_t)1)

static int num_parts(fz_reader *r)
{
    const uint8_t sel = fz_u8(r) % 16;
    if (sel < 10)
        return 1 + fz_u8(r) % 4;
    static const int edge[6] = {0, -1, 4096, 4097, INT_MAX, INT_MIN};
    return sel < 15 ? (sel == 14 ? 5 + fz_u8(r) % 12 : edge[sel - 10]) : edge[4 + fz_u8(r) % 2];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_state st_;
    fz_state *s = &st_;
    fz_begin(s, data, size);
    const int parts = num_parts(&s->in);
    const int64_t want[4] = {fz_count(&s->in), fz_count(&s->in), fz_count(&s->in), fz_count(&s->in)};
    fz_tensor out, lse;
    fz_read_tensor(s, &out, want, (clattn_dtype)(fz_u8(&s->in) % 3));
    /* The parts must match out's shape as the call sees it (which may have been perturbed). */
    const int64_t *ow = out.present ? out.t.shape : want;
    const int64_t wo[4] = {ow[0], ow[1], ow[2], ow[3]}, wl[4] = {ow[0], ow[1], ow[2], 1};
    memset(&lse, 0, sizeof lse);
    if (fz_u8(&s->in) % 3 != 0)
        fz_read_tensor(s, &lse, wl, CLATTN_F32);
    const int n = parts >= 1 && parts <= 4096 ? parts : 4;
    fz_tensor *po = calloc((size_t)n, sizeof *po), *pl = calloc((size_t)n, sizeof *pl);
    clattn_tensor *tpo = calloc((size_t)n, sizeof *tpo), *tpl = calloc((size_t)n, sizeof *tpl);
    if (!po || !pl || !tpo || !tpl)
        fz_die("out of host memory");
    for (int i = 0; i < n; ++i) {
        if (i < 4) {
            fz_read_tensor(s, &po[i], wo, (clattn_dtype)(fz_u8(&s->in) % 3));
            fz_read_tensor(s, &pl[i], wl, CLATTN_F32);
        } else {
            po[i] = po[i % 4];
            pl[i] = pl[i % 4];
        }
        tpo[i] = po[i].t; /* an absent part is a zero tensor: NULL buffer */
        tpl[i] = pl[i].t;
    }
    const uint8_t arrays = fz_u8(&s->in);
    fz_read_wait(s);
    unsigned __int128 work = (unsigned __int128)(parts > 0 ? parts : 1);
    for (int i = 0; i < 4; ++i)
        work *= (unsigned __int128)(ow[i] >= 1 && ow[i] <= 0x7fffffff ? ow[i] : 1);
    if (work > FZ_WORK_CAP)
        fz_validate_only(s);

    cl_event done = GARBAGE_EVENT;
    const clattn_status st = clattn_merge(s->ctx, parts, arrays == 1 ? NULL : tpo, arrays == 2 ? NULL : tpl,
                                          fz_ptr(&out), fz_ptr(&lse), s->num_wait, s->waitp, &done);
    const char *msg = clattn_last_error(s->ctx);
    const int accepted = st == CLATTN_SUCCESS || (st == CLATTN_OPENCL_ERROR && strstr(msg, "has failed") != NULL);
    fz_marks all, outs;
    fz_marks_init(&all, s);
    fz_marks_init(&outs, s);
    if (accepted) {
        if (parts < 1 || parts > 4096 || arrays == 1 || arrays == 2 || !out.present)
            fz_die("accepted %d parts, part arrays %d, out %d", parts, arrays, out.present);
        for (int i = 0; i < 4; ++i)
            if (ow[i] < 1 || ow[i] > 0x7fffffff)
                fz_die("accepted out->shape[%d] = %lld", i, (long long)ow[i]);
        if (ow[3] > CLATTN_MAX_HEAD_DIM_V || (uint64_t)ow[0] * (uint64_t)ow[1] * (uint64_t)ow[2] > 0x7fffffffULL)
            fz_die("accepted an out shape beyond the limits");
        if (!fz_view_valid(s, &out, wo, 0, ALL_DTYPES) || (lse.present && !fz_view_valid(s, &lse, wl, 0, BIT(CLATTN_F32))))
            fz_die("accepted an invalid out or lse view");
        for (int i = 0; i < parts; ++i)
            if (!fz_view_valid(s, &po[i], wo, 0, ALL_DTYPES) || !fz_view_valid(s, &pl[i], wl, 0, BIT(CLATTN_F32)))
                fz_die("accepted an invalid view for part %d", i);
        int marked = fz_mark(&all, s, &out) && (!lse.present || fz_mark(&all, s, &lse));
        /* Parts may share bytes with each other; four distinct ones are enough to mark. */
        for (int i = 0; i < parts && i < 4 && marked; ++i)
            marked = fz_mark(&all, s, &po[i]) && fz_mark(&all, s, &pl[i]);
        if (marked && (fz_marked_twice(&all, s, &out) || (lse.present && fz_marked_twice(&all, s, &lse))))
            fz_die("accepted an out or lse that overlaps itself, the other or a part");
        marked = fz_mark(&outs, s, &out) && (!lse.present || fz_mark(&outs, s, &lse));
        if (!marked && st == CLATTN_SUCCESS)
            fz_die("a call within the work cap has an output too big to mark");
    }
    unsigned char **imgs = fz_after_call(s, st, done, st == CLATTN_SUCCESS ? &outs : NULL);
    if (imgs != NULL) {
        const size_t rows = (size_t)(ow[0] * ow[1] * ow[2]), dv = (size_t)ow[3];
        double **xo = calloc((size_t)parts, sizeof *xo), **xl = calloc((size_t)parts, sizeof *xl);
        double *want_o = malloc(rows * dv * sizeof(double)), *want_l = malloc(rows * sizeof(double));
        if (!xo || !xl || !want_o || !want_l)
            fz_die("out of host memory");
        for (int i = 0; i < parts; ++i) {
            xo[i] = fz_gather(s, &po[i], NULL, wo, 0);
            xl[i] = fz_gather(s, &pl[i], NULL, wl, 0);
        }
        ref_merge(parts, (int)rows, (int)dv, (const double *const *)xo, (const double *const *)xl, want_o, want_l);
        double *got = fz_gather(s, &out, imgs, wo, 1);
        const double st_rtol = out.t.dtype == CLATTN_F16 ? 0x1p-11 : out.t.dtype == CLATTN_BF16 ? 0x1p-8 : 0.0;
        fz_compare("merged out", got, want_o, rows * dv, 2e-6 + parts * 0x1p-21, 1e-6 + st_rtol);
        free(got);
        if (lse.present) {
            got = fz_gather(s, &lse, imgs, wl, 1);
            fz_compare("merged lse", got, want_l, rows, 2e-6 + parts * 0x1p-21, 1e-6);
            free(got);
        }
        for (int i = 0; i < parts; ++i) {
            free(xo[i]);
            free(xl[i]);
        }
        free(xo);
        free(xl);
        free(want_o);
        free(want_l);
        fz_free_images(s, imgs);
    }
    fz_marks_free(&all);
    fz_marks_free(&outs);
    free(po);
    free(pl);
    free(tpo);
    free(tpl);
    fz_end(s);
    return 0;
}
