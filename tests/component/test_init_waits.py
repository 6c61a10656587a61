"""guest/init's wait for a memdev, run by busybox sh over a sysfs tree made here: a memdev counts
only once cxl_mem's probe has finished, not when its driver link appears (at the probe's start)."""

import re
import subprocess

import pytest

from pfcxl.host_tools.image import initramfs as image

INIT = image.GUEST_INIT / "init"

pytestmark = pytest.mark.component


def memdev_of(devices, serial: str) -> subprocess.CompletedProcess:
    function = re.search(r"^memdev_of\(\) \{\n.*?^\}\n", INIT.read_text(), re.S | re.M).group(0)
    script = f'CXL_DEVICES="$1"\n{function}memdev_of "$2"\n'
    return subprocess.run([str(image.BUSYBOX), "sh", "-c", script, "sh", str(devices), serial],
                          capture_output=True, text=True, timeout=30)


@pytest.fixture
def probing(tmp_path):
    """mem0 (serial 0x50462000) bound to cxl_mem, its probe still running."""
    mem = tmp_path / "mem0"
    mem.mkdir()
    (mem / "serial").write_text("0x50462000\n")
    (mem / "driver").symlink_to(tmp_path)
    return tmp_path


def test_a_memdev_whose_probe_is_running_does_not_count(probing):
    assert memdev_of(probing, "0x50462000").returncode == 1


def test_a_memdev_counts_once_its_probe_finished(probing):
    (probing / "mem0" / "trigger_poison_list").write_text("")
    done = memdev_of(probing, "0x50462000")
    assert (done.returncode, done.stdout) == (0, "mem0\n")
    assert memdev_of(probing, "0x50462001").returncode == 1          # another serial: not this one
