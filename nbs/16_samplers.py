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
# # Samplers: many processes, repeated augmentation, resuming mid-epoch
#
# The datasets of chapter 14 and the transforms of chapter 15 are read in an order, and at scale that order is
# dealt to many processes. This chapter writes the sampler that deals one epoch to any number of processes (with
# DeiT's repeated augmentation, and resumable in the middle of an epoch), its sibling for runs of many passes over
# a small training set, whose epochs are spans of a stream that cycles the data, then seeds every sample's
# augmentation by its place in that epoch, so that it does not depend on which loader worker draws it. Chapter 17
# builds the loaders on these.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp samplers
# Samplers for one process or many (repeated augmentation, resumable) and augmentation seeded per sample.

# %%
#| export
import itertools
import math
import random
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import BatchSampler, Dataset, Sampler

from convit_edu.checks import positive_int

# %%
from dataclasses import replace

from convit_edu.augment import AUGMENTATIONS, build_transforms
from convit_edu.datasets import SyntheticImages

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## One epoch for many processes
#
# With W processes (ranks), each must read a *disjoint* part of the epoch, and every rank must run the *same
# number of batches*, or the gradient all-reduce of the last step waits forever for the rank that ran out.
# `RepeatAugSampler` defines one **global stream** per epoch and deals it out round-robin: rank k takes
# positions k, k+W, k+2W, ... The stream is a permutation of the N indices seeded by `seed + epoch` (the same
# on every rank, so no communication is needed), padded by wrapping around to a multiple of W.
#
# **Repeated augmentation** (Hoffer et al. 2020, Berman et al. 2019; used by DeiT with ×3) repeats each index
# r times *in a row* in that stream: [a, a, a, b, b, b, ...]. The stream keeps the length of a normal epoch
# (⌈N/W⌉ per rank), so an epoch shows N/r distinct images, r times each, with independent augmentations. As
# consecutive positions go to consecutive ranks, the r copies land on r different ranks when W ≥ r, in the
# same global batch (unless they straddle the boundary between two).
#
# **One process.** The official DeiT sampler (`RASampler`) builds the same kind of ×3 stream, and on a single
# process its behaviour surprises users: each image appears three times *in one batch*, and an epoch covers a
# third of the data (the epoch is also rounded down to a multiple of 256 images). What we do: the same global
# stream, on purpose, at every world size. Because rank k takes every W-th position, the *global* batch of step
# s (the union over ranks) is always the contiguous slice s·B·W … (s+1)·B·W−1 of the stream. So one process
# with batch B·W sees exactly the same global batches as W ranks with batch B each: in both, the r copies share
# a global batch and an epoch covers N/r images — which is also what the official code does on 8 GPUs. Only
# where the copies sit differs (one process: side by side in its batch; W ≥ r: one per rank). Repeated
# augmentation is never on by surprise: `repeats` defaults to 1 (plain shuffling), and `unique_per_epoch`
# says how many distinct images an epoch shows.
#
# **Resuming.** `set_epoch(epoch, start)` sets the epoch (hence the permutation) and skips the first `start`
# samples of this rank's share, so a run stopped after b batches of batch size B resumes with
# `set_epoch(epoch, b·B)` on exactly the samples it would have seen next.

# %%
#| export
class RepeatAugSampler(Sampler[int]):
    """Distributed sampler with repeated augmentation; resumable within an epoch.

    The epoch's global stream is a permutation of ``range(num_samples)`` (seeded by ``seed + epoch``), each
    index repeated ``repeats`` times in a row, cut (or wrapped) to ``num_replicas · ⌈num_samples /
    num_replicas⌉`` positions; rank k takes positions k, k + num_replicas, ... ``len()`` is the same on every
    rank: ⌈num_samples / num_replicas⌉.
    """

    def __init__(self, num_samples: int, num_replicas: int = 1, rank: int = 0, repeats: int = 1,
                 shuffle: bool = True, seed: int = 0):
        positive_int("num_samples", num_samples)
        positive_int("num_replicas (the world size)", num_replicas)
        if not 0 <= positive_int("rank", rank, minimum=0) < num_replicas:
            raise ValueError(f"rank {rank!r} must lie in 0..{num_replicas - 1} for num_replicas {num_replicas}")
        positive_int("repeats (DeiT: 3; 1 turns it off)", repeats)
        self.num_samples, self.num_replicas, self.rank = num_samples, num_replicas, rank
        self.repeats, self.shuffle, self.seed = repeats, shuffle, seed
        self.epoch, self.start = 0, 0

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.num_replicas)

    @property
    def remaining(self) -> int:
        """Samples this rank still yields this epoch (``len(self) - start``)."""
        return len(self) - self.start

    @property
    def unique_per_epoch(self) -> int:
        """How many distinct samples one epoch shows over all ranks (about ``num_samples / repeats``)."""
        return len(set(self.global_stream(self.epoch).tolist()))

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Use the permutation of ``epoch`` and skip this rank's first ``start`` samples (mid-epoch resume).

        Call it before every epoch. ``len()`` stays the full epoch (so a loader's ``len`` does too);
        ``remaining`` is what this rank still yields.
        """
        if not positive_int("start", start, minimum=0) <= len(self):
            raise ValueError(f"start {start!r} must lie in 0..{len(self)} (samples of this rank already consumed "
                             "this epoch)")
        self.epoch, self.start = epoch, start

    def pass_order(self, p: int) -> torch.Tensor:
        """The indices in the order of pass ``p`` over the data: a permutation seeded by ``seed + p`` (or in order,
        without ``shuffle``), each index ``repeats`` times in a row."""
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + p))
        else:
            order = torch.arange(self.num_samples)
        return order.repeat_interleave(self.repeats)

    def global_stream(self, epoch: int) -> torch.Tensor:
        """All ranks' indices of ``epoch`` in stream order (rank k owns positions k, k + W, ...)."""
        stream = self.pass_order(epoch)
        total = len(self) * self.num_replicas
        if len(stream) < total:  # only without repeats: wrap around, as DistributedSampler pads
            stream = stream.repeat(math.ceil(total / len(stream)))
        return stream[:total]

    def __iter__(self) -> Iterator[int]:
        mine = self.global_stream(self.epoch)[self.rank :: self.num_replicas]
        return iter(mine[self.start :].tolist())

# %% [markdown]
# Twelve images, one to three ranks, without and with repeated augmentation (epoch 0, seed 0). Every rank gets
# the same number of samples; with ×3 each of 4 images appears three times, on three different ranks when there
# are three of them:

# %%
for repeats in (1, 3):
    for world in (1, 2, 3):
        ranks = [RepeatAugSampler(12, world, r, repeats=repeats) for r in range(world)]
        print(f"repeats {repeats}, world {world}: " + " | ".join(" ".join(f"{i:2d}" for i in s) for s in ranks))
    print(f"  distinct images per epoch: {ranks[0].unique_per_epoch} of 12")

# %% [markdown]
# The claims of the design, checked: ranks partition the stream; the global batch of each step is the same for
# every world size at equal global batch; a new epoch reshuffles; `set_epoch(epoch, start)` resumes exactly.

# %%
N, GLOBAL_BATCH = 96, 24
single = RepeatAugSampler(N, repeats=3)
single.set_epoch(4)
stream = list(single)
for world in (2, 3, 4):
    ranks = [RepeatAugSampler(N, world, r, repeats=3) for r in range(world)]
    for s in ranks:
        s.set_epoch(4)
    per_rank = [list(s) for s in ranks]
    assert {len(p) for p in per_rank} == {N // world}
    b = GLOBAL_BATCH // world
    for step in range(N // GLOBAL_BATCH):
        step_batch = sorted(i for p in per_rank for i in p[step * b : (step + 1) * b])
        assert step_batch == sorted(stream[step * GLOBAL_BATCH : (step + 1) * GLOBAL_BATCH])
single.set_epoch(5)
assert list(single) != stream
resumed = RepeatAugSampler(N, repeats=3)
resumed.set_epoch(4, start=40)
assert list(resumed) == stream[40:] and resumed.remaining == N - 40 and len(resumed) == N
print("global batches independent of the world size; reshuffled per epoch; exact mid-epoch resume")

# %% [markdown]
# On ImageNet-1k, what an epoch is under each sampler. The official `RASampler` gives each rank
# ⌊⌊N/256⌋·256 / W⌋ samples (so a few images are dropped each epoch) drawn from the ×3 stream; ours gives each
# rank ⌈N/W⌉. Both cover about a third of the images per epoch, three times each, at *every* world size — that
# is what repeated augmentation with an unchanged epoch length means, not a single-process accident. The only
# single-process difference is where the copies sit: with one rank, in the same batch.

# %%
def official_ra_share(n: int, world: int, rank: int, epoch: int = 0) -> list[int]:
    """What DeiT's RASampler gives one rank (described, not its code): each index of a seeded permutation
    three times in a row, padded to a multiple of the world size, every world-th position from rank on,
    cut to ⌊⌊n/256⌋·256 / world⌋ samples."""
    stream = torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).repeat_interleave(3).tolist()
    per_rank = math.ceil(3 * n / world)
    stream += stream[: per_rank * world - len(stream)]
    return stream[rank : per_rank * world : world][: (n // 256 * 256) // world]


n = 5120
for world in (1, 8):
    shares = [official_ra_share(n, world, r) for r in range(world)]
    seen = [i for share in shares for i in share]
    assert len(set(seen)) == math.ceil(n / 3)  # a third of the data, at any world size
    print(f"official, world {world}: {len(seen)} samples per epoch, {len(set(seen))} distinct of {n}")
one = official_ra_share(n, 1, 0)
assert one[:3] == [one[0]] * 3  # one process: the three copies side by side, in the same batch

# %%
N_IMAGENET = 1_281_167
print(f"{'world':>5} {'official/rank':>14} {'ours/rank':>10} {'distinct images per epoch (ours)':>34}")
for world in (1, 8, 64):
    official = (N_IMAGENET // 256 * 256) // world
    ours = RepeatAugSampler(N_IMAGENET, world, repeats=3)
    print(f"{world:>5} {official:>14,} {len(ours):>10,} {ours.unique_per_epoch:>34,}")
assert RepeatAugSampler(N_IMAGENET, repeats=3).unique_per_epoch == math.ceil(N_IMAGENET / 3)

# %% [markdown]
# ## Epochs without an end of pass: a stream that cycles the data
#
# Table 2's f = 0.1 on a GPU trains on 1 400 images at a batch of 128: ten steps make a pass, and a run of thousands of
# steps makes hundreds of passes. If an epoch is a pass, each of them ends by draining the loader and starting it
# again, and the device waits for the first batch of every epoch (on the H100 of `nbs/results/gpu/real-width/`, about
# 0.2 s at each of 923 epoch ends). `CyclingSampler` takes the epoch boundary away from the passes. Its stream is the
# passes one after another with nothing between them — pass p a permutation seeded by `seed + p`, each index
# `repeats` times in a row — dealt to the ranks as `RepeatAugSampler` deals its epoch (rank k takes positions k,
# k + W, …), and an *epoch* is the next `length` samples of every rank: any span of steps the run likes, typically
# the steps between two evaluations (chapter 21's `epoch_steps`). A batch may hold the end of one pass and the start
# of the next; every image is still seen once per pass, and the stream does not depend on the world size.
# `set_epoch(epoch, start)` places a rank anywhere in it, so a run stopped mid-pass resumes exactly. The passes are
# drawn one at a time as the loader reads, so an epoch may span any number of them.

# %%
#| export
class CyclingSampler(RepeatAugSampler):
    """``RepeatAugSampler``'s dealing over a stream with no epoch boundary: the passes ``pass_order(0)``,
    ``pass_order(1)``, … one after another, rank k taking positions k, k + W, … (W = ``num_replicas``). An epoch is
    ``length`` samples of every rank: epoch e holds the stream's positions e·L·W to (e + 1)·L·W − 1 (L = ``length``).
    ``len()`` is ``length`` on every rank."""

    def __init__(self, num_samples: int, length: int, num_replicas: int = 1, rank: int = 0, repeats: int = 1,
                 shuffle: bool = True, seed: int = 0):
        super().__init__(num_samples, num_replicas, rank, repeats, shuffle, seed)
        self.length = positive_int("length (samples per process and epoch)", length)

    def __len__(self) -> int:
        return self.length

    def _positions(self, first: int, stop: int, every: int) -> Iterator[int]:
        """The indices at stream positions first, first + every, … below stop, drawn pass by pass."""
        per_pass = self.num_samples * self.repeats
        while first < stop:
            p = first // per_pass
            taken = self.pass_order(p)[first - p * per_pass : min(stop, (p + 1) * per_pass) - p * per_pass : every]
            yield from taken.tolist()
            first += every * len(taken)

    def global_stream(self, epoch: int) -> torch.Tensor:
        """All ranks' indices of ``epoch`` in stream order (rank k owns positions k, k + W, ...)."""
        span = self.length * self.num_replicas
        return torch.tensor(list(self._positions(epoch * span, (epoch + 1) * span, 1)))

    def __iter__(self) -> Iterator[int]:
        world = self.num_replicas
        first = self.rank + world * (self.epoch * self.length + self.start)
        return self._positions(first, world * (self.epoch + 1) * self.length, world)

# %% [markdown]
# Ten images, epochs of 7 samples on each of two ranks: rank 0 takes the stream's even positions, rank 1 its odd ones,
# and each pass is a permutation of the ten however the epochs cut it. The claims, checked: the epochs of each world
# size read one after another are the passes; the global batches do not depend on the world size; `set_epoch(epoch,
# start)` resumes mid-pass exactly; an epoch may span many passes.

# %%
ranks = [CyclingSampler(10, 7, 2, rank) for rank in range(2)]
for epoch in range(3):
    for s in ranks:
        s.set_epoch(epoch)
    print(f"epoch {epoch}: " + " | ".join(" ".join(f"{i}" for i in s) for s in ranks))

# %%
N, LENGTH, GLOBAL_BATCH = 10, 12, 12
single = CyclingSampler(N, LENGTH)
stream = []
for epoch in range(5):
    single.set_epoch(epoch)
    stream += list(single)
passes = [stream[p * N : (p + 1) * N] for p in range(len(stream) // N)]
assert all(sorted(p) == list(range(N)) for p in passes) and passes[0] != passes[1]
for world in (2, 3, 4):
    ranks = [CyclingSampler(N, LENGTH // world, world, rank) for rank in range(world)]
    b = GLOBAL_BATCH // world
    for epoch in range(5):
        for s in ranks:
            s.set_epoch(epoch)
        per_rank = [list(s) for s in ranks]
        assert {len(p) for p in per_rank} == {LENGTH // world}
        step_batch = sorted(i for p in per_rank for i in p[:b])
        assert step_batch == sorted(stream[epoch * GLOBAL_BATCH : (epoch + 1) * GLOBAL_BATCH])
resumed = CyclingSampler(N, LENGTH)
resumed.set_epoch(3, start=5)  # 41 samples in: mid-pass
assert list(resumed) == stream[3 * LENGTH + 5 : 4 * LENGTH] and resumed.remaining == LENGTH - 5
long = CyclingSampler(N, 1_000_000)
long.set_epoch(2)
first = list(itertools.islice(long, 3 * N))
assert all(sorted(first[p * N : (p + 1) * N]) == list(range(N)) for p in range(3))
print(f"{len(passes)} passes over {N} images in 5 epochs of {LENGTH}: each a permutation; global batches "
      "independent of the world size; exact mid-pass resume; an epoch of a million samples drawn pass by pass")

# %% [markdown]
# Validation is sharded differently: each image once, no repeats and no padding, so that the sums of chapter 25's
# evaluation over the processes are exact. `val_shard` is that share, used by every loader and by `evaluate`.

# %%
#| export
def val_shard(n: int, rank: int, num_replicas: int) -> range:
    """The validation samples of process ``rank`` of ``num_replicas`` among ``n``: every ``num_replicas``-th from
    ``rank`` on, each sample in exactly one process's share, none twice."""
    return range(rank, n, num_replicas)

# %%
shares = [val_shard(10, rank, 3) for rank in range(3)]
assert sorted(i for share in shares for i in share) == list(range(10))
print("10 validation images on 3 processes:", [list(share) for share in shares])

# %% [markdown]
# ## Augmentation that does not depend on the worker
#
# A loader worker draws its augmentation from its own generator, so which crop an image gets depends on which
# worker read it, and on everything that worker read before. That breaks two promises of the training loop
# (chapters 21-28): the same run at any number of workers, and a resumed run identical to an uninterrupted one.
# The fix is to seed every sample by *where it stands in the run*: the sampler yields keys (epoch, position in
# the epoch's global stream, index) — rank k of W reads positions k, k + W, … of the one stream
# `RepeatAugSampler` deals — and the dataset wrapper reads `dataset[index]` with torch's and Python's generators
# seeded from (seed, epoch, position): a pure function of the run's coordinates, whatever worker and however many
# processes read it.

# %%
#| export
def seed_from(*keys: int) -> int:
    """A well-mixed 32-bit seed from a tuple of non-negative integers (numpy's SeedSequence)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1)[0])


class KeyedSampler(Sampler):
    """Wraps a ``RepeatAugSampler`` (or a ``CyclingSampler``) so that it yields (epoch, global position in the epoch,
    index) keys for ``SeededSamples``."""

    def __init__(self, sampler: RepeatAugSampler):
        self.sampler, self.epoch, self.start = sampler, 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """As ``RepeatAugSampler.set_epoch``: the permutation of ``epoch``, skipping this rank's first ``start``."""
        self.sampler.set_epoch(epoch, start)
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        rank, world = self.sampler.rank, self.sampler.num_replicas
        for i, index in enumerate(self.sampler):
            yield self.epoch, rank + world * (self.start + i), int(index)

    def __len__(self) -> int:
        return len(self.sampler)


class SeededSamples(Dataset):
    """Reads ``dataset[index]`` with torch's and Python's generators seeded from the sample's key."""

    def __init__(self, dataset: Dataset, seed: int):
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int, int]):
        epoch, position, index = key
        s = seed_from(self.seed, epoch, position)
        python_state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(s)  # CPU only: fork_rng restores the CPU generator
            random.seed(s)
            try:
                return self.dataset[index]
            finally:
                random.setstate(python_state)

# %% [markdown]
# Twenty-four synthetic images with the DeiT recipe at 32 px, dealt to two ranks: the keys' positions partition the
# epoch's stream, and reading a key again gives the same augmented image (another position, another augmentation of
# the same image), whatever happened in between. Chapter 17 checks the same through loaders with and without workers.

# %%
samples = SeededSamples(SyntheticImages(24, 4, 48, transform=build_transforms(replace(AUGMENTATIONS["deit"],
                                                                                      img_size=32))[0]), seed=3)
keyed = [KeyedSampler(RepeatAugSampler(24, 2, rank, repeats=3, seed=5)) for rank in range(2)]
for k in keyed:
    k.set_epoch(1)
keys = [key for k in keyed for key in k]
assert sorted(position for _, position, _ in keys) == list(range(24))
print("rank 0's first keys (epoch, position, index):", list(keyed[0])[:4])
copy = next(key for key in keys if key[2] == keys[0][2] and key[1] != keys[0][1])  # another copy of that image
first, other, again = samples[keys[0]][0], samples[copy][0], samples[keys[0]][0]
assert torch.equal(first, again) and not torch.equal(first, other)
print(f"key {keys[0]} read twice: the same crop; key {copy} (the same image): another")

# %% [markdown]
# ## An epoch of few batches, loaded by many workers
#
# A loader hands each worker whole batches, in turn. When an epoch holds fewer batches than there are workers (a
# small training set at a large batch: the 350 images of the grid's f = 0.1 at a batch of 256 make one), the
# other workers idle and each epoch begins by waiting for one worker to decode and augment a whole batch. On an
# H200 with 15 workers that wait was 0.25 s of each 0.28 s step, for 923 epochs (`nbs/results/gpu/real-width/`).
# `SplitBatches` cuts every batch into `parts` consecutive pieces, so `parts` workers load one batch together;
# `JoinedBatches` reads the pieces `parts` at a time and puts each batch back together. Since each sample's
# augmentation is seeded by its key, not by the worker that reads it, the joined batches are the batches.

# %%
#| export
class SplitBatches(Sampler[list]):
    """The batches of ``batches`` (full ones: ``drop_last``), each cut into ``parts`` consecutive pieces of
    nearly equal size, for a loader whose workers then share a batch; ``JoinedBatches`` rejoins them."""

    def __init__(self, batches: BatchSampler, parts: int):
        positive_int("parts", parts)
        if not batches.drop_last or parts > batches.batch_size:
            raise ValueError(f"parts {parts} must be at most the batch size {batches.batch_size}, and the last "
                             "incomplete batch dropped (drop_last), so that every batch has `parts` pieces")
        self.batches, self.parts = batches, parts

    def __iter__(self) -> Iterator[list]:
        for batch in self.batches:
            cuts = [len(batch) * i // self.parts for i in range(self.parts + 1)]
            yield from (batch[a:b] for a, b in itertools.pairwise(cuts))

    def __len__(self) -> int:
        return len(self.batches) * self.parts


class JoinedBatches:
    """The batches of ``pieces`` (a loader over ``SplitBatches``), ``parts`` pieces at a time joined along the
    batch (``torch.cat`` of each field), then pinned when ``pin_memory``."""

    def __init__(self, pieces: Iterable, parts: int, pin_memory: bool = False):
        self.pieces, self.parts, self.pin_memory = pieces, parts, pin_memory

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        stream = iter(self.pieces)
        for first in stream:
            batch = [torch.cat(field) for field in zip(first, *itertools.islice(stream, self.parts - 1))]
            yield [t.pin_memory() for t in batch] if self.pin_memory else batch

    def __len__(self) -> int:
        return len(self.pieces) // self.parts

# %% [markdown]
# Rank 0's epoch above in batches of 6, each cut in 3 pieces, read as a loader would and joined again: the same
# batches as read whole.

# %%
from torch.utils.data import default_collate

whole = [default_collate([samples[key] for key in batch]) for batch in BatchSampler(keyed[0], 6, True)]
split = SplitBatches(BatchSampler(keyed[0], 6, True), 3)
pieces = [default_collate([samples[key] for key in piece]) for piece in split]
print(f"{len(whole)} batches of 6; {len(pieces)} pieces of {[len(p[1]) for p in pieces[:3]]}")
joined = list(JoinedBatches(pieces, 3))
assert len(joined) == len(whole) and all(torch.equal(a, b) for j, w in zip(joined, whole) for a, b in zip(j, w))
print("joined again: the same batches")
