"""GGUF files as the spec allows them (issue 26): optional keys and RoPE scaling.

Each test writes a small Llama GGUF with the ``gguf`` package's own writer (``GGUFWriter``) from
a tiny random :class:`LlamaDecoder`, so the reader meets a file it did not write itself, and the
model written is the oracle: the loaded decoder must give its logits. The GGUF spec
(``docs/gguf.md``, "LLM") marks ``[llm].attention.head_count_kv`` optional ("if not present, the
model does not use GQA"; llama.cpp defaults it to the head count) and does not require
``[llm].vocab_size`` (the embedding's shape holds it); ``[llm].rope.scaling.type`` and
``.factor`` must be honoured by executors: ``linear`` is position interpolation (Chen et al.
2023, eq. 4: position m is rotated as m / factor), and a type the course does not implement is
refused by name rather than ignored. The file's byte order is the writer's choice too (the spec:
"big-endian files are allowed"), and a file replaced at the same path is a new file.
"""

import os

import gguf
import numpy as np
import pytest
import torch

from txlearn.masks import causal_mask
from txlearn.models.gguf_files import read_tensor
from txlearn.models.gguf import load_decoder, read_config, read_rope_scaling, weight_table
from txlearn.models.llama import LlamaConfig, LlamaDecoder

CONFIG = LlamaConfig(n_vocab=37, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                     eps=2.0**-17, rope_base=10000.0, context=64)   # eps exact in float32


def _model(config=CONFIG, seed=0):
    torch.manual_seed(seed)
    model = LlamaDecoder(config).eval()
    with torch.no_grad():       # norms away from 1, so a misplaced gain shows
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.uniform_(0.5, 1.5)
            elif name == "embed.W_E":
                p.normal_(0, 0.5)
    return model


def _write(path, model, *, omit=(), rope_scaling=None, endianess=gguf.GGUFEndian.LITTLE):
    """``model`` as a GGUF file at ``path`` (float32 tensors, llama.cpp's names, ``(d_out, d_in)``
    matrices), its metadata without the keys in ``omit``; ``rope_scaling``: (type, factor);
    ``endianess``: the file's byte order."""
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    keys = {"block_count": lambda: w.add_block_count(c.n_layers),
            "context_length": lambda: w.add_context_length(c.context),
            "embedding_length": lambda: w.add_embedding_length(c.d_model),
            "feed_forward_length": lambda: w.add_feed_forward_length(c.d_ff),
            "attention.head_count": lambda: w.add_head_count(c.n_heads),
            "attention.head_count_kv": lambda: w.add_head_count_kv(c.n_kv_heads),
            "attention.layer_norm_rms_epsilon": lambda: w.add_layer_norm_rms_eps(c.eps),
            "rope.freq_base": lambda: w.add_rope_freq_base(c.rope_base),
            "vocab_size": lambda: w.add_vocab_size(c.n_vocab)}
    for key, add in keys.items():
        if key not in omit:
            add()
    if rope_scaling is not None:
        kind, factor = rope_scaling
        w.add_string("llama.rope.scaling.type", kind)
        w.add_float32("llama.rope.scaling.factor", factor)
    params = dict(model.named_parameters())
    for name, ours, transpose in weight_table(c.n_layers):
        value = params[ours].detach().float()
        w.add_tensor(name, (value.T if transpose else value).contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


IDS = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 31, 2]])     # (1, 12)


def test_a_complete_file_round_trips(tmp_path):
    """The writer and the reader agree: every key present, the loaded model gives the written
    model's logits (float32 tensors, so to float tolerance)."""
    model = _model()
    path = _write(tmp_path / "full.gguf", model)
    assert read_config(path) == CONFIG
    with torch.no_grad():
        torch.testing.assert_close(load_decoder(path)(IDS), model(IDS))


def test_no_head_count_kv_means_no_gqa(tmp_path):
    """Spec: 'llama.attention.head_count_kv ... if not present, the model does not use GQA'
    (llama.cpp: n_head_kv = n_head). The report: ValueError 'the GGUF file has no field
    llama.attention.head_count_kv'."""
    config = LlamaConfig(**{**CONFIG.__dict__, "n_kv_heads": CONFIG.n_heads})
    model = _model(config, seed=1)
    path = _write(tmp_path / "no_kv.gguf", model, omit=("attention.head_count_kv",))
    assert read_config(path).n_kv_heads == CONFIG.n_heads == 4
    with torch.no_grad():
        torch.testing.assert_close(load_decoder(path)(IDS), model(IDS))


def test_no_vocab_size_reads_the_embedding_shape(tmp_path):
    """Spec: llama.vocab_size is not required; token_embd.weight (n_vocab, d_model) holds it."""
    model = _model(seed=2)
    path = _write(tmp_path / "no_vocab.gguf", model, omit=("vocab_size",))
    assert read_config(path).n_vocab == 37
    with torch.no_grad():
        torch.testing.assert_close(load_decoder(path)(IDS), model(IDS))


def _logits_at(model, ids, positions):
    """The oracle for scaled RoPE: the unscaled model's blocks, each told the positions."""
    T = ids.shape[1]
    x = model.embed(ids)
    for layer in model.layers:
        x = layer(x, mask=causal_mask(T), positions=positions)
    return model.head(model.norm(x))


def test_linear_rope_scaling_divides_the_positions_by_the_factor(tmp_path):
    """Spec: executors honour rope.scaling.type / .factor. The report: a file with type linear,
    factor 4 gave logits identical to the unscaled file. Linear scaling (position
    interpolation) rotates position m as m / 4: the scaled file's logits are the unscaled
    model's at positions 0, 0.25, 0.5, ..., and not its logits at 0, 1, 2, ..."""
    model = _model(seed=3)
    path = _write(tmp_path / "linear4.gguf", model, rope_scaling=("linear", 4.0))
    assert read_rope_scaling(path) == 4.0
    scaled = load_decoder(path)
    assert scaled.config.rope_scaling_factor == 4.0
    with torch.no_grad():
        got, plain = scaled(IDS), model(IDS)
        expected = _logits_at(model, IDS, torch.arange(12, dtype=torch.float64) / 4)
    torch.testing.assert_close(got, expected)
    assert (got - plain).abs().max() > 1e-2        # the unscaled logits are not the answer
    # decoding with the cache continues the scaled positions: 8 tokens, then 4 one at a time
    caches = scaled.new_caches()
    with torch.no_grad():
        steps = [scaled(IDS[:, :8], caches)] + [scaled(IDS[:, t:t + 1], caches)
                                               for t in range(8, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected)


@pytest.mark.parametrize("kind, factor", [("none", 4.0), ("linear", 0.0)])
def test_scaling_none_and_factor_zero_mean_no_scaling(kind, factor, tmp_path):
    """type none = no scaling whatever the factor; a factor of 0 is llama.cpp's 'unset' (1)."""
    model = _model(seed=4)
    path = _write(tmp_path / f"{kind}.gguf", model, rope_scaling=(kind, factor))
    assert read_rope_scaling(path) == 1.0
    with torch.no_grad():
        torch.testing.assert_close(load_decoder(path)(IDS), model(IDS))


@pytest.mark.parametrize("kind", ["yarn", "longrope"])
def test_other_scaling_types_are_refused_by_name(kind, tmp_path):
    """A scaling the course does not implement is refused, naming it, not silently ignored."""
    path = _write(tmp_path / f"{kind}.gguf", _model(seed=5), rope_scaling=(kind, 4.0))
    with pytest.raises(ValueError, match=f"rope.scaling.type = '{kind}'.*'linear'"):
        load_decoder(path)



def test_a_big_endian_file_reads_its_values_in_its_byte_order(tmp_path):
    """The report: a big-endian GGUF file (the format allows them; llama.cpp reads them) gave its
    metadata and shapes right and its tensor values byte-swapped (``[[1.17e-41, 6.91e-41, ...]]``
    for ``[[-2.5, -1.5, ...]]``): the dequantising view dropped the byte order. Expected: F32 and
    F16 values right (the loaded model gives the written one's logits); a quantised tensor of
    such a file refused, naming it."""
    model = _model(seed=6)
    path = _write(tmp_path / "big.gguf", model, endianess=gguf.GGUFEndian.BIG)
    assert gguf.GGUFReader(str(path)).endianess == gguf.GGUFEndian.BIG      # really big-endian
    assert read_config(path) == CONFIG
    embedding = model.embed.W_E.detach().numpy()
    assert (read_tensor("token_embd.weight", path) == embedding).all()
    with torch.no_grad():
        torch.testing.assert_close(load_decoder(path)(IDS), model(IDS))
    ramp = np.arange(-2.5, 2.5, 1.0, dtype=np.float32).reshape(1, 5)   # [[-2.5, -1.5, ...]]
    w = gguf.GGUFWriter(str(tmp_path / "mixed.gguf"), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_tensor("ramp.f16", ramp.astype(np.float16))
    q8 = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("blocks.q8_0", gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert read_tensor("ramp.f16", tmp_path / "mixed.gguf").tolist() == ramp.tolist()
    with pytest.raises(ValueError, match="'blocks.q8_0'.*Q8_0.*big-endian"):
        read_tensor("blocks.q8_0", tmp_path / "mixed.gguf")


def test_a_file_replaced_at_the_same_path_is_read_again(tmp_path):
    """The report: a GGUF file replaced at the same path was not read again (the reader was
    cached on the path alone), so the old values came back. Expected: the reader is kept per
    path, size and modification time, like the file-digest helper beside it."""
    path = _write(tmp_path / "model.gguf", _model(seed=7))
    first = read_tensor("token_embd.weight", path)
    newer = _model(seed=8)
    _write(tmp_path / "new.gguf", newer)                 # the same shapes: the same size
    os.replace(tmp_path / "new.gguf", path)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))   # a later time, surely
    again = read_tensor("token_embd.weight", path)
    assert (again == newer.embed.W_E.detach().numpy()).all() and not (again == first).all()
