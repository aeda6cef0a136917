"""Point-estimate baselines: deep ensembles and SWAG / MultiSWAG, K networks trained as one computation.

Every member's parameters are stacked along a leading axis of K (the network's weights and the
likelihood's own sites, those in unconstrained coordinates); one forward call evaluates the K
networks on their own minibatches (``forward_draws`` or ``vmap``) and one optimiser step moves them
all. Adam and SGD act element by element, so the stacked update is each member's own. Member k
starts from ``model.network_init(member_seed(seed, k))`` and draws its minibatches from its own
stream seeded the same way: a member's trajectory does not depend on how many members run beside
it (to floating-point rounding).

Neither is written on a library: laplace-torch, ``posteriors`` and torch-uncertainty fit one network
at a time, where the zoo trains the K members as one batched computation (see docs/guide/inference.md).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.distributions import biject_to
from torch.func import functional_call, vmap

from bnn_zoo.bnn import BNN
from bnn_zoo.errors import BnnZooError, check_field_types
from bnn_zoo.inference import defaults, health
from bnn_zoo.inference.budget import STEPS_FIX, TimeLimit, check_max_hours
from bnn_zoo.inference.driver import Checkpoint, run_steps
from bnn_zoo.inference.lockstep import Stream, first_distinct
from bnn_zoo.io import fingerprint
from bnn_zoo.methods import Family, register
from bnn_zoo.posterior import Posterior
from bnn_zoo.priors import ScaleMixture
from bnn_zoo.protocols import ForwardsDraws

PHASES = ("pretrain", "collect")  # an ensemble's training, then SWAG's collection


def member_seed(seed: int, k: int) -> int:
    """The seed of member k of an ensemble seeded ``seed``: its initial weights and its minibatches."""
    return int(np.random.SeedSequence([seed, k]).generate_state(1)[0] % 2**31)


@register
@dataclass
class Ensemble:
    """Deep ensembles (Lakshminarayanan et al. 2017): K networks from random starts, each trained to its MAP.

    Each member is trained to a MAP of the model, log p(y | x, w) + log p(w), by Adam on its own
    minibatches; the posterior's draws are the K members (one chain each in the InferenceData), so its predictive
    is their mixture.

    Args:
        members: K, the networks in the ensemble.
        steps: Adam steps per member (None: 3,000, or as many as ``epochs`` make); give steps or epochs.
        epochs: passes over the training data: steps = epochs x minibatches per pass.
        lr: Adam's learning rate (constant).
        batch_size: minibatch size (None: full batch up to 1,000 rows, 128 above).
        use_prior: include the model's prior (MAP; a Normal prior is weight decay); False fits by maximum
            likelihood, as the paper does.
        adversarial: epsilon of Goodfellow et al.'s fast-gradient-sign adversarial training, as a fraction
            of each input's range in the training data (the paper's 0.01); 0 turns it off. The loss is
            the NLL at x plus the NLL at x + epsilon sign(grad_x NLL).
        validation: the fraction of the rows held out (seeded by ``seed``) and never trained on: the fitted
            band is judged on them (:mod:`bnn_zoo.inference.health`), since K point estimates cannot judge
            their own band (LOO needs more draws). 0 trains on every row; None: 0.1 from 200 rows up
            (:func:`bnn_zoo.inference.defaults.held_out_share`), 0 below.
        seed: seeds the members' initial weights and minibatches (:func:`member_seed`).
        progress: show a progress bar.
        checkpoint: a path written every ``checkpoint_every`` steps and on Ctrl-C; an existing one is resumed
            and the fit ends bit for bit where an uninterrupted one ends.
        checkpoint_every: steps between checkpoints.
        max_hours: stop with a clear error once a phase of training, projected from its pace after a minute,
            would take longer (:mod:`bnn_zoo.inference.budget`; a checkpoint is saved first); None: no limit.
    """

    # a recurrent network's prior at this method's defaults (bnn_zoo.priors.default_prior):
    # as SVI's
    recurrent_prior = ScaleMixture()

    members: int = 5
    steps: int | None = None
    epochs: int | None = None
    lr: float = 1e-2
    batch_size: int | None = None
    use_prior: bool = True
    adversarial: float = 0.0
    validation: float | None = None
    seed: int = 0
    progress: bool = True
    checkpoint: str | Path | None = None
    checkpoint_every: int = 500
    max_hours: float | None = 2.0

    name = "ensemble"
    family = Family.ENSEMBLE
    stores = "points"
    evidence = ()
    reference = False
    copies = "members"
    draws = (1, "members")
    fits = "bnn"
    quick = {"members": 3, "steps": 200}  # seconds on a small table (the conformance suite)

    def __post_init__(self):
        check_field_types(self)
        for name in ("members", "steps", "epochs", "batch_size", "checkpoint_every"):
            value = getattr(self, name)
            if not ((value is None and name != "members") or (isinstance(value, int) and value > 0)):
                raise BnnZooError(f"{type(self).__name__} {name} must be a positive whole number, got {value!r}")
        if self.steps is not None and self.epochs is not None:
            raise BnnZooError(f"give {type(self).__name__} steps or epochs, not both")
        check_max_hours(type(self).__name__, self.max_hours)
        if not (0 < self.lr < math.inf and 0 <= self.adversarial < math.inf):
            raise BnnZooError(f"need a finite lr > 0 and adversarial >= 0, got {self.lr}, {self.adversarial}")
        if self.validation is not None and not 0 <= self.validation < 1:
            raise BnnZooError(f"validation is the held-out fraction of the rows, in [0, 1); got {self.validation}")

    def split(self, x, y):
        """(training part, validation part or None): :func:`bnn_zoo.inference.health.held_out`."""
        return health.held_out(x, y, self.validation, self.seed)

    def settings(self) -> dict:
        unsettled = ("progress", "checkpoint", "checkpoint_every", "max_hours")  # they change no number
        return {"method": self.name, **{k: getattr(self, k) for k in self.__dataclass_fields__ if k not in unsettled}}

    def resolved(self, model: BNN, n: int):
        """This method with its held-out share of n rows, and its minibatch size and steps for the rows
        it trains on, filled in."""
        method = defaults.unset(self, validation=defaults.held_out_share(n))
        filled = defaults.optimisation_budget(method, method.trained_rows(n))
        return dataclasses.replace(method, **filled) if filled else method

    def trained_rows(self, n: int) -> int:
        return n - round(self.validation * n)

    def run(self, model: BNN, x: torch.Tensor, y: torch.Tensor) -> Posterior:
        method = self.resolved(model, x.shape[0])
        (x, y), _ = method.split(x, y)
        return method._run(model, x, y)

    def _run(self, model: BNN, x: torch.Tensor, y: torch.Tensor) -> Posterior:
        """The fit on the training part."""
        start = time.perf_counter()
        team = Members(model, x, y, self)
        losses, _ = team.fit()
        samples = {k: v[:, None] for k, v in team.values().items()}  # member k is chain k's one draw
        return Posterior(
            model,
            x,
            y,
            samples,
            self.settings(),
            sample_stats={"loss": losses[:, None]},  # each member's final training loss, (chain, draw)
            runtime_s=time.perf_counter() - start,
        )


@register
@dataclass
class SWAG(Ensemble):
    """SWA-Gaussian (Maddox et al. 2019), and MultiSWAG (Wilson & Izmailov 2020) with ``members`` > 1.

    Each member is first trained as an :class:`Ensemble` member; then the optimiser runs on at a constant
    learning rate, and every ``collect_every`` steps its iterate w_i is added to the running moments
    w_bar = mean w_i and w2_bar = mean w_i^2, and w_i - w_bar (at that snapshot) to a deviation matrix
    D holding the last ``rank`` of them. Draws are (Maddox et al. eq. 1)

        w = w_bar + (1/sqrt 2) diag(w2_bar - w_bar^2)^(1/2) z1 + (1 / sqrt(2 (rank - 1))) D z2,

    z1, z2 standard normal; ``num_draws`` per member, each member a chain. The fitted posterior carries
    the statistics as ``moments`` (a :class:`Moments`; a saved folder keeps the draws).

    Args:
        snapshots: iterates collected after the first training (Maddox et al. collect once an epoch).
        collect_every: SGD steps between snapshots (None: one epoch's minibatches).
        swag_lr: the constant SGD learning rate while collecting (None: ``lr``).
        momentum: the SGD momentum while collecting (m multiplies the effective step by 1 / (1 - m)).
        optimizer: ``"adam"`` iterates, or ``"sgd"`` (Maddox et al.'s constant-rate SGD, whose step must stay
            below 2 / curvature: with a learned noise sigma the curvature grows as 1 / sigma^2, so a fixed
            SGD step diverges on nearly noiseless data, where Adam's scale-free step does not).
        rank: the deviation matrix's columns (at least 2; the paper's 20).
        num_draws: draws per member kept for prediction and the InferenceData.
    """

    members: int = 1
    snapshots: int = 40
    collect_every: int | None = None
    swag_lr: float | None = None
    momentum: float = 0.0
    optimizer: Literal["adam", "sgd"] = "adam"
    rank: int = 20
    num_draws: int = 30

    name = "swag"
    quick = {"steps": 300}
    stores = "draws"
    draws = ("num_draws", "members")

    def __post_init__(self):
        super().__post_init__()
        for name in ("snapshots", "collect_every", "rank", "num_draws"):
            value = getattr(self, name)
            if not ((value is None and name == "collect_every") or (isinstance(value, int) and value > 0)):
                raise BnnZooError(f"SWAG {name} must be a positive whole number, got {value!r}")
        if self.rank < 2 or self.snapshots < 2:
            raise BnnZooError(f"SWAG needs rank >= 2 and snapshots >= 2, got {self.rank} and {self.snapshots}")
        if self.swag_lr is not None and not 0 < self.swag_lr < math.inf or not 0 <= self.momentum < 1:
            raise BnnZooError(f"SWAG needs swag_lr > 0 and 0 <= momentum < 1, got {self.swag_lr}, {self.momentum}")

    def resolved(self, model: BNN, n: int):
        method = super().resolved(model, n)
        filled = {}
        if method.collect_every is None:
            rows = method.trained_rows(n)
            filled["collect_every"] = math.ceil(rows / (method.batch_size or rows))
        if method.swag_lr is None:
            filled["swag_lr"] = method.lr
        return dataclasses.replace(method, **filled) if filled else method

    def optimiser(self, leaves) -> torch.optim.Optimizer:
        """The optimiser whose iterates are collected."""
        if self.optimizer == "adam":
            return torch.optim.Adam(leaves, lr=self.swag_lr)
        return torch.optim.SGD(leaves, lr=self.swag_lr, momentum=self.momentum)

    def _run(self, model: BNN, x: torch.Tensor, y: torch.Tensor) -> Posterior:
        start = time.perf_counter()
        team = Members(model, x, y, self)
        _, moments = team.fit(self)
        with torch.random.fork_rng(device_type="cuda"):
            torch.manual_seed(self.seed)
            draws = team.unflatten(moments.sample(self.num_draws))
        post = Posterior(
            model,
            x,
            y,
            draws,
            self.settings(),
            runtime_s=time.perf_counter() - start,
        )
        post.moments = moments
        return post


class Moments:
    """SWAG's running statistics of K members' flat iterates (K, P): first and second moments and the last
    ``rank`` deviations from the running mean (Maddox et al. 2019, sec. 3)."""

    def __init__(self, like: torch.Tensor, rank: int):
        self.count, self.rank = 0, rank
        self.mean, self.sq_mean = torch.zeros_like(like), torch.zeros_like(like)
        self.deviations: list[torch.Tensor] = []

    def add(self, w: torch.Tensor) -> None:
        w = w.detach()
        self.count += 1
        self.mean += (w - self.mean) / self.count
        self.sq_mean += (w * w - self.sq_mean) / self.count
        self.deviations = [*self.deviations, w - self.mean][-self.rank :]

    def state(self) -> dict:
        return {"count": self.count, "mean": self.mean, "sq_mean": self.sq_mean, "deviations": self.deviations}

    def restore(self, state: dict) -> None:
        self.count, self.mean, self.sq_mean = state["count"], state["mean"], state["sq_mean"]
        self.deviations = list(state["deviations"])

    @property
    def variance(self) -> torch.Tensor:
        """The diagonal covariance w2_bar - w_bar^2, clamped at zero against rounding."""
        return (self.sq_mean - self.mean**2).clamp_min(0)

    def sample(self, num_draws: int) -> torch.Tensor:
        """SWAG draws (K, num_draws, P) by eq. 1 of Maddox et al."""
        if self.count < 2:
            raise BnnZooError("SWAG needs at least 2 snapshots to form its covariance")
        dev = torch.stack(self.deviations, -1)  # (K, P, rank)
        z1 = torch.randn(num_draws, *self.mean.shape, dtype=self.mean.dtype)
        z2 = torch.randn(num_draws, self.mean.shape[0], dev.shape[-1], dtype=self.mean.dtype)
        low_rank = torch.einsum("kpr,skr->skp", dev, z2) / math.sqrt(2 * max(dev.shape[-1] - 1, 1))
        w = self.mean + self.variance.sqrt() * z1 / math.sqrt(2) + low_rank
        return w.transpose(0, 1)


class Members:
    """The K point-estimate networks of an ensemble: stacked leaves, their loss and their training."""

    def __init__(self, model: BNN, x: torch.Tensor, y: torch.Tensor, method: Ensemble):
        if model.fixed:
            raise BnnZooError(
                f"{type(method).__name__} trains whole networks; leave every parameter Bayesian (no expose/hide)"
            )
        self.model, self.x, self.y, self.method = model, x, y, method
        self.n = x.shape[0]
        self.m = method.batch_size or self.n
        seeds = [member_seed(method.seed, k) for k in range(method.members)]
        self.transforms = {k: biject_to(d.support) for k, d in model.likelihood.latent_prior().items()}
        starts = [model.network_init(s) for s in seeds]
        self.leaves = {
            k: torch.stack([t.inv(s[k]) if (t := self.transforms.get(k)) else s[k] for s in starts])
            .detach()
            .clone()
            .requires_grad_(True)
            for k in model.latent_shapes()
        }
        self.streams = [Stream(s) for s in seeds]
        self.block_states = [stream.state for stream in self.streams]  # where the current minibatch block began
        self.block_start = 0  # ... and its first step
        self.priors = {k: model.site_prior(k) for k in model.params}  # built once: a tenth of a step each
        self.epsilon = method.adversarial * (x.max(0).values - x.min(0).values) if method.adversarial else None
        self.vmaps = True  # until the network branches on its inputs' values (a token-range check)

    def values(self) -> dict[str, torch.Tensor]:
        """The members' sites in their own coordinates, (K, *shape)."""
        return {k: (t(v) if (t := self.transforms.get(k)) else v).detach() for k, v in self.leaves.items()}

    def flat(self) -> torch.Tensor:
        return torch.cat([v.detach().reshape(v.shape[0], -1) for v in self.leaves.values()], 1)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flat leaves (K, S, P) as the sites' draws (K, S, *shape), constrained."""
        sizes = [math.prod(v.shape[1:]) for v in self.leaves.values()]
        out = {}
        for (k, v), part in zip(self.leaves.items(), flat.split(sizes, -1)):
            part = part.reshape(*flat.shape[:-1], *v.shape[1:])
            out[k] = t(part) if (t := self.transforms.get(k)) else part
        return out

    def loss(self, rows: torch.Tensor) -> torch.Tensor:
        """Each member's negative log joint per training row on its minibatch ``rows`` (K, M): shape (K,)."""
        xb, yb = self.x[rows], self.y[rows]
        nll = self.nll(xb, yb)
        if self.epsilon is not None:
            xb = xb.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.nll(xb, yb).sum(), xb)
            nll = nll + self.nll(xb.detach() + self.epsilon * grad.sign(), yb)
        if not self.method.use_prior:
            return nll
        return nll - self.log_prior() / self.n

    def nll(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Mean negative log-likelihood of every member on its rows: (K,)."""
        weights = {k: self.leaves[k] for k in self.model.params}
        latent = {k: t(self.leaves[k]) for k, t in self.transforms.items()}
        return -self.model.likelihood.log_prob(self.forward(weights, xb), latent, yb).mean(-1)

    def forward(self, weights: dict, xb: torch.Tensor) -> torch.Tensor:
        net = self.model.net
        if isinstance(net, ForwardsDraws):
            return net.forward_draws(weights, xb)
        if self.vmaps:
            try:
                return vmap(lambda w, xk: functional_call(net, w, (xk,)))(weights, xb)
            except RuntimeError as exc:
                if "data-dependent control flow" not in str(exc):
                    raise
                self.vmaps = False
        members = range(xb.shape[0])
        return torch.stack([functional_call(net, {k: w[i] for k, w in weights.items()}, (xb[i],)) for i in members])

    def log_prior(self) -> torch.Tensor:
        total = sum(prior.log_prob(self.leaves[k]) for k, prior in self.priors.items())
        for k, t in self.transforms.items():
            u = self.leaves[k]
            value = t(u)
            prior = self.model.likelihood.latent_prior()[k]
            total = total + prior.log_prob(value) + t.log_abs_det_jacobian(u, value)
        return total

    def batches(self, steps: int, first: int = 0) -> Iterator[torch.Tensor]:
        """Each member's minibatch rows for steps ``first`` .. ``steps`` - 1, (K, M), from its own stream;
        a resumed run restarts the block of 16 steps drawn last, from the streams' ``block_states`` (that
        block ends at ``first`` when the run stopped between blocks)."""
        if self.m >= self.n:
            rows = torch.arange(self.n).expand(len(self.streams), self.n)
            for _ in range(first, steps):
                yield rows
            return
        block = 16
        if first:
            for stream, state in zip(self.streams, self.block_states):
                stream.state = state
        for start in range(self.block_start if first else 0, steps, block):
            self.block_states, self.block_start = [stream.state for stream in self.streams], start
            count = min(block, steps - start)
            idx = torch.stack([s.subset_candidates(self.n, self.m, count) for s in self.streams], 1)
            if idx.shape[-1] > self.m:
                idx, short = first_distinct(idx, self.m)
                for i, k in torch.nonzero(short).tolist():
                    idx[i, k] = self.streams[k].subsets(self.n, self.m, 1)[0]
            yield from idx[max(first - start, 0) :]

    def fit(self, swag: SWAG | None = None) -> tuple[torch.Tensor, Moments | None]:
        """Train every member (:class:`_Training`) in one run of the driver, checkpointed under the fit's
        identity; the last step's losses (K,) and, for SWAG, its moments."""
        method, label = self.method, f"{type(self.method).__name__} x{len(self.streams)}"
        identity = fingerprint(method.settings(), self.model.describe(), self.x, self.y)
        checkpoint = Checkpoint.at(method.checkpoint, identity, type(method).__name__, method.checkpoint_every, None)
        training = _Training(self, swag)
        limit = lambda first: TimeLimit(label, method.max_hours, training.total - first, fix=STEPS_FIX)  # noqa: E731
        run_steps(training, training.total, label, method.progress, limit, checkpoint)
        return training.losses, training.moments

    def _step(self, optimiser: torch.optim.Optimizer, rows: torch.Tensor) -> torch.Tensor:
        optimiser.zero_grad()
        loss = self.loss(rows)
        if not torch.isfinite(loss).all():
            bad = torch.nonzero(~torch.isfinite(loss)).flatten().tolist()
            raise BnnZooError(
                f"{type(self.method).__name__} member(s) {bad} reached a non-finite loss; lower lr or give the "
                "inputs a standard scale"
            )
        loss.sum().backward()
        optimiser.step()
        return loss.detach()


class _Training:
    """Every member's training as the driver's steps (:class:`~bnn_zoo.inference.driver.Stepper`): Adam for
    the method's ``steps`` (each member's MAP, or maximum likelihood), then for SWAG its optimiser for
    ``snapshots x collect_every`` steps, whose iterate joins the moments every ``collect_every``. Its state
    is the members', the optimiser's, the minibatch streams' and the moments'."""

    def __init__(self, team: Members, swag: SWAG | None):
        self.team, self.swag, self.pretrain = team, swag, team.method.steps
        self.total = self.pretrain + (swag.snapshots * swag.collect_every if swag else 0)
        self.losses, self.done = None, 0
        self._begin(collecting=False)

    def _begin(self, collecting: bool, first: int = 0) -> None:
        """A phase's optimiser, moments and minibatches, from its step ``first``."""
        team, leaves = self.team, list(self.team.leaves.values())
        self.moments = Moments(team.flat(), self.swag.rank) if collecting else None
        self.optimiser = self.swag.optimiser(leaves) if collecting else torch.optim.Adam(leaves, lr=team.method.lr)
        self.batches = team.batches(self.total - self.pretrain if collecting else self.pretrain, first)

    def step(self, i: int) -> None:
        if i == self.pretrain:
            self._begin(collecting=True)
        self.losses = self.team._step(self.optimiser, next(self.batches))
        self.done = i + 1
        if self.moments is not None and (self.done - self.pretrain) % self.swag.collect_every == 0:
            self.moments.add(self.team.flat())

    def state(self) -> dict:
        team, collecting = self.team, self.moments is not None
        return {
            "phase": PHASES[collecting],
            "step": self.done - self.pretrain if collecting else self.done,  # the phase's
            "leaves": {k: v.detach() for k, v in team.leaves.items()},
            "optimiser": self.optimiser.state_dict(),
            "streams": team.block_states,  # where the block under way began, and its first step
            "block_start": team.block_start,
            "streams_now": [stream.state for stream in team.streams],  # where the next phase's first block begins
            "moments": self.moments.state() if collecting else None,
            "losses": self.losses,
        }

    def load(self, state: dict) -> None:
        team = self.team
        if state.get("phase") not in PHASES:
            raise BnnZooError(
                f"checkpoint {team.method.checkpoint} is not an {type(team.method).__name__} checkpoint; delete it or "
                "point checkpoint= elsewhere"
            )
        with torch.no_grad():
            for k, v in team.leaves.items():
                v.copy_(state["leaves"][k])
        team.block_states, team.block_start = list(state["streams"]), int(state["block_start"])
        for stream, now in zip(team.streams, state["streams_now"]):
            stream.state = now
        collecting, first = state["phase"] == "collect", int(state["step"])
        self._begin(collecting, first)
        self.optimiser.load_state_dict(state["optimiser"])
        if collecting:
            self.moments.restore(state["moments"])
        self.losses, self.done = state["losses"], first + (self.pretrain if collecting else 0)
