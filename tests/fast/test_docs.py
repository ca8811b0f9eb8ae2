"""The front door and the docs pages: every page is found from the README, every measured number
names a file under docs/bench/ that exists, and no page names a machine path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.tiny_runs import SCRIPT

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
# a reference to a benchmark output: `docs/bench/...` (globs allowed, e.g. first_*.json)
BENCH_REF = re.compile(r"docs/bench/[\w./*-]+")


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


def test_readme_is_a_front_door_that_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 260, "the README is the front door; details belong in docs/"
    for page in (REPO / "docs").glob("*.md"):
        assert f"docs/{page.name}" in readme, f"docs/{page.name} is not reachable from the README"
    for marker in ("demo", "tests", "tiny", "docker"):
        assert f"<!-- front-door:{marker} -->" in readme


def test_readme_tiny_command_is_this_script():
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- front-door:tiny -->", 1)[1].split("```", 2)[1]
    command = block.splitlines()[1]
    assert command.startswith(f"bash {SCRIPT.relative_to(REPO)} "), command


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_bench_file_a_page_names_exists(page):
    missing = []
    for ref in BENCH_REF.findall(page.read_text()):
        ref = ref.rstrip(".")
        if not list(REPO.glob(ref)):
            missing.append(ref)
    assert not missing, f"{_name(page)} names benchmark outputs that are not in the repository: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_docs_name_no_machine_paths(page):
    text = page.read_text()
    assert "/work/" not in text and "/opt/wheels" not in text and "/opt/pypi" not in text


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page):
    broken = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" in target:
            continue
        if not (page.parent / target).exists():
            broken.append(target)
    assert not broken, f"{_name(page)} links to missing files: {broken}"
