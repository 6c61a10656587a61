"""How long pfcxl waits, one default per kind of wait, in seconds. Every signature and option
that waits takes its default from here, so the API, the CLI and the library agree (a command run
through `Machine.run` and one through `VM.run` get the same limit). Light: the parser reads it."""

# one guest, QEMU's start to PFCXL-READY; a loaded 2-core host took 70 s for a boot that takes
# 3 s quiet, and a Debian image or a timed QEMU takes several times a busybox boot
READY_S = 300
# a command in one guest: the shipped benchmarks take a minute or two under TCG
COMMAND_S = 600
# every guest of a multihost run ready, and a command in each: N guests share the host's CPUs
FLEET_READY_S = 900
FLEET_COMMAND_S = 900
# one request to the appliance service or a kept-up machine's daemon (they answer at once)
SERVICE_S = 30
# a probe of a service that may be starting or stopping: is it up yet, will it take the request
SERVICE_PROBE_S = 5
# the appliance service from its start to its first answer (it maps the pool, binds the socket)
SERVICE_START_S = 30
# the appliance service to exit after its shutdown request (or SIGTERM) before it is killed
SERVICE_STOP_S = 15
# a timed appliance's `stats` with sync: it first models everything the hosts have traced
STATS_SYNC_S = 300
# an injected error's record to show in the guest (cxl list -L, a trace event, an AER line)
EXPECT_S = 60
# QEMU to power off after `quit` before it is killed
QUIT_S = 10
