"""Step 9 (`--timed-qemu`, `make setup-timed`): the timed QEMU that --clock virtual boots.

Debian's own source of the installed qemu-system-x86 (bookworm-backports), built for
x86_64-softmmu with plugins and pfcxl's patch (qemu-10.0-virtual-time.patch beside this file),
into $PFCXL_CACHE/qemu-timed/<source version>/. Rebuilt only when the source version or the
patch changes; a changed patch is swapped in over the old one and ninja rebuilds only what it
touches. The +ds source lacks three things the build needs: meson 1.5.0 and pycotap 1.3.1 (pip
downloads the wheels into python/wheels), dtc (libfdt-dev, else meson would try to clone it) and
the edk2 firmware blobs (configure --disable-install-blobs, their unpacking is dropped from
pc-bios/meson.build, and the binary boots with Debian's firmware: host_tools/vm/timed_qemu.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from pathlib import Path

from pfcxl import cache, process
from pfcxl.host_tools.provision.apt import APT_INSTALL, host_mirror, installed_versions, private_apt_options
from pfcxl.host_tools.provision.debian import render_deb822_source
from pfcxl.host_tools.provision.files import read_json, write_atomically, write_json_atomically
from pfcxl.host_tools.provision.host import QEMU_PACKAGE
from pfcxl.host_tools.provision.python_env import venv_dir
from pfcxl.host_tools.provision.runner import Setup, StepError

PATCH = Path(__file__).with_name("qemu-10.0-virtual-time.patch")
BUILD_PACKAGES = ("libglib2.0-dev", "libpixman-1-dev", "ninja-build", "libfdt-dev", "python3-venv",
                  "pkg-config", "bzip2", "patch")
WHEELS = ("meson==1.5.0", "pycotap==1.3.1")
CONFIGURE = ("--target-list=x86_64-softmmu", "--enable-plugins", "--disable-docs", "--disable-install-blobs",
             "--disable-werror", "--disable-tools", "--disable-guest-agent")
TARGET = "qemu-system-x86_64"
BLOBS_LINE = "if unpack_edk2_blobs\n"
BLOBS_OFF = "if false  # pfcxl: the +ds source ships no edk2 blobs\n"
SOURCES = "qemu-src.sources"
STAMP = "built.json"   # read by host_tools/vm/timed_qemu.py


def patch_sha256() -> str:
    return hashlib.sha256(PATCH.read_bytes()).hexdigest()


def installed_version(s: Setup) -> str:
    """The installed QEMU package's full Debian version, e.g. 1:10.0.2+ds-2+deb13u1~bpo12+1."""
    version = installed_versions(s, [QEMU_PACKAGE]).get(QEMU_PACKAGE)
    if not version:
        raise StepError(f"{QEMU_PACKAGE} is not installed (the host packages step installs it)")
    return version


def upstream_version(debian_version: str) -> str:
    """10.0.2+ds of 1:10.0.2+ds-2+deb13u1~bpo12+1 (epoch and Debian revision dropped): the orig
    tarball that setup builds."""
    return debian_version.split(":", 1)[-1].rsplit("-", 1)[0]


def source_package_version(debian_version: str) -> str:
    """The source package's version that built a binary package: the binary's own, less a binNMU's
    +bN. apt-get source wants it exactly: apt matches no glob there, and a version without the
    epoch matches nothing."""
    return re.sub(r"\+b[0-9]+$", "", debian_version)


def source_version(s: Setup) -> str:
    return upstream_version(installed_version(s))


def check_timed_qemu(s: Setup) -> tuple[bool, str]:
    stamp = read_json(cache.timed_qemu_dir() / STAMP)
    binary = Path(stamp.get("binary", "/nonexistent"))
    if not binary.is_file():
        return False, f"no timed QEMU in {cache.timed_qemu_dir()}"
    want = source_version(s)
    if stamp.get("source") != want:
        return False, f"built from QEMU {stamp.get('source')}, the installed package is {want}"
    if stamp.get("patch_sha256") != patch_sha256():
        return False, f"{PATCH.name} changed since the build"
    return True, f"QEMU {want} + {PATCH.name} at {binary}"


def run_timed_qemu(s: Setup) -> str:
    started = time.monotonic()
    version = source_version(s)
    top = cache.timed_qemu_dir()
    tree = top / version
    tree.mkdir(parents=True, exist_ok=True)
    _build_packages(s)
    tarball = _download(s, installed_version(s), top)
    src = _source_tree(s, tarball, tree / "src")
    build = tree / "build"
    _configure(s, src, build)
    _ninja(s, build)
    binary = top / TARGET
    tmp = binary.with_suffix(".tmp")
    shutil.copy2(build / TARGET, tmp)
    s.run(["strip", str(tmp)])
    os.replace(tmp, binary)
    seconds = time.monotonic() - started
    write_json_atomically(top / STAMP, {"binary": str(binary), "source": version, "patch_sha256": patch_sha256(),
                                        "build_seconds": round(seconds, 1), "size_bytes": binary.stat().st_size,
                                        "built_at": time.time()})
    return f"{binary} ({binary.stat().st_size / 1e6:.0f} MB, QEMU {version} + {PATCH.name})"


def _build_packages(s: Setup) -> None:
    missing = [p for p in BUILD_PACKAGES if p not in installed_versions(s, list(BUILD_PACKAGES))]
    if missing:
        s.need_root("apt-get install")
        s.say(f"apt-get install {' '.join(missing)} (to build QEMU)")
        s.run([*APT_INSTALL, *missing], apt=True)


def _download(s: Setup, debian_version: str, top: Path) -> Path:
    """Debian's orig tarball of `debian_version`'s source, through a private apt configuration with
    bookworm-backports' deb-src (the .dsc is not always served; the orig tarball is, and is all the
    build needs)."""
    version = upstream_version(debian_version)
    tarball = top / f"qemu_{version}.orig.tar.xz"
    if tarball.is_file():
        return tarball
    apt_dir = top / "apt"
    for sub in ("lists/partial", "state", "cache/archives/partial"):
        (apt_dir / sub).mkdir(parents=True, exist_ok=True)
    (apt_dir / "state" / "status").write_text("")
    uris, signed_by, _ = host_mirror()
    text = render_deb822_source(uris, ["bookworm-backports"], ["main"], signed_by,
                                comment="pfcxl's private deb-src configuration (the timed QEMU's source)")
    write_atomically(apt_dir / SOURCES, text.replace("Types: deb\n", "Types: deb-src\n"))
    apt = ["apt-get", *private_apt_options(apt_dir, SOURCES)]
    s.say("apt-get update (deb-src bookworm-backports, private configuration)")
    s.run([*apt, "update"], apt=True)
    s.say(f"downloading qemu_{version}.orig.tar.xz (about 40 MB)")
    # exit 100 when the .dsc or the Debian tarball is not served: the orig tarball is checked below
    s.run([*apt, "source", "--download-only", f"qemu={source_package_version(debian_version)}"], cwd=top, apt=True, ok=(0, 100))
    if not tarball.is_file():
        raise StepError(f"apt-get source did not bring {tarball.name} (see the log)")
    return tarball


def _source_tree(s: Setup, tarball: Path, src: Path) -> Path:
    """The unpacked, patched source; a changed patch replaces the old one in place."""
    record = src.parent / "src.json"
    state = read_json(record)
    applied = src.parent / "applied.patch"
    if state.get("tarball") == tarball.name and src.is_dir():
        if state.get("patch_sha256") == patch_sha256():
            return src
        s.say(f"swapping in the changed {PATCH.name}")
        if applied.is_file():
            done = s.run(["patch", "-p1", "-R", "--forward", "-i", str(applied)], cwd=src, ok=(0, 1))
            if done.returncode == 0:
                _apply(s, src, applied, record, tarball)
                return src
        s.say("the old patch does not come off cleanly: unpacking the source again")
    s.say(f"unpacking {tarball.name}")
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    s.run(["tar", "xf", str(tarball), "-C", str(src), "--strip-components=1"])
    meson = src / "pc-bios" / "meson.build"
    text = meson.read_text()
    if text.count(BLOBS_LINE) != 1:
        raise StepError(f"{meson} has no `{BLOBS_LINE.strip()}` line to disable (another QEMU version?)")
    meson.write_text(text.replace(BLOBS_LINE, BLOBS_OFF))
    wheels = src / "python" / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    s.say(f"pip download {' '.join(WHEELS)} (the source's meson and pycotap)")
    s.run([str(venv_dir() / "bin" / "python"), "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
           *WHEELS])
    _apply(s, src, applied, record, tarball)
    return src


def _apply(s: Setup, src: Path, applied: Path, record: Path, tarball: Path) -> None:
    s.say(f"applying {PATCH.name}")
    s.run(["patch", "-p1", "--forward", "-i", str(PATCH)], cwd=src)
    shutil.copyfile(PATCH, applied)
    write_json_atomically(record, {"tarball": tarball.name, "patch_sha256": patch_sha256()})


def _configure(s: Setup, src: Path, build: Path) -> None:
    record = build.parent / "configure.json"
    if read_json(record).get("args") == list(CONFIGURE) and (build / "build.ninja").is_file():
        return
    if build.exists():
        shutil.rmtree(build)
    build.mkdir(parents=True)
    s.say("configure --target-list=x86_64-softmmu --enable-plugins ...")
    s.run([str(src / "configure"), *CONFIGURE, f"--prefix={build.parent / 'install'}"], cwd=build)
    write_json_atomically(record, {"args": list(CONFIGURE)})


def _ninja(s: Setup, build: Path) -> None:
    """ninja with a progress line every tenth of the build; one line naming the log on failure."""
    log = build / "ninja.log"
    s.say(f"building {TARGET} with ninja (about 25 minutes on 2 cores the first time; log {log})")
    cmd = ["ninja", "-j", str(os.cpu_count() or 1), TARGET]
    shown = -1
    last_error = ""
    with open(log, "w") as out:
        proc = process.start(cmd, cwd=build, stdout=process.PIPE, stderr=process.STDOUT, text=True,
                             errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if line.startswith("[") and "/" in line.split("]", 1)[0]:
                done, _, total = line[1:].split("]", 1)[0].partition("/")
                if done.isdigit() and total.isdigit() and int(total):
                    tenth = int(done) * 10 // int(total)
                    if tenth > shown:
                        shown = tenth
                        s.say(f"building: {done}/{total} steps")
            elif "error" in line.lower():
                last_error = line.strip()
        rc = proc.wait()
    if rc != 0:
        raise StepError(f"ninja {TARGET} exited {rc}: {last_error or 'see the log'} (log: {log})")
    if not (build / TARGET).is_file():
        raise StepError(f"ninja finished but {build / TARGET} is not there (log: {log})")

