"""The library's layers, read from its source with `ast` (no import runs): every module imports
only from its own layer or below, nothing but the `diffsim.cli` entry (and the facade's
re-exports of two public application functions) reaches the application layer, nothing imports
the `models` package, and no two modules import each other, even through imports inside
functions."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "diffsim"

# Lowest first; a module may import from its own layer or any below it. The capability layer's
# packages (fit, sweep, analysis) build on the integrators, never on each other.
LAYERS = {
    "core": 0,
    "_solver": 1,
    "_integrate": 2,
    "_fit": 3,
    "_sweep": 3,
    "_analysis": 3,
    "_plot": 4,  # figures of solutions, sweeps and fits
    "_import": 4,  # readers of model and problem files (SBML, PEtab): models and ds.Problems
    "facade": 5,  # diffsim/__init__.py, plot.py, distributed.py: the public names
    "_apps": 6,  # command line, TOML configs, bench, reproduce, demo, experiment runner
    "entry": 7,  # diffsim/cli.py and __main__.py: the one way into _apps
}
FACADES = {"diffsim", "diffsim.plot", "diffsim.distributed", "diffsim.sbml", "diffsim.petab"}
ENTRIES = {"diffsim.cli", "diffsim.__main__"}
# application functions that are public names too (`ds.run_experiment`, `ds.reproduce`): the
# facade re-exports them, and the cycle test keeps them from importing the facade back
REEXPORTED = {"diffsim._apps.experiment", "diffsim._apps.reproduce"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    if module in FACADES:
        return "facade"
    if module in ENTRIES:
        return "entry"
    top = module.split(".")[1] if "." in module else ""
    return top if top in LAYERS and top not in ("core", "facade", "entry") else "core"


def _imports(path: Path) -> set[str]:
    """The diffsim modules (and `models`) that `path` imports anywhere in its body."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import x` names a submodule (its package runs first, as for any import
            # of a submodule, which is no dependency on the package's own code); `from m
            # import name` depends on m
            names = [
                f"{target}.{alias.name}" if _is_module(f"{target}.{alias.name}") else target
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name == "models" or name.startswith("models."):
                found.add("models")
            elif name.startswith("diffsim"):
                found.add(_existing(name))
    found.discard(module)
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _existing(name: str) -> str:
    """The longest prefix of `name` that is a module or package of diffsim."""
    parts = name.split(".")
    while parts:
        if _is_module(".".join(parts)):
            return ".".join(parts)
        parts = parts[:-1]
    return name


GRAPH = {
    _module_name(path): _imports(path)
    for path in sorted(PACKAGE.rglob("*.py"))
    if "__pycache__" not in path.parts
}


def test_the_graph_was_read():
    # the test sees the tree it guards: the subpackages and their imports
    assert {"diffsim._integrate.simulate", "diffsim._fit.fit", "diffsim._apps.cli"} <= set(GRAPH)
    assert "diffsim._integrate.simulate" in GRAPH["diffsim"]
    assert "diffsim._apps.cli" in GRAPH["diffsim.cli"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down_the_layers(module):
    layer = _layer(module)
    for target in sorted(GRAPH[module]):
        assert target != "models", f"{module} imports the models package"
        if target == "diffsim" and layer in ("_apps", "entry"):
            continue  # the application layer uses the public API like any user
        other = _layer(target)
        if layer == "facade" and target in REEXPORTED:
            continue
        assert LAYERS[other] <= LAYERS[layer], f"{module} ({layer}) imports {target} ({other})"
        if LAYERS[other] == LAYERS[layer] == 3:
            assert other == layer, f"{module} imports {target}: fit, sweep and analysis are peers"
        if other == "_apps":
            assert layer in ("_apps", "entry"), f"{module} imports the application layer"


def test_no_import_cycles():
    # a module that imports a package imports its __init__, which is part of the graph too
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module):
        state[module] = 1
        path.append(module)
        for target in GRAPH.get(module, ()):
            if target not in GRAPH:
                continue
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if state.get(target) is None:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if state.get(module) is None:
            visit(module)


def _solver_classes() -> set[str]:
    """Names of the solver classes `diffsim._solver` defines."""
    names = set()
    for path in (PACKAGE / "_solver").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                names.add(node.name)
    return names


def test_loops_ask_solvers_for_capabilities_instead_of_testing_classes():
    """Outside `_solver/`, no `isinstance(x, <a diffsim solver class>)`: the loops read
    capabilities (`adaptive`, `stochastic`, `reversible`, `delay_stepping`, ...), so a new
    family touches `_solver/` and its own loop only. The family registry
    (`_integrate/families.py`) maps base classes to loops by design, with `issubclass`."""
    classes = _solver_classes() - {"Banded", "RosenbrockTableau", "Linearised"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_solver" in path.parts or "__pycache__" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance"):
                continue
            if len(node.args) != 2:
                continue
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
            if named & classes:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {sorted(named & classes)}")
    assert not found, found
