/* Shared by every clattn kernel: storage-type loads and stores, masking rules.
 *
 * Storage codes (-D DT_<TENSOR>=n): 0 f32, 1 f16 (vload_half/vstore_half: core OpenCL 1.2, no
 * cl_khr_fp16 needed), 2 bf16 (upper half of a binary32). Arithmetic is always fp32.
 * Tensor views arrive as (pointer, element offset, batch/head/seq strides) in elements. */

#define NEG_INF (-INFINITY)

/* a·b + c in one rounding where the device has a hardware FMA (-DHAS_FMA=1, from
 * CL_DEVICE_SINGLE_FP_CONFIG); PoCL does not contract mad() on vectors by itself. */
#if HAS_FMA
#define MAD(a, b, c) fma((a), (b), (c))
#else
#define MAD(a, b, c) mad((a), (b), (c))
#endif
/* The larger of a and b lane by lane, where a never holds NaN and a NaN in b is skipped: one
 * compare and one blend (fmax must also test a, which PoCL compiles to twice the work). */
#define MAX_SKIP_NAN(a, b) select((a), (b), (b) > (a))
#define LOG2E 1.4426950408889634f
/* How many float16 values the device's vector registers hold (-DNREG16, from the host: see
 * clattn__nreg16 in src/device.c): 32 with AVX-512's 32 zmm, 8 with AVX/AVX2's 16 ymm, 4 with
 * SSE's 16 xmm; GPUs, where the CPU register tiles below are not used, get 32. The CPU kernels
 * size their register tiles by it: a tile that does not fit spills every accumulator to the
 * stack at every multiply-add. */
#ifndef NREG16
#define NREG16 32
#endif
#define LN2 0.6931471805599453f

/* Which kernels of a file a program holds. The host builds with -DKSEL=1 and -DK_<name>=1 for each
 * kernel it will create from that program (K_mask for mask_pass.cl's three kernels, K_widen for
 * layout.cl's two widen kernels): every kernel a program holds is compiled, PoCL's for the binary
 * the library caches (all of them, each for any work-group size), a GPU driver's at
 * clBuildProgram, and the kernels of a file often serve different paths. Without KSEL
 * a program holds every kernel of its file (tests/ptx_check.sh, builds by hand). */
#ifndef KSEL
#define KSEL 0
#endif

/* Token pasting after macro expansion: CAT(float, VW) is float4 with VW 4. */
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* Work-group index in grid y or z. A launch with more work-groups there than the device takes
 * (NVIDIA: 65535) runs in chunks with a global offset (clattn__enqueue, util.c): get_global_id
 * counts the offset, get_group_id does not. Grid x is never chunked. */
/* (In 32 bits: grids y and z stay below 2^31 work-items, and a 64-bit division is slow on GPUs.) */
#define GROUP_ID(d) ((int)((uint)(get_global_id(d) - get_local_id(d)) / (uint)get_local_size(d)))

/* The CPU kernels that reuse a head's K or V across work-groups (fused_direct, fused_lanes,
 * scores_direct, scores_in_place, pv_direct: one work-item a work-group) run on a grid
 * flattened into x, its fastest dimension first: work-item x of a grid of tiles nx x ny x nz
 * takes tile (x % nx, x / nx % ny, x / (nx·ny)). A grid with more than one work-group in y or z,
 * or a chunk of one with an offset there (clattn__enqueue), is the 3D one (the host keeps it past
 * INT_MAX work-groups), whose indices these return too.
 * Flat, so that consecutive work-groups share a head's K and V in cache: Intel's CPU runtime
 * interleaves the heads of a 3D grid (fused H8 Sq1024 10.3 ms against 8.3 for the same work).
 * The index is get_group_id(0): from get_global_id(0) Intel's compiler took 430 s, not 14.
 * See docs/measurements.md#flat-grid. */
#define FLAT_GRID()                                                                              \
    (get_global_size(1) == 1 && get_global_size(2) == 1 && get_global_offset(1) == 0 &&          \
     get_global_offset(2) == 0)
/* Both grids: the 3D one has exactly nx work-groups in x (never chunked), so % nx keeps it. */
#define TILE_X(nx) ((int)((uint)get_group_id(0) % (uint)(nx)))
#define TILE_Y(nx, ny)                                                                           \
    (FLAT_GRID() ? (int)((uint)get_group_id(0) / (uint)(nx) % (uint)(ny)) : GROUP_ID(1))
#define TILE_Z(nx, ny)                                                                           \
    (FLAT_GRID() ? (int)((uint)get_group_id(0) / (uint)(nx) / (uint)(ny)) : GROUP_ID(2))

inline float bf16_to_f32(ushort x) { return as_float((uint)x << 16); }

inline ushort f32_to_bf16(float x)
{
    uint u = as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((u >> 16) | 0x40u); /* keep NaN a (quiet) NaN */
    u += 0x7fffu + ((u >> 16) & 1u);        /* round to nearest even */
    return (ushort)(u >> 16);
}

/* f32_to_bf16 of 4, 8 or 16 values at once, as vector operations. CPU compilers kept the scalar
 * form scalar, and a narrowing convert_ushort16 became 16 extractions and 16-bit stores on PoCL
 * 3.1: bf16 softmax and scores spent most of their time there (see softmax.cl). The rounded
 * values' 16-bit halves are picked out as the even (little-endian) or odd lanes instead. */
#ifdef __ENDIAN_LITTLE__
#define BF16_PICK(v) (v).even
#else
#define BF16_PICK(v) (v).odd
#endif
#define BF16_ROUNDED(u) select(((u) + 0x7fffu + (((u) >> 16) & 1u)) >> 16, ((u) >> 16) | 0x40u, \
                               ((u) & 0x7fffffffu) > 0x7f800000u)
inline ushort4 f32_to_bf16_4(float4 x) { return BF16_PICK(as_ushort8(BF16_ROUNDED(as_uint4(x)))); }
inline ushort8 f32_to_bf16_8(float8 x) { return BF16_PICK(as_ushort16(BF16_ROUNDED(as_uint8(x)))); }
inline ushort16 f32_to_bf16_16(float16 x)
{
    return (ushort16)(f32_to_bf16_8(x.lo), f32_to_bf16_8(x.hi));
}

/* Vectors of 4 or 16 bf16 values stored at p (2-byte aligned). PoCL 3.1 made vstore4 and vstore16
 * of ushort one 16-bit store per element; through a vector type aligned to its element (a clang
 * extension) the store is one instruction (vpmovdw to memory). CPU devices only (CPU_DEVICE, from
 * the host): a GPU compiler that kept the vector's own alignment would fault there. */
#if defined(CPU_DEVICE) && CPU_DEVICE && defined(__clang__)
typedef ushort4 ushort4_a2 __attribute__((aligned(2)));
typedef ushort16 ushort16_a2 __attribute__((aligned(2)));
#define ST_BF16X4(p, x) (*(__global ushort4_a2 *)(p) = (x))
#define ST_BF16X16(p, x) (*(__global ushort16_a2 *)(p) = (x))
#else
#define ST_BF16X4(p, x) vstore4((x), 0, (p))
#define ST_BF16X16(p, x) vstore16((x), 0, (p))
#endif

/* One block of macros per tensor role: T_<role> is the pointer element type,
 * LD_<role>(p, i) loads element i as float, LD4_<role>(p, i) loads 4 consecutive elements,
 * ST_<role>(p, i, x) stores. */

#if defined(DT_IN)
#if DT_IN == 0
#define T_IN float
#define LD_IN(p, i) ((p)[i])
#define LD4_IN(p, i) vload4(0, (p) + (i))
#elif DT_IN == 1
#define T_IN half
#define LD_IN(p, i) vload_half((i), (p))
#define LD4_IN(p, i) vload_half4(0, (p) + (i))
#else
#define T_IN ushort
#define LD_IN(p, i) bf16_to_f32((p)[i])
#define LD4_IN(p, i) as_float4(convert_uint4(vload4(0, (p) + (i))) << 16)
#endif
#endif

#if defined(DT_IN)
/* 16 consecutive elements as float16; the tail form zero-fills past element n of the row. */
#if DT_IN == 0
#define LD16_IN(p, i) vload16(0, (p) + (i))
#elif DT_IN == 1
#define LD16_IN(p, i) vload_half16(0, (p) + (i))
#else
#define LD16_IN(p, i) as_float16(convert_uint16(vload16(0, (p) + (i))) << 16)
#endif

inline float16 ld16_tail(__global const T_IN *p, int col, int n)
{
    float t[16];
    for (int e = 0; e < 16; e++)
        t[e] = col + e < n ? LD_IN(p, col + e) : 0.0f;
    return vload16(0, t);
}

#if defined(DP16)
/* Scores with K read in place, on CPUs (fused_direct with IN_PLACE in fused_direct.cl,
 * scores_in_place in gemm_direct.cl): a query row is held as DP16 = 16·ceil(head_dim / 16)
 * floats, zero past head_dim, so that a key's dot product is a sum of float16 products whose 16
 * lanes are added at the end (hsum16x16, for 16 keys at once). KV_FULL 1 when head_dim (and
 * head_dim_v) are multiples of 16: no tail loads. qk16_row and qk16_tile, which read the K rows,
 * are in kv_access.cl. */
typedef union qrow {
    float f[DP16];
    float16 v[DP16 / 16];
} qrow;

/* Elements col..col+15 of a K or V row of n elements, 0 past n. */
inline float16 ld16_row(__global const T_IN *p, int col, int n)
{
#if !KV_FULL
    if (col + 15 >= n)
        return ld16_tail(p, col, n);
#endif
    return LD16_IN(p, col);
}

/* Lane e of the result is the sum of the 16 lanes of t[e]: four rounds of pairwise sums, each
 * halving the vectors (two shuffles and an add per output vector). */
inline float16 hsum16x16(const float16 *t)
{
    float16 w[8], x[4], y[2];
#pragma unroll
    for (int k = 0; k < 8; k++)
        w[k] = (float16)(t[2 * k].even, t[2 * k + 1].even) + (float16)(t[2 * k].odd, t[2 * k + 1].odd);
#pragma unroll
    for (int k = 0; k < 4; k++)
        x[k] = (float16)(w[2 * k].even, w[2 * k + 1].even) + (float16)(w[2 * k].odd, w[2 * k + 1].odd);
#pragma unroll
    for (int k = 0; k < 2; k++)
        y[k] = (float16)(x[2 * k].even, x[2 * k + 1].even) + (float16)(x[2 * k].odd, x[2 * k + 1].odd);
    return (float16)(y[0].even, y[1].even) + (float16)(y[0].odd, y[1].odd);
}

/* qk16_tile's register tile: QT_R rows by QT_E keys of float16 accumulators, plus QT_E K
 * vectors: 4 x 4 where the registers hold 32 float16 (AVX-512), 2 x 2 where they hold 8
 * (AVX2: 8 accumulators, 4 K vectors and a Q vector in 16 ymm, where 4 x 4 spilled every
 * accumulator at every multiply-add). K of a KV-cache type (DT_K 3-7, kv_access.cl) with rows in
 * fours takes 4 x 1 there: each K vector decoded once for 4 rows rather than twice (see
 * docs/measurements.md#kv-cache). */
#if NREG16 >= 32
#define QT_R 4
#define QT_E 4
#elif defined(DT_K) && DT_K >= 3 && defined(RM) && RM % 4 == 0
#define QT_R 4
#define QT_E 1
#else
#define QT_R 2
#define QT_E 2
#endif
/* Whether rm query rows (a constant) take qk16_tile, in tiles of QT_R rows, rather than qk16_row
 * row by row: several rows read each K row (grouped-query heads, prefill rows) and QT_R divides
 * them; with 32 float16 registers from 8 rows (two tiles), with 8 (AVX2) from 2 (AVX2 decode of
 * 2 rows: 2.55 ms against 2.91 with qk16_row). See docs/measurements.md#qk-tile-for. */
#if NREG16 >= 32
#define QK_TILE_FOR(rm) ((rm) >= 8 && (rm) % 4 == 0)
#else
#define QK_TILE_FOR(rm) ((rm) % QT_R == 0)
#endif

#endif
#endif

#if defined(DT_A)
#if DT_A == 0
#define T_A float
#define LD_A(p, i) ((p)[i])
#define LD4_A(p, i) vload4(0, (p) + (i))
#define LD16_A(p, i) vload16(0, (p) + (i))
#elif DT_A == 1
#define T_A half
#define LD_A(p, i) vload_half((i), (p))
#define LD4_A(p, i) vload_half4(0, (p) + (i))
#define LD16_A(p, i) vload_half16(0, (p) + (i))
#else
#define T_A ushort
#define LD_A(p, i) bf16_to_f32((p)[i])
#define LD4_A(p, i) as_float4(convert_uint4(vload4(0, (p) + (i))) << 16)
#define LD16_A(p, i) as_float16(convert_uint16(vload16(0, (p) + (i))) << 16)
#endif
#endif

#if defined(DT_OUT)
#if DT_OUT == 0
#define T_OUT float
#define LD_OUT(p, i) ((p)[i])
#define ST_OUT(p, i, x) ((p)[i] = (x))
#elif DT_OUT == 1
#define T_OUT half
#define LD_OUT(p, i) vload_half((i), (p))
#define ST_OUT(p, i, x) vstore_half_rte((x), (i), (p))
#else
#define T_OUT ushort
#define LD_OUT(p, i) bf16_to_f32((p)[i])
#define ST_OUT(p, i, x) ((p)[i] = f32_to_bf16(x))
#endif
#endif

#if defined(DT_MASK) && DT_MASK != 0
#define T_MASK half
#define LD_MASK(p, i) vload_half((i), (p))
#define LD16_MASK(p, i) vload_half16(0, (p) + (i)) /* elements i .. i+15 */
#else
#define T_MASK float
#define LD_MASK(p, i) ((p)[i])
#define LD16_MASK(p, i) vload16(0, (p) + (i))
#endif

/* Keys visible to batch b: kv_lengths[b] clamped to [0, seq_kv], or seq_kv without the array. */
inline int keys_of_batch(__global const int *kvlen, int b, int seq_kv)
{
    if (!kvlen)
        return seq_kv;
    return clamp(kvlen[b], 0, seq_kv);
}

/* Sequence b of a packed (varlen) batch, FlashAttention's cu_seqlens: its first row cu[b] and its
 * length cu[b + 1] - cu[b], clamped to [0, max] and to the rows [0, total) of the packed tensor
 * (a first row outside it: no rows), so that no row outside the view is read or written. */
inline int2 packed_seq(__global const int *cu, int b, int max, int total)
{
    const int s0 = cu[b];
    if (s0 < 0 || s0 >= total)
        return (int2)(0, 0);
    const long n = clamp((long)cu[b + 1] - (long)s0, 0L, (long)min(max, total - s0));
    return (int2)(s0, (int)n);
}

/* The causal rule, written once: bottom-right aligned, row i of seq_q sees key j iff
 * j <= i + (L - seq_q), where L is the number of keys of the batch. Returns one past the last
 * visible key of row i (may be <= 0: no key). */
inline int causal_end(int causal, int i, int seq_q, int L)
{
    return causal ? min(L, i + 1 + (L - seq_q)) : L;
}

#if defined(DT_OUT)
#if DT_OUT == 0
#define ST4_OUT(p, i, x) vstore4((x), 0, (p) + (i))
#elif DT_OUT == 1
#define ST4_OUT(p, i, x) vstore_half4_rte((x), 0, (p) + (i))
#else
#define ST4_OUT(p, i, x) ST_BF16X4((p) + (i), f32_to_bf16_4(x))
#endif
/* Stores x at columns col..col+3 of a row of n elements, those past n left alone. */
inline void store4_row(__global T_OUT *p, int col, float4 x, int n)
{
    if (col + 3 < n) {
        ST4_OUT(p, col, x);
    } else {
        const float xs[4] = {x.s0, x.s1, x.s2, x.s3};
        for (int e = 0; e < 4 && col + e < n; e++)
            ST_OUT(p, col + e, xs[e]);
    }
}
#endif

/* O from its accumulator, which every kernel that sums weights·V keeps at half scale: the
 * weights, rounded, can sum to a few ulp over 1, and V rows at ±FLT_MAX (all of one sign) then
 * overflowed to ±Inf (or NaN, Inf - Inf, in a later rescaling) where the exact result is a
 * convex combination of V rows, at most FLT_MAX. At half scale the sums stay finite; doubling is
 * exact, and where only the doubling overflows (the half was finite, so every V was) the result
 * is ±FLT_MAX. An Inf in a visible V row made the half Inf already, and stays Inf; NaN stays. */
#define O_WEIGHT 0.5f
#define DEFINE_O_FROM_HALF(NAME, FT)                                                             \
    inline FT NAME(FT h)                                                                         \
    {                                                                                            \
        const FT o = h + h;                                                                      \
        return select(o, copysign((FT)(FLT_MAX), h), isinf(o) & isfinite(h));                    \
    }
DEFINE_O_FROM_HALF(o_from_half, float)
DEFINE_O_FROM_HALF(o_from_half4, float4)
DEFINE_O_FROM_HALF(o_from_half8, float8)
DEFINE_O_FROM_HALF(o_from_half16, float16)

/* The weight p of a key whose score is -inf (hidden by the mask, the key length or causality): -0,
 * which P·V skips (IS_HIDDEN) so that NaN or Inf in the key's V never reach O. A visible key whose
 * weight underflows to +0 is multiplied like any other: NaN in its V makes the row NaN, as in
 * exact arithmetic (0·NaN) and the float64 reference. p·(1/l) keeps the sign of -0. */
#define HIDDEN_P (-0.0f)
#define IS_HIDDEN(p) (as_uint(p) == 0x80000000u)
#define IS_HIDDEN16(p) (as_uint16(p) == (uint16)(0x80000000u)) /* lane by lane: -1 where hidden */

/* 2^x for x <= 8 (every caller passes a score minus a running reference: the row maximum, or
 * in fused_direct a reference that trails it by at most 8 in log2 units), in a form that
 * vectorises: PoCL (without fast-math, which masks cannot use: they need -inf) turns the
 * built-in exp2 on wide vectors into one library call per lane. 2^x = 2^n · 2^f with n an
 * integer next to x: k = (int)(x + 127.5) is n + 127, the biased exponent of 2^n, so shifted
 * into the exponent field it gives 2^n, and f = x - n, exact, is within [-1/2, 1/2] (a few
 * 2^-17 past it where the sum rounds up to an integer). 2^f is a degree-6 polynomial fitted for
 * relative error on [-1/2, 1/2] (2e-9), evaluated with MAD: at most 1.04 ulp on [-126, 8].
 * Below -126.5 (and at -inf) k is 0, so the result is exactly 0, as masked keys need. NaN stays
 * NaN: the clamp is a select that lets it through, and f is NaN whatever the conversion makes of
 * it. x up to 127 still works; nothing guards larger ones. n comes from a conversion, which
 * truncates whatever the precision (PoCL on 32-bit x86 computes in x87 precision).
 * See docs/measurements.md#exp2p. */
#define DEFINE_EXP2(NAME, FT, IT, CONVERT_INT, CONVERT_FLOAT, AS_UINT, AS_FLOAT)      \
    inline FT NAME(FT x)                                                              \
    {                                                                                 \
        const FT xc = select(x, (FT)(-127.0f), x < (FT)(-127.0f));                    \
        const IT k = CONVERT_INT(xc + (FT)(127.5f));                                  \
        const FT f = xc - (CONVERT_FLOAT(k) - (FT)(127.0f));                          \
        FT p = (FT)(1.535335904918611e-4f);                                           \
        p = MAD(p, f, (FT)(1.3398876180872321e-3f));                                  \
        p = MAD(p, f, (FT)(9.61843691766262e-3f));                                    \
        p = MAD(p, f, (FT)(5.5503323674201965e-2f));                                  \
        p = MAD(p, f, (FT)(0.24022647738456726f));                                    \
        p = MAD(p, f, (FT)(0.6931471824645996f));                                     \
        p = MAD(p, f, (FT)(1.0f));                                                    \
        return p * AS_FLOAT(AS_UINT(k) << 23);                                        \
    }
DEFINE_EXP2(exp2p, float, int, convert_int, convert_float, as_uint, as_float)
DEFINE_EXP2(exp2p4, float4, int4, convert_int4, convert_float4, as_uint4, as_float4)
DEFINE_EXP2(exp2p8, float8, int8, convert_int8, convert_float8, as_uint8, as_float8)
DEFINE_EXP2(exp2p16, float16, int16, convert_int16, convert_float16, as_uint16, as_float16)
