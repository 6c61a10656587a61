"""The serving model's one calibrated constant: the effective prefill throughput per GPU.

It is fitted so that the simulator's mean TTFT at the paper's calibration point (its workload's
deployment with the appliance tier at 50 sessions: 2,690 ms) equals the paper's figure. Every
other input comes from a stated source. The fit is stored in serving/data/calibration.toml with
the command that wrote it; tests/unit/test_serving.py re-fits and checks the stored value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pfcxl.errors import ServingError

from pfcxl.serving import compute, inputs, sim

CALIBRATION = inputs.DATA / "calibration.toml"
SESSIONS = 50
COMMAND = "pfcxl serving --calibrate --save"
TOLERANCE_MS = 0.01


@dataclass(frozen=True)
class Calibration:
    prefill_tflops_per_gpu: float
    workload: str
    sessions: int
    target_ms: float
    seed: int
    fitted_ms: float
    runs: int


def target_ms(workload: inputs.Workload) -> float:
    try:
        return workload.paper["ttft_ms"]["appliance"][SESSIONS]
    except KeyError as exc:
        raise ServingError(f"{workload.name}: paper.ttft_ms.appliance.{SESSIONS}: missing (the calibration "
                           "point: the paper's TTFT with the appliance at 50 sessions)") from exc


def fit(workload: inputs.Workload, *, seed: int = 1, progress=None) -> Calibration:
    """Find the throughput whose mean TTFT hits the target. TTFT = (load and link wait, which do
    not depend on it) + (prefill and the wait for the engine, about inversely proportional to it),
    so each step rescales the throughput by the ratio of the two; it converges in a few runs and
    stops within TOLERANCE_MS of the target."""
    model, gpu = inputs.load_model(workload.model), inputs.load_gpu(workload.gpu)
    tier = inputs.load_tier(workload.appliance)
    target = target_ms(workload)
    flops = 0.3 * compute.peak_flops(gpu, 1)                 # a start; the answer does not depend on it
    for run in range(1, 51):
        summary = sim.simulate(sim.Setup(workload, model, gpu, tier, SESSIONS, flops, seed)).summary()
        got, parts = summary["ttft_ms"]["mean"], summary["mean_ms"]
        if progress:
            progress(f"calibration run {run}: {flops / 1e12:.3f} TFLOP/s per GPU -> {got:.2f} ms")
        if abs(got - target) <= TOLERANCE_MS:
            return Calibration(flops / 1e12, workload.name, SESSIONS, target, seed, got, run)
        fixed = parts["load"] + parts["link_wait"]
        if fixed >= target:
            raise ServingError(f"cannot calibrate: loading KV alone takes {fixed:.0f} ms, above the target "
                               f"{target:.0f} ms")
        flops *= (got - fixed) / (target - fixed)
    raise ServingError(f"calibration did not converge (last {got:.2f} ms for a target of {target:.0f} ms)")


def load(path: Path = CALIBRATION) -> Calibration:
    if not path.exists():
        raise ServingError(f"{path}: no stored calibration; run '{COMMAND}'")
    doc = inputs.read_toml(path)
    try:
        return Calibration(**{k: doc[k] for k in Calibration.__dataclass_fields__})
    except KeyError as exc:
        raise ServingError(f"{path.name}: {exc.args[0]}: missing; re-run '{COMMAND}'") from exc


def save(cal: Calibration, gpu: inputs.Gpu, path: Path = CALIBRATION) -> None:
    """Write the fit with its provenance (a temporary file renamed over the old one)."""
    mfu = cal.prefill_tflops_per_gpu / gpu.bf16_dense_tflops
    text = (f"# The serving model's one fitted constant, written by `{COMMAND}`.\n"
            f"# Fitted to the paper's TTFT at {cal.sessions} sessions with the appliance ({cal.target_ms:.0f} ms);\n"
            f"# tests/unit/test_serving.py re-fits it and checks this value. {mfu:.1%} of the {gpu.name}'s\n"
            f"# {gpu.bf16_dense_tflops:g} dense BF16 TFLOP/s.\n"
            f"prefill_tflops_per_gpu = {cal.prefill_tflops_per_gpu!r}\n"
            f'workload = "{cal.workload}"\nsessions = {cal.sessions}\ntarget_ms = {cal.target_ms!r}\n'
            f"seed = {cal.seed}\nfitted_ms = {cal.fitted_ms!r}\nruns = {cal.runs}\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)

