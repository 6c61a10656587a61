"""Data written through /dev/dax0.0 lives in the backing files, at the offsets the topology
predicts (which device file holds which interleave granule), on each shipped topology, and
survives a second boot. The second boot runs the same init and decoder code on every topology, so
it is paid once, on the interleaved one (pmem and the direct path have reboot tests of their own)."""

import zlib

import pytest

from pfcxl.device.topology.units import MiB
from pfcxl.guest import pattern
from pfcxl.host_tools.vm import qemu

from .conftest import daxio, load, read_region_from_backing

pytestmark = pytest.mark.integration

SIZE = 4 * MiB     # 16384 granules of 256 B, 512 of 8 KiB: every device and granule boundary many times


@pytest.mark.parametrize("name,seed,reboot", [("pf-nic", 11, False), ("two-hb-interleave", 22, True),
                                              ("electrical-switch", 33, False)])
def test_pattern_in_backing_files_and_across_boots(boot, tmp_path, name, seed, reboot):
    topo = load(name)
    region = topo.regions[0]
    run_dir = tmp_path / "run"

    first = boot(name, run_dir=run_dir, vm_name="first")
    wrote = daxio(first, f"fill /dev/dax0.0 --size {SIZE} --seed {seed}")
    assert wrote["status"] == 0 and wrote["size"] == SIZE
    first.close()

    expected = pattern.pattern_bytes(seed, 0, SIZE)
    assert int(wrote["crc32"], 16) == zlib.crc32(expected)

    backing = qemu.backing_paths(topo, run_dir)
    on_host = read_region_from_backing(topo, region, backing, SIZE)
    assert on_host == expected, "backing files do not hold the pattern where the topology predicts"
    if region.ways > 1:
        # The pattern embeds each word's offset, so a wrong mapping cannot pass: granule 1 of the
        # region is the first granule of the second device, not the second granule of the first.
        g = region.granularity
        with open(backing[region.devices[1]], "rb") as f:
            assert f.read(g) == expected[g:2 * g]
        with open(backing[region.devices[0]], "rb") as f:
            f.seek(g)
            assert f.read(g) == expected[region.ways * g:(region.ways + 1) * g]

    if not reboot:
        return
    second = boot(name, run_dir=run_dir, vm_name="second")
    check = daxio(second, f"verify /dev/dax0.0 --size {SIZE} --seed {seed}")
    assert check["status"] == 0 and check["mismatches"] == 0, check
    assert check["crc32"] == wrote["crc32"]
