/*
 * idle_latency: dependent pointer-chase latency (reads) and store+clflush+mfence latency (writes)
 * over a span much larger than the caches, on device-DAX (CXL) memory, local DRAM or a file.
 *
 * Built static for the guest image:
 *     gcc -static -O2 -Wall -Wextra -Werror -o idle_latency guest/src/idle_latency.c
 *
 * Conventions as guest/src/daxio.c (small helpers re-implemented here, not shared): the target is
 * mapped over a 2 MiB-aligned window (MAP_SHARED for a device or file) and touched only through
 * volatile 8-byte loads and stores (under QEMU TCG a string op on CXL memory is one I/O per
 * byte); one JSON line on stdout; errors one line on stderr; exit 0 ok, 1 chain check failed,
 * 2 error. Output fields are documented in guest/bench_schema.md.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

#define WINDOW_ALIGN (2ULL << 20)
#define LINE ((uint64_t)64)
#define WORDS_PER_LINE (LINE / 8)
#define EXIT_CHAIN 1
#define EXIT_ERROR 2
#define CLOCK_NOTE "guest CLOCK_MONOTONIC (under TCG: emulator time, not fabric latency)"

static const char HELP[] =
    "usage: idle_latency --target T [--span BYTES] [--seed S] [--mode read|write|both]\n"
    "                    [--warmup-laps W] [--laps L] [--batch B] [--dump-order N]\n"
    "\n"
    "Idle (unloaded) memory latency. The span is cut into 64-byte lines; a random cyclic\n"
    "permutation of the lines (Fisher-Yates shuffle seeded by S) is written into the first\n"
    "8-byte word of each line as the index of the next line, so one lap of the chase visits\n"
    "every line exactly once and every load depends on the previous one.\n"
    "  read:  the first warm-up lap counts the distinct lines it visits with a bitmap\n"
    "         (visited_lines_per_lap, must equal lines) and checksums the visit order; then L\n"
    "         measured laps, timed in batches of B loads with clock_gettime(CLOCK_MONOTONIC):\n"
    "         mean ns per load = total time / loads; p50/p99/p99.9 over the per-batch averages.\n"
    "  write: L laps in the same order, each line: store to its SECOND word (the chain is left\n"
    "         intact), clflush the line, mfence; timed in batches like the reads.\n"
    "\n"
    "options (also accepted as --name=value):\n"
    "  --target T        /dev/daxN.M (device-DAX, mmap MAP_SHARED, 2 MiB-aligned window), 'anon'\n"
    "                    (anonymous private memory: the local-DRAM comparison), or a regular\n"
    "                    file of at least BYTES (host tests; never extended). Required.\n"
    "  --span BYTES      bytes chased, a multiple of 64, at least 128 (default 64M)\n"
    "  --seed S          permutation seed (default 1)\n"
    "  --mode M          read, write or both (default read)\n"
    "  --warmup-laps W   laps before measuring, at least 1 (default 1)\n"
    "  --laps L          measured laps, at least 1 (default 1)\n"
    "  --batch B         loads (stores) per timed batch, 1..1048576 (default 64)\n"
    "  --dump-order N    put the first N line indices of the visit order, as chased through\n"
    "                    memory in the first warm-up lap, in \"order\" (default 0, N <= lines)\n"
    "  -h, --help        show this text and exit 0\n"
    "  Numbers are decimal or 0x hex; BYTES accepts a suffix K, M or G (KiB, MiB, GiB).\n"
    "\n"
    "output: one JSON line, e.g. {\"tool\":\"idle_latency\",\"target\":\"anon\",\"kind\":\"anon\",\n"
    "  \"span\":67108864,\"lines\":1048576,...,\"visited_lines_per_lap\":1048576,\"lap_closed\":true,\n"
    "  \"order_fnv1a64\":\"0x...\",\"order\":[],\"read\":{\"loads\":1048576,\"ns_per_load\":95.1,\n"
    "  \"p50_ns\":...,\"p99_ns\":...,\"p999_ns\":...},\"write\":null,\"clock\":\"" CLOCK_NOTE "\"}\n"
    "  All fields, units and types: guest/bench_schema.md. Times are guest CLOCK_MONOTONIC;\n"
    "  under QEMU TCG that is emulator time, NOT fabric latency.\n"
    "\n"
    "exit status: 0 ok; 1 the chain check failed (a lap did not visit every line exactly once,\n"
    "  or memory held an out-of-range index); 2 error (bad argument, target too small,\n"
    "  open/mmap failure, bus error). Errors are one line on stderr.\n";

static void fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void fail(int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fflush(stdout);
    fprintf(stderr, "idle_latency: %s\n", msg);
    exit(code);
}
#define die(...) fail(EXIT_ERROR, __VA_ARGS__)

/* ---------------------------------------------------------------- arguments */

/* Decimal or 0x hex in [s, end) (end NULL: up to the NUL); with allow_suffix one trailing K, M
 * or G (KiB, MiB, GiB). 0 ok, -1 bad syntax or overflow. */
static int parse_u64(const char *s, const char *end, int allow_suffix, uint64_t *out)
{
    char buf[32], *e;
    size_t n = end ? (size_t)(end - s) : strlen(s);
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    int hex = buf[0] == '0' && (buf[1] == 'x' || buf[1] == 'X');
    unsigned char d0 = (unsigned char)buf[2 * hex];
    if (!(hex ? isxdigit(d0) : isdigit(d0)))
        return -1;
    errno = 0;
    unsigned long long v = strtoull(buf + 2 * hex, &e, hex ? 16 : 10);
    unsigned sh = 0;
    if (allow_suffix && *e)
        sh = (*e == 'K' || *e == 'k') ? 10 : (*e == 'M' || *e == 'm') ? 20
           : (*e == 'G' || *e == 'g') ? 30 : 0;
    e += sh != 0;
    if (errno || *e || v > (UINT64_MAX >> sh))
        return -1;
    *out = (uint64_t)v << sh;
    return 0;
}

struct opt {
    const char *name;
    const char *val;
};

static void parse_opts(int argc, char **argv, struct opt *opts)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(HELP, stdout);
            exit(fflush(stdout) == 0 ? 0 : EXIT_ERROR);
        }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            die("unexpected argument '%s' (parameters are --flags); see idle_latency --help", arg);
        size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
        struct opt *o = opts;
        while (o->name && !(strlen(o->name) == n && !strncmp(o->name, arg, n)))
            o++;
        if (!o->name)
            die("unknown option '%.*s'; see idle_latency --help", (int)n, arg);
        if (o->val)
            die("option %s given twice", o->name);
        if (!eq && i + 1 >= argc)
            die("option %s needs a value", o->name);
        o->val = eq ? eq + 1 : argv[++i];
    }
}

static uint64_t num(const struct opt *o, uint64_t def, int suffix, uint64_t lo, uint64_t hi)
{
    uint64_t v;
    if (!o->val)
        return def;
    if (parse_u64(o->val, NULL, suffix, &v) != 0)
        die("bad value '%s' for %s (want decimal or 0x hex%s)", o->val, o->name,
            suffix ? ", optional K/M/G suffix" : "");
    if (v < lo || v > hi)
        die("%s %" PRIu64 " is out of range [%" PRIu64 ", %" PRIu64 "]", o->name, v, lo, hi);
    return v;
}

/* ---------------------------------------------------------------- target */

static void on_sigbus(int sig)
{
    static const char m[] = "idle_latency: bus error accessing the target\n";
    (void)sig;
    ssize_t r = write(2, m, sizeof m - 1);
    (void)r;
    _exit(EXIT_ERROR);
}

/* Map [0, len) of the target read-write: 'anon', a device-DAX character device or a file. */
static volatile uint64_t *map_target(const char *t, uint64_t len, const char **kind)
{
    uint64_t maplen = (len + WINDOW_ALIGN - 1) & ~(WINDOW_ALIGN - 1), have = 0;
    void *m;
    if (!strcmp(t, "anon")) {
        *kind = "anon";
        char *raw = mmap(NULL, maplen + WINDOW_ALIGN, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED)
            die("mmap anonymous %" PRIu64 " bytes: %s", maplen, strerror(errno));
        m = (void *)(((uintptr_t)raw + WINDOW_ALIGN - 1) & ~(uintptr_t)(WINDOW_ALIGN - 1));
        madvise(m, maplen, MADV_HUGEPAGE); /* best effort, like a 2 MiB device-DAX mapping */
    } else {
        struct stat st;
        int fd = open(t, O_RDWR);
        if (fd < 0 || fstat(fd, &st) != 0)
            die("open %s: %s", t, strerror(errno));
        if (S_ISREG(st.st_mode)) {
            *kind = "file";
            have = (uint64_t)st.st_size;
        } else if (S_ISCHR(st.st_mode)) {
            char path[96];
            unsigned long long v = 0;
            *kind = "dax";
            snprintf(path, sizeof path, "/sys/dev/char/%u:%u/size", major(st.st_rdev),
                     minor(st.st_rdev));
            FILE *f = fopen(path, "r");
            if (f && fscanf(f, "%llu", &v) == 1)
                have = v;
            if (f)
                fclose(f);
            have = have ? have : len; /* size unknown: let the mmap decide */
        } else {
            die("%s is neither 'anon', a character device nor a regular file", t);
        }
        if (have < len)
            die("%s holds %" PRIu64 " bytes, %" PRIu64 " needed (files are not extended)", t,
                have, len);
        m = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            die("mmap %s (length %" PRIu64 "): %s", t, maplen, strerror(errno));
        close(fd);
    }
    signal(SIGBUS, on_sigbus);
    return (volatile uint64_t *)m;
}

/* ---------------------------------------------------------------- helpers */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static volatile uint64_t g_sink;

/* k dependent loads from line idx on; an index outside the span means corrupted memory. */
static uint64_t chase(volatile uint64_t *p, uint64_t idx, uint64_t k, uint64_t lines)
{
    while (k--) {
        uint64_t next = p[idx * WORDS_PER_LINE];
        if (next >= lines)
            fail(EXIT_CHAIN, "chain corrupted: line %" PRIu64 " holds %" PRIu64 " (>= %" PRIu64
                 " lines)", idx, next, lines);
        idx = next;
    }
    return idx;
}

struct dist {
    uint64_t ops, batches, ns_total;
    double mean, p50, p99, p999;
};

/* `ops` chase loads (write=0) or store+clflush+mfence (write=1), timed in batches. */
static void measure(int write, volatile uint64_t *p, const uint32_t *order, uint64_t lines,
                    uint64_t ops, uint64_t batch, struct dist *d)
{
    uint64_t nb = (ops + batch - 1) / batch, b = 0, left = ops, idx = order[0], pos = 0;
    double *s = malloc(nb * sizeof *s);
    if (!s)
        die("out of memory for %" PRIu64 " batch samples", nb);
    uint64_t t0 = now_ns(), tp = t0;
    while (left) {
        uint64_t k = left < batch ? left : batch;
        if (write) {
            for (uint64_t j = 0; j < k; j++) {
                volatile uint64_t *l = p + (uint64_t)order[pos] * WORDS_PER_LINE;
                l[1] = 0x5752000000000000ULL | pos; /* "WR": word 1, the chain stays intact */
                __builtin_ia32_clflush((const void *)l);
                __builtin_ia32_mfence();
                pos = pos + 1 == lines ? 0 : pos + 1;
            }
        } else {
            idx = chase(p, idx, k, lines);
        }
        uint64_t t = now_ns();
        s[b++] = (double)(t - tp) / (double)k;
        tp = t;
        left -= k;
    }
    g_sink = idx;
    qsort(s, nb, sizeof *s, cmp_double);
    d->ops = ops;
    d->batches = nb;
    d->ns_total = tp - t0;
    d->mean = (double)(tp - t0) / (double)ops;
    double q[3] = {0.5, 0.99, 0.999}, *out[3] = {&d->p50, &d->p99, &d->p999};
    for (int i = 0; i < 3; i++) { /* nearest rank: sample number ceil(q * nb), from 1 */
        uint64_t r = (uint64_t)(q[i] * (double)nb);
        r += (double)r < q[i] * (double)nb || r == 0;
        *out[i] = s[r - 1];
    }
    free(s);
}

static void print_dist(const char *name, const char *ops, const char *per, const struct dist *d,
                       int on)
{
    printf(",\"%s\":", name);
    if (!on) {
        printf("null");
        return;
    }
    printf("{\"%s\":%" PRIu64 ",\"batches\":%" PRIu64 ",\"ns_total\":%" PRIu64 ",\"%s\":%.3f,"
           "\"p50_ns\":%.3f,\"p99_ns\":%.3f,\"p999_ns\":%.3f}",
           ops, d->ops, d->batches, d->ns_total, per, d->mean, d->p50, d->p99, d->p999);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    struct opt o[] = {{"--target", 0}, {"--span", 0},   {"--seed", 0},  {"--mode", 0},
                      {"--warmup-laps", 0}, {"--laps", 0}, {"--batch", 0}, {"--dump-order", 0},
                      {0, 0}};
    parse_opts(argc, argv, o);
    const char *target = o[0].val;
    if (!target || !*target)
        die("missing --target (/dev/daxN.M, anon or a file); see idle_latency --help");
    uint64_t span = num(&o[1], 64ULL << 20, 1, 2 * LINE, LINE * 0xFFFFFFFFULL);
    if (span % LINE)
        die("--span %" PRIu64 " is not a multiple of 64", span);
    uint64_t seed = num(&o[2], 1, 0, 0, UINT64_MAX);
    const char *mode = o[3].val ? o[3].val : "read";
    int do_read = !strcmp(mode, "read") || !strcmp(mode, "both");
    int do_write = !strcmp(mode, "write") || !strcmp(mode, "both");
    if (!do_read && !do_write)
        die("bad value '%s' for --mode (want read, write or both)", mode);
    uint64_t warmup = num(&o[4], 1, 0, 1, 1000000);
    uint64_t laps = num(&o[5], 1, 0, 1, 1000000);
    uint64_t batch = num(&o[6], 64, 0, 1, 1 << 20);
    const uint64_t lines = span / LINE;
    uint64_t dump = num(&o[7], 0, 0, 0, lines);
    if (laps > UINT64_MAX / lines / 2)
        die("--laps %" PRIu64 " is too large for %" PRIu64 " lines", laps, lines);

    /* the visit order: a seeded Fisher-Yates shuffle of all line indices */
    uint32_t *order = malloc(lines * sizeof *order);
    uint64_t *seen = calloc((lines + 63) / 64, sizeof *seen);
    uint64_t *dumped = malloc((dump ? dump : 1) * sizeof *dumped);
    if (!order || !seen || !dumped)
        die("out of memory for %" PRIu64 " lines", lines);
    for (uint64_t i = 0; i < lines; i++)
        order[i] = (uint32_t)i;
    uint64_t rs = seed;
    for (uint64_t i = lines - 1; i > 0; i--) {
        uint64_t j = (uint64_t)(((unsigned __int128)splitmix64(&rs) * (i + 1)) >> 64);
        uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }

    const char *kind;
    volatile uint64_t *p = map_target(target, span, &kind);
    for (uint64_t k = 0; k < lines; k++) /* link order[k] -> order[k+1], cyclically */
        p[(uint64_t)order[k] * WORDS_PER_LINE] = order[k + 1 == lines ? 0 : k + 1];
    __atomic_thread_fence(__ATOMIC_SEQ_CST);

    /* first warm-up lap: follow the chain through memory, count distinct lines, checksum */
    uint64_t idx = order[0], visited = 0, h = 0xcbf29ce484222325ULL;
    for (uint64_t k = 0; k < lines; k++) {
        if (k < dump)
            dumped[k] = idx;
        if (!(seen[idx >> 6] >> (idx & 63) & 1)) {
            seen[idx >> 6] |= 1ULL << (idx & 63);
            visited++;
        }
        for (int b = 0; b < 8; b++) /* FNV-1a 64 over the index as 8 little-endian bytes */
            h = (h ^ ((idx >> (8 * b)) & 0xff)) * 0x100000001b3ULL;
        idx = chase(p, idx, 1, lines);
    }
    int closed = idx == order[0];
    chase(p, order[0], (warmup - 1) * lines, lines);

    struct dist rd = {0}, wr = {0};
    if (do_read)
        measure(0, p, order, lines, laps * lines, batch, &rd);
    if (do_write)
        measure(1, p, order, lines, laps * lines, batch, &wr);

    printf("{\"tool\":\"idle_latency\",\"target\":\"");
    for (const unsigned char *c = (const unsigned char *)target; *c; c++)
        printf(*c == '"' || *c == '\\' ? "\\%c" : *c < 0x20 || *c == 0x7f ? "\\u%04x" : "%c", *c);
    printf("\",\"kind\":\"%s\",\"span\":%" PRIu64 ",\"line_bytes\":%" PRIu64 ",\"lines\":%" PRIu64
           ",\"seed\":%" PRIu64 ",\"mode\":\"%s\",\"warmup_laps\":%" PRIu64 ",\"laps\":%" PRIu64
           ",\"batch\":%" PRIu64 ",\"visited_lines_per_lap\":%" PRIu64 ",\"lap_closed\":%s"
           ",\"order_fnv1a64\":\"0x%016" PRIx64 "\",\"order\":[",
           kind, span, LINE, lines, seed, mode, warmup, laps, batch, visited,
           closed ? "true" : "false", h);
    for (uint64_t k = 0; k < dump; k++)
        printf(k ? ",%" PRIu64 : "%" PRIu64, dumped[k]);
    printf("]");
    print_dist("read", "loads", "ns_per_load", &rd, do_read);
    print_dist("write", "stores", "ns_per_store", &wr, do_write);
    printf(",\"clock\":\"%s\"}\n", CLOCK_NOTE);
    if (fflush(stdout) != 0 || ferror(stdout))
        die("writing output: %s", strerror(errno));
    if (visited != lines || !closed) {
        fprintf(stderr, "idle_latency: chain check failed: a lap visited %" PRIu64
                " distinct lines of %" PRIu64 "%s\n", visited, lines,
                closed ? "" : " and did not return to its start");
        return EXIT_CHAIN;
    }
    return 0;
}
