"""Architectures as plain torch modules; :class:`bnn_zoo.BNN` turns any of them into a Pyro model."""

from bnn_zoo.models.cnn import LeNet
from bnn_zoo.models.mlp import MLP
from bnn_zoo.models.rnn import LSTM, Embedding, TextRNN

__all__ = ["LSTM", "Embedding", "LeNet", "MLP", "TextRNN"]
