"""After every fit, the fit reads its own diagnostics and says in one line what failed.

Each check gives a sentence ("" when it passed), kept in ``posterior.info`` under its key and warned of
once; ``bnn-zoo fit`` writes the same keys to metrics.json and ``bz.compare`` shows them as columns.

- ``collapse_warning``: the fit learned (almost) nothing about the inputs (:mod:`.collapse`).
- ``convergence_warning``: a Markov chain method (NUTS, HMC, ChEES, SG-MCMC) whose draws of each
  training point's log-likelihood ("f") have rank-normalised split R-hat above ``RHAT_MAX`` or bulk
  ESS under ``ESS_MIN_PER_CHAIN`` per chain (Vehtari et al. 2021), or that diverged in over
  ``DIVERGENT_MAX`` of its transitions. An ensemble reports without warning (:func:`members`): its
  draws are independent, and its members are meant to differ.
- ``band_warning``: the 90% predictive band covers a share of held-out targets outside
  [``COVERAGE_MIN``, ``COVERAGE_MAX``] beyond a calibrated band's chance (regression, :func:`band_on`).
  Held-out rows are the method's own validation rows when it has them (``bz.SVI(validation=...)``,
  SVI's dropout guide learning p, ``bz.Ensemble``, ``bz.SWAG``), and a result's test rows when it is
  scored (:func:`band_on`). The training rows cannot judge a band: a posterior's mean passes closer to
  them than to new rows (NUTS on Friedman #1 covers 99% of its training rows and 88% of new ones).

R-hat and ESS in function space rather than of the weights: a network's weights are not identified
(permuting hidden units gives the same function), so their R-hat fails for chains whose predictions agree.
"""

from __future__ import annotations

import warnings

import torch
from scipy.stats import binom

from bnn_zoo import diagnostics, methods
from bnn_zoo.errors import BnnZooError
from bnn_zoo.inference import collapse
from bnn_zoo.methods import Family

RHAT_MAX = 1.05  # the warning's; a reference posterior needs 1.01 and 4 chains (bnn_zoo.evaluation.reference)
ESS_MIN_PER_CHAIN = 100
DIVERGENT_MAX = 0.01  # share of post-warmup transitions
COVERAGE_MIN, COVERAGE_MAX = 0.75, 0.98  # of the 90% band, on held-out targets
WARNINGS = ["collapse_warning", "convergence_warning", "band_warning"]
NOMINAL = 0.90  # the band judged: the central 90% interval
SIGNIFICANCE = 0.05  # a band is judged on n held-out targets by a one-sided binomial test at this level


def held_out(x: torch.Tensor, y: torch.Tensor, fraction: float, seed: int) -> tuple[tuple, tuple | None]:
    """(training part, validation part or None): a seeded random ``fraction`` of the rows held out. The
    same rows in any units: the order depends on the seed and the row count only."""
    if not fraction:  # 0 or None (a method not resolved: it holds nothing out)
        return (x, y), None
    n_val = round(fraction * x.shape[0])
    if not 1 <= n_val < x.shape[0]:
        raise BnnZooError(f"validation={fraction} of {x.shape[0]} rows leaves no training or no validation rows")
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed)).to(x.device)
    train, val = order[n_val:], order[:n_val]
    return (x[train], y[train]), (x[val], y[val])


def check(posterior, held_out: tuple | None = None) -> None:
    """Run every check on a fitted posterior; each failure is warned of in one line and kept in
    ``posterior.info``. ``held_out`` = (x, y) in the data's units, rows the fit did not train on."""
    task = posterior.model.likelihood.task
    judged = task == "regression" and held_out is not None
    with torch.no_grad():
        found = {
            "collapse_warning": "" if task == "language-model" else collapse.diagnose(posterior, {}),
            "convergence_warning": convergence(posterior),
            "band_warning": band_on(posterior.predict(held_out[0]), held_out[1], "validation") if judged else "",
        }
    for key, sentence in found.items():
        if sentence:
            posterior.info[key] = sentence
            warnings.warn(f"this {posterior.method} fit {_VERBS[key]}: {sentence}", stacklevel=4)  # bz.fit's caller


_VERBS = {
    "collapse_warning": "collapsed",
    "convergence_warning": "has not converged",
    "band_warning": "has a band that cannot be trusted",
}


def convergence(posterior) -> str:
    """R-hat (with 2 or more chains) and bulk ESS of each training point's log-likelihood across the
    draws of a Markov chain method, and its share of divergent transitions, kept in ``posterior.info``
    (``max_rhat_function``, ``min_ess_bulk_function``, ``divergences``); a sentence when one fails."""
    family = methods.traits_of(posterior).family
    if family is Family.ENSEMBLE:
        members(posterior)
    if family is not Family.CHAINS or posterior.num_draws < 4:
        return ""
    chains, draws = posterior.num_chains, posterior.num_draws
    with torch.no_grad():
        rhat, ess = diagnostics.rhat_and_ess_bulk(posterior.log_likelihood(), rhat=chains > 1)
    ess = diagnostics.nanmin(ess)
    posterior.info["min_ess_bulk_function"] = ess
    failed = [] if ess >= ESS_MIN_PER_CHAIN * chains else [f"bulk ESS of f {ess:.0f} < {ESS_MIN_PER_CHAIN * chains}"]
    if rhat is not None:
        posterior.info["max_rhat_function"] = rhat = diagnostics.nanmax(rhat)
        failed = ([f"R-hat of f {rhat:.3f} > {RHAT_MAX}"] if not rhat <= RHAT_MAX else []) + failed
    diverging = posterior.sample_stats.get("diverging")
    if diverging is not None:
        posterior.info["divergences"] = count = int(diverging.sum())
        if count > DIVERGENT_MAX * diverging.numel():
            failed.append(f"{count} of {diverging.numel()} transitions diverged")
    if not failed:
        return ""
    return ", ".join(failed) + f" across {chains} chains of {draws} draws; {_remedy(posterior)}"


def members(posterior) -> None:
    """An ensemble's R-hat and ESS in ``posterior.info``, as a chains method's: its draws are independent,
    so ``min_ess_bulk_function`` is their count; with several members of 4 or more draws each (MultiSWAG),
    ``max_rhat_function`` is the R-hat of f across members, which measures how far the members' modes
    disagree (by design, so it is never a warning)."""
    posterior.info["min_ess_bulk_function"] = float(posterior.num_chains * posterior.num_draws)
    if posterior.num_chains > 1 and posterior.num_draws >= 4:
        with torch.no_grad():
            rhat, _ = diagnostics.rhat_and_ess_bulk(posterior.log_likelihood(), rhat=True)
        posterior.info["max_rhat_function"] = diagnostics.nanmax(rhat)


def _remedy(posterior) -> str:
    """What to try: the method's ``remedy`` trait, if it states one."""
    return getattr(methods.traits_of(posterior), "remedy", "run longer or with more chains")


def band_on(pred, y, rows: str = "test") -> str:
    """A regression's 90% band against held-out targets ``y`` in the data's units: a sentence when its
    coverage is outside [``COVERAGE_MIN``, ``COVERAGE_MAX``] and a calibrated band (covering 90%) would
    give so extreme a count with probability under ``SIGNIFICANCE`` (one-sided binomial): 20 of 20 inside
    happens to a calibrated band one time in eight and is not judged; 21 of 30, one time in 500 is."""
    pit = pred.cdf(y)
    n = pit.numel()  # every output of every row, as the coverage metrics count
    inside = int(((pit - 0.5).abs() <= NOMINAL / 2).sum())
    covered = inside / n
    too_narrow = covered < COVERAGE_MIN and binom.cdf(inside, n, NOMINAL) < SIGNIFICANCE
    too_wide = covered > COVERAGE_MAX and binom.sf(inside - 1, n, NOMINAL) < SIGNIFICANCE
    if not (too_narrow or too_wide):
        return ""
    which = "over-confident" if covered < COVERAGE_MIN else "under-confident"
    return (
        f"its 90% band covers {covered:.0%} of {n} {rows} targets ({which}; "
        f"[{COVERAGE_MIN:.0%}, {COVERAGE_MAX:.0%}] expected)"
    )
