"""How many library files name each inference method in their code (not in docstrings or comments): its
class or its registered name as an identifier, an attribute, an import or a string. Measured at two
commits, so a change that moves knowledge of the methods behind their contract shows as fewer homes.
Writes benchmarks/results/method-homes.json.

python benchmarks/method_homes.py [BEFORE_COMMIT [AFTER_COMMIT]]
"""

from __future__ import annotations

import ast
import subprocess
import sys

from results import write

METHODS = {  # registered name -> class name, as of the commits measured
    "svi": "SVI",
    "nuts": "NUTS",
    "hmc": "HMC",
    "chees": "ChEES",
    "laplace": "Laplace",
    "sgmcmc": "SGMCMC",
    "ensemble": "Ensemble",
    "swag": "SWAG",
    "gp": "TypeII",
}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def _names(source: str) -> set[str]:
    """Identifiers, attributes, imported names and non-docstring strings of a module."""
    tree = ast.parse(source)
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, documented) and node.body and isinstance(node.body[0], ast.Expr)
    }
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.rpartition(".")[2])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names.add(node.value)
    return names


def homes(commit: str) -> dict[str, list[str]]:
    """Each method's library files at ``commit``."""
    found: dict[str, list[str]] = {name: [] for name in METHODS}
    for path in _git("ls-tree", "-r", "--name-only", commit, "bnn_zoo").split():
        if path.endswith(".py"):
            names = _names(_git("show", f"{commit}:{path}"))
            for name, cls in METHODS.items():
                if {name, cls} & names:
                    found[name].append(path)
    return found


def main(before: str = "421a41f", after: str = "HEAD") -> None:
    at = {which: homes(commit) for which, commit in (("before", before), ("after", after))}
    rows = [
        {"method": name, "files_before": len(at["before"][name]), "files_after": len(at["after"][name]), "files": files}
        for name, files in at["after"].items()
    ]
    for row in rows:
        print(f"{row['method']:9} {row['files_before']:3} -> {row['files_after']}")
    write("method-homes", rows, before=before, after=_git("rev-parse", "--short", after).strip())


if __name__ == "__main__":
    main(*sys.argv[1:])
