"""The pool's pure arithmetic: which module serves an offset, and how many bytes of a range each
module serves (checked against a granule-by-granule count)."""

import os
import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfcxl.device.appliance.crc_zeros import crc32_zeros
from pfcxl.device.appliance.pool import Pool, bytes_per_module, where
from pfcxl.device.topology.model import Appliance
from pfcxl.device.topology.units import KiB, MiB
from pfcxl.errors import ApplianceError

SMALL = Appliance(modules=4, module_capacity=256 * MiB, hbm_cache=0, ports=2, granularity=4 * KiB,
                  shared=256 * MiB, private=256 * MiB, backing="memfd")
POOL_END = SMALL.shared + SMALL.ports * SMALL.private

pytestmark = pytest.mark.unit


def appliance(modules: int, granularity: int, shared: int = 256 * MiB, private: int = 256 * MiB,
              ports: int = 2) -> Appliance:
    return Appliance(modules=modules, module_capacity=1 << 40, hbm_cache=0, ports=ports,
                     granularity=granularity, shared=shared, private=private, backing="memfd")


@pytest.mark.parametrize("offset,module,module_offset,region,region_offset", [
    (0, 0, 0, "shared", 0),
    (4095, 0, 4095, "shared", 4095),
    (4096, 1, 0, "shared", 4096),
    (3 * 4096 + 7, 3, 7, "shared", 3 * 4096 + 7),
    (4 * 4096 + 7, 0, 4096 + 7, "shared", 4 * 4096 + 7),        # the rotation wraps to module 0
    (9 * 4096 + 1, 1, 2 * 4096 + 1, "shared", 9 * 4096 + 1),
    (256 * MiB - 1, 3, 64 * MiB - 1, "shared", 256 * MiB - 1),
    (256 * MiB, 0, 64 * MiB, "private/0", 0),                      # private slot 0 starts here
    (256 * MiB + 4096 + 5, 1, 64 * MiB + 5, "private/0", 4096 + 5),
    (512 * MiB - 1, 3, 128 * MiB - 1, "private/0", 256 * MiB - 1),
    (512 * MiB + 123, 0, 128 * MiB + 123, "private/1", 123),
    (POOL_END - 1, 3, 192 * MiB - 1, "private/1", 256 * MiB - 1),
])
def test_where_names_module_and_region(offset, module, module_offset, region, region_offset):
    assert where(SMALL, offset) == {"offset": offset, "module": module, "module_offset": module_offset,
                                    "region": region, "region_offset": region_offset}


@pytest.mark.parametrize("offset,message", [
    (-1, r"pool offset -1 is negative: offsets run from 0 to 0x2fffffff"),
    (POOL_END, r"outside the pool's 0x30000000 mapped bytes"),
    (POOL_END + 4096, r"outside the pool's 0x30000000 mapped bytes"),
    (1 << 70, r"outside the pool's 0x30000000 mapped bytes")])
def test_where_refuses_offsets_outside_the_pool(offset, message):
    with pytest.raises(ApplianceError, match=message):
        where(SMALL, offset)


def test_where_without_private_regions():
    shared_only = appliance(modules=3, granularity=64, private=0)
    assert where(shared_only, 64 * 4)["module"] == 1
    with pytest.raises(ApplianceError, match="outside"):
        where(shared_only, shared_only.shared)


@settings(max_examples=300, deadline=None)
@given(modules=st.integers(1, 16), g_log=st.integers(6, 16), data=st.data())
def test_where_is_a_rotation_at_the_granularity(modules, g_log, data):
    a = appliance(modules, 1 << g_log)
    g = a.granularity
    offset = data.draw(st.integers(0, a.shared + a.ports * a.private - 1))
    w = where(a, offset)
    assert w["module"] == (offset // g) % modules
    # (module, module offset) names the byte back: the interleave is a bijection
    assert ((w["module_offset"] // g) * modules + w["module"]) * g + w["module_offset"] % g == offset
    if offset < a.shared:
        assert (w["region"], w["region_offset"]) == ("shared", offset)
    else:
        slot = (offset - a.shared) // a.private
        assert w["region"] == f"private/{slot}"
        assert w["region_offset"] == offset - a.shared - slot * a.private


def brute_force(a: Appliance, start: int, size: int) -> list[int]:
    """Bytes per module, one granule at a time."""
    g, out = a.granularity, [0] * a.modules
    granule = start // g
    while granule * g < start + size:
        lo, hi = max(start, granule * g), min(start + size, (granule + 1) * g)
        out[granule % a.modules] += hi - lo
        granule += 1
    return out


@settings(max_examples=500, deadline=None)
@given(modules=st.integers(1, 9), g_log=st.integers(6, 12), start=st.integers(0, 1 << 18),
       size=st.integers(0, 1 << 18))
def test_bytes_per_module_matches_a_granule_count(modules, g_log, start, size):
    a = appliance(modules, 1 << g_log)
    counted = bytes_per_module(a, start, size)
    assert counted == brute_force(a, start, size)
    assert sum(counted) == size
    assert all(n >= 0 for n in counted)


@pytest.mark.parametrize("start,size,expected", [
    (0, 0, [0, 0, 0, 0]),
    (0, 4096, [4096, 0, 0, 0]),
    (4095, 2, [1, 1, 0, 0]),
    (0, 16 * 4096, [4 * 4096] * 4),
    (256 * MiB, 256 * MiB, [64 * MiB] * 4),               # a private region spreads evenly
    (3 * 4096 + 10, 4096, [10, 0, 0, 4086]),
])
def test_bytes_per_module_examples(start, size, expected):
    assert bytes_per_module(SMALL, start, size) == expected


@pytest.mark.parametrize("length", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 1 << 20, (4 << 20) + 17])
@pytest.mark.parametrize("crc", [0, 1, 0xDEADBEEF, 0xFFFF_FFFF])
def test_crc_over_zeros_is_zlibs(length, crc):
    assert crc32_zeros(length, crc) == zlib.crc32(bytes(length), crc)


def test_checksums_read_only_the_data_and_equal_a_full_read():
    """Scattered writes (unaligned, across pages, at partition ends) in sparse partitions: the
    checksums that skip holes equal zlib over every byte, partition by partition and chained."""
    small = appliance(4, 4 * KiB, shared=8 * MiB, private=4 * MiB)
    rng = random.Random(5)
    with Pool(small, None) as pool:
        for p in pool.partitions:
            for offset in [0, p.size - 3, *(rng.randrange(p.size - 9000) for _ in range(6))]:
                os.pwrite(p.fd, rng.randbytes(min(9000, p.size - offset)), offset)
        got = pool.checksums()
        total = 0
        for p in pool.partitions:
            data = os.pread(p.fd, p.size, 0)
            assert got[p.name] == f"{zlib.crc32(data):#010x}", p.name
            total = zlib.crc32(data, total)
        assert got["pool"] == f"{total:#010x}"
