"""--data-path / [guest] data_path: rules (one line each, before any boot), QEMU options, the
guest plan and the direct devices' predicted physical addresses."""

import subprocess
import sys

import pytest

from pfcxl import Machine
from pfcxl.device.topology import address_map
from pfcxl.device.topology import data_path
from pfcxl.device import topology
from pfcxl.device.topology.units import GiB, MiB
from pfcxl.errors import TopologyError
from pfcxl.guest import plan

from tests.topology_data import PMEM, argv_of, doc_of, values_of

pytestmark = pytest.mark.component


def _shipped(name: str) -> topology.Topology:
    return topology.load(topology.resolve(name))


def test_default_is_cxl_and_adds_nothing():
    topo = _shipped("two-hb-interleave")
    assert topo.guest.data_path == "cxl" and not data_path.has_direct(topo)
    argv = argv_of(topo)
    assert "nvdimm" not in " ".join(argv)
    assert "direct " not in plan.render(topo, [])


def test_both_plugs_each_backing_file_again_as_an_nvdimm():
    topo = data_path.with_data_path(_shipped("two-hb-interleave"), "both")
    argv = argv_of(topo, "/r")
    assert argv[argv.index("-machine") + 1].startswith("q35,cxl=on,nvdimm=on,")
    ids = [d.id for d in topo.devices]
    objects = values_of(argv, "-object", "memory-backend-file,id=direct-")
    assert objects == [f"memory-backend-file,id=direct-{d},share=on,mem-path=/r/{d}.mem,size={512 * MiB}"
                       for d in ids]
    assert values_of(argv, "-device", "nvdimm") == [f"nvdimm,memdev=direct-{d},id=direct-nvdimm-{d}" for d in ids]
    # the CXL devices stay, on the same files
    assert len(values_of(argv, "-device", "cxl-type3")) == 2


def test_direct_placements_follow_the_hotplug_area_base():
    topo = data_path.with_data_path(_shipped("two-hb-interleave"), "both")
    places = address_map.direct_placements(topo)
    # 1 GiB of RAM: nothing above 4 GiB, so the DIMM area (and the first NVDIMM, seen in the guest
    # at /sys/bus/nd/devices/regionN/resource) starts at 4 GiB; the CXL base is unchanged
    first, second = (d.id for d in topo.devices)
    assert [(p.what, p.base, p.size) for p in places] == [
        (first, 4 * GiB, 512 * MiB), (second, 4 * GiB + 512 * MiB, 512 * MiB)]
    assert address_map.cxl_base(topo) == address_map.cxl_base(_shipped("two-hb-interleave"))


def test_plan_lists_direct_devices_and_their_modules():
    both = data_path.with_data_path(_shipped("pf-nic"), "both")
    direct = data_path.with_data_path(_shipped("pf-nic"), "direct")
    for topo in (both, direct):
        assert [m for m in plan.modules_needed(topo) if m in plan.DIRECT_MODULES] == list(plan.DIRECT_MODULES)
        assert f"direct pfnic0 {4 * GiB:#x} {GiB}" in plan.render(topo, []).splitlines()
    assert any(line.startswith("region ") for line in plan.render(both, []).splitlines())
    assert not any(line.startswith("region ") for line in plan.render(direct, []).splitlines())


def test_guest_table_data_path_is_read_and_checked(tmp_path):
    doc = (topology.resolve("pf-nic")).read_text().replace("cpus = 1", 'cpus = 1\ndata_path = "both"')
    good = tmp_path / "good.toml"
    good.write_text(doc)
    assert topology.load(good).guest.data_path == "both"
    bad = tmp_path / "bad.toml"
    bad.write_text(doc.replace('data_path = "both"', 'data_path = "fast"'))
    with pytest.raises(TopologyError, match=r"bad.toml: guest.data_path: 'fast' is not one of cxl, direct, both"):
        topology.load(bad)


def _small_room(tmp_path) -> str:
    """two-hb-interleave (2 x 512 MiB) with 512 MiB of hotplug room."""
    path = tmp_path / "small-room.toml"
    path.write_text(topology.resolve("two-hb-interleave").read_text().replace('maxmem = "2G"', 'maxmem = "1536M"'))
    return str(path)


@pytest.mark.parametrize("name,path,message", [
    (None, "direct", "--data-path direct on topology 'two-hb-interleave': 'direct' plugs 2 device(s) of "
     "1 GiB as NVDIMMs, more than the hotplug room guest.maxmem - guest.memory = 512 MiB"),
    (str(PMEM), "both", "--data-path both on topology 'pmem': 'both' maps volatile memory only, but device "
     "'pmem0' is persistent"),
])
def test_what_qemu_cannot_map_is_refused_before_boot(tmp_path, name, path, message):
    with pytest.raises(TopologyError) as info:
        Machine(name or _small_room(tmp_path), data_path=path)
    assert message in str(info.value)


def test_no_hotplug_room_and_too_few_slots(tmp_path):
    doc = topology.resolve("electrical-switch").read_text()
    no_room = tmp_path / "noroom.toml"
    no_room.write_text(doc.replace('maxmem = "2G"', 'maxmem = "1G"').replace("cpus = 1", 'cpus = 1\ndata_path = "direct"'))
    with pytest.raises(TopologyError, match=r"guest.data_path: 'direct' plugs each device as an NVDIMM, which "
                       r"needs DIMM hotplug room: guest.maxmem \(1 GiB\) must exceed guest.memory by 1 GiB"):
        topology.load(no_room)
    slots = tmp_path / "slots.toml"
    slots.write_text(doc.replace("slots = 4", "slots = 2").replace("cpus = 1", 'cpus = 1\ndata_path = "both"'))
    with pytest.raises(TopologyError, match=r"'both' needs one DIMM slot per device \(4\), but guest.slots is 2"):
        topology.load(slots)


def test_cli_error_is_one_line_and_qemu_args_shows_the_nvdimm(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], capture_output=True, text=True)
    bad = cli("qemu-args", "-t", _small_room(tmp_path), "--data-path", "direct")
    assert bad.returncode == TopologyError.exit_code and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    good = cli("qemu-args", "--data-path", "both", "--lines")
    assert good.returncode == 0 and "nvdimm,memdev=direct-pfnic0,id=direct-nvdimm-pfnic0" in good.stdout


def test_the_benchmark_scripts_pool_holds_four_slices_on_the_direct_device(tmp_path):
    from pfcxl.host_tools.experiments import data_path as dpb
    text = topology.resolve("pf-appliance").read_text()
    for old, new in dpb.POOL_EDITS:
        assert text.count(old) == 1
        text = text.replace(old, new)
    (tmp_path / "pool.toml").write_text(text)
    topo = data_path.with_data_path(topology.load(tmp_path / "pool.toml"), "direct")
    pool = address_map.direct_placements(topo)[0]
    # slices: flags, then slices from the next 2 MiB boundary, in the direct device's bytes
    assert 2 * MiB + dpb.HOSTS * dpb.SLICE <= pool.size - data_path.DIRECT_OFFSET
