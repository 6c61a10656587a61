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

/* Withdraw our claims left by a crash; records that fail their check are dropped too. */
static inline void kv_recover(struct kv *s)
{
    struct kv_record rec;
    for (uint32_t i = 0; i < s->sb.slots; i++) {
        volatile struct kv_record *r = kv_rec(s, s->host, i);
        if (r->state && !kv_valid(s, s->host, i, &rec, NULL)) {
            r->state = 0;
            kv_fence(r);
        }
    }
}

struct kv_extent {
    uint64_t lo, hi; /* [lo, hi): a live block, its end rounded up to a line */
};

static inline int kv_extent_cmp(const void *a, const void *b)
{
    const struct kv_extent *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* A free slot and extent of len bytes in our arena, evicting least recently used records. The
 * own segment is read once per attempt into local memory: on the CXL path every load of the
 * device is an emulator callback. First fit walks the live extents in offset order, as the
 * Python side does; an empty block (length 0) takes no room and never holds the walk back. */
static inline int kv_place(struct kv *s, const uint8_t d[16], uint64_t len, uint32_t *slot, uint64_t *offset)
{
    const uint64_t lo = kv_arena(s, s->host), hi = lo + s->sb.arena_bytes;
    if (len > hi - lo)
        return -1;
    struct kv_record *snap = malloc(s->sb.slots * sizeof *snap);
    struct kv_extent *ext = malloc(s->sb.slots * sizeof *ext);
    if (!snap || !ext)
        die("out of memory for %u index records", s->sb.slots);
    for (;;) {
        int64_t free_slot = -1, lru = -1, wlru = -1;
        uint64_t lru_use = UINT64_MAX, at = lo;
        uint32_t n = 0;
        for (uint32_t i = 0; i < s->sb.slots; i++) {
            int live = kv_valid(s, s->host, i, &snap[i], NULL);
            if (!live)
                continue;
            /* offset + length <= hi (kv_valid), and hi is page aligned: no wrap */
            ext[n++] = (struct kv_extent){snap[i].offset,
                                          (snap[i].offset + snap[i].length + KV_LINE - 1) & ~(uint64_t)(KV_LINE - 1)};
            if (snap[i].last_use < lru_use) {
                lru_use = snap[i].last_use;
                lru = i;
            }
        }
        for (uint32_t k = 0; k < kv_window(s) && free_slot < 0; k++) { /* a slot in d's window */
            uint32_t i = kv_probe(s, d, k);
            if (snap[i].state == 0)
                free_slot = i;
            else if (snap[i].state && !(snap[i].state & 1) && (wlru < 0 || snap[i].last_use < snap[wlru].last_use))
                wlru = i;
        }
        if (free_slot < 0 && wlru >= 0)
            lru = wlru; /* a full window: its least recently used record goes first */
        qsort(ext, n, sizeof *ext, kv_extent_cmp);
        for (uint32_t k = 0; k < n; k++) { /* first fit */
            if (ext[k].lo >= at && ext[k].lo - at >= len)
                break;
            if (ext[k].hi > at)
                at = ext[k].hi;
        }
        if ((free_slot >= 0 && hi - at >= len) || lru < 0) {
            free(snap);
            free(ext);
            if (free_slot < 0 || hi - at < len)
                return -1;
            *slot = (uint32_t)free_slot;
            *offset = at;
            return 0;
        }
        kv_rec(s, s->host, (uint32_t)lru)->state = 0; /* before its space is reused */
        kv_fence(kv_rec(s, s->host, (uint32_t)lru));
        kv_hdr(s, s->host)->evictions++;
    }
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
 * lease was taken by another process (nothing published). */
static inline int kv_put(struct kv *s, const uint8_t d[16], const void *data, uint64_t len)
{
    int h;
    uint32_t slot;
    struct kv_record rec;
    if (!kv_own_lease(s))
        return -2;
    kv_beat(s);
    if (kv_find(s, d, &h, &slot, &rec))
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
    if (!kv_contend(s, d)) {
        r->state = 0;
        kv_fence(r);
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
    return 1;
}

#endif
