"""The documentation site: it builds with `mkdocs build --strict`, the API reference documents
every public name with a docstring, and the getting-started page runs as written."""

import ast
import inspect
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import docs_runner
import numpy as np
import pytest

import diffsim

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"


def test_site_builds_strictly(tmp_path):
    # ~3 s on 2 cores: mkdocstrings reads the package statically (griffe), nothing is executed.
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    command = [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "--site-dir",
        str(tmp_path / "site"),
    ]
    # NO_MKDOCS_2_WARNING silences material's banner about its successor, which is not a
    # build warning but would fill the report
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "site" / "api" / "simulate" / "index.html").is_file()


def _namespaces() -> set[str]:
    """The submodules `diffsim/__init__.py` re-exports (`from . import distributed as
    distributed`): public namespaces, documented member by member."""
    tree = ast.parse((ROOT / "diffsim" / "__init__.py").read_text(encoding="utf-8"))
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None
        for alias in node.names
    }


def _public_names() -> list[str]:
    """Dotted names (relative to `diffsim`) of everything public: the names in dir(diffsim)
    and the members of its public namespaces."""
    namespaces = _namespaces()
    names = []
    for name in sorted(n for n in dir(diffsim) if not n.startswith("_")):
        value = getattr(diffsim, name)
        if isinstance(value, types.ModuleType):
            # A submodule becomes an attribute of the package once anything imports it (the
            # command-line tests import diffsim.cli, documented on api/cli.md); only those that
            # __init__.py re-exports are namespaces of the API.
            if name in namespaces:
                names += [f"{name}.{m}" for m in sorted(dir(value)) if not m.startswith("_")]
            continue
        names.append(name)
    return names


def _documented() -> set[str]:
    pattern = re.compile(r"^:::\s+diffsim\.([\w.]+)\s*$", re.MULTILINE)
    return {m for page in API.glob("*.md") for m in pattern.findall(page.read_text("utf-8"))}


def test_namespaces_are_found():
    assert {"distributed", "plot"} <= _namespaces()
    assert "distributed.initialize" in _public_names() and "plot.save" in _public_names()


def test_every_public_name_is_in_the_api_reference():
    missing = [n for n in _public_names() if n not in _documented()]
    assert not missing, f"add `::: diffsim.<name>` to a page of docs/api/ for: {missing}"


def test_every_public_name_has_a_docstring():
    griffe = pytest.importorskip("griffe")
    # griffe reads the docstrings as the API reference renders them (an attribute's docstring is
    # the string after its assignment, e.g. ds.plot.STYLE, a Path whose inspect.getdoc is that of
    # its type)
    package = griffe.load("diffsim", search_paths=[str(ROOT)], allow_inspection=False)
    undocumented = []
    for name in _public_names():
        value = diffsim
        for part in name.split("."):
            value = getattr(value, part)
        rendered = package[name].docstring
        if not (inspect.getdoc(value) or "").strip() or rendered is None or not rendered.value:
            undocumented.append(name)
    assert not undocumented, f"public names without a docstring: {undocumented}"


# Every page with Python blocks: README.md, docs/ (and CONTRIBUTING.md where it has any).
PAGES = sorted(
    page.relative_to(ROOT).as_posix()
    for page in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")]
    if docs_runner.blocks(page.read_text(encoding="utf-8"))
)


@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs_as_written(page, tmp_path):
    """The page's blocks in order, in a fresh process (float32 unless the page enables
    float64, as for a reader), in an empty folder that sees the repository's `experiments/`
    data and `models` package: no exception or warning the page does not announce, and every
    value a comment promises (tests/docs_runner.py). 2–30 s a page on 2 cores."""
    (tmp_path / "experiments").symlink_to(ROOT / "experiments")
    path = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}
    runner = ROOT / "tests" / "docs_runner.py"
    out = subprocess.run(
        [sys.executable, str(runner), str(ROOT / page)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-6000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["run"] + len(report["fragments"]) == len(
        docs_runner.blocks((ROOT / page).read_text(encoding="utf-8"))
    )


def test_the_docs_runner_checks_what_comments_promise():
    promise = lambda comment: docs_runner.parse_promise(comment)[0]  # noqa: E731
    mismatch = docs_runner.mismatch
    assert mismatch(promise("(101, 2): one state per output time"), (101, 2)) is None
    assert "not 2" in mismatch(promise("(101, 2)"), (101, 2, 1))
    assert mismatch(promise("-138.22199772...: llh"), -138.2219977299) is None
    assert mismatch(promise("-138.22199772..."), -138.22199782) is not None  # cut, not rounded
    assert mismatch(promise("0.0625 (rounded)"), 0.06249) is None
    assert mismatch(promise("[0 0 0 0 6]: codes"), np.array([0, 0, 0, 0, 6])) is None
    assert mismatch(promise("[0 0 0 0 6]"), np.array([0, 0, 0, 6, 6])) is not None
    assert mismatch(promise("[1. 0.5625 nan ...]"), np.array([1.0, 0.5625, np.nan, 2.0])) is None
    assert mismatch(promise("{'successful': 48}; more"), {"successful": 48}) is None
    assert mismatch(promise("{'successful': 48}"), {"successful": 47}) is not None
    assert mismatch(promise("'log10-normal'"), "log10-normal") is None
    assert mismatch(promise("1.000...e4"), 10004.0) is None
    assert mismatch(promise("1.000...e4"), 10014.0) is not None
    # a comment that begins with words, or a number followed by words, describes
    for comment in ("the state at t = 10 s", "8 final angles", "≈ 100 = 10²", "~1e-4"):
        assert docs_runner.parse_promise(comment) is None, comment
    assert docs_runner.printed_value("(101, 2)\n") == (101, 2)
    assert docs_runner.printed_value("[ 0.5 -1. ]") == [0.5, -1.0]


def test_gallery_shows_every_experiment_with_its_command():
    page = (ROOT / "docs" / "gallery.md").read_text("utf-8")
    experiments = sorted(p.stem for p in (ROOT / "experiments").glob("[a-z]*.py"))
    assert experiments, "no experiments found"
    for name in experiments:
        assert f"\n## {name}\n" in page, f"docs/gallery.md has no section for {name}"
        assert f"`diffsim reproduce {name}`" in page, f"no command for {name}"
    images = re.findall(r"!\[[^\]]+\]\((gallery/[\w.]+\.png)\)", page)
    assert len(images) >= len(experiments)
    for image in images:
        assert (ROOT / "docs" / image).is_file(), image
