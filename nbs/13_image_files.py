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
# 2. **listing a million files once**, the list cached and checked against the folders' modification times;
# 3. **getting them**: a download that is verified before it is used, and an archive extracted so that an
#    interruption never leaves a folder that looks ready (chapter 14 fetches the course's photographs with both).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp image_files
# Image files: reading them as RGB (an unreadable file skipped with a warning), listing an ImageNet-style
# folder once (its file list cached, checked against the folders' modification times), and getting them: a
# verified download and an extraction that appears only when complete.

# %%
import contextlib
import re
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
import contextlib
import hashlib
import os
import re
import shutil
import socket
import tarfile
import time
import urllib.parse
import warnings
import zipfile
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from fastprogress.fastprogress import progress_bar
from PIL import Image
from torchvision import datasets
from torchvision.datasets.utils import calculate_md5, check_integrity, download_url

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

# %% [markdown]
# ## Getting them: a verified download, an extraction that appears only when complete
#
# A dataset that comes from the internet fails in three ways a user must not have to debug. The transfer stops
# half-way (a laptop closed, a Wi-Fi drop) and leaves a file that *looks* like the archive; the server never
# answers, and Python's `urllib` waits for the operating system's timeout, minutes; the extraction is
# interrupted and leaves a folder that the next run takes for a complete one. Three rules avoid all three:
#
# * the download goes to `NAME.part`, its MD5 is checked (torchvision's `download_url` and `check_integrity` do
#   the transfer, with a progress bar, and the checksum), and only a verified file gets its real name;
# * the socket timeout is ours for the duration of the download (`socket_timeout`, restored after it);
# * the extraction writes into a hidden folder beside its destination and renames it last: a rename within one
#   folder is atomic, so the destination either does not exist or is complete.
#
# The course's photographs come this way (chapter 14): Tiny ImageNet's zip keeps its training images in
# `train/<wnid>/images/` and all validation images in one folder, labelled by `val/val_annotations.txt`;
# `extract_tiny_imagenet_zip` writes every other class into the layout of every ImageNet-style folder,
# `train/<wnid>/<file>` and `val/<wnid>/<file>`, with the class names from `words.txt` in `classes.txt`.

# %%
#| export
def verify_md5(path: str | Path, md5: str, remove: bool = False) -> None:
    """Raise a ValueError naming ``path`` and both checksums unless its MD5 is ``md5`` (deleting it if asked)."""
    if check_integrity(str(path), md5):
        return
    found = calculate_md5(str(path))
    if remove:
        Path(path).unlink()
    raise ValueError(f"{path} has MD5 {found}, expected {md5}" + (
        ": the download was incomplete or altered, and has been removed; run again" if remove else
        ": it is not the file it should be, or it is damaged; use another copy"))


@contextlib.contextmanager
def socket_timeout(seconds: float):
    """Inside the block, a connection silent for ``seconds`` raises (urllib's default is to wait for the operating
    system, minutes); the previous default is restored after it."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def download_verified(url: str, folder: str | Path, md5: str, timeout: float = 30.0) -> Path:
    """``url`` downloaded into ``folder`` under its own name and checked against ``md5``; a verified file already
    there is reused. A partial download never gets the real name, a wrong one is removed, and a server silent for
    ``timeout`` seconds (or unreachable) is a ConnectionError that names the URL."""
    target = Path(folder) / Path(urllib.parse.urlparse(url).path).name
    if check_integrity(str(target), md5):
        return target
    partial = target.with_name(target.name + ".part")
    partial.unlink(missing_ok=True)  # left by an interrupted run: download_url would take it for the file
    try:
        with socket_timeout(timeout):
            download_url(url, str(folder), partial.name)
    except BaseException as e:  # a refused or silent connection, an HTTP error, a bad URL; or Ctrl-C
        partial.unlink(missing_ok=True)
        if isinstance(e, (OSError, ValueError)):
            raise ConnectionError(f"could not download {url} ({type(e).__name__}: {e})") from None
        raise
    try:
        verify_md5(partial, md5, remove=True)
    except ValueError as e:
        raise ValueError(f"the download of {url}: {e}") from None
    partial.rename(target)
    return target


def extract_atomically(write: Callable[[Path], dict], dest: str | Path) -> dict:
    """``write(folder)`` fills a hidden folder beside ``dest`` and returns what it wrote; the folder is then
    renamed to ``dest``. Interrupted (an exception, Ctrl-C), the hidden folder is removed; one left by a killed
    process of this machine is removed by the next call. When another process completed ``dest`` first, its
    tree is kept and ours dropped. Returns ``write``'s result."""
    dest, host = Path(dest), socket.gethostname()
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.partial-{host}-*"):  # another machine's may still be at work
        pid = stale.name.rsplit("-", 1)[1]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    partial = dest.parent / f".{dest.name}.partial-{host}-{os.getpid()}"
    try:
        result = write(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    try:
        partial.rename(dest)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not dest.is_dir():
            raise  # else another process renamed its complete copy there first: the same tree
    return result


def extract_tiny_imagenet_zip(source: Path, tree: Path) -> None:
    """Tiny ImageNet's published zip into ``tree``, in the ImageNet folder layout: every other wnid of ``wnids.txt``
    in sorted order, ``train/<wnid>/images/*`` flattened, ``val/images/*`` sorted into class folders by
    ``val/val_annotations.txt``, and ``classes.txt`` from ``words.txt``."""
    with zipfile.ZipFile(source) as zf:
        tops = [n[: -len("wnids.txt")] for n in zf.namelist() if n.endswith("wnids.txt") and n.count("/") <= 1]
        if not tops:
            raise ValueError(f"{source} has no wnids.txt: it is not the Tiny ImageNet zip")
        top = tops[0]
        keep = sorted(zf.read(top + "wnids.txt").decode().split())[::2]
        lines = {name: zf.read(top + name).decode().splitlines() for name in ("words.txt", "val/val_annotations.txt")}
        words = dict(line.split("\t", 1) for line in lines["words.txt"] if "\t" in line)
        val_class = {f: w for f, w, *_ in (line.split("\t") for line in lines["val/val_annotations.txt"] if line)}
        kept, todo = set(keep), []
        for name in zf.namelist():
            parts = name[len(top):].split("/")
            if not name.startswith(top) or not parts[-1].lower().endswith(IMG_EXTENSIONS):
                continue
            if len(parts) == 4 and parts[0] == "train" and parts[2] == "images" and parts[1] in kept:
                todo.append((f"train/{parts[1]}/{parts[3]}", name))
            elif len(parts) == 3 and parts[:2] == ["val", "images"] and val_class.get(parts[2]) in kept:
                todo.append((f"val/{val_class[parts[2]]}/{parts[2]}", name))
        tree.mkdir()
        (tree / "classes.txt").write_text("".join(f"{w}\t{words.get(w, w)}\n" for w in keep))
        _write_all(todo, tree, zf.read)


def extract_course_tar(source: Path, tree: Path) -> None:
    """The course's tar.gz (``<top>/classes.txt``, ``<top>/{train,val}/<wnid>/<file>``) into ``tree``, as it is."""
    with tarfile.open(source, "r:gz") as tf:
        todo = [("/".join(m.name.split("/")[1:]), m) for m in tf.getmembers() if m.isfile() and ".." not in m.name]
        tree.mkdir()
        _write_all([(p, m) for p, m in todo if p == "classes.txt" or re.fullmatch(r"(train|val)/[^/]+/[^/]+", p)],
                   tree, lambda m: tf.extractfile(m).read())


def _write_all(todo: list, tree: Path, read: Callable) -> None:
    for path, member in progress_bar(todo, leave=False):
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_bytes(read(member))


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True

# %% [markdown]
# Checked without a network. A file whose checksum is wrong is named with both sums; a local address where
# nothing listens is refused within the timeout, naming the URL; an extraction interrupted half-way leaves no
# destination and no hidden folder, and the next one completes.

# %%
with tempfile.TemporaryDirectory() as folder:
    archive = Path(folder) / "photos.bin"
    archive.write_bytes(b"not really photographs")
    wrong = expect_error(lambda: verify_md5(archive, "0" * 32))
    assert re.search(r"photos.bin has MD5 [0-9a-f]{32}, expected 0{32}", wrong), wrong
    with socket.socket() as closed:  # a port that was free a moment ago: nothing listens there
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/photos.zip"
    refused = expect_error(lambda: download_verified(url, folder, "0" * 32, timeout=5), ConnectionError)
    assert url in refused and not (Path(folder) / "photos.zip.part").exists(), refused

    def interrupted(tree: Path) -> dict:
        tree.mkdir()
        (tree / "first.jpg").write_bytes(b"...")
        raise KeyboardInterrupt  # as if the student pressed Ctrl-C here

    expect_error(lambda: extract_atomically(interrupted, Path(folder) / "photos"), KeyboardInterrupt)
    assert sorted(p.name for p in Path(folder).iterdir()) == ["photos.bin"]  # nothing half-written is left

    def complete(tree: Path) -> dict:
        tree.mkdir()
        (tree / "first.jpg").write_bytes(b"...")
        return {"files": 1}

    assert extract_atomically(complete, Path(folder) / "photos") == {"files": 1}
    print(wrong.replace(folder, "FOLDER"))
    print("unreachable:", refused.split(" (")[0].replace(url, "URL"))
    print("interrupted extraction: nothing left behind; the next one:",
          sorted(p.name for p in (Path(folder) / "photos").iterdir()))
