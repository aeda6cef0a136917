"""Ctrl-C on a run whose chains are on two CPU devices, repeated: how often the process exits cleanly.

The scenario is the test's (tests/test_xla.py, STOPPED_ON_TWO_DEVICES: two NUTS chains, one per device,
Ctrl-C'd after 100 iterations): clean means exit 0, "stopped" printed, nothing on stderr. A failure is
rare (a race between the devices' callbacks and Python's exit), so the test alone cannot show it gone;
this runs the scenario many times on each checkout given, e.g. one before a fix and one after.

    python benchmarks/stop_repeats.py --runs 40 --sources /tmp/before .

Writes benchmarks/results/stop-on-two-devices.json (date, machine, commit), a row per source.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
from pathlib import Path

import results

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from test_xla import STOPPED_ON_TWO_DEVICES  # noqa: E402


def outcome(done: subprocess.CompletedProcess) -> str:
    if done.returncode == 0 and done.stdout.strip() == "stopped" and not done.stderr.strip():
        return "clean"
    if done.returncode < 0 or done.returncode == 134:
        return "aborted"
    return "stderr" if done.returncode == 0 else f"exit {done.returncode}"


def repeat(source: Path, runs: int) -> dict:
    # run in the checkout: `python -c` puts the working folder first on sys.path, so its bnn_zoo is imported
    command = [sys.executable, "-c", STOPPED_ON_TWO_DEVICES]
    counts = collections.Counter(
        outcome(subprocess.run(command, capture_output=True, text=True, cwd=source)) for _ in range(runs)
    )
    code = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(source, dict(counts), flush=True)
    return {"source_commit": code.stdout.strip(), "runs": runs} | dict(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--sources", nargs="+", type=Path, default=[Path(".")], help="checkouts to run")
    args = parser.parse_args()
    rows = [repeat(source, args.runs) for source in args.sources]
    results.write("stop-on-two-devices", rows, runs=args.runs, scenario="tests/test_xla.py STOPPED_ON_TWO_DEVICES")


if __name__ == "__main__":
    main()
