"""The host side of the mailboxes through which `pfcxl kv replay --on guests` feeds its hosts: one
`kvreplay` process per host (guest/src/kvreplay.c, its --help has the protocol), each reading the
lines of operations posted in its own mailbox in the pool, after the store, and answering in the
mailbox's reply half. The pool carries the messages because it is the one memory the host and
every guest share; a message is a batch of requests, not one block.

Mailboxes is a crew for replay.drive, as replay.Processes is: post a host its share of a
batch, wait for the hosts that finished, collect each request's counts.
"""

from __future__ import annotations

import mmap
import struct
import time
from typing import Callable

from pfcxl.errors import PfcxlError

from pfcxl.host_tools.kv.replay_host import COUNTS, kv

MB_BYTES = 1 << 20          # per host (kvreplay.c's MB_BYTES)
MB_TEXT = 128               # the message's first byte
MB_HALF = (MB_BYTES - MB_TEXT) // 2
SEQ, LEN, ACK, RLEN, PID = 0, 8, 64, 72, 80      # byte offsets of the mailbox's words
# a wait's first and longest pause between looks: a process on this machine answers within the
# first, a guest under TCG takes milliseconds; the pause doubles so a long wait does not spin a CPU
POLL_S = (0.0002, 0.005)
ID_RANGE = (-(1 << 63), (1 << 63) - 1)          # a block id kvreplay reads (strtoll)


def request_line(index: int, blocks) -> str:
    """The line that asks kvreplay to serve request `index` on `blocks`."""
    return " ".join(map(str, ["R", index, *blocks]))


def check_requests(requests) -> None:
    """Before anything boots: every request's line fits one message, and its ids are kvreplay's
    64-bit signed integers (one line naming the first that is not)."""
    for i, r in enumerate(requests):
        for b in r.hash_ids:
            if not ID_RANGE[0] <= b <= ID_RANGE[1]:
                text = str(b)
                raise PfcxlError(f"request {i}: hash id {text if len(text) <= 40 else text[:20] + '...'} is beyond "
                                 f"the 64-bit signed ids kvreplay handles (--on guests)")
        if (size := len(request_line(i, r.hash_ids)) + 1) > MB_HALF:
            raise PfcxlError(f"request {i}: its {len(r.hash_ids)} blocks take {size} bytes, more than one message of "
                             f"kvreplay's mailbox ({MB_HALF} bytes; --on guests)")


def offset(store_bytes: int) -> int:
    """Where the mailboxes start, from the store's base: the page after the store."""
    return kv.up(store_bytes, kv.PAGE)


class Mailboxes:
    """`hosts` mailboxes at byte `at` of `path`. `gone()` says why the hosts' side ended (None while
    it runs): a wait that sees it raises instead of waiting for ever."""

    def __init__(self, path: str, at: int, hosts: int, requests: int, gone: Callable[[], str | None]) -> None:
        self.hosts, self.gone = hosts, gone
        with open(path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), hosts * MB_BYTES, offset=at)
        self.map[:] = bytes(hosts * MB_BYTES)
        self.seq = [0] * hosts
        self.queue: dict[int, list[str]] = {}
        self.busy: set[int] = set()                 # hosts with a message not yet answered
        self.counts: list[dict | None] = [None] * requests
        self.stats: dict[int, dict] = {}

    def _word(self, h: int, at: int) -> int:
        return struct.unpack_from("<Q", self.map, h * MB_BYTES + at)[0]

    def _send(self, h: int, lines: list[str]) -> None:
        text = "".join(line + "\n" for line in lines).encode()
        box = h * MB_BYTES
        self.map[box + MB_TEXT:box + MB_TEXT + len(text)] = text
        struct.pack_into("<Q", self.map, box + LEN, len(text))
        self.seq[h] += 1
        struct.pack_into("<Q", self.map, box + SEQ, self.seq[h])     # last: x86 keeps the stores in order

    def _reply(self, h: int) -> list[str]:
        box = h * MB_BYTES + MB_TEXT + MB_HALF
        return self.map[box:box + self._word(h, RLEN)].decode().splitlines()

    def _wait(self, pending: set[int], timeout: float | None) -> list[int]:
        """Hosts of `pending` whose last message is answered, waiting at most `timeout` seconds for one."""
        if not pending:
            return []
        since, checked = time.monotonic(), time.monotonic()
        pause = POLL_S[0]
        while True:
            done = [h for h in pending if self._word(h, ACK) == self.seq[h]]
            if done or (timeout is not None and time.monotonic() - since >= timeout):
                return done
            if time.monotonic() - checked > 0.5:
                checked = time.monotonic()
                if (why := self.gone()) is not None:
                    raise PfcxlError(f"the replay's hosts ended before answering host(s) {sorted(pending)}: {why}")
            time.sleep(pause)
            pause = min(2 * pause, POLL_S[1])

    def call(self, line: str, hosts: range | None = None) -> dict[int, list[str]]:
        """`line` to every host (or `hosts`), and their replies once all answered; an E reply is an error."""
        hosts = range(self.hosts) if hosts is None else hosts
        for h in hosts:
            self._send(h, [line])
        pending = set(hosts)
        while pending:
            pending -= set(self._wait(pending, None))
        replies = {h: self._reply(h) for h in hosts}
        for h, lines in replies.items():
            if lines and lines[0].startswith("E "):
                raise PfcxlError(f"replay host {h}: {lines[0][2:]}")
        return replies

    def hello(self, timeout: float) -> None:
        """Wait until every host's kvreplay has started (it writes its pid)."""
        since = time.monotonic()
        while any(self._word(h, PID) == 0 for h in range(self.hosts)):
            if (why := self.gone()) is not None:
                raise PfcxlError(f"the replay's hosts ended before they started: {why}")
            if time.monotonic() - since > timeout:
                raise PfcxlError(f"the replay's hosts did not start within {timeout:.0f} s")
            time.sleep(0.05)

    def open(self, local: bool, stale_s: float) -> None:
        self.call(f"O {int(local)} {round(stale_s * 1000)}")

    def close_store(self) -> None:
        """Each host's store closed (its lease released); its evictions, lookups and index lines kept."""
        for h, lines in self.call("C").items():
            _, ev, lookups, index_lines = lines[0].split()
            self.stats[h] = dict(evictions=int(ev), lookups=int(lookups), index_lines=int(index_lines))

    def quit(self) -> None:
        self.call("Q")

    def abandon(self) -> None:
        """Every host told to quit, without waiting: the replay failed here."""
        for h in range(self.hosts):
            self._send(h, ["Q"])

    # kv_replay.drive's crew
    def post(self, h: int, work: list) -> None:
        """Requests for host h, sent in as few messages as fit a mailbox, one message at a time."""
        self.queue.setdefault(h, []).extend(request_line(i, blocks) for i, blocks in work)
        if h not in self.busy:
            self._next(h)

    def _next(self, h: int) -> None:
        lines, size, n = self.queue[h], 0, 0
        # a message fits the mailbox's first half, its replies (under 256 bytes each) the second
        while n < len(lines) and size + len(lines[n]) + 1 <= MB_HALF and n < MB_HALF // 256:
            size += len(lines[n]) + 1
            n += 1
        if n == 0:
            raise PfcxlError(f"a request of {len(lines[0].split()) - 2} blocks does not fit a mailbox ({MB_HALF} bytes)")
        self.queue[h] = lines[n:]
        self._send(h, lines[:n])
        self.busy.add(h)

    def ready(self, timeout: float | None) -> list[int]:
        """The requests whose hosts answered, waiting at most `timeout` seconds for one."""
        done = []
        for h in self._wait(self.busy, timeout):
            self.busy.discard(h)
            for line in self._reply(h):
                if line.startswith("E "):
                    raise PfcxlError(f"replay host {h}: {line[2:]}")
                index, *numbers = map(int, line.split())
                self.counts[index] = dict(zip(COUNTS, numbers))
                done.append(index)
            if self.queue[h]:
                self._next(h)
        return done

    def kill(self, h: int) -> None:
        raise PfcxlError("--kill-host is for --on host: a guest's replay process is not killed from here")

    def results(self) -> list[dict | None]:
        return list(self.counts)

    def reset(self) -> None:
        """Before the next mode: no request's counts yet."""
        self.counts = [None] * len(self.counts)

    def close(self) -> None:
        self.map.close()
