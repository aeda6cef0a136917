"""A regression in the user's own units through bnn_zoo.fit: fitted standardised (as the command line
does), answered in the data's units. The relations are exact (a density of y = y_mean + y_std * y_z is
p_z(y_z) / y_std), so they are checked to float tolerance against the same fit made on standardised
data by hand."""

import math
import warnings

import pytest
import torch

import bnn_zoo as bz


def _table(n=300, n_test=200, d=8, seed=0):
    """Inputs on scales from 1e-2 to 1e3 (offset by 5 sds), a target of mean 1,000 and sd 300."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-2, 3, d)
    z = torch.randn(n + n_test, d, generator=g)
    signal = torch.sin(z[:, 0]) + 0.5 * z[:, 1] * z[:, 2] + z[:, 3] - 0.5 * z[:, 4]
    y_z = signal + 0.3 * torch.randn(n + n_test, generator=g)
    x, y = z * scales + 5 * scales, 1000 + 300 * y_z / y_z.std()
    return x[:n], y[:n], x[n:], y[n:]


def _standardised(x, y):
    mx, sx, my, sy = x.mean(0), x.std(0), y.mean(), y.std()
    return (lambda v: (v - mx) / sx), (lambda v: (v - my) / sy), my, sy


def _r2(mean, y):
    return float(1 - ((mean[:, 0] - y) ** 2).mean() / y.var(unbiased=False))


ENSEMBLE = bz.Ensemble()
MODEL = bz.BNN(bz.models.MLP(8, [50], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())


@pytest.mark.parametrize(
    "method",
    # one scaling path for every method (bnn_zoo.scaling), which tests/test_conformance.py checks on every one;
    # at the defaults on a real table, mean-field here and the others in the slow lane
    [
        bz.SVI(),
        *(pytest.param(m, marks=pytest.mark.slow) for m in (bz.SVI(guide="dropout"), bz.Laplace(), bz.Ensemble())),
    ],
    ids=["mean-field", "dropout", "laplace", "ensemble"],
)
def test_a_table_in_its_own_units_fits_as_well_as_standardised(method):
    """At the defaults: within 0.05 of test R^2 of the same fit on standardised data, reported in the
    data's units; fitted as given (standardize=False), the same method is a non-fit and says so."""
    x, y, x_test, y_test = _table()
    method.progress = False
    own = bz.fit(MODEL, x, y, method)
    sx, sy, my, s = _standardised(x, y)
    by_hand = bz.fit(MODEL, sx(x), sy(y), method, standardize=False)
    r2_own, r2_hand = _r2(own.predict(x_test).mean, y_test), _r2(by_hand.predict(sx(x_test)).mean * s + my, y_test)
    assert r2_hand > 0.8 and abs(r2_own - r2_hand) < 0.05, (r2_own, r2_hand)
    if isinstance(method, bz.SVI) and method.guide == "mean-field":
        with pytest.warns(UserWarning, match="fit collapsed: the predictive mean explains"):
            raw = bz.fit(MODEL, x, y, method, standardize=False)
        assert _r2(raw.predict(x_test).mean, y_test) < 0 and "collapse_warning" in raw.info


def test_every_number_of_a_standardised_fit_is_in_the_datas_units(tmp_path):
    """Predictions, log-likelihoods, ELBO, the InferenceData and a saved-and-loaded copy, against the
    same weights fitted on standardised data by hand: y moves by y_std, log densities by -log y_std."""
    x, y, x_test, y_test = _table(n=60, n_test=20, d=5)
    model = bz.BNN(bz.models.MLP(5, [8], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian.learned())
    method = bz.SVI(steps=300, num_draws=50, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 300 steps may not fit: only the units are checked here
        own = bz.fit(model, x, y, method)
        sx, sy, my, s = _standardised(x, y)
        hand = bz.fit(model, sx(x), sy(y), method, standardize=False)
    pred, ref = own.predict(x_test), hand.predict(sx(x_test))
    assert torch.allclose(pred.mean, ref.mean * s + my, rtol=1e-5) and torch.allclose(
        pred.variance, ref.variance * s**2, rtol=1e-4
    )
    assert torch.allclose(pred.log_likelihood(y_test), ref.log_likelihood(sy(y_test)) - math.log(s), atol=1e-4)
    assert torch.allclose(own.log_likelihood(x_test, y_test), hand.log_likelihood(sx(x_test), sy(y_test)) - math.log(s))
    elbos = []
    for post in (own, hand):  # the same guide draws for both
        torch.manual_seed(0)
        elbos.append(post.elbo(num_samples=20)[0])
    assert elbos[0] == pytest.approx(elbos[1] - len(y) * math.log(s), rel=1e-5)
    idata = own.to_inference_data()
    assert torch.allclose(torch.as_tensor(idata.observed_data["y"].values).reshape(-1), y, rtol=1e-5)
    assert abs(float(idata.posterior_predictive["y"].mean()) - 1000) < 100 and "units" in idata.posterior.attrs
    own.save(tmp_path / "own")
    again = bz.load(tmp_path / "own")
    assert torch.equal(again.predict(x_test).mean, pred.mean) and again.scaling is not None


def test_laplace_and_gp_evidence_in_the_datas_units_are_the_standardised_ones_less_n_log_sd():
    x, y, _, _ = _table(n=40, n_test=1, d=5)
    sx, sy, _, s = _standardised(x, y)
    # a fixed noise is stated in the data's units: 0.5 standardised sds is 0.5 s in y's
    blr = bz.BNN(bz.models.MLP(5, [], 1), bz.priors.Normal(1.0), bz.likelihoods.Gaussian(0.5))
    blr_own = bz.BNN(blr.net, blr.prior, bz.likelihoods.Gaussian(0.5 * float(s)))
    for model, own_model, method, evidence in [
        (blr, blr_own, bz.Laplace(hessian="full", map_steps=200, progress=False), lambda p: p.info["evidence_laplace"]),
        (bz.GP("rbf"), bz.GP("rbf"), bz.TypeII(steps=50, progress=False), lambda p: p.log_marginal_likelihood()),
    ]:
        own, hand = bz.fit(own_model, x, y, method), bz.fit(model, sx(x), sy(y), method, standardize=False)
        assert evidence(own) == pytest.approx(evidence(hand) - len(y) * math.log(s), rel=1e-6)
        assert torch.allclose(
            own.predict(x[:5]).mean[:, 0], hand.predict(sx(x[:5])).mean[:, 0] * s + y.mean(), rtol=1e-4
        )
