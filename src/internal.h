/* Private to the library: the context, error helpers and the pieces each source file provides. */
#ifndef CLATTN_INTERNAL_H
#define CLATTN_INTERNAL_H

#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include "clattn.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>

#define CLATTN_MSG_MAX 1024

/* What the kernels and the tuning store need to know about a device, read once at creation. */
typedef struct clattn_devinfo {
    char platform_name[256];
    char platform_version[256];
    char name[256];
    char vendor[256];
    char version[256];
    char driver[256];
    cl_device_type type;
    cl_uint vendor_id;
    cl_uint compute_units;
    cl_ulong local_mem;
    cl_ulong global_mem;
    cl_ulong max_alloc;
    cl_ulong cache_size; /* CL_DEVICE_GLOBAL_MEM_CACHE_SIZE, 0 if unknown */
    size_t max_wg;
    size_t max_item[3];
    size_t max_groups_yz; /* work-groups a launch may have in grid y and z; 0: no limit known */
    cl_uint mem_align_bits;
    int has_fma; /* CL_FP_FMA: fma() is a hardware instruction, kernels use it for MAD */
    int nreg16;  /* float16 values the vector registers hold (CPU register tiles): see device.c */
    int nreg16_device; /* the same as the device reports it, before CLATTN_NREG16 (tuning.c) */
    char key[512];
} clattn_devinfo;

/* What the compiler reported for a kernel it cannot launch as built (see clattn__get_kernel). */
typedef struct clattn_kernel_refusal {
    size_t req_wg;  /* the work-group its reqd_work_group_size asks for */
    size_t kwg;     /* CL_KERNEL_WORK_GROUP_SIZE: the largest work-group it allows */
    cl_ulong kmem;  /* CL_KERNEL_LOCAL_MEM_SIZE */
} clattn_kernel_refusal;

/* A built program and the kernels created from it, keyed by (source file, build options). A kernel
 * the device cannot launch is kept as NULL with what refused it, so that asking again is cheap. */
typedef struct clattn_program_entry {
    char *file;
    char *options;
    cl_program program;
    int from_disk; /* loaded from the binary cache, not yet built from source */
    int nkernels;
    char *kernel_names[8];
    cl_kernel kernels[8];
    clattn_kernel_refusal refused[8];
} clattn_program_entry;

/* Program-cache counters, read by tests and clattn-bench to tell hits from builds. */
typedef struct clattn_cache_stats {
    unsigned memory_hits;
    unsigned disk_hits;
    unsigned disk_rejects; /* corrupt, truncated or foreign cache files ignored, untrusted ones too */
    unsigned disk_writes;
    unsigned builds;
    unsigned disk_untrusted; /* of those, entries not trusted: owner, permissions, a symbolic link */
} clattn_cache_stats;

struct clattn_context {
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    clattn_devinfo dev;

    char error[CLATTN_MSG_MAX + 1];
    char *build_log;
    char *error_full; /* error + "\n" + build log, built on demand by clattn_last_error */
    cl_int cl_error;

    clattn_program_entry *programs;
    int nprograms;
    int cap_programs;
    clattn_cache_stats stats;
    /* Wall time of the programs built from source (clBuildProgram; not loads from the disk
     * cache): their sum, the longest, and that one's file and options. clattn-bench reports them:
     * a variant that takes a compiler minutes shows there (one took 430 s on Intel's CPU
     * runtime before 95349b0). */
    double build_seconds, build_seconds_max;
    char build_slowest[1100];

    int cache_enabled;
    char cache_dir[4096];
    /* Why the cache last ignored an entry it does not trust, or refused to write into a directory
     * it does not trust ("" if never): "<entry or directory>: <reason>". */
    char cache_untrusted[600];
    char cache_report[4096 + 1000]; /* clattn_cache_report's text */

    cl_mem workspace;
    size_t workspace_size;
    /* Set by clattn__get_kernel when it refuses a kernel the device cannot launch as built: what
     * the compiler reported, and whether this context had refused the same kernel (file, options,
     * name) before, as when a refit asks for it again; read and cleared by clattn__retry_cap. */
    clattn_kernel_refusal refused;
    int refused_again;
    /* Bytes of local arrays the fits give a kernel (clattn__local_fits); 0: the device's local
     * memory less CLATTN_LOCAL_RESERVE. Lowered by clattn__retry_cap when a compiled kernel needed
     * more local memory than the device has although its arrays fitted. */
    cl_ulong local_budget;
    /* Set while a multi-kernel operation rehearses its launches: kernels are built, the workspace
     * allocated and arguments set, but clattn__enqueue enqueues nothing (see run_unfused). */
    int rehearse;
    /* Set during an attention or scores call with variants (src/variant.c): the options every
     * kernel that includes attn_common.cl is built with ("" otherwise), and the user's score_mod
     * and mask_mod source, assembled before attn_common.cl (NULL where absent). */
    char variant_opts[160]; /* and the KV storage's options (clattn__kv_options) */
    const char *variant_src[2];

    /* Tuning: the user file of this device (if any, valid), built-in tables that match it,
     * what reading them found, and the application's overrides per op. */
    char tuning_dir[4096];
    struct clattn_tuning_table *user_tuning;
    int user_driver_changed;
    char user_tuning_ignored[1024]; /* why an existing user file was not read ("" if none was) */
    struct clattn_tuning_table *builtin[4];
    int nbuiltin;
    char tuning_report[CLATTN_MSG_MAX + 1];
    int override_n[8];
    int override_v[8][12];

    /* The matrix units (src/matrix.c): CLATTN_MATRIX (CLATTN_MATRIX_AUTO, _OFF, _EMULATE), the
     * device's backend (CLATTN_MMA_NONE, _NV, _AMD, _INTEL), NVIDIA's compute capability as 10·major +
     * minor (0: not an NVIDIA device or not reported), why the device has no backend or why it
     * was given up, and clattn_matrix_report's text. */
    int matrix_mode;
    int matrix_backend;
    /* the fragment layout the matrix kernel takes: 0 NVIDIA's, 1 AMD MFMA's, 2 AMD WMMA's, 3 and 4
     * Intel XMX's on sub-groups of 16 and 8 (the device's backend's, or CLATTN_MATRIX=emulate-amd,
     * emulate-wmma, emulate-intel, emulate-intel8) */
    int matrix_layout;
    int nv_cc;
    char matrix_why[600];
    /* ldmatrix for the 16-bit matrix kernel (clattn__matrix_ldsm): -1 not probed yet, 0 off (why
     * in matrix_ldsm_why), 1 on; under emulation 1 unless a test set 0 (CLATTN_TEST_MMA_LDSM). */
    int matrix_ldsm;
    char matrix_ldsm_why[300];
    /* AMD's and Intel's backends per input type (f32, f16, bf16: clattn__matrix_checked): -1 not probed yet, 0
     * its probe failed (why in matrix_check_why: the FMA kernels run), 1 passed */
    int matrix_checked[3];
    char matrix_check_why[300];
    /* Intel's backend built with -cl-intel-256-GRF-per-thread: -1 not tried yet or on, 0 the
     * driver refused it (src/fused_mma.c) */
    int matrix_big_grf;
    char matrix_report[900];
};

enum { CLATTN_MATRIX_AUTO = 0, CLATTN_MATRIX_OFF = 1, CLATTN_MATRIX_EMULATE = 2 };
enum { CLATTN_MMA_NONE = 0, CLATTN_MMA_NV = 1, CLATTN_MMA_AMD = 2, CLATTN_MMA_INTEL = 3 };

/* ---- errors (util.c) ---- */
clattn_status clattn__fail(clattn_context *ctx, clattn_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Maps an OpenCL error to a status (allocation failures -> OUT_OF_MEMORY) and records it. */
clattn_status clattn__cl_fail(clattn_context *ctx, cl_int err, const char *what);
void clattn__clear_error(clattn_context *ctx);
const char *clattn__cl_error_name(cl_int err);
void clattn__set_create_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
char *clattn__strdup(const char *s);
/* 0/off/false/no or 1/on/true/yes, any case; unset or anything else: dflt */
int clattn__env_flag(const char *name, int dflt);
/* Whether s is `word` (lower case ASCII) ignoring ASCII case. */
int clattn__same_word(const char *s, const char *word);
/* *r = a·b or a + b and 1, or 0 (r untouched) where that overflows 64 bits. */
static inline int clattn__mul_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    if (a != 0 && b > UINT64_MAX / a)
        return 0;
    *r = a * b;
    return 1;
}
static inline int clattn__add_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    if (b > UINT64_MAX - a)
        return 0;
    *r = a + b;
    return 1;
}
/* The same saturating at UINT64_MAX: sizes of scratch buffers, whose factors validation bounds
 * one by one but not together, compared with the device's limits. */
static inline uint64_t clattn__mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return clattn__mul_ok(a, b, &r) ? r : UINT64_MAX;
}
static inline uint64_t clattn__add_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return clattn__add_ok(a, b, &r) ? r : UINT64_MAX;
}
/* ceil(a / b) for b > 0 without forming a + b - 1, which wraps a 32-bit size_t for grids past
 * 2^31 work-items (clattn__enqueue's chunk count). */
static inline size_t clattn__ceil_div(size_t a, size_t b)
{
    return a / b + (a % b != 0);
}

/* ---- hashing (hash.c): 128-bit FNV-1a style digest for cache keys ---- */
typedef struct clattn_hash {
    uint64_t a, b;
} clattn_hash;
void clattn__hash_init(clattn_hash *h);
void clattn__hash_bytes(clattn_hash *h, const void *data, size_t n);
void clattn__hash_str(clattn_hash *h, const char *s); /* includes the terminator as a separator */
void clattn__hash_hex(const clattn_hash *h, char out[33]);

/* ---- device (device.c) ---- */
clattn_status clattn__read_devinfo(cl_platform_id p, cl_device_id d, clattn_devinfo *info);

/* ---- programs (program.c, cache.c) ---- */
typedef struct clattn_kernel_source {
    const char *name;
    const char *text;
    size_t length;
} clattn_kernel_source;
/* The kernels (cl/) and built-in tuning tables (tuning/), embedded by cmake/embed.cmake. */
extern const clattn_kernel_source clattn_kernel_sources[];
extern const int clattn_kernel_source_count;
/* Builds (or finds) the program of cl/<file> + cl/common.cl with `options` and returns one kernel,
 * owned by the context. UNSUPPORTED when the compiled kernel cannot be launched with its
 * reqd_work_group_size or needs more local memory than the device has (ctx->refused says which). */
clattn_status clattn__get_kernel(clattn_context *ctx, const char *file, const char *options,
                                 const char *kernel_name, cl_kernel *out);
/* After an operation's clattn__get_kernel returned st for a configuration whose work-groups were
 * fitted to `cap` work-items: the cap to fit the configuration to and try again (the error is then
 * cleared), or 0 when st stands. A kernel that allows fewer work-items than it was built for gives
 * that many. A kernel that needs more local memory than the device has although its arrays fitted
 * (the compiler added some) lowers the context's local budget by the excess and gives `cap` again;
 * the same kernel refused again (the refit did not change it) gives half its work-group. Only
 * parameters the library chose (tuning files, vendor or generic defaults) are refitted; an override
 * or CLATTN_PARAMS_<OP> runs as given or fails. */
size_t clattn__retry_cap(clattn_context *ctx, clattn_status st, clattn_params_source source, size_t cap);
/* Local memory the compiler may add to a kernel's declared arrays: NVIDIA's OpenCL compiler
 * (driver 580, H200) gives decode_rows, whose arrays take 49152 bytes, 49168 bytes of local memory
 * (CL_KERNEL_LOCAL_MEM_SIZE), over the device's 48 KiB. The fits leave this much free. */
#define CLATTN_LOCAL_RESERVE 256
/* Bytes of local arrays a kernel may declare (see local_budget in clattn_context). */
static inline cl_ulong clattn__local_budget(const clattn_context *ctx)
{
    if (ctx->local_budget)
        return ctx->local_budget;
    return ctx->dev.local_mem >= CLATTN_LOCAL_RESERVE ? ctx->dev.local_mem - CLATTN_LOCAL_RESERVE : 0;
}
/* 1 when a kernel declaring `bytes` of local arrays fits the device's local memory. */
static inline int clattn__local_fits(const clattn_context *ctx, size_t bytes)
{
    return ctx->dev.local_mem >= CLATTN_LOCAL_RESERVE && bytes <= clattn__local_budget(ctx);
}
/* NULL when clattn can run on the device named `name`; otherwise why not (Mesa's llvmpipe,
 * whose kernels leave their loops early). Devices it refuses are passed over when a context is
 * created. */
const char *clattn__device_refusal(const char *name);
/* Source text for a file (embedded, or from CLATTN_KERNEL_DIR during development). Caller frees. */
char *clattn__load_source(const char *file, size_t *len);
void clattn__release_programs(clattn_context *ctx);
void clattn__cache_init(clattn_context *ctx);
/* mkdir -p, directories it makes 0700 whatever the umask; 0 when the directory exists. */
int clattn__make_dirs(const char *path);

/* Cache and tuning files are read only when the user owns them (docs/guarantees.md): the
 * directory is owned by the effective user or root and not writable by group or others, or is
 * root-owned with the sticky bit; the file is a regular file (no symbolic link is followed), owned
 * by the effective user (or by root, in a root-owned directory no one else can write) and not
 * writable by group or others. Checked on the open descriptors, never on the path again. */
struct stat;
typedef enum clattn_entry_status {
    CLATTN_ENTRY_OK,        /* *fd is open for reading on a trusted regular file, *st its fstat */
    CLATTN_ENTRY_ABSENT,    /* no such entry, or no directory to read it from */
    CLATTN_ENTRY_NOT_FILE,  /* a FIFO, a directory, a device: why says "not a regular file" */
    CLATTN_ENTRY_UNTRUSTED  /* owner, permissions, a symbolic link, or the directory's: why says which */
} clattn_entry_status;
clattn_entry_status clattn__open_entry(const char *dir, const char *name, int *fd, struct stat *st, char *why,
                                       size_t why_size);
/* The existing directory `dir` opened for writing entries into (a descriptor), when it passes the
 * directory rule; else -1, with why (may be NULL) saying what is wrong, "" when it is missing. */
int clattn__open_dir_for_write(const char *dir, char *why, size_t why_size);
/* A new file `name` in the directory open on dfd, for writing: mode 0600 whatever the umask,
 * never through a symbolic link, failing if the name exists, not inherited by exec'd children. */
FILE *clattn__create_temp(int dfd, const char *name);
/* Removes this library's temporary files in the directory open on dfd that are more than an
 * hour old and owned by the effective user. */
void clattn__sweep_temps(int dfd);
/* CLATTN_INVALID_ARGUMENT naming the first nonzero desc->reserved[i], else success. */
clattn_status clattn__check_reserved(clattn_context *ctx, const int64_t *reserved, size_t n);
/* Tests only: called with the directory's path once clattn__open_entry has opened and checked it,
 * before the entry is opened (a test renames directories there). NULL outside tests. */
extern void (*clattn__entry_dir_hook)(const char *dir);
/* Returns a malloc'ed binary for the key or NULL (missing, corrupt, foreign: never fatal). */
unsigned char *clattn__cache_load(clattn_context *ctx, const char *hex, size_t *size);
void clattn__cache_store(clattn_context *ctx, const char *hex, const unsigned char *bin, size_t size);

/* ---- validation (validate.c) ---- */
/* A checked tensor view in the form kernels take: byte-free element offset and strides. */
typedef struct clattn_view {
    cl_mem buffer;
    clattn_dtype dtype;
    cl_ulong offset;    /* in elements; in bytes for the block types (q8_0, q4_0) */
    cl_ulong stride[3]; /* likewise */
} clattn_view;

enum {
    CLATTN_VIEW_INPUT = 0,
    CLATTN_VIEW_OUTPUT = 1,      /* must not overlap itself */
    CLATTN_VIEW_BROADCAST = 2    /* dims 0..2 may have extent 1 where the shape wants more */
};
#define CLATTN_DTYPES_ALL 7u /* f32, f16, bf16 */
#define CLATTN_DTYPES_KV 0xffu /* and the KV-cache storage types */
#define CLATTN_DTYPE_BIT(d) (1u << (unsigned)(d))

clattn_status clattn__check_view(clattn_context *ctx, const char *name, const clattn_tensor *t,
                                 const int64_t want[4], unsigned flags, unsigned dtypes,
                                 clattn_view *out);
/* The wait list: each event valid, of this context, not failed; done not one of its elements. */
clattn_status clattn__check_wait(clattn_context *ctx, cl_uint num_wait, const cl_event *wait,
                                 const cl_event *done);
/* done points into wait: the entry points then leave *done alone, since it is the caller's event. */
int clattn__done_in_wait(cl_uint num_wait, const cl_event *wait, const cl_event *done);
clattn_status clattn__check_kvlen(clattn_context *ctx, cl_mem kvlen, int64_t batch);
/* Two checked views address the same elements in the same order (strides of extent-1 dimensions
 * are already 0 in both). */
int clattn__same_view(const clattn_view *a, const clattn_view *b);
/* Whether buffer m starts on 16 bytes, given a device whose CL_DEVICE_MEM_BASE_ADDR_ALIGN is at
 * least that: not where it is a CL_MEM_USE_HOST_PTR buffer over host memory not so aligned. */
int clattn__buffer_align16(cl_mem m);
int clattn__views_overlap(const clattn_tensor *a, const clattn_tensor *b);
/* The name of the first of the n checked views ts (NULL entries skipped) that t overlaps, or NULL. */
const char *clattn__first_overlap(const clattn_tensor *t, int n, const clattn_tensor *const *ts,
                                  const char *const *names);
/* Byte ranges [a_lo, a_hi) of a and [b_lo, b_hi) of b share storage (one buffer, sub-buffers of
 * one buffer, or CL_MEM_USE_HOST_PTR buffers over the same host memory). */
int clattn__bytes_overlap(cl_mem a, uint64_t a_lo, uint64_t a_hi, cl_mem b, uint64_t b_lo, uint64_t b_hi);
/* The batch int32 values of kv_lengths share storage with the checked view t. */
int clattn__kvlen_overlaps(cl_mem kvlen, int64_t batch, const clattn_tensor *t);

/* Resolved attention problem shared by the scores, unfused and fused paths. */
/* The variants of a call (src/variant.c, docs/variants.md) as the kernels take them (attn_common.cl):
 * bits V_*, the window's sides (INT32_MAX where unbounded), the chunk (0: none), the softcap, the
 * sinks and ALiBi slopes (buffer NULL where absent) and the user's score_mod / mask_mod. */
#define CLATTN_V_RANGE 1u
#define CLATTN_V_SOFTCAP 2u
#define CLATTN_V_ALIBI 4u
#define CLATTN_V_SINKS 8u
#define CLATTN_V_SCORE_MOD 16u
#define CLATTN_V_MASK_MOD 32u
#define CLATTN_V_OFFSET 64u /* q_offset - k_offset != 0: delta moves every row's diagonal position */
/* Dropout (desc->dropout_p > 0; src/backward.c): the kernels' DROP_ARGS (cl/attn_common.cl). */
typedef struct clattn_dropout {
    int on;
    cl_uint k0, k1, off, thr; /* Philox key (the seed), counter word 3, threshold of the 16-bit halves */
    float scale;              /* 1 / (1 - p) */
    cl_uint roff, coff;       /* q_offset and k_offset mod 2^32 */
    int hq;
} clattn_dropout;

typedef struct clattn_variant {
    unsigned bits;
    int left, right, chunk, delta, korg; /* korg: k_offset mod chunk, the keys' chunk origin */
    float softcap;
    clattn_view sinks, alibi;
    const char *score_mod, *mask_mod;
} clattn_variant;

/* How K and V are stored (src/kv.c, docs/kvcache.md) as the kernels take it (kv_access.cl): on
 * when they are paged or of a KV-cache type; then the fused kernels are built with KVC, PAGE,
 * DT_K and DT_V and take KVC_ARGS. */
typedef struct clattn_kvstore {
    int on;
    int page;              /* page size; 0: not paged */
    clattn_dtype kt, vt;   /* storage types of K and V */
    cl_mem bt;             /* block table (int32), element offset and batch stride */
    cl_ulong bt_off, bt_sb, bt_hi; /* bt_hi: one past the last entry read */
    int k_np, v_np;        /* pages of the pools */
    clattn_view ks, vs;    /* int8 scales (buffer NULL where absent) */
    float k_fs, v_fs;      /* fp8 per-tensor scales (1 where absent) */
    int varlen;            /* packed sequences: cu_q and/or cu_k, rows of the packed tensors */
    cl_mem cu_q, cu_k;
    int total_q, total_k;
} clattn_kvstore;

typedef struct clattn_problem {
    int64_t batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, head_dim_v;
    float scale;
    int causal;
    clattn_dtype dtype;
    int has_mask;
    clattn_view q, k, v, out, mask, lse, probs;
    cl_mem kv_lengths;
    clattn_variant var;
    clattn_kvstore kv;
    clattn_dropout drop;
} clattn_problem;
/* validate.c: m is a readable buffer of this context holding at least count int32 values. */
clattn_status clattn__check_ints(clattn_context *ctx, cl_mem m, const char *name, uint64_t count);
/* kv.c: whether dtype is a KV-cache storage type (i8, fp8, q8_0, q4_0); checks desc->kv and the k
 * and v views of an attention call (paged pools, storage types, scales) into p->k, p->v, p->kv;
 * whether t overlaps the block table; the kernels' options (" -DKVC=1 ...", "" when off) and
 * arguments (KVC_ARGS, cl/kv_access.cl). */
int clattn__kv_type(clattn_dtype dtype);
clattn_status clattn__check_kv(clattn_context *ctx, const clattn_attention_desc *desc, const clattn_tensor *k,
                               const clattn_tensor *v, clattn_problem *p);
int clattn__table_overlaps(const clattn_kvstore *kv, const clattn_tensor *t);
void clattn__kv_options(const clattn_problem *p, char *buf, size_t size);
/* variant.c: the offsets' range (q_offset, k_offset against seq_q and seq_kv). */
clattn_status clattn__check_offsets(clattn_context *ctx, const clattn_attention_desc *desc);
/* variant.c: checks desc's variant fields against p (sizes filled) and fills p->var. */
clattn_status clattn__check_variants(clattn_context *ctx, const clattn_attention_desc *desc,
                                     const clattn_tensor *out, clattn_problem *p);
/* variant.c: whether causal, the window and the chunk hide every key from every row of p (known
 * on the host: no key lengths, no packed sequences), so that the call only writes empty rows. */
int clattn__all_keys_hidden(const clattn_problem *p);
/* variant.c: the most keys one query row of p can see (window and chunk; seq_kv without them),
 * which bounds the keys a CPU row block streams (clattn__direct_in_place). */
int64_t clattn__row_keys_max(const clattn_problem *p);
/* Sets ctx->variant_opts and variant_src for the kernels of a call of p (clears them without
 * variants); clattn__variant_leave clears them. */
void clattn__variant_enter(clattn_context *ctx, const clattn_problem *p);
void clattn__variant_leave(clattn_context *ctx);
/* Checks the sizes, scale and (when check_algorithm) algorithm of desc, nothing about tensors. */
clattn_status clattn__check_desc(clattn_context *ctx, const clattn_attention_desc *desc,
                                 int check_algorithm);
/* Checks desc + q/k (+ v/out when `need_v`; with need_v 2, out as an input: the backward pass)
 * and fills `p`. */
clattn_status clattn__check_attention(clattn_context *ctx, const clattn_attention_desc *desc,
                                      const clattn_tensor *q, const clattn_tensor *k,
                                      const clattn_tensor *v, const clattn_tensor *out,
                                      int need_v, clattn_problem *p);

/* ---- kernel launch helpers (util.c) ---- */
typedef struct clattn_args {
    cl_kernel kernel;
    cl_uint index;
    cl_int err;
} clattn_args;
void clattn__arg(clattn_args *a, size_t size, const void *value);
/* buffer, offset, 3 strides; NULL passes an absent tensor (NULL buffer, zeros) */
void clattn__arg_view(clattn_args *a, const clattn_view *v);
/* merge.c: the grid of a kernel with one work-item per (row, column) in work-groups of wg along
 * x (dv columns), rows in y and z (row = y + ny·z; ny returned). */
int clattn__row_grid(const clattn_context *ctx, int wg, int64_t dv, int64_t rows, size_t global[3],
                     size_t local[3]);
/* variant.c: the variants' pass over an f32 scores matrix src (scale·QKᵀ without masks) into dst
 * (may be src): the logits of p, -inf where hidden (cl/scores_variant.cl). */
clattn_status clattn__run_scores_variant(clattn_context *ctx, const clattn_problem *p, const clattn_view *src,
                                         const clattn_view *dst, cl_uint num_wait, const cl_event *wait,
                                         cl_event *done);
/* Appends the kernels' VARIANT_ARGS (attn_common.cl) when p has variants. */
void clattn__variant_args(clattn_args *a, const clattn_problem *p);
/* backward.c: checks desc's dropout fields into p->drop (after the sizes); appends DROP_ARGS
 * (attn_common.cl) when p->drop.on. */
clattn_status clattn__check_dropout(clattn_context *ctx, const clattn_attention_desc *desc, clattn_problem *p);
void clattn__dropout_args(clattn_args *a, const clattn_problem *p);
/* Appends the fused kernels' KVC_ARGS (cl/kv_access.cl) when p->kv.on. */
void clattn__kv_args(clattn_args *a, const clattn_problem *p);
clattn_status clattn__enqueue(clattn_context *ctx, clattn_args *a, cl_uint dims, const size_t *global,
                              const size_t *local, cl_uint num_wait, const cl_event *wait,
                              cl_event *done, const char *what);
/* The grid of a kernel with one work-item work-groups that reads its tiles through TILE_X/Y/Z
 * (cl/common.cl), global[0..2] work-groups in x, y and z, made one dimension in x (so that the
 * runtime runs consecutive tiles of a head in order) while they number at most INT_MAX (the
 * kernels' indices are ints); else left as it is. */
void clattn__flatten_grid(size_t global[3]);

/* Workspace of at least `need` bytes that grows on demand; freed by clattn_release. `need` is
 * 64-bit so that callers never truncate a size to size_t: past the max allocation or SIZE_MAX,
 * CLATTN_UNSUPPORTED. */
clattn_status clattn__workspace(clattn_context *ctx, uint64_t need, cl_mem *out);

/* ---- tuning (tuning.c) ---- */
typedef enum clattn_op {
    CLATTN_OP_SCORES = 0,
    CLATTN_OP_PV,
    CLATTN_OP_SOFTMAX,
    CLATTN_OP_FUSED,
    CLATTN_OP_DECODE,
    CLATTN_OP_MERGE,
    CLATTN_OP_COUNT
} clattn_op;

/* Integer parameters of one kernel launch, named per op: params.h (the schema), params.c. */
#include "params.h"

typedef struct clattn_bucket {
    clattn_op op;
    clattn_dtype dtype;
    int head_dim;
    int seq_q_class; /* 1, <=16, <=128, more -> 0..3 */
    int log2_seq_kv;
    int mask_kind; /* 0 none, 1 causal only, 2 additive mask or key lengths (any causal) */
} clattn_bucket;
/* merge's one bucket, whatever the sizes and the parts' types (merge.c, clattn_get_params). */
#define CLATTN_MERGE_BUCKET ((clattn_bucket){CLATTN_OP_MERGE, CLATTN_F32, 0, 0, 0, 0})

int clattn__mask_kind(int causal, int masked);

/* ---- the parameter schema (params.c) ---- */
const char *clattn__op_name(clattn_op op);
int clattn__param_count(clattn_op op);
/* Parameter i's name, its one-line meaning (NULL past the count) and largest value: a choice's
 * (DIRECT, KF, KT) largest variant, CLATTN_PARAM_MAX for a size; -1 for a parameter op does not have. */
const char *clattn__param_name(clattn_op op, int i);
const char *clattn__param_meaning(clattn_op op, int i);
int clattn__param_max(clattn_op op, int i);
/* The slot of op's kernel choice (DIRECT), or -1; the name of one of its values, or NULL. */
int clattn__param_choice_slot(clattn_op op);
const char *clattn__kernel_choice_name(clattn_op op, int value);
/* Reads "a,b,c" (leading values in order) or "NAME=value,..." (any order and case; "kernel" for
 * DIRECT, whose value may be a kernel name: tiled, direct, rows, ...; decode also takes KG, KL,
 * LANES, LC and KU) into p, which keeps what the text does not set. named_only refuses the
 * positional form. Returns 1, with *count the values set (negative: named); or 0 with the reason
 * in err and p untouched. */
int clattn__params_parse(clattn_op op, const char *text, int named_only, clattn_params *p, int *count,
                         char *err, size_t errsz);
/* The build options of parameters first .. first + count - 1 of p: "-DWGX=8 -DWGY=4 ...", each
 * under its kernel's own -D name (params.h). Returns 0 when buf is too small. */
int clattn__params_defines(clattn_op op, const clattn_params *p, int first, int count, char *buf, size_t size);
/* "WGX=8,WGY=4,...,DIRECT=lanes": the first `count` values of p by name. */
void clattn__params_format(clattn_op op, const clattn_params *p, int count, char *buf, size_t size);
/* The last sources (defaults.c): generic defaults, and vendor defaults by device class (0 when the
 * device has none; *what names them). */
void clattn__generic_defaults(clattn_op op, clattn_params *p);
/* Whether the matrix kernel cannot run on ctx: CLATTN_MATRIX=off, or no backend and no emulation. */
#define clattn__matrix_unavailable(ctx)                                                                   \
    ((ctx)->matrix_mode != CLATTN_MATRIX_EMULATE &&                                                       \
     ((ctx)->matrix_mode == CLATTN_MATRIX_OFF || !(ctx)->matrix_backend))
int clattn__vendor_defaults(const clattn_devinfo *d, clattn_op op, clattn_params *p, const char **what);
/* Parameters for a bucket: override -> CLATTN_PARAMS_<OP> -> user tuning file -> built-in
 * entries -> vendor defaults -> generic defaults. Unset trailing values are 0. */
void clattn__params_for(const clattn_context *ctx, const clattn_bucket *b, clattn_params *p,
                        clattn_params_source *source, char *origin, size_t origin_size);
/* The same, returning where the values came from. */
clattn_params_source clattn__default_params(const clattn_context *ctx, const clattn_bucket *b,
                                            clattn_params *p);
/* Candidate values of parameter i of an op, for clattn-tune (n values into vals). */
int clattn__param_candidates(clattn_op op, int i, const int **vals);

/* ---- tuning store (store.c): the text format ---- */
typedef struct clattn_tuning_entry {
    clattn_op op;
    int dtype, head_dim, mask_kind, sq_class, log2_skv; /* -1: any */
    int n;
    int v[CLATTN_MAX_PARAMS];
} clattn_tuning_entry;

typedef struct clattn_tuning_table {
    char device[512];      /* exact device key, or a name substring when device_is_pattern */
    int device_is_pattern; /* built-in files: "match <substring>" */
    char driver[256];
    clattn_tuning_entry *e;
    int n, cap;
} clattn_tuning_table;

/* 0, or -1 with "line N: why" in err (the table is then empty). */
int clattn__tuning_parse(const char *text, size_t len, clattn_tuning_table *t, char *err,
                         size_t errsz);
int clattn__tuning_put(clattn_tuning_table *t, const clattn_tuning_entry *e); /* add or replace */
/* 1 when two entries are for the same bucket (op, dtype, head_dim, mask, seq_q class, log2 seq_kv). */
int clattn__tuning_same_bucket(const clattn_tuning_entry *a, const clattn_tuning_entry *b);
void clattn__tuning_entry_text(const clattn_tuning_entry *e, char *buf, size_t size);
char *clattn__tuning_format(const clattn_tuning_table *t); /* malloc'ed */
int clattn__tuning_write(const char *path, const clattn_tuning_table *t, char *err, size_t errsz);
void clattn__tuning_free(clattn_tuning_table *t);
/* Context side (tuning.c): reads the user file of the context's device. */
void clattn__tuning_init(clattn_context *ctx);
/* 1 when an embedded source (clattn_kernel_sources) is a built-in tuning table (*.tuning). */
int clattn__is_builtin_table(const char *name);
void clattn__tuning_release(clattn_context *ctx);
int clattn__tuning_file(const clattn_context *ctx, char *buf, size_t size);
int clattn__seq_q_class(int64_t seq_q);
int clattn__log2_ceil(int64_t x);

/* ---- operations ---- */
/* Scores (gemm_tiled.cl, gemm_direct.cl). `scratch` (may be NULL) from element `scratch_off` holds
 * clattn__scores_scratch() bytes for the transposed K of the KT variant: 0 (no scratch, K read
 * tile by tile) when the variant does not run or its copy needs more than `room` bytes. */
uint64_t clattn__scores_scratch(clattn_context *ctx, const clattn_problem *p, uint64_t room);
/* Kᵀ of the problem's K as f32 into scratch (element offset off, one head_dim x pitch block per
 * batch·heads_kv): rows of pitch floats with panel 0 (KT scores), else panels of `panel` keys
 * (a multiple of 16), Kt[z][n / panel][d][n % panel] (fused_direct). kspan non-NULL: only the
 * panels that meet head z's keys [16·kspan[ks_off + 2z], 16·kspan[ks_off + 2z + 1]) (ints; a
 * shared mask's hull of spans, mask_union in mask_pass.cl) are written; kvlen non-NULL (the
 * problem's kv_lengths): only the panels that start below their batch's key length. */
clattn_status clattn__run_transpose_k(clattn_context *ctx, const clattn_problem *p, cl_mem scratch,
                                      uint64_t off, uint64_t pitch, int panel, cl_mem kspan,
                                      cl_ulong ks_off, cl_mem kvlen, cl_uint num_wait,
                                      const cl_event *wait);
clattn_status clattn__run_scores(clattn_context *ctx, const clattn_problem *p, const clattn_view *dst,
                                 cl_mem scratch, uint64_t scratch_off, uint64_t scratch_bytes,
                                 cl_uint num_wait, const cl_event *wait, cl_event *done);
clattn_status clattn__run_softmax(clattn_context *ctx, int64_t batch, int64_t heads,
                                  int64_t rows, int64_t cols, float scale, int causal,
                                  const clattn_view *mask, cl_mem kvlen, const clattn_view *in,
                                  const clattn_view *out, const clattn_view *lse, clattn_dtype in_dt,
                                  const clattn_view *sinks,
                                  cl_uint num_wait, const cl_event *wait, cl_event *done);
/* P·V (gemm_tiled.cl, gemm_direct.cl) of probs and v: the problem's V, or the f32 copy of an f16/bf16 one. Where
 * pv_direct (CPUs) would read f16 or bf16 V, clattn__pv_scratch() bytes (else 0) of a scratch
 * take that copy, written by clattn__run_widen_v from element `off` (widen_v), *vf its view. */
uint64_t clattn__pv_scratch(clattn_context *ctx, const clattn_problem *p);
clattn_status clattn__run_widen_v(clattn_context *ctx, const clattn_problem *p, cl_mem scratch, uint64_t off,
                                  clattn_view *vf, cl_uint num_wait, const cl_event *wait);
clattn_status clattn__run_pv(clattn_context *ctx, const clattn_problem *p, const clattn_view *probs,
                             const clattn_view *v, cl_uint num_wait, const cl_event *wait, cl_event *done);
/* Whether scores with parameters v (SCORES) read K in place (scores_in_place: DIRECT 1 with KT 0,
 * or with few query rows) for seq_q rows against k_bytes of K in all: RM (up to 32 rows) and NS
 * are then unused, and so is KT for few rows. */
int clattn__scores_in_place(const clattn_context *ctx, const int *v, int64_t seq_q, uint64_t k_bytes);
/* Fits a CPU kernel's register tile of rm x ns float16 accumulators (scores_direct, pv_direct,
 * fused_direct over the Kᵀ copy) to the device's vector registers (nreg16, see device.c). */
void clattn__fit_register_tile(const clattn_context *ctx, int *rm, int *ns);
/* The same for the parameters v of a GEMM (op SCORES or PV) whose kernel has a register tile
 * (scores_direct, pv_direct); others are left as they are. */
void clattn__fit_gemm_tile(const clattn_context *ctx, clattn_op op, int *v);
/* fused_direct's scores tile S[rm][ns] over the Kᵀ copy from the parameters RM and NS: rm in 1..32,
 * ns in 1..4, then fitted as above, and rm fewer where the rows' O accumulators for head_dim_v
 * would nearly fill the registers (src/scores.c; clattn-tune compares candidates by it). */
void clattn__fit_fused_tile(const clattn_context *ctx, int64_t head_dim_v, int *rm, int *ns);
/* Whether fused_direct (CPUs) reads K and V in place for this problem (decode, few packed rows
 * per kv head, or long K and V, by the context's vector registers), rather than from a Kᵀ copy:
 * its RM and NS parameters are then unused. seq_kv: the keys a row block streams, the call's
 * seq_kv, or fewer under a window or chunk (clattn__row_keys_max): the copies of a long K and V
 * stay in cache when each row block reads only a window's worth of them. */
int clattn__direct_in_place(const clattn_context *ctx, int64_t rows, int64_t seq_q, int64_t seq_kv,
                            int64_t dk_plus_dv);
/* GPU decode with the vendor or generic defaults (decode_lanes) and 16 or more packed rows per kv
 * head (head_dim and head_dim_v up to 128): the tiled kernel instead, WGX 8, RM 4, the row tile
 * covering the rows up to 64, the defaults' SPLITS (src/defaults.c). v: DECODE's values (at least
 * 7), changed in place; returns whether they changed. */
int clattn__decode_tiled_default(const clattn_context *ctx, int64_t rows, int64_t head_dim,
                                 int64_t head_dim_v, clattn_params_source source, int *v);
/* ---- matrix units (matrix.c) ---- */
/* Reads CLATTN_MATRIX and what the device offers; INVALID_ARGUMENT for a value it does not know. */
clattn_status clattn__matrix_init(clattn_context *ctx);
/* The matrix layout of an AMD device by its name ("gfx90a:sramecc+:xnack-"): 1 MFMA, 2 WMMA, 0
 * none. */
int clattn__amd_layout(const char *name);
int clattn__intel_layout(int has_ext, const size_t *sizes, size_t n, char *why, size_t why_size);
/* work-items a warp of the matrix kernel's layout (64 MFMA, 16 Intel XMX's two, 32 the others) */
int clattn__mma_lanes(int layout);
/* Whether fused attention runs the matrix kernel (fused_mma.cl) although its parameters name
 * another: for the library's own choices (defaults; with CLATTN_MATRIX=emulate also tuned values)
 * where the device has the unit or the emulation is forced: prefill, and decode from 16 packed
 * rows per kv head (fewer leave most of a 16-row fragment empty). Tuned values of other kernels
 * are kept: the tuner compared them with it. dtype: the inputs' type (RDNA3's WMMA takes no f32;
 * an AMD type whose probe failed stays on the FMA kernels). */
int clattn__matrix_auto(const clattn_context *ctx, int dtype, int64_t seq_q, int64_t rows,
                        clattn_params_source source);
/* Gives up the device's backend for this context (its kernel did not build): why, for the report. */
void clattn__matrix_drop(clattn_context *ctx, const char *why);
/* Whether the 16-bit matrix kernel may load its B fragments through ldmatrix (MMA_LDSM): on an
 * NVIDIA backend, probed at the first call that asks (ldsm_probe in cl/fused_mma.cl, on a queue of
 * its own, so that nothing the caller enqueued can hold it up); under emulation ctx->matrix_ldsm. */
int clattn__matrix_ldsm(clattn_context *ctx, int emulate);
/* The tile layer's probe (mma_probe in fused_mma.cl): built for backend (CLATTN_MMA_NONE: the
 * emulation) in layout (0 NVIDIA's, 1 AMD MFMA's, 2 AMD WMMA's: 16-bit types only) and input
 * type dtype (0 f32, 1 f16, 2 bf16), run on
 * one warp on a queue of its own; *bad_lanes the lanes whose products or exchanges differ from
 * the plain ones. */
clattn_status clattn__mma_probe(clattn_context *ctx, int backend, int layout, int dtype, int *bad_lanes);
/* The probe's build options for backend, layout and dtype (those of src/fused_mma.c's kernel). */
void clattn__mma_probe_opts(int backend, int layout, int dtype, char *opts, size_t size);
/* Whether the device's backend passed the probe for dtype (run at the first call of that type,
 * once per context; AMD's backend, which no machine of ours has run, is used only where it
 * passed). */
int clattn__matrix_checked(clattn_context *ctx, int dtype);
/* The probe itself: ldsm_probe built with MMA_NV nv, run on one warp; *bad_lanes the lanes whose
 * ldmatrix fragments differ from the plain loads'. */
clattn_status clattn__ldsm_probe(clattn_context *ctx, int nv, int *bad_lanes);

clattn_status clattn__run_fused(clattn_context *ctx, const clattn_problem *p, cl_uint num_wait,
                                const cl_event *wait, cl_event *done);
clattn_status clattn__run_merge(clattn_context *ctx, int parts, int64_t batch, int64_t heads,
                                int64_t seq, int64_t dv, const clattn_view *part_out,
                                const clattn_view *part_lse, const clattn_view *out,
                                const clattn_view *lse, const clattn_view *sinks, cl_mem cu_q, int total_q,
                                cl_uint num_wait, const cl_event *wait, cl_event *done);

#endif
