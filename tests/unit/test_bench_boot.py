"""The boot benchmark's reading of dmesg: the kernel's time at /init and its longest silences."""

import pytest
from pfcxl import process
from pfcxl.host_tools.experiments import boot as bench_boot

DMESG = """\
[    0.000000] Linux version 6.12
[    0.114921] x86/fpu: Enabled xstate features
[    1.097719] Freeing SMP alternatives memory: 40K
[    1.200000] something quick
[    3.000000] tsc: Refined TSC clocksource calibration
[    3.500000] Run /init as init process
[    9.000000] after init: not counted
"""

pytestmark = pytest.mark.unit


def test_kernel_time_at_init_and_its_longest_gaps():
    at_init, gaps = bench_boot.kernel_gaps(DMESG, top=2)
    assert at_init == 3.5
    assert gaps == [(1.8, "tsc: Refined TSC clocksource calibration"), (0.983, "Freeing SMP alternatives memory: 40K")]


def test_no_init_line_means_no_kernel_time():
    assert bench_boot.kernel_gaps("[    0.1] x\n")[0] is None


def test_summary_ratios_are_lean_over_classic():
    boots = [{"lean": lean, **{p: (1.0 if lean else 2.0) for p in bench_boot.PHASES}} for lean in (False, True)]
    assert bench_boot.summary(boots)["ratio_lean_over_classic"] == {p: 0.5 for p in bench_boot.PHASES}


def test_cpu_seconds_agree_with_the_kernels_other_account_of_this_process():
    # a fixed amount of work (no loop waiting on the value under test, so nothing to hang on),
    # then /proc/PID/stat as cpu_seconds reads it, bracketed by times(2) (os.times) before and after
    import os
    tick = 1 / os.sysconf("SC_CLK_TCK")
    sum(range(3_000_000))
    before = os.times()
    measured = process.cpu_seconds(os.getpid())
    after = os.times()
    assert measured > 0
    assert before.user + before.system - tick <= measured <= after.user + after.system + tick
