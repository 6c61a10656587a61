"""Names and ids are checked whole: in a Python pattern `$` also matches just
before a trailing newline, so `re.match(r"^[a-z]+$", "pfnic0\n")` passes. `up --name $'nl\n'`
made a machine, and a topology device id "pfnic0\n" reached QEMU's argv."""

from __future__ import annotations

import ast
import copy
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfcxl.device import topology
from pfcxl.device.topology import rules as topology_rules
from pfcxl.errors import PfcxlError, TopologyError
from pfcxl.host_tools.fleet import detached
from pfcxl.host_tools.cli.main import main

ROOT = Path(detached.__file__).resolve().parents[2]   # host_tools/fleet/detached.py -> the checkout
SOURCES = ("device", "firmware_tables", "guest", "host_tools", "pfcxl", "serving")
# what may trail a name that looks right: the line ends `$` lets through, and other blanks
TAIL_LIST = ["\n", "\r\n", "\r", "\n\n", " ", "\t", "\x00", "\x0b"]
TAILS = st.sampled_from(TAIL_LIST)
RE_CALLS = {"compile", "match", "search", "fullmatch"}

pytestmark = pytest.mark.unit


def test_no_pattern_in_the_code_base_ends_in_a_dollar_anchor():
    # the class, not one value: every pattern literal given to re, in every module
    anchored = []
    paths = sorted(p for d in SOURCES for p in (ROOT / d).rglob("*.py"))
    assert len(paths) > 100, f"found {len(paths)} modules under {ROOT}: not the checkout"   # never vacuous
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RE_CALLS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, (str, bytes))):
                pattern = node.args[0].value
                pattern = pattern.decode("latin-1") if isinstance(pattern, bytes) else pattern
                if pattern.endswith("$") and not pattern.endswith("\\$"):
                    anchored.append(f"{path.relative_to(ROOT)}:{node.lineno}: {pattern}")
    assert not anchored, "use fullmatch without ^...$:\n" + "\n".join(anchored)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PFCXL_CACHE", str(tmp_path / "cache"))


@settings(max_examples=50, deadline=None)
@given(st.from_regex(detached.NAME_RE, fullmatch=True))
def test_machine_names_with_anything_trailing_are_refused(name):
    # every tail after each name (generating a name is what costs, not checking it)
    assert detached.machine_dir(name).name == name
    for tail in TAIL_LIST:
        with pytest.raises(PfcxlError, match="must be 1-64 letters"):
            detached.machine_dir(name + tail)


def test_up_refuses_a_name_ending_in_a_newline_in_one_line_before_starting_anything(capsys):
    assert main(["up", "--name", "nl\n"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["pfcxl: error: machine name 'nl\\n' must be 1-64 letters, digits, '.', '_' "
                                        "or '-', starting with a letter or digit"]
    assert not detached.machines_dir().exists()


PF_NIC = tomllib.loads(topology.resolve("pf-nic").read_text())


def _with_device_id(ident: str) -> dict:
    doc = copy.deepcopy(PF_NIC)
    doc["device"][0]["id"] = ident
    doc["region"][0]["devices"] = [ident]
    return doc


@settings(max_examples=60, deadline=None)
@given(st.from_regex(r"[A-Za-z][A-Za-z0-9._-]{0,20}", fullmatch=True)
       .filter(lambda s: not s.startswith(topology_rules.BACKEND_PREFIX)), TAILS)
def test_topology_ids_with_anything_trailing_are_refused(ident, tail):
    assert topology.from_dict(_with_device_id(ident)).devices[0].id == ident
    with pytest.raises(TopologyError, match="QEMU's id rule"):
        topology.from_dict(_with_device_id(ident + tail))
