"""--clock virtual without a guest: the options and their one-line refusals, the plugin's QEMU
arguments, the timed QEMU's lookup, and the model file the plugin reads."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pfcxl.device import topology
from pfcxl.errors import PfcxlError, TimingError, VMError
from pfcxl.host_tools.timing import config as timing
from pfcxl.host_tools.timing import vtime
from pfcxl.host_tools.vm import timed_qemu
from pfcxl.host_tools.vm.boot_options import BootOptions

pytestmark = pytest.mark.unit


@pytest.fixture
def topo():
    return topology.load(topology.resolve("pf-nic"))


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("field, value", [("clock", "wall"), ("fabric", "optical")])
def test_boot_options_name_the_bad_value_and_the_good_ones(field, value):
    with pytest.raises(PfcxlError) as exc:
        BootOptions(**{field: value})
    text = one_line(exc)
    assert value in text and ("virtual" in text or "electrical" in text)


def test_clock_and_fabric_are_in_the_reuse_key(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("x")
    keys = {BootOptions().key(path), BootOptions(clock="virtual").key(path),
            BootOptions(clock="virtual", fabric="electrical").key(path)}
    assert len(keys) == 3


def test_a_topology_with_two_vcpus_is_refused_in_one_line(topo):
    from pfcxl import Machine
    two = dataclasses.replace(topo, guest=dataclasses.replace(topo.guest, cpus=2))
    with pytest.raises(PfcxlError) as exc:
        Machine(two, clock="virtual")
    assert "2 vCPUs" in one_line(exc) and "cpus = 1" in one_line(exc)


def test_inject_and_virtual_exclude_each_other():
    with pytest.raises(TimingError) as exc:
        timing.TimingConfig("inject", clock="virtual")
    assert "inject" in one_line(exc)


def test_the_plugin_arguments_of_a_virtual_clock(topo, tmp_path):
    args = timing.plugin_args(tmp_path / "p.so", topo, tmp_path, timing.TimingConfig("count", clock="virtual"), "g")
    plugin = args[args.index("-plugin") + 1]
    assert "clock=virtual" in plugin and f"vtime={tmp_path / 'g.vtime'}" in plugin
    assert args[-2:] == list(vtime.QEMU_ICOUNT)
    plain = timing.plugin_args(tmp_path / "p.so", topo, tmp_path, timing.TimingConfig("count"), "g")
    assert "-icount" not in plain and "clock=" not in plain[plain.index("-plugin") + 1]


def test_no_timed_qemu_says_how_to_build_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PFCXL_CACHE", str(tmp_path))
    with pytest.raises(VMError) as exc:
        timed_qemu.binary()
    assert "make setup-timed" in one_line(exc)
    (tmp_path / "qemu-timed").mkdir()
    (tmp_path / "qemu-timed" / "built.json").write_text(json.dumps({"binary": str(tmp_path / "gone")}))
    with pytest.raises(VMError):
        timed_qemu.binary()


def test_the_model_file_holds_every_fabric_and_starts_on_the_chosen_one(topo):
    for k, fabric in enumerate(vtime.FABRICS):
        text = vtime.model_text(topo, fabric)
        assert f"start {k}" in text.splitlines()
        assert [line.split()[1] for line in text.splitlines() if line.startswith("system ")] == list(vtime.FABRICS)
    with pytest.raises(TimingError):
        vtime.model_text(topo, "copper")


def test_a_cache_whose_sets_are_not_a_power_of_two_is_refused():
    with pytest.raises(TimingError) as exc:
        vtime.Hierarchy(l2_bytes=3 * 1024 * 1024 // 2).sets(3 * 1024 * 1024 // 2, 16)
    assert "power-of-two" in one_line(exc)


def test_the_sequential_bound_is_littles_law_on_the_outstanding_misses(topo):
    h = vtime.Hierarchy()
    for fabric in ("pf", "electrical"):
        assert vtime.sequential_bound_gbs(topo, fabric) == pytest.approx(
            h.outstanding * 64 / vtime.expected_idle_ns(topo, fabric))
    assert vtime.sequential_bound_gbs(topo, "pf", dataclasses.replace(h, outstanding=64 * 48)) == pytest.approx(128)


@pytest.mark.parametrize("items, says", [
    (["copper_ns=3"], "copper_ns"), (["port_mbs"], "NAME=VALUE"), (["port_mbs=0"], "positive"),
    (["switch_hop_ns=-5"], "positive"), (["hbm_hit_ns=nan"], "positive"), (["port_mbs=fast"], "not a number"),
    (["port_mbs=1.5"], "whole"),
])
def test_a_bad_what_if_parameter_is_one_line_naming_it(items, says):
    with pytest.raises(TimingError) as exc:
        vtime.params(items)
    assert says in one_line(exc)
    with pytest.raises(PfcxlError):
        BootOptions(fabric_params=tuple(items))


def test_what_if_parameters_reach_the_offline_model(topo):
    from pfcxl.device.fabric import systems
    what_if = vtime.params(["module_read_ns=100", "hbm_cache=1048576"])
    models = systems.models(topo, what_if)
    assert models["pf"].idle_ns(False) == 24 + 100 + 47
    assert models["pf_hbm"].cache_lines == 1048576 // 64
    assert what_if.changed() == {"module_read_ns": 100, "hbm_cache": 1048576}
    assert BootOptions(fabric_params=("module_read_ns=100",)).as_dict()["fabric_params"] == ["module_read_ns=100"]


def test_inject_says_its_baseline_and_delay_and_when_it_could_add_none():
    from pfcxl.host_tools.timing.calibration import inject_summary
    config = timing.TimingConfig("inject", read_ns=(283.0, 833.0), write_ns=(224.0, 774.0), baseline_ns=500.0)
    lines = inject_summary(config)
    assert "500 ns (baseline)" in lines[0]
    assert "delay added per request 0 / 0 ns" in lines[1] and "delay added per request 333 / 274 ns" in lines[2]
    assert "profile 0's latency" in lines[-1] and "--clock virtual" in lines[-1]
    fits = inject_summary(timing.TimingConfig("inject", read_ns=283.0, write_ns=224.0, baseline_ns=100.0))
    assert len(fits) == 2 and "183 / 124 ns" in fits[1]
