"""Lesson 10's oracle and tokenizer: Hugging Face ``transformers`` reading the same GGUF file.

``transformers`` loads ``SmolLM2-135M-Instruct.Q4_1.gguf`` as a ``LlamaForCausalLM`` (it
dequantises with the same ``gguf`` package, and permutes the Q/K rows back to its half pairing),
and builds the model's tokenizer and chat template from the same file. Both run offline
(``HF_HUB_OFFLINE=1`` is set when unset). The course's :class:`txlearn.models.llama.LlamaDecoder`
must match this independent implementation's logits.

Precision, stated: ``transformers``' ``LlamaRMSNorm`` casts its input to float32 and its rotary
embedding computes ``cos`` and ``sin`` from float32 angles, whatever the model's dtype. A float64
copy of the oracle is therefore float64 everywhere except there; lesson 10 shows the gap this
leaves, layer by layer.

Source: lesson 10.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import warnings
from unittest import mock

import torch

from txlearn.models.gguf_files import chat_ids, gguf_path, load_tokenizer

__all__ = ["reference_model", "save_reference", "load_saved_reference", "load_tokenizer",
           "chat_ids", "reference_generate", "without_float32_internals"]


def _offline():
    """Offline, no progress bars; returns transformers' GGUF reading module."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with warnings.catch_warnings():  # its `tqdm.auto` import warns in a notebook without widgets
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        return importlib.import_module("transformers.modeling_gguf_pytorch_utils")


def reference_model(dtype: torch.dtype = torch.float32):
    """``transformers.LlamaForCausalLM.from_pretrained(folder, gguf_file=...)`` of the shipped
    file, in eval mode, parameters of `dtype`. Raises ``ImportError`` (the install command) when
    the model package is missing.

    ``transformers`` reads and dequantises the GGUF file in 30 s and more on one core, so the
    first call keeps what it read, in float32, under the user's cache
    (:func:`txlearn.models.gguf_files.cache_folder`, keyed by the ``transformers`` version:
    ``safetensors`` and the config), and later calls build the model from that copy in about a
    second, through ``from_pretrained(None, config=..., state_dict=..., dtype=dtype)``. The
    copy is exact (the dequantised values are float32; ``tests/test_decoder.py`` checks the
    round trip); the values are ``transformers``' own reading of the file, not the course's."""
    import transformers
    from transformers import LlamaForCausalLM

    from txlearn.models.gguf_files import cache_folder, publish_folder

    path = gguf_path()
    reader = _offline()
    saved = cache_folder() / f"reference-transformers-{transformers.__version__}"
    if not (saved / "model.safetensors").is_file():
        # its GGUF reader draws a tqdm bar of its own, which disable_progress_bar() does not reach
        quiet = (mock.patch.object(reader, "tqdm", lambda items, **kwargs: items)
                 if hasattr(reader, "tqdm") else contextlib.nullcontext())
        with quiet:
            model = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32)
        try:
            publish_folder(lambda folder: save_reference(model, folder), saved)
        except OSError:   # a read-only cache: this process keeps what it read
            return model.to(dtype).eval()
        if dtype == torch.float32:
            return model.eval()
    return load_saved_reference(saved, dtype)


def save_reference(model, folder) -> None:
    """Write ``model`` (a ``LlamaForCausalLM``) into ``folder``: ``model.safetensors``
    (``safetensors``' ``save_model``, which keeps the tied head once) and ``config.json``
    (without the GGUF quantisation entry, so the copy loads as a plain model)."""
    import json
    from pathlib import Path

    from safetensors.torch import save_model

    folder = Path(folder)
    save_model(model, str(folder / "model.safetensors"))
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")


def load_saved_reference(folder, dtype: torch.dtype = torch.float32):
    """The ``LlamaForCausalLM`` that :func:`save_reference` wrote into ``folder``, parameters of
    ``dtype``, in eval mode."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    return LlamaForCausalLM.from_pretrained(
        None, config=LlamaConfig.from_dict(config),
        state_dict=load_file(str(folder / "model.safetensors")), dtype=dtype).eval()


@torch.no_grad()
def reference_generate(model, prompt_ids, n_new: int) -> torch.Tensor:
    """``transformers``' own greedy ``generate`` for exactly ``n_new`` tokens (its stop at the
    end-of-turn token switched off, so it continues as :func:`txlearn.training.generate.generate`
    does): int64 ``(T0 + n_new,)``."""
    ids = torch.tensor([list(prompt_ids)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new,
                         do_sample=False, eos_token_id=None,
                         pad_token_id=model.config.pad_token_id)
    return out[0]


def without_float32_internals(model):
    """Make a float64 ``model`` float64 everywhere: every ``LlamaRMSNorm`` runs its own code minus
    its cast to float32, and the rotary table's angles, cosines and sines are computed in float64
    (``theta_k = base^(-2k/d_k)``, as ``transformers`` computes them, in float64). Changes this
    model object only (its modules' ``forward``); returns it. Lesson 10 compares our float64
    decoder with the oracle both as shipped and after this change."""
    import types

    cfg = model.config
    base = cfg.rope_parameters["rope_theta"]
    d_k = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def rms_forward(self, h):
        variance = h.pow(2).mean(-1, keepdim=True)                  # no cast to float32
        return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon))

    def rotary_forward(self, x, position_ids):
        inv_freq = 1.0 / (base ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq   # (B, T, d_k/2)
        emb = torch.cat((freqs, freqs), dim=-1)                         # (B, T, d_k)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            module.forward = types.MethodType(rms_forward, module)
        elif type(module).__name__ == "LlamaRotaryEmbedding":
            module.forward = types.MethodType(rotary_forward, module)
    return model
