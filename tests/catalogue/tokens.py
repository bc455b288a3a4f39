"""Reference answers and catalogued wrong answers for set 12's checks (txlearn/checks/tokens.py),
written the way a learner writes them (plain Python, the set's SPLIT regex)."""

import regex

SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                      r"""|\s+(?!\S)|\s+""")

# ------------------------------------------------------------------ count_pairs


def count_pairs(ids):
    counts, ends = {}, {}
    for i in range(len(ids) - 1):
        pair = (ids[i], ids[i + 1])
        if ends.get(pair) == i:
            continue
        counts[pair] = counts.get(pair, 0) + 1
        ends[pair] = i + 1
    return counts


def cp_windows(ids):                 # every window: (a, a) twice in a a a
    counts = {}
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def cp_stop_early(ids):              # range(len(ids) - 2): the last pair is never counted
    counts, ends = {}, {}
    for i in range(len(ids) - 2):
        pair = (ids[i], ids[i + 1])
        if ends.get(pair) == i:
            continue
        counts[pair] = counts.get(pair, 0) + 1
        ends[pair] = i + 1
    return counts


def cp_distinct(ids):                # a set of pairs, each counted once
    return {pair: 1 for pair in set(zip(ids, ids[1:]))}


def cp_skip_after_any(ids):          # skips the next window after every counted pair
    counts, i = {}, 0
    while i < len(ids) - 1:
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + 1
        i += 2
    return counts


def cp_reversed(ids):                # (right, left)
    return {(b, a): c for (a, b), c in count_pairs(ids).items()}


# ------------------------------------------------------------------ merge_pair


def merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_drops_tail(ids, pair, new_id):   # while i < len(ids) - 1: the odd last id is lost
    out, i = [], 0
    while i < len(ids) - 1:
        if ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_first_only(ids, pair, new_id):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == tuple(pair):
            return ids[:i] + [new_id] + ids[i + 2:]
    return list(ids)


def merge_right_to_left(ids, pair, new_id):
    out, i = [], len(ids) - 1
    while i >= 0:
        if i > 0 and ids[i - 1] == pair[0] and ids[i] == pair[1]:
            out.append(new_id)
            i -= 2
        else:
            out.append(ids[i])
            i -= 1
    return out[::-1]


def merge_step_two(ids, pair, new_id):     # walks in steps of two
    out = []
    for i in range(0, len(ids) - 1, 2):
        if (ids[i], ids[i + 1]) == tuple(pair):
            out.append(new_id)
        else:
            out += ids[i:i + 2]
    if len(ids) % 2:
        out.append(ids[-1])
    return out


def merge_either_order(ids, pair, new_id):  # (b, a) replaced too
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and {ids[i], ids[i + 1]} == set(pair) and ids[i] != ids[i + 1] \
                or i + 1 < len(ids) and (ids[i], ids[i + 1]) == tuple(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


# ------------------------------------------------------------------ train_bpe


def trainer(*, split=True, windows=False, tie="smallest", weighted=True, first_id=256,
            update=True, whitespace=False):
    pair_counts = cp_windows if windows else count_pairs

    def train(text, n_merges):
        pieces = text.split() if whitespace else SPLIT.findall(text) if split else [text]
        words = {}
        for piece in pieces:
            key = tuple(piece.encode("utf-8"))
            words[key] = 1 if not weighted else words.get(key, 0) + 1
        merges = []
        for k in range(n_merges):
            counts = {}
            for word, n in words.items():
                for pair, c in pair_counts(list(word)).items():
                    counts[pair] = counts.get(pair, 0) + c * n
            if not counts:
                break
            top = max(counts.values())
            tied = [p for p, c in counts.items() if c == top]
            best = {"smallest": min, "largest": max, "first": lambda t: t[0]}[tie](tied)
            merges.append(best)
            if update:
                merged = {}
                for word, n in words.items():
                    new = tuple(merge(list(word), best, first_id + k))
                    merged[new] = merged.get(new, 0) + n
                words = merged
        return merges
    return train


train = trainer()


# ------------------------------------------------------------------ encode_bpe


def encoder(*, split=True, order="rank", codepoints=False, first_id=256):
    def encode(text, merges):
        ranks = {tuple(p): k for k, p in enumerate(merges)}
        ids = []
        for piece in SPLIT.findall(text) if split else [text]:
            symbols = [ord(c) for c in piece] if codepoints else list(piece.encode("utf-8"))
            while len(symbols) > 1:
                pairs = [p for p in zip(symbols, symbols[1:]) if p in ranks]
                if not pairs:
                    break
                if order == "rank":
                    best = min(pairs, key=ranks.get)
                elif order == "latest":
                    best = max(pairs, key=ranks.get)
                elif order == "leftmost":
                    best = pairs[0]
                else:                               # training's rule: the most frequent pair
                    counts = count_pairs(symbols)
                    best = max(pairs, key=lambda p: (counts[p], -ranks[p]))
                symbols = merge(symbols, best, first_id + ranks[best])
            ids.extend(symbols)
        return ids
    return encode


encode = encoder()


# ------------------------------------------------------------------ decode_bpe


def _vocab(merges, swapped=False):
    vocab = {b: bytes([b]) for b in range(256)}
    for k, (a, b) in enumerate(merges):
        vocab[256 + k] = vocab[b] + vocab[a] if swapped else vocab[a] + vocab[b]
    return vocab


def decode(ids, merges):
    return b"".join(_vocab(merges)[i] for i in ids).decode("utf-8", errors="replace")


def decode_per_token(ids, merges):
    vocab = _vocab(merges)
    return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)


def decode_ignore(ids, merges):
    return b"".join(_vocab(merges)[i] for i in ids).decode("utf-8", errors="ignore")


def decode_chr(ids, merges):              # chr(byte) per byte: Latin-1, not UTF-8
    return "".join(chr(b) for i in ids for b in _vocab(merges)[i])


def decode_swapped(ids, merges):
    return b"".join(_vocab(merges, swapped=True)[i] for i in ids).decode("utf-8",
                                                                         errors="replace")


def decode_strict(ids, merges):
    return b"".join(_vocab(merges)[i] for i in ids).decode("utf-8")


# ------------------------------------------------------------------ special_tokens


def special_encoder(*, mode="right"):
    def encode_with_special(text, merges, special):
        if not special or mode == "ignored":
            return encode(text, merges)
        keys = list(special)[:1] if mode == "one" else sorted(special, key=len, reverse=True)
        parts = keys if mode == "unescaped" else [regex.escape(s) for s in keys]
        ids = []
        for k, piece in enumerate(regex.split("(" + "|".join(parts) + ")", text)):
            if k % 2:
                if mode == "position":
                    ids.append(list(special).index(piece))
                elif mode != "dropped":
                    ids.append(special[piece])
            elif piece:
                ids.extend(encode(piece, merges))
        return ids
    return encode_with_special


REFERENCE = {
    "count_pairs": (count_pairs,),
    "merge_pair": (merge,),
    "train_bpe": (train,),
    "encode_bpe": (encode,),
    "decode_bpe": (decode,),
    "special_tokens": (special_encoder(),),
}

WRONG = {
    "count_pairs": [
        ("overlapping windows counted: (a, a) twice in aaa", (cp_windows,), "you counted every window"),
        ("the last pair never counted", (cp_stop_early,), "you stopped one pair early"),
        ("each distinct pair counted once", (cp_distinct,), "count how often it occurs"),
        ("the window after every counted pair skipped", (cp_skip_after_any,),
         "only an occurrence of the *same* pair"),
        ("pairs as (right, left)", (cp_reversed,), "(ids[i], ids[i + 1]), in that order"),
    ],
    "merge_pair": [
        ("the last id of an odd sequence lost", (merge_drops_tail,), "your loop stops before it"),
        ("only the first occurrence replaced", (merge_first_only,), "after the first replacement"),
        ("scanned right to left", (merge_right_to_left,), "not [7, new]"),
        ("steps of two", (merge_step_two,), "you moved two"),
        ("the pair matched in either order", (merge_either_order,), "the other way round"),
    ],
    "train_bpe": [
        ("no pre-tokenisation: merges across the split", (trainer(split=False),),
         "you counted pairs across the pieces"),
        ("overlapping windows counted", (trainer(windows=True),), "not every window"),
        ("ties broken by the largest pair", (trainer(tie="largest"),), "take the smallest pair"),
        ("ties broken by the first pair seen", (trainer(tie="first"),), "take the smallest pair"),
        ("each distinct piece counted once", (trainer(weighted=False),), "how often the piece occurs"),
        ("merge k makes id 255 + k", (trainer(first_id=255),), "makes id 256 + k"),
        ("merge k makes id k", (trainer(first_id=0),), "makes id 256 + k"),
        ("the pieces never updated after a merge", (trainer(update=False),),
         "otherwise the same pair wins again"),
        ("str.split() instead of the regex", (trainer(whitespace=True),), "throws the spaces away"),
    ],
    "encode_bpe": [
        ("no pre-tokenisation: merges across the split", (encoder(split=False),),
         "you merged across them"),
        ("merges in frequency order (training's rule)", (encoder(order="frequency"),),
         "not the most frequent in the text"),
        ("the latest merge first", (encoder(order="latest"),), "you took the latest"),
        ("the leftmost pair first", (encoder(order="leftmost"),), "you merged left to right"),
        ("code points instead of UTF-8 bytes", (encoder(codepoints=True),), "is a code point"),
        ("merge k gives id k", (encoder(first_id=0),), "merge k makes id 256 + k"),
    ],
    "decode_bpe": [
        ("decoded token by token", (decode_per_token,), "decode the stream once"),
        ("errors='ignore'", (decode_ignore,), "errors='ignore' drops it"),
        ("chr() per byte (Latin-1)", (decode_chr,), "chr(byte) per byte is not utf-8"),
        ("a merge's bytes joined b + a", (decode_swapped,), "followed by those of b"),
        ("strict decoding raises on invalid bytes", (decode_strict,), "the strict default raises"),
    ],
    "special_tokens": [
        ("special tokens split by the merges", (special_encoder(mode="ignored"),),
         "so it was split into pieces"),
        ("special tokens dropped", (special_encoder(mode="dropped"),), "left their ids out"),
        ("only the first special token matched", (special_encoder(mode="one"),),
         "match all the keys"),
        ("ids by position in the dict", (special_encoder(mode="position"),),
         "not its position in the dict"),
        ("token text used as a pattern unescaped", (special_encoder(mode="unescaped"),),
         "is an alternation in a pattern"),
    ],
}

DEPENDENT = {
    "train_bpe": [
        ("train on a count_pairs that counts windows", (trainer(windows=True),),
         {"count_pairs": cp_windows, "merge": merge}, "fix count_pairs first"),
    ],
}
