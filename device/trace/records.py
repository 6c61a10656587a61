"""The CXL access trace: one record per cache-line request, as the TCG plugin writes it into its
shared-memory ring and the fabric engine reads it. The C side (device/plugin/) mirrors this.

Ring file (mapped by the plugin and by pfcxl):
    header, 64 bytes:  magic u64 "PFCXLRNG", version u32 (1), record_size u32 (24),
                       capacity u64 (records), head u64 (written by the plugin),
                       tail u64 (written by the drainer), dropped u64 (0 unless the drainer
                       is gone), reserved to 64 bytes
    records[capacity] after the header; slot = index % capacity.
The plugin never overwrites an undrained record: when the ring is full it waits for the drainer,
so a trace is exact (the guest is slowed, never the count).

Record, 24 bytes, little endian:
    insn   u64  instructions the vCPU had executed when it made the access
    hpa    u64  host physical address of the cache line (64-byte aligned)
    size   u32  bytes the guest touched in that line (accesses to one line merged)
    write  u8   1 for a store, 0 for a load
    vcpu   u8   vCPU index
    host   u16  host id (0 from the plugin; pfcxl sets it when it merges hosts)
"""

from __future__ import annotations

import struct

RING_MAGIC = 0x474E524C5843_4650      # b"PFCXLRNG" little endian
RING_VERSION = 1
HEADER_SIZE = 64
# magic, version, record_size, capacity, head, tail, dropped; then reserved to HEADER_SIZE
HEADER_STRUCT = struct.Struct("<QIIQQQQ")
HEAD_OFFSET = struct.calcsize("<QIIQ")        # the u64s the plugin and the drainer store to
TAIL_OFFSET = HEAD_OFFSET + 8
DROPPED_OFFSET = TAIL_OFFSET + 8
RECORD_SIZE = 24
LINE = 64

# numpy structured dtype for records (numpy is imported lazily by the engine)
RECORD_FIELDS = [("insn", "<u8"), ("hpa", "<u8"), ("size", "<u4"), ("write", "u1"), ("vcpu", "u1"),
                 ("host", "<u2")]
