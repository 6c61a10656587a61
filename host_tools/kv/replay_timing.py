"""`pfcxl kv replay --on guests --fabric pf|electrical`: the appliance models every guest's real
replay traffic (device/fabric/telemetry.py); after each mode its telemetry is read, and this
module turns two readings (before and after the mode) into per-host figures and TTFTs.

Per host: the bytes it moved through the appliance in the mode, its modelled read latency (p50,
p99: the appliance's histogram, which runs from the guests' start, so the second mode's includes
the first's), and its modelled load rate: those bytes over the mode's modelled time. Modelled
time is the telemetry's clock (each guest's instructions at the model's ns per instruction plus
the fabric's waits), never the guest's wall clock: it includes the replay's own work on each
block (its crc and byte check), so the rate is a lower bound on what the fabric gives.

A request's modelled TTFT: its hit blocks loaded one after another at its host's modelled rate,
each the model's real block (e.g. 160 MiB per 512-token block of LLaMA-3.1-70B, not the replay's
scaled payload), then the prefill of the tokens past the hits (kv/model.py's prefill_seconds).
With --fabric this is the report's one TTFT, per host and overall (the fabric model's estimate
per block, replay_report.ttft, stays in the JSON only).
"""

from __future__ import annotations

import numpy as np

from pfcxl.host_tools import appliance_client as appliance, timeouts
from pfcxl.host_tools.kv.model import block_load_seconds, prefill_seconds


def snapshot(where) -> dict:
    """The appliance's telemetry once everything the hosts' rings hold so far is modelled."""
    with appliance.Client(where, timeout=timeouts.STATS_SYNC_S) as c:
        return c.call("stats", sync=True)


def figures(before: dict, after: dict, fabric: str, hosts: int) -> dict:
    """Per host (by host id) and for the mode: bytes, modelled read latency and load rate."""
    span_ns = after["model_ns"][fabric] - before["model_ns"].get(fabric, 0)
    was = {h["host"]: h for h in before.get("hosts", [])}
    out = []
    for h in after["hosts"]:
        if h["host"] >= hosts:
            continue
        old = was.get(h["host"], {})
        moved = h["bytes"] - old.get("bytes", 0)
        read = h["latency_ns"][fabric]["read"]
        out.append(dict(host=h["host"], reads=h["reads"] - old.get("reads", 0), bytes=moved,
                        read_p50_ns=read.get("p50"), read_p99_ns=read.get("p99"),
                        rate_gbs=moved / span_ns if span_ns > 0 else None))
    return dict(fabric=fabric, model_s=span_ns / 1e9, dropped=after["rings"]["dropped"],
                hosts=sorted(out, key=lambda r: r["host"]))


def ttft(result: dict, requests, model_name: str, block_tokens: int) -> dict:
    """Each finished request's modelled TTFT (ms) from its host's modelled rate; p50/p99 per host."""
    real = block_load_seconds(model_name, block_tokens)["bytes"]
    rate = {h["host"]: h["rate_gbs"] for h in result["timing"]["hosts"]}
    per_request: dict[int, float] = {}
    for i, prefill in prefill_seconds(result, requests, model_name, block_tokens):
        h, hits = result["host_of"][i], result["results"][i]["hits"]
        if hits and not rate.get(h):
            continue                     # no traffic of this host was modelled: no load time to give
        per_request[i] = (hits * real / (rate[h] * 1e9) if hits else 0.0) + prefill
    hosts = [dict(host=h, **percentiles([per_request[i] * 1e3 for i in per_request if result["host_of"][i] == h]))
             for h in sorted(rate)]
    return dict(per_request_ms={i: v * 1e3 for i, v in per_request.items()}, hosts=hosts,
                overall=percentiles([v * 1e3 for v in per_request.values()]))


def percentiles(ms: list[float]) -> dict:
    """p50 and p99 of some requests' TTFTs (None for none)."""
    a = np.array(ms)
    return dict(p50_ms=float(np.percentile(a, 50)) if len(a) else None,
                p99_ms=float(np.percentile(a, 99)) if len(a) else None)
