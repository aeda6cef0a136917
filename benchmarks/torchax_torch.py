"""Which torch releases the XLA backend's torchax runs beside: tests/test_xla.py with
``xla.TORCHAX_TORCH`` opened to the installed torch (the backend refuses untested releases), in one
process, then the backend ``auto`` picks for the MLP and the time of one value and gradient of its log
posterior on XLA and on torch (benchmarks/backends.py's MLP case, one thread). Each run adds or replaces
the row of the installed torch and Python in benchmarks/results/torchax-torch.json; compare the lanes'
``jax_ms``.

python benchmarks/torchax_torch.py   (in an environment with the jax extra)
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import backends  # noqa: E402
import pytest  # noqa: E402
from results import RESULTS, write  # noqa: E402

from bnn_zoo.inference import xla  # noqa: E402


def main() -> None:
    import torch

    name, model, x, y = next(backends.cases())  # the MLP: 13-50-1 on 455 rows
    gradient = backends.measure(name, model, x, y)  # its "auto" as the library ships, before the range opens
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
        **{k: gradient[k] for k in ("architecture", "auto", "torch_ms", "jax_ms", "speedup")},
    }
    path = RESULTS / "torchax-torch.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    lane = lambda r: (r["torch"], r["python"].rsplit(".", 1)[0])  # noqa: E731
    rows = [r for r in rows if lane(r) != lane(row)] + [row]
    print(write("torchax-torch", sorted(rows, key=lane), command="python benchmarks/torchax_torch.py"))


if __name__ == "__main__":
    main()
