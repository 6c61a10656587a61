"""The one error hierarchy of pfcxl.

Everything below the CLI raises these; only the CLI turns them into one clean line and an
exit code. Each message names the bad value and the rule it broke.
"""


class PfcxlError(Exception):
    """Any other expected failure (the base of them all; no traceback unless --debug)."""

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


class LaunchError(VMError):
    """A guest that did not boot: QEMU did not start, exited, panicked the kernel or never became
    ready. Besides the message it carries what a caller needs to tell why: `argv` (what was
    exec'd), `returncode` (QEMU's exit status, negative for a signal; None while QEMU still ran),
    `log_tail` (QEMU's last lines) and `console_tail` (the guest console's last lines)."""

    def __init__(self, message: str, *, argv: list[str] | None = None, returncode: int | None = None,
                 log_tail: str = "", console_tail: str = "") -> None:
        super().__init__(message)
        self.argv, self.returncode = list(argv or []), returncode
        self.log_tail, self.console_tail = log_tail, console_tail


class TableError(PfcxlError):
    """A firmware table cannot be built from the request, or bytes cannot be read as one."""

    exit_code = 6


class ApplianceError(PfcxlError):
    """The appliance service cannot start, is not running, or refused a request."""

    exit_code = 7


class CommandError(PfcxlError):
    """A guest command cannot run as given (not valid shell). 2, as sh exits on a syntax error."""

    exit_code = 2


class ServingError(PfcxlError):
    """A serving-model input (model, GPU, tier or workload file, or a CLI value) is invalid."""

    exit_code = 2


class BuildError(PfcxlError):
    """gcc could not compile a guest tool or the TCG plugin (the message has its errors)."""

    exit_code = 8


class KVStoreError(PfcxlError):
    """The KV store refused an operation: the guest binding's KVError (it cannot import pfcxl),
    translated where the host calls it. Exit code 1, as before it had a class of its own."""


class TimingError(PfcxlError):
    """The timing plugin cannot be loaded or run, or a trace ring is not what it should be."""

    exit_code = 9


def shown(value: object) -> str:
    """A value (a path, a name) as a message names it: as is, or as Python writes the string
    ('a\\nb') when it holds a newline or another character that is not printable, so a one-line
    message stays one line."""
    text = str(value)
    return text if text.isprintable() else repr(text)


def exit_codes() -> list[tuple[int, str, str]]:
    """(exit code, class name, what it means) for every error class: `pfcxl --help` lists them."""
    found, todo = [], [PfcxlError]
    while todo:
        cls = todo.pop(0)
        found.append((cls.exit_code, cls.__name__, (cls.__doc__ or "").strip().splitlines()[0]))
        todo += cls.__subclasses__()
    return sorted(found)
