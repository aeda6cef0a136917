"""An SVI step in bnn-zoo against a hand-written PyTorch loop of the same model, in the same run.

Three fits, each on both sides with the same data, network, prior, noise, initial scale, Adam and
number of steps, one torch thread:

- mean-field (Bayes by backprop) on a 13-50-1 tanh net, full batch (Boston's 455 training rows);
- the dropout guide (MC dropout, Gal's per-example masks on the input and hidden layer) on a
  13-50-1 ReLU net, batch 128, prior N(0, l^-2) with l = 1e-2;
- mean-field on a 13-400-400-1 tanh net, full batch, where the arithmetic dominates.

Two hand-written loops per fit: the leanest functional one (explicit tensors, ``w = mu +
softplus(rho) eps`` and the closed-form Normal KL, or ``x * bernoulli`` masks and Gal's weight decay
written out) and the nn.Module one most PyTorch code has (a BayesLinear layer in an nn.Sequential;
nn.Dropout layers with Adam's weight decay), both with ``torch.optim.Adam`` at its defaults. bnn-zoo's time per step is
the difference between a fit of
2S and of S steps divided by S, so guide building and the Posterior's draws cancel out. Each side runs
once to warm up, then ``--repeats`` times interleaved; the table gives each side's best, as
``results.best_ms`` does (a shared machine's interference only ever adds time).

    python benchmarks/svi_step.py [--data ../shared/data/uci/bostonHousing] [--steps 300] [--repeats 3]
    python benchmarks/svi_step.py --profile mean-field   # where bnn-zoo's step goes (cProfile)
"""

from __future__ import annotations

import argparse
import cProfile
import math
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from results import write

import bnn_zoo as bz

NOISE = 0.35  # the fixed noise sd on standardised targets, as in benchmarks/chees.py
CASES = {
    # name: (hidden widths, activation, guide, guide options, batch size, prior scale, lr)
    "mean-field 13-50-1": ([50], "tanh", "mean-field", {}, None, 1.0, 1e-2),
    "dropout 13-50-1, batch 128": ([50], "relu", "dropout", {"p": 0.05, "masks": "example"}, 128, 1e2, 1e-3),
    "mean-field 13-400-400-1": ([400, 400], "tanh", "mean-field", {}, None, 1.0, 1e-3),
}


def boston(folder: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Boston's split-0 training rows, standardised (or 455 synthetic rows of 13 columns without --data)."""
    if folder is None:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(455, 13, generator=g)
        return x, torch.tanh(x[:, :3]).sum(1) + 0.3 * torch.randn(455, generator=g)
    d = Path(folder)
    data = torch.tensor(
        [[float(v) for v in line.split()] for line in (d / "data.txt").read_text().splitlines() if line.strip()]
    )
    features = [int(float(v)) for v in (d / "index_features.txt").read_text().split()]
    target = int(float((d / "index_target.txt").read_text().split()[0]))
    train = [int(float(v)) for v in (d / "index_train_0.txt").read_text().split()]
    x, y = data[train][:, features], data[train][:, target]
    return (x - x.mean(0)) / x.std(0), (y - y.mean()) / y.std()


def zoo_fit(case, x, y, steps: int, direct: bool = True) -> float:
    hidden, act, guide, options, batch, prior, lr = CASES[case]
    model = bz.BNN(bz.models.MLP(13, hidden, 1, act), bz.priors.Normal(prior), bz.likelihoods.Gaussian(NOISE))
    svi = bz.SVI(
        guide=guide,
        guide_options=options,
        steps=steps,
        lr=lr,
        batch_size=batch,
        lr_decay=1.0,
        progress=False,
        num_draws=10,
        direct=direct,
    )
    start = time.perf_counter()
    bz.fit(model, x, y, svi)
    return time.perf_counter() - start


# where a step goes: (row, the profiled functions whose cumulative time it is, by file suffix and name)
PARTS = [
    ("the loss and its gradient", [("svi.py", "_loss_and_grads")]),
    ("  of which the network's forward (hooks included)", [("bnn.py", "forward")]),
    ("  of which backward", [("autograd/__init__.py", "backward")]),
    ("Adam and its schedule", [("lr_scheduler.py", "wrapper")]),
]


def profile(case, x, y, steps: int) -> None:
    """Milliseconds per step in each part of the loop, Pyro's ELBO against the direct one (cProfile)."""
    print(f"{case}, {steps} steps under cProfile (which inflates small calls)\n")
    print("| part of a step | Pyro's TraceMeanField_ELBO ms | direct ELBO ms |\n|---|---|---|")
    rows = {}
    for direct in (False, True):
        zoo_fit(case, x, y, 20, direct)  # imports and first-call costs out of the profile
        with cProfile.Profile() as prof:
            zoo_fit(case, x, y, steps, direct)
        stats = pstats.Stats(prof).stats
        total = max(v[3] for v in stats.values()) / steps * 1e3
        rows.setdefault("a whole step (the fit's time / steps)", []).append(total)
        parts = {}
        for label, keys in PARTS:
            parts[label] = (
                sum(
                    v[3] for (file, _, name), v in stats.items() if any(file.endswith(f) and name == n for f, n in keys)
                )
                / steps
                * 1e3
            )
            rows.setdefault(label, []).append(parts[label])
        rest = total - parts[PARTS[0][0]] - parts[PARTS[-1][0]]
        rows.setdefault("the rest: the loop's checks and copies, building the guide, 10 draws", []).append(rest)
    for label, (pyro_ms, direct_ms) in rows.items():
        print(f"| {label} | {pyro_ms:.3f} | {direct_ms:.3f} |")


def zoo_fits(case, x, y, steps: int) -> tuple[float, float]:
    """Seconds for fits of 2S and of S steps: their difference over S is a step (:func:`per_step`)."""
    return zoo_fit(case, x, y, 2 * steps), zoo_fit(case, x, y, steps)


def per_step(times: list, steps: int) -> float:
    """A side's best time per step over its repeats; bnn-zoo's is best(2S fit) - best(S fit) over S (the
    best of differences would pick the repeat whose S fit was slowed)."""
    if isinstance(times[0], tuple):
        return (min(t[0] for t in times) - min(t[1] for t in times)) / steps
    return min(times)


def _init(widths):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
    return [(lay.weight.detach().clone(), lay.bias.detach().clone()) for lay in layers]


def hand_mean_field(case, x, y, steps: int) -> float:
    """Bayes by backprop written out: mu, rho per tensor, w = mu + softplus(rho) eps, closed-form KL."""
    hidden, act, _, _, _, prior, lr = CASES[case]
    act = torch.tanh if act == "tanh" else torch.relu
    mus = [t.requires_grad_() for pair in _init([13, *hidden, 1]) for t in pair]
    rhos = [torch.full_like(m, math.log(math.expm1(1e-2))).requires_grad_() for m in mus]
    optim = torch.optim.Adam(mus + rhos, lr=lr)
    y = y[:, None]
    start = time.perf_counter()
    for _ in range(steps):
        optim.zero_grad()
        sigmas = [F.softplus(r) for r in rhos]
        ws = [m + s * torch.randn_like(s) for m, s in zip(mus, sigmas)]
        h = x
        for i in range(0, len(ws) - 2, 2):
            h = act(F.linear(h, ws[i], ws[i + 1]))
        f = F.linear(h, ws[-2], ws[-1])
        nll = 0.5 * ((y - f) / NOISE).pow(2).sum() + y.numel() * (math.log(NOISE) + 0.5 * math.log(2 * math.pi))
        kl = sum(
            (prior / s).log().sum() + ((s.pow(2) + m.pow(2)) / (2 * prior**2) - 0.5).sum() for m, s in zip(mus, sigmas)
        )
        (nll + kl).backward()
        optim.step()
    return (time.perf_counter() - start) / steps


def hand_dropout(case, x, y, steps: int) -> float:
    """MC dropout written out: per-example Bernoulli masks on each layer's input, Gal's weight decay."""
    hidden, _, _, options, batch, prior, lr = CASES[case]
    keep, n = 1 - options["p"], x.shape[0]
    params = [t.requires_grad_() for pair in _init([13, *hidden, 1]) for t in pair]
    optim = torch.optim.Adam(params, lr=lr)
    y = y[:, None]
    start = time.perf_counter()
    for _ in range(steps):
        optim.zero_grad()
        idx = torch.randperm(n)[:batch]
        h, yb = x[idx], y[idx]
        for i in range(0, len(params), 2):
            h = F.linear(h * (torch.rand_like(h) < keep), params[i], params[i + 1])
            h = torch.relu(h) if i < len(params) - 2 else h
        nll = (n / batch) * 0.5 * ((yb - h) / NOISE).pow(2).sum()
        decay = sum((keep if w.dim() == 2 else 1.0) * w.pow(2).sum() for w in params) / (2 * prior**2)
        (nll + decay).backward()
        optim.step()
    return (time.perf_counter() - start) / steps


class BayesLinear(torch.nn.Module):
    """The Bayes-by-backprop layer as PyTorch users usually write it: mu and rho as nn.Parameters, a
    fresh weight draw in every forward, its closed-form KL kept for the loss."""

    def __init__(self, weight, bias, prior):
        super().__init__()
        self.mus = torch.nn.ParameterList([weight, bias])
        self.rhos = torch.nn.ParameterList([torch.full_like(t, math.log(math.expm1(1e-2))) for t in (weight, bias)])
        self.prior = prior

    def forward(self, x):
        sigmas = [F.softplus(r) for r in self.rhos]
        w, b = (m + s * torch.randn_like(s) for m, s in zip(self.mus, sigmas))
        self.kl = sum(
            (self.prior / s).log().sum() + ((s.pow(2) + m.pow(2)) / (2 * self.prior**2) - 0.5).sum()
            for m, s in zip(self.mus, sigmas)
        )
        return F.linear(x, w, b)


def module_mean_field(case, x, y, steps: int) -> float:
    """Bayes by backprop as nn.Modules: an nn.Sequential of BayesLinear layers and activations."""
    hidden, act, _, _, _, prior, lr = CASES[case]
    layers = []
    for weight, bias in _init([13, *hidden, 1]):
        layers += [
            BayesLinear(torch.nn.Parameter(weight), torch.nn.Parameter(bias), prior),
            torch.nn.Tanh() if act == "tanh" else torch.nn.ReLU(),
        ]
    net = torch.nn.Sequential(*layers[:-1])
    optim = torch.optim.Adam(net.parameters(), lr=lr)
    y = y[:, None]
    start = time.perf_counter()
    for _ in range(steps):
        optim.zero_grad()
        nll = -torch.distributions.Normal(net(x), NOISE).log_prob(y).sum()
        (nll + sum(m.kl for m in net if isinstance(m, BayesLinear))).backward()
        optim.step()
    return (time.perf_counter() - start) / steps


def module_dropout(case, x, y, steps: int) -> float:
    """MC dropout as most PyTorch code has it: nn.Dropout layers in an nn.Sequential, Adam's weight decay."""
    hidden, _, _, options, batch, prior, lr = CASES[case]
    p, n = options["p"], x.shape[0]
    widths = [13, *hidden, 1]
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Dropout(p), torch.nn.Linear(a, b), torch.nn.ReLU()]
    torch.manual_seed(0)
    net = torch.nn.Sequential(*layers[:-1])
    optim = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=(1 - p) / (prior**2 * n))
    y = y[:, None]
    net.train()
    start = time.perf_counter()
    for _ in range(steps):
        optim.zero_grad()
        idx = torch.randperm(n)[:batch]
        F.mse_loss(net(x[idx]), y[idx]).backward()
        optim.step()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="a UCI folder (bostonHousing); default: 455 synthetic rows of 13 columns")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--profile", choices=[c.split()[0] for c in CASES], help="profile bnn-zoo's fit of this case instead"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    x, y = boston(args.data)
    if args.profile:
        profile(next(c for c in CASES if c.startswith(args.profile)), x, y, args.steps)
        return
    print(
        "| fit | functional loop ms/step | nn.Module loop ms/step | bnn-zoo ms/step | bnn-zoo steps/s | vs functional "
        "| vs nn.Module |"
    )
    print("|---|---|---|---|---|---|---|")
    rows = []
    for case in CASES:
        dropout = CASES[case][2] == "dropout"
        sides = {
            "functional": hand_dropout if dropout else hand_mean_field,
            "module": module_dropout if dropout else module_mean_field,
        }
        sides["zoo"] = zoo_fits
        times = {side: [] for side in sides}
        for run in sides.values():  # first calls: imports, the guide's and torch's lazy set-up
            run(case, x, y, args.steps // 10)
        for _ in range(args.repeats):
            for side, run in sides.items():
                times[side].append(run(case, x, y, args.steps))
        h, m, z = (per_step(times[side], args.steps) for side in ("functional", "module", "zoo"))
        print(
            f"| {case} | {h * 1e3:.3f} | {m * 1e3:.3f} | {z * 1e3:.3f} | {1 / z:.0f} | {h / z:.2f}x | {m / z:.2f}x |",
            flush=True,
        )
        rows.append(
            {
                "fit": case,
                "functional loop ms/step": round(h * 1e3, 3),
                "nn.Module loop ms/step": round(m * 1e3, 3),
                "bnn-zoo ms/step": round(z * 1e3, 3),
                "bnn-zoo steps/s": round(1 / z),
                "vs functional": f"**{h / z:.2f}x**",
                "vs nn.Module": f"{m / z:.2f}x",
            }
        )
    command = f"python benchmarks/svi_step.py --steps {args.steps} --repeats {args.repeats}"
    write("svi-step", rows, command=command + (" --data bostonHousing" if args.data else " (synthetic rows)"))


if __name__ == "__main__":
    main()
