/* The matrix-unit tile layer: fragments of the warp-level products C += A·B in the layouts of
 * mma_layout.cl, loaded from local memory, multiplied, and exchanged between the lanes that share
 * a row, so that a kernel is written once (fused_mma.cl) and runs on every backend:
 *
 *   MMA_NV 1:  NVIDIA (compute capability 8.0 and up), inline PTX: mma.sync.aligned m16n8k16 f16
 *              and bf16 with f32 accumulation, m16n8k8 tf32; shfl.sync for the row exchanges.
 *   MMA_AMD 1: AMD CDNA (gfx90a, gfx94x), clang's builtins: v_mfma_f32_16x16x16f16,
 *              16x16x16bf16_1k and 16x16x4f32 (f32 inputs multiplied in f32) on a wavefront of
 *              64 lanes; ds_bpermute for the row exchanges.
 *   MMA_AMD 2: AMD RDNA3 (gfx11), v_wmma_f32_16x16x16_f16 and _bf16 on a wavefront of 32 (f16
 *              and bf16 only); ds_bpermute for the row exchanges and P's half-waves.
 *   MMA_INTEL 1: Intel's XMX on sub-groups of 16 (Xe-HPC, Xe2), cl_intel_subgroup_matrix_multiply_
 *              accumulate's intel_sub_group_f16_f16_matrix_mad_k16 and _bf16_bf16_ (M = 8; f16 and
 *              bf16 only); a row's scores stay in one work-item, nothing is exchanged.
 *   MMA_INTEL 2: the same on sub-groups of 8 (Xe-HPG: Arc A-series), a warp two sub-groups.
 *   neither:   emulation in plain OpenCL C, for tests and for checking a device, never for speed.
 *              Each work-item plays one lane with the same ownership; a product goes through
 *              local memory between two barriers (PoCL has no sub-groups), so every call that
 *              multiplies or exchanges must be reached by the whole work-group alike. It runs
 *              any family's layout (MMA_LAYOUT 0: NVIDIA's, 1: AMD MFMA's, 2: AMD WMMA's, 3:
 *              Intel XMX's on sub-groups of 16, 4: on sub-groups of 8).
 *
 * The families differ in orientation (mma_layout.cl, NVA_* and MFA_*): NVIDIA multiplies S = Q·Kᵀ
 * and O = P·V, AMD the transposes Sᵀ = K·Qᵀ and Oᵀ = Vᵀ·Pᵀ, so that on both a lane's scores, its
 * weights in P's fragment and its elements of O belong to rows it holds. The kernel names the
 * roles (mma_load_q, mma_load_k, mma_load_v, MMA_S, MMA_O, mma_p_pack; MMA_ROW, MMA_S_KEY,
 * MMA_O_COL, MMA_XORR: mma.cl's attention macros below) and each family maps them to A and B.
 *
 * The element type follows DT_IN: f16 (1) and bf16 (2) as m16n8k16 (NVIDIA) or 16x16x16 (AMD)
 * with the values' bits in local memory (TL ushort: no cl_khr_fp16 needed on NVIDIA); f32 (0) on
 * NVIDIA as tf32 m16n8k8 (TL float), by default as 3xTF32 (MMA_3X 1): each operand a = big +
 * small, big = tf32(a) and small = tf32(a - big) (round to nearest, ties away: cvt.rna), the
 * products big·big in one accumulator and small·big + big·small in another, added when the value
 * is read (mma_c_value); folding the small products into the big accumulator at once loses most
 * of the gain. MMA_3X 0: one tf32 product (10-bit mantissas), meant as an opt-in that the API does
 * not offer yet (src/fused_mma.c always builds 3xTF32). On AMD, f32 is multiplied in f32 (no
 * split: MMA_3X 0).
 *
 * MMA_LDSM 1 (NVIDIA's layout, 16-bit types, the host's when its probe on the device passed): B
 * fragments through ldmatrix (two tiles a load: mma_load_b_pair for K, mma_load_b_km_pair with
 * .trans for V kept row by row); under emulation the same calls take the plain loads.
 *
 * The kernel works with the fragment types mma_q, mma_k, mma_v, mma_p and mma_c (an accumulator,
 * MMA_CE floats a lane, two of them with 3xTF32), the loads, mma_p_pack, and the macros MMA_S,
 * MMA_O, MMA_XORR and MMA_IDX4, which under emulation use the kernel's `mctx` (mma_ctx: the lane,
 * the work-item's index and the local scratch) and on a GPU nothing but their arguments. */

#ifndef MMA_NV
#define MMA_NV 0
#endif
#ifndef MMA_AMD
#define MMA_AMD 0
#endif
#ifndef MMA_INTEL
#define MMA_INTEL 0
#endif
#if MMA_AMD
#undef MMA_LAYOUT
#define MMA_LAYOUT MMA_AMD
#elif MMA_INTEL
#undef MMA_LAYOUT
#define MMA_LAYOUT (MMA_INTEL + 2)
#elif MMA_NV
#undef MMA_LAYOUT
#define MMA_LAYOUT 0
#endif
#ifndef MMA_LAYOUT
#define MMA_LAYOUT 0
#endif
#define MMA_GPU (MMA_NV || MMA_AMD || MMA_INTEL)

/* Loops over fragments: unrolled on GPUs (fragment arrays must stay in registers), rolled under
 * emulation, where unrolled products would copy their barriers and PoCL compiles for minutes. */
#if MMA_GPU
#define MMA_UNROLL _Pragma("unroll")
#else
#define MMA_UNROLL _Pragma("unroll 1")
#endif

#if MMA_LAYOUT == 0
/* ---- NVIDIA's layout: S = Q·Kᵀ, O = P·V (A = Q and P; B = K and V) */
#if DT_IN == 0
#define MMA_K MMA8_K
#define MMA_AE MMA8_AE
#define MMA_BE MMA8_BE
#define MMA_A_ROW MMA8_A_ROW
#define MMA_A_COL MMA8_A_COL
#define MMA_B_ROW MMA8_B_ROW
#define MMA_B_COL MMA8_B_COL
#define MMA_P_TILE(kb, e) MMA8_P_TILE(kb, e)
#define MMA_P_ELEM(kb, e) MMA8_P_ELEM(e)
#define MMA_P_KEY(kb, k) (MMA8_K * (kb) + MMA8_P_KEY(k))
#define MMA_TF32 1 /* operands rounded to tf32 */
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
#define MMA_P_TILE(kb, e) MMA16_P_TILE(kb, e)
#define MMA_P_ELEM(kb, e) MMA16_P_ELEM(e)
#define MMA_P_KEY(kb, k) (MMA16_K * (kb) + MMA16_P_KEY(k))
#endif
#define MMA_QA 1 /* Q (and P) are the A operands */
#define MMA_RS NVA_RS
#define MMA_SN NVA_S_N
#define MMA_S_KEY NVA_S_KEY
#define MMA_S_RS NVA_S_RS
#define MMA_ROW NVA_ROW
#define MMA_S_LANE NVA_S_LANE
#define MMA_S_ELEM NVA_S_ELEM
#define MMA_ON NVA_O_N
#define MMA_O_COL NVA_O_COL
#define MMA_O_RS NVA_O_RS
#define MMA_LEADER NVA_LEADER
#define MMA_RED0 NVA_RED0
#define MMA_RED1 NVA_RED1
#elif MMA_LAYOUT == 1
/* ---- AMD MFMA's layout (a wavefront of 64): Sᵀ = K·Qᵀ, Oᵀ = Vᵀ·Pᵀ (A = K and Vᵀ; B = Q and Pᵀ) */
#if MMA_AMD && defined(__AMDGCN_WAVEFRONT_SIZE__) && __AMDGCN_WAVEFRONT_SIZE__ != 64
#error "the MFMA backend is written for wavefronts of 64"
#endif
#undef MMA_LANES
#undef MMA_N
#undef MMA_CE
#undef MMA_C_ROW
#undef MMA_C_COL
#define MMA_LANES MFMA_LANES
#define MMA_N MFMA_N
#define MMA_CE MFMA_CE
#define MMA_C_ROW MFMA_C_ROW
#define MMA_C_COL MFMA_C_COL
#if DT_IN == 0
#define MMA_K MFMA4_K
#define MMA_AE MFMA4_AE
#define MMA_BE MFMA4_BE
#define MMA_A_ROW MFMA4_A_ROW
#define MMA_A_COL MFMA4_A_COL
#define MMA_B_ROW MFMA4_B_ROW
#define MMA_B_COL MFMA4_B_COL
#define MMA_P_TILE MFA4_P_TILE
#define MMA_P_ELEM MFA4_P_ELEM
#define MMA_P_KEY MFA4_P_KEY
#else
#define MMA_K MFMA16_K
#define MMA_AE MFMA16_AE
#define MMA_BE MFMA16_BE
#define MMA_A_ROW MFMA16_A_ROW
#define MMA_A_COL MFMA16_A_COL
#define MMA_B_ROW MFMA16_B_ROW
#define MMA_B_COL MFMA16_B_COL
#define MMA_P_TILE MFA16_P_TILE
#define MMA_P_ELEM MFA16_P_ELEM
#define MMA_P_KEY MFA16_P_KEY
#endif
#undef MMA_3X
#define MMA_3X 0 /* f32 multiplied in f32 */
#define MMA_QA 0 /* Q (and P) are the B operands */
#define MMA_RS MFA_RS
#define MMA_SN MFA_S_N
#define MMA_S_KEY MFA_S_KEY
#define MMA_S_RS MFA_S_RS
#define MMA_ROW MFA_ROW
#define MMA_S_LANE MFA_S_LANE
#define MMA_S_ELEM MFA_S_ELEM
#define MMA_ON MFA_O_N
#define MMA_O_COL MFA_O_COL
#define MMA_O_RS MFA_O_RS
#define MMA_LEADER MFA_LEADER
#define MMA_RED0 MFA_RED0
#define MMA_RED1 MFA_RED1
#elif MMA_LAYOUT == 2
/* ---- AMD WMMA's layout (a wavefront of 32), oriented as MFMA's; the kernel's tiles of S and O
 * are halves of a product's (MMA_PAIR: MMA_S2 and MMA_O2 multiply two at once) */
#if DT_IN == 0
#error "RDNA3's WMMA multiplies f16 and bf16 only"
#endif
#if MMA_AMD && defined(__AMDGCN_WAVEFRONT_SIZE__) && __AMDGCN_WAVEFRONT_SIZE__ != 32
#error "RDNA3's WMMA backend is written for wavefronts of 32 (the driver builds wave64)"
#endif
#undef MMA_LANES
#undef MMA_N
#undef MMA_CE
#undef MMA_C_ROW
#undef MMA_C_COL
#define MMA_LANES WMMA_LANES
#define MMA_N WMMA_N
#define MMA_CE 4 /* a half tile's; a product's C has WMMA_CE */
#define MMA_C_ROW WMMA_C_ROW
#define MMA_C_COL WMMA_C_COL
#define MMA_K WMMA_K
#define MMA_AE WMMA_AE
#define MMA_BE WMMA_BE
#define MMA_A_ROW WMMA_A_ROW
#define MMA_A_COL WMMA_A_COL
#define MMA_B_ROW WMMA_B_ROW
#define MMA_B_COL WMMA_B_COL
#define MMA_P_TILE WMA_P_TILE
#define MMA_P_KEY WMA_P_KEY
#define MMA_PAIR 1
#define MMA_QA 0
#define MMA_RS WMA_RS
#define MMA_SN WMA_S_N
#define MMA_S_KEY WMA_S_KEY
#define MMA_S_RS WMA_S_RS
#define MMA_ROW WMA_ROW
#define MMA_S_LANE WMA_S_LANE
#define MMA_S_ELEM WMA_S_ELEM
#define MMA_ON WMA_O_N
#define MMA_O_COL WMA_O_COL
#define MMA_O_RS WMA_O_RS
#define MMA_LEADER WMA_LEADER
#define MMA_RED0 WMA_RED0
#define MMA_RED1 WMA_RED1
#else
/* ---- Intel XMX's layouts (3: sub-groups of 16; 4: of 8, a warp two), oriented as AMD's; the
 * kernel's tiles of S and O are halves of a product's (MMA_PAIR), P's fragment four of them
 * (MMA_P_QUAD) */
#if DT_IN == 0
#error "Intel's XMX backend multiplies f16 and bf16 only"
#endif
#undef MMA_LANES
#undef MMA_N
#undef MMA_CE
#undef MMA_C_ROW
#undef MMA_C_COL
#define MMA_LANES XMX_LANES
#define MMA_N XMX_N
#define MMA_CE 4 /* a half tile's; a product's C has XMX_CE */
#define MMA_C_ROW XMX_C_ROW
#define MMA_C_COL XMX_C_COL
#define MMA_K XMX_K
#if MMA_LAYOUT == 4 /* sub-groups of 8: A as pairs, replicated in the warp's halves */
#define MMA_AE XMX8_AE
#define MMA_A_ROW XMX8_A_ROW
#define MMA_A_COL XMX8_A_COL
#else
#define MMA_AE XMX_AE
#define MMA_A_ROW XMX_A_ROW
#define MMA_A_COL XMX_A_COL
#endif
#define MMA_BE XMX_BE
#define MMA_B_ROW XMX_B_ROW
#define MMA_B_COL XMX_B_COL
#define MMA_P_TILE XMA_P_TILE
#define MMA_P_KEY XMA_P_KEY
#define MMA_PAIR 1
#define MMA_P_QUAD 1
#define MMA_QA 0
#define MMA_RS XMA_RS
#define MMA_SN XMA_S_N
#define MMA_S_KEY XMA_S_KEY
#define MMA_S_RS XMA_S_RS
#define MMA_ROW XMA_ROW
#define MMA_S_LANE XMA_S_LANE
#define MMA_S_ELEM XMA_S_ELEM
#define MMA_ON XMA_O_N
#define MMA_O_COL XMA_O_COL
#define MMA_O_RS XMA_O_RS
#define MMA_LEADER XMA_LEADER
#define MMA_RED0 XMA_RED0
#define MMA_RED1 XMA_RED1
#endif
#ifndef MMA_P_QUAD
#define MMA_P_QUAD 0
#endif
#ifndef MMA_PAIR
#define MMA_PAIR 0
#endif
#ifndef MMA_TF32
#define MMA_TF32 0
#endif
#if DT_IN == 0
#define TL float
#define MMA_PAD 4 /* row pitch ≡ 4 words (mod 32): the 8 rows x 4 lanes of a load hit 32 banks */
#else
#define TL ushort
#define MMA_PAD 8 /* 8 halves: the same 4 words */
#undef MMA_3X
#define MMA_3X 0
#endif
#define MMA_PARTS (MMA_3X ? 2 : 1)
#if !defined(MMA_LDSM) || DT_IN == 0 || MMA_LAYOUT != 0
#undef MMA_LDSM
#define MMA_LDSM 0 /* ldmatrix moves 16-bit elements only, in NVIDIA's layout */
#endif
/* A lane's scores, weights and O elements share the row slots MMA_S_RS(e) = MMA_O_RS(e) (one
 * float4 of each S or O tile); the row statistics are a value a slot (mma_rv). */
#if MMA_CE != 4
#error "the kernel keeps a tile's elements of a lane as one float4"
#endif
#if MMA_RS == 2
typedef float2 mma_rv;
#define RV_GET(rv, i) ((i) ? (rv).y : (rv).x)
#define RV_SET(rv, i, val) ((i) ? ((rv).y = (val)) : ((rv).x = (val)))
#else
typedef float mma_rv;
#define RV_GET(rv, i) (rv)
#define RV_SET(rv, i, val) ((rv) = (val))
#endif
/* The row slots' values a[MMA_S_RS(e)] of a tile's 4 elements. */
#define MMA_RS4(a) ((float4)((a)[MMA_S_RS(0)], (a)[MMA_S_RS(1)], (a)[MMA_S_RS(2)], (a)[MMA_S_RS(3)]))

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

#if MMA_AMD || MMA_INTEL
/* 16 16-bit values of a row at p, two 16-byte loads (pitches and offsets are multiples of 8
 * elements): WMMA's A and B, XMX's B. */
inline uint8 ld16x2(__local const TL *p) { return (uint8)(*(__local const uint4 *)p, *(__local const uint4 *)(p + 8)); }

#if DT_IN == 1
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
/* Two floats as one register of two 16-bit values, lo in the low half, rounded to nearest even. */
inline uint pack2(float lo, float hi)
{
#if DT_IN == 1
    return as_uint((half2)((half)lo, (half)hi));
#else
    return (uint)f32_to_bf16(lo) | (uint)f32_to_bf16(hi) << 16;
#endif
}
#endif

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

/* The B fragment of the MMA_K x 8 block stored n-major at p: element (k, n) at p[n·pitch + k'],
 * k' = k, or with `keyed` (V's fragment of P·V for k-block kb, from V transposed: element (key,
 * column c) at p[c·pitch + key]) k' = MMA_P_KEY(kb, k), the key P's fragment has at k. */
inline mma_b nv_load_b(__local const TL *p, int pitch, int lane, int kb, int keyed)
{
#define NV_K(k) (keyed ? MMA_P_KEY(kb, (k)) : (k))
#if DT_IN == 0
    float x[MMA_BE];
    MMA_UNROLL
    for (int e = 0; e < MMA_BE; e++)
        x[e] = p[MMA_B_COL(lane, e) * pitch + NV_K(MMA_B_ROW(lane, e))];
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
    /* m16n8k16: keys in order, two adjacent a register */
    return (uint2)(lds32(p + MMA_B_COL(lane, 0) * pitch + NV_K(MMA_B_ROW(lane, 0))),
                   lds32(p + MMA_B_COL(lane, 2) * pitch + NV_K(MMA_B_ROW(lane, 2))));
#endif
#undef NV_K
}
inline mma_b mma_load_bn(__local const TL *p, int pitch, int lane) { return nv_load_b(p, pitch, lane, 0, 0); }
inline mma_b mma_load_v(__local const TL *p, int pitch, int lane, int kb) { return nv_load_b(p, pitch, lane, kb, 1); }

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

/* P's A fragment of k-block kb from the probabilities of S's n-tiles t0 = MMA_P_TILE(kb, 0) and
 * t1 = MMA_P_TILE(kb, MMA_AE - 1) (the same with m16n8k8): element e from element P_ELEM(kb, e)
 * of tile P_TILE(kb, e) (mma_layout.cl). */
inline mma_a mma_p_pack(float4 t0, float4 t1, int kb)
{
    const float c[2][4] = {{t0.s0, t0.s1, t0.s2, t0.s3}, {t1.s0, t1.s1, t1.s2, t1.s3}};
    float x[MMA_AE];
    MMA_UNROLL
    for (int e = 0; e < MMA_AE; e++)
        x[e] = c[MMA_P_TILE(kb, e) != MMA_P_TILE(kb, 0)][MMA_P_ELEM(kb, e)];
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
#define MMA_XORR(v, m) shfl_xor2((v), (m))
#define MMA_IDX4(v, src) shfl_idx4((v), (src))
#define MMA_P_PACK(t0, t1, kb) mma_p_pack((t0), (t1), (kb))
#define MMA_SCRATCH_FLOATS(nw) 0

#elif MMA_AMD
/* ---------------------------------------------------------------- AMD: clang's MFMA and WMMA builtins */
#if DT_IN == 0
typedef float mma_a;
typedef float mma_b;
#elif MMA_LAYOUT == 1
typedef uint2 mma_a; /* 4 16-bit values, element e in bits 16·e */
typedef uint2 mma_b;
#else
typedef uint8 mma_a; /* WMMA: 16 16-bit values */
typedef uint8 mma_b;
#endif
typedef float4 mma_c;

/* 2^x for the weights: v_exp_f32 (native_exp2), denormal results flushed, as NVIDIA's ex2.approx. */
#define mma_exp2(x) native_exp2(x)

#if MMA_LAYOUT == 2
/* One WMMA product, C's 8 elements a lane (mma_op2). */
#if DT_IN == 1
#define MMA_PAIR_MAD(c, a, b) __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(as_half16(a), as_half16(b), (c))
#else
#define MMA_PAIR_MAD(c, a, b) __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(as_short16(a), as_short16(b), (c))
#endif
#else
inline mma_c mma_op(mma_c c, mma_a a, mma_b b)
{
#if DT_IN == 0
    return __builtin_amdgcn_mfma_f32_16x16x4f32(a, b, c, 0, 0, 0);
#elif DT_IN == 1
    return __builtin_amdgcn_mfma_f32_16x16x16f16(as_half4(a), as_half4(b), c, 0, 0, 0);
#else
    return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(as_short4(a), as_short4(b), c, 0, 0, 0);
#endif
}
#endif

/* A fragment from row-major storage (element (row, k) at p[row·pitch + k]); B from n-major
 * (element (k, n) at p[n·pitch + k]); V's A fragment (row: column c of V, k: key MMA_P_KEY) from
 * V transposed (p[c·pitch + key]). 16-bit values: a lane's 4 k indices are adjacent, one 8-byte
 * load (pitches and offsets are multiples of 4 elements). */
#if DT_IN == 0
inline mma_a mma_load_a(__local const TL *p, int pitch, int lane)
{
    return p[MMA_A_ROW(lane, 0) * pitch + MMA_A_COL(lane, 0)];
}
inline mma_b mma_load_bn(__local const TL *p, int pitch, int lane)
{
    return p[MMA_B_COL(lane, 0) * pitch + MMA_B_ROW(lane, 0)];
}
inline mma_a mma_load_v(__local const TL *p, int pitch, int lane, int kb)
{
    return p[MMA_A_ROW(lane, 0) * pitch + MMA_P_KEY(kb, MMA_A_COL(lane, 0))];
}
#elif MMA_LAYOUT == 2
/* WMMA: a lane's 16 k indices of one row, ld16x2. */
inline mma_a mma_load_a(__local const TL *p, int pitch, int lane) { return ld16x2(p + MMA_A_ROW(lane, 0) * pitch); }
inline mma_b mma_load_bn(__local const TL *p, int pitch, int lane) { return ld16x2(p + MMA_B_COL(lane, 0) * pitch); }
inline mma_a mma_load_v(__local const TL *p, int pitch, int lane, int kb)
{
    return ld16x2(p + MMA_A_ROW(lane, 0) * pitch + MMA_P_KEY(kb, 0));
}
#else
inline mma_a mma_load_a(__local const TL *p, int pitch, int lane)
{
    return *(__local const uint2 *)(p + MMA_A_ROW(lane, 0) * pitch + MMA_A_COL(lane, 0));
}
inline mma_b mma_load_bn(__local const TL *p, int pitch, int lane)
{
    return *(__local const uint2 *)(p + MMA_B_COL(lane, 0) * pitch + MMA_B_ROW(lane, 0));
}
inline mma_a mma_load_v(__local const TL *p, int pitch, int lane, int kb)
{
    return *(__local const uint2 *)(p + MMA_A_ROW(lane, 0) * pitch + MMA_P_KEY(kb, MMA_A_COL(lane, 0)));
}
#endif

/* The wavefront's lanes through ds_bpermute (a lane's index from mbcnt: the hardware's). */
inline uint amd_lane(void) { return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }
inline float amd_from(float v, uint src) { return as_float(__builtin_amdgcn_ds_bpermute((int)(src << 2), as_int(v))); }
inline uint amd_from_u(uint v, uint src) { return (uint)__builtin_amdgcn_ds_bpermute((int)(src << 2), (int)v); }

#if MMA_LAYOUT == 2
/* P's B fragment of k-block kb (16 keys, every lane all of them for its query) from the half
 * tiles t0 = 2kb and t1 = 2kb + 1: the lane holds keys 2i + h (h its half-wave, i < 8: t0's
 * elements, then t1's), the lane ^ 16 the others. Each packs its 8 weights as 16-bit values,
 * the two exchange them (4 words), and each lays out the 16 in key order. */
inline mma_b mma_p_pack(float4 t0, float4 t1, int kb)
{
    (void)kb;
    const uint lane = amd_lane(), h = lane >> 4;
    const uint4 own = (uint4)(pack2(t0.s0, t0.s1), pack2(t0.s2, t0.s3), pack2(t1.s0, t1.s1), pack2(t1.s2, t1.s3));
    const uint4 oth = (uint4)(amd_from_u(own.s0, lane ^ 16), amd_from_u(own.s1, lane ^ 16),
                              amd_from_u(own.s2, lane ^ 16), amd_from_u(own.s3, lane ^ 16));
    /* word j of own (oth) holds its weights of pair index 2j (low half) and 2j + 1; B's word i
     * holds keys 2i (low) and 2i + 1: the half-wave 0 lane's weight of pair i and the other's */
    const uint4 lo = h ? oth : own, hi = h ? own : oth;
    const uint4 e = (lo & 0xffffu) | (hi << 16), o = (lo >> 16) | (hi & 0xffff0000u);
    return (uint8)(e.s0, o.s0, e.s1, o.s1, e.s2, o.s2, e.s3, o.s3);
}
#else
/* P's B fragment of k-block kb: the C fragment of Sᵀ's tile MMA_P_TILE(kb, 0) (t0; t1 the same
 * tile), element e from element MMA_P_ELEM(kb, e). */
inline mma_b mma_p_pack(float4 t0, float4 t1, int kb)
{
    (void)t1;
#if DT_IN == 0
    const int e = MMA_P_ELEM(kb, 0);
    return e == 0 ? t0.s0 : e == 1 ? t0.s1 : e == 2 ? t0.s2 : t0.s3;
#else
    (void)kb; /* 16x16x16: the tile's elements in order */
    return (uint2)(pack2(t0.s0, t0.s1), pack2(t0.s2, t0.s3));
#endif
}
#endif
inline float4 amd_idx4(float4 v, uint src)
{
    return (float4)(amd_from(v.s0, src), amd_from(v.s1, src), amd_from(v.s2, src), amd_from(v.s3, src));
}
#if MMA_LAYOUT != 2
#define MMA(c, a, b) mma_op((c), (a), (b))
#endif
#define MMA_XORR(v, m) amd_from((v), amd_lane() ^ (uint)(m))
#define MMA_IDX4(v, src) amd_idx4((v), (uint)(src))
#define MMA_P_PACK(t0, t1, kb) mma_p_pack((t0), (t1), (kb))
#define MMA_SCRATCH_FLOATS(nw) 0

#elif MMA_INTEL
/* ---------------------------------------------------------------- Intel: the XMX builtins */
#pragma OPENCL EXTENSION cl_intel_subgroups : enable
#if MMA_LAYOUT == 4
typedef uint8 mma_a; /* A: the 8 rows' values at the work-item's two k, the lower in the low half */
#define XMX_A(a) as_int8(a)
#else
typedef ushort8 mma_a; /* A: the 8 rows' values at the work-item's k */
#define XMX_A(a) as_short8(a)
#endif
typedef uint8 mma_b; /* B: 16 16-bit values, k 2i in word i's low half */
typedef float4 mma_c;

/* 2^x for the weights: the hardware's exp2 (native_exp2), as the other backends. */
#define mma_exp2(x) native_exp2(x)

/* One product, C's 8 rows (keys or O columns) of the work-item's column (mma_op2). */
#if DT_IN == 1
#define MMA_PAIR_MAD(c, a, b) intel_sub_group_f16_f16_matrix_mad_k16(XMX_A(a), as_int8(b), (c))
#else
#define MMA_PAIR_MAD(c, a, b) intel_sub_group_bf16_bf16_matrix_mad_k16(XMX_A(a), as_int8(b), (c))
#endif

/* A's 8 rows at the work-item's column (sub-groups of 8: its pair of columns, elements 2m and
 * 2m + 1 adjacent, which tests/test_mma_layout.c checks of the map; 4-byte aligned: pitches and
 * offsets are even), through the map: p at the work-item's first column, p[A_ROW·pitch] (K
 * row-major: rows are keys; V transposed: rows are V's columns, the column the key MMA_P_KEY).
 * B n-major: the work-item's row of 16. */
#if MMA_LAYOUT == 4
#define XMX_AT(m) (*(__local const uint *)(p + MMA_A_ROW(lane, 2 * (m)) * pitch))
#else
#define XMX_AT(m) p[MMA_A_ROW(lane, (m)) * pitch]
#endif
inline mma_a xmx_col8(__local const TL *p, int pitch, int lane)
{
    return (mma_a)(XMX_AT(0), XMX_AT(1), XMX_AT(2), XMX_AT(3), XMX_AT(4), XMX_AT(5), XMX_AT(6), XMX_AT(7));
}
#undef XMX_AT
inline mma_a mma_load_a(__local const TL *p, int pitch, int lane)
{
    return xmx_col8(p + MMA_A_COL(lane, 0), pitch, lane);
}
inline mma_b mma_load_bn(__local const TL *p, int pitch, int lane) { return ld16x2(p + MMA_B_COL(lane, 0) * pitch); }
inline mma_a mma_load_v(__local const TL *p, int pitch, int lane, int kb)
{
    return xmx_col8(p + MMA_P_KEY(kb, MMA_A_COL(lane, 0)), pitch, lane);
}

/* P's B fragment of k-block kb: the work-item's own 16 weights, half tiles 4kb .. 4kb + 3. */
inline mma_b mma_p_pack4(float4 t0, float4 t1, float4 t2, float4 t3)
{
    return (uint8)(pack2(t0.s0, t0.s1), pack2(t0.s2, t0.s3), pack2(t1.s0, t1.s1), pack2(t1.s2, t1.s3),
                   pack2(t2.s0, t2.s1), pack2(t2.s2, t2.s3), pack2(t3.s0, t3.s1), pack2(t3.s2, t3.s3));
}
/* The roles exchange nothing (MMA_RED0 0; the probe checks its xor 0) and fetch the exact path's
 * weights from the lane itself (MMA_S_LANE(r, n) = r): within its sub-group either way. */
#define MMA_SG (MMA_LAYOUT == 4 ? 8 : 16)
#define MMA_XORR(v, m) intel_sub_group_shuffle_xor((v), (uint)(m))
#define MMA_IDX4(v, src) intel_sub_group_shuffle((v), (uint)(src) % MMA_SG)
#define MMA_P_PACK4(t0, t1, t2, t3) mma_p_pack4((t0), (t1), (t2), (t3))
#define MMA_SCRATCH_FLOATS(nw) 0
/* The kernels' sub-groups: the builtins are defined for the device's smallest size only. A
 * work-item's warp and lane follow its sub-group, which the specification does not tie to the
 * local index (Intel's compiler takes consecutive ones): on sub-groups of 8 a warp is two of them. */
#if MMA_LAYOUT == 4
#define MMA_SG_ATTR __attribute__((intel_reqd_sub_group_size(8)))
#define MMA_WARP_OF(lid) ((int)get_sub_group_id() >> 1)
#define MMA_LANE_OF(lid) ((int)(8 * (get_sub_group_id() & 1) + get_sub_group_local_id()))
#else
#define MMA_SG_ATTR __attribute__((intel_reqd_sub_group_size(16)))
#define MMA_WARP_OF(lid) ((int)get_sub_group_id())
#define MMA_LANE_OF(lid) ((int)get_sub_group_local_id())
#endif

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
    return MMA_TF32 ? tf32_big(x) : x; /* NVIDIA's tf32, AMD's f32 */
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

inline mma_b mma_load_bn(__local const TL *p, int pitch, int lane)
{
    mma_b b;
    MMA_UNROLL
    for (int e = 0; e < MMA_BE; e++)
        emu_put(b.v, MMA_BE, e, tl_to_f(p + MMA_B_COL(lane, e) * pitch + MMA_B_ROW(lane, e)));
    return b;
}

/* V's fragment of k-block kb from V transposed at p (element (key, column c) at p[c·pitch +
 * key]): NVIDIA's B (k the key, n the column), AMD's A (row the column, k the key). */
#if MMA_LAYOUT == 0
#define EMU_VF mma_b
#define EMU_VE MMA_BE
#define EMU_V_COL MMA_B_COL
#define EMU_V_K MMA_B_ROW
#else
#define EMU_VF mma_a
#define EMU_VE MMA_AE
#define EMU_V_COL MMA_A_ROW
#define EMU_V_K MMA_A_COL
#endif
inline EMU_VF mma_load_v(__local const TL *p, int pitch, int lane, int kb)
{
    EMU_VF f;
    MMA_UNROLL
    for (int e = 0; e < EMU_VE; e++)
        emu_put(f.v, EMU_VE, e, tl_to_f(p + EMU_V_COL(lane, e) * pitch + MMA_P_KEY(kb, EMU_V_K(lane, e))));
    return f;
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

/* v of lane (lane ^ m), or of lane src, of the same warp, through the exchange slots. */
inline float4 emu_xch4(float4 v, int other, mma_ctx x)
{
    x.xch[x.lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    const float4 r = x.xch[(x.lid & ~(MMA_LANES - 1)) | other];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

/* P's fragment of k-block kb from S's tiles t0 = MMA_P_TILE(kb, 0) and t1 (the other tile it
 * takes, or t0 again): NVIDIA's A, AMD's B; WMMA's takes the other half-wave's weights too. */
#if MMA_LAYOUT == 0
#define MMA_PF mma_a
#define MMA_PE MMA_AE
#else
#define MMA_PF mma_b
#define MMA_PE MMA_BE
#endif
#if MMA_LAYOUT == 2
inline MMA_PF mma_p_pack(float4 t0, float4 t1, int kb, mma_ctx x)
{
    (void)kb;
    const float4 u0 = emu_xch4(t0, x.lane ^ 16, x), u1 = emu_xch4(t1, x.lane ^ 16, x);
    const float own[8] = {t0.s0, t0.s1, t0.s2, t0.s3, t1.s0, t1.s1, t1.s2, t1.s3};
    const float oth[8] = {u0.s0, u0.s1, u0.s2, u0.s3, u1.s0, u1.s1, u1.s2, u1.s3};
    MMA_PF f;
    MMA_UNROLL
    for (int k = 0; k < MMA_PE; k++) /* key k: pair k / 2 of the lane of half-wave k % 2 */
        emu_put(f.v, MMA_PE, k, (k & 1) == (x.lane >> 4) ? own[k >> 1] : oth[k >> 1]);
    return f;
}
#elif MMA_LAYOUT >= 3
/* XMX: the lane's own 16 weights, half tiles 4kb .. 4kb + 3 in key order. */
inline MMA_PF mma_p_pack4(float4 t0, float4 t1, float4 t2, float4 t3)
{
    const float w[16] = {t0.s0, t0.s1, t0.s2, t0.s3, t1.s0, t1.s1, t1.s2, t1.s3,
                         t2.s0, t2.s1, t2.s2, t2.s3, t3.s0, t3.s1, t3.s2, t3.s3};
    MMA_PF f;
    MMA_UNROLL
    for (int k = 0; k < MMA_PE; k++)
        emu_put(f.v, MMA_PE, k, w[k]);
    return f;
}
#else
inline MMA_PF mma_p_pack(float4 t0, float4 t1, int kb)
{
    const float c[2][4] = {{t0.s0, t0.s1, t0.s2, t0.s3}, {t1.s0, t1.s1, t1.s2, t1.s3}};
    MMA_PF f;
    MMA_UNROLL
    for (int e = 0; e < MMA_PE; e++) {
        const float x = c[MMA_P_TILE(kb, e) != MMA_P_TILE(kb, 0)][MMA_P_ELEM(kb, e)];
        emu_put(f.v, MMA_PE, e, x);
    }
    return f;
}
#endif

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

#if MMA_LAYOUT >= 2
/* One product into two half tiles (8 C elements a lane: 0-3 into c0, 4-7 into c1), WMMA's or
 * XMX's: the lanes scatter their fragments to the scratch, then each computes its own C elements.
 * An operand held whole by each group of EMU_AW (EMU_BW) lanes (WMMA: A and B in each half-wave;
 * XMX on sub-groups of 8: A in each) is written by the first group, and a lane of another whose
 * values differ in a bit from the first's (which the hardware requires, or computes otherwise)
 * gets NaN. */
#if MMA_LAYOUT == 2
#define EMU_AW 16
#define EMU_BW 16
#elif MMA_LAYOUT == 4
#define EMU_AW 8
#define EMU_BW MMA_LANES
#else
#define EMU_AW MMA_LANES
#define EMU_BW MMA_LANES
#endif
inline void mma_emu2(mma_c *c0, mma_c *c1, mma_a a, mma_b b, mma_ctx x)
{
    __local float *As = x.scr, *Bs = x.scr + MMA_M * MMA_K;
    if (x.lane < EMU_AW) {
        MMA_UNROLL
        for (int e = 0; e < MMA_AE; e++)
            As[MMA_A_ROW(x.lane, e) * MMA_K + MMA_A_COL(x.lane, e)] = a.v[e];
    }
    if (x.lane < EMU_BW) {
        MMA_UNROLL
        for (int e = 0; e < MMA_BE; e++)
            Bs[MMA_B_ROW(x.lane, e) * MMA_N + MMA_B_COL(x.lane, e)] = b.v[e];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    float r[8];
    vstore4(*c0, 0, r);
    vstore4(*c1, 1, r);
    int twin = 1;
    if (x.lane >= EMU_AW) {
        MMA_UNROLL
        for (int e = 0; e < MMA_AE; e++)
            twin &= as_uint(a.v[e]) == as_uint(As[MMA_A_ROW(x.lane, e) * MMA_K + MMA_A_COL(x.lane, e)]);
    }
    if (x.lane >= EMU_BW) {
        MMA_UNROLL
        for (int e = 0; e < MMA_BE; e++)
            twin &= as_uint(b.v[e]) == as_uint(Bs[MMA_B_ROW(x.lane, e) * MMA_N + MMA_B_COL(x.lane, e)]);
    }
    if (!twin)
        vstore8((float8)(NAN), 0, r);
    MMA_UNROLL
    for (int e = 0; e < 8; e++) { /* WMMA_CE, XMX_CE */
        const int row = MMA_C_ROW(x.lane, e), col = MMA_C_COL(x.lane, e);
        MMA_UNROLL
        for (int k = 0; k < MMA_K; k++)
            r[e] = fma(As[row * MMA_K + k], Bs[k * MMA_N + col], r[e]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    *c0 = vload4(0, r);
    *c1 = vload4(1, r);
}
#define MMA2(c0, c1, a, b) mma_emu2(&(c0), &(c1), (a), (b), mctx)
#endif
#if MMA_LAYOUT == 2
#define MMA_P_PACK(t0, t1, kb) mma_p_pack((t0), (t1), (kb), mctx)
#elif MMA_LAYOUT >= 3
#define MMA_P_PACK4(t0, t1, t2, t3) mma_p_pack4((t0), (t1), (t2), (t3))
#else
#define MMA_P_PACK(t0, t1, kb) mma_p_pack((t0), (t1), (kb))
#endif
#define mma_exp2(x) exp2(x)
#define MMA(c, a, b) mma_emu((c), (a), (b), mctx)
#if MMA_RS == 2
#define MMA_XORR(v, m) emu_xch4((float4)((v), 0.0f, 0.0f), mctx.lane ^ (m), mctx).xy
#else
#define MMA_XORR(v, m) emu_xch4((float4)((v), 0.0f, 0.0f, 0.0f), mctx.lane ^ (m), mctx).x
#endif
#define MMA_IDX4(v, src) emu_xch4((v), (src), mctx)
#endif

#ifdef MMA_PAIR_MAD
/* WMMA's and XMX's product on the device into the kernel's two half tiles: C elements 0-3 and
 * 4-7 of a lane's 8. */
inline void mma_op2(mma_c *c0, mma_c *c1, mma_a a, mma_b b)
{
    const float8 c = MMA_PAIR_MAD((float8)(*c0, *c1), a, b);
    *c0 = c.lo;
    *c1 = c.hi;
}
#define MMA2(c0, c1, a, b) mma_op2(&(c0), &(c1), (a), (b))
#endif

#define mma_load_b mma_load_bn

/* The roles (mma_layout.cl): NVIDIA's Q and P are A operands, K and V B operands; AMD's and
 * Intel's the other way round. MMA_S accumulates a tile of S (Sᵀ on AMD), MMA_O one of O (Oᵀ). */
#if MMA_QA
typedef mma_a mma_q;
typedef mma_b mma_k;
typedef mma_a mma_p;
#define mma_load_q mma_load_a
#define mma_load_k mma_load_bn
#define MMA_S(s, q, k) MMA((s), (q), (k))
#define MMA_O(o, p, v) MMA((o), (p), (v))
#else
typedef mma_b mma_q;
typedef mma_a mma_k;
typedef mma_b mma_p;
#define mma_load_q mma_load_bn
#define mma_load_k mma_load_a
#define MMA_S(s, q, k) MMA((s), (k), (q))
#define MMA_O(o, p, v) MMA((o), (v), (p))
#endif
#ifndef MMA_SG_ATTR
#define MMA_SG_ATTR
#define MMA_WARP_OF(lid) ((lid) / MMA_LANES)
#define MMA_LANE_OF(lid) ((lid) % MMA_LANES)
#endif

/* P's fragment of k-block kb from the probabilities p[tile][element] of S's tiles, times w
 * (a float4 by element); XMX's takes the 4 tiles of its elements 0, 4, 8 and 12 (MMA_P_TILE). */
#if MMA_P_QUAD
#define MMA_P_OF(p, kb, w)                                                                        \
    MMA_P_PACK4(vload4(0, (p)[MMA_P_TILE(kb, 0)]) * (w), vload4(0, (p)[MMA_P_TILE(kb, 4)]) * (w), \
                vload4(0, (p)[MMA_P_TILE(kb, 8)]) * (w), vload4(0, (p)[MMA_P_TILE(kb, 12)]) * (w))
#else
#define MMA_P_OF(p, kb, w)                                                                        \
    MMA_P_PACK(vload4(0, (p)[MMA_P_TILE(kb, 0)]) * (w), vload4(0, (p)[MMA_P_TILE(kb, MMA_AE - 1)]) * (w), (kb))
#endif
#if MMA_PAIR /* two half tiles a product */
#define MMA_S2(s0, s1, q, k) MMA2(s0, s1, (k), (q))
#define MMA_O2(o0, o1, p, v) MMA2(o0, o1, (v), (p))
#endif

#if MMA_LAYOUT == 0 && !(MMA_NV && MMA_LDSM)
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
