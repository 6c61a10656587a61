"""Results of a serving sweep: the table beside the paper's figures, PNG plots and JSON."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from rich.table import Table

from pfcxl.serving.inputs import Workload
from pfcxl.serving.sim import Result

ROLES = {"appliance": "appliance", "host": "host DRAM"}


def comparison(results: dict[str, list[Result]], workload: Workload, paper: bool) -> list[dict]:
    """One row per tier and session count: the model's figures, and the paper's with the ratio
    model / paper where the paper gives one (and `paper`, i.e. the run is the paper's setup)."""
    rows = []
    for role, runs in results.items():
        for r in runs:
            s = r.summary()
            row = {"tier": role, "sessions": r.setup.sessions, "ttft_ms": s["ttft_ms"]["mean"],
                   "p90_ms": s["ttft_ms"]["p90"], "hit_rate": s["counted_hit_rate"], "wait_ms": s["mean_ms"]["gpu_wait"]
                   + s["mean_ms"]["link_wait"], "load_ms": s["mean_ms"]["load"]}
            for metric, key in (("ttft_ms", "ttft_ms"), ("hit_rate", "hit_rate")):
                figure = workload.paper.get(metric, {}).get(role, {}).get(r.setup.sessions) if paper else None
                row[f"paper_{key}"] = figure
                row[f"{key}_ratio"] = row[key] / figure if figure else None
            rows.append(row)
    return rows


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    colour = "green" if abs(value - 1) <= 0.25 else "red"
    return f"[{colour}]{value:.2f}[/{colour}]"


def table(rows: list[dict], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("tier", "sessions", "TTFT ms (model)", "paper", "ratio", "hit rate (model)", "paper", "ratio",
                "of which waiting ms", "loading ms", "p90 TTFT ms"):
        t.add_column(col, justify="left" if col == "tier" else "right")
    for r in rows:
        t.add_row(ROLES[r["tier"]], str(r["sessions"]), f"{r['ttft_ms']:,.0f}",
                  f"{r['paper_ttft_ms']:,.0f}" if r["paper_ttft_ms"] else "-", _ratio(r["ttft_ms_ratio"]),
                  f"{r['hit_rate']:.2%}", f"{r['paper_hit_rate']:.2%}" if r["paper_hit_rate"] else "-",
                  _ratio(r["hit_rate_ratio"]), f"{r['wait_ms']:,.0f}", f"{r['load_ms']:,.0f}", f"{r['p90_ms']:,.0f}")
    return t


def plots(rows: list[dict], out_dir: Path, title: str) -> list[Path]:
    """ttft.png and hit_rate.png against sessions, one line per tier, the paper's points as marks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for key, label, name, scale in (("ttft_ms", "mean TTFT (s)", "ttft.png", 1e-3),
                                    ("hit_rate", "prefix hit rate (%)", "hit_rate.png", 100)):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for role, colour in (("appliance", "tab:blue"), ("host", "tab:orange")):
            mine = [r for r in rows if r["tier"] == role]
            if not mine:
                continue
            ax.plot([r["sessions"] for r in mine], [r[key] * scale for r in mine], "o-", color=colour,
                    label=f"{ROLES[role]} (model)")
            paper = [r for r in mine if r[f"paper_{key}"]]
            if paper:
                ax.plot([r["sessions"] for r in paper], [r[f"paper_{key}"] * scale for r in paper], "x",
                        color=colour, markersize=10, mew=2, label=f"{ROLES[role]} (paper)")
        ax.set_xlabel("concurrent sessions")
        ax.set_ylabel(label)
        ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def write_json(path: Path, results: dict[str, list[Result]], rows: list[dict], calibration: dict) -> None:
    doc = {"calibration": calibration, "comparison": rows,
           "runs": [r.to_json() for runs in results.values() for r in runs]}
    path.write_text(json.dumps(doc, indent=1, allow_nan=False))      # JSON has no Infinity or NaN
