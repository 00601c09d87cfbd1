/*
 * Float64 reference for clattn_kv_append (docs/kv-append.md): rotary embedding, and the KV-cache
 * storage types written from their definitions. See the declarations at the end of clattn_ref.h.
 *
 * The rotation is exact double math (pow, cos, sin of the exact angle). The storage encoders
 * round by search or by scaling in double, not by the kernels' bit manipulation: fp8 picks the
 * nearest of the format's finite values by enumerating them, binary16 rounds the exact quotient
 * by the binade's quantum. ggml's q8_0 / q4_0 and clattn's i8 are defined in float arithmetic
 * (their bytes depend on each float rounding), so those follow their definitions step by step
 * in float, each step stored to a float variable (no wider intermediates, C11 5.2.4.2.2).
 */
#include "clattn_ref.h"

#include <math.h>

double ref_rope_angle(const ref_rope *r, long long pos, int i)
{
    const double theta = r->theta != 0.0 ? r->theta : 10000.0;
    return (double)pos * pow(theta, -2.0 * (double)i / (double)r->rope_dims);
}

void ref_rope_row(const ref_rope *r, long long pos, const double *x, double *out)
{
    double tmp[1024];
    const int n = r->head_dim < 1024 ? r->head_dim : 1024;
    for (int d = 0; d < n; d++)
        tmp[d] = x[d];
    const int rd = r->style == 0 ? 0 : r->rope_dims, half = rd / 2;
    for (int i = 0; i < half; i++) {
        double c, s;
        if (r->cos_table) {
            long long row = pos < 0 ? 0 : pos;
            if (row > r->table_rows - 1)
                row = r->table_rows - 1;
            c = r->cos_table[row * half + i];
            s = r->sin_table[row * half + i];
        } else {
            const double a = ref_rope_angle(r, pos, i);
            c = cos(a);
            s = sin(a);
        }
        const int lo = r->style == 1 ? 2 * i : i, hi = r->style == 1 ? 2 * i + 1 : i + half;
        tmp[lo] = x[lo] * c - x[hi] * s;
        tmp[hi] = x[lo] * s + x[hi] * c;
    }
    for (int d = 0; d < n; d++)
        out[d] = tmp[d];
}

/* x rounded to nearest even at the quantum 2^(max(e, emin) - mbits) of its binade (e: x's
 * exponent, x = m·2^e with 1 <= m < 2), in double; x >= 0 finite. */
static double round_binade(double x, int mbits, int emin)
{
    if (x == 0.0)
        return 0.0;
    int e;
    frexp(x, &e); /* x = f·2^e, 0.5 <= f < 1 */
    e -= 1;
    if (e < emin)
        e = emin;
    const double quantum = ldexp(1.0, e - mbits);
    return nearbyint(x / quantum) * quantum; /* default rounding: to nearest even */
}

unsigned short ref_f16_bits(double x)
{
    const unsigned short sign = signbit(x) ? 0x8000u : 0u;
    if (isnan(x))
        return (unsigned short)(sign | 0x7e00u);
    const double v = round_binade(fabs(x), 10, -14);
    if (v > 65504.0)
        return (unsigned short)(sign | 0x7c00u);
    if (v < ldexp(1.0, -14)) /* subnormal (or zero): v = n·2^-24 */
        return (unsigned short)(sign | (unsigned)(v * ldexp(1.0, 24)));
    int e;
    const double f = frexp(v, &e); /* v = f·2^e */
    const unsigned mant = (unsigned)((f * 2.0 - 1.0) * 1024.0);
    return (unsigned short)(sign | (unsigned)(e - 1 + 15) << 10 | mant);
}

double ref_f16_value(unsigned short h)
{
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    const unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return m ? NAN : sign * INFINITY;
    if (e == 0)
        return sign * ldexp((double)m, -24);
    return sign * ldexp(1.0 + (double)m / 1024.0, (int)e - 15);
}

/* fp8 formats: mantissa bits, bias, and the largest finite code. */
static double fp8_value(unsigned char c, int mbits, int bias, int e5m2)
{
    const double sign = (c & 0x80u) ? -1.0 : 1.0;
    const unsigned e = (c >> mbits) & ((1u << (7 - mbits)) - 1u), m = c & ((1u << mbits) - 1u);
    if (e5m2 && e == 0x1f)
        return m ? NAN : sign * INFINITY;
    if (!e5m2 && (c & 0x7fu) == 0x7fu)
        return NAN;
    if (e == 0)
        return sign * ldexp((double)m, 1 - bias - mbits);
    return sign * ldexp(1.0 + (double)m / (double)(1u << mbits), (int)e - bias);
}

/* The nearest finite code by search: the positive codes 0 .. maxc increase with their values;
 * a tie goes to the even code (even mantissa); |x| at or above the largest value saturates. */
static unsigned char fp8_encode(double x, int mbits, int bias, int e5m2, unsigned maxc)
{
    const unsigned sign = signbit(x) ? 0x80u : 0u;
    if (isnan(x))
        return (unsigned char)(sign | 0x7fu);
    const double a = fabs(x);
    unsigned best = 0;
    double best_err = INFINITY;
    for (unsigned c = 0; c <= maxc; c++) {
        const double err = fabs(fp8_value((unsigned char)c, mbits, bias, e5m2) - a);
        if (err < best_err || (err == best_err && c % 2 == 0)) {
            best = c;
            best_err = err;
        }
    }
    if (a >= fp8_value((unsigned char)maxc, mbits, bias, e5m2))
        best = maxc;
    return (unsigned char)(sign | best);
}

unsigned char ref_fp8_e4m3(double x) { return fp8_encode(x, 3, 7, 0, 0x7eu); }
unsigned char ref_fp8_e5m2(double x) { return fp8_encode(x, 2, 15, 1, 0x7bu); }
double ref_fp8_e4m3_value(unsigned char c) { return fp8_value(c, 3, 7, 0); }
double ref_fp8_e5m2_value(unsigned char c) { return fp8_value(c, 2, 15, 1); }

void ref_quantize_q8_0(const float *x, int n, unsigned char *out)
{
    for (int b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        unsigned char *o = out + 34 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            if (fabsf(xb[j]) > amax) /* false for NaN: skipped */
                amax = fabsf(xb[j]);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const unsigned short h = ref_f16_bits((double)d);
        o[0] = (unsigned char)(h & 0xffu);
        o[1] = (unsigned char)(h >> 8);
        for (int j = 0; j < 32; j++) {
            const float v = xb[j] * id;
            const float r = isnan(v) ? 0.0f : roundf(v);
            const int q = r > 127.0f ? 127 : r < -128.0f ? -128 : (int)r;
            o[2 + j] = (unsigned char)(signed char)q;
        }
    }
}

void ref_quantize_q4_0(const float *x, int n, unsigned char *out)
{
    for (int b = 0; b < n / 32; b++) {
        const float *xb = x + 32 * b;
        unsigned char *o = out + 18 * b;
        float amax = 0.0f, m = 0.0f;
        for (int j = 0; j < 32; j++)
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                m = xb[j];
            }
        const float d = m / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const unsigned short h = ref_f16_bits((double)d);
        o[0] = (unsigned char)(h & 0xffu);
        o[1] = (unsigned char)(h >> 8);
        int q[32];
        for (int j = 0; j < 32; j++) {
            const float v = xb[j] * id;
            const float s = v + 8.5f;
            const int t = isnan(s) ? 0 : s >= 127.0f ? 127 : s <= -128.0f ? -128 : (int)s; /* truncates */
            q[j] = t < 15 ? t : 15;
        }
        for (int j = 0; j < 16; j++)
            o[2 + j] = (unsigned char)((q[j] & 0xf) | (q[j + 16] & 0xf) << 4);
    }
}

void ref_dequantize_q8_0(const unsigned char *in, int n, double *x)
{
    for (int b = 0; b < n / 32; b++) {
        const unsigned char *blk = in + 34 * b;
        const double d = ref_f16_value((unsigned short)(blk[0] | blk[1] << 8));
        for (int j = 0; j < 32; j++)
            x[32 * b + j] = d * (double)(signed char)blk[2 + j];
    }
}

void ref_dequantize_q4_0(const unsigned char *in, int n, double *x)
{
    for (int b = 0; b < n / 32; b++) {
        const unsigned char *blk = in + 18 * b;
        const double d = ref_f16_value((unsigned short)(blk[0] | blk[1] << 8));
        for (int j = 0; j < 16; j++) {
            x[32 * b + j] = d * (double)((int)(blk[2 + j] & 0xfu) - 8);
            x[32 * b + j + 16] = d * (double)((int)(blk[2 + j] >> 4) - 8);
        }
    }
}

float ref_quantize_i8(const float *x, int n, signed char *q)
{
    float amax = 0.0f;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax)
            amax = fabsf(x[j]);
    const float s = amax / 127.0f;
    for (int j = 0; j < n; j++) {
        const float v = s != 0.0f ? x[j] / s : 0.0f;
        const float r = isnan(v) ? 0.0f : roundf(v);
        q[j] = (signed char)(r > 127.0f ? 127 : r < -128.0f ? -128 : (int)r);
    }
    return s;
}
