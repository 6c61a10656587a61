"""`pfcxl model replay` / `model curve` on hostile .npy files and factors: one line each (exit 9),
in bounded time and memory; a header is checked before anything is allocated from it."""

from __future__ import annotations

import argparse
import random

import numpy as np
import pytest

from pfcxl.device.topology import address_map
from pfcxl.device.fabric import replay as fr
from pfcxl.device.fabric.engine import trace_dtype
from pfcxl.device.fabric import systems as fabric_systems
from pfcxl.host_tools.timing import model_runs
from pfcxl.host_tools import argtypes
from pfcxl.errors import TimingError

from . import bounded_cli
from .test_replay import BASE, TOPO, captured

DTYPE = trace_dtype()
END = BASE + address_map.dax_placements(TOPO)[0].size      # the pf-appliance topology's 1 GiB DAX region

pytestmark = pytest.mark.component


def npy(path, shape, descr=None, body: bytes | None = None, version=(1, 0)) -> str:
    """A .npy file whose header says `shape` and `descr` (trace records by default), followed by
    `body` (by default as many zero bytes as the header claims, when that is small)."""
    fmt = np.lib.format
    header = {"descr": descr if descr is not None else fmt.dtype_to_descr(DTYPE), "fortran_order": False,
              "shape": tuple(shape)}
    with open(path, "wb") as f:
        (fmt.write_array_header_1_0 if version == (1, 0) else fmt.write_array_header_2_0)(f, header)
        if body is None:
            count = int(np.prod(shape, dtype=object)) if shape else 1
            body = bytes(count * 24) if count < 1 << 20 else b""
        f.write(body)
    return str(path)


def one_record(**fields) -> np.ndarray:
    """A valid captured stream with its first record's `fields` replaced."""
    tr = captured(hosts=1, n=50)
    for name, value in fields.items():
        tr[name][0] = value
    return tr


def test_the_issues_files_are_one_line_each(tmp_path):
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    cases = {
        str(empty): "cannot read a trace",
        npy(tmp_path / "zero-d.npy", ()): "shape (): a trace is a 1-D array",
        npy(tmp_path / "two-d.npy", (3, 2)): "shape (3, 2): a trace is a 1-D array",
        npy(tmp_path / "none.npy", (0,)): "shape (0,): a trace is a 1-D array of at least one record",
        npy(tmp_path / "huge.npy", (10 ** 12,)): "claims 1000000000000 records",
    }
    outcomes = bounded_cli.run([["model", "replay", path, "--load", "1"] for path in cases]
                               + [["model", "curve", str(empty), "--out", str(tmp_path / "c.png")]], limit=1 << 30)
    for (path, words), o in zip(cases.items(), outcomes):
        line = o.one_line_error(9)
        assert path in line and words in line, line
    assert "cannot read a trace" in outcomes[-1].one_line_error(9)


@pytest.mark.parametrize("field, value, words", [
    ("size", 2 ** 32 - 1, "size 4294967295 is not 1 to 64 bytes"),
    ("size", 0, "size 0 is not 1 to 64 bytes"),
    ("size", 65, "size 65 is not 1 to 64 bytes"),
    ("hpa", END, f"hpa {END:#x} is not inside the CXL window"),
    ("hpa", END + (1 << 40), f"hpa {END + (1 << 40):#x} is not inside the CXL window [{BASE:#x}, {END:#x})"),
    ("hpa", BASE + 8, f"hpa {BASE + 8:#x} is not a 64-byte line's address"),
    ("write", 7, "write 7 is not 0 (load) or 1 (store)"),
])
def test_records_a_capture_cannot_hold_are_refused(field, value, words):
    with pytest.raises(TimingError) as info:
        model_runs.checked(one_record(**{field: value}), TOPO, "t.npy")
    assert "t.npy: not a trace captured on topology 'pf-appliance': record 0: " + words in str(info.value)
    model_runs.checked(one_record(), TOPO, "t.npy")                       # the untouched stream passes


def test_the_last_line_of_the_window_is_in_it():
    model_runs.checked(one_record(hpa=END - 64), TOPO, "t.npy")
    with pytest.raises(TimingError, match="below|inside the CXL window"):
        model_runs.checked(one_record(hpa=BASE - 64), TOPO, "t.npy")


def test_dilation_stretches_the_window_or_is_refused():
    tr = captured(hosts=1, n=2000)
    model = fabric_systems.models(TOPO)["pf"]
    windows = [fr.replay(model, tr, base_hpa=BASE, granularity=TOPO.appliance.granularity, dilate=x).window_ps
               for x in (1.0, 1e3, 1e6, 1e9)]
    assert windows == sorted(windows) and windows[-1] > 1e8 * windows[0]
    for kwargs in ({"dilate": 1e300}, {"dilate": 1e12}, {"load": 1e-300}, {"dilate": 1.0, "ns_per_insn": 1e300}):
        with pytest.raises(ValueError, match="past the 2\\^62 ps"):
            fr.respace(tr, **kwargs)


def test_hostile_trace_files_and_factors_are_one_line_in_bounded_time_and_memory(tmp_path):
    # a generated set: headers that lie, bodies that do not fit them, records no capture holds,
    # and factors that overflow the model's clock; all through the CLI in a 1 GiB address space
    rng = random.Random(21)
    good = tmp_path / "good.npy"
    model_runs.save_trace(good, captured(hosts=2, n=500))
    f8 = np.lib.format.dtype_to_descr(np.dtype("<f8"))
    cases = []
    for i in range(40):
        path = tmp_path / f"case{i}.npy"
        kind = rng.choice(["shape", "descr", "body", "bytes", "record", "factor"])
        if kind == "shape":
            name = npy(path, rng.choice([(), (0,), (3, 2), (1, 0), (10 ** 12,), (2 ** 63 - 1,), (2 ** 40, 2 ** 40)]),
                       version=rng.choice([(1, 0), (2, 0)]))
        elif kind == "descr":
            name = npy(path, (4,), descr=rng.choice([f8, "|O", ">u8", [("insn", "<u8")], "|V24"]))
        elif kind == "body":
            n = rng.randint(1, 1000)
            name = npy(path, (n,), body=rng.randbytes(n * 24 + rng.choice([-24, -1, 1, 24, 10 ** 6])))
        elif kind == "bytes":
            blob = good.read_bytes()
            cut = rng.randint(0, 140)
            path.write_bytes(rng.choice([blob[:cut], rng.randbytes(cut), b"\x93NUMPY" + rng.randbytes(cut)]))
            name = str(path)
        elif kind == "record":
            field, value = rng.choice([("size", 2 ** 32 - 1), ("size", 0), ("size", rng.randint(65, 2 ** 32 - 1)),
                                       ("hpa", END + 64 * rng.randint(0, 2 ** 40)), ("hpa", 2 ** 64 - 64),
                                       ("write", rng.randint(2, 255))])
            tr = captured(hosts=1, n=200)
            tr[field][rng.randrange(len(tr))] = value
            model_runs.save_trace(path, tr)
            name = str(path)
        else:
            name = str(good)
        how = (rng.choice([["--dilate", "1e300"], ["--dilate", "1e15"], ["--load", "1e-300"],
                           ["--dilate", "1", "--ns-per-insn", "1e300"]]) if kind == "factor" else ["--load", "1"])
        cases.append(["model", "replay", name, "-t", "pf-appliance", *how])
    cases.append(["model", "curve", str(good), "-t", "pf-appliance", "--loads", "1e-300,1",
                  "--out", str(tmp_path / "curve.png")])
    for o in bounded_cli.run(cases, limit=1 << 30, timeout=60):
        line = o.one_line_error(9)
        assert "cannot replay" in line or o.argv[2] in line, line


def test_the_curve_takes_a_bounded_number_of_loads():
    assert len(argtypes.loads_list(",".join(["0.5"] * argtypes.MAX_LOADS))) == argtypes.MAX_LOADS
    with pytest.raises(argparse.ArgumentTypeError, match="at most 100 loads"):
        argtypes.loads_list(",".join(["0.5"] * 10 ** 6))
