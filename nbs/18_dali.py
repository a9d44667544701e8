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
# # GPU decoding with NVIDIA DALI
#
# Loaders for ImageNet-scale GPU runs, where PIL in loader workers limits the GPU (80–220 ImageNet images a second per
# core; one H200 trained the S and Ti models on 5,000–8,300 a second, chapter 45): this chapter's NVIDIA DALI (an
# optional extra) decodes and augments in its own graph, with chapter 15's per-image recipe, resumable; chapter 19's
# `loader="gpu-decode"` needs nothing beyond torchvision.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp dali
# An optional NVIDIA DALI loader: the DeiT recipe decoded and augmented by DALI, resumable.

# %%
#| export
import math
import warnings
from collections.abc import Iterator
from typing import Sequence

import numpy as np
import torch

from convit_edu.augment import AugConfig, RANDAUGMENT_MAX_MAGNITUDE
from convit_edu.datasets import ImageFolderDataset
from convit_edu.samplers import seed_from, val_shard

# %%
import warnings

import torch

from convit_edu.augment import augmentation, build_transforms
from convit_edu.datasets import build_datasets
from convit_edu.photographs import tiny_imagenet

torch.manual_seed(0)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now) Chapter 14's images: the first four classes.
TINY = tiny_imagenet("../data")
train_ds, val_ds, _ = build_datasets("imagefolder", TINY, max_classes=4)

# %% [markdown]
# ## Decoding with NVIDIA DALI (optional)
#
# Decoding and cropping a 224-px JPEG costs a loader worker several milliseconds. NVIDIA DALI runs the same per-image
# steps as a graph of C++ operators on a pool of threads, and on a GPU decodes the JPEGs there (`device="mixed"`: the
# file is parsed on the CPU, the pixels decoded by the GPU). It is an optional extra (`pip install -e ".[dali]"`),
# selected by `TrainConfig(loader="dali")` (`--loader dali`) for ImageNet-style folders; its pipelines run on the CPU
# too, which is how this chapter and the tests use them.
#
# The DALI path does the per-image part of the recipe — chapter 17's workers' part — and ships the same uint8
# (B, 3, S, S) batches; normalisation, RandomErasing and MixUp/CutMix then run on the training device through
# `DeviceTransforms` as for the torchvision loader. The training pipeline reads the files of the same subset
# (`fraction`, `classes`: the dataset's own file list), `RandomResizedCrop` with the recipe's scale and ratio, a flip
# with probability `hflip`, and RandAugment at DeiT's strength: `randaugment_ops` times, a coin flip with probability
# `randaugment_prob` (a DALI *conditional*, `if` on a per-sample value), then one op of DALI's RandAugment at magnitude
# m of 11 bins, i.e. m/10 of each op's maximum. The evaluation pipeline resizes the shorter side to `img_size /
# crop_ratio` and takes the centre crop. What is not the same (the last column: the next section's loader):
#
# | | torchvision path | DALI path | gpu-decode path |
# |---|---|---|---|
# | crop sampling | torchvision's 10 tries, then a centre crop | DALI's 10 tries; its fallback and its random numbers differ | torchvision's rule: the same draws |
# | resize | PIL bicubic with antialiasing | DALI's cubic filter with antialiasing: close, not pixel-identical | torchvision's bicubic on floats: a fraction of a level from PIL's on average, up to ~15 on small upscaled crops (PIL rounds between its passes) |
# | RandAugment ops | torchvision's 14 (Identity, no Invert/SolarizeAdd) | DALI's 14: the same list | torchvision's 14 on tensors (not PIL's) |
# | RandAugment strength | m/10 of torchvision's maxima (rotate 30°, shear 0.3, enhance 0.9) | m/10 of DALI's: the same maxima; translations up to 45 % of the side, as DeiT | torchvision's |
# | RandAugment interpolation and fill | bilinear, per-channel mean colour | bilinear, one grey (the mean of the three means) | torchvision's |
# | magnitude noise (DeiT's "mstd0.5") | not reproduced | not reproduced | not reproduced |
# | epoch | a permutation of the files, cut to whole batches | the reader's own shuffle of the files (after a permutation seeded by the run's seed); its passes run on, so the images that do not fill a last batch open the next epoch | torchvision's (its sampler) |
# | repeated augmentation, the `pad-crop-flip` recipe | yes | no: `loader="dali"` refuses them (`--preset imagenet --loader dali` sets repeats to 1 and prints a note) | repeats yes, `pad-crop-flip` no |
#
# Exact resume: a DALI pipeline built with `enable_checkpointing=True` returns its whole state — where the reader
# stands in its shuffled passes and every random generator of its operators — as bytes from `pipe.checkpoint()`, and a
# pipeline built with `checkpoint=` those bytes goes on from there. The training loop saves one such state per process
# in its checkpoints (chapter 28); the torchvision path's per-sample seeding is not needed. Each process reads its
# shard (`shard_id=rank`, `num_shards=world size`) of each pass, and its augmentation is seeded from (seed, rank).

# %%
#| export
DALI_INSTALL = 'pip install -e ".[dali]"'
_DALI_INTERPOLATION = {"bicubic": "INTERP_CUBIC", "bilinear": "INTERP_LINEAR", "nearest": "INTERP_NN"}


def dali_available() -> bool:
    """Whether NVIDIA DALI (the optional extra ``dali``) can be imported here."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def dali_train_pipeline(files: Sequence[str], labels: Sequence[int], cfg: AugConfig, *, batch_size: int, seed: int,
                        shard_id: int = 0, num_shards: int = 1, device_id: int | None = None, num_threads: int = 1,
                        checkpoint: bytes | None = None):
    """A built DALI pipeline of the recipe's per-image part: read (this shard of each shuffled pass), decode with a
    RandomResizedCrop, resize to ``cfg.img_size``, flip, RandAugment (DeiT's strength, each op with probability
    ``cfg.randaugment_prob``), uint8 CHW. ``device_id`` None: all on the CPU; a GPU index: decoded there
    ("mixed") and augmented there. ``checkpoint``: the bytes of an earlier ``pipe.checkpoint()`` to go on from."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.auto_aug import rand_augment

    interpolation, size = getattr(types, _DALI_INTERPOLATION[cfg.interpolation]), [cfg.img_size] * 2
    fill = round(255 * sum(cfg.mean) / 3)  # one grey: DALI's RandAugment takes a single fill value

    @pipeline_def(enable_conditionals=True, enable_checkpointing=True)
    def pipeline():
        jpegs, targets = fn.readers.file(files=list(files), labels=list(labels), shard_id=shard_id,
                                         num_shards=num_shards, shuffle_after_epoch=True, name="reader")
        images = fn.decoders.image_random_crop(
            jpegs, device="cpu" if device_id is None else "mixed", output_type=types.RGB,
            random_area=list(cfg.scale), random_aspect_ratio=list(cfg.ratio), num_attempts=10)
        images = fn.resize(images, size=size, interp_type=interpolation, antialias=True)
        if cfg.hflip > 0:
            images = fn.flip(images, horizontal=fn.random.coin_flip(probability=cfg.hflip))
        if cfg.randaugment_magnitude is not None:
            for _ in range(cfg.randaugment_ops):
                if fn.random.coin_flip(probability=cfg.randaugment_prob, dtype=types.BOOL):
                    images = rand_augment.rand_augment(
                        images, n=1, m=cfg.randaugment_magnitude, num_magnitude_bins=RANDAUGMENT_MAX_MAGNITUDE + 1,
                        shape=size, max_translate_rel=0.45, fill_value=fill)
        return fn.transpose(images, perm=[2, 0, 1]), targets

    with warnings.catch_warnings(record=True) as caught:
        pipe = pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
                        checkpoint=checkpoint)
        pipe.build()
    for w in caught:  # DALI's RandAugment calls operators DALI has deprecated, warning past the caller's filters
        if not (issubclass(w.category, DeprecationWarning) and "nvidia.dali.fn.experimental" in str(w.message)):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return pipe


def dali_eval_pipeline(files: Sequence[str], labels: Sequence[int], cfg: AugConfig, *, batch_size: int,
                       device_id: int | None = None, num_threads: int = 1):
    """A built DALI pipeline of the evaluation view: the files in order (the last batch padded by repeating
    the last file), the shorter side resized to ``img_size / crop_ratio``, the centre ``img_size`` crop, uint8 CHW."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def pipeline():
        jpegs, targets = fn.readers.file(files=list(files), labels=list(labels), pad_last_batch=True, name="reader")
        images = fn.decoders.image(jpegs, device="cpu" if device_id is None else "mixed", output_type=types.RGB)
        images = fn.resize(images, resize_shorter=int(cfg.img_size / cfg.crop_ratio), antialias=True,
                           interp_type=getattr(types, _DALI_INTERPOLATION[cfg.interpolation]))
        images = fn.crop(images, crop=[cfg.img_size] * 2)  # centred by default
        return fn.transpose(images, perm=[2, 0, 1]), targets

    pipe = pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=0)
    pipe.build()
    return pipe


def _dali_batch(pipe) -> tuple[torch.Tensor, torch.Tensor]:
    """The next (uint8 images, int64 labels) batch of ``pipe`` as torch tensors (images on the pipeline's GPU)."""
    images, labels = pipe.run()
    labels = torch.from_numpy(np.array(labels.as_array())).long().reshape(-1)
    if pipe.device_id is None:
        return torch.from_numpy(np.array(images.as_array())), labels  # np.array copies: DALI reuses its buffers
    from nvidia.dali.plugin.pytorch import feed_ndarray

    dense = images.as_tensor()
    out = torch.empty(dense.shape(), dtype=torch.uint8, device=f"cuda:{pipe.device_id}")
    feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream(pipe.device_id))
    return out, labels

# %% [markdown]
# `DaliLoaders` is what chapter 28's loop holds instead of `DataLoaders`: `epoch()` gives the train batches, `val`
# this rank's share of the validation files (every `world size`-th, as `evaluate` reads a dataset), `state()` and
# `restore()` the pipeline's checkpoint. The train pipeline is built at the first batch, so that a resumed run builds
# it once, from its checkpoint. `build_dali_loaders` builds it as a run builds every kind of loader (chapter 21's
# table, `convit_edu.loader_registry`): `num_workers` DALI threads, decoding on the run's device when it is a GPU.

# %%
#| export
class DaliLoaders:
    """Train and val batches of two ImageNet-style folders (``ImageFolderDataset``s: their file lists, with
    ``fraction`` and ``max_classes`` applied) from DALI pipelines, for rank ``rank`` of ``num_replicas``.

    The file list is permuted once by ``seed`` (DALI's own per-pass shuffle does not take a seed); the
    augmentation is seeded by (seed, rank). ``num_threads``: DALI's CPU threads (the loader workers' role)."""

    def __init__(self, train_set: ImageFolderDataset, val_set: ImageFolderDataset, cfg: AugConfig, *,
                 batch_size: int, num_threads: int = 1, num_replicas: int = 1, rank: int = 0, seed: int = 0,
                 device_id: int | None = None):
        order = np.random.default_rng(seed).permutation(len(train_set.samples))
        self.files = [train_set.samples[i][0] for i in order]
        self.labels = [train_set.samples[i][1] for i in order]
        shard = [val_set.samples[i] for i in val_shard(len(val_set.samples), rank, num_replicas)]
        self.val = DaliEvalBatches([p for p, _ in shard], [t for _, t in shard], cfg, batch_size=2 * batch_size,
                                   device_id=device_id, num_threads=num_threads)
        self.cfg, self.batch_size, self.num_threads, self.device_id = cfg, batch_size, num_threads, device_id
        self.rank, self.num_replicas, self.seed = rank, num_replicas, seed
        self._pipe, self._resume_from = None, None

    def _train_pipeline(self):
        if self._pipe is None:
            self._pipe = dali_train_pipeline(
                self.files, self.labels, self.cfg, batch_size=self.batch_size, seed=seed_from(self.seed, self.rank),
                shard_id=self.rank, num_shards=self.num_replicas, device_id=self.device_id,
                num_threads=self.num_threads, checkpoint=self._resume_from)
        return self._pipe

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Train batches, as many as the caller takes. Where the stream stands is the pipeline's own state (a
        resumed run restores it), so ``epoch`` and ``start`` — which the torchvision path needs — are not used."""
        pipe = self._train_pipeline()
        while True:
            yield _dali_batch(pipe)

    def state(self) -> bytes:
        """The train pipeline's checkpoint: after the batches handed out so far."""
        return self._train_pipeline().checkpoint()

    def restore(self, state: bytes) -> None:
        """Go on from ``state`` (an earlier ``state()``): the train pipeline is rebuilt from it."""
        self._pipe, self._resume_from = None, state


class DaliEvalBatches:
    """This rank's validation files as (uint8 images, labels) batches, each file once, in order."""

    def __init__(self, files: list[str], labels: list[int], cfg: AugConfig, *, batch_size: int,
                 device_id: int | None, num_threads: int):
        self.files, self.labels, self.cfg, self.batch_size = files, labels, cfg, batch_size
        self.device_id, self.num_threads = device_id, num_threads

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not self.files:
            return
        pipe = dali_eval_pipeline(self.files, self.labels, self.cfg, batch_size=self.batch_size,
                                  device_id=self.device_id, num_threads=self.num_threads)
        for start in range(0, len(self.files), self.batch_size):
            images, labels = _dali_batch(pipe)
            keep = min(self.batch_size, len(self.files) - start)  # the padding of the last batch is dropped
            yield images[:keep], labels[:keep]

    def __len__(self) -> int:
        return math.ceil(len(self.files) / self.batch_size)


def build_dali_loaders(train_set: ImageFolderDataset, val_set: ImageFolderDataset, aug: AugConfig, *, batch_size: int,
                       num_workers: int, repeats: int = 1, num_replicas: int = 1, rank: int = 0, seed: int = 0,
                       device: torch.device) -> DaliLoaders:
    """``DaliLoaders`` built as a run builds every kind of loader: ``num_workers`` DALI threads (at least one), the
    JPEGs decoded on ``device`` when it is a GPU, else on the CPU. DALI has no repeated augmentation: ``repeats`` 1."""
    if repeats != 1:
        raise ValueError(f"loader 'dali' has no repeated augmentation: repeats {repeats} needs loader 'torchvision'")
    device = torch.device(device)
    return DaliLoaders(train_set, val_set, aug, batch_size=batch_size, num_threads=max(1, num_workers),
                       num_replicas=num_replicas, rank=rank, seed=seed,
                       device_id=(device.index or 0) if device.type == "cuda" else None)

# %% [markdown]
# A DALI loader on chapter 14's photographs, where DALI is installed: uint8 batches of the recipe's size, each label one
# of the four classes, and a resume from `state()` that hands out the very next batch again. (DALI is an optional
# extra: without it the cell says how to install it.)

# %%
# NBVAL_IGNORE_OUTPUT
# (depends on whether DALI is installed here)
aug64 = augmentation("deit", 64)
train_tf, eval_tf = build_transforms(aug64, on_device=True)
tv_set, tv_val, _ = build_datasets("imagefolder", TINY, train_transform=train_tf, val_transform=eval_tf, max_classes=4)
if dali_available():
    dali = DaliLoaders(tv_set, tv_val, aug64, batch_size=32, num_threads=2)
    batches = dali.epoch(0)
    images, labels = next(batches)
    saved = dali.state()
    following = next(batches)
    dali.restore(saved)
    again = next(dali.epoch(0, start=32))
    assert images.dtype == torch.uint8 and images.shape == (32, 3, 64, 64) and set(labels.tolist()) <= {0, 1, 2, 3}
    assert torch.equal(following[0], again[0]) and torch.equal(following[1], again[1])
    print(f"DALI: {tuple(images.shape)} uint8 batches; resumed from state(), the next batch again, exactly")
else:
    print(f"DALI is not installed here: {DALI_INSTALL}")
