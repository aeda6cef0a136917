"""Shift and OOD scores against scikit-learn's and exact transforms."""

import json

import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from bnn_zoo import BnnZooError
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


def test_a_second_corpus_is_scored_as_out_of_distribution_text(tmp_path):
    """Its sentence lines (not speaker names, not short ones), as many as the test sentences, encoded with
    the training vocabulary: known words keep their ids, the rest are unknown; a fit scores detecting them."""
    from bnn_zoo.cli import main
    from bnn_zoo.data import text

    corpus = tmp_path / "input.txt"
    corpus.write_text("KING:\nThe king was very sad .\nhi there\n" + "Speak, speak the happy storm.\n" * 200)
    data = text.load_toy_text(n=40, ood=str(tmp_path))
    ood = data.info["ood_x"].long()
    vocab = data.info["vocab"]
    assert ood.shape[0] == len(data.x_test) == 10
    assert ood[0, :6].tolist() == vocab.encode(["the", "king", "was", "very", "sad", "."]).tolist()
    assert ood[1].tolist() == vocab.encode(["speak", ",", "speak", "the", "happy", "storm", "."]).tolist()
    assert ood[1, :3].tolist() == [vocab.ids["<unk>"]] * 3 and ood[0, 6] == 0  # unknown words; padding
    run = ["fit", "--data", "toy-text", "--data.n", "40", "--data.ood", str(corpus), "--model", "lstm-tied"]
    small = ["--model.embed_dim", "4", "--model.hidden", "4", "--inference.steps", "5", "--evaluation.plots", "false"]
    assert main([*run, *small, "--out", str(tmp_path / "run"), "--quiet"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert 0 <= metrics["ood_auroc_entropy"] <= 1 and 0 <= metrics["ood_fpr95_max_probability"] <= 1
    short = tmp_path / "short.txt"
    short.write_text("NAME:\ntoo short\n")
    with pytest.raises(BnnZooError, match="no line of 4 or more words"):
        text.load_toy_text(ood=str(short))
