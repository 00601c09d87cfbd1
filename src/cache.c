/* On-disk cache of built program binaries.
 *
 * File <dir>/<key>.clbin: 16-byte magic, the 32-hex-digit key again (so a renamed or swapped file
 * is recognised as foreign), payload size and payload hash as 8 little-endian bytes each, then the
 * payload. Written to a unique temporary name and renamed, so readers see a whole file or none,
 * also with several processes writing the same entry. Anything that does not check out is ignored
 * and rebuilt: the cache can make a build faster, never make it fail. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char MAGIC[16] = "CLATTN-BINARY-1";
#define HEADER_SIZE (16 + 32 + 8 + 8)
#define MAX_BINARY (512u << 20)

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint64_t payload_hash(const unsigned char *p, size_t n)
{
    clattn_hash h;
    clattn__hash_init(&h);
    clattn__hash_bytes(&h, p, n);
    return h.a ^ (h.b << 1);
}

FILE *clattn__create_temp(const char *tmp)
{
    /* O_EXCL: a name planted in the directory (a link elsewhere) is not followed; O_CLOEXEC: a
     * fork and exec on another thread meanwhile does not inherit the descriptor. */
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        remove(tmp);
    }
    return f;
}

void clattn__sweep_temps(const char *dir)
{
    /* Temporary files of writers that died between create and rename (cache entries, tuning
     * stores): ours by their name, and left alone for an hour, which no live writer takes. */
    DIR *d = opendir(dir);
    if (!d)
        return;
    const time_t old = time(NULL) - 3600;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 4, ".tmp") != 0 ||
            (!strstr(e->d_name, ".clbin.") && !strstr(e->d_name, ".tuning.")))
            continue;
        char path[4400];
        struct stat st;
        const int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len > 0 && (size_t)len < sizeof path && lstat(path, &st) == 0 && S_ISREG(st.st_mode) &&
            st.st_mtime < old)
            unlink(path);
    }
    closedir(d);
}

/* mkdir -p; returns 0 when the directory exists afterwards. */
int clattn__make_dirs(const char *path)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0700) != 0 && errno != EEXIST)
                return -1;
            buf[i] = c;
        }
    }
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

void clattn__cache_init(clattn_context *ctx)
{
    ctx->cache_enabled = clattn__env_flag("CLATTN_CACHE", 1);
    const char *dir = getenv("CLATTN_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (dir && *dir)
        n = snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s", dir);
    else if (xdg && xdg[0] == '/') /* the XDG rule: a relative value is ignored */
        n = snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s/clattn", xdg);
    else if (home && *home)
        n = snprintf(ctx->cache_dir, sizeof ctx->cache_dir, "%s/.cache/clattn", home);
    else
        n = -1;
    /* A cut-off path names some other directory: keep none, so that neither the cache nor the
     * default tuning directory (<cache dir>/tuning, tuning.c) reads or writes there. */
    if (n < 0 || (size_t)n >= sizeof ctx->cache_dir) {
        ctx->cache_enabled = 0;
        ctx->cache_dir[0] = '\0';
    }
}

static int entry_path(const clattn_context *ctx, const char *hex, char *buf, size_t size)
{
    int n = snprintf(buf, size, "%s/%s.clbin", ctx->cache_dir, hex);
    return n > 0 && (size_t)n < size;
}

unsigned char *clattn__cache_load(clattn_context *ctx, const char *hex, size_t *size)
{
    char path[4200];
    if (!entry_path(ctx, hex, path, sizeof path))
        return NULL;
    /* Only a regular file is read: opening a FIFO planted under the entry's name would block for
     * ever, and a directory or a device is no cache entry either. O_NONBLOCK keeps the open of a
     * FIFO from waiting for a writer; it changes nothing for a regular file. */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    FILE *f = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !(f = fdopen(fd, "rb"))) {
        close(fd);
        ctx->stats.disk_rejects++;
        return NULL;
    }
    unsigned char head[HEADER_SIZE];
    unsigned char *bin = NULL;
    int ok = fread(head, 1, HEADER_SIZE, f) == HEADER_SIZE && memcmp(head, MAGIC, 16) == 0 &&
             memcmp(head + 16, hex, 32) == 0;
    uint64_t n = ok ? get64(head + 48) : 0;
    /* The payload size must be what the file holds, checked before the allocation: a damaged
     * header claiming hundreds of MiB would otherwise be allocated for nothing. */
    ok = ok && n > 0 && n <= MAX_BINARY && (uint64_t)st.st_size == HEADER_SIZE + n;
    if (ok) {
        bin = malloc((size_t)n);
        char extra;
        ok = bin && fread(bin, 1, (size_t)n, f) == n && fread(&extra, 1, 1, f) == 0 &&
             payload_hash(bin, (size_t)n) == get64(head + 56);
    }
    fclose(f);
    if (!ok) {
        free(bin);
        ctx->stats.disk_rejects++;
        return NULL;
    }
    *size = (size_t)n;
    return bin;
}

void clattn__cache_store(clattn_context *ctx, const char *hex, const unsigned char *bin, size_t size)
{
    if (size == 0 || size > MAX_BINARY || clattn__make_dirs(ctx->cache_dir) != 0)
        return; /* unwritable directory: no disk cache, not an error */
    char path[4200], tmp[4300];
    if (!entry_path(ctx, hex, path, sizeof path))
        return;
    /* Unique per process (pid), per thread (the address of a thread-local: contexts of one process
     * may store the same entry from several threads at once) and per call (counter). */
    static _Thread_local unsigned counter;
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    snprintf(tmp, sizeof tmp, "%s.%ld.%lx.%lx.%u.tmp", path, (long)getpid(),
             (unsigned long)(uintptr_t)&counter, (unsigned long)ts.tv_nsec, counter++);
    FILE *f = clattn__create_temp(tmp);
    if (!f)
        return;
    unsigned char head[HEADER_SIZE];
    memcpy(head, MAGIC, 16);
    memcpy(head + 16, hex, 32);
    put64(head + 48, size);
    put64(head + 56, payload_hash(bin, size));
    int ok = fwrite(head, 1, HEADER_SIZE, f) == HEADER_SIZE && fwrite(bin, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (ok && rename(tmp, path) == 0)
        ctx->stats.disk_writes++;
    else
        remove(tmp);
    clattn__sweep_temps(ctx->cache_dir);
}
