"""Checks for lesson 04's exercises: the sinusoidal table and a RoPE rotation.

Each check computes the right answer with :mod:`txlearn.positional` and, when the learner's answer
differs, compares it with the catalogued mistakes (tests/catalogue/positional.py) to choose the hint.
"""

import numpy as np

from txlearn.checks import as_array, diagnose, call, expect_close, expect_shape, exercise
from txlearn.positional import apply_rope_np, sinusoidal_encoding_np


SIN_COS_LAYOUT = ("interleave them: sin at the even feature indices 0, 2, 4, ... and cos at the odd "
                  "indices 1, 3, 5, ... (PE[:, 0::2] = sin, PE[:, 1::2] = cos), not concatenated "
                  "[all sins, all coses]")
SIN_EVEN = ("sin goes at the even indices and cos at the odd ones: row 0 must be [0, 1, 0, 1, ...] "
            "(sin 0 = 0, cos 0 = 1)")
FREQUENCY = ("check the frequency exponent: omega_i = 1 / 10000^(2i / d_model) where i = 0 .. "
             "d_model/2 - 1 indexes the pair, so the exponent is the even index 2i over d_model "
             "(not i / d_model, not the odd index, and a negative power of 10000)")


def _concatenated(T, d):
    pe = sinusoidal_encoding_np(T, d)
    return np.concatenate([pe[:, 0::2], pe[:, 1::2]], axis=-1)


def _exponent_wrong(T, d, exponent):
    angles = np.arange(T)[:, None] / 10000.0 ** exponent(np.arange(d // 2), d)
    pe = np.empty((T, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


@exercise("sinusoidal_encoding")
def sinusoidal_encoding(fn):
    for T, d, case in ((2, 4, "T=2, d_model=4"), (50, 8, "T=50, d_model=8"), (7, 16, "T=7, d_model=16")):
        got = call(fn, T, d, case=case)
        expect_shape(got, (T, d), case=case, hint="return the whole table, shape (T, d_model)")
        wrongs = [
            (_concatenated(T, d), SIN_COS_LAYOUT),
            (sinusoidal_encoding_np(T, d).reshape(T, -1, 2)[..., ::-1].reshape(T, d), SIN_EVEN),
            (_exponent_wrong(T, d, lambda i, d: i / d), FREQUENCY),
            (_exponent_wrong(T, d, lambda i, d: (2 * i + 1) / d), FREQUENCY),
            (_exponent_wrong(T, d, lambda i, d: -2 * i / d), FREQUENCY),
        ]
        expected = sinusoidal_encoding_np(T, d)
        if T == 2:  # the golden row of the exercise text: position 1, d_model = 4
            expected_row = [0.841471, 0.540302, 0.010000, 0.999950]
            expect_close(as_array(got, np.float64)[1], expected_row,
                         case=case + ", position 1", atol=1e-6,
                         hint=diagnose(got, wrongs, "position 1 is [sin(1 * omega_0), cos(1 * omega_0), "
                                                     "sin(1 * omega_1), cos(1 * omega_1)]; " + FREQUENCY, atol=1e-5))
        expect_close(got, expected, case=case, atol=1e-6,
                     hint=diagnose(got, wrongs, "compare row 0 (all sin 0 = 0 and cos 0 = 1) and "
                                                 "row 1 with the formula; " + FREQUENCY, atol=1e-5))


ROPE_SIGN = ("rotate by +m*theta_i: (a, b) -> (a cos - b sin, a sin + b cos); your rotation goes the "
             "other way (the sign of the sin terms is swapped)")
ROPE_PAIRING = ("this exercise uses the interleaved pairing: pair i is channels (2i, 2i+1), i.e. "
                "x[..., 0::2] and x[..., 1::2], not the halves (i, i + d/2)")
ROPE_POSITIONS = ("use the `positions` argument for the angles (m = positions[t]), not the row "
                  "index 0 .. T-1")
ROPE_FREQUENCY = ("theta_i = 10000^(-2i/d) with i the pair index 0 .. d/2 - 1: one angle per pair, "
                  "shared by both channels of the pair")


def _rope_wrong_sign(x, positions):
    return apply_rope_np(x, -np.asarray(positions))


def _rope_wrong_frequency(x, positions):
    d = x.shape[-1]
    angles = np.asarray(positions, dtype=np.float64)[:, None] / 10000.0 ** (np.arange(d // 2) / d)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * np.cos(angles) - b * np.sin(angles)
    out[..., 1::2] = a * np.sin(angles) + b * np.cos(angles)
    return out


@exercise("rope_rotation")
def rope_rotation(fn):
    rng = np.random.default_rng(4)
    cases = [
        ("one pair (1, 0) at positions 0 and 1", np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([0, 1])),
        ("d=4 at positions 2 and 5", np.array([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 1.0]]),
         np.array([2, 5])),
        ("T=6, d=8, positions 10..15", rng.normal(size=(6, 8)), np.arange(10, 16)),
    ]
    for case, x, positions in cases:
        got = call(fn, x.copy(), positions.copy(), case=case)
        expect_shape(got, x.shape, case=case, hint="return the rotated array, same shape as x")
        wrongs = [
            (_rope_wrong_sign(x, positions), ROPE_SIGN),
            (apply_rope_np(x, positions, pairing="half"), ROPE_PAIRING),
            (apply_rope_np(x, np.arange(len(x))), ROPE_POSITIONS),
            (_rope_wrong_frequency(x, positions), ROPE_FREQUENCY),
        ]
        expect_close(got, apply_rope_np(x, positions), case=case, atol=1e-6,
                     hint=diagnose(got, wrongs, "rotate each pair (x[2i], x[2i+1]) by the angle "
                                                 "positions[t] * theta_i; " + ROPE_FREQUENCY, atol=1e-5))
