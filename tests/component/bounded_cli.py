"""Many pfcxl command lines run in one child process under an address-space limit (RLIMIT_AS), each
with a time limit (SIGALRM): a hostile input that makes pfcxl allocate or compute without bound
shows as a MemoryError or a timeout instead of swamping the machine. One child for all cases keeps
a generated set of cases cheap (the CLI's imports are paid once)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from pfcxl.device.topology.units import GiB

RUNNER = r"""
import io, json, resource, signal, sys, traceback
limit, timeout = int(sys.argv[1]), int(sys.argv[2])
cases = json.load(sys.stdin)
from pfcxl.host_tools.cli import main as cli
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

class Timeout(BaseException):
    pass

def alarm(*_):
    raise Timeout(f"still running after {timeout} s")

signal.signal(signal.SIGALRM, alarm)
real, done = sys.stdout, []
for argv in cases:
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    signal.alarm(timeout)
    try:
        rc = cli.main(argv)
    except SystemExit as exc:                 # argparse's usage errors
        rc = exc.code
    except BaseException as exc:              # what would have been a traceback, a kill or a hang
        rc = "escaped: " + "".join(traceback.format_exception_only(exc)).strip()
    finally:
        signal.alarm(0)
    done.append({"argv": argv, "rc": rc, "stdout": sys.stdout.getvalue(), "stderr": sys.stderr.getvalue()})
sys.stdout = real
json.dump(done, real)
"""


@dataclass(frozen=True)
class Outcome:
    argv: list[str]
    rc: int | str
    stdout: str
    stderr: str

    def one_line_error(self, code: int) -> str:
        """The error line, after asserting the case ended in exactly one line and exit `code`."""
        lines = self.stderr.strip().splitlines()
        assert self.rc == code and len(lines) == 1 and "Traceback" not in self.stderr, (self.argv, self.rc, self.stderr)
        assert lines[0].startswith("pfcxl: error: "), (self.argv, lines)
        return lines[0]


def run(cases: list[list[str]], *, limit: int = 2 * GiB, timeout: int = 60, cwd=None) -> list[Outcome]:
    """Each argv of `cases` through pfcxl's main() in one child under `limit` bytes of address space,
    each given `timeout` seconds."""
    done = subprocess.run([sys.executable, "-c", RUNNER, str(limit), str(timeout)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=timeout * len(cases) + 60, cwd=cwd)
    assert done.returncode == 0, done.stderr[-2000:]
    return [Outcome(**o) for o in json.loads(done.stdout)]


def run_named(cases: dict[str, list[str]], **options) -> dict[str, Outcome]:
    """run() of a dict of named argvs: name -> its outcome (a module fixture runs its cases once, each
    test reads its own)."""
    return dict(zip(cases, run(list(cases.values()), **options)))
