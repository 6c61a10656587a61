"""One frozen set of boot options (host_tools/vm/boot_options.py): every option of a boot command is
in it or named as one that does not change the guest; each one given reaches the options and the
--reuse key; `up` and `run --reuse` build the same options from the same flags; Machine's keywords
and BootOptions are the same thing."""

import argparse
import dataclasses

import pytest

from pfcxl.device import topology
from pfcxl.errors import PfcxlError
from pfcxl.host_tools.cli import main as cli
from pfcxl.host_tools.vm.boot_options import FIELD_OF_DEST, NOT_BOOT_OPTIONS, BootOptions, from_args

pytestmark = pytest.mark.unit

BOOT_COMMANDS = ("run", "boot", "up", "demo", "bench", "multihost", "qemu-args")
FIELDS = {f.name for f in dataclasses.fields(BootOptions)}
TAIL = {"run": ["--", "true"], "multihost": ["-n", "2", "--", "true"]}   # what a command needs besides


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _options(command: str):
    """(flag, dest) of every option of `command` but --help."""
    for action in _subparser(command)._actions:
        if action.dest != "help" and not isinstance(action, argparse._SubParsersAction):
            yield (action.option_strings[0] if action.option_strings else None), action


def _is_boot_option(command: str, dest: str) -> bool:
    return FIELD_OF_DEST.get(dest, dest) in FIELDS and dest not in NOT_BOOT_OPTIONS.get(command, {})


def _parse(command: str, extra: list[str]) -> argparse.Namespace:
    args = cli.parser().parse_args([command, *extra, *TAIL.get(command, [])])
    return args


def _other_value(action: argparse.Action) -> list[str]:
    """Command-line words giving `action` a value other than its default."""
    flag = action.option_strings[0]
    if action.nargs == 0:                                   # store_true
        return [flag]
    if action.choices:
        return [flag, next(str(c) for c in action.choices if c != action.default)]
    if action.metavar == "NAME=VALUE":                      # --fabric-param: a parameter that exists
        return [flag, "port_mbs=12800"]
    if action.type is int:
        return [flag, "3"]
    if action.type is not None:                             # floats, seconds
        return [flag, "2.5"]
    return [f"{flag}=some/path-or-text"]


@pytest.mark.parametrize("command", BOOT_COMMANDS)
def test_every_option_of_a_boot_command_is_a_boot_option_or_named_as_not_one(command):
    unknown = [flag or action.dest for flag, action in _options(command)
               if not _is_boot_option(command, action.dest)
               and action.dest not in NOT_BOOT_OPTIONS["*"] and action.dest not in NOT_BOOT_OPTIONS.get(command, {})]
    assert unknown == [], (f"pfcxl {command}: {unknown} are neither BootOptions fields nor in "
                           "NOT_BOOT_OPTIONS (host_tools/vm/boot_options.py): add each where it belongs")


@pytest.mark.parametrize("command", BOOT_COMMANDS)
def test_each_boot_option_given_reaches_the_options_and_the_reuse_key(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = topology.resolve("pf-nic")
    plain = from_args(_parse(command, []))
    boot = [(flag, action) for flag, action in _options(command) if flag and _is_boot_option(command, action.dest)]
    assert boot, f"pfcxl {command} has no boot options"
    for flag, action in boot:
        given = from_args(_parse(command, _other_value(action)))
        name = FIELD_OF_DEST.get(action.dest, action.dest)
        assert getattr(given, name) != getattr(plain, name), (command, flag)
        assert dataclasses.replace(given, **{name: getattr(plain, name)}) == plain, (command, flag)
        assert given.key(path) != plain.key(path), (command, flag)


def test_options_that_are_not_the_machines_leave_the_reuse_key_alone(tmp_path):
    path = topology.resolve("pf-nic")
    key = from_args(_parse("run", ["--reuse"])).key(path)
    for extra in (["--timeout", "5"], ["--command-timeout", "9"], ["--keep"], ["--report", "r.json"],
                  ["--trace-out", "t.npy"], ["--dry-run"]):
        assert from_args(_parse("run", ["--reuse", *extra])).key(path) == key, extra


def test_run_reuse_matches_only_an_up_machine_booted_with_the_same_options(tmp_path, monkeypatch):
    # `run --reuse` took a kept-up machine booted with another --issue mode (and, before that was
    # fixed, another --data-path): the reuse key left them out. Each flag of `run` that is a boot
    # option and that `up` also takes: equal given to both, different when only one has it.
    monkeypatch.chdir(tmp_path)
    path = topology.resolve("pf-nic")
    up_flags = {flag: action for flag, action in _options("up") if flag and _is_boot_option("up", action.dest)}
    run_flags = [(flag, action) for flag, action in _options("run") if flag and _is_boot_option("run", action.dest)]
    assert {"--data-path", "--issue", "--run-dir"} <= {flag for flag, _ in run_flags}
    for flag, action in run_flags:
        words = _other_value(action)
        reused = from_args(_parse("run", ["--reuse", *words])).key(path)
        assert from_args(_parse("up", [])).key(path) != reused, flag
        if flag in up_flags:
            assert from_args(_parse("up", words)).key(path) == reused, flag
    assert from_args(_parse("up", [])).key(path) == from_args(_parse("run", ["--reuse"])).key(path)


def test_the_reuse_key_follows_the_topology_files_bytes(tmp_path):
    path = topology.resolve("pf-nic")
    key = BootOptions().key(path)
    copy = tmp_path / "copy.toml"
    copy.write_bytes(path.read_bytes())
    assert BootOptions().key(copy) == key                 # same content, another file: same
    copy.write_bytes(path.read_bytes() + b"\n# edited\n")
    assert BootOptions().key(copy) != key


def test_options_survive_the_kept_up_machines_request_file(tmp_path):
    options = BootOptions(timing="inject", baseline_ns=3.5, issue="independent", image="debian", host=2,
                          appliance="app", cedt="ours", append="quiet", lean=False, data_path="both",
                          qemu="/opt/q", qemu_args=("-name", "x"), kernel="k", modules="m", run_dir="r",
                          packages=("numactl", "strace"))
    import json
    again = BootOptions.from_dict(json.loads(json.dumps(options.as_dict())))
    assert again == options and again.key(topology.resolve("pf-nic")) == options.key(topology.resolve("pf-nic"))
    assert options.appliance == str(tmp_path.cwd() / "app")        # paths absolute: a daemon elsewhere agrees
    assert options.kernel == str(tmp_path.cwd() / "k") and options.run_dir == str(tmp_path.cwd() / "r")
    assert [line.split()[0] for line in options.lines()] == [f.name for f in dataclasses.fields(BootOptions)]


def test_machine_keywords_and_boot_options_are_one_thing(tmp_path):
    from pfcxl.machine import Machine
    by_keywords = Machine("pf-nic", data_path="direct", issue="independent", append="quiet", lean=False,
                          run_dir=tmp_path, cedt="ours", image="debian", host=1)
    options = BootOptions(data_path="direct", issue="independent", append="quiet", lean=False,
                          run_dir=str(tmp_path), cedt="ours", image="debian", host=1)
    assert by_keywords.options == options
    by_options = Machine("pf-nic", options=options)
    assert (by_options.options, by_options.lean, by_options.append, by_options.issue) == (options, False, "quiet",
                                                                                           "independent")
    assert by_options.topology.guest.data_path == "direct" and by_options.run_dir_arg == tmp_path
    with pytest.raises(PfcxlError, match="give the boot options once"):
        Machine("pf-nic", options=options, append="other")
    with pytest.raises(PfcxlError, match="issue 'sideways' is not one of dependent, independent"):
        Machine("pf-nic", issue="sideways")


def test_the_calibration_guest_boots_with_the_machines_own_options(tmp_path, monkeypatch):
    # inject without a baseline boots a count-mode guest first; it left out append and lean
    # (and so booted another kernel command line than the guest it measured for)
    from pfcxl import machine as machine_mod
    m = machine_mod.Machine("pf-nic", timing="inject", append="quiet", lean=False, data_path="direct",
                            qemu_args=["-name", "x"], image="debian", cedt="ours")
    m.run_dir = tmp_path
    probes = []
    monkeypatch.setattr(machine_mod.Machine, "__enter__", lambda self: probes.append(self) or self)
    monkeypatch.setattr(machine_mod.Machine, "__exit__", lambda self, *exc: None)
    monkeypatch.setattr(machine_mod.calibration, "calibrate_baseline", lambda probe: {"baseline_ns": 7.0})
    assert m._measure_baseline() == 7.0
    [probe] = probes
    assert probe.options == dataclasses.replace(m.options, timing="count", run_dir=str(tmp_path / "calibrate"))
    assert (probe.append, probe.lean, probe.topology.guest.data_path) == ("quiet", False, "direct")


@pytest.mark.parametrize("arg", ["-daemonize", "--daemonize"])
def test_a_qemu_argument_that_detaches_qemu_is_refused_in_one_line(arg, capsys, monkeypatch):
    from pfcxl.errors import PfcxlError
    from pfcxl.host_tools.cli import main as cli
    from pfcxl.machine import Machine
    with pytest.raises(PfcxlError, match=f"^--qemu-arg {arg}: QEMU would fork into the background"):
        BootOptions(qemu_args=("-name", "x", arg))
    monkeypatch.setattr(Machine, "launch", lambda self: pytest.fail("QEMU was started"))
    for command in (["run", "--dry-run", f"--qemu-arg={arg}", "--", "true"], ["up", f"--qemu-arg={arg}"],
                    ["qemu-args", f"--qemu-arg={arg}"]):
        assert cli.main(command) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"--qemu-arg {arg}: QEMU would fork" in err, err
    assert BootOptions(qemu_args=("-name", "daemonize")).qemu_args == ("-name", "daemonize")   # a value, not the option
