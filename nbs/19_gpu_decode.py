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
# choices, and `epoch(e, start)` resumes with no state but the sampler's. **The device** decodes the batch in one call
# (`decode_batch`), crops and resizes all its images in one batched product (§1), flips, and runs RandAugment grouped
# by op: kernel launches whose number does not grow with the batch. A file that is not a readable JPEG is an error.
# The next chapter, `19_side_stream`, runs all of this on a stream of its own, one batch ahead of the training step,
# and builds the loader (`build_gpu_decode_loaders`).
#
# RandAugment: v2's applies one op to a whole batch tensor, so per slot the device sorts the batch by the op each image
# drew, runs each op once on its group (torchvision's private `_apply_image_or_video_transform`, pinned by the checks),
# restores the order: ≤ 29 calls per slot, the per-image recipe exactly.
#
# Both this loader and chapter 18's DALI ship the same uint8 batches as chapter 17's `DataLoaders`, with the same
# `epoch`, `state` and `restore`: the training loop cannot tell them apart.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpu_decode
# The "gpu-decode" loader: workers read JPEGs and draw each image's choices; the device decodes and augments them, on a
# stream of its own, one batch ahead of the training step.

# %%
#| export
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import v2

from convit_edu.augment import AugConfig, build_transforms

RANDAUGMENT_SPACE = v2.RandAugment._AUGMENTATION_SPACE  # torchvision's 14 ops (name: magnitudes, signed), draw order
OP_CODES = 1 + 2 * len(RANDAUGMENT_SPACE)  # a slot's code: 0 skipped, else 1 + 2·op + 1 if the magnitude is negated
UNREADABLE = "replace or remove the file, or use loader 'torchvision' (which skips unreadable images)"


# %% [markdown]
# ## 1. The crop: one matrix product per axis
#
# torchvision's `resized_crop` on a GPU converts each image to floats, resizes it with `F.interpolate(...,
# antialias=True)`, rounds and casts it: two operations an image, 516 kernel launches for a batch of 256, at 30–45 µs
# of host time each on the H200's host (`gpu-results-reading.md` §1c), the known trap of decoding on a GPU. But an
# antialiased resize is *separable* and *linear*: an output row is a weighted sum of input rows, an output column a
# weighted sum of input columns, with weights that depend on the lengths alone. So a crop $X$ of h × w resized to
# S × S is $W_y X W_x^\top$, with $W_y$ of S × h and $W_x$ of S × w. Row j of $W_x$ holds the filter (Keys' cubic
# with a = −0.5, as PIL and torch's antialiased kernel use it, or the triangle) centred on the source point
# $s(j + ½)$, $s = w / S$, stretched by s when the crop shrinks (that is the antialias), cut at the crop's edges and
# renormalised to sum 1; nearest picks the pixel $\lfloor s j \rfloor$. Give every crop of a batch the largest crop's
# size, with zero weights beyond its own, and the whole batch is two batched matrix products: `resize_weights` builds
# the matrices (both axes in one call), `resized_crops` gathers every crop row of the batch in one indexing (a
# sliding window over the images laid end to end) and multiplies: the same 73 operations for any batch size, some 20
# of them index arithmetic on the host (counted below).
#
# The numbers are torch's: against `F.interpolate` image by image, fewer than one pixel in a thousand rounds one level
# apart (the sums run in another order), and nearest is exact (checked below). Under TF32, which chapter 24's
# `init_world` allows on CUDA, the products keep 10 bits of each factor: emulated below, some percent of the pixels move
# by one level, none by more. `roi_align`, the other one-call crop, samples bilinearly instead of bicubically. The price
# is the padding: a stack of N crops costs N × 3 × h_max × w_max floats and N·3·S·w_max·(h_max + S) multiply-adds,
# mostly with zero weights (at batch 256 with crops up to 500 × 375 px: 0.58 GB and 52 G multiply-adds, about 1.5 ms of
# an H200's 67 fp32 TFLOP/s, an estimate). So that one huge photograph does not make every crop of its batch pay for its
# size, `resized_crops` cuts a batch, smallest crops first, into stacks of at most `CROP_FLOATS` floats (1 GiB): one
# stack for photographs of ordinary sizes, a few when a huge one is among them (checked by the tests).

# %%
#| export
def resize_weights(lengths: torch.Tensor, size: int, span: int, mode: str) -> torch.Tensor:
    """(N, size, span) float32: row j of matrix n weighs input pixels 0..lengths[n]-1 of a line of ``span`` for output
    pixel j as ``F.interpolate(..., antialias=True)`` does ("bicubic": Keys' cubic, a = -0.5; "bilinear": the
    triangle; the support stretched by the scale when shrinking, cut at the edges, renormalised), or picks the pixel
    ``F.interpolate(mode="nearest")`` picks; 0 beyond ``lengths[n]``."""
    length = lengths.to(torch.float32)[:, None, None]
    scale = length / size
    j = torch.arange(size, dtype=torch.float32, device=lengths.device)[:, None]
    p = torch.arange(span, dtype=torch.float32, device=lengths.device)
    if mode == "nearest":
        return (p == torch.minimum((j * scale).floor(), length - 1)).float()
    stretch, center = scale.clamp(min=1), scale * (j + 0.5)
    support = {"bilinear": 1.0, "bicubic": 2.0}[mode] * stretch
    inside = (p >= (center - support + 0.5).floor()) & (p < torch.minimum((center + support + 0.5).floor(), length))
    x, a = ((p - center + 0.5) / stretch).abs(), -0.5
    if mode == "bilinear":
        w = (1 - x).clamp(min=0)
    else:
        w = torch.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                        torch.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))
    w = w * inside
    return w / w.sum(-1, keepdim=True)


def _padded_crops(images: list[torch.Tensor], boxes: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """``resized_crops`` of one group: every crop row gathered into a stack padded to the largest crop, then
    ``resize_weights`` applied to the rows and to the columns (two batched products), one rounding."""
    device, (top, left, h, w), n = images[0].device, boxes.T, len(images)
    span_h, span_w = int(h.max()), int(w.max())
    heights, widths = torch.tensor([image.shape[-2:] for image in images]).T
    first = torch.cat([torch.zeros(1, dtype=torch.long), (3 * heights * widths).cumsum(0)[:-1]])  # each image's start
    y = torch.minimum(torch.arange(span_h), h[:, None] - 1)  # rows past a crop's height: its last (weight 0)
    starts = ((first + left)[:, None] + (top[:, None] + y) * widths[:, None])[..., None] + (
        torch.arange(3) * (heights * widths)[:, None])[:, None]  # (N, span_h, 3): where each crop row starts
    laid_out = torch.cat([image.flatten() for image in images] + [images[0].new_zeros(span_w)])
    rows = laid_out.unfold(0, span_w, 1)[starts.to(device, non_blocking=True)]  # (N, span_h, 3, span_w): one gather
    weights = resize_weights(torch.cat([h, w]).to(device, non_blocking=True), size, max(span_h, span_w), mode)
    x = weights[:n, :, :span_h] @ rows.float().view(n, span_h, 3 * span_w)  # rows: (N, size, 3 · span_w)
    x = x.view(n, 3 * size, span_w) @ weights[n:, :, :span_w].mT  # then columns: (N, size · 3, size)
    x = x.view(n, size, 3, size).permute(0, 2, 1, 3).round_().clamp_(0, 255)
    return x.to(torch.uint8, memory_format=torch.contiguous_format)


CROP_FLOATS = 2**28  # a padded stack of crops holds at most this many floats (1 GiB), but for a single huge crop


def resized_crops(images: list[torch.Tensor], boxes: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """uint8 (N, 3, size, size): each image's box (top, left, height, width; CPU) resized as torchvision resizes floats,
    in one padded product per group of crops of similar size whose stack holds at most ``CROP_FLOATS`` floats: one
    group for photographs of ordinary sizes, more when a huge one would make every crop pay for its size."""
    hw, groups, h_max, w_max = boxes[:, 2:].tolist(), [[]], 0, 0
    for i in sorted(range(len(images)), key=lambda i: hw[i][0] * hw[i][1]):  # the smallest crops first
        h_max, w_max = max(h_max, hw[i][0]), max(w_max, hw[i][1])
        if groups[-1] and (len(groups[-1]) + 1) * 3 * h_max * w_max > CROP_FLOATS:
            groups, (h_max, w_max) = groups + [[]], hw[i]
        groups[-1].append(i)
    if len(groups) == 1:
        return _padded_crops(images, boxes, size, mode)
    crops = images[0].new_empty(len(images), 3, size, size)
    for group in groups:
        crops[torch.tensor(group, device=crops.device)] = _padded_crops([images[i] for i in group], boxes[group], size,
                                                                        mode)
    return crops


# %%
#| export
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


# %%
#| export
def decode_batch(batch: dict[str, torch.Tensor], view: Callable, device: torch.device,
                 samples: list[tuple[str, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images, labels) on ``device``: a loader's batch (one ``JpegBatches`` item, in a batch of one) decoded in
    one call on the current stream and cut to ``view(images, batch)``; a file that is not a readable JPEG is named
    (its path from ``samples``)."""
    batch = {name: value[0] for name, value in batch.items()}
    files = list(batch["data"].split(batch["lengths"].tolist()))
    try:
        images = decode_jpeg(files, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        for data, index in zip(files, batch["index"].tolist()):  # which file: each alone, on the CPU
            try:
                decode_jpeg(data)
            except RuntimeError as e:
                raise ValueError(f"cannot decode {samples[index][0]} ({e}): {UNREADABLE}") from None
        raise
    return view(images, batch), batch["label"].to(device, non_blocking=True)


# %%
import warnings
from unittest import mock

import matplotlib.pyplot as plt
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torchvision.io import read_file

from convit_edu.augment import augmentation
from convit_edu.datasets import build_datasets
from convit_edu.photographs import tiny_imagenet
from convit_edu.samplers import SeededSamples

torch.manual_seed(0)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now) Chapter 14's images: the first four classes.
TINY = tiny_imagenet("../data")
train_ds, val_ds, _ = build_datasets("imagefolder", TINY, max_classes=4)

# %% [markdown]
# The matrices of §1 for two crops resized to 32 px: one of 12 px, enlarged (each row is the cubic itself: 4 input
# pixels under an output pixel), one of 96 px, shrunk (each row the cubic stretched 3 times, the antialias: 9 input
# pixels with a weight, the cubic being 0 at its knots). Both are padded to 96 columns; the columns past a crop's own
# length are zero, which is what lets crops of all sizes share one product.

# %%
weights = resize_weights(torch.tensor([12, 96]), 32, 96, "bicubic")
widths = [int((row != 0).sum(-1).max()) for row in weights]  # input pixels under one output pixel, at most
assert torch.allclose(weights.sum(-1), torch.ones(2, 32)) and (weights[0, :, 12:] == 0).all() and widths == [4, 9]
print(f"rows sum to 1; input pixels under an output pixel: {widths[0]} (enlarged), {widths[1]} (shrunk)")
fig, axes = plt.subplots(1, 2, figsize=(9, 3))
for ax, w, title in zip(axes, weights, ("12 px to 32: enlarged", "96 px to 32: shrunk")):
    ax.imshow(w, cmap="RdBu_r", vmin=-w.abs().max(), vmax=w.abs().max(), aspect="auto", interpolation="nearest")
    ax.set(title=title, xlabel="input pixel", ylabel="output pixel")
plt.tight_layout()
plt.show()

# %% [markdown]
# Against what `resized_crops` replaced, one `F.interpolate` per image: 16 photographs, each crop drawn by
# `RandomResizedCrop`'s rule, enlarged to 224 px (as the course's 64-px photographs are) and shrunk to 32 px.

# %%
photos = [decode_jpeg(read_file(path), mode=ImageReadMode.RGB).contiguous()  # as nvJPEG's (libjpeg's: channels last)
          for path, _ in train_ds.samples[::125][:16]]


def one_by_one(images: list, boxes: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    crops = [F.interpolate(image[None, :, top : top + h, left : left + w].float(), size=(size, size), mode=mode,
                           antialias=mode != "nearest") for image, (top, left, h, w) in zip(images, boxes.tolist())]
    return torch.cat(crops).round().clamp(0, 255).to(torch.uint8)


crop = v2.RandomResizedCrop(224)  # (the boxes do not depend on the size they are resized to)
boxes = torch.tensor([[b[k] for k in ("top", "left", "height", "width")] for b in
                      (crop.make_params([photo]) for photo in photos)])
compared, their_boxes = (photos[:8], boxes[:8]) if FAST else (photos, boxes)
for size in (32, 224):
    for mode in ("bicubic", "bilinear", "nearest"):
        ours, theirs = (crop_all(compared, their_boxes, size, mode) for crop_all in (resized_crops, one_by_one))
        apart = (ours.int() - theirs.int()).abs()
        assert apart.max() <= (mode != "nearest") and (apart > 0).float().mean() < 1e-3, (size, mode)
print("batched: every pixel within one level of F.interpolate per image, fewer than 0.1 % apart; nearest: equal")


# %% [markdown]
# The operations, counted as torch dispatches them (views, which launch nothing, left out): the batched crop's do not
# grow with the batch, one resize per image costs two an image. (The photographs are contiguous, as nvJPEG returns
# them; libjpeg-turbo's come channels last, and laying those end to end copies each.)

# %%
class Operations(TorchDispatchMode):
    """Counts the operations run inside it that are not views: on a GPU each is a kernel launch, or host arithmetic."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


counts = {}
for n in (4, 16):
    for name, crop_all in (("batched", resized_crops), ("one by one", one_by_one)):
        with Operations() as ops:
            crop_all(photos[:n], boxes[:n], 32, "bicubic")
        counts[name, n] = ops.count
assert counts["batched", 4] == counts["batched", 16] and counts["one by one", 16] - counts["one by one", 4] == 2 * 12
print("; ".join(f"{name}: {counts[name, 4]} operations for 4 photographs, {counts[name, 16]} for 16"
                for name in ("batched", "one by one")))

# %% [markdown]
# Under TF32 a tensor core reads each factor of a product with 10 mantissa bits instead of 23. Emulated here by
# rounding both factors of each of `resized_crops`' products so (its pixels are integers, exact in 10 bits; its weights
# and the first product's sums are not):

# %%
def tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32's 10 mantissa bits (the nearest, halves away from zero)."""
    return ((x.contiguous().view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)


exact = torch.Tensor.__matmul__
with mock.patch.object(torch.Tensor, "__matmul__", lambda a, b: exact(tf32(a), tf32(b))):
    under_tf32 = resized_crops(compared, their_boxes, 224, "bicubic")
apart = (under_tf32.int() - one_by_one(compared, their_boxes, 224, "bicubic").int()).abs()
assert apart.max() <= 1 and 0 < (apart > 0).float().mean() < 0.15
print("under TF32 (emulated): every pixel within one level of F.interpolate per image, fewer than 15 % apart")

# %% [markdown]
# A whole batch. With `interpolation="nearest"` nothing rounds differently, so `decode_batch` with the recipe's
# `train_view` must give torchvision's own train transform of each file under its sample's seed, bit for bit.

# %%
near = augmentation("deit", 48, interpolation="nearest")
recipe = DeviceRecipe(near)
keys = [(1, position, index) for position, index in enumerate(torch.randperm(len(train_ds))[:16].tolist())]
batch = JpegBatches(SeededSamples(JpegFiles(train_ds.samples, recipe), seed=0))[keys]
images, labels = decode_batch({name: value[None] for name, value in batch.items()}, recipe.train_view,
                              torch.device("cpu"), train_ds.samples)  # as a loader of batches of one item hands it
on_decoded = build_datasets("imagefolder", TINY, train_transform=build_transforms(near, on_device=True)[0],
                            max_classes=4)[0]
on_decoded.loader = lambda path: decode_jpeg(read_file(path), mode=ImageReadMode.RGB)  # torchvision decodes, not PIL
expected = [SeededSamples(on_decoded, seed=0)[key] for key in keys]  # each under its sample's seed
assert torch.equal(images, torch.stack([x for x, _ in expected])) and labels.tolist() == [y for _, y in expected]
assert len(set(batch["ops"].flatten().tolist())) > 5  # many RandAugment ops drawn, each run once on its group
print("nearest: torchvision's crop, flip and RandAugment of each file under its seed, exactly")
