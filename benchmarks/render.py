"""Markdown tables from benchmarks/results/*.json, for docs/benchmarks.md.

python benchmarks/render.py chees-toy chees-boston chees-boston-torch backends
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from results import RESULTS


def header(record: dict) -> str:
    m = record["machine"]
    return f"{record['date']}, {m['cpu']} ({m['cores']} cores), torch {m['torch']}, commit {record['commit']}"


def samplers(record: dict) -> str:
    """Per sampler: ESS/s of f by seed, its median, and the median's ratio to native NumPyro's."""
    by = {}
    for row in record["rows"]:
        by.setdefault(row["sampler"], []).append(row)
    base = statistics.median(r["ess_per_s"] for r in next(iter(by.values())))
    lines = [
        "| sampler | warm-up + draws | wall s | leapfrog steps / draw | min bulk ESS of f | max R-hat of f | ESS/s by seed | median | vs NumPyro |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for sampler, rows in by.items():
        median = statistics.median(r["ess_per_s"] for r in rows)
        rates = ", ".join(f"{r['ess_per_s']:.1f}" for r in rows)
        lines.append(
            f"| {sampler} | {rows[0]['draws']} | {_span(rows, 'wall', '{:.0f}')} | {_span(rows, 'steps', '{:.0f}')} | "
            f"{_span(rows, 'ess', '{:.0f}')} | {_span(rows, 'rhat_f', '{:.3f}')} | {rates} | {median:.1f} | {median / base:.2f}x |"
        )
    return "\n".join(lines)


def _span(rows: list[dict], key: str, fmt: str) -> str:
    """The range of ``key`` over seeds, "low-high" (one value when they agree)."""
    ends = sorted({fmt.format(min(r[key] for r in rows)), fmt.format(max(r[key] for r in rows))}, key=float)
    return "-".join(ends)


def backends(record: dict) -> str:
    lines = ["| architecture | weights | rows | torch eager ms | XLA ms | torch / XLA | XLA compile s | auto backend |", "|---|---|---|---|---|---|---|---|"]
    return "\n".join(lines + [backend_row(r) for r in record["rows"]])


def backend_row(r: dict) -> str:
    if r["jax_ms"] is None:
        traced = "untraceable | - | - |"
    else:
        traced = f"{r['jax_ms']:.2f} | {r['speedup']:.2f}x | {r['jax_compile_s']:.1f} |"
    return f"| {r['architecture']} | {r['weights']:,} | {r['rows']:,} | {r['torch_ms']:.2f} | {traced} {r['auto']} |"


def rows(record: dict) -> str:
    """Any other result file: its rows as they are, numbers to three significant figures."""
    keys = list(dict.fromkeys(k for r in record["rows"] for k in r))  # rows may measure different things
    cell = lambda v: "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"| {' | '.join(cell(r.get(k)) for k in keys)} |" for r in record["rows"]]
    return "\n".join([f"| {' | '.join(keys)} |", "|" + "---|" * len(keys), *lines])


def main(names: list[str]) -> None:
    for name in names:
        record = json.loads((RESULTS / f"{name}.json").read_text())
        print(f"**{name}** ({header(record)}):\n")
        render = backends if name == "backends" else samplers if name.startswith("chees") else rows
        print(render(record) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:] or sorted(p.stem for p in Path(RESULTS).glob("*.json")))
