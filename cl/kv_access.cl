/* How the attention kernels read K and V rows (assembled after common.cl, before attn_common.cl;
 * docs/kvcache.md): where key j's row lives and how its storage type becomes f32.
 *
 * Storage (-D DT_K / DT_V, default DT_IN): the query's type (0 f32, 1 f16, 2 bf16: common.cl's
 * loads), or a KV-cache type, decoded here: 3 int8 (x = s·q, s per token and kv head from a
 * table), 4 fp8 E4M3 and 5 fp8 E5M2 (x = s·fp8, s per tensor), 6 ggml q8_0 and 7 ggml q4_0
 * (blocks of 32 along the row: f16 d, then 32 int8 / 16 bytes of nibbles). The types 3-7 are read
 * through uchar pointers whose offsets and strides are in bytes (src/validate.c converts the
 * block types' element counts). Loads: LD_K(p, i) one element, LD4_K(p, i) 4 (i a multiple of
 * 4), LD16_K(p, i) 16 (i a multiple of 16), and _V alike; a block type's rows hold whole blocks,
 * so its 4- and 16-element loads never cross one.
 *
 * Rows (kv_src, kv_row): with PAGE 0 key j's row is j·ss units past the kv head's base (K +
 * k_off + b·k_sb + hk·k_sh); with PAGE > 0 (paged KV, page size PAGE, a compile-time constant)
 * the pools have no batch dimension: the base is K + k_off + hk·k_sh, and key j's row is row
 * j % PAGE of page bt[j / PAGE] of the batch's block-table row, the page index clamped into the
 * pool [0, np) so that no entry can send a read outside it. The per-key scale (KSC / VSC: the
 * int8 scale of the key's row, paged like the rows; the fp8 per-tensor scale; else 1) multiplies
 * the key's dot product and its V row.
 *
 * KVC 1 (the host's, whenever K or V is paged or of a type 3-7) adds KVC_ARGS after the kernel's
 * other arguments; without it, kv_src is empty and every row is base + j·ss, as before. */
#ifndef KVC
#define KVC 0
#endif
#ifndef PAGE
#define PAGE 0
#endif
#ifndef VARLEN
#define VARLEN 0 /* 1: q/out/lse packed by cu_seqlens_q, or k/v by cu_seqlens_k (kv_seqs) */
#endif

#if defined(DT_IN)
#ifndef DT_K
#define DT_K DT_IN
#endif
#ifndef DT_V
#define DT_V DT_IN
#endif
/* Each format's decoders only where K or V has it (the others are not compiled). */
#define KV_USES(t) (DT_K == (t) || DT_V == (t))
/* A block type's rows hold whole blocks (head sizes multiples of 32): no tails. */
#define KV_BLOCKED(dt) ((dt) == 6 || (dt) == 7)
/* q4_0's element = d · Q4_RAW_SCALE · kvraw16_7 (below) */
#define Q4_RAW_SCALE 0.0625f

/* ---- Decoders of the KV-cache types, for 1, 4 and 16 elements at i of a row at p (bytes). */
/* OCP fp8 as f32 through its bits: E4M3 (bias 7, no infinities, S.1111.111 NaN) and E5M2 (bias
 * 15, binary16's upper byte). A normal's exponent and mantissa move up into binary32's with the
 * bias difference added; a subnormal (exponent 0) is m·2^(1 - bias - mantissa bits), exact in
 * f32; no f32 denormal is ever formed, so devices that flush them decode the same. */
#define DEFINE_FP8(W)                                                                            \
    inline CAT(float, W) CAT(e4m3_dec, W)(CAT(uint, W) x)                                        \
    {                                                                                            \
        const CAT(uint, W) em = x & 0x7fu;                                                       \
        CAT(float, W) mag = select(CAT(as_float, W)((em << 20) + (120u << 23)),                \
                                   CAT(convert_float, W)(em) * 0x1p-9f,                          \
                                   CAT(convert_int, W)(em < 8u) != 0);                           \
        mag = select(mag, (CAT(float, W))(NAN), CAT(convert_int, W)(em == 0x7fu) != 0);          \
        return CAT(as_float, W)(CAT(as_uint, W)(mag) | ((x & 0x80u) << 24));                 \
    }                                                                                            \
    inline CAT(float, W) CAT(e5m2_dec, W)(CAT(uint, W) x)                                        \
    {                                                                                            \
        const CAT(uint, W) em = x & 0x7fu;                                                       \
        CAT(float, W) mag = select(CAT(as_float, W)((em << 21) + (112u << 23)),                \
                                   CAT(convert_float, W)(em) * 0x1p-16f,                         \
                                   CAT(convert_int, W)(em < 4u) != 0);                           \
        mag = select(mag, CAT(as_float, W)(0x7f800000u | ((em & 3u) << 21)),                   \
                     CAT(convert_int, W)(em >= 0x7cu) != 0);                                     \
        return CAT(as_float, W)(CAT(as_uint, W)(mag) | ((x & 0x80u) << 24));                 \
    }
#if KV_USES(4) || KV_USES(5)
DEFINE_FP8()
DEFINE_FP8(4)
#if !(defined(CPU_DEVICE) && CPU_DEVICE)
DEFINE_FP8(16)
#endif
#endif

typedef __global const uchar *kvp_t;
#if KV_USES(3)
/* 3: int8 */
inline float kvld1_3(kvp_t p, int i) { return (float)as_char(p[i]); }
inline float4 kvld4_3(kvp_t p, int i) { return convert_float4(as_char4(vload4(0, p + i))); }
inline float16 kvld16_3(kvp_t p, int i) { return convert_float16(as_char16(vload16(0, p + i))); }
#endif
#if KV_USES(4) || KV_USES(5)
/* 4, 5: fp8 */
inline float kvld1_4(kvp_t p, int i) { return e4m3_dec((uint)p[i]); }
inline float4 kvld4_4(kvp_t p, int i) { return e4m3_dec4(convert_uint4(vload4(0, p + i))); }
inline float kvld1_5(kvp_t p, int i) { return e5m2_dec((uint)p[i]); }
inline float4 kvld4_5(kvp_t p, int i) { return e5m2_dec4(convert_uint4(vload4(0, p + i))); }
/* On CPUs (fused_direct's loads) 16 at a time through binary16, whose conversion is a vector
 * instruction there (F16C): E5M2 is binary16's upper byte; E4M3's exponent and mantissa moved to
 * binary16's places read as 2^-8 times the value, subnormals included, and S.1111.111 (NaN) reads
 * 480, which no finite code does (the largest is 448). E5M2 decode 2x faster, E4M3 1.3x (PoCL,
 * AVX2). Elsewhere the bit arithmetic above: vload_half16 from __private memory, though OpenCL
 * 1.2's, is undeclared in clang 14's NVPTX build (tests/ptx_check.sh). */
#if defined(CPU_DEVICE) && CPU_DEVICE
inline float16 kvld16_4(kvp_t p, int i)
{
    const ushort16 x = convert_ushort16(vload16(0, p + i));
    const ushort16 h = ((x & (ushort)0x80) << 8) | ((x & (ushort)0x7f) << 7);
    const float16 f = vload_half16(0, (const half *)&h) * 256.0f;
    return fabs(f) == (float16)(480.0f) ? (float16)(NAN) : f;
}
inline float16 kvld16_5(kvp_t p, int i)
{
    const ushort16 h = convert_ushort16(vload16(0, p + i)) << 8;
    return vload_half16(0, (const half *)&h);
}
#else
inline float16 kvld16_4(kvp_t p, int i) { return e4m3_dec16(convert_uint16(vload16(0, p + i))); }
inline float16 kvld16_5(kvp_t p, int i) { return e5m2_dec16(convert_uint16(vload16(0, p + i))); }
#endif
#endif
#if KV_USES(6) || KV_USES(7)
/* 6: q8_0, blocks of 34 bytes (f16 d at an even offset: rows start on whole blocks) */
#define Q8_BLOCK(p, i) ((p) + (ulong)((i) >> 5) * 34u)
/* The block's f16 scale d. On CPUs through a private vector: PoCL's scalar vload_half is about
 * 19 integer and scalar operations, its vload_half4 one F16C conversion (q4_0 decode 3.2 ms
 * against 4.0 with the scalar load); elsewhere the plain load (the comment above kvld16_4: private
 * vload_half in clang's NVPTX build). */
#if defined(CPU_DEVICE) && CPU_DEVICE
inline float q_scale(kvp_t b)
{
    const ushort4 h = (ushort4)(*(__global const ushort *)b, 0, 0, 0);
    return vload_half4(0, (const half *)&h).s0;
}
#else
inline float q_scale(kvp_t b) { return vload_half(0, (__global const half *)b); }
#endif
inline float kvld1_6(kvp_t p, int i)
{
    const kvp_t b = Q8_BLOCK(p, i);
    return q_scale(b) * (float)as_char(b[2 + (i & 31)]);
}
inline float4 kvld4_6(kvp_t p, int i)
{
    const kvp_t b = Q8_BLOCK(p, i);
    return q_scale(b) * convert_float4(as_char4(vload4(0, b + 2 + (i & 31))));
}
/* 16 elements without the block's scale (kvraw16), and the scale (kvbsc): where one scale serves
 * a whole block's products, the caller multiplies once (qk16_row, fused_direct's P·V). */
inline float16 kvraw16_6(kvp_t p, int i) { return convert_float16(as_char16(vload16(0, Q8_BLOCK(p, i) + 2 + (i & 31)))); }
inline float kvbsc_6(kvp_t p, int i) { return q_scale(Q8_BLOCK(p, i)); }
inline float16 kvld16_6(kvp_t p, int i) { return kvbsc_6(p, i) * kvraw16_6(p, i); }
/* 7: q4_0, blocks of 18 bytes: byte j's low nibble is element j, its high nibble j + 16 */
#define Q4_BLOCK(p, i) ((p) + (ulong)((i) >> 5) * 18u)
inline float kvld1_7(kvp_t p, int i)
{
    const kvp_t b = Q4_BLOCK(p, i);
    const uint x = b[2 + (i & 15)];
    return q_scale(b) * (float)((int)((i & 16) ? x >> 4 : x & 15u) - 8);
}
inline float4 kvld4_7(kvp_t p, int i)
{
    const kvp_t b = Q4_BLOCK(p, i);
    const uint4 x = convert_uint4(vload4(0, b + 2 + (i & 15)));
    return q_scale(b) * (convert_float4((i & 16) ? x >> 4 : x & 15u) - 8.0f);
}
/* kvraw16_7: 16·(nibble - 8), the nibble moved to a byte's upper half with its bias flipped
 * (x ^ 0x88), read as a signed byte: sign-extended and converted as q8_0's bytes are, with no
 * mask, shift or subtraction on the 16 wide values (half as many vector operations as
 * convert(nibble) - 8). The factor 16 goes into the caller's scalars (KV_RAW_SCALE), exactly:
 * a power of two. */
inline float16 kvraw16_7(kvp_t p, int i)
{
    const uchar16 x = vload16(0, Q4_BLOCK(p, i) + 2) ^ (uchar)0x88;
    return convert_float16(as_char16((i & 16) ? x & (uchar)0xf0 : x << (uchar)4));
}
inline float kvbsc_7(kvp_t p, int i) { return q_scale(Q4_BLOCK(p, i)); }
inline float16 kvld16_7(kvp_t p, int i) { return (kvbsc_7(p, i) * Q4_RAW_SCALE) * kvraw16_7(p, i); }
#endif

/* T_K, LD_K, LD4_K, LD16_K (and _V) for the type of each. */
#if DT_K <= 2
#define T_K T_IN
#define LD_K(p, i) LD_IN(p, i)
#define LD4_K(p, i) LD4_IN(p, i)
#define LD16_K(p, i) LD16_IN(p, i)
#else
#define T_K uchar
#define LD_K(p, i) CAT(kvld1_, DT_K)(p, i)
#define LD4_K(p, i) CAT(kvld4_, DT_K)(p, i)
#define LD16_K(p, i) CAT(kvld16_, DT_K)(p, i)
#endif
#if DT_V <= 2
#define T_V T_IN
#define LD_V(p, i) LD_IN(p, i)
#define LD4_V(p, i) LD4_IN(p, i)
#define LD16_V(p, i) LD16_IN(p, i)
#else
#define T_V uchar
#define LD_V(p, i) CAT(kvld1_, DT_V)(p, i)
#define LD4_V(p, i) CAT(kvld4_, DT_V)(p, i)
#define LD16_V(p, i) CAT(kvld16_, DT_V)(p, i)
#endif
/* LD16R_K(p, i): LD16_K without a block type's scale, BSC_K(p, i) that scale (the other types:
 * LD16_K and 1), RSC_K the factor that LD16R_K's values take on top: element = RSC_K · BSC_K ·
 * LD16R_K (1/16 for q4_0, else 1); _V alike. */
#define KV_RAW_SCALE(dt) ((dt) == 7 ? Q4_RAW_SCALE : 1.0f)
#define RSC_K KV_RAW_SCALE(DT_K)
#define RSC_V KV_RAW_SCALE(DT_V)
#if KV_BLOCKED(DT_K)
#define LD16R_K(p, i) CAT(kvraw16_, DT_K)(p, i)
#define BSC_K(p, i) CAT(kvbsc_, DT_K)(p, i)
#else
#define LD16R_K(p, i) LD16_K(p, i)
#define BSC_K(p, i) 1.0f
#endif
#if KV_BLOCKED(DT_V)
#define LD16R_V(p, i) CAT(kvraw16_, DT_V)(p, i)
#define BSC_V(p, i) CAT(kvbsc_, DT_V)(p, i)
#else
#define LD16R_V(p, i) LD16_V(p, i)
#define BSC_V(p, i) 1.0f
#endif
/* Bytes of a K (V) row of n elements. */
#define KV_ROW_BYTES(dt, T, n) ((dt) == 6 ? (n) / 32 * 34 : (dt) == 7 ? (n) / 32 * 18 : (n) * (int)sizeof(T))
#define K_ROW_BYTES(n) KV_ROW_BYTES(DT_K, T_K, n)
#define V_ROW_BYTES(n) KV_ROW_BYTES(DT_V, T_V, n)

/* Elements i..i+3 (and i..i+15) of a K or V row of n elements, zero past n; with KV_FULL 1 (the
 * direct programs' head sizes are multiples of 16) no 16-element load has a tail. */
#if defined(KV_FULL) && KV_FULL
#define ROWS_FULL 1
#else
#define ROWS_FULL 0
#endif
#define DEFINE_ROW_LOADS(S, T, LD1, LD4, LD16)                                                   \
    inline float4 row_load4##S(__global const T *p, int i, int n)                                \
    {                                                                                            \
        if (i + 3 < n)                                                                           \
            return LD4(p, i);                                                                    \
        return (float4)(i < n ? LD1(p, i) : 0.0f, i + 1 < n ? LD1(p, i + 1) : 0.0f,              \
                        i + 2 < n ? LD1(p, i + 2) : 0.0f, 0.0f);                                 \
    }                                                                                            \
    inline float16 ld16_row##S(__global const T *p, int col, int n)                              \
    {                                                                                            \
        if (ROWS_FULL || col + 15 < n)                                                           \
            return LD16(p, col);                                                                 \
        float t[16];                                                                             \
        for (int e = 0; e < 16; e++)                                                             \
            t[e] = col + e < n ? LD1(p, col + e) : 0.0f;                                         \
        return vload16(0, t);                                                                    \
    }
DEFINE_ROW_LOADS(_k, T_K, LD_K, LD4_K, LD16_K)
DEFINE_ROW_LOADS(_v, T_V, LD_V, LD4_V, LD16_V)

/* ---- Rows: the kv head's block-table row and pool size, the scales. */
typedef struct kv_src {
#if PAGE
    __global const int *bt; /* the batch's block-table row */
    int np;                 /* pages in the pool */
#endif
#if KVC
    __global const float *sc; /* the int8 scales of the kv head (rows as K's), or NULL */
    ulong sc_sb, sc_ss;
    float fs; /* the fp8 per-tensor scale */
#else
    int none;
#endif
} kv_src;

#if KVC
/* bt_* the block table (int32 [batch][...], row stride bt_sb), k_np / v_np the pools' pages;
 * k_sc / v_sc the int8 scales as views ([batch|pages][heads_kv][seq|page][1]); k_fs / v_fs the
 * fp8 scales. */
#define KVC_ARGS                                                                                 \
    , __global const int *kv_bt, ulong bt_off, ulong bt_sb, int k_np, int v_np,                  \
        __global const float *k_sc, ulong ks_off, ulong ks_sb, ulong ks_sh, ulong ks_ss,         \
        __global const float *v_sc, ulong vs_off, ulong vs_sb, ulong vs_sh, ulong vs_ss, float k_fs, \
        float v_fs, __global const int *cu_q, __global const int *cu_k, int total_q, int total_k
inline kv_src kv_src_of(__global const int *bt, ulong bt_off, ulong bt_sb, int np, __global const float *sc,
                        ulong s_off, ulong s_sb, ulong s_sh, ulong s_ss, float fs, int b, int hk, int k0)
{
    kv_src s;
#if PAGE
    s.bt = bt + bt_off + (ulong)b * bt_sb;
    s.np = np;
    s.sc = sc ? sc + s_off + (ulong)hk * s_sh : sc;
#else
    /* packed keys (VARLEN): the sequence's scales from its first row k0, as its K and V rows */
    s.sc = sc ? sc + s_off + (ulong)b * s_sb + (ulong)hk * s_sh + (ulong)k0 * s_ss : sc;
#endif
    s.sc_sb = s_sb;
    s.sc_ss = s_ss;
    s.fs = fs;
    return s;
}
/* k0: the first key row of the batch's packed sequence (VARLEN; 0 otherwise). */
#define K_SRC(b, hk, k0) kv_src_of(kv_bt, bt_off, bt_sb, k_np, k_sc, ks_off, ks_sb, ks_sh, ks_ss, k_fs, (b), (hk), (k0))
#define V_SRC(b, hk, k0) kv_src_of(kv_bt, bt_off, bt_sb, v_np, v_sc, vs_off, vs_sb, vs_sh, vs_ss, v_fs, (b), (hk), (k0))
#else
#define KVC_ARGS
#define K_SRC(b, hk, k0) ((kv_src){0})
#define V_SRC(b, hk, k0) ((kv_src){0})
#endif

/* Packed sequences (VARLEN): cu_q / cu_k, FlashAttention's cu_seqlens_q / _k of batch + 1 entries
 * (NULL where that side is not packed), and the packed tensors' rows total_q / total_k. Each
 * batch's first row and length are work_range_of's (attn_common.cl): w.q0, w.sq, w.k0, w.L. */
typedef struct kv_seqs {
#if VARLEN
    __global const int *cu_q, *cu_k;
    int total_q, total_k;
#else
    int none;
#endif
} kv_seqs;
#if VARLEN
#define KV_SEQS() ((kv_seqs){cu_q, cu_k, total_q, total_k})
#else
#define KV_SEQS() ((kv_seqs){0})
#endif

/* Units from the kv head's base to key's row (sb the pool's page stride, ss the row stride). */
inline ulong kv_row(const kv_src *s, int key, ulong sb, ulong ss)
{
#if PAGE
    return (ulong)clamp(s->bt[key / PAGE], 0, s->np - 1) * sb + (ulong)(key % PAGE) * ss;
#else
    return (ulong)key * ss;
#endif
}

/* The kv head's base: without the batch term when paged (the pools have pages there). */
#if PAGE
#define KV_HEAD(P, off, sb, sh, b, hk) ((P) + (off) + (ulong)(hk) * (sh))
#else
#define KV_HEAD(P, off, sb, sh, b, hk) ((P) + (off) + (ulong)(b) * (sb) + (ulong)(hk) * (sh))
#endif

/* The scale of key's K (V) row: the int8 table's entry, the fp8 scale, or 1. */
#define DEFINE_KV_SCALE(NAME, DT)                                                                \
    inline float NAME(const kv_src *s, int key)                                                  \
    {                                                                                            \
        if (DT == 3)                                                                             \
            return KVC_SCALE_ROW(s, key);                                                        \
        if (DT == 4 || DT == 5)                                                                  \
            return KVC_FS(s);                                                                    \
        return 1.0f;                                                                             \
    }
#if KVC
#define KVC_SCALE_ROW(s, key) (s)->sc[kv_row((s), (key), (s)->sc_sb, (s)->sc_ss)]
#define KVC_FS(s) (s)->fs
#else
#define KVC_SCALE_ROW(s, key) 1.0f
#define KVC_FS(s) 1.0f
#endif
DEFINE_KV_SCALE(k_scale_of, DT_K)
DEFINE_KV_SCALE(v_scale_of, DT_V)
/* Whether a key's scale is 1 whatever the key (no multiplication to do). */
#define K_UNIT_SCALE (DT_K <= 2 || DT_K >= 6)
#define V_UNIT_SCALE (DT_V <= 2 || DT_V >= 6)

#if defined(DP16)
/* Lane e: the dot product of row q with key kc + e (times the key's scale) of the K rows at Kb
 * (kv_row), keys past klast loading key klast (the caller hides or drops them). The 16 keys'
 * loads are unrolled: more misses in flight, which bandwidth-bound decodes of few rows need more
 * than fewer loads; but not for the KV-cache types, whose decoding, unrolled 16 times, left
 * LLVM a schedule that kept every value on the stack (q4_0 decode 2.8 times slower than with the
 * keys one at a time; docs/measurements.md#kv-cache). A block type's 32 products take their
 * block's scale once. Always inlined: PoCL 3.1 left it a call, in which vload_half16 of a K row of
 * odd head_dim (not 16-byte aligned) became an aligned load that faulted; inlined, the loads are
 * unaligned ones, as in the kernels. */
__attribute__((always_inline)) inline float16 qk16_row(const qrow *q, __global const T_K *Kb, const kv_src *ks,
                                                       ulong k_sb, ulong k_ss, int kc, int klast, int D)
{
    float16 t[16];
#if DT_K >= 3
#pragma unroll 1
#else
#pragma unroll
#endif
    for (int e = 0; e < 16; e++) {
        const int key = min(kc + e, klast);
        __global const T_K *kr = Kb + kv_row(ks, key, k_sb, k_ss);
        float16 acc = (float16)(0.0f);
#if KV_BLOCKED(DT_K) /* DP16 = D, a multiple of 32 */
#pragma unroll
        for (int c = 0; c < DP16 / 32; c++)
            acc = MAD((float16)(BSC_K(kr, 32 * c)),
                      MAD(q->v[2 * c + 1], LD16R_K(kr, 32 * c + 16), q->v[2 * c] * LD16R_K(kr, 32 * c)), acc);
        t[e] = acc; /* RSC_K at the end */
#else
#pragma unroll
        for (int c = 0; c < DP16 / 16 - 1; c++)
            acc = MAD(q->v[c], LD16_K(kr, 16 * c), acc);
        t[e] = MAD(q->v[DP16 / 16 - 1], ld16_row_k(kr, DP16 - 16, D), acc);
#endif
        if (!K_UNIT_SCALE)
            t[e] *= k_scale_of(ks, key);
    }
    return hsum16x16(t) * RSC_K; /* 1 but for q4_0 */
}

/* qk16_row for the QT_R rows q[0..QT_R-1] into s[0..QT_R-1], in register tiles of QT_R rows by
 * QT_E keys (common.cl): a K vector serves QT_R rows and a Q vector QT_E keys, so a
 * multiply-add costs 1/QT_R + 1/QT_E loads instead of 2 (where many rows read each K row:
 * grouped-query heads, prefill rows). The 16 K rows stay in L1 while the caller's row tiles pass
 * over them. */
__attribute__((always_inline)) inline void qk16_tile(const qrow *q, __global const T_K *Kb, const kv_src *ks,
                                                     ulong k_sb, ulong k_ss, int kc, int klast, int D, float16 *s)
{
    float16 t[QT_R][16];
#pragma unroll 1
    for (int e0 = 0; e0 < 16; e0 += QT_E) {
        __global const T_K *kr[QT_E];
        float16 acc[QT_R][QT_E];
        float ksc[QT_E];
#pragma unroll
        for (int e = 0; e < QT_E; e++) {
            const int key = min(kc + e0 + e, klast);
            kr[e] = Kb + kv_row(ks, key, k_sb, k_ss);
            ksc[e] = K_UNIT_SCALE ? 1.0f : k_scale_of(ks, key);
#pragma unroll
            for (int i = 0; i < QT_R; i++)
                acc[i][e] = (float16)(0.0f);
        }
#pragma unroll
        for (int c = 0; c < DP16 / 16; c++) {
            float16 kv[QT_E];
#pragma unroll
            for (int e = 0; e < QT_E; e++)
                kv[e] = c < DP16 / 16 - 1 ? LD16_K(kr[e], 16 * c) : ld16_row_k(kr[e], DP16 - 16, D);
#pragma unroll
            for (int i = 0; i < QT_R; i++)
#pragma unroll
                for (int e = 0; e < QT_E; e++)
                    acc[i][e] = MAD(q[i].v[c], kv[e], acc[i][e]);
        }
#pragma unroll
        for (int i = 0; i < QT_R; i++)
#pragma unroll
            for (int e = 0; e < QT_E; e++)
                t[i][e0 + e] = K_UNIT_SCALE ? acc[i][e] : acc[i][e] * ksc[e];
    }
#pragma unroll
    for (int i = 0; i < QT_R; i++)
        s[i] = hsum16x16(t[i]);
}
#endif /* DP16 */
#endif /* DT_IN */
