"""Tests of txlearn.training.data: corpus loading, the character vocabulary, the split and the baselines."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from txlearn.training.data import (CharVocab, UserError, baselines, bigram_nats, load_corpus, min_chars,
                                   nats_to_bits, random_windows, split_by_position, unigram_nats,
                                   val_windows)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_default_corpus_is_the_language_reference(corpus):
    # the issue: "about 465,000 characters" of pydoc_data topics
    assert 440_000 < len(corpus) < 530_000   # the topics grow: 465,000 on Python 3.11, 511,000 on 3.13
    assert "The for statement" in corpus or "for_stmt" in corpus or "for" in corpus
    assert 80 <= len(CharVocab.from_text(corpus)) <= 130


def test_default_baselines_golden(corpus):
    vocab = CharVocab.from_text(corpus)
    train, val = split_by_position(vocab.encode(corpus), 128)
    base = baselines(train, val, len(vocab))
    assert base["uniform"] == pytest.approx(math.log(len(vocab)), abs=1e-12)
    # measured on Python 3.11's pydoc_data: unigram 3.238, bigram 2.316 nats/char
    assert base["unigram"] == pytest.approx(3.238, abs=0.05)
    assert base["bigram"] == pytest.approx(2.316, abs=0.05)
    assert base["bigram"] < base["unigram"] < base["uniform"]


def test_file_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_corpus(tmp_path / "missing.txt")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf".encode() + "\xe9 au lait".encode("latin-1"))
    with pytest.raises(UserError, match=r"not UTF-8 .*offset 3"):
        load_corpus(bad)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(UserError, match="empty"):
        load_corpus(empty)
    good = tmp_path / "ok.txt"
    good.write_text("héllo\n", encoding="utf-8")
    assert load_corpus(good) == "héllo\n"


def test_vocab_round_trip_and_unknown_characters():
    vocab = CharVocab.from_text("hello world")
    assert vocab.chars == " dehlorw"
    ids = vocab.encode("world hello")
    assert ids.dtype == torch.long and ids.tolist() == [7, 5, 6, 4, 1, 0, 3, 2, 4, 4, 5]
    assert vocab.decode(ids) == "world hello"
    with pytest.raises(UserError, match=r"2 character\(s\) .*'!z'"):
        vocab.encode("hello z!")


@pytest.mark.parametrize("ids, bad", [([-1], -1), ([0, -3], -3), (torch.tensor([1, -1]), -1),
                                      ([2, 8], 8), (torch.tensor([9]), 9)])
def test_an_id_outside_the_vocabulary_is_refused_naming_it(ids, bad):
    """The report: ``CharVocab.decode([-1])`` returned the last character (Python's negative
    indexing), and so did ``[0, -3]`` and ``tensor([1, -1])``. Expected: an id outside
    0 .. len - 1 raises, naming the id; ids inside decode as before."""
    vocab = CharVocab.from_text("hello world")                  # 8 characters: ids 0 to 7
    with pytest.raises(UserError, match=rf"^id {bad} is not in the model's vocabulary of 8 "):
        vocab.decode(ids)
    assert vocab.decode(torch.tensor([7, 0])) == "w " and vocab.decode([]) == ""


def test_min_chars_and_split_by_position():
    assert min_chars(128, 0.1) == 1290          # ceil(129 / 0.1)
    assert min_chars(8, 0.5) == 18
    ids = torch.arange(2000)
    train, val = split_by_position(ids, 128)
    assert len(train) == 1800 and len(val) == 200
    assert torch.equal(torch.cat([train, val]), ids)   # by position, nothing shuffled
    with pytest.raises(UserError, match=r"has 1289 characters.*at least 1290"):
        split_by_position(torch.arange(1289), 128)
    train, val = split_by_position(torch.arange(1290), 128)
    assert len(val) == 129


def test_bigram_hand_example_golden():
    # train 0 1 0 1 0: count(0->1) = 2, count(1->0) = 2; p(1|0) = (2 + 0.1) / (2 + 0.2)
    got = bigram_nats([0, 1, 0, 1, 0], [0, 1], n_vocab=2, alpha=0.1)
    assert got == pytest.approx(-math.log(2.1 / 2.2), abs=1e-12)
    assert got == pytest.approx(0.046520, abs=1e-6)


def test_bigram_against_torch_cross_entropy():
    rng = np.random.default_rng(0)
    V = 7
    train, val = rng.integers(0, V, 500), rng.integers(0, V, 80)
    counts = torch.full((V, V), 0.1, dtype=torch.float64)
    for a, b in zip(train[:-1], train[1:]):
        counts[a, b] += 1
    logits = counts.log()[torch.as_tensor(val[:-1])]          # (79, V): unnormalised log p
    expected = F.cross_entropy(logits, torch.as_tensor(val[1:])).item()
    assert bigram_nats(train, val, V) == pytest.approx(expected, abs=1e-12)


def test_unigram_against_entropy():
    # evaluated on its own training text with no smoothing, the unigram loss is the entropy
    text = [0] * 6 + [1] * 3 + [2]
    p = np.array([0.6, 0.3, 0.1])
    entropy = -(p * np.log(p)).sum()
    assert unigram_nats(text, text, 3, alpha=0.0) == pytest.approx(entropy, abs=1e-12)
    assert nats_to_bits(math.log(2)) == pytest.approx(1.0, abs=1e-15)


def test_random_windows_are_shifted_and_reproducible():
    ids = torch.arange(100) * 3
    x, y = random_windows(ids, 4, 10, torch.Generator().manual_seed(1))
    assert x.shape == (4, 10) and y.shape == (4, 10)
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], x[:, -1] + 3)
    x2, _ = random_windows(ids, 4, 10, torch.Generator().manual_seed(1))
    assert torch.equal(x, x2)


def test_val_windows_do_not_overlap():
    ids = torch.arange(105)
    x, y = val_windows(ids, 10)
    assert x.shape == (10, 10)
    assert torch.equal(x.flatten(), torch.arange(100))
    assert torch.equal(y.flatten(), torch.arange(1, 101))
    x, _ = val_windows(ids, 10, max_windows=3)
    assert x[:, 0].tolist() == [0, 40, 90]       # linspace(0, 9, 3) = 0, 4.5, 9; 4.5 rounds to even
