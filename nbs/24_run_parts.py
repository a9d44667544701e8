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
# # What a run is made of: data, models, resume, records
#
# A run is built in the order that lets every bad input fail before any training work — the config was
# checked when it was made; then the output folder (writable?), the data (more processes than samples? a batch
# larger than a process's share?), the model and the resume checkpoint (the same model? the same global
# batch?), the optimisation — and only then trained. `Trainer.__init__` (chapter 25) is that order; the
# functions here are the pieces that need no trainer, each checked below on a small config.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp run_parts
# The parts of a training run that need no trainer: its datasets and models, the checkpoint it resumes from and
# the state restored from it, its output folder and the records it writes there.

# %%
#| export
import contextlib
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
import torchvision
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from torch.optim.swa_utils import AveragedModel
from torch.utils.data import Dataset

import convit_edu
from convit_edu.augment import AUGMENTATIONS, AugConfig, build_transforms
from convit_edu.callbacks import TrainState
from convit_edu.checkpoints import read_checkpoint, set_rng_states
from convit_edu.config import TrainConfig
from convit_edu.dali import DaliLoaders
from convit_edu.datasets import build_datasets
from convit_edu.distributed import World, all_reduce, run_on_main
from convit_edu.gpu_decode import build_gpu_decode_loaders
from convit_edu.loaders import DataLoaders, build_loaders
from convit_edu.models import VisionTransformer
from convit_edu.optimisation import build_teacher, scaled_lr

# %%
import tempfile
from dataclasses import replace

from convit_edu.checks import expect_error

world = World(0, 1, torch.device("cpu"), False)  # one process on the CPU: rank 0 of 1
tmp = Path(tempfile.mkdtemp())
tiny = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 48, "depth": 2,
                   "local_up_to_layer": 1}, data="fake", data_args={"num_train": 64, "num_val": 16, "image_size": 16},
                   epochs=1, batch_size=8, precision="fp32", num_workers=0, progress="none", output=str(tmp / "run"))

# %% [markdown]
# ## The data
#
# The datasets (the config's, or the caller's), the per-process batch and the global batch it implies, chapter
# 16's `build_loaders` for this process's share with `cfg.loader_workers()` workers (by default what this
# process's share of the node's CPUs allows), and the batch mixing of the augmentation. The config's own
# datasets ship uint8 crops from the workers, and `finish_batch` normalises and erases each batch on the device
# with chapter 16's `DeviceTransforms`; a caller's datasets that give float tensors pass through unchanged.
# With `loader="dali"` chapter 17's `DaliLoaders` replaces `build_loaders`: the same uint8 batches, decoded on
# the GPU; its exact resume is the pipelines' own state, one per process, saved in the checkpoint under `dali`
# (so it resumes on as many processes as it ran).
#
# **Rank 0 writes, and builds the datasets first.** Every write of rank 0 goes through chapter 21's
# `run_on_main`, so that a full disk there stops every process at once; rank 0 also builds the config's datasets
# first, so that an ImageNet folder's 1.28 M file names are listed once, by rank 0, which caches the list
# (chapter 12), and read from that cache by the others.

# %%
#| export
def config_datasets(cfg: TrainConfig, world: World, aug: AugConfig | None) -> tuple:
    """The config's datasets (train, val, class names), built by rank 0 first (an image folder's file list is
    then cached, chapter 12) and by the other processes after it, from that cache. With `loader="torchvision"`
    their samples are uint8 crops, for `DeviceTransforms` to finish on the device."""
    if aug is None:
        raise ValueError("aug None (no augmentation) needs datasets passed to train(); the config's own "
                         f"datasets need an augmentation ({', '.join(AUGMENTATIONS)})")
    train_tf, val_tf = build_transforms(aug, on_device=True) if cfg.loader == "torchvision" else (None, None)
    build = partial(build_datasets, cfg.data, cfg.data_root, train_transform=train_tf, val_transform=val_tf,
                    fraction=cfg.fraction, max_classes=cfg.classes, **cfg.data_args)
    datasets = run_on_main(world, f"read the dataset in {cfg.data_root}", build)
    return datasets if world.main else build()


# %% [markdown]
# The config's fake data: its crops leave the workers as uint8, a quarter of the bytes of float32; and a config
# without augmentation is refused here, since it is meant for datasets that the caller prepared.

# %%
train_set, val_set, classes = config_datasets(tiny, world, tiny.aug_config())
image, label = train_set[0]
assert image.dtype == torch.uint8 and image.shape == (3, 16, 16), (image.dtype, image.shape)
print(f"{len(train_set)} training and {len(val_set)} validation images of {len(classes)} classes;",
      f"a sample: {image.dtype} {tuple(image.shape)}")
message = expect_error(lambda: config_datasets(replace(tiny, aug=None), world, None))
assert "needs datasets passed to train()" in message
print(message)

# %% [markdown]
# The loaders are of the config's kind (`loader`): chapter 16's workers, which decode and augment each image, the
# GPU-decoding ones of chapter 17, whose workers only read file bytes, or DALI's pipelines (chapter 17). Each kind
# gives the train batches of an epoch from a position (`epoch(e, start)`) and this process's evaluation batches
# (`val`), whose workers, like the train loader's, are started once and kept.

# %%
#| export
def build_run_loaders(cfg: TrainConfig, world: World, aug: AugConfig | None, train_set: Dataset, val_set: Dataset,
                      batch_size: int, num_workers: int) -> DataLoaders | DaliLoaders:
    """This process's loaders of the kind `cfg.loader` names, `batch_size` images a step (val: twice that)."""
    common = dict(batch_size=batch_size, num_replicas=world.world_size, rank=world.rank, seed=cfg.seed)
    if cfg.loader == "dali":
        return DaliLoaders(train_set, val_set, aug, num_threads=max(1, num_workers), **common,
                           device_id=world.device.index if world.device.type == "cuda" else None)
    if cfg.loader == "gpu-decode":
        return build_gpu_decode_loaders(train_set, val_set, aug, num_workers=num_workers, repeats=cfg.repeats,
                                        device=world.device, **common)
    return build_loaders(train_set, val_set, num_workers=num_workers, repeats=cfg.repeats, **common)

# %%
run_loaders = build_run_loaders(tiny, world, tiny.aug_config(), train_set, val_set, batch_size=8, num_workers=0)
images, labels = next(run_loaders.epoch(0))
print(f"train batch {tuple(images.shape)} {images.dtype}; val batches of {[len(y) for _, y in run_loaders.val]}")
assert images.shape == (8, 3, 16, 16) and sum(len(y) for _, y in run_loaders.val) == len(val_set)

# %% [markdown]
# ## The model, the teacher, the resume checkpoint
#
# The initial weights are a function of the seed alone, the same on every process. A teacher (hard
# distillation, SM B; chapter 20's `build_teacher`) is frozen, and the student gets a distillation head.

# %%
#| export
def build_models(cfg: TrainConfig, num_classes: int, device: torch.device, model: nn.Module | None = None,
                 teacher: nn.Module | None = None) -> tuple[nn.Module, nn.Module | None]:
    """(student, teacher or None) on `device`: `model`, else `cfg.model` (with a distillation head when there is
    a teacher) seeded by `cfg.seed` alone; `teacher`, else `cfg.distill_teacher` when set, in eval mode."""
    torch.manual_seed(cfg.seed)  # the initial weights are a function of the seed, identical on every rank
    if teacher is None and cfg.distill_teacher:
        teacher = build_teacher(cfg.distill_teacher, cfg.teacher_checkpoint, num_classes, cfg.img_size)
    if model is None:
        model = VisionTransformer(cfg.model_config(num_classes, distilled=teacher is not None))
    return model.to(device), teacher.to(device).eval() if teacher is not None else None


# %% [markdown]
# Two builds from one seed hold the same weights, as every process's build must; a teacher passed in comes back
# in eval mode, and the student beside it has a distillation token and head.

# %%
first, _ = build_models(tiny, len(classes), world.device)
again, _ = build_models(tiny, len(classes), world.device)
assert all(torch.equal(p, q) for p, q in zip(first.state_dict().values(), again.state_dict().values()))
student, teacher = build_models(tiny, len(classes), world.device, teacher=nn.Linear(3 * 16 * 16, len(classes)))
assert student.config.distilled and not first.config.distilled and not teacher.training
print(f"seed {tiny.seed}: the same {sum(p.numel() for p in first.parameters())} weights twice; with a teacher,",
      f"{sum(p.numel() for p in student.parameters()) - sum(p.numel() for p in first.parameters())} more for the",
      "distillation token and head")

# %% [markdown]
# A checkpoint to resume from must hold the same run (chapter 20's `check_resume`); it may come from another
# number of processes, even mid-epoch: the sampler's position is a place in the epoch's one global stream, and
# each sample's augmentation is seeded by that place (chapter 15). Every process must see the checkpoint, or
# none: `--resume auto` is decided together (an all-reduce of "I see `last.pt`"), because processes that
# disagreed would wait forever for each other at the first collective. The settings a resume mends are printed
# and recorded in `invocations.jsonl` (`"changed": {"lr": [old, new]}`), and the new schedule holds from the
# first step after the resume.
#
# The trainer restores a checkpoint in two moves: the weights are loaded before the optimiser and the EMA are
# made (the EMA starts as a copy of the model), then `restore_run` puts back everything else — optimiser,
# schedule, scaler, EMA, position, log, best score and every generator's state, and DALI's pipelines from the
# states that `dali_states` gathered for the checkpoint. Chapter 25 checks that a resumed trainer holds what its
# checkpoint saved.

# %%
#| export
def resume_checkpoint(cfg: TrainConfig, world: World) -> tuple[dict | None, Path | None]:
    """(checkpoint, its path) that `cfg.resume` names — `auto`: `output/last.pt` when it exists — or (None,
    None); every process decides together, and one that sees the file while another does not is refused."""
    if cfg.resume is None:
        return None, None
    path = Path(cfg.output) / "last.pt" if cfg.resume == "auto" else Path(cfg.resume)
    seen = int(all_reduce(torch.tensor(float(path.exists()), device=world.device)).item())
    if 0 < seen < world.world_size:  # every process must take the same decision, or the first collective hangs
        raise ValueError(f"{seen} of {world.world_size} processes see {path}: put --output (and the checkpoint) "
                         "on a file system that every node shares")
    if cfg.resume == "auto" and not seen:
        if world.main:
            print(f"resume auto: no {path} yet, starting from scratch", flush=True)
        return None, None
    return read_checkpoint(path), path


def restore_run(ckpt: dict, path: Path, changes: dict[str, list], state: TrainState, scheduler: LambdaLR,
                scaler: torch.amp.GradScaler, ema: AveragedModel | None, loaders: DataLoaders | DaliLoaders,
                world: World) -> float:
    """Put the checkpoint `ckpt` (read from `path`, with the settings `changes` that the resume mends) back into
    a new run: `state.optimizer`, the schedule (at this run's rates), the scaler, the EMA, the position and log in
    `state`, every generator and DALI's pipelines. Returns the best top-1 so far."""
    state.optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    for group, base, lr_at in zip(state.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * lr_at(scheduler.last_epoch)  # this run's schedule (a resume may change lr)
    if ckpt["scaler"]:  # an fp16 run's scaler (empty when saved disabled: a resume may change the precision)
        scaler.load_state_dict(ckpt["scaler"])
    if ema is not None and ckpt["ema"] is not None:
        ema.load_state_dict(ckpt["ema"])
    state.epoch, state.step, state.global_step = ckpt["epoch"], ckpt["step"], ckpt["global_step"]
    state.epoch_losses, state.history = ckpt["epoch_losses"], ckpt["history"]
    state.pending, state.seconds = ckpt.get("pending"), ckpt.get("seconds", 0.0)  # (earlier versions have neither)
    set_rng_states(ckpt["rng"])
    if isinstance(loaders, DaliLoaders):
        if len(ckpt["dali"]) != world.world_size:
            raise ValueError(f"checkpoint {path} holds the DALI pipelines of {len(ckpt['dali'])} process(es): "
                             f"loader 'dali' resumes with as many processes (each reads its own shard), not "
                             f"{world.world_size}")
        loaders.restore(ckpt["dali"][world.rank])
    if world.main:
        changed = "".join(f"; {k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
        print(f"resumed from {path}: epoch {state.epoch + 1}, step {state.step}/{state.steps_per_epoch}{changed}",
              flush=True)
    return ckpt["best_top1"]


def dali_states(loaders: DataLoaders | DaliLoaders, world: World) -> list[bytes] | None:
    """Every process's DALI pipeline state (rank order), gathered to all, for a checkpoint's `dali` (each process
    reads its own shard); None for the torchvision loaders, whose position is the sampler's."""
    if not isinstance(loaders, DaliLoaders):
        return None
    states = [loaders.state()] * world.world_size
    if world.world_size > 1:
        dist.all_gather_object(states, states[0])
    return states


# %% [markdown]
# With no resume, or `auto` before the first checkpoint, a run starts from scratch; a named checkpoint that is
# missing is an error, not a silent fresh start.

# %%
assert resume_checkpoint(tiny, world) == (None, None)
assert resume_checkpoint(replace(tiny, resume="auto"), world) == (None, None)
message = expect_error(lambda: resume_checkpoint(replace(tiny, resume=str(tmp / "nowhere.pt")), world),
                       FileNotFoundError)
assert "nowhere.pt" in message
print(message)

# %% [markdown]
# ## The optimisation
#
# The optimisation is chapter 20's: `build_optimizer` (AdamW and the DeiT schedule), the fp16 loss scaler (a
# no-op in other precisions) and the EMA of the weights, updated by `update_ema` without reading the device
# back. Then the wrappers: DDP for several processes and `torch.compile` when asked.
#
# DDP all-reduces the gradients in buckets; with `gradient_as_bucket_view` the gradients *are* views of those
# buckets, which saves a copy of every gradient per step. By default DDP also sends rank 0's buffers to every
# process before each forward, accumulation micro-steps included. The only buffers of a ConViT of PSA layers
# (the App. A ablation) are its `rel_indices`: non-persistent constants that every process builds alike, 4.6 MB
# per forward at 224 px for nothing (the fast GPSA holds none: it never builds P, chapter 06). So buffers travel
# only when the model has state buffers, the ones a `state_dict` keeps, such as BatchNorm's running statistics.
#
# A compiled run spends its first step compiling, and a requeued job would compile again from nothing: torch's
# compile cache sits in `/tmp` of a node that may be another one. `compile_cache` points the cache at the run's
# folder for the duration of the run, unless `TORCHINDUCTOR_CACHE_DIR` is set, and then puts the variable back.
# The trainer reports the first step's seconds as `compile_s`.

# %%
#| export
def wrap_model(model: nn.Module, world: World, compile: bool) -> tuple[nn.Module, nn.Module]:
    """(`model` in DDP when there are several processes, else `model`; what the step calls: that, compiled when
    `compile`). DDP reuses its buckets as gradients, and broadcasts buffers only when the model has state buffers."""
    ddp = model
    if world.world_size > 1:
        state = model.state_dict(keep_vars=True)
        ddp = DistributedDataParallel(model, device_ids=[world.device] if world.device.type == "cuda" else None,
                                      broadcast_buffers=any(b is state.get(n) for n, b in model.named_buffers()),
                                      gradient_as_bucket_view=True)
    return ddp, torch.compile(ddp) if compile else ddp


@contextlib.contextmanager
def compile_cache(output: Path, compile: bool):
    """For the duration of a compiled run: torch's compile cache in `output/compile-cache` (a requeued job finds
    it there), unless `TORCHINDUCTOR_CACHE_DIR` is set; the variable is restored afterwards."""
    if not compile or "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str((output / "compile-cache").resolve())
    try:
        yield
    finally:
        del os.environ["TORCHINDUCTOR_CACHE_DIR"]

# %% [markdown]
# A PSA ConViT's buffers are all constants, so DDP would not broadcast them; a model with BatchNorm has running
# statistics, which it would. (The check builds the real DDP on a one-process gloo group; a run of one process
# gets no wrapper at all.) The compile cache is set inside the run and gone after it.

# %%
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
two = World(0, 2, torch.device("cpu"), False)  # a world of two as DDP's flags are concerned
convit = VisionTransformer(replace(tiny, model_args={**tiny.model_args, "local_attention": "psa"}).model_config(4, distilled=False))
with_bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
wrapped = {name: wrap_model(m, two, compile=False)[0] for name, m in (("ConViT", convit), ("BatchNorm", with_bn))}
dist.destroy_process_group()
print({name: ddp.broadcast_buffers for name, ddp in wrapped.items()})
assert not wrapped["ConViT"].broadcast_buffers and wrapped["BatchNorm"].broadcast_buffers
psa_tiny = replace(tiny, model_args={"local_attention": "psa"}, img_size=224).model_config(1000, distilled=False)
buffer_mb = sum(b.numel() * b.element_size() for b in VisionTransformer(psa_tiny).buffers()) / 1e6
print(f"PSA ConViT-Ti at 224 px: {buffer_mb:.1f} MB of buffers that DDP would send before every forward")
assert round(buffer_mb, 1) == 4.6
assert not list(VisionTransformer(replace(psa_tiny, local_attention="gpsa")).buffers())  # the fast GPSA: none
assert wrap_model(convit, world, compile=False) == (convit, convit)
yours = os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # as on a machine that does not set it
with compile_cache(tmp / "run", compile=True):
    inside = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
assert inside == str((tmp / "run" / "compile-cache").resolve()) and "TORCHINDUCTOR_CACHE_DIR" not in os.environ
if yours is not None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = yours

# %% [markdown]
# ## What a run writes
#
# `run.json` (the config, the world, the batch sizes, the learning rate, the versions, the command line) when it
# starts, and a line in `invocations.jsonl` every time it is started or resumed (a run extended with more
# epochs, or resumed on another number of GPUs, keeps the record of each start); checkpoints — `last.pt` at
# every epoch end and every `ckpt_every` steps, `best.pt` when the top-1 improved (a second name of that
# epoch's `last.pt`); the logs, `log.jsonl` and `log.csv`, rewritten from the history at each evaluated epoch. No checkpoint ever holds non-finite weights: a
# step can turn the weights to NaN while its loss was still finite, and saving them would make the "last good
# checkpoint" a bad one, so the trainer's `checkpoint` refuses them on every process and names the last good
# one (if any). Before any of it, the output folder must be writable.

# %%
#| export
def check_output(output: Path) -> None:
    """The run folder exists and is writable (else a ValueError naming it); temporary files that a killed run
    left behind are removed."""
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / ".write-test"
        probe.write_text("ok")
        probe.unlink()
        for stale in output.glob("*.tmp"):  # a checkpoint or log write that was killed before its rename
            stale.unlink()
    except OSError as e:
        raise ValueError(f"output directory {output} is not writable ({e.strerror}): choose another --output") from None


def versions() -> dict[str, str]:
    """The versions that a run's results depend on: Python, torch, torchvision and convit_edu."""
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "convit_edu": convit_edu.__version__}


def write_run_info(output: Path, cfg: TrainConfig, world: World, *, batch_size: int, global_batch: int,
                   steps_per_epoch: int, num_workers: int, precision: str, resumed_from: Path | None = None,
                   changes: dict[str, list] | None = None) -> None:
    """`run.json` when the run starts (a resumed run keeps it), and one line per start in `invocations.jsonl`,
    with the checkpoint resumed from and the settings the resume changed ({setting: [old, new]})."""
    info = {"config": asdict(cfg), "world_size": world.world_size, "batch_size": batch_size,
            "global_batch": global_batch, "scaled_lr": scaled_lr(cfg.lr, global_batch),
            "steps_per_epoch": steps_per_epoch, "num_workers": num_workers, "device": str(world.device),
            "precision": precision, "seed": cfg.seed, "versions": versions(), "command": sys.argv}
    if resumed_from is None:
        (output / "run.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resumed_from": resumed_from, "changed": changes or {},
            **info}
    with open(output / "invocations.jsonl", "a") as f:
        f.write(json.dumps(line, default=str) + "\n")


# %% [markdown]
# The output check makes the folder and sweeps a killed run's temporary files, and refuses a folder it cannot
# write — here one whose parent is a file:

# %%
output = Path(tiny.output)
check_output(output)
(output / "last.pt.tmp").write_bytes(b"half a checkpoint")
check_output(output)
assert output.is_dir() and list(output.iterdir()) == []
(tmp / "a-file").write_text("not a folder")
message = expect_error(lambda: check_output(tmp / "a-file" / "run"))
assert "is not writable" in message
print(message)

# %% [markdown]
# The run's records: a first start writes `run.json` and a line of `invocations.jsonl`; a resume that mends the
# learning rate leaves `run.json` as it was and adds a line that says from where it resumed and what changed.

# %%
sizes = dict(batch_size=8, global_batch=8, steps_per_epoch=8, num_workers=0, precision="fp32")
write_run_info(output, tiny, world, **sizes)
first_record = (output / "run.json").read_text()
write_run_info(output, replace(tiny, lr=1e-3), world, **sizes, resumed_from=output / "last.pt",
               changes={"lr": [tiny.lr, 1e-3]})
run = json.loads((output / "run.json").read_text())
starts = [json.loads(line) for line in (output / "invocations.jsonl").read_text().splitlines()]
assert (output / "run.json").read_text() == first_record and run["config"] == asdict(tiny)
assert {"world_size", "batch_size", "global_batch", "scaled_lr", "versions", "command"} <= run.keys()
assert run["scaled_lr"] == scaled_lr(tiny.lr, 8) and set(run["versions"]) == {"python", "torch", "torchvision",
                                                                              "convit_edu"}
assert [s["resumed_from"] for s in starts] == [None, str(output / "last.pt")]
assert starts[1]["changed"] == {"lr": [tiny.lr, 1e-3]} and starts[1]["config"]["lr"] == 1e-3
print("run.json:", ", ".join(run))
print("invocations.jsonl, (resumed?, changed) of each start:", [(s["resumed_from"] is not None, s["changed"])
                                                                for s in starts])
