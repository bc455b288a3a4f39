"""Lesson 10: load a GGUF file (SmolLM2-135M-Instruct) into the course's :class:`LlamaDecoder`.

The file, its metadata and its float32 tensors come from :mod:`txlearn.models.gguf_files`
(which says where the file comes from and how to install it); this module adds the model.

GGUF's tensor names are llama.cpp's. :data:`BLOCK_TABLE` maps each onto the course's parameter,
with the names the same tensor has in Meta's LLaMA code and in Hugging Face's ``transformers``
beside it. The SwiGLU names follow lesson 05's mapping table: the course's gate ``W_3`` is Meta's
``w1`` and Hugging Face's ``gate_proj``; ``W_1`` (up) is ``w3`` / ``up_proj``; ``W_2`` (down) is
``w2`` / ``down_proj``. Matrices arrive as ``(d_out, d_in)`` rows (as in PyTorch) and are
transposed to the course's ``(d_in, d_out)`` here, and only here.

**The RoPE pairing.** GGUF stores the rows of ``attn_q`` and ``attn_k`` in the order llama.cpp's
rotation expects: each head's channels are rotated in interleaved pairs ``(2i, 2i+1)``. Hugging
Face's checkpoints use the half pairing ``(i, i + d_k/2)``; llama.cpp's converter permutes the rows
when it writes a GGUF and ``transformers`` permutes them back when it reads one. So
``load_decoder()`` (``rope="interleaved"``) uses the file's weights as they are, and
``load_decoder(rope="half")`` permutes each head's columns of ``W_Q`` and ``W_K`` with
:func:`interleaved_to_half_heads` first. Both give the same logits; ``rope="half",
permute_qk=False`` is the trap (lesson 10 measures how wrong it is).

Source: the GGUF format (ggml project, ``docs/gguf.md``); lesson 10.
"""

from __future__ import annotations

from pathlib import Path

import torch

from txlearn.models.gguf_files import (INSTALL_COMMAND, MODEL_FILE, MODEL_PACKAGE, gguf_path,
                                       read_field, read_metadata, read_tensor, tensor_shapes)
from txlearn.models.llama import LlamaConfig, LlamaDecoder
from txlearn.positional import interleaved_to_half

__all__ = [
    "MODEL_PACKAGE",
    "MODEL_FILE",
    "INSTALL_COMMAND",
    "BLOCK_TABLE",
    "GLOBAL_TABLE",
    "gguf_path",
    "read_metadata",
    "read_config",
    "read_rope_scaling",
    "read_tensor",
    "tensor_shapes",
    "weight_table",
    "interleaved_to_half_heads",
    "load_decoder",
]

# One block's tensors: GGUF name (llama.cpp) -> course parameter, Meta's LLaMA name, Hugging Face's.
BLOCK_TABLE = [
    # GGUF blk.N.<name>  course layers[N].<param>  Meta LLaMA              Hugging Face layers[N].
    ("attn_norm",        "norm1.gamma",            "attention_norm",       "input_layernorm"),
    ("attn_q",           "attn.W_Q",               "attention.wq",         "self_attn.q_proj"),
    ("attn_k",           "attn.W_K",               "attention.wk",         "self_attn.k_proj"),
    ("attn_v",           "attn.W_V",               "attention.wv",         "self_attn.v_proj"),
    ("attn_output",      "attn.W_O",               "attention.wo",         "self_attn.o_proj"),
    ("ffn_norm",         "norm2.gamma",            "ffn_norm",             "post_attention_layernorm"),
    ("ffn_gate",         "ffn.W_3",                "feed_forward.w1",      "mlp.gate_proj"),
    ("ffn_up",           "ffn.W_1",                "feed_forward.w3",      "mlp.up_proj"),
    ("ffn_down",         "ffn.W_2",                "feed_forward.w2",      "mlp.down_proj"),
]
# The tensors outside the blocks. The head has none: it is tied to the embedding.
GLOBAL_TABLE = [
    ("token_embd",       "embed.W_E",              "tok_embeddings",       "model.embed_tokens"),
    ("output_norm",      "norm.gamma",             "norm",                 "model.norm"),
]


def read_rope_scaling(path: str | Path | None = None) -> float:
    """The linear RoPE scaling factor the file asks for (1.0 = none).

    GGUF's keys, read as llama.cpp reads them: ``llama.rope.scaling.type`` (absent = "linear"),
    ``llama.rope.scaling.factor`` (absent: the older ``llama.rope.scale_linear``; absent or 0 =
    1). "none" is 1; "linear" is position interpolation (Chen et al. 2023, eq. 4): positions are
    divided by the factor. Raises ValueError naming any other type (yarn, longrope, ...: the
    course does not implement them, and ignoring them would give wrong logits silently) and a
    factor that is not a finite number > 0. Source: the GGUF spec (``docs/gguf.md``, "LLM",
    ``[llm].rope.scaling.*``); lesson 04.
    """
    meta = read_metadata(path)
    kind = str(meta.get("llama.rope.scaling.type", "linear")).lower()
    factor = meta.get("llama.rope.scaling.factor")
    if factor is None:
        factor = meta.get("llama.rope.scale_linear")
    factor = 1.0 if factor is None or float(factor) == 0.0 else float(factor)
    if kind == "none":
        return 1.0
    if kind != "linear":
        raise ValueError(f"the GGUF file asks for rope.scaling.type = {kind!r} (factor {factor}); "
                         "this loader applies only 'none' and 'linear' (position interpolation), "
                         "and refuses the others rather than ignore them")
    if not 0 < factor < float("inf"):
        raise ValueError(f"the GGUF file's rope.scaling.factor must be a finite number > 0, got "
                         f"{factor}")
    return factor


def read_config(path: str | Path | None = None, rope: str = "interleaved") -> LlamaConfig:
    """The sizes in the file's metadata (``llama.block_count``, ``llama.embedding_length``, ...).

    ``rope`` is the pairing the model will use (see the module's docstring). The keys the GGUF
    spec makes optional get the spec's (and llama.cpp's) defaults: no
    ``llama.attention.head_count_kv`` means no GQA (``n_kv_heads = n_heads``); no
    ``llama.vocab_size`` means the embedding's first dimension (``token_embd.weight``,
    ``(n_vocab, d_model)``); no RoPE base means 10000; the RoPE scaling keys are
    :func:`read_rope_scaling`'s. Raises ``ValueError`` when the file is not a Llama-architecture
    model, a required field is missing (named), or it asks for a RoPE scaling the course does
    not implement.
    """
    path = path or gguf_path()
    meta = read_metadata(path)
    arch = read_field("general.architecture", path)
    if arch != "llama":
        raise ValueError(f"expected a llama-architecture GGUF, got {arch!r}")
    f = lambda key: read_field(f"llama.{key}", path)  # noqa: E731
    n_heads = int(f("attention.head_count"))
    n_kv_heads = int(meta.get("llama.attention.head_count_kv", n_heads))
    n_vocab = meta.get("llama.vocab_size")
    if n_vocab is None:
        shapes = tensor_shapes(path)
        if "token_embd.weight" not in shapes:
            raise ValueError("the GGUF file has no field 'llama.vocab_size' and no tensor "
                             "'token_embd.weight' to read the vocabulary size from")
        n_vocab = shapes["token_embd.weight"][0]                    # (n_vocab, d_model)
    return LlamaConfig(
        n_vocab=int(n_vocab), d_model=int(f("embedding_length")),
        n_layers=int(f("block_count")), n_heads=n_heads, n_kv_heads=n_kv_heads,
        d_ff=int(f("feed_forward_length")),
        eps=float(f("attention.layer_norm_rms_epsilon")),
        rope_base=float(meta.get("llama.rope.freq_base", 10000.0)),
        context=int(f("context_length")), rope=rope,
        rope_scaling_factor=read_rope_scaling(path))


def weight_table(n_layers: int) -> list[tuple[str, str, bool]]:
    """Every loaded tensor: ``(GGUF name, course parameter path, transpose?)``, from
    :data:`GLOBAL_TABLE` and :data:`BLOCK_TABLE`; matrices are transposed, vectors and the
    embedding ``(n_vocab, d_model)`` are not."""
    rows = [(f"{g}.weight", ours, False) for g, ours, _, _ in GLOBAL_TABLE]
    for n in range(n_layers):
        for g, ours, _, _ in BLOCK_TABLE:
            rows.append((f"blk.{n}.{g}.weight", f"layers.{n}.{ours}", not g.endswith("norm")))
    return rows


def interleaved_to_half_heads(W, n_heads: int):
    """Reorder each head's output columns of ``W (d_in, n_heads * d_k)`` from the interleaved
    pairing (pairs ``(2i, 2i+1)``, GGUF's order) to the half pairing (pairs ``(i, i + d_k/2)``,
    Hugging Face's): within every head, channels ``[0, 2, 4, ..., 1, 3, 5, ...]``.

    Applied to ``W_Q`` (``n_heads``) and ``W_K`` (``n_kv_heads``), it makes
    ``apply_rope(x W', pairing="half")`` a permutation of ``apply_rope(x W, pairing="interleaved")``
    with the same permutation for queries and keys, so every score ``q . k`` is unchanged.
    Works on tensors and arrays. Raises ValueError when the width is not ``n_heads`` times an
    even d_k (both named). Source: lesson 04 (the two pairings), lesson 10.
    """
    d_in, width = W.shape
    if n_heads < 1 or width % n_heads or (width // n_heads) % 2:
        raise ValueError(f"W has {width} columns: not n_heads={n_heads} heads of an even d_k")
    heads = W.reshape(d_in, n_heads, width // n_heads)          # (d_in, n_heads, d_k)
    return interleaved_to_half(heads).reshape(d_in, width)       # (d_in, n_heads * d_k)


def load_decoder(path: str | Path | None = None, *, rope: str = "interleaved",
                 permute_qk: bool | None = None,
                 dtype: torch.dtype = torch.float32) -> LlamaDecoder:
    """Build :class:`LlamaDecoder` from the file's metadata and fill every parameter from its
    tensors.

    Args:
        path: a GGUF file; None = the shipped SmolLM2-135M-Instruct (:func:`gguf_path`).
        rope: the pairing the model's attention uses, ``"interleaved"`` (GGUF's order, default)
            or ``"half"``.
        permute_qk: reorder W_Q's and W_K's columns per head with
            :func:`interleaved_to_half_heads`; None = exactly when ``rope == "half"`` (the
            correct choice). ``rope="half", permute_qk=False`` loads the wrong pairing on purpose.
        dtype: of the parameters (the float32 dequantised values, cast).

    Returns:
        the model in eval mode.

    Raises:
        ValueError: a shape differs from the model's (both named), a parameter is left unfilled,
            or the file has an untied output matrix; ``ImportError`` (the install command) when
            the model package is missing.
    """
    config = read_config(path, rope=rope)
    permute_qk = (rope == "half") if permute_qk is None else permute_qk
    model = LlamaDecoder(config)
    params = dict(model.named_parameters())       # the tied head shares embed.W_E
    if "output.weight" in tensor_shapes(path):
        raise ValueError("the file has an untied output matrix; this loader expects tied weights")
    filled = set()
    for name, ours, transpose in weight_table(config.n_layers):
        src = torch.from_numpy(read_tensor(name, path))
        src = src.T if transpose else src                        # (d_out, d_in) -> (d_in, d_out)
        if permute_qk and ours.endswith(("attn.W_Q", "attn.W_K")):
            heads = config.n_heads if ours.endswith("W_Q") else config.n_kv_heads
            src = interleaved_to_half_heads(src, heads)
        dst = params[ours]
        if tuple(dst.shape) != tuple(src.shape):
            raise ValueError(f"{name} -> {ours}: file shape {tuple(src.shape)} != model shape "
                             f"{tuple(dst.shape)}")
        with torch.no_grad():
            dst.copy_(src)
        filled.add(ours)
    missing = sorted(set(params) - filled)
    if missing:
        raise ValueError(f"parameters not filled from the file: {missing}")
    return model.to(dtype).eval()
