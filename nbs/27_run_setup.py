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
# # What a run is made of
#
# A run is built in the order that lets every bad input fail before any training work — the config was
# checked when it was made; then the output folder (writable?), the data (more processes than samples? a batch
# larger than a process's share?), the model and the resume checkpoint (chapter 26: the same model? the same
# global batch?), the optimisation — and only then trained. `Trainer.__init__` (chapter 28) is that order; the
# functions here build its pieces (`run_setup`), each checked below on a small config. What a run leaves behind, its
# folder, is the next chapter's (`27_what_a_run_writes`).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp run_setup
# A training run built from its config: its datasets, its loaders, its models and their wrapping (DDP, compile),
# and the compile cache a requeued job finds.

# %%
#| export
import contextlib
import math
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import Dataset

from convit_edu.augment import AUGMENTATIONS, AugConfig, DeviceTransforms, MixupCutmix, build_mixup, build_transforms
from convit_edu.config import TrainConfig
from convit_edu.datasets import build_datasets
from convit_edu.distributed import World, run_on_main
from convit_edu.loader_registry import LOADERS
from convit_edu.loaders import DataLoaders
from convit_edu.models import VisionTransformer
from convit_edu.optimisation import build_optimizer, build_teacher
from convit_edu.run_state import TrainState

# %%
import tempfile
from dataclasses import replace

import torch.distributed as dist

from convit_edu.checks import expect_error

world = World(0, 1, torch.device("cpu"), False)  # one process on the CPU: rank 0 of 1
tmp = Path(tempfile.mkdtemp())
tiny = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 48, "depth": 2,
                   "local_up_to_layer": 1}, data="fake", data_args={"num_train": 64, "num_val": 16, "image_size": 16},
                   epochs=1, batch_size=8, precision="fp32", num_workers=0, progress="none", output=str(tmp / "run"))

# %% [markdown]
# ## The data
#
# The datasets (the config's, or the caller's), the per-process batch and the global batch it implies, chapter
# 17's `build_loaders` for this process's share with `cfg.loader_workers()` workers (by default what this
# process's share of the node's CPUs allows), and the batch mixing of the augmentation. The config's own
# datasets ship uint8 crops from the workers, and `finish_batch` normalises and erases each batch on the device
# with chapter 17's `DeviceTransforms`; a caller's datasets that give float tensors pass through unchanged.
# A loader that reads the image files itself (chapter 21's table: `dali`, `gpu-decode`) gets the datasets' file
# lists untransformed instead. With `loader="dali"` chapter 18's `DaliLoaders` replaces `build_loaders`: the same
# uint8 batches, decoded on the GPU; its exact resume is the pipelines' own state (`state()`), one per process,
# saved in the checkpoint (chapter 26), so it resumes on as many processes as it ran.
#
# **Rank 0 writes, and builds the datasets first.** Every write of rank 0 goes through chapter 24's
# `run_on_main`, so that a full disk there stops every process at once; rank 0 also builds the config's datasets
# first, so that an ImageNet folder's 1.28 M file names are listed once, by rank 0, which caches the list
# (chapter 13), and read from that cache by the others.

# %%
#| export
def config_datasets(cfg: TrainConfig, world: World, aug: AugConfig | None) -> tuple:
    """The config's datasets (train, val, class names), built by rank 0 first (an image folder's file list is
    then cached, chapter 13) and by the other processes after it, from that cache. For a loader that does not read
    the files itself (`loader="torchvision"`) their samples are uint8 crops, for `DeviceTransforms` to finish on the
    device."""
    if aug is None:
        raise ValueError("aug None (no augmentation) needs datasets passed to train(); the config's own "
                         f"datasets need an augmentation ({', '.join(AUGMENTATIONS)})")
    reads_files = LOADERS[cfg.loader].reads_files
    train_tf, val_tf = (None, None) if reads_files else build_transforms(aug, on_device=True)
    build = partial(build_datasets, cfg.data, cfg.data_root, train_transform=train_tf, val_transform=val_tf,
                    fraction=cfg.fraction, max_classes=cfg.classes, **cfg.data_args)
    datasets = run_on_main(world, f"read the dataset in {cfg.data_root}", build)
    return datasets if world.main else build()


# %% [markdown]
# The config's fake data: its crops leave the workers as uint8, a quarter of the bytes of float32; and a config
# without augmentation is refused here, since it is meant for datasets that the caller prepared.

# %%
train_set, val_set, classes = config_datasets(tiny, world, tiny.aug_config())
image, label = train_set[0]
assert image.dtype == torch.uint8 and image.shape == (3, 16, 16), (image.dtype, image.shape)
print(f"{len(train_set)} training and {len(val_set)} validation images of {len(classes)} classes;",
      f"a sample: {image.dtype} {tuple(image.shape)}")
message = expect_error(lambda: config_datasets(replace(tiny, aug=None), world, None))
assert "needs datasets passed to train()" in message
print(message)

# %% [markdown]
# The loaders are of the config's kind (`loader`), built by its entry in chapter 21's table: chapter 17's workers,
# which decode and augment each image, the GPU-decoding ones of chapter 19, whose workers only read file bytes, or
# DALI's pipelines (chapter 18). Each kind gives the train batches of an epoch from a position (`epoch(e, start)`)
# and this process's evaluation batches (`val`), whose workers, like the train loader's, are started once and kept.

# %%
#| export
def build_run_loaders(cfg: TrainConfig, world: World, aug: AugConfig | None, train_set: Dataset, val_set: Dataset,
                      batch_size: int, num_workers: int) -> Any:
    """This process's loaders of the kind `cfg.loader` names (its `LOADERS` entry builds them), `batch_size` images a
    step (val: twice that); with `cfg.epoch_steps`, epochs of a stream that cycles the training set."""
    cycling = {} if cfg.epoch_steps is None else {"epoch_samples": cfg.epoch_samples(world.world_size)}
    return LOADERS[cfg.loader].build(train_set, val_set, aug, batch_size=batch_size, num_workers=num_workers,
                                     repeats=cfg.repeats, num_replicas=world.world_size, rank=world.rank,
                                     seed=cfg.seed, device=world.device, **cycling)

# %%
run_loaders = build_run_loaders(tiny, world, tiny.aug_config(), train_set, val_set, batch_size=8, num_workers=0)
images, labels = next(run_loaders.epoch(0))
print(f"train batch {tuple(images.shape)} {images.dtype}; val batches of {[len(y) for _, y in run_loaders.val]}")
assert images.shape == (8, 3, 16, 16) and sum(len(y) for _, y in run_loaders.val) == len(val_set)

# %% [markdown]
# ## The model and the teacher
#
# The initial weights are a function of the seed alone, the same on every process. A teacher (hard
# distillation, SM B; chapter 23's `build_teacher`) is frozen, and the student gets a distillation head.

# %%
#| export
def build_models(cfg: TrainConfig, num_classes: int, device: torch.device, model: nn.Module | None = None,
                 teacher: nn.Module | None = None) -> tuple[nn.Module, nn.Module | None]:
    """(student, teacher or None) on `device`: `model`, else `cfg.model` (with a distillation head when there is
    a teacher) seeded by `cfg.seed` alone; `teacher`, else `cfg.distill_teacher` when set, in eval mode."""
    torch.manual_seed(cfg.seed)  # the initial weights are a function of the seed, identical on every rank
    if teacher is None and cfg.distill_teacher:
        teacher = build_teacher(cfg.distill_teacher, cfg.teacher_checkpoint, num_classes, cfg.img_size)
    if model is None:
        model = VisionTransformer(cfg.model_config(num_classes, distilled=teacher is not None))
    return model.to(device), teacher.to(device).eval() if teacher is not None else None


# %% [markdown]
# Two builds from one seed hold the same weights, as every process's build must; a teacher passed in comes back
# in eval mode, and the student beside it has a distillation token and head.

# %%
first, _ = build_models(tiny, len(classes), world.device)
again, _ = build_models(tiny, len(classes), world.device)
assert all(torch.equal(p, q) for p, q in zip(first.state_dict().values(), again.state_dict().values()))
student, teacher = build_models(tiny, len(classes), world.device, teacher=nn.Linear(3 * 16 * 16, len(classes)))
assert student.config.distilled and not first.config.distilled and not teacher.training
print(f"seed {tiny.seed}: the same {sum(p.numel() for p in first.parameters())} weights twice; with a teacher,",
      f"{sum(p.numel() for p in student.parameters()) - sum(p.numel() for p in first.parameters())} more for the",
      "distillation token and head")

# %% [markdown]
# ## The optimisation
#
# The optimisation is chapter 23's: `build_optimizer` (AdamW and the DeiT schedule), the fp16 loss scaler (a
# no-op in other precisions) and the EMA of the weights, updated by `update_ema` without reading the device
# back. Then the wrappers: DDP for several processes and `torch.compile` when asked.
#
# DDP all-reduces the gradients in buckets; with `gradient_as_bucket_view` the gradients *are* views of those
# buckets, which saves a copy of every gradient per step. By default DDP also sends rank 0's buffers to every
# process before each forward, accumulation micro-steps included. The only buffers of a ConViT, of GPSA layers or
# of App. A's PSA, are its `rel_indices`: non-persistent constants that every process builds alike, 4.6 MB per
# forward at 224 px for nothing. So buffers travel only when the model has state buffers, the ones a `state_dict`
# keeps, such as BatchNorm's running statistics.
#
# A compiled run spends its first step compiling, and a requeued job would compile again from nothing: torch's
# compile cache sits in `/tmp` of a node that may be another one. `compile_cache` points the cache at the run's
# folder for the duration of the run, unless `TORCHINDUCTOR_CACHE_DIR` is set, and then puts the variable back.
# The trainer reports the first step's seconds as `compile_s`.

# %%
#| export
def wrap_model(model: nn.Module, world: World, compile: bool) -> tuple[nn.Module, nn.Module]:
    """(`model` in DDP when there are several processes, else `model`; what the step calls: that, compiled when
    `compile`). DDP reuses its buckets as gradients, and broadcasts buffers only when the model has state buffers."""
    ddp = model
    if world.world_size > 1:
        state = model.state_dict(keep_vars=True)
        ddp = DistributedDataParallel(model, device_ids=[world.device] if world.device.type == "cuda" else None,
                                      broadcast_buffers=any(b is state.get(n) for n, b in model.named_buffers()),
                                      gradient_as_bucket_view=True)
    return ddp, torch.compile(ddp) if compile else ddp


@contextlib.contextmanager
def compile_cache(cache: Path, compile: bool):
    """For the duration of a compiled run: torch's compile cache in the folder `cache` (the run folder's, where a
    requeued job finds it), unless `TORCHINDUCTOR_CACHE_DIR` is set; the variable is restored afterwards."""
    if not compile or "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache.resolve())
    try:
        yield
    finally:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]

# %% [markdown]
# A ConViT's buffers are all constants, so DDP would not broadcast them; a model with BatchNorm has running
# statistics, which it would. (The check builds the real DDP on a one-process gloo group; a run of one process
# gets no wrapper at all.) The compile cache is set inside the run and gone after it.

# %%
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
two = World(0, 2, torch.device("cpu"), False)  # a world of two as DDP's flags are concerned
convit = VisionTransformer(tiny.model_config(4, distilled=False))
psa = VisionTransformer(replace(tiny, model_args={**tiny.model_args, "local_attention": "psa"}).model_config(4, distilled=False))
with_bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
wrapped = {name: wrap_model(m, two, compile=False)[0]
           for name, m in (("ConViT", convit), ("PSA ConViT", psa), ("BatchNorm", with_bn))}
dist.destroy_process_group()
print({name: ddp.broadcast_buffers for name, ddp in wrapped.items()})
assert wrapped["BatchNorm"].broadcast_buffers and not any(wrapped[n].broadcast_buffers for n in ("ConViT", "PSA ConViT"))
for attention in ("gpsa", "psa"):
    at_224 = replace(tiny, model_args={"local_attention": attention}, img_size=224).model_config(1000, distilled=False)
    buffer_mb = sum(b.numel() * b.element_size() for b in VisionTransformer(at_224).buffers()) / 1e6
    print(f"ConViT-Ti of {attention.upper()} layers at 224 px: {buffer_mb:.1f} MB of buffers that DDP would send "
          f"before every forward")
    assert round(buffer_mb, 1) == 4.6
assert wrap_model(convit, world, compile=False) == (convit, convit)
yours = os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # as on a machine that does not set it
with compile_cache(tmp / "run" / "compile-cache", compile=True):
    inside = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
assert inside == str((tmp / "run" / "compile-cache").resolve()) and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
if yours is not None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = yours

# %% [markdown]
# What a run reads, and how much of it one step takes, is settled once, before any model exists: the datasets of
# the config (or yours), checked (two classes at least, one step per epoch at least), this process's loaders,
# the batch per process and per step, and the device end of the recipe (MixUp/CutMix, normalising and erasing
# uint8 batches, label smoothing). `new_train_state` then gives a model its optimiser, schedule, fp16 scaler and
# EMA: the run's state of chapter 26 at step 0.

# %%
#| export
@dataclass
class RunData:
    """What a run reads and how much of it one step takes, built once from its config by `build_run_data`."""

    loaders: DataLoaders  # this process's train and val batches (their workers kept between epochs)
    num_classes: int
    batch_size: int  # per process and micro-batch
    global_batch: int  # per optimiser step: every process, every micro-batch
    steps_per_epoch: int
    num_workers: int  # loader processes (DALI: threads) of this process
    mixup: MixupCutmix | None  # the recipe's MixUp/CutMix, on the device
    device_transforms: DeviceTransforms | None  # normalise (and, training, erase) uint8 batches on the device
    smoothing: float  # label smoothing, when MixUp/CutMix does not smooth the labels itself


def build_run_data(cfg: TrainConfig, world: World, datasets: tuple | None = None) -> RunData:
    """`cfg`'s datasets, or `datasets` = (train, val, class names), checked, and their loaders on this process."""
    aug = cfg.aug_config()
    if datasets is None:
        datasets = config_datasets(cfg, world, aug)
    elif LOADERS[cfg.loader].reads_files:
        takers = " or ".join(repr(name) for name, kind in LOADERS.items() if not kind.reads_files)
        raise ValueError(f"loader {cfg.loader!r} reads the config's own image folder (data_root): datasets "
                         f"passed to train() need loader {takers}")
    train_set, val_set, classes = datasets
    if len(classes) < 2:
        raise ValueError(f"the dataset has {len(classes)} class(es) ({', '.join(map(str, classes))}): a "
                         "classifier needs at least two (check --data-root, --classes)")
    batch_size = cfg.per_device_batch(world.world_size)
    steps_per_epoch = cfg.steps_per_epoch(len(train_set), world.world_size)
    if steps_per_epoch == 0 and len(train_set) >= world.world_size:  # (else build_loaders says so)
        share = math.ceil(len(train_set) / world.world_size)  # samples per process and epoch
        raise ValueError(f"each of the {world.world_size} processes gets {share} samples per epoch, fewer than "
                         f"one optimiser step of batch {batch_size} × accum_steps {cfg.accum_steps}: lower the batch")
    num_workers = cfg.loader_workers()
    return RunData(build_run_loaders(cfg, world, aug, train_set, val_set, batch_size, num_workers), len(classes),
                   batch_size, cfg.images_per_step(world.world_size), steps_per_epoch, num_workers,
                   build_mixup(aug, len(classes)) if aug else None, DeviceTransforms(aug) if aug else None,
                   aug.label_smoothing if aug else 0.0)


def new_train_state(cfg: TrainConfig, world: World, model: nn.Module, data: RunData, precision: str,
                    graphed: bool) -> TrainState:
    """A run's state at step 0: `model`'s optimiser and schedule (`graphed`: one a CUDA graph can capture, chapter
    28_cuda_graphs), fp16's loss scaler, and the EMA — a copy of the model as it is now, so load resumed weights first."""
    optimizer, schedule = build_optimizer(cfg, model, data.global_batch, data.steps_per_epoch, world.device,
                                          graphed=graphed)
    scaler = torch.amp.GradScaler(world.device.type, enabled=precision == "fp16")
    ema = AveragedModel(model, use_buffers=True) if cfg.ema_decay else None  # see `update_ema`
    return TrainState(cfg, model, optimizer, world.rank, world.world_size, data.steps_per_epoch, schedule, scaler,
                      ema)
