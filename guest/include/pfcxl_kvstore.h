/*
 * pfcxl_kvstore.h: the KV block store's C core (docs/kvstore.md), the same layout and protocol as
 * guest/python/pfcxl_kvstore.py: a superblock, one header line per host, one index segment of
 * 64-byte records per host, one arena per host. A host writes only its own header, segment and
 * arena; readers verify a record and its block before using them. Include after pfcxl_tool.h
 * (crc tables, die); call crc_init() first.
 */
#ifndef PFCXL_KVSTORE_H
#define PFCXL_KVSTORE_H

#define KV_MAGIC "PFKVSTOR"
#define KV_VERSION 1u
#define KV_LINE 64u
#define KV_SIGNED 44u  /* the record crc covers bytes [0, 44): state, key, offset, length, crc */
#define KV_PAGE 4096u
/* The store's device byte (pfcxl_kvlayout.HOME, docs/kvstore.md): the direct path's devdax data
 * starts at the 2 MiB alignment, so a store there survives a direct boot and is byte 0 of a
 * direct device. A CXL DAX device or a file holds it at byte KV_HOME, a direct device at 0. */
#define KV_HOME PFCXL_DAX_ALIGN
#define KV_NFIT "ACPI0012" /* the ACPI NVDIMM root device: direct DAX devices sit under it */

/* Superblock: field offsets (little-endian, as pfcxl_kvstore.SUPER packs them). */
struct kv_super {
    char magic[8];
    uint32_t version, hosts, slots, chunk_tokens;
    uint64_t headers_off, index_off, arena_off, arena_bytes, total;
    uint32_t crc;
} __attribute__((packed));

struct kv_header {  /* one per host, written by that host only */
    uint64_t heartbeat, next_seq, clock, evictions;
};

struct kv_record {  /* state: 0 empty, 2*seq+1 claim, 2*seq published */
    uint64_t state;
    uint8_t key[16];
    uint64_t offset, length;
    uint32_t crc, rcrc;
    uint64_t last_use, reserved;
};

_Static_assert(sizeof(struct kv_record) == KV_LINE, "one record per cache line");
_Static_assert(sizeof(struct kv_super) == 68, "superblock as the Python side packs it");

struct kv {
    char *base;
    uint64_t size;
    struct kv_super sb;
    int host;          /* -1: read only */
    double stale_s;
};

/* ------------------------------------------------------------ BLAKE2b-128 of a key (RFC 7693) */

static const uint64_t KV_B2_IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};
static const uint8_t KV_B2_SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static inline uint64_t kv_rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static inline void kv_b2_compress(uint64_t h[8], const uint8_t block[128], uint64_t t, int last)
{
    uint64_t v[16], m[16];
    memcpy(m, block, 128);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = KV_B2_IV[i];
    }
    v[12] ^= t;
    if (last)
        v[14] = ~v[14];
#define KV_G(a, b, c, d, x, y)                                                                    \
    do {                                                                                          \
        v[a] += v[b] + (x); v[d] = kv_rotr(v[d] ^ v[a], 32); v[c] += v[d];                        \
        v[b] = kv_rotr(v[b] ^ v[c], 24); v[a] += v[b] + (y); v[d] = kv_rotr(v[d] ^ v[a], 16);     \
        v[c] += v[d]; v[b] = kv_rotr(v[b] ^ v[c], 63);                                            \
    } while (0)
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = KV_B2_SIGMA[r];
        KV_G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        KV_G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        KV_G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        KV_G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        KV_G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        KV_G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        KV_G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        KV_G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
#undef KV_G
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

/* The 16 bytes the index holds for a key: BLAKE2b with a 16-byte digest, no key (as Python's
 * hashlib.blake2b(key, digest_size=16)). */
static inline void kv_digest(const void *key, size_t len, uint8_t out[16])
{
    uint64_t h[8];
    uint8_t block[128];
    const uint8_t *p = key;
    memcpy(h, KV_B2_IV, sizeof h);
    h[0] ^= 0x01010000ULL ^ 16;
    uint64_t t = 0;
    while (len > 128) {
        t += 128;
        kv_b2_compress(h, p, t, 0);
        p += 128;
        len -= 128;
    }
    memset(block, 0, sizeof block);
    memcpy(block, p, len);
    kv_b2_compress(h, block, t + len, 1);
    memcpy(out, h, 16);
}

/* ------------------------------------------------------------ crc32 of any length, fences */

static inline uint32_t kv_crc(const volatile void *data, uint64_t len)
{
    const volatile uint8_t *p = data;
    uint32_t state = 0xFFFFFFFFu;
    uint64_t i = 0;
    for (; i < len && ((uintptr_t)(p + i) & 7); i++)
        state = crc_tab[0][(state ^ p[i]) & 0xff] ^ (state >> 8);
    for (; i + 8 <= len; i += 8)
        state = crc_word(state, *(const volatile uint64_t *)(p + i));
    for (; i < len; i++)
        state = crc_tab[0][(state ^ p[i]) & 0xff] ^ (state >> 8);
    return ~state;
}

/* Full fence, then write the line back (x86): the claim must be visible before we scan, and the
 * published record must follow its block. */
static inline void kv_fence(volatile void *line)
{
    __sync_synchronize();
#if defined(__x86_64__) || defined(__i386__)
    if (line)
        __asm__ volatile("clflush %0" : "+m"(*(volatile char *)line) : : "memory");
    __asm__ volatile("mfence" : : : "memory");
#else
    (void)line;
#endif
}

/* ------------------------------------------------------------ addresses */

static inline volatile struct kv_header *kv_hdr(const struct kv *s, int host)
{
    return (volatile struct kv_header *)(s->base + s->sb.headers_off + (uint64_t)host * KV_LINE);
}

static inline volatile struct kv_record *kv_rec(const struct kv *s, int host, uint32_t slot)
{
    return (volatile struct kv_record *)(s->base + s->sb.index_off +
                                         ((uint64_t)host * s->sb.slots + slot) * KV_LINE);
}

static inline uint64_t kv_arena(const struct kv *s, int host)
{
    return s->sb.arena_off + (uint64_t)host * s->sb.arena_bytes;
}

/* 1 if the device is a direct-path DAX device (an NVDIMM namespace under the ACPI NFIT). */
static inline int kv_is_direct(const struct stat *st)
{
    char link[64], node[PATH_MAX];
    if (!S_ISCHR(st->st_mode))
        return 0;
    snprintf(link, sizeof link, "/sys/dev/char/%u:%u", major(st->st_rdev), minor(st->st_rdev));
    return realpath(link, node) && strstr(node, "/" KV_NFIT ":") != NULL;
}

static const char KV_NO_STORE[] = "holds no store";

/* Open the store in [base, base+size); returns NULL, KV_NO_STORE (no magic at base), or a
 * message naming what is wrong. */
static inline const char *kv_attach(struct kv *s, void *base, uint64_t size, int host)
{
    static char why[160];
    s->base = base;
    s->size = size;
    s->host = host;
    s->stale_s = 5.0;
    memcpy(&s->sb, base, sizeof s->sb);
    if (memcmp(s->sb.magic, KV_MAGIC, 8) != 0)
        return KV_NO_STORE;
    if (s->sb.version != KV_VERSION || kv_crc(base, sizeof s->sb - 4) != s->sb.crc)
        return "store superblock is not version 1 with a good crc";
    if (s->sb.total > size) {
        snprintf(why, sizeof why, "store was formatted for %" PRIu64 " bytes; the mapping has %" PRIu64,
                 s->sb.total, size);
        return why;
    }
    if (host >= (int)s->sb.hosts) {
        snprintf(why, sizeof why, "host %d is out of range (0 <= host < %u)", host, s->sb.hosts);
        return why;
    }
    return NULL;
}

/* ------------------------------------------------------------ reading */

/* A snapshot of (host, slot) if it is published and well formed. */
static inline int kv_valid(const struct kv *s, int host, uint32_t slot, struct kv_record *out)
{
    const volatile uint64_t *r = (const volatile uint64_t *)kv_rec(s, host, slot);
    uint64_t words[KV_LINE / 8];
    for (unsigned i = 0; i < KV_LINE / 8; i++)
        words[i] = r[i];
    memcpy(out, words, sizeof words);
    if (out->state == 0 || (out->state & 1))
        return 0;
    if (kv_crc(out, KV_SIGNED) != out->rcrc)
        return 0;
    uint64_t lo = kv_arena(s, host), hi = lo + s->sb.arena_bytes;
    return out->offset >= lo && out->length <= hi - out->offset;
}

static inline int kv_key_is(const struct kv *s, int host, uint32_t slot, const uint8_t d[16])
{
    volatile struct kv_record *r = kv_rec(s, host, slot);
    const volatile uint64_t *k = (const volatile uint64_t *)r->key;
    uint64_t a, b;
    memcpy(&a, d, 8);
    memcpy(&b, d + 8, 8);
    return k[0] == a && k[1] == b;
}

/* First published record of d: 1 and (*host, *slot, *rec), or 0. */
static inline int kv_find(const struct kv *s, const uint8_t d[16], int *host, uint32_t *slot,
                          struct kv_record *rec)
{
    for (int h = 0; h < (int)s->sb.hosts; h++)
        for (uint32_t i = 0; i < s->sb.slots; i++)
            if (kv_key_is(s, h, i, d) && kv_valid(s, h, i, rec)) {
                *host = h;
                *slot = i;
                return 1;
            }
    return 0;
}

/* Copy the block into buf (rec->length bytes) and accept it only if its crc matches and the
 * record's state did not change meanwhile. */
static inline int kv_read(const struct kv *s, int host, uint32_t slot, const struct kv_record *rec,
                          void *buf)
{
    memcpy(buf, s->base + rec->offset, rec->length);
    kv_fence(NULL);
    return kv_crc(buf, rec->length) == rec->crc && kv_rec(s, host, slot)->state == rec->state;
}

/* ------------------------------------------------------------ writing (own arena) */

static inline void kv_beat(struct kv *s) { kv_hdr(s, s->host)->heartbeat++; }

/* Withdraw our claims left by a crash; records that fail their check are dropped too. */
static inline void kv_recover(struct kv *s)
{
    struct kv_record rec;
    for (uint32_t i = 0; i < s->sb.slots; i++) {
        volatile struct kv_record *r = kv_rec(s, s->host, i);
        if (r->state && !kv_valid(s, s->host, i, &rec)) {
            r->state = 0;
            kv_fence(r);
        }
    }
}

/* A free slot and extent of len bytes in our arena, evicting least recently used records. The
 * own segment is read once per attempt into local memory: on the CXL path every load of the
 * device is an emulator callback, and first fit walks the records many times. */
static inline int kv_place(struct kv *s, uint64_t len, uint32_t *slot, uint64_t *offset)
{
    const uint64_t lo = kv_arena(s, s->host), hi = lo + s->sb.arena_bytes;
    if (len > hi - lo)
        return -1;
    struct kv_record *snap = malloc(s->sb.slots * sizeof *snap);
    uint8_t *live = malloc(s->sb.slots);
    if (!snap || !live)
        die("out of memory for %u index records", s->sb.slots);
    for (;;) {
        int64_t free_slot = -1, lru = -1;
        uint64_t lru_use = UINT64_MAX, at = lo;
        for (uint32_t i = 0; i < s->sb.slots; i++) {
            live[i] = (uint8_t)kv_valid(s, s->host, i, &snap[i]);
            if (snap[i].state == 0 && free_slot < 0)
                free_slot = i;
            if (live[i] && snap[i].last_use < lru_use) {
                lru_use = snap[i].last_use;
                lru = i;
            }
        }
        for (;;) { /* first fit: the next extent at or after `at`, in offset order */
            uint64_t next = hi, next_end = hi;
            for (uint32_t i = 0; i < s->sb.slots; i++)
                if (live[i] && snap[i].offset >= at && snap[i].offset < next) {
                    next = snap[i].offset;
                    next_end = (next + snap[i].length + KV_LINE - 1) & ~(uint64_t)(KV_LINE - 1);
                }
            if (next - at >= len || next == hi)
                break;
            at = next_end;
        }
        if ((free_slot >= 0 && hi - at >= len) || lru < 0) {
            free(snap);
            free(live);
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
            for (uint32_t i = 0; i < s->sb.slots; i++) {
                if (!kv_key_is(s, h, i, d))
                    continue;
                struct kv_record rec;
                uint64_t st = kv_rec(s, h, i)->state;
                if (st && !(st & 1)) {
                    if (kv_valid(s, h, i, &rec))
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

/* Store len bytes under d: 1 stored, 0 already there or lost the race, -1 does not fit. */
static inline int kv_put(struct kv *s, const uint8_t d[16], const void *data, uint64_t len)
{
    int h;
    uint32_t slot;
    struct kv_record rec;
    if (kv_find(s, d, &h, &slot, &rec))
        return 0;
    uint64_t offset;
    if (kv_place(s, len, &slot, &offset) != 0)
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
    r->state = rec.state;
    kv_fence(r);
    return 1;
}

#endif
