"""Calibration and uncertainty measures against hand-computed cases and synthetic predictors with known calibration."""

import math

import pytest
import torch

from bnn_zoo import BnnZooError, Prediction
from bnn_zoo.evaluation import calibration, classification_metrics, regression_metrics, uncertainty
from bnn_zoo.likelihoods import Categorical, Gaussian
from bnn_zoo.scaling import Scaling


def test_brier_mce_and_expected_accuracy_by_hand():
    probs = torch.tensor([[0.6, 0.4], [0.1, 0.9]])
    y = torch.tensor([0, 0])  # confidence 0.6 right, 0.9 wrong
    assert calibration.brier_score(probs, y) == pytest.approx((0.16 + 0.16 + 0.81 + 0.81) / 2)
    assert calibration.maximum_calibration_error(probs, y) == pytest.approx(0.9)
    assert calibration.expected_calibration_error(probs, y) == pytest.approx((0.4 + 0.9) / 2)
    assert calibration.expected_accuracy(probs) == pytest.approx(0.75)


def test_calibration_bins_eqs_3_3_to_3_5_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4]])
    bins = calibration.calibration_bins(probs, torch.tensor([0, 1]), bins=2)
    # [0, 0.5): p = 0.1 (false), 0.4 (true); [0.5, 1]: p = 0.9 (true), 0.6 (false)
    assert bins.count.tolist() == [2, 2]
    assert bins.observed.tolist() == pytest.approx([0.5, 0.5])
    assert bins.expected.tolist() == pytest.approx([0.25, 0.75])
    assert bins.variance.tolist() == pytest.approx([(0.09 + 0.24) / 4] * 2)


def _synthetic(n, overconfident: bool, seed=0):
    """Three-class predictions whose labels are drawn from the stated probabilities (calibrated), or
    from flattened ones while the stated probabilities are sharpened (overconfident)."""
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(n, 3, generator=g, dtype=torch.float64)
    truth = torch.softmax(logits, -1)
    y = torch.multinomial(truth, 1, generator=g)[:, 0]
    return (torch.softmax(3 * logits, -1) if overconfident else truth), y


def test_ece_and_bins_separate_calibrated_from_overconfident():
    probs, y = _synthetic(20000, overconfident=False)
    assert calibration.expected_calibration_error(probs, y) < 0.015  # MC error ~ sqrt(p(1-p)/n_b) per bin
    assert not calibration.calibration_bins(probs, y).significant(z=3.5).any()
    assert abs(calibration.expected_accuracy(probs) - (probs.argmax(-1) == y).double().mean().item()) < 0.01
    over, y = _synthetic(20000, overconfident=True)
    assert calibration.expected_calibration_error(over, y) > 0.1
    assert calibration.calibration_bins(over, y).significant(z=3.5).sum() >= 5
    assert calibration.expected_accuracy(over) > (over.argmax(-1) == y).double().mean().item() + 0.1


def test_calibration_roc_eqs_3_6_and_3_7_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    roc = calibration.calibration_roc(probs, torch.tensor([0, 0, 0]), thresholds=torch.tensor([0.7]))
    # top-class confidences 0.9 (right), 0.8 (wrong), 0.6 (right): above 0.7 are the first two
    assert roc.tpr.item() == pytest.approx(1 / 2) and roc.fpr.item() == pytest.approx(1.0)
    assert roc.expected_tpr.item() == pytest.approx((0.9 + 0.8) / 2)
    assert roc.expected_fpr.item() == pytest.approx(0.1 + 0.2)


def test_calibration_roc_matches_its_expectation_when_calibrated():
    probs, y = _synthetic(20000, overconfident=False, seed=1)
    roc = calibration.calibration_roc(probs, y, thresholds=11)
    assert (roc.tpr - roc.expected_tpr).abs().max() < 0.02
    assert (roc.fpr - roc.expected_fpr).abs().max() < 0.03
    over, y = _synthetic(20000, overconfident=True, seed=1)
    roc = calibration.calibration_roc(over, y, thresholds=11)
    assert (roc.expected_fpr - roc.fpr)[1:10].min() < -0.1  # more false positives than it expects


def test_selective_prediction_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.45, 0.55]])
    curve = calibration.selective_prediction(probs, torch.tensor([0, 0, 0, 0]))
    assert curve.coverage.tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert curve.accuracy.tolist() == pytest.approx([1, 1 / 2, 2 / 3, 1 / 2])
    assert curve.accuracy_at(0.5) == pytest.approx(0.5)
    by_entropy = calibration.selective_prediction(
        probs, torch.tensor([0, 0, 0, 0]), uncertainty=torch.tensor([0.0, 3.0, 1.0, 2.0])
    )
    assert by_entropy.accuracy.tolist() == pytest.approx([1, 1, 2 / 3, 1 / 2])


@pytest.mark.parametrize(
    "draws, entropy, mi",
    [
        ([[1.0, 0.0]] * 4, 0.0, 0.0),  # every draw certain of class 0
        ([[0.5, 0.5]] * 4, math.log(2), 0.0),  # every draw undecided: all uncertainty is noise
        ([[1.0, 0.0]] * 2 + [[0.0, 1.0]] * 2, math.log(2), math.log(2)),  # confident draws that disagree: all model
    ],
)
def test_gals_three_entropy_and_mutual_information_examples(draws, entropy, mi):
    p = torch.tensor(draws)[:, None, :]  # (S, N=1, C)
    assert uncertainty.predictive_entropy(p).item() == pytest.approx(entropy, abs=1e-7)
    assert uncertainty.mutual_information(p).item() == pytest.approx(mi, abs=1e-7)


def test_variation_ratio_by_hand():
    p = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])[:, None, :]
    assert uncertainty.variation_ratio(p).item() == pytest.approx(1 - 3 / 4)


def test_classification_metrics_use_every_draw():
    logits = torch.log(torch.tensor([[[1.0, 0.0 + 1e-12]], [[1e-12, 1.0]]]))  # two draws, one point, disagreeing
    out = classification_metrics(Prediction(logits, {}, Categorical()), torch.tensor([0]))
    assert out["mutual_information"] == pytest.approx(math.log(2), abs=1e-6)
    assert out["expected_accuracy"] == pytest.approx(0.5) and out["brier"] == pytest.approx(0.5)


def test_regression_coverage_and_variance_split():
    # A hand case: draws f = 0 and 2 with noise sd 1 at y = 1 put y at the predictive median
    pred = Prediction(torch.tensor([[[0.0]], [[2.0]]]), {}, Gaussian(1.0))
    assert pred.cdf(torch.tensor([[1.0]])).item() == pytest.approx(0.5)
    doubled = Prediction(
        pred.f, {}, Gaussian(1.0), Scaling(torch.zeros(1), torch.ones(1), torch.zeros(1), 2 * torch.ones(1))
    )
    out = regression_metrics(doubled, torch.tensor([[2.0]]))  # the same predictive in units of half the size
    assert out["noise_variance"] == pytest.approx(4.0) and out["model_variance"] == pytest.approx(4.0)
    assert out["test_log_likelihood"] == pytest.approx(
        regression_metrics(pred, torch.tensor([[1.0]]))["test_log_likelihood"] - math.log(2)
    )
    # A calibrated predictive: coverage matches the nominal level within Monte Carlo error (sd < 0.004)
    g = torch.Generator().manual_seed(0)
    y = 2 * torch.randn(20000, 1, generator=g)
    f = torch.randn(50, 1, 1, generator=g).expand(50, 20000, 1)  # a mixture of N(f_s, 1) whose CDF is not Gaussian's
    out = regression_metrics(Prediction(torch.zeros_like(f), {}, Gaussian(2.0)), y)
    for c in (50, 90, 95):
        assert out[f"coverage_{c}"] == pytest.approx(c / 100, abs=0.015)
    narrow = regression_metrics(Prediction(torch.zeros_like(f), {}, Gaussian(0.5)), y)
    assert regression_metrics(Prediction(f, {}, Gaussian(1.0)), y)["coverage_95"] < 0.9  # sd about sqrt(2) < 2
    assert narrow["coverage_90"] < 0.5


def test_regression_metrics_take_flat_targets_and_refuse_shapes_that_would_broadcast():
    """y of shape (N,) against (N, 1) predictions is the same targets; (N, 2) or (M,) would broadcast
    into a wrong RMSE without a word, so they are refused."""
    pred = Prediction(torch.tensor([[[0.0], [1.0], [3.0]]]), {}, Gaussian(1.0))
    y = torch.tensor([0.0, 2.0, 3.0])
    flat, column = regression_metrics(pred, y), regression_metrics(pred, y[:, None])
    assert flat == column and flat["rmse"] == pytest.approx((1 / 3) ** 0.5)
    for bad in (torch.zeros(3, 2), torch.zeros(4), torch.zeros(3, 3)):
        with pytest.raises(BnnZooError, match=r"give y as \(N,\) or \(N, outputs\)"):
            regression_metrics(pred, bad)


def test_temperature_scaling_recovers_an_overconfidence_lowers_nll_and_keeps_accuracy():
    """Labels drawn from softmax(z) and probabilities softmax(3 z): the best temperature is 3 in the
    limit; on 20,000 validation points it is within 5% (its sampling sd is about 1%)."""
    from bnn_zoo.evaluation.calibration import fit_temperature, temper

    g = torch.Generator().manual_seed(0)
    z = torch.randn(40_000, 4, generator=g)
    y = torch.multinomial(torch.softmax(z, -1), 1, generator=g)[:, 0]
    probs = torch.softmax(3 * z, -1)
    t = fit_temperature(probs[:20_000], y[:20_000])
    assert abs(t / 3 - 1) < 0.05
    tempered = temper(probs[20_000:], t)

    def nll(p):
        return -p.gather(-1, y[20_000:, None]).log().mean()

    assert nll(tempered) < nll(probs[20_000:]) - 0.1
    assert torch.equal(tempered.argmax(-1), probs[20_000:].argmax(-1))


def test_split_conformal_intervals_cover_at_least_one_minus_alpha_over_repeated_splits():
    """A predictive whose sd is half the truth: its 90% Gaussian interval covers about 59%. Conformalised
    on 99 points, coverage averaged over 400 random splits (each scored on 500 points) lies in
    [0.9, 0.9 + 1/100], up to 4 standard errors of the average: a split's coverage varies by about 0.033
    (Beta(90, 10) for the calibration draw, 0.013 for the 500 test points), so the average's by 0.0016."""
    from bnn_zoo.evaluation.calibration import SplitConformal

    g = torch.Generator().manual_seed(1)
    covered = []
    for _ in range(400):
        x = torch.rand(599, generator=g)
        sd = 0.2 + x
        y = torch.sin(3 * x) + sd * torch.randn(599, generator=g)
        mean, wrong_sd = torch.sin(3 * x), sd / 2
        conformal = SplitConformal.fit(mean[:99], wrong_sd[:99], y[:99], alpha=0.1)
        lower, upper = conformal.interval(mean[99:], wrong_sd[99:])
        covered.append(((y[99:] >= lower) & (y[99:] <= upper)).double().mean())
    coverage = torch.stack(covered).mean().item()
    assert 0.9 - 0.0065 <= coverage <= 0.91 + 0.0065
    with pytest.raises(BnnZooError, match="cannot certify"):
        SplitConformal.fit(mean[:5], wrong_sd[:5], y[:5], alpha=0.1)


def test_a_run_holds_rows_out_to_calibrate_on_and_scores_both(tmp_path, capsys):
    import json

    from bnn_zoo.cli import main

    argv = ["fit", "--data", "digits", "--inference", "ensemble", "--inference.steps", "100", "--quiet"]
    argv += ["--inference.validation", "0"]  # the calibration rows are the only ones held out
    assert main([*argv, "--evaluation.calibrate", "0.2", "--out", str(tmp_path / "d")]) == 0
    metrics = json.loads((tmp_path / "d" / "metrics.json").read_text())
    assert metrics["n_train"] == 1347 - round(0.2 * 1347) and metrics["temperature"] > 0
    assert metrics["nll_tempered"] <= metrics["nll"] + 0.05  # fitted on other rows: lower up to sampling noise
    assert main(["fit", "--evaluation.calibrate", "0.2", "--out", str(tmp_path / "t"), "--quiet"]) == 2
    assert "need at least 9" in capsys.readouterr().err
