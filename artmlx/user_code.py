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
from types import ModuleType


def load_object(spec: str, what: str, error: type[ValueError] = ValueError):
    """The object `name` of `module:name` or `path/to/file.py:name`; `what` starts every message ("env")."""
    module_name, _, name = spec.rpartition(":")
    if not module_name or not name:
        raise error(f"{what} {spec!r} must be module:name or path/to/file.py:name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = _from_file(module_name, what, spec, error) if module_name.endswith(".py") else \
            importlib.import_module(module_name)
    except error:
        raise
    except Exception as failure:  # the user's module failed while importing: say where, not a traceback of ours
        if isinstance(failure, ModuleNotFoundError) and failure.name in (module_name, module_name.split(".")[0]):
            raise error(f"{what} {spec!r}: cannot import module {module_name!r} ({failure}); is it installed, "
                        f"or in the working directory?") from failure
        frame = _where(failure, module_name)
        where = f" at {frame.filename}:{frame.lineno}" if frame else ""
        raise error(f"{what} {spec!r}: importing {module_name!r} failed{where}: "
                    f"{type(failure).__name__}: {failure}") from failure
    if not hasattr(module, name):
        raise error(f"{what} {spec!r}: {module_name!r} has no {name!r}")
    return getattr(module, name)


_FILE_MODULES: dict[Path, ModuleType] = {}


def _from_file(module_name: str, what: str, spec: str, error: type[ValueError]) -> ModuleType:
    """A user's file, executed once per process (environments are made once per episode) and registered in
    `sys.modules` under a name of its own, as an imported module is (dataclasses and pickling look there)."""
    path = Path(module_name)
    resolved = path.resolve()
    if resolved in _FILE_MODULES:
        return _FILE_MODULES[resolved]
    if not path.is_file():
        raise error(f"{what} {spec!r}: there is no file {path}")
    unique = f"artmlx_user_code_{len(_FILE_MODULES)}_{path.stem}"
    loaded = importlib.util.spec_from_file_location(unique, resolved)
    module = importlib.util.module_from_spec(loaded)
    sys.modules[unique] = module
    try:
        loaded.loader.exec_module(module)
    except BaseException:
        del sys.modules[unique]
        raise
    _FILE_MODULES[resolved] = module
    return module


def _where(failure: BaseException, module_name: str):
    """The frame to show for a failed import: the last one in the user's file, else the last one outside
    Python's import machinery."""
    frames = traceback.extract_tb(failure.__traceback__) if failure.__traceback__ else []
    if module_name.endswith(".py"):
        mine = [f for f in frames if Path(f.filename).resolve() == Path(module_name).resolve()]
        if mine:
            return mine[-1]
    outside = [f for f in frames if not f.filename.startswith("<frozen")]
    return (outside or frames or [None])[-1]
