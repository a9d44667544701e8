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
# # Training, part 4: `train`, piece by piece
#
# Chapters 20-22 wrote the pieces. This chapter puts them together: the data, the model (and a teacher) and a
# resume checkpoint, the optimisation, what a run writes, one optimiser step, one epoch, and `fit`, the
# algorithm of a whole run, each as a function that fits on a screen.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp training
# The training loop: `train` builds a run from its config and fits it, from a laptop CPU to many GPUs.
#
# Longer than the course's other chapters: the loop is one algorithm whose steps share private state (`_Run`);
# split over two modules, those private names would have to cross a module boundary. Each function fits on a screen.

# %%
#| export
import contextlib
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.distributed as dist
import torchvision
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import Dataset

import convit_edu
from convit_edu.augment import AUGMENTATIONS, AugConfig, build_mixup, build_transforms
from convit_edu.config import TrainConfig, per_device_batch
from convit_edu.dali import DaliLoaders
from convit_edu.datasets import build_datasets
from convit_edu.loaders import DataLoaders, DeviceTransforms, build_loaders
from convit_edu.models import VisionTransformer
from convit_edu.optimisation import (CHECKPOINT_FORMAT, _rng_states, _seed_step, _set_rng_states, deit_lr,
                                     param_groups, read_checkpoint, save_checkpoint, scaled_lr, train_loss)
from convit_edu.pretrained import load_checkpoint, read_state_dict
from convit_edu.runtime import (Callback, TrainResult, TrainState, _all_reduce, _init_world, _Progress, _StopSignals,
                                _World, _write_logs, autocast, evaluate, finish_batch, gate_means, plot_history,
                                resolve_precision)
from convit_edu.zoo import create_model, list_models

# %%
import json
from pathlib import Path

import torch
from torch import nn

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Putting it together: `train`, piece by piece
#
# A run is built in the order that lets every bad input fail before any training work — the config was
# checked when it was made; then the output folder (writable?), the data (more processes than samples? a batch
# larger than a process's share?), the model and the resume checkpoint (the same model? the same global
# batch?) — and then advanced epoch by epoch. Each piece below is one function of a screen or less; `fit`, at
# the end, is the algorithm in one place.
#
# ### The data
#
# The datasets (the config's, or the caller's), the per-process batch and the global batch it implies, chapter
# 06's `build_loaders` for this process's share, and the batch mixing of the augmentation. The config's own
# datasets ship uint8 crops from the workers (`build_transforms(aug, on_device=True)`), and `finish_batch`
# normalises and erases each batch on the device with chapter 18's `DeviceTransforms`; a caller's datasets that
# already give float tensors pass through unchanged. The number of optimiser steps per epoch is what every
# process can take in step with the others. With `loader="dali"` (an ImageNet-style folder, the optional extra)
# chapter 19's `DaliLoaders` replaces `build_loaders`: DALI pipelines read the same files and ship the same uint8
# batches, and the same `finish_batch` completes them; its exact resume is the pipelines' own checkpoint, one
# per process, saved beside the sampler position under `dali` (so it resumes on as many processes as it ran).
#
# Rank 0 builds the config's datasets first and the other processes after it: an ImageNet folder's 1.28 M file
# names are then listed once, by rank 0, which caches the list (chapter 16), and read from that cache by the
# others — at every start and every requeue. `_main_writes` does the ordering (and, should rank 0 fail, stops
# every process with it; see "What a run writes"). The loader's workers are `cfg.loader_workers()`: the
# `num_workers` asked for, or by default what this process's share of the node's CPUs allows (chapter 18's
# `default_num_workers`).

# %%
#| exporti
@dataclass
class _Data:
    loaders: DataLoaders | DaliLoaders
    val_set: Dataset | Iterable  # a dataset, or this process's batches (the DALI loader's `val`)
    num_classes: int
    mixup: Any  # data.MixupCutmix or None
    finish: DeviceTransforms | None  # normalisation and erasing of the uint8 batches, on the device
    smoothing: float
    num_workers: int  # loader processes (DALI: threads) of this process, `cfg.num_workers` or its default
    batch_size: int  # per process and micro-batch
    global_batch: int  # per optimiser step, over every process and micro-batch
    steps_per_epoch: int


def _main_writes(world: _World, what: str, write: Callable[[], Any]) -> Any:
    """`write()` on rank 0 only, then every process hears whether it failed, in one all-reduce: a full disk or a
    permission error on rank 0 stops every process at once with that error, instead of leaving the others
    waiting at their next collective until the process group's 30-minute timeout."""
    error = result = None
    if world.main:
        try:
            result = write()
        except Exception as e:  # raised below, once every process has heard of it
            error = e
    failed = world.world_size > 1 and _all_reduce(torch.tensor(float(error is not None), device=world.device)).item()
    if error is not None:
        raise error
    if failed:
        raise OSError(f"rank 0 could not {what} (rank 0's output has its error): every process stops")
    return result


def _config_datasets(cfg: TrainConfig, world: _World, aug: AugConfig | None) -> tuple:
    """The config's datasets, built by rank 0 first (an image folder's file list is then cached, chapter 16) and
    by the other processes after it, from that cache."""
    if aug is None:
        raise ValueError("aug None (no augmentation) needs datasets passed to train(); the config's own "
                         f"datasets need an augmentation ({', '.join(AUGMENTATIONS)})")
    train_tf, val_tf = build_transforms(aug, on_device=True) if cfg.loader == "torchvision" else (None, None)
    build = partial(build_datasets, cfg.data, cfg.data_root, train_transform=train_tf, val_transform=val_tf,
                    fraction=cfg.fraction, max_classes=cfg.classes, **cfg.data_args)
    datasets = _main_writes(world, f"read the dataset in {cfg.data_root}", build)
    return datasets if world.main else build()


def _build_data(cfg: TrainConfig, world: _World, datasets: tuple | None) -> _Data:
    aug = cfg.aug_config()
    if datasets is None:
        datasets = _config_datasets(cfg, world, aug)
    elif cfg.loader == "dali":
        raise ValueError("loader 'dali' reads the config's own image folder (data_root): datasets passed to train() "
                         "need loader 'torchvision'")
    train_set, val_set, classes = datasets
    if len(classes) < 2:
        raise ValueError(f"the dataset has {len(classes)} class(es) ({', '.join(map(str, classes))}): a classifier "
                         "needs at least two (check --data-root, --classes)")
    batch_size = per_device_batch(cfg, world.world_size)
    share = math.ceil(len(train_set) / world.world_size)  # samples per process and epoch (RepeatAugSampler)
    steps = share // batch_size // cfg.accum_steps
    if steps == 0 and len(train_set) >= world.world_size:  # (fewer samples than processes: build_loaders says so)
        raise ValueError(
            f"each of the {world.world_size} processes gets {share} samples per epoch, fewer than one "
            f"optimiser step of batch {batch_size} × accum_steps {cfg.accum_steps}: lower the batch")
    workers = cfg.loader_workers()
    if cfg.loader == "dali":
        loaders = DaliLoaders(train_set, val_set, aug, batch_size=batch_size, num_threads=max(1, workers),
                              num_replicas=world.world_size, rank=world.rank, seed=cfg.seed,
                              device_id=world.device.index if world.device.type == "cuda" else None)
        val_set = loaders.val
    else:
        loaders = build_loaders(train_set, val_set, batch_size=batch_size, num_workers=workers,
                                repeats=cfg.repeats, num_replicas=world.world_size, rank=world.rank, seed=cfg.seed)
    return _Data(loaders, val_set, len(classes), build_mixup(aug, len(classes)) if aug else None,
                 DeviceTransforms(aug) if aug else None, aug.label_smoothing if aug else 0.0, workers, batch_size,
                 batch_size * cfg.accum_steps * world.world_size, steps)


# %% [markdown]
# ### The model, the teacher, and the resume checkpoint
#
# The initial weights are a function of the seed alone, the same on every process. A teacher (hard
# distillation, SM B) is built and frozen; the student then gets a distillation head. A checkpoint to resume
# from must hold the same model, at the same global batch (the schedule and the sampler depend on it); it may
# come from another number of processes, even mid-epoch: the sampler's position is a place in the epoch's one
# global stream, and each sample's augmentation is seeded by that place (chapter 18). Every process must see
# the checkpoint, or none: `--resume auto` is decided together (an all-reduce of "I see `last.pt`"), because
# processes that disagreed would wait forever for each other at the first collective.

# %%
#| export
def build_teacher(name: str, checkpoint: str | None, num_classes: int, img_size: int) -> nn.Module:
    """A frozen teacher: a convit_edu model or a torchvision classifier, with weights from `checkpoint`."""
    if name in list_models():
        teacher = create_model(name, num_classes=num_classes, img_size=img_size)
        if checkpoint:
            load_checkpoint(teacher, checkpoint)  # also reads our training checkpoints (their "model" entry)
    elif name in torchvision.models.list_models(module=torchvision.models):
        teacher = torchvision.models.get_model(name, num_classes=num_classes)
        if checkpoint:
            teacher.load_state_dict(read_state_dict(checkpoint))
    else:
        raise ValueError(f"unknown teacher {name!r}: give a convit_edu model ({', '.join(list_models())}) or a "
                         "torchvision classifier (e.g. regnet_y_16gf, resnet50)")
    return teacher.eval().requires_grad_(False)


# %%
#| exporti
def _build_models(cfg: TrainConfig, world: _World, data: _Data, model: nn.Module | None,
                  teacher: nn.Module | None) -> tuple[nn.Module, nn.Module | None]:
    torch.manual_seed(cfg.seed)  # the initial weights are a function of the seed, identical on every rank
    if teacher is None and cfg.distill_teacher:
        teacher = build_teacher(cfg.distill_teacher, cfg.teacher_checkpoint, data.num_classes, cfg.img_size)
    if model is None:
        model = VisionTransformer(cfg.model_config(data.num_classes, distilled=teacher is not None))
    return model.to(world.device), teacher.to(world.device).eval() if teacher is not None else None


def _resume_checkpoint(cfg: TrainConfig, world: _World, output: Path) -> tuple[dict | None, Path | None]:
    if cfg.resume is None:
        return None, None
    path = output / "last.pt" if cfg.resume == "auto" else Path(cfg.resume)
    seen = int(_all_reduce(torch.tensor(float(path.exists()), device=world.device)).item())
    if 0 < seen < world.world_size:  # every process must take the same decision, or the first collective hangs
        raise ValueError(f"{seen} of {world.world_size} processes see {path}: put --output (and the checkpoint) on a "
                         "file system that every node shares")
    if cfg.resume == "auto" and not seen:
        if world.main:
            print(f"resume auto: no {path} yet, starting from scratch", flush=True)
        return None, None
    return read_checkpoint(path), path


_RESUME_MAY_CHANGE = {  # settings a resumed run may change without changing what it computes (the global batch,
    # which batch_size, accum_steps and global_batch set together, is checked on its own)
    "num_workers", "batch_size", "accum_steps", "global_batch", "compile", "device", "output", "resume",
    "ckpt_every", "log_every", "progress", "eval_every"}
_RESUME_MAY_FIX = (  # settings a resumed run may change to mend or extend it: printed, recorded in invocations.jsonl
    "lr", "min_lr", "clip_grad", "precision", "data_root", "epochs")


def _check_resume(ckpt: dict, path: Path, cfg: TrainConfig, model: nn.Module, data: _Data) -> dict[str, list]:
    """Refuse a checkpoint of another run (each differing setting named); return the fixes, {setting: [old, new]}."""
    saved, now = asdict(TrainConfig.from_dict(ckpt["config"])), asdict(cfg)
    differ = [k for k in now if k not in _RESUME_MAY_CHANGE and saved[k] != now[k]]
    refused = [f"{k} {saved[k]!r} -> {now[k]!r}" for k in differ if k not in _RESUME_MAY_FIX]
    if refused:
        raise ValueError(f"checkpoint {path} was trained with other settings ({'; '.join(refused)}): resuming would "
                         "not continue the same run; resume with the checkpoint's settings or start a new --output "
                         f"(a resume may change {', '.join(_RESUME_MAY_FIX)})")
    own, theirs = model.state_dict(), ckpt["model"]
    wrong = sorted(set(own) ^ set(theirs)) + [k for k in own if k in theirs and own[k].shape != theirs[k].shape]
    if wrong:
        k = wrong[0]
        detail = (f"{tuple(theirs[k].shape)} there, {tuple(own[k].shape)} here" if k in own and k in theirs
                  else "missing " + ("there" if k in own else "here"))
        raise ValueError(f"checkpoint {path} does not fit this model ({len(wrong)} tensors differ, first {k}: "
                         f"{detail}): same --model but other sizes or classes?")
    if ckpt["global_batch"] != data.global_batch:
        raise ValueError(f"checkpoint {path} was trained with global batch {ckpt['global_batch']}, this run has "
                         f"{data.global_batch}: keep batch_size × accum_steps × world size equal to resume")
    return {k: [saved[k], now[k]] for k in differ}


# %% [markdown]
# ### The optimisation
#
# AdamW over the two parameter groups, the DeiT schedule as a `LambdaLR` (the optimiser's own rate is 1, so the
# lambda *is* the learning rate), the fp16 loss scaler (a no-op in other precisions), the EMA of the weights,
# and the wrappers: DDP for several processes and `torch.compile` when asked. The hooks see the bare model.

# %%
#| exporti
@dataclass
class _Optimisation:
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    ema: AveragedModel | None


def _build_optimisation(cfg: TrainConfig, model: nn.Module, data: _Data, precision: str,
                        device: torch.device) -> _Optimisation:
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=1.0, fused=device.type == "cuda")
    peak, total = scaled_lr(cfg.lr, data.global_batch), data.steps_per_epoch * cfg.epochs
    warmup = round(cfg.warmup_epochs * data.steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda t: deit_lr(t, total, warmup, peak, cfg.min_lr, cfg.warmup_lr))
    ema = AveragedModel(model, use_buffers=True) if cfg.ema_decay else None  # updated by `_update_ema`
    return _Optimisation(optimizer, scheduler, torch.amp.GradScaler(device.type, enabled=precision == "fp16"), ema)


def _wrap(cfg: TrainConfig, model: nn.Module, world: _World) -> tuple[nn.Module, nn.Module]:
    """The model in DDP when there are several processes, and what the loop calls: that, compiled when asked."""
    ddp = (DistributedDataParallel(model, device_ids=[world.device] if world.device.type == "cuda" else None)
           if world.world_size > 1 else model)
    return ddp, torch.compile(ddp) if cfg.compile else ddp


# %% [markdown]
# ### A run, and restoring one
#
# `_Run` holds what the pieces built. `_start` builds them in order; restoring a checkpoint loads the weights
# before the optimiser and the EMA are made (the EMA starts as a copy of the model), then everything else —
# optimiser, schedule, scaler, EMA, position, log, best score and every generator's state.

# %%
#| exporti
@dataclass
class _Run:
    cfg: TrainConfig
    world: _World
    output: Path
    precision: str
    data: _Data
    model: nn.Module  # the bare model: what the hooks see and checkpoints hold
    teacher: nn.Module | None
    ddp: nn.Module  # the model in DDP with several processes, else the model
    forward: nn.Module  # what the loop calls: `ddp`, compiled when asked
    opt: _Optimisation
    state: TrainState
    callbacks: list[Callback]
    best_top1: float = -1.0
    unread: list[torch.Tensor] = field(default_factory=list)  # (loss, non-finite) of each step not read back yet
    data_wait: float = 0.0  # seconds this epoch's steps waited for the loader (in this process)


def _start(cfg: TrainConfig, world: _World, model, datasets, teacher, callbacks) -> _Run:
    output, precision = Path(cfg.output), resolve_precision(cfg.precision, world.device)
    _main_writes(world, f"write in the run folder {output}", lambda: _check_output(output))
    data = _build_data(cfg, world, datasets)
    model, teacher = _build_models(cfg, world, data, model, teacher)
    ckpt, path = _resume_checkpoint(cfg, world, output)
    changes = {}
    if ckpt is not None:
        changes = _check_resume(ckpt, path, cfg, model, data)
        model.load_state_dict(ckpt["model"])
    opt = _build_optimisation(cfg, model, data, precision, world.device)
    state = TrainState(cfg, model, opt.optimizer, world.rank, world.world_size, data.steps_per_epoch)
    run = _Run(cfg, world, output, precision, data, model, teacher, *_wrap(cfg, model, world), opt, state,
               list(callbacks))
    if ckpt is not None:
        _restore(run, ckpt, path, changes)
    _main_writes(world, f"write the run's records in {output}", lambda: _write_run_info(run, path, changes))
    return run


def _restore(run: _Run, ckpt: dict, path: Path, changes: dict[str, list]) -> None:
    opt, s = run.opt, run.state
    opt.optimizer.load_state_dict(ckpt["optimizer"])
    opt.scheduler.load_state_dict(ckpt["scheduler"])
    for group, base, lr_at in zip(opt.optimizer.param_groups, opt.scheduler.base_lrs, opt.scheduler.lr_lambdas):
        group["lr"] = base * lr_at(opt.scheduler.last_epoch)  # this run's schedule (a resume may change lr, min_lr)
    if ckpt["scaler"]:  # an fp16 run's scaler (empty when saved disabled: a resume may change the precision)
        opt.scaler.load_state_dict(ckpt["scaler"])
    if opt.ema is not None and ckpt["ema"] is not None:
        opt.ema.load_state_dict(ckpt["ema"])
    s.epoch, s.step, s.global_step = ckpt["epoch"], ckpt["step"], ckpt["global_step"]
    s.epoch_losses, s.history, run.best_top1 = ckpt["epoch_losses"], ckpt["history"], ckpt["best_top1"]
    s.pending, s.seconds = ckpt.get("pending"), ckpt.get("seconds", 0.0)  # (earlier versions have neither)
    _set_rng_states(ckpt["rng"])
    if isinstance(run.data.loaders, DaliLoaders):
        if len(ckpt["dali"]) != run.world.world_size:
            raise ValueError(f"checkpoint {path} holds the DALI pipelines of {len(ckpt['dali'])} process(es): loader "
                             f"'dali' resumes with as many processes (each reads its own shard), not "
                             f"{run.world.world_size}")
        run.data.loaders.restore(ckpt["dali"][run.world.rank])
    if run.world.main:
        changed = "".join(f"; {k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
        print(f"resumed from {path}: epoch {s.epoch + 1}, step {s.step}/{run.data.steps_per_epoch}{changed}", flush=True)


# %% [markdown]
# ### What a run writes
#
# `run.json` (the config, the world, the batch sizes, the learning rate, the versions, the command line) when
# the run starts, and a line in `invocations.jsonl` every time it is started or resumed (so a run extended with
# more epochs, or resumed on another number of GPUs, keeps the record of each start); and checkpoints: `last.pt`
# at every epoch end and every `ckpt_every` steps, `best.pt` when the top-1 improved. Only rank 0 writes. No
# checkpoint ever holds non-finite weights: a step can turn the weights to NaN while its loss was still finite,
# and saving them would make the "last good checkpoint" a bad one, so `_checkpoint` refuses them on every
# process and says which file is the last good one (if any).
#
# A resumed run must be the same run: every setting that changes what it means (data, fraction, classes,
# seed, augmentation, model, batch, warm-up) must match the checkpoint's, and the message lists each
# difference; other logging or workers, another device or number of processes (at the same global batch) are
# fine. A few settings may change to *mend* a run — those a non-finite loss or a moved dataset sends a user
# back with: `lr`, `min_lr`, `clip_grad`, `precision`, `data_root`, and `epochs` to extend it. Each change is
# printed and recorded in the start's line of `invocations.jsonl` (`"changed": {"lr": [old, new]}`), and the
# new schedule holds from the first step after the resume (`_restore` sets the optimiser's rate from it).
#
# Only rank 0 writes, so a write that fails there — a full disk, a lost permission — must stop the others
# too: `_main_writes` runs the write on rank 0, then tells every process in one all-reduce whether it failed.
# Without it the others would wait at their next collective for the process group's 30-minute timeout. The
# same pattern lets rank 0 list an image folder first (chapter 16 caches the list) and the others read the
# cache after it.

# %%
#| exporti
def _check_output(output: Path) -> None:
    """The run folder exists and is writable; temporary files that a killed run left behind are removed."""
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / ".write-test"
        probe.write_text("ok")
        probe.unlink()
        for stale in output.glob("*.tmp"):  # a checkpoint or log write that was killed before its rename
            stale.unlink()
    except OSError as e:
        raise ValueError(f"output directory {output} is not writable ({e.strerror}): choose another --output") from None


def _write_run_info(run: _Run, resumed_from: Path | None, changes: dict[str, list]) -> None:
    """`run.json` when the run starts (a resumed run keeps it), and one line per start in `invocations.jsonl`,
    with the settings a resume changed ({setting: [old, new]})."""
    d = run.data
    info = {"config": asdict(run.cfg), "world_size": run.world.world_size, "batch_size": d.batch_size,
            "global_batch": d.global_batch, "scaled_lr": scaled_lr(run.cfg.lr, d.global_batch),
            "steps_per_epoch": d.steps_per_epoch, "num_workers": d.num_workers, "device": str(run.world.device),
            "precision": run.precision,
            "seed": run.cfg.seed, "versions": _versions(), "command": sys.argv}
    if resumed_from is None:
        (run.output / "run.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resumed_from": resumed_from, "changed": changes, **info}
    with open(run.output / "invocations.jsonl", "a") as f:
        f.write(json.dumps(line, default=str) + "\n")


def _last_good(run: _Run) -> str:
    path = run.output / "last.pt"
    return f"{path} is the last good checkpoint" if path.exists() else "no checkpoint was written yet"


def _versions() -> dict[str, str]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "convit_edu": convit_edu.__version__}


def _checkpoint(run: _Run, name: str = "last.pt") -> None:
    s, opt, d = run.state, run.opt, run.data
    weights = run.model.state_dict()
    floats = {k: t for k, t in weights.items() if t.is_floating_point()}
    if not bool(torch.stack([torch.isfinite(t).all() for t in floats.values()]).all()):  # one wait for the device
        bad = [k for k, t in floats.items() if not bool(torch.isfinite(t).all())]
        raise FloatingPointError(  # every process holds the same weights, so every process stops here
            f"the weights became non-finite ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}) by "
            f"optimiser step {s.global_step} and were not saved; {_last_good(run)}: lower --lr, set --clip-grad, "
            "or use bf16/fp32 instead of fp16")
    dali = _dali_states(run)
    _main_writes(run.world, f"write the checkpoint {run.output / name}", lambda: save_checkpoint({
        "format": CHECKPOINT_FORMAT, "config": asdict(run.cfg), "model": weights,
        "optimizer": opt.optimizer.state_dict(), "scheduler": opt.scheduler.state_dict(),
        "scaler": opt.scaler.state_dict(), "ema": opt.ema.state_dict() if opt.ema is not None else None,
        "epoch": s.epoch, "step": s.step, "global_step": s.global_step,
        "sampler": {"epoch": s.epoch, "start": s.step * run.cfg.accum_steps * d.batch_size},
        "dali": dali, "world_size": run.world.world_size, "global_batch": d.global_batch, "rng": _rng_states(),
        "epoch_losses": s.epoch_losses, "history": s.history, "pending": s.pending, "best_top1": run.best_top1,
        "seconds": s.seconds, "num_classes": d.num_classes,
    }, run.output / name))



def _dali_states(run: _Run) -> list[bytes] | None:
    """Every process's DALI pipeline state (rank order), gathered to all: each process reads its own shard."""
    if not isinstance(run.data.loaders, DaliLoaders):
        return None
    states = [run.data.loaders.state()] * run.world.world_size
    if run.world.world_size > 1:
        dist.all_gather_object(states, states[0])
    return states


# %% [markdown]
# ### One optimiser step
#
# `accum_steps` micro-batches, each mixed (MixUp/CutMix) and run under autocast; DDP synchronises the gradients
# on the last one only. The step's loss and whether it was finite stay **on the device**: reading a number back
# (`.item()`, `.tolist()`) makes the CPU wait for the GPU to finish everything queued, and a GPU that waits for
# the CPU to queue the next step idles. So the loop reads back once per logging interval (`log_every` steps,
# the end of an epoch, a checkpoint or a stop): one all-reduce carries, for every process at once, the losses of
# the steps since the last read-back, whether each was finite, and whether a stop signal arrived, so that every
# process takes the same decision at the same step. The price: a non-finite loss is noticed up to `log_every`
# steps late, after the optimiser has used it — which is why checkpoints refuse non-finite weights and the
# error names the last good checkpoint.

# %%
#| exporti
def _micro_batches(run: _Run, batches) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward over `accum_steps` micro-batches; (local mean loss, non-finite flag) as tensors."""
    cfg, d, losses = run.cfg, run.data, []
    for micro in range(cfg.accum_steps):
        t0 = time.perf_counter()
        images, labels = next(batches)
        run.data_wait += time.perf_counter() - t0  # the host blocked on the loader: a starving device
        images, targets = images.to(run.world.device, non_blocking=True), labels.to(run.world.device, non_blocking=True)
        images = finish_batch(images, d.finish, train=True)
        if d.mixup is not None:
            images, targets = d.mixup(images, targets)
        sync = micro == cfg.accum_steps - 1 or run.ddp is run.model
        with contextlib.nullcontext() if sync else run.ddp.no_sync():
            with autocast(run.world.device, run.precision):
                teacher_logits = None
                if run.teacher is not None:
                    with torch.no_grad():
                        teacher_logits = run.teacher(images)
                loss = train_loss(run.forward(images), targets, teacher_logits, d.smoothing)
            run.opt.scaler.scale(loss / cfg.accum_steps).backward()
        losses.append(loss.detach().float())
    loss = torch.stack(losses).mean()
    return loss, (~torch.isfinite(loss)).float()


def _optimiser_step(run: _Run, batches, epoch: int, step: int) -> None:
    """One optimiser step; its loss stays on the device until `_read_back`."""
    cfg, s, opt, world = run.cfg, run.state, run.opt, run.world
    _seed_step(cfg.seed, world.rank, epoch, step)
    run.unread.append(torch.stack(_micro_batches(run, batches)))
    if cfg.clip_grad:
        opt.scaler.unscale_(opt.optimizer)
        nn.utils.clip_grad_norm_(run.model.parameters(), cfg.clip_grad)
    opt.scaler.step(opt.optimizer)
    opt.scaler.update()
    opt.optimizer.zero_grad(set_to_none=True)
    opt.scheduler.step()
    if opt.ema is not None:
        _update_ema(opt.ema, run.model, cfg.ema_decay, first=s.global_step == 0)
    s.step, s.global_step = step + 1, s.global_step + 1


def _update_ema(ema: AveragedModel, model: nn.Module, decay: float, first: bool) -> None:
    """What `AveragedModel.update_parameters` does with an EMA average (a copy of the model at the first update,
    then ema ← decay·ema + (1 − decay)·model for parameters and buffers), without its two host reads of
    `n_averaged` per step: whether this is the first update is known on the host."""
    with torch.no_grad():
        averaged = [*ema.module.parameters(), *ema.module.buffers()]
        current = [*model.parameters(), *model.buffers()]
        if first:
            torch._foreach_copy_(averaged, current)
        else:
            floats = [(a, c) for a, c in zip(averaged, current) if a.is_floating_point()]
            torch._foreach_lerp_([a for a, _ in floats], [c for _, c in floats], 1 - decay)
            for a, c in zip(averaged, current):  # integer buffers (counters) follow the model
                if not a.is_floating_point():
                    a.copy_(c)
        ema.n_averaged += 1


def _read_back(run: _Run, signals: _StopSignals) -> bool:
    """The one host sync of a logging interval: the losses of the steps since the last one, summed over the
    processes with the stop signals they received; raises on a non-finite loss. Returns whether any process
    received a signal."""
    s, world = run.state, run.world
    received = torch.tensor([[float(signals.received is not None), 0.0]], device=world.device)
    *steps, (signalled, _) = _all_reduce(torch.cat([*[t[None] for t in run.unread], received])).tolist()
    run.unread.clear()
    for i, (loss_sum, bad_ranks) in enumerate(steps):
        if bad_ranks:
            at = s.step - len(steps) + i + 1
            raise FloatingPointError(
                f"non-finite loss ({loss_sum / world.world_size}) at epoch {s.epoch + 1}, step {at} (global step "
                f"{s.global_step - len(steps) + i + 1}) on {bad_ranks:.0f} of {world.world_size} process(es), "
                f"read back {len(steps) - i - 1} step(s) later (losses are read every log_every steps); the weights "
                f"were not saved; {_last_good(run)}: lower --lr, set --clip-grad, or use bf16/fp32 instead of fp16")
    s.epoch_losses += [loss_sum / world.world_size for loss_sum, _ in steps]
    s.loss = s.epoch_losses[-1] if steps else s.loss
    return bool(signalled)


# %% [markdown]
# ### One epoch, and its end
#
# An epoch starts the sampler at this process's position (mid-epoch after a resume) and runs optimiser steps
# until the epoch is done or a stop is asked for (a signal on any process, or a hook's `state.stop`), writing
# `last.pt` every `ckpt_every` steps. Its end first checkpoints — so that a signal during a long evaluation
# (an ImageNet pass takes minutes) loses nothing: the checkpoint keeps the epoch's training numbers as
# `pending`, and a run resumed from it evaluates that epoch first — then evaluates the model (and the EMA),
# appends the row to the log, rewrites the log files, and checkpoints again: `best.pt` first when the top-1
# improved, then `last.pt`, which records the best score. In that order a kill at any moment leaves a `last.pt`
# and a `best.pt` that agree: killed while `best.pt` is written, the resumed run re-evaluates the epoch and
# writes it again.

# %%
#| exporti
def _why(signals: _StopSignals, signalled: bool) -> str:
    return (signals.received or "a signal to another process") if signalled else "callback"


def _run_epoch(run: _Run, epoch: int, progress: _Progress, signals: _StopSignals) -> tuple[str | None, int, float]:
    """Optimiser steps until the epoch ends or a stop is asked for: (why it stopped or None, images, seconds)."""
    cfg, s, d = run.cfg, run.state, run.data
    s.epoch = epoch
    batches = d.loaders.epoch(epoch, start=s.step * cfg.accum_steps * d.batch_size)
    run.model.train()
    t0, images, run.data_wait = time.perf_counter(), 0, 0.0
    last = (t0, 0.0)  # time and data wait at the last read-back
    for step in progress.steps_of(range(s.step, d.steps_per_epoch)):
        _optimiser_step(run, batches, epoch, step)
        images += d.global_batch
        for cb in run.callbacks:
            cb.on_step_end(s)
        checkpoint = bool(cfg.ckpt_every) and s.global_step % cfg.ckpt_every == 0
        if not (s.step % cfg.log_every == 0 or s.step == d.steps_per_epoch or s.stop or checkpoint):
            continue  # no host sync: the device runs ahead
        signalled = _read_back(run, signals)
        now = time.perf_counter()
        progress.step(s, run.opt.optimizer.param_groups[0]["lr"], images / (now - t0),
                      data_wait=run.data_wait - last[1], interval=now - last[0])
        last = (now, run.data_wait)
        if signalled or s.stop:
            return _why(signals, signalled), images, time.perf_counter() - t0
        if checkpoint:
            _checkpoint(run)
    return None, images, time.perf_counter() - t0


def _end_epoch(run: _Run, epoch: int, images: int, seconds: float, progress: _Progress) -> None:
    """Checkpoint the finished epoch; when it is evaluated (every `eval_every` epochs and the last), checkpoint it
    before its (possibly long) evaluation, then evaluate it."""
    s = run.state
    row = {"epoch": epoch + 1, "step": s.global_step, "train_loss": sum(s.epoch_losses) / max(1, len(s.epoch_losses)),
           "lr": run.opt.optimizer.param_groups[0]["lr"], "images_per_s": images / seconds, "epoch_time_s": seconds,
           "data_wait_s": run.data_wait, "data_wait_share": run.data_wait / seconds}
    s.epoch, s.step, s.epoch_losses, s.seconds = epoch + 1, 0, [], s.seconds + seconds
    if s.epoch % run.cfg.eval_every and s.epoch < run.cfg.epochs:  # not evaluated: no row
        _checkpoint(run)
        for cb in run.callbacks:
            cb.on_epoch_end(s)
        return
    s.pending = row
    _checkpoint(run)
    _evaluate_epoch(run, progress)


def _evaluate_epoch(run: _Run, progress: _Progress) -> None:
    """Score the pending epoch and log it; save `best.pt` first when the top-1 improved, then `last.pt` — so that
    a stop or a kill at any moment leaves a `last.pt` whose best score is the one `best.pt` holds."""
    s, t0 = run.state, time.perf_counter()
    row = {**s.pending, **_scores(run)}
    s.seconds += time.perf_counter() - t0
    row["time_s"] = s.seconds
    s.history.append(row)
    s.pending = None
    progress.epoch_end(row)
    improved = row["val_top1"] > run.best_top1
    if improved:
        run.best_top1 = row["val_top1"]
        _checkpoint(run, "best.pt")
    _main_writes(run.world, f"write the logs in {run.output}", lambda: _write_logs(s.history, run.output))
    _checkpoint(run)
    for cb in run.callbacks:
        cb.on_epoch_end(s)


def _scores(run: _Run) -> dict:
    """Validation loss, top-1 and top-5 of the model (and of its EMA), and the mean gate σ(λ) of each layer."""
    world = run.world
    models = {"val": run.model, **({"ema": run.opt.ema.module} if run.opt.ema is not None else {})}
    # inference keeps no activations for a backward pass: twice the training batch fits, with the run's workers
    result = evaluate(models, run.data.val_set, batch_size=2 * run.data.batch_size, device=world.device,
                      precision=run.precision, num_workers=run.data.num_workers, rank=world.rank,
                      world_size=world.world_size, finish=run.data.finish)
    scores = {f"{name}_{key}": value for name, metrics in result.items() for key, value in metrics.items()}
    return {**scores, "gates": gate_means(run.model)}


# %% [markdown]
# ### `fit`: the algorithm
#
# Epoch after epoch: run the epoch; if it was stopped before its last step, checkpoint where it is and
# return; otherwise end the epoch, and return there if a stop was asked for meanwhile. Then the hooks' last
# call, the curves, and what happened.

# %%
#| exporti
def _fit(run: _Run) -> TrainResult:
    cfg, s, world = run.cfg, run.state, run.world
    progress = _Progress(cfg.progress if world.main else "none", cfg.epochs, cfg.log_every)
    for cb in run.callbacks:
        cb.on_train_begin(s)
    stopped = None
    with _StopSignals() as signals:
        if s.pending is not None:  # resumed from a checkpoint written before its epoch was evaluated
            _evaluate_epoch(run, progress)
        for epoch in progress.epochs_of(range(s.epoch, cfg.epochs)):
            stopped, images, seconds = _run_epoch(run, epoch, progress, signals)
            if stopped and s.step < run.data.steps_per_epoch:
                _checkpoint(run)
                break
            _end_epoch(run, epoch, images, seconds, progress)
            signalled = _all_reduce(torch.tensor(float(signals.received is not None), device=world.device)).item()
            if stopped or signalled or s.stop:
                stopped = stopped or _why(signals, bool(signalled))
                break
    for cb in run.callbacks:
        cb.on_train_end(s)
    if world.main:
        if s.history:
            plot_history(s.history).savefig(run.output / "curves.png")
        if stopped:
            print(f"stopped by {stopped} at epoch {s.epoch + 1}, step {s.step}: checkpoint "
                  f"{run.output / 'last.pt'}; continue with --resume auto", flush=True)
    ema = run.opt.ema.module if run.opt.ema is not None else None
    return TrainResult(run.model, ema, s.history, run.output, stopped)


# %% [markdown]
# And the one public entry point, for notebooks and the command line alike:

# %%
#| export
def train(cfg: TrainConfig, *, model: nn.Module | None = None, datasets: tuple | None = None,
          teacher: nn.Module | None = None, callbacks: Sequence[Callback] = ()) -> TrainResult:
    """Train as `cfg` says, on one process or under `torchrun`; the single entry point of notebook and CLI.

    By default the model is `cfg.model` with `cfg.model_args` and the data `build_datasets(cfg.data)` with the
    augmentation `cfg.aug`; pass `model`, `datasets` = (train, val, class names) or `teacher` to use your own.
    Returns when the last epoch is done, or early (with a checkpoint) on SIGTERM/SIGINT or `state.stop`.
    """
    world = _init_world(cfg.device)
    try:
        return _fit(_start(cfg, world, model, datasets, teacher, callbacks))
    finally:
        if world.owns_group:
            dist.destroy_process_group()
