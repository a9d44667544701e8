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

# %%

# %% [markdown]
# # A run's state and its checkpoint
#
# Everything a run must keep to go on after an interruption, in one place: the state the trainer holds and the
# hooks see, what a checkpoint holds (written here, read here, its keys listed once), the generators' states, and
# the resume — which checkpoint, whether it continues the same run, and putting it back.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp run_state
# A run's state and its checkpoint: what the trainer holds and the hooks see, what a checkpoint holds (written and
# read here), the generators' states, and a resume's checks and restore.

# %%
#| export
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.optim.swa_utils import AveragedModel

from convit_edu.config import TrainConfig
from convit_edu.distributed import World, all_reduce
from convit_edu.files import atomic_write, load_file
from convit_edu.loaders import DataLoaders
from convit_edu.schedule import RunSchedule

# %%
import tempfile
from dataclasses import replace

from convit_edu.checks import expect_error

torch.set_printoptions(precision=4, sci_mode=False)
tmp = Path(tempfile.mkdtemp())

# %% [markdown]
# ## The state
#
# A `TrainState` holds the live objects of a run — the bare model (not wrapped in DDP or compiled), the
# optimiser, its schedule (a function of the step: chapter 23), the fp16 loss scaler, the EMA of the weights — and
# where the run stands: the epoch,
# the optimiser steps done in it, the losses read back so far, the log of evaluated epochs, the best top-1. The
# trainer (chapter 28) keeps its state in one, and its hooks — a `Callback`'s methods — see that one: the
# analysis chapter records nonlocality and the gates σ(λ) during training through it, and a hook that sets
# `state.stop = True` ends the run cleanly (checkpoint, then return), the path a SIGTERM takes.

# %%
#| export
@dataclass
class TrainState:
    """A run's live objects and position: what the trainer holds, what its hooks see and what a checkpoint keeps."""

    cfg: TrainConfig
    model: nn.Module  # the bare model: not wrapped in DDP, not compiled
    optimizer: torch.optim.Optimizer
    rank: int
    world_size: int
    steps_per_epoch: int
    schedule: RunSchedule | None = None  # the learning rate at each step: a function of global_step, never saved
    scaler: torch.amp.GradScaler | None = None  # fp16's loss scaler (disabled in other precisions)
    ema: AveragedModel | None = None  # the EMA of the weights, when cfg.ema_decay is set
    epoch: int = 0  # the current epoch, 0-based
    step: int = 0  # optimiser steps done in this epoch
    global_step: int = 0
    loss: float = float("nan")  # the loss last read back (every log_every steps), averaged over every process
    epoch_losses: list[float] = field(default_factory=list)  # the losses of this epoch's steps so far
    history: list[dict] = field(default_factory=list)  # one row per finished and evaluated epoch
    pending: dict | None = None  # the training half of the last epoch's row, while that epoch is being evaluated
    best_top1: float = -1.0  # the best validation top-1 so far (the epoch kept as best.pt)
    stop: bool = False  # set it to end the run cleanly after the current step
    seconds: float = 0.0  # wall-clock seconds of training and evaluation so far (each row's time_s)


class Callback:
    """A hook on a run: override any of these; `train` calls them on every process, rank 0 included, with the
    run's `TrainState`."""

    def on_train_begin(self, state: TrainState) -> None: ...
    def on_step_end(self, state: TrainState) -> None: ...
    def on_epoch_end(self, state: TrainState) -> None: ...
    def on_train_end(self, state: TrainState) -> None: ...


# %% [markdown]
# ## What a checkpoint holds
#
# The state, the config it ran with, the weights, every generator's state, and what the loaders keep of
# themselves: nothing for the torchvision loaders (their position is the epoch and step), DALI's pipelines'
# own states (chapter 18), one per process, since each reads its own shard. `CHECKPOINT_KEYS` lists what a
# checkpoint holds; `run_checkpoint` writes exactly those, and `read_checkpoint` refuses a file that lacks one.
# Everything in it is a tensor, number, string or container, so it loads with `weights_only=True` (chapter 12:
# no pickled code runs when you open a checkpoint someone sent you), and it is written atomically (chapter 12).
#
# No checkpoint ever holds non-finite weights (`checked_weights`): a step can turn the weights to NaN while its
# loss was still finite, and saving them would make the "last good checkpoint" a bad one.
#
# The generators' states are saved too, though every step reseeds them (chapter 23): a hook that draws between
# steps then draws the same after a resume. CUDA's are not: a list with one state per visible GPU would tie the
# checkpoint to the machine that wrote it.

# %%
#| export
def rng_states() -> dict:
    """The states of torch's (CPU), numpy's and python's generators, as tensors, numbers and tuples: what a
    checkpoint saves under "rng" and loads with `weights_only=True`."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)),
        "python": random.getstate(),
    }


def set_rng_states(states: dict) -> None:
    """Restore the generators from `rng_states()`'s dict (a checkpoint's "rng")."""
    torch.set_rng_state(states["torch"])  # (checkpoints of earlier versions also hold "cuda": not needed, ignored)
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))


# %% [markdown]
# Saved, drawn from, restored: the same draws again, from all three generators.

# %%
torch.manual_seed(0), np.random.seed(0), random.seed(0)
saved = rng_states()
first = (torch.rand(2), np.random.rand(2), random.random())
set_rng_states(saved)
again = (torch.rand(2), np.random.rand(2), random.random())
assert torch.equal(first[0], again[0]) and (first[1] == again[1]).all() and first[2] == again[2]
print("drawn twice from one saved state:", first[0], first[1], round(first[2], 4))

# %%
#| export
CHECKPOINT_FORMAT = "convit-edu-train-3"
CHECKPOINT_KEYS = (
    "format", "config", "model", "optimizer", "scaler", "ema",  # what the run is and holds
    "epoch", "step", "global_step", "epoch_losses", "pending", "history", "best_top1", "seconds",  # where it stands
    "rng", "loader", "world_size", "global_batch", "num_classes")  # generators, loaders, the shape of the run


def run_checkpoint(state: TrainState, weights: dict, loader: list | None, num_classes: int) -> dict:
    """The checkpoint of `state`: `CHECKPOINT_KEYS`, with the model's `weights` (its state dict, checked finite by
    the caller) and `loader`, every process's loader state in rank order (`loader_states`)."""
    s = state
    return {
        "format": CHECKPOINT_FORMAT, "config": asdict(s.cfg), "model": weights,
        "optimizer": s.optimizer.state_dict(), "scaler": s.scaler.state_dict(),
        "ema": s.ema.state_dict() if s.ema is not None else None,
        "epoch": s.epoch, "step": s.step, "global_step": s.global_step, "epoch_losses": s.epoch_losses,
        "pending": s.pending, "history": s.history, "best_top1": s.best_top1, "seconds": s.seconds,
        "rng": rng_states(), "loader": loader, "world_size": s.world_size,
        "global_batch": s.cfg.images_per_step(s.world_size), "num_classes": num_classes,
    }


def loader_states(loaders: DataLoaders, world: World) -> list | None:
    """Every process's `loaders.state()` in rank order, gathered to all (each process reads its own shard); None
    when the loaders keep nothing of their own (the torchvision ones: their position is the epoch and step)."""
    state = loaders.state()
    if state is None:
        return None
    states = [state] * world.world_size
    if world.world_size > 1:
        dist.all_gather_object(states, state)
    return states


def nonfinite_remedy(precision: str) -> str:
    """What to change when a run's numbers went non-finite, for the errors that stop it (fp16's range: in fp16)."""
    fp16 = ", or train in bf16 or fp32 instead of fp16" if precision == "fp16" else ""
    return "lower --lr or set --clip-grad" + fp16


def checked_weights(model: nn.Module, global_step: int, last_good: str, precision: str) -> dict:
    """`model`'s state dict for a checkpoint, refused with a FloatingPointError when any float in it is non-finite
    (every process holds the same weights, so every process stops), naming the step, `last_good` and what to
    change for a run in `precision`."""
    weights = model.state_dict()
    floats = {k: t for k, t in weights.items() if t.is_floating_point()}
    if not bool(torch.stack([torch.isfinite(t).all() for t in floats.values()]).all()):  # one wait for the device
        bad = [k for k, t in floats.items() if not bool(torch.isfinite(t).all())]
        raise FloatingPointError(
            f"the weights became non-finite ({bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}) by "
            f"optimiser step {global_step} and were not saved; {last_good}: {nonfinite_remedy(precision)}")
    return weights


def save_checkpoint(checkpoint: dict, path: str | Path) -> Path:
    """Write `checkpoint` to `path` atomically (`atomic_write`)."""
    return atomic_write(path, lambda f: torch.save(checkpoint, f))


# %% [markdown]
# Reading one back checks what it is. Files of the earlier formats are read too. The second format kept the state of
# a stateful scheduler (torch's `LambdaLR`), which the rate, a function of the step, no longer needs: it goes (its
# step count was `global_step`). The first (before the loaders shared one `state()`) also had its DALI states
# become `loader`, the sampler's position it kept (never read: it is the epoch and step) go, and the two entries
# the earliest files lack get their meaning at the time (no epoch pending, no seconds counted). A file that is no
# training checkpoint, one of a newer format, and one that lacks an entry are each refused with what they are.

# %%
#| export
EARLIER_FORMATS = ("convit-edu-train-1", "convit-edu-train-2")


def _from_earlier_format(ckpt: dict) -> dict:
    """A checkpoint of an `EARLIER_FORMATS` as the current format holds it."""
    if ckpt["format"] == "convit-edu-train-1":
        ckpt = {"pending": None, "seconds": 0.0, **ckpt, "loader": ckpt.get("dali")}
    kept = {k: v for k, v in ckpt.items() if k not in ("dali", "sampler", "scheduler")}
    return {**kept, "format": CHECKPOINT_FORMAT}


def read_checkpoint(path: str | Path) -> dict:
    """Load a training checkpoint on the CPU (files of `EARLIER_FORMATS` as the current format); ValueError naming
    the file when it is truncated, not loadable safely, not a convit-edu training checkpoint, of a newer format, or
    incomplete."""
    ckpt = load_file(path)
    found = ckpt.get("format") if isinstance(ckpt, dict) else None
    if found in EARLIER_FORMATS:
        ckpt = _from_earlier_format(ckpt)
    elif isinstance(found, str) and found.startswith("convit-edu-train-") and found != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is a training checkpoint of format {found!r}, written by another version of "
                         f"convit-edu; this one reads {', '.join(map(repr, EARLIER_FORMATS))} and {CHECKPOINT_FORMAT!r}")
    elif found != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a convit-edu training checkpoint (format {CHECKPOINT_FORMAT!r} missing);"
                         " to start from pretrained weights use convit_edu.pretrained.load_weights")
    missing = [key for key in CHECKPOINT_KEYS if key not in ckpt]
    if missing:
        raise ValueError(f"{path} is a training checkpoint without {', '.join(missing)}: it was not written whole "
                         "by convit-edu")
    return ckpt


# %% [markdown]
# A small run's state (a linear model, AdamW with a schedule, two steps done) written and read back: the file
# holds exactly `CHECKPOINT_KEYS`. The same file rewritten as the second format wrote it (with its scheduler's
# state) and as the first did reads back the same, and the three refusals:

# %%
def small_state(cfg: TrainConfig) -> TrainState:
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    return TrainState(cfg, model, optimizer, rank=0, world_size=1, steps_per_epoch=4,
                      schedule=RunSchedule(8, 2, 0.1, 1e-3, 1e-4, scales=(1.0,)),
                      scaler=torch.amp.GradScaler("cpu", enabled=False))


cfg = TrainConfig(model="deit_tiny", data="fake", batch_size=8, output=str(tmp / "run"), resume="auto")
torch.manual_seed(0)
state = small_state(cfg)
for t in range(2):
    state.schedule.set_lr(state.optimizer, t)
    state.model(torch.randn(8, 4)).square().mean().backward()
    state.optimizer.step()
state.step = state.global_step = 2
state.epoch_losses, state.best_top1 = [0.9, 0.8], 12.5
(tmp / "run").mkdir()
save_checkpoint(run_checkpoint(state, checked_weights(state.model, 2, "none yet", "fp32"), None, 3), tmp / "run" / "last.pt")
ckpt = read_checkpoint(tmp / "run" / "last.pt")
assert tuple(ckpt) == CHECKPOINT_KEYS and ckpt["global_batch"] == 8 and ckpt["loader"] is None
scheduler = {"last_epoch": 2, "_step_count": 3, "base_lrs": [1.0], "lr_lambdas": [None]}  # a LambdaLR's, 2 steps on
save_checkpoint({**ckpt, "format": "convit-edu-train-2", "scheduler": scheduler}, tmp / "format-2.pt")
old = {k: v for k, v in ckpt.items() if k not in ("loader", "pending", "seconds")}
save_checkpoint({**old, "format": "convit-edu-train-1", "scheduler": scheduler, "dali": None,
                 "sampler": {"epoch": 0, "start": 16}}, tmp / "format-1.pt")
assert read_checkpoint(tmp / "format-2.pt").keys() == read_checkpoint(tmp / "format-1.pt").keys() == ckpt.keys()
torch.save({"format": "convit-edu-train-4"}, tmp / "newer.pt")
torch.save({k: v for k, v in ckpt.items() if k != "rng"}, tmp / "no-rng.pt")
torch.save(state.model.state_dict(), tmp / "weights.pt")
nan_model = nn.Linear(4, 3)
nan_model.bias.data[1] = float("nan")
last_good = "TMP/run/last.pt is the last good checkpoint"
message = expect_error(lambda: checked_weights(nan_model, 2, last_good, "fp16"), FloatingPointError)
assert "non-finite (bias) by optimiser step 2 and were not saved" in message and message.endswith("instead of fp16")
assert "fp16" not in nonfinite_remedy("bf16")  # fp16's range is no remedy for a bf16 or fp32 run
print(message)
for name, says in (("newer", "written by another version"), ("no-rng", "without rng"),
                   ("weights", "not a convit-edu training checkpoint")):
    message = expect_error(lambda: read_checkpoint(tmp / f"{name}.pt"))
    assert says in message, message
    print(message.replace(str(tmp), "TMP"))

# %% [markdown]
# ## Resuming
#
# Which checkpoint: `cfg.resume` names a file, or `auto` takes the run folder's `last.pt` (chapter 27's `RunFolder`
# names it) when it exists and starts from scratch when it does not (the first start of a job that requeues itself). Every process must see the
# checkpoint, or none: the decision is taken together (an all-reduce of "I see it"), because processes that
# disagreed would wait forever for each other at the first collective.

# %%
#| export
def resume_checkpoint(resume: str | None, last: Path, world: World) -> tuple[dict | None, Path | None]:
    """(checkpoint, its path) that `resume` (a config's) names — `auto`: the run folder's `last` when it exists — or
    (None, None); every process decides together, and one that sees the file while another does not is refused."""
    if resume is None:
        return None, None
    path = last if resume == "auto" else Path(resume)
    seen = int(all_reduce(torch.tensor(float(path.exists()), device=world.device)).item())
    if 0 < seen < world.world_size:  # every process must take the same decision, or the first collective hangs
        raise ValueError(f"{seen} of {world.world_size} processes see {path}: put --output (and the checkpoint) "
                         "on a file system that every node shares")
    if resume == "auto" and not seen:
        if world.main:
            print(f"resume auto: no {path} yet, starting from scratch", flush=True)
        return None, None
    return read_checkpoint(path), path


# %% [markdown]
# A resumed run must be the same run: every setting that changes what it means (data, fraction, classes, seed,
# augmentation, model, batch, warm-up) must match the checkpoint's, and `resume_weights` names each difference
# before it loads the weights; other logging or workers, another device or number of processes (at the same
# global batch) are fine. A few settings may change to *mend* a run — those a non-finite loss or a moved dataset
# sends a user back with: `lr`, `min_lr`, `clip_grad`, `precision`, `data_root`, and `epochs` to extend it. The
# run prints each such change and records it in `invocations.jsonl` (chapter 27), and the new schedule holds
# from the first step after the resume. A resume may come from another number of processes, even mid-epoch:
# the sampler's position is a place in the epoch's one global stream, and each sample's augmentation is seeded by
# that place (chapter 16).

# %%
#| export
RESUME_MAY_CHANGE = {  # settings a resumed run may change without changing what it computes (the global batch,
    # which batch_size, accum_steps and global_batch set together, is checked on its own)
    "num_workers", "batch_size", "accum_steps", "global_batch", "compile", "cuda_graphs", "device", "output",
    "resume", "ckpt_every", "log_every", "progress", "eval_every"}
RESUME_MAY_FIX = (  # settings a resumed run may change to mend or extend it: printed, recorded in invocations.jsonl
    "lr", "min_lr", "clip_grad", "precision", "data_root", "epochs")


def settings_changed(recorded: dict, cfg: TrainConfig) -> dict[str, list]:
    """{setting: [recorded, now]} for each setting of `cfg` that differs from the `recorded` config (a checkpoint's
    or a `run.json`'s) and changes what a run computes: all but `RESUME_MAY_CHANGE`."""
    saved, now = asdict(TrainConfig.from_dict(recorded)), asdict(cfg)
    return {k: [saved[k], now[k]] for k in now if k not in RESUME_MAY_CHANGE and saved[k] != now[k]}


def resume_weights(ckpt: dict, path: Path, cfg: TrainConfig, model: nn.Module, global_batch: int) -> dict[str, list]:
    """Load the weights of the checkpoint `ckpt` (read from `path`) into `model`, after refusing one of another run
    than `cfg` with `model` at `global_batch`, each difference named; return the settings the resume mends,
    {setting: [old, new]}."""
    differ = settings_changed(ckpt["config"], cfg)
    refused = [f"{k} {old!r} -> {new!r}" for k, (old, new) in differ.items() if k not in RESUME_MAY_FIX]
    if refused:
        raise ValueError(f"checkpoint {path} was trained with other settings ({'; '.join(refused)}): resuming would "
                         "not continue the same run; resume with the checkpoint's settings or start a new --output "
                         f"(a resume may change {', '.join(RESUME_MAY_FIX)})")
    own, theirs = model.state_dict(), ckpt["model"]
    wrong = sorted(set(own) ^ set(theirs)) + [k for k in own if k in theirs and own[k].shape != theirs[k].shape]
    if wrong:
        k = wrong[0]
        detail = (f"{tuple(theirs[k].shape)} there, {tuple(own[k].shape)} here" if k in own and k in theirs
                  else "missing " + ("there" if k in own else "here"))
        raise ValueError(f"checkpoint {path} does not fit this model ({len(wrong)} tensors differ, first {k}: "
                         f"{detail}): same --model but other sizes or classes?")
    if ckpt["global_batch"] != global_batch:
        raise ValueError(f"checkpoint {path} was trained with global batch {ckpt['global_batch']}, this run has "
                         f"{global_batch}: keep batch_size × accum_steps × world size equal to resume")
    model.load_state_dict(theirs)
    return differ


# %% [markdown]
# The trainer restores a checkpoint in two moves: the weights are loaded before the optimiser and the EMA are
# made (the EMA starts as a copy of the model), then `restore_run` puts back everything else — optimiser, scaler,
# EMA, position, log, best score, every generator, and each process's loader state. The schedule needs nothing: the
# run's own (at this run's rates: a resume may change `lr`) gives the rate of its next step from `global_step`.

# %%
#| export
def restore_run(ckpt: dict, path: Path, state: TrainState, loaders: DataLoaders, world: World,
                changes: dict[str, list]) -> None:
    """Put the checkpoint `ckpt` (read from `path`, with the settings `changes` that the resume mends) back into
    `state` — optimiser, scaler, EMA, position, log, best top-1 — and into the generators and this process's
    `loaders` (`restore`); the state's schedule sets the rates of the next step, at this run's settings."""
    s = state
    s.optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt["scaler"]:  # an fp16 run's scaler (empty when saved disabled: a resume may change the precision)
        s.scaler.load_state_dict(ckpt["scaler"])
    if s.ema is not None and ckpt["ema"] is not None:
        s.ema.load_state_dict(ckpt["ema"])
    s.epoch, s.step, s.global_step = ckpt["epoch"], ckpt["step"], ckpt["global_step"]
    s.epoch_losses, s.pending, s.history = ckpt["epoch_losses"], ckpt["pending"], ckpt["history"]
    s.best_top1, s.seconds = ckpt["best_top1"], ckpt["seconds"]
    set_rng_states(ckpt["rng"])
    if ckpt["loader"] is not None:
        if len(ckpt["loader"]) != world.world_size:
            raise ValueError(f"checkpoint {path} holds the loader states of {len(ckpt['loader'])} process(es): "
                             f"loader {s.cfg.loader!r} resumes with as many processes (each reads its own shard), "
                             f"not {world.world_size}")
        loaders.restore(ckpt["loader"][world.rank])
    if world.main:
        changed = "".join(f"; {k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
        where = (f"epoch {s.epoch + 1}, step {s.step}/{s.steps_per_epoch}" if s.epoch < s.cfg.epochs else
                 f"the run is complete ({s.epoch} epochs): nothing to train; a larger epochs trains on")
        print(f"resumed from {path}: {where}{changed}", flush=True)


# %% [markdown]
# The small run's checkpoint resumed: with no resume, or `auto` in a folder without `last.pt`, a run starts
# from scratch; a named checkpoint that is missing is an error, not a silent fresh start. `auto` finds the file
# written above; a new state with its own model takes its weights and a mended learning rate, and `restore_run`
# puts the rest back, the optimiser's moments included (the schedule's place is the step). Another seed is refused,
# and so is a model of another shape.

# %%
world = World(0, 1, torch.device("cpu"), False)  # one process on the CPU: rank 0 of 1
last = tmp / "run" / "last.pt"
assert resume_checkpoint(None, last, world) == (None, None)
assert resume_checkpoint("auto", tmp / "empty" / "last.pt", world) == (None, None)
message = expect_error(lambda: resume_checkpoint(str(tmp / "nowhere.pt"), last, world), FileNotFoundError)
assert "nowhere.pt" in message
found, path = resume_checkpoint("auto", last, world)
mended = replace(cfg, lr=cfg.lr / 2)
resumed = small_state(mended)
changes = resume_weights(found, path, mended, resumed.model, global_batch=8)
restore_run(found, path, resumed, DataLoaders(None, None, None), world, changes)
assert changes == {"lr": [cfg.lr, cfg.lr / 2]}
assert (resumed.global_step, resumed.epoch_losses, resumed.best_top1) == (2, [0.9, 0.8], 12.5)
for part in ("model", "optimizer"):
    torch.testing.assert_close(getattr(resumed, part).state_dict(), getattr(state, part).state_dict(), rtol=0, atol=0)
message = expect_error(lambda: resume_weights(found, path, replace(cfg, seed=1), small_state(cfg).model, 8))
assert "seed 0 -> 1" in message
print(message.replace(str(tmp), "TMP"))
message = expect_error(lambda: resume_weights(found, path, cfg, nn.Linear(4, 5), 8))
assert "weight: (3, 4) there, (5, 4) here" in message
print(message.replace(str(tmp), "TMP"))

# %% [markdown]
# What a loader keeps of itself travels the same way whatever the loader: here one that counts the batches it
# has handed out (as DALI's pipelines keep their place) is saved, restored into a fresh one, and refused by a
# run of another number of processes, since each process's state belongs to its shard.

# %%
class CountingLoaders:
    """A stand-in loader whose state is the number of batches it has handed out."""

    def __init__(self):
        self.handed_out = 0

    def state(self) -> int:
        return self.handed_out

    def restore(self, state: int) -> None:
        self.handed_out = state


counting = CountingLoaders()
counting.handed_out = 7
loader = loader_states(counting, world)
save_checkpoint(run_checkpoint(state, state.model.state_dict(), loader, num_classes=3), tmp / "counted.pt")
fresh = CountingLoaders()
restore_run(read_checkpoint(tmp / "counted.pt"), tmp / "counted.pt", small_state(cfg), fresh, world, {})
assert loader == [7] and fresh.handed_out == 7
two = World(0, 2, torch.device("cpu"), False)
message = expect_error(lambda: restore_run(read_checkpoint(tmp / "counted.pt"), tmp / "counted.pt", small_state(cfg),
                                           CountingLoaders(), two, {}))
assert "resumes with as many processes" in message
print(message.replace(str(tmp), "TMP"))
