"""The limits `topology check` enforces (device/topology/limits.py) are QEMU's and the guest's real
ones: the value just inside each still starts QEMU (stopped with -S, its monitor answering), and
where QEMU itself refuses, the value just outside is refused by QEMU too."""

from __future__ import annotations

import dataclasses

import pytest

from pfcxl.device import topology
from pfcxl.device.topology.units import MiB
from pfcxl.errors import VMError
from pfcxl.host_tools.image import initramfs as image
from pfcxl.host_tools.vm.host import VM
from tests.topology_docs import LARGEST_WINDOW, one_bridge, pf_nic_doc, shipped, two_bridges

from .conftest import load

pytestmark = pytest.mark.integration


def qemu_status(topo: topology.Topology, run_dir) -> dict:
    """QEMU started for `topo` and stopped before the guest's first instruction: its run status.
    Raises VMError with what QEMU said if it refuses the configuration."""
    img = image.build(load("pf-nic"))      # -S runs no guest code: any image will do
    with VM(topo, img, run_dir, extra_args=["-S"]) as vm:
        vm.launch()
        return vm.qmp("query-status")


def _assert_starts(doc: dict, tmp_path) -> None:
    assert qemu_status(topology.from_dict(doc), tmp_path)["status"] == "prelaunch"


def _assert_refused(topo: topology.Topology, tmp_path, qemu_says: str) -> None:
    with pytest.raises(VMError) as info:
        qemu_status(topo, tmp_path)
    assert qemu_says in str(info.value)


def test_chassis_255_starts_and_256_is_refused_by_qemu_too(tmp_path):
    _assert_starts(pf_nic_doc(root_port={"chassis": 255}), tmp_path / "in")
    topo = load("pf-nic")
    outside = dataclasses.replace(topo, root_ports=(dataclasses.replace(topo.root_ports[0], chassis=256),))
    _assert_refused(outside, tmp_path / "out", "Parameter 'chassis' expects uint8_t")


def test_slot_8191_and_serial_just_below_no_serial_start(tmp_path):
    _assert_starts(pf_nic_doc(root_port={"slot": 8191}, device={"serial": 0xFFFF_FFFF_FFFF_FFFE}), tmp_path)


def test_32_root_ports_start_and_33_are_refused_by_qemu_too(tmp_path):
    doc = one_bridge(32, cpus=2)
    _assert_starts(doc, tmp_path / "in")
    topo = topology.from_dict(doc)
    extra = dataclasses.replace(topo.root_ports[-1], id="rp32", port=32, slot=33)
    _assert_refused(dataclasses.replace(topo, root_ports=topo.root_ports + (extra,)), tmp_path / "out",
                    "no slot/function available")


def test_largest_window_starts_and_one_more_unit_is_refused_by_qemu_too(tmp_path):
    doc = pf_nic_doc(window={"size": LARGEST_WINDOW})
    _assert_starts(doc, tmp_path / "in")
    topo = topology.from_dict(doc)
    bigger = dataclasses.replace(topo.windows[0], size=LARGEST_WINDOW + 256 * MiB)
    _assert_refused(dataclasses.replace(topo, windows=(bigger,)), tmp_path / "out", "phys-bits too low")


def test_host_bridge_right_after_a_switchs_buses_boots_with_every_memdev(boot):
    # cxl.1 at bus 12: root port, switch upstream port and 4 downstream ports use buses 12-18.
    doc = shipped("electrical-switch")
    doc["host_bridge"].append({"id": "cxl.2", "bus_nr": 19})
    doc["root_port"].append({"id": "rp1", "host_bridge": "cxl.2", "port": 0, "chassis": 0, "slot": 3})
    doc["device"].append({"id": "mem4", "port": "rp1", "volatile": "256M", "serial": 0x5046_0205})
    vm = boot(topology.from_dict(doc, default_name="switch-then-bridge"))
    serials = vm.check("cat /sys/bus/cxl/devices/mem*/serial").split()
    assert sorted(int(s, 0) for s in serials) == sorted(d["serial"] for d in doc["device"])


def test_32_devices_on_one_vcpu_boot_with_every_memdev(boot):
    # 32 root ports + 32 devices x 5 (mailbox, 4 event logs) = 192, all the interrupt vectors one
    # vCPU has for PCI devices; one device more is rejected by topology check (Linux fails the
    # probe of the devices it cannot give their vectors with -ENOSPC).
    vm = boot(topology.from_dict(two_bridges(32), default_name="thirty-two"))
    assert int(vm.check("ls /sys/bus/pci/drivers/cxl_pci | grep -c '^0000:'")) == 32
    serials = vm.check("cat /sys/bus/cxl/devices/mem*/serial").split()
    assert sorted(int(s, 0) for s in serials) == list(range(1, 33))
