"""Old spellings of renamed options: still accepted for now, with a DeprecationWarning that names
the new one; giving both is an error. (`timing=` meant the fabric system in Appliance, multihost
and the appliance client; it is `fabric=` there now, and `timing` only names the plugin's mode.)"""

from __future__ import annotations

import warnings
from typing import TypeVar

from pfcxl.errors import PfcxlError

T = TypeVar("T")


def renamed(where: str, old: str, old_value: T | None, new: str, new_value: T | None, stacklevel: int = 3) -> T | None:
    """The value given under the new name or, with a DeprecationWarning, under the old one."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise PfcxlError(f"{where}: give {new}= alone ({old}= is its old spelling)")
    warnings.warn(f"{where}({old}=...) is now {new}=...; the old spelling will go", DeprecationWarning,
                  stacklevel=stacklevel)
    return old_value
