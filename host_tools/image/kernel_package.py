"""--kernel-package VERSION|latest: a Debian kernel package (linux-image-*-amd64, the signed or
the -unsigned variant, with the linux-binary-* and linux-modules-* packages newer ones are split
into) from bookworm-backports, trixie or trixie-backports, booted through the --kernel/--modules
path (host_tools/image/own_kernel.py).

Its lists come from a private apt configuration in the cache (apt-kernels/, like setup's trixie
one: host_tools/provision/apt.py), refreshed when a week old; each version taken is unpacked
into kernel-packages/ and kept, so moving between Debian kernels is one flag and one download.
"""

from __future__ import annotations

import dataclasses
import fcntl
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pfcxl.errors import SetupError

from pfcxl import cache
from pfcxl.host_tools.image import own_kernel
from pfcxl.host_tools.provision.apt import download_debs, host_mirror, private_apt_options, private_lists_state, update_private_lists
from pfcxl.host_tools.provision.debian import render_deb822_source
from pfcxl.host_tools.provision.runner import Fetch, Setup, StepError
from pfcxl.host_tools.provision.unpack import STAMP_NAME, deb_fields, unpack_atomically

SUITES = ("bookworm-backports", "trixie", "trixie-backports")
SOURCES = "kernels.sources"
LATEST = "latest"
# linux-image-6.17.13+deb13-amd64[-unsigned]; not the -cloud-, -rt- or -dbg flavours
PACKAGE_RE = re.compile(r"linux-image-(\d+\.\d+[0-9.]*(?:-\d+)?(?:\+[a-z0-9.~]+)?-amd64)(-unsigned)?")


@dataclass(frozen=True)
class KernelPackage:
    """One Debian kernel: the package to download and where it came from."""

    package: str
    version: str            # the package's version, e.g. 6.17.13-1~bpo13+1
    suite: str
    release: str            # `uname -r`, e.g. 6.17.13+deb13-amd64

    @property
    def upstream(self) -> str:
        """The kernel.org version, e.g. 6.17.13."""
        return re.match(r"[0-9.]+", self.release).group(0).rstrip(".")

    def sort_key(self) -> tuple:
        return tuple(int(n) for n in self.upstream.split(".")), SUITES.index(self.suite), self.version

    def names(self) -> set[str]:
        """Every way --kernel-package may name it."""
        return {self.version, self.release, self.upstream, self.package, self.package.removesuffix("-unsigned")}


def parse_madison(text: str) -> list[KernelPackage]:
    """The kernels `apt-cache madison` lists in SUITES, one per (release, version, suite): the
    signed package when both are there (what Debian's linux-image-amd64 depends on; QEMU's loader
    ignores the appended signature), else the -unsigned one."""
    best: dict[tuple[str, str, str], tuple[int, KernelPackage]] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 3:
            continue
        name, version, origin = fields[:3]
        words = origin.split()
        suite = words[1].split("/", 1)[0] if len(words) >= 2 else ""
        match = PACKAGE_RE.fullmatch(name)
        if suite not in SUITES or match is None:
            continue
        found = KernelPackage(name, version, suite, match.group(1))
        signed = 0 if match.group(2) else 1
        key = (found.release, version, suite)
        if key not in best or signed > best[key][0]:
            best[key] = (signed, found)
    return sorted((k for _, k in best.values()), key=KernelPackage.sort_key)


def choose(spec: str, available: list[KernelPackage]) -> KernelPackage:
    """The kernel `spec` names (latest: the newest), or SetupError in one line listing what there is."""
    if spec == LATEST:
        matching = available
    else:
        matching = [k for k in available if spec in k.names()]
    if matching:
        return max(matching, key=KernelPackage.sort_key)
    listing = ", ".join(f"{k.upstream} ({k.version}, {k.suite})" for k in available) or "none (no lists?)"
    raise SetupError(f"--kernel-package {spec}: no such Debian kernel in {', '.join(SUITES)}; available: "
                     f"{listing}, or latest")


def sources_text() -> str:
    uris, signed_by, _ = host_mirror()
    return render_deb822_source(uris, list(SUITES), ["main"], signed_by,
                                comment="pfcxl's private configuration for --kernel-package (kernels only)")


def _apt(s: Setup, tool: str, *args: str, cwd: Path | None = None):
    return s.run([tool, *private_apt_options(cache.kernels_apt_dir(), SOURCES), *args], cwd=cwd, apt=True)


def available(s: Setup) -> list[KernelPackage]:
    """The kernels of SUITES, the lists refreshed first when missing or a week old."""
    fresh, _ = private_lists_state(cache.kernels_apt_dir(), SOURCES, sources_text(), list(SUITES))
    if not fresh:
        s.say(f"apt-get update (bookworm-backports, trixie, trixie-backports; private config in "
              f"{cache.kernels_apt_dir()})")
        update_private_lists(s, cache.kernels_apt_dir(), SOURCES, sources_text(), list(SUITES))
    names = [n for n in _apt(s, "apt-cache", "pkgnames", "linux-image-").stdout.split() if PACKAGE_RE.fullmatch(n)]
    return parse_madison(_apt(s, "apt-cache", "madison", *names).stdout) if names else []


def tree_of(k: KernelPackage) -> Path:
    return cache.kernel_packages_dir() / re.sub(r"[^A-Za-z0-9.+-]", "_", f"{k.release}_{k.version}")


def split_parts(show: str, release: str) -> list[str]:
    """The packages a kernel image is split into in Debian's newer builds (`apt-cache show`'s Depends):
    linux-binary-<release> holds the vmlinuz, linux-modules-<release> the modules and linux-base-<release>
    modules.builtin and the config; none for the older single-package kernels."""
    depends = next((line.split(":", 1)[1] for line in show.splitlines() if line.startswith("Depends:")), "")
    wanted = {f"linux-{part}-{release}" for part in ("binary", "modules", "base")}
    return sorted({name for name in re.findall(r"[a-z0-9][a-z0-9.+-]*", depends) if name in wanted})


def vmlinuz_of(root: Path, release: str) -> Path | None:
    """boot/vmlinuz-<release>, or lib/modules/<release>/vmlinuz where the split packages put it."""
    for path in (root / "boot" / f"vmlinuz-{release}", root / "lib" / "modules" / release / "vmlinuz"):
        if path.is_file():
            return path
    return None


def finish_tree(tmp: Path, release: str) -> None:
    """A freshly unpacked kernel: lib/ reachable (modules under usr/lib only), a vmlinuz, the CXL drivers."""
    if not (tmp / "lib").exists() and (tmp / "usr" / "lib").is_dir():
        (tmp / "lib").symlink_to("usr/lib")
    if vmlinuz_of(tmp, release) is None:
        raise StepError(f"after dpkg -x: no boot/vmlinuz-{release} nor lib/modules/{release}/vmlinuz")
    if not (tmp / "lib" / "modules" / release / "kernel" / "drivers" / "cxl").is_dir():
        raise StepError(f"after dpkg -x: no lib/modules/{release}/kernel/drivers/cxl")


def unpacked(s: Setup, k: KernelPackage) -> Path:
    """The kernel's tree (a vmlinuz, lib/modules/*), downloaded and unpacked when not yet there."""
    root = tree_of(k)
    if (root / STAMP_NAME).is_file() and vmlinuz_of(root, k.release) is not None:
        return root       # unpacked whole before, then swapped in (unpack_atomically)
    parts = split_parts(_apt(s, "apt-cache", "show", f"{k.package}={k.version}").stdout, k.release)
    debs = download_debs(s, _apt, [f"{name}={k.version}" for name in (k.package, *parts)])
    got = sorted(deb_fields(s, deb) for deb in debs)
    if got != sorted((name, k.version) for name in (k.package, *parts)):
        raise StepError(f"the downloaded packages are {got}, not {k.package} {k.version} and its parts")
    s.say(f"unpacking {', '.join(d.name for d in debs)} into {root}")
    unpack_atomically(s, debs, root, lambda tmp: finish_tree(tmp, k.release),
                      {"package": k.package, "version": k.version, "release": k.release, "suite": k.suite,
                       "debs": [d.name for d in debs]})
    return root


def resolve(spec: str, progress: Callable[[str], None] = lambda message: None) -> tuple[KernelPackage, Path]:
    """(the kernel `spec` names, its unpacked tree); SetupError in one line when it cannot be had."""
    s = Fetch(progress)
    cache.kernel_packages_dir().mkdir(parents=True, exist_ok=True)
    try:
        with open(cache.kernel_packages_dir() / ".lock", "w") as lock:   # one download and unpack at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            k = choose(spec, available(s))
            return k, unpacked(s, k)
    except StepError as exc:
        raise SetupError(f"--kernel-package {spec}: {exc}") from exc


def kernel(spec: str, progress: Callable[[str], None] = lambda message: None) -> own_kernel.Kernel:
    """What the image builder and the VM boot for --kernel-package `spec`."""
    k, root = resolve(spec, progress)
    booted = own_kernel.own(vmlinuz_of(root, k.release), root)
    return dataclasses.replace(booted, origin=f"Debian {k.package} {k.version} from {k.suite} "
                                              f"(--kernel-package {spec})")
