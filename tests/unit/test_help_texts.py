"""Every command and option of `pfcxl` says what it is for: a walk over the whole argparse tree
(not a grep of the sources) fails on a subcommand without a one-line help or a --help
description, on an option or positional without help text, on a description that still shows
a %% escape, and on a subcommand whose --help lists options it does not use."""

from __future__ import annotations

import argparse
import io

import pytest

from pfcxl.host_tools.cli import main as cli

pytestmark = pytest.mark.unit


def commands(ap: argparse.ArgumentParser, path=("pfcxl",)):
    """(path, parser, its one-line help in the parent's list) for every command, depth first."""
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if name in helps:            # aliases share the parser; walk it under its name
                    yield path + (name,), sub, helps[name]
                    yield from commands(sub, path + (name,))


ALL = list(commands(cli.parser()))
IDS = [" ".join(p[1:]) for p, _, _ in ALL]


def test_the_walk_finds_the_whole_tree():
    names = set(IDS)
    for expected in ("boot", "image", "demo", "ps", "down", "topology show", "topology check", "appliance stop",
                     "appliance stats", "appliance where", "bench", "bench compare", "model curve", "kv bench"):
        assert expected in names, expected


@pytest.mark.parametrize("path,sub,one_line", ALL, ids=IDS)
def test_every_command_has_a_help_line_and_a_description(path, sub, one_line):
    name = " ".join(path)
    assert one_line and one_line.strip(), f"{name}: no help line in `{' '.join(path[:-1])} --help`"
    assert sub.description and sub.description.strip(), f"{name} --help has no description"
    text = sub.format_help()
    assert "%%" not in text, f"{name} --help shows a doubled %"


@pytest.mark.parametrize("path,sub,one_line", ALL, ids=IDS)
def test_every_option_and_argument_has_help_text(path, sub, one_line):
    for action in sub._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        label = "/".join(action.option_strings) or action.metavar or action.dest
        assert action.help and action.help.strip() and action.help is not argparse.SUPPRESS, \
            f"{' '.join(path)}: {label} has no help text"


def options_of(sub: argparse.ArgumentParser) -> set[str]:
    return {o for a in sub._actions for o in a.option_strings} - {"-h", "--help"}


def parser_of(*names: str) -> argparse.ArgumentParser:
    return next(sub for path, sub, _ in ALL if path[1:] == names)


def test_demo_lists_only_the_options_it_uses():
    """demo boots and discovers: no timing plugin, no guest command, nothing to report or trace."""
    unused = {"--timing", "--inject-profile", "--baseline-ns", "--issue", "--report", "--trace-out"}
    assert not options_of(parser_of("demo")) & unused


def test_bench_compare_lists_only_its_own_options():
    suite_options = options_of(parser_of("bench")) - {"--debug"}
    assert not options_of(parser_of("bench", "compare")) & suite_options
    assert cli.parser().parse_args(["bench", "compare", "A", "B"]).func is not \
        cli.parser().parse_args(["bench"]).func


def test_model_curve_help_prints_a_single_percent_sign():
    text = io.StringIO()
    parser_of("model", "curve").print_help(text)
    assert "95%" in text.getvalue() and "95%%" not in text.getvalue()
