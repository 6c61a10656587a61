/*
 * pfcxl_mark: start or stop a measured phase of pfcxl's TCG plugin from a shell.
 *
 *     pfcxl_mark start|stop|profile K [--dax /dev/dax0.0] [--align MS]
 *     pfcxl_mark arm
 *
 * Stores 1 (start), 2 (stop) or 0x100 + K (select inject latency profile K) into the doorbell,
 * the last 64-byte line of the DAX device (guest/include/pfcxl_mark.h). Without the plugin the store is harmless: that line is
 * reserved for markers. `arm` wakes the plugin from its dormant boot state (pfcxl_arm in
 * pfcxl_mark.h; the guest's init runs it just before reporting ready) and touches no device.
 * --align MS first sleeps until the guest's monotonic clock is a multiple of MS milliseconds
 * (pfcxl_align): under --clock virtual a phase then starts at the same point of the kernel's tick
 * on every run. Prints one JSON line; exit status 0, or 2 on any error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../include/pfcxl_mark.h"

static int usage(void)
{
    fprintf(stderr, "usage: pfcxl_mark start|stop|profile K [--dax DEV] [--align MS]   (default DEV: /dev/dax0.0)\n"
                    "       pfcxl_mark arm\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *dax = "/dev/dax0.0";
    uint64_t value = 0;
    const char *what = NULL;
    unsigned long align_ms = 0;
    if (argc == 2 && !strcmp(argv[1], "arm")) {
        pfcxl_arm();
        printf("{\"tool\":\"pfcxl_mark\",\"mark\":\"arm\"}\n");
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "start"))
            value = PFCXL_MARK_START, what = argv[i];
        else if (!strcmp(argv[i], "stop"))
            value = PFCXL_MARK_STOP, what = argv[i];
        else if (!strcmp(argv[i], "profile") && i + 1 < argc) {
            char *end;
            unsigned long k = strtoul(argv[++i], &end, 10);
            if (*end || end == argv[i] || k > 0xff)
                return usage();
            value = PFCXL_MARK_PROFILE(k), what = argv[i - 1];
        }
        else if (!strcmp(argv[i], "--align") && i + 1 < argc) {
            char *end;
            align_ms = strtoul(argv[++i], &end, 10);
            if (*end || end == argv[i] || !align_ms || align_ms > 60000)
                return usage();
        }
        else if (!strcmp(argv[i], "--dax") && i + 1 < argc)
            dax = argv[++i];
        else if (!strncmp(argv[i], "--dax=", 6))
            dax = argv[i] + 6;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage();
            return 0;
        } else
            return usage();
    }
    if (!what)
        return usage();
    int rc = align_ms ? pfcxl_align((unsigned)align_ms) : 0;
    if (rc) {
        fprintf(stderr, "pfcxl_mark: --align %lu: %s\n", align_ms, strerror(-rc));
        return 2;
    }
    rc = pfcxl_mark(dax, value);
    if (rc) {
        fprintf(stderr, "pfcxl_mark: %s: %s\n", dax, strerror(-rc));
        return 2;
    }
    printf("{\"tool\":\"pfcxl_mark\",\"mark\":\"%s\",\"value\":%llu,\"dax\":\"%s\"}\n", what,
           (unsigned long long)value, dax);
    return 0;
}
