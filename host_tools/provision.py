"""Provision this host for pfcxl: what `make setup` runs.

Run from the repository root as ``python3 -m host_tools.provision``. It runs before the package
is installed, so it uses the standard library only and imports nothing from the project but
``.cache`` (the cache layout).

Steps (each skipped when its result is already there; the checks look at real state: dpkg's
versions, files on disk, stamp files recording what was unpacked; nothing is downloaded twice):

  1. bookworm-backports  apt source for bookworm-backports (same mirror and keyring as the
                         bookworm entry of /etc/apt/sources.list.d/debian.sources), apt-get update
  2. host packages       qemu-system-x86 1:10.0 from bookworm-backports, busybox-static, cpio,
                         xz-utils, libc6-dev (static libc.a), gcc
  3. trixie apt          a private apt configuration for Debian trixie under $PFCXL_CACHE/apt-trixie
                         (own sources, lists, state, cache; the system's sources are never touched)
  4. guest userspace     trixie's cxl/daxctl (ndctl 81) and their libraries, libc and loader,
                         unpacked with dpkg -x into $PFCXL_CACHE/guest-root (merged /usr)
  5. guest kernel        Debian's newest linux-image-6.12.*+deb12-amd64 from bookworm-backports,
                         downloaded (not installed) and unpacked into $PFCXL_CACHE/kernel
  6. manifest            $PFCXL_CACHE/setup.json: kernel release, paths, ndctl and QEMU versions
  7. python env          venv at $PFCXL_VENV (default <repo>/.venv), pip install -e '<repo>[test]'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import cache

REPO_ROOT = Path(__file__).resolve().parent.parent

# --- apt sources --------------------------------------------------------------------------------
APT_ETC = Path("/etc/apt")
DEBIAN_SOURCES = APT_ETC / "sources.list.d" / "debian.sources"
BACKPORTS_SOURCES = APT_ETC / "sources.list.d" / "pfcxl-backports.sources"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
HOST_SUITE = "bookworm"
BACKPORTS_SUITE = "bookworm-backports"
TRIXIE_SUITE = "trixie"
DEFAULT_APT_LISTS = Path("/var/lib/apt/lists")

# --- host packages ------------------------------------------------------------------------------
QEMU_PACKAGE = "qemu-system-x86"
QEMU_DPKG_VERSION_PREFIX = "1:10.0"  # bookworm's own 7.2 lacks volatile-memdev, generic ports, DCD
QEMU_VERSION_PREFIX = "10.0."
QEMU_BINARY = Path("/usr/bin/qemu-system-x86_64")  # the one the package installs, not a PATH lookup
HOST_PACKAGES = ("busybox-static", "cpio", "xz-utils", "libc6-dev", "gcc")
STATIC_LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.a")

# --- guest userspace: trixie's ndctl 81 with everything its binaries need (DT_NEEDED closure) ---
TRIXIE_GUEST_PACKAGES = (
    "cxl", "daxctl", "libcxl1", "libdaxctl1", "libndctl6", "libjson-c5", "libkmod2", "libudev1",
    "libuuid1", "libc6", "libtraceevent1", "libtracefs1", "libzstd1", "liblzma5", "libssl3t64",
    "libkeyutils1", "libiniparser4", "libcap2", "zlib1g", "libselinux1", "libpcre2-8-0",
    "libblkid1", "libmount1",
)
NDCTL_MAJOR = "81"  # bookworm's 76.1 cannot create ram regions ("not supported yet", exit 0)
TRIXIE_LISTS_MAX_AGE_S = 7 * 24 * 3600
MERGED_USR_DIRS = ("bin", "sbin", "lib", "lib64")

# --- guest kernel -------------------------------------------------------------------------------
# Debian's 6.12 from bookworm-backports, e.g. linux-image-6.12.38+deb12-amd64 (signed) and
# linux-image-6.12.38+deb12-amd64-unsigned. Both carry the same release string, config and modules.
KERNEL_PACKAGE_RE = re.compile(r"^linux-image-(6\.12\.(\d+)\+deb12-amd64)(-unsigned)?$")

STAMP_NAME = ".pfcxl-stamp.json"
VENV_STAMP_NAME = ".pfcxl-setup.json"


class StepError(Exception):
    """A step failed; the message is one line saying why."""


# ================================================================================================
# Pure helpers (unit-tested in tests/unit/test_provision.py)
# ================================================================================================

def parse_deb822(text: str) -> list[dict[str, str]]:
    """Stanzas of a deb822 file as dicts with lower-cased keys.

    Comment lines (#) are skipped without ending a stanza, as apt does; continuation lines are
    joined with newlines, and a lone "." stands for an empty line (inline Signed-By keys).
    """
    stanzas: list[dict[str, str]] = []
    current: dict[str, str] = {}
    last_key: str | None = None
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if current:
                stanzas.append(current)
            current, last_key = {}, None
            continue
        if raw[0] in " \t":
            if last_key is None:
                continue  # continuation without a field: malformed, ignore like apt's warning
            line = raw.strip()
            current[last_key] += "\n" + ("" if line == "." else line)
            continue
        key, sep, value = raw.partition(":")
        if not sep:
            continue
        last_key = key.strip().lower()
        current[last_key] = value.strip()
    if current:
        stanzas.append(current)
    return stanzas


def _enabled(stanza: dict[str, str]) -> bool:
    return stanza.get("enabled", "yes").strip().lower() not in ("no", "false", "0")


def find_suite_source(text: str, suite: str = HOST_SUITE) -> tuple[list[str], str, list[str]] | None:
    """(URIs, Signed-By, Components) of the first enabled `deb` stanza listing `suite`, or None."""
    for stanza in parse_deb822(text):
        if not _enabled(stanza):
            continue
        if "deb" not in stanza.get("types", "").split():
            continue
        if suite not in stanza.get("suites", "").split():
            continue
        uris = stanza.get("uris", "").split()
        if not uris:
            continue
        components = stanza.get("components", "").split() or ["main"]
        return uris, stanza.get("signed-by", ""), components
    return None


def mirror_and_keyring(debian_sources_text: str | None) -> tuple[list[str], str, list[str]]:
    """Mirror URIs, Signed-By and components to reuse for backports and trixie.

    Falls back to deb.debian.org and the archive keyring when the file is absent or has no
    bookworm entry; an entry without Signed-By gets the archive keyring.
    """
    found = find_suite_source(debian_sources_text) if debian_sources_text else None
    if found is None:
        return [DEFAULT_MIRROR], DEFAULT_KEYRING, ["main"]
    uris, signed_by, components = found
    return uris, signed_by or DEFAULT_KEYRING, components


def render_deb822_source(uris: list[str], suites: list[str], components: list[str],
                         signed_by: str, comment: str = "") -> str:
    """One deb822 `deb` stanza; a multi-line Signed-By (inline key) is folded back correctly."""
    lines = [f"# {line}" for line in comment.splitlines()]
    lines += [
        "Types: deb",
        f"URIs: {' '.join(uris)}",
        f"Suites: {' '.join(suites)}",
        f"Components: {' '.join(components)}",
    ]
    key_lines = signed_by.split("\n")
    if len(key_lines) == 1:
        lines.append(f"Signed-By: {signed_by}")
    else:
        lines.append(f"Signed-By: {key_lines[0]}".rstrip())
        lines += [f" {line}" if line else " ." for line in key_lines[1:]]
    return "\n".join(lines) + "\n"


def mentions_suite(text: str, deb822: bool, suite: str) -> bool:
    """Whether an apt source file (one-line .list or deb822 .sources) enables `suite`."""
    if deb822:
        return any(_enabled(s) and suite in s.get("suites", "").split() for s in parse_deb822(text))
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith(("deb ", "deb-src ", "deb\t")):
            continue
        # drop an [option=value ...] block, then: type uri suite components...
        line = re.sub(r"\[[^\]]*\]", " ", line)
        tokens = line.split()
        if len(tokens) >= 3 and tokens[2] == suite:
            return True
    return False


def choose_kernel_package(madison: str, suite: str = BACKPORTS_SUITE) -> tuple[str, str]:
    """(package, version) of the newest linux-image-6.12.N+deb12-amd64 that `suite` offers.

    `madison` is `apt-cache madison` output: "name | version | URI suite/component arch Packages".
    Only `suite` counts: bookworm-security also carries 6.12 kernels (~deb12uN, newer than the
    backports ones by now), but the platform was verified with the backports build.
    For the newest release the signed package (plain name) is preferred over `-unsigned`: it is
    what the `linux-image-amd64` metapackage in backports depends on, i.e. Debian's canonical
    kernel for that ABI, and its vmlinuz is the unsigned one plus an appended Secure Boot
    signature, which QEMU's -kernel loader ignores. When a new upload's signed package has not
    reached the mirror yet, the -unsigned one of the same release is taken instead.
    """
    best: tuple[int, int, str, str] | None = None  # (patch level, prefer-signed, name, version)
    for line in madison.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 3:
            continue
        name, version, origin = fields[:3]
        origin_words = origin.split()
        if len(origin_words) < 2 or origin_words[1].split("/", 1)[0] != suite:
            continue
        match = KERNEL_PACKAGE_RE.match(name)
        if not match:
            continue
        key = (int(match.group(2)), 0 if match.group(3) else 1, name, version)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        raise StepError(f"no linux-image-6.12.*+deb12-amd64 package in {suite} "
                        "(are its lists present? try `apt-get update`)")
    return best[2], best[3]


def kernel_release(package: str) -> str:
    """linux-image-6.12.38+deb12-amd64[-unsigned] -> 6.12.38+deb12-amd64."""
    match = KERNEL_PACKAGE_RE.match(package)
    if not match:
        raise StepError(f"not a 6.12 bookworm-backports kernel package name: {package}")
    return match.group(1)


def private_apt_options(apt_dir: Path) -> list[str]:
    """apt-get/apt-cache -o options for the private trixie configuration under `apt_dir`.

    Everything apt reads or writes is ours: sources (no sources.list.d), lists, state, the dpkg
    status (an empty file, so resolution never sees what the host has installed), cache and
    archives, preferences. One architecture, no translations, no `_apt` sandbox user (it could not
    enter a cache under /root).
    """
    return [
        "-o", f"Dir::Etc::SourceList={apt_dir / 'trixie.sources'}",
        "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", "Dir::Etc::Preferences=/dev/null",
        "-o", "Dir::Etc::PreferencesParts=/dev/null",
        "-o", f"Dir::State={apt_dir / 'state'}",
        "-o", f"Dir::State::Lists={apt_dir / 'lists'}",
        "-o", f"Dir::State::status={apt_dir / 'state' / 'status'}",
        "-o", f"Dir::Cache={apt_dir / 'cache'}",
        "-o", "APT::Architecture=amd64",
        "-o", "APT::Architectures=amd64",
        "-o", "APT::Default-Release=",
        "-o", "Acquire::Languages=none",
        "-o", "APT::Sandbox::User=root",
    ]


@dataclass(frozen=True)
class DebURI:
    uri: str
    filename: str
    size: int
    hash: str  # "SHA256:..." or "" when apt gave none

    @property
    def package(self) -> str:
        return self.filename.split("_", 1)[0]

    @property
    def version(self) -> str:
        parts = self.filename.split("_")
        return urllib.parse.unquote(parts[1]) if len(parts) >= 3 else ""


def parse_print_uris(text: str) -> list[DebURI]:
    """Lines of `apt-get download --print-uris`: 'URI' filename size [hash]."""
    out = []
    for line in text.splitlines():
        match = re.match(r"^'([^']+)'\s+(\S+)\s+(\d+)(?:\s+(\S+))?", line.strip())
        if match:
            out.append(DebURI(match.group(1), match.group(2), int(match.group(3)),
                              match.group(4) or ""))
    return out


def is_ndctl_major(version: str, major: str = NDCTL_MAJOR) -> bool:
    """'81-1' / '1:81.2-1' -> True for major 81; '810-1', '76.1-1' -> False."""
    upstream = version.split(":", 1)[-1]
    return re.match(rf"^{re.escape(major)}(?![0-9])", upstream) is not None


def parse_qemu_version(output: str) -> str | None:
    match = re.search(r"QEMU emulator version (\d+\.\d+\.\d+)", output)
    return match.group(1) if match else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def deb_matches(path: Path, want: DebURI) -> bool:
    """An already-downloaded .deb is kept when its size (and hash, when apt gave one) match."""
    try:
        if path.stat().st_size != want.size:
            return False
    except FileNotFoundError:
        return False
    algo, _, expected = want.hash.partition(":")
    if not expected or algo.lower() not in hashlib.algorithms_available:
        return True
    digest = hashlib.new(algo.lower())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == expected.lower()


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_json_atomically(path: Path, data: dict) -> None:
    write_atomically(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


# ================================================================================================
# Running commands and steps
# ================================================================================================

def failure(cmd: list[str], proc: subprocess.CompletedProcess) -> str:
    """One line: the command, its exit code and the last lines of its stderr (else stdout)."""
    tail = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
    return (f"`{shlex.join(cmd)}` exited {proc.returncode}: "
            + (" | ".join(tail[-4:]) or "(no output)"))


class Setup:
    def __init__(self, check_only: bool) -> None:
        self.check_only = check_only
        self.log_path = cache.cache_dir() / "setup.log"
        self.prefix = ""

    def say(self, message: str) -> None:
        print(f"[setup] {self.prefix}: {message}", flush=True)

    def _log(self, text: str) -> None:
        if self.check_only:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as f:
            f.write(text)

    def run(self, cmd: list[str], *, cwd: Path | None = None, apt: bool = False,
            ok: tuple[int, ...] = (0,), log: bool = True) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        if apt:
            env.update(DEBIAN_FRONTEND="noninteractive", LC_ALL="C.UTF-8")
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, errors="replace")
        except OSError as e:
            raise StepError(f"`{shlex.join(cmd)}` could not start: {e}") from None
        if log:
            self._log(f"\n$ {shlex.join(cmd)}  (cwd={cwd or os.getcwd()}, exit {proc.returncode}, "
                      f"{time.monotonic() - started:.1f} s)\n{proc.stdout}{proc.stderr}")
        if proc.returncode not in ok:
            raise StepError(failure(cmd, proc))
        return proc

    def need_root(self, what: str) -> None:
        if os.geteuid() != 0:
            raise StepError(f"{what} needs root (run `make setup` as root)")


@dataclass
class Step:
    name: str
    check: Callable[[Setup], tuple[bool, str]]  # (done, what is there or what is missing)
    run: Callable[[Setup], str]  # does the work, returns a short description of the result


# ------------------------------------------------------------------------------------------------
# 1. bookworm-backports
# ------------------------------------------------------------------------------------------------

def apt_lists_dir(s: Setup) -> Path:
    try:
        out = s.run(["apt-config", "shell", "X", "Dir::State::lists/d"], log=False).stdout
    except StepError:
        return DEFAULT_APT_LISTS
    match = re.search(r"X='([^']+)'", out)
    return Path(match.group(1)) if match else DEFAULT_APT_LISTS


def apt_source_files() -> list[Path]:
    files = [APT_ETC / "sources.list"]
    parts = APT_ETC / "sources.list.d"
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    return [f for f in files if f.is_file()]


def sources_with_backports() -> list[Path]:
    found = []
    for path in apt_source_files():
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if mentions_suite(text, path.suffix == ".sources", BACKPORTS_SUITE):
            found.append(path)
    return found


def backports_lists_present(lists: Path) -> bool:
    release = any(lists.glob(f"*_dists_{BACKPORTS_SUITE}_InRelease")) or any(
        lists.glob(f"*_dists_{BACKPORTS_SUITE}_Release"))
    packages = any(lists.glob(f"*_dists_{BACKPORTS_SUITE}_main_binary-amd64_Packages*"))
    return release and packages


def host_mirror() -> tuple[list[str], str, list[str]]:
    try:
        text = DEBIAN_SOURCES.read_text()
    except OSError:
        text = None
    return mirror_and_keyring(text)


def check_backports(s: Setup) -> tuple[bool, str]:
    files = sources_with_backports()
    if not files:
        return False, f"no apt source mentions {BACKPORTS_SUITE}"
    if not backports_lists_present(apt_lists_dir(s)):
        return False, f"{BACKPORTS_SUITE} is in {files[0]} but its package lists are missing"
    return True, f"in {files[0]}"


def run_backports(s: Setup) -> str:
    changed = False
    files = sources_with_backports()
    if not files:
        s.need_root(f"writing {BACKPORTS_SOURCES}")
        uris, signed_by, components = host_mirror()
        text = render_deb822_source(uris, [BACKPORTS_SUITE], components, signed_by,
                                    comment="Added by pfcxl setup (host_tools/provision.py): "
                                            "QEMU 10.0 and the 6.12 guest kernel")
        s.say(f"adding {BACKPORTS_SOURCES} ({' '.join(uris)})")
        write_atomically(BACKPORTS_SOURCES, text)
        files, changed = [BACKPORTS_SOURCES], True
    lists = apt_lists_dir(s)
    if changed or not backports_lists_present(lists):
        s.need_root("apt-get update")
        s.say("apt-get update")
        s.run(["apt-get", "update"], apt=True)
        if not backports_lists_present(lists):
            raise StepError(f"apt-get update succeeded but no {BACKPORTS_SUITE} lists in {lists}")
    return f"enabled in {files[0]}"


# ------------------------------------------------------------------------------------------------
# 2. host packages
# ------------------------------------------------------------------------------------------------

def installed_versions(s: Setup, packages: list[str]) -> dict[str, str]:
    """Package -> version for the ones dpkg has fully installed."""
    proc = s.run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Status}\n",
                  *packages], ok=(0, 1), log=False)
    versions = {}
    for line in proc.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2] == "installed":
            versions[parts[0]] = parts[1]
    return versions


def qemu_version(s: Setup) -> str | None:
    if not QEMU_BINARY.exists():
        return None
    out = s.run([str(QEMU_BINARY), "--version"], log=False).stdout
    return parse_qemu_version(out)


def host_packages_missing(s: Setup) -> tuple[list[str], bool]:
    versions = installed_versions(s, [QEMU_PACKAGE, *HOST_PACKAGES])
    missing = [p for p in HOST_PACKAGES if p not in versions]
    qemu_ok = versions.get(QEMU_PACKAGE, "").startswith(QEMU_DPKG_VERSION_PREFIX)
    return missing, qemu_ok


def check_host_packages(s: Setup) -> tuple[bool, str]:
    missing, qemu_ok = host_packages_missing(s)
    problems = []
    if not qemu_ok:
        problems.append(f"{QEMU_PACKAGE} {QEMU_DPKG_VERSION_PREFIX}.x")
    problems += missing
    if "libc6-dev" not in missing and not STATIC_LIBC.exists():
        problems.append(str(STATIC_LIBC))
    if problems:
        return False, "missing: " + ", ".join(problems)
    version = qemu_version(s)
    if not version or not version.startswith(QEMU_VERSION_PREFIX):
        return False, f"{QEMU_BINARY} --version reports {version or 'nothing'}, want 10.0"
    return True, f"QEMU {version}, {', '.join(HOST_PACKAGES)}"


def run_host_packages(s: Setup) -> str:
    missing, qemu_ok = host_packages_missing(s)
    apt_install = ["apt-get", "install", "-y", "--no-install-recommends",
                   "-o", "DPkg::Lock::Timeout=300",
                   "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
    if missing:
        s.need_root("apt-get install")
        s.say(f"apt-get install {' '.join(missing)}")
        s.run([*apt_install, *missing], apt=True)
    if not qemu_ok:
        s.need_root("apt-get install")
        s.say(f"apt-get install -t {BACKPORTS_SUITE} {QEMU_PACKAGE}")
        s.run([*apt_install, "-t", BACKPORTS_SUITE, QEMU_PACKAGE], apt=True)
    done, detail = check_host_packages(s)
    if not done:
        raise StepError(f"after apt-get install: {detail}")
    return detail


# ------------------------------------------------------------------------------------------------
# 3. private trixie apt configuration
# ------------------------------------------------------------------------------------------------

def trixie_sources_text() -> str:
    uris, signed_by, _ = host_mirror()
    return render_deb822_source(uris, [TRIXIE_SUITE], ["main"], signed_by,
                                comment="pfcxl's private trixie configuration (guest userspace only)")


def trixie_apt(s: Setup, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    apt_dir = cache.trixie_apt_dir()
    tool, rest = args[0], args[1:]
    return s.run([tool, *private_apt_options(apt_dir), *rest], cwd=cwd, apt=True)


def trixie_update_stamp() -> Path:
    return cache.trixie_apt_dir() / "updated.json"


def check_trixie_apt(s: Setup) -> tuple[bool, str]:
    apt_dir = cache.trixie_apt_dir()
    sources = apt_dir / "trixie.sources"
    try:
        if sources.read_text() != trixie_sources_text():
            return False, f"{sources} missing or out of date"
    except OSError:
        return False, f"{sources} missing"
    lists = apt_dir / "lists"
    if not any(lists.glob(f"*_dists_{TRIXIE_SUITE}_main_binary-amd64_Packages*")):
        return False, f"no trixie package lists in {lists}"
    # apt dates list files by the server's Last-Modified, so freshness is kept in our own stamp.
    stamp = read_json(trixie_update_stamp())
    age = time.time() - float(stamp.get("updated_at", 0))
    if stamp.get("sources_sha256") != hashlib.sha256(trixie_sources_text().encode()).hexdigest():
        return False, "trixie lists were fetched for other sources"
    if age > TRIXIE_LISTS_MAX_AGE_S:
        return False, f"trixie lists are {age / 86400:.1f} days old (refreshed after 7)"
    return True, f"lists {age / 86400:.1f} days old in {apt_dir}"


def run_trixie_apt(s: Setup) -> str:
    apt_dir = cache.trixie_apt_dir()
    for sub in ("lists/partial", "state", "cache/archives/partial"):
        (apt_dir / sub).mkdir(parents=True, exist_ok=True)
    status = apt_dir / "state" / "status"
    if not status.exists() or status.stat().st_size:
        status.write_text("")
    text = trixie_sources_text()
    write_atomically(apt_dir / "trixie.sources", text)
    s.say(f"apt-get update (private trixie config in {apt_dir})")
    trixie_apt(s, "apt-get", "update")
    if not any((apt_dir / "lists").glob(f"*_dists_{TRIXIE_SUITE}_main_binary-amd64_Packages*")):
        raise StepError(f"apt-get update succeeded but no trixie lists in {apt_dir / 'lists'}")
    write_json_atomically(trixie_update_stamp(), {
        "updated_at": time.time(),
        "sources_sha256": hashlib.sha256(text.encode()).hexdigest(),
    })
    return f"trixie lists in {apt_dir / 'lists'}"


# ------------------------------------------------------------------------------------------------
# Downloading and unpacking .debs
# ------------------------------------------------------------------------------------------------

def download_debs(s: Setup, apt: Callable[..., subprocess.CompletedProcess],
                  packages: list[str]) -> list[Path]:
    """Download `packages` (names, or name=version) into debs_dir (skipping files already there intact); their paths."""
    debs = cache.debs_dir()
    debs.mkdir(parents=True, exist_ok=True)
    wanted = parse_print_uris(apt(s, "apt-get", "download", "--print-uris", *packages,
                                  cwd=debs).stdout)
    bare = {re.split(r"[=/]", p, maxsplit=1)[0] for p in packages}
    if {w.package for w in wanted} != bare:
        missing = bare - {w.package for w in wanted}
        raise StepError(f"apt-get download --print-uris gave no URI for: {', '.join(sorted(missing))}")
    todo = [w for w in wanted if not deb_matches(debs / w.filename, w)]
    if todo:
        size = sum(w.size for w in todo) / 1e6
        names = ", ".join(w.filename for w in todo) if len(todo) <= 2 else f"{len(todo)} packages"
        s.say(f"downloading {names} ({size:.1f} MB)")
        asked = {re.split(r"[=/]", p, maxsplit=1)[0]: p for p in packages}
        apt(s, "apt-get", "download", *[asked[w.package] for w in todo], cwd=debs)
        for w in todo:
            if not deb_matches(debs / w.filename, w):
                raise StepError(f"apt-get download did not leave an intact {debs / w.filename}")
    else:
        s.say(f"{len(wanted)} .deb files already in {debs}")
    return [debs / w.filename for w in wanted]


def deb_fields(s: Setup, deb: Path) -> tuple[str, str]:
    out = s.run(["dpkg-deb", "-f", str(deb), "Package", "Version"]).stdout
    fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    return fields.get("Package", ""), fields.get("Version", "")


def merge_into(src: Path, dst: Path) -> None:
    """Move src's entries into dst (recursively); dst's entry wins a clash (it is canonical)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        target = dst / entry.name
        if entry.is_dir() and not entry.is_symlink() and target.is_dir() and not target.is_symlink():
            merge_into(entry, target)
        elif not (target.exists() or target.is_symlink()):
            os.rename(entry, target)
    shutil.rmtree(src)


def ensure_merged_usr(root: Path) -> None:
    """bin, sbin, lib, lib64 at the top of `root` become symlinks into usr/, as on Debian."""
    for name in MERGED_USR_DIRS:
        top, target = root / name, root / "usr" / name
        if top.is_symlink():
            continue
        target.mkdir(parents=True, exist_ok=True)
        if top.is_dir():
            merge_into(top, target)
        top.symlink_to(f"usr/{name}")


def unpack_atomically(s: Setup, debs: list[Path], dest: Path,
                      finish: Callable[[Path], None], stamp: dict) -> None:
    """dpkg -x every deb into a temp dir next to `dest`, finish/verify it, then swap it in."""
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{dest.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in parent.glob(f".{dest.name}.old-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = parent / f".{dest.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        for deb in debs:
            s.run(["dpkg", "-x", str(deb), str(tmp)])
        finish(tmp)
        write_json_atomically(tmp / STAMP_NAME, stamp)
        old = parent / f".{dest.name}.old-{os.getpid()}"
        if dest.exists() or dest.is_symlink():
            os.rename(dest, old)
        os.rename(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------
# 4. guest userspace
# ------------------------------------------------------------------------------------------------

def verify_guest_root(root: Path) -> str | None:
    """What is wrong with an unpacked guest root, or None."""
    for rel in ("usr/bin/cxl", "usr/bin/daxctl", "lib64/ld-linux-x86-64.so.2"):
        if not (root / rel).exists():
            return f"{root / rel} missing"
    for name in MERGED_USR_DIRS:
        if not (root / name).is_symlink():
            return f"{root / name} is not a symlink into usr/"
    return None


def check_guest_userspace(s: Setup) -> tuple[bool, str]:
    root = cache.guest_root_dir()
    stamp = read_json(root / STAMP_NAME)
    if not stamp:
        return False, f"{root} not unpacked"
    if sorted(stamp.get("packages", {})) != sorted(TRIXIE_GUEST_PACKAGES):
        return False, f"{root} was unpacked from another package list"
    if not is_ndctl_major(stamp.get("ndctl_version", "")):
        return False, f"{root} has ndctl {stamp.get('ndctl_version')}, want {NDCTL_MAJOR}"
    problem = verify_guest_root(root)
    if problem:
        return False, problem
    return True, f"ndctl {stamp['ndctl_version']} in {root}"


def run_guest_userspace(s: Setup) -> str:
    debs = download_debs(s, trixie_apt, list(TRIXIE_GUEST_PACKAGES))
    versions = {}
    for deb in debs:
        package, version = deb_fields(s, deb)
        versions[package] = version
    ndctl = versions.get("cxl", "")
    if not is_ndctl_major(ndctl):
        raise StepError(f"trixie's cxl package is version {ndctl or '?'}, need ndctl {NDCTL_MAJOR} "
                        "(has trixie moved on? update NDCTL_MAJOR after checking it works)")
    root = cache.guest_root_dir()

    def finish(tmp: Path) -> None:
        ensure_merged_usr(tmp)
        problem = verify_guest_root(tmp)
        if problem:
            raise StepError(f"after dpkg -x: {problem}")

    s.say(f"unpacking {len(debs)} packages into {root}")
    unpack_atomically(s, debs, root, finish, {
        "packages": versions, "ndctl_version": ndctl, "debs": [d.name for d in debs]})
    return f"ndctl {ndctl} in {root}"


# ------------------------------------------------------------------------------------------------
# 5. guest kernel
# ------------------------------------------------------------------------------------------------

def system_apt(s: Setup, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    tool, rest = args[0], args[1:]
    return s.run([tool, "-o", "APT::Sandbox::User=root", *rest], cwd=cwd, apt=True)


def modules_dir_of(root: Path, release: str) -> Path | None:
    for base in ("lib/modules", "usr/lib/modules"):
        path = root / base / release
        if path.is_dir() and not path.is_symlink():
            return path
    return None


def verify_kernel(root: Path, release: str) -> str | None:
    if not (root / "boot" / f"vmlinuz-{release}").is_file():
        return f"{root / 'boot' / f'vmlinuz-{release}'} missing"
    if not (root / "lib" / "modules" / release / "kernel" / "drivers" / "cxl").is_dir():
        return f"{root / 'lib/modules' / release / 'kernel/drivers/cxl'} missing"
    return None


def check_guest_kernel(s: Setup) -> tuple[bool, str]:
    root = cache.kernel_dir()
    stamp = read_json(root / STAMP_NAME)
    if not stamp.get("release"):
        return False, f"{root} not unpacked"
    if stamp.get("suite") != BACKPORTS_SUITE:
        return False, f"{root} holds {stamp.get('package')} {stamp.get('version')}, not from {BACKPORTS_SUITE}"
    problem = verify_kernel(root, stamp["release"])
    if problem:
        return False, problem
    return True, f"{stamp['package']} {stamp['version']}"


def run_guest_kernel(s: Setup) -> str:
    names = [n for n in system_apt(s, "apt-cache", "pkgnames", "linux-image-6.12.").stdout.split()
             if KERNEL_PACKAGE_RE.match(n)]
    if not names:
        raise StepError("apt knows no linux-image-6.12.*+deb12-amd64 package (apt-get update?)")
    package, version = choose_kernel_package(system_apt(s, "apt-cache", "madison", *names).stdout)
    release = kernel_release(package)
    s.say(f"chose {package} {version} from {BACKPORTS_SUITE}")
    (deb,) = download_debs(s, system_apt, [f"{package}={version}"])
    got = deb_fields(s, deb)
    if got != (package, version):
        raise StepError(f"{deb} contains {got[0]} {got[1]}, expected {package} {version}")
    root = cache.kernel_dir()

    def finish(tmp: Path) -> None:
        modules = modules_dir_of(tmp, release)
        if modules is not None and not (tmp / "lib").exists():
            (tmp / "lib").symlink_to("usr/lib")  # modules shipped under usr/lib only
        problem = verify_kernel(tmp, release)
        if problem:
            raise StepError(f"after dpkg -x: {problem}")

    s.say(f"unpacking {deb.name} into {root}")
    unpack_atomically(s, [deb], root, finish,
                      {"package": package, "version": version, "release": release,
                       "suite": BACKPORTS_SUITE, "deb": deb.name})
    return f"{package} {version}"


# ------------------------------------------------------------------------------------------------
# 6. manifest
# ------------------------------------------------------------------------------------------------

def expected_manifest(s: Setup) -> dict | None:
    kernel = read_json(cache.kernel_dir() / STAMP_NAME)
    guest = read_json(cache.guest_root_dir() / STAMP_NAME)
    if not kernel.get("release") or not guest.get("ndctl_version"):
        return None
    release = kernel["release"]
    modules = modules_dir_of(cache.kernel_dir(), release)
    version = qemu_version(s)
    if modules is None or version is None:
        return None
    return {
        "kernel_release": release,
        "kernel_package": kernel["package"],
        "kernel_version": kernel["version"],
        "vmlinuz": str((cache.kernel_dir() / "boot" / f"vmlinuz-{release}").resolve()),
        "modules_dir": str(modules.resolve()),
        "guest_root": str(cache.guest_root_dir().resolve()),
        "ndctl_version": guest["ndctl_version"],
        "qemu": str(QEMU_BINARY),
        "qemu_version": version,
    }


def check_manifest(s: Setup) -> tuple[bool, str]:
    want = expected_manifest(s)
    if want is None:
        return False, "kernel, guest userspace or QEMU not there yet"
    if read_json(cache.manifest_path()) != want:
        return False, f"{cache.manifest_path()} missing or out of date"
    return True, str(cache.manifest_path())


def run_manifest(s: Setup) -> str:
    want = expected_manifest(s)
    if want is None:
        raise StepError("kernel, guest userspace or QEMU missing (earlier steps did not finish)")
    write_json_atomically(cache.manifest_path(), want)
    return str(cache.manifest_path())


# ------------------------------------------------------------------------------------------------
# 7. python environment
# ------------------------------------------------------------------------------------------------

def venv_dir() -> Path:
    env = os.environ.get("PFCXL_VENV")
    return Path(env).expanduser().absolute() if env else REPO_ROOT / ".venv"


def pyproject_sha256() -> str:
    return file_sha256(REPO_ROOT / "pyproject.toml")


_DIRECT_URL_PROBE = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.distribution('pfcxl').read_text('direct_url.json') or '{}')\n"
    "except m.PackageNotFoundError:\n    print('{}')\n"
)


def editable_from_repo(s: Setup, venv: Path) -> bool:
    """Whether pip recorded pfcxl in `venv` as an editable install of this repository."""
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    try:
        # -I: the repo (cwd) holds a pfcxl.egg-info without direct_url.json that would shadow
        # the installed distribution's metadata
        out = s.run([str(python), "-I", "-c", _DIRECT_URL_PROBE], log=False).stdout
        info = json.loads(out)
    except (StepError, ValueError):
        return False
    return (info.get("url") == REPO_ROOT.as_uri()
            and bool(info.get("dir_info", {}).get("editable")))


def check_python_env(s: Setup) -> tuple[bool, str]:
    venv = venv_dir()
    if not (venv / "bin" / "python").exists():
        return False, f"no venv at {venv}"
    stamp = read_json(venv / VENV_STAMP_NAME)
    if not stamp:
        return False, f"no completed install recorded in {venv / VENV_STAMP_NAME}"
    if stamp.get("repo") != str(REPO_ROOT):
        return False, f"{venv} was set up for {stamp.get('repo')}, not {REPO_ROOT}"
    if stamp.get("pyproject_sha256") != pyproject_sha256():
        return False, f"pyproject.toml changed since the last install into {venv}"
    if not (venv / "bin" / "pfcxl").exists():
        return False, f"{venv / 'bin' / 'pfcxl'} missing"
    if not editable_from_repo(s, venv):
        return False, f"pfcxl is not installed editable from {REPO_ROOT} in {venv}"
    return True, f"pfcxl editable in {venv}"


def create_venv(s: Setup, venv: Path) -> None:
    cmd = [sys.executable, "-m", "venv", "--clear", str(venv)]
    proc = s.run(cmd, ok=tuple(range(256)))
    if proc.returncode == 0:
        return
    if "ensurepip" not in proc.stdout + proc.stderr:
        raise StepError(failure(cmd, proc))
    # Debian splits ensurepip out of python3 into python3-venv / python3.X-venv.
    s.need_root("apt-get install python3-venv")
    minor = f"python3.{sys.version_info.minor}-venv"
    s.say(f"ensurepip missing: apt-get install python3-venv {minor}")
    s.run(["apt-get", "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300",
           "python3-venv", minor], apt=True)
    s.run(cmd)


def run_python_env(s: Setup) -> str:
    venv = venv_dir()
    if not (venv / "bin" / "python").exists() or not (venv / "bin" / "pip").exists():
        s.say(f"creating venv {venv}")
        create_venv(s, venv)
    (venv / VENV_STAMP_NAME).unlink(missing_ok=True)
    s.say(f"pip install -e '{REPO_ROOT}[test]'")
    s.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-e", f"{REPO_ROOT}[test]"],
          cwd=REPO_ROOT)
    if not (venv / "bin" / "pfcxl").exists():
        raise StepError(f"pip install finished but {venv / 'bin' / 'pfcxl'} was not created")
    if not editable_from_repo(s, venv):
        raise StepError(f"pip install finished but pfcxl is not editable from {REPO_ROOT}")
    write_json_atomically(venv / VENV_STAMP_NAME,
                          {"pyproject_sha256": pyproject_sha256(), "repo": str(REPO_ROOT)})
    return f"pfcxl editable in {venv}"


# ================================================================================================

STEPS = [
    Step("bookworm-backports", check_backports, run_backports),
    Step("host packages", check_host_packages, run_host_packages),
    Step("trixie apt", check_trixie_apt, run_trixie_apt),
    Step("guest userspace", check_guest_userspace, run_guest_userspace),
    Step("guest kernel", check_guest_kernel, run_guest_kernel),
    Step("manifest", check_manifest, run_manifest),
    Step("python env", check_python_env, run_python_env),
]

EPILOG = "  " + __doc__.split("\n  ", 1)[1].split("\n\n", 1)[0] + """

Each step is skipped when its result is already there (dpkg versions, files, stamp files);
.deb files already downloaded are reused.

Environment:
  PFCXL_CACHE  where downloads and unpacked trees go (default ~/.cache/pfcxl); a log of every
               command run is kept in $PFCXL_CACHE/setup.log
  PFCXL_VENV   the Python virtual environment to create (default <repo>/.venv)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m host_tools.provision",
        description="Install and download everything pfcxl needs on this Debian 12 host. "
                    "Idempotent: steps whose result is present are skipped.",
        epilog="Steps:\n" + EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-python", action="store_true",
                        help="only steps 1-6 (no venv / pip install)")
    parser.add_argument("--check", action="store_true",
                        help="report what is missing without changing anything; exit 1 if any")
    args = parser.parse_args(argv)

    steps = STEPS[:-1] if args.skip_python else STEPS
    s = Setup(check_only=args.check)
    total = len(steps)
    timings: list[tuple[str, str, float]] = []
    started_all = time.monotonic()
    missing = 0
    for index, step in enumerate(steps, 1):
        s.prefix = f"{index}/{total} {step.name}"
        started = time.monotonic()
        try:
            done, detail = step.check(s)
            if args.check:
                s.say(f"ok ({detail})" if done else f"MISSING: {detail}")
                missing += not done
                continue
            if done:
                s.say(f"already present ({detail})")
                outcome = "present"
            else:
                s.say(f"to do: {detail}")
                detail = step.run(s)
                s.say(f"done in {time.monotonic() - started:.1f} s ({detail})")
                outcome = "done"
        except (StepError, OSError) as e:
            message = str(e).replace("\n", " ")
            timings.append((step.name, "FAILED", time.monotonic() - started))
            if not args.check:
                print_timings(timings, started_all)
            print(f"[setup] FAILED {s.prefix}: {message} (log: {s.log_path})",
                  file=sys.stderr, flush=True)
            return 1
        timings.append((step.name, outcome, time.monotonic() - started))

    if args.check:
        print(f"[setup] check: {missing} of {total} steps missing" if missing
              else f"[setup] check: all {total} steps present", flush=True)
        return 1 if missing else 0
    print_timings(timings, started_all)
    return 0


def print_timings(timings: list[tuple[str, str, float]], started_all: float) -> None:
    print("[setup] timings:")
    for name, outcome, seconds in timings:
        print(f"[setup]   {name:<20} {outcome:<8} {seconds:7.1f} s")
    print(f"[setup]   {'total':<20} {'':<8} {time.monotonic() - started_all:7.1f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
