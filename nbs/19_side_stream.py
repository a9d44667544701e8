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
# # `gpu-decode` beside the training step: a stream of its own, events, one batch ahead
#
# Chapter 19 (`19_gpu_decode`) decodes and augments a batch on the training device in launches whose number does not
# grow with the batch (`decode_batch`). This chapter runs that beside the training step instead of before it, and
# builds the loader that `TrainConfig(loader="gpu-decode")` (`--loader gpu-decode`) selects:
# `build_gpu_decode_loaders`, with the same `epoch`, `state` and `restore` as chapter 17's `DataLoaders`.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpu_decode

# %% [markdown]
# ## Why, and how
#
# **Why a drain serialised the two.** `decode_jpeg(..., device="cuda")` allocates its outputs on the *caller's* current
# stream, then has nvJPEG write them from a private stream without waiting for the caller's (torchvision's
# `decode_jpegs_cuda.cpp`; pytorch/vision PR 9606). PyTorch's caching allocator hands a freed block to the next
# allocation on the same stream at once: freed means every kernel that reads it has been *queued*, not run. So the
# decoder could overwrite a tensor that a queued kernel of the training step had not read yet, which the GPU check of
# 2026-11-27 (H200, `nbs/results/gpu/`) saw as a NaN loss at step 3. The first fix drained the training stream before
# each decode: correct, but the host then waited for the whole previous step on the GPU before it could decode, crop
# and augment the next batch, while the GPU idled: about 31–40 ms of each 97 ms step, a data wait of 56 % (H200, eager
# ConViT-S; `gpu-results-reading.md` §4a).
#
# **A stream of its own.** A CUDA stream is a queue of GPU work; the work of two streams may run at once. The decode
# runs with a side stream current, so nvJPEG's outputs come from that stream's own blocks, which only the decoder's
# own earlier work (the previous batch's crop and RandAugment) can still be reading. Draining *that* stream before each
# decode (`side.synchronize()`) waits for a few milliseconds of work issued a step earlier, normally done already, and
# never for the training stream.
#
# **An event and `record_stream` hand a batch over.** After the view, the decode thread records an event on the side
# stream; the consumer's stream waits for it on the GPU (`wait_event`: the host does not wait), so the training step
# reads the batch only once it is written. The batch's memory belongs to the side stream's blocks:
# `record_stream(consumer)` tells the allocator to keep it, once freed, until the work then queued on the consumer's
# stream has run, so that a later decode is never handed it early.
#
# **One batch ahead, in a thread.** The decode blocks the host: torchvision waits for nvJPEG's stream before and after
# it decodes, and `side.synchronize()` waits too. In the training thread these waits would hold up the issue of the
# next step; in a thread of their own (torch's operations release Python's lock while they run) they overlap it: the
# thread decodes batch n + 1 while the training thread issues step n, and `ahead` sets how many batches it may be
# given beyond the one being handed out. The training thread still fetches each loader batch itself (from the
# workers, a queue read) and passes it on: `SeededSamples` seeds torch's process-wide generator for each sample, and
# with `num_workers=0` a thread drawing crops would race the step's MixUp and drop-path draws. An error in the thread
# (an unreadable file, named) is raised in the training thread when that batch is asked for; the thread ends with
# the epoch, or when the consumer stops early and the iterator is closed (a checkpoint and exit, a signal).
#
# **Resume stays exact.** The position is still the sampler's: a checkpoint at step k has handed out k batches; batch
# k, fetched and perhaps decoded ahead, was never trained on, and `epoch(e, start)` fetches it again, the same batch,
# a function of (seed, epoch, position).
#
# The streams come from a small backend: `CudaStreams` on a GPU, `HostStreams` on a CPU (whose ops are finished when
# they return: nothing to drain, wait for or record), `RecordingStreams` in this chapter and the tests (it writes down
# what is asked of it, in which thread, so the order can be checked on a CPU). The order is what a CPU can check; the
# time it saves is a GPU's measurement: the data wait of chapter 45's `jpeg_gpu_decode` phase.

# %%
#| export
import contextlib
import itertools
import queue
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable, Iterator

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset

from convit_edu.augment import AugConfig
from convit_edu.datasets import ImageFolderDataset
from convit_edu.gpu_decode import DeviceRecipe, JpegBatches, JpegFiles, decode_batch
from convit_edu.loaders import DataLoaders, build_loader
from convit_edu.samplers import KeyedSampler, RepeatAugSampler, SeededSamples, val_shard


# %%
#| export
class CudaStreams:
    """What ``DecodedBatches`` asks of CUDA on ``device``: a stream of its own, the consumer's current stream, a stream
    made current in this thread, events, and ``record_stream``."""

    def __init__(self, device: torch.device):
        self.device = device

    def new_stream(self) -> torch.cuda.Stream:
        return torch.cuda.Stream(self.device)

    def current_stream(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def stream(self, stream: torch.cuda.Stream) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(stream)  # current in the calling thread only

    def event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def record_stream(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        tensor.record_stream(stream)


class HostStreams:
    """The CPU's stand-in for streams and events: an operation has finished when it returns, so there is one stream,
    this object, and nothing to drain, wait for or record."""

    def new_stream(self) -> "HostStreams":
        return self

    current_stream = event = new_stream

    def stream(self, stream: "HostStreams") -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def synchronize(self, *_) -> None:
        """Nothing to do: no operation is queued on a CPU."""

    wait_event = record = record_stream = synchronize


class RecordingStreams:
    """A stand-in for ``CudaStreams`` on any device: streams and events that only write (thread name, call, names or
    tensor) in ``log``; a thread's current stream is the one ``stream`` made current in it, else "consumer"."""

    def __init__(self):
        self.log: list[tuple] = []
        self._current, self._events = threading.local(), itertools.count()

    def write(self, *entry) -> None:
        self.log.append((threading.current_thread().name, *entry))

    def named(self, name: str) -> SimpleNamespace:
        """A stream or an event called ``name``: what is asked of it is written in the log."""
        return SimpleNamespace(name=name, synchronize=lambda: self.write("synchronize", name),
                               wait_event=lambda event: self.write("wait_event", name, event.name),
                               record=lambda stream: self.write("record", name, stream.name))

    def new_stream(self) -> SimpleNamespace:
        return self.named("side")

    def current_stream(self) -> SimpleNamespace:
        return getattr(self._current, "stream", None) or self.named("consumer")

    @contextlib.contextmanager
    def stream(self, stream: SimpleNamespace) -> Iterator[None]:
        self.write("current", stream.name)
        self._current.stream = stream
        try:
            yield
        finally:
            del self._current.stream

    def event(self) -> SimpleNamespace:
        return self.named(f"ready {next(self._events)}")

    def record_stream(self, tensor: torch.Tensor, stream: SimpleNamespace) -> None:
        self.write("record_stream", tensor, stream.name)


# %%
#| export
@dataclass
class DecodedBatches:
    """(uint8 images, labels) on ``device``: ``loader``'s batches decoded there in one call each and cut to ``view``,
    by a thread on a stream of its own, up to ``ahead`` batches beyond the one being handed out."""

    loader: DataLoader
    view: Callable[[list[torch.Tensor], dict[str, torch.Tensor]], torch.Tensor]
    device: torch.device
    samples: list[tuple[str, int]]
    ahead: int = 1
    streams: CudaStreams | HostStreams | RecordingStreams | None = field(default=None, repr=False)  # None: the device's

    def __post_init__(self):
        if self.streams is None:
            self.streams = CudaStreams(self.device) if self.device.type == "cuda" else HostStreams()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self._handed_out(iter(self.loader))  # the loader starts now, as in DataLoaders.epoch

    def _handed_out(self, batches: Iterator[dict]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The consumer's side: feed the thread the loader's batches, ``ahead`` beyond the one handed out; hand each
        over on the consumer's current stream; stop and join the thread at the end, an error or a close."""
        streams, todo, made, stop = self.streams, queue.SimpleQueue(), queue.SimpleQueue(), threading.Event()
        side = streams.new_stream()  # this iterator's streams and view, whatever the object's become meanwhile
        thread = threading.Thread(target=self._decode_all, args=(streams, self.view, side, todo, made, stop),
                                  name="gpu-decode", daemon=True)
        thread.start()

        def feed() -> bool:  # fetched here: the draws stay in this thread (see above)
            try:
                batch = next(batches, None)  # None: the end
            except Exception as e:  # a worker's (a file that is not a JPEG): raised in turn, as the thread's are
                batch = e
            todo.put(batch)
            return batch is not None and not isinstance(batch, Exception)

        try:
            more = all(feed() for _ in range(self.ahead))
            while True:
                more = more and feed()  # batch n + ahead, before batch n is handed out
                item = made.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                images, labels, ready = item
                consumer = streams.current_stream()
                consumer.wait_event(ready)  # on the GPU: the host goes on
                for tensor in (images, labels):
                    streams.record_stream(tensor, consumer)
                yield images, labels
        finally:
            stop.set()
            todo.put(None)
            thread.join()

    def _decode_all(self, streams, view: Callable, side, todo: queue.SimpleQueue, made: queue.SimpleQueue,
                    stop: threading.Event) -> None:
        """The thread: each batch of ``todo`` decoded with ``side`` current, which is drained first (nvJPEG writes
        without waiting for it), then an event recorded there; ends at a None, a stop or an error (passed on)."""
        try:
            with streams.stream(side):
                while (batch := todo.get()) is not None and not stop.is_set():
                    if isinstance(batch, Exception):
                        raise batch
                    side.synchronize()
                    images, labels = decode_batch(batch, view, self.device, self.samples)
                    ready = streams.event()
                    ready.record(side)
                    made.put((images, labels, ready))
        except BaseException as e:  # raised in the consumer's thread, where the batch is asked for
            made.put(e)
            return
        made.put(None)


@dataclass
class GpuDecodeLoaders(DataLoaders):
    """``DataLoaders`` of batches decoded on the device: ``epoch`` as theirs, the sampler's position the state."""

    train: DecodedBatches
    val: DecodedBatches


def build_gpu_decode_loaders(train_set: ImageFolderDataset, val_set: ImageFolderDataset, aug: AugConfig, *,
                             batch_size: int, num_workers: int, repeats: int = 1, num_replicas: int = 1, rank: int = 0,
                             seed: int = 0, device: torch.device) -> GpuDecodeLoaders:
    """``build_loaders``' train batches and val files (every ``num_replicas``-th, once), decoded on ``device``."""
    recipe, device = DeviceRecipe(aug), torch.device(device)
    sampler = KeyedSampler(RepeatAugSampler(len(train_set), num_replicas, rank, repeats=repeats, seed=seed))
    if len(train_set) < num_replicas or len(sampler) < batch_size:
        raise ValueError(f"batch_size {batch_size} with {num_replicas} process(es) leaves no batch: a process's epoch "
                         f"holds {len(sampler)} of the {len(train_set)} training files (lower the batch)")

    def feed(files: Dataset, batches: BatchSampler) -> DataLoader:  # workers: one JpegBatches item per loader "batch"
        return build_loader(JpegBatches(files), 1, batches, num_workers=num_workers, seed=seed, drop_last=False)

    train = feed(SeededSamples(JpegFiles(train_set.samples, recipe), seed), BatchSampler(sampler, batch_size, True))
    val_batches = BatchSampler(val_shard(len(val_set), rank, num_replicas), 2 * batch_size, False)
    val = feed(JpegFiles(val_set.samples), val_batches)
    return GpuDecodeLoaders(DecodedBatches(train, recipe.train_view, device, train_set.samples),
                            DecodedBatches(val, recipe.eval_view, device, val_set.samples), sampler)


# %%
import time
import warnings

from torchvision.io import ImageReadMode, decode_jpeg, read_file

from convit_edu.augment import augmentation, build_transforms
from convit_edu.dali import DALI_INSTALL, DaliLoaders, dali_available
from convit_edu.datasets import build_datasets
from convit_edu.image_files import load_rgb
from convit_edu.loaders import build_loaders
from convit_edu.photographs import tiny_imagenet

torch.manual_seed(0)
warnings.filterwarnings("ignore", message=".*os.fork.*")  # fork + threads notice from workers, not ours

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now) Chapter 14's images: the first four classes.
TINY = tiny_imagenet("../data")
train_ds, val_ds, _ = build_datasets("imagefolder", TINY, max_classes=4)

# %% [markdown]
# The loader. With `interpolation="nearest"` nothing rounds differently, so a batch must be torchvision's own train
# transform of each file under its sample's seed; and an epoch resumed at the second batch, after an iterator that
# handed out three and fetched more ahead, the same batches.

# %%
near = augmentation("deit", 48, interpolation="nearest")
gpu = build_gpu_decode_loaders(train_ds, val_ds, near, batch_size=16, num_workers=0, device="cpu")
images, labels = next(gpu.epoch(1))
on_decoded = build_datasets("imagefolder", TINY, train_transform=build_transforms(near, on_device=True)[0],
                            max_classes=4)[0]
on_decoded.loader = lambda path: decode_jpeg(read_file(path), mode=ImageReadMode.RGB)  # torchvision decodes, not PIL
expected = [SeededSamples(on_decoded, seed=0)[key] for key in list(gpu.sampler)[:16]]  # each under its sample's seed
assert torch.equal(images, torch.stack([x for x, _ in expected])) and labels.tolist() == [y for _, y in expected]
first = [batch for _, batch in zip(range(3), gpu.epoch(2))]  # batch 3 fetched ahead, never handed out
resumed = gpu.epoch(2, start=16)  # this rank's sample 16 on: from the second batch
assert all(torch.equal(a, b) for batch in first[1:] for a, b in zip(batch, next(resumed)))
resumed.close()  # a consumer that stops early closes its iterator, which stops the thread
print("nearest: torchvision's crop, flip and RandAugment of each file under its seed, exactly; resumed: the same")

# %% [markdown]
# The order, written down by `RecordingStreams` for the last three batches of an epoch (on the CPU the stand-in changes
# nothing but the log; the view, which runs right after the decode in the same call, writes which stream is current).
# Each thread's own order is fixed; how the two interleave is not, except where one waits for the other: a batch is
# handed out only after its event is recorded, and the training thread never drains a stream.

# %%
gpu.train.streams = recorder = RecordingStreams()
train_view = gpu.train.view


def logged_view(images: list, batch: dict) -> torch.Tensor:
    recorder.write("view", recorder.current_stream().name)
    return train_view(images, batch)


gpu.train.view = logged_view
handed = list(gpu.epoch(3, start=len(gpu.sampler) - 48))
names = {id(t): f"{kind} {n}" for n, batch in enumerate(handed) for kind, t in zip(("images", "labels"), batch)}
decoder, consumer = ([(call, *[names.get(id(a), a) for a in args]) for name, call, *args in recorder.log
                      if name == thread] for thread in ("gpu-decode", threading.main_thread().name))
assert decoder == [("current", "side")] + [c for n in range(3) for c in (
    ("synchronize", "side"), ("view", "side"), ("record", f"ready {n}", "side"))]
assert consumer == [c for n in range(3) for c in (("wait_event", "consumer", f"ready {n}"),
                                                  ("record_stream", f"images {n}", "consumer"),
                                                  ("record_stream", f"labels {n}", "consumer"))]
assert "gpu-decode" not in {t.name for t in threading.enumerate()}  # the thread ended with the epoch
say = {"current": "{} current", "synchronize": "drain {}", "view": "decode, view on {}", "record": "record {} on {}",
       "wait_event": "{} waits for {}", "record_stream": "record_stream({}, {})"}
for thread, calls, first in (("decode thread", decoder, 1), ("training thread", consumer, 0)):
    print(f"{thread}:", *(["  " + say[calls[0][0]].format(*calls[0][1:])] if first else []), sep="\n")
    for n in range(3):
        three = calls[first + 3 * n : first + 3 * n + 3]
        print(f"  batch {n}: " + " · ".join(say[call].format(*args) for call, *args in three))

# %% [markdown]
# Images/s of each loader (they change from run to run and with the CPU; DALI's committed ones, AMD EPYC (Zen 3, AVX2,
# 2 cores), nothing else running: 1,330 img/s for torchvision against 1,239; three runs: 1,330–1,614, 1,154–1,240;
# Intel Xeon model 207, AVX-512: 2,321 against 2,237: about level on a CPU; gpu-decode's device is this process here),
# then gpu-decode against the torchvision loader's batch (the same choices) and `build_transforms`' eval view (PIL).

# %%
# NBVAL_IGNORE_OUTPUT
# (timings; and whether DALI is installed)
def images_per_s(batches: Iterator, count: int, batch_size: int) -> float:
    next(batches)  # start-up (pipeline build, worker start) is a one-off cost: not counted
    t0 = time.perf_counter()
    for _ in range(count):
        next(batches)
    return count * batch_size / (time.perf_counter() - t0)


aug64, batch, threads = augmentation("deit", 64), 64, 2
torch.set_num_threads(1)  # this process plays gpu-decode's device: 2 threads would fight its workers for the 2 cores
train_tf, eval_tf = build_transforms(aug64, on_device=True)
tv_set, tv_val, _ = build_datasets("imagefolder", TINY, train_transform=train_tf, val_transform=eval_tf, max_classes=4)
loaders = {"torchvision": build_loaders(tv_set, tv_val, batch_size=batch, num_workers=threads),
           "gpu-decode": build_gpu_decode_loaders(tv_set, tv_val, aug64, batch_size=batch, num_workers=threads,
                                                  device="cpu")}
if dali_available():
    loaders["dali"] = DaliLoaders(tv_set, tv_val, aug64, batch_size=batch, num_threads=threads)
n_timed = min(3 if FAST else 12, len(tv_set) // batch - 1)
speeds = {name: images_per_s(l.epoch(0), n_timed, batch) for name, l in loaders.items()}
print(", ".join(f"{k}: {v:.0f} img/s" for k, v in speeds.items()), f"({threads} workers / threads, 64 px)",
      "" if dali_available() else f"(DALI not installed: {DALI_INSTALL})")
(ours, ours_labels), (theirs, their_labels) = (next(loaders[name].epoch(1)) for name in ("gpu-decode", "torchvision"))
assert torch.equal(ours_labels, their_labels) and (ours.float() - theirs).abs().mean() < 1  # levels of 255
pil = torch.stack([eval_tf(load_rgb(path)) for path, _ in tv_val.samples[: 2 * batch]])
assert ((next(iter(loaders["gpu-decode"].val))[0].float() - pil).abs() <= 3).all()  # the eval view, every pixel
