"""Tests of the optional NVIDIA DALI loader (chapter 18's `DaliLoaders`, `TrainConfig(loader="dali")`), on the CPU.

They need the extra (`pip install -e ".[dali]"`) and skip without it, except the checks of the config, which
hold either way.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from training_checks import StopAt, assert_same_weights

from convit_edu import augment, dali, datasets, run_state
from convit_edu.augment import DeviceTransforms
from convit_edu.config import TrainConfig
from convit_edu.loader_registry import LOADERS
from convit_edu.training import train

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSES, PER_CLASS = 3, 8


def shade(c: int, i: int) -> int:
    """The red level of image i of class c: every image of the folder its own solid colour."""
    return 20 + 24 * i + 4 * c


@pytest.fixture
def folder(tmp_path) -> Path:
    """An ImageFolder of solid-colour JPEGs of varied sizes: a crop, a resize or a flip keeps an image's colour,
    so a batch says which files it holds."""
    for split in ("train", "val"):
        for c in range(CLASSES):
            (tmp_path / split / f"c{c}").mkdir(parents=True)
            for i in range(PER_CLASS):
                pixels = np.full((20 + 2 * i, 24, 3), (shade(c, i), 100, 50), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / f"c{c}" / f"{i}.jpg", quality=95)
    return tmp_path


def plain(img_size: int = 8) -> augment.AugConfig:
    """Crop and flip only: colours stay as they are."""
    return augment.augmentation("deit", img_size, randaugment_magnitude=None)


def seen(batches) -> list[tuple[int, int]]:
    """(red level, label) of each image of some batches."""
    return [(round(float(x[0].float().mean())), int(y)) for images, labels in batches for x, y in zip(images, labels)]


def expected(keep: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return sorted((shade(c, i), c) for c, i in keep)


def loaders(folder, fraction=1.0, classes=None, batch_size=4, **kwargs) -> dali.DaliLoaders:
    train_set, val_set, _ = datasets.build_datasets("imagefolder", folder, fraction=fraction, max_classes=classes)
    return dali.DaliLoaders(train_set, val_set, kwargs.pop("cfg", plain()), batch_size=batch_size, **kwargs)


def take(it, n: int) -> list:
    return [next(it) for _ in range(n)]


def test_dali_batches_are_uint8_chw_with_the_labels_of_their_files(folder):
    pytest.importorskip("nvidia.dali")
    images, labels = next(loaders(folder, cfg=augment.augmentation("deit", 16)).epoch(0))
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 16, 16)
    assert labels.dtype == torch.int64 and labels.shape == (4,)
    finish = DeviceTransforms(augment.augmentation("deit", 16))
    assert finish.train(images).shape == (4, 3, 16, 16)
    for (red, label) in seen([next(loaders(folder).epoch(0))]):
        assert (red - 20 - 4 * label) % 24 in (0, 1, 23)  # the image's colour belongs to its label's class


def test_dali_training_pipeline_keeps_dalis_own_deprecation_notices_out_of_the_log(folder, recwarn):
    pytest.importorskip("nvidia.dali")
    next(loaders(folder, cfg=augment.augmentation("deit", 16)).epoch(0))  # RandAugment on
    assert not [w for w in recwarn if "nvidia.dali.fn.experimental" in str(w.message)]


def test_dali_reads_the_subset_the_torchvision_path_reads(folder):
    pytest.importorskip("nvidia.dali")
    keep = [(c, i) for c in range(2) for i in range(PER_CLASS // 2)]  # classes 2, fraction 0.5: 8 files
    one_pass = take(loaders(folder, fraction=0.5, classes=2).epoch(0), 2)
    got = seen(one_pass)
    assert sorted((round(r / 4) * 4, y) for r, y in got) == expected(keep)  # each kept file once (JPEG: ±1 level)
    val = seen(loaders(folder, classes=2).val)
    assert sorted((round(r / 4) * 4, y) for r, y in val) == expected([(c, i) for c in range(2) for i in range(8)])


def test_dali_shards_split_each_pass_between_processes(folder):
    pytest.importorskip("nvidia.dali")
    per_rank = [seen(take(loaders(folder, num_replicas=2, rank=r).epoch(0), 3)) for r in range(2)]
    assert sorted((round(r / 4) * 4, y) for s in per_rank for r, y in s) == expected(
        [(c, i) for c in range(CLASSES) for i in range(PER_CLASS)])  # 24 files: 12 per rank, disjoint
    vals = [seen(loaders(folder, num_replicas=2, rank=r).val) for r in range(2)]
    assert len(vals[0]) == len(vals[1]) == 12 and not set(vals[0]) & set(vals[1])


def test_dali_augmentation_follows_the_seed(folder):
    pytest.importorskip("nvidia.dali")
    cfg = augment.augmentation("deit", 16)

    def first(seed):
        return take(loaders(folder, cfg=cfg, seed=seed).epoch(0), 2)

    a, b, c = first(0), first(0), first(1)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert not torch.equal(a[0][0], c[0][0])


def test_dali_pipeline_goes_on_from_its_checkpoint_exactly(folder):
    pytest.importorskip("nvidia.dali")
    cfg = augment.augmentation("deit", 16)
    whole = loaders(folder, cfg=cfg)
    it = whole.epoch(0)
    take(it, 5)  # past the end of the first pass of 24 files
    state = whole.state()
    rest = take(it, 4)
    resumed = loaders(folder, cfg=cfg)
    resumed.restore(state)
    again = take(resumed.epoch(1), 4)
    assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(rest, again))


def dali_config(folder, output, **changes) -> TrainConfig:
    base = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 48, "depth": 2,
                       "local_up_to_layer": 1}, data="imagefolder", data_root=str(folder), loader="dali",
                       epochs=2, batch_size=4, ema_decay=0.9, precision="fp32", device="cpu", num_workers=1,
                       progress="none", warmup_epochs=0.5, output=str(output))
    return replace(base, **changes)


@pytest.mark.parametrize("stop_epoch, stop_step", [(0, 6), (1, 3)], ids=["after epoch 1", "mid-epoch 2"])
def test_dali_training_resumed_gives_weights_identical_to_an_uninterrupted_run(folder, tmp_path, stop_epoch,
                                                                               stop_step):
    """2 epochs of 6 steps straight, or stopped (a stop signal's path) and resumed: bit-identical weights."""
    pytest.importorskip("nvidia.dali")
    straight = train(dali_config(folder, tmp_path / "a"))
    stopped = train(dali_config(folder, tmp_path / "b"), callbacks=[StopAt(stop_epoch, stop_step)])
    assert stopped.stopped == "callback"
    resumed = train(dali_config(folder, tmp_path / "b", resume="auto"))
    assert_same_weights(straight.model, resumed.model)
    assert [r["val_top1"] for r in straight.history] == [r["val_top1"] for r in resumed.history]


def test_dali_config_is_refused_early_with_the_reason(folder, monkeypatch):
    with pytest.raises(ValueError, match="unknown loader 'nvidia'"):
        TrainConfig(loader="nvidia")
    with pytest.raises(ValueError, match="needs data 'imagefolder', not 'fake'"):
        TrainConfig(loader="dali")
    with pytest.raises(ValueError, match="repeats 3"):
        TrainConfig(loader="dali", data="imagefolder", repeats=3)
    with pytest.raises(ValueError, match="not aug 'pad-crop-flip'"):
        TrainConfig(loader="dali", data="imagefolder", aug="pad-crop-flip")
    monkeypatch.setitem(LOADERS, "dali", replace(LOADERS["dali"], needs="nvidia.no_such_module"))
    with pytest.raises(ImportError, match=r'needs nvidia.no_such_module, which is not installed: pip install -e "\.\[dali\]"'):
        TrainConfig(loader="dali", data="imagefolder")


def test_the_command_line_trains_with_loader_dali(folder, tmp_path):
    pytest.importorskip("nvidia.dali")
    from convit_edu.cli import main

    out = tmp_path / "run"
    assert main(["train", "--model", "convit_tiny", "--img-size", "16", "--patch-size", "4", "--embed-dim", "48",
                 "--depth", "2", "--local-up-to-layer", "1", "--data", "imagefolder", "--data-root", str(folder), "--loader", "dali",
                 "--epochs", "1", "--batch-size", "4", "--num-workers", "1", "--device", "cpu", "--precision",
                 "fp32", "--progress", "none", "--output", str(out)]) == 0
    assert run_state.read_checkpoint(out / "last.pt")["config"]["loader"] == "dali"


def test_the_imagenet_preset_trains_with_loader_dali_without_repeats(folder, tmp_path, capsys):
    pytest.importorskip("nvidia.dali")
    from convit_edu.cli import main

    out = tmp_path / "run"
    assert main(["train", "--preset", "imagenet", "--loader", "dali", "--model", "convit_tiny", "--img-size", "16",
                 "--patch-size", "4", "--embed-dim", "48", "--depth", "2", "--local-up-to-layer", "1",
                 "--data-root", str(folder), "--epochs", "1", "--global-batch", "4", "--num-workers", "1",
                 "--device", "cpu", "--precision", "fp32", "--progress", "none", "--output", str(out)]) == 0
    assert "note: loader dali has no repeated augmentation: the preset's repeats 3 becomes 1" in capsys.readouterr().out
    assert run_state.read_checkpoint(out / "last.pt")["config"]["repeats"] == 1
