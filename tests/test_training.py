"""Tests of txlearn.training and its model (txlearn.models.char_lm): model, schedule, training,
checkpoints, resume, generation, CLI."""

import dataclasses
import math

import pytest
import torch

from txlearn.cli import main
from txlearn.models.char_lm import CharTransformer
from txlearn.training.checkpoint import load_checkpoint, save_checkpoint
from txlearn.training.config import TrainConfig
from txlearn.training.data import UserError, load_corpus
from txlearn.training.generate import generate, sample_text
from txlearn.training.loop import evaluate, train
from txlearn.training.schedule import ENV_SECONDS, learning_rate, time_budget

TINY = TrainConfig(d_model=32, n_heads=2, n_layers=2, d_ff=64, block_size=32, batch_size=16,
                   max_steps=80, lr=1e-2, min_lr=1e-3, warmup_steps=5, eval_interval=10,
                   eval_windows=8, max_seconds=600.0, precision="fp32", dropout=0.0,
                   init="layers")


@pytest.fixture(scope="module")
def text():
    return load_corpus()[:40_000]


@pytest.fixture(autouse=True)
def no_time_cap(monkeypatch):
    # These runs are made tiny by their configuration; the wall-time cap would make their
    # step counts depend on the machine's speed. test_time_budget sets it on purpose.
    monkeypatch.delenv(ENV_SECONDS, raising=False)


@pytest.fixture(scope="module")
def trained(text, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.delenv(ENV_SECONDS, raising=False)
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    result = train(TINY, text, checkpoint=path, progress=False, log=None)
    mp.undo()
    return result


def test_learning_rate_schedule():
    c = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    assert learning_rate(0, c) == pytest.approx(0.1, abs=1e-12)
    assert learning_rate(9, c) == pytest.approx(1.0, abs=1e-12)
    assert learning_rate(60, c) == pytest.approx(0.1 + 0.9 * 0.5, abs=1e-12)  # half-way cosine
    assert learning_rate(110, c) == pytest.approx(0.1, abs=1e-12)
    after = [learning_rate(t, c) for t in range(10, 111)]
    assert all(a >= b for a, b in zip(after, after[1:]))


def test_model_is_causal_and_tied():
    torch.manual_seed(0)
    model = CharTransformer(11, 16, 2, 2, 32, block_size=12).eval()
    ids = torch.randint(0, 11, (2, 12))
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 11
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert a.shape == (2, 12, 11)
    torch.testing.assert_close(a[:, :7], b[:, :7], atol=1e-6, rtol=0)   # past unaffected
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-3                     # future changed
    # weight tying: the output head has no matrix of its own
    names = [n for n, _ in model.named_parameters()]
    assert sum(p.shape == (11, 16) for p in model.parameters()) == 1 and "E" in names
    with pytest.raises(ValueError, match="13 positions exceed block_size 12"):
        model(torch.zeros(1, 13, dtype=torch.long))


def test_fused_model_equals_teaching_model_with_gradients():
    """The training path (fused kernels) against the course's own equations, float64."""
    torch.manual_seed(0)
    teach = CharTransformer(11, 16, 2, 2, 32, block_size=12, fused=False).double()
    fast = CharTransformer(11, 16, 2, 2, 32, block_size=12).double()    # default: fused
    assert fast.layers[0].fused and not teach.layers[0].fused
    fast.load_state_dict(teach.state_dict())
    ids = torch.randint(0, 11, (3, 12))
    results = []
    for model in (teach, fast):
        logits = model(ids)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.roll(-1, 1).flatten()).backward()
        results.append([logits.detach()] + [p.grad for p in model.parameters()])
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    # attention weights asked for: the teaching attention, on both
    _, w_fast = fast(ids, return_weights=True)
    _, w_teach = teach(ids, return_weights=True)
    torch.testing.assert_close(w_fast[1], w_teach[1], rtol=1e-9, atol=1e-12)


def test_bfloat16_autocast_step_is_close_to_float32():
    """What precision="bf16" changes: the loss by < 0.01 nats, gradients' direction > 0.999."""
    from txlearn.training.runtime import autocast
    torch.manual_seed(0)
    model = CharTransformer(11, 32, 2, 2, 64, block_size=16)
    ids = torch.randint(0, 11, (4, 16))
    out = {}
    for precision in ("fp32", "bf16"):
        model.zero_grad()
        with autocast(precision, torch.device("cpu")):
            logits = model(ids)
        assert logits.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())
        loss.backward()
        out[precision] = (loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert abs(out["bf16"][0] - out["fp32"][0]) < 0.01
    cos = torch.nn.functional.cosine_similarity(out["bf16"][1], out["fp32"][1], dim=0)
    assert cos > 0.999


def test_cached_forward_equals_full_forward():
    torch.manual_seed(1)
    model = CharTransformer(9, 16, 4, 3, 32, block_size=10).eval()
    ids = torch.randint(0, 9, (3, 10))
    caches = model.new_caches()
    with torch.no_grad():
        full = model(ids)                                        # (3, 10, 9)
        parts = [model(ids[:, :4], caches)] + [model(ids[:, t:t + 1], caches) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)


def test_short_training_lowers_the_loss(trained, text):
    r = trained
    assert r.step == TINY.max_steps and r.stopped_by == "steps"
    assert r.train_losses[0] == pytest.approx(math.log(len(r.vocab)), abs=0.3)  # starts near ln V
    assert sum(r.train_losses[-5:]) / 5 < r.train_losses[0] - 1.0
    # measured (seeded): 3.21 nats after 80 steps, against ln n_vocab = 4.52 and the unigram's 3.32
    assert r.val_nats < r.baselines["uniform"] - 1.2
    assert r.val_nats < r.baselines["unigram"] - 0.05
    assert [h["step"] for h in r.history] == list(range(10, 81, 10))


def test_checkpoint_round_trip_is_exact(trained, tmp_path):
    ckpt = load_checkpoint(trained.checkpoint)
    assert ckpt["config"] == TINY and ckpt["vocab"] == trained.vocab and ckpt["step"] == 80
    for (n1, p1), (n2, p2) in zip(trained.model.state_dict().items(),
                                  ckpt["model"].state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    assert not list(trained.checkpoint.parent.glob("*.tmp-*"))  # the temporary file is gone
    x = torch.randint(0, len(trained.vocab), (2, 32))
    with torch.no_grad():
        assert torch.equal(trained.model(x), ckpt["model"](x))


@pytest.mark.parametrize("dropout", [0.0, 0.1])   # dropout: the saved RNG state matters
def test_resume_continues_the_same_trajectory(text, tmp_path, dropout):
    config = dataclasses.replace(TINY, max_steps=12, eval_interval=4, dropout=dropout)
    straight = train(config, text, checkpoint=tmp_path / "a.safetensors", progress=False, log=None)
    path = tmp_path / "b.safetensors"
    first = train(config, text, checkpoint=path, stop_after=5, progress=False, log=None)
    assert first.step == 5
    second = train(config, text, checkpoint=path, resume=True, progress=False, log=None)
    assert second.step == 12
    assert first.train_losses + second.train_losses == straight.train_losses   # bit for bit
    for (name, p), q in zip(straight.model.state_dict().items(),
                            second.model.state_dict().values()):
        assert torch.equal(p, q), name
    assert second.val_nats == straight.val_nats


def test_interrupted_run_resumes_from_its_last_interval(text, tmp_path, monkeypatch):
    import txlearn.training.loop as training

    config = dataclasses.replace(TINY, max_steps=12, eval_interval=4)
    straight = train(config, text, progress=False, log=None)
    real_evaluate, calls = training.evaluate, []

    def interrupt_second_eval(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:                     # at step 8, after the checkpoint of step 4
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    path = tmp_path / "c.safetensors"
    monkeypatch.setattr(training, "evaluate", interrupt_second_eval)
    with pytest.raises(KeyboardInterrupt):
        train(config, text, checkpoint=path, progress=False, log=None)
    monkeypatch.setattr(training, "evaluate", real_evaluate)
    assert load_checkpoint(path)["step"] == 4
    resumed = train(config, text, checkpoint=path, resume=True, progress=False, log=None)
    assert resumed.train_losses == straight.train_losses[4:]
    assert resumed.val_nats == straight.val_nats


def test_resume_with_other_config_or_text_fails_and_writes_nothing(trained, text):
    before = trained.checkpoint.read_bytes()
    other = dataclasses.replace(TINY, d_model=48)
    with pytest.raises(UserError, match=r"not match the checkpoint: d_model=32 \(this run: 48\)"):
        train(other, text, checkpoint=trained.checkpoint, resume=True, progress=False, log=None)
    with pytest.raises(UserError, match="different text"):
        train(TINY, text[:-1] + "#", checkpoint=trained.checkpoint, resume=True, progress=False,
              log=None)
    assert trained.checkpoint.read_bytes() == before


def test_bad_checkpoints(tmp_path, trained):
    with pytest.raises(UserError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "none.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(UserError, match="not a safetensors checkpoint"):
        load_checkpoint(junk)
    # weights that do not fit the configuration stored beside them
    model = CharTransformer(len(trained.vocab), **dataclasses.replace(TINY, d_ff=48).model_sizes())
    opt = torch.optim.AdamW(model.parameters())
    bad = save_checkpoint(tmp_path / "bad.safetensors", model=model, optimizer=opt, config=TINY,
                          vocab=trained.vocab, step=0, data_generator=torch.Generator(),
                          history=[], text_fingerprint="0", baseline_nats={})
    with pytest.raises(UserError, match="do not match its configuration"):
        load_checkpoint(bad)


def test_time_budget(monkeypatch, text):
    assert time_budget(TINY) == 600.0
    monkeypatch.setenv(ENV_SECONDS, "2.5")
    assert time_budget(TINY) == 2.5
    monkeypatch.setenv(ENV_SECONDS, "1e-9")
    # a nanosecond ends before the first step: the run still makes one (a loaded machine under
    # make test's 8 s must not hand lesson 09 an empty loss curve), says so, and stops
    lines = []
    r = train(TINY, text, progress=False, log=lines.append)
    assert r.stopped_by == "time" and r.step == 1 and len(r.train_losses) == 1
    assert math.isfinite(r.train_losses[0]) and math.isfinite(r.val_nats)
    assert any("spent before the first step" in line for line in lines), lines
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv(ENV_SECONDS, bad)
        with pytest.raises(UserError, match="not a positive number"):
            time_budget(TINY)


def test_schedule_is_planned_against_the_budget(monkeypatch, text, tmp_path):
    """Ten million steps do not fit in 60 s: at the warm-up's end the cosine is laid over the
    steps that fit; the plan and the decay's progress are saved, and a resumed run starts there.
    (The run stops after 17 steps; a budget of 60 s lets a loaded machine reach them, where 3 s
    did not.)"""
    config = dataclasses.replace(TINY, max_steps=10_000_000, warmup_steps=16, eval_interval=8)
    path = tmp_path / "plan.safetensors"
    # the first AdamW of a process imports torch._dynamo (seconds on a busy machine): not here
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])
    monkeypatch.setenv(ENV_SECONDS, "60")
    r = train(config, text, checkpoint=path, stop_after=17, progress=False, log=None, threads=1)
    planned = r.planned_steps     # planned at step 16, the warm-up's end
    assert 16 < planned < 10_000_000 and r.step == 17
    assert any(note.startswith("schedule: 10000000 steps would not fit") for note in r.notes)
    ckpt = load_checkpoint(path)
    assert ckpt["planned_steps"] == planned
    assert ckpt["progress"] == pytest.approx(1 / (planned - 16), rel=1e-12)   # one decay step
    resumed = train(config, text, checkpoint=path, resume=True, stop_after=1, progress=False,
                    log=None, threads=1)
    assert resumed.history[-1]["lr"] == pytest.approx(learning_rate(17, config, planned))


def test_schedule_replanned_keeps_the_learning_rate_continuous():
    from txlearn.training.schedule import Schedule
    c = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)
    fixed, lrs = Schedule(c, 110), []
    for t in range(110):
        lrs.append(fixed.lr(t))
        fixed.advance(t)
    assert lrs == pytest.approx([learning_rate(t, c) for t in range(110)], abs=1e-12)
    assert fixed.progress == pytest.approx(1.0)
    replanned, lrs = Schedule(c, 110), []
    for t in range(80):
        if t == 40:
            replanned.total = 80        # the machine slowed down: 30 steps fewer fit
        lrs.append(replanned.lr(t))
        replanned.advance(t)
    assert replanned.progress == pytest.approx(1.0)   # min_lr is reached at the new end
    after = lrs[10:]
    assert all(a >= b for a, b in zip(after, after[1:]))   # still decreasing
    assert max(a - b for a, b in zip(after, after[1:])) < 0.04   # no jump where it re-planned


def test_thread_probe_keeps_the_faster_count():
    from txlearn.training.runtime import ThreadProbe
    for slow, want in ((2, 1), (1, 2)):
        probe = ThreadProbe(rounds=2, n=2)
        assert [probe.threads_for(i) for i in range(6)] == [2, 2, 1, 2, 1, 2]
        for i in range(1, probe.last_step + 1):
            k = probe.threads_for(i)
            probe.record(i, k, 0.5 if k == slow else 0.1)
        assert probe.final and probe.decide() == want and probe.threads_for(9) == want
        assert f"{want} (fastest of 4 alternating steps:" in probe.summary()
    # a second window before the plan: a burst that slowed 2 threads in the first is outvoted
    probe = ThreadProbe(rounds=2, n=2, second_at=20)
    assert [w for w in probe.windows] == [range(1, 5), range(16, 20)]
    for i in range(1, 20):
        k = probe.threads_for(i)
        probe.record(i, k, {1: 0.15, 2: 0.9 if i < 5 else 0.1}[k])
        if i == 4:
            assert probe.choice == 1 and not probe.final and probe.threads_for(10) == 1
    assert probe.final and probe.choice == 2
    assert [probe.threads_for(i) for i in (16, 17, 25)] == [2, 1, 2]


def test_device_and_precision_choices():
    from txlearn.training.runtime import native_bf16, resolve_device, resolve_precision
    cpu = torch.device("cpu")
    assert resolve_device("cpu") == cpu and resolve_device(" CPU ") == cpu
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="sees no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(UserError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    assert resolve_precision("fp32", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"
    assert resolve_precision("auto", cpu) == ("bf16" if native_bf16(cpu) else "fp32")
    with pytest.raises(UserError, match="precision must be one of auto, fp32, bf16"):
        resolve_precision("fp16", cpu)


def test_cached_greedy_sampling_equals_uncached(trained):
    prompt = trained.vocab.encode("def f(x):\n    return ")
    n_new = 2 * TINY.block_size + 5            # past two context restarts
    cached = generate(trained.model, prompt, n_new, temperature=0, use_cache=True)
    uncached = generate(trained.model, prompt, n_new, temperature=0, use_cache=False)
    assert cached.shape == (len(prompt) + n_new,)
    assert torch.equal(cached, uncached)
    sampled = generate(trained.model, prompt, 40, temperature=1.0, top_k=5, seed=3)
    assert torch.equal(sampled, generate(trained.model, prompt, 40, temperature=1.0, top_k=5,
                                         seed=3, use_cache=False))
    assert torch.equal(generate(trained.model, prompt, 20, top_k=1, seed=7),
                       generate(trained.model, prompt, 20, temperature=0))
    with pytest.raises(ValueError, match="at least one character"):
        generate(trained.model, [], 3)


def test_cached_sampling_on_an_untrained_model():
    # near-uniform logits make the argmax sensitive to any error in cached positions or keys
    torch.manual_seed(5)
    model = CharTransformer(13, 16, 2, 2, 32, block_size=8)
    prompt = torch.tensor([1, 2, 3])
    for temperature in (0.0, 1.0):
        cached = generate(model, prompt, 30, temperature=temperature, seed=2)
        uncached = generate(model, prompt, 30, temperature=temperature, seed=2, use_cache=False)
        assert torch.equal(cached, uncached), temperature
    assert len(set(cached.tolist())) > 3


def test_evaluate_matches_manual_cross_entropy(trained, text):
    val = trained.vocab.encode(text[-1000:])
    x, y = val[:-1][: 31 * 32].view(31, 32), val[1:][: 31 * 32].view(31, 32)
    with torch.no_grad():
        logp = torch.log_softmax(trained.model(x).double(), dim=-1)     # (31, 32, V)
    manual = -logp.gather(-1, y[..., None]).mean().item()
    assert evaluate(trained.model, val, 32) == pytest.approx(manual, abs=1e-5)


def test_sample_text_prompt_outside_vocabulary(trained):
    out = sample_text(trained.checkpoint, "class ", n_new=10, temperature=0)
    assert out.startswith("class ") and len(out) == 16
    with pytest.raises(UserError, match=r"not in the model's vocabulary.*'€'"):
        sample_text(trained.checkpoint, "price: 3€")


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"\xff\xfe binary", "not UTF-8"),
    (b"too short", "has 9 characters; block_size 32 needs at least 330"),
])
def test_cli_train_bad_text(tmp_path, capsys, content, message):
    src = tmp_path / "in.txt"
    src.write_bytes(content)
    out = tmp_path / "ck.safetensors"
    code = main(["train", "--text", str(src), "--out", str(out), "--block-size", "32"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("txlearn: error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_cli_train_bad_configuration(tmp_path, capsys):
    out = tmp_path / "ck.safetensors"
    assert main(["train", "--out", str(out), "--d-model", "30", "--n-heads", "4"]) == 2
    assert "d_model 30 is not divisible by n_heads 4" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--batch-size", "0", "--lr", "-1"]) == 2
    assert "invalid configuration: batch_size=0, lr=-1.0" in capsys.readouterr().err
    assert main(["train", "--out", str(out), "--precision", "fp16"]) == 2
    assert "precision 'fp16' must be auto, fp32 or bf16" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["train", "--out", str(out), "--device", "cuda"]) == 2
        assert "PyTorch sees no CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--out", str(out), "--threads", "0"])
    assert "expected a positive integer or 'auto'" in capsys.readouterr().err
    assert not out.exists()


def test_cli_train_and_sample(tmp_path, capsys, text, trained):
    src = tmp_path / "in.txt"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "ck.safetensors"
    args = ["train", "--text", str(src), "--out", str(out), "--d-model", "32", "--n-heads", "2",
            "--n-layers", "1", "--d-ff", "64", "--block-size", "32", "--batch-size", "4",
            "--max-steps", "3", "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "baselines" in printed and "bigram" in printed and "bits/char" in printed
    before = out.read_bytes()
    assert main(args) == 2                                   # exists: refuse to overwrite
    assert "--resume" in capsys.readouterr().err
    assert main(args[:-3] + ["--max-steps", "5", "--resume"]) == 2   # a different schedule
    assert "max_steps=3 (this run: 5)" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["sample", str(out), "--prompt", "for ", "--length", "7", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("for ")
    assert main(["sample", str(out), "--prompt", "ünïcode ✓"]) == 2
    assert "not in the model's vocabulary" in capsys.readouterr().err


def test_cli_sample_uses_the_course_sampler(trained, capsys):
    from txlearn.training.generate import sample_text as direct
    ckpt = str(trained.checkpoint)
    assert main(["sample", ckpt, "--prompt", "def ", "--length", "30", "--temperature", "0.9",
                 "--top-k", "0", "--top-p", "0.8", "--seed", "4"]) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    assert printed == direct(ckpt, "def ", 30, temperature=0.9, top_k=None, seed=4, top_p=0.8)
    # top-p so small that only the likeliest character survives: the greedy continuation
    assert main(["sample", ckpt, "--prompt", "def ", "--length", "20", "--top-p", "1e-9"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == direct(ckpt, "def ", 20, temperature=0)
    for option, value, message in (("--top-p", "1.5", "top_p must lie in (0, 1]"),
                                   ("--temperature", "-1", "temperature must be a finite number"),
                                   ("--top-k", "-2", "--top-k must be >= 0")):
        assert main(["sample", ckpt, option, value]) == 2
        err = capsys.readouterr().err
        assert err.startswith("txlearn: error: ") and message in err, err


# ---- gradient accumulation (issue 26) ----------------------------------------------------------

def _grads_at_each_step(monkeypatch):
    """Record every parameter's gradient when train() clips it (after the accumulation, before
    the optimiser's step)."""
    seen, clip = [], torch.nn.utils.clip_grad_norm_

    def recording(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        seen.append([p.grad.detach().clone() for p in parameters])
        return clip(parameters, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    return seen


def test_micro_batches_give_the_update_of_the_whole_batch(text, monkeypatch):
    """The report: train() could not reach a batch larger than memory allows. Expected: N
    micro-batches give the same update as one batch of N x their size (the loss averaged per
    token over the whole batch), to float tolerance, with dropout 0: here 4 micro-batches of 4
    windows against one batch of 16, the same windows (the data generator draws the batch)."""
    config = dataclasses.replace(TINY, max_steps=3, eval_interval=100)
    seen = _grads_at_each_step(monkeypatch)
    whole = train(config, text, progress=False, log=None)
    whole_grads, seen[:] = list(seen), []
    micro = train(dataclasses.replace(config, grad_accum=4), text, progress=False, log=None)
    assert len(seen) == len(whole_grads) == 3
    for step, (a, b) in enumerate(zip(whole_grads, seen)):
        for g, h in zip(a, b):
            torch.testing.assert_close(h, g, rtol=1e-4, atol=1e-7, msg=f"step {step}")
    assert micro.train_losses == pytest.approx(whole.train_losses, rel=1e-5)
    for (name, p), q in zip(whole.model.state_dict().items(), micro.model.state_dict().values()):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=2e-4, msg=name)   # after 3 AdamW steps


def test_accumulated_runs_resume_bit_for_bit(text, tmp_path):
    config = dataclasses.replace(TINY, max_steps=6, eval_interval=3, grad_accum=2)
    straight = train(config, text, progress=False, log=None)
    path = tmp_path / "acc.safetensors"
    first = train(config, text, checkpoint=path, stop_after=3, progress=False, log=None)
    assert load_checkpoint(path)["config"].grad_accum == 2
    second = train(config, text, checkpoint=path, resume=True, progress=False, log=None)
    assert first.train_losses + second.train_losses == straight.train_losses
    for (name, p), q in zip(straight.model.state_dict().items(),
                            second.model.state_dict().values()):
        assert torch.equal(p, q), name
    with pytest.raises(UserError, match=r"grad_accum=2 \(this run: 1\)"):
        train(dataclasses.replace(config, grad_accum=1), text, checkpoint=path, resume=True,
              progress=False, log=None)


def test_grad_accum_must_split_the_batch(text, tmp_path):
    with pytest.raises(UserError, match="batch_size 16 does not split into grad_accum 3"):
        train(dataclasses.replace(TINY, grad_accum=3), text, progress=False, log=None)
    with pytest.raises(UserError, match="grad_accum=0"):
        train(dataclasses.replace(TINY, grad_accum=0), text, progress=False, log=None)
    src = tmp_path / "in.txt"
    src.write_text(text, encoding="utf-8")
    out = tmp_path / "ga.safetensors"
    assert main(["train", "--text", str(src), "--out", str(out), "--d-model", "32",
                 "--n-heads", "2", "--n-layers", "1", "--d-ff", "64", "--block-size", "32",
                 "--batch-size", "4", "--grad-accum", "2", "--max-steps", "2",
                 "--no-progress"]) == 0
    assert load_checkpoint(out)["config"].grad_accum == 2


# ---- txlearn sample: several prompts, repetition penalty (issue 26) ----------------------------

def test_cli_sample_several_prompts_and_repetition_penalty(trained, capsys):
    """`txlearn sample --prompt A --prompt B` prints each continuation, each the one that prompt
    gives alone; --repetition-penalty reaches the sampler."""
    ckpt = str(trained.checkpoint)
    assert main(["sample", ckpt, "--prompt", "def ", "--prompt", "class Foo", "--length", "25",
                 "--temperature", "0", "--repetition-penalty", "1.5"]) == 0
    printed = capsys.readouterr().out
    for prompt in ("def ", "class Foo"):
        alone = sample_text(ckpt, prompt, 25, temperature=0, repetition_penalty=1.5)
        assert alone in printed.splitlines()
    assert sample_text(ckpt, "def ", 25, temperature=0, repetition_penalty=1.5) != \
        sample_text(ckpt, "def ", 25, temperature=0)
    assert main(["sample", ckpt, "--repetition-penalty", "0"]) == 2
    assert "repetition_penalty must be a finite number > 0" in capsys.readouterr().err
