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
# # Image files: read safely, listed once
#
# CIFAR-100 is one archive that fits in memory; ImageNet's training split is 1.28 M JPEG files in 1,000
# folders, read from disk once per epoch for 300 epochs. Two things go wrong at that scale that never show on a
# small dataset. Some files are not what a model expects: greyscale or CMYK images, and, in a long run, the odd
# truncated or unreadable file; a broken JPEG met in epoch 40 must not end the run hours in, on every rank at
# once. And the folder itself has to be listed before a dataset exists, which on a network file system takes
# minutes and is done again by every process at every start. This chapter handles both, for the datasets of
# chapter 14 to build on:
#
# 1. **reading images** that are always RGB and never crash an epoch;
# 2. **listing a million files once**, the list cached and checked against the folders' modification times.
#
# (How the course's photographs got onto the disk, a verified download and an extraction that appears only when
# complete, is chapter 00_photographs.)

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp image_files
# Image files: reading them as RGB (an unreadable file skipped with a warning), and listing an ImageNet-style
# folder once (its file list cached, checked against the folders' modification times).

# %%
import contextlib
import tempfile
from unittest import mock

from convit_edu.checks import expect_error

# %% [markdown]
# ## Reading images: always RGB, never a crashed epoch
#
# ImageNet holds a few greyscale and CMYK JPEGs (and one PNG disguised as a JPEG); Tiny ImageNet holds
# greyscale ones. A model expects three channels, so every image is converted to RGB when it is read.
# A long run over a million files also meets the odd truncated or unreadable file (a copy interrupted, a disk
# error). Crashing the epoch, possibly hours in and on every rank at once, is the worst answer; `first_readable`
# below, which a dataset's `__getitem__` goes through, warns naming the file and returns the next readable image
# of the dataset instead.

# %%
#| export
import hashlib
import os
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from PIL import Image
from torchvision import datasets

from convit_edu.files import atomic_write

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
#| export
def first_readable(load: Callable[[int], tuple], index: int, size: int, describe: Callable[[int], str]):
    """``load(index)``, or, when that file cannot be decoded, the next readable sample (with a warning).

    ``size`` is the dataset's length (the search wraps around) and ``describe(i)`` names sample i's file in the
    warning; ``_MAX_CONSECUTIVE_BAD`` (32) unreadable files in a row raise a RuntimeError."""
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
# Checked on four small files: a greyscale JPEG, a CMYK JPEG and a palette PNG come out RGB, and a JPEG cut
# short (as an interrupted copy leaves it) is skipped with a warning naming it, the next image taking its place.
# A folder of nothing but broken files is an error, not an endless search.

# %%
with tempfile.TemporaryDirectory() as folder:
    files = [Path(folder) / name for name in ("grey.jpg", "cmyk.jpg", "palette.png", "cut.jpg")]
    Image.new("L", (8, 8), 128).save(files[0])
    Image.new("CMYK", (8, 8), (0, 90, 200, 0)).save(files[1])
    Image.new("P", (8, 8), 3).save(files[2])
    Image.new("RGB", (64, 64), (200, 30, 30)).save(files[3])
    files[3].write_bytes(files[3].read_bytes()[:400])  # cut short
    print("on disk:", [Image.open(f).mode for f in files[:3]], "-> read:", [load_rgb(f).mode for f in files[:3]])

    def load(i):
        return load_rgb(files[i]), i

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image, label = first_readable(load, 3, len(files), lambda i: files[i].name)
    assert image.mode == "RGB" and label == 0 and len(caught) == 1  # cut.jpg skipped: wraps round to grey.jpg
    print("sample 3:", caught[0].message)

    def all_cut(i):  # a dataset of 100 images, all of them cut short
        return load_rgb(files[3]), i

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 32 warnings before the error
        print(expect_error(lambda: first_readable(all_cut, 0, 100, lambda i: f"image {i}"), RuntimeError))

# %% [markdown]
# ## Listing a million files once
#
# `ImageFolder` lists its folder when it is made: ImageNet's training split is 1,000 folders and 1.28 M files, which
# takes from seconds on a local SSD to minutes on a network file system, and a run makes it again in every process (8
# per node), at every start and every requeue after a pre-emption. So `cached_listing`, which chapter 14's
# `ImageFolderDataset` calls, keeps the listing in one compact file per split folder under
# `$XDG_CACHE_HOME/convit-edu/file-lists/` (`~/.cache/...` by default; `file_list_cache` names it): the class names, the
# files as one string of relative paths and the labels as an int32 tensor, with the modification time of every folder
# listed. Adding or removing a file changes the mtime of its folder, adding or removing a class that of the split
# folder, so a later start compares these times (one `stat` per folder, 1,001 on ImageNet) and lists nothing when they
# are unchanged; when one differs it lists the folder again and rewrites the file. The file is written to a temporary
# name and renamed into place, so a process reading it never sees half of one; a cache folder that cannot be written (a
# read-only home) only means that every start lists the folder, as before. One catch: many file systems keep times in
# coarse ticks (a second on some NFS servers), and a file added in the same tick as the listing would leave its folder's
# time unchanged. So a folder changed in the last 5 seconds is listed but not cached; the next start caches it.
#
# The training loop makes rank 0 build its datasets first, and the other ranks after a barrier: they find rank
# 0's file (the cache folder is usually in a home shared by the nodes) and list nothing.

# %%
#| export
def file_list_cache(root: str | Path) -> Path:
    """The file caching the listing of image folder ``root`` (see ``cached_listing``):
    ``$XDG_CACHE_HOME/convit-edu/file-lists/<hash of root's absolute path>.pt``, ``XDG_CACHE_HOME`` defaulting
    to ``~/.cache``.

    Rank 0 of a run builds its datasets (and so writes this file) before the other ranks, which then read it
    instead of listing the folder again: one listing per run and folder, not one per process and start."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(os.path.abspath(root).encode()).hexdigest()[:32]
    return Path(cache_home) / "convit-edu" / "file-lists" / f"{digest}.pt"

# %%
#| export
# The layout every image-folder error message asks for (chapter 14's datasets say it too).
IMAGEFOLDER_HINT = (
    "(the ImageNet layout: ROOT/train/<class>/*.JPEG and ROOT/val/<class>/*.JPEG, one folder per class in both "
    "splits). ImageNet-1k: download ILSVRC2012 from image-net.org and sort val/ into class folders; "
    "Tiny ImageNet: see data/README.md"
)


class Listing(NamedTuple):
    """An image folder's class folders, its image files (relative paths, in ``ImageFolder``'s order) and their
    labels."""

    classes: list[str]
    files: list[str]
    targets: list[int]


_LISTING_FORMAT = 1  # raise it when what the cache holds or how a folder is listed changes
_SETTLED_NS = 5 * 10**9  # a folder changed more recently may change again within one tick of its (often coarse) clock


def _list_folder(root: str) -> tuple[Listing, dict[str, int]]:
    """List ``root/<class>/...`` as torchvision's ``ImageFolder`` does (sorted class folders; in each, the sorted
    ``os.walk`` and sorted names, image extensions only), with the mtime (ns) of every folder. The split's and
    each class's are taken before they are listed, so a change during the listing leaves the cache stale, not
    wrong (a class's sub-folders, rare, are stat'ed as ``os.walk`` reaches them)."""
    mtimes = {".": os.stat(root).st_mtime_ns}
    try:
        classes, _ = datasets.folder.find_classes(root)
    except FileNotFoundError:
        raise FileNotFoundError(f"no class folders in {root}: expected {root}/<class>/<image> "
                                + IMAGEFOLDER_HINT) from None
    files, targets = [], []
    for label, c in enumerate(classes):
        mtimes[c] = os.stat(os.path.join(root, c)).st_mtime_ns
        for folder, _, names in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            rel = os.path.relpath(folder, root)
            mtimes.setdefault(rel, os.stat(folder).st_mtime_ns)  # sub-folders of a class, if any
            images = [os.path.join(rel, n) for n in sorted(names) if n.lower().endswith(IMG_EXTENSIONS)]
            files += images
            targets += [label] * len(images)
    return Listing(classes, files, targets), mtimes


def cached_listing(root: str | Path) -> Listing:
    """``root``'s listing from its cache file when every folder recorded there keeps its mtime, else listed
    again and the cache rewritten (``file_list_cache``). A folder changed in the last seconds is not cached: on
    a file system whose clock ticks coarsely (NFS, older kernels), a file added within the same tick would not
    change the folder's mtime and the cache would miss it."""
    path, where = file_list_cache(root), os.path.abspath(root)
    try:
        cached = torch.load(path, weights_only=True)
        folders = cached["folders"].split("\n")
        if (cached["format"], cached["root"]) == (_LISTING_FORMAT, where) and cached["mtimes"].tolist() == [
                os.stat(os.path.join(where, f)).st_mtime_ns for f in folders]:
            return Listing(cached["classes"].split("\n"), cached["files"].split("\n") if cached["files"] else [],
                            cached["targets"].tolist())
    except Exception:  # no cache yet, or one that cannot be read (truncated, older, unreadable): list again
        pass
    listing, mtimes = _list_folder(str(root))
    settled = time.time_ns() - max(mtimes.values()) > _SETTLED_NS
    if settled and not any("\n" in n for n in (*listing.classes, *listing.files, *mtimes)):  # "\n" joins them
        _save_quietly({"format": _LISTING_FORMAT, "root": where, "classes": "\n".join(listing.classes),
                       "files": "\n".join(listing.files), "targets": torch.tensor(listing.targets, dtype=torch.int32),
                       "folders": "\n".join(mtimes), "mtimes": torch.tensor(list(mtimes.values()))}, path)
    return listing


def _save_quietly(obj: dict, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, renamed over it (a reader sees the old file or the new
    one, never half of one); nothing at all when the folder cannot be written (a read-only home)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f: torch.save(obj, f))
    except OSError:
        pass

# %% [markdown]
# Checked on a small generated folder (its folders' times set a minute back, as if made earlier), with the
# cache in a fresh folder: the first listing reads the split folder and its class folders, a second one of the
# unchanged folder lists nothing and gives the same files, and a file added to a class is found by the next.

# %%
@contextlib.contextmanager
def count_listings(counts: list):
    """Append every directory listing (os.scandir, os.listdir, os.walk) made inside the block to ``counts``."""
    originals = {name: getattr(os, name) for name in ("scandir", "listdir", "walk")}

    def counting(name):
        def call(*args, **kwargs):
            counts.append((name, args[0] if args else "."))
            return originals[name](*args, **kwargs)
        return call

    with contextlib.ExitStack() as stack:
        for name in originals:
            stack.enter_context(mock.patch.object(os, name, counting(name)))
        yield counts


with tempfile.TemporaryDirectory() as folder, mock.patch.dict(os.environ, {"XDG_CACHE_HOME": f"{folder}/cache"}):
    split = Path(folder) / "train"
    for c in ("cat", "dog", "emu"):
        (split / c).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (8, 8), (60 * i, 0, 0)).save(split / c / f"{i}.png")
    a_minute_ago = time.time_ns() - 60 * 10**9
    for d in (split, *split.iterdir()):
        os.utime(d, ns=(a_minute_ago, a_minute_ago))
    with count_listings([]) as first_start:
        first = cached_listing(split)
    with count_listings([]) as second_start:
        second = cached_listing(split)
    listed = {path for _, path in first_start}
    assert listed == {str(split), *(str(split / c) for c in ("cat", "dog", "emu"))}
    assert second == first and file_list_cache(split).is_file() and len(second_start) == 0
    Image.new("RGB", (8, 8)).save(split / "dog" / "new.png")
    third = cached_listing(split)
    assert os.path.join("dog", "new.png") in third.files and len(third.files) == len(first.files) + 1
    print(f"first start: lists {len(listed)} folders (the split and its classes); second start: "
          f"{len(second_start)} listings, same files; a file added to a class: {len(third.files)} images, "
          f"not {len(first.files)}")
