/*
 * The KV-cache storage types of clattn_dtype (issue 73) decoded from their definitions, in double,
 * for the tests and tools that check clattn against the float64 reference (ref/clattn_ref_kv.c).
 * Written from the formats' published definitions, not from the kernels (cl/kv_access.cl).
 */
#ifndef CLATTN_REF_KV_H
#define CLATTN_REF_KV_H

#include <stddef.h>

/* Storage codes: clattn_dtype's values (the reference does not include clattn.h). */
enum {
    REF_KV_F32 = 0,
    REF_KV_F16 = 1,
    REF_KV_BF16 = 2,
    REF_KV_I8 = 3,       /* int8 q; x = scale·q */
    REF_KV_FP8_E4M3 = 4, /* OCP E4M3 ("fn"): bias 7, no infinities, S.1111.111 NaN; x = scale·fp8 */
    REF_KV_FP8_E5M2 = 5, /* OCP E5M2: bias 15, IEEE-like; x = scale·fp8 */
    REF_KV_Q8_0 = 6,     /* ggml q8_0: blocks of 32: f16 d (little-endian), 32 int8; x = d·q */
    REF_KV_Q4_0 = 7      /* ggml q4_0: f16 d, 16 bytes; byte j: low nibble element j, high j + 16;
                          * x = d·(nibble - 8) */
};

/* The value of one fp8 code (dtype REF_KV_FP8_E4M3 or E5M2), unscaled. */
double ref_fp8_value(int dtype, unsigned char code);
/* Bytes of a row of d elements (d a multiple of 32 for q8_0 and q4_0). */
size_t ref_kv_row_bytes(int dtype, int d);
/* The d values of the row stored at p, times `scale` for i8 and fp8 (ignored by the others). */
void ref_kv_decode_row(int dtype, const unsigned char *p, int d, double scale, double *x);

#endif /* CLATTN_REF_KV_H */
