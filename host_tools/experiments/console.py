"""Command output over the serial console against the virtio-serial port, in one run on one guest:

    python -m pfcxl.host_tools.experiments.console [-t TOPOLOGY] [--mib N] [-n ROUNDS] [--json FILE]

The guest first writes N MiB of text to a file in its RAM (untimed: under TCG, generating it costs
about as much as moving it over the port). Each round then runs the same `cat` of that file once
with its output on the serial line (the guest console's 16550 UART, what every command used
before) and once on the virtio-serial port (host_tools/vm/console.py), interleaved so both see the
same load. Each capture is checked byte
for byte. The figures are host wall time per capture, so MiB/s of the emulated machine's two
channels under TCG: the ratio port/serial is what to compare, the absolute rates depend on how
busy the host is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pfcxl.errors import PfcxlError
from pfcxl.machine import Machine

LINE = b"pfcxl 0123456789 abcdefghijklmnopqrstuvwxyz\n"
OUTPUT = "/tmp/pfcxl-bench-console"     # in the guest's tmpfs


def expected(size: int) -> bytes:
    return (LINE * (size // len(LINE) + 1))[:size]


def capture_seconds(machine: Machine, size: int, serial: bool, timeout: float) -> float:
    """Host wall time of one command that prints `size` bytes; raises if a byte is off."""
    command = f"cat {OUTPUT}"
    started = time.monotonic()
    result = machine.vm.run(command, timeout, serial=serial)
    seconds = time.monotonic() - started
    if result.status != 0 or result.data != expected(size):
        raise PfcxlError(f"{'serial' if serial else 'port'} capture of {size} bytes came back wrong "
                         f"(status {result.status}, {len(result.data)} bytes)")
    return seconds


def measure(topology: str, mib: float, rounds: int, timeout: float) -> dict:
    size = int(mib * (1 << 20))
    times: dict[str, list[float]] = {"serial": [], "port": []}
    with tempfile.TemporaryDirectory(prefix="pfcxl-bench-console-") as run_dir, \
            Machine(topology, run_dir=Path(run_dir)) as machine:
        if machine.vm.ready_info.get("output") != "port":
            raise PfcxlError("the guest opened no virtio-serial output port (PFCXL-READY says "
                             f"output={machine.vm.ready_info.get('output')!r})")
        machine.check(f"yes '{LINE.decode().strip()}' | head -c {size} > {OUTPUT}", timeout)
        for _ in range(rounds):
            for channel in ("serial", "port"):
                times[channel].append(capture_seconds(machine, size, channel == "serial", timeout))
    rate = {c: size / (1 << 20) / statistics.median(t) for c, t in times.items()}
    return {"topology": topology, "bytes": size, "rounds": rounds, "seconds": times,
            "mib_per_s": rate, "ratio_port_over_serial": rate["port"] / rate["serial"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pfcxl.host_tools.experiments.console",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("-t", "--topology", default="pf-nic", help="topology to boot (default: pf-nic)")
    parser.add_argument("--mib", type=float, default=2.0,
                        help="MiB each command prints (default: 2; the serial line moves ~0.05-0.25 MiB/s)")
    parser.add_argument("-n", "--rounds", type=int, default=2, help="rounds of serial then port (default: 2)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one capture may take (default: 600)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.mib <= 0 or args.rounds < 1:
        parser.error("--mib must be above 0 and --rounds at least 1")
    try:
        figures = measure(args.topology, args.mib, args.rounds, args.timeout)
    except PfcxlError as exc:
        print(f"bench_console: error: {exc}", file=sys.stderr)
        return 1
    for channel in ("serial", "port"):
        runs = ", ".join(f"{s:.2f}" for s in figures["seconds"][channel])
        print(f"{channel:>6}: {figures['mib_per_s'][channel]:8.2f} MiB/s (median of {args.rounds}; seconds: {runs})")
    print(f"port/serial: {figures['ratio_port_over_serial']:.1f}x for {figures['bytes']} bytes per command "
          f"(host wall time under TCG, {args.topology})")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
