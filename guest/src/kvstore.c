/*
 * kvstore: the KV block store (docs/kvstore.md) on /dev/daxN.M from the guest, through its C core
 * guest/include/pfcxl_kvstore.h. Same layout as the Python binding and `pfcxl kv` on the host.
 */
#define TOOL_NAME "kvstore"
#include "../include/pfcxl_tool.h"
#include "../include/pfcxl_kvstore.h"
#include "../include/pfcxl_kvwrite.h"
#include "../include/pfcxl_poison.h"

static const char HELP[] =
    "usage: kvstore ACTION DEV [options]\n"
    "  put     --host H --key K --size BYTES [--salt S]   store K's pattern block\n"
    "  get     --key K [--size BYTES --salt S] [--poison-serial N]\n"
    "          load K; with --size, check its pattern\n"
    "  run     --host H --hosts N --blocks B --sizes A,B,... [--timeout S]\n"
    "          store B blocks \"h<H>/b<i>\" (sizes in turn) and the contended key \"shared\"\n"
    "          (salted with H), wait until every host's blocks are there, load them all and\n"
    "          check every byte; \"shared\" must be one host's whole block\n"
    "  verify  [--poison-serial N]                        check every record and block\n"
    "--poison-serial N: also consult the poison list of the memdev with serial N (`cxl list -M -L`,\n"
    "  tracefs mounted): a block overlapping a listed range is a miss (get) or bad (verify). The\n"
    "  region must be that one device, so a device address is a DAX offset. --poison-timeout S:\n"
    "  how long to wait for that list (default 60 s; then an error, exit 2).\n"
    "  bench   --host H --blocks B --size BYTES           store then load (and check) B blocks of one\n"
    "          pattern made before timing, then drop them\n"
    "--stale-ms MS (put, get, run, bench): a held lease, or another host's claim, whose heartbeat stands\n"
    "  still this long is a dead process's (default 5000; a held lease is watched 500 ms at least)\n"
    "--base BYTES|auto (every action): the store's first byte in DEV. auto (the default): 0 on a\n"
    "  direct-path DAX device (an NVDIMM under ACPI0012), 2 MiB on a CXL DAX device or a file: the\n"
    "  store lives at device byte 2 MiB, which the direct path's namespace leaves alone, so both\n"
    "  paths and the host's pool file see one store. A multiple of 4096.\n"
    "A block's bytes: 8-byte words of SplitMix64 seeded with the key's first 8 digest bytes\n"
    "(little-endian) xor salt*0x9E3779B97F4A7C15. Sizes are multiples of 8. Output: one JSON line.\n"
    "*_ns: guest wall-clock time; under QEMU TCG that is emulator time, not fabric latency.\n"
    "exit status: 0 ok; 1 a mismatch, a miss or a bad block; 2 error (one line on stderr).\n";

static struct kv g_kv;
static void *g_map;
static uint64_t g_map_len;
static const char *g_base_arg;     /* --base as given; NULL or "auto": by the device's path */
static struct opt g_stale = {"--stale-ms", 0};
static uint64_t g_dev_off;         /* the device address of the store's byte 0 (the poison list's) */

static void release_lease(void) { kv_release_lease(&g_kv); }

static void open_store(const char *dev, int host)
{
    uint64_t base = 0;
    int automatic = !g_base_arg || !strcmp(g_base_arg, "auto");
    if (!automatic) {
        const struct opt o = {"--base", g_base_arg};
        base = num(&o, 0, 1, 0, UINT64_MAX);
        if (base % KV_PAGE)
            die("--base %" PRIu64 " is not a multiple of %u", base, KV_PAGE);
    }
    struct stat st;
    int fd = open_dev(dev, 1, &st);
    uint64_t size = S_ISCHR(st.st_mode) ? dax_size(dev, &st) : (uint64_t)st.st_size;
    size &= ~(WINDOW_ALIGN - 1);
    if (size < WINDOW_ALIGN)
        die("%s: cannot find its size, or it is under 2 MiB", dev);
    const int direct = kv_is_direct(&st);
    if (automatic)
        base = direct ? 0 : KV_HOME;
    if (base > size - 2 * KV_PAGE)
        die("%s: --base %" PRIu64 " leaves no room for a store in its %" PRIu64 " bytes", dev, base, size);
    g_dev_off = (direct ? KV_HOME : 0) + base;
    uint64_t off;
    g_map = map_window(fd, dev, 0, size, 1, &off, &g_map_len);
    close(fd);
    const char *why = kv_attach(&g_kv, (char *)g_map + base, size - base, host);
    if (why == KV_NO_STORE) {
        const uint64_t other = base ? 0 : KV_HOME; /* the other base a store may have been given */
        if (other + 8 <= size && !memcmp((char *)g_map + other, KV_MAGIC, 8))
            die("%s holds no store (no PFKVSTOR magic at byte %" PRIu64 "); one starts at byte %" PRIu64
                ": open it with --base %" PRIu64, dev, base, other, other);
        die("%s holds no store (no PFKVSTOR magic at byte %" PRIu64 "); format it first", dev, base);
    }
    if (why)
        die("%s %s", dev, why);
    g_kv.stale_s = (double)num(&g_stale, 5000, 0, 1, 3600000) / 1000.0;
    if (host >= 0) {
        if ((why = kv_take_lease(&g_kv)))
            die("%s %s", dev, why);
        atexit(release_lease); /* on every exit, die() included */
        kv_recover(&g_kv);
    }
}

/* kv_put, or one line if the block cannot be stored */
static int put_block(const uint8_t d[16], const void *data, uint64_t size)
{
    int r = kv_put(&g_kv, d, data, size, 0);
    if (r == -1)
        die("block of %" PRIu64 " bytes does not fit in an arena of %" PRIu64 " bytes", size,
            g_kv.sb.arena_bytes);
    if (r == -2)
        die("host %d's lease was taken by another process: this tool no longer writes", g_kv.host);
    return r;
}

static void fill(uint64_t *buf, uint64_t len, const uint8_t d[16], uint64_t salt)
{
    uint64_t seed;
    memcpy(&seed, d, 8);
    seed ^= salt * 0x9E3779B97F4A7C15ULL;
    for (uint64_t i = 0; i < len / 8; i++)
        buf[i] = splitmix64(&seed);
}

/* ------------------------------------------------------------ the device's poison list */

static int poisoned(const struct kv_record *rec)
{
    const uint64_t at = g_dev_off + rec->offset; /* a valid record: inside the mapping */
    for (int i = 0; i < g_npoison; i++) {
        const uint64_t p = g_poison[i][0], n = g_poison[i][1];
        if (p < at + rec->length && (at < p || at - p < n)) /* overlap, without p + n */
            return 1;
    }
    return 0;
}

static void *alloc(uint64_t len)
{
    void *p = malloc(len ? len : 1);
    if (!p)
        die("out of memory for a %" PRIu64 "-byte block", len);
    return p;
}

/* Load key d: 1 hit (block in *out, malloc'd, *len), 0 miss. Our own hits refresh their LRU use. */
static int get(const uint8_t d[16], void **out, uint64_t *len)
{
    int h;
    uint32_t slot;
    struct kv_record rec;
    if (!kv_find(&g_kv, d, &h, &slot, &rec) || poisoned(&rec))
        return 0;
    void *buf = alloc(rec.length);
    if (!kv_read(&g_kv, h, slot, &rec, buf)) {
        free(buf);
        return 0;
    }
    if (h == g_kv.host)
        kv_touch(&g_kv, slot, rec.state);
    *out = buf;
    *len = rec.length;
    return 1;
}

static uint64_t size_of(const struct opt *o)
{
    uint64_t v = num(o, 0, 1, 8, 1ULL << 40);
    if (v % 8)
        die("%s %" PRIu64 " is not a multiple of 8", o->name, v);
    return v;
}

static void need(const struct opt *o)
{
    if (!o->val)
        die("missing required option %s; see kvstore --help", o->name);
}

static int put_pattern(const char *key, uint64_t size, uint64_t salt)
{
    uint8_t d[16];
    kv_digest(key, strlen(key), d);
    uint64_t *buf = alloc(size);
    fill(buf, size, d, salt);
    int r = put_block(d, buf, size);
    free(buf);
    return r;
}

/* 1 if the block equals key's pattern of salt */
static int is_pattern(const char *key, const void *data, uint64_t len, uint64_t salt)
{
    uint8_t d[16];
    kv_digest(key, strlen(key), d);
    uint64_t *want = alloc(len);
    fill(want, len, d, salt);
    int same = memcmp(want, data, len) == 0;
    free(want);
    return same;
}

static int cmd_run(struct opt *o, const char *dev)
{
    /* o: host, hosts, blocks, sizes, timeout */
    need(&o[0]), need(&o[1]), need(&o[2]), need(&o[3]);
    const uint64_t n = num(&o[1], 0, 0, 1, 256), h = num(&o[0], 0, 0, 0, n - 1);
    const uint64_t blocks = num(&o[2], 0, 0, 1, 100000), timeout = num(&o[4], 600, 0, 1, 86400);
    uint64_t sizes[16];
    size_t ns = num_list("--sizes", o[3].val, sizes, 16);
    for (size_t i = 0; i < ns; i++)
        if (!sizes[i] || sizes[i] % 8)
            die("--sizes: %" PRIu64 " is not a positive multiple of 8", sizes[i]);
    open_store(dev, (int)h);
    char key[64];
    uint64_t stored = 0, bytes = 0, t0 = now_ns();
    for (uint64_t i = 0; i < blocks; i++) {
        snprintf(key, sizeof key, "h%" PRIu64 "/b%" PRIu64, h, i);
        stored += (uint64_t)put_pattern(key, sizes[i % ns], 0);
        bytes += sizes[i % ns];
    }
    const uint64_t store_ns = now_ns() - t0;
    const int won = put_pattern("shared", sizes[0], h + 1);
    /* wait for every host's last block: each host stores its blocks in order */
    uint64_t tw = now_ns();
    for (uint64_t k = 0; k < n; k++) {
        snprintf(key, sizeof key, "h%" PRIu64 "/b%" PRIu64, k, blocks - 1);
        uint8_t d[16];
        kv_digest(key, strlen(key), d);
        int hh;
        uint32_t sl;
        struct kv_record rec;
        while (!kv_find(&g_kv, d, &hh, &sl, &rec)) {
            if (now_ns() - tw > timeout * 1000000000ULL)
                die("timeout after %" PRIu64 " s waiting for host %" PRIu64 "'s blocks", timeout, k);
            kv_beat(&g_kv); /* alive while waiting: our lease holds */
            kv_sleep_ms(2);
        }
    }
    const uint64_t wait_ns = now_ns() - tw;
    uint64_t loaded = 0, missing = 0, mismatched = 0, load_bytes = 0, tl = now_ns();
    for (uint64_t k = 0; k < n; k++)
        for (uint64_t i = 0; i < blocks; i++) {
            void *data;
            uint64_t len;
            snprintf(key, sizeof key, "h%" PRIu64 "/b%" PRIu64, k, i);
            uint8_t d[16];
            kv_digest(key, strlen(key), d);
            if (!get(d, &data, &len)) {
                missing++;
                continue;
            }
            loaded++;
            load_bytes += len;
            mismatched += len != sizes[i % ns] || !is_pattern(key, data, len, 0);
            free(data);
        }
    const uint64_t load_ns = now_ns() - tl;
    /* the contended key: whole, and one host's */
    int64_t shared_owner = -1;
    {
        uint8_t d[16];
        void *data;
        uint64_t len;
        kv_digest("shared", 6, d);
        if (get(d, &data, &len)) {
            for (uint64_t k = 0; k < n && shared_owner < 0; k++)
                if (len == sizes[0] && is_pattern("shared", data, len, k + 1))
                    shared_owner = (int64_t)k;
            free(data);
        }
    }
    printf("{\"tool\":\"kvstore\",\"op\":\"run\",\"host\":%" PRIu64 ",\"hosts\":%" PRIu64
           ",\"stored\":%" PRIu64 ",\"stored_bytes\":%" PRIu64 ",\"store_ns\":%" PRIu64
           ",\"wait_ns\":%" PRIu64 ",\"loaded\":%" PRIu64 ",\"loaded_bytes\":%" PRIu64
           ",\"load_ns\":%" PRIu64 ",\"missing\":%" PRIu64 ",\"mismatched\":%" PRIu64
           ",\"shared_won\":%d,\"shared_owner\":%" PRId64 ",\"evictions\":%" PRIu64 "}\n",
           h, n, stored, bytes, store_ns, wait_ns, loaded, load_bytes, load_ns, missing, mismatched,
           won, shared_owner, kv_hdr(&g_kv, (int)h)->evictions);
    finish_output();
    return (missing || mismatched || shared_owner < 0) ? 1 : 0;
}

static int cmd_verify(const char *dev)
{
    open_store(dev, -1);
    uint64_t good = 0, bad = 0, claims = 0;
    for (int h = 0; h < (int)g_kv.sb.hosts; h++)
        for (uint32_t i = 0; i < g_kv.sb.slots; i++) {
            struct kv_record rec;
            uint64_t st = kv_rec(&g_kv, h, i)->state;
            if (!st)
                continue;
            if (st & 1) {
                claims++;
                continue;
            }
            const char *why = NULL;
            if (!kv_valid(&g_kv, h, i, &rec, NULL)) {
                if (kv_rec(&g_kv, h, i)->state != st)
                    continue; /* withdrawn or replaced while we read it */
                why = "record fails its crc or points outside the arena";
            }
            else if (poisoned(&rec))
                why = "poisoned (the device's poison list)";
            else {
                void *buf = alloc(rec.length);
                if (!kv_read(&g_kv, h, i, &rec, buf) && kv_rec(&g_kv, h, i)->state == rec.state)
                    why = "block fails its crc";
                free(buf);
            }
            if (!why) {
                good++;
                continue;
            }
            bad++;
            fprintf(stderr, "kvstore: bad block: host %d slot %u key ", h, i);
            for (int k = 0; k < 16; k++)
                fprintf(stderr, "%02x", rec.key[k]);
            fprintf(stderr, " offset %" PRIu64 " length %" PRIu64 ": %s\n", rec.offset, rec.length, why);
        }
    printf("{\"tool\":\"kvstore\",\"op\":\"verify\",\"good\":%" PRIu64 ",\"bad\":%" PRIu64
           ",\"claims\":%" PRIu64 ",\"poison_ranges\":", good, bad, claims);
    if (g_npoison < 0)
        printf("null}\n"); /* not consulted */
    else
        printf("%d}\n", g_npoison);
    finish_output();
    return bad ? 1 : 0;
}

static int cmd_bench(struct opt *o, const char *dev)
{
    need(&o[0]), need(&o[1]), need(&o[2]);
    const uint64_t blocks = num(&o[1], 0, 0, 1, 100000), size = size_of(&o[2]);
    open_store(dev, (int)num(&o[0], 0, 0, 0, 255));
    char key[64];
    uint8_t d[16];
    /* one payload for every block, made before the clock starts: the rates are the store's */
    uint64_t *payload = alloc(size);
    kv_digest("bench", 5, d);
    fill(payload, size, d, 0);
    uint64_t stored = 0, loaded = 0, t0 = now_ns();
    for (uint64_t i = 0; i < blocks; i++) {
        snprintf(key, sizeof key, "bench/%d/%" PRIu64, (int)getpid(), i);
        kv_digest(key, strlen(key), d);
        stored += (uint64_t)put_block(d, payload, size);
    }
    uint64_t t1 = now_ns();
    for (uint64_t i = 0; i < blocks; i++) {
        void *data;
        uint64_t len;
        snprintf(key, sizeof key, "bench/%d/%" PRIu64, (int)getpid(), i);
        kv_digest(key, strlen(key), d);
        if (get(d, &data, &len)) {
            loaded += len == size && !memcmp(data, payload, size); /* checked, as the Python bench does */
            free(data);
        }
    }
    uint64_t t2 = now_ns();
    for (uint64_t i = 0; i < blocks; i++) { /* drop them: a benchmark leaves no blocks behind */
        int h;
        uint32_t sl;
        struct kv_record rec;
        snprintf(key, sizeof key, "bench/%d/%" PRIu64, (int)getpid(), i);
        kv_digest(key, strlen(key), d);
        if (kv_find(&g_kv, d, &h, &sl, &rec) && h == g_kv.host && g_kv.mine[sl].live &&
            g_kv.mine[sl].state == rec.state && kv_withdraw(&g_kv, sl))
            die("host %d's lease was taken by another process: this tool no longer writes", g_kv.host);
    }
    printf("{\"tool\":\"kvstore\",\"op\":\"bench\",\"base\":%" PRIu64 ",\"blocks\":%" PRIu64
           ",\"size\":%" PRIu64 ",\"stored\":%" PRIu64 ",\"loaded\":%" PRIu64 ",\"store_ns\":%" PRIu64
           ",\"load_ns\":%" PRIu64 "}\n", (uint64_t)(g_kv.base - (char *)g_map), blocks, size, stored, loaded,
           t1 - t0, t2 - t1);
    free(payload);
    finish_output();
    return (stored == blocks && loaded == blocks) ? 0 : 1;
}

/* not inlined: main holds the sigsetjmp, and its locals must survive a longjmp */
static __attribute__((noinline)) int cmd_put_get(const char *action, struct opt *o, const char *dev)
{
    need(&o[1]);
    if (o[4].val)
        load_poison(num(&o[4], 0, 0, 0, UINT64_MAX), num(&o[7], 60, 0, 1, 86400));
    const uint64_t salt = num(&o[3], 0, 0, 0, UINT64_MAX);
    if (!strcmp(action, "put")) {
        need(&o[0]), need(&o[2]);
        open_store(dev, (int)num(&o[0], 0, 0, 0, 255));
        int r = put_pattern(o[1].val, size_of(&o[2]), salt);
        printf("{\"tool\":\"kvstore\",\"op\":\"put\",\"key\":");
        json_str(o[1].val);
        printf(",\"stored\":%d}\n", r);
        finish_output();
        return 0;
    }
    open_store(dev, o[0].val ? (int)num(&o[0], 0, 0, 0, 255) : -1);
    uint8_t d[16];
    void *data = NULL;
    uint64_t len = 0;
    kv_digest(o[1].val, strlen(o[1].val), d);
    int hit = get(d, &data, &len), host, bad_slot;
    uint32_t slot;
    struct kv_record rec;
    int poison = !hit && kv_find(&g_kv, d, &host, &slot, &rec) && poisoned(&rec);
    bad_slot = poison ? (int)slot : -1;
    int match = hit && o[2].val ? (len == size_of(&o[2]) && is_pattern(o[1].val, data, len, salt)) : hit;
    printf("{\"tool\":\"kvstore\",\"op\":\"get\",\"key\":");
    json_str(o[1].val);
    printf(",\"hit\":%d,\"length\":%" PRIu64 ",\"crc32\":\"0x%08" PRIx32 "\",\"match\":%d", hit,
           len, hit ? kv_crc(data, len) : 0, match);
    if (poison)
        printf(",\"poisoned\":{\"host\":%d,\"slot\":%d,\"offset\":%" PRIu64 ",\"length\":%" PRIu64 "}",
               host, bad_slot, rec.offset, rec.length);
    printf("}\n");
    free(data);
    finish_output();
    return match ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(HELP, stdout);
        return argc < 2 ? EXIT_ERROR : 0;
    }
    const char *action = argv[1];
    if (argc < 3 || argv[2][0] == '-')
        die("missing DEV after '%s'; see kvstore --help", action);
    const char *dev = argv[2];
    crc_init();
    catch_sigbus_jump();
    if (sigsetjmp(g_fault_jmp, 1))
        die_bus_error(action, dev, g_map, 0, g_map_len);
    if (!strcmp(action, "run")) {
        struct opt o[] = {{"--host", 0}, {"--hosts", 0}, {"--blocks", 0}, {"--sizes", 0},
                          {"--timeout", 0}, {"--base", 0}, {"--stale-ms", 0}, {0, 0}};
        parse_opts(argc - 2, argv + 2, o, HELP);
        g_base_arg = o[5].val;
        g_stale.val = o[6].val;
        return cmd_run(o, dev);
    }
    if (!strcmp(action, "bench")) {
        struct opt o[] = {{"--host", 0}, {"--blocks", 0}, {"--size", 0}, {"--base", 0}, {"--stale-ms", 0}, {0, 0}};
        parse_opts(argc - 2, argv + 2, o, HELP);
        g_base_arg = o[3].val;
        g_stale.val = o[4].val;
        return cmd_bench(o, dev);
    }
    if (!strcmp(action, "verify")) {
        struct opt o[] = {{"--poison-serial", 0}, {"--base", 0}, {"--poison-timeout", 0}, {0, 0}};
        parse_opts(argc - 2, argv + 2, o, HELP);
        g_base_arg = o[1].val;
        if (o[0].val)
            load_poison(num(&o[0], 0, 0, 0, UINT64_MAX), num(&o[2], 60, 0, 1, 86400));
        return cmd_verify(dev);
    }
    if (!strcmp(action, "put") || !strcmp(action, "get")) {
        struct opt o[] = {{"--host", 0}, {"--key", 0}, {"--size", 0}, {"--salt", 0},
                          {"--poison-serial", 0}, {"--base", 0}, {"--stale-ms", 0}, {"--poison-timeout", 0}, {0, 0}};
        parse_opts(argc - 2, argv + 2, o, HELP);
        g_base_arg = o[5].val;
        g_stale.val = o[6].val;
        return cmd_put_get(action, o, dev);
    }
    die("unknown action '%s' (put, get, run, verify, bench); see kvstore --help", action);
}
