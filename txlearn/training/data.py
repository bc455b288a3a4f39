"""Lesson 09, part 1: the text a character-level language model is trained on, and its baselines.

The default corpus is the Python language reference that ships with every Python installation
(``pydoc_data.topics``, about 465,000 characters); any UTF-8 file can replace it. Text becomes a
sequence of integer ids through a character vocabulary, split by *position* (the last 10% is the
validation set, so no validation window overlaps a training window), and is measured against three
baselines computed on the same split, all as mean cross-entropy in nats per character:

- uniform:  ln n_vocab                                 (knows only the alphabet size n_vocab)
- unigram:  -mean log p(x_t),          p from train character counts
- bigram:   -mean log p(x_t | x_{t-1}), p from train pair counts, add-alpha smoothed

Bits per character = nats / ln 2. Source: lesson 09 (``lessons/09_capstone.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "UserError",
    "load_corpus",
    "CharVocab",
    "min_chars",
    "split_by_position",
    "uniform_nats",
    "unigram_nats",
    "bigram_nats",
    "baselines",
    "nats_to_bits",
    "random_windows",
    "val_windows",
]


class UserError(Exception):
    """An error the user caused (bad file, too short, mismatched checkpoint, bad prompt).

    The ``txlearn`` command prints it as one line ``txlearn: error: <message>`` and exits with 2.
    The ``txlearn`` command (:mod:`txlearn.cli`) recognises it by this class.
    """


def load_corpus(path: str | Path | None = None) -> str:
    """Return the training text: the file at ``path`` (UTF-8), or the default corpus.

    The default is every topic of ``pydoc_data.topics`` (the language reference), in sorted key
    order, joined by newlines: 464,970 + 78 characters, 103 distinct characters.

    Raises ``UserError`` when the file does not exist, is a directory, or is not valid UTF-8
    (naming the byte offset), or when it is empty.
    """
    if path is None:
        from pydoc_data import topics
        return "\n".join(topics.topics[k] for k in sorted(topics.topics))
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a folder; give a text file")
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (invalid byte at offset {err.start})") from None
    if not text:
        raise UserError(f"{path}: the file is empty")
    return text


@dataclass(frozen=True)
class CharVocab:
    """A character vocabulary: id i <-> the i-th character of ``chars`` (sorted, unique)."""

    chars: str

    @classmethod
    def from_text(cls, text: str) -> "CharVocab":
        """The sorted set of characters of ``text``."""
        return cls("".join(sorted(set(text))))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """``text`` -> int64 ids ``(len(text),)``.

        Raises ``UserError`` naming the characters of ``text`` that are not in the vocabulary.
        """
        index = {c: i for i, c in enumerate(self.chars)}
        unknown = sorted(set(text) - index.keys())
        if unknown:
            shown = "".join(unknown[:20])
            raise UserError(f"{len(unknown)} character(s) not in the model's vocabulary of "
                            f"{len(self)}: {shown!r}")
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        """int ids (any 1-D sequence or tensor) -> text.

        Raises ``UserError`` naming the first id outside ``0 .. len(self) - 1``: a negative id
        is no character (Python's indexing would give ``chars[-1]``, the last one). Source: the
        public report on ``decode([-1])`` returning the last character."""
        ids = [int(i) for i in ids]
        bad = next((i for i in ids if not 0 <= i < len(self.chars)), None)
        if bad is not None:
            raise UserError(f"id {bad} is not in the model's vocabulary of {len(self)} "
                            f"(ids 0 to {len(self) - 1})")
        return "".join(self.chars[i] for i in ids)


def min_chars(block_size: int, val_fraction: float = 0.1) -> int:
    """The fewest characters a text needs: each split must hold one window of block_size + 1.

    The validation split is the last ``val_fraction`` of the text, so the text needs
    ``ceil((block_size + 1) / min(val_fraction, 1 - val_fraction))`` characters; 1290 for
    block_size 128 and val_fraction 0.1.
    """
    return math.ceil((block_size + 1) / min(val_fraction, 1.0 - val_fraction) - 1e-9)


def split_by_position(ids: torch.Tensor, block_size: int, val_fraction: float = 0.1):
    """Split ``ids (N,)`` into ``(train (N - n_val,), val (n_val,))``, val = the last part.

    ``n_val = round(N * val_fraction)``. Raises ``UserError`` saying how many characters are
    needed when either split is shorter than ``block_size + 1``.
    """
    n = len(ids)
    need = min_chars(block_size, val_fraction)
    n_val = round(n * val_fraction)
    if n < need or n_val < block_size + 1 or n - n_val < block_size + 1:
        raise UserError(f"the text has {n} characters; training with block_size {block_size} "
                        f"and a {val_fraction:.0%} validation split needs at least {need}")
    return ids[: n - n_val], ids[n - n_val:]


def nats_to_bits(nats: float) -> float:
    """Cross-entropy in nats -> bits (divide by ln 2)."""
    return nats / math.log(2.0)


def uniform_nats(n_vocab: int) -> float:
    """Cross-entropy of the uniform model: ln n_vocab nats per character."""
    return math.log(n_vocab)


def unigram_nats(train, val, n_vocab: int, alpha: float = 1.0) -> float:
    """Mean -log p(x) over ``val``, p from add-``alpha`` character counts of ``train`` (float64)."""
    counts = np.bincount(np.asarray(train), minlength=n_vocab) + alpha
    p = counts / counts.sum()
    return float(-np.log(p[np.asarray(val)]).mean())


def bigram_nats(train, val, n_vocab: int, alpha: float = 0.1) -> float:
    """Mean -log p(x_t | x_{t-1}) over the ``len(val) - 1`` pairs of ``val`` (float64).

    p(b | a) = (count(a, b) + alpha) / (count(a) + alpha n_vocab), counted on ``train``. alpha = 0.1
    gives the lowest validation loss on the default corpus among 1, 0.3, 0.1, 0.03, 0.01 (2.316
    nats), so the baseline is, if anything, tuned in its own favour.
    """
    train, val = np.asarray(train), np.asarray(val)
    counts = np.full((n_vocab, n_vocab), alpha, dtype=np.float64)  # (n_vocab prev, n_vocab next)
    np.add.at(counts, (train[:-1], train[1:]), 1.0)
    P = counts / counts.sum(axis=1, keepdims=True)
    return float(-np.log(P[val[:-1], val[1:]]).mean())


def baselines(train, val, n_vocab: int) -> dict[str, float]:
    """``{"uniform", "unigram", "bigram"}`` -> validation cross-entropy in nats per character."""
    return {
        "uniform": uniform_nats(n_vocab),
        "unigram": unigram_nats(train, val, n_vocab),
        "bigram": bigram_nats(train, val, n_vocab),
    }


def random_windows(ids: torch.Tensor, batch_size: int, block_size: int,
                   generator: torch.Generator):
    """A batch of random windows: inputs ``x (B, T)`` and next-character targets ``y (B, T)``.

    Start offsets are drawn uniformly from ``generator`` (its state is the data position that a
    checkpoint saves), so a resumed run draws the same batches. B = batch_size, T = block_size.
    """
    starts = torch.randint(0, len(ids) - block_size, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(block_size + 1)  # (B, T + 1)
    windows = ids[offsets]                                     # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]


def val_windows(ids: torch.Tensor, block_size: int, max_windows: int | None = None):
    """Non-overlapping validation windows ``x, y (W, T)``, evenly spread when ``max_windows`` cuts.

    Every window starts its context afresh, so its first characters are predicted from little
    context: this evaluation is slightly pessimistic compared with a sliding window.
    """
    n = (len(ids) - 1) // block_size
    keep = torch.arange(n)
    if max_windows is not None and max_windows < n:
        keep = torch.linspace(0, n - 1, max_windows).round().long()
    offsets = keep[:, None] * block_size + torch.arange(block_size + 1)  # (W, T + 1)
    windows = ids[offsets]                                               # (W, T + 1)
    return windows[:, :-1], windows[:, 1:]
