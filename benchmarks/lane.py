"""Records a test lane's run (.ci/py312) as data: benchmarks/results/<venv's python>-lane.json with the
install and test times, pytest's summary line, the exit status and the versions that decide the lane
(Python, torch, ArviZ, NumPy, pandas, xarray).

python benchmarks/lane.py PYTEST_LOG INSTALL_S TEST_S STATUS [PYTEST_OPTIONS]
"""

from __future__ import annotations

import platform
import re
import sys
from importlib.metadata import version
from pathlib import Path

from results import write


def main(log: str, install_s: str, test_s: str, status: str, options: str = "") -> None:
    lines = Path(log).read_text().splitlines()
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)), "no summary")
    python = platform.python_version()
    row = {
        "install_s": int(install_s),
        "tests_s": int(test_s),
        "pytest": summary.strip("= "),
        "exit_status": int(status),
        **{name: version(name) for name in ("torch", "arviz", "numpy", "pandas", "xarray", "pyro-ppl", "gpytorch")},
    }
    minor = "".join(python.split(".")[:2])
    command = f".ci/py312 python{python.rsplit('.', 1)[0]} {options}".strip()
    write(f"py{minor}-lane", [row], command=command, python=python)


if __name__ == "__main__":
    main(*sys.argv[1:])
