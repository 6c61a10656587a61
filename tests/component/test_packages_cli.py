"""--packages on the command line: every mistake is one line naming it, and nothing is built."""

import subprocess
import sys

import pytest

from pfcxl import cache

from . import bounded_cli

pytestmark = pytest.mark.component


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli", *args], capture_output=True, text=True,
                          timeout=600)


def one_line(done: subprocess.CompletedProcess | bounded_cli.Outcome) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


WITHOUT_DEBIAN = [["qemu-args"], ["run", "--dry-run", "--", "true"], ["bench"]]
MALFORMED = ["Bad_Name", "x", "numactl;rm", "-numactl", ""]


@pytest.fixture(scope="module")
def refused() -> dict:
    """The refused command lines of this module, all in one child process (bounded_cli: the CLI's
    imports paid once; one that went on to build or boot would hit its time limit)."""
    cases = {("without debian", *command): [*command[:1], "--packages", "numactl", *command[1:]]
             for command in WITHOUT_DEBIAN}
    cases |= {("malformed", bad): ["run", "--image", "debian", "--packages", f"numactl,{bad}", "--", "true"]
              for bad in MALFORMED}
    return bounded_cli.run_named(cases)


@pytest.mark.parametrize("command", WITHOUT_DEBIAN)
def test_packages_without_the_debian_image_is_one_line(refused, command):
    done = refused[("without debian", *command)]
    assert done.rc != 0 and not isinstance(done.rc, str), (done.rc, done.stderr)     # not escaped
    assert "add --image debian" in one_line(done)


@pytest.mark.parametrize("bad", MALFORMED)
def test_a_malformed_package_name_is_one_line(refused, bad):
    done = refused[("malformed", bad)]
    assert done.rc == 2 and f"{bad!r} is not a Debian package name" in done.stderr, (done.rc, done.stderr)


def test_a_package_trixie_does_not_have_is_named_and_nothing_is_built():
    # the packages layer is what this command writes first (an image only after it); the images
    # folder is not compared: other tests running at once build their images into it
    layers = set((cache.cache_dir() / "debian").glob("packages-*.tar"))
    done = cli("image", "--image", "debian", "--packages", "numactl,no-such-package-pfcxl")
    assert done.returncode == 4
    assert one_line(done).endswith("no Debian package no-such-package-pfcxl in trixie")
    assert set((cache.cache_dir() / "debian").glob("packages-*.tar")) == layers


def test_a_name_apt_would_read_as_a_pattern_is_refused_and_nothing_is_built():
    pattern = "numa.+"           # a valid Debian name, but no package: apt takes it for a regex
    layers = set((cache.cache_dir() / "debian").glob("packages-*.tar"))
    done = cli("image", "--image", "debian", "--packages", f"numactl,{pattern}")
    assert done.returncode == 4
    assert one_line(done).startswith(f"pfcxl: error: --packages: no Debian package named {pattern} in trixie")
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
