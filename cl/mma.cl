/* The matrix-unit tile layer: fragments of the warp-level products C += A·B in the layouts of
 * mma_layout.cl, loaded from local memory, multiplied, and exchanged between the lanes that share
 * a row, so that a kernel is written once (fused_mma.cl) and runs on every backend:
 *
 *   MMA_NV 1: NVIDIA (compute capability 8.0 and up), inline PTX: mma.sync.aligned m16n8k16 f16
 *             and bf16 with f32 accumulation, m16n8k8 tf32; shfl.sync for the row exchanges.
 *   MMA_NV 0: emulation in plain OpenCL C, for tests and for checking a device, never for speed.
 *             Each work-item plays one lane with the same ownership; a product goes through
 *             local memory between two barriers (PoCL has no sub-groups), so every call that
 *             multiplies or exchanges must be reached by the whole work-group alike.
 *
 * The element type follows DT_IN: f16 (1) and bf16 (2) as m16n8k16 with the values' bits in
 * local memory (TL ushort: no cl_khr_fp16 needed); f32 (0) as tf32 m16n8k8 (TL float), by
 * default as 3xTF32 (MMA_3X 1): each operand a = big + small, big = tf32(a) and small =
 * tf32(a - big) (round to nearest, ties away: cvt.rna), the products big·big in one accumulator
 * and small·big + big·small in another, added when the value is read (mma_c_value); folding the
 * small products into the big accumulator at once loses most of the gain. MMA_3X 0: one tf32
 * product (10-bit mantissas), meant as an opt-in that the API does not offer yet (src/fused_mma.c
 * always builds 3xTF32).
 *
 * MMA_LDSM 1 (16-bit types, the host's when its probe on the device passed): B fragments through
 * ldmatrix (two tiles a load: mma_load_b_pair for K, mma_load_b_km_pair with .trans for V kept
 * row by row); under emulation the same calls take the plain loads.
 *
 * The kernel works with the types mma_a, mma_b (operand fragments) and mma_c (an accumulator,
 * MMA_CE floats a lane, two of them with 3xTF32), the loads, mma_p_pack, and the macros MMA,
 * MMA_XOR2 and MMA_IDX4, which under emulation use the kernel's `mctx` (mma_ctx: the lane, the
 * work-item's index and the local scratch) and on NVIDIA nothing but their arguments. */

/* Loops over fragments: unrolled on GPUs (fragment arrays must stay in registers), rolled under
 * emulation, where unrolled products would copy their barriers and PoCL compiles for minutes. */
#if MMA_NV
#define MMA_UNROLL _Pragma("unroll")
#else
#define MMA_UNROLL _Pragma("unroll 1")
#endif

#if DT_IN == 0
#define MMA_K MMA8_K
#define MMA_AE MMA8_AE
#define MMA_BE MMA8_BE
#define MMA_A_ROW MMA8_A_ROW
#define MMA_A_COL MMA8_A_COL
#define MMA_B_ROW MMA8_B_ROW
#define MMA_B_COL MMA8_B_COL
#define MMA_P_TILE MMA8_P_TILE
#define MMA_P_ELEM MMA8_P_ELEM
#define MMA_P_KEY MMA8_P_KEY
#define TL float
#define MMA_PAD 4 /* row pitch ≡ 4 words (mod 32): the 8 rows x 4 lanes of a load hit 32 banks */
#ifndef MMA_3X
#define MMA_3X 1
#endif
#else
#define MMA_K MMA16_K
#define MMA_AE MMA16_AE
#define MMA_BE MMA16_BE
#define MMA_A_ROW MMA16_A_ROW
#define MMA_A_COL MMA16_A_COL
#define MMA_B_ROW MMA16_B_ROW
#define MMA_B_COL MMA16_B_COL
#define MMA_P_TILE MMA16_P_TILE
#define MMA_P_ELEM MMA16_P_ELEM
#define MMA_P_KEY MMA16_P_KEY
#define TL ushort
#define MMA_PAD 8 /* 8 halves: the same 4 words */
#define MMA_3X 0
#endif
#define MMA_PARTS (MMA_3X ? 2 : 1)
#if !defined(MMA_LDSM) || DT_IN == 0
#undef MMA_LDSM
#define MMA_LDSM 0 /* ldmatrix moves 16-bit elements only */
#endif

/* An element of local memory as float. */
inline float tl_to_f(__local const TL *p)
{
#if DT_IN == 0
    return *p;
#elif DT_IN == 1
    return vload_half(0, (__local const half *)p);
#else
    return bf16_to_f32(*p);
#endif
}

/* The tf32 part of x (its upper 19 bits: what the tf32 mma reads of a register) is x rounded to
 * nearest, ties away from zero, as cvt.rna.tf32.f32 does, after tf32_clamp: finite values past
 * the largest tf32 number (0x7f7fe000), which cvt.rna would take to Inf (and the remainder of
 * 3xTF32 to -Inf), are cut to it, so the split x = big + small stays finite for every finite x.
 * NaN and Inf pass. The GPU rounds with cvt.rna (cvt_tf32), the emulation with tf32_big. */
inline float tf32_clamp(float x)
{
    const float m = as_float(0x7f7fe000u);
    return fabs(x) > m && !isinf(x) ? copysign(m, x) : x;
}

inline float tf32_big(float x)
{
    const float y = tf32_clamp(x);
    return isnan(y) ? y : as_float((as_uint(y) + 0x1000u) & 0xffffe000u);
}

#if MMA_NV
/* ---------------------------------------------------------------- NVIDIA: inline PTX */
#if DT_IN == 0
#if MMA_3X
typedef struct { uint4 big, small; } mma_a;
typedef struct { uint2 big, small; } mma_b;
typedef float8 mma_c; /* .lo: big·big, .hi: the small products */
#else
typedef uint4 mma_a;
typedef uint2 mma_b;
typedef float4 mma_c;
#endif
#else
typedef uint4 mma_a;
typedef uint2 mma_b;
typedef float4 mma_c;
#endif

inline uint lds32(__local const TL *p) { return *(__local const uint *)p; }

/* 2^x for the softmax's weights: ex2.approx.ftz.f32, one MUFU.EX2 (relative error below 2^-22;
 * results under 2^-126 flushed to 0, which no weight beside the row's maximum of 1 can show;
 * -inf gives 0, NaN NaN). libclc's exp2 took 33 instructions, a division among them, 64 % of the
 * f16 d64 main loop in SASS (docs/measurements.md#fused-mma). The conversions and products are
 * plain asm (no volatile): pure, so that ptxas and the compiler may schedule them. */
inline float mma_exp2(float x)
{
    float r;
    __asm__("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

/* tf32_big on the GPU, as the register the mma reads. */
inline uint cvt_tf32(float x)
{
    uint r;
    __asm__("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(tf32_clamp(x)));
    return r;
}

/* The 3xTF32 remainder x - big as tf32 (0 for x = ±Inf, whose big part carries it). */
#define TF32_SMALL(x, big) cvt_tf32(isinf(x) ? 0.0f : (x) - as_float(big))

#if DT_IN == 0
/* An A fragment of tf32 values from 4 floats: their tf32 parts, and with 3xTF32 the remainders. */
inline mma_a tf32_a(const float *x)
{
    const uint4 big = (uint4)(cvt_tf32(x[0]), cvt_tf32(x[1]), cvt_tf32(x[2]), cvt_tf32(x[3]));
#if MMA_3X
    mma_a a;
    a.big = big;
    a.small = (uint4)(TF32_SMALL(x[0], big.s0), TF32_SMALL(x[1], big.s1), TF32_SMALL(x[2], big.s2),
                      TF32_SMALL(x[3], big.s3));
    return a;
#else
    return big;
#endif
}
#endif

/* Two floats as one register of two 16-bit values, lo in the low half (cvt puts its first
 * source operand in the high half). */
inline uint pack2(float lo, float hi)
{
    uint r;
#if DT_IN == 1
    __asm__("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    __asm__("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

/* The product's PTX shape and types for DT_IN. */
#if DT_IN == 0
#define MMA_PTX "m16n8k8.row.col.f32.tf32.tf32.f32"
#elif DT_IN == 1
#define MMA_PTX "m16n8k16.row.col.f32.f16.f16.f32"
#else
#define MMA_PTX "m16n8k16.row.col.f32.bf16.bf16.f32"
#endif
inline float4 mma1(float4 c, uint4 a, uint2 b)
{
    float c0 = c.s0, c1 = c.s1, c2 = c.s2, c3 = c.s3;
    __asm__("mma.sync.aligned." MMA_PTX " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
            : "r"(a.s0), "r"(a.s1), "r"(a.s2), "r"(a.s3), "r"(b.s0), "r"(b.s1));
    return (float4)(c0, c1, c2, c3);
}

/* The A fragment of the 16 x MMA_K block at p (row-major, pitch elements a row; p and pitch
 * keep 32-bit alignment). */
inline mma_a mma_load_a(__local const TL *p, int pitch, int lane)
{
#if DT_IN == 0
    float x[MMA_AE];
    MMA_UNROLL
    for (int e = 0; e < MMA_AE; e++)
        x[e] = p[MMA_A_ROW(lane, e) * pitch + MMA_A_COL(lane, e)];
    return tf32_a(x);
#else
    uint r[4];
    MMA_UNROLL
    for (int j = 0; j < 4; j++)
        r[j] = lds32(p + MMA_A_ROW(lane, 2 * j) * pitch + MMA_A_COL(lane, 2 * j));
    return (uint4)(r[0], r[1], r[2], r[3]);
#endif
}

/* The B fragment of the MMA_K x 8 block stored n-major at p: element (k, n) at p[n·pitch + k].
 * With `keys` (mma_load_b_pv) the k index stands for key MMA_P_KEY(k), as in P's fragment. */
inline mma_b mma_load_b_(__local const TL *p, int pitch, int lane, int keys)
{
#if DT_IN == 0
    float x[MMA_BE];
    MMA_UNROLL
    for (int e = 0; e < MMA_BE; e++) {
        const int k = MMA_B_ROW(lane, e);
        x[e] = p[MMA_B_COL(lane, e) * pitch + (keys ? MMA_P_KEY(k) : k)];
    }
    const uint2 big = (uint2)(cvt_tf32(x[0]), cvt_tf32(x[1]));
#if MMA_3X
    mma_b b;
    b.big = big;
    b.small = (uint2)(TF32_SMALL(x[0], big.s0), TF32_SMALL(x[1], big.s1));
    return b;
#else
    return big;
#endif
#else
    (void)keys; /* m16n8k16: keys in order */
    return (uint2)(lds32(p + MMA_B_COL(lane, 0) * pitch + MMA_B_ROW(lane, 0)),
                   lds32(p + MMA_B_COL(lane, 2) * pitch + MMA_B_ROW(lane, 2)));
#endif
}

#if DT_IN != 0
/* Element (k, n) of a B fragment stored k-major at p (V's rows: p[k·pitch + n]), 16-bit values
 * read one at a time and paired (the fallback of ldmatrix's .trans). */
inline mma_b mma_load_b_km(__local const TL *p, int pitch, int lane)
{
    uint r[2];
    MMA_UNROLL
    for (int j = 0; j < 2; j++) {
        const int k = MMA_B_ROW(lane, 2 * j), n = MMA_B_COL(lane, 2 * j);
        r[j] = (uint)p[k * pitch + n] | (uint)p[(k + 1) * pitch + n] << 16;
    }
    return (uint2)(r[0], r[1]);
}
#endif

#if MMA_LDSM
/* ldmatrix .x4: each lane gives one row address (mma_layout.cl, LDSM_*), the shared window's
 * 32-bit address of a __local pointer; the probe (clattn__matrix_ldsm) checks on the device that
 * these give the fragments of the plain loads before any kernel uses them. "memory": the loads
 * must stay between the barriers around them. */
#define DEFINE_LDSM(NAME, SHAPE)                                                                 \
    inline uint4 NAME(__local const TL *p)                                                       \
    {                                                                                            \
        uint4 r;                                                                                 \
        __asm__ volatile("ldmatrix.sync.aligned." SHAPE ".shared.b16 {%0,%1,%2,%3}, [%4];"      \
                         : "=r"(r.s0), "=r"(r.s1), "=r"(r.s2), "=r"(r.s3)                        \
                         : "r"((uint)(size_t)p)                                                  \
                         : "memory");                                                            \
        return r;                                                                                \
    }
DEFINE_LDSM(ldsm_x4, "m8n8.x4")
DEFINE_LDSM(ldsm_x4_trans, "m8n8.x4.trans")
/* S's B fragments of the n-tiles at p and p + 8·pitch (K stored n-major), one ldmatrix. */
inline void mma_load_b_pair(__local const TL *p, int pitch, int lane, mma_b *b0, mma_b *b1)
{
    const uint4 r = ldsm_x4(p + MMA_LDSM_K_ROW(lane) * pitch + MMA_LDSM_K_COL(lane));
    *b0 = r.s01;
    *b1 = r.s23;
}
/* P·V's B fragments of columns p .. p + 7 and p + 8 .. p + 15 of V stored k-major; with `one`,
 * the first only (the second tile's lanes read the first's rows). */
inline void mma_load_b_km_pair(__local const TL *p, int pitch, int lane, int one, mma_b *b0, mma_b *b1)
{
    const uint4 r = ldsm_x4_trans(p + MMA_LDSM_V_ROW(lane) * pitch + (one ? 0 : MMA_LDSM_V_COL(lane)));
    *b0 = r.s01;
    *b1 = r.s23;
}
#endif

inline mma_c mma_op(mma_c c, mma_a a, mma_b b)
{
#if DT_IN == 0 && MMA_3X
    c.hi = mma1(c.hi, a.small, b.big);
    c.hi = mma1(c.hi, a.big, b.small);
    c.lo = mma1(c.lo, a.big, b.big);
    return c;
#else
    return mma1(c, a, b);
#endif
}

/* P's A fragment of one k-block from the probabilities of S's n-tiles t0 and t1 (t1 unused
 * with m16n8k8): element e from element P_ELEM(e) of tile P_TILE(0, e) (mma_layout.cl). */
inline mma_a mma_p_pack(float4 t0, float4 t1)
{
    const float c[2][4] = {{t0.s0, t0.s1, t0.s2, t0.s3}, {t1.s0, t1.s1, t1.s2, t1.s3}};
    float x[MMA_AE];
    MMA_UNROLL
    for (int e = 0; e < MMA_AE; e++)
        x[e] = c[MMA_P_TILE(0, e)][MMA_P_ELEM(e)];
#if DT_IN == 0
    return tf32_a(x);
#else
    /* Register j: elements 2j (low half) and 2j + 1. */
    return (uint4)(pack2(x[0], x[1]), pack2(x[2], x[3]), pack2(x[4], x[5]), pack2(x[6], x[7]));
#endif
}

/* The rows' exchanges: v of lane (lane ^ x) (the row's reductions, x 1 and 2: the 4 lanes of a
 * row), or of lane x (the exact path's weights). */
inline float2 shfl_xor2(float2 v, int x)
{
    uint a, b;
    __asm__ volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(a) : "r"(as_uint(v.x)), "r"(x));
    __asm__ volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(b) : "r"(as_uint(v.y)), "r"(x));
    return (float2)(as_float(a), as_float(b));
}

inline float4 shfl_idx4(float4 v, int x)
{
    uint r[4];
    const uint u[4] = {as_uint(v.s0), as_uint(v.s1), as_uint(v.s2), as_uint(v.s3)};
    MMA_UNROLL
    for (int i = 0; i < 4; i++)
        __asm__ volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r[i]) : "r"(u[i]), "r"(x));
    return as_float4((uint4)(r[0], r[1], r[2], r[3]));
}
#define MMA(c, a, b) mma_op((c), (a), (b))
#define MMA_XOR2(v, m) shfl_xor2((v), (m))
#define MMA_IDX4(v, src) shfl_idx4((v), (src))
#define MMA_SCRATCH_FLOATS(nw) 0

#else
/* ---------------------------------------------------------------- emulation */
/* Fragments as floats (values already of the element type), the small parts after the big. */
typedef struct { float v[MMA_AE * MMA_PARTS]; } mma_a;
typedef struct { float v[MMA_BE * MMA_PARTS]; } mma_b;
#if MMA_3X
typedef float8 mma_c;
#else
typedef float4 mma_c;
#endif

/* The emulation's context: the lane, the work-item's index in the group, the warp's scratch
 * (A, then B, each with its small part: MMA_WARP_FLOATS) and the exchange slots (a float4 per
 * work-item). */
typedef struct {
    int lane, lid;
    __local float *scr;
    __local float4 *xch;
} mma_ctx;
#define MMA_WARP_FLOATS (MMA_PARTS * (MMA_M * MMA_K + MMA_K * MMA_N))
#define MMA_SCRATCH_FLOATS(nw) ((nw) * (MMA_WARP_FLOATS + 4 * MMA_LANES))

/* x rounded to the element type. */
inline float mma_round(float x)
{
#if DT_IN == 0
    return tf32_big(x);
#elif DT_IN == 1
    ushort h[1]; /* a half array needs cl_khr_fp16, a pointer to half does not */
    vstore_half_rte(x, 0, (half *)h);
    return vload_half(0, (const half *)h);
#else
    return bf16_to_f32(f32_to_bf16(x));
#endif
}

/* Element e of a fragment of n elements a part: x rounded to the element type, and with 3xTF32
 * the remainder's rounding at v[n + e] (0 for x = ±Inf, whose big part carries it). */
inline void emu_put(float *v, int n, int e, float x)
{
    v[e] = mma_round(x);
#if MMA_3X
    v[n + e] = mma_round(isinf(x) ? 0.0f : x - v[e]);
#else
    (void)n;
#endif
}

inline mma_a mma_load_a(__local const TL *p, int pitch, int lane)
{
    mma_a a;
    MMA_UNROLL
    for (int e = 0; e < MMA_AE; e++) {
        const float x = tl_to_f(p + MMA_A_ROW(lane, e) * pitch + MMA_A_COL(lane, e));
        emu_put(a.v, MMA_AE, e, x);
    }
    return a;
}

inline mma_b mma_load_b_(__local const TL *p, int pitch, int lane, int keys)
{
    mma_b b;
    MMA_UNROLL
    for (int e = 0; e < MMA_BE; e++) {
        const int k = MMA_B_ROW(lane, e);
        const float x = tl_to_f(p + MMA_B_COL(lane, e) * pitch + (keys ? MMA_P_KEY(k) : k));
        emu_put(b.v, MMA_BE, e, x);
    }
    return b;
}

/* Element (k, n) of a B fragment stored k-major at p (V's rows: p[k·pitch + n]). */
inline mma_b mma_load_b_km(__local const TL *p, int pitch, int lane)
{
    mma_b b;
    MMA_UNROLL
    for (int e = 0; e < MMA_BE; e++)
        emu_put(b.v, MMA_BE, e, tl_to_f(p + MMA_B_ROW(lane, e) * pitch + MMA_B_COL(lane, e)));
    return b;
}

inline mma_a mma_p_pack(float4 t0, float4 t1)
{
    const float c[2][4] = {{t0.s0, t0.s1, t0.s2, t0.s3}, {t1.s0, t1.s1, t1.s2, t1.s3}};
    mma_a a;
    MMA_UNROLL
    for (int e = 0; e < MMA_AE; e++) {
        const float x = c[MMA_P_TILE(0, e)][MMA_P_ELEM(e)];
        emu_put(a.v, MMA_AE, e, x);
    }
    return a;
}

/* C += A·B for the warp: the lanes scatter their fragments to the warp's scratch through the
 * layout, then each computes its own C elements. */
inline mma_c mma_emu(mma_c c, mma_a a, mma_b b, mma_ctx x)
{
    __local float *As = x.scr, *Bs = x.scr + MMA_PARTS * MMA_M * MMA_K;
    MMA_UNROLL
    for (int q = 0; q < MMA_PARTS; q++) {
        MMA_UNROLL
        for (int e = 0; e < MMA_AE; e++)
            As[q * MMA_M * MMA_K + MMA_A_ROW(x.lane, e) * MMA_K + MMA_A_COL(x.lane, e)] = a.v[q * MMA_AE + e];
        MMA_UNROLL
        for (int e = 0; e < MMA_BE; e++)
            Bs[q * MMA_K * MMA_N + MMA_B_ROW(x.lane, e) * MMA_N + MMA_B_COL(x.lane, e)] = b.v[q * MMA_BE + e];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    float r[2 * MMA_CE];
    vstore8((float8)(0.0f), 0, r);
#if MMA_3X
    vstore8(c, 0, r);
#else
    vstore4(c, 0, r);
#endif
    MMA_UNROLL
    for (int e = 0; e < MMA_CE; e++) {
        const int row = MMA_C_ROW(x.lane, e), col = MMA_C_COL(x.lane, e);
        MMA_UNROLL
        for (int k = 0; k < MMA_K; k++) {
            const float ab = As[row * MMA_K + k], bb = Bs[k * MMA_N + col];
            r[e] = fma(ab, bb, r[e]);
#if MMA_3X
            const float as = As[MMA_M * MMA_K + row * MMA_K + k], bs = Bs[MMA_K * MMA_N + k * MMA_N + col];
            r[MMA_CE + e] = fma(as, bb, r[MMA_CE + e]);
            r[MMA_CE + e] = fma(ab, bs, r[MMA_CE + e]);
#endif
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#if MMA_3X
    return vload8(0, r);
#else
    return vload4(0, r);
#endif
}

/* v of lane (lane ^ m), or of lane src, of the same warp, through the exchange slots. */
inline float4 emu_xch4(float4 v, int other, mma_ctx x)
{
    x.xch[x.lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    const float4 r = x.xch[(x.lid & ~(MMA_LANES - 1)) | other];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}
#define mma_exp2(x) exp2(x)
#define MMA(c, a, b) mma_emu((c), (a), (b), mctx)
#define MMA_XOR2(v, m) emu_xch4((float4)((v), 0.0f, 0.0f), mctx.lane ^ (m), mctx).xy
#define MMA_IDX4(v, src) emu_xch4((v), (src), mctx)
#endif

#define mma_load_b(p, pitch, lane) mma_load_b_((p), (pitch), (lane), 0)
#define mma_load_b_pv(p, pitch, lane) mma_load_b_((p), (pitch), (lane), 1)

#if !(MMA_NV && MMA_LDSM)
/* Without ldmatrix (the emulation, which MMA_LDSM's layouts run on too): the same fragments from
 * the plain loads. */
inline void mma_load_b_pair(__local const TL *p, int pitch, int lane, mma_b *b0, mma_b *b1)
{
    *b0 = mma_load_b(p, pitch, lane);
    *b1 = mma_load_b(p + 8 * pitch, pitch, lane);
}
#if DT_IN != 0
inline void mma_load_b_km_pair(__local const TL *p, int pitch, int lane, int one, mma_b *b0, mma_b *b1)
{
    *b0 = mma_load_b_km(p, pitch, lane);
    *b1 = mma_load_b_km(p + (one ? 0 : 8), pitch, lane);
}
#endif
#endif

/* An accumulator's value, its zero, and its elements scaled (both parts with 3xTF32). */
#if MMA_3X
#define mma_c_value(c) ((c).lo + (c).hi)
#define mma_c_zero() ((mma_c)(0.0f))
#define mma_c_scale(c, k) ((c) * (float8)((k), (k)))
#else
#define mma_c_value(c) (c)
#define mma_c_zero() ((mma_c)(0.0f))
#define mma_c_scale(c, k) ((c) * (k))
#endif
