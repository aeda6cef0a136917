"""Recurrent models on token sequences: an LSTM with tied or untied gate weights, and an embedding
with word-type dropout (Gal's thesis sec. 3.4.2; Gal & Ghahramani 2016, variational RNNs).

Every weight is stored as (out, in), so a dropout guide's masks fall on input units: the LSTM's
inputs x_t and recurrent units h_{t-1}, the head's inputs (the LSTM outputs), and the embedding's
word types. Variational RNN semantics: whatever the guide draws for a weight (a whole weight draw, or
with ``masks=example`` one mask per sequence) is reused at every time step.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from bnn_zoo.errors import BnnZooError, checked
from bnn_zoo.local_noise import InputDropout, input_dropout, input_mask

GATES = ("i", "f", "o", "g")  # input, forget, output gates and the candidate cell


class LSTM(nn.Module):
    """One LSTM layer over (N, T, D) inputs, returning (N, T, K) outputs.

    ``gates="tied"``: one weight (4K, D+K) acting on [x_t; h_{t-1}] for all four gates, rows in the
    order i, f, o, g, so one dropout mask is shared by the gates. ``gates="untied"``: ``weight_g``
    (K, D) and ``recurrent_g`` (K, K) per gate g, each with its own mask (Gal's eqs. 3.22-3.23).
    With equivalent weights the two compute the same function.
    """

    handles_local_noise = True  # per-sequence masks, drawn here once and reused at every step

    def __init__(self, input_size: int, hidden_size: int, gates: str = "tied"):
        super().__init__()
        if gates not in ("tied", "untied"):
            raise BnnZooError(f"unknown LSTM gates {gates!r}; choose tied or untied")
        self.input_size, self.hidden_size, self.gates = input_size, hidden_size, gates
        d, k = input_size, hidden_size
        if gates == "tied":
            self.weight, self.bias = nn.Parameter(torch.empty(4 * k, d + k)), nn.Parameter(torch.empty(4 * k))
        else:
            for g in GATES:
                setattr(self, f"weight_{g}", nn.Parameter(torch.empty(k, d)))
                setattr(self, f"recurrent_{g}", nn.Parameter(torch.empty(k, k)))
                setattr(self, f"bias_{g}", nn.Parameter(torch.empty(k)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.LSTM's initialisation, U(-1/sqrt(K), 1/sqrt(K)); ``BNN.network_init(seed)`` calls it."""
        bound = 1 / math.sqrt(self.hidden_size)
        with torch.no_grad():
            for p in self.parameters(recurse=False):
                p.uniform_(-bound, bound)

    def forward(self, x):
        n, _, d = x.shape
        k = self.hidden_size
        # A sequence's masks are the same at every step (variational RNN), so the inputs' share of all
        # four gates is one matmul over every step at once; only the recurrent share stays in the loop.
        if self.gates == "tied":
            mask = input_mask(self, "weight", (n, d + k), x)
            mask_x, mask_h = (None, None) if mask is None else (mask[:, None, :d], mask[:, d:])
            from_x = _masked(x, mask_x) @ self.weight[:, :d].T + self.bias  # (n, T, 4k), rows i, f, o, g
            w_h = self.weight[:, d:].T  # sliced once: a slice per step would add a scatter per step to backward

            def recurrent(h):
                return _masked(h, mask_h) @ w_h
        else:
            w = {kind: [getattr(self, f"{kind}_{g}") for g in GATES] for kind in ("weight", "recurrent", "bias")}
            masks_x = [_steps(input_mask(self, f"weight_{g}", (n, d), x)) for g in GATES]
            from_x = torch.cat([_masked(x, m) @ w_g.T for m, w_g in zip(masks_x, w["weight"])], -1) + torch.cat(
                w["bias"]
            )
            masks_h = [input_mask(self, f"recurrent_{g}", (n, k), x) for g in GATES]
            if all(m is None for m in masks_h):
                stacked = torch.cat(w["recurrent"])  # (4k, k)

                def recurrent(h):
                    return h @ stacked.T
            else:  # one batched matmul over the gates, each with its own mask
                kept = torch.stack([x.new_ones(n, k) if m is None else m for m in masks_h])  # (4, n, k)
                stacked = torch.stack([r.T for r in w["recurrent"]])  # (4, k, k)

                def recurrent(h):
                    return torch.bmm(h * kept, stacked).transpose(0, 1).reshape(n, 4 * k)

        h = c = x.new_zeros(n, k)
        outputs = []
        for from_x_t in from_x.unbind(1):  # unbind, not from_x[:, t]: one stack in backward, not T full-size scatters
            i, f, o, g = (from_x_t + recurrent(h)).split(k, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, 1)

    def extra_repr(self):
        return f"input_size={self.input_size}, hidden_size={self.hidden_size}, gates={self.gates!r}"


def _masked(x, mask):
    return x if mask is None else x * mask


def _steps(mask):
    """A per-sequence mask (n, d) broadcast over the time steps of (n, T, d)."""
    return None if mask is None else mask[:, None]


class Embedding(nn.Module):
    """Token ids (N, T) -> vectors (N, T, dim); ``weight`` is (dim, vocab): word types are its input units.

    Word-type dropout (per-example masks from a dropout guide): one mask per (sequence, word type), so
    every occurrence of a type in a sequence is dropped together. Only the types present are drawn
    (:func:`word_type_mask`), never V Bernoullis per sequence.
    """

    handles_local_noise = True

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.vocab_size, self.dim = vocab_size, dim
        self.weight = nn.Parameter(torch.empty(dim, vocab_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 1 / dim) per entry; ``BNN.network_init(seed)`` calls it."""
        with torch.no_grad():
            self.weight.normal_(0.0, 1 / math.sqrt(self.dim))

    def forward(self, ids):
        # not weight.T[ids]: on more than one thread that index's backward adds the rows of repeated ids
        # in a varying order, so a text fit did not reproduce to the last digit (F.embedding's does)
        vectors = F.embedding(ids, self.weight.T)
        noise = input_dropout(self, "weight")
        return vectors if noise is None else vectors * word_type_mask(ids, noise, vectors)[..., None]

    def extra_repr(self):
        return f"vocab_size={self.vocab_size}, dim={self.dim}"


def word_type_mask(ids: torch.Tensor, noise: InputDropout, like: torch.Tensor) -> torch.Tensor:
    """(N, T) mask, 1 = kept: one draw of ``noise``'s mask per (sequence, word type present), gathered to tokens."""
    key = torch.arange(ids.shape[0], device=ids.device)[:, None] * (int(ids.max()) + 1) + ids
    types, where = torch.unique(key, return_inverse=True)
    return noise.draw(types.shape, like)[where]


class TextRNN(nn.Module):
    """Embedding -> LSTM -> linear head, on token ids (N, T) with 0 as padding (padding at the end).

    Args:
        vocab_size: token ids run over 0..vocab_size-1 (0 is padding).
        embed_dim: embedding size.
        hidden: LSTM hidden units.
        gates: separate W_g, U_g per gate with independent dropout masks (untied), or one (4K, D+K) gate
            matrix with one mask for all gates (tied: fewer, larger matrix products).
        head: classify: logits (N, classes) from the output at each sequence's last real token; lm:
            next-token logits (N, T, vocab) at every position (pair with ``likelihoods.Tokens``).
        num_classes: outputs of the classify head.
        embedding_dropout: whether a dropout guide also drops word types (:attr:`dropout_layers`; Gal &
            Ghahramani 2016b); inputs, recurrent connections and outputs always take the guide's dropout.
    """

    @checked
    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 32,
        hidden: int = 64,
        gates: Literal["tied", "untied"] = "untied",
        head: Literal["classify", "lm"] = "classify",
        num_classes: int = 2,
        embedding_dropout: bool = False,
    ):
        super().__init__()
        if head not in ("classify", "lm"):
            raise BnnZooError(f"unknown head {head!r}; choose classify (sequence labels) or lm (next token)")
        self.vocab_size, self.head, self.embedding_dropout = vocab_size, head, embedding_dropout
        self.in_features = None  # any sequence length
        self.out_features = num_classes if head == "classify" else vocab_size
        self.embedding = Embedding(vocab_size, embed_dim)
        self.lstm = LSTM(embed_dim, hidden, gates)
        self.out = nn.Linear(hidden, self.out_features)

    @property
    def dropout_layers(self) -> list[str]:
        names = [f"lstm.{k}" for k, p in self.lstm.named_parameters() if p.dim() >= 2] + ["out.weight"]
        return ["embedding.weight", *names] if self.embedding_dropout else names

    def forward(self, x):
        ids = x.long()
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise BnnZooError(
                f"token ids must lie in 0..{self.vocab_size - 1}; found {int(ids.min())}..{int(ids.max())}"
            )
        h = self.lstm(self.embedding(ids))
        if self.head == "lm":
            return self.out(h)
        last = (ids != 0).sum(-1).clamp(min=1) - 1
        return self.out(h[torch.arange(ids.shape[0]), last])

    def extra_repr(self):
        return f"head={self.head!r}, embedding_dropout={self.embedding_dropout}"
