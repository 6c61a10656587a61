/* The fabric engine's compiled kernel (device/fabric/native.py loads it with ctypes): one access's path
 * through a FabricModel's queueing network, with the same rules as fabric_engine's numpy solver
 * and the event-driven reference of the tests. All times are integer picoseconds.
 *
 * Accesses are numbered 0..n-1; at a queue, ties in arrival go to the lower (issue, number).
 * network() serves independent issue stage by stage: per stage the accesses are bucketed by queue
 * (stable, so number order), each bucket is put in arrival order (insertion sort: arrivals are
 * nearly in order; a bucket far from it is sorted with qsort; a stage far from it, by radix), then d = max(a, last) + s.
 * chase() serves dependent issue with one event heap (an access issues when the previous access
 * of its vCPU completes), so it needs no fixed-point iteration.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KEY_HOST, KEY_MODULE, KEY_PATH, KEY_GROUP };
enum { WRITE_SIDE, MEMORY, READ_SIDE };

/* One stage of the model, as device/fabric/native.py packs it. */
enum { TABLE = 2048 };               /* service times of transfers below this many bytes, looked up */

struct stage {
    int64_t bandwidth_mbs;
    int32_t key, side, queues, pad;
    int64_t *bytes, *busy;          /* per queue, accumulated */
    int64_t *table;                 /* kernel-private: service time by size */
};

struct model {
    int32_t nstages, modules, hosts_per_group, cache_bits;
    struct stage *stages;
    int64_t req_w, mem_w, resp_w, req_r, mem_r, resp_r, mem_hit;
    int64_t hit_bandwidth_mbs;      /* 0: no cache */
    int64_t *cache_state;           /* per set: last key, -1 when empty */
};

struct access {                     /* per-access inputs, by number */
    const int64_t *issue;
    const int32_t *host, *module, *size;
    const uint8_t *write;
    const int32_t *jitter;
    const int64_t *slot, *key;      /* cache set and key, when the model has a cache */
};

static inline int64_t service(int64_t bytes, int64_t mbs) { return (bytes * 1000000 + mbs - 1) / mbs; }

static inline int32_t queue_of(const struct model *m, const struct stage *st, const struct access *a, int64_t i)
{
    switch (st->key) {
    case KEY_HOST: return a->host[i];
    case KEY_MODULE: return a->module[i];
    case KEY_PATH: return a->host[i] * m->modules + a->module[i];
    default: return a->host[i] / m->hosts_per_group;
    }
}

/* HBM cache: decide whether read i hits, then install its key (every access does). */
static inline int cache_lookup(const struct model *m, const struct access *a, int64_t i)
{
    int64_t *state = &m->cache_state[a->slot[i]], key = a->key[i], prev = *state;
    int64_t d = prev - key, lines = key & ((1LL << m->cache_bits) - 1);
    *state = key;
    return !a->write[i] && d >= 0 && d < (1LL << m->cache_bits) - lines;
}

/* An access waiting at a stage: its arrival, number and size (read here, in number order, so a
 * departure in arrival order touches no per-access array but the times). */
struct pair { int64_t t; int32_t i, size; };

static int pair_cmp(const void *x, const void *y)
{
    const struct pair *p = x, *q = y;
    if (p->t != q->t) return p->t < q->t ? -1 : 1;
    return (p->i > q->i) - (p->i < q->i);
}

static inline int before(const struct pair *p, const struct pair *q)
{
    return p->t < q->t || (p->t == q->t && p->i < q->i);
}

/* Stable sort of `p` (in number order) by arrival, so ties stay in number order: least
 * significant digit first, 11 bits at a time, over the span of the arrivals. 0, or -1 without
 * memory. */
static int radix_order(struct pair *p, int64_t len)
{
    if (len < 2)
        return 0;
    int64_t lo = p[0].t, hi = p[0].t;
    for (int64_t k = 1; k < len; k++) {
        lo = p[k].t < lo ? p[k].t : lo;
        hi = p[k].t > hi ? p[k].t : hi;
    }
    struct pair *tmp = malloc((size_t)len * sizeof *tmp), *src = p, *dst = tmp;
    if (!tmp)
        return -1;
    uint64_t span = (uint64_t)hi - (uint64_t)lo;
    for (int shift = 0; shift < 64 && (span >> shift); shift += 11) {
        int64_t count[2049] = {0};
        for (int64_t k = 0; k < len; k++)
            count[(((uint64_t)src[k].t - (uint64_t)lo) >> shift & 2047) + 1]++;
        for (int d = 0; d < 2048; d++)
            count[d + 1] += count[d];
        for (int64_t k = 0; k < len; k++)
            dst[count[((uint64_t)src[k].t - (uint64_t)lo) >> shift & 2047]++] = src[k];
        struct pair *swap = src;
        src = dst, dst = swap;
    }
    if (src != p)
        memcpy(p, src, (size_t)len * sizeof *p);
    free(tmp);
    return 0;
}

/* Arrival order inside one bucket; `p` is in number order. */
static void arrival_order(struct pair *p, int64_t len)
{
    int64_t moves = 0, budget = 16 * len + 64;
    for (int64_t k = 1; k < len; k++) {
        struct pair x = p[k];
        int64_t j = k;
        while (j > 0 && before(&x, &p[j - 1])) {
            p[j] = p[j - 1];
            j--;
        }
        p[j] = x;
        moves += k - j;
        if (moves > budget) {          /* far from arrival order */
            qsort(p, (size_t)len, sizeof *p, pair_cmp);
            return;
        }
    }
}

/* One queue's next access (number i, `size` bytes): FIFO departure, bytes and busy time. */
static inline void depart(const struct model *m, const struct stage *st, const struct access *a, int32_t q,
                          int64_t i, int64_t size, int64_t *t, int64_t *last, uint8_t *hit)
{
    int64_t s;
    if (hit && m->hit_bandwidth_mbs && (hit[i] = (uint8_t)cache_lookup(m, a, i)))
        s = service(size, m->hit_bandwidth_mbs);
    else
        s = size < TABLE ? st->table[size] : service(size, st->bandwidth_mbs);
    last[q] = (t[i] > last[q] ? t[i] : last[q]) + s;
    t[i] = last[q];
    st->bytes[q] += size;
    st->busy[q] += s;
}

/* Serve one batch `b` of `len` accesses (number order; each arrives no later than anything after
 * the batch), `q` their queues, `start[j + 1]` how many go to queue j: bucket by queue, stably,
 * then each bucket in arrival order. `out` is scratch. */
static void serve_batch(const struct model *m, const struct stage *st, const struct access *a, const struct pair *b,
                        const int32_t *q, int64_t len, struct pair *out, int64_t *start, int64_t *t, int64_t *last,
                        uint8_t *hit)
{
    int64_t nq = st->queues;
    for (int64_t j = 0; j < nq; j++)
        start[j + 1] += start[j];
    for (int64_t k = 0; k < len; k++)
        out[start[q[k]]++] = b[k];
    for (int64_t j = 0, lo = 0; j < nq; lo = start[j++]) {
        arrival_order(out + lo, start[j] - lo);
        for (int64_t k = lo; k < start[j]; k++)
            depart(m, st, a, (int32_t)j, out[k].i, out[k].size, t, last, hit);
    }
}

enum { BATCH = 4096, PENDING = 4 * BATCH };
#define ID(x) (ids ? ids[x] : (x))

/* Serve the `len` accesses `ids` (ascending numbers; NULL: all of them) at stage `st`: t[i] is an
 * arrival on entry, a departure on return. `hit` (memory stage with a cache) gets each access's hit
 * flag. When every queue already sees its arrivals in number order, they are served in that order.
 * Otherwise batches of about BATCH accesses keep the work in the CPU's caches: an access waits for a
 * later batch while a later-numbered access arrives before it. With more than PENDING waiting (far
 * from number order), everything left is sorted by arrival. */
static int serve(const struct model *m, struct stage *st, const struct access *a, const int32_t *ids,
                 int64_t len, int64_t *t, uint8_t *hit)
{
    int64_t nq = st->queues, chunks = (len + BATCH - 1) / BATCH, cap = PENDING + BATCH, pending = 0;
    int64_t *last = malloc((size_t)nq * sizeof *last), *start = malloc((size_t)(nq + 1) * sizeof *start);
    int64_t *floor = malloc((size_t)(chunks + 1) * sizeof *floor), table[TABLE];
    struct pair *wait = malloc((size_t)cap * sizeof *wait), *ready = malloc((size_t)cap * sizeof *ready);
    struct pair *out = malloc((size_t)cap * sizeof *out);
    int32_t *q = malloc((size_t)cap * sizeof *q);
    int rc = -1;
    if (!last || !start || !floor || !wait || !ready || !out || !q)
        goto done;
    for (int64_t j = 0; j < nq; j++)
        last[j] = INT64_MIN / 4;
    st->table = table;
    for (int64_t z = 0; z < TABLE; z++)
        st->table[z] = service(z, st->bandwidth_mbs);
    int64_t x = 0;                                      /* every queue in number order already? */
    for (; x < len; x++) {
        int64_t i = ID(x);
        int32_t j = queue_of(m, st, a, i);
        if (t[i] < last[j])
            break;
        last[j] = t[i];
    }
    for (int64_t j = 0; j < nq; j++)
        last[j] = INT64_MIN / 4;
    if (x == len) {
        for (x = 0; x < len; x++)
            depart(m, st, a, queue_of(m, st, a, ID(x)), ID(x), a->size[ID(x)], t, last, hit);
        rc = 0;
        goto done;
    }
    floor[chunks] = INT64_MAX;                          /* floor[k]: earliest arrival after chunk k */
    for (int64_t k = chunks - 1; k >= 0; k--) {
        int64_t lo = k * BATCH, f = floor[k + 1];
        for (x = lo; x < len && x < lo + BATCH; x++)
            f = t[ID(x)] < f ? t[ID(x)] : f;
        floor[k] = f;
    }
    for (int64_t k = 0; k < chunks; k++) {
        int64_t lo = k * BATCH, hi = lo + BATCH < len ? lo + BATCH : len, fl = floor[k + 1], n = 0, kept = 0;
        memset(start, 0, (size_t)(nq + 1) * sizeof *start);
        for (x = 0; x < pending + hi - lo; x++) {       /* the waiting ones first: lower numbers */
            int64_t id = x < pending ? 0 : ID(lo + x - pending);
            struct pair p = x < pending ? wait[x] : (struct pair){t[id], (int32_t)id, a->size[id]};
            if (p.t <= fl) {
                q[n] = queue_of(m, st, a, p.i);
                start[q[n] + 1]++;
                ready[n++] = p;
            } else {
                wait[kept++] = p;
            }
        }
        pending = kept;
        serve_batch(m, st, a, ready, q, n, out, start, t, last, hit);
        if (pending > PENDING && hi < len) {            /* far from number order: sort the rest */
            struct pair *all = realloc(wait, (size_t)(pending + len - hi) * sizeof *wait);
            if (!all)
                goto done;
            wait = all;
            for (x = hi; x < len; x++)
                wait[pending++] = (struct pair){t[ID(x)], (int32_t)ID(x), a->size[ID(x)]};
            if (radix_order(wait, pending))     /* the waiting ones have the lower numbers */
                goto done;
            for (x = 0; x < pending; x++)
                depart(m, st, a, queue_of(m, st, a, wait[x].i), wait[x].i, wait[x].size, t, last, hit);
            break;
        }
    }
    rc = 0;
done:
    free(last), free(start), free(floor), free(wait), free(ready), free(out), free(q);
    return rc;
}

/* Independent issue: complete[i] for every access; at_memory/mem_done (may be NULL) give phases.
 * Returns 0, or -1 when memory ran out. */
int network(const struct model *m, int64_t n, const int64_t *issue, const int32_t *host, const int32_t *module,
            const int32_t *size, const uint8_t *write, const int32_t *jitter, const int64_t *slot,
            const int64_t *key, int64_t *complete, uint8_t *hit, int64_t *at_memory, int64_t *mem_done)
{
    struct access a = {issue, host, module, size, write, jitter, slot, key};
    int32_t *w = malloc((size_t)(n + 2) * sizeof *w), *r;   /* writes, then reads (n < 2**31) */
    int64_t nw = 0, nr = 0;
    int rc = -1;
    if (!w)
        goto out;
    for (int64_t i = 0; i < n; i++)
        nw += write[i];
    r = w + nw + 1;                     /* w[nw] and r[nr] after the last: slack for the stores below */
    nw = 0;
    /* branch-free passes: reads and writes come in random order */
    const int64_t req[2] = {m->req_r, m->req_w}, resp[2] = {m->resp_r, m->resp_w};
    const int64_t mem[4] = {m->mem_r, m->mem_hit, m->mem_w, m->mem_w};
    for (int64_t i = 0; i < n; i++) {
        w[nw] = r[nr] = (int32_t)i;
        nw += write[i];
        nr += !write[i];
        complete[i] = issue[i];
        hit[i] = 0;
    }
    for (int s = 0; s < m->nstages; s++)         /* write payloads to memory */
        if (m->stages[s].side == WRITE_SIDE && serve(m, &m->stages[s], &a, w, nw, complete, NULL))
            goto out;
    for (int64_t i = 0; i < n; i++) {
        complete[i] += req[write[i]];
        if (at_memory) at_memory[i] = complete[i];
    }
    for (int s = 0; s < m->nstages; s++)
        if (m->stages[s].side == MEMORY && serve(m, &m->stages[s], &a, NULL, n, complete, hit))
            goto out;
    for (int64_t i = 0; i < n; i++) {
        complete[i] += mem[2 * write[i] + hit[i]];
        if (mem_done) mem_done[i] = complete[i];
    }
    for (int s = 0; s < m->nstages; s++)         /* read payloads back */
        if (m->stages[s].side == READ_SIDE && serve(m, &m->stages[s], &a, r, nr, complete, NULL))
            goto out;
    for (int64_t i = 0; i < n; i++)
        complete[i] += resp[write[i]] + jitter[i];
    rc = 0;
out:
    free(w);
    return rc;
}

/* --- dependent issue: one event heap ------------------------------------------------------- */

struct event { int64_t t, issue, i; int32_t step, pad; };

static inline int earlier(const struct event *x, const struct event *y)
{
    if (x->t != y->t) return x->t < y->t;
    if (x->issue != y->issue) return x->issue < y->issue;
    return x->i < y->i;
}

static void push(struct event *h, int64_t *len, struct event e)
{
    int64_t k = (*len)++;
    while (k > 0 && earlier(&e, &h[(k - 1) / 2])) {
        h[k] = h[(k - 1) / 2];
        k = (k - 1) / 2;
    }
    h[k] = e;
}

static struct event pop(struct event *h, int64_t *len)
{
    struct event top = h[0], e = h[--*len];
    int64_t k = 0, c;
    while ((c = 2 * k + 1) < *len) {
        if (c + 1 < *len && earlier(&h[c + 1], &h[c])) c++;
        if (!earlier(&h[c], &e)) break;
        h[k] = h[c];
        k = c;
    }
    h[k] = e;
    return top;
}

/* Dependent issue. `stamp` is each access's instruction time; `next` the next access of its vCPU
 * (-1 at a chain's end); accesses with `head` set start their chains at their stamps. `lasts`
 * holds every stage's queues' last departures, stage after stage. Fills issue and complete. */
int chase(const struct model *m, int64_t n, const int64_t *stamp, const int64_t *next, const uint8_t *head,
          const int32_t *host, const int32_t *module, const int32_t *size, const uint8_t *write,
          const int32_t *jitter, const int64_t *slot, const int64_t *key, int64_t *lasts,
          int64_t *issue, int64_t *complete, uint8_t *hit)
{
    struct access a = {issue, host, module, size, write, jitter, slot, key};
    struct event *h = malloc((size_t)(n ? n : 1) * sizeof *h);
    int64_t len = 0, **last = malloc((size_t)(m->nstages ? m->nstages : 1) * sizeof *last);
    int32_t nw = 0, nr = 0, mem = -1, wst[64], rst[64];
    if (!h || !last || m->nstages > 64) {
        free(h), free(last);
        return -1;
    }
    for (int s = 0; s < m->nstages; s++) {
        last[s] = lasts;
        lasts += m->stages[s].queues;
        if (m->stages[s].side == WRITE_SIDE) wst[nw++] = s;
        else if (m->stages[s].side == READ_SIDE) rst[nr++] = s;
        else mem = s;
    }
    for (int64_t i = 0; i < n; i++) {
        hit[i] = 0;
        if (head[i]) {
            issue[i] = stamp[i];
            push(h, &len, (struct event){stamp[i], stamp[i], i, 0, 0});
        }
    }
    /* steps: writes cross their write stages (0..nw-1), then T_req, the memory, T_mem, done;
     * reads: T_req, the memory, T_mem, their read stages, then done */
    while (len) {
        struct event e = pop(h, &len);
        int64_t i = e.i, t = e.t;
        int32_t step = e.step, w = write[i], before = w ? nw : 0;
        const struct stage *st = NULL;
        int memory = 0;
        if (w && step < nw) st = &m->stages[wst[step]];
        else if (step == before) t += w ? m->req_w : m->req_r;
        else if (step == before + 1) st = &m->stages[mem], memory = 1;
        else if (!w && step - 2 < nr) st = &m->stages[rst[step - 2]];
        if (st) {
            int32_t q = queue_of(m, st, &a, i);
            int64_t *free_at = &last[st - m->stages][q], s;
            if (memory && m->hit_bandwidth_mbs && (hit[i] = (uint8_t)cache_lookup(m, &a, i)))
                s = service(size[i], m->hit_bandwidth_mbs);
            else
                s = service(size[i], st->bandwidth_mbs);
            *free_at = (t > *free_at ? t : *free_at) + s;
            t = *free_at;
            st->bytes[q] += size[i];
            st->busy[q] += s;
            if (memory) t += w ? m->mem_w : hit[i] ? m->mem_hit : m->mem_r;
        } else if (step != before) {                        /* done */
            complete[i] = t + (w ? m->resp_w : m->resp_r) + jitter[i];
            int64_t j = next[i];
            if (j >= 0) {
                issue[j] = complete[i] + stamp[j] - stamp[i];
                push(h, &len, (struct event){issue[j], issue[j], j, 0, 0});
            }
            continue;
        }
        push(h, &len, (struct event){t, e.issue, i, step + 1, 0});
    }
    free(h), free(last);
    return 0;
}

/* fabric_engine.draw_jitter from the same random bits: the k-th access of a direction gets
 * +v (k even) or -v (k odd) with v from raw[k / 2]; an unpaired last access gets 0. */
void jitter(int64_t n, const uint8_t *write, const uint16_t *raw_read, const uint16_t *raw_write, int32_t j_read,
            int32_t j_write, int64_t writes, int32_t *out)
{
    const uint16_t *raw[2] = {raw_read, raw_write};
    const int32_t span[2] = {2 * (j_read + 1), 2 * (j_write + 1)};
    const int64_t count[2] = {n - writes, writes};
    int64_t k[2] = {0, 0};
    for (int64_t i = 0; i < n; i++) {
        int d = write[i];
        int64_t kk = k[d]++;
        int32_t x = raw[d][kk >> 1] % span[d], v = (x >> 1) * (1 - 2 * (x & 1)) * 1000;
        out[i] = (kk & 1) ? -v : (kk == count[d] - 1) ? 0 : v;
    }
}

/* One trace record (trace_format.RECORD_FIELDS, 24 bytes). */
struct record { uint64_t insn, hpa; uint32_t size; uint8_t write, vcpu; uint16_t host; };

/* fabric_engine._prepare's per-access columns in one pass: queue numbers, sizes (at least 1),
 * issue stamps (insn x factor, rounded to nearest) and the module, by address_map.interleave's
 * rule on the offset from `base`. Returns the largest host, or -1 when an address lies below
 * `base`; *max_insn gets the largest stamp for the caller's overflow check. */
int64_t decode(int64_t n, const struct record *rec, uint64_t base, int64_t granularity, int32_t modules,
               int64_t whole, double factor, int32_t *host, int32_t *module, int32_t *size, uint8_t *write,
               int64_t *stamp, uint64_t *max_insn)
{
    int64_t top = 0;
    uint64_t low = UINT64_MAX, most = 0;
    int pow2 = !(granularity & (granularity - 1)) && !(modules & (modules - 1));
    int shift = __builtin_ctzll((uint64_t)granularity);
    for (int64_t i = 0; i < n; i++) {
        const struct record *r = &rec[i];
        uint64_t granule = pow2 ? (r->hpa - base) >> shift : (r->hpa - base) / (uint64_t)granularity;
        low = r->hpa < low ? r->hpa : low;
        most = r->insn > most ? r->insn : most;
        host[i] = r->host;
        top = r->host > top ? r->host : top;
        module[i] = (int32_t)(pow2 ? granule & (uint64_t)(modules - 1) : granule % (uint64_t)modules);
        size[i] = r->size ? (int32_t)r->size : 1;
        write[i] = r->write != 0;
        stamp[i] = whole ? (int64_t)r->insn * whole : (int64_t)rint((double)r->insn * factor);
    }
    *max_insn = most;
    return n && low < base ? -1 : top;
}
