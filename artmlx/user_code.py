"""The user's code named on the command line or in a config: `module:name` or `path/to/file.py:name`.

One loader for everything a user names this way (environments, `--rollout` agents, scenarios). The
working directory is importable; every failure raises `error` (a `ValueError` subclass) with a message
that names the spec and the cause, where the user's module failed included, never our traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path


def load_object(spec: str, what: str, error: type[ValueError] = ValueError):
    """The object `name` of `module:name` or `path/to/file.py:name`; `what` starts every message ("env")."""
    module_name, _, name = spec.rpartition(":")
    if not module_name or not name:
        raise error(f"{what} {spec!r} must be module:name or path/to/file.py:name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            if loaded is None or not path.exists():
                raise error(f"{what} {spec!r}: there is no file {path}")
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except error:
        raise
    except Exception as failure:  # the user's module failed while importing: say where, not a traceback of ours
        if isinstance(failure, ModuleNotFoundError) and failure.name in (module_name, module_name.split(".")[0]):
            raise error(f"{what} {spec!r}: cannot import module {module_name!r} ({failure}); is it installed, "
                        f"or in the working directory?") from failure
        frame = traceback.extract_tb(failure.__traceback__)[-1] if failure.__traceback__ else None
        where = f" at {frame.filename}:{frame.lineno}" if frame else ""
        raise error(f"{what} {spec!r}: importing {module_name!r} failed{where}: "
                    f"{type(failure).__name__}: {failure}") from failure
    if not hasattr(module, name):
        raise error(f"{what} {spec!r}: {module_name!r} has no {name!r}")
    return getattr(module, name)
