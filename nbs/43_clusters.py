# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Launching at every scale: torchrun, many nodes, SLURM
#
# The command of chapter 42, from a laptop to a cluster: one GPU, one node with `torchrun`, many nodes with a
# rendezvous, and SLURM with a batch script that saves and requeues the job when its time runs out.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
import contextlib
import io
import json

import torch

from convit_edu.cli import main
from convit_edu.distributed import SBATCH_SCRIPT

torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## Launching at every scale
#
# **Your laptop, one epoch of CIFAR-100** (downloads it into `data/` the first time, 161 MB):
#
# ```bash
# convit-edu train --preset cifar100-32 --model convit_tiny --epochs 1 --warmup-epochs 0 --output runs/quickstart
# ```
#
# **One GPU**, ImageNet in `data/imagenet/{train,val}` — the `imagenet` preset's global batch of 1024 is
# reached with 8 accumulation steps of 128:
#
# ```bash
# convit-edu train --preset imagenet --model convit_tiny --accum-steps 8 --output runs/convit_tiny
# ```
#
# (With a `global_batch`, as the ImageNet presets have, `--batch-size` is not used: each process runs
# global_batch / (accum_steps × processes) images at once. `--global-batch none --batch-size B` switches back.)
#
# **One node with 8 GPUs** — `torchrun` starts one process per GPU, each takes 1024 / 8 = 128 images:
#
# ```bash
# torchrun --nproc_per_node=8 -m convit_edu.cli train --preset imagenet --model convit_small \
#     --data-root /datasets/imagenet --output runs/convit_small --resume auto
# ```
#
# **Many nodes under SLURM.** The package's batch script, `convit_edu/slurm/convit_small.sbatch` (`SBATCH_SCRIPT`
# is its path), asks for 4 nodes of 8 GPUs, starts one `torchrun` per node
# with `srun`, and lets them meet through the c10d rendezvous on the first node. What makes it safe:
#
# * *The time limit.* SLURM sends USR1 to the batch shell five minutes before the limit (`--signal=B:USR1@300`).
#   Its trap stops the training step (SIGTERM to `srun`, which forwards it to every task: each rank finishes
#   its step, writes `last.pt` and exits 0) and then **requeues the job** with `scontrol requeue` — a job that
#   simply ends at its limit is *completed*, and `--requeue` alone would not bring it back. The requeued job
#   runs the same script, and `--resume auto` continues where it stopped.
# * *torchrun's grace period.* torchrun forwards SIGTERM to its workers and kills them 30 s later by default;
#   writing a checkpoint of a large model to a shared file system can take longer (`last.pt` holds four fp32
#   copies of the parameters: the weights, AdamW's two moments and the EMA). The script gives them four minutes,
#   inside the five the signal leaves, with `export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=240`, which recent torch's
#   launcher reads (pytorch PR #172596, 2026; torch 2.14 has it). The same PR added torchrun's
#   `--shutdown-timeout` option, but the torchrun of older torch, 2.4 included, rejects an option it does not
#   know and would not start at all; the variable it simply ignores, so the script runs with every torch this
#   package admits (`torch>=2.4`). What older torch gives its workers is a fixed 30 s: there a checkpoint must
#   be written within 30 s of the signal. If it is not, the kill leaves the previous `last.pt` whole (the write
#   goes to a temporary file that is renamed at the end, chapter 12), and the requeued job loses the steps
#   since it; measure how long your file system takes to write one, or run a recent torch.
# * *Pre-emption* sends SIGTERM to every process of the job, loader workers included: the loop saves as above
#   (the training and the evaluation loader's workers ignore the signal, chapters 17 and 25) and SLURM requeues
#   a pre-empted job itself.
#
# (The alternative without torchrun — `srun --ntasks-per-node=8 --gpus-per-task=1 python -m convit_edu.cli
# train …` with `MASTER_ADDR`/`MASTER_PORT` exported — works too: chapter 24 reads SLURM's variables.)

# %%
script = SBATCH_SCRIPT.read_text()  # convit_edu/slurm/convit_small.sbatch
print(script)

# %% [markdown]
# What the installed torch's launcher makes of the script's setting (torchrun builds this `LaunchConfig` from its
# options; an older torch has no `shutdown_timeout` in it, and its 30 s are fixed):

# %%
# NBVAL_IGNORE_OUTPUT
# (the grace period depends on the installed torch)
from torch.distributed.launcher.api import LaunchConfig

setting = script.split("export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=")[1].split()[0]
os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = setting
try:
    launch = LaunchConfig(min_nodes=4, max_nodes=4, nproc_per_node=8)
finally:
    del os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]
grace = getattr(launch, "shutdown_timeout", None)
assert grace in (int(setting), None), f"this torch's launcher read {grace} s, not the script's {setting} s"
print(f"torch {torch.__version__}: torchrun gives its workers {grace or 30} s between SIGTERM and SIGKILL")

# %% [markdown]
# The flags of every command above are checked against the parser here (with `--print-config`, which stops
# before any work):

# %%
COMMANDS = [
    "train --preset cifar100-32 --model convit_tiny --epochs 1 --warmup-epochs 0 --output runs/quickstart",
    "train --preset imagenet --model convit_tiny --accum-steps 8 --output runs/convit_tiny",
    "train --preset imagenet --model convit_small --data-root /datasets/imagenet --output runs/convit_small --resume auto",
    "train " + script.split(" train ", 1)[1].split("&")[0].replace("\\\n", " "),  # the sbatch script's
]
for command in COMMANDS:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main([*command.split(), "--print-config"])
    assert status == 0, command
    text = out.getvalue()
    cfg = json.loads(text[text.index("{\n"):])
    print(f"{cfg['model']:<13} {cfg['data']:<12} epochs {cfg['epochs']:>3}  global batch {cfg['global_batch']}"
          f"  accum {cfg['accum_steps']}  resume {cfg['resume']}")
