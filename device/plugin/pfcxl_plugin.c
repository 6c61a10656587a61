/*
 * pfcxl TCG plugin: sees every guest access to the CXL window (and to the direct path's windows)
 * and counts it, traces it into a shared-memory ring, or delays the vCPU by a modelled latency.
 *
 *   qemu-system-x86_64 ... -plugin /abs/pfcxl_plugin.so,mode=trace,ring=/path,doorbell=0x... \
 *                          -d plugin -D plugin.log
 *
 * Arguments:
 *   mode=count|trace|inject   count: per-vCPU request counters only; trace: also one 24-byte
 *                             record per cache-line request into the ring; inject: also spin
 *   ring=PATH                 (trace) ring file created by the host (device/trace/records.py)
 *   doorbell=HPA              physical address of the marker line (the DAX device's last line);
 *                             may be given once per DAX device (up to 32); without it,
 *                             everything is recorded from boot on
 *   direct=BASE:SIZE          a direct-path window (guest RAM, an NVDIMM over the same bytes as
 *                             a CXL device; device/topology/data_path.py): its accesses are requests too,
 *                             recognised by physical address; up to 16
 *   read_ns=, write_ns=       (inject) modelled latency of one cache-line request; a list
 *                             A:B:... gives latency profiles 0, 1, ... (one value: profile 0)
 *   baseline_ns=              (inject) what the emulator already costs per request; the vCPU
 *                             spins for modelled - baseline when that is positive
 *   ring_timeout_s=           (trace) how long a full ring waits for the drainer before the
 *                             producer declares it gone and starts dropping (default 30)
 *   clock=virtual             (count, trace) the guest lives in fabric time: every access goes
 *                             through a modelled cache hierarchy whose stalls are charged to
 *                             the guest's virtual clock (pfcxl_vtime.h; needs pfcxl's QEMU
 *                             under -icount); requests are then the hierarchy's memory requests
 *   vtime=PATH                (clock=virtual) the model file the host wrote
 *
 * A request is one 64-byte line: consecutive accesses of a vCPU to the same line in the same
 * direction merge into one request whose size is the number of distinct bytes touched. A store
 * of 1 to the doorbell line starts a phase, a store of 2 ends it (flushing every vCPU's pending
 * line); doorbell accesses themselves are never recorded, and nothing outside a phase is.
 * A store of 0x100 + k selects inject profile k (so one guest run can compare, say, the
 * photonic and the electrical fabric's latencies side by side). A store of 3 empties the storing
 * vCPU's modelled caches (clock=virtual: a cold start).
 *
 * With doorbells the plugin starts dormant: until the guest executes the arm instruction
 * (PFCXL_ARM_INSN, a 7-byte NOP that guest/include/pfcxl_mark.h emits; the guest's init runs
 * `pfcxl_mark arm` just before it reports ready), it instruments nothing but that instruction, so
 * the boot runs at plain TCG speed instead of paying a memory callback on every access. Arming
 * resets the plugin (QEMU flushes every translated block) and registers the full
 * instrumentation, so no code translated before it escapes. Nothing is counted before a phase
 * starts anyway; without doorbells the plugin is armed from the start.
 *
 * Output (qemu_plugin_outs, i.e. QEMU's log with -d plugin): one JSON line at start, one when
 * armed, one per finished phase and one at exit, each with the request counters.
 *
 * Inject mode busy-waits on the TSC inside the vCPU thread, so the guest's own clock (host time
 * under TCG without icount) sees it. clock=virtual moves the virtual clock instead.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include "qemu_plugin_api.h"

PFCXL_EXPORT int qemu_plugin_version = PFCXL_PLUGIN_API_VERSION;

#define CXL_REGION_NAME "cxl-fixed-memory-region"
#define LINE 64ULL
#define MAX_VCPUS 256   /* the record's vcpu field is one byte */
#define MAX_DOORBELLS 32
#define MAX_DIRECT 16

/* ---------------------------------------------------------------- ring (device/trace/records.py) */

#define RING_MAGIC 0x474E524C58434650ULL   /* "PFCXLRNG" little endian */
#define RING_VERSION 1

struct ring_header {
    uint64_t magic;
    uint32_t version, record_size;
    uint64_t capacity, head, tail, dropped;
    uint8_t reserved[16];
};

struct record {
    uint64_t insn, hpa;
    uint32_t size;
    uint8_t write, vcpu;
    uint16_t host;
};

_Static_assert(sizeof(struct ring_header) == 64, "ring header is 64 bytes");
_Static_assert(sizeof(struct record) == 24, "record is 24 bytes");

/* ---------------------------------------------------------------- state */

enum mode { MODE_COUNT, MODE_TRACE, MODE_INJECT };
static const char *const MODE_NAMES[] = {"count", "trace", "inject"};

struct counters {
    uint64_t reads, writes, bytes;
};

/* A spinlock that gives the host CPU away when it does not get the lock quickly: with two host
 * cores, a vCPU spinning hard could starve the drainer thread it is waiting for. */
typedef struct {
    int v;
} spinlock;

static void lock(spinlock *l)
{
    for (unsigned n = 0; __atomic_exchange_n(&l->v, 1, __ATOMIC_ACQUIRE); n++) {
        if (n > 1000)
            sched_yield();
        else
            _mm_pause();
    }
}

static void unlock(spinlock *l)
{
    __atomic_store_n(&l->v, 0, __ATOMIC_RELEASE);
}

/* Everything a vCPU touches on its access path, on its own cache line. The lock is uncontended
 * except when a phase ends and another vCPU flushes this one's pending line. */
struct vcpu {
    spinlock lock;
    int pending;            /* a merged line waits in line/mask/write/insn */
    int write;
    uint64_t line, mask, insn;
    uint64_t cxl_page;      /* 1 + last page number seen to be CXL (owner thread only) */
    struct counters total, at_phase_start;
} __attribute__((aligned(64)));

static struct vcpu vcpus[MAX_VCPUS];
static unsigned n_vcpus;

static enum mode mode = MODE_COUNT;
static int have_doorbell;      /* how many doorbell lines */
static uint64_t doorbell_lines[MAX_DOORBELLS];
static int n_direct;
static uint64_t direct_base[MAX_DIRECT], direct_end[MAX_DIRECT];
static int in_phase;            /* read on every CXL access, written by the marker */
static qemu_plugin_id_t plugin_id;
static int armed, arming;      /* dormant until the arm instruction (see "arming") */
static spinlock phase_lock;     /* serialises phase starts and ends */
static uint64_t phases;

static const char *cxl_name;    /* interned device name, cached once seen */

/* trace */
static struct qemu_plugin_scoreboard *insn_score;
static qemu_plugin_u64 insn_count;      /* per-vCPU instructions, bumped inline */
static struct ring_header *ring;
static struct record *ring_records;
static uint64_t ring_capacity, ring_head, ring_timeout_ns = 30000000000ULL;
static spinlock ring_lock;
static int drainer_gone;
static uint64_t records_written;

/* inject */
#define MAX_PROFILES 8
#define MARK_PROFILE 0x100      /* doorbell value 0x100 + k selects profile k */
static double read_ns[MAX_PROFILES], write_ns[MAX_PROFILES], baseline_ns, tsc_per_ns;
static int n_read_ns, n_write_ns, n_profiles = 1;
static uint64_t read_spin[MAX_PROFILES], write_spin[MAX_PROFILES];   /* TSC ticks per request */
static int profile;             /* selected by the guest through the doorbell */

#define MARK_COLD 3             /* doorbell value: empty the vCPU's modelled caches */
static int virtual_clock;       /* clock=virtual */

#include "pfcxl_vtime.h"
#include "pfcxl_timeline.h"

/* ---------------------------------------------------------------- helpers */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* TSC ticks per nanosecond, against CLOCK_MONOTONIC_RAW over ~50 ms (constant_tsc assumed:
 * the host CPU has it; the spin only needs to be right to a few percent). */
static double calibrate_tsc(void)
{
    uint64_t t0 = now_ns(), c0 = __rdtsc(), t1;
    do
        t1 = now_ns();
    while (t1 - t0 < 50000000ULL);
    return (double)(__rdtsc() - c0) / (double)(t1 - t0);
}

/* No pause instruction in the loop: it can take ~140 cycles on recent cores, which would
 * overshoot every request by tens of ns. */
static void spin(uint64_t ticks)
{
    uint64_t start = __rdtsc();
    while (__rdtsc() - start < ticks)
        ;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[40960];   /* room for 256 vCPUs' counters */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    qemu_plugin_outs(buf);
}

/* ---------------------------------------------------------------- ring producer */

static void ring_push(const struct record *r)
{
    lock(&ring_lock);
    uint64_t waited_since = 0;
    while (ring_head - __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE) >= ring_capacity) {
        if (drainer_gone) {
            __atomic_fetch_add(&ring->dropped, 1, __ATOMIC_RELAXED);
            unlock(&ring_lock);
            return;
        }
        /* Full: wait for the drainer (never overwrite). Other vCPUs queue on the lock. */
        uint64_t t = now_ns();
        if (!waited_since)
            waited_since = t;
        else if (t - waited_since > ring_timeout_ns) {
            drainer_gone = 1;
            say("{\"event\":\"drainer_gone\",\"waited_s\":%.1f}\n", (t - waited_since) / 1e9);
            continue;
        }
        struct timespec pause = {0, 20000};
        nanosleep(&pause, NULL);
    }
    drainer_gone = 0;
    ring_records[ring_head % ring_capacity] = *r;
    ring_head++;
    records_written++;
    /* publish after the record is written: the drainer reads head, then the records */
    __atomic_store_n(&ring->head, ring_head, __ATOMIC_RELEASE);
    unlock(&ring_lock);
}

static int ring_open(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "pfcxl_plugin: cannot open ring %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(struct ring_header)) {
        fprintf(stderr, "pfcxl_plugin: ring %s is smaller than its header\n", path);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fprintf(stderr, "pfcxl_plugin: cannot map ring %s: %s\n", path, strerror(errno));
        return -1;
    }
    ring = map;
    ring_records = (struct record *)(ring + 1);
    ring_capacity = ring->capacity;
    if (ring->magic != RING_MAGIC || ring->version != RING_VERSION ||
        ring->record_size != sizeof(struct record) || ring_capacity == 0 ||
        (uint64_t)st.st_size < sizeof(struct ring_header) + ring_capacity * sizeof(struct record)) {
        fprintf(stderr, "pfcxl_plugin: %s is not a version-%d ring of %zu-byte records of the "
                        "size its header claims\n", path, RING_VERSION, sizeof(struct record));
        return -1;
    }
    ring_head = ring->head;   /* a fresh ring has head == tail == 0 */
    return 0;
}

/* ---------------------------------------------------------------- requests */

/* One finished request: count it, and trace it. Called with v->lock held. */
static void emit(unsigned vcpu_index, struct vcpu *v)
{
    uint32_t size = (uint32_t)__builtin_popcountll(v->mask);
    if (v->write)
        v->total.writes++;
    else
        v->total.reads++;
    v->total.bytes += size;
    v->pending = 0;
    if (mode == MODE_TRACE) {
        struct record r = {.insn = v->insn, .hpa = v->line, .size = size,
                           .write = (uint8_t)v->write, .vcpu = (uint8_t)vcpu_index, .host = 0};
        ring_push(&r);
    }
}

/* clock=virtual: one fabric request of the modelled hierarchy, issued at `issue_ps` on the
 * vCPU's own timeline; inside a phase it is counted and traced (stamp: the issue time in ns). */
static void vt_record(unsigned vcpu_index, uint64_t line, int write, uint64_t issue_ps)
{
    if (!__atomic_load_n(&in_phase, __ATOMIC_ACQUIRE))
        return;
    struct vcpu *v = &vcpus[vcpu_index];
    lock(&v->lock);
    if (write)
        v->total.writes++;
    else
        v->total.reads++;
    v->total.bytes += LINE;
    unlock(&v->lock);
    if (mode == MODE_TRACE) {
        struct record r = {.insn = issue_ps / VT_PS, .hpa = line * LINE, .size = (uint32_t)LINE,
                           .write = (uint8_t)write, .vcpu = (uint8_t)vcpu_index, .host = 0};
        ring_push(&r);
    }
}

static void flush(unsigned vcpu_index)
{
    struct vcpu *v = &vcpus[vcpu_index];
    lock(&v->lock);
    if (v->pending)
        emit(vcpu_index, v);
    unlock(&v->lock);
}

static void counters_json(char *buf, size_t len, int since_phase_start)
{
    struct counters sum = {0, 0, 0};
    size_t off = 0;
    off += (size_t)snprintf(buf + off, len - off, "\"vcpus\":[");
    for (unsigned i = 0; i < n_vcpus && off < len; i++) {
        struct vcpu *v = &vcpus[i];
        lock(&v->lock);
        struct counters c = v->total;
        if (since_phase_start) {
            c.reads -= v->at_phase_start.reads;
            c.writes -= v->at_phase_start.writes;
            c.bytes -= v->at_phase_start.bytes;
        }
        unlock(&v->lock);
        sum.reads += c.reads;
        sum.writes += c.writes;
        sum.bytes += c.bytes;
        off += (size_t)snprintf(buf + off, len - off,
                                "%s{\"vcpu\":%u,\"reads\":%" PRIu64 ",\"writes\":%" PRIu64
                                ",\"bytes\":%" PRIu64 "}", i ? "," : "", i, c.reads, c.writes,
                                c.bytes);
    }
    if (off < len)
        snprintf(buf + off, len - off, "],\"reads\":%" PRIu64 ",\"writes\":%" PRIu64
                 ",\"bytes\":%" PRIu64, sum.reads, sum.writes, sum.bytes);
}

static void phase_start(void)
{
    lock(&phase_lock);
    if (!__atomic_load_n(&in_phase, __ATOMIC_ACQUIRE)) {
        for (unsigned i = 0; i < n_vcpus; i++) {
            lock(&vcpus[i].lock);
            vcpus[i].at_phase_start = vcpus[i].total;
            unlock(&vcpus[i].lock);
        }
        if (virtual_clock)
            vt_phase_start(n_vcpus);
        phases++;
        __atomic_store_n(&in_phase, 1, __ATOMIC_RELEASE);
    }
    unlock(&phase_lock);
}

static void phase_stop(void)
{
    char buf[32768];
    lock(&phase_lock);
    if (__atomic_load_n(&in_phase, __ATOMIC_ACQUIRE)) {
        /* Off first, then flush: a vCPU re-checks the flag under its own lock, so once we have
         * flushed it, it cannot start a new pending line of this phase. */
        __atomic_store_n(&in_phase, 0, __ATOMIC_RELEASE);
        for (unsigned i = 0; i < n_vcpus; i++)
            flush(i);
        counters_json(buf, sizeof buf, 1);
        char vbuf[1024] = "\"vtime\":null";
        if (virtual_clock)
            vt_stats_json(vbuf, sizeof vbuf, n_vcpus, 1);
        say("{\"event\":\"phase\",\"mode\":\"%s\",\"phase\":%" PRIu64 ",%s,%s,\"records\":%" PRIu64
            "}\n", MODE_NAMES[mode], phases, buf, vbuf, records_written);
    }
    unlock(&phase_lock);
}

/* One access to [hpa, hpa + size) that lies inside one line. */
static void access_line(unsigned vcpu_index, uint64_t hpa, unsigned size, int write,
                        uint64_t insn)
{
    struct vcpu *v = &vcpus[vcpu_index];
    uint64_t line = hpa & ~(LINE - 1);
    unsigned first = (unsigned)(hpa - line);
    uint64_t bits = (size >= 64 ? ~0ULL : ((1ULL << size) - 1)) << first;
    int started = 0;

    lock(&v->lock);
    if (!__atomic_load_n(&in_phase, __ATOMIC_ACQUIRE)) {
        unlock(&v->lock);
        return;
    }
    if (v->pending && v->line == line && v->write == write) {
        v->mask |= bits;
    } else {
        if (v->pending)
            emit(vcpu_index, v);
        v->pending = 1;
        v->line = line;
        v->mask = bits;
        v->write = write;
        v->insn = insn;
        started = 1;
    }
    unlock(&v->lock);

    /* the modelled latency is paid once per request, outside every lock */
    if (started && mode == MODE_INJECT) {
        int k = __atomic_load_n(&profile, __ATOMIC_RELAXED);
        uint64_t ticks = write ? write_spin[k] : read_spin[k];
        if (ticks)
            spin(ticks);
    }
}

/* Memory callback of every instruction (after its access). */
static void doorbell(unsigned vcpu_index, qemu_plugin_meminfo_t info)
{
    qemu_plugin_mem_value val = qemu_plugin_mem_get_value(info);
    uint64_t x = val.type == QEMU_PLUGIN_MEM_VALUE_U64   ? val.data.u64
                 : val.type == QEMU_PLUGIN_MEM_VALUE_U32 ? val.data.u32
                 : val.type == QEMU_PLUGIN_MEM_VALUE_U16 ? val.data.u16
                 : val.type == QEMU_PLUGIN_MEM_VALUE_U8  ? val.data.u8
                                                         : val.data.u128.low;
    if (x == 1) {
        phase_start();
        if (tl.f && !tl.on) {   /* the guest's benchmark begins: into the timeline */
            tl_join(&vt_cpus[vcpu_index], qemu_plugin_u64_get(insn_count, vcpu_index));
            /* own clock - offset = timeline time: how a trace's stamps become the timeline's */
            if (tl.on)
                say("{\"event\":\"timeline\",\"host\":%d,\"quantum\":%" PRIu64 ",\"offset_ns\":%.3f}\n", tl.host,
                    tl.epoch, (double)(int64_t)tl.offset_ps / 1e3);
        }
    } else if (x == 2) {
        phase_stop();
        tl_leave();
    }
    else if (x == MARK_COLD && virtual_clock)
        vt_cold(vcpu_index, qemu_plugin_u64_get(insn_count, vcpu_index));
    else if (virtual_clock && x >= MARK_PROFILE && x < MARK_PROFILE + MAX_PROFILES) {
        if (vt_select((int)(x - MARK_PROFILE)))
            say("{\"event\":\"profile\",\"profile\":%d,\"system\":\"%s\"}\n", (int)(x - MARK_PROFILE),
                vt.names[vt.current]);
        else
            say("{\"event\":\"unknown_profile\",\"profile\":%d}\n", (int)(x - MARK_PROFILE));
    } else if (x >= MARK_PROFILE && x < MARK_PROFILE + (uint64_t)n_profiles) {
        __atomic_store_n(&profile, (int)(x - MARK_PROFILE), __ATOMIC_RELAXED);
        say("{\"event\":\"profile\",\"profile\":%d}\n", (int)(x - MARK_PROFILE));
    } else
        say("{\"event\":\"unknown_mark\",\"value\":%" PRIu64 "}\n", x);
}

/* Is this I/O access to the CXL window? The device-name lookup goes through a global string
 * table, so a vCPU remembers the last page it found to be CXL. */
static int is_cxl(unsigned vcpu_index, const struct qemu_plugin_hwaddr *h, uint64_t hpa)
{
    struct vcpu *v = &vcpus[vcpu_index];
    uint64_t page = (hpa >> 12) + 1;
    if (v->cxl_page == page)
        return 1;
    const char *name = qemu_plugin_hwaddr_device_name(h);
    const char *known = __atomic_load_n(&cxl_name, __ATOMIC_RELAXED);
    if (name != known) {
        if (known || !name || strcmp(name, CXL_REGION_NAME) != 0)
            return 0;
        __atomic_store_n(&cxl_name, name, __ATOMIC_RELAXED);
    }
    v->cxl_page = page;
    return 1;
}

static int in_direct(uint64_t hpa)
{
    for (int i = 0; i < n_direct; i++)
        if (hpa >= direct_base[i] && hpa < direct_end[i])
            return 1;
    return 0;
}

static int is_doorbell(uint64_t hpa)
{
    for (int i = 0; i < have_doorbell; i++)
        if ((hpa & ~(LINE - 1)) == doorbell_lines[i])
            return 1;
    return 0;
}

/* clock=virtual: every access goes through the modelled hierarchy; RAM is local DRAM, the CXL
 * window and the direct windows are the fabric, other I/O (devices' registers) is not memory. */
static void on_mem_virtual(unsigned vcpu_index, qemu_plugin_meminfo_t info, uint64_t vaddr,
                           struct qemu_plugin_hwaddr *h, int io, int nt)
{
    uint64_t hpa = qemu_plugin_hwaddr_phys_addr(h);
    int write = qemu_plugin_mem_is_store(info);
    int cls = VT_DRAM;
    if (io || (n_direct && in_direct(hpa))) {
        if (have_doorbell && is_doorbell(hpa)) {
            if (write)
                doorbell(vcpu_index, info);
            return;
        }
        if (io && !is_cxl(vcpu_index, h, hpa))
            return;
        cls = VT_FABRIC;
    }
    unsigned size = 1u << qemu_plugin_mem_size_shift(info);
    uint64_t value = 0;
    int has_value = 0;
    if (!write && size == 8) {
        qemu_plugin_mem_value val = qemu_plugin_mem_get_value(info);
        value = val.data.u64;
        has_value = 1;
    }
    uint64_t insn = qemu_plugin_u64_get(insn_count, vcpu_index) - 1;
    /* an access that straddles lines is one access per line */
    uint64_t last = (hpa + size - 1) / LINE;
    for (uint64_t line = hpa / LINE; line <= last; line++)
        vt_access(vcpu_index, insn, vaddr, line * LINE, write, cls, nt, has_value, value);
}

static void on_mem(unsigned int vcpu_index, qemu_plugin_meminfo_t info, uint64_t vaddr,
                   void *userdata)
{
    struct qemu_plugin_hwaddr *h = qemu_plugin_get_hwaddr(info, vaddr);
    if (!h || vcpu_index >= MAX_VCPUS)
        return;
    int io = qemu_plugin_hwaddr_is_io(h);
    if (virtual_clock) {
        on_mem_virtual(vcpu_index, info, vaddr, h, io, userdata != NULL);
        return;
    }
    if (!io && !n_direct)
        return;   /* RAM: the fast, common case */
    uint64_t hpa = qemu_plugin_hwaddr_phys_addr(h);
    if (!io && !in_direct(hpa))
        return;   /* RAM outside the direct windows */
    int write = qemu_plugin_mem_is_store(info);

    /* doorbells are in the CXL or a direct window by construction: no name check needed */
    if (have_doorbell && is_doorbell(hpa)) {
        if (write)
            doorbell(vcpu_index, info);
        return;
    }
    if (!__atomic_load_n(&in_phase, __ATOMIC_ACQUIRE) || (io && !is_cxl(vcpu_index, h, hpa)))
        return;
    unsigned size = 1u << qemu_plugin_mem_size_shift(info);

    /* the instruction's own inline count ran before it: the ones before it are count - 1 */
    uint64_t insn = mode == MODE_TRACE ? qemu_plugin_u64_get(insn_count, vcpu_index) - 1 : 0;
    /* an access that straddles lines is one piece per line */
    while (size) {
        unsigned room = (unsigned)(LINE - (hpa & (LINE - 1)));
        unsigned piece = size < room ? size : room;
        access_line(vcpu_index, hpa, piece, write, insn);
        hpa += piece;
        size -= piece;
    }
}

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        /* Per instruction, not per block: an access to the CXL window (an I/O region) ends
         * the block early (seen: the rest of the block is re-run as a new block), so a
         * per-block count would include instructions that did not run. */
        if (mode == MODE_TRACE || virtual_clock)
            qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(insn, QEMU_PLUGIN_INLINE_ADD_U64,
                                                                insn_count, 1);
        void *nt = NULL;
        if (virtual_clock) {
            uint8_t bytes[16];
            size_t got = qemu_plugin_insn_data(insn, bytes, sizeof bytes);
            nt = vt_is_nt_store(bytes, got) ? (void *)1 : NULL;
        }
        qemu_plugin_register_vcpu_mem_cb(insn, on_mem, QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_MEM_RW,
                                         nt);
    }
}

static void on_vcpu_init(qemu_plugin_id_t id, unsigned int vcpu_index)
{
    (void)id;
    if (vcpu_index < MAX_VCPUS && vcpu_index + 1 > __atomic_load_n(&n_vcpus, __ATOMIC_RELAXED))
        __atomic_store_n(&n_vcpus, vcpu_index + 1, __ATOMIC_RELEASE);
}

static void on_qemu_exit(qemu_plugin_id_t id, void *userdata)
{
    (void)id;
    (void)userdata;
    char buf[32768];
    tl_leave();
    for (unsigned i = 0; i < n_vcpus; i++)
        flush(i);
    counters_json(buf, sizeof buf, 0);
    char vbuf[1024] = "\"vtime\":null";
    if (virtual_clock)
        vt_stats_json(vbuf, sizeof vbuf, n_vcpus, 0);
    say("{\"event\":\"exit\",\"mode\":\"%s\",\"armed\":%d,\"phases\":%" PRIu64 ",%s,%s,\"records\":%" PRIu64
        ",\"dropped\":%" PRIu64 "}\n", MODE_NAMES[mode], __atomic_load_n(&armed, __ATOMIC_ACQUIRE), phases, buf,
        vbuf, records_written, ring ? ring->dropped : 0);
    if (insn_score)
        qemu_plugin_scoreboard_free(insn_score);
}

/* Everything an armed plugin needs (also after the reset that arms it, which dropped them all). */
static void register_instrumentation(qemu_plugin_id_t id)
{
    qemu_plugin_register_vcpu_init_cb(id, on_vcpu_init);
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_atexit_cb(id, on_qemu_exit, NULL);
}

/* ---------------------------------------------------------------- arming */

/* nopl 0x50464358(%rax): a NOP whose displacement spells "XCFP" (guest/include/pfcxl_mark.h) */
static const uint8_t ARM_INSN[] = {0x0f, 0x1f, 0x80, 0x58, 0x43, 0x46, 0x50};
static void on_armed(qemu_plugin_id_t id)
{
    if (virtual_clock && !vt_charge_fn(0)) {
        /* the patched QEMU without -icount: the guest's clock is the host's, nothing to charge */
        fprintf(stderr, "pfcxl_plugin: clock=virtual needs -icount shift=0,sleep=off (the guest's clock "
                        "is not QEMU's virtual clock without it)\n");
        exit(1);
    }
    register_instrumentation(id);
    __atomic_store_n(&armed, 1, __ATOMIC_RELEASE);
    say("{\"event\":\"armed\"}\n");
}

static void on_arm_insn(unsigned int vcpu_index, void *userdata)
{
    (void)vcpu_index;
    (void)userdata;
    if (!__atomic_exchange_n(&arming, 1, __ATOMIC_ACQ_REL))
        qemu_plugin_reset(plugin_id, on_armed);
}

/* Dormant: only the arm instruction gets a callback. */
static void on_tb_trans_dormant(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint8_t bytes[sizeof ARM_INSN];
        if (qemu_plugin_insn_size(insn) == sizeof ARM_INSN &&
            qemu_plugin_insn_data(insn, bytes, sizeof bytes) == sizeof bytes &&
            !memcmp(bytes, ARM_INSN, sizeof bytes))
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_arm_insn, QEMU_PLUGIN_CB_NO_REGS, NULL);
    }
}

/* ---------------------------------------------------------------- arguments */

static int parse_u64(const char *key, const char *val, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(val, &end, 0);
    if (errno || end == val || *end || *val == '-') {
        fprintf(stderr, "pfcxl_plugin: %s=%s is not a number\n", key, val);
        return -1;
    }
    *out = x;
    return 0;
}

/* One number of ns, or with `list`, up to MAX_PROFILES of them separated by ':'. */
static int parse_ns(const char *key, const char *val, double *out, int *count, int list)
{
    const char *p = val;
    int n = 0;
    for (;;) {
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (errno || end == p || !(x >= 0) || n == (list ? MAX_PROFILES : 1) ||
            (*end && *end != ':')) {
            fprintf(stderr, "pfcxl_plugin: %s=%s is not %s\n", key, val,
                    list ? "up to 8 non-negative ns values separated by ':'"
                         : "a non-negative number of ns");
            return -1;
        }
        out[n++] = x;
        if (!*end)
            break;
        p = end + 1;
    }
    if (count)
        *count = n;
    return 0;
}

static uint64_t spin_ticks(double modelled)
{
    double extra = modelled - baseline_ns;
    return extra > 0 ? (uint64_t)(extra * tsc_per_ns + 0.5) : 0;
}

PFCXL_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                     char **argv)
{
    const char *ring_path = NULL, *vtime_path = NULL, *timeline_path = NULL;
    uint64_t timeout_s = 30, timeline_host = 0;
    int have_mode = 0;

    if (!info->system_emulation) {
        fprintf(stderr, "pfcxl_plugin: needs system emulation (physical addresses)\n");
        return -1;
    }
    if (info->system.max_vcpus > MAX_VCPUS) {
        fprintf(stderr, "pfcxl_plugin: at most %d vCPUs\n", MAX_VCPUS);
        return -1;
    }
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "pfcxl_plugin: argument '%s' is not key=value\n", argv[i]);
            return -1;
        }
        *eq = 0;   /* argv stays ours for the plugin's lifetime */
        const char *key = argv[i], *val = eq + 1;
        int bad = 0;
        if (!strcmp(key, "mode")) {
            int m;
            for (m = 0; m < 3 && strcmp(val, MODE_NAMES[m]); m++)
                ;
            if (m == 3) {
                fprintf(stderr, "pfcxl_plugin: mode=%s: use count, trace or inject\n", val);
                return -1;
            }
            mode = (enum mode)m;
            have_mode = 1;
        } else if (!strcmp(key, "ring"))
            ring_path = val;
        else if (!strcmp(key, "doorbell")) {
            if (have_doorbell == MAX_DOORBELLS) {
                fprintf(stderr, "pfcxl_plugin: more than %d doorbells\n", MAX_DOORBELLS);
                return -1;
            }
            bad = parse_u64(key, val, &doorbell_lines[have_doorbell]);
            if (!bad && doorbell_lines[have_doorbell] % LINE) {
                fprintf(stderr, "pfcxl_plugin: doorbell=%s is not 64-byte aligned\n", val);
                bad = 1;
            }
            have_doorbell++;
        } else if (!strcmp(key, "direct")) {
            char *colon = strchr(val, ':');
            uint64_t size = 0;
            if (n_direct == MAX_DIRECT || !colon) {
                fprintf(stderr, "pfcxl_plugin: direct=%s: give BASE:SIZE, at most %d times\n", val,
                        MAX_DIRECT);
                return -1;
            }
            *colon = 0;
            bad = parse_u64(key, val, &direct_base[n_direct]) || parse_u64(key, colon + 1, &size);
            if (!bad && (!size || direct_base[n_direct] + size < direct_base[n_direct])) {
                fprintf(stderr, "pfcxl_plugin: direct=%s:%s is an empty or wrapping range\n", val,
                        colon + 1);
                bad = 1;
            }
            direct_end[n_direct] = direct_base[n_direct] + size;
            n_direct++;
        } else if (!strcmp(key, "read_ns"))
            bad = parse_ns(key, val, read_ns, &n_read_ns, 1);
        else if (!strcmp(key, "write_ns"))
            bad = parse_ns(key, val, write_ns, &n_write_ns, 1);
        else if (!strcmp(key, "baseline_ns"))
            bad = parse_ns(key, val, &baseline_ns, NULL, 0);
        else if (!strcmp(key, "ring_timeout_s"))
            bad = parse_u64(key, val, &timeout_s);
        else if (!strcmp(key, "clock")) {
            if (strcmp(val, "virtual") && strcmp(val, "emulator")) {
                fprintf(stderr, "pfcxl_plugin: clock=%s: use virtual or emulator\n", val);
                return -1;
            }
            virtual_clock = !strcmp(val, "virtual");
        } else if (!strcmp(key, "vtime"))
            vtime_path = val;
        else if (!strcmp(key, "timeline"))
            timeline_path = val;
        else if (!strcmp(key, "timeline_host"))
            bad = parse_u64(key, val, &timeline_host);
        else {
            fprintf(stderr, "pfcxl_plugin: unknown argument '%s' (mode, ring, doorbell, direct, read_ns, write_ns, "
                            "baseline_ns, ring_timeout_s, clock, vtime, timeline, timeline_host)\n", key);
            return -1;
        }
        if (bad)
            return -1;
    }
    if (!have_mode) {
        fprintf(stderr, "pfcxl_plugin: mode=count|trace|inject is required\n");
        return -1;
    }
    if (virtual_clock) {
        if (mode == MODE_INJECT) {
            fprintf(stderr, "pfcxl_plugin: clock=virtual charges the virtual clock; mode=inject spins on "
                            "host time: use one\n");
            return -1;
        }
        if (info->system.max_vcpus > 1) {
            fprintf(stderr, "pfcxl_plugin: clock=virtual is exact for one vCPU only (all vCPUs share one "
                            "virtual clock); this machine has %d\n", info->system.max_vcpus);
            return -1;
        }
        if (!vtime_path) {
            fprintf(stderr, "pfcxl_plugin: clock=virtual needs vtime=PATH (the model file)\n");
            return -1;
        }
        if (vt_load(vtime_path) < 0 || vt_setup((unsigned)info->system.max_vcpus) < 0)
            return -1;
        if (timeline_path && tl_open(timeline_path, timeline_host > TL_HOSTS ? TL_HOSTS : (int)timeline_host) < 0)
            return -1;
    } else if (vtime_path || timeline_path) {
        fprintf(stderr, "pfcxl_plugin: %s goes with clock=virtual\n", vtime_path ? "vtime=" : "timeline=");
        return -1;
    }
    if (mode == MODE_TRACE || virtual_clock) {
        insn_score = qemu_plugin_scoreboard_new(sizeof(uint64_t));
        insn_count = (qemu_plugin_u64){insn_score, 0};
    }
    if (mode == MODE_TRACE) {
        if (!ring_path) {
            fprintf(stderr, "pfcxl_plugin: mode=trace needs ring=PATH\n");
            return -1;
        }
        if (ring_open(ring_path) < 0)
            return -1;
        ring_timeout_ns = timeout_s * 1000000000ULL;
    }
    if (mode == MODE_INJECT) {
        /* profiles: as many as the longer list; a one-value list applies to all of them */
        n_profiles = n_read_ns > n_write_ns ? n_read_ns : n_write_ns;
        if (n_profiles < 1)
            n_profiles = 1;
        if ((n_read_ns > 1 && n_read_ns != n_profiles) || (n_write_ns > 1 && n_write_ns != n_profiles)) {
            fprintf(stderr, "pfcxl_plugin: read_ns and write_ns list different numbers of profiles\n");
            return -1;
        }
        tsc_per_ns = calibrate_tsc();
        for (int k = 0; k < n_profiles; k++) {
            read_spin[k] = spin_ticks(read_ns[n_read_ns > 1 ? k : 0]);
            write_spin[k] = spin_ticks(write_ns[n_write_ns > 1 ? k : 0]);
        }
    }
    in_phase = !have_doorbell;
    n_vcpus = (unsigned)(info->system.smp_vcpus > 0 ? info->system.smp_vcpus : 1);

    plugin_id = id;
    armed = !have_doorbell;
    if (armed) {
        register_instrumentation(id);
    } else {
        qemu_plugin_register_vcpu_init_cb(id, on_vcpu_init);
        qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans_dormant);
        qemu_plugin_register_atexit_cb(id, on_qemu_exit, NULL);
    }
    char prof[512];
    size_t off = 0;
    for (int k = 0; k < n_profiles && off < sizeof prof; k++)
        off += (size_t)snprintf(prof + off, sizeof prof - off,
                                "%s{\"read_ns\":%.1f,\"write_ns\":%.1f,\"read_spin_ns\":%.1f,"
                                "\"write_spin_ns\":%.1f}", k ? "," : "",
                                read_ns[n_read_ns > 1 ? k : 0], write_ns[n_write_ns > 1 ? k : 0],
                                tsc_per_ns > 0 ? read_spin[k] / tsc_per_ns : 0.0,
                                tsc_per_ns > 0 ? write_spin[k] / tsc_per_ns : 0.0);
    say("{\"event\":\"start\",\"mode\":\"%s\",\"clock\":\"%s\",\"armed\":%d,\"api\":[%d,%d],\"doorbell\":\"0x%" PRIx64 "\","
        "\"baseline_ns\":%.1f,\"tsc_per_ns\":%.4f,\"profiles\":[%s],\"capacity\":%" PRIu64
        "}\n", MODE_NAMES[mode], virtual_clock ? "virtual" : "emulator", armed, info->version.min, info->version.cur,
        have_doorbell ? doorbell_lines[0] : 0, baseline_ns, tsc_per_ns, prof, ring_capacity);
    return 0;
}
