"""Files: written atomically (temp file + rename), read back with clear errors, never unpickled unsafely.

torch is imported where a tensor is handled, so that the command line's heartbeat and ``--version``
start without it."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from bnn_zoo.errors import BnnZooError


def bar_disabled(progress: bool) -> bool:
    """Whether a progress bar stays off: when not asked for, and when stderr is not a terminal, so logs
    and CI output are not flooded with carriage-return updates."""
    return not (progress and sys.stderr.isatty())


_doing = {"what": "", "since": 0.0}


def announce(what: str) -> None:
    """Say what this process is doing now; the heartbeat (``start_heartbeat``) reports it."""
    _doing.update(what=what, since=time.monotonic())


def start_heartbeat(every: float) -> None:
    """Print what runs, one line every ``every`` seconds, to stderr: for commands whose output goes to a
    file or a pipe (CI, nohup), where progress bars stay quiet."""
    import threading

    def beat():
        while not time.sleep(every):
            if _doing["what"]:
                print(
                    f"bnn-zoo: {_doing['what']} ({_duration(time.monotonic() - _doing['since'])} so far)",
                    file=sys.stderr,
                    flush=True,
                )

    threading.Thread(target=beat, name="bnn-zoo-heartbeat", daemon=True).start()


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


TEMPORARY = ".*.tmp"  # what atomic_write writes before its rename; left behind only by a killed process


FULL = {
    errno.ENOSPC: "no space left",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file size limit (ulimit -f) is reached",
}


def atomic_write(path, write):
    """Write through a temporary file renamed into place: readers see the old file or the new one, never
    half of one. The file gets the user's normal permissions (mkstemp's are 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno in FULL:  # the old file, if any, is untouched
            raise BnnZooError(
                f"cannot write {path}: {FULL[exc.errno]} on the disk that holds {path.parent}; make room and run "
                "again (bnn-zoo fit --resume continues the run)"
            ) from None
        raise
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_temporaries(folder) -> None:
    """Delete the temporary files of writes a killed process never finished."""
    for tmp in Path(folder).glob(TEMPORARY):
        tmp.unlink(missing_ok=True)


# what makes a folder a bnn-zoo result
RESULT_MARKERS = (
    "metrics.json",
    "posterior.json",
    "checkpoint.pt",
    "config.yaml",
)
OWNER_MARK = ".bnn-zoo-result"  # written into every folder `output_folder` claims: the proof that bnn-zoo may clear it
# every file a run writes into its folder, and so all that --overwrite may delete
RESULT_FILES = frozenset(
    {
        *RESULT_MARKERS,
        OWNER_MARK,
        "posterior.nc",
        "state.pt",
        "predictions.nc",
        "ais_checkpoint.pt",
        *(f"{plot}.png" for plot in ("predictive", "loss", "energy", "trace", "rank")),
    }
)


def output_folder(path, overwrite: bool = False, resume: bool | None = False, option: str = "--out") -> Path:
    """Check a run's result folder before any work, and mark it as bnn-zoo's (``OWNER_MARK``). An
    existing run in it is kept unless ``overwrite`` (which deletes the run's files, see
    :func:`clear_result_folder`) or ``resume`` (which continues an unfinished run; None: the command
    has no --resume) says otherwise."""
    path = check_path(path, option)
    try:
        if path.is_dir():
            _lock(path, option)
        path = _claim(path, overwrite, resume, option)
        _lock(path, option)
        return path
    except OSError as exc:  # unreadable, not writable, or gone while we looked
        raise BnnZooError(
            f"cannot use {option} {path} ({exc.strerror or exc}); choose a folder you can read and write"
        ) from None


_held: dict[Path, int] = {}  # result folders this process writes, each with its locked descriptor


def _lock(path: Path, option: str) -> None:
    """Hold an exclusive lock on the folder (flock on its descriptor) until :func:`release_folders`:
    a second bnn-zoo writing into it fails at once. The kernel drops it when the process dies, kill -9
    included, so a stale lock never blocks a resume."""
    import fcntl

    key = path.resolve()
    if key in _held:
        return
    fd = os.open(key, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise BnnZooError(
            f"another bnn-zoo process is writing to {option} {path}; wait for it to finish or choose another folder"
        ) from None
    _held[key] = fd


def release_folders() -> None:
    """Let go of the folders :func:`output_folder` locked (the command that wrote them has ended)."""
    while _held:
        os.close(_held.popitem()[1])


def check_path(path, option: str = "--out") -> Path:
    """``path`` as a Path whose every name fits the filesystem's limit (else the OS raises on any look)."""
    path = Path(path)
    limit = os.pathconf(".", "PC_NAME_MAX") if hasattr(os, "pathconf") else 255
    long = next((part for part in path.parts if len(part.encode()) > limit), None)
    if long is not None:
        raise BnnZooError(
            f"{option} has a name of {len(long.encode())} bytes ({long[:20]}...); this filesystem allows {limit}"
        )
    whole = len(os.fsencode(path.absolute()))
    longest = os.pathconf(".", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096
    if whole >= longest:
        raise BnnZooError(
            f"{option} is a path of {whole} bytes ({str(path)[:20]}...); paths here are shorter than {longest}"
        )
    return path


def _claim(path: Path, overwrite, resume, option: str) -> Path:
    if path.is_dir() and any(p.name != OWNER_MARK for p in path.iterdir()):
        if not any((path / marker).exists() for marker in RESULT_MARKERS):
            raise BnnZooError(f"{option} {path} is a folder with other files in it; give a new or empty folder")
        if overwrite:
            clear_result_folder(path, option)
        elif not resume:
            ways = "--overwrite to replace it" + ("" if resume is None else " or --resume to continue it")
            raise BnnZooError(f"{option} {path} already holds a run; pass {ways}, or choose another folder")
        elif (path / "metrics.json").exists():
            raise BnnZooError(
                f"{option} {path} holds a finished run, so there is nothing to resume; pass --overwrite to fit it again"
            )
    path = writable_folder(path, option)
    atomic_write(
        path / OWNER_MARK,
        lambda tmp: Path(tmp).write_text("a bnn-zoo result folder: bnn-zoo fit --overwrite may clear it\n"),
    )
    return path


def clear_result_folder(path: Path, option: str = "--out") -> None:
    """Delete a run's files from ``path``, and nothing else. Only a folder bnn-zoo marked as its own
    (``OWNER_MARK``) that holds nothing but files a run writes (``RESULT_FILES``, temporaries) is
    cleared; any other folder raises before a file is deleted."""
    if not (path / OWNER_MARK).is_file():
        raise BnnZooError(
            f"{option} {path} has no {OWNER_MARK} file, so bnn-zoo cannot tell that it wrote this folder and "
            "--overwrite deletes nothing; remove the folder yourself or choose another"
        )
    foreign = sorted(p.name for p in path.iterdir() if not _written_by_a_run(p))
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise BnnZooError(
            f"{option} {path} holds files bnn-zoo did not write ({listed}), so --overwrite deletes nothing; move them "
            "out or choose another folder"
        )
    for p in path.iterdir():
        p.unlink()


def _written_by_a_run(p: Path) -> bool:
    return (p.is_symlink() or p.is_file()) and (p.name in RESULT_FILES or p.match(TEMPORARY))


def discard_if_unused(path: Path) -> None:
    """Remove a folder `output_folder` made for a run that then wrote nothing into it."""
    if path.is_dir() and all(p.name == OWNER_MARK for p in path.iterdir()):
        (path / OWNER_MARK).unlink(missing_ok=True)
        path.rmdir()


def writable_folder(path, option: str = "--out") -> Path:
    """``path`` as a folder this process can write (made if missing), or one error saying why not."""
    path = check_path(path, option)
    for place in (path, *path.parents):
        if place.exists() and not place.is_dir():
            where = "is a file" if place == path else f"is inside {place}, which is a file"
            raise BnnZooError(f"{option} {path} {where}; give a folder path")
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        raise BnnZooError(
            f"cannot write to {option} {path} ({exc.strerror}); choose a folder you can write to"
        ) from None
    remove_temporaries(path)
    return path


def read_json_mapping(path) -> dict | None:
    """A JSON file's mapping, or None where the file is missing, unreadable, corrupt or not a mapping
    (a folder's stray or half-written files are skipped, never trusted)."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def fingerprint(*parts) -> str:
    """A short hash of what a computation depends on: tensors by their bytes, the rest by its JSON form
    (a checkpoint stores it and refuses to resume a different fit)."""
    import torch

    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, torch.Tensor):
            h.update(str((part.dtype, tuple(part.shape))).encode())
            h.update(part.detach().cpu().contiguous().numpy().tobytes())
        else:
            h.update(json.dumps(part, sort_keys=True, default=repr).encode())
    return h.hexdigest()[:16]


def atomic_torch_save(obj, path):
    import torch

    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def safe_torch_load(path, what: str = "checkpoint"):
    """torch.load with weights_only=True: tensors and plain containers only, no arbitrary unpickling."""
    import torch

    if not Path(path).is_file():
        raise BnnZooError(f"{what} {path} does not exist")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises several types for truncated or foreign files
        fix = "delete it to start afresh" if what == "checkpoint" else "the folder is corrupt; save it again"
        raise BnnZooError(f"{what} {path} is unreadable ({type(exc).__name__}); {fix}") from None


def check_identity(saved: dict, identity: str, path, method: str) -> None:
    """Refuse to resume a checkpoint written by a different fit (its ``identity`` is :func:`fingerprint`'s)."""
    if not isinstance(saved, dict) or saved.get("identity") != identity:
        raise BnnZooError(
            f"checkpoint {path} belongs to a different fit (other data, model, guide or settings); delete it to start "
            f"afresh, or point {method}(checkpoint=...) elsewhere (bnn-zoo fit: --overwrite)"
        )


def say_resumed(path, step: int, total: int, progress: bool) -> None:
    if progress:
        print(f"resuming from checkpoint {path} at step {step} of {total}", file=sys.stderr)


def write_json(obj, path):
    """Strict JSON (what every JSON reader accepts): a NaN or infinite number is written as null."""

    def write(tmp):
        with open(tmp, "w") as fh:
            json.dump(_finite(obj), fh, indent=2, sort_keys=True, allow_nan=False)
            fh.write("\n")

    atomic_write(path, write)


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def write_yaml(obj, path):
    import yaml

    atomic_write(path, lambda tmp: Path(tmp).write_text(yaml.safe_dump(obj, sort_keys=False)))


YAML_MAX_BYTES = 1_000_000
YAML_MAX_VALUES = 100_000  # counted with aliases expanded, as every consumer sees them
YAML_MAX_DIGITS = 20  # past 2**64: no count, seed or size of bnn-zoo's is that large


def read_yaml(path, what: str = "config"):
    """A YAML file's content as plain data, bounded: at most 1 MB, at most 100,000 values with aliases
    expanded (a "billion laughs" file grows exponentially through nested aliases), integers of at
    most 20 digits, and no key twice in one mapping (YAML lets the last silently win)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise BnnZooError(f"{what} {path} does not exist")
    if path.stat().st_size > YAML_MAX_BYTES:
        raise BnnZooError(
            f"{what} {path} is {path.stat().st_size:,} bytes; bnn-zoo reads YAML files of at most {YAML_MAX_BYTES:,}"
        )
    try:
        data = yaml.load(path.read_text(), Loader=_BoundedLoader)
        if _expanded_size(data, {}) > YAML_MAX_VALUES:
            raise _Refused(
                f"it expands to more than {YAML_MAX_VALUES:,} values through its aliases (*name); write the values out"
            )
        return data
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise BnnZooError(f"{what} {path} is not valid YAML ({str(exc).splitlines()[0]})") from None
    except _Refused as exc:
        raise BnnZooError(f"{what} {path}: {exc}") from None


class _Refused(Exception):
    pass


def _expanded_size(value, sizes: dict) -> int:
    """How many values ``value`` holds once every alias is written out (shared parts counted once each)."""
    if not isinstance(value, dict | list):
        return 1
    if id(value) not in sizes:
        sizes[id(value)] = 0  # a recursive alias counts as one value, not forever
        items = value.values() if isinstance(value, dict) else value
        sizes[id(value)] = 1 + sum(_expanded_size(v, sizes) for v in items)
    return sizes[id(value)]


def _bounded_loader():
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise _Refused(
                        f"the key {key!r} appears twice in one mapping (line {key_node.start_mark.line + 1}); keep one"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node):
            if len(node.value.lstrip("+-").replace("_", "")) > YAML_MAX_DIGITS:
                raise _Refused(f"the integer on line {node.start_mark.line + 1} has more than {YAML_MAX_DIGITS} digits")
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    return Loader


_BoundedLoader = _bounded_loader()


def save_inference_data(idata, path):
    """Write an InferenceData to netCDF atomically (a crash never leaves a half-written result), in
    ArviZ's layout (``InferenceData.to_netcdf``: a group each, numbers compressed). The file is made in
    memory and written by Python: HDF5 writing to a full disk crashes the process (a segfault)."""
    import xarray as xr

    from bnn_zoo import arviz_compat

    parts = [(xr.Dataset(attrs=idata.attrs), None)] if idata.attrs else []
    groups = ((arviz_compat.group(idata, name), name) for name in arviz_compat.group_names(idata))
    _write_netcdf([*parts, *groups], path)


def save_dataset(ds, path):
    """Write an xarray Dataset to netCDF atomically (made in memory, as :func:`save_inference_data`)."""
    _write_netcdf([(ds, None)], path)


def _write_netcdf(groups, path) -> None:
    import io

    buffer = io.BytesIO()
    for i, (ds, group) in enumerate(groups):
        compressed = {name: {"zlib": True} for name, v in ds.variables.items() if v.dtype.kind in "biufcS"}
        ds.to_netcdf(buffer, mode="a" if i else "w", group=group, engine="h5netcdf", encoding=compressed)
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(buffer.getvalue()))


def load_inference_data(path):
    """Read a bnn-zoo result file as the installed ArviZ's object, or say plainly why it cannot be read."""
    from bnn_zoo import arviz_compat

    path = Path(path)
    if not path.is_file():
        raise BnnZooError(f"result file {path} does not exist; run `bnn-zoo fit ... --out DIR` first")
    try:
        idata = arviz_compat.read(path)
    except Exception as exc:
        raise BnnZooError(
            f"{path} is not a readable netCDF result ({type(exc).__name__}); the file is truncated or corrupt, re-run "
            "the fit"
        ) from None
    if "posterior" not in arviz_compat.group_names(idata):
        raise BnnZooError(f"{path} has no posterior group; it is not a bnn-zoo result file")
    return idata
