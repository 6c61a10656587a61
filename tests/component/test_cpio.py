"""Our newc writer: round trip, layout, reproducibility, and agreement with GNU cpio."""

import gzip
import os
import stat
import subprocess

import pytest

from pfcxl.host_tools.image import cpio

Entry = cpio.Entry
HEADER_LEN = 110

pytestmark = pytest.mark.component


def sample_entries() -> list[cpio.Entry]:
    # File sizes 0..7 and 13 and name lengths of every residue mod 4 exercise all the padding paths.
    entries = [Entry.directory("d"), Entry.directory("d/sub", 0o700), Entry.file("d/empty", b"")]
    for size in (1, 2, 3, 4, 5, 6, 7, 13):
        entries.append(Entry.file(f"d/f{'x' * size}", bytes(range(size))))
    entries += [
        Entry.file("d/sub/run.sh", b"#!/bin/sh\necho hi\n", 0o755),
        Entry.file("top", b"\0\1\2\xff" * 257),
        Entry.symlink("d/abs-link", "/usr/bin/busybox"),
        Entry.symlink("d/rel-link", "sub/run.sh"),
        Entry.symlink("link-to-dir", "d/sub"),
    ]
    return entries


def walk_headers(data: bytes) -> list[tuple[int, str, int]]:
    """(offset, name, filesize) of every header, trailer included, read independently of cpio.read."""
    out, pos = [], 0
    while True:
        assert data[pos:pos + 6] == b"070701", f"no newc magic at {pos}"
        filesize = int(data[pos + 54:pos + 62], 16)
        namesize = int(data[pos + 94:pos + 102], 16)
        name = data[pos + HEADER_LEN:pos + HEADER_LEN + namesize]
        assert name.endswith(b"\0")
        out.append((pos, name[:-1].decode(), filesize))
        pos += HEADER_LEN + namesize
        pos += -pos % 4
        pos += filesize + (-filesize % 4)
        if out[-1][1] == "TRAILER!!!":
            assert pos == len(data), "bytes after the trailer"
            return out


def test_round_trip():
    entries = sample_entries()
    assert cpio.read(cpio.archive(entries)) == entries


def test_entry_constructors():
    assert Entry.file("a", b"x", 0o600).mode == stat.S_IFREG | 0o600
    assert Entry.directory("d").mode == stat.S_IFDIR | 0o755
    link = Entry.symlink("l", "/target")
    assert link.mode == stat.S_IFLNK | 0o777 and link.data == b"/target"


def test_headers_are_aligned_and_trailer_is_last():
    entries = sample_entries()
    data = cpio.archive(entries)
    headers = walk_headers(data)
    assert all(offset % 4 == 0 for offset, _, _ in headers)
    assert [name for _, name, _ in headers] == [e.path for e in entries] + ["TRAILER!!!"]
    assert [size for _, _, size in headers[:-1]] == [len(e.data) for e in entries]
    assert headers[-1][2] == 0
    assert len(data) % 4 == 0


def test_header_fields_are_fixed():
    data = cpio.archive([Entry.file("a", b"abc", 0o640), Entry.directory("b")])
    fields = [int(data[6 + 8 * i:14 + 8 * i], 16) for i in range(13)]
    ino, mode, uid, gid, nlink, mtime = fields[:6]
    assert (ino, mode, uid, gid, nlink, mtime) == (1, stat.S_IFREG | 0o640, 0, 0, 1, 0)
    second = walk_headers(data)[1][0]
    fields = [int(data[second + 6 + 8 * i:second + 14 + 8 * i], 16) for i in range(13)]
    assert fields[0] == 2 and fields[4] == 2 and fields[1] == stat.S_IFDIR | 0o755


def test_leading_slash_is_stripped():
    assert [e.path for e in cpio.read(cpio.archive([Entry.file("/etc/x", b"1")]))] == ["etc/x"]


def test_archive_is_deterministic():
    a = cpio.archive(sample_entries())
    b = cpio.archive(list(sample_entries()))
    assert a == b
    assert cpio.archive(sample_entries()[::-1]) != a   # order is kept, not normalised away


def test_gzipped_is_deterministic_and_decompresses():
    data = cpio.archive(sample_entries())
    packed = cpio.gzipped(data)
    assert packed == cpio.gzipped(data)
    assert packed[:2] == b"\x1f\x8b"
    assert packed[4:8] == b"\0\0\0\0", "gzip header carries an mtime"
    assert gzip.decompress(packed) == data


def test_read_rejects_garbage():
    with pytest.raises(ValueError, match="offset 0"):
        cpio.read(b"070707" + b"0" * 200)


# --------------------------------------------------------------------------- GNU cpio agrees


def run_cpio(args: list[str], data: bytes, cwd) -> str:
    result = subprocess.run(["cpio", *args], input=data, cwd=cwd, capture_output=True, check=True)
    return result.stdout.decode()


def test_gnu_cpio_lists_the_same_names(tmp_path):
    entries = sample_entries()
    listed = run_cpio(["-it", "--quiet"], cpio.archive(entries), tmp_path).splitlines()
    assert listed == [e.path for e in entries]


def test_gnu_cpio_extracts_the_same_tree(tmp_path):
    entries = sample_entries()
    out = tmp_path / "out"
    out.mkdir()
    run_cpio(["-idm", "--quiet"], cpio.archive(entries), out)
    for e in entries:
        path = out / e.path
        if stat.S_ISDIR(e.mode):
            assert path.is_dir() and not path.is_symlink(), e.path
        elif stat.S_ISLNK(e.mode):
            assert path.is_symlink(), e.path
            assert os.readlink(path) == e.data.decode()
        else:
            assert path.is_file() and not path.is_symlink(), e.path
            assert path.read_bytes() == e.data, e.path
            assert stat.S_IMODE(path.stat().st_mode) & 0o111 == stat.S_IMODE(e.mode) & 0o111, e.path
    extracted = {str(p.relative_to(out)) for p in out.rglob("*")}
    assert extracted == {e.path for e in entries}
