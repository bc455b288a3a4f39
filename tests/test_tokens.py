"""txlearn.tokens: byte-level BPE round trips on hostile strings, decoding a byte stream once,
the pair-counting rule, equality with the ``tokenizers`` library's trainer (and exactly where its
rules differ), and SmolLM2's tokenizer rebuilt from its GGUF file giving ``transformers``' ids."""

import json

import pytest

from txlearn.tokens import (BPE, HF_BYTE_ORDER, byte_to_unicode, count_pairs, decode, encode,
                            from_byte_level, pretokenize, train_bpe, train_bpe_naive)
from txlearn.training.data import load_corpus

TEXT = load_corpus()[:6000]      # 6 KB of the course corpus (Python's language reference)
V = 256 + 300

HOSTILE = ["", "a", " ", "\n\n\n", "héllo wörld", "e\u0301 a\u0308 n\u0303",  # combining accents
           "日本語のテキスト、中文", "😀👍🏽 👨‍👩‍👧 🇫🇷", "it's 12,345.67 !!! ...", "\x00\x7f\u00a0\u00ad",
           "<|endoftext|> spaced<|endoftext|>x"]


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(TEXT, V + 1, special_tokens=["<|endoftext|>"])


def test_pretokenize_splits_like_gpt2_and_loses_nothing():
    assert pretokenize("Hello world, it's 2024!  \n") == \
        ["Hello", " world", ",", " it", "'s", " 2024", "!", "  \n"]
    for s in HOSTILE:
        assert "".join(pretokenize(s)) == s


@pytest.mark.parametrize("s", HOSTILE)
def test_round_trip_on_hostile_strings(bpe, s):
    ids = encode(bpe, s)
    assert decode(bpe, ids) == s
    assert all(0 <= i < V + 1 for i in ids)


def test_special_tokens_are_matched_first_and_never_split(bpe):
    eot = bpe.special["<|endoftext|>"]
    assert eot == V                               # after the 256 bytes and the 300 merges
    ids = encode(bpe, "a<|endoftext|><|endoftext|>b")
    assert ids == [ord("a"), eot, eot, ord("b")]
    assert encode(bpe, "<|endoftext") == encode(train_bpe(TEXT, V), "<|endoftext")  # a part: text


def test_training_compresses_and_merges_are_applied_in_rank_order(bpe):
    ids = encode(bpe, TEXT)
    assert len(TEXT.encode()) / len(ids) > 2.0     # 300 merges: over 2 bytes per token on its text
    assert bpe.merges[0] == (ord(" "), ord("t")) and bpe.vocab[256] == b" t"
    # "aab" with merges [(a,b) first, then (a,a)]: rank order gives [a, ab], not [aa, b]
    toy = BPE(merges=[(97, 98), (97, 97)],
              vocab={**{b: bytes([b]) for b in range(256)}, 256: b"ab", 257: b"aa"})
    assert encode(toy, "aab") == [97, 256]


def test_decode_joins_the_bytes_once_with_replacement(bpe):
    stream = "é😀".encode() + b"\xff\xfe" + "日本".encode()[:4] + "ok".encode()
    ids = list(stream)                           # single-byte ids, the emoji split over four
    assert decode(bpe, ids) == stream.decode("utf-8", errors="replace")
    assert decode(bpe, ids).count("\ufffd") == 3   # ff, fe, the cut 本; per token: 12
    assert "".join(decode(bpe, [i]) for i in ids).count("\ufffd") == 12   # every non-ASCII byte


def test_bad_ids_are_named(bpe):
    with pytest.raises(ValueError, match=r"id 999 at position 1 is not in the vocabulary"):
        decode(bpe, [65, 999])
    with pytest.raises(ValueError, match=r"id -1 at position 0"):
        decode(bpe, [-1])
    with pytest.raises(TypeError, match="position 0"):
        decode(bpe, ["a"])
    with pytest.raises(TypeError):
        encode(bpe, b"bytes")
    with pytest.raises(ValueError, match="at least 256"):
        train_bpe("abc", 255)


def test_pairs_in_aaa_count_as_the_merge_makes_them():
    # the rule: left to right, no overlap with the last counted occurrence of the same pair
    assert count_pairs([97, 97, 97]) == {(97, 97): 1}          # merging gives [aa, a]: one
    assert count_pairs([97, 97, 97, 97]) == {(97, 97): 2}      # [aa, aa]
    assert count_pairs([97, 97, 97], overlaps=True) == {(97, 97): 2}   # tokenizers' count
    assert count_pairs([97, 98, 97, 98]) == {(97, 98): 2, (98, 97): 1}
    # the trainer uses it: in "aaa,bb,bb" (five pre-tokens) (a, a) counts 1 and (b, b) 2, so
    # (b, b) is merged; counting windows, (a, a) has 2 too and wins the tie by its smaller ids
    assert pretokenize("aaa,bb,bb") == ["aaa", ",", "bb", ",", "bb"]
    assert train_bpe("aaa,bb,bb", 257).merges == [(98, 98)]
    assert train_bpe("aaa,bb,bb", 257, overlaps=True).merges == [(97, 97)]


def _tokenizers_bpe(text, vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    to_byte = {c: b for b, c in byte_to_unicode().items()}
    merges = [m.split(" ") if isinstance(m, str) else m
              for m in json.loads(tok.to_str())["model"]["merges"]]
    return tok, [tuple(bytes(to_byte[c] for c in part) for part in m) for m in merges]


def _pair_counts_after(merges, k, text, overlaps):
    """The pair counts of ``text``'s pre-tokens after the first ``k`` merges."""
    state = BPE(merges=merges[:k], vocab=_vocab(merges))
    counts = None
    for word in pretokenize(text):
        counts = count_pairs(encode(state, word), counts, overlaps=overlaps)
    return counts


def _vocab(merges):
    vocab = {b: bytes([b]) for b in range(256)}
    for k, (a, b) in enumerate(merges):
        vocab[256 + k] = vocab[a] + vocab[b]
    return vocab


def test_the_trainer_equals_tokenizers_with_its_two_rules():
    tok, theirs = _tokenizers_bpe(TEXT, V)
    assert len(theirs) == 300
    # tokenizers counts every window and breaks ties by its ids (the alphabet sorted by GPT-2's
    # stand-in characters): with those two rules the 300 merges are equal ...
    ours = train_bpe(TEXT, V, byte_order=HF_BYTE_ORDER, overlaps=True)
    assert ours.merges_as_bytes() == theirs
    # ... and so are the ids, once a byte's id is mapped to tokenizers' (its rank in that order)
    to_theirs = {b: r for r, b in enumerate(HF_BYTE_ORDER)} | {256 + k: 256 + k for k in range(300)}
    sample = TEXT[3000:4500] + " naïve 😀"
    assert [to_theirs[i] for i in encode(ours, sample)] == tok.encode(sample).ids


def test_where_the_rules_differ_the_difference_is_exactly_theirs():
    _, theirs = _tokenizers_bpe(TEXT, V)
    # 1. counting without overlap (this module's default): the corpus's indentation runs of
    # spaces make tokenizers take (" ", " ") as its second merge, a pair it counts 2 times per
    # 3 spaces; counted as the merge makes it, (" ", "a") comes first
    ours = train_bpe(TEXT, V, byte_order=HF_BYTE_ORDER).merges_as_bytes()
    assert ours[0] == theirs[0] == (b" ", b"t")
    assert theirs[1] == (b" ", b" ") and ours[1] == (b" ", b"a")
    merges = train_bpe(TEXT, 257, byte_order=HF_BYTE_ORDER).merges
    windows = _pair_counts_after(merges, 1, TEXT, overlaps=True)
    made = _pair_counts_after(merges, 1, TEXT, overlaps=False)
    space, a = (32, 32), (32, 97)
    assert windows[space] > windows[a] > made[space]   # e.g. 4 spaces: 3 windows, 2 merges
    assert made[a] == windows[a]
    # 2. ties by byte value (the default) instead of tokenizers' ids: equal up to merge 9, where
    # two pairs of equal count are taken in the other order
    ours = train_bpe(TEXT, V, overlaps=True)
    ours_bytes = ours.merges_as_bytes()
    first = next(k for k, (x, y) in enumerate(zip(ours_bytes, theirs)) if x != y)
    assert first == 9 and ours_bytes[:9] == theirs[:9]
    assert (ours_bytes[9], ours_bytes[10]) == (theirs[10], theirs[9])   # a swap
    counts = _pair_counts_after(ours.merges, 9, TEXT, overlaps=True)
    assert counts[ours.merges[9]] == counts[ours.merges[10]]            # ... of a tie


def test_smollm2_tokenizer_rebuilt_from_its_gguf_file_gives_transformers_ids():
    from txlearn.models import gguf_files    # a missing model package fails here, never skips
    tokens = gguf_files.read_field("tokenizer.ggml.tokens")
    merges = gguf_files.read_field("tokenizer.ggml.merges")
    types = gguf_files.read_field("tokenizer.ggml.token_type")
    special = [t for t, kind in zip(tokens, types) if kind == 3]      # CONTROL tokens
    assert len(tokens) == 49152 and len(merges) == 48900 and special[:3] == \
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    ours = from_byte_level(tokens, merges, special)
    tok = gguf_files.load_tokenizer()
    message = "What is 12+7? Café naïve 😀 日本  x\n\n  y"
    text = tok.apply_chat_template([{"role": "user", "content": message}],
                                   add_generation_prompt=True, tokenize=False)
    ids = encode(ours, text)
    assert ids == gguf_files.chat_ids(tok, message)
    assert len(ids) == 52 and ids[:3] == [1, 9690, 198] and ids[-4:] == [1, 520, 9531, 198]
    assert decode(ours, ids) == text


def test_the_naive_loop_learns_the_incremental_trainers_merges():
    # the teaching loop recounts the whole corpus at every merge; the same merges come out
    for text, n in [(TEXT[:2000], 40), ("aaa,bb,bb aaaa", 4), ("", 3)]:
        assert train_bpe_naive(text, 256 + n).merges == train_bpe(text, 256 + n).merges
    # without the split a merge may cross a word boundary: "e" then a space is learnt
    crossed = train_bpe_naive("the one the one the", 257, split=False)
    assert crossed.merges == [(ord("e"), ord(" "))]        # 4 times, (t, h) and (h, e) 3 times
    # with it "e " cannot form: (h, e) and (t, h) tie at 3, the smaller pair (h, e) wins
    assert train_bpe_naive("the one the one the", 257).merges == [(ord("h"), ord("e"))]
    with pytest.raises(ValueError, match="at least 256"):
        train_bpe_naive("abc", 100)


def test_the_files_chat_template_tokenizer_fields_and_tokenizer_json_read_without_transformers():
    # lesson 11 and set 10 read the tokenizer without importing transformers: its fields kept as
    # JSON, the chat template rendered with Jinja, transformers' tokenizer.json read by tokenizers
    from tokenizers import Tokenizer

    from txlearn.models import gguf_files
    fields = gguf_files.tokenizer_fields()
    assert list(fields) == list(gguf_files.TOKENIZER_KEYS)
    assert fields["tokenizer.chat_template"] == gguf_files.read_field("tokenizer.chat_template")
    for key in gguf_files.TOKENIZER_KEYS[:3]:
        assert fields[key] == list(gguf_files.read_field(key))
    assert gguf_files.tokenizer_fields() == fields                 # the kept copy, read back
    tok = gguf_files.load_tokenizer()
    for message in ["What is the capital of France?", "Café 😀 <|im_end|> 12+7\n\n  x"]:
        text = tok.apply_chat_template([{"role": "user", "content": message}],
                                       add_generation_prompt=True, tokenize=False)
        assert gguf_files.chat_text(message) == text
        ids = Tokenizer.from_file(str(gguf_files.tokenizer_json())).encode(text).ids
        assert ids == gguf_files.chat_ids(tok, message)
