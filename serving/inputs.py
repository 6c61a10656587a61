"""The serving model's inputs, read from TOML: models, GPUs, KV tiers and workloads.

Shipped files live in serving/data/<kind>/<name>.toml; any argument that is a path (or ends in
.toml) is read from there instead. Every mistake raises ServingError with one line naming the
file, the field, the bad value and the rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pfcxl import text_files
from pfcxl.device.fabric import constants as fc
from pfcxl.device.topology.appliance_section import MAX_MODULES
from pfcxl.errors import ServingError

from pfcxl.serving.chunks import KV_CHUNK_TOKENS

DATA = Path(__file__).parent / "data"
KINDS = ("models", "gpus", "tiers", "workloads")
TIER_KINDS = ("appliance", "host-dram")

# field -> (type, rule text, check); None check = any value of the type. Every number is bounded,
# far beyond any real model, GPU or tier, so that every product the simulator forms stays finite and
# every loop it runs stays short; the rule text says the bound and why.
_FRACTION = ("must be above 0 and at most 1", lambda v: 0 < v <= 1)
MAX_TOKENS = 1 << 20            # a prompt's tokens: a 1 M-token context, the longest models serve


def within(lo: float, hi: float, why: str, *, low_inclusive: bool = False) -> tuple[str, object]:
    """A number above `lo` (or from it) and at most `hi`, with why that bound."""
    def shown(v: float) -> str:
        return f"{v:,.0f}" if v >= 1 and v == int(v) else f"{v:g}"
    span = f"from {shown(lo)} to {shown(hi)}" if low_inclusive else f"above {shown(lo)} and at most {shown(hi)}"
    return f"must be {span} ({why})", lambda v: (lo <= v if low_inclusive else lo < v) and v <= hi


def _count(lo: int, hi: int, why: str) -> tuple[str, object]:
    return f"must be a whole number from {lo:,} to {hi:,} ({why})", lambda v: lo <= v <= hi
@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    params_billion: float

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer: layers x 2 x kv_heads x head_dim x dtype bytes."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params_billion * 1e9 * self.dtype_bytes


@dataclass(frozen=True)
class Gpu:
    name: str
    hbm_gb: float
    hbm_bandwidth_gbs: float
    bf16_dense_tflops: float
    host_link_gbs: float         # PCIe, per direction


@dataclass(frozen=True)
class Tier:
    name: str
    kind: str                    # "appliance" or "host-dram"
    capacity_tb: float
    modules: int = 16            # appliance: the chunk layout
    granularity_kib: int = 4
    bandwidth_scale: float = 1.0
    dram_bandwidth_gbs: float = fc.LOCAL_DDR5_BANDWIDTH_MBS / 1000   # host-dram

    @property
    def capacity_bytes(self) -> float:
        return self.capacity_tb * 1e12


@dataclass(frozen=True)
class Workload:
    name: str
    turns: int
    input_tokens: int
    output_tokens: int
    system_prefix_tokens: int
    qps: float
    rounds: int
    gaps: str                    # "fixed" (LMCache's benchmark) or "exponential"
    model: str
    gpu: str
    gpus: int
    gpu_memory_utilization: float
    appliance: str
    host: str
    paper: dict                  # "ttft_ms"/"hit_rate" -> tier -> {sessions: value}

    @property
    def chunk_tokens(self) -> int:
        return KV_CHUNK_TOKENS


_BEYOND = "a bound far beyond any published model"
MODEL_FIELDS = {"layers": (int, *_count(1, 1024, _BEYOND)), "attention_heads": (int, *_count(1, 1024, _BEYOND)),
                "kv_heads": (int, *_count(1, 1024, _BEYOND)), "head_dim": (int, *_count(1, 4096, _BEYOND)),
                "dtype_bytes": (int, "must be 1, 2 or 4", lambda v: v in (1, 2, 4)),
                "params_billion": (float, *within(0, 100_000, "100 T parameters, " + _BEYOND))}
GPU_FIELDS = {"hbm_gb": (float, *within(0, 100_000, "100 TB of HBM per GPU")),
              "hbm_bandwidth_gbs": (float, *within(0, 1e6, "1 PB/s per GPU")),
              "bf16_dense_tflops": (float, *within(0, 1e6, "1 EFLOP/s per GPU")),
              "host_link_gbs": (float, *within(0, 100_000, "100 TB/s per GPU"))}
TIER_FIELDS = {"kind": (str, f"must be one of {', '.join(TIER_KINDS)}", lambda v: v in TIER_KINDS),
               "capacity_tb": (float, *within(1e-3, 1e6, "1 GB to 1 EB", low_inclusive=True))}
TIER_OPTIONAL_FIELDS = {
    "modules": (int, *_count(1, MAX_MODULES, "the appliance topology's limit")),
    "granularity_kib": (int, "must be a power of two KiB, at most 1 GiB (1048576), as the appliance interleaves",
                        lambda v: 0 < v <= 1 << 20 and v & (v - 1) == 0),
    "bandwidth_scale": (float, *within(1e-3, 1e3, "a what-if from 1/1000 to 1000 x the paper's fabric",
                                       low_inclusive=True)),
    "dram_bandwidth_gbs": (float, *within(0, 100_000, "100 TB/s"))}
_TOKENS = _count(0, MAX_TOKENS, "a 1 M-token context")
WORKLOAD_FIELDS = {"turns": (int, *_count(1, 1000, "a conversation's turns")),
                   "input_tokens": (int, *_count(1, MAX_TOKENS, "a 1 M-token context")),
                   "output_tokens": (int, *_TOKENS), "system_prefix_tokens": (int, *_TOKENS),
                   "qps": (float, *within(0, 1e6, "requests per second over all sessions")),
                   "rounds": (int, "must be a whole number from 2 (the first is warm-up) to 1,000",
                              lambda v: 2 <= v <= 1000),
                   "gaps": (str, "must be fixed or exponential", lambda v: v in ("fixed", "exponential"))}
DEPLOYMENT_FIELDS = {"model": (str, "must be a name or path", None), "gpu": (str, "must be a name or path", None),
                     "gpus": (int, *_count(1, 100_000, "GPUs serving one model")),
                     "gpu_memory_utilization": (float, *_FRACTION),
                     "appliance": (str, "must be a name or path", None),
                     "host": (str, "must be a name or path", None)}


def check_option(flag: str, spec: tuple, value) -> None:
    """A command-line override checked by its field's rule (`spec` from the tables above)."""
    if value is not None:
        _value(flag, spec, value)


def _value(name: str, spec: tuple, value):
    """`value` as the field's type if it keeps the field's rule, else ServingError naming `name`."""
    kind, rule, check = spec
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool) or (check and not check(value)):
        raise ServingError(f"{name}: {value!r} {rule}")
    return value


def resolve(kind: str, name_or_path: str | Path) -> Path:
    """A shipped input's name (e.g. 'llama-70b') or a path to a TOML file."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.exists():
        return candidate
    shipped = DATA / kind / f"{name_or_path}.toml"
    if shipped.exists():
        return shipped
    names = ", ".join(shipped_names(kind))
    raise ServingError(f"no {kind[:-1]} named '{name_or_path}' (shipped: {names}; or give a path to a .toml file)")


def shipped_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (DATA / kind).glob("*.toml"))


def read_toml(path: Path) -> dict:
    """A TOML file's tables; ServingError naming the file if it is missing or malformed."""
    return text_files.read_toml(path, ServingError)


def _fields(doc: dict, source: str, where: str, required: dict, optional: dict | None = None,
            extra: tuple[str, ...] = ()) -> dict:
    """Check `doc` against the field specs; return the typed values present."""
    optional = optional or {}
    prefix = f"{where}." if where else ""
    for key in doc:
        if key not in required and key not in optional and key not in extra:
            known = ", ".join([*required, *optional, *extra])
            raise ServingError(f"{source}: {prefix}{_key(key)}: unknown field (known: {known})")
    values = {}
    for key, spec in {**required, **optional}.items():
        if key not in doc:
            if key in required:
                raise ServingError(f"{source}: {prefix}{key}: missing ({spec[1]})")
            continue
        values[key] = _value(f"{source}: {prefix}{key}", spec, doc[key])
    return values


def _key(key: str) -> str:
    """A TOML key as an error line shows it: quoted if it is not a plain word (a newline in a
    quoted key must not break the line)."""
    return key if re.fullmatch(r"[\w-]+", key) else repr(key)


def _name(doc: dict, source: str, default: str) -> str:
    name = doc.get("name", default)
    if not isinstance(name, str) or not name or not name.isprintable():
        raise ServingError(f"{source}: name: {name!r} must be a non-empty string of printable characters")
    return name


def load_model(name_or_path: str | Path) -> Model:
    path = resolve("models", name_or_path)
    doc = read_toml(path)
    return Model(_name(doc, path.name, path.stem), **_fields(doc, path.name, "", MODEL_FIELDS, extra=("name",)))


def load_gpu(name_or_path: str | Path) -> Gpu:
    path = resolve("gpus", name_or_path)
    doc = read_toml(path)
    return Gpu(_name(doc, path.name, path.stem), **_fields(doc, path.name, "", GPU_FIELDS, extra=("name",)))


def load_tier(name_or_path: str | Path) -> Tier:
    path = resolve("tiers", name_or_path)
    doc = read_toml(path)
    values = _fields(doc, path.name, "", TIER_FIELDS, TIER_OPTIONAL_FIELDS, extra=("name",))
    return Tier(_name(doc, path.name, path.stem), **values)


def load_workload(name_or_path: str | Path) -> Workload:
    path = resolve("workloads", name_or_path)
    doc = read_toml(path)
    source = path.name
    top = _fields(doc, source, "", WORKLOAD_FIELDS, extra=("name", "deployment", "paper"))
    deployment = doc.get("deployment")
    if not isinstance(deployment, dict):
        raise ServingError(f"{source}: deployment: missing table ([deployment] with model, gpu, gpus, ...)")
    dep = _fields(deployment, source, "deployment", DEPLOYMENT_FIELDS)
    return Workload(_name(doc, source, path.stem), **top, **dep, paper=_paper(doc.get("paper", {}), source))


def _paper(doc, source: str) -> dict:
    """[paper.<metric>.<tier>] tables of sessions = value."""
    if not isinstance(doc, dict):
        raise ServingError(f"{source}: paper: must be a table")
    out: dict[str, dict] = {}
    for metric, tiers in doc.items():
        if metric not in ("ttft_ms", "hit_rate") or not isinstance(tiers, dict):
            raise ServingError(f"{source}: paper.{_key(metric)}: unknown table (known: ttft_ms, hit_rate)")
        for tier, points in tiers.items():
            if tier not in ("appliance", "host") or not isinstance(points, dict):
                raise ServingError(f"{source}: paper.{metric}.{_key(tier)}: unknown tier (known: appliance, host)")
            for sessions, value in points.items():
                if (not sessions.isdigit() or isinstance(value, bool) or not isinstance(value, (int, float))
                        or not 0 < value < float("inf")):
                    raise ServingError(f"{source}: paper.{metric}.{tier}.{_key(sessions)}: {value!r} must be "
                                       "sessions = a positive number")
                out.setdefault(metric, {}).setdefault(tier, {})[int(sessions)] = float(value)
    return out
