"""The package's shape: imports run one way (core -> inference -> evaluation -> experiments -> cli), no
cycles, every module imports on its own in a fresh interpreter, and importing bnn_zoo changes no
global setting of Pyro or matplotlib."""

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import bnn_zoo as bz

PACKAGE = Path(bz.__file__).parent
LAYERS = [
    ("bnn_zoo.inference", "bnn_zoo.baselines"),
    ("bnn_zoo.evaluation",),
    ("bnn_zoo.experiments",),
    ("bnn_zoo.cli",),
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _import_graph() -> dict[str, set[str]]:
    """Module -> bnn_zoo modules it imports (at module level or inside functions alike)."""
    modules = _modules()

    def owner(name):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import sub` imports the submodule; `from mod import name` the module
                targets = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            else:
                continue
            for t in targets:
                resolved = owner(t) if t.startswith("bnn_zoo") else None
                if resolved and resolved != module:
                    graph[module].add(resolved)
    return graph


def _layer(module: str) -> int:
    if module == "bnn_zoo":
        return len(LAYERS) + 1  # the package's front door re-exports everything
    for rank, prefixes in enumerate(LAYERS, start=1):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return 0  # core: models, priors, likelihoods, BNN, guides, local noise, posterior, data, io, saving


def test_imports_point_down_the_layers_and_never_cycle():
    graph = _import_graph()
    upward = [(m, t) for m, targets in graph.items() for t in targets if _layer(t) > _layer(m)]
    assert not upward, f"modules importing a higher layer: {upward}"
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on any cycle
    assert set(order) == set(graph)


def test_every_module_imports_in_a_fresh_interpreter_in_dependency_order_without_side_effects():
    order = [m for m in graphlib.TopologicalSorter(_import_graph()).static_order()]
    script = (
        "import importlib, json, sys, pyro, matplotlib\n"
        "before = (dict(pyro.settings.get()), matplotlib.rcParams._get('backend'))\nimport bnn_zoo\n"
        "after_package = (dict(pyro.settings.get()), matplotlib.rcParams._get('backend'))\n"
        "for name in json.loads(sys.argv[1]):\n    importlib.import_module(name)\n"
        "after_all = (dict(pyro.settings.get()), matplotlib.rcParams._get('backend'))\n"
        "print(json.dumps([before == after_package, before == after_all, before[0]['module_local_params']]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(order)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [True, True, False]


def test_docstrings_and_comments_carry_no_dated_measurements():
    """Measurements and their dates live in benchmarks/results and the docs rendered from them; the code
    states its contract and links there."""
    import re

    package = Path(bz.__file__).parent
    dated = [
        f"{path.relative_to(package)}:{number}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"20[0-9][0-9]-[0-9][0-9]-", line)
    ]
    assert not dated, f"dated sentences in the code: {dated}"
