"""Two guests running at once on one shared backing file see each other's writes; each has its
own console and lifecycle: closing one (twice) ends its QEMU and leaves the other running."""

import pytest

from .conftest import daxio, pid_alive

pytestmark = pytest.mark.integration


def test_two_guests_share_one_backing_file_then_one_closes(boot, tmp_path):
    run_dir = tmp_path / "shared"
    a = boot("pf-nic", run_dir=run_dir, vm_name="host-a")
    b = boot("pf-nic", run_dir=run_dir, vm_name="host-b")
    assert a.pid != b.pid

    offset = 5 * 2 * 1024 * 1024 + 64          # inside the 6th 2 MiB page, not page-aligned
    daxio(a, f"poke /dev/dax0.0 --offset {offset} --value 0x5046cafe0000a001")
    seen = daxio(b, f"peek /dev/dax0.0 --offset {offset}")
    assert seen["value"] == "0x5046cafe0000a001"

    daxio(b, f"poke /dev/dax0.0 --offset {offset + 8} --value 0x5046cafe0000b002")
    seen = daxio(a, f"peek /dev/dax0.0 --offset {offset + 8}")
    assert seen["value"] == "0x5046cafe0000b002"
    # and A's own value is still there for B
    assert daxio(b, f"peek /dev/dax0.0 --offset {offset}")["value"] == "0x5046cafe0000a001"

    # console commands and the lifecycle, on guests that are up anyway (no boot of their own)
    assert a.run("echo hello; echo world").output == "hello\nworld\n"
    failed = a.run("ls /nonexistent-path")
    assert failed.status != 0 and "nonexistent-path" in failed.output
    assert a.run("(exit 3)").status == 3
    assert a.qmp("query-status")["running"] is True
    pid = a.pid
    a.close()
    a.close()   # harmless twice
    assert not pid_alive(pid), "QEMU still running after close()"
    assert b.run("(exit 5)").status == 5, "closing one guest disturbed the other"
