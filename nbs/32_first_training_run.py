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
# Chapter 11 trained a small ConViT and DeiT with `fit`, the loop whose epoch you wrote there as `my_epoch`. This
# chapter trains the same pair the same way
# (classes, images, crop and flip, epochs, batch, learning rates, seed) with the production loop (chapter 11's,
# hardened) used as a tool: one config in, one folder of records out. Only the random draws differ (it seeds the
# shuffling, crops and initial weights its own way), so the two chapters' scores should differ by no more than a
# seed's luck, and we measure that they do. We read what the run wrote (schedule, losses, accuracy, checkpoints,
# the ConViT's gates σ(λ)). Chapter 32_gpsa_layers then reads longer committed runs (Fig. 8b) and runs a small
# experiment (Fig. 8a) with the yardsticks this chapter sets.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
import json
import math
import re
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from IPython.display import display

from convit_edu.checks import check_answer, demonstrate, grade, reveal
from convit_edu.run_state import read_checkpoint
from convit_edu.schedule import deit_lr, scaled_lr

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## A run is a config
#
# Everything that decides what a run computes is one `TrainConfig`: the model (a zoo name, `model_args`
# overriding its sizes), the data, the epochs, the batch, the learning rate, the seed. Its defaults are DeiT's
# recipe (AdamW, warm-up + cosine, RandAugment, Mixup/CutMix, label smoothing, random erasing, drop path: chapter
# 15), made for 300 epochs; here we set chapter 11's run instead. **The data**: the first 10 classes of the
# course's Tiny ImageNet (64 × 64 photographs, 500 training and 50 validation images per class), all 5 000
# training images. **The models**: width 96 in 4 heads, 6 blocks, 8-pixel patches; the ConViT's first 5 blocks are
# GPSA, the class token joining before the last. **The budget**: 4 epochs at batch 64, one of them warm-up.
# **The augmentation** (`aug_args`): a crop of the image padded by 4 pixels and a flip; no drop path. FAST mode
# (CI): 2 classes, a quarter of their images, 2 epochs (3 steps each, so that the schedule of exercise 2 has steps
# between its landmarks).

# %%
# NBVAL_IGNORE_OUTPUT
from convit_edu.config import TrainConfig
from convit_edu.photographs import tiny_imagenet
from convit_edu.run_records import plot_history
from convit_edu.training import train

RUNS = Path("runs")  # nbs/runs/ is ignored by git
data = {"data": "imagefolder", "data_root": str(tiny_imagenet("../data"))}
IMAGES_PER_CLASS, CLASSES = 500, 2 if FAST else 10

size = dict(patch_size=8, embed_dim=96, num_heads=4, depth=6)
chapter_11_aug = dict(crop="pad", padding=4, randaugment_magnitude=None, erasing=0.0, mixup_alpha=0.0,
                      cutmix_alpha=0.0, label_smoothing=0.0, crop_ratio=1.0)  # crop_ratio 1: no resize to score
deit_cfg = TrainConfig(model="deit_tiny", model_args=size, img_size=64, **data, classes=CLASSES,
                       aug_args=chapter_11_aug, drop_path_rate=0.0,
                       fraction=0.25 if FAST else 1.0, epochs=2 if FAST else 4, batch_size=64,
                       lr=8e-3, warmup_epochs=1, precision="fp32", num_workers=2, seed=0,
                       output=str(RUNS / "32_deit"))
convit_cfg = replace(deit_cfg, model="convit_tiny", model_args={**size, "local_up_to_layer": 5},
                     output=str(RUNS / "32_convit"))
configs = {"DeiT": deit_cfg, "ConViT": convit_cfg}
print(convit_cfg)

# %% [markdown]
# Two settings deserve a word. `precision="fp32"`: on a CPU the default (`auto`) would pick bfloat16 where the
# processor has it, and the run would depend on the machine. And `lr=8e-3`, as in chapter 11: `lr` is the *base*
# rate for a batch of 512, scaled linearly to the global batch (`batch_size` × `accum_steps` × processes; here 64),
# a peak of 8·10⁻³ × 64 / 512 = 10⁻³, DeiT's own at its batch of 1024; warm-up from `warmup_lr` (10⁻⁶) over
# `warmup_epochs`, then half a cosine down to `min_lr` (10⁻⁵) at the last step.
#
# ## Training
#
# `train(cfg)` builds the data, model and optimiser from the config, trains, evaluates after every epoch, and
# returns the model and the history.

# %%
# NBVAL_IGNORE_OUTPUT
results = {}
for name, cfg in configs.items():
    shutil.rmtree(cfg.output, ignore_errors=True)  # a fresh run, not the continuation of an old one
    results[name] = train(cfg)
for name, r in results.items():
    print(f"{name}: val top-1 after {len(r.history)} epochs: {r.history[-1]['val_top1']:.1f} %")

# %% [markdown]
# The two models have the same size to within 0.3 % (the ConViT adds GPSA's positional projections and gates,
# the DeiT has query-key-value biases and a position embedding for the class token):

# %%
counts = {name: sum(p.numel() for p in r.model.parameters()) for name, r in results.items()}
print(f"ConViT − DeiT: {counts['ConViT'] - counts['DeiT']:+,} parameters, of {counts['DeiT'] / 1e6:.1f} million")
assert abs(counts["ConViT"] - counts["DeiT"]) < 0.003 * counts["DeiT"]

# %% [markdown]
# ## What a run writes
#
# Everything lands in the config's `output` folder (chapter 27): the config and what it became here (`run.json`),
# one row per evaluated epoch (`log.jsonl`, `log.csv`), the checkpoints `last.pt` and `best.pt`, `curves.png`.

# %%
out = {name: Path(cfg.output) for name, cfg in configs.items()}
info = {name: json.loads((out[name] / "run.json").read_text()) for name in configs}
rows = {name: [json.loads(line) for line in (out[name] / "log.jsonl").read_text().splitlines()] for name in configs}
print(sorted(p.name for p in out["ConViT"].iterdir()))
print("a log row:", list(rows["ConViT"][0]))

# %% [markdown]
# The records agree with the config, by arithmetic anyone can redo: ⌊1 × 500⌋ × 10 = 5 000 images, ⌊5000 / 64⌋
# = 78 steps per epoch (the last, incomplete batch of an epoch is dropped), and the learning rate of the last row
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
    assert math.isclose(rows[name][-1]["lr"], cfg.min_lr)
print(f"peak learning rate {info['ConViT']['scaled_lr']:.1e} = {convit_cfg.lr:.0e} × 64 / 512; "
      f"last logged rate {rows['ConViT'][-1]['lr']:.0e} = min_lr")

# %%
# NBVAL_IGNORE_OUTPUT
for name in configs:
    print(name)
    for r in rows[name]:
        print(f"  epoch {r['epoch']}  step {r['step']:3d}  lr {r['lr']:.2e}  train loss {r['train_loss']:.3f}  "
              f"val loss {r['val_loss']:.3f}  top-1 {r['val_top1']:5.1f} %  top-5 {r['val_top5']:5.1f} %"
              + ("  gates " + " ".join(f"{g:.3f}" for g in r["gates"]) if r["gates"] else ""))

# %% [markdown]
# The train loss is the mean of an epoch's losses on cropped and flipped images, taken while the weights were still
# improving: what the optimiser saw, not how well the model does at the end. `plot_history` draws a run's rows
# (it also saved them as `curves.png`): the losses with the schedule on the right axis, the accuracies, and for a
# ConViT the mean gate of every GPSA layer. The ConViT's, then the two models against each other:

# %%
# NBVAL_IGNORE_OUTPUT
display(plot_history(rows["ConViT"]))
fig, axes = plt.subplots(1, 2, figsize=(8, 2.8), dpi=80)
for name in configs:
    for ax, key in zip(axes, ("val_top1", "val_loss")):
        ax.plot([r["epoch"] for r in rows[name]], [r[key] for r in rows[name]], "o-", label=name)
        ax.set(xlabel="epoch", ylabel=key.replace("_", " "), xticks=[r["epoch"] for r in rows[name]])
        ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **The same run as chapter 11's?** Its last top-1s on the same 500 validation images are read from its committed
# notebook below. Both chapters score on the *same* images, so the images add nothing to their difference: what
# separates two trainings of one recipe is the seed, which changes the weights, the order and the crops. How far
# apart does that put two runs? The course's experiment grid measured it (chapter 38's, four seeds of each of its
# models, scored on 500 dev images): a model's final dev top-1 spreads over its seeds by about 1.6 points (the
# standard deviation, pooled over its eight arms). Two runs of one recipe then differ by about √2 × 1.6 ≈ 2.3 points,
# and by more than twice that rarely. That grid trains other models with another recipe, so this is a scale, not
# this run's own spread; a gap well beyond it would say that the two loops trained different recipes.

# %%
# NBVAL_IGNORE_OUTPUT
chapter_11 = "".join(text for cell in json.loads(Path("11_fit.ipynb").read_text())["cells"]
                     for output in cell.get("outputs", []) for text in output.get("text", []))
CHAPTER_11 = {name: float(top1) for name, top1 in  # the top-1 after its 4 epochs (nbs/11_fit.ipynb)
              re.findall(r"^(ConViT|DeiT)\n(?:epoch [1-3]/4: .*\n)*epoch 4/4: .* top-1 ([\d.]+) %$", chapter_11, re.M)}
grid = json.loads(Path("results/second-design/summary.json").read_text())
arms = {}  # the grid's dev top-1 by arm: an ablation (or the model) and a fraction, one value per seed
for r in grid:
    arms.setdefault((r["ablation"] or r["model"], r["fraction"]), []).append(r["val_top1"])
df = sum(len(v) - 1 for v in arms.values() if len(v) > 1)
seed_sd = math.sqrt(sum((len(v) - 1) * statistics.variance(v) for v in arms.values() if len(v) > 1) / df)
two_runs = math.sqrt(2) * seed_sd  # the spread of a difference between two seeds of one recipe
print(f"the grid's seed spread of a dev top-1: {seed_sd:.1f} points ({df} df); of two runs' difference {two_runs:.1f}")
for name in configs:
    ours = rows[name][-1]["val_top1"]
    print(f"{name}: {ours:.1f} % here, {CHAPTER_11[name]:.1f} % in chapter 11 ({ours - CHAPTER_11[name]:+.1f} points)")
chance_se = 100 * math.sqrt(0.1 * 0.9 / 500)  # a top-1 at chance (10 classes) on 500 images varies by this much
if not FAST:  # FAST mode trains 2 classes for 2 epochs: nothing to compare
    assert all(abs(rows[name][-1]["val_top1"] - CHAPTER_11[name]) < 2 * two_runs for name in configs)
    assert all(rows[name][-1]["val_top1"] > 10 + 4 * chance_se for name in rows)  # above chance, beyond noise

# %% [markdown]
# **What these runs can and cannot show.** The loop at work and how to read its records: the schedule, the
# losses, both models well above chance (10 %, whose top-1 on 500 images would vary by 1.3 points: the cell above
# asks four of those) after 312 steps, as in chapter 11. Not which model is better, nor the paper's head start: one
# seed, 500 validation images, 312 steps; two seeds of the *same* model differ by a few points, as much as any gap
# between the models — compare the two chapters.
#
# ## The gates during training
#
# Every row of a ConViT's log carries `gates`: the mean σ(λ) over the heads of each GPSA layer, in layer order
# (the table above lists them). A gate of 1 is pure positional (convolution-like) attention, 0 pure content
# attention. Every λ starts at 1, so every gate starts at σ(1) ≈ 0.731; a DeiT logs an empty list. In a run this
# short the gates can barely move: AdamW moves a parameter by roughly the learning rate per step, this run's 312
# rates add up to 0.16, and σ's slope at λ = 1 is σ(1)(1 − σ(1)) ≈ 0.2: σ(λ) can travel about 0.03.

# %%
# NBVAL_IGNORE_OUTPUT
from convit_edu.optimisation import learning_rate_sum

assert all(len(r["gates"]) == 5 for r in rows["ConViT"])  # one mean gate per GPSA layer
assert all(r["gates"] == [] for r in rows["DeiT"])
sigma_slope = math.exp(-1) / (1 + math.exp(-1)) ** 2  # σ'(1) = σ(1)(1 − σ(1))
lr_sum = learning_rate_sum(convit_cfg, steps_per_epoch)
moved = max(abs(g - 1 / (1 + math.exp(-1))) for r in rows["ConViT"] for g in r["gates"])
print(f"σ'(1) = {sigma_slope:.2f}; {convit_cfg.epochs * steps_per_epoch} rates sum to {lr_sum:.3f}: σ(λ) may move "
      f"about {sigma_slope * lr_sum:.3f}; the most any layer's mean gate moved: {moved:.3f}")
assert moved <= sigma_slope * lr_sum  # no mean gate moved further than its learning rates typically allow


# %% [markdown]
# ## Exercises
#
# **1. Steps and rates.** Without the log, compute `steps`, the ConViT run's optimiser steps, from `convit_cfg`
# (`fraction`, `batch_size`, `epochs`), `IMAGES_PER_CLASS` and `CLASSES`. Then `peak`: with less memory you would
# run the recipe with `batch_size=32` and `accum_steps=4` (four micro-batches add their gradients before each
# step); what peak rate does the optimiser reach with the ConViT's `lr`?

# %%
steps, peak = ..., ...  # your answer: steps, peak = ..., ...

# %%
def check_steps(answer: int) -> None:
    want = rows["ConViT"][-1]["step"]
    check_answer(isinstance(answer, int), "a number of steps is a whole number: `/` divides into a float, which "
                 "counts a part of a batch as a part of a step")
    check_answer(answer != info["ConViT"]["steps_per_epoch"], "you have the steps of one epoch: the run has several")
    check_answer(answer == want, "an optimiser step needs a full batch: what happens to the images of an epoch "
                 "that do not fill the last one?")


def check_peak(answer: float) -> None:
    check_answer(not math.isclose(answer, convit_cfg.lr), "lr is the rate for a batch of 512, not the rate used")
    check_answer(not math.isclose(answer, scaled_lr(convit_cfg.lr, 32)), "the rate follows the batch of one "
                 "optimiser step, and one step here averages more than 32 images")
    check_answer(math.isclose(answer, scaled_lr(convit_cfg.lr, 32 * 4)), "lr is the rate for a batch of 512: "
                 "multiply it by the images of one optimiser step over 512, not by the number of micro-batches")


grade("steps, peak", (steps, peak), lambda answer: (check_steps(answer[0]), check_peak(answer[1])))
run_images, batch = math.floor(convit_cfg.fraction * IMAGES_PER_CLASS) * CLASSES, convit_cfg.batch_size
demonstrate(check_steps, {"images / batch × epochs, with `/`": run_images / batch * convit_cfg.epochs,
                          "one epoch's steps": run_images // batch,
                          "the last, incomplete batch counted": math.ceil(run_images / batch) * convit_cfg.epochs})
demonstrate(check_peak, {"lr as given": convit_cfg.lr, "scaled to the micro-batch of 32": convit_cfg.lr * 32 / 512,
                         "lr × accum_steps": convit_cfg.lr * 4})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(steps, peak):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    steps = (math.floor(convit_cfg.fraction * IMAGES_PER_CLASS) * CLASSES // convit_cfg.batch_size) * convit_cfg.epochs
    peak = convit_cfg.lr * 32 * 4 / 512  # the global batch is 32 × 4 = 128 images per optimiser step
    grade("steps, peak", (steps, peak), lambda answer: (check_steps(answer[0]), check_peak(answer[1])))

# %% [markdown]
# **2. The schedule by hand.** Write `lr_at(step)`: the learning rate of the ConViT run after `step` optimiser
# steps (0 to the last), from the config and `info["ConViT"]` (its `scaled_lr` and `steps_per_epoch`) — a linear
# warm-up from `warmup_lr` to the peak over `warmup_epochs` epochs of steps, then
# η = η_min + ½(η_peak − η_min)(1 + cos π·(t − t_w)/(T − t_w)). The check compares it with the package's
# `deit_lr` at every step and with the rates in the run's log.

# %%
lr_at = ...  # your answer: def lr_at(step): ...

# %%
def check_lr_at(fn) -> None:
    cfg, per_epoch = convit_cfg, info["ConViT"]["steps_per_epoch"]
    total, warmup = per_epoch * cfg.epochs, round(cfg.warmup_epochs * per_epoch)
    want = [deit_lr(t, total, warmup, info["ConViT"]["scaled_lr"], cfg.min_lr, cfg.warmup_lr) for t in range(total + 1)]
    got = [fn(t) for t in range(total + 1)]
    assert all(math.isclose(want[r["step"]], r["lr"], rel_tol=1e-9) for r in rows["ConViT"])  # deit_lr is the log's
    check_answer(math.isclose(got[0], want[0]), "the first step runs at warmup_lr, not at the peak")
    check_answer(math.isclose(got[warmup], want[warmup]), "the warm-up ends at the peak after warmup_epochs × "
                 "steps per epoch steps: count it in steps, not epochs")
    check_answer(math.isclose(got[-1], want[-1]), "after the last step the cosine has come down to min_lr, not to 0")
    check_answer(all(math.isclose(g, w, rel_tol=1e-9) for g, w in zip(got, want)), "the landmarks are right, "
                 "the path between them is not: a linear rise, then half a cosine period")


def a_schedule(warmup_steps: int | None = None, floor: float | None = None, decay: str = "cosine"):
    """The ConViT run's schedule with the slips asked for: the wrong answers the check is shown on."""
    cfg, per_epoch = convit_cfg, info["ConViT"]["steps_per_epoch"]
    top, total = info["ConViT"]["scaled_lr"], per_epoch * cfg.epochs
    warmup = round(cfg.warmup_epochs * per_epoch) if warmup_steps is None else warmup_steps
    low = cfg.min_lr if floor is None else floor

    def rate(step: int) -> float:
        if step < warmup:
            return cfg.warmup_lr + (top - cfg.warmup_lr) * step / warmup
        done = (step - warmup) / (total - warmup)
        return low + (top - low) * ((1 + math.cos(math.pi * done)) / 2 if decay == "cosine" else 1 - done)
    return rate


grade("lr_at", lr_at, check_lr_at)
demonstrate(check_lr_at, {"no warm-up": a_schedule(warmup_steps=0),
                          "the warm-up counted in epochs, not steps": a_schedule(warmup_steps=convit_cfg.warmup_epochs),
                          "the cosine down to 0": a_schedule(floor=0.0), "a linear decay": a_schedule(decay="linear")})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(lr_at):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def lr_at(step: int) -> float:
        cfg, per_epoch = convit_cfg, info["ConViT"]["steps_per_epoch"]
        peak, total, warmup = info["ConViT"]["scaled_lr"], per_epoch * cfg.epochs, round(cfg.warmup_epochs * per_epoch)
        if step < warmup:
            return cfg.warmup_lr + (peak - cfg.warmup_lr) * step / warmup
        return cfg.min_lr + 0.5 * (peak - cfg.min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    grade("lr_at", lr_at, check_lr_at)

# %% [markdown]
# **3. What `best.pt` holds.** `best.pt` is an epoch's `last.pt`, kept after its evaluation whenever validation
# top-1 is strictly higher than at every earlier epoch. From `log.jsonl`'s rows alone, which epoch's weights does the
# ConViT's `best.pt` hold? Set `best_epoch` (from 1, as in the log); the check opens the checkpoint.

# %%
best_epoch = ...  # your answer: best_epoch = ...

# %%
def check_best_epoch(answer: int) -> None:
    best = read_checkpoint(out["ConViT"] / "best.pt")
    assert read_checkpoint(out["ConViT"] / "last.pt")["best_top1"] == max(r["val_top1"] for r in rows["ConViT"])
    check_answer(answer != best["epoch"] - 1, "the log's epochs count from 1: epoch 1 is the first row")
    check_answer(answer == best["epoch"], "best_epoch is the epoch (1 to N) of the highest val_top1, not that score, "
                 "and the first epoch to reach it: a later tie does not rewrite best.pt")


grade("best_epoch", best_epoch, check_best_epoch)
demonstrate(check_best_epoch, {
    "a row's index, counted from 0": max(range(len(rows["ConViT"])), key=lambda i: rows["ConViT"][i]["val_top1"]),
    "the best score, not its epoch": max(r["val_top1"] for r in rows["ConViT"])})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(best_epoch):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    best_epoch = max(rows["ConViT"], key=lambda r: r["val_top1"])["epoch"]  # max keeps the first of equal scores
    grade("best_epoch", best_epoch, check_best_epoch)
