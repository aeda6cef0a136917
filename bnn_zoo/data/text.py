"""Text data: vocabularies, language-model windows and padded classification sequences, as Datasets.

Token ids: 0 is padding, 1 an unknown token, real tokens from 2 in order of frequency. Sequences are
rows of x (N, T) (float ids, like every bnn-zoo input); the network casts them back to integers.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Literal

import torch

from bnn_zoo.data.datasets import Dataset
from bnn_zoo.errors import BnnZooError, checked, positive

PAD, UNK = 0, 1
LEVELS = ("word", "char")
TEST_FRACTION = 0.25  # of a classification corpus, held out at random


def tokenize(text: str, level: str) -> list[str]:
    """Characters, or lower-cased words and punctuation marks."""
    if level not in LEVELS:
        raise BnnZooError(f"unknown text level {level!r}; choose word or char")
    return list(text) if level == "char" else re.findall(r"\w+|[^\w\s]", text.lower())


class Vocabulary:
    """Token <-> id, built from training tokens; ``max_size`` keeps the most frequent (others map to UNK)."""

    def __init__(self, tokens, max_size: int | None = None):
        counts = Counter(tokens)
        kept = sorted(counts, key=lambda t: (-counts[t], t))[: max_size and max_size - 2]
        self.tokens = ["<pad>", "<unk>", *kept]
        self.ids = {t: i for i, t in enumerate(self.tokens)}

    def __len__(self):
        return len(self.tokens)

    def encode(self, tokens) -> torch.Tensor:
        return torch.tensor([self.ids.get(t, UNK) for t in tokens], dtype=torch.long)


def language_model(
    text: str, level: str = "char", seq_len: int = 64, max_vocab: int | None = None, name: str = "text"
) -> Dataset:
    """Next-token windows: the first 90% of the text trains, the last 10% tests. Each window of
    ``seq_len`` tokens is one data point whose targets are the same tokens shifted by one
    (truncated backpropagation through time, with no hidden state carried between windows)."""
    seq_len = positive("the text's seq_len (tokens per window)", seq_len, integer=True)
    if max_vocab is not None:
        positive("max_vocab (padding, unknown and at least one real token)", max_vocab, integer=True, least=3)
    tokens = tokenize(text, level)
    cut = int(0.9 * len(tokens))
    vocab = Vocabulary(tokens[:cut], max_vocab)

    def windows(part):
        ids = vocab.encode(part)
        n = (len(ids) - 1) // seq_len
        if n < 1:
            raise BnnZooError(
                f"the text has too few tokens for one window of {seq_len}; use a longer text or a smaller seq_len"
            )
        return ids[: n * seq_len].reshape(n, seq_len).float(), ids[1 : n * seq_len + 1].reshape(n, seq_len)

    (x_tr, y_tr), (x_te, y_te) = windows(tokens[:cut]), windows(tokens[cut:])
    return Dataset(
        name,
        x_tr,
        y_tr,
        x_te,
        y_te,
        task="language-model",
        info={"vocab": vocab, "level": level, "split": "first 90% train, last 10% test"},
    )


def classification(
    texts,
    labels,
    level: str = "word",
    max_len: int = 40,
    test_fraction: float = TEST_FRACTION,
    seed: int = 0,
    name: str = "text",
    ood_texts: list[str] | None = None,
) -> Dataset:
    """Padded sequences (0 at the end) with one label each, split at random into train and test;
    ``ood_texts`` are encoded with the training vocabulary as out-of-distribution inputs (``info["ood_x"]``)."""
    tokenized = [tokenize(t, level)[:max_len] for t in texts]
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed))
    n_test = int(test_fraction * len(texts))
    train_idx = order[n_test:].tolist()
    vocab = Vocabulary([tok for i in train_idx for tok in tokenized[i]])
    x = _padded([vocab.encode(toks) for toks in tokenized])
    y = torch.as_tensor(labels, dtype=torch.long)
    test_idx = order[:n_test]
    info = {"vocab": vocab, "level": level}
    if ood_texts:
        info["ood_x"] = _padded([vocab.encode(tokenize(t, level)[:max_len]) for t in ood_texts]).float()
    return Dataset(
        name,
        x[train_idx].float(),
        y[train_idx],
        x[test_idx].float(),
        y[test_idx],
        task="classification",
        info=info,
    )


def _padded(sequences: list[torch.Tensor]) -> torch.Tensor:
    out = torch.zeros(len(sequences), max(len(s) for s in sequences), dtype=torch.long)
    for i, ids in enumerate(sequences):
        out[i, : len(ids)] = ids
    return out


_POSITIVE = ["good", "great", "fine", "lovely", "brilliant", "warm", "happy", "bright"]
_NEGATIVE = ["bad", "poor", "dull", "awful", "grim", "cold", "sad", "dark"]
_NOUNS = ["play", "king", "night", "song", "storm", "queen", "day", "tale", "house", "sea"]
_FILLER = ["the", "a", "this", "that", "was", "is", "and", "very", "quite", "not", "so", "but"]


def toy_text(n: int = 400, seed: int = 0) -> tuple[list[str], list[int]]:
    """A generated sentiment corpus (shipped with the package, for tests and the demo): each sentence
    mixes filler, nouns and sentiment words; its label is 1 when positive words outnumber negative.

    Args:
        n: sentences (a quarter of them, at random, held out as the test set).
        seed: the draw's seed.
    """
    positive("toy-text n (sentences)", n, integer=True, least=8)
    g = torch.Generator().manual_seed(seed)
    pick = lambda words: words[int(torch.randint(len(words), (), generator=g))]  # noqa: E731
    texts, labels = [], []
    for _ in range(n):
        words, score = [], 0
        for _ in range(int(torch.randint(4, 12, (), generator=g))):
            r = float(torch.rand((), generator=g))
            if r < 0.2:
                words.append(pick(_POSITIVE))
                score += 1
            elif r < 0.4:
                words.append(pick(_NEGATIVE))
                score -= 1
            else:
                words.append(pick(_NOUNS if r < 0.6 else _FILLER))
        texts.append(" ".join(words) + ".")
        labels.append(int(score > 0))
    return texts, labels


def load_toy_text(n: int = 400, ood: str | None = None, seed: int = 0) -> Dataset:
    """The generated sentiment corpus (:func:`toy_text`) as a classification dataset, word level.

    Args:
        n: sentences (a quarter of them, at random, held out as the test set).
        ood: a second corpus (a UTF-8 text file, or a folder holding input.txt) scored as out-of-distribution:
            its first lines of at least 4 words that are not speaker names (ending in ":"), as many as
            there are test sentences, encoded with the training vocabulary.
        seed: the draw's seed.
    """
    texts, labels = toy_text(n, seed)
    ood_texts = None
    if ood:
        lines = (line.strip() for line in _read_text(_corpus_file(ood)).splitlines())
        sentences = [t for t in lines if len(tokenize(t, "word")) >= 4 and not t.endswith(":")]
        ood_texts = sentences[: int(TEST_FRACTION * n)]
        if not ood_texts:
            raise BnnZooError(f"{ood} has no line of 4 or more words to score as out-of-distribution")
    return classification(texts, labels, name="toy-text", ood_texts=ood_texts)


def _corpus_file(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / "input.txt"
    if not path.is_file():
        raise BnnZooError(f"no text file at {path}; give the corpus file (or a folder holding input.txt)")
    return path


@checked
def load_text(
    path: str | Path, level: Literal["char", "word"] = "char", seq_len: int = 64, max_vocab: int | None = None
) -> Dataset:
    """A plain-text corpus (e.g. tiny Shakespeare) as next-token windows (first 90% train, last 10% test).

    Args:
        path: a UTF-8 text file, or a folder holding input.txt.
        level: tokens are characters or whitespace-separated words.
        seq_len: tokens of context per window; the model predicts the next one.
        max_vocab: keep the most frequent tokens, the rest as one unknown token (at least 3; None: all).
    """
    path = _corpus_file(path)
    return language_model(_read_text(path), level, seq_len, max_vocab, name=f"text:{path.parent.name}")


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; a binary or otherwise-encoded file is refused (read with replacement
    characters, a binary file gives a vocabulary of noise and a model that is silently meaningless)."""
    data = path.read_bytes()
    if b"\x00" in data:
        raise BnnZooError(f"{path} is a binary file (it holds NUL bytes), not text; give a plain-text corpus")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BnnZooError(
            f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); convert it, e.g. iconv -f "
            "latin1 -t utf-8 FILE > FILE.utf8"
        ) from None
