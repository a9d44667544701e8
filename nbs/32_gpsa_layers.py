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
# # Fig. 8: a head start, and how many GPSA layers
#
# Chapter 32_first_training_run trained a small ConViT and DeiT for 312 steps with the production loop and read what
# the runs wrote. Too short to see the paper's head start, or a gate move: this chapter takes up the paper's Fig. 8,
# with longer committed runs (Fig. 8b: is the GPSA layers' boost largest early?) and a small experiment of our own
# (Fig. 8a: does top-1 rise with the number of GPSA layers?). It builds on two yardsticks of that chapter: how far
# apart two seeds of one recipe land, and how far a gate σ(λ) can move in a run.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
import inspect
import json
import math
import re
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchvision import datasets as tv_datasets, transforms

from convit_edu.checks import check_answer, demonstrate, grade, reveal
from convit_edu.config import TrainConfig
from convit_edu.optimisation import learning_rate_sum
from convit_edu.photographs import tiny_imagenet
from convit_edu.schedule import deit_lr, scaled_lr
from convit_edu.teaching_loop import fit
from convit_edu.zoo import create_model, model_config

# %% [markdown]
# ## Two yardsticks from the first run
#
# **Two seeds of one recipe.** Chapter 32_first_training_run measured, on the course's experiment grid (four seeds
# of each of its models, scored on 500 dev images), how far apart two trainings of one recipe land: the difference of
# their final dev top-1s spreads by about 2.3 points (√2 × the seeds' pooled standard deviation), and beyond twice
# that rarely. We read it from that chapter's committed notebook, as it printed it.
#
# **The room a gate has.** AdamW moves a parameter by roughly the learning rate per step, so over a run λ can
# travel about the sum of the run's learning rates (`learning_rate_sum`, chapter 23), and σ(λ), whose slope at the
# initial λ = 1 is σ'(1) = σ(1)(1 − σ(1)) ≈ 0.2, about σ'(1) times that.

# %%
first_run = "".join(text for cell in json.loads(Path("32_first_training_run.ipynb").read_text())["cells"]
                    for output in cell.get("outputs", []) for text in output.get("text", []))
two_runs = float(re.search(r"of two runs' difference ([\d.]+)$", first_run, re.M).group(1))
sigma_slope = math.exp(-1) / (1 + math.exp(-1)) ** 2  # σ'(1) = σ(1)(1 − σ(1))
print(f"two runs of one recipe differ by about {two_runs:.1f} points (chapter 32_first_training_run); "
      f"σ'(1) = {sigma_slope:.2f}")
assert 0 < two_runs < 5 and abs(sigma_slope - 0.2) < 0.01

# %% [markdown]
# ## Longer runs: a head start? (Fig. 8b)
#
# In the paper's Fig. 8b the GPSA layers' boost is largest early: after 20 of 300 epochs, 9 GPSA layers almost
# double the top-1 of none, a "head start" from the convolutional initialization. Runs long enough to look for it
# do not fit in a notebook, so we read committed ones, chapter 39's pilots: a ConViT and a DeiT of the experiments'
# shape (width 72, 9 heads, 6 blocks, the ConViT's first 4 GPSA) on 48-px images in 4-px patches (a 12 × 12 grid),
# with chapter 35's light recipe (crops, flips, label smoothing), for the optimiser steps of 60 000 images at batch
# 32, on 350 training images (f = 0.1) or 3 500 (f = 1), scored along the way on the 500 dev images; one seed each.

# %%
PILOTS = {"f = 0.1": Path("results/pilots/grid12"), "f = 1": Path("results/pilots/grid12-f1")}
folders = {(f, name): PILOTS[f] / f"{name.lower()}_f{f[4:]}_s0" for f in PILOTS for name in ("DeiT", "ConViT")}
log = {k: [json.loads(line) for line in (d / "log.jsonl").read_text().splitlines()] for k, d in folders.items()}
for (f, name), rs in log.items():
    print(f"{name:>6} {f:<7} dev top-1 at steps {rs[0]['step']}..{rs[-1]['step']}: {[r['val_top1'] for r in rs]}")

# %%
# NBVAL_IGNORE_OUTPUT
fig, axes = plt.subplots(1, 3, figsize=(12, 3), dpi=80)
for ax, f in zip(axes, PILOTS):
    for name in ("DeiT", "ConViT"):
        ax.plot([r["step"] for r in log[f, name]], [r["val_top1"] for r in log[f, name]], "o-", ms=3, label=name)
    ax.set(title=f, xlabel="optimiser steps", ylabel="dev top-1 (%)")
    ax.legend(fontsize=8)
for f, style in zip(PILOTS, ("-", "--")):
    for layer in range(4):
        axes[2].plot([0] + [r["step"] for r in log[f, "ConViT"]], [1 / (1 + math.exp(-1))] + [r["gates"][layer]
                     for r in log[f, "ConViT"]], style, color=f"C{layer}", label=f"layer {layer + 1}, {f}")
axes[2].set(title="ConViT: mean σ(λ) per GPSA layer", xlabel="optimiser steps")
axes[2].legend(fontsize=6, ncol=2)
fig.tight_layout()
plt.show()

# %% [markdown]
# **What the pilots show.** A head start, small and brief: at the first evaluation (about 110 steps, 6 % of each run)
# the ConViT leads by 3.4 points at f = 0.1 (27.0 % against 23.6 %) and by 3.6 at f = 1 (27.4 against 23.8), 14 and 15 %
# more, where the paper's 9 GPSA layers almost double the top-1. With 3 500 images the lead is gone by the third
# evaluation (step 327); with 350 the ConViT leads at most evaluations. One seed per run: both early leads are within
# two of the spread two seeds of one model show (2.3 points, above), so this is consistent with the paper's head start,
# not a test of it (chapter 38 reads four seeds on two sets of classes, and finds the early lead within noise). The
# gates, flat in chapter 32_first_training_run's short runs, now move the paper's way: every GPSA layer's mean gate
# falls from 0.731, to 0.707–0.717, by at most 0.024 — well under the 0.18 that the run's learning rates (summing to
# 0.93) would allow.

# %%
gap = {f: [c["val_top1"] - d["val_top1"] for c, d in zip(log[f, "ConViT"], log[f, "DeiT"])] for f in PILOTS}
first = {f: (log[f, "ConViT"][0]["val_top1"], log[f, "DeiT"][0]["val_top1"]) for f in PILOTS}
pilot_run = json.loads((folders["f = 0.1", "ConViT"] / "run.json").read_text())
ends = [g for f in PILOTS for g in log[f, "ConViT"][-1]["gates"]]
pilot_lr_sum = learning_rate_sum(TrainConfig(**pilot_run["config"]), pilot_run["steps_per_epoch"])
fall, allowed = 1 / (1 + math.exp(-1)) - min(ends), sigma_slope * pilot_lr_sum
for f, (c, d) in first.items():
    print(f"{f}: first evaluation (step {log[f, 'ConViT'][0]['step']} of {log[f, 'ConViT'][-1]['step']}) ConViT {c} "
          f"against DeiT {d} % ({c - d:+.1f} points, {c / d - 1:+.0%}); ConViT ahead at {sum(g > 0 for g in gap[f])} of "
          f"{len(gap[f])} evaluations")
print(f"gates at the end {min(ends):.3f}-{max(ends):.3f}: fell by {fall:.3f} at most, of the {allowed:.2f} that a "
      f"learning-rate sum of {pilot_lr_sum:.2f} allows")
assert all(c - d > 0 for c, d in first.values()) and all(c - d < 2 * two_runs for c, d in first.values())
assert gap["f = 1"][2] < 0 < gap["f = 1"][1] and log["f = 1", "DeiT"][2]["step"] == 327  # gone at the third
assert sum(g > 0 for g in gap["f = 0.1"]) > len(gap["f = 0.1"]) / 2  # with 350 images: ahead at most evaluations
assert max(ends) < 1 / (1 + math.exp(-1)) and fall < allowed / 2  # every layer's mean gate fell, well inside its room

# %% [markdown]
# ## An experiment: how many GPSA layers? (Fig. 8a)
#
# In the paper's Fig. 8a (ConViT-S+, 300 epochs on 100 ImageNet classes) the final top-1 rises with the number of
# GPSA layers (0, 3, 6 or 9 of 12) and with the locality strength α. A CPU can ask the question in minutes, much
# smaller: a depth-6 model with k = 0, 1, 3 or 5 GPSA layers (0 is the DeiT; 5 the most, the class token joining
# before the last block), width 48 in 4 heads, on the photographs shrunk to 32 px in 4-px patches (8 × 8), trained
# with chapter 11's `fit` on the first 100 training images per class of the first 10 classes (chapter
# 32_first_training_run's; in memory, no augmentation), 10 epochs at batch 64 (150 steps, peak rate 10⁻³), scored on
# their 500 dev images each epoch; one seed. The full run writes `results/gpsa-layers/sweep.json` (committed); FAST
# mode trains 2 epochs on a few images of 2 classes and leaves it alone.
#
# **1. The sweep's models.** Write `gpsa_model(k)`, the model with k GPSA layers: `create_model` with `SWEEP_SIZE`
# and `num_classes=CLASSES`, the DeiT baseline (`deit_tiny`) for k = 0, a `convit_tiny` otherwise.

# %%
SWEEP_SIZE, LAYERS = dict(img_size=32, patch_size=4, embed_dim=48, num_heads=4, depth=6), (0, 1, 3, 5)
CLASSES = 2 if FAST else 10  # the first classes of the course's photographs, as in chapter 32_first_training_run


# %%
gpsa_model = ...  # your answer: def gpsa_model(k): ...

# %%
def check_gpsa_model(fn) -> None:
    for k in LAYERS:
        model = fn(k)
        check_answer(len(model.gates()) == k, f"gpsa_model({k}) has {len(model.gates())} GPSA layers: "
                     "local_up_to_layer is their number (blocks 0 to k − 1), not the last one's index")
        wrong = {key: getattr(model.config, key) for key, size in {**SWEEP_SIZE, "num_classes": CLASSES}.items()
                 if getattr(model.config, key) != size}
        check_answer(not wrong, f"gpsa_model({k}) has {wrong}: pass SWEEP_SIZE and num_classes=CLASSES (the zoo's "
                     "sizes are ImageNet's)")
        want = model_config("convit_tiny", **SWEEP_SIZE, num_classes=CLASSES, local_up_to_layer=k) if k else \
            model_config("deit_tiny", **SWEEP_SIZE, num_classes=CLASSES)
        check_answer(model.config == want, "the baseline (k = 0) is the DeiT itself, deit_tiny (query-key-value "
                     "biases, a positional slot for the class token), not a convit_tiny without GPSA layers")


def a_sweep_model(convit_for_0: bool = False, last_index: bool = False, classes: int | None = CLASSES):
    """gpsa_model with the slips asked for: the wrong answers the check is shown on."""
    def model(k: int) -> torch.nn.Module:
        extra = {} if classes is None else {"num_classes": classes}
        if k == 0 and not convit_for_0:
            return create_model("deit_tiny", **SWEEP_SIZE, **extra)
        return create_model("convit_tiny", **SWEEP_SIZE, **extra, local_up_to_layer=k - last_index)
    return model


grade("gpsa_model", gpsa_model, check_gpsa_model)
demonstrate(check_gpsa_model, {"local_up_to_layer = k − 1, the last GPSA block's index": a_sweep_model(last_index=True),
                               "num_classes left out": a_sweep_model(classes=None),
                               "a ConViT without GPSA layers for k = 0": a_sweep_model(convit_for_0=True)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(gpsa_model):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def gpsa_model(k: int) -> torch.nn.Module:
        if k == 0:
            return create_model("deit_tiny", **SWEEP_SIZE, num_classes=CLASSES)
        return create_model("convit_tiny", **SWEEP_SIZE, num_classes=CLASSES, local_up_to_layer=k)

    grade("gpsa_model", gpsa_model, check_gpsa_model)

# %%
# NBVAL_IGNORE_OUTPUT
PER_CLASS, EPOCHS, BATCH = (8, 2, 8) if FAST else (100, 10, 64)
data = {"data": "imagefolder", "data_root": str(tiny_imagenet("../data"))}
shrink = transforms.Compose([transforms.Resize(32), transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])


def first_images(split: str, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``per_class`` images of each class of ``split``, shrunk to 32 px."""
    folder = tv_datasets.ImageFolder(Path(data["data_root"]) / split, shrink)
    keep = [i for c in range(CLASSES) for i in [j for j, t in enumerate(folder.targets) if t == c][:per_class]]
    return torch.stack([folder[i][0] for i in keep]), torch.tensor([folder.targets[i] for i in keep])


def sweep_model(k: int) -> torch.nn.Module:  # exercise 1's model: k GPSA layers, the DeiT itself for k = 0
    name, extra = ("deit_tiny", {}) if k == 0 else ("convit_tiny", {"local_up_to_layer": k})
    return create_model(name, **SWEEP_SIZE, num_classes=CLASSES, **extra)


torch.set_num_threads(1)  # models this small gain little from a second core, and lose much when it is busy
train_xy, dev_xy = first_images("train", PER_CLASS), first_images("val", 10 if FAST else 50)
sweep = {}
for k in LAYERS:
    print(f"{k} GPSA layers")
    torch.manual_seed(0)
    model = sweep_model(k)
    loader = DataLoader(TensorDataset(*train_xy), batch_size=BATCH, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(0))
    history = fit(model, loader, DataLoader(TensorDataset(*dev_xy), batch_size=250), EPOCHS, lr=8e-3, warmup_epochs=1)
    sweep[k] = {"dev_top1": [r["val_top1"] for r in history], "gates": history[-1]["gates"]}
if not FAST:  # only the full run writes the committed result
    Path("results/gpsa-layers").mkdir(exist_ok=True)
    Path("results/gpsa-layers/sweep.json").write_text(json.dumps({
        "what": "chapter 32_gpsa_layers: dev top-1 per epoch of a depth-6 model with k GPSA layers "
                "(Fig. 8a, notebook scale)",
        "model": SWEEP_SIZE, "train_images": len(train_xy[1]), "dev_images": len(dev_xy[1]), "epochs": EPOCHS,
        "batch_size": BATCH, "steps": EPOCHS * len(loader), "lr": 8e-3, "warmup_epochs": 1, "augmentation": None,
        "seed": 0, "data": data["data"], "runs": {str(k): v for k, v in sweep.items()}}, indent=1) + "\n")

# %% [markdown]
# **What the sweep shows, and what it cannot.** After 150 steps the four models end within 2.8 points of each
# other (k = 0, 1, 3, 5: 35.0, 37.6, 35.4, 34.8 %), top-1 does not rise with k, and after the first epoch all four
# are within 3 points. One seed each: every gap is within two of the spread two seeds of one model show (2.3 points
# on the grid's 500 dev images, above), and the gates stayed within 0.002 of σ(1). So this neither confirms nor
# contradicts Fig. 8a (300 epochs on 100 ImageNet classes): at this budget one seed cannot see an effect of a few
# points. To look for one: train longer, repeat each k over seeds, score on more images, vary α too.

# %%
committed = json.loads(Path("results/gpsa-layers/sweep.json").read_text())  # the full run's, in both modes
final, epoch1 = ({int(k): r["dev_top1"][i] for k, r in committed["runs"].items()} for i in (-1, 0))
print(f"{committed['train_images']} training images, {committed['dev_images']} dev images, {committed['steps']} steps; "
      f"dev top-1 at the end {final}, after the first epoch {epoch1}")
assert max(final.values()) - min(final.values()) < 2 * two_runs and final[max(final)] <= final[0] + two_runs
assert max(epoch1.values()) - min(epoch1.values()) <= 3  # all four within 3 points after the first epoch
assert all(abs(g - 1 / (1 + math.exp(-1))) < 0.002 for r in committed["runs"].values() for g in r["gates"])

# %% [markdown]
# **2. Room to move.** The sweep's gates stayed within 0.002 of σ(1): had they no room, or did they not use it? Compute
# `room`, how far σ(λ) could travel in the sweep: σ'(1) (`sigma_slope`) times the sum of the learning rates of its
# steps. Read the run from its record `committed` (its `steps`, `epochs`, `batch_size`, `lr` and `warmup_epochs`);
# `fit` sets each step's rate with `deit_lr` (chapter 11), from its `min_lr` of 10⁻⁵ and `warmup_lr` of 10⁻⁶.

# %%
room = ...  # your answer: room = ...

# %%
def sweep_rates(base_lr: float) -> list[float]:
    """The learning rate of each step of the committed sweep, as `fit` sets it, from the base rate ``base_lr``."""
    steps, defaults = committed["steps"], inspect.signature(fit).parameters
    per_epoch, peak = steps // committed["epochs"], scaled_lr(base_lr, committed["batch_size"])
    warmup = round(committed["warmup_epochs"] * per_epoch)
    return [deit_lr(t, steps, warmup, peak, defaults["min_lr"].default, defaults["warmup_lr"].default)
            for t in range(steps)]


def check_room(answer: float) -> None:
    rates, unscaled = sweep_rates(committed["lr"]), sweep_rates(committed["lr"] * 512 / committed["batch_size"])
    check_answer(not math.isclose(answer, sum(rates), rel_tol=0.02), "that is how far λ may travel: σ(λ) moves "
                 "σ'(1) times as far")
    check_answer(not math.isclose(answer, sigma_slope * sum(unscaled), rel_tol=0.02), "lr is the rate for a batch "
                 "of 512: scale it to the sweep's batch")
    check_answer(math.isclose(answer, sigma_slope * sum(rates), rel_tol=0.02), "σ'(1) times the sum of every step's "
                 "rate as fit's schedule sets it (a warm-up, then half a cosine), not the peak rate at every step")


grade("room", room, check_room)
base, batch, steps = committed["lr"], committed["batch_size"], committed["steps"]
demonstrate(check_room, {"the rates' sum alone": sum(sweep_rates(base)),
                         "the base lr, unscaled": sigma_slope * sum(sweep_rates(base * 512 / batch)),
                         "the peak rate at every step": sigma_slope * steps * scaled_lr(base, batch)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(room):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    steps, per_epoch = committed["steps"], committed["steps"] // committed["epochs"]
    peak = committed["lr"] * committed["batch_size"] / 512
    room = sigma_slope * sum(deit_lr(t, steps, committed["warmup_epochs"] * per_epoch, peak, 1e-5, 1e-6)
                             for t in range(steps))
    grade("room", room, check_room)
