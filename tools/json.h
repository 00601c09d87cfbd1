/*
 * JSON output shared by clattn-info and clattn-tune: strings from drivers and paths (device names,
 * tuning directories) may hold quotes, control characters or bytes that are not UTF-8.
 */
#ifndef CLATTN_TOOLS_JSON_H
#define CLATTN_TOOLS_JSON_H

#include <stdio.h>

/* Writes a JSON string. Escapes what JSON requires and replaces invalid UTF-8 (drivers may return
 * Latin-1 or garbage) with U+FFFD, so the output always parses. */
static inline void json_string(FILE *f, const char *s)
{
    if (s == NULL) {
        fputs("null", f);
        return;
    }
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    while (*p) {
        unsigned char c = *p;
        if (c < 0x80) {
            switch (c) {
            case '"': fputs("\\\"", f); break;
            case '\\': fputs("\\\\", f); break;
            case '\n': fputs("\\n", f); break;
            case '\r': fputs("\\r", f); break;
            case '\t': fputs("\\t", f); break;
            case '\b': fputs("\\b", f); break;
            case '\f': fputs("\\f", f); break;
            default:
                if (c < 0x20)
                    fprintf(f, "\\u%04x", (unsigned)c);
                else
                    fputc(c, f);
            }
            p++;
            continue;
        }
        /* Lead byte -> sequence length and the allowed range of the second byte, which is what
         * rules out overlong forms, surrogates and code points above U+10FFFF (RFC 3629). */
        size_t len = 0;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0)
                lo = 0xA0;
            if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0)
                lo = 0x90;
            if (c == 0xF4)
                hi = 0x8F;
        }
        int valid = len > 0 && p[1] >= lo && p[1] <= hi;
        for (size_t i = 2; valid && i < len; i++)
            valid = p[i] >= 0x80 && p[i] <= 0xBF; /* stops at the terminator, which fails this */
        if (valid) {
            fwrite(p, 1, len, f);
            p += len;
        } else {
            fputs("\\ufffd", f);
            p++;
        }
    }
    fputc('"', f);
}

#endif
