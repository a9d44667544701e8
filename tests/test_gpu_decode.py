"""Tests of the "gpu-decode" loader (chapters 19 and 19_side_stream: `build_gpu_decode_loaders`,
`TrainConfig(loader="gpu-decode")`) on the CPU: the workers' draws are the torchvision path's, the device's batched crop
is torchvision's resize within a level, the decode thread's order of drains, waits and records (a stand-in stream
backend), batches a function of (seed, epoch, sample) however far ahead they are decoded, the val view, bad files
named, what the training loop does with them; on a GPU only, nvJPEG's race."""

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
import torch.nn.functional as F
from torch import nn
from torchvision.io import ImageReadMode, decode_jpeg, read_file
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from convit_edu.augment import DeviceTransforms, augmentation, build_mixup, build_transforms
from convit_edu.config import TrainConfig
from convit_edu.datasets import build_datasets
from convit_edu.evaluation import evaluate
import convit_edu.gpu_decode as gpu_decode
from convit_edu.gpu_decode import (DeviceRecipe, JpegFiles, RecordingStreams, build_gpu_decode_loaders, decode_batch,
                                   resized_crops)
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


def per_image_crops(images: list, boxes: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """The crop before it was batched: one ``F.interpolate`` per image (torchvision's resize of floats)."""
    crops = [F.interpolate(image[None, :, top : top + h, left : left + w].float(), size=(size, size), mode=mode,
                           antialias=mode != "nearest") for image, (top, left, h, w) in zip(images, boxes.tolist())]
    return torch.cat(crops).round_().clamp_(0, 255).to(torch.uint8)


@pytest.mark.parametrize("mode", ["bicubic", "bilinear", "nearest"])
@pytest.mark.parametrize("size", [20, 48])  # the test images are 24-48 px: crops shrunk and enlarged
def test_batched_crop_is_torchvisions_resize_of_each_crop_within_a_level(folder, mode, size):
    """Two batched products give what torchvision computes per image on floats (a GPU's path) but for the rounding of
    a few pixels, by one level; nearest exactly; and within rounding of torchvision's CPU uint8 kernel (PIL's)."""
    images = [decoded(str(p)) for p in sorted((folder / "train").glob("c*/*.jpg"))]
    torch.manual_seed(0)
    crop = v2.RandomResizedCrop(size)
    boxes = torch.tensor([[b["top"], b["left"], b["height"], b["width"]] for b in
                          (crop.make_params([image]) for image in images)])
    ours = resized_crops(images, boxes, size, mode)
    apart = (ours.int() - per_image_crops(images, boxes, size, mode).int()).abs()
    assert apart.max() <= (mode != "nearest") and (apart > 0).float().mean() < 2e-3
    kw = dict(interpolation=v2.InterpolationMode(mode), antialias=True)
    on_uint8 = torch.stack([TF.resized_crop(x, *b, [size, size], **kw) for x, b in zip(images, boxes.tolist())])
    assert (ours.float() - on_uint8).abs().mean() < 0.5


def test_crops_of_very_different_sizes_are_resized_in_stacks_that_bound_the_padding(folder, monkeypatch):
    """A stack holds at most CROP_FLOATS floats (a single crop larger than that alone), smallest crops first; the
    crops come back in their order, the numbers those of one stack (within a level: the products have other shapes)."""
    images = [decoded(str(p)) for p in sorted((folder / "train").glob("c*/*.jpg"))]
    torch.manual_seed(0)
    crop = v2.RandomResizedCrop(20, scale=(0.05, 1.0))
    boxes = torch.tensor([[b["top"], b["left"], b["height"], b["width"]] for b in
                          (crop.make_params([image]) for image in images)])
    one_stack, stacks, padded_crops = resized_crops(images, boxes, 20, "bicubic"), [], gpu_decode._padded_crops

    def counted(group, group_boxes, *args):
        stacks.append((len(group), 3 * int(group_boxes[:, 2].max()) * int(group_boxes[:, 3].max()),
                       (group_boxes[:, 2] * group_boxes[:, 3]).tolist()))
        return padded_crops(group, group_boxes, *args)

    monkeypatch.setattr(gpu_decode, "_padded_crops", counted)
    monkeypatch.setattr(gpu_decode, "CROP_FLOATS", 3 * 20 * 20 * 4)
    in_stacks = resized_crops(images, boxes, 20, "bicubic")
    assert len(stacks) > 2 and sum(n for n, _, _ in stacks) == 24
    assert all(n * floats <= 3 * 20 * 20 * 4 or n == 1 for n, floats, _ in stacks)
    assert all(max(a) <= min(b) for (_, _, a), (_, _, b) in zip(stacks, stacks[1:]))  # by area, smallest first
    assert (in_stacks.int() - one_stack.int()).abs().max() <= 1
    assert ((in_stacks.int() - per_image_crops(images, boxes, 20, "bicubic").int()).abs() <= 1).all()


def test_loader_batches_are_those_of_the_per_image_crop_within_a_level(folder, monkeypatch):
    """The whole loader, with the crop as it was before it was batched, differs only where that crop's rounding does."""
    aug = augmentation("deit", 16, randaugment_magnitude=None)  # RandAugment's ops would carry a level further
    ours = take(loaders(folder, aug, seed=4).epoch(1), 6)
    monkeypatch.setattr(gpu_decode, "resized_crops", per_image_crops)
    theirs = take(loaders(folder, aug, seed=4).epoch(1), 6)
    for (x, y), (x0, y0) in zip(ours, theirs):
        assert torch.equal(y, y0) and (x.int() - x0.int()).abs().max() <= 1


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


# ------------------------------------------------------------------------------------------ the decode thread


def decode_thread() -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == "gpu-decode"), None)


@pytest.mark.parametrize("ahead", [0, 1, 2])
def test_decoding_runs_on_its_own_drained_stream_and_batches_are_handed_over_with_events(folder, monkeypatch, ahead):
    """With a stand-in stream backend (RecordingStreams): the decode thread decodes with the side stream current and
    drains that stream, never the consumer's, before every decode, then records the batch's event; the consumer's
    stream waits for that event, then record_stream keeps each handed-out tensor; the loader's batches are fetched
    in the consumer's thread, `ahead` beyond the one being handed out, and the thread decodes them without being
    asked."""
    gpu = loaders(folder, augmentation("deit", 16), batch_size=4)  # 24 files: 6 batches
    streams = gpu.train.streams = RecordingStreams()
    gpu.train.ahead, real_decode, started = ahead, gpu_decode.decode_jpeg, [threading.Event() for _ in range(6)]

    def decode(files, **kwargs):
        streams.write("decode", streams.current_stream().name, len(files))
        started[sum(entry[1] == "decode" for entry in streams.log) - 1].set()
        return real_decode(files, **kwargs)

    def counted(loader):  # the loader, writing each batch it gives in the log
        for n, batch in enumerate(loader):
            streams.write("fetch", n)
            yield batch

    monkeypatch.setattr(gpu_decode, "decode_jpeg", decode)
    monkeypatch.setattr(gpu.train, "loader", counted(gpu.train.loader))
    batches, handed = gpu.epoch(0), []
    for n in range(6):
        handed.append(next(batches))
        streams.write("handed out", n)
        if ahead and n < 5:
            assert started[n + 1].wait(timeout=60)  # batch n + 1 decoded while nobody asks for it
    with pytest.raises(StopIteration):
        next(batches)
    consumer, fetched = [], 0
    for n, (images, labels) in enumerate(handed):
        consumer += [("fetch", m) for m in range(fetched, min(n + ahead, 5) + 1)]
        fetched = min(n + ahead, 5) + 1
        consumer += [("wait_event", "consumer", f"ready {n}"), ("record_stream", images, "consumer"),
                     ("record_stream", labels, "consumer"), ("handed out", n)]
    calls = {thread: [tuple(id(x) if isinstance(x, torch.Tensor) else x for x in entry[1:])  # a tensor: which one
                      for entry in streams.log if entry[0] == thread] for thread in ("MainThread", "gpu-decode")}
    assert calls["MainThread"] == [tuple(id(x) if isinstance(x, torch.Tensor) else x for x in c) for c in consumer]
    assert calls["gpu-decode"] == [("current", "side")] + [call for n in range(6) for call in (
        ("synchronize", "side"), ("decode", "side", 4), ("record", f"ready {n}", "side"))]
    events = [entry[1:] for entry in streams.log if entry[1] in ("record", "wait_event")]  # both threads, in order
    assert all(events.index(("record", f"ready {n}", "side")) < events.index(("wait_event", "consumer", f"ready {n}"))
               for n in range(6))  # each batch's event is recorded before the consumer's stream waits for it
    assert decode_thread() is None


@pytest.mark.parametrize("ahead, workers", [(0, 0), (1, 0), (2, 1)])
def test_overlapped_batches_equal_the_same_batches_decoded_one_by_one_in_this_thread(folder, ahead, workers):
    """However far ahead the thread decodes (and whether workers or this process read the files), the batches are
    bit for bit those of ``decode_batch`` called on each loader batch in turn."""
    gpu = loaders(folder, augmentation("deit", 16, randaugment_prob=1.0), batch_size=4, workers=workers, seed=5)
    gpu.train.ahead = ahead
    overlapped = list(gpu.epoch(3))
    gpu.sampler.set_epoch(3)
    in_turn = [decode_batch(batch, gpu.train.view, gpu.train.device, gpu.train.samples) for batch in gpu.train.loader]
    assert len(overlapped) == 6 and same(overlapped, in_turn)


def test_the_thread_ends_with_the_epoch_and_when_the_consumer_stops(folder):
    gpu = loaders(folder, augmentation("deit", 16), batch_size=4)
    batches = gpu.epoch(0)
    take(batches, 2)
    thread = decode_thread()
    assert thread is not None and thread.is_alive()
    batches.close()  # what the training loop's return does to its iterator
    assert not thread.is_alive() and decode_thread() is None
    batches = gpu.epoch(1)
    take(batches, 1)
    thread = decode_thread()  # alive: the loader's end is fetched with the last batch
    take(batches, 5)  # every batch, without asking for a seventh (as the training loop does)
    thread.join(timeout=60)  # it ends by itself once the loader has no more
    assert not thread.is_alive()
    del batches
    assert decode_thread() is None


def test_the_loader_leaves_the_consumers_generator_alone(folder):
    """With num_workers=0 the files are read and the choices drawn in the consumer's thread (not the decode thread,
    where they would race the training step's draws from torch's one generator): its generator is restored."""
    aug = augmentation("deit", 16)
    torch.manual_seed(7)
    expected = torch.rand(6)
    torch.manual_seed(7)
    batches, drawn, undisturbed = loaders(folder, aug).epoch(0), [], take(loaders(folder, aug).epoch(0), 6)
    for _ in range(6):
        drawn.append((next(batches), torch.rand(1)))  # a step's MixUp between batches
    assert torch.equal(torch.cat([r for _, r in drawn]), expected) and same([b for b, _ in drawn], undisturbed)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="nvJPEG's race needs a CUDA GPU")
def test_on_a_gpu_decoding_never_overwrites_what_queued_training_work_still_reads(folder):
    """pytorch/vision PR 9606's reproduction, through the loader: blocks of the decoded images' sizes filled on the
    training stream, a sleep and reductions of them queued there, the tensors freed (their blocks back in that
    stream's pool at once, their reads still queued), then a batch decoded: the reductions must still read what the
    tensors held. Decoding with the training stream current, without a drain, would hand nvJPEG those blocks."""
    for name in ("2.jpg", "3.jpg"):  # the greyscale and the CMYK file: RGB ones, the files nvJPEG is sure to read
        write_jpeg(folder / "train" / "c1" / name, seed=100 + int(name[0]))
    aug = augmentation("deit", 16, randaugment_magnitude=None)
    train_set, val_set, _ = build_datasets("imagefolder", folder)
    gpu = build_gpu_decode_loaders(train_set, val_set, aug, batch_size=24, num_workers=0, device=torch.device("cuda"))
    sizes = [decoded(path).numel() for path, _ in train_set.samples]
    for epoch in range(4):
        fills = [1 + (epoch + i) % 250 for i in range(len(sizes))]
        blocks = [torch.full((n,), v, dtype=torch.uint8, device="cuda") for n, v in zip(sizes, fills)]
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time before the reductions run
        sums = torch.stack([block.sum(dtype=torch.int64) for block in blocks])
        del blocks
        images, labels = next(gpu.epoch(epoch))
        on_cpu = next(loaders(folder, aug, batch_size=24).epoch(epoch))  # libjpeg-turbo's pixels, not nvJPEG's
        assert sums.tolist() == [n * v for n, v in zip(sizes, fills)]
        assert torch.equal(labels.cpu(), on_cpu[1])
        assert (images.cpu().float() - on_cpu[0]).abs().mean() < 10  # the same photographs, not another's pixels


# ------------------------------------------------------------------------------------------ positions and resume


def test_batches_are_a_function_of_seed_epoch_and_sample_and_resume_exactly(folder):
    aug = augmentation("deit", 16)
    a, b = loaders(folder, aug, seed=1), loaders(folder, aug, seed=1, workers=1)  # in this process / in a worker
    whole = take(a.epoch(2), 6)
    assert same(whole, take(b.epoch(2), 6))
    stopped = a.epoch(2)
    assert same(take(stopped, 3), whole[:3])  # three handed out; batch 3 (4 and 5 with workers) fetched, decoded
    stopped.close()
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


@pytest.mark.parametrize("damage", ["garbage", "truncated"])  # found when the file is read / in the decode thread
@pytest.mark.parametrize("ahead", [1, 2])
def test_an_unreadable_file_is_raised_when_its_batch_is_asked_for_and_stops_the_thread(folder, damage, ahead):
    gpu = loaders(folder, augmentation("deit", 16), batch_size=4)  # in this process, as test_a_corrupt_file_is_named
    gpu.train.ahead, (_, position, index) = ahead, list(gpu.sampler)[13]  # in batch 3
    bad = Path(gpu.train.samples[index][0])
    bad.write_bytes(b"not an image" if damage == "garbage" else bad.read_bytes()[:300])
    batches = gpu.epoch(0)
    assert len(take(batches, 3)) == 3  # the batches before it, though it was fetched and decoded ahead
    with pytest.raises(ValueError, match=rf"{bad}.*loader 'torchvision'"):
        next(batches)
    assert decode_thread() is None


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
