"""A timed appliance's fabric telemetry as tables: the headline, the per-host and per-module
tables `pfcxl appliance top|stats`, `pfcxl multihost --timing trace` and `pfcxl run` print, and
one host's share of them.

Every latency and utilisation here is modelled (device/fabric/telemetry.py), labelled with the
model it comes from. The one wall-clock figure, traced bytes per second in `top`, is the
emulator's rate (TCG), labelled so: it says how fast the guests run, not how fast a fabric is.
"""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from pfcxl.device.fabric import constants as fc
from pfcxl.device.topology.units import amount


def _lat(entry: dict, system: str, op: str) -> str:
    p = entry["latency_ns"].get(system, {}).get(op, {})
    return f"{p['p50']} / {p['p99']}" if p.get("count") else "-"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _rate(now: dict, before: dict | None, seconds: float) -> str:
    if before is None or seconds <= 0:
        return "-"
    return f"{amount(max(now['bytes'] - before['bytes'], 0) / seconds)}/s"


def headline(stats: dict) -> str:
    a, labels = stats["appliance"], stats["labels"]
    rings, capture = stats["rings"], stats.get("capture")
    models = " and ".join(labels[m] for m in stats["models"])
    return (f"appliance '{a['topology']}' (pid {stats['pid']}): {models}, {stats['issue']} issue; "
            f"{stats['windows']} windows, {stats['records']:,} CXL requests modelled"
            + (f", {stats['unmapped']:,} outside the pool" if stats["unmapped"] else "")
            + f"; rings: largest fill {rings['largest_fill']:,} of {rings['capacity']:,} records "
            f"({_pct(rings['largest_fill_fraction'])}), {rings['dropped']} dropped"
            + (f", {rings['implausible']:,} implausible records refused" if rings.get("implausible") else "")
            + "".join(f"; [red]host {c['host']}'s ring detached: {escape(c['why'])}[/red]" for c in rings.get("cut", []))
            + (f"; [red]capture incomplete: {escape(capture['error'])}[/red]" if capture and capture.get("error") else "")
            + (f"; [red]timing failed: {stats['error']}[/red]" if stats.get("error") else ""))


def tables(stats: dict, before: dict | None = None, seconds: float = 0.0) -> list[Table]:
    """Per host and per module: traffic, modelled p50 / p99 latency, HBM hit rate, utilisation."""
    main = stats["models"][0]
    hbm, pf = "pf_hbm" in stats["models"], main.startswith("pf")
    prev = {(k, e[k]): e for k in ("host", "module") for e in (before or {}).get(f"{k}s", [])}
    caption = (f"latency p50 / p99 (ns) and utilisation: {stats['labels'][main]}"
               + (f"; +HBM: {stats['labels']['pf_hbm']}" if hbm else "")
               + (f"; the paper's loaded PF range: reads {fc.PF_PAPER_LOADED_READ_NS[0]}-"
                  f"{fc.PF_PAPER_LOADED_READ_NS[1]} ns, writes {fc.PF_PAPER_LOADED_WRITE_NS[0]}-"
                  f"{fc.PF_PAPER_LOADED_WRITE_NS[1]} ns" if pf else "")
               + "; traffic: CXL requests traced, 64 B each"
               + (f"; {stats['scope']}" if stats.get("scope") else "")
               + ("; /s: per second of the emulator's wall clock (TCG), not a fabric rate" if before else ""))
    out = []
    for kind in ("host", "module"):
        t = Table(title=f"per {kind} (modelled)", title_justify="left", caption=caption if kind == "module" else None,
                  caption_justify="left")
        cols = [kind] + (["port"] if kind == "host" else []) + ["reads", "writes", "traffic"]
        cols += ["traced/s"] if before else []
        cols += ["read", "write"] + (["+HBM read", "HBM hit"] if hbm else []) + ["busiest link"]
        cols += (["port up/down"] if pf else []) + ["ring fill"] if kind == "host" else []
        for c in cols:
            t.add_column(c, justify="right")
        for e in stats[f"{kind}s"]:
            util = e["utilisation"].get(main) or {}
            busiest = util.get("busiest")
            row = [str(e[kind])] + ([str(e.get("port", "-"))] if kind == "host" else []) + [
                f"{e['reads']:,}", f"{e['writes']:,}", amount(e["bytes"])]
            row += [_rate(e, prev.get((kind, e[kind])), seconds)] if before else []
            row += [_lat(e, main, "read"), _lat(e, main, "write")]
            row += [_lat(e, "pf_hbm", "read"), _pct(e["hbm_hit_rate"])] if hbm else []
            row += [f"{busiest} {_pct(util[busiest])}" if busiest else "-"]
            if kind == "host":
                row += [f"{_pct(util.get('port_up'))} / {_pct(util.get('port_down'))}"] if pf else []
                ring = e.get("ring") or {}
                gone = " (cut)" if ring.get("cut") else "" if e.get("attached") else " (gone)"
                row += [f"{ring.get('largest_fill', 0):,}{gone}"]
            t.add_row(*row)
        out.append(t)
    return out


def _virtual(ns: float) -> str:
    return f"{ns / 1e6:,.3f} ms" if ns >= 1e6 else f"{ns / 1e3:,.1f} us"


def timeline_table(stats: dict) -> Table | str:
    """An appliance started with --clock virtual: where its timeline is and, per timed host, its
    virtual time, lag behind the timeline, the host time it waited at barriers and what other
    hosts' traffic cost it (the contention charged to its clock)."""
    tl, a = stats["timeline"], stats["appliance"]
    if "error" in tl:
        return f"[red]timeline: {escape(tl['error'])}[/red]"
    t = Table(title="timeline (virtual time: the timed guests' own clocks)", title_justify="left",
              caption=(f"quantum {tl['quantum_ns']:,.0f} ns; round {'under way' if tl['started'] else 'not running'}, "
                       f"waits for {tl['expected']} host{'s' if tl['expected'] != 1 else ''}; at "
                       f"{_virtual(tl['virtual_ns'])} after {tl['quanta']:,} quanta; {tl['merged_requests']:,} "
                       f"requests merged, in {tl['merge_s']:.2f} s of host time"
                       + (f"; gone (dropped): host {', '.join(map(str, tl['gone']))}" if tl["gone"] else "")
                       + f"; file {a.get('timeline')}"),
              caption_justify="left")
    for c in ("host", "state", "pid", "virtual time", "lag", "quanta", "requests", "contention charged",
              "waited (host s)"):
        t.add_column(c, justify="right")
    for h in tl["hosts"]:
        t.add_row(str(h["host"]), h["state"], str(h["pid"] or "-"), _virtual(h["virtual_ns"]), _virtual(h["lag_ns"]),
                  f"{h['quanta']:,}", f"{h['requests']:,}" + (f" ({h['overflow']:,} past the buffer)" if h["overflow"] else ""),
                  f"{h['contention_ns']:,.0f} ns", f"{h['wait_s']:.2f}")
    if not tl["hosts"]:
        t.add_row("-", "no timed host has joined yet", *["-"] * 7)
    return t


def render(stats: dict, before: dict | None = None, seconds: float = 0.0) -> Group:
    """The headline and tables of a timed appliance, and its timeline's (--clock virtual); one
    that keeps a timeline and models no traffic (no --fabric) has the timeline's alone."""
    parts: list = []
    if "labels" in stats:
        parts += [headline(stats), *tables(stats, before, seconds)]
    else:
        a = stats["appliance"]
        parts.append(f"appliance '{a['topology']}' (pid {stats['pid']}): no fabric model (started without --fabric); "
                     "its timed hosts' figures are in their own clocks")
    if stats.get("timeline") is not None:
        parts.append(timeline_table(stats))
    return Group(*parts)


def for_host(stats: dict, host: int) -> dict:
    """The figures one host's command reports: its own row of the host table (the appliance also
    keeps the rows of hosts that came and went), and the modules, which carry everyone's traffic."""
    return {**stats, "hosts": [h for h in stats["hosts"] if h["host"] == host],
            "scope": f"host {host} only; the modules carry every host's traffic since the appliance started"}
