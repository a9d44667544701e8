"""Tests of the "gpu-decode" loader (chapter 19's `build_gpu_decode_loaders`, `TrainConfig(loader="gpu-decode")`) on
the CPU: the workers' draws are the torchvision path's, the device's crop is torchvision's resize, batches are a
function of (seed, epoch, sample), the val view, bad files named, and what the training loop does with them."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torchvision.io import ImageReadMode, decode_jpeg, read_file
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from convit_edu.augment import DeviceTransforms, augmentation, build_mixup, build_transforms
from convit_edu.config import TrainConfig
from convit_edu.datasets import build_datasets
from convit_edu.evaluation import evaluate
from convit_edu.gpu_decode import DeviceRecipe, JpegFiles, build_gpu_decode_loaders, resized_crops
from convit_edu.samplers import SeededSamples

pytestmark = [pytest.mark.usefixtures("one_thread"),  # torchvision 0.29 warns at each decode: TorchCodec is next
              pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")]
CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS = 3, 8, 5


def write_jpeg(path: Path, seed: int, mode: str = "RGB") -> None:
    """A textured JPEG of its own size (never square: a swapped height and width would show)."""
    rng = np.random.default_rng(seed)
    h, w = 24 + 6 * (seed % 5), 30 + 4 * (seed % 7)
    ramp = np.linspace(0, 200, w)[None, :, None] + np.linspace(0, 50, h)[:, None, None]
    pixels = np.clip(ramp + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).convert(mode).save(path, "JPEG", quality=90)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An ImageNet-style tree of JPEGs of varied sizes; one greyscale and one CMYK file in train/c1."""
    for split, n in (("train", TRAIN_PER_CLASS), ("val", VAL_PER_CLASS)):
        for c in range(CLASSES):
            (tmp_path / split / f"c{c}").mkdir(parents=True)
            for i in range(n):
                mode = {(1, 2): "L", (1, 3): "CMYK"}.get((c, i), "RGB") if split == "train" else "RGB"
                write_jpeg(tmp_path / split / f"c{c}" / f"{i}.jpg", seed=100 * c + i + 50 * (split == "val"), mode=mode)
    return tmp_path


def loaders(folder: Path, aug, batch_size: int = 4, workers: int = 0, **kwargs):
    train_set, val_set, _ = build_datasets("imagefolder", folder)
    return build_gpu_decode_loaders(train_set, val_set, aug, batch_size=batch_size, num_workers=workers, device="cpu",
                                    **kwargs)


def decoded(path: str) -> torch.Tensor:
    return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)


def take(batches, n: int) -> list:
    return [next(batches) for _ in range(n)]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))


# ------------------------------------------------------------------------------------------ the draws and the views


@pytest.mark.parametrize("changes", [{}, {"randaugment_prob": 1.0, "hflip": 0.9}, {"hflip": 0.0, "scale": (0.5, 0.9)},
                                     {"randaugment_magnitude": None, "ratio": (0.5, 2.0)}])
def test_batches_are_torchvisions_train_transform_of_each_file_under_its_samples_seed(folder, changes):
    """With nearest resizing nothing rounds differently, so crop box, flip, RandAugment ops and signs must all be the
    draws torchvision's own train transform makes under the seed ``SeededSamples`` gives the sample."""
    aug = augmentation("deit", 16, interpolation="nearest", **changes)
    gpu = loaders(folder, aug, seed=3)
    reference = build_datasets("imagefolder", folder, train_transform=build_transforms(aug, on_device=True)[0])[0]
    reference.loader = decoded  # the same pixels as decode_jpeg's (PIL's are too), as a tensor
    for epoch in (0, 4):
        batches = take(gpu.epoch(epoch), 3)
        keys = list(gpu.sampler)[:12]
        expected = [SeededSamples(reference, seed=3)[key] for key in keys]
        assert torch.equal(torch.cat([x for x, _ in batches]), torch.stack([x for x, _ in expected]))
        assert torch.cat([y for _, y in batches]).tolist() == [y for _, y in expected]


def test_crop_boxes_follow_random_resized_crops_rule():
    """Boxes lie in the image with an area share in ``scale`` and w/h in ``ratio`` (but for rounding and the centred
    fallback), and are torchvision's ``RandomResizedCrop``'s for the image's (height, width), fallback included."""
    aug = augmentation("deit", 16, scale=(0.2, 0.6), ratio=(0.5, 1.5))
    recipe = DeviceRecipe(aug)
    torch.manual_seed(0)
    boxes = torch.stack([recipe.draw(Image.new("RGB", (300, 100)))["box"] for _ in range(300)]).double()
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 100).all() and (left + w <= 300).all()
    assert (h * w / 30000).min() > 0.19 and (h * w / 30000).max() < 0.61
    assert (w / h).min() > 0.45 and (w / h).max() < 1.6
    crop = v2.RandomResizedCrop(16, scale=(0.2, 0.6), ratio=(0.5, 1.5))
    for height, width in ((100, 300), (10, 1000), (900, 12), (64, 64)):  # the last three: mostly the fallback
        for seed in range(10):
            torch.manual_seed(seed)
            ours = recipe.draw(Image.new("RGB", (width, height)))["box"].tolist()
            torch.manual_seed(seed)
            theirs = crop.make_params([torch.empty(3, height, width)])
            assert ours == [theirs["top"], theirs["left"], theirs["height"], theirs["width"]]


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_device_crop_is_torchvisions_resized_crop_of_the_float_image(folder, mode):
    """Exactly what torchvision computes on a GPU (float); within rounding of its CPU uint8 kernel (PIL's)."""
    images = [decoded(str(p)) for p in sorted((folder / "train").glob("c0/*.jpg"))]
    torch.manual_seed(0)
    crop = v2.RandomResizedCrop(20)
    boxes = [crop.make_params([image]) for image in images]
    boxes = torch.tensor([[b["top"], b["left"], b["height"], b["width"]] for b in boxes])
    ours = resized_crops(images, boxes, 20, mode)
    kw = dict(interpolation=v2.InterpolationMode(mode), antialias=True)
    on_floats = torch.stack([TF.resized_crop(x.float(), *b, [20, 20], **kw) for x, b in zip(images, boxes.tolist())])
    assert torch.equal(ours, on_floats.clamp(0, 255).round().to(torch.uint8))
    on_uint8 = torch.stack([TF.resized_crop(x, *b, [20, 20], **kw) for x, b in zip(images, boxes.tolist())])
    assert (ours.float() - on_uint8).abs().mean() < 0.5


def test_the_device_part_reads_nothing_back_from_the_device(folder):
    """On the meta device a tensor has no values: a host read (.item(), .tolist(), a branch on a value) would raise."""
    recipe = DeviceRecipe(augmentation("deit", 16, randaugment_prob=1.0))
    train_set = build_datasets("imagefolder", folder)[0]
    items = [SeededSamples(JpegFiles(train_set.samples, recipe), 0)[(0, i, i)] for i in range(24)]
    batch = {name: torch.stack([item[name] for item in items]) for name in ("box", "flip", "ops")}
    assert len(set(batch["ops"].flatten().tolist())) > 8  # many ops, grouped
    images = [torch.empty(3, *decoded(p).shape[1:], dtype=torch.uint8, device="meta") for p, _ in train_set.samples]
    out = recipe.train_view(images, batch)
    assert out.device.type == "meta" and out.shape == (24, 3, 16, 16) and out.dtype == torch.uint8


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_on_a_gpu_the_stream_drains_before_each_decode(monkeypatch, device):
    """nvJPEG's hardware decoder writes its outputs before the stream's queued work has read the blocks they reuse
    (the NaN loss of the 2026-11-27 GPU check): on CUDA the current stream is synchronised first, on the CPU not."""
    import convit_edu.gpu_decode as gpu_decode

    events = []

    class Stop(Exception):
        pass

    def fake_decode(files, mode, device):
        events.append(("decode", torch.device(device).type, len(files)))
        raise Stop

    monkeypatch.setattr(gpu_decode, "decode_jpeg", fake_decode)
    class Stream:
        def __init__(self, dev):
            self.dev = dev

        def synchronize(self):
            events.append(("sync", self.dev.type))

    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    batches = gpu_decode.DecodedBatches(loader=None, view=None, device=torch.device(device), samples=[])
    batch = {"data": torch.arange(6, dtype=torch.uint8)[None], "lengths": torch.tensor([[2, 4]]),
             "index": torch.tensor([[0, 1]]), "label": torch.tensor([[0, 1]])}
    with pytest.raises(Stop):
        batches._decoded(batch)
    assert events == ([("sync", "cuda")] if device == "cuda" else []) + [("decode", device, 2)]


# ------------------------------------------------------------------------------------------ positions and resume


def test_batches_are_a_function_of_seed_epoch_and_sample_and_resume_exactly(folder):
    aug = augmentation("deit", 16)
    a, b = loaders(folder, aug, seed=1), loaders(folder, aug, seed=1, workers=1)  # in this process / in a worker
    whole = take(a.epoch(2), 6)
    assert same(whole, take(b.epoch(2), 6))
    assert same(whole[3:], take(a.epoch(2, start=12), 3))  # resumed at this rank's sample 12: batch 3 on
    assert same(whole[5:], take(b.epoch(2, start=20), 1))
    assert not torch.equal(whole[0][0], next(a.epoch(3))[0])
    assert not torch.equal(whole[0][0], next(loaders(folder, aug, seed=2).epoch(2))[0])
    with pytest.raises(StopIteration):
        next(a.epoch(2, start=24))


def test_ranks_share_the_stream_and_val_has_each_file_once(folder):
    aug = augmentation("deit", 16, randaugment_magnitude=None)
    ranks = [loaders(folder, aug, batch_size=3, num_replicas=2, rank=r, repeats=3) for r in range(2)]
    assert [len(r.sampler) for r in ranks] == [12, 12]
    keys = [list(r.sampler) for r in ranks]
    assert sorted(p for k in keys for _, p, _ in k) == list(range(24))  # every position of the stream, once
    vals = [list(r.val) for r in ranks]
    assert [[len(y) for _, y in v] for v in vals] == [[6, 2], [6, 1]]  # 8 and 7 of the 15 files, batches of 2·3
    val_set = build_datasets("imagefolder", folder)[1]
    for rank, v in enumerate(vals):
        assert torch.cat([y for _, y in v]).tolist() == [t for _, t in val_set.samples[rank::2]]


def test_val_view_is_build_transforms_eval_view(folder):
    aug = augmentation("deit", 16)
    val_set = build_datasets("imagefolder", folder)[1]
    eval_tf = build_transforms(aug, on_device=True)[1]
    images = torch.cat([x for x, _ in loaders(folder, aug).val])
    assert images.dtype == torch.uint8 and images.shape == (15, 3, 16, 16)
    assert torch.equal(images, torch.stack([eval_tf(decoded(p)) for p, _ in val_set.samples]))
    pil = torch.stack([eval_tf(Image.open(p).convert("RGB")) for p, _ in val_set.samples])
    assert (images.float() - pil).abs().max() <= 3


# ------------------------------------------------------------------------------------------ bad input


def test_a_png_file_is_named_with_the_fix(folder):
    bad = folder / "train" / "c0" / "5.png"
    Image.new("RGB", (30, 20)).save(bad)
    with pytest.raises(ValueError, match=rf"{bad}.*PNG.*loader 'torchvision'"):
        take(loaders(folder, augmentation("deit", 16), batch_size=24).epoch(0), 1)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_corrupt_file_is_named(folder, damage):
    bad = folder / "train" / "c2" / "4.jpg"
    bad.write_bytes(b"not an image" if damage == "garbage" else bad.read_bytes()[:300])
    with pytest.raises(ValueError, match=rf"{bad}.*loader 'torchvision'"):  # (in this process: a worker's exception
        take(loaders(folder, augmentation("deit", 16), batch_size=24).epoch(0), 1)  # would leave it alive at exit)


def test_bad_settings_are_refused_early(folder):
    with pytest.raises(ValueError, match="loader 'gpu-decode'.*not 'fake'.*loader 'torchvision'"):
        TrainConfig(loader="gpu-decode")
    with pytest.raises(ValueError, match="loader 'gpu-decode'.*not aug 'pad-crop-flip'"):
        TrainConfig(loader="gpu-decode", data="imagefolder", aug="pad-crop-flip")
    assert TrainConfig(loader="gpu-decode", data="imagefolder", repeats=3).repeats == 3
    with pytest.raises(ValueError, match="crop 'pad'"):
        loaders(folder, augmentation("pad-crop-flip", 16))
    with pytest.raises(ValueError, match="batch_size 32 .* holds 24"):
        loaders(folder, augmentation("deit", 16), batch_size=32)


# ------------------------------------------------------------------------------------------ in the training loop


def test_the_training_loop_finishes_mixes_and_evaluates_its_batches(folder):
    aug = augmentation("deit", 16)
    gpu, finish, mixup = loaders(folder, aug), DeviceTransforms(aug), build_mixup(aug, CLASSES)
    images, labels = next(gpu.epoch(1, start=4))
    images, labels = images.to("cpu"), labels.to("cpu")
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 16, 16) and labels.dtype == torch.int64
    mixed, targets = mixup(finish.train(images), labels)
    assert mixed.dtype == torch.float32 and targets.shape == (4, CLASSES)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, CLASSES))
    scores = evaluate({"model": model}, gpu.val, finish=finish)
    assert set(scores["model"]) == {"loss", "top1", "top5"} and 0 <= scores["model"]["top1"] <= 100
    assert evaluate(model, gpu.val, finish=finish) == scores["model"]  # the val batches can be read again


def test_train_with_loader_gpu_decode_evaluates_and_resumes_mid_epoch_to_identical_weights(folder, tmp_path):
    from dataclasses import replace

    from convit_edu.run_state import Callback, read_checkpoint
    from convit_edu.training import train

    class StopAtStep(Callback):
        def on_step_end(self, state):
            state.stop = state.epoch == 1 and state.step == 2

    cfg = TrainConfig(model="deit_tiny", model_args={"patch_size": 4, "embed_dim": 16, "depth": 1, "num_heads": 2},
                      img_size=16, data="imagefolder", data_root=str(folder), loader="gpu-decode", aug="deit",
                      epochs=2, batch_size=4, warmup_epochs=0.5, num_workers=1, precision="fp32", device="cpu",
                      progress="none", output=str(tmp_path / "straight"))
    straight = train(cfg)
    assert len(straight.history) == 2 and 0 <= straight.history[-1]["val_top1"] <= 100
    stopped = replace(cfg, output=str(tmp_path / "stopped"))
    assert train(stopped, callbacks=[StopAtStep()]).stopped == "callback"
    assert read_checkpoint(tmp_path / "stopped" / "last.pt")["step"] == 2
    resumed = train(replace(stopped, resume="auto"))
    torch.testing.assert_close(resumed.model.state_dict(), straight.model.state_dict(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="loader 'gpu-decode' reads the config's own image folder"):
        train(cfg, datasets=build_datasets("imagefolder", folder))
