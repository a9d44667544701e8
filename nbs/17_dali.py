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
# # Decoding with NVIDIA DALI (optional)
#
# An optional loader for ImageNet-scale GPU runs, where JPEG decoding in loader workers limits the GPU: the same
# per-image recipe as chapter 14, decoded and augmented by NVIDIA DALI, resumable like chapter 16's loaders.

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
from convit_edu.samplers import seed_from

# %%
import time
import warnings

import matplotlib.pyplot as plt
import torch

from convit_edu.augment import AugConfig, augmentation, build_transforms
from convit_edu.datasets import build_datasets, tiny_imagenet
from convit_edu.image_files import load_rgb
from convit_edu.loaders import DeviceTransforms, build_loaders

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %% [markdown]
# The images of chapter 13: the first four classes of the course's Tiny ImageNet subset, from `data/`, and one
# photograph from them.

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now)
TINY = tiny_imagenet("../data")

# %%
_, val_ds, names = build_datasets("imagefolder", TINY, max_classes=4)
photo = load_rgb(TINY / "train" / "n01443537" / "n01443537_0.JPEG")
print(names)


def show(x: torch.Tensor, cfg: AugConfig):
    """A normalised (3, H, W) tensor back to an image array for imshow (as in chapter 14)."""
    mean, std = torch.tensor(cfg.mean)[:, None, None], torch.tensor(cfg.std)[:, None, None]
    return (x * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()

# %% [markdown]
# ## Decoding with NVIDIA DALI (optional)
#
# At ImageNet scale the workers above are what limits a GPU: decoding and cropping a 224-px JPEG costs a worker
# several milliseconds, and eight fast GPUs want thousands of images a second. NVIDIA DALI runs the same
# per-image steps as a graph of C++ operators on a pool of threads, and on a GPU decodes the JPEGs there
# (`device="mixed"`: the file is parsed on the CPU, the pixels decoded by the GPU). It is an optional extra
# (`pip install -e ".[dali]"`) and is selected by `TrainConfig(loader="dali")` (`--loader dali`) for
# ImageNet-style folders. Its pipelines run on the CPU too, which is how this chapter and the tests use them.
#
# The DALI path does the per-image part of the recipe — the part the workers do above — and ships the same
# uint8 (B, 3, S, S) batches; normalisation, RandomErasing and MixUp/CutMix then run on the training device
# through `DeviceTransforms` exactly as for the torchvision loader. The training pipeline reads the files of
# the same subset (`fraction`, `classes`: the dataset's own file list), `RandomResizedCrop` with the recipe's
# scale and ratio, a flip with probability `hflip`, and RandAugment at DeiT's strength: `randaugment_ops`
# times, a coin flip with probability `randaugment_prob` (a DALI *conditional*, `if` on a per-sample value),
# then one op of DALI's RandAugment at magnitude m of 11 bins, i.e. m/10 of each op's maximum. The evaluation
# pipeline resizes the shorter side to `img_size / crop_ratio` and takes the centre crop. What is not the same:
#
# | | torchvision path | DALI path |
# |---|---|---|
# | crop sampling | torchvision's 10 tries, then a centre crop | DALI's 10 tries; its fallback and its random numbers differ |
# | resize | PIL bicubic with antialiasing | DALI's cubic filter with antialiasing: close, not pixel-identical |
# | RandAugment ops | torchvision's 14 (Identity, no Invert/SolarizeAdd) | DALI's 14: the same list |
# | RandAugment strength | m/10 of torchvision's maxima (rotate 30°, shear 0.3, enhance 0.9) | m/10 of DALI's: the same maxima; translations up to 45 % of the side, as DeiT |
# | RandAugment interpolation and fill | bilinear, per-channel mean colour | bilinear, one grey (the mean of the three means) |
# | magnitude noise (DeiT's "mstd0.5") | not reproduced | not reproduced |
# | epoch | a permutation of the files, cut to whole batches | the reader's own shuffle of the files (after a permutation seeded by the run's seed); its passes run on, so the images that do not fill a last batch open the next epoch |
# | repeated augmentation, the `pad-crop-flip` recipe | yes | no: `loader="dali"` refuses them (`--preset imagenet --loader dali` sets repeats to 1 and prints a note) |
#
# Exact resume: a DALI pipeline built with `enable_checkpointing=True` returns its whole state — where the
# reader stands in its shuffled passes and every random generator of its operators — as bytes from
# `pipe.checkpoint()`, and a pipeline built with `checkpoint=` those bytes goes on from there. The training
# loop saves one such state per process in its checkpoints (chapter 25); the per-sample seeding of the
# torchvision path is not needed. Each process reads its shard (`shard_id=rank`, `num_shards=world size`) of
# each pass, and its augmentation is seeded from (seed, rank).

# %%
#| export
LOADERS = ("torchvision", "dali")
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
# `DaliLoaders` is what chapter 25's loop holds instead of `DataLoaders`: `epoch()` gives the train batches,
# `val` this rank's share of the validation files (every `world size`-th, as `evaluate` reads a dataset),
# `state()` and `restore()` the pipeline's checkpoint. The train pipeline is built at the first batch, so
# that a resumed run builds it once, from its checkpoint.

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
        self.val = DaliEvalBatches([p for p, _ in val_set.samples[rank::num_replicas]],
                                   [t for _, t in val_set.samples[rank::num_replicas]], cfg, batch_size=2 * batch_size,
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

# %% [markdown]
# One batch from each loader on the same folder, side by side, and images/s of each — the torchvision loader
# with as many workers as DALI has threads (the numbers change from run to run and with the CPU; the committed
# ones come from an AMD EPYC (Zen 3, AVX2, 2 cores) with nothing else running: 1,330 img/s for torchvision against
# 1,239 for DALI; three runs gave 1,330–1,614 and 1,154–1,240, and an Intel Xeon (model 207, AVX-512) 2,321 against
# 2,237: about level on a CPU; this cell runs only where DALI is installed).

# %%
# NBVAL_IGNORE_OUTPUT
# (timings; and whether DALI is installed)
def images_per_s(batches: Iterator, count: int, batch_size: int) -> float:
    next(batches)  # start-up (pipeline build, worker start) is a one-off cost: not counted
    t0 = time.perf_counter()
    for _ in range(count):
        next(batches)
    return count * batch_size / (time.perf_counter() - t0)


if not dali_available():
    print(f"DALI not installed: skipped ({DALI_INSTALL} installs it)")
else:
    aug64, batch, threads = augmentation("deit", 64), 64, 2
    tv_train, tv_val = build_transforms(aug64, on_device=True)
    tv_set, tv_val_set, _ = build_datasets("imagefolder", TINY, train_transform=tv_train, val_transform=tv_val,
                                           max_classes=4)
    tv = build_loaders(tv_set, tv_val_set, batch_size=batch, num_workers=threads)
    dali = DaliLoaders(tv_set, tv_val_set, aug64, batch_size=batch, num_threads=threads)
    n_timed = 3 if FAST else 12
    speeds = {"torchvision": images_per_s(tv.epoch(0), min(n_timed, len(tv.train) - 1), batch),
              "dali": images_per_s(dali.epoch(0), n_timed, batch)}
    print(", ".join(f"{k}: {v:.0f} img/s" for k, v in speeds.items()), f"({threads} workers / threads, 64 px)")
    finish = DeviceTransforms(aug64)
    fig, axes = plt.subplots(2, 8, figsize=(11, 3), dpi=80)
    for row, (name, batches) in zip(axes, (("torchvision", tv.epoch(1)), ("dali", dali.epoch(1)))):
        images, labels = next(batches)
        assert images.dtype == torch.uint8 and images.shape == (batch, 3, 64, 64)
        for ax, x, y in zip(row, finish.eval(images), labels):
            ax.imshow(show(x, aug64))
            ax.set_title(f"{name} {names[int(y)][:10]}", fontsize=7)
            ax.set_axis_off()
    plt.show()

# %% [markdown]
# ## Summary
#
# * `build_datasets(name, root, fraction=f, max_classes=K, ...)` returns `(train, val, class_names)` for
#   CIFAR-100, any ImageNet-style folder or synthetic data; f keeps the first ⌊f·n_c⌋ images of each class
#   (Table 2, `scaled_epochs` for the 1/f epochs), K the first K classes (Section 4).
# * `AUGMENTATIONS` hold every value of the DeiT recipe (`deit`) and of the classic CIFAR one
#   (`pad-crop-flip`); `build_transforms` turns one into torchvision v2 pipelines, `build_mixup` into the batch
#   MixUp/CutMix with label smoothing.
# * `RepeatAugSampler` deals one global stream to the ranks: equal lengths, disjoint positions, repeated
#   augmentation with the copies on different ranks, the same global batches at any world size, exact resume.
# * `build_loaders` makes the seeded train loader and the val loader that chapter 25's `train` uses;
#   `benchmark_loader` measures a pipeline stage by stage.
