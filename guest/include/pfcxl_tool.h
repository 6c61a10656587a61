/*
 * pfcxl_tool.h: helpers shared by the static guest tools in guest/src/ (one .c file each).
 *
 * Every tool is still compiled as ONE file (gcc -static -O2 -Wall -Wextra -Werror tool.c) and
 * includes this header relatively ("../include/pfcxl_tool.h"), so no -I flag is needed. All
 * helpers are `static inline` (and the few file-scope variables `unused`): a tool that does not
 * call one gets no -Wunused-function/-Wunused-variable error and no code for it.
 *
 * Before including it, a tool defines:
 *   TOOL_NAME              its name as a string literal: the prefix of every error line
 *                          ("daxio: ...") and part of some messages;
 *   TOOL_VERBATIM_ERRORS   (optional, chase and cxl_touch) print error messages as formatted,
 *                          without first flushing stdout, folding newlines or truncating.
 *
 * Conventions the helpers implement (see guest/bench_schema.md and each tool's --help):
 *   - target memory (device-DAX /dev/daxN.M, or a regular file for host tests) is mapped
 *     MAP_SHARED over a 2 MiB-aligned window: device-DAX maps only in multiples of its
 *     region alignment;
 *   - errors are one line "TOOL: message" on stderr and exit status EXIT_ERROR (2);
 *   - output is one JSON line on stdout; a failed write of it is an error too.
 */
#ifndef PFCXL_TOOL_H
#define PFCXL_TOOL_H

#ifndef TOOL_NAME
#error "define TOOL_NAME (the tool's name as a string literal) before including pfcxl_tool.h"
#endif

#include "pfcxl_mark.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* Words are handled as native uint64 values; the pattern, the crc and the chains are defined
 * on little-endian byte order, which is what x86 (the only guest) stores. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the guest tools assume a little-endian CPU"
#endif

#define WINDOW_ALIGN PFCXL_DAX_ALIGN /* device-DAX mapping granule (pfcxl_mark.h) */
#define EXIT_ERROR 2              /* every tool: bad argument, open/mmap failure, bus error */

/* ---------------------------------------------------------------- errors */

/* Print "TOOL: message" on stderr and exit with `code`. The message is kept on one line whatever
 * the arguments held (a path, a value), so a caller can read stderr line by line, and stdout is
 * flushed first so that any partial JSON comes before the error. */
static inline void fail(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));
static inline void fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
#ifdef TOOL_VERBATIM_ERRORS
    fputs(TOOL_NAME ": ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
#else
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fflush(stdout);
    fprintf(stderr, TOOL_NAME ": %s\n", msg);
#endif
    exit(code);
}
#define die(...) fail(EXIT_ERROR, __VA_ARGS__)

/* The JSON line is the result: a full disk or closed pipe must not pass for success. */
static inline void finish_output(void)
{
    if (fflush(stdout) != 0 || ferror(stdout))
        die("writing output: %s", strerror(errno));
}

/* ---------------------------------------------------------------- numbers */

#define PARSE_SUFFIX 1u /* accept one trailing K, M or G (KiB, MiB, GiB) */
#define PARSE_LIBC 2u   /* the benchmarks' strtoull rules: at most 31 characters, and after
                           "0x" a second "0x" before a hex digit is skipped ("0x0x10" = 16) */

/* Decimal or 0x hex in [s, end) (end NULL: up to the NUL), no sign, no spaces. Written out
 * rather than strtoull so that nothing ("-1", " 7", octal "010") is silently accepted.
 * 0 ok, -1 bad syntax or overflow. */
static inline int parse_u64(const char *s, const char *end, unsigned flags, uint64_t *out)
{
    const char *p = s, *stop = end ? end : s + strlen(s);
    uint64_t v = 0, base = 10;
    int digits = 0;
    if ((flags & PARSE_LIBC) && stop - s >= 32)
        return -1;
    if (stop - p >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
        p += 2;
        if ((flags & PARSE_LIBC) && stop - p >= 3 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')
            && ((p[2] >= '0' && p[2] <= '9') || ((p[2] | 0x20) >= 'a' && (p[2] | 0x20) <= 'f')))
            p += 2;
    }
    for (; p < stop; p++, digits++) {
        unsigned d;
        if (*p >= '0' && *p <= '9')
            d = (unsigned)(*p - '0');
        else if (base == 16 && *p >= 'a' && *p <= 'f')
            d = (unsigned)(*p - 'a' + 10);
        else if (base == 16 && *p >= 'A' && *p <= 'F')
            d = (unsigned)(*p - 'A' + 10);
        else
            break;
        if (v > (UINT64_MAX - d) / base)
            return -1;
        v = v * base + d;
    }
    if (digits == 0)
        return -1;
    if (p < stop && (flags & PARSE_SUFFIX)) {
        unsigned shift;
        switch (*p) {
        case 'K': case 'k': shift = 10; break;
        case 'M': case 'm': shift = 20; break;
        case 'G': case 'g': shift = 30; break;
        default: return -1;
        }
        if (v > (UINT64_MAX >> shift))
            return -1;
        v <<= shift;
        p++;
    }
    if (p != stop)
        return -1;
    *out = v;
    return 0;
}

/* chase and cxl_touch's looser rule: strtoull with base 0 (so also octal, leading spaces and
 * a '+'), an optional K/M/G, no overflow check; dies naming the option on bad syntax. */
static inline uint64_t loose_number(const char *name, const char *s)
{
    char *end;
    uint64_t v = strtoull(s, &end, 0);
    if (end == s || *s == '-')
        die("bad value '%s' for %s", s, name);
    switch (*end) {
    case 'K': case 'k': v <<= 10; end++; break;
    case 'M': case 'm': v <<= 20; end++; break;
    case 'G': case 'g': v <<= 30; end++; break;
    }
    if (*end)
        die("bad value '%s' for %s", s, name);
    return v;
}

/* ---------------------------------------------------------------- --name value options */

/* The benchmarks' options: every one takes a value, as "--name value" or "--name=value". */
struct opt {
    const char *name;
    const char *val; /* NULL: not given */
};

/* -h/--help anywhere prints help and exits 0; then fills opts[] (ended by a NULL name). */
static inline void parse_opts(int argc, char **argv, struct opt *opts, const char *help)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(help, stdout);
            exit(fflush(stdout) == 0 ? 0 : EXIT_ERROR);
        }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            die("unexpected argument '%s' (parameters are --flags); see " TOOL_NAME " --help", arg);
        size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
        struct opt *o = opts;
        while (o->name && !(strlen(o->name) == n && !strncmp(o->name, arg, n)))
            o++;
        if (!o->name)
            die("unknown option '%.*s'; see " TOOL_NAME " --help", (int)n, arg);
        if (o->val)
            die("option %s given twice", o->name);
        if (!eq && i + 1 >= argc)
            die("option %s needs a value", o->name);
        o->val = eq ? eq + 1 : argv[++i];
    }
}

/* The value of option o (def when not given) in [lo, hi]; suffix: BYTES, K/M/G allowed. */
static inline uint64_t num(const struct opt *o, uint64_t def, int suffix, uint64_t lo, uint64_t hi)
{
    uint64_t v;
    if (!o->val)
        return def;
    if (parse_u64(o->val, NULL, PARSE_LIBC | (suffix ? PARSE_SUFFIX : 0), &v) != 0)
        die("bad value '%s' for %s (want decimal or 0x hex%s)", o->val, o->name,
            suffix ? ", optional K/M/G suffix" : "");
    if (v < lo || v > hi)
        die("%s %" PRIu64 " is out of range [%" PRIu64 ", %" PRIu64 "]", o->name, v, lo, hi);
    return v;
}

/* Comma-separated list of numbers into out[max]; returns the count. */
static inline size_t num_list(const char *name, const char *s, uint64_t *out, size_t max)
{
    size_t n = 0;
    for (const char *p = s;; p++) {
        const char *c = strchr(p, ',');
        if (n == max)
            die("%s: more than %zu values", name, max);
        if (parse_u64(p, c, PARSE_LIBC, &out[n++]) != 0)
            die("bad list '%s' for %s (want comma-separated decimal or 0x hex numbers)", s, name);
        if (!c)
            return n;
        p = c;
    }
}

/* ---------------------------------------------------------------- time, random, JSON */

/* Guest CLOCK_MONOTONIC in ns. Under QEMU TCG this is emulator time, not fabric latency. */
static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* SplitMix64: small, seedable and the same on every libc, so a seed names one layout. */
static inline uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Print s as a JSON string: quoted, '"' and '\' escaped, control bytes as \u00XX. */
static inline void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

/* ---------------------------------------------------------------- pattern and crc32 */

/* daxio's pattern, mirrored by guest/pattern.py (pfcxl.guest.pattern); keep the two identical:
 * the 8-byte word at byte offset o from the START OF THE DEVICE, stored little-endian. */
#define PATTERN_MAGIC 0x5046000000000000ULL
static inline uint64_t pattern_word(uint64_t seed, uint64_t o)
{
    return PATTERN_MAGIC ^ (seed << 40) ^ (o >> 3);
}

/* zlib's CRC-32 (reflected 0xEDB88320), sliced by 8 so that one table step per byte keeps up
 * with 8-byte loads: crc_tab[0] is the byte-wise table, crc_tab[t] advances t more bytes. */
static uint32_t crc_tab[8][256] __attribute__((unused));

static inline void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_tab[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (uint32_t i = 0; i < 256; i++)
            crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

/* Feed one little-endian 64-bit word (8 bytes in address order) into a running crc state
 * (state = ~crc: starts at 0xFFFFFFFF and is inverted at the end). */
static inline __attribute__((always_inline)) uint32_t crc_word(uint32_t state, uint64_t w)
{
    uint32_t lo = state ^ (uint32_t)w;
    uint32_t hi = (uint32_t)(w >> 32);
    return crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^
           crc_tab[5][(lo >> 16) & 0xff] ^ crc_tab[4][lo >> 24] ^
           crc_tab[3][hi & 0xff] ^ crc_tab[2][(hi >> 8) & 0xff] ^
           crc_tab[1][(hi >> 16) & 0xff] ^ crc_tab[0][hi >> 24];
}

/* ---------------------------------------------------------------- device size (sysfs) */

/* The first decimal number in a sysfs file, or 0 if missing or unreadable. */
static inline uint64_t sysfs_u64(const char *path)
{
    FILE *f = fopen(path, "r");
    unsigned long long v = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%llu", &v) != 1)
        v = 0;
    fclose(f);
    return v;
}

/* Size of a device-DAX character device from sysfs, or 0 if unknown. With dev (the path the
 * user gave), /sys/class/dax/NAME and /sys/bus/dax/devices/NAME are tried first (NAME from the
 * resolved path); /sys/dev/char/MAJOR:MINOR/size always. */
static inline uint64_t dax_size(const char *dev, const struct stat *st)
{
    char path[PATH_MAX + 64];
    uint64_t size = 0;
    if (dev) {
        char *real = realpath(dev, NULL);
        const char *name = real ? strrchr(real, '/') : NULL;
        if (name) {
            name++;
            snprintf(path, sizeof path, "/sys/class/dax/%s/size", name);
            size = sysfs_u64(path);
            if (!size) {
                snprintf(path, sizeof path, "/sys/bus/dax/devices/%s/size", name);
                size = sysfs_u64(path);
            }
        }
        free(real);
    }
    if (!size) {
        snprintf(path, sizeof path, "/sys/dev/char/%u:%u/size", major(st->st_rdev),
                 minor(st->st_rdev));
        size = sysfs_u64(path);
    }
    return size;
}

/* ---------------------------------------------------------------- windows of a device or file */

/* open(dev) read-only or read-write and fstat it; any failure is fatal. Returns the fd. */
static inline int open_dev(const char *dev, int writes, struct stat *st)
{
    int fd = open(dev, writes ? O_RDWR : O_RDONLY);
    if (fd < 0)
        die("open %s: %s", dev, strerror(errno));
    if (fstat(fd, st) != 0)
        die("fstat %s: %s", dev, strerror(errno));
    return fd;
}

/* Map the 2 MiB-aligned window of fd covering [start, end), MAP_SHARED so that other hosts (and
 * the file, in host tests) see the stores. Sets *win_off and *win_len. */
static inline void *map_window(int fd, const char *dev, uint64_t start, uint64_t end, int writes,
                               uint64_t *win_off, uint64_t *win_len)
{
    *win_off = start & ~(WINDOW_ALIGN - 1);
    *win_len = ((end + WINDOW_ALIGN - 1) & ~(WINDOW_ALIGN - 1)) - *win_off;
    void *map = mmap(NULL, (size_t)*win_len, PROT_READ | (writes ? PROT_WRITE : 0), MAP_SHARED,
                     fd, (off_t)*win_off);
    if (map == MAP_FAILED)
        die("mmap %s (offset %" PRIu64 ", length %" PRIu64 "): %s", dev, *win_off, *win_len,
            strerror(errno));
    return map;
}

/* A SIGBUS (a DAX page that cannot be backed, a file truncated under the mapping) must become an
 * error line, not a core dump. Two ways:
 *  - sigbus_exit: the benchmarks, which only need "TOOL: bus error accessing the target" (from
 *    the handler, hence write(2) and _exit: async-signal-safe);
 *  - sigbus_jump: daxio and slices, which name the faulting offset: main does
 *        catch_sigbus_jump(); if (sigsetjmp(g_fault_jmp, 1)) die_bus_error(...);
 *    (the sigsetjmp must be in the frame that stays alive while the mapping is used). */
static inline void sigbus_exit(int sig)
{
    static const char m[] = TOOL_NAME ": bus error accessing the target\n";
    (void)sig;
    ssize_t r = write(2, m, sizeof m - 1);
    (void)r;
    _exit(EXIT_ERROR);
}

static sigjmp_buf g_fault_jmp __attribute__((unused));
static void *volatile g_fault_addr __attribute__((unused));

static inline void sigbus_jump(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    g_fault_addr = si->si_addr;
    siglongjmp(g_fault_jmp, 1);
}

static inline void catch_sigbus_jump(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = sigbus_jump;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

/* After the jump: name the device offset of the fault when it lies in the window map..+win_len.
 * op: daxio's subcommand as the message's prefix ("verify: bus error ..."), or NULL. */
static inline void die_bus_error(const char *op, const char *dev, const void *map,
                                 uint64_t win_off, uint64_t win_len) __attribute__((noreturn));
static inline void die_bus_error(const char *op, const char *dev, const void *map,
                                 uint64_t win_off, uint64_t win_len)
{
    uintptr_t fa = (uintptr_t)g_fault_addr, mb = (uintptr_t)map;
    int inside = fa >= mb && fa - mb < win_len;
    uint64_t off = win_off + (fa - mb);
    if (op && inside)
        die("%s: bus error accessing %s at offset %" PRIu64, op, dev, off);
    if (op)
        die("%s: bus error accessing %s", op, dev);
    if (inside)
        die("bus error accessing %s at offset %" PRIu64, dev, off);
    die("bus error accessing %s", dev);
}

#endif /* PFCXL_TOOL_H */
