"""Shift and OOD scores against scikit-learn's and exact transforms."""

import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from bnn_zoo.data import digits
from bnn_zoo.evaluation import shift


def test_ood_scores_equal_scikit_learns_with_ties():
    g = torch.Generator().manual_seed(0)
    negatives = torch.randint(0, 20, (300,), generator=g).double()  # many ties
    positives = torch.randint(5, 25, (200,), generator=g).double()
    labels = [0] * 300 + [1] * 200
    scores = torch.cat([negatives, positives]).numpy()
    assert abs(shift.auroc(negatives, positives) - roc_auc_score(labels, scores)) < 1e-12
    assert abs(shift.average_precision(negatives, positives) - average_precision_score(labels, scores)) < 1e-12


def test_fpr_at_95_tpr_on_a_hand_case():
    positives = torch.arange(1.0, 21.0)  # the threshold that catches 19 of 20 is 2
    negatives = torch.tensor([0.0, 1.0, 1.5, 2.0, 3.0])
    assert shift.fpr_at_tpr(negatives, positives, 0.95) == 2 / 5


def test_a_quarter_turn_is_torchs_rot90_and_ood_digits_are_held_out():
    x = torch.arange(2 * 64, dtype=torch.float32).reshape(2, 64)
    turned = shift.rotate(x, 90, (1, 8, 8)).reshape(2, 8, 8)
    assert torch.allclose(turned, torch.rot90(x.reshape(2, 8, 8), k=1, dims=(1, 2)), atol=1e-4)  # anticlockwise
    data = digits(classes=5)
    assert data.y_train.max() == 4 and data.y_test.max() == 4 and len(data.info["ood_x"]) > 200
    assert len(data.x_test) + len(data.info["ood_x"]) == 450
