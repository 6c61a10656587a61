"""What `pfcxl kv replay` prints: per host and overall counts of each mode, local against shared,
the killed host, and each request's modelled TTFT.

The payloads the store moved are scaled (`--block-bytes`); the modelled TTFT uses the model's real
block (kv bytes per token x block tokens, e.g. 160 MiB per 512-token block of LLaMA-3.1-70B):
the hit blocks loaded one after another at the fabric model's time for one real block (host_tools/
host_tools/kv/model.py's setting: one host, 4 KiB requests all at once), then the prefill of the tokens past
the hits (serving/compute.py at the measured dense throughput (serving/data/constants.toml)). No queueing, no GPU tier: a lower bound
per request that compares the modes, not a serving simulation (that is `pfcxl serving`).
"""

from __future__ import annotations

import numpy as np

from pfcxl.device.topology.units import human

from pfcxl.host_tools.kv.model import GPU, GPUS, block_load_seconds, prefill_seconds
from pfcxl.host_tools.kv.replay_timing import ttft as timed_ttft
from pfcxl.host_tools.ui import out

FABRICS = ("pf", "electrical")
LABEL = dict(pf="PF", electrical="electrical")
COLUMNS = (("requests", "requests"), ("hit rate", None), ("loaded own", "own"), ("loaded other", "other"),
           ("stored", "stored"), ("evictions", "evictions"), ("races lost", "lost"), ("failed check", "bad"),
           ("read (KiB)", "read"), ("written (KiB)", "written"))
BYTE_COLUMNS = ("read", "written")


def kib(value: int) -> str:
    """Bytes in a KiB column: one unit for every row, the unit in the column's title."""
    return f"{value / 1024:,.0f}"


def hit_rate(row: dict) -> float:
    return row["hits"] / row["blocks"] if row["blocks"] else 0.0


def ttft(result: dict, requests, model_name: str, block_tokens: int) -> dict:
    """p50/p99 modelled TTFT (ms) of the finished requests, per fabric (the module doc)."""
    per_block = block_load_seconds(model_name, block_tokens)
    done = prefill_seconds(result, requests, model_name, block_tokens)
    prefill = np.array([p for _, p in done])
    hits = np.array([result["results"][i]["hits"] for i, _ in done])
    outp = {}
    for f in FABRICS:
        ms = (hits * per_block[f] + prefill) * 1e3
        outp[f] = dict(p50_ms=float(np.percentile(ms, 50)), p99_ms=float(np.percentile(ms, 99)))
    return outp


def summary(result: dict, requests, model_name: str, block_tokens: int) -> dict:
    """The JSON of one mode: everything but the per-request lists, plus the TTFT."""
    keep = {k: v for k, v in result.items() if k not in ("results", "host_of")}
    for row in keep["hosts"] + [keep["overall"]]:
        row["hit_rate"] = hit_rate(row)
    keep["requests_per_s"] = keep["overall"]["requests"] / keep["seconds"] if keep["seconds"] else None
    keep["ttft"] = ttft(result, requests, model_name, block_tokens)
    if keep.get("lookups"):                      # kvreplay's own count (--on guests)
        n = sum(h["lookups"] for h in keep["lookups"])
        keep["lookup_cost"] = dict(lookups=n, index_lines=sum(h["index_lines"] for h in keep["lookups"]),
                                   bytes_per_lookup=64 * sum(h["index_lines"] for h in keep["lookups"]) / n if n else None)
    if keep.get("timing"):
        keep["timing"]["ttft"] = timed_ttft(result, requests, model_name, block_tokens)
    return keep


def assumption(model_name: str, block_tokens: int, block_bytes: int) -> str:
    real = block_load_seconds(model_name, block_tokens)
    return (f"payloads scaled to {human(block_bytes)} per block; the TTFT uses {model_name}'s real "
            f"{human(real['bytes'])} per {block_tokens}-token block: {real['pf'] * 1e3:.1f} ms to load one from "
            f"the PF appliance, {real['electrical'] * 1e3:.1f} ms from the electrical pool (fabric model, one host), "
            f"prefill on {GPUS} x {GPU} (serving/compute.py); no queueing")


def render_timing(tm: dict, mode: str) -> None:
    """Per host: the appliance's modelled figures of the mode and its requests' modelled TTFT."""
    from rich.table import Table
    t = Table(title=f"{mode}: modelled by the appliance ({tm['fabric']}), {tm['model_s'] * 1e3:.2f} ms of model time, "
              f"{tm['dropped']} ring records dropped")
    for col in ("host", "reads", "moved (KiB)", "read p50 / p99 (ns)", "load rate (GB/s)", TIMED_TTFT):
        t.add_column(col, justify="right")
    ttft_of = {h["host"]: h for h in tm["ttft"]["hosts"]}
    for h in tm["hosts"]:
        t.add_row(str(h["host"]), str(h["reads"]), kib(h["bytes"]), f"{h['read_p50_ns']} / {h['read_p99_ns']}",
                  f"{h['rate_gbs']:.2f}" if h["rate_gbs"] else "-", ms_pair(ttft_of.get(h["host"], {})))
    t.add_row("all", str(sum(h["reads"] for h in tm["hosts"])), kib(sum(h["bytes"] for h in tm["hosts"])), "", "",
              ms_pair(tm["ttft"]["overall"]))
    out.print(t)
    out.print("[dim]model figures (host_tools/kv/replay_timing.py), not the guests' clocks: a real block loads at its "
              "host's modelled rate; read latency percentiles run from the guests' start[/dim]")


TIMED_TTFT = "TTFT p50 / p99 (ms), at the host's modelled rate"


def ms_pair(tt: dict) -> str:
    return f"{tt['p50_ms']:,.0f} / {tt['p99_ms']:,.0f}" if tt.get("p50_ms") is not None else "-"


def render(summaries: list[dict], note: str) -> None:
    from rich.table import Table
    for s in summaries:
        t = Table(title=f"{s['mode']}: {s['routing']} routing, {s['overall']['requests']} requests in "
                  f"{s['seconds']:.1f} s ({s['requests_per_s']:.0f}/s)")
        t.add_column("host", justify="right")
        for title, _ in COLUMNS:
            t.add_column(title, justify="right")
        for row in s["hosts"] + [dict(s["overall"], host="all")]:
            t.add_row(str(row["host"]), *(f"{row['hit_rate']:.1%}" if key is None else
                                          kib(row[key]) if key in BYTE_COLUMNS else str(row[key])
                                          for _, key in COLUMNS))
        out.print(t)
        w = s["waits"]
        pace = "each batch after the one before" if not s["ahead"] else f"hosts up to {s['ahead']} batches apart"
        out.print(f"hosts waited {w['total_s']:,.1f} s in all for work ({min(w['host_s']):,.1f} to "
                  f"{max(w['host_s']):,.1f} s each, of {s['seconds']:.1f} s; {w['batches']} "
                  f"batch{'es' if w['batches'] != 1 else ''}, {pace})",
                  highlight=False)
        k = s["killed"]
        if k is not None and k["at_s"] is None:
            out.print(f"host {k['host']} was not killed: the replay ended first", highlight=False)
        elif k is not None:
            out.print(f"host {k['host']} killed (SIGKILL) at {k['at_s']:.2f} s: {len(k['unfinished'])} requests "
                      f"not finished {k['unfinished'][:20]}{' ...' if len(k['unfinished']) > 20 else ''}",
                      highlight=False)
        if s.get("lookup_cost"):
            lc = s["lookup_cost"]
            out.print(f"guest lookups (kvreplay's count): {lc['lookups']}, {lc['bytes_per_lookup']:.0f} index bytes "
                      f"each ({lc['bytes_per_lookup'] / 64:.1f} lines)", highlight=False)
        if s.get("timing"):
            render_timing(s["timing"], s["mode"])
        c = s["check"]
        out.print(f"store afterwards: {c['good']} blocks read back and checked, {c['bad']} wrong, "
                  f"{c['claims']} unpublished claims", highlight=False)
    # one TTFT per mode: with --fabric the appliance's (the per-host tables' figure, over all
    # hosts), else the fabric model's time per block on each fabric
    timed = [s["timing"] for s in summaries if s.get("timing")]
    t = Table(title="local against shared: overall")
    ttft_cols = ([f"TTFT p50 / p99 (ms), {timed[0]['fabric']}: appliance-modelled rate"] if timed else
                 [f"TTFT p50 / p99 {LABEL[f]} (ms)" for f in FABRICS])
    for col in ("mode", "hit rate", "races lost", "evictions", "hosts waited (s)", *ttft_cols):
        t.add_column(col, justify="right")
    for s in summaries:
        o = s["overall"]
        cells = ([ms_pair(s["timing"]["ttft"]["overall"])] if timed else [ms_pair(s["ttft"][f]) for f in FABRICS])
        t.add_row(s["mode"], f"{o['hit_rate']:.1%}", str(o["lost"]), str(o["evictions"]),
                  f"{s['waits']['total_s']:,.1f}", *cells)
    out.print(t)
    if timed:
        note += ("; with --fabric, the TTFT loads each real block at its host's modelled rate (the appliance's "
                 "tables above) instead of the fabric model's time per block")
    out.print(f"[dim]{note}[/dim]")
