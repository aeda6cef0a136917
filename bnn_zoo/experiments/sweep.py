"""Sweeps: many runs from one file, each a cell keyed by the hash of its config, run by a local process
pool or by Ray, resumable after any interruption.

A sweep file (YAML) names a base run config and axes over its fields::

    base: {data: {class_path: UCI, init_args: {path: data/uci/yacht}}, guide: dropout}
    grid: {data.split: range(20), seed: [0, 1]}           # every combination
    zip: {inference: [svi, nuts], evaluation.evidence: [[iw], [ais]]}   # in step with each other
    select:                                                 # optional: a nested protocol per cell
      grid: {guide.p: [0.01, 0.05], likelihood.precision: [0.5, 1.0]}
      set: {data.part: validation}                          # the inner runs score a validation part
      metric: test_log_likelihood
      mode: max                                             # the best inner values, then the cell runs

A dotted field (``guide.p``) reaches into the chosen class's options; a kind set to a registered name
(``inference: nuts``) chooses that class with its defaults. Without ``select`` the grid x zip cells
run once; with it, every cell first runs its inner grid (with ``set``) and then itself with the
inner values that scored best.

Every cell writes into DIR/cells/KEY/: the run's result files, cell.json (its labels) and, last,
status.json (done or failed, with the error). Finished cells are skipped on a re-run; a cell that
was running when the sweep died starts again (from its checkpoint, where the method keeps one).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import json
import math
import os
import shutil
import socket
import threading
import time
import traceback
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bnn_zoo import resources
from bnn_zoo.errors import BnnZooError, ResourceError
from bnn_zoo.experiments import config as cfg
from bnn_zoo.inference import lockstep
from bnn_zoo.io import announce, fingerprint, read_json_mapping, read_yaml, write_json, write_yaml

TOP_LEVEL = {"base", "grid", "zip", "select", "name"}
MAX_CELLS = 1000  # a sweep's default limit: each cell is a fit and a folder (--max-cells raises it)
MAX_AXIS = 10**6  # values in one range(...) axis: past this the list alone takes a large share of memory
STATES = ("done", "running", "failed", "pending")


@dataclass
class Select:
    """The inner grid of a nested protocol: values chosen per cell by the best inner score."""

    grid: dict[str, list]
    set: dict = field(default_factory=dict)
    metric: str = "test_log_likelihood"
    mode: str = "max"


@dataclass
class Cell:
    """One run of a sweep: its config (plain data), the overrides that made it, its key and labels."""

    config: dict
    overrides: dict
    key: str
    labels: dict
    stage: str = "final"  # "select" for the inner runs of a nested protocol
    parent: str | None = None  # the outer cell a selection run belongs to
    batch: str = ""  # cells with equal batch keys may share a lockstep batch


@dataclass
class Sweep:
    base: dict
    grid: dict[str, list] = field(default_factory=dict)
    zip: dict[str, list] = field(default_factory=dict)
    select: Select | None = None
    name: str = "sweep"
    lockstep: bool = True  # SVI cells the batched engine can fit are fitted by it (together where they share a batch)
    _templates: dict = field(default_factory=dict, repr=False, compare=False)  # parsed base configs by class choices

    @classmethod
    def from_file(cls, path, trusted: Iterable[str] = ()) -> Sweep:
        """The sweep a YAML file describes. The file (and a base config file it names) may name only the
        zoo's own classes and those in ``trusted`` (``pkg.mod:Class``): reading it imports nothing else."""
        data = read_yaml(path, "sweep file")
        if isinstance(data, dict) and isinstance(data.get("base"), str):
            data = data | {"base": read_yaml(Path(path).parent / data["base"], "base run config")}
        fix = "pass --trust {} to bnn-zoo sweep (Sweep.from_file(..., trusted=[...]) in Python)"
        cfg.check_classes(data, {t.replace(":", ".") for t in trusted}, f"sweep file {path}", fix)
        return cls.from_dict(data, Path(path).parent)

    @classmethod
    def from_dict(cls, data: dict, root: Path = Path(".")) -> Sweep:
        if not isinstance(data, dict) or "base" not in data:
            raise BnnZooError("a sweep file is a mapping with a base run config and axes: base, grid, zip, select")
        unknown = set(data) - TOP_LEVEL
        if unknown:
            raise BnnZooError(
                f"unknown sweep key(s) {', '.join(sorted(unknown))}; a sweep file has {', '.join(sorted(TOP_LEVEL))}"
            )
        base = data["base"]
        if isinstance(base, str):  # a run config file, relative to the sweep file
            base = read_yaml(root / base, "base run config")
        select = data.get("select")
        if select is not None:
            if not isinstance(select, dict) or "grid" not in select or set(select) - {"grid", "set", "metric", "mode"}:
                raise BnnZooError(
                    "select takes grid (the inner axes), set (inner overrides), metric and mode (max or min)"
                )
            select = Select(_axes(select["grid"], "select.grid"), **{k: v for k, v in select.items() if k != "grid"})
            if select.mode not in ("max", "min"):
                raise BnnZooError(f"select.mode is max or min, got {select.mode!r}")
        sweep = cls(
            base or {},
            _axes(data.get("grid"), "grid"),
            _axes(data.get("zip"), "zip"),
            select,
            data.get("name", "sweep"),
        )
        lengths = {len(v) for v in sweep.zip.values()}
        if len(lengths) > 1:
            raise BnnZooError(f"the zip axes must have equal lengths, got {sorted(lengths)}")
        inner = [*select.set, *select.grid] if select is not None else []
        _check_order([*sweep.grid, *sweep.zip, *inner])
        return sweep

    def size(self) -> int:
        """How many cells the sweep runs, selection runs included, counted without making them."""
        outer = math.prod(len(v) for v in self.grid.values())
        outer *= len(next(iter(self.zip.values()))) if self.zip else 1
        inner = math.prod(len(v) for v in self.select.grid.values()) if self.select is not None else 0
        return outer * (1 + inner)

    def outer(self) -> list[dict]:
        """The overrides of every cell: the grid's product times the zipped axes."""
        grid = [dict(zip(self.grid, values)) for values in itertools.product(*self.grid.values())]
        zipped = [dict(zip(self.zip, values)) for values in zip(*self.zip.values())] or [{}]
        return [g | z for g in grid for z in zipped]

    def inner(self, overrides: dict) -> list[dict]:
        sel = self.select
        return [overrides | sel.set | dict(zip(sel.grid, values)) for values in itertools.product(*sel.grid.values())]

    def cell(self, overrides: dict, stage: str = "final", parent: str | None = None) -> Cell:
        config = copy.deepcopy(self.base)
        for path, value in overrides.items():
            override(config, path, value)
        run = self._checked(overrides) or cfg.from_dict(config)  # checked now: a bad axis fails before anything runs
        if (
            self.lockstep and run.lockstep_ready() and not run.inference.lockstep
        ):  # recorded in the cell's config: a re-run matches
            override(config, "inference.lockstep", True)
            run = dataclasses.replace(run, inference=dataclasses.replace(run.inference, lockstep=True))
        axes = {k: _plain(v) for k, v in overrides.items() if k not in ("data", "model", "inference", "seed")}
        return Cell(
            config, overrides, cfg.config_hash(run), axes | labels(run), stage, parent, _batch_key(cfg.to_dict(run))
        )

    def _checked(self, overrides: dict) -> cfg.RunConfig | None:
        """The cell's RunConfig by the quick route: the base with its class-choosing overrides, parsed
        once per distinct choice, and the scalar overrides set on it field by field (type-checked
        against the field's annotation, as the parser would). None where a value needs the parser."""
        scalars = {p: v for p, v in overrides.items() if _scalar(p, v)}
        chosen = json.dumps({p: v for p, v in overrides.items() if p not in scalars}, sort_keys=True, default=str)
        run = self._template(chosen)
        for path, value in scalars.items():
            run = run and _with_field(run, path.split("."), value)
        return run and run.check()

    def _template(self, chosen: str) -> cfg.RunConfig:
        if chosen not in self._templates:
            config = copy.deepcopy(self.base)
            for path, value in json.loads(chosen).items():
                override(config, path, value)
            self._templates[chosen] = cfg.from_dict(config)
        return self._templates[chosen]


def _scalar(path: str, value) -> bool:
    return isinstance(value, int | float | str) and "." in path or path == "seed"


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _with_field(obj, parts: list[str], value):
    """``obj`` (a config dataclass) with the dotted field set to a plain value of its annotated type
    (an int where a float is annotated becomes a float, as in the parser), or None if unsure."""
    name, *rest = parts
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
    if name not in fields:
        return None
    if rest:
        child = _with_field(getattr(obj, name), rest, value)
        return child and dataclasses.replace(obj, **{name: child})
    hint = _hints(type(obj))[name]
    kinds = (
        set(typing.get_args(hint)) - {type(None)}
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else {hint}
    )
    if type(value) in kinds & {int, float, str, bool}:
        return dataclasses.replace(obj, **{name: value})
    if type(value) is int and float in kinds and int not in kinds:
        return dataclasses.replace(obj, **{name: float(value)})
    return None


def _check_order(paths: list[str]) -> None:
    """Overrides apply in order, and one that sets a whole field (``data``) replaces what an earlier
    one set inside it (``data.split``): every cell would silently get the field's default there."""
    for i, later in enumerate(paths):
        for earlier in paths[:i]:
            if earlier.startswith(later + "."):
                raise BnnZooError(
                    f"the sweep axis {later!r} replaces all of {later}, so the earlier axis {earlier!r} would be lost; "
                    f"list {later!r} first"
                )


def _axes(axes, where: str) -> dict[str, list]:
    if axes is None:
        return {}
    if not isinstance(axes, dict):
        raise BnnZooError(f"{where} maps dotted config fields to lists of values, e.g. data.split: range(20)")
    return {str(k): _values(v, f"{where}.{k}") for k, v in axes.items()}


def _values(value, where: str) -> list:
    if isinstance(value, str) and value.startswith("range(") and value.endswith(")"):
        try:
            values = range(*(int(v) for v in value[6:-1].split(",")))
        except ValueError:
            raise BnnZooError(
                f"{where}: write range(N) or range(START, STOP[, STEP]) with whole numbers, got {value!r}"
            ) from None
        if len(values) > MAX_AXIS:
            raise BnnZooError(f"{where} is {value}: {len(values):,} values, more than an axis takes ({MAX_AXIS:,})")
        return list(values)
    if not isinstance(value, list) or not value:
        raise BnnZooError(f"{where} needs a non-empty list of values or range(N), got {value!r}")
    return value


def override(config: dict, path: str, value) -> None:
    """Set the dotted field ``path`` of a config in its plain form: through each chosen class's
    init_args; a kind set to a registered name becomes that class with its defaults."""
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        child = node.get(part)
        if child is None or isinstance(child, str):  # unset, or a kind given by name: expand it to reach into it
            child = cfg.named_choice(part, child) if isinstance(child, str) else {}
            node[part] = child
        node = child.setdefault("init_args", {}) if "class_path" in child else child
    node[leaf] = (
        cfg.named_choice(leaf, value)
        if not parents and leaf in cfg.REGISTRY and isinstance(value, str)
        else copy.deepcopy(value)
    )


def labels(run: cfg.RunConfig) -> dict:
    """What a results table groups by: dataset, model, inference (with its guide) and seed."""
    data = run.data
    dataset = Path(data.path).name if getattr(data, "path", "") else data.registered_name
    model = (
        run.model.registered_name if isinstance(run.model, cfg.ModelConfig) else cfg.to_dict(run.model)["class_path"]
    )
    inference = run.inference.registered_name
    if isinstance(run.inference, cfg.GP):
        inference += f"-{run.inference.kernel}"
    elif isinstance(run.inference, cfg.SWAG) and run.inference.members > 1:
        inference = "multiswag"
    elif run.inference.takes_guide:
        guide = run.guide or run.default_guide()
        changed = [
            f"{f.name}={getattr(guide, f.name)}"
            for f in dataclasses.fields(guide)
            if getattr(guide, f.name) != f.default
        ]
        inference += f"-{guide.registered_name}" + (f"({', '.join(changed)})" if changed else "")
    return {"dataset": dataset, "model": model, "inference": inference, "seed": run.seed}


def _plain(value):
    """A label value a table can group by (lists and mappings as JSON text)."""
    return json.dumps(value) if isinstance(value, dict | list) else value


# ---------------------------------------------------------------------------- running


def run_cells(cells: list[tuple[str, dict, dict]], threads: int | None = None) -> list[dict]:
    """Run cells (folder, config, record) in this process: each cell's folder is made with its record
    (cell.json) and config (cell.yaml) as it starts, and its outcome written to status.json; cells whose
    fits can share a lockstep batch (``bnn_zoo.inference.lockstep``) are fitted together. Never raises
    for a failing run: the error and traceback are recorded and the others go on."""
    import torch

    if threads:  # this worker's share of the cores: its torch threads, and its MCMC chains' processes
        torch.set_num_threads(threads)
        os.environ[resources.CORES_VARIABLE] = str(threads)
    prepared, statuses = {}, {}
    for folder, config, record in cells:
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        write_json(record, out / "cell.json")
        write_yaml(config, out / "cell.yaml")
        write_json({"state": "running", "pid": os.getpid(), "host": socket.gethostname()}, out / "status.json")
        statuses[folder] = _attempt(out, functools.partial(_prepare, folder, config, prepared))
    jobs = {f: lockstep.Job(p.model, *p.dataset.train, p.method) for f, p in prepared.items()}
    batches: dict[tuple, list[str]] = {}
    for folder, job in jobs.items():
        batches.setdefault(lockstep.signature(job) if prepared[folder].lockstep else ("alone", folder), []).append(
            folder
        )
    for folders in batches.values():
        fitted, checkpoint = {}, None
        if prepared[folders[0]].lockstep:
            fitted = {f: post for f in folders if (post := _load_fitted(prepared[f])) is not None}
            unfitted = [f for f in folders if f not in fitted]
            if unfitted:
                batch, checkpoint = [jobs[f] for f in unfitted], _lockstep_checkpoint(unfitted)
                device = prepared[unfitted[0]].config.device
                failure = _attempt(
                    Path(unfitted[0]), functools.partial(_lockstep, unfitted, batch, fitted, device, checkpoint)
                )
                if failure["state"] == "failed":
                    statuses.update(dict.fromkeys(unfitted, failure))
                    folders, checkpoint = list(fitted), None
        for folder in folders:  # each status is written as soon as it is known: a kill loses only what is unfinished
            statuses[folder] = _attempt(Path(folder), functools.partial(_finish, prepared[folder], fitted.get(folder)))
            write_json(statuses[folder], Path(folder) / "status.json")
        if checkpoint is not None:  # the batch was fitted: every cell is finished or failed on its own
            checkpoint.unlink(missing_ok=True)
    for folder, *_ in cells:
        if statuses[folder]["state"] == "failed":
            write_json(statuses[folder], Path(folder) / "status.json")
    return [statuses[folder] for folder, *_ in cells]


def _prepare(folder: str, config: dict, prepared: dict) -> None:
    from bnn_zoo.experiments.run import prepare

    prepared[folder] = prepare(cfg.from_dict(config), Path(folder), progress=False, resume=True)


FITTED = "fitted"  # a lockstep cell's posterior, saved between the batch's fit and the cell's scoring


def _lockstep(folders, jobs, fitted: dict, device, checkpoint: Path) -> None:
    """Fit the batch and save every fit in its cell's FITTED folder before any is scored: scoring a
    large batch takes long, and a sweep killed meanwhile scores these on its next run, not refits them."""
    from bnn_zoo.inference import lockstep

    for folder, posterior in zip(
        folders, lockstep.fit_lockstep(jobs, device=device, checkpoint=checkpoint), strict=True
    ):
        posterior.save(Path(folder) / FITTED, idata=False)
        fitted[folder] = posterior


def _load_fitted(run):
    """The cell's fit saved by an earlier, interrupted run of its lockstep batch, or None."""
    from bnn_zoo.data.validation import check_data
    from bnn_zoo.saving import load
    from bnn_zoo.scaling import scaling_for

    path = run.out / FITTED
    if not (path / "posterior.json").is_file():
        return None
    try:
        posterior = load(path, model=run.model)
    except BnnZooError:  # written partly when the run was killed: fit it again
        return None
    x, y = check_data(run.model, *run.dataset.train)
    if (posterior.scaling is None) != (scaling_for(run.model, x, y) is None):
        return None  # fitted by a bnn-zoo that kept no scaling with it: fit it again
    return posterior


def _lockstep_checkpoint(folders: list[str]) -> Path:
    """Where a lockstep batch of these cells keeps its state: the sweep's lockstep/ folder, named by the
    cells' keys, so a re-run of the same batch resumes it (a kill -9 loses at most a minute of a long batch)."""
    folder = Path(folders[0]).parent.parent / "lockstep"
    folder.mkdir(exist_ok=True)
    return folder / f"{fingerprint(sorted(Path(f).name for f in folders))}.pt"


def _finish(run, posterior=None) -> dict:
    """Fit (unless fitted in lockstep), score and save one prepared run: its done status."""
    metrics = run.evaluate(posterior or run.fit()).metrics
    shutil.rmtree(run.out / FITTED, ignore_errors=True)  # the scored result supersedes it
    return {"state": "done", "metrics": _numbers(metrics)}


def _attempt(out: Path, action) -> dict:
    """Run ``action``; a failure becomes a status with the error (its traceback in out/error.txt)."""
    try:
        return action() or {"state": "done"}
    except Exception as exc:  # a failing cell must not stop the sweep: record it
        (out / "error.txt").write_text(traceback.format_exc())
        return {"state": "failed", "error": f"{type(exc).__name__}: {exc}"}


def _numbers(metrics: dict) -> dict:
    return {
        k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def read_status(cell_dir: Path) -> dict:
    status = read_json_mapping(cell_dir / "status.json")
    if status is None or status.get("state") not in STATES or not isinstance(status.get("metrics", {}), dict):
        return {"state": "pending"}
    if (
        status.get("state") == "running"
        and status.get("host") == socket.gethostname()
        and not _alive(status.get("pid"))
    ):
        return {"state": "pending", "note": "was running when the sweep stopped"}
    return status


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


class _Executor:
    """Runs tasks (lists of cells): inline (one worker), in a local process pool, or as Ray tasks."""

    def __init__(self, workers: int = 1, use_ray: bool = False, ray_address: str | None = None, lockstep: bool = True):
        self.workers, self.use_ray, self.ray_address = max(1, workers), use_ray or ray_address is not None, ray_address
        self.lockstep = lockstep
        if ray_address is not None:
            check_reachable(ray_address)
        cores = os.cpu_count() or 1
        self.threads = max(1, cores // self.workers)  # workers must not oversubscribe the cores

    def map(self, tasks: list[list[tuple[str, dict]]], progress) -> Iterable[list[dict]]:
        if not tasks:
            return
        if self.use_ray:
            yield from self._ray(tasks, progress)
        elif self.workers == 1:
            for task in tasks:
                yield run_cells(task)
                progress(len(task))
        else:
            import concurrent.futures as cf
            import multiprocessing

            context = multiprocessing.get_context("spawn")  # fork and torch's thread pools do not mix
            with cf.ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=_exit_with, initargs=(os.getpid(),)
            ) as pool:
                futures = {pool.submit(run_cells, task, self.threads): len(task) for task in tasks}
                try:
                    for future in cf.as_completed(futures):
                        yield future.result()
                        progress(futures[future])
                except cf.process.BrokenProcessPool:
                    raise BnnZooError(
                        "a worker process died (out of memory, or killed); run the sweep again to resume"
                    ) from None
                except (
                    BaseException
                ):  # Ctrl-C, or SIGTERM (which the CLI raises as a KeyboardInterrupt): stop now, not when
                    # the running cells end, as the pool's exit would (a NUTS cell runs half an
                    # hour); they are pending again
                    pool.shutdown(wait=False, cancel_futures=True)
                    for worker in multiprocessing.active_children():
                        worker.terminate()
                    raise

    def _ray(self, tasks, progress):
        try:
            import ray
        except ImportError:
            raise BnnZooError("--ray needs Ray: pip install -e '.[distributed]'") from None
        if not ray.is_initialized():
            if self.ray_address:
                try:
                    ray.init(address=self.ray_address, log_to_driver=False)
                except ConnectionError as exc:  # something answers there, but not a Ray head
                    raise BnnZooError(
                        f"no Ray cluster at --ray-address {self.ray_address} ({exc}); check the address and port"
                    ) from None
            else:
                ray.init(num_cpus=self.workers, log_to_driver=False, include_dashboard=False)
        remote = ray.remote(num_cpus=1)(run_cells)
        pending = {remote.remote(task, 1): len(task) for task in tasks}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            yield ray.get(done[0])
            progress(pending.pop(done[0]))


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Refuse a Ray address nothing answers at, in seconds (Ray's own client retries for minutes)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise BnnZooError(f"--ray-address {address!r} is not HOST:PORT (e.g. 10.0.0.5:6379, or ray://10.0.0.5:10001)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise BnnZooError(
            f"nothing answers at --ray-address {address} ({exc.strerror or exc}); start the cluster (ray start --head) "
            "or fix the address"
        ) from None


def _exit_with(driver: int) -> None:
    """A local worker's initializer: end this worker as soon as the sweep's driver is gone (killed, or
    stopped with a signal it cannot clean up after), instead of finishing a cell nobody waits for.
    Its running cell is then pending again, as the driver's own would be."""

    def watch():
        while os.getppid() == driver:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-driver").start()


# a config's paths that may differ inside one lockstep batch: the method's own (lockstep.PER_FIT), and the
# model's data split, dropout rate and noise scale (the prior, whole, below)
PER_FIT = {f"inference.{k}" for k in lockstep.PER_FIT} | {
    "seed",
    "data.split",
    "guide.p",
    "likelihood.precision",
    "likelihood.scale",
}


def _tasks(jobs: list[tuple[str, dict]], keys: list[str], workers: int, lockstep: bool) -> list[list[tuple[str, dict]]]:
    """Cells that differ only in what a lockstep batch lets each fit have (seed, split, p, tau, prior,
    learning rate) go to one task, split into ``workers`` tasks so every worker has a share; the worker
    fits those that qualify in lockstep and the others one by one."""
    if not lockstep:
        return [[job] for job in jobs]
    groups: dict[str, list] = {}
    for job, key in zip(jobs, keys):
        groups.setdefault(key, []).append(job)
    tasks = []
    for group in groups.values():
        parts = min(workers, len(group))
        tasks += [group[i::parts] for i in range(parts)]
    return tasks


def _batch_key(plain: dict) -> str:
    """A resolved config's plain form without what may differ inside one lockstep batch."""
    plain = copy.deepcopy(plain)
    for path in PER_FIT:
        *parents, leaf = path.split(".")
        node = plain
        for part in parents:
            node = (node or {}).get(part) or {}
            node = node.get("init_args", node)
        if isinstance(node, dict):
            node.pop(leaf, None)
    plain.pop("prior", None)
    return json.dumps(plain, sort_keys=True, default=str)


def run_sweep(
    sweep: Sweep,
    out,
    workers: int = 1,
    use_ray: bool = False,
    ray_address: str | None = None,
    show_progress: bool = True,
    lockstep: bool = True,
    max_cells: int | None = None,
) -> dict:
    """Run every cell of ``sweep`` not already done under ``out``; returns counts and the failures.
    With ``lockstep``, cells that differ only per fit (seed, split, p, tau, prior, learning rate) are
    fitted together as one batched computation where their method allows it. A sweep of more than
    ``max_cells`` (default ``MAX_CELLS``) cells is refused before any is made."""
    from tqdm.auto import tqdm

    from bnn_zoo.io import bar_disabled

    max_cells = max_cells or MAX_CELLS
    if sweep.size() > max_cells:
        raise BnnZooError(
            f"the sweep {sweep.name} has {sweep.size():,} cells, more than the limit of {max_cells:,}; pass "
            f"--max-cells {sweep.size()} to run them all (each is a fit with its own folder), or shrink its axes"
        )
    check_resources(sweep)
    out = Path(out)
    sweep = dataclasses.replace(sweep, lockstep=lockstep)
    outer = _distinct([sweep.cell(o) for o in sweep.outer()])
    _check_folder(out, sweep)
    executor = _Executor(workers, use_ray, ray_address, lockstep)
    inner = [sweep.cell(i, "select", c.key) for c in outer for i in sweep.inner(c.overrides)] if sweep.select else []
    summary = {"done": 0, "skipped": 0, "failed": []}
    with tqdm(
        total=len(inner) + len(outer), desc=f"sweep {sweep.name}", unit="cell", disable=bar_disabled(show_progress)
    ) as shown:
        bar = _Progress(shown)
        if sweep.select is not None:
            selection = _run_stage(inner, out, executor, bar, summary)
            _check_metric(sweep.select.metric, selection.values())
            chosen = [_selected(sweep, c, [i for i in inner if i.parent == c.key], selection) for c in outer]
            summary["failed"] += [
                f"{c.key} ({_describe(c)}): no selection run finished" for c, f in zip(outer, chosen) if f is None
            ]
            bar.update(sum(f is None for f in chosen))
            outer = [f for f in chosen if f is not None]
        _run_stage(outer, out, executor, bar, summary)
    return summary


def _distinct(cells: list[Cell]) -> list[Cell]:
    """The cells, refused where two are one run (one key, one folder) before any runs."""
    seen: dict[str, dict] = {}
    for cell in cells:
        if cell.key in seen:
            raise BnnZooError(
                f"cells {_plain(seen[cell.key])} and {_plain(cell.overrides)} are the same run: an axis repeats a "
                f"value, or varies only {', '.join(sorted(cfg.WALL_TIME_ONLY))} (the wall time, not the result); "
                "drop the repeat"
            )
        seen[cell.key] = cell.overrides
    return cells


def check_resources(sweep: Sweep) -> None:
    """Prepare the sweep's first cell before any runs (its data loaded, its network measured): a run
    that needs more memory than the machine has fails the sweep in one line, where every cell would
    fail alike. Any other error stays the cell's own, recorded when it runs."""
    from bnn_zoo.experiments.run import prepare

    try:
        prepare(cfg.from_dict(sweep.cell(sweep.outer()[0]).config), progress=False)
    except ResourceError as exc:
        raise ResourceError(f"sweep {sweep.name}: {exc}") from None
    except BnnZooError:
        pass


class _Progress:
    """Cells done, counted here: a hidden tqdm bar (output not a terminal) counts nothing, and the
    heartbeat line reads the count."""

    def __init__(self, bar):
        self.bar, self.n, self.total = bar, 0, bar.total

    def update(self, done: int) -> None:
        self.n += done
        self.bar.update(done)


def _run_stage(cells: list[Cell], out: Path, executor: _Executor, bar: _Progress, summary) -> dict[str, dict]:
    """Run the cells not yet done; returns every cell's status by key."""
    statuses, jobs, keys = {}, [], []
    for cell in cells:
        key = cell.key
        folder = out / "cells" / key
        status = read_status(folder)
        if status["state"] == "done":
            statuses[key] = status
            summary["skipped"] += 1
            bar.update(1)
            continue
        jobs.append((str(folder), cell.config, _record(cell)))
        keys.append(cell.batch)
    _write_index(out, jobs)

    def step(done: int) -> None:
        bar.update(done)
        announce(f"running sweep cells: {bar.n} of {bar.total} done")

    step(0)
    for _ in executor.map(_tasks(jobs, keys, executor.workers, executor.lockstep), step):
        pass
    ran = {Path(folder).name for folder, *_ in jobs}
    for cell in cells:  # read back from disk: the truth whichever executor ran them
        key = cell.key
        statuses[key] = read_status(out / "cells" / key)
        if key in ran:
            if statuses[key]["state"] == "done":
                summary["done"] += 1
            else:
                summary["failed"].append(
                    f"{key} ({_describe(cell)}): {statuses[key].get('error', statuses[key]['state'])}"
                )
    return statuses


INDEX = "cells.json"  # every cell a run of the sweep made, by key: --status lists those not started yet


def _record(cell: Cell) -> dict:
    return {"key": cell.key, "stage": cell.stage, "parent": cell.parent, "labels": cell.labels}


def _write_index(out: Path, jobs: list) -> None:
    """One file naming the pending cells; their folders are made when each starts (``run_cells``)."""
    index = read_json_mapping(out / INDEX) or {}
    write_json(index | {record["key"]: record for _, _, record in jobs}, out / INDEX)


def _describe(cell: Cell) -> str:
    return ", ".join(f"{k}={v}" for k, v in cell.labels.items())


def _check_metric(metric: str, statuses) -> None:
    """Refuse a selection metric that no finished selection run reports (a typo would fail every cell)."""
    reported = {name for status in statuses for name in status.get("metrics", {})}
    if reported and metric not in reported:
        raise BnnZooError(
            f"select.metric {metric!r} is not a metric of the selection runs; they report {', '.join(sorted(reported))}"
        )


def _selected(sweep: Sweep, cell: Cell, inner: list[Cell], statuses: dict) -> Cell | None:
    """The outer cell with the inner values that scored best among its finished selection runs."""
    sel = sweep.select
    best, best_score = None, None
    for candidate in inner:
        score = statuses.get(candidate.key, {}).get("metrics", {}).get(sel.metric)
        if score is None:
            continue
        if best_score is None or (score > best_score if sel.mode == "max" else score < best_score):
            best, best_score = candidate.overrides, score
    if best is None:
        return None
    chosen = {k: best[k] for k in sel.grid}
    final = sweep.cell(cell.overrides | chosen)
    final.labels |= {f"selected:{k}": _plain(v) for k, v in chosen.items()} | {"selection_score": best_score}
    return final


def _check_folder(out: Path, sweep: Sweep) -> None:
    """A sweep folder holds one sweep: refuse to mix another one's cells into it."""
    select = None if sweep.select is None else vars(sweep.select)
    spec = {
        "name": sweep.name,
        "base": sweep.base,
        "grid": sweep.grid,
        "zip": sweep.zip,
        "select": select,
        "lockstep": sweep.lockstep,
    }
    path = out / "sweep.yaml"
    if out.exists() and not out.is_dir():
        raise BnnZooError(f"{out} is a file; give a folder for the sweep's results")
    if path.is_file() and _identity(read_yaml(path, "sweep record")) != _identity(json.loads(json.dumps(spec))):
        raise BnnZooError(
            f"{out} holds a different sweep (see its sweep.yaml); choose another --out or delete the folder"
        )
    write_yaml(json.loads(json.dumps(spec)), path)


def _identity(spec):
    """A sweep record without the options that bound only its wall time (cfg.WALL_TIME_ONLY), in a node
    or as a grid's dotted path: the same sweep run again with another time limit resumes."""
    if isinstance(spec, dict):
        return {k: _identity(v) for k, v in spec.items() if str(k).rpartition(".")[2] not in cfg.WALL_TIME_ONLY}
    return [_identity(v) for v in spec] if isinstance(spec, list) else spec


def sweep_status(out) -> dict[str, list[dict]]:
    """Every cell under ``out`` by state (done, running, failed, pending), each with its labels."""
    out = Path(out)
    if not (out / "sweep.yaml").is_file():
        raise BnnZooError(f"{out} is not a sweep folder (no sweep.yaml); run bnn-zoo sweep FILE --out {out} first")
    states: dict[str, list[dict]] = {state: [] for state in STATES}
    folders = {p.name: p for p in (out / "cells").glob("*") if p.is_dir()}
    for key, record in (read_json_mapping(out / INDEX) or {}).items():
        if key not in folders and isinstance(record, dict):
            states["pending"].append(record | {"key": key, "labels": record.get("labels") or {}})
    for folder in sorted(folders.values()):
        info = read_json_mapping(folder / "cell.json") or {}
        info = info | {"key": folder.name, "labels": info.get("labels") if isinstance(info.get("labels"), dict) else {}}
        status = read_status(folder)
        states[status["state"]].append(info | {k: v for k, v in status.items() if k in ("error", "note")})
    return states
