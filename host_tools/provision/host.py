"""Steps 1-3, the host's apt side: the bookworm-backports source, the host packages (QEMU 10.0
from backports among them), and pfcxl's private trixie apt configuration in the cache."""

from __future__ import annotations

from pathlib import Path

from pfcxl import cache
from pfcxl.host_tools.provision.apt import (APT_ETC, APT_INSTALL, apt_lists_dir, has_packages_lists, host_mirror,
                  installed_versions, private_lists_state, sources_mentioning, update_private_lists)
from pfcxl.host_tools.provision.debian import BACKPORTS_SUITE, TRIXIE_SUITE, parse_qemu_version, render_deb822_source
from pfcxl.host_tools.provision.files import write_atomically
from pfcxl.host_tools.provision.runner import Setup, StepError

BACKPORTS_SOURCES = APT_ETC / "sources.list.d" / "pfcxl-backports.sources"

QEMU_PACKAGE = "qemu-system-x86"
QEMU_DPKG_VERSION_PREFIX = "1:10.0"  # bookworm's own 7.2 lacks volatile-memdev, generic ports, DCD
QEMU_VERSION_PREFIX = "10.0."
QEMU_BINARY = Path("/usr/bin/qemu-system-x86_64")  # the one the package installs, not a PATH lookup
HOST_PACKAGES = ("busybox-static", "cpio", "xz-utils", "zstd", "libc6-dev", "gcc",
                 "mmdebstrap")   # builds the Debian guest rootfs (--image debian) on first use
STATIC_LIBC = Path("/usr/lib/x86_64-linux-gnu/libc.a")


# --- 1. bookworm-backports ----------------------------------------------------------------------

def backports_lists_present(lists: Path) -> bool:
    release = any(lists.glob(f"*_dists_{BACKPORTS_SUITE}_InRelease")) or any(
        lists.glob(f"*_dists_{BACKPORTS_SUITE}_Release"))
    return release and has_packages_lists(lists, BACKPORTS_SUITE)


def check_backports(s: Setup) -> tuple[bool, str]:
    files = sources_mentioning(BACKPORTS_SUITE)
    if not files:
        return False, f"no apt source mentions {BACKPORTS_SUITE}"
    if not backports_lists_present(apt_lists_dir(s)):
        return False, f"{BACKPORTS_SUITE} is in {files[0]} but its package lists are missing"
    return True, f"in {files[0]}"


def run_backports(s: Setup) -> str:
    changed = False
    files = sources_mentioning(BACKPORTS_SUITE)
    if not files:
        s.need_root(f"writing {BACKPORTS_SOURCES}")
        uris, signed_by, components = host_mirror()
        text = render_deb822_source(uris, [BACKPORTS_SUITE], components, signed_by,
                                    comment="Added by pfcxl setup (host_tools/provision): "
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


# --- 2. host packages ---------------------------------------------------------------------------

def qemu_version(s: Setup) -> str | None:
    """What the packaged QEMU binary says its version is, or None when it is not installed."""
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
    apt_install = [*APT_INSTALL,
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


# --- 3. private trixie apt configuration --------------------------------------------------------

def trixie_sources_text() -> str:
    uris, signed_by, _ = host_mirror()
    return render_deb822_source(uris, [TRIXIE_SUITE], ["main"], signed_by,
                                comment="pfcxl's private trixie configuration (guest userspace only)")


def check_trixie_apt(s: Setup) -> tuple[bool, str]:
    return private_lists_state(cache.trixie_apt_dir(), "trixie.sources", trixie_sources_text(), [TRIXIE_SUITE])


def run_trixie_apt(s: Setup) -> str:
    s.say(f"apt-get update (private trixie config in {cache.trixie_apt_dir()})")
    update_private_lists(s, cache.trixie_apt_dir(), "trixie.sources", trixie_sources_text(), [TRIXIE_SUITE])
    return f"trixie lists in {cache.trixie_apt_dir() / 'lists'}"
