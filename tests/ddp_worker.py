"""One rank of the 2-process CPU data-parallel test (tests/test_distributed.py starts two).

The environment holds what ``torchrun`` would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR);
``argv``: text file, output folder, two free ports, then the ``txlearn train`` options.

1. ``txlearn train`` itself (``txlearn.cli.main``, what ``python -m txlearn`` runs), joining
   the process group on the first port as under ``torchrun``: a whole run, checkpoint ``a``.
2. On the second port, a group made here and reused by ``train``, with dropout (each rank draws
   its own masks): a whole run (checkpoint ``c``), and the same run stopped half-way (checkpoint
   ``b``, copied to ``b_half``) and resumed by every rank from the file.
"""

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import torch.distributed as dist

from txlearn.cli import main
from txlearn.training.checkpoint import load_checkpoint
from txlearn.training.data import load_corpus
from txlearn.training.loop import train

text_file, out, port_a, port_b, *options = sys.argv[1:]
out = Path(out)
rank = int(os.environ["RANK"])

os.environ["MASTER_PORT"] = port_a
code = main(["train", "--text", text_file, "--out", str(out / "a.safetensors"), "--force",
             "--no-progress", *options])
assert code == 0 and not dist.is_initialized()

os.environ["MASTER_PORT"] = port_b
dist.init_process_group("gloo")
config = dataclasses.replace(load_checkpoint(out / "a.safetensors")["config"], dropout=0.1)
text = load_corpus(text_file)
straight = train(config, text, checkpoint=out / "c.safetensors", progress=False, log=None)
half = train(config, text, checkpoint=out / "b.safetensors", stop_after=config.max_steps // 2,
             progress=False, log=None)
if rank == 0:
    shutil.copy(out / "b.safetensors", out / "b_half.safetensors")
dist.barrier()
done = train(config, text, checkpoint=out / "b.safetensors", resume=True, progress=False,
             log=None)
assert half.world_size == done.world_size == 2 and done.step == config.max_steps
dist.destroy_process_group()
