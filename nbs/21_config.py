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
# # A run is a config
#
# The ConViT is trained with DeiT's recipe, unchanged (Sec. 3): AdamW, a learning rate scaled with the batch, warm-up
# and cosine decay, stochastic depth, Mixup/CutMix with label smoothing, optionally an EMA of the weights and hard
# distillation from a CNN teacher (SM B, Table 4). Chapters 21-28 write the loop that does it once for every scale
# (a CPU, one GPU, `torchrun` on one node, many nodes under SLURM), and check the strongest property a checkpoint can
# have: **a run stopped anywhere and resumed ends with exactly the weights of a run that never stopped.**
# Chapter 32 used that loop as a tool; these chapters open it. This one writes the config every run is: `TrainConfig`,
# validated once, and the paper's recipes by name; chapter 22, the one translation between a config and a command's
# words.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp config
# A training run is a config: `TrainConfig`, validated once, and the paper's recipes by name.

# %%
from convit_edu.checks import expect_error

# %% [markdown]
# ## The loaders a run can use: one table
#
# A run reads its batches through one of the loaders of chapters 17-19, and what each one can do is what a config
# must check: a table, `LOADERS`, with one entry per loader, in a module of its own (`convit_edu.loader_registry`).
# An entry names the function that builds the loader — every kind built alike, from the run's datasets, its
# augmentation and its sizes — and the plain facts the config checks: whether the loader reads an image folder's
# files itself (then the data must be `imagefolder`, the datasets hand it their file lists untransformed, and
# datasets passed to `train` cannot feed it), the one crop it implements, whether it has repeated augmentation,
# whether its sampler can cycle the data (chapter 16's `CyclingSampler`, for epochs of `epoch_steps`, below), and a
# module it needs installed. A new loader is a module of its own and one line in this table.

# %%
#| export loader_registry
# The loaders a run can use, one entry each: how each is built, and the plain facts a config checks about it.

# %%
#| export loader_registry
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils.data import Dataset

from convit_edu.augment import AugConfig
from convit_edu.dali import DALI_INSTALL, build_dali_loaders
from convit_edu.gpu_decode import build_gpu_decode_loaders
from convit_edu.loaders import DataLoaders, build_loaders


class BuildLoaders(Protocol):
    """How a run builds its loaders of every kind: this process's train and val batches (an object with chapter 17's
    interface: `epoch`, `val`, `state`, `restore`). A kind that `cycles` also takes `epoch_samples`: each epoch is
    that many samples per process of a stream that cycles the training set."""

    def __call__(self, train_set: Dataset, val_set: Dataset, aug: AugConfig | None, *, batch_size: int,
                 num_workers: int, repeats: int, num_replicas: int, rank: int, seed: int, device: torch.device) -> Any: ...


@dataclass(frozen=True)
class LoaderKind:
    """A loader a run can use: how it is built, and the plain facts a config checks about it."""

    build: BuildLoaders
    about: str  # a few words for the command line's help
    reads_files: bool = False  # reads the image folder's files itself: data 'imagefolder', datasets untransformed
    crop: str | None = None  # the one crop it implements (`AugConfig.crop`); None: any
    repeats: bool = True  # has repeated augmentation
    cycles: bool = False  # can cycle the training set in epochs of any length (its build takes `epoch_samples`)
    needs: str | None = None  # a module it imports that may not be installed, and how to install it:
    install: str = ""


def _torchvision_loaders(train_set: Dataset, val_set: Dataset, aug: AugConfig | None, *, device: torch.device,
                         **sizes: int) -> DataLoaders:
    return build_loaders(train_set, val_set, **sizes)  # its datasets' workers apply the recipe: no aug, no device


LOADERS: dict[str, LoaderKind] = {
    "torchvision": LoaderKind(_torchvision_loaders, "workers decode with PIL", cycles=True),
    "dali": LoaderKind(build_dali_loaders, "NVIDIA DALI decodes and augments", reads_files=True,
                       crop="random_resized", repeats=False, needs="nvidia.dali", install=DALI_INSTALL),
    "gpu-decode": LoaderKind(build_gpu_decode_loaders, "the training device decodes", reads_files=True,
                             crop="random_resized"),
}

# %% [markdown]
# The table as the command line lists it, and what each entry lets a config do:

# %%
for name, kind in LOADERS.items():
    limits = [w for w, on in (("image folders only", kind.reads_files), (f"crop {kind.crop!r} only", kind.crop),
                              ("no repeats", not kind.repeats), ("no cycling", not kind.cycles),
                              (f"needs {kind.needs}", kind.needs)) if on]
    print(f"{name:<12} {kind.about}: {', '.join(limits) or 'any data, any recipe'}")
assert [n for n, k in LOADERS.items() if not k.reads_files] == ["torchvision"]

# %% [markdown]
# Everything that decides what a run computes lives in one dataclass, written into every checkpoint and into
# `run.json` beside them, so a run can be repeated, resumed or audited from its files alone. The defaults are DeiT's
# (Touvron et al. 2020, Table 9): base learning rate 5·10⁻⁴ for a batch of 512, AdamW with weight decay 0.05,
# 5 warm-up epochs, cosine decay to 10⁻⁵, drop path 0.1, 300 epochs, 64 images per GPU.
#
# Two sizes of batch matter. `batch_size` is what one process puts through the model at once; the **global batch**,
# what one optimiser step averages over, is $B_\text{global} = \texttt{batch\_size} \times \texttt{accum\_steps}
# \times \text{world size}$, and the learning rate follows it: lr = `lr` × B_global / 512. A recipe can instead fix
# `global_batch`, and each process then takes its share: the same recipe runs on 1 GPU (with accumulation) or on 16.
#
# **Every setting has one owner.** The architecture is a zoo `model` with `model_args` overriding `ModelConfig`
# fields, and the augmentation is `augment.AUGMENTATIONS[aug]` with `aug_args` overriding `AugConfig` fields; but four
# of those fields belong to the run, and overriding them is an error naming their owner (`RUN_OWNED`): the image size
# (one value for the model's patch grid and the augmentation's output), the number of classes (the dataset's), the
# distillation head (present with a teacher) and drop path (a hyper-parameter of DeiT's recipe). Every value is
# checked when made (types, ranges, names, and that the model and augmentation it describes can be built), so a wrong
# setting fails in the line that made it, naming the value and what would be right, not an hour later inside torch.

# %%
#| export
import importlib.util
from dataclasses import dataclass, field, fields
from typing import Any

from convit_edu.augment import AUGMENTATION_RENAMES, AUGMENTATIONS, AugConfig, augmentation
from convit_edu.checks import number, one_of, positive_int
from convit_edu.loader_registry import LOADERS
from convit_edu.datasets import DATASETS, check_fraction
from convit_edu.devices import PRECISIONS, check_device
from convit_edu.loaders import default_num_workers
from convit_edu.models import ModelConfig
from convit_edu.zoo import model_config

PROGRESS = ("auto", "bar", "lines", "none")
CUDA_GRAPHS = ("auto", "on", "off")  # auto: on with compile on a CUDA device, in one process (chapter 28)
RUN_OWNED = {"img_size": "img_size", "num_classes": "the dataset's classes", "distilled": "distill_teacher",
             "drop_path_rate": "drop_path_rate"}  # ModelConfig / AugConfig fields the run sets, and what sets them


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

    model: str = setting("convit_tiny", "model name (convit_edu.zoo.list_models())")
    model_args: dict[str, Any] = setting({}, "ModelConfig overrides, e.g. {'depth': 6}")
    img_size: int = setting(224, "image side in pixels, for the model and the augmentation")
    drop_path_rate: float = setting(0.1, "stochastic depth of the last block (DeiT: 0.1)")
    data: str = setting("fake", "dataset: cifar100, imagefolder (ROOT/train, ROOT/val) or fake")
    data_root: str = setting("data", "dataset folder")
    data_args: dict[str, Any] = setting({}, "more build_datasets arguments (FakeData sizes)")
    aug: str | None = setting("deit", "augmentation (convit_edu.augment.AUGMENTATIONS: deit, pad-crop-flip); none: "
                                      "no augmentation, mixing or smoothing (for datasets passed to train)")
    aug_args: dict[str, Any] = setting({}, "AugConfig overrides, e.g. {'mixup_alpha': 0.0}")
    fraction: float = setting(1.0, "keep this fraction of the training images of each class (Table 2)")
    classes: int | None = setting(None, "keep the first K classes")
    repeats: int = setting(1, "repeated augmentation: each image this many times per epoch (DeiT: 3)")
    num_workers: int | None = setting(None, "data loader processes per GPU/process (loader dali: its CPU threads); "
                                            "none: the CPUs this process may use, shared among the node's "
                                            "processes, less one (loaders.default_num_workers)")
    loader: str = setting("torchvision", "how batches are made (loader_registry.LOADERS): " + "; ".join(
        f"{name}, {kind.about}" + (" (imagefolder data)" if kind.reads_files else "") + (f" ({kind.install})" if
        kind.install else "") for name, kind in LOADERS.items()))
    epochs: int = setting(300, "training epochs")
    eval_every: int = setting(1, "evaluate, log a row, checkpoint and update best.pt every N epochs, and after "
                                 "the last")
    epoch_steps: int | None = setting(None, "an epoch is this many optimiser steps of a stream that cycles the "
                                            "training images, a new permutation each pass and no boundary between "
                                            "passes; none: an epoch is one pass over them")
    batch_size: int = setting(64, "images per process and step (ignored when --global-batch is set)")
    global_batch: int | None = setting(None, "images per optimiser step over all processes and accumulation steps")
    accum_steps: int = setting(1, "gradient accumulation steps per optimiser step")
    lr: float = setting(5e-4, "base learning rate for a global batch of 512 (scaled linearly)")
    min_lr: float = setting(1e-5, "learning rate at the end of the cosine")
    warmup_lr: float = setting(1e-6, "learning rate at the start of the warm-up")
    warmup_epochs: float = setting(5.0, "linear warm-up length in epochs (may be fractional)")
    weight_decay: float = setting(0.05, "AdamW weight decay (not on 1-D parameters, pos_embed, cls_token)")
    gate_lr_scale: float = setting(1.0, "the GPSA gates λ (gating_param) learn at this multiple of the learning "
                                        "rate (a diagnostic of the gates' optimisation; 1: the paper's recipe)")
    clip_grad: float | None = setting(None, "clip the gradient norm to this value (none: off)")
    ema_decay: float | None = setting(None, "keep an EMA of the weights with this decay, evaluated too (none: off; "
                                            "DeiT code: 0.99996)")
    distill_teacher: str | None = setting(None, "hard distillation from this convit_edu or torchvision model "
                                                "(SM B, Table 4)")
    teacher_checkpoint: str | None = setting(None, "the teacher's weights")
    precision: str = setting("auto", "auto (bf16 on GPUs that have it, else fp16; on CPUs bf16 where native, else "
                                     "fp32), fp32, bf16 or fp16")
    compile: bool = setting(False, "torch.compile the model")
    cuda_graphs: str = setting("auto", "capture the whole training step in a CUDA graph and replay it (auto: on with "
                                       "--compile on a GPU in one process; on; off); on a CPU, on runs a stand-in")
    seed: int = setting(0, "seed of every random draw (shuffling, augmentation, mixing, drop path)")
    device: str = setting("auto", "auto (cuda:LOCAL_RANK if available, else mps, else cpu), cpu, cuda or mps")
    output: str = setting("runs/run", "run folder: checkpoints, logs, run.json, curves.png")
    resume: str | None = setting(None, "continue from a checkpoint path, or auto (OUTPUT/last.pt when it exists)")
    ckpt_every: int = setting(0, "also checkpoint every N optimiser steps (0: at evaluated epochs and stops only)")
    log_every: int = setting(50, "print a progress line every N steps (when not showing bars)")
    progress: str = setting("auto", "auto (bars in notebooks and terminals, lines otherwise), bar, lines or none")

    def __post_init__(self) -> None:
        for name in ("img_size", "repeats", "epochs", "eval_every", "batch_size", "accum_steps", "log_every",
                     "seed", "ckpt_every"):
            positive_int(name, getattr(self, name), minimum=0 if name in ("seed", "ckpt_every") else 1)
        for name, minimum in (("classes", 1), ("global_batch", 1), ("num_workers", 0), ("epoch_steps", 1)):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name), minimum=minimum)
        number("lr", self.lr, 0, open_low=True)
        number("gate_lr_scale", self.gate_lr_scale, 0, open_low=True)
        for name in ("min_lr", "warmup_lr", "warmup_epochs", "weight_decay"):
            number(name, getattr(self, name), 0)
        number("drop_path_rate", self.drop_path_rate, 0, 1, open_high=True)
        if self.clip_grad is not None:
            number("clip_grad", self.clip_grad, 0, open_low=True)
        if self.ema_decay is not None:
            number("ema_decay", self.ema_decay, 0, 1, open_low=True, open_high=True)
        check_fraction(self.fraction)
        check_device(self.device)
        for what, value, choices in (("precision", self.precision, PRECISIONS), ("progress", self.progress, PROGRESS),
                                     ("cuda_graphs", self.cuda_graphs, CUDA_GRAPHS),
                                     ("dataset", self.data, DATASETS), ("loader", self.loader, LOADERS)):
            one_of(what, value, choices)
        if self.data == "fake" and self.data_root != TrainConfig.data_root:  # a folder named, then not read
            raise ValueError(f"data_root {self.data_root!r} is set but data is 'fake' (random images, no folder read): "
                             "name the dataset too, e.g. --data imagefolder (ROOT/train, ROOT/val) or cifar100")
        if self.teacher_checkpoint is not None and not self.distill_teacher:
            raise ValueError(f"teacher_checkpoint {self.teacher_checkpoint} given without distill_teacher (the "
                             "teacher's model name)")
        self.model_config(num_classes=2, distilled=False)  # the model and augmentation it describes can be built
        _check_loader(self, self.aug_config())

    def model_config(self, num_classes: int, distilled: bool) -> ModelConfig:
        """The model this run trains: zoo `model` with `model_args`, at the run's image size and drop path."""
        _refuse_run_owned("model_args", self.model_args)
        return model_config(self.model, **self.model_args, img_size=self.img_size,
                            num_classes=num_classes, distilled=distilled, drop_path_rate=self.drop_path_rate)

    def loader_workers(self) -> int:
        """The data loader processes (loader dali: threads) of each process: `num_workers`, or when it is None
        `default_num_workers()`, what this process's share of the node's CPUs allows."""
        return default_num_workers() if self.num_workers is None else self.num_workers

    def per_device_batch(self, world_size: int = 1) -> int:
        """The batch one process runs at once (one micro-batch): `batch_size`, or its share of `global_batch`."""
        if self.global_batch is None:
            return self.batch_size
        share = self.accum_steps * world_size
        if self.global_batch % share:
            raise ValueError(f"global_batch {self.global_batch} is not divisible by accum_steps {self.accum_steps} × "
                             f"world size {world_size} = {share}: pick a global batch that is a multiple of {share}")
        return self.global_batch // share

    def images_per_step(self, world_size: int = 1) -> int:
        """The global batch: images per optimiser step over all processes and accumulation steps."""
        return self.per_device_batch(world_size) * self.accum_steps * world_size

    def steps_per_epoch(self, train_images: int, world_size: int = 1) -> int:
        """Optimiser steps per epoch: `epoch_steps` when set; else one pass over `train_images`, each process's share
        (⌈n / world⌉, as the repeated-augmentation sampler deals them) in whole steps of `accum_steps` micro-batches."""
        if self.epoch_steps is not None:
            return self.epoch_steps
        share = -(-train_images // world_size)
        return share // self.per_device_batch(world_size) // self.accum_steps

    def epoch_samples(self, world_size: int = 1) -> int | None:
        """The samples each process reads per epoch of a cycling stream, `epoch_steps` steps of `accum_steps`
        micro-batches; None when an epoch is one pass over the images."""
        if self.epoch_steps is None:
            return None
        return self.epoch_steps * self.accum_steps * self.per_device_batch(world_size)

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
        augmentation names are migrated). JSON has no tuples: the lists of `model_args` and `aug_args` (a crop's
        `scale`, a `mean`) become tuples again, so a config read back from its `run.json` equals the one written."""
        _check_names(values)
        values = {**values, "aug": AUGMENTATION_RENAMES.get(values.get("aug"), values.get("aug", "deit"))}
        for name in ("model_args", "aug_args"):
            values[name] = {k: tuple(v) if isinstance(v, list) else v for k, v in values.get(name, {}).items()}
        return cls(**values)


def _check_names(values: dict[str, Any]) -> None:
    unknown = sorted(set(values) - {f.name for f in fields(TrainConfig)})
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}: TrainConfig fields are "
                         f"{', '.join(f.name for f in fields(TrainConfig))}")


def _check_loader(cfg: TrainConfig, aug: AugConfig | None) -> None:
    """What the config's loader cannot do, as its entry in `LOADERS` says, refused when made."""
    kind, name = LOADERS[cfg.loader], f"loader {cfg.loader!r}"
    instead = " or ".join(repr(n) for n, k in LOADERS.items() if not (k.reads_files or k.crop or k.needs))
    if kind.reads_files and cfg.data != "imagefolder":
        raise ValueError(f"{name} reads image files: it needs data 'imagefolder', not {cfg.data!r} (use loader "
                         f"{instead})")
    if kind.crop is not None and (aug is None or aug.crop != kind.crop):
        fits = " or ".join(repr(n) for n, a in AUGMENTATIONS.items() if a.crop == kind.crop)
        raise ValueError(f"{name} implements the recipe with crop {kind.crop!r} only (aug {fits}), not aug {cfg.aug!r} "
                         f"(use loader {instead})")
    if not kind.repeats and cfg.repeats != 1:
        raise ValueError(f"{name} has no repeated augmentation: repeats {cfg.repeats} needs loader {instead}")
    if not kind.cycles and cfg.epoch_steps is not None:
        cyclers = " or ".join(repr(n) for n, k in LOADERS.items() if k.cycles)
        raise ValueError(f"{name} cannot cycle the training images: epoch_steps {cfg.epoch_steps} needs loader "
                         f"{cyclers} (or no epoch_steps: an epoch is then one pass)")
    if kind.needs is not None and not _installed(kind.needs):
        raise ImportError(f"{name} needs {kind.needs}, which is not installed: {kind.install} (or use loader "
                          f"{instead})")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its package is missing too
        return False


def _refuse_run_owned(where: str, overrides: dict[str, Any]) -> None:
    owned = sorted(set(overrides) & set(RUN_OWNED))
    if owned:
        raise ValueError(f"{where} sets {owned[0]!r}, which the run owns: set {RUN_OWNED[owned[0]]} instead")


# %% [markdown]
# A global batch is split over the processes and the accumulation steps, and each quantity that follows from the
# batch settings has one formula, a method of the config that every part of the package uses: `per_device_batch`,
# `images_per_step` (the global batch) and `steps_per_epoch`. A learning rate read as text (as from a YAML file or a
# shell variable) is refused. `tests/test_bad_input.py` checks the other refusals: unknown names, values out
# of range, a field another setting owns, a global batch that does not divide.

# %%
print("global batch 1024, per device:", TrainConfig(global_batch=1024).per_device_batch(8), "on 8 GPUs,",
      TrainConfig(global_batch=1024, accum_steps=4).per_device_batch(1), "on 1 GPU with 4 accumulation steps")
accumulated = TrainConfig(batch_size=32, accum_steps=4)
assert accumulated.images_per_step() == 128 and accumulated.images_per_step(world_size=2) == 256
assert accumulated.steps_per_epoch(1000) == 7 and accumulated.steps_per_epoch(1000, world_size=2) == 3
print("batch 32 × 4 accumulation steps:", accumulated.images_per_step(), "images and",
      accumulated.steps_per_epoch(1000), "optimiser steps per epoch of 1000 images on one process")
print(expect_error(lambda: TrainConfig(lr="1e-3"), TypeError))

# %% [markdown]
# An epoch is one pass over the training images, unless `epoch_steps` sets its length in optimiser steps. Then the
# batches come from a stream that cycles the images with no boundary between passes (chapter 16's `CyclingSampler`),
# and `eval_every` counts those epochs: a run of many passes over a small set (1 400 images at a batch of 128 make a
# pass of 10 steps) evaluates and checkpoints every N steps, and does nothing at the end of a pass. `epoch_samples` is
# what each process reads of that stream in an epoch. Only a loader whose sampler cycles can do it (`cycles` in the
# table above).

# %%
cycled = TrainConfig(global_batch=128, epoch_steps=250)
assert TrainConfig(global_batch=128).steps_per_epoch(1400) == 10 and TrainConfig().epoch_samples() is None
assert cycled.steps_per_epoch(1400) == 250 and cycled.epoch_samples(world_size=4) == 250 * 32
print(f"1 400 images at a global batch of 128: {TrainConfig(global_batch=128).steps_per_epoch(1400)} steps a pass; "
      f"with epoch_steps 250, epochs of {cycled.steps_per_epoch(1400)} steps, {cycled.epoch_samples(4):,} samples "
      "per process on 4 processes")
print(expect_error(lambda: TrainConfig(data="imagefolder", loader="gpu-decode", epoch_steps=250)))

# %% [markdown]
# ### Recipes: the paper's settings by name
#
# A recipe is a named set of config values over the defaults, `--preset` on the command line; explicit settings
# override it. `deit` is DeiT's and the paper's ImageNet recipe (global batch 1024 with repeated augmentation ×3;
# 300 epochs); `imagenet` adds the data; `cifar100-224` is the paper's SM C (CIFAR-100 upsampled to 224 px, every
# hyper-parameter unchanged); `cifar100-32` trains at CIFAR's own 32 px in 4-pixel patches, with the classic
# pad-crop-flip augmentation and a global batch of 128 on any number of GPUs. `sample-efficiency` is chapter 35's
# Table 2 at a CPU's scale: 64-px images of an image folder in 8 × 8-px patches, a DeiT of width 72, 9 heads,
# 6 blocks, crops and flips only (no RandAugment, mixing, erasing), batches of 32. Each run of that grid adds its own
# flags (the fraction, its length, the seed; the ConViT is `--model convit_tiny --local-up-to-layer 4`, the same
# model, GPSA in its first 4 blocks).

# %%
#| export
_DEIT_RECIPE = dict(epochs=300, global_batch=1024, lr=5e-4, min_lr=1e-5, warmup_lr=1e-6, warmup_epochs=5.0,
             weight_decay=0.05, drop_path_rate=0.1, img_size=224, aug="deit", repeats=3, ema_decay=None, clip_grad=None)

RECIPES: dict[str, dict[str, Any]] = {
    "deit": _DEIT_RECIPE,
    "imagenet": {**_DEIT_RECIPE, "data": "imagefolder", "data_root": "data/imagenet"},
    "cifar100-224": {**_DEIT_RECIPE, "data": "cifar100"},
    "cifar100-32": {**_DEIT_RECIPE, "data": "cifar100", "aug": "pad-crop-flip", "img_size": 32,
                    "model_args": {"patch_size": 4}, "global_batch": 128, "repeats": 1},
    "sample-efficiency": {  # chapter 35's CPU-scale Table 2, over the defaults (not DeiT's batch or repeats)
        "model": "deit_tiny", "model_args": {"patch_size": 8, "embed_dim": 72, "num_heads": 9, "depth": 6},
        "data": "imagefolder", "img_size": 64, "drop_path_rate": 0.05, "global_batch": 32, "lr": 1.6e-2,
        "weight_decay": 0.05, "aug": "deit", "aug_args": {"scale": (0.35, 1.0), "randaugment_magnitude": None,
        "erasing": 0.0, "mixup_alpha": 0.0, "cutmix_alpha": 0.0, "crop_ratio": 1.0, "label_smoothing": 0.1}},
}


def recipe(name: str) -> dict[str, Any]:
    """The `TrainConfig` values a recipe sets (a copy); ValueError listing the recipes for an unknown name."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in RECIPES[one_of("recipe", name, RECIPES)].items()}


# %%
print({name: TrainConfig(**recipe(name)).aug for name in RECIPES})  # every recipe is a valid config
