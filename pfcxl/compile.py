"""Compiling our C sources (guest tools, the TCG plugin) with gcc, cached by the hash of what
goes in: the sources, the headers they include and the flags. A changed input gives a new file
name; an unchanged one is reused. Each build lands under a temporary name and is renamed, so a
concurrent or interrupted build never leaves a half-written binary under the final name."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

from pfcxl.errors import BuildError

from pfcxl.process import run


def input_digest(inputs: Sequence[Path], flags: Sequence[str]) -> str:
    digest = hashlib.sha256(" ".join(flags).encode())
    for path in inputs:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


def compile_cached(main: Path, inputs: Sequence[Path], flags: Sequence[str], out_dir: Path, name: str,
                   suffix: str = "") -> Path:
    """gcc FLAGS -o OUT_DIR/NAME-<digest>SUFFIX MAIN, unless that file exists; its absolute path.
    `inputs` lists every file the result depends on (main included)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    binary = (out_dir / f"{name}-{input_digest(inputs, flags)}{suffix}").resolve()
    if binary.exists():
        return binary
    tmp = binary.with_name(f".{binary.name}.{os.getpid()}.tmp")
    try:
        run(["gcc", *flags, "-o", str(tmp), str(main)], what=f"compiling {main.name}", error=BuildError)
        os.replace(tmp, binary)
    finally:
        tmp.unlink(missing_ok=True)
    return binary
