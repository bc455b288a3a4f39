"""Data-parallel training on 2 CPU processes (gloo) equals one process at the same global batch.

Two ranks of ``tests/ddp_worker.py`` are started with the environment ``torchrun`` gives its
workers and free ports of their own (so the test runs beside others under pytest-xdist): the
``txlearn train`` command (no dropout), then, with dropout, a whole run and the same run stopped
half-way and resumed by both ranks. This process compares the first with a one-process run of
the same configuration, and the resumed run with the whole one.

Tolerance: the ranks add their halves of the gradient in another order than one process sums
the whole batch, which changes float32 roundings (about 1e-7 relative per step); over 16 AdamW
steps the losses stay within 1e-6 here, asserted at 1e-4.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from txlearn.training.checkpoint import load_checkpoint
from txlearn.training.data import load_corpus, split_by_position
from txlearn.training.loop import evaluate, train
from txlearn.training.schedule import ENV_SECONDS

OPTIONS = ["--d-model", "32", "--n-heads", "2", "--n-layers", "2", "--d-ff", "64",
           "--block-size", "32", "--batch-size", "8", "--max-steps", "16", "--warmup-steps", "4",
           "--eval-interval", "4", "--lr", "0.01", "--precision", "fp32", "--threads", "1",
           "--dropout", "0",   # each rank would draw its own dropout masks: not one process's
           "--min-lr", "0.001", "--init", "layers"]   # the whole recipe given: nothing timed
TOL = 1e-4


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def relative_difference(a, b) -> float:
    """||a - b|| / ||b|| over all weights. Not element-wise: AdamW moves a weight whose gradient
    is nearly 0 by about lr whatever the gradient's size, so such weights differ by ~lr."""
    sa, sb = a.state_dict(), b.state_dict()
    diff = sum(float((sa[k] - sb[k]).square().sum()) for k in sb)
    return (diff / sum(float(v.square().sum()) for v in sb.values())) ** 0.5


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """Run the two ranks once; return (folder, text)."""
    out = tmp_path_factory.mktemp("ddp")
    text = load_corpus()[:40_000]
    (out / "text.txt").write_text(text, encoding="utf-8")
    port_a, port_b = free_ports(2)
    worker = Path(__file__).with_name("ddp_worker.py")
    env = {k: v for k, v in os.environ.items() if k != ENV_SECONDS}
    env.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(worker), str(out / "text.txt"), str(out),
                               str(port_a), str(port_b), *OPTIONS],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the 2-process run did not finish in 300 s")
    for r, (p, output) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{output}"
    return out, text, outputs


@pytest.fixture(scope="module")
def one_process(ddp):
    out, text, _ = ddp
    config = load_checkpoint(out / "a.safetensors")["config"]
    mp = pytest.MonkeyPatch()
    mp.delenv(ENV_SECONDS, raising=False)
    result = train(config, text, progress=False, log=None, threads=1)
    mp.undo()
    return result


def test_two_processes_follow_the_one_process_trajectory(ddp, one_process):
    out, _, outputs = ddp
    ckpt = load_checkpoint(out / "a.safetensors")
    assert ckpt["step"] == 16 and [h["step"] for h in ckpt["history"]] == [4, 8, 12, 16]
    for two, one in zip(ckpt["history"], one_process.history, strict=True):
        assert two["train"] == pytest.approx(one["train"], abs=TOL)
        assert two["val"] == pytest.approx(one["val"], abs=TOL)
    assert one_process.history[-1]["val"] < one_process.baselines["uniform"] - 0.5   # it learned
    # only rank 0 printed: the summary lines appear once, in rank 0's output
    assert "2 processes of 4 windows" in outputs[0] and "model: validation" in outputs[0]
    assert "model: validation" not in outputs[1]


def test_the_checkpoint_loads_in_one_process(ddp, one_process):
    out, text, _ = ddp
    ckpt = load_checkpoint(out / "a.safetensors")
    _, val_ids = split_by_position(one_process.vocab.encode(text), ckpt["config"].block_size)
    val = evaluate(ckpt["model"], val_ids, ckpt["config"].block_size)
    assert val == pytest.approx(ckpt["history"][-1]["val"], abs=1e-6)
    assert relative_difference(ckpt["model"], one_process.model) < 1e-3


def test_resume_restores_every_rank(ddp, tmp_path):
    out, text, _ = ddp
    straight = load_checkpoint(out / "c.safetensors")   # with dropout: one mask stream per rank
    resumed = load_checkpoint(out / "b.safetensors")     # stopped at 8, resumed by both ranks
    half = load_checkpoint(out / "b_half.safetensors")
    assert half["step"] == 8 and resumed["step"] == straight["step"] == 16
    assert "rng.torch.rank1" in half["tensors"]          # rank 1's generator is in the file
    assert not torch.equal(half["tensors"]["rng.torch"], half["tensors"]["rng.torch.rank1"])
    for name, w in straight["model"].state_dict().items():   # every rank resumed exactly
        torch.testing.assert_close(resumed["model"].state_dict()[name], w, atol=0, rtol=0)
    assert [(h["step"], h["train"]) for h in resumed["history"]] == \
        [(h["step"], h["train"]) for h in straight["history"]]
    assert resumed["history"][-1]["val"] == straight["history"][-1]["val"]
    # one process continues the two processes' half-way checkpoint to the end (its dropout
    # masks are rank 0's stream only, so it ends near, not on, the two-process run)
    path = tmp_path / "half.safetensors"
    path.write_bytes((out / "b_half.safetensors").read_bytes())
    mp = pytest.MonkeyPatch()
    mp.delenv(ENV_SECONDS, raising=False)
    single = train(straight["config"], text, checkpoint=path, resume=True, progress=False,
                   log=None, threads=1)
    mp.undo()
    assert single.step == 16 and single.world_size == 1
    assert single.val_nats == pytest.approx(straight["history"][-1]["val"], abs=0.05)
