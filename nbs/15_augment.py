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
# # The DeiT recipe: crops, RandAugment, erasing, MixUp and CutMix
#
# DeiT trains a vision transformer on ImageNet-1k alone by regularising hard, and the ConViT paper keeps every value
# of its recipe. This chapter writes that recipe with `torchvision.transforms.v2`, every value visible in one
# dataclass, shows what it does to a photograph, and adds MixUp / CutMix with label smoothing on the batch.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp augment
# The DeiT augmentation recipe, every value visible, MixUp / CutMix with label smoothing, and the recipe's end on
# the device: normalising and erasing uint8 batches (chapter 17), each batch finished for the model (chapter 25).

# %%
#| export
import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from convit_edu.checks import one_of, positive_int

# %%
import warnings

import matplotlib.pyplot as plt
import torch
from PIL import Image

from convit_edu.checks import expect_error
from convit_edu.datasets import build_datasets
from convit_edu.image_files import load_rgb
from convit_edu.photographs import tiny_imagenet

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %% [markdown]
# The images of chapter 14: the first four classes of the course's Tiny ImageNet subset, from `data/`.

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now)
TINY = tiny_imagenet("../data")

# %%
_, val_ds, names = build_datasets("imagefolder", TINY, max_classes=4)
print(names)

# %% [markdown]
# ## The DeiT recipe, every value visible
#
# Its steps per image (on the CPU, in the loader workers):
#
# | step | value | why |
# |---|---|---|
# | `RandomResizedCrop` | 224 px, scale (0.08, 1), ratio (3/4, 4/3), bicubic | scale and aspect jitter |
# | `RandomHorizontalFlip` | p = 0.5 | mirror symmetry of natural images |
# | `RandAugment` | 2 ops, each at p = 0.5, magnitude 9 of 10 (DeiT: "rand-m9-mstd0.5-inc1") | colour/geometry jitter |
# | `Normalize` | ImageNet mean/std | centred inputs |
# | `RandomErasing` | p = 0.25, per-pixel random values | occlusion |
#
# and at evaluation: resize the shorter side to 224 / 0.875 = 256 (bicubic), take the centre 224×224 crop.
# Per batch (on the device, in the training loop): MixUp (α = 0.8) or CutMix (α = 1.0), chosen with
# probability ½ each per batch, and label smoothing ε = 0.1 in the resulting soft targets.
#
# ### RandAugment at DeiT's strength
#
# DeiT's "rand-m9-mstd0.5-inc1" is `timm`'s RandAugment: pick an op at random, twice ("n2", the default), apply
# each with probability ½, at magnitude 9 on a scale where **10 is the op's maximum** (30° of rotation, a shear
# factor of 0.3, a shift of 45 % of the image, …), so m9 is 90 % of each maximum: 27° of rotation. torchvision's
# `RandAugment(num_ops=2, magnitude=9)` reads its magnitude on another scale: it is an index into
# `num_magnitude_bins` = 31 evenly spaced values from 0 to the maximum, so 9 of 31 bins is 9/30 of the maximum —
# 9° of rotation, a third of DeiT's strength. The maxima themselves agree, so the fix is the scale:
# `num_magnitude_bins=11` puts magnitude m at m/10 of each maximum, exactly DeiT's scale, and the ½ is a
# `RandomApply` around each of the ops. Op by op, at m9 (translations as a share of the image side; a cell after
# `build_transforms` reads torchvision's column from its own augmentation space):
#
# | op | DeiT (timm, "inc1" ops) | torchvision, 11 bins | |
# |---|---|---|---|
# | Rotate | ±27° | ±27° | same |
# | ShearX/Y | factor ±0.27 | factor ±0.27 | same |
# | TranslateX/Y | ±0.45·0.9 = 0.405 | ±(150/331)·0.9 = 0.408 (whole pixels) | same within a pixel at 224 px |
# | Brightness, Color, Contrast, Sharpness | factor 1 ± 0.81 | factor 1 ± 0.81 | same |
# | Solarize | invert pixels ≥ 26 of 256 | invert pixels ≥ 25.5 of 255 | same |
# | Posterize | keep 1 bit | keep 4 bits | torchvision's scale stops at 4 bits |
# | AutoContrast, Equalize | no magnitude | no magnitude | same |
# | Invert, SolarizeAdd (+99 below 128) | in the list | absent | — |
# | Identity | absent | in the list | — |
#
# So 12 of DeiT's 15 ops — the geometric ones, the four enhancements, Solarize, AutoContrast and Equalize — act as in
# DeiT. Three differ: DeiT's harsh posterize, and Invert and SolarizeAdd, which torchvision lacks (it has an Identity
# op instead). Each of the three acts on about 1 image in 15 (2 draws × ½ × 1/15), so we keep torchvision's list
# rather than write ops of our own. DeiT's **magnitude noise** ("mstd0.5": each op draws its magnitude from N(9, 0.5),
# clipped to [0, 10]) is not reproduced: torchvision's magnitude is a fixed bin. The noise moves an op's strength by
# ±5 % around the same mean (27° ± 1.5°), so DeiT's average augmentation is what we apply. The fill colour for
# rotations and shears is the mean pixel, as in DeiT; the ops interpolate bilinearly where DeiT's are bicubic, because
# torchvision's rotations and affine maps offer bicubic for PIL images only, and this pipeline must also take tensors.
#
# Two named augmentations, `AUGMENTATIONS`: `deit` (the recipe above; the paper's SM C trains CIFAR-100
# upsampled to 224 px with *all hyperparameters unchanged*, so it uses this one too — the random resized crop
# does the upsampling) and `pad-crop-flip` (the classic CIFAR recipe at native resolution: 4-pixel padding,
# random 32×32 crop, flip, CIFAR-100 statistics, no RandAugment, erasing, MixUp or smoothing). They are named
# for what they do; the *training* recipes of chapter 21 (`imagenet`, `cifar100-32`, …) pick one of them.

# %%
#| export
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
RANDAUGMENT_MAX_MAGNITUDE = 10  # DeiT's (timm's) scale: magnitude m is m/10 of each op's maximum


@dataclass(frozen=True)
class AugConfig:
    """Every value of a train/eval augmentation recipe; the defaults are DeiT's ImageNet recipe at 224 px."""

    img_size: int = 224
    crop: str = "random_resized"  # "random_resized" (DeiT) or "pad" (classic CIFAR: pad, then random crop)
    scale: tuple[float, float] = (0.08, 1.0)  # RandomResizedCrop area range
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # RandomResizedCrop aspect range
    padding: int = 4  # "pad" crop only
    interpolation: str = "bicubic"
    hflip: float = 0.5
    randaugment_ops: int = 2
    randaugment_magnitude: int | None = 9  # DeiT's m9: 0..10, 10 = each op's maximum; None: no RandAugment
    randaugment_prob: float = 0.5  # each of the ops is applied with this probability (DeiT: 0.5)
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    erasing: float = 0.25  # RandomErasing probability
    crop_ratio: float = 0.875  # eval: resize to img_size / crop_ratio, centre-crop img_size
    mixup_alpha: float = 0.8  # 0: off
    cutmix_alpha: float = 1.0  # 0: off
    cutmix_prob: float = 0.5  # per batch, when both are on: CutMix with this probability, else MixUp
    label_smoothing: float = 0.1

    def __post_init__(self):
        positive_int("img_size", self.img_size)
        if self.crop not in ("random_resized", "pad"):
            raise ValueError(f"crop {self.crop!r} must be 'random_resized' or 'pad'")
        if self.interpolation not in ("bicubic", "bilinear", "nearest"):
            raise ValueError(f"interpolation {self.interpolation!r} must be 'bicubic', 'bilinear' or 'nearest'")
        positive_int("randaugment_ops", self.randaugment_ops, minimum=0)
        for name in ("hflip", "erasing", "cutmix_prob", "randaugment_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} {getattr(self, name)!r} is a probability: it must lie in [0, 1]")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing {self.label_smoothing!r} must lie in [0, 1)")
        for name, (low, high) in (("scale", self.scale), ("ratio", self.ratio)):
            if not 0 < low <= high:
                raise ValueError(f"{name} {(low, high)!r} must be an increasing pair of positive numbers "
                                 f"(RandomResizedCrop's {name} range; DeiT: {getattr(AugConfig, name)})")
        if not self.scale[1] <= 1:
            raise ValueError(f"scale {self.scale!r} is a share of the image's area: its upper end must be at most 1")
        if not 0 < self.crop_ratio <= 1:
            raise ValueError(f"crop_ratio {self.crop_ratio!r} must lie in (0, 1] (DeiT: 0.875)")
        if self.mixup_alpha < 0 or self.cutmix_alpha < 0:
            raise ValueError(f"mixup_alpha {self.mixup_alpha} and cutmix_alpha {self.cutmix_alpha} must be >= 0 "
                             "(0 turns one off)")
        for name, ok, what in (("mean", lambda v: 0 <= v <= 1, "three numbers in [0, 1] (per-channel means"),
                               ("std", lambda v: 0 < v < math.inf, "three positive numbers (per-channel standard "
                                                                    "deviations")):
            values = getattr(self, name)
            if not (isinstance(values, (tuple, list)) and len(values) == 3
                    and all(isinstance(v, (int, float)) and ok(v) for v in values)):
                raise ValueError(f"{name} {values!r} must be {what} of pixel values in [0, 1]; ImageNet's: "
                                 f"{getattr(AugConfig, name)})")
        if self.randaugment_magnitude is not None and positive_int(
                "randaugment_magnitude", self.randaugment_magnitude, minimum=0) > RANDAUGMENT_MAX_MAGNITUDE:
            raise ValueError(f"randaugment_magnitude {self.randaugment_magnitude!r} must lie in "
                             f"0..{RANDAUGMENT_MAX_MAGNITUDE}, the maximum of every op (DeiT: 9)")

    def __str__(self) -> str:
        return "\n".join(f"{f.name:<22}{getattr(self, f.name)!r}" for f in fields(self))


AUGMENTATIONS: dict[str, AugConfig] = {
    "deit": AugConfig(),
    "pad-crop-flip": AugConfig(img_size=32, crop="pad", randaugment_magnitude=None, mean=CIFAR100_MEAN,
                             std=CIFAR100_STD, erasing=0.0, crop_ratio=1.0, mixup_alpha=0.0, cutmix_alpha=0.0,
                             label_smoothing=0.0),
}

# %%
#| export
AUGMENTATION_RENAMES = {"imagenet": "deit", "cifar100-224": "deit", "cifar100-32": "pad-crop-flip"}  # earlier names


def augmentation(name: str, img_size: int, **overrides) -> AugConfig:
    """``AUGMENTATIONS[name]`` at ``img_size``, with some ``AugConfig`` fields replaced (validated again)."""
    if name in AUGMENTATION_RENAMES:
        raise ValueError(f"augmentation {name!r} is now called {AUGMENTATION_RENAMES[name]!r}: the training "
                         "recipes (chapter 21, --preset) keep the old names")
    unknown = sorted(set(overrides) - {f.name for f in fields(AugConfig)})
    if unknown:
        raise ValueError(f"unknown AugConfig field(s) {unknown}: the fields are "
                         f"{', '.join(f.name for f in fields(AugConfig))}")
    return replace(AUGMENTATIONS[one_of("augmentation", name, AUGMENTATIONS)], **overrides, img_size=img_size)


# %%
for name, cfg in AUGMENTATIONS.items():
    print(f"--- {name}\n{cfg}")
print(expect_error(lambda: augmentation("imagenet", 224)))
assert augmentation("pad-crop-flip", 64, erasing=0.25) == replace(AUGMENTATIONS["pad-crop-flip"], img_size=64,
                                                                  erasing=0.25)

# %%
#| export
def build_transforms(cfg: AugConfig, on_device: bool = False) -> tuple[v2.Compose, v2.Compose]:
    """``(train_transform, val_transform)`` of a recipe, PIL image in, normalised float tensor (3, S, S) out.

    ``on_device``: both stop at the uint8 tensor (3, S, S) before normalisation, a quarter of the bytes to ship
    from the loader workers; ``DeviceTransforms(cfg)`` then normalises (and erases) whole batches on the device."""
    interpolation = v2.InterpolationMode(cfg.interpolation)
    if cfg.crop == "random_resized":
        train = [v2.RandomResizedCrop(cfg.img_size, scale=cfg.scale, ratio=cfg.ratio, interpolation=interpolation,
                                      antialias=True)]
    else:
        train = [v2.RandomCrop(cfg.img_size, padding=cfg.padding, pad_if_needed=True)]
    if cfg.hflip > 0:
        train.append(v2.RandomHorizontalFlip(cfg.hflip))
    if cfg.randaugment_magnitude is not None:
        fill = [round(255 * m) for m in cfg.mean]  # rotated/sheared-in pixels get the mean colour
        # one bin per step of DeiT's 0..10 scale: magnitude m is m/10 of each op's maximum (31 bins: m/30)
        op = v2.RandAugment(1, cfg.randaugment_magnitude, num_magnitude_bins=RANDAUGMENT_MAX_MAGNITUDE + 1,
                            interpolation=v2.InterpolationMode.BILINEAR, fill=fill)
        train += [v2.RandomApply([op], p=cfg.randaugment_prob) for _ in range(cfg.randaugment_ops)]
    to_tensor = [v2.ToImage(), v2.ToPureTensor()] if on_device else [
        v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(cfg.mean, cfg.std)]
    train += to_tensor
    if cfg.erasing > 0 and not on_device:
        train.append(v2.RandomErasing(cfg.erasing, value="random"))  # per-pixel N(0, 1) in normalised space
    val = [v2.Resize(int(cfg.img_size / cfg.crop_ratio), interpolation=interpolation, antialias=True),
           v2.CenterCrop(cfg.img_size), *to_tensor]
    return v2.Compose(train), v2.Compose(val)

# %%
train_tf, val_tf = build_transforms(AUGMENTATIONS["deit"])
print(train_tf)
print(val_tf)
assert val_tf.transforms[0].size == [256]  # 224 / 0.875

# %% [markdown]
# Each op's argument at the recipe's magnitude, read from torchvision's own table of ops (`_AUGMENTATION_SPACE`,
# a private attribute: what `RandAugment` indexes with the magnitude), beside DeiT's — `timm`'s formulas at
# m9 — and beside what torchvision's default 31 bins would give:

# %%
rand_augment = train_tf.transforms[2].transforms[0]  # the op inside the first RandomApply
space, m = v2.RandAugment._AUGMENTATION_SPACE, rand_augment.magnitude


def torchvision_arg(op: str, bins: int) -> float:
    return float(space[op][0](bins, 224, 224)[m])


deit = {"Rotate": 30 * m / 10, "ShearX": 0.3 * m / 10, "TranslateX": 0.45 * m / 10 * 224, "Brightness": 0.9 * m / 10,
        "Solarize": 256 - int(256 * m / 10), "Posterize": 4 - int(4 * m / 10)}
units = {"Rotate": "degrees", "ShearX": "shear factor", "TranslateX": "pixels of 224", "Brightness": "factor 1 ±",
         "Solarize": "threshold", "Posterize": "bits kept"}
print(f"{'op':<11}{'unit':<15}{'DeiT':>7}{'11 bins':>9}{'31 bins':>9}")
for op, value in deit.items():
    ours, default = torchvision_arg(op, rand_augment.num_magnitude_bins), torchvision_arg(op, 31)
    if op == "Solarize":  # a share of the maximum pixel value in torchvision
        ours, default = 255 * ours, 255 * default
    print(f"{op:<11}{units[op]:<15}{value:>7.2f}{ours:>9.2f}{default:>9.2f}")
    if op != "Posterize":
        assert abs(ours - value) <= 0.02 * value, op  # DeiT's strength, within 2 %
assert torchvision_arg("Rotate", 31) == 9.0  # the default bins: a third of DeiT's 27 degrees

# %% [markdown]
# What the recipe does to one photograph: eight training views (each a new random crop, flip, RandAugment and
# sometimes an erased box, shown after undoing the normalisation) and the single evaluation view. The crops
# are aggressive — scale down to 8 % of the area — which is part of why DeiT needs 300 epochs.

# %%
# NBVAL_IGNORE_OUTPUT
# (the augmented views are drawn at random)
photo = load_rgb(TINY / "train" / "n01443537" / "n01443537_0.JPEG")
photo_name = f"Tiny ImageNet, {names[0]}"
print(photo_name, photo.size)


def show(x: torch.Tensor, cfg: AugConfig):
    """A normalised (3, H, W) tensor back to an image array for imshow."""
    mean, std = torch.tensor(cfg.mean)[:, None, None], torch.tensor(cfg.std)[:, None, None]
    return (x * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()


def augmentation_grid(image, cfg: AugConfig, title: str):
    train_tf, val_tf = build_transforms(cfg)
    torch.manual_seed(0)
    fig, axes = plt.subplots(1, 9, figsize=(11, 1.6), dpi=80)
    views = [train_tf(image) for _ in range(8)] + [val_tf(image)]
    for i, (ax, x) in enumerate(zip(axes, views)):
        assert x.shape == (3, cfg.img_size, cfg.img_size)
        ax.imshow(show(x, cfg))
        ax.set_title("eval" if i == 8 else f"train {i}", fontsize=8)
        ax.set_axis_off()
    fig.suptitle(title, fontsize=9, y=1.05)
    plt.show()


augmentation_grid(photo, AUGMENTATIONS["deit"], f"augmentation 'deit' on {photo_name}")

# %% [markdown]
# The two ways to train on CIFAR-100, on the same photograph shrunk to CIFAR's 32×32: `pad-crop-flip` only
# shifts and mirrors at 32 px; `deit` at 224 px upsamples with the full ImageNet recipe, as in the paper's SM C.

# %%
small = photo.resize((32, 32), Image.BICUBIC)
augmentation_grid(small, AUGMENTATIONS["pad-crop-flip"], "augmentation 'pad-crop-flip' (32x32 input)")
augmentation_grid(small, AUGMENTATIONS["deit"], "augmentation 'deit' (32x32 input, upsampled to 224)")

# %% [markdown]
# ## MixUp and CutMix with label smoothing
#
# MixUp blends two images, x = λ·x_i + (1−λ)·x_j, λ ~ Beta(α, α); CutMix pastes a random box of x_j into
# x_i and sets λ to the share of x_i that is left. The targets mix the same way, y = λ·y_i + (1−λ)·y_j, so the
# loss is a cross-entropy against a *soft* target. Label smoothing replaces each one-hot y by
# (1−ε)·y + ε/C. Both are linear, so smoothing before or after mixing gives the same target; every row still
# sums to 1. As in DeiT (timm's `mode="batch"`), one λ serves the whole batch and image j's partner is image
# B−1−j, the batch reversed (the last section says why). CutMix's box has sides √(1−λ) of the image's, a random
# centre, and is clipped at the border; λ is then corrected to the box's real area, as in DeiT and torchvision.
# λ and the box are Python numbers from torch's global CPU generator (the training loop seeds it per step, so a
# resumed run draws the same); the pixels are mixed by tensor ops on the batch's device, with no read-back.

# %%
#| export
class MixupCutmix:
    """Per batch: MixUp or CutMix (chosen at random), soft targets with label smoothing (DeiT recipe). Image j is
    mixed with image B−1−j, so the copies of repeated augmentation are (almost) never partners."""

    def __init__(self, num_classes: int, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0,
                 cutmix_prob: float = 0.5, label_smoothing: float = 0.1):
        positive_int("num_classes", num_classes, minimum=2)
        if mixup_alpha == 0 and cutmix_alpha == 0:
            raise ValueError("MixupCutmix with mixup_alpha = cutmix_alpha = 0 does nothing: use no mixing instead")
        self.num_classes, self.label_smoothing = num_classes, label_smoothing
        # the chance of CutMix in a batch: cutmix_prob when both are on, else 0 or 1
        self.cutmix_prob = cutmix_prob if mixup_alpha > 0 and cutmix_alpha > 0 else float(cutmix_alpha > 0)
        self.mixup_beta, self.cutmix_beta = (torch.distributions.Beta(torch.tensor(float(a)), torch.tensor(float(a)))
                                             if a > 0 else None for a in (mixup_alpha, cutmix_alpha))

    def draw(self, height: int, width: int) -> tuple[float, tuple[int, int, int, int] | None]:
        """λ and, for CutMix, the box ``(top, bottom, left, right)`` that gets the partner's pixels, λ corrected to
        the box's area; Python numbers from torch's global (CPU) generator."""
        if float(torch.rand(())) >= self.cutmix_prob:
            return float(self.mixup_beta.sample()), None
        side = math.sqrt(1 - float(self.cutmix_beta.sample()))
        box_h, box_w = int(height * side), int(width * side)
        top = int(torch.randint(height, ())) - box_h // 2  # the centre, less half the box
        left = int(torch.randint(width, ())) - box_w // 2
        top, bottom, left, right = max(top, 0), min(top + box_h, height), max(left, 0), min(left + box_w, width)
        return 1 - (bottom - top) * (right - left) / (height * width), (top, bottom, left, right)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B, 3, H, W)`` images and ``(B,)`` class indices -> mixed images and soft targets ``(B, C)``."""
        if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise ValueError(f"labels of shape {tuple(labels.shape)} must be class indices of shape "
                             f"({images.shape[0]},) for images of shape {tuple(images.shape)}")
        # checked on the CPU only: on a GPU, reading the labels' range would wait for the GPU at every batch
        if labels.device.type == "cpu" and labels.numel() and not (
                0 <= int(labels.min()) and int(labels.max()) < self.num_classes):
            raise ValueError(f"labels must lie in 0..{self.num_classes - 1}, got {int(labels.min())}.."
                             f"{int(labels.max())}")
        eps = self.label_smoothing
        targets = F.one_hot(labels, self.num_classes).to(images.dtype) * (1 - eps) + eps / self.num_classes
        lam, box = self.draw(*images.shape[-2:])
        partners = images.flip(0)
        if box is None:
            mixed = images * lam + partners * (1 - lam)
        else:
            top, bottom, left, right = box
            mixed = images.clone()
            mixed[..., top:bottom, left:right] = partners[..., top:bottom, left:right]
        return mixed, targets * lam + targets.flip(0) * (1 - lam)


def build_mixup(cfg: AugConfig, num_classes: int) -> MixupCutmix | None:
    """The batch-level MixUp/CutMix of a recipe, or None when both are off (then apply
    ``cfg.label_smoothing`` in the loss, e.g. ``F.cross_entropy(..., label_smoothing=...)``)."""
    if cfg.mixup_alpha == 0 and cfg.cutmix_alpha == 0:
        return None
    return MixupCutmix(num_classes, cfg.mixup_alpha, cfg.cutmix_alpha, cfg.cutmix_prob, cfg.label_smoothing)

# %% [markdown]
# MixUp and CutMix on four images of four classes, with their soft targets. Each row of targets sums to 1; the
# smallest entry is ε/C = 0.1/4 = 0.025 (label smoothing), the two largest are λ·(1−ε) + ε/C for the image
# itself and (1−λ)·(1−ε) + ε/C for its partner, the image at the mirrored place in the batch (3 for 0, 2 for 1).

# %%
# NBVAL_IGNORE_OUTPUT
# (soft targets print float noise of the drawn mixing weights)
cfg = AUGMENTATIONS["deit"]
_, val_tf = build_transforms(cfg)
source = val_ds
picks = [next(i for i, t in enumerate(source.targets) if t == c) for c in range(4)]
images = torch.stack([val_tf(source[i][0]) for i in picks])
labels = torch.tensor([source.targets[i] for i in picks])
torch.manual_seed(3)
for name, mixer in (("MixUp", MixupCutmix(4, mixup_alpha=0.8, cutmix_alpha=0.0)),
                    ("CutMix", MixupCutmix(4, mixup_alpha=0.0, cutmix_alpha=1.0))):
    mixed, targets = mixer(images, labels)
    torch.testing.assert_close(targets.sum(1), torch.ones(4))
    assert torch.allclose(targets.min(), torch.tensor(0.025))
    print(f"{name} soft targets (rows: images, columns: {names}):\n{targets}")
    fig, axes = plt.subplots(1, 4, figsize=(7, 2.2), dpi=80)
    for ax, x, t in zip(axes, mixed, targets):
        ax.imshow(show(x, cfg))
        top = t.topk(2)
        ax.set_title("\n".join(f"{v:.2f} {names[int(c)]}" for v, c in zip(top.values, top.indices)), fontsize=7)
        ax.set_axis_off()
    fig.suptitle(name, fontsize=9)
    plt.show()

# %% [markdown]
# In training, `build_mixup(cfg, num_classes)` returns this callable for the recipe (one random choice between
# MixUp and CutMix per batch, probability `cutmix_prob`), or None for recipes without mixing, whose loss then
# applies `cfg.label_smoothing` itself:

# %%
mix = build_mixup(AUGMENTATIONS["deit"], 100)
assert build_mixup(AUGMENTATIONS["pad-crop-flip"], 100) is None
torch.manual_seed(0)
cutmix = sum(mix.draw(224, 224)[1] is not None for _ in range(1000)) / 1000
assert abs(cutmix - 0.5) < 0.05  # 4.5 standard deviations of a binomial share
print(f"share of the batches mixed by CutMix: {cutmix:.1f}")

# %% [markdown]
# ## MixUp partners that are not copies
#
# Repeated augmentation (chapter 16's `RepeatAugSampler`, DeiT's ×3) puts the r copies of an image side by side in the
# global stream, and rank k of W takes positions k, k+W, … So in a process's batch the copies sit within ⌈r/W⌉ − 1
# positions of each other: side by side on one process, one per rank once W ≥ r. torchvision's `MixUp`/`CutMix` pair
# image i with i−1: on one process 2 partners in 3 are then a copy, with the same label, so the target is not mixed at
# all. Reversal pairs j with B−1−j, |B−1−2j| positions away: far apart except at the middle of the batch, so at most
# one pair in an even batch is a copy for r ≤ 3 (about r/4 for a larger r), at any world size, and without knowing the
# sampler. Measured through the real mixers on the stream that chapter 16's sampler deals — a permutation, each index
# repeated r times in a row, rank k taking every W-th position (tests/test_mixing.py measures the same through the
# sampler itself) — with each image's index in the dataset as its label, no smoothing, MixUp only: a row of soft
# targets with one non-zero entry is an image mixed with its copy.

# %%
def copy_partner_share(mix, world: int, repeats: int = 3, batch: int = 64, num_samples: int = 3072) -> float:
    """The share of images mixed with a copy of themselves, over one epoch of every rank's batches."""
    dealt = torch.randperm(num_samples, generator=torch.Generator().manual_seed(0)).repeat_interleave(repeats)
    copies = seen = 0
    for rank in range(world):
        stream = dealt[rank::world]
        for ids in stream[: len(stream) // batch * batch].view(-1, batch):
            _, targets = mix(torch.zeros(batch, 3, 1, 1), ids)
            copies, seen = copies + int(((targets > 0).sum(1) == 1).sum()), seen + batch
    return copies / seen


neighbour = v2.MixUp(alpha=0.8, num_classes=3072)
reversal = MixupCutmix(3072, mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.0)
print("world size   torchvision (i, i-1)   ours (j, B-1-j)   ours: copy pairs per batch")
for world, before_expected in ((1, 2 / 3), (2, 1 / 3), (4, 0), (8, 0)):
    before, after = copy_partner_share(neighbour, world), copy_partner_share(reversal, world)
    assert abs(before - before_expected) < 0.02 and after * 64 / 2 <= 1  # at most one pair in a batch
    print(f"{world:>10}{before:>23.3f}{after:>18.3f}{after * 64 / 2:>29.2f}")

# %% [markdown]
# DeiT's `main.py` switches its one-process `RandomSampler` off (`if True:  # args.distributed:`), so its
# `RASampler` serves one process too, the copies side by side as here; its mixing (timm's `Mixup`, batch mode)
# pairs the batch reversed, as ours does. We make repeated augmentation explicit (`repeats`, chapter 16, the same
# stream at every world size) and pair by reversal, so the copies stay apart on one process as on eight.
