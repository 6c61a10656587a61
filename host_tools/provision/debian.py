"""Pure Debian knowledge: deb822 apt sources, the mirror and keyring to reuse, suite mentions,
the guest kernel package to take, and version strings. No I/O; unit-tested."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from pfcxl.host_tools.provision.runner import StepError

DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
HOST_SUITE = "bookworm"
BACKPORTS_SUITE = "bookworm-backports"
TRIXIE_SUITE = "trixie"

# The guest kernel: Debian's 6.12 from bookworm-backports, e.g. linux-image-6.12.38+deb12-amd64
# (signed) and linux-image-6.12.38+deb12-amd64-unsigned. Both carry the same release string,
# config and modules.
KERNEL_PACKAGE_RE = re.compile(r"linux-image-(6\.12\.(\d+)\+deb12-amd64)(-unsigned)?")   # fullmatch
NDCTL_MAJOR = "81"  # bookworm's 76.1 cannot create ram regions ("not supported yet", exit 0)


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
        match = KERNEL_PACKAGE_RE.fullmatch(name)
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
    match = KERNEL_PACKAGE_RE.fullmatch(package)
    if not match:
        raise StepError(f"not a 6.12 bookworm-backports kernel package name: {package}")
    return match.group(1)


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

