"""Steps 4-6, what the guest boots with, all in the cache: trixie's cxl/daxctl/ndctl userspace, Debian's
6.12 kernel from bookworm-backports, and the setup.json manifest that records both."""

from __future__ import annotations

from pathlib import Path

from pfcxl import cache
from pfcxl.host_tools.provision.apt import download_debs, system_apt, trixie_apt
from pfcxl.host_tools.provision.debian import (BACKPORTS_SUITE, KERNEL_PACKAGE_RE, NDCTL_MAJOR, choose_kernel_package,
                     is_ndctl_major, kernel_release)
from pfcxl.host_tools.provision.files import read_json, write_json_atomically
from pfcxl.host_tools.provision.host import QEMU_BINARY, qemu_version
from pfcxl.host_tools.provision.runner import Setup, StepError
from pfcxl.host_tools.provision.unpack import MERGED_USR_DIRS, STAMP_NAME, deb_fields, ensure_merged_usr, unpack_atomically

# trixie's ndctl 81 with everything its binaries need (DT_NEEDED closure)
TRIXIE_GUEST_PACKAGES = (
    "cxl", "daxctl", "ndctl", "libcxl1", "libdaxctl1", "libndctl6", "libjson-c5", "libkmod2", "libudev1",
    "libuuid1", "libc6", "libtraceevent1", "libtracefs1", "libzstd1", "liblzma5", "libssl3t64",
    "libkeyutils1", "libiniparser4", "libcap2", "zlib1g", "libselinux1", "libpcre2-8-0",
    "libblkid1", "libmount1",
)


def require_unpacked(problem: str | None) -> None:
    """Fail the unpack when verifying the fresh tree found a problem."""
    if problem:
        raise StepError(f"after dpkg -x: {problem}")


# --- 4. guest userspace -------------------------------------------------------------------------

def verify_guest_root(root: Path) -> str | None:
    """What is wrong with an unpacked guest root, or None."""
    for rel in ("usr/bin/cxl", "usr/bin/daxctl", "usr/bin/ndctl", "lib64/ld-linux-x86-64.so.2"):
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
        require_unpacked(verify_guest_root(tmp))

    s.say(f"unpacking {len(debs)} packages into {root}")
    unpack_atomically(s, debs, root, finish, {
        "packages": versions, "ndctl_version": ndctl, "debs": [d.name for d in debs]})
    return f"ndctl {ndctl} in {root}"


# --- 5. guest kernel ----------------------------------------------------------------------------

def modules_dir_of(root: Path, release: str) -> Path | None:
    for base in ("lib/modules", "usr/lib/modules"):
        path = root / base / release
        if path.is_dir() and not path.is_symlink():
            return path
    return None


def verify_kernel(root: Path, release: str) -> str | None:
    """What is wrong with an unpacked kernel tree, or None."""
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
        return False, (f"{root} holds {stamp.get('package')} {stamp.get('version')}, "
                       f"not from {BACKPORTS_SUITE}")
    problem = verify_kernel(root, stamp["release"])
    if problem:
        return False, problem
    return True, f"{stamp['package']} {stamp['version']}"


def run_guest_kernel(s: Setup) -> str:
    names = [n for n in system_apt(s, "apt-cache", "pkgnames", "linux-image-6.12.").stdout.split()
             if KERNEL_PACKAGE_RE.fullmatch(n)]
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
        require_unpacked(verify_kernel(tmp, release))

    s.say(f"unpacking {deb.name} into {root}")
    unpack_atomically(s, [deb], root, finish,
                      {"package": package, "version": version, "release": release,
                       "suite": BACKPORTS_SUITE, "deb": deb.name})
    return f"{package} {version}"


# --- 6. manifest --------------------------------------------------------------------------------

def expected_manifest(s: Setup) -> dict | None:
    """What setup.json should say, or None while the kernel, userspace or QEMU is missing."""
    kernel = read_json(cache.kernel_dir() / STAMP_NAME)
    guest = read_json(cache.guest_root_dir() / STAMP_NAME)
    acpica = read_json(cache.acpica_dir() / STAMP_NAME)
    if not kernel.get("release") or not guest.get("ndctl_version") or not acpica.get("packages"):
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
        "acpica_root": str(cache.acpica_dir().resolve()),
        "acpica_version": acpica["packages"].get("acpica-tools", ""),
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
