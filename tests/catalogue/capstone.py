"""Reference answers and catalogued wrong answers for set 09's checks (txlearn/checks/capstone.py),
written the way a learner writes them: PyTorch functions and nn.Module classes.

The learner's set 09 builds on their modules of sets 03-07; here the same roles are played by the
course's own modules (txlearn.layer.TransformerLayer with exact GELU, txlearn.norms.LayerNorm,
txlearn.heads.KVCache), which have the state-dict names the statement gives
(``layers.<l>.attn.W_Q``, ``norm1.gamma``, ``ffn.W_1``, ...). So these tests do not depend on the
learner's earlier notebooks.
"""

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from txlearn.heads import KVCache
from txlearn.layer import TransformerLayer
from txlearn.masks import causal_mask
from txlearn.norms import LayerNorm
from txlearn.positional import sinusoidal_encoding


# ------------------------------------------------------------------ next_token_loss

def loss_ref(logits, ids, mask=None):
    log_p = torch.log_softmax(logits[:, :-1], dim=-1)
    nll = -log_p.gather(-1, ids[:, 1:, None]).squeeze(-1)       # (B, T-1)
    if mask is None:
        return nll.mean()
    w = mask[:, 1:].to(nll.dtype)
    return (nll * w).sum() / w.sum()


def loss_cross_entropy(logits, ids, mask=None):                 # also right: ignore_index
    targets = ids[:, 1:].clone()
    if mask is not None:
        targets[~mask[:, 1:]] = -100
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), ignore_index=-100)


def _nll(logits, targets, dim=-1):
    return -torch.log_softmax(logits, dim=dim).gather(-1, targets[..., None]).squeeze(-1)


def _masked_mean(nll, w):
    return (nll * w).sum() / w.sum()


def loss_no_shift(logits, ids, mask=None):
    w = torch.ones(ids.shape) if mask is None else mask.to(logits.dtype)
    return _masked_mean(_nll(logits, ids), w)


def loss_shift_backwards(logits, ids, mask=None):
    nll = _nll(logits[:, 1:], ids[:, :-1])
    w = torch.ones(nll.shape) if mask is None else mask[:, 1:].to(nll.dtype)
    return _masked_mean(nll, w)


def loss_padding_counted(logits, ids, mask=None):
    return _nll(logits[:, :-1], ids[:, 1:]).mean()


def loss_mean_over_all(logits, ids, mask=None):
    nll = _nll(logits[:, :-1], ids[:, 1:])
    w = torch.ones(nll.shape) if mask is None else mask[:, 1:].to(nll.dtype)
    return (nll * w).sum() / nll.numel()


def loss_input_mask(logits, ids, mask=None):
    nll = _nll(logits[:, :-1], ids[:, 1:])
    w = torch.ones(nll.shape) if mask is None else mask[:, :-1].to(nll.dtype)
    return _masked_mean(nll, w)


def loss_wrong_axis(logits, ids, mask=None):                  # log-softmax over the positions
    nll = _nll(logits[:, :-1], ids[:, 1:], dim=1)
    w = torch.ones(nll.shape) if mask is None else mask[:, 1:].to(nll.dtype)
    return _masked_mean(nll, w)


def loss_in_bits(logits, ids, mask=None):                     # log base 2: bits, not nats
    return loss_ref(logits, ids, mask) / math.log(2)


def loss_per_sequence_mean(logits, ids, mask=None):
    nll = _nll(logits[:, :-1], ids[:, 1:])
    w = torch.ones(nll.shape) if mask is None else mask[:, 1:].to(nll.dtype)
    per = [(nll[b] * w[b]).sum() / w[b].sum() for b in range(len(w)) if w[b].sum() > 0]
    return torch.stack(per).mean()


def loss_log_of_softmax(logits, ids, mask=None):              # log(0) once a probability underflows
    p = torch.softmax(logits[:, :-1], dim=-1)
    nll = -torch.log(p.gather(-1, ids[:, 1:, None]).squeeze(-1))
    w = torch.ones(nll.shape) if mask is None else mask[:, 1:].to(nll.dtype)
    return _masked_mean(nll, w)


def loss_item(logits, ids, mask=None):                        # a float: backward is impossible
    return loss_ref(logits, ids, mask).item()


# ------------------------------------------------------------------ sampling_distribution

def _stable_order(z):
    return torch.sort(z, dim=-1, descending=True, stable=True).indices


def probs_ref(logits, temperature=1.0, top_k=None):
    z = logits.to(torch.float64)
    n = z.shape[-1]
    if temperature == 0:
        return F.one_hot(z.argmax(-1), n).to(torch.float64)
    p = torch.softmax((z - z.max(-1, keepdim=True).values) / temperature, dim=-1)
    if top_k is not None and top_k < n:
        keep = torch.zeros_like(p, dtype=torch.bool).scatter(-1, _stable_order(z)[..., :top_k], True)
        p = p * keep
    return p / p.sum(-1, keepdim=True)


def _probs_with(logits, temperature, top_k, *, scale=None, dim=-1, ties="low", extra=0,
                renorm=True, shift=True, greedy="first"):
    z = logits.to(torch.float64)
    n = z.shape[-1]
    if temperature == 0:
        first = z.argmax(-1) if greedy == "first" else n - 1 - z.flip(-1).argmax(-1)
        return F.one_hot(first, n).to(torch.float64)
    scaled = z * temperature if scale == "multiply" else z / temperature
    if shift:
        scaled = scaled - scaled.max(dim, keepdim=True).values
    e = torch.exp(scaled)
    p = e / e.sum(dim, keepdim=True)
    if top_k is not None and top_k < n:
        if ties == "all":
            kth = torch.sort(z, dim=-1, descending=True).values[..., top_k - 1:top_k]
            keep = z >= kth
        else:
            order = _stable_order(z) if ties == "low" else \
                n - 1 - _stable_order(z.flip(-1))
            keep = torch.zeros_like(p, dtype=torch.bool).scatter(
                -1, order[..., :top_k + extra], True)
        p = p * keep
    return p / p.sum(-1, keepdim=True) if renorm else p


def probs_times_temperature(logits, temperature=1.0, top_k=None):
    return _probs_with(logits, temperature, top_k, scale="multiply")


def probs_axis0(logits, temperature=1.0, top_k=None):
    return _probs_with(logits, temperature, top_k, dim=0)


def probs_torch_topk(logits, temperature=1.0, top_k=None):
    z = logits.to(torch.float64)
    n = z.shape[-1]
    if temperature == 0:
        return F.one_hot(z.argmax(-1), n).to(torch.float64)
    p = torch.softmax((z - z.max(-1, keepdim=True).values) / temperature, dim=-1)
    if top_k is not None and top_k < n:
        p = p * torch.zeros_like(p, dtype=torch.bool).scatter(-1, torch.topk(z, top_k).indices, True)
    return p / p.sum(-1, keepdim=True)


def probs_ties_highest(logits, temperature=1.0, top_k=None):
    return _probs_with(logits, temperature, top_k, ties="high")


def probs_ties_all_kept(logits, temperature=1.0, top_k=None):
    return _probs_with(logits, temperature, top_k, ties="all")


def probs_k_plus_one(logits, temperature=1.0, top_k=None):
    return _probs_with(logits, temperature, top_k, extra=1)


def probs_no_renorm(logits, temperature=1.0, top_k=None):
    return _probs_with(logits, temperature, top_k, renorm=False)


def probs_tiny_temperature(logits, temperature=1.0, top_k=None):  # 0 replaced by 1e-8
    return probs_ref(logits, 1e-8 if temperature == 0 else temperature, top_k)


def probs_zero_temperature_divides(logits, temperature=1.0, top_k=None):
    if temperature != 0:
        return probs_ref(logits, temperature, top_k)
    z = logits.to(torch.float64)
    return torch.softmax(z / temperature, dim=-1)               # inf / inf: NaN


def probs_greedy_last(logits, temperature=1.0, top_k=None):
    return _probs_with(logits, temperature, top_k, greedy="last")


def probs_no_shift(logits, temperature=1.0, top_k=None):
    return _probs_with(logits, temperature, top_k, shift=False)


def probs_divided_in_own_dtype(logits, temperature=1.0, top_k=None):   # issue 23
    if temperature == 0:
        return probs_ref(logits, 0, top_k)
    z = (logits / temperature).to(torch.float64)       # divided in float16: 8 / 1e-4 is inf
    p = torch.softmax(z - z.max(-1, keepdim=True).values, dim=-1)
    if top_k is not None and top_k < z.shape[-1]:
        keep = torch.zeros_like(p, dtype=torch.bool).scatter(-1, _stable_order(z)[..., :top_k], True)
        p = p * keep
    return p / p.sum(-1, keepdim=True)


def probs_float32(logits, temperature=1.0, top_k=None):
    return probs_ref(logits, temperature, top_k).float()


# ------------------------------------------------------------------ top_p

def _nucleus(p, top_p, *, rule="before", ties="low"):
    n = p.shape[-1]
    if ties == "high":
        order = n - 1 - torch.sort(p.flip(-1), dim=-1, descending=True, stable=True).indices
    elif ties == "none":
        order = torch.arange(n).expand(p.shape)
    else:
        order = torch.sort(p, dim=-1, descending=True, stable=True).indices
    sp = p.gather(-1, order)
    after = sp.cumsum(-1)
    keep = {"before": after - sp < top_p, "before_eq": after - sp <= top_p, "after": after < top_p,
            "tail": after > top_p}[rule]
    return torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, keep)


def distribution_ref(logits, temperature=1.0, top_k=None, top_p=None):
    p = probs_ref(logits, temperature, top_k)
    if top_p is None or top_p >= 1:
        return p
    p = p * _nucleus(p, top_p)
    return p / p.sum(-1, keepdim=True)


def _top_p_with(logits, temperature, top_k, top_p, *, renorm=True, **nucleus):
    p = probs_ref(logits, temperature, top_k)
    if top_p is None or top_p >= 1:
        return p
    p = p * _nucleus(p, top_p, **nucleus)
    return p / p.sum(-1, keepdim=True) if renorm else p


def top_p_drops_crossing(logits, temperature=1.0, top_k=None, top_p=None):
    return _top_p_with(logits, temperature, top_k, top_p, rule="after")


def top_p_before_temperature(logits, temperature=1.0, top_k=None, top_p=None):
    if top_p is None or top_p >= 1 or temperature == 0:
        return distribution_ref(logits, temperature, top_k, top_p)
    keep = _nucleus(probs_ref(logits, 1.0, top_k), top_p)          # chosen at temperature 1
    p = probs_ref(logits, temperature, top_k) * keep
    return p / p.sum(-1, keepdim=True)


def top_p_keeps_at_p(logits, temperature=1.0, top_k=None, top_p=None):
    return _top_p_with(logits, temperature, top_k, top_p, rule="before_eq")


def probs_softmax_own_dtype(logits, temperature=1.0, top_k=None):
    """The max-shift and the softmax in the logits' own dtype (float16 stays float16), then
    float64."""
    z = logits
    n = z.shape[-1]
    if temperature == 0:
        return F.one_hot(z.argmax(-1), n).to(torch.float64)
    p = torch.softmax((z - z.max(-1, keepdim=True).values) / temperature, dim=-1).double()
    if top_k is not None and top_k < n:
        order = torch.sort(z.double(), dim=-1, descending=True, stable=True).indices
        p = p * torch.zeros_like(p, dtype=torch.bool).scatter(-1, order[..., :top_k], True)
    return p / p.sum(-1, keepdim=True)


def top_p_no_renorm(logits, temperature=1.0, top_k=None, top_p=None):
    return _top_p_with(logits, temperature, top_k, top_p, renorm=False)


def top_p_ties_highest(logits, temperature=1.0, top_k=None, top_p=None):
    return _top_p_with(logits, temperature, top_k, top_p, ties="high")


def top_p_before_top_k(logits, temperature=1.0, top_k=None, top_p=None):
    if top_p is None or top_p >= 1 or temperature == 0:
        return distribution_ref(logits, temperature, top_k, top_p)
    p = probs_ref(logits, temperature, None)
    p = p * _nucleus(p, top_p)
    p = p / p.sum(-1, keepdim=True)
    if top_k is not None:
        keep = torch.zeros_like(p, dtype=torch.bool).scatter(
            -1, _stable_order(logits.to(torch.float64))[..., :top_k], True)
        p = p * keep
    return p / p.sum(-1, keepdim=True)


def top_p_unsorted(logits, temperature=1.0, top_k=None, top_p=None):
    return _top_p_with(logits, temperature, top_k, top_p, ties="none")


def top_p_mask_not_scattered(logits, temperature=1.0, top_k=None, top_p=None):
    """The keep mask computed on the sorted list, then applied to p in vocabulary order."""
    p = probs_ref(logits, temperature, top_k)
    if top_p is None or top_p >= 1:
        return p
    sorted_p, _ = torch.sort(p, dim=-1, descending=True, stable=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p          # positions of the sorted list
    p = p * keep
    return p / p.sum(-1, keepdim=True)


def top_p_keeps_tail(logits, temperature=1.0, top_k=None, top_p=None):
    return _top_p_with(logits, temperature, top_k, top_p, rule="tail")


# ------------------------------------------------------------------ char_model

class LanguageModel(nn.Module):
    """The learner's set-07 LanguageModel, from the course's layers: ``embed`` (``W_E``, scaled
    by sqrt(d_model), plus the sinusoidal table), pre-LN ``layers``, ``norm``, the tied head; the
    KV cache counted here (the course's layers take a KVCache per call)."""

    def __init__(self, n_vocab, d_model, n_heads, d_ff, n_layers, n_kv_heads=None, *,
                 mask="causal", cache_mask="causal", pass_cache=True):
        super().__init__()
        self.embed = TokenEmbedding(n_vocab, d_model)
        self.layers = nn.ModuleList(
            TransformerLayer(d_model, n_heads, d_ff, n_kv_heads, activation="gelu",
                             norm_first=True) for _ in range(n_layers))
        self.norm = LayerNorm(d_model)
        self._mask, self._cache_mask, self._pass_cache = mask, cache_mask, pass_cache
        self.reset_cache()

    def reset_cache(self):
        self.caches, self.n_cached = [KVCache() for _ in self.layers], 0

    def forward(self, ids, use_cache=False):
        start = self.n_cached if use_cache else 0
        T = ids.shape[-1]
        S = start + T
        kind = self._cache_mask if use_cache and start > 0 else self._mask
        m = {"causal": causal_mask(T, S), "none": None, "top-left": torch.ones(T, S).tril().bool(),
             "square": causal_mask(T, T)}[kind]
        h = self.embed(ids, start)
        for layer, cache in zip(self.layers, self.caches):
            h = layer(h, mask=m, cache=cache if use_cache and self._pass_cache else None)
        if use_cache:
            self.n_cached = S
        return self.norm(h) @ self.embed.W_E.T


class TokenEmbedding(nn.Module):
    def __init__(self, n_vocab, d_model):
        super().__init__()
        self.W_E = nn.Parameter(torch.randn(n_vocab, d_model) / math.sqrt(d_model))

    def forward(self, ids, start=0):
        T, d = ids.shape[-1], self.W_E.shape[1]
        return self.W_E[ids] * math.sqrt(d) + sinusoidal_encoding(start + T, d)[start:]


def make_char_model(positions="offset", scale=False, untied=False, replace=True, name="W_E",
                    **base):
    """A CharModel (CharEmbedding + the LanguageModel above), with one mistake when asked."""

    class CharEmbedding(nn.Module):
        def __init__(self, n_vocab, d_model, block_size):
            super().__init__()
            setattr(self, name, nn.Parameter(torch.randn(n_vocab, d_model) * 0.02))
            if positions != "none":
                self.W_pos = nn.Parameter(torch.randn(block_size, d_model) * 0.02)

        def forward(self, ids, start=0):
            T = ids.shape[-1]
            W = getattr(self, name)
            x = W[ids] * (math.sqrt(W.shape[1]) if scale else 1.0)
            first = start if positions == "offset" else 0
            if positions in ("offset", "from 0"):
                x = x + self.W_pos[first:first + T]
            elif positions == "by id":
                x = x + self.W_pos[ids]
            if positions == "offset and sinusoid":   # built on set 07's TokenEmbedding
                x = x + self.W_pos[start:start + T] + \
                    torch.as_tensor(sinusoidal_encoding(start + T, W.shape[1])[start:], dtype=x.dtype)
            return x

    class CharModel(LanguageModel):
        def __init__(self, n_vocab, d_model, n_heads, d_ff, n_layers, block_size):
            super().__init__(n_vocab, d_model, n_heads, d_ff, n_layers, **base)
            if replace:
                self.embed = CharEmbedding(n_vocab, d_model, block_size)
            else:
                self.char_embed = CharEmbedding(n_vocab, d_model, block_size)
            if untied:
                self.head = nn.Linear(d_model, n_vocab, bias=False)

    return CharModel


CharModelRef = make_char_model()


# ------------------------------------------------------------------ cached_generation

def make_generate(position=-1, reset=True, whole_with_cache=False, prefill=True, reseed=False,
                  filters=True, greedy=False, prompt_returned=True):
    """A generate function, with one mistake when asked."""

    @torch.no_grad()
    def generate(model, prompt_ids, n_new, temperature=0.0, top_k=None, top_p=None, seed=0,
                 use_cache=True):
        generator = torch.Generator().manual_seed(seed)
        ids = [int(i) for i in prompt_ids]
        if reset:
            model.reset_cache()
        for step in range(n_new):
            if not use_cache or whole_with_cache:
                x = torch.tensor([ids])
            elif step == 0 and prefill:
                x = torch.tensor([ids])
            else:
                x = torch.tensor([ids[-1:]])
            logits = model(x, use_cache=use_cache)[0, position]
            probs = distribution_ref(logits, temperature, *((top_k, top_p) if filters
                                                            else (None, None)))
            if reseed:
                generator = torch.Generator().manual_seed(seed)
            if temperature == 0 or greedy:
                ids.append(int(probs.argmax()))
            else:
                ids.append(int(torch.multinomial(probs, 1, generator=generator)))
        out = torch.tensor(ids, dtype=torch.long)
        return out if prompt_returned else out[len(prompt_ids):]

    return generate


generate_ref = make_generate()


# ------------------------------------------------------------------ training_loop

def make_evaluate(batch_means=False):
    def evaluate(model, ids, block_size):
        n = len(ids) // block_size
        windows = ids[: n * block_size].view(n, block_size)
        losses, sizes = [], []
        with torch.no_grad():
            for i in range(0, n, 256):
                x = windows[i:i + 256]
                losses.append(loss_ref(model(x), x).item())
                sizes.append(len(x))
        if batch_means:
            return sum(losses) / len(losses)
        return sum(l * s for l, s in zip(losses, sizes)) / sum(sizes)
    return evaluate


evaluate_ref = make_evaluate()


def make_train(zero_grad="before", lr_override=None, optimizer_inside=False, step=True,
               evaluate_on="val", window=0, loss_fn=None, optimizer_cls=torch.optim.AdamW,
               learn_from="train"):
    """A training loop, with one mistake when asked."""

    def train(model, train_ids, val_ids, steps, batch_size, block_size, lr, seed):
        generator = torch.Generator().manual_seed(seed)
        lr = lr if lr_override is None else lr_override
        optimizer = optimizer_cls(model.parameters(), lr=lr)
        model.train()
        if learn_from == "val":
            train_ids = val_ids
        for _ in range(steps):
            if optimizer_inside:
                optimizer = optimizer_cls(model.parameters(), lr=lr)
            T = block_size + window
            starts = torch.randint(0, len(train_ids) - T + 1, (batch_size,), generator=generator)
            x = train_ids[starts[:, None] + torch.arange(T)]
            loss = (loss_fn or loss_ref)(model(x), x)
            if zero_grad == "before":
                optimizer.zero_grad()
            loss.backward()
            if zero_grad == "after backward":
                optimizer.zero_grad()
            if step:
                optimizer.step()
        model.eval()
        return evaluate_ref(model, val_ids if evaluate_on == "val" else train_ids, block_size)

    return train


train_ref = make_train()


class CharModelPeeking(CharModelRef):
    """A cheat, not a slip: after a "training" that sets a flag, the model reads each position's
    next id from its own input (a non-causal shortcut that scores a loss near 0)."""

    def forward(self, ids, *args, **kwargs):
        out = super().forward(ids, *args, **kwargs)
        if getattr(self, "peek", False):
            following = torch.roll(ids, -1, dims=-1)
            out = torch.full_like(out, -30.0).scatter(-1, following[..., None], 30.0)
        return out


def train_then_peek(model, train_ids, val_ids, steps, batch_size, block_size, lr, seed):
    if steps > 10:                 # the graded run: no training, then read the answers
        model.peek = True
        return evaluate_ref(model, val_ids, block_size)
    return train_ref(model, train_ids, val_ids, steps, batch_size, block_size, lr, seed)


class CharModelSlyPeek(CharModelRef):
    """A cheat aimed at a causality probe that compares positions 0 .. T/2 - 1 of two inputs
    differing from T/2 on: it reads each position's next id from its input everywhere but at
    T/2 - 1, the one compared position whose next id differs (it passed, never trained)."""

    def forward(self, ids, *args, **kwargs):
        out = super().forward(ids, *args, **kwargs)
        if getattr(self, "peek", False):
            T = ids.shape[-1]
            following = torch.roll(ids, -1, dims=-1)
            cheat = torch.full_like(out, -30.0).scatter(-1, following[..., None], 30.0)
            cheat[:, T // 2 - 1] = out[:, T // 2 - 1]
            out = cheat
        return out


# ------------------------------------------------------------------ minilm_encoder

def make_minilm(norm_first=False, activation="gelu", eps=None, transpose="all",
                embedding_norm=True, token_types=True, positions=True, keys="real",
                loader_eps=None):
    """(MiniLM, load_minilm), with one mistake when asked."""

    class MiniLM(nn.Module):
        def __init__(self, n_vocab, max_len, n_types, d_model, n_heads, d_ff, n_layers, eps_):
            super().__init__()
            e = eps_ if eps is None else eps
            self.E_word = nn.Parameter(torch.zeros(n_vocab, d_model))
            self.P = nn.Parameter(torch.zeros(max_len, d_model))
            self.E_type = nn.Parameter(torch.zeros(n_types, d_model))
            self.norm = LayerNorm(d_model, e)
            self.layers = nn.ModuleList(
                TransformerLayer(d_model, n_heads, d_ff, activation=activation,
                                 norm_first=norm_first, eps=e) for _ in range(n_layers))

        def forward(self, input_ids, attention_mask, token_type_ids):
            T = input_ids.shape[1]
            x = self.E_word[input_ids]
            if positions:
                x = x + self.P[:T]
            if token_types:
                x = x + self.E_type[token_type_ids]
            if embedding_norm:
                x = self.norm(x)
            real = attention_mask.bool()
            m = {"real": real, "all": torch.ones_like(real), "inverted": ~real}[keys]
            for layer in self.layers:
                x = layer(x, mask=m[:, None, None, :])
            return x

    def load_minilm(directory):
        from safetensors.torch import load_file

        directory = Path(directory)
        cfg = json.loads((directory / "config.json").read_text())
        model = MiniLM(cfg["vocab_size"], cfg["max_position_embeddings"], cfg["type_vocab_size"],
                       cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"],
                       cfg["num_hidden_layers"],
                       cfg["layer_norm_eps"] if loader_eps is None else loader_eps)
        tensors = load_file(str(directory / "model.safetensors"))
        state = {"E_word": tensors["embeddings.word_embeddings.weight"],
                 "P": tensors["embeddings.position_embeddings.weight"],
                 "E_type": tensors["embeddings.token_type_embeddings.weight"],
                 "norm.gamma": tensors["embeddings.LayerNorm.weight"],
                 "norm.beta": tensors["embeddings.LayerNorm.bias"]}
        linear = {"attn.W_Q": "attention.self.query", "attn.W_K": "attention.self.key",
                  "attn.W_V": "attention.self.value", "attn.W_O": "attention.output.dense",
                  "ffn.W_1": "intermediate.dense", "ffn.W_2": "output.dense"}
        for l in range(cfg["num_hidden_layers"]):
            ours, hf = f"layers.{l}.", f"encoder.layer.{l}."
            for W, name in linear.items():
                w = tensors[hf + name + ".weight"]
                flip = transpose == "all" or (transpose == "ffn only" and "ffn" in W)
                state[ours + W] = w.T if flip else w
                state[ours + W.replace("W_", "b_")] = tensors[hf + name + ".bias"]
            for norm, name in (("norm1", "attention.output.LayerNorm"),
                               ("norm2", "output.LayerNorm")):
                state[ours + norm + ".gamma"] = tensors[hf + name + ".weight"]
                state[ours + norm + ".beta"] = tensors[hf + name + ".bias"]
        model.load_state_dict(state)
        return model.eval()

    return MiniLM, load_minilm


MiniLMRef, load_minilm_ref = make_minilm()


# ------------------------------------------------------------------ sentence_embeddings

def pool_ref(states, attention_mask):
    m = attention_mask.to(states.dtype)[:, :, None]
    u = (states * m).sum(1) / m.sum(1)
    return u / u.norm(dim=-1, keepdim=True)


def pool_over_padding(states, attention_mask):
    u = states.mean(1)
    return u / u.norm(dim=-1, keepdim=True)


def pool_cls(states, attention_mask):
    u = states[:, 0]
    return u / u.norm(dim=-1, keepdim=True)


def pool_max(states, attention_mask):
    u = states.masked_fill(~attention_mask.bool()[:, :, None], float("-inf")).max(1).values
    return u / u.norm(dim=-1, keepdim=True)


def pool_not_normalised(states, attention_mask):
    m = attention_mask.to(states.dtype)[:, :, None]
    return (states * m).sum(1) / m.sum(1)


def pool_tokens_normalised_first(states, attention_mask):
    m = attention_mask.to(states.dtype)[:, :, None]
    unit = states / states.norm(dim=-1, keepdim=True)
    return (unit * m).sum(1) / m.sum(1)


def pool_norm_over_batch(states, attention_mask):
    m = attention_mask.to(states.dtype)[:, :, None]
    u = (states * m).sum(1) / m.sum(1)
    return u / u.norm(dim=0, keepdim=True)


REFERENCE = {
    "next_token_loss": (loss_ref,),
    "sampling_distribution": (probs_ref,),
    "top_p": (distribution_ref,),
    "char_model": (CharModelRef,),
    "cached_generation": (generate_ref, CharModelRef),
    "training_loop": (train_ref, evaluate_ref, CharModelRef),
    "minilm_encoder": (MiniLMRef, load_minilm_ref),
    "sentence_embeddings": (pool_ref, load_minilm_ref),
}

WRONG = {
    "next_token_loss": [
        ("no shift", (loss_no_shift,), "predict the NEXT token"),
        ("shifted the wrong way", (loss_shift_backwards,), "shifted the wrong way"),
        ("padding counted", (loss_padding_counted,), "leave out every prediction"),
        ("mean over all positions", (loss_mean_over_all,), "not by every position"),
        ("mask of the inputs, not the targets", (loss_input_mask,), "TARGET is real"),
        ("log-softmax over the positions", (loss_wrong_axis,), "over the vocabulary"),
        ("mean of per-sequence means", (loss_per_sequence_mean,), "per-sequence"),
        ("in bits", (loss_in_bits,), "yours is in bits"),
        ("log of softmax underflows", (loss_log_of_softmax,), "log_softmax"),
        ("returns .item()", (loss_item,), "0-dimensional tensor"),
    ],
    "sampling_distribution": [
        ("multiplied by the temperature", (probs_times_temperature,), "you multiplied"),
        ("temperature 0 replaced by a tiny one", (probs_tiny_temperature,),
         "a tiny temperature in its place"),
        ("temperature divided in float16 (issue 23)", (probs_divided_in_own_dtype,),
         "convert the logits to float64 first"),
        ("softmax in float16, then cast to float64 (learner 23)", (probs_softmax_own_dtype,),
         "does not bring them back"),
        ("softmax over the batch axis", (probs_axis0,), "mixes different rows"),
        ("ties broken by highest index", (probs_ties_highest,), "yours keeps the highest indices"),
        ("torch.topk for top-k (learner 23)", (probs_torch_topk,), "matches torch.topk's choice"),
        ("every tie at the k-th value kept", (probs_ties_all_kept,), "exactly k"),
        ("keeps k + 1", (probs_k_plus_one,), "one more"),
        ("no renormalisation after top-k", (probs_no_renorm,), "divide by the sum"),
        ("temperature 0 divides by zero", (probs_zero_temperature_divides,), "greedy"),
        ("greedy takes the last maximum", (probs_greedy_last,), "FIRST index"),
        ("no max-shift: exp(1000 / 0.01)", (probs_no_shift,), "subtract the maximum"),
        ("float32 probabilities", (probs_float32,), "float64"),
    ],
    "top_p": [
        ("drops the token that crosses p", (top_p_drops_crossing,), "mass BEFORE it"),
        ("top-p before temperature", (top_p_before_temperature,), "temperature first"),
        ("no renormalisation", (top_p_no_renorm,), "divide by the sum"),
        ("ties broken by highest index", (top_p_ties_highest,), "lowest index comes first"),
        ("top-p before top-k", (top_p_before_top_k,), "top-k first"),
        ("mass summed in vocabulary order", (top_p_unsorted,), "vocabulary order"),
        ("keep mask of the sorted list applied unsorted", (top_p_mask_not_scattered,),
         "through the sort's indices"),
        ("keeps the tail", (top_p_keeps_tail,), "not the tail"),
        ("keeps a token whose mass before it is exactly p (learner 23)", (top_p_keeps_at_p,),
         "compares with <="),
    ],
    "char_model": [
        ("an output matrix of its own", (make_char_model(untied=True),), "tie the output head"),
        ("no position table", (make_char_model(positions="none"),), "learned position row"),
        ("positions defined, never added", (make_char_model(positions="unused"),),
         "learned position row"),
        ("the sinusoidal table added too (learner 23)",
         (make_char_model(positions="offset and sinusoid"),), "adds the sinusoidal table as well"),
        ("positions indexed by the token ids", (make_char_model(positions="by id"),),
         "not by the token ids"),
        ("embedding scaled by sqrt(d_model), as the paper's", (make_char_model(scale=True),),
         "does not scale"),
        ("CharEmbedding not assigned to embed", (make_char_model(replace=False),),
         "assign the CharEmbedding to self.embed"),
        ("token table named E, not W_E", (make_char_model(name="E"),), "name the token table W_E"),
        ("start ignored: positions from 0 after the cache",
         (make_char_model(positions="from 0"),), "start .. start + T - 1"),
        ("top-left mask with a cache (set 07's forward)",
         (make_char_model(cache_mask="top-left"),), "bottom-right"),
        ("no mask in cached steps (set 07's forward)", (make_char_model(cache_mask="none"),),
         "first new token sees"),
        ("no causal mask at all (set 07's forward)", (make_char_model(mask="none"),),
         "must not depend on later ids"),
        ("square (T, T) mask with a cache (set 07's forward)",
         (make_char_model(cache_mask="square"),), "causal_mask(T, start + T)"),
        ("use_cache not passed to the layers (set 07's forward)",
         (make_char_model(pass_cache=False),), "pass use_cache to every layer"),
    ],
    "cached_generation": [
        ("logits of the first position", (make_generate(position=0), CharModelRef),
         "it has read the whole sequence"),
        ("cache not reset", (make_generate(reset=False), CharModelRef), "reset_cache"),
        ("whole sequence fed with the cache", (make_generate(whole_with_cache=True), CharModelRef),
         "feed only the newest id"),
        ("prompt never in the cache", (make_generate(prefill=False), CharModelRef),
         "runs the whole prompt"),
        ("a new generator every step", (make_generate(reseed=True), CharModelRef),
         "once per call"),
        ("top_k and top_p ignored", (make_generate(filters=False), CharModelRef),
         "pass temperature, top_k and top_p"),
        ("always greedy", (make_generate(greedy=True), CharModelRef),
         "the maximum is only for temperature 0"),
        ("returns only the new ids", (make_generate(prompt_returned=False), CharModelRef),
         "prompt followed by"),
    ],
    "training_loop": [
        ("no zero_grad", (make_train(zero_grad="never"), evaluate_ref, CharModelRef),
         "adds each backward pass"),
        ("zero_grad between backward and step",
         (make_train(zero_grad="after backward"), evaluate_ref, CharModelRef),
         "zeroing between backward and step"),
        ("no optimizer.step()", (make_train(step=False), evaluate_ref, CharModelRef),
         "the optimizer's step must run"),
        ("lr far too high (0.5, hard-coded)",
         (make_train(lr_override=0.5), evaluate_ref, CharModelRef), "several times further"),
        ("a new AdamW every step",
         (make_train(optimizer_inside=True), evaluate_ref, CharModelRef),
         "create the optimizer once"),
        ("plain Adam (learner 23)",
         (make_train(optimizer_cls=torch.optim.Adam), evaluate_ref, CharModelRef),
         "plain adam has no decoupled weight decay"),
        ("trained on val_ids (learner 23)",
         (make_train(learn_from="val"), evaluate_ref, CharModelRef), "yours trained on val_ids"),
        ("evaluating on the training data",
         (make_train(evaluate_on="train"), evaluate_ref, CharModelRef), "held-out text"),
        ("a model that reads the next id from its input after training",
         (train_then_peek, evaluate_ref, CharModelPeeking), "looks at the future"),
        ("windows of block_size + 1 ids", (make_train(window=1), evaluate_ref, CharModelRef),
         "block_size rows of W_pos"),
        ("evaluate averages batch means", (train_ref, make_evaluate(batch_means=True),
                                           CharModelRef),
         "weigh each batch by its size"),
    ],
    "minilm_encoder": [
        ("pre-LN layers", make_minilm(norm_first=True), "MiniLM is post-LN"),
        ("tanh GELU", make_minilm(activation="gelu_tanh"), "the tanh approximation"),
        ("MiniLM ignores its eps (LayerNorm's 1e-5)", make_minilm(eps=1e-5),
         "layer_norm_eps is 1e-12 in config.json"),
        ("load_minilm passes eps 1e-5, not config.json's", make_minilm(loader_eps=1e-5),
         "layer_norm_eps is 1e-12 in config.json"),
        ("attention weights not transposed at loading", make_minilm(transpose="ffn only"),
         "the square attention ones too"),
        ("no weight transposed at loading", make_minilm(transpose="none"),
         "transpose them when you load"),
        ("no embedding LayerNorm", make_minilm(embedding_norm=False), "before the first layer"),
        ("no token-type embedding", make_minilm(token_types=False), "row 0 is not zero"),
        ("no positions", make_minilm(positions=False), "position rows"),
        ("padding keys attended", make_minilm(keys="all"), "mask the padding keys"),
        ("padding mask inverted", make_minilm(keys="inverted"), "True = may attend"),
    ],
    "sentence_embeddings": [
        ("mean over the padding too", (pool_over_padding, load_minilm_ref), "only the real tokens"),
        ("[CLS] pooling", (pool_cls, load_minilm_ref), "[CLS]"),
        ("max pooling", (pool_max, load_minilm_ref), "mean pooling"),
        ("not normalised", (pool_not_normalised, load_minilm_ref), "length 1"),
        ("tokens normalised before the mean", (pool_tokens_normalised_first, load_minilm_ref),
         "shorter than 1"),
        ("norm over the batch axis", (pool_norm_over_batch, load_minilm_ref), "not over the batch"),
    ],
}

# A failure caused by an earlier answer of this set names it: (label, objects, namespace, text).
_broken_model = make_char_model(untied=True)
_broken_encoder = make_minilm(norm_first=True)
DEPENDENT = {
    "top_p": [
        ("built on probabilities multiplied by the temperature",
         (lambda z, t=1.0, k=None, p=None: _top_p_with_probs(probs_times_temperature, z, t, k, p),),
         {"next_token_probs": probs_times_temperature}, "fix sampling_distribution first")],
    "cached_generation": [
        ("a CharModel with an output matrix of its own", (generate_ref, _broken_model),
         {"CharModel": _broken_model, "next_token_distribution": distribution_ref},
         "fix char_model first")],
    "training_loop": [
        ("a loss without the shift", (make_train(loss_fn=loss_no_shift), evaluate_ref,
                                      CharModelRef),
         {"CharModel": CharModelRef, "next_token_loss": loss_no_shift},
         "fix next_token_loss first")],
    "sentence_embeddings": [
        ("an encoder with pre-LN layers", (pool_ref, _broken_encoder[1]),
         {"MiniLM": _broken_encoder[0], "load_minilm": _broken_encoder[1]},
         "fix minilm_encoder first")],
}


def _top_p_with_probs(probs, logits, temperature, top_k, top_p):
    """distribution_ref on top of another next_token_probs."""
    p = probs(logits, temperature, top_k)
    if top_p is None or top_p >= 1:
        return p
    p = p * _nucleus(p, top_p)
    return p / p.sum(-1, keepdim=True)
