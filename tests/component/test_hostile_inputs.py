"""Hostile but realistic inputs: odd table files, odd topology files, names used
as paths. Each gets one clear line, or the work it asked for, never a traceback or a hang."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pfcxl.device.fabric import constants as fabric_constants
from pfcxl.device.appliance import pool
from pfcxl.device import topology
from pfcxl.device.topology.units import MiB
from pfcxl.errors import ApplianceError, TopologyError
from pfcxl.firmware_tables import acpi, cdat, cedt
from pfcxl.firmware_tables.layout import MAX_TABLE_BYTES, MAX_VIOLATIONS_SHOWN
from pfcxl.host_tools.vm.host import FIRST_MEMORY_FD

from . import bounded_cli
from tests.topology_docs import LARGEST_WINDOW, bridges_doc, one_bridge, pf_nic_doc, shipped, two_bridges

pytestmark = pytest.mark.component


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", *args], capture_output=True,
                          text=True, env=env)


def _cedt() -> bytes:
    return cedt.from_topology(topology.load(topology.resolve("pf-nic")))


def _acpi_table(signature: str, body: bytes = bytes(16)) -> bytes:
    return acpi.finish({"signature": signature, "revision": 1, **acpi.QEMU_IDS}, body)


# ------------------------------------------------------------------------------ tables decode


def test_as_cdat_forces_cdat_decoding_of_an_acpi_looking_file(tmp_path):
    f = tmp_path / "facp.bin"
    f.write_bytes(_acpi_table("FACP"))
    refused = _cli("tables", "decode", str(f))
    assert refused.returncode == 6 and "not a CEDT" in refused.stderr and "== " not in refused.stdout
    forced = _cli("tables", "decode", str(f), "--as", "cdat")
    assert "CDAT (Coherent Device Attribute Table)" in forced.stdout, forced.stderr
    assert forced.returncode == 1 and "Violations: 0" not in forced.stdout


def test_as_is_accepted_between_decode_and_the_files(tmp_path):
    f = tmp_path / "t.cdat"
    f.write_bytes(cdat.build(cdat.device_entries(256 << 20, fabric_constants.PF_MODULE)))
    done = _cli("tables", "decode", "--as", "cdat", str(f))
    assert done.returncode == 0, done.stderr
    assert "CDAT (Coherent Device Attribute Table)" in done.stdout and "Violations: 0" in done.stdout


def test_one_bad_file_does_not_stop_the_next(tmp_path):
    missing = tmp_path / "missing.dat"
    refused = tmp_path / "dbg2.dat"
    refused.write_bytes(_acpi_table("DBG2"))
    good = tmp_path / "CEDT.dat"
    good.write_bytes(_cedt())
    done = _cli("tables", "decode", str(missing), str(refused), str(good))
    assert done.returncode == 6
    assert f"== {good}" in done.stdout and "Violations: 0" in done.stdout
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 2 and str(missing) in errors[0] and str(refused) in errors[1], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("signature", ["DBG2", "TPM2", "SSDT", "WSMT"])
def test_acpi_signatures_with_digits_are_not_taken_for_a_cdat(tmp_path, signature):
    f = tmp_path / "t.dat"
    f.write_bytes(_acpi_table(signature))
    done = _cli("tables", "decode", str(f))
    assert done.returncode == 6 and "CDAT (" not in done.stdout
    assert f"'{signature}'" in done.stderr and "not a CEDT" in done.stderr


def test_a_tiny_file_is_too_short_not_a_c_table(tmp_path):
    f = tmp_path / "c.bin"
    f.write_bytes(b"C")
    done = _cli("tables", "decode", str(f))
    assert done.returncode == 6 and "'C' table" not in done.stderr
    assert "1 byte" in done.stderr and "too short" in done.stderr, done.stderr


def test_dev_zero_and_a_fifo_are_refused_unread(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "tables", "decode", "/dev/zero",
                           str(fifo)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 6 and done.stderr.splitlines() == [
        "pfcxl: error: /dev/zero: a character device, not a regular file",
        f"pfcxl: error: {fifo}: a FIFO, not a regular file"]


def test_a_text_file_is_not_taken_for_a_cdat(tmp_path):
    f = tmp_path / "api.py"
    f.write_text('"""The public API."""\nimport os\n' * 20)
    done = _cli("tables", "decode", str(f))
    assert done.returncode == 6 and "== " not in done.stdout and "Violations" not in done.stdout
    assert done.stderr.startswith(f"pfcxl: error: {f}: not a CEDT or a CDAT") and len(done.stderr.splitlines()) == 1
    forced = _cli("tables", "decode", "--as", "cdat", str(f))
    assert forced.returncode == 1 and "Violations" in forced.stdout


def test_an_oversized_file_is_refused_and_the_rest_decoded(tmp_path):
    big = tmp_path / "big.dat"
    big.write_bytes(_cedt() + bytes(MAX_TABLE_BYTES))
    good = tmp_path / "CEDT.dat"
    good.write_bytes(_cedt())
    done = _cli("tables", "decode", str(big), str(good))
    assert done.returncode == 6 and f"== {good}" in done.stdout and f"== {big}" not in done.stdout
    assert str(big) in done.stderr and "larger than" in done.stderr


def test_a_file_of_tiny_subtables_lists_a_bounded_summary(tmp_path):
    # The largest file accepted, every 4 bytes an unknown subtable: one violation each.
    count = (MAX_TABLE_BYTES - acpi.HEADER.size) // 4
    body = bytes([9, 0, 4, 0]) * count
    f = tmp_path / "tiny.dat"
    f.write_bytes(acpi.finish({"signature": "CEDT", "revision": 1, **acpi.QEMU_IDS}, body))
    assert f.stat().st_size <= MAX_TABLE_BYTES
    done = _cli("tables", "decode", str(f))
    assert done.returncode == 1, done.stderr
    listed = [line for line in done.stdout.splitlines() if line.startswith("  - ")]
    assert len(listed) == MAX_VIOLATIONS_SHOWN
    assert f"Violations: {count}" in done.stdout
    assert f"... and {count - MAX_VIOLATIONS_SHOWN} more" in done.stdout
    assert len(done.stdout) < 64 * 1024


# ------------------------------------------------------------------------------ topologies


def one_line_error(doc: dict) -> str:
    """The single error line a topology gives (fails if it loads, or gives several lines)."""
    with pytest.raises(TopologyError) as info:
        topology.from_dict(doc, source="t.toml")
    lines = str(info.value).splitlines()
    assert len(lines) == 1 and lines[0].startswith("t.toml: "), lines
    return lines[0]


def switches_doc(granularity: str) -> dict:
    """One host bridge, two root ports, a switch with one device under each; a 2-way region."""
    doc = shipped("pf-nic")
    doc["root_port"] = [{"id": f"rp{i}", "host_bridge": "cxl.1", "port": i, "chassis": 0, "slot": 2 + i}
                        for i in range(2)]
    doc["switch"] = [{"id": f"us{i}", "root_port": f"rp{i}",
                      "downstream": [{"id": f"dp{i}", "port": 0, "chassis": 1, "slot": 2 + i}]} for i in range(2)]
    doc["device"] = [{"id": f"m{i}", "port": f"dp{i}", "volatile": "256M", "serial": i + 1} for i in range(2)]
    doc["window"][0]["granularity"] = granularity
    doc["region"] = [{"window": "fmw0", "devices": ["m0", "m1"], "granularity": granularity}]
    return doc


@pytest.mark.parametrize("bridges,granularity,shown", [
    (2, "16K", "16 KiB x 2 ways = 32 KiB"),
    (12, "8K", "8 KiB x 12 ways (counted as 4) = 32 KiB"),
    (4, "8K", "8 KiB x 4 ways = 32 KiB"),
])
def test_linux_refuses_root_granularity_times_ways_above_16k(bridges, granularity, shown):
    line = one_line_error(bridges_doc(bridges, granularity=granularity))
    assert "window 'fmw0'.granularity" in line and shown in line and "16 KiB" in line and "3/6/12" in line


@pytest.mark.parametrize("bridges,granularity", [(2, "8K"), (12, "4K"), (3, "16K"), (6, "8K"), (16, "1K")])
def test_interleave_settings_linux_accepts_still_load(bridges, granularity):
    topo = topology.from_dict(bridges_doc(bridges, granularity=granularity))
    assert topo.windows[0].ways == bridges


def test_the_rule_also_holds_below_a_host_bridge():
    # The host bridge interleaves its two root ports: the switches below get 16 KiB x 2.
    line = one_line_error(switches_doc("16K"))
    assert "region[0]" in line and "switch 'us0'" in line and "16 KiB x 2 ways = 32 KiB" in line
    assert topology.from_dict(switches_doc("8K")).regions[0].ways == 2


def test_a_host_bridge_interleaves_at_most_8_root_ports():
    line = one_line_error(bridges_doc(1, rps_per_bridge=16, granularity="256"))
    assert "host bridge 'hb0'" in line and "16 ways" in line and "at most 8" in line
    assert topology.from_dict(bridges_doc(1, rps_per_bridge=8, granularity="256")).regions[0].ways == 8


def test_every_shipped_topology_passes_the_new_rules():
    for path in topology.shipped_topologies():
        assert topology.load(path).name == path.stem


# Topologies QEMU or the guest can never boot: each rejected in one line (tests/integration/
# test_topology_limits.py starts QEMU on the value just inside each limit).
def _two_bridges(bus_a: int, bus_b: int) -> dict:
    doc = shipped("two-hb-interleave")
    doc["host_bridge"][0]["bus_nr"], doc["host_bridge"][1]["bus_nr"] = bus_a, bus_b
    return doc


def test_host_bridge_bus_numbers_leave_room_for_the_buses_below():
    line = one_line_error(_two_bridges(12, 13))
    assert "host_bridge 'cxl.1'.bus_nr" in line and "buses 12-13" in line and "'cxl.2' (bus_nr 13)" in line
    topology.from_dict(_two_bridges(12, 14))


def test_a_switch_needs_two_buses_plus_one_per_downstream_port():
    doc = shipped("electrical-switch")     # bus 12; root port, switch, 4 downstream ports: 12-18
    doc["host_bridge"].append({"id": "cxl.2", "bus_nr": 18})
    doc["root_port"].append({"id": "rp1", "host_bridge": "cxl.2", "port": 0, "chassis": 0, "slot": 3})
    assert "buses 12-18" in one_line_error(doc)
    doc["host_bridge"][1]["bus_nr"] = 19
    topology.from_dict(doc)


def test_the_last_host_bridge_buses_stay_below_256():
    doc = shipped("electrical-switch")
    doc["host_bridge"][0]["bus_nr"] = 250
    assert "buses 250-256" in one_line_error(doc) and "255" in one_line_error(doc)
    doc["host_bridge"][0]["bus_nr"] = 249
    topology.from_dict(doc)


def test_serial_all_ones_is_qemus_no_serial():
    line = one_line_error(pf_nic_doc(device={"serial": 0xFFFF_FFFF_FFFF_FFFF}))
    assert "device 'pfnic0'.serial" in line and "no serial" in line
    topology.from_dict(pf_nic_doc(device={"serial": 0xFFFF_FFFF_FFFF_FFFE}))


@pytest.mark.parametrize("field,bad,good,rule", [("chassis", 256, 255, "0 and 255"),
                                                 ("slot", 8192, 8191, "0 and 8191")])
def test_chassis_and_slot_ranges(field, bad, good, rule):
    line = one_line_error(pf_nic_doc(root_port={field: bad}))
    assert f"root_port 'rp0'.{field}" in line and rule in line
    topology.from_dict(pf_nic_doc(root_port={field: good}))


def test_downstream_port_slot_range():
    doc = shipped("electrical-switch")
    doc["switch"][0]["downstream"][0]["slot"] = 9000
    assert "downstream port 'swport0'.slot" in one_line_error(doc)


def test_a_host_bridge_has_at_most_32_root_ports():
    line = one_line_error(one_bridge(33, cpus=2))
    assert "host_bridge 'hb0'" in line and "33 root ports" in line and "32" in line
    topology.from_dict(one_bridge(32, cpus=2))


def hundred_devices(cpus: int) -> dict:
    doc = bridges_doc(7, rps_per_bridge=15, granularity="256", ways=1)
    del doc["root_port"][100:], doc["device"][100:]
    doc["window"] = [{"id": "fmw0", "size": "1G", "targets": ["hb0"]}]
    for i, hb in enumerate(doc["host_bridge"]):
        hb["bus_nr"] = 1 + i * 17         # own bus + 15 root ports, and one spare
    doc["guest"]["cpus"] = cpus
    return doc


def test_hundred_devices_on_seven_host_bridges_need_the_vcpus_for_their_interrupts():
    # 100 root ports x 1 + 100 devices x 5 vectors = 600; a vCPU has 192 for PCI devices.
    line = one_line_error(hundred_devices(cpus=1))
    assert "guest.cpus" in line and "600 interrupt vectors" in line and "192" in line and "cpus = 4" in line
    assert len(topology.from_dict(hundred_devices(cpus=4)).devices) == 100
    doc = hundred_devices(cpus=4)
    doc["host_bridge"][1]["bus_nr"] = 10   # hb0 needs buses 1-16
    assert "host_bridge 'hb0'.bus_nr: needs buses 1-16" in one_line_error(doc)


def test_interrupt_vectors_boundary_on_one_vcpu():
    assert len(topology.from_dict(two_bridges(32)).devices) == 32    # 32 + 32 x 5 = 192 vectors
    assert "198 interrupt vectors" in one_line_error(two_bridges(33))


def test_address_space_limit_of_the_windows():
    line = one_line_error(pf_nic_doc(window={"size": LARGEST_WINDOW + 256 * MiB}))
    assert "0xfd00000000" in line and "phys-bits" in line
    assert topology.from_dict(pf_nic_doc(window={"size": LARGEST_WINDOW})).windows[0].size == LARGEST_WINDOW


def test_a_10_tb_device_and_100_tb_of_memory_are_rejected():
    assert "0xfd00000000" in one_line_error(pf_nic_doc(device={"volatile": "10T"}, window={"size": "10T"}))
    assert "0xfd00000000" in one_line_error(pf_nic_doc(guest={"memory": "100T", "maxmem": "101T"}))
    assert "0xfd00000000" in one_line_error(pf_nic_doc(guest={"maxmem": "1T"}))


@pytest.mark.parametrize("name", ["../../../../some/dir", "a/b", ".hidden", "", "x" * 65, "sp ace", "ü"])
def test_topology_names_are_a_safe_alphabet(name):
    line = one_line_error(pf_nic_doc(**{}) | {"name": name})
    assert "name" in line and "letters, digits" in line


def test_a_deep_toml_array_is_one_line(tmp_path):
    f = tmp_path / "deep.toml"
    f.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    done = _cli("topology", "check", str(f))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "deep.toml" in done.stderr and "nest" in done.stderr


def test_mistyped_topology_name_suggests_the_close_one():
    with pytest.raises(TopologyError, match="did you mean 'pf-nic'"):
        topology.resolve("pf-nci")
    with pytest.raises(TopologyError) as info:
        topology.resolve("zzzzzz")
    assert "did you mean" not in str(info.value)


def test_qemu_args_prints_a_command_for_every_shipped_topology():
    paths = topology.shipped_topologies()
    # all in one child process (bounded_cli: the CLI's imports paid once)
    for path, done in zip(paths, bounded_cli.run([["qemu-args", path.stem, "--lines"] for path in paths])):
        assert done.rc == 0 and "Traceback" not in done.stderr, (path.stem, done.rc, done.stderr)
        argv = done.stdout.splitlines()
        topo = topology.load(path)
        for dev in topo.devices:
            assert any(f"id={dev.id}," in a for a in argv), (path.stem, dev.id)
            paths = [a for a in argv if f"id=backend-{dev.id}," in a]
            assert len(paths) == 1
            if dev.appliance:     # the descriptor number QEMU will find the appliance's memory at
                fd = int(paths[0].split("mem-path=/proc/self/fd/")[1].split(",")[0])
                assert fd >= FIRST_MEMORY_FD
                assert f"fds from {FIRST_MEMORY_FD} on are the memory descriptors" in " ".join(done.stderr.split())


def test_a_negative_pool_offset_is_called_negative():
    app = topology.load(topology.resolve("pf-appliance")).appliance
    with pytest.raises(ApplianceError) as info:
        pool.where(app, -1)
    assert "-0x1" not in str(info.value) and "pool offset -1 is negative" in str(info.value)
