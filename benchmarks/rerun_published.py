"""The published numbers that carry a Monte Carlo error, re-run on the current code: the evidence
estimators on Bayesian linear regression (results/evidence-blr.json) and each guide's ELBO gap to the
exact evidence (results/guides.json). A row agrees when the two estimates differ by at most 3 combined
standard errors, sqrt(SE_published^2 + SE_now^2). Writes results/rerun-published.json.

    python benchmarks/rerun_published.py   (about 4 minutes on 2 cores)
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

warnings.simplefilter("ignore")
sys.path.insert(0, str(Path(__file__).parent))

import evidence  # noqa: E402
import guides  # noqa: E402
import results  # noqa: E402

Z = 3.0


def _published(name: str, key: str) -> dict:
    rows = json.loads((results.RESULTS / f"{name}.json").read_text())["rows"]
    return {row[key]: row for row in rows}


def _row(source: str, label: str, then: tuple[float, float], now: tuple[float, float]) -> dict:
    band = Z * math.hypot(then[1], now[1])
    return {
        "source": source,
        "row": label,
        "published": then[0],
        "published_se": then[1],
        "now": round(now[0], 4),
        "now_se": round(now[1], 4),
        "difference": round(now[0] - then[0], 4),
        "allowed": round(band, 4),
        "agrees": abs(now[0] - then[0]) <= band,
    }


def main() -> None:
    rows = []
    published = _published("evidence-blr", "estimator")
    model, x, y, _, post = evidence.blr_problem()
    for label, fn in evidence.blr_estimators(model, x, y, post):
        estimate, se = fn()
        then = published[label]
        rows.append(_row("evidence-blr", label, (float(then["estimate"]), float(then["SE"])), (estimate, se)))
        print(rows[-1], flush=True)
    published = _published("guides", "guide")
    for guide, options in guides.GUIDES:
        gap, se = guides.blr_gap(guide, options)
        then = published.get(guides.label(guide, options))
        if gap is not None and then is not None:
            then = (float(then["BLR gap log p(D) - ELBO (nats)"]), float(then["MC SE"]))
            rows.append(_row("guides", guides.label(guide, options), then, (gap, se)))
            print(rows[-1], flush=True)
    agree = sum(r["agrees"] for r in rows)
    print(f"{agree} of {len(rows)} rows agree within {Z:g} combined standard errors")
    results.write("rerun-published", rows, z=Z, command="python benchmarks/rerun_published.py")


if __name__ == "__main__":
    main()
