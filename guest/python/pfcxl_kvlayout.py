"""The KV block store's layout (docs/kvstore.md): where the store lives in a mapping, its binary
structures, key digests, and `format`. Standard library only; pfcxl_kvstore re-exports all of it.

Where the store lives: at device byte HOME, the first byte the direct data path's namespace leaves
alone (its info block takes each device's first 2 MiB). So its base is HOME in a CXL DAX device
and in the pool file on the host, and 0 in a direct DAX device, whose byte 0 is device byte HOME:
every path sees one store, and a direct boot does not overwrite it. `default_base` applies the rule.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import threading
import zlib
from typing import TYPE_CHECKING

# pfcxl.guest.python on the host, top-level modules in the guest (see __init__.py)
if TYPE_CHECKING or __package__:
    from . import pfcxl_guest
else:
    import pfcxl_guest

MAGIC = b"PFKVSTOR"
VERSION = 3             # 2: the host header's lease; 3: each index segment a hash table (WINDOW)
MAX_HOSTS = 256
MAX_SLOTS = 1 << 24     # records per host: a 1 GiB index segment
LINE = 64
PAGE = 4096
# A key's record lives in one of the WINDOW slots from its bucket on (cyclically): a lookup reads
# those WINDOW lines of each host's segment, whatever the slot count (docs/kvstore.md, "Index")
WINDOW = 16
# device byte of the store = data_path.DIRECT_OFFSET on the host side (tests/component/test_kvstore.py
# checks that they are equal): the direct path's devdax namespace data starts there
HOME = 2 << 20
NFIT = "ACPI0012"       # the ACPI NVDIMM root device: the direct path's DAX devices sit under it


class KVError(Exception):
    """A store that cannot be opened or formatted as asked; the message names the value."""


class Fields:
    """One binary structure declared once: (name, struct code) in order, little-endian."""

    def __init__(self, *fields: tuple[str, str]) -> None:
        self.names = [n for n, _ in fields]
        self.st = struct.Struct("<" + "".join(c for _, c in fields))
        self.offset = {}
        pos = 0
        for name, code in fields:
            self.offset[name] = pos
            pos += struct.calcsize("<" + code)

    def pack(self, **values) -> bytes:
        return self.st.pack(*(values.get(n, 0) for n in self.names))

    def unpack(self, buf, at: int = 0) -> dict:
        return dict(zip(self.names, self.st.unpack_from(buf, at)))


SUPER = Fields(("magic", "8s"), ("version", "I"), ("hosts", "I"), ("slots", "I"), ("chunk_tokens", "I"),
               ("headers_off", "Q"), ("index_off", "Q"), ("arena_off", "Q"), ("arena_bytes", "Q"),
               ("total", "Q"), ("crc", "I"))
# lease: the nonce of the process that has the host open for writing (0: nobody); it lives as long
# as the heartbeat moves (docs/kvstore.md, "One writer per host")
# lease_seq: the first sequence number of the lease's holder (a claim below it is an earlier
# holder's, dead); intent: 1 + the index slot its holder writes (or fills the extent of) next;
# blocked: 1 + the slot a holder that lost the host may still write once (0: none), which no
# holder uses (docs/kvstore.md, "A holder that resumes").
HEADER = Fields(("heartbeat", "Q"), ("next_seq", "Q"), ("clock", "Q"), ("evictions", "Q"), ("lease", "Q"),
                ("lease_seq", "Q"), ("intent", "Q"), ("blocked", "Q"))
# state: 0 empty, seq*2+1 a claim (being written), seq*2 (seq >= 1) published.
RECORD = Fields(("state", "Q"), ("key", "16s"), ("offset", "Q"), ("length", "Q"), ("crc", "I"),
                ("rcrc", "I"), ("last_use", "Q"), ("reserved", "Q"))
assert RECORD.st.size == LINE and HEADER.st.size <= LINE
SIGNED = RECORD.offset["rcrc"]        # the record crc covers state..crc; last_use is the owner's own

_FENCE = threading.Lock()


def fence() -> None:
    """A full memory barrier: an uncontended lock is a locked read-modify-write on x86, which
    orders earlier stores before later loads (what the claim scan needs)."""
    with _FENCE:
        pass


def key_digest(key) -> bytes:
    """Every key (bytes, str or int, e.g. a chunk hash) as the 16 bytes the index holds."""
    if isinstance(key, int):
        key = key.to_bytes(32, "little", signed=True)
    elif isinstance(key, str):
        key = key.encode()
    return hashlib.blake2b(bytes(key), digest_size=16).digest()


def bucket(digest: bytes, slots: int) -> int:
    """The first slot of `digest`'s window in a segment of `slots` records."""
    return int.from_bytes(digest[:8], "little") % slots


def chunk_keys(tokens, chunk_tokens: int) -> list[bytes]:
    """LMCache's prefix keys: chunk i's key hashes chunk i-1's key and chunk i's tokens, so a key
    names the whole prefix up to its chunk's end. Only whole chunks get a key."""
    keys, prev = [], b""
    for start in range(0, len(tokens) - chunk_tokens + 1, chunk_tokens):
        raw = struct.pack(f"<{chunk_tokens}q", *tokens[start:start + chunk_tokens])
        prev = hashlib.blake2b(prev + raw, digest_size=16).digest()
        keys.append(prev)
    return keys


def geometry(total: int, hosts: int, slots: int) -> dict:
    """Where everything goes in `total` bytes for `hosts` hosts of `slots` records each."""
    if not 1 <= hosts <= MAX_HOSTS:
        raise KVError(f"hosts {hosts} is out of range (1..{MAX_HOSTS})")
    if not 1 <= slots <= MAX_SLOTS:
        raise KVError(f"slots {slots} is out of range (1..{MAX_SLOTS})")
    headers_off = PAGE
    index_off = up(headers_off + hosts * LINE, PAGE)
    arena_off = up(index_off + hosts * slots * LINE, PAGE)
    arena_bytes = (total - arena_off) // hosts // PAGE * PAGE
    if arena_bytes < PAGE:
        raise KVError(f"{total} bytes hold no arena of at least {PAGE} bytes for {hosts} hosts x {slots} slots")
    return dict(headers_off=headers_off, index_off=index_off, arena_off=arena_off, arena_bytes=arena_bytes)


def check_super(sb: dict, size: int) -> None:
    """Refuse a superblock whose geometry is not one `format` could have written: counts within
    bounds, regions aligned, in order, not overlapping and inside the store (a corrupt field would
    send reads and writes anywhere). One message naming the field; the C core (kv_check_super)
    has the same rules in the same order and words. The caller checked total <= `size`."""
    hosts, slots, t = sb["hosts"], sb["slots"], sb["total"]
    rules = [           # each rule is evaluated only if those before it hold (as in C)
        ("hosts", lambda: 1 <= hosts <= MAX_HOSTS, f"1..{MAX_HOSTS}"),
        ("slots", lambda: 1 <= slots <= MAX_SLOTS, f"1..{MAX_SLOTS}"),
        ("chunk_tokens", lambda: sb["chunk_tokens"] >= 1, "at least 1"),
        ("total", lambda: 2 * PAGE <= t <= size, f"at least {2 * PAGE}"),
        ("headers_off", lambda: PAGE <= sb["headers_off"] <= t and sb["headers_off"] % LINE == 0,
         f"a multiple of {LINE} from byte {PAGE}, inside the store"),
        ("index_off", lambda: sb["headers_off"] + hosts * LINE <= sb["index_off"] <= t and sb["index_off"] % LINE == 0,
         f"a multiple of {LINE} after the host headers, inside the store"),
        ("arena_off", lambda: (sb["index_off"] + hosts * slots * LINE <= sb["arena_off"] <= t
                               and sb["arena_off"] % PAGE == 0),
         f"a multiple of {PAGE} after the index, inside the store"),
        ("arena_bytes", lambda: (PAGE <= sb["arena_bytes"] <= (t - sb["arena_off"]) // hosts
                                 and sb["arena_bytes"] % PAGE == 0),
         f"a multiple of {PAGE}, at least {PAGE}, with every host's arena inside the store"),
    ]
    for field, ok, want in rules:
        if not ok():
            raise KVError(f"store superblock is corrupt: {field} {sb[field]} is not {want}")


def up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def is_direct(path: str) -> bool:
    """True if `path` is a direct-path DAX device (an NVDIMM namespace under the ACPI NFIT)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if not stat.S_ISCHR(st.st_mode):
        return False
    node = os.path.realpath(f"/sys/dev/char/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
    return f"/{NFIT}:" in node


def default_base(path: str) -> int:
    """The store's byte in `path`: 0 on a direct DAX device, HOME on anything else (module doc)."""
    return 0 if is_direct(path) else HOME


class Mapping:
    """`path` mapped MAP_SHARED in whole 2 MiB units (pfcxl_guest.Dax); `mem` is the store's
    bytes, from `base` (None: default_base) for `size` bytes (None: to the end)."""

    def __init__(self, path: str, size: int | None = None, base: int | None = None) -> None:
        self.path = path
        self.base = default_base(path) if base is None else base
        if self.base < 0 or self.base % PAGE:
            raise KVError(f"store base {self.base} is not a non-negative multiple of {PAGE}")
        if size is not None and size < 2 * PAGE:
            raise KVError(f"store size {size} is under {2 * PAGE} bytes")
        try:
            self.dax = pfcxl_guest.Dax(path, None if size is None else self.base + size)
        except OSError as exc:
            raise KVError(f"cannot open {path}: {exc.strerror or exc}") from exc
        except ValueError as exc:           # mmap refuses an empty file
            raise KVError(f"{path} is 0 bytes: too small for a store at byte {self.base}") from exc
        if self.dax.size < self.base + 2 * PAGE:
            self.dax.close()
            raise KVError(f"{path} is {self.dax.size} bytes: too small for a store at byte {self.base}")
        self.size, self.map = self.dax.size - self.base, self.dax.map
        # the device address of the store's byte 0, as the device's poison list counts
        self.device_off = (HOME if is_direct(path) else 0) + self.base
        self.mem = memoryview(self.map)[self.base:]

    def where_else(self) -> int | None:
        """Another base at which this mapping holds a store's magic (for an error's hint)."""
        whole = memoryview(self.map)
        try:
            return next((b for b in (0, HOME) if b != self.base and b + len(MAGIC) <= len(whole)
                         and whole[b:b + len(MAGIC)] == MAGIC), None)
        finally:
            whole.release()

    def close(self) -> None:
        self.mem.release()
        self.dax.close()


def format(path: str, hosts: int, slots: int, chunk_tokens: int, size: int | None = None,
           base: int | None = None) -> dict:
    """Write an empty store over `path` at `base` (`size` bytes): every header and record zeroed,
    then the superblock, whose magic goes last so that no one opens a half-formatted store."""
    m = Mapping(path, size, base)
    try:
        g = geometry(m.size, hosts, slots)
        m.mem[0:8] = bytes(8)
        fence()
        m.mem[g["headers_off"]:g["arena_off"]] = bytes(g["arena_off"] - g["headers_off"])
        sb = dict(magic=MAGIC, version=VERSION, hosts=hosts, slots=slots, chunk_tokens=chunk_tokens,
                  total=m.size, **g)
        check_super(sb, m.size)         # before a byte is written (chunk_tokens 0, say)
        raw = SUPER.pack(**sb)
        raw = raw[:-4] + struct.pack("<I", zlib.crc32(raw[:-4]))
        m.mem[8:len(raw)] = raw[8:]
        fence()
        m.mem[0:8] = MAGIC
        m.map.flush()
        return SUPER.unpack(raw)
    finally:
        m.close()
