# %% [markdown]
# # 11 · Tokens: bytes, byte pair encoding and the vocabulary
#
# Symbols: see [the notation table](00_map.ipynb#Notation) of lesson 00.
#
# **Where this lesson fits.** Read it after lesson 02. Every lesson from 02 on starts from "a
# sequence of $T$ tokens, each an id below $n_{vocab}$", and until now the course never said
# where the ids come from: lessons 02 and 09 use characters, lesson 09's pretrained encoder a
# WordPiece tokenizer and lesson 10's SmolLM2 a byte-level BPE tokenizer, both taken from a
# library as black boxes. This lesson opens the second box: it builds byte-level byte pair
# encoding (BPE) from the bytes up, checks it against the `tokenizers` library, and rebuilds
# SmolLM2's own tokenizer from its GGUF file. Your version of it (exercise set 12) is what set
# 10's chat turn runs on. (It is numbered 11 so that lessons 03 to 10 keep their numbers.)
#
# **You will be able to:** say why a vocabulary of the 256 byte values never meets an unknown
# symbol; train BPE by counting adjacent pairs and merging the most frequent, with a stated tie
# rule; say what the pre-tokenisation regex does and why merges never cross it; encode by
# applying merges in rank order and decode a byte stream once; measure compression against
# vocabulary size, training time against corpus size, and what fewer tokens buy attention.
#
# **You need:** lesson 02 (generating text one token at a time); Python strings, bytes and
# dictionaries. The last section uses lesson 08's FLOP counts: read it now for the numbers, and
# again after lesson 08 for their meaning.
#
# **Time:** about 60 minutes to read and run (the cells take about 15 s on a 2-core CPU), plus
# the exercises.
#
# The code lives in the package: `txlearn.tokens` (`pretokenize`, `count_pairs`, `train_bpe`,
# `train_bpe_naive`, `encode`, `decode`, `from_byte_level`), about 340 lines written from
# scratch; the `tokenizers` library appears only as an oracle (in section 7 running
# `transformers`' own conversion of SmolLM2's file).

# %%
import codecs
import inspect
import json
import sys
import time

import matplotlib.pyplot as plt
import numpy as np

from txlearn.counting import layer_flops
from txlearn.plotting import show
from txlearn.tokens import (BPE, GPT2_SPLIT_PATTERN, HF_BYTE_ORDER, byte_to_unicode, count_pairs,
                            decode, encode, from_byte_level, pretokenize, train_bpe,
                            train_bpe_naive)
from txlearn.training.data import CharVocab, load_corpus

corpus = load_corpus()                     # Python's language reference, 465,048 characters
train_text = corpus[:40_000]               # what the tokenizers below learn from
held_out = corpus[-40_000:]                # the same kind of text, never trained on

# %% [markdown]
# ## 1. Text is bytes
#
# A Python `str` is a sequence of Unicode code points (there are `sys.maxunicode + 1` =
# 1,114,112 of them). UTF-8 writes each code point as 1 to 4 bytes: ASCII as itself (one byte
# below 128), everything else as a lead byte (`110xxxxx`, `1110xxxx` or `11110xxx`, saying how
# many bytes follow) and continuation bytes (`10xxxxxx`). What a reader sees as one character
# can be several code points: `e` followed by the combining acute accent U+0301, a thumbs-up
# with a skin-tone modifier, two regional-indicator letters that draw a flag.

# %%
samples = {"a": "a", "é (one code point)": "\u00e9", "é (e + combining accent)": "e\u0301",
           "日": "日", "😀": "😀", "👍🏽 (with a skin tone)": "👍🏽", "🇫🇷 (two letters)": "🇫🇷"}
for name, s in samples.items():
    data = s.encode("utf-8")
    print(f"{name:26s} {len(s)} code point(s), {len(data)} bytes: "
          + " ".join(f"{b:08b}" for b in data))
assert [len(s.encode()) for s in samples.values()] == [1, 2, 3, 3, 4, 8, 8]
assert sys.maxunicode + 1 == 1_114_112

# %% [markdown]
# A vocabulary of *characters* is only as complete as the text it was made from. Lesson 09's
# character model takes its vocabulary from the course's corpus: 103 characters. Text unlike
# the corpus (below: a few sentences in other languages and scripts, written for this lesson)
# is full of characters it has never seen, and a character tokenizer must map them all to one
# "unknown" id, losing them. A vocabulary of the 256 byte values has no such gap: every string
# is a sequence of bytes, so every string has ids, and decoding gives it back.

# %%
unlike = ("Le cœur a ses raisons que la raison ne connaît point. Ça coûte 12,50 € à Zürich. "
          "Ἐν ἀρχῇ ἦν ὁ λόγος. Москва — столица России. 東京は日本の首都です。"
          "नमस्ते दुनिया। 🙂 👨‍👩‍👧 e\u0301 a\u0308\n")
chars = CharVocab.from_text(corpus)
unseen = [c for c in unlike if c not in chars.chars]
print(f"character vocabulary of the corpus: {len(chars)} characters")
print(f"characters of the unlike text it lacks: {len(unseen)} of {len(unlike)} "
      f"({len(set(unseen))} distinct), e.g. {''.join(sorted(set(unseen))[:12])!r}")
assert len(chars) == 103 and len(unseen) > len(unlike) // 3    # measured: 72 of 166
assert set(unlike.encode("utf-8")) <= set(range(256))      # always true: that is the point
assert bytes(list(unlike.encode("utf-8"))).decode("utf-8") == unlike

# %% [markdown]
# The price: a byte vocabulary makes sequences long. The corpus is almost all ASCII (1.0 byte per
# character), Greek and Cyrillic take 2 bytes per letter, Japanese and Devanagari 3. Lesson 08
# measured that attention's cost grows as $T^2$; BPE buys back length by giving frequent byte
# sequences ids of their own.

# %% [raw] concept="byte-ids"
# question: Before any merge, how many ids does a byte-level vocabulary hold, and why can it encode
#   any string without an unknown token?
# kind: choice
# options:
#   a: 256, one per byte value, because every string is a sequence of UTF-8 bytes
#   b: 103, one per character of the course's corpus
#   c: 1,114,112, one per Unicode code point
#   d: 128, the ASCII characters; the rest are mapped to an unknown token
# answer: a
# section: '1.'
# right: 'UTF-8 writes every code point as 1 to 4 bytes, each one of 256 values: the 256 byte ids cover
#   every string, so nothing is ever unknown (section 1 encoded text from scripts the corpus never
#   shows, and decoded it back).'
# wrong:
#   b:
#     misconception: A character vocabulary taken for a byte vocabulary
#     explain: 103 is the corpus's character set, and it lacks 72 of the 166 characters of the
#       other-scripts sample measured in section 1; bytes have no such gap.
#   c:
#     misconception: Code points taken for the units BPE starts from
#     explain: 'There are 1,114,112 code points, but byte-level BPE starts from their UTF-8 bytes:
#       256 ids, and a character beyond ASCII is 2 to 4 of them.'
#   d:
#     misconception: Bytes confused with ASCII
#     explain: ASCII is the first 128 byte values; a byte vocabulary keeps all 256, so the bytes of
#       "é" (c3 a9) or of an emoji are ids like any other, never unknown.

# %% [markdown]
# ## 2. Byte pair encoding: count, merge, repeat
#
# BPE (Sennrich, Haddow and Birch 2016, section 3.2; on bytes: GPT-2, Radford et al. 2019,
# section 2.2) starts from the sequence of byte ids and repeats one step:
#
# 1. count every adjacent pair of ids in the training text;
# 2. take the most frequent pair $(a, b)$ and give it the next free id, $256 + k$ for the
#    $k$-th merge; its bytes are the bytes of $a$ followed by those of $b$;
# 3. replace every occurrence of $(a, b)$, left to right, by the new id.
#
# The list of merges, in the order they were learnt, *is* the tokenizer: the vocabulary is the
# 256 bytes plus one token per merge. Two rules must be stated, or two implementations disagree:
#
# - **Counting.** In `aaa` the pair `(a, a)` occurs in two overlapping windows, but merging it
#   left to right makes `[aa, a]`: one merge. `count_pairs` counts what the merge makes, so
#   `(a, a)` counts once in `aaa` and twice in `aaaa`. The `tokenizers` library counts windows
#   (twice in `aaa`).
# - **Ties.** Among pairs of equal count, `train_bpe` takes the smallest `(rank(a), rank(b))`:
#   a byte's rank is its value, a merged token's its id.

# %%
a = ord("a")
print("count_pairs(aaa):", dict(count_pairs([a, a, a])), "  counting windows:",
      dict(count_pairs([a, a, a], overlaps=True)))
assert count_pairs([a, a, a]) == {(a, a): 1} and count_pairs([a] * 4) == {(a, a): 2}
assert count_pairs([a, a, a], overlaps=True) == {(a, a): 2}

toy = "the cat sat; the hat sat on the mat; that cat ate the hat"
toy_bpe = train_bpe(toy, 256 + 6)
for k, (x, y) in enumerate(toy_bpe.merges):
    print(f"merge {k}: {toy_bpe.vocab[x]!r} + {toy_bpe.vocab[y]!r} -> id {256 + k} = "
          f"{toy_bpe.vocab[256 + k]!r}")
assert toy_bpe.vocab[256] == b"at"   # in cat sat hat sat mat that cat ate hat: 9, the most

# %% [markdown]

# %% [raw] concept="aaaa-pairs"
# question: How many times does the course's `count_pairs` count the pair `(a, a)` in the sequence
#   `a a a a` (four a's), and so how many merges of that pair fit in it?
# kind: numeric
# answer: 2
# tolerance: 0
# section: '2.'
# right: 'Two: the merge replaces non-overlapping pairs from the left, `(a a)(a a)`, so the trainer
#   counts what a merge can actually replace (section 2 asserts 1 for `a a a` and 2 for four).'
# wrong:
#   3:
#     misconception: Overlapping windows counted as separate merges
#     explain: 'There are 3 windows, but they overlap: once `(a a)` is merged, the middle `a` is used.
#       Counting windows (the `overlaps=True` rule, the one of `tokenizers`) overstates what one merge
#       pass replaces.'
#   4:
#     misconception: Tokens counted instead of pairs
#     explain: Four tokens make at most two disjoint pairs.
#   other:
#     misconception: Not from the counting rule
#     explain: 'Pair up from the left without reusing a token: `(a a)(a a)` gives 2.'

# %% [markdown]
# ## 3. Pre-tokenisation: where merges may not go
#
# Trained on raw text, BPE happily merges across words: `e` and the space after it, a word and
# the full stop after it. Such tokens spend the vocabulary on accidents of which word follows
# which, and the same word gets different ids before a space, a comma or a newline. GPT-2 first
# cuts the text with a regular expression and trains (and later encodes) each piece on its own,
# so **no merge ever crosses a cut**: the pieces are contractions, a run of letters with at most
# one space before it, a run of digits, a run of other symbols, and whitespace (a run of spaces
# before a word leaves its last space to the word: `"   return"` gives `"  "` and `" return"`).
# The pattern is `txlearn.tokens.GPT2_SPLIT_PATTERN`:

# %%
print(GPT2_SPLIT_PATTERN)
pieces = pretokenize("Hello world, it's 2024!  \n    return x")
print(pieces)
assert pieces == ["Hello", " world", ",", " it", "'s", " 2024", "!", "  \n   ", " return", " x"]
assert "".join(pretokenize(unlike)) == unlike          # the cut loses nothing

# %% [markdown]
# Measured: train 80 merges on the same 4,000 characters with and without the cut, and count
# the learnt tokens that span a cut (a token whose own text the regex would split). The training
# without the cut uses `train_bpe_naive`, the plain loop of section 4, which can skip the split.

# %%
def crosses(token: bytes) -> bool:
    return len(pretokenize(token.decode("utf-8", errors="replace"))) > 1

with_split = train_bpe(train_text[:4000], 256 + 80)
without_split = train_bpe_naive(train_text[:4000], 256 + 80, split=False)
spanning = [t for t in without_split.vocab.values() if crosses(t)]
print(f"tokens spanning a cut: {sum(crosses(t) for t in with_split.vocab.values())} with the "
      f"split, {len(spanning)} of 80 without it; e.g. {spanning[:8]}")
assert not any(crosses(t) for t in with_split.vocab.values())
assert len(spanning) > 10

# %% [markdown]
# ## 4. Training time: the naive loop and the incremental update
#
# The naive loop recounts every pair of the corpus at every merge: its time is (number of
# merges) $\times$ (corpus size). A bigger corpus is trained to a bigger vocabulary, so in
# practice both grow together and the loop is **quadratic**. Two observations fix it:
#
# - the pre-tokens repeat (`" the"` thousands of times): count each distinct pre-token once and
#   weight its pairs by its frequency;
# - a merge of $(a, b)$ changes only the pre-tokens that contain $(a, b)$: keep, for every pair,
#   the set of pre-tokens holding it, and after a merge subtract those pre-tokens' old pair counts
#   and add their new ones. The other counts stay right.
#
# `train_bpe` does both; `train_bpe_naive` does neither beyond the weighting. They learn the
# same merges, which we assert at every size measured. The times are printed and plotted, not
# asserted (they depend on the machine).

# %%
def seconds(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out

sizes = [1_000, 2_000, 4_000, 8_000]
times = {"naive": [], "incremental": []}
for n in sizes:                      # merges grow with the corpus: n_vocab = 256 + n / 50
    n_vocab = 256 + n // 50
    t_naive, naive = seconds(train_bpe_naive, train_text[:n], n_vocab)
    t_fast, fast = seconds(train_bpe, train_text[:n], n_vocab)
    assert naive.merges == fast.merges                 # the same tokenizer
    times["naive"].append(t_naive)
    times["incremental"].append(t_fast)
    print(f"{n:6d} characters, {n_vocab - 256:3d} merges: naive {t_naive:6.3f} s, "
          f"incremental {t_fast:6.3f} s")
slopes = {k: np.polyfit(np.log(sizes), np.log(v), 1)[0] for k, v in times.items()}
print("log-log slopes (time against corpus size):",
      {k: round(float(s), 2) for k, s in slopes.items()})

fig, ax = plt.subplots(figsize=(5, 3.5))
for k, v in times.items():
    ax.loglog(sizes, v, "o-", label=f"{k} (slope {slopes[k]:.2f})")
ax.set_xlabel("corpus size (characters), merges = size / 50")
ax.set_ylabel("training time (s)")
ax.legend()
show(fig, alt="Training time against corpus size on log-log axes: the naive loop's line is "
              "steeper than the incremental update's.")

# %% [markdown]
# ## 5. Encoding by rank, decoding once
#
# Encoding replays training: cut the text with the same regex, start each piece from its bytes,
# and repeatedly apply **the merge learnt earliest** among the pairs present, until no learnt
# pair is left. Rank order is not frequency order and not left-to-right order. A two-merge toy
# shows why: with merges `(a, b)` first and `(a, a)` second, `aab` must encode as `[a, ab]`,
# the way training saw it; applying `(a, a)` first would give `[aa, b]`, a split training never
# made.

# %%
vocab = {**{b: bytes([b]) for b in range(256)}, 256: b"ab", 257: b"aa"}
two = BPE(merges=[(a, ord("b")), (a, a)], vocab=vocab)
print("aab ->", [two.vocab[i] for i in encode(two, "aab")])
assert encode(two, "aab") == [a, 256]

bpe = train_bpe(train_text, 256 + 1024 + 1, special_tokens=["<|endoftext|>"])  # + 1 special
eot = bpe.special["<|endoftext|>"]
ids = encode(bpe, "Hello world<|endoftext|>def f(x):\n    return x")
print(ids)
print([bpe.vocab[i] for i in ids])
assert eot == 256 + 1024 and ids.count(eot) == 1        # a special token is one id, never split

# %% [markdown]
# Decoding joins the bytes of all ids into one stream and decodes it **once**: a character can be
# cut between two tokens (an emoji is 4 bytes, and a token may hold 1 of them), so decoding
# token by token would turn each half into a replacement character U+FFFD. Invalid bytes in the
# middle of a stream (here `ff fe` and a character cut short) become U+FFFD exactly as Python's
# `bytes.decode(errors="replace")` makes them, and the rest decodes normally. Every string
# survives the round trip, however hostile.

# %%
hostile = ["", " ", "\n\n\n", "e\u0301 a\u0308 n\u0303", "😀👍🏽 👨‍👩‍👧 🇫🇷", "\x00\x7f\u00a0\u00ad",
           "it's 12,345.67 !!! ...", "<|endoftext|><|endoftext|>x", unlike]
for s in hostile:
    assert decode(bpe, encode(bpe, s)) == s
stream = "é😀".encode() + b"\xff\xfe" + "日本".encode()[:5] + b"ok"
once = decode(bpe, list(stream))
per_token = "".join(decode(bpe, [b]) for b in stream)
print(f"decoded once: {once!r}\ntoken by token: {per_token!r}")
assert once == stream.decode("utf-8", errors="replace") and once.count("\ufffd") == 3
assert per_token.count("\ufffd") == 13    # every one of its 13 non-ASCII bytes
print(f"round trips: {len(hostile)} hostile strings, all equal")

# %% [markdown]

# %% [raw] concept="decode-once"
# question: Why does `decode` join the bytes of all the ids and decode UTF-8 once, instead of
#   decoding each token and joining the strings?
# kind: choice
# options:
#   a: A character's bytes can be split between two tokens; decoded alone, each part becomes U+FFFD
#   b: It is only faster; both give the same text
#   c: Tokens always hold whole characters, so it makes no difference
#   d: To leave the special tokens out
# answer: a
# section: '5.'
# right: 'A token may hold part of a character (an emoji is 4 bytes). Decoded once, the stream gave 3
#   replacement characters, only where its bytes were invalid; token by token it gave 13, one for
#   every non-ASCII byte (section 5).'
# wrong:
#   b:
#     misconception: Decoding taken to be per-token safe
#     explain: The two differ on the stream of section 5, 3 replacement characters against 13.
#   c:
#     misconception: Tokens assumed to align with characters
#     explain: Merges join bytes, not characters; a learnt token can end in the middle of a
#       multi-byte character.
#   d:
#     misconception: Decoding confused with special-token handling
#     explain: Special tokens decode to their own text; the single decode is about multi-byte
#       characters cut between tokens.

# %% [markdown]
# ## 6. The same tokenizer as the `tokenizers` library
#
# Hugging Face's `tokenizers` (Rust) has a BPE trainer. Given GPT-2's byte-level split, it
# differs from `train_bpe` in exactly the two stated rules: it counts overlapping windows, and it
# breaks ties by its own ids, which number the 256 bytes in the order of GPT-2's printable
# stand-in characters (`byte_to_unicode`; `HF_BYTE_ORDER` is that order). With both rules set to
# its own, our trainer gives the same merges and, once byte ids are mapped, the same ids.

# %%
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

def tokenizers_bpe(text, n_vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=n_vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    to_byte = {c: b for b, c in byte_to_unicode().items()}
    merges = [m.split(" ") if isinstance(m, str) else m
              for m in json.loads(tok.to_str())["model"]["merges"]]
    return tok, [tuple(bytes(to_byte[c] for c in part) for part in m) for m in merges]

n_vocab = 256 + 500
t_theirs, (tok, theirs) = seconds(tokenizers_bpe, train_text, n_vocab)
t_ours, ours = seconds(train_bpe, train_text, n_vocab, byte_order=HF_BYTE_ORDER, overlaps=True)
print(f"tokenizers: {len(theirs)} merges in {t_theirs:.2f} s; train_bpe: {len(ours.merges)} in "
      f"{t_ours:.2f} s")
assert ours.merges_as_bytes() == theirs                     # all 500 merges, in order
to_theirs = {b: r for r, b in enumerate(HF_BYTE_ORDER)} | {i: i for i in range(256, n_vocab)}
assert [to_theirs[i] for i in encode(ours, held_out[:5000])] == tok.encode(held_out[:5000]).ids

# %% [markdown]
# With our own rules (merges counted as the merge makes them, ties by byte value) the merge lists
# part early: the corpus's code examples are indented with runs of spaces, in which
# `tokenizers` counts `(space, space)` two times per three spaces, a pair the merge cannot make
# that often. We measure where the two lists first differ and how much of the vocabulary they
# share.

# %%
default = train_bpe(train_text, n_vocab).merges_as_bytes()
first = next(k for k, (x, y) in enumerate(zip(default, theirs)) if x != y)
shared = len(set(default) & set(theirs))
print(f"first difference at merge {first}: ours {default[first]}, tokenizers' {theirs[first]}; "
      f"{shared} of {len(theirs)} merges shared")
assert first == 2 and theirs[2] == (b" ", b" ") and (b" ", b" ") not in default[:first + 1]
assert 0.9 * len(theirs) < shared < len(theirs)                # measured: 487 of 500

# %% [markdown]
# ## 7. SmolLM2's tokenizer, rebuilt from its GGUF file
#
# Lesson 10's model file stores its tokenizer as metadata: `tokenizer.ggml.tokens` (49,152
# strings, in GPT-2's stand-in characters), `tokenizer.ggml.merges` (48,900 merges in rank
# order, `"a b"`) and `tokenizer.ggml.token_type` (3 marks a control token: `<|im_start|>`,
# `<|im_end|>`, ...). `from_byte_level` turns them into a `BPE`; `encode` then tokenizes the
# chat template's text (the file's template too, rendered by `gguf_files.chat_text`), special
# tokens included. The oracle is the `tokenizers` library running `transformers`' own
# conversion of the same file (`gguf_files.tokenizer_json()`; `tests/test_tokens.py` checks it
# against `transformers`' ids).

# %%
from tokenizers import Tokenizer

from txlearn.models import gguf_files

fields = gguf_files.tokenizer_fields()     # the file's fields (kept as JSON after a first read)
tokens, merges, types = (fields[f"tokenizer.ggml.{k}"] for k in ("tokens", "merges", "token_type"))
control = [t for t, kind in zip(tokens, types) if kind == 3]
smol = from_byte_level(tokens, merges, control)
oracle = Tokenizer.from_file(str(gguf_files.tokenizer_json()))
message = "What is 12+7? Café naïve 😀 日本"
text = gguf_files.chat_text(message)
ids = encode(smol, text)
print(repr(text))
print(ids)
assert ids == oracle.encode(text).ids                         # every id, specials included
assert decode(smol, ids) == text
specials = [tokens[i] for i in ids if i in smol.special.values()]
print("special tokens in the prompt:", specials)
assert specials == ["<|im_start|>", "<|im_end|>"] * 2 + ["<|im_start|>"]
assert len(tokens) == 49152 and len(merges) == 48900

# %% [markdown]
# SmolLM2's own pre-tokeniser also cuts numbers into single digits; GPT-2's pattern keeps `12`
# whole, yet the ids agree. They agree on every number because the file learnt no merge of two
# digits: the digits were never seen side by side in training.

# %%
digit_merges = [m for m in merges if all(part.isdigit() for part in m.split(" "))]
print("merges of two digit strings:", len(digit_merges))
assert digit_merges == []
numbers = "In 1984, 365 days; pi = 3.14159 and 2**64 = 18446744073709551616."
assert encode(smol, numbers) == oracle.encode(numbers).ids

# %% [markdown]
# ## 8. Compression against vocabulary size
#
# BPE's greedy training makes every prefix of the merge list a tokenizer of its own: the first
# $k$ merges are exactly what training to $256 + k$ ids gives. So one training run measures every
# vocabulary size. Compression is **bytes per token** on text the tokenizer did not train on:
# the held-out end of the corpus (the same kind of text), Python source code (the standard
# library's `inspect` module), the held-out text in ROT13 (English letter statistics scrambled)
# and the unlike text of section 1. We expected the source code to compress worse than the
# reference's prose; it compresses *better*: a language reference is full of Python, and source
# code repeats its keywords (`self`, `return`, `def`) and its runs of indentation far more.

# %%
texts = {"held-out reference": held_out[:20_000],
         "Python source (inspect.py)": inspect.getsource(inspect)[:20_000],
         "ROT13 of the held-out text": codecs.encode(held_out[:20_000], "rot13"),
         "other languages and scripts": unlike}
merge_counts = [0, 32, 64, 128, 256, 512, 1024]
ratio = {name: [] for name in texts}
for k in merge_counts:
    prefix = BPE(merges=bpe.merges[:k], vocab={i: bpe.vocab[i] for i in range(256 + k)})
    for name, t in texts.items():
        ratio[name].append(len(t.encode()) / len(encode(prefix, t)))
for name, r in ratio.items():
    print(f"{name:28s}" + " ".join(f"{x:5.2f}" for x in r))

fig, ax = plt.subplots(figsize=(6, 3.5))
for name, r in ratio.items():
    ax.semilogx([256 + k for k in merge_counts], r, "o-", label=name, base=2)
ax.set_xlabel("n_vocab (256 bytes + merges)")
ax.set_ylabel("bytes per token")
ax.legend(fontsize=8)
show(fig, alt="Bytes per token against vocabulary size: Python source and the held-out "
              "reference text compress more with every doubling, ROT13 text a little, the other "
              "languages and scripts hardly at all.")
ref, code = ratio["held-out reference"], ratio["Python source (inspect.py)"]
assert all(x == 1.0 for x in (r[0] for r in ratio.values()))     # bytes alone: 1 byte per token
assert all(b > a for a, b in zip(ref, ref[1:]))                  # each doubling compresses more
assert ref[-1] > 2.0                                             # measured 2.24
assert all(c > r for c, r in zip(code[1:], ref[1:]))             # source code: more (2.73)
for name in ["ROT13 of the held-out text", "other languages and scripts"]:   # unlike: less
    assert all(r < x for r, x in zip(ratio[name][1:], ref[1:])), name
assert ratio["other languages and scripts"][-1] < 1.3            # measured 1.15

# %% [markdown]
# ## 9. T in tokens, and what it costs attention
#
# A model reads tokens, not characters: the same text is $T$ = (characters) / (characters per
# token) positions long. Lesson 09's model reads characters, so its context of $T$ positions holds
# $T$ characters; a BPE model with the same $T$ sees about twice as much text with 1,024
# merges trained on 40,000 characters (more with the vocabularies of real models). Per layer the
# projections and the FFN cost a fixed amount per token, but attention's scores and weighted sum
# cost $4 T^2 d_{model}$ FLOPs (lesson 08): for the same text, fewer tokens cut that term by the
# *square* of the compression. The head pays the other way: $2\, d_{model}\, n_{vocab}$ FLOPs per
# token. Counted with the course's `layer_flops` for one layer of lesson 09's shape on 2,048
# characters of held-out text, and the head:

# %%
window = held_out[:2048]
d_model, n_heads, d_ff = 128, 4, 512
rows = []
for k in merge_counts:
    prefix = BPE(merges=bpe.merges[:k], vocab={i: bpe.vocab[i] for i in range(256 + k)})
    T = len(encode(prefix, window))
    flops = layer_flops(T=T, d_model=d_model, n_heads=n_heads, d_ff=d_ff)
    attention = flops["scores Q K^T"] + flops["weighted sum A V"]
    rows.append((256 + k, T, attention, sum(flops.values()) - attention,
                 2 * T * d_model * (256 + k)))
print(" n_vocab     T  attention T^2 (MFLOP)  rest of the layer  head (MFLOP)")
for n_v, T, att, rest, head in rows:
    print(f"{n_v:8d} {T:5d} {att / 1e6:14.1f} {rest / 1e6:18.1f} {head / 1e6:13.1f}")
(_, T0, att0, _, _), (_, T1, att1, _, _) = rows[0], rows[-1]
print(f"{T0 / T1:.2f}x fewer tokens cut attention's T^2 term {att0 / att1:.1f}x")
assert att0 * T1 ** 2 == att1 * T0 ** 2 and T0 / T1 > 2       # the square, exactly
# the whole chat prompt of section 7 is a few dozen tokens, hundreds of bytes
print(f"section 7's chat prompt: {len(text.encode())} bytes, {len(ids)} tokens")

fig, ax = plt.subplots(figsize=(5, 3.5))
n_v = [r[0] for r in rows]
for j, label in [(2, "attention's T^2 term"), (3, "rest of the layer"), (4, "head")]:
    ax.loglog(n_v, [r[j] for r in rows], "o-", label=label, base=2)
ax.set_xlabel("n_vocab")
ax.set_ylabel("FLOPs for 2,048 characters")
ax.legend()
show(fig, alt="FLOPs for the same 2,048 characters against vocabulary size: attention's T^2 "
              "term falls fastest, the rest of the layer falls as T, the head's cost rises.")

# %% [markdown]

# %% [raw] concept="t-squared"
# question: A tokenizer makes a text 2 times shorter in tokens than in bytes (T halves). By what
#   factor does attention's $T^2$ score term fall?
# kind: numeric
# answer: 4
# tolerance: 0
# section: '9.'
# right: 'The score matrix is $T \times T$: halving $T$ divides it by $2^2 = 4$ (section 9 measured
#   2.09 times fewer tokens and a 4.3 times smaller term, the square exactly).'
# wrong:
#   2:
#     misconception: Attention's cost taken as linear in T
#     explain: The rest of the layer (projections, FFN) falls by 2, linear in $T$; the scores, one
#       per query-key pair, fall by the square.
#   1.41:
#     misconception: Square root instead of square
#     explain: The term grows as $T^2$, not $\sqrt{T}$.
#   other:
#     misconception: Not from the T^2 law
#     explain: Scores $= T \cdot T$; with $T/2$ tokens, $(T/2)^2 = T^2/4$.

# %% [markdown]
# ## Summary
#
# - Text is bytes: UTF-8 writes each code point in 1 to 4 bytes, so a vocabulary that starts
#   from the 256 byte values has an id sequence for every string and never an unknown symbol; a
#   character vocabulary of the corpus (103 characters) lacks most of the characters of other
#   scripts.
# - BPE training counts adjacent pairs (as the merge makes them: `(a, a)` once in `aaa`), merges
#   the most frequent (ties: the smallest pair of ranks), and repeats; the merge list in order is
#   the tokenizer.
# - GPT-2's regex cuts the text first and no merge crosses a cut (measured: 0 tokens span a cut
#   with it, dozens without it).
# - The naive loop recounts the corpus at every merge; the incremental update recounts only the
#   pre-tokens that held the merged pair, and learns the same merges.
# - Encoding applies merges in rank order; decoding joins the bytes and decodes once, so every
#   string survives the round trip and a character cut between tokens is not lost.
# - With `tokenizers`' two rules (window counts, ties by its ids) our trainer gives its merges
#   and ids exactly; with ours the lists part at merge 2 (indentation's runs of spaces), and
#   share 487 of 500 merges.
# - SmolLM2's tokenizer rebuilt from its GGUF file gives `transformers`' ids for the chat
#   template, special tokens included.
# - Compression grows with the vocabulary on text like the training text (2.24 bytes per token
#   at 1,280 ids; Python source, which we expected to do worse, 2.73) and hardly at all on text
#   unlike it (1.15 for other scripts); fewer tokens cut attention's $T^2$ cost by the square of
#   the compression while the head's cost grows with $n_{vocab}$.
#
# **Exercises:** [`work/12_tokens.ipynb`](../work/12_tokens.ipynb): count pairs, merge, train,
# encode by rank, decode, special tokens; set 10's chat turn then runs on your tokenizer.
#
# Next: [lesson 03](03_heads.ipynb), multi-head and grouped-query attention.
