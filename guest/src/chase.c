/*
 * chase: dependent pointer chase, the latency probe for pfcxl's injected fabric timing.
 *
 *     chase [--dax /dev/dax0.0 | --local] [--lines N] [--span BYTES] [--loads L] [--seed S]
 *           [--no-mark] [--profile K] [--cold | --warm]
 *           [--write | --stream [--stripe G,N,K] [--gap-ticks T]]
 *
 * N lines, line j at byte offset j * (span / N rounded down to 64), are linked into one random
 * cycle (Sattolo's algorithm, seeded): the first 8 bytes of each line hold the address of the
 * next (a pointer, as linked data structures hold them). The chain is written before the
 * measured phase; then L loads, each depending on the previous, walk it between pfcxl phase
 * markers (--no-mark leaves them out). --local chases the same pattern in ordinary guest RAM (no
 * markers): a workload that never touches CXL.
 * --profile K first selects the plugin's inject latency profile K (doorbell 0x100 + K); under
 * --clock virtual, the K-th fabric (0 pf, 1 pf_hbm, 2 electrical: host_tools/timing/vtime.py).
 * --cold (for --clock virtual): the modelled caches are emptied just before the walk
 * (PFCXL_MARK_COLD on the device's doorbell) and each load reaches a line of its own (L must not
 * exceed N), so every timed load misses the caches: the memory's idle latency.
 * --warm: the chain is walked once, untimed, before the timed walk: with a chain that fits in a
 * modelled cache, every timed load hits it (use a line count that does not divide the span by a
 * power of two, so the lines spread over the cache's sets).
 * --write: instead of loading, store 8 bytes to each line in the cycle's order with a
 * non-temporal store (movnti), which waits for its write to complete in virtual time: the
 * memory's idle write latency. The order comes from a copy in ordinary RAM.
 * --stream: instead of the chain, L loads of 8 bytes (rounded up to a multiple of 8), one per
 * line, in address order from the start of the span (wrapping): a sequential read, its
 * bandwidth 64 B / ns_per_load. --stripe G,N,K (with --stream): only the K-th of every N granules
 * of G bytes, as bandwidth's --stripe: the span's bytes are laid on those granules, so the device
 * holds N * span bytes (one module's share of an N-way interleave at granularity G: on an
 * appliance, every load of the stream goes to module K). G a multiple of 512 dividing span.
 * --gap-ticks T (with --stream): after each 8 lines, spin until 8 x T TSC ticks have passed since
 * the last spin ended: the stream then offers at most 64 B per T ticks (under --clock virtual a
 * tick is a virtual ns: 64 / T GB/s), so traffic hosts can load a fabric at a chosen rate.
 * Defaults: N 4096, span 16M, L 100000, seed 1. Numbers accept K/M/G suffixes.
 *
 * Output, one JSON line: {"tool":"chase","where":"dax"|"local","lines":N,"span":...,"loads":L,
 *   "cold":0|1,"op":"load"|"store"|"stream","ns":...,"ns_per_load":...,"p50_ns_per_load":...,
 *   "end":...}; ns is guest CLOCK_MONOTONIC time of the walk only, ns_per_load its mean;
 *   p50_ns_per_load is the median over batches of 64 loads (1024 for --stream), each timed on its own: the guest
 *   kernel's own work (a timer tick) lands in a few batches only, so under --clock virtual the
 *   median is the same from run to run while the mean moves with where the ticks fell. Batches
 *   are timed with rdtsc (one instruction) and converted with the walk's ns per TSC tick;
 *   p50_ticks_per_load is the median in ticks, which under --clock virtual are virtual ns exactly
 *   (the TSC counts QEMU's virtual clock), with no boot's calibration in it. end is the offset
 *   of the line the walk ended on.
 * Exit status 0, or 2 on any error.
 */
#define _GNU_SOURCE

#define TOOL_NAME "chase"
#define TOOL_VERBATIM_ERRORS /* as formatted: no flush of stdout, no one-lining */
#include "../include/pfcxl_tool.h"
#include "../include/pfcxl_mark.h"

#include <x86intrin.h>

#define BATCH 64

static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The median of the batches' durations per load, in ns; `stamps` holds n + 1 TSC readings (one
 * instruction each, so the batches' own timing costs next to nothing), `ns_per_tick` converts. */
static double median_ticks(uint64_t *stamps, uint64_t n)
{
    if (!n)
        return 0.0;
    for (uint64_t i = 0; i < n; i++)
        stamps[i] = stamps[i + 1] - stamps[i];
    qsort(stamps, n, sizeof *stamps, by_value);
    return n % 2 ? (double)stamps[n / 2] : (double)(stamps[n / 2 - 1] + stamps[n / 2]) / 2;
}

/* --gap-ticks: spin until `ticks` have passed since `since`; the TSC when it returns (no wait
 * without a gap, nor when the loads themselves took longer). */
static uint64_t pace(uint64_t since, uint64_t ticks)
{
    if (!ticks)
        return since;
    uint64_t t = __rdtsc();
    while (t - since < ticks)
        t = __rdtsc();
    return t;
}

int main(int argc, char **argv)
{
    const char *dax = "/dev/dax0.0";
    uint64_t lines = 4096, span = 16ULL << 20, loads = 100000, seed = 1;
    int mark = 1, local = 0, cold = 0, warm = 0, write = 0, stream = 0;
    long profile = -1;
    uint64_t stripe[3] = {0, 1, 0};       /* --stripe G,N,K: granule K of every N of G bytes */
    uint64_t gap = 0;                     /* --gap-ticks: TSC ticks per line a stream waits at least */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        /* the switches: each sets its flag to the value given here */
        const struct {
            const char *name;
            int *flag, value;
        } switches[] = {{"--no-mark", &mark, 0}, {"--local", &local, 1}, {"--cold", &cold, 1},
                        {"--warm", &warm, 1},     {"--write", &write, 1}, {"--stream", &stream, 1}};
        size_t s = 0;
        while (s < sizeof switches / sizeof switches[0] && strcmp(a, switches[s].name))
            s++;
        if (s < sizeof switches / sizeof switches[0]) {
            *switches[s].flag = switches[s].value;
            continue;
        }
        if (!v)
            die("unknown or incomplete option '%s'", a);
        if (!strcmp(a, "--dax"))
            dax = v;
        else if (!strcmp(a, "--lines"))
            lines = loose_number(a, v);
        else if (!strcmp(a, "--span"))
            span = loose_number(a, v);
        else if (!strcmp(a, "--loads"))
            loads = loose_number(a, v);
        else if (!strcmp(a, "--seed"))
            seed = loose_number(a, v);
        else if (!strcmp(a, "--profile"))
            profile = (long)loose_number(a, v);
        else if (!strcmp(a, "--gap-ticks"))
            gap = loose_number(a, v);
        else if (!strcmp(a, "--stripe")) {
            if (num_list(a, v, stripe, 3) != 3)
                die("--stripe '%s': want G,N,K", v);
        }
        else
            die("unknown option '%s'", a);
        i++;
    }
    if (!span || span % PFCXL_DAX_ALIGN)
        die("--span must be a positive multiple of 2 MiB");
    uint64_t stride = span / (lines ? lines : 1) / 64 * 64;
    if (lines < 2 || stride < 64)
        die("--lines must be at least 2 and at most span / 64");
    if (cold && warm)
        die("--cold and --warm: choose one");
    if (write && stream)
        die("--write and --stream: choose one");
    uint64_t every = stripe[1], granule = stripe[0], at = stripe[2];
    if (every > 1 && (!stream || local))
        die("--stripe lays a --stream's span on one module's granules of a DAX device: give --stream, "
            "not --local");
    if (every > 1 && (!granule || (granule & 511) || span % granule || at >= every || span > UINT64_MAX / every))
        die("--stripe %" PRIu64 ",%" PRIu64 ",%" PRIu64 ": want G a multiple of 512 dividing --span, K < N",
            granule, every, at);
    if (every < 1)
        die("--stripe: N must be at least 1");
    if (gap && !stream)
        die("--gap-ticks paces a --stream: give --stream");
    if (gap > (1ULL << 32))
        die("--gap-ticks %" PRIu64 ": at most 2^32 ticks a line", gap);
    uint64_t mapped = span * every;       /* the bytes the walk's granules lie in */
    if (cold && !stream && loads > lines)
        die("--cold times each load on a line of its own: --loads (%" PRIu64 ") must not exceed --lines "
            "(%" PRIu64 ")", loads, lines);

    volatile uint64_t *base;
    int have_dax = 1;
    if (local) {
        mark = 0;
        have_dax = access(dax, R_OK | W_OK) == 0;   /* its doorbell still empties caches (--cold) */
        base = aligned_alloc(PFCXL_DAX_ALIGN, span);
        if (!base)
            die("out of memory");
    } else {
        int fd = open(dax, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            die("%s: %s", dax, strerror(errno));
        uint64_t size = pfcxl_dev_size(fd);
        if (size < PFCXL_DAX_ALIGN || mapped > size - PFCXL_DAX_ALIGN)
            die("--span %" PRIu64 " (times --stripe's N) exceeds the device size (%" PRIu64 ") minus 2 MiB",
                span, size);
        base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base == MAP_FAILED)
            die("mmap %s: %s", dax, strerror(errno));
        close(fd);
    }

    /* Sattolo: a uniformly random single cycle through all N lines */
    uint64_t *order = malloc(lines * sizeof *order), x = seed;
    if (!order)
        die("out of memory");
    for (uint64_t j = 0; j < lines; j++)
        order[j] = j;
    for (uint64_t j = lines - 1; j > 0; j--) {
        uint64_t k = splitmix64(&x) % j, t = order[j];
        order[j] = order[k];
        order[k] = t;
    }
    for (uint64_t j = 0; j < lines; j++)
        base[order[j] * stride / 8] = (uint64_t)(uintptr_t)&base[order[(j + 1) % lines] * stride / 8];
    /* --write's addresses, in walk order, in ordinary RAM */
    uint64_t **targets = NULL;
    if (write) {
        targets = malloc(loads * sizeof *targets);
        if (!targets)
            die("out of memory");
        for (uint64_t i = 0; i < loads; i++)
            targets[i] = (uint64_t *)(uintptr_t)&base[order[i % lines] * stride / 8];
    }

    struct pfcxl_doorbell db = {0};
    if ((mark || profile >= 0 || cold) && have_dax) {
        int rc = pfcxl_doorbell_open(dax, &db);
        if (rc)
            die("doorbell of %s: %s", dax, strerror(-rc));
        if (profile >= 0)
            pfcxl_doorbell_ring(&db, PFCXL_MARK_PROFILE(profile));
        if (mark)
            pfcxl_doorbell_ring(&db, PFCXL_MARK_START);
        if (cold)
            pfcxl_doorbell_ring(&db, PFCXL_MARK_COLD);
    } else if (cold)
        die("--cold empties the modelled caches through %s's doorbell, which cannot be opened", dax);
    uint64_t p = (uint64_t)(uintptr_t)&base[order[0] * stride / 8];
    if (warm && !write) {
        for (uint64_t i = 0; i < lines; i++)
            p = *(volatile uint64_t *)(uintptr_t)p;
    }
    /* a stream's misses come in bursts as its 48 registers fill and drain: time it in batches long
     * enough to hold many bursts */
    uint64_t batch = stream ? 16 * BATCH : BATCH;
    uint64_t batches = loads / batch, *stamps = malloc((batches + 1) * sizeof *stamps), b = 0;
    if (!stamps)
        die("out of memory");
    uint64_t t0 = now_ns();
    stamps[0] = __rdtsc();
    uint64_t paced = stamps[0];           /* where the stream's last pacing wait ended */
    if (stream && every > 1) {
        /* as below, then past the other N - 1 granules at the end of each of ours */
        volatile uint64_t *first = base + at * granule / 8, *q = first, *end = base + mapped / 8;
        uint64_t sum = 0, left = granule, skip = (every - 1) * granule / 8;
        loads = (loads + 7) / 8 * 8;
        for (uint64_t i = 0; i < loads; i += 8) {
            sum += q[0] + q[8] + q[16] + q[24] + q[32] + q[40] + q[48] + q[56];
            paced = pace(paced, 8 * gap);
            q += 64;
            if ((left -= 512) == 0) {
                q += skip;
                left = granule;
                if (q >= end)
                    q = first;
            }
            if ((i + 8) % batch == 0 && b < batches)
                stamps[++b] = __rdtsc();
        }
        p = (uint64_t)(uintptr_t)q + (sum & 0);
    } else if (stream) {
        /* eight lines an iteration, so the loop's own instructions (1 ns each in virtual time)
         * stay well below the memory's pace: the span is a multiple of 2 MiB, 8 lines divide it */
        volatile uint64_t *q = base, *end = base + span / 8;
        uint64_t sum = 0;
        loads = (loads + 7) / 8 * 8;
        for (uint64_t i = 0; i < loads; i += 8) {
            sum += q[0] + q[8] + q[16] + q[24] + q[32] + q[40] + q[48] + q[56];
            paced = pace(paced, 8 * gap);
            q += 64;
            if (q == end)
                q = base;
            if ((i + 8) % batch == 0 && b < batches)
                stamps[++b] = __rdtsc();
        }
        p = (uint64_t)(uintptr_t)q + (sum & 0);
    } else if (write) {
        for (uint64_t i = 0; i < loads; i++) {
            __builtin_ia32_movnti64((long long *)targets[i], (long long)i);
            if ((i + 1) % BATCH == 0)
                stamps[++b] = __rdtsc();
        }
        __builtin_ia32_sfence();
        p = (uint64_t)(uintptr_t)targets[loads ? loads - 1 : 0];
    } else {
        for (uint64_t i = 0; i < loads; i++) {
            p = *(volatile uint64_t *)(uintptr_t)p;
            if ((i + 1) % BATCH == 0)
                stamps[++b] = __rdtsc();
        }
    }
    uint64_t tsc1 = __rdtsc(), t1 = now_ns();
    double ns_per_tick = tsc1 > stamps[0] ? (double)(t1 - t0) / (double)(tsc1 - stamps[0]) : 0.0;
    double p50_ticks = median_ticks(stamps, b) / (double)batch;
    if (mark)
        pfcxl_doorbell_ring(&db, PFCXL_MARK_STOP);
    pfcxl_doorbell_close(&db);
    printf("{\"tool\":\"chase\",\"where\":\"%s\",\"lines\":%" PRIu64 ",\"span\":%" PRIu64
           ",\"loads\":%" PRIu64 ",\"profile\":%ld,\"cold\":%d,\"op\":\"%s\",\"ns\":%" PRIu64
           ",\"ns_per_load\":%.1f,\"p50_ns_per_load\":%.3f,\"p50_ticks_per_load\":%.4f,\"end\":%" PRIu64 "}\n",
           local ? "local" : "dax", lines, span, loads, profile, cold, write ? "store" : stream ? "stream" : "load",
           t1 - t0, loads ? (double)(t1 - t0) / (double)loads : 0.0, p50_ticks * ns_per_tick, p50_ticks,
           p - (uint64_t)(uintptr_t)base);
    return 0;
}
