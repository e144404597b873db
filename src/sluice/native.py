"""Which compiled extensions this process runs: the one place that decides.

Sluice's C extensions are optional, each with a pure-Python reference it is tested against:

    sluice._crecords  the record codec (protocol/records.py) and, reached through it, the
                      producer's per-record path, its send futures and a SyncProducer's
                      outbox (client/)
    sluice._csyncer   the broker's native fsync and append threads (storage/syncer.py)

``SLUICE_PURE_PYTHON=1`` (any value but "" and "0") turns every one of them off, so the
references run as the product does.  An extension that is not built, or was built from
another version of its source (its ``ABI_VERSION`` is not the one the caller speaks), is
not used either.  The choice is made once, when the module that uses an extension is
imported.  Imports nothing of Sluice: any layer may use it.
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

PURE_PYTHON_ENV = "SLUICE_PURE_PYTHON"


def pure_python() -> bool:
    """Whether the environment asks for the pure-Python code everywhere."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def load(name: str, abi_version: int | None = None) -> ModuleType | None:
    """The extension ``sluice.<name>``, or None when it is not to be used: pure Python is
    asked for, it is not built, or (with ``abi_version``) it was built from another
    version of its source, which a ``RuntimeWarning`` says (reinstall to rebuild it)."""
    if pure_python():
        return None
    try:
        module = importlib.import_module(f"sluice.{name}")
    except ImportError:
        return None
    if abi_version is not None and getattr(module, "ABI_VERSION", None) != abi_version:
        warnings.warn(
            f"sluice.{name} was built from another version of its source: its pure-Python "
            "reference runs instead (reinstall sluice to rebuild it)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    return module
