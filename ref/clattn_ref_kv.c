/* ref/clattn_ref_kv.h: the KV-cache storage types decoded in double. */
#include "clattn_ref_kv.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* IEEE binary16 bits to double. */
static double half_value(unsigned h)
{
    const int sign = (int)(h >> 15), e = (int)((h >> 10) & 31), m = (int)(h & 1023);
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, -24);
    else
        v = ldexp(1.0 + m / 1024.0, e - 15);
    return sign ? -v : v;
}

double ref_fp8_value(int dtype, unsigned char x)
{
    const int e4 = dtype == REF_KV_FP8_E4M3, mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15;
    const int sign = x >> 7, e = (x & 0x7f) >> mbits, m = x & ((1 << mbits) - 1);
    double v;
    if (e4 && (x & 0x7f) == 0x7f)
        return NAN;
    if (!e4 && e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp(1.0 + (double)m / (1 << mbits), e - bias);
    return sign ? -v : v;
}

size_t ref_kv_row_bytes(int dtype, int d)
{
    switch (dtype) {
    case REF_KV_F32:
        return 4u * (size_t)d;
    case REF_KV_F16:
    case REF_KV_BF16:
        return 2u * (size_t)d;
    case REF_KV_Q8_0:
        return (size_t)d / 32 * 34;
    case REF_KV_Q4_0:
        return (size_t)d / 32 * 18;
    default:
        return (size_t)d;
    }
}

void ref_kv_decode_row(int dtype, const unsigned char *p, int d, double scale, double *x)
{
    for (int i = 0; i < d; i++) {
        switch (dtype) {
        case REF_KV_F32: {
            float f;
            memcpy(&f, p + 4 * (size_t)i, 4);
            x[i] = f;
            break;
        }
        case REF_KV_F16:
            x[i] = half_value((unsigned)p[2 * i] | (unsigned)p[2 * i + 1] << 8);
            break;
        case REF_KV_BF16: {
            const uint32_t u = ((uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8) << 16;
            float f;
            memcpy(&f, &u, 4);
            x[i] = f;
            break;
        }
        case REF_KV_I8:
            x[i] = scale * (double)(signed char)p[i];
            break;
        case REF_KV_FP8_E4M3:
        case REF_KV_FP8_E5M2:
            x[i] = scale * ref_fp8_value(dtype, p[i]);
            break;
        case REF_KV_Q8_0: {
            const unsigned char *b = p + (size_t)(i / 32) * 34;
            x[i] = half_value((unsigned)b[0] | (unsigned)b[1] << 8) * (double)(signed char)b[2 + i % 32];
            break;
        }
        case REF_KV_Q4_0: {
            const unsigned char *b = p + (size_t)(i / 32) * 18;
            const int j = i % 32, nib = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
            x[i] = half_value((unsigned)b[0] | (unsigned)b[1] << 8) * (double)(nib - 8);
            break;
        }
        default:
            x[i] = NAN;
        }
    }
}
