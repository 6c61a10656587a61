"""CXL error injection (Machine.inject, pfcxl inject): every kind QEMU 10 offers for a Type 3 device
reaches the guest's CXL subsystem, which records it with the fields that were injected; bad
arguments inject nothing."""

from __future__ import annotations

import json
import subprocess

import pytest

from pfcxl import Machine
from pfcxl.errors import PfcxlError
from pfcxl.host_tools.cli import main as cli

from .conftest import READY_TIMEOUT, pfcxl_cli

pytestmark = pytest.mark.integration


def test_every_kind_is_seen_by_the_guest_with_the_injected_fields(tmp_path):
    with Machine("two-hb-interleave", run_dir=tmp_path / "run", ready_timeout=READY_TIMEOUT) as m:
        second = m.topology.devices[1]
        # poison, by the topology's name: the guest's poison list of that device (matched by serial)
        done = m.inject("poison", second.id, dpa=0x3000, length=192, expect=True)
        [entry] = [json.loads(r) for r in done["guest"]]
        assert (entry["offset"], entry["length"], entry["serial"]) == (0x3000, 192, second.serial)
        # event records: the kernel's trace event with the injected log, type and DPA
        gm = m.inject("general-media", second.id, dpa=0x8040, log="failure", type=0x10, transaction_type=2,
                      expect=True)["guest"]
        assert len(gm) == 1 and " dpa=8040 " in gm[0] and " log=Failure " in gm[0] and "type='0x10'" in gm[0]
        assert f"serial={second.serial} " in gm[0] and "transaction_type='Host Write'" in gm[0]
        dram = m.inject("dram", second.id, dpa=0x100, log="warning", type=1, expect=True)["guest"]
        assert len(dram) == 1 and " dpa=100 " in dram[0] and " log=Warning " in dram[0]
        assert "type='Scrub Media ECC Error'" in dram[0]
        module = m.inject("memory-module", second.id, log="fatal", life_used=42, temperature=71, expect=True)["guest"]
        assert len(module) == 1 and " life_used=42 " in module[0] and " device_temp=71 " in module[0]
        assert " log=Fatal " in module[0]
        # nothing injected for bad arguments: the poison list is unchanged
        for bad in ({"dpa": second.capacity}, {"dpa": 0x40, "length": 100}):
            with pytest.raises(PfcxlError):
                m.inject("poison", second.id, **bad)
        with pytest.raises(PfcxlError, match="has no device 'nosuch'"):
            m.inject("poison", "nosuch")
        listing = json.loads(m.check("cxl list -M -L"))
        [mine] = [d for d in listing if d["serial"] == second.serial]
        assert [(e["offset"], e["length"]) for e in mine["media_errors"]] == [(0x3000, 192)]
        others = [d for d in listing if d["serial"] != second.serial]
        assert others and all(not d.get("media_errors") for d in others)


def in_process(capfd, *argv: str) -> subprocess.CompletedProcess:
    """`pfcxl ARGV` run by this process (a new one per call costs a Python start and pfcxl's imports)."""
    capfd.readouterr()
    status = cli.main(list(argv))
    out = capfd.readouterr()
    return subprocess.CompletedProcess(argv, status, out.out, out.err)


def test_pfcxl_inject_on_an_up_machine_prints_the_guests_record(tmp_path, capfd, machine_name):
    name = machine_name("inject")        # not a fixed name: two runs at once each keep their own up
    up = pfcxl_cli("up", "-t", "pf-nic", "--name", name, timeout=900)
    try:
        assert up.returncode == 0, up.stderr
        done = in_process(capfd, "inject", "dram", "--name", name, "--device", "pfnic0", "--dpa", "0x2000",
                          "--log", "failure", "--expect")
        assert done.returncode == 0, done.stderr
        assert " cxl_dram: " in done.stdout and " dpa=2000 " in done.stdout and " log=Failure " in done.stdout
        bad = in_process(capfd, "inject", "poison", "--name", name, "--device", "pfnic0", "--dpa", "0x40",
                         "--length", "65")
        assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "not a multiple of 64" in bad.stderr
        listed = in_process(capfd, "exec", name, "--", "cxl list -M -L")
        assert listed.returncode == 0 and '"memdev"' in listed.stdout, listed
        assert "media_errors" not in listed.stdout
        # RAS errors: the kernel's AER trace event for the device with the error's status, and its AER messages
        cor = in_process(capfd, "inject", "correctable", "--name", name, "-d", "pfnic0", "--type", "mem-data-ecc",
                         "--expect")
        assert cor.returncode == 0, cor.stderr
        assert "cxl_aer_correctable_error: memdev=" in cor.stdout and "status: 'Memory Data ECC Error'" in cor.stdout
        assert "CorrIntErr" in cor.stdout
        # an uncorrectable error makes the kernel reset the link and recover the device
        unc = in_process(capfd, "inject", "uncorrectable", "--name", name, "-d", "pfnic0", "--type", "internal",
                         "--expect")
        assert unc.returncode == 0, unc.stderr
        assert "cxl_aer_uncorrectable_error: memdev=" in unc.stdout
        assert "status: 'Component Specific Error'" in unc.stdout and "Uncorrectable" in unc.stdout
    finally:
        pfcxl_cli("down", name)
