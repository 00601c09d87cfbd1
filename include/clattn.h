/*
 * clattn — transformer attention on any OpenCL 1.2+ device.
 *
 * Computes softmax(Q·Kᵀ·scale + mask)·V with fp32 arithmetic on f32, f16 or bf16 storage.
 *
 * Threading: a clattn_context is used by one thread at a time. Separate contexts may be used
 * from separate threads at once (they may share an OpenCL device, a cache directory and a
 * tuning directory).
 *
 * Asynchrony: every operation validates its arguments, enqueues its kernels on the context's
 * in-order queue after the caller's wait list, and returns without waiting. `done`, when not
 * NULL, receives the event of the last enqueued command (the caller releases it). Invalid
 * arguments are refused before anything is enqueued. On any failure nothing the caller owns is
 * modified (an OpenCL or build failure midway leaves commands that wrote only the library's
 * workspace; docs/guarantees.md lists the two launch failures that are exceptions), `*done` is
 * set to NULL and clattn_last_error() names the argument and the value.
 *
 * Tensors are [batch][heads][seq][dim] views on a cl_mem: element offset, shape and element
 * strides for batch, head and seq; the last dimension is contiguous. Stride 0 broadcasts.
 */
#ifndef CLATTN_H
#define CLATTN_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifdef __APPLE__
#include <OpenCL/cl.h>
#else
#include <CL/cl.h>
#endif
#include <stddef.h>
#include <stdint.h>

#include "clattn_export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CLATTN_VERSION_MAJOR 0
#define CLATTN_VERSION_MINOR 4
#define CLATTN_VERSION_PATCH 0
#define CLATTN_VERSION_NUMBER \
    (CLATTN_VERSION_MAJOR * 10000 + CLATTN_VERSION_MINOR * 100 + CLATTN_VERSION_PATCH)

/** Largest head_dim accepted by every operation (DeepSeek's MLA: 576). Above 256 the caller gives
 * the scale (docs/variants.md#head-sizes). */
#define CLATTN_MAX_HEAD_DIM 576
/** Largest head_dim_v (MLA: 512). */
#define CLATTN_MAX_HEAD_DIM_V 512
/** Largest seq_q and seq_kv (softmax: rows and cols), 2^31 - 2^20: kernels count keys and rows
 * in 32-bit integers with room for a tile past the end; (heads_q / heads_kv) x seq_q, the rows
 * of a kv head's query group, too. batch, heads and the other extents go up to 2^31 - 1, and
 * batch x heads_q must stay within that. */
#define CLATTN_MAX_SEQ 0x7ff00000LL

/** @return CLATTN_VERSION_NUMBER of the library actually linked. */
CLATTN_API unsigned clattn_version_number(void);
/** @return "MAJOR.MINOR.PATCH" of the library actually linked. */
CLATTN_API const char *clattn_version_string(void);

/* Status codes and their strings come from this one list, so they cannot drift apart. */
#define CLATTN_STATUS_LIST(X)                                                         \
    X(SUCCESS, 0, "success")                                                          \
    X(INVALID_ARGUMENT, 1, "invalid argument")                                        \
    X(UNSUPPORTED, 2, "unsupported on this device or with these parameters")          \
    X(NO_DEVICE, 3, "no matching OpenCL device")                                      \
    X(BUILD_FAILED, 4, "OpenCL kernel build failed")                                  \
    X(OPENCL_ERROR, 5, "OpenCL call failed")                                          \
    X(OUT_OF_MEMORY, 6, "out of memory")                                              \
    X(IO_ERROR, 7, "file input/output failed")

typedef enum clattn_status {
#define CLATTN_STATUS_ENUM_(name, value, text) CLATTN_##name = value,
    CLATTN_STATUS_LIST(CLATTN_STATUS_ENUM_)
#undef CLATTN_STATUS_ENUM_
} clattn_status;

/** @return a static English description of `status` ("unknown status" for values outside the list). */
CLATTN_API const char *clattn_status_string(clattn_status status);
/** @return the symbolic name of `status`, e.g. "CLATTN_INVALID_ARGUMENT". */
CLATTN_API const char *clattn_status_name(clattn_status status);

typedef enum clattn_dtype {
    CLATTN_F32 = 0,  /* IEEE binary32 */
    CLATTN_F16 = 1,  /* IEEE binary16, read and written with vload_half/vstore_half (no cl_khr_fp16 needed) */
    CLATTN_BF16 = 2, /* upper 16 bits of binary32, rounded to nearest even on store */
    /* KV-cache storage types (docs/kvcache.md), for k and v of the fused attention path and the
     * caches clattn_kv_append writes; decoded in the kernels, arithmetic in f32. */
    CLATTN_I8 = 3,       /* int8 q; x = s·q with one f32 scale s per (token, kv head): clattn_kv_layout */
    CLATTN_FP8_E4M3 = 4, /* OCP fp8 E4M3 ("fn": no infinities, S.1111.111 is NaN) times a per-tensor scale */
    CLATTN_FP8_E5M2 = 5, /* OCP fp8 E5M2 (binary16's upper byte) times a per-tensor scale */
    CLATTN_Q8_0 = 6,     /* ggml's q8_0: blocks of 32 along dim, 34 bytes: f16 d, then 32 int8 q; x = d·q */
    CLATTN_Q4_0 = 7      /* ggml's q4_0: blocks of 32 along dim, 18 bytes: f16 d, then 16 bytes; byte j's
                          * low nibble is element j, its high nibble element j + 16; x = d·(nibble - 8) */
} clattn_dtype;

/** @return bytes per element of `dtype` (per block of clattn_dtype_block elements for q8_0 and
 * q4_0: 34 and 18), or 0 for an unknown value. */
CLATTN_API size_t clattn_dtype_size(clattn_dtype dtype);
/** @return elements per block of `dtype`: 32 for q8_0 and q4_0, 1 for the others, 0 for an unknown
 * value. A tensor of a block type has head_dim, offset and strides in elements, each a multiple of
 * 32: element e of a row starts at byte (e / 32)·clattn_dtype_size. */
CLATTN_API int clattn_dtype_block(clattn_dtype dtype);
/** @return "f32", "f16", "bf16", "i8", "fp8_e4m3", "fp8_e5m2", "q8_0" or "q4_0"; NULL for an
 * unknown value. */
CLATTN_API const char *clattn_dtype_name(clattn_dtype dtype);

typedef enum clattn_algorithm {
    CLATTN_ALGORITHM_AUTO = 0,    /* fused whenever valid; unfused when probabilities are asked for */
    CLATTN_ALGORITHM_FUSED = 1,   /* online softmax, O(seq) memory, never materialises scores */
    CLATTN_ALGORITHM_UNFUSED = 2  /* scores -> softmax -> P·V through a workspace of B·H·Sq·Skv floats */
} clattn_algorithm;

/**
 * A [batch][heads][seq][dim] view on an OpenCL buffer. All counts are in elements.
 * Element (b, h, s, d) lives at offset + b*stride[0] + h*stride[1] + s*stride[2] + d.
 * Input strides may be 0 (broadcast); output views must not overlap themselves: taken by
 * increasing stride, each dimension of extent above 1 must step past everything the dimensions
 * below it span (interleaved layouts are refused even where no two elements collide). `buffer`
 * is a buffer object (not an image) of the context's OpenCL context.
 */
typedef struct clattn_tensor {
    cl_mem buffer;
    clattn_dtype dtype;
    int64_t offset;    /* element index of (0, 0, 0, 0) */
    int64_t shape[4];  /* batch, heads, seq, dim */
    int64_t stride[3]; /* batch, head, seq */
} clattn_tensor;

/** @return a contiguous [b][h][s][d] view of `buffer` starting at element 0. */
CLATTN_API clattn_tensor clattn_tensor_bhsd(cl_mem buffer, clattn_dtype dtype, int64_t b, int64_t h,
                                            int64_t s, int64_t d);
/** @return a [b][h][s][d] view of a buffer laid out as [b][s][h][d] (the "BSHD" layout). */
CLATTN_API clattn_tensor clattn_tensor_bshd(cl_mem buffer, clattn_dtype dtype, int64_t b, int64_t s,
                                            int64_t h, int64_t d);

/**
 * How K and V are stored when they are not one strided view per batch (docs/kvcache.md): in pages
 * addressed by a block table, the scales of quantized storage, and sequences of different lengths
 * packed end to end (q as well). Pointed to by clattn_attention_desc.kv; zero-initialise it and
 * fill what applies.
 */
typedef struct clattn_kv_layout {
    /* Paged KV, with page_size > 0: the k and v given to clattn_attention are page pools of shape
     * [num_pages][heads_kv][page_size][dim] (num_pages: the pool's extent, any strides, so vLLM's
     * [pages][page_size][heads][dim] "NHD" and [pages][heads][page_size][dim] "HND" both work), and
     * key j of batch b is row j % page_size of page block_table[b][j / page_size]. block_table:
     * int32 at element block_table_offset + b·block_table_stride + n, n < ceil(seq_kv / page_size),
     * where desc->seq_kv bounds the keys of every batch and desc->kv_lengths gives each batch's
     * (entries past a batch's keys are not read). A page index outside [0, num_pages) is read as
     * page 0 or num_pages - 1, whichever is nearer: never outside the pool, the keys meaningless.
     * k and v are clamped each to its own num_pages, which may differ. Pages may repeat (shared
     * prefixes). 0: k and v are plain views [batch][heads_kv][seq_kv][dim]. */
    int64_t page_size;
    cl_mem block_table;
    int64_t block_table_offset;
    int64_t block_table_stride;
    /* CLATTN_I8 K or V: the f32 scales of each (token, kv head), a view of k's (v's) shape with dim
     * 1, paged like k when page_size > 0. Required for I8, refused otherwise. */
    const clattn_tensor *k_scales;
    const clattn_tensor *v_scales;
    /* CLATTN_FP8_E4M3 / E5M2 K or V: the per-tensor scale (x = scale·fp8), vLLM's k_scale and
     * v_scale; 0 means 1, otherwise positive and finite (refused else). Must be 0 for other types. */
    float k_scale;
    float v_scale;
    /* Packed variable-length batches (FlashAttention's varlen form), int32 [batch + 1] each, NULL
     * where that side is not packed. cu_seqlens_q: q, out and lse have batch extent 1 and
     * total_q rows (shape[2]); sequence b's rows are cu[b] .. cu[b + 1] - 1 and desc->seq_q is
     * the longest. cu_seqlens_k: k and v likewise ([1][heads_kv][total_k][dim]), sequence b's
     * keys are rows cu[b] .. cu[b + 1] - 1, desc->seq_kv the longest (kv_lengths, when given,
     * shortens them further); not with pages, whose keys the block table addresses. Causal is
     * bottom-right within each sequence. Lengths are clamped to [0, seq_q] (seq_kv) and to the
     * packed rows: rows outside every sequence are neither read nor written. */
    cl_mem cu_seqlens_q;
    cl_mem cu_seqlens_k;
    /* Must be zero; later options go here. */
    int64_t reserved[8];
} clattn_kv_layout;

/**
 * What to compute. Shapes: q [batch][heads_q][seq_q][head_dim], k [batch][heads_kv][seq_kv][head_dim],
 * v [batch][heads_kv][seq_kv][head_dim_v], out [batch][heads_q][seq_q][head_dim_v]. out has the
 * query's dtype or f32 (the parts of a split attention stay f32 until clattn_merge).
 */
typedef struct clattn_attention_desc {
    int64_t batch;
    int64_t heads_q;
    int64_t heads_kv;   /* divides heads_q; query head h reads kv head h / (heads_q / heads_kv) */
    int64_t seq_q;      /* 1 .. CLATTN_MAX_SEQ */
    int64_t seq_kv;     /* 1 .. CLATTN_MAX_SEQ */
    int64_t head_dim;   /* 1 .. CLATTN_MAX_HEAD_DIM (above: CLATTN_UNSUPPORTED) */
    int64_t head_dim_v; /* 1 .. CLATTN_MAX_HEAD_DIM_V (above: CLATTN_UNSUPPORTED); 0 means head_dim */
    float scale;        /* 0 means 1/sqrt(head_dim), up to head_dim 256; above, the caller gives it */
    int causal;         /* bottom-right aligned: row i sees key j iff j <= i + (L - seq_q), L = keys of the batch */
    /* Optional additive mask (f32 or f16), shape [batch|1][heads_q|1][seq_q|1][seq_kv]; a dimension
     * of extent 1 broadcasts. -inf hides a key. NULL: none. */
    const clattn_tensor *mask;
    /* Optional int32[batch]: keys visible to each batch (clamped to 0..seq_kv). NULL: seq_kv. */
    cl_mem kv_lengths;
    /* Optional output, f32, shape [batch][heads_q][seq_q][1]: natural-log log-sum-exp of each row's
     * logits over its visible keys (scale·QKᵀ + mask, with the variants' softcap, ALiBi and
     * score_mod when set), the sink's e^s included; -inf for a row with none (the sink s where
     * sinks are given). NULL: not written. */
    const clattn_tensor *lse;
    /* Optional output (unfused path only), shape [batch][heads_q][seq_q][seq_kv]: the softmax
     * probabilities; -0.0 (equal to 0) where a key is hidden (mask -inf, past kv_lengths, above
     * the causal diagonal), +0.0 where a visible key's weight underflows. NULL: not written. */
    const clattn_tensor *probabilities;
    clattn_algorithm algorithm;

    /* ---- Variants (docs/variants.md). Each is off when zero or NULL. Notation: row i of batch b
     * sits at diagonal position p = i + L - seq_q (L: the batch's visible keys), as for causal. */
    /* Sliding window, FlashAttention's convention: with window != 0, row i sees key j only if
     * p - window_left <= j <= p + window_right; a negative side is unbounded; 0 is the row's own
     * position. A model's sliding_window = W is window_left = W - 1, window_right = 0. With
     * window 0, window_left and window_right must be 0. */
    int window;
    int64_t window_left;
    int64_t window_right;
    /* Chunked local attention (Llama 4), chunk > 0: row i sees key j only if
     * floor(j / chunk) == floor(p / chunk), in global positions with the offsets below:
     * floor((j + k_offset) / chunk) == floor((p + k_offset) / chunk). Combines with causal, the
     * window and masks. 0: off; negative: refused. */
    int64_t chunk;
    /* Logit softcap c > 0: the logit is c·tanh(scale·q·k / c); then the additive mask and ALiBi
     * are added, then score_mod applies. LSE is over these logits. 0 (either sign): off. Negative,
     * subnormal or non-finite: refused. */
    float softcap;
    /* Optional f32 [1][heads_q][1][1]: attention sinks, one logit s_h per query head, in the final
     * logit domain, that joins only the softmax denominator:
     * o = Σ_j e^(x_j - M)·v_j / (Σ_j e^(x_j - M) + e^(s_h - M)). A row with no visible key gives
     * o = 0 and LSE = s_h; the LSE output includes the sink; -inf is no sink. +inf and NaN are no
     * logits: the head's rows with a visible key come out NaN (docs/variants.md). NULL: none. */
    const clattn_tensor *sinks;
    /* Optional f32 [batch|1][heads_q|1][1][1] (an extent of 1 is shared): ALiBi slopes,
     * logit += -slope·|p - j| (after the softcap). clattn_alibi_slopes gives the standard ones.
     * NULL: none. */
    const clattn_tensor *alibi_slopes;
    /* Optional OpenCL C source, compiled into the kernels the call runs (docs/variants.md#mods
     * lists the names it may use). score_mod must define
     *     float score_mod(float score, int b, int h, int q, int k)
     * applied last to each visible logit (after the softcap, the mask and ALiBi); mask_mod must
     * define
     *     int mask_mod(int b, int h, int q, int k)
     * nonzero where query q of head h of batch b may see key k. q is the query's diagonal
     * position p (above), k the key's index, h the query head. A snippet that does not compile
     * gives CLATTN_BUILD_FAILED with the log. NULL: none; an empty string or one longer than
     * 64 KiB: refused. */
    const char *score_mod;
    const char *mask_mod;
    /* Optional: paged K/V, the scales of quantized K/V and packed sequences (clattn_kv_layout).
     * NULL: k and v are plain [batch][heads_kv][seq_kv][dim] views, of the query's dtype or of a
     * KV-cache type that needs no scale table (fp8 then with scale 1, q8_0, q4_0; i8 needs
     * desc->kv for its scales). K and V of the quantized types (each its own) are taken by the
     * fused path only. (A union keeps the slot 8 bytes
     * wide where pointers are 4.) */
    union {
        const clattn_kv_layout *kv;
        int64_t kv_slot_;
    };
    /* A call over a slice of a longer sequence (sequence parallelism, chunked prefill): the
     * diagonal position of row i becomes p = i + L - seq_q + q_offset - k_offset, so that causal,
     * the window, the chunk and ALiBi see global positions (docs/usage.md#slices). Query rows
     * [q0, q0 + seq_q) against keys [k0, k0 + L) of a self-attention: q_offset = q0 - (L - seq_q),
     * k_offset = k0 (equal blocks: q0 and k0). A slice that no row sees any key of runs no
     * attention kernel: its rows are 0 with an LSE of -inf (or the sink). Each offset must lie in
     * [-CLATTN_MAX_SEQ, CLATTN_MAX_SEQ], and |q_offset - k_offset| + max(seq_q, seq_kv) must not
     * exceed CLATTN_MAX_SEQ. */
    int64_t q_offset;
    int64_t k_offset;
    /* Dropout on the attention probabilities (docs/training.md#dropout), off at 0. With
     * 0 < dropout_p < 1 each probability P[i][j] of a visible key is kept and scaled by
     * 1/(1 - dropout_p), or dropped (0); the softmax's denominator, the LSE and the sinks are
     * unchanged: o_i = Σ_j P_ij·z_ij·v_j with z_ij 0 or 1/(1 - dropout_p), a pure function of
     * dropout_seed, dropout_offset, the batch b, the query head h, the row's global index
     * r = p + k_offset (p its diagonal position, above: i for a self-attention) and the key's
     * c = j + k_offset, the same on every device and in clattn_attention_backward. With r and c
     * as unsigned 32-bit words (mod 2^32), Philox-4x32-10 with key (seed & 0xffffffff,
     * seed >> 32) and counter (16·floor(c / 128) + c mod 16, r, b·heads_q + h, dropout_offset)
     * gives four words x0..x3; key c takes the 16-bit half floor(c / 16) mod 2 (0: the low half)
     * of word x[floor(c / 32) mod 4] and is kept iff that half >= round(dropout_p·65536) (at most
     * 65535): drop rates resolve to 1/65536. clattn_dropout_mask writes z. Fused path only (the
     * unfused one and desc->probabilities refuse it), not with packed sequences (cu_seqlens);
     * negative, NaN or >= 1: refused. */
    uint64_t dropout_seed;
    float dropout_p;
    uint32_t dropout_offset;
    /* Must be zero (refused otherwise). Later versions put new options here, each off at zero, so
     * that the descriptor keeps its size and a program built against this header keeps working
     * with them (zero-initialise the descriptor: `clattn_attention_desc d = {0};` or designated
     * initialisers). */
    int64_t reserved[11];
} clattn_attention_desc;

/**
 * The standard ALiBi slopes of `heads` heads for `max_bias` (BLOOM's and ggml's formula; 8 for
 * BLOOM): n = 2^floor(log2 heads), m0 = 2^(-max_bias / n), m1 = 2^(-max_bias / (2n)); head h < n
 * gets m0^(h + 1), the others m1^(2(h - n) + 1). Writes heads floats to slopes.
 * @return INVALID_ARGUMENT for heads < 1, a NULL slopes or a max_bias that is not finite and
 * positive (0 included: no ALiBi is no slopes, not slopes of 1).
 */
CLATTN_API clattn_status clattn_alibi_slopes(int heads, float max_bias, float *slopes);

/** Row-wise softmax description. Tensors are [batch][heads][rows][cols]. */
typedef struct clattn_softmax_desc {
    int64_t batch;
    int64_t heads;
    int64_t rows; /* 1 .. CLATTN_MAX_SEQ, as cols */
    int64_t cols;
    float scale;  /* inputs are multiplied by scale before the softmax; 0 means 1 */
    int causal;   /* bottom-right aligned: row i sees column j iff j <= i + (L - rows) */
    const clattn_tensor *mask; /* additive, shape [batch|1][heads|1][rows|1][cols]; NULL: none */
    cl_mem kv_lengths;         /* int32[batch]: visible columns per batch (clamped); NULL: cols */
} clattn_softmax_desc;

typedef struct clattn_context clattn_context;

/**
 * Creates a context on a device chosen by `device`: NULL or "" reads the CLATTN_DEVICE environment
 * variable; then "gpu", "cpu", "accelerator" (any case), "P:D" (platform and device index), or a
 * case-insensitive substring of the platform or device name. With no spec the first GPU is chosen,
 * else the first device of any type. Devices clattn cannot compute correctly on are passed over:
 * Mesa's llvmpipe (rusticl's software device), which stops a kernel's loops after 65535 iterations
 * in all without an error; when only such devices match, CLATTN_UNSUPPORTED says why.
 * @return CLATTN_SUCCESS and *ctx, or a failure status with *ctx set to NULL
 *         (clattn_last_error(NULL) then gives the message).
 */
CLATTN_API clattn_status clattn_create(const char *device, clattn_context **ctx);

/**
 * Creates a context that enqueues on the caller's in-order queue (retained, released by
 * clattn_release). Out-of-order queues, and queues on a device clattn_create passes over, are
 * refused with CLATTN_UNSUPPORTED.
 */
CLATTN_API clattn_status clattn_create_from_queue(cl_command_queue queue, clattn_context **ctx);

/** Releases everything the context owns. NULL is a no-op. */
CLATTN_API void clattn_release(clattn_context *ctx);

/**
 * @return the one-line message of the last failure on `ctx` (with the build log appended after a
 * newline for CLATTN_BUILD_FAILED), valid until the next call on `ctx`; "" when the last call
 * succeeded. With ctx NULL: the last failure on this thread of a call that has no context
 * (clattn_create, clattn_create_from_queue, clattn_select_device, clattn_device_key) or was given none;
 * a later success does not clear it.
 */
CLATTN_API const char *clattn_last_error(const clattn_context *ctx);
/** @return the raw cl_int of the last failing OpenCL call on `ctx` (CL_SUCCESS if none). */
CLATTN_API cl_int clattn_last_cl_error(const clattn_context *ctx);
/** @return the build log when the last call on `ctx` failed with CLATTN_BUILD_FAILED, else "". */
CLATTN_API const char *clattn_last_build_log(const clattn_context *ctx);

/**
 * Resolves a device spec exactly as clattn_create does, without creating anything.
 * `why` (may be NULL) receives one line explaining the choice, e.g. "first GPU (no spec given)".
 * @return CLATTN_SUCCESS with *platform and *device set, NO_DEVICE, UNSUPPORTED (only devices
 *         clattn passes over match) or INVALID_ARGUMENT otherwise; on failure *platform, *device
 *         and why are left as they were (the reason: clattn_last_error(NULL)).
 */
CLATTN_API clattn_status clattn_select_device(const char *spec, cl_platform_id *platform,
                                              cl_device_id *device, char *why, size_t why_size);

/**
 * Writes the tuning-store key of `device` into buf: "vendorid:name:compute_units:local_mem_kib",
 * with characters outside [A-Za-z0-9._-] in the name replaced by '_'. The driver version is not part
 * of the key (it is kept as a tag in tuning files). @return INVALID_ARGUMENT if buf is too small
 * (its size needed is in the message), device is not valid or buf is NULL; buf is then left as it
 * was.
 */
CLATTN_API clattn_status clattn_device_key(cl_device_id device, char *buf, size_t size);

CLATTN_API cl_command_queue clattn_queue(const clattn_context *ctx);

/** What getting this context's kernel programs has cost so far (for benchmarks and tools). */
typedef struct clattn_program_stats {
    unsigned memory_hits;      /* programs found already built in this context */
    unsigned disk_hits;        /* loaded from the binary cache */
    unsigned disk_rejects;     /* cache files ignored (corrupt, truncated, foreign, untrusted) and rebuilt */
    unsigned disk_writes;      /* binaries written to the cache */
    unsigned builds;           /* built from source */
    double build_seconds;      /* wall time of those builds (clBuildProgram), in all */
    double build_seconds_max;  /* and of the longest */
    char build_slowest[1100];  /* the longest build's kernel file and options */
    unsigned disk_untrusted;   /* of those, entries not trusted: owned by another user, writable by group or
                                  others, a symbolic link, or in such a directory (docs/guarantees.md) */
    unsigned reserved[7];      /* zero; room for later counters */
} clattn_program_stats;

/** Fills *out (zeroed first). @return INVALID_ARGUMENT for a NULL ctx or out. */
CLATTN_API clattn_status clattn_get_program_stats(const clattn_context *ctx, clattn_program_stats *out);
CLATTN_API cl_context clattn_cl_context(const clattn_context *ctx);
CLATTN_API cl_device_id clattn_device(const clattn_context *ctx);

/**
 * softmax(Q·Kᵀ·scale + mask)·V into `out`; see clattn_attention_desc.
 * @return CLATTN_SUCCESS once enqueued; INVALID_ARGUMENT / UNSUPPORTED with a message otherwise.
 */
CLATTN_API clattn_status clattn_attention(clattn_context *ctx, const clattn_attention_desc *desc,
                                          const clattn_tensor *q, const clattn_tensor *k,
                                          const clattn_tensor *v, const clattn_tensor *out,
                                          cl_uint num_wait, const cl_event *wait, cl_event *done);

/**
 * scale·Q·Kᵀ + mask into `scores` [batch][heads_q][seq_q][seq_kv]; keys hidden by causal or
 * kv_lengths become -inf. With variants, the logits: softcap, mask, ALiBi and score_mod, -inf
 * where the window, chunk or mask_mod hides the key. desc->lse, probabilities, sinks (not a
 * key's logit), the dropout fields (dropout applies to probabilities) and algorithm are ignored.
 */
CLATTN_API clattn_status clattn_scores(clattn_context *ctx, const clattn_attention_desc *desc,
                                       const clattn_tensor *q, const clattn_tensor *k,
                                       const clattn_tensor *scores, cl_uint num_wait,
                                       const cl_event *wait, cl_event *done);

/**
 * Row-wise numerically stable softmax of scale·in + mask into `out`. In place when `out` is the
 * same view as `in` (buffer, dtype, offset, shape, and the strides of the dimensions whose extent
 * is above 1); views of the same memory that overlap otherwise are refused. Hidden entries
 * (mask -inf, past kv_lengths, above the causal diagonal) and -inf entries give -0.0, so a row
 * with nothing else is all zeros; NaN or +inf in a visible entry makes its row NaN.
 */
CLATTN_API clattn_status clattn_softmax(clattn_context *ctx, const clattn_softmax_desc *desc,
                                        const clattn_tensor *in, const clattn_tensor *out,
                                        cl_uint num_wait, const cl_event *wait, cl_event *done);

/**
 * Combines partial attention results over disjoint key ranges into the exact whole:
 * out = Σ_i exp(lse_i - lse) · out_i with lse = log Σ_i exp(lse_i). Each part_out[i] has out's
 * shape [B][H][S][Dv] and any storage type (f32, f16 or bf16, part by part: f32 parts keep f16 and
 * bf16 attention exact until the merge); each part_lse[i] and `lse` are f32 [B][H][S][1]. A part whose lse is -inf
 * contributes nothing, whatever its out holds; a row where every part is -inf gives 0 and -inf.
 * NaN in any other part's lse, or an lse of +inf (which attention gives only for a row with no
 * visible key and a sink of +inf), makes the merged row and its lse NaN, with any number of parts;
 * NaN in such a part's out makes NaN the merged elements of its columns (as NaN in V does in
 * attention). `lse` may be NULL.
 */
CLATTN_API clattn_status clattn_merge(clattn_context *ctx, int num_parts,
                                      const clattn_tensor *part_out, const clattn_tensor *part_lse,
                                      const clattn_tensor *out, const clattn_tensor *lse,
                                      cl_uint num_wait, const cl_event *wait, cl_event *done);

/* ---- Training (docs/training.md) ------------------------------------------------------------ */

/**
 * The gradients of clattn_attention's output: given its inputs q, k, v, its output `out` and
 * LSE `lse` (f32 [batch][heads_q][seq_q][1], as desc->lse wrote them; desc is the forward's,
 * with lse NULL here) and the gradient `dout` of a loss with respect to out, writes
 * dq = ∂loss/∂q, dk and dv (shapes of q, k and v; dtype each of its input's or f32), and with
 * desc->sinks, dsinks (f32 [1][heads_q][1][1], may be NULL) = ∂loss/∂sinks. FlashAttention 2's
 * algorithm: P is recomputed from the LSE, D = rowsum(dout ∘ out), dV = Σ Pᵀ·dout,
 * dS = P ∘ (dP - D) with dP = dout·Vᵀ, dQ = dS·K·scale, dK = dSᵀ·Q·scale (GQA: dK and dV
 * sum over each kv head's query heads); the softcap's derivative 1 - tanh² and dropout (the same z
 * as the forward's, regenerated, not stored) apply. O(seq) workspace, no seq_q x seq_kv buffer.
 * Deterministic: no floating-point atomics and every sum in a fixed order, so the same inputs
 * give bitwise the same gradients on the same device with the same kernel parameters.
 * Every semantic of the forward holds (causal, masks, key lengths, windows, chunks, ALiBi,
 * softcap, sinks, mask_mod, slices, strides, Dk != Dv, GQA, f32/f16/bf16 with f32 arithmetic):
 * a row with no visible key has zero gradient; hidden keys, whatever their K and V hold, get
 * zero dk and dv from the rows that do not see them; NaN in a visible input reaches the
 * gradients it touches. desc->lse and desc->probabilities must be NULL (lse is the argument);
 * score_mod (whose derivative clattn cannot know), desc->kv (paged, quantized or packed K/V)
 * and CLATTN_ALGORITHM_UNFUSED are refused with CLATTN_UNSUPPORTED. dq, dk, dv and dsinks must
 * not overlap each other or any input; out, an input here, is checked as one (it may be
 * read-only, broadcast or share storage with other inputs).
 */
CLATTN_API clattn_status clattn_attention_backward(
    clattn_context *ctx, const clattn_attention_desc *desc, const clattn_tensor *q,
    const clattn_tensor *k, const clattn_tensor *v, const clattn_tensor *out,
    const clattn_tensor *dout, const clattn_tensor *lse, const clattn_tensor *dq,
    const clattn_tensor *dk, const clattn_tensor *dv, const clattn_tensor *dsinks,
    cl_uint num_wait, const cl_event *wait, cl_event *done);

/**
 * The dropout multipliers z of desc (dropout_p > 0) into `mask` [batch][heads_q][seq_q][seq_kv]
 * (f32, f16 or bf16): 1/(1 - dropout_p) where the probability is kept, 0 where dropped, for
 * every (row, key) whether visible or not, exactly as clattn_attention and
 * clattn_attention_backward draw them (desc's kv_lengths and offsets give r and c). It reads and
 * checks batch, heads_q, seq_q, seq_kv, kv_lengths, q_offset, k_offset, the dropout fields and
 * reserved (zero), the rules of clattn_attention for each; the other fields play no part.
 */
CLATTN_API clattn_status clattn_dropout_mask(clattn_context *ctx, const clattn_attention_desc *desc,
                                             const clattn_tensor *mask, cl_uint num_wait,
                                             const cl_event *wait, cl_event *done);

/**
 * Philox-4x32-10 (Salmon et al., SC'11; Random123's philox4x32 with 10 rounds) of counter ctr
 * and key `key` into out, on the host: the generator of desc->dropout_p, for callers who want
 * the dropout decisions without a device. A NULL argument: nothing is read or written.
 */
CLATTN_API void clattn_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/**
 * Host-memory convenience for small programs: contiguous [B][H][S][D] arrays of `dtype` elements
 * (lse: float, [B][Hq][Sq], may be NULL), copied to the device, computed, read back. Blocks.
 * desc->mask, kv_lengths, lse, probabilities, sinks and alibi_slopes must be NULL (the lse argument
 * here takes the place of desc->lse); use clattn_attention for those. Each array becomes one
 * device buffer: one larger than the device's largest allocation gives CLATTN_UNSUPPORTED.
 */
CLATTN_API clattn_status clattn_attention_host(clattn_context *ctx, const clattn_attention_desc *desc,
                                               clattn_dtype dtype, const void *q, const void *k,
                                               const void *v, void *out, float *lse);

/* ---- KV append with rotary embedding (docs/kv-append.md) ------------------------------------ */
typedef enum clattn_rope {
    CLATTN_ROPE_NONE = 0,        /* no rotation: q is copied (when q_out differs), k and v stored */
    CLATTN_ROPE_INTERLEAVED = 1, /* pairs (2i, 2i + 1) rotate together: GPT-J, llama.cpp's "norm" */
    CLATTN_ROPE_NEOX = 2         /* pairs (i, i + rope_dims / 2): GPT-NeoX, Hugging Face's Llama */
} clattn_rope;

/**
 * One step of an inference engine before attention: rotate the new tokens' q and k by their
 * positions and write the new k and v into the cache (FlashAttention's flash_attn_with_kvcache
 * without the attention). Pair i of the rotated dims (rope_dims of them, from dim 0) turns by the
 * angle pos·theta^(-2i / rope_dims), or takes cos and sin from the caller's tables:
 * (x, y) -> (x·cos - y·sin, x·sin + y·cos). Dims past rope_dims are copied unchanged.
 */
typedef struct clattn_kv_append_desc {
    int64_t batch;
    int64_t heads_q;    /* 0 when q is NULL */
    int64_t heads_kv;
    int64_t seq_new;    /* new tokens of each batch, 1 .. CLATTN_MAX_SEQ */
    int64_t head_dim;   /* q and k; 1 .. CLATTN_MAX_HEAD_DIM */
    int64_t head_dim_v; /* v; 0 means head_dim */
    clattn_rope rope;
    int64_t rope_dims;  /* even, <= head_dim; 0 means head_dim */
    float rope_theta;   /* the base; 0 means 10000 */
    /* Optional f32 tables [1][1][positions][rope_dims / 2], both or neither: row pos holds the cos
     * and sin of each pair's angle at position pos; they replace rope_theta. */
    const clattn_tensor *rope_cos;
    const clattn_tensor *rope_sin;
    /* Optional int32 [batch]: the position of each batch's first new token (its cache length
     * before the append); token t sits at positions[b] + t. NULL: 0. */
    cl_mem positions;
    /* Where k and v go. NULL or page_size 0: k_cache and v_cache are [batch][heads_kv][max_seq][dim]
     * views and token t of batch b goes to row positions[b] + t (rows past max_seq are not
     * written). Paged: to row s % page_size of page s / page_size of the pools, s =
     * slot_mapping[b·seq_new + t] (vLLM's slot mapping, int32); a negative s skips the token.
     * The caches' I8 scales are written to kv->k_scales / v_scales; fp8 values are stored as
     * x / scale, rounded to nearest even and saturated to the largest finite value. */
    const clattn_kv_layout *kv;
    cl_mem slot_mapping;
    int64_t reserved[8]; /* must be zero */
} clattn_kv_append_desc;

/**
 * q [batch][heads_q][seq_new][head_dim] (may be NULL, with q_out) rotated into q_out (the same
 * view as q: in place; q_out's dtype may differ from q's among f32/f16/bf16); k_new
 * [batch][heads_kv][seq_new][head_dim] rotated and v_new [batch][heads_kv][seq_new][head_dim_v]
 * written into k_cache and v_cache, of any storage type (quantized as the type says: q8_0 and q4_0
 * with ggml's rounding, block by block).
 */
CLATTN_API clattn_status clattn_kv_append(clattn_context *ctx, const clattn_kv_append_desc *desc,
                                          const clattn_tensor *q, const clattn_tensor *k_new,
                                          const clattn_tensor *v_new, const clattn_tensor *q_out,
                                          const clattn_tensor *k_cache, const clattn_tensor *v_cache,
                                          cl_uint num_wait, const cl_event *wait, cl_event *done);

/* ---- Kernel parameters and the tuning store -------------------------------------------------
 * Every kernel's tile sizes, work-group shape, vector width and splits are integer parameters
 * chosen per device and per problem class (operation, dtype, head_dim, mask kind, seq_q class,
 * log2 seq_kv). For each call the library takes the first that applies of:
 *   1. an override set with clattn_set_params on this context,
 *   2. the environment variable CLATTN_PARAMS_<OP>, for experiments: values by name in any order,
 *      "kernel=lanes,KG=8,KU=16", or positional, "32,8,0,0,16,0,4" (the leading ones); the names
 *      are the kernels' own -D names (clattn_param_name; decode's kernels also call WGY, NS and VW
 *      KG, KL or LANES, LC or KU), the kernel choice DIRECT also takes "kernel" and a kernel's
 *      name (tiled, direct, rows, rows_sync, lanes, lanes_local: docs/tuning.md). A list that does
 *      not parse, or holds a value outside [0, clattn_param_max], is not used: the origin says so,
 *      and the tuning report of a context created with it),
 *   3. the user tuning file of this device, written by clattn-tune into CLATTN_TUNING_DIR
 *      (default: <cache dir>/tuning),
 *   4. entries built into the library for known devices (tuning/ in the source tree),
 *   5. vendor defaults (by device type and vendor), 6. generic defaults.
 * Each operation then clamps the values to what the device can run (work-group size, local
 * memory). A kernel the compiler built with more registers than its work-group allows
 * (CL_KERNEL_WORK_GROUP_SIZE) is fitted again to what it allows when the values come from 3-6;
 * values from 1 or 2 are run as given or refused with CLATTN_UNSUPPORTED. A malformed, truncated,
 * foreign or unsupported tuning file is ignored and described by clattn_tuning_report; it never
 * makes a call fail. */

typedef enum clattn_operation {
    CLATTN_OPERATION_SCORES = 0,  /* QKᵀ GEMM of clattn_scores and the unfused path */
    CLATTN_OPERATION_PV = 1,      /* P·V GEMM of the unfused path */
    CLATTN_OPERATION_SOFTMAX = 2, /* row softmax */
    CLATTN_OPERATION_FUSED = 3,   /* fused attention, seq_q > 16 */
    CLATTN_OPERATION_DECODE = 4,  /* fused attention with key splits, seq_q <= 16 */
    CLATTN_OPERATION_MERGE = 5,   /* merging partial results */
    CLATTN_OPERATION_COUNT = 6
} clattn_operation;

typedef enum clattn_params_source {
    CLATTN_SOURCE_GENERIC = 0,
    CLATTN_SOURCE_VENDOR = 1,
    CLATTN_SOURCE_BUILTIN = 2,
    CLATTN_SOURCE_USER_FILE = 3,
    CLATTN_SOURCE_ENVIRONMENT = 4,
    CLATTN_SOURCE_OVERRIDE = 5
} clattn_params_source;

#define CLATTN_MAX_KERNEL_PARAMS 12

/** A problem class, to ask which parameters an operation would use (clattn_get_params). */
typedef struct clattn_problem_class {
    clattn_operation operation;
    clattn_dtype dtype;  /* storage type of the inputs */
    int64_t head_dim;    /* 0 for softmax and merge */
    int64_t seq_q;       /* softmax: rows */
    int64_t seq_kv;      /* softmax: columns */
    int causal;
    int masked;          /* an additive mask or key lengths */
} clattn_problem_class;

typedef struct clattn_kernel_params {
    int count;                               /* clattn_param_count(operation) */
    int values[CLATTN_MAX_KERNEL_PARAMS];    /* before the operation's clamping to the device */
    clattn_params_source source;
    char origin[512];                        /* e.g. the tuning file and its entry line */
} clattn_kernel_params;

/** "scores", "pv", "softmax", "fused", "decode", "merge"; NULL for an invalid value. */
CLATTN_API const char *clattn_operation_name(clattn_operation op);
/** Number of parameters of `op` (0 for an invalid op) and the name of parameter `index`. */
CLATTN_API int clattn_param_count(clattn_operation op);
CLATTN_API const char *clattn_param_name(clattn_operation op, int index);
/**
 * The largest value parameter `index` of `op` accepts (the smallest is 0): 4096 for sizes, which
 * each operation fits to the device; for a choice of kernel or variant (DIRECT, KF, KT) its
 * largest choice, e.g. 6 for decode's DIRECT (mma). -1 for an invalid op or index.
 */
CLATTN_API int clattn_param_max(clattn_operation op, int index);
/**
 * The name of value `value` of parameter `index` of `op` where that parameter chooses the kernel
 * (DIRECT): "tiled", "direct", and for decode also "rows", "rows_sync", "lanes", "lanes_local"
 * (docs/tuning.md); NULL for another parameter or value. CLATTN_PARAMS_<OP> and tuning files take
 * these names ("kernel=lanes").
 */
CLATTN_API const char *clattn_param_value_name(clattn_operation op, int index, int value);
CLATTN_API const char *clattn_params_source_name(clattn_params_source source);

/**
 * Overrides the parameters of `op` for every later call on `ctx` (all problem classes).
 * `count` must be clattn_param_count(op), each value in [0, clattn_param_max(op, i)]; values NULL
 * and count 0 remove the override. The values are clamped per call like any other source.
 */
CLATTN_API clattn_status clattn_set_params(clattn_context *ctx, clattn_operation op,
                                           const int *values, int count);

/**
 * The parameters a call of class `pc` would use now, and where they come from. merge has one
 * class whatever its sizes and the parts' types: head_dim must be 0 (softmax's too), causal and
 * masked 0 (CLATTN_INVALID_ARGUMENT otherwise).
 */
CLATTN_API clattn_status clattn_get_params(clattn_context *ctx, const clattn_problem_class *pc,
                                           clattn_kernel_params *out);
/**
 * The parameters an attention call of class `pc` with these head counts would run: as
 * clattn_get_params, except that decode answers for (heads_q / heads_kv)·seq_q packed query rows
 * per kv head, from which GPUs' defaults run the tiled kernel (docs/architecture.md); origin then
 * says so. heads_kv must divide heads_q; head_dim_v 0 means pc->head_dim.
 */
CLATTN_API clattn_status clattn_get_call_params(clattn_context *ctx, const clattn_problem_class *pc,
                                                int64_t heads_q, int64_t heads_kv, int64_t head_dim_v,
                                                clattn_kernel_params *out);

/**
 * What reading the tuning store found for this context's device: the user file's path and entry
 * count, built-in tables that apply, and any file that was ignored with the reason (malformed,
 * truncated, foreign device, unsupported version) or whose driver tag differs (its entries are
 * still used; re-run clattn-tune), and any CLATTN_PARAMS_<OP> list that is not used because it
 * is invalid. Valid until clattn_reload_tuning or clattn_release.
 */
CLATTN_API const char *clattn_tuning_report(const clattn_context *ctx);

/**
 * One line on this context's kernel binary cache: its directory and whether clattn trusts it
 * (docs/guarantees.md: the directory and each entry must be the user's), or why there is none;
 * then the last entry it ignored as not trusted, with the reason. Valid until the next call on
 * ctx. "" for a NULL ctx.
 */
CLATTN_API const char *clattn_cache_report(const clattn_context *ctx);

/**
 * One line on the matrix units (tensor cores) for this context: the kernel's backend where fused
 * attention can use them ("nvidia mma.sync ..."), "emulated" under CLATTN_MATRIX=emulate, or
 * "none" with the reason (no such unit, an unsupported device, CLATTN_MATRIX=off, a driver that
 * refused the kernel). Valid until the next call on ctx. "" for a NULL ctx.
 */
CLATTN_API const char *clattn_matrix_report(const clattn_context *ctx);

/** Re-reads the user tuning file (after clattn-tune wrote it) and CLATTN_NREG16. Never fails on a
 * bad file. */
CLATTN_API clattn_status clattn_reload_tuning(clattn_context *ctx);

/**
 * Path of this context's user tuning file (it may not exist yet). INVALID_ARGUMENT for a NULL
 * buf or one too small for the path (buf is then untouched), IO_ERROR when the context has no
 * tuning directory.
 */
CLATTN_API clattn_status clattn_tuning_path(const clattn_context *ctx, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* CLATTN_H */
