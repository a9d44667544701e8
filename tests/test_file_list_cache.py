"""An image folder is listed once: a later dataset on the unchanged folder reads the cached file list and lists
no directory; a change to the folder shows; a cache that cannot be written or read changes nothing else."""

import os
import time
from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision import datasets

from convit_edu.datasets import ImageFolderDataset, build_datasets
from convit_edu.image_files import file_list_cache

CLASSES = ["cat", "dog", "emu"]


def add_image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (6, 5), (len(path.name) * 20, 90, 30)).save(path)


def settle(root: Path) -> None:
    """Date every folder under ``root`` a minute back, as a folder made before this run would be (a folder
    changed in the last seconds is listed but not cached)."""
    past = time.time_ns() - 60 * 10**9
    for folder, _, _ in os.walk(root):
        os.utime(folder, ns=(past, past))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """``train/`` and ``val/`` of three classes of tiny JPEGs and PNGs; ``train/dog`` has a sub-folder and a file
    that is not an image."""
    for split, n in (("train", 4), ("val", 2)):
        for c in CLASSES:
            for k in range(n):
                add_image(tmp_path / split / c / f"img_{k}.{'png' if k % 2 else 'jpg'}")
    add_image(tmp_path / "train" / "dog" / "more" / "img_9.JPEG")
    (tmp_path / "train" / "dog" / "notes.txt").write_text("not an image")
    settle(tmp_path)
    return tmp_path


@pytest.fixture
def listings(monkeypatch):
    """The directory listings (os.scandir, os.listdir, os.walk) made from now on, as absolute paths."""
    made = []
    for name in ("scandir", "listdir", "walk"):
        original = getattr(os, name)

        def counting(*args, _original=original, **kwargs):
            made.append(os.path.abspath(os.fspath(args[0])) if args and not isinstance(args[0], int) else ".")
            return _original(*args, **kwargs)

        monkeypatch.setattr(os, name, counting)
    return made


def under(root: Path, paths: list[str]) -> list[str]:
    return [p for p in paths if p == str(root) or p.startswith(f"{root}{os.sep}")]


def same_dataset(a: ImageFolderDataset, b: ImageFolderDataset) -> bool:
    return (a.samples, a.targets, a.classes, a.class_to_idx) == (b.samples, b.targets, b.classes, b.class_to_idx)


def test_a_second_dataset_on_the_same_folder_lists_no_directory(root, listings):
    first = ImageFolderDataset(root / "train")
    assert under(root, listings)  # the first one lists the folder ...
    listings.clear()
    second = ImageFolderDataset(root / "train")
    assert under(root, listings) == []  # ... the second only reads the cache
    assert same_dataset(second, first)
    assert second.samples == datasets.ImageFolder(str(root / "train")).samples  # torchvision's listing, exactly
    assert len(second) == 13 and second[12][1] == 2  # the sub-folder's image is there, notes.txt is not


def test_a_second_build_datasets_lists_no_directory(root, listings):
    first = build_datasets("imagefolder", root)
    listings.clear()
    second = build_datasets("imagefolder", root)
    assert under(root, listings) == []
    assert all(same_dataset(a, b) for a, b in zip(first[:2], second[:2])) and first[2] == second[2] == CLASSES


def test_the_cache_is_one_file_per_split_folder_where_file_list_cache_says(root):
    build_datasets("imagefolder", root)
    cached = sorted(file_list_cache(root / split) for split in ("train", "val"))
    assert sorted(cached[0].parent.iterdir()) == cached  # nothing else there: no temporary file left behind
    assert cached[0].parent == Path(os.environ["XDG_CACHE_HOME"]) / "convit-edu" / "file-lists"
    assert file_list_cache(root / "train") == file_list_cache(os.path.relpath(root / "train"))  # absolute path


def test_a_file_added_to_a_class_is_found(root, listings):
    before = ImageFolderDataset(root / "train")
    add_image(root / "train" / "cat" / "img_new.png")
    listings.clear()
    after = ImageFolderDataset(root / "train")
    assert under(root, listings)
    assert str(root / "train" / "cat" / "img_new.png") in [p for p, _ in after.samples]
    assert len(after) == len(before) + 1
    assert same_dataset(after, datasets.ImageFolder(str(root / "train")))


def test_a_file_added_to_a_classs_sub_folder_is_found(root):
    before = ImageFolderDataset(root / "train")
    add_image(root / "train" / "dog" / "more" / "img_10.png")
    assert len(ImageFolderDataset(root / "train")) == len(before) + 1


def test_a_file_removed_from_a_class_is_gone(root):
    before = ImageFolderDataset(root / "train")
    (root / "train" / "emu" / "img_0.jpg").unlink()
    after = ImageFolderDataset(root / "train")
    assert len(after) == len(before) - 1 and str(root / "train" / "emu" / "img_0.jpg") not in dict(after.samples)


def test_a_class_folder_added_is_found(root):
    ImageFolderDataset(root / "train")
    add_image(root / "train" / "fox" / "img_0.jpg")
    after = ImageFolderDataset(root / "train")
    assert after.classes == [*CLASSES, "fox"] and after.targets[-1] == 3


def test_a_folder_changed_seconds_ago_is_listed_but_not_cached(root):
    add_image(root / "val" / "cat" / "img_new.jpg")  # val/cat's time is now: a file added in the same clock
    ImageFolderDataset(root / "val")  # tick would not change it again, so this listing must not be trusted later
    assert not file_list_cache(root / "val").exists()


def test_an_unwritable_cache_folder_only_means_listing_every_time(root, listings, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))  # no folder can be made under a file
    first = ImageFolderDataset(root / "train")
    listings.clear()
    second = ImageFolderDataset(root / "train")
    assert under(root, listings) and same_dataset(first, second) and len(second) == 13


def test_an_unreadable_cache_is_rebuilt(root, listings):
    first = ImageFolderDataset(root / "train")
    cache = file_list_cache(root / "train")
    cache.write_bytes(cache.read_bytes()[:50])  # truncated, as by a full disk
    again = ImageFolderDataset(root / "train")
    assert same_dataset(again, first)
    assert torch.load(cache, weights_only=True)["root"] == str(root / "train")  # rewritten
    listings.clear()
    ImageFolderDataset(root / "train")
    assert under(root, listings) == []


def test_a_cache_of_another_folder_is_not_used(root, tmp_path):
    other = tmp_path / "other"
    add_image(other / "cat" / "x.png")
    settle(other)
    ImageFolderDataset(other)
    file_list_cache(other).replace(file_list_cache(root / "train"))  # as a hash collision would
    assert same_dataset(ImageFolderDataset(root / "train"), datasets.ImageFolder(str(root / "train")))


@pytest.mark.parametrize("cache", ["cold", "warm", "unwritable"])
def test_max_classes_and_fraction_give_the_same_result_with_and_without_the_cache(root, tmp_path, monkeypatch,
                                                                                    cache):
    reference = datasets.ImageFolder(str(root / "train"))
    if cache == "warm":
        ImageFolderDataset(root / "train")
    if cache == "unwritable":
        (tmp_path / "a-file").write_text("")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    ds = ImageFolderDataset(root / "train", max_classes=2, fraction=0.5)
    assert ds.classes == ["cat", "dog"]
    cats = [s for s in reference.samples if s[1] == 0][:2]
    dogs = [s for s in reference.samples if s[1] == 1][:2]  # ⌊0.5 · 5⌋ of dog's 5 images
    assert ds.samples == cats + dogs and ds.targets == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="max_classes 4 is larger than the 3 classes"):
        ImageFolderDataset(root / "train", max_classes=4)
