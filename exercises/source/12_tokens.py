# ---
# jupyter:
#   txlearn:
#     title: "Exercises 12: byte-level BPE from scratch"
#     minutes: 90
#     objectives:
#     - count the adjacent pairs of a sequence of ids as a merge makes them
#     - replace every occurrence of a pair by a new id, left to right
#     - train byte-level BPE on the pieces of GPT-2's split, with a stated tie rule
#     - encode text by applying the merges in rank order
#     - decode ids as one byte stream, invalid UTF-8 included
#     - keep special tokens whole while the rest of the text is encoded
#     imports: [regex]
#     lessons: [11_tokens]
#     limits: {call_seconds: 20}
# ---

# %% [markdown]
# Everything here is plain Python: ids are `int`, a sequence of ids is a `list`, a pair is a
# tuple `(a, b)`. The rules are those of lesson 11:
#
# - byte `b` is id `b` (0 to 255); the `k`-th merge (counting from 0) makes id `256 + k`;
# - a pair is counted as the merge makes it: left to right, an occurrence that overlaps the last
#   counted occurrence of the *same* pair is skipped (`(a, a)` counts once in `a a a`);
# - ties: among pairs of equal count, the smallest pair `(a, b)` wins (compare the tuples);
# - merges never cross the pieces of GPT-2's split (`SPLIT.findall(text)` below):
#   `SPLIT.findall("Hello world, it's 2024!  \n")` is
#   `['Hello', ' world', ',', ' it', "'s", ' 2024', '!', '  \n']`.
#
# Set 10's chat turn runs on your `encode_with_special` and `decode` of this set, loaded with
# SmolLM2's merges from its GGUF file.

# %%
import regex

# GPT-2's pre-tokenisation split (Radford et al. 2019): contractions, letters, digits, symbols,
# whitespace. Every piece is trained and encoded on its own.
SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                      r"""|\s+(?!\S)|\s+""")

# %% [markdown]
# ## Exercise 1: count the pairs
#
# Write `count_pairs(ids)`: a `dict` mapping each adjacent pair `(ids[i], ids[i + 1])` to how
# often a left-to-right merge of that pair would replace it. Examples: `[1, 2, 1, 2]` gives
# `{(1, 2): 2, (2, 1): 1}`; `[7, 7, 7]` gives `{(7, 7): 1}` (merging makes `[77, 7]`: once), and
# `[7, 7, 7, 7]` gives `{(7, 7): 2}`. An empty list or a single id has no pairs.

# %% tags=["answer"] exercise="count_pairs"
def count_pairs(ids):
    ### BEGIN SOLUTION
    counts = {}
    ends = {}   # pair -> index of the second id of its last counted occurrence
    for i in range(len(ids) - 1):
        pair = (ids[i], ids[i + 1])
        if ends.get(pair) == i:   # overlaps the occurrence just counted: (a, a, a)
            continue
        counts[pair] = counts.get(pair, 0) + 1
        ends[pair] = i + 1
    return counts
    ### END SOLUTION

# %% tags=["check"] exercise="count_pairs"
from txlearn.checks import check
check("count_pairs", count_pairs)

# %% [markdown]
# ## Exercise 2: merge a pair
#
# Write `merge(ids, pair, new_id)`: a new list in which every occurrence of `pair`, scanned left
# to right, is replaced by `new_id`; everything else is copied, the last id included. Do not
# change `ids` itself. Examples: `merge([1, 2, 3, 1, 2], (1, 2), 256)` gives `[256, 3, 256]`;
# `merge([7, 7, 7], (7, 7), 256)` gives `[256, 7]`.

# %% tags=["answer"] exercise="merge_pair"
def merge(ids, pair, new_id):
    ### BEGIN SOLUTION
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
    ### END SOLUTION

# %% tags=["check"] exercise="merge_pair"
from txlearn.checks import check
check("merge_pair", merge)

# %% [markdown]
# ## Exercise 3: train
#
# Write `train(text, n_merges)`, returning the list of merges `[(a, b), ...]` in the order they
# were learnt (merge `k` made id `256 + k`):
#
# 1. cut `text` with `SPLIT.findall`, and turn each piece into its UTF-8 bytes
#    (`list(piece.encode("utf-8"))`); count how often each distinct piece occurs;
# 2. count the pairs of every distinct piece with your `count_pairs`, times the piece's count;
# 3. take the most frequent pair (ties: the smallest), give it the next id, replace it in every
#    piece with your `merge`, and repeat from 2 until `n_merges` merges are made or no pair is left.
#
# Example: `train("aaa bb bb", 1)` gives `[(32, 98)]`: `" b"` occurs twice (the pieces are
# `"aaa"`, `" bb"`, `" bb"`), more than `(a, a)` (once, in "aaa") and `(b, b)` (twice, but the
# tie is broken by the smaller pair, `(32, 98) < (98, 98)`).

# %% tags=["answer"] exercise="train_bpe"
def train(text, n_merges):
    ### BEGIN SOLUTION
    words = {}
    for piece in SPLIT.findall(text):
        key = tuple(piece.encode("utf-8"))
        words[key] = words.get(key, 0) + 1
    merges = []
    for k in range(n_merges):
        counts = {}
        for word, n in words.items():
            for pair, c in count_pairs(list(word)).items():
                counts[pair] = counts.get(pair, 0) + c * n
        if not counts:
            break
        top = max(counts.values())
        best = min(pair for pair, c in counts.items() if c == top)
        merges.append(best)
        merged = {}
        for word, n in words.items():
            new = tuple(merge(list(word), best, 256 + k))
            merged[new] = merged.get(new, 0) + n
        words = merged
    return merges
    ### END SOLUTION

# %% tags=["check"] exercise="train_bpe"
from txlearn.checks import check
check("train_bpe", train)

# %% [markdown]
# ## Exercise 4: encode by rank
#
# Write `encode(text, merges)`, the ids of `text`: cut it with `SPLIT.findall`; start each piece
# from its UTF-8 bytes; then repeatedly merge the pair of adjacent ids that was **learnt
# earliest** (the smallest index in `merges`) among the pairs present, until no pair of the piece
# is in `merges`. Pieces are never merged with each other. Not the most frequent pair: that was
# training's rule, and encoding must reproduce the splits training made.
#
# Example: with `merges = [(97, 98), (97, 97)]`, `encode("aab", merges)` is `[97, 256]`.

# %% tags=["answer"] exercise="encode_bpe"
def encode(text, merges):
    ### BEGIN SOLUTION
    ranks = {tuple(pair): k for k, pair in enumerate(merges)}
    ids = []
    for piece in SPLIT.findall(text):
        symbols = list(piece.encode("utf-8"))
        while len(symbols) > 1:
            present = set(zip(symbols, symbols[1:]))
            best = min(present, key=lambda p: ranks.get(p, len(ranks)))
            if best not in ranks:
                break
            symbols = merge(symbols, best, 256 + ranks[best])
        ids.extend(symbols)
    return ids
    ### END SOLUTION

# %% tags=["check"] exercise="encode_bpe"
from txlearn.checks import check
check("encode_bpe", encode)

# %% [markdown]
# ## Exercise 5: decode the byte stream
#
# Write `decode(ids, merges)`, the text of `ids`: the bytes of id `b < 256` are `bytes([b])`, those
# of id `256 + k` are the bytes of `merges[k][0]` followed by those of `merges[k][1]`. Join the
# bytes of **all** ids and decode the whole stream once as UTF-8 with `errors="replace"`: a
# character may be cut between two tokens, and bytes that are not valid UTF-8 become U+FFFD
# exactly as `bytes.decode(..., errors="replace")` makes them.

# %% tags=["answer"] exercise="decode_bpe"
def decode(ids, merges):
    ### BEGIN SOLUTION
    vocab = {b: bytes([b]) for b in range(256)}
    for k, (a, b) in enumerate(merges):
        vocab[256 + k] = vocab[a] + vocab[b]
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")
    ### END SOLUTION

# %% tags=["check"] exercise="decode_bpe"
from txlearn.checks import check
check("decode_bpe", decode)

# %% [markdown]
# ## Exercise 6: special tokens
#
# Chat models mark turns with special tokens such as `<|im_start|>` and `<|im_end|>`: each is
# one id, matched in the text *before* anything else and never split by the split or the merges.
# Write `encode_with_special(text, merges, special)`, where `special` maps each special token's
# text to its id: cut `text` at every occurrence of a special token, encode the pieces between
# them with your `encode`, and put each special token's own id where it stood. A regular
# expression can find them: `regex.escape(s)` makes a token's text match literally (its `|` is
# otherwise an alternation). With `special = {}` the result is `encode(text, merges)`.

# %% tags=["answer"] exercise="special_tokens"
def encode_with_special(text, merges, special):
    ### BEGIN SOLUTION
    if not special:
        return encode(text, merges)
    longest_first = sorted(special, key=len, reverse=True)
    pattern = "(" + "|".join(regex.escape(s) for s in longest_first) + ")"
    ids = []
    for k, piece in enumerate(regex.split(pattern, text)):
        if k % 2:                  # the captured special tokens sit at the odd positions
            ids.append(special[piece])
        elif piece:
            ids.extend(encode(piece, merges))
    return ids
    ### END SOLUTION

# %% tags=["check"] exercise="special_tokens"
from txlearn.checks import check
check("special_tokens", encode_with_special)
