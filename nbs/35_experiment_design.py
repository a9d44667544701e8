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
# # The paper's experiments in miniature: the design
#
# Table 2 of the paper is its central claim: the soft convolutional prior of the ConViT pays most when data is
# scarce. ConViT-S and DeiT-S are trained on a fraction f of the images of each ImageNet class, for 300/f
# epochs so that both see the same number of images; the relative gain of the ConViT grows from 2 % at f = 1 to
# 37 % at f = 5 %. Table 3 takes the ConViT apart (gating, convolutional initialization, training the GPSA at
# all) and Appendix A replaces GPSA by plain positional self-attention (PSA).
#
# Those runs cost hundreds of GPU-days. This chapter first writes a grid of runs at any scale as code — a run is a
# folder name and a `TrainConfig`, printed as the `convit-edu train` words of its recipe and what differs from it —
# and the paper's own grid as a script. Then it designs the version a 2-core CPU can afford and that *can* show the
# effect: its data and test split, models, recipe, budget, seeds and the pre-conditions stated before any run, each
# with its reason (a recipe of its own, `--preset sample-efficiency`). Chapter 36 turns such a grid's records into
# tables with error bars, chapter 37 runs grids with one command, and chapter 38 reads this design's results.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp experiment_design
# The experiments' grids: a run as a folder name and a TrainConfig, Tables 2 and 3 at any scale, and a design
# that can show the paper's effect on a CPU.

# %%
# %matplotlib inline
import shlex
from pathlib import Path

import torch

from convit_edu.datasets import scaled_epochs
from convit_edu.schedule import scaled_lr

torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## A run is a folder name and a config
#
# Every setting of a training run is a field of one `TrainConfig` (chapter 21), and a recipe is a named set of
# them. So a run of an experiment is a folder name, a label for the tables and its `TrainConfig`, with the name of
# the recipe it was made from; a grid is a list of them. Its shell command is chapter 22's `config_to_words`:
# `--preset NAME`, then a flag for every setting that differs from the recipe (booleans `--flag` / `--no-flag`,
# `None` as `none`, dataset arguments as `--data-arg KEY=VALUE`), and the run writes into `RESULTS/NAME`: the flags
# `convit-edu train` reads (chapter 42), with the same code, so a grid's command run by hand trains that run.

# %%
#| export
import shlex
from dataclasses import dataclass, fields, replace
from pathlib import Path

from convit_edu.checks import one_of
from convit_edu.config import RECIPES, TrainConfig
from convit_edu.config_words import config_to_words

_DEFAULT_OUTPUT = next(f.default for f in fields(TrainConfig) if f.name == "output")


@dataclass(frozen=True)
class RunSpec:
    """One training run of a grid: its folder ``name``, a ``label`` for tables and legends, its ``config`` and the
    recipe it was made from (``preset``, a name of ``config.RECIPES``: its command lists what differs from it).
    The config's ``output`` stays at its default: ``train_command`` puts the run in ``RESULTS/NAME``."""

    name: str
    label: str
    config: TrainConfig
    preset: str | None = None

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name != self.name.strip():
            raise ValueError(f"run name {self.name!r} must be a non-empty folder name without '/' or spaces around it")
        if not isinstance(self.config, TrainConfig):
            raise TypeError(f"run {self.name!r}: its config must be a TrainConfig, not {self.config!r}")
        if self.config.output != _DEFAULT_OUTPUT:
            raise ValueError(f"run {self.name!r}: leave its config's output at {_DEFAULT_OUTPUT!r}, not "
                             f"{self.config.output!r}; train_command puts the run in RESULTS/NAME")
        if self.preset is not None:
            one_of("preset", self.preset, RECIPES)
        config_to_words(self.config, self.preset)  # its command can be written (flags cannot remove a preset's key)


def train_command(spec: RunSpec, results: str | Path, launcher: str = "python -m convit_edu.cli") -> str:
    """The shell command that trains ``spec`` into ``results/spec.name``: ``train``, then the words of its config
    (``config_words.config_to_words``: ``--preset`` and the flags of what differs from the recipe).

    ``launcher`` runs the CLI: ``python -m convit_edu.cli`` (or ``convit-edu``) on one machine,
    ``torchrun --nproc_per_node=8 -m convit_edu.cli`` on a GPU node; environment assignments may lead it
    (``OMP_NUM_THREADS=1 python -m convit_edu.cli``).
    """
    cfg = replace(spec.config, output=str(Path(results) / spec.name))
    return shlex.join(shlex.split(launcher) + ["train", *config_to_words(cfg, spec.preset)])


# %% [markdown]
# A ConViT-S without its convolutional initialization, on 10 classes of 64 synthetic images each, as a command:

# %%
spec = RunSpec("demo", "ConViT", TrainConfig(model="convit_small", model_args={"use_local_init": False},
                                             data_args={"num_train": 64}, classes=10, ema_decay=0.999))
print(train_command(spec, "nbs/results/demo"))
words = shlex.split(train_command(spec, "out"))[4:]
assert words == ["--model", "convit_small", "--no-use-local-init", "--data-arg", "num_train=64", "--classes", "10",
                 "--ema-decay", "0.999", "--output", "out/demo"]

# %% [markdown]
# (`convit-edu train` reads such words with chapter 22's `config_from_words`; chapter 37 checks they give this config.)

# %% [markdown]
# ## The grids: Table 2 and Table 3 at any scale
#
# What the runs of one experiment share is a **scale**: the ConViT and DeiT compared, the recipe, the settings
# of every run and the training length at f = 1. Table 2 varies f, multiplying epochs by 1/f (as the paper does)
# and, the course's own choice, the warm-up too (`datasets.scaled_epochs`); Table 3 and Appendix A vary the ConViT's switches at one fraction. Each ablation's
# name says what it changes (and names the runs' folders); the paper's row letter is kept as a label:
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
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

from convit_edu.checks import one_of, positive_int
from convit_edu.config import resolve_config
from convit_edu.datasets import check_fraction, scaled_epochs


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
    """What every run of a grid shares: the ``convit`` and ``deit`` compared, the recipe (``preset``, a name of
    ``config.RECIPES``) and the settings of every run on top of it (``common``: ``TrainConfig`` fields, its
    ``model_args`` added to the preset's), the ConViT's own ``ModelConfig`` overrides (``convit_args``, e.g.
    ``local_up_to_layer``), and ``epochs`` / ``warmup_epochs`` at f = 1.

    ``class_sizes`` (training images per class) and a ``global_batch`` make every fraction take the same number of
    *optimiser steps* as f = 1: the loader drops each epoch's last partial batch, which at 500 images and batch
    128 is a quarter of every epoch, so epochs/f alone would not be equal images."""

    convit: str
    deit: str
    epochs: int
    warmup_epochs: float
    preset: str | None = None
    common: dict[str, Any] = field(default_factory=dict)
    convit_args: dict[str, Any] = field(default_factory=dict)
    class_sizes: tuple[int, ...] = ()

    @property
    def base(self) -> TrainConfig:
        """The config every run starts from: the preset with ``common`` (``config.resolve_config``)."""
        cfg, notes = resolve_config(self.preset, self.common)
        for note in notes:
            warnings.warn(note, stacklevel=2)
        return cfg

    def schedule(self, fraction: float) -> dict[str, Any]:
        """``epochs`` and ``warmup_epochs`` on a fraction f: epochs/f (``datasets.scaled_epochs``), or equal steps
        with ``eval_every`` keeping about one evaluation per f = 1 epoch's worth of steps."""
        check_fraction(fraction)
        if not self.class_sizes:
            return {"epochs": scaled_epochs(self.epochs, fraction), "warmup_epochs": self.warmup_epochs / fraction}
        batch = self.base.global_batch
        if batch is None:
            raise ValueError("class_sizes count optimiser steps, which needs a global_batch (in the preset or common)")
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
        base = self.base
        cfg = replace(base, model=model, model_args={**base.model_args, **own_args, **a.switches}, fraction=fraction,
                      **self.schedule(fraction), seed=seed)
        return RunSpec(f"{ablation}_f{fraction:g}_s{seed}", a.label, cfg, self.preset)


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
# node of 8 GPUs. The commands are what a cluster job would execute (the SLURM wrapper is in chapter 43):

# %%
PAPER_TABLE_2 = Scale(convit="convit_small", deit="deit_small", epochs=300, warmup_epochs=5, preset="imagenet")
PAPER_TABLE_3 = Scale(convit="convit_small_plus", deit="deit_small_plus", epochs=300, warmup_epochs=5,
                      preset="imagenet", common={"global_batch": 512, "lr": 4e-4})
paper_runs = unique_runs(sample_efficiency_grid(PAPER_TABLE_2, [0.05, 0.1, 0.3, 0.5, 1.0]))
paper_ablations = ablation_grid(PAPER_TABLE_3, 0.1, names=list(ABLATIONS))
torchrun = "torchrun --nproc_per_node=8 -m convit_edu.cli"
for spec in paper_runs[:2] + paper_ablations[1:2]:
    print(train_command(spec, "runs/paper", launcher=torchrun))
print(len(paper_runs), "Table 2 runs,", len(paper_ablations), "Table 3 / App. A runs;",
      "epochs:", sorted({s.config.epochs for s in paper_runs}))
assert paper_runs[0].config.epochs == 6000 and paper_runs[0].config.warmup_epochs == 100

# %% [markdown]
# At the paper's scale a grid is a script a cluster job runs line by line (chapter 43), `commands_script`'s:

# %%
#| export
def commands_script(runs: list[RunSpec], results: str | Path, launcher: str = "python -m convit_edu.cli",
                    setup: list[str] = ()) -> str:
    """A bash script running ``runs`` one after the other into ``results`` (after the ``setup`` lines), that
    stops at the first failure; run it from the repository root."""
    lines = ["#!/usr/bin/env bash", "# generated by convit_edu.experiment_design.commands_script; run from the repository root",
             "set -euo pipefail", *setup]
    lines += [train_command(spec, results, launcher) for spec in runs]
    return "\n".join(lines) + "\n"


# %%
paper_script = commands_script(paper_runs[:2], "runs/paper", launcher=torchrun)
print(paper_script)
assert paper_script.count("torchrun") == 2 and "--fraction 0.05" in paper_script

# %% [markdown]
# ## The laptop's grid: a design that can show the effect
#
# The rest of this chapter designs the grid that chapter 38 reads. A miniature Table 2 is only worth its CPU hours if
# it *can* show what the paper claims: the DeiT has to be short of data at small f, and the ConViT's prior has to be
# able to act on it. The design below is the course's second: a first one (a coarser grid, scored on different
# images at each fraction) and single-seed pilots on the dev images shaped it, and chapter 39, the research log,
# keeps them. What each choice is, and why:
#
# * **Data.** The first 10 classes of an ImageNet-style folder, the course's Tiny ImageNet-100 (500 training and 50
#   validation photographs of 64 × 64 px per class), shrunk to **48 px and cut into 4-px patches: a 12 × 12 grid**
#   of 144 tokens. A finer grid than the first design's 8 × 8 (64 px in 8-px patches) gives a local prior more
#   positions to be local about; a 16 × 16 grid costs 2.3 times as much a step and did not fit the budget
#   (chapter 39 measured it).
# * **A fixed test split.** Per class, the last 100 training images and the 50 validation images are the **test
#   set** (1 500 images), the 50 training images before them the **dev set** (500), and the first 350 the training
#   pool, of which a fraction f trains (its first ⌊f · 350⌋ per class). The same test images for every model,
#   fraction and seed, so two runs are compared image by image (chapter 36); the dev images follow training and
#   choose the design, the test images only judge it. (The first design scored each run on every image it had not
#   trained on: different images at each fraction, and no image-by-image comparison.)
# * **Models.** ConViT and DeiT of the same size, width 72 in **9 heads** of 8, depth 6, the ConViT's first 4
#   blocks GPSA. Nine heads put the locality prior on a 3 × 3 kernel with one head on the query, as in ConViT-S (4
#   heads would give a 2 × 2 kernel of four overlapping blurs). Built as `convit_tiny` / `deit_tiny` with other
#   widths, they are *not* ConViT-Ti and DeiT-Ti: heads of 8 channels (the paper's 48 and 64) leave content
#   attention little capacity, which may weaken whatever attention adds beyond the prior.
# * **Recipe.** Crops of 35–100 % of the image and flips, label smoothing 0.1, drop path 0.05, and **no**
#   RandAugment, MixUp, CutMix or erasing: heavy augmentation hides data starvation, and at this budget leaves both
#   models less trained. AdamW, weight decay 0.05, a peak rate of 2·10⁻³ at batch 32 (written as a base rate of
#   3.2 × 10⁻² for 512, DeiT's linear scaling rule), warm-up over 10 000 images, then a cosine to 10⁻⁵.
# * **Budget.** Every run makes the optimiser steps of **60 000 images** at batch 32 — about 1 850 steps at every
#   f (17 epochs of 3 500 images at f = 1, 185 of 350 at f = 0.1) — so the fraction changes the *data*, never the
#   compute; 60 000 images is about what a run fits in 25 minutes on one core of the course's 2-core machine,
#   two runs side by side (measured on the pilots, chapter 39).
# * **The gates can move.** AdamW moves a parameter by roughly its learning rate per step, so a gate's λ can move by
#   about the sum of the schedule's rates (the paper's: about 190); σ(λ) goes from σ(1) = 0.73 to 0.38 only if λ
#   moves by 1.5. So the sum must be at least 1.5, which chapter 23's `learning_rate_sum` checks from the schedule
#   before any run: at the first design's rate, 60 000 images sum to 0.93; at twice the rate, 1.86.
# * **Seeds and cells.** Table 2 at f = 0.1 and f = 1 (a middle fraction does not fit the budget), seeds 1–4 per
#   cell: four runs per arm give each arm its own spread (chapter 36's rule asks three or more). Table 3's
#   ablations at f = 0.1 — frozen gate (b), no conv init (c), frozen GPSA (f) and App. A's PSA — with seeds 1 and 3,
#   which take the grid's pooled spread.
#
# Four **pre-conditions**, written before any run and checked on the dev images by chapter 36's
# `check_preconditions`: **(1)** data is scarce (the DeiT at f = 0.1 at least 10 points below the DeiT at f = 1),
# **(2)** attention matters (the ConViT at least 3 points above its GPSA frozen at initialization), **(3)** the gates
# can move and do (a learning-rate sum of 1.5 or more, and some GPSA layer's mean gate moving by 0.05), **(4)** f = 1
# is trained to a fair point (no model at f = 1 still gaining 2 points over its last quarter). A grid that fails one
# is reported with the failure beside its tables: a measurement at this design, not evidence about the paper.

# %%
#| export
from collections import Counter

from convit_edu.datasets import ImageFolderDataset


def sample_efficiency_scale(data_root: str | Path, classes: int = 10, images_per_run: int = 120_000,
                            warmup_images: int = 10_000, class_sizes: tuple[int, ...] | None = None,
                            convit_args: dict[str, Any] | None = None, **common: Any) -> Scale:
    """The CPU-scale Table 2 design (the ``sample-efficiency`` recipe of ``config.RECIPES``) on the first
    ``classes`` classes of the ImageNet-style folder ``data_root``: every run makes the optimiser steps of
    ``images_per_run`` images; ``common`` adds or replaces settings (``num_workers``, ``device``, ``img_size``,
    ``model_args``...) and ``convit_args`` the ConViT's own (4 GPSA layers of 6 unless given).
    ``class_sizes`` (training images per class) is read from the folder unless given (to print the grid of a
    folder that is not on this machine)."""
    positive_int("images_per_run", images_per_run)
    positive_int("classes", classes)
    if class_sizes is None:
        train_set = ImageFolderDataset(Path(data_root) / "train", max_classes=classes)
        class_sizes = tuple(Counter(train_set.targets)[c] for c in range(len(train_set.classes)))
    n = sum(class_sizes)
    return Scale(convit="convit_tiny", deit="deit_tiny", epochs=max(1, round(images_per_run / n)),
                 warmup_epochs=warmup_images / n, preset="sample-efficiency",
                 convit_args={"local_up_to_layer": 4, **(convit_args or {})},
                 class_sizes=class_sizes, common={"data_root": str(data_root), "classes": classes, **common})

# %% [markdown]
# The design as code: chapter 21's `sample-efficiency` recipe (its model is the DeiT; the ConViT adds
# `--model convit_tiny --local-up-to-layer 4`) with 48-px images, 4-px patches and the doubled rate, on the split's
# 350 training images per class (the split is made by the command that runs the grid, chapter 37). Its runs, their
# schedules and their learning-rate sums, before any run:

# %%
import json

from convit_edu.optimisation import learning_rate_sum
from convit_edu.zoo import count_params

DESIGN = sample_efficiency_scale("data/tiny-imagenet-100-first10", classes=10, images_per_run=60_000,
                                 class_sizes=(350,) * 10, img_size=48, model_args={"patch_size": 4}, lr=0.032)
FRACTIONS, SEEDS, TABLE_3 = [0.1, 1.0], [1, 2, 3, 4], ["frozen_gate", "no_conv_init", "frozen_gpsa", "psa"]
grid_runs = unique_runs(sample_efficiency_grid(DESIGN, FRACTIONS, SEEDS),
                        *(ablation_grid(DESIGN, 0.1, names=["convit", *TABLE_3], seeds=[s]) for s in (1, 3)))
print(f"{len(grid_runs)} runs:", ", ".join(s.name for s in grid_runs))
batch = DESIGN.base.global_batch
per_epoch = {f: sum(math.floor(f * n + 1e-9) for n in DESIGN.class_sizes) // batch for f in FRACTIONS}
steps = {f: DESIGN.schedule(f)["epochs"] * per_epoch[f] for f in FRACTIONS}
sums = {rate: learning_rate_sum(replace(DESIGN.run("convit", 0.1).config, lr=rate), per_epoch[0.1])
        for rate in (0.016, 0.032)}
sizes = {s.config.model: count_params(s.config.model_config(num_classes=10, distilled=False)) for s in grid_runs[:2]}
print("schedule per fraction:", {f: DESIGN.schedule(f) for f in FRACTIONS}, "\noptimiser steps per run:", steps)
print(f"learning-rate sum: {sums[0.016]:.2f} at the first design's rate, {sums[0.032]:.2f} at this one's; "
      f"parameters: {sizes}")
assert max(steps.values()) - min(steps.values()) <= 0.01 * max(steps.values())  # the same compute at every f
assert sums[0.016] < 1.5 <= sums[0.032]  # pre-condition (3a), before any run

# %% [markdown]
# The design in one picture: the fewer the images, the more epochs, so that every run makes the same number of
# optimiser steps (the paper's Table 2 does the same with 300/f epochs).

# %%
import matplotlib.pyplot as plt

images = [sum(math.floor(f * n + 1e-9) for n in DESIGN.class_sizes) for f in FRACTIONS]
epochs = [DESIGN.schedule(f)["epochs"] for f in FRACTIONS]
fig, axes = plt.subplots(1, 3, figsize=(9, 2.3), dpi=80)
for ax, values, title in zip(axes, (images, epochs, [steps[f] for f in FRACTIONS]),
                             ("training images", "epochs", "optimiser steps")):
    ax.bar([f"f = {f:g}" for f in FRACTIONS], values, color=["#f4a261", "#2a9d8f"])
    ax.set_title(title, fontsize=9)
fig.tight_layout()
plt.show()

# %% [markdown]
# Each run is its recipe and a few flags: here is the first ConViT run as its script prints it. The grid ran
# (`results/second-design/grid.sh`, two queues on the 2-core machine, one thread each), and every committed run's
# `run.json` holds this design's config, but for where and how it ran (its folders, loader processes, progress
# display and `--resume auto`, which `convit-edu experiment` sets, chapter 37); its records hold the split's sizes:

# %%
GRID = Path("results/second-design")  # nbs/results/second-design: the committed records
print(train_command(DESIGN.run("convit", 0.1, 1), GRID))
where = ("data_root", "output", "num_workers", "progress", "resume")
for run in grid_runs:
    recorded = TrainConfig.from_dict(json.loads((GRID / run.name / "run.json").read_text())["config"])
    assert replace(recorded, **{k: getattr(run.config, k) for k in where}) == run.config, run.name
records = json.loads((GRID / "summary.json").read_text())
split = {(r["test_images"], r["val_images"], r["train_images"]) for r in records}
print(f"the {len(grid_runs)} committed runs are the design's configs, but for {', '.join(where)}; "
      f"(test, dev, training) images: {sorted(split)}; {sum(r['hours'] for r in records):.1f} hours of training")
assert split == {(1500, 500, 350), (1500, 500, 3500)}

# %% [markdown]
# ## Exercises
#
# **1. Counting a grid's runs.** A reviewer asks for more: Table 2 at this design on f ∈ {0.05, 0.1, 0.2, 0.5, 1}
# with three seeds (1, 2, 3), and the default ablations of `ablation_grid` at f = 0.1 with the same three seeds.
# Predict how many runs there are to train, then check with the grid functions. Set `n_runs`.

# %%
n_runs = ...  # your answer: n_runs = ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal


def check_n_runs(answer: int) -> None:
    want = len(unique_runs(sample_efficiency_grid(DESIGN, [0.05, 0.1, 0.2, 0.5, 1.0], [1, 2, 3]),
                           ablation_grid(DESIGN, 0.1, seeds=[1, 2, 3])))
    check_answer(answer != 30 + 18, "a run is trained once even when both tables list it: Table 3's ConViT and "
                 "DeiT at f = 0.1 are Table 2's runs (unique_runs)")
    check_answer(answer == want, "Table 2 trains a DeiT and a ConViT per fraction and seed; ablation_grid's default "
                 "names are six, per seed; and a run is trained once even when both tables list it (unique_runs)")


grade("n_runs", n_runs, check_n_runs)
demonstrate(check_n_runs, {"the runs both tables list counted twice": 5 * 3 * 2 + 6 * 3,
                           "the ablations at one seed": 5 * 3 * 2 + 6 - 2})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(n_runs):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    more_table_2 = sample_efficiency_grid(DESIGN, [0.05, 0.1, 0.2, 0.5, 1.0], [1, 2, 3])  # 5 fractions x 3 seeds x 2
    more_table_3 = ablation_grid(DESIGN, 0.1, seeds=[1, 2, 3])  # 6 ablations x 3 seeds
    n_runs = len(unique_runs(more_table_2, more_table_3))
    print(f"{len(more_table_2)} + {len(more_table_3)} runs listed, {n_runs} to train: Table 3's ConViT and DeiT "
          "at f = 0.1 are Table 2's runs")
    grade("n_runs", n_runs, check_n_runs)

# %% [markdown]
# **2. Equal steps, not epochs/f.** At this design (10 classes of 350 training images, batch 32, 17 epochs at
# f = 1), write `equal_step_epochs(f)`: the epochs that give the run on a fraction f as many optimiser steps as 17
# epochs at f = 1, rounded — count steps from the class sizes and the batch, every epoch dropping its last partial
# batch. Then compare yours at f = 0.05 with the paper's rule, `scaled_epochs(17, 0.05)`.

# %%
equal_step_epochs = ...  # your answer: def equal_step_epochs(f): ...

# %%
def check_equal_step_epochs(fn) -> None:
    for f in (0.05, 0.1, 0.3, 1.0):
        check_answer(fn(f) == DESIGN.schedule(f)["epochs"], f"f = {f}: {fn(f)} epochs, the design gives "
                     f"{DESIGN.schedule(f)['epochs']}: count steps, not images — an f = 1 epoch is 3500 // 32 "
                     "optimiser steps, an f = 0.05 epoch 170 // 32 (the partial batch is dropped)")


grade("equal_step_epochs", equal_step_epochs, check_equal_step_epochs)
demonstrate(check_equal_step_epochs, {
    "epochs / f, the paper's rule": lambda f: scaled_epochs(17, f),
    "the last partial batch counted": lambda f: max(1, round(17 * math.ceil(3500 / 32)
                                                             / math.ceil(10 * math.floor(f * 350 + 1e-9) / 32)))})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(equal_step_epochs):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def equal_step_epochs(f: float) -> int:
        steps_per_epoch = (10 * math.floor(f * 350 + 1e-9)) // 32  # 109 at f = 1, 5 (not 5.3) at f = 0.05
        return max(1, round(17 * (3500 // 32) / steps_per_epoch))

    grade("equal_step_epochs", equal_step_epochs, check_equal_step_epochs)
    e = equal_step_epochs(0.05)
    print(f"f = 0.05, equal steps: {e} epochs, {e * (170 // 32)} steps; epochs/f: {scaled_epochs(17, 0.05)} epochs, "
          f"{scaled_epochs(17, 0.05) * (170 // 32)} steps (f = 1: {17 * (3500 // 32)} steps)")
