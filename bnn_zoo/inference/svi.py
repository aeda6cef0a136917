"""Stochastic variational inference with any guide from the library, as a visible training loop."""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pyro
import torch
from pyro.infer import RenyiELBO, TraceMeanField_ELBO
from pyro.poutine.messenger import Messenger

from bnn_zoo import guides
from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError, check_field_types
from bnn_zoo.guides.dropout import DropoutGuide
from bnn_zoo.inference import defaults, elbo, health
from bnn_zoo.inference.budget import STEPS_FIX, TimeLimit, check_max_hours
from bnn_zoo.inference.driver import Checkpoint, run_steps
from bnn_zoo.io import fingerprint
from bnn_zoo.methods import Family, register
from bnn_zoo.models import architecture
from bnn_zoo.posterior import Posterior, Prediction
from bnn_zoo.priors import ScaleMixture
from bnn_zoo.variational import guide_state, parameters, sample_guide, scope


@register
@dataclass
class SVI:
    """Fit a guide by maximising the ELBO with Adam: Pyro's ``TraceMeanField_ELBO``, so the KL is closed
    form wherever the guide and prior allow (Blundell et al. 2015, eq. 1; Gal's thesis eq. 3.7).

    ``kl_weight`` is Heek's KL discount tau: the objective is E_q[log p(y | w)] - tau KL(q || p), whose
    optimum is the tempered posterior q ~ p(w) p(y | w)^(1 / tau). With ``validation`` > 0 the guide is
    scored every ``eval_every`` steps by the held-out log predictive density per point (Gal's eq. 3.18,
    64 draws); training stops after ``patience`` scores without improvement and the best guide is kept.

    Args:
        guide: a registered name (``"mean-field"``, ``"matrix-normal"``, ``"dropout"``, ``"flow"``), a Pyro
            ``AutoGuide`` class (built on the model, started at the network's initialisation), an
            ``AutoGuide`` instance, or any callable guide with the model's signature; None: dropout on
            recurrent networks, mean-field otherwise.
        steps: optimisation steps (None: 3,000, or as many as ``epochs`` make); give steps or epochs, not both.
        epochs: passes over the training data: steps = epochs x minibatches per pass.
        lr: Adam's learning rate.
        batch_size: minibatch size M, the likelihood scaled by N / M (None: full batch up to 1,000 training
            rows, 128 above; at least N: full batch).
        num_particles: ELBO particles per step, vectorised.
        seed: seeds Pyro's and torch's generators before the guide is built.
        lr_decay: the learning rate decays geometrically to ``lr * lr_decay`` at the last step (1 keeps it constant).
        guide_options: keyword options of a registered guide or an AutoGuide class.
        num_draws: guide draws kept for prediction and the InferenceData.
        checkpoint: a path written every ``checkpoint_every`` steps and on Ctrl-C; an existing one is resumed.
        checkpoint_every: steps between checkpoints.
        max_hours: stop with a clear error once the fit, projected from its pace after a minute, would take
            longer (:mod:`bnn_zoo.inference.budget`; a checkpoint is saved first); None: no limit.
        lockstep: fit by the batched engine (:mod:`bnn_zoo.inference.lockstep`), which fits many such fits
            as one computation; for the dropout and mean-field guides on dense networks.
        kl_weight: the KL discount tau (> 0).
        kl_warmup: steps over which the KL weight rises linearly from tau / kl_warmup to tau.
        objective: ``"elbo"``, or ``"renyi"`` for Li & Turner's Renyi bound of order ``alpha``
            (Pyro's RenyiELBO; needs >= 2 particles and a guide with a density).
        alpha: the Renyi order.
        validation: fraction of the data held out (a seeded random split) for early stopping, and on
            which the fitted band is judged (:mod:`bnn_zoo.inference.health`); 0 is off. None: 0.1 where
            the dropout guide learns p on a regression of 200 rows or more
            (:func:`bnn_zoo.inference.defaults.validation`), 0 otherwise.
        eval_every: steps between validation scores.
        patience: validation scores without improvement before stopping.
        progress: show a progress bar (quiet when the output is not a terminal).
        direct: write the ELBO out for bnn-zoo's own guides (:mod:`bnn_zoo.inference.elbo`: the same
            value and gradient as ``TraceMeanField_ELBO``, without Pyro's per-step tracing); False runs
            Pyro's ``TraceMeanField_ELBO`` itself. The two draw their randomness in another order.
    """

    # a recurrent network's prior at this method's defaults (bnn_zoo.priors.default_prior):
    # Blundell et al.'s scale mixture: under one Normal, mean-field keeps the prior on an LSTM
    recurrent_prior = ScaleMixture()

    guide: str | type | Callable | None = None
    steps: int | None = None
    epochs: int | None = None
    lr: float = 1e-2
    batch_size: int | None = None
    num_particles: int = 1
    seed: int = 0
    lr_decay: float = 0.1  # a constant rate leaves the variances noisy (docs/guide/defaults.md)
    guide_options: dict = field(default_factory=dict)
    num_draws: int = 1000
    checkpoint: str | Path | None = None
    checkpoint_every: int = 1000
    max_hours: float | None = 2.0
    lockstep: bool = False
    kl_weight: float = 1.0
    kl_warmup: int = 0
    objective: Literal["elbo", "renyi"] = "elbo"
    alpha: float = 0.5
    validation: float | None = None
    eval_every: int = 100
    patience: int = 5
    progress: bool = True
    direct: bool = True

    name = "svi"
    family = Family.VARIATIONAL
    stores = "guide"
    evidence = ("elbo",)
    reference = False
    copies = "num_particles"
    draws = ("num_draws",)
    fits = "bnn"
    quick = {"steps": 150, "num_draws": 100}  # seconds on a small table (the conformance suite)

    @property
    def guide_name(self) -> str:
        """The registered name, or ``module:QualName`` of an AutoGuide class, instance or guide function."""
        if isinstance(self.guide, str):
            return self.guide
        target = self.guide if isinstance(self.guide, type) or inspect.isfunction(self.guide) else type(self.guide)
        return f"{target.__module__}:{target.__qualname__}"

    def build_guide(self, model):
        """The guide to fit (see :func:`bnn_zoo.guides.make`), started at the network's own initialisation."""
        return guides.make(self.guide, model, model.network_init(self.seed), self.guide_options)

    def settings(self) -> dict:
        return {
            "method": self.name,
            "guide": self.guide_name,
            "guide_source": guides.source(self.guide),
            "steps": self.steps,
            "lr": self.lr,
            "batch_size": self.batch_size,
            "num_particles": self.num_particles,
            "seed": self.seed,
            "lr_decay": self.lr_decay,
            "guide_options": dict(self.guide_options),
            "num_draws": self.num_draws,
            "kl_weight": self.kl_weight,
            "kl_warmup": self.kl_warmup,
            "objective": self.objective,
            **({} if self.direct else {"direct": False}),
            **({"alpha": self.alpha} if self.objective == "renyi" else {}),
            **(
                {"validation": self.validation, "eval_every": self.eval_every, "patience": self.patience}
                if self.validation
                else {}
            ),
        }

    def __post_init__(self):
        check_field_types(self)
        for name in ("steps", "epochs", "num_particles", "num_draws", "checkpoint_every", "eval_every", "patience"):
            value = getattr(self, name)
            if not ((value is None and name in ("steps", "epochs")) or (isinstance(value, int) and value > 0)):
                raise BnnZooError(f"SVI {name} must be a positive integer, got {value!r}")
        if self.steps is not None and self.epochs is not None:
            raise BnnZooError("give SVI steps or epochs, not both")
        check_max_hours("SVI", self.max_hours)
        if not (0 < self.lr < math.inf and 0 < self.lr_decay <= 1):
            raise BnnZooError(
                f"SVI needs a finite lr > 0 and 0 < lr_decay <= 1, got lr={self.lr}, lr_decay={self.lr_decay}"
            )
        if self.batch_size is not None and not (isinstance(self.batch_size, int) and 0 < self.batch_size):
            raise BnnZooError(f"{type(self).__name__} batch_size must be a positive integer, got {self.batch_size!r}")
        if not (self.kl_weight > 0 and isinstance(self.kl_warmup, int) and self.kl_warmup >= 0):
            raise BnnZooError(
                f"SVI needs kl_weight > 0 and an integer kl_warmup >= 0, got {self.kl_weight}, {self.kl_warmup}"
            )
        if self.objective == "renyi" and (self.num_particles < 2 or self.alpha == 1):
            raise BnnZooError("the Renyi objective needs num_particles >= 2 and alpha != 1 (alpha = 1 is the ELBO)")
        if self.validation is not None and not 0 <= self.validation < 1:
            raise BnnZooError(f"validation is the held-out fraction of the data, in [0, 1); got {self.validation}")
        if self.guide is None:
            return
        if isinstance(self.guide, str) and self.guide not in guides.GUIDES:
            raise BnnZooError(f"unknown guide {self.guide!r}; available guides: {', '.join(sorted(guides.GUIDES))}")
        if not (isinstance(self.guide, str) or callable(self.guide)):
            raise BnnZooError(
                f"guide must be a registered name ({', '.join(sorted(guides.GUIDES))}), a Pyro AutoGuide class or "
                f"instance, or a callable guide; got {self.guide!r}"
            )
        guides.registry.check_options(self.guide, self.guide_options)

    def resolved(self, model, n: int) -> SVI:
        """This SVI with its defaults for ``model`` and n training rows filled in (:mod:`~bnn_zoo.inference.defaults`):
        the guide by the architecture, the minibatch size by n, the steps from epochs or 3,000, the
        held-out fraction by the guide."""
        filled = defaults.optimisation_budget(self, n)
        guide = self.guide
        if guide is None:
            filled["guide"] = guide = defaults.guide(architecture(model.net))
        if self.validation is None:
            filled["validation"] = defaults.validation(guide, self.guide_options, model.likelihood.task, n)
        return dataclasses.replace(self, **filled) if filled else self

    def run(self, model, x, y) -> Posterior:
        if (method := self.resolved(model, x.shape[0])) is not self:
            return method.run(model, x, y)
        start = time.perf_counter()
        (x, y), held_out = self.split(x, y)
        batch_size = None if self.batch_size is None or self.batch_size >= x.shape[0] else self.batch_size
        pyro.set_rng_seed(self.seed)
        point, fitted, guide, params = self._guide_and_parameters(model, x, y)
        objective = self.objective_for(fitted, guide)
        training = _Training(self, objective, fitted, guide, point, params, x, y, held_out, batch_size)
        identity = fingerprint({k: v for k, v in self.settings().items() if k != "num_draws"}, model.describe(), x, y)
        checkpoint = Checkpoint.at(self.checkpoint, identity, "SVI", self.checkpoint_every, None)
        limit = lambda first: TimeLimit("SVI", self.max_hours, self.steps - first, fix=STEPS_FIX)  # noqa: E731
        _set_training(guide, True)  # guides add per-example (local) noise in training mode only
        try:
            name, postfix = f"SVI {self.guide_name}", lambda: {"loss": f"{training.losses[-1]:.4g}"}
            first = run_steps(training, self.steps, name, self.progress, limit, checkpoint, postfix=postfix)
        finally:
            _set_training(guide, False)
        losses, best = training.losses, training.best
        stop_reason = _undo_non_finite(params, training.last_finite, training.stop_reason, len(losses))
        info = {"stop_reason": stop_reason or "", **({"resumed_at_step": first} if first else {})}
        if isinstance(guide, DropoutGuide) and guide.learned:
            info["dropout_p"] = guide.rates()
        if best is not None:
            _load_state(guide, point, best["state"])
            info.update(best_step=best["step"], best_validation_log_lik=best["score"], steps_run=len(losses))
        if point:  # the posterior carries the fitted point estimates; the user's model keeps its own
            model = model.with_fixed({k: v.detach() for k, v in point.items()})
        return posterior_from(self, model, guide, x, y, losses, time.perf_counter() - start, info)

    def _guide_and_parameters(self, model, x, y) -> tuple[dict, BNN, object, list]:
        """(the model's point estimates, the model holding them, the guide, every trained tensor), checked
        against the objective and the checkpoint."""
        point = model.point_estimates()  # non-Bayesian parameters (hide/expose), fitted with the guide
        fitted = model.with_fixed(point) if point else model
        guide = self.build_guide(fitted)
        if self.objective == "renyi" and not getattr(guide, "has_density", True):
            raise BnnZooError(
                f"the Renyi objective needs log q(w), which the {self.guide_name} guide does not have; use "
                "objective=elbo"
            )
        params = parameters(guide, x, y) + list(point.values())  # the first call also creates the guide's parameters
        if (self.checkpoint is not None or self.validation) and not isinstance(guide, torch.nn.Module):
            raise BnnZooError(
                "checkpoints and early stopping keep the guide's state_dict: use a torch-module guide (a bnn-zoo guide "
                "or a Pyro AutoGuide), not a plain function"
            )
        return point, fitted, guide, params

    def objective_for(self, model, guide):
        """What the loop maximises: the direct ELBO where it applies (``direct=True`` and a guide that
        states its site distributions; see :mod:`bnn_zoo.inference.elbo`), else Pyro's
        ``TraceMeanField_ELBO`` or ``RenyiELBO``."""
        if self.objective == "elbo" and self.direct and elbo.applies(model, guide):
            return elbo.DirectELBO(model, self.num_particles)
        particles = dict(
            num_particles=self.num_particles, vectorize_particles=self.num_particles > 1, max_plate_nesting=1
        )
        return (
            RenyiELBO(alpha=self.alpha, **particles) if self.objective == "renyi" else TraceMeanField_ELBO(**particles)
        )

    def split(self, x, y):
        """(training part, validation part or None): :func:`bnn_zoo.inference.health.held_out`."""
        return health.held_out(x, y, self.validation, self.seed)


def posterior_from(method: SVI, model, guide, x, y, losses: list[float], runtime_s: float, info: dict) -> Posterior:
    """The Posterior of a fitted guide. A guide that a saved folder rebuilds (a registered name or an
    AutoGuide class) makes its draws on demand; a user's guide instance or function keeps
    ``method.num_draws`` draws, so a loaded folder still predicts without it."""
    settings, samples = method.settings(), None
    if settings["guide_source"] == "user":
        with torch.no_grad():
            samples = {k: v[None] for k, v in sample_guide(guide, model, method.num_draws, x, y).items()}
    return Posterior(
        model,
        x,
        y,
        samples,
        settings,
        sample_stats={"loss": torch.tensor(losses)},
        guide=guide,
        runtime_s=runtime_s,
        info=info,
    )


def _undo_non_finite(params: list, last_finite: list, stop_reason: str | None, steps: int) -> str | None:
    """Why training stopped early, if it did (the last step's gradient may have made ``params`` non-finite):
    then ``params`` go back to ``last_finite``, with a warning."""
    if not stop_reason and not _finite(params):
        stop_reason = f"gradient became non-finite at step {steps - 1}"
    if stop_reason:
        with torch.no_grad():
            for p, good in zip(params, last_finite):
                p.copy_(good)
        warnings.warn(
            f"SVI stopped early: {stop_reason}; kept the last parameters with a finite loss. "
            "Lower the learning rate or check the prior and likelihood scales.",
            stacklevel=3,
        )
    return stop_reason


def _set_training(guide, mode: bool) -> None:
    if isinstance(guide, torch.nn.Module):
        guide.train(mode)


class _ScaleLatent(Messenger):
    """Scale every latent site's log density (model prior and guide alike), i.e. the KL term, by ``weight``."""

    def __init__(self, weight: float):
        super().__init__()
        self.weight = weight

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"] and self.weight != 1.0:
            msg["scale"] = msg["scale"] * self.weight


def _finite(tensors: list[torch.Tensor]) -> bool:
    # a sum is NaN or inf when some entry is (or when finite entries overflow it, which is a blow-up too)
    return bool(torch.stack([t.detach().sum() for t in tensors]).sum().isfinite())


def _loss_and_grads(objective, kl_weight: float, model, guide, *args) -> float:
    """The loss with the KL scaled by ``kl_weight``, its gradients accumulated (before the NaN check:
    a non-finite loss is never stepped)."""
    try:
        if isinstance(objective, elbo.DirectELBO):
            loss = objective.differentiable_loss(model, guide, *args, kl_weight=kl_weight)
        else:
            with warnings.catch_warnings(), _ScaleLatent(kl_weight), scope(guide):
                # Pyro checks the mean-field restriction by site order; our structured guides (matrix-normal,
                # per-layer flows) sample weight matrices before the mean-field rest but factorise across
                # sites, so each KL term is still exact and the warning would be noise.
                warnings.filterwarnings("ignore", message="Failed to verify mean field restriction")
                if isinstance(objective, RenyiELBO):  # has no differentiable_loss
                    return float(objective.loss_and_grads(model, guide, *args))
                loss = objective.differentiable_loss(model, guide, *args)
        value = loss.item()
        if math.isfinite(value):
            loss.backward()
        return value
    except ValueError as exc:
        # torch.distributions refuses NaN parameters before a loss exists: the same failure as a NaN loss
        if "invalid values" in str(exc) or "Expected parameter" in str(exc):
            return float("nan")
        raise


def validation_log_lik(guide, model, x, y, num_draws: int = 64) -> float:
    """Mean over points of log (1/S) sum_s p(y_n | x_n, w_s), w_s ~ q (Gal eq. 3.18), without touching the RNG
    stream."""
    with torch.no_grad(), torch.random.fork_rng(device_type="cuda"):
        draws = sample_guide(guide, model, num_draws, x, y)
        weights = {k: draws[k] for k in model.params}
        latent = {k: v for k, v in draws.items() if k not in weights}
        return Prediction(model.forward(weights, x), latent, model.likelihood).log_likelihood(y).mean().item()


def _state(guide, point: dict) -> dict:
    """What SVI trains: the guide's state and the point estimates, copied."""
    return {"guide": guide_state(guide), "point": {k: v.detach().clone() for k, v in point.items()}}


def _load_state(guide, point: dict, state: dict) -> None:
    guide.load_state_dict(state["guide"])
    with torch.no_grad():
        for k, v in point.items():
            v.copy_(state["point"][k])


class _Training:
    """SVI's steps as the driver runs them (:class:`~bnn_zoo.inference.driver.Stepper`): one Adam step on the
    objective, with early stopping on the held-out score; its state is the guide's and the point
    estimates', the optimiser's and the schedule's, the losses and the best guide so far."""

    def __init__(self, method: SVI, objective, model, guide, point: dict, params: list, x, y, held_out, batch_size):
        self.method, self.objective, self.model, self.guide, self.point = method, objective, model, guide, point
        self.params, self.data, self.held_out, self.batch_size = params, (x, y), held_out, batch_size
        # one kernel per step, not a few per tensor: 3x cheaper on small nets
        self.optim = torch.optim.Adam(params, lr=method.lr, fused=True)
        gamma = method.lr_decay ** (1.0 / method.steps)
        self.sched = torch.optim.lr_scheduler.ExponentialLR(self.optim, gamma=gamma)
        self.losses, self.best, self.stop_reason = [], None, None
        self.last_finite = [p.detach().clone() for p in params]  # the state whose loss was finite, copied each step

    def step(self, i: int) -> bool:
        """One Adam step; True ends training (a non-finite loss, early stopping)."""
        method, params = self.method, self.params
        weight = method.kl_weight * min(1.0, (i + 1) / method.kl_warmup) if method.kl_warmup else method.kl_weight
        for p in params:  # optim.zero_grad() does this behind a torch._disable_dynamo wrapper, ~15 us
            p.grad = None
        loss = _loss_and_grads(self.objective, weight, self.model, self.guide, *self.data, self.batch_size)
        if not math.isfinite(loss):
            # a non-finite gradient is not checked for at every step (a fifth of a small net's step): it
            # makes the parameters non-finite, so the next step's loss is, and this step is undone
            self.stop_reason = f"loss became {loss} at step {i}"
            if not _finite(params):
                self.stop_reason = f"gradient became non-finite at step {i - 1}"
            return True
        with torch.no_grad():
            torch._foreach_copy_(self.last_finite, params)  # one call, not one per tensor
        self.optim.step()
        if self.method.lr_decay != 1:  # a constant rate's schedule is a no-op, ~15 us a step
            self.sched.step()
        self.losses.append(loss)
        if self.held_out is None or (i + 1) % method.eval_every:
            return False
        score = validation_log_lik(self.guide, self.model, *self.held_out)
        if self.best is None or score > self.best["score"]:
            self.best = {"score": score, "step": i + 1, "state": _state(self.guide, self.point)}
        return i + 1 - self.best["step"] >= method.patience * method.eval_every

    def state(self) -> dict | None:
        """None once the parameters went non-finite: the last periodic checkpoint stands."""
        if not _finite(self.params):
            return None
        return {
            "fit": _state(self.guide, self.point),
            "optim": self.optim.state_dict(),
            "sched": self.sched.state_dict(),
            "losses": torch.tensor(self.losses),
            "best": self.best,
        }

    def load(self, state: dict) -> None:
        try:
            _load_state(self.guide, self.point, state["fit"])
            self.optim.load_state_dict(state["optim"])
            self.sched.load_state_dict(state["sched"])
        except (KeyError, RuntimeError, ValueError) as exc:
            raise BnnZooError(
                f"checkpoint {self.method.checkpoint} does not match this model and guide "
                f"({str(exc).splitlines()[0]}); delete it or point SVI(checkpoint=...) elsewhere"
            ) from None
        self.losses, self.best = state["losses"].tolist(), state.get("best")
        with torch.no_grad():
            torch._foreach_copy_(self.last_finite, self.params)


def svi_start(model, x, y, seed: int, progress: bool) -> Posterior:
    """The fit chains start from with ``init="svi"``: mean-field, 2,000 steps at lr 0.02 with 4 particles."""
    return SVI(guide="mean-field", steps=2000, lr=0.02, num_particles=4, seed=seed, progress=progress).run(model, x, y)
