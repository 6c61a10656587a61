"""The host side of the replay's mailboxes (host_tools/kv/replay_mailbox.py) waiting for an answer:
it sees an answer whenever it comes, and a long wait looks at the mailbox a bounded number of
times per second (a guest under TCG answers in milliseconds: looking every 0.2 ms spun a CPU).
The clock is a fake one that only sleeps move, so the counts do not depend on the machine."""

import pytest

from pfcxl.host_tools.kv import replay_mailbox as M

pytestmark = pytest.mark.unit


class Clock:
    """time.monotonic and time.sleep for the module: sleeping moves the clock and is kept in
    `pauses`; hooks[n] runs after the n-th pause."""

    def __init__(self) -> None:
        self.now, self.pauses, self.hooks = 0.0, [], {}

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
        self.pauses.append(s)
        if (hook := self.hooks.get(len(self.pauses))) is not None:
            hook()


@pytest.fixture
def boxes(tmp_path, monkeypatch):
    path = tmp_path / "pool"
    path.write_bytes(bytes(2 * M.MB_BYTES))
    clock = Clock()
    monkeypatch.setattr(M, "time", clock)
    b = M.Mailboxes(str(path), 0, 2, 1, gone=lambda: None)
    yield b, clock
    b.map.close()


def answer(b: M.Mailboxes, h: int) -> None:
    """What kvreplay does when it has answered host h's last message."""
    import struct
    struct.pack_into("<Q", b.map, h * M.MB_BYTES + M.ACK, b.seq[h])


@pytest.mark.parametrize("wait_s", [0.5, 1, 10, 60])
def test_a_wait_with_no_answer_looks_a_bounded_number_of_times_per_second(boxes, wait_s):
    b, clock = boxes
    b._send(0, ["C"])
    assert b._wait({0}, wait_s) == []
    assert clock.now >= wait_s and max(clock.pauses) <= M.POLL_S[1]
    # the longest pause is POLL_S[1]; the doubling from POLL_S[0] up to it adds a few looks
    assert len(clock.pauses) <= wait_s / M.POLL_S[1] + 16, len(clock.pauses)


@pytest.mark.parametrize("after", [0, 1, 2, 5, 9, 40, 300])
def test_an_answer_is_seen_at_the_next_look_whenever_it_comes(boxes, after):
    b, clock = boxes
    b._send(0, ["C"])
    b._send(1, ["C"])
    clock.hooks[after] = lambda: answer(b, 1)
    if after == 0:
        answer(b, 1)
    assert b._wait({0, 1}, None) == [1]
    assert len(clock.pauses) == after            # seen at the look after it came
    assert clock.pauses[:1] in ([], [M.POLL_S[0]])   # and the first pause is the shortest
