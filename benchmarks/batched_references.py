"""Reference posteriors for UCI splits as one XLA program against one program per split, same settings:
`bnn-zoo reference` (the sweep's lockstep: every split's chains in lockstep, padded and masked) and the
same sweep with --no-lockstep (each split on its own, its chains one after another), one after the
other in this process. Records each mode's wall time (sampling and scoring), its sampling time (the
sum of the cells' runtime_s) and every split's convergence verdict.

python benchmarks/batched_references.py --data ../shared/data/uci/bostonHousing --splits 0-3 \
    --sampler nuts --chains 16 --warmup 200 --samples 200 [--device cuda] [--name NAME]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from results import write

from bnn_zoo.experiments import protocols
from bnn_zoo.experiments.sweep import run_sweep


def run(sweep, lockstep: bool) -> dict:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        summary = run_sweep(sweep, Path(out), show_progress=False, lockstep=lockstep)
        wall = time.perf_counter() - start
        cells = [
            json.loads((p / "metrics.json").read_text())
            | {"split": json.loads((p / "cell.json").read_text())["labels"]["data.split"]}
            for p in Path(out).glob("cells/*")
        ]
    cells.sort(key=lambda m: m["split"])
    return {
        "program": "one for all splits" if lockstep else "one per split",
        "wall_s": round(wall, 1),
        "sampling_s": round(sum(m["runtime_s"] for m in cells), 1),
        "failed": len(summary["failed"]),
        "splits": " ".join(str(m["split"]) for m in cells),
        "converged": " ".join("yes" if m.get("reference_converged") else "no" for m in cells),
        "max R-hat of f": " ".join(f"{m['max_rhat_test_f']:.3f}" for m in cells),
        "min ESS of f": " ".join(f"{m['min_ess_bulk_test_f']:.0f}" for m in cells),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--splits", default="0-3")
    parser.add_argument("--sampler", default="nuts", choices=["nuts", "chees"])
    parser.add_argument("--chains", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--device")
    parser.add_argument("--name", default="batched-references")
    args = parser.parse_args()
    splits = protocols.parse_splits(args.splits)
    sweep = protocols.reference(args.data, splits, args.sampler, args.chains, args.warmup, args.samples, args.device)
    rows = [run(sweep, lockstep=True), run(sweep, lockstep=False)]
    same = rows[0]["converged"] == rows[1]["converged"]
    summary = {
        "sampling_speedup": round(rows[1]["sampling_s"] / rows[0]["sampling_s"], 2),
        "wall_speedup": round(rows[1]["wall_s"] / rows[0]["wall_s"], 2),
        "same_verdicts": same,
    }
    print(json.dumps(summary))
    command = "python benchmarks/batched_references.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if v is not None and k != "name"
    )
    print(write(args.name, rows, command=command, summary=summary, device=device_name(args.device)))


def device_name(device: str | None) -> str:
    import torch

    return torch.cuda.get_device_name() if device and device.startswith("cuda") else "cpu"


if __name__ == "__main__":
    main()
