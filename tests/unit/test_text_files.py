"""Every reader of a file a user names (topology, serving input, trace, bench results) words a
missing file, a directory, a file that is not regular (a FIFO, /dev/zero), one too large and
bytes that are not UTF-8 the same way, in one line naming the file (pfcxl/text_files.py: one
helper where each had its own copy); none waits on a FIFO or reads a device without bound."""

from __future__ import annotations

import os

import pytest

from pfcxl import text_files

from pfcxl.device import topology
from pfcxl.errors import PfcxlError, ServingError, TopologyError
from pfcxl.host_tools.bench import results as bench_results
from pfcxl.serving import inputs, traces

pytestmark = pytest.mark.unit

READERS = {"topology": (topology.load, TopologyError), "serving input": (inputs.read_toml, ServingError),
           "trace": (traces.load, ServingError), "bench results": (bench_results.load, PfcxlError)}
BAD = {"missing": (lambda p: None, "no such file"),
       "directory": (lambda p: p.mkdir(), "is a directory"),
       "latin-1": (lambda p: p.write_bytes(b'name = "caf\xe9"\n'), "not UTF-8 text (byte 11)"),
       "binary": (lambda p: p.write_bytes(b"\xff\xfe\x00"), "not UTF-8 text (byte 0)"),
       "fifo": (lambda p: os.mkfifo(p), "a FIFO, not a regular file"),
       "dev zero": (lambda p: p.symlink_to("/dev/zero"), "a character device, not a regular file"),
       "too large": (lambda p: p.write_bytes(b"#" * 4097), "larger than 4096 bytes")}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("bad", BAD)
def test_a_file_that_cannot_be_read_as_text_is_one_line_naming_it(tmp_path, monkeypatch, reader, bad):
    monkeypatch.setattr(text_files, "MAX_TEXT_BYTES", 4096)
    read, error = READERS[reader]
    make, words = BAD[bad]
    path = tmp_path / "input.toml"
    make(path)
    if reader == "bench results" and bad == "directory":
        words = "no such file"        # a results folder: its results.json is what is missing
    with pytest.raises(error) as caught:
        read(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and words in message, message


@pytest.mark.parametrize("argv", [["topology", "check", "{f}"], ["qemu-args", "-t", "{f}"],
                                  ["kv", "replay", "{f}", "--pool", "{f}"]])
@pytest.mark.parametrize("bad", ["fifo", "dev zero"])
def test_the_commands_refuse_a_fifo_and_dev_zero_in_one_line(tmp_path, capsys, argv, bad):
    from pfcxl.host_tools.cli import main as cli
    make, words = BAD[bad]
    path = tmp_path / "input.toml"
    make(path)
    assert cli.main([a.format(f=path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{path}: {words}" in err, err
