"""The appliance control protocol (version 1): newline-delimited JSON over a unix socket, memory
handed over as file descriptors (SCM_RIGHTS) with the reply that names them, as vhost-user does.

Requests are objects with "op" and, optionally, "v" (the protocol version, 1) and "id" (echoed):

    {"op": "hello"}                               -> {"ok": true, "version": 1, "appliance": {...}}
    {"op": "attach", "host": 3, "port": 5}        -> {"ok": true, "host": 3, "port": 5, "regions": [...]}
                                                     + one fd per region, in the order listed
    {"op": "region", "host": 3, "name": "shared"} -> one region's fd again (only for a host this
                                                     connection attached; never another host's private)
    {"op": "detach", "host": 3}                   -> {"ok": true}
    {"op": "status"}                              -> modules, ports, hosts, bytes mapped and changed
    {"op": "layout"}                              -> partitions and the module interleave
    {"op": "where", "offset": 4096}               -> module, module offset, region
    {"op": "checksum"}                            -> crc32 of every partition and of the pool
    {"op": "stats", "sync": true}                 -> the fabric telemetry of a timed appliance
                                                     (--timing): per host, module and link; with
                                                     sync, once what the rings hold is modelled
    {"op": "shutdown"}                            -> {"ok": true}, then the service stops

Every failure is a reply {"ok": false, "error": "..."}; a line longer than MAX_LINE closes the
connection after that reply. Attachments last as long as the connection that made them.

On a timed appliance, attach also hands out the host's trace ring: "ring" in the reply, and one
more descriptor after the regions' (device/appliance/timing.py).

hello, attach and status also carry "incarnation" (new at every start of the service) and
"pool_id" (the memory's: kept while the pool's files are); status lists
"previous_incarnations", the hosts a crashed incarnation attached whose process still runs.
A connection the service closes on its own (idle, or over a limit) gets one last, unrequested
line {"ok": false, "error": "...", "closed": "idle" | "refused"}.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pfcxl.errors import ApplianceError

VERSION = 1
MAX_LINE = 64 * 1024
# Requests nest a few levels; anything deeper is refused before it is decoded.
MAX_NESTING = 32
STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
OPEN = frozenset(b"{[")
DELETE_BUT_BRACKETS = bytes(b for b in range(256) if b not in b"{}[]")
IDLE_TIMEOUT = 60.0            # seconds a connection that holds nothing may stay silent before it is closed
MAX_HOST_ID = 1023
Kind = type | tuple[type, ...]         # what isinstance takes: a field's allowed types

# op -> {field: (type, required)}
OPS: dict[str, dict[str, tuple[Kind, bool]]] = {
    "hello": {},
    "attach": {"host": (int, True), "port": (int, False)},
    "region": {"host": (int, True), "name": (str, True)},
    "detach": {"host": (int, True)},
    "status": {},
    "layout": {},
    "where": {"offset": (int, True)},
    "checksum": {},
    "stats": {"sync": (bool, False)},
    "shutdown": {},
}
COMMON: dict[str, tuple[Kind, bool]] = {"op": (str, True), "v": (int, False), "id": ((int, str), False)}


class RequestError(ApplianceError):
    """A request that cannot be served; its message goes back to the client."""


def nesting(line: bytes) -> int:
    """How deep a line's objects and arrays nest, strings skipped; read before json.loads, whose
    own limit is Python's recursion limit less however deep the caller's stack already is."""
    flat = STRING.sub(b'""', line)
    depth = deepest = 0
    for byte in flat.translate(None, DELETE_BUT_BRACKETS):
        depth += 1 if byte in OPEN else -1
        deepest = max(deepest, depth)
    return deepest


def parse(line: bytes) -> dict[str, Any]:
    """One request line -> a checked dict. Raises RequestError with a message for the client."""
    if nesting(line) > MAX_NESTING:        # the same answer in every process, whatever its stack
        raise RequestError(f"not JSON: nested deeper than {MAX_NESTING} levels")
    try:
        request = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"not JSON: {exc}") from exc
    if not isinstance(request, dict):
        raise RequestError(f"a request is a JSON object, got {type(request).__name__}")
    op = request.get("op")
    if not isinstance(op, str):
        raise RequestError("missing 'op' (a string)")
    if op not in OPS:
        raise RequestError(f"unknown op '{op[:40]}' (known: {', '.join(OPS)})")
    if request.get("v", VERSION) != VERSION:
        raise RequestError(f"protocol version {request.get('v')!r} is not supported (this service speaks {VERSION})")
    fields = {**COMMON, **OPS[op]}
    for key in request:
        if key not in fields:
            raise RequestError(f"{op}: unknown field '{str(key)[:40]}'")
    for key, (kind, required) in fields.items():
        if key not in request:
            if required:
                raise RequestError(f"{op}: missing field '{key}'")
            continue
        value = request[key]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise RequestError(f"{op}: field '{key}' must be {names}, got {type(value).__name__}")
    if "host" in request and not 0 <= request["host"] <= MAX_HOST_ID:
        raise RequestError(f"{op}: host id {request['host']} is outside 0..{MAX_HOST_ID}")
    return request
