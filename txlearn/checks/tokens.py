"""Checks of set 12, byte-level BPE from scratch: count_pairs, merge_pair, train_bpe, encode_bpe,
decode_bpe and special_tokens.

Answers are plain Python (ids as int, pairs as tuples, lists, dicts, str); the right values come
from :mod:`txlearn.tokens` (tested against the ``tokenizers`` library and against SmolLM2's
tokenizer in ``tests/test_tokens.py``). When an answer is wrong, each catalogued mistake
(``tests/catalogue/tokens.py``) is replayed on the same input, and the first whose output equals
the answer chooses the hint. The inputs make each mistake show: ``aaa`` and ``abab`` for the
counting rule, an odd-length sequence for the last id, tied pairs for the tie rule, a merge that
would cross a piece of GPT-2's split, a merge list whose rank order is not the text's frequency
order, a character cut between two tokens and invalid UTF-8 in the middle of the stream, two
special tokens side by side. Source: ``exercises/source/12_tokens.py``; lesson 11.
"""

from __future__ import annotations

from collections import Counter

import regex

from txlearn.checks import CheckFailure, call, exercise
from txlearn.tokens import BPE, count_pairs as count_pairs_ref, decode as decode_ref
from txlearn.tokens import encode as encode_ref, pretokenize, train_bpe as train_ref

# ----------------------------------------------------------------------------- helpers


def _ints(got, what: str, case: str, hint) -> list[int]:
    """The learner's ``got`` as a list of int, or a CheckFailure saying what it is instead."""
    if isinstance(got, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool)
                                              or type(i).__module__ == "numpy" for i in got):
        try:
            return [int(i) for i in got]
        except (TypeError, ValueError):
            pass
    raise CheckFailure(f"expected {what} (a list of int), got {type(got).__name__}", case=case,
                       hint=hint)


def _pairs(got, case: str, hint) -> list[tuple[int, int]]:
    if isinstance(got, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2
                                              for p in got):
        try:
            return [(int(a), int(b)) for a, b in got]
        except (TypeError, ValueError):
            pass
    raise CheckFailure(f"expected a list of pairs (a, b), got {type(got).__name__}", case=case,
                       hint=hint)


def _counts(got, case: str, hint) -> dict[tuple[int, int], int]:
    if isinstance(got, (dict, Counter)):
        try:
            return {(int(k[0]), int(k[1])): int(v) for k, v in got.items() if len(k) == 2}
        except (TypeError, ValueError, IndexError):
            pass
    raise CheckFailure(f"expected a dict {{(a, b): count}}, got {type(got).__name__}", case=case,
                       hint=hint)


def _difference(got, expected) -> str:
    """Where a list, a dict of counts or a str first differs from the expected one."""
    if isinstance(expected, dict):
        for pair in sorted(set(got) | set(expected)):
            if got.get(pair, 0) != expected.get(pair, 0):
                return (f"pair {pair}: got count {got.get(pair, 0)}, expected "
                        f"{expected.get(pair, 0)}")
    n = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), None)
    if n is None:
        return f"length {len(got)}, expected {len(expected)} (equal up to there)"
    return f"first difference at index {n}: got {got[n]!r}, expected {expected[n]!r}" + (
        f"; length {len(got)}, expected {len(expected)}" if len(got) != len(expected) else "")


def _replays(wrong, got) -> bool:
    try:
        return wrong() == got
    except Exception:            # this mistake cannot even run on these inputs
        return False


def _judge(cases, default) -> None:
    """Run ``cases`` (``(case, produce the answer, expected, mistakes)``, the mistakes a list of
    ``(function of no arguments, hint)`` in the same order for every case) and pass when every
    answer equals its expected value. Else fail on the first case that differs, naming the
    difference, with the hint of the first mistake that reproduces the answer on *every* case
    run (failing that, on the failing case alone; failing that, ``default``). A case whose call
    fails after an earlier case differed stops the run; with none differing it fails as it is."""
    done = []
    for case, produce, expected, mistakes in cases:
        try:
            got = produce()
        except CheckFailure:
            if any(g != e for _, g, e, _ in done):
                break
            raise
        done.append((case, got, expected, mistakes))
    failing = [d for d in done if d[1] != d[2]]
    if not failing:
        return
    case, got, expected, mistakes = failing[0]
    hint = next((h for j, (_, h) in enumerate(mistakes)
                 if all(_replays(d[3][j][0], d[1]) for d in done)), None)
    if hint is None:
        hint = next((h for wrong, h in mistakes if _replays(wrong, got)), default)
    raise CheckFailure(_difference(got, expected), case=case, hint=hint)


def vocab_of(merges) -> dict[int, bytes]:
    """The bytes of every id: 0..255 single bytes, ``256 + k`` the bytes of merge k's pair."""
    vocab = {b: bytes([b]) for b in range(256)}
    for k, (a, b) in enumerate(merges):
        vocab[256 + k] = vocab[a] + vocab[b]
    return vocab


def _bpe(merges) -> BPE:
    return BPE(merges=[tuple(p) for p in merges], vocab=vocab_of(merges))


# ----------------------------------------------------------------------------- count_pairs

CP_WINDOWS = ("how many times can a merge replace (a, a) in a a a?",
              "once: merging left to right makes [aa, a]; you counted every window (twice). Skip "
              "an occurrence that overlaps the last counted occurrence of the same pair")
CP_LAST = ("look at the last pair of the sequence",
           "the pairs run up to (ids[-2], ids[-1]): you stopped one pair early")
CP_SET = ("a count, not a presence",
          "you counted each distinct pair once; count how often it occurs")
CP_SKIP_ALL = ("which occurrences may overlap?",
               "only an occurrence of the *same* pair is skipped when it overlaps the one just "
               "counted; after (1, 2) in [1, 2, 1], the pair (2, 1) still counts")
CP_ORDER = ("a pair is (left, right)",
            "the pair at position i is (ids[i], ids[i + 1]), in that order")
CP_DEFAULT = ("count each adjacent pair (ids[i], ids[i + 1]) as a left-to-right merge would "
              "replace it",)


def _cp_windows(ids):
    return dict(Counter(zip(ids, ids[1:])))


def _cp_skip_all(ids):
    out, i = Counter(), 0
    while i < len(ids) - 1:
        out[(ids[i], ids[i + 1])] += 1
        i += 2
    return dict(out)


def _cp_wrongs(ids):
    return [(lambda: _cp_windows(ids), CP_WINDOWS),
            (lambda: dict(count_pairs_ref(ids[:-1])), CP_LAST),
            (lambda: {p: 1 for p in zip(ids, ids[1:])}, CP_SET),
            (lambda: _cp_skip_all(ids), CP_SKIP_ALL),
            (lambda: {(b, a): c for (a, b), c in count_pairs_ref(ids).items()}, CP_ORDER)]


CP_CASES = [("[7, 7, 7] (a a a)", [7, 7, 7]), ("[1, 2, 1, 2, 1]", [1, 2, 1, 2, 1]),
            ("[7, 7, 7, 7, 5, 7, 7, 7]", [7, 7, 7, 7, 5, 7, 7, 7]), ("[3, 1, 4, 1, 5, 9, 2, 6]",
                                                                     [3, 1, 4, 1, 5, 9, 2, 6]),
            ("[42] (no pair)", [42]), ("[] (empty)", [])]


@exercise("count_pairs")
def count_pairs(count_pairs):
    """Check `count_pairs(ids)` -> {(a, b): count}: the merge's count, overlaps of one pair."""
    _judge(((case, lambda ids=ids, case=case: _counts(
        call(count_pairs, list(ids), case=case, hint="ids is a list of int"), case, CP_DEFAULT),
        dict(count_pairs_ref(ids)), _cp_wrongs(ids)) for case, ids in CP_CASES), CP_DEFAULT)


# ----------------------------------------------------------------------------- merge_pair

MP_TAIL = ("what happens to the last id?",
           "an id left over at the end (no pair after it) must be copied too: your loop stops "
           "before it")
MP_FIRST = ("every occurrence, not only the first",
            "keep scanning after the first replacement until the end of the list")
MP_RIGHT = ("which way does the scan go?",
            "left to right: [7, 7, 7] with (7, 7) becomes [new, 7], not [7, new]")
MP_STEP = ("how far do you move when the pair does not match?",
           "one position: you moved two, so a pair that starts at an odd position is missed "
           "and ids are dropped")
MP_REVERSED = ("the pair's order matters",
               "replace ids[i] == pair[0] followed by ids[i + 1] == pair[1]; you matched it "
               "the other way round too")
MP_DEFAULT = ("scan left to right: where ids[i], ids[i + 1] is the pair, write new_id and skip "
              "both; else copy ids[i]",)


def _mp_tail(ids, pair, new):
    out, i = [], 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _mp_first(ids, pair, new):
    for i in range(len(ids) - 1):
        if (ids[i], ids[i + 1]) == pair:
            return ids[:i] + [new] + ids[i + 2:]
    return list(ids)


def _mp_right(ids, pair, new):
    return _merge(ids[::-1], pair[::-1], new)[::-1]


def _mp_step(ids, pair, new):
    out = []
    for i in range(0, len(ids) - 1, 2):
        out += [new] if (ids[i], ids[i + 1]) == pair else ids[i:i + 2]
    return out + ids[len(ids) - len(ids) % 2:]


def _mp_reversed(ids, pair, new):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) in (pair, pair[::-1]):
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _merge(ids, pair, new):
    """The right merge (the reference, written as the set's solution is)."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == tuple(pair):
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


MP_CASES = [("[1, 2, 3, 1, 2] with (1, 2)", [1, 2, 3, 1, 2], (1, 2), 256),
            ("[7, 7, 7] with (7, 7)", [7, 7, 7], (7, 7), 300),
            ("[5, 1, 2, 9, 1, 2, 4] with (1, 2)", [5, 1, 2, 9, 1, 2, 4], (1, 2), 256),
            ("[2, 1, 1, 2, 2, 1] with (1, 2)", [2, 1, 1, 2, 2, 1], (1, 2), 257),
            ("[1, 2] with (3, 4) (no occurrence)", [1, 2], (3, 4), 256)]


@exercise("merge_pair")
def merge_pair(merge):
    """Check `merge(ids, pair, new_id)` -> list: every occurrence, left to right, nothing lost."""
    def run(case, ids, pair, new):
        return _ints(call(merge, list(ids), pair, new, case=case,
                          hint="ids is a list of int, pair a tuple (a, b), new_id an int"),
                     "the merged ids", case, MP_DEFAULT)

    mistakes = [(_mp_tail, MP_TAIL), (_mp_first, MP_FIRST), (_mp_right, MP_RIGHT),
                (_mp_step, MP_STEP), (_mp_reversed, MP_REVERSED)]
    _judge(((case, lambda c=c: run(*c), _merge(list(ids), pair, new),
             [(lambda f=f, c=c: f(list(c[1]), c[2], c[3]), h) for f, h in mistakes])
            for c in MP_CASES for case, ids, pair, new in [c]), MP_DEFAULT)


# ----------------------------------------------------------------------------- train_bpe

TR_NO_SPLIT = ("may a merge cross from one word to the next?",
               "never: cut the text with SPLIT.findall first and count pairs inside each piece; "
               "you counted pairs across the pieces (e.g. a letter and the space after it)")
TR_WINDOWS = ("how often does (a, a) count in a a a?",
              "as the merge makes it: once. Use your count_pairs (an overlapping occurrence of the "
              "same pair is skipped), not every window")
TR_TIES = ("which pair wins a tie?",
           "among pairs of equal count take the smallest pair (a, b), comparing the tuples")
TR_UNWEIGHTED = ("does a piece that occurs three times count once?",
                 "multiply each distinct piece's pair counts by how often the piece occurs")
TR_IDS = ("which id does merge k make?",
          "the k-th merge (k from 0) makes id 256 + k: ids 0..255 are the bytes")
TR_NOT_MERGED = ("after a merge, are the pieces updated?",
                 "replace the merged pair in every piece (your merge) before counting again; "
                 "otherwise the same pair wins again")
TR_WHITESPACE = ("where did the spaces go?",
                 "cut with SPLIT.findall, which keeps every character (a space starts the next "
                 "word's piece); str.split() throws the spaces away")
TR_DEFAULT = ("count the pairs of every distinct piece (times its count), merge the most "
              "frequent (ties: the smallest pair), repeat",)


def train_variant(text, n_merges, *, split=True, windows=False, ties="smallest", weighted=True,
                  first_id=256, update=True, whitespace=False):
    """What a training loop computes with one catalogued mistake (the set's naive loop)."""
    pieces = text.split() if whitespace else (pretokenize(text) if split else [text])
    words = Counter(tuple(p.encode("utf-8")) for p in pieces)
    if not weighted:
        words = Counter({w: 1 for w in words})
    merges = []
    for k in range(n_merges):
        counts = Counter()
        for w, n in words.items():
            pairs = Counter(zip(w, w[1:])) if windows else count_pairs_ref(list(w))
            for p, c in pairs.items():
                counts[p] += c * n
        if not counts:
            break
        top = max(counts.values())
        tied = [p for p, c in counts.items() if c == top]
        best = min(tied) if ties == "smallest" else max(tied) if ties == "largest" else tied[0]
        merges.append(best)
        if update:
            new_words = Counter()
            for w, n in words.items():
                new_words[tuple(_merge(list(w), best, first_id + k))] += n
            words = new_words
    return merges


TR_VARIANTS = [(dict(split=False), TR_NO_SPLIT), (dict(windows=True), TR_WINDOWS),
               (dict(ties="largest"), TR_TIES), (dict(ties="first"), TR_TIES),
               (dict(weighted=False), TR_UNWEIGHTED), (dict(first_id=255), TR_IDS),
               (dict(first_id=257), TR_IDS), (dict(first_id=0), TR_IDS),
               (dict(update=False), TR_NOT_MERGED), (dict(whitespace=True), TR_WHITESPACE)]

TR_CASES = [('"aaa bb bb", 1 merge', "aaa bb bb", 1),
            ('"aaa,bb,bb", 2 merges ((a, a) once in aaa)', "aaa,bb,bb", 2),
            ('"the cat. the hat. the mat.", 6 merges',
             "the cat. the hat. the mat.", 6),
            ('"de ed de ed de", 3 merges (tied pairs)', "de ed de ed de", 3),
            ("a paragraph of the language reference, 40 merges", None, 40)]


def _reference_text() -> str:
    from txlearn.training.data import load_corpus
    return load_corpus()[2000:3500]


@exercise("train_bpe", needs=("count_pairs", "merge_pair"))
def train_bpe(train):
    """Check `train(text, n_merges)` -> [(a, b), ...] against txlearn.tokens.train_bpe."""
    def cases():
        for case, text, n in TR_CASES:
            text = _reference_text() if text is None else text
            yield (case, lambda case=case, text=text, n=n: _pairs(
                       call(train, text, n, case=case, hint="text is a str, n_merges an int"),
                       case, TR_DEFAULT),
                   list(train_ref(text, 256 + n).merges),
                   [(lambda kw=kw, text=text, n=n: train_variant(text, n, **kw), h)
                    for kw, h in TR_VARIANTS])
    _judge(cases(), TR_DEFAULT)


# ----------------------------------------------------------------------------- encode_bpe

EN_NO_SPLIT = ("may a merge join two pieces of the split?",
               "no: encode each piece of SPLIT.findall(text) on its own; you merged across them")
EN_FREQUENCY = ("which pair is merged first when encoding?",
                "the one learnt earliest (smallest index in merges), not the most frequent in "
                "the text: that was training's rule")
EN_REVERSED = ("earliest or latest?",
               "merge the pair with the *smallest* index in merges first; you took the latest")
EN_LEFTMOST = ("the leftmost pair is not always the earliest",
               "among all adjacent pairs present, merge the one with the smallest index in "
               "merges, wherever it is; you merged left to right")
EN_ORD = ("what are the bytes of 'é'?",
          "start from the UTF-8 bytes (piece.encode('utf-8')): 'é' is [195, 169]; ord('é') = 233 "
          "is a code point, not a byte")
EN_IDS = ("which id does merge k make?", "merge k makes id 256 + k")
EN_DEFAULT = ("per piece of the split: start from its UTF-8 bytes and repeatedly merge the "
              "present pair with the smallest index in merges",)


def encode_variant(text, merges, *, split=True, order="rank", codepoints=False, first_id=256):
    """What an encoder computes with one catalogued mistake."""
    ranks = {tuple(p): k for k, p in enumerate(merges)}
    ids = []
    for piece in (pretokenize(text) if split else [text]):
        s = [ord(c) for c in piece] if codepoints else list(piece.encode("utf-8"))
        while len(s) > 1:
            present = [p for p in zip(s, s[1:]) if p in ranks]
            if not present:
                break
            if order == "rank":
                best = min(present, key=ranks.get)
            elif order == "latest":
                best = max(present, key=ranks.get)
            elif order == "leftmost":
                best = present[0]
            else:                                   # the most frequent pair of the piece
                c = count_pairs_ref(s)
                best = max(present, key=lambda p: (c[p], -ranks[p]))
            s = _merge(s, best, first_id + ranks[best])
        ids += s
    return ids


EN_VARIANTS = [(dict(split=False), EN_NO_SPLIT), (dict(order="frequency"), EN_FREQUENCY),
               (dict(order="latest"), EN_REVERSED), (dict(order="leftmost"), EN_LEFTMOST),
               (dict(codepoints=True), EN_ORD), (dict(first_id=0), EN_IDS),
               (dict(first_id=255), EN_IDS)]

# a merge that crosses GPT-2's split: "e" then a space (learnt without the split)
_CROSSING = [(101, 32), (116, 104), (256, 257)]


def _en_cases():
    yield '"cab" with merges [(c, a), (a, b)]', "cab", [(99, 97), (97, 98)]
    yield '"cab" with merges [(a, b), (c, a)] (the earliest pair is not the leftmost)', "cab", \
        [(97, 98), (99, 97)]
    yield '"abcbc" with merges [(a, b), (b, c)] (rank order is not frequency order)', "abcbc", \
        [(97, 98), (98, 99)]
    yield '"aab" with merges [(a, b), (a, a)]', "aab", [(97, 98), (97, 97)]
    yield '"the the" with a merge (e, space)', "the the", _CROSSING
    text = "Café au lait, naïve 😀"
    yield '"Café au lait, naïve 😀" (UTF-8 bytes)', text, list(train_ref(text * 3, 256 + 12).merges)
    ref = _reference_text()
    yield "a paragraph of the language reference, 60 merges", ref[:600], \
        list(train_ref(ref, 256 + 60).merges)


@exercise("encode_bpe", needs=("merge_pair",))
def encode_bpe(encode):
    """Check `encode(text, merges)` -> ids against txlearn.tokens.encode."""
    def cases():
        for case, text, merges in _en_cases():
            yield (case, lambda case=case, text=text, merges=merges: _ints(
                       call(encode, text, [tuple(p) for p in merges], case=case,
                            hint="text is a str, merges a list of (a, b) tuples"),
                       "the ids", case, EN_DEFAULT),
                   encode_ref(_bpe(merges), text),
                   [(lambda kw=kw, text=text, merges=merges: encode_variant(text, merges, **kw), h)
                    for kw, h in EN_VARIANTS])
    _judge(cases(), EN_DEFAULT)


# ----------------------------------------------------------------------------- decode_bpe

DE_PER_TOKEN = ("what if a character's bytes are split between two tokens?",
                "join the bytes of all ids first, then decode the stream once: decoding token by "
                "token turns each part of a cut character into U+FFFD")
DE_IGNORE = ("what should become of bytes that are not UTF-8?",
             "each invalid sequence becomes U+FFFD (errors='replace'); errors='ignore' drops it")
DE_LATIN1 = ("is every byte a character?",
             "only in Latin-1: decode the joined bytes as UTF-8 (bytes.decode('utf-8', "
             "errors='replace')), where 'é' is two bytes; chr(byte) per byte is not UTF-8")
DE_SWAPPED = ("in which order are a merge's bytes joined?",
              "merge k = (a, b) has the bytes of a followed by those of b")
DE_STRICT = ("invalid UTF-8 in the middle of the stream",
             "decode with errors='replace': the strict default raises UnicodeDecodeError on "
             "bytes that are not UTF-8, and a token may end in the middle of a character")
DE_DEFAULT = ("join the bytes of every id, then decode once: "
              "bytes.decode('utf-8', errors='replace')",)


def decode_variant(ids, merges, *, per_token=False, errors="replace", latin1=False,
                   swapped=False):
    """What a decoder computes with one catalogued mistake."""
    vocab = {b: bytes([b]) for b in range(256)}
    for k, (a, b) in enumerate(merges):
        vocab[256 + k] = vocab[b] + vocab[a] if swapped else vocab[a] + vocab[b]
    if latin1:
        return b"".join(vocab[i] for i in ids).decode("latin-1")
    if per_token:
        return "".join(vocab[i].decode("utf-8", errors=errors) for i in ids)
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors=errors)


DE_VARIANTS = [(dict(per_token=True), DE_PER_TOKEN), (dict(errors="ignore"), DE_IGNORE),
               (dict(latin1=True), DE_LATIN1), (dict(swapped=True), DE_SWAPPED)]


def _de_cases():
    merges = [(104, 101), (256, 108), (240, 159), (258, 152), (259, 128)]   # "hel", 4-byte "😀"
    yield '"hello" from merges', [257, 108, 111], merges
    yield '"😀" split over two tokens', [240, 159, 152, 128, 33], merges
    yield '"😀" as one token', [260, 32, 257, 108, 111], merges
    yield '"é" cut between two ids, then ff fe (not UTF-8) mid-stream', \
        [195, 169, 195, 255, 254, 111, 107], merges
    text = "Tokens: naïve café, 日本 😀"
    trained = list(train_ref(text * 2, 256 + 10).merges)
    yield "a trained vocabulary on 'Tokens: naïve café, 日本 😀'", encode_ref(_bpe(trained), text), \
        trained


@exercise("decode_bpe")
def decode_bpe(decode):
    """Check `decode(ids, merges)` -> str: one byte stream, errors='replace'."""
    def run(case, ids, merges):
        got = call(decode, list(ids), [tuple(p) for p in merges], case=case, hint=DE_STRICT)
        if not isinstance(got, str):
            raise CheckFailure(f"expected a str, got {type(got).__name__}", case=case,
                               hint=DE_DEFAULT)
        return got

    def cases():
        for case, ids, merges in _de_cases():
            yield (case, lambda c=(case, ids, merges): run(*c), decode_ref(_bpe(merges), ids),
                   [(lambda kw=kw, ids=ids, merges=merges: decode_variant(ids, merges, **kw), h)
                    for kw, h in DE_VARIANTS])
    _judge(cases(), DE_DEFAULT)


# ----------------------------------------------------------------------------- special_tokens

SP_IGNORED = ("what happened to <|im_start|>?",
              "a special token is one id, matched before the split and the merges: you encoded "
              "its text like any other text, so it was split into pieces")
SP_DROPPED = ("where is the special token's id?",
              "put special[s] where each special token stood; you cut the text at the special "
              "tokens but left their ids out")
SP_ONE = ("every special token, not only one",
          "match all the keys of `special` (one pattern with all of them)")
SP_POSITION = ("which id does a special token get?",
               "the one `special` maps it to (special[s]), not its position in the dict")
SP_ESCAPE = ("a special token's text is not a regular expression",
             '"|" in "<|im_end|>" is an alternation in a pattern: escape each token"s text '
             "(regex.escape) before joining them with '|'")
SP_DEFAULT = ("cut the text at the special tokens, encode the pieces between them, and put each "
              "special token's own id where it stood",)


def special_variant(text, merges, special, *, mode):
    """What an encoder with special tokens computes with one catalogued mistake."""
    bpe = _bpe(merges)
    keys = list(special)[:1] if mode == "one" else list(special)
    if mode == "ignored" or not keys:
        return encode_ref(bpe, text)
    pattern = "(" + "|".join(regex.escape(s) for s in sorted(keys, key=len, reverse=True)) + ")"
    out = []
    for k, piece in enumerate(regex.split(pattern, text)):
        if k % 2:
            if mode != "dropped":
                out.append(list(special).index(piece) if mode == "position" else special[piece])
        elif piece:
            out += encode_ref(bpe, piece)
    return out


SP_VARIANTS = [(dict(mode="ignored"), SP_IGNORED), (dict(mode="dropped"), SP_DROPPED),
               (dict(mode="one"), SP_ONE), (dict(mode="position"), SP_POSITION)]


def _sp_cases():
    text = "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n"
    merges = list(train_ref("user assistant Hi there! " * 3 + text, 256 + 20).merges)
    special = {"<|im_start|>": 300, "<|im_end|>": 301}
    yield "a chat turn with <|im_start|> and <|im_end|>", text, merges, special
    yield "two special tokens side by side: '<|im_end|><|im_start|>x'", \
        "<|im_end|><|im_start|>x", merges, special
    yield "no special token in the text", "Hi there!", merges, special
    yield "an empty dict of special tokens", "Hi <|im_end|>", merges, {}


@exercise("special_tokens", needs=("encode_bpe",))
def special_tokens(encode_with_special):
    """Check `encode_with_special(text, merges, special)` -> ids: special tokens whole."""
    def run(case, text, merges, special):
        return _ints(call(encode_with_special, text, [tuple(p) for p in merges], dict(special),
                          case=case, hint=SP_ESCAPE), "the ids", case, SP_DEFAULT)

    def cases():
        for c in _sp_cases():
            _, text, merges, special = c
            vocab = {**vocab_of(merges), **{i: s.encode() for s, i in special.items()}}
            bpe = BPE(merges=[tuple(p) for p in merges], vocab=vocab, special=dict(special))
            yield (c[0], lambda c=c: run(*c), encode_ref(bpe, text),
                   [(lambda kw=kw, c=c: special_variant(*c[1:], **kw), h)
                    for kw, h in SP_VARIANTS])
    _judge(cases(), SP_DEFAULT)


DEFAULTS = {
    "count_pairs": [CP_DEFAULT],
    "merge_pair": [MP_DEFAULT],
    "train_bpe": [TR_DEFAULT],
    "encode_bpe": [EN_DEFAULT],
    "decode_bpe": [DE_DEFAULT],
    "special_tokens": [SP_DEFAULT],
}
