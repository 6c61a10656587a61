"""An explicit opt-in fit to the paper (`pfcxl serving --calibrate`): the dense prefill throughput
per GPU that makes the simulator's mean TTFT at the paper's calibration point (its workload's
deployment with the appliance tier at 50 sessions: 2,690 ms) equal the paper's figure.

This is not the model's default. By default the throughput is a published measurement
(serving/data/constants.toml, prefill.dense_fraction of the GPU's dense BF16 peak), and the
paper's serving table is the check. The fit is used for the run that asks for it and is never
stored with the published constants.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfcxl.errors import ServingError

from pfcxl.serving import inputs, mechanisms, sim

SESSIONS = 50
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


def fit(workload: inputs.Workload, *, seed: int = 1, constants: mechanisms.Constants | None = None,
        progress=None) -> Calibration:
    """Find the dense throughput whose mean TTFT hits the target: secant steps on the TTFT as a
    function of the time per dense FLOP (close to linear in it), from the published value."""
    model, gpu = inputs.load_model(workload.model), inputs.load_gpu(workload.gpu)
    tier = inputs.load_tier(workload.appliance)
    mech = constants or mechanisms.load()
    target = target_ms(workload)

    def ttft(inverse: float) -> float:
        setup = sim.ServingSetup(workload, model, gpu, tier, SESSIONS, 1 / inverse, seed, constants=mech)
        return sim.simulate(setup).summary()["ttft_ms"]["mean"]

    x0 = 1 / (mechanisms.published_prefill_tflops(gpu, mech) * 1e12)
    x1, f0 = x0 * 1.25, ttft(x0)
    for run in range(2, 51):
        f1 = ttft(x1)
        if progress:
            progress(f"calibration run {run}: {1 / x1 / 1e12:.3f} TFLOP/s per GPU -> {f1:.2f} ms")
        if abs(f1 - target) <= TOLERANCE_MS:
            if 1 / x1 > gpu.bf16_dense_tflops * 1e12:
                raise ServingError(f"cannot calibrate: the fit needs {1 / x1 / 1e12:.0f} TFLOP/s per GPU, above the "
                                   f"{gpu.name}'s dense BF16 peak")
            return Calibration(1 / x1 / 1e12, workload.name, SESSIONS, target, seed, f1, run)
        if f1 == f0:
            break
        x0, x1, f0 = x1, max(x1 + (target - f1) * (x1 - x0) / (f1 - f0), x1 / 10), f1
    raise ServingError(f"calibration did not converge (last {f1:.2f} ms for a target of {target:.0f} ms)")
