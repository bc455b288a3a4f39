"""The recipe rule of txlearn.training.recipe: its recorded curves, FLOP count and choice.

Step times are faked here (the rule's arithmetic is what is tested; no timing asserts)."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from txlearn.training import recipe
from txlearn.training.config import RULE_FIELDS, TrainConfig
from txlearn.training.data import UserError, load_corpus
from txlearn.training.loop import train
from txlearn.training.schedule import ENV_SECONDS

RUNS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "recipe_runs.jsonl"
D128, D96, D64 = recipe.CANDIDATES   # widest first


def test_curves_are_the_sweeps_recorded_runs():
    """Every point of CURVES is a run in benchmarks/results/recipe_runs.jsonl, and every run
    recorded there for a candidate is in CURVES (one source: the sweep's file). Where a budget
    was run in both precisions, the float32 run (the sweep's protocol) is the point."""
    runs = [r for r in map(json.loads, RUNS.read_text().splitlines())
            if r["name"] in recipe.CANDIDATES]
    recorded = {}
    for r in sorted(runs, key=lambda r: r.get("precision", "fp32") == "fp32"):  # fp32 last: wins
        recorded.setdefault(r["name"], {})[r["budget"]] = r["held_out_nats"]
    assert recorded == recipe.CURVES
    both = {r.get("precision", "fp32"): r["held_out_nats"] for r in runs
            if r["name"] == D128 and r["budget"] == 0.25}
    assert set(both) == {"fp32", "bf16"}                  # the precision check is on record
    assert abs(both["fp32"] - both["bf16"]) < 0.02


def test_flops_per_step_is_6N_plus_attention():
    """(6 N + 12 n_layers T d_model) B T with N = n_layers (4 d^2 + 2 d d_ff) + n_vocab d: for
    the old defaults (d 128, d_ff 512, T 128, B 12, 4 layers, n_vocab 103) N = 799,616 and one
    step is (6 * 799,616 + 12 * 4 * 128 * 128) * 12 * 128 = 8,577,220,608 FLOPs (8.58 GFLOP)."""
    old = TrainConfig(d_model=128, d_ff=512, block_size=128, batch_size=12)
    N = 4 * (4 * 128 ** 2 + 2 * 128 * 512) + 103 * 128
    assert N == 799_616
    assert recipe.flops_per_step(old) == (6 * N + 12 * 4 * 128 * 128) * 12 * 128 == 8_577_220_608
    assert recipe.C_FULL == 2700 * 8_577_220_608


def test_predicted_loss_interpolates_in_log_budget(monkeypatch):
    monkeypatch.setattr(recipe, "CURVES", {D128: {0.125: 2.0, 0.5: 1.0}})
    assert recipe.predicted_loss(D128, 0.25) == pytest.approx(1.5)     # halfway in log 2
    assert recipe.predicted_loss(D128, 0.125) == pytest.approx(2.0)
    assert recipe.predicted_loss(D128, 1.0) == pytest.approx(1.0)      # flat: nothing measured
    assert recipe.predicted_loss(D128, 1 / 16) == pytest.approx(2.5)   # the first slope continues


def test_choose_takes_the_lowest_curve_at_each_candidates_own_budget(monkeypatch):
    """Faked step times: with d 64 twice as slow per FLOP as d 128, the same seconds buy d 64
    half the FLOPs; the rule must compare each curve at its own budget."""
    curves = {D128: {0.125: 1.70, 0.5: 1.30}, D96: {0.125: 1.65, 0.5: 1.28},
              D64: {0.125: 1.60, 0.5: 1.25}}
    monkeypatch.setattr(recipe, "CURVES", curves)
    cfg = TrainConfig()

    def fake_seconds(per_gflop):       # seconds per GFLOP of each width
        def measure(config, *a, **k):
            return recipe.flops_per_step(config) / 1e9 * per_gflop[config.d_model]
        return measure
    deadline = lambda s: __import__("time").perf_counter() + s   # noqa: E731
    # equal speed per FLOP: d 64 wins (its curve is lowest everywhere)
    monkeypatch.setattr(recipe, "measure_step_seconds", fake_seconds({128: 1, 96: 1, 64: 1}))
    choice = recipe.choose(cfg, deadline(100), torch.zeros(1000, dtype=torch.long), 103, "cpu")
    assert choice.name == D64 and choice.settings["d_model"] == 64
    # d 64 four times slower per FLOP, d 96 twice: at ~0.5 C_FULL for d 128, d 128's 1.30 beats
    # d 96 at 0.25 (1.465) and d 64 at 0.125 (1.60)
    monkeypatch.setattr(recipe, "measure_step_seconds", fake_seconds({128: 1, 96: 2, 64: 4}))
    seconds = 0.5 * recipe.C_FULL / 1e9 / 0.95
    choice = recipe.choose(cfg, deadline(seconds), torch.zeros(1000, dtype=torch.long), 103, "cpu")
    rows = {r["name"]: r for r in choice.rows}
    assert rows[D128]["budget"] == pytest.approx(0.5, rel=1e-3)
    assert rows[D64]["budget"] == pytest.approx(0.125, rel=1e-3)
    assert choice.name == D128, choice.summary()
    assert choice.summary().startswith(f"recipe: {D128} (the lowest predicted loss")


def test_short_budget_times_nothing(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("timed a candidate under a short budget")
    monkeypatch.setattr(recipe, "measure_step_seconds", boom)
    import time
    choice = recipe.choose(TrainConfig(), time.perf_counter() + 5, None, 103, "cpu")
    smallest = min(min(c) for c in recipe.CURVES.values())
    assert choice.name == min(recipe.CANDIDATES, key=lambda n: recipe.predicted_loss(n, smallest))
    assert "too short to time" in choice.summary()


def test_explicit_fields_win_and_the_run_says_what_it_chose(monkeypatch, tmp_path):
    """A run with d_model and lr given keeps them and takes the rest of its recipe from the rule;
    the chosen recipe is saved, and a resumed run with the fields left None continues it."""
    monkeypatch.setenv(ENV_SECONDS, "600")
    text = load_corpus()[:40_000]
    cfg = TrainConfig(d_model=32, n_heads=2, n_layers=1, lr=5e-3, max_steps=6, warmup_steps=2,
                      eval_interval=3, eval_windows=4, precision="fp32")
    lines, path = [], tmp_path / "r.safetensors"
    monkeypatch.setattr(recipe, "MIN_PROBE_SECONDS", 1e9)   # untimed: deterministic choice
    r = train(cfg, text, checkpoint=path, stop_after=3, progress=False, log=lines.append,
              threads=1)
    chosen = recipe.CANDIDATES[r.config and next(n for n in recipe.CANDIDATES
                                                 if r.recipe.startswith(f"recipe: {n} "))]
    assert r.config.d_model == 32 and r.config.lr == 5e-3                 # explicit won
    for k in set(RULE_FIELDS) - {"d_model", "lr"}:
        assert getattr(r.config, k) == chosen[k], k
    assert any(line.startswith("recipe: ") for line in lines[:5]), lines[:5]
    assert r.speed.startswith("speed: ") and "GFLOP/s" in r.speed
    resumed = train(cfg, text, checkpoint=path, resume=True, progress=False, log=None, threads=1)
    assert resumed.config == r.config and resumed.step == 6 and resumed.recipe is None


def test_unchosen_recipe_cannot_build_a_model():
    with pytest.raises(UserError, match="recipe is not chosen yet"):
        TrainConfig().model_sizes()
    assert TrainConfig(d_model=8).unresolved() == [k for k in RULE_FIELDS if k != "d_model"]
    filled = TrainConfig(lr=1.0).with_recipe(recipe.CANDIDATES[D64])
    assert filled.lr == 1.0 and filled.d_model == 64 and not filled.unresolved()
    assert dataclasses.asdict(filled)["init"] == "gpt2"
    assert math.isfinite(recipe.predicted_loss(D64, 0.3))
