/*
 * slices: the multi-host shared-memory check with rendezvous coherence.
 *
 * Built static for the guest image:
 *     gcc -static -O2 -Wall -Wextra -Werror -o slices guest/src/slices.c
 *
 * N hosts share one memory pool (/dev/dax0.0 in every guest). Host h owns slice h: it writes its
 * slice with daxio's pattern, then publishes a rendezvous signal (a flag word in its own 64-byte
 * line of a flags area). A consumer reads another host's slice only after it has observed that
 * host's signal; there is no per-line flush protocol for the data across hosts.
 *
 * Conventions shared with daxio.c (kept in a separate file on purpose; the helpers both use,
 * pattern and CRC-32 included, are in guest/include/pfcxl_tool.h):
 *   - DEV is mapped with mmap(MAP_SHARED) over a 2 MiB-aligned window and touched only through
 *     volatile 8-byte loads and stores (under QEMU TCG, string instructions on CXL memory are
 *     one I/O per byte);
 *   - pattern word at byte offset o from the START OF DEV: 0x5046000000000000 ^ (seed<<40) ^ (o>>3),
 *     mirrored by guest/pattern.py;
 *   - CRC-32 as zlib; one JSON line on stdout; exit 0 ok, 1 data mismatch, 2 error.
 */
#define _GNU_SOURCE

#define TOOL_NAME "slices"
#include "../include/pfcxl_tool.h"

#define LINE 64ULL
#define FLAG_MAGIC 0x50464c4147000000ULL /* "PFLAG" in the top 5 bytes, epoch in the low 3 */
#define EPOCH_LIMIT (1ULL << 24)
#define HOSTS_LIMIT 256ULL
#define TIMEOUT_LIMIT 100000000ULL
#define EXIT_MISMATCH 1

static const char HELP[] =
    "usage: slices DEV --host H --hosts N --slice BYTES [--flags-offset O] [--timeout SECONDS]\n"
    "              [--epoch E] [--verify-only]\n"
    "       slices DEV --reset --hosts N [--flags-offset O]\n"
    "\n"
    "Multi-host shared-memory check with rendezvous coherence. N hosts map the same memory\n"
    "(e.g. /dev/dax0.0 in every guest, or one regular file for host-side tests) and run this\n"
    "concurrently, each with its own --host. Host H:\n"
    "  1. clears its own flag, fills its slice with the pattern, seed = (E*256 + H) & 0xffff;\n"
    "  2. computes the crc32 of what it wrote;\n"
    "  3. publishes: stores word1 = crc32 then word0 = 0x50464c4147000000 | E (\"PFLAG\"+epoch)\n"
    "     in its flag line, then a full fence, clflush of the line and mfence (x86);\n"
    "  4. waits until word0 of every host's flag line equals that value for epoch E (polling\n"
    "     about every 1 ms; each poll clflushes the remote flag line first);\n"
    "  5. only then reads every OTHER host's slice, counts the words that differ from that host's\n"
    "     pattern and compares the crc32 of what it read with the crc32 that host published.\n"
    "Data is never flushed line by line: the flag is the only rendezvous between hosts.\n"
    "\n"
    "layout in DEV:\n"
    "  flags: one 64-byte line per host, host h's at O + 64*h (word0 signal, word1 crc32);\n"
    "  slices: base = O + 64*N rounded up to 2 MiB; slice h = [base + h*BYTES, base + (h+1)*BYTES);\n"
    "  base + N*BYTES must fit in DEV (size from sysfs for a device, st_size for a file, which\n"
    "  is never extended).\n"
    "\n"
    "options (also accepted as --name=value):\n"
    "  --host H          this host's index, 0 <= H < N\n"
    "  --hosts N         number of hosts, 1 <= N <= 256 (so every host's seed differs)\n"
    "  --slice BYTES     slice size; a multiple of 8, at least 8\n"
    "  --flags-offset O  byte offset of the flags area (default 0); a multiple of 64\n"
    "  --timeout S       give up waiting for the flags after S whole seconds (default 300;\n"
    "                    0 = look once)\n"
    "  --epoch E         0 <= E < 2^24 (default 1); use a new epoch for each run on the same\n"
    "                    memory, so stale flags of an earlier run are not taken as signals\n"
    "                    (seeds repeat every 256 epochs)\n"
    "  --verify-only     skip steps 1-3 (write nothing, publish nothing): wait for the flags of\n"
    "                    epoch E of ALL N hosts, this one included (left by an earlier run), then\n"
    "                    verify the other hosts' slices as in step 5\n"
    "  --reset           zero the N flag lines (all 8 words, word0 first) so that a new run\n"
    "                    starts clean; only --hosts and --flags-offset apply\n"
    "  -h, --help        show this text and exit 0\n"
    "  Numbers are decimal or 0x-prefixed hex; BYTES and O accept a suffix K, M or G (KiB, MiB,\n"
    "  GiB), e.g. --slice 1M.\n"
    "\n"
    "pattern: the 8-byte word at byte offset o from the START OF DEV is\n"
    "  0x5046000000000000 ^ (seed << 40) ^ (o >> 3), little-endian (as daxio; mirrored by\n"
    "  pfcxl.guest.pattern). crc32: zlib's CRC-32 over the slice's bytes in address order.\n"
    "\n"
    "output: one JSON line on stdout, for example\n"
    "  {\"tool\":\"slices\",\"host\":0,\"hosts\":2,\"epoch\":1,\"slice\":1048576,"
    "\"own_crc32\":\"0x1234abcd\",\n"
    "   \"verified\":[{\"host\":1,\"crc32\":\"0x89abcdef\",\"published_crc32\":\"0x89abcdef\","
    "\"mismatches\":0,\n"
    "   \"first_mismatch\":null}],\"mismatches\":0,\"wait_ns\":1000,\"fill_ns\":2000,"
    "\"verify_ns\":3000,\n"
    "   \"op\":\"run\",\"dev\":\"/dev/dax0.0\",\"flags_offset\":0,\"base\":2097152}\n"
    "  mismatches: differing words (per host, and the total); first_mismatch: byte offset from\n"
    "  the start of DEV of the first one, or null. With --verify-only, op is \"verify\" and\n"
    "  own_crc32 and fill_ns are null. --reset prints\n"
    "  {\"tool\":\"slices\",\"op\":\"reset\",\"dev\":...,\"hosts\":N,\"flags_offset\":O,\"lines\":N}.\n"
    "  *_ns: nanoseconds of guest wall-clock time (CLOCK_MONOTONIC) for filling (+crc), waiting\n"
    "  for the flags, and verifying. Under QEMU TCG this is emulator time, NOT fabric latency.\n"
    "\n"
    "exit status: 0 ok; 1 some word mismatched or some crc32 differs from the published one;\n"
    "  2 error: bad argument, DEV too small, open/mmap failure, bus error (one line on stderr),\n"
    "  or timeout waiting for flags (then stdout also gets one JSON line with \"error\":\"timeout\"\n"
    "  and \"missing\": the hosts whose flag was not seen, with \"flags_seen\" their word0).\n";

/* ---------------------------------------------------------------- barriers */

/* Write back and invalidate one cache line (x86), fenced; elsewhere just a full fence. Under
 * TCG this costs nothing; on hardware it makes the line leave this host's cache. */
static inline void flush_line(volatile void *line)
{
    __sync_synchronize();
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("clflush %0" : "+m"(*(volatile char *)line) : : "memory");
    __asm__ volatile("mfence" : : : "memory");
#endif
}

/* ---------------------------------------------------------------- arguments */

enum { A_HOST, A_HOSTS, A_SLICE, A_FLAGS, A_TIMEOUT, A_EPOCH, A_VERIFY, A_RESET, A_COUNT };

static const struct optdef {
    const char *name;
    int takes_value, suffix;
} OPTS[A_COUNT] = {
    [A_HOST] = {"--host", 1, 0},       [A_HOSTS] = {"--hosts", 1, 0},
    [A_SLICE] = {"--slice", 1, 1},     [A_FLAGS] = {"--flags-offset", 1, 1},
    [A_TIMEOUT] = {"--timeout", 1, 0}, [A_EPOCH] = {"--epoch", 1, 0},
    [A_VERIFY] = {"--verify-only", 0, 0}, [A_RESET] = {"--reset", 0, 0},
};

struct args {
    const char *dev;
    uint64_t v[A_COUNT];
    unsigned given;
};

#define GIVEN(a, k) (((a)->given >> (k)) & 1u)

static void parse_args(int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof *a);
    a->v[A_TIMEOUT] = 300;
    a->v[A_EPOCH] = 1;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(HELP, stdout);
            exit(fflush(stdout) == 0 ? 0 : EXIT_ERROR);
        }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (arg[0] == '-' && arg[1] != '\0')
                die("unknown option '%s'; see slices --help", arg);
            if (a->dev)
                die("unexpected argument '%s' (DEV is already '%s')", arg, a->dev);
            if (arg[0] == '\0')
                die("DEV must not be empty");
            a->dev = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        int k = 0;
        while (k < A_COUNT && !(strlen(OPTS[k].name) == nlen && !strncmp(arg, OPTS[k].name, nlen)))
            k++;
        if (k == A_COUNT)
            die("unknown option '%.*s'; see slices --help", (int)nlen, arg);
        if (GIVEN(a, k))
            die("option %s given twice", OPTS[k].name);
        a->given |= 1u << k;
        if (!OPTS[k].takes_value) {
            if (eq)
                die("option %s takes no value", OPTS[k].name);
            a->v[k] = 1;
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val)
            die("option %s needs a value", OPTS[k].name);
        if (parse_u64(val, NULL, OPTS[k].suffix ? PARSE_SUFFIX : 0, &a->v[k]) != 0)
            die("bad value '%s' for %s (want decimal or 0x hex%s, fitting in 64 bits)", val,
                OPTS[k].name, OPTS[k].suffix ? ", optional K/M/G suffix" : "");
    }

    if (!a->dev)
        die("missing DEV; see slices --help");
    if (!GIVEN(a, A_HOSTS))
        die("missing required option --hosts; see slices --help");
    uint64_t n = a->v[A_HOSTS], o = a->v[A_FLAGS];
    if (n < 1 || n > HOSTS_LIMIT)
        die("--hosts %" PRIu64 " is out of range (1 <= N <= %llu)", n, HOSTS_LIMIT);
    if (o % LINE)
        die("--flags-offset %" PRIu64 " is not a multiple of 64", o);
    if (o > (uint64_t)INT64_MAX / 2)
        die("--flags-offset %" PRIu64 " is too large", o);
    if (GIVEN(a, A_RESET)) {
        for (int k = 0; k < A_COUNT; k++)
            if (GIVEN(a, k) && k != A_RESET && k != A_HOSTS && k != A_FLAGS)
                die("option %s does not apply with --reset", OPTS[k].name);
        return;
    }
    if (!GIVEN(a, A_HOST))
        die("missing required option --host; see slices --help");
    if (!GIVEN(a, A_SLICE))
        die("missing required option --slice; see slices --help");
    if (a->v[A_HOST] >= n)
        die("--host %" PRIu64 " is out of range (0 <= H < --hosts %" PRIu64 ")", a->v[A_HOST], n);
    uint64_t s = a->v[A_SLICE];
    if (s == 0 || s % 8)
        die("--slice %" PRIu64 " is not a positive multiple of 8", s);
    if (s > (uint64_t)INT64_MAX / 2 / n)
        die("--slice %" PRIu64 " is too large for %" PRIu64 " hosts", s, n);
    if (a->v[A_EPOCH] >= EPOCH_LIMIT)
        die("--epoch %" PRIu64 " is too big (must be < %llu)", a->v[A_EPOCH], EPOCH_LIMIT);
    if (a->v[A_TIMEOUT] > TIMEOUT_LIMIT)
        die("--timeout %" PRIu64 " is too big (at most %llu seconds)", a->v[A_TIMEOUT],
            TIMEOUT_LIMIT);
}

/* ---------------------------------------------------------------- main */

struct result {
    uint32_t crc, published;
    uint64_t mismatches, first_bad;
};

int main(int argc, char **argv)
{
    struct args a;
    parse_args(argc, argv, &a);
    const char *dev = a.dev;
    const int reset = (int)a.v[A_RESET], verify_only = (int)a.v[A_VERIFY];
    const uint64_t n = a.v[A_HOSTS], fo = a.v[A_FLAGS], h = a.v[A_HOST], size = a.v[A_SLICE];
    const uint64_t epoch = a.v[A_EPOCH], signal_word = FLAG_MAGIC | epoch;
    const uint64_t flags_end = fo + LINE * n;
    const uint64_t base = (flags_end + WINDOW_ALIGN - 1) & ~(WINDOW_ALIGN - 1);
    const uint64_t end = reset ? flags_end : base + n * size;
    const int writes = !verify_only;

    struct stat st;
    int fd = open_dev(dev, writes, &st);
    uint64_t devsize;
    if (S_ISREG(st.st_mode))
        devsize = (uint64_t)st.st_size;
    else if (S_ISCHR(st.st_mode)) {
        devsize = dax_size(dev, &st);
        if (!devsize)
            die("cannot find the size of %s in /sys/class/dax, /sys/bus/dax or /sys/dev/char",
                dev);
    } else
        die("%s is neither a regular file nor a character device", dev);
    if (devsize < end)
        die("%s is %" PRIu64 " bytes; need %" PRIu64 " (flags at %" PRIu64 ", %" PRIu64
            " slices of %" PRIu64 " from %" PRIu64 ")%s",
            dev, devsize, end, fo, reset ? 0 : n, size, base,
            S_ISREG(st.st_mode) ? "; the file is not extended" : "");

    uint64_t win_off, win_len;
    void *map = map_window(fd, dev, fo, end, writes, &win_off, &win_len);
    catch_sigbus_jump();
    if (sigsetjmp(g_fault_jmp, 1))
        die_bus_error(NULL, dev, map, win_off, win_len);

    /* The word at device offset o (8-aligned, inside the window). */
#define AT(o) ((volatile uint64_t *)((char *)map + ((o) - win_off)))
#define FLAG(k) AT(fo + LINE * (k))

    if (reset) {
        for (uint64_t k = 0; k < n; k++) {
            volatile uint64_t *f = FLAG(k);
            f[0] = 0; /* the signal goes first */
            __sync_synchronize();
            for (unsigned w = 1; w < LINE / 8; w++)
                f[w] = 0;
            flush_line(f);
        }
        printf("{\"tool\":\"slices\",\"op\":\"reset\",\"dev\":");
        json_str(dev);
        printf(",\"hosts\":%" PRIu64 ",\"flags_offset\":%" PRIu64 ",\"lines\":%" PRIu64 "}\n", n,
               fo, n);
        finish_output();
        return 0;
    }

    crc_init();
    uint32_t own_crc = 0;
    uint64_t fill_ns = 0;
    if (!verify_only) {
        /* 1-2: withdraw any old signal of ours, fill the slice, crc of what was written */
        volatile uint64_t *own = FLAG(h);
        own[0] = 0;
        flush_line(own);
        const uint64_t seed = (epoch * 256 + h) & 0xffff, start = base + h * size;
        volatile uint64_t *p = AT(start);
        uint32_t state = 0xFFFFFFFFu;
        uint64_t t0 = now_ns();
        for (uint64_t i = 0; i < size / 8; i++) {
            uint64_t w = pattern_word(seed, start + 8 * i);
            p[i] = w;
            state = crc_word(state, w);
        }
        own_crc = ~state;
        fill_ns = now_ns() - t0;
        /* 3: publish -- data before crc before signal */
        __sync_synchronize();
        own[1] = own_crc;
        __sync_synchronize();
        own[0] = signal_word;
        flush_line(own);
    }

    /* 4: wait for every host's signal of this epoch */
    unsigned char seen[HOSTS_LIMIT] = {0};
    uint64_t last[HOSTS_LIMIT] = {0}, remaining = n;
    const uint64_t tw = now_ns(), limit = a.v[A_TIMEOUT] * 1000000000ULL;
    for (;;) {
        for (uint64_t k = 0; k < n; k++) {
            if (seen[k])
                continue;
            volatile uint64_t *f = FLAG(k);
            flush_line(f); /* drop a possibly stale cached copy before looking */
            last[k] = f[0];
            if (last[k] == signal_word) {
                seen[k] = 1;
                remaining--;
            }
        }
        if (!remaining)
            break;
        uint64_t waited = now_ns() - tw;
        if (waited >= limit) {
            printf("{\"tool\":\"slices\",\"op\":\"%s\",\"dev\":", verify_only ? "verify" : "run");
            json_str(dev);
            printf(",\"host\":%" PRIu64 ",\"hosts\":%" PRIu64 ",\"epoch\":%" PRIu64
                   ",\"error\":\"timeout\",\"timeout_s\":%" PRIu64 ",\"missing\":[",
                   h, n, epoch, a.v[A_TIMEOUT]);
            int first = 1;
            for (uint64_t k = 0; k < n; k++)
                if (!seen[k]) {
                    printf("%s%" PRIu64, first ? "" : ",", k);
                    first = 0;
                }
            printf("],\"flags_seen\":[");
            first = 1;
            for (uint64_t k = 0; k < n; k++)
                if (!seen[k]) {
                    printf("%s\"0x%016" PRIx64 "\"", first ? "" : ",", last[k]);
                    first = 0;
                }
            printf("],\"wait_ns\":%" PRIu64 "}\n", waited);
            finish_output();
            char names[4 * HOSTS_LIMIT] = "";
            size_t used = 0;
            for (uint64_t k = 0; k < n && used + 8 < sizeof names; k++)
                if (!seen[k])
                    used += (size_t)snprintf(names + used, sizeof names - used, "%s%" PRIu64,
                                             used ? " " : "", k);
            die("timeout after %" PRIu64 " s waiting for the epoch %" PRIu64
                " flags of host(s) %s",
                a.v[A_TIMEOUT], epoch, names);
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    __sync_synchronize(); /* the slices are read only after every signal was seen */
    const uint64_t wait_ns = now_ns() - tw;

    /* 5: verify the others */
    static struct result res[HOSTS_LIMIT];
    uint64_t total = 0;
    int crc_bad = 0;
    const uint64_t tv = now_ns();
    for (uint64_t k = 0; k < n; k++) {
        if (k == h)
            continue;
        const uint64_t seed = (epoch * 256 + k) & 0xffff, start = base + k * size;
        volatile uint64_t *p = AT(start);
        struct result *r = &res[k];
        uint32_t state = 0xFFFFFFFFu;
        r->published = (uint32_t)FLAG(k)[1];
        for (uint64_t i = 0; i < size / 8; i++) {
            uint64_t o = start + 8 * i, got = p[i];
            state = crc_word(state, got);
            if (got != pattern_word(seed, o) && r->mismatches++ == 0)
                r->first_bad = o;
        }
        r->crc = ~state;
        total += r->mismatches;
        crc_bad |= r->crc != r->published;
    }
    const uint64_t verify_ns = now_ns() - tv;

    signal(SIGBUS, SIG_DFL);
    munmap(map, (size_t)win_len);
    close(fd);

    printf("{\"tool\":\"slices\",\"host\":%" PRIu64 ",\"hosts\":%" PRIu64 ",\"epoch\":%" PRIu64
           ",\"slice\":%" PRIu64 ",\"own_crc32\":",
           h, n, epoch, size);
    if (verify_only)
        printf("null");
    else
        printf("\"0x%08" PRIx32 "\"", own_crc);
    printf(",\"verified\":[");
    const char *sep = "";
    for (uint64_t k = 0; k < n; k++) {
        if (k == h)
            continue;
        const struct result *r = &res[k];
        printf("%s{\"host\":%" PRIu64 ",\"crc32\":\"0x%08" PRIx32 "\",\"published_crc32\":"
               "\"0x%08" PRIx32 "\",\"mismatches\":%" PRIu64 ",\"first_mismatch\":",
               sep, k, r->crc, r->published, r->mismatches);
        if (r->mismatches)
            printf("%" PRIu64 "}", r->first_bad);
        else
            printf("null}");
        sep = ",";
    }
    printf("],\"mismatches\":%" PRIu64 ",\"wait_ns\":%" PRIu64 ",\"fill_ns\":", total, wait_ns);
    if (verify_only)
        printf("null");
    else
        printf("%" PRIu64, fill_ns);
    printf(",\"verify_ns\":%" PRIu64 ",\"op\":\"%s\",\"dev\":", verify_ns,
           verify_only ? "verify" : "run");
    json_str(dev);
    printf(",\"flags_offset\":%" PRIu64 ",\"base\":%" PRIu64 "}\n", fo, base);
    finish_output();
    return (total || crc_bad) ? EXIT_MISMATCH : 0;
}
