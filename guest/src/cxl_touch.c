/*
 * cxl_touch: exactly K loads and W stores, each to its own cache line of a DAX device, between
 * pfcxl phase markers: the known answer for the TCG plugin's counters and traces.
 *
 *     cxl_touch [--dax /dev/dax0.0] [--reads K] [--writes W] [--seed S] [--span BYTES] [--no-mark]
 *
 * The K + W lines are distinct and lie in [0, span) of the device (span: a multiple of 2 MiB,
 * default 64M, at most size - 2 MiB so the doorbell window at the end is never touched). Line i
 * (i < K for loads, K <= i < K + W for stores) is (a * i + b) mod (span / 64), a odd and coprime
 * with span / 64, a and b derived from the seed. Every access is one 8-byte volatile load or
 * store at the start of its line; the offsets are computed before the phase starts, so inside
 * it the only device accesses are these. Numbers accept K/M/G suffixes.
 *
 * Output, one JSON line: {"tool":"cxl_touch","dax":...,"reads":K,"writes":W,"seed":S,
 *   "span":...,"read_offsets_sum":...,"write_offsets_sum":...,"read_ns":...,"write_ns":...,
 *   "ns_per_read":...,"ns_per_write":...,"marked":true}
 * *_offsets_sum: sum of the byte offsets touched (lets the host check a trace's addresses);
 * *_ns: guest CLOCK_MONOTONIC time of each loop. Exit status 0, or 2 on any error.
 */
#define _GNU_SOURCE

#define TOOL_NAME "cxl_touch"
#define TOOL_VERBATIM_ERRORS /* as formatted: no flush of stdout, no one-lining */
#include "../include/pfcxl_tool.h"
#include "../include/pfcxl_mark.h"

static uint64_t gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int main(int argc, char **argv)
{
    const char *dax = "/dev/dax0.0";
    uint64_t reads = 1000, writes = 500, seed = 1, span = 64ULL << 20;
    int mark = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-mark")) {
            mark = 0;
            continue;
        }
        if (!v)
            die("unknown or incomplete option '%s'", a);
        if (!strcmp(a, "--dax"))
            dax = v;
        else if (!strcmp(a, "--reads"))
            reads = loose_number(a, v);
        else if (!strcmp(a, "--writes"))
            writes = loose_number(a, v);
        else if (!strcmp(a, "--seed"))
            seed = loose_number(a, v);
        else if (!strcmp(a, "--span"))
            span = loose_number(a, v);
        else
            die("unknown option '%s'", a);
        i++;
    }

    int fd = open(dax, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        die("%s: %s", dax, strerror(errno));
    uint64_t size = pfcxl_dev_size(fd);
    if (!span || span % PFCXL_DAX_ALIGN || size < PFCXL_DAX_ALIGN || span > size - PFCXL_DAX_ALIGN)
        die("--span %" PRIu64 " must be a multiple of 2 MiB and at most the device size (%" PRIu64
            ") minus 2 MiB", span, size);
    uint64_t lines = span / 64;
    if (reads + writes > lines)
        die("%" PRIu64 " accesses do not fit in %" PRIu64 " distinct lines", reads + writes, lines);
    volatile uint64_t *base = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        die("mmap %s: %s", dax, strerror(errno));
    close(fd);

    /* (a*i + b) mod lines is a bijection on [0, lines) when gcd(a, lines) == 1 */
    uint64_t x = seed, a = (splitmix64(&x) % lines) | 1, b = splitmix64(&x) % lines;
    while (gcd(a, lines) != 1)
        a += 2;
    uint64_t n = reads + writes, rsum = 0, wsum = 0;
    uint64_t *word = malloc((n ? n : 1) * sizeof *word);
    if (!word)
        die("out of memory");
    for (uint64_t i = 0; i < n; i++) {
        uint64_t off = ((unsigned __int128)a * i + b) % lines * 64;
        word[i] = off / 8;
        if (i < reads)
            rsum += off;
        else
            wsum += off;
    }

    struct pfcxl_doorbell db = {0};
    if (mark) {
        int rc = pfcxl_doorbell_open(dax, &db);
        if (rc)
            die("doorbell of %s: %s", dax, strerror(-rc));
        pfcxl_doorbell_ring(&db, PFCXL_MARK_START);
    }
    uint64_t sink = 0, t0 = now_ns();
    for (uint64_t i = 0; i < reads; i++)
        sink += base[word[i]];
    uint64_t t1 = now_ns();
    for (uint64_t i = reads; i < n; i++)
        base[word[i]] = seed ^ i;
    uint64_t t2 = now_ns();
    if (mark) {
        pfcxl_doorbell_ring(&db, PFCXL_MARK_STOP);
        pfcxl_doorbell_close(&db);
    }

    printf("{\"tool\":\"cxl_touch\",\"dax\":\"%s\",\"reads\":%" PRIu64 ",\"writes\":%" PRIu64
           ",\"seed\":%" PRIu64 ",\"span\":%" PRIu64 ",\"read_offsets_sum\":%" PRIu64
           ",\"write_offsets_sum\":%" PRIu64 ",\"read_ns\":%" PRIu64 ",\"write_ns\":%" PRIu64
           ",\"ns_per_read\":%.1f,\"ns_per_write\":%.1f,\"marked\":%s,\"sink\":%" PRIu64 "}\n",
           dax, reads, writes, seed, span, rsum, wsum, t1 - t0, t2 - t1,
           reads ? (double)(t1 - t0) / (double)reads : 0.0,
           writes ? (double)(t2 - t1) / (double)writes : 0.0, mark ? "true" : "false", sink);
    return 0;
}
