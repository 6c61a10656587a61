"""What the engine plugins share: the engine version check, opening the store from an engine's
configuration, and the named block (a block that carries its key, so that a digest collision or a
block of another key is a miss)."""

from __future__ import annotations

import importlib.metadata
import struct
from typing import Any

from pfcxl.errors import PfcxlError
from pfcxl.guest.python import pfcxl_kvstore as kv
from pfcxl.host_tools.provision.engines_env import ENGINES, TORCH


# the engine versions pfcxl.engines is tested with: the ones the engines venv pins
TESTED = dict((TORCH, *ENGINES))

_NAME = struct.Struct("<I")


class EngineConfigError(PfcxlError, ValueError):
    """The engine's configuration of a pfcxl plugin is wrong; one line naming the key and the value.
    A ValueError too: that is what the engines catch from a plugin's constructor."""

    exit_code = 2


class EngineVersionError(PfcxlError, ImportError):
    """The engine is missing, or is not the version pfcxl.engines is tested with (an ImportError
    too, as the engines expect of a plugin that cannot load)."""


def require(dist: str) -> None:
    """Refuse (one line) an engine that is missing or of another version than TESTED's."""
    want = TESTED[dist]
    try:
        have = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        raise EngineVersionError(f"pfcxl.engines needs {dist} {want}, and {dist} is not installed here "
                                 f"(use <repo>/.venv-engines/bin/python: make engines)") from None
    if have.split("+")[0] != want:
        raise EngineVersionError(f"pfcxl.engines is tested with {dist} {want}; this interpreter has {dist} {have} "
                                 f"(use <repo>/.venv-engines/bin/python: make engines)")


def open_store(extra: dict[str, Any] | None, prefix: str, engine: str, writer: bool = True) -> kv.Store:
    """The store named by an engine's configuration: keys `<prefix>pool` (the store's file or
    DAX device), `<prefix>host` (this engine's host number) and optionally `<prefix>base`. Every
    mistake is one EngineConfigError line naming the key ("no pool", "host out of range",
    "a store of another version" and the store's own refusals). writer False: opened read-only
    (a process that only looks blocks up, beside the host's one writer), the host still checked."""
    extra = extra or {}
    where = f"{engine}: pfcxl"
    pool = extra.get(f"{prefix}pool")
    if not pool or not isinstance(pool, str):
        raise EngineConfigError(f"{where}: {prefix}pool is missing from the configuration: it names the store's "
                                "pool file or DAX device")
    host = _integer(extra, f"{prefix}host", where)
    if host is None:
        raise EngineConfigError(f"{where}: {prefix}host is missing from the configuration: this engine's host "
                                "number in the store")
    base = _integer(extra, f"{prefix}base", where)
    try:
        store = kv.Store.open(pool, host=host if writer else None, base=base)
    except (kv.KVError, OSError) as exc:
        raise EngineConfigError(f"{where}: {prefix}pool {pool}: {exc}") from None
    if not host < store.hosts:
        store.close()
        raise EngineConfigError(f"{where}: {prefix}pool {pool}: host {host} is out of range (0 <= host < "
                                f"{store.hosts})")
    return store


def _integer(extra: dict[str, Any], key: str, where: str) -> int | None:
    value = extra.get(key)
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise EngineConfigError(f"{where}: {key} {value!r} is not an integer") from None
    if isinstance(value, bool) or (isinstance(value, float) and value != number) or number < 0:
        raise EngineConfigError(f"{where}: {key} {value!r} is not a non-negative integer")
    return number


def named(name: str, payload) -> bytes:
    """A block's bytes: its key's name, then the payload."""
    raw = name.encode()
    return _NAME.pack(len(raw)) + raw + bytes(payload)


def name_of(block: bytes) -> str | None:
    """The key name a block carries (None for a block too short to carry one)."""
    if len(block) < _NAME.size:
        return None
    (n,) = _NAME.unpack_from(block)
    return block[_NAME.size:_NAME.size + n].decode(errors="replace") if len(block) >= _NAME.size + n else None


def payload_of(name: str, block: bytes | None) -> memoryview | None:
    """The payload of a block read from the store if it carries `name`, else None (a miss)."""
    if block is None or name_of(block) != name:
        return None
    return memoryview(block)[_NAME.size + len(name.encode()):]


def leading(flags) -> int:
    """How many of `flags`, from the first, are true: a prefix cache can use only those."""
    count = 0
    for flag in flags:
        if not flag:
            break
        count += 1
    return count
