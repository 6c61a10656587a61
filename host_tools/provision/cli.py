"""`python3 -m pfcxl.host_tools.provision [--check] [--skip-python] [--timed-qemu] [--engines]`: run (or only check) the steps in
order, one progress line each, then a table of per-step timings. Exit 0 when everything is there
(or was done), 1 when a step failed or, with --check, when any step is missing."""

from __future__ import annotations

import argparse
import sys
import time

from pfcxl.host_tools.provision.runner import Setup, StepError
from pfcxl.host_tools.provision.steps import ENGINES_STEP, STEP_TABLE, STEPS, TIMED_QEMU

EPILOG = STEP_TABLE + """
Each step is skipped when its result is already there (dpkg versions, files, stamp files);
.deb files already downloaded are reused.

Environment:
  PFCXL_CACHE  where downloads and unpacked trees go (default ~/.cache/pfcxl); a log of every
               command run is kept in $PFCXL_CACHE/setup.log
  PFCXL_VENV   the Python virtual environment to create (default <repo>/.venv)
  PFCXL_TORCH_INDEX  with --engines: the index torch comes from (PyTorch's CPU wheel index,
               where the default index has only the CUDA build)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m pfcxl.host_tools.provision",
        description="Install and download everything pfcxl needs on this Debian 12 host. "
                    "Idempotent: steps whose result is present are skipped.",
        epilog="Steps:\n" + EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-python", action="store_true",
                        help="every step but the last (no venv / pip install)")
    parser.add_argument("--timed-qemu", action="store_true",
                        help="also build the timed QEMU that --clock virtual boots (step 9; make setup-timed)")
    parser.add_argument("--engines", action="store_true",
                        help="only the engines environment (<repo>/.venv-engines: torch, LMCache, SGLang, vLLM "
                             "on CPU; make engines)")
    parser.add_argument("--check", action="store_true",
                        help="report what is missing without changing anything; exit 1 if any")
    args = parser.parse_args(argv)

    steps = [ENGINES_STEP] if args.engines else STEPS[:-1] if args.skip_python else STEPS
    if args.timed_qemu and not args.engines:
        steps = [*steps, TIMED_QEMU]
    s = Setup(check_only=args.check)
    total = len(steps)
    timings: list[tuple[str, str, float]] = []
    started_all = time.monotonic()
    missing = 0
    for index, step in enumerate(steps, 1):
        s.prefix = f"{index}/{total} {step.name}"
        started = time.monotonic()
        try:
            done, detail = step.check(s)
            if args.check:
                s.say(f"ok ({detail})" if done else f"MISSING: {detail}")
                missing += not done
                continue
            if done:
                s.say(f"already present ({detail})")
                outcome = "present"
            else:
                s.say(f"to do: {detail}")
                detail = step.run(s)
                s.say(f"done in {time.monotonic() - started:.1f} s ({detail})")
                outcome = "done"
        except (StepError, OSError) as e:
            message = str(e).replace("\n", " ")
            timings.append((step.name, "FAILED", time.monotonic() - started))
            if not args.check:
                print_timings(timings, started_all)
            print(f"[setup] FAILED {s.prefix}: {message} (log: {s.log_path})",
                  file=sys.stderr, flush=True)
            return 1
        timings.append((step.name, outcome, time.monotonic() - started))

    if args.check:
        print(f"[setup] check: {missing} of {total} steps missing" if missing
              else f"[setup] check: all {total} steps present", flush=True)
        return 1 if missing else 0
    print_timings(timings, started_all)
    return 0


def print_timings(timings: list[tuple[str, str, float]], started_all: float) -> None:
    print("[setup] timings:")
    for name, outcome, seconds in timings:
        print(f"[setup]   {name:<20} {outcome:<8} {seconds:7.1f} s")
    print(f"[setup]   {'total':<20} {'':<8} {time.monotonic() - started_all:7.1f} s", flush=True)
