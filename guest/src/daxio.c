/*
 * daxio: write, verify, checksum and poke/peek a known pattern in device-DAX memory.
 *
 * Built static for the guest image:
 *     gcc -static -O2 -Wall -Wextra -Werror -o daxio guest/src/daxio.c
 *
 * It maps DEV (a device-DAX character device such as /dev/dax0.0, or a regular file for host
 * tests) with mmap(MAP_SHARED) over a 2 MiB-aligned window and touches the data ONLY through
 * volatile 8-byte loads and stores. Under QEMU TCG the CXL window is an I/O region: every access
 * is a slow-path I/O, and string instructions (memset/memcpy/memcmp, rep movs/stos) degrade to
 * one I/O per byte, so no libc string function is ever applied to the mapping.
 *
 * The pattern is mirrored by guest/pattern.py (pfcxl.guest.pattern); keep the two identical:
 *     word(seed, o) = 0x5046000000000000 ^ (seed << 40) ^ (o >> 3)
 * for the 8-byte word at byte offset o from the START OF THE DEVICE, stored little-endian.
 *
 * Exit status: 0 success; 1 verify found at least one mismatching word; 2 any error (bad
 * argument, range outside the file/device, open/fstat/mmap failure, bus error while accessing
 * the mapping). Errors are one line on stderr, starting with "daxio: ".
 */
#define _GNU_SOURCE

#define TOOL_NAME "daxio"
#include "../include/pfcxl_tool.h"

#define SEED_LIMIT (1ULL << 16)
#define EXIT_MISMATCH 1

static const char HELP[] =
    "usage: daxio SUBCOMMAND DEV [OPTIONS]\n"
    "\n"
    "Write, verify and checksum a known pattern in device-DAX memory (e.g. /dev/dax0.0), or in a\n"
    "regular file of at least the needed size (for host-side tests; the file is never extended).\n"
    "DEV is mapped with mmap(MAP_SHARED) over a 2 MiB-aligned window covering the range, and the\n"
    "data is accessed only with 8-byte (uint64) loads and stores.\n"
    "\n"
    "subcommands:\n"
    "  fill   DEV --size N [--offset O] --seed S\n"
    "         store the pattern word for every 8-byte word of [O, O+N); crc32 is computed over\n"
    "         the words written (no read-back)\n"
    "  verify DEV --size N [--offset O] --seed S\n"
    "         load every word of [O, O+N) and compare with the pattern; crc32 is over the bytes\n"
    "         read; exit status 1 if any word differs\n"
    "  crc    DEV --size N [--offset O]\n"
    "         crc32 of the bytes of [O, O+N)\n"
    "  poke   DEV --offset O --value V\n"
    "         store the uint64 V at byte offset O\n"
    "  peek   DEV --offset O\n"
    "         load the uint64 at byte offset O\n"
    "\n"
    "options (also accepted as --name=value):\n"
    "  --offset O  byte offset from the start of DEV (default 0); a multiple of 8\n"
    "  --size N    length in bytes; a multiple of 8, at least 8\n"
    "  --seed S    pattern seed, 0 <= S < 65536\n"
    "  --value V   64-bit value for poke\n"
    "  -h, --help  show this text and exit 0\n"
    "  Numbers are decimal or 0x-prefixed hex. O and N accept a suffix K, M or G\n"
    "  (KiB, MiB, GiB: powers of 1024), e.g. --size 64M --offset 0x200000.\n"
    "\n"
    "pattern: the 8-byte word at byte offset o, counted from the START OF DEV (not from\n"
    "  --offset), is 0x5046000000000000 ^ (S << 40) ^ (o >> 3), stored little-endian\n"
    "  (mirrored by pfcxl.guest.pattern).\n"
    "crc32: zlib's CRC-32 (reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF) over\n"
    "  the bytes in address order.\n"
    "\n"
    "output: one JSON line on stdout, for example\n"
    "  {\"tool\":\"daxio\",\"op\":\"verify\",\"dev\":\"/dev/dax0.0\",\"offset\":0,\"size\":67108864,"
    "\"seed\":7,\n"
    "   \"crc32\":\"0x1234abcd\",\"mismatches\":0,\"first_mismatch\":null,\"expected\":null,"
    "\"found\":null,\n"
    "   \"ns\":123456789}\n"
    "  offset, size: bytes (decimal). crc32: 8 hex digits. mismatches: count of differing words.\n"
    "  first_mismatch: byte offset from the start of DEV of the first differing word, or null;\n"
    "  expected/found: that word's pattern value and the value read (16 hex digits), or null.\n"
    "  fill prints offset, size, seed, crc32, mismatches (0), first_mismatch (null) and ns;\n"
    "  crc prints offset, size, crc32 and ns; peek/poke print offset and value (16 hex digits).\n"
    "  ns: nanoseconds of guest wall-clock time (CLOCK_MONOTONIC) spent in the data loop only\n"
    "  (not open/mmap). Under QEMU TCG this is emulator time, NOT fabric latency.\n"
    "\n"
    "exit status: 0 ok; 1 verify found mismatches; 2 error (bad argument, range outside DEV,\n"
    "  open/mmap failure, bus error). Errors are one line on stderr.\n";

/* ---------------------------------------------------------------- argument parsing */

enum op { OP_FILL, OP_VERIFY, OP_CRC, OP_POKE, OP_PEEK };

/* option bits */
#define O_OFFSET 1u
#define O_SIZE 2u
#define O_SEED 4u
#define O_VALUE 8u

static const struct opdef {
    const char *name;
    enum op op;
    unsigned allowed, required;
    int writes;
} OPS[] = {
    {"fill", OP_FILL, O_OFFSET | O_SIZE | O_SEED, O_SIZE | O_SEED, 1},
    {"verify", OP_VERIFY, O_OFFSET | O_SIZE | O_SEED, O_SIZE | O_SEED, 0},
    {"crc", OP_CRC, O_OFFSET | O_SIZE, O_SIZE, 0},
    {"poke", OP_POKE, O_OFFSET | O_VALUE, O_OFFSET | O_VALUE, 1},
    {"peek", OP_PEEK, O_OFFSET, O_OFFSET, 0},
};

struct args {
    const struct opdef *def;
    const char *dev;
    uint64_t offset, size, seed, value;
    unsigned given;
};

static const char *const OPTNAMES[] = {"--offset", "--size", "--seed", "--value"};

static void parse_args(int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof *a); /* a is ordinary memory, not the mapping */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(HELP, stdout);
            exit(fflush(stdout) == 0 ? 0 : EXIT_ERROR);
        }
    if (argc < 2)
        die("missing subcommand (fill, verify, crc, poke, peek); see daxio --help");
    for (size_t k = 0; k < sizeof OPS / sizeof OPS[0]; k++)
        if (!strcmp(argv[1], OPS[k].name))
            a->def = &OPS[k];
    if (!a->def)
        die("unknown subcommand '%s' (expected fill, verify, crc, poke or peek); see daxio --help",
            argv[1]);
    const char *op = a->def->name;

    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (arg[0] == '-' && arg[1] != '\0')
                die("%s: unknown option '%s'; see daxio --help", op, arg);
            if (a->dev)
                die("%s: unexpected argument '%s' (DEV is already '%s')", op, arg, a->dev);
            if (arg[0] == '\0')
                die("%s: DEV must not be empty", op);
            a->dev = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        int which = -1;
        for (int k = 0; k < 4; k++)
            if (strlen(OPTNAMES[k]) == nlen && !strncmp(arg, OPTNAMES[k], nlen))
                which = k;
        if (which < 0)
            die("%s: unknown option '%.*s'; see daxio --help", op, (int)nlen, arg);
        unsigned bit = 1u << which;
        if (!(a->def->allowed & bit))
            die("%s: option %s does not apply to this subcommand", op, OPTNAMES[which]);
        if (a->given & bit)
            die("%s: option %s given twice", op, OPTNAMES[which]);
        const char *val;
        if (eq) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc)
                die("%s: option %s needs a value", op, OPTNAMES[which]);
            val = argv[++i];
        }
        uint64_t v;
        int sized = (bit == O_OFFSET || bit == O_SIZE);
        if (parse_u64(val, NULL, sized ? PARSE_SUFFIX : 0, &v) != 0)
            die("%s: bad value '%s' for %s (want decimal or 0x hex%s, fitting in 64 bits)", op,
                val, OPTNAMES[which], sized ? ", optional K/M/G suffix" : "");
        switch (bit) {
        case O_OFFSET: a->offset = v; break;
        case O_SIZE: a->size = v; break;
        case O_SEED: a->seed = v; break;
        default: a->value = v; break;
        }
        a->given |= bit;
    }

    if (!a->dev)
        die("%s: missing DEV; see daxio --help", op);
    for (int k = 0; k < 4; k++)
        if ((a->def->required & (1u << k)) && !(a->given & (1u << k)))
            die("%s: missing required option %s; see daxio --help", op, OPTNAMES[k]);
    if (a->def->op == OP_POKE || a->def->op == OP_PEEK)
        a->size = 8;
    if (a->offset % 8)
        die("%s: --offset %" PRIu64 " is not a multiple of 8", op, a->offset);
    if (a->size == 0)
        die("%s: --size must be at least 8", op);
    if (a->size % 8)
        die("%s: --size %" PRIu64 " is not a multiple of 8", op, a->size);
    if ((a->given & O_SEED) && a->seed >= SEED_LIMIT)
        die("%s: --seed %" PRIu64 " is too big (must be < 65536)", op, a->seed);
    /* offset + size and the rounded-up window end must fit in off_t */
    if (a->offset > (uint64_t)INT64_MAX - WINDOW_ALIGN ||
        a->size > (uint64_t)INT64_MAX - WINDOW_ALIGN - a->offset)
        die("%s: range --offset %" PRIu64 " --size %" PRIu64 " is too large", op, a->offset,
            a->size);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    struct args a;
    parse_args(argc, argv, &a);
    const char *op = a.def->name;
    const char *dev = a.dev;

    struct stat st;
    int fd = open_dev(dev, a.def->writes, &st);
    uint64_t end = a.offset + a.size;
    if (S_ISREG(st.st_mode)) {
        if ((uint64_t)st.st_size < end)
            die("%s: range [%" PRIu64 ", %" PRIu64 ") is past the end of %s (%" PRIu64
                " bytes); the file is not extended",
                op, a.offset, end, dev, (uint64_t)st.st_size);
    } else if (S_ISCHR(st.st_mode)) {
        uint64_t devsize = dax_size(NULL, &st);
        if (devsize && devsize < end)
            die("%s: range [%" PRIu64 ", %" PRIu64 ") is past the end of %s (%" PRIu64 " bytes)",
                op, a.offset, end, dev, devsize);
    } else {
        die("%s: %s is neither a regular file nor a character device", op, dev);
    }

    uint64_t win_off, win_len;
    void *map = map_window(fd, dev, a.offset, end, a.def->writes, &win_off, &win_len);
    catch_sigbus_jump();
    if (sigsetjmp(g_fault_jmp, 1))
        die_bus_error(op, dev, map, win_off, win_len);

    crc_init();
    volatile uint64_t *p = (volatile uint64_t *)((char *)map + (a.offset - win_off));
    const uint64_t n = a.size / 8, first_word = a.offset;
    const uint64_t seed = a.seed;
    uint32_t state = 0xFFFFFFFFu;
    uint64_t mismatches = 0, bad_off = 0, bad_exp = 0, bad_found = 0, value = 0;
    uint64_t t0 = now_ns();
    switch (a.def->op) {
    case OP_FILL:
        for (uint64_t i = 0; i < n; i++) {
            uint64_t w = pattern_word(seed, first_word + 8 * i);
            p[i] = w;
            state = crc_word(state, w);
        }
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        break;
    case OP_VERIFY:
        for (uint64_t i = 0; i < n; i++) {
            uint64_t o = first_word + 8 * i;
            uint64_t got = p[i], want = pattern_word(seed, o);
            state = crc_word(state, got);
            if (got != want && mismatches++ == 0) {
                bad_off = o;
                bad_exp = want;
                bad_found = got;
            }
        }
        break;
    case OP_CRC:
        for (uint64_t i = 0; i < n; i++)
            state = crc_word(state, p[i]);
        break;
    case OP_POKE:
        p[0] = a.value;
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        value = a.value;
        break;
    case OP_PEEK:
        value = p[0];
        break;
    }
    uint64_t ns = now_ns() - t0;
    uint32_t crc = ~state;

    signal(SIGBUS, SIG_DFL);
    munmap(map, (size_t)win_len);
    close(fd);

    printf("{\"tool\":\"daxio\",\"op\":\"%s\",\"dev\":", op);
    json_str(dev);
    printf(",\"offset\":%" PRIu64, a.offset);
    switch (a.def->op) {
    case OP_FILL:
    case OP_VERIFY:
        printf(",\"size\":%" PRIu64 ",\"seed\":%" PRIu64 ",\"crc32\":\"0x%08" PRIx32 "\""
               ",\"mismatches\":%" PRIu64,
               a.size, seed, crc, mismatches);
        if (mismatches)
            printf(",\"first_mismatch\":%" PRIu64 ",\"expected\":\"0x%016" PRIx64 "\""
                   ",\"found\":\"0x%016" PRIx64 "\"",
                   bad_off, bad_exp, bad_found);
        else if (a.def->op == OP_VERIFY)
            printf(",\"first_mismatch\":null,\"expected\":null,\"found\":null");
        else
            printf(",\"first_mismatch\":null");
        printf(",\"ns\":%" PRIu64, ns);
        break;
    case OP_CRC:
        printf(",\"size\":%" PRIu64 ",\"crc32\":\"0x%08" PRIx32 "\",\"ns\":%" PRIu64, a.size,
               crc, ns);
        break;
    case OP_POKE:
    case OP_PEEK:
        printf(",\"value\":\"0x%016" PRIx64 "\"", value);
        break;
    }
    printf("}\n");
    finish_output();
    return mismatches ? EXIT_MISMATCH : 0;
}
