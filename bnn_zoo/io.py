"""Files: written atomically (temp file + rename), read back with clear errors, never unpickled unsafely."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from bnn_zoo.errors import BnnZooError


def bar_disabled(progress: bool) -> bool:
    """Whether a progress bar stays off: when not asked for, and when stderr is not a terminal, so logs
    and CI output are not flooded with carriage-return updates."""
    return not (progress and sys.stderr.isatty())


def atomic_write(path, write):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_torch_save(obj, path):
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def safe_torch_load(path, what: str = "checkpoint"):
    """torch.load with weights_only=True: tensors and plain containers only, no arbitrary unpickling."""
    if not Path(path).is_file():
        raise BnnZooError(f"{what} {path} does not exist")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises several types for truncated or foreign files
        fix = "delete it to start afresh" if what == "checkpoint" else "the folder is corrupt; save it again"
        raise BnnZooError(f"{what} {path} is unreadable ({type(exc).__name__}); {fix}") from None


def write_json(obj, path):
    def write(tmp):
        with open(tmp, "w") as fh:
            json.dump(obj, fh, indent=2, sort_keys=True)
            fh.write("\n")

    atomic_write(path, write)


def write_yaml(obj, path):
    import yaml

    atomic_write(path, lambda tmp: Path(tmp).write_text(yaml.safe_dump(obj, sort_keys=False)))


def read_yaml(path, what: str = "config"):
    """A YAML file's content, by yaml.safe_load (plain data only, no object construction)."""
    import yaml

    if not Path(path).is_file():
        raise BnnZooError(f"{what} {path} does not exist")
    try:
        return yaml.safe_load(Path(path).read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise BnnZooError(f"{what} {path} is not valid YAML ({str(exc).splitlines()[0]})") from None


def save_inference_data(idata, path):
    """Write an InferenceData to netCDF atomically (a crash never leaves a half-written result)."""
    atomic_write(path, lambda tmp: idata.to_netcdf(tmp, engine="h5netcdf"))


def save_dataset(ds, path):
    """Write an xarray Dataset to netCDF atomically."""
    atomic_write(path, lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf"))


def load_inference_data(path):
    """Read a bnn-zoo result file, or say plainly why it cannot be read."""
    import arviz as az

    path = Path(path)
    if not path.is_file():
        raise BnnZooError(f"result file {path} does not exist; run `bnn-zoo fit ... --out DIR` first")
    try:
        idata = az.from_netcdf(path, engine="h5netcdf")
    except Exception as exc:
        raise BnnZooError(f"{path} is not a readable netCDF result ({type(exc).__name__}); the file is truncated or corrupt, re-run the fit") from None
    if "posterior" not in idata.groups():
        raise BnnZooError(f"{path} has no posterior group; it is not a bnn-zoo result file")
    return idata
