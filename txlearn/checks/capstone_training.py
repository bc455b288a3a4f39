"""What set 09's check of the learner's training loop (training_loop in
:mod:`txlearn.checks.capstone`) compares with: the tiny probe runs and their reference loop with
each catalogued mistake, the stated run on the course's corpus and the bar it must clear, the
losses measured through the learner's own model (with a causality probe, and every prediction
scored from a prefix that ends before its target), and the hints aimed at each mistake.
"""

from __future__ import annotations

import numpy as np
import torch

from txlearn.checks import as_array, call, expect_shape, expect_true
from txlearn.checks.capstone_model import build_char, char_reference

__all__ = ["PROBE_SIZES", "PROBE_LR", "RUN", "MARGIN", "TRAIN_SECONDS", "NO_STEP", "LR_HIGH",
           "LR_LOW", "NO_ZERO_GRAD", "NEW_OPTIMIZER", "TRAIN_DATA", "RETURN_WRONG", "EVAL_WRONG",
           "TOO_LONG", "ENDLESS", "SLOW", "PACE_STEPS", "PACE_SECONDS", "paced_run", "NOT_CAUSAL", "NOT_BEATEN", "TRAIN_DEFAULT", "probe_data",
           "probe_reference", "windows_of", "loss_of_logits", "model_loss", "causality_probe",
           "causal_model_loss", "probe", "logits_np"]


# ================================================================= exercise: training_loop

PROBE_SIZES = dict(n_vocab=7, d_model=8, n_heads=2, d_ff=16, n_layers=1, block_size=6)
PROBE_LR = 0.05
RUN = dict(d_model=48, n_heads=4, d_ff=192, n_layers=2, block_size=32, steps=300, batch_size=32,
           lr=5e-3, seed=0)
MARGIN = 0.1            # nats per character below the bigram
TRAIN_SECONDS = 300.0   # the time limit of the stated run, on one thread in the kernel and the
                        # grader alike (about 7 s on one quiet core; a busy one takes several times it)
PACE_STEPS = 10         # the short run before it, timed, so that a time-out can say how far it got
PACE_SECONDS = 60.0

NO_STEP = ("did the parameters change at all?",
           "after the backward pass, the optimizer's step must run; zero the gradients BEFORE "
           "the backward pass (zeroing between backward and step throws the gradients away)")
LR_HIGH = ("how large is each step?",
           "pass the lr you are given to AdamW: the first step moves each parameter by about lr; "
           "yours moved the model several times further")
LR_LOW = ("how large is each step?",
          "pass the lr you are given to AdamW; yours moved the model much less than lr allows")
NO_ZERO_GRAD = ("what is in .grad at the second step?",
                "PyTorch adds each backward pass to .grad: zero the gradients (the optimizer's "
                "zero_grad) every step, or each step follows the sum of all gradients so far")
NEW_OPTIMIZER = ("how long does AdamW's memory last?",
                 "create the optimizer once, before the loop: a new AdamW every step forgets its "
                 "running averages of the gradients")
TRAIN_DATA = ("on which text do you measure the returned loss?",
              "return what evaluate measures on val_ids, the held-out text; a loss on the "
              "training text cannot show whether the model generalises")
RETURN_WRONG = ("what does train return?",
                "the number evaluate gives for val_ids after the last step: a Python float, the "
                "mean loss over every prediction of the held-out windows")
EVAL_WRONG = ("evaluate: every window, every prediction, one mean",
              "cut ids into the non-overlapping windows of block_size, run the model on them, and "
              "average next_token_loss over ALL their predictions (weigh each batch by its size)")
ENDLESS = ("does your loop end?",
           "a run of 10 steps did not finish: look for a loop that never ends (a while loop "
           "whose condition never changes, or a loop over the steps that restarts), or a loop "
           "over elements that could be one tensor operation")
SLOW = ("where does your loop spend its time?",
        "your loop is correct on the small cases but slow: each step should be one forward and "
        "one backward pass on the whole batch (no Python loop over windows or positions), and "
        "evaluate should run batches of up to 256 windows under torch.no_grad()")
TOO_LONG = ("how many positions does the model have?",
            "a window is block_size ids: the model has block_size rows of W_pos, and the loss "
            "shifts inside the window")
NOT_CAUSAL = ("may a prediction depend on the tokens after it?",
              "your model's logits at early positions changed when only later tokens changed: it "
              "looks at the future, which a causal language model cannot do when generating "
              "(check the causal mask and where the positions come from)")
NOT_BEATEN = ("the loop is right on the small cases; is the model learning fast enough?",
              "check that the loop draws a new random batch every step from train_ids, and that "
              "your model passes char_model")
ADAM = ("which optimizer?",
        "torch.optim.AdamW with its default weight decay (0.01), as the statement says; plain "
        "Adam has no decoupled weight decay, and its steps differ")
TRAINS_ON_VAL = ("which text does the model learn from?",
                 "the batches come from train_ids only; val_ids is held out, read only by the "
                 "final evaluate: yours trained on val_ids")
TRAIN_DEFAULT = ("steps of AdamW(model.parameters(), lr=lr): zero_grad, the loss of a batch of "
                 "random windows, backward, step; then return evaluate on val_ids",)


def probe_data():
    train_ids = torch.full((40,), 3, dtype=torch.long)   # every window is the same: any sampler
    val_ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 5, 4, 3] * 3)   # 5 windows of 6
    return train_ids, val_ids


def _ref_train(ref, train_ids, steps, batch_size, block_size, lr, *, accumulate=False,
               fresh_optimizer=False, scale=1.0, optimizer_cls=torch.optim.AdamW,
               sample_seed=None):
    """The reference loop on ``ref`` (changed in place); the keywords make a catalogued mistake."""
    def loss_of(x):
        logits = ref(x)
        return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                 x[:, 1:].flatten())

    optimizer = optimizer_cls(ref.parameters(), lr=lr * scale)
    x = train_ids[:block_size].expand(batch_size, block_size)   # the probe's only window
    ref.train()
    g = None if sample_seed is None else torch.Generator().manual_seed(sample_seed)
    for _ in range(steps):
        if g is not None:   # the statement's random windows (on text that is not constant)
            starts = torch.randint(0, len(train_ids) - block_size + 1, (batch_size,), generator=g)
            x = train_ids[starts[:, None] + torch.arange(block_size)]
        if fresh_optimizer:
            optimizer = optimizer_cls(ref.parameters(), lr=lr * scale)
        if not accumulate:
            optimizer.zero_grad()
        loss_of(x).backward()
        optimizer.step()
    return ref.eval()


def probe_reference(steps, *, on_val=False, **mistake):
    """The reference after ``steps`` probe steps (``on_val``: trained on the probe's val_ids)."""
    ref, _ = char_reference(seed=2, sizes=PROBE_SIZES)
    train_ids, val_ids = probe_data()
    if on_val:
        mistake["sample_seed"] = 0
    return _ref_train(ref, val_ids if on_val else train_ids, steps, 4, PROBE_SIZES["block_size"],
                      PROBE_LR, **mistake)


def windows_of(ids, block_size):
    n = len(ids) // block_size
    return ids[: n * block_size].view(n, block_size)


def loss_of_logits(logits, x):
    """Mean next-token loss (float) of logits (B, T, V) on windows x (B, T): the check's own."""
    z = torch.as_tensor(as_array(logits, np.float64))
    return float(torch.nn.functional.cross_entropy(z[:, :-1].flatten(0, 1), x[:, 1:].flatten()))


def model_loss(model, ids, block_size, case, batch=256):
    """The mean next-token loss over the non-overlapping windows of ids, through forward calls."""
    windows = windows_of(ids, block_size)
    total = 0.0
    for i in range(0, len(windows), batch):
        x = windows[i:i + batch]
        logits = call(model, x.clone(), case=case)
        total += loss_of_logits(logits, x) * len(x)
    return total / len(windows)


def causality_probe(model, block_size, n_vocab, case, rows=64, seed=11):
    """Random windows sent twice in one call: as they are, and with their second half replaced
    by other ids. The first half's logits must not change. Random ids, not the text the loss is
    measured on: the probe shows the model no token it will be asked to predict."""
    half = block_size // 2
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, n_vocab, (rows, block_size), generator=g)
    other = x.clone()
    other[:, half:] = torch.randint(0, n_vocab, (rows, block_size - half), generator=g)
    logits = as_array(call(model, torch.cat([x, other]), case=case), np.float64)
    if logits is None or logits.shape != (2 * rows, block_size, n_vocab):
        expect_shape(logits, (2 * rows, block_size, n_vocab), case=case,
                     hint=("logits (B, T, n_vocab): one row of scores per position",))
    expect_true(np.allclose(logits[:rows, :half], logits[rows:, :half], rtol=1e-4, atol=1e-4),
                case=case, message=f"the logits of positions 0-{half - 1} changed when only "
                                   f"positions {half}-{block_size - 1} of the input changed",
                hint=NOT_CAUSAL)


def causal_model_loss(model, ids, block_size, n_vocab, case, batch=256):
    """The mean next-token loss over the non-overlapping windows of ids, as :func:`model_loss`
    computes it for a causal model, with every prediction scored from an input that ends just
    before its target: the prefixes of each batch of windows, shortest first. The model is never
    shown a token before it has predicted it, so neither reading ahead in its input (which a
    comparison of two inputs can be told apart from, and was) nor remembering what earlier
    calls showed it helps."""
    windows = windows_of(ids, block_size)
    total = 0.0
    for i in range(0, len(windows), batch):
        x = windows[i:i + batch]
        for c in range(1, block_size):
            logits = as_array(call(model, x[:, :c].clone(), case=case), np.float64)
            if logits is None or logits.ndim != 3 or logits.shape[:2] != (len(x), c):
                expect_shape(logits, (len(x), c, n_vocab), case=case,
                             hint=("logits (B, T, n_vocab): one row of scores per position",))
            total += float(torch.nn.functional.cross_entropy(
                torch.as_tensor(logits[:, -1]), x[:, c], reduction="sum"))
    return total / (len(windows) * (block_size - 1))


def probe(CharModel, train, steps, case):
    """Train a tiny model ``steps`` steps on constant text; return (model, returned value)."""
    _, state = char_reference(seed=2, sizes=PROBE_SIZES)
    model = build_char(CharModel, state, case, sizes=PROBE_SIZES)
    train_ids, val_ids = probe_data()
    from txlearn.learner_calls import one_thread
    with one_thread():                      # as in the grader's sandbox; room for a busy machine
        returned = call(train, model, train_ids.clone(), val_ids.clone(), steps=steps,
                        batch_size=4, block_size=PROBE_SIZES["block_size"], lr=PROBE_LR, seed=0,
                        case=case, hint=TOO_LONG, time_limit=PACE_SECONDS)
    return model, returned


def logits_np(model, x, case):
    return as_array(call(model, x.clone(), case=case), np.float64)


def paced_run(train, CharModel, init_state, sizes, train_ids, stand_in, run, case):
    """The stated run of ``train`` on one thread, as the grader's sandbox runs it, after a short
    timed run of :data:`PACE_STEPS` steps on a second model: a time-out of the stated run then
    says how far the short one got (seconds per step), so that a slow loop and an endless one
    read differently. Returns ``(model, returned value)``."""
    import time

    from txlearn.checks.feedback import CheckFailure
    from txlearn.learner_calls import one_thread

    B = run["block_size"]
    kwargs = dict(batch_size=run["batch_size"], block_size=B, lr=run["lr"], seed=run["seed"])
    pace_case = f"{case}: a first run of {PACE_STEPS} steps, timed"
    with one_thread():
        model = build_char(CharModel, init_state, pace_case, sizes=sizes)
        began = time.perf_counter()
        try:
            call(train, model, train_ids, stand_in.clone(), steps=PACE_STEPS, case=pace_case,
                 time_limit=PACE_SECONDS, **kwargs)
        except CheckFailure as err:
            if err.kind != "timeout":
                raise
            raise CheckFailure(f"{PACE_STEPS} steps (and the evaluation) did not finish within "
                               f"{PACE_SECONDS:g} s", case=pace_case, hint=ENDLESS,
                               kind="timeout") from None
        paced = time.perf_counter() - began
        model = build_char(CharModel, init_state, case, sizes=sizes)
        try:
            returned = call(train, model, train_ids, stand_in.clone(), steps=run["steps"],
                            case=case, time_limit=TRAIN_SECONDS, **kwargs)
        except CheckFailure as err:
            if err.kind != "timeout":
                raise
            per_step = paced / PACE_STEPS
            need = per_step * run["steps"]
            slow = need > 0.5 * TRAIN_SECONDS
            raise CheckFailure(
                f"{run['steps']} steps did not finish within {TRAIN_SECONDS:g} s; the first run "
                f"of {PACE_STEPS} steps and its evaluation took {paced:.1f} s ({per_step:.2f} s "
                f"per step at most), so {run['steps']} steps should take about {need:.0f} s"
                + ("" if slow else ": the loop seems not to end when steps is large"),
                case=case, hint=SLOW if slow else ENDLESS, kind="timeout") from None
    return model, returned
