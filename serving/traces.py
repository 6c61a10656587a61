"""Request traces with prefix-block hashes (the format of Mooncake's public traces).

One JSON object per line: `timestamp` (ms from the trace's start, never decreasing),
`input_length` and `output_length` (tokens), and `hash_ids`, the ids of the prompt's blocks of
`block_tokens` tokens from the start (512 in Mooncake's traces). Equal ids in two requests mean
the same KV (the same tokens up to that block's end), so a cache can reuse them. The last block
may be partial: block i holds min(block_tokens, input_length - i x block_tokens) tokens. A line
may carry more ids than its input needs (they are kept, but only the first `blocks` count);
fewer is an error. Blank lines are skipped. Any file in this format can be loaded.

The API other modules use: `load(path, block_tokens) -> Trace`, `bundled(name) -> Path`, and the
Request fields (timestamp_ms, input_length, output_length, hash_ids). Bad input raises
pfcxl.errors.ServingError naming the file, the line and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from pfcxl.errors import ServingError
from pfcxl.text_files import read_text

# Defaults of a trace replay (pfcxl serving --trace): the model it assumes, the capacity sweep.
TRACE_MODEL = "llama-70b"
SWEEP_DEFAULT = [10 ** (k / 2) for k in range(8, 19)]         # 10^4 .. 10^9 tokens, per half decade


DEFAULT_BLOCK_TOKENS = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
BUNDLED = Path(__file__).resolve().parent / "data" / "traces"


@dataclass(frozen=True)
class Request:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    path: str
    block_tokens: int
    requests: tuple[Request, ...]

    @property
    def name(self) -> str:
        return Path(self.path).stem

    @property
    def span_ms(self) -> float:
        """Time from the first arrival to the last."""
        return self.requests[-1].timestamp_ms - self.requests[0].timestamp_ms

    @property
    def input_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)

    def blocks(self, request: Request) -> int:
        """How many blocks `request`'s input fills (the last may be partial)."""
        return blocks_for(request.input_length, self.block_tokens)

    def prefix_tokens(self, request: Request, hit_blocks: int) -> int:
        """Input tokens in `request`'s first `hit_blocks` blocks."""
        return min(hit_blocks * self.block_tokens, request.input_length)


def blocks_for(tokens: int, block_tokens: int) -> int:
    return -(-tokens // block_tokens)


def counted(requests, block_tokens: int) -> list[Request]:
    """Each request with only the ids its input counts (`blocks_for`): what a cache serves. The
    serving model's N-host replay and the store's (`pfcxl kv replay`) both route and serve these."""
    return [r if len(r.hash_ids) == (n := blocks_for(r.input_length, block_tokens)) else
            Request(r.timestamp_ms, r.input_length, r.output_length, r.hash_ids[:n]) for r in requests]


def bundled(name: str) -> Path:
    """A trace shipped with pfcxl: 'conversation' or 'synthetic' (Mooncake's), or a file name
    under serving/data/traces/."""
    for candidate in (BUNDLED / "mooncake" / f"{name}_trace.jsonl", BUNDLED / name):
        if candidate.is_file():
            return candidate
    names = sorted(p.stem.removesuffix("_trace") for p in BUNDLED.glob("*/*.jsonl"))
    raise ServingError(f"trace {name!r}: no such bundled trace (have: {', '.join(names)})")


def _integer(where: str, field: str, value, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ServingError(f"{where}: {field}: {value!r} is not an integer")
    if value < minimum:
        raise ServingError(f"{where}: {field}: {value} is negative" if minimum == 0 else
                           f"{where}: {field}: {value} is below {minimum}")
    return value


def _timestamp(where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ServingError(f"{where}: timestamp: {value!r} is not a finite number of ms")
    if value < 0:
        raise ServingError(f"{where}: timestamp: {value} is negative")
    return value


def _request(where: str, text: str, block_tokens: int) -> Request:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise ServingError(f"{where}: not JSON ({e.msg} at column {e.colno})") from e
    except (ValueError, RecursionError) as e:      # a number beyond Python's digit limit; nesting too deep
        raise ServingError(f"{where}: not JSON ({e})") from e
    if not isinstance(row, dict):
        raise ServingError(f"{where}: not a JSON object but {type(row).__name__}")
    for field in FIELDS:
        if field not in row:
            raise ServingError(f"{where}: {field}: missing")
    ts = _timestamp(where, row["timestamp"])
    inp = _integer(where, "input_length", row["input_length"])
    out = _integer(where, "output_length", row["output_length"])
    ids = row["hash_ids"]
    if not isinstance(ids, list):
        raise ServingError(f"{where}: hash_ids: not a list but {type(ids).__name__}")
    for i, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int):
            raise ServingError(f"{where}: hash_ids[{i}]: {h!r} is not an integer")
    need = blocks_for(inp, block_tokens)
    if len(ids) < need:
        raise ServingError(f"{where}: hash_ids: {len(ids)} blocks, but input_length {inp} needs {need} "
                           f"of {block_tokens} tokens")
    return Request(ts, inp, out, tuple(ids))


def load(path, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> Trace:
    """Read and check a whole trace; the first bad line stops it with one line of explanation."""
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ServingError(f"block tokens: {block_tokens!r} must be a positive integer")
    path = Path(path)
    text = read_text(path, ServingError, f"trace {path}")
    requests: list[Request] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        request = _request(where, line, block_tokens)
        if requests and request.timestamp_ms < requests[-1].timestamp_ms:
            raise ServingError(f"{where}: timestamp: {request.timestamp_ms} goes back from "
                               f"{requests[-1].timestamp_ms}")
        requests.append(request)
    if not requests:
        raise ServingError(f"trace {path}: no requests (an empty trace)")
    return Trace(str(path), block_tokens, tuple(requests))
