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
# # A first `fit`: a training loop, line by line
#
# Chapters 01-10 built the ConViT and its DeiT twin and checked them at initialisation. To watch them learn we
# need the **data** (photographs in batches), the **models** (from the zoo), an **optimiser** with DeiT's
# learning-rate schedule and an **evaluation**. We write each in a few lines and check it, put them together in
# `fit`, a loop of a few dozen lines that reads top to bottom, and train a small ConViT and a DeiT with it, side
# by side, on 10 classes of real photographs: a few minutes on a laptop CPU. Its schedule and epoch are the package's
# versions of your `my_lr` and `my_epoch` (chapter 11_build_your_loop).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp teaching_loop
# A minimal training loop: AdamW with DeiT's parameter groups and learning-rate schedule, evaluation, and `fit`.

# %%
#| export
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from convit_edu.checks import positive_int
from convit_edu.models import VisionTransformer

# %%
import time

import matplotlib.pyplot as plt
from torch.utils.data import Subset
from torchvision import datasets, transforms

from convit_edu.checks import expect_error
from convit_edu.zoo import create_model

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)  # models this small gain little from a second core, and lose much when it is busy
_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. The data
#
# Tiny ImageNet is a 64 × 64-pixel, 200-class subset of ImageNet; the course uses every other class, 500 training
# and 50 validation photographs each, in ImageNet's folder layout (`train/<wnid>/<file>.JPEG`, `val/…`,
# `classes.txt`). `tiny_imagenet` puts them in `data/` once (downloading Tiny ImageNet's public zip the first time,
# 248 MB, as `convit-edu data tiny-imagenet` does; chapter 00_photographs shows how) and finds them there after;
# without them and without a network it stops and says where they come from. We train on the first 10 classes (sorted
# wnids).

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now)
from convit_edu.photographs import tiny_imagenet

root, CLASSES = tiny_imagenet("../data"), 10

# %% [markdown]
# `torchvision.datasets.ImageFolder` reads this layout as it reads ImageNet: a class per folder, labels in sorted
# folder order, every image converted to RGB (a few of these JPEGs are greyscale). The transforms make a
# normalised (3, 64, 64) tensor; in training a random crop of the image padded by 4 pixels and a random flip
# show a slightly different image at every epoch, the lightest of augmentations (DeiT's is the engineering
# track's). We keep the images of the first 10 labels, then look: the first image of each class as the model sees
# it in training.

# %%
normalize = transforms.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))  # ImageNet's
train_tf = transforms.Compose([transforms.RandomCrop(64, padding=4), transforms.RandomHorizontalFlip(),
                               transforms.ToTensor(), normalize])
val_tf = transforms.Compose([transforms.ToTensor(), normalize])
train_all, val_all = datasets.ImageFolder(root / "train", train_tf), datasets.ImageFolder(root / "val", val_tf)
train_set, val_set = (Subset(ds, [i for i, t in enumerate(ds.targets) if t < CLASSES]) for ds in (train_all, val_all))
names = dict(line.split("\t") for line in (root / "classes.txt").read_text().splitlines())
class_names = [names[wnid].split(",")[0] for wnid in train_all.classes[:CLASSES]]

image, label = train_set[0]
assert image.shape == (3, 64, 64) and image.dtype == torch.float32 and len(train_set) == 5000 and len(val_set) == 500
assert label == 0 and train_all.class_to_idx == val_all.class_to_idx  # a label means one class in both splits
print(f"an image: {tuple(image.shape)} {image.dtype}; {len(train_set)} training, {len(val_set)} validation images")

# %%
mean, std = torch.tensor(normalize.mean).view(3, 1, 1), torch.tensor(normalize.std).view(3, 1, 1)
fig, axes = plt.subplots(1, CLASSES, figsize=(11, 1.6), dpi=80)
for c, ax in enumerate(axes):
    ax.imshow((train_set[500 * c][0] * std + mean).clamp(0, 1).permute(1, 2, 0))
    ax.set_title(class_names[c][:12], fontsize=7)
    ax.axis("off")
plt.show()

# %% [markdown]
# A `DataLoader` draws batches, for training shuffled and without the last incomplete one (every step averages
# 64 images), in an order its own random generator fixes: both models will see the same images in the same order.
# FAST mode (CI) keeps every 20th training and every 5th validation image. The checks read the loader's batches of
# indices (its `batch_sampler`), which cost nothing to draw: one epoch uses every image at most once, in full
# batches, and the same seed gives the same order while another seed gives another.

# %%
BATCH = 64
if FAST:
    train_set, val_set = Subset(train_set, range(0, 5000, 20)), Subset(val_set, range(0, 500, 5))
val_loader = DataLoader(val_set, batch_size=250)


def train_loader_seeded(seed: int) -> DataLoader:
    """The training batches, in an order fixed by `seed`: both models will see the same images in the same order."""
    return DataLoader(train_set, batch_size=BATCH, shuffle=True, drop_last=True,
                      generator=torch.Generator().manual_seed(seed))


images, labels = next(iter(train_loader_seeded(0)))
assert images.shape == (BATCH, 3, 64, 64) and labels.shape == (BATCH,) and labels.dtype == torch.int64
epoch = list(train_loader_seeded(0).batch_sampler)  # the indices of one epoch's batches
used = [i for batch in epoch for i in batch]
assert {len(batch) for batch in epoch} == {BATCH} and len(set(used)) == len(used) > len(train_set) - BATCH
assert epoch == list(train_loader_seeded(0).batch_sampler) != list(train_loader_seeded(1).batch_sampler)
print(f"a batch: images {tuple(images.shape)}, labels {tuple(labels.shape)}; an epoch: full batches of {BATCH}, each "
      f"image at most once, fewer than {BATCH} left out; the same order for the same seed, another for another")

# %% [markdown]
# ## 2. The models
#
# Both come from the zoo (chapter 10), shrunk to the task: 64-pixel images in 8-pixel patches (8 × 8 tokens),
# width 96 in 4 heads, 6 blocks, 10 classes. The ConViT's first 5 blocks are GPSA and its class token joins
# before the last (Fig. 4); the DeiT has self-attention everywhere and the same 4 heads.

# %%
SIZE = dict(img_size=64, patch_size=8, embed_dim=96, num_heads=4, depth=6, num_classes=CLASSES)


def make_models(seed: int = 0) -> dict[str, VisionTransformer]:
    """A small ConViT and DeiT of the same width, each initialized from `seed`."""
    _ = torch.manual_seed(seed)
    convit = create_model("convit_tiny", **SIZE, local_up_to_layer=5)
    _ = torch.manual_seed(seed)
    return {"ConViT": convit, "DeiT": create_model("deit_tiny", **SIZE)}


models = make_models()
for model in models.values():
    assert model(images[:2]).shape == (2, CLASSES)
params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
# ConViT: + v_pos (3 weights and a bias per head) and λ (one per head) in each of its 5 GPSA layers of 4 heads;
# DeiT: + qkv biases (3 × 96) in each of its 6 blocks and a position slot (96) for its class token
assert params["ConViT"] - params["DeiT"] == 5 * (4 * 3 + 4 + 4) - 6 * 3 * 96 - 96 == -1724
print(f"ConViT {params['ConViT']:,} and DeiT {params['DeiT']:,} parameters: {params['ConViT'] - params['DeiT']:+,}")

# %% [markdown]
# ## 3. The optimiser: AdamW and DeiT's schedule
#
# The paper trains with DeiT's recipe (Sec. 3; Touvron et al. 2020): AdamW, weight decay 0.05, a base rate of
# 5·10⁻⁴ for a batch of 512, 5 warm-up epochs, then a cosine to 10⁻⁵. **Weight decay** pulls weights towards 0,
# the weight matrices only: biases, LayerNorm gains, the gates λ (all 1-D), the position embedding and class
# token (`model.no_weight_decay()`) keep their scale; shrinking a gain or a gate changes the architecture.

# %%
#| export
def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups (DeiT's recipe): weight matrices decayed; 1-D parameters and `model.no_weight_decay()` not."""
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# %% [markdown]
# Counted by hand, the ConViT decays the patch embedding, 6 matrices per GPSA block (`qk`, `v`, the projection,
# `pos_proj`, the MLP's two), 4 in its SA block (`qkv`, the projection, the MLP's two) and the head: 36.

# %%
groups = param_groups(models["ConViT"], 0.05)
decayed = {id(p) for p in groups[0]["params"]}
named = dict(models["ConViT"].named_parameters())
assert len(groups[0]["params"]) == 1 + 5 * 6 + 4 + 1 == 36 and groups[0]["weight_decay"] == 0.05
assert id(named["patch_embed.proj.weight"]) in decayed and id(named["blocks.0.attn.pos_proj.weight"]) in decayed
assert not decayed & {id(named[n]) for n in ("pos_embed", "cls_token", "blocks.0.attn.gating_param", "norm.weight")}
print(f"{len(groups[0]['params'])} tensors decayed, {len(groups[1]['params'])} not (biases, LayerNorm gains, "
      "gates λ, pos_embed, cls_token)")

# %% [markdown]
# **The learning rate** η (your `my_lr`) is set before every optimiser step t (0, 1, …, T − 1): a linear warm-up
# from `warmup_lr` to the peak over the first t_w steps, then half a cosine period down to `min_lr` at step T,
#
# $$\eta(t) = \eta_\text{warmup} + (\eta_\text{peak} - \eta_\text{warmup})\,\frac{t}{t_w} \quad (t < t_w), \qquad
# \eta(t) = \eta_\min + \tfrac12(\eta_\text{peak}-\eta_\min)\Bigl(1+\cos\pi\,\tfrac{t-t_w}{T-t_w}\Bigr)
# \quad (t \ge t_w).$$
#
# The peak follows DeiT's linear scaling rule (Goyal et al. 2017), η_peak = `lr` × batch / 512: k steps of a
# batch B move the weights about as far as one step of a batch kB at k times the rate.

# %%
#| export schedule
import math


def scaled_lr(base_lr: float, global_batch: int) -> float:
    """DeiT's linear scaling rule: the peak learning rate is `base_lr` × `global_batch` / 512."""
    return base_lr * global_batch / 512


def deit_lr(step: int, total_steps: int, warmup_steps: int, peak_lr: float, min_lr: float, warmup_lr: float) -> float:
    """DeiT's schedule at optimiser step `step` (0-based; DeiT's code sets it once per epoch): linear warm-up from
    `warmup_lr` to `peak_lr` over `warmup_steps`, then half a cosine to `min_lr` at `total_steps` (and after)."""
    if step < warmup_steps:
        return warmup_lr + (peak_lr - warmup_lr) * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr + 0.5 * (peak_lr - min_lr) * (1 + math.cos(math.pi * progress))


# %% [markdown]
# Checked at landmarks worked out by hand (T = 100, t_w = 10, peak 10⁻³, `min_lr` 10⁻⁵, `warmup_lr` 10⁻⁶):
# halfway through the warm-up (t = 5) and through the cosine (t = 55) the rate is halfway between its ends.

# %%
landmarks = dict(total_steps=100, warmup_steps=10, peak_lr=1e-3, min_lr=1e-5, warmup_lr=1e-6)
for step, want in [(0, 1e-6), (5, 5.005e-4), (10, 1e-3), (55, 5.05e-4), (100, 1e-5), (120, 1e-5)]:
    assert math.isclose(deit_lr(step, **landmarks), want, rel_tol=1e-12), (step, deit_lr(step, **landmarks))
assert all(deit_lr(t, **landmarks) > deit_lr(t + 1, **landmarks) for t in range(10, 100))  # falls after the peak
print("warm-up 1e-6 → 1e-3 over 10 steps, cosine to 1e-5 at step 100: the landmarks hold")

# %% [markdown]
# ## 4. Evaluation
#
# `loss_and_accuracy` runs the model over a loader without gradients, in eval mode (no dropout or drop path),
# and returns the mean cross-entropy and the top-1 accuracy, in %, over every image. (The production loop's
# `evaluate`, chapter 25, does the same over many processes, with top-5 and the EMA in one pass.)

# %%
#| export
@torch.no_grad()
def loss_and_accuracy(model: nn.Module, loader: DataLoader) -> dict:
    """Mean cross-entropy (`loss`) and top-1 accuracy in % (`top1`) of `model` over `loader`'s images; the
    model's train/eval mode is restored afterwards."""
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for images, labels in loader:
        logits, labels = model(images.to(device)), labels.to(device)
        loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += (logits.argmax(dim=-1) == labels).sum().item()
        count += len(labels)
    model.train(was_training)
    return {"loss": loss_sum / count, "top1": 100 * correct / count}


# %% [markdown]
# First on a "model" whose predictions we choose: an identity layer, so the inputs *are* the logits. Three of four
# rows are right; a row's cross-entropy, −log softmax, is ln(1 + e⁻²) when right and ln(1 + e²) when wrong.

# %%
identity = nn.Linear(2, 2, bias=False)
nn.init.eye_(identity.weight)
logits, targets = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 1, 1, 1])
result = loss_and_accuracy(identity, [(logits[:2], targets[:2]), (logits[2:], targets[2:])])  # two batches
assert result["top1"] == 75.0
assert math.isclose(result["loss"], (3 * math.log(1 + math.exp(-2)) + math.log(1 + math.exp(2))) / 4, rel_tol=1e-6)
print(f"top-1 {result['top1']:.0f} %, loss {result['loss']:.3f}")

# %% [markdown]
# An untrained model's logits are small (its head starts at std 0.02): its loss is near ln 10, a uniform guess.

# %%
for name, model in models.items():
    assert abs(loss_and_accuracy(model, val_loader)["loss"] - math.log(CLASSES)) < 0.1, name
print(f"untrained: validation loss within 0.1 of ln {CLASSES} = {math.log(CLASSES):.2f}")

# %% [markdown]
# ## 5. `fit`
#
# Now the loop, the package's version of your `my_epoch` (whose check compared it with this `fit`). Before every
# step it sets the schedule's rate, computes the loss on a batch, back-propagates and lets AdamW update the weights.
# After every epoch it evaluates and records a row: the mean training loss, the validation loss and top-1, the next
# step's rate and, for a ConViT, the mean gate σ(λ) of each GPSA layer (Eq. 7; the model's `gate_means()`, chapter
# 09): 1 is positional, convolution-like attention, 0 pure content attention.

# %%
#| export
from convit_edu.schedule import deit_lr, scaled_lr  # the cells of section 3, exported to a module of their own


def fit(model: VisionTransformer, train_loader: DataLoader, val_loader: DataLoader, epochs: int, *,
        lr: float = 5e-4, weight_decay: float = 0.05, warmup_epochs: float = 5, min_lr: float = 1e-5,
        warmup_lr: float = 1e-6) -> list[dict]:
    """Train `model` with DeiT's optimiser (Touvron et al. 2020; the paper's Sec. 3): AdamW, weight decay on
    matrices only, peak rate `lr` × batch / 512, linear warm-up for `warmup_epochs`, cosine to `min_lr`, set at
    every step. Returns one row per epoch: epoch, train_loss, val_loss, val_top1, lr (the next step's) and gates
    (the mean σ(λ) of each GPSA layer; empty for a DeiT)."""
    positive_int("epochs", epochs)
    steps_per_epoch = len(train_loader)
    if steps_per_epoch == 0:
        raise ValueError("train_loader yields no batch: give it more images than batch_size, or drop_last=False")
    device = next(model.parameters()).device
    total_steps, warmup_steps = epochs * steps_per_epoch, round(warmup_epochs * steps_per_epoch)
    peak_lr = scaled_lr(lr, train_loader.batch_size)  # DeiT's linear scaling rule
    schedule = (total_steps, warmup_steps, peak_lr, min_lr, warmup_lr)
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=warmup_lr)
    step, history = 0, []
    for epoch in range(1, epochs + 1):
        model.train()
        losses = []
        for images, labels in train_loader:
            for group in optimizer.param_groups:
                group["lr"] = deit_lr(step, *schedule)
            loss = F.cross_entropy(model(images.to(device)), labels.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
        val = loss_and_accuracy(model, val_loader)
        history.append({"epoch": epoch, "train_loss": sum(losses) / len(losses), "val_loss": val["loss"],
                        "val_top1": val["top1"], "lr": deit_lr(step, *schedule),
                        "gates": model.gate_means()})
        print(f"epoch {epoch}/{epochs}: train loss {history[-1]['train_loss']:.3f}, val loss {val['loss']:.3f}, "
              f"val top-1 {val['top1']:.1f} %")
    return history


# %% [markdown]
# ## 6. Training a ConViT and a DeiT
#
# Both start from the same seed and see the same images in the same order, crops and flips. DeiT's base rate
# would give a peak of 6·10⁻⁵ at batch 64, too little for a few hundred steps: we take `lr=8e-3` (peak 10⁻³, DeiT's
# own at batch 1024) and 4 epochs of 78 steps, one of them warm-up. FAST mode trains 2 epochs of 3 steps. (The
# committed times come from an AMD EPYC with AVX2, 2 cores, one torch thread, nothing else running.)

# %%
# NBVAL_IGNORE_OUTPUT
FULL_EPOCHS, LR, WARMUP = 4, 8e-3, 1
EPOCHS, models, histories, seconds = (2 if FAST else FULL_EPOCHS), make_models(seed=0), {}, {}
for name, model in models.items():
    print(name)
    _ = torch.manual_seed(1)  # the same crops and flips for both
    t0 = time.perf_counter()
    histories[name] = fit(model, train_loader_seeded(0), val_loader, EPOCHS, lr=LR, warmup_epochs=WARMUP)
    seconds[name] = time.perf_counter() - t0
print(", ".join(f"{name} {s:.0f} s" for name, s in seconds.items()))
print("ConViT gates per epoch:", [" ".join(f"{g:.3f}" for g in row["gates"]) for row in histories["ConViT"]])

# %%
for name, history in histories.items():
    assert [row["epoch"] for row in history] == list(range(1, EPOCHS + 1))
    assert math.isclose(history[-1]["lr"], 1e-5)  # the cosine has run its course
assert [len(r["gates"]) for r in histories["ConViT"]] == [5] * EPOCHS and all(r["gates"] == [] for r in histories["DeiT"])
print("one row per epoch, last rate = min_lr = 1e-5, 5 gates per ConViT row, none per DeiT row")

# %%
fig, axes = plt.subplots(1, 3, figsize=(11, 3), dpi=80)
for name, history in histories.items():
    epochs = [row["epoch"] for row in history]
    line, = axes[0].plot(epochs, [row["train_loss"] for row in history], "--", label=f"{name} train")
    axes[0].plot(epochs, [row["val_loss"] for row in history], "o-", color=line.get_color(), label=f"{name} val")
    axes[1].plot(epochs, [row["val_top1"] for row in history], "o-", label=name)
for layer, gates in enumerate(zip(*[row["gates"] for row in histories["ConViT"]])):
    axes[2].plot(epochs, gates, "o-", label=f"GPSA layer {layer + 1}")
axes[1].axhline(100 / CLASSES, color="grey", ls=":", label="chance")
axes[2].axhline(1 / (1 + math.exp(-1)), color="grey", ls=":", label="at init, σ(1)")
for ax, ylabel in zip(axes, ["cross-entropy", "val top-1 (%)", "the ConViT's mean gates σ(λ)"]):
    ax.set(xlabel="epoch", ylabel=ylabel)
    ax.legend(fontsize=7)
fig.tight_layout()
plt.show()

# %% [markdown]
# **What the run shows** (checked below, in a full run on the real photographs): both losses fall and both models
# end far above chance (10 %): more than ten standard errors of a guess's top-1 on the 500 validation images.
#
# The gates barely move, as they should. AdamW moves a parameter by about the rate at each step when its gradient
# keeps its sign, and, for its default betas, by up to about 3 times the rate at worst ((1 − β1)/√(1 − β2) = 3.2,
# Kingma & Ba 2015, Sec. 2.1). This run's rates add up to 0.16, and σ's slope at λ = 1 is σ(1)(1 − σ(1)) ≈ 0.20
# (never more than 1/4). So a steady push at the full rate would move a gate σ(λ) by about 0.20 × 0.16 ≈ 0.03, and
# AdamW's worst case allows about 3.2 times that, 0.1. The run's gates stay within the first, smaller bound: their
# gradients do not keep their sign. The paper's gates move far more: over its 300 epochs on ImageNet, at rates
# that add up to hundreds of times this run's, the late GPSA layers' gates fall towards 0 (Fig. 6).
#
# **What it does not show:** which model is better. At 50 % the standard error of a top-1 measured on 500 images
# is √(0.5 · 0.5 / 500) ≈ 2.2 points: the evaluation alone blurs gaps of a few points, before one seed's luck.
# The paper's claims (the ConViT learns faster early on and beats a DeiT of its size, most when data is scarce)
# need several seeds per model; the experiment chapters set that up, with the production loop.

# %%
steps_per_epoch = 5000 // BATCH
lr_sum = sum(deit_lr(t, FULL_EPOCHS * steps_per_epoch, WARMUP * steps_per_epoch, LR * BATCH / 512, 1e-5, 1e-6)
             for t in range(FULL_EPOCHS * steps_per_epoch))
sigma_slope = math.exp(-1) / (1 + math.exp(-1)) ** 2
steady, worst = sigma_slope * lr_sum, sigma_slope * lr_sum * 0.1 / (1 - 0.999) ** 0.5  # AdamW's betas (0.9, 0.999)
chance, guess_se = 100 / CLASSES, 100 * (0.1 * 0.9 / 500) ** 0.5  # a guess's top-1 on 500 images, and its spread
if not FAST:  # the claims about the run are about the full run
    for name, history in histories.items():
        assert history[-1]["train_loss"] < history[0]["train_loss"] and history[-1]["val_loss"] < history[0]["val_loss"]
        assert history[-1]["val_top1"] > chance + 10 * guess_se, (name, history[-1]["val_top1"])
    drift = max(abs(g - 1 / (1 + math.exp(-1))) for row in histories["ConViT"] for g in row["gates"])
    assert drift < steady, drift
print(f"rates add up to {lr_sum:.2f}, σ'(1) = {sigma_slope:.2f}: a steady push at the rate moves a gate by "
      f"{steady:.2f}, AdamW's worst case by {worst:.2f}. Checked in a full run: the gates stay within {steady:.2f} "
      f"of σ(1), and both models end above {chance + 10 * guess_se:.0f} %, ten standard errors ({guess_se:.1f} "
      "points) above chance")

# %% [markdown]
# ## Exercises
#
# How they work (chapter 00_input_checks): replace the placeholder `...` in the answer cell, then run the check below
# it. The exercises on the loop itself came first, in chapter 11_build_your_loop, where you wrote `fit`'s schedule
# and epoch before this chapter showed them.
#
# **1. Weight decay, counted for the DeiT.** Section 3 counted by hand the tensors `param_groups` decays in the ConViT:
# 36. Count them the same way for the DeiT of this chapter (6 blocks, all of them SA blocks with qkv biases; a
# position slot for its class token) and set `deit_decayed` to the number of tensors in its decayed group.

# %%
deit_decayed = ...  # your answer: deit_decayed = ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal


def check_deit_decayed(answer: int) -> None:
    check_answer(isinstance(answer, int) and not isinstance(answer, bool),
                 f"a count of tensors is a whole number, got {answer!r}")
    want = len(param_groups(models["DeiT"], 0.05)[0]["params"])
    check_answer(answer != 36, "36 is the ConViT's count: the DeiT has no GPSA block, and an SA block holds 4 "
                 "weight matrices, not 6")
    check_answer(answer <= want, "too many: only matrices are decayed; biases (the qkv ones too) and LayerNorm gains "
                 "are 1-D, and pos_embed and cls_token are in model.no_weight_decay()")
    check_answer(answer == want, "too few: the patch embedding and the head are decayed too, and each SA block holds "
                 "4 matrices (qkv, the projection, the MLP's two)")


grade("deit_decayed", deit_decayed, check_deit_decayed)
demonstrate(check_deit_decayed, {"the ConViT's count": 36, "the qkv biases counted": 26 + 6,
                                 "pos_embed and cls_token counted": 28, "the blocks' matrices only": 24,
                                 "as a float": 26.0})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(deit_decayed):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    deit_decayed = 1 + 6 * 4 + 1  # the patch embedding; qkv, proj, fc1, fc2 in each of 6 SA blocks; the head
    grade("deit_decayed", deit_decayed, check_deit_decayed)

# %% [markdown]
# **2. Tokens, block by block.** This chapter's ConViT and DeiT read 64-pixel images in 8-pixel patches. Without running
# them, set `tokens_in` to the number of tokens entering each of their 6 blocks, in order:
# `{"ConViT": [...], "DeiT": [...]}`.

# %%
tokens_in = ...  # your answer: tokens_in = {"ConViT": [...], "DeiT": [...]}

# %%
def check_tokens_in(answer: dict) -> None:
    check_answer(isinstance(answer, dict) and set(answer) == set(models), f"a dict with the keys {sorted(models)}, "
                 f"got {answer!r}")
    for name, model in models.items():
        with torch.no_grad():
            record = model.forward_features(torch.zeros(1, 3, 64, 64), return_block_inputs=True)
        want, got = [t.shape[1] for t in record.block_inputs], list(answer[name])
        check_answer(len(got) == len(want), f"{name}: {len(got)} counts, one per block: {len(want)}")
        check_answer(set(got) <= {64, 65}, f"{name}: {got}: a token per patch, (64 / 8)² of them, and a class token "
                     "in the blocks it has joined")
        check_answer(got == want, f"{name}: " + ("the ConViT's class token joins after its 5 GPSA blocks" if name ==
                     "ConViT" else "the DeiT's class token joins at the input: every block sees it"))


grade("tokens_in", tokens_in, check_tokens_in)
demonstrate(check_tokens_in, {"a list, not a dict": [64] * 6, "one count per model": {"ConViT": [64], "DeiT": [65]},
                              "pixels, not patches": {"ConViT": [4096] * 5 + [4097], "DeiT": [4097] * 6},
                              "the class token in every block": {"ConViT": [65] * 6, "DeiT": [65] * 6},
                              "no class token for the DeiT": {"ConViT": [64] * 5 + [65], "DeiT": [64] * 6}})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(tokens_in):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    tokens_in = {"ConViT": [8 * 8] * 5 + [8 * 8 + 1], "DeiT": [8 * 8 + 1] * 6}  # the class token late, or at once
    grade("tokens_in", tokens_in, check_tokens_in)

# %% [markdown]
# ## What we have, and what comes next
#
# `convit_edu.teaching_loop` exports `param_groups`, `loss_and_accuracy` and `fit`, and `convit_edu.schedule` the schedule
# (`scaled_lr`, `deit_lr`): DeiT's optimiser and schedule and a loop of a few dozen lines that trains any zoo model. The production loop `convit_edu.training.train` is this
# loop hardened: one process per GPU on many nodes, mixed precision, checkpoints, an exact resume, DeiT's full
# augmentation (RandAugment, erasing, Mixup/CutMix, label smoothing), EMA, distillation, logs. Later core chapters use
# it as given; a core-path reader may skip how it is built.
