"""What a timed appliance drained, kept on disk (`pfcxl appliance start --timing pf --capture DIR`).

    DIR/host03.s7.records.partial   one attachment's records (device/trace_format.py, raw), appended
                                    as the service models them
    DIR/host03.s7.records           the same, renamed once the host detached (complete)
    DIR/host03.phases.json          the plugin's phase events of that host (written by multihost,
                                    which reads them from the host's plugin log): the row boundaries
    DIR/capture.json                the manifest, rewritten (write, then rename) whenever a stream
                                    completes; "complete": true once the service closed the capture

A stream file still named .partial, or one the manifest does not list, is not finished: the reader
takes only what the manifest lists, with its record count checked.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from pfcxl.errors import ApplianceError, PfcxlError

from .trace_format import RECORD_FIELDS, RECORD_SIZE

MANIFEST = "capture.json"
FORMAT = "pfcxl appliance capture 1"


def check_dir(folder: Path) -> Path:
    """The capture directory as an absolute path, if it can be one: absent (its parent must
    exist) or an empty directory; one line saying why not."""
    folder = Path(folder).absolute()
    if folder.exists():
        if not folder.is_dir():
            raise ApplianceError(f"capture directory {folder}: exists and is not a directory")
        if any(folder.iterdir()):
            raise ApplianceError(f"capture directory {folder}: not empty (a capture is never written over)")
    elif not folder.parent.is_dir():
        raise ApplianceError(f"capture directory {folder}: its parent {folder.parent} does not exist")
    if not os.access(folder if folder.exists() else folder.parent, os.W_OK):
        raise ApplianceError(f"capture directory {folder}: not writable")
    return folder


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


class CaptureWriter:
    """Appends each attachment's modelled records to its own file; thread-safe."""

    def __init__(self, folder: Path, system: str) -> None:
        self.folder = check_dir(folder)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self.system = system
        self._lock = threading.Lock()
        self._open: dict[int, dict] = {}        # stream key -> {host, port, file, records, fh}
        self._done: list[dict] = []
        self._manifest(complete=False)

    def _name(self, key: int, host: int) -> str:
        return f"host{host:02d}.s{key}.records"

    def stream(self, key: int, host: int, port: int) -> None:
        name = self._name(key, host)
        with self._lock:
            fh = open(self.folder / f"{name}.partial", "wb")
            self._open[key] = {"key": key, "host": host, "port": port, "file": name, "records": 0, "fh": fh}

    def add(self, key: int, records: "np.ndarray") -> None:
        with self._lock:
            s = self._open[key]
            s["fh"].write(records.tobytes(order="C"))
            s["records"] += len(records)

    def finish(self, key: int) -> None:
        """The stream is complete: flushed, renamed, listed in the manifest."""
        with self._lock:
            self._finish(key)
            self._manifest(complete=False)

    def _finish(self, key: int) -> None:
        s = self._open.pop(key)
        s.pop("fh").close()
        os.replace(self.folder / f"{s['file']}.partial", self.folder / s["file"])
        self._done.append(s)

    def close(self) -> None:
        with self._lock:
            for key in list(self._open):
                self._finish(key)
            self._manifest(complete=True)

    def _manifest(self, complete: bool) -> None:
        _write_json(self.folder / MANIFEST, {
            "format": FORMAT, "system": self.system, "record_size": RECORD_SIZE,
            "fields": [list(f) for f in RECORD_FIELDS], "complete": complete,
            "streams": sorted(self._done, key=lambda s: (s["host"], s["key"]))})


def write_phases(folder: Path, host: int, phases: list[dict]) -> None:
    """A host's plugin phase events (one per finished phase, in order) beside its records."""
    _write_json(Path(folder) / f"host{host:02d}.phases.json", {"host": host, "phases": phases})


def read_capture(folder: Path, *, need_complete: bool = True) -> dict:
    """{"system", "complete", "hosts": {host: {"port", "records", "phases"}}}: each host's records
    of all its attachments in order (numpy, trace_format.RECORD_FIELDS), its phases or None."""
    folder = Path(folder)
    try:
        doc = json.loads((folder / MANIFEST).read_text())
        streams = doc["streams"]
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, not {FORMAT!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PfcxlError(f"{folder / MANIFEST}: not a capture's manifest ({exc})") from exc
    if need_complete and not doc.get("complete"):
        raise PfcxlError(f"{folder}: the capture was not closed (the appliance is still running or died); "
                         "its manifest lists only the hosts that detached")
    import numpy as np   # only readers need it: the appliance client and the CLI stay light
    dtype = np.dtype(RECORD_FIELDS)
    hosts: dict[int, dict] = {}
    for s in streams:
        path = folder / s["file"]
        try:
            recs = np.fromfile(path, dtype=dtype)
        except OSError as exc:
            raise PfcxlError(f"{path}: cannot read ({exc.strerror})") from exc
        if len(recs) != s["records"] or path.stat().st_size != s["records"] * RECORD_SIZE:
            raise PfcxlError(f"{path}: holds {path.stat().st_size} bytes, the manifest says {s['records']} records")
        h = hosts.setdefault(int(s["host"]), {"port": s["port"], "parts": []})
        h["parts"].append(recs)
    for host, h in hosts.items():
        h["records"] = np.concatenate(h.pop("parts"))
        h["phases"] = _phases(folder, host)
    return {"system": doc.get("system"), "complete": bool(doc.get("complete")), "hosts": hosts}


def _phases(folder: Path, host: int) -> list[dict] | None:
    path = folder / f"host{host:02d}.phases.json"
    if not path.exists():
        return None
    try:
        return list(json.loads(path.read_text())["phases"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PfcxlError(f"{path}: not a host's phase list ({exc})") from exc
