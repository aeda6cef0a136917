"""Stochastic variational inference with any guide from the library, as a visible training loop."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pyro
import pyro.poutine as poutine
import torch
from pyro.infer import TraceMeanField_ELBO
from tqdm.auto import tqdm

from bnn_zoo import guides
from bnn_zoo.errors import BnnZooError
from bnn_zoo.io import atomic_torch_save, safe_torch_load
from bnn_zoo.posterior import Posterior


@dataclass
class SVI:
    """Fit a guide by maximising the ELBO (Trace_ELBO; closed-form KL where the guide and prior allow).

    ``num_particles`` draws are vectorised; ``batch_size`` subsamples the data plate (likelihood scaled
    by N/M); the learning rate decays geometrically to ``lr * lr_decay`` at the last step.
    ``checkpoint`` is a path written every ``checkpoint_every`` steps and on Ctrl-C; an existing one is resumed.
    ``num_draws`` guide draws are kept for prediction and the InferenceData.
    """

    guide: str = "mean-field"
    steps: int = 2000
    lr: float = 1e-2
    batch_size: int | None = None
    num_particles: int = 1
    seed: int = 0
    lr_decay: float = 1.0
    guide_options: dict = field(default_factory=dict)
    num_draws: int = 1000
    checkpoint: str | Path | None = None
    checkpoint_every: int = 500
    progress: bool = True

    name = "svi"

    def settings(self) -> dict:
        return {"method": self.name, "guide": self.guide, "steps": self.steps, "lr": self.lr, "batch_size": self.batch_size,
                "num_particles": self.num_particles, "seed": self.seed, "lr_decay": self.lr_decay,
                "guide_options": dict(self.guide_options), "num_draws": self.num_draws}

    def __post_init__(self):
        for name in ("steps", "num_particles", "num_draws", "checkpoint_every"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) > 0):
                raise BnnZooError(f"SVI {name} must be a positive integer, got {getattr(self, name)!r}")
        if not (self.lr > 0 and 0 < self.lr_decay <= 1):
            raise BnnZooError(f"SVI needs lr > 0 and 0 < lr_decay <= 1, got lr={self.lr}, lr_decay={self.lr_decay}")
        if self.batch_size is not None and not (isinstance(self.batch_size, int) and 0 < self.batch_size):
            raise BnnZooError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.guide not in guides.GUIDES:
            raise BnnZooError(f"unknown guide {self.guide!r}; available guides: {', '.join(sorted(guides.GUIDES))}")

    def run(self, model, x, y) -> Posterior:
        batch_size = None if self.batch_size is None or self.batch_size >= x.shape[0] else self.batch_size
        start = time.perf_counter()
        pyro.set_rng_seed(self.seed)
        guide = guides.build(self.guide, model, model.network_init(self.seed), **self.guide_options)
        guide(x, y)  # creates the guide's parameters
        elbo = TraceMeanField_ELBO(num_particles=self.num_particles, vectorize_particles=self.num_particles > 1, max_plate_nesting=1)
        optim = torch.optim.Adam(guide.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.ExponentialLR(optim, gamma=self.lr_decay ** (1.0 / self.steps))
        losses, first, stop_reason, last_finite = [], 0, None, None
        if self.checkpoint is not None and Path(self.checkpoint).exists():
            first, losses = _resume(self.checkpoint, guide, optim, sched)
        params = list(guide.parameters())
        bar = tqdm(range(first, self.steps), desc=f"SVI {self.guide}", disable=not self.progress, initial=first, total=self.steps)
        try:
            for step in bar:
                rng = torch.get_rng_state()  # a checkpoint taken mid-step restarts this step exactly
                loss = _loss(elbo, model, guide, x, y, batch_size)
                if not torch.isfinite(loss):
                    stop_reason = f"loss became {loss.item()} at step {step}"
                    break
                optim.zero_grad()
                loss.backward()
                if not all(torch.isfinite(p.grad).all() for p in params if p.grad is not None):
                    stop_reason = f"gradient became non-finite at step {step}"
                    break
                last_finite = [p.detach().clone() for p in params]  # the state whose loss was finite
                optim.step()
                sched.step()
                losses.append(loss.item())
                if step % 50 == 0:
                    bar.set_postfix(loss=f"{loss.item():.4g}")
                if self.checkpoint is not None and (step + 1) % self.checkpoint_every == 0:
                    _save(self.checkpoint, step + 1, guide, optim, sched, losses, torch.get_rng_state())
        except KeyboardInterrupt:
            if self.checkpoint is not None:
                _save(self.checkpoint, len(losses), guide, optim, sched, losses, rng)
                print(f"interrupted: checkpoint at step {len(losses)} saved to {self.checkpoint}; run again to resume")
            raise
        if stop_reason:
            if last_finite is not None:
                with torch.no_grad():
                    for p, good in zip(params, last_finite):
                        p.copy_(good)
            warnings.warn(f"SVI stopped early: {stop_reason}; kept the last parameters with a finite loss. "
                          "Lower the learning rate or check the prior and likelihood scales.", stacklevel=2)
        with torch.no_grad():
            samples = {k: v[None] for k, v in sample_guide(guide, model, self.num_draws, x, y).items()}
        return Posterior(model, x, y, samples, self.settings(), sample_stats={"loss": torch.tensor(losses)},
                         guide=guide, runtime_s=time.perf_counter() - start, info={"stop_reason": stop_reason or ""})


def _loss(elbo, model, guide, *args):
    try:
        return elbo.differentiable_loss(model, guide, *args)
    except ValueError as exc:
        # torch.distributions refuses NaN parameters before a loss exists: the same failure as a NaN loss
        if "invalid values" in str(exc) or "Expected parameter" in str(exc):
            return torch.tensor(float("nan"))
        raise


def sample_guide(guide, model, num_samples: int, *args) -> dict[str, torch.Tensor]:
    """``num_samples`` joint draws of the model's latent sites from ``guide``, vectorised: (S, *event)."""
    with pyro.plate("_draws", num_samples, dim=-2):
        tr = poutine.trace(guide).get_trace(*args)
    shapes = model.latent_shapes()
    return {k: tr.nodes[k]["value"].reshape(num_samples, *shapes[k]) for k in shapes}


def log_weights(guide, model, x, y, num_samples: int, chunk: int = 256) -> torch.Tensor:
    """log p(y, w_s | x) - log q(w_s) for ``num_samples`` draws w_s ~ q, on the full data: shape (S,)."""
    out = []
    for size in [chunk] * (num_samples // chunk) + ([num_samples % chunk] if num_samples % chunk else []):
        with pyro.plate("_draws", size, dim=-2):
            guide_tr = poutine.trace(guide).get_trace(x, y)
            model_tr = poutine.trace(poutine.replay(model, trace=guide_tr)).get_trace(x, y)
        out.append(_per_draw_log_prob(model_tr, size) - _per_draw_log_prob(guide_tr, size))
    return torch.cat(out)


def _per_draw_log_prob(trace, size):
    trace.compute_log_prob()
    total = 0.0
    for site in trace.nodes.values():
        if site["type"] == "sample" and "log_prob" in site:
            total = total + site["log_prob"].expand(size, *site["log_prob"].shape[1:]).reshape(size, -1).sum(-1)
    return total


def _save(path, step, guide, optim, sched, losses, rng):
    atomic_torch_save({"step": step, "guide": guide.state_dict(), "optim": optim.state_dict(), "sched": sched.state_dict(),
                       "losses": torch.tensor(losses), "rng": rng}, path)


def _resume(path, guide, optim, sched):
    state = safe_torch_load(path)
    try:
        guide.load_state_dict(state["guide"])
        optim.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
    except (KeyError, RuntimeError, ValueError) as exc:
        raise BnnZooError(f"checkpoint {path} does not match this model and guide ({str(exc).splitlines()[0]}); "
                          "delete it or point SVI(checkpoint=...) elsewhere") from None
    torch.set_rng_state(state["rng"])
    return int(state["step"]), state["losses"].tolist()


