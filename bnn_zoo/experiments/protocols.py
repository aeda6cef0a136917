"""Published protocols as sweeps: ``bnn-zoo reproduce NAME``.

``deep-ensembles``: Lakshminarayanan, Pritzel & Blundell (2017), Table 1 (../shared/reference/
uci_deep_ensembles.csv and its header): per split, M = 5 networks of one hidden layer of n_hidden.txt
ReLU units, each predicting a mean and a variance (the heteroscedastic Gaussian NLL), trained by
maximum likelihood with Adam (batch 100, 40 epochs, a fixed rate of 0.01) and fast-gradient-sign
adversarial examples at epsilon = 0.01 x each input's range; the prediction is the mixture of the 5 Gaussians.

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
from bnn_zoo.inference import lockstep
from bnn_zoo.inference.budget import check_max_hours


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
        epochs: training epochs (default 100 x n_epochs.txt, the budget of the published repository's
            "10x epochs" script, the one that reproduces its table; docs/benchmarks.md).
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
    positive(f"{folder / 'n_hidden.txt'}'s value", grids["n_hidden"][0], integer=True)
    splits = _checked_splits(folder, grids["n_splits"][0], splits)
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


DEEP_ENSEMBLES_EPOCHS = 40  # the paper's


def deep_ensembles(
    folder: str | Path,
    epochs: int | None = None,
    splits: list[int] | None = None,
    members: int = 5,
    adversarial: float = 0.01,
    lr: float = 0.01,
) -> Sweep:
    """Deep ensembles on one UCI folder as a sweep, one cell per split.

    Args:
        folder: a UCI folder (data.txt, index_*_K.txt, n_hidden.txt, n_splits.txt).
        epochs: passes over each training split (default 40, the paper's).
        splits: the splits to run (default all n_splits.txt).
        members: M, the networks per ensemble.
        adversarial: epsilon of the adversarial examples as a fraction of each input's range (0: none).
        lr: Adam's fixed learning rate (the paper names none; 0.1 diverges on Boston and protein, see
            docs/benchmarks.md).
    """
    folder = Path(folder)
    grids = {name: _numbers(folder / f"{name}.txt") for name in ("n_hidden", "n_splits")}
    positive(f"{folder / 'n_hidden.txt'}'s value", grids["n_hidden"][0], integer=True)
    splits = _checked_splits(folder, grids["n_splits"][0], splits)
    epochs = DEEP_ENSEMBLES_EPOCHS if epochs is None else positive("epochs", epochs, integer=True)
    base = {
        "data": cfg.node(cfg.UCI, path=str(folder)),
        "model": cfg.node(cfg.MLP, hidden=[int(grids["n_hidden"][0])], activation="relu"),
        "likelihood": cfg.node(cfg.Heteroscedastic),
        "inference": cfg.node(
            cfg.Ensemble,
            members=members,
            epochs=epochs,
            lr=lr,
            batch_size=100,
            use_prior=False,
            adversarial=adversarial,
            validation=0.0,  # the paper trains on every training row
        ),
        "evaluation": {"plots": False, "training_evidence": False},
    }
    return Sweep(base, grid={"data.split": splits}, name=f"deep-ensembles {folder.name}")


# The zoo's methods, as in examples/sweeps/uci-guides.yaml and uci-baselines.yaml: (inference, guide) pairs
ZOO_METHODS = [
    ("svi", cfg.node(cfg.Dropout, p=0.05, masks="example")),
    ("svi", "mean-field"),
    ("svi", cfg.node(cfg.MeanField, local_reparam=True)),
    ("svi", "matrix-normal"),
    ("svi", "flow"),
    ("laplace", None),
    ("ensemble", None),
    ("swag", None),
    (cfg.node(cfg.SWAG, members=5), None),
    (cfg.node(cfg.GP, kernel="rbf"), None),
]


def uci_gap(folder: str | Path, columns: list[int] | None = None) -> Sweep:
    """Foong et al.'s (2019) gap splits of one UCI folder as a sweep: for each input column, every row
    sorted by it and the middle third held out, fitted by every method of the zoo's UCI table (one
    50-unit ReLU layer, fan-in prior, learned Gaussian noise). Test log-likelihood per column and overall.

    Args:
        folder: a UCI folder (data.txt, index_features.txt, index_target.txt, index_*_0.txt).
        columns: the input columns to hold out (default all).
    """
    folder = Path(folder)
    features = _numbers(folder / "index_features.txt")
    available = list(range(len(features)))
    columns = available if columns is None else columns
    if not set(columns) <= set(available):
        raise BnnZooError(
            f"{folder.name} has input columns 0..{available[-1]}; asked for {sorted(set(columns) - set(available))}"
        )
    base = {
        "data": cfg.node(cfg.UCI, path=str(folder), gap=columns[0]),
        "model": cfg.node(cfg.MLP, hidden=[50], activation="relu"),
        "prior": "fanin",
        "likelihood": "gaussian",
        "evaluation": {"plots": False, "training_evidence": False},
    }
    inference, guide = zip(*ZOO_METHODS)
    return Sweep(
        base,
        grid={"data.gap": columns},
        zip={"inference": list(inference), "guide": list(guide)},
        name=f"uci-gap {folder.name}",
    )


def digits_shift() -> Sweep:
    """Every method of the zoo on scikit-learn's digits (one 50-unit ReLU layer, fan-in prior): trained on
    all 10 classes and scored on rotated and noised test images (Ovadia et al. 2019's protocol on the data
    at hand), and trained on the digits 0-4 and scored on detecting 5-9 as out-of-distribution."""
    base = {
        "data": cfg.node(cfg.Digits),
        "model": cfg.node(cfg.MLP, hidden=[50], activation="relu"),
        "prior": "fanin",
        "evaluation": {"plots": False, "training_evidence": False, "shift": True},
    }
    inference, guide = zip(*ZOO_METHODS)
    return Sweep(
        base,
        grid={"data.classes": [10, 5]},
        zip={"inference": list(inference), "guide": list(guide)},
        name="digits-shift",
    )


def shift_curves(frame) -> list[dict]:
    """The shift metrics of a digits-shift sweep's cells as rows (inference, transform, intensity, metric
    means over the cells), intensity 0 being the clean test set."""
    from bnn_zoo.evaluation.shift import SHIFT_METRICS

    rows = []
    clean = {m: m for m in SHIFT_METRICS}
    for inference, group in frame[frame["data.classes"] == 10].groupby("inference", sort=True):
        for transform in ("rotate", "noise"):
            columns = sorted({c.split("_")[2] for c in group.columns if c.startswith(f"shift_{transform}_")}, key=float)
            for intensity in ["0", *columns]:
                names = clean if intensity == "0" else {m: f"shift_{transform}_{intensity}_{m}" for m in SHIFT_METRICS}
                rows.append(
                    {"inference": inference, "transform": transform, "intensity": float(intensity)}
                    | {m: float(group[c].mean()) for m, c in names.items()}
                )
    return rows


def _checked_splits(folder: Path, count: float, splits: list[int] | None) -> list[int]:
    positive(f"{folder}'s number of splits", count, integer=True)
    available = list(range(int(count)))
    if splits is None:
        return available
    if not set(splits) <= set(available):
        raise BnnZooError(
            f"{folder.name} has splits {available[0]}..{available[-1]}; asked for "
            f"{sorted(set(splits) - set(available))}"
        )
    return splits


# the reference methods whose cells run as one XLA program, by name
REFERENCE_SAMPLERS = {n: c for n, c in cfg.REGISTRY["inference"].items() if c.method in lockstep.SAMPLERS}


def reference(
    folder: str | Path,
    splits: list[int] | None = None,
    sampler: str = "chees",
    chains: int = 32,
    warmup: int = 500,
    samples: int = 250,
    device: str | None = None,
    max_hours: float | None = None,
) -> Sweep:
    """Reference posteriors for the zoo's UCI table on one UCI folder as a sweep, one cell per split: the
    table's model (one hidden layer of 50 ReLU units, the fan-in prior, a learned Gaussian noise)
    sampled by ChEES (or NUTS) on XLA. The sweep runs every split's chains as one XLA program
    (:mod:`bnn_zoo.inference.lockstep`); each cell still gets its folder, metrics.json with the
    convergence verdict (``reference_converged``, ``reference_note``) and its InferenceData. The defaults
    are ChEES's own with twice its chains.

    Args:
        folder: a UCI folder (data.txt, index_train_K.txt, index_test_K.txt).
        splits: the splits to run (default: every index_train_K.txt).
        sampler: ``"chees"`` or ``"nuts"``.
        chains: chains per split.
        warmup: warm-up iterations per chain.
        samples: kept draws per chain.
        device: where the XLA program runs (None: the CPU; "cuda": a GPU, with the cuda extra).
        max_hours: stop once a split is projected past this many hours (None: no limit; a reference is
            long by design, and splits finished before a stop are kept). Not part of a cell's key: the
            same sweep run again with another limit resumes.
    """
    if sampler not in REFERENCE_SAMPLERS:
        raise BnnZooError(f"the reference sampler is one of {', '.join(REFERENCE_SAMPLERS)}, got {sampler!r}")
    device = None if device is None else str(check_device(device))
    for name, value, least in (("chains", chains, 4), ("warmup", warmup, 1), ("samples", samples, 4)):
        positive(f"reference {name}", value, integer=True, least=least)
    folder = Path(folder)
    count = len(list(folder.glob("index_train_*.txt")))
    splits = _checked_splits(folder, count, splits)
    check_max_hours("reference", max_hours)
    options = {
        "num_chains": chains,
        "num_warmup": warmup,
        "num_samples": samples,
        "backend": "jax",
        "max_hours": max_hours,
    }
    base = {
        "data": cfg.node(cfg.UCI, path=str(folder)),
        "model": cfg.node(cfg.MLP, hidden=[50], activation="relu"),
        "prior": "fanin",
        "likelihood": "gaussian",
        "inference": cfg.node(REFERENCE_SAMPLERS[sampler], **options),
        "evaluation": {"plots": False},
        **({"device": device} if device else {}),
    }
    return Sweep(base, grid={"data.split": splits}, name=f"reference {folder.name}")


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
