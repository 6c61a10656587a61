"""The protocol refuses a deeply nested line by counting its nesting, not by json.loads running
out of stack: so the service and a client (or a test) at another stack depth give the same answer.
Before, a line nested a few hundred levels was a RecursionError in one process and a valid
decode in another (the hostile suite's malformed batch failed on that once)."""

import sys

import pytest

from pfcxl.device.appliance import protocol as proto

pytestmark = pytest.mark.unit


def nested(depth: int) -> bytes:
    return b'{"a": ' * depth + b"1" + b"}" * depth


def parse_at_depth(line: bytes, frames: int):
    if frames:
        return parse_at_depth(line, frames - 1)
    try:
        return proto.parse(line)
    except proto.RequestError as exc:
        return str(exc)


@pytest.mark.parametrize("depth", [proto.MAX_NESTING + 1, 200, 900, 5000, 30000])
def test_too_deep_is_the_same_error_at_any_stack_depth(depth):
    line = nested(depth)
    answers = {parse_at_depth(line, frames) for frames in (0, 100, sys.getrecursionlimit() - 200)}
    assert answers == {f"not JSON: nested deeper than {proto.MAX_NESTING} levels"}


def test_nesting_up_to_the_limit_is_decoded_and_strings_do_not_count():
    assert proto.nesting(nested(proto.MAX_NESTING)) == proto.MAX_NESTING
    assert proto.nesting(b'{"op": "hello", "x": "[[[{{{\\"[["}') == 1
    # decoded, then refused for what it says, not for its shape
    assert parse_at_depth(nested(proto.MAX_NESTING), 0) == "missing 'op' (a string)"
