/*
 * pfcxl_kvwrite.h: the KV block store's writing side (docs/kvstore.md, "Storing" and "One writer per
 * host"), the same protocol as guest/python/pfcxl_kvstore.py: the host's lease, recovery of its own
 * claims, placement in its own arena, the claim contention and the publishing put. A host writes
 * only its own header, segment and arena. Include after pfcxl_kvstore.h.
 */
#ifndef PFCXL_KVWRITE_H
#define PFCXL_KVWRITE_H

static inline void kv_beat(struct kv *s) { kv_hdr(s, s->host)->heartbeat++; }

static inline void kv_sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
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
    while (held && (double)(now_ns() - t0) < s->stale_s * 1e9) {
        kv_sleep_ms(10);
        if (h->lease == 0)
            break; /* closed meanwhile */
        if (h->heartbeat != beat || h->lease != held) {
            snprintf(why, sizeof why, "host %d is open for writing by another process (its lease is held and its "
                     "heartbeat moves): close it there, or use another host", s->host);
            return why;
        }
    }
    uint64_t seed = now_ns() ^ ((uint64_t)getpid() << 32);
    const uint64_t mine = splitmix64(&seed) | 1;
    h->lease = mine;
    kv_fence((void *)h);
    kv_sleep_ms(10);
    if (h->lease != mine) {
        snprintf(why, sizeof why, "host %d was opened for writing by another process at the same time; it holds the "
                 "host's lease now", s->host);
        return why;
    }
    s->lease = mine;
    kv_beat(s);
    return NULL;
}

/* Our lease back, if it is still ours. */
static inline void kv_release_lease(struct kv *s)
{
    if (s->lease && kv_hdr(s, s->host)->lease == s->lease) {
        kv_hdr(s, s->host)->lease = 0;
        kv_fence((void *)kv_hdr(s, s->host));
    }
    s->lease = 0;
}

static inline int kv_own_lease(const struct kv *s) { return s->lease && kv_hdr(s, s->host)->lease == s->lease; }

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
 * our published records and our arena's free gaps: the one read of our whole segment. */
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
    for (uint32_t i = 0; i < s->sb.slots; i++) {
        volatile struct kv_record *r = kv_rec(s, s->host, i);
        if (!r->state)
            continue;
        if (!kv_valid(s, s->host, i, &rec, NULL)) {
            r->state = 0;
            kv_fence(r);
            continue;
        }
        s->mine[i] = (struct kv_mine){rec.offset, rec.length, rec.last_use, 1};
        used[n++] = (struct kv_gap){rec.offset, kv_up(rec.offset + rec.length)};
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

/* Our published record in slot i withdrawn (state first: readers re-check it), its space free. */
static inline void kv_withdraw(struct kv *s, uint32_t i)
{
    kv_rec(s, s->host, i)->state = 0;
    kv_fence(kv_rec(s, s->host, i));
    s->mine[i].live = 0;
    kv_give(s, s->mine[i].offset, s->mine[i].length);
}

static inline void kv_evict(struct kv *s, uint32_t i)
{
    kv_withdraw(s, i);
    kv_hdr(s, s->host)->evictions++;
}

/* A hit on our own slot i: most recently used now. */
static inline void kv_touch(struct kv *s, uint32_t i)
{
    const uint64_t clock = ++kv_hdr(s, s->host)->clock;
    kv_rec(s, s->host, i)->last_use = clock;
    s->mine[i].last_use = clock;
    kv_beat(s);
}

/* A free slot in d's window (else the window's least recently used record of ours is evicted)
 * and a free extent of len bytes in our arena (evicting our least recently used records until
 * one exists), as pfcxl_kvstore.Store._place: the window's lines and our own state, never the
 * whole segment. 0, or -1 if it cannot fit. */
static inline int kv_place(struct kv *s, const uint8_t d[16], uint64_t len, uint32_t *slot, uint64_t *offset)
{
    if (len > s->sb.arena_bytes)
        return -1;
    int64_t free_slot = -1, wlru = -1;
    for (uint32_t k = 0; k < kv_window(s) && free_slot < 0; k++) {
        const uint32_t i = kv_probe(s, d, k);
        if (!s->mine[i].live && kv_rec(s, s->host, i)->state == 0)
            free_slot = i;
        else if (s->mine[i].live && (wlru < 0 || s->mine[i].last_use < s->mine[wlru].last_use))
            wlru = i;
    }
    if (free_slot < 0) {
        if (wlru < 0)
            return -1; /* a window of claims only */
        kv_evict(s, (uint32_t)wlru);
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
        kv_evict(s, (uint32_t)lru);
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
                if (!(st & 1))
                    continue;
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
        kv_beat(s);
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
    if (kv_place(s, d, len, &slot, &offset) != 0)
        return -1;
    volatile struct kv_header *hdr = kv_hdr(s, s->host);
    uint64_t seq = ++hdr->next_seq;
    volatile struct kv_record *r = kv_rec(s, s->host, slot);
    memcpy((void *)r->key, d, 16);
    r->state = 2 * seq + 1; /* the claim */
    kv_fence(r);
    if (!alone && !kv_contend(s, d)) {
        r->state = 0;
        kv_fence(r);
        kv_give(s, offset, len);
        return 0;
    }
    for (uint64_t at = 0; at < len; at += 1 << 20) {
        uint64_t n = len - at < (1 << 20) ? len - at : (1 << 20);
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
    rec.last_use = ++hdr->clock;
    uint64_t words[KV_LINE / 8];
    memcpy(words, &rec, sizeof words);
    for (unsigned i = 1; i < KV_LINE / 8; i++)
        ((volatile uint64_t *)r)[i] = words[i];
    kv_fence(NULL); /* block and fields before the state that publishes them */
    if (!kv_own_lease(s))
        return -2;
    r->state = rec.state;
    kv_fence(r);
    s->mine[slot] = (struct kv_mine){offset, len, rec.last_use, 1};
    return 1;
}

#endif
