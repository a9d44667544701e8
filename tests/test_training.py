"""Tests of convit_edu.training: learning, exact resume, crashes, signals, NaNs, DDP, bf16, distillation.

This file is also the worker script of its subprocess tests: `python tests/test_training.py MODE OUTPUT`
(and under `torchrun` for the two-process test), so the subprocesses and the tests share one definition
of the model, data and config.
"""

import errno
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset
from training_checks import StopAt, assert_same_weights

from convit_edu import (devices, distributed, evaluation, files, loaders, optimisation, run_records, run_state,
                        training)
from convit_edu.config import RECIPES, TrainConfig, recipe
from convit_edu.run_state import Callback, read_checkpoint, save_checkpoint
from convit_edu.training import train

ROOT = Path(__file__).resolve().parents[1]
NUM_CLASSES = 4


pytestmark = pytest.mark.usefixtures("one_thread")


class TinyNet(nn.Module):
    """A small image classifier with dropout (randomness inside the step) and a gated layer to log."""

    def __init__(self, hidden: int = 32, dropout: float = 0.1):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, hidden), nn.GELU(), nn.Dropout(dropout))
        self.gate = nn.Module()
        self.gate.gating_param = nn.Parameter(torch.ones(2))
        self.head = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x):
        return self.head(self.body(x) * torch.sigmoid(self.gate.gating_param).mean())

    def gate_means(self) -> list[float]:  # what the trainer logs of a model's gates, as VisionTransformer's
        return [torch.sigmoid(self.gate.gating_param).mean().item()]


class DistilledTinyNet(TinyNet):
    """Class and distillation heads: both logits in training mode, their average in eval mode (DeiT)."""

    def __init__(self):
        super().__init__()
        self.head_dist = nn.Linear(32, NUM_CLASSES)

    def forward(self, x):
        h = self.body(x)
        cls, dist = self.head(h), self.head_dist(h)
        return (cls, dist) if self.training else (cls + dist) / 2


class Noisy(Dataset):
    """Random augmentation drawn from torch's global generator, as torchvision transforms do."""

    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        return x + 0.1 * torch.randn_like(x), y


def make_data(n_train: int = 96, n_val: int = 32, nan_at: int | None = None):
    g = torch.Generator().manual_seed(0)
    patterns = torch.randn(NUM_CLASSES, 3, 8, 8, generator=g)
    y = torch.arange(n_train + n_val) % NUM_CLASSES
    x = patterns[y] + 2 * torch.randn(n_train + n_val, 3, 8, 8, generator=g)
    if nan_at is not None:
        x[nan_at] = float("nan")
    train_set = Noisy(TensorDataset(x[:n_train], y[:n_train]))
    return train_set, TensorDataset(x[n_train:], y[n_train:]), [f"c{i}" for i in range(NUM_CLASSES)]


def make_model(**kwargs) -> nn.Module:
    torch.manual_seed(0)
    return TinyNet(**kwargs)


def config(output, **changes) -> TrainConfig:
    base = TrainConfig(model="deit_tiny", model_args={"patch_size": 4}, aug="pad-crop-flip",
                       aug_args={"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing": 0.1},
                       epochs=2, batch_size=8, lr=0.5, warmup_epochs=0.5,
                       ema_decay=0.9, precision="fp32", device="cpu", num_workers=0, output=str(output),
                       progress="none", img_size=8)
    return replace(base, **changes)


def test_loss_falls_on_a_small_learnable_problem(tmp_path):
    result = train(config(tmp_path, epochs=6, aug_args={"mixup_alpha": 0.0, "cutmix_alpha": 0.0}),
                   model=make_model(), datasets=make_data())
    losses = [row["train_loss"] for row in result.history]
    assert losses[-1] < 0.8 * losses[0], losses
    assert result.history[-1]["val_top1"] > 50  # chance is 25 %
    assert {"val_top5", "ema_top1", "lr", "images_per_s", "gates"} <= set(result.history[-1])
    assert result.history[-1]["gates"] == pytest.approx(result.model.gate_means())
    assert (tmp_path / "log.jsonl").read_text().count("\n") == 6
    assert (tmp_path / "log.csv").read_text().splitlines()[0].startswith("epoch,step,train_loss")
    assert {"run.json", "last.pt", "best.pt", "curves.png"} <= {p.name for p in tmp_path.iterdir()}


@pytest.mark.parametrize("stop_epoch, stop_step, accum", [(0, 12, 1), (1, 3, 2)],
                         ids=["at-epoch-boundary", "mid-epoch-with-accumulation"])
def test_stop_and_resume_gives_weights_identical_to_an_uninterrupted_run(tmp_path, stop_epoch, stop_step, accum):
    cfg = config(tmp_path / "straight", accum_steps=accum, batch_size=8 // accum)
    straight = train(cfg, model=make_model(), datasets=make_data())

    cfg = replace(cfg, output=str(tmp_path / "stopped"))
    first = train(cfg, model=make_model(), datasets=make_data(), callbacks=[StopAt(stop_epoch, stop_step)])
    assert first.stopped == "callback"
    ckpt = read_checkpoint(tmp_path / "stopped" / "last.pt")
    assert (ckpt["epoch"], ckpt["step"]) == ((1, 0) if stop_step == 12 else (stop_epoch, stop_step))
    resumed = train(replace(cfg, resume="auto"), model=make_model(), datasets=make_data())

    assert resumed.stopped is None
    assert_same_weights(straight.model, resumed.model)
    assert_same_weights(straight.ema, resumed.ema)
    keys = ["epoch", "step", "train_loss", "val_loss", "val_top1", "ema_top1", "lr"]
    assert [[r[k] for k in keys] for r in straight.history] == [[r[k] for k in keys] for r in resumed.history]


class SignalAt(Callback):
    """Sends this process `signum`, `times` times, at the end of step `step` (1-based) of epoch `epoch` (0-based)."""

    def __init__(self, signum: int, epoch: int, step: int, times: int = 1):
        self.signum, self.epoch, self.step, self.times = signum, epoch, step, times

    def on_step_end(self, state):
        if (state.epoch, state.step) == (self.epoch, self.step):
            for _ in range(self.times):
                os.kill(os.getpid(), self.signum)


def test_a_signal_stops_a_lone_process_at_the_step_it_came_in_not_at_the_next_read_back(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    result = train(config(tmp_path, log_every=1000), model=make_model(), datasets=make_data(),
                   callbacks=[SignalAt(signal.SIGINT, 0, 3)])
    assert result.stopped == "SIGINT"
    ckpt = read_checkpoint(tmp_path / "last.pt")
    assert (ckpt["epoch"], ckpt["step"]) == (0, 3)
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_sigint_interrupts_at_once_and_the_handlers_are_restored(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path, log_every=1000), model=make_model(), datasets=make_data(),
              callbacks=[SignalAt(signal.SIGINT, 0, 3, times=2)])
    assert signal.getsignal(signal.SIGINT) is before
    assert not (tmp_path / "last.pt").exists()  # no checkpoint was due yet: none is half written


def test_a_signal_at_the_last_step_of_the_last_epoch_stops_nothing(tmp_path):
    result = train(config(tmp_path, epochs=2), model=make_model(), datasets=make_data(),
                   callbacks=[SignalAt(signal.SIGTERM, 1, 12)])
    assert result.stopped is None and [row["epoch"] for row in result.history] == [1, 2]
    assert read_checkpoint(tmp_path / "last.pt")["epoch"] == 2


def test_eval_every_logs_and_checkpoints_evaluated_epochs_only_and_resumes_exactly(tmp_path, monkeypatch):
    saved = []  # (epoch, rows in the log) of each last.pt written

    def recording_save(ckpt, path):
        saved.append((ckpt["epoch"], len(ckpt["history"])))
        return save_checkpoint(ckpt, path)

    monkeypatch.setattr(run_records, "save_checkpoint", recording_save)
    cfg = config(tmp_path / "straight", epochs=5, eval_every=2)
    straight = train(cfg, model=make_model(), datasets=make_data())
    assert [row["epoch"] for row in straight.history] == [2, 4, 5]  # every 2nd epoch, and the last
    # before each evaluation, and once more at the end with the whole log; epochs 1 and 3 write nothing
    assert saved == [(2, 0), (4, 1), (5, 2), (5, 3)]
    times = [row["time_s"] for row in straight.history]
    assert times == sorted(times) and times[0] > 0
    assert straight.history[0]["time_s"] >= straight.history[0]["epoch_time_s"]

    cfg = replace(cfg, output=str(tmp_path / "stopped"))
    saved.clear()
    first = train(cfg, model=make_model(), datasets=make_data(), callbacks=[StopAt(2, 12)])  # after epoch 3
    assert first.stopped == "callback" and [row["epoch"] for row in first.history] == [2]
    assert saved == [(2, 0), (3, 1)]  # a stop after an epoch that is not evaluated still saves where it is
    resumed = train(replace(cfg, resume="auto"), model=make_model(), datasets=make_data())
    assert_same_weights(straight.model, resumed.model)
    assert [row["epoch"] for row in resumed.history] == [2, 4, 5]
    assert resumed.history[-1]["time_s"] > first.history[-1]["time_s"]  # the clock goes on across the resume
    with pytest.raises(ValueError, match="eval_every must be at least 1, got 0"):
        config(tmp_path, eval_every=0)


def test_the_loop_reads_the_device_back_once_per_logging_interval(tmp_path, monkeypatch):
    """On a GPU every read-back (.item(), .tolist(), bool(tensor)) stalls the queue: the optimiser step (forward,
    MixUp/CutMix, backward, AdamW, EMA) makes none, and the loop reads back once per `log_every` steps."""
    reads, inside_step, read_backs = [], [False], []
    # Reads of tensors that live on the CPU whatever the device: non-fused AdamW's step counters (on CUDA the
    # optimiser is fused), torchvision's random MixUp/CutMix parameters, the labels' range check that
    # MixupCutmix makes for CPU labels only, and the sampler's permutation, drawn on the CPU by the loader.
    # Everything else would be a read of the training device.
    cpu_side = ("torch/optim/optimizer.py", "torch/optim/adam", "torchvision/transforms/v2/", "convit_edu/augment.py",
                "convit_edu/samplers.py", "convit_edu/loaders.py")
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name):
            if inside_step[0]:
                frames = [f.filename for f in traceback.extract_stack()[:-1]]
                if not any(part in frames[-1] for part in cpu_side):
                    reads.append(f"{_name} in {frames[-1]}")
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    step, read_back = training.TrainStep.__call__, training.TrainStep.read_back

    def watched_step(self, batches):
        inside_step[0] = True
        try:
            return step(self, batches)
        finally:
            inside_step[0] = False

    monkeypatch.setattr(training.TrainStep, "__call__", watched_step)
    monkeypatch.setattr(training.TrainStep, "read_back", lambda self, *args: read_backs.append(self.state.step) or
                        read_back(self, *args))
    result = train(config(tmp_path, epochs=2, log_every=5, clip_grad=1.0), model=make_model(), datasets=make_data())
    assert reads == []
    assert read_backs == [5, 10, 12, 5, 10, 12]  # 12 steps per epoch: every 5th and the epoch's last
    assert len(result.history) == 2 and all(math.isfinite(r["train_loss"]) for r in result.history)


def test_resume_is_exact_for_a_built_convit_on_augmented_images(tmp_path):
    """The default path: create_model (seeded init, drop path) and build_datasets with DeiT's augmentation."""
    cfg = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 48, "depth": 2,
                      "local_up_to_layer": 1}, data="fake", data_args={"num_train": 64, "num_val": 16,
                      "image_size": 16}, epochs=1, batch_size=8, precision="fp32", num_workers=0, progress="none")
    straight = train(replace(cfg, output=str(tmp_path / "a")))
    train(replace(cfg, output=str(tmp_path / "b")), callbacks=[StopAt(0, 3)])
    resumed = train(replace(cfg, output=str(tmp_path / "b"), resume="auto"))
    assert_same_weights(straight.model, resumed.model)


def test_a_run_of_one_batch_epochs_trains_the_same_with_its_batches_shared_among_workers(tmp_path):
    """32 images at a batch of 32: with 2 workers each batch is loaded in 2 pieces (chapter 16's SplitBatches)."""
    cfg = TrainConfig(model="deit_tiny", img_size=16, model_args={"patch_size": 8, "embed_dim": 48, "depth": 1},
                      data="fake", data_args={"num_train": 32, "num_val": 8, "image_size": 16}, epochs=2,
                      batch_size=32, aug="pad-crop-flip", precision="fp32", progress="none")
    shared = train(replace(cfg, num_workers=2, output=str(tmp_path / "a")))
    alone = train(replace(cfg, num_workers=0, output=str(tmp_path / "b")))
    assert [r["train_loss"] for r in shared.history] == [r["train_loss"] for r in alone.history]
    assert_same_weights(shared.model, alone.model)


@pytest.mark.parametrize("cuda_graphs", ["off", "on"])  # on: the step replayed (28_cuda_graphs; on a CPU a stand-in)
def test_epochs_of_a_cycling_stream_evaluate_checkpoint_and_start_the_loader_only_every_epoch_steps(tmp_path,
                                                                                                   monkeypatch,
                                                                                                   cuda_graphs):
    """20 images at a batch of 8 end a pass every 2½ steps; in epochs of 5 steps nothing happens at those ends."""
    saved, started = [], []
    monkeypatch.setattr(run_records, "save_checkpoint",
                        lambda ckpt, path: saved.append(ckpt["global_step"]) or save_checkpoint(ckpt, path))
    epoch = loaders.DataLoaders.epoch
    monkeypatch.setattr(loaders.DataLoaders, "epoch",
                        lambda self, e, start=0: started.append((e, start)) or epoch(self, e, start))
    result = train(config(tmp_path, epochs=3, epoch_steps=5, cuda_graphs=cuda_graphs), model=make_model(),
                   datasets=make_data(n_train=20))
    assert [row["step"] for row in result.history] == [5, 10, 15]  # 120 images: 6 passes
    assert started == [(0, 0), (1, 0), (2, 0)]  # the loader started once an epoch
    assert saved == [5, 10, 15, 15]  # before each evaluation, and with the whole log at the end


@pytest.mark.parametrize("cuda_graphs", ["off", "on"])  # on: stopped and resumed after the graph's capture
def test_a_run_on_a_cycling_stream_stopped_mid_pass_resumes_to_the_uninterrupted_weights(tmp_path, cuda_graphs):
    cfg = config(tmp_path / "straight", epochs=3, epoch_steps=5, cuda_graphs=cuda_graphs)
    straight = train(cfg, model=make_model(), datasets=make_data(n_train=20))
    cfg = replace(cfg, output=str(tmp_path / "stopped"))
    first = train(cfg, model=make_model(), datasets=make_data(n_train=20), callbacks=[StopAt(1, 3)])
    assert first.stopped == "callback"
    ckpt = read_checkpoint(tmp_path / "stopped" / "last.pt")
    assert (ckpt["epoch"], ckpt["step"], ckpt["global_step"]) == (1, 3, 8)  # 64 images in: 3.2 passes
    resumed = train(replace(cfg, resume="auto"), model=make_model(), datasets=make_data(n_train=20))
    assert_same_weights(straight.model, resumed.model)
    assert_same_weights(straight.ema, resumed.ema)
    keys = ["epoch", "step", "train_loss", "val_loss", "val_top1", "lr"]
    assert [[r[k] for k in keys] for r in straight.history] == [[r[k] for k in keys] for r in resumed.history]
    with pytest.raises(ValueError, match="epoch_steps 5 -> 6"):  # another length of epoch is another run
        train(replace(cfg, epoch_steps=6, resume="auto"), model=make_model(), datasets=make_data(n_train=20))


def test_checkpoint_survives_a_crash_during_writing(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_checkpoint({"format": "convit-edu-train-1", "weights": torch.arange(3.0)}, path)

    def crash_halfway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a zip file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_halfway)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"format": "convit-edu-train-1", "weights": torch.zeros(3)}, path)
    assert torch.equal(files.load_file(path)["weights"], torch.arange(3.0))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def as_second_format(ckpt: dict, cfg: TrainConfig) -> dict:
    """`ckpt` as the code before issue 55 wrote it (format 2), built with torch's own `LambdaLR` stepped as that code
    stepped it: the schedule was a `LambdaLR` over a base rate of 1 (the gates' group: `gate_lr_scale`), stepped once
    per optimiser step, whose state the checkpoint kept under "scheduler", and whose `initial_lr` and next rate the
    optimiser's groups held. (Checked against a file written by that code: the same keys, the same scheduler state
    and group entries.)"""
    optimizer, schedule = optimisation.build_optimizer(cfg, make_model(), cfg.images_per_step(), 12,
                                                       torch.device("cpu"))
    for group, scale in zip(optimizer.param_groups, schedule.scales):
        group["lr"] = scale
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.lr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": this optimiser never steps
        for _ in range(ckpt["global_step"]):
            scheduler.step()
    groups = [{**saved, "lr": group["lr"], "initial_lr": group["initial_lr"]}
              for saved, group in zip(ckpt["optimizer"]["param_groups"], optimizer.param_groups)]
    return {**ckpt, "format": "convit-edu-train-2", "scheduler": scheduler.state_dict(),
            "optimizer": {**ckpt["optimizer"], "param_groups": groups}}


def test_a_checkpoint_holds_its_keys_and_those_of_earlier_formats_resume_to_identical_weights(tmp_path):
    """A run's last.pt holds exactly CHECKPOINT_KEYS, no scheduler among them (the rate is a function of the step);
    the same checkpoint as format 2 wrote it (its LambdaLR's state, the gates' own group of another base rate) and
    as format 1 did (DALI's states under "dali", the sampler's position, no "pending" or "seconds") resumes to the
    weights of an uninterrupted run; files of a newer format, or lacking a key, are refused by name."""
    cfg = config(tmp_path / "straight", gate_lr_scale=4.0)
    straight = train(cfg, model=make_model(), datasets=make_data())
    train(replace(cfg, output=str(tmp_path / "stopped")), model=make_model(), datasets=make_data(),
          callbacks=[StopAt(1, 3)])
    ckpt = read_checkpoint(tmp_path / "stopped" / "last.pt")
    assert tuple(ckpt) == run_state.CHECKPOINT_KEYS and ckpt["format"] == "convit-edu-train-3"
    assert ckpt["global_step"] == 15 and len(ckpt["optimizer"]["param_groups"]) == 3
    second = as_second_format(ckpt, cfg)
    assert second["scheduler"]["last_epoch"] == 15 and second["optimizer"]["param_groups"][2]["initial_lr"] == 4.0
    first = {k: v for k, v in second.items() if k not in ("loader", "pending", "seconds")}
    first |= {"format": "convit-edu-train-1", "dali": None, "sampler": {"epoch": 1, "start": 24}}
    for name, old in (("format-2", second), ("format-1", first)):
        (tmp_path / name).mkdir()
        torch.save(old, tmp_path / name / "last.pt")
        resumed = train(replace(cfg, output=str(tmp_path / name), resume="auto"), model=make_model(),
                        datasets=make_data())
        assert_same_weights(straight.model, resumed.model)
    torch.save({**ckpt, "format": "convit-edu-train-4"}, tmp_path / "newer.pt")
    with pytest.raises(ValueError, match="newer.pt is a training checkpoint of format 'convit-edu-train-4'"):
        read_checkpoint(tmp_path / "newer.pt")
    torch.save({k: v for k, v in ckpt.items() if k != "optimizer"}, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match="partial.pt is a training checkpoint without optimizer"):
        train(config(tmp_path / "run", resume=str(tmp_path / "partial.pt")), model=make_model(), datasets=make_data())


def test_corrupt_or_foreign_checkpoints_are_refused_by_name(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="bad.pt is truncated or not a torch checkpoint"):
        read_checkpoint(bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(ValueError, match="not a convit-edu training checkpoint"):
        read_checkpoint(foreign)
    with pytest.raises(ValueError, match="bad.pt is truncated or not a torch checkpoint"):
        train(config(tmp_path / "run", resume=str(bad)), model=make_model(), datasets=make_data())


def test_resume_from_another_model_is_refused_before_training(tmp_path):
    train(config(tmp_path, epochs=1), model=make_model(), datasets=make_data())
    with pytest.raises(ValueError, match="other settings \\(model 'deit_tiny' -> 'convit_tiny'\\)"):
        train(config(tmp_path, model="convit_tiny", resume="auto"), model=make_model(), datasets=make_data())
    with pytest.raises(ValueError, match=r"does not fit this model .*body.1.weight: \(32, 192\) there, \(16, 192\)"):
        train(config(tmp_path, resume="auto"), model=make_model(hidden=16), datasets=make_data())


def test_nan_in_the_loss_stops_the_run_with_a_message_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = config(tmp_path, ckpt_every=1, aug_args={"mixup_alpha": 0.0, "cutmix_alpha": 0.0})
    with pytest.raises(FloatingPointError, match=r"non-finite loss \(nan\) at epoch 1, step \d+") as error:
        train(cfg, model=make_model(), datasets=make_data(nan_at=50))
    assert str(error.value).endswith("lower --lr or set --clip-grad")  # an fp32 run: no advice about fp16
    ckpt = read_checkpoint(tmp_path / "last.pt")
    assert ckpt["step"] > 0 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


class PoisonWeights(Callback):
    """Turn one weight to NaN after optimiser step `step` of epoch 0, as an overflowing update would."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, state):
        if (state.epoch, state.step) == (0, self.step):
            with torch.no_grad():
                state.model.head.weight[0, 0] = float("nan")


def test_non_finite_weights_are_never_saved_and_the_message_names_the_last_good_file(tmp_path):
    # the last step of the first epoch (12 steps of 8 of the 96 images): its loss was finite, the weights are not
    with pytest.raises(FloatingPointError, match="by optimiser step 12 and were not saved; no checkpoint was written"):
        train(config(tmp_path / "a"), model=make_model(), datasets=make_data(), callbacks=[PoisonWeights(12)])
    assert not (tmp_path / "a" / "last.pt").exists()
    with pytest.raises(FloatingPointError, match=f"head.weight.*; {tmp_path / 'b' / 'last.pt'} is the last good"):
        train(config(tmp_path / "b", ckpt_every=5), model=make_model(), datasets=make_data(),
              callbacks=[PoisonWeights(10)])
    ckpt = read_checkpoint(tmp_path / "b" / "last.pt")
    assert ckpt["step"] == 5 and all(torch.isfinite(t).all() for t in ckpt["model"].values())


class RecordRates(Callback):
    """The learning rate each optimiser step used (set on the optimiser just before the step)."""

    def on_train_begin(self, state):
        self.rates = []

    def on_step_end(self, state):
        self.rates.append(state.optimizer.param_groups[0]["lr"])


def test_learning_rate_sum_with_accumulation_equals_the_sum_of_the_rates_a_run_steps_with(tmp_path):
    from convit_edu.optimisation import learning_rate_sum

    cfg = config(tmp_path, epochs=3, batch_size=2, accum_steps=4, warmup_epochs=1.0, ema_decay=None)
    train_set = make_data()[0]
    rates = RecordRates()
    train(cfg, model=make_model(), datasets=make_data(), callbacks=[rates])
    per_epoch = cfg.steps_per_epoch(len(train_set))
    used = rates.rates
    assert len(used) == per_epoch * cfg.epochs and cfg.images_per_step() == 8
    assert learning_rate_sum(cfg, per_epoch) == pytest.approx(sum(used), rel=1e-9)


class StopAtEpochEnd(Callback):
    def on_epoch_end(self, state):
        state.stop = state.epoch == 1


def test_best_pt_keeps_the_best_epoch_after_a_stop_at_an_epoch_end_and_a_resume(tmp_path, monkeypatch):
    cfg = config(tmp_path, epochs=3, ema_decay=None)
    monkeypatch.setattr(training, "evaluate", scripted(50.0, 40.0, 30.0))
    first = train(cfg, model=make_model(), datasets=make_data(), callbacks=[StopAtEpochEnd()])
    assert first.stopped == "callback" and len(first.history) == 1
    assert read_checkpoint(tmp_path / "last.pt")["best_top1"] == 50.0  # a stopped run's last.pt holds its score
    epoch_1 = read_checkpoint(tmp_path / "best.pt")["model"]
    train(replace(cfg, resume="auto"), model=make_model(), datasets=make_data())  # epochs 2 and 3, no re-evaluation
    best = read_checkpoint(tmp_path / "best.pt")
    assert read_checkpoint(tmp_path / "last.pt")["best_top1"] == 50.0 and best["epoch"] == 1
    assert all(torch.equal(best["model"][k], epoch_1[k]) for k in epoch_1)


class Writes:
    """Counts the checkpoint files a run writes (`save_checkpoint`) and the names it keeps (`keep_as`)."""

    def __init__(self, monkeypatch):
        self.saved, self.kept = [], []
        real_save, real_keep = run_records.save_checkpoint, run_records.keep_as
        monkeypatch.setattr(run_records, "save_checkpoint",
                            lambda ckpt, path: self.saved.append((ckpt["epoch"], Path(path).name)) or real_save(ckpt, path))
        monkeypatch.setattr(run_records, "keep_as",
                            lambda path, kept: self.kept.append(Path(kept).name) or real_keep(path, kept))


def test_an_evaluated_epoch_writes_last_pt_once_and_keeps_it_as_best_pt_only_when_it_improved(tmp_path, monkeypatch):
    monkeypatch.setattr(training, "evaluate", scripted(10.0, 5.0, 20.0))
    writes = Writes(monkeypatch)
    result = train(config(tmp_path, epochs=3, ema_decay=None), model=make_model(), datasets=make_data())
    # one file per epoch, before its evaluation; once more when the run returns, so last.pt holds the whole log
    assert writes.saved == [(1, "last.pt"), (2, "last.pt"), (3, "last.pt"), (3, "last.pt")]
    assert writes.kept == ["best.pt", "best.pt"]  # epochs 1 and 3 improved; no bytes written for them
    best, last = read_checkpoint(tmp_path / "best.pt"), read_checkpoint(tmp_path / "last.pt")
    assert best["epoch"] == 3 and last["history"] == result.history and last["best_top1"] == 20.0
    assert all(torch.equal(best["model"][k], last["model"][k]) for k in last["model"])


def test_a_kill_before_best_pt_is_kept_leaves_a_run_that_resumes_to_the_right_best_pt(tmp_path, monkeypatch):
    cfg = config(tmp_path, epochs=2, ema_decay=None)
    monkeypatch.setattr(training, "evaluate", scripted(10.0, 60.0))
    real_keep = run_records.keep_as

    def killed_on_the_second_best(path, kept):
        if read_checkpoint(path)["epoch"] == 2:
            raise KeyboardInterrupt("killed while keeping best.pt")
        return real_keep(path, kept)

    monkeypatch.setattr(run_records, "keep_as", killed_on_the_second_best)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, model=make_model(), datasets=make_data())
    assert read_checkpoint(tmp_path / "last.pt")["pending"] is not None  # epoch 2 trained, not yet evaluated
    assert read_checkpoint(tmp_path / "best.pt")["epoch"] == 1
    monkeypatch.setattr(run_records, "keep_as", real_keep)
    monkeypatch.setattr(training, "evaluate", scripted(60.0))  # the resumed run evaluates epoch 2 first
    result = train(replace(cfg, resume="auto"), model=make_model(), datasets=make_data())
    best, last = read_checkpoint(tmp_path / "best.pt"), read_checkpoint(tmp_path / "last.pt")
    assert [row["val_top1"] for row in result.history] == [10.0, 60.0]
    assert last["best_top1"] == 60.0 and best["epoch"] == 2
    assert all(torch.equal(best["model"][k], last["model"][k]) for k in last["model"])


def scripted(*top1: float):
    """An `evaluate` of the model (no EMA) that returns the next of these top-1 scores at each call."""
    scores = iter(top1)
    return lambda models, dataset, **kwargs: {"val": {"loss": 1.0, "top1": next(scores), "top5": 100.0}}


def test_resume_refuses_a_changed_experiment_listing_each_difference_and_accepts_more_epochs(tmp_path):
    train(config(tmp_path, epochs=1), model=make_model(), datasets=make_data())
    with pytest.raises(ValueError, match=r"other settings \(fraction 1.0 -> 0.5; seed 0 -> 1\)"):
        train(config(tmp_path, epochs=1, fraction=0.5, seed=1, resume="auto"), model=make_model(),
              datasets=make_data())
    (tmp_path / ".last.pt.tmp").write_bytes(b"half a checkpoint from a killed write")
    result = train(config(tmp_path, epochs=2, num_workers=0, log_every=7, resume="auto"), model=make_model(),
                   datasets=make_data())
    assert len(result.history) == 2 and not (tmp_path / ".last.pt.tmp").exists()
    starts = [json.loads(line) for line in (tmp_path / "invocations.jsonl").read_text().splitlines()]
    assert [s["resumed_from"] for s in starts] == [None, str(tmp_path / "last.pt")]
    assert json.loads((tmp_path / "run.json").read_text())["config"]["epochs"] == 1  # the first start's record


def test_a_dataset_with_fewer_than_two_classes_is_refused(tmp_path):
    train_set, val_set, _ = make_data()
    with pytest.raises(ValueError, match="the dataset has 1 class\\(es\\) \\(c0\\): a classifier needs at least two"):
        train(config(tmp_path), model=make_model(), datasets=(train_set, val_set, ["c0"]))


def test_bf16_autocast_runs_on_cpu(tmp_path):
    result = train(config(tmp_path, epochs=1, precision="bf16"), model=make_model(), datasets=make_data())
    assert all(torch.isfinite(p).all() for p in result.model.parameters())
    assert result.history[0]["val_top1"] >= 0


def test_hard_distillation_with_a_tiny_random_teacher_trains(tmp_path):
    torch.manual_seed(1)
    teacher = TinyNet(dropout=0.0).eval()
    torch.manual_seed(0)
    student = DistilledTinyNet()
    before = [p.clone() for p in student.head_dist.parameters()]
    result = train(config(tmp_path, epochs=3), model=student, datasets=make_data(), teacher=teacher)
    losses = [row["train_loss"] for row in result.history]
    assert losses[-1] < losses[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, result.model.head_dist.parameters()))
    with pytest.raises(ValueError, match="no teacher was given"):
        train(config(tmp_path / "x", epochs=1), model=DistilledTinyNet(), datasets=make_data())


def test_bad_settings_fail_early_naming_the_value(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="global_batch 100 is not divisible by accum_steps 1 × world size 8"):
        TrainConfig(global_batch=100).per_device_batch(8)
    with pytest.raises(ValueError, match="unknown precision 'fp8': choose one of auto, fp32, bf16, fp16"):
        config(tmp_path, precision="fp8")
    with pytest.raises(ValueError, match="fewer than one optimiser step of batch 128"):
        train(config(tmp_path, batch_size=128), model=make_model(), datasets=make_data())
    with pytest.raises(ValueError, match="4 processes but the training set has only 3 samples"):
        monkeypatch.setattr(training, "init_world", lambda device: distributed.World(0, 4, torch.device("cpu"), False))
        train(config(tmp_path), model=make_model(), datasets=make_data(n_train=3))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ValueError, match=f"output directory {blocker}/run is not writable"):
        train(config(blocker / "run"), model=make_model(), datasets=make_data())


@pytest.mark.parametrize("changes, error, match", [
    (dict(lr="1e-3"), TypeError, "lr must be a number, got '1e-3'"),
    (dict(lr=float("inf")), ValueError, "lr must be a finite number"),
    (dict(epochs=2.5), TypeError, "epochs must be an integer, got 2.5"),
    (dict(seed=-1), ValueError, "seed must be at least 0, got -1"),
    (dict(model="convit_huge"), ValueError, "unknown model 'convit_huge': choose one of convit_tiny"),
    (dict(aug="imagenet"), ValueError, "augmentation 'imagenet' is now called 'deit'"),
    (dict(aug_args={"img_size": 32}), ValueError, "aug_args sets 'img_size', which the run owns: set img_size"),
    (dict(model_args={"drop_path_rate": 0.2}), ValueError, "model_args sets 'drop_path_rate', which the run owns"),
    (dict(model_args={"num_classes": 10}), ValueError, "set the dataset's classes instead"),
    (dict(model="convit_tiny", model_args={"patch_size": 4, "locality_strength": -1.0}), ValueError,
     "locality_strength"),
    (dict(model_args={"depth_": 3}), TypeError, "unknown config field"),
    (dict(aug_args={"mixup": 0.5}), ValueError, "unknown AugConfig field"),
    (dict(teacher_checkpoint="t.pt"), ValueError, "given without distill_teacher"),
    (dict(img_size=30), ValueError, "img_size 30 \\(image height\\) is not divisible by patch_size 4"),
])
def test_a_config_is_checked_when_it_is_made(tmp_path, changes, error, match):
    with pytest.raises(error, match=match):
        config(tmp_path, **changes)


def test_every_recipe_is_a_valid_config_and_cifar_keeps_its_global_batch_at_any_world_size():
    for name in RECIPES:
        TrainConfig(**recipe(name))
    cifar = TrainConfig(**recipe("cifar100-32"))
    assert cifar.global_batch == 128 and cifar.aug == "pad-crop-flip" and cifar.model_args == {"patch_size": 4}
    assert [cifar.per_device_batch(world) for world in (1, 2, 8)] == [128, 64, 16]
    with pytest.raises(ValueError, match="unknown recipe 'cifar10'"):
        recipe("cifar10")


def test_from_dict_reads_current_and_older_run_configs():
    cfg = TrainConfig(model="deit_tiny", aug="pad-crop-flip", img_size=32, model_args={"patch_size": 4})
    assert TrainConfig.from_dict(asdict(cfg)) == cfg
    old = {**asdict(cfg), "aug": "cifar100-32"}  # run.json of an earlier version: the old augmentation names
    assert TrainConfig.from_dict(old) == cfg
    assert TrainConfig.from_dict({**asdict(cfg), "aug": "cifar100-224"}).aug == "deit"
    with pytest.raises(ValueError, match="unknown setting\\(s\\) \\['learning_rate'\\]"):
        TrainConfig.from_dict({"learning_rate": 1e-3})


# ------------------------------------------------------------------------------------ subprocess tests

def run_worker(mode: str, output: Path, *, torchrun: int = 0, new_session: bool = False) -> subprocess.Popen:
    launcher = [sys.executable]
    if torchrun:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launcher += ["-m", "torch.distributed.run", f"--nproc_per_node={torchrun}", f"--master_port={port}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(launcher + [__file__, mode, str(output)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT, start_new_session=new_session)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"worker ended early:\n{proc.stdout.read()}"
        assert time.monotonic() < end, f"no {path} after {timeout} s"
        time.sleep(0.05)


def output_or_kill(proc: subprocess.Popen, timeout: float) -> str:
    """The output of a worker started in its own session; one still running after `timeout` s is killed with
    its whole process group (loader workers, torchrun's children) and the test fails with what it printed."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the worker still ran after {timeout} s:\n{proc.communicate()[0]}")


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    proc = run_worker("slow", tmp_path)
    wait_for(tmp_path / "started", proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopped by SIGTERM" in out
    ckpt = read_checkpoint(tmp_path / "last.pt")
    assert 1 <= ckpt["global_step"] < 10 * 12


def test_sigterm_to_the_whole_process_group_with_loader_workers_still_saves_and_exits_cleanly(tmp_path):
    """What SLURM does at pre-emption: every process of the job, loader workers included, gets SIGTERM."""
    proc = run_worker("slow-workers", tmp_path, new_session=True)
    wait_for(tmp_path / "started", proc, timeout=120)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopped by SIGTERM" in out and "killed by signal" not in out
    assert read_checkpoint(tmp_path / "last.pt")["global_step"] >= 1


USER_SCRIPTS = {  # a user's few lines, no Trainer: the interpreter must exit once they are done
    "loaders": """
from convit_edu.datasets import build_datasets
from convit_edu.loaders import build_loaders
train, val, _ = build_datasets("fake", num_train=64, num_val=32, image_size=16,
                               train_transform=TO_TENSOR, val_transform=TO_TENSOR)
data = build_loaders(train, val, batch_size=16, num_workers=2)
print("batches", sum(1 for _ in data.epoch(0)), flush=True)
""",
    "evaluate": """
import torch
from convit_edu.datasets import build_datasets
from convit_edu.evaluation import evaluate
_, val, _ = build_datasets("fake", num_train=8, num_val=32, image_size=16, val_transform=TO_TENSOR)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 10))
print("top-1", evaluate(model, val, batch_size=8, num_workers=2)["top1"] >= 0, flush=True)
""",
    "worker-error": """
import gc
from torch.utils.data import Dataset
from convit_edu.loaders import build_loader
class OneBadFile(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        if i == 3:
            raise ValueError("a corrupt file")
        return torch.zeros(2)
def first_pass():  # the loader, its iterator and its live worker are dropped with the exception
    try:
        for _ in build_loader(OneBadFile(), 4, None, num_workers=1, seed=0, drop_last=False):
            pass
    except ValueError:
        print("caught the worker's error", flush=True)
first_pass()
gc.collect()
""",
}


@pytest.mark.parametrize("script", sorted(USER_SCRIPTS))
def test_a_script_that_uses_loader_workers_exits_when_it_is_done(tmp_path, script):
    """Workers ignore SIGTERM (so that a job's signal reaches only the main process); at exit, Python ends its
    daemonic children with SIGTERM and waits for them: without the package stopping them first, it waits forever
    (the tests above check that a process group's SIGTERM still leaves the workers alive mid-run)."""
    prelude = ("import torch\nfrom torchvision.transforms import v2\n"
               "TO_TENSOR = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])\n")
    (tmp_path / "script.py").write_text(prelude + USER_SCRIPTS[script])
    proc = subprocess.Popen([sys.executable, str(tmp_path / "script.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=tmp_path)
    out = output_or_kill(proc, timeout=120)  # a liveness bound: before the fix it never returned
    assert proc.returncode == 0 and ("batches 4" in out or "top-1 True" in out or "the worker's error" in out), out


def test_sigterm_to_the_whole_process_group_during_evaluation_with_loader_workers_saves_and_exits_cleanly(tmp_path):
    """Pre-emption during an evaluation: evaluate's loader workers get SIGTERM too and must not die of it."""
    proc = run_worker("eval-workers", tmp_path, new_session=True)
    for worker in (0, 1):  # both loading: past their start, where torch sets its handlers before ours
        wait_for(tmp_path / f"evaluating-{worker}", proc, timeout=120)
    os.killpg(proc.pid, signal.SIGTERM)
    (tmp_path / "signalled").touch()  # only now do the validation set's workers go on loading
    out = output_or_kill(proc, timeout=60)
    assert proc.returncode == 0, out
    assert "stopped by SIGTERM" in out and "killed by signal" not in out
    ckpt = read_checkpoint(tmp_path / "last.pt")
    assert ckpt["epoch"] == 1 and len(ckpt["history"]) == 1  # the evaluation finished, then the run stopped


def test_a_full_disk_on_rank_0_stops_both_processes_naming_the_file_and_the_last_good_checkpoint_resumes(tmp_path):
    """Rank 0's disk fills after its first checkpoint (epoch 1's, written as its evaluation began): the next
    checkpoint write fails half-way with "No space left on device". Both gloo processes stop at that write, each
    naming the file, instead of leaving rank 1 to wait out the 30-minute process-group timeout in its next collective
    (NCCL across nodes would; gloo on one machine notices rank 0's exit, so here what counts is what rank 1 says).
    The last good checkpoint is whole, nothing half-written is left beside it, and it resumes (on one process, at
    the same global batch) to the weights of an uninterrupted run."""
    proc = run_worker("ddp-full-disk", tmp_path / "run", torchrun=2, new_session=True)
    out = output_or_kill(proc, timeout=90)  # a liveness bound: both are stopped by the failed write itself
    assert proc.returncode != 0, out
    last = tmp_path / "run" / "last.pt"
    stopped = {line[:6]: line for line in out.splitlines() if line.startswith(("rank 0 stopped:", "rank 1 stopped:"))}
    assert stopped["rank 0"].endswith(f"[Errno 28] No space left on device: '{last}'"), out
    assert f"rank 0 could not write the checkpoint {last}" in stopped["rank 1"], out
    good = read_checkpoint(last)
    assert (good["epoch"], good["world_size"], good["pending"]["epoch"]) == (1, 2, 1)  # epoch 1, before its score
    assert sorted(p.name for p in last.parent.glob("*.tmp")) == []

    resumed = train(replace(ddp_config(tmp_path / "run", batch_size=16), resume="auto"), model=make_model(dropout=0.0),
                    datasets=ddp_data())
    one = train(ddp_config(tmp_path / "one", batch_size=16), model=make_model(dropout=0.0), datasets=ddp_data())
    assert [row["epoch"] for row in resumed.history] == [1, 2]
    for k, v in one.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[k], v, atol=1e-5, rtol=1e-5)


class SignalDuringEvaluation(Dataset):
    """A validation set that sends this process SIGTERM while the first evaluation reads its first image."""

    def __init__(self, base: Dataset):
        self.base, self.sent = base, False

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)
        return self.base[i]


def test_sigterm_during_an_evaluation_saves_a_checkpoint_and_the_run_resumes_to_the_uninterrupted_weights(tmp_path,
                                                                                                       monkeypatch):
    saved = []  # (epoch, rows in the log, an evaluation pending) of each last.pt written
    real_save = run_records.save_checkpoint
    monkeypatch.setattr(run_records, "save_checkpoint", lambda ckpt, path: saved.append(
        (ckpt["epoch"], len(ckpt["history"]), ckpt["pending"] is not None)) or real_save(ckpt, path))
    straight = train(config(tmp_path / "straight"), model=make_model(), datasets=make_data())
    saved.clear()
    train_set, val_set, classes = make_data()
    stopped = train(config(tmp_path / "stopped"), model=make_model(),
                    datasets=(train_set, SignalDuringEvaluation(val_set), classes))
    assert stopped.stopped == "SIGTERM" and [row["epoch"] for row in stopped.history] == [1]  # it finished scoring
    assert saved == [(1, 0, True), (1, 1, False)]  # as the evaluation began, and with its score when it stopped
    resumed = train(config(tmp_path / "stopped", resume="auto"), model=make_model(), datasets=make_data())
    assert resumed.stopped is None and [row["epoch"] for row in resumed.history] == [1, 2]
    assert_same_weights(straight.model, resumed.model)
    assert_same_weights(straight.ema, resumed.ema)
    assert resumed.history[0] == stopped.history[0]


def test_a_killed_run_resumes_from_its_last_checkpoint_to_identical_weights(tmp_path):
    proc = run_worker("slow", tmp_path)
    wait_for(tmp_path / "last.pt", proc)
    time.sleep(0.3)
    proc.kill()
    proc.wait(timeout=30)
    killed_at = read_checkpoint(tmp_path / "last.pt")["global_step"]
    assert killed_at >= 2 and killed_at % 2 == 0

    resumed = train(replace(slow_config(tmp_path), resume="auto"), model=make_model(), datasets=make_data())
    straight = train(slow_config(tmp_path / "straight"), model=make_model(), datasets=make_data())
    assert_same_weights(straight.model, resumed.model)


def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path):
    proc = run_worker("ddp", tmp_path / "two", torchrun=2)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    two = read_checkpoint(tmp_path / "two" / "last.pt")
    assert two["world_size"] == 2 and two["global_batch"] == 16

    one = train(ddp_config(tmp_path / "one", batch_size=16), model=make_model(dropout=0.0), datasets=ddp_data())
    for k, v in one.model.state_dict().items():
        torch.testing.assert_close(two["model"][k], v, atol=1e-5, rtol=1e-5)
    assert two["history"][-1]["val_top1"] == pytest.approx(one.history[-1]["val_top1"])


def test_two_gloo_processes_stopped_mid_epoch_resume_on_one_to_the_uninterrupted_weights(tmp_path):
    proc = run_worker("ddp-stop", tmp_path / "run", torchrun=2)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    stopped = read_checkpoint(tmp_path / "run" / "last.pt")
    assert (stopped["world_size"], stopped["epoch"], stopped["step"]) == (2, 0, 3)

    resumed = train(replace(ddp_config(tmp_path / "run", batch_size=16), resume="auto"), model=make_model(dropout=0.0),
                    datasets=ddp_data())
    one = train(ddp_config(tmp_path / "one", batch_size=16), model=make_model(dropout=0.0), datasets=ddp_data())
    for k, v in one.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[k], v, atol=1e-5, rtol=1e-5)


def test_resume_auto_that_only_some_processes_can_see_is_an_error_on_every_process_not_a_hang(tmp_path):
    train(ddp_config(tmp_path / "rank0", batch_size=8), model=make_model(dropout=0.0), datasets=ddp_data())
    proc = run_worker("ddp-disagree", tmp_path, torchrun=2)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode != 0
    assert out.count("1 of 2 processes see") >= 2, out  # both ranks say it


@pytest.mark.parametrize("env, world", [
    ({}, (0, 1, 0, None)),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}, (3, 8, 3, "torchrun")),
    ({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1", "MASTER_ADDR": "node1",
      "MASTER_PORT": "29500"}, (5, 8, 1, "srun")),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"}, (0, 1, 0, None)),  # the batch script itself
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
      "SLURM_LOCALID": "0"}, (0, 2, 0, "torchrun")),  # srun torchrun: torchrun's world
])
def test_the_world_comes_from_torchrun_or_srun(env, world):
    assert distributed._world_from_env(env) == world


@pytest.mark.parametrize("env, match", [
    ({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1"}, "MASTER_ADDR / MASTER_PORT are not set"),
    ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "inconsistent torchrun world"),
    ({"RANK": "0", "WORLD_SIZE": "two", "LOCAL_RANK": "0"}, "torchrun launch with incomplete variables"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, "srun launch with incomplete variables: need integers in"),
])
def test_an_inconsistent_world_is_a_clear_error(env, match):
    with pytest.raises(ValueError, match=match):
        distributed._world_from_env(env)


def test_each_process_takes_gpu_local_rank_mod_visible_gpus_and_a_process_group_with_a_timeout(monkeypatch):
    calls = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.setdefault("device", device))
    monkeypatch.setattr(training.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(training.dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend, **kw))
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}.items():
        monkeypatch.setenv(name, value)
    world = distributed.init_world("cuda")
    assert world.device == torch.device("cuda:1") == calls["device"]
    assert (calls["backend"], calls["rank"], calls["world_size"]) == ("nccl", 3, 4)
    assert calls["timeout"] == distributed.PROCESS_GROUP_TIMEOUT
    assert calls["device_id"] == torch.device("cuda:1")  # NCCL connects at once, on this process's GPU


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine that shows two GPUs (no CUDA work is done: `set_device` is recorded)."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_a_single_process_keeps_the_gpu_its_device_names(two_gpus):
    assert distributed.init_world("cuda:1").device == torch.device("cuda:1") == two_gpus[0]
    assert distributed.init_world("cuda").device == torch.device("cuda:0")


@pytest.mark.parametrize("device, env, match", [
    ("cuda:1", {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "names one GPU for 2 processes"),
    ("cuda:5", {}, r"'cuda:5' asked for but this machine shows 2 GPU\(s\) \(cuda:0 to cuda:1\)"),
])
def test_a_gpu_index_that_cannot_be_honoured_is_refused(two_gpus, monkeypatch, device, env, match):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        distributed.init_world(device)
    assert two_gpus == []  # refused before any GPU was chosen


def test_checkpoints_hold_no_cuda_generator_states(tmp_path):
    train(config(tmp_path, epochs=1), model=make_model(), datasets=make_data())
    assert set(read_checkpoint(tmp_path / "last.pt")["rng"]) == {"torch", "numpy", "python"}


def slow_config(output) -> TrainConfig:
    return config(output, epochs=10, ckpt_every=2)


def ddp_config(output, batch_size: int) -> TrainConfig:
    # no mixup, no dropout, no augmentation noise: the 2 x 8 and 1 x 16 batches then hold the same images
    return config(output, aug=None, aug_args={}, batch_size=batch_size, epochs=2)


def ddp_data():
    train_set, val_set, classes = make_data()
    return train_set.base, val_set, classes


class Sleep(Callback):
    def __init__(self, marker: Path):
        self.marker = marker

    def on_step_end(self, state):
        self.marker.touch()
        time.sleep(0.05)


class SlowToEvaluate(Dataset):
    """A validation set whose loader workers each mark that they are loading, then load nothing until the test
    has sent its signal: the signal reaches the workers in the middle of an evaluation."""

    def __init__(self, base: Dataset, output: Path):
        self.base, self.output = base, output

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        worker = torch.utils.data.get_worker_info()
        if worker is None:  # not in a loader worker: nothing to wait for
            return self.base[i]
        (self.output / f"evaluating-{worker.id}").touch()
        end = time.monotonic() + 60
        while not (self.output / "signalled").exists() and time.monotonic() < end:
            time.sleep(0.02)
        return self.base[i]


def fills_after(files_written: int, atomic_write):
    """`atomic_write` (the one that checkpoints go through) on a disk that is full after `files_written` files: a
    later write gets part of its bytes out, then fails with "No space left on device", as a real write would."""
    done = []

    def write(path, fill):
        if len(done) < files_written:
            done.append(path)
            return atomic_write(path, fill)

        def part_then_full(f):
            f.write(b"the first bytes of a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return atomic_write(path, part_then_full)

    return write


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, output = sys.argv[1], Path(sys.argv[2])
    if mode == "slow":
        train(slow_config(output), model=make_model(), datasets=make_data(), callbacks=[Sleep(output / "started")])
    elif mode == "slow-workers":
        train(replace(slow_config(output), num_workers=2), model=make_model(), datasets=make_data(),
              callbacks=[Sleep(output / "started")])
    elif mode == "eval-workers":
        train_set, val_set, classes = make_data()
        train(replace(config(output, epochs=2), num_workers=2), model=make_model(),
              datasets=(train_set, SlowToEvaluate(val_set, output), classes))
    elif mode == "ddp":
        train(ddp_config(output, batch_size=8), model=make_model(dropout=0.0), datasets=ddp_data())
    elif mode == "ddp-stop":
        train(ddp_config(output, batch_size=8), model=make_model(dropout=0.0), datasets=ddp_data(),
              callbacks=[StopAt(0, 3)])
    elif mode == "ddp-full-disk":  # rank 0's disk fills after its first checkpoint
        rank = os.environ["RANK"]
        if rank == "0":
            run_state.atomic_write = fills_after(1, run_state.atomic_write)
        try:
            train(ddp_config(output, batch_size=8), model=make_model(dropout=0.0), datasets=ddp_data())
        except Exception as e:
            sys.stdout.write(f"rank {rank} stopped: {type(e).__name__}: {e}\n")  # one write: lines never interleave
            raise
    elif mode == "ddp-disagree":  # node-local folders: only rank 0's holds a checkpoint
        cfg = replace(ddp_config(output / f"rank{os.environ['RANK']}", batch_size=8), resume="auto")
        train(cfg, model=make_model(dropout=0.0), datasets=ddp_data())


def test_auto_precision_on_a_cpu_is_bf16_only_where_the_cpu_has_native_bf16(monkeypatch):
    amx = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16\n"
    avx2 = "processor\t: 0\nflags\t\t: fpu sse avx2 fma\n"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert devices.cpu_has_native_bf16(amx) and not devices.cpu_has_native_bf16(avx2)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # ATen pinned below AVX-512
    assert not devices.cpu_has_native_bf16(amx)
    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: native)
        assert devices.resolve_precision("auto", "cpu") == expected
        assert devices.resolve_precision("fp32", "cpu") == "fp32"


def test_auto_device_is_cuda_then_mps_then_cpu(monkeypatch):
    for cuda, mps, expected in ((True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
        assert devices.resolve_device("auto").type == expected
    with pytest.raises(ValueError, match="CUDA is not available"):
        devices.resolve_device("cuda")
    with pytest.raises(ValueError, match="'mps' asked for but Apple's MPS is not available here"):
        devices.resolve_device("mps")  # MPS is off since the loop's last round
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"'cuda:2' asked for but this machine shows 2 GPU\(s\) \(cuda:0 to cuda:1\)"):
        devices.resolve_device("cuda:2")


def test_adamw_is_fused_on_a_gpu_and_the_model_and_its_ema_are_scored_in_one_pass(tmp_path, monkeypatch):
    cfg = config(tmp_path, epochs=1)
    model = make_model()
    assert optimisation.build_optimizer(cfg, model, 8, 12, torch.device("cuda"))[0].defaults["fused"]
    assert not optimisation.build_optimizer(cfg, model, 8, 12, torch.device("cpu"))[0].defaults["fused"]
    passes = []
    real = evaluation.evaluate
    monkeypatch.setattr(training, "evaluate", lambda models, *a, **kw: passes.append(list(models)) or real(
        models, *a, **kw))
    result = train(cfg, model=make_model(), datasets=make_data())
    assert passes == [["val", "ema"]] and {"val_top1", "ema_top1"} <= set(result.history[0])


def test_the_ema_update_equals_averaged_models_own_without_reading_the_device():
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    from convit_edu.optimisation import update_ema
    from convit_edu.zoo import create_model

    torch.manual_seed(0)
    model = create_model("convit_tiny", img_size=32, patch_size=8, embed_dim=48, num_heads=4, depth=2,
                         local_up_to_layer=1, num_classes=5)
    reference = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    ours = AveragedModel(model, use_buffers=True)
    for i in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        reference.update_parameters(model)
        update_ema(ours, model, 0.9, first=i == 0)
        for (name, a), b in zip(reference.state_dict().items(), ours.state_dict().values()):
            assert torch.equal(a, b), (i, name)


def test_the_runs_own_datasets_ship_uint8_and_a_uint8_batch_needs_its_finish(tmp_path):
    from convit_edu.augment import finish_batch

    cfg = TrainConfig(model="deit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 16, "num_heads": 2,
                                                                  "depth": 1}, data="fake",
                      data_args={"num_train": 16, "num_val": 8, "num_classes": 2, "image_size": 16}, epochs=1,
                      batch_size=8, num_workers=0, precision="fp32", progress="none", output=str(tmp_path))
    trainer = training.Trainer(cfg, distributed.World(0, 1, torch.device("cpu"), False))
    images, _ = next(iter(trainer.data.loaders.train))
    assert images.dtype == torch.uint8 and trainer.data.device_transforms is not None
    assert finish_batch(images, trainer.data.device_transforms, train=True).dtype == torch.float32
    with pytest.raises(ValueError, match="pass finish=DeviceTransforms"):
        finish_batch(images, None, train=False)
    floats = torch.rand(2, 3, 16, 16)
    assert finish_batch(floats, None, train=True) is floats


def test_a_compiled_run_reports_its_compile_seconds_and_keeps_its_compile_cache_in_the_run_folder(tmp_path,
                                                                                                  monkeypatch):
    class SlowFirstCall(nn.Module):  # stands in for torch.compile: the first call pays 0.3 s, and sees the cache
        def __init__(self, module):
            super().__init__()
            self.module, self.calls, self.cache_dirs = module, 0, []

        def forward(self, x):
            self.calls += 1
            if self.calls == 1:
                self.cache_dirs.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
                time.sleep(0.3)
            return self.module(x)

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda m: compiled.append(SlowFirstCall(m)) or compiled[-1])
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    result = train(config(tmp_path, compile=True), model=make_model(), datasets=make_data())
    assert [len(compiled), compiled[0].cache_dirs] == [1, [str((tmp_path / "compile-cache").resolve())]]
    assert result.history[0]["compile_s"] >= 0.3 and result.history[1]["compile_s"] == 0.0
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # set for the run only
    assert train(config(tmp_path / "eager"), model=make_model(), datasets=make_data()).history[0]["compile_s"] == 0
