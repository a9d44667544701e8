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
# # The training loop, checked
#
# What chapters 12-28 promised, checked by running it: a trainer driven by hand, step by step, and resumed from its
# checkpoint; a run stopped anywhere and resumed ends with bit-identical weights; a hook sees every step; a NaN
# stops the run and says where; and two processes train as one.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from convit_edu.checks import expect_error
from convit_edu.config import TrainConfig
from convit_edu.distributed import init_world
from convit_edu.run_records import RunFolder
from convit_edu.run_state import read_checkpoint
from convit_edu.training import Trainer, train

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Driving the trainer by hand
#
# The trainer's state is its position, so it can be driven a piece at a time. A small ConViT (2 blocks, the
# first one GPSA) on 64 synthetic 16 × 16 images, 8 steps per epoch: three `step`s leave three losses on the
# device, unread; one `read_back` brings them home together.

# %%
tmp = Path(tempfile.mkdtemp())
tiny = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 48, "depth": 2,
                   "local_up_to_layer": 1}, data="fake", data_args={"num_train": 64, "num_val": 16, "image_size": 16},
                   epochs=1, batch_size=8, ema_decay=0.9, precision="fp32", num_workers=0, progress="none")
trainer = Trainer(replace(tiny, output=str(tmp / "by-hand")), init_world("cpu"))
batches = trainer.data.loaders.epoch(0, start=0)
for _ in range(3):
    trainer.train_step(batches)
assert len(trainer.train_step.unread) == 3 and trainer.state.step == 3 and trainer.state.epoch_losses == []
trainer.train_step.read_back(False, trainer.records.last_good)  # no stop signal received here
assert trainer.train_step.unread == [] and len(trainer.state.epoch_losses) == 3
print(f"{trainer.state.step} of {trainer.data.steps_per_epoch} steps; after one read-back "
      f"{len(trainer.state.epoch_losses)} losses on the host, none left on the device")

# %% [markdown]
# A checkpoint written here (the trainer's writer, `trainer.records`, saves `last.pt`) and resumed by a new trainer
# (chapter 26's `resume_checkpoint` and `restore_run`) holds the same run, bit for bit: the position and its
# losses, the weights, the optimiser's moments, the EMA and the generators; the schedule, a function of the step,
# gives the same rates.

# %%
trainer.records.save(trainer.state)
resumed = Trainer(replace(tiny, output=str(tmp / "resumed"), resume=str(tmp / "by-hand" / "last.pt")),
                  init_world("cpu"))
s, r = trainer.state, resumed.state
assert (r.epoch, r.step, r.global_step, r.epoch_losses) == (s.epoch, s.step, s.global_step, s.epoch_losses)
assert torch.equal(torch.get_rng_state(), read_checkpoint(tmp / "by-hand" / "last.pt")["rng"]["torch"])
for part in ("model", "optimizer", "ema"):
    torch.testing.assert_close(getattr(r, part).state_dict(), getattr(s, part).state_dict(), rtol=0, atol=0)
assert r.schedule == s.schedule and r.schedule.lr(r.global_step) == s.schedule.lr(s.global_step)
print(f"resumed at epoch {resumed.state.epoch + 1}, step {resumed.state.step}: weights, optimiser, EMA and "
      "generators as saved, the same rate next")

# %% [markdown]
# `fit` goes on from where the trainer stands — step 3 of epoch 1 — and the run ends with exactly the weights of
# an uninterrupted `train` of the same config: where each batch comes from and what each step draws are functions
# of the position alone. The resumed trainer ends there too; and the run folder holds what chapter 27 says a
# run writes: `best.pt` holds the best epoch's weights, and `last.pt` its score. Weights gone non-finite are never
# saved, and a non-finite loss stops the run when it is read back; each error names the last good checkpoint.

# %%
result = trainer.fit()
straight = train(replace(tiny, output=str(tmp / "straight")))
assert [row["step"] for row in result.history] == [row["step"] for row in straight.history] == [8]
assert all(torch.equal(p, q) for p, q in zip(result.model.state_dict().values(), straight.model.state_dict().values()))
torch.testing.assert_close(resumed.fit().model.state_dict(), straight.model.state_dict(), rtol=0, atol=0)
print("3 steps by hand, then fit, or resumed from step 3: bit for bit the weights of an uninterrupted train")
folder = RunFolder(tmp / "straight")
written = {p.name for p in folder.path.iterdir()}
assert {p.name for p in (folder.info, folder.invocations, folder.last, folder.best, folder.log, folder.table,
                         folder.curves)} <= written
best, last = read_checkpoint(folder.best), folder.checkpoint()
assert last["best_top1"] == straight.history[-1]["val_top1"] == folder.history()[-1]["val_top1"]
assert best["epoch"] == last["epoch"] == 1
torch.testing.assert_close(best["model"], last["model"], rtol=0, atol=0)
print("the run folder:", ", ".join(sorted(written)))
with torch.no_grad():
    trainer.model.head.weight[0, 0] = float("nan")
message = expect_error(lambda: trainer.records.save(trainer.state), FloatingPointError)
assert "were not saved" in message and "last.pt is the last good checkpoint" in message
print(message)
assert all(torch.isfinite(t).all() for t in read_checkpoint(tmp / "by-hand" / "last.pt")["model"].values())
trainer.train_step(trainer.data.loaders.epoch(1, start=0))
message = expect_error(lambda: trainer.train_step.read_back(False, trainer.records.last_good), FloatingPointError)
assert "non-finite loss" in message and "last good checkpoint" in message
print(message)

# %% [markdown]
# ## Checked: stopping anywhere and resuming changes nothing
#
# The training chapters' central claim (chapter 21), on a smaller ConViT (2 blocks, the first one GPSA, 16 × 16
# synthetic images, with Mixup/CutMix, RandAugment, random erasing, drop path, an EMA and gradient accumulation —
# every source of randomness the recipe has). Run A trains 2 epochs straight. Run B is stopped by a hook in the
# middle of the first epoch (the same path as a SIGTERM), and run C resumes it with `resume="auto"`. With fp32 on
# the CPU and `num_workers=0`, C ends with weights *bit-identical* to A's: `torch.equal`, not `allclose`.
#
# What "exact" means elsewhere: every random draw is the same on any device, so a resumed run sees the same
# images, crops, mixes and drop-path masks as an uninterrupted one. On a CPU the arithmetic is deterministic
# too (for a given machine, thread count and library build), hence bit-identical weights. On a GPU some kernels
# are not: atomic additions in the backward of scatter/index operations, cuDNN's and cuBLAS's algorithm
# choices, and the fused-attention backward add floating-point numbers in an order that changes from run to
# run. There a resumed run and an uninterrupted one — like two uninterrupted ones — agree to rounding at
# first and drift apart slowly, as any two GPU runs of one seed do; `torch.use_deterministic_algorithms(True)`
# (with `CUBLAS_WORKSPACE_CONFIG=:4096:8`) removes most of that at a cost in speed. The bookkeeping — the
# sampler's position, the schedule, the step count, the best score — is exact everywhere.

# %%
from dataclasses import replace

from convit_edu.run_state import Callback, read_checkpoint


class StopAfter(Callback):
    """Ask for a clean stop after `step` optimiser steps of the first epoch."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, state):
        state.stop = state.epoch == 0 and state.step == self.step


tmp = Path(tempfile.mkdtemp())
tiny = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 48, "depth": 2,
                   "local_up_to_layer": 1}, data="fake", data_args={"num_train": 96, "num_val": 32,
                   "image_size": 16}, epochs=2, batch_size=8, accum_steps=2,
                   ema_decay=0.9, precision="fp32", num_workers=0, progress="none")
a = train(replace(tiny, output=str(tmp / "A")))
b = train(replace(tiny, output=str(tmp / "B")), callbacks=[StopAfter(3)])
ckpt = read_checkpoint(tmp / "B" / "last.pt")
print(f"B stopped by {b.stopped!r} in epoch {ckpt['epoch'] + 1} after step {ckpt['step']} of {a.history[0]['step']}")
c = train(replace(tiny, output=str(tmp / "B"), resume="auto"))
identical = all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), c.model.state_dict().values()))
identical_ema = all(torch.equal(p, q) for p, q in zip(a.ema.state_dict().values(), c.ema.state_dict().values()))
assert identical and identical_ema
assert [r["val_loss"] for r in a.history] == [r["val_loss"] for r in c.history]
print("resumed weights identical to the uninterrupted run:", identical, "| EMA too:", identical_ema)


# %% [markdown]
# ## A hook: the gates during training
#
# The analysis chapter follows nonlocality and the gates σ(λ) through training with hooks like this one,
# which records the mean σ(λ) of each GPSA layer after every optimiser step (the model's `gate_means()`, also
# logged per epoch). Here on the tiny ConViT of the previous section:

# %%
class RecordGates(Callback):
    def __init__(self):
        self.steps, self.gates = [], []

    def on_step_end(self, state):
        self.steps.append(state.global_step)
        self.gates.append(state.model.gate_means())


recorder = RecordGates()
train(replace(tiny, output=str(tmp / "hooks"), epochs=1), callbacks=[recorder])
assert len(recorder.gates) == 6 and all(len(g) == 1 for g in recorder.gates)  # a gate per step and GPSA layer
assert abs(recorder.gates[0][0] - torch.sigmoid(torch.tensor(1.0)).item()) < 0.01  # one step from σ(1)
assert recorder.gates[-1] != recorder.gates[0]  # λ is trained

# %%
# NBVAL_IGNORE_OUTPUT
print("σ(λ) of the GPSA layer after each step:", [f"{g[0]:.4f}" for g in recorder.gates])

# %% [markdown]
# ## Checked: a NaN stops the run, and says where
#
# A non-finite loss is found on the rank where it happens, shared with the others through the same all-reduce
# that carries the loss, and every rank raises before the optimiser step: the weights and the last checkpoint
# stay finite. Here one training image is poisoned with a NaN:

# %%
from torch.utils.data import Dataset


class Poisoned(Dataset):
    def __init__(self, base, bad_index):
        self.base, self.bad_index = base, bad_index

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        return (torch.full_like(x, float("nan")) if i == self.bad_index else x), y


from convit_edu.augment import build_transforms
from convit_edu.datasets import build_datasets

train_tf, val_tf = build_transforms(tiny.aug_config())
fake_train, fake_val, names = build_datasets("fake", train_transform=train_tf, val_transform=val_tf, **tiny.data_args)
message = expect_error(
    lambda: train(replace(tiny, output=str(tmp / "nan"), ckpt_every=1), datasets=(Poisoned(fake_train, 40), fake_val, names)),
    FloatingPointError)
print(message.replace(str(tmp), "TMP"))
last = read_checkpoint(tmp / "nan" / "last.pt")
assert all(torch.isfinite(t).all() for t in last["model"].values())
print(f"last good checkpoint: epoch {last['epoch'] + 1}, step {last['step']}, all weights finite")

# %% [markdown]
# ## From one process to many
#
# Nothing above changes with the scale; only the launcher does. The same `train(cfg)` — through the
# `convit-edu train` command of chapter 42 — runs as
#
# ```bash
# convit-edu train ...                                          # one process: the CPU or one GPU
# torchrun --nproc_per_node=8 -m convit_edu.cli train ...       # one node, 8 GPUs (NCCL)
# torchrun --nnodes=4 --nproc_per_node=8 --rdzv-backend=c10d \
#     --rdzv-endpoint=$HEAD_NODE:29500 -m convit_edu.cli train ... # 4 nodes (run on each node)
# srun torchrun ... -m convit_edu.cli train ...                 # the same under SLURM (chapter 43)
# ```
#
# `tests/test_training.py` runs the real DistributedDataParallel path with two gloo processes on the CPU and
# checks that they end with the weights of one process with the same global batch (to float tolerance: the
# all-reduce sums in another order). The rules that make this hold are the ones this chapter followed: the
# sampler gives rank k the stream positions k, k + W, …, so two ranks of batch 8 see exactly the 16 images
# one process of batch 16 sees; the loss is a mean, and DDP averages the gradients of equal-sized shards;
# the learning rate follows the global batch; and every logged number is summed over ranks first.
#
# The world comes from the environment: torchrun's `RANK`, `WORLD_SIZE` and `LOCAL_RANK`, or — for a plain
# `srun python -m convit_edu.cli train …`, one task per GPU — SLURM's `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS` and
# `SLURM_LOCALID` with `MASTER_ADDR`/`MASTER_PORT` exported by the batch script (the batch script itself,
# outside `srun`, is a world of one even though `SLURM_NTASKS` says more). Process *k* uses GPU
# `local rank mod visible GPUs`, so a task that sees one GPU (`--gpus-per-task=1`) uses `cuda:0`. An
# inconsistent world (a rank outside the world, a missing variable) is an error before anything starts, and
# the process group times out after 30 minutes (`PROCESS_GROUP_TIMEOUT`) instead of hanging forever when a
# process dies. A run stopped on W processes resumes on W' at the same global batch (the test above stops two
# gloo processes mid-epoch and finishes on one): the sampler's position and the samples' seeds are places in
# the global stream, so the remaining images of the epoch are the same ones; only the order in which DDP adds
# the gradients, and the per-process draws of MixUp and drop path, differ.
