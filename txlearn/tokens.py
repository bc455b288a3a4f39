"""Byte-level BPE from first principles: pre-tokenisation, training, encoding and decoding.

Byte pair encoding (Sennrich, Haddow and Birch 2016, "Neural Machine Translation of Rare Words
with Subword Units", section 3.2) starts from single symbols and repeatedly merges the most
frequent adjacent pair into a new symbol. GPT-2 (Radford et al. 2019, "Language Models are
Unsupervised Multitask Learners", section 2.2) runs it on the *bytes* of UTF-8 text, so the 256
single bytes are always in the vocabulary and no input is ever unknown, and it first splits the
text with a regular expression (:data:`GPT2_SPLIT_PATTERN`) so that merges never cross the
boundary between a word, a number, punctuation and whitespace.

The rules this module states and keeps:

* **ids**: byte ``b`` is id ``b`` (0..255); the k-th merge makes id ``256 + k``; special tokens
  come after the merges, in the order given.
* **counting**: a pair is counted as the merge would replace it, left to right without overlap:
  in ``"aaa"`` the pair ``(a, a)`` counts **once** (merging gives ``[aa, a]``), in ``"aaaa"``
  twice. Each pre-token's counts are multiplied by how often the pre-token occurs.
* **ties**: among pairs of equal count the smallest ``(rank(a), rank(b))`` wins, where a merged
  token's rank is its id and a byte's rank is its position in ``byte_order`` (default: the byte
  value). With ``byte_order=HF_BYTE_ORDER`` (the order of GPT-2's printable stand-in characters,
  which is the order of the ``tokenizers`` library's initial alphabet) the rule is the
  ``tokenizers`` trainer's: the smallest pair of its ids.
* **incremental update**: after a merge only the pre-tokens that contain the merged pair are
  recounted (their old pair counts subtracted, the new ones added); the naive loop recounts the
  whole corpus at every merge.
* **encoding** applies merges in rank order (the earliest learnt first), never by frequency.
* **decoding** joins the bytes of all ids and decodes the stream once with ``errors="replace"``;
  decoding token by token would turn a character split across two tokens into two U+FFFD.
* **special tokens** are matched in the text first (the longest first) and never split or merged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import regex  # GPT-2's pattern needs `\p{L}` (declared in pyproject; transformers needs it too)

__all__ = ["GPT2_SPLIT_PATTERN", "HF_BYTE_ORDER", "BPE", "byte_to_unicode", "pretokenize",
           "count_pairs", "train_bpe", "train_bpe_naive", "encode", "decode", "from_byte_level"]

# Radford et al. 2019's split: contractions, letters, digits, other symbols, whitespace
GPT2_SPLIT_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                      r"""|\s+(?!\S)|\s+""")
_SPLIT = regex.compile(GPT2_SPLIT_PATTERN)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (a dict of 256 entries, byte -> one character):
    the printable Latin-1 bytes ``!``..``~``, ``¡``..``¬``, ``®``..``ÿ`` stand for themselves, the
    other 68 bytes (control characters, space, NBSP, soft hyphen) for U+0100 upwards in byte
    order; a space is ``Ġ`` (U+0120). Vocabularies stored as strings (``tokenizer.json``, GGUF's
    ``tokenizer.ggml.tokens``) are written in these characters."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# each byte's rank when sorted by its stand-in character (the `tokenizers` trainer's alphabet order)
HF_BYTE_ORDER = tuple(sorted(range(256), key=lambda b: byte_to_unicode()[b]))


@dataclass(frozen=True)
class BPE:
    """A trained byte-level BPE: ``merges[k] = (a, b)`` made id ``256 + k`` (ids of earlier
    tokens), ``vocab`` maps every id to its bytes, ``special`` maps each special token's text to
    its id. Build one with :func:`train_bpe` or :func:`from_byte_level`."""
    merges: list[tuple[int, int]]
    vocab: dict[int, bytes]
    special: dict[str, int] = field(default_factory=dict)

    @property
    def ranks(self) -> dict[tuple[int, int], int]:
        """Each merged pair -> its rank (position in ``merges``)."""
        return {pair: k for k, pair in enumerate(self.merges)}

    def merges_as_bytes(self) -> list[tuple[bytes, bytes]]:
        """The merges as pairs of byte strings (comparable across id schemes)."""
        return [(self.vocab[a], self.vocab[b]) for a, b in self.merges]


def pretokenize(text: str) -> list[str]:
    """Split ``text`` (str) with :data:`GPT2_SPLIT_PATTERN` into a list of pre-tokens whose
    concatenation is ``text``; merges never cross their boundaries. Raises TypeError for a
    non-str."""
    if not isinstance(text, str):
        raise TypeError(f"pretokenize takes a str, not {type(text).__name__}")
    return _SPLIT.findall(text)


def count_pairs(symbols, counts: Counter | None = None, weight: int = 1,
                overlaps: bool = False) -> Counter:
    """Count the adjacent pairs of ``symbols`` (a sequence of ids) as a merge would replace them:
    left to right, an occurrence overlapping the previous counted occurrence of the *same* pair
    is skipped, so ``(a, a)`` counts once in ``a a a`` and twice in ``a a a a``. Adds
    ``weight`` per occurrence into ``counts`` (a new Counter when None) and returns it.
    ``overlaps=True`` counts every window instead (``(a, a)`` twice in ``a a a``): the rule of the
    ``tokenizers`` library's trainer, which counts a pair the merge cannot make."""
    counts = Counter() if counts is None else counts
    ends = {}   # pair -> index of the last symbol of its last counted occurrence
    for i in range(len(symbols) - 1):
        pair = (symbols[i], symbols[i + 1])
        if not overlaps and ends.get(pair) == i:
            continue
        counts[pair] += weight
        ends[pair] = i + 1
    return counts


def _merge(symbols: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out, i, a, b = [], 0, pair[0], pair[1]
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def _check_specials(special_tokens) -> list[str]:
    special_tokens = list(special_tokens)
    for s in special_tokens:
        if not isinstance(s, str) or not s:
            raise ValueError(f"a special token must be a non-empty str, not {s!r}")
    if len(set(special_tokens)) != len(special_tokens):
        raise ValueError(f"special tokens repeated: {special_tokens}")
    return special_tokens


def _split_specials(text: str, special: dict[str, int]) -> list[str | int]:
    """``text`` as pieces of plain text (str) and special-token ids (int), longest match first."""
    if not special:
        return [text] if text else []
    pattern = "(" + "|".join(regex.escape(s) for s in sorted(special, key=len, reverse=True)) + ")"
    pieces = []
    for k, piece in enumerate(regex.split(pattern, text)):
        if k % 2:
            pieces.append(special[piece])
        elif piece:
            pieces.append(piece)
    return pieces


def train_bpe(text: str, vocab_size: int, special_tokens=(), byte_order=None,
              overlaps: bool = False) -> BPE:
    """Train byte-level BPE on ``text`` (str) up to ``vocab_size`` ids (int: 256 bytes + merges +
    special tokens) and return a :class:`BPE`.

    The text is cut at the special tokens (which are not trained on), pre-tokenised with
    :func:`pretokenize`, and each distinct pre-token's bytes counted with :func:`count_pairs`.
    Each step merges the most frequent pair (ties: the smallest ``(rank(a), rank(b))``, a byte's
    rank its position in ``byte_order``, default the byte value; a merged token's rank its id),
    then recounts only the pre-tokens that held that pair. ``overlaps`` as in :func:`count_pairs`;
    ``byte_order=HF_BYTE_ORDER, overlaps=True`` is the ``tokenizers`` trainer's rule. Training
    stops early when no pair is left. BPE: Sennrich et al. 2016 (section 3.2); on bytes, after
    GPT-2's split: Radford et al. 2019 (section 2.2). Raises TypeError for a non-str text,
    ValueError when ``vocab_size`` is below 256 + the number of special tokens, for a bad special
    token or a ``byte_order`` that is not a permutation of 0..255."""
    if not isinstance(text, str):
        raise TypeError(f"train_bpe takes a str, not {type(text).__name__}")
    special_tokens = _check_specials(special_tokens)
    if not isinstance(vocab_size, int) or vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size={vocab_size!r}: needs at least 256 (the bytes) + "
                         f"{len(special_tokens)} (the special tokens)")
    order = tuple(range(256)) if byte_order is None else tuple(byte_order)
    if sorted(order) != list(range(256)):
        raise ValueError("byte_order must be a permutation of the 256 byte values")
    byte_rank = {b: r for r, b in enumerate(order)}

    def rank(i):
        return byte_rank[i] if i < 256 else i

    freq = Counter()
    for piece in _split_specials(text, {s: -1 for s in special_tokens}):
        if isinstance(piece, str):
            freq.update(pretokenize(piece))
    words = [list(w.encode("utf-8")) for w in freq]
    weights = list(freq.values())
    pairs, where = Counter(), {}
    for k, (w, n) in enumerate(zip(words, weights)):
        for pair in count_pairs(w, overlaps=overlaps):
            where.setdefault(pair, set()).add(k)
        count_pairs(w, pairs, n, overlaps)

    vocab = {b: bytes([b]) for b in range(256)}
    merges, n_merges = [], vocab_size - 256 - len(special_tokens)
    while len(merges) < n_merges and pairs:
        top = max(pairs.values())      # the highest count, then the tie rule among those pairs
        best = min((p for p, c in pairs.items() if c == top),
                   key=lambda p: (rank(p[0]), rank(p[1])))
        new_id = 256 + len(merges)
        merges.append(best)
        vocab[new_id] = vocab[best[0]] + vocab[best[1]]
        for k in where.pop(best):
            old, n = words[k], weights[k]
            # the incremental update: only this word's counts change
            for pair, c in count_pairs(old, overlaps=overlaps).items():
                pairs[pair] -= c * n
                if pairs[pair] <= 0:
                    del pairs[pair]
            words[k] = new = _merge(old, best, new_id)
            for pair in count_pairs(new, overlaps=overlaps):
                where.setdefault(pair, set()).add(k)
            count_pairs(new, pairs, n, overlaps)
        pairs.pop(best, None)
    special = {s: 256 + len(merges) + j for j, s in enumerate(special_tokens)}
    vocab.update({i: s.encode("utf-8") for s, i in special.items()})
    return BPE(merges=merges, vocab=vocab, special=special)


def train_bpe_naive(text: str, vocab_size: int, split: bool = True) -> BPE:
    """The teaching loop of :func:`train_bpe` (no special tokens, byte-value ties, merge
    counting): at every merge it recounts the pairs of the *whole* corpus, so its time is
    (number of merges) x (corpus size); the incremental update of :func:`train_bpe` recounts only
    the pre-tokens that held the merged pair. ``split=False`` skips the pre-tokenisation (the
    whole text is one sequence of bytes, so merges may cross word boundaries: lesson 11 measures
    what that learns). Returns a :class:`BPE` equal to ``train_bpe(text, vocab_size)`` when
    ``split`` is True. Raises TypeError for a non-str, ValueError for ``vocab_size`` < 256."""
    if not isinstance(text, str):
        raise TypeError(f"train_bpe_naive takes a str, not {type(text).__name__}")
    if not isinstance(vocab_size, int) or vocab_size < 256:
        raise ValueError(f"vocab_size={vocab_size!r}: needs at least 256 (the bytes)")
    freq = Counter(pretokenize(text) if split else [text])
    words = {tuple(w.encode("utf-8")): n for w, n in freq.items()}
    vocab = {b: bytes([b]) for b in range(256)}
    merges = []
    while len(merges) < vocab_size - 256:
        pairs = Counter()
        for w, n in words.items():          # the whole corpus, at every merge
            count_pairs(w, pairs, n)
        if not pairs:
            break
        top = max(pairs.values())
        best = min(p for p, c in pairs.items() if c == top)     # ties: the smallest pair of ids
        new_id = 256 + len(merges)
        merges.append(best)
        vocab[new_id] = vocab[best[0]] + vocab[best[1]]
        merged = Counter()
        for w, n in words.items():
            merged[tuple(_merge(list(w), best, new_id))] += n
        words = merged
    return BPE(merges=merges, vocab=vocab)


def _encode_piece(data: bytes, ranks, ids, first):
    missing = set(data) - first.keys()
    if missing:   # a vocabulary without all 256 bytes (SmolLM2's lacks a few control bytes)
        raise ValueError(f"byte(s) {sorted(missing)} of {data!r} are not in the vocabulary")
    symbols = [first[b] for b in data]
    while len(symbols) > 1:
        best = min(zip(symbols, symbols[1:]), key=lambda p: ranks.get(p, len(ranks)))
        if best not in ranks:
            break
        symbols = _merge(symbols, best, ids[best])
    return symbols


def encode(bpe: BPE, text: str) -> list[int]:
    """The ids (list of int) of ``text`` (str): special tokens matched first (longest first) and
    kept whole, the rest pre-tokenised and each pre-token's bytes merged by rank: repeatedly the
    adjacent pair learnt earliest, until no learnt pair is left. ``decode(bpe, encode(bpe, s))
    == s`` for every str. Raises TypeError for a non-str, ValueError naming a byte that the
    vocabulary lacks (only possible for one built by :func:`from_byte_level`)."""
    if not isinstance(text, str):
        raise TypeError(f"encode takes a str, not {type(text).__name__}")
    ranks = bpe.ranks
    by_bytes = _ids_by_bytes(bpe)
    made = {(a, b): by_bytes[bpe.vocab[a] + bpe.vocab[b]] for a, b in bpe.merges}
    first = {b: by_bytes[bytes([b])] for b in range(256) if bytes([b]) in by_bytes}
    out, cache = [], {}
    for piece in _split_specials(text, bpe.special):
        if isinstance(piece, int):
            out.append(piece)
            continue
        for word in pretokenize(piece):
            if word not in cache:
                cache[word] = _encode_piece(word.encode("utf-8"), ranks, made, first)
            out.extend(cache[word])
    return out


def _ids_by_bytes(bpe: BPE) -> dict[bytes, int]:
    """Bytes -> the first id that has them (special tokens left out: they are matched as text)."""
    specials, by_bytes = set(bpe.special.values()), {}
    for i, b in sorted(bpe.vocab.items()):
        if i not in specials:
            by_bytes.setdefault(b, i)
    return by_bytes


def decode(bpe: BPE, ids) -> str:
    """The text of ``ids`` (an iterable of int): the bytes of every id joined into one stream,
    decoded once as UTF-8 with ``errors="replace"`` (an invalid sequence becomes U+FFFD, exactly as
    ``bytes.decode(errors="replace")`` does). Raises ValueError naming the first id that is not
    in the vocabulary (and its position), TypeError for a non-integer id."""
    parts = []
    for pos, i in enumerate(ids):
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TypeError(f"id at position {pos} is {i!r}, not an int")
        data = bpe.vocab.get(int(i))
        if data is None:
            raise ValueError(f"id {int(i)} at position {pos} is not in the vocabulary "
                             f"(ids 0..{max(bpe.vocab)})")
        parts.append(data)
    return b"".join(parts).decode("utf-8", errors="replace")


def from_byte_level(tokens, merges, special_tokens=()) -> BPE:
    """A :class:`BPE` from a vocabulary stored in GPT-2's stand-in characters (see
    :func:`byte_to_unicode`): ``tokens[i]`` the string of id ``i`` (a list of str, e.g. GGUF's
    ``tokenizer.ggml.tokens``), ``merges`` a list of ``"a b"`` strings in rank order
    (``tokenizer.ggml.merges``), ``special_tokens`` the strings among ``tokens`` matched whole
    (their text is taken as written). Ids are the file's, not this module's scheme. Raises
    ValueError naming a merge whose parts or result are not in ``tokens``, or a special token
    that is not."""
    decoder = {c: b for b, c in byte_to_unicode().items()}
    special = {}
    for s in _check_specials(special_tokens):
        if s not in tokens:
            raise ValueError(f"special token {s!r} is not in the vocabulary")
        special[s] = tokens.index(s)
    vocab, index = {}, {}
    for i, t in enumerate(tokens):
        if i in special.values():
            vocab[i] = t.encode("utf-8")
            continue
        stand_ins = all(c in decoder for c in t)
        vocab[i] = bytes(decoder[c] for c in t) if stand_ins else t.encode("utf-8")
        index.setdefault(t, i)
    pairs = []
    for m in merges:
        a, _, b = m.partition(" ")
        if a not in index or b not in index or a + b not in index:
            raise ValueError(f"merge {m!r}: a part or the result is not in the vocabulary")
        pairs.append((index[a], index[b]))
    return BPE(merges=pairs, vocab=vocab, special=special)
