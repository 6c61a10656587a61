"""Reading a `pfcxl bench` results.json and checking the parts a comparison reads: anything else
(another tool's results, bytes that are not UTF-8 JSON, a mutated field) is one line naming the
file and what is wrong, never a traceback from deep inside the report."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pfcxl.errors import PfcxlError
from pfcxl.text_files import read_text


def load(path: str | Path) -> dict:
    """The results document at `path` (a results.json or its folder), as written; one line if it
    cannot be read as JSON."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    text = read_text(path, PfcxlError)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PfcxlError(f"{path} is not a results file: {exc}") from exc
    except RecursionError as exc:
        raise PfcxlError(f"{path} is not a results file: arrays or objects nested too deeply") from exc


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Checker:
    """Walks a document; every mistake is a PfcxlError naming the file and the field's path."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, rule: str):
        raise PfcxlError(f"{self.source}: not a pfcxl bench results file: {where} {rule}")

    def table(self, doc, where: str, optional: bool = False) -> dict:
        if optional and doc is None:
            return {}
        if not isinstance(doc, dict):
            self.fail(where, "must be an object" + (" or null" if optional else ""))
        return doc

    def items(self, doc, where: str) -> list[dict]:
        if not isinstance(doc, list):
            self.fail(where, "must be a list")
        return [self.table(x, f"{where}[{i}]") for i, x in enumerate(doc)]

    def fields(self, doc: dict, where: str, numbers=(), texts=(), optional=False) -> None:
        for key in numbers:
            if optional and doc.get(key) is None:
                continue
            if not _is_number(doc.get(key)):
                self.fail(f"{where}.{key}", f"must be a finite number, not {_shown(doc.get(key))}")
        for key in texts:
            if not isinstance(doc.get(key), str):
                self.fail(f"{where}.{key}", f"must be text, not {_shown(doc.get(key))}")


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check(doc, source: str, *, systems=(), traced=()) -> dict:
    """`doc` if it holds what a comparison reads: environment, and per run its name, measured data
    and modelled figures (`systems`: the keys of a modelled row; `traced`: the keys of a traced
    run's model). Raises PfcxlError naming the first wrong field."""
    c = _Checker(source)
    if isinstance(doc, dict) and {"calibration", "comparison", "runs"} <= doc.keys():
        raise PfcxlError(f"{source} is a `pfcxl serving` result (TTFT and hit rate per KV tier), not a "
                         "`pfcxl bench` result: bench compare compares two bench results")
    c.table(doc, "the document")
    c.table(doc.get("environment"), "environment")
    names = set()
    for i, run in enumerate(c.items(doc.get("results"), "results")):
        where = f"results[{i}]"
        c.fields(run, where, texts=("name",))
        if run["name"] in names:
            c.fail(f"{where}.name", f"'{run['name']}' is listed twice")
        names.add(run["name"])
        data = c.table(run.get("data"), f"{where}.data", optional=True)
        for op, per in (("read", "ns_per_load"), ("write", "ns_per_store")):
            if data.get(op) is not None:
                c.fields(c.table(data[op], f"{where}.data.{op}"), f"{where}.data.{op}", numbers=(per,))
        for j, r in enumerate(c.items(data.get("results", []), f"{where}.data.results")):
            c.fields(r, f"{where}.data.results[{j}]", numbers=("size", "threads", "MBps"), texts=("pattern", "op"))
        for j, r in enumerate(c.items(data.get("rows", []), f"{where}.data.rows")):
            c.fields(r, f"{where}.data.rows[{j}]", numbers=("delay", "latency_ns"))
        modelled = c.table(run.get("modelled"), f"{where}.modelled", optional=True)
        rows = c.items(modelled.get("rows", []), f"{where}.modelled.rows")
        measured = len(data.get("results") or data.get("rows") or ())
        if len(rows) > measured:
            c.fail(f"{where}.modelled.rows", f"has {len(rows)} rows for {measured} measured rows")
        for j, row in enumerate(rows):
            for system in systems:
                at = f"{where}.modelled.rows[{j}].{system}"
                c.fields(c.table(row.get(system), at, optional=True), at, numbers=("gbs", "latency_p50_ns"),
                         optional=True)
        for key in traced:
            for op in ("read", "write"):
                at = f"{where}.modelled.{key}.{op}"
                p = c.table(c.table(modelled.get(key), f"{where}.modelled.{key}", optional=True).get(op), at,
                            optional=True)
                if p.get("count"):
                    c.fields(p, at, numbers=("count", "p50"))
    return doc
