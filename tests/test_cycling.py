"""Epochs of a stream that cycles the training set: chapter 16's CyclingSampler, chapter 17's loaders built on it, and
chapter 21's `epoch_steps`, which asks for it."""

import itertools

import pytest
import torch
from torch.utils.data import TensorDataset

from convit_edu.config import TrainConfig
from convit_edu.loaders import build_loaders
from convit_edu.samplers import CyclingSampler, RepeatAugSampler


def epochs_of(sampler: CyclingSampler, epochs: range, start: int = 0) -> list[int]:
    """Everything ``sampler`` yields over ``epochs``, the first from ``start`` on."""
    read = []
    for epoch in epochs:
        sampler.set_epoch(epoch, start if epoch == epochs.start else 0)
        read += list(sampler)
    return read


@pytest.mark.parametrize("repeats", [1, 3])
def test_the_epochs_read_one_after_another_are_the_passes_each_a_new_permutation(repeats):
    n, length = 10, 7  # epochs end anywhere in a pass
    stream = epochs_of(CyclingSampler(n, length, repeats=repeats, seed=4), range(10))
    per_pass = n * repeats
    passes = [stream[p * per_pass:(p + 1) * per_pass] for p in range(len(stream) // per_pass)]
    assert len(passes) == 70 // per_pass
    assert all(sorted(p) == sorted(list(range(n)) * repeats) for p in passes)  # each image once per pass (× repeats)
    assert all(p[i] == p[i + 1] for p in passes for i in range(0, per_pass, repeats) if repeats > 1)  # copies in a row
    assert len({tuple(p) for p in passes}) == len(passes)  # every pass its own permutation
    assert passes[0] == RepeatAugSampler(n, repeats=repeats, seed=4).pass_order(0).tolist()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_read_equal_disjoint_shares_and_the_global_batches_do_not_depend_on_the_world_size(world):
    n, global_batch, steps = 10, 12, 3  # a global batch longer than a pass
    alone = epochs_of(CyclingSampler(n, steps * global_batch), range(4))
    ranks = [CyclingSampler(n, steps * global_batch // world, world, rank) for rank in range(world)]
    for epoch in range(4):
        shares = []
        for s in ranks:
            s.set_epoch(epoch)
            shares.append(list(s))
        assert {len(share) for share in shares} == {steps * global_batch // world}  # no rank waits for another
        b = global_batch // world
        for step in range(steps):
            first = (epoch * steps + step) * global_batch
            assert sorted(i for share in shares for i in share[step * b:(step + 1) * b]) == sorted(
                alone[first:first + global_batch])


def test_a_stop_anywhere_in_a_pass_resumes_on_exactly_the_samples_that_came_next():
    n, length = 10, 12
    straight = epochs_of(CyclingSampler(n, length, 2, 1, seed=3), range(6))
    for epoch, start in ((0, 5), (2, 3), (4, 11), (5, 12)):  # in a pass, across the end of one, an epoch's end
        resumed = epochs_of(CyclingSampler(n, length, 2, 1, seed=3), range(epoch, 6), start)
        assert resumed == straight[epoch * length + start:]


def test_an_epoch_longer_than_any_list_is_drawn_pass_by_pass():
    sampler = CyclingSampler(5, 10**12)
    sampler.set_epoch(10**6, start=10**12 - 7)
    tail = list(iter(sampler))  # an epoch of 10¹² samples, its last 7, far into the stream
    assert len(tail) == 7 and set(tail) <= set(range(5)) and len(sampler) == 10**12
    assert len(list(itertools.islice(iter(CyclingSampler(5, 10**12)), 20))) == 20


def test_a_bad_length_or_start_is_refused_naming_it():
    with pytest.raises(ValueError, match="length \\(samples per process and epoch\\) must be at least 1, got 0"):
        CyclingSampler(10, 0)
    with pytest.raises(ValueError, match="start 8 must lie in 0..7"):
        CyclingSampler(10, 7).set_epoch(0, 8)


def test_the_loaders_cycle_with_epoch_samples_and_their_batches_cross_the_end_of_a_pass():
    images = torch.arange(10).float()[:, None].expand(10, 12).reshape(10, 3, 2, 2)
    data = TensorDataset(images, torch.arange(10))
    loaders = build_loaders(data, data, batch_size=4, num_workers=0, epoch_samples=12, seed=1)
    assert len(loaders.train) == 3 and isinstance(loaders.sampler.sampler, CyclingSampler)
    seen = [labels.tolist() for epoch in range(5) for _, labels in loaders.epoch(epoch)]
    stream = [i for batch in seen for i in batch]
    # 15 batches of 4 read on: 6 whole passes, though batches 3, 8 and 13 each hold the end of one and the start of
    # the next (a loader that dropped or padded at the end of a pass would break the passes after it)
    assert len(stream) == 60 and all(sorted(stream[p * 10:(p + 1) * 10]) == list(range(10)) for p in range(6))
    assert len(build_loaders(data, data, batch_size=4, num_workers=0).train) == 2  # without: 10 images, 2 batches


def test_epoch_steps_sets_the_epoch_and_the_samples_each_process_reads_and_needs_a_loader_that_cycles():
    cfg = TrainConfig(global_batch=128, accum_steps=2, epoch_steps=250)
    assert cfg.steps_per_epoch(1400) == 250 and cfg.steps_per_epoch(1400, world_size=4) == 250
    assert cfg.epoch_samples(world_size=4) == 250 * 2 * 16 and TrainConfig().epoch_samples() is None
    assert TrainConfig(global_batch=128).steps_per_epoch(1400) == 10  # one pass, the last partial batch dropped
    with pytest.raises(ValueError, match="epoch_steps must be at least 1, got 0"):
        TrainConfig(epoch_steps=0)
    with pytest.raises(ValueError, match="loader 'gpu-decode' cannot cycle the training images: epoch_steps 250 "
                                         "needs loader 'torchvision'"):
        TrainConfig(data="imagefolder", loader="gpu-decode", epoch_steps=250)
