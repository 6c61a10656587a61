"""Each boot option is defined once (host_tools/vm/boot_options.py): its field holds its default and
its command-line option, the parser's boot options are generated from the fields, Machine takes the
same fields as keywords, and its constructor starts, probes and downloads nothing. One timeout
default per kind of wait (host_tools/timeouts.py)."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

import pfcxl
from pfcxl.errors import PfcxlError
from pfcxl.host_tools import timeouts
from pfcxl.host_tools.cli import main as cli
from pfcxl.host_tools.vm import boot_options
from pfcxl.host_tools.vm.boot_options import FIELD_OF_DEST, NOT_BOOT_OPTIONS, BootOptions

pytestmark = pytest.mark.unit

FIELDS = {f.name: f for f in dataclasses.fields(BootOptions)}
REPO = Path(pfcxl.__file__).resolve().parent.parent


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    """(command path, its parser) for every subcommand, nested ones too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + name, sub
                yield from _commands(sub, prefix + name + " ")


def _field_actions():
    """(command, action, field name) of every option of a command that offers boot options (one
    generated from a field, at least) whose parsed name is a field's and that the command does not
    declare as meaning something else there (NOT_BOOT_OPTIONS)."""
    for command, sub in _commands(cli.parser()):
        if not any(hasattr(a, "boot_field") for a in sub._actions):
            continue
        own = NOT_BOOT_OPTIONS.get(command, {})
        for action in sub._actions:
            name = FIELD_OF_DEST.get(action.dest, action.dest)
            if action.option_strings and name in FIELDS and action.dest not in own and action.dest != "help":
                yield command, action, name


def test_every_field_has_one_command_line_option_or_says_why_not():
    for name, f in FIELDS.items():
        assert ("flag" in f.metadata) != ("api_only" in f.metadata), name
        if "flag" in f.metadata:
            assert f.metadata["flag"].help, name


def test_the_parsers_boot_options_are_generated_from_the_fields():
    found = list(_field_actions())
    assert {name for _, _, name in found} == {n for n, f in FIELDS.items() if "flag" in f.metadata}
    by_hand = [f"pfcxl {command} {action.option_strings[0]}" for command, action, name in found
               if getattr(action, "boot_field", None) != name]
    assert by_hand == [], ("boot options written by hand instead of boot_options.add_arguments (or named in "
                           f"NOT_BOOT_OPTIONS as meaning something else there): {by_hand}")


def test_a_generated_option_has_its_fields_default_and_choices_and_says_the_default():
    for command, action, name in _field_actions():
        f, flag = FIELDS[name], FIELDS[name].metadata["flag"]
        assert action.default == ([] if flag.repeat else f.default), (command, name)
        assert (tuple(action.choices) if action.choices else None) == flag.choices, (command, name)
        if f.default not in (None, "", ()):
            assert f"(default {f.default})" in action.help, (command, name)


def test_the_boot_commands_are_the_ones_checked():
    checked = {command for command, _, _ in _field_actions()}
    assert {"run", "boot", "up", "demo", "bench", "multihost", "qemu-args", "image", "kv replay"} <= checked


def test_the_generator_catches_an_option_written_by_hand():
    p = argparse.ArgumentParser()
    boot_options.add_arguments(p, ("image",))
    p.add_argument("--cedt", choices=("auto", "ours"), default="auto")
    marked = {a.dest: getattr(a, "boot_field", None) for a in p._actions}
    assert marked["image"] == "image" and marked["cedt"] is None


def test_choices_come_from_their_one_definition():
    from pfcxl.device.fabric.modes import ISSUES
    from pfcxl.host_tools.image import IMAGE_KINDS
    from pfcxl.host_tools.timing import MODES
    assert FIELDS["issue"].metadata["flag"].choices is ISSUES
    assert FIELDS["image"].metadata["flag"].choices is IMAGE_KINDS
    assert FIELDS["timing"].metadata["flag"].choices is MODES
    with pytest.raises(PfcxlError, match="image 'alpine' is not one of busybox, debian"):
        BootOptions(image="alpine")


def test_machine_takes_the_fields_as_keywords_and_refuses_other_names():
    m = pfcxl.Machine("pf-nic", image="debian", issue="independent", fabric_params=["port_mbs=12800"])
    assert m.options == BootOptions(image="debian", issue="independent", fabric_params=("port_mbs=12800",))
    with pytest.raises(PfcxlError, match="imgae: not a boot option"):
        pfcxl.Machine("pf-nic", imgae="debian")
    with pytest.raises(PfcxlError, match="give the boot options once"):
        pfcxl.Machine("pf-nic", options=BootOptions(), image="debian")


def test_the_machine_constructor_probes_and_downloads_nothing(tmp_path, monkeypatch):
    # a QEMU of one's own and a Debian kernel package: the version probe (a process) and the
    # download happen in resolve(), which plan() and launch() call, once. (Starting a process here
    # would also fail this unit test at teardown: tests/conftest.py counts them.)
    from pfcxl.host_tools.image import kernel_package
    from pfcxl.host_tools.vm import qemu_binary
    calls: list[str] = []
    monkeypatch.setattr(qemu_binary, "version", lambda path, timeout: calls.append("version") or "10.0.2")
    monkeypatch.setattr(kernel_package, "kernel", lambda version, say: calls.append("download") or "kernel")
    qemu = tmp_path / "qemu"
    qemu.write_text("#!/bin/sh\n")
    m = pfcxl.Machine("pf-nic", qemu=str(qemu), kernel_package="6.12.117")
    assert calls == [] and m.qemu is None and m.own_kernel is None
    m.resolve()
    m.resolve()
    assert calls == ["version", "download"]
    assert (m.qemu, m.qemu_version, m.own_kernel) == (str(qemu), "10.0.2", "kernel")


def _timeout_defaults(function) -> dict[str, object]:
    return {name: p.default for name, p in inspect.signature(function).parameters.items() if "timeout" in name}


def test_one_default_per_kind_of_wait():
    from pfcxl.host_tools.fleet import multihost
    from pfcxl.host_tools.vm.host import VM
    for run in (VM.run, VM.start_command, VM.finish_command, VM.check, pfcxl.Machine.run, pfcxl.Machine.check,
                pfcxl.Machine.traced_run, pfcxl.Machine.finish_command):
        assert _timeout_defaults(run) == {"timeout": timeouts.COMMAND_S}, run
    assert _timeout_defaults(pfcxl.Machine)["ready_timeout"] == timeouts.READY_S
    assert _timeout_defaults(multihost.run) == {"ready_timeout": timeouts.FLEET_READY_S,
                                                "command_timeout": timeouts.FLEET_COMMAND_S}
    commands = dict(_commands(cli.parser()))
    for command, dest, value in (("run", "command_timeout", timeouts.COMMAND_S),
                                 ("exec", "command_timeout", timeouts.COMMAND_S),
                                 ("run", "timeout", timeouts.READY_S), ("up", "timeout", timeouts.READY_S),
                                 ("bench", "timeout", timeouts.READY_S),
                                 ("multihost", "timeout", timeouts.FLEET_READY_S),
                                 ("multihost", "command_timeout", timeouts.FLEET_COMMAND_S)):
        assert commands[command].get_default(dest) == value, (command, dest)


def _literal_timeout_defaults(tree: ast.AST) -> list[str]:
    """Parameters named *timeout* whose default is a number written in place."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            named = a.posonlyargs + a.args
            pairs = list(zip(named[len(named) - len(a.defaults):], a.defaults)) + \
                [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            found += [f"{node.name}({arg.arg}={d.value})" for arg, d in pairs
                      if "timeout" in arg.arg and isinstance(d, ast.Constant) and isinstance(d.value, (int, float))]
    return found


def test_the_vm_and_machine_signatures_write_no_timeout_number():
    assert _literal_timeout_defaults(ast.parse("def f(x, timeout=5): pass")) == ["f(timeout=5)"]
    for path in ("pfcxl/machine.py", "host_tools/vm/host.py", "host_tools/fleet/multihost.py",
                 "host_tools/vm/inject.py"):
        assert _literal_timeout_defaults(ast.parse((REPO / path).read_text())) == [], path
