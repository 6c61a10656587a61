"""Typed reading of TOML tables: every mistake becomes one line naming its field, raised together.

Generic: knows nothing of topologies beyond the error type, so `topology` and its rules share it.
"""

from __future__ import annotations

from typing import Any, Callable

from pfcxl.errors import TopologyError

from pfcxl.device.topology.units import parse_size

REQUIRED = object()   # a field default meaning "the key must be present"


class Problems:
    """Collects one line per mistake; raised together at the end of loading."""

    def __init__(self, source: str):
        self.source = source
        self.lines: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.lines.append(f"{self.source}: {where}: {message}")

    def raise_if_any(self) -> None:
        if self.lines:
            raise TopologyError("\n".join(self.lines))


def _type_name(kind: Any) -> str:
    return {int: "an integer", str: "a string", list: "a list", dict: "a table", "size": "a size"}[kind]


class Table:
    """Reads one TOML table against a declared set of keys, recording mistakes."""

    def __init__(self, problems: Problems, where: str, data: Any, fields: dict[str, tuple[Any, Any]]):
        # fields: key -> (kind, default); default REQUIRED means the key must be present
        self.problems, self.where, self.ok = problems, where, True
        self.values: dict[str, Any] = {}
        if not isinstance(data, dict):
            problems.add(where, f"must be a table, got {type(data).__name__}")
            self.ok = False
            return
        for key in data:
            if key not in fields:
                known = ", ".join(fields)
                problems.add(where, f"unknown key '{key}' (known keys: {known})")
                self.ok = False
        for key, (kind, default) in fields.items():
            if key not in data:
                if default is REQUIRED:
                    problems.add(where, f"missing required key '{key}'")
                    self.ok = False
                self.values[key] = None if default is REQUIRED else default
                continue
            value = self._convert(key, kind, data[key])
            self.values[key] = value
            if value is None:
                self.ok = False

    def _convert(self, key: str, kind: Any, raw: Any) -> Any:
        if kind == "size":
            if isinstance(raw, int) and not isinstance(raw, bool):
                return raw
            if isinstance(raw, str):
                try:
                    return parse_size(raw)
                except ValueError as exc:
                    self.problems.add(f"{self.where}.{key}", str(exc))
                    return None
        elif isinstance(raw, kind) and not isinstance(raw, bool):
            return raw
        self.problems.add(f"{self.where}.{key}",
                          f"must be {_type_name(kind)}, got {type(raw).__name__} {raw!r}")
        return None

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


def entries(problems: Problems, doc: dict, key: str) -> list:
    value = doc.get(key, [])
    if not isinstance(value, list):
        problems.add(key, f"must be an array of tables ([[{key}]]), got {type(value).__name__}")
        return []
    return value


def read_list(problems: Problems, doc: dict, key: str, fields: dict,
              build: Callable[[Table, str], Any]) -> list:
    out = []
    for i, raw in enumerate(entries(problems, doc, key)):
        label = raw.get("id") if isinstance(raw, dict) and isinstance(raw.get("id"), str) else f"#{i}"
        where = f"{key} '{label}'" if not label.startswith("#") else f"{key}[{i}]"
        t = Table(problems, where, raw, fields)
        if t.ok:
            item = build(t, where)
            if item is not None:
                out.append(item)
    return out


def string_list(problems: Problems, where: str, value: Any) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.add(where, f"must be a list of ids (strings), got {value!r}")
        return None
    return tuple(value)
