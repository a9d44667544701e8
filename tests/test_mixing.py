"""MixUp / CutMix pair image j with image B-1-j (the batch reversed), so the copies that repeated augmentation
puts side by side are (almost) never mixed with each other; CutMix pastes the partner's pixels into one box and
weighs the targets by its area; the mixing reads nothing back from the batch's device."""

import pytest
import torch
from torchvision.transforms import v2

from convit_edu.augment import MixupCutmix
from convit_edu.samplers import RepeatAugSampler

NUM_SAMPLES, BATCH = 3072, 64


def copy_pairs_per_batch(mix, world: int, repeats: int) -> float:
    """Images mixed with a copy of themselves, per batch of 64, over one epoch of every rank's stream. Each image's
    label is its index in the dataset (no smoothing, MixUp only): a row of soft targets with one non-zero class is
    an image whose partner is a copy."""
    copies, batches = 0, 0
    for rank in range(world):
        stream = torch.tensor(list(RepeatAugSampler(NUM_SAMPLES, world, rank, repeats=repeats)))
        for ids in stream[: len(stream) // BATCH * BATCH].view(-1, BATCH):
            _, targets = mix(torch.zeros(BATCH, 3, 1, 1), ids)
            copies, batches = copies + int(((targets > 0).sum(1) == 1).sum()), batches + 1
    return copies / batches


@pytest.mark.parametrize("repeats", [2, 3, 4])
@pytest.mark.parametrize("world", [1, 2, 8])
def test_mixup_mixes_at_most_about_one_pair_of_copies_per_batch(world, repeats):
    torch.manual_seed(0)
    ours = MixupCutmix(NUM_SAMPLES, mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.0)
    assert copy_pairs_per_batch(ours, world, repeats) <= 2  # two images: one pair


@pytest.mark.parametrize("world, share", [(1, 2 / 3), (2, 1 / 3), (8, 0.0)])
def test_neighbour_pairing_mixes_copies_so_the_measurement_sees_the_problem(world, share):
    torch.manual_seed(0)
    neighbour = v2.MixUp(alpha=0.8, num_classes=NUM_SAMPLES)  # pairs image i with image i-1
    assert copy_pairs_per_batch(neighbour, world, repeats=3) / BATCH == pytest.approx(share, abs=0.02)


def test_cutmix_pastes_the_reversed_batch_into_one_box_weighted_by_its_area():
    torch.manual_seed(0)
    mix = MixupCutmix(5, mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.0)
    images, labels, boxes = torch.rand(5, 3, 12, 16), torch.arange(5), 0
    for _ in range(50):
        mixed, targets = mix(images, labels)
        pasted = (mixed != images).all(1)  # (B, H, W): pixels taken from the partner
        rows, cols = pasted[0].any(1).nonzero().flatten(), pasted[0].any(0).nonzero().flatten()
        box = torch.zeros(12, 16, dtype=torch.bool)
        if len(rows):
            box[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1] = True
        assert torch.equal(pasted[[0, 1, 3, 4]], box.expand(4, 12, 16))  # one box, the same in every image
        assert not pasted[2].any()  # the middle image is its own partner
        torch.testing.assert_close(mixed[:, :, box], images.flip(0)[:, :, box])
        area = box.float().mean()
        torch.testing.assert_close(targets[0], torch.tensor([1 - area, 0, 0, 0, area]))
        torch.testing.assert_close(targets[1, [1, 3]], torch.stack([1 - area, area]))
        boxes += bool(box.any())
    assert boxes > 40  # nearly every draw pastes something


def test_cutmix_pastes_as_much_as_torchvisions_cutmix_did():
    """The share of pasted pixels (λ corrected for clipping) has torchvision's mean and spread at 224 px."""
    torch.manual_seed(0)
    ours, theirs = MixupCutmix(2, mixup_alpha=0.0, cutmix_alpha=1.0), v2.CutMix(alpha=1.0, num_classes=2)
    images, labels = torch.zeros(2, 3, 224, 224), torch.tensor([0, 1])
    shares = torch.tensor([[1 - ours.draw(224, 224)[0], float(theirs(images, labels)[1][0, 1])] for _ in range(2000)])
    mean, std = shares.mean(0), shares.std(0)
    assert abs(mean[0] - mean[1]) < 5 * (2 * 0.19**2 / 2000) ** 0.5, mean  # 5 standard errors of the difference
    assert abs(std[0] - std[1]) < 0.02, std


def test_mixing_reads_nothing_back_from_the_device():
    """Tensors on the meta device have no values: any read-back (.item(), a CPU copy) would raise."""
    images, labels = torch.empty(4, 3, 8, 8, device="meta"), torch.empty(4, dtype=torch.long, device="meta")
    for mix in (MixupCutmix(10, cutmix_alpha=0.0), MixupCutmix(10, mixup_alpha=0.0)):
        mixed, targets = mix(images, labels)
        assert mixed.device.type == targets.device.type == "meta" and targets.shape == (4, 10)
