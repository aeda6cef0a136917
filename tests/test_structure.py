"""The code's shape, read from its syntax trees: short functions, and no dispatch on an inference method's
name outside the method's own module and the registry (every other door asks for its traits:
bnn_zoo.methods)."""

import ast
from pathlib import Path

import bnn_zoo.inference  # noqa: F401  (registers the zoo's methods)
from bnn_zoo import methods

PACKAGE = Path(__file__).parent.parent / "bnn_zoo"
MAX_LINES = 80


def _trees():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE.parent), ast.parse(path.read_text())


def test_no_function_is_longer_than_80_lines():
    long = [
        f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert not long, long


def _compared_names(node: ast.Compare) -> set[str]:
    """The string constants a comparison tests against (``x == "nuts"``, ``x in ("nuts", "hmc")``)."""
    found = set()
    for side in [node.left, *node.comparators]:
        items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
        found |= {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
    return found


def test_no_door_dispatches_on_a_method_name():
    homes = {Path(m.__module__.replace(".", "/") + ".py") for m in methods.registered().values()}
    homes |= {Path("bnn_zoo/methods.py")}
    names = set(methods.registered())
    found = [
        f"{path}:{node.lineno} compares with {sorted(_compared_names(node) & names)}"
        for path, tree in _trees()
        if path not in homes
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and _compared_names(node) & names
    ]
    assert not found, found


def test_the_check_finds_a_dispatch():
    tree = ast.parse('if posterior.method in ("nuts", "hmc"):\n    pass\nif kind == "gp":\n    pass')
    compared = [_compared_names(n) for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert compared == [{"nuts", "hmc"}, {"gp"}]
