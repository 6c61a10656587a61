"""Sensitivity sweeps (`--sweep PARAM[=V,V,...]`): how the figures move with one mechanism
constant (serving/data/constants.toml), as a table and a PNG plot of model / paper against it,
green within the check's band (2x for Table I, 25% for the serving table)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from pfcxl.errors import ServingError

from pfcxl.serving import mechanisms

FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)


def values(spec: str, c: mechanisms.Constants) -> tuple[str, list[float]]:
    """'PARAM' (its published value times FACTORS, fractions kept at most 1) or 'PARAM=V,V,...'."""
    name, _, listed = spec.partition("=")
    name = name.strip()
    if name not in mechanisms.NUMERIC:
        raise ServingError(f"--sweep: '{name}' is not a mechanism constant (known: {', '.join(mechanisms.NUMERIC)})")
    if listed:
        try:
            out = sorted({float(v) for v in listed.split(",")})
        except ValueError as exc:
            raise ServingError(f"--sweep: '{listed}' must be numbers, comma-separated") from exc
    else:
        base = getattr(c, name)
        out = sorted({min(base * f, 1.0) if name.endswith("fraction") else base * f for f in FACTORS})
    for v in out:
        c.with_value(name, v)                       # the constant's own rule, one line if broken
    return name, out


def table(name: str, xs: list[float], series: dict[str, list[float]], title: str,
          band: tuple[float, float] = (0.5, 2.0)) -> Table:
    """One row per series (model / paper, green within `band`), one column per swept value."""
    t = Table(title=title, title_justify="left")
    t.add_column(f"{name} =", justify="left")
    for x in xs:
        t.add_column(f"{x:g}", justify="right")
    for label, ys in series.items():
        t.add_row(label, *(f"[{'green' if band[0] <= y <= band[1] else 'red'}]{y:.2f}[/]" for y in ys))
    return t


def plot(name: str, xs: list[float], series: dict[str, list[float]], path: Path, title: str,
         ylabel: str = "model / paper", band: tuple[float, float] = (0.5, 2.0)) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 6))
    for label, ys in series.items():                 # dashed: a row's low end or the TTFT; solid otherwise
        style = "--" if " lo " in label or label.endswith("ttft_ms") else "-"
        ax.plot(xs, ys, marker="o", ls=style, lw=1, ms=3, label=label)
    ax.axhline(1.0, color="black", lw=0.8)
    for y in band:
        ax.axhline(y, color="grey", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(name)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if len(series) <= 24 else 2)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
