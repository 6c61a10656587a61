"""What a timed appliance drained, kept on disk (`pfcxl appliance start --timing pf --capture DIR`).

    DIR/host03.s7.records.partial   one attachment's records (device/trace/records.py, raw), appended
                                    as the service models them
    DIR/host03.s7.records           the same, renamed once the host detached (complete)
    DIR/host03.phases.json          the plugin's phase events of that host (written by multihost,
                                    which reads them from the host's plugin log): the row boundaries
    DIR/capture.json                the manifest, rewritten (write, then rename) whenever a stream
                                    ends; "closed": true once the service closed the capture,
                                    "complete": true if then nothing is in "problems" (a stream cut
                                    short, a write that failed)

A stream file still named .partial, or one the manifest does not list, is not finished: the reader
takes only what the manifest lists, with its record count checked.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from pfcxl.errors import ApplianceError, PfcxlError

from pfcxl.device.trace.records import RECORD_FIELDS, RECORD_SIZE

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger("pfcxl.appliance")
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
    try:
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)          # never a half-written manifest left behind
        raise


class CaptureWriter:
    """Appends each attachment's modelled records to its own file; thread-safe.

    A capture that cannot be written (a full disk) never stops the modelling: the first failure
    is kept in `error`, every stream file is cut back to the records it fully holds, nothing more
    is written to them, and the manifest says the capture is incomplete and why. A stream cut
    short for another reason (its ring broke) is listed with that reason (`cut`)."""

    def __init__(self, folder: Path, system: str) -> None:
        self.folder = check_dir(folder)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self.system = system
        self.error: str | None = None           # why the capture stopped being written
        self.lost = 0                           # records modelled and not captured since
        self._lock = threading.Lock()
        self._open: dict[int, dict] = {}        # stream key -> {host, port, file, records, fd}
        self._done: list[dict] = []
        self._manifest(complete=False)

    def _name(self, key: int, host: int) -> str:
        return f"host{host:02d}.s{key}.records"

    def stream(self, key: int, host: int, port: int) -> None:
        name = self._name(key, host)
        with self._lock:
            s = {"key": key, "host": host, "port": port, "file": name, "records": 0, "cut": None, "fd": None,
                 "created": False}
            self._open[key] = s
            if self.error is None:
                try:
                    s["fd"] = os.open(self.folder / f"{name}.partial",
                                      os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                    s["created"] = True
                except OSError as exc:
                    self._fail(f"creating {name}.partial", exc)

    def add(self, key: int, records: "np.ndarray") -> None:
        with self._lock:
            s = self._open[key]
            if s["fd"] is None:
                self.lost += len(records)
                return
            data = memoryview(records.tobytes(order="C"))
            try:
                while data:
                    data = data[os.write(s["fd"], data):]
            except OSError as exc:
                self.lost += len(records)
                self._fail(f"writing {s['file']}", exc)
                return
            s["records"] += len(records)

    def _fail(self, doing: str, exc: OSError) -> None:
        """Stop writing: every stream keeps exactly the records it fully holds, and the manifest
        says why (its own failure ends here: it is not retried)."""
        first = self.error is None
        if first:
            self.error = f"{doing}: {exc.strerror or exc}"
            log.error("capture %s stopped (the modelling goes on): %s", self.folder, self.error)
        for s in self._open.values():
            if s["fd"] is not None:
                try:
                    os.ftruncate(s["fd"], s["records"] * RECORD_SIZE)
                except OSError:
                    pass                         # not a regular file; the manifest's count still rules
                os.close(s["fd"])
                s["fd"] = None
        if first:                                # the cut files freed room for this small file
            self._manifest(complete=False)

    def finish(self, key: int, cut: str | None = None) -> None:
        """The stream ends (the host detached, or `cut`: why its records stop short): renamed,
        listed in the manifest."""
        with self._lock:
            self._finish(key, cut)
            self._manifest(complete=False)

    def _finish(self, key: int, cut: str | None = None) -> None:
        s = self._open.pop(key)
        s["cut"] = cut
        fd, created = s.pop("fd"), s.pop("created")
        try:
            if fd is not None:
                os.close(fd)
            if created:
                os.replace(self.folder / f"{s['file']}.partial", self.folder / s["file"])
        except OSError as exc:
            self._fail(f"closing {s['file']}", exc)
            created = False
        if created:                              # only a file in place is listed
            self._done.append(s)

    def close(self) -> None:
        """Finish every stream and write the manifest; never raises for the disk."""
        with self._lock:
            for key in list(self._open):
                self._finish(key)
            self._manifest(complete=True)

    def problems(self) -> list[str]:
        out = [f"capture stopped: {self.error} ({self.lost} modelled records not captured)"] if self.error else []
        return out + [f"host {s['host']} stream {s['key']} cut: {s['cut']}" for s in self._done if s["cut"]]

    def _manifest(self, complete: bool) -> None:
        problems = self.problems()
        try:
            _write_json(self.folder / MANIFEST, {
                "format": FORMAT, "system": self.system, "record_size": RECORD_SIZE,
                "fields": [list(f) for f in RECORD_FIELDS], "complete": complete and not problems,
                "closed": complete, "problems": problems,
                "streams": sorted(self._done, key=lambda s: (s["host"], s["key"]))})
        except OSError as exc:
            self._fail(f"writing {MANIFEST}", exc)


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
    if need_complete and doc.get("problems"):
        raise PfcxlError(f"{folder}: the capture is incomplete: {'; '.join(map(str, doc['problems']))}")
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
