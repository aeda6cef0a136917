"""Benchmark results as data (``benchmarks/results/NAME.json`` with the date, the machine and the
commit), and the timing every script shares."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def best_ms(fn, calls: int, repeats: int = 5) -> float:
    """Milliseconds per call of ``fn``: the best of ``repeats`` runs of ``calls`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return 1e3 * min(times)


def machine() -> dict:
    """What the numbers depend on: CPU model, cores usable, threads, library versions."""
    import torch

    cpu = next(
        (line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def commit() -> str:
    """The checked-out commit, with ``+dirty`` when the tree has uncommitted changes."""

    def run(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=RESULTS.parent).stdout.strip()

    head = run("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if run("status", "--porcelain", "--untracked-files=no") else "")


def write(name: str, rows: list[dict], **settings) -> Path:
    """Write ``rows`` (one dict per measured configuration) under ``RESULTS/name.json``, atomically."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    record = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "commit": commit(),
        "settings": settings,
        "rows": rows,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=float) + "\n")
    tmp.replace(path)
    return path


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []
