"""An SVI step of bnn-zoo's recurrent models against a hand-written variational LSTM, in the same run.

Character-level tiny Shakespeare (the first 90% of the text trains; windows of 64 characters), a
batch of 32 windows, embedding 32, hidden 64, next-character head: bnn-zoo's ``TextRNN`` with tied
and with untied gate weights, and with word-type (embedding) dropout, each fitted by the dropout
guide with Gal's per-sequence masks (p = 0.25; the variational RNN). The alternative is Gal &
Ghahramani's variational LSTM written out in PyTorch: one (4K, D+K) weight on [x_t; h_{t-1}] with
one mask per sequence reused at every step, a masked output layer, cross-entropy scaled by N / M,
Gal's weight decay and Adam; once as usually written (the masked [x_t; h_{t-1}] times the weight
at every step), once with the inputs' matmul hoisted out of the loop as bnn-zoo's LSTM does it.
bnn-zoo's time per step is the difference between fits of 2S and S
steps over S; medians of ``--repeats`` interleaved runs; one torch thread.

    python benchmarks/text_step.py [--data ../shared/data/tinyshakespeare/input.txt] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import bnn_zoo as bz
from bnn_zoo.data.text import language_model

P, EMBED, HIDDEN, SEQ, BATCH, LR = 0.25, 32, 64, 64, 32, 1e-3
MODELS = {  # name: (gates, word-type dropout, SVI's direct ELBO)
    "lstm-tied": ("tied", False, True),
    "lstm-untied": ("untied", False, True),
    "embedding-rnn (tied)": ("tied", True, True),
    "lstm-tied, Pyro's TraceMeanField_ELBO (direct=False)": ("tied", False, False),
}


def windows(path: str | None):
    """Training windows (N, 64) and next-character targets; a repeated pangram without --data."""
    text = Path(path).read_text() if path else "the quick brown fox jumps over the lazy dog. " * 2000
    data = language_model(text, "char", seq_len=SEQ)
    return data.x_train, data.y_train, len(data.info["vocab"])


def zoo_fit(name, x, y, vocab, steps) -> float:
    gates, embedding_dropout, direct = MODELS[name]
    net = bz.models.TextRNN(vocab, EMBED, HIDDEN, gates=gates, head="lm", embedding_dropout=embedding_dropout)
    model = bz.BNN(net, bz.priors.Normal(1.0), bz.likelihoods.Tokens())
    options = {"p": P, "masks": "example"}
    svi = bz.SVI(
        guide="dropout",
        guide_options=options,
        steps=steps,
        lr=LR,
        batch_size=BATCH,
        lr_decay=1.0,
        progress=False,
        num_draws=2,
        direct=direct,
    )
    start = time.perf_counter()
    bz.fit(model, x, y, svi)
    return time.perf_counter() - start


def zoo_per_step(name, x, y, vocab, steps) -> float:
    return (zoo_fit(name, x, y, vocab, 2 * steps) - zoo_fit(name, x, y, vocab, steps)) / steps


def hand_variational_lstm(x, y, vocab, steps, hoisted: bool = False) -> float:
    """Gal's variational LSTM (tied gates), written out; ``hoisted``: the inputs' matmul taken out of
    the loop over time (one per window batch), as bnn-zoo's LSTM does."""
    torch.manual_seed(0)
    n, keep = x.shape[0], 1 - P
    bound = HIDDEN**-0.5
    emb = (torch.randn(vocab, EMBED) / EMBED**0.5).requires_grad_()
    w = torch.empty(4 * HIDDEN, EMBED + HIDDEN).uniform_(-bound, bound).requires_grad_()
    b = torch.empty(4 * HIDDEN).uniform_(-bound, bound).requires_grad_()
    wo = torch.empty(vocab, HIDDEN).uniform_(-bound, bound).requires_grad_()
    bo = torch.zeros(vocab).requires_grad_()
    params = [emb, w, b, wo, bo]
    optim = torch.optim.Adam(params, lr=LR)
    ids_all, y_all = x.long(), y
    start = time.perf_counter()
    for _ in range(steps):
        optim.zero_grad()
        idx = torch.randperm(n)[:BATCH]
        ids, targets = ids_all[idx], y_all[idx]
        xs = emb[ids]  # (M, T, D)
        mask_z = (torch.rand(BATCH, EMBED + HIDDEN) < keep).float()  # one mask per sequence, every step
        mask_o = (torch.rand(BATCH, HIDDEN) < keep).float()
        h = c = xs.new_zeros(BATCH, HIDDEN)
        outs = []
        if hoisted:
            from_x = (xs * mask_z[:, None, :EMBED]) @ w[:, :EMBED].T + b
            mask_h, w_h, from_x = mask_z[:, EMBED:], w[:, EMBED:].T, from_x.unbind(1)
        for t in range(SEQ):
            if hoisted:
                pre = from_x[t] + (h * mask_h) @ w_h
            else:
                pre = (torch.cat([xs[:, t], h], -1) * mask_z) @ w.T + b
            i, f, o, g = pre.split(HIDDEN, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        logits = (torch.stack(outs, 1) * mask_o[:, None]) @ wo.T + bo
        nll = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=-1, reduction="sum") * (
            n / BATCH
        )
        decay = 0.5 * (keep * (w.pow(2).sum() + wo.pow(2).sum()) + b.pow(2).sum() + bo.pow(2).sum() + emb.pow(2).sum())
        (nll + decay).backward()
        optim.step()
    return (time.perf_counter() - start) / steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="a plain-text file (tiny Shakespeare); default: a repeated pangram")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x, y, vocab = windows(args.data)
    print(
        f"{x.shape[0]} training windows of {SEQ} characters, vocabulary {vocab}, batch {BATCH}, embed {EMBED}, hidden "
        f"{HIDDEN}\n"
    )
    print(
        "| model | hand-written ms/step | hand-written, inputs hoisted ms/step | bnn-zoo ms/step | vs hand-written | "
        "vs hoisted |"
    )
    print("|---|---|---|---|---|---|")
    for name in MODELS:
        times = {"plain": [], "hoisted": [], "zoo": []}
        for _ in range(args.repeats):
            times["plain"].append(hand_variational_lstm(x, y, vocab, args.steps))
            times["hoisted"].append(hand_variational_lstm(x, y, vocab, args.steps, hoisted=True))
            times["zoo"].append(zoo_per_step(name, x, y, vocab, args.steps))
        h, hh, z = (statistics.median(v) for v in times.values())
        print(f"| {name} | {h * 1e3:.1f} | {hh * 1e3:.1f} | {z * 1e3:.1f} | {h / z:.2f}x | {hh / z:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
