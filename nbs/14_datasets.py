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
# # Datasets: CIFAR-100 to ImageNet, and the paper's data settings
#
# The ConViT paper trains every model with the recipe of DeiT (Touvron et al., 2020) and changes only the
# architecture; its data experiments change only *how much* data the model sees. Chapter 13 reads the image
# files (always RGB, an unreadable one skipped) and lists a folder once; this chapter builds the datasets on
# them, before augmentation (15), samplers and loaders (16, 17) and DALI (18):
#
# 1. **the paper's data settings**: a fraction *f* of the images of each class (Table 2, with 1/f times more
#    epochs) and the first *K* classes (the ImageNet-100 ablations of Section 4);
# 2. **datasets by name**: CIFAR-100, any ImageNet-style folder (ImageNet-1k, ImageNet-100, Tiny ImageNet) and
#    synthetic images, one call returning `(train, val, class_names)`, shown on the course's photographs
#    (fetched by chapter 00_photographs' `tiny_imagenet`).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp datasets
# Datasets by name (CIFAR-100, ImageNet-style folders, synthetic) and the paper's data settings: a fraction of
# each class and the first K classes.

# %%
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from PIL import Image

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %%
#| export
import math
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from torchvision import datasets
from torchvision.transforms import v2

from convit_edu.checks import positive_int
from convit_edu.image_files import IMAGEFOLDER_HINT, IMG_EXTENSIONS, cached_listing, first_readable, load_rgb
from convit_edu.photographs import socket_timeout

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
    The folder is listed once and its file list cached (``cached_listing``, chapter 13): a later dataset on the
    same, unchanged folder only stats its folders.
    """

    def __init__(self, root: str | Path, transform: Callable | None = None, *, max_classes: int | None = None,
                 fraction: float = 1.0):
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"no folder {root}: expected {root}/<class>/<image> " + IMAGEFOLDER_HINT)
        self.max_classes = max_classes
        self._listing = cached_listing(root)
        super().__init__(str(root), transform=transform, loader=load_rgb, allow_empty=True)
        del self._listing  # only find_classes and make_dataset (called just above) read it: no second copy kept
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
        """The (first ``max_classes``) class folders of the cached listing, and their labels."""
        classes = self._listing.classes
        if self.max_classes is not None:
            if self.max_classes > len(classes):
                raise ValueError(f"max_classes {self.max_classes} is larger than the {len(classes)} classes "
                                 f"in {directory}")
            classes = classes[: self.max_classes]
        return classes, {c: i for i, c in enumerate(classes)}

    def make_dataset(self, directory: str, class_to_idx: dict[str, int], extensions=None, is_valid_file=None,
                     allow_empty: bool = False) -> list[tuple[str, int]]:
        """The (path, label) pairs of the cached listing (image files: ``IMG_EXTENSIONS``) for the classes kept."""
        kept = len(class_to_idx)
        return [(os.path.join(directory, f), t) for f, t in zip(self._listing.files, self._listing.targets)
                if t < kept]

    def __getitem__(self, index: int) -> tuple:
        def load(i):
            path, target = self.samples[i]
            image = self.loader(path)
            return (self.transform(image) if self.transform else image), target

        return first_readable(load, index, len(self.samples), lambda i: self.samples[i][0])

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
        with socket_timeout(30):  # a silent server is an error after 30 s, not after the operating system's minutes
            ds = datasets.CIFAR100(str(root), train=train, transform=transform, download=download)
    except RuntimeError as e:  # torchvision: "Dataset not found or corrupted"
        raise FileNotFoundError(
            f"CIFAR-100 not found (or its checksums do not match) under {root}/cifar-100-python: "
            f"build_datasets('cifar100', {str(root)!r}, download=True) downloads it (161 MB) with torchvision "
            f"({e})") from None
    except OSError as e:  # the download itself failed: no network, a proxy, a full disk
        raise FileNotFoundError(
            f"CIFAR-100 could not be downloaded from {datasets.CIFAR100.url} into {root} ({type(e).__name__}: "
            f"{e}): check the network, or download that file elsewhere and copy it into {root}; the next run checks "
            "its checksum and extracts it") from None
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
                "expected " + IMAGEFOLDER_HINT)
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

# %% [markdown]
# ## The course's photographs as a dataset
#
# The course's photographs (chapter 00_photographs: 100 classes of Tiny ImageNet, fetched into `data/` by
# `tiny_imagenet`) are an ImageNet-style folder, read as ImageNet-1k would be read. The first four classes serve
# this chapter and the data pipeline's, the first two show that labels stay 0..K−1:

# %%
# NBVAL_IGNORE_OUTPUT
# (prints whether the tree was extracted now or found ready)
from convit_edu.photographs import tiny_imagenet

TINY = tiny_imagenet("../data")

# %%
train_ds, val_ds, names = build_datasets("imagefolder", TINY, max_classes=4)
assert len(train_ds) == 4 * 500 and len(val_ds) == 4 * 50 and len(names) == 4
print(f"{type(train_ds).__name__}: {len(train_ds)} train / {len(val_ds)} val images, classes {names}")
image, label = train_ds[0]
print("first image:", image.mode, image.size, "label", label, f"({names[label]})")
first2, val2, names2 = build_datasets("imagefolder", TINY, max_classes=2)
assert names2 == names[:2] and sorted(set(first2.targets)) == sorted(set(val2.targets)) == [0, 1]
print(names2, len(first2), len(val2))

# %% [markdown]
# Some of these JPEGs are greyscale; the dataset hands them out as RGB like the others:

# %%
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
    sub, _, _ = build_datasets("imagefolder", TINY, fraction=f, max_classes=4)
    counts = [sub.targets.count(c) for c in range(len(names))]
    assert counts == [math.floor(f * 500 + 1e-9)] * 4
    subsets[f] = sub.samples
    print(f"{f:>5} {counts[0]:>10} {len(sub):>6} {scaled_epochs(300, f):>20}")
fs = sorted(subsets)
assert all(set(subsets[a]) <= set(subsets[b]) for a, b in zip(fs, fs[1:]))  # nested subsets

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
