"""Laplace and SG-MCMC measured (not timed tests), and Heek's calibration claims re-run on digits.

1. Evidence table: the toy regression (1-50-1 tanh, N(0, 1) prior, the generating noise) and digits
   (MLP 64-50-10 and LeNet, N(0, 1) prior): the mean-field ELBO and IW bound, AIS (toy only: it costs
   minutes per model on digits), and the Laplace evidence (full GGN on the toy; last layer, KFAC on
   digits), each with its run time.
2. Heek's claims on digits with the LeNet (dropout after the dense layer): (a) mean-field VI with
   KL discount tau in {1, 0.3, 0.1}; (b) MC dropout with p in {0.1, 0.3, 0.5}; (c) SGHMC, untuned;
   (d) Heek's calibration bins with variance: how many bins lie outside E[A] +- 1.96 sd and +- 3 sd.
   Test accuracy, NLL, ECE, expected accuracy, the significant bins and time; reliability diagrams.

    python benchmarks/laplace_sgmcmc.py [--evidence] [--heek] [--out runs/bench-laplace-sgmcmc]   (about 12 minutes on 2
    cores)
    python benchmarks/laplace_sgmcmc.py --nuts-sized   (the small LeNet by NUTS, SGHMC, mean-field, dropout; about 3
    minutes)
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings
from pathlib import Path

import torch
from results import write

warnings.simplefilter("ignore", FutureWarning)


def _row(cells):
    print("| " + " | ".join(cells) + " |")


def evidence_table():
    import bnn_zoo as bz
    from bnn_zoo.experiments.run import run

    toy = bz.data.toy_cubic()
    digits = bz.data.digits()
    noise = toy.info["noise_scale"]  # the generating noise sd, in the data's units
    cat = bz.likelihoods.Categorical()
    setups = [
        (
            "toy",
            toy,
            bz.BNN(bz.models.MLP(1, [50], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(noise)),
            "full",
            "all",
        ),
        (
            "digits mlp",
            digits,
            bz.BNN(bz.models.MLP(64, [50], 10, activation="relu"), bz.priors.Normal(1.0), cat),
            "kron",
            "last_layer",
        ),
        (
            "digits cnn",
            digits,
            bz.BNN(bz.models.LeNet(dropout="dense"), bz.priors.Normal(1.0), cat),
            "kron",
            "last_layer",
        ),
    ]
    header = [
        "data / model",
        "ELBO (SE)",
        "IW bound K=100 (SE)",
        "AIS (SE)",
        "Laplace, the model's prior",
        "Laplace, type-II prior",
        "fitted prior precision scale",
        "Laplace subset, Hessian",
        "accuracy or RMSE (mean-field / Laplace)",
        "s (mean-field / Laplace)",
    ]
    _row(header)
    _row(["---"] * 10)
    rows = []
    for name, data, model, hessian, subset in setups:
        batch = 128 if data.task == "classification" else None
        svi = bz.SVI(
            steps=3000,
            lr=0.005 if batch else 0.02,
            lr_decay=1.0 if batch else 0.1,
            batch_size=batch,
            num_draws=200,
            progress=False,
        )
        evidence = ["iw", "ais"] if name == "toy" else ["iw"]
        mf = run("mean-field", data, model, svi, evidence=evidence, ais_steps=500)
        options = dict(subset=subset, hessian=hessian, batch_size=batch, lr=0.005 if batch else 0.01, progress=False)
        fixed = run("laplace", data, model, bz.Laplace(**options))
        lap = run("laplace", data, model, bz.Laplace(optimize_prior=True, **options))
        m, lm = mf.metrics, lap.metrics
        test = "accuracy" if data.task == "classification" else "rmse"
        ais = f"{m['evidence_ais']:.1f} ({m['evidence_ais_se']:.1f})" if "evidence_ais" in m else "-"
        cells = [
            name,
            f"{m['elbo']:.1f} ({m['elbo_se']:.1f})",
            f"{m['evidence_iw']:.1f} ({m['evidence_iw_se']:.1f})",
            ais,
            f"{fixed.metrics['evidence_laplace']:.1f}",
            f"{lm['evidence_laplace_type_ii']:.1f}",
            f"{lap.posterior.info['prior_precision_scale']:.3g}",
            f"{subset}, {hessian}",
            f"{m[test]:.3f} / {lm[test]:.3f}",
            f"{m['runtime_s']:.0f} / {lm['runtime_s']:.0f}",
        ]
        _row(cells)
        rows.append(dict(zip(header, cells)))
    write(
        "laplace-evidence",
        rows,
        command="python benchmarks/laplace_sgmcmc.py --evidence: toy 1-50-1 and digits; Laplace full GGN on the toy, "
        "last layer KFAC on digits",
        toy_units="data's units",  # bz.fit answers in them; digits' columns have none
    )


def heek_claims(out: Path):
    import bnn_zoo as bz
    from bnn_zoo.evaluation import calibration, plots
    from bnn_zoo.experiments.run import run

    data = bz.data.digits()
    model = bz.BNN(bz.models.LeNet(dropout="dense"), bz.priors.Normal(1.0), bz.likelihoods.Categorical())
    svi = dict(steps=3000, lr=0.005, batch_size=128, num_draws=200, progress=False)
    configs = [(f"mean-field tau={t}", bz.SVI(kl_weight=t, **svi)) for t in (1.0, 0.3, 0.1)]
    configs += [
        (f"dropout p={p}", bz.SVI(guide="dropout", guide_options={"p": p, "masks": "example"}, **svi))
        for p in (0.1, 0.3, 0.5)
    ]
    configs += [
        (
            "sghmc",
            bz.SGMCMC(
                kind="sghmc",
                step_size=3e-4,
                friction=50.0,
                batch_size=128,
                burn_in=6000,
                num_samples=200,
                thinning=20,
                num_chains=1,
                progress=False,
            ),
        )
    ]
    results = []
    _row(["model", "accuracy", "NLL", "ECE", "expected accuracy", "bins outside 1.96 sd", "bins outside 3 sd", "s"])
    _row(["---"] * 8)
    for name, method in configs:
        r = run(name, data, model, method)
        results.append(r)
        probs, y = torch.as_tensor(r.predictions["probs"].values), torch.as_tensor(r.predictions["y"].values)
        bins = calibration.calibration_bins(probs, y)
        m = r.metrics
        _row(
            [
                name,
                f"{m['accuracy']:.3f}",
                f"{m['nll']:.3f}",
                f"{m['ece']:.3f}",
                f"{m['expected_accuracy']:.3f}",
                f"{int(bins.significant(1.96).sum())}/10",
                f"{int(bins.significant(3.0).sum())}/10",
                f"{m['runtime_s']:.0f}",
            ]
        )
    out.mkdir(parents=True, exist_ok=True)
    plots.reliability([r.predictions for r in results[:3]], out / "heek_mean_field.png")
    plots.reliability([r.predictions for r in results[3:6]], out / "heek_dropout.png")
    plots.reliability([results[-1].predictions], out / "heek_sghmc.png")
    print(f"\nreliability diagrams in {out}")


def nuts_sized():
    """The small LeNet NUTS finishes in about a minute (channels 4, dense 16: 1250 weights; 300 training
    digits, fan-in prior) by NUTS, SGHMC, mean-field and MC dropout: test accuracy, NLL, ECE, time."""
    import bnn_zoo as bz
    from bnn_zoo.data import Dataset
    from bnn_zoo.experiments.run import run

    digits = bz.data.digits()
    small = Dataset(
        "digits-300",
        digits.x_train[:300],
        digits.y_train[:300],
        digits.x_test,
        digits.y_test,
        task="classification",
        info=digits.info,
    )
    model = bz.BNN(
        bz.models.LeNet(channels=[4], dense=16, dropout="dense"), bz.priors.FanInNormal(), bz.likelihoods.Categorical()
    )
    svi = dict(steps=3000, lr=0.005, batch_size=64, num_draws=200, progress=False)
    methods = [
        ("nuts (1 chain, 100 + 100)", bz.NUTS(num_warmup=100, num_samples=100, num_chains=1, progress=False)),
        (
            "sghmc",
            bz.SGMCMC(
                kind="sghmc",
                step_size=1e-3,
                friction=20.0,
                batch_size=64,
                burn_in=4000,
                num_samples=200,
                thinning=20,
                num_chains=1,
                progress=False,
            ),
        ),
        ("mean-field", bz.SVI(**svi)),
        ("dropout p=0.5", bz.SVI(guide="dropout", guide_options={"p": 0.5, "masks": "example"}, **svi)),
    ]
    _row(["method", "accuracy", "NLL", "ECE", "expected accuracy", "s"])
    _row(["---"] * 6)
    for name, method in methods:
        m = run(name, small, model, method).metrics
        _row(
            [
                name,
                f"{m['accuracy']:.3f}",
                f"{m['nll']:.3f}",
                f"{m['ece']:.3f}",
                f"{m['expected_accuracy']:.3f}",
                f"{m['runtime_s']:.0f}",
            ]
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evidence", action="store_true")
    parser.add_argument("--heek", action="store_true")
    parser.add_argument(
        "--nuts-sized", action="store_true", help="only the small LeNet by NUTS, SGHMC, mean-field and dropout"
    )
    parser.add_argument("--out", default="runs/bench-laplace-sgmcmc")
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}\n"
    )
    if args.nuts_sized:
        return nuts_sized()
    if args.evidence or not args.heek:
        evidence_table()
        print()
    if args.heek or not args.evidence:
        heek_claims(Path(args.out))


if __name__ == "__main__":
    main()
