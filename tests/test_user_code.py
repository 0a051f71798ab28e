"""One loader for the user's `module:name` / `file.py:name` code: environments and agents alike."""

import pytest

from artmlx.envs.base import make_env
from artmlx.user_code import load_object


def test_an_environment_loads_from_a_file_as_an_agent_does(tmp_path):
    source = tmp_path / "my_env.py"
    source.write_text("from artmlx.envs.arithmetic import Arithmetic\nclass MyEnv(Arithmetic):\n    pass\n")
    env = make_env(f"{source}:MyEnv")
    assert type(env).__name__ == "MyEnv" and callable(env.reset)
    with pytest.raises(ValueError, match="has no 'Other'"):
        make_env(f"{source}:Other")


def test_every_failure_names_the_spec_and_the_cause(tmp_path):
    class Custom(ValueError):
        pass

    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\nraise KeyError('at import')\n")
    with pytest.raises(Custom, match=r"thing '.*broken.py:x': importing .* failed at .*broken.py:2: KeyError"):
        load_object(f"{broken}:x", "thing", Custom)
    with pytest.raises(Custom, match="cannot import module 'no_such_pkg_q'"):
        load_object("no_such_pkg_q:x", "thing", Custom)
    with pytest.raises(Custom, match="must be module:name"):
        load_object("nothing", "thing", Custom)


def test_a_file_runs_once_and_is_a_module_as_imported_ones_are(tmp_path):
    """Environments are made once per episode: the file's module-level code must run once, and it must be
    in `sys.modules` (a dataclass with postponed annotations looks its module up there)."""
    source = tmp_path / "counted_env.py"
    source.write_text("from __future__ import annotations\nfrom dataclasses import dataclass\n"
                      "from artmlx.envs.arithmetic import Arithmetic\nLOADS = []\nLOADS.append(1)\n\n"
                      "@dataclass\nclass Settings:\n    level: int = 1\n\n"
                      "class CountedEnv(Arithmetic):\n    settings = Settings()\n")
    first, second = make_env(f"{source}:CountedEnv"), make_env(f"{source}:CountedEnv")
    assert type(first) is type(second) and len(load_object(f"{source}:LOADS", "thing")) == 1
