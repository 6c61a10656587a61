/*
 * pfcxl's own declarations of the part of QEMU's TCG plugin API that pfcxl_plugin.c uses.
 *
 * Debian ships no qemu-plugin.h, but qemu-system-x86_64 10.0.2 exports the API (plugin API
 * version: min 2, current 4; check with `nm -D /usr/bin/qemu-system-x86_64 | grep qemu_plugin_`).
 * Everything here is written from the documented API: function names and signatures, the enum
 * values and the layout of the few structures passed by value. Only what the plugin calls is
 * declared; the functions are resolved against the QEMU binary when it loads the plugin.
 */
#ifndef PFCXL_QEMU_PLUGIN_API_H
#define PFCXL_QEMU_PLUGIN_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PFCXL_EXPORT __attribute__((visibility("default")))

/* The API level this plugin is written against. The loader reads the exported int
 * `qemu_plugin_version` and refuses a plugin outside [min, current] of the running QEMU. */
#define PFCXL_PLUGIN_API_VERSION 4

typedef uint64_t qemu_plugin_id_t;
typedef uint32_t qemu_plugin_meminfo_t;   /* opaque handle describing one memory access */

struct qemu_plugin_tb;        /* translation block, valid during the translation callback */
struct qemu_plugin_insn;      /* one instruction of such a block */
struct qemu_plugin_hwaddr;    /* physical side of one access, valid during the memory callback */
struct qemu_plugin_scoreboard;

/* What QEMU tells qemu_plugin_install about itself (only valid during that call). */
typedef struct qemu_info_t {
    const char *target_name;
    struct {
        int min;
        int cur;
    } version;
    bool system_emulation;
    union {
        struct {
            int smp_vcpus;
            int max_vcpus;
        } system;
    };
} qemu_info_t;

/* A u64 field at `offset` inside each vCPU's element of a scoreboard (passed by value). */
typedef struct {
    struct qemu_plugin_scoreboard *score;
    size_t offset;
} qemu_plugin_u64;

enum qemu_plugin_cb_flags {
    QEMU_PLUGIN_CB_NO_REGS = 0,
    QEMU_PLUGIN_CB_R_REGS = 1,
    QEMU_PLUGIN_CB_RW_REGS = 2,
};

enum qemu_plugin_mem_rw {
    QEMU_PLUGIN_MEM_R = 1,
    QEMU_PLUGIN_MEM_W = 2,
    QEMU_PLUGIN_MEM_RW = 3,
};

enum qemu_plugin_op {
    QEMU_PLUGIN_INLINE_ADD_U64 = 0,
    QEMU_PLUGIN_INLINE_STORE_U64 = 1,
};

/* The value a load returned or a store wrote (returned by value). */
enum qemu_plugin_mem_value_type {
    QEMU_PLUGIN_MEM_VALUE_U8 = 0,
    QEMU_PLUGIN_MEM_VALUE_U16 = 1,
    QEMU_PLUGIN_MEM_VALUE_U32 = 2,
    QEMU_PLUGIN_MEM_VALUE_U64 = 3,
    QEMU_PLUGIN_MEM_VALUE_U128 = 4,
};

typedef struct {
    enum qemu_plugin_mem_value_type type;
    union {
        uint8_t u8;
        uint16_t u16;
        uint32_t u32;
        uint64_t u64;
        struct {
            uint64_t low, high;
        } u128;
    } data;
} qemu_plugin_mem_value;

/* Callback types */
typedef void (*qemu_plugin_simple_cb_t)(qemu_plugin_id_t id);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*qemu_plugin_vcpu_simple_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index);
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_vcpu_mem_cb_t)(unsigned int vcpu_index, qemu_plugin_meminfo_t info,
                                          uint64_t vaddr, void *userdata);

/* Exported by the plugin */
PFCXL_EXPORT extern int qemu_plugin_version;
PFCXL_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                     char **argv);

/* Registration */
void qemu_plugin_register_vcpu_init_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_simple_cb_t cb);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_register_vcpu_mem_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_mem_cb_t cb,
                                      enum qemu_plugin_cb_flags flags, enum qemu_plugin_mem_rw rw,
                                      void *userdata);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_udata_cb_t cb,
                                            enum qemu_plugin_cb_flags flags, void *userdata);
/* Unregisters every callback of the plugin and flushes the translated code (asynchronously: at
 * the vCPUs' next safe point), then calls cb, which may register callbacks anew. */
void qemu_plugin_reset(qemu_plugin_id_t id, qemu_plugin_simple_cb_t cb);
/* Inline op on the vCPU's element of a scoreboard, before each execution of the instruction. */
void qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(struct qemu_plugin_insn *insn,
                                                         enum qemu_plugin_op op,
                                                         qemu_plugin_u64 entry, uint64_t imm);

/* Translation-time queries */
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
size_t qemu_plugin_insn_size(const struct qemu_plugin_insn *insn);
/* Copies up to len bytes of the instruction; returns how many. */
size_t qemu_plugin_insn_data(const struct qemu_plugin_insn *insn, void *dest, size_t len);

/* Memory-access queries (only inside a memory callback) */
unsigned int qemu_plugin_mem_size_shift(qemu_plugin_meminfo_t info);
bool qemu_plugin_mem_is_store(qemu_plugin_meminfo_t info);
qemu_plugin_mem_value qemu_plugin_mem_get_value(qemu_plugin_meminfo_t info);
struct qemu_plugin_hwaddr *qemu_plugin_get_hwaddr(qemu_plugin_meminfo_t info, uint64_t vaddr);
bool qemu_plugin_hwaddr_is_io(const struct qemu_plugin_hwaddr *haddr);
uint64_t qemu_plugin_hwaddr_phys_addr(const struct qemu_plugin_hwaddr *haddr);
/* An interned string (same pointer for the same name), valid while the plugin is loaded. */
const char *qemu_plugin_hwaddr_device_name(const struct qemu_plugin_hwaddr *h);

/* Per-vCPU scoreboards */
struct qemu_plugin_scoreboard *qemu_plugin_scoreboard_new(size_t element_size);
void qemu_plugin_scoreboard_free(struct qemu_plugin_scoreboard *score);
uint64_t qemu_plugin_u64_get(qemu_plugin_u64 entry, unsigned int vcpu_index);

/* Output: goes to QEMU's log, shown only with `-d plugin` (and to a file with -D). */
void qemu_plugin_outs(const char *string);

#endif /* PFCXL_QEMU_PLUGIN_API_H */
