"""Running apt and dpkg-query: the system's configuration and pfcxl's private trixie one, the
host's apt sources and lists on disk, and downloading .debs without installing them."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Callable

from pfcxl import cache, process
from pfcxl.host_tools.provision.debian import DebURI, mentions_suite, mirror_and_keyring, parse_print_uris
from pfcxl.host_tools.provision.files import file_digest, read_json, write_atomically, write_json_atomically
from pfcxl.host_tools.provision.runner import Setup, StepError

APT_ETC = Path("/etc/apt")
DEBIAN_SOURCES = APT_ETC / "sources.list.d" / "debian.sources"
DEFAULT_APT_LISTS = Path("/var/lib/apt/lists")
APT_INSTALL = ("apt-get", "install", "-y", "--no-install-recommends",
               "-o", "DPkg::Lock::Timeout=300")

PRIVATE_LISTS_MAX_AGE_S = 7 * 24 * 3600   # a private configuration's lists are refreshed after a week
UPDATE_STAMP = "updated.json"

# system_apt or trixie_apt: (setup, tool, *args, cwd=...) -> the finished process
AptRun = Callable[..., process.CompletedProcess]


def private_apt_options(apt_dir: Path, sources: str = "trixie.sources") -> list[str]:
    """apt-get/apt-cache -o options for a private configuration under `apt_dir` (the trixie one,
    or --kernel-package's, host_tools/image/kernel_package.py), its sources in `apt_dir / sources`.

    Everything apt reads or writes is ours: sources (no sources.list.d), lists, state, the dpkg
    status (an empty file, so resolution never sees what the host has installed), cache and
    archives, preferences. One architecture, no translations, no `_apt` sandbox user (it could not
    enter a cache under /root).
    """
    return [
        "-o", f"Dir::Etc::SourceList={apt_dir / sources}",
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


def system_apt(s: Setup, tool: str, *args: str,
               cwd: Path | None = None) -> process.CompletedProcess:
    """`tool` (apt-get, apt-cache) with the host's own apt configuration."""
    return s.run([tool, "-o", "APT::Sandbox::User=root", *args], cwd=cwd, apt=True)


def trixie_apt(s: Setup, tool: str, *args: str,
               cwd: Path | None = None) -> process.CompletedProcess:
    """`tool` (apt-get, apt-cache) with the private trixie configuration in the cache."""
    return s.run([tool, *private_apt_options(cache.trixie_apt_dir()), *args], cwd=cwd, apt=True)


def private_lists_state(apt_dir: Path, sources: str, text: str, suites: list[str]) -> tuple[bool, str]:
    """(fresh, why) for a private configuration: its sources file says `text`, every suite's lists
    are there, fetched for these sources less than a week ago."""
    try:
        if (apt_dir / sources).read_text() != text:
            return False, f"{apt_dir / sources} out of date"
    except OSError:
        return False, f"{apt_dir / sources} missing"
    missing = [suite for suite in suites if not has_packages_lists(apt_dir / "lists", suite)]
    if missing:
        return False, f"no {', '.join(missing)} package lists in {apt_dir / 'lists'}"
    # apt dates list files by the server's Last-Modified, so freshness is kept in our own stamp.
    stamp = read_json(apt_dir / UPDATE_STAMP)
    age = time.time() - float(stamp.get("updated_at", 0))
    if stamp.get("sources_sha256") != hashlib.sha256(text.encode()).hexdigest():
        return False, "lists were fetched for other sources"
    if age > PRIVATE_LISTS_MAX_AGE_S:
        return False, f"lists are {age / 86400:.1f} days old (refreshed after 7)"
    return True, f"lists {age / 86400:.1f} days old in {apt_dir}"


def update_private_lists(s: Setup, apt_dir: Path, sources: str, text: str, suites: list[str]) -> None:
    """Write a private configuration's sources (an empty dpkg status beside them) and apt-get update."""
    for sub in ("lists/partial", "state", "cache/archives/partial"):
        (apt_dir / sub).mkdir(parents=True, exist_ok=True)
    status = apt_dir / "state" / "status"
    if not status.exists() or status.stat().st_size:
        status.write_text("")
    write_atomically(apt_dir / sources, text)
    s.run(["apt-get", *private_apt_options(apt_dir, sources), "update"], apt=True)
    missing = [suite for suite in suites if not has_packages_lists(apt_dir / "lists", suite)]
    if missing:
        raise StepError(f"apt-get update succeeded but no {', '.join(missing)} lists in {apt_dir / 'lists'}")
    write_json_atomically(apt_dir / UPDATE_STAMP, {"updated_at": time.time(),
                                                   "sources_sha256": hashlib.sha256(text.encode()).hexdigest()})


# --- the host's apt sources and lists -----------------------------------------------------------

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


def sources_mentioning(suite: str) -> list[Path]:
    """The host's apt source files that enable `suite`."""
    found = []
    for path in apt_source_files():
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if mentions_suite(text, path.suffix == ".sources", suite):
            found.append(path)
    return found


def has_packages_lists(lists: Path, suite: str) -> bool:
    """Whether `lists` (an apt lists directory) holds `suite`'s main amd64 Packages index."""
    return any(lists.glob(f"*_dists_{suite}_main_binary-amd64_Packages*"))


def host_mirror() -> tuple[list[str], str, list[str]]:
    """Mirror URIs, Signed-By and components of the host's bookworm entry (or the defaults)."""
    try:
        text = DEBIAN_SOURCES.read_text()
    except OSError:
        text = None
    return mirror_and_keyring(text)


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


# --- downloads ----------------------------------------------------------------------------------

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
    return file_digest(path, algo.lower()) == expected.lower()


def download_debs(s: Setup, apt: AptRun, packages: list[str]) -> list[Path]:
    """Download `packages` (names, or name=version) into debs_dir, skipping files already there
    intact; their paths."""
    debs = cache.debs_dir()
    debs.mkdir(parents=True, exist_ok=True)
    # apt prints no URI for a file already in its working directory, so ask from elsewhere: we
    # want every URI, and check the files ourselves.
    wanted = parse_print_uris(apt(s, "apt-get", "download", "--print-uris", *packages,
                                  cwd=debs.parent).stdout)
    asked = {re.split(r"[=/]", p, maxsplit=1)[0]: p for p in packages}  # bare name -> as asked
    if {w.package for w in wanted} != set(asked):
        missing = set(asked) - {w.package for w in wanted}
        raise StepError("apt-get download --print-uris gave no URI for: "
                        + ", ".join(sorted(missing)))
    todo = [w for w in wanted if not deb_matches(debs / w.filename, w)]
    if todo:
        size = sum(w.size for w in todo) / 1e6
        names = ", ".join(w.filename for w in todo) if len(todo) <= 2 else f"{len(todo)} packages"
        s.say(f"downloading {names} ({size:.1f} MB)")
        apt(s, "apt-get", "download", *[asked[w.package] for w in todo], cwd=debs)
        for w in todo:
            if not deb_matches(debs / w.filename, w):
                raise StepError(f"apt-get download did not leave an intact {debs / w.filename}")
    else:
        s.say(f"{len(wanted)} .deb files already in {debs}")
    return [debs / w.filename for w in wanted]
