"""A multi-host KV-cache block store over one shared mapping (/dev/daxN.M, or the appliance's pool
file on the host). Standard library only: the Debian guest's python3 and the host run this file.

    import pfcxl_kvstore as kv
    with kv.Store.open("/dev/dax0.0", host=2) as s:     # format first: kv.format(path, hosts, ...)
        s.put(b"key", data); s.get(b"key")              # bytes, or None (a miss)

The layout and the protocol are in docs/kvstore.md. In short: a superblock, one header line per
host, one index segment per host (64-byte records) and one arena per host. A host writes only its
own header, segment and arena (no cross-host locks, no cross-host atomics); readers scan every
host's segment and verify a record and its block before using them.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import time
import zlib

import pfcxl_guest

MAGIC = b"PFKVSTOR"
VERSION = 1
LINE = 64
PAGE = 4096


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
HEADER = Fields(("heartbeat", "Q"), ("next_seq", "Q"), ("clock", "Q"), ("evictions", "Q"))
# state: 0 empty, seq*2+1 a claim (being written), seq*2 (seq >= 1) published.
RECORD = Fields(("state", "Q"), ("key", "16s"), ("offset", "Q"), ("length", "Q"), ("crc", "I"),
                ("rcrc", "I"), ("last_use", "Q"), ("reserved", "Q"))
assert RECORD.st.size == LINE and HEADER.st.size <= LINE
_SIGNED = RECORD.offset["rcrc"]        # the record crc covers state..crc; last_use is the owner's own

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
    if not 1 <= hosts <= 256:
        raise KVError(f"hosts {hosts} is out of range (1..256)")
    if slots < 1:
        raise KVError(f"slots {slots} must be at least 1")
    headers_off = PAGE
    index_off = _up(headers_off + hosts * LINE, PAGE)
    arena_off = _up(index_off + hosts * slots * LINE, PAGE)
    arena_bytes = (total - arena_off) // hosts // PAGE * PAGE
    if arena_bytes < PAGE:
        raise KVError(f"{total} bytes hold no arena of at least {PAGE} bytes for {hosts} hosts x {slots} slots")
    return dict(headers_off=headers_off, index_off=index_off, arena_off=arena_off, arena_bytes=arena_bytes)


def _up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class Mapping:
    """`path` mapped MAP_SHARED from offset 0 in whole 2 MiB units (pfcxl_guest.Dax), as bytes."""

    def __init__(self, path: str, size: int | None = None) -> None:
        self.path = path
        try:
            self.dax = pfcxl_guest.Dax(path, size)
        except OSError as exc:
            raise KVError(f"cannot open {path}: {exc.strerror or exc}") from exc
        if self.dax.size < 2 * PAGE:
            self.dax.close()
            raise KVError(f"{path} is {self.dax.size} bytes: too small for a store")
        self.size, self.map = self.dax.size, self.dax.map
        self.mem = memoryview(self.map)

    def close(self) -> None:
        self.mem.release()
        self.dax.close()


def format(path: str, hosts: int, slots: int, chunk_tokens: int, size: int | None = None) -> dict:
    """Write an empty store over `path` (the first `size` bytes): every header and record zeroed,
    then the superblock, whose magic goes last so that no one opens a half-formatted store."""
    m = Mapping(path, size)
    try:
        g = geometry(m.size, hosts, slots)
        m.mem[0:8] = bytes(8)
        fence()
        m.mem[g["headers_off"]:g["arena_off"]] = bytes(g["arena_off"] - g["headers_off"])
        sb = dict(magic=MAGIC, version=VERSION, hosts=hosts, slots=slots, chunk_tokens=chunk_tokens,
                  total=m.size, **g)
        raw = SUPER.pack(**sb)
        raw = raw[:-4] + struct.pack("<I", zlib.crc32(raw[:-4]))
        m.mem[8:len(raw)] = raw[8:]
        fence()
        m.mem[0:8] = MAGIC
        m.map.flush()
        return SUPER.unpack(raw)
    finally:
        m.close()


class Store:
    """One host's view: it writes its own segment and arena, and reads everybody's."""

    def __init__(self, m: Mapping, host: int | None, stale_s: float) -> None:
        self.m, self.host, self.stale_s = m, host, stale_s
        self.poisoned: list[tuple[int, int]] = []   # (offset, length) a reader must not use
        sb = SUPER.unpack(m.mem)
        raw = bytes(m.mem[:SUPER.st.size])
        if sb["magic"] != MAGIC:
            raise KVError(f"{m.path} holds no store (no {MAGIC.decode()} magic at byte 0); format it first")
        if sb["version"] != VERSION or zlib.crc32(raw[:-4]) != sb["crc"]:
            raise KVError(f"store superblock version {sb['version']} / crc {sb['crc']:#x} is not version {VERSION} "
                          "with a good crc")
        if sb["total"] > m.size:
            raise KVError(f"store was formatted for {sb['total']} bytes; the mapping has {m.size}")
        self.sb = sb
        self.hosts, self.slots = sb["hosts"], sb["slots"]
        if host is not None and not 0 <= host < self.hosts:
            raise KVError(f"host {host} is out of range (0 <= host < {self.hosts})")
        self.own: dict[int, dict] = {}           # slot -> record, of this host's published records
        if host is not None:
            self._recover()

    @classmethod
    def open(cls, path: str, host: int | None = None, size: int | None = None, stale_s: float = 5.0) -> "Store":
        """host None: read-only use (get, scan, verify); host h: also put into arena h."""
        m = Mapping(path, size)
        try:
            return cls(m, host, stale_s)
        except BaseException:
            m.close()
            raise

    def close(self) -> None:
        self.m.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ addresses
    @property
    def chunk_tokens(self) -> int:
        return self.sb["chunk_tokens"]

    def arena(self, host: int) -> tuple[int, int]:
        start = self.sb["arena_off"] + host * self.sb["arena_bytes"]
        return start, start + self.sb["arena_bytes"]

    def _slot_at(self, host: int, slot: int) -> int:
        return self.sb["index_off"] + (host * self.slots + slot) * LINE

    def _header_at(self, host: int) -> int:
        return self.sb["headers_off"] + host * LINE

    def _header(self, host: int) -> dict:
        return HEADER.unpack(self.m.mem, self._header_at(host))

    def _set_header(self, **fields) -> None:
        at = self._header_at(self.host)
        for name, value in fields.items():
            struct.pack_into("<Q", self.m.mem, at + HEADER.offset[name], value)

    def _state(self, host: int, slot: int) -> int:
        return struct.unpack_from("<Q", self.m.mem, self._slot_at(host, slot))[0]

    def _set_state(self, slot: int, value: int) -> None:
        struct.pack_into("<Q", self.m.mem, self._slot_at(self.host, slot), value)
        fence()

    def _beat(self) -> None:
        self._set_header(heartbeat=self._header(self.host)["heartbeat"] + 1)

    # ------------------------------------------------------------ reading
    def _valid(self, host: int, slot: int):
        """The published record in (host, slot) if it is well formed, else None."""
        at = self._slot_at(host, slot)
        rec = RECORD.unpack(self.m.mem, at)
        if rec["state"] == 0 or rec["state"] & 1:
            return None
        if zlib.crc32(self.m.mem[at:at + _SIGNED]) != rec["rcrc"]:
            return None
        lo, hi = self.arena(host)
        if not (lo <= rec["offset"] and rec["offset"] + rec["length"] <= hi):
            return None
        return rec

    def _slots_keyed(self, host: int, digest: bytes):
        """Slots of `host` whose key field holds `digest` (mmap.find searches in place, no copy)."""
        base = self._slot_at(host, 0)
        end = base + self.slots * LINE
        at = self.m.map.find(digest, base, end)
        while at >= 0:
            if (at - base) % LINE == RECORD.offset["key"]:
                yield (at - base) // LINE
            at = self.m.map.find(digest, at + 1, end)

    def find(self, key) -> list[tuple[int, int, dict]]:
        """Every published, well-formed record of `key`: (host, slot, record)."""
        d = key_digest(key)
        return [(h, s, rec) for h in range(self.hosts) for s in self._slots_keyed(h, d)
                if (rec := self._valid(h, s)) is not None]

    def read_block(self, host: int, slot: int, rec: dict):
        """The block's bytes if they still match the record's crc and the record did not change
        while they were copied (the owner invalidates a record before reusing its space)."""
        if self._poisoned(rec):
            return None
        data = bytes(self.m.mem[rec["offset"]:rec["offset"] + rec["length"]])
        fence()
        if zlib.crc32(data) != rec["crc"] or self._state(host, slot) != rec["state"]:
            return None
        return data

    def _poisoned(self, rec: dict) -> bool:
        """On the device's poison list (pfcxl_poison.media_errors): the bytes may read fine but are lost."""
        return any(o < rec["offset"] + rec["length"] and rec["offset"] < o + n for o, n in self.poisoned)

    def get(self, key):
        """The block stored under `key` (bytes), or None: missing, evicted, or failing its check."""
        for host, slot, rec in self.find(key):
            data = self.read_block(host, slot, rec)
            if data is not None:
                if host == self.host:
                    self._touch(slot)
                return data
        return None

    def exists(self, key) -> bool:
        return bool(self.find(key))

    def scan(self):
        """Every slot of every host: (host, slot, record or None if not published and well formed,
        raw state)."""
        for h in range(self.hosts):
            for s in range(self.slots):
                yield h, s, self._valid(h, s), self._state(h, s)

    # ------------------------------------------------------------ writing (own arena only)
    def _recover(self) -> None:
        """Claims left by a crash of this host are withdrawn; the published records are ours."""
        for s in range(self.slots):
            rec = self._valid(self.host, s)
            if rec is not None:
                self.own[s] = rec
            elif self._state(self.host, s):          # a claim, or a record that fails its check
                self._set_state(s, 0)

    def _touch(self, slot: int) -> None:
        clock = self._header(self.host)["clock"] + 1
        self._set_header(clock=clock)
        struct.pack_into("<Q", self.m.mem, self._slot_at(self.host, slot) + RECORD.offset["last_use"], clock)
        self.own[slot]["last_use"] = clock

    def _withdraw(self, slot: int) -> None:
        self._set_state(slot, 0)        # before its space is reused: readers re-check the state
        del self.own[slot]

    def _evict(self, slot: int) -> None:
        self._withdraw(slot)
        self._set_header(evictions=self._header(self.host)["evictions"] + 1)

    def _place(self, length: int) -> tuple[int, int]:
        """A free slot and a free extent of `length` bytes in our arena, evicting least recently
        used records until both exist."""
        lo, hi = self.arena(self.host)
        if length > hi - lo:
            raise KVError(f"block of {length} bytes does not fit in an arena of {hi - lo} bytes")
        while True:
            free = next((s for s in range(self.slots) if s not in self.own and self._state(self.host, s) == 0), None)
            at = lo
            for rec in sorted(self.own.values(), key=lambda r: r["offset"]):
                if rec["offset"] - at >= length:
                    break
                at = _up(rec["offset"] + rec["length"], LINE)
            if free is not None and hi - at >= length:
                return free, at
            self._evict(min(self.own, key=lambda s: self.own[s]["last_use"]))

    def _contend(self, digest: bytes) -> bool:
        """After our claim: may we write? No if the key is published anywhere, or a lower host
        claims it and is alive; wait on higher hosts' claims until they publish (we lose), drop
        them, or stop beating for stale_s (we go on). docs/kvstore.md has the argument."""
        watched: dict[tuple[int, int], tuple[int, float]] = {}
        while True:
            pending = False
            for h in range(self.hosts):
                if h == self.host:
                    continue
                for s in self._slots_keyed(h, digest):
                    st = self._state(h, s)
                    if st and not st & 1:
                        if self._valid(h, s) is not None:
                            return False
                        continue
                    if not st & 1:
                        continue
                    beat = self._header(h)["heartbeat"]
                    seen, since = watched.get((h, s), (None, 0.0))
                    now = time.monotonic()
                    if seen != beat:
                        watched[(h, s)] = (beat, now)
                        if seen is not None and h < self.host:
                            return False        # a live lower claimant wins
                        pending = True
                    elif now - since < self.stale_s:
                        pending = True         # not yet known to be alive or dead
            if not pending:
                return True
            self._beat()
            time.sleep(0.001)

    def put(self, key, data) -> bool:
        """Store `data` under `key` in our arena. False if the key is already stored (by anyone)
        or another host won the race for it: blocks are content-addressed, so theirs is ours."""
        if self.host is None:
            raise KVError("this store was opened without a host: it can only read")
        data = bytes(data)
        digest = key_digest(key)
        if self.find(key):
            return False
        slot, offset = self._place(len(data))
        header = self._header(self.host)
        seq = header["next_seq"] + 1
        self._set_header(next_seq=seq)
        at = self._slot_at(self.host, slot)
        struct.pack_into("<Q16s", self.m.mem, at, seq * 2 + 1, digest)     # the claim
        fence()
        if not self._contend(digest):
            self._set_state(slot, 0)
            return False
        for start in range(0, len(data), 1 << 20):
            piece = data[start:start + (1 << 20)]
            self.m.mem[offset + start:offset + start + len(piece)] = piece
            self._beat()                         # alive: a waiting lower host must not think us dead
        clock = header["clock"] + 1
        rec = dict(state=seq * 2, key=digest, offset=offset, length=len(data), crc=zlib.crc32(data), last_use=clock)
        raw = bytearray(RECORD.pack(**rec))
        struct.pack_into("<I", raw, _SIGNED, zlib.crc32(raw[:_SIGNED]))
        self.m.mem[at + 8:at + LINE] = raw[8:]
        fence()                                  # data and fields before the state that publishes them
        struct.pack_into("<Q", self.m.mem, at, seq * 2)
        fence()
        self._set_header(clock=clock)
        rec["rcrc"] = struct.unpack_from("<I", raw, _SIGNED)[0]
        self.own[slot] = rec
        return True

    def remove(self, key) -> bool:
        """Withdraw our own record of `key` (others' records are theirs to drop)."""
        for host, slot, _ in self.find(key):
            if host == self.host:
                self._withdraw(slot)
                return True
        return False

    def stats(self) -> dict:
        hosts = []
        for h in range(self.hosts):
            recs = [r for s in range(self.slots) if (r := self._valid(h, s)) is not None]
            hdr = self._header(h)
            hosts.append(dict(host=h, blocks=len(recs), bytes=sum(r["length"] for r in recs),
                              evictions=hdr["evictions"], sequence=hdr["next_seq"]))
        return dict(superblock={k: v for k, v in self.sb.items() if k not in ("magic", "crc")}, hosts=hosts,
                    blocks=sum(h["blocks"] for h in hosts), bytes=sum(h["bytes"] for h in hosts))

    def verify(self) -> dict:
        """Every published record and its block checked; overlapping blocks in one arena are
        corruption too. Claims (crashed or in flight) are counted, never read."""
        bad, good, claims = [], 0, 0
        for h in range(self.hosts):
            extents = []
            for s in range(self.slots):
                st = self._state(h, s)
                if st & 1:
                    claims += 1
                    continue
                if not st:
                    continue
                rec = self._valid(h, s)
                if rec is None:
                    bad.append(dict(host=h, slot=s, why="record fails its crc or points outside the arena"))
                elif self._poisoned(rec):
                    bad.append(dict(host=h, slot=s, key=rec["key"].hex(), why="poisoned (the device's poison list)"))
                elif self.read_block(h, s, rec) is None and self._state(h, s) == rec["state"]:
                    bad.append(dict(host=h, slot=s, key=rec["key"].hex(), why="block fails its crc"))
                else:
                    good += 1
                    extents.append((rec["offset"], rec["offset"] + rec["length"], s))
            extents.sort()
            for (a0, a1, sa), (b0, _, sb) in zip(extents, extents[1:]):
                if b0 < a1:
                    bad.append(dict(host=h, slot=sb, why=f"block overlaps slot {sa}'s"))
        return dict(good=good, bad=bad, claims=claims)
