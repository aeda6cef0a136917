"""The dataset catalogue: a command-line data spec (``toy-cubic``, ``uci:PATH:split=K``, ...) to a Dataset."""

from __future__ import annotations

from bnn_zoo.data import text
from bnn_zoo.data.datasets import Dataset, digits, load_uci, toy_cubic
from bnn_zoo.errors import BnnZooError


def load(spec: str, seed: int = 0) -> Dataset:
    """Dataset from a CLI spec (see :data:`DATASETS`)."""
    if spec == "toy-cubic":
        return toy_cubic(seed=seed)
    if spec == "digits":
        return digits()
    if spec == "toy-text":
        return text.classification(*text.toy_text(seed=seed), name="toy-text")
    if spec.startswith("text:"):
        path, _, opts = spec[5:].partition(":")
        options = {"level": "char", "seq_len": "64", "max_vocab": None}
        for item in filter(None, opts.split(";")):
            key, eq, value = item.partition("=")
            if key not in options or not eq:
                raise BnnZooError(f"bad text option {item!r}; write text:PATH:level=word|char;seq_len=T;max_vocab=V")
            options[key] = value
        try:
            seq_len, max_vocab = int(options["seq_len"]), options["max_vocab"] and int(options["max_vocab"])
        except ValueError:
            raise BnnZooError(f"seq_len and max_vocab must be integers in {spec!r}") from None
        return text.load_text(path, options["level"], seq_len, max_vocab)
    if spec.startswith("uci:"):
        path, _, opts = spec[4:].partition(":")
        split = 0
        if opts:
            key, _, value = opts.partition("=")
            if key != "split" or not value.isdigit():
                raise BnnZooError(f"bad UCI option {opts!r}; write uci:PATH:split=K with K a split number")
            split = int(value)
        return load_uci(path, split)
    raise BnnZooError(f"unknown data spec {spec!r}; use one of: {', '.join(DATASETS)}")


DATASETS = {
    "toy-cubic": "Heek's cubic toy regression, N=20 (embedded)",
    "digits": "scikit-learn's 8x8 digits, 10 classes, fixed stratified split",
    "uci:PATH[:split=K]": "UCI regression folder (standard splits)",
    "toy-text": "generated sentiment sentences, 2 classes (embedded; word level)",
    "text:PATH[:level=char|word;seq_len=64;max_vocab=V]": "a text corpus as next-token windows (first 90% train, last 10% test)",
}
