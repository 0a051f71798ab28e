"""The front door: the README's shape and links, and the documentation site built strictly from the code."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_starts_with_the_two_set_up_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    block = lines[lines.index("```bash") + 1:]
    assert block[0].startswith("# Install and train") and block[1].endswith(".venv/bin/artmlx run")
    assert block[2] == "# Run the tests:" and block[3].endswith(".venv/bin/python -m pytest -q")
    assert not any(marker in "\n".join(lines) for marker in ("REAL_MODEL_FIGURES", "HEADLINE_NUMBERS", "LEARN_FIGURES"))


@pytest.mark.parametrize("page", ["README.md", "CHANGELOG.md", *sorted(str(p.relative_to(ROOT))
                                                                        for p in (ROOT / "docs").rglob("*.md"))])
def test_relative_links_point_at_files_that_exist(page):
    path = ROOT / page
    missing = [target for target in LINK.findall(path.read_text())
               if "://" not in target and not target.startswith("mailto:") and not (path.parent / target).exists()
               and not target.startswith("reference/") and not target.startswith("../reference/")]
    assert not missing, f"{page} links to {missing}"


def test_the_documentation_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in ("artmlx train", "artmlx run", "artmlx model import", "artmlx serve"):
        assert command in cli
    config = (tmp_path / "site" / "reference" / "config" / "index.html").read_text()
    assert "hint_teacher" in config and "dynamic_sampling_rounds" in config
    serve = (tmp_path / "site" / "reference" / "serve" / "index.html").read_text()
    assert "top_logprobs" in serve and "best_of" in serve and "chat_template_kwargs" in serve


def test_every_field_the_server_takes_has_its_note():
    """The serve reference is generated from these tables: a field a route takes without a note would be missing."""
    from artmlx.serve import params

    assert set(params.FIELD_NOTES) == params.CHAT_FIELDS | params.COMPLETION_FIELDS
    assert set(params.BOUNDS) <= set(params.FIELD_NOTES) and not set(params.REFUSED) & set(params.FIELD_NOTES)
