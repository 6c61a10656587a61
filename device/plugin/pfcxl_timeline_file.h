/*
 * The timeline file's layout (pfcxl_timeline.h uses it; device/appliance/timeline.py mirrors it
 * with ctypes, field for field).
 */
#ifndef PFCXL_TIMELINE_FILE_H
#define PFCXL_TIMELINE_FILE_H

#include <stdint.h>

#define TL_MAGIC 0x31304c5458434650ULL      /* "PFCXLT01" little endian */
#define TL_VERSION 1
#define TL_HOSTS 16
#define TL_REQS 16384                       /* per host and quantum; more are not merged (overflow) */
#define TL_QUEUES 256                       /* per stage: hosts x modules */
#define TL_STAGES 9                         /* 4 write stages, the memory, 4 read stages */

enum tl_state { TL_FREE, TL_IN, TL_LEFT, TL_GONE };

struct tl_req {
    uint32_t t_ps;              /* issue time after the quantum's start */
    uint32_t local_ps;          /* its latency on the host's own queues */
    uint16_t module;
    uint8_t write, hit, stalls, pad[3];
};

struct tl_slot {
    uint32_t state, pid;
    uint64_t arrived;           /* the epoch it has arrived at the end of, plus 1 */
    uint64_t n_reqs;            /* in this quantum */
    uint64_t charge_ps;         /* the leader's answer for the last quantum */
    uint64_t time_ps;           /* timeline time it has reached */
    uint64_t quanta, requests, overflow, contention_ps, wait_ns, joined_epoch, left_epoch;
    uint64_t spent_ps;          /* its requests' own latencies per quantum, a running mean */
    uint64_t pad[2];
};

struct tl_file {
    uint64_t magic;
    uint32_t version, expected;         /* hosts to wait for before time 0 */
    uint64_t quantum_ps;
    uint64_t join_timeout_ms;           /* a start that waits longer goes on without the rest */
    uint64_t digest;                    /* the model file's: 0 until the first host joins */
    uint32_t lock, lock_pid;
    uint32_t started, epoch_word;       /* futex words */
    uint64_t epoch;                     /* quanta completed */
    uint64_t merged, leader_ns, gone;
    uint64_t free_ps[TL_STAGES][TL_QUEUES];
    struct tl_slot slots[TL_HOSTS];
    struct tl_req reqs[TL_HOSTS][TL_REQS];
};

#endif /* PFCXL_TIMELINE_FILE_H */
