/*
 * libFuzzer harness: the binary-cache reader (src/cache.c). The input, after one mode byte, is
 * written as the cache entry <dir>/<key>.clbin and loaded with clattn__cache_load, or, in the
 * store mode, stored with clattn__cache_store and loaded back.
 *
 * The format, checked here independently of cache.c: 16-byte magic "CLATTN-BINARY-1\0", the
 * 32-hex-digit key, payload size and payload hash as 8 little-endian bytes each, the payload, and
 * nothing after it. The hash is two 64-bit FNV-1a lanes (offset bases 0xcbf29ce484222325 and
 * 0x84222325cbf29ce4, the second lane fed each byte rotated left by 3), folded as a ^ (b << 1).
 *   - A file that is valid must be accepted with exactly its payload; anything else must be
 *     rejected (NULL) and counted in disk_rejects, with nothing left allocated (LeakSanitizer, after
 *     every input: scripts/test.sh runs this harness with leak checks on).
 *   - Store mode: what clattn__cache_store writes loads back byte for byte, and no temporary file
 *     is left in the directory.
 * No OpenCL device is needed: the reader only uses the context's cache directory and counters.
 */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

static const char KEY[33] = "0123456789abcdef0123456789abcdef";
#define HEADER 64
#define MAX_PAYLOAD (512u << 20)

static clattn_context *ctx; /* a bare struct: only cache_dir, cache_enabled and stats are used */
static char path[4200];

static void die(const char *what)
{
    fprintf(stderr, "\n==clattn-fuzz== contract violation: %s\n", what);
    abort();
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint64_t oracle_hash(const uint8_t *p, size_t n)
{
    uint64_t a = 0xcbf29ce484222325ULL, b = 0x84222325cbf29ce4ULL;
    for (size_t i = 0; i < n; ++i) {
        a = (a ^ p[i]) * 0x100000001b3ULL;
        b = (b ^ (uint8_t)((p[i] << 3) | (p[i] >> 5))) * 0x100000001b3ULL;
    }
    return a ^ (b << 1);
}

static int oracle_valid(const uint8_t *f, size_t n)
{
    static const char magic[16] = "CLATTN-BINARY-1";
    if (n < HEADER || memcmp(f, magic, 16) != 0 || memcmp(f + 16, KEY, 32) != 0)
        return 0;
    const uint64_t size = get64(f + 48);
    return size > 0 && size <= MAX_PAYLOAD && size == n - HEADER && oracle_hash(f + HEADER, n - HEADER) == get64(f + 56);
}

static void setup(void)
{
    if (ctx != NULL)
        return;
    /* The files written below (fopen: 0666 less the umask) are then 0644, which the cache trusts
     * (docs/guarantees.md) whatever umask the run started with. */
    umask(022);
    ctx = calloc(1, sizeof *ctx);
    const char *base = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/clattn-fuzz-cache-XXXXXX", base != NULL && *base ? base : "/tmp");
    if (ctx == NULL || mkdtemp(dir) == NULL)
        die("cannot make a temporary directory");
    snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", dir);
    ctx->cache_enabled = 1;
    snprintf(path, sizeof path, "%s/%s.clbin", dir, KEY);
}

static void check_no_temporaries(void)
{
    DIR *d = opendir(ctx->cache_dir);
    if (d == NULL)
        die("the cache directory disappeared");
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp") != NULL)
            die("a temporary file was left in the cache directory");
    closedir(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup();
    if (size == 0)
        return 0;
    const uint8_t mode = data[0] % 4;
    const uint8_t *body = data + 1;
    const size_t n = size - 1;
    unlink(path);
    if (mode == 3) {
        /* Store, then load: the round trip is exact. */
        const unsigned writes = ctx->stats.disk_writes;
        clattn__cache_store(ctx, KEY, body, n);
        check_no_temporaries();
        size_t got = 0;
        unsigned char *bin = clattn__cache_load(ctx, KEY, &got);
        if (n == 0) {
            if (bin != NULL || ctx->stats.disk_writes != writes)
                die("an empty payload was stored or loaded");
        } else if (bin == NULL || got != n || memcmp(bin, body, n) != 0 || ctx->stats.disk_writes != writes + 1) {
            die("a stored payload did not load back exactly");
        }
        free(bin);
        return 0;
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL || (n > 0 && fwrite(body, 1, n, f) != n) || fclose(f) != 0)
        die("cannot write the cache file");
    const unsigned rejects = ctx->stats.disk_rejects;
    size_t got = (size_t)-1;
    unsigned char *bin = clattn__cache_load(ctx, KEY, &got);
    if (oracle_valid(body, n)) {
        if (bin == NULL)
            die("a valid cache file was rejected");
        if (got != n - HEADER || memcmp(bin, body + HEADER, got) != 0)
            die("a valid cache file loaded with the wrong payload");
        if (ctx->stats.disk_rejects != rejects)
            die("a valid cache file counted as rejected");
    } else {
        if (bin != NULL)
            die("an invalid cache file was accepted");
        if (ctx->stats.disk_rejects != rejects + 1)
            die("an invalid cache file was not counted in disk_rejects");
    }
    free(bin);
    return 0;
}
