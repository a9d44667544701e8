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
# # The optimiser, the schedule, the loss and per-step randomness
#
# The pieces of a training step that decide *what* is learned: the optimiser and its learning-rate schedule,
# the loss with hard distillation, the EMA of the weights, random draws that depend only on the step (so that a
# resumed run draws the same), and the check that a checkpoint (chapter 12 writes and reads them) belongs to
# the run that resumes from it.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp optimisation
# The optimiser and learning-rate schedule, the training loss and its teacher, the EMA of the weights, and per-step
# randomness.

# %%
#| export
import random

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.optim.swa_utils import AveragedModel

from convit_edu.pretrained import load_weights, read_state_dict
from convit_edu.config import TrainConfig
from convit_edu.teaching_loop import param_groups
from convit_edu.samplers import seed_from
from convit_edu.schedule import scaled_lr
from convit_edu.zoo import create_model, list_models

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from convit_edu.checks import expect_error
from convit_edu.schedule import deit_lr

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## The optimiser and the schedule
#
# AdamW with decoupled weight decay 0.05, applied to the weight matrices only (chapter 11's `param_groups`,
# which this chapter uses as it is): biases, LayerNorm gains, the gating parameters λ (all 1-D) and whatever the
# model lists in `no_weight_decay()` (its position embedding and class token) are not decayed — shrinking a
# LayerNorm gain or a gate towards zero is not regularisation, it is a change of architecture.
#
# The learning rate is chapter 11's too, `convit_edu.schedule`: DeiT's scaling rule for the peak (`scaled_lr`),
# a linear warm-up from `warmup_lr` to the peak over the first `warmup_epochs`, then half a cosine down to
# `min_lr` at the last step (`deit_lr`),
#
# $$\eta(t) = \eta_\min + \tfrac12(\eta_\text{peak}-\eta_\min)\Bigl(1+\cos\pi\,\tfrac{t-t_w}{T-t_w}\Bigr),
# \qquad t \ge t_w.$$
#
# It is a function of the step t and nothing else (nanoGPT's `get_lr(it)`): no scheduler object counts steps, so a
# checkpoint holds no schedule, and a resumed run — even one that mends `lr` — computes its rates from its own
# config and its step. `RunSchedule` is a run's schedule: the numbers `deit_lr` takes, read off the config once,
# and the scale of each parameter group.

# %%
#| export schedule
# The learning rate as a function of the optimiser step: DeiT's linear scaling rule (`scaled_lr`) and its warm-up and
# cosine (`deit_lr`), written once for the teaching loop (chapter 11) and the production one (chapter 23), and a
# run's rates, those times each parameter group's scale (`RunSchedule`). Nothing in it counts steps: the rate at
# any step t is computed from t, so a resumed run needs no saved schedule, and a captured CUDA graph can read the
# rate from a device tensor that the host fills with `RunSchedule.lr(t)` before each replay (torch's AdamW takes a
# tensor `lr` when it is `fused` or `capturable`, and keeps that tensor).

# %%
#| export schedule
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RunSchedule:
    """A run's learning rates, a function of the optimiser step t alone: `deit_lr` over `total_steps` with
    `warmup_steps` of warm-up, from `warmup_lr` to `peak_lr` and down to `min_lr`, times each parameter group's
    scale (`scales`, in the optimiser's group order)."""

    total_steps: int
    warmup_steps: int
    peak_lr: float
    min_lr: float
    warmup_lr: float
    scales: tuple[float, ...] = (1.0, 1.0)  # `param_groups`' two; `with_gate_group` adds the gates' `gate_lr_scale`

    def lr(self, step: int) -> float:
        """The rate at optimiser step `step` (0-based), before a group's scale."""
        return deit_lr(step, self.total_steps, self.warmup_steps, self.peak_lr, self.min_lr, self.warmup_lr)

    def rates(self, step: int) -> tuple[float, ...]:
        """Every parameter group's rate at optimiser step `step`: `lr(step)` times the group's scale."""
        lr = self.lr(step)
        return tuple(scale * lr for scale in self.scales)

    def set_lr(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Set every parameter group's rate for optimiser step `step` (`rates`)."""
        for group, rate in zip(optimizer.param_groups, self.rates(step), strict=True):
            group["lr"] = rate


# %%
#| export
from convit_edu.schedule import RunSchedule


def with_gate_group(groups: list[dict], model: nn.Module, scale: float) -> tuple[list[dict], tuple[float, ...]]:
    """``groups`` with the GPSA gates λ (parameters named ``gating_param``) moved into a last group of their own,
    undecayed, and the scale of each group's learning rate (``RunSchedule.scales``): 1, and ``scale`` for the gates."""
    gates = {id(p) for name, p in model.named_parameters() if name.endswith("gating_param") and p.requires_grad}
    if not gates:
        raise ValueError(f"gate_lr_scale {scale} needs GPSA gates that learn, but this {type(model).__name__} has "
                         "no trainable gating_param (a DeiT, frozen gates, or no GPSA layers): leave it at 1")
    rest = [{**g, "params": [p for p in g["params"] if id(p) not in gates]} for g in groups]
    mine = [p for g in groups for p in g["params"] if id(p) in gates]
    return rest + [{"params": mine, "weight_decay": 0.0}], (1.0,) * len(rest) + (scale,)


def run_schedule(cfg: TrainConfig, steps_per_epoch: int, global_batch: int,
                 scales: tuple[float, ...] = (1.0, 1.0)) -> RunSchedule:
    """The schedule of the run `cfg` at `global_batch` images and `steps_per_epoch` optimiser steps per epoch:
    the peak `scaled_lr(cfg.lr, global_batch)`, `cfg.warmup_epochs` of warm-up, the cosine over `cfg.epochs`."""
    return RunSchedule(steps_per_epoch * cfg.epochs, round(cfg.warmup_epochs * steps_per_epoch),
                       scaled_lr(cfg.lr, global_batch), cfg.min_lr, cfg.warmup_lr, scales)


def build_optimizer(cfg: TrainConfig, model: nn.Module, global_batch: int, steps_per_epoch: int,
                    device: torch.device, graphed: bool = False) -> tuple[torch.optim.AdamW, RunSchedule]:
    """AdamW over `param_groups` (the GPSA gates in a group of their own when `cfg.gate_lr_scale` is not 1,
    `with_gate_group`) and the run's schedule, the rates of step 0 set. AdamW is fused into one kernel on a GPU and
    wherever the step is `graphed` (chapter 28: a graph replays no read of a step count back to the host), and
    capturable (its step counts on the device) when graphed on a GPU."""
    groups = param_groups(model, cfg.weight_decay)
    scales = (1.0,) * len(groups)
    if cfg.gate_lr_scale != 1:
        groups, scales = with_gate_group(groups, model, cfg.gate_lr_scale)
    gpu = device.type == "cuda"
    optimizer = torch.optim.AdamW(groups, fused=gpu or graphed, capturable=gpu and graphed)
    schedule = run_schedule(cfg, steps_per_epoch, global_batch, scales)
    schedule.set_lr(optimizer, 0)
    return optimizer, schedule


def learning_rate_sum(cfg: TrainConfig, steps_per_epoch: int, world_size: int = 1) -> float:
    """The sum of the learning rates of every optimiser step of the run ``cfg`` on ``world_size`` processes: about
    how far AdamW can move any one parameter over the run (it moves each by roughly the learning rate per
    step, about 3 times it at worst for its default betas). ``steps_per_epoch``: ``cfg.steps_per_epoch(train_images, world_size)``, or a run's own record of it."""
    schedule = run_schedule(cfg, steps_per_epoch, cfg.images_per_step(world_size))
    return sum(schedule.lr(t) for t in range(schedule.total_steps))


# %% [markdown]
# The schedule of a 300-epoch DeiT run at global batch 1024 (1,251 steps per ImageNet epoch), and the checks
# of its three landmarks:

# %%
schedule = run_schedule(TrainConfig(lr=5e-4, epochs=300, warmup_epochs=5), steps_per_epoch=1251, global_batch=1024)
lrs = [schedule.lr(t) for t in range(schedule.total_steps)]
assert schedule.peak_lr == scaled_lr(5e-4, 1024) == 1e-3 and lrs[0] == 1e-6
assert abs(lrs[schedule.warmup_steps] - 1e-3) < 1e-12 and max(lrs) == lrs[schedule.warmup_steps] == lrs[1251 * 5]
assert abs(lrs[-1] - 1e-5) < 1e-8
print(f"peak lr {schedule.peak_lr:.1e} at step {lrs.index(max(lrs))}, last lr {lrs[-1]:.2e}")
fig, ax = plt.subplots(figsize=(6, 2.5), dpi=80)
ax.plot([t / 1251 for t in range(len(lrs))], lrs)
ax.set(xlabel="epoch", ylabel="learning rate", title="warm-up + cosine, stepped per iteration")
plt.show()

# %% [markdown]
# A run gets both from `build_optimizer`: AdamW, and its schedule, which sets every group's rate before each
# step — here 3 epochs of 10 steps, one of warm-up. A run resumed at step 17 needs nothing but its step: a new
# schedule of the same config gives the rates an uninterrupted run steps with.

# %%
cfg = TrainConfig(lr=5e-4, epochs=3, warmup_epochs=1)
optimizer, schedule = build_optimizer(cfg, nn.Linear(8, 2), global_batch=1024, steps_per_epoch=10,
                                      device=torch.device("cpu"))
rates = []
for t in range(30):
    schedule.set_lr(optimizer, t)
    rates.append(optimizer.param_groups[0]["lr"])
    optimizer.step()
assert rates == [deit_lr(t, 30, 10, scaled_lr(5e-4, 1024), cfg.min_lr, cfg.warmup_lr) for t in range(30)]
resumed, later = build_optimizer(cfg, nn.Linear(8, 2), global_batch=1024, steps_per_epoch=10, device=torch.device("cpu"))
later.set_lr(resumed, 17)
assert later == schedule and resumed.param_groups[0]["lr"] == rates[17]
print(f"30 steps: the optimiser's rate is deit_lr's at each, from {rates[0]:.0e} up to {max(rates):.0e}; "
      "step 17's again from the step alone")

# %% [markdown]
# One setting changes that for a diagnostic: `gate_lr_scale` gives the GPSA gates λ a group of their own whose
# rate is that multiple of everyone else's at every step (`with_gate_group`; chapter 38_why uses it to give the gates
# the learning-rate sum of the paper's runs). Every other parameter keeps its rate, and a model without gates is
# refused by name:

# %%
tiny = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=4, num_classes=5)
cfg = TrainConfig(lr=5e-4, epochs=3, warmup_epochs=1, gate_lr_scale=50)
optimizer, schedule = build_optimizer(cfg, create_model("convit_tiny", local_up_to_layer=1, **tiny), global_batch=1024,
                                      steps_per_epoch=10, device=torch.device("cpu"))
schedule.set_lr(optimizer, 12)
*others, gates = optimizer.param_groups
assert len(gates["params"]) == 1 and gates["params"][0].shape == (4,) and gates["weight_decay"] == 0
assert all(abs(gates["lr"] - 50 * g["lr"]) < 1e-12 for g in others), (gates["lr"], [g["lr"] for g in others])
print(f"step 12: gates at {gates['lr']:.2e}, every other parameter at {others[0]['lr']:.2e}")
refused = expect_error(lambda: build_optimizer(cfg, create_model("deit_tiny", **tiny), global_batch=1024,
                                               steps_per_epoch=10, device=torch.device("cpu")))
assert "gating_param" in refused
print(refused)

# %% [markdown]
# `learning_rate_sum` adds up those rates without running anything (chapter 32 uses it to compare runs). It takes
# the global batch and the steps per epoch from the config's own methods, so it agrees with the schedule a run
# builds also when a step accumulates micro-batches — here 4 of 32 images, 1000 training images, 3 epochs:

# %%
accumulated = TrainConfig(batch_size=32, accum_steps=4, epochs=3, warmup_epochs=1)
per_epoch = accumulated.steps_per_epoch(1000)
optimizer, schedule = build_optimizer(accumulated, nn.Linear(8, 2), accumulated.images_per_step(), per_epoch,
                                      device=torch.device("cpu"))
stepped = 0.0
for t in range(per_epoch * accumulated.epochs):
    schedule.set_lr(optimizer, t)
    stepped += optimizer.param_groups[0]["lr"]
assert abs(learning_rate_sum(accumulated, per_epoch) - stepped) <= 1e-12 * stepped
print(f"{per_epoch} steps per epoch of 128 images: the rates of the schedule sum to {stepped:.4e}, as computed")

# %% [markdown]
# ## The loss, and hard distillation
#
# Mixup and CutMix (chapter 15) turn each label into a soft target y ∈ Δ^C with label smoothing already
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
# The teacher is a frozen classifier — a model of the zoo or one of torchvision's (the paper's SM B distils from
# a RegNetY-16GF, as DeiT does) — with its weights from a checkpoint:

# %%
#| export
def build_teacher(name: str, checkpoint: str | None, num_classes: int, img_size: int) -> nn.Module:
    """A frozen teacher: a convit_edu model or a torchvision classifier, with weights from `checkpoint`."""
    if name in list_models():
        teacher = create_model(name, num_classes=num_classes, img_size=img_size)
        if checkpoint:
            load_weights(teacher, checkpoint)  # also reads our training checkpoints (their "model" entry)
    elif name in torchvision.models.list_models(module=torchvision.models):
        teacher = torchvision.models.get_model(name, num_classes=num_classes)
        if checkpoint:
            teacher.load_state_dict(read_state_dict(checkpoint))
    else:
        raise ValueError(f"unknown teacher {name!r}: give a convit_edu model ({', '.join(list_models())}) or a "
                         "torchvision classifier (e.g. regnet_y_16gf, resnet50)")
    return teacher.eval().requires_grad_(False)


# %% [markdown]
# ## The EMA of the weights
#
# DeiT evaluates, beside the model, an exponential moving average of its weights, θ̄ ← d·θ̄ + (1 − d)·θ after
# every optimiser step (decay d = `ema_decay`). `torch.optim.swa_utils.AveragedModel` holds it, but its
# `update_parameters` reads its step counter back from the device twice per step to tell the first update (a
# copy) from the others — and a loop that reads the device back once per logging interval (chapter 28) cannot
# afford that. The loop knows on the host whether a step is the first one, so `update_ema` does the same
# update without the reads, with torch's fused `_foreach` kernels (an integer buffer, a batch-norm counter, is
# not averaged: it follows the model). The check: the same three updates by both.

# %%
#| export
def update_ema(ema: AveragedModel, model: nn.Module, decay: float, first: bool) -> None:
    """What `AveragedModel.update_parameters` does with an EMA average (a copy of the model at the first update,
    then ema ← decay·ema + (1 − decay)·model for parameters and buffers), without its two host reads of
    `n_averaged` per step: whether this is the first update is known on the host."""
    with torch.no_grad():
        averaged = [*ema.module.parameters(), *ema.module.buffers()]
        current = [*model.parameters(), *model.buffers()]
        if first:
            torch._foreach_copy_(averaged, current)
        else:
            floats = [(a, c) for a, c in zip(averaged, current) if a.is_floating_point()]
            torch._foreach_lerp_([a for a, _ in floats], [c for _, c in floats], 1 - decay)
            for a, c in zip(averaged, current):  # integer buffers (counters) follow the model
                if not a.is_floating_point():
                    a.copy_(c)
        ema.n_averaged += 1


# %%
from torch.optim.swa_utils import get_ema_multi_avg_fn

net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))  # parameters, float buffers and an integer counter
reference = AveragedModel(net, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
ours = AveragedModel(net, use_buffers=True)
for i in range(3):
    net(torch.randn(4, 8))  # moves the batch-norm statistics and its counter
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p))
    reference.update_parameters(net)
    update_ema(ours, net, 0.9, first=i == 0)
floats = [k for k, v in ours.state_dict().items() if v.is_floating_point()]
assert all(torch.equal(reference.state_dict()[k], ours.state_dict()[k]) for k in floats)
assert ours.module[1].num_batches_tracked == net[1].num_batches_tracked == 3  # an integer counter follows the model
print(f"3 updates: update_ema's {len(floats)} float tensors equal AveragedModel's; the batch counter follows the model")

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
#   of chapter 16 skips the `start` samples this process already consumed;
# * each sample's augmentation runs under generators seeded from (seed, epoch, position in the epoch's stream),
#   inside `torch.random.fork_rng` so the caller's generators are left untouched — the same in the main
#   process and in loader workers (chapter 17's `build_loaders`, through chapter 16's `KeyedSampler` and
#   `SeededSamples`);
# * at the start of every optimiser step the torch, numpy and python generators are seeded from
#   (seed, rank, epoch, step), which fixes Mixup/CutMix and drop path;
# * the initial weights come from `torch.manual_seed(seed)` just before the model is built.
#
# The generators' states are saved in checkpoints anyway; with this scheme they are what the seeding gives.

# %%
#| export
def seed_step(seed: int, rank: int, epoch: int, step: int) -> None:
    """Seed torch's, numpy's and python's generators from (seed, rank, epoch, step), at the start of every
    optimiser step: Mixup/CutMix and drop path then draw the same in a resumed run as in an uninterrupted one."""
    s = seed_from(seed, rank, epoch, step)
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s)

# %% [markdown]
# Whether a checkpoint continues the same run, and what a resume may change, is chapter 26's, beside the checkpoint
# itself.
