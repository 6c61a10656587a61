"""Results of trace replays: tables, the TTFT CDF and capacity-sweep plots, and the JSON."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
from rich.table import Table

from pfcxl.serving.trace_sim import TraceResult

COLOURS = {"appliance": "tab:blue", "host": "tab:orange"}


def runs_table(results: dict[str, TraceResult], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("KV tier", "capacity (tokens)", "requests", "span s", "hit rate", "GPU HBM", "KV tier",
                "counted", "TTFT mean ms", "p50", "p90", "p99", "prefill busy"):
        t.add_column(col, justify="left" if col == "KV tier" else "right")
    for role, r in results.items():
        s = r.summary()
        ttft = s.get("ttft_ms")
        cells = [f"{ttft[k]:,.0f}" for k in ("mean", "p50", "p90", "p99")] if ttft else ["-"] * 4
        t.add_row(role, f"{s['kv_capacity_tokens']:,.0f}" if s["kv_capacity_tokens"] is not None else "unbounded",
                  f"{s['requests']:,}", f"{s['span_s']:,.0f}", f"{s['hit_rate']:.2%}", f"{s['gpu_hit_rate']:.2%}",
                  f"{s['kv_hit_rate']:.2%}", f"{s['counted_hit_rate']:.2%}", *cells,
                  f"{s['prefill_utilisation']:.0%}" if "prefill_utilisation" in s else "-")
    return t


def hosts_table(results: list, title: str) -> Table:
    """N-host replays (hosts_sim.HostsResult), one row per host and an overall row per result."""
    t = Table(title=title, title_justify="left")
    for col in ("cache", "host", "requests", "hit rate", "blocks hit", "own", "other", "present", "stored",
                "evictions"):
        t.add_column(col, justify="left" if col == "cache" else "right")
    for r in results:
        s = r.summary()
        for row in [*s["hosts"], {"host": "all", **s["overall"]}]:
            rate = row["hit_tokens"] / row["input_tokens"] if row["input_tokens"] else 0.0
            t.add_row(r.setup.cache, str(row["host"]), f"{row['requests']:,}", f"{rate:.2%}",
                      *(f"{row[k]:,}" for k in ("hits", "own", "other", "present", "stored", "evictions")),
                      end_section=row["host"] == "all")
    return t


def sweep_table(points: list[tuple[float, TraceResult]], ceiling: TraceResult, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("KV-tier capacity (tokens)", "hit rate", "of ceiling", "KV tier", "TTFT p50 ms", "p99 ms"):
        t.add_column(col, justify="right")
    top = ceiling.summary()["hit_rate"]
    for capacity, r in points:
        s = r.summary()
        ttft = s.get("ttft_ms")
        t.add_row(f"{capacity:,.0f}", f"{s['hit_rate']:.2%}", f"{s['hit_rate'] / top:.1%}" if top else "-",
                  f"{s['kv_hit_rate']:.2%}", f"{ttft['p50']:,.0f}" if ttft else "-", f"{ttft['p99']:,.0f}" if ttft else "-")
    t.add_row("unbounded (ceiling)", f"{top:.2%}", "100%", f"{ceiling.summary()['kv_hit_rate']:.2%}", "-", "-")
    return t


def _figure(title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=8)
    ax.grid(alpha=0.3)
    return plt, fig, ax


def ttft_cdf(results: dict[str, TraceResult], path: Path, title: str) -> Path:
    plt, fig, ax = _figure(title)
    for role, r in results.items():
        ttft = np.sort(r.ttft_s)
        ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), color=COLOURS.get(role), label=role)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def sweep_plot(points: list[tuple[float, TraceResult]], ceiling: TraceResult, marks: dict[str, float],
               path: Path, title: str) -> Path:
    """Hit rate against KV-tier capacity (log), the ceiling as a line, `marks` as verticals."""
    plt, fig, ax = _figure(title)
    ax.plot([c for c, _ in points], [100 * r.summary()["hit_rate"] for _, r in points], "o-", label="hit rate")
    ax.axhline(100 * ceiling.summary()["hit_rate"], color="black", ls="--", label="ceiling (unbounded tier)")
    for (label, tokens), colour in zip(marks.items(), ("tab:orange", "tab:blue")):
        ax.axvline(tokens, color=colour, ls=":", label=f"{label}: {tokens:,.3g} tokens")
    ax.set_xscale("log")
    ax.set_xlabel("KV-tier capacity (tokens)")
    ax.set_ylabel("prefix hit rate (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_json(path: Path, setup: dict, runs: dict[str, TraceResult] | None = None,
               sweep: list[tuple[float, TraceResult]] | None = None, ceiling: TraceResult | None = None) -> None:
    doc = {"setup": setup}
    if runs:
        doc["runs"] = {role: r.summary() for role, r in runs.items()}
    if sweep is not None:
        doc["sweep"] = [{"kv_capacity_tokens": c, **r.summary()} for c, r in sweep]
        doc["ceiling"] = ceiling.summary()
    path.write_text(json.dumps(doc, indent=1))
