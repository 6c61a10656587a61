"""--qemu: a binary of one's own is found, asked its version, and refused in one line when it is
not a QEMU 10.0 or newer; --qemu-arg lands last in the argv, after pfcxl's own options."""

import os
from pathlib import Path

import pytest

from pfcxl.device import topology
from pfcxl.errors import VMError
from pfcxl.host_tools.vm import qemu
from pfcxl.host_tools.vm import qemu_binary
from pfcxl.host_tools.image.initramfs import BootImage
from pfcxl.host_tools.vm.host import VM
from pfcxl.host_tools.cli.main import parser
from pfcxl.host_tools.vm.boot_options import from_args

pytestmark = pytest.mark.component


def fake_qemu(where: Path, says: str, status: int = 0) -> Path:
    script = where / "qemu"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{says}'\nexit {status}\n")
    script.chmod(0o755)
    return script


VERSIONS = [(major, minor, micro) for major in (0, 1, 7, 8, 9, 10, 11, 12, 20) for minor in (0, 1, 2, 9)
            for micro in (0, 3)]


@pytest.mark.parametrize("major,minor,micro", VERSIONS)
def test_versions_below_10_are_refused_naming_the_version(tmp_path, major, minor, micro):
    script = fake_qemu(tmp_path, f"QEMU emulator version {major}.{minor}.{micro} (Debian 1:{major}.{minor})")
    if (major, minor) >= (10, 0):
        assert qemu_binary.version(str(script)) == f"{major}.{minor}.{micro}"
    else:
        with pytest.raises(VMError) as caught:
            qemu_binary.version(str(script))
        message = str(caught.value)
        assert "\n" not in message
        assert f"is QEMU {major}.{minor}.{micro}" in message and str(script) in message


@pytest.mark.parametrize("says,status,expected", [
    ("GNU bash, version 5.2", 0, "not a QEMU"),
    ("QEMU emulator version 10.0.2", 1, "not a QEMU ('--version' exited 1"),
    ("", 0, "said: nothing"),
])
def test_a_program_that_is_not_a_working_qemu_is_one_line(tmp_path, says, status, expected):
    script = fake_qemu(tmp_path, says, status)
    with pytest.raises(VMError, match="^[^\n]*$") as caught:
        qemu_binary.version(str(script))
    assert expected in str(caught.value)


def test_missing_and_not_executable_files_are_named(tmp_path):
    with pytest.raises(VMError, match=f"--qemu {tmp_path}/absent: no such file"):
        qemu_binary.version(str(tmp_path / "absent"))
    script = fake_qemu(tmp_path, "QEMU emulator version 10.0.2")
    script.chmod(0o644)
    with pytest.raises(VMError, match="not executable"):
        qemu_binary.version(str(script))


def test_resolve_makes_paths_absolute_and_looks_names_up_on_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert qemu_binary.resolve("bin/qemu") == str(tmp_path / "bin" / "qemu")
    fake_qemu(tmp_path, "QEMU emulator version 10.0.2")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin")
    assert qemu_binary.resolve("qemu") == str(tmp_path / "qemu")
    with pytest.raises(VMError, match="no-such-qemu: no such program on PATH"):
        qemu_binary.resolve("no-such-qemu")


def test_cli_options_reach_the_machine_options(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for command in ("run", "boot", "up", "demo", "qemu-args"):
        args = parser().parse_args([command, "--qemu", "own/qemu", "--qemu-arg=-name", "--qemu-arg", "x,y=1"]
                                   + (["--", "true"] if command == "run" else []))
        options = from_args(args)
        assert options.qemu == str(tmp_path / "own" / "qemu")
        assert options.qemu_args == ("-name", "x,y=1")
        plain = from_args(parser().parse_args([command] + (["--", "true"] if command == "run" else [])))
        assert plain.qemu is None and plain.qemu_args == ()


def test_the_vm_execs_the_own_binary_with_its_arguments_last(tmp_path):
    topo = topology.load(topology.resolve("pf-nic"))
    image = BootImage(tmp_path / "vmlinuz", tmp_path / "initrd", "6.12.0", False)
    own = ["-name", "guest=a,,b", "-trace", "enable=cxl_*"]
    vm = VM(topo, image, tmp_path, extra_args=["-plugin", "p.so"], lean=False, qemu_path="/opt/own/qemu",
            qemu_args=own)
    argv = vm.planned_argv()
    assert argv[0] == "/opt/own/qemu"
    assert argv[-len(own):] == own and argv[-len(own) - 2:-len(own)] == ["-plugin", "p.so"]
    default = VM(topo, image, tmp_path, lean=False).planned_argv()
    assert default[0] == qemu.qemu_binary() and argv[1:-len(own)] == default[1:] + ["-plugin", "p.so"]
