/*
 * pfcxl virtual time (plugin argument clock=virtual): a per-vCPU memory hierarchy whose misses
 * are timed by the fabric model, and whose stalls are charged to the guest's virtual clock.
 *
 * Included once, by pfcxl_plugin.c. Needs QEMU with pfcxl's patch
 * (host_tools/provision/qemu-10.0-virtual-time.patch): under -icount shift=0,sleep=off the
 * guest's clock is QEMU's virtual clock, one instruction per ns, and the patch's
 * qemu_plugin_charge_virtual_ns() adds a stall to it at once. The call is looked up at run time
 * (dlsym), so the plugin still loads on a stock QEMU and says why virtual time is not there.
 *
 * Every figure comes from a model file the host writes (vtime=PATH; host_tools/timing/vtime.py
 * renders it from device/fabric/model.py and device/fabric/constants.py): one model and one set
 * of constants for the charge and for the offline engine. Times are integer picoseconds.
 *
 * The model, per vCPU (exact for one vCPU: all vCPUs share one virtual clock):
 *   - the vCPU's own timeline: now = instructions since arming x 1 ns + every stall charged;
 *   - L1 and L2: set-associative, LRU, 64-byte lines, L1 inclusive in L2 (an L2 eviction
 *     removes the line from L1). An L1 hit costs nothing beyond its instruction; an L2 hit's
 *     data arrives the L2 hit latency later. Stores write-allocate (a store miss fetches its
 *     line like a load) and write back when a dirty line leaves L2: the write-back takes its
 *     bandwidth on the fabric's write path but never stalls the vCPU;
 *   - misses go to memory: local DRAM (guest RAM) or the fabric (the CXL window, the direct
 *     windows); up to `mlp` of them are outstanding at once (miss status holding registers);
 *   - nothing stalls the vCPU by itself (an out-of-order core goes on past a load whose data is
 *     still coming). What waits: a load whose address lies in the 4 KiB after a value that a
 *     load still in flight returns (pointer chasing: it waits for that data), a miss finding
 *     every register busy (it waits for the earliest), and the instruction `rob` instructions
 *     after the oldest outstanding demand miss (the reorder buffer is full). Register
 *     dependences other than addresses are not seen: the reorder buffer bounds them;
 *   - a stream prefetcher: after two demand accesses to consecutive lines it keeps `distance`
 *     lines ahead of the stream, into L2, as long as registers are free (it never stalls);
 *   - a miss crosses the fabric model's FIFO stages (host link, optical port or switch links,
 *     the module's memory with its HBM3E cache when the model has one), so bandwidth limits and
 *     queueing apply; fixed latencies are the model's remainders, so an idle 64-byte read
 *     takes exactly the model's idle latency;
 *   - a non-temporal store (movnti, movntdq, movntps/pd and their VEX forms) bypasses the
 *     caches and waits for its write to complete, as a store followed by sfence does;
 *   - the guest can drop its vCPU's cached lines through the doorbell (PFCXL_MARK_COLD): TCG
 *     gives plugins no access for clflush, so its effect cannot be seen;
 *   - the model file may describe several fabrics (a `system NAME` line starts each); the one
 *     its `start K` line names (default the first) is in force from the start, and the doorbell's
 *     PFCXL_MARK_PROFILE(k) switches to the k-th, so one guest can compare them (chase --profile K).
 * Left out: instruction fetches, page walks and TLBs, a pipeline (1 ns per instruction),
 * bank and row-buffer state, coherence between vCPUs, prefetch across streams beyond 16.
 */
#ifndef PFCXL_VTIME_H
#define PFCXL_VTIME_H

#include <dlfcn.h>
#include <sys/mman.h>

#define VT_MAX_STAGES 4
#define VT_MAX_QUEUES 64        /* per stage: one per module (single host) */
#define VT_MAX_MSHR 64
#define VT_STREAMS 16
#define VT_POINTER_REACH 4096   /* a load this close after a pointer an outstanding miss returned */
#define VT_PS 1000ULL

enum vt_class { VT_DRAM, VT_FABRIC };
#define VT_MAX_FABRICS 8

/* device/fabric/model.py's Stage.key: what one queue of the stage serves */
enum vt_key { VT_KEY_HOST, VT_KEY_PATH, VT_KEY_MODULE, VT_KEY_GROUP };

struct vt_stage {
    uint64_t svc_ps;            /* service time of one 64-byte line */
    int key;                    /* enum vt_key */
    int per_module;             /* one queue per module on this host (path, module keys), else one */
    uint64_t free_ps[VT_MAX_QUEUES];
};

/* One memory: the fabric or local DRAM, as device/fabric/model.py's FabricModel. */
struct vt_memory {
    int present;
    uint64_t req_r, mem_r, resp_r, mem_hit;     /* fixed remainders of a read (ps) */
    uint64_t req_w, mem_w, resp_w;              /* and of a write */
    int n_write, n_read;
    struct vt_stage write[VT_MAX_STAGES], read[VT_MAX_STAGES], mem;
    uint64_t hit_svc_ps;                         /* the module cache's service time per line */
    uint64_t base, granularity, modules;         /* interleave: module = ((hpa - base) / g) % m */
    uint64_t cache_lines;                        /* module cache lines per module; 0: none */
    uint64_t hosts_per_group;                    /* hosts behind one switch (key group) */
    uint64_t *cache_tags;                        /* line + 1 per entry (0: empty) */
};

struct vt_line {
    uint64_t tag;               /* line number + 1; 0: invalid */
    uint64_t ready_ps;          /* when its fill completes */
    uint64_t used;              /* LRU stamp */
    uint8_t dirty, prefetched, cls;
};

struct vt_cache {
    unsigned sets, ways;
    uint64_t hit_ps;
    struct vt_line *lines;
};

struct vt_mshr {
    uint64_t ready_ps, issue_insn;
    uint64_t line;              /* the line it fills */
    int demand;
};

/* A load whose data is still coming: what a later load's address may depend on. */
#define VT_PENDING 64
struct vt_pending {
    uint64_t ready_ps, value;
};

struct vt_stream {
    uint64_t last, next;
    int run;
    uint64_t used;
};

struct vt_stats {
    uint64_t l1_hits, l2_hits, misses, prefetches, writebacks, nt_writes, stalls;
    uint64_t fabric_reads, fabric_writes, fabric_latency_ps, dram_reads, dram_writes;
    uint64_t charged_ps;
    uint64_t contention_ps;     /* of charged_ps: the timeline's queueing behind other hosts */
};

struct vt_cpu {
    struct vt_cache l1, l2;
    struct vt_mshr mshr[VT_MAX_MSHR];
    struct vt_pending pending[VT_PENDING];
    unsigned next_pending;
    struct vt_stream streams[VT_STREAMS];
    uint64_t charged_ps, applied_ns, tick;
    uint64_t idle_ps;           /* virtual time it spent halted (vt_follow_clock) */
    uint64_t bias_seen_ns;      /* the virtual clock's lead over the instructions, last read */
    int bias_known;
    struct vt_stats stats, at_phase;
};

static struct {
    int on;
    unsigned mlp, rob, distance;
    unsigned l1_sets, l1_ways, l2_sets, l2_ways;
    uint64_t l1_hit_ps, l2_hit_ps;
    struct vt_memory dram, fabrics[VT_MAX_FABRICS];
    char names[VT_MAX_FABRICS][32];
    int n_fabrics, current;
    uint64_t digest;            /* of the model file: every host of one timeline has the same */
} vt;

/* The memory a class of access goes to: local DRAM, or the fabric in force. */
static struct vt_memory *vt_mem(int cls)
{
    return cls == VT_FABRIC ? &vt.fabrics[vt.current] : &vt.dram;
}

/* The memory a model file line names: dram, or the fabric its last `system` line began. */
static struct vt_memory *vt_named(const char *name)
{
    if (!strcmp(name, "dram"))
        return &vt.dram;
    if (!strcmp(name, "fabric") && vt.n_fabrics)
        return &vt.fabrics[vt.n_fabrics - 1];
    return NULL;
}

static struct vt_cpu *vt_cpus;
static bool (*vt_charge_fn)(uint64_t ns);
static uint64_t (*vt_bias_fn)(void);

/* ---------------------------------------------------------------- the model file */

static int vt_stage_parse(struct vt_stage *st, const char *key, uint64_t svc)
{
    static const char *const KEYS[] = {"host", "path", "module", "group"};
    st->svc_ps = svc;
    for (int k = 0; k < 4; k++)
        if (!strcmp(key, KEYS[k])) {
            st->key = k;
            st->per_module = k == VT_KEY_PATH || k == VT_KEY_MODULE;
            return 0;
        }
    return -1;
}

/* Lines of `key values...`; '#' starts a comment. Every key the model needs must be there. */
static int vt_load(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        fprintf(stderr, "pfcxl_plugin: cannot open the virtual-time model %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[512], a[32], b[32], c[32];
    int lineno = 0, bad = 0, have = 0, start = 0;
    vt.digest = 1469598103934665603ULL;        /* FNV-1a over the file's bytes */
    while (!bad && fgets(line, sizeof line, f)) {
        lineno++;
        for (const char *p = line; *p; p++)
            vt.digest = (vt.digest ^ (uint8_t)*p) * 1099511628211ULL;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        unsigned long long x[8] = {0};
        int n;
        if (sscanf(line, " %31s", a) != 1)
            continue;
        if (!strcmp(a, "version")) {
            bad = sscanf(line, " %*s %llu", &x[0]) != 1 || x[0] != 1;
        } else if (!strcmp(a, "system")) {
            bad = vt.n_fabrics == VT_MAX_FABRICS || sscanf(line, " %*s %31s", vt.names[vt.n_fabrics]) != 1;
            vt.n_fabrics += !bad;
        } else if (!strcmp(a, "l1") || !strcmp(a, "l2")) {
            bad = sscanf(line, " %*s %llu %llu %llu", &x[0], &x[1], &x[2]) != 3 || !x[0] || !x[1] ||
                  x[0] & (x[0] - 1) || x[1] > 64;
            if (a[1] == '1') {
                vt.l1_sets = (unsigned)x[0], vt.l1_ways = (unsigned)x[1], vt.l1_hit_ps = x[2];
                have |= 1;
            } else {
                vt.l2_sets = (unsigned)x[0], vt.l2_ways = (unsigned)x[1], vt.l2_hit_ps = x[2];
                have |= 2;
            }
        } else if (!strcmp(a, "start")) {
            bad = sscanf(line, " %*s %llu", &x[0]) != 1 || x[0] >= VT_MAX_FABRICS;
            start = (int)x[0];
        } else if (!strcmp(a, "cpu")) {
            bad = sscanf(line, " %*s %llu %llu %llu", &x[0], &x[1], &x[2]) != 3 || !x[0] ||
                  x[0] > VT_MAX_MSHR || !x[1];
            vt.mlp = (unsigned)x[0], vt.rob = (unsigned)x[1], vt.distance = (unsigned)x[2];
            have |= 4;
        } else if (!strcmp(a, "memory")) {
            /* memory CLASS req_r mem_r resp_r mem_hit req_w mem_w resp_w */
            n = sscanf(line, " %*s %31s %llu %llu %llu %llu %llu %llu %llu", b, &x[0], &x[1], &x[2],
                       &x[3], &x[4], &x[5], &x[6]);
            struct vt_memory *m = n == 8 ? vt_named(b) : NULL;
            bad = !m;
            if (!bad) {
                m->present = 1;
                m->req_r = x[0], m->mem_r = x[1], m->resp_r = x[2], m->mem_hit = x[3];
                m->req_w = x[4], m->mem_w = x[5], m->resp_w = x[6];
                m->modules = 1, m->granularity = 4096, m->hosts_per_group = 1;
            }
        } else if (!strcmp(a, "stage")) {
            /* stage CLASS write|memory|read KEY SVC_PS */
            n = sscanf(line, " %*s %31s %31s %31s %llu", b, c, a, &x[0]);
            struct vt_memory *m = n == 4 ? vt_named(b) : NULL;
            bad = !m;
            if (!bad) {
                struct vt_stage *st = NULL;
                if (!strcmp(c, "memory"))
                    st = &m->mem;
                else if (!strcmp(c, "write") && m->n_write < VT_MAX_STAGES)
                    st = &m->write[m->n_write++];
                else if (!strcmp(c, "read") && m->n_read < VT_MAX_STAGES)
                    st = &m->read[m->n_read++];
                bad = !st || vt_stage_parse(st, a, x[0]);
            }
        } else if (!strcmp(a, "interleave")) {
            /* interleave CLASS base granularity modules */
            n = sscanf(line, " %*s %31s %llu %llu %llu", b, &x[0], &x[1], &x[2]);
            struct vt_memory *m = n == 4 ? vt_named(b) : NULL;
            bad = !m || !x[1] || !x[2] || x[2] > VT_MAX_QUEUES;
            if (!bad)
                m->base = x[0], m->granularity = x[1], m->modules = x[2];
        } else if (!strcmp(a, "hosts_per_group")) {
            /* hosts_per_group CLASS N: hosts behind one switch */
            n = sscanf(line, " %*s %31s %llu", b, &x[0]);
            struct vt_memory *m = n == 2 ? vt_named(b) : NULL;
            bad = !m || !x[0];
            if (!bad)
                m->hosts_per_group = x[0];
        } else if (!strcmp(a, "module_cache")) {
            /* module_cache CLASS lines_per_module hit_svc_ps */
            n = sscanf(line, " %*s %31s %llu %llu", b, &x[0], &x[1]);
            struct vt_memory *m = n == 3 && strcmp(b, "dram") ? vt_named(b) : NULL;
            bad = !m;
            if (!bad)
                m->cache_lines = x[0], m->hit_svc_ps = x[1];
        } else {
            bad = 1;
        }
    }
    fclose(f);
    if (bad) {
        fprintf(stderr, "pfcxl_plugin: %s line %d: not a valid virtual-time model line\n", path, lineno);
        return -1;
    }
    int fabrics_ok = vt.n_fabrics > 0;
    for (int k = 0; k < vt.n_fabrics; k++)
        fabrics_ok &= vt.fabrics[k].present;
    if (have != 7 || !fabrics_ok || !vt.dram.present || start >= vt.n_fabrics) {
        fprintf(stderr, "pfcxl_plugin: %s lacks l1, l2, cpu, a system with its fabric memory line, dram's, or "
                        "the system its start line names\n", path);
        return -1;
    }
    vt.current = start;
    for (int k = 0; k < vt.n_fabrics; k++) {
        struct vt_memory *m = &vt.fabrics[k];
        if (!m->cache_lines)
            continue;
        size_t bytes = (size_t)(m->cache_lines * m->modules * sizeof(uint64_t));
        /* untouched pages of a large tag array stay unallocated */
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            fprintf(stderr, "pfcxl_plugin: no memory for %zu bytes of module cache tags\n", bytes);
            return -1;
        }
        m->cache_tags = p;
    }
    return 0;
}

static int vt_setup(unsigned max_vcpus)
{
    vt_charge_fn = (bool (*)(uint64_t))dlsym(RTLD_DEFAULT, "qemu_plugin_charge_virtual_ns");
    vt_bias_fn = (uint64_t (*)(void))dlsym(RTLD_DEFAULT, "qemu_plugin_virtual_bias_ns");
    if (!vt_charge_fn || !vt_bias_fn) {
        fprintf(stderr, "pfcxl_plugin: clock=virtual needs a QEMU built with pfcxl's virtual-time patch "
                        "(%s is not in this QEMU; `make setup-timed` builds one)\n",
                vt_charge_fn ? "qemu_plugin_virtual_bias_ns" : "qemu_plugin_charge_virtual_ns");
        return -1;
    }
    vt_cpus = calloc(max_vcpus, sizeof *vt_cpus);
    if (!vt_cpus)
        return -1;
    for (unsigned i = 0; i < max_vcpus; i++) {
        struct vt_cpu *c = &vt_cpus[i];
        c->l1 = (struct vt_cache){vt.l1_sets, vt.l1_ways, vt.l1_hit_ps,
                                  calloc((size_t)vt.l1_sets * vt.l1_ways, sizeof(struct vt_line))};
        c->l2 = (struct vt_cache){vt.l2_sets, vt.l2_ways, vt.l2_hit_ps,
                                  calloc((size_t)vt.l2_sets * vt.l2_ways, sizeof(struct vt_line))};
        if (!c->l1.lines || !c->l2.lines)
            return -1;
    }
    vt.on = 1;
    return 0;
}

/* ---------------------------------------------------------------- the memories */

static uint64_t vt_serve(struct vt_stage *st, unsigned q, uint64_t t, uint64_t svc)
{
    uint64_t *free_ps = &st->free_ps[st->per_module ? q : 0];
    uint64_t start = t > *free_ps ? t : *free_ps;
    *free_ps = start + svc;
    return start + svc;
}

static unsigned vt_module(const struct vt_memory *m, uint64_t hpa, uint64_t *module_line)
{
    uint64_t o = hpa >= m->base ? hpa - m->base : hpa;
    uint64_t g = m->granularity, w = m->modules;
    *module_line = (o / (g * w) * g + o % g) / LINE;
    return (unsigned)((o / g) % w);
}

/* The module cache (the appliance's HBM3E): direct-mapped per module, every access installs its
 * line, reads that find it hit (device/fabric/engine.py's rule). */
static int vt_module_cache(struct vt_memory *m, unsigned module, uint64_t module_line, uint64_t line, int write)
{
    if (!m->cache_tags)
        return 0;
    uint64_t *tag = &m->cache_tags[module * m->cache_lines + module_line % m->cache_lines];
    int hit = !write && *tag == line + 1;
    *tag = line + 1;
    return hit;
}

/* A fabric request and its latency on this host's own queues, for the timeline (pfcxl_timeline.h);
 * `stalls`: its latency can hold the vCPU up (every read; a write-back never does). */
static void tl_note(int write, unsigned module, int hit, uint64_t issue_ps, uint64_t done_ps, int stalls);

/* When a read of `line` issued at `t` completes (ps). */
static uint64_t vt_read(int cls, uint64_t line, uint64_t t)
{
    struct vt_memory *m = vt_mem(cls);
    uint64_t mline, issue = t;
    unsigned q = vt_module(m, line * LINE, &mline);
    int hit = vt_module_cache(m, q, mline, line, 0);
    t += m->req_r;
    t = vt_serve(&m->mem, q, t, hit ? m->hit_svc_ps : m->mem.svc_ps);
    t += hit ? m->mem_hit : m->mem_r;
    for (int i = 0; i < m->n_read; i++)
        t = vt_serve(&m->read[i], q, t, m->read[i].svc_ps);
    t += m->resp_r;
    if (cls == VT_FABRIC)
        tl_note(0, q, hit, issue, t, 1);
    return t;
}

/* When a write of `line` issued at `t` completes; `stalls` as tl_note's. */
static uint64_t vt_write(int cls, uint64_t line, uint64_t t, int stalls)
{
    struct vt_memory *m = vt_mem(cls);
    uint64_t mline, issue = t;
    unsigned q = vt_module(m, line * LINE, &mline);
    vt_module_cache(m, q, mline, line, 1);
    for (int i = 0; i < m->n_write; i++)
        t = vt_serve(&m->write[i], q, t, m->write[i].svc_ps);
    t += m->req_w;
    t = vt_serve(&m->mem, q, t, m->mem.svc_ps);
    t += m->mem_w + m->resp_w;
    if (cls == VT_FABRIC)
        tl_note(1, q, 0, issue, t, stalls);
    return t;
}

/* ---------------------------------------------------------------- the vCPU */

static void tl_barrier(struct vt_cpu *c, uint64_t insn);

static void vt_record(unsigned vcpu_index, uint64_t line, int write, uint64_t issue_ps);

/* The vCPU's own clock: its instructions (1 ns each), what it was charged, and the time it was
 * halted, as QEMU's virtual clock counts them. */
static uint64_t vt_now(const struct vt_cpu *c, uint64_t insn)
{
    return insn * VT_PS + c->charged_ps + c->idle_ps;
}

/* Time the vCPU spent halted (its guest slept): icount's sleep=off jumps a halted vCPU's virtual
 * clock to its next timer by adding to the clock's lead over the instructions (the bias). What
 * the bias gained beyond this plugin's own charges (vt_apply) is that idle time. Read at each
 * access, as QEMU's round-robin icount loop calls no plugin idle callback. (With one vCPU a
 * guest: another's charges would count here too.) */
static void vt_follow_clock(struct vt_cpu *c)
{
    uint64_t bias = vt_bias_fn();
    if (c->bias_known && bias > c->bias_seen_ns)
        c->idle_ps += (bias - c->bias_seen_ns) * VT_PS;
    c->bias_seen_ns = bias;
    c->bias_known = 1;
}

/* Stall the vCPU until `until` (its own timeline) and charge the virtual clock. */
static void vt_stall(struct vt_cpu *c, uint64_t *now, uint64_t until)
{
    if (until <= *now)
        return;
    c->charged_ps += until - *now;
    c->stats.charged_ps += until - *now;
    c->stats.stalls++;
    *now = until;
}

/* Give the clock what has been charged so far, in whole ns. */
static void vt_apply(struct vt_cpu *c)
{
    uint64_t ns = c->charged_ps / VT_PS;
    if (ns > c->applied_ns) {
        vt_charge_fn(ns - c->applied_ns);
        c->bias_seen_ns += ns - c->applied_ns;      /* the bias gains our own charge: not idle time */
        c->applied_ns = ns;
    }
}

static struct vt_line *vt_find(struct vt_cache *k, uint64_t line)
{
    struct vt_line *set = &k->lines[(line % k->sets) * k->ways];
    for (unsigned w = 0; w < k->ways; w++)
        if (set[w].tag == line + 1)
            return &set[w];
    return NULL;
}

/* The way `line` goes into: an empty one, else the least recently used (returned for eviction). */
static struct vt_line *vt_victim(struct vt_cache *k, uint64_t line)
{
    struct vt_line *set = &k->lines[(line % k->sets) * k->ways], *v = &set[0];
    for (unsigned w = 0; w < k->ways; w++) {
        if (!set[w].tag)
            return &set[w];
        if (set[w].used < v->used)
            v = &set[w];
    }
    return v;
}

static void vt_l1_fill(struct vt_cpu *c, uint64_t line, uint64_t ready)
{
    struct vt_line *v = vt_victim(&c->l1, line);
    *v = (struct vt_line){.tag = line + 1, .ready_ps = ready, .used = ++c->tick};
}

/* A dirty line leaving L2: its write takes the fabric's (or DRAM's) write path, never the vCPU's time. */
static void vt_writeback(struct vt_cpu *c, unsigned vcpu_index, const struct vt_line *l, uint64_t now)
{
    uint64_t line = l->tag - 1;
    vt_write(l->cls, line, now, 0);
    c->stats.writebacks++;
    if (l->cls == VT_FABRIC) {
        c->stats.fabric_writes++;
        vt_record(vcpu_index, line, 1, now);
    } else
        c->stats.dram_writes++;
}

/* Put `line` into L2 (and L1 unless prefetched); a dirty victim is written back. */
static struct vt_line *vt_l2_fill(struct vt_cpu *c, unsigned vcpu_index, uint64_t line, int cls, uint64_t ready,
                                  uint64_t now, int prefetch)
{
    struct vt_line *v = vt_victim(&c->l2, line);
    if (v->tag) {
        uint64_t old = v->tag - 1;
        struct vt_line *in_l1 = vt_find(&c->l1, old);
        if (in_l1)
            in_l1->tag = 0;     /* inclusive */
        if (v->dirty)
            vt_writeback(c, vcpu_index, v, now);
    }
    *v = (struct vt_line){.tag = line + 1, .ready_ps = ready, .used = ++c->tick, .cls = (uint8_t)cls,
                          .prefetched = (uint8_t)prefetch};
    if (!prefetch)
        vt_l1_fill(c, line, ready);
    return v;
}

static struct vt_mshr *vt_free_mshr(struct vt_cpu *c, uint64_t now)
{
    for (unsigned i = 0; i < vt.mlp; i++)
        if (c->mshr[i].ready_ps <= now)
            return &c->mshr[i];
    return NULL;
}

/* A miss of `line` at `*now`: waits for a register if all are busy; when it completes. */
static uint64_t vt_miss(struct vt_cpu *c, unsigned vcpu_index, uint64_t line, int cls, uint64_t *now,
                        uint64_t insn)
{
    struct vt_mshr *r = vt_free_mshr(c, *now);
    if (!r) {
        uint64_t first = UINT64_MAX;
        for (unsigned i = 0; i < vt.mlp; i++)
            if (c->mshr[i].ready_ps < first)
                first = c->mshr[i].ready_ps, r = &c->mshr[i];
        vt_stall(c, now, first);
    }
    uint64_t ready = vt_read(cls, line, *now);
    if (cls == VT_FABRIC) {
        c->stats.fabric_reads++;
        c->stats.fabric_latency_ps += ready - *now;
        vt_record(vcpu_index, line, 0, *now);
    } else
        c->stats.dram_reads++;
    *r = (struct vt_mshr){.ready_ps = ready, .issue_insn = insn, .line = line, .demand = 1};
    return ready;
}

/* The stream prefetcher, told of a demand access to `line` that missed L1. */
static void vt_prefetch(struct vt_cpu *c, unsigned vcpu_index, uint64_t line, int cls, uint64_t now)
{
    if (!vt.distance)
        return;
    struct vt_stream *s = NULL, *lru = &c->streams[0];
    for (int i = 0; i < VT_STREAMS; i++) {
        if (c->streams[i].run && c->streams[i].last + 1 == line) {
            s = &c->streams[i];
            break;
        }
        if (c->streams[i].used < lru->used)
            lru = &c->streams[i];
    }
    if (!s) {
        *lru = (struct vt_stream){.last = line, .next = line + 1, .run = 1, .used = ++c->tick};
        return;
    }
    s->last = line;
    s->run++;
    s->used = ++c->tick;
    if (s->next <= line)
        s->next = line + 1;
    if (s->run < 2)
        return;
    for (; s->next <= line + vt.distance; s->next++) {
        if (vt_find(&c->l2, s->next))
            continue;
        struct vt_mshr *r = vt_free_mshr(c, now);
        if (!r)
            break;      /* a prefetch never waits */
        uint64_t ready = vt_read(cls, s->next, now);
        if (cls == VT_FABRIC) {
            c->stats.fabric_reads++;
            c->stats.fabric_latency_ps += ready - now;
            vt_record(vcpu_index, s->next, 0, now);
        } else
            c->stats.dram_reads++;
        *r = (struct vt_mshr){.ready_ps = ready, .line = s->next};
        vt_l2_fill(c, vcpu_index, s->next, cls, ready, now, 1);
        c->stats.prefetches++;
    }
}

/* Loads wait for the loads in flight whose data their address comes from, and everything for a
 * full reorder buffer. */
static void vt_wait_dependencies(struct vt_cpu *c, uint64_t *now, uint64_t insn, uint64_t vaddr, int load)
{
    uint64_t until = *now;
    for (unsigned i = 0; load && i < VT_PENDING; i++) {
        struct vt_pending *p = &c->pending[i];
        if (p->ready_ps > until && vaddr - p->value < VT_POINTER_REACH)
            until = p->ready_ps;
    }
    for (unsigned i = 0; i < vt.mlp; i++) {
        struct vt_mshr *r = &c->mshr[i];
        if (r->demand && r->ready_ps > until && insn - r->issue_insn >= vt.rob)
            until = r->ready_ps;
    }
    vt_stall(c, now, until);
}

/* A load's data arrives at `ready`: remember its value for the loads that follow it. */
static void vt_pend(struct vt_cpu *c, uint64_t now, uint64_t ready, int has_value, uint64_t value)
{
    if (!has_value || ready <= now)
        return;
    c->pending[c->next_pending++ % VT_PENDING] = (struct vt_pending){ready, value};
}

/* One access of a line by a vCPU: its class, and for loads the value it returned. */
static void vt_access(unsigned vcpu_index, uint64_t insn, uint64_t vaddr, uint64_t hpa, int write, int cls,
                      int nt, int has_value, uint64_t value)
{
    struct vt_cpu *c = &vt_cpus[vcpu_index];
    vt_follow_clock(c);         /* did it sleep since its last access? */
    tl_barrier(c, insn);        /* past the end of its quantum: wait for the other hosts */
    uint64_t now = vt_now(c, insn), line = hpa / LINE;
    struct vt_line *l1;
    vt_wait_dependencies(c, &now, insn, vaddr, !write);
    if (nt && write) {
        struct vt_line *l2 = vt_find(&c->l2, line);
        l1 = vt_find(&c->l1, line);
        if (l1)
            l1->tag = 0;
        if (l2)
            l2->tag = 0;
        uint64_t done = vt_write(cls, line, now, 1);
        if (cls == VT_FABRIC) {
            c->stats.fabric_writes++;
            c->stats.fabric_latency_ps += done - now;
            vt_record(vcpu_index, line, 1, now);
        } else
            c->stats.dram_writes++;
        c->stats.nt_writes++;
        vt_stall(c, &now, done);
    } else if ((l1 = vt_find(&c->l1, line)) != NULL) {
        l1->used = ++c->tick;
        if (!write)
            vt_pend(c, now, l1->ready_ps, has_value, value);   /* a line still being filled */
        struct vt_line *l2 = write ? vt_find(&c->l2, line) : NULL;
        if (l2)
            l2->dirty = 1;
        c->stats.l1_hits++;
    } else {
        struct vt_line *l2 = vt_find(&c->l2, line);
        uint64_t ready;
        if (l2) {
            int was_prefetched = l2->prefetched;
            l2->used = ++c->tick;
            l2->prefetched = 0;
            ready = (l2->ready_ps > now ? l2->ready_ps : now) + vt.l2_hit_ps;
            vt_l1_fill(c, line, ready);
            c->stats.l2_hits++;
            if (was_prefetched)
                vt_prefetch(c, vcpu_index, line, l2->cls, now);
        } else {
            ready = vt_miss(c, vcpu_index, line, cls, &now, insn);
            l2 = vt_l2_fill(c, vcpu_index, line, cls, ready, now, 0);
            c->stats.misses++;
            vt_prefetch(c, vcpu_index, line, cls, now);
        }
        if (write)
            l2->dirty = 1;
        else
            vt_pend(c, now, ready, has_value, value);
    }
    vt_apply(c);
}

/* PFCXL_MARK_COLD: the vCPU's caches and streams start empty (dirty lines are written back). */
static void vt_cold(unsigned vcpu_index, uint64_t insn)
{
    struct vt_cpu *c = &vt_cpus[vcpu_index];
    uint64_t now = vt_now(c, insn);
    for (size_t i = 0; i < (size_t)c->l2.sets * c->l2.ways; i++) {
        struct vt_line *l = &c->l2.lines[i];
        if (l->tag && l->dirty)
            vt_writeback(c, vcpu_index, l, now);
    }
    memset(c->l1.lines, 0, (size_t)c->l1.sets * c->l1.ways * sizeof(struct vt_line));
    memset(c->l2.lines, 0, (size_t)c->l2.sets * c->l2.ways * sizeof(struct vt_line));
    memset(c->streams, 0, sizeof c->streams);
    memset(c->pending, 0, sizeof c->pending);
}

static void vt_stats_json(char *buf, size_t len, unsigned n, int since_phase)
{
    struct vt_stats s = {0};
    for (unsigned i = 0; i < n; i++) {
        const struct vt_stats *a = &vt_cpus[i].stats, *b = &vt_cpus[i].at_phase;
        const uint64_t *x = (const uint64_t *)a, *y = (const uint64_t *)b;
        uint64_t *z = (uint64_t *)&s;
        for (size_t k = 0; k < sizeof s / sizeof(uint64_t); k++)
            z[k] += x[k] - (since_phase ? y[k] : 0);
    }
    snprintf(buf, len,
             "\"vtime\":{\"system\":\"%s\",\"charged_ns\":%.3f,\"contention_ns\":%.3f,\"l1_hits\":%" PRIu64 ",\"l2_hits\":%" PRIu64
             ",\"misses\":%" PRIu64 ",\"prefetches\":%" PRIu64 ",\"writebacks\":%" PRIu64 ",\"nt_writes\":%" PRIu64
             ",\"stalls\":%" PRIu64 ",\"fabric_reads\":%" PRIu64 ",\"fabric_writes\":%" PRIu64
             ",\"fabric_latency_ns\":%.3f,\"dram_reads\":%" PRIu64 ",\"dram_writes\":%" PRIu64 "}",
             vt.names[vt.current], s.charged_ps / 1e3, s.contention_ps / 1e3, s.l1_hits, s.l2_hits, s.misses, s.prefetches, s.writebacks,
             s.nt_writes, s.stalls, s.fabric_reads, s.fabric_writes, s.fabric_latency_ps / 1e3, s.dram_reads,
             s.dram_writes);
}

/* PFCXL_MARK_PROFILE(k): fabric k is in force from now on; 0 when there is no such fabric. */
static int vt_select(int k)
{
    if (k < 0 || k >= vt.n_fabrics)
        return 0;
    vt.current = k;
    return 1;
}

static void vt_phase_start(unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        vt_cpus[i].at_phase = vt_cpus[i].stats;
}

/* Non-temporal stores, known by their bytes at translation: movnti (0f c3), movntps/pd (0f 2b),
 * movntq/movntdq (0f e7), and the VEX forms of the last two (c5/c4 ... 2b/e7). */
static int vt_is_nt_store(const uint8_t *b, size_t n)
{
    size_t i = 0;
    while (i < n && (b[i] == 0x66 || b[i] == 0xf2 || b[i] == 0xf3 || b[i] == 0x2e || b[i] == 0x3e ||
                     b[i] == 0x26 || b[i] == 0x64 || b[i] == 0x65 || b[i] == 0x36))
        i++;
    if (i < n && (b[i] & 0xf0) == 0x40)
        i++;    /* REX */
    if (i + 2 < n && b[i] == 0x0f)
        return b[i + 1] == 0xc3 || b[i + 1] == 0x2b || b[i + 1] == 0xe7;
    if (i + 2 < n && b[i] == 0xc5)
        return b[i + 2] == 0x2b || b[i + 2] == 0xe7;
    if (i + 3 < n && b[i] == 0xc4 && (b[i + 1] & 0x1f) == 1)
        return b[i + 3] == 0x2b || b[i + 3] == 0xe7;
    return 0;
}

#endif /* PFCXL_VTIME_H */
