"""Tests of host_tools/provision's parts that install nothing: apt source parsing, kernel choice,
private apt options, .deb checks, unpacking (these run apt-config and dpkg-deb: component)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from pfcxl.host_tools.provision import apt, debian, files, runner, unpack

# The file as Debian's cloud/container images ship it (comments inside stanzas included).
DEBIAN_SOURCES = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

pytestmark = pytest.mark.component


# --- debian.sources -> mirror and keyring -----------------------------------------------------

def test_bookworm_entry_is_found_and_security_entry_is_not_taken():
    uris, signed_by, components = debian.mirror_and_keyring(DEBIAN_SOURCES)
    assert uris == ["http://deb.debian.org/debian"]
    assert signed_by == "/usr/share/keyrings/debian-archive-keyring.gpg"
    assert components == ["main"]


def test_security_first_and_a_local_mirror_still_picks_the_bookworm_stanza():
    text = """\
Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Signed-By: /etc/keys/sec.gpg

Types: deb-src deb
URIs: http://mirror.example/debian
  http://mirror2.example/debian
Suites: bookworm
Components: main contrib
Signed-By: /etc/keys/local.gpg
"""
    uris, signed_by, components = debian.mirror_and_keyring(text)
    assert uris == ["http://mirror.example/debian", "http://mirror2.example/debian"]
    assert signed_by == "/etc/keys/local.gpg"
    assert components == ["main", "contrib"]


def test_disabled_or_source_only_stanzas_are_ignored_and_fallback_applies():
    text = """\
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Enabled: no

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm
"""
    fallback = ([debian.DEFAULT_MIRROR], debian.DEFAULT_KEYRING, ["main"])
    assert debian.mirror_and_keyring(text) == fallback
    assert debian.mirror_and_keyring(None) == fallback


def test_entry_without_signed_by_gets_the_archive_keyring():
    text = "Types: deb\nURIs: http://m.example/debian\nSuites: bookworm\nComponents: main\n"
    assert debian.mirror_and_keyring(text) == (["http://m.example/debian"], debian.DEFAULT_KEYRING,
                                                ["main"])


def test_inline_signed_by_key_survives_render_and_reparse():
    key = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGPL0BUBEADmW5NdOOHwPIJlgPu6JDcKw/NZJPR8\n-----END PGP PUBLIC KEY BLOCK-----"
    rendered = debian.render_deb822_source(["http://m.example/debian"], ["bookworm-backports"],
                                           ["main"], key, comment="added by a test")
    assert rendered.startswith("# added by a test\n")
    assert "\n .\n" in rendered  # the empty line of the armor is written as " ."
    (stanza,) = debian.parse_deb822(rendered)
    assert stanza["signed-by"] == key
    assert stanza["suites"] == "bookworm-backports"
    assert debian.mentions_suite(rendered, deb822=True, suite="bookworm-backports")


def test_mentions_suite_in_one_line_lists():
    text = """\
# deb http://deb.debian.org/debian bookworm-backports main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb-src http://deb.debian.org/debian bookworm-backports-sloppy main
"""
    assert not debian.mentions_suite(text, deb822=False, suite="bookworm-backports")
    enabled = text + "deb [trusted=yes] http://x/debian bookworm-backports main\n"
    assert debian.mentions_suite(enabled, deb822=False, suite="bookworm-backports")
    assert not debian.mentions_suite(DEBIAN_SOURCES, deb822=True, suite="bookworm-backports")
    assert debian.mentions_suite(DEBIAN_SOURCES, deb822=True, suite="bookworm-updates")


# --- choosing the kernel ----------------------------------------------------------------------

MADISON = """\
linux-image-6.12.43+deb12-amd64 | 6.12.43-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.9+deb12-amd64 | 6.12.9-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.95+deb12-amd64-unsigned | 6.12.95-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.95+deb12-amd64 | 6.12.95-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.95+deb12-cloud-amd64 | 6.12.95-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.96+deb12-rt-amd64 | 6.12.96-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.96+deb12-amd64-dbg | 6.12.96-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.117+deb12-amd64 | 6.12.117-1~deb12u1 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
"""


def test_newest_backports_kernel_wins_numerically_and_security_is_ignored():
    # 95 > 43 > 9 numerically (not as strings); 117 is newer but from bookworm-security;
    # cloud/rt/dbg flavours do not match.
    assert debian.choose_kernel_package(MADISON) == ("linux-image-6.12.95+deb12-amd64",
                                                     "6.12.95-1~bpo12+1")


def test_the_other_suite_can_be_asked_for():
    assert debian.choose_kernel_package(MADISON, suite="bookworm-security") == (
        "linux-image-6.12.117+deb12-amd64", "6.12.117-1~deb12u1")


def test_unsigned_is_taken_when_the_newest_release_has_no_signed_package():
    listing = MADISON + ("linux-image-6.12.100+deb12-amd64-unsigned | 6.12.100-1~bpo12+1 | "
                         "http://deb.debian.org/debian bookworm-backports/main amd64 Packages\n")
    package, version = debian.choose_kernel_package(listing)
    assert package == "linux-image-6.12.100+deb12-amd64-unsigned"
    assert version == "6.12.100-1~bpo12+1"
    assert debian.kernel_release(package) == "6.12.100+deb12-amd64"


def test_no_backports_kernel_is_a_clear_error():
    only_security = MADISON.splitlines()[-1]
    with pytest.raises(runner.StepError, match="bookworm-backports"):
        debian.choose_kernel_package(only_security)
    with pytest.raises(runner.StepError):
        debian.kernel_release("linux-image-6.1.0-30-amd64")


# --- the private trixie apt configuration -----------------------------------------------------

def _options_dict(options: list[str]) -> dict[str, str]:
    assert options[::2] == ["-o"] * (len(options) // 2)
    return dict(o.split("=", 1) for o in options[1::2])


def test_private_apt_options_keep_everything_under_our_dir(tmp_path):
    opts = _options_dict(apt.private_apt_options(tmp_path))
    assert opts["Dir::Etc::SourceList"] == str(tmp_path / "trixie.sources")
    assert opts["Dir::Etc::SourceParts"] == "/dev/null"  # never the system's sources.list.d
    assert opts["Dir::State::status"] == str(tmp_path / "state" / "status")  # not dpkg's status
    for key in ("Dir::State", "Dir::State::Lists", "Dir::Cache", "Dir::State::status"):
        assert Path(opts[key]).is_relative_to(tmp_path), key
    assert opts["APT::Architecture"] == "amd64"
    assert opts["APT::Architectures"] == "amd64"


def test_apt_really_resolves_the_private_options(tmp_path):
    out = subprocess.run(["apt-config", *apt.private_apt_options(tmp_path), "shell",
                          "LISTS", "Dir::State::lists/d", "STATUS", "Dir::State::status/f",
                          "ARCHIVES", "Dir::Cache::archives/d", "PARTS", "Dir::Etc::sourceparts/d"],
                         capture_output=True, text=True, check=True).stdout
    assert f"LISTS='{tmp_path}/lists/'" in out
    assert f"STATUS='{tmp_path}/state/status'" in out
    assert f"ARCHIVES='{tmp_path}/cache/archives/'" in out
    assert "/var/lib/dpkg/status" not in out


# --- downloads ---------------------------------------------------------------------------------

def test_print_uris_lines_give_package_version_size_and_hash():
    text = ("'http://deb.debian.org/debian/pool/main/libc/libcap2/libcap2_2.75-10%2bb3_amd64.deb' "
            "libcap2_1%3a2.75-10+deb13u1+b3_amd64.deb 28988 SHA256:abcd\n"
            "'http://deb.debian.org/debian/pool/main/n/ndctl/cxl_81-1_amd64.deb' cxl_81-1_amd64.deb 89372\n"
            "W: some warning\n")
    first, second = debian.parse_print_uris(text)
    assert (first.package, first.version, first.size, first.hash) == (
        "libcap2", "1:2.75-10+deb13u1+b3", 28988, "SHA256:abcd")
    assert (second.package, second.version, second.hash) == ("cxl", "81-1", "")


def test_deb_matches_checks_size_and_hash(tmp_path):
    deb = tmp_path / "x_1_amd64.deb"
    deb.write_bytes(b"payload")
    good = hashlib.sha256(b"payload").hexdigest()
    assert apt.deb_matches(deb, debian.DebURI("u", deb.name, 7, f"SHA256:{good}"))
    assert not apt.deb_matches(deb, debian.DebURI("u", deb.name, 7, "SHA256:" + "0" * 64))
    assert not apt.deb_matches(deb, debian.DebURI("u", deb.name, 8, ""))
    assert not apt.deb_matches(tmp_path / "missing.deb", debian.DebURI("u", "missing.deb", 7, ""))


def test_ndctl_major_check():
    assert debian.is_ndctl_major("81-1")
    assert debian.is_ndctl_major("1:81.2-1")
    assert not debian.is_ndctl_major("76.1-1")
    assert not debian.is_ndctl_major("810-1")
    assert not debian.is_ndctl_major("")


def test_qemu_version_parse():
    out = "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright (c)"
    assert debian.parse_qemu_version(out) == "10.0.2"
    assert debian.parse_qemu_version("qemu-img version 7.2.0") is None


# --- unpacking ----------------------------------------------------------------------------------

def test_merged_usr_moves_top_level_dirs_into_usr(tmp_path):
    (tmp_path / "lib64").mkdir()
    (tmp_path / "lib64" / "ld-linux-x86-64.so.2").write_text("loader")
    (tmp_path / "lib" / "x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "lib" / "x86_64-linux-gnu" / "libfoo.so.1").write_text("top")
    (tmp_path / "lib" / "x86_64-linux-gnu" / "libbar.so.1").write_text("top")
    (tmp_path / "usr" / "lib" / "x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "usr" / "lib" / "x86_64-linux-gnu" / "libbar.so.1").write_text("usr")
    (tmp_path / "usr" / "bin").mkdir()

    unpack.ensure_merged_usr(tmp_path)

    for name in unpack.MERGED_USR_DIRS:
        assert (tmp_path / name).is_symlink()
        assert (tmp_path / name).readlink() == Path("usr") / name
    assert (tmp_path / "lib64" / "ld-linux-x86-64.so.2").read_text() == "loader"
    assert (tmp_path / "usr" / "lib" / "x86_64-linux-gnu" / "libfoo.so.1").read_text() == "top"
    assert (tmp_path / "usr" / "lib" / "x86_64-linux-gnu" / "libbar.so.1").read_text() == "usr"
    unpack.ensure_merged_usr(tmp_path)  # idempotent
    assert (tmp_path / "lib").is_symlink()


def _tiny_deb(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    src = tmp_path / f"src-{name}"
    (src / "DEBIAN").mkdir(parents=True)
    (src / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n")
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    deb = tmp_path / f"{name}_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(src), str(deb)],
                   check=True, capture_output=True)
    return deb


def test_unpack_is_atomic_a_failed_finish_keeps_the_old_tree(tmp_path):
    setup = runner.Setup(check_only=True)  # check_only: no log file written
    dest = tmp_path / "root"
    first = _tiny_deb(tmp_path, "one", {"usr/bin/tool": "v1"})
    unpack.unpack_atomically(setup, [first], dest, lambda tmp: None, {"v": 1})
    assert (dest / "usr/bin/tool").read_text() == "v1"
    assert files.read_json(dest / unpack.STAMP_NAME) == {"v": 1}

    second = _tiny_deb(tmp_path, "two", {"usr/bin/tool": "v2"})

    def reject(tmp: Path) -> None:
        assert (tmp / "usr/bin/tool").read_text() == "v2"
        raise runner.StepError("verification failed")

    with pytest.raises(runner.StepError):
        unpack.unpack_atomically(setup, [second], dest, reject, {"v": 2})
    assert (dest / "usr/bin/tool").read_text() == "v1"  # untouched
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith(".")) == []

    unpack.unpack_atomically(setup, [second], dest, lambda tmp: None, {"v": 2})
    assert (dest / "usr/bin/tool").read_text() == "v2"
    assert files.read_json(dest / unpack.STAMP_NAME) == {"v": 2}


def test_timed_qemu_asks_apt_for_the_exact_source_version():
    # apt-get source matches versions exactly: before, setup asked for qemu=10.0.2* (no epoch, a
    # glob), which apt never found, and a fresh machine could not build the timed QEMU
    from pfcxl.host_tools.provision import timed_qemu
    installed = "1:10.0.2+ds-2+deb13u1~bpo12+1"
    assert timed_qemu.source_package_version(installed) == installed
    assert timed_qemu.source_package_version("1:10.0.2+ds-2+b1") == "1:10.0.2+ds-2"     # a binNMU's own
    assert timed_qemu.upstream_version(installed) == "10.0.2+ds"
