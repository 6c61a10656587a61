"""--packages (host_tools/image/debian_packages.py): names checked in one line, apt's simulation and
errors read, the rootfs's installed packages left out; Machine refuses packages without the
Debian image in one line (the CLI's lines: test_packages_cli.py)."""

import io
import tarfile

import pytest
from hypothesis import given, strategies as st

from pfcxl import Machine
from pfcxl.errors import PfcxlError
from pfcxl.host_tools.image import debian_packages
from pfcxl.host_tools.vm.boot_options import BootOptions

pytestmark = pytest.mark.unit

GOOD = st.from_regex(r"[a-z0-9][a-z0-9+.-]{1,20}", fullmatch=True)


@given(st.lists(GOOD, min_size=1, max_size=6))
def test_good_names_come_back_sorted_and_distinct(names):
    assert debian_packages.parse_names(",".join(names + names[:1])) == tuple(sorted(set(names)))
    assert debian_packages.parse_names(" , ".join(names)) == tuple(sorted(set(names)))


@given(GOOD, st.sampled_from(["", "A", "_", "/", " x", "*", "'", "=1.0", "é"]), st.integers(0, 3))
def test_a_malformed_name_is_named_in_one_line(good, bad_part, where):
    bad = good[:where] + bad_part + good[where:] if bad_part.strip() else bad_part
    if debian_packages.NAME_RE.fullmatch(bad.strip()):
        return                                   # " x" stripped may still be a fine name
    with pytest.raises(PfcxlError) as info:
        debian_packages.parse_names(f"{good},{bad}")
    assert repr(bad) in str(info.value) and "\n" not in str(info.value)


def test_apt_simulation_and_errors_are_read():
    text = ("NOTE: This is only a simulation!\nInst libnuma1 (2.0.19-1 Debian:13.2/stable [amd64])\n"
            "Inst numactl [2.0.18-1] (2.0.19-1 Debian:13.2/stable [amd64])\nConf numactl (2.0.19-1)\n")
    assert debian_packages.parse_simulation(text) == [("libnuma1", "2.0.19-1"), ("numactl", "2.0.19-1")]
    errors = ("E: Unable to locate package nosuch\nE: Package 'oldthing' has no installation candidate\n")
    assert debian_packages.unknown_names(errors) == ["nosuch", "oldthing"]


def test_a_name_apt_read_as_a_pattern_or_a_provider_is_found_out():
    # apt-get install -s numactl numa.+ g++: numa.+ is no package, so apt took it for a regular
    # expression; g++ and libstdc++6 (a '+' in a real name) are packages and are installed by name
    text = ("Inst gcc-14-base (14.2.0-19 Debian:13.2/stable [amd64])\nInst numactl (2.0.19-1 Debian:13.2/stable [amd64])\n"
            "Inst libnuma1 (2.0.19-1 Debian:13.2/stable [amd64])\nInst numad (0.5+20150602-9 Debian:13.2/stable [amd64])\n"
            "Inst g++ (4:14.2.0-1 Debian:13.2/stable [amd64])\nInst libstdc++6 (14.2.0-19 Debian:13.2/stable [amd64])\n")
    assert debian_packages.not_installed_by_name(("g++", "libstdc++6", "numa.+", "numactl"), text) == ["numa.+"]
    assert debian_packages.not_installed_by_name(("numactl",), text) == []


def test_installed_packages_are_read_from_the_rootfs_status(tmp_path):
    status = (b"Package: bash\nStatus: install ok installed\nVersion: 5\n\n"
              b"Package: gone\nStatus: deinstall ok config-files\n\nPackage: libc6\nStatus: install ok installed\n")
    path = tmp_path / "rootfs.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("./var/lib/dpkg/status")
        info.size = len(status)
        tar.addfile(info, io.BytesIO(status))
    assert debian_packages.installed_in(path) == {"bash", "libc6"}


def test_packages_without_the_debian_image_are_refused_before_anything_is_built():
    assert BootOptions(packages=["strace", "numactl"]).packages == ("numactl", "strace")
    with pytest.raises(PfcxlError, match="add --image debian"):
        Machine("pf-nic", packages=["numactl"])
