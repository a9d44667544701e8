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
# # Decoding on the training device with torchvision's nvJPEG (`loader="gpu-decode"`)
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
#
# Both this loader and chapter 18's DALI ship the same uint8 batches as chapter 17's `DataLoaders`, with the same
# `epoch`, `state` and `restore`: the training loop cannot tell them apart.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpu_decode
# The "gpu-decode" loader: workers read JPEGs and draw each image's choices; the device decodes and augments them.

# %%
#| export
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
import time
import warnings

from torchvision.io import read_file

from convit_edu.augment import augmentation
from convit_edu.dali import DALI_INSTALL, DaliLoaders, dali_available
from convit_edu.datasets import build_datasets, tiny_imagenet
from convit_edu.image_files import load_rgb
from convit_edu.loaders import build_loaders

torch.manual_seed(0)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now) Chapter 14's images: the first four classes.
TINY = tiny_imagenet("../data")
train_ds, val_ds, _ = build_datasets("imagefolder", TINY, max_classes=4)

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
