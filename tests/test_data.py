"""Tests for the data chapters 13-17 (convit_edu.image_files, datasets, augment, samplers, loaders): datasets,
subsampling, the DeiT recipe, samplers, loaders."""

import hashlib
import math
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import datasets

from convit_edu.augment import AUGMENTATIONS, AugConfig, MixupCutmix, build_mixup, build_transforms
from convit_edu.benchmarks import LoaderBenchmark, benchmark_loader, plot_loader_benchmarks
from convit_edu.datasets import build_datasets, scaled_epochs, subsample_per_class
from convit_edu.loaders import build_loader, build_loaders
from convit_edu.samplers import JoinedBatches, KeyedSampler, RepeatAugSampler, SplitBatches

CLASSES = ["cat", "dog", "eel"]
TRAIN_PER_CLASS, VAL_PER_CLASS = 6, 2


def write_jpeg(path: Path, seed: int, mode: str = "RGB", size: int = 20) -> None:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "L": 1, "CMYK": 4}[mode]
    pixels = rng.integers(0, 256, (size, size + 4, channels), dtype=np.uint8)
    Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode).save(path, "JPEG")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An ImageNet-style tree of small JPEGs; cat/img_01 is greyscale, dog/img_02 is CMYK."""
    for split, n in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        for c, name in enumerate(CLASSES):
            (tmp_path / split / name).mkdir(parents=True)
            for k in range(n):
                mode = "L" if (name, k) == ("cat", 1) else "CMYK" if (name, k) == ("dog", 2) else "RGB"
                write_jpeg(tmp_path / split / name / f"img_{k:02d}.jpg", seed=100 * c + k, mode=mode)
    return tmp_path


# ------------------------------------------------------------------------------------------ image folders


def test_imagefolder_reads_greyscale_and_cmyk_jpegs_as_rgb(folder):
    train, val, names = build_datasets("imagefolder", folder)
    assert names == CLASSES and len(train) == 3 * TRAIN_PER_CLASS and len(val) == 3 * VAL_PER_CLASS
    with Image.open(folder / "train" / "cat" / "img_01.jpg") as im:
        assert im.mode == "L"
    with Image.open(folder / "train" / "dog" / "img_02.jpg") as im:
        assert im.mode == "CMYK"
    for i in range(len(train)):
        image, label = train[i]
        assert image.mode == "RGB" and image.size == (24, 20)
        assert label == train.samples[i][1] == CLASSES.index(Path(train.samples[i][0]).parent.name)


def test_fraction_keeps_the_first_files_of_each_class_in_sorted_order(folder):
    for fraction, per_class in ((1 / 6, 1), (0.5, 3), (0.99, 5), (1.0, 6)):
        train, val, _ = build_datasets("imagefolder", folder, fraction=fraction)
        names = [(Path(p).parent.name, Path(p).name) for p, _ in train.samples]
        assert names == [(c, f"img_{k:02d}.jpg") for c in CLASSES for k in range(per_class)], fraction
        assert len(val) == 3 * VAL_PER_CLASS  # validation is never subsampled
    again, _, _ = build_datasets("imagefolder", folder, fraction=0.5)
    assert again.samples == build_datasets("imagefolder", folder, fraction=0.5)[0].samples


def test_subsample_per_class_counts_and_order():
    targets = [i % 4 for i in range(400)]  # 100 per class, interleaved
    for f in (0.05, 0.1, 0.29, 0.3, 0.5, 1.0):
        keep = subsample_per_class(targets, f)
        assert keep == sorted(keep)
        for c in range(4):
            mine = [i for i in keep if targets[i] == c]
            assert mine == [i for i in range(400) if targets[i] == c][: math.floor(round(f * 100, 6))]


def test_scaled_epochs_multiplies_by_one_over_f():
    assert [scaled_epochs(300, f) for f in (0.05, 0.1, 0.3, 0.5, 1)] == [6000, 3000, 1000, 600, 300]


def test_max_classes_keeps_the_first_k_sorted_classes_in_both_splits(folder):
    train, val, names = build_datasets("imagefolder", folder, max_classes=2, fraction=0.5)
    assert names == CLASSES[:2] and train.classes == val.classes == CLASSES[:2]
    assert sorted(set(train.targets)) == sorted(set(val.targets)) == [0, 1]
    assert len(train) == 2 * 3 and len(val) == 2 * VAL_PER_CLASS


@pytest.mark.parametrize("fraction", [0, -0.1, 1.5, float("nan")])
def test_fraction_outside_zero_one_is_an_error_naming_it(folder, fraction):
    with pytest.raises(ValueError, match=rf"fraction {fraction!r} is outside \(0, 1\]"):
        build_datasets("imagefolder", folder, fraction=fraction)


def test_fraction_that_empties_a_class_is_an_error(folder):
    with pytest.raises(ValueError, match=r"fraction 0.1 keeps none of the 6 images of class 0; use fraction >= 0.1667"):
        build_datasets("imagefolder", folder, fraction=0.1)


def test_max_classes_larger_than_the_number_of_classes_is_an_error(folder):
    with pytest.raises(ValueError, match="max_classes 5 is larger than the 3 classes"):
        build_datasets("imagefolder", folder, max_classes=5)
    with pytest.raises(ValueError, match="max_classes must be at least 1, got 0"):
        build_datasets("imagefolder", folder, max_classes=0)


def test_missing_or_empty_dataset_folder_explains_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no train/ and val/ folders \(folder missing\).*ROOT/train/<class>"):
        build_datasets("imagefolder", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"found \[\].*data/README.md"):
        build_datasets("imagefolder", tmp_path)
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    with pytest.raises(FileNotFoundError, match="no class folders in .*train: expected"):
        build_datasets("imagefolder", tmp_path)


def test_class_folder_without_images_is_an_error_naming_it(folder):
    (folder / "train" / "fox").mkdir()
    (folder / "train" / "fox" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match=r"class folder\(s\) with no images in .*train: fox"):
        build_datasets("imagefolder", folder)


def test_train_and_val_with_different_classes_is_an_error(folder):
    (folder / "val" / "eel").rename(folder / "val" / "emu")
    with pytest.raises(ValueError, match=r"only in train \['eel'\], only in val \['emu'\]"):
        build_datasets("imagefolder", folder)


def test_truncated_image_is_skipped_with_a_warning_naming_the_file(folder):
    bad = folder / "train" / "cat" / "img_03.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated JPEG
    (folder / "train" / "cat" / "img_04.jpg").write_bytes(b"not a jpeg at all")
    train, _, _ = build_datasets("imagefolder", folder)
    index = [Path(p).name for p, _ in train.samples].index("img_03.jpg")
    with pytest.warns(UserWarning) as record:
        image, label = train[index]
    messages = [str(w.message) for w in record]
    assert any("img_03.jpg" in m for m in messages) and any("img_04.jpg" in m for m in messages)
    expected, _ = train[index + 2]  # the next readable file, img_05
    assert label == 0 and np.array_equal(np.asarray(image), np.asarray(expected))
    train.transform = build_transforms(AugConfig(img_size=16))[1]
    loader = build_loader(train, 4, None, num_workers=0, seed=0, drop_last=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sum(len(y) for _, y in loader) == len(train)  # a whole epoch, no crash


def test_unknown_name_or_keywords_are_errors(folder):
    with pytest.raises(ValueError, match="unknown dataset 'imagenet': choose one of cifar100, imagefolder, fake"):
        build_datasets("imagenet", folder)
    with pytest.raises(TypeError, match="unexpected keyword.*num_train"):
        build_datasets("imagefolder", folder, num_train=3)


# ------------------------------------------------------------------------------------------ CIFAR-100


def write_cifar100(root: Path, n_train_per_class: int = 4, n_test_per_class: int = 2, num_classes: int = 100):
    """An archive in the CIFAR-100 python pickle format (class-interleaved, as the real one is shuffled).

    The real files are Python 2 pickles whose keys torchvision reads with ``encoding="latin1"`` as ``str``
    ("data", "fine_labels", "fine_label_names"); a Python 3 pickle with ``str`` keys reads the same way.
    """
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", n_train_per_class), ("test", n_test_per_class)):
        labels = [c for _ in range(n) for c in range(num_classes)]
        data = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
        arrays[split] = (data, labels)
        with open(folder / split, "wb") as f:
            pickle.dump({"data": data, "fine_labels": labels, "coarse_labels": [0] * len(labels)}, f)
    names = [f"fine_{c:02d}" for c in range(num_classes)]
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": names, "coarse_label_names": ["x"]}, f)
    return arrays, names


@pytest.fixture
def cifar_root(tmp_path, monkeypatch):
    """A test archive read through torchvision's real CIFAR100 code, integrity check included: the expected
    md5 sums (class attributes) are set to those of the files written here, everything else is unchanged."""
    arrays, names = write_cifar100(tmp_path)
    md5 = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in (tmp_path / "cifar-100-python").iterdir()}
    monkeypatch.setattr(datasets.CIFAR100, "train_list", [["train", md5["train"]]])
    monkeypatch.setattr(datasets.CIFAR100, "test_list", [["test", md5["test"]]])
    monkeypatch.setattr(datasets.CIFAR100, "meta", {**datasets.CIFAR100.meta, "md5": md5["meta"]})
    return tmp_path, arrays, names


def test_cifar100_reads_the_pickle_archive_through_torchvision(cifar_root):
    root, arrays, names = cifar_root
    train, val, class_names = build_datasets("cifar100", root, download=False)
    assert class_names == names and len(train) == 400 and len(val) == 200
    image, label = train[7]
    pixels = arrays["train"][0][7].reshape(3, 32, 32).transpose(1, 2, 0)
    assert label == 7 and image.mode == "RGB" and np.array_equal(np.asarray(image), pixels)


def test_cifar100_fraction_and_max_classes(cifar_root):
    root, arrays, names = cifar_root
    train, val, class_names = build_datasets("cifar100", root, download=False, fraction=0.5, max_classes=10)
    assert class_names == names[:10] and len(train) == 10 * 2 and len(val) == 10 * 2
    expected = [i for i, t in enumerate(arrays["train"][1]) if t < 10][:20]  # class-interleaved: first 2 of each
    assert np.array_equal(train.data, arrays["train"][0][expected].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    assert train.targets == [arrays["train"][1][i] for i in expected]
    assert sorted(set(val.targets)) == list(range(10))


def test_cifar100_missing_or_corrupt_says_how_to_download(cifar_root, tmp_path_factory):
    with pytest.raises(FileNotFoundError, match=r"CIFAR-100 not found .*download=True"):
        build_datasets("cifar100", tmp_path_factory.mktemp("empty"), download=False)
    root, _, _ = cifar_root
    (root / "cifar-100-python" / "test").write_bytes(b"corrupt")
    with pytest.raises(FileNotFoundError, match="checksums do not match"):
        build_datasets("cifar100", root, download=False)


# ------------------------------------------------------------------------------------------ synthetic data


def test_fake_images_are_reproducible_and_learnable():
    train, val, names = build_datasets("fake", num_train=200, num_val=50, num_classes=5, image_size=16, seed=3)
    assert names == [f"class_{c:03d}" for c in range(5)] and (len(train), len(val)) == (200, 50)
    again, _, _ = build_datasets("fake", num_train=200, num_val=50, num_classes=5, image_size=16, seed=3)
    assert np.array_equal(np.asarray(train[17][0]), np.asarray(again[17][0]))
    assert not np.array_equal(np.asarray(train[17][0]), np.asarray(val[17][0]))
    to_array = lambda ds: (np.stack([np.asarray(ds[i][0], dtype=np.float32) for i in range(len(ds))]),
                           np.array(ds.targets))
    x, y = to_array(train)
    means = np.stack([x[y == c].mean(0) for c in range(5)])
    xv, yv = to_array(val)
    predicted = ((xv[:, None] - means[None]) ** 2).sum((2, 3, 4)).argmin(1)
    assert (predicted == yv).mean() >= 0.9  # a nearest-class-mean classifier separates the classes


def test_fake_fraction_and_max_classes():
    train, val, names = build_datasets("fake", num_train=100, num_val=40, num_classes=10, max_classes=4,
                                       fraction=0.3)
    assert names == [f"class_{c:03d}" for c in range(4)]
    assert [train.targets.count(c) for c in range(4)] == [3, 3, 3, 3]
    assert [val.targets.count(c) for c in range(4)] == [4, 4, 4, 4]
    with pytest.raises(TypeError, match="unexpected keyword.*colour"):
        build_datasets("fake", colour=True)


# ------------------------------------------------------------------------------------------ transforms


@pytest.mark.parametrize("name,size", [("deit", 224), ("pad-crop-flip", 32)])
def test_augmentations_give_normalised_tensors_of_their_size(name, size):
    train_tf, val_tf = build_transforms(AUGMENTATIONS[name])
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    torch.manual_seed(0)
    for tf in (train_tf, val_tf):
        x = tf(image)
        assert x.shape == (3, size, size) and x.dtype == torch.float32
    assert torch.equal(val_tf(image), val_tf(image))  # evaluation is deterministic


def test_imagenet_recipe_has_deit_values():
    train_tf, val_tf = build_transforms(AUGMENTATIONS["deit"])
    steps = {type(t).__name__: t for t in train_tf.transforms}
    rrc = steps["RandomResizedCrop"]
    assert rrc.size == (224, 224) and rrc.scale == (0.08, 1.0) and rrc.interpolation.value == "bicubic"
    assert steps["RandomHorizontalFlip"].p == 0.5
    rand_augment = [t for t in train_tf.transforms if type(t).__name__ == "RandomApply"]
    assert len(rand_augment) == 2 and all(t.p == 0.5 for t in rand_augment)  # "n2", each op with p = 0.5
    op = rand_augment[0].transforms[0]
    assert (op.num_ops, op.magnitude, op.num_magnitude_bins, op.interpolation.value) == (1, 9, 11, "bilinear")
    assert steps["RandomErasing"].p == 0.25 and steps["RandomErasing"].value is None  # None: per-pixel random
    assert list(steps) == ["RandomResizedCrop", "RandomHorizontalFlip", "RandomApply", "ToImage", "ToDtype",
                           "Normalize", "RandomErasing"]
    resize, crop = val_tf.transforms[:2]
    assert resize.size == [256] and crop.size == (224, 224)
    cfg = AUGMENTATIONS["deit"]
    assert (cfg.mixup_alpha, cfg.cutmix_alpha, cfg.cutmix_prob, cfg.label_smoothing) == (0.8, 1.0, 0.5, 0.1)


def bar_angle(image: torch.Tensor) -> float:
    """The angle in degrees (0 = horizontal, sign dropped) of the bright bar in a uint8 image (C, H, W)."""
    rows, cols = torch.nonzero(image[0] > 200, as_tuple=True)
    y, x = rows.double() - rows.double().mean(), cols.double() - cols.double().mean()
    return abs(math.degrees(0.5 * math.atan2(2 * (x * y).mean(), (x * x).mean() - (y * y).mean())))


def test_deit_randaugment_rotates_as_far_as_deit_27_degrees():
    """DeiT's "rand-m9": magnitude 9 of timm's 10 levels, 9/10 of the 30-degree maximum (31 bins gave 9 degrees)."""
    from torchvision.transforms import v2

    train_tf, _ = build_transforms(AUGMENTATIONS["deit"])
    op = next(t for t in train_tf.transforms if type(t).__name__ == "RandomApply").transforms[0]
    op._AUGMENTATION_SPACE = {"Rotate": v2.RandAugment._AUGMENTATION_SPACE["Rotate"]}  # only the rotation
    image = torch.zeros(3, 96, 96, dtype=torch.uint8)
    image[:, 46:50, 12:84] = 255  # a horizontal bar through the centre
    assert bar_angle(image) == 0.0
    torch.manual_seed(0)
    angles = [bar_angle(op(image)) for _ in range(4)]
    assert all(abs(angle - 0.9 * 30) < 0.5 for angle in angles), angles


def test_eval_transform_is_resize_then_centre_crop():
    from torchvision.transforms.v2 import functional as TF

    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (300, 400, 3), dtype=np.uint8))
    cfg = AugConfig(img_size=64, crop_ratio=0.8)
    _, val_tf = build_transforms(cfg)
    by_hand = TF.center_crop(TF.resize(TF.pil_to_tensor(image), [80], interpolation=TF.InterpolationMode.BICUBIC,
                                       antialias=True), [64])
    expected = (by_hand.float() / 255 - torch.tensor(cfg.mean)[:, None, None]) / torch.tensor(cfg.std)[:, None, None]
    torch.testing.assert_close(val_tf(image), expected, atol=2 / 255 / 0.22, rtol=0)  # PIL vs tensor resize


def test_cifar_32_preset_pads_and_crops():
    train_tf, _ = build_transforms(AUGMENTATIONS["pad-crop-flip"])
    names = [type(t).__name__ for t in train_tf.transforms]
    assert names == ["RandomCrop", "RandomHorizontalFlip", "ToImage", "ToDtype", "Normalize"]
    assert train_tf.transforms[0].padding == [4, 4, 4, 4]
    assert build_mixup(AUGMENTATIONS["pad-crop-flip"], 100) is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(img_size=0), "img_size must be at least 1, got 0"),
    (dict(erasing=1.5), "erasing 1.5 is a probability"),
    (dict(crop="centre"), "crop 'centre' must be"),
    (dict(crop_ratio=0), r"crop_ratio 0 must lie in \(0, 1\]"),
    (dict(label_smoothing=1.0), r"label_smoothing 1.0 must lie in \[0, 1\)"),
    (dict(randaugment_magnitude=30), r"randaugment_magnitude 30 must lie in 0..10"),
    (dict(randaugment_magnitude=-1), r"randaugment_magnitude must be at least 0, got -1"),
    (dict(randaugment_prob=2.0), "randaugment_prob 2.0 is a probability"),
    (dict(randaugment_ops=-1), "randaugment_ops must be at least 0, got -1"),
])
def test_bad_aug_config_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AugConfig(**kwargs)


# ------------------------------------------------------------------------------------------ MixUp / CutMix


def test_mixup_cutmix_soft_targets_sum_to_one_with_label_smoothing():
    torch.manual_seed(0)
    mix = build_mixup(AUGMENTATIONS["deit"], num_classes=10)
    for _ in range(20):
        images, labels = torch.rand(8, 3, 16, 16), torch.randint(0, 10, (8,))
        mixed, targets = mix(images, labels)
        assert mixed.shape == images.shape and targets.shape == (8, 10)
        torch.testing.assert_close(targets.sum(1), torch.ones(8))
        assert targets.min() >= 0.1 / 10 - 1e-6  # smoothing: every class keeps at least eps / C


def test_mixup_mixes_images_and_targets_with_the_same_lambda():
    torch.manual_seed(1)
    mix = MixupCutmix(num_classes=4, mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.0)
    images, labels = torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    mixed, targets = mix(images, labels)
    lam = targets[0, 0]  # sample 0 is mixed with sample 3 (sample j with B - 1 - j: the batch reversed)
    torch.testing.assert_close(targets[0, 3], 1 - lam)
    torch.testing.assert_close(mixed, lam * images + (1 - lam) * images.flip(0))


def test_soft_targets_match_timm_mixup_target():
    """timm (DeiT's library) as a reference: on/off smoothing values, mixed with the partner's targets; timm's
    partner is ours (the batch reversed), so every row of a batch of six distinct labels agrees."""
    from timm.data.mixup import mixup_target

    torch.manual_seed(4)
    mix = build_mixup(AUGMENTATIONS["deit"], num_classes=7)
    for _ in range(5):
        labels = torch.randperm(7)[:6]
        _, targets = mix(torch.rand(6, 3, 8, 8), labels)
        lam = float((targets[0, labels[0]] - 0.1 / 7) / 0.9)
        torch.testing.assert_close(targets, mixup_target(labels, 7, lam=lam, smoothing=0.1))


def test_cutmix_target_is_the_share_of_pasted_pixels():
    torch.manual_seed(2)
    mix = MixupCutmix(num_classes=4, mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.0)
    images = torch.arange(4.0)[:, None, None, None].expand(4, 3, 16, 16).clone()  # image i is constant i
    for _ in range(10):
        mixed, targets = mix(images, torch.arange(4))
        from_partner = (mixed[1] == 2).float().mean()  # sample 1's partner is sample 2 (the batch reversed)
        torch.testing.assert_close(targets[1, 2], from_partner)


def test_mixup_rejects_bad_labels():
    mix = build_mixup(AUGMENTATIONS["deit"], num_classes=5)
    with pytest.raises(ValueError, match=r"labels must lie in 0..4, got 0..7"):
        mix(torch.rand(2, 3, 4, 4), torch.tensor([0, 7]))


# ------------------------------------------------------------------------------------------ samplers


def epoch_per_rank(n, world, repeats=1, epoch=0, seed=0):
    out = []
    for rank in range(world):
        s = RepeatAugSampler(n, world, rank, repeats=repeats, seed=seed)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [12, 13, 37])
def test_sampler_ranks_are_disjoint_equal_length_and_cover_the_data(n, world):
    ranks = epoch_per_rank(n, world)
    assert {len(r) for r in ranks} == {math.ceil(n / world)}
    seen = [i for r in ranks for i in r]
    assert set(seen) == set(range(n))
    assert len(seen) - n == (-n) % world  # the only overlap: padding to a multiple of the world size
    if n % world == 0:
        assert len(set(seen)) == len(seen)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_repeated_augmentation_sends_copies_to_different_ranks(world):
    n, r = 24, 3
    ranks = epoch_per_rank(n, world, repeats=r)
    assert {len(x) for x in ranks} == {n // world}
    counts = {}
    for x in ranks:
        for i in x:
            counts[i] = counts.get(i, 0) + 1
    assert set(counts.values()) == {r} and len(counts) == n // r  # a third of the data, three times each
    if world >= r:
        assert all(len(set(x)) == len(x) for x in ranks)  # no rank sees the same image twice


def test_global_batches_are_the_same_for_every_world_size():
    n, batch = 48, 12  # global batch 12: one rank x 12, two x 6, three x 4, four x 3
    reference = epoch_per_rank(n, 1, repeats=3, epoch=5)[0]
    for world in (2, 3, 4):
        ranks = epoch_per_rank(n, world, repeats=3, epoch=5)
        per = batch // world
        for step in range(n // batch):
            union = sorted(i for x in ranks for i in x[step * per : (step + 1) * per])
            assert union == sorted(reference[step * batch : (step + 1) * batch])


def test_sampler_reshuffles_per_epoch_and_is_reproducible():
    a, b = epoch_per_rank(50, 2, epoch=0), epoch_per_rank(50, 2, epoch=1)
    assert a != b and a == epoch_per_rank(50, 2, epoch=0)
    assert epoch_per_rank(50, 2, epoch=0, seed=1) != a
    unshuffled = RepeatAugSampler(6, 2, 1, shuffle=False)
    assert list(unshuffled) == [1, 3, 5]


@pytest.mark.parametrize("world,repeats", [(1, 1), (2, 3), (3, 1), (4, 3)])
def test_sampler_resumes_mid_epoch_exactly(world, repeats):
    for rank in range(world):
        full = RepeatAugSampler(41, world, rank, repeats=repeats, seed=7)
        full.set_epoch(3)
        whole = list(full)
        for start in (0, 5, len(whole)):
            resumed = RepeatAugSampler(41, world, rank, repeats=repeats, seed=7)
            resumed.set_epoch(3, start)
            assert list(resumed) == whole[start:] and resumed.remaining == len(whole) - start
            assert len(resumed) == len(whole)


def test_sampler_bad_arguments_are_named():
    with pytest.raises(ValueError, match="rank 2 must lie in 0..1 for num_replicas 2"):
        RepeatAugSampler(10, 2, 2)
    with pytest.raises(ValueError, match="repeats .* must be at least 1, got 0"):
        RepeatAugSampler(10, repeats=0)
    with pytest.raises(ValueError, match="start 6 must lie in 0..5"):
        RepeatAugSampler(10, 2).set_epoch(0, 6)


# ------------------------------------------------------------------------------------------ loaders


def test_loader_with_workers_is_reproducible_from_its_seed():
    train, _, _ = build_datasets("fake", num_train=24, num_val=4, image_size=16,
                                 train_transform=build_transforms(AugConfig(img_size=16))[0])
    def epoch(seed):
        sampler = RepeatAugSampler(len(train), seed=seed)
        loader = build_loader(train, 8, sampler, num_workers=2, seed=seed, drop_last=True)
        assert loader.persistent_workers and loader.prefetch_factor == 4 and len(loader) == 3
        return [(x, y) for x, y in loader]

    a, b, c = epoch(0), epoch(0), epoch(1)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    assert not torch.equal(a[0][0], c[0][0])


def test_benchmark_reports_every_stage_and_restores_the_transform():
    train, _, _ = build_datasets("fake", num_train=32, num_val=4, image_size=16)
    tf, _ = build_transforms(AugConfig(img_size=16))
    result = benchmark_loader(train, tf, batch_size=8, num_batches=3, num_workers=0,
                              mixup=build_mixup(AugConfig(), 10))
    assert all(v > 0 for v in (result.decode, result.augment, result.collate, result.loader))
    assert train.transform is None and "slowest stage" in str(result)


def test_plot_loader_benchmarks_stacks_each_stage_per_image():
    fast = LoaderBenchmark(decode=1000, augment=500, collate=2000, loader=900, num_workers=2, batch_size=64)
    slow = LoaderBenchmark(decode=250, augment=100, collate=1000, loader=200, num_workers=2, batch_size=64)
    ax = plot_loader_benchmarks({"fast": fast, "slow": slow}).axes[0]
    bars = [(round(p.get_x(), 6), round(p.get_width(), 6)) for p in ax.patches]  # decode, augment, collate
    assert bars == [(0, 1), (0, 4), (1, 2), (4, 10), (3, 0.5), (14, 1)]  # milliseconds, stacked
    # the loader's time per image
    assert [round(line.get_xdata()[0], 6) for line in ax.lines] == [round(1000 / 900, 6), 5]


def test_build_loaders_goes_from_datasets_to_batches_for_each_rank(folder):
    train, val, _ = build_datasets("fake", num_train=64, num_val=20, num_classes=4, image_size=32,
                                   train_transform=build_transforms(AUGMENTATIONS["pad-crop-flip"])[0],
                                   val_transform=build_transforms(AUGMENTATIONS["pad-crop-flip"])[1])
    data = build_loaders(train, val, batch_size=16, num_workers=0)
    images, labels = next(iter(data.train))
    assert images.shape == (16, 3, 32, 32) and labels.shape == (16,)
    assert [len(y) for _, y in data.val] == [20]  # twice the train batch: inference keeps no activations
    cfg = AugConfig(img_size=16)
    train, val, _ = build_datasets("imagefolder", folder, train_transform=build_transforms(cfg)[0],
                                   val_transform=build_transforms(cfg)[1])
    ranks = [build_loaders(train, val, batch_size=2, num_workers=0, repeats=3, num_replicas=2, rank=r)
             for r in range(2)]
    assert [len(d.train) for d in ranks] == [4, 4]
    # each val image on one rank, once: no padding, so evaluation's sums are exact
    assert sorted(i for d in ranks for i in d.val.dataset.indices) == list(range(len(val)))
    images, targets = build_mixup(cfg, 3)(*next(iter(ranks[0].train)))
    assert images.shape == (2, 3, 16, 16) and targets.shape == (2, 3)
    with pytest.raises(ValueError, match="3 processes but the training set has only 2 samples"):
        build_loaders(torch.utils.data.TensorDataset(torch.zeros(2)), val, batch_size=1, num_replicas=3)


def test_the_train_loader_seeds_each_sample_by_its_place_in_the_run_not_by_its_worker():
    train, _, _ = build_datasets("fake", num_train=32, num_val=4, image_size=16,
                                 train_transform=build_transforms(AugConfig(img_size=16))[0])

    def first_epoch(workers, seed=0, start=0):
        data = build_loaders(train, train, batch_size=4, num_workers=workers, seed=seed)
        data.sampler.set_epoch(0, start=start)
        return torch.cat([x for x, _ in data.train])

    whole = first_epoch(0)
    assert torch.equal(whole, first_epoch(2)) and not torch.equal(whole, first_epoch(0, seed=1))
    assert torch.equal(whole[8:], first_epoch(2, start=8))  # resumed after two batches: the same images


class WorkerIds(torch.utils.data.Dataset):
    """Image i is filled with i; its label is the loader worker that read it (-1: the main process)."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int):
        info = torch.utils.data.get_worker_info()
        return torch.full((2,), float(i)), -1 if info is None else info.id


def test_an_epoch_of_fewer_batches_than_workers_shares_each_batch_among_them():
    data = build_loaders(WorkerIds(), WorkerIds(), batch_size=16, num_workers=2)  # one batch an epoch
    assert isinstance(data.train, JoinedBatches) and data.train.parts == 2 and len(data.train) == 1
    images, workers = next(iter(data.train))
    assert workers.tolist() == [0] * 8 + [1] * 8  # each worker read half of the batch
    alone = build_loaders(WorkerIds(), WorkerIds(), batch_size=16, num_workers=0)
    assert torch.equal(images, next(iter(alone.train))[0])  # the same images, in the same order
    # val: 20 images, 2 workers: two batches of 10 (not one of 32), in dataset order
    assert [len(y) for _, y in data.val] == [10, 10]
    assert torch.equal(torch.cat([x for x, _ in data.val])[:, 0], torch.arange(20.0))
    # five batches an epoch for two workers: each batch whole
    assert not isinstance(build_loaders(WorkerIds(), WorkerIds(), batch_size=4, num_workers=2).train, JoinedBatches)


def test_split_batches_cut_full_batches_into_pieces_and_joined_batches_rejoin_them():
    batches = torch.utils.data.BatchSampler(range(14), 7, drop_last=True)
    pieces = list(SplitBatches(batches, 3))
    assert pieces == [[0, 1], [2, 3], [4, 5, 6], [7, 8], [9, 10], [11, 12, 13]]
    loader = [[torch.tensor(p), torch.tensor(p) * 10] for p in pieces]
    joined = list(JoinedBatches(loader, 3))
    assert len(joined) == 2 and joined[1][0].tolist() == list(range(7, 14)) and joined[1][1][0] == 70
    with pytest.raises(ValueError, match="parts 8 must be at most the batch size 7"):
        SplitBatches(batches, 8)
    with pytest.raises(ValueError, match="drop_last"):
        SplitBatches(torch.utils.data.BatchSampler(range(14), 7, drop_last=False), 2)


def test_loader_batch_larger_than_a_ranks_share_is_refused(folder):
    cfg = AugConfig(img_size=16)
    train, val, _ = build_datasets("imagefolder", folder, train_transform=build_transforms(cfg)[0])
    with pytest.raises(ValueError, match="batch_size 64 with drop_last=True leaves no batch: .* only 9 samples"):
        build_loaders(train, val, batch_size=64, num_replicas=2)


def test_sample_keys_are_places_in_the_global_stream_whatever_the_number_of_processes():
    def keys(world: int, start: int = 0) -> list[tuple[int, int, int]]:
        out = []
        for rank in range(world):
            sampler = KeyedSampler(RepeatAugSampler(24, world, rank, repeats=3, seed=5))
            sampler.set_epoch(2, start=start // world)
            out += list(sampler)
        return sorted(out)

    assert keys(1) == keys(2) == keys(4)
    assert keys(1, start=12) == keys(2, start=12) == [k for k in keys(1) if k[1] >= 12]


# ------------------------------------------------------------------ uint8 from the workers, finished on the device


def test_on_device_transforms_ship_uint8_and_finish_to_the_float_pipelines_values(folder):
    from convit_edu.augment import DeviceTransforms, augmentation
    from convit_edu.image_files import load_rgb

    cfg = augmentation("deit", 32)
    _, float_val = build_transforms(cfg)
    uint8_train, uint8_val = build_transforms(cfg, on_device=True)
    image = load_rgb(folder / "train" / "cat" / "img_00.jpg")
    shipped = uint8_val(image)
    assert shipped.dtype == torch.uint8 and type(shipped) is torch.Tensor and shipped.shape == (3, 32, 32)
    assert uint8_train(image).dtype == torch.uint8
    finish = DeviceTransforms(cfg)
    assert torch.allclose(finish.eval(shipped[None])[0], float_val(image), atol=1e-5)
    with pytest.raises(ValueError, match="expects uint8 batches"):
        finish.eval(float_val(image)[None])


def test_erasing_boxes_follow_the_probability_and_the_area_range():
    from convit_edu.augment import erasing_boxes

    torch.manual_seed(0)
    masks = erasing_boxes(4000, (40, 60), p=0.5)
    erased = masks.flatten(1).any(1)
    assert abs(erased.float().mean() - 0.5) < 0.03
    areas = masks.flatten(1).sum(1)[erased] / (40 * 60)
    assert areas.min() >= 0.015 and areas.max() <= 0.35  # 2 %..33 %, up to rounding of the sides
    for m in masks[erased][:50]:  # each is one axis-aligned box
        rows, cols = m.any(1).nonzero()[:, 0], m.any(0).nonzero()[:, 0]
        assert m.sum() == len(rows) * len(cols) and rows.max() - rows.min() + 1 == len(rows)
    assert not erasing_boxes(100, (8, 8), p=0.0).any()


def test_device_transforms_erase_with_noise_and_keep_the_rest(folder):
    from convit_edu.augment import DeviceTransforms, augmentation

    cfg = augmentation("deit", 32, erasing=1.0)
    batch = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    finish = DeviceTransforms(cfg)
    torch.manual_seed(1)
    trained = finish.train(batch)
    clean = finish.eval(batch)
    changed = (trained != clean).any(1)  # (B, H, W): where the noise went
    assert changed.flatten(1).any(1).all()  # p = 1: every image has a box
    torch.manual_seed(1)
    assert torch.equal(finish.train(batch), trained)  # the global generator decides: resumable
