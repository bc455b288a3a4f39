"""Reference answers and catalogued wrong answers for set 04's checks (txlearn/checks/positional.py),
written the way a learner writes them (PyTorch)."""

import torch

from tests.catalogue.heads import MHA_REF


# ------------------------------------------------------------------ sinusoidal_table

def pe_ref(T, d_model):
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(T, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * omega)
    pe[:, 1::2] = torch.cos(pos * omega)
    return pe.float()


def pe_halves(T, d_model):
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return torch.cat([torch.sin(pos * omega), torch.cos(pos * omega)], dim=-1).float()


def pe_swapped(T, d_model):
    return pe_ref(T, d_model).reshape(T, -1, 2).flip(-1).reshape(T, d_model)


def pe_pair_index(T, d_model):
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (-torch.arange(d_model // 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(T, d_model)
    pe[:, 0::2] = torch.sin(pos * omega).float()
    pe[:, 1::2] = torch.cos(pos * omega).float()
    return pe


def pe_loop_per_feature(T, d_model):
    pe = torch.zeros(T, d_model)
    for pos in range(T):
        for j in range(d_model):
            angle = torch.tensor(pos / 10000.0 ** (j / d_model))
            pe[pos, j] = torch.sin(angle) if j % 2 == 0 else torch.cos(angle)
    return pe


def pe_positive_exponent(T, d_model):
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    omega = 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(T, d_model)
    pe[:, 0::2] = torch.sin(pos * omega).float()
    pe[:, 1::2] = torch.cos(pos * omega).float()
    return pe


def pe_from_one(T, d_model):
    return pe_ref(T + 1, d_model)[1:]


def pe_float64(T, d_model):
    return pe_ref(T, d_model).double()


def pe_transposed(T, d_model):
    return pe_ref(T, d_model).T


# ------------------------------------------------------------------ rope

def _theta(d, exponent=2.0):
    return 10000.0 ** (-exponent * torch.arange(d // 2, dtype=torch.float64) / d)


def rope_ref(x, positions):
    angle = positions.double()[:, None] * _theta(x.shape[-1])
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def rope_float32_angles(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angle = positions.float()[:, None] * theta
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def rope_half(x, positions):
    d = x.shape[-1]
    angle = positions.double()[:, None] * _theta(d)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def rope_backwards(x, positions):
    return rope_ref(x, -positions)


def rope_exponent_i(x, positions):
    angle = positions.double()[:, None] * _theta(x.shape[-1], exponent=1.0)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def rope_ignores_positions(x, positions):
    return rope_ref(x, torch.arange(x.shape[-2]))


def rope_concat_back(x, positions):
    angle = positions.double()[:, None] * _theta(x.shape[-1])
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def rope_float64(x, positions):
    angle = positions[:, None] * _theta(x.shape[-1])
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * torch.cos(angle) - b * torch.sin(angle),
                        a * torch.sin(angle) + b * torch.cos(angle)], dim=-1).flatten(-2)


# ------------------------------------------------------------------ rotary_attention

def rotary_class(rotate=lambda Q, K, positions: (rope_ref(Q, positions), rope_ref(K, positions)),
                 positions=lambda start, L: torch.arange(start, start + L)):
    class RotaryAttention(MHA_REF):
        def apply_positions(self, Q, K, start):
            return rotate(Q, K, positions(start, Q.shape[-2]))
    return RotaryAttention


REFERENCE = {
    "sinusoidal_table": (pe_ref,),
    "rope": (rope_ref,),
    "rotary_attention": (rotary_class(),),
}

WRONG = {
    "sinusoidal_table": [
        ("all sines, then all cosines", (pe_halves,), "all the sines first"),
        ("cos at even indices", (pe_swapped,), "sin and cos are swapped"),
        ("exponent i / d_model", (pe_pair_index,), "exponent is i / d_model"),
        ("a loop with each feature's own index", (pe_loop_per_feature,), "own (odd) index"),
        ("positive exponent", (pe_positive_exponent,), "the frequencies grow"),
        ("positions from 1", (pe_from_one,), "first row is position 1"),
        ("float64 table", (pe_float64,), "return .float()"),
        ("transposed table", (pe_transposed,), "transposed"),
    ],
    "rope": [
        ("half-split pairing", (rope_half,), "half-split pairing"),
        ("rotates the other way", (rope_backwards,), "goes the other way"),
        ("exponent i / d", (rope_exponent_i,), "exponent is i / d"),
        ("ignores the positions", (rope_ignores_positions,), "not by positions[t]"),
        ("pairs put back as halves", (rope_concat_back,), "all the a' first"),
        ("float64 result for float32 input", (rope_float64,), "x.dtype"),
        ("angles in float32 (learner 23)", (rope_float32_angles,), "angles computed in float32"),
    ],
    "rotary_attention": [
        ("rotates Q only", (rotary_class(rotate=lambda Q, K, p: (rope_ref(Q, p), K)),),
         "returned K unrotated"),
        ("rotates K only", (rotary_class(rotate=lambda Q, K, p: (Q, rope_ref(K, p))),),
         "returned Q unrotated"),
        ("one position for every row", (rotary_class(positions=lambda s, L: torch.full((L,), s)),),
         "same position changes no score"),
        ("K rotated backwards", (rotary_class(rotate=lambda Q, K, p: (rope_ref(Q, p), rope_ref(K, -p))),),
         "minus its positions"),
        ("returns (K, Q)", (rotary_class(rotate=lambda Q, K, p: (rope_ref(K, p), rope_ref(Q, p))),),
         "returned (K, Q)"),
        ("positions ignore the cache", (rotary_class(positions=lambda s, L: torch.arange(L)),),
         "ignores start"),
        ("positions counted from 1 (learner 23)",
         (rotary_class(positions=lambda s, L: torch.arange(s + 1, s + L + 1)),),
         "one position too far"),
    ],
}

_OK = {"apply_rope": rope_ref, "MultiHeadAttention": MHA_REF}
DEPENDENT = {
    "rotary_attention": [
        ("its own apply_rope pairs halves", (rotary_class(rotate=lambda Q, K, p: (rope_half(Q, p), rope_half(K, p))),),
         dict(_OK, apply_rope=rope_half), "fix rope first"),
    ],
}
