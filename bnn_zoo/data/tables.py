"""Your own table as a Dataset: a CSV file (with or without a header row) or an .npz file of arrays.

Read with the standard library's csv module rather than numpy.genfromtxt or pandas: a bad cell must
be refused with its row and column, not read as NaN, and bnn-zoo does not depend on pandas' parser.
"""

from __future__ import annotations

import codecs
import collections
import csv
import math
import zipfile
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from bnn_zoo.data.datasets import Dataset
from bnn_zoo.errors import BnnZooError, checked

MAX_CSV_BYTES = 512 * 2**20  # parsed as Python strings a CSV takes ~10x its size in memory; larger: an .npz
SEPARATORS = {",": "','", ";": "';'", "\t": "tab"}
MAX_ROWS_PER_CLASS = 3  # a classifier's target with fewer rows a class on average is refused


@checked
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
        path: a CSV file or an .npz file. A CSV is UTF-8 (with or without a byte-order mark) or UTF-16
            with one, its cells separated by ',', ';' or tabs (found from its first rows; with ';' a
            decimal comma reads as a point), its first row a header of column names where it has words
            over numbers. An .npz holds arrays ``x`` (N, features) and ``y`` (N,), or one 1-D array per
            column, named as a header's columns are.
        target: the target column: its name in the header (an .npz's array name), or its index
            (negative counts from the end; default the last column; an .npz of x and y: ``y``).
        task: ``regression`` (numeric targets) or ``classification`` (labels, numbers or words, mapped to
            classes 0..C-1 in sorted order, their names in ``info["labels"]``).
        test_fraction: the share of rows held out for testing, drawn at random with ``seed``: from
            the command line always seed 0, so runs of every ``--seed`` are tested on the same rows.
        test_rows: instead, a text file of the test rows' indices (0-based, data rows only).
        seed: the split's seed (Python only).
    """
    path = Path(path)
    if not path.is_file():
        raise BnnZooError(f"no table at {path}; give a CSV or .npz file: --data csv --data.path FILE")
    x, labels, name = _npz(path, target) if path.suffix == ".npz" else _csv(path, target, task)
    y, info = _targets(labels, task, path, name)
    test = _test_rows(len(x), test_fraction, test_rows, seed)
    train = torch.ones(len(x), dtype=torch.bool)
    train[test] = False
    return Dataset(f"table:{path.stem}", x[train], y[train], x[test], y[test], task=task, info=info)


def _csv(path: Path, target: str, task: str) -> tuple[torch.Tensor, list, str]:
    rows, separator = _rows(path)
    # a header: a first row with a word where the next row has a number (word labels are no header)
    below = rows[1] if len(rows) > 1 else rows[0]
    words = [not _is_number(c, separator) and _is_number(d, separator) for c, d in zip(rows[0], below, strict=False)]
    header = [c.strip() for c in rows[0]] if any(words) or len(rows) == 1 else None
    body, first_line = (rows[1:], 2) if header else (rows, 1)
    width = len(rows[0])
    names = header or [str(i) for i in range(width)]
    _check_unique(names, path)
    column = _column(target, names, path, SEPARATORS[separator])
    features, labels = [], []
    for n, row in enumerate(body):
        line = n + first_line
        if len(row) != width:
            raise BnnZooError(
                f"{path}: line {line} has {len(row)} cells, the first row {width} (cells separated by "
                f"{SEPARATORS[separator]})"
            )
        values = []
        for i, cell in enumerate(row):
            if i == column and task == "classification":
                labels.append(cell.strip())
                continue
            number = _number(cell, separator)
            if number is None or not math.isfinite(number):
                what = "target" if i == column else "column"
                raise BnnZooError(
                    f"{path}: line {line}, {what} {names[i]!r}: {cell.strip()!r} is not a finite number; fix or drop "
                    "that row"
                )
            (labels if i == column else values).append(number)
        features.append(values)
    if not features:
        raise BnnZooError(f"{path} has a header and no data rows")
    return torch.tensor(features, dtype=torch.float32), labels, names[column]


def _rows(path: Path) -> tuple[list[list[str]], str]:
    """The file's non-empty rows and its separator, refused in one line if it is not a text table."""
    size = path.stat().st_size
    if size > MAX_CSV_BYTES:
        raise BnnZooError(
            f"{path} is {size / 2**20:,.0f} MiB, over the {MAX_CSV_BYTES // 2**20} MiB a CSV may be; save a larger "
            "table as an .npz: numpy.savez(FILE, x=inputs, y=targets)"
        )
    text = _text(path, path.read_bytes())
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise BnnZooError(f"{path} holds no rows")
    csv.field_size_limit(MAX_CSV_BYTES)  # a cell may be as long as a file may be
    try:
        separator = _separator([line for line in lines[:50] if line.strip()])
        return [row for row in csv.reader(lines, delimiter=separator) if row], separator
    except csv.Error as exc:
        raise BnnZooError(f"{path} is not a readable CSV table ({exc}); check its quoting") from None


def _text(path: Path, data: bytes) -> str:
    """The file's text: UTF-16 by its byte-order mark, else UTF-8 (a mark dropped); binary refused."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding = "utf-16"
    elif b"\0" in data[:65536]:
        raise BnnZooError(
            f"{path} is not a text table (it holds NUL bytes: a binary file, or UTF-16 without a byte-order mark); "
            "give a CSV saved as UTF-8, or an .npz"
        )
    else:
        encoding = "utf-8-sig"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise BnnZooError(
            f"{path} is not {encoding.removesuffix('-sig').upper()} text (byte {exc.start} cannot be read); save it "
            "as CSV UTF-8, or give an .npz"
        ) from None


def _separator(lines: list[str]) -> str:
    """',', ';' or tab: the one that splits the first rows into the same number of cells, the most of them
    (',' for a single column)."""
    best, cells = ",", 1
    for separator in SEPARATORS:
        widths = {len(row) for row in csv.reader(lines, delimiter=separator) if row}
        if len(widths) == 1 and (width := widths.pop()) > cells:
            best, cells = separator, width
    return best


def _check_unique(names: list[str], path: Path) -> None:
    repeated = sorted(n for n, count in collections.Counter(names).items() if count > 1)
    if repeated:
        where = "; ".join(
            f"{n!r} is columns {', '.join(str(i) for i, m in enumerate(names) if m == n)}" for n in repeated
        )
        raise BnnZooError(f"{path}: column names repeat ({where}); rename them so that each column has one name")


def _column(target: str, names: list[str], path: Path, separator: str = "','") -> int:
    if target in names:
        return names.index(target)
    try:
        index = int(target)
    except ValueError:
        shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
        raise BnnZooError(
            f"{path} has no column {target!r}; its columns (cells separated by {separator}): {shown} "
            "(--data.target takes a name or an index)"
        ) from None
    if not -len(names) <= index < len(names):
        raise BnnZooError(f"{path} has {len(names)} columns; --data.target {index} is out of range")
    return index % len(names)


def _npz(path: Path, target: str) -> tuple[torch.Tensor, list, str]:
    with path.open("rb") as f:
        if f.read(4) != b"PK\x03\x04":  # else numpy would take it for a pickle, and refuse it as one
            raise BnnZooError(f"{path} is not an .npz file (a zip of arrays); save one with numpy.savez")
    try:
        with np.load(path, allow_pickle=False) as arrays:  # data: never unpickled
            columns = {k: arrays[k] for k in arrays.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        why = "it holds Python objects, which bnn-zoo never unpickles" if "allow_pickle" in str(exc) else str(exc)
        raise BnnZooError(
            f"{path} is not a readable .npz of numeric arrays ({why}); save it with numpy.savez"
        ) from None
    for k, a in columns.items():
        if a.dtype.kind not in "biuf" and not (k == "y" and a.dtype.kind in "U"):
            raise BnnZooError(f"{path}: array {k!r} has dtype {a.dtype}; an .npz table holds numbers")
    if {"x", "y"} <= set(columns):
        if target not in ("-1", "y"):
            raise BnnZooError(
                f"{path} holds x and y, so y is its target; --data.target {target} names a column of a CSV or of an "
                ".npz of one array per column"
            )
        x, y = columns["x"], columns["y"]
        if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
            raise BnnZooError(
                f"{path}: x must be (N, features) and y (N,), got {x.shape} and {y.shape}; the command line fits one "
                "target (several: bz.fit in Python)"
            )
        name = "y"
    else:
        names = list(columns)
        if len(names) < 2 or any(a.ndim != 1 for a in columns.values()) or len({len(a) for a in columns.values()}) > 1:
            raise BnnZooError(
                f"{path} holds arrays {', '.join(names)}; an .npz table holds x (N, features) and y (N,), or one 1-D "
                "array per column, all of one length"
            )
        name = names[_column(target, names, path)]
        y = columns.pop(name)
        x = np.stack(list(columns.values()), 1)
    bad = np.argwhere(~np.isfinite(x.astype(np.float64)))
    if len(bad):
        raise BnnZooError(f"{path}: x[{bad[0][0]}, {bad[0][1]}] is not a finite number; fix or drop that row")
    return torch.as_tensor(x, dtype=torch.float32), y.tolist(), name


def _targets(labels: list, task: str, path: Path, name: str) -> tuple[torch.Tensor, dict]:
    if task == "regression":
        try:
            y = torch.tensor([float(v) for v in labels], dtype=torch.float32)
        except ValueError:
            raise BnnZooError(f"{path}: the target {name!r} holds words; a regression needs numbers") from None
        bad = torch.nonzero(~torch.isfinite(y))
        if len(bad):
            raise BnnZooError(f"{path}: the target of data row {int(bad[0])} is not a finite number")
        return y, {}
    labels = [str(v) for v in labels]
    missing = next((i for i, v in enumerate(labels) if v.strip() in ("", "nan", "NaN")), None)
    if missing is not None:
        raise BnnZooError(f"{path}: data row {missing} has no class label")
    fractional = next((v for v in labels if _is_number(v) and not float(v).is_integer()), None)
    if fractional is not None:
        raise BnnZooError(
            f"{path}: the target {name!r} holds fractional numbers ({fractional}), not class labels; fit it with "
            "--data.task regression"
        )
    classes = sorted(set(labels), key=lambda c: (not _is_number(c), float(c) if _is_number(c) else c))
    if len(classes) < 2:
        raise BnnZooError(f"{path}: every row has the class {classes[0]!r}; a classifier needs at least two classes")
    if len(labels) < MAX_ROWS_PER_CLASS * len(classes):
        raise BnnZooError(
            f"{path}: the target {name!r} has {len(classes)} classes in {len(labels)} rows, fewer than "
            f"{MAX_ROWS_PER_CLASS} rows a class: a classifier cannot learn them; if it is a quantity, use "
            "--data.task regression (bz.fit in Python takes any labels)"
        )
    index = {c: i for i, c in enumerate(classes)}
    return torch.tensor([index[v] for v in labels]), {"labels": classes}


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


def _number(cell: str, separator: str = ",") -> float | None:
    """The cell's number, or None; in a ';'-separated file a decimal comma reads as a point (1,5 = 1.5)."""
    try:
        return float(cell)
    except ValueError:
        pass
    if separator == ";" and cell.count(",") == 1:
        try:
            return float(cell.replace(",", "."))
        except ValueError:
            return None
    return None


def _is_number(cell: str, separator: str = ",") -> bool:
    return _number(cell, separator) is not None
