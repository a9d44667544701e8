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
# # Loaders: workers, uint8 batches finished on the device, a busy accelerator
#
# Chapters 14-16's datasets, transforms and samplers become batches: workers that decode and augment in parallel
# and ship uint8 for the device to finish, one call to loaders that give the same batches at any number of
# processes and workers, and a benchmark that says which stage of the pipeline limits training.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp loaders
# Loaders with workers that stop cleanly, how many workers, and the loaders of a run (one interface for every kind).

# %%
#| export
import atexit
import os
import signal
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, Subset

from convit_edu.checks import positive_int
from convit_edu.samplers import (CyclingSampler, JoinedBatches, KeyedSampler, RepeatAugSampler, SeededSamples,
                                 SplitBatches, val_shard)

# %%
import warnings
from dataclasses import replace

import torch

from convit_edu.augment import AUGMENTATIONS, augmentation, build_mixup, build_transforms
from convit_edu.datasets import SyntheticImages, build_datasets
from convit_edu.image_files import load_rgb
from convit_edu.photographs import tiny_imagenet

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %% [markdown]
# The first four classes of the course's Tiny ImageNet subset (chapter 14), and one photograph from them.

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now)
TINY = tiny_imagenet("../data")

# %%
_, val_ds, names = build_datasets("imagefolder", TINY, max_classes=4)
photo = load_rgb(TINY / "train" / "n01443537" / "n01443537_0.JPEG")
print(names)

# %% [markdown]
# ## Loaders that keep the accelerator busy
#
# `build_loader` sets what matters at scale: `num_workers` processes decode and augment in parallel,
# `persistent_workers` keeps them (and their open files) across epochs, `prefetch_factor` keeps 4 batches per
# worker in flight, `pin_memory` (on when CUDA is present) makes host-to-GPU copies asynchronous, a **seeded
# generator** fixes the workers' base seed, and `parts` shares each batch among workers (chapter 16). Workers
# ignore SIGTERM and SIGINT: SLURM signals every process of a job, and a worker killed by it would crash the main
# process mid-step, before it saves (chapter 28). So the main process stops them itself, also at its exit, where
# Python would otherwise wait forever for daemonic children that ignore SIGTERM: every loader with workers is
# remembered (weakly) and its workers told to stop; workers whose loader is gone are killed.

# %%
#| export
def build_loader(dataset: Dataset, batch_size: int, sampler: Sampler | None, *, num_workers: int, seed: int,
                 drop_last: bool, pin_memory: bool | None = None, parts: int = 1) -> DataLoader | JoinedBatches:
    """A DataLoader over ``sampler`` (None: dataset order) with workers, pinning, prefetch and a seeded generator;
    with ``parts`` > 1, each batch loaded in that many pieces by as many workers (chapter 16's ``SplitBatches``)."""
    positive_int("batch_size", batch_size)
    positive_int("num_workers (0: load in this process)", num_workers, minimum=0)
    if drop_last and sampler is not None and len(sampler) < batch_size:
        raise ValueError(f"batch_size {batch_size} with drop_last=True leaves no batch: this rank's epoch holds "
                         f"only {len(sampler)} samples")
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    batching = ({"batch_size": batch_size, "sampler": sampler, "drop_last": drop_last} if parts == 1 else
                {"batch_sampler": SplitBatches(BatchSampler(sampler, batch_size, drop_last), parts)})
    loader = _WorkerTrackingLoader(
        dataset, **batching, num_workers=num_workers, pin_memory=pin and parts == 1,
        generator=torch.Generator().manual_seed(seed), persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers > 0 else None, worker_init_fn=_ignore_stop_signals if num_workers else None,
    )
    if num_workers:
        _WITH_WORKERS.add(loader)
    return loader if parts == 1 else JoinedBatches(loader, parts, pin_memory=pin)


def _ignore_stop_signals(worker_id: int) -> None:
    """SLURM and a terminal send SIGTERM / SIGINT to every process of a job, workers included. Workers ignore both:
    the main process stops them itself after its checkpoint, or at its exit (``_stop_workers_at_exit``)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_WITH_WORKERS: weakref.WeakSet = weakref.WeakSet()  # the loaders build_loader made with workers, while they live
_WORKERS: weakref.WeakSet = weakref.WeakSet()  # their worker processes, while multiprocessing holds them


class _WorkerTrackingLoader(DataLoader):
    """A DataLoader that remembers the worker processes of each iterator it starts (in ``_WORKERS``)."""

    def _get_iterator(self):
        iterator = super()._get_iterator()
        _WORKERS.update(getattr(iterator, "_workers", ()))
        return iterator


@atexit.register  # registered after multiprocessing's exit function (torch imported it), so it runs before it
def _stop_workers_at_exit() -> None:
    """Stop the live workers of every loader before multiprocessing, at exit, sends its daemonic children SIGTERM
    and waits for them (forever, for workers that ignore SIGTERM)."""
    for loader in list(_WITH_WORKERS):
        iterator = getattr(loader, "_iterator", None)  # the persistent workers' iterator; None before an epoch
        if iterator is not None:
            iterator._shutdown_workers()  # what deleting the iterator does: a stop message, then a join
    for worker in list(_WORKERS):  # workers whose loader is gone: SIGTERM would not end them
        if worker.is_alive():
            worker.kill()
            worker.join()

# %% [markdown]
# ### How many workers?
#
# One worker per CPU the process may use (its affinity, not `os.cpu_count()`), less one for the process itself; the
# processes of one node (`torchrun` sets `LOCAL_WORLD_SIZE`) share them. The training loop uses `default_num_workers`
# when `--num-workers` is not given. On a 2-core laptop, a 64-core node with 8 GPUs, an 8-core one with 8:

# %%
#| export
def default_num_workers(env: Mapping[str, str] = os.environ) -> int:
    """Loader workers per process when none are asked for: the CPUs this process may run on
    (``os.sched_getaffinity``, which SLURM, ``taskset`` and containers restrict; ``os.cpu_count`` without it, e.g.
    macOS) divided among this node's processes (``LOCAL_WORLD_SIZE``, set by torchrun; 1 without it), less one
    for the process itself, which runs the step; never below 0 (then the process loads its batches itself)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = env.get("LOCAL_WORLD_SIZE", "1")
    if not local.isdigit() or int(local) < 1:
        raise ValueError(f"LOCAL_WORLD_SIZE {local!r} must be a positive integer (torchrun sets it to the number "
                         "of processes on this node)")
    return max(cpus // int(local) - 1, 0)

# %%
from unittest import mock

for cpus, processes in ((2, 1), (64, 8), (8, 8)):
    with mock.patch.object(os, "sched_getaffinity", lambda pid: set(range(cpus)), create=True):
        workers = default_num_workers({"LOCAL_WORLD_SIZE": str(processes)})
    assert workers == max(cpus // processes - 1, 0)
    print(f"{cpus:>2} CPUs, {processes} process(es) on the node: {workers} worker(s) each")

# %%
# NBVAL_IGNORE_OUTPUT
# (this machine's CPUs)
print(f"this process, alone on this machine: {default_num_workers({})} worker(s)")

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
# (seed, rank, epoch, step) before every step (chapter 23): a resumed run draws the same boxes.
#
# **No waiting for the device.** A CUDA device runs behind the CPU; anything that needs a value *on the host*
# (`.item()`, printing a tensor, a blocking copy from pageable memory) makes the CPU wait, and the queue runs dry.
# So `DeviceTransforms` fills its constants (255·mean, 255·std) in place on the device at its first batch there,
# and `erasing_boxes` draws a box's numbers with `torch.rand(..., device=...)` and the (B, H, W) mask by
# comparisons against `arange` there: nothing is read back. Both live in `convit_edu.augment` (the cell exports
# them there), beside chapter 15's recipe.

# %%
#| export augment
import math

import torch

from convit_edu.augment import AugConfig


class DeviceTransforms:
    """The end of a recipe, on uint8 batches (B, 3, S, S) on the training device: ``eval`` converts and
    normalises, ``train`` also erases a random box of each image with probability ``cfg.erasing``. Neither
    synchronises the host with the device (the constants are made on each device once, see ``constants``)."""

    def __init__(self, cfg: AugConfig):
        self.mean, self.std, self.erasing = tuple(cfg.mean), tuple(cfg.std), cfg.erasing
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """255·mean and 255·std as (3, 1, 1) float tensors on ``device``: made the first time ``device`` is asked
        for and kept. Each channel is filled in place on the device, so even that first call copies nothing from
        the host and does not wait for the device."""
        if device not in self._constants:
            self._constants[device] = tuple(
                torch.stack([torch.full((1, 1), 255 * v, device=device) for v in values])
                for values in (self.mean, self.std))
        return self._constants[device]

    def eval(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"DeviceTransforms expects uint8 batches (B, 3, H, W), got {images.dtype} "
                             f"{tuple(images.shape)}: build the dataset with build_transforms(cfg, on_device=True)")
        mean, std = self.constants(images.device)
        return (images.float() - mean) / std

    def train(self, images: torch.Tensor) -> torch.Tensor:
        x = self.eval(images)
        if self.erasing == 0:
            return x
        mask = erasing_boxes(x.shape[0], x.shape[-2:], self.erasing, device=x.device)
        return torch.where(mask[:, None], torch.randn_like(x), x)


def erasing_boxes(batch: int, size: tuple[int, int], p: float, scale: tuple[float, float] = (0.02, 1 / 3),
                  ratio: tuple[float, float] = (0.3, 3.3), tries: int = 10,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """RandomErasing's boxes for a batch, as a (B, H, W) bool mask made on ``device`` (default: the CPU) from
    torch's global generator of that device, with tensor ops only (no Python loop, no read back to the host):
    each image with probability ``p``, a box of ``scale`` of the area with aspect ratio h/w in ``ratio``
    (log-uniform), the first of ``tries`` draws that fits inside the image (no box when none does), at a uniform
    position: torchvision's ``RandomErasing`` (Zhong et al. 2020), for a whole batch at once."""
    h_img, w_img = size
    share = scale[0] + (scale[1] - scale[0]) * torch.rand(batch, tries, device=device)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * torch.rand(batch, tries, device=device))
    area = h_img * w_img * share
    h, w = (area * aspect).sqrt().round().long(), (area / aspect).sqrt().round().long()
    fits = (h < h_img) & (w < w_img)
    first = fits.float().argmax(1, keepdim=True)  # the first try that fits (try 0 when none does: not erased)
    h, w = h.gather(1, first)[:, 0], w.gather(1, first)[:, 0]
    u_top, u_left, u_erase = torch.rand(3, batch, device=device)
    top, left = (u_top * (h_img - h + 1)).long(), (u_left * (w_img - w + 1)).long()
    erase = (u_erase < p) & fits.any(1)
    ys, xs = torch.arange(h_img, device=device)[None, :, None], torch.arange(w_img, device=device)[None, None, :]
    inside = ((ys >= top[:, None, None]) & (ys < (top + h)[:, None, None]) &
              (xs >= left[:, None, None]) & (xs < (left + w)[:, None, None]))
    return inside & erase[:, None, None]


# %% [markdown]
# The same recipe both ways on one batch: the uint8 batch is a quarter of the bytes, and normalising it on the
# device gives the worker's float tensors (to float32 rounding), with constants made once per device; erased
# boxes cover about `erasing` × 17.5 % of the pixels on average (the mean box area is (2 % + 33 %)/2, when a
# box fits).

# %%
cfg = augmentation("deit", 64)
float_tf, float_val = build_transforms(cfg)
uint8_tf, uint8_val = build_transforms(cfg, on_device=True)
batch = torch.stack([uint8_val(photo) for _ in range(4)])
print("bytes per image:", float_val(photo).nbytes, "as float32,", batch[0].nbytes, "as uint8")
assert float_val(photo).nbytes == 4 * batch[0].nbytes
finish = DeviceTransforms(cfg)
assert torch.allclose(finish.eval(batch)[0], float_val(photo), atol=1e-5)
assert finish.constants(batch.device) is finish.constants(batch.device)  # made at the first batch, then kept
torch.manual_seed(0)
mask = erasing_boxes(20_000, (64, 64), p=cfg.erasing)
print(f"share of pixels erased: {mask.float().mean():.3f} (erasing {cfg.erasing}: about {cfg.erasing * 0.175:.3f})")
assert abs(mask.float().mean() - cfg.erasing * 0.175) < 0.01
assert finish.train(batch).shape == (4, 3, 64, 64)

# %% [markdown]
# ### From datasets to loaders in one call
#
# `build_loaders` strings chapter 16 and this one together: a `RepeatAugSampler` for this rank (with
# `epoch_samples`, a `CyclingSampler` whose epochs are that many samples of a stream cycling the data) behind a
# `KeyedSampler`, the seeded samples, loaders with workers; validation in dataset order. Chapter 28's `train`
# calls it. Every kind of loader a run can use (these, chapter 19's GPU-decoding ones, chapter 18's DALI) answers
# `epoch(e, start)`, `val`, and `state()` / `restore(state)` for what a checkpoint keeps of the loader itself
# (chapter 26): nothing here, as the position in the stream is the epoch and step, which it holds anyway.

# %%
#| export
@dataclass
class DataLoaders:
    """What ``build_loaders`` makes: the two loaders and the train sampler (call its ``set_epoch``)."""

    train: DataLoader | JoinedBatches
    val: DataLoader
    sampler: KeyedSampler

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The train batches of ``epoch`` from this rank's sample ``start`` on (``sampler.set_epoch``, ``train``)."""
        self.sampler.set_epoch(epoch, start)
        return iter(self.train)

    def state(self) -> None:
        """What a checkpoint keeps of these loaders: nothing (their position is the epoch and step)."""

    def restore(self, state: None) -> None:
        """Go on from ``state()``: nothing to do, ``epoch(e, start)`` places the stream."""


def build_loaders(train_set: Dataset, val_set: Dataset, *, batch_size: int, num_workers: int = 4,
                  repeats: int = 1, num_replicas: int = 1, rank: int = 0, seed: int = 0,
                  epoch_samples: int | None = None) -> DataLoaders:
    """Loaders for rank ``rank`` of ``num_replicas``: the train loader ``batch_size`` images per rank, seeded per
    sample and dropping the last incomplete batch; the val loader every ``num_replicas``-th image from ``rank`` on,
    each once (no padding: chapter 25's sums stay exact), in dataset order, up to ``2 * batch_size`` a batch
    (inference keeps no activations for a backward pass). Both keep their workers between epochs, so an evaluation
    starts none, and give every worker a share of an epoch: a train batch in pieces when an epoch has fewer batches
    than workers, smaller val batches when the val images fill fewer. With ``epoch_samples``, an epoch is that many
    samples per rank of a stream that cycles the training set (chapter 16's ``CyclingSampler``)."""
    if len(train_set) < num_replicas:
        raise ValueError(f"{num_replicas} processes but the training set has only {len(train_set)} samples: "
                         f"use at most {len(train_set)} processes")
    dealt = (RepeatAugSampler(len(train_set), num_replicas, rank, repeats=repeats, seed=seed) if epoch_samples is None
             else CyclingSampler(len(train_set), epoch_samples, num_replicas, rank, repeats=repeats, seed=seed))
    sampler = KeyedSampler(dealt)
    val_part = Subset(val_set, val_shard(len(val_set), rank, num_replicas))
    steps = len(sampler) // batch_size
    parts = min(batch_size, -(-num_workers // steps)) if num_workers and steps else 1
    val_batch = min(2 * batch_size, -(-len(val_part) // num_workers)) if num_workers and val_part else 2 * batch_size
    return DataLoaders(
        train=build_loader(SeededSamples(train_set, seed), batch_size, sampler, num_workers=num_workers, seed=seed,
                           drop_last=True, parts=parts),
        val=build_loader(val_part, val_batch, None, num_workers=num_workers, seed=seed, drop_last=False),
        sampler=sampler)

# %% [markdown]
# The Tiny ImageNet classes with the DeiT augmentation and repeated augmentation ×3 (`build_datasets("cifar100")`
# downloads CIFAR-100 into `data/` instead), one batch, mixed:

# %%
aug = AUGMENTATIONS["deit"]
train_tf, val_tf = build_transforms(aug)
train_ds, val_ds, classes = build_datasets("imagefolder", TINY, train_transform=train_tf, val_transform=val_tf,
                                           max_classes=4)
data = build_loaders(train_ds, val_ds, batch_size=32, num_workers=2, repeats=3)
data.sampler.set_epoch(0)
images, labels = next(iter(data.train))
mixed, targets = build_mixup(aug, len(classes))(images, labels)
print(f"classes {classes}; train {len(data.train)} batches/epoch, val {len(data.val)} batches")
print(f"batch {tuple(mixed.shape)} {mixed.dtype}, soft targets {tuple(targets.shape)}")
assert mixed.shape == (32, 3, 224, 224) and torch.allclose(targets.sum(1), torch.ones(32))

# %% [markdown]
# Every sample's augmentation is a function of its place in the run (chapter 16's `SeededSamples`): the first
# batch of an epoch is the same with no worker and with two (an epoch of one batch: loaded in 2 pieces, so that
# both workers have a share), and reading it again gives it again.

# %%
small_ds = SyntheticImages(64, 4, 48, transform=build_transforms(replace(aug, img_size=32))[0])
loaders = [build_loaders(small_ds, small_ds, batch_size=64, num_workers=w, seed=3) for w in (0, 2, 0)]
first = [next(iter(data.train))[0] for data in loaders]
assert torch.equal(first[0], first[1]) and torch.equal(first[0], first[2]) and loaders[1].train.parts == 2
print("the first batch is identical with 0 and 2 workers, and when read again")

# %% [markdown]
# ## Which stage limits the pipeline?
#
# `benchmark_loader` times each stage of the input pipeline separately, on the same images: **decode** (read
# and decode the files, RGB), **augment** (the train transform on decoded images), **collate** (stack into a
# batch, plus MixUp/CutMix when given) — each in one process — and the **loader** end to end with its worker
# processes. The slowest single-process stage divided by the number of workers is the pipeline's limit; compare
# the loader's images/s with the model's training throughput (chapter 41, `convit-edu bench`) to see whether
# data or model limits a run. It is a benchmark, so it lives in `convit_edu.benchmarks` (chapter 30).

# %%
#| export benchmarks
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from matplotlib.figure import Figure
from torch.utils.data import Dataset, default_collate

from convit_edu.loaders import build_loader


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
# The benchmark on this machine (its numbers change from run to run and with the CPU; the committed ones: an AMD EPYC
# (Zen 3, AVX2, 2 cores), nothing else running). Decoding a 64×64 JPEG is cheap; the augmentations at 224 px dominate —
# RandomResizedCrop's bicubic upsampling and RandAugment — so `num_workers` should be as large as the CPU cores allow
# (DeiT used 10 per GPU). At 32 px the same pipeline is an order of magnitude faster.

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
