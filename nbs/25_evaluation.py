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
# # Evaluation: exact over any number of processes, and under test-time masks
#
# The scores of a model (and of its EMA) on a validation set, split over processes and summed exactly, with a
# loader whose workers survive a pre-emption signal; and the paper's test-time masking experiments (SM F,
# Tables 5 and 6) as a table of those scores.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp evaluation
# Evaluation over processes (loss, top-1, top-5; model and EMA in one pass), and scores under test-time masks.

# %%
#| export
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, Subset

from convit_edu.devices import autocast, resolve_precision
from convit_edu.distributed import all_reduce
from convit_edu.augment import DeviceTransforms, finish_batch
from convit_edu.loaders import build_loader
from convit_edu.masking import mask_at_test_time
from convit_edu.samplers import val_shard

# %%
import os
import signal

import torch
from torch import nn
from torch.utils.data import Dataset

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Evaluation
#
# Each process evaluates every `world_size`-th image of the validation set and the sums (loss, top-1 and top-5
# hits, count) are all-reduced, so the accuracy is exact at any world size: no sample is padded in twice, as
# happens with a `DistributedSampler` whose dataset does not divide evenly. Given a dict of models — the model
# and its EMA at an epoch's end — one pass over the data scores them all (an ImageNet validation pass is
# minutes of decoding; the loop also gives it the run's loader workers and twice the training batch), and the
# sums of all of them travel in one all-reduce: one wait for the device per evaluation.
#
# Its loader is chapter 17's `build_loader` (dataset order, the last batch kept), whose workers ignore SIGTERM and
# SIGINT as the training loader's do. A pre-emption signals every process of the job, and it may come during an
# evaluation; a worker that died of it would crash the run there. Instead the signal only raises the loop's
# flag (below): the evaluation finishes, then the loop writes `last.pt` and stops.

# %%
#| export
def evaluate(model: nn.Module | dict[str, nn.Module], dataset: Dataset | Iterable, *, batch_size: int = 256,
             device: str | torch.device = "cpu", precision: str = "fp32", num_workers: int = 0, rank: int = 0,
             world_size: int = 1, finish: DeviceTransforms | None = None) -> dict[str, float] | dict[str, dict[str, float]]:
    """Mean cross-entropy, top-1 and top-5 accuracy (in %) of `model` on `dataset`, summed over processes. Given
    a dict of models (the model and its EMA), scores each of them in the same pass over the data. `dataset` may
    also be an iterable of this process's (images, labels) batches (the DALI loader's `val`). A dataset of
    uint8 images (`build_transforms(cfg, on_device=True)`) needs `finish`, which normalises them on the device."""
    models = model if isinstance(model, dict) else {"": model}
    device = torch.device(device)
    precision = resolve_precision(precision, device)
    if isinstance(dataset, Dataset):
        part = Subset(dataset, val_shard(len(dataset), rank, world_size))
        loader = build_loader(part, batch_size, None, num_workers=num_workers, seed=0, drop_last=False,
                              pin_memory=device.type == "cuda")  # its workers ignore SIGTERM, as training's do
    else:  # this process's batches already (the DALI loader's `val`)
        loader = dataset
    modes = {name: m.training for name, m in models.items()}
    sums = torch.zeros(len(models), 3, dtype=torch.float64, device=device)  # loss, top-1 and top-5 hits
    images_seen = 0  # counted on the host: a count made on the device would cost a host-to-device copy per batch
    with torch.no_grad():
        for m in models.values():
            m.eval()
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            images = finish_batch(images, finish, train=False)
            for i, m in enumerate(models.values()):
                with autocast(device, precision):
                    logits = m(images).float()
                top = logits.topk(min(5, logits.shape[1]), dim=1).indices
                sums[i] += torch.stack([
                    F.cross_entropy(logits, labels, reduction="sum"), (top[:, 0] == labels).sum(),
                    (top == labels[:, None]).any(dim=1).sum()]).double()
            images_seen += len(labels)
    for name, m in models.items():
        m.train(modes[name])
    counts = torch.full((len(models), 1), float(images_seen), dtype=torch.float64, device=device)
    rows = all_reduce(torch.cat([sums, counts], dim=1)).tolist()  # the one host sync of an evaluation
    if rows[0][3] == 0:
        raise ValueError("the evaluation set is empty")
    scores = {name: {"loss": loss / n, "top1": 100 * top1 / n, "top5": 100 * top5 / n}
              for name, (loss, top1, top5, n) in zip(models, rows)}
    return scores if isinstance(model, dict) else scores[""]

# %% [markdown]
# Each batch is finished on the device before the model sees it: `finish_batch`, which the training step uses too.
# It is the end of the augmentation, so it lives in `convit_edu.augment` with chapter 17's `DeviceTransforms`.

# %%
#| export augment
import torch

from convit_edu.augment import DeviceTransforms


def finish_batch(images: torch.Tensor, finish: DeviceTransforms | None, train: bool) -> torch.Tensor:
    """A batch on the device ready for the model: uint8 images normalised (and, for training, erased) by
    `finish`; float images, already prepared by their dataset's transform, as they are."""
    if images.dtype != torch.uint8:
        return images
    if finish is None:
        raise ValueError("the dataset gives uint8 images (build_transforms(cfg, on_device=True)) but no "
                         "DeviceTransforms was given to normalise them: pass finish=DeviceTransforms(cfg)")
    return finish.train(images) if train else finish.eval(images)


# %% [markdown]
# The check: a dataset that sends SIGTERM to the worker loading it, at every image. `evaluate` with two workers
# gets through it, with the scores of an evaluation in this process of the same data (a worker with torch's own
# handlers would die at its first image and `evaluate` would raise "DataLoader worker ... killed by signal").

# %%
from torch.utils.data import TensorDataset


class SignalsItsLoader(Dataset):
    """Each item first sends SIGTERM to the loader worker reading it, as a pre-emption signals every process."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        assert torch.utils.data.get_worker_info() is not None, "only in a loader worker: this would stop the kernel"
        os.kill(os.getpid(), signal.SIGTERM)
        return self.base[i]


data = TensorDataset(torch.randn(32, 8), torch.arange(32) % 4)
probe = nn.Linear(8, 4)
signalled = evaluate(probe, SignalsItsLoader(data), batch_size=8, num_workers=2)
assert signalled == evaluate(probe, data, batch_size=8)
print("32 SIGTERMs to evaluate's 2 loader workers: all ignored, the scores those of an evaluation in one process")


# %% [markdown]
# ## Masking at test time (SM F, Tables 5 and 6)
#
# `masking.mask_at_test_time` (chapter 10) removes parts of a trained model for the duration of a `with`
# block: the absolute positional embedding (Table 5), or the content (σ(λ) := 1) or the positional
# (σ(λ) := 0) attention of the first k GPSA layers (Table 6). `masking_table` evaluates all of them with
# `evaluate`; for a DeiT only the first two rows exist.

# %%
#| export
def masking_table(model: nn.Module, dataset: Dataset, layer_counts: list[int] = (), **eval_kwargs) -> dict[str, float]:
    """Top-1 (%) of ``model`` on ``dataset`` with nothing masked ("no mask"), with the absolute positional
    embedding masked ("mask pos embed", Table 5), and for each k of ``layer_counts`` with the content
    ("mask content, first k") or the positional ("mask position, first k") attention of the first k GPSA
    layers masked (Table 6). ``eval_kwargs`` go to ``evaluate`` (batch_size, device, precision)."""
    table = {"no mask": evaluate(model, dataset, **eval_kwargs)["top1"]}
    with mask_at_test_time(model, mask_pos_embed=True):
        table["mask pos embed"] = evaluate(model, dataset, **eval_kwargs)["top1"]
    for k in layer_counts:
        for what, gate in (("content", 1.0), ("position", 0.0)):
            with mask_at_test_time(model, gate=gate, num_layers=k):
                table[f"mask {what}, first {k}"] = evaluate(model, dataset, **eval_kwargs)["top1"]
    return table


def format_masking(tables: dict[str, dict[str, float]]) -> str:
    """The tables of several models as columns (one row per masking), '-' where a model has no such row."""
    names = list(tables)
    keys = list(dict.fromkeys(k for t in tables.values() for k in t))
    lines = [f"{'top-1 (%)':<26}" + "".join(f"{n:>12}" for n in names)]
    for key in keys:
        cells = [f"{tables[n][key]:>12.1f}" if key in tables[n] else f"{'-':>12}" for n in names]
        lines.append(f"{key:<26}" + "".join(cells))
    return "\n".join(lines)

# %% [markdown]
# On a small fresh ConViT and random images, the table's rows; masking
# undoes itself on leaving each `with` block, so "no mask" is the model's plain score.

# %%
from convit_edu.zoo import create_model

torch.manual_seed(0)
small = create_model("convit_tiny", img_size=16, patch_size=4, embed_dim=48, num_heads=4, depth=2,
                     local_up_to_layer=1, num_classes=4)
images, labels = torch.randn(24, 3, 16, 16), torch.arange(24) % 4
table = masking_table(small, TensorDataset(images, labels), layer_counts=[1], batch_size=8)
assert list(table) == ["no mask", "mask pos embed", "mask content, first 1", "mask position, first 1"]
assert table["no mask"] == evaluate(small, TensorDataset(images, labels), batch_size=8)["top1"]
print(list(table))
