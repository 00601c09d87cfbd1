/* On-disk cache of built program binaries.
 *
 * File <dir>/<key>.clbin: 16-byte magic, the 32-hex-digit key again (so a renamed or swapped file
 * is recognised as foreign), payload size and payload hash as 8 little-endian bytes each, then the
 * payload. Written to a unique temporary name and renamed, so readers see a whole file or none,
 * also with several processes writing the same entry. Anything that does not check out is ignored
 * and rebuilt: the cache can make a build faster, never make it fail. Only entries the user owns
 * are read, and files are written 0600 (below, "trust"); the tuning store (tuning.c, store.c)
 * reads and writes its files through the same functions. */
#define _XOPEN_SOURCE 700 /* POSIX 2008 with XSI: S_ISVTX, the sticky bit */
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
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

/* ---- trust: who could have written what is read (docs/guarantees.md, "Cache and tuning files
 * are trusted only when the user owns them") ----
 *
 * A cache entry is code (on PoCL, native code run inside the process) and a tuning file steers
 * which kernels run; the payload hash catches a damaged file, not a forged one. So an entry is
 * read only if no one but the user (and root) could have put it there: the checks run on the
 * descriptors of the directory and of the file actually opened, so a path swapped meanwhile
 * cannot slip through. The directory itself may be reached through a symbolic link: what is
 * checked is the directory opened, whoever owns the link. */

void (*clattn__entry_dir_hook)(const char *dir);

static void say(char *why, size_t size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void say(char *why, size_t size, const char *fmt, ...)
{
    if (!why || size == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
}

#define LOOSE (S_IWGRP | S_IWOTH)

/* Only root could have written into it: root-owned and not writable by group or others. */
static int root_only(const struct stat *d) { return d->st_uid == 0 && !(d->st_mode & LOOSE); }

/* The directory rule: owned by the effective user or root and not writable by group or others;
 * or root-owned with the sticky bit (as /tmp), where others may add files but not replace or
 * rename one they do not own, so that each file is judged by itself. */
static int dir_trusted(const struct stat *d, char *why, size_t size)
{
    const uid_t me = geteuid();
    if (d->st_uid != me && d->st_uid != 0) {
        say(why, size, "the directory is owned by uid %lu, neither this user (uid %lu) nor root",
            (unsigned long)d->st_uid, (unsigned long)me);
        return 0;
    }
    if ((d->st_mode & LOOSE) && !(d->st_uid == 0 && (d->st_mode & S_ISVTX))) {
        say(why, size, "the directory is writable by group or others (mode %04o%s)", (unsigned)(d->st_mode & 07777),
            d->st_uid == 0 ? ", root-owned without the sticky bit" : "");
        return 0;
    }
    return 1;
}

/* The file rule, for a regular file in a directory that passed: owned by the effective user, or
 * by root where only root can write the directory (a cache an administrator shares read-only),
 * and not writable by group or others. A root-owned file is not trusted in a sticky directory:
 * anyone can hard-link one there, whatever it holds. */
static int file_trusted(const struct stat *f, const struct stat *d, char *why, size_t size)
{
    const uid_t me = geteuid();
    if (f->st_uid != me && !(f->st_uid == 0 && root_only(d))) {
        say(why, size, "owned by uid %lu, not by this user (uid %lu)%s", (unsigned long)f->st_uid,
            (unsigned long)me,
            f->st_uid == 0 ? "; root's files are trusted only in a root-owned directory group and others cannot write"
                           : "");
        return 0;
    }
    if (f->st_mode & LOOSE) {
        say(why, size, "writable by group or others (mode %04o)", (unsigned)(f->st_mode & 07777));
        return 0;
    }
    return 1;
}

clattn_entry_status clattn__open_entry(const char *dir, const char *name, int *fd, struct stat *st, char *why,
                                       size_t why_size)
{
    *fd = -1;
    say(why, why_size, "%s", "");
    /* O_NONBLOCK: a FIFO planted under the directory's name fails O_DIRECTORY, never waits. */
    const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    struct stat d, e;
    if (dfd < 0)
        return CLATTN_ENTRY_ABSENT;
    if (fstat(dfd, &d) != 0) {
        close(dfd);
        return CLATTN_ENTRY_ABSENT;
    }
    if (clattn__entry_dir_hook)
        clattn__entry_dir_hook(dir);
    clattn_entry_status r = CLATTN_ENTRY_ABSENT;
    if (!dir_trusted(&d, why, why_size)) {
        /* Nothing in it is opened (a device node is no file to open on a stranger's word): only
         * whether there is an entry, to count it as ignored. */
        if (fstatat(dfd, name, &e, AT_SYMLINK_NOFOLLOW) == 0)
            r = CLATTN_ENTRY_UNTRUSTED;
        else
            say(why, why_size, "%s", "");
        close(dfd);
        return r;
    }
    /* O_NOFOLLOW: a symbolic link is refused (POSIX says ELOOP, some BSDs EMLINK; lstat tells).
     * O_NONBLOCK: opening a FIFO planted under the entry's name would wait for a writer for ever;
     * it changes nothing for a regular file. */
    const int f = openat(dfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (f < 0) {
        if (fstatat(dfd, name, &e, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(e.st_mode)) {
            say(why, why_size, "a symbolic link, not a regular file (links are not followed)");
            r = CLATTN_ENTRY_UNTRUSTED;
        }
    } else if (fstat(f, st) != 0 || !S_ISREG(st->st_mode)) {
        say(why, why_size, "not a regular file");
        r = CLATTN_ENTRY_NOT_FILE;
    } else if (!file_trusted(st, &d, why, why_size)) {
        r = CLATTN_ENTRY_UNTRUSTED;
    } else {
        *fd = f;
        r = CLATTN_ENTRY_OK;
    }
    if (f >= 0 && r != CLATTN_ENTRY_OK)
        close(f);
    close(dfd);
    return r;
}

int clattn__open_dir_for_write(const char *dir, char *why, size_t why_size)
{
    say(why, why_size, "%s", "");
    const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    struct stat d;
    if (dfd < 0)
        return -1;
    /* What it would write there would not be read back: write nothing. */
    if (fstat(dfd, &d) != 0 || !dir_trusted(&d, why, why_size)) {
        close(dfd);
        return -1;
    }
    return dfd;
}

FILE *clattn__create_temp(int dfd, const char *name)
{
    /* O_EXCL: a name planted in the directory (a link elsewhere) is not followed, and O_NOFOLLOW
     * says so once more; O_CLOEXEC: a fork and exec on another thread meanwhile does not inherit
     * the descriptor. */
    const int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    /* The umask can only have taken bits off 0600 (then the reader would find an entry it cannot
     * read, or a tuning file it cannot rewrite): put them back. */
    struct stat st;
    FILE *f = NULL;
    if (fstat(fd, &st) == 0 && ((st.st_mode & 07777) == 0600 || fchmod(fd, 0600) == 0))
        f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlinkat(dfd, name, 0);
    }
    return f;
}

/* The next n > 0 characters of *p from set, and the separator sep after them: *p moves past. */
static int take_run(const char **p, const char *set, size_t lo, size_t hi, char sep)
{
    const size_t n = strspn(*p, set);
    if (n < lo || n > hi || (*p)[n] != sep)
        return 0;
    *p += n + 1;
    return 1;
}

/* Whether name is a temporary file that this library writes (and so may remove): a cache entry's
 * or a tuning store's name (32 or 16 hex digits, .clbin or .tuning) and the writer's suffix
 * .PID.HEX.HEX.COUNT.tmp (clattn__cache_store, clattn__tuning_write), nothing else. */
static int our_temp(const char *name)
{
    static const char *const hex = "0123456789abcdef", *const dec = "0123456789";
    const char *p = name;
    const size_t h = strspn(p, hex);
    if (h == 32 && strncmp(p + h, ".clbin.", 7) == 0)
        p += h + 7;
    else if (h == 16 && strncmp(p + h, ".tuning.", 8) == 0)
        p += h + 8;
    else
        return 0;
    return take_run(&p, dec, 1, 20, '.') && take_run(&p, hex, 1, 16, '.') && take_run(&p, hex, 1, 16, '.') &&
           take_run(&p, dec, 1, 10, '.') && strcmp(p, "tmp") == 0;
}

void clattn__sweep_temps(int dfd)
{
    /* Temporary files of writers that died between create and rename (cache entries, tuning
     * stores): ours by their name and owner, and left alone for an hour, which no live writer
     * takes. fdopendir owns the descriptor it gets: a duplicate. */
    const int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    rewinddir(d);
    const time_t old = time(NULL) - 3600;
    const uid_t me = geteuid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!our_temp(e->d_name))
            continue;
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) && st.st_uid == me &&
            st.st_mtime < old)
            unlinkat(dfd, e->d_name, 0);
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
            if (mkdir(buf, 0700) == 0) {
                /* The umask can only have taken bits off 0700 (0500 under umask 0277 leaves a
                 * directory nothing can be written into): put them back. Only on a directory made
                 * here, never on one that was there. */
                struct stat st;
                if (lstat(buf, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 07777) != 0700)
                    chmod(buf, 0700);
            } else if (errno != EEXIST) {
                return -1;
            }
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

/* Keeps why the cache did not trust an entry or a directory, for clattn-bench and the tests. */
static void note_untrusted(clattn_context *ctx, const char *what, const char *name, const char *why)
{
    snprintf(ctx->cache_untrusted, sizeof ctx->cache_untrusted, "%.200s%s%.64s: %.290s", what, name ? "/" : "",
             name ? name : "", why);
}

unsigned char *clattn__cache_load(clattn_context *ctx, const char *hex, size_t *size)
{
    char name[64], why[300];
    const int len = snprintf(name, sizeof name, "%s.clbin", hex);
    if (len <= 0 || (size_t)len >= sizeof name)
        return NULL;
    /* Only a trusted regular file is read (clattn__open_entry): a FIFO, a directory or a device is
     * no cache entry, and one anyone else could have written may be forged. */
    struct stat st;
    int fd = -1;
    switch (clattn__open_entry(ctx->cache_dir, name, &fd, &st, why, sizeof why)) {
    case CLATTN_ENTRY_ABSENT:
        return NULL;
    case CLATTN_ENTRY_UNTRUSTED:
        ctx->stats.disk_untrusted++;
        note_untrusted(ctx, ctx->cache_dir, name, why);
        ctx->stats.disk_rejects++;
        return NULL;
    case CLATTN_ENTRY_NOT_FILE:
        ctx->stats.disk_rejects++;
        return NULL;
    case CLATTN_ENTRY_OK:
        break;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
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
    char name[64], tmp[160], why[300];
    int n = snprintf(name, sizeof name, "%s.clbin", hex);
    if (n <= 0 || (size_t)n >= sizeof name)
        return;
    /* Everything below goes through the directory's descriptor, checked once: renaming another
     * directory into its place meanwhile changes nothing. */
    const int dfd = clattn__open_dir_for_write(ctx->cache_dir, why, sizeof why);
    if (dfd < 0) {
        if (why[0])
            note_untrusted(ctx, ctx->cache_dir, NULL, why);
        return;
    }
    /* Unique per process (pid), per thread (the address of a thread-local: contexts of one process
     * may store the same entry from several threads at once) and per call (counter). */
    static _Thread_local unsigned counter;
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    snprintf(tmp, sizeof tmp, "%s.%ld.%lx.%lx.%u.tmp", name, (long)getpid(),
             (unsigned long)(uintptr_t)&counter, (unsigned long)ts.tv_nsec, counter++);
    FILE *f = clattn__create_temp(dfd, tmp);
    if (!f) {
        close(dfd);
        return;
    }
    unsigned char head[HEADER_SIZE];
    memcpy(head, MAGIC, 16);
    memcpy(head + 16, hex, 32);
    put64(head + 48, size);
    put64(head + 56, payload_hash(bin, size));
    int ok = fwrite(head, 1, HEADER_SIZE, f) == HEADER_SIZE && fwrite(bin, 1, size, f) == size;
    ok = (fclose(f) == 0) && ok;
    if (ok && renameat(dfd, tmp, dfd, name) == 0)
        ctx->stats.disk_writes++;
    else
        unlinkat(dfd, tmp, 0);
    clattn__sweep_temps(dfd);
    close(dfd);
}

const char *clattn_cache_report(const clattn_context *ctx)
{
    if (!ctx)
        return "";
    /* ctx is const only because no setting changes: the text lives in the context. */
    clattn_context *c = (clattn_context *)ctx;
    char *r = c->cache_report;
    const size_t size = sizeof c->cache_report;
    if (!ctx->cache_enabled) {
        snprintf(r, size, "off (%s)", ctx->cache_dir[0] ? "CLATTN_CACHE=0" : "no directory: set CLATTN_CACHE_DIR");
    } else {
        char why[300] = "";
        const int dfd = open(ctx->cache_dir, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
        struct stat d;
        if (dfd < 0 && errno == ENOENT)
            snprintf(r, size, "%.4000s (not made yet: made 0700 at the first build)", ctx->cache_dir);
        else if (dfd < 0) /* a regular file in its place or on its path, no permission: no disk cache */
            snprintf(r, size, "%.4000s: not usable, kernels are built from source: %s", ctx->cache_dir,
                     strerror(errno));
        else if (fstat(dfd, &d) != 0 || !dir_trusted(&d, why, sizeof why))
            snprintf(r, size, "%.4000s: not trusted, kernels are built from source: %s", ctx->cache_dir,
                     why[0] ? why : "cannot be examined");
        else
            snprintf(r, size, "%.4000s", ctx->cache_dir);
        if (dfd >= 0)
            close(dfd);
    }
    if (ctx->stats.disk_untrusted) {
        const size_t n = strlen(r);
        snprintf(r + n, size - n, "; %u entr%s not trusted, the last %.700s", ctx->stats.disk_untrusted,
                 ctx->stats.disk_untrusted == 1 ? "y" : "ies", ctx->cache_untrusted);
    }
    return r;
}
