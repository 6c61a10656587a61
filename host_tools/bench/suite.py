"""`pfcxl bench`: run the guest benchmark suite and keep every result, whatever fails.

A suite is a list of benchmark runs (guest/src/idle_latency, loaded_latency, bandwidth), each
on the CXL DAX device or on anonymous memory (the local-DRAM row); on_data_paths() moves the CXL
runs to the direct device, or repeats them there, as the guest's data path says. Each run's JSON is saved as
soon as it arrives; a benchmark that crashes or hangs is recorded as an error naming it, the
guest is rebooted if it has to be, and the suite goes on.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from pfcxl import __version__
from pfcxl.device.topology import data_path
from pfcxl.device.topology import Topology
from pfcxl.errors import PfcxlError
from pfcxl.guest.tool_output import json_lines

from pfcxl import cache
from pfcxl.text_files import read_text


@dataclass(frozen=True)
class BenchSpec:
    name: str            # unique in the suite: "idle_latency/cxl"
    command: str         # {dax} is replaced by the DAX device
    system: str          # "cxl" (the emulated appliance memory), "direct" (the same memory on the
                         # direct path) or "local" (guest DRAM)
    timeout: float = 300


def _pair(name: str, args: str, timeout: float = 300, mark_rows: bool = False) -> list[BenchSpec]:
    """The run on the CXL device and on local memory. mark_rows: each row of the CXL run is one
    plugin phase (the tool's --mark-rows 1), for the modelled columns (bench_model)."""
    tool = name.split("/")[0]
    return [BenchSpec(f"{name}/cxl", f"{tool} --target {{dax}} {args}" + (" --mark-rows 1" if mark_rows else ""),
                      "cxl", timeout),
            BenchSpec(f"{name}/local", f"{tool} --target anon {args}", "local", timeout)]


# Sized for TCG: every CXL access is an emulator I/O callback (~1 us), so spans stay small.
SUITES: dict[str, list[BenchSpec]] = {
    "quick": (_pair("idle_latency", "--span 8M --mode both --warmup-laps 1 --laps 1")
              + _pair("loaded_latency", "--span 4M --traffic-span 4M --threads 1 --delay-ns 0,2000,20000 "
                      "--laps 1 --min-ms 100", mark_rows=True)
              + _pair("bandwidth", "--pattern seq,random --op read,write --sizes 32,64,256,1024 "
                      "--threads 1 --bytes 1M --span 8M", mark_rows=True)),
    "full": (_pair("idle_latency", "--span 64M --mode both --warmup-laps 1 --laps 2", 1200)
             + _pair("loaded_latency", "--span 16M --traffic-span 16M --threads 2 "
                     "--delay-ns 0,500,2000,5000,20000,100000 --laps 1 --min-ms 200", 1800, mark_rows=True)
             + _pair("bandwidth", "--pattern seq,random --op read,write,mixed --sizes 32,64,128,256,512,1024 "
                     "--threads 1,2 --bytes 4M --span 32M", 3600, mark_rows=True)),
}


@dataclass
class BenchResult:
    name: str
    system: str
    command: str
    status: str                     # ok | failed | error
    seconds: float                  # wall time on the host, boot excluded
    data: dict | None = None        # the tool's JSON
    error: str | None = None
    modelled: dict = field(default_factory=dict)   # fabric models fed by this run's captured accesses


def unknown_suite(name: str) -> str:
    """What a --suite that is neither a shipped suite nor a file is told."""
    return f"no suite '{name}' (shipped: {', '.join(SUITES)}; or a JSON file)"


def load_suite(name_or_path: str) -> list[BenchSpec]:
    """A shipped suite (quick, full) or a JSON file: [{"name", "command", "system", "timeout"}]."""
    if name_or_path in SUITES:
        return SUITES[name_or_path]
    path = Path(name_or_path)
    if not os.path.lexists(path):
        raise PfcxlError(unknown_suite(name_or_path))
    text = read_text(path, PfcxlError, f"suite file {path}")
    try:
        specs = [BenchSpec(**item) for item in json.loads(text)]
    except (ValueError, TypeError) as exc:
        raise PfcxlError(f"suite file {path}: {exc} (a list of objects with name, command, system, timeout)") from exc
    if len({s.name for s in specs}) != len(specs):
        raise PfcxlError(f"suite file {path}: benchmark names must be unique")
    return specs


def on_data_paths(specs: list[BenchSpec], topo: Topology) -> list[BenchSpec]:
    """The suite for the topology's data path: each CXL run stays if the guest has a CXL region,
    and is repeated on the (first) direct device, named .../direct, if it has a direct path."""
    out = []
    for spec in specs:
        if spec.system != "cxl":
            out.append(spec)
            continue
        if data_path.has_cxl(topo):
            out.append(spec)
        if data_path.has_direct(topo):
            stem = spec.name[:-len("/cxl")] if spec.name.endswith("/cxl") else spec.name
            out.append(replace(spec, name=f"{stem}/direct", system="direct"))
    return out


def devices(ready: dict, default: str = "/dev/dax0.0") -> dict[str, str]:
    """System -> the DAX device its runs use, from the guest's PFCXL-READY record: the first of
    each kind (`default` for cxl when the record lists none)."""
    out = {"cxl": default}
    for dax in reversed(ready.get("dax", [])):
        out[dax["kind"]] = dax["path"]
    return out


def environment(topo: Topology, *, suite: str, image: str, timing: str | None) -> dict:
    manifest = cache.read_manifest()
    cpu = "unknown"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"pfcxl": __version__, "qemu": manifest.get("qemu_version"), "kernel": manifest.get("kernel_release"),
            "ndctl": manifest.get("ndctl_version"), "topology": topo.name, "timing_profile": topo.profile,
            "timing_mode": timing or "none", "capture": CAPTURE, "data_path": topo.guest.data_path, "suite": suite, "image": image, "host_cpu": cpu,
            "host_cpus": os.cpu_count(), "host": platform.node(), "guest_cpus": topo.guest.cpus,
            "accelerator": "tcg",
            "note": "measured figures are guest wall-clock under QEMU TCG: emulator time, not fabric latency"}


CAPTURE = ("the TCG plugin captures every CXL access of each run (trace mode, always on in the bench); "
           "runs with --mark-rows 1 are split per row and replayed at each row's nominal load")


def parse_output(output: str) -> dict | None:
    """A run's result line; None (the run is reported failed, the suite goes on) if none parses."""
    found = json_lines(output, '{"tool":', bad="skip")
    return found[0] if found else None


class Results:
    """results/<timestamp>/results.json, rewritten (atomically) after every benchmark."""

    def __init__(self, out_dir: Path, env: dict) -> None:
        self.dir = out_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = env
        self.runs: list[BenchResult] = []

    def add(self, result: BenchResult) -> None:
        self.runs.append(result)
        self.save()

    def save(self) -> None:
        path = self.dir / "results.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"environment": self.env, "results": [asdict(r) for r in self.runs]}, indent=1))
        os.replace(tmp, path)


def run_suite(specs: list[BenchSpec], results: Results, *, boot: Callable, dax: str = "/dev/dax0.0",
              bracket: Callable[[BenchSpec], bool] = lambda spec: False, after: Callable | None = None,
              say: Callable[[str], None] = lambda m: None) -> Results:
    """Run every benchmark as a traced run (Machine.traced_run); `boot()` gives a ready
    pfcxl.Machine with a timing plugin (called again after one died).

    `bracket(spec)`: mark the run as one plugin phase; `after(vm, spec, result, traced)` gets the
    pfcxl.TracedRun (its records, for the modelled columns).
    """
    vm = None
    try:
        for i, spec in enumerate(specs, start=1):
            say(f"[{i}/{len(specs)}] {spec.name}")
            if vm is None:
                vm = boot()
            command = spec.command.replace("{dax}", devices(vm.ready, dax).get(spec.system, dax))
            start = time.monotonic()
            result = BenchResult(spec.name, spec.system, command, "error", 0.0)
            try:
                traced = vm.traced_run(command, timeout=spec.timeout, bracket=bracket(spec))
                done = traced.result
                result.seconds = round(time.monotonic() - start, 3)
                result.data = parse_output(done.output)
                if done.status == 0 and result.data is not None:
                    result.status = "ok"
                else:
                    result.status = "failed"
                    tail = " | ".join(done.output.strip().splitlines()[-3:])
                    result.error = (f"benchmark {spec.name} exited with status {done.status}"
                                    + (" and printed no JSON" if result.data is None else "") + f": {tail}")
                if after:
                    after(vm, spec, result, traced)
            except PfcxlError as exc:
                # a hang (timeout) or a crash that took the guest down: name it, reboot for the rest
                result.seconds = round(time.monotonic() - start, 3)
                result.error = f"benchmark {spec.name}: {str(exc).splitlines()[0]}"
                vm.close()
                vm = None
            results.add(result)
    finally:
        if vm is not None:
            vm.close()
    return results
