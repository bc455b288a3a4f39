"""Batched generation with left padding (issue 26), for lesson 09's CharTransformer and lesson
10's LlamaDecoder, and ``txlearn sample`` with several prompts.

The report: ``forward`` and ``generate`` took no padding mask, so prompts of different lengths
could not be generated together. Expected: prompts left-padded into one batch, the padding mask
passed into the layers (padding never attended to) and each row's positions counted from its
first real token, give every prompt exactly what it gives alone. The oracle is the same model
run on each prompt alone (no padding at all).
"""

import pytest
import torch

from txlearn.masks import left_padding_mask, left_padding_mask_np, positions_from_padding
from txlearn.models.char_lm import CharTransformer
from txlearn.models.llama import LlamaConfig, LlamaDecoder
from txlearn.training.generate import generate

PROMPTS = [[5, 1, 7, 3, 3, 9, 2], [4], [8, 8, 2, 6]]          # lengths 7, 1, 4


def _char_lm(fused):
    torch.manual_seed(0)
    return CharTransformer(11, d_model=16, n_heads=2, n_layers=2, d_ff=32, block_size=12,
                           fused=fused).eval()


def _llama(factor=1.0):
    torch.manual_seed(0)
    config = LlamaConfig(n_vocab=11, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24,
                         context=64, rope_scaling_factor=factor)
    model = LlamaDecoder(config).eval()
    with torch.no_grad():
        model.embed.W_E.normal_(0, 1.0)           # logits far from uniform: few near-ties
    return model


MODELS = {"char_lm teaching": lambda: _char_lm(False), "char_lm fused": lambda: _char_lm(True),
          "llama": _llama, "llama rope x2": lambda: _llama(2.0)}


def test_left_padding_mask_and_positions():
    """Real tokens at the end of each row; positions 0, 1, ... from each row's first real one."""
    mask = left_padding_mask([3, 1, 0], 4)
    assert mask.tolist() == [[False, True, True, True], [False, False, False, True],
                             [False] * 4]
    assert (mask.numpy() == left_padding_mask_np([3, 1, 0], 4)).all()
    assert positions_from_padding(mask).tolist() == [[0, 0, 1, 2], [0, 0, 0, 0], [0, 0, 0, 0]]
    full = torch.ones(2, 5, dtype=torch.bool)
    assert positions_from_padding(full).tolist() == [list(range(5))] * 2


@pytest.mark.parametrize("name", MODELS)
def test_padded_forward_equals_each_prompt_alone(name):
    """The logits of every real token of a left-padded batch are those of its prompt alone."""
    model = MODELS[name]()
    S = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (S - len(p)) + p for p in PROMPTS])           # (3, 7)
    mask = left_padding_mask([len(p) for p in PROMPTS], S)
    with torch.no_grad():
        batch = model(ids, key_padding_mask=mask)                           # (3, 7, n_vocab)
        for r, p in enumerate(PROMPTS):
            alone = model(torch.tensor([p]))[0]                             # (len(p), n_vocab)
            torch.testing.assert_close(batch[r, S - len(p):], alone, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(batch).all()                      # padding rows: finite, unused


@pytest.mark.parametrize("name, use_cache", [("char_lm fused", True), ("char_lm teaching", False),
                                             ("llama rope x2", True), ("llama", False)])
def test_batched_generation_equals_generating_each_prompt_alone(name, use_cache):
    """Greedy and seeded sampling (each row its own generator with the seed): 14 new tokens,
    past the char model's block_size of 12, so rows restart their windows at different steps
    (row 0 after 6 new tokens, row 2 after 9, row 1 after 12)."""
    model = MODELS[name]()
    for settings in ({"temperature": 0.0}, {"temperature": 1.0, "top_k": 5, "seed": 3}):
        together = generate(model, PROMPTS, 14, use_cache=use_cache, **settings)
        assert isinstance(together, list) and len(together) == 3
        for p, got in zip(PROMPTS, together):
            alone = generate(model, p, 14, use_cache=use_cache, **settings)
            assert got.tolist() == alone.tolist(), (name, settings, p)


def test_a_stopped_row_ends_at_its_stop_id():
    """stop_ids end each row where it generated one; the others go on."""
    model = _llama()
    free = generate(model, PROMPTS, 12, temperature=0.0)
    stop = free[0][len(PROMPTS[0]) + 2].item()             # row 0's third new token
    got = generate(model, PROMPTS, 12, temperature=0.0, stop_ids=(stop,))
    for p, g in zip(PROMPTS, got):
        assert g.tolist() == generate(model, p, 12, temperature=0.0, stop_ids=(stop,)).tolist()
    assert len(got[0]) <= len(PROMPTS[0]) + 3


def test_bad_batches_are_clear_errors():
    model = _llama()
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(model, [[1, 2], []], 3)
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(B, S\) = \(1, 3\)"):
        model(torch.tensor([[1, 2, 3]]), key_padding_mask=torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(B, S_past \+ T\) = \(1, 3\)"):
        _char_lm(True)(torch.tensor([[1, 2, 3]]),
                       key_padding_mask=torch.ones(1, 4, dtype=torch.bool))
