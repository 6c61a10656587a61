"""A kernel of one's own: the Debian kernel package unpacked by hand (dpkg -x, as a kernel
engineer's `make install INSTALL_MOD_PATH=...` leaves it: a bzImage file and lib/modules/RELEASE)
boots with --kernel FILE --modules DIR and passes discovery; its version and origin are in
PFCXL-READY and --dry-run."""

from __future__ import annotations

import subprocess

import pytest

from pfcxl import Machine
from pfcxl import cache
from pfcxl.host_tools.vm import discovery

from .conftest import READY_TIMEOUT, pfcxl_cli

pytestmark = pytest.mark.integration


def test_a_kernel_file_and_modules_tree_from_the_debian_package_boot_and_pass_discovery(tmp_path):
    manifest = cache.read_manifest()
    release = manifest["kernel_release"]
    [deb] = cache.debs_dir().glob(f"{manifest['kernel_package']}_*.deb")
    tree = tmp_path / "install"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tree)], check=True)
    kernel = tree / "boot" / f"vmlinuz-{release}"
    dry = pfcxl_cli("demo", "-t", "two-hb-interleave", "--dry-run", "--kernel", str(kernel), "--modules", str(tree))
    assert dry.returncode == 0, dry.stderr
    assert f"kernel     {release} from --kernel {kernel}" in dry.stdout
    with Machine("two-hb-interleave", kernel=kernel, modules=tree, run_dir=tmp_path / "run",
                 ready_timeout=READY_TIMEOUT) as m:
        assert m.ready["kernel"] == release and m.ready["kernel_origin"] == f"--kernel {kernel}"
        found = discovery.discover(m)
    checks = discovery.compare(m.topology, found)
    assert checks and all(c.ok for c in checks), [c for c in checks if not c.ok]
