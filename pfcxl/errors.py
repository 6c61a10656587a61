"""The one error hierarchy of pfcxl.

Everything below the CLI raises these; only the CLI turns them into one clean line and an
exit code. Each message names the bad value and the rule it broke.
"""


class PfcxlError(Exception):
    """Base of every expected failure (shown without a traceback unless --debug)."""

    exit_code = 1


class TopologyError(PfcxlError):
    """A topology file is malformed or describes something that cannot be built."""

    exit_code = 2


class SetupError(PfcxlError):
    """A setup step (apt, downloads, unpacking, pip) failed; the message names the step."""

    exit_code = 3


class ImageError(PfcxlError):
    """The guest image could not be built (missing module, library or tool)."""

    exit_code = 4


class VMError(PfcxlError):
    """QEMU failed to start, the guest never became ready, or a console command failed."""

    exit_code = 5


class TableError(PfcxlError):
    """A firmware table cannot be built from the request, or bytes cannot be read as one."""

    exit_code = 6


class ApplianceError(PfcxlError):
    """The appliance service cannot start, is not running, or refused a request."""

    exit_code = 7


class CommandError(PfcxlError):
    """A guest command cannot run as given (not valid shell). 2, as sh exits on a syntax error."""

    exit_code = 2
