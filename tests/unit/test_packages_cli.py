"""--packages on the command line: every mistake is one line naming it, and nothing is built."""

import subprocess
import sys

import pytest

from pfcxl import cache

pytestmark = pytest.mark.component


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli", *args], capture_output=True, text=True,
                          timeout=600)


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["qemu-args"], ["run", "--dry-run", "--", "true"], ["bench"]])
def test_packages_without_the_debian_image_is_one_line(command):
    done = cli(*command[:1], "--packages", "numactl", *command[1:])
    assert done.returncode != 0 and "add --image debian" in one_line(done)


@pytest.mark.parametrize("bad", ["Bad_Name", "x", "numactl;rm", "-numactl", ""])
def test_a_malformed_package_name_is_one_line(bad):
    done = cli("run", "--image", "debian", "--packages", f"numactl,{bad}", "--", "true")
    assert done.returncode == 2 and f"{bad!r} is not a Debian package name" in done.stderr


def test_a_package_trixie_does_not_have_is_named_and_nothing_is_built():
    # the packages layer is what this command writes first (an image only after it); the images
    # folder is not compared: other tests running at once build their images into it
    layers = set((cache.cache_dir() / "debian").glob("packages-*.tar"))
    done = cli("image", "--image", "debian", "--packages", "numactl,no-such-package-pfcxl")
    assert done.returncode == 4
    assert one_line(done).endswith("no Debian package no-such-package-pfcxl in trixie")
    assert set((cache.cache_dir() / "debian").glob("packages-*.tar")) == layers


def test_the_same_package_list_reuses_the_image_and_another_list_does_not():
    from pfcxl import Machine
    first = Machine("pf-nic", image="debian", packages=["numactl"]).boot_image()
    again = Machine("pf-nic", image="debian", packages="numactl,numactl").boot_image()
    assert again.initrd == first.initrd and not again.rebuilt
    from pfcxl.host_tools.image import debian as debian_image
    from pfcxl.host_tools.image import debian_packages
    base = debian_image.rootfs_tar()
    layer = debian_packages.layer(("numactl",), base, lambda message: None)
    paths = (cache.images_dir() / f"rootfs-{base.stem}+{layer.stem}.cpio.paths").read_text().splitlines()
    assert {"usr/bin/numactl", "usr/bin/python3"} <= set(paths)    # the layer over the rootfs
    plain = Machine("pf-nic", image="debian").boot_image()
    assert plain.initrd != first.initrd
