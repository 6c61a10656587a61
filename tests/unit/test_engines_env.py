"""The engines environment's pins and checks (host_tools/provision/engines_env.py) and the engine
plugins' version check (pfcxl/engines/common.py): a missing or wrong version is one line."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess

import pytest

from pfcxl.engines import common
from pfcxl.host_tools.provision import engines_env

pytestmark = pytest.mark.unit


def test_an_engine_missing_from_this_interpreter_is_one_line():
    # the main venv holds no engine: exactly what a user who runs the wrong python sees
    with pytest.raises(common.EngineVersionError, match=r"^pfcxl.engines needs lmcache 0\.5\.6, and lmcache is not "
                                                        r"installed here \(use <repo>/.venv-engines/bin/python: make "
                                                        r"engines\)$"):
        common.require("lmcache")


def test_an_engine_of_another_version_is_one_line(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: {"vllm": "0.35.1", "torch": "2.13.0+cpu"}[dist])
    with pytest.raises(common.EngineVersionError, match=r"^pfcxl.engines is tested with vllm 0\.34\.0; this "
                                                        r"interpreter has vllm 0\.35\.1 \("):
        common.require("vllm")
    common.require("torch")                      # a local build label is the same version


class FakeSetup:
    def __init__(self, versions: dict) -> None:
        self.versions = versions

    def run(self, cmd, **kw):
        return subprocess.CompletedProcess(cmd, 0, json.dumps({n: self.versions.get(n) for n in cmd[4:]}), "")


def test_the_check_names_every_missing_or_wrong_pin():
    have = dict(engines_env.PINS)
    have.update(torch="2.13.0+cpu", lmcache="0.5.5")
    del have["xgrammar"]
    assert engines_env.wrong_versions(FakeSetup(have)) == ["lmcache is 0.5.5, not 0.5.6", "xgrammar 0.2.9 missing"]
    assert engines_env.wrong_versions(FakeSetup(dict(engines_env.PINS))) == []


def test_a_block_of_another_key_is_a_miss_never_its_bytes():
    # a digest collision, or a block reused for another key: the name inside it decides
    block = common.named("vllm/00ff", b"KV bytes")
    assert bytes(common.payload_of("vllm/00ff", block)) == b"KV bytes"
    assert common.payload_of("vllm/00fe", block) is None
    assert common.payload_of("vllm/00ff", block[:6]) is None and common.payload_of("vllm/00ff", None) is None
