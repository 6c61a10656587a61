"""The emulator's own cost per CXL request, which inject mode subtracts before it spins."""

from __future__ import annotations

import json

from pfcxl.errors import TimingError


def guest_json(output: str, tool: str) -> dict:
    """The JSON line a guest tool printed."""
    prefix = f'{{"tool":"{tool}"'
    for line in output.splitlines():
        if line.startswith(prefix):
            return json.loads(line)
    raise TimingError(f"guest {tool} printed no JSON line:\n{output.strip()[-2000:]}")


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
        result = vm.run(command, timeout=600)
        if result.status != 0:
            raise TimingError(f"calibration command failed ({result.status}): {command}\n{result.output}")
        values.append(float(guest_json(result.output, tool)[key]))
    return {"baseline_ns": sorted(values)[len(values) // 2], "runs": values, "command": command, "key": key}
