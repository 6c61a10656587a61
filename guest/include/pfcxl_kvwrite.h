/*
 * pfcxl_kvwrite.h: the KV block store's writing side (docs/kvstore.md, "Storing" and "One writer per
 * host"), the same protocol as guest/python/pfcxl_kvstore.py: the host's lease, recovery of its own
 * claims, placement in its own arena, the claim contention and the publishing put. A host writes
 * only its own header, segment and arena. Include after pfcxl_kvstore.h.
 */
#ifndef PFCXL_KVWRITE_H
#define PFCXL_KVWRITE_H

static inline void kv_sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

#define KV_SETTLE_MS 10      /* a new lease must stand this long (pfcxl_kvstore.SETTLE_S) */
#define KV_WATCH_S 0.5       /* an opener watches a held lease at least this long (WATCH_S) */
#define KV_RECHECK_NS 250000000ULL /* silent this long, a holder proves its lease again (RECHECK_S) */

/* Is our lease still ours? 0 for good once it is not. A holder silent for KV_RECHECK_NS (stopped,
 * starved) may have been judged dead by an opener that has not yet written its nonce: it beats,
 * waits 2 settle periods for such a nonce and looks again (as pfcxl_kvstore.Store._confirm). */
static inline int kv_confirm(struct kv *s)
{
    volatile struct kv_header *h = kv_hdr(s, s->host);
    if (s->lost || !s->lease || h->lease != s->lease) {
        s->lost = 1;
        return 0;
    }
    const uint64_t now = now_ns();
    if (now - s->alive_ns > KV_RECHECK_NS) {
        h->heartbeat++;
        kv_fence((void *)h);
        kv_sleep_ms(2 * KV_SETTLE_MS);
        if (h->lease != s->lease) {
            s->lost = 1;
            return 0;
        }
    }
    if (now > s->alive_ns)
        s->alive_ns = now;
    return 1;
}

/* Before every write to shared state: 1 if the lease is still ours. A write to index slot `slot`
 * (>= 0; or to the extent its record names) is announced in our header's intent first: a process
 * that takes the host over while we are stopped between the check and the write never reuses that
 * slot or extent (kv_recover), so the one write we may still make after resuming lands on nothing
 * of theirs (docs/kvstore.md, "A holder that resumes"). */
static inline int kv_may_write(struct kv *s, int64_t slot)
{
    if (slot >= 0) {
        if (!kv_confirm(s))
            return 0;
        kv_hdr(s, s->host)->intent = (uint64_t)slot + 1;
    }
    if (!kv_confirm(s))
        return 0;
    kv_before_write();
    return 1;
}

/* Alive: a waiting lower host must not think us dead. Nothing once the lease is gone. */
static inline void kv_beat(struct kv *s)
{
    if (kv_may_write(s, -1))
        kv_hdr(s, s->host)->heartbeat++;
}

/* Become the host's one writer (docs/kvstore.md, "One writer per host"), as the Python side does:
 * a lease held by a live process (its heartbeat moves within stale_s) refuses us, a dead holder's
 * expires after stale_s; then our nonce must stand for 10 ms. NULL, or why not. */
static inline const char *kv_take_lease(struct kv *s)
{
    static char why[200];
    volatile struct kv_header *h = kv_hdr(s, s->host);
    if (h->next_seq >= 1ULL << 62) {
        snprintf(why, sizeof why, "host %d's header is corrupt: next_seq %" PRIu64 " is beyond 2^62; format the "
                 "store anew", s->host, h->next_seq);
        return why;
    }
    const uint64_t held = h->lease, beat = h->heartbeat, t0 = now_ns();
    const double watch = s->stale_s > KV_WATCH_S ? s->stale_s : KV_WATCH_S; /* a few beat periods at least */
    while (held && (double)(now_ns() - t0) < watch * 1e9) {
        kv_sleep_ms(10);
        if (h->lease == 0)
            break; /* closed meanwhile */
        if (h->heartbeat != beat || h->lease != held) {
            snprintf(why, sizeof why, "host %d is open for writing by another process (its lease is held and its "
                     "heartbeat moves): close it there, or use another host", s->host);
            return why;
        }
    }
    const int taken = held && h->lease != 0; /* from a holder that did not close */
    uint64_t seed = now_ns() ^ ((uint64_t)getpid() << 32);
    const uint64_t mine = splitmix64(&seed) | 1;
    h->lease = mine;
    kv_fence((void *)h);
    kv_sleep_ms(KV_SETTLE_MS);
    if (h->lease != mine) {
        snprintf(why, sizeof why, "host %d was opened for writing by another process at the same time; it holds the "
                 "host's lease now", s->host);
        return why;
    }
    s->lease = mine;
    s->lost = 0;
    /* an earlier holder (stopped, say) may have picked next_seq + 1 without writing it: skip it */
    s->seq = h->next_seq + 1;
    h->lease_seq = s->seq + 1;
    if (taken) /* its last announced slot: it may be stopped just before writing there */
        h->blocked = h->intent;
    h->heartbeat++;
    s->alive_ns = now_ns();
    return NULL;
}

/* Our lease back, if it is still ours. */
static inline void kv_release_lease(struct kv *s)
{
    if (s->lease && kv_confirm(s)) {
        kv_hdr(s, s->host)->lease = 0;
        kv_fence((void *)kv_hdr(s, s->host));
    }
    s->lease = 0;
}

static inline int kv_own_lease(struct kv *s) { return kv_confirm(s); }

/* ------------------------------------------------------------ our arena's free gaps
 * As pfcxl_kvarena.Arena: a list of free gaps, first fit, adjacent gaps merged when nothing fits,
 * so that the C and Python writers place blocks alike. */

static inline uint64_t kv_up(uint64_t n) { return (n + KV_LINE - 1) & ~(uint64_t)(KV_LINE - 1); }

static inline void kv_gap_add(struct kv *s, uint64_t lo, uint64_t hi)
{
    if (s->ngaps == s->gaps_cap) {
        s->gaps_cap = s->gaps_cap ? 2 * s->gaps_cap : 64;
        s->gaps = realloc(s->gaps, s->gaps_cap * sizeof *s->gaps);
        if (!s->gaps)
            die("out of memory for %u free gaps", s->gaps_cap);
    }
    s->gaps[s->ngaps++] = (struct kv_gap){lo, hi};
}

static inline int kv_gap_cmp(const void *a, const void *b)
{
    const struct kv_gap *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static inline void kv_gaps_merge(struct kv *s)
{
    qsort(s->gaps, s->ngaps, sizeof *s->gaps, kv_gap_cmp);
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->ngaps; i++) {
        if (n && s->gaps[n - 1].hi == s->gaps[i].lo)
            s->gaps[n - 1].hi = s->gaps[i].hi;
        else
            s->gaps[n++] = s->gaps[i];
    }
    s->ngaps = n;
    s->merged = 1;
}

/* A line-aligned offset with len free bytes from it, now used; 0 if no gap fits (the arena
 * never starts at byte 0 of the store). */
static inline uint64_t kv_take(struct kv *s, uint64_t len)
{
    const uint64_t need = kv_up(len);
    if (need == 0)
        return kv_arena(s, s->host); /* an empty block takes no room */
    for (;;) {
        for (uint32_t i = 0; i < s->ngaps; i++) {
            struct kv_gap *g = &s->gaps[i];
            if (g->hi - g->lo < need)
                continue;
            const uint64_t at = g->lo;
            if (g->hi - g->lo == need)
                memmove(g, g + 1, (s->ngaps-- - i - 1) * sizeof *g);
            else
                g->lo += need;
            return at;
        }
        if (s->merged)
            return 0;
        kv_gaps_merge(s);
    }
}

static inline void kv_give(struct kv *s, uint64_t offset, uint64_t len)
{
    if (kv_up(offset + len) > offset) {
        kv_gap_add(s, offset, kv_up(offset + len));
        s->merged = 0;
    }
}

/* Withdraw our claims left by a crash (records that fail their check are dropped too), and learn
 * our published records and our arena's free gaps: the one read of our whole segment. The header's
 * blocked slot is not ours: a holder that lost the host may be stopped just before writing it (or
 * the extent its record names), and write it once when it resumes; it is never used, and the
 * extent it names never reused (as pfcxl_kvstore.Store._recover). */
static inline void kv_recover(struct kv *s)
{
    struct kv_record rec;
    free(s->mine);
    s->mine = calloc(s->sb.slots, sizeof *s->mine);
    if (!s->mine)
        die("out of memory for %u index records", s->sb.slots);
    struct kv_gap *used = malloc(((uint64_t)s->sb.slots + 1) * sizeof *used);
    if (!used)
        die("out of memory for %u extents", s->sb.slots);
    uint32_t n = 0;
    const uint64_t blocked = kv_hdr(s, s->host)->blocked, lo = kv_arena(s, s->host), top = lo + s->sb.arena_bytes;
    s->blocked = blocked >= 1 && blocked <= s->sb.slots ? (int64_t)blocked - 1 : -1;
    for (uint32_t i = 0; i < s->sb.slots; i++) {
        volatile struct kv_record *r = kv_rec(s, s->host, i);
        if ((int64_t)i == s->blocked) {
            const uint64_t o = r->offset, len = r->length;
            if (o >= lo && o <= top && len <= top - o)
                used[n++] = (struct kv_gap){o, kv_up(o + len)};
        }
        if (!r->state)
            continue;
        if (!kv_valid(s, s->host, i, &rec, NULL)) {
            if (kv_may_write(s, i)) {
                r->state = 0;
                kv_fence(r);
            }
            continue;
        }
        if ((int64_t)i != s->blocked) {
            s->mine[i] = (struct kv_mine){rec.offset, rec.length, rec.last_use, rec.state, 1};
            used[n++] = (struct kv_gap){rec.offset, kv_up(rec.offset + rec.length)};
        }
    }
    qsort(used, n, sizeof *used, kv_gap_cmp);
    s->ngaps = 0;
    uint64_t at = kv_arena(s, s->host);
    const uint64_t hi = at + s->sb.arena_bytes;
    for (uint32_t k = 0; k < n; k++) {
        if (used[k].lo > at)
            kv_gap_add(s, at, used[k].lo);
        if (used[k].hi > at)
            at = used[k].hi;
    }
    if (at < hi)
        kv_gap_add(s, at, hi);
    s->merged = 1;
    free(used);
}

/* Our published record in slot i withdrawn (state first: readers re-check it), its space free:
 * 0, or -2 if our lease is gone (nothing written). */
static inline int kv_withdraw(struct kv *s, uint32_t i)
{
    if (!kv_may_write(s, i))
        return -2;
    kv_rec(s, s->host, i)->state = 0;
    kv_fence(kv_rec(s, s->host, i));
    s->mine[i].live = 0;
    kv_give(s, s->mine[i].offset, s->mine[i].length);
    return 0;
}

static inline int kv_evict(struct kv *s, uint32_t i)
{
    if (kv_withdraw(s, i) || !kv_may_write(s, -1))
        return -2;
    kv_hdr(s, s->host)->evictions++;
    return 0;
}

/* A hit on our record `state` in our slot i: most recently used now. Not if the slot holds another
 * record than ours (one we do not own), nor once our lease is gone. */
static inline void kv_touch(struct kv *s, uint32_t i, uint64_t state)
{
    if (!s->mine[i].live || s->mine[i].state != state || !kv_may_write(s, -1))
        return;
    const uint64_t clock = ++kv_hdr(s, s->host)->clock;
    kv_rec(s, s->host, i)->last_use = clock;
    s->mine[i].last_use = clock;
    kv_beat(s);
}

/* A free slot in d's window (else the window's least recently used record of ours is evicted)
 * and a free extent of len bytes in our arena (evicting our least recently used records until
 * one exists), as pfcxl_kvstore.Store._place: the window's lines and our own state, never the
 * whole segment. 0, -1 if it cannot fit, or -2 if our lease is gone. */
static inline int kv_place(struct kv *s, const uint8_t d[16], uint64_t len, uint32_t *slot, uint64_t *offset)
{
    if (len > s->sb.arena_bytes)
        return -1;
    int64_t free_slot = -1, wlru = -1;
    for (uint32_t k = 0; k < kv_window(s) && free_slot < 0; k++) {
        const uint32_t i = kv_probe(s, d, k);
        if (!s->mine[i].live && (int64_t)i != s->blocked && kv_rec(s, s->host, i)->state == 0)
            free_slot = i;
        else if (s->mine[i].live && (wlru < 0 || s->mine[i].last_use < s->mine[wlru].last_use))
            wlru = i;
    }
    if (free_slot < 0) {
        if (wlru < 0)
            return -1; /* a window of claims only */
        if (kv_evict(s, (uint32_t)wlru))
            return -2;
        free_slot = wlru;
    }
    uint64_t at;
    while ((at = kv_take(s, len)) == 0) {
        int64_t lru = -1;
        for (uint32_t i = 0; i < s->sb.slots; i++) /* our own state, in local memory */
            if (s->mine[i].live && (lru < 0 || s->mine[i].last_use < s->mine[lru].last_use))
                lru = i;
        if (lru < 0)
            return -1;
        if (kv_evict(s, (uint32_t)lru))
            return -2;
    }
    *slot = (uint32_t)free_slot;
    *offset = at;
    return 0;
}

/* After our claim: may we write? (docs/kvstore.md, "Contention") */
static inline int kv_contend(struct kv *s, const uint8_t d[16])
{
    enum { WATCH = 64 };
    struct { int host; uint32_t slot; uint64_t beat; uint64_t since; } w[WATCH];
    int nw = 0;
    for (;;) {
        int pending = 0;
        for (int h = 0; h < (int)s->sb.hosts; h++) {
            if (h == s->host)
                continue;
            for (uint32_t k = 0, i; k < kv_window(s); k++) {
                if (!kv_key_is(s, h, i = kv_probe(s, d, k), d))
                    continue;
                struct kv_record rec;
                uint64_t st = kv_rec(s, h, i)->state;
                if (st && !(st & 1)) {
                    if (kv_valid(s, h, i, &rec, d))
                        return 0;
                    continue;
                }
                if (!(st & 1) || st >> 1 < kv_hdr(s, h)->lease_seq)
                    continue; /* no claim, or an earlier holder's of that host: dead */
                uint64_t beat = kv_hdr(s, h)->heartbeat, now = now_ns();
                int k = 0;
                while (k < nw && !(w[k].host == h && w[k].slot == i))
                    k++;
                if (k == nw) {
                    if (nw == WATCH)
                        die("more than %d concurrent claims on one key", WATCH);
                    w[nw++] = (typeof(w[0])){h, i, beat, now};
                    pending = 1;
                } else if (w[k].beat != beat) {
                    if (h < s->host)
                        return 0; /* a live lower claimant wins */
                    w[k].beat = beat;
                    w[k].since = now;
                    pending = 1;
                } else if ((double)(now - w[k].since) < s->stale_s * 1e9)
                    pending = 1;
            }
        }
        if (!pending)
            return 1;
        if (!kv_may_write(s, -1))
            return -2;
        kv_hdr(s, s->host)->heartbeat++;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

/* Store len bytes under d: 1 stored, 0 already there or lost the race, -1 does not fit, -2 our
 * lease was taken by another process (nothing published). alone: a private cache's put: only our
 * segment is looked at, no rendezvous with others (as Store.put's alone). */
static inline int kv_put(struct kv *s, const uint8_t d[16], const void *data, uint64_t len, int alone)
{
    int h;
    uint32_t slot;
    struct kv_record rec;
    if (!kv_own_lease(s))
        return -2;
    kv_beat(s);
    if (kv_find_in(s, d, alone, &h, &slot, &rec))
        return 0;
    uint64_t offset;
    const int placed = kv_place(s, d, len, &slot, &offset);
    if (placed != 0)
        return placed;
    volatile struct kv_header *hdr = kv_hdr(s, s->host);
    const uint64_t seq = ++s->seq; /* ours, not the header's: a stopped earlier holder may rewrite it */
    if (!kv_may_write(s, -1))
        return -2;
    hdr->next_seq = seq;
    volatile struct kv_record *r = kv_rec(s, s->host, slot);
    if (!kv_may_write(s, slot)) /* the claim names its extent, then its key and state */
        return -2;
    r->offset = offset;
    r->length = len;
    memcpy((void *)r->key, d, 16);
    if (!kv_may_write(s, -1))
        return -2;
    r->state = 2 * seq + 1;
    kv_fence(r);
    const int won = alone ? 1 : kv_contend(s, d);
    if (won < 0 || (!won && !kv_may_write(s, -1)))
        return -2;
    if (!won) {
        r->state = 0;
        kv_fence(r);
        kv_give(s, offset, len);
        return 0;
    }
    for (uint64_t at = 0; at < len; at += 1 << 20) {
        uint64_t n = len - at < (1 << 20) ? len - at : (1 << 20);
        if (!kv_may_write(s, -1))
            return -2;
        memcpy(s->base + offset + at, (const char *)data + at, n);
        kv_beat(s);
    }
    memset(&rec, 0, sizeof rec);
    rec.state = 2 * seq;
    memcpy(rec.key, d, 16);
    rec.offset = offset;
    rec.length = len;
    rec.crc = kv_crc(data, len);
    rec.rcrc = kv_crc(&rec, KV_SIGNED);
    rec.last_use = hdr->clock + 1;
    uint64_t words[KV_LINE / 8];
    memcpy(words, &rec, sizeof words);
    if (!kv_may_write(s, -1))
        return -2;
    for (unsigned i = 1; i < KV_LINE / 8; i++)
        ((volatile uint64_t *)r)[i] = words[i];
    kv_fence(NULL); /* block and fields before the state that publishes them */
    if (!kv_may_write(s, -1)) /* a second writer of this host: publish nothing */
        return -2;
    r->state = rec.state;
    kv_fence(r);
    if (!kv_may_write(s, -1))
        return -2;
    hdr->clock = rec.last_use;
    s->mine[slot] = (struct kv_mine){offset, len, rec.last_use, rec.state, 1};
    return 1;
}

#endif
