/*
 * kvreplay: one host of `pfcxl kv replay --on guests` (host_tools/kv/replay_guest.py), with the
 * store's C core (guest/include/pfcxl_kvstore.h, pfcxl_kvwrite.h). One process serves every
 * request routed to its host: the host side posts lines of operations in this host's mailbox in
 * the pool, after the store, and this tool answers each message in the mailbox's reply half.
 * Requests are served as host_tools/kv/replay_host.py serves them on the pool file.
 */
#define TOOL_NAME "kvreplay"
#include "../include/pfcxl_tool.h"
#include "../include/pfcxl_kvstore.h"
#include "../include/pfcxl_kvwrite.h"

static const char HELP[] =
    "usage: kvreplay DEV --host H --size BYTES --mailbox OFFSET [--base BYTES|auto]\n"
    "Serve `pfcxl kv replay` requests as host H of the store in DEV, reading operations from the\n"
    "mailbox of host H at byte OFFSET after the store's base (each host's mailbox is 1 MiB:\n"
    "words seq, len at 0; ack, rlen, pid at 64; the message at 128; the reply in the second half).\n"
    "Operations, one a line: O ALONE STALE_MS (open the store as H; ALONE 1: a private cache),\n"
    "R INDEX BLOCK... (look the blocks up as a prefix, load and check each hit, store the rest;\n"
    "BLOCK: a 64-bit signed integer, else an E reply;\n"
    "reply: INDEX blocks hits own other stored present lost checked bad read written),\n"
    "C (close: reply S evictions lookups index_lines), Q (quit). Errors: E message.\n"
    "A block's bytes: BLAKE2b-512 of \"pfcxl-replay/BLOCK\" repeated to BYTES; its key \"replay/BLOCK\".\n"
    "--base: as kvstore's (0 on a direct-path DAX device, 2 MiB on a CXL one or a file).\n"
    "While idle it leaves (status 2, its lease released) once the process that started it is gone.\n"
    "exit status: 0 after Q; 2 error (one line on stderr).\n";

#define MB_BYTES (1u << 20)
#define MB_TEXT 128u
#define MB_HALF ((MB_BYTES - MB_TEXT) / 2)
enum { MB_SEQ = 0, MB_LEN = 1, MB_ACK = 8, MB_RLEN = 9, MB_PID = 10 }; /* words of the mailbox */
enum { C_BLOCKS, C_HITS, C_OWN, C_OTHER, C_STORED, C_PRESENT, C_LOST, C_CHECKED, C_BAD, C_READ, C_WRITTEN, C_N };

static struct kv g_kv;
static char *g_store;          /* the store's byte 0 in our mapping */
static uint64_t g_room;        /* bytes from there to the device's end */
static uint64_t g_size;        /* a block's bytes */
static uint8_t *g_want, *g_got;
static uint64_t g_lookups;
static int g_open, g_alone;

static void release_lease(void) { kv_release_lease(&g_kv); }

static void key_of(long long block, uint8_t d[16])
{
    char key[40];
    kv_digest(key, (size_t)snprintf(key, sizeof key, "replay/%lld", block), d);
}

/* The bytes block `block` must hold (kv_replay_host.payload). */
static void payload(long long block)
{
    char seed_in[48];
    uint8_t seed[64];
    kv_blake2b(seed_in, (size_t)snprintf(seed_in, sizeof seed_in, "pfcxl-replay/%lld", block), seed, 64);
    for (uint64_t at = 0; at < g_size; at += 64)
        memcpy(g_want + at, seed, g_size - at < 64 ? g_size - at : 64);
}

/* A copy of d into g_got (1, *where its host), else 0; copies that failed their check while their
 * record stood are counted in *failed (a copy withdrawn while read is a miss). As Store.load. */
static int load(const uint8_t d[16], int *where, uint64_t *failed)
{
    g_lookups++;
    for (int h = g_alone ? g_kv.host : 0; h < (g_alone ? g_kv.host + 1 : (int)g_kv.sb.hosts); h++) {
        struct kv_record rec;
        for (uint32_t k = 0; kv_find_at(&g_kv, h, d, &k, &rec); k++) {
            const uint32_t i = kv_probe(&g_kv, d, k);
            if (rec.length <= g_size && kv_read(&g_kv, h, i, &rec, g_got)) {
                if (h == g_kv.host)
                    kv_touch(&g_kv, i, rec.state);
                *where = h;
                return rec.length == g_size ? 1 : -1; /* -1: a block of another size: wrong */
            }
            if (kv_rec(&g_kv, h, i)->state == rec.state)
                (*failed)++;
        }
    }
    return 0;
}

/* One request (kv_replay_host.serve): its counts. */
static void serve(const long long *blocks, int n, uint64_t c[C_N])
{
    memset(c, 0, C_N * sizeof *c);
    c[C_BLOCKS] = (uint64_t)n;
    uint8_t d[16];
    for (int i = 0; i < n; i++) {
        int where = -1;
        key_of(blocks[i], d);
        const int got = load(d, &where, &c[C_BAD]);
        int hit = got != 0;
        if (hit) {
            c[C_CHECKED]++;
            payload(blocks[i]);
            if (got < 0 || memcmp(g_got, g_want, g_size)) {
                c[C_BAD]++;
                hit = 0; /* never served: the lookup stops here, as at a miss */
            }
        }
        if (!hit)
            break;
        c[C_HITS]++;
        c[where == g_kv.host ? C_OWN : C_OTHER]++;
        c[C_READ] += g_size;
    }
    for (int i = (int)c[C_HITS]; i < n; i++) {
        int h;
        uint32_t slot;
        struct kv_record rec;
        key_of(blocks[i], d);
        g_lookups++;
        if (kv_find_in(&g_kv, d, g_alone, &h, &slot, &rec)) {
            c[C_PRESENT]++;
            continue;
        }
        payload(blocks[i]);
        g_lookups++; /* the put looks the key up again */
        const int r = kv_put(&g_kv, d, g_want, g_size, g_alone);
        if (r == -1)
            die("a block of %" PRIu64 " bytes does not fit in host %d's arena of %" PRIu64 " bytes", g_size,
                g_kv.host, g_kv.sb.arena_bytes);
        if (r == -2)
            die("host %d's lease was taken by another process: this tool no longer writes", g_kv.host);
        c[r ? C_STORED : C_LOST]++;
        c[C_WRITTEN] += r ? g_size : 0;
    }
}

/* One line of the message; its reply appended at *out (room bytes left). */
static void operate(char *line, int host, char **out, char *end)
{
    static long long blocks[MB_HALF / 2 + 1]; /* a message's every id: each takes 2 bytes or more */
    char *p = line;
    const char op = *p++;
    int w = 0;
    if (op == 'O') {
        g_alone = (int)strtol(p, &p, 10);
        const long stale_ms = strtol(p, &p, 10);
        const char *why = kv_attach(&g_kv, g_store, g_room, host);
        g_kv.stale_s = stale_ms / 1000.0;
        if (!why)
            why = kv_take_lease(&g_kv);
        if (!why) {
            kv_recover(&g_kv);
            g_open = 1;
            g_lookups = 0;
        }
        w = why ? snprintf(*out, (size_t)(end - *out), "E %s\n", why) : snprintf(*out, (size_t)(end - *out), "K\n");
    } else if (op == 'R' && g_open) {
        const long long index = strtoll(p, &p, 10);
        int n = 0;
        const char *why = NULL;
        for (char *q;; n++) {
            errno = 0;
            const long long b = strtoll(p, &q, 10);
            if (q == p)
                break;
            if (errno == ERANGE) {
                why = "a block id beyond the 64-bit signed range";
                break;
            }
            if (n == (int)(sizeof blocks / sizeof *blocks)) {
                why = "more block ids than a message holds";
                break;
            }
            blocks[n] = b;
            p = q;
        }
        if (why) {
            w = snprintf(*out, (size_t)(end - *out), "E request %lld: %s\n", index, why);
            if (w < 0 || w >= end - *out)
                die("a reply does not fit in the mailbox's %u bytes", MB_HALF);
            *out += w;
            return;
        }
        uint64_t c[C_N];
        serve(blocks, n, c);
        w = snprintf(*out, (size_t)(end - *out), "%lld", index);
        for (int k = 0; k < C_N; k++)
            w += snprintf(*out + w, (size_t)(end - *out - w), " %" PRIu64, c[k]);
        w += snprintf(*out + w, (size_t)(end - *out - w), "\n");
    } else if (op == 'C' && g_open) {
        w = snprintf(*out, (size_t)(end - *out), "S %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
                     kv_hdr(&g_kv, host)->evictions, g_lookups, g_kv.index_lines);
        kv_release_lease(&g_kv);
        free(g_kv.mine);
        free(g_kv.gaps);
        g_open = 0;
    } else if (op == 'Q') {
        w = snprintf(*out, (size_t)(end - *out), "K\n");
    } else {
        w = snprintf(*out, (size_t)(end - *out), "E operation '%c' %s\n", op, g_open ? "unknown" : "before O");
    }
    if (w < 0 || w >= end - *out)
        die("a reply does not fit in the mailbox's %u bytes", MB_HALF);
    *out += w;
}

static void *map_store(const char *dev, const char *base_arg)
{
    struct stat st;
    int fd = open_dev(dev, 1, &st);
    uint64_t size = S_ISCHR(st.st_mode) ? dax_size(dev, &st) : (uint64_t)st.st_size, off, len;
    size &= ~(WINDOW_ALIGN - 1);
    if (size < WINDOW_ALIGN)
        die("%s: cannot find its size, or it is under 2 MiB", dev);
    uint64_t base = kv_is_direct(&st) ? 0 : KV_HOME;
    if (base_arg && strcmp(base_arg, "auto")) {
        const struct opt o = {"--base", base_arg};
        base = num(&o, 0, 1, 0, size - 2 * KV_PAGE);
        if (base % KV_PAGE)
            die("--base %" PRIu64 " is not a multiple of %u", base, KV_PAGE);
    }
    char *map = map_window(fd, dev, 0, size, 1, &off, &len);
    close(fd);
    g_room = size - base;
    return map + base;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(HELP, stdout);
        return argc < 2 ? EXIT_ERROR : 0;
    }
    const char *dev = argv[1];
    struct opt o[] = {{"--host", 0}, {"--size", 0}, {"--mailbox", 0}, {"--base", 0}, {0, 0}};
    parse_opts(argc - 1, argv + 1, o, HELP);
    for (int i = 0; i < 3; i++)
        if (!o[i].val)
            die("missing required option %s; see kvreplay --help", o[i].name);
    const int host = (int)num(&o[0], 0, 0, 0, KV_MAX_HOSTS - 1);
    g_size = num(&o[1], 0, 1, 1, 1ULL << 30);
    crc_init();
    g_store = map_store(dev, o[3].val);
    const uint64_t at = num(&o[2], 0, 0, 0, UINT64_MAX);
    if (at % KV_PAGE || at > g_room || (uint64_t)(host + 1) * MB_BYTES > g_room - at)
        die("--mailbox %" PRIu64 ": host %d's mailbox (1 MiB, page aligned) is not inside the %" PRIu64 " bytes of %s "
            "after the store's base", at, host, g_room, dev);
    volatile uint64_t *box = (volatile uint64_t *)(g_store + at + (uint64_t)host * MB_BYTES);
    char *in = (char *)box + MB_TEXT, *reply = in + MB_HALF;
    char *text = malloc(MB_HALF + 1), *out = malloc(MB_HALF);
    g_want = malloc(g_size);
    g_got = malloc(g_size);
    if (!text || !out || !g_want || !g_got)
        die("out of memory for blocks of %" PRIu64 " bytes", g_size);
    atexit(release_lease);
    uint64_t done = box[MB_ACK];
    box[MB_PID] = (uint64_t)getpid(); /* the host side waits for this hello */
    kv_fence(&box[MB_PID]);
    const pid_t parent = getppid();
    for (int quit = 0; !quit;) {
        uint64_t seq;
        for (unsigned idle = 1; (seq = box[MB_SEQ]) == done; idle++) {
            if (g_open)
                kv_beat(&g_kv); /* idle but alive: our lease is not stale */
            if (idle % 256 == 0 && getppid() != parent) {
                release_lease(); /* first: the message may meet a closed pipe (SIGPIPE) */
                die("the process that started this one is gone: no one will post or read this mailbox");
            }
            kv_sleep_ms(1);
        }
        kv_fence(NULL);
        const uint64_t len = box[MB_LEN] < MB_HALF ? box[MB_LEN] : MB_HALF;
        memcpy(text, in, len);
        text[len] = 0;
        char *w = out;
        for (char *line = text, *nl; *line; line = nl + 1) {
            if (!(nl = strchr(line, '\n')))
                die("a message line without its newline");
            *nl = 0;
            quit |= *line == 'Q';
            operate(line, host, &w, out + MB_HALF);
        }
        memcpy(reply, out, (size_t)(w - out));
        box[MB_RLEN] = (uint64_t)(w - out);
        kv_fence(NULL);
        box[MB_ACK] = done = seq;
        kv_fence(&box[MB_ACK]);
    }
    return 0;
}
