"""How KV is cut into chunks: the one definition the simulator and the KV store share.

LMCache stores and looks up KV in fixed-size token chunks (its `chunk_size`, 256 by default),
each keyed by a hash of every token up to the chunk's end, so a lookup walks a prompt's chunks
from the start and stops at the first one missing. Only whole chunks are stored (a partial tail
is recomputed next time).
"""

from __future__ import annotations

KV_CHUNK_TOKENS = 256


def whole_chunks(tokens: int, chunk_tokens: int = KV_CHUNK_TOKENS) -> int:
    """How many whole chunks `tokens` tokens fill."""
    return tokens // chunk_tokens


def chunk_bytes(kv_bytes_per_token: int, chunk_tokens: int = KV_CHUNK_TOKENS) -> int:
    return kv_bytes_per_token * chunk_tokens
