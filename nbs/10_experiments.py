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
# # The paper's experiments in miniature: sample efficiency and ablations
#
# Table 2 of the paper is its central claim: the soft convolutional prior of the ConViT pays most when data is
# scarce. ConViT-S and DeiT-S are trained on a fraction f of the images of each ImageNet class, for 300/f
# epochs so that both see the same number of images; the relative gain of the ConViT grows from 2 % at f = 1 to
# 37 % at f = 5 %. Table 3 takes the ConViT apart (gating, convolutional initialization, training the GPSA at
# all) and Appendix A replaces GPSA by plain positional self-attention (PSA).
#
# Those runs cost hundreds of GPU-days. This chapter builds the machinery that runs them at any scale —
# a grid of runs becomes `convit-edu train` command lines (plain `python` here, `torchrun` on a cluster), their
# JSON-lines logs become tables and figures in the paper's style — and then runs a version small enough for a
# 2-core CPU, designed so that it *can* show the effect, with one command that reproduces it on any
# ImageNet-style folder (`convit-edu experiment`). It reads the committed results under
# `nbs/results/sample-efficiency/` instead of retraining; in FAST mode and in full it runs a tiny grid end to
# end through that command to prove the pipeline.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp experiments

# %%
# %matplotlib inline
import json
import shlex
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from convit_edu.training import scaled_lr

torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## A run is a folder name and a set of flags
#
# Every setting of `convit-edu train` is a field of `TrainConfig` or of the model's `ModelConfig`, and every
# field is a flag (`--embed-dim 64`, `--freeze-gating`, `--no-use-local-init`; chapter 08). So a run of an
# experiment is just a name and a dictionary of flags, and a grid is a list of them. Turning one into a shell
# command is the only thing that has to be right: booleans become `--flag` / `--no-flag`, `None` becomes
# `none`, dataset arguments become `--data-arg KEY=VALUE`, and the run writes into `RESULTS/NAME`.

# %%
#| export
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunSpec:
    """One training run of a grid: its folder ``name``, a human ``label`` for tables and legends, and the
    ``convit-edu train`` flags (``TrainConfig`` and ``ModelConfig`` field names) that make it."""

    name: str
    label: str
    flags: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name != self.name.strip():
            raise ValueError(f"run name {self.name!r} must be a non-empty folder name without '/' or spaces around it")
        if "output" in self.flags:
            raise ValueError(f"run {self.name!r}: do not set 'output' in its flags; train_command puts the run in "
                             "RESULTS/NAME")


def _flag_words(key: str, value: Any) -> list[str]:
    if key == "data_args":
        if not isinstance(value, dict):
            raise TypeError(f"data_args must be a dict of dataset arguments, got {value!r}")
        return [word for k, v in value.items() for word in ("--data-arg", f"{k}={v}")]
    flag = "--" + key.replace("_", "-")
    if isinstance(value, bool):
        return [flag] if value else ["--no-" + key.replace("_", "-")]
    if value is None:
        return [flag, "none"]
    if isinstance(value, tuple):  # a range such as RandomResizedCrop's scale: one word per number
        return [flag, *map(str, value)]
    if isinstance(value, (dict, list)):
        raise TypeError(f"flag {key!r} must be a number, string, bool, tuple or None, got {value!r}")
    return [flag, str(value)]


def train_command(spec: RunSpec, results: str | Path, launcher: str = "python -m convit_edu.cli") -> str:
    """The shell command that trains ``spec`` into ``results/spec.name``.

    ``launcher`` runs the CLI: ``python -m convit_edu.cli`` (or ``convit-edu``) on one machine,
    ``torchrun --nproc_per_node=8 -m convit_edu.cli`` on a GPU node; environment assignments may lead it
    (``OMP_NUM_THREADS=1 python -m convit_edu.cli``).
    """
    words = shlex.split(launcher) + ["train"]
    for key, value in spec.flags.items():
        words += _flag_words(key, value)
    words += ["--output", str(Path(results) / spec.name)]
    return " ".join(shlex.quote(w) for w in words)


# %% [markdown]
# A ConViT with 4 heads on 10 classes, as a command:

# %%
spec = RunSpec("demo", "ConViT", {"model": "convit_tiny", "classes": 10, "use_local_init": False, "ema_decay": None,
                                  "data_args": {"num_train": 64}})
print(train_command(spec, "nbs/results/demo"))
assert train_command(spec, "out").split()[4:] == [
    "--model", "convit_tiny", "--classes", "10", "--no-use-local-init", "--ema-decay", "none",
    "--data-arg", "num_train=64", "--output", "out/demo"]

# %% [markdown]
# The command line parser of chapter 08 must read it back into exactly the configuration we meant; parsing
# it with the real parser (without training) checks that every flag exists and lands in the right field:

# %%
from convit_edu.cli import build_parser

args = build_parser().parse_args(shlex.split(train_command(spec, "out"))[3:])
print({k: v for k, v in vars(args).items() if k in ("model", "classes", "model.use_local_init", "ema_decay", "data_arg")})
assert (args.model, args.classes, vars(args)["model.use_local_init"], args.ema_decay) == ("convit_tiny", 10, False, None)

# %% [markdown]
# ## The grids: Table 2 and Table 3 at any scale
#
# What the runs of one experiment share is a **scale**: the ConViT and the DeiT compared, the architecture
# overrides, the flags common to every run, and the training length at f = 1. Table 2 then varies the fraction
# f, multiplying epochs (and the warm-up, so that the schedule has the same shape in steps) by 1/f:
# `data.scaled_epochs`. Table 3 and Appendix A vary the ConViT's switches at one fraction. Each ablation has
# a name that says what it changes (the runs' folders are named after it); the paper's row letter is kept
# as a label:
#
# | name | Table 3 | train gating | conv init | train GPSA | use GPSA | model and `ModelConfig` switches |
# |---|---|---|---|---|---|---|
# | `convit` | a | ✓ | ✓ | ✓ | ✓ | the ConViT |
# | `frozen_gate` | b | ✗ | ✓ | ✓ | ✓ | `freeze_gating` (λ = 0, σ = ½) |
# | `no_conv_init` | c | ✓ | ✗ | ✓ | ✓ | `use_local_init=False` |
# | `frozen_gate_no_conv_init` | d | ✗ | ✗ | ✓ | ✓ | both |
# | `deit` | e | ✗ | ✗ | ✗ | ✗ | the DeiT of the same size |
# | `frozen_gpsa` | f | ✗ | ✓ | ✗ | ✓ | `freeze_gpsa` |
# | `frozen_gpsa_no_conv_init` | g | ✗ | ✗ | ✗ | ✓ | `freeze_gpsa`, `use_local_init=False` |
# | `psa` | App. A | — | ✓ | ✓ | ✓ | `local_attention="psa"` (Eq. 4, no gate) |

# %%
#| export
from dataclasses import dataclass, field
from typing import Any

import math

from convit_edu.checks import one_of, positive_int
from convit_edu.data import check_fraction, scaled_epochs


@dataclass(frozen=True)
class Ablation:
    """One run of Table 3 or App. A: ``table_ref``, its row in the paper ("a".."g", "App. A"), a ``label`` for
    tables and legends, the ``model`` of a ``Scale`` it trains ("convit" or "deit") and the ``ModelConfig``
    ``switches`` set on top of it."""

    table_ref: str
    label: str
    model: str = "convit"
    switches: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        one_of("ablation model", self.model, ("convit", "deit"))


ABLATIONS: dict[str, Ablation] = {  # Table 3 and App. A, by name
    "convit": Ablation("a", "ConViT"),
    "frozen_gate": Ablation("b", "frozen gate", switches={"freeze_gating": True}),
    "no_conv_init": Ablation("c", "no conv init", switches={"use_local_init": False}),
    "frozen_gate_no_conv_init": Ablation("d", "frozen gate, no conv init",
                                         switches={"freeze_gating": True, "use_local_init": False}),
    "deit": Ablation("e", "DeiT", model="deit"),
    "frozen_gpsa": Ablation("f", "frozen GPSA", switches={"freeze_gpsa": True}),
    "frozen_gpsa_no_conv_init": Ablation("g", "frozen GPSA, no conv init",
                                         switches={"freeze_gpsa": True, "use_local_init": False}),
    "psa": Ablation("App. A", "PSA", switches={"local_attention": "psa"}),
}


@dataclass(frozen=True)
class Scale:
    """What every run of a grid shares: the ``convit`` and ``deit`` compared, the architecture overrides of
    both (``model_args``) and of the ConViT only (``convit_args``, e.g. ``local_up_to_layer``), the flags of
    every run (``common``: data, batch, learning rate...), and ``epochs`` / ``warmup_epochs`` at f = 1.

    ``class_sizes`` (training images per class) and a ``global_batch`` in ``common`` make every fraction take the
    same number of *optimiser steps* as f = 1: the loader drops each epoch's last partial batch, which at
    500 images and batch 128 is a quarter of every epoch, so epochs/f alone would not be equal images."""

    convit: str
    deit: str
    epochs: int
    warmup_epochs: float
    model_args: dict[str, Any] = field(default_factory=dict)
    convit_args: dict[str, Any] = field(default_factory=dict)
    common: dict[str, Any] = field(default_factory=dict)
    class_sizes: tuple[int, ...] = ()

    def schedule(self, fraction: float) -> dict[str, Any]:
        """``epochs`` and ``warmup_epochs`` on a fraction f: epochs/f (``data.scaled_epochs``), or equal steps
        with ``eval_every`` keeping about one evaluation per f = 1 epoch's worth of steps."""
        check_fraction(fraction)
        if not self.class_sizes:
            return {"epochs": scaled_epochs(self.epochs, fraction), "warmup_epochs": self.warmup_epochs / fraction}
        batch = self.common["global_batch"]
        full, part = (sum(math.floor(f * n + 1e-9) for n in self.class_sizes) // batch for f in (1.0, fraction))
        if not part:
            raise ValueError(f"fraction {fraction} keeps fewer than one batch of {batch} images of the "
                             f"{sum(self.class_sizes)}: raise the fraction or lower global_batch")
        return {"epochs": max(1, round(self.epochs * full / part)), "warmup_epochs": self.warmup_epochs * full / part,
                "eval_every": max(1, round(full / part))}

    def run(self, ablation: str, fraction: float, seed: int = 0) -> RunSpec:
        """The run of ``ABLATIONS[ablation]`` on a fraction of the data with ``seed``, in the folder
        ``{ablation}_f{fraction}_s{seed}``."""
        a = ABLATIONS[one_of("ablation", ablation, ABLATIONS)]
        positive_int("seed", seed, minimum=0)
        model, own_args = (self.convit, self.convit_args) if a.model == "convit" else (self.deit, {})
        flags = {**self.common, "model": model, **self.model_args, **own_args, **a.switches, "fraction": fraction,
                 **self.schedule(fraction), "seed": seed}
        return RunSpec(f"{ablation}_f{fraction:g}_s{seed}", a.label, flags)


def sample_efficiency_grid(scale: Scale, fractions: list[float], seeds: list[int] = (0,)) -> list[RunSpec]:
    """Table 2: the DeiT and the ConViT of ``scale`` on each fraction f and seed, seed by seed."""
    return [scale.run(name, f, seed) for seed in seeds for f in fractions for name in ("deit", "convit")]


def ablation_grid(scale: Scale, fraction: float,
                  names: list[str] = ("convit", "frozen_gate", "no_conv_init", "frozen_gpsa", "psa", "deit"),
                  seeds: list[int] = (0,)) -> list[RunSpec]:
    """The ablations ``names`` (Table 3 rows and App. A's PSA) on one fraction of the data, for each seed."""
    return [scale.run(name, fraction, seed) for seed in seeds for name in names]


def unique_runs(*grids: list[RunSpec]) -> list[RunSpec]:
    """The runs of several grids, each once (Table 3's ConViT and DeiT are also Table 2's runs)."""
    runs: dict[str, RunSpec] = {}
    for spec in (s for grid in grids for s in grid):
        if spec.name in runs and runs[spec.name] != spec:
            raise ValueError(f"two different runs are both named {spec.name!r}")
        runs.setdefault(spec.name, spec)
    return list(runs.values())


# %% [markdown]
# ### The paper's scale
#
# At full scale the grid reproduces Table 2 (ConViT-S vs DeiT-S, 300 epochs at f = 1, DeiT's ImageNet recipe:
# the CLI's `imagenet` preset) and Table 3 (the "+" models on 10 % of the data), one `torchrun` per run on a
# node of 8 GPUs. The commands are what a cluster job would execute (the SLURM wrapper is in chapter 08):

# %%
PAPER_TABLE_2 = Scale(convit="convit_small", deit="deit_small", epochs=300, warmup_epochs=5,
                      common={"preset": "imagenet", "data_root": "data/imagenet"})
PAPER_TABLE_3 = Scale(convit="convit_small_plus", deit="deit_small_plus", epochs=300, warmup_epochs=5,
                      common={"preset": "imagenet", "data_root": "data/imagenet", "global_batch": 512, "lr": 4e-4})
paper_runs = unique_runs(sample_efficiency_grid(PAPER_TABLE_2, [0.05, 0.1, 0.3, 0.5, 1.0]))
paper_ablations = ablation_grid(PAPER_TABLE_3, 0.1, names=list(ABLATIONS))
torchrun = "torchrun --nproc_per_node=8 -m convit_edu.cli"
for spec in paper_runs[:2] + paper_ablations[1:2]:
    print(train_command(spec, "runs/paper", launcher=torchrun))
print(len(paper_runs), "Table 2 runs,", len(paper_ablations), "Table 3 / App. A runs;",
      "epochs:", sorted({s.flags["epochs"] for s in paper_runs}))
assert paper_runs[0].flags["epochs"] == 6000 and paper_runs[0].flags["warmup_epochs"] == 100

# %% [markdown]
# A grid at the paper's scale is most useful as a script a cluster job runs line by line (chapter 08 wraps
# one in SLURM); `commands_script` writes it:

# %%
#| export
def commands_script(runs: list[RunSpec], results: str | Path, launcher: str = "python -m convit_edu.cli",
                    setup: list[str] = ()) -> str:
    """A bash script running ``runs`` one after the other into ``results`` (after the ``setup`` lines), that
    stops at the first failure; run it from the repository root."""
    lines = ["#!/usr/bin/env bash", "# generated by convit_edu.experiments.commands_script; run from the repository root",
             "set -euo pipefail", *setup]
    lines += [train_command(spec, results, launcher) for spec in runs]
    return "\n".join(lines) + "\n"


# %%
paper_script = commands_script(paper_runs[:2], "runs/paper", launcher=torchrun)
print(paper_script)
assert paper_script.count("torchrun") == 2 and "--fraction 0.05" in paper_script

# %% [markdown]
# ### The scale of this CPU: a design that can show the effect
#
# A mini Table 2 is only worth running if it *can* show what the paper claims: the DeiT has to be short of data
# at small f, and the ConViT's prior has to be able to act. Two cores allow a few hundred thousand images per
# run at a 64-token model of about 400 k parameters, so every choice serves those two conditions:
#
# * **data**: the first 10 classes of an ImageNet-style folder (here the shared Tiny ImageNet-100: 500 training
#   and 50 validation images per class, 64 × 64-px photographs), at 64 px in 8 × 8-px patches: an 8 × 8 grid;
# * **models**: ConViT and DeiT of the same size, width 72 with **9 heads** of 8, depth 6, the ConViT with 4
#   GPSA blocks. Nine heads put the locality prior on a 3 × 3 kernel with one head on the query, as in ConViT-S
#   (4 heads would give a 2 × 2 kernel of four overlapping blurs);
# * **recipe**: crops of 35–100 % of the image and flips, label smoothing 0.1, drop path 0.05, and **no**
#   RandAugment, MixUp, CutMix or erasing: CutMix by itself pushes attention toward locality, which shrinks the
#   very gap we measure, and heavy augmentation hides data starvation. AdamW, 10⁻³ at batch 32 (written as a
#   base rate of 1.6 × 10⁻² for 512, DeiT's linear scaling rule), weight decay 0.05, warm-up over 10 000
#   images, then cosine;
# * **budget**: every run makes the same number of optimiser steps, 120 000 images' worth in batches of 32
#   (24 epochs at f = 1, about 80 at f = 0.3, 250 at f = 0.1): 3 744 steps, so the fraction changes the
#   *data*, never the compute. Batch 32 gives 4 times the steps of batch 128 — which matters for the gates
#   (pre-condition 3 below) — and did not cost this CPU more per image (the two grids' logs, read at the end);
# * **evaluation**: top-1 on the 500 validation images **and** on the training images the fraction left out
#   (4 500 at f = 0.1, 3 500 at f = 0.3), which are as unseen as the validation images; pooled, they bring the
#   binomial standard error of a top-1 below a point where it was 2.2 points on 500 images. Two seeds per cell,
#   paired (the ConViT and the DeiT of a seed see the same images in the same order).
#
# Three pre-conditions are written here, before the results: **(1)** the DeiT at f = 0.1 is at least 10
# points below the DeiT at f = 1 (the data really is scarce), **(2)** the models fit their training data
# (training top-1 far above the top-1 on unseen images at f = 0.1), and **(3)** the gates *can* move. AdamW
# moves a parameter by at most about the learning rate per step, so over a run λ can move by at most the sum
# of the schedule's learning rates; the paper's 300 epochs sum to about 190, and σ(λ) goes from its initial
# σ(1) = 0.73 to 0.38 only if λ moves by 1.5. So the schedule's learning rates must sum to at least 1.5 —
# checked below, from the schedule itself, before any run. (The first version of this design, batch 128 with
# 936 steps, summed to 0.47: its gates stayed within 0.02 of 0.73, and its f = 0.1 runs are kept in
# `nbs/results/sample-efficiency-b128/` as the record of why the batch changed.) (1) and (2) are checked on
# the results. If one failed, the budget would change, not the claim.

# %%
#| export
from collections import Counter

from convit_edu.data import ImageFolderDataset

SAMPLE_EFFICIENCY_MODEL: dict[str, Any] = {"patch_size": 8, "embed_dim": 72, "num_heads": 9, "depth": 6}
SAMPLE_EFFICIENCY_RECIPE: dict[str, Any] = {  # TrainConfig and AugConfig fields (see the list above)
    "data": "imagefolder", "img_size": 64, "aug": "deit", "scale": (0.35, 1.0), "randaugment_magnitude": None,
    "erasing": 0.0, "mixup_alpha": 0.0, "cutmix_alpha": 0.0, "crop_ratio": 1.0, "label_smoothing": 0.1,
    "drop_path_rate": 0.05, "global_batch": 32, "lr": 1.6e-2, "weight_decay": 0.05}


def sample_efficiency_scale(data_root: str | Path, classes: int = 10, images_per_run: int = 120_000,
                            warmup_images: int = 10_000, class_sizes: tuple[int, ...] | None = None,
                            **common: Any) -> Scale:
    """The CPU-scale Table 2 design on the first ``classes`` classes of the ImageNet-style folder ``data_root``:
    every run makes the optimiser steps of ``images_per_run`` images; ``common`` adds or replaces flags
    (``num_workers``, ``device``...). ``class_sizes`` (training images per class) is read from the folder unless
    given (to print the grid of a folder that is not on this machine)."""
    positive_int("images_per_run", images_per_run)
    positive_int("classes", classes)
    if class_sizes is None:
        train_set = ImageFolderDataset(Path(data_root) / "train", max_classes=classes)
        class_sizes = tuple(Counter(train_set.targets)[c] for c in range(len(train_set.classes)))
    n = sum(class_sizes)
    return Scale(convit="convit_tiny", deit="deit_tiny", epochs=max(1, round(images_per_run / n)),
                 warmup_epochs=warmup_images / n, model_args=dict(SAMPLE_EFFICIENCY_MODEL),
                 convit_args={"local_up_to_layer": 4}, class_sizes=class_sizes,
                 common={**SAMPLE_EFFICIENCY_RECIPE, "data_root": str(data_root), "classes": classes, **common})
# %% [markdown]
# Pre-condition (3) needs the sum of a run's learning rates, from its schedule (chapter 07's `deit_lr`):

# %%
#| export
from convit_edu.training import TrainConfig, deit_lr, scaled_lr


def learning_rate_sum(cfg: TrainConfig, steps_per_epoch: int) -> float:
    """The sum of the learning rates of every optimiser step of the run ``cfg``: about how far AdamW can move any
    one parameter over the run (it moves each by at most about the learning rate per step)."""
    total, warmup = steps_per_epoch * cfg.epochs, round(cfg.warmup_epochs * steps_per_epoch)
    peak = scaled_lr(cfg.lr, cfg.global_batch or cfg.batch_size)
    return sum(deit_lr(t, total, warmup, peak, cfg.min_lr, cfg.warmup_lr) for t in range(total))


# %%
DATA_ROOT = Path("../data/tiny-imagenet-100-first10")  # made from ../shared/data, as the README says
RESULTS = Path("results/sample-efficiency")  # nbs/results/sample-efficiency: the committed records
from convit_edu.data import extract_subset

ARCHIVE = Path("../../shared/data/tiny-imagenet-100.tar.gz")
if ARCHIVE.is_file():
    CPU = sample_efficiency_scale(extract_subset(ARCHIVE, DATA_ROOT, max_classes=10), classes=10)
else:  # the committed results are read all the same; the grid is printed from Tiny ImageNet's known sizes
    CPU = sample_efficiency_scale(DATA_ROOT, classes=10, class_sizes=(500,) * 10)
FRACTIONS, SEEDS, ABLATION_FRACTION = [0.1, 0.3, 1.0], [0, 1], 0.1
cpu_runs = sample_efficiency_grid(CPU, FRACTIONS, SEEDS)
print(f"{len(cpu_runs)} Table 2 runs:", ", ".join(s.name for s in cpu_runs))
print("schedule per fraction:", {f: CPU.schedule(f) for f in FRACTIONS}, "\nclass sizes:", CPU.class_sizes)
from convit_edu.models import count_params, model_config

sizes = {name: count_params(model_config(name, **CPU.model_args, **extra, img_size=64, num_classes=10))
         for name, extra in ((CPU.convit, CPU.convit_args), (CPU.deit, {}))}
print("parameters:", sizes)
batch = CPU.common["global_batch"]
steps = {f: CPU.schedule(f)["epochs"] * (sum(math.floor(f * n + 1e-9) for n in CPU.class_sizes) // batch)
         for f in FRACTIONS}
print("optimiser steps per run:", steps)
assert max(steps.values()) - min(steps.values()) <= 0.01 * max(steps.values())  # the same compute at every f
assert all(abs(n - 397_000) < 2_000 for n in sizes.values())

# %%
#| export
import json
import math
from collections import Counter
from dataclasses import fields
from pathlib import Path

import torch
from torch.utils.data import Dataset, Subset

from convit_edu.analysis import LocalityRecorder, plot_gate_history, plot_nonlocality_history, read_locality
from convit_edu.bench import measure_model
from convit_edu.data import AugConfig, ImageFolderDataset, build_transforms, subsample_per_class
from convit_edu.models import ModelConfig, VisionTransformer
from convit_edu.training import TrainConfig, deit_lr, evaluate, resolve_device, scaled_lr, train
from matplotlib.figure import Figure

from convit_edu.models import MODEL_ZOO

# %% [markdown]
# ## One command for the whole grid
#
# `convit-edu experiment sample-efficiency` (and its sibling `ablations`) runs a grid in this process, one run
# after another, on any ImageNet-style folder. Each run trains with `train` (so `--resume auto` semantics:
# a run stopped half-way continues from its `last.pt`), records σ(λ) and the nonlocality of every layer about
# 20 times along the way (`LocalityRecorder`, for Figs. 5 and 6), then scores the final model on the
# validation images, on the held-out training images and on the training images it saw. It writes the run's
# `record.json` last: a folder with a record is finished and is skipped the next time, so the command
# resumes a partly finished grid where it stopped. After every run, `OUTPUT/summary.json` (one record per
# finished run), `OUTPUT/table.txt` and the figures are written again.
#
# First, a run's flags become a `TrainConfig`: each flag is a field of `TrainConfig`, of the model's
# `ModelConfig` (into `model_args`) or of the augmentation's `AugConfig` (into `aug_args`), exactly as the
# command line sorts them (chapter 08).

# %%
#| export
def run_config(spec: RunSpec, folder: str | Path, **overrides: Any) -> TrainConfig:
    """The validated ``TrainConfig`` of ``spec`` (its flags, then ``overrides``) training into ``folder``."""
    run_fields = {f.name for f in fields(TrainConfig)}
    values: dict[str, Any] = {"model_args": {}, "aug_args": {}, "output": str(folder)}
    for key, value in {**spec.flags, **overrides}.items():
        if key in ("model_args", "aug_args"):
            raise ValueError(f"run {spec.name!r}: give the fields of {key} as flags of their own, as on the command "
                             f"line (e.g. {{'depth': 6}}, not {{{key!r}: {{'depth': 6}}}})")
        if key in run_fields:
            values[key] = value
        elif key in {f.name for f in fields(ModelConfig)}:
            values["model_args"][key] = value
        elif key in {f.name for f in fields(AugConfig)}:
            values["aug_args"][key] = value
        else:
            raise ValueError(f"run {spec.name!r}: {key!r} is not a TrainConfig, ModelConfig or AugConfig field")
    return TrainConfig(**values)


# %% [markdown]
# With it, pre-condition (3) on the CPU grid, before any run: the learning rates of a run's schedule.

# %%
cfg = run_config(cpu_runs[0], "unused")
lr_sum = learning_rate_sum(cfg, steps[cfg.fraction] // cfg.epochs)
print(f"peak learning rate {scaled_lr(cfg.lr, cfg.global_batch):.1e} at batch {cfg.global_batch}; the "
      f"{steps[cfg.fraction]} steps' learning rates sum to "
      f"{lr_sum:.2f}: σ(λ) can move from {torch.sigmoid(torch.tensor(1.0)):.2f} to "
      f"{torch.sigmoid(torch.tensor(1.0 - lr_sum)):.2f} (pre-condition 3)")
assert lr_sum >= 1.5

# %% [markdown]
# The sets a run is scored on, all with the evaluation transform: the validation split, the training images
# its fraction kept (does it fit them?) and the ones the fraction left out.

# %%
#| export
def scoring_sets(cfg: TrainConfig) -> dict[str, Dataset]:
    """``val``, ``train`` (the images the run trains on) and ``heldout`` (the rest of the first ``cfg.classes``
    classes' training images; empty at f = 1) of an ImageFolder run, with the run's evaluation transform."""
    _, val_tf = build_transforms(cfg.aug_config())
    root = Path(cfg.data_root)
    every = ImageFolderDataset(root / "train", val_tf, max_classes=cfg.classes)
    kept = subsample_per_class(every.targets, cfg.fraction)
    left_out = sorted(set(range(len(every))) - set(kept))
    return {"val": ImageFolderDataset(root / "val", val_tf, max_classes=cfg.classes),
            "train": Subset(every, kept), "heldout": Subset(every, left_out)}


def _gpsa_layer_means(gates: list) -> list[float]:
    return [sum(heads) / len(heads) for heads in gates]


def train_run(spec: RunSpec, output: str | Path, records: int = 20) -> dict | None:
    """Train ``spec`` into ``output/spec.name`` (resuming its ``last.pt``), score it, write and return its
    ``record.json``; None when a signal stopped it (its checkpoint lets the next call continue)."""
    folder = Path(output) / spec.name
    cfg = run_config(spec, folder, resume="auto")
    sets = scoring_sets(cfg)
    probe = torch.stack([sets["val"][i][0] for i in range(0, len(sets["val"]), max(1, len(sets["val"]) // 16))])
    steps = cfg.epochs * (len(sets["train"]) // (cfg.global_batch or cfg.batch_size))
    recorder = LocalityRecorder(probe, every=max(1, steps // positive_int("records", records)),
                                path=folder / "locality.json")
    result = train(cfg, callbacks=[recorder])
    if result.stopped:
        return None
    device = next(result.model.parameters()).device
    scores = {name: evaluate(result.model, ds, batch_size=256, device=device, precision=cfg.precision,
                             num_workers=cfg.num_workers)["top1"] if len(ds) else None
              for name, ds in sets.items()}
    ablation = spec.name.rsplit("_f", 1)[0]
    record = {
        "name": spec.name, "model": ABLATIONS[ablation].model,
        "ablation": None if ablation in ("convit", "deit") else ablation, "fraction": cfg.fraction,
        "seed": cfg.seed, "val_top1": scores["val"], "val_images": len(sets["val"]),
        "heldout_top1": scores["heldout"], "heldout_images": len(sets["heldout"]),
        "train_top1": scores["train"], "train_images": len(sets["train"]), "epochs": cfg.epochs,
        "hours": result.history[-1]["time_s"] / 3600,
        "gates_start": _gpsa_layer_means(recorder.records[0]["gates"]),
        "gates_end": _gpsa_layer_means(recorder.records[-1]["gates"])}
    _write_json(folder / "record.json", record)
    return record


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    tmp.replace(path)
# %% [markdown]
# Before a grid starts, the command says how long it will take on this machine: the mean measured time of
# the finished runs of each model when there are some, otherwise a training step of each model measured on the
# spot (`bench.measure_model`) times the run's steps. The measured step leaves out data loading and the
# per-epoch evaluation, so the second kind of estimate is a lower bound, and says so.

# %%
#| export
def expected_hours(runs: list[RunSpec], output: str | Path) -> tuple[float, str]:
    """Hours the unfinished ``runs`` should take here, and how that was estimated."""
    done = [json.loads(p.read_text()) for p in Path(output).glob("*/record.json")]
    hours, how = 0.0, set()
    for spec in runs:
        past = [r["hours"] for r in done if r["name"].startswith(spec.name.rsplit("_f", 1)[0] + "_f")]
        if past:
            hours += sum(past) / len(past)
            how.add("finished runs")
            continue
        cfg = run_config(spec, output)
        batch = cfg.global_batch or cfg.batch_size
        model = VisionTransformer(cfg.model_config(num_classes=cfg.classes or 10, distilled=False))
        speed = measure_model(model, batch, cfg.img_size, steps=2, num_classes=cfg.classes or 10,
                              device=resolve_device(cfg.device), precision=cfg.precision)["train_images_per_s"]
        class_sizes = Counter(ImageFolderDataset(Path(cfg.data_root) / "train", max_classes=cfg.classes).targets)
        images = sum(math.floor(cfg.fraction * n + 1e-9) for n in class_sizes.values()) // batch * batch
        hours += cfg.epochs * images / speed / 3600
        how.add("a training step measured now (data loading and evaluation not included: at least this)")
    return hours, " and ".join(sorted(how)) or "nothing left to run"


def run_grid(runs: list[RunSpec], output: str | Path, records: int = 20) -> list[dict]:
    """Train every unfinished run of ``runs`` into ``output`` one after another (``train_run``), rewriting
    ``summary.json``, ``table.txt`` and the figures after each; the summary's records when all are done."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    todo = [s for s in runs if not (output / s.name / "record.json").is_file()]
    hours, how = expected_hours(todo, output)
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already finished in {output}; {len(todo)} to go, "
          f"expected {hours:.1f} h on this machine (from {how})", flush=True)
    for i, spec in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {spec.name} ({spec.label}, {spec.flags['epochs']} epochs)", flush=True)
        if train_run(spec, output, records) is None:
            print(f"stopped during {spec.name}: run the same command again to continue", flush=True)
            break
        write_summary(output)
    return write_summary(output)
# %% [markdown]
# ## From logs to tables
#
# A finished run leaves `run.json` and `log.jsonl`. `collect` reads them back for a list of runs, skipping the
# ones that have not started and saying which ones stopped early, and keeps the numbers the tables and the
# figures need: the top-1/top-5 at the end of training (the paper reports the accuracy after the last epoch),
# the curves, and the training time.

# %%
#| export
import json
import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunResult:
    """A run read back from its folder: the spec, the config `convit-edu train` recorded, one log row per epoch."""

    spec: RunSpec
    config: dict
    history: list[dict]

    @property
    def finished(self) -> bool:
        return bool(self.history) and self.history[-1]["epoch"] == self.config["epochs"]

    @property
    def top1(self) -> float:
        """Validation top-1 (%) after the last epoch."""
        return self.history[-1]["val_top1"]

    @property
    def top5(self) -> float:
        return self.history[-1]["val_top5"]


def read_run(folder: str | Path, spec: RunSpec) -> RunResult:
    """The run ``spec`` from ``folder`` (its ``run.json`` and ``log.jsonl``); FileNotFoundError naming the
    missing file, ValueError when the folder holds another run."""
    folder = Path(folder)
    for name in ("run.json", "log.jsonl"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} does not exist: run {spec.name!r} has not written it yet")
    config = json.loads((folder / "run.json").read_text())["config"]
    if config["model"] != spec.flags.get("model", config["model"]) or config["fraction"] != spec.flags.get(
            "fraction", config["fraction"]):
        raise ValueError(f"{folder} holds a {config['model']} on fraction {config['fraction']}, not run {spec.name!r} "
                         f"({spec.flags.get('model')} on fraction {spec.flags.get('fraction')})")
    history = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines() if line.strip()]
    return RunResult(spec, config, history)


def collect(results: str | Path, runs: list[RunSpec]) -> dict[str, RunResult]:
    """Every run of ``runs`` that has logged at least one epoch under ``results``, by name; warns about the
    runs that are missing or unfinished."""
    found, missing, partial = {}, [], []
    for spec in runs:
        try:
            result = read_run(Path(results) / spec.name, spec)
        except FileNotFoundError:
            missing.append(spec.name)
            continue
        if not result.history:
            missing.append(spec.name)
            continue
        if not result.finished:
            partial.append(f"{spec.name} ({result.history[-1]['epoch']}/{result.config['epochs']} epochs)")
        found[spec.name] = result
    if missing or partial:
        warnings.warn(f"under {results}: not run {missing}, unfinished {partial}", stacklevel=2)
    return found


def relative_gain(convit: float, deit: float) -> float:
    """The paper's "Gap" (Table 2): (ConViT − DeiT) / DeiT, in %."""
    if deit <= 0:
        raise ValueError(f"the DeiT accuracy {deit} must be > 0 to compute a relative gain")
    return 100 * (convit - deit) / deit


# %% [markdown]
# ## From records to tables
#
# `summary.json` is the list of the finished runs' records. Table 2 pairs the ConViT and the DeiT of each seed
# and fraction and scores them on every image neither trained on, the validation images and the held-out
# training images pooled (`unseen_top1`). The paper's "gap" is the relative improvement of the ConViT; here it
# comes with a standard error that adds two sources of noise: how much the paired difference varies from seed
# to seed (with two seeds, a rough estimate) and the binomial noise of scoring a finite set of images.

# %%
#| export
def unseen_top1(record: dict) -> float:
    """Top-1 (%) on every image the run did not train on: its validation and held-out training images."""
    n_val, n_out = record["val_images"], record["heldout_images"]
    return (record["val_top1"] * n_val + (record["heldout_top1"] or 0.0) * n_out) / (n_val + n_out)


def _images(record: dict) -> int:
    return record["val_images"] + record["heldout_images"]


def _mean_se(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)) ** 0.5


def table_2(records: list[dict]) -> list[dict]:
    """One row per fraction with a ConViT and a DeiT of the same seed: mean test top-1 of both, the point
    difference and the relative gain (%), each with its standard error (seed-to-seed and binomial, combined)."""
    plain = {(r["model"], r["fraction"], r["seed"]): r for r in records if r["ablation"] is None}
    rows = []
    for f in sorted({key[1] for key in plain}):
        pairs = [(plain[("convit", f, s)], plain[("deit", f, s)]) for s in sorted({k[2] for k in plain})
                 if ("convit", f, s) in plain and ("deit", f, s) in plain]
        if not pairs:
            continue
        accs = [(unseen_top1(c), unseen_top1(d)) for c, d in pairs]
        binomial = sum(p * (100 - p) / _images(r) for (c, d), pair in zip(accs, pairs)
                       for p, r in zip((c, d), pair)) ** 0.5 / len(pairs)  # in points
        diff, diff_se = _mean_se([c - d for c, d in accs])
        gain, gain_se = _mean_se([relative_gain(c, d) for c, d in accs])
        deit = sum(d for _, d in accs) / len(accs)
        rows.append({"fraction": f, "seeds": len(pairs), "paired_seeds": [c["seed"] for c, _ in pairs], "test_images": _images(pairs[0][0]), "deit_top1": deit,
                     "convit_top1": sum(c for c, _ in accs) / len(accs), "diff": diff,
                     "diff_se": math.hypot(0.0 if math.isnan(diff_se) else diff_se, binomial), "gain": gain,
                     "gain_se": math.hypot(0.0 if math.isnan(gain_se) else gain_se, 100 * binomial / deit),
                     "train_top1": {m: sum(p[i]["train_top1"] for p in pairs) / len(pairs)
                                    for i, m in enumerate(("convit", "deit"))}})
    return rows


def format_table_2(rows: list[dict]) -> str:
    """Table 2's layout with the standard errors: f | DeiT, ConViT (test top-1) | difference | relative gap."""
    lines = [f"{'f':>6} {'seeds':>5} {'images':>6} | {'DeiT':>6} {'ConViT':>6} | {'ConViT - DeiT':>14} | "
             f"{'gap (relative)':>15}"]
    for r in rows:
        lines.append(f"{r['fraction']:>6.0%} {r['seeds']:>5} {r['test_images']:>6} | {r['deit_top1']:>6.1f} "
                     f"{r['convit_top1']:>6.1f} | {r['diff']:>+6.1f} ± {r['diff_se']:<4.1f}pt | "
                     f"{r['gain']:>+6.0f} ± {r['gain_se']:<3.0f}%")
    return "\n".join(lines)


def table_3(records: list[dict], fraction: float) -> list[dict]:
    """The ablations on ``fraction`` in ``ABLATIONS`` order: name, Table 3 row, seeds, mean test and val top-1."""
    rows = []
    for name, a in ABLATIONS.items():
        runs = [r for r in records if r["fraction"] == fraction and r["model"] == a.model
                and r["ablation"] == (None if name in ("convit", "deit") else name)]
        if runs:
            rows.append({"name": name, "table_ref": a.table_ref, "label": a.label, "seeds": len(runs),
                         "unseen_top1": sum(map(unseen_top1, runs)) / len(runs),
                         "val_top1": sum(r["val_top1"] for r in runs) / len(runs)})
    return rows


def format_table_3(rows: list[dict]) -> str:
    lines = [f"{'row':<7}{'run':<27}{'seeds':>5}{'test top-1':>11}{'val top-1':>10}"]
    lines += [f"{r['table_ref']:<7}{r['label']:<27}{r['seeds']:>5}{r['unseen_top1']:>11.1f}{r['val_top1']:>10.1f}"
              for r in rows]
    return "\n".join(lines)
# %% [markdown]
# ## The figures, in the paper's style
#
# Table 2 as a picture (test top-1 against f, and the relative gain with its standard error, next to the
# paper's), and Figs. 5 and 6 from the runs' `locality.json`: the nonlocality of every layer over training for
# both models, and σ(λ) of every GPSA head over training.

# %%
#| export
def plot_table_2(records: list[dict], paper_gaps: dict[float, float] | None = None) -> Figure:
    """Left: test top-1 against f (each seed a dot, the mean a line). Right: the relative gain of the ConViT with
    its standard error, and the paper's (``paper_gaps``) for reference."""
    fig = Figure(figsize=(9, 3.2), dpi=80)
    acc, gains = fig.subplots(1, 2)
    for model, colour, label in (("deit", "C0", "DeiT"), ("convit", "C3", "ConViT")):
        runs = [r for r in records if r["ablation"] is None and r["model"] == model]
        fractions = sorted({r["fraction"] for r in runs})
        acc.plot([r["fraction"] for r in runs], [unseen_top1(r) for r in runs], ".", color=colour, alpha=0.5)
        acc.plot(fractions, [sum(unseen_top1(r) for r in runs if r["fraction"] == f) /
                             sum(r["fraction"] == f for r in runs) for f in fractions], "-", color=colour, label=label)
    rows = table_2(records)
    gains.errorbar([r["fraction"] for r in rows], [r["gain"] for r in rows], yerr=[2 * r["gain_se"] for r in rows],
                   fmt="o-", color="C3", capsize=3, label="this grid (± 2 SE)")
    if paper_gaps:
        gains.plot(list(paper_gaps), list(paper_gaps.values()), "s:", color="grey", label="paper (ImageNet, S)")
    gains.axhline(0, color="black", linewidth=0.5)
    for ax in (acc, gains):
        ax.set_xscale("log")
        ax.set_xlabel("fraction of the training images f")
        ax.legend(fontsize=7)
    acc.set(ylabel="test top-1 (%)", title="top-1 on unseen images")
    gains.set(ylabel="relative improvement (%)", title="ConViT over DeiT")
    fig.tight_layout()
    return fig


def locality_histories(output: str | Path, fraction: float, seed: int) -> dict[str, list[dict]]:
    """The ``locality.json`` records of the DeiT and the ConViT of one Table 2 cell, by label."""
    return {label: read_locality(Path(output) / f"{name}_f{fraction:g}_s{seed}" / "locality.json")
            for name, label in (("deit", "DeiT"), ("convit", "ConViT"))}


def write_summary(output: str | Path, paper_gaps: dict[float, float] | None = None) -> list[dict]:
    """Gather the finished runs' records into ``output/summary.json`` and write ``table.txt``,
    ``sample_efficiency.png`` and, for the largest fraction both models finished, ``nonlocality.png`` (Fig. 5)
    and ``gates.png`` (Fig. 6); return the records."""
    output = Path(output)
    order = {name: i for i, name in enumerate(ABLATIONS)}
    records = sorted((json.loads(p.read_text()) for p in output.glob("*/record.json")),
                     key=lambda r: (r["fraction"], order[r["ablation"] or r["model"]], r["seed"]))
    _write_json(output / "summary.json", records)
    rows = table_2(records)
    text = [format_table_2(rows)] + [format_table_3(table_3(records, f)) for f in sorted({
        r["fraction"] for r in records if r["ablation"] is not None})]
    (output / "table.txt").write_text("\n\n".join(text) + "\n")
    if rows:
        plot_table_2(records, paper_gaps).savefig(output / "sample_efficiency.png")
        histories = locality_histories(output, rows[-1]["fraction"], rows[-1]["paired_seeds"][0])
        plot_nonlocality_history(histories).savefig(output / "nonlocality.png")
        plot_gate_history(histories["ConViT"]).savefig(output / "gates.png")
    return records


# %% [markdown]
# `plot_ablation` draws the curves of Table 3's runs over training (Fig. 12, right) from their logs
# (`collect`), with the final validation top-1 in the legend.

# %%
#| export
def plot_ablation(results: dict[str, RunResult], runs: list[RunSpec]) -> Figure:
    """Top-1 against epochs for each run of ``runs`` (Fig. 12, right), final top-1 in the legend; dashed for a
    model without GPSA layers (the DeiT)."""
    fig = Figure(figsize=(6.5, 3.4), dpi=80)
    ax = fig.subplots()
    for i, spec in enumerate(runs):
        run = results.get(spec.name)
        if run is None:
            continue
        gpsa_layers = spec.flags.get("local_up_to_layer", MODEL_ZOO[spec.flags["model"]].local_up_to_layer)
        ax.plot([row["epoch"] for row in run.history], [row["val_top1"] for row in run.history],
                "-" if gpsa_layers else "--", color=f"C{i}", label=f"{spec.label}: {run.top1:.1f}")
    ax.set(xlabel="epoch", ylabel="top-1 (%)", title="ablations (final top-1 in the legend)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# %% [markdown]
# ## The pipeline end to end, on a tiny grid
#
# Before trusting tables made from records, run the whole chain once through the real command, in a
# subprocess: a folder of 3 classes of generated JPEGs, the grid on two fractions with a budget of two
# optimiser steps per run, its `summary.json` read back and checked against the schema. Interrupting the
# command and running it again would skip the finished runs; the tests check that (`tests/test_experiments.py`).

# %%
# NBVAL_IGNORE_OUTPUT
import shutil

import numpy as np
from PIL import Image

tiny_root, tiny_output = Path("runs/10_tiny_folder"), Path("runs/10_tiny_grid")  # nbs/runs/ is not committed
shutil.rmtree(tiny_root, ignore_errors=True)
shutil.rmtree(tiny_output, ignore_errors=True)
pixels = np.random.default_rng(0)
for split, count in (("train", 128), ("val", 8)):
    for c in range(3):
        (tiny_root / split / f"class{c}").mkdir(parents=True)
        for i in range(count):
            tone = pixels.integers(0, 60, (64, 64, 3)) + 60 * c  # one brightness per class, some noise
            Image.fromarray(tone.astype(np.uint8)).save(tiny_root / split / f"class{c}" / f"{i}.jpg")
command = [sys.executable, "-m", "convit_edu.cli", "experiment", "sample-efficiency", "--data-root", str(tiny_root),
           "--classes", "3", "--seeds", "0", "--fractions", "0.5", "1", "--images-per-run", "256",
           "--num-workers", "0", "--progress", "none", "--output", str(tiny_output)]
print(" ".join(command[1:]))
done = subprocess.run(command, capture_output=True, text=True, timeout=600)
print(done.stdout[-1500:], done.stderr[-1500:])
assert done.returncode == 0

# %%
tiny = json.loads((tiny_output / "summary.json").read_text())
print("a record's fields:", ", ".join(tiny[0]))  # (its numbers vary with the CPU: the asserts check them)
print([(r["name"], r["heldout_images"], len(r["gates_end"])) for r in tiny])
SCHEMA = {"model", "ablation", "fraction", "seed", "val_top1", "heldout_top1", "heldout_images", "gates_start",
          "gates_end"}
assert len(tiny) == 4 and all(SCHEMA <= set(r) for r in tiny)
assert {(r["model"], r["fraction"]) for r in tiny} == {(m, f) for m in ("convit", "deit") for f in (0.5, 1.0)}
assert all(r["heldout_images"] == (192 if r["fraction"] == 0.5 else 0) for r in tiny)
assert all(len(r["gates_end"]) == (4 if r["model"] == "convit" else 0) for r in tiny)
assert all(0 <= r["val_top1"] <= 100 and 0 <= r["train_top1"] <= 100 for r in tiny)
assert [row["fraction"] for row in table_2(tiny)] == [0.5, 1.0]

# %% [markdown]
# ## Table 2 in miniature: the results
#
# The committed records of the grid above (`nbs/results/sample-efficiency/summary.json`), run as two
# `convit-edu experiment sample-efficiency` commands side by side (`--seeds 0` and `--seeds 1`, one thread each),
# then two `convit-edu experiment ablations` commands (seed 0, three ablations each), on the AMD EPYC (Zen 3,
# AVX2, 2 cores) this course is developed on.

# %%
PAPER_TABLE_2_TOP1 = {0.05: (34.8, 47.8), 0.1: (48.0, 59.6), 0.3: (66.1, 73.7), 0.5: (74.6, 78.2), 1.0: (79.9, 81.4)}
PAPER_GAPS = {f: relative_gain(c, d) for f, (d, c) in PAPER_TABLE_2_TOP1.items()}
records = json.loads((RESULTS / "summary.json").read_text())
table_runs = [r for r in records if r["ablation"] is None]
print(f"{len(table_runs)} of {len(cpu_runs)} Table 2 runs finished:", ", ".join(r["name"] for r in table_runs))
rows = table_2(records)
print("\nthis CPU: 10 Tiny ImageNet classes, 64 px, width 72 / 9 heads / depth 6, same steps at every f;")
print("top-1 on every image a run did not train on (validation + held-out training images)")
print(format_table_2(rows))
print("\nthe paper: ImageNet-1k, DeiT-S / ConViT-S, 300 epochs x 1/f, top-1 on ImageNet val")
for f, (deit_top1, convit_top1) in PAPER_TABLE_2_TOP1.items():
    print(f"{f:>6.0%} | {deit_top1:>6.1f} {convit_top1:>6.1f} | gap {PAPER_GAPS[f]:+.0f} %")

# %%
plot_table_2(records, PAPER_GAPS)

# %% [markdown]
# ### The pre-conditions
#
# Checked on the runs, as promised before the results. **(1)** data is scarce at f = 0.1: the DeiT on 10 % of
# the images is at least 10 points below the DeiT on all of them. **(2)** the models fit what they train on:
# training top-1 (evaluation transform) near 100 % at f = 0.1, far above the top-1 on images they did not
# train on.

# %%
def cell_runs(model: str, fraction: float) -> list[dict]:
    return [r for r in table_runs if r["model"] == model and r["fraction"] == fraction]


scarce = {f: sum(map(unseen_top1, cell_runs("deit", f))) / len(cell_runs("deit", f)) for f in (0.1, 1.0)}
print(f"(1) the DeiT on 10 % of the images: {scarce[0.1]:.1f} %, on all of them: {scarce[1.0]:.1f} % "
      f"({scarce[1.0] - scarce[0.1]:.1f} points apart)")
assert scarce[1.0] - scarce[0.1] >= 10
for r in cell_runs("deit", 0.1) + cell_runs("convit", 0.1):
    print(f"(2) {r['name']:<16} trains at {r['train_top1']:5.1f} % on its {r['train_images']} images, "
          f"{unseen_top1(r):5.1f} % on {r['val_images'] + r['heldout_images']} unseen ones")
    assert r["train_top1"] >= 95 and r["train_top1"] - unseen_top1(r) >= 30

# %% [markdown]
# ### Figs. 5 and 6 from these runs
#
# Every run recorded, about 20 times along its training, the nonlocality of each layer (Eq. 8, mean attention
# distance in patches, averaged over heads, on 16 fixed validation images) and σ(λ) of every GPSA head. For the
# runs on 10 % of the data, first seed: the DeiT and the ConViT side by side (Fig. 5), then the gates (Fig. 6).
# Chapter 09 draws the same two figures for the runs on all the data and analyses those models further.

# %%
histories = locality_histories(RESULTS, 0.1, 0)
plot_nonlocality_history(histories)

# %%
plot_gate_history(histories["ConViT"])

# %% [markdown]
# ## Table 3 in miniature: the ablations
#
# The ConViT taken apart on 10 % of the data, one seed (seed 0; rows a and e are Table 2's runs), with the
# same design and budget: (b) the gates frozen at λ = 0 (σ = ½), (c) no convolutional initialization,
# (d) both, (f) the GPSA layers frozen at their initialization (so they stay a fixed local mixing), (g) frozen
# without the convolutional initialization (fixed *random* attention), and App. A's PSA (Eq. 4: content and
# position in one softmax, no gate). One seed has no seed-to-seed error bar of its own; Table 2's two seeds at
# f = 0.1 give one (pooled over the two models, so a rough estimate from 2 degrees of freedom), and the
# difference of two one-seed runs carries √2 times it.

# %%
PAPER_TABLE_3_TOP1 = {  # Table 3 (ConViT-S+, ImageNet, 300 epochs): top-1 on all the data and on 10 % of it
    "convit": (82.2, 59.7), "frozen_gate": (82.0, 57.4), "no_conv_init": (81.4, 56.9),
    "frozen_gate_no_conv_init": (81.6, 54.6), "deit": (79.1, 47.8), "frozen_gpsa": (78.6, 54.3),
    "frozen_gpsa_no_conv_init": (73.7, 44.8)}
seed_var = []
for model in ("convit", "deit"):
    runs = cell_runs(model, ABLATION_FRACTION)
    mean = sum(map(unseen_top1, runs)) / len(runs)
    seed_var.append(sum((unseen_top1(r) - mean) ** 2 for r in runs) / (len(runs) - 1))
seed_sd = math.sqrt(sum(seed_var) / len(seed_var))
ablation_se = math.sqrt(2) * seed_sd  # of the difference between two one-seed runs
rows_3 = table_3([r for r in records if r["seed"] == 0], ABLATION_FRACTION)
ours = {r["name"]: r["unseen_top1"] for r in rows_3}
print(f"{len(rows_3)} of {len(ABLATIONS)} runs finished; f = {ABLATION_FRACTION:.0%}, seed 0, top-1 on the "
      f"5 000 unseen images.\nOne seed's noise: {seed_sd:.1f} points, so {ablation_se:.1f} for a difference.\n")
print(f"{'row':<7}{'run':<27}{'top-1':>6}{'vs (a)':>8} | {'paper 10 %':>10}{'vs (a)':>8}")
for r in rows_3:
    paper = PAPER_TABLE_3_TOP1.get(r["name"], (None, None))[1]
    paper_text = f"{paper:>10.1f}{paper - PAPER_TABLE_3_TOP1['convit'][1]:>+8.1f}" if paper else f"{'-':>10}"
    print(f"{r['table_ref']:<7}{r['label']:<27}{r['unseen_top1']:>6.1f}{r['unseen_top1'] - ours['convit']:>+8.1f} | "
          + paper_text)
ablation_gates = {r["ablation"] or r["model"]: r["gates_end"] for r in records if r["seed"] == 0
                  and r["fraction"] == ABLATION_FRACTION and r["gates_end"]}
print()
for name, g in ablation_gates.items():
    print(f"{name:<27} mean σ(λ) per GPSA layer at the end: {' '.join(f'{v:.3f}' for v in g)}")

# %% [markdown]
# ### The first version of the design, and why it changed
#
# The grid was first run at batch 128: 936 steps per run. Its f = 0.1 cells finished before the gates were
# looked at — and the gates had not moved: every GPSA layer of both seeds ended within 0.02 of σ(1) = 0.73,
# because that schedule's learning rates summed to 0.47. Pre-condition (3) did not exist yet; it was added, and
# the batch changed to 32 (same images, four times the steps, learning-rate sum 1.89). Those runs stay in
# `nbs/results/sample-efficiency-b128/`, read here:

# %%
first = json.loads(Path("results/sample-efficiency-b128/summary.json").read_text())
print(format_table_2(table_2(first)))
first_cfg = TrainConfig.from_dict(json.loads(Path("results/sample-efficiency-b128/convit_f0.1_s0/run.json").read_text())[
    "config"])
first_sum = learning_rate_sum(first_cfg, steps_per_epoch=500 // first_cfg.global_batch)
print(f"batch {first_cfg.global_batch}, {first_cfg.epochs} epochs of {500 // first_cfg.global_batch} steps: "
      f"learning rates sum to {first_sum:.2f}")
moved = max(abs(g - torch.sigmoid(torch.tensor(1.0)).item()) for r in first for g in r["gates_end"])
print(f"largest change of a layer's mean σ(λ) over those runs: {moved:.3f}")
assert first_sum < 1.5 and moved < 0.03

# %% [markdown]
# Did the smaller batch cost speed? The training logs of both grids record images/s per epoch. Both ran as two
# single-threaded runs side by side on the same 2-core AMD EPYC, with other work sharing the cores at times,
# so this is a sanity check rather than a benchmark: the median over each f = 0.1 run's epochs.

# %%
import statistics


def median_speed(folder: Path) -> float:
    rows = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    return statistics.median(row["images_per_s"] for row in rows)


speed = {batch: [median_speed(root / name) for name in ("convit_f0.1_s0", "convit_f0.1_s1", "deit_f0.1_s0",
                                                         "deit_f0.1_s1")]
         for batch, root in ((128, Path("results/sample-efficiency-b128")), (32, RESULTS))}
for batch, values in speed.items():
    print(f"batch {batch:>3}: median images/s of the f = 0.1 runs (ConViT s0, s1, DeiT s0, s1): "
          + " ".join(f"{v:.0f}" for v in values))
assert min(speed[32]) >= 0.9 * max(speed[128])  # no slower per image at batch 32

# %% [markdown]
# ## What the runs say
#
# The whole grid ran: 12 Table 2 runs (3 fractions × 2 models × 2 seeds) and 6 more for Table 3 and App. A,
# 18 runs of 3 744 steps, 16 to 33 minutes each (the longest while other work shared the cores), two at a time. What the numbers above support, each with
# its uncertainty:
#
# * **The ConViT is ahead where data is scarce, by about a point — within noise.** On the images neither model
#   trained on, ConViT − DeiT is +1.4 ± 0.8 points at f = 0.1 (+3 ± 2 % relative), +0.7 ± 0.8 at f = 0.3
#   (+1 ± 1 %) and −0.6 ± 2.3 at f = 1 (−1 ± 4 %, on the 500 validation images only). All four seed pairs at
#   f ≤ 0.3 favour the ConViT, one of two at f = 1; and the gain shrinks as f grows, the ordering of the
#   paper's Table 2. But no cell is beyond two standard errors, and neither is the fall of the gain from f = 0.1
#   to f = 1. The paper's gaps are +24 %, +11 % and +2 %: the direction is reproduced, the size is not, and the
#   direction itself is not established at this budget. (The validation split alone, 500 images, could not
#   tell the models apart at all at f = 0.1: the held-out training images are what makes the comparison
#   possible.)
# * **The pre-conditions hold**: the DeiT loses 16 points from f = 1 to f = 0.1, and both models fit their
#   training images at f = 0.1 (98.6–100 %). The data-starved regime is there; the prior helps in it only a
#   little here.
# * **The gates moved, a little, in the paper's direction — and more the scarcer the data.** Every GPSA
#   layer's mean σ(λ) went down, toward content, and in both seeds the mean fall is largest at f = 0.1 (0.04),
#   then f = 0.3 (0.03), then f = 1 (0.01–0.02): the same steps over fewer images pull the heads off their
#   positional start faster. At f = 0.1 the last GPSA layer ends below the first in both seeds, as in Fig. 6.
#   Against the paper (late layers to σ ≈ 0) this is barely a start: a layer's mean λ moved by 0.3 at most,
#   where the schedule allowed 1.9 (pre-condition 3): the gradient on λ is small, not the room to move.
# * **Attention hardly localised.** Every layer of every DeiT run ends within 0.2 patch of uniform attention
#   (4.14 on the 8 × 8 grid); the ConViT's GPSA layers widen from 1.98 to 2.2–2.4 patches at f = 0.1, the later layers
#   more (Fig. 5; chapter 09 shows the same, smaller, at f = 1).
# * **Table 3: every row within about two standard errors of the ConViT (a).** The one-seed noise of a
#   difference is 0.9 points; the rows range from +0.3 (b, frozen gate; App. A's PSA) to −1.7 (e, the DeiT, at
#   2.0 standard errors, the edge). One pattern, seen after the fact rather than tested: the three lowest rows
#   are the three whose first four layers have no *trainable* positional attention — (e) the DeiT, (f) and
#   (g) the frozen GPSA layers — 47.1–47.6 % against 48.1–49.2 % for the five others; the paper's three lowest
#   rows at 10 % are the same three. Freezing the gates at σ = ½ (b) cost nothing here, where the paper lost
#   2.3 points: our learned gates barely left their start anyway. Freezing four of six attention layers at
#   *random* (g) cost 1.5 points: at this budget the model's accuracy depends little on what its attention
#   does.
#
# **Diagnosis, and what a larger budget would need.** The effect the paper measures lives in what training
# does to attention: DeiT layers that become local, GPSA gates that fall to 0 in the late layers. Here neither
# happened to more than a few percent of its range, and the ablations say the same: at 3 744 steps of 32
# images on 64 tokens, attention is a small part of what these models learn. Two things would change that.
# A longer schedule: the paper's learning rates sum to about 190, ours to 1.9, and the gates used less than a
# sixth of even that; runs 10–30 times longer (1–4 million images each, 4–12 hours per run on this CPU, minutes on a
# GPU) are the next step, with the same command and `--images-per-run`. And more precision: differences of
# about a point need standard errors under half a point — more seeds (the seed-to-seed part) and more unseen
# images per class (the binomial part), or a paired per-image comparison declared before the runs. The
# command reruns the grid as it is on any ImageNet-style folder; these are the knobs to turn.

# %%
by_name = {r["name"]: r for r in records}
minutes = sorted(60 * r["hours"] for r in records)
print(f"{len(records)} runs, {minutes[0]:.0f} to {minutes[-1]:.0f} minutes each")
assert len(records) == 18 and 15 < minutes[0] and minutes[-1] < 35
for f in FRACTIONS:
    (row,) = [r for r in rows if r["fraction"] == f]
    per_seed = [unseen_top1(by_name[f"convit_f{f:g}_s{s}"]) - unseen_top1(by_name[f"deit_f{f:g}_s{s}"])
                for s in SEEDS]
    print(f"f = {f:.0%}: ConViT - DeiT per seed {[round(d, 2) for d in per_seed]}, "
          f"mean {row['diff']:+.1f} ± {row['diff_se']:.1f} ({row['diff'] / row['diff_se']:.1f} SE)")
    assert abs(row["diff"]) < 2 * row["diff_se"]  # within noise, at every fraction
    if f < 1:
        assert all(d > 0 for d in per_seed)  # but every seed pair favours the ConViT where data is scarce
gain = {r["fraction"]: r for r in rows}
assert gain[0.1]["gain"] > gain[0.3]["gain"] > gain[1.0]["gain"]  # the paper's ordering...
assert gain[0.1]["diff"] - gain[1.0]["diff"] < 2 * math.hypot(gain[0.1]["diff_se"], gain[1.0]["diff_se"])  # ...in noise
for s in SEEDS:
    c, d = by_name[f"convit_f0.1_s{s}"], by_name[f"deit_f0.1_s{s}"]
    assert abs(c["val_top1"] - d["val_top1"]) <= 1.0  # the 500 validation images alone cannot tell them apart

start = torch.sigmoid(torch.tensor(1.0)).item()
for s in SEEDS:
    fall = {f: start - sum(by_name[f"convit_f{f:g}_s{s}"]["gates_end"]) / 4 for f in FRACTIONS}
    print(f"seed {s}: mean fall of σ(λ) over the GPSA layers by fraction:", {f: round(v, 3) for f, v in fall.items()})
    assert fall[0.1] > fall[0.3] > fall[1.0] > 0  # toward content, faster on fewer images
    end = by_name[f"convit_f0.1_s{s}"]["gates_end"]
    assert all(0.02 <= start - g <= 0.06 for g in end) and end[-1] < end[0]
    assert min(math.log(g / (1 - g)) for g in end) > 1 - 0.3  # λ (a layer's mean) moved by 0.3 at most
for r in table_runs:
    if r["model"] == "deit":
        last = torch.tensor(read_locality(RESULTS / r["name"] / "locality.json")[-1]["nonlocality"]).mean(-1)
        assert ((last - 4.14).abs() < 0.2).all(), r["name"]
deit_width = torch.tensor(histories["DeiT"][-1]["nonlocality"]).mean(-1)
convit_width = torch.tensor(histories["ConViT"][-1]["nonlocality"]).mean(-1)
print("f = 0.1, seed 0, final nonlocality per layer: DeiT", [f"{w:.2f}" for w in deit_width.tolist()],
      "ConViT", [f"{w:.2f}" for w in convit_width.tolist()])
assert ((deit_width - 4.14).abs() < 0.2).all()  # uniform attention on the 8 × 8 grid: 4.14
assert ((convit_width[:4] > 2.15) & (convit_width[:4] < 2.45)).all() and convit_width[3] > convit_width[0]

differences = {r["name"]: (r["unseen_top1"] - ours["convit"]) / ablation_se for r in rows_3}
print("Table 3, differences from (a) in standard errors:", {n: round(v, 2) for n, v in differences.items()})
assert all(abs(v) < 2.1 for v in differences.values())  # none clearly beyond noise
no_trainable_gpsa = ("deit", "frozen_gpsa", "frozen_gpsa_no_conv_init")
assert max(ours[n] for n in no_trainable_gpsa) < min(v for n, v in ours.items() if n not in no_trainable_gpsa)
assert all(g == 0.5 for n in ("frozen_gate", "frozen_gate_no_conv_init") for g in ablation_gates[n])

# %% [markdown]
# ## Exercises
#
# **1. Pre-condition 3 at another batch.** Keep the design but train with `global_batch=64`: the same epochs,
# so about the same images and half the steps; the base learning rate unchanged, so DeiT's linear scaling rule
# doubles the peak. Predict first: does the learning-rate sum go up, down or stay? Then compute it for the f = 0.1 run
# with `run_config` and `learning_rate_sum` and set `lr_sum_64`.

# %% tags=["solution"] jupyter={"source_hidden": true}
cfg_64 = run_config(CPU.run("convit", 0.1, 0), "unused", global_batch=64)
lr_sum_64 = learning_rate_sum(cfg_64, steps_per_epoch=500 // 64)
print(f"batch 64: {cfg_64.epochs * (500 // 64)} steps, learning rates summing to {lr_sum_64:.2f} "
      f"(batch 32: {lr_sum:.2f}) — twice the rate for half the steps")

# %%
# your answer: lr_sum_64 = ...

# %%
from convit_edu.checks import WrongAnswer, check_answer, expect_error


def check_lr_sum_64(answer: float) -> None:
    cfg = run_config(CPU.run("convit", 0.1, 0), "unused", global_batch=64)
    want = learning_rate_sum(cfg, steps_per_epoch=500 // 64)
    check_answer(abs(answer - want) < 0.01, "build the config with run_config(..., global_batch=64); an epoch of "
                 "500 images is 500 // 64 steps (the last partial batch is dropped)")


check_lr_sum_64(lr_sum_64)
print(expect_error(lambda: check_lr_sum_64(lr_sum / 2), WrongAnswer))

# %% [markdown]
# **2. A standard error by hand.** Recompute the f = 0.3 cell's `diff_se` from its four records: the
# seed-to-seed standard error of the per-seed differences (ConViT − DeiT of the same seed, on the unseen
# images), combined in quadrature with the binomial standard error of the mean difference (each of the four
# top-1s p on n images contributes p(100 − p)/n, and the mean of two differences divides by 2). Set `se_03`.

# %% tags=["solution"] jupyter={"source_hidden": true}
pairs_03 = [(by_name[f"convit_f0.3_s{s}"], by_name[f"deit_f0.3_s{s}"]) for s in SEEDS]
diffs_03 = [unseen_top1(c) - unseen_top1(d) for c, d in pairs_03]
seed_se = statistics.stdev(diffs_03) / math.sqrt(len(diffs_03))
binomial_se = math.sqrt(sum(unseen_top1(r) * (100 - unseen_top1(r)) / (r["val_images"] + r["heldout_images"])
                            for pair in pairs_03 for r in pair)) / len(pairs_03)
se_03 = math.hypot(seed_se, binomial_se)
print(f"seed-to-seed {seed_se:.2f}, binomial {binomial_se:.2f}: {se_03:.2f} points")

# %%
# your answer: se_03 = ...

# %%
def check_se_03(answer: float) -> None:
    (row,) = [r for r in table_2(records) if r["fraction"] == 0.3]
    check_answer(abs(answer - row["diff_se"]) < 0.01, "two parts in quadrature: the standard deviation of the "
                 "two per-seed differences over √2, and √(Σ p(100 − p)/n over the four runs) / 2")


check_se_03(se_03)
print(expect_error(lambda: check_se_03(seed_se), WrongAnswer))
