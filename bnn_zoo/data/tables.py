"""Your own table as a Dataset: a CSV file (with or without a header row) or an .npz file of arrays.

Read with the standard library's csv module rather than numpy.genfromtxt or pandas: a bad cell must
be refused with its row and column, not read as NaN, and bnn-zoo does not depend on pandas' parser.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from bnn_zoo.data.datasets import Dataset
from bnn_zoo.errors import BnnZooError


def load_table(
    path: str | Path,
    target: str = "-1",
    task: Literal["regression", "classification"] = "regression",
    test_fraction: float = 0.2,
    test_rows: str | None = None,
    seed: int = 0,
) -> Dataset:
    """A table of numbers split into train and test rows, the other columns as inputs.

    Args:
        path: a CSV file (a first row with words where the next row has numbers is its header of
            column names) or an .npz file holding arrays ``x`` (N, features) and ``y`` (N,).
        target: the target column of a CSV file: its name in the header, or its index (negative counts
            from the end; default the last column).
        task: ``regression`` (numeric targets) or ``classification`` (labels, numbers or words, mapped to
            classes 0..C-1 in sorted order, their names in ``info["classes"]``).
        test_fraction: the share of rows held out at random (by ``seed``) for testing.
        test_rows: instead, a text file of the test rows' indices (0-based, data rows only).
        seed: the random split's seed.
    """
    path = Path(path)
    if task not in ("regression", "classification"):
        raise BnnZooError(f"--data.task is regression or classification, got {task!r}")
    if not path.is_file():
        raise BnnZooError(f"no table at {path}; give a CSV or .npz file: --data csv --data.path FILE")
    x, labels = _npz(path) if path.suffix == ".npz" else _csv(path, target, task)
    y, info = _targets(labels, task, path)
    test = _test_rows(len(x), test_fraction, test_rows, seed)
    train = torch.ones(len(x), dtype=torch.bool)
    train[test] = False
    return Dataset(f"table:{path.stem}", x[train], y[train], x[test], y[test], task=task, info=info)


def _csv(path: Path, target: str, task: str) -> tuple[torch.Tensor, list]:
    with path.open(newline="", encoding="utf-8-sig") as f:
        rows = [row for row in csv.reader(f) if row]
    if not rows:
        raise BnnZooError(f"{path} holds no rows")
    # a header: a first row with a word where the next row has a number (word labels are no header)
    below = rows[1] if len(rows) > 1 else rows[0]
    words = [not _is_number(c) and _is_number(d) for c, d in zip(rows[0], below, strict=False)]
    header = [c.strip() for c in rows[0]] if any(words) or len(rows) == 1 else None
    body, first_line = (rows[1:], 2) if header else (rows, 1)
    width = len(rows[0])
    names = header or [str(i) for i in range(width)]
    column = _column(target, names, path)
    features, labels = [], []
    for n, row in enumerate(body):
        line = n + first_line
        if len(row) != width:
            raise BnnZooError(f"{path}: line {line} has {len(row)} cells, the first row {width}")
        values = []
        for i, cell in enumerate(row):
            if i == column and task == "classification":
                labels.append(cell.strip())
                continue
            if not _is_number(cell) or not math.isfinite(float(cell)):
                what = "target" if i == column else "column"
                raise BnnZooError(
                    f"{path}: line {line}, {what} {names[i]!r}: {cell.strip()!r} is not a finite number; fix or drop "
                    "that row"
                )
            (labels if i == column else values).append(float(cell))
        features.append(values)
    if not features:
        raise BnnZooError(f"{path} has a header and no data rows")
    return torch.tensor(features, dtype=torch.float32), labels


def _column(target: str, names: list[str], path: Path) -> int:
    if target in names:
        return names.index(target)
    try:
        index = int(target)
    except ValueError:
        raise BnnZooError(
            f"{path} has no column {target!r}; its columns: {', '.join(names)} (--data.target takes a name or an index)"
        ) from None
    if not -len(names) <= index < len(names):
        raise BnnZooError(f"{path} has {len(names)} columns; --data.target {index} is out of range")
    return index % len(names)


def _npz(path: Path) -> tuple[torch.Tensor, list]:
    with np.load(path, allow_pickle=False) as arrays:  # data: never unpickled
        if not {"x", "y"} <= set(arrays.files):
            raise BnnZooError(f"{path} holds arrays {', '.join(arrays.files)}; an .npz table needs x and y")
        x, y = arrays["x"], arrays["y"]
    if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
        raise BnnZooError(
            f"{path}: x must be (N, features) and y (N,), got {x.shape} and {y.shape}; the command line fits one "
            "target (several: bz.fit in Python)"
        )
    bad = np.argwhere(~np.isfinite(x.astype(np.float64)))
    if len(bad):
        raise BnnZooError(f"{path}: x[{bad[0][0]}, {bad[0][1]}] is not a finite number; fix or drop that row")
    return torch.as_tensor(x, dtype=torch.float32), y.tolist()


def _targets(labels: list, task: str, path: Path) -> tuple[torch.Tensor, dict]:
    if task == "regression":
        y = torch.tensor([float(v) for v in labels], dtype=torch.float32)
        bad = torch.nonzero(~torch.isfinite(y))
        if len(bad):
            raise BnnZooError(f"{path}: the target of data row {int(bad[0])} is not a finite number")
        return y, {}
    missing = next((i for i, v in enumerate(labels) if str(v).strip() in ("", "nan", "NaN")), None)
    if missing is not None:
        raise BnnZooError(f"{path}: data row {missing} has no class label")
    classes = sorted({str(v) for v in labels}, key=lambda c: (not _is_number(c), float(c) if _is_number(c) else c))
    if len(classes) < 2:
        raise BnnZooError(f"{path}: every row has the class {classes[0]!r}; a classifier needs at least two classes")
    index = {c: i for i, c in enumerate(classes)}
    return torch.tensor([index[str(v)] for v in labels]), {"classes": classes}


def _test_rows(n: int, fraction: float, rows: str | None, seed: int) -> torch.Tensor:
    if rows is not None:
        try:
            test = torch.tensor([int(v) for v in Path(rows).read_text().split()], dtype=torch.long)
        except (OSError, ValueError) as exc:
            raise BnnZooError(f"--data.test_rows {rows}: not a file of row indices ({exc})") from None
        if len(test) == 0 or test.min() < 0 or test.max() >= n or len(set(test.tolist())) < len(test):
            raise BnnZooError(f"--data.test_rows {rows}: indices must be distinct, in 0..{n - 1}, and at least one")
    else:
        if not 0 < fraction < 1:
            raise BnnZooError(f"--data.test_fraction is a fraction in (0, 1), got {fraction}")
        test = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: max(1, round(fraction * n))]
    if n - len(test) < 2:
        raise BnnZooError(f"the table has {n} rows; {len(test)} held out for testing leave fewer than 2 to train on")
    return test


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
