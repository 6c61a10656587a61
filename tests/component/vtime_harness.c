/*
 * Drives the plugin's virtual-time model (device/plugin/pfcxl_vtime.h) without QEMU, for
 * tests/component/test_vtime_model.py:
 *
 *     vtime_harness MODEL_FILE < accesses
 *
 * Each input line is one access of vCPU 0: `INSN VADDR HPA WRITE CLASS NT VALUE` (CLASS 0: local
 * DRAM, 1: fabric; VALUE: what a load returned, or - for none), or `cold INSN` (PFCXL_MARK_COLD).
 * For each access it prints the vCPU's timeline after it (`t PS`); each fabric request the
 * hierarchy issues is printed as `r LINE WRITE ISSUE_PS`; at the end `stats {JSON}`. A line
 * `nt HEX` prints `nt 1` when the instruction bytes HEX are a non-temporal store, else `nt 0`;
 * `profile K` switches to the model file's K-th fabric and prints `profile 1` (0: none such).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE 64ULL

/* what the patched QEMU exports: found by the model's dlsym (link with -rdynamic) */
static uint64_t charged_ns;
bool qemu_plugin_charge_virtual_ns(uint64_t ns);
__attribute__((visibility("default"))) bool qemu_plugin_charge_virtual_ns(uint64_t ns)
{
    charged_ns += ns;
    return true;
}

/* the clock's lead over the instructions: what was charged, and the jumps of `idle` lines */
uint64_t qemu_plugin_virtual_bias_ns(void);
__attribute__((visibility("default"))) uint64_t qemu_plugin_virtual_bias_ns(void)
{
    return charged_ns;
}

#include "../../device/plugin/pfcxl_vtime.h"

/* The harness is one host alone: no timeline (the plugin's pfcxl_timeline.h) to note
 * requests in or wait at. */
static void tl_note(int write, unsigned module, int hit, uint64_t issue_ps, uint64_t done_ps, int stalls)
{
    (void)write, (void)module, (void)hit, (void)issue_ps, (void)done_ps, (void)stalls;
}

static void tl_barrier(struct vt_cpu *c, uint64_t insn)
{
    (void)c, (void)insn;
}

static void vt_record(unsigned vcpu_index, uint64_t line, int write, uint64_t issue_ps)
{
    (void)vcpu_index;
    printf("r %" PRIu64 " %d %" PRIu64 "\n", line, write, issue_ps);
}

int main(int argc, char **argv)
{
    if (argc != 2 || vt_load(argv[1]) < 0 || vt_setup(1) < 0)
        return 2;
    struct vt_cpu *c = vt_cpus;
    vt_phase_start(1);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long insn, vaddr, hpa, value = 0;
        int write, cls, nt;
        char val[32], hex[64];
        if (sscanf(line, "nt %63s", hex) == 1) {
            uint8_t bytes[16];
            size_t n = 0;
            for (; n < sizeof bytes && hex[2 * n] && hex[2 * n + 1]; n++)
                sscanf(hex + 2 * n, "%2hhx", &bytes[n]);
            printf("nt %d\n", vt_is_nt_store(bytes, n));
            continue;
        }
        if (sscanf(line, "profile %d", &nt) == 1) {
            printf("profile %d\n", vt_select(nt));
            continue;
        }
        if (sscanf(line, "idle %llu", &value) == 1) {     /* halted: QEMU's sleep=off jumps the clock */
            charged_ns += value;
            continue;
        }
        if (sscanf(line, "cold %llu", &insn) == 1) {
            vt_cold(0, insn);
            continue;
        }
        if (sscanf(line, "%llu %llu %llu %d %d %d %31s", &insn, &vaddr, &hpa, &write, &cls, &nt, val) != 7) {
            fprintf(stderr, "vtime_harness: bad line: %s", line);
            return 2;
        }
        int has_value = strcmp(val, "-") != 0;
        if (has_value)
            value = strtoull(val, NULL, 0);
        vt_access(0, insn, vaddr, hpa, write, cls, nt, has_value, value);
        printf("t %" PRIu64 "\n", vt_now(c, insn));
    }
    char buf[1024];
    vt_stats_json(buf, sizeof buf, 1, 0);
    printf("stats {%s,\"applied_ns\":%" PRIu64 "}\n", buf, charged_ns);
    return 0;
}
