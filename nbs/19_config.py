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
# distillation from a CNN teacher (SM B, Table 4). Chapters 19-25 write the loop that does it once for every scale
# (a CPU, one GPU, `torchrun` on one node, many nodes under SLURM), and check the strongest property a checkpoint can
# have: **a run stopped anywhere and resumed ends with exactly the weights of a run that never stopped.**
# Chapter 28 used that loop as a tool; these chapters open it. This one writes the config every run is: `TrainConfig`,
# validated once, the paper's recipes by name, and the one translation between a config and a command's words.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp config
# A training run is a config: `TrainConfig`, validated once, the paper's recipes by name, and the one pair of
# translators between a config and the command line's words.

# %%
from convit_edu.checks import expect_error

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
from dataclasses import dataclass, field, fields
from typing import Any

from convit_edu.augment import AUGMENTATION_RENAMES, AugConfig, augmentation
from convit_edu.checks import number, one_of, positive_int
from convit_edu.dali import DALI_INSTALL, LOADERS, dali_available
from convit_edu.datasets import DATASETS, check_fraction
from convit_edu.devices import PRECISIONS, check_device
from convit_edu.loaders import default_num_workers
from convit_edu.models import ModelConfig
from convit_edu.zoo import model_config

PROGRESS = ("auto", "bar", "lines", "none")
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
    loader: str = setting("torchvision", "torchvision (workers decode with PIL), or for imagefolder data dali (NVIDIA "
                                         f"DALI; {DALI_INSTALL}) or gpu-decode (the training device decodes)")
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
        for name in ("img_size", "repeats", "epochs", "eval_every", "batch_size", "accum_steps", "log_every",
                     "seed", "ckpt_every"):
            positive_int(name, getattr(self, name), minimum=0 if name in ("seed", "ckpt_every") else 1)
        for name, minimum in (("classes", 1), ("global_batch", 1), ("num_workers", 0)):
            if getattr(self, name) is not None:
                positive_int(name, getattr(self, name), minimum=minimum)
        number("lr", self.lr, 0, open_low=True)
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
                                     ("dataset", self.data, DATASETS), ("loader", self.loader, LOADERS)):
            one_of(what, value, choices)
        if self.teacher_checkpoint is not None and not self.distill_teacher:
            raise ValueError(f"teacher_checkpoint {self.teacher_checkpoint} given without distill_teacher (the "
                             "teacher's model name)")
        self.model_config(num_classes=2, distilled=False)  # the model and augmentation it describes can be built
        aug = self.aug_config()
        if self.loader != "torchvision":
            _check_loader(self, aug)

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
        """Optimiser steps per epoch over `train_images`: each process's share (⌈n / world⌉, as the repeated-
        augmentation sampler deals them) in whole steps of `accum_steps` micro-batches."""
        share = -(-train_images // world_size)
        return share // self.per_device_batch(world_size) // self.accum_steps

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
    """What the loaders of chapter 17 (dali, gpu-decode: they read image folders) cannot do, refused when made."""
    if cfg.data != "imagefolder":
        raise ValueError(f"loader {cfg.loader!r} reads image files: it needs data 'imagefolder', not {cfg.data!r} "
                         "(use loader 'torchvision')")
    if aug is None or aug.crop != "random_resized":
        raise ValueError(f"loader {cfg.loader!r} implements the random-resized-crop recipe (aug 'deit'), not aug "
                         f"{cfg.aug!r} (use loader 'torchvision')")
    if cfg.loader == "dali" and cfg.repeats != 1:
        raise ValueError(f"loader 'dali' has no repeated augmentation: repeats {cfg.repeats} needs loader "
                         "'torchvision'")
    if cfg.loader == "dali" and not dali_available():
        raise ImportError(f"loader 'dali' needs NVIDIA DALI, which is not installed: {DALI_INSTALL} (or use loader "
                          "'torchvision')")


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
# ### Recipes: the paper's settings by name
#
# A recipe is a named set of config values over the defaults, `--preset` on the command line; explicit settings
# override it. `deit` is DeiT's and the paper's ImageNet recipe (global batch 1024 with repeated augmentation ×3;
# 300 epochs); `imagenet` adds the data; `cifar100-224` is the paper's SM C (CIFAR-100 upsampled to 224 px, every
# hyper-parameter unchanged); `cifar100-32` trains at CIFAR's own 32 px in 4-pixel patches, with the classic
# pad-crop-flip augmentation and a global batch of 128 on any number of GPUs. `sample-efficiency` is chapter 31's
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
    "sample-efficiency": {  # chapter 31's CPU-scale Table 2, over the defaults (not DeiT's batch or repeats)
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

# %% [markdown]
# ### A config as command-line words, and back
#
# A run has one shape, a `TrainConfig`, and one way to be written as a command. Every `TrainConfig` field is a flag of
# the same name (`warmup_epochs` is `--warmup-epochs`); the dict fields gather the flags of what they override: each
# `ModelConfig` field is a flag filling `model_args` (`--local-up-to-layer 4`), each `AugConfig` field one filling
# `aug_args` (`--mixup-alpha 0`), and `--data-arg KEY=VALUE` fills `data_args`; those the run owns (`RUN_OWNED`) are
# the run's flags only. Booleans are `--flag` / `--no-flag`, `None` is `none`, a range is one word per number.
#
# `config_to_words` writes a config as `--preset NAME` and a flag for every setting that differs from what the recipe
# gives; `config_from_words` reads words back: defaults < preset < flags, the dict fields merged key by key
# (`--local-up-to-layer 4` keeps the preset's patch size; `resolve_config` does the same for values). The command line
# (chapter 37) builds its `train` parser from these flags (`add_config_flags`, `config_from_args`) and the experiment
# grids (chapters 31, 33) print their runs with `config_to_words`: one pair of translators, so any run of a grid can be
# repeated by hand from the words it prints. One setting gives way: the DALI loader (chapter 17) has no `repeats`, so
# a preset's `repeats` becomes 1 under `loader` 'dali', with a note (an explicit `--repeats 3` is still refused).
# The translators are their own module, `convit_edu.config_words`; `convit_edu.config` holds the config itself.

# %%
#| export
DICT_FIELDS = ("model_args", "aug_args", "data_args")  # overrides of another dataclass's fields, merged by key


def resolve_config(preset: str | None, values: dict[str, Any]) -> tuple[TrainConfig, list[str]]:
    """The config of recipe `preset` (None: the defaults) with `values` on top — defaults < preset < values, the
    dict fields (`model_args`, `aug_args`, `data_args`) merged key by key — and notes on what the preset could
    not keep: a preset's `repeats` gives way to `loader` 'dali', which has no repeated augmentation."""
    _check_names(values)
    merged = recipe(preset) if preset is not None else {}
    for key, value in values.items():
        if key in DICT_FIELDS and not isinstance(value, dict):
            raise TypeError(f"{key} must be a dict of overrides, e.g. {{'depth': 6}}, not {value!r}")
        merged[key] = {**merged.get(key, {}), **value} if key in DICT_FIELDS else value
    notes = []
    if merged.get("loader") == "dali" and merged.get("repeats", 1) != 1 and "repeats" not in values:
        notes.append(f"loader dali has no repeated augmentation: the preset's repeats {merged['repeats']} becomes 1 "
                     "(each image once per epoch; --loader torchvision keeps it)")
        merged["repeats"] = 1
    return TrainConfig(**merged), notes


# %%
#| export config_words
# A config as command-line words and back: the `train` command's flags (one per setting), the namespace they parse
# into, and the words that give back a config.

# %%
#| export config_words
import argparse
import ast
import typing
import warnings
from collections.abc import Sequence
from dataclasses import MISSING, Field, fields
from typing import Any

from convit_edu.augment import AugConfig
from convit_edu.config import DICT_FIELDS, RECIPES, RUN_OWNED, TrainConfig, resolve_config
from convit_edu.models import ModelConfig

_OVERRIDES = {  # TrainConfig field: (the dataclass it overrides, the prefix of its flags' dests, the group's title)
    "model_args": (ModelConfig, "model", "model architecture (convit_edu.models.ModelConfig; defaults shown are "
                                         "ConViT-Ti's, unset flags keep those of --model)"),
    "aug_args": (AugConfig, "aug", "augmentation (convit_edu.augment.AugConfig; defaults shown are those of the deit "
                                   "augmentation, unset flags keep those of --aug)")}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_value(text: str) -> Any:
    """`3` -> 3, `0.5` -> 0.5, `none` -> None, `true` -> True, `(1, 2)` -> (1, 2), anything else -> the string."""
    special = {"none": None, "null": None, "true": True, "false": False}
    if text.strip().lower() in special:
        return special[text.strip().lower()]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _value_word(value: Any) -> str:
    """The word `_parse_value` reads back as `value`: `none`, `3`, `0.5`, `(1, 2)`, a plain string, or a quoted
    one where the plain one would read as something else (`'3'`, `'none'`)."""
    word = "none" if value is None else str(value)
    if _parse_value(word) == value and type(_parse_value(word)) is type(value):
        return word
    if _parse_value(repr(value)) != value:
        raise ValueError(f"{value!r} cannot be written as a command-line word (a number, string, bool, tuple or None)")
    return repr(value)


def _kind(f: Field) -> tuple[str, list[type]]:
    """How field `f` is a flag: "bool" (--x / --no-x), "tuple" (one word per number), "parsed" (`_parse_value`:
    a field that may be None or of several types) or "plain" (its default's type); and its non-None types."""
    default = f.default if f.default is not MISSING else f.default_factory()
    types = [t for t in typing.get_args(f.type) if t is not type(None)]
    if isinstance(default, (bool, tuple)):
        return ("bool" if isinstance(default, bool) else "tuple"), types
    return ("parsed" if types or default is None else "plain"), types


def _add_flag(group, f: Field, dest: str) -> None:
    """One flag for dataclass field `f`, storing into `dest`; unset flags stay out of the namespace."""
    default = f.default if f.default is not MISSING else f.default_factory()
    help = f"{f.metadata.get('help', '')} (default: {default})".strip()
    kwargs = dict(dest=dest, default=argparse.SUPPRESS, help=help)
    kind, types = _kind(f)
    if kind == "bool":
        group.add_argument(_flag(f.name), action=argparse.BooleanOptionalAction, **kwargs)
    elif kind == "tuple":
        group.add_argument(_flag(f.name), type=float, nargs=len(default), metavar="X", **kwargs)
    elif kind == "parsed":
        metavar = "|".join(t.__name__.upper() for t in types) or "VALUE"
        group.add_argument(_flag(f.name), type=_parse_value, metavar=metavar, **kwargs)
    else:
        group.add_argument(_flag(f.name), type=type(default), metavar=type(default).__name__.upper(), **kwargs)


def _field_words(f: Field, value: Any) -> list[str]:
    """The words of `f`'s flag that set it to `value` (`_add_flag`'s inverse)."""
    kind, _ = _kind(f)
    if kind == "bool":
        return [_flag(f.name) if value else "--no-" + f.name.replace("_", "-")]
    if kind == "tuple":
        return [_flag(f.name), *map(str, value)]
    word = _value_word(value) if kind == "parsed" else str(value)
    return [f"{_flag(f.name)}={word}"] if word.startswith("-") else [_flag(f.name), word]  # "-x" is no option


def parse_key_value(item: str, flag: str) -> tuple[str, Any]:
    """A `KEY=VALUE` word of `flag` (`--data-arg num_train=512`) as (key, value), the value read as every flag's
    is (`3`, `0.5`, `none`, `true`, `(1, 2)` or a string); ValueError when there is no `=`."""
    key, sep, value = item.partition("=")
    if not sep:
        raise ValueError(f"{flag} {item!r} is not KEY=VALUE")
    return key, _parse_value(value)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """`--preset`, `--data-arg` and one flag per setting (`TrainConfig`'s, then its `model_args`' and `aug_args'`
    fields, each group under its title), read back by `config_from_args`."""
    parser.add_argument("--preset", choices=list(RECIPES), help="a recipe (config.RECIPES); it prints what it sets")
    parser.add_argument("--data-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="extra dataset arguments (data_args), e.g. --data-arg num_train=512 for --data fake")
    run = parser.add_argument_group("run (TrainConfig)")
    for f in fields(TrainConfig):
        if f.name in _OVERRIDES:
            cls, prefix, title = _OVERRIDES[f.name]
            group = parser.add_argument_group(title)
            for g in [g for g in fields(cls) if g.name not in RUN_OWNED]:
                _add_flag(group, g, f"{prefix}.{g.name}")
        elif f.name != "data_args":  # data_args has the repeatable --data-arg instead
            _add_flag(run, f, f.name)


def config_from_args(args: argparse.Namespace) -> tuple[TrainConfig, list[str]]:
    """The config of a namespace parsed by a parser with `add_config_flags` (its other attributes ignored), and
    `resolve_config`'s notes."""
    values: dict[str, Any] = {"data_args": dict(parse_key_value(item, "--data-arg") for item in args.data_arg)}
    target = {prefix: name for name, (_, prefix, _) in _OVERRIDES.items()}
    for key, value in vars(args).items():
        prefix, _, name = key.partition(".")
        if name:
            values.setdefault(target[prefix], {})[name] = tuple(value) if isinstance(value, list) else value
        elif key in {f.name for f in fields(TrainConfig)}:
            values[key] = value
    return resolve_config(args.preset, values)


class _WordsParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # a ValueError for the caller, not an exit
        raise ValueError(f"convit-edu train: {message}")


def config_from_words(words: Sequence[str]) -> TrainConfig:
    """The config that `convit-edu train WORDS` trains: defaults < `--preset` < flags, read as the command line
    reads them (`add_config_flags`); ValueError for a word it does not know. A note of `resolve_config` is a
    warning here."""
    parser = _WordsParser(prog="convit-edu train", add_help=False)
    add_config_flags(parser)
    cfg, notes = config_from_args(parser.parse_args(list(words)))
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return cfg


def config_to_words(cfg: TrainConfig, preset: str | None = None) -> list[str]:
    """`convit-edu train` words that give back `cfg`: `--preset NAME` when given, then the flag of every setting
    that differs from what the preset (or the defaults) gives, in field order; `config_from_words` reads them
    back into an equal config. Flags add to a preset's dicts and cannot remove a key: ValueError naming it."""
    base, _ = resolve_config(preset, {})
    words = ["--preset", preset] if preset is not None else []
    for f in fields(TrainConfig):
        value, given = getattr(cfg, f.name), getattr(base, f.name)
        if f.name in DICT_FIELDS:
            missing = sorted(set(given) - set(value))
            if missing:
                raise ValueError(f"{f.name} {value} lacks {missing[0]!r}, which preset {preset} sets: flags cannot "
                                 "remove it; pass another preset, or none")
            changed = {k: v for k, v in value.items() if k not in given or given[k] != v}
            if f.name == "data_args":
                words += [w for k, v in changed.items() for w in ("--data-arg", f"{k}={_value_word(v)}")]
            else:
                by_name = {g.name: g for g in fields(_OVERRIDES[f.name][0])}
                words += [w for k, v in changed.items() for w in _field_words(by_name[k], v)]
        elif value != given:
            words += _field_words(f, value)
    return words


# %% [markdown]
# A run of chapter 31's grid (recipe, data folder, four changes) as words and back, with the preset or without (then a
# flag for each setting off the defaults); `TrainConfig.from_dict` reads its `run.json` back equal, tuples and all.

# %%
import json
import shlex
from dataclasses import asdict

run, _ = resolve_config("sample-efficiency", {"model": "convit_tiny", "model_args": {"local_up_to_layer": 4},
                                               "data_root": "data/tiny", "fraction": 0.1, "epochs": 250, "seed": 1})
for words in (config_to_words(run, "sample-efficiency"), config_to_words(run)):
    print(shlex.join(words))
    assert config_from_words(words) == run
assert run.model_args["patch_size"] == 8  # the preset's, kept
assert TrainConfig.from_dict(json.loads(json.dumps(asdict(run)))) == run
print(expect_error(lambda: config_from_words(["--epochs", "ten"])))
