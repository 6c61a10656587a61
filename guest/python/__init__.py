"""The guest's Python modules (the KV binding pfcxl_kvstore with its layout and arena, the probes
pfcxl_guest, the poison list pfcxl_poison): standard library only, so the same files run on both
sides. On the host they are this package, pfcxl.guest.python (`from pfcxl.guest.python import
pfcxl_kvstore`); the guest image copies them, without this file, to a folder on the guest's
PYTHONPATH, where they are top-level modules (`import pfcxl_kvstore`). A module that imports a
sibling does so relatively inside this package and by its top-level name otherwise (`if
TYPE_CHECKING or __package__:`), so the type checker reads the package's imports only."""

if __name__ != "pfcxl.guest.python":
    raise ImportError(f"import this folder as pfcxl.guest.python, not {__name__}")
