/*
 * chase: dependent pointer chase, the latency probe for pfcxl's injected fabric timing.
 *
 *     chase [--dax /dev/dax0.0 | --local] [--lines N] [--span BYTES] [--loads L] [--seed S]
 *           [--no-mark] [--profile K] [--cold] [--write]
 *
 * N lines, line j at byte offset j * (span / N rounded down to 64), are linked into one random
 * cycle (Sattolo's algorithm, seeded): the first 8 bytes of each line hold the address of the
 * next (a pointer, as linked data structures hold them). The chain is written before the
 * measured phase; then L loads, each depending on the previous, walk it between pfcxl phase
 * markers (--no-mark leaves them out). --local chases the same pattern in ordinary guest RAM (no
 * markers): a workload that never touches CXL.
 * --profile K first selects the plugin's inject latency profile K (doorbell 0x100 + K).
 * --cold (for --clock virtual): the modelled caches are emptied just before the walk
 * (PFCXL_MARK_COLD on the device's doorbell) and each load reaches a line of its own (L must not
 * exceed N), so every timed load misses the caches: the memory's idle latency.
 * --write: instead of loading, store 8 bytes to each line in the cycle's order with a
 * non-temporal store (movnti), which waits for its write to complete in virtual time: the
 * memory's idle write latency. The order comes from a copy in ordinary RAM.
 * Defaults: N 4096, span 16M, L 100000, seed 1. Numbers accept K/M/G suffixes.
 *
 * Output, one JSON line: {"tool":"chase","where":"dax"|"local","lines":N,"span":...,"loads":L,
 *   "cold":0|1,"op":"load"|"store","ns":...,"ns_per_load":...,"end":...}; ns is guest
 *   CLOCK_MONOTONIC time of the walk only; end is the offset of the line the walk ended on.
 * Exit status 0, or 2 on any error.
 */
#define _GNU_SOURCE

#define TOOL_NAME "chase"
#define TOOL_VERBATIM_ERRORS /* as formatted: no flush of stdout, no one-lining */
#include "../include/pfcxl_tool.h"
#include "../include/pfcxl_mark.h"

int main(int argc, char **argv)
{
    const char *dax = "/dev/dax0.0";
    uint64_t lines = 4096, span = 16ULL << 20, loads = 100000, seed = 1;
    int mark = 1, local = 0, cold = 0, write = 0;
    long profile = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-mark")) {
            mark = 0;
            continue;
        }
        if (!strcmp(a, "--local")) {
            local = 1;
            continue;
        }
        if (!strcmp(a, "--cold")) {
            cold = 1;
            continue;
        }
        if (!strcmp(a, "--write")) {
            write = 1;
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
        else
            die("unknown option '%s'", a);
        i++;
    }
    if (!span || span % PFCXL_DAX_ALIGN)
        die("--span must be a positive multiple of 2 MiB");
    uint64_t stride = span / (lines ? lines : 1) / 64 * 64;
    if (lines < 2 || stride < 64)
        die("--lines must be at least 2 and at most span / 64");
    if (cold && loads > lines)
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
        if (size < PFCXL_DAX_ALIGN || span > size - PFCXL_DAX_ALIGN)
            die("--span %" PRIu64 " exceeds the device size (%" PRIu64 ") minus 2 MiB", span, size);
        base = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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
    uint64_t p = (uint64_t)(uintptr_t)&base[order[0] * stride / 8], t0 = now_ns();
    if (write) {
        for (uint64_t i = 0; i < loads; i++)
            __builtin_ia32_movnti64((long long *)targets[i], (long long)i);
        __builtin_ia32_sfence();
        p = (uint64_t)(uintptr_t)targets[loads ? loads - 1 : 0];
    } else {
        for (uint64_t i = 0; i < loads; i++)
            p = *(volatile uint64_t *)(uintptr_t)p;
    }
    uint64_t t1 = now_ns();
    if (mark)
        pfcxl_doorbell_ring(&db, PFCXL_MARK_STOP);
    pfcxl_doorbell_close(&db);
    printf("{\"tool\":\"chase\",\"where\":\"%s\",\"lines\":%" PRIu64 ",\"span\":%" PRIu64
           ",\"loads\":%" PRIu64 ",\"profile\":%ld,\"cold\":%d,\"op\":\"%s\",\"ns\":%" PRIu64
           ",\"ns_per_load\":%.1f,\"end\":%" PRIu64 "}\n", local ? "local" : "dax", lines, span, loads, profile,
           cold, write ? "store" : "load", t1 - t0, loads ? (double)(t1 - t0) / (double)loads : 0.0,
           p - (uint64_t)(uintptr_t)base);
    return 0;
}
