"""A topology's `profile` (the fabric_constants latencies and bandwidths its CDAT and HMAT carry),
once called `timing`: every topology written with the old key still reads to the same Topology,
with one notice per file; both keys at once, or an unknown profile, is one clear mistake."""

from __future__ import annotations

import logging
import re
import tomllib

import pytest

from pfcxl.device import topology
from pfcxl.errors import TopologyError

pytestmark = pytest.mark.unit

SHIPPED = topology.shipped_topologies()


def old_spelling(text: str) -> str:
    return re.sub(r"^profile = ", "timing = ", text, flags=re.M)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_old_key_reads_the_same_with_one_notice(path, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(topology, "_noticed", set())     # once per file per process: start afresh
    doc = tomllib.loads(path.read_text())
    old = tmp_path / path.name
    old.write_text(old_spelling(path.read_text()))
    assert ("timing" in tomllib.loads(old.read_text())) == ("profile" in doc)
    with caplog.at_level(logging.WARNING, logger="pfcxl.topology"):
        first = topology.load(old)
        again = topology.load(old)
    assert first == again and first.profile == doc.get("profile")
    assert first == topology.load(path)                 # the same name, so the same source
    notices = [r.getMessage() for r in caplog.records if r.name == "pfcxl.topology"]
    if "profile" in doc:
        assert notices == [f"pfcxl: notice: {old.name}: the topology key 'timing' is now 'profile' (the old name "
                           "still works)"]
    else:
        assert notices == []


def test_both_keys_are_one_mistake():
    doc = tomllib.loads(SHIPPED[0].read_text())
    with pytest.raises(TopologyError, match=r"timing: 'timing' is the old name of 'profile': give 'profile' only"):
        topology.from_dict({**doc, "profile": "pf", "timing": "pf"}, source="both.toml")


@pytest.mark.parametrize("key", ["profile", "timing"])
def test_an_unknown_profile_names_the_known_ones(key):
    doc = {k: v for k, v in tomllib.loads(topology.resolve("pf-nic").read_text()).items() if k != "profile"}
    with pytest.raises(TopologyError, match=r"profile: 'optical' is not a fabric profile \(known: pf, electrical\)"):
        topology.from_dict({**doc, key: "optical"}, source=f"{key}.toml")
