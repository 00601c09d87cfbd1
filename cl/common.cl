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
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

inline float bf16_to_f32(ushort x) { return as_float((uint)x << 16); }

inline ushort f32_to_bf16(float x)
{
    uint u = as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((u >> 16) | 0x40u); /* keep NaN a (quiet) NaN */
    u += 0x7fffu + ((u >> 16) & 1u);        /* round to nearest even */
    return (ushort)(u >> 16);
}

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

#if defined(DT_A)
#if DT_A == 0
#define T_A float
#define LD_A(p, i) ((p)[i])
#define LD4_A(p, i) vload4(0, (p) + (i))
#elif DT_A == 1
#define T_A half
#define LD_A(p, i) vload_half((i), (p))
#define LD4_A(p, i) vload_half4(0, (p) + (i))
#else
#define T_A ushort
#define LD_A(p, i) bf16_to_f32((p)[i])
#define LD4_A(p, i) as_float4(convert_uint4(vload4(0, (p) + (i))) << 16)
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

#if defined(DT_MASK)
#if DT_MASK == 0
#define T_MASK float
#define LD_MASK(p, i) ((p)[i])
#else
#define T_MASK half
#define LD_MASK(p, i) vload_half((i), (p))
#endif
#else
#define T_MASK float
#define LD_MASK(p, i) ((p)[i])
#endif

/* Keys visible to batch b: kv_lengths[b] clamped to [0, seq_kv], or seq_kv without the array. */
inline int keys_of_batch(__global const int *kvlen, int b, int seq_kv)
{
    if (!kvlen)
        return seq_kv;
    return clamp(kvlen[b], 0, seq_kv);
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
#define ST4_OUT(p, i, x)                                                        \
    vstore4((ushort4)(f32_to_bf16((x).s0), f32_to_bf16((x).s1), f32_to_bf16((x).s2), \
                      f32_to_bf16((x).s3)), 0, (p) + (i))
#endif
#endif

/* exp2 that vectorises: PoCL (without fast-math, which masks cannot use: they need -inf) turns
 * the built-in exp2 on wide vectors into one library call per lane (3x slower fused attention
 * on AVX-512; on float4 the built-in is the faster one). 2^x = 2^n · e^(f·ln 2) with
 * n = rint(x), |f| <= 1/2, and e^y by its degree-7 Taylor polynomial (|y| <= 0.347: truncation
 * below 6e-9 relative, under float rounding). Exactly 0 below -126 (so -inf gives 0, as masked
 * keys need), +inf above 127, NaN stays NaN. */
#define DEFINE_EXP2(NAME, FT, CONVERT_INT, AS_FLOAT)                                   \
    inline FT NAME(FT x)                                                              \
    {                                                                                 \
        const FT xc = fmin(fmax(x, (FT)(-126.0f)), (FT)(127.0f));                     \
        const FT n = rint(xc);                                                        \
        const FT y = (xc - n) * 0.6931471805599453f;                                  \
        FT p = (FT)(1.0f / 5040.0f);                                                  \
        p = mad(p, y, (FT)(1.0f / 720.0f));                                           \
        p = mad(p, y, (FT)(1.0f / 120.0f));                                           \
        p = mad(p, y, (FT)(1.0f / 24.0f));                                            \
        p = mad(p, y, (FT)(1.0f / 6.0f));                                             \
        p = mad(p, y, (FT)(0.5f));                                                    \
        p = mad(p, y, (FT)(1.0f));                                                    \
        p = mad(p, y, (FT)(1.0f));                                                    \
        FT r = p * AS_FLOAT((CONVERT_INT(n) + 127) << 23);                            \
        r = select(r, (FT)(0.0f), x < (FT)(-126.0f));                                 \
        r = select(r, (FT)(INFINITY), x > (FT)(127.0f));                              \
        return select(r, x, isnan(x));                                                \
    }
DEFINE_EXP2(exp2p, float, convert_int, as_float)
DEFINE_EXP2(exp2p4, float4, convert_int4, as_float4)
DEFINE_EXP2(exp2p8, float8, convert_int8, as_float8)
DEFINE_EXP2(exp2p16, float16, convert_int16, as_float16)
