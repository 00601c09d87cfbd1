/* Two independent 64-bit FNV-1a lanes (different offset bases) give a 128-bit cache key: enough
 * that two different (source, options, device, driver) tuples never share a file in practice. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#define FNV_PRIME 0x00000100000001b3ULL

void clattn__hash_init(clattn_hash *h)
{
    h->a = 0xcbf29ce484222325ULL;
    h->b = 0x84222325cbf29ce4ULL;
}

void clattn__hash_bytes(clattn_hash *h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h->a = (h->a ^ p[i]) * FNV_PRIME;
        /* The second lane sees each byte rotated so the lanes do not collide together. */
        h->b = (h->b ^ (unsigned char)((p[i] << 3) | (p[i] >> 5))) * FNV_PRIME;
    }
}

void clattn__hash_str(clattn_hash *h, const char *s)
{
    clattn__hash_bytes(h, s ? s : "", (s ? strlen(s) : 0) + 1);
}

void clattn__hash_hex(const clattn_hash *h, char out[33])
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h->a, (unsigned long long)h->b);
}
