"""--kernel-package: which Debian kernels apt's listing offers, which one a VERSION or `latest`
names, the packages newer kernels are split into, and the option's exclusivity with --kernel."""

from __future__ import annotations

import subprocess
from pathlib import Path
import sys

import pytest
from hypothesis import given, strategies as st

from pfcxl import Machine
from pfcxl.errors import PfcxlError, SetupError
from pfcxl.host_tools.image import kernel_package as kp

pytestmark = pytest.mark.component

URI = "http://deb.debian.org/debian"
MADISON = f"""\
linux-image-6.12.95+deb12-amd64 | 6.12.95-1~bpo12+1 | {URI} bookworm-backports/main amd64 Packages
linux-image-6.12.95+deb12-amd64-unsigned | 6.12.95-1~bpo12+1 | {URI} bookworm-backports/main amd64 Packages
linux-image-6.12.117+deb13-amd64-unsigned | 6.12.117-1 | {URI} trixie/main amd64 Packages
linux-image-6.1.0-28-amd64 | 6.1.119-1 | {URI} bookworm-security/main amd64 Packages
linux-image-6.12.117+deb13-cloud-amd64 | 6.12.117-1 | {URI} trixie/main amd64 Packages
linux-image-7.3.4+deb13-amd64 | 7.3.4-1~bpo13+1 | {URI} trixie-backports/main amd64 Packages
linux-image-6.19.14+deb13-amd64 | 6.19.14-1~bpo13+1 | {URI} trixie-backports/main amd64 Packages
"""


def test_the_listing_keeps_the_three_suites_amd64_flavour_signed_first():
    found = kp.parse_madison(MADISON)
    assert [(k.package, k.suite) for k in found] == [
        ("linux-image-6.12.95+deb12-amd64", "bookworm-backports"),          # signed preferred
        ("linux-image-6.12.117+deb13-amd64-unsigned", "trixie"),           # only unsigned there
        ("linux-image-6.19.14+deb13-amd64", "trixie-backports"),
        ("linux-image-7.3.4+deb13-amd64", "trixie-backports")]             # newest last, by kernel version
    assert found[1].release == "6.12.117+deb13-amd64" and found[1].upstream == "6.12.117"


def test_latest_is_the_newest_kernel_not_the_newest_string():
    # "7.3.4" < "6.19.14" as strings; "6.12.95" > "6.12.117": the choice compares numbers
    assert kp.choose("latest", kp.parse_madison(MADISON)).release == "7.3.4+deb13-amd64"


@given(st.sampled_from(kp.parse_madison(MADISON)), st.integers(0, 4))
def test_every_way_of_naming_a_kernel_finds_it(k, how):
    spec = (k.version, k.release, k.upstream, k.package, k.package.removesuffix("-unsigned"))[how]
    assert kp.choose(spec, kp.parse_madison(MADISON)) == k


@given(st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=30))
def test_an_unknown_version_is_one_line_listing_what_there_is(spec):
    available = kp.parse_madison(MADISON)
    if spec == "latest" or any(spec in k.names() for k in available):
        return
    with pytest.raises(SetupError) as caught:
        kp.choose(spec, available)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"--kernel-package {spec}: no such Debian kernel")
    assert all(f"{k.upstream} ({k.version}, {k.suite})" in message for k in available)


def test_split_kernels_bring_their_binary_modules_and_base_packages():
    show = ("Package: linux-image-7.3.4+deb13-amd64\nDepends: dracut | initramfs-tools (>= 0.120+deb8u2) | "
            "linux-initramfs-tool, linux-base-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1), linux-binary-7.3.4+deb13-amd64 "
            "(= 7.3.4-1~bpo13+1), linux-modules-7.3.4+deb13-amd64 (= 7.3.4-1~bpo13+1)\nSize: 1900\n")
    assert kp.split_parts(show, "7.3.4+deb13-amd64") == [
        "linux-base-7.3.4+deb13-amd64", "linux-binary-7.3.4+deb13-amd64", "linux-modules-7.3.4+deb13-amd64"]
    single = "Package: linux-image-6.12.117+deb13-amd64\nDepends: kmod, initramfs-tools (>= 0.120+deb8u2)\n"
    assert kp.split_parts(single, "6.12.117+deb13-amd64") == []


def test_a_split_tree_boots_the_vmlinuz_under_lib_modules(tmp_path):
    release = "7.3.4+deb13-amd64"
    (tmp_path / "usr/lib/modules" / release / "kernel/drivers/cxl").mkdir(parents=True)
    with pytest.raises(Exception, match="no boot/vmlinuz-7.3.4"):
        kp.finish_tree(tmp_path, release)
    (tmp_path / "usr/lib/modules" / release / "vmlinuz").write_bytes(b"x")
    kp.finish_tree(tmp_path, release)          # links lib -> usr/lib, then finds the vmlinuz
    assert kp.vmlinuz_of(tmp_path, release) == tmp_path / "lib/modules" / release / "vmlinuz"


def test_kernel_package_and_kernel_are_one_or_the_other():
    with pytest.raises(PfcxlError, match="give one kernel"):
        Machine("pf-nic", kernel="/nonexistent", kernel_package="latest")
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli.main", "qemu-args", "--kernel", "/k",
                           "--kernel-package", "latest"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr


def test_the_option_reaches_the_machine_and_the_reuse_hash():
    from pfcxl.host_tools.vm import boot_options
    from pfcxl.host_tools.cli import main as cli
    args = cli.parser().parse_args(["run", "--kernel-package", "6.12.117", "--", "true"])
    options = boot_options.from_args(args)
    assert options.kernel_package == "6.12.117"
    plain = boot_options.from_args(cli.parser().parse_args(["run", "--", "true"]))
    topo = Path(__file__).resolve().parents[2] / "device" / "topologies" / "pf-nic.toml"
    assert options.key(topo) != plain.key(topo)
