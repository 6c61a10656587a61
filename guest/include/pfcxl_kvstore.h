/*
 * pfcxl_kvstore.h: the KV block store's C core (docs/kvstore.md), the same layout and protocol as
 * guest/python/pfcxl_kvstore.py: a superblock, one header line per host, one index segment of
 * 64-byte records per host, one arena per host. A host writes only its own header, segment and
 * arena; readers verify a record and its block before using them. This file: the layout, opening
 * and reading; pfcxl_kvwrite.h: writing. Include after pfcxl_tool.h (crc tables, die); call
 * crc_init() first.
 */
#ifndef PFCXL_KVSTORE_H
#define PFCXL_KVSTORE_H

#define KV_MAGIC "PFKVSTOR"
#define KV_VERSION 3u /* 2: the host header's lease; 3: each index segment a hash table */
/* A key's record lives in one of the KV_WINDOW slots from its bucket on, cyclically
 * (pfcxl_kvlayout.WINDOW): a lookup reads those lines of each host's segment, whatever the slots. */
#define KV_WINDOW 16u
#define KV_MAX_HOSTS 256u
#define KV_MAX_SLOTS (1u << 24)
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

struct kv_header {  /* one per host, written by that host only; lease: its writer's nonce */
    uint64_t heartbeat, next_seq, clock, evictions, lease;
    uint64_t lease_seq; /* the holder's first sequence number: a claim below it is an earlier holder's */
    uint64_t intent;    /* 1 + the slot the holder writes (or fills the extent of) next */
    uint64_t blocked;   /* 1 + the slot a holder that lost the host may still write once: never used */
};
_Static_assert(sizeof(struct kv_header) == KV_LINE, "one header per cache line");

struct kv_record {  /* state: 0 empty, 2*seq+1 claim, 2*seq published */
    uint64_t state;
    uint8_t key[16];
    uint64_t offset, length;
    uint32_t crc, rcrc;
    uint64_t last_use, reserved;
};

_Static_assert(sizeof(struct kv_record) == KV_LINE, "one record per cache line");
_Static_assert(sizeof(struct kv_super) == 68, "superblock as the Python side packs it");

struct kv_mine {    /* one slot of our own segment, as its only writer last wrote it */
    uint64_t offset, length, last_use, state;
    int live;          /* a published record of ours */
};

struct kv_gap {
    uint64_t lo, hi;   /* [lo, hi): free bytes of our arena, line aligned */
};

struct kv {
    char *base;
    uint64_t size;
    struct kv_super sb;
    int host;          /* -1: read only */
    double stale_s;
    uint64_t lease;    /* our nonce in the host's header while we hold its lease */
    uint64_t seq;      /* our last sequence number (the header's may be rewritten by a stopped former holder) */
    uint64_t alive_ns; /* when we last saw our lease hold (kv_confirm) */
    int lost;          /* our lease was taken: we write nothing more */
    int64_t blocked;   /* the slot a former holder may still write (kv_recover), or -1 */
    /* the writer's own state (pfcxl_kvwrite.h, kv_recover), so that a put probes like a lookup
     * instead of reading its whole segment: as pfcxl_kvstore.Store's own, lru and space */
    struct kv_mine *mine;
    struct kv_gap *gaps;
    uint32_t ngaps, gaps_cap;
    int merged;
    uint64_t index_lines; /* index lines lookups read: the index's cost (as Store.index_bytes / 64) */
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

/* BLAKE2b of `len` bytes with an `outlen`-byte digest (1..64), no key (hashlib.blake2b). */
static inline void kv_blake2b(const void *key, size_t len, uint8_t *out, unsigned outlen)
{
    uint64_t h[8];
    uint8_t block[128];
    const uint8_t *p = key;
    memcpy(h, KV_B2_IV, sizeof h);
    h[0] ^= 0x01010000ULL ^ outlen;
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
    memcpy(out, h, outlen);
}

/* The 16 bytes the index holds for a key: BLAKE2b-128 (hashlib.blake2b(key, digest_size=16)). */
static inline void kv_digest(const void *key, size_t len, uint8_t out[16]) { kv_blake2b(key, len, out, 16); }

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

/* The superblock's geometry, as pfcxl_kvlayout.check_super checks it (same rules, same order,
 * same words): every sum below is of values already bounded by the store's total. */
static inline const char *kv_check_super(const struct kv_super *sb, char *why, size_t n)
{
    const uint64_t t = sb->total, hosts = sb->hosts;
    const char *field = NULL, *want = NULL;
    uint64_t value = 0;
#define KV_RULE(name, ok, text)                                                                   \
    if (!field && !(ok)) {                                                                        \
        field = #name;                                                                            \
        value = sb->name;                                                                         \
        want = text;                                                                              \
    }
    KV_RULE(hosts, hosts >= 1 && hosts <= KV_MAX_HOSTS, "1..256")
    KV_RULE(slots, sb->slots >= 1 && sb->slots <= KV_MAX_SLOTS, "1..16777216")
    KV_RULE(chunk_tokens, sb->chunk_tokens >= 1, "at least 1")
    KV_RULE(total, t >= 2 * KV_PAGE, "at least 8192")
    KV_RULE(headers_off, sb->headers_off >= KV_PAGE && sb->headers_off <= t && sb->headers_off % KV_LINE == 0,
            "a multiple of 64 from byte 4096, inside the store")
    KV_RULE(index_off, sb->index_off >= sb->headers_off + hosts * KV_LINE && sb->index_off <= t &&
            sb->index_off % KV_LINE == 0, "a multiple of 64 after the host headers, inside the store")
    KV_RULE(arena_off, sb->arena_off >= sb->index_off + hosts * sb->slots * KV_LINE && sb->arena_off <= t &&
            sb->arena_off % KV_PAGE == 0, "a multiple of 4096 after the index, inside the store")
    KV_RULE(arena_bytes, sb->arena_bytes >= KV_PAGE && sb->arena_bytes % KV_PAGE == 0 &&
            sb->arena_bytes <= (t - sb->arena_off) / hosts,
            "a multiple of 4096, at least 4096, with every host's arena inside the store")
#undef KV_RULE
    if (!field)
        return NULL;
    snprintf(why, n, "store superblock is corrupt: %s %" PRIu64 " is not %s", field, value, want);
    return why;
}

/* Open the store in [base, base+size); returns NULL, KV_NO_STORE (no magic at base), or a
 * message naming what is wrong. */
static inline const char *kv_attach(struct kv *s, void *base, uint64_t size, int host)
{
    static char why[200];
    s->base = base;
    s->size = size;
    s->host = host;
    s->stale_s = 5.0;
    s->lease = 0;
    s->seq = s->alive_ns = 0;
    s->lost = 0;
    s->blocked = -1;
    s->mine = NULL;
    s->gaps = NULL;
    s->ngaps = s->gaps_cap = 0;
    s->merged = 1;
    s->index_lines = 0;
    memcpy(&s->sb, base, sizeof s->sb);
    if (memcmp(s->sb.magic, KV_MAGIC, 8) != 0)
        return KV_NO_STORE;
    if (s->sb.version != KV_VERSION) {
        snprintf(why, sizeof why, "store version %u is not this code's version %u: format it anew (every block is lost)",
                 s->sb.version, KV_VERSION);
        return why;
    }
    if (kv_crc(base, sizeof s->sb - 4) != s->sb.crc) {
        snprintf(why, sizeof why, "store superblock crc %#x does not match its bytes: the superblock is corrupt",
                 s->sb.crc);
        return why;
    }
    if (s->sb.total > size) {
        snprintf(why, sizeof why, "store was formatted for %" PRIu64 " bytes; the mapping has %" PRIu64,
                 s->sb.total, size);
        return why;
    }
    if (kv_check_super(&s->sb, why, sizeof why))
        return why;
    if (host >= (int)s->sb.hosts) {
        snprintf(why, sizeof why, "host %d is out of range (0 <= host < %u)", host, s->sb.hosts);
        return why;
    }
    return NULL;
}

/* ------------------------------------------------------------ reading */

/* A snapshot of (host, slot) if it is published and well formed (and holds digest d, unless d is
 * NULL): the state word, then the whole record, which must carry that state; kv_read re-reads the
 * state after the block (docs/kvstore.md, "Reading"). The extent check cannot wrap. */
static inline int kv_valid(const struct kv *s, int host, uint32_t slot, struct kv_record *out,
                           const uint8_t *d)
{
    const volatile uint64_t *r = (const volatile uint64_t *)kv_rec(s, host, slot);
    uint64_t words[KV_LINE / 8];
    const uint64_t state = r[0];
    for (unsigned i = 0; i < KV_LINE / 8; i++)
        words[i] = r[i];
    memcpy(out, words, sizeof words);
    if (state == 0 || (state & 1) || out->state != state)
        return 0;
    if (d && memcmp(out->key, d, 16) != 0)
        return 0;
    if (kv_crc(out, KV_SIGNED) != out->rcrc)
        return 0;
    uint64_t lo = kv_arena(s, host), hi = lo + s->sb.arena_bytes;
    return out->offset >= lo && out->offset <= hi && out->length <= hi - out->offset;
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

/* The first slot of d's window: its first 8 bytes (little-endian) modulo the slots. */
static inline uint32_t kv_bucket(const struct kv *s, const uint8_t d[16])
{
    uint64_t v;
    memcpy(&v, d, 8);
    return (uint32_t)(v % s->sb.slots);
}

static inline uint32_t kv_window(const struct kv *s)
{
    return s->sb.slots < KV_WINDOW ? s->sb.slots : KV_WINDOW;
}

/* The k-th slot of d's window. */
static inline uint32_t kv_probe(const struct kv *s, const uint8_t d[16], uint32_t k)
{
    return (uint32_t)(((uint64_t)kv_bucket(s, d) + k) % s->sb.slots);
}

#ifdef KV_TEST_HOOKS
/* Tests only (tests/component/test_kvstore_c.py builds kvstore with -DKV_TEST_HOOKS; the guest's
 * tools never have it): once, between a key's match and the read of its record, say so on
 * descriptor W and wait for a byte on R (PFCXL_KV_TEST_PAUSE="W,R"), so that the test can evict
 * and republish the slot exactly there. */
static inline void kv_after_key_match(void)
{
    static int done;
    const char *fds = getenv("PFCXL_KV_TEST_PAUSE");
    int w, r;
    char byte = 'm';
    if (done || !fds || sscanf(fds, "%d,%d", &w, &r) != 2)
        return;
    done = 1;
    if (write(w, &byte, 1) != 1 || read(r, &byte, 1) != 1)
        die("PFCXL_KV_TEST_PAUSE: the test's pipes are closed");
}
/* Tests only: PFCXL_KV_TEST_STOP=N stops this process (SIGSTOP) after the last lease check before
 * its N-th write to shared state (pfcxl_kvwrite.h, kv_may_write), as a scheduler or a debugger may. */
static inline void kv_before_write(void)
{
    static long n;
    const char *at = getenv("PFCXL_KV_TEST_STOP");
    if (at && ++n == atol(at))
        raise(SIGSTOP);
}
#else
static inline void kv_after_key_match(void) {}
static inline void kv_before_write(void) {}
#endif

/* The first published record of d in host h's window from slot *slot on: 1 and (*slot, *rec),
 * else 0. Counts the window's lines it reads. */
static inline int kv_find_at(struct kv *s, int h, const uint8_t d[16], uint32_t *slot, struct kv_record *rec)
{
    for (uint32_t k = *slot; k < kv_window(s); k++) {
        uint32_t i = kv_probe(s, d, k);
        s->index_lines++;
        if (kv_key_is(s, h, i, d) && (kv_after_key_match(), kv_valid(s, h, i, rec, d))) {
            *slot = k;
            return 1;
        }
    }
    return 0;
}

/* First published record of d (in our own segment only if `alone`): 1 and (*host, *slot, *rec), or 0. */
static inline int kv_find_in(struct kv *s, const uint8_t d[16], int alone, int *host, uint32_t *slot,
                             struct kv_record *rec)
{
    for (int h = alone ? s->host : 0; h < (alone ? s->host + 1 : (int)s->sb.hosts); h++) {
        uint32_t k = 0;
        if (kv_find_at(s, h, d, &k, rec)) {
            *host = h;
            *slot = kv_probe(s, d, k);
            return 1;
        }
    }
    return 0;
}

static inline int kv_find(struct kv *s, const uint8_t d[16], int *host, uint32_t *slot, struct kv_record *rec)
{
    return kv_find_in(s, d, 0, host, slot, rec);
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

#endif
