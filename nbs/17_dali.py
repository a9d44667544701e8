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
# # GPU decoding: NVIDIA DALI and torchvision's nvJPEG
#
# Two loaders for ImageNet-scale GPU runs, where PIL in loader workers limits the GPU (80–220 ImageNet images a second
# per core; an H100 trains on 6,000–20,000), both with chapter 14's per-image recipe, both resumable: NVIDIA DALI (an
# optional extra) decodes and augments in its own graph; `loader="gpu-decode"` uses torchvision's nvJPEG decoder.

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
import time
import warnings

import torch
from torchvision.io import ImageReadMode, decode_jpeg, read_file

from convit_edu.augment import augmentation, build_transforms
from convit_edu.datasets import build_datasets, tiny_imagenet
from convit_edu.image_files import load_rgb
from convit_edu.loaders import build_loaders
from convit_edu.samplers import SeededSamples

torch.manual_seed(0)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now) Chapter 13's images: the first four classes.
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
# The DALI path does the per-image part of the recipe — chapter 16's workers' part — and ships the same uint8
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
# in its checkpoints (chapter 25); the torchvision path's per-sample seeding is not needed. Each process reads its
# shard (`shard_id=rank`, `num_shards=world size`) of each pass, and its augmentation is seeded from (seed, rank).

# %%
#| export
LOADERS = ("torchvision", "dali", "gpu-decode")
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
# `DaliLoaders` is what chapter 25's loop holds instead of `DataLoaders`: `epoch()` gives the train batches, `val`
# this rank's share of the validation files (every `world size`-th, as `evaluate` reads a dataset), `state()` and
# `restore()` the pipeline's checkpoint. The train pipeline is built at the first batch, so that a resumed run builds
# it once, from its checkpoint.

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

# %% [markdown]
# ## Decoding on the training device with torchvision (`loader="gpu-decode"`)
#
# `torchvision.io.decode_jpeg(list_of_byte_tensors, device="cuda")` decodes a batch with nvJPEG on the GPU (on a CPU
# with libjpeg-turbo, PIL's very pixels: how this chapter and the tests run it). **Workers** read each file's bytes and
# header (its size) and draw its crop box by `RandomResizedCrop`'s own rule, flip and RandAugment ops from torch's
# generator seeded by (seed, epoch, position) (`SeededSamples`), in the torchvision path's order: so they are its very
# choices, and `epoch(e, start)` resumes with no state but the sampler's. **The device** decodes the batch in one
# call, crops, flips, runs RandAugment. *The crop*: `roi_align` cuts all boxes in one call but samples bilinearly (up to
# 60 levels from bicubic on small upscaled crops) from one padded input; torchvision's `resized_crop` on a GPU converts,
# resizes, clamps, rounds and casts each image, and `resized_crops` computes the same numbers with one conversion and
# one `F.interpolate(..., antialias=True)` per image, one rounding per batch: fewer launches, the GPU host's cost per
# image. AMD EPYC (2 cores, AVX2, shared with other work; one thread), 500 × 375 JPEGs (87 kB) to 224 px, decode +
# crop, img/s in 3 runs: `resized_crops` 220–280, `resized_crop` 500–540 (a CPU resizes uint8 natively, a GPU not),
# `roi_align` 140–150, PIL's path 240–265; host cost per 4-px image 28–41 µs, `resized_crop`'s 66–95. RandAugment:
# v2's applies one op to a whole batch tensor, so per slot the device sorts the batch by the op each image drew, runs
# each op once on its group (torchvision's private `_apply_image_or_video_transform`, pinned by the checks), restores
# the order: ≤ 29 calls per slot, the per-image recipe exactly. A file that is not a readable JPEG is an error.
#
# **One host sync per batch, on purpose.** torchvision allocates the decoded images on the training stream, but
# nvJPEG's hardware engine (an H100's, an H200's) writes them without waiting for the work queued there; the caching
# allocator hands out a block the moment it is freed, so the decoder can overwrite tensors that queued kernels have not
# read yet. The GPU check of 2026-11-27 (H200, `nbs/results/gpu/`) saw it as a NaN loss at step 3 of an
# otherwise healthy run (pytorch/vision PR 9606 reports the same corruption). `DecodedBatches` therefore lets the
# stream drain before each decode: the device idles while the next batch decodes, the price of correct pixels.

# %%
#| export gpu_decode
# The "gpu-decode" loader: workers read JPEGs and draw each image's choices; the device decodes and augments them.

# %%
#| export gpu_decode
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import BatchSampler, DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import v2

from convit_edu.augment import AugConfig, build_transforms
from convit_edu.datasets import ImageFolderDataset
from convit_edu.loaders import DataLoaders, build_loader
from convit_edu.samplers import KeyedSampler, RepeatAugSampler, SeededSamples, val_shard

RANDAUGMENT_SPACE = v2.RandAugment._AUGMENTATION_SPACE  # torchvision's 14 ops (name: magnitudes, signed), draw order
OP_CODES = 1 + 2 * len(RANDAUGMENT_SPACE)  # a slot's code: 0 skipped, else 1 + 2·op + 1 if the magnitude is negated
UNREADABLE = "replace or remove the file, or use loader 'torchvision' (which skips unreadable images)"


def resized_crops(images: list[torch.Tensor], boxes: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """Each box (top, left, height, width; CPU) resized to size × size as torchvision resizes floats; one rounding."""
    crops = [F.interpolate(image[None, :, top : top + h, left : left + w].float(), size=(size, size), mode=mode,
                           antialias=mode != "nearest") for image, (top, left, h, w) in zip(images, boxes.tolist())]
    return torch.cat(crops).round_().clamp_(0, 255).to(torch.uint8)


class DeviceRecipe:
    """``build_transforms``' pair cut in two: ``draw`` on the host; ``train_view``, ``eval_view`` on the device."""

    def __init__(self, cfg: AugConfig):
        if cfg.crop != "random_resized":
            raise ValueError(f"loader 'gpu-decode' has no crop {cfg.crop!r} (aug 'deit'): use loader 'torchvision'")
        train, self.eval_transform = build_transforms(cfg, on_device=True)
        self.crop, self.size, self.mode, self.hflip = train.transforms[0], cfg.img_size, cfg.interpolation, cfg.hflip
        slots = [t for t in train.transforms if isinstance(t, v2.RandomApply)]  # each RandomApply([RandAugment])
        self.probs, ra = [t.p for t in slots], slots[0].transforms[0] if slots else None
        self.randaugment, self.ops = ra, [] if ra is None else [  # per op: name, magnitude at this strength, signed
            (name, 0.0, False) if (v := make(ra.num_magnitude_bins, self.size, self.size)) is None
            else (name, float(v[ra.magnitude]), signed) for name, (make, signed) in RANDAUGMENT_SPACE.items()]

    def draw(self, header: Image.Image) -> dict[str, torch.Tensor]:
        """An image's crop box (top, left, height, width), flip and RandAugment codes, from torch's generator."""
        box = self.crop.make_params([header])  # the rule reads the size only: the header stands in for the image
        flip, codes = self.hflip > 0 and bool(torch.rand(1) < self.hflip), []  # RandomHorizontalFlip's draw
        for p in self.probs:  # RandomApply's draw, then RandAugment's: the op, and a sign where the op has one
            op = int(torch.randint(len(self.ops), ())) if torch.rand(1) < p else None
            codes.append(0 if op is None else 1 + 2 * op + int(self.ops[op][2] and bool(torch.rand(()) <= 0.5)))
        return {"box": torch.tensor([box["top"], box["left"], box["height"], box["width"]]),
                "flip": torch.tensor(flip), "ops": torch.tensor(codes, dtype=torch.long)}

    def train_view(self, images: list[torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """uint8 (N, 3, S, S): crops, flips, and per RandAugment slot each op once, on the images that drew it."""
        x, device = resized_crops(images, batch["box"], self.size, self.mode), images[0].device
        x = torch.where(batch["flip"].to(device, non_blocking=True)[:, None, None, None], x.flip(-1), x)
        for codes, on_device in zip(batch["ops"].T, batch["ops"].to(device, non_blocking=True).T):
            order = on_device.argsort(stable=True)
            groups = x[order].split(codes.bincount(minlength=OP_CODES).tolist())  # codes: a CPU tensor
            x = torch.cat([self._apply(g, code) if code and len(g) else g for code, g in enumerate(groups)])
            x = x[order.argsort()]
        return x

    def _apply(self, images: torch.Tensor, code: int) -> torch.Tensor:
        (name, magnitude, _), ra = self.ops[(code - 1) // 2], self.randaugment
        return ra._apply_image_or_video_transform(images, name, -magnitude if (code - 1) % 2 else magnitude,
                                                  interpolation=ra.interpolation, fill=ra._fill)

    def eval_view(self, images: list[torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack([self.eval_transform(image) for image in images])


@dataclass
class JpegFiles(Dataset):
    """File i of ``samples``: bytes, label, index, ``recipe``'s draws; PIL reads its header only (size, format)."""

    samples: list[tuple[str, int]]
    recipe: DeviceRecipe | None = None

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        path, label = self.samples[index]
        raw = Path(path).read_bytes()
        try:
            header = Image.open(io.BytesIO(raw))
        except (OSError, SyntaxError) as e:
            raise ValueError(f"{path} is not a readable image ({e}): {UNREADABLE}") from None
        if header.format not in ("JPEG", "MPO"):  # MPO: a camera's JPEG with more pictures after the first
            raise ValueError(f"{path} is a {header.format} file: convert it to JPEG, or use loader 'torchvision'")
        item = {"data": torch.frombuffer(bytearray(raw), dtype=torch.uint8), "label": torch.tensor(label),
                "index": torch.tensor(index)}
        return item if self.recipe is None else item | self.recipe.draw(header)


@dataclass
class JpegBatches(Dataset):
    """A whole batch per item (a ``BatchSampler``'s keys): bytes in one tensor cut by ``lengths``, the rest stacked."""

    files: Dataset

    def __getitem__(self, keys: list) -> dict[str, torch.Tensor]:
        items = [self.files[key] for key in keys]
        batch = {name: torch.stack([item[name] for item in items]) for name in items[0] if name != "data"}
        return batch | {"data": torch.cat([i["data"] for i in items]),
                        "lengths": torch.tensor([len(i["data"]) for i in items])}


@dataclass
class DecodedBatches:
    """(uint8 images, labels) on ``device``: ``loader``'s batches decoded there in one call each, cut to ``view``."""

    loader: DataLoader
    view: Callable[[list[torch.Tensor], dict[str, torch.Tensor]], torch.Tensor]
    device: torch.device
    samples: list[tuple[str, int]]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (self._decoded(batch) for batch in self.loader)  # the loader starts now, as in DataLoaders.epoch

    def _decoded(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = {name: value[0] for name, value in batch.items()}  # the loader's "batch" of one JpegBatches item
        files = list(batch["data"].split(batch["lengths"].tolist()))
        if self.device.type == "cuda":  # nvJPEG's hardware decoder writes its outputs before the work queued on this
            torch.cuda.current_stream(self.device).synchronize()  # stream has read the blocks they reuse: drain it
        try:
            images = decode_jpeg(files, mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError:
            for data, index in zip(files, batch["index"].tolist()):  # which file: each alone, on the CPU
                try:
                    decode_jpeg(data)
                except RuntimeError as e:
                    raise ValueError(f"cannot decode {self.samples[index][0]} ({e}): {UNREADABLE}") from None
            raise
        return self.view(images, batch), batch["label"].to(self.device, non_blocking=True)


@dataclass
class GpuDecodeLoaders(DataLoaders):
    """``DataLoaders`` of batches decoded on the device: ``epoch`` as theirs, the sampler's position the state."""

    train: DecodedBatches
    val: DecodedBatches


def build_gpu_decode_loaders(train_set: ImageFolderDataset, val_set: ImageFolderDataset, aug: AugConfig, *,
                             batch_size: int, num_workers: int, repeats: int = 1, num_replicas: int = 1, rank: int = 0,
                             seed: int = 0, device: torch.device) -> GpuDecodeLoaders:
    """``build_loaders``' train batches and val files (every ``num_replicas``-th, once), decoded on ``device``."""
    recipe, device = DeviceRecipe(aug), torch.device(device)
    sampler = KeyedSampler(RepeatAugSampler(len(train_set), num_replicas, rank, repeats=repeats, seed=seed))
    if len(train_set) < num_replicas or len(sampler) < batch_size:
        raise ValueError(f"batch_size {batch_size} with {num_replicas} process(es) leaves no batch: a process's epoch "
                         f"holds {len(sampler)} of the {len(train_set)} training files (lower the batch)")

    def feed(files: Dataset, batches: BatchSampler) -> DataLoader:  # workers: one JpegBatches item per loader "batch"
        return build_loader(JpegBatches(files), 1, batches, num_workers=num_workers, seed=seed, drop_last=False)

    train = feed(SeededSamples(JpegFiles(train_set.samples, recipe), seed), BatchSampler(sampler, batch_size, True))
    val_batches = BatchSampler(val_shard(len(val_set), rank, num_replicas), 2 * batch_size, False)
    val = feed(JpegFiles(val_set.samples), val_batches)
    return GpuDecodeLoaders(DecodedBatches(train, recipe.train_view, device, train_set.samples),
                            DecodedBatches(val, recipe.eval_view, device, val_set.samples), sampler)

# %%
# `interpolation="nearest"` (nothing rounds differently): a batch is torchvision's of each file under its seed.
near = augmentation("deit", 48, interpolation="nearest")
gpu = build_gpu_decode_loaders(train_ds, val_ds, near, batch_size=16, num_workers=0, device="cpu")
images, labels = next(gpu.epoch(1))
on_decoded = build_datasets("imagefolder", TINY, train_transform=build_transforms(near, on_device=True)[0],
                            max_classes=4)[0]
on_decoded.loader = lambda path: decode_jpeg(read_file(path), mode=ImageReadMode.RGB)  # torchvision decodes, not PIL
expected = [SeededSamples(on_decoded, seed=0)[key] for key in list(gpu.sampler)[:16]]  # each under its sample's seed
assert torch.equal(images, torch.stack([x for x, _ in expected])) and labels.tolist() == [y for _, y in expected]
first = [batch for _, batch in zip(range(3), gpu.epoch(2))]
resumed = gpu.epoch(2, start=16)  # this rank's sample 16 on: from the second batch
assert all(torch.equal(a, b) for batch in first[1:] for a, b in zip(batch, next(resumed)))
print("nearest: torchvision's crop, flip and RandAugment of each file under its seed, exactly; resumed: the same")

# %% [markdown]
# Images/s of each loader (they change from run to run and with the CPU; DALI's committed ones, AMD EPYC (Zen 3, AVX2,
# 2 cores), nothing else running: 1,330 img/s for torchvision against 1,239; three runs: 1,330–1,614, 1,154–1,240;
# Intel Xeon model 207, AVX-512: 2,321 against 2,237: about level on a CPU; gpu-decode's device is this process here),
# then gpu-decode against the torchvision loader's batch (the same choices) and `build_transforms`' eval view (PIL).

# %%
# NBVAL_IGNORE_OUTPUT
# (timings; and whether DALI is installed)
def images_per_s(batches: Iterator, count: int, batch_size: int) -> float:
    next(batches)  # start-up (pipeline build, worker start) is a one-off cost: not counted
    t0 = time.perf_counter()
    for _ in range(count):
        next(batches)
    return count * batch_size / (time.perf_counter() - t0)


aug64, batch, threads = augmentation("deit", 64), 64, 2
torch.set_num_threads(1)  # this process plays gpu-decode's device: 2 threads would fight its workers for the 2 cores
train_tf, eval_tf = build_transforms(aug64, on_device=True)
tv_set, tv_val, _ = build_datasets("imagefolder", TINY, train_transform=train_tf, val_transform=eval_tf, max_classes=4)
loaders = {"torchvision": build_loaders(tv_set, tv_val, batch_size=batch, num_workers=threads),
           "gpu-decode": build_gpu_decode_loaders(tv_set, tv_val, aug64, batch_size=batch, num_workers=threads,
                                                  device="cpu")}
if dali_available():
    loaders["dali"] = DaliLoaders(tv_set, tv_val, aug64, batch_size=batch, num_threads=threads)
n_timed = min(3 if FAST else 12, len(tv_set) // batch - 1)
speeds = {name: images_per_s(l.epoch(0), n_timed, batch) for name, l in loaders.items()}
print(", ".join(f"{k}: {v:.0f} img/s" for k, v in speeds.items()), f"({threads} workers / threads, 64 px)",
      "" if dali_available() else f"(DALI not installed: {DALI_INSTALL})")
(ours, ours_labels), (theirs, their_labels) = (next(loaders[name].epoch(1)) for name in ("gpu-decode", "torchvision"))
assert torch.equal(ours_labels, their_labels) and (ours.float() - theirs).abs().mean() < 1  # levels of 255
pil = torch.stack([eval_tf(load_rgb(path)) for path, _ in tv_val.samples[: 2 * batch]])
assert ((next(iter(loaders["gpu-decode"].val))[0].float() - pil).abs() <= 3).all()  # the eval view, every pixel
