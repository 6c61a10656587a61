"""How a VM reads init's verdict off the console (literal markers, then the rest of the line),
without a guest: a socket pair stands in for QEMU's end of the serial port. Booted: tests/integration."""

import socket
import threading

import pytest

from pfcxl.errors import VMError
from pfcxl.host_tools.vm import host as vm_mod
from pfcxl.host_tools.vm.console import Console
from pfcxl.device import topology

pytestmark = pytest.mark.unit

READY = b'PFCXL-READY {"kernel":"6.12","regions":[],"dax":[],"output":"port"}'


def booting(tmp_path, chunks: list[bytes]) -> vm_mod.VM:
    """A VM in state BOOTING whose console receives `chunks`, then closes."""
    guest = vm_mod.VM(topology.load(topology.resolve("pf-nic")),
                      vm_mod.BootImage(tmp_path / "k", tmp_path / "i", "6.12", False), tmp_path, lean=False)
    ours, theirs = socket.socketpair()
    log = open(guest.console_log, "wb")
    guest._console_sock, guest._log_file = ours, log
    guest._console, guest.state = Console(ours, log), vm_mod.VMState.BOOTING

    def qemu():
        for c in chunks:
            theirs.sendall(c)
        theirs.close()
    threading.Thread(target=qemu, daemon=True).start()
    return guest


@pytest.mark.parametrize("split", range(1, len(READY) + 2, 7))
def test_ready_line_split_anywhere_gives_its_json(tmp_path, split):
    line = b"PFCXL-STAGE regions\r\n" + READY + b"\r\n"
    at = len(b"PFCXL-STAGE regions\r\n") + split
    guest = booting(tmp_path, [line[:at], line[at:]])
    info = guest.wait_ready(30)
    assert info == {"kernel": "6.12", "regions": [], "dax": [], "output": "port"}
    assert guest.state is vm_mod.VMState.READY
    guest.shutdown()


def test_failed_and_panic_lines_say_what_went_wrong(tmp_path):
    guest = booting(tmp_path, [b'PFCXL-STAGE regions\r\nPFCXL-FAILED {"stage":"region","error":"no room"}\r\n'])
    with pytest.raises(VMError, match="guest init failed at stage 'region': no room"):
        guest.wait_ready(30)
    guest = booting(tmp_path, [b"[ 1.0] Kernel panic - not syncing: VFS: Unable to mount root fs\r\n"])
    with pytest.raises(VMError, match="kernel panic, at stage 'kernel'.*Kernel panic - not syncing: VFS: Unable"):
        guest.wait_ready(30)


def test_a_console_that_closes_first_is_qemu_exiting(tmp_path):
    guest = booting(tmp_path, [b"PFCXL-STAGE init\r\nPFCXL-READY {\"kern"])
    with pytest.raises(VMError, match="QEMU exited before the guest became ready, at stage 'init'"):
        guest.wait_ready(30)
