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
# # Data: CIFAR-100 to ImageNet, subsampling, and the DeiT recipe
#
# The ConViT paper trains every model with the recipe of DeiT (Touvron et al., 2020) and changes only the
# architecture; its data experiments change only *how much* data the model sees. This chapter builds the data
# side of training, in the order a training run uses it:
#
# 1. **datasets by name**: CIFAR-100, any ImageNet-style folder (ImageNet-1k, ImageNet-100, Tiny ImageNet) and
#    synthetic images, one call returning `(train, val, class_names)`;
# 2. **the paper's data settings**: a fraction *f* of the images of each class (Table 2, with 1/f times more
#    epochs) and the first *K* classes (the ImageNet-100 ablations of Section 4);
# 3. **the DeiT recipe** with `torchvision.transforms.v2`: RandomResizedCrop, flip, RandAugment, RandomErasing,
#    then MixUp / CutMix with label smoothing on the batch;
# 4. **samplers** for one process or many, with repeated augmentation, resumable in the middle of an epoch;
# 5. **loaders** that scale, and a benchmark that says which stage of the pipeline limits training.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp data
# Data: CIFAR-100 to ImageNet, subsampling, the DeiT augmentation, samplers and loaders.
#
# Longer than the other modules because chapter 06 exports the whole input pipeline, from reading one image to
# a seeded loader per process; the course reorganisation splits the chapter, and this module with it, by topic.

# %%
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from convit_edu.checks import expect_error

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %% [markdown]
# ## Reading images: always RGB, never a crashed epoch
#
# ImageNet holds a few greyscale and CMYK JPEGs (and one PNG disguised as a JPEG); Tiny ImageNet holds
# greyscale ones. A model expects three channels, so every image is converted to RGB when it is read.
# A long run over a million files also meets the odd truncated or unreadable file (a copy interrupted, a disk
# error). Crashing the epoch, possibly hours in and on every rank at once, is the worst answer; the loader
# below warns naming the file and returns the next readable image of the dataset instead.

# %%
#| export
import math
import random
import signal
import tarfile
import time
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate
from torchvision import datasets
from torchvision.transforms import v2

from convit_edu.checks import one_of, positive_int

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_MAX_CONSECUTIVE_BAD = 32  # more unreadable files in a row than this means a broken dataset, not a bad file

# %%
#| export
def load_rgb(path: str | Path) -> Image.Image:
    """Read an image file as a 3-channel RGB PIL image (greyscale, CMYK and palette images are converted)."""
    with open(path, "rb") as f:
        image = Image.open(f)
        return image.convert("RGB")  # convert() also forces the decode while the file is open

# %%
#| exporti
def _first_readable(load: Callable[[int], tuple], index: int, size: int, describe: Callable[[int], str]):
    """``load(index)``, or, when that file cannot be decoded, the next readable sample (with a warning)."""
    for step in range(_MAX_CONSECUTIVE_BAD):
        i = (index + step) % size
        try:
            return load(i)
        except (OSError, SyntaxError) as e:  # PIL raises OSError (truncated, unidentified) or SyntaxError
            warnings.warn(f"skipping unreadable image {describe(i)} ({type(e).__name__}: {e}); "
                          "using the next image of the dataset instead", stacklevel=3)
    raise RuntimeError(f"{_MAX_CONSECUTIVE_BAD} unreadable images in a row from {describe(index)}: "
                       "the dataset looks corrupt; check the files (e.g. with PIL.Image.open(path).verify())")

# %% [markdown]
# ## The paper's data settings: a fraction of each class, the first K classes
#
# Table 2 trains on a fraction *f* ∈ {0.05, 0.1, 0.3, 0.5, 1} of the images **of each class**, so the class
# balance of ImageNet is kept, and multiplies the number of epochs by 1/f so that every model sees the same
# number of images. The subset must be deterministic, or two runs (ConViT and DeiT) would compare on
# different images. The official code keeps the first ⌊f·n_c⌋ files of each class in sorted order; we do the
# same (in dataset order, which for a folder *is* sorted file order and for CIFAR-100 is the order of the
# archive). A class left with no image at all is an error, not a silent drop.
#
# Section 4 runs its ablations on "the first 100 classes of ImageNet": the first K classes of the sorted class
# list (the WordNet ids, `n01440764`, ...), so the labels stay 0..K−1.

# %%
#| export
def check_fraction(fraction: float) -> None:
    """Raise a ValueError naming ``fraction`` unless 0 < fraction ≤ 1."""
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ValueError(f"fraction {fraction!r} is outside (0, 1]: it is the share of each class's training "
                         "images to keep (Table 2 of the paper uses 0.05, 0.1, 0.3, 0.5 and 1)")


def subsample_per_class(targets: Sequence[int], fraction: float) -> list[int]:
    """Indices that keep the first ⌊fraction·n_c⌋ samples of every class c, in dataset order (Table 2)."""
    check_fraction(fraction)
    by_class: dict[int, list[int]] = {}
    for i, t in enumerate(targets):
        by_class.setdefault(int(t), []).append(i)
    keep = []
    for c, idx in sorted(by_class.items()):
        k = math.floor(fraction * len(idx) + 1e-9)  # 1e-9: 0.29 * 100 is 28.999999999999996 in floats
        if k == 0:
            raise ValueError(f"fraction {fraction} keeps none of the {len(idx)} images of class {c}; "
                             f"use fraction >= {1 / len(idx):.4g}")
        keep += idx[:k]
    return sorted(keep)


def scaled_epochs(epochs: int, fraction: float) -> int:
    """Epochs to train on a fraction f of the data so that the model sees as many images: ``round(epochs / f)``.

    Table 2: 300 epochs at f = 1 become 6000 epochs at f = 0.05.
    """
    check_fraction(fraction)
    return round(epochs / fraction)

# %%
assert subsample_per_class([0, 0, 1, 1, 1, 0, 1, 0], 0.5) == [0, 1, 2, 3]
assert subsample_per_class([0] * 100 + [1] * 100, 0.29) == list(range(29)) + list(range(100, 129))
assert [scaled_epochs(300, f) for f in (0.05, 0.1, 0.3, 0.5, 1)] == [6000, 3000, 1000, 600, 300]
print("f -> epochs:", {f: scaled_epochs(300, f) for f in (0.05, 0.1, 0.3, 0.5, 1)})

# %% [markdown]
# ## Three datasets, one call
#
# * **`imagefolder`**: the layout of ImageNet and of every dataset converted to it, `ROOT/train/<class>/<image>`
#   and `ROOT/val/<class>/<image>`, read with torchvision's `ImageFolder` (sorted classes, sorted files),
#   extended with first-K classes, RGB conversion, skipping of unreadable files and clear errors for a missing
#   or empty folder. When `ROOT/classes.txt` holds `wnid<TAB>name` lines (Tiny ImageNet), the returned class
#   names are the human-readable ones.
# * **`cifar100`**: torchvision's `CIFAR100`, which downloads the archive into `ROOT/cifar-100-python` and
#   checks its checksums.
# * **`fake`**: synthetic images for demos and tests. Unlike random noise they are *learnable*: each class is a
#   smooth random colour pattern and each image that pattern plus noise, reproducible from the seed and the index.

# %%
#| export
class ImageFolderDataset(datasets.ImageFolder):
    """One split of an ImageNet-style folder, ``root/<class>/<image>``, as RGB images.

    Classes and files are sorted (torchvision's ``ImageFolder``); ``max_classes`` keeps the first K classes
    (Section 4's ImageNet-100) and ``fraction`` the first ⌊f·n_c⌋ files of each class (Table 2).
    An unreadable file is skipped with a warning naming it (the next image is returned instead).
    """

    def __init__(self, root: str | Path, transform: Callable | None = None, *, max_classes: int | None = None,
                 fraction: float = 1.0):
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"no folder {root}: expected {root}/<class>/<image> " + _IMAGEFOLDER_HINT)
        self.max_classes = max_classes
        super().__init__(str(root), transform=transform, loader=load_rgb, allow_empty=True)
        counts = [0] * len(self.classes)
        for _, t in self.samples:
            counts[t] += 1
        empty = [c for c, n in zip(self.classes, counts) if n == 0]
        if empty:
            raise ValueError(f"class folder(s) with no images in {root}: {', '.join(empty[:5])}"
                             f"{' ...' if len(empty) > 5 else ''} (image files end in {', '.join(IMG_EXTENSIONS)}); "
                             "add images or remove the folder(s)")
        if fraction != 1.0:
            keep = subsample_per_class(self.targets, fraction)
            self.samples = [self.samples[i] for i in keep]
            self.targets = [t for _, t in self.samples]
            self.imgs = self.samples

    def find_classes(self, directory: str) -> tuple[list[str], dict[str, int]]:
        try:
            classes, _ = super().find_classes(directory)
        except FileNotFoundError:
            raise FileNotFoundError(f"no class folders in {directory}: expected {directory}/<class>/<image> "
                                    + _IMAGEFOLDER_HINT) from None
        if self.max_classes is not None:
            if self.max_classes > len(classes):
                raise ValueError(f"max_classes {self.max_classes} is larger than the {len(classes)} classes "
                                 f"in {directory}")
            classes = classes[: self.max_classes]
        return classes, {c: i for i, c in enumerate(classes)}

    def __getitem__(self, index: int) -> tuple:
        def load(i):
            path, target = self.samples[i]
            image = self.loader(path)
            return (self.transform(image) if self.transform else image), target

        return _first_readable(load, index, len(self.samples), lambda i: self.samples[i][0])


_IMAGEFOLDER_HINT = (
    "(the ImageNet layout: ROOT/train/<class>/*.JPEG and ROOT/val/<class>/*.JPEG, one folder per class in both "
    "splits). ImageNet-1k: download ILSVRC2012 from image-net.org and sort val/ into class folders; "
    "Tiny ImageNet: see data/README.md"
)

# %%
#| export
class SyntheticImages(Dataset):
    """Learnable synthetic RGB images: class c is a smooth random colour pattern, each image adds noise.

    Image ``i`` of a split depends only on ``(seed, split, i)``; the class patterns only on ``seed``, so the
    train and val splits of one seed share their classes. Label of image i: ``i % num_classes``.
    """

    def __init__(self, num_images: int, num_classes: int = 10, image_size: int = 32, seed: int = 0,
                 split: str = "train", transform: Callable | None = None, noise: float = 0.15):
        for name, value in (("num_images", num_images), ("num_classes", num_classes), ("image_size", image_size)):
            positive_int(name, value)
        if split not in ("train", "val"):
            raise ValueError(f"split {split!r} must be 'train' or 'val'")
        self.num_classes, self.image_size, self.seed, self.split = num_classes, image_size, seed, split
        self.transform, self.noise = transform, noise
        self.classes = [f"class_{c:03d}" for c in range(num_classes)]
        self.indices = list(range(num_images))
        self.targets = [i % num_classes for i in self.indices]
        g = torch.Generator().manual_seed(seed)
        self.patterns = torch.rand(num_classes, 3, 4, 4, generator=g)

    def select(self, keep: Sequence[int], num_classes: int | None = None) -> None:
        """Keep only the samples at positions ``keep`` (and the first ``num_classes`` class names)."""
        self.indices = [self.indices[i] for i in keep]
        self.targets = [self.targets[i] for i in keep]
        if num_classes is not None:
            self.classes = self.classes[:num_classes]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple:
        i, target = self.indices[index], self.targets[index]
        rng = np.random.default_rng((self.seed, self.split == "val", i))  # independent stream per image
        pattern = F.interpolate(self.patterns[target][None], size=self.image_size, mode="bicubic",
                                align_corners=False)[0]
        noise = torch.from_numpy(rng.standard_normal(pattern.shape, dtype=np.float32))
        pixels = (pattern + self.noise * noise).clamp(0, 1)
        image = v2.functional.to_pil_image((pixels * 255).round().to(torch.uint8))
        return (self.transform(image) if self.transform else image), target

# %%
#| exporti
def _cifar100(root: Path, train: bool, transform, download: bool, fraction: float, max_classes: int | None):
    try:
        ds = datasets.CIFAR100(str(root), train=train, transform=transform, download=download)
    except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
        raise FileNotFoundError(
            f"CIFAR-100 not found (or its checksums do not match) under {root}/cifar-100-python: "
            f"build_datasets('cifar100', {str(root)!r}, download=True) downloads it (161 MB) with torchvision "
            f"({e})") from None
    except OSError as e:  # the download itself failed: no network, a proxy, a full disk
        raise FileNotFoundError(
            f"CIFAR-100 could not be downloaded into {root} ({type(e).__name__}: {e}): on a machine without "
            f"internet access, copy cifar-100-python.tar.gz (from https://www.cs.toronto.edu/~kriz/cifar.html) "
            f"into {root} and extract it there") from None
    keep = list(range(len(ds.targets)))
    if max_classes is not None:
        if max_classes > len(ds.classes):
            raise ValueError(f"max_classes {max_classes} is larger than the {len(ds.classes)} classes of CIFAR-100")
        keep = [i for i in keep if ds.targets[i] < max_classes]
        ds.classes = ds.classes[:max_classes]
        ds.class_to_idx = {c: i for i, c in enumerate(ds.classes)}
    if fraction != 1.0:
        keep = [keep[j] for j in subsample_per_class([ds.targets[i] for i in keep], fraction)]
    if len(keep) != len(ds.targets):
        ds.data = ds.data[keep]
        ds.targets = [ds.targets[i] for i in keep]
    return ds


def _class_names(root: Path, classes: list[str]) -> list[str]:
    """Human-readable names from ``root/classes.txt`` (``wnid<TAB>name, other name``) when it exists."""
    table = root / "classes.txt"
    if not table.is_file():
        return list(classes)
    names = dict(line.split("\t", 1) for line in table.read_text().splitlines() if "\t" in line)
    return [names.get(c, c).split(",")[0].strip() for c in classes]

# %%
#| export
DATASETS = ("cifar100", "imagefolder", "fake")


def build_datasets(name: str, root: str | Path = "data", *, train_transform: Callable | None = None,
                   val_transform: Callable | None = None, fraction: float = 1.0, max_classes: int | None = None,
                   download: bool = True, **fake_kwargs) -> tuple[Dataset, Dataset, list[str]]:
    """``(train, val, class_names)`` for dataset ``name`` ("cifar100", "imagefolder" or "fake").

    ``fraction`` keeps the first ⌊f·n_c⌋ training images of each class (Table 2; val is never subsampled),
    ``max_classes`` the first K classes of both splits (Section 4). "imagefolder" reads ``root/train`` and
    ``root/val``; "cifar100" reads (or, with ``download``, fetches) ``root/cifar-100-python``; "fake" takes
    ``num_train`` (1000), ``num_val`` (200), ``num_classes`` (10), ``image_size`` (32) and ``seed`` (0).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")
    if fake_kwargs and name != "fake":
        raise TypeError(f"build_datasets({name!r}) got unexpected keyword(s) {', '.join(sorted(fake_kwargs))}: "
                        "only 'fake' takes num_train, num_val, num_classes, image_size and seed")
    check_fraction(fraction)
    if max_classes is not None:
        positive_int("max_classes", max_classes)
    root = Path(root)
    if name == "cifar100":
        train = _cifar100(root, True, train_transform, download, fraction, max_classes)
        val = _cifar100(root, False, val_transform, False, 1.0, max_classes)
        return train, val, list(train.classes)
    if name == "imagefolder":
        if not (root / "train").is_dir() or not (root / "val").is_dir():
            found = sorted(p.name for p in root.iterdir())[:8] if root.is_dir() else None
            raise FileNotFoundError(
                f"{root} has no train/ and val/ folders ({'folder missing' if found is None else f'found {found}'}): "
                "expected " + _IMAGEFOLDER_HINT)
        train = ImageFolderDataset(root / "train", train_transform, max_classes=max_classes, fraction=fraction)
        val = ImageFolderDataset(root / "val", val_transform, max_classes=max_classes)
        if val.classes != train.classes:
            only_train, only_val = set(train.classes) - set(val.classes), set(val.classes) - set(train.classes)
            raise ValueError(f"train/ and val/ of {root} have different classes: only in train "
                             f"{sorted(only_train)[:5]}, only in val {sorted(only_val)[:5]}")
        return train, val, _class_names(root, train.classes)
    unknown = set(fake_kwargs) - {"num_train", "num_val", "num_classes", "image_size", "seed"}
    if unknown:
        raise TypeError(f"build_datasets('fake') got unexpected keyword(s) {', '.join(sorted(unknown))}: it takes "
                        "num_train, num_val, num_classes, image_size and seed")
    kw = dict(num_classes=fake_kwargs.get("num_classes", 10), image_size=fake_kwargs.get("image_size", 32),
              seed=fake_kwargs.get("seed", 0))
    train = SyntheticImages(fake_kwargs.get("num_train", 1000), split="train", transform=train_transform, **kw)
    val = SyntheticImages(fake_kwargs.get("num_val", 200), split="val", transform=val_transform, **kw)
    if max_classes is not None and max_classes > kw["num_classes"]:
        raise ValueError(f"max_classes {max_classes} is larger than the {kw['num_classes']} classes of the fake data")
    for ds, f in ((train, fraction), (val, 1.0)):
        keep = [i for i, t in enumerate(ds.targets) if max_classes is None or t < max_classes]
        if f != 1.0:
            keep = [keep[j] for j in subsample_per_class([ds.targets[i] for i in keep], f)]
        ds.select(keep, max_classes)
    return train, val, list(train.classes)

# %%
#| export
def extract_subset(archive: str | Path, dest: str | Path, max_classes: int,
                   max_per_class: int | None = None) -> Path:
    """Extract the first ``max_classes`` classes of an ImageNet-style ``.tar.gz`` into ``dest``, in one pass.

    The archive holds ``<top>/train/<class>/<file>``, ``<top>/val/<class>/<file>`` and optionally
    ``<top>/classes.txt``; ``max_per_class`` keeps the first files of each class and split in sorted order.
    ``dest`` becomes the dataset root (``dest/train``, ``dest/val``) for ``build_datasets("imagefolder", dest)``;
    when it already holds this very subset nothing is read again.
    """
    archive, dest = Path(archive), Path(dest)
    if not archive.is_file():
        raise FileNotFoundError(f"no archive {archive}")
    marker, request = dest / ".extracted", f"{archive.name} max_classes={max_classes} max_per_class={max_per_class}"
    if marker.is_file() and marker.read_text() == request:
        return dest
    if dest.exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty and does not hold {request}: choose an empty folder")
    kept: dict[tuple[str, str], dict[str, bytes]] = {}
    extra: dict[str, bytes] = {}
    with tarfile.open(archive, "r|gz") as tf:
        for m in tf:
            parts = Path(m.name).parts
            if not m.isfile() or ".." in parts:
                continue
            if len(parts) == 2:
                extra[parts[1]] = tf.extractfile(m).read()
            elif len(parts) == 4 and parts[1] in ("train", "val"):
                files = kept.setdefault((parts[1], parts[2]), {})
                if max_per_class is None or len(files) < max_per_class or parts[3] < max(files):
                    files[parts[3]] = tf.extractfile(m).read()
                    if max_per_class is not None and len(files) > max_per_class:
                        del files[max(files)]
    classes = sorted({c for split, c in kept if split == "train"})
    if not classes:
        raise ValueError(f"{archive} holds no <top>/train/<class>/<file> members")
    if max_classes > len(classes):
        raise ValueError(f"max_classes {max_classes} is larger than the {len(classes)} classes in {archive}")
    for (split, c), files in kept.items():
        if c in classes[:max_classes]:
            (dest / split / c).mkdir(parents=True, exist_ok=True)
            for fname, data in files.items():
                (dest / split / c / fname).write_bytes(data)
    for fname, data in extra.items():
        (dest / fname).write_bytes(data)
    marker.write_text(request)
    return dest

# %% [markdown]
# ### ImageNet in miniature: Tiny ImageNet
#
# The project's developers have a 100-class Tiny ImageNet (64×64 photographs of ImageNet classes, 500 training
# and 50 validation images per class, in the ImageNet folder layout) beside the repository. We extract its
# first four classes, once, into `data/` (ignored by git) and read them exactly as ImageNet-1k would be read.
# Without the archive (a user's machine) the chapter falls back to synthetic images and `grace_hopper.jpg`.

# %%
# NBVAL_IGNORE_OUTPUT
# (the numbers depend on whether the shared Tiny ImageNet archive is present)
ARCHIVE = Path("../../shared/data/tiny-imagenet-100.tar.gz")
HAVE_TINY = ARCHIVE.is_file()
if HAVE_TINY:
    TINY = extract_subset(ARCHIVE, Path("../data/tiny-imagenet-100-first4"), max_classes=4)
    train_ds, val_ds, names = build_datasets("imagefolder", TINY)
else:
    train_ds, val_ds, names = build_datasets("fake", num_train=2000, num_val=200, num_classes=4, image_size=64)
print(f"{type(train_ds).__name__}: {len(train_ds)} train / {len(val_ds)} val images, classes {names}")
image, label = train_ds[0]
print("first image:", image.mode, image.size, "label", label, f"({names[label]})")

# %% [markdown]
# Some of these JPEGs are greyscale; the dataset hands them out as RGB like the others:

# %%
# NBVAL_IGNORE_OUTPUT
# (the numbers depend on whether the shared Tiny ImageNet archive is present)
if HAVE_TINY:
    files = [p for p, _ in train_ds.samples + val_ds.samples]
    grey = [i for i, p in enumerate(files) if Image.open(p).mode != "RGB"]
    print(f"{len(grey)} of {len(files)} files are not RGB on disk, e.g. {Path(files[grey[0]]).name} "
          f"({Image.open(files[grey[0]]).mode})")
    grey_train = [i for i, (p, _) in enumerate(train_ds.samples) if Image.open(p).mode != "RGB"]
    assert grey_train and all(train_ds[i][0].mode == "RGB" for i in grey_train)

# %% [markdown]
# Table 2's fractions on these classes. Each class keeps ⌊f·500⌋ images, the first ones in sorted file order, so
# a smaller fraction is always a subset of a larger one (the runs of Table 2 are nested), and the epochs grow as
# 1/f:

# %%
print(f"{'f':>5} {'per class':>10} {'total':>6} {'epochs (300 at f=1)':>20}")
subsets = {}
for f in (0.05, 0.1, 0.3, 0.5, 1.0):
    sub, _, _ = build_datasets("imagefolder" if HAVE_TINY else "fake", TINY if HAVE_TINY else "data",
                               fraction=f, **({} if HAVE_TINY else dict(num_train=2000, num_classes=4, image_size=64)))
    counts = [sub.targets.count(c) for c in range(len(names))]
    assert counts == [math.floor(f * 500 + 1e-9)] * 4
    subsets[f] = sub.samples if HAVE_TINY else sub.indices
    print(f"{f:>5} {counts[0]:>10} {len(sub):>6} {scaled_epochs(300, f):>20}")
fs = sorted(subsets)
assert all(set(subsets[a]) <= set(subsets[b]) for a, b in zip(fs, fs[1:]))  # nested subsets

# %% [markdown]
# The first K classes: labels stay 0..K−1 and both splits agree.

# %%
# NBVAL_IGNORE_OUTPUT
# (the numbers depend on whether the shared Tiny ImageNet archive is present)
first2, val2, names2 = build_datasets("imagefolder" if HAVE_TINY else "fake", TINY if HAVE_TINY else "data",
                                      max_classes=2, **({} if HAVE_TINY else dict(num_train=2000, num_classes=4)))
assert names2 == names[:2] and sorted(set(first2.targets)) == sorted(set(val2.targets)) == [0, 1]
print(names2, len(first2), len(val2))

# %% [markdown]
# The synthetic images, one row per class: a smooth colour pattern per class plus noise, different for every
# image, so a model can learn them (the tests check that a nearest-class-mean classifier already does).

# %%
fake_train, _, fake_names = build_datasets("fake", num_train=40, num_val=10, num_classes=5, image_size=32)
fig, axes = plt.subplots(5, 8, figsize=(6, 4), dpi=80)
for ax, (img, y) in zip(axes.T.flat, (fake_train[i] for i in range(40))):
    ax.imshow(img)
    ax.set_axis_off()
fig.suptitle("build_datasets('fake'): rows = classes 0..4")
plt.show()

# %% [markdown]
# ## The DeiT recipe, every value visible
#
# DeiT trains a ViT on ImageNet-1k alone by regularising hard, and the ConViT paper keeps every value of that
# recipe. Per image (on the CPU, in the loader workers):
#
# | step | value | why |
# |---|---|---|
# | `RandomResizedCrop` | 224 px, scale (0.08, 1), ratio (3/4, 4/3), bicubic | scale and aspect jitter |
# | `RandomHorizontalFlip` | p = 0.5 | mirror symmetry of natural images |
# | `RandAugment` | 2 ops, each applied with p = 0.5, magnitude 9 of 10 (DeiT: "rand-m9-mstd0.5-inc1") | colour/geometry jitter |
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
# So 12 of DeiT's 15 ops — the geometric ones, the four enhancements, Solarize, AutoContrast and Equalize — act
# as in DeiT. Three differ: DeiT's harsh posterize, and Invert and SolarizeAdd, which torchvision lacks (it has
# an Identity op instead). Each of the three acts on about 1 image in 15 (2 draws × ½ × 1/15), so we keep
# torchvision's list rather than write ops of our own. DeiT's
# **magnitude noise** ("mstd0.5": each op draws its magnitude from N(9, 0.5), clipped to [0, 10]) is not
# reproduced: torchvision's magnitude is a fixed bin. The noise moves an op's strength by ±5 % around the same
# mean (27° ± 1.5°), so DeiT's average augmentation is what we apply. The fill colour for rotations and shears
# is the mean pixel, as in DeiT; the ops interpolate bilinearly where DeiT's are bicubic, because torchvision's
# rotations and affine maps offer bicubic for PIL images only, and this pipeline must also take tensors.
#
# Two named augmentations, `AUGMENTATIONS`: `deit` (the recipe above; the paper's SM C trains CIFAR-100
# upsampled to 224 px with *all hyperparameters unchanged*, so it uses this one too — the random resized crop
# does the upsampling) and `pad-crop-flip` (the classic CIFAR recipe at native resolution: 4-pixel padding,
# random 32×32 crop, flip, CIFAR-100 statistics, no RandAugment, erasing, MixUp or smoothing). They are named
# for what they do; the *training* recipes of chapter 07 (`imagenet`, `cifar100-32`, …) pick one of them.

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
                         "recipes (chapter 07, --preset) keep the old names")
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
# (the numbers depend on whether the shared Tiny ImageNet archive is present)
if HAVE_TINY:
    photo = load_rgb(TINY / "train" / "n01443537" / "n01443537_0.JPEG")
    photo_name = f"Tiny ImageNet, {names[0]}"
else:
    import matplotlib.cbook

    photo = load_rgb(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    photo_name = "grace_hopper.jpg"
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
# sums to 1. torchvision's `MixUp` and `CutMix` work on a whole batch (one λ per batch, the partner of sample i
# is sample i−1), as DeiT's `mode="batch"` does.

# %%
#| export
class MixupCutmix:
    """Per batch: MixUp or CutMix (chosen at random), soft targets with label smoothing (DeiT recipe)."""

    def __init__(self, num_classes: int, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0,
                 cutmix_prob: float = 0.5, label_smoothing: float = 0.1):
        positive_int("num_classes", num_classes, minimum=2)
        self.num_classes, self.label_smoothing = num_classes, label_smoothing
        choices, p = [], []
        if mixup_alpha > 0:
            choices.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
            p.append(1 - cutmix_prob if cutmix_alpha > 0 else 1.0)
        if cutmix_alpha > 0:
            choices.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
            p.append(cutmix_prob if mixup_alpha > 0 else 1.0)
        if not choices:
            raise ValueError("MixupCutmix with mixup_alpha = cutmix_alpha = 0 does nothing: use no mixing instead")
        self.mix = v2.RandomChoice(choices, p=p)

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
        return self.mix(images, targets)


def build_mixup(cfg: AugConfig, num_classes: int) -> MixupCutmix | None:
    """The batch-level MixUp/CutMix of a recipe, or None when both are off (then apply
    ``cfg.label_smoothing`` in the loss, e.g. ``F.cross_entropy(..., label_smoothing=...)``)."""
    if cfg.mixup_alpha == 0 and cfg.cutmix_alpha == 0:
        return None
    return MixupCutmix(num_classes, cfg.mixup_alpha, cfg.cutmix_alpha, cfg.cutmix_prob, cfg.label_smoothing)

# %% [markdown]
# MixUp and CutMix on four images of four classes, with their soft targets. Each row of targets sums to 1; the
# smallest entry is ε/C = 0.1/4 = 0.025 (label smoothing), the two largest are λ·(1−ε) + ε/C for the image
# itself and (1−λ)·(1−ε) + ε/C for its partner, the image before it in the batch.

# %%
# NBVAL_IGNORE_OUTPUT
# (the numbers depend on whether the shared Tiny ImageNet archive is present)
cfg = AUGMENTATIONS["deit"]
_, val_tf = build_transforms(cfg)
source = val_ds if HAVE_TINY else build_datasets("fake", num_val=40, num_classes=4, image_size=64)[1]
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
kinds = [type(mix.mix.transforms[int(torch.multinomial(torch.tensor(mix.mix.p), 1))]).__name__ for _ in range(1000)]
print({k: kinds.count(k) for k in ("MixUp", "CutMix")})

# %% [markdown]
# ## Samplers: many processes, repeated augmentation, resuming mid-epoch
#
# With W processes (ranks), each must read a *disjoint* part of the epoch, and every rank must run the *same
# number of batches*, or the gradient all-reduce of the last step waits forever for the rank that ran out.
# `RepeatAugSampler` defines one **global stream** per epoch and deals it out round-robin: rank k takes
# positions k, k+W, k+2W, ... The stream is a permutation of the N indices seeded by `seed + epoch` (the same
# on every rank, so no communication is needed), padded by wrapping around to a multiple of W.
#
# **Repeated augmentation** (Hoffer et al. 2020, Berman et al. 2019; used by DeiT with ×3) repeats each index
# r times *in a row* in that stream: [a, a, a, b, b, b, ...]. The stream keeps the length of a normal epoch
# (⌈N/W⌉ per rank), so an epoch shows N/r distinct images, r times each, with independent augmentations. As
# consecutive positions go to consecutive ranks, the r copies land on r different ranks when W ≥ r, in the
# same global batch (unless they straddle the boundary between two).
#
# **One process.** The official DeiT sampler (`RASampler`) builds the same kind of ×3 stream, and on a single
# process its behaviour surprises users: each image appears three times *in one batch*, and an epoch covers a
# third of the data (the epoch is also rounded down to a multiple of 256 images). What we do: the same global
# stream, on purpose, at every world size. Because rank k takes every W-th position, the *global* batch of step
# s (the union over ranks) is always the contiguous slice s·B·W … (s+1)·B·W−1 of the stream. So one process
# with batch B·W sees exactly the same global batches as W ranks with batch B each: in both, the r copies share
# a global batch and an epoch covers N/r images — which is also what the official code does on 8 GPUs. Only
# where the copies sit differs (one process: side by side in its batch; W ≥ r: one per rank). Repeated
# augmentation is never on by surprise: `repeats` defaults to 1 (plain shuffling), and `unique_per_epoch`
# says how many distinct images an epoch shows.
#
# **Resuming.** `set_epoch(epoch, start)` sets the epoch (hence the permutation) and skips the first `start`
# samples of this rank's share, so a run stopped after b batches of batch size B resumes with
# `set_epoch(epoch, b·B)` on exactly the samples it would have seen next.

# %%
#| export
class RepeatAugSampler(Sampler[int]):
    """Distributed sampler with repeated augmentation; resumable within an epoch.

    The epoch's global stream is a permutation of ``range(num_samples)`` (seeded by ``seed + epoch``), each
    index repeated ``repeats`` times in a row, cut (or wrapped) to ``num_replicas · ⌈num_samples /
    num_replicas⌉`` positions; rank k takes positions k, k + num_replicas, ... ``len()`` is the same on every
    rank: ⌈num_samples / num_replicas⌉.
    """

    def __init__(self, num_samples: int, num_replicas: int = 1, rank: int = 0, repeats: int = 1,
                 shuffle: bool = True, seed: int = 0):
        positive_int("num_samples", num_samples)
        positive_int("num_replicas (the world size)", num_replicas)
        if not 0 <= positive_int("rank", rank, minimum=0) < num_replicas:
            raise ValueError(f"rank {rank!r} must lie in 0..{num_replicas - 1} for num_replicas {num_replicas}")
        positive_int("repeats (DeiT: 3; 1 turns it off)", repeats)
        self.num_samples, self.num_replicas, self.rank = num_samples, num_replicas, rank
        self.repeats, self.shuffle, self.seed = repeats, shuffle, seed
        self.epoch, self.start = 0, 0

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.num_replicas)

    @property
    def remaining(self) -> int:
        """Samples this rank still yields this epoch (``len(self) - start``)."""
        return len(self) - self.start

    @property
    def unique_per_epoch(self) -> int:
        """How many distinct samples one epoch shows over all ranks (about ``num_samples / repeats``)."""
        return len(set(self.global_stream(self.epoch).tolist()))

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Use the permutation of ``epoch`` and skip this rank's first ``start`` samples (mid-epoch resume).

        Call it before every epoch. ``len()`` stays the full epoch (so a loader's ``len`` does too);
        ``remaining`` is what this rank still yields.
        """
        if not positive_int("start", start, minimum=0) <= len(self):
            raise ValueError(f"start {start!r} must lie in 0..{len(self)} (samples of this rank already consumed "
                             "this epoch)")
        self.epoch, self.start = epoch, start

    def global_stream(self, epoch: int) -> torch.Tensor:
        """All ranks' indices of ``epoch`` in stream order (rank k owns positions k, k + W, ...)."""
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + epoch))
        else:
            order = torch.arange(self.num_samples)
        stream = order.repeat_interleave(self.repeats)
        total = len(self) * self.num_replicas
        if len(stream) < total:  # only without repeats: wrap around, as DistributedSampler pads
            stream = stream.repeat(math.ceil(total / len(stream)))
        return stream[:total]

    def __iter__(self) -> Iterator[int]:
        mine = self.global_stream(self.epoch)[self.rank :: self.num_replicas]
        return iter(mine[self.start :].tolist())

# %% [markdown]
# Twelve images, one to three ranks, without and with repeated augmentation (epoch 0, seed 0). Every rank gets
# the same number of samples; with ×3 each of 4 images appears three times, on three different ranks when there
# are three of them:

# %%
for repeats in (1, 3):
    for world in (1, 2, 3):
        ranks = [RepeatAugSampler(12, world, r, repeats=repeats) for r in range(world)]
        print(f"repeats {repeats}, world {world}: " + " | ".join(" ".join(f"{i:2d}" for i in s) for s in ranks))
    print(f"  distinct images per epoch: {ranks[0].unique_per_epoch} of 12")

# %% [markdown]
# The claims of the design, checked: ranks partition the stream; the global batch of each step is the same for
# every world size at equal global batch; a new epoch reshuffles; `set_epoch(epoch, start)` resumes exactly.

# %%
N, GLOBAL_BATCH = 96, 24
single = RepeatAugSampler(N, repeats=3)
single.set_epoch(4)
stream = list(single)
for world in (2, 3, 4):
    ranks = [RepeatAugSampler(N, world, r, repeats=3) for r in range(world)]
    for s in ranks:
        s.set_epoch(4)
    per_rank = [list(s) for s in ranks]
    assert {len(p) for p in per_rank} == {N // world}
    b = GLOBAL_BATCH // world
    for step in range(N // GLOBAL_BATCH):
        step_batch = sorted(i for p in per_rank for i in p[step * b : (step + 1) * b])
        assert step_batch == sorted(stream[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH])
single.set_epoch(5)
assert list(single) != stream
resumed = RepeatAugSampler(N, repeats=3)
resumed.set_epoch(4, start=40)
assert list(resumed) == stream[40:] and resumed.remaining == N - 40 and len(resumed) == N
print("global batches independent of the world size; reshuffled per epoch; exact mid-epoch resume")

# %% [markdown]
# On ImageNet-1k, what an epoch is under each sampler. The official `RASampler` gives each rank
# ⌊⌊N/256⌋·256 / W⌋ samples (so a few images are dropped each epoch) drawn from the ×3 stream; ours gives each
# rank ⌈N/W⌉. Both cover about a third of the images per epoch, three times each, at *every* world size — that
# is what repeated augmentation with an unchanged epoch length means, not a single-process accident. The only
# single-process difference is where the copies sit: with one rank, in the same batch.

# %%
def official_ra_share(n: int, world: int, rank: int, epoch: int = 0) -> list[int]:
    """What DeiT's RASampler gives one rank (described, not its code): each index of a seeded permutation
    three times in a row, padded to a multiple of the world size, every world-th position from rank on,
    cut to ⌊⌊n/256⌋·256 / world⌋ samples."""
    stream = torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).repeat_interleave(3).tolist()
    per_rank = math.ceil(3 * n / world)
    stream += stream[: per_rank * world - len(stream)]
    return stream[rank : per_rank * world : world][: (n // 256 * 256) // world]


n = 5120
for world in (1, 8):
    shares = [official_ra_share(n, world, r) for r in range(world)]
    seen = [i for share in shares for i in share]
    assert len(set(seen)) == math.ceil(n / 3)  # a third of the data, at any world size
    print(f"official, world {world}: {len(seen)} samples per epoch, {len(set(seen))} distinct of {n}")
one = official_ra_share(n, 1, 0)
assert one[:3] == [one[0]] * 3  # one process: the three copies side by side, in the same batch

# %%
N_IMAGENET = 1_281_167
print(f"{'world':>5} {'official/rank':>14} {'ours/rank':>10} {'distinct images per epoch (ours)':>34}")
for world in (1, 8, 64):
    official = (N_IMAGENET // 256 * 256) // world
    ours = RepeatAugSampler(N_IMAGENET, world, repeats=3)
    print(f"{world:>5} {official:>14,} {len(ours):>10,} {ours.unique_per_epoch:>34,}")
assert RepeatAugSampler(N_IMAGENET, repeats=3).unique_per_epoch == math.ceil(N_IMAGENET / 3)

# %% [markdown]
# ## Loaders that keep the accelerator busy
#
# `build_loader` sets what matters at scale: `num_workers` processes decode and augment in parallel,
# `persistent_workers` keeps them (and their open files) alive across epochs instead of re-forking every
# epoch, `prefetch_factor` keeps 4 batches per worker in flight, `pin_memory` (default: on when CUDA is
# present) makes host-to-GPU copies asynchronous, and a **seeded generator** fixes the base seed of the
# workers' random augmentations (worker w gets `base_seed + w`), so a run is reproducible. With
# `num_workers=0` the augmentations draw from the main process's global torch RNG instead, which a checkpoint
# saves and restores like any other RNG state. Workers also ignore SIGTERM and SIGINT: SLURM signals every
# process of a job, and a worker killed by the signal would crash the main process in the middle of the step
# it must finish before saving (chapter 07).

# %%
#| export
def build_loader(dataset: Dataset, batch_size: int, sampler: Sampler | None, *, num_workers: int, seed: int,
                 drop_last: bool, pin_memory: bool | None = None) -> DataLoader:
    """A DataLoader over ``sampler`` (None: dataset order) with workers, pinning, prefetch and a seeded generator."""
    positive_int("batch_size", batch_size)
    positive_int("num_workers (0: load in this process)", num_workers, minimum=0)
    if drop_last and sampler is not None and len(sampler) < batch_size:
        raise ValueError(f"batch_size {batch_size} with drop_last=True leaves no batch: this rank's epoch holds "
                         f"only {len(sampler)} samples")
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers, drop_last=drop_last,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        generator=torch.Generator().manual_seed(seed), persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers > 0 else None, worker_init_fn=_ignore_stop_signals if num_workers else None,
    )


def _ignore_stop_signals(worker_id: int) -> None:
    """SLURM and a terminal send SIGTERM / SIGINT to every process of a job, loader workers included; a worker that
    died of it would crash the main process mid-step. Workers ignore both: the main process stops them itself
    after it has saved its checkpoint."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

# %% [markdown]
# ### Ship uint8, finish on the device
#
# A worker that normalises ships float32: 4 bytes per channel and pixel, 602 KB per 224-px image, where the
# same image as uint8 is 150 KB. Every byte crosses shared memory from the worker, then (pinned) the PCIe bus.
# So the training loop asks `build_transforms(cfg, on_device=True)` for transforms that stop at the uint8
# crop (decode, crop, flip, RandAugment: the per-image work that needs PIL or runs best on one image) and
# finishes each batch where the model runs: `DeviceTransforms` converts to float, normalises, and applies
# RandomErasing to the whole batch at once — each image with probability `erasing`, a box of 2–33 % of the
# area and aspect 0.3–3.3 (torchvision's and timm's ranges, 10 tries to fit) filled with N(0, 1) noise in
# normalised space (DeiT's "pixel" mode). MixUp/CutMix already ran batched on the device (above).
#
# Its random draws come from the process's global generators, which the training loop seeds from
# (seed, rank, epoch, step) before every step (chapter 07): a resumed run draws the same boxes.

# %%
#| export
class DeviceTransforms:
    """The end of a recipe, on uint8 batches (B, 3, S, S) on the training device: ``eval`` converts and
    normalises, ``train`` also erases a random box of each image with probability ``cfg.erasing``."""

    def __init__(self, cfg: AugConfig):
        self.mean, self.std, self.erasing = torch.tensor(cfg.mean), torch.tensor(cfg.std), cfg.erasing

    def eval(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"DeviceTransforms expects uint8 batches (B, 3, H, W), got {images.dtype} "
                             f"{tuple(images.shape)}: build the dataset with build_transforms(cfg, on_device=True)")
        mean, std = (255 * t.to(images.device)[:, None, None] for t in (self.mean, self.std))
        return (images.float() - mean) / std

    def train(self, images: torch.Tensor) -> torch.Tensor:
        x = self.eval(images)
        if self.erasing == 0:
            return x
        mask = erasing_boxes(x.shape[0], x.shape[-2:], self.erasing).to(x.device, non_blocking=True)
        return torch.where(mask[:, None], torch.randn_like(x), x)


def erasing_boxes(batch: int, size: tuple[int, int], p: float, scale: tuple[float, float] = (0.02, 1 / 3),
                  ratio: tuple[float, float] = (0.3, 3.3), tries: int = 10) -> torch.Tensor:
    """RandomErasing's boxes for a batch, as a (B, H, W) bool mask drawn on the CPU without a Python loop: each
    image with probability ``p``, a box of ``scale`` of the area with aspect ratio in ``ratio`` (log-uniform),
    the first of ``tries`` draws that fits (no box when none does)."""
    h_img, w_img = size
    area = h_img * w_img * torch.empty(batch, tries).uniform_(*scale)
    aspect = torch.exp(torch.empty(batch, tries).uniform_(math.log(ratio[0]), math.log(ratio[1])))
    h, w = (area * aspect).sqrt().round().long(), (area / aspect).sqrt().round().long()
    fits = (h < h_img) & (w < w_img)
    first = fits.float().argmax(1, keepdim=True)  # the first try that fits
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
    top = (torch.rand(batch) * (h_img - h + 1)).long()
    left = (torch.rand(batch) * (w_img - w + 1)).long()
    erase = (torch.rand(batch) < p) & fits.any(1)
    ys, xs = torch.arange(h_img)[None, :, None], torch.arange(w_img)[None, None, :]
    inside = ((ys >= top[:, None, None]) & (ys < (top + h)[:, None, None]) &
              (xs >= left[:, None, None]) & (xs < (left + w)[:, None, None]))
    return inside & erase[:, None, None]


# %% [markdown]
# The same recipe both ways on one batch: the uint8 batch is a quarter of the bytes, and normalising it on the
# device gives the worker's float tensors exactly; erased boxes cover about `erasing` × 17.5 % of the pixels
# on average (the mean box area is (2 % + 33 %)/2, when a box fits).

# %%
cfg = augmentation("deit", 64)
float_tf, float_val = build_transforms(cfg)
uint8_tf, uint8_val = build_transforms(cfg, on_device=True)
batch = torch.stack([uint8_val(photo) for _ in range(4)])
print("bytes per image:", float_val(photo).nbytes, "as float32,", batch[0].nbytes, "as uint8")
assert float_val(photo).nbytes == 4 * batch[0].nbytes
finish = DeviceTransforms(cfg)
assert torch.allclose(finish.eval(batch)[0], float_val(photo), atol=1e-5)
torch.manual_seed(0)
mask = erasing_boxes(20_000, (64, 64), p=cfg.erasing)
print(f"share of pixels erased: {mask.float().mean():.3f} (erasing {cfg.erasing}: about {cfg.erasing * 0.175:.3f})")
assert abs(mask.float().mean() - cfg.erasing * 0.175) < 0.01
assert finish.train(batch).shape == (4, 3, 64, 64)

# %% [markdown]
# ### Augmentation that does not depend on the worker
#
# A loader worker draws its augmentation from its own generator, so which crop an image gets depends on which
# worker read it, and on everything that worker read before. That breaks two promises of chapter 07: the same
# run at any number of workers, and a resumed run identical to an uninterrupted one. The fix is to seed every
# sample by *where it stands in the run*: the sampler yields keys (epoch, position in the epoch's global
# stream, index) — rank k of W reads positions k, k + W, … of the one stream `RepeatAugSampler` deals — and the
# dataset wrapper reads `dataset[index]` with torch's and Python's generators seeded from (seed, epoch,
# position): a pure function of the run's coordinates, whatever worker and however many processes read it.

# %%
#| export
def seed_from(*keys: int) -> int:
    """A well-mixed 32-bit seed from a tuple of non-negative integers (numpy's SeedSequence)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1)[0])


class KeyedSampler(Sampler):
    """Wraps a ``RepeatAugSampler`` so that it yields (epoch, global position, index) keys for ``SeededSamples``."""

    def __init__(self, sampler: RepeatAugSampler):
        self.sampler, self.epoch, self.start = sampler, 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """As ``RepeatAugSampler.set_epoch``: the permutation of ``epoch``, skipping this rank's first ``start``."""
        self.sampler.set_epoch(epoch, start)
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        rank, world = self.sampler.rank, self.sampler.num_replicas
        for i, index in enumerate(self.sampler):
            yield self.epoch, rank + world * (self.start + i), int(index)

    def __len__(self) -> int:
        return len(self.sampler)


class SeededSamples(Dataset):
    """Reads ``dataset[index]`` with torch's and Python's generators seeded from the sample's key."""

    def __init__(self, dataset: Dataset, seed: int):
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int, int]):
        epoch, position, index = key
        s = seed_from(self.seed, epoch, position)
        python_state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(s)  # CPU only: fork_rng restores the CPU generator
            random.seed(s)
            try:
                return self.dataset[index]
            finally:
                random.setstate(python_state)

# %% [markdown]
# ### From datasets to loaders in one call
#
# `build_loaders` strings the chapter together: a `RepeatAugSampler` for this rank behind a `KeyedSampler`,
# the seeded training samples, and loaders with workers; the validation loader keeps dataset order. It is the
# call chapter 07's `train` makes, and the one to make for a loop of your own: call `sampler.set_epoch(epoch)`
# before each epoch (with `start` to resume mid-epoch).

# %%
#| export
@dataclass
class DataLoaders:
    """What ``build_loaders`` makes: the two loaders and the train sampler (call its ``set_epoch``)."""

    train: DataLoader
    val: DataLoader
    sampler: KeyedSampler

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The train batches of ``epoch``, from this rank's sample ``start`` on (``sampler.set_epoch``, then the
        loader)."""
        self.sampler.set_epoch(epoch, start)
        return iter(self.train)


def build_loaders(train_set: Dataset, val_set: Dataset, *, batch_size: int, num_workers: int = 4,
                  repeats: int = 1, num_replicas: int = 1, rank: int = 0, seed: int = 0) -> DataLoaders:
    """Loaders for rank ``rank`` of ``num_replicas``: ``batch_size`` images per rank, the train loader seeded per
    sample and dropping the last incomplete batch, the val loader in dataset order keeping it (with several
    ranks, val pads to equal lengths)."""
    if len(train_set) < num_replicas:
        raise ValueError(f"{num_replicas} processes but the training set has only {len(train_set)} samples: "
                         f"use at most {len(train_set)} processes")
    sampler = KeyedSampler(RepeatAugSampler(len(train_set), num_replicas, rank, repeats=repeats, seed=seed))
    val_sampler = RepeatAugSampler(len(val_set), num_replicas, rank, shuffle=False)
    return DataLoaders(
        train=build_loader(SeededSamples(train_set, seed), batch_size, sampler, num_workers=num_workers, seed=seed,
                           drop_last=True),
        val=build_loader(val_set, batch_size, val_sampler, num_workers=num_workers, seed=seed, drop_last=False),
        sampler=sampler)

# %% [markdown]
# The Tiny ImageNet classes with the DeiT augmentation and repeated augmentation ×3 (`build_datasets("cifar100")`
# downloads CIFAR-100 into `data/` instead), one batch, mixed:

# %%
# NBVAL_IGNORE_OUTPUT
# (the numbers depend on whether the shared Tiny ImageNet archive is present)
aug = AUGMENTATIONS["deit"]
train_tf, val_tf = build_transforms(aug)
train_ds, val_ds, classes = build_datasets(
    "imagefolder" if HAVE_TINY else "fake", TINY if HAVE_TINY else "data", train_transform=train_tf,
    val_transform=val_tf, **({} if HAVE_TINY else dict(num_train=2000, num_val=200, num_classes=4, image_size=64)))
data = build_loaders(train_ds, val_ds, batch_size=32, num_workers=2, repeats=3)
data.sampler.set_epoch(0)
images, labels = next(iter(data.train))
mixed, targets = build_mixup(aug, len(classes))(images, labels)
print(f"classes {classes}; train {len(data.train)} batches/epoch, val {len(data.val)} batches")
print(f"batch {tuple(mixed.shape)} {mixed.dtype}, soft targets {tuple(targets.shape)}")
assert mixed.shape == (32, 3, 224, 224) and torch.allclose(targets.sum(1), torch.ones(32))

# %% [markdown]
# Every sample's augmentation is a function of its place in the run: the first batch of an epoch is the same
# with no worker and with two, and reading it again gives it again.

# %%
small_ds = SyntheticImages(64, 4, 48, transform=build_transforms(replace(aug, img_size=32))[0])
first = [next(iter(build_loaders(small_ds, small_ds, batch_size=8, num_workers=w, seed=3).train))[0]
         for w in (0, 2, 0)]
assert torch.equal(first[0], first[1]) and torch.equal(first[0], first[2])
print("the first batch is identical with 0 and 2 workers, and when read again")

# %% [markdown]
# ## Which stage limits the pipeline?
#
# `benchmark_loader` times each stage of the input pipeline separately, on the same images: **decode** (read
# and decode the files, RGB), **augment** (the train transform on decoded images), **collate** (stack into a
# batch, plus MixUp/CutMix when given) — each in one process — and the **loader** end to end with its worker
# processes. The slowest single-process stage divided by the number of workers is the pipeline's limit; compare
# the loader's images/s with the model's training throughput (chapter 11, `convit-edu bench`) to see whether
# data or model limits a run.

# %%
#| export
from matplotlib.figure import Figure


@dataclass
class LoaderBenchmark:
    """Images per second of each pipeline stage, measured by ``benchmark_loader``."""

    decode: float
    augment: float
    collate: float
    loader: float
    num_workers: int
    batch_size: int

    def __str__(self) -> str:
        stages = {"decode": self.decode, "augment": self.augment, "collate": self.collate}
        slowest = min(stages, key=stages.get)
        rows = [f"{k:<10}{v:>10.0f} img/s  (1 process)" for k, v in stages.items()]
        rows.append(f"{'loader':<10}{self.loader:>10.0f} img/s  ({self.num_workers} workers, batch {self.batch_size})")
        rows.append(f"slowest stage: {slowest}")
        return "\n".join(rows)


def benchmark_loader(dataset: Dataset, transform: Callable, batch_size: int = 64, num_batches: int = 4,
                     num_workers: int = 0, mixup: Callable | None = None) -> LoaderBenchmark:
    """Images/s of decode, augment and collate (one process, one thread, like a loader worker) and of the whole
    loader with ``num_workers`` (after its first batch, so without worker start-up) over the first
    ``batch_size · num_batches`` images. The dataset's ``transform`` attribute is replaced by ``transform`` for
    the loader run and restored afterwards."""
    n = min(batch_size * num_batches, len(dataset))
    if n < batch_size:
        raise ValueError(f"dataset of {len(dataset)} images is smaller than batch_size {batch_size}")
    saved, threads = dataset.transform, torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # as in a loader worker; intra-op threads only fight over small images
        dataset.transform = None
        t0 = time.perf_counter()
        raw = [dataset[i] for i in range(n)]
        t1 = time.perf_counter()
        augmented = [(transform(img), y) for img, y in raw]
        t2 = time.perf_counter()
        for b in range(0, n - batch_size + 1, batch_size):
            images, labels = default_collate(augmented[b : b + batch_size])
            if mixup is not None:
                mixup(images, labels)
        t3 = time.perf_counter()
        dataset.transform = transform
        loader = build_loader(dataset, batch_size, None, num_workers=num_workers, seed=0, drop_last=True,
                              pin_memory=False)
        it = iter(loader)
        next(it)  # worker start-up is a one-off cost (persistent workers): not counted
        t4, count = time.perf_counter(), 0
        for images, _ in it:
            count += len(images)
        t5 = time.perf_counter()
    finally:
        dataset.transform = saved
        torch.set_num_threads(threads)
    collated = (n // batch_size) * batch_size
    return LoaderBenchmark(decode=n / (t1 - t0), augment=n / (t2 - t1), collate=collated / (t3 - t2),
                           loader=count / (t5 - t4) if count else float("nan"), num_workers=num_workers,
                           batch_size=batch_size)


def plot_loader_benchmarks(results: dict[str, LoaderBenchmark]) -> Figure:
    """The pipeline's stages as one stacked bar per benchmark (milliseconds of one process per image: decode,
    augment, collate), beside the end-to-end loader's time per image with its workers."""
    fig = Figure(figsize=(8, 0.9 + 0.6 * len(results)), dpi=80)
    ax = fig.subplots()
    names = list(results)
    left = [0.0] * len(names)
    for stage, colour in (("decode", "C0"), ("augment", "C1"), ("collate", "C2")):
        ms = [1000 / getattr(results[n], stage) for n in names]
        ax.barh(names, ms, left=left, color=colour, label=f"{stage} (1 process)")
        left = [a + b for a, b in zip(left, ms)]
    for i, n in enumerate(names):
        loader_ms = 1000 / results[n].loader
        ax.plot([loader_ms, loader_ms], [i - 0.4, i + 0.4], color="black", linewidth=2,
                label="loader end to end" if i == 0 else None)
    ax.set(xlabel="milliseconds per image", title="where an image's time goes")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig

# %% [markdown]
# The benchmark on this machine (its numbers change from run to run, and with the CPU; the committed ones come
# from an AMD EPYC, Zen 3 with AVX2, 2 cores, with nothing else running). Decoding a 64×64 JPEG
# is cheap; the augmentations at 224 px dominate — RandomResizedCrop's bicubic upsampling and RandAugment —
# so `num_workers` should be as large as the CPU cores allow (DeiT used 10 per GPU). At 32 px the same
# pipeline is an order of magnitude faster.

# %%
# NBVAL_IGNORE_OUTPUT
n_batches = 2 if FAST else 8
benchmarks = {}
for name, dataset in (("deit", train_ds), ("pad-crop-flip", SyntheticImages(4096, 100, 32))):
    tf, _ = build_transforms(AUGMENTATIONS[name])
    benchmarks[name] = benchmark_loader(dataset, tf, batch_size=64, num_batches=n_batches, num_workers=2,
                                        mixup=build_mixup(AUGMENTATIONS[name], 100))
    print(f"--- augmentation {name}\n{benchmarks[name]}")

# %% [markdown]
# The same as a picture: each bar is one process's time per image, stage by stage; the black tick is the whole
# loader's time per image with its 2 workers (below the bar's end when the workers overlap the work).

# %%
# NBVAL_IGNORE_OUTPUT
plot_loader_benchmarks(benchmarks)

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
# | repeated augmentation, the `pad-crop-flip` recipe | yes | no: `loader="dali"` refuses them |
#
# Exact resume: a DALI pipeline built with `enable_checkpointing=True` returns its whole state — where the
# reader stands in its shuffled passes and every random generator of its operators — as bytes from
# `pipe.checkpoint()`, and a pipeline built with `checkpoint=` those bytes goes on from there. The training
# loop saves one such state per process in its checkpoints (chapter 07); the per-sample seeding of the
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
# `DaliLoaders` is what chapter 07's loop holds instead of `DataLoaders`: `epoch()` gives the train batches,
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
# ones come from an AMD EPYC, Zen 3 with AVX2, 2 cores, with nothing else running; this cell runs only where
# DALI is installed).

# %%
# NBVAL_IGNORE_OUTPUT
# (timings; and whether DALI is installed)
def images_per_s(batches: Iterator, count: int, batch_size: int) -> float:
    next(batches)  # start-up (pipeline build, worker start) is a one-off cost: not counted
    t0 = time.perf_counter()
    for _ in range(count):
        next(batches)
    return count * batch_size / (time.perf_counter() - t0)


if not HAVE_TINY:
    print("Tiny ImageNet subset not present: the DALI comparison needs image files: skipped")
elif not dali_available():
    print(f"DALI not installed: skipped ({DALI_INSTALL} installs it)")
else:
    aug64, batch, threads = augmentation("deit", 64), 64, 2
    tv_train, tv_val = build_transforms(aug64, on_device=True)
    tv_set, tv_val_set, _ = build_datasets("imagefolder", TINY, train_transform=tv_train, val_transform=tv_val)
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
# ## Bad input
#
# Each mistake a user can make with data gets an error (or, for one bad file among a million, a warning) that
# names the value and says what would be right, before any training starts.

# %%
import tempfile

with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    print(expect_error(lambda: build_datasets("imagefolder", tmp / "imagenet"), FileNotFoundError), "\n")
    (tmp / "train" / "cat").mkdir(parents=True)
    (tmp / "val" / "cat").mkdir(parents=True)
    print(expect_error(lambda: build_datasets("imagefolder", tmp)), "\n")
    print(expect_error(lambda: build_datasets("cifar100", tmp, download=False), FileNotFoundError), "\n")
print(expect_error(lambda: build_datasets("fake", fraction=1.5)), "\n")
print(expect_error(lambda: build_datasets("fake", num_train=100, fraction=0.05)), "\n")
print(expect_error(lambda: build_datasets("fake", max_classes=1000)), "\n")
print(expect_error(lambda: RepeatAugSampler(100, num_replicas=4, rank=4)))

# %% [markdown]
# A truncated file inside a dataset: the epoch goes on, and the warning names the file.

# %%
with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    for split in ("train", "val"):
        (tmp / split / "a").mkdir(parents=True)
        for k in range(3):
            photo.resize((16, 16)).save(tmp / split / "a" / f"{k}.jpg")
    broken = tmp / "train" / "a" / "1.jpg"
    broken.write_bytes(broken.read_bytes()[:100])
    ds, _, _ = build_datasets("imagefolder", tmp, train_transform=v2.PILToTensor())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(build_loader(ds, 3, None, num_workers=0, seed=0, drop_last=False))
    assert len(caught) == 1 and "1.jpg" in str(caught[0].message) and batches[0][0].shape == (3, 3, 16, 16)
    print(caught[0].message)

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
# * `build_loaders` makes the seeded train loader and the val loader that chapter 07's `train` uses;
#   `benchmark_loader` measures a pipeline stage by stage.
