"""The trace reader (pfcxl.serving.traces): round trips, the bundled traces, and every bad input
giving one line that names the file, the line and the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfcxl.errors import ServingError
from pfcxl.serving import traces

GOOD = {"timestamp": 5, "input_length": 1000, "output_length": 7, "hash_ids": [1, 2]}

pytestmark = pytest.mark.unit


def write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


requests = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 5000), st.integers(0, 2000),
                              st.lists(st.integers(-2**40, 2**40), max_size=4)), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(rows=requests, block=st.integers(1, 1024))
def test_any_valid_trace_reads_back_as_written(tmp_path_factory, rows, block):
    rows = sorted(rows)                      # timestamps never decrease
    lines, want = [], []
    for ts, inp, out, extra in rows:
        ids = list(range(traces.blocks_for(inp, block))) + extra
        lines.append(json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids}))
        want.append(traces.Request(ts, inp, out, tuple(ids)))
    trace = traces.load(write(tmp_path_factory.mktemp("t"), lines), block)
    assert trace.requests == tuple(want)
    assert trace.span_ms == rows[-1][0] - rows[0][0]
    assert trace.input_tokens == sum(r[1] for r in rows)
    for r in trace.requests:
        assert trace.prefix_tokens(r, trace.blocks(r)) == r.input_length


@pytest.mark.parametrize("name, count, span_ms", [("conversation", 12_031, 3_536_999), ("synthetic", 3_993, 1_022_025)])
def test_bundled_mooncake_traces_load_whole(name, count, span_ms):
    trace = traces.load(traces.bundled(name))
    assert len(trace.requests) == count and trace.span_ms == span_ms
    assert all(len(r.hash_ids) == trace.blocks(r) for r in trace.requests)


def test_partial_last_block_counts_only_its_tokens():
    trace = traces.Trace("x", 512, (traces.Request(0, 1000, 1, (1, 2)),))
    r = trace.requests[0]
    assert [trace.prefix_tokens(r, n) for n in range(3)] == [0, 512, 1000]


def field(**change):
    row = dict(GOOD)
    for key, value in change.items():
        if value is KeyError:
            del row[key]
        else:
            row[key] = value
    return json.dumps(row)


# (line 2's text, the field or words the message must name)
BAD = [
    ("{not json", "not JSON"),
    ('{"timestamp": ' + "1" * 5000 + "}", "not JSON"),   # past Python's digit limit: a ValueError without .msg
    ("[" * 100_000, "not JSON"),                          # nested too deep: a RecursionError
    ("[1, 2]", "not a JSON object"),
    ("", None),                                     # blank: skipped, not an error
    *[(field(**{f: KeyError}), f"{f}: missing") for f in traces.FIELDS],
    *[(field(**{f: -1}), f"{f}: -1 is negative") for f in ("timestamp", "input_length", "output_length")],
    *[(field(**{f: v}), f"{f}: ") for f in ("input_length", "output_length") for v in (1.5, "3", True, None)],
    *[(field(timestamp=v), "timestamp: ") for v in ("3", None, True, [1])],
    (field(hash_ids="1,2"), "hash_ids: not a list"),
    (field(hash_ids=[1, "2"]), "hash_ids[1]: '2' is not an integer"),
    (field(hash_ids=[1, 2.0]), "hash_ids[1]: 2.0 is not an integer"),
    (field(hash_ids=[True, 2]), "hash_ids[0]: True is not an integer"),
    (field(hash_ids=[1]), "hash_ids: 1 blocks, but input_length 1000 needs 2"),
    (field(timestamp=4), "timestamp: 4 goes back from 5"),
]


@pytest.mark.parametrize("text, words", BAD)
def test_each_bad_line_names_file_line_and_field(tmp_path, text, words):
    path = write(tmp_path, [json.dumps(GOOD), text, json.dumps(GOOD)])
    if words is None:
        assert len(traces.load(path).requests) == 2
        return
    with pytest.raises(ServingError) as e:
        traces.load(path)
    message = str(e.value)
    assert message.startswith(f"{path} line 2: ") and words in message and "\n" not in message


@pytest.mark.parametrize("content, words", [("", "no requests"), ("\n  \n", "no requests"),
                                            (b"\xff\xfe", "not UTF-8")])
def test_empty_or_binary_trace_is_an_error(tmp_path, content, words):
    path = tmp_path / "t.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ServingError, match=words):
        traces.load(path)


def test_missing_file_directory_and_bad_block_size(tmp_path):
    with pytest.raises(ServingError, match="no such file"):
        traces.load(tmp_path / "nope.jsonl")
    with pytest.raises(ServingError, match="is a directory"):
        traces.load(tmp_path)
    for bad in (0, -512, 1.5, True):
        with pytest.raises(ServingError, match="block tokens"):
            traces.load(write(tmp_path, [json.dumps(GOOD)]), bad)
    with pytest.raises(ServingError, match="no such bundled trace"):
        traces.bundled("nope")
