"""A trace study: one replay per KV tier, or a sweep of one tier's capacity (trace_sim.replay each
time), and the files it leaves: results.json and its plot. `pfcxl serving --trace` parses, calls
these and prints; scripts can call them the same way."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pfcxl.serving import trace_report
from pfcxl.serving.trace_sim import UNBOUNDED, TraceResult, TraceSetup, replay

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TierRuns:
    """One replay per tier, by role (host, appliance, ...)."""

    runs: dict[str, TraceResult]

    def busiest(self) -> float:
        """The highest prefill utilisation of the runs (above 1: the engine is overloaded)."""
        return max(r.summary().get("prefill_utilisation", 0) for r in self.runs.values())

    def write(self, out_dir: Path, doc: dict, title: str, plot: bool = True) -> list[Path]:
        """results.json, and the TTFT CDF unless `plot` is off (a sequence-only run has no times);
        the plots written."""
        out_dir.mkdir(parents=True, exist_ok=True)
        trace_report.write_json(out_dir / "results.json", doc, runs=self.runs)
        return [trace_report.ttft_cdf(self.runs, out_dir / "ttft_cdf.png", title)] if plot else []


@dataclass(frozen=True)
class CapacitySweep:
    """The hit rate (and times) at each capacity, and the unbounded ceiling."""

    points: list[tuple[float, TraceResult]]
    ceiling: TraceResult

    def write(self, out_dir: Path, doc: dict, marks: dict[str, float], title: str) -> list[Path]:
        """results.json (with the marked capacities) and the sweep plot; the plots written."""
        out_dir.mkdir(parents=True, exist_ok=True)
        trace_report.write_json(out_dir / "results.json", {**doc, "marks_tokens": marks}, sweep=self.points,
                                ceiling=self.ceiling)
        return [trace_report.sweep_plot(self.points, self.ceiling, marks, out_dir / "capacity_sweep.png", title)]


def replay_tiers(setups: dict[str, TraceSetup], progress: Progress = lambda step: None) -> TierRuns:
    """Each role's setup replayed, in order."""
    runs = {}
    for role, setup in setups.items():
        progress(role)
        runs[role] = replay(setup)
    return TierRuns(runs)


def sweep_capacity(setup_at: Callable[[float], TraceSetup], capacities: list[float],
                   progress: Progress = lambda step: None) -> CapacitySweep:
    """The setup at each capacity (tokens) replayed, then at no bound at all."""
    points = []
    for capacity in capacities:
        progress(f"{capacity:,.0f} tokens")
        points.append((capacity, replay(setup_at(capacity))))
    progress("unbounded")
    return CapacitySweep(points, replay(setup_at(UNBOUNDED)))
