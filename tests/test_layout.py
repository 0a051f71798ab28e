"""The package's layering, checked on the source: libraries below, processes (`apps/`) on top."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "artmlx"

# library -> packages it never imports (lazily, inside a function, included)
FORBIDDEN = {
    "engine": {"rollout", "serve", "protocol", "learner", "art", "apps"},
    "protocol": {"engine", "model", "learner", "rollout", "serve", "art", "apps"},
    "learner": {"rollout", "protocol", "serve", "art", "apps"},
    "rollout": {"art", "protocol", "learner", "apps"},
    "model": {"engine", "rollout", "serve", "protocol", "learner", "art", "apps"},
}
APPS_IMPORTERS = {"cli.py", "bench"}  # the command line: nothing else imports the processes
MAX_LINES = 400


def imported_packages(path: Path, source: str | None = None) -> set[str]:
    """The artmlx subpackages or top-level modules the module at `path` imports, relative imports resolved."""
    module = path.relative_to(PACKAGE.parent).with_suffix("").parts  # ("artmlx", "engine", "cache")
    found = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module[: len(module) - node.level]
                target = base + tuple((node.module or "").split(".")) if node.module else base
                names = [target + (alias.name,) for alias in node.names] if not node.module else [target]
            else:
                names = [tuple(node.module.split("."))] if node.module else []
        elif isinstance(node, ast.Import):
            names = [tuple(alias.name.split(".")) for alias in node.names]
        else:
            continue
        found.update(name[1] for name in names if name[0] == "artmlx" and len(name) > 1)
    return found


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_libraries_never_import_the_layers_above_them():
    broken = []
    for path in modules():
        inside = path.relative_to(PACKAGE).parts
        rules = FORBIDDEN.get(inside[0], set()) if len(inside) > 1 else set()
        for package in imported_packages(path) & rules:
            broken.append(f"{path.relative_to(PACKAGE)} imports artmlx.{package}")
    assert not broken, "\n".join(broken)


def test_only_the_command_line_imports_the_processes():
    broken = [str(path.relative_to(PACKAGE)) for path in modules()
              if path.relative_to(PACKAGE).parts[0] not in APPS_IMPORTERS | {"apps"}
              and "apps" in imported_packages(path)]
    assert not broken, f"these import artmlx.apps: {broken}"


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_the_rules_see_relative_and_lazy_imports():
    """The checker itself: lazy relative imports inside a function are found and resolved."""
    assert "model" in imported_packages(PACKAGE / "engine" / "generate.py")
    source = "def f():\n    from ..rollout import episodes\n    from .. import serve\n    import artmlx.art.backend\n"
    assert imported_packages(PACKAGE / "engine" / "probe.py", source) == {"rollout", "serve", "art"}
    assert imported_packages(PACKAGE / "engine" / "probe.py", "from .cache import LayerKV\n") == {"engine"}
