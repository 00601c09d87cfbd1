/* clattn_kv_append (src/kv_append.c, docs/kv-append.md): rotary embedding of the new tokens' q and
 * k, and the store of k and v into the KV cache, converted or quantized to its storage type.
 *
 * Sources X (q, k_new or v_new) are [batch][heads][seq][D] views in elements of their type
 * (x_dt: 0 f32, 1 f16, 2 bf16); row r of the launch is (b, h, t) with r = (b·heads + h)·seq + t,
 * and token t of batch b sits at position pos = POS[b] + t (POS NULL: t), in 64 bits.
 * Destinations Y (y_dt: 0-2 as above, 3 int8, 4 fp8 E4M3, 5 fp8 E5M2, 6 q8_0, 7 q4_0) are
 * addressed in elements for 0-2, in bytes for 3-7 (1-byte elements, and the blocks of 34 / 18
 * bytes of q8_0 / q4_0, whose views src/validate.c gives in bytes). Where row (b, h, t) goes
 * (ap_dest):
 *   mode 0 (q_out):  y_off + b·y_sb + h·y_sh + t·y_ss
 *   mode 1 (cache):  y_off + b·y_sb + h·y_sh + pos·y_ss, written only for 0 <= pos < nrows
 *   mode 2 (paged):  s = SLOT[b·seq + t], y_off + (s / page)·y_sb + h·y_sh + (s % page)·y_ss,
 *                    written only for 0 <= s < nrows (nrows = pages·page)
 * so that no position or slot can send a store outside the caller's view.
 *
 * Rotation of pair i < RD / 2 (style 1 interleaved: dims 2i, 2i + 1; style 2 NeoX: i, i + RD/2;
 * style 0: none): (x, y) -> (x·c - y·s, x·s + y·c). cos and sin come from the tables TC / TS
 * (f32 [P][RD / 2] views, row pos clamped into [0, P)), or from the angle pos·f_i in f32 with
 * f_i = theta^(-2i / RD) = 2^(-2i·log2(theta) / RD): the host gives log2(theta) as a pair of
 * floats lhi + llo, and the exponent is formed with its rounding errors kept (fma), so that f_i
 * is as accurate as the device's exp2 (ap_freq). Dims from RD on are copied.
 *
 * The kernels (one program for every storage type: the types are arguments, uniform branches, so
 * that a cold build is paid once, not per pair of types):
 *   ap_elem:  types 0-2, 4, 5. One work-item per pair of rotated dims and per copied dim of a row
 *             (grid x: RD / 2 + D - RD columns), so that q may be rotated in place: each
 *             work-item reads both elements of its pair before it writes them.
 *   ap_block: q8_0 and q4_0. One work-item per block of 32 dims of a row (grid x: D / 32).
 *   ap_i8:    int8, one work-item per row (grid x: rows, 1D): the row's scale needs its amax.
 * Rows of ap_elem and ap_block go in grid y and z: r = y + ny·z (clattn__row_grid). */

/* ---- loads and stores ---- */

inline float ap_load(__global const uchar *X, ulong i, int dt)
{
    if (dt == 0)
        return ((__global const float *)X)[i];
    if (dt == 1)
        return vload_half(i, (__global const half *)X);
    return as_float((uint)((__global const ushort *)X)[i] << 16);
}

/* OCP fp8 with `mb` mantissa bits and exponent bias `bias`: x rounded to nearest even, |x| at or
 * above `maxv` (the largest finite value, infinities included) saturated to it (code `maxc`), NaN
 * the all-ones code with x's sign. The quantum of x's binade (below the smallest normal, of the
 * subnormals) is a power of two, so x / quantum is exact and rint rounds it to nearest even; the
 * code of a normal is (exponent field << mb) + n - 2^mb, which carries into the exponent when n
 * rounds up to 2^(mb + 1), and a subnormal's code is n itself (n = 2^mb is the smallest normal). */
inline uchar ap_fp8(float x, int mb, int bias, float maxv, uint maxc)
{
    const uint u = as_uint(x), sign = (u >> 24) & 0x80u;
    const float a = fabs(x);
    if (isnan(a))
        return (uchar)(sign | 0x7fu);
    if (a >= maxv)
        return (uchar)(sign | maxc);
    const int emin = 1 - bias, ex = (int)((u >> 23) & 0xffu) - 127; /* f32 subnormals: -127 */
    const int sub = ex < emin, eq = (sub ? emin : ex) - mb;           /* exponent of the quantum */
    const uint n = (uint)rint(a * as_float((uint)(127 - eq) << 23));
    return (uchar)(sign | (sub ? n : ((uint)(ex + bias) << mb) + n - (1u << mb)));
}

/* Element i (element units, bytes for fp8) of Y as type dt; fp8 stores x / div. */
inline void ap_store(__global uchar *Y, ulong i, int dt, float x, float div)
{
    if (dt == 0)
        ((__global float *)Y)[i] = x;
    else if (dt == 1)
        vstore_half_rte(x, i, (__global half *)Y);
    else if (dt == 2)
        ((__global ushort *)Y)[i] = f32_to_bf16(x);
    else if (dt == 4)
        Y[i] = ap_fp8(x / div, 3, 7, 448.0f, 0x7eu);
    else
        Y[i] = ap_fp8(x / div, 2, 15, 57344.0f, 0x7bu);
}

/* ---- rotation ---- */

/* The arguments every kernel takes after its source and destination: the launch's rows and shape,
 * the rotation, the positions, where rows go, and the tables. */
#define AP_COMMON_ARGS                                                                           \
    int rows, int ny, int heads, int seq, int D, int RD, int style, float lhi, float llo,      \
        __global const float *TC, ulong tc_off, ulong tc_sb, ulong tc_sh, ulong tc_ss,          \
        __global const float *TS, ulong ts_off, ulong ts_sb, ulong ts_sh, ulong ts_ss, int trows, \
        __global const int *POS, int mode, __global const int *SLOT, long nrows, int page
#define AP_TRIG_ARGS RD, lhi, llo, TC, tc_off, tc_ss, TS, ts_off, ts_ss, trows
#define AP_ROT_ARGS RD, style, lhi, llo, TC, tc_off, tc_ss, TS, ts_off, ts_ss, trows

/* f_i = 2^(-t), t = 2i·log2(theta) / RD = 2i·(lhi + llo) / RD: t's leading part q and the rest
 * (the product's and the quotient's rounding errors, by fma, and llo's share) go apart, and
 * 2^(-t) = 2^(-q)·2^(-tl) with 2^(-tl) = 1 - tl·ln 2 to far below an f32 ulp (|tl| < 2^-18).
 * Without the split, t's own rounding (half an ulp of t, up to ~20 for large bases) would move f_i
 * by several ulp. */
inline float ap_freq(int i, int RD, float lhi, float llo)
{
    const float m = (float)(2 * i), rd = (float)RD;
    const float p = m * lhi, pe = fma(m, lhi, -p);
    const float q = p / rd, r = fma(-q, rd, p);
    const float tl = (r + pe + m * llo) / rd;
    return exp2(-q) * fma(-tl, 0.6931471805599453f, 1.0f);
}

/* cos and sin of pair i at position pos. */
inline float2 ap_cos_sin(int i, long pos, int RD, float lhi, float llo, __global const float *TC, ulong tc_off,
                         ulong tc_ss, __global const float *TS, ulong ts_off, ulong ts_ss, int trows)
{
    if (TC) {
        const ulong row = (ulong)clamp(pos, 0L, (long)trows - 1);
        return (float2)(TC[tc_off + row * tc_ss + (ulong)i], TS[ts_off + row * ts_ss + (ulong)i]);
    }
    const float angle = (float)pos * ap_freq(i, RD, lhi, llo);
    float c;
    const float s = sincos(angle, &c);
    return (float2)(c, s);
}

/* Dim d of the rotated row whose element 0 is X[x0] (for ap_block and ap_i8, which read rows
 * they never write). */
inline float ap_rotated(__global const uchar *X, ulong x0, int dt, int d, long pos, int RD, int style, float lhi,
                        float llo, __global const float *TC, ulong tc_off, ulong tc_ss, __global const float *TS,
                        ulong ts_off, ulong ts_ss, int trows)
{
    if (style == 0 || d >= RD)
        return ap_load(X, x0 + (ulong)d, dt);
    const int npairs = RD / 2;
    int i, lo, hi;
    if (style == 1) {
        i = d >> 1;
        lo = 2 * i;
        hi = lo + 1;
    } else {
        i = d < npairs ? d : d - npairs;
        lo = i;
        hi = i + npairs;
    }
    const float2 cs = ap_cos_sin(i, pos, AP_TRIG_ARGS);
    const float x = ap_load(X, x0 + (ulong)lo, dt), y = ap_load(X, x0 + (ulong)hi, dt);
    return d == lo ? x * cs.x - y * cs.y : x * cs.y + y * cs.x;
}

/* ---- where rows go ---- */

/* The launch row's (b, h, t) and position. */
#define AP_ROW_COORDS(row)                                                                      \
    const int t = (row) % seq, bh = (row) / seq, h = bh % heads, b = bh / heads;              \
    const long pos = (POS ? (long)POS[b] : 0L) + (long)t

/* The destination of row (b, h, t) in a view (off, sb, sh, ss), or 0 where it is not written. */
inline int ap_dest(int mode, int b, int h, int t, long pos, int seq, __global const int *SLOT, long nrows, int page,
                   ulong off, ulong sb, ulong sh, ulong ss, ulong *at)
{
    long lead = b, r = t;
    if (mode == 1) {
        if (pos < 0 || pos >= nrows)
            return 0;
        r = pos;
    } else if (mode == 2) {
        const long s = (long)SLOT[(ulong)b * (ulong)seq + (ulong)t];
        if (s < 0 || s >= nrows)
            return 0;
        lead = s / page;
        r = s % page;
    }
    *at = off + (ulong)lead * sb + (ulong)h * sh + (ulong)r * ss;
    return 1;
}

/* ---- kernels ---- */

#if !KSEL || K_ap_elem
__kernel void ap_elem(__global const uchar *X, ulong x_off, ulong x_sb, ulong x_sh, ulong x_ss, int x_dt,
                      __global uchar *Y, ulong y_off, ulong y_sb, ulong y_sh, ulong y_ss, int y_dt, float div,
                      AP_COMMON_ARGS)
{
    const int c = get_global_id(0);
    const long grow = (long)get_global_id(1) + (long)ny * (long)get_global_id(2);
    const int npairs = RD / 2;
    if (grow >= rows || c >= npairs + (D - RD))
        return;
    const int row = (int)grow;
    AP_ROW_COORDS(row);
    ulong y0;
    if (!ap_dest(mode, b, h, t, pos, seq, SLOT, nrows, page, y_off, y_sb, y_sh, y_ss, &y0))
        return;
    const ulong x0 = x_off + (ulong)b * x_sb + (ulong)h * x_sh + (ulong)t * x_ss;
    if (c >= npairs) {
        const ulong d = (ulong)(RD + c - npairs);
        ap_store(Y, y0 + d, y_dt, ap_load(X, x0 + d, x_dt), div);
        return;
    }
    const int lo = style == 1 ? 2 * c : c, hi = style == 1 ? 2 * c + 1 : c + npairs;
    const float2 cs = ap_cos_sin(c, pos, AP_TRIG_ARGS);
    /* Both loads before either store: Y may be X (q rotated in place). */
    const float x = ap_load(X, x0 + (ulong)lo, x_dt), y = ap_load(X, x0 + (ulong)hi, x_dt);
    ap_store(Y, y0 + (ulong)lo, y_dt, x * cs.x - y * cs.y, div);
    ap_store(Y, y0 + (ulong)hi, y_dt, x * cs.y + y * cs.x, div);
}
#endif

/* ggml's q8_0 and q4_0 reference quantizers (quantize_row_q8_0_ref / _q4_0_ref), block by block:
 *   q8_0: d = amax / 127, id = d ? 1 / d : 0, q_j = round(x_j·id) (halves away from 0);
 *   q4_0: m = the element of largest magnitude (the first of equals), d = m / -8, id as above,
 *         q_j = min(15, trunc(x_j·id + 8.5)), byte j = q_j | q_(j+16) << 4;
 * d stored as f16 (rounded to nearest even) at the block's start. NaN elements: skipped by the
 * amax (fmax), and stored as q 0 (q8_0) or 0 (q4_0, whose convert_char_sat of NaN is 0). */
#if !KSEL || K_ap_block
__kernel void ap_block(__global const uchar *X, ulong x_off, ulong x_sb, ulong x_sh, ulong x_ss, int x_dt,
                       __global uchar *Y, ulong y_off, ulong y_sb, ulong y_sh, ulong y_ss, int y_dt, float div,
                       AP_COMMON_ARGS)
{
    (void)div;
    const int blk = get_global_id(0);
    const long grow = (long)get_global_id(1) + (long)ny * (long)get_global_id(2);
    if (grow >= rows || blk >= D / 32)
        return;
    const int row = (int)grow;
    AP_ROW_COORDS(row);
    ulong y0;
    if (!ap_dest(mode, b, h, t, pos, seq, SLOT, nrows, page, y_off, y_sb, y_sh, y_ss, &y0))
        return;
    const ulong x0 = x_off + (ulong)b * x_sb + (ulong)h * x_sh + (ulong)t * x_ss;
    float v[32];
    for (int j = 0; j < 32; j++)
        v[j] = ap_rotated(X, x0, x_dt, 32 * blk + j, pos, AP_ROT_ARGS);
    if (y_dt == 6) {
        __global uchar *q = Y + y0 + (ulong)blk * 34u;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmax(amax, fabs(v[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        vstore_half_rte(d, 0, (__global half *)q);
        for (int j = 0; j < 32; j++)
            q[2 + j] = as_uchar(convert_char_sat(round(v[j] * id)));
    } else {
        __global uchar *q = Y + y0 + (ulong)blk * 18u;
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabs(v[j])) {
                amax = fabs(v[j]);
                m = v[j];
            }
        const float d = m / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        vstore_half_rte(d, 0, (__global half *)q);
        for (int j = 0; j < 16; j++) {
            /* ggml's x·id + 8.5: the product rounded, then the add. Contracted to a fused
             * multiply-add (OpenCL C's default), a product on a half step (2.4375 · -2.6666667f
             * = -6.5) lost its rounding and truncated a step lower. */
#pragma OPENCL FP_CONTRACT OFF
            const int lo = min(15, (int)convert_char_sat(v[j] * id + 8.5f));
            const int hi = min(15, (int)convert_char_sat(v[j + 16] * id + 8.5f));
            q[2 + j] = (uchar)(lo | hi << 4);
        }
    }
}
#endif

/* int8 with one f32 scale per (token, kv head): s = amax / 127 over the row (NaN skipped), written
 * to the scales view SC (paged like Y, f32 elements); q = round(x / s) (halves away from 0,
 * saturated), 0 where s is 0. */
#if !KSEL || K_ap_i8
__kernel void ap_i8(__global const uchar *X, ulong x_off, ulong x_sb, ulong x_sh, ulong x_ss, int x_dt,
                    __global uchar *Y, ulong y_off, ulong y_sb, ulong y_sh, ulong y_ss,
                    __global float *SC, ulong sc_off, ulong sc_sb, ulong sc_sh, ulong sc_ss,
                    AP_COMMON_ARGS)
{
    (void)ny;
    const long grow = (long)get_global_id(0);
    if (grow >= rows)
        return;
    const int row = (int)grow;
    AP_ROW_COORDS(row);
    ulong y0, s0;
    if (!ap_dest(mode, b, h, t, pos, seq, SLOT, nrows, page, y_off, y_sb, y_sh, y_ss, &y0))
        return;
    ap_dest(mode, b, h, t, pos, seq, SLOT, nrows, page, sc_off, sc_sb, sc_sh, sc_ss, &s0);
    const ulong x0 = x_off + (ulong)b * x_sb + (ulong)h * x_sh + (ulong)t * x_ss;
    /* Two passes over the row (the rotation is recomputed): a private copy of up to 576 floats
     * would spill on GPUs. */
    float amax = 0.0f;
    for (int d = 0; d < D; d++)
        amax = fmax(amax, fabs(ap_rotated(X, x0, x_dt, d, pos, AP_ROT_ARGS)));
    const float s = amax / 127.0f;
    SC[s0] = s;
    for (int d = 0; d < D; d++) {
        const float x = ap_rotated(X, x0, x_dt, d, pos, AP_ROT_ARGS);
        Y[y0 + (ulong)d] = s != 0.0f ? as_uchar(convert_char_sat(round(x / s))) : (uchar)0;
    }
}
#endif
