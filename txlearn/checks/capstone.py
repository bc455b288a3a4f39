"""Checks of set 09 (the capstone): the learner's next-token loss, sampling distribution and
top-p, character model with a KV cache, generation, training loop, MiniLM encoder and sentence
embeddings, all on the learner's own modules of sets 03-07.

This module holds the checks themselves, one ``@exercise`` each, all under this module's stem (an
instructor's hidden cases for set 09 live in one ``capstone.py``). What they compare with lives
in helper modules named for it: :mod:`~txlearn.checks.capstone_sampling` (the loss and the
sampler), :mod:`~txlearn.checks.capstone_model` (the character model and generation),
:mod:`~txlearn.checks.capstone_training` (the training loop),
:mod:`~txlearn.checks.capstone_encoder` (MiniLM and pooling) and
:mod:`~txlearn.checks.capstone_oracles` (what is computed once per process).

The right answers come from the course's package: :func:`txlearn.sampling.next_token_distribution`
(the one sampler), :class:`txlearn.models.char_lm.CharTransformer` loaded with the same weights,
the course's MiniLM (:mod:`txlearn.models.minilm`) and ``sentence-transformers`` for the
sentence embeddings. When an answer differs, what each catalogued mistake
(``tests/catalogue/capstone.py``) computes on the same inputs chooses the hint. The learner's
objects are used only through ``call``, ``construct``, ``load_state`` and ``state_shapes``, with
plain data.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from txlearn.checks import (CheckFailure, as_array, call, construct, diagnose, exercise, expect_close,
                            expect_shape, expect_true, load_state)
from txlearn.checks import capstone_oracles as oracles
from txlearn.checks.capstone_encoder import (ENC_DEFAULT, ENC_HINTS, ENC_LOADER, ONE_SENTENCE,
                                             PADDED, POOL_DEFAULT, SENTENCES, encoder_case,
                                             load_encoder, pool_cases, pool_expected, pool_mistakes)
from txlearn.checks.capstone_model import (ALWAYS_GREEDY, CACHE_IGNORED, CACHE_RAISED,
                                           CHAR_DEFAULT, CHAR_NAMES, CHAR_SIZES, FIRST_POSITION,
                                           GEN_DEFAULT, IGNORES_FILTERS, MASK_INVERTED,
                                           MASK_TOP_LEFT, NEW_GENERATOR, NOT_RESET, NO_CAUSAL,
                                           NO_FINAL_NORM, NO_MASK_CACHED, NO_POSITIONS, POST_LN,
                                           POS_BY_ID, POS_NOT_OFFSET, PROMPT_SKIPPED, SCALED,
                                           SINUSOID_TOO,
                                           WHOLE_WITH_CACHE, build_char, char_logits,
                                           char_reference, course_init, expect_ids, ref_generate)
from txlearn.checks.capstone_sampling import (SAMPLE_HALF, GREEDY_LAST, LOSS_DEFAULT, LOSS_UNSTABLE,
                                              NOT_FLOAT64, NOT_SCALAR, SAMPLE_DEFAULT,
                                              SAMPLE_UNSTABLE, TEMP_TINY, TEMP_ZERO,
                                              TOP_P_DEFAULT,
                                              loss_cases, loss_mistakes, loss_np, probs_mistakes,
                                              sampling_cases, top_p_cases, top_p_mistakes)
from txlearn.checks.capstone_training import (ADAM, TRAINS_ON_VAL, EVAL_WRONG, LR_HIGH, LR_LOW, MARGIN, NEW_OPTIMIZER,
                                              NOT_BEATEN, NO_STEP, NO_ZERO_GRAD, PROBE_SIZES,
                                              RETURN_WRONG, RUN, TRAIN_DATA, TRAIN_DEFAULT,
                                              ENDLESS, SLOW, causal_model_loss, causality_probe,
                                              logits_np, loss_of_logits, model_loss, probe,
                                              paced_run, probe_data, probe_reference,
                                              windows_of)
from txlearn.checks.modules import expect_match, finite


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch")


@exercise("next_token_loss")
def next_token_loss(next_token_loss):
    for case, z, ids, mask in loss_cases():
        args = (torch.tensor(z), torch.tensor(ids, dtype=torch.long),
                None if mask is None else torch.tensor(mask))
        got = call(next_token_loss, *args, case=case)
        expect_true(_is_tensor(got), case=case,
                    message=f"returned a {type(got).__name__}, expected a torch.Tensor",
                    hint=NOT_SCALAR)
        expect_shape(got, (), case=case, hint=NOT_SCALAR)
        expected = loss_np(z.astype(np.float64), ids, mask)
        default = LOSS_UNSTABLE if not finite(got) else LOSS_DEFAULT
        mistakes = [] if not finite(got) else loss_mistakes(z.astype(np.float64), ids, mask)
        expect_match(got, expected, case=case, rtol=1e-5, atol=1e-5, default=default,
                     mistakes=mistakes, dtol=(1e-4, 1e-5))


@exercise("sampling_distribution")
def sampling_distribution(next_token_probs):
    from txlearn.sampling import next_token_distribution

    for case, z, t, k in sampling_cases():
        zero = t == 0
        got = call(next_token_probs, z.clone(), t, k, case=case, hint=TEMP_ZERO if zero else None)
        expected = next_token_distribution(z, t, k)
        expect_shape(got, tuple(z.shape), case=case,
                     hint=("one probability per logit: the shape of the logits",))
        if not finite(got):
            raise CheckFailure("the probabilities hold NaN or infinity", case=case,
                               hint=TEMP_ZERO if zero else SAMPLE_HALF
                               if z.dtype == torch.float16 else SAMPLE_UNSTABLE)
        if zero:
            last = torch.nn.functional.one_hot(len(z) - 1 - z.flip(-1).argmax(-1), len(z))
            tied = (z == z.max()).double()              # a tiny temperature shares the maxima
            mistakes = [(last.double(), GREEDY_LAST), (tied / tied.sum(), TEMP_TINY)]
        else:
            mistakes = probs_mistakes(z, t, k)
        expect_match(got, expected, case=case, rtol=1e-6, atol=1e-9, mistakes=mistakes,
                     default=SAMPLE_DEFAULT, dtol=(1e-5, 1e-7))
        expect_true(getattr(got, "dtype", None) == torch.float64, case=case,
                    message=f"dtype {getattr(got, 'dtype', type(got).__name__)}, expected "
                            f"torch.float64", hint=NOT_FLOAT64)


@exercise("top_p", needs=("sampling_distribution",))
def top_p(next_token_distribution):
    from txlearn.sampling import next_token_distribution as reference

    for case, z, t, k, p in top_p_cases():
        got = call(next_token_distribution, z.clone(), t, k, p, case=case)
        expected = reference(z, t, k, p)
        expect_shape(got, tuple(z.shape), case=case,
                     hint=("one probability per logit: the shape of the logits",))
        expect_true(finite(got), case=case, message="the probabilities hold NaN or infinity",
                    hint=("the kept set is never empty: the most probable token always stays",))
        mistakes = top_p_mistakes(z, t, k, p) if p is not None and t > 0 else []
        expect_match(got, expected, case=case, rtol=1e-6, atol=1e-9, mistakes=mistakes,
                     default=TOP_P_DEFAULT, dtol=(1e-5, 1e-7))


@exercise("char_model", needs=("language_model",))
def char_model(CharModel):
    ref, state = char_reference()
    sizes = ", ".join(f"{k}={v}" for k, v in CHAR_SIZES.items())
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, CHAR_SIZES["n_vocab"], (2, CHAR_SIZES["block_size"]), generator=g)
    full = char_logits(ref, ids)
    shape = (2, CHAR_SIZES["block_size"], CHAR_SIZES["n_vocab"])

    case = f"CharModel({sizes}), a full window (2, 12)"
    model = build_char(CharModel, state, case)
    got = call(model, ids.clone(), case=case)
    expect_shape(got, shape, case=case, hint=("logits are (B, T, n_vocab)",))
    expect_match(got, full, case=case, rtol=1e-4, atol=1e-4, default=CHAR_DEFAULT,
                 dtol=(1e-3, 1e-3),
                 mistakes=[(lambda: char_logits(ref, ids, mask="none"), NO_CAUSAL),
                     (lambda: char_logits(ref, ids, mask="inverted"), MASK_INVERTED),
                     (lambda: char_logits(ref, ids, norm_first=False), POST_LN),
                     (lambda: char_logits(ref, ids, final_norm=False), NO_FINAL_NORM),
                     (lambda: char_logits(ref, ids, positions=False), NO_POSITIONS),
                     (lambda: char_logits(ref, ids, pos_by_id=True), POS_BY_ID),
                     (lambda: char_logits(ref, ids, scale=4.0), SCALED),
                     (lambda: char_logits(ref, ids, sinusoid=True), SINUSOID_TOO)])

    case = "a new model, use_cache=True: the first 5 ids of the window"
    model = build_char(CharModel, state, case)
    got = call(model, ids[:, :5].clone(), use_cache=True, case=case, hint=CACHE_RAISED)
    expect_match(got, full[:, :5], case=case, rtol=1e-4, atol=1e-4, default=CHAR_DEFAULT)

    case = "then the next 3 ids with use_cache=True (S = 8 keys, T = 3 queries)"
    got = call(model, ids[:, 5:8].clone(), use_cache=True, case=case, hint=CACHE_RAISED)
    expect_shape(got, (2, 3, CHAR_SIZES["n_vocab"]), case=case,
                 hint=("logits only for the T new ids: (B, T, n_vocab)",))
    prefix, new = ids[:, :5], ids[:, 5:8]
    expect_match(got, full[:, 5:8], case=case, rtol=1e-4, atol=1e-4, default=CHAR_DEFAULT,
                 dtol=(1e-3, 1e-3),
                 mistakes=[(lambda: char_logits(ref, new, prefix, pos_start=0), POS_NOT_OFFSET),
                     (lambda: char_logits(ref, new, prefix, mask="top-left"), MASK_TOP_LEFT),
                     (lambda: char_logits(ref, new, prefix, mask="none"), NO_MASK_CACHED),
                     (lambda: char_logits(ref, new, pos_start=5), CACHE_IGNORED),
                     (lambda: char_logits(ref, new), CACHE_IGNORED)])


@exercise("cached_generation", needs=("char_model", "top_p"))
def cached_generation(generate, CharModel):
    ref, state = char_reference(seed=3, e_scale=0.3)   # greedy margins >= 0.06: no near-ties
    prompt, n_new = torch.tensor([3, 1, 4]), 9
    greedy = ref_generate(ref, prompt, n_new)
    model = build_char(CharModel, state, "CharModel(n_vocab=11, d_model=16, n_heads=4, "
                                          "d_ff=32, n_layers=2, block_size=12)")

    case = "greedy, without the cache: prompt [3, 1, 4], 9 new ids"
    got = call(generate, model, prompt.clone(), n_new, 0.0, None, None, 0, use_cache=False,
               case=case)
    expect_ids(got, greedy, case=case, default=GEN_DEFAULT,
               mistakes=[(lambda: ref_generate(ref, prompt, n_new, position=0), FIRST_POSITION)])

    case = "greedy, with the cache: the same prompt"
    got = call(generate, model, prompt.clone(), n_new, 0.0, None, None, 0, use_cache=True,
               case=case, hint=WHOLE_WITH_CACHE)
    expect_ids(got, greedy, case=case, default=GEN_DEFAULT,
               mistakes=[(lambda: ref_generate(ref, prompt, n_new, position=0), FIRST_POSITION),
                   (lambda: ref_generate(ref, prompt, n_new, prefill=False), PROMPT_SKIPPED)])

    case = "greedy, with the cache, a second call (a new sequence)"
    got = call(generate, model, prompt.clone(), n_new, 0.0, None, None, 0, use_cache=True,
               case=case, hint=NOT_RESET)
    expect_ids(got, greedy, case=case, default=NOT_RESET, mistakes=[])

    settings = (1.0, 5, 0.9, 7)
    sampled = ref_generate(ref, prompt, n_new, *settings)
    mistakes = [(lambda: ref_generate(ref, prompt, n_new, *settings, reseed=True), NEW_GENERATOR),
                (lambda: ref_generate(ref, prompt, n_new, *settings, filters=False),
                 IGNORES_FILTERS),
                (lambda: ref_generate(ref, prompt, n_new, *settings, greedy=True), ALWAYS_GREEDY)]
    for use_cache in (True, False):
        case = (f"temperature 1, top_k 5, top_p 0.9, seed 7, "
                f"{'with' if use_cache else 'without'} the cache")
        got = call(generate, model, prompt.clone(), n_new, *settings, use_cache=use_cache,
                   case=case)
        expect_ids(got, sampled, case=case, default=GEN_DEFAULT, mistakes=mistakes)


@exercise("training_loop", needs=("char_model", "next_token_loss"))
def training_loop(train, evaluate, CharModel):
    train_ids, val_ids = probe_data()
    x_val = windows_of(val_ids, PROBE_SIZES["block_size"])
    init = char_logits(char_reference(seed=2, sizes=PROBE_SIZES)[0], x_val)

    # 1. one step from a known start, on text where every window is the same
    case = "a tiny CharModel, 1 step at lr 0.05 on constant text"
    model, _ = probe(CharModel, train, 1, case)
    got = logits_np(model, x_val, case)
    expected = char_logits(probe_reference(1), x_val)
    if got is not None and got.shape == expected.shape and not np.allclose(got, expected,
                                                                            rtol=1e-3, atol=1e-4):
        moved, should = np.linalg.norm(got - init), np.linalg.norm(expected - init)
        hint = NO_STEP if moved < 1e-3 * should else LR_HIGH if moved > 3 * should else \
            LR_LOW if moved < should / 3 else diagnose(got, [
                (lambda: char_logits(probe_reference(1, optimizer_cls=torch.optim.Adam), x_val),
                 ADAM),
                (lambda: char_logits(probe_reference(1, on_val=True), x_val), TRAINS_ON_VAL)],
                TRAIN_DEFAULT, rtol=1e-3, atol=1e-4)
        expect_close(got, expected, case=case, rtol=1e-3, atol=1e-4, hint=hint)

    # 2. three steps: the gradients of each step, one optimizer
    case = "a tiny CharModel, 3 steps at lr 0.05 on constant text"
    model, returned = probe(CharModel, train, 3, case)
    got = logits_np(model, x_val, case)
    expect_match(got, char_logits(probe_reference(3), x_val), case=case, rtol=1e-3, atol=1e-4,
                 default=TRAIN_DEFAULT, dtol=(1e-3, 1e-4),
                 mistakes=[(lambda: char_logits(probe_reference(3, accumulate=True), x_val),
                      NO_ZERO_GRAD),
                     (lambda: char_logits(probe_reference(3, fresh_optimizer=True), x_val),
                      NEW_OPTIMIZER),
                     (lambda: init, NO_STEP)])

    # 3. what train returns, and evaluate: the loss on the held-out windows
    val_loss = loss_of_logits(got, x_val)
    case = "the value train returned after those 3 steps"
    expect_true(isinstance(returned, (int, float)) or as_array(returned) is not None and
                as_array(returned).size == 1, case=case,
                message=f"train returned {type(returned).__name__}, expected a number",
                hint=RETURN_WRONG)
    if not math.isclose(float(as_array(returned, np.float64).reshape(())), val_loss,
                        rel_tol=1e-4, abs_tol=1e-5):
        on_train = model_loss(model, train_ids, PROBE_SIZES["block_size"], case)
        r = float(as_array(returned, np.float64).reshape(()))
        hint = TRAIN_DATA if math.isclose(r, on_train, rel_tol=1e-4, abs_tol=1e-5) else \
            RETURN_WRONG
        raise CheckFailure(f"train returned {r:.6g}; the loss on val_ids is {val_loss:.6g}",
                           case=case, hint=hint)
    case = "evaluate(model, val_ids, 6) on that model: 5 windows"
    got = call(evaluate, model, val_ids.clone(), PROBE_SIZES["block_size"], case=case)
    expect_close(got, val_loss, case=case, rtol=1e-4, atol=1e-5, hint=EVAL_WRONG)
    case = "evaluate on 1,800 random ids: 300 windows of 6, two batches (256 + 44)"
    ids = torch.randint(0, PROBE_SIZES["n_vocab"], (1800,), generator=torch.Generator().manual_seed(8))
    got = call(evaluate, model, ids.clone(), PROBE_SIZES["block_size"], case=case)
    expect_close(got, model_loss(model, ids, PROBE_SIZES["block_size"], case), case=case,
                 rtol=1e-4, atol=1e-5, hint=EVAL_WRONG)

    # 4. the stated run on the course's corpus, judged on the validation split
    B = RUN["block_size"]
    train_ids, val_ids, n_vocab, bigram = oracles.corpus(B)
    sizes = {k: RUN[k] for k in ("d_model", "n_heads", "d_ff", "n_layers", "block_size")}
    _, init_state = course_init(n_vocab, sizes)
    case = (f"CharModel({n_vocab}, d_model=48, n_heads=4, d_ff=192, n_layers=2, block_size=32), "
            f"train(steps=300, batch_size=32, block_size=32, lr=5e-3, seed=0)")
    # train sees a stand-in for the validation split (the end of the training text): the
    # validation text itself reaches the learner's code only as inputs of the evaluation below,
    # after training, never as something to return or train on
    stand_in = train_ids[-len(val_ids):]
    model, returned = paced_run(train, CharModel, init_state, dict(sizes, n_vocab=n_vocab),
                                train_ids, stand_in, RUN, case)
    causality_probe(model, B, n_vocab, case)
    measured = causal_model_loss(model, val_ids, B, n_vocab, case)
    expect_true(math.isfinite(measured) and measured <= bigram - MARGIN, case=case,
                message=f"validation loss {measured:.3f} nats/char after {RUN['steps']} steps; "
                        f"the bigram's is {bigram:.3f}, so {bigram - MARGIN:.3f} or less is "
                        f"needed", hint=NOT_BEATEN)
    on_stand_in = model_loss(model, stand_in, B, case)
    r = as_array(returned, np.float64)
    expect_true(r is not None and r.size == 1 and math.isclose(float(r.reshape(())), on_stand_in,
                                                               rel_tol=1e-3), case=case,
                message=f"train returned {returned!r:.40}; evaluate on the val_ids it was given "
                        f"gives {on_stand_in:.4f}", hint=RETURN_WRONG)


@exercise("minilm_encoder", needs=("transformer_layer", "layer_norm_module"))
def minilm_encoder(MiniLM, load_minilm):
    sizes = oracles.minilm_sizes()
    case = "MiniLM({}) with the checkpoint's weights, loaded by the check".format(
        ", ".join(str(v) for v in sizes.values()))
    encoder = construct(MiniLM, *sizes.values(), case=case, time_limit=60)
    load_state(encoder, oracles.minilm_state(), case=case, time_limit=60)
    forward_only = [v for v in ENC_HINTS if v != "attention weights not transposed"]
    encoder_case(encoder, ONE_SENTENCE, "your MiniLM, one sentence: 'The cat sat on the mat.'",
                 forward_only)
    encoder_case(encoder, PADDED, "your MiniLM, three sentences of 9, 3 and 15 tokens (padded)",
                 forward_only)
    encoder = load_encoder(load_minilm, "load_minilm(model_dir())")
    encoder_case(encoder, PADDED, "load_minilm(model_dir()), the three padded sentences",
                 sorted(ENC_LOADER))


@exercise("sentence_embeddings", needs=("minilm_encoder",))
def sentence_embeddings(sentence_embedding, load_minilm):
    for case, X, m in pool_cases():
        got = call(sentence_embedding, torch.tensor(X), torch.tensor(m), case=case)
        expect_shape(got, (X.shape[0], X.shape[2]), case=case,
                     hint=("one vector per sentence: (B, d)",))
        X64 = X.astype(np.float64)
        expect_match(got, pool_expected(X64, m), case=case, rtol=1e-5, atol=1e-6,
                     default=POOL_DEFAULT, mistakes=pool_mistakes(X64, m), dtol=(1e-4, 1e-5))

    case = f"{len(SENTENCES)} sentences through your MiniLM, against sentence-transformers"
    encoder = load_encoder(load_minilm, case)
    batch = oracles.tokens(SENTENCES)
    states = call(encoder, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                  case=case, time_limit=60)
    got = call(sentence_embedding, states, batch["attention_mask"], case=case)
    expect_close(got, oracles.reference_embeddings(SENTENCES), case=case, rtol=0, atol=1e-5,
                 hint=("your encoder's states differ from MiniLM's: run the check of "
                       "minilm_encoder",))


DEFAULTS = {"next_token_loss": [LOSS_DEFAULT], "sampling_distribution": [SAMPLE_DEFAULT],
            "top_p": [TOP_P_DEFAULT], "char_model": [CHAR_DEFAULT, CHAR_NAMES],
            "cached_generation": [GEN_DEFAULT], "training_loop": [TRAIN_DEFAULT, RETURN_WRONG],
            "minilm_encoder": [ENC_DEFAULT], "sentence_embeddings": [POOL_DEFAULT]}
