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
# # Training, part 2: the schedule, the loss, randomness and checkpoints
#
# The pieces of a training step that decide *what* is learned: the optimiser and its learning-rate schedule,
# the loss with hard distillation, random draws that depend only on the step (so that a resumed run draws the
# same), and checkpoints that are written atomically and hold everything a run needs to continue.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp optimisation
# The optimiser and learning-rate schedule, the training loss, per-step randomness and atomic checkpoints.

# %%
#| export
import math
import os
import random
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from convit_edu.loaders import seed_from
from convit_edu.pretrained import load_file

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## The optimiser and the schedule
#
# AdamW with decoupled weight decay 0.05, applied to the weight matrices only: biases, LayerNorm gains, the
# gating parameters λ (all 1-D) and whatever the model lists in `no_weight_decay()` (its position embedding
# and class token) are not decayed — shrinking a LayerNorm gain or a gate towards zero is not regularisation,
# it is a change of architecture.
#
# The learning rate is set at every optimiser step: a linear warm-up from `warmup_lr` to the peak over the
# first `warmup_epochs`, then half a cosine down to `min_lr` at the last step,
#
# $$\eta(t) = \eta_\min + \tfrac12(\eta_\text{peak}-\eta_\min)\Bigl(1+\cos\pi\,\tfrac{t-t_w}{T-t_w}\Bigr),
# \qquad t \ge t_w.$$

# %%
#| export
def scaled_lr(base_lr: float, global_batch: int) -> float:
    """DeiT's linear scaling rule: the peak learning rate is base_lr × global_batch / 512."""
    return base_lr * global_batch / 512


def deit_lr(step: int, total_steps: int, warmup_steps: int, peak_lr: float, min_lr: float, warmup_lr: float) -> float:
    """The learning rate at optimiser step `step` (0-based): linear warm-up, then cosine to `min_lr`."""
    if step < warmup_steps:
        return warmup_lr + (peak_lr - warmup_lr) * step / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr + 0.5 * (peak_lr - min_lr) * (1 + math.cos(math.pi * progress))


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: weight matrices decayed; 1-D parameters and `model.no_weight_decay()` not."""
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# %% [markdown]
# The schedule of a 300-epoch DeiT run at global batch 1024 (1,251 steps per ImageNet epoch), and the checks
# of its three landmarks:

# %%
steps_per_epoch, epochs, warmup = 1251, 300, 5
peak = scaled_lr(5e-4, 1024)
lrs = [deit_lr(t, steps_per_epoch * epochs, steps_per_epoch * warmup, peak, 1e-5, 1e-6) for t in range(steps_per_epoch * epochs)]
assert peak == 1e-3 and lrs[0] == 1e-6
assert abs(lrs[steps_per_epoch * warmup] - peak) < 1e-12 and max(lrs) == lrs[steps_per_epoch * warmup]
assert abs(lrs[-1] - 1e-5) < 1e-8
print(f"peak lr {peak:.1e} at step {lrs.index(max(lrs))}, last lr {lrs[-1]:.2e}")
fig, ax = plt.subplots(figsize=(6, 2.5), dpi=80)
ax.plot([t / steps_per_epoch for t in range(len(lrs))], lrs)
ax.set(xlabel="epoch", ylabel="learning rate", title="warm-up + cosine, stepped per iteration")
plt.show()

# %% [markdown]
# ## The loss, and hard distillation
#
# Mixup and CutMix (chapter 17) turn each label into a soft target y ∈ Δ^C with label smoothing already
# applied, so the loss is the cross-entropy with a probability vector. DeiT's **hard distillation** (used in
# SM B of the paper, Table 4) adds a second token and head to the student; the class head learns from the
# labels and the distillation head from the teacher's decision on the *same* (mixed) image:
#
# $$\mathcal L = \tfrac12\,\mathrm{CE}\bigl(\psi(Z_\text{cls}),\,y\bigr)
#             + \tfrac12\,\mathrm{CE}\bigl(\psi(Z_\text{dist}),\,\arg\max_c Z_\text{teacher}\bigr).$$
#
# At test time the two heads' logits are averaged (the model does that itself in `eval()` mode).

# %%
#| export
def train_loss(output: torch.Tensor | tuple[torch.Tensor, torch.Tensor], targets: torch.Tensor,
               teacher_logits: torch.Tensor | None = None, smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy with hard labels (B,) or soft targets (B, C); with a teacher, DeiT's hard distillation:
    ½·CE(class head, targets) + ½·CE(distillation head, teacher's argmax)."""
    distilled = isinstance(output, tuple)
    if distilled != (teacher_logits is not None):
        raise ValueError(
            "the model has a distillation head but no teacher was given (set distill_teacher)" if distilled else
            "a teacher was given but the model has no distillation head (create it with distilled=True)"
        )
    smoothing = smoothing if targets.ndim == 1 else 0.0  # soft targets carry their smoothing already
    if not distilled:
        return F.cross_entropy(output, targets, label_smoothing=smoothing)
    class_logits, dist_logits = output
    return 0.5 * F.cross_entropy(class_logits, targets, label_smoothing=smoothing) + 0.5 * F.cross_entropy(
        dist_logits, teacher_logits.argmax(dim=1)
    )


# %%
logits_cls, logits_dist, teacher = torch.randn(4, 10), torch.randn(4, 10), torch.randn(4, 10)
soft = torch.softmax(torch.randn(4, 10), dim=1)
expected = 0.5 * -(soft * logits_cls.log_softmax(1)).sum(1).mean() + 0.5 * F.cross_entropy(logits_dist, teacher.argmax(1))
torch.testing.assert_close(train_loss((logits_cls, logits_dist), soft, teacher), expected)
torch.testing.assert_close(train_loss(logits_cls, soft), -(soft * logits_cls.log_softmax(1)).sum(1).mean())
print(f"distillation loss {train_loss((logits_cls, logits_dist), soft, teacher).item():.4f} = ½ CE(class) + ½ CE(dist)")

# %% [markdown]
# ## Randomness that does not depend on the past
#
# Exact resume is a question about random numbers. An uninterrupted run and a resumed one must draw the same
# shuffling, the same augmentations, the same Mixup pairs and the same drop-path masks at every step. Saving
# the generators' states at the checkpoint is not enough on its own: a data loader created afresh consumes
# random numbers, workers are re-seeded, and a transform's draws depend on how many samples came before. So
# this loop makes every random draw a function of *where* it happens, not of *what ran before*:
#
# * the sampler's permutation is a function of (seed, epoch) — `RepeatAugSampler.set_epoch(epoch, start)`
#   of chapter 18 skips the `start` samples this process already consumed;
# * each sample's augmentation runs under generators seeded from (seed, epoch, position in the epoch's stream),
#   inside `torch.random.fork_rng` so the caller's generators are left untouched — the same in the main
#   process and in loader workers (chapter 18's `build_loaders`, through `KeyedSampler` and `SeededSamples`);
# * at the start of every optimiser step the torch, numpy and python generators are seeded from
#   (seed, rank, epoch, step), which fixes Mixup/CutMix and drop path;
# * the initial weights come from `torch.manual_seed(seed)` just before the model is built.
#
# The generators' states are saved in checkpoints anyway; with this scheme they are what the seeding gives.

# %%
#| exporti
def _seed_step(seed: int, rank: int, epoch: int, step: int) -> None:
    s = seed_from(seed, rank, epoch, step)
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)


# %% [markdown]
# ## Checkpoints that lose nothing
#
# A checkpoint holds the model, the optimiser, the schedule, the fp16 loss scaler, the EMA, the position
# (epoch, optimiser steps done in it, which sets the sampler's `start`), every generator's state, the log so
# far and the full config. It is written **atomically**: to a temporary file in the same folder, flushed to
# disk, then renamed over the old one. A rename within one file system is atomic, so a crash — a SIGKILL, a
# full disk, a node failure — at any moment leaves either the old checkpoint or the new one, never half of
# one. Everything in it is a tensor, number, string or container, so it loads with `weights_only=True` (no
# pickled code runs when you open a checkpoint someone sent you).

# %%
#| export
CHECKPOINT_FORMAT = "convit-edu-train-1"


def save_checkpoint(checkpoint: dict, path: str | Path) -> Path:
    """Write `checkpoint` to `path` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_checkpoint(path: str | Path) -> dict:
    """Load a training checkpoint on the CPU; ValueError naming the file when it is truncated, not loadable
    safely, or not a convit-edu training checkpoint."""
    ckpt = load_file(path)
    if not isinstance(ckpt, dict) or ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a convit-edu training checkpoint (format {CHECKPOINT_FORMAT!r} missing);"
                         " to start from pretrained weights use convit_edu.pretrained.load_checkpoint")
    return ckpt


# %%
#| exporti
def _rng_states() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    # no CUDA states: every step reseeds every generator (`_seed_step`), and a list with one state per visible GPU
    # would tie the checkpoint to the number of GPUs of the machine that wrote it
    return {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "python": random.getstate(),
    }


def _set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])  # (checkpoints of earlier versions also hold "cuda": not needed, ignored)
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
