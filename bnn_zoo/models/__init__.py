"""Architectures as plain torch modules; :class:`bnn_zoo.BNN` turns any of them into a Pyro model."""

from typing import Literal

from torch import nn

from bnn_zoo.models.cnn import LeNet
from bnn_zoo.models.mlp import MLP
from bnn_zoo.models.rnn import LSTM, Embedding, TextRNN

Architecture = Literal["dense", "conv", "recurrent"]


def architecture(net: nn.Module) -> Architecture:
    """``"recurrent"`` if the network has a recurrent layer, ``"conv"`` if a convolution, else ``"dense"``:
    what the defaults that depend on the network look at (:mod:`bnn_zoo.inference.defaults`)."""
    layers = list(net.modules())
    if any(isinstance(m, nn.RNNBase | LSTM) for m in layers):
        return "recurrent"
    return "conv" if any(isinstance(m, nn.modules.conv._ConvNd) for m in layers) else "dense"


__all__ = ["LSTM", "Architecture", "Embedding", "LeNet", "MLP", "TextRNN", "architecture"]
