"""The documentation site: it builds with `mkdocs build --strict`, the API reference documents
every public name with a docstring, and the getting-started page runs as written."""

import ast
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

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


# ~13 s on 2 cores (compilation of five solves and a fit), so one of the slow extras.
@pytest.mark.slow
def test_getting_started_runs(capsys):
    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    assert len(blocks) == 5
    namespace = {}
    exec(compile("".join(blocks), "docs/getting-started.md", "exec"), namespace)  # noqa: S102
    assert namespace["sol"].ys.shape == (101, 2)
    assert namespace["result"]["final_state"].dims == ("length", "damping", "state")
    fit = namespace["fit"]
    assert fit.converged
    assert abs(fit.params["length"] - 1.3) < 3 * fit.stderr["length"]


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
