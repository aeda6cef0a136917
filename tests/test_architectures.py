"""CNN, LSTM (tied/untied) and embedding: masks, placement, equivalences, and fits with every guide."""

from unittest import mock

import pytest
import torch

import bnn_zoo as bz
from bnn_zoo import local_noise
from bnn_zoo.local_noise import InputDropout
from bnn_zoo.models.rnn import GATES, word_type_mask

V, D, K = 12, 5, 4


def _recorded_masks(module, noise: dict, x):
    """Run ``module`` with per-example dropout on the given weights; return its output and every mask drawn."""
    drawn, original = [], local_noise.bernoulli_mask

    def recording(shape, keep, like):
        mask = original(shape, keep, like)
        drawn.append(mask)
        return mask

    with (
        mock.patch.object(local_noise, "bernoulli_mask", recording),
        local_noise.hooks(module, {name: InputDropout(None, 0.5) for name in noise}),
    ):
        return module(x), drawn


def test_tied_lstm_draws_one_mask_per_sequence_and_reuses_it_at_every_step():
    torch.manual_seed(0)
    lstm = bz.models.LSTM(D, K, gates="tied")
    x = torch.randn(30, 6, D)
    out, drawn = _recorded_masks(lstm, ["weight"], x)
    assert len(drawn) == 1 and drawn[0].shape == (30, D + K)  # one draw for all steps and all four gates
    mask = drawn[0]
    assert len({tuple(r) for r in mask.tolist()}) > 15  # different sequences, different masks
    h = c = torch.zeros(30, K)
    for t in range(6):  # by hand: the same mask on [x_t; h_{t-1}] at every step
        i, f, o, g = ((torch.cat([x[:, t], h], -1) * mask) @ lstm.weight.T + lstm.bias).split(K, -1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        assert torch.allclose(out[:, t], h, atol=1e-6)


def test_untied_lstm_draws_independent_masks_per_gate():
    torch.manual_seed(1)
    lstm = bz.models.LSTM(D, K, gates="untied")
    names = [f"{kind}_{g}" for kind in ("weight", "recurrent") for g in GATES]
    x = torch.randn(200, 3, D)
    out, drawn = _recorded_masks(lstm, names, x)
    assert len(drawn) == 8  # W_g and U_g for each gate, drawn once for the whole sequence
    mx, mh = dict(zip(GATES, drawn[:4])), dict(zip(GATES, drawn[4:]))
    h = c = torch.zeros(200, K)
    for t in range(3):  # by hand (Gal's eqs. 3.22-3.23): gate g sees x_t and h_{t-1} through its own masks
        pre = {
            g: (x[:, t] * mx[g]) @ getattr(lstm, f"weight_{g}").T
            + (h * mh[g]) @ getattr(lstm, f"recurrent_{g}").T
            + getattr(lstm, f"bias_{g}")
            for g in GATES
        }
        c = pre["f"].sigmoid() * c + pre["i"].sigmoid() * pre["g"].tanh()
        h = pre["o"].sigmoid() * c.tanh()
        assert torch.allclose(out[:, t], h, atol=1e-6)
    assert [m.shape for m in drawn] == [(200, D)] * 4 + [(200, K)] * 4
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.equal(drawn[a], drawn[b])
            agreement = (drawn[a] == drawn[b]).float().mean()
            assert abs(agreement - 0.5) < 5 * (0.25 / drawn[a].numel()) ** 0.5  # independent Bernoulli(1/2)


def test_tied_and_untied_lstms_compute_the_same_function():
    torch.manual_seed(2)
    tied, untied = bz.models.LSTM(D, K, "tied"), bz.models.LSTM(D, K, "untied")
    with torch.no_grad():
        for j, g in enumerate(GATES):
            rows = slice(j * K, (j + 1) * K)
            getattr(untied, f"weight_{g}").copy_(tied.weight[rows, :D])
            getattr(untied, f"recurrent_{g}").copy_(tied.weight[rows, D:])
            getattr(untied, f"bias_{g}").copy_(tied.bias[rows])
    x = torch.randn(7, 9, D)
    assert torch.allclose(tied(x), untied(x), atol=1e-6)
    reference = torch.nn.LSTM(D, K, batch_first=True)  # and both equal PyTorch's LSTM (gate order i, f, g, o)
    order = [0, 1, 3, 2]
    with torch.no_grad():
        w = tied.weight.reshape(4, K, D + K)[order].reshape(4 * K, D + K)
        reference.weight_ih_l0.copy_(w[:, :D]), reference.weight_hh_l0.copy_(w[:, D:])
        reference.bias_ih_l0.copy_(tied.bias.reshape(4, K)[order].reshape(-1)), reference.bias_hh_l0.zero_()
    assert torch.allclose(tied(x), reference(x)[0], atol=1e-5)


def test_word_type_dropout_drops_every_occurrence_together_and_equals_the_naive_v_mask():
    ids = torch.randint(0, V, (50, 20), generator=torch.Generator().manual_seed(3))
    like = torch.zeros(())
    torch.manual_seed(4)
    mask = word_type_mask(ids, InputDropout(None, 0.5), like)
    for n in range(50):
        for v in ids[n].unique():
            assert len(mask[n][ids[n] == v].unique()) == 1  # all occurrences of a type share its fate
    # the naive implementation: V draws per sequence, looked up by token. With the same draws for the
    # (sequence, type) pairs present, in the same order, it gives the same mask.
    present = torch.unique(torch.arange(50)[:, None] * V + ids)
    torch.manual_seed(4)
    draws = (torch.rand(len(present)) < 0.5).float()
    naive = torch.rand(50, V).lt(0.5).float()  # types absent from a sequence: any value, never looked up
    naive.view(-1)[present] = draws
    assert torch.equal(mask, naive[torch.arange(50)[:, None], ids])
    assert abs(mask.mean() - 0.5) < 0.05


def test_the_embeddings_gradient_is_the_same_on_every_run_with_two_threads():
    """Indexing weight.T[ids] accumulated the rows of repeated ids in a varying order on two threads, so a
    toy-text fit did not reproduce to the last digit; the embedding's gradient must not depend on the run."""
    embedding = bz.models.rnn.Embedding(41, 32)
    ids = torch.randint(1, 41, (300, 12), generator=torch.Generator().manual_seed(0))
    ids[:, 6:] = 0  # padding: one id repeated 1,800 times, as in toy-text's batches
    upstream = torch.randn(300, 12, 32, generator=torch.Generator().manual_seed(1))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grads = [torch.autograd.grad((embedding(ids) * upstream).sum(), embedding.weight)[0] for _ in range(100)]
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(grads[0], g) for g in grads[1:])


def test_lenet_dropout_placement_all_versus_dense():
    model_all = bz.BNN(bz.models.LeNet(dropout="all"), bz.priors.Normal(1.0), bz.likelihoods.Categorical())
    model_ip = bz.BNN(bz.models.LeNet(dropout="dense"), bz.priors.Normal(1.0), bz.likelihoods.Categorical())
    p_all = bz.guides.build("dropout", model_all, model_all.network_init(0), p=0.5).p
    p_ip = bz.guides.build("dropout", model_ip, model_ip.network_init(0), p=0.5).p
    assert p_all == {"features.1.weight": 0.0, "features.4.weight": 0.5, "hidden.weight": 0.5, "out.weight": 0.5}
    assert p_ip == {"features.1.weight": 0.0, "features.4.weight": 0.0, "hidden.weight": 0.0, "out.weight": 0.5}
    with pytest.raises(bz.BnnZooError, match="3 weight matrices take dropout"):
        bz.guides.build("dropout", model_all, model_all.network_init(0), p=[0.1, 0.2])


def test_token_likelihood_ignores_padding():
    logits = torch.randn(3, 4, V)
    y = torch.tensor([[1, 2, 3, -1], [4, -1, -1, -1], [5, 6, 7, 8]])
    lp = bz.likelihoods.Tokens().distribution(logits, {}).log_prob(y)
    by_hand = torch.stack(
        [sum(logits[n, t].log_softmax(-1)[y[n, t]] for t in range(4) if y[n, t] >= 0) for n in range(3)]
    )
    assert torch.allclose(lp, by_hand)


def _text_data(n=48, steps=6):
    g = torch.Generator().manual_seed(5)
    x = torch.randint(1, V, (n, steps), generator=g).float()
    x[:4, 4:] = 0  # padded sequences
    return x, (x[:, 0] > V / 2).long()


@pytest.mark.parametrize(
    "gates, guide, options",
    [
        (gates, guide, options)
        for gates in ("tied", "untied")
        for guide, options in [
            ("dropout", {"p": 0.2, "masks": "example"}),
            ("mean-field", {}),
            ("matrix-normal", {"rank": 2}),
        ]
    ]
    + [
        ("tied", "flow", {"transform": "spline", "scope": "layer"}),
        # the tied case's flow over four times the gate weights, the slowest fit here: slow lane
        pytest.param("untied", "flow", {"transform": "spline", "scope": "layer"}, marks=pytest.mark.slow),
    ],
)
def test_every_guide_fits_the_text_rnn(gates, guide, options):
    x, y = _text_data()
    model = bz.BNN(
        bz.models.TextRNN(V, 6, 8, gates=gates, embedding_dropout=True),
        bz.priors.Normal(1.0),
        bz.likelihoods.Categorical(),
    )
    post = bz.fit(
        model, x, y, bz.SVI(guide=guide, guide_options=options, steps=20, num_particles=2, progress=False, num_draws=8)
    )
    assert post.predict(x).probs.shape == (48, 2)
    assert "lstm.weight" in post.to_inference_data().posterior or "lstm.weight_i" in post.to_inference_data().posterior


def test_local_reparameterisation_is_refused_on_recurrent_weights():
    x, y = _text_data()
    model = bz.BNN(bz.models.TextRNN(V, 6, 8), bz.priors.Normal(1.0), bz.likelihoods.Categorical())
    with pytest.raises(bz.BnnZooError, match="per-example dropout masks only"):
        bz.fit(model, x, y, bz.SVI(guide="mean-field", guide_options={"local_reparam": True}, steps=2, progress=False))


@pytest.mark.parametrize("kind", ["nuts", "hmc"])
def test_mcmc_runs_on_small_cnn_and_rnn(kind):
    method = (bz.NUTS if kind == "nuts" else bz.HMC)(num_warmup=5, num_samples=5, num_chains=1, progress=False)
    x, y = _text_data(16, 4)
    rnn = bz.BNN(bz.models.TextRNN(V, 3, 3, gates="untied", head="lm"), bz.priors.Normal(1.0), bz.likelihoods.Tokens())
    targets = (
        torch.cat([x[:, 1:], torch.zeros(16, 1)], 1)
        .long()
        .masked_fill(torch.cat([x[:, 1:], torch.zeros(16, 1)], 1) == 0, -1)
    )
    assert bz.fit(rnn, x, targets, method).predict(x).f.shape == (5, 16, 4, V)
    cnn = bz.BNN(
        bz.models.LeNet((1, 4, 4), channels=[2], dense=4, out_features=3),
        bz.priors.Normal(1.0),
        bz.likelihoods.Categorical(),
    )
    xi, yi = torch.randn(12, 16), torch.arange(12) % 3
    assert bz.fit(cnn, xi, yi, method).predict(xi).probs.shape == (12, 3)


@pytest.mark.parametrize(
    "guide, options",
    [
        ("dropout", {"p": 0.3, "masks": "example"}),
        ("mean-field", {"local_reparam": True}),
        ("matrix-normal", {"rank": 2}),
        ("flow", {"transform": "spline", "scope": "layer", "hidden": 8}),
    ],
)
def test_every_guide_fits_the_cnn(guide, options):
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(24, 16, generator=g), torch.arange(24) % 3
    model = bz.BNN(
        bz.models.LeNet((1, 4, 4), channels=[2], dense=4, out_features=3),
        bz.priors.Normal(1.0),
        bz.likelihoods.Categorical(),
    )
    post = bz.fit(
        model, x, y, bz.SVI(guide=guide, guide_options=options, steps=10, num_particles=2, progress=False, num_draws=8)
    )
    assert post.predict(x).probs.shape == (24, 3)
    assert post.to_inference_data().posterior["features.1.weight"].shape == (1, 8, 2, 1, 3, 3)


def test_lenet_all_per_example_masks_act_before_pooling():
    net = bz.models.LeNet(dropout="all")
    assert net.mask_sites == {"features.4.weight": "features.3", "hidden.weight": "features.6"}
    noise = {k: InputDropout(p.detach(), 0.5) for k, p in net.named_parameters() if k in net.dropout_layers}
    drawn, original = [], local_noise.keep_mask

    def recording(shape, keep, like):
        drawn.append(tuple(shape))
        return original(shape, keep, like)

    with mock.patch.object(local_noise, "keep_mask", recording), local_noise.hooks(net, noise):
        net(torch.randn(5, 64))
    # per pixel of each convolution block's output, before its pooling; per unit after the dense layer
    assert drawn == [(5, 16, 8, 8), (5, 32, 4, 4), (5, 64)]
