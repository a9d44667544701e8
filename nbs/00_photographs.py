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
# # The course's photographs: fetched once, checked, extracted whole
#
# From chapter 08 on, the course works on real photographs: 100 classes of Tiny ImageNet, 64 × 64 pixels, in
# `data/tiny-imagenet-100`. The README has you fetch them before chapter 01 with one command, `convit-edu data
# tiny-imagenet`; this chapter is what that command runs, `tiny_imagenet`, which every chapter that needs the
# photographs calls too. It is the set-up, not the paper: run the command and go on to chapter 01, and come back
# here when a download misbehaves or to see how a dataset is fetched so that nothing half-done is ever used:
#
# 1. **a verified download and an extraction that appears only when complete**: a file from the internet is
#    checked before it is used, and an archive is extracted so that an interruption never leaves a folder that
#    looks ready;
# 2. **the course's photographs**: the Tiny ImageNet subset, its folder layout, and `tiny_imagenet`, which fetches
#    it once and finds it after.
#
# The engineering track reads such folders in chapters 13 (image files) and 14 (datasets).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp photographs
# Getting the course's photographs: a verified download, an extraction that appears only when complete, and the
# Tiny ImageNet subset the course uses (`tiny_imagenet`, which `convit-edu data tiny-imagenet` calls).

# %%
import tempfile

import matplotlib.pyplot as plt
from PIL import Image

from convit_edu.checks import expect_error

# %%
#| export
import contextlib
import json
import os
import re
import shutil
import socket
import tarfile
import urllib.parse
import zipfile
from pathlib import Path
from typing import Callable

from fastprogress.fastprogress import progress_bar
from torchvision.datasets.utils import calculate_md5, check_integrity, download_url

# %% [markdown]
# ## A verified download, an extraction that appears only when complete
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
# The course's photographs come this way (the next section): Tiny ImageNet's zip keeps its training images in
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
    in sorted order, ``train/<wnid>/images/*.JPEG`` flattened, ``val/images/*.JPEG`` sorted into class folders by
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
            if not name.startswith(top) or not parts[-1].endswith(".JPEG"):  # the zip's images, not its folders
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

# %% [markdown]
# ## The course's photographs: Tiny ImageNet
#
# Tiny ImageNet (Stanford's CS231n) is ImageNet in miniature: 200 classes of 64 × 64 photographs, 500 training and
# 50 validation images each, in one public zip of 248 MB. The course uses **every other class in sorted WordNet-id
# order**: 100 classes, 50 000 training and 5 000 validation images. `tiny_imagenet` downloads the zip and checks
# it, and extracts those classes in the ImageNet folder layout with class names in `classes.txt` (the tools
# above). It also reads a local copy, the zip or the course's `tar.gz` of the same tree, named by its `archive`
# argument or by the variable `CONVIT_EDU_TINY_IMAGENET` (this project's machines and CI set it). The command
# line's `convit-edu data tiny-imagenet` calls it (chapter 42).

# %%
#| export
TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
TINY_IMAGENET_MD5 = "90528d7ca1a48142e341f4ef8d21d0de"  # the published zip: 200 classes, 248 MB
COURSE_ARCHIVE_MD5 = "5322e467e435c40f782915b064ad50bb"  # the course's tar.gz of the tree below: 74 MB
ARCHIVE_VARIABLE = "CONVIT_EDU_TINY_IMAGENET"
COURSE_DATA = "tiny-imagenet-100"
_READY = ".ready.json"


def tiny_imagenet(root: str | Path = "data", *, url: str = TINY_IMAGENET_URL, md5: str | None = None,
                  archive: str | Path | None = None, timeout: float = 30.0) -> Path:
    """The course's photographs, ``root/tiny-imagenet-100`` (returned), extracted once and reused after.

    The source: ``archive`` (the published zip or the course's ``tar.gz``), else the file the environment
    variable ``CONVIT_EDU_TINY_IMAGENET`` names, else a download of ``url`` into ``root``. Its MD5 must be
    ``md5`` (default: the published one of its kind); a server silent for ``timeout`` seconds is an error.
    """
    dest = Path(root) / COURSE_DATA
    if (dest / _READY).is_file():
        print(f"{dest} is ready: {_describe(json.loads((dest / _READY).read_text()))}")
        return dest
    if dest.exists():
        raise FileExistsError(f"{dest} exists but was not completed by tiny_imagenet (it has no {_READY}): "
                              "move it away or delete it, then run again")
    named = archive or os.environ.get(ARCHIVE_VARIABLE) or None
    if named is None:
        print(f"downloading {url} into {root}")
        published = COURSE_ARCHIVE_MD5 if url.endswith(".tar.gz") else TINY_IMAGENET_MD5  # a mirror of either
        try:
            source = download_verified(url, root, md5 or published, timeout)
        except ConnectionError as e:
            raise ConnectionError(f"{e}: {DATA_HINT}") from None
    else:
        source = Path(named)
        if not source.is_file():
            by = "" if archive else f" (named by the variable {ARCHIVE_VARIABLE})"
            raise FileNotFoundError(f"no archive {source}{by}: {DATA_HINT}")
        verify_md5(source, md5 or (TINY_IMAGENET_MD5 if zipfile.is_zipfile(source) else COURSE_ARCHIVE_MD5))
    counts = extract_atomically(lambda tree: _course_tree(source, tree), dest)
    print(f"{dest}: {_describe(counts)}")
    return dest


DATA_HINT = (f"the course's photographs come from {TINY_IMAGENET_URL}; `convit-edu data tiny-imagenet` "
             "downloads them (into data/; --root elsewhere), or, with `--archive PATH`, reads a copy downloaded "
             "elsewhere (the zip, or the course's tiny-imagenet-100.tar.gz)")

# %%
#| exporti
def _describe(counts: dict) -> str:
    return (f"{counts['classes']} classes, {counts['train']} training and {counts['val']} validation images "
            f"(from {counts['source']})")


def _course_tree(source: Path, tree: Path) -> dict:
    """Write the course's tree from ``source`` (zip or tar.gz) into ``tree`` and return its counts, or raise a
    ValueError naming ``source`` unless train/ and val/ hold the same classes and classes.txt names them."""
    (extract_tiny_imagenet_zip if zipfile.is_zipfile(source) else extract_course_tar)(source, tree)
    folders = {split: sorted(p.name for p in (tree / split).iterdir()) if (tree / split).is_dir() else []
               for split in ("train", "val")}
    table = tree / "classes.txt"
    named = [line.split("\t")[0] for line in table.read_text().splitlines()] if table.is_file() else []
    if not folders["train"] or not folders["train"] == folders["val"] == named:
        raise ValueError(f"{source} does not hold the course's layout: classes {folders['train'][:3]} in train/, "
                         f"{folders['val'][:3]} in val/, {named[:3]} in classes.txt")
    counts = {"classes": len(named), "source": source.name,
              **{split: sum(len(os.listdir(tree / split / c)) for c in named) for split in folders}}
    (tree / _READY).write_text(json.dumps(counts))
    return counts

# %% [markdown]
# The course's photographs in `data/` (from the notebooks, `../data`). Every chapter that trains or analyses calls
# `tiny_imagenet` the same way, and finds them ready after the first call:

# %%
# NBVAL_IGNORE_OUTPUT
# (prints whether the tree was extracted now or found ready)
TINY = tiny_imagenet("../data")

# %% [markdown]
# The tree holds what the section above says: 100 classes, named in `classes.txt` in sorted WordNet-id order, with
# 500 training and 50 validation photographs each, in the same class folders in `train/` and `val/`:

# %%
classes = dict(line.split("\t") for line in (TINY / "classes.txt").read_text().splitlines())
per_class = {split: {len(os.listdir(TINY / split / wnid)) for wnid in classes} for split in ("train", "val")}
assert list(classes) == sorted(classes) == sorted(os.listdir(TINY / "train")) == sorted(os.listdir(TINY / "val"))
assert len(classes) == 100 and per_class == {"train": {500}, "val": {50}}, per_class
print(f"{len(classes)} classes, {per_class['train'].pop()} training and {per_class['val'].pop()} validation "
      f"photographs each; the first three: {list(classes.items())[:3]}")

# %% [markdown]
# Without the photographs and without a network, a chapter stops with the URL and the command that fetch them. Here
# the archive named does not exist:

# %%
with tempfile.TemporaryDirectory() as folder:
    missing = expect_error(lambda: tiny_imagenet(folder, archive=Path(folder) / "tiny-imagenet-200.zip"),
                           FileNotFoundError)
    assert DATA_HINT in missing and not os.listdir(folder), missing
    print(missing.replace(folder, "FOLDER"))

# %% [markdown]
# The first training photograph of each of the first eight classes, named as `classes.txt` names them (the first of
# its names), at their 64 × 64 pixels:

# %%
fig, axes = plt.subplots(1, 8, figsize=(10, 1.9), dpi=80)
for ax, (wnid, name) in zip(axes, classes.items()):
    first = sorted(os.listdir(TINY / "train" / wnid))[0]
    ax.imshow(Image.open(TINY / "train" / wnid / first).convert("RGB"))
    ax.set_title(name.split(",")[0], fontsize=8)
    ax.set_axis_off()
plt.show()
