/*
 * bandwidth: sequential or random transfers of 32 B .. 1 KiB (any multiple of 8) moved with
 * volatile 8-byte loads/stores by 1..N threads; bytes moved are counted by the threads.
 *
 * Built static for the guest image (glibc >= 2.34 has pthreads in libc.a: no -pthread needed):
 *     gcc -static -O2 -Wall -Wextra -Werror -o bandwidth guest/src/bandwidth.c
 *
 * Conventions as guest/src/daxio.c (shared helpers: guest/include/pfcxl_tool.h): 2 MiB-aligned
 * MAP_SHARED window of a device or file, only volatile 8-byte accesses to it, one JSON line on
 * stdout, errors one line on stderr, exit 0 ok / 1 some row moved other than the requested
 * bytes / 2 error. Output fields: guest/bench_schema.md.
 */
#define _GNU_SOURCE
#include <pthread.h>

#define TOOL_NAME "bandwidth"
#include "../include/pfcxl_bench.h"

#define MAX_THREADS 256
#define MAX_LIST 64
#define WRITE_SEED 0x4257ULL /* "BW": stores write daxio's pattern for this seed */
#define EXIT_SHORT 1
#define CLOCK_NOTE "guest CLOCK_MONOTONIC (under TCG: emulator time, not fabric latency)"

static const char HELP[] =
    "usage: bandwidth --target T [--pattern seq,random] [--op read,write,mixed]\n"
    "                 [--sizes 32,64,128,256,512,1024] [--threads 1,2,...] [--bytes BYTES]\n"
    "                 [--span BYTES] [--read-pct P] [--seed S] [--mark-rows 0|1]\n"
    "                 [--stripe G,N,K] [--rotate BYTES]\n"
    "\n"
    "Memory bandwidth by transfer size. A transfer moves SIZE bytes with SIZE/8 volatile 8-byte\n"
    "loads (read) or stores (write). One measurement (row) per combination of pattern, op,\n"
    "size and thread count, in that nesting order: BYTES/SIZE transfers shared out over the\n"
    "threads; thread t works in its own slice [t*L, (t+1)*L) of [0, span), L = span/threads\n"
    "rounded down to 64 bytes, at SIZE-aligned slots: seq walks the slots in order (wrapping),\n"
    "random draws them uniformly (seeded per thread). mixed: P% of each thread's transfers are\n"
    "reads, the rest writes, evenly interleaved. Each thread counts the bytes it moved; a row's\n"
    "time runs from the first thread's start to the last thread's end.\n"
    "Stores write daxio's pattern for seed 0x4257 (word at byte offset o from the start of the\n"
    "target = 0x5046000000000000 ^ (0x4257 << 40) ^ (o >> 3)), so daxio verify can check them.\n"
    "\n"
    "options (also accepted as --name=value; LIST = comma-separated):\n"
    "  --target T     /dev/daxN.M (device-DAX, MAP_SHARED, 2 MiB-aligned), 'anon' (local DRAM)\n"
    "                 or a regular file of at least span bytes (never extended). Required.\n"
    "  --pattern LIST seq and/or random (default seq,random)\n"
    "  --op LIST      read, write and/or mixed (default read,write,mixed)\n"
    "  --sizes LIST   transfer sizes in bytes, multiples of 8, 8..1M (default\n"
    "                 32,64,128,256,512,1024)\n"
    "  --threads LIST thread counts, 1..256 (default 1)\n"
    "  --bytes BYTES  bytes requested per row, a multiple of every size (default 64M)\n"
    "  --span BYTES   region used, at least threads*size per slice (default 64M)\n"
    "  --read-pct P   percent of reads for --op mixed, 0..100 (default 50)\n"
    "  --seed S       seed of the random offsets (default 1)\n"
    "  --mark-rows B  1: ring the target's pfcxl doorbell (start/stop) around each row, so\n"
    "                 the TCG plugin captures each row's accesses as one phase (default 0)\n"
    "  --stripe G,N,K use only the K-th of every N granules of G bytes: the slots of [0, span)\n"
    "                 are laid on those granules, so the target must hold N*span bytes (a host's\n"
    "                 share of an N-way interleave at granularity G: one module). G a multiple\n"
    "                 of every size and of 64, span a multiple of G, K < N (default: off)\n"
    "  --rotate BYTES start each thread's walk this far into its slice, wrapping (seq: where it\n"
    "                 begins; a multiple of every size; default 0)\n"
    "  -h, --help     show this text and exit 0\n"
    "  Numbers are decimal or 0x hex; BYTES accepts a suffix K, M or G (KiB, MiB, GiB).\n"
    "\n"
    "output: one JSON line: {\"tool\":\"bandwidth\",...,\"results\":[{\"pattern\":\"seq\",\n"
    "  \"op\":\"read\",\"size\":64,\"threads\":1,\"bytes_requested\":67108864,\n"
    "  \"bytes_moved\":67108864,\"seconds\":0.05,\"MBps\":1342.2,...}],\"clock\":...}\n"
    "  MBps = bytes_moved / seconds / 10^6. All fields: guest/bench_schema.md. Times are guest\n"
    "  CLOCK_MONOTONIC; under QEMU TCG that is emulator time, NOT fabric throughput.\n"
    "\n"
    "exit status: 0 ok; 1 some row moved a byte count other than requested; 2 error (bad\n"
    "  argument, target too small, open/mmap/thread failure, bus error). One line on stderr.\n";

/* ---------------------------------------------------------------- workers */

enum { OP_READ, OP_WRITE, OP_MIXED };
static const char *const PATTERNS[] = {"seq", "random", NULL};
static const char *const OPS[] = {"read", "write", "mixed", NULL};

struct worker {
    volatile uint64_t *base; /* the mapping; the slice starts at word off/8 */
    uint64_t off, slots, size, transfers, read_pct, seed, first_slot;
    int random, op;
    pthread_t tid;
    uint64_t moved, reads, writes, t_start, t_end, sink;
};

static pthread_barrier_t g_start;
static uint64_t g_stripe, g_every = 1, g_at; /* --stripe: offset o of [0, span) -> granule K of N */

static inline uint64_t striped(uint64_t o)
{
    return g_every == 1 ? o : ((o / g_stripe) * g_every + g_at) * g_stripe + o % g_stripe;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    const uint64_t words = w->size / 8, magic = 0x5046000000000000ULL ^ (WRITE_SEED << 40);
    uint64_t rs = w->seed, slot = w->first_slot, acc = 0, moved = 0, reads = 0, writes = 0, sink = 0;
    pthread_barrier_wait(&g_start);
    w->t_start = now_ns();
    for (uint64_t t = 0; t < w->transfers; t++) {
        uint64_t s = slot;
        if (w->random)
            s = (uint64_t)(((unsigned __int128)splitmix64(&rs) * w->slots) >> 64);
        else
            slot = slot + 1 == w->slots ? 0 : slot + 1;
        uint64_t o = striped(w->off + s * w->size); /* byte offset from the start of the target */
        volatile uint64_t *q = w->base + o / 8;
        int rd = w->op == OP_READ;
        if (w->op == OP_MIXED && (acc += w->read_pct) >= 100) { /* Bresenham interleave */
            acc -= 100;
            rd = 1;
        }
        if (rd) {
            for (uint64_t i = 0; i < words; i++, moved += 8)
                sink += q[i];
            reads++;
        } else {
            for (uint64_t i = 0; i < words; i++, moved += 8)
                q[i] = magic ^ ((o >> 3) + i);
            writes++;
        }
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    w->t_end = now_ns();
    w->moved = moved;
    w->reads = reads;
    w->writes = writes;
    w->sink = sink;
    return NULL;
}

/* Comma-separated names into indices of choices[]; returns the count. */
static size_t name_list(const char *name, const char *s, const char *const *choices, int *out)
{
    size_t n = 0;
    for (const char *p = s;; p++) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        int k = 0;
        while (choices[k] && !(strlen(choices[k]) == len && !strncmp(choices[k], p, len)))
            k++;
        if (!choices[k])
            die("bad value '%.*s' in %s (want %s or %s%s)", (int)len, p, name, choices[0],
                choices[1], choices[2] ? ", or mixed" : "");
        if (n == MAX_LIST)
            die("%s: more than %d values", name, MAX_LIST);
        out[n++] = k;
        if (!c)
            return n;
        p = c;
    }
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    struct opt o[] = {{"--target", 0}, {"--pattern", 0}, {"--op", 0},   {"--sizes", 0},
                      {"--threads", 0}, {"--bytes", 0},  {"--span", 0}, {"--read-pct", 0},
                      {"--seed", 0},   {"--mark-rows", 0}, {"--stripe", 0}, {"--rotate", 0},
                      {0, 0}};
    parse_opts(argc, argv, o, HELP);
    const char *target = o[0].val;
    if (!target || !*target)
        die("missing --target (/dev/daxN.M, anon or a file); see bandwidth --help");
    int pats[MAX_LIST], ops[MAX_LIST];
    uint64_t sizes[MAX_LIST], threads[MAX_LIST], maxsize = 0, maxthreads = 0;
    size_t np = name_list("--pattern", o[1].val ? o[1].val : "seq,random", PATTERNS, pats);
    size_t no = name_list("--op", o[2].val ? o[2].val : "read,write,mixed", OPS, ops);
    size_t ns = num_list("--sizes", o[3].val ? o[3].val : "32,64,128,256,512,1024", sizes,
                         MAX_LIST);
    size_t nt = num_list("--threads", o[4].val ? o[4].val : "1", threads, MAX_LIST);
    uint64_t bytes = num(&o[5], 64ULL << 20, 1, 8, 1ULL << 50);
    uint64_t span = num(&o[6], 64ULL << 20, 1, 64, 1ULL << 50);
    uint64_t read_pct = num(&o[7], 50, 0, 0, 100);
    uint64_t seed = num(&o[8], 1, 0, 0, UINT64_MAX);
    int mark_rows = (int)num(&o[9], 0, 0, 0, 1);
    uint64_t rotate = num(&o[11], 0, 1, 0, 1ULL << 50);
    if (o[10].val) {
        uint64_t st[3];
        if (num_list("--stripe", o[10].val, st, 3) != 3 || !st[1] || st[2] >= st[1] || !st[0] ||
            st[0] % 64 || span % st[0])
            die("--stripe '%s': want G,N,K with G a multiple of 64 dividing span, N >= 1, K < N",
                o[10].val);
        g_stripe = st[0], g_every = st[1], g_at = st[2];
    }
    for (size_t i = 0; i < ns; i++) {
        if (sizes[i] < 8 || sizes[i] > (1 << 20) || sizes[i] % 8)
            die("--sizes: %" PRIu64 " is not a multiple of 8 in [8, 1048576]", sizes[i]);
        if (bytes % sizes[i])
            die("--bytes %" PRIu64 " is not a multiple of size %" PRIu64, bytes, sizes[i]);
        if (rotate % sizes[i] || (g_every > 1 && g_stripe % sizes[i]))
            die("--rotate %" PRIu64 " and the --stripe granule must be multiples of size %" PRIu64,
                rotate, sizes[i]);
        maxsize = sizes[i] > maxsize ? sizes[i] : maxsize;
    }
    for (size_t i = 0; i < nt; i++) {
        if (threads[i] < 1 || threads[i] > MAX_THREADS)
            die("--threads: %" PRIu64 " is out of range [1, %d]", threads[i], MAX_THREADS);
        maxthreads = threads[i] > maxthreads ? threads[i] : maxthreads;
    }
    if ((span / maxthreads) / 64 * 64 < maxsize)
        die("--span %" PRIu64 " is too small: each of %" PRIu64 " threads needs a slice of at "
            "least %" PRIu64 " bytes", span, maxthreads, maxsize);

    const char *kind;
    if (g_every > 1 && span > (1ULL << 50) / g_every)
        die("--span %" PRIu64 " times --stripe's N is too large", span);
    volatile uint64_t *p = map_target(target, span * g_every, &kind);
    for (uint64_t off = 0; off < span; off += 64)
        if (off % 4096 == 0 || (g_every > 1 && off % g_stripe == 0))
            p[striped(off) / 8] = p[striped(off) / 8]; /* fault the used pages in before row 1 */
    struct pfcxl_doorbell db = {0};
    rows_marker_open(target, mark_rows, &db);
    struct worker *w = calloc(maxthreads, sizeof *w);
    size_t nrows = np * no * ns * nt, rows_len = 0;
    char *rows_json = NULL;
    FILE *rows = open_memstream(&rows_json, &rows_len);
    if (!w || !rows)
        die("out of memory for %" PRIu64 " threads", maxthreads);
    int short_row = 0;
    for (size_t r = 0; r < nrows; r++) { /* pattern, op, size, threads: outermost first */
        int pat = pats[r / (no * ns * nt)], op = ops[r / (ns * nt) % no];
        uint64_t size = sizes[r / nt % ns], n = threads[r % nt], transfers = bytes / size;
        uint64_t slice = span / n / 64 * 64, first = UINT64_MAX, last = 0;
        uint64_t moved = 0, reads = 0, writes = 0;
        pthread_barrier_init(&g_start, NULL, (unsigned)n);
        rows_marker_ring(&db, PFCXL_MARK_START);
        for (uint64_t t = 0; t < n; t++) {
            w[t] = (struct worker){.base = p, .off = t * slice, .slots = slice / size,
                                   .first_slot = rotate / size % (slice / size),
                                   .size = size, .read_pct = read_pct, .random = pat, .op = op,
                                   .transfers = transfers / n + (t < transfers % n),
                                   .seed = seed + t * 0x632BE59BD9B4E019ULL};
            int e = pthread_create(&w[t].tid, NULL, worker_main, &w[t]);
            if (e)
                die("pthread_create (thread %" PRIu64 "): %s", t, strerror(e));
        }
        for (uint64_t t = 0; t < n; t++) {
            pthread_join(w[t].tid, NULL);
            moved += w[t].moved;
            reads += w[t].reads;
            writes += w[t].writes;
            first = w[t].t_start < first ? w[t].t_start : first;
            last = w[t].t_end > last ? w[t].t_end : last;
        }
        rows_marker_ring(&db, PFCXL_MARK_STOP);
        pthread_barrier_destroy(&g_start);
        double sec = (double)(last - first) / 1e9;
        fprintf(rows, "%s{\"pattern\":\"%s\",\"op\":\"%s\",\"size\":%" PRIu64 ",\"threads\":%" PRIu64
                ",\"transfers\":%" PRIu64 ",\"read_transfers\":%" PRIu64 ",\"write_transfers\":%"
                PRIu64 ",\"bytes_requested\":%" PRIu64 ",\"bytes_moved\":%" PRIu64
                ",\"seconds\":%.9f,\"MBps\":%.3f,\"thread_bytes\":[",
                r ? "," : "", PATTERNS[pat], OPS[op], size, n, transfers, reads, writes, bytes,
                moved, sec, sec > 0 ? (double)moved / sec / 1e6 : 0.0);
        for (uint64_t t = 0; t < n; t++)
            fprintf(rows, t ? ",%" PRIu64 : "%" PRIu64, w[t].moved);
        fprintf(rows, "]}");
        short_row |= moved != bytes;
    }
    pfcxl_doorbell_close(&db);
    if (fclose(rows) != 0)
        die("buffering output: %s", strerror(errno));

    printf("{\"tool\":\"bandwidth\",\"target\":");
    json_str(target);
    printf(",\"kind\":\"%s\",\"span\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"read_pct\":%" PRIu64
           ",\"seed\":%" PRIu64 ",\"write_seed\":%llu,\"cpus_online\":%ld,\"stripe\":[%" PRIu64
           ",%" PRIu64 ",%" PRIu64 "],\"rotate\":%" PRIu64 ",\"results\":[%s",
           kind, span, bytes, read_pct, seed, WRITE_SEED, sysconf(_SC_NPROCESSORS_ONLN),
           g_stripe ? g_stripe : span, g_every, g_at, rotate, rows_json);
    printf("],\"clock\":\"%s\"}\n", CLOCK_NOTE);
    finish_output();
    if (short_row)
        fail(EXIT_SHORT, "some row moved a byte count other than the requested %" PRIu64, bytes);
    return 0;
}
