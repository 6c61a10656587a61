/*
 * loaded_latency: pointer-chase latency while traffic threads load the memory, swept over an
 * injection delay, like Intel MLC's loaded-latency table.
 *
 * Built static for the guest image (glibc >= 2.34 has pthreads in libc.a: no -pthread needed):
 *     gcc -static -O2 -Wall -Wextra -Werror -o loaded_latency guest/src/loaded_latency.c
 *
 * Conventions as guest/src/daxio.c (shared helpers: guest/include/pfcxl_tool.h): 2 MiB-aligned
 * MAP_SHARED window of a device or file, only volatile 8-byte accesses to it, one JSON line on
 * stdout, errors one line on stderr, exit 0 ok / 1 chain check failed / 2 error. Output fields:
 * guest/bench_schema.md.
 */
#define _GNU_SOURCE
#include <pthread.h>

#define TOOL_NAME "loaded_latency"
#include "../include/pfcxl_bench.h"

#define LINE ((uint64_t)64)
#define WPL (LINE / 8) /* words per line */
#define MAX_THREADS 256
#define MAX_DELAYS 64
#define RAMP_TIMEOUT_NS 60000000000ULL
#define CLOCK_NOTE "guest CLOCK_MONOTONIC (under TCG: emulator time, not fabric latency)"

static const char HELP[] =
    "usage: loaded_latency --target T [--threads N] [--delays LIST [--delay-unit cycles|ns]]\n"
    "                      [--read-pct P] [--span BYTES] [--traffic-span BYTES] [--seed S]\n"
    "                      [--laps L] [--min-ms M] [--mark-rows 0|1]\n"
    "\n"
    "Loaded latency. The main thread is the latency thread: a dependent pointer chase over a\n"
    "random cyclic permutation of the 64-byte lines of [0, BYTES) (as idle_latency; the first\n"
    "warm-up lap checks it visits every line exactly once). N traffic threads each walk their\n"
    "own region sequentially, one 64-byte line (8 volatile 8-byte words) per access, P% of the\n"
    "accesses reads and the rest writes (evenly interleaved), spinning DELAY between accesses.\n"
    "For each delay (one row): start the traffic threads, wait until every one has made an\n"
    "access, then chase at least L laps, at least M ms and until every traffic thread has made\n"
    "an access inside this window; bandwidth = traffic bytes moved in the window / window time,\n"
    "latency = window time / chase loads.\n"
    "\n"
    "options (also accepted as --name=value):\n"
    "  --target T            /dev/daxN.M (device-DAX, MAP_SHARED, 2 MiB-aligned), 'anon' (local\n"
    "                        DRAM) or a regular file (never extended). Required. Layout: chase\n"
    "                        [0, span); thread i's region at span + i*traffic_span.\n"
    "  --threads N           traffic threads, 0..256 (default 1)\n"
    "  --delays LIST         comma-separated injection delays, swept in order, up to 64\n"
    "                        (default 0,50,200,1000,5000,20000)\n"
    "  --delay-unit U        cycles (TSC ticks, spin on rdtsc) or ns (spin on CLOCK_MONOTONIC);\n"
    "                        default cycles\n"
    "  --delay-cycles LIST   same as --delays LIST --delay-unit cycles\n"
    "  --delay-ns LIST       same as --delays LIST --delay-unit ns\n"
    "  --read-pct P          percent of traffic accesses that are reads, 0..100 (default 100)\n"
    "  --span BYTES          chased bytes, a multiple of 64, at least 128 (default 64M)\n"
    "  --traffic-span BYTES  each traffic thread's region, a multiple of 64 (default 16M)\n"
    "  --seed S              permutation seed (default 1)\n"
    "  --laps L              minimum chase laps per row, at least 1 (default 1)\n"
    "  --min-ms M            minimum measurement window per row in ms (default 100)\n"
    "  --mark-rows B         1: ring the target's pfcxl doorbell (start/stop) around each\n"
    "                        row's window, so the TCG plugin captures each row's accesses as\n"
    "                        one phase (default 0)\n"
    "  -h, --help            show this text and exit 0\n"
    "  Numbers are decimal or 0x hex; BYTES accepts a suffix K, M or G (KiB, MiB, GiB).\n"
    "\n"
    "output: one JSON line: {\"tool\":\"loaded_latency\",...,\"rows\":[{\"delay\":0,\n"
    "  \"bandwidth_MBps\":1234.5,\"latency_ns\":150.2,...,\"thread_accesses\":[...]}],\"clock\":...}\n"
    "  MB = 10^6 bytes. All fields: guest/bench_schema.md. Times are guest CLOCK_MONOTONIC;\n"
    "  under QEMU TCG that is emulator time, NOT fabric latency. With fewer CPUs than N+1 the\n"
    "  threads share CPUs (cpus_online is reported).\n"
    "\n"
    "exit status: 0 ok; 1 the chain check failed; 2 error (bad argument, target too small,\n"
    "  open/mmap/thread failure, bus error). Errors are one line on stderr.\n";

/* ---------------------------------------------------------------- chase and traffic */

struct traffic {
    volatile uint64_t *base;
    uint64_t words, read_pct, delay, sink;
    int unit_ns;
    pthread_t tid;
    _Alignas(64) uint64_t count; /* accesses so far; written only by the thread */
    char pad[56];
};

static int g_stop;

static void *traffic_main(void *arg)
{
    struct traffic *t = arg;
    uint64_t pos = 0, acc = 0, n = 0, sink = 0;
    while (!__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
        volatile uint64_t *l = t->base + pos;
        acc += t->read_pct; /* Bresenham: exactly read_pct of every 100 accesses are reads */
        if (acc >= 100) {
            acc -= 100;
            for (unsigned w = 0; w < WPL; w++)
                sink += l[w];
        } else {
            for (unsigned w = 0; w < WPL; w++)
                l[w] = n;
        }
        pos = pos + WPL == t->words ? 0 : pos + WPL;
        __atomic_store_n(&t->count, ++n, __ATOMIC_RELAXED);
        if (t->delay && t->unit_ns) {
            for (uint64_t end = now_ns() + t->delay; now_ns() < end;)
                __builtin_ia32_pause();
        } else if (t->delay) {
            for (uint64_t end = __builtin_ia32_rdtsc() + t->delay; __builtin_ia32_rdtsc() < end;)
                __builtin_ia32_pause();
        }
    }
    t->sink = sink;
    return NULL;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    struct opt o[] = {{"--target", 0},    {"--threads", 0},    {"--delays", 0},
                      {"--delay-unit", 0}, {"--delay-cycles", 0}, {"--delay-ns", 0},
                      {"--read-pct", 0},  {"--span", 0},       {"--traffic-span", 0},
                      {"--seed", 0},      {"--laps", 0},       {"--min-ms", 0},
                      {"--mark-rows", 0}, {0, 0}};
    parse_opts(argc, argv, o, HELP);
    const char *target = o[0].val;
    if (!target || !*target)
        die("missing --target (/dev/daxN.M, anon or a file); see loaded_latency --help");
    uint64_t nthreads = num(&o[1], 1, 0, 0, MAX_THREADS);
    if (!!o[2].val + !!o[4].val + !!o[5].val > 1)
        die("give only one of --delays, --delay-cycles and --delay-ns");
    if (o[3].val && !o[2].val)
        die("--delay-unit applies only to --delays");
    const char *unit = o[3].val ? o[3].val : o[5].val ? "ns" : "cycles";
    if (strcmp(unit, "cycles") && strcmp(unit, "ns"))
        die("bad value '%s' for --delay-unit (want cycles or ns)", unit);
    const struct opt *dl = o[2].val ? &o[2] : o[4].val ? &o[4] : o[5].val ? &o[5] : NULL;
    uint64_t delays[MAX_DELAYS];
    size_t ndelays = num_list(dl ? dl->name : "--delays", dl ? dl->val : "0,50,200,1000,5000,20000",
                              delays, MAX_DELAYS);
    for (size_t i = 0; i < ndelays; i++)
        if (delays[i] > 1000000000ULL)
            die("delay %" PRIu64 " is too large (at most 1000000000)", delays[i]);
    uint64_t read_pct = num(&o[6], 100, 0, 0, 100);
    uint64_t span = num(&o[7], 64ULL << 20, 1, 2 * LINE, LINE * 0xFFFFFFFFULL);
    uint64_t tspan = num(&o[8], 16ULL << 20, 1, LINE, 1ULL << 40);
    if (span % LINE || tspan % LINE)
        die("--%s %" PRIu64 " is not a multiple of 64", span % LINE ? "span" : "traffic-span",
            span % LINE ? span : tspan);
    uint64_t seed = num(&o[9], 1, 0, 0, UINT64_MAX);
    uint64_t laps = num(&o[10], 1, 0, 1, 1000000);
    uint64_t min_ms = num(&o[11], 100, 0, 0, 3600000);
    int mark_rows = (int)num(&o[12], 0, 0, 0, 1);
    const uint64_t lines = span / LINE;

    uint32_t *order = malloc(lines * sizeof *order);
    uint64_t *seen = calloc((lines + 63) / 64, sizeof *seen);
    struct traffic *tr = aligned_alloc(64, (nthreads + 1) * sizeof *tr);
    uint64_t *cnt = malloc((nthreads + 1) * sizeof *cnt); /* per-thread accesses in a row */
    char *rows_json = NULL;
    size_t rows_len = 0;
    FILE *rows = open_memstream(&rows_json, &rows_len);
    if (!order || !seen || !tr || !cnt || !rows)
        die("out of memory for %" PRIu64 " lines", lines);
    for (uint64_t i = 0; i < lines; i++)
        order[i] = (uint32_t)i;
    uint64_t rs = seed;
    for (uint64_t i = lines - 1; i > 0; i--) { /* seeded Fisher-Yates shuffle */
        uint64_t j = (uint64_t)(((unsigned __int128)splitmix64(&rs) * (i + 1)) >> 64);
        uint32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }

    const char *kind;
    volatile uint64_t *p = map_target(target, span + nthreads * tspan, &kind);
    for (uint64_t k = 0; k < lines; k++)
        p[(uint64_t)order[k] * WPL] = order[k + 1 == lines ? 0 : k + 1];
    for (uint64_t off = span; off < span + nthreads * tspan; off += 4096)
        p[off / 8] = p[off / 8]; /* fault the traffic regions in before the first row */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    uint64_t idx = order[0], visited = 0; /* warm-up lap: every line exactly once? */
    for (uint64_t k = 0; k < lines; k++) {
        if (!(seen[idx >> 6] >> (idx & 63) & 1)) {
            seen[idx >> 6] |= 1ULL << (idx & 63);
            visited++;
        }
        idx = chase(p, idx, 1, lines);
    }
    int closed = idx == order[0];
    struct pfcxl_doorbell db = {0};
    rows_marker_open(target, mark_rows, &db);

    for (size_t r = 0; r < ndelays; r++) {
        __atomic_store_n(&g_stop, 0, __ATOMIC_SEQ_CST);
        for (uint64_t i = 0; i < nthreads; i++) {
            tr[i] = (struct traffic){.base = p + (span + i * tspan) / 8, .words = tspan / 8,
                                     .read_pct = read_pct, .delay = delays[r],
                                     .unit_ns = !strcmp(unit, "ns")};
            int e = pthread_create(&tr[i].tid, NULL, traffic_main, &tr[i]);
            if (e)
                die("pthread_create (traffic thread %" PRIu64 "): %s", i, strerror(e));
        }
        uint64_t ramp = now_ns();
        for (uint64_t i = 0; i < nthreads; i++)
            while (!__atomic_load_n(&tr[i].count, __ATOMIC_RELAXED)) {
                if (now_ns() - ramp > RAMP_TIMEOUT_NS)
                    die("traffic thread %" PRIu64 " made no access within 60 s", i);
                nanosleep(&(struct timespec){0, 100000}, NULL);
            }
        for (uint64_t i = 0; i < nthreads; i++)
            cnt[i] = __atomic_load_n(&tr[i].count, __ATOMIC_RELAXED);
        rows_marker_ring(&db, PFCXL_MARK_START);
        uint64_t t0 = now_ns(), t1, done = 0, lagging;
        do { /* at least L laps, M ms, and until every traffic thread ran inside the window */
            idx = chase(p, idx, lines, lines);
            done++;
            t1 = now_ns();
            lagging = nthreads;
            while (lagging && __atomic_load_n(&tr[lagging - 1].count, __ATOMIC_RELAXED) >
                                  cnt[lagging - 1])
                lagging--;
            if (lagging && t1 - t0 > RAMP_TIMEOUT_NS)
                die("traffic thread %" PRIu64 " made no access in 60 s of measurement", lagging - 1);
        } while (done < laps || t1 - t0 < min_ms * 1000000ULL || lagging);
        uint64_t total = 0;
        for (uint64_t i = 0; i < nthreads; i++) {
            cnt[i] = __atomic_load_n(&tr[i].count, __ATOMIC_RELAXED) - cnt[i];
            total += cnt[i];
        }
        rows_marker_ring(&db, PFCXL_MARK_STOP);
        __atomic_store_n(&g_stop, 1, __ATOMIC_SEQ_CST);
        for (uint64_t i = 0; i < nthreads; i++)
            pthread_join(tr[i].tid, NULL);
        double sec = (double)(t1 - t0) / 1e9;
        fprintf(rows, "%s{\"delay\":%" PRIu64 ",\"seconds\":%.6f,\"laps\":%" PRIu64
                ",\"loads\":%" PRIu64 ",\"latency_ns\":%.3f,\"accesses\":%" PRIu64
                ",\"bytes\":%" PRIu64 ",\"bandwidth_MBps\":%.3f,\"thread_accesses\":[",
                r ? "," : "", delays[r], sec, done, done * lines,
                (double)(t1 - t0) / (double)(done * lines), total, total * LINE,
                (double)(total * LINE) / sec / 1e6);
        for (uint64_t i = 0; i < nthreads; i++)
            fprintf(rows, i ? ",%" PRIu64 : "%" PRIu64, cnt[i]);
        fprintf(rows, "]}");
    }
    pfcxl_doorbell_close(&db);
    if (fclose(rows) != 0)
        die("buffering output: %s", strerror(errno));

    printf("{\"tool\":\"loaded_latency\",\"target\":");
    json_str(target);
    printf(",\"kind\":\"%s\",\"span\":%" PRIu64 ",\"line_bytes\":%" PRIu64 ",\"lines\":%" PRIu64
           ",\"seed\":%" PRIu64 ",\"traffic_span\":%" PRIu64 ",\"threads\":%" PRIu64
           ",\"read_pct\":%" PRIu64 ",\"access_bytes\":%" PRIu64 ",\"delay_unit\":\"%s\",\"laps\":%" PRIu64
           ",\"min_ms\":%" PRIu64 ",\"cpus_online\":%ld,\"visited_lines_per_lap\":%" PRIu64
           ",\"lap_closed\":%s,\"rows\":[",
           kind, span, LINE, lines, seed, tspan, nthreads, read_pct, LINE, unit, laps, min_ms,
           sysconf(_SC_NPROCESSORS_ONLN), visited, closed ? "true" : "false");
    printf("%s],\"clock\":\"%s\"}\n", rows_json, CLOCK_NOTE);
    finish_output();
    return chain_verdict(visited, lines, closed);
}
