/*
 * pfcxl_bench.h: what the MLC-style benchmarks (idle_latency, loaded_latency, bandwidth) share on
 * top of pfcxl_tool.h: their target mapping ('anon', a DAX device or a file), the pointer chains
 * the latency tools chase, and `--mark-rows` (one plugin phase per measured row).
 * Included after defining TOOL_NAME, like pfcxl_tool.h, which it includes.
 */
#ifndef PFCXL_BENCH_H
#define PFCXL_BENCH_H

#include "pfcxl_tool.h"

/* The benchmarks' target: map [0, len) read-write of 'anon' (private anonymous memory 2 MiB
 * aligned, the local-DRAM comparison), a device-DAX character device or a regular file of at
 * least len bytes (never extended). *kind: "anon", "dax" or "file". Bus errors exit 2. */
static inline volatile uint64_t *map_target(const char *t, uint64_t len, const char **kind)
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
            *kind = "dax";
            have = dax_size(NULL, &st);
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
    signal(SIGBUS, sigbus_exit);
    /* volatile 8-byte accesses only: under QEMU TCG the CXL window is an I/O region and string
     * instructions (memset/memcpy, rep movs) on it become one I/O per byte */
    return (volatile uint64_t *)m;
}

/* ---------------------------------------------------------------- pointer chains */

/* idle_latency and loaded_latency chase a random cycle of 64-byte lines whose first 8-byte
 * word holds the index of the next line. Every load depends on the one before, so the time per
 * load is the memory latency; a value out of range means the memory did not keep the chain. */
#define CHAIN_LINE_WORDS 8 /* 64-byte lines */
#define EXIT_CHAIN 1       /* the chain check failed */

/* k dependent loads from line idx on; returns the line reached. */
static inline uint64_t chase(volatile uint64_t *p, uint64_t idx, uint64_t k, uint64_t lines)
{
    while (k--) {
        uint64_t next = p[idx * CHAIN_LINE_WORDS];
        if (next >= lines)
            fail(EXIT_CHAIN, "chain corrupted: line %" PRIu64 " holds %" PRIu64 " (>= %" PRIu64
                 " lines)", idx, next, lines);
        idx = next;
    }
    return idx;
}

/* The exit status after the first warm-up lap's check: it must have visited `visited` == lines
 * distinct lines and come back to its start. Said on stderr after the JSON line (which reports
 * the same numbers), so the result is still printed. */
static inline int chain_verdict(uint64_t visited, uint64_t lines, int closed)
{
    if (visited != lines || !closed) {
        fprintf(stderr, TOOL_NAME ": chain check failed: a lap visited %" PRIu64
                " distinct lines of %" PRIu64 "%s\n", visited, lines,
                closed ? "" : " and did not return to its start");
        return EXIT_CHAIN;
    }
    return 0;
}


/* ---------------------------------------------------------------- row marks (--mark-rows) */

/* `--mark-rows 1`: each measured row is one phase of pfcxl's TCG plugin (pfcxl_mark.h), so the
 * host can cut the captured access stream into the stream each row issued. Needs the target's
 * doorbell: a DAX device or a file, never anon. */
static inline void rows_marker_open(const char *target, int on, struct pfcxl_doorbell *db)
{
    db->line = NULL;
    db->map = NULL;
    if (!on)
        return;
    if (!strcmp(target, "anon"))
        die("--mark-rows 1 needs a DAX device or a file as --target (anon has no doorbell)");
    int rc = pfcxl_doorbell_open(target, db);
    if (rc)
        die("doorbell of %s: %s", target, strerror(-rc));
}

/* PFCXL_MARK_START or PFCXL_MARK_STOP, when rows are marked. */
static inline void rows_marker_ring(struct pfcxl_doorbell *db, uint64_t phase)
{
    if (db->line)
        pfcxl_doorbell_ring(db, phase);
}

#endif /* PFCXL_BENCH_H */
