"""The commands people run many times an hour (`pfcxl exec`, `ps`, `down`, `--help`) start without the
heavy modules: numpy, jinja2, QMP (asyncio), pyelftools, the Machine and the rich table/progress
modules are imported by the commands that use them (host_tools/cli/main.py). Each case runs the CLI in a
fresh interpreter and reads sys.modules afterwards: what a command imported, not how long it took."""

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("numpy", "jinja2", "qemu.qmp", "asyncio", "elftools", "matplotlib", "pfcxl.machine",
         "pfcxl.host_tools.vm.host", "pfcxl.host_tools.image_build", "pfcxl.serving.sim", "rich.progress")

PROBE = """
import json, sys
from pfcxl.host_tools.cli import main as cli
try:
    status = cli.main(sys.argv[1:])
except SystemExit as exc:        # --help
    status = exc.code
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""

pytestmark = pytest.mark.component


def imported(tmp_path, *argv: str) -> tuple[int, set[str], str]:
    env = {**os.environ, "PFCXL_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env,
                          timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["status"], set(report["modules"]), done.stderr


@pytest.mark.parametrize("argv", [["exec", "nosuch", "--", "true"], ["ps"], ["down", "--all"], ["--help"],
                                  ["exec", "--help"]])
def test_light_commands_import_no_heavy_module(tmp_path, argv):
    status, modules, _ = imported(tmp_path, *argv)
    assert status in (0, None) or argv[0] == "exec"
    assert sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY) == []


# what no command needs to be parsed: the table code, the image builder, the plugin's configuration,
# the appliance client, pexpect and rich's tables are imported by the commands that use them
NOT_FOR_THE_PARSER = HEAVY + ("pexpect", "rich.table", "pfcxl.firmware_tables.boot_policy", "pfcxl.firmware_tables.cedt",
                              "pfcxl.host_tools.image.initramfs", "pfcxl.host_tools.timing.config",
                              "pfcxl.host_tools.timing.telemetry_view", "pfcxl.host_tools.appliance_client",
                              "pfcxl.host_tools.vm.console")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["down", "--all"]])
def test_building_the_parser_imports_no_command_module(tmp_path, argv):
    status, modules, _ = imported(tmp_path, *argv)
    assert status in (0, None)
    assert sorted(m for m in modules if m in NOT_FOR_THE_PARSER or m.split(".")[0] in NOT_FOR_THE_PARSER) == []


def test_exec_of_a_missing_machine_still_says_so_in_one_line(tmp_path):
    status, _, stderr = imported(tmp_path, "exec", "nosuch", "--", "true")
    assert status != 0
    assert stderr.strip().count("\n") == 0 and "nosuch" in stderr


def test_a_command_that_needs_them_still_gets_them(tmp_path):
    # the lazy imports are real imports, made when the command runs
    status, modules, _ = imported(tmp_path, "topology", "show", "pf-nic")
    assert status == 0
    assert {"rich.table", "pfcxl.device.topology.address_map"} <= modules
