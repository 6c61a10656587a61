"""The QEMU command line of every topology, checked option by option against the Topology object,
and the backing files' lifecycle (create sparse, reuse, refuse a wrong size)."""

import copy
import os
import tomllib
from pathlib import Path

import pytest

from pfcxl.device import topology
from pfcxl.device.topology import BACKEND_PREFIX
from pfcxl.device.topology.units import MiB, parse_size
from pfcxl.errors import VMError
from pfcxl.host_tools.vm import qemu

CONSOLE_FD, QMP_FD, OUTPUT_FD = 7, 11, 13
REPO_INIT = Path(__file__).resolve().parents[2] / "guest" / "init" / "init"
QEMU = "/opt/qemu/bin/qemu-system-x86_64"

pytestmark = pytest.mark.unit


# --------------------------------------------------------------------------- helpers


def split_opts(value: str) -> list[str]:
    """QEMU's option splitting: ',' separates, ',,' is a literal comma."""
    parts, current, i = [], "", 0
    while i < len(value):
        if value[i] == ",":
            if value[i + 1:i + 2] == ",":
                current += ","
                i += 2
                continue
            parts.append(current)
            current = ""
        else:
            current += value[i]
        i += 1
    parts.append(current)
    return parts


def parse_opts(value: str) -> tuple[str | None, dict[str, str]]:
    """'driver,k=v,...' -> ('driver', {k: v}); the first part is implied only when it has no '='."""
    parts = split_opts(value)
    first = None
    if parts and "=" not in parts[0]:
        first = parts.pop(0)
    keys: dict[str, str] = {}
    for part in parts:
        key, sep, val = part.partition("=")
        assert sep, f"option part {part!r} of {value!r} has no '='"
        assert key not in keys, f"key {key!r} given twice in {value!r}"
        keys[key] = val
    return first, keys


def options(argv: list[str]) -> list[tuple[str, str | None]]:
    """argv after the binary -> [(flag, value or None)]."""
    out, i = [], 1
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("-"), f"expected an option at argv[{i}], got {flag!r}"
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out.append((flag, argv[i + 1]))
            i += 2
        else:
            out.append((flag, None))
            i += 1
    return out


def values(argv: list[str], flag: str) -> list[str]:
    return [v for f, v in options(argv) if f == flag]


def devices(argv: list[str], driver: str) -> list[dict[str, str]]:
    return [keys for first, keys in map(parse_opts, values(argv, "-device")) if first == driver]


def objects(argv: list[str], qom_type: str) -> list[dict[str, str]]:
    return [keys for first, keys in map(parse_opts, values(argv, "-object")) if first == qom_type]


def two_windows() -> topology.Topology:
    """two-hb-interleave plus a second window, so window indexes beyond 0 are exercised."""
    doc = copy.deepcopy(tomllib.loads(topology.resolve("two-hb-interleave").read_text()))
    doc["window"].append({"id": "fmw1", "size": "1G", "targets": ["cxl.2"], "granularity": "4K"})
    return topology.from_dict(doc, source="two-windows.toml", default_name="two-windows")


CASES = {p.stem: p for p in topology.shipped_topologies()}


def load_case(name: str) -> topology.Topology:
    return two_windows() if name == "two-windows" else topology.load(CASES[name])


@pytest.fixture(params=sorted(CASES) + ["two-windows"])
def rendered(request, tmp_path):
    topo = load_case(request.param)
    backing = dict(qemu.backing_paths(topo, tmp_path / "run"))
    # devices the appliance serves arrive as inherited descriptors (fake numbers here)
    backing.update(qemu.inherited_backing({d.id: 40 + i for i, d in enumerate(topo.devices) if d.appliance}))
    boot = qemu.BootFiles(tmp_path / "vmlinuz", tmp_path / "initrd.cpio.gz", qemu.kernel_cmdline(topo))
    argv = qemu.argv(topo, boot, backing, console_fd=CONSOLE_FD, qmp_fd=QMP_FD, output_fd=OUTPUT_FD, qemu=QEMU)
    return topo, boot, backing, argv


def test_appliance_devices_map_inherited_descriptors(rendered):
    topo, boot, backing, argv = rendered
    by_id = {b["id"]: b for b in objects(argv, "memory-backend-file")}
    for i, dev in enumerate(topo.devices):
        if dev.appliance:
            assert by_id[BACKEND_PREFIX + dev.id]["mem-path"] == f"/proc/self/fd/{40 + i}"


# --------------------------------------------------------------------------- argv per topology


def test_shipped_topologies_are_all_covered():
    assert len(CASES) >= 3 and {"pf-nic", "two-hb-interleave", "electrical-switch"} <= set(CASES)
    assert len(two_windows().windows) == 2


def test_argv_is_strings_and_starts_with_binary(rendered):
    topo, boot, backing, argv = rendered
    assert argv[0] == QEMU
    assert all(isinstance(a, str) for a in argv)
    assert all(a and a == a.strip() for a in argv), "empty or padded argv element"


def test_cpu_accel_and_boot_files(rendered):
    topo, boot, backing, argv = rendered
    assert values(argv, "-cpu") == ["max,hypervisor=off"]
    assert values(argv, "-accel") == ["tcg"]
    assert values(argv, "-kernel") == [str(boot.kernel)]
    assert values(argv, "-initrd") == [str(boot.initrd)]
    assert values(argv, "-append") == [boot.cmdline]
    assert ("-nodefaults", None) in options(argv) and ("-no-reboot", None) in options(argv)


def test_memory_and_cpus_come_from_the_topology(rendered):
    topo, boot, backing, argv = rendered
    [m] = values(argv, "-m")
    size, keys = parse_opts(m)
    assert parse_size(size) == topo.guest.memory
    assert parse_size(keys["maxmem"]) == topo.guest.maxmem
    assert int(keys["slots"]) == topo.guest.slots
    assert set(keys) == {"maxmem", "slots"}
    assert values(argv, "-smp") == [str(topo.guest.cpus)]


def test_console_and_qmp_use_the_given_fds(rendered):
    topo, boot, backing, argv = rendered
    chardevs = {keys["id"]: (first, keys) for first, keys in map(parse_opts, values(argv, "-chardev"))}
    assert chardevs["console"] == ("socket", {"id": "console", "fd": str(CONSOLE_FD)})
    assert chardevs["qmp"] == ("socket", {"id": "qmp", "fd": str(QMP_FD)})
    assert values(argv, "-serial") == ["chardev:console"]
    assert [parse_opts(v) for v in values(argv, "-mon")] == [(None, {"chardev": "qmp", "mode": "control"})]


def test_command_output_has_a_virtio_serial_port_on_its_fd(rendered):
    topo, boot, backing, argv = rendered
    chardevs = {keys["id"]: (first, keys) for first, keys in map(parse_opts, values(argv, "-chardev"))}
    assert chardevs["output"] == ("socket", {"id": "output", "fd": str(OUTPUT_FD)})
    devices = [parse_opts(v) for v in values(argv, "-device")]
    bus = next(keys["id"] for first, keys in devices if first == "virtio-serial-pci")
    ports = [keys for first, keys in devices if first == "virtserialport"]
    # guest/init finds the port by this name
    assert ports == [{"bus": f"{bus}.0", "chardev": "output", "name": qemu.OUTPUT_PORT}]
    assert qemu.OUTPUT_PORT == "pfcxl.out" and "pfcxl.out" in (REPO_INIT.read_text())


def test_a_vm_hands_qemu_distinct_descriptors(rendered, tmp_path):
    """The console, QMP, output port, appliance memory and trace ring numbers never collide."""
    from pfcxl.host_tools.vm import host as vm_mod
    topo = rendered[0]
    guest = vm_mod.VM(topo, vm_mod.BootImage(tmp_path / "k", tmp_path / "i", "6.12", False), tmp_path, lean=False)
    memory = list(guest.memory_fds().values())
    fixed = [vm_mod.CONSOLE_FD, vm_mod.QMP_FD, vm_mod.OUTPUT_FD]
    numbers = fixed + memory + [vm_mod.ring_fd_number(topo)]
    assert len(set(numbers)) == len(numbers) and min(memory + [vm_mod.ring_fd_number(topo)]) > max(fixed)
    argv = guest.planned_argv()
    assert [f"id=output,fd={vm_mod.OUTPUT_FD}" in a for a in argv].count(True) == 1


def test_one_memory_backend_per_device(rendered):
    topo, boot, backing, argv = rendered
    backends = objects(argv, "memory-backend-file")
    assert len(backends) == len(topo.devices)
    by_id = {b["id"]: b for b in backends}
    assert len(by_id) == len(backends)
    for dev in topo.devices:
        b = by_id[BACKEND_PREFIX + dev.id]
        assert b["share"] == "on"
        assert b["mem-path"] == str(backing[dev.id])
        assert int(b["size"]) == dev.volatile
    assert set(backing) == {d.id for d in topo.devices}
    assert len(set(backing.values())) == len(topo.devices), "two devices share a backing file"


def test_one_type3_per_device_on_its_port(rendered):
    topo, boot, backing, argv = rendered
    type3 = devices(argv, "cxl-type3")
    assert len(type3) == len(topo.devices)
    by_id = {t["id"]: t for t in type3}
    for dev in topo.devices:
        t = by_id[dev.id]
        assert int(t["sn"]) == dev.serial
        assert t["bus"] == dev.port
        assert t["volatile-memdev"] == BACKEND_PREFIX + dev.id


def test_host_bridges_root_ports_and_switches(rendered):
    topo, boot, backing, argv = rendered
    pxb = devices(argv, "pxb-cxl")
    assert [(d["id"], int(d["bus_nr"]), d["bus"]) for d in pxb] == \
        [(hb.id, hb.bus_nr, "pcie.0") for hb in topo.host_bridges]
    rps = devices(argv, "cxl-rp")
    assert [(d["id"], d["bus"], int(d["port"]), int(d["chassis"]), int(d["slot"])) for d in rps] == \
        [(rp.id, rp.host_bridge, rp.port, rp.chassis, rp.slot) for rp in topo.root_ports]
    ups = devices(argv, "cxl-upstream")
    assert [(d["id"], d["bus"]) for d in ups] == [(sw.id, sw.root_port) for sw in topo.switches]
    dps = devices(argv, "cxl-downstream")
    assert [(d["id"], d["bus"], int(d["port"]), int(d["chassis"]), int(d["slot"])) for d in dps] == \
        [(p.id, p.switch, p.port, p.chassis, p.slot) for p in topo.downstream_ports]
    drivers = {parse_opts(v)[0] for v in values(argv, "-device")}
    assert drivers <= {"pxb-cxl", "cxl-rp", "cxl-upstream", "cxl-downstream", "cxl-type3",
                       "virtio-serial-pci", "virtserialport"}     # the command output's port


def test_every_bus_exists_before_its_devices(rendered):
    topo, boot, backing, argv = rendered
    defined = {"pcie.0"}
    for value in values(argv, "-device"):
        driver, keys = parse_opts(value)
        assert keys["bus"] in defined, f"{driver} {keys.get('id')} sits on bus {keys['bus']} not created before it"
        defined.add(keys.get("id"))
        if driver == "virtio-serial-pci":       # QEMU names its port bus after it
            defined.add(f"{keys['id']}.0")


def test_all_windows_in_one_machine_option(rendered):
    """QEMU refuses cxl-fmw keys spread over several -machine options ('used inconsistently'),
    so every window's keys follow the machine type in the first -machine option."""
    topo, boot, backing, argv = rendered
    machines = [parse_opts(v) for v in values(argv, "-machine")]
    assert len(machines) == 1, f"{len(machines)} -machine options: {values(argv, '-machine')}"
    first, keys = machines[0]
    assert first == "q35" and keys.pop("cxl") == "on"
    keys.pop("hmat", None)
    for n, window in enumerate(topo.windows):
        prefix = f"cxl-fmw.{n}."
        targets = [keys.pop(f"{prefix}targets.{i}") for i in range(window.ways)]
        assert targets == list(window.targets)
        assert int(keys.pop(f"{prefix}size")) == window.size
        assert int(keys.pop(f"{prefix}interleave-granularity")) == window.granularity
    assert not keys, f"unexpected -machine keys: {sorted(keys)}"


# --------------------------------------------------------------------------- commas in paths


@pytest.fixture
def comma_paths(tmp_path):
    topo = topology.load(topology.resolve("two-hb-interleave"))
    run_dir = tmp_path / "run,dir"
    boot = qemu.BootFiles(tmp_path / "boot,files" / "vmlinuz", tmp_path / "boot,files" / "initrd,1.gz",
                          qemu.kernel_cmdline(topo, "pfcxl.test=a,b"))
    backing = qemu.backing_paths(topo, run_dir)
    return topo, boot, backing, qemu.argv(topo, boot, backing, console_fd=3, qmp_fd=4)


def test_qemu_opt_doubles_commas():
    assert qemu.qemu_opt("/a,b,,c") == "/a,,b,,,,c"
    assert qemu.qemu_opt(Path("/x/y")) == "/x/y"
    assert split_opts(qemu.qemu_opt("/a,b,,c")) == ["/a,b,,c"]


def test_mem_path_with_comma_is_escaped(comma_paths):
    topo, boot, backing, argv = comma_paths
    raw = values(argv, "-object")
    for dev in topo.devices:
        path = str(backing[dev.id])
        assert "," in path
        assert any(f"mem-path={path.replace(',', ',,')}," in v for v in raw)
    by_id = {b["id"]: b for b in objects(argv, "memory-backend-file")}
    assert {d.id: by_id[BACKEND_PREFIX + d.id]["mem-path"] for d in topo.devices} == \
        {k: str(v) for k, v in backing.items()}


def test_append_is_passed_verbatim(comma_paths):
    topo, boot, backing, argv = comma_paths
    # -append is not a QemuOpts option: QEMU takes the value as is, commas included.
    assert values(argv, "-append") == [boot.cmdline]
    assert "pfcxl.test=a,b" in boot.cmdline


# QEMU 10 stores -kernel/-initrd literally (no QemuOpts comma parsing): checked with 10.0.2,
# '-kernel /tmp/x,,y/vmlinuz' fails to open while '/tmp/x,y/vmlinuz' loads. Only -object/-device
# values such as mem-path need ',,'.
def test_kernel_and_initrd_paths_with_comma_are_literal(comma_paths):
    topo, boot, backing, argv = comma_paths
    assert values(argv, "-kernel") == [str(boot.kernel)]
    assert values(argv, "-initrd") == [str(boot.initrd)]


def test_maxmem_that_is_not_whole_mib_is_rejected():
    # -m carries MiB; a maxmem that is not whole MiB would be rounded and move QEMU's CXL base.
    doc = tomllib.loads(topology.resolve("pf-nic").read_text())
    doc["guest"]["maxmem"] = "2097664K"      # 2 GiB + 512 KiB
    with pytest.raises(topology.TopologyError, match=r"guest.maxmem: 2148007936 must be a whole number of MiB"):
        topology.from_dict(doc, source="t.toml")

# --------------------------------------------------------------------------- backing files


def test_prepare_backing_creates_sparse_files(tmp_path):
    topo = topology.load(topology.resolve("electrical-switch"))
    paths = qemu.prepare_backing(topo, tmp_path)
    assert paths == qemu.backing_paths(topo, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths.values())
    for dev in topo.devices:
        st = paths[dev.id].stat()
        assert st.st_size == dev.volatile
        assert st.st_blocks * 512 < dev.volatile // 16, f"{paths[dev.id]} is not sparse"


def test_prepare_backing_reuses_a_file_of_the_right_size(tmp_path):
    topo = topology.load(topology.resolve("pf-nic"))
    dev = topo.devices[0]
    path = qemu.prepare_backing(topo, tmp_path)[dev.id]
    marks = {0: b"first", dev.volatile // 2: b"middle", dev.volatile - 4: b"last"}
    with open(path, "r+b") as f:
        for offset, data in marks.items():
            f.seek(offset)
            f.write(data)
    before = path.stat()
    again = qemu.prepare_backing(topo, tmp_path)
    assert again[dev.id] == path
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    with open(path, "rb") as f:
        for offset, data in marks.items():
            f.seek(offset)
            assert f.read(len(data)) == data


def test_prepare_backing_refuses_a_wrong_size_and_leaves_it_alone(tmp_path):
    topo = topology.load(topology.resolve("pf-nic"))
    dev = topo.devices[0]
    path = qemu.backing_paths(topo, tmp_path)[dev.id]
    content = os.urandom(3 * 4096 + 5)
    path.write_bytes(content)
    with pytest.raises(VMError) as info:
        qemu.prepare_backing(topo, tmp_path)
    message = str(info.value)
    assert str(path) in message
    assert str(len(content)) in message and str(dev.volatile) in message
    assert path.read_bytes() == content


def test_prepare_backing_refuses_a_larger_file_too(tmp_path):
    topo = topology.load(topology.resolve("pf-nic"))
    dev = topo.devices[0]
    path = qemu.backing_paths(topo, tmp_path)[dev.id]
    with open(path, "wb") as f:
        f.truncate(dev.volatile + MiB)
    with pytest.raises(VMError, match=str(dev.volatile + MiB)):
        qemu.prepare_backing(topo, tmp_path)
    assert path.stat().st_size == dev.volatile + MiB


def test_lean_cmdline_is_the_default_and_classic_leaves_it_out():
    topo = topology.load(topology.resolve("pf-nic"))
    lean, classic = qemu.kernel_cmdline(topo, "loglevel=7"), qemu.kernel_cmdline(topo, "loglevel=7", lean=False)
    for option in ("mitigations=off", "tsc=reliable", "rcupdate.rcu_expedited=1", "cryptomgr.notests=1", "rodata=off"):
        assert option in lean.split() and option not in classic.split()
    # the base options stay, and what the caller appends comes last so it can override
    assert classic == f"{qemu.BASE_CMDLINE} loglevel=7"
    assert lean.startswith(qemu.BASE_CMDLINE) and lean.endswith(" loglevel=7")
    # both skip the boot-time IO-APIC timer check, which panics a guest starved of CPU by a busy host
    assert "no_timer_check" in classic.split() and "no_timer_check" in lean.split()
