"""Which torch releases the XLA backend's torchax runs beside: tests/test_xla.py with
``xla.TORCHAX_TORCH`` opened to the installed torch (the backend refuses untested releases), in one
process. Each run adds or replaces the installed torch's row of benchmarks/results/torchax-torch.json.

python benchmarks/torchax_torch.py   (in an environment with the jax extra)
"""

from __future__ import annotations

import contextlib
import io
import json
import platform
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from results import RESULTS, write

from bnn_zoo.inference import xla


def main() -> None:
    import torch

    xla.TORCHAX_TORCH = ((0, 0), (99, 0))  # the test module imports this same module object
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = pytest.main(
            ["-q", "-p", "no:xdist", "-p", "no:cacheprovider", str(Path(__file__).parent.parent / "tests/test_xla.py")]
        )
    summary = next(line for line in reversed(out.getvalue().splitlines()) if re.search(r"\d+ (passed|failed)", line))
    row = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torchax": version("torchax"),
        "jax": version("jax"),
        "pytest": summary.strip("= "),
        "exit_status": int(status),
    }
    path = RESULTS / "torchax-torch.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    rows = [r for r in rows if r["torch"] != row["torch"]] + [row]
    print(write("torchax-torch", sorted(rows, key=lambda r: r["torch"]), command="python benchmarks/torchax_torch.py"))


if __name__ == "__main__":
    main()
