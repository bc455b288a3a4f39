"""Reference and catalogued wrong answers for lesson 04's checks (txlearn/checks/positional.py)."""

import numpy as np


def sinusoidal_ref(T, d_model):
    pos = np.arange(T)[:, None]                                   # (T, 1)
    omega = 1.0 / 10000 ** (np.arange(0, d_model, 2) / d_model)   # (d_model/2,)
    pe = np.zeros((T, d_model))
    pe[:, 0::2] = np.sin(pos * omega)
    pe[:, 1::2] = np.cos(pos * omega)
    return pe


def sinusoidal_concatenated(T, d_model):
    pe = sinusoidal_ref(T, d_model)
    return np.concatenate([np.sin(np.arange(T)[:, None] * 1.0 / 10000 ** (np.arange(0, d_model, 2) / d_model)),
                           pe[:, 1::2]], axis=-1)                 # [sins | coses]


def sinusoidal_exponent_i(T, d_model):
    pos = np.arange(T)[:, None]
    omega = 1.0 / 10000 ** (np.arange(d_model // 2) / d_model)   # i / d instead of 2i / d
    pe = np.zeros((T, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos * omega), np.cos(pos * omega)
    return pe


def sinusoidal_positive_power(T, d_model):
    pos = np.arange(T)[:, None]
    omega = 10000 ** (np.arange(0, d_model, 2) / d_model)         # multiplied instead of divided
    pe = np.zeros((T, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos * omega), np.cos(pos * omega)
    return pe


def sinusoidal_cos_first(T, d_model):
    pe = sinusoidal_ref(T, d_model)
    return pe.reshape(T, -1, 2)[..., ::-1].reshape(T, d_model)    # cos at even, sin at odd


def rope_ref(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)                  # (d/2,)
    angle = np.asarray(positions)[:, None] * theta                # (T, d/2)
    a, b = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x, dtype=np.float64)
    out[:, 0::2] = a * np.cos(angle) - b * np.sin(angle)
    out[:, 1::2] = a * np.sin(angle) + b * np.cos(angle)
    return out


def rope_wrong_sign(x, positions):
    return rope_ref(x, -np.asarray(positions))


def rope_half_pairing(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)
    angle = np.asarray(positions)[:, None] * theta
    a, b = x[:, : d // 2], x[:, d // 2:]
    return np.concatenate([a * np.cos(angle) - b * np.sin(angle),
                           a * np.sin(angle) + b * np.cos(angle)], axis=-1)


def rope_ignores_positions(x, positions):
    return rope_ref(x, np.arange(len(x)))


def rope_per_pair_index(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-np.arange(d // 2) / d)                    # i/d instead of 2i/d
    angle = np.asarray(positions)[:, None] * theta
    a, b = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x, dtype=np.float64)
    out[:, 0::2] = a * np.cos(angle) - b * np.sin(angle)
    out[:, 1::2] = a * np.sin(angle) + b * np.cos(angle)
    return out


REFERENCE = {
    "sinusoidal_encoding": (sinusoidal_ref,),
    "rope_rotation": (rope_ref,),
}

WRONG = {
    "sinusoidal_encoding": [
        ("sin and cos concatenated", (sinusoidal_concatenated,), "interleave"),
        ("exponent i/d", (sinusoidal_exponent_i,), "frequency exponent"),
        ("positive power of 10000", (sinusoidal_positive_power,), "frequency exponent"),
        ("cos at even indices", (sinusoidal_cos_first,), "sin 0 = 0"),
    ],
    "rope_rotation": [
        ("rotation the wrong way", (rope_wrong_sign,), "other way"),
        ("half-split pairing", (rope_half_pairing,), "interleaved pairing"),
        ("row index instead of positions", (rope_ignores_positions,), "`positions` argument"),
        ("frequency exponent i/d", (rope_per_pair_index,), "theta_i = 10000^(-2i/d)"),
    ],
}
