"""SVI objectives: Heek's KL discount (tempered posterior, exact on BLR), KL annealing, the Renyi bound."""

import math

import pytest
import torch
from conftest import NOISE, flat

import bnn_zoo as bz
from bnn_zoo.evaluation.exact import linear_regression


def _mean_field(post):
    pairs = [post.guide.loc_and_scale(k) for k in ("layers.0.weight", "layers.0.bias")]
    loc = flat({"layers.0.weight": pairs[0][0], "layers.0.bias": pairs[1][0]}).detach().double()
    scale = flat({"layers.0.weight": pairs[0][1], "layers.0.bias": pairs[1][1]}).detach().double()
    return loc, scale


def test_kl_discount_converges_to_the_tempered_posterior(blr_model, blr_data):
    # E_q[log lik] - tau KL is maximised by q ~ p(w) lik^(1/tau): Gaussian noise sigma becomes sigma sqrt(tau)
    tau = 0.25
    tempered = linear_regression(*blr_data, weight_scale=1.0, bias_scale=1.0, noise_scale=NOISE * math.sqrt(tau))
    plain = linear_regression(*blr_data, weight_scale=1.0, bias_scale=1.0, noise_scale=NOISE)
    post = bz.fit(
        blr_model,
        *blr_data,
        bz.SVI(steps=3000, lr=0.05, lr_decay=0.02, num_particles=16, kl_weight=tau, progress=False),
        standardize=False,
    )
    loc, scale = _mean_field(post)
    assert torch.all((loc - tempered.mean).abs() < 0.1 * tempered.cov.diagonal().sqrt())
    ratio = scale**2 / tempered.mean_field_variance
    assert torch.all((ratio - 1).abs() < 0.10), ratio
    assert torch.all(tempered.mean_field_variance < 0.3 * plain.mean_field_variance)  # ~tau times: distinguishable


def test_kl_annealing_scales_the_kl_term_of_the_first_steps(blr_model, blr_data):
    # same seed, same init, same draws: the first losses differ by exactly (1 - weight) * KL(q0 || prior)
    common = dict(steps=1, lr=1e-9, seed=3, progress=False, num_draws=5)
    plain = bz.fit(blr_model, *blr_data, bz.SVI(**common), standardize=False).sample_stats["loss"][0]
    warm = bz.fit(blr_model, *blr_data, bz.SVI(kl_warmup=10, **common), standardize=False).sample_stats["loss"][0]
    init = blr_model.network_init(3)
    m = torch.cat([init["layers.0.weight"].reshape(-1), init["layers.0.bias"]]).double()
    s = 1e-2  # the mean-field guide's initial scale
    kl = (-math.log(s) + (s**2 + m**2) / 2 - 0.5).sum()  # KL(N(m, s^2) || N(0, 1)) per weight
    assert (plain - warm).item() == pytest.approx((1 - 1 / 10) * kl.item(), rel=1e-4)


def test_renyi_bound_is_mass_covering(blr_model, blr_data, blr_exact):
    # alpha < 1 trades the ELBO's zero-forcing for mass covering: mean-field variances exceed the KL optimum
    # 1/Lambda_ii for every weight, and by far for the correlated pair, whose marginals are ~5x wider
    common = dict(steps=3000, lr=0.05, lr_decay=0.02, num_particles=16, seed=0, progress=False, num_draws=100)
    renyi = bz.fit(blr_model, *blr_data, bz.SVI(objective="renyi", alpha=0.0, **common), standardize=False)
    _, scale = _mean_field(renyi)
    mf = blr_exact.mean_field_variance
    assert torch.all(scale**2 > mf), (scale**2, mf)
    assert torch.all(scale[:2] ** 2 > 2 * mf[:2]), (scale**2, mf)
    with pytest.raises(bz.BnnZooError, match="Renyi objective needs num_particles >= 2"):
        bz.SVI(objective="renyi", num_particles=1)


def test_log_scale_parametrization_reaches_the_same_optimum(blr_model, blr_data, blr_exact):
    post = bz.fit(
        blr_model,
        *blr_data,
        bz.SVI(
            steps=3000,
            lr=0.05,
            lr_decay=0.02,
            num_particles=16,
            progress=False,
            guide_options={"parametrization": "log"},
        ),
        standardize=False,
    )
    _, scale = _mean_field(post)
    assert torch.all((scale**2 / blr_exact.mean_field_variance - 1).abs() < 0.10)
    raw = post.guide.scales.layers__0__bias_unconstrained
    torch.testing.assert_close(raw.exp(), post.guide.loc_and_scale("layers.0.bias")[1])  # sigma = exp(rho)


def test_svi_objective_options_from_the_command_line(tmp_path):
    import json

    from bnn_zoo.cli import main

    out = tmp_path / "renyi"
    assert (
        main(
            [
                *[
                    "fit",
                    "--model",
                    "mlp",
                    "--model.hidden",
                    "[8]",
                    "--inference",
                    "svi",
                    "--inference.steps",
                    "50",
                    "--inference.objective",
                    "renyi",
                ],
                *[
                    "--inference.alpha",
                    "0.5",
                    "--inference.num_particles",
                    "4",
                    "--inference.kl_weight",
                    "0.5",
                    "--inference.kl_warmup",
                    "20",
                ],
                *["--out", str(out), "--quiet"],
            ]
        )
        == 0
    )
    settings = json.loads((out / "metrics.json").read_text())["settings"]
    assert (settings["objective"], settings["alpha"], settings["kl_weight"], settings["kl_warmup"]) == (
        "renyi",
        0.5,
        0.5,
        20,
    )
