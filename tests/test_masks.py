"""Masks: causal (bottom-right aligned), padding, combination, polarity conversions."""

import numpy as np
import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

from txlearn.masks import (
    causal_mask,
    causal_mask_np,
    combine_masks,
    from_torch_key_padding_mask,
    key_padding_to_attn_mask,
    padding_mask,
    padding_mask_np,
    to_additive,
)


def test_causal_mask_4_is_lower_triangle_with_diagonal():
    expected = torch.tensor([[1, 0, 0, 0],
                             [1, 1, 0, 0],
                             [1, 1, 1, 0],
                             [1, 1, 1, 1]], dtype=torch.bool)
    got = causal_mask(4)
    assert got.dtype == torch.bool
    assert torch.equal(got, expected)


def test_causal_mask_2_by_5_golden():
    # the last two queries of a 5-token sequence: the last one sees all 5 keys
    expected = torch.tensor([[1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(2, 5), expected)


@pytest.mark.parametrize("L,S", [(1, 1), (3, 3), (1, 6), (2, 5), (4, 9), (5, 3), (7, 7)])
def test_causal_mask_matches_causal_lower_right(L, S):
    oracle = causal_lower_right(L, S)._materialize()
    assert torch.equal(causal_mask(L, S), oracle)
    np.testing.assert_array_equal(causal_mask_np(L, S), oracle.numpy())


@pytest.mark.parametrize("T", [1, 2, 6])
def test_square_causal_mask_matches_torch_tril(T):
    assert torch.equal(causal_mask(T), torch.ones(T, T).tril().bool())


def test_causal_mask_differs_from_top_left_when_L_less_than_S():
    top_left = torch.ones(2, 5, dtype=torch.bool).tril()
    assert not torch.equal(causal_mask(2, 5), top_left)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_causal_mask_rejects_bad_lengths(bad):
    with pytest.raises(ValueError, match="positive integer"):
        causal_mask(bad)
    with pytest.raises(ValueError, match="positive integer"):
        causal_mask_np(3, bad)


def test_padding_mask_golden_and_numpy():
    expected = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)
    got = padding_mask([3, 1, 4], 4)
    assert got.dtype == torch.bool and got.shape == (3, 4)
    np.testing.assert_array_equal(got.numpy(), expected)
    np.testing.assert_array_equal(padding_mask_np(np.array([3, 1, 4]), 4), expected)
    np.testing.assert_array_equal(padding_mask(torch.tensor([3, 1, 4]), 4).numpy(), expected)


def test_padding_mask_rejects_bad_lengths():
    with pytest.raises(ValueError, match="S=4"):
        padding_mask([5, 2], 4)
    with pytest.raises(ValueError, match=r"\[0, S=4\]"):
        padding_mask([-1], 4)
    with pytest.raises(ValueError, match="integers"):
        padding_mask([1.5], 4)


def test_combine_masks_is_logical_and_with_broadcast():
    causal = causal_mask(4)  # (4, 4)
    pad = key_padding_to_attn_mask(padding_mask([2, 4], 4))  # (2, 1, 1, 4)
    combined = combine_masks(causal, None, pad)
    assert combined.shape == (2, 1, 4, 4)
    expected_b0 = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=bool)
    np.testing.assert_array_equal(combined[0, 0].numpy(), expected_b0)
    np.testing.assert_array_equal(combined[1, 0].numpy(), causal.numpy())
    assert combine_masks(None, None) is None


def test_combine_masks_errors_name_shapes_and_dtype():
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(2, 5\)"):
        combine_masks(torch.ones(3, 4, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="float32"):
        combine_masks(torch.zeros(3, 3))


def test_polarity_conversion_and_additive_form():
    ours = padding_mask([2], 3)  # [[True, True, False]]
    theirs = from_torch_key_padding_mask(ours)
    np.testing.assert_array_equal(theirs.numpy(), [[False, False, True]])
    assert torch.equal(from_torch_key_padding_mask(theirs), ours)
    additive = to_additive(ours)
    assert additive.dtype == torch.float32
    assert additive[0, 0].item() == 0.0 and additive[0, 1].item() == 0.0
    assert additive[0, 2].item() == float("-inf")
    with pytest.raises(ValueError, match="boolean"):
        to_additive(additive)
    with pytest.raises(ValueError, match=r"\(5,\)"):
        key_padding_to_attn_mask(torch.ones(5, dtype=torch.bool))
