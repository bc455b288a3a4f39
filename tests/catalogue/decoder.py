"""Reference and catalogued wrong answers for lesson 10's checks (txlearn/checks/decoder.py)."""

import functools

import numpy as np


# ------------------------------------------------------------------ rope_pairing_permutation

def to_half_ref(W, n_heads):
    d_in, width = W.shape
    heads = W.reshape(d_in, n_heads, width // n_heads)                    # (d_in, n_heads, d_k)
    heads = np.concatenate([heads[..., 0::2], heads[..., 1::2]], axis=-1)  # evens, then odds
    return heads.reshape(d_in, width)


def to_half_identity(W, n_heads):
    return W                                                               # forgot to permute


def to_half_whole_width(W, n_heads):
    return np.concatenate([W[:, 0::2], W[:, 1::2]], axis=1)                # ignores the heads


def to_half_inverse(W, n_heads):
    d_in, width = W.shape
    d_k = width // n_heads
    heads = W.reshape(d_in, n_heads, 2, d_k // 2)                          # (.., halves, d_k/2)
    return heads.swapaxes(2, 3).reshape(d_in, width)                       # half -> interleaved


def to_half_odd_first(W, n_heads):
    d_in, width = W.shape
    heads = W.reshape(d_in, n_heads, width // n_heads)
    return np.concatenate([heads[..., 1::2], heads[..., 0::2]], axis=-1).reshape(d_in, width)


def to_half_rows(W, n_heads):
    return to_half_ref(W.T, n_heads).T                                     # PyTorch's row habit


def to_half_strided_heads(W, n_heads):
    d_in, width = W.shape
    heads = W.reshape(d_in, width // n_heads, n_heads).swapaxes(1, 2)      # heads as a stride
    heads = np.concatenate([heads[..., 0::2], heads[..., 1::2]], axis=-1)
    return heads.swapaxes(1, 2).reshape(d_in, width)


# ------------------------------------------------------------------ kv_cache_from_metadata

def kv_ref(metadata, context, bytes_per_value):
    n_layers = metadata["llama.block_count"]
    n_kv_heads = metadata["llama.attention.head_count_kv"]
    d_k = metadata["llama.embedding_length"] // metadata["llama.attention.head_count"]
    return 2 * n_layers * n_kv_heads * d_k * context * bytes_per_value


def kv_full_width_heads(metadata, context, bytes_per_value):
    return (2 * metadata["llama.block_count"] * metadata["llama.attention.head_count_kv"]
            * metadata["llama.embedding_length"] * context * bytes_per_value)


def kv_no_two(metadata, context, bytes_per_value):
    return kv_ref(metadata, context, bytes_per_value) // 2


def kv_query_heads(metadata, context, bytes_per_value):
    d_model = metadata["llama.embedding_length"]
    return 2 * metadata["llama.block_count"] * d_model * context * bytes_per_value


def kv_d_k_from_kv_heads(metadata, context, bytes_per_value):
    n_kv = metadata["llama.attention.head_count_kv"]
    d_k = metadata["llama.embedding_length"] // n_kv                       # the wrong head count
    return 2 * metadata["llama.block_count"] * n_kv * d_k * context * bytes_per_value


def kv_trained_context(metadata, context, bytes_per_value):
    return kv_ref(metadata, metadata["llama.context_length"], bytes_per_value)


def kv_bits(metadata, context, bytes_per_value):
    return kv_ref(metadata, context, bytes_per_value * 8)


def kv_mib(metadata, context, bytes_per_value):
    return kv_ref(metadata, context, bytes_per_value) / 2**20


def kv_no_layers(metadata, context, bytes_per_value):
    return kv_ref(metadata, context, bytes_per_value) // metadata["llama.block_count"]


REFERENCE = {
    "rope_pairing_permutation": (to_half_ref,),
    "kv_cache_from_metadata": (kv_ref,),
}

WRONG = {
    "rope_pairing_permutation": [
        ("returns W unchanged", (to_half_identity,), "nothing moved"),
        ("permutes the whole width", (to_half_whole_width,), "not across the whole width"),
        ("the inverse permutation", (to_half_inverse,), "that is the inverse"),
        ("odd channels first", (to_half_odd_first,), "even channels first"),
        ("permutes rows", (to_half_rows,), "its columns (axis 1)"),
        ("heads taken as a stride", (to_half_strided_heads,), "contiguous blocks"),
    ],
    "kv_cache_from_metadata": [
        ("no factor 2", (kv_no_two,), "a factor 2"),
        ("query heads", (kv_query_heads,), "only the key/value heads are cached"),
        ("d_k from the KV heads", (kv_d_k_from_kv_heads,), "dividing by head_count_kv"),
        ("trained context", (kv_trained_context,), "context` argument"),
        ("bits", (kv_bits,), "do not multiply by 8"),
        ("MiB", (kv_mib,), "not MiB"),
        ("no layers", (kv_no_layers,), "every layer"),
        ("heads of width embedding_length (learner 23)", (kv_full_width_heads,),
         "not embedding_length wide"),
    ],
}


# ------------------------------------------------------------------ llama_attention (PyTorch)

import torch  # noqa: E402
from torch import nn  # noqa: E402

from tests.catalogue.ffn import swiglu_class  # noqa: E402
from tests.catalogue.heads import MHA_REF, mha_class  # noqa: E402
from tests.catalogue.norms import rms_class  # noqa: E402


def rope_half_with(*, pairing="half", base_fixed=None, sign=1.0, exponent=2.0, own_positions=False,
                   dtype="x", angles=torch.float64):
    def rope_half(x, positions, base):
        d = x.shape[-1]
        h = d // 2
        b = base if base_fixed is None else base_fixed
        theta = b ** (-exponent * torch.arange(0, d, 2, dtype=angles) / (2 * d))
        pos = torch.arange(x.shape[-2]) if own_positions else positions
        angle = pos.to(angles)[:, None] * theta
        cos, sin = torch.cos(angle), sign * torch.sin(angle)
        if dtype == "x":
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        if pairing == "half":
            a, c = x[..., :h], x[..., h:]
            return torch.cat([a * cos - c * sin, a * sin + c * cos], dim=-1)
        a, c = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - c * sin, a * sin + c * cos], dim=-1).flatten(-2)
    return rope_half


rope_half_ref = rope_half_with()


def llama_attention_class(*, rope=rope_half_ref, base=MHA_REF, bias=False, start="given",
                          rotate_k=True, own_base=True, rotate_q=True):
    class LlamaAttention(base):
        def __init__(self, d_model, n_heads, n_kv_heads, rope_base):
            super().__init__(d_model, n_heads, n_kv_heads, bias=bias)
            self.rope_base = rope_base

        def apply_positions(self, Q, K, start_):
            s = start_ if start == "given" else 0
            positions = torch.arange(s, s + Q.shape[-2])
            b = self.rope_base if own_base else 10000.0
            return (rope(Q, positions, b) if rotate_q else Q), \
                (rope(K, positions, b) if rotate_k else K)
    return LlamaAttention


LLAMA_ATTENTION_REF = llama_attention_class()


# ------------------------------------------------------------------ llama_decoder

RMS_REF, SWIGLU_REF = rms_class(), swiglu_class()


def causal_ref(L, S):
    return torch.tril(torch.ones(L, S, dtype=torch.bool), diagonal=S - L)


def decoder_layer_class(*, attention=LLAMA_ATTENTION_REF, order="pre", one_norm=False,
                        residual=True, ffn_on_x=False, pass_mask=True):
    class DecoderLayer(nn.Module):
        def __init__(self, d_model, n_heads, n_kv_heads, d_ff, eps, rope_base):
            super().__init__()
            self.norm1 = RMS_REF(d_model, eps)
            self.attn = attention(d_model, n_heads, n_kv_heads, rope_base)
            self.norm2 = RMS_REF(d_model, eps)
            self.ffn = SWIGLU_REF(d_model, d_ff)

        def forward(self, x, mask=None, use_cache=False):
            m = mask if pass_mask else None
            n2 = self.norm1 if one_norm else self.norm2
            if order == "post":
                h = self.norm1(x + self.attn(x, mask=m, use_cache=use_cache))
                return n2(h + self.ffn(h))
            a = self.attn(self.norm1(x), mask=m, use_cache=use_cache)
            h = x + a if residual else a
            f = self.ffn(n2(x if ffn_on_x else h))
            return h + f if residual else f
    return DecoderLayer


DECODER_LAYER_REF = decoder_layer_class()


def decoder_class(*, layer=DECODER_LAYER_REF, scale=False, final_norm=True, head="W_E.T",
                  mask="bottom_right", pass_cache=True, reset="all"):
    class Decoder(nn.Module):
        def __init__(self, n_vocab, d_model, n_layers, n_heads, n_kv_heads, d_ff, eps, rope_base):
            super().__init__()
            self.W_E = nn.Parameter(torch.randn(n_vocab, d_model) * 0.02)
            self.layers = nn.ModuleList(layer(d_model, n_heads, n_kv_heads, d_ff, eps, rope_base)
                                        for _ in range(n_layers))
            self.norm = RMS_REF(d_model, eps)

        def reset_cache(self):
            for layer_ in (self.layers if reset == "all" else self.layers[:1]):
                layer_.attn.kv_cache = None

        def forward(self, ids, use_cache=False):
            cache = self.layers[0].attn.kv_cache
            start = cache[0].shape[2] if (use_cache and cache is not None) else 0
            T = ids.shape[-1]
            m = causal_ref(T, start + T) if mask == "bottom_right" else causal_ref(T, T)
            if mask == "only when cached" and not use_cache:
                m = None
            h = self.W_E[ids] * (self.W_E.shape[1] ** 0.5 if scale else 1.0)
            for layer_ in self.layers:
                h = layer_(h, mask=m, use_cache=use_cache and pass_cache)
            h = self.norm(h) if final_norm else h
            return h @ (self.W_E.T if head == "W_E.T" else self.W_E)
    return Decoder


DECODER_REF = decoder_class()


# ------------------------------------------------------------------ smollm2_decoder

@functools.lru_cache(maxsize=None)
def _tensor(name):
    from txlearn.models.gguf_files import read_tensor
    out = read_tensor(name)
    out.flags.writeable = False
    return out


def cached_tensor(name):
    """read_tensor, once per name and test process (the learners' loaders read the file anew)."""
    return _tensor(name).copy()


def load_with(*, decoder=DECODER_REF, permute=to_half_ref, k_heads="n_kv_heads", gate="ffn_gate",
              up="ffn_up", eps="file", base="file", transpose="all", norms=("attn_norm", "ffn_norm")):
    def load_smollm2():
        from txlearn.models.gguf_files import read_metadata
        read_tensor = cached_tensor
        meta = read_metadata()
        n_heads = meta["llama.attention.head_count"]
        n_kv = meta["llama.attention.head_count_kv"]
        n_layers = meta["llama.block_count"]
        model = decoder(meta["llama.vocab_size"], meta["llama.embedding_length"], n_layers, n_heads,
                        n_kv, meta["llama.feed_forward_length"],
                        meta["llama.attention.layer_norm_rms_epsilon"] if eps == "file" else 1e-6,
                        meta["llama.rope.freq_base"] if base == "file" else 10000.0)
        kh = n_kv if k_heads == "n_kv_heads" else n_heads
        state = {"W_E": read_tensor("token_embd.weight"),
                 "norm.gamma": read_tensor("output_norm.weight")}
        block = {"norm1.gamma": (norms[0], None), "norm2.gamma": (norms[1], None),
                 "attn.W_Q": ("attn_q", n_heads), "attn.W_K": ("attn_k", kh),
                 "attn.W_V": ("attn_v", None), "attn.W_O": ("attn_output", None),
                 "ffn.W_3": (gate, None), "ffn.W_1": (up, None), "ffn.W_2": ("ffn_down", None)}
        for N in range(n_layers):
            for ours, (theirs, heads) in block.items():
                W = read_tensor(f"blk.{N}.{theirs}.weight")
                if W.ndim == 2 and (transpose == "all" or (transpose == "rectangular"
                                                           and W.shape[0] != W.shape[1])
                                    or (transpose == "not W_O" and theirs != "attn_output")):
                    W = W.T
                if heads is not None and permute is not None:
                    W = permute(W, heads)
                state[f"layers.{N}.{ours}"] = W
        model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})
        return model.eval()
    return load_smollm2


def generate_with(*, reset=True, refeed=False, position=-1):
    @torch.no_grad()
    def generate_greedy(model, prompt_ids, n_new, use_cache=True):
        ids = [int(i) for i in prompt_ids]
        if reset:
            model.reset_cache()
        for step in range(n_new):
            newest = ids if (step == 0 or not use_cache or refeed) else ids[-1:]
            logits = model(torch.tensor([newest]), use_cache=use_cache)[0, position]
            ids.append(int(logits.argmax()))
        if reset:
            model.reset_cache()
        return torch.tensor(ids, dtype=torch.long)
    return generate_greedy


GENERATE_REF = generate_with()
LOAD_REF = functools.lru_cache(maxsize=1)(load_with())   # one model for the generation mistakes

REFERENCE.update({
    "llama_attention": (rope_half_ref, LLAMA_ATTENTION_REF),
    "llama_decoder": (DECODER_LAYER_REF, DECODER_REF),
    "smollm2_decoder": (GENERATE_REF, LOAD_REF),
})

WRONG.update({
    "llama_attention": [
        ("interleaved pairs", (rope_half_with(pairing="interleaved"), LLAMA_ATTENTION_REF),
         "not the neighbours"),
        ("base 10000 in rope_half", (rope_half_with(base_fixed=10000.0), LLAMA_ATTENTION_REF),
         "use the `base` argument"),
        ("rotation backwards", (rope_half_with(sign=-1.0), LLAMA_ATTENTION_REF), "minus sign"),
        ("exponent i/d", (rope_half_with(exponent=1.0), LLAMA_ATTENTION_REF), "exponent has 2i"),
        ("positions 0..T-1", (rope_half_with(own_positions=True), LLAMA_ATTENTION_REF),
         "use the positions given"),
        ("float64 result", (rope_half_with(dtype="float64"), LLAMA_ATTENTION_REF), "cast cos"),
        ("biases kept", (rope_half_ref, llama_attention_class(bias=True)), "bias=False"),
        ("start ignored", (rope_half_ref, llama_attention_class(start="zero")),
         "positions continue after the cache"),
        ("module ignores rope_base", (rope_half_ref, llama_attention_class(own_base=False)),
         "store rope_base"),
        ("K not rotated", (rope_half_ref, llama_attention_class(rotate_k=False)),
         "rope_half(K"),
        ("angles in float32 (learner 23)", (rope_half_with(angles=torch.float32),
                                            LLAMA_ATTENTION_REF), "angles computed in float32"),
        ("Q not rotated (learner 23)", (rope_half_ref, llama_attention_class(rotate_q=False)),
         "returned q unrotated"),
    ],
    "llama_decoder": [
        ("post-norm", (decoder_layer_class(order="post"), DECODER_REF), "pre-norm"),
        ("no residual", (decoder_layer_class(residual=False), DECODER_REF), "add each sub-layer"),
        ("one norm twice", (decoder_layer_class(one_norm=True), DECODER_REF), "their gains differ"),
        ("FFN reads x", (decoder_layer_class(ffn_on_x=True), DECODER_REF), "not RMSNorm_2(x)"),
        ("mask not passed", (decoder_layer_class(pass_mask=False), DECODER_REF), "pass the mask"),
        ("embedding scaled", (DECODER_LAYER_REF, decoder_class(scale=True)), "no sqrt(d_model)"),
        ("no mask without the cache (learner 23)",
         (DECODER_LAYER_REF, decoder_class(mask="only when cached")), "see the future"),
        ("no final norm", (DECODER_LAYER_REF, decoder_class(final_norm=False)), "final RMSNorm"),
        ("tied head transposed", (DECODER_LAYER_REF, decoder_class(head="W_E")), "@ W_E.T"),
        ("square mask with the cache", (DECODER_LAYER_REF, decoder_class(mask="square")),
         "causal_mask(T, start + T)"),
        ("cache not passed on", (DECODER_LAYER_REF, decoder_class(pass_cache=False)),
         "pass use_cache to every layer"),
        ("reset_cache empties one layer", (DECODER_LAYER_REF, decoder_class(reset="first")),
         "every layer's attn.kv_cache"),
    ],
    "smollm2_decoder": [
        ("RoPE pairing left unpermuted", (GENERATE_REF, load_with(permute=None)),
         "to_half_pairing"),
        ("K permuted with n_heads", (GENERATE_REF, load_with(k_heads="n_heads")),
         "permute it with n_kv_heads"),
        ("gate and up swapped", (GENERATE_REF, load_with(gate="ffn_up", up="ffn_gate")),
         "your W_3"),
        ("eps left at RMSNorm's default", (GENERATE_REF, load_with(eps="default")),
         "layer_norm_rms_epsilon"),
        ("RoPE base 10000", (GENERATE_REF, load_with(base="default")), "llama.rope.freq_base"),
        ("square matrices not transposed", (GENERATE_REF, load_with(transpose="rectangular")),
         "the square W_Q and W_O too"),
        ("the square W_O alone not transposed", (GENERATE_REF, load_with(transpose="not W_O")),
         "your w_o is the only one"),
        ("norm gains swapped", (GENERATE_REF, load_with(norms=("ffn_norm", "attn_norm"))),
         "attn_norm is the gain of norm1"),
        ("nothing transposed", (GENERATE_REF, load_with(transpose="none")), "transpose them"),
        ("no reset_cache", (generate_with(reset=False), LOAD_REF), "its reset_cache method"),
        ("the whole sequence every cached step", (generate_with(refeed=True), LOAD_REF),
         "only the newest id"),
    ],
})

# a right LlamaAttention on a set-03 MultiHeadAttention that caches after repeat_kv (issue 23)
_MHA_AFTER_REPEAT = mha_class(cache="after_repeat")
DEPENDENT = {
    "llama_attention": [
        ("MultiHeadAttention caches after repeat_kv",
         (rope_half_ref, llama_attention_class(base=_MHA_AFTER_REPEAT)),
         {"MultiHeadAttention": _MHA_AFTER_REPEAT}, "fix multi_head_attention first"),
    ],
}
