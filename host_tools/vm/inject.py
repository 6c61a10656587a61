"""CXL error injection into a booted guest's Type 3 devices, through QEMU 10's QMP commands
(qapi/cxl.json): poison, general media / DRAM / memory module event records, correctable and
uncorrectable RAS errors. Devices are named as in the topology; every argument is checked here,
so a bad one is one line and nothing reaches QEMU.

The guest's side (`guest_record`): the poison list of `cxl list -m memX -L` (the memdev matched by
serial, not by its number), the CXL trace events the kernel records in tracefs, and the kernel's
AER messages in dmesg.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from pfcxl.device.topology import Topology
from pfcxl.errors import PfcxlError
from pfcxl.host_tools import timeouts

LOGS = ("informational", "warning", "failure", "fatal")
CORRECTABLE = ("cache-data-ecc", "mem-data-ecc", "crc-threshold", "retry-threshold", "cache-poison-received",
               "mem-poison-received", "physical")
UNCORRECTABLE = ("cache-data-parity", "cache-address-parity", "cache-be-parity", "cache-data-ecc",
                 "mem-data-parity", "mem-address-parity", "mem-be-parity", "mem-data-ecc", "reinit-threshold",
                 "rsvd-encoding", "poison-received", "receiver-overflow", "internal", "cxl-ide-tx", "cxl-ide-rx")
# kind -> (QMP command, the Linux trace event (events/cxl/<name>) that records it, or None)
KINDS = {
    "poison": ("cxl-inject-poison", None),
    "general-media": ("cxl-inject-general-media-event", "cxl_general_media"),
    "dram": ("cxl-inject-dram-event", "cxl_dram"),
    "memory-module": ("cxl-inject-memory-module-event", "cxl_memory_module"),
    "correctable": ("cxl-inject-correctable-error", "cxl_aer_correctable_error"),
    "uncorrectable": ("cxl-inject-uncorrectable-errors", "cxl_aer_uncorrectable_error"),
}
CACHELINE = 64            # poison granularity (QEMU and CXL 3.1 8.2.9.9.4.2); event DPAs' low 6 bits are flags
TRACEFS = "/sys/kernel/tracing"
BYTE_FIELDS = ("flags", "descriptor", "type", "transaction-type", "health-status", "media-status",
               "additional-status", "life-used")
# memory-module defaults: a healthy device reporting one corrected volatile error
MODULE_DEFAULTS = {"health-status": 0, "media-status": 0, "additional-status": 0, "life-used": 0,
                   "temperature": 30, "dirty-shutdown-count": 0, "corrected-volatile-error-count": 1,
                   "corrected-persistent-error-count": 0}


@dataclass(frozen=True)
class Injection:
    kind: str
    device: str
    serial: int
    command: str
    arguments: dict = field(default_factory=dict)

    @property
    def trace_event(self) -> str | None:
        return KINDS[self.kind][1]


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PfcxlError(f"inject: {name} must be a whole number, not {value!r}")
    if not low <= value <= high:
        raise PfcxlError(f"inject: {name} {value:#x} is outside {low:#x}..{high:#x}")
    return value


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise PfcxlError(f"inject: {name} '{value}' is not one of {', '.join(allowed)}")
    return str(value)


def plan(topo: Topology, kind: str, device: str, **fields: object) -> Injection:
    """The QMP command and arguments of one injection, every argument checked (PfcxlError, one line)."""
    if kind not in KINDS:
        raise PfcxlError(f"inject: kind '{kind}' is not one of {', '.join(KINDS)}")
    ids = [d.id for d in topo.devices]
    if device not in ids:
        raise PfcxlError(f"inject: topology '{topo.name}' has no device '{device}' (devices: {', '.join(ids)})")
    dev = topo.device(device)
    size = dev.capacity
    args: dict[str, object] = {"path": f"/machine/peripheral/{device}"}
    given = dict(fields)

    def take(name: str, default: object = None) -> object:
        value = given.pop(name.replace("-", "_"), None)
        return default if value is None else value

    def dpa(name: str, default: int = 0) -> int:
        value = _int(name, take(name, default), 0, 2**64 - 1)
        if value >= size:
            raise PfcxlError(f"inject: {name} {value:#x} is outside device '{device}' ({size:#x} bytes)")
        if value % CACHELINE:
            raise PfcxlError(f"inject: {name} {value:#x} is not a multiple of {CACHELINE}")
        return value

    if kind == "poison":
        start = dpa("dpa")
        length = _int("length", take("length", CACHELINE), 1, 2**64 - 1)
        if length % CACHELINE:
            raise PfcxlError(f"inject: length {length} is not a multiple of {CACHELINE}")
        if start + length > size:
            raise PfcxlError(f"inject: {start:#x} + {length:#x} ends past device '{device}' ({size:#x} bytes)")
        args.update(start=start, length=length)
    elif kind in ("general-media", "dram", "memory-module"):
        args["log"] = _choice("log", take("log", "informational"), LOGS)
        args["flags"] = _int("flags", take("flags", 1), 0, 0xFF)       # bit 0: permanent condition
        if kind != "memory-module":
            args["dpa"] = dpa("dpa")
            args["descriptor"] = _int("descriptor", take("descriptor", 1), 0, 0xFF)
            args["type"] = _int("type", take("type", 1), 0, 0xFF)
            args["transaction-type"] = _int("transaction-type", take("transaction-type", 1), 0, 0xFF)
        else:
            args["type"] = _int("type", take("type", 0), 0, 0xFF)
            for name, default in MODULE_DEFAULTS.items():
                high = 0xFF if name in BYTE_FIELDS else (0xFFFF if name == "temperature" else 0xFFFFFFFF)
                args[name] = _int(name, take(name, default), 0, high)
    elif kind == "correctable":
        args["type"] = _choice("type", take("type", "mem-data-ecc"), CORRECTABLE)
    else:
        error = _choice("type", take("type", "internal"), UNCORRECTABLE)
        args["errors"] = [{"type": error, "header": [0] * 32}]
    if given:
        raise PfcxlError(f"inject: {kind} takes no {', '.join(sorted(given))}")
    return Injection(kind, device, dev.serial, KINDS[kind][0], args)


# --------------------------------------------------------------------------- the guest's view

# The RAS errors reach the OS as AER internal errors, which PCIe masks by default (QEMU too) and
# Linux 6.12 unmasks only for RCH devices: clear Corrected Internal Error (bit 14 of the
# Correctable Error Mask, AER capability + 0x14) and Uncorrectable Internal Error (bit 22 of the
# Uncorrectable Error Mask, + 0x08) in the memdev's config space, as setpci would. busybox sh.
UNMASK_AER = r"""cfg=/sys/bus/pci/devices/$BDF/config
rd() { od -An -tu4 -j $1 -N4 $cfg | tr -d ' '; }
wr() { v=$2; printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $((v&255)) $((v>>8&255)) $((v>>16&255)) $((v>>24&255)))" | dd of=$cfg bs=4 seek=$(($1/4)) conv=notrunc 2>/dev/null; }
off=256; while [ $off -ne 0 ]; do h=$(rd $off); [ $((h & 65535)) -eq 1 ] && break; off=$((h >> 20)); done
[ $off -ne 0 ] || { echo "$BDF has no AER capability"; exit 3; }
wr $((off+20)) $(( $(rd $((off+20))) & ~(1<<14) ))
wr $((off+8)) $(( $(rd $((off+8))) & ~(1<<22) ))
[ $(( $(rd $((off+20))) >> 14 & 1 )) -eq 0 ] || { echo "$BDF: the AER mask did not take the write"; exit 4; }
"""
# what the kernel's trace event prints as the status of the RAS error types seen here (others: any new record)
AER_STATUS = {("correctable", "mem-data-ecc"): "Memory Data ECC Error",
              ("uncorrectable", "internal"): "Component Specific Error"}

ARM = (f"grep -q ' {TRACEFS} tracefs ' /proc/mounts || mount -t tracefs nodev {TRACEFS}; "
       f"echo 1 > {TRACEFS}/events/cxl/enable")


def _records(run, injection: Injection) -> list[str]:
    """What the guest holds of this kind of injection on this device, oldest first: poison list
    entries (JSON) or trace lines / AER kernel messages."""
    if injection.kind == "poison":
        listing = json.loads(run("cxl list -M -L 2>/dev/null").output or "[]")
        listing = listing if isinstance(listing, list) else [listing]
        memdev = next((m for m in listing if m.get("serial") == injection.serial), None)
        if memdev is None:
            return []
        return [json.dumps(dict(e, memdev=memdev["memdev"], serial=injection.serial), sort_keys=True)
                for e in memdev.get("media_errors", [])]
    event = injection.trace_event
    pattern = re.compile(rf" {event}: memdev=\S+ host=\S+ serial={injection.serial}\b")
    lines = [line.strip() for line in run(f"cat {TRACEFS}/trace").output.splitlines() if pattern.search(line)]
    return lines


def aer_messages(run, bdf: str) -> list[str]:
    """The kernel's AER messages about the device at `bdf` (dmesg)."""
    return [line.strip() for line in run("dmesg").output.splitlines()
            if bdf in line and "err" in line.lower()]


def _bdf(run, injection: Injection) -> str:
    listing = json.loads(run("cxl list -M 2>/dev/null").output or "[]")
    listing = listing if isinstance(listing, list) else [listing]
    for memdev in listing:
        if memdev.get("serial") == injection.serial:
            return memdev["host"]
    raise PfcxlError(f"inject: the guest has no memdev with serial {injection.serial:#x} ('{injection.device}')")


def unmask_aer(run, injection: Injection) -> str:
    """Let the device's internal errors reach the AER driver (UNMASK_AER); its PCI address."""
    bdf = _bdf(run, injection)
    done = run(f"BDF={bdf}\n{UNMASK_AER}")
    if done.status != 0:
        raise PfcxlError(f"inject: unmasking AER internal errors failed: {done.output.strip()[:200]}")
    return bdf


def inject_into(machine, kind: str, device: str, *, expect: bool = False, timeout: float = timeouts.EXPECT_S,
                **fields: object) -> dict:
    """Machine.inject: plan (checks), arm the trace events once, unmask AER for RAS errors, inject
    through QMP, and with `expect` collect the guest's record of it."""
    injection = plan(machine.topology, kind, device, **fields)
    run = lambda command: machine.run(command, timeout=timeouts.COMMAND_S)      # noqa: E731
    if not getattr(machine, "_trace_armed", False):
        arm(run)
        machine._trace_armed = True
    # the address is taken before: an uncorrectable error resets the link and re-probes the device
    bdf = unmask_aer(run, injection) if kind in ("correctable", "uncorrectable") else None
    seen = before(run, injection) if expect else 0
    machine.qmp(injection.command, **injection.arguments)
    done = {"kind": kind, "device": device, "serial": injection.serial, "qmp": injection.command,
            "arguments": injection.arguments}
    if expect:
        guest = guest_record(run, injection, seen, timeout)
        if bdf is not None:
            guest += aer_messages(run, bdf)
        done["guest"] = guest
    return done


def matches(injection: Injection, record: str) -> bool:
    """Whether a guest record carries the fields that were injected."""
    a = injection.arguments
    if injection.kind == "poison":
        entry = json.loads(record)
        return entry.get("offset") == a["start"] and entry.get("length") == a["length"]
    if injection.kind in ("general-media", "dram"):
        return f" dpa={a['dpa']:x} " in record and f" log={a['log'].capitalize()} " in record
    if injection.kind == "memory-module":
        return (f" life_used={a['life-used']} " in record and f" device_temp={a['temperature']} " in record
                and f" log={a['log'].capitalize()} " in record)
    error = a["type"] if injection.kind == "correctable" else a["errors"][0]["type"]
    status = AER_STATUS.get((injection.kind, error))
    return status is None or f"status: '{status}'" in record


def arm(run) -> None:
    """Mount tracefs and turn the CXL trace events on (the kernel records nothing before)."""
    done = run(ARM)
    if done.status != 0:
        raise PfcxlError(f"inject: the guest could not turn on its CXL trace events: {done.output.strip()[:200]}")


def before(run, injection: Injection) -> int:
    return len(_records(run, injection))


def guest_record(run, injection: Injection, seen: int, timeout: float = timeouts.EXPECT_S) -> list[str]:
    """The guest's records of `injection` that appeared after the `seen` it had before (waits up
    to `timeout` s); PfcxlError when none carrying the injected fields came."""
    deadline = time.monotonic() + timeout
    while True:
        found = _records(run, injection)
        new = found[seen:] if injection.kind != "poison" else [r for r in found if matches(injection, r)]
        hits = [r for r in new if matches(injection, r)]
        if hits:
            return hits
        if time.monotonic() > deadline:
            raise PfcxlError(f"inject: the guest shows no record of the {injection.kind} injection into "
                             f"'{injection.device}' after {timeout:.0f} s")
        time.sleep(1)
