/*
 * idle_latency: dependent pointer-chase latency (reads) and store+clflush+mfence latency (writes)
 * over a span much larger than the caches, on device-DAX (CXL) memory, local DRAM or a file.
 *
 * Built static for the guest image:
 *     gcc -static -O2 -Wall -Wextra -Werror -o idle_latency guest/src/idle_latency.c
 *
 * Conventions as guest/src/daxio.c (shared helpers: guest/include/pfcxl_tool.h): the target is
 * mapped over a 2 MiB-aligned window (MAP_SHARED for a device or file) and touched only through
 * volatile 8-byte loads and stores (under QEMU TCG a string op on CXL memory is one I/O per
 * byte); one JSON line on stdout; errors one line on stderr; exit 0 ok, 1 chain check failed,
 * 2 error. Output fields are documented in guest/bench_schema.md.
 */
#define _GNU_SOURCE

#define TOOL_NAME "idle_latency"
#include "../include/pfcxl_bench.h"

#define LINE ((uint64_t)64)
#define WORDS_PER_LINE (LINE / 8)
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

/* ---------------------------------------------------------------- helpers */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static volatile uint64_t g_sink;

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
    parse_opts(argc, argv, o, HELP);
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

    printf("{\"tool\":\"idle_latency\",\"target\":");
    json_str(target);
    printf(",\"kind\":\"%s\",\"span\":%" PRIu64 ",\"line_bytes\":%" PRIu64 ",\"lines\":%" PRIu64
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
    finish_output();
    return chain_verdict(visited, lines, closed);
}
