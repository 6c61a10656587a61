"""Hostile but realistic inputs (issues 10 and 11): odd table files, odd topology files, names used
as paths. Each gets one clear line, or the work it asked for, never a traceback or a hang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pfcxl.device import fabric_constants, topology
from pfcxl.firmware_tables import acpi, cdat, cedt
from pfcxl.firmware_tables.layout import MAX_TABLE_BYTES, MAX_VIOLATIONS_SHOWN


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli", *args], capture_output=True,
                          text=True, env=env)


def _cedt() -> bytes:
    return cedt.from_topology(topology.load(topology.resolve("pf-nic")))


def _acpi_table(signature: str, body: bytes = bytes(16)) -> bytes:
    return acpi.finish({"signature": signature, "revision": 1, **acpi.QEMU_IDS}, body)


# ------------------------------------------------------------------------------ tables decode


def test_as_cdat_forces_cdat_decoding_of_an_acpi_looking_file(tmp_path):
    f = tmp_path / "facp.bin"
    f.write_bytes(_acpi_table("FACP"))
    refused = _cli("tables", "decode", str(f))
    assert refused.returncode == 1 and "not a CEDT" in refused.stderr and "== " not in refused.stdout
    forced = _cli("tables", "decode", str(f), "--as", "cdat")
    assert "CDAT (Coherent Device Attribute Table)" in forced.stdout, forced.stderr
    assert forced.returncode == 1 and "Violations: 0" not in forced.stdout


def test_as_is_accepted_between_decode_and_the_files(tmp_path):
    f = tmp_path / "t.cdat"
    f.write_bytes(cdat.build(cdat.device_entries(256 << 20, fabric_constants.PF_MODULE)))
    done = _cli("tables", "decode", "--as", "cdat", str(f))
    assert done.returncode == 0, done.stderr
    assert "CDAT (Coherent Device Attribute Table)" in done.stdout and "Violations: 0" in done.stdout


def test_one_bad_file_does_not_stop_the_next(tmp_path):
    missing = tmp_path / "missing.dat"
    refused = tmp_path / "dbg2.dat"
    refused.write_bytes(_acpi_table("DBG2"))
    good = tmp_path / "CEDT.dat"
    good.write_bytes(_cedt())
    done = _cli("tables", "decode", str(missing), str(refused), str(good))
    assert done.returncode == 1
    assert f"== {good}" in done.stdout and "Violations: 0" in done.stdout
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 2 and str(missing) in errors[0] and str(refused) in errors[1], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("signature", ["DBG2", "TPM2", "SSDT", "WSMT"])
def test_acpi_signatures_with_digits_are_not_taken_for_a_cdat(tmp_path, signature):
    f = tmp_path / "t.dat"
    f.write_bytes(_acpi_table(signature))
    done = _cli("tables", "decode", str(f))
    assert done.returncode == 1 and "CDAT (" not in done.stdout
    assert f"'{signature}'" in done.stderr and "not a CEDT" in done.stderr


def test_a_tiny_file_is_too_short_not_a_c_table(tmp_path):
    f = tmp_path / "c.bin"
    f.write_bytes(b"C")
    done = _cli("tables", "decode", str(f))
    assert done.returncode == 1 and "'C' table" not in done.stderr
    assert "1 byte" in done.stderr and "too short" in done.stderr, done.stderr


def test_decoding_dev_zero_stops_at_the_size_cap():
    done = subprocess.run([sys.executable, "-m", "pfcxl.host_tools.cli", "tables", "decode", "/dev/zero"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "larger than" in done.stderr and "/dev/zero" in done.stderr


def test_an_oversized_file_is_refused_and_the_rest_decoded(tmp_path):
    big = tmp_path / "big.dat"
    big.write_bytes(_cedt() + bytes(MAX_TABLE_BYTES))
    good = tmp_path / "CEDT.dat"
    good.write_bytes(_cedt())
    done = _cli("tables", "decode", str(big), str(good))
    assert done.returncode == 1 and f"== {good}" in done.stdout and f"== {big}" not in done.stdout
    assert str(big) in done.stderr and "larger than" in done.stderr


def test_a_file_of_tiny_subtables_lists_a_bounded_summary(tmp_path):
    # The largest file accepted, every 4 bytes an unknown subtable: one violation each.
    count = (MAX_TABLE_BYTES - acpi.HEADER.size) // 4
    body = bytes([9, 0, 4, 0]) * count
    f = tmp_path / "tiny.dat"
    f.write_bytes(acpi.finish({"signature": "CEDT", "revision": 1, **acpi.QEMU_IDS}, body))
    assert f.stat().st_size <= MAX_TABLE_BYTES
    done = _cli("tables", "decode", str(f))
    assert done.returncode == 1, done.stderr
    listed = [line for line in done.stdout.splitlines() if line.startswith("  - ")]
    assert len(listed) == MAX_VIOLATIONS_SHOWN
    assert f"Violations: {count}" in done.stdout
    assert f"... and {count - MAX_VIOLATIONS_SHOWN} more" in done.stdout
    assert len(done.stdout) < 64 * 1024
