"""The device end of the data pipeline: RandomErasing drawn on the batch's device with torchvision's statistics,
constants made once per device, no host synchronisation; and how many loader workers a process gets."""

import math
import os

import pytest
import torch
from torchvision.transforms import v2

from convit_edu.augment import DeviceTransforms, augmentation, erasing_boxes
from convit_edu.loaders import default_num_workers

SIZE = (40, 60)  # not square: a box's h/w is told apart from its w/h


def box_statistics(masks: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Whether each (H, W) mask holds a box, and of each box: its share of the area, log(h/w) and its top and
    left position as a share of the room it had."""
    erased = masks.flatten(1).any(1)
    boxes = masks[erased]
    in_rows, in_cols = boxes.any(2), boxes.any(1)
    h, w = in_rows.sum(1), in_cols.sum(1)
    top, left = in_rows.float().argmax(1), in_cols.float().argmax(1)
    return erased.double(), {
        "area share": (h * w / (SIZE[0] * SIZE[1])).double(), "log h/w": (h / w).log().double(),
        "top": ((top + 0.5) / (SIZE[0] - h + 1)).double(), "left": ((left + 0.5) / (SIZE[1] - w + 1)).double()}


def torchvision_masks(n: int, p: float, scale: tuple[float, float], ratio: tuple[float, float]) -> torch.Tensor:
    """The boxes torchvision's RandomErasing (noise fill) erases in ``n`` zero images."""
    erase = v2.RandomErasing(p=p, scale=scale, ratio=ratio, value="random")
    return torch.stack([erase(torch.zeros(1, *SIZE))[0] != 0 for _ in range(n)])


def assert_same_distribution(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Means, and the share of each sample below a few of our quantiles, agree within 4 standard errors."""
    n1, n2 = len(ours), len(theirs)
    se = math.sqrt(ours.var() / n1 + theirs.var() / n2)
    assert abs(ours.mean() - theirs.mean()) < 4 * se, f"{what}: means {ours.mean():.4f} vs {theirs.mean():.4f}"
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        x = ours.quantile(q)
        below = [((s < x).double().mean() + (s <= x).double().mean()) / 2 for s in (ours, theirs)]  # ties: half
        pooled = (below[0] * n1 + below[1] * n2) / (n1 + n2)
        se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
        assert abs(below[0] - below[1]) < 4 * se + 1e-12, f"{what} below {x:.4f}: {below[0]:.4f} vs {below[1]:.4f}"


@pytest.mark.parametrize("p, scale, ratio", [
    (0.5, (0.02, 1 / 3), (0.3, 3.3)),  # DeiT's ranges, at half the rate
    (1.0, (0.8, 0.95), (0.3, 3.3)),  # boxes that often do not fit in 10 tries
    (0.5, (0.02, 1 / 3), (1.5, 3.0)),  # tall boxes only: h and w swapped would show
])
def test_erasing_boxes_have_the_statistics_of_torchvisions_random_erasing(p, scale, ratio):
    n = 4000
    torch.manual_seed(0)
    ours = erasing_boxes(n, SIZE, p, scale=scale, ratio=ratio)
    torch.manual_seed(1)
    theirs = torchvision_masks(n, p, scale, ratio)
    (erased, ours_boxes), (erased_tv, their_boxes) = box_statistics(ours), box_statistics(theirs)
    assert_same_distribution(erased, erased_tv, "share of images erased")
    for what in ours_boxes:
        assert_same_distribution(ours_boxes[what], their_boxes[what], what)


def test_erasing_draws_only_on_the_batchs_device_and_reads_nothing_back():
    # On the meta device a tensor has no values: a host read (.item(), a copy to the CPU) or a CPU tensor mixed
    # into the computation would raise, so running there shows that neither happens.
    finish = DeviceTransforms(augmentation("deit", 32, erasing=1.0))
    images = torch.empty(8, 3, 32, 32, dtype=torch.uint8, device="meta")
    assert finish.train(images).device.type == "meta"
    assert erasing_boxes(8, (32, 32), 0.5, device="meta").device.type == "meta"


def test_erasing_follows_torchs_global_generator():
    torch.manual_seed(3)
    first = erasing_boxes(64, SIZE, 0.5)
    torch.manual_seed(3)
    assert torch.equal(erasing_boxes(64, SIZE, 0.5), first)


def test_eval_is_x_over_255_less_the_mean_over_the_std():
    cfg = augmentation("deit", 32)
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    mean, std = (torch.tensor(v, dtype=torch.float64)[:, None, None] for v in (cfg.mean, cfg.std))
    expected = (images.double() / 255 - mean) / std
    torch.testing.assert_close(DeviceTransforms(cfg).eval(images).double(), expected, rtol=0, atol=1e-6)


def test_the_constants_are_made_once_per_device():
    finish = DeviceTransforms(augmentation("deit", 32))
    images = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8)
    made = finish.constants(images.device)
    finish.eval(images)
    finish.train(images)
    assert all(a is b for a, b in zip(finish.constants(images.device), made))
    assert [c.shape for c in made] == [(3, 1, 1)] * 2 and made[0].device == images.device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_transforms_train_never_synchronises_with_the_host_on_cuda():
    finish = DeviceTransforms(augmentation("deit", 32, erasing=0.5))
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):  # the first call makes the constants: it must not synchronise either
            out = finish.train(images)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.is_cuda and out.dtype == torch.float32


# ------------------------------------------------------------------ how many loader workers


@pytest.mark.parametrize("cpus, processes, workers", [(2, 1, 1), (64, 8, 7), (8, 8, 0), (3, 4, 0)])
def test_default_num_workers_shares_the_cpus_among_the_nodes_processes(monkeypatch, cpus, processes, workers):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert default_num_workers({"LOCAL_WORLD_SIZE": str(processes)}) == workers


def test_default_num_workers_counts_one_process_without_torchrun(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    assert default_num_workers({}) == 3


def test_default_num_workers_falls_back_to_the_cpu_count_without_affinity(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert default_num_workers({"LOCAL_WORLD_SIZE": "2"}) == 2


@pytest.mark.parametrize("bad", ["0", "two", "-1"])
def test_default_num_workers_refuses_a_bad_local_world_size(bad):
    with pytest.raises(ValueError, match=f"LOCAL_WORLD_SIZE '{bad}'"):
        default_num_workers({"LOCAL_WORLD_SIZE": bad})
