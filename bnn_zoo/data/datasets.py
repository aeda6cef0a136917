"""Datasets: a train/test pair in the data's own units; ``bnn_zoo.fit`` standardises what it fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from bnn_zoo.data.validation import as_tensor
from bnn_zoo.errors import BnnZooError, checked, positive
from bnn_zoo.scaling import moments


@dataclass
class Dataset:
    """A train/test pair in the data's own units, as a user would pass it to ``bnn_zoo.fit``: the
    library standardises what it fits (:mod:`bnn_zoo.scaling`), so every door scales the same way."""

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    task: str = "regression"
    info: dict = field(default_factory=dict)

    @property
    def in_features(self) -> int:
        return self.x_train.shape[1]

    @property
    def train(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x_train, self.y_train

    @property
    def test(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x_test, self.y_test

    @property
    def y_std(self) -> float:
        """The training targets' sd (a regression with one target), as the fit standardises them."""
        return float(moments(self.y_train.reshape(len(self.y_train), -1))[1].reshape(-1)[0])

    def validation_part(self, fraction: float = 0.8) -> Dataset:
        """The first ``fraction`` of the training rows (in their order) as training data and the rest as
        test data: a hyper-parameter selection split."""
        n = int(fraction * self.x_train.shape[0])
        if not 0 < n < self.x_train.shape[0]:
            raise BnnZooError(
                f"{self.name} has {self.x_train.shape[0]} training rows: too few to hold out {1 - fraction:.0%} for "
                "validation"
            )
        x, y, info = self.x_train, self.y_train, dict(self.info, part="validation")
        return Dataset(f"{self.name}:validation", x[:n], y[:n], x[n:], y[n:], self.task, info)

    @property
    def calibration(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The held-out calibration rows (:meth:`calibration_part`)."""
        return self.info["calibration"]

    def calibration_part(self, fraction: float) -> Dataset:
        """The last ``fraction`` of the training rows (in their order) held out of training as calibration
        data (``info["calibration"]``), the test rows kept."""
        n = self.x_train.shape[0] - round(fraction * self.x_train.shape[0])
        if not 0 < n < self.x_train.shape[0]:
            raise BnnZooError(
                f"{self.name} has {self.x_train.shape[0]} training rows: too few to hold {fraction:.0%} out for "
                "calibration"
            )
        info = dict(self.info, calibration=(self.x_train[n:], self.y_train[n:]))
        x, y = self.x_train[:n], self.y_train[:n]
        return Dataset(self.name, x, y, self.x_test, self.y_test, self.task, info)


def toy_cubic(n_train: int = 20, n_test: int = 200, seed: int = 0) -> Dataset:
    """Heek's toy regression (thesis sec. 3.2, after Hernandez-Lobato & Adams): x ~ U[-4, 4], y = x^3 + e,
    e ~ N(0, 3^2), drawn from ``seed``.

    Args:
        n_train: training points.
        n_test: test points, drawn like the training points.
        seed: the draw's seed.
    """
    positive("toy-cubic n_train (training points)", n_train, integer=True, least=2)
    positive("toy-cubic n_test (test points)", n_test, integer=True)
    g = torch.Generator().manual_seed(seed)

    def draw(n):
        x = torch.rand(n, 1, generator=g) * 8 - 4
        return x, x[:, 0] ** 3 + 3.0 * torch.randn(n, generator=g)

    (xtr, ytr), (xte, yte) = draw(n_train), draw(n_test)
    return Dataset("toy-cubic", xtr, ytr, xte, yte, info={"noise_scale": 3.0, "seed": seed})


@checked
def load_uci(
    path: str | Path,
    split: int = 0,
    allow_overlap: bool = False,
    gap: int | None = None,
    part: Literal["test", "validation"] = "test",
) -> Dataset:
    """A UCI regression folder in the standard MC-dropout/PBP format (see ../shared/data/README.md).

    A split whose test rows are also training rows is refused unless ``allow_overlap`` (its test metrics
    would not be held out), as are repeated training rows, fewer than MIN_TRAIN_ROWS training rows and a constant
    target.

    Args:
        path: the dataset's folder (data.txt, index_features.txt, index_target.txt, index_train_K.txt,
            index_test_K.txt).
        split: which of the folder's train/test splits (K in index_train_K.txt).
        allow_overlap: score a split whose test rows are also training rows (refused otherwise).
        gap: instead of the split, Foong et al.'s (2019) gap split of this input column: every row, sorted
            by it (ties in file order), the middle third held out as test data.
        part: test: train on the split's training rows and score its test rows; validation: Gal &
            Ghahramani's selection split, the first 80% of the training rows (file order) against the last
            20%, standardised with the 80% part's statistics.
    """
    if part not in ("test", "validation"):
        raise BnnZooError(f"UCI part must be test or validation, not {part!r}")
    root = Path(path)
    if root.is_file():
        raise BnnZooError(
            f"UCI path {root} is a file; pass the folder holding data.txt, e.g. --data uci --data.path data/uci/yacht"
        )
    if not root.is_dir():
        raise BnnZooError(
            f"UCI folder {root} does not exist; pass the folder holding data.txt, e.g. --data uci --data.path "
            "data/uci/yacht (bnn-zoo data uci yacht fetches Gal's splits there)"
        )
    data = _read_table(root / "data.txt", float)
    if data.ndim == 1:
        data = data[None, :]
    features = _read_table(root / "index_features.txt", int).reshape(-1)
    target = _read_table(root / "index_target.txt", int).reshape(-1)
    available = sorted(int(p.stem.rsplit("_", 1)[1]) for p in root.glob("index_train_*.txt"))
    if split not in available:
        raise BnnZooError(f"split {split} not found in {root}; available splits: {available or 'none'}")
    train = _read_table(root / f"index_train_{split}.txt", int).reshape(-1)
    test = _read_table(root / f"index_test_{split}.txt", int).reshape(-1)
    for name, idx, bound in [
        ("index_features", features, data.shape[1]),
        ("index_target", target, data.shape[1]),
        (f"index_train_{split}", train, data.shape[0]),
        (f"index_test_{split}", test, data.shape[0]),
    ]:
        if idx.size == 0 or idx.min() < 0 or idx.max() >= bound:
            raise BnnZooError(
                f"{root / (name + '.txt')} holds indices outside 0..{bound - 1} (or none): data.txt may be truncated "
                "or the folder inconsistent; re-copy it"
            )
    _check_columns(root, features, target)
    info = {"path": str(root), "split": split}
    if gap is not None:
        if not 0 <= gap < len(features):
            raise BnnZooError(f"{root.name} has input columns 0..{len(features) - 1}; gap {gap} is not one of them")
        order = np.argsort(data[:, features[gap]], kind="stable")
        third = len(order) // 3
        train, test = np.concatenate([order[:third], order[len(order) - third :]]), order[third : len(order) - third]
        info = {"path": str(root), "gap": gap}
    _check_split(root, split, train, test, data[train, target[0]], allow_overlap)
    x = as_tensor(f"{root / 'data.txt'} features", torch.from_numpy(data[:, features]).float())
    y = as_tensor(f"{root / 'data.txt'} target", torch.from_numpy(data[:, target[0]]).float())
    data = Dataset(f"uci:{root.name}", x[train], y[train], x[test], y[test], info=info)
    return data.validation_part() if part == "validation" else data


def _check_columns(root: Path, features: np.ndarray, target: np.ndarray) -> None:
    """Refuse a repeated feature column, the target among the features, or other than one target."""
    values, counts = np.unique(features, return_counts=True)
    if counts.max() > 1:
        raise BnnZooError(
            f"{root / 'index_features.txt'} lists column {values[counts.argmax()]} {counts.max()} times; list each "
            "feature once"
        )
    if target[0] in features:
        raise BnnZooError(f"{root / 'index_features.txt'} lists the target column {target[0]} as a feature; remove it")
    if len(target) != 1:
        raise BnnZooError(
            f"{root / 'index_target.txt'} names {len(target)} target columns; bnn-zoo expects exactly one"
        )


MIN_TRAIN_ROWS = 5


def _check_split(
    root: Path, split: int, train: np.ndarray, test: np.ndarray, y_train: np.ndarray, allow_overlap: bool
) -> None:
    files = f"{root}/index_train_{split}.txt"
    values, counts = np.unique(train, return_counts=True)
    if counts.max() > 1:
        row = int(values[counts.argmax()])
        raise BnnZooError(
            f"{files} lists row {row} {counts.max()} times; each training row should appear once (re-make the split)"
        )
    if len(train) < MIN_TRAIN_ROWS:
        raise BnnZooError(
            f"{files} holds {len(train)} row(s); a split needs at least {MIN_TRAIN_ROWS} training rows (to "
            "standardise, and to keep a validation part of the training rows); re-make the split"
        )
    shared = np.intersect1d(train, test)
    if len(shared) and not allow_overlap:
        raise BnnZooError(
            f"{len(shared)} of the {len(test)} test rows of split {split} are also training rows (first: row "
            f"{int(shared[0])}), so test "
            "metrics would not be held out; fix the split, or pass --data.allow_overlap true to score them anyway"
        )
    if np.ptp(y_train) == 0:
        raise BnnZooError(
            f"the target is constant ({y_train[0]:g}) on the training rows of split {split}; there is nothing to "
            "regress"
        )


def _read_table(path: Path, dtype) -> np.ndarray:
    if not path.is_file():
        raise BnnZooError(
            f"missing file {path}; the UCI folder needs data.txt, index_features.txt, index_target.txt and "
            "index_train_K/index_test_K"
        )
    try:
        # loadtxt skips blank lines, so a trailing empty line is valid.
        arr = np.loadtxt(path, dtype=float, ndmin=1)
    except ValueError as exc:
        raise BnnZooError(f"{path} is truncated or corrupt ({str(exc).splitlines()[0]}); re-copy the file") from None
    if arr.size == 0:
        raise BnnZooError(f"{path} is empty; re-copy the file")
    if dtype is int:
        if not np.all(arr == np.round(arr)):
            raise BnnZooError(f"{path} should hold whole-number indices but has fractions; re-copy the file")
        arr = arr.astype(np.int64)
    elif not np.isfinite(arr).all():
        row = int(np.argwhere(~np.isfinite(arr.reshape(len(arr), -1)))[0, 0])
        raise BnnZooError(
            f"{path} contains NaN or inf (first in row {row}, line {row + 1}); drop or impute those rows before fitting"
        )
    return arr


def digits(classes: int = 10) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 images, 10 classes, pixels 0..16), rows flattened to 64
    features, with a fixed stratified split: 1347 training and 450 test images (random_state 0).

    Args:
        classes: train on the digits 0..classes-1; the other digits' test images are kept as
            out-of-distribution examples (``info["ood_x"]``).
    """
    positive("digits classes", classes, integer=True, least=2)
    if classes > 10:
        raise BnnZooError(f"digits has 10 classes; asked for {classes}")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=450, stratify=y, random_state=0)
    t = lambda a, dtype: torch.as_tensor(a, dtype=dtype)  # noqa: E731
    info = {"image_shape": (1, 8, 8), "classes": classes}
    if classes < 10:
        info["ood_x"] = t(x_te[y_te >= classes], torch.float32)
        (x_tr, y_tr), (x_te, y_te) = ((x[y < classes], y[y < classes]) for x, y in ((x_tr, y_tr), (x_te, y_te)))
    name = "digits" if classes == 10 else f"digits:0-{classes - 1}"
    return Dataset(
        name,
        t(x_tr, torch.float32),
        t(y_tr, torch.long),
        t(x_te, torch.float32),
        t(y_te, torch.long),
        task="classification",
        info=info,
    )
