"""Reading the JSON lines in a guest's output.

The guest tools (guest/src/*.c, guest/include/pfcxl_tool.h) print their result as one JSON line
that starts `{"tool":"NAME"`, among whatever else the command printed (kernel messages on the
console, a shell's own lines). Callers pick what a line that starts like JSON but does not parse
means: `bad="raise"` (the result is broken: one clear error naming the line) or `bad="skip"` (a
line still being written, a reader that can wait for the next one).
"""

from __future__ import annotations

import json
from typing import Literal

from pfcxl.errors import PfcxlError

Bad = Literal["raise", "skip"]


def tool_prefix(tool: str) -> str:
    """How a guest tool's result line starts (pfcxl_tool.h writes the "tool" key first, no spaces)."""
    return f'{{"tool":"{tool}"'


def json_lines(output: str, prefix: str = "{", *, tagged: bool = False, bad: Bad = "raise",
               error: type[PfcxlError] = PfcxlError, what: str = "guest output") -> list[dict]:
    """Every line of `output` that starts with `prefix`, parsed, in order. `tagged`: the prefix is
    a tag before the JSON (`KVPY {...}`), not its start. `what` names the source in errors."""
    found = []
    for number, line in enumerate(output.splitlines(), 1):
        line = line.strip()
        if not line.startswith(prefix):
            continue
        text = line[len(prefix):] if tagged else line
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            if bad == "skip":
                continue
            raise error(f"{what}: line {number} starts like a JSON result but is not JSON ({exc.msg} "
                        f"at column {exc.colno}): {line[:200]}") from exc
        if not isinstance(value, dict):
            if bad == "skip":
                continue
            raise error(f"{what}: line {number} is JSON but not an object: {line[:200]}")
        found.append(value)
    return found


def tool_json(output: str, tool: str, *, error: type[PfcxlError] = PfcxlError, what: str = "") -> dict:
    """The one result line guest tool `tool` printed; `error` if there is none or it is not JSON."""
    what = what or f"guest {tool}"
    found = json_lines(output, tool_prefix(tool), error=error, what=what)
    if not found:
        raise error(f"{what} printed no JSON line:\n{output.strip()[-2000:]}")
    if len(found) > 1:
        raise error(f"{what} printed {len(found)} JSON lines, expected one:\n{output.strip()[-2000:]}")
    return found[0]
