"""A multi-host KV-cache block store over one shared mapping (/dev/daxN.M, or the appliance's pool
file on the host). Standard library only: the Debian guest's python3 and the host run this file.

    import pfcxl_kvstore as kv
    with kv.Store.open("/dev/dax0.0", host=2) as s:     # format first: kv.format(path, hosts, ...)
        s.put(b"key", data); s.get(b"key")              # bytes, or None (a miss)

The store starts at the device's byte 2 MiB, after the direct data path's namespace info block:
byte 2 MiB of a CXL /dev/daxN.M or of the pool file, byte 0 of a direct DAX device; open() and
format() find that base themselves (base= to choose another; pfcxl_kvlayout has the rule).

The layout and the protocol are in docs/kvstore.md. In short: a superblock, one header line per
host, one index segment per host (64-byte records) and one arena per host. A host writes only its
own header, segment and arena (no cross-host locks, no cross-host atomics); readers scan every
host's segment and verify a record and its block before using them.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import zlib
from collections import OrderedDict
from typing import TYPE_CHECKING

# pfcxl.guest.python on the host, top-level modules in the guest (see __init__.py)
if TYPE_CHECKING or __package__:
    from .pfcxl_kvarena import Arena
    from .pfcxl_kvlayout import (HEADER, HOME, LINE, MAGIC, MAX_SLOTS, PAGE, RECORD, SIGNED, SUPER, VERSION, WINDOW,  # noqa: F401
                                 Fields, KVError, Mapping, check_super, chunk_keys, default_base, fence, format,
                                 geometry, bucket, is_direct, key_digest, up)
else:
    from pfcxl_kvarena import Arena
    from pfcxl_kvlayout import (HEADER, HOME, LINE, MAGIC, MAX_SLOTS, PAGE, RECORD, SIGNED, SUPER, VERSION, WINDOW,  # noqa: F401
                                Fields, KVError, Mapping, check_super, chunk_keys, default_base, fence, format,
                                geometry, bucket, is_direct, key_digest, up)

U64 = (1 << 64) - 1
SETTLE_S = 0.01     # how long a new lease must stand unchanged before it is ours (two openers at once)
BEAT_S = 0.1        # an open store's heartbeat period at most: far below any opener's stale_s
WATCH_S = 0.5       # an opener watches a held lease at least this long, whatever its stale_s: 5 beat periods
RECHECK_S = WATCH_S / 2     # a holder silent this long (stopped, starved) proves its lease again before writing


class Store:
    """One host's view: it writes its own segment and arena, and reads everybody's."""

    def __init__(self, m: Mapping, host: int | None, stale_s: float) -> None:
        self.m, self.host, self.stale_s = m, host, stale_s
        self.poisoned: list[tuple[int, int]] = []   # device (offset, length) a reader must not use
        sb = SUPER.unpack(m.mem)
        raw = bytes(m.mem[:SUPER.st.size])
        if sb["magic"] != MAGIC:
            other = m.where_else()
            hint = f"; one starts at byte {other}: open it with base {other}" if other is not None else \
                "; format it first"
            raise KVError(f"{m.path} holds no store (no {MAGIC.decode()} magic at byte {m.base}){hint}")
        if sb["version"] != VERSION:
            raise KVError(f"store version {sb['version']} is not this code's version {VERSION}: format it anew "
                          "(every block is lost)")
        if zlib.crc32(raw[:-4]) != sb["crc"]:
            raise KVError(f"store superblock crc {sb['crc']:#x} does not match its bytes: the superblock is corrupt")
        if sb["total"] > m.size:
            raise KVError(f"store was formatted for {sb['total']} bytes; the mapping has {m.size}")
        check_super(sb, m.size)
        self.sb = sb
        self.hosts, self.slots = sb["hosts"], sb["slots"]
        if host is not None and not 0 <= host < self.hosts:
            raise KVError(f"host {host} is out of range (0 <= host < {self.hosts})")
        self.own: dict[int, dict] = {}           # slot -> record, of this host's published records
        self.lru: OrderedDict[int, None] = OrderedDict()     # those slots, least recently used first
        self.pins: dict[int, int] = {}           # slot -> pin count: our blocks eviction must not take
        self.space: Arena | None = None          # our arena's free gaps
        self.index_bytes = 0                     # index bytes lookups read (the index's cost)
        self.lease, self._lost, self._stop, self._beater = 0, False, threading.Event(), None
        self._seq, self._alive, self._blocked = 0, 0.0, -1     # our last sequence number; see _confirm, _recover
        if host is not None:
            if self._header(host)["next_seq"] >= 1 << 62:
                raise KVError(f"host {host}'s header is corrupt: next_seq {self._header(host)['next_seq']} is beyond "
                              "2^62; format the store anew")
            self.lease = self._take_lease()
            self._beater = threading.Thread(target=self._keep_lease, name=f"kv-lease-{host}", daemon=True)
            self._beater.start()
            self._recover()

    @classmethod
    def open(cls, path: str, host: int | None = None, size: int | None = None, stale_s: float = 5.0,
             base: int | None = None) -> "Store":
        """host None: read-only use (get, scan, verify); host h: also put into arena h. The store
        starts at byte `base` of `path` (None: pfcxl_kvlayout.default_base)."""
        m = Mapping(path, size, base)
        try:
            return cls(m, host, stale_s)
        except BaseException:
            m.close()
            raise

    def close(self) -> None:
        """Release our lease (if it is still ours) and unmap."""
        if self._beater is not None:
            self._stop.set()
            self._beater.join()
            self._beater = None
        if self.lease and self._confirm():      # a lease (opened with a host), still ours
            self._set_header(lease=0)
            fence()
        self.lease = 0
        self.m.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ addresses
    @property
    def _me(self) -> int:
        """Our host: what writing, and reading our segment alone, need."""
        if self.host is None:
            raise KVError("this store was opened without a host: it can only read every host's segment")
        return self.host

    @property
    def _gaps(self) -> Arena:
        """Our arena's free gaps (known once _recover has run, for a store opened with a host)."""
        if self.space is None:
            raise KVError("this store was opened without a host: it has no arena to write")
        return self.space

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

    def header(self, host: int) -> dict:
        """Host `host`'s header line: heartbeat, next_seq, clock, evictions, lease."""
        return HEADER.unpack(self.m.mem, self._header_at(host))

    _header = header

    def _set_header(self, **fields) -> None:
        """Our header's fields written: callers have checked the lease (_may_write, _confirm)."""
        at = self._header_at(self._me)
        for name, value in fields.items():      # counters wrap as u64 (a corrupt one must not stop us)
            struct.pack_into("<Q", self.m.mem, at + HEADER.offset[name], value & U64)

    def _state(self, host: int, slot: int) -> int:
        return struct.unpack_from("<Q", self.m.mem, self._slot_at(host, slot))[0]

    def _set_state(self, slot: int, value: int) -> None:
        self._may_write(slot)
        struct.pack_into("<Q", self.m.mem, self._slot_at(self._me, slot), value)
        fence()

    def _beat(self) -> None:
        self._may_write()
        self._set_header(heartbeat=self._header(self._me)["heartbeat"] + 1)

    # ------------------------------------------------------------ the host's lease: one writer per host
    def _take_lease(self) -> int:
        """Become the host's one writer: a lease held by a live process (its heartbeat moves within
        stale_s) refuses us; a dead holder's expires after stale_s, as its claims do. Then our
        nonce must stand for SETTLE_S: of two openers at once, a later writer of the word wins."""
        hdr = self._header(self._me)
        if hdr["lease"]:
            since, watch = time.monotonic(), max(self.stale_s, WATCH_S)    # at least a few beat periods
            while time.monotonic() - since < watch:
                time.sleep(min(0.01, watch / 8))
                now = self._header(self._me)
                if now["lease"] == 0:
                    break                                    # closed meanwhile
                if now["heartbeat"] != hdr["heartbeat"] or now["lease"] != hdr["lease"]:
                    raise KVError(f"host {self.host} is open for writing by another process (its lease is held and "
                                  "its heartbeat moves): close it there, or use another host")
        taken = hdr["lease"] != 0 and self._header(self._me)["lease"] != 0    # from a holder that did not close
        mine = int.from_bytes(os.urandom(8), "little") | 1
        self._set_header(lease=mine)
        fence()
        time.sleep(SETTLE_S)
        if self._header(self._me)["lease"] != mine:
            raise KVError(f"host {self.host} was opened for writing by another process at the same time; "
                          "it holds the host's lease now")
        # an earlier holder (stopped, say) may have picked next_seq + 1 without writing it: skip it
        self._seq = self._header(self._me)["next_seq"] + 1
        self._set_header(lease_seq=self._seq + 1)
        if taken:       # its last announced slot: it may be stopped just before writing there
            self._set_header(blocked=self._header(self._me)["intent"])
        self._alive = time.monotonic()
        self._set_header(heartbeat=self._header(self._me)["heartbeat"] + 1)
        return mine

    def _keep_lease(self) -> None:
        """Beat while the store is open, so that an idle holder is not taken for dead; stop (and
        refuse further puts) if another process took the lease."""
        while not self._stop.wait(min(self.stale_s / 4, BEAT_S)):
            if not self._confirm():
                return
            self._set_header(heartbeat=self._header(self._me)["heartbeat"] + 1)

    def _confirm(self) -> bool:
        """Is the lease still ours? False for good once it is not. A holder that was silent for
        RECHECK_S (stopped, starved) may have been judged dead by an opener that has not yet
        written its nonce: it beats, waits for such a nonce (2 SETTLE_S) and looks again."""
        if self._lost or self._header(self._me)["lease"] != self.lease:
            self._lost = True
            return False
        now = time.monotonic()
        if now - self._alive > RECHECK_S:
            self._set_header(heartbeat=self._header(self._me)["heartbeat"] + 1)
            fence()
            time.sleep(2 * SETTLE_S)
            if self._header(self._me)["lease"] != self.lease:
                self._lost = True
                return False
        self._alive = max(self._alive, now)
        return True

    def _own_lease(self) -> None:
        if not self._confirm():
            raise KVError(f"host {self.host}'s lease was taken by another process: this store no longer writes")

    before_write = None     # tests only: called after the last check before each write to shared state

    def _may_write(self, slot: int | None = None) -> None:
        """Before every write to shared state: the lease must still be ours (else KVError). A
        write to index slot `slot` (or to the extent its record names) is announced in our
        header's intent first: a process that takes the host over while we are stopped between
        the check and the write never reuses that slot or extent (_recover), so the one write we
        may still make after resuming lands on nothing of theirs (docs/kvstore.md, "A holder
        that resumes")."""
        if slot is not None:
            self._own_lease()
            self._set_header(intent=slot + 1)
        self._own_lease()
        if self.before_write is not None:
            self.before_write()

    # ------------------------------------------------------------ reading
    def _valid(self, host: int, slot: int, digest: bytes | None = None):
        """The published record in (host, slot) if it is well formed (and holds `digest`), else
        None. One snapshot: the state word, then the whole record, which must carry that state
        (a reader re-reads the state after the block: docs/kvstore.md, "Reading")."""
        at = self._slot_at(host, slot)
        state = self._state(host, slot)
        if state == 0 or state & 1:
            return None
        raw = bytes(self.m.mem[at:at + LINE])
        rec = RECORD.unpack(raw)
        if rec["state"] != state or (digest is not None and rec["key"] != digest):
            return None
        if zlib.crc32(raw[:SIGNED]) != rec["rcrc"]:
            return None
        lo, hi = self.arena(host)
        if not (lo <= rec["offset"] and rec["offset"] + rec["length"] <= hi):
            return None
        return rec

    def window(self, digest: bytes) -> list[int]:
        """The slots where `digest`'s record may live in any host's segment (pfcxl_kvlayout.WINDOW)."""
        first = bucket(digest, self.slots)
        return [(first + i) % self.slots for i in range(min(WINDOW, self.slots))]

    def _slots_keyed(self, host: int, digest: bytes):
        """Slots of `host`'s window for `digest` whose key field holds it: the window's lines are
        copied in one or two pieces (it may wrap) and searched; `index_bytes` counts them."""
        first, n = bucket(digest, self.slots), min(WINDOW, self.slots)
        pieces = [(first, min(n, self.slots - first))]
        if pieces[0][1] < n:
            pieces.append((0, n - pieces[0][1]))
        for start, count in pieces:
            at = self._slot_at(host, start)
            raw = bytes(self.m.mem[at:at + count * LINE])
            self.index_bytes += len(raw)
            pos = raw.find(digest)
            while pos >= 0:
                if pos % LINE == RECORD.offset["key"]:
                    yield start + pos // LINE
                pos = raw.find(digest, pos + 1)

    def find(self, key, alone: bool = False) -> list[tuple[int, int, dict]]:
        """Every published, well-formed record of `key`: (host, slot, record); alone: in our own
        segment only (a host that uses the store as a private cache)."""
        d = key_digest(key)
        return [(h, s, rec) for h in ((self._me,) if alone else range(self.hosts)) for s in self._slots_keyed(h, d)
                if (rec := self._valid(h, s, d)) is not None]

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
        at = self.m.device_off + rec["offset"]
        return any(o < at + rec["length"] and at < o + n for o, n in self.poisoned)

    def get(self, key):
        """The block stored under `key` (bytes), or None: missing, evicted, or failing its check."""
        return self.load(key)[0]

    def load(self, key, alone: bool = False) -> tuple:
        """(bytes, the host whose arena held them, copies that failed their check) for `key`; the
        bytes are None on a miss. A copy withdrawn while it was read is a miss, not a failure.
        alone: our own arena only (as find)."""
        failed = 0
        for host, slot, rec in self.find(key, alone):
            data = self.read_block(host, slot, rec)
            if data is not None:
                if host == self.host:
                    self._touch(slot, rec)
                return data, host, failed
            if self._state(host, slot) == rec["state"]:
                failed += 1
        return None, None, failed

    def exists(self, key, alone: bool = False) -> bool:
        return bool(self.find(key, alone))

    def scan(self):
        """Every slot of every host: (host, slot, record or None if not published and well formed,
        raw state)."""
        for h in range(self.hosts):
            for s in range(self.slots):
                yield h, s, self._valid(h, s), self._state(h, s)

    # ------------------------------------------------------------ writing (own arena only)
    def _recover(self) -> None:
        """Claims left by a crash of this host are withdrawn; the published records are ours. The
        header's blocked slot is not: a holder that lost the host (taken over while it did not
        beat) may be stopped just before writing it (or the extent its record names), and write
        it once when it resumes. That slot is never used, and the extent it names never reused."""
        blocked = self._header(self._me)["blocked"]
        self._blocked = blocked - 1 if 0 < blocked <= self.slots else -1
        lo, hi = self.arena(self._me)
        kept = []
        for s in range(self.slots):
            rec = self._valid(self._me, s)
            if s == self._blocked:
                body = RECORD.unpack(self.m.mem, self._slot_at(self._me, s))
                if lo <= body["offset"] and body["offset"] + body["length"] <= hi:
                    kept.append((body["offset"], body["length"]))
            if rec is not None and s != self._blocked:
                self.own[s] = rec
            elif rec is None and self._state(self._me, s):     # a claim, or a record that fails its check
                self._set_state(s, 0)
        for s in sorted(self.own, key=lambda s: self.own[s]["last_use"]):
            self.lru[s] = None
        kept += [(r["offset"], r["length"]) for r in self.own.values()]
        self.space = Arena(lo, hi, kept)

    def _touch(self, slot: int, rec: dict) -> None:
        """Our record `rec` in `slot` was hit: most recently used now. Not if the slot holds
        another record than ours (one we do not own), nor once our lease is gone."""
        mine = self.own.get(slot)
        if mine is None or mine["state"] != rec["state"] or not self._confirm():
            return
        clock = self._header(self._me)["clock"] + 1
        self._set_header(clock=clock)
        struct.pack_into("<Q", self.m.mem, self._slot_at(self._me, slot) + RECORD.offset["last_use"], clock)
        self.own[slot]["last_use"] = clock
        self.lru.move_to_end(slot)

    def _withdraw(self, slot: int) -> None:
        self._set_state(slot, 0)        # before its space is reused: readers re-check the state
        rec = self.own.pop(slot)
        del self.lru[slot]
        self.pins.pop(slot, None)
        self._gaps.give(rec["offset"], rec["length"])

    def _evict(self, slot: int) -> None:
        self._withdraw(slot)
        self._may_write()
        self._set_header(evictions=self._header(self._me)["evictions"] + 1)

    def _place(self, length: int, digest: bytes) -> tuple[int, int]:
        """A free slot in `digest`'s window (else the window's least recently used record is
        evicted) and a free extent of `length` bytes in our arena (evicting least recently used
        records until one exists)."""
        lo, hi = self.arena(self._me)
        if length > hi - lo:
            raise KVError(f"block of {length} bytes does not fit in an arena of {hi - lo} bytes")
        slots = self.window(digest)
        free = next((s for s in slots if s not in self.own and s != self._blocked and self._state(self._me, s) == 0),
                    None)
        if free is None:
            ours = [s for s in slots if s in self.own and s not in self.pins]
            if not ours:                         # a window of claims, pinned blocks and the blocked slot only
                raise KVError(f"host {self.host} has no slot it may use in this key's window of {len(slots)} "
                              "(claimed, pinned or blocked)")
            free = min(ours, key=lambda s: self.own[s]["last_use"])
            self._evict(free)
        while (at := self._gaps.take(length)) is None:
            victim = next((s for s in self.lru if s not in self.pins), None)
            if victim is None:
                raise KVError(f"host {self.host} has no room for {length} bytes and no unpinned block of its own "
                              "to evict")
            self._evict(victim)
        return free, at

    def _contend(self, digest: bytes) -> bool:
        """After our claim: may we write? No if the key is published anywhere, or a lower host
        claims it and is alive; wait on higher hosts' claims until they publish (we lose), drop
        them, or stop beating for stale_s (we go on). docs/kvstore.md has the argument."""
        me = self._me
        watched: dict[tuple[int, int], tuple[int, float]] = {}
        while True:
            pending = False
            for h in range(self.hosts):
                if h == me:
                    continue
                for s in self._slots_keyed(h, digest):
                    st = self._state(h, s)
                    if st and not st & 1:
                        if self._valid(h, s, digest) is not None:
                            return False
                        continue
                    if not st & 1 or st >> 1 < self._header(h)["lease_seq"]:
                        continue                # no claim, or an earlier holder's of that host: dead
                    beat = self._header(h)["heartbeat"]
                    seen, since = watched.get((h, s), (None, 0.0))
                    now = time.monotonic()
                    if seen != beat:
                        watched[(h, s)] = (beat, now)
                        if seen is not None and h < me:
                            return False        # a live lower claimant wins
                        pending = True
                    elif now - since < self.stale_s:
                        pending = True         # not yet known to be alive or dead
            if not pending:
                return True
            self._beat()
            time.sleep(0.001)

    def put(self, key, data, alone: bool = False) -> bool:
        """Store `data` under `key` in our arena. False if the key is already stored (by anyone)
        or another host won the race for it: blocks are content-addressed, so theirs is ours.
        alone: a private cache's put: only our segment is looked at, no rendezvous with others."""
        me = self._me
        data = bytes(data)
        digest = key_digest(key)
        self._own_lease()
        if self.find(key, alone):
            return False
        slot, offset = self._place(len(data), digest)
        self._seq = seq = self._seq + 1        # ours, not the header's: a stopped earlier holder may rewrite it
        self._may_write()
        self._set_header(next_seq=seq)
        at = self._slot_at(me, slot)
        self._may_write(slot)                   # the claim names its extent, then its state and key
        struct.pack_into("<QQ", self.m.mem, at + RECORD.offset["offset"], offset, len(data))
        self._may_write()
        struct.pack_into("<Q16s", self.m.mem, at, seq * 2 + 1, digest)
        fence()
        if not alone and not self._contend(digest):
            self._set_state(slot, 0)
            self._gaps.give(offset, len(data))
            return False
        for start in range(0, len(data), 1 << 20):
            piece = data[start:start + (1 << 20)]
            self._may_write()
            self.m.mem[offset + start:offset + start + len(piece)] = piece
            self._beat()                         # alive: a waiting lower host must not think us dead
        clock = self._header(me)["clock"] + 1
        rec = dict(state=seq * 2, key=digest, offset=offset, length=len(data), crc=zlib.crc32(data), last_use=clock)
        raw = bytearray(RECORD.pack(**rec))
        struct.pack_into("<I", raw, SIGNED, zlib.crc32(raw[:SIGNED]))
        self._may_write()
        self.m.mem[at + 8:at + LINE] = raw[8:]
        fence()                                  # data and fields before the state that publishes them
        self._may_write()                        # a second writer of this host: publish nothing
        struct.pack_into("<Q", self.m.mem, at, seq * 2)
        fence()
        self._may_write()
        self._set_header(clock=clock)
        rec["rcrc"] = struct.unpack_from("<I", raw, SIGNED)[0]
        self.own[slot] = rec
        self.lru[slot] = None
        return True

    def pin(self, key) -> bool:
        """Keep our own block of `key` from eviction until as many unpin calls (a pin lives in this
        process, not in the store: another host's block is its owner's to evict; False for those)."""
        for host, slot, _ in self.find(key, alone=True):
            self.pins[slot] = self.pins.get(slot, 0) + 1
            return True
        return False

    def unpin(self, key) -> bool:
        """Drop one pin of our block of `key`; False if it holds none."""
        for host, slot, _ in self.find(key, alone=True):
            if slot in self.pins:
                self.pins[slot] -= 1
                if not self.pins[slot]:
                    del self.pins[slot]
                return True
        return False

    def remove(self, key) -> bool:
        """Withdraw our own record of `key` (others' records are theirs to drop)."""
        for host, slot, rec in self.find(key):
            if host == self.host and slot in self.own and self.own[slot]["state"] == rec["state"]:
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
        corruption too, if both records still stand when the scan is done (a writer may have
        withdrawn one and reused its space while we read the rest). Claims (crashed or in flight)
        are counted, never read."""
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
                if rec is None and self._state(h, s) != st:
                    continue                     # withdrawn or replaced while we read it
                if rec is None:
                    bad.append(dict(host=h, slot=s, why="record fails its crc or points outside the arena"))
                elif self._poisoned(rec):
                    bad.append(dict(host=h, slot=s, key=rec["key"].hex(), why="poisoned (the device's poison list)"))
                elif self.read_block(h, s, rec) is None and self._state(h, s) == rec["state"]:
                    bad.append(dict(host=h, slot=s, key=rec["key"].hex(), why="block fails its crc"))
                else:
                    good += 1
                    extents.append((rec["offset"], rec["offset"] + rec["length"], s, rec["state"]))
            extents.sort()
            for (a0, a1, sa, ta), (b0, _, sb, tb) in zip(extents, extents[1:]):
                if b0 < a1 and self._state(h, sa) == ta and self._state(h, sb) == tb:
                    bad.append(dict(host=h, slot=sb, why=f"block overlaps slot {sa}'s"))
        return dict(good=good, bad=bad, claims=claims)
