"""Data for the architectures (digits, text) and their metrics: ECE, perplexity, thinned InferenceData."""

import json
import math

import pytest
import torch

import bnn_zoo as bz
from bnn_zoo.cli import main
from bnn_zoo.data import text
from bnn_zoo.evaluation import expected_calibration_error, language_model_metrics
from bnn_zoo.experiments import config
from bnn_zoo.io import load_inference_data


def test_digits_split_is_fixed_and_stratified():
    a, b = config.Digits().load(seed=0), config.Digits().load(seed=7)
    assert torch.equal(a.y_test, b.y_test) and a.x_train.shape == (1347, 64) and a.x_test.shape == (450, 64)
    test, full = torch.bincount(a.y_test, minlength=10), torch.bincount(torch.cat([a.y_train, a.y_test]), minlength=10)
    assert ((test - full * 450 / 1797).abs() <= 1).all()  # each class in the test set in its overall proportion


def test_language_model_windows_are_shifted_by_one_and_split_90_10():
    d = text.language_model("abcdefghij" * 50, level="char", seq_len=8)
    vocab = d.info["vocab"]
    assert len(vocab) == 12  # pad, unk, 10 letters
    assert torch.equal(d.x_train[:, 1:].long(), d.y_train[:, :-1])  # targets are the next tokens
    assert torch.equal(d.x_train.reshape(-1)[1:].long(), d.y_train.reshape(-1)[:-1])  # windows tile the text
    assert d.x_train.numel() <= 450 and d.x_test.numel() <= 50 and d.x_train.numel() > 400


def test_classification_text_is_padded_at_the_end_and_unknown_words_map_to_unk():
    d = text.classification(["good day", "bad night here", "zzz"], [1, 0, 0], test_fraction=0.0)
    x = torch.cat([d.x_train]).long()
    assert x.shape == (3, 3) and (x == text.PAD).sum() == 3
    assert text.Vocabulary(["a", "b"]).encode(["a", "c"]).tolist() == [2, text.UNK]
    texts, labels = text.toy_text(50)
    assert len(texts) == 50 and set(labels) == {0, 1}


def test_text_data_errors_are_one_line(tmp_path):
    with pytest.raises(bz.BnnZooError, match="no text file"):
        config.Text(str(tmp_path)).load(seed=0)
    (tmp_path / "input.txt").write_text("short")
    with pytest.raises(bz.BnnZooError, match="too few tokens"):
        config.Text(str(tmp_path), seq_len=64).load(seed=0)
    with pytest.raises(bz.BnnZooError, match="the text data needs a file"):
        config.Text().load(seed=0)


def test_ece_on_hand_cases():
    # two bins used: confidence 0.9 (both right) and 0.6 (one of two right): ECE = (2 * 0.1 + 2 * 0.1) / 4
    probs = torch.tensor([[0.9, 0.1], [0.1, 0.9], [0.6, 0.4], [0.4, 0.6]])
    assert expected_calibration_error(probs, torch.tensor([0, 1, 0, 0])) == pytest.approx(0.1)
    g = torch.Generator().manual_seed(0)
    conf = 0.5 + 0.5 * torch.rand(20000, generator=g)
    right = torch.rand(20000, generator=g) < conf  # calibrated by construction
    probs = torch.stack([conf, 1 - conf], -1)
    y = torch.where(right, 0, 1)
    assert expected_calibration_error(probs, y) < 0.02
    over = torch.stack([0.5 + 0.5 * conf.clamp(max=0.999) ** 0.2, 1 - (0.5 + 0.5 * conf.clamp(max=0.999) ** 0.2)], -1)
    assert expected_calibration_error(over, y) > 0.1  # same hits, inflated confidence


def test_perplexity_on_a_hand_case():
    probs = torch.full((1, 3, 4), 0.25)
    probs[0, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0])
    out = language_model_metrics(probs, torch.tensor([[0, 3, -1]]))  # p = 0.5 and 0.25; padding skipped
    assert out["perplexity"] == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.25)) / 2))


def test_large_fits_are_thinned_in_the_inference_data():
    x, y = torch.randn(30, 2), torch.randn(30)
    model = bz.BNN(bz.models.MLP(2, [200], 1), bz.priors.FanInNormal(), bz.likelihoods.Gaussian(1.0))
    post = bz.fit(model, x, y, bz.SVI(steps=2, num_draws=400, progress=False))
    idata = post.to_inference_data(max_mb=0.5)  # 801 weights x 4 bytes x 400 draws = 1.3 MB
    assert idata.posterior.sizes["draw"] == int(0.5 * 2**20 / (801 * 4)) < 400
    assert (
        idata.log_likelihood.sizes["draw"] == 400
        and idata.posterior.attrs["draws_posterior"] == idata.posterior.sizes["draw"]
    )


@pytest.mark.parametrize(
    "data, model, extra",
    [
        (
            "digits",
            ["cnn", "--model.channels", "[4]", "--model.dense", "8", "--model.dropout", "dense"],
            ["--prior", "normal"],
        ),
        ("toy-text", ["lstm-tied", "--model.embed_dim", "4", "--model.hidden", "6"], []),
        ("toy-text", ["embedding-rnn", "--model.embed_dim", "4", "--model.hidden", "6"], []),
    ],
)
def test_fit_architectures_from_the_command_line(tmp_path, data, model, extra):
    out = tmp_path / "run"
    svi = [
        "--inference.steps",
        "20",
        "--inference.batch_size",
        "64",
        "--guide",
        "dropout",
        "--guide.p",
        "0.2",
        "--guide.masks",
        "example",
    ]
    assert main(["fit", "--data", data, "--model", *model, *svi, "--out", str(out), "--quiet", *extra]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"accuracy", "nll", "ece", "accuracy_at_mean"} <= set(metrics)
    assert load_inference_data(out / "posterior.nc").posterior.sizes["chain"] == 1


def test_language_model_from_the_command_line(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "input.txt").write_text("to be or not to be, that is the question. " * 40)
    out = tmp_path / "lm"
    data = ["--data", "text", "--data.path", str(corpus), "--data.seq_len", "16"]
    model = ["--model", "lstm-untied", "--model.embed_dim", "4", "--model.hidden", "8"]
    assert (
        main(
            [
                "fit",
                *data,
                *model,
                "--inference.steps",
                "20",
                "--guide",
                "dropout",
                "--guide.masks",
                "example",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert (
        1 < metrics["perplexity"] < len("to be or not to be, that is the question.")
        and metrics["likelihood"] == "Tokens()"
    )


def test_recurrent_models_refuse_feature_data(capsys):
    assert main(["fit", "--model", "lstm-tied", "--out", "/tmp/never", "--quiet"]) == 2
    assert "recurrent models take text data" in capsys.readouterr().err


def resolved(data: str, model: str, **options) -> config.RunConfig:
    """The run config `model` on `data` resolves to: its data- and architecture-dependent defaults written out."""
    from bnn_zoo.experiments.run import prepare

    run = config.RunConfig(data=config.REGISTRY["data"][data](), model=config.REGISTRY["model"][model](), **options)
    return prepare(run, progress=False).config


def test_recurrent_models_default_to_gals_dropout_guide_and_other_methods_to_the_scale_mixture():
    """Under a single Normal prior, mean-field on toy-text's LSTMs keeps the prior (the majority class);
    under the scale mixture it learns. HMC's steps must resolve the narrow component, so NUTS, HMC and
    ChEES take a wider one; SG-MCMC's adapted step stays in it, so SG-MCMC takes N(0, 1); Laplace needs a
    Normal's precision (docs/guide/defaults.md)."""

    lstm = resolved("toy-text", "lstm-tied")
    assert isinstance(lstm.guide, config.Dropout) and isinstance(lstm.prior, config.Normal)
    for guide in (config.MeanField(), config.MatrixNormal(), config.Flow()):
        assert isinstance(resolved("toy-text", "embedding-rnn", guide=guide).prior, config.ScaleMixture)
    for method in (config.NUTS(), config.HMC(), config.ChEES()):
        assert resolved("toy-text", "lstm-untied", inference=method).prior == config.ScaleMixture(scale2=0.05)
    for method in (config.SGLD(), config.SGHMC(), config.Cyclical()):
        assert resolved("toy-text", "lstm-untied", inference=method).prior == config.Normal()
    # a Normal's precision
    assert isinstance(resolved("toy-text", "lstm-untied", inference=config.Laplace()).prior, config.FanIn)
    assert isinstance(resolved("digits", "cnn", inference=config.NUTS()).prior, config.FanIn)
    cnn = resolved("digits", "cnn")
    assert isinstance(cnn.guide, config.MeanField) and isinstance(cnn.prior, config.FanIn)


def test_the_matrix_normal_guide_takes_per_weight_scales_on_the_recurrent_models_only():
    """Louizos & Welling's family collapses to the majority class on toy-text's LSTMs; with a scale per
    weight it reads the sentences (docs/guide/defaults.md). Elsewhere it stays their family; a given value is kept."""

    def scales(data, model, guide):
        return resolved(data, model, guide=guide).guide.scales

    assert (
        scales("toy-text", "lstm-tied", config.MatrixNormal())
        is scales("toy-text", "embedding-rnn", config.MatrixNormal())
        is True
    )
    assert scales("digits", "cnn", config.MatrixNormal()) is scales("toy-cubic", "mlp", config.MatrixNormal()) is False
    assert scales("toy-text", "lstm-untied", config.MatrixNormal(scales=False)) is False


def test_nuts_and_hmc_default_to_short_chains_on_the_cnn_and_the_recurrent_models():
    """1,000 NUTS iterations on the digits CNN take 3.2 hours, past the 2-hour limit; 100 + 100 fit
    (docs/guide/defaults.md). Given numbers are kept, other models keep 500 + 500, ChEES its own."""

    def draws(data, model, inference):
        chain = resolved(data, model, inference=inference).inference
        return chain.num_warmup, chain.num_samples

    assert draws("digits", "cnn", config.NUTS()) == draws("toy-text", "lstm-tied", config.HMC()) == (100, 100)
    assert draws("toy-text", "embedding-rnn", config.NUTS()) == (100, 100)
    assert draws("digits", "mlp", config.NUTS()) == draws("toy-cubic", "mlp", config.HMC()) == (500, 500)
    assert draws("digits", "cnn", config.NUTS(num_warmup=300)) == (300, 100)
    assert draws("digits", "cnn", config.ChEES()) == (500, 250)
    assert draws("toy-text", "lstm-untied", config.ChEES()) == (200, 100)


def test_chees_on_the_recurrent_models_defaults_to_4_chains_and_255_steps():
    """16 chains of 750 iterations would take hours there (docs/guide/defaults.md); other models keep 16 and 1,000."""

    def chains_and_cap(data, model, chees):
        method = resolved(data, model, inference=chees).inference
        return method.num_chains, method.max_leapfrog

    assert chains_and_cap("toy-text", "lstm-tied", config.ChEES()) == (4, 255)
    assert (
        chains_and_cap("digits", "cnn", config.ChEES())
        == chains_and_cap("toy-cubic", "mlp", config.ChEES())
        == (16, 1000)
    )
    assert chains_and_cap("toy-text", "embedding-rnn", config.ChEES(num_chains=16)) == (16, 255)


def test_nuts_trees_default_to_depth_8_on_the_recurrent_models():
    """Their trees reach 1,023 steps at every draw and a depth-10 run passes the time limit (docs/guide/defaults.md)."""

    def depth(data, model, nuts):
        return resolved(data, model, inference=nuts).inference.max_tree_depth

    assert depth("toy-text", "lstm-tied", config.NUTS()) == depth("toy-text", "embedding-rnn", config.NUTS()) == 8
    assert depth("digits", "cnn", config.NUTS()) == depth("toy-cubic", "mlp", config.NUTS()) == 10
    assert depth("toy-text", "lstm-untied", config.NUTS(max_tree_depth=10)) == 10


def test_hmc_trajectories_default_to_255_steps_on_the_models_with_short_chains():
    """Uncapped, the digits CNN's step size fell 140x in three iterations and one took 2,995 full-data
    gradients (docs/guide/defaults.md); 255 is NUTS's cap at depth 8, 1,000 ChEES's."""

    def cap(data, model, hmc):
        return resolved(data, model, inference=hmc).inference.max_leapfrog

    assert cap("digits", "cnn", config.HMC()) == cap("toy-text", "embedding-rnn", config.HMC()) == 255
    assert cap("digits", "mlp", config.HMC()) == cap("toy-cubic", "linear", config.HMC()) == 1000
    assert cap("digits", "cnn", config.HMC(max_leapfrog=2000)) == 2000


def test_the_embedding_rnn_says_when_its_word_type_dropout_does_not_apply(recwarn):
    """Under any method but the dropout guide it is the untied LSTM: the same start, the same log
    posterior (so HMC's draws agree to the last digit), and the command says so."""
    from bnn_zoo.experiments.run import prepare
    from bnn_zoo.inference.potential import LogPosterior

    untied = prepare(
        config.RunConfig(data=config.ToyText(), model=config.LSTMUntied(), inference=config.SGLD()), progress=False
    )
    with pytest.warns(UserWarning, match="this fit is the lstm-untied model's"):
        embedding = prepare(
            config.RunConfig(data=config.ToyText(), model=config.EmbeddingRNN(), inference=config.SGLD()),
            progress=False,
        )
    start = untied.model.network_init(0)
    assert all(torch.equal(start[k], v) for k, v in embedding.model.network_init(0).items())
    x, y = untied.dataset.train
    at_start = {k: v[None] for k, v in start.items()}
    log_densities = [LogPosterior(run.model, x.shape[0]).batched(at_start, x, y) for run in (untied, embedding)]
    assert torch.equal(*log_densities)
    # the dropout guide by default
    prepare(config.RunConfig(data=config.ToyText(), model=config.EmbeddingRNN()), progress=False)
    assert not [w for w in recwarn if "word-type" in str(w.message)]
