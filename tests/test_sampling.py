"""Tests of txlearn.sampling, the course's one sampler: greedy, temperature, top-k, top-p, seeds.

Oracles: the float64 NumPy reference written as a loop (next_token_distribution_np), hand-worked
distributions, and empirical frequencies of many seeded draws."""

import math

import numpy as np
import pytest
import torch

from txlearn.sampling import (apply_repetition_penalty, apply_repetition_penalty_np, check_settings,
                              next_token_distribution, next_token_distribution_np, sample_next)


# ---- temperature ------------------------------------------------------------------------------

def test_temperature_zero_is_greedy_with_the_first_maximum():
    logits = torch.tensor([1.0, 3.0, 0.5, 3.0])
    assert int(sample_next(logits, temperature=0)) == 1          # first of the tied maxima
    p = next_token_distribution(logits, temperature=0, top_k=3, top_p=0.1)
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]
    batch = torch.tensor([[0.0, 2.0, 1.0], [5.0, 5.0, -1.0]])
    assert sample_next(batch, temperature=0).tolist() == [1, 0]


def test_tiny_positive_temperature_behaves_as_greedy():
    # logits / 1e-39 overflows float32 (the old sampler raised from multinomial); the shift by
    # the maximum keeps every exponent <= 0
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 30, generator=g)
    for t in (1e-39, 1e-300, 1e-320, 1e-6):   # 1e-320: a float64 subnormal
        ids = sample_next(logits, temperature=t, generator=g)
        assert torch.equal(ids, logits.argmax(dim=-1)), t
        p = next_token_distribution(logits[0], temperature=t)
        assert float(p.max()) == 1.0


def test_temperature_scales_the_logits():
    logits = torch.tensor([0.0, math.log(3.0)])
    p = next_token_distribution(logits, temperature=1.0)
    torch.testing.assert_close(p, torch.tensor([0.25, 0.75], dtype=torch.float64))
    p2 = next_token_distribution(logits, temperature=2.0)                  # sqrt(3) : 1
    expected = torch.tensor([1.0, math.sqrt(3.0)], dtype=torch.float64) / (1 + math.sqrt(3.0))
    torch.testing.assert_close(p2, expected)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), -1e-30, "hot", None])
def test_bad_temperature_is_a_clear_value_error(bad):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        sample_next(torch.zeros(4), temperature=bad)


def test_bad_top_k_top_p_and_logits():
    with pytest.raises(ValueError, match="top_k must be a whole number >= 1"):
        next_token_distribution(torch.zeros(4), top_k=0)
    with pytest.raises(ValueError, match="top_k"):
        next_token_distribution(torch.zeros(4), top_k=2.5)
    for p in (0, -0.1, 1.01, float("nan")):
        with pytest.raises(ValueError, match=r"top_p must lie in \(0, 1\]"):
            next_token_distribution(torch.zeros(4), top_p=p)
    with pytest.raises(ValueError, match="all -inf"):
        next_token_distribution(torch.full((3,), float("-inf")))
    with pytest.raises(ValueError, match="NaN"):
        next_token_distribution(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="vocabulary axis"):
        next_token_distribution(torch.zeros(0))
    check_settings(0.7, 5, 0.9)   # valid settings pass silently


# ---- top-k ------------------------------------------------------------------------------------

def test_top_k_keeps_exactly_k_with_ties_broken_by_lowest_index():
    logits = torch.tensor([2.0, 1.0, 1.0, 1.0, 0.0])
    p = next_token_distribution(logits, top_k=2)
    assert (p > 0).tolist() == [True, True, False, False, False]            # index 1 wins the tie
    e = math.exp(1.0)
    torch.testing.assert_close(p[:2], torch.tensor([e, 1.0], dtype=torch.float64) / (e + 1))
    p3 = next_token_distribution(logits, top_k=3)
    assert (p3 > 0).tolist() == [True, True, True, False, False]
    assert int((next_token_distribution(torch.zeros(7), top_k=4) > 0).sum()) == 4


def test_top_k_one_is_greedy_and_large_k_keeps_all():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(20, 11, generator=g)
    assert torch.equal(sample_next(logits, temperature=1.5, top_k=1, generator=g),
                       logits.argmax(-1))
    full = next_token_distribution(logits, top_k=11)
    torch.testing.assert_close(full, torch.softmax(logits.double(), -1))
    torch.testing.assert_close(next_token_distribution(logits, top_k=1000), full)


# ---- top-p ------------------------------------------------------------------------------------

def test_top_p_keeps_the_smallest_set_that_reaches_p_including_the_crossing_token():
    probs = torch.tensor([0.1, 0.5, 0.3, 0.1], dtype=torch.float64)
    logits = probs.log()
    # sorted: 0.5, 0.3, 0.1 (index 0), 0.1 (index 3)
    assert (next_token_distribution(logits, top_p=0.5) > 0).tolist() == [False, True, False, False]
    assert (next_token_distribution(logits, top_p=0.6) > 0).tolist() == [False, True, True, False]
    assert (next_token_distribution(logits, top_p=0.79) > 0).tolist() == [False, True, True, False]
    assert (next_token_distribution(logits, top_p=0.81) > 0).tolist() == [True, True, True, False]
    p = next_token_distribution(logits, top_p=0.6)
    torch.testing.assert_close(p, torch.tensor([0, 0.625, 0.375, 0], dtype=torch.float64))


def test_top_p_one_keeps_everything_even_tiny_probabilities():
    logits = torch.tensor([0.0, -40.0, -60.0, 30.0])        # 1 - eps mass on one token
    p = next_token_distribution(logits, top_p=1.0)
    assert bool((p > 0).all())
    torch.testing.assert_close(p, torch.softmax(logits.double(), -1))


def test_top_p_applies_after_temperature_and_combines_with_top_k():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0], dtype=torch.float64)
    # at t = 1 the top token has 0.636 of the mass: top_p = 0.6 keeps it alone; at t = 4 the
    # distribution is flatter and 0.6 needs three tokens
    assert int((next_token_distribution(logits, 1.0, top_p=0.6) > 0).sum()) == 1
    assert int((next_token_distribution(logits, 4.0, top_p=0.6) > 0).sum()) == 3
    # top-k first (3 survive, renormalised), then top-p on what survived
    p = next_token_distribution(logits, 4.0, top_k=2, top_p=0.99)
    assert (p > 0).tolist() == [True, True, False, False, False]


@pytest.mark.parametrize("seed", range(6))
def test_matches_the_numpy_reference(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, size=40)
    logits[rng.integers(0, 40, size=5)] = 1.25              # ties
    for temperature in (0, 0.3, 1.0, 2.5):
        for top_k in (None, 1, 5, 40):
            for top_p in (None, 0.05, 0.5, 0.9, 1.0):
                got = next_token_distribution(torch.tensor(logits), temperature, top_k, top_p)
                ref = next_token_distribution_np(logits, temperature, top_k, top_p)
                np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12, atol=1e-15,
                                           err_msg=f"{temperature}, {top_k}, {top_p}")


def test_low_precision_logits():
    logits = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    p = next_token_distribution(logits, temperature=0.5)
    assert p.dtype == torch.float64
    torch.testing.assert_close(p, torch.softmax(torch.tensor([2.0, 4.0, 6.0], dtype=torch.float64), -1))


# ---- drawing ----------------------------------------------------------------------------------

def test_a_seeded_generator_gives_the_same_draws():
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(3))
    a = [sample_next(logits, 0.9, 20, 0.95, torch.Generator().manual_seed(7)) for _ in range(3)]
    assert all(torch.equal(a[0], x) for x in a[1:])
    g = torch.Generator().manual_seed(7)
    first, second = sample_next(logits, generator=g), sample_next(logits, generator=g)
    assert not torch.equal(first, second)          # the generator advances


def test_draws_follow_the_distribution_and_never_leave_the_kept_set():
    logits = torch.tensor([0.0, 1.0, 2.0, 0.5, -3.0]).expand(40_000, 5)
    p = next_token_distribution(logits[0], top_k=3, top_p=0.9)
    ids = sample_next(logits, top_k=3, top_p=0.9, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(ids, minlength=5).double() / len(ids)
    assert set(ids.unique().tolist()) == {int(i) for i in torch.nonzero(p).flatten()}
    # 40,000 draws: a standard error below 0.0025 per entry; 4 standard errors
    torch.testing.assert_close(freq, p, atol=0.01, rtol=0)


# ---- repetition penalty (issue 26) -------------------------------------------------------------

def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    """The reports' hard-won rule: for a token already in the sequence, a positive logit is
    divided by the penalty and a negative one multiplied, so the token always loses
    probability (dividing a negative logit, CTRL's formula read literally, raises it)."""
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 0.0])
    got = apply_repetition_penalty(logits, [0, 1, 1, 4], 2.0)   # token 1 twice: penalised once
    assert got.tolist() == [1.0, -2.0, 0.5, -3.0, 0.0]
    np.testing.assert_array_equal(apply_repetition_penalty_np(logits.numpy(), [0, 1, 1, 4], 2.0),
                                  got.numpy())
    before = next_token_distribution(logits)
    after = next_token_distribution(got)
    assert after[1] < before[1] and after[0] < before[0]          # both repeated tokens lose
    assert torch.equal(apply_repetition_penalty(logits, [0, 1], 1.0), logits)
    assert torch.equal(apply_repetition_penalty(logits, torch.tensor([], dtype=torch.long), 3.0),
                       logits)


def test_repetition_penalty_matches_the_loop_reference():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(30, generator=g, dtype=torch.float64) * 3
        previous = torch.randint(0, 30, (12,), generator=g)
        theta = float(torch.rand((), generator=g, dtype=torch.float64)) * 2 + 0.5
        np.testing.assert_allclose(apply_repetition_penalty(logits, previous, theta).numpy(),
                                   apply_repetition_penalty_np(logits.numpy(), previous, theta),
                                   rtol=1e-15)


def test_bad_repetition_penalty_and_ids():
    for bad in (0, -1.2, float("nan"), float("inf"), "x"):
        with pytest.raises(ValueError, match="repetition_penalty must be a finite number > 0"):
            apply_repetition_penalty(torch.zeros(3), [0], bad)
    with pytest.raises(ValueError, match=r"previous ids must lie in \[0, 3\).*got 0 \.\. 5"):
        apply_repetition_penalty(torch.zeros(3), [0, 5], 1.2)
    with pytest.raises(ValueError, match="one row"):
        apply_repetition_penalty_np(np.zeros((2, 3)), [0], 1.2)


def test_generate_applies_the_penalty_to_prompt_and_generated_ids():
    """generate(..., repetition_penalty=theta) at temperature 0 picks, each step, the argmax of
    the penalised logits over every id of the sequence so far (a loop written here)."""
    from txlearn.models.char_lm import CharTransformer
    from txlearn.training.generate import generate

    torch.manual_seed(1)
    model = CharTransformer(9, 16, 2, 1, 32, block_size=16).eval()
    ids = [1, 2, 3]
    with torch.no_grad():
        for _ in range(10):
            z = model(torch.tensor([ids]))[0, -1].double().numpy()
            ids.append(int(np.argmax(apply_repetition_penalty_np(z, ids, 1.8))))
    got = generate(model, [1, 2, 3], 10, temperature=0.0, repetition_penalty=1.8)
    assert got.tolist() == ids
    assert got.tolist() != generate(model, [1, 2, 3], 10, temperature=0.0).tolist()
