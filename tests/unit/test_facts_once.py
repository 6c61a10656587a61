"""Every fact is written once: CXL and ACPI specification facts in
device/facts/cxl_spec.py, what QEMU does in device/facts/qemu.py (the address placement
computed from it in device/topology/address_map.py), fabric figures in device/fabric/constants.py, guest
C constants in guest/include, one interleave decoder. A literal that restates one of them
anywhere else in the code fails here, so two copies cannot drift apart."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import pfcxl

REPO = Path(pfcxl.__file__).resolve().parent.parent
CODE_DIRS = ("device", "firmware_tables", "guest", "host_tools", "pfcxl", "serving")
CODE_SUFFIXES = {".py", ".c", ".h", ".j2"}

# (what, pattern over code with comments removed, the files allowed to hold it)
FACTS = [
    ("the 256 MiB CFMWS/HDM granule", r"256 << 20|0x1000_?0000\b|268435456|(ALIGN|GRANULE)\w* = 256 \* MiB",
     {"device/facts/cxl_spec.py"}),
    ("the interleave ways", r"\(1, 2, 3, 4, 6, 8, 12, 16\)|\{1: 0, 2: 1, 4: 2", {"device/facts/cxl_spec.py"}),
    ("the CFMWS restriction bits", r"0x000[fF]\b|0x3[fF]\b.*RESTRICT|\"back-invalidate\"",
     {"device/facts/qemu.py", "device/facts/cxl_spec.py"}),
    ("the CHBS register block length", r"0x10000\b|0x1_0000\b|0x2000\b", {"device/facts/cxl_spec.py"}),
    ("the 64 GB/s PCIe 5.0 x16 link", r"\b64_?000\b", set()),
    ("QEMU's default CDAT", r"150, 250|16_?000, 16_?000|16 \* 1024, 16 \* 1024", {"device/facts/qemu.py"}),
    ("QEMU's CXL link (68-byte flits)", r"\b68\b.*FLIT|FLIT_BYTES = ", {"device/facts/qemu.py"}),
    ("QEMU's 'no serial' value", r"SERIAL\w* = \(1 << 64\) - 1|0xFFFF_?FFFF_?FFFF_?FFFF\b", {"device/facts/qemu.py"}),
    ("the appliance's socket, pid and lock names", r"\"appliance\.(sock|pid|lock|log)\"",
     {"device/appliance/rundir.py"}),
    ("the trace ring's header layout", r"<QIIQQQQ|HEAD_OFFSET = ", {"device/trace/records.py"}),
    ("the 2 MiB device-DAX mapping alignment", r"2 << 20|2 \* MiB|2ULL << 20",
     # the guest's C, the host's side, and the KV store's guest Python (which cannot import the host's
     # module; test_kvstore.py checks that its HOME equals data_path.DIRECT_OFFSET)
     {"guest/include/pfcxl_mark.h", "device/topology/data_path.py", "guest/python/pfcxl_kvlayout.py"}),
    ("Linux's region and DAX names", r"f\"region\{|f\"dax\{|\"region%|\"dax%d\.0",
     {"device/topology/model.py"}),
    ("the interleave decoder", r"//\s*\w*granularity\w*\)\s*%|%\s*(ways|modules)\b|granule\s*%\s*\w+",
     {"device/topology/address_map.py"}),
    ("compiling with gcc", r"\[\s*\"gcc\"", {"pfcxl/compile.py"}),
    ("the idle-latency formula", r"def idle_\w*ns\b", {"device/fabric/model.py"}),
]

pytestmark = pytest.mark.unit


def docstring_lines(path: Path) -> set[int]:
    """The lines of a Python file's docstrings: prose, like comments."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


@functools.cache
def code_lines(path: Path) -> tuple[tuple[int, str], ...]:
    """(line number, code) with comments dropped: a fact may be named in prose, not restated."""
    return tuple(_code_lines(path))


def _code_lines(path: Path):
    comment = "//" if path.suffix in (".c", ".h") else "#"
    in_block = False
    prose = docstring_lines(path) if path.suffix == ".py" else set()
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if n in prose:
            continue
        if path.suffix in (".c", ".h"):
            if in_block:
                if "*/" not in line:
                    continue
                line, in_block = line.split("*/", 1)[1], False
            if "/*" in line:
                head, _, tail = line.partition("/*")
                in_block = "*/" not in tail
                line = head + (tail.split("*/", 1)[1] if not in_block else "")
        code = line.split(comment, 1)[0] if comment in line and not line.lstrip().startswith(("\"", "'")) else line
        yield n, code


def source_files() -> list[Path]:
    files = [REPO / "guest" / "init" / "init"]
    for folder in CODE_DIRS:
        files += [p for p in (REPO / folder).rglob("*") if p.suffix in CODE_SUFFIXES and p.is_file()]
    return sorted(files)


@pytest.mark.parametrize("what,pattern,owners", FACTS, ids=[f[0] for f in FACTS])
def test_each_fact_is_written_in_one_place(what, pattern, owners):
    regex = re.compile(pattern)
    found = []
    for path in source_files():
        rel = path.relative_to(REPO).as_posix()
        if rel in owners:
            continue
        found += [f"{rel}:{n}: {code.strip()}" for n, code in code_lines(path) if regex.search(code)]
    assert not found, f"{what} is restated outside {sorted(owners) or 'its derivation'}:\n" + "\n".join(found)


def test_the_owners_do_hold_each_fact():
    """The lint looks for the right spelling: every owner file really has its fact."""
    for what, pattern, owners in FACTS:
        for rel in owners:
            text = "\n".join(code for _, code in code_lines(REPO / rel))
            assert re.search(pattern, text), f"{rel} is the home of {what} but the pattern misses it"
