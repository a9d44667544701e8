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
# # Training: one loop from a laptop CPU to many GPUs, with exact resume
#
# The ConViT is trained with DeiT's recipe, unchanged (§4 of the paper): AdamW, a learning rate scaled with
# the batch, a warm-up and a cosine decay, stochastic depth, Mixup/CutMix with label smoothing, and optionally
# an EMA of the weights and hard distillation from a CNN teacher (SM B, Table 4). This chapter writes the loop
# that does it, once, for every scale: one process on a CPU, one GPU, `torchrun` on one node, or many nodes
# under SLURM. Along the way it makes a run survive the things that happen to long runs — pre-emption, a
# killed job, a NaN — and checks the strongest property a checkpoint can have: **a run stopped anywhere and
# resumed ends with exactly the weights of a run that never stopped.**

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp training
# Training: one loop from a laptop CPU to many GPUs, with exact resume.
#
# Longer than the other modules because chapter 07 teaches the loop together with its machinery (the config,
# randomness, checkpoints, processes, evaluation, progress), each piece next to its prose; the course
# reorganisation splits the chapter, and this module with it, into the loop and its machinery.

# %%
import json
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from convit_edu.checks import expect_error

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## A run is a config
#
# Everything that decides what a run computes lives in one dataclass. It is written into every checkpoint and
# into `run.json` beside them, so a run can be repeated, resumed or audited from its files alone. The defaults
# are DeiT's (Touvron et al. 2020, Table 9): base learning rate 5·10⁻⁴ for a batch of 512, AdamW with weight
# decay 0.05, 5 warm-up epochs, cosine decay to 10⁻⁵, drop path 0.1, 300 epochs, 64 images per GPU.
#
# Two sizes of batch matter. `batch_size` is what one process puts through the model at once; the **global
# batch**, what one optimiser step averages over, is
#
# $$B_\text{global} = \texttt{batch\_size} \times \texttt{accum\_steps} \times \text{world size},$$
#
# and the learning rate follows it: lr = `lr` × B_global / 512. A recipe can instead fix `global_batch`, and
# each process then takes its share — the same recipe runs on 1 GPU (with accumulation) or on 16.
#
# **Every setting has one owner.** The model's architecture comes from the zoo (`model`) with `model_args`
# overriding `ModelConfig` fields, and the augmentation from `data.AUGMENTATIONS[aug]` with `aug_args`
# overriding `AugConfig` fields — but four fields of those two dataclasses belong to the run, and setting them
# in the overrides is an error that names their owner (`RUN_OWNED`): the image size (one value for the model's
# patch grid and the augmentation's output), the number of classes (the dataset's), the distillation head (there
# when there is a teacher) and drop path (a training hyper-parameter of DeiT's recipe). The config checks every
# value when it is made — types, ranges, names, and that the model and augmentation it describes can be built —
# so a wrong setting fails in the line that made it, not an hour later inside torch.

# %%
#| export
import contextlib
import csv
import json
import math
import os
import platform
import random
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from fastprogress.fastprogress import IN_NOTEBOOK, ConsoleMasterBar, ConsoleProgressBar, NBMasterBar, NBProgressBar
from matplotlib.figure import Figure
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import DataLoader, Dataset, Subset

import convit_edu
from convit_edu.checks import number, one_of, positive_int
from convit_edu.data import (AUGMENTATION_RENAMES, AUGMENTATIONS, DALI_INSTALL, DATASETS, LOADERS, AugConfig,
                             DaliLoaders, DataLoaders, DeviceTransforms, augmentation, build_datasets, build_loaders,
                             build_mixup, build_transforms, check_fraction, dali_available, seed_from)
from convit_edu.gpsa import gate_values
from convit_edu.models import (ModelConfig, VisionTransformer, create_model, list_models, load_checkpoint, load_file,
                               model_config, read_state_dict)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
PROGRESS = ("auto", "bar", "lines", "none")
RUN_OWNED = {  # ModelConfig / AugConfig fields the run sets, and the setting (or fact) that sets them
    "img_size": "img_size", "num_classes": "the dataset's classes", "distilled": "distill_teacher",
    "drop_path_rate": "drop_path_rate"}


def setting(default: Any, help: str) -> Any:
    """A config field with its one-line help (the command line shows it); a dict default becomes a factory."""
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={"help": help})
    return field(default=default, metadata={"help": help})
# %%
#| export
@dataclass
class TrainConfig:
    """Every setting of a training run, with DeiT's defaults; validated when made, saved in checkpoints and
    `run.json`. `batch_size` is per process; `global_batch`, when set, replaces it by global_batch /
    (accum_steps × world size). `lr` is the base rate for a global batch of 512 (DeiT's linear scaling rule)."""

    model: str = setting("convit_tiny", "model name (convit_edu.models.list_models())")
    model_args: dict[str, Any] = setting({}, "ModelConfig overrides, e.g. {'depth': 6}")
    img_size: int = setting(224, "image side in pixels, for the model and the augmentation")
    drop_path_rate: float = setting(0.1, "stochastic depth of the last block (DeiT: 0.1)")
    data: str = setting("fake", "dataset: cifar100, imagefolder (ROOT/train, ROOT/val) or fake")
    data_root: str = setting("data", "dataset folder")
    data_args: dict[str, Any] = setting({}, "more build_datasets arguments (FakeData sizes)")
    aug: str | None = setting("deit", "augmentation (convit_edu.data.AUGMENTATIONS: deit, pad-crop-flip); none: "
                                      "no augmentation, mixing or smoothing (for datasets passed to train)")
    aug_args: dict[str, Any] = setting({}, "AugConfig overrides, e.g. {'mixup_alpha': 0.0}")
    fraction: float = setting(1.0, "keep this fraction of the training images of each class (Table 2)")
    classes: int | None = setting(None, "keep the first K classes")
    repeats: int = setting(1, "repeated augmentation: each image this many times per epoch (DeiT: 3)")
    num_workers: int = setting(4, "data loader processes per GPU/process (loader dali: its CPU threads)")
    loader: str = setting("torchvision", "torchvision (workers decode with PIL) or dali (NVIDIA DALI decodes, on the "
                                         f"GPU when there is one; imagefolder data only; {DALI_INSTALL})")
    epochs: int = setting(300, "training epochs")
    eval_every: int = setting(1, "evaluate, log a row and update best.pt every N epochs, and after the last")
    batch_size: int = setting(64, "images per process and step (ignored when --global-batch is set)")
    global_batch: int | None = setting(None, "images per optimiser step over all processes and accumulation steps")
    accum_steps: int = setting(1, "gradient accumulation steps per optimiser step")
    lr: float = setting(5e-4, "base learning rate for a global batch of 512 (scaled linearly)")
    min_lr: float = setting(1e-5, "learning rate at the end of the cosine")
    warmup_lr: float = setting(1e-6, "learning rate at the start of the warm-up")
    warmup_epochs: float = setting(5.0, "linear warm-up length in epochs (may be fractional)")
    weight_decay: float = setting(0.05, "AdamW weight decay (not on 1-D parameters, pos_embed, cls_token)")
    clip_grad: float | None = setting(None, "clip the gradient norm to this value (none: off)")
    ema_decay: float | None = setting(None, "keep an EMA of the weights with this decay, evaluated too (none: off; "
                                            "DeiT code: 0.99996)")
    distill_teacher: str | None = setting(None, "hard distillation from this convit_edu or torchvision model "
                                                "(SM B, Table 4)")
    teacher_checkpoint: str | None = setting(None, "the teacher's weights")
    precision: str = setting("auto", "auto (bf16 on GPUs that have it, else fp16; on CPUs bf16 where native, else "
                                     "fp32), fp32, bf16 or fp16")
    compile: bool = setting(False, "torch.compile the model")
    seed: int = setting(0, "seed of every random draw (shuffling, augmentation, mixing, drop path)")
    device: str = setting("auto", "auto (cuda:LOCAL_RANK if available, else mps, else cpu), cpu, cuda or mps")
    output: str = setting("runs/run", "run folder: checkpoints, logs, run.json, curves.png")
    resume: str | None = setting(None, "continue from a checkpoint path, or auto (OUTPUT/last.pt when it exists)")
    ckpt_every: int = setting(0, "also checkpoint every N optimiser steps (0: at epoch ends only)")
    log_every: int = setting(50, "print a progress line every N steps (when not showing bars)")
    progress: str = setting("auto", "auto (bars in notebooks and terminals, lines otherwise), bar, lines or none")

    def __post_init__(self) -> None:
        for name in ("img_size", "repeats", "epochs", "eval_every", "batch_size", "accum_steps", "log_every"):
            positive_int(name, getattr(self, name))
        for name in ("num_workers", "seed", "ckpt_every"):
            positive_int(name, getattr(self, name), minimum=0)
        for name in ("classes", "global_batch"):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name))
        number("lr", self.lr, 0, open_low=True)
        for name in ("min_lr", "warmup_lr", "warmup_epochs", "weight_decay"):
            number(name, getattr(self, name), 0)
        number("drop_path_rate", self.drop_path_rate, 0, 1, open_high=True)
        if self.clip_grad is not None:
            number("clip_grad", self.clip_grad, 0, open_low=True)
        if self.ema_decay is not None:
            number("ema_decay", self.ema_decay, 0, 1, open_low=True, open_high=True)
        check_fraction(self.fraction)
        _check_device(self.device)
        for what, value, choices in (("precision", self.precision, PRECISIONS), ("progress", self.progress, PROGRESS),
                                     ("dataset", self.data, DATASETS), ("loader", self.loader, LOADERS)):
            one_of(what, value, choices)
        if self.teacher_checkpoint is not None and not self.distill_teacher:
            raise ValueError(f"teacher_checkpoint {self.teacher_checkpoint} given without distill_teacher (the "
                             "teacher's model name)")
        self.model_config(num_classes=2, distilled=False)  # the model and augmentation it describes can be built
        aug = self.aug_config()
        if self.loader == "dali":
            _check_dali(self, aug)

    def model_config(self, num_classes: int, distilled: bool) -> ModelConfig:
        """The model this run trains: zoo `model` with `model_args`, at the run's image size and drop path."""
        _refuse_run_owned("model_args", self.model_args)
        return model_config(self.model, **self.model_args, img_size=self.img_size,
                            num_classes=num_classes, distilled=distilled, drop_path_rate=self.drop_path_rate)

    def aug_config(self) -> AugConfig | None:
        """The augmentation: `AUGMENTATIONS[aug]` with `aug_args`, at the run's image size; None: no augmentation."""
        _refuse_run_owned("aug_args", self.aug_args)
        if self.aug is None:
            if self.aug_args:
                raise ValueError(f"aug_args {self.aug_args} given with aug None (no augmentation)")
            return None
        return augmentation(self.aug, self.img_size, **self.aug_args)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        """A config from field values: a JSON or YAML file's, a checkpoint's, or an older `run.json`'s (whose
        augmentation names are migrated)."""
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}: TrainConfig fields are "
                             f"{', '.join(f.name for f in fields(cls))}")
        values = dict(values)
        values["aug"] = AUGMENTATION_RENAMES.get(values.get("aug"), values.get("aug", "deit"))
        return cls(**values)


def _check_dali(cfg: TrainConfig, aug: AugConfig | None) -> None:
    """What the DALI loader (chapter 06) cannot do, refused when the config is made."""
    if cfg.data != "imagefolder":
        raise ValueError(f"loader 'dali' reads image files: it needs data 'imagefolder', not {cfg.data!r} "
                         "(use loader 'torchvision')")
    if aug is None or aug.crop != "random_resized":
        raise ValueError(f"loader 'dali' implements the random-resized-crop recipe (aug 'deit'), not aug {cfg.aug!r} "
                         "(use loader 'torchvision')")
    if cfg.repeats != 1:
        raise ValueError(f"loader 'dali' has no repeated augmentation: repeats {cfg.repeats} needs loader "
                         "'torchvision'")
    if not dali_available():
        raise ImportError(f"loader 'dali' needs NVIDIA DALI, which is not installed: {DALI_INSTALL} (or use loader "
                          "'torchvision')")


def _check_device(device: str) -> None:
    try:
        parsed = torch.device(device) if device != "auto" else None
    except (RuntimeError, TypeError):
        parsed = None
    if device != "auto" and (parsed is None or parsed.type not in ("cpu", "cuda", "mps")):
        raise ValueError(f"device {device!r} is not one of auto, cpu, cuda, cuda:N or mps")


def _refuse_run_owned(where: str, overrides: dict[str, Any]) -> None:
    owned = sorted(set(overrides) & set(RUN_OWNED))
    if owned:
        raise ValueError(f"{where} sets {owned[0]!r}, which the run owns: set {RUN_OWNED[owned[0]]} instead")


def per_device_batch(cfg: TrainConfig, world_size: int) -> int:
    """The batch one process runs at once: `batch_size`, or its share of `global_batch`."""
    if cfg.global_batch is None:
        return cfg.batch_size
    share = cfg.accum_steps * world_size
    if cfg.global_batch % share:
        raise ValueError(
            f"global_batch {cfg.global_batch} is not divisible by accum_steps {cfg.accum_steps} × world size "
            f"{world_size} = {share}: pick a global batch that is a multiple of {share}"
        )
    return cfg.global_batch // share


# %% [markdown]
# A wrong setting fails in the line that makes it, naming the value; a field that another setting owns says
# which one:

# %%
from convit_edu.training import TrainConfig, per_device_batch

cfg = TrainConfig(global_batch=1024)
print("per-device batch on 8 GPUs:", per_device_batch(cfg, 8))
print("per-device batch on 1 GPU with 4 accumulation steps:", per_device_batch(TrainConfig(global_batch=1024, accum_steps=4), 1))
print(expect_error(lambda: TrainConfig(precision="fp8")))
print(expect_error(lambda: TrainConfig(lr="1e-3"), TypeError))
print(expect_error(lambda: TrainConfig(epochs=2.5), TypeError))
print(expect_error(lambda: TrainConfig(model_args={"img_size": 32})))
print(expect_error(lambda: TrainConfig(model_args={"locality_strength": -1.0})))
print(expect_error(lambda: per_device_batch(cfg, 3)))

# %% [markdown]
# ### Recipes: the paper's settings by name
#
# A recipe is a named set of config values, applied over the defaults; the command line's `--preset` takes
# these names, and explicit settings override them. `deit` is the ImageNet recipe of DeiT and of the paper
# (global batch 1024 with repeated augmentation ×3; 300 epochs); `imagenet` adds the data; `cifar100-224` is
# the paper's SM C (CIFAR-100 upsampled to 224 px, every hyper-parameter unchanged); `cifar100-32` trains at
# CIFAR's own 32 px, with 4-pixel patches and the classic pad-crop-flip augmentation, at a global batch of 128
# whatever the number of GPUs.

# %%
#| export
_DEIT = dict(epochs=300, global_batch=1024, lr=5e-4, min_lr=1e-5, warmup_lr=1e-6, warmup_epochs=5.0,
             weight_decay=0.05, drop_path_rate=0.1, img_size=224, aug="deit", repeats=3, ema_decay=None,
             clip_grad=None)

RECIPES: dict[str, dict[str, Any]] = {
    "deit": _DEIT,
    "imagenet": {**_DEIT, "data": "imagefolder", "data_root": "data/imagenet"},
    "cifar100-224": {**_DEIT, "data": "cifar100"},
    "cifar100-32": {**_DEIT, "data": "cifar100", "aug": "pad-crop-flip", "img_size": 32,
                    "model_args": {"patch_size": 4}, "global_batch": 128, "repeats": 1},
}


def recipe(name: str) -> dict[str, Any]:
    """The `TrainConfig` values a recipe sets (a copy); ValueError listing the recipes for an unknown name."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in RECIPES[one_of("recipe", name, RECIPES)].items()}


# %%
from convit_edu.training import RECIPES, recipe

for name in RECIPES:
    TrainConfig(**recipe(name))  # every recipe is a valid config
print({name: TrainConfig(**recipe(name)).aug for name in RECIPES})
print(expect_error(lambda: recipe("cifar10")))
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
from convit_edu.training import deit_lr, param_groups, scaled_lr

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
# Mixup and CutMix (chapter 06) turn each label into a soft target y ∈ Δ^C with label smoothing already
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
from convit_edu.training import train_loss

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
#   of chapter 06 skips the `start` samples this process already consumed;
# * each sample's augmentation runs under generators seeded from (seed, epoch, position in the epoch's stream),
#   inside `torch.random.fork_rng` so the caller's generators are left untouched — the same in the main
#   process and in loader workers (chapter 06's `build_loaders`, through `KeyedSampler` and `SeededSamples`);
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
                         " to start from pretrained weights use convit_edu.models.load_checkpoint")
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


# %% [markdown]
# ## Processes, devices, precision
#
# `torchrun` (and `srun … torchrun` under SLURM) starts one process per GPU and tells each its `RANK`,
# `LOCAL_RANK` and `WORLD_SIZE` through the environment; a plain `python` start has none of them and is a world
# of one. GPUs talk through NCCL, CPU processes through gloo — the same code, which is how CI tests the real
# distributed path with two CPU processes. Only rank 0 prints, writes logs and writes checkpoints; every
# number it logs is first summed over all ranks.
#
# Precision: bf16 autocast runs matmuls in bfloat16 (same exponent range as fp32, so no loss scaling); fp16
# needs a `GradScaler`, which scales the loss up so small gradients survive and skips steps whose gradients
# overflow; fp32 is exact and what the resume tests use. bf16 pays on GPUs (Ampere and later) and on CPUs
# with AVX-512 BF16 or AMX units; a CPU without them emulates it, and is *slower* in bf16 than in fp32 — see
# the measurement below. So `precision="auto"` means bf16 on a GPU that has it (fp16 on older ones); on a CPU,
# bf16 where the CPU says it has the units (the `avx512_bf16` or `amx_bf16` flags of `/proc/cpuinfo`, with
# PyTorch running its AVX-512 kernels), fp32 elsewhere — the flags rather than a timed trial, because a trial
# at start-up would cost seconds and vary with the load, while the flags decide the same way every time.
# `device="auto"` is CUDA, else Apple's MPS (whose precision stays fp32), else the CPU. On a GPU, fp32 runs its
# matmuls on tensor cores in TF32, and AdamW runs fused (one kernel for all parameters).

# %%
#| exporti
@dataclass
class _World:
    rank: int
    world_size: int
    device: torch.device
    owns_group: bool  # this call initialised the process group and must destroy it

    @property
    def main(self) -> bool:
        return self.rank == 0


_LAUNCHERS = {  # the variables each launcher sets: (rank, world size, local rank)
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK"), "srun": ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID")}
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)  # longer than any wait between collectives (a checkpoint write)


def _world_from_env(env: Mapping[str, str] = os.environ) -> tuple[int, int, int, str | None]:
    """(rank, world size, local rank, launcher) from torchrun's variables, else from those srun sets for each
    task of a job step (the batch script itself, outside srun, is a world of one), else a world of one."""
    launcher = "torchrun" if "WORLD_SIZE" in env else "srun" if "SLURM_STEP_NUM_TASKS" in env else None
    if launcher is None:
        return 0, 1, 0, None
    try:
        rank, world_size, local_rank = (int(env[name]) for name in _LAUNCHERS[launcher])
    except (KeyError, ValueError):
        raise ValueError(f"{launcher} launch with incomplete variables: need integers in "
                         f"{', '.join(_LAUNCHERS[launcher])}") from None
    if not (world_size >= 1 and 0 <= rank < world_size and 0 <= local_rank <= rank):
        names = dict(zip(_LAUNCHERS[launcher], (rank, world_size, local_rank)))
        raise ValueError(f"inconsistent {launcher} world {names}: need 0 <= local rank <= rank < world size")
    if launcher == "srun" and world_size > 1 and not {"MASTER_ADDR", "MASTER_PORT"} <= set(env):
        raise ValueError(f"srun started {world_size} tasks but MASTER_ADDR / MASTER_PORT are not set: export "
                         "MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1) and MASTER_PORT=29500 "
                         "in the sbatch script, or launch with torchrun")
    return rank, world_size, local_rank, launcher


def _init_world(device: str) -> _World:
    rank, world_size, local_rank, _ = _world_from_env()
    dev = resolve_device(device)
    if dev.type == "cuda":
        # one process per GPU; with one GPU visible per task (SLURM's --gpus-per-task) every local rank gets cuda:0
        dev = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # fp32 matmuls on tensor cores
    owns = world_size > 1 and not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method="env://", rank=rank,
                                world_size=world_size, timeout=PROCESS_GROUP_TIMEOUT)
    return _World(rank, world_size, dev, owns)


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def autocast(device: torch.device, precision: str):
    """Autocast for a resolved precision (fp32: none)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


# %%
#| export
def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX: Linux's /proc/cpuinfo flags), where bf16
    autocast is about twice as fast as fp32 on a training step; elsewhere bf16 is emulated and far slower."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: no flags to read, so no claim of native bf16
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags)) and torch.backends.cpu.get_cpu_capability() == "AVX512"


def resolve_device(device: str) -> torch.device:
    """"auto" -> CUDA if there is a GPU, else Apple's MPS, else the CPU; other names are checked."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else
                            "mps" if torch.backends.mps.is_available() else "cpu")
    _check_device(device)
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for but CUDA is not available: use --device cpu")
    return torch.device(device)


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """"auto" -> bf16 on a GPU that supports it, fp16 on an older GPU; on a CPU bf16 where it is native
    (`cpu_has_native_bf16`), else fp32; fp32 on Apple's MPS. Other values are checked."""
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if device.type == "cuda" and precision in ("auto", "bf16") and not torch.cuda.is_bf16_supported():
        if precision == "bf16":
            raise ValueError("precision bf16 is not supported by this GPU: use --precision fp16 (or auto)")
        return "fp16"
    if precision == "auto":
        return "bf16" if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()) else "fp32"
    return precision


# %% [markdown]
# The same matrix product, the size of one MLP layer of ConViT-Ti on a batch of 64 images at 64 px, in fp32
# and in bf16 on this notebook's CPU:

# %%
# NBVAL_IGNORE_OUTPUT
import time

a, w = torch.randn(64 * 64, 192), torch.randn(768, 192)
for dtype in (torch.float32, torch.bfloat16):
    x, y = a.to(dtype), w.to(dtype)
    F.linear(x, y)
    t0 = time.perf_counter()
    for _ in range(5):
        F.linear(x, y)
    print(f"{str(dtype):<15} {(time.perf_counter() - t0) / 5 * 1e3:7.2f} ms   (CPU capability: "
          f"{torch.backends.cpu.get_cpu_capability()})")


# %% [markdown]
# ## Evaluation
#
# Each process evaluates every `world_size`-th image of the validation set and the sums (loss, top-1 and top-5
# hits, count) are all-reduced, so the accuracy is exact at any world size: no sample is padded in twice, as
# happens with a `DistributedSampler` whose dataset does not divide evenly. Given a dict of models — the model
# and its EMA at an epoch's end — one pass over the data scores them all (an ImageNet validation pass is
# minutes of decoding; the loop also gives it the run's loader workers and twice the training batch), and the
# sums of all of them travel in one all-reduce: one wait for the device per evaluation.

# %%
#| export
def evaluate(model: nn.Module | dict[str, nn.Module], dataset: Dataset | Iterable, *, batch_size: int = 256,
             device: str | torch.device = "cpu", precision: str = "fp32", num_workers: int = 0, rank: int = 0,
             world_size: int = 1, finish: DeviceTransforms | None = None) -> dict[str, float] | dict[str, dict[str, float]]:
    """Mean cross-entropy, top-1 and top-5 accuracy (in %) of `model` on `dataset`, summed over processes. Given
    a dict of models (the model and its EMA), scores each of them in the same pass over the data. `dataset` may
    also be an iterable of this process's (images, labels) batches (the DALI loader's `val`). A dataset of
    uint8 images (`build_transforms(cfg, on_device=True)`) needs `finish`, which normalises them on the device."""
    models = model if isinstance(model, dict) else {"": model}
    device = torch.device(device)
    precision = resolve_precision(precision, device)
    if isinstance(dataset, Dataset):
        part = Subset(dataset, range(rank, len(dataset), world_size))
        loader = DataLoader(part, batch_size=batch_size, num_workers=num_workers, pin_memory=device.type == "cuda")
    else:  # this process's batches already (the DALI loader's `val`)
        loader = dataset
    modes = {name: m.training for name, m in models.items()}
    sums = torch.zeros(len(models), 4, dtype=torch.float64, device=device)  # loss, top-1, top-5 hits, images
    with torch.no_grad():
        for m in models.values():
            m.eval()
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            images = finish_batch(images, finish, train=False)
            for i, m in enumerate(models.values()):
                with autocast(device, precision):
                    logits = m(images).float()
                top = logits.topk(min(5, logits.shape[1]), dim=1).indices
                sums[i] += torch.stack([
                    F.cross_entropy(logits, labels, reduction="sum"), (top[:, 0] == labels).sum(),
                    (top == labels[:, None]).any(dim=1).sum(), torch.tensor(len(labels), device=device)]).double()
    for name, m in models.items():
        m.train(modes[name])
    rows = _all_reduce(sums).tolist()  # the one host sync of an evaluation
    if rows[0][3] == 0:
        raise ValueError("the evaluation set is empty")
    scores = {name: {"loss": loss / n, "top1": 100 * top1 / n, "top5": 100 * top5 / n}
              for name, (loss, top1, top5, n) in zip(models, rows)}
    return scores if isinstance(model, dict) else scores[""]


def finish_batch(images: torch.Tensor, finish: DeviceTransforms | None, train: bool) -> torch.Tensor:
    """A batch on the device ready for the model: uint8 images normalised (and, for training, erased) by
    `finish`; float images, already prepared by their dataset's transform, as they are."""
    if images.dtype != torch.uint8:
        return images
    if finish is None:
        raise ValueError("the dataset gives uint8 images (build_transforms(cfg, on_device=True)) but no "
                         "DeviceTransforms was given to normalise them: pass finish=DeviceTransforms(cfg)")
    return finish.train(images) if train else finish.eval(images)


# %% [markdown]
# ## Hooks, state and progress
#
# The loop calls a few hooks on every rank, with a `TrainState` that holds the live objects. That is the whole
# extension interface: the analysis chapter records nonlocality and the gates σ(λ) during training through it,
# and a hook that sets `state.stop = True` ends the run cleanly (checkpoint, then return) — the same path a
# SIGTERM takes.

# %%
#| export
@dataclass
class TrainState:
    """What the hooks see: the bare model (not wrapped in DDP or compiled), the optimiser and the position."""

    cfg: TrainConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    rank: int
    world_size: int
    steps_per_epoch: int
    epoch: int = 0  # the current epoch, 0-based
    step: int = 0  # optimiser steps done in this epoch
    global_step: int = 0
    loss: float = float("nan")  # the loss last read back (every log_every steps), averaged over every process
    epoch_losses: list[float] = field(default_factory=list)  # the losses of this epoch's steps so far
    history: list[dict] = field(default_factory=list)  # one row per finished and evaluated epoch
    pending: dict | None = None  # the training half of the last epoch's row, while that epoch is being evaluated
    stop: bool = False  # set it to end the run cleanly after the current step
    seconds: float = 0.0  # wall-clock seconds of training and evaluation so far (each row's time_s)


class Callback:
    """Override any of these; `train` calls them on every process, rank 0 included."""

    def on_train_begin(self, state: TrainState) -> None: ...
    def on_step_end(self, state: TrainState) -> None: ...
    def on_epoch_end(self, state: TrainState) -> None: ...
    def on_train_end(self, state: TrainState) -> None: ...


@dataclass
class TrainResult:
    """What `train` returns. `stopped` says why it ended early ("SIGTERM", "SIGINT", "callback") or is None."""

    model: nn.Module
    ema: nn.Module | None
    history: list[dict]
    output: Path
    stopped: str | None


def gate_means(model: nn.Module) -> list[float]:
    """Mean σ(λ) over the heads of each layer that has a `gating_param` (Eq. 6), in layer order."""
    return [gate_values(m.gating_param.detach().float(), getattr(m, "gate_override", None)).mean().item()
            for m in model.modules() if isinstance(getattr(m, "gating_param", None), torch.Tensor)]


# %% [markdown]
# Progress is shown by rank 0 only: fastprogress bars with live curves (train and val loss, val top-1
# error) in a notebook, a console bar in a terminal, and plain lines (one every `log_every` steps and one
# per epoch) when the output goes to a file — CI logs and SLURM's `slurm-JOB.out` stay readable.

# %%
#| exporti
class _Progress:
    def __init__(self, mode: str, epochs: int, log_every: int):
        if mode == "auto":
            mode = "bar" if IN_NOTEBOOK or sys.stdout.isatty() else "lines"
        self.mode, self.epochs, self.log_every, self.notebook = mode, epochs, log_every, IN_NOTEBOOK
        self.master, self.losses, self.val_losses, self.val_errors = None, [], [], []

    def epochs_of(self, epochs: range):
        if self.mode != "bar":
            return epochs
        self.master = (NBMasterBar if self.notebook else ConsoleMasterBar)(epochs, total=self.epochs)
        if self.notebook:
            self.master.names = ["train loss", "val loss", "val top-1 error"]
        return self.master

    def steps_of(self, steps: range):
        if self.mode != "bar":
            return steps
        return (NBProgressBar if self.notebook else ConsoleProgressBar)(steps, parent=self.master)

    def step(self, state: TrainState, lr: float, images_per_s: float) -> None:
        x = state.epoch + state.step / state.steps_per_epoch
        self.losses.append((x, state.loss))
        if self.mode == "bar" and self.master is not None:
            self.master.child.comment = f"loss {state.loss:.4f}"
            if self.notebook and state.step % self.log_every == 0:
                self._graph()
        elif self.mode == "lines" and (state.step % self.log_every == 0 or state.step == state.steps_per_epoch):
            print(f"epoch {state.epoch + 1}/{self.epochs} step {state.step}/{state.steps_per_epoch} "
                  f"loss {state.loss:.4f} lr {lr:.3e} {images_per_s:.0f} img/s", flush=True)

    def epoch_end(self, row: dict) -> None:
        self.val_losses.append((row["epoch"], row["val_loss"]))
        self.val_errors.append((row["epoch"], 1 - row["val_top1"] / 100))
        line = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in row.items() if k != "gates")
        if self.mode == "bar" and self.master is not None:
            self.master.write(line)
            if self.notebook:
                self._graph()
        elif self.mode == "lines":
            print(line, flush=True)

    def _graph(self) -> None:
        curves = [list(zip(*points)) if points else [[], []]
                  for points in (self.losses, self.val_losses, self.val_errors)]
        self.master.update_graph(curves)


def _write_logs(history: list[dict], output: Path) -> None:
    """log.jsonl (one JSON line per epoch) and log.csv, rewritten from the checkpointed history."""
    lines = "".join(json.dumps(row) + "\n" for row in history)
    (output / "log.jsonl.tmp").write_text(lines)
    os.replace(output / "log.jsonl.tmp", output / "log.jsonl")
    flat = [{**{k: v for k, v in row.items() if k != "gates"},
             **{f"gate_{i}": g for i, g in enumerate(row.get("gates", []))}} for row in history]
    with open(output / "log.csv.tmp", "w", newline="") as f:
        if flat:
            writer = csv.DictWriter(f, fieldnames=list(flat[-1]))
            writer.writeheader()
            writer.writerows(flat)
    os.replace(output / "log.csv.tmp", output / "log.csv")


# %%
#| export
def plot_history(history: list[dict]):
    """The curves of a run as a figure: loss with the learning rate of the schedule (right axis); top-1 and top-5
    of the model and its EMA; mean σ(λ) per layer."""
    epochs = [row["epoch"] for row in history]
    gates = [row["gates"] for row in history if row.get("gates")]
    fig = Figure(figsize=(11 if gates else 7.5, 3), dpi=80)
    axes = fig.subplots(1, 3 if gates else 2)
    axes[0].plot(epochs, [r["train_loss"] for r in history], "o-", label="train")
    axes[0].plot(epochs, [r["val_loss"] for r in history], "o-", label="val")
    axes[0].set(xlabel="epoch", ylabel="loss")
    schedule = axes[0].twinx()
    schedule.plot(epochs, [r["lr"] for r in history], ":", color="grey")
    schedule.set_ylabel("learning rate (dotted)", color="grey")
    for key in ("val_top1", "val_top5", "ema_top1", "ema_top5"):
        if key in history[0]:
            axes[1].plot(epochs, [r[key] for r in history], "o-", label=key)
    axes[1].set(xlabel="epoch", ylabel="accuracy (%)")
    if gates:
        for layer, values in enumerate(zip(*gates)):
            axes[2].plot(epochs[-len(gates):], values, label=f"layer {layer}")
        axes[2].set(xlabel="epoch", ylabel="mean σ(λ)", ylim=(0, 1))
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# %% [markdown]
# ## Stopping cleanly
#
# SLURM pre-empts or time-limits a job by sending SIGTERM, then SIGKILL a grace period later; Jupyter's
# *interrupt* sends SIGINT. Both only raise a flag here. The loop finishes the optimiser step it is in, sums the
# flag over ranks (so every process stops at the same step even when only one got the signal), writes a
# checkpoint and returns; `convit-edu train` then exits with status 0 and `--resume auto` continues. A loss
# that is not finite is handled in the same all-reduce: every rank raises `FloatingPointError` before the
# optimiser touches the weights, so the last checkpoint stays the last good state.

# %%
#| exporti
class _StopSignals:
    """Turn SIGTERM and SIGINT into a flag for the duration of a run (main thread only), then restore."""

    def __init__(self):
        self.received: str | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


# %% [markdown]
# ## Putting it together: `train`, piece by piece
#
# A run is built in the order that lets every bad input fail before any training work — the config was
# checked when it was made; then the output folder (writable?), the data (more processes than samples? a batch
# larger than a process's share?), the model and the resume checkpoint (the same model? the same global
# batch?) — and then advanced epoch by epoch. Each piece below is one function of a screen or less; `fit`, at
# the end, is the algorithm in one place.
#
# ### The data
#
# The datasets (the config's, or the caller's), the per-process batch and the global batch it implies, chapter
# 06's `build_loaders` for this process's share, and the batch mixing of the augmentation. The config's own
# datasets ship uint8 crops from the workers (`build_transforms(aug, on_device=True)`), and `finish_batch`
# normalises and erases each batch on the device with chapter 06's `DeviceTransforms`; a caller's datasets that
# already give float tensors pass through unchanged. The number of optimiser steps per epoch is what every
# process can take in step with the others. With `loader="dali"` (an ImageNet-style folder, the optional extra)
# chapter 06's `DaliLoaders` replaces `build_loaders`: DALI pipelines read the same files and ship the same uint8
# batches, and the same `finish_batch` completes them; its exact resume is the pipelines' own checkpoint, one
# per process, saved beside the sampler position under `dali` (so it resumes on as many processes as it ran).

# %%
#| exporti
@dataclass
class _Data:
    loaders: DataLoaders | DaliLoaders
    val_set: Dataset | Iterable  # a dataset, or this process's batches (the DALI loader's `val`)
    num_classes: int
    mixup: Any  # data.MixupCutmix or None
    finish: DeviceTransforms | None  # normalisation and erasing of the uint8 batches, on the device
    smoothing: float
    batch_size: int  # per process and micro-batch
    global_batch: int  # per optimiser step, over every process and micro-batch
    steps_per_epoch: int


def _build_data(cfg: TrainConfig, world: _World, datasets: tuple | None) -> _Data:
    aug = cfg.aug_config()
    if datasets is None:
        if aug is None:
            raise ValueError("aug None (no augmentation) needs datasets passed to train(); the config's own "
                             f"datasets need an augmentation ({', '.join(AUGMENTATIONS)})")
        train_tf, val_tf = build_transforms(aug, on_device=True) if cfg.loader == "torchvision" else (None, None)
        datasets = build_datasets(cfg.data, cfg.data_root, train_transform=train_tf, val_transform=val_tf,
                                  fraction=cfg.fraction, max_classes=cfg.classes, **cfg.data_args)
    elif cfg.loader == "dali":
        raise ValueError("loader 'dali' reads the config's own image folder (data_root): datasets passed to train() "
                         "need loader 'torchvision'")
    train_set, val_set, classes = datasets
    if len(classes) < 2:
        raise ValueError(f"the dataset has {len(classes)} class(es) ({', '.join(map(str, classes))}): a classifier "
                         "needs at least two (check --data-root, --classes)")
    batch_size = per_device_batch(cfg, world.world_size)
    share = math.ceil(len(train_set) / world.world_size)  # samples per process and epoch (RepeatAugSampler)
    steps = share // batch_size // cfg.accum_steps
    if steps == 0 and len(train_set) >= world.world_size:  # (fewer samples than processes: build_loaders says so)
        raise ValueError(
            f"each of the {world.world_size} processes gets {share} samples per epoch, fewer than one "
            f"optimiser step of batch {batch_size} × accum_steps {cfg.accum_steps}: lower the batch")
    if cfg.loader == "dali":
        loaders = DaliLoaders(train_set, val_set, aug, batch_size=batch_size, num_threads=max(1, cfg.num_workers),
                              num_replicas=world.world_size, rank=world.rank, seed=cfg.seed,
                              device_id=world.device.index if world.device.type == "cuda" else None)
        val_set = loaders.val
    else:
        loaders = build_loaders(train_set, val_set, batch_size=batch_size, num_workers=cfg.num_workers,
                                repeats=cfg.repeats, num_replicas=world.world_size, rank=world.rank, seed=cfg.seed)
    return _Data(loaders, val_set, len(classes), build_mixup(aug, len(classes)) if aug else None,
                 DeviceTransforms(aug) if aug else None, aug.label_smoothing if aug else 0.0, batch_size, batch_size * cfg.accum_steps * world.world_size,
                 steps)


# %% [markdown]
# ### The model, the teacher, and the resume checkpoint
#
# The initial weights are a function of the seed alone, the same on every process. A teacher (hard
# distillation, SM B) is built and frozen; the student then gets a distillation head. A checkpoint to resume
# from must hold the same model, at the same global batch (the schedule and the sampler depend on it); it may
# come from another number of processes, even mid-epoch: the sampler's position is a place in the epoch's one
# global stream, and each sample's augmentation is seeded by that place (chapter 06). Every process must see
# the checkpoint, or none: `--resume auto` is decided together (an all-reduce of "I see `last.pt`"), because
# processes that disagreed would wait forever for each other at the first collective.

# %%
#| export
def build_teacher(name: str, checkpoint: str | None, num_classes: int, img_size: int) -> nn.Module:
    """A frozen teacher: a convit_edu model or a torchvision classifier, with weights from `checkpoint`."""
    if name in list_models():
        teacher = create_model(name, num_classes=num_classes, img_size=img_size)
        if checkpoint:
            load_checkpoint(teacher, checkpoint)  # also reads our training checkpoints (their "model" entry)
    elif name in torchvision.models.list_models(module=torchvision.models):
        teacher = torchvision.models.get_model(name, num_classes=num_classes)
        if checkpoint:
            teacher.load_state_dict(read_state_dict(checkpoint))
    else:
        raise ValueError(f"unknown teacher {name!r}: give a convit_edu model ({', '.join(list_models())}) or a "
                         "torchvision classifier (e.g. regnet_y_16gf, resnet50)")
    return teacher.eval().requires_grad_(False)


# %%
#| exporti
def _build_models(cfg: TrainConfig, world: _World, data: _Data, model: nn.Module | None,
                  teacher: nn.Module | None) -> tuple[nn.Module, nn.Module | None]:
    torch.manual_seed(cfg.seed)  # the initial weights are a function of the seed, identical on every rank
    if teacher is None and cfg.distill_teacher:
        teacher = build_teacher(cfg.distill_teacher, cfg.teacher_checkpoint, data.num_classes, cfg.img_size)
    if model is None:
        model = VisionTransformer(cfg.model_config(data.num_classes, distilled=teacher is not None))
    return model.to(world.device), teacher.to(world.device).eval() if teacher is not None else None


def _resume_checkpoint(cfg: TrainConfig, world: _World, output: Path) -> tuple[dict | None, Path | None]:
    if cfg.resume is None:
        return None, None
    path = output / "last.pt" if cfg.resume == "auto" else Path(cfg.resume)
    seen = int(_all_reduce(torch.tensor(float(path.exists()), device=world.device)).item())
    if 0 < seen < world.world_size:  # every process must take the same decision, or the first collective hangs
        raise ValueError(f"{seen} of {world.world_size} processes see {path}: put --output (and the checkpoint) on a "
                         "file system that every node shares")
    if cfg.resume == "auto" and not seen:
        if world.main:
            print(f"resume auto: no {path} yet, starting from scratch", flush=True)
        return None, None
    return read_checkpoint(path), path


_RESUME_MAY_CHANGE = {  # settings a resumed run may change without changing what it computes (the global batch,
    # which batch_size, accum_steps and global_batch set together, is checked on its own)
    "epochs", "num_workers", "batch_size", "accum_steps", "global_batch", "compile", "device", "output", "resume",
    "ckpt_every", "log_every", "progress", "eval_every"}


def _check_resume(ckpt: dict, path: Path, cfg: TrainConfig, model: nn.Module, data: _Data) -> None:
    saved, now = asdict(TrainConfig.from_dict(ckpt["config"])), asdict(cfg)
    changed = [f"{k} {saved[k]!r} -> {now[k]!r}" for k in now if k not in _RESUME_MAY_CHANGE and saved[k] != now[k]]
    if changed:
        raise ValueError(f"checkpoint {path} was trained with other settings ({'; '.join(changed)}): resuming would "
                         "not continue the same run; resume with the checkpoint's settings or start a new --output")
    own, theirs = model.state_dict(), ckpt["model"]
    wrong = sorted(set(own) ^ set(theirs)) + [k for k in own if k in theirs and own[k].shape != theirs[k].shape]
    if wrong:
        k = wrong[0]
        detail = (f"{tuple(theirs[k].shape)} there, {tuple(own[k].shape)} here" if k in own and k in theirs
                  else "missing " + ("there" if k in own else "here"))
        raise ValueError(f"checkpoint {path} does not fit this model ({len(wrong)} tensors differ, first {k}: "
                         f"{detail}): same --model but other sizes or classes?")
    if ckpt["global_batch"] != data.global_batch:
        raise ValueError(f"checkpoint {path} was trained with global batch {ckpt['global_batch']}, this run has "
                         f"{data.global_batch}: keep batch_size × accum_steps × world size equal to resume")


# %% [markdown]
# ### The optimisation
#
# AdamW over the two parameter groups, the DeiT schedule as a `LambdaLR` (the optimiser's own rate is 1, so the
# lambda *is* the learning rate), the fp16 loss scaler (a no-op in other precisions), the EMA of the weights,
# and the wrappers: DDP for several processes and `torch.compile` when asked. The hooks see the bare model.

# %%
#| exporti
@dataclass
class _Optimisation:
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    ema: AveragedModel | None


def _build_optimisation(cfg: TrainConfig, model: nn.Module, data: _Data, precision: str,
                        device: torch.device) -> _Optimisation:
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=1.0, fused=device.type == "cuda")
    peak, total = scaled_lr(cfg.lr, data.global_batch), data.steps_per_epoch * cfg.epochs
    warmup = round(cfg.warmup_epochs * data.steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda t: deit_lr(t, total, warmup, peak, cfg.min_lr, cfg.warmup_lr))
    ema = AveragedModel(model, use_buffers=True) if cfg.ema_decay else None  # updated by `_update_ema`
    return _Optimisation(optimizer, scheduler, torch.amp.GradScaler(device.type, enabled=precision == "fp16"), ema)


def _wrap(cfg: TrainConfig, model: nn.Module, world: _World) -> tuple[nn.Module, nn.Module]:
    """The model in DDP when there are several processes, and what the loop calls: that, compiled when asked."""
    ddp = (DistributedDataParallel(model, device_ids=[world.device] if world.device.type == "cuda" else None)
           if world.world_size > 1 else model)
    return ddp, torch.compile(ddp) if cfg.compile else ddp


# %% [markdown]
# ### A run, and restoring one
#
# `_Run` holds what the pieces built. `_start` builds them in order; restoring a checkpoint loads the weights
# before the optimiser and the EMA are made (the EMA starts as a copy of the model), then everything else —
# optimiser, schedule, scaler, EMA, position, log, best score and every generator's state.

# %%
#| exporti
@dataclass
class _Run:
    cfg: TrainConfig
    world: _World
    output: Path
    precision: str
    data: _Data
    model: nn.Module  # the bare model: what the hooks see and checkpoints hold
    teacher: nn.Module | None
    ddp: nn.Module  # the model in DDP with several processes, else the model
    forward: nn.Module  # what the loop calls: `ddp`, compiled when asked
    opt: _Optimisation
    state: TrainState
    callbacks: list[Callback]
    best_top1: float = -1.0
    unread: list[torch.Tensor] = field(default_factory=list)  # (loss, non-finite) of each step not read back yet


def _start(cfg: TrainConfig, world: _World, model, datasets, teacher, callbacks) -> _Run:
    output, precision = Path(cfg.output), resolve_precision(cfg.precision, world.device)
    if world.main:
        _check_output(output)
    data = _build_data(cfg, world, datasets)
    model, teacher = _build_models(cfg, world, data, model, teacher)
    ckpt, path = _resume_checkpoint(cfg, world, output)
    if ckpt is not None:
        _check_resume(ckpt, path, cfg, model, data)
        model.load_state_dict(ckpt["model"])
    opt = _build_optimisation(cfg, model, data, precision, world.device)
    state = TrainState(cfg, model, opt.optimizer, world.rank, world.world_size, data.steps_per_epoch)
    run = _Run(cfg, world, output, precision, data, model, teacher, *_wrap(cfg, model, world), opt, state,
               list(callbacks))
    if ckpt is not None:
        _restore(run, ckpt, path)
    if world.main:
        _write_run_info(run, path)
    return run


def _restore(run: _Run, ckpt: dict, path: Path) -> None:
    opt, s = run.opt, run.state
    opt.optimizer.load_state_dict(ckpt["optimizer"])
    opt.scheduler.load_state_dict(ckpt["scheduler"])
    opt.scaler.load_state_dict(ckpt["scaler"])
    if opt.ema is not None and ckpt["ema"] is not None:
        opt.ema.load_state_dict(ckpt["ema"])
    s.epoch, s.step, s.global_step = ckpt["epoch"], ckpt["step"], ckpt["global_step"]
    s.epoch_losses, s.history, run.best_top1 = ckpt["epoch_losses"], ckpt["history"], ckpt["best_top1"]
    s.pending, s.seconds = ckpt.get("pending"), ckpt.get("seconds", 0.0)  # (earlier versions have neither)
    _set_rng_states(ckpt["rng"])
    if isinstance(run.data.loaders, DaliLoaders):
        if len(ckpt["dali"]) != run.world.world_size:
            raise ValueError(f"checkpoint {path} holds the DALI pipelines of {len(ckpt['dali'])} process(es): loader "
                             f"'dali' resumes with as many processes (each reads its own shard), not "
                             f"{run.world.world_size}")
        run.data.loaders.restore(ckpt["dali"][run.world.rank])
    if run.world.main:
        print(f"resumed from {path}: epoch {s.epoch + 1}, step {s.step}/{run.data.steps_per_epoch}", flush=True)


# %% [markdown]
# ### What a run writes
#
# `run.json` (the config, the world, the batch sizes, the learning rate, the versions, the command line) when
# the run starts, and a line in `invocations.jsonl` every time it is started or resumed (so a run extended with
# more epochs, or resumed on another number of GPUs, keeps the record of each start); and checkpoints: `last.pt`
# at every epoch end and every `ckpt_every` steps, `best.pt` when the top-1 improved. Only rank 0 writes. No
# checkpoint ever holds non-finite weights: a step can turn the weights to NaN while its loss was still finite,
# and saving them would make the "last good checkpoint" a bad one, so `_checkpoint` refuses them on every
# process and says which file is the last good one (if any). A resumed run must be the same run: every setting
# that changes what it computes (data, fraction, classes, seed, augmentation, model, optimisation) must match
# the checkpoint's, and the message lists each difference; more epochs, other logging or workers, another
# device or number of processes (at the same global batch) are fine.

# %%
#| exporti
def _check_output(output: Path) -> None:
    """The run folder exists and is writable; temporary files that a killed run left behind are removed."""
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / ".write-test"
        probe.write_text("ok")
        probe.unlink()
        for stale in output.glob("*.tmp"):  # a checkpoint or log write that was killed before its rename
            stale.unlink()
    except OSError as e:
        raise ValueError(f"output directory {output} is not writable ({e.strerror}): choose another --output") from None


def _write_run_info(run: _Run, resumed_from: Path | None) -> None:
    """`run.json` when the run starts (a resumed run keeps it), and one line per start in `invocations.jsonl`."""
    d = run.data
    info = {"config": asdict(run.cfg), "world_size": run.world.world_size, "batch_size": d.batch_size,
            "global_batch": d.global_batch, "scaled_lr": scaled_lr(run.cfg.lr, d.global_batch),
            "steps_per_epoch": d.steps_per_epoch, "device": str(run.world.device), "precision": run.precision,
            "seed": run.cfg.seed, "versions": _versions(), "command": sys.argv}
    if resumed_from is None:
        (run.output / "run.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resumed_from": resumed_from, **info}
    with open(run.output / "invocations.jsonl", "a") as f:
        f.write(json.dumps(line, default=str) + "\n")


def _last_good(run: _Run) -> str:
    path = run.output / "last.pt"
    return f"{path} is the last good checkpoint" if path.exists() else "no checkpoint was written yet"


def _versions() -> dict[str, str]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "convit_edu": convit_edu.__version__}


def _checkpoint(run: _Run, name: str = "last.pt") -> None:
    s, opt, d = run.state, run.opt, run.data
    weights = run.model.state_dict()
    floats = {k: t for k, t in weights.items() if t.is_floating_point()}
    if not bool(torch.stack([torch.isfinite(t).all() for t in floats.values()]).all()):  # one wait for the device
        bad = [k for k, t in floats.items() if not bool(torch.isfinite(t).all())]
        raise FloatingPointError(  # every process holds the same weights, so every process stops here
            f"the weights became non-finite ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}) by "
            f"optimiser step {s.global_step} and were not saved; {_last_good(run)}: lower --lr, set --clip-grad, "
            "or use bf16/fp32 instead of fp16")
    dali = _dali_states(run)
    if not run.world.main:
        return
    save_checkpoint({
        "format": CHECKPOINT_FORMAT, "config": asdict(run.cfg), "model": weights,
        "optimizer": opt.optimizer.state_dict(), "scheduler": opt.scheduler.state_dict(),
        "scaler": opt.scaler.state_dict(), "ema": opt.ema.state_dict() if opt.ema is not None else None,
        "epoch": s.epoch, "step": s.step, "global_step": s.global_step,
        "sampler": {"epoch": s.epoch, "start": s.step * run.cfg.accum_steps * d.batch_size},
        "dali": dali, "world_size": run.world.world_size, "global_batch": d.global_batch, "rng": _rng_states(),
        "epoch_losses": s.epoch_losses, "history": s.history, "pending": s.pending, "best_top1": run.best_top1,
        "seconds": s.seconds,
        "num_classes": d.num_classes,
    }, run.output / name)


def _dali_states(run: _Run) -> list[bytes] | None:
    """Every process's DALI pipeline state (rank order), gathered to all: each process reads its own shard."""
    if not isinstance(run.data.loaders, DaliLoaders):
        return None
    states = [run.data.loaders.state()] * run.world.world_size
    if run.world.world_size > 1:
        dist.all_gather_object(states, states[0])
    return states


# %% [markdown]
# ### One optimiser step
#
# `accum_steps` micro-batches, each mixed (MixUp/CutMix) and run under autocast; DDP synchronises the gradients
# on the last one only. The step's loss and whether it was finite stay **on the device**: reading a number back
# (`.item()`, `.tolist()`) makes the CPU wait for the GPU to finish everything queued, and a GPU that waits for
# the CPU to queue the next step idles. So the loop reads back once per logging interval (`log_every` steps,
# the end of an epoch, a checkpoint or a stop): one all-reduce carries, for every process at once, the losses of
# the steps since the last read-back, whether each was finite, and whether a stop signal arrived, so that every
# process takes the same decision at the same step. The price: a non-finite loss is noticed up to `log_every`
# steps late, after the optimiser has used it — which is why checkpoints refuse non-finite weights and the
# error names the last good checkpoint.

# %%
#| exporti
def _micro_batches(run: _Run, batches) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward over `accum_steps` micro-batches; (local mean loss, non-finite flag) as tensors."""
    cfg, d, losses = run.cfg, run.data, []
    for micro in range(cfg.accum_steps):
        images, labels = next(batches)
        images, targets = images.to(run.world.device, non_blocking=True), labels.to(run.world.device, non_blocking=True)
        images = finish_batch(images, d.finish, train=True)
        if d.mixup is not None:
            images, targets = d.mixup(images, targets)
        sync = micro == cfg.accum_steps - 1 or run.ddp is run.model
        with contextlib.nullcontext() if sync else run.ddp.no_sync():
            with autocast(run.world.device, run.precision):
                teacher_logits = None
                if run.teacher is not None:
                    with torch.no_grad():
                        teacher_logits = run.teacher(images)
                loss = train_loss(run.forward(images), targets, teacher_logits, d.smoothing)
            run.opt.scaler.scale(loss / cfg.accum_steps).backward()
        losses.append(loss.detach().float())
    loss = torch.stack(losses).mean()
    return loss, (~torch.isfinite(loss)).float()


def _optimiser_step(run: _Run, batches, epoch: int, step: int) -> None:
    """One optimiser step; its loss stays on the device until `_read_back`."""
    cfg, s, opt, world = run.cfg, run.state, run.opt, run.world
    _seed_step(cfg.seed, world.rank, epoch, step)
    run.unread.append(torch.stack(_micro_batches(run, batches)))
    if cfg.clip_grad:
        opt.scaler.unscale_(opt.optimizer)
        nn.utils.clip_grad_norm_(run.model.parameters(), cfg.clip_grad)
    opt.scaler.step(opt.optimizer)
    opt.scaler.update()
    opt.optimizer.zero_grad(set_to_none=True)
    opt.scheduler.step()
    if opt.ema is not None:
        _update_ema(opt.ema, run.model, cfg.ema_decay, first=s.global_step == 0)
    s.step, s.global_step = step + 1, s.global_step + 1


def _update_ema(ema: AveragedModel, model: nn.Module, decay: float, first: bool) -> None:
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


def _read_back(run: _Run, signals: _StopSignals) -> bool:
    """The one host sync of a logging interval: the losses of the steps since the last one, summed over the
    processes with the stop signals they received; raises on a non-finite loss. Returns whether any process
    received a signal."""
    s, world = run.state, run.world
    received = torch.tensor([[float(signals.received is not None), 0.0]], device=world.device)
    *steps, (signalled, _) = _all_reduce(torch.cat([*[t[None] for t in run.unread], received])).tolist()
    run.unread.clear()
    for i, (loss_sum, bad_ranks) in enumerate(steps):
        if bad_ranks:
            at = s.step - len(steps) + i + 1
            raise FloatingPointError(
                f"non-finite loss ({loss_sum / world.world_size}) at epoch {s.epoch + 1}, step {at} (global step "
                f"{s.global_step - len(steps) + i + 1}) on {bad_ranks:.0f} of {world.world_size} process(es), "
                f"read back {len(steps) - i - 1} step(s) later (losses are read every log_every steps); the weights "
                f"were not saved; {_last_good(run)}: lower --lr, set --clip-grad, or use bf16/fp32 instead of fp16")
    s.epoch_losses += [loss_sum / world.world_size for loss_sum, _ in steps]
    s.loss = s.epoch_losses[-1] if steps else s.loss
    return bool(signalled)


# %% [markdown]
# ### One epoch, and its end
#
# An epoch starts the sampler at this process's position (mid-epoch after a resume) and runs optimiser steps
# until the epoch is done or a stop is asked for (a signal on any process, or a hook's `state.stop`), writing
# `last.pt` every `ckpt_every` steps. Its end first checkpoints — so that a signal during a long evaluation
# (an ImageNet pass takes minutes) loses nothing: the checkpoint keeps the epoch's training numbers as
# `pending`, and a run resumed from it evaluates that epoch first — then evaluates the model (and the EMA),
# appends the row to the log, rewrites the log files, and checkpoints again: `best.pt` first when the top-1
# improved, then `last.pt`, which records the best score. In that order a kill at any moment leaves a `last.pt`
# and a `best.pt` that agree: killed while `best.pt` is written, the resumed run re-evaluates the epoch and
# writes it again.

# %%
#| exporti
def _why(signals: _StopSignals, signalled: bool) -> str:
    return (signals.received or "a signal to another process") if signalled else "callback"


def _run_epoch(run: _Run, epoch: int, progress: _Progress, signals: _StopSignals) -> tuple[str | None, int, float]:
    """Optimiser steps until the epoch ends or a stop is asked for: (why it stopped or None, images, seconds)."""
    cfg, s, d = run.cfg, run.state, run.data
    s.epoch = epoch
    batches = d.loaders.epoch(epoch, start=s.step * cfg.accum_steps * d.batch_size)
    run.model.train()
    t0, images = time.perf_counter(), 0
    for step in progress.steps_of(range(s.step, d.steps_per_epoch)):
        _optimiser_step(run, batches, epoch, step)
        images += d.global_batch
        for cb in run.callbacks:
            cb.on_step_end(s)
        checkpoint = bool(cfg.ckpt_every) and s.global_step % cfg.ckpt_every == 0
        if not (s.step % cfg.log_every == 0 or s.step == d.steps_per_epoch or s.stop or checkpoint):
            continue  # no host sync: the device runs ahead
        signalled = _read_back(run, signals)
        progress.step(s, run.opt.optimizer.param_groups[0]["lr"], images / (time.perf_counter() - t0))
        if signalled or s.stop:
            return _why(signals, signalled), images, time.perf_counter() - t0
        if checkpoint:
            _checkpoint(run)
    return None, images, time.perf_counter() - t0


def _end_epoch(run: _Run, epoch: int, images: int, seconds: float, progress: _Progress) -> None:
    """Checkpoint the finished epoch; when it is evaluated (every `eval_every` epochs and the last), checkpoint it
    before its (possibly long) evaluation, then evaluate it."""
    s = run.state
    row = {"epoch": epoch + 1, "step": s.global_step, "train_loss": sum(s.epoch_losses) / max(1, len(s.epoch_losses)),
           "lr": run.opt.optimizer.param_groups[0]["lr"], "images_per_s": images / seconds, "epoch_time_s": seconds}
    s.epoch, s.step, s.epoch_losses, s.seconds = epoch + 1, 0, [], s.seconds + seconds
    if s.epoch % run.cfg.eval_every and s.epoch < run.cfg.epochs:  # not evaluated: no row
        _checkpoint(run)
        for cb in run.callbacks:
            cb.on_epoch_end(s)
        return
    s.pending = row
    _checkpoint(run)
    _evaluate_epoch(run, progress)


def _evaluate_epoch(run: _Run, progress: _Progress) -> None:
    """Score the pending epoch and log it; save `best.pt` first when the top-1 improved, then `last.pt` — so that
    a stop or a kill at any moment leaves a `last.pt` whose best score is the one `best.pt` holds."""
    s, t0 = run.state, time.perf_counter()
    row = {**s.pending, **_scores(run)}
    s.seconds += time.perf_counter() - t0
    row["time_s"] = s.seconds
    s.history.append(row)
    s.pending = None
    progress.epoch_end(row)
    improved = row["val_top1"] > run.best_top1
    if improved:
        run.best_top1 = row["val_top1"]
        _checkpoint(run, "best.pt")
    if run.world.main:
        _write_logs(s.history, run.output)
    _checkpoint(run)
    for cb in run.callbacks:
        cb.on_epoch_end(s)


def _scores(run: _Run) -> dict:
    """Validation loss, top-1 and top-5 of the model (and of its EMA), and the mean gate σ(λ) of each layer."""
    world = run.world
    models = {"val": run.model, **({"ema": run.opt.ema.module} if run.opt.ema is not None else {})}
    # inference keeps no activations for a backward pass: twice the training batch fits, with the run's workers
    result = evaluate(models, run.data.val_set, batch_size=2 * run.data.batch_size, device=world.device,
                      precision=run.precision, num_workers=run.cfg.num_workers, rank=world.rank,
                      world_size=world.world_size, finish=run.data.finish)
    scores = {f"{name}_{key}": value for name, metrics in result.items() for key, value in metrics.items()}
    return {**scores, "gates": gate_means(run.model)}


# %% [markdown]
# ### `fit`: the algorithm
#
# Epoch after epoch: run the epoch; if it was stopped before its last step, checkpoint where it is and
# return; otherwise end the epoch, and return there if a stop was asked for meanwhile. Then the hooks' last
# call, the curves, and what happened.

# %%
#| exporti
def _fit(run: _Run) -> TrainResult:
    cfg, s, world = run.cfg, run.state, run.world
    progress = _Progress(cfg.progress if world.main else "none", cfg.epochs, cfg.log_every)
    for cb in run.callbacks:
        cb.on_train_begin(s)
    stopped = None
    with _StopSignals() as signals:
        if s.pending is not None:  # resumed from a checkpoint written before its epoch was evaluated
            _evaluate_epoch(run, progress)
        for epoch in progress.epochs_of(range(s.epoch, cfg.epochs)):
            stopped, images, seconds = _run_epoch(run, epoch, progress, signals)
            if stopped and s.step < run.data.steps_per_epoch:
                _checkpoint(run)
                break
            _end_epoch(run, epoch, images, seconds, progress)
            signalled = _all_reduce(torch.tensor(float(signals.received is not None), device=world.device)).item()
            if stopped or signalled or s.stop:
                stopped = stopped or _why(signals, bool(signalled))
                break
    for cb in run.callbacks:
        cb.on_train_end(s)
    if world.main:
        if s.history:
            plot_history(s.history).savefig(run.output / "curves.png")
        if stopped:
            print(f"stopped by {stopped} at epoch {s.epoch + 1}, step {s.step}: checkpoint "
                  f"{run.output / 'last.pt'}; continue with --resume auto", flush=True)
    ema = run.opt.ema.module if run.opt.ema is not None else None
    return TrainResult(run.model, ema, s.history, run.output, stopped)


# %% [markdown]
# And the one public entry point, for notebooks and the command line alike:

# %%
#| export
def train(cfg: TrainConfig, *, model: nn.Module | None = None, datasets: tuple | None = None,
          teacher: nn.Module | None = None, callbacks: Sequence[Callback] = ()) -> TrainResult:
    """Train as `cfg` says, on one process or under `torchrun`; the single entry point of notebook and CLI.

    By default the model is `cfg.model` with `cfg.model_args` and the data `build_datasets(cfg.data)` with the
    augmentation `cfg.aug`; pass `model`, `datasets` = (train, val, class names) or `teacher` to use your own.
    Returns when the last epoch is done, or early (with a checkpoint) on SIGTERM/SIGINT or `state.stop`.
    """
    world = _init_world(cfg.device)
    try:
        return _fit(_start(cfg, world, model, datasets, teacher, callbacks))
    finally:
        if world.owns_group:
            dist.destroy_process_group()


# %% [markdown]
# ## A real run on the CPU
#
# A small ConViT — the width and heads of ConViT-Ti (192, 4 heads of 48), but 4 blocks of which the first 3
# are GPSA — on half the images of 10 classes of the shared Tiny ImageNet subset (64 × 64 photographs, cut
# into 8 × 8 patches: an 8 × 8 grid), with DeiT's augmentation, for 3 epochs. Without the subset (a user's
# machine) it falls back to synthetic images. In a notebook you see a fastprogress bar
# and the live loss curve; in a terminal the same run prints one line per `log_every` steps.

# %%
# NBVAL_IGNORE_OUTPUT
from convit_edu.data import extract_subset
from convit_edu.training import TrainConfig, plot_history, train

ARCHIVE = Path("../../shared/data/tiny-imagenet-100.tar.gz")
RUNS = Path("runs")  # nbs/runs/ is ignored by git
if ARCHIVE.exists():
    root = extract_subset(ARCHIVE, Path("../data/tiny-imagenet-100-first10"), max_classes=10)
    data = dict(data="imagefolder", data_root=str(root))
else:
    data = dict(data="fake", data_args={"num_train": 5000, "num_val": 500, "num_classes": 10, "image_size": 64})
small_convit = dict(model="convit_tiny", img_size=64,
                    model_args={"patch_size": 8, "depth": 4, "local_up_to_layer": 3})
run_cfg = TrainConfig(**small_convit, **data, epochs=1 if FAST else 3, fraction=0.1 if FAST else 0.5,
                      batch_size=64, lr=2e-3, warmup_epochs=0.5, drop_path_rate=0.1, num_workers=2, seed=0, output=str(RUNS / "convit-tiny-imagenet10"),
                      log_every=10)
print(run_cfg)

# %%
# NBVAL_IGNORE_OUTPUT
import shutil

shutil.rmtree(run_cfg.output, ignore_errors=True)
result = train(run_cfg)

# %% [markdown]
# The run left its record beside the checkpoints: `run.json` (config, world size, global batch, scaled lr,
# versions, seed), one JSON line per epoch in `log.jsonl` and the same in `log.csv`, `last.pt` and `best.pt`,
# and `curves.png`:

# %%
out = Path(run_cfg.output)
print(sorted(p.name for p in out.iterdir()))
info = json.loads((out / "run.json").read_text())
print({k: info[k] for k in ("world_size", "batch_size", "global_batch", "scaled_lr")})
assert info["global_batch"] == 64 and info["scaled_lr"] == 2e-3 * 64 / 512 and info["precision"] == "fp32"
rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
assert len(rows) == run_cfg.epochs and rows == result.history
assert len(rows[-1]["gates"]) == 3  # one mean σ(λ) per GPSA layer

# %%
# NBVAL_IGNORE_OUTPUT
for row in rows:
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items() if k != "gates"},
          "σ(λ):", [round(g, 3) for g in row["gates"]])
plot_history(rows)


# %% [markdown]
# ## Checked: stopping anywhere and resuming changes nothing
#
# The claim of this chapter, on a smaller ConViT (2 blocks, the first one GPSA, 16 × 16 synthetic images,
# with Mixup/CutMix, RandAugment, random erasing, drop path, an EMA and gradient accumulation — every source
# of randomness the recipe has). Run A trains 2 epochs straight. Run B is stopped by a hook in the middle of
# the first epoch (the same path as a SIGTERM), and run C resumes it with `resume="auto"`. With fp32 on the
# CPU and `num_workers=0`, C ends with weights *bit-identical* to A's: `torch.equal`, not `allclose`.
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

from convit_edu.training import Callback, read_checkpoint


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
# which records the mean σ(λ) of each GPSA layer after every optimiser step (`gate_means`, also logged per
# epoch). Here on the tiny ConViT of the previous section:

# %%
from convit_edu.training import gate_means


class RecordGates(Callback):
    def __init__(self):
        self.steps, self.gates = [], []

    def on_step_end(self, state):
        self.steps.append(state.global_step)
        self.gates.append(gate_means(state.model))


recorder = RecordGates()
train(replace(tiny, output=str(tmp / "hooks"), epochs=1), callbacks=[recorder])
assert len(recorder.gates) == 6 and all(len(g) == 1 and 0 < g[0] < 1 for g in recorder.gates)
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


from convit_edu.data import build_datasets, build_transforms

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
# `convit-edu train` command of chapter 08 — runs as
#
# ```bash
# convit-edu train ...                                          # one process: the CPU or one GPU
# torchrun --nproc_per_node=8 -m convit_edu.cli train ...       # one node, 8 GPUs (NCCL)
# torchrun --nnodes=4 --nproc_per_node=8 --rdzv-backend=c10d \
#     --rdzv-endpoint=$HEAD_NODE:29500 -m convit_edu.cli train ... # 4 nodes (run on each node)
# srun torchrun ... -m convit_edu.cli train ...                 # the same under SLURM (chapter 08)
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
