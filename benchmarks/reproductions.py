"""The reproductions under examples/ run in full, their tables recorded as data: Gal's Mauna Loa CO2
extrapolation (examples/mauna_loa_co2.py) and Goan & Fookes' toy comparison
(examples/survey_toy_regression.py). Every column is in the data's units.

    pip install -e '.[examples]' && python benchmarks/reproductions.py [--only mauna-loa,survey-toy]
    (about 15 minutes on 2 cores)

Results: results/mauna-loa.json and results/survey-toy.json, rendered in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from results import write

EXAMPLES = Path(__file__).parents[1] / "examples"


def example(name: str):
    """The module examples/NAME.py (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def evidence(m: dict) -> float | None:
    """The run's evidence estimate: the GP's log marginal likelihood, else the ELBO, else None (MC dropout
    has no density)."""
    return m.get("log_marginal_likelihood", m.get("elbo"))


def mauna_loa(out: Path) -> None:
    labels = {"mc-dropout-relu": "MC dropout, ReLU", "mc-dropout-tanh": "MC dropout, TanH", "gp-se": "GP, SE kernel"}
    results = example("mauna_loa_co2").main(out / "mauna-loa", quick=False)
    rows = [
        {
            "run": labels[r.name],
            "test RMSE (ppm)": f"{r.metrics['rmse']:.2f}",
            "test LL": f"{r.metrics['test_log_likelihood']:.2f}",
            "evidence": "-" if evidence(r.metrics) is None else f"log ML {evidence(r.metrics):.1f}",
            "s": f"{r.metrics['runtime_s']:.0f}",
        }
        for r in results
    ]
    write("mauna-loa", rows, command="python examples/mauna_loa_co2.py", units=results[0].metrics["units"])


def survey_toy(out: Path) -> None:
    data_labels = {"blundell": "Blundell", "toy-cubic": "cubic"}
    labels = {"mean-field": "mean-field", "mc-dropout": "MC dropout", "gp-matern52": "GP Matern-5/2", "nuts": "NUTS"}
    fits = example("survey_toy_regression").main(out / "survey", quick=False)
    rows = []
    for data, results in fits.items():
        for r in results:
            m = r.metrics
            loo = f"{m['loo_elpd']:.1f} ({m['loo_se']:.1f})" if "loo_elpd" in m else "-"
            rows.append(
                {
                    "data": data_labels[data],
                    "run": labels[r.name],
                    "test RMSE": f"{m['rmse']:.3g}",
                    "test LL": f"{m['test_log_likelihood']:.3g}",
                    "ELBO / GP log ML": "-" if evidence(m) is None else f"{evidence(m):.1f}",
                    "LOO elpd (SE)": loo,
                    "s": f"{m['runtime_s']:.0f}",
                }
            )
    write("survey-toy", rows, command="python examples/survey_toy_regression.py", units=m["units"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="mauna-loa,survey-toy", help="which reproductions, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("runs/reproductions"))
    args = parser.parse_args()
    runs = {"mauna-loa": mauna_loa, "survey-toy": survey_toy}
    for name in args.only.split(","):
        runs[name](args.out)


if __name__ == "__main__":
    main()
