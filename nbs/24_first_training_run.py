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
# # A first training run: a small ConViT and DeiT in minutes
#
# Chapter 09 trained a small ConViT and DeiT with a loop you wrote. This chapter trains the same kind of pair —
# side by side, on 10 classes of Tiny ImageNet, on a laptop CPU, in a few minutes — with the production loop,
# chapter 09's loop hardened, used as a tool: one config in, one folder of records out. We read what it wrote:
# the learning-rate schedule, the loss and accuracy per epoch, the checkpoints, and the ConViT's gates σ(λ),
# which say how much each GPSA layer still relies on position. How the loop works inside (config validation,
# samplers, checkpoints, many GPUs) is the subject of the engineering track (chapters 10-23).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
import json
import math
import random
import shutil
import time
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from convit_edu.checks import expect_error

torch.set_printoptions(precision=4, sci_mode=False)
random.seed(0)
np.random.seed(0)
_ = torch.manual_seed(0)

# %% [markdown]
# ## A run is a config
#
# Everything that decides what a run computes is one `TrainConfig`: the model (a name from the zoo, with
# `model_args` overriding its sizes), the data, the epochs, the batch, the learning rate and the seed. Its
# defaults are DeiT's recipe (AdamW, warm-up + cosine, RandAugment, Mixup/CutMix, label smoothing, random
# erasing, drop path); we change only what a small run needs.
#
# **The data.** The first 10 classes of the shared Tiny ImageNet subset: 64 × 64 photographs, 500 training and
# 50 validation images per class. Without the archive (on your own machine) the run falls back to synthetic
# images of the same shape and number, so every cell still runs.
#
# **The models.** Width 96 in 4 heads, 6 blocks, 8-pixel patches (an 8 × 8 grid of 64 tokens). The ConViT's
# first 5 blocks are GPSA (`local_up_to_layer=5`) and the class token joins before the last one; the DeiT has
# plain self-attention everywhere. Everything else is the same, down to the seed: the same images come in the
# same order.
#
# **The budget.** Half of each class's training images (`fraction=0.5`, 2 500 images), 4 epochs at batch 64,
# one of them warm-up. FAST mode (CI) keeps 2 classes and a tenth of their images (one step per epoch) for 2
# epochs: enough to run every cell.

# %%
# NBVAL_IGNORE_OUTPUT
from convit_edu.callbacks import plot_history
from convit_edu.config import TrainConfig
from convit_edu.datasets import first_classes
from convit_edu.training import train

RUNS = Path("runs")  # nbs/runs/ is ignored by git
data = first_classes("../../shared/data/tiny-imagenet-100.tar.gz", "../data/tiny-imagenet-100-first10", 10,
                     num_train=5000, num_val=500, image_size=64)
IMAGES_PER_CLASS, CLASSES = 500, 2 if FAST else 10

size = dict(patch_size=8, embed_dim=96, num_heads=4, depth=6)
deit_cfg = TrainConfig(model="deit_tiny", model_args=size, img_size=64, **data, classes=CLASSES,
                       fraction=0.1 if FAST else 0.5, epochs=2 if FAST else 4, batch_size=64,
                       lr=8e-3, warmup_epochs=1, precision="fp32", num_workers=2, seed=0,
                       output=str(RUNS / "24_deit"))
convit_cfg = replace(deit_cfg, model="convit_tiny", model_args={**size, "local_up_to_layer": 5},
                     output=str(RUNS / "24_convit"))
configs = {"DeiT": deit_cfg, "ConViT": convit_cfg}
print("data:", data["data"], "| FAST:", FAST)
print(convit_cfg)

# %% [markdown]
# Two settings deserve a word. `precision="fp32"`: on a CPU the default (`auto`) would pick bfloat16 where the
# processor has it, and the run would then depend on the machine. And `lr=8e-3`, sixteen times DeiT's 5·10⁻⁴: `lr`
# is the *base* rate for a batch of 512, and the optimiser uses
#
# $$\eta_\text{peak} = \texttt{lr} \times \frac{B_\text{global}}{512},$$
#
# DeiT's linear scaling rule, where the global batch is the number of images one optimiser step averages over
# (`batch_size` × `accum_steps` × number of processes; here 64). So our peak is 8·10⁻³ × 64 / 512 = 10⁻³, the
# peak DeiT itself reaches with its batch of 1024. DeiT's base rate would give 6·10⁻⁵ at our batch, too little to
# get anywhere in 156 steps: the rule keeps one recipe consistent across batch sizes, it does not choose the rate
# for another model and budget.
#
# The rate is set at every optimiser step: a linear warm-up from `warmup_lr` (10⁻⁶) to the peak over
# `warmup_epochs`, then half a cosine down to `min_lr` (10⁻⁵) at the last step.
#
# ## Training
#
# `train(cfg)` builds the data, the model and the optimiser from the config, trains, evaluates after every
# epoch, and returns the model and the history. In a notebook it draws a progress bar and a live loss curve.
# (The committed times come from an Intel Xeon with AVX-512, 2 cores, nothing else running.)

# %%
# NBVAL_IGNORE_OUTPUT
results, seconds = {}, {}
for name, cfg in configs.items():
    shutil.rmtree(cfg.output, ignore_errors=True)  # a fresh run, not the continuation of an old one
    t0 = time.perf_counter()
    results[name] = train(cfg)
    seconds[name] = time.perf_counter() - t0
for name, r in results.items():
    print(f"{name}: {seconds[name]:.0f} s, val top-1 after {len(r.history)} epochs: {r.history[-1]['val_top1']:.1f} %")

# %% [markdown]
# The two models have the same size to within 0.3 %: the ConViT adds GPSA's positional projections and gates,
# the DeiT has biases in its query-key-value projections and a position embedding for the class token too:

# %%
counts = {name: sum(p.numel() for p in r.model.parameters()) for name, r in results.items()}
assert abs(counts["ConViT"] - counts["DeiT"]) < 0.003 * counts["DeiT"] and 650_000 < counts["DeiT"] < 750_000
print(f"ConViT − DeiT: {counts['ConViT'] - counts['DeiT']:+,} parameters, of about 0.7 million")

# %% [markdown]
# ## What a run writes
#
# Everything lands in the config's `output` folder:
#
# - `run.json` — the config and what it became on this machine: world size, batch sizes, the scaled learning
#   rate, steps per epoch, device, precision, versions, command line;
# - `invocations.jsonl` — one line per start (a resumed run adds one);
# - `log.jsonl` — one JSON row per evaluated epoch, and `log.csv`, the same rows for a spreadsheet;
# - `last.pt` — the checkpoint of the last epoch (weights, optimiser, schedule, random states: enough to
#   resume), and `best.pt`, rewritten whenever validation top-1 improved;
# - `curves.png` — the curves below.

# %%
out = {name: Path(cfg.output) for name, cfg in configs.items()}
info = {name: json.loads((out[name] / "run.json").read_text()) for name in configs}
rows = {name: [json.loads(line) for line in (out[name] / "log.jsonl").read_text().splitlines()] for name in configs}
print(sorted(p.name for p in out["ConViT"].iterdir()))
print("run.json:", list(info["ConViT"]))
print("a log row:", list(rows["ConViT"][0]))
print("log.csv:", (out["ConViT"] / "log.csv").read_text().splitlines()[0])

# %% [markdown]
# The records agree with the config, by arithmetic anyone can redo: ⌊0.5 × 500⌋ × 10 = 2 500 images, ⌊2500 / 64⌋
# = 39 steps per epoch (the last, incomplete batch of an epoch is dropped), and the learning rate of the last row
# — read after the last step — is `min_lr`:

# %%
for name, cfg in configs.items():
    images = math.floor(cfg.fraction * IMAGES_PER_CLASS) * CLASSES
    steps_per_epoch = images // cfg.batch_size
    assert info[name]["global_batch"] == cfg.batch_size == 64 and info[name]["world_size"] == 1
    assert info[name]["scaled_lr"] == cfg.lr * 64 / 512
    assert info[name]["steps_per_epoch"] == steps_per_epoch
    assert [r["epoch"] for r in rows[name]] == list(range(1, cfg.epochs + 1))
    assert [r["step"] for r in rows[name]] == [steps_per_epoch * e for e in range(1, cfg.epochs + 1)]
    assert rows[name] == results[name].history and math.isclose(rows[name][-1]["lr"], cfg.min_lr)
print(f"peak learning rate {info['ConViT']['scaled_lr']:.1e} = {convit_cfg.lr:.0e} × 64 / 512; "
      f"last logged rate {rows['ConViT'][-1]['lr']:.0e} = min_lr")

# %%
# NBVAL_IGNORE_OUTPUT
print("steps per epoch:", info["ConViT"]["steps_per_epoch"], "| rows:", len(rows["ConViT"]))
for name in configs:
    print(name)
    for r in rows[name]:
        print(f"  epoch {r['epoch']}  step {r['step']:3d}  lr {r['lr']:.2e}  train loss {r['train_loss']:.3f}  "
              f"val loss {r['val_loss']:.3f}  top-1 {r['val_top1']:5.1f} %  top-5 {r['val_top5']:5.1f} %")

# %% [markdown]
# The train loss is measured on mixed, augmented images with smoothed labels, so it stays well above the
# validation loss: it is what the optimiser sees, not how well the model does. `plot_history` draws a run's rows
# (it also saved them as `curves.png`): the losses with the schedule on the right axis, the accuracies, and for a
# ConViT the mean gate of every GPSA layer. Here the ConViT's:

# %%
# NBVAL_IGNORE_OUTPUT
plot_history(rows["ConViT"])

# %% [markdown]
# And the two models against each other, epoch by epoch:

# %%
# NBVAL_IGNORE_OUTPUT
fig, axes = plt.subplots(1, 2, figsize=(8, 2.8), dpi=80)
for name in configs:
    epochs = [r["epoch"] for r in rows[name]]
    axes[0].plot(epochs, [r["val_top1"] for r in rows[name]], "o-", label=name)
    axes[1].plot(epochs, [r["val_loss"] for r in rows[name]], "o-", label=name)
axes[0].set(xlabel="epoch", ylabel="val top-1 (%)")
axes[1].set(xlabel="epoch", ylabel="val loss")
for ax in axes:
    ax.set_xticks(epochs)
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **What this does not show.** One seed, 10 classes, 156 optimiser steps: two such runs of the *same* model
# with different seeds can differ by a few points of top-1, as much as any gap between the curves above. The
# paper's claim — the ConViT beats a DeiT of the same size, most of all when data is scarce — is about full
# ImageNet budgets, and testing it even at small scale needs several seeds per model and a comparison of the
# spread; the experiment chapters (28-30) set that up. Here we only learned to run, and to read a run.
#
# ## The gates during training
#
# Every row of a ConViT's log carries `gates`: the mean σ(λ) over the heads of each GPSA layer, in layer order.
# A gate of 1 is pure positional (convolution-like) attention, 0 pure content attention. Every λ starts at 1, so
# every gate starts at σ(1) ≈ 0.731; a DeiT has no gates and logs an empty list. (`plot_history` above numbers
# the layers from 0, the table below from 1.)

# %%
assert all(len(r["gates"]) == 5 and all(0 < g < 1 for g in r["gates"]) for r in rows["ConViT"])
assert all(r["gates"] == [] for r in rows["DeiT"])
print(f"initial gate σ(1) = {1 / (1 + math.exp(-1)):.3f}; GPSA layers logged: {len(rows['ConViT'][0]['gates'])}")

# %%
# NBVAL_IGNORE_OUTPUT
print("epoch  " + "  ".join(f"layer {i + 1}" for i in range(5)))
for r in rows["ConViT"]:
    print(f"{r['epoch']:5d}  " + "  ".join(f"{g:7.3f}" for g in r["gates"]))

# %% [markdown]
# In a run this short the gates can barely move. AdamW moves a parameter by about the learning rate per step
# at most, and this run's 156 rates add up to 0.079: λ can travel about 0.08 from 1, and σ(λ), whose slope there
# is σ(1)(1 − σ(1)) ≈ 0.2, about 0.015. The paper's gates fall over 300 epochs of ImageNet, 375 000 steps at
# batch 1024. Chapters 25 and 26 follow them, with the attention maps, through longer runs.

# %%
from convit_edu.optimisation import learning_rate_sum, scaled_lr

sigma_slope = math.exp(-1) / (1 + math.exp(-1)) ** 2  # σ'(1) = σ(1)(1 − σ(1))
assert round(sigma_slope, 1) == 0.2 and math.isclose(scaled_lr(5e-4, 64), 6.25e-5)  # DeiT's rate at our batch
if not FAST:  # the prose's numbers are those of the full run
    lr_sum = learning_rate_sum(convit_cfg, steps_per_epoch)
    assert convit_cfg.epochs * steps_per_epoch == 156 and round(lr_sum, 3) == 0.079
    assert round(sigma_slope * lr_sum, 3) == 0.015
    moved = max(abs(g - 1 / (1 + math.exp(-1))) for r in rows["ConViT"] for g in r["gates"])
    assert moved < 0.02  # the gates barely moved: within about the 0.015 the learning rates allow
    # and, from the section above, the train loss (mixed, augmented, smoothed) stays well above the validation loss
    assert all(r["train_loss"] > r["val_loss"] + 0.1 for name in rows for r in rows[name])

# %% [markdown]
# ## Exercises
#
# **1. Counting steps.** Without looking at the log, compute `steps`, the total number of optimiser steps of
# the ConViT run, from `convit_cfg` (its `fraction`, `batch_size` and `epochs`) and the data's
# `IMAGES_PER_CLASS` and `CLASSES`.

# %% tags=["solution"] jupyter={"source_hidden": true}
steps = (math.floor(convit_cfg.fraction * IMAGES_PER_CLASS) * CLASSES // convit_cfg.batch_size) * convit_cfg.epochs

# %%
# your answer: steps = ...

# %%
from convit_edu.checks import WrongAnswer, check_answer


def check_steps(answer: int) -> None:
    want = rows["ConViT"][-1]["step"]
    check_answer(isinstance(answer, int), "give a whole number of steps")
    check_answer(answer != info["ConViT"]["steps_per_epoch"], "you have the steps of one epoch: the run has several")
    check_answer(answer == want, "an optimiser step needs a full batch: what happens to the images of an epoch "
                 "that do not fill the last one?")


check_steps(steps)
print(expect_error(lambda: check_steps(math.ceil(math.floor(convit_cfg.fraction * IMAGES_PER_CLASS) * CLASSES
                                                 / convit_cfg.batch_size) * convit_cfg.epochs), WrongAnswer))

# %% [markdown]
# **2. The scaled learning rate.** On a machine with less memory you would run the same recipe with
# `batch_size=32` and `accum_steps=4` (four micro-batches add their gradients before each optimiser step). What
# peak learning rate `peak` does the optimiser then reach, with the ConViT's `lr`?

# %% tags=["solution"] jupyter={"source_hidden": true}
peak = convit_cfg.lr * 32 * 4 / 512  # the global batch is 32 × 4 = 128 images per optimiser step

# %%
# your answer: peak = ...

# %%
from convit_edu.optimisation import scaled_lr


def check_peak(answer: float) -> None:
    check_answer(not math.isclose(answer, convit_cfg.lr), "lr is the rate for a batch of 512, not the rate used")
    check_answer(not math.isclose(answer, scaled_lr(convit_cfg.lr, 32)), "the rate follows the batch of one "
                 "optimiser step, and one step here averages more than 32 images")
    check_answer(math.isclose(answer, scaled_lr(convit_cfg.lr, 32 * 4)), "scale lr linearly with the global "
                 "batch, against DeiT's 512")


check_peak(peak)
print(expect_error(lambda: check_peak(convit_cfg.lr * 32 / 512), WrongAnswer))

# %% [markdown]
# **3. The schedule by hand.** Write `lr_at(step)`: the learning rate of the ConViT run after `step` optimiser
# steps (0 to the last), from the config and `info["ConViT"]` (its `scaled_lr` and `steps_per_epoch`) — a linear
# warm-up from `warmup_lr` to the peak over `warmup_epochs` epochs of steps, then
# η = η_min + ½(η_peak − η_min)(1 + cos π·(t − t_w)/(T − t_w)). The check compares it with the package's
# `deit_lr` at every step and with the rates in the run's log.

# %% tags=["solution"] jupyter={"source_hidden": true}
def lr_at(step: int) -> float:
    cfg, per_epoch = convit_cfg, info["ConViT"]["steps_per_epoch"]
    peak, total, warmup = info["ConViT"]["scaled_lr"], per_epoch * cfg.epochs, round(cfg.warmup_epochs * per_epoch)
    if step < warmup:
        return cfg.warmup_lr + (peak - cfg.warmup_lr) * step / warmup
    return cfg.min_lr + 0.5 * (peak - cfg.min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


# %%
# your answer: def lr_at(step): ...

# %%
from convit_edu.fit import deit_lr


def check_lr_at(fn) -> None:
    cfg, per_epoch = convit_cfg, info["ConViT"]["steps_per_epoch"]
    total, warmup = per_epoch * cfg.epochs, round(cfg.warmup_epochs * per_epoch)
    want = [deit_lr(t, total, warmup, info["ConViT"]["scaled_lr"], cfg.min_lr, cfg.warmup_lr) for t in range(total + 1)]
    got = [fn(t) for t in range(total + 1)]
    check_answer(math.isclose(got[0], want[0]), "the first step runs at warmup_lr, not at the peak")
    check_answer(math.isclose(got[warmup], want[warmup]), "the warm-up ends at the peak after warmup_epochs × "
                 "steps per epoch steps")
    check_answer(math.isclose(got[-1], want[-1]), "after the last step the cosine has reached min_lr")
    check_answer(all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(got, want)), "the landmarks are right, "
                 "the path between them is not: a linear rise, then half a cosine period")
    check_answer(all(math.isclose(got[r["step"]], r["lr"], rel_tol=1e-9) for r in rows["ConViT"]), "your rates "
                 "do not match the log's")


check_lr_at(lr_at)
print(expect_error(lambda: check_lr_at(lambda t: convit_cfg.min_lr + 0.5 * (info["ConViT"]["scaled_lr"] - convit_cfg.min_lr)
                                      * (1 + math.cos(math.pi * t / rows["ConViT"][-1]["step"]))), WrongAnswer))

# %% [markdown]
# **4. What `best.pt` holds.** `best.pt` is written after an epoch's evaluation whenever validation top-1 is
# strictly higher than at every earlier epoch. From the rows of `log.jsonl` alone, which epoch's weights does
# the ConViT's `best.pt` hold? Set `best_epoch` (epochs count from 1, as in the log). The check opens the
# checkpoint.

# %% tags=["solution"] jupyter={"source_hidden": true}
best_epoch = max(rows["ConViT"], key=lambda r: r["val_top1"])["epoch"]  # max keeps the first of equal scores

# %%
# your answer: best_epoch = ...

# %%
from convit_edu.checkpoints import read_checkpoint


def check_best_epoch(answer: int) -> None:
    best = read_checkpoint(out["ConViT"] / "best.pt")
    assert best["best_top1"] == max(r["val_top1"] for r in rows["ConViT"])
    check_answer(answer != best["epoch"] - 1, "the log's epochs count from 1: epoch 1 is the first row")
    check_answer(answer == best["epoch"], "look for the highest val_top1 in the rows, and when it was first "
                 "reached: a later tie does not rewrite best.pt")


check_best_epoch(best_epoch)
print(expect_error(lambda: check_best_epoch(max(range(len(rows["ConViT"])), key=lambda i: rows["ConViT"][i]["val_top1"])),
                   WrongAnswer))
