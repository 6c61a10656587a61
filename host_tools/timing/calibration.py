"""The emulator's own cost per CXL request, which inject mode subtracts before it spins."""

from __future__ import annotations

from pfcxl.errors import TimingError
from pfcxl.guest.tool_output import tool_json
from pfcxl.host_tools import timeouts


# A dependent chase over 256 lines 8 KiB apart (2 MiB): it stays in QEMU's softmmu TLB, so what it
# measures is the CXL access path itself, one request per load.
CALIBRATION_COMMAND = "chase --lines 256 --span 2M --loads 30000"


def calibrate_baseline(vm, command: str = CALIBRATION_COMMAND, key: str = "ns_per_load",
                       runs: int = 5) -> dict:
    """The emulator's own cost per CXL request, as the guest's clock sees it: run a CXL workload
    in a VM booted with the plugin in count mode (no latency added) and take its per-access
    time (the median of `runs`). That is what inject mode subtracts (baseline_ns) before it
    spins, so that the guest sees the modelled latency rather than emulator + model. A
    modelled latency below it cannot be shown: the vCPU does not spin at all then."""
    tool = command.split()[0]
    values = []
    for _ in range(runs):
        result = vm.run(command, timeout=timeouts.COMMAND_S)
        if result.status != 0:
            raise TimingError(f"calibration command failed ({result.status}): {command}\n{result.output}")
        values.append(float(tool_json(result.output, tool, error=TimingError)[key]))
    return {"baseline_ns": sorted(values)[len(values) // 2], "runs": values, "command": command, "key": key}


def inject_summary(config) -> list[str]:
    """What inject mode did, in words (a TimingConfig in inject mode): the emulator's cost it
    measured, the latency it was asked to show and the delay it added per request, per profile;
    and, when the emulator alone costs more than the fabric would, that the guest's figures are
    then emulator time and cannot compare fabrics."""
    reads = config.read_ns if isinstance(config.read_ns, (tuple, list)) else (config.read_ns,)
    writes = config.write_ns if isinstance(config.write_ns, (tuple, list)) else (config.write_ns,)
    base = config.baseline_ns
    lines = [f"inject: the emulator's own cost per CXL request, measured first: {base:,.0f} ns (baseline)"]
    short = []
    for k in range(max(len(reads), len(writes))):
        r, w = reads[min(k, len(reads) - 1)], writes[min(k, len(writes) - 1)]
        lines.append(f"inject profile {k}: modelled {r:,.0f} ns read / {w:,.0f} ns write; delay added per request "
                     f"{max(0.0, r - base):,.0f} / {max(0.0, w - base):,.0f} ns")
        if r < base or w < base:
            short.append(k)
    if short:
        lines.append(f"inject: the emulator already costs more than profile {', '.join(map(str, short))}'s "
                     "latency, so no delay could be added: what the guest reads there is emulator time, "
                     "not fabric latency, and cannot rank fabrics; --clock virtual gives the guest the "
                     "modelled latency in its own clock")
    return lines
