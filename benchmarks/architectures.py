"""Architectures side by side (measured, not timed tests).

1. digits (scikit-learn 8x8, fixed stratified split): LeNet fitted by each guide; accuracy, NLL and
   ECE by MC prediction and by one pass at E_q[w] (standard dropout for the dropout guide), with
   dropout placed as lenet-all and lenet-ip.
2. tiny Shakespeare (characters, first 90% train / last 10% test, windows of 50): an LSTM with tied
   versus untied gates, with and without embedding (word-type) dropout; test perplexity per
   character and seconds per epoch. Gal reports tied gates as faster and slightly worse.

3. NUTS on small instances (which sizes finish within minutes on 2 cores).

    python benchmarks/architectures.py [--text ../shared/data/tinyshakespeare] [--epochs 1] [--nuts-only]
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings

warnings.simplefilter("ignore", FutureWarning)
warnings.filterwarnings("ignore", message="Failed to verify mean field")


def digits_table(steps=3000):

    import bnn_zoo as bz
    from bnn_zoo.evaluation import classification_metrics
    from bnn_zoo.experiments import config

    d = config.Digits().load(seed=0)
    (x, y), (xt, yt) = d.train, d.test
    runs = [
        ("dropout p=0.5", "all", "dropout", {"p": 0.5, "masks": "example"}),
        ("dropout p=0.5", "dense", "dropout", {"p": 0.5, "masks": "example"}),
        ("mean-field", "-", "mean-field", {}),
        ("mean-field local_reparam", "-", "mean-field", {"local_reparam": True}),
        ("matrix-normal rank=4", "-", "matrix-normal", {"rank": 4}),
    ]
    print(
        "| guide | placement | accuracy (MC) | NLL (MC) | ECE (MC) | accuracy (at mean) | NLL (at mean) | ECE (at "
        "mean) | s |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for label, placement, guide, options in runs:
        net = bz.models.LeNet(dropout=placement if placement != "-" else "all")
        model = bz.BNN(net, bz.priors.Normal(1.0), bz.likelihoods.Categorical())
        start = time.perf_counter()
        post = bz.fit(
            model,
            x,
            y,
            bz.SVI(
                guide=guide, guide_options=options, steps=steps, lr=0.005, batch_size=128, num_draws=200, progress=False
            ),
        )
        seconds = time.perf_counter() - start
        mc = classification_metrics(post.predict(xt), yt)
        at_mean = classification_metrics(post.predict(xt, at_mean=True), yt)
        print(
            f"| {label} | {placement} | {mc['accuracy']:.3f} | {mc['nll']:.3f} | {mc['ece']:.3f} | "
            f"{at_mean['accuracy']:.3f} | "
            f"{at_mean['nll']:.3f} | {at_mean['ece']:.3f} | {seconds:.0f} |",
            flush=True,
        )


def shakespeare_table(path, epochs=1, batch=64):
    import math

    import bnn_zoo as bz
    from bnn_zoo.evaluation import language_model_metrics
    from bnn_zoo.experiments import config

    d = config.Text(str(path), level="char", seq_len=50).load(seed=0)
    (x, y), (xt, yt) = d.train, d.test
    steps = epochs * math.ceil(len(x) / batch)
    print(
        f"\n{len(x)} training windows of 50 characters, {len(xt)} test windows, vocabulary {len(d.info['vocab'])}; "
        f"{epochs} epoch(s) = {steps} steps of {batch}; embed 32, hidden 128, dropout p = 0.25 with per-sequence masks"
    )
    print("| gates | embedding dropout | test perplexity (MC, 100 draws) | at mean | s per epoch |")
    print("|---|---|---|---|---|", flush=True)
    for gates in ("tied", "untied"):
        for embedding_dropout in (False, True):
            net = bz.models.TextRNN(
                len(d.info["vocab"]), 32, 128, gates=gates, head="lm", embedding_dropout=embedding_dropout
            )
            model = bz.BNN(net, bz.priors.Normal(1.0), bz.likelihoods.Tokens())
            start = time.perf_counter()
            post = bz.fit(
                model,
                x,
                y,
                bz.SVI(
                    guide="dropout",
                    guide_options={"p": 0.25, "masks": "example"},
                    steps=steps,
                    lr=0.003,
                    batch_size=batch,
                    num_draws=100,
                    progress=False,
                ),
            )
            per_epoch = (time.perf_counter() - start) / epochs
            mc = language_model_metrics(post.predictive_mean(xt), yt)
            at_mean = language_model_metrics(post.predict(xt, at_mean=True).mean, yt)
            print(
                f"| {gates} | {'yes' if embedding_dropout else 'no'} | {mc['perplexity']:.2f} | "
                f"{at_mean['perplexity']:.2f} | {per_epoch:.0f} |",
                flush=True,
            )


def nuts_table(warmup=100, samples=100):
    """NUTS on small instances: which sizes finish within minutes on 2 cores."""
    import bnn_zoo as bz
    from bnn_zoo.experiments import config

    digits, toy = config.Digits().load(seed=0), config.ToyText().load(seed=0)
    (xd, yd), (xdt, ydt) = digits.train, digits.test
    (xs, ys), (xst, yst) = toy.train, toy.test
    vocab = len(toy.info["vocab"])
    cases = [
        ("LeNet channels=2, dense=8, 300 digits", bz.models.LeNet(channels=[2], dense=8), xd[:300], yd[:300], xdt, ydt),
        (
            "LeNet channels=4, dense=16, 300 digits",
            bz.models.LeNet(channels=[4], dense=16),
            xd[:300],
            yd[:300],
            xdt,
            ydt,
        ),
        ("LSTM tied embed=4, hidden=8, toy-text (300)", bz.models.TextRNN(vocab, 4, 8, "tied"), xs, ys, xst, yst),
        ("LSTM untied embed=4, hidden=8, toy-text (300)", bz.models.TextRNN(vocab, 4, 8, "untied"), xs, ys, xst, yst),
    ]
    print(f"\nNUTS, one chain of {warmup} warmup + {samples} draws, fan-in prior, JIT", flush=True)
    print("| model | weights | seconds | mean tree depth | divergences | test accuracy |")
    print("|---|---|---|---|---|---|", flush=True)
    for label, net, x, y, xt, yt in cases:
        model = bz.BNN(net, bz.priors.FanInNormal(), bz.likelihoods.Categorical())
        start = time.perf_counter()
        post = bz.fit(model, x, y, bz.NUTS(num_warmup=warmup, num_samples=samples, num_chains=1, progress=False))
        seconds = time.perf_counter() - start
        accuracy = (post.predict(xt).probs.argmax(-1) == yt).float().mean().item()
        weights = sum(p.numel() for p in net.parameters())
        print(
            f"| {label} | {weights} | {seconds:.0f} | {post.sample_stats['tree_depth'].float().mean():.1f} | "
            f"{int(post.sample_stats['diverging'].sum())} | {accuracy:.3f} |",
            flush=True,
        )


def main():
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--text",
        default="../shared/data/tinyshakespeare",
        help="corpus folder or file (default ../shared/data/tinyshakespeare)",
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--nuts-only", action="store_true", help="only the NUTS sizes table")
    args = parser.parse_args()
    print(
        f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} "
        "threads"
    )
    if args.nuts_only:
        return nuts_table()
    if not args.skip_digits:
        digits_table()
    shakespeare_table(args.text, args.epochs)
    nuts_table()


if __name__ == "__main__":
    main()
