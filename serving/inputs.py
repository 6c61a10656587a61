"""The serving model's inputs, read from TOML: models, GPUs, KV tiers and workloads.

Shipped files live in serving/data/<kind>/<name>.toml; any argument that is a path (or ends in
.toml) is read from there instead. Every mistake raises ServingError with one line naming the
file, the field, the bad value and the rule.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from pfcxl.device import fabric_constants as fc
from pfcxl.errors import ServingError

from .chunks import KV_CHUNK_TOKENS

DATA = Path(__file__).parent / "data"
KINDS = ("models", "gpus", "tiers", "workloads")
TIER_KINDS = ("appliance", "host-dram")

# field -> (type, rule text, check); None check = any value of the type
_POSITIVE = ("must be a positive number", lambda v: v > 0)
_POS_INT = ("must be a positive integer", lambda v: v > 0)
_FRACTION = ("must be above 0 and at most 1", lambda v: 0 < v <= 1)


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


_MODEL = {"layers": (int, *_POS_INT), "attention_heads": (int, *_POS_INT), "kv_heads": (int, *_POS_INT),
          "head_dim": (int, *_POS_INT), "dtype_bytes": (int, "must be 1, 2 or 4", lambda v: v in (1, 2, 4)),
          "params_billion": (float, *_POSITIVE)}
_GPU = {"hbm_gb": (float, *_POSITIVE), "hbm_bandwidth_gbs": (float, *_POSITIVE),
        "bf16_dense_tflops": (float, *_POSITIVE), "host_link_gbs": (float, *_POSITIVE)}
_TIER = {"kind": (str, f"must be one of {', '.join(TIER_KINDS)}", lambda v: v in TIER_KINDS),
         "capacity_tb": (float, *_POSITIVE)}
_TIER_OPTIONAL = {"modules": (int, *_POS_INT),
                  "granularity_kib": (int, "must be a power of two KiB", lambda v: v > 0 and v & (v - 1) == 0),
                  "bandwidth_scale": (float, *_POSITIVE), "dram_bandwidth_gbs": (float, *_POSITIVE)}
_WORKLOAD = {"turns": (int, *_POS_INT), "input_tokens": (int, *_POS_INT),
             "output_tokens": (int, "must be a whole number, 0 or more", lambda v: v >= 0),
             "system_prefix_tokens": (int, "must be a whole number, 0 or more", lambda v: v >= 0),
             "qps": (float, *_POSITIVE), "rounds": (int, "must be at least 2 (the first is warm-up)", lambda v: v >= 2),
             "gaps": (str, "must be fixed or exponential", lambda v: v in ("fixed", "exponential"))}
_DEPLOYMENT = {"model": (str, "must be a name or path", None), "gpu": (str, "must be a name or path", None),
               "gpus": (int, *_POS_INT), "gpu_memory_utilization": (float, *_FRACTION),
               "appliance": (str, "must be a name or path", None), "host": (str, "must be a name or path", None)}


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
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ServingError(f"{path}: no such file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ServingError(f"{path.name}: not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ServingError(f"{path}: cannot read: {exc}") from exc


def _fields(doc: dict, source: str, where: str, required: dict, optional: dict | None = None,
            extra: tuple[str, ...] = ()) -> dict:
    """Check `doc` against the field specs; return the typed values present."""
    optional = optional or {}
    prefix = f"{where}." if where else ""
    for key in doc:
        if key not in required and key not in optional and key not in extra:
            known = ", ".join([*required, *optional, *extra])
            raise ServingError(f"{source}: {prefix}{key}: unknown field (known: {known})")
    values = {}
    for key, (kind, rule, check) in {**required, **optional}.items():
        if key not in doc:
            if key in required:
                raise ServingError(f"{source}: {prefix}{key}: missing ({rule})")
            continue
        value = doc[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool) or (check and not check(value)):
            raise ServingError(f"{source}: {prefix}{key}: {value!r} {rule}")
        values[key] = value
    return values


def _name(doc: dict, source: str, default: str) -> str:
    name = doc.get("name", default)
    if not isinstance(name, str) or not name:
        raise ServingError(f"{source}: name: {name!r} must be a non-empty string")
    return name


def load_model(name_or_path: str | Path) -> Model:
    path = resolve("models", name_or_path)
    doc = read_toml(path)
    return Model(_name(doc, path.name, path.stem), **_fields(doc, path.name, "", _MODEL, extra=("name",)))


def load_gpu(name_or_path: str | Path) -> Gpu:
    path = resolve("gpus", name_or_path)
    doc = read_toml(path)
    return Gpu(_name(doc, path.name, path.stem), **_fields(doc, path.name, "", _GPU, extra=("name",)))


def load_tier(name_or_path: str | Path) -> Tier:
    path = resolve("tiers", name_or_path)
    doc = read_toml(path)
    values = _fields(doc, path.name, "", _TIER, _TIER_OPTIONAL, extra=("name",))
    return Tier(_name(doc, path.name, path.stem), **values)


def load_workload(name_or_path: str | Path) -> Workload:
    path = resolve("workloads", name_or_path)
    doc = read_toml(path)
    source = path.name
    top = _fields(doc, source, "", _WORKLOAD, extra=("name", "deployment", "paper"))
    deployment = doc.get("deployment")
    if not isinstance(deployment, dict):
        raise ServingError(f"{source}: deployment: missing table ([deployment] with model, gpu, gpus, ...)")
    dep = _fields(deployment, source, "deployment", _DEPLOYMENT)
    return Workload(_name(doc, source, path.stem), **top, **dep, paper=_paper(doc.get("paper", {}), source))


def _paper(doc, source: str) -> dict:
    """[paper.<metric>.<tier>] tables of sessions = value."""
    if not isinstance(doc, dict):
        raise ServingError(f"{source}: paper: must be a table")
    out = {}
    for metric, tiers in doc.items():
        if metric not in ("ttft_ms", "hit_rate") or not isinstance(tiers, dict):
            raise ServingError(f"{source}: paper.{metric}: unknown table (known: ttft_ms, hit_rate)")
        for tier, points in tiers.items():
            if tier not in ("appliance", "host") or not isinstance(points, dict):
                raise ServingError(f"{source}: paper.{metric}.{tier}: unknown tier (known: appliance, host)")
            for sessions, value in points.items():
                if not sessions.isdigit() or not isinstance(value, (int, float)) or value <= 0:
                    raise ServingError(f"{source}: paper.{metric}.{tier}.{sessions}: {value!r} must be "
                                       "sessions = a positive number")
                out.setdefault(metric, {}).setdefault(tier, {})[int(sessions)] = float(value)
    return out
