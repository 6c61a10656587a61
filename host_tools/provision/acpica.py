"""The ACPICA tools (iasl) from Debian trixie, for checking our tables with an independent judge.

Bookworm's iasl (20200925) does not know CEDT; trixie's (20250404) needs glibc 2.38, newer than
bookworm's. So trixie's acpica-tools and libc6 are unpacked side by side in the cache and iasl
runs through trixie's own loader; nothing is installed on the host.
"""

from __future__ import annotations

from pathlib import Path

from pfcxl import cache
from pfcxl.host_tools.provision.apt import download_debs, trixie_apt
from pfcxl.host_tools.provision.files import read_json
from pfcxl.host_tools.provision.runner import Setup, StepError
from pfcxl.host_tools.provision.unpack import STAMP_NAME, deb_fields, ensure_merged_usr, unpack_atomically

ACPICA_PACKAGES = ("acpica-tools", "libc6")
MIN_ACPICA_VERSION = 20240827        # first release whose iasl decodes every CEDT/CDAT field we write


def verify_acpica(root: Path) -> str | None:
    for rel in ("usr/bin/iasl", "usr/lib64/ld-linux-x86-64.so.2", "usr/lib/x86_64-linux-gnu/libc.so.6"):
        if not (root / rel).exists():
            return f"{root / rel} missing"
    return None


def acpica_version(version: str) -> int:
    """'20250404-1' -> 20250404 (0 when it does not parse)."""
    head = version.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


def check_acpica(s: Setup) -> tuple[bool, str]:
    root = cache.acpica_dir()
    stamp = read_json(root / STAMP_NAME)
    version = stamp.get("packages", {}).get("acpica-tools", "")
    if not version:
        return False, f"{root} not unpacked"
    problem = verify_acpica(root)
    if problem:
        return False, problem
    return True, f"iasl {version} in {root}"


def run_acpica(s: Setup) -> str:
    debs = download_debs(s, trixie_apt, list(ACPICA_PACKAGES))
    versions = dict(deb_fields(s, deb) for deb in debs)
    version = versions.get("acpica-tools", "")
    if acpica_version(version) < MIN_ACPICA_VERSION:
        raise StepError(f"trixie's acpica-tools is {version or '?'}, older than {MIN_ACPICA_VERSION}")
    root = cache.acpica_dir()

    def finish(tmp: Path) -> None:
        ensure_merged_usr(tmp)
        problem = verify_acpica(tmp)
        if problem:
            raise StepError(f"after dpkg -x: {problem}")

    s.say(f"unpacking acpica-tools {version} with trixie's libc into {root}")
    unpack_atomically(s, debs, root, finish, {"packages": versions, "debs": [d.name for d in debs]})
    return f"iasl {version} in {root}"
