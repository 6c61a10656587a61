/*
 * pfcxl timeline (plugin argument timeline=PATH,timeline_host=N, with clock=virtual): several
 * timed hosts, each a QEMU of its own, kept in one virtual timeline so that their fabric
 * requests queue behind each other.
 *
 * Included once, by pfcxl_plugin.c, after pfcxl_vtime.h. The file at PATH is shared by every
 * host's plugin (MAP_SHARED); the host side creates it (device/appliance/timeline.py, whose
 * ctypes layout mirrors struct tl_file) with the quantum and the number of hosts to wait for.
 *
 * Conservative synchronisation in quanta, as parallel simulators do:
 *   - a host joins when its guest starts a phase (a benchmark begins) and leaves when the phase
 *     ends. A round starts once `expected` hosts have joined (the host side sets it before each
 *     run: device/appliance/timeline.py): those wait, then start together at one quantum. A host
 *     that joins a round under way starts at its current quantum; the round ends when the last
 *     host leaves;
 *   - each host runs one quantum of virtual time (its own clock less the offset it joined at),
 *     noting every fabric request with its latency on the host's own queues (vtime's model);
 *   - at the quantum's end it waits at the barrier. The last host to arrive merges every host's
 *     requests of the quantum, in timeline order (ties by host), through the fabric's queues
 *     keyed as device/fabric/model.py keys them: a host's own links stay its own, a module's
 *     memory (and on the electrical pool the switch link of a group of hosts) is shared;
 *   - each request's queueing delay is what the merged queues add to its own latency; the host
 *     is charged their sum, divided by how many of its requests are in flight on average
 *     (Little's law: its requests' own latency per quantum over the quantum, a running mean over
 *     TL_MEAN_QUANTA quanta, at least 1): a dependent chase pays each delay, a stream with many
 *     misses in flight the delay of its critical path. The charge lands at the start of the next
 *     quantum, on the host's clock and on its requests still in flight (tl_delay_in_flight), so
 *     that it is not hidden under the wait for a request the charged one held up;
 *   - a vCPU that halts (its guest sleeps) stays in the round: icount's sleep=off jumps its clock
 *     to its next timer (vt_follow_clock sees the jump at its next access), and it then catches
 *     up quantum by quantum, so a sleep lasts as long in the timeline as in the guest, whatever
 *     the hosts' speeds. (One halted with no timer pending holds the round until it wakes.) A
 *     QEMU that exits leaves the round, and a host whose process is gone is
 *     dropped by whichever host waits for it (it is checked every TL_POLL_MS) and named in the
 *     file's slots (`stats` reads them).
 * Deterministic: what a host is charged depends only on every host's requests and their
 * timeline times, never on which host arrives last or how fast its QEMU runs (a round's hosts
 * must all join at its start: one that joins late enters at a quantum that depends on host time).
 */
#ifndef PFCXL_TIMELINE_H
#define PFCXL_TIMELINE_H

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>

#include "pfcxl_timeline_file.h"

_Static_assert(TL_STAGES == 2 * VT_MAX_STAGES + 1, "a timeline queue set per write stage, the memory, per read stage");
#define TL_POLL_MS 20
#define TL_MEAN_QUANTA 16

static struct {
    int on, host;
    struct tl_file *f;
    uint64_t offset_ps;         /* timeline time = the vCPU's own time - offset */
    uint64_t epoch;             /* the quantum this host runs */
} tl;

static uint64_t tl_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Is this host's QEMU gone? A killed one its parent has not reaped yet is a zombie: kill(pid, 0)
 * still succeeds on it, so its state is read too. */
static int tl_dead(uint32_t pid)
{
    if (!pid)
        return 0;
    if (kill((pid_t)pid, 0) < 0)
        return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close = strrchr(buf, ')');      /* the command name may hold anything */
    return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

static void tl_wait(uint32_t *word, uint32_t val)
{
    struct timespec ts = {0, TL_POLL_MS * 1000000L};
    syscall(SYS_futex, word, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void tl_wake(uint32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* The file's lock: held for a few microseconds at most (a merge); one a dead host held is taken over. */
static void tl_lock(void)
{
    uint32_t me = (uint32_t)getpid();
    uint64_t since = 0;
    for (unsigned n = 0;; n++) {
        uint32_t zero = 0;
        if (__atomic_compare_exchange_n(&tl.f->lock, &zero, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            tl.f->lock_pid = me;
            return;
        }
        if (n < 1000) {
            _mm_pause();
            continue;
        }
        sched_yield();
        if (!since)
            since = tl_ns();
        else if (tl_ns() - since > 1000000000ULL && tl_dead(__atomic_load_n(&tl.f->lock_pid, __ATOMIC_RELAXED))) {
            __atomic_store_n(&tl.f->lock, 0, __ATOMIC_RELEASE);
            since = 0;
        }
    }
}

static void tl_unlock(void)
{
    tl.f->lock_pid = 0;
    __atomic_store_n(&tl.f->lock, 0, __ATOMIC_RELEASE);
}

/* ---------------------------------------------------------------- the merge */

static unsigned tl_queue(const struct vt_stage *st, unsigned host, unsigned module, const struct vt_memory *m)
{
    switch (st->key) {
    case VT_KEY_HOST:
        return host;
    case VT_KEY_PATH:
        return (unsigned)((host * m->modules + module) % TL_QUEUES);
    case VT_KEY_MODULE:
        return module;
    default:
        return (unsigned)(host / m->hosts_per_group);
    }
}

static uint64_t tl_serve(uint64_t *free_ps, uint64_t t, uint64_t svc)
{
    uint64_t start = t > *free_ps ? t : *free_ps;
    *free_ps = start + svc;
    return start + svc;
}

/* When request `r` of `host`, issued at timeline time `t`, completes on the shared queues. */
static uint64_t tl_through(const struct tl_req *r, unsigned host, uint64_t t)
{
    const struct vt_memory *m = &vt.fabrics[vt.current];
    uint64_t (*q)[TL_QUEUES] = tl.f->free_ps;
    unsigned mod = r->module;
    if (r->write) {
        for (int i = 0; i < m->n_write; i++)
            t = tl_serve(&q[i][tl_queue(&m->write[i], host, mod, m)], t, m->write[i].svc_ps);
        t += m->req_w;
        t = tl_serve(&q[VT_MAX_STAGES][tl_queue(&m->mem, host, mod, m)], t, m->mem.svc_ps);
        return t + m->mem_w + m->resp_w;
    }
    t += m->req_r;
    t = tl_serve(&q[VT_MAX_STAGES][tl_queue(&m->mem, host, mod, m)], t, r->hit ? m->hit_svc_ps : m->mem.svc_ps);
    t += r->hit ? m->mem_hit : m->mem_r;
    for (int i = 0; i < m->n_read; i++)
        t = tl_serve(&q[VT_MAX_STAGES + 1 + i][tl_queue(&m->read[i], host, mod, m)], t, m->read[i].svc_ps);
    return t + m->resp_r;
}

/* The last host at the barrier of quantum `e`: every arrived host's requests, merged in time
 * order (ties: host, then its own order), and each host's charge. Under the lock. */
static void tl_merge(uint64_t e)
{
    struct tl_file *f = tl.f;
    uint64_t t0 = tl_ns(), q = f->quantum_ps, start = e * q;
    unsigned next[TL_HOSTS] = {0};
    uint64_t delay[TL_HOSTS] = {0}, spent[TL_HOSTS] = {0};
    for (;;) {
        int best = -1;
        for (int h = 0; h < TL_HOSTS; h++) {
            struct tl_slot *s = &f->slots[h];
            /* a request issued after the quantum (a stall pushed it there) waits for the next merge */
            if (s->state != TL_IN || s->arrived != e + 1 || next[h] >= s->n_reqs || f->reqs[h][next[h]].t_ps >= q)
                continue;
            if (best < 0 || f->reqs[h][next[h]].t_ps < f->reqs[best][next[best]].t_ps)
                best = h;
        }
        if (best < 0)
            break;
        const struct tl_req *r = &f->reqs[best][next[best]++];
        uint64_t issue = start + r->t_ps;
        uint64_t lat = tl_through(r, (unsigned)best, issue) - issue;
        if (r->stalls) {
            delay[best] += lat > r->local_ps ? lat - r->local_ps : 0;
            spent[best] += r->local_ps;
        }
        f->merged++;
    }
    for (int h = 0; h < TL_HOSTS; h++) {
        struct tl_slot *s = &f->slots[h];
        if (s->state != TL_IN || s->arrived != e + 1)
            continue;
        /* a running mean: a chase's requests cross quanta, so one quantum may hold two of them */
        s->spent_ps = s->spent_ps - s->spent_ps / TL_MEAN_QUANTA + spent[h] / TL_MEAN_QUANTA;
        uint64_t in_flight = s->spent_ps > q ? s->spent_ps : q;
        s->charge_ps = (uint64_t)((unsigned __int128)delay[h] * q / in_flight);
        s->contention_ps += s->charge_ps;
        uint64_t left = s->n_reqs - next[h];        /* a host's requests are in issue order */
        for (uint64_t i = 0; i < left; i++) {
            f->reqs[h][i] = f->reqs[h][next[h] + i];
            f->reqs[h][i].t_ps -= (uint32_t)q;
        }
        s->n_reqs = left;
    }
    f->leader_ns += tl_ns() - t0;
    f->epoch = e + 1;
    __atomic_store_n(&f->epoch_word, (uint32_t)(e + 1), __ATOMIC_RELEASE);
    tl_wake(&f->epoch_word);
}

/* Under the lock: are all hosts in the timeline at the end of the current quantum? Then merge. */
static void tl_try_merge(void)
{
    struct tl_file *f = tl.f;
    int any = 0;
    for (int h = 0; h < TL_HOSTS; h++) {
        struct tl_slot *s = &f->slots[h];
        if (s->state != TL_IN)
            continue;
        if (s->arrived != f->epoch + 1)
            return;
        any = 1;
    }
    if (any)
        tl_merge(f->epoch);
}

/* Under the lock: drop the hosts whose QEMU is gone. */
static void tl_reap(void)
{
    for (int h = 0; h < TL_HOSTS; h++) {
        struct tl_slot *s = &tl.f->slots[h];
        if (s->state == TL_IN && h != tl.host && tl_dead(s->pid)) {
            s->state = TL_GONE;
            s->left_epoch = tl.f->epoch;
            tl.f->gone++;
            fprintf(stderr, "pfcxl_plugin: timeline: host %d (pid %u) is gone; it is dropped at quantum %" PRIu64
                            "\n", h, s->pid, tl.f->epoch);
        }
    }
}

/* ---------------------------------------------------------------- a host */

/* A request this host's vtime model just timed (vt_read, vt_write). */
static void tl_note(int write, unsigned module, int hit, uint64_t issue_ps, uint64_t done_ps, int stalls)
{
    if (!tl.on)
        return;
    struct tl_slot *s = &tl.f->slots[tl.host];
    /* offsets wrap (a host's own clock may be behind the timeline's): differences are exact */
    int64_t after = (int64_t)(issue_ps - tl.offset_ps - tl.epoch * tl.f->quantum_ps);
    uint64_t t = after > 0 ? (uint64_t)after : 0, lat = done_ps - issue_ps;
    s->requests++;
    if (s->n_reqs >= TL_REQS || t > UINT32_MAX || lat > UINT32_MAX) {
        s->overflow++;
        return;
    }
    tl.f->reqs[tl.host][s->n_reqs++] = (struct tl_req){
        .t_ps = (uint32_t)t, .local_ps = (uint32_t)lat, .module = (uint16_t)module,
        .write = (uint8_t)write, .hit = (uint8_t)hit, .stalls = (uint8_t)stalls};
}

/* This host's own queues learn the merged queues' backlog (in its own clock): the queueing that
 * other hosts' earlier traffic causes is then in its own latencies, and stalls it as any queueing
 * does; only what they send within one quantum is left to the charge. */
static void tl_sync(void)
{
    struct vt_memory *m = &vt.fabrics[vt.current];
    uint64_t (*q)[TL_QUEUES] = tl.f->free_ps;
    struct vt_stage *stages[TL_STAGES];
    int rows[TL_STAGES], n = 0;
    for (int i = 0; i < m->n_write; i++)
        stages[n] = &m->write[i], rows[n++] = i;
    stages[n] = &m->mem, rows[n++] = VT_MAX_STAGES;
    for (int i = 0; i < m->n_read; i++)
        stages[n] = &m->read[i], rows[n++] = VT_MAX_STAGES + 1 + i;
    for (int k = 0; k < n; k++) {
        struct vt_stage *st = stages[k];
        unsigned queues = st->per_module ? (unsigned)m->modules : 1;
        for (unsigned mod = 0; mod < queues; mod++) {
            uint64_t merged = q[rows[k]][tl_queue(st, (unsigned)tl.host, mod, m)] + tl.offset_ps;
            if ((int64_t)(merged - st->free_ps[mod]) > 0)
                st->free_ps[mod] = merged;
        }
    }
}

/* A timeline charge (queueing behind other hosts, below) lands at `now`, while this
 * vCPU's requests are in flight: they queued too, so each completes `by` later, with the lines
 * they fill and the loads waiting on them. Charged to the clock alone, the delay would hide
 * under the wait for a request already in flight (a chase's next load), and a loaded chase would
 * pay only part of what the merged queues gave it. */
static void tl_delay_in_flight(struct vt_cpu *c, uint64_t now, uint64_t by)
{
    for (unsigned i = 0; i < vt.mlp; i++) {
        struct vt_mshr *r = &c->mshr[i];
        if (r->ready_ps <= now)
            continue;
        struct vt_line *in[2] = {vt_find(&c->l1, r->line), vt_find(&c->l2, r->line)};
        for (int k = 0; k < 2; k++)
            if (in[k] && in[k]->ready_ps > now)
                in[k]->ready_ps += by;
        r->ready_ps += by;
    }
    for (unsigned i = 0; i < VT_PENDING; i++)
        if (c->pending[i].ready_ps > now)
            c->pending[i].ready_ps += by;
}

/* Wait until quantum `e` is merged; then this host runs the next one, its charge landing at
 * `now` (its own clock): on the clock and on its requests in flight. */
static void tl_arrive(struct vt_cpu *c, uint64_t now)
{
    struct tl_file *f = tl.f;
    struct tl_slot *s = &f->slots[tl.host];
    uint64_t e = tl.epoch, t0 = tl_ns();
    tl_lock();
    s->arrived = e + 1;
    s->quanta++;
    tl_try_merge();
    tl_unlock();
    while (__atomic_load_n(&f->epoch, __ATOMIC_ACQUIRE) <= e) {
        tl_wait(&f->epoch_word, (uint32_t)e);
        if (__atomic_load_n(&f->epoch, __ATOMIC_ACQUIRE) > e)
            break;
        tl_lock();
        tl_reap();
        tl_try_merge();
        tl_unlock();
    }
    tl.epoch = e + 1;
    tl_sync();
    s->wait_ns += tl_ns() - t0;
    uint64_t charge = s->charge_ps;
    s->charge_ps = 0;
    tl_delay_in_flight(c, now, charge);
    c->charged_ps += charge;
    c->stats.charged_ps += charge;
    c->stats.contention_ps += charge;
}

static void tl_barrier(struct vt_cpu *c, uint64_t insn)
{
    if (!tl.on)
        return;
    uint64_t q = tl.f->quantum_ps;
    for (;;) {
        uint64_t own = vt_now(c, insn), now = own - tl.offset_ps;
        tl.f->slots[tl.host].time_ps = now;
        if (now < (tl.epoch + 1) * q)
            return;
        tl_arrive(c, own);
    }
}

/* Under the lock: this host enters the timeline at the current quantum, its clock now at its start. */
static void tl_enter(uint64_t now_ps)
{
    struct tl_slot *s = &tl.f->slots[tl.host];
    tl.epoch = tl.f->epoch;
    if ((int64_t)(now_ps - tl.offset_ps - tl.epoch * tl.f->quantum_ps) < 0 || !tl.offset_ps) {
        tl.offset_ps = now_ps - tl.epoch * tl.f->quantum_ps;
    }
    s->n_reqs = 0;
    s->arrived = tl.epoch;
    s->state = TL_IN;
}

/* A phase starts (the guest's benchmark begins): join the timeline. A round starts once the file's
 * `expected` hosts have joined, all at the same quantum; a host that joins a round under way
 * enters at its current quantum. */
static void tl_join(struct vt_cpu *c, uint64_t insn)
{
    struct tl_file *f = tl.f;
    struct tl_slot *s = &f->slots[tl.host];
    if (tl.on)
        return;
    tl_lock();
    if (!f->digest)
        f->digest = vt.digest;
    if (f->digest != vt.digest) {
        tl_unlock();
        fprintf(stderr, "pfcxl_plugin: timeline: host %d has another fabric model than the hosts already in the "
                        "timeline; it runs on its own clock\n", tl.host);
        return;
    }
    s->pid = (uint32_t)getpid();
    s->joined_epoch = f->epoch;
    s->arrived = f->epoch;
    s->n_reqs = 0;
    s->spent_ps = 0;
    s->state = TL_IN;                   /* counted now; its clock is aligned once the round starts */
    int waiting = !f->started;
    if (waiting) {
        unsigned n = 0;
        for (int h = 0; h < TL_HOSTS; h++)
            n += f->slots[h].state == TL_IN;
        if (n >= f->expected) {
            __atomic_store_n(&f->started, 1, __ATOMIC_RELEASE);
            tl_wake(&f->started);
            waiting = 0;
        }
    }
    tl_unlock();
    uint64_t t0 = tl_ns();
    while (waiting && !__atomic_load_n(&f->started, __ATOMIC_ACQUIRE)) {
        tl_wait(&f->started, 0);
        if (tl_ns() - t0 > f->join_timeout_ms * 1000000ULL) {
            fprintf(stderr, "pfcxl_plugin: timeline: %u hosts expected but not all joined within %" PRIu64
                            " ms; the round starts without them\n", f->expected, f->join_timeout_ms);
            __atomic_store_n(&f->started, 1, __ATOMIC_RELEASE);
            tl_wake(&f->started);
        }
    }
    s->wait_ns += tl_ns() - t0;
    tl_lock();
    tl.offset_ps = 0;
    tl_enter(vt_now(c, insn));
    tl_unlock();
    tl.on = 1;
}

/* The phase ends, or QEMU exits: out of the round; the last host out ends it. */
static void tl_leave(void)
{
    if (!tl.on)
        return;
    tl.on = 0;
    struct tl_file *f = tl.f;
    tl_lock();
    f->slots[tl.host].state = TL_LEFT;
    f->slots[tl.host].left_epoch = f->epoch;
    int left = 0;
    for (int h = 0; h < TL_HOSTS; h++)
        left += f->slots[h].state == TL_IN;
    if (!left)
        __atomic_store_n(&f->started, 0, __ATOMIC_RELEASE);
    tl_try_merge();
    tl_unlock();
}

static int tl_open(const char *path, int host)
{
    if (host < 0 || host >= TL_HOSTS) {
        fprintf(stderr, "pfcxl_plugin: timeline_host=%d: a timeline holds hosts 0 to %d\n", host, TL_HOSTS - 1);
        return -1;
    }
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || (size_t)st.st_size != sizeof(struct tl_file)) {
        fprintf(stderr, "pfcxl_plugin: timeline %s: %s\n", path,
                fd < 0 ? strerror(errno) : "not a timeline file of this plugin's size (create it with "
                                           "device/appliance/timeline.py)");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    void *p = mmap(NULL, sizeof(struct tl_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "pfcxl_plugin: timeline %s: mmap: %s\n", path, strerror(errno));
        return -1;
    }
    struct tl_file *f = p;
    if (f->magic != TL_MAGIC || f->version != TL_VERSION || !f->quantum_ps || f->quantum_ps > UINT32_MAX / 2) {
        fprintf(stderr, "pfcxl_plugin: timeline %s: not a version %d timeline with a quantum under 2 ms\n", path,
                TL_VERSION);
        munmap(p, sizeof(struct tl_file));
        return -1;
    }
    tl.f = f;
    tl.host = host;
    return 0;
}

#endif /* PFCXL_TIMELINE_H */
