/*
 * Host-side conversions between float and clattn's storage types, shared by clattn-bench and
 * clattn-tune: both round their inputs to the storage type on the host, so that the float64
 * reference sees exactly what the device reads, and read f16/bf16 outputs back.
 */
#ifndef CLATTN_TOOLS_STORAGE_H
#define CLATTN_TOOLS_STORAGE_H

#include "clattn.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Round to nearest even, as the device's vstore_half_rte would. */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half, exactly round(|f| * 2^24) */
        float af;
        memcpy(&af, &ax, 4);
        return (uint16_t)(sign | (uint16_t)lrintf(af * 16777216.0f));
    }
    uint32_t h = ((((ax >> 23) - 127 + 15)) << 10) | ((ax & 0x7fffffu) >> 13);
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right answer */
    return (uint16_t)(sign | h);
}

static inline double f16_to_f64(uint16_t h)
{
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m | 0x400, e - 25);
    return (h & 0x8000) ? -v : v;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline double bf16_to_f64(uint16_t b)
{
    const uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* Stores v as dtype at element i of p. */
static inline void store(void *p, size_t i, clattn_dtype dt, float v)
{
    if (dt == CLATTN_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = dt == CLATTN_F16 ? f32_to_f16(v) : f32_to_bf16(v);
}

/* Element i of p, of type dt. */
static inline double load(const void *p, size_t i, clattn_dtype dt)
{
    if (dt == CLATTN_F32)
        return ((const float *)p)[i];
    const uint16_t h = ((const uint16_t *)p)[i];
    return dt == CLATTN_F16 ? f16_to_f64(h) : bf16_to_f64(h);
}

/* f as the device holds it after storage as dt (exact in float for every dt). */
static inline float stored(float f, clattn_dtype dt)
{
    if (dt == CLATTN_F32)
        return f;
    return (float)(dt == CLATTN_F16 ? f16_to_f64(f32_to_f16(f)) : bf16_to_f64(f32_to_bf16(f)));
}

#endif /* CLATTN_TOOLS_STORAGE_H */
