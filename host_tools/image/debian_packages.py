"""`--packages`: more Debian trixie packages in the Debian guest image, beside the base rootfs of
host_tools/image/debian.py. Resolved with their dependencies by apt in pfcxl's private trixie configuration
(the lists setup keeps), minus what the base rootfs already has; the .debs are downloaded into
the shared cache (`cache.debs_dir()`), unpacked with `dpkg -x` and kept as one tarball per set
of .deb files, which the image builder lays over the rootfs. No maintainer scripts run: what
such a package needs at install time (a user, a service) is not there, its files are.
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

from pfcxl import cache
from pfcxl.errors import ImageError, PfcxlError

# Debian policy 5.6.1: lower case letters, digits, + - . ; at least two characters, alphanumeric first
NAME_RE = re.compile(r"[a-z0-9][a-z0-9+.-]+")


def parse_names(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`numactl,strace` (or a list of names) -> the sorted distinct names; a malformed one in one line."""
    words = text.split(",") if isinstance(text, str) else list(text)
    names = set()
    for word in words:
        name = word.strip() if isinstance(word, str) else word
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise PfcxlError(f"--packages: {word!r} is not a Debian package name "
                             "(lower-case letters, digits, '+', '-', '.'; comma-separated)")
        names.add(name)
    return tuple(sorted(names))


def installed_in(tar_path: Path) -> set[str]:
    """The packages dpkg installed in a rootfs tarball (its var/lib/dpkg/status)."""
    with tarfile.open(tar_path) as tar:
        member = next((m for m in tar.getmembers() if m.name.lstrip("./") == "var/lib/dpkg/status"), None)
        status = tar.extractfile(member) if member else None
        text = status.read().decode(errors="replace") if status else ""
    names = set()
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            names.add(fields["Package"])
    return names


def parse_simulation(text: str) -> list[tuple[str, str]]:
    """(name, version) of each `Inst name (version suite [arch])` line of `apt-get install -s`."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^Inst (\S+) (?:\[\S+\] )?\((\S+)", text, re.M)]


def not_installed_by_name(names: tuple[str, ...], simulation: str) -> list[str]:
    """The asked-for names no `Inst` line of `simulation` installs. apt reads a name that is no
    package as a regular expression when it holds '.' or '+' (`numa.+`, `python3-num.+`: 152
    packages), and a virtual package's name as its provider: both are valid Debian names, so only
    apt's answer tells them from packages. The simulation starts from an empty dpkg status, so a
    real package asked for is always among its Inst lines."""
    installed = {name for name, _ in parse_simulation(simulation)}
    return [name for name in names if name not in installed]


def unknown_names(text: str) -> list[str]:
    """The package names apt's errors say it cannot install."""
    found = re.findall(r"Unable to locate package (\S+)|Package '?([^' ]+)'? has no installation candidate", text)
    return [a or b for a, b in found]


def layer(names: tuple[str, ...], base_tar: Path, progress: Callable[[str], None]) -> Path:
    """The tarball of `names` and the dependencies the rootfs in `base_tar` lacks (built when
    missing); ImageError in one line naming a package trixie does not have."""
    from pfcxl.host_tools.provision import host as provision_host
    from pfcxl.host_tools.provision.apt import download_debs, private_apt_options, trixie_apt
    from pfcxl.host_tools.provision.runner import Fetch, StepError
    from pfcxl.host_tools.provision.unpack import ensure_merged_usr
    s = Fetch(progress)
    try:
        if not provision_host.check_trixie_apt(s)[0]:
            provision_host.run_trixie_apt(s)
        # the empty dpkg status of the private configuration: apt lists the whole closure
        proc = s.run(["apt-get", *private_apt_options(cache.trixie_apt_dir()), "install", "-s",
                      "--no-install-recommends", *names], apt=True, ok=(0, 100))
        if proc.returncode:
            missing = unknown_names(proc.stderr + proc.stdout)
            if missing:
                raise ImageError(f"--packages: no Debian package {', '.join(missing)} in trixie")
            why = (proc.stderr.strip().splitlines() or ["exit 100"])[-1]
            raise ImageError(f"--packages {','.join(names)}: apt cannot install them in trixie: {why}")
        inexact = not_installed_by_name(names, proc.stdout)
        if inexact:
            raise ImageError(f"--packages: no Debian package named {', '.join(inexact)} in trixie (apt reads such "
                             "a name as a pattern, or as a package that provides it); give exact package names")
        have = installed_in(base_tar)
        wanted = [f"{n}={v}" for n, v in parse_simulation(proc.stdout) if n not in have]
        debs = download_debs(s, trixie_apt, wanted) if wanted else []
        key = hashlib.sha256(" ".join(sorted(d.name for d in debs)).encode()).hexdigest()[:12]
        out = cache.cache_dir() / "debian" / f"packages-{key}.tar"
        if out.exists():
            return out
        progress(f"unpacking {len(debs)} Debian packages for --packages {','.join(names)}")
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".packages-") as tmp:
            tree = Path(tmp) / "root"
            tree.mkdir()
            for deb in debs:
                s.run(["dpkg-deb", "-x", str(deb), str(tree)])
            ensure_merged_usr(tree)
            part = Path(tmp) / "layer.tar"
            with tarfile.open(part, "w") as tar:
                tar.add(tree, arcname=".")
            os.replace(part, out)       # whole or not at all
        return out
    except StepError as exc:
        raise ImageError(f"--packages {','.join(names)}: {exc}") from exc
