/*
 * pfcxl_mark.h: phase markers for pfcxl's TCG plugin (device/plugin/pfcxl_plugin.c).
 *
 * The DOORBELL is the LAST 64-byte line of the DAX device: byte offset size - 64. Workloads
 * use low offsets, so they never collide with it. On the host, its physical address is
 * dax base + dax size - 64 (pfcxl.host_tools.timing.config.doorbell_hpa), and the plugin is told it with
 * doorbell=0x...
 *
 * An 8-byte store of PFCXL_MARK_START to the doorbell starts a measured phase, PFCXL_MARK_STOP
 * ends it. The plugin records and counts nothing outside a phase (boot and setup traffic), and
 * never records the doorbell accesses themselves. In inject mode, a store of
 * PFCXL_MARK_PROFILE(k) selects latency profile k (the k-th value of the plugin's read_ns= and
 * write_ns= lists), at any time; under --clock virtual it puts the model file's k-th fabric in
 * force (0 pf, 1 pf_hbm, 2 electrical). Under --clock virtual a store of PFCXL_MARK_COLD empties the
 * storing vCPU's modelled caches, so what follows starts cold.
 *
 * Usage: struct pfcxl_doorbell db; pfcxl_doorbell_open("/dev/dax0.0", &db) == 0, then
 * pfcxl_doorbell_ring(&db, PFCXL_MARK_START) ... pfcxl_doorbell_ring(&db, PFCXL_MARK_STOP),
 * pfcxl_doorbell_close(&db); or the one-shot pfcxl_mark(dax, phase).
 * Works on a regular file too (for host-side tests): its size is the file's size.
 */
#ifndef PFCXL_MARK_H
#define PFCXL_MARK_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define PFCXL_MARK_START 1
#define PFCXL_MARK_STOP 2
#define PFCXL_MARK_PROFILE(k) (0x100ULL + (uint64_t)(k))
#define PFCXL_MARK_COLD 3   /* --clock virtual: empty the storing vCPU's modelled caches */
#define PFCXL_DOORBELL_LINE 64ULL

/* Arms pfcxl's TCG plugin, which stays dormant (no memory callbacks, so the boot runs at plain
 * TCG speed) until a vCPU executes this: nopl 0x50464358(%rax), a 7-byte NOP whose displacement
 * spells "XCFP" (device/plugin/pfcxl_plugin.c looks for exactly these bytes). Harmless anywhere. */
static inline void pfcxl_arm(void)
{
    __asm__ volatile(".byte 0x0f, 0x1f, 0x80, 0x58, 0x43, 0x46, 0x50" ::: "memory");
}
/* device-DAX maps only in multiples of the region's alignment (2 MiB) */
#define PFCXL_DAX_ALIGN (2ULL << 20)

struct pfcxl_doorbell {
    volatile uint64_t *line;
    void *map;
    size_t map_len;
    uint64_t dev_size;
};

/* Size of DEV: sysfs for a device-DAX character device, st_size for a regular file; 0 if unknown. */
static inline uint64_t pfcxl_dev_size(int fd)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return 0;
    if (S_ISREG(st.st_mode))
        return (uint64_t)st.st_size;
    if (!S_ISCHR(st.st_mode))
        return 0;
    char path[96];
    snprintf(path, sizeof path, "/sys/dev/char/%u:%u/size", major(st.st_rdev), minor(st.st_rdev));
    FILE *f = fopen(path, "r");
    unsigned long long size = 0;
    if (f) {
        if (fscanf(f, "%llu", &size) != 1)
            size = 0;
        fclose(f);
    }
    return size;
}

/* Map the doorbell line of DAX. Returns 0, or -errno (-EINVAL when the size is unusable). */
static inline int pfcxl_doorbell_open(const char *dax, struct pfcxl_doorbell *db)
{
    db->line = NULL;
    db->map = NULL;
    int fd = open(dax, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return errno ? -errno : -EIO;
    uint64_t size = pfcxl_dev_size(fd);
    if (size < PFCXL_DAX_ALIGN || size % PFCXL_DOORBELL_LINE) {
        close(fd);
        return -EINVAL;
    }
    /* the last aligned window that holds the last line */
    uint64_t doorbell = size - PFCXL_DOORBELL_LINE;
    uint64_t start = doorbell / PFCXL_DAX_ALIGN * PFCXL_DAX_ALIGN;
    size_t len = (size_t)(size - start);
    void *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    int err = errno ? errno : EIO;
    close(fd);
    if (map == MAP_FAILED)
        return -err;
    db->map = map;
    db->map_len = len;
    db->dev_size = size;
    db->line = (volatile uint64_t *)((char *)map + (doorbell - start));
    return 0;
}

/* One 8-byte store of `phase`, ordered after everything before it and pushed out of the cache. */
static inline void pfcxl_doorbell_ring(struct pfcxl_doorbell *db, uint64_t phase)
{
    __asm__ __volatile__("mfence" ::: "memory");
    *db->line = phase;
    __asm__ __volatile__("sfence; clflush (%0); mfence" : : "r"(db->line) : "memory");
}

static inline void pfcxl_doorbell_close(struct pfcxl_doorbell *db)
{
    if (db->map)
        munmap(db->map, db->map_len);
    db->map = NULL;
    db->line = NULL;
}

/* Sleep until CLOCK_MONOTONIC reaches the next multiple of `ms` milliseconds (at least 1 ms
 * away), with no timer slack. The kernel's periodic tick runs on a grid of whole tick periods of
 * CLOCK_MONOTONIC, so a phase started right after this starts at the same point of the tick
 * whenever its command was typed: under --clock virtual, where that is the one thing the host's
 * speed can still change, repeated runs then execute alike. Returns 0 or -errno. */
static inline int pfcxl_align(unsigned ms)
{
    struct timespec now;
    if (!ms || clock_gettime(CLOCK_MONOTONIC, &now) < 0)
        return -EINVAL;
    uint64_t step = (uint64_t)ms * 1000000ULL;
    uint64_t t = (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec + 1000000ULL;
    t = (t / step + 1) * step;
    struct timespec at = {.tv_sec = (time_t)(t / 1000000000ULL), .tv_nsec = (long)(t % 1000000000ULL)};
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    int rc;
    while ((rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL)) == EINTR)
        ;
    return -rc;
}

/* One-shot: map, store the mark value (PFCXL_MARK_*), unmap. Returns 0 or -errno. */
static inline int pfcxl_mark(const char *dax, uint64_t phase)
{
    struct pfcxl_doorbell db = {0};
    int rc = pfcxl_doorbell_open(dax, &db);
    if (rc)
        return rc;
    pfcxl_doorbell_ring(&db, phase);
    pfcxl_doorbell_close(&db);
    return 0;
}

#endif /* PFCXL_MARK_H */
