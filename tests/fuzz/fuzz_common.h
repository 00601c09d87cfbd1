/*
 * Shared pieces of the libFuzzer harnesses for the public entry points (fuzz_attention.c,
 * fuzz_backward.c, fuzz_scores.c, fuzz_softmax.c, fuzz_merge.c): arguments built from the fuzz bytes, an oracle for
 * what the contract accepts, and the float64 reference for what it computes.
 *
 * Every input becomes one call. Numbers come through selectors that favour small valid values but
 * reach the edges (0, -1, 2^31 - 1, 2^31, 2^32, INT64_MAX, INT64_MIN, raw bytes). Each tensor is a
 * view on a fresh device buffer (sized for its canonical layout plus or minus a few elements) or on
 * a buffer an earlier tensor got, with its offset, shape, strides or dtype perturbed, or a NULL
 * pointer or NULL buffer; a wait list may hold NULL, completed or failed events.
 *
 * Buffers are filled with 16-bit words whose every reading (f16, bf16, and f32 from two of them) is
 * a finite number of magnitude below 2, so whatever dtype a view picks, the inputs are ordinary and
 * any inf or NaN in a result is the library's. kv_lengths get small integers.
 *
 * After the call, whatever the status:
 *   - a failure must be INVALID_ARGUMENT or UNSUPPORTED (OPENCL_ERROR only for a failed event in the
 *     wait list) with a message, `*done` NULL, and every buffer unchanged after clFinish;
 *   - a success must have been a valid call by the oracle (sizes, dtypes, bounds, no output
 *     overlapping itself or another tensor), its outputs must match the float64 reference
 *     (ref/clattn_ref.c) and no byte outside the outputs may change.
 * A call whose work (B·H·Sq·Skv·D) would be too big to run in a fuzzing loop gets a failed event as
 * its wait list instead: the library validates everything and then refuses the wait list, nothing
 * runs, and the oracle still checks that what was accepted was valid.
 * A violation prints what happened and abort()s, which libFuzzer records as a crash with its input.
 */
#ifndef CLATTN_FUZZ_COMMON_H
#define CLATTN_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

/* ---- reading the fuzz bytes ---- */

typedef struct fz_reader {
    const uint8_t *p;
    size_t n;
} fz_reader;

uint8_t fz_u8(fz_reader *r);       /* 0 once the bytes run out */
uint64_t fz_u64(fz_reader *r);
/* A count (batch, heads, seq, dim): mostly 1..8, sometimes 0, negative or huge. */
int64_t fz_count(fz_reader *r);
/* An offset or stride perturbation: small, edge values, or raw. */
int64_t fz_int(fz_reader *r);
/* A dtype: mostly `usual`, sometimes another valid one or an invalid value. */
clattn_dtype fz_dtype(fz_reader *r, clattn_dtype usual);
/* A scale: 0, moderate values, tiny, large (finite, logits stay below FLT_MAX/2), inf, NaN. */
float fz_scale(fz_reader *r);

/* ---- state of one call ---- */

#define FZ_MAX_BUFS 16
#define FZ_MAX_EVENTS 4
#define FZ_MAX_BYTES ((size_t)1 << 20) /* per buffer */
#define FZ_WORK_CAP ((uint64_t)1 << 18) /* B·H·Sq·Skv·(D + Dv) a call may run */

typedef struct fz_buf {
    cl_mem mem;
    size_t bytes;
    unsigned char *img; /* what it held before the call */
} fz_buf;

typedef struct fz_tensor {
    int present;   /* 0: the call gets a NULL pointer */
    clattn_tensor t;
    int buf;       /* index into fz_state.buf, -1 for a NULL buffer */
} fz_tensor;

typedef struct fz_state {
    clattn_context *ctx;
    fz_reader in;
    fz_buf buf[FZ_MAX_BUFS];
    int nbuf;
    cl_event events[FZ_MAX_EVENTS]; /* user events to release */
    int nevents;
    cl_event wait[FZ_MAX_EVENTS];
    cl_uint num_wait;
    const cl_event *waitp;
    int wait_failed;  /* the list (as the call sees it, num_wait > 0) holds a failed event */
    int validate_only; /* the wait list was replaced by a failed event: nothing may run */
} fz_state;

/* The process's context (created on first use; aborts without a device). */
clattn_context *fz_context(void);

void fz_begin(fz_state *s, const uint8_t *data, size_t size);
/* Releases buffers and events; the context stays. */
void fz_end(fz_state *s);

/* A new buffer of `bytes` (capped at FZ_MAX_BYTES, at least 1) with ordinary float content, or
 * small int32 values when `ints`; returns its index, or -1 when FZ_MAX_BUFS are taken. */
int fz_new_buffer(fz_state *s, size_t bytes, int ints);
/* A tensor for a parameter whose canonical shape is want (clipped to 1..64 per dim for the canonical
 * layout), usually of dtype `usual`. */
void fz_read_tensor(fz_state *s, fz_tensor *ft, const int64_t want[4], clattn_dtype usual);
/* kv_lengths: NULL, a new int32 buffer of fuzz size, or an existing buffer. */
cl_mem fz_read_kvlen(fz_state *s, int64_t batch);
/* The wait list (fills s->wait, num_wait, waitp, wait_failed). */
void fz_read_wait(fz_state *s);
/* Replaces the wait list by one failed event (see the file comment). */
void fz_validate_only(fz_state *s);

static inline const clattn_tensor *fz_ptr(const fz_tensor *ft)
{
    return ft->present ? &ft->t : NULL;
}

/* ---- the oracle ---- */

/* Aborts with a message (the harness's way to report a violation). */
void fz_die(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2), noreturn))
#endif
    ;

/* Whether t is a view the contract accepts: present, buffer of this context, dtype in `dtypes`
 * (bit mask), shape == want (or 1 in dims 0..2 when `broadcast`), offset and strides >= 0, every
 * element inside the buffer. */
int fz_view_valid(const fz_state *s, const fz_tensor *ft, const int64_t want[4], int broadcast, unsigned dtypes);

/* Byte marks for overlap checks: fz_mark adds the bytes of a view to per-buffer counters and
 * returns 0 when the view is too big to mark (then overlap is not judged). */
typedef struct fz_marks {
    unsigned char *m[FZ_MAX_BUFS];
} fz_marks;
void fz_marks_init(fz_marks *mk, const fz_state *s);
void fz_marks_free(fz_marks *mk);
int fz_mark(fz_marks *mk, const fz_state *s, const fz_tensor *ft);
/* 1 when some byte of ft is marked more than once (after marking everything). */
int fz_marked_twice(const fz_marks *mk, const fz_state *s, const fz_tensor *ft);

/* Marks bytes [from, to) of the buffer that is `mem` (kv_lengths: an input that is not a view). */
void fz_mark_range(fz_marks *mk, const fz_state *s, cl_mem mem, size_t from, size_t to);
/* Index of `mem` in s->buf, or -1. */
int fz_buf_index(const fz_state *s, cl_mem mem);
/* The ordinary float content fz_new_buffer gives (see the file comment), for host arrays. */
void fz_fill_moderate(unsigned char *p, size_t bytes, uint32_t seed);

/* Reads every buffer back after clFinish. imgs[i] is malloc'ed; free with fz_free_images. */
void fz_read_all(const fz_state *s, unsigned char **imgs);
void fz_free_images(const fz_state *s, unsigned char **imgs);
/* Fails unless every buffer byte not marked as output in `outs` equals what it held before. */
void fz_check_untouched(const fz_state *s, unsigned char **imgs, const fz_marks *outs, const char *what);

/* Element (b, h, i, d) of a valid view in a buffer image, a dim of extent 1 broadcasting. */
double fz_get(const fz_state *s, const fz_tensor *ft, unsigned char *const *imgs, int64_t b, int64_t h, int64_t i,
              int64_t d);
/* The whole view as a contiguous double array [shape] (malloc'ed), broadcasting to `shape`. */
double *fz_gather(const fz_state *s, const fz_tensor *ft, unsigned char *const *imgs, const int64_t shape[4],
                  int use_images);
/* int32 kv lengths from a buffer image (malloc'ed, batch values). */
int *fz_kvlen_values(const fz_state *s, cl_mem kv, unsigned char *const *imgs, int64_t batch, int use_images);

/* Compares n values; aborts naming `what` and the first bad element. */
void fz_compare(const char *what, const double *got, const double *want, size_t n, double atol, double rtol);

/* The common end of a call: status rules for failures, `done`, untouched buffers (failures) or
 * untouched non-output bytes (success). `outs` marks the outputs (may be NULL on failure). Returns
 * the images read back after the call (success) for the caller's comparisons, or NULL. */
unsigned char **fz_after_call(fz_state *s, clattn_status st, cl_event done, const fz_marks *outs);

/* ---- attention descriptors (fuzz_attention.c, fuzz_backward.c, fuzz_scores.c) ---- */

void fz_read_desc(fz_state *s, clattn_attention_desc *d);
/* The scalar variants (window, chunk, softcap, q_offset and k_offset) and then dropout (dropout_p,
 * valid or not, dropout_seed, dropout_offset), from the end of the input: off when it ends. */
void fz_read_variants(fz_state *s, clattn_attention_desc *d);
/* What clattn_attention or clattn_attention_backward (check_algorithm: the algorithm and the
 * dropout fields are checked too) or clattn_scores (which ignores both) accept in a descriptor. */
int fz_desc_valid(const clattn_attention_desc *d, int check_algorithm);
/* dropout_p in [0, 1), and not > 0 with packed sequences (desc->kv->cu_seqlens_q/k): what every
 * call that draws dropout (clattn_attention, its backward, clattn_dropout_mask) checks before its
 * wait list. */
int fz_dropout_valid(const clattn_attention_desc *d);
/* 0 when a clattn_attention call with this descriptor must not have run: dropout_p > 0 on the
 * unfused path (CLATTN_ALGORITHM_UNFUSED, or desc->probabilities, which asks for it). The refusal
 * (UNSUPPORTED) comes after the wait list, so this is judged on successful calls only. */
int fz_dropout_path_ok(const clattn_attention_desc *d);
/* Like fz_compare, for values stored in `dt`, with atol + atol_each[i] (atol_each may be NULL) for
 * element i: a result that overflowed to an infinity matches a reference of its sign whose
 * magnitude, widened by the tolerance, reaches dt's overflow threshold (dropout's 1/(1 - p) can
 * carry out past f16's 65504). */
void fz_compare_stored(const char *what, const double *got, const double *want, size_t n, double atol,
                       const double *atol_each, double rtol, clattn_dtype dt);
/* batch·heads_q·seq_q·seq_kv·(head_dim + head_dim_v), saturating; counts below 1 count as 1. */
uint64_t fz_desc_work(const clattn_attention_desc *d);
/* The float64 reference's problem (ref/clattn_ref.h) of descriptor d: its sizes, scale (0: the
 * library's 1/sqrt(head_dim) in f32), causal, window, chunk, softcap, offsets and dropout, with
 * the mask [B][Hq][Sq][Skv] (or NULL) and key lengths (or NULL) given as host arrays; sinks,
 * ALiBi and mask_mod are left to the caller (off). */
struct ref_attn;
void fz_ref_attn(const clattn_attention_desc *d, const double *mask, const int *kv_len, struct ref_attn *a);
/* The largest fp32 error of one logit scale·q·k + mask (see tests/test_robust.c): q [B][Hq][Sq][D],
 * k [B][Hkv][Skv][D], mask [B][Hq][Sq][Skv] or NULL, all contiguous. */
double fz_logit_error(const clattn_attention_desc *d, double scale, const double *q, const double *k,
                      const double *mask);

#endif /* CLATTN_FUZZ_COMMON_H */
