"""The provisioning steps, in order.

Each is skipped when its result is already there; the checks look at real state: dpkg's
versions, files on disk, stamp files recording what was unpacked; nothing is downloaded twice.
STEP_TABLE (shown by --help) says what each step does.
"""

from __future__ import annotations

from pfcxl.host_tools.provision.acpica import check_acpica, run_acpica
from pfcxl.host_tools.provision.engines_env import check_engines_env, run_engines_env
from pfcxl.host_tools.provision.guest import (check_guest_kernel, check_guest_userspace, check_manifest, run_guest_kernel,
                    run_guest_userspace, run_manifest)
from pfcxl.host_tools.provision.host import (check_backports, check_host_packages, check_trixie_apt, run_backports,
                   run_host_packages, run_trixie_apt)
from pfcxl.host_tools.provision.python_env import check_python_env, run_python_env
from pfcxl.host_tools.provision.runner import Step
from pfcxl.host_tools.provision.timed_qemu import check_timed_qemu, run_timed_qemu

STEP_TABLE = """\
  1. bookworm-backports  apt source for bookworm-backports (same mirror and keyring as the
                         bookworm entry of /etc/apt/sources.list.d/debian.sources), apt-get update
  2. host packages       qemu-system-x86 1:10.0 from bookworm-backports, busybox-static, cpio,
                         xz-utils, zstd, libc6-dev (static libc.a), gcc, mmdebstrap
  3. trixie apt          a private apt configuration for Debian trixie under $PFCXL_CACHE/apt-trixie
                         (own sources, lists, state, cache; the system's sources are never touched)
  4. guest userspace     trixie's cxl/daxctl (ndctl 81) and their libraries, libc and loader,
                         unpacked with dpkg -x into $PFCXL_CACHE/guest-root (merged /usr)
  5. acpica tools        trixie's acpica-tools (iasl 20250404) and libc, unpacked into
                         $PFCXL_CACHE/acpica; iasl runs through trixie's loader (host untouched)
  6. guest kernel        Debian's newest linux-image-6.12.*+deb12-amd64 from bookworm-backports,
                         downloaded (not installed) and unpacked into $PFCXL_CACHE/kernel
  7. manifest            $PFCXL_CACHE/setup.json: kernel release, paths, ndctl, QEMU and iasl
  8. python env          venv at $PFCXL_VENV (default <repo>/.venv), pip install -e '<repo>[test]'
  9. timed qemu          (--timed-qemu; make setup-timed, which make test runs) Debian's source of the
                         installed QEMU with pfcxl's virtual-time patch, built for x86_64 into
                         $PFCXL_CACHE/qemu-timed (about 25 min on 2 cores, once; rebuilt only when
                         the source version or the patch changes): what --clock virtual boots

Only with --engines (make engines; make test runs it):
     engines env         <repo>/.venv-engines: torch 2.13.0 (CPU), lmcache 0.5.6, sglang 0.5.23 and
                         vllm 0.34.0 (these two --no-deps, with the modules their imports need),
                         pfcxl editable; about 3.7 GB installed
"""

STEPS = [
    Step("bookworm-backports", check_backports, run_backports),
    Step("host packages", check_host_packages, run_host_packages),
    Step("trixie apt", check_trixie_apt, run_trixie_apt),
    Step("guest userspace", check_guest_userspace, run_guest_userspace),
    Step("acpica tools", check_acpica, run_acpica),
    Step("guest kernel", check_guest_kernel, run_guest_kernel),
    Step("manifest", check_manifest, run_manifest),
    Step("python env", check_python_env, run_python_env),
]

# only with --timed-qemu: --clock virtual needs it, plain TCG does not
TIMED_QEMU = Step("timed qemu", check_timed_qemu, run_timed_qemu)
ENGINES_STEP = Step("engines env", check_engines_env, run_engines_env)
