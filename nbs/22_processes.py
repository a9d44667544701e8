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
# # Training, part 3: processes, precision, evaluation and progress
#
# The pieces of a run that decide *where* and *how* it runs: one process or many (torchrun, SLURM), the device
# and the precision (bf16 only where it pays), evaluation across processes, hooks and progress bars, and a
# clean stop on SIGTERM or Ctrl-C.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp runtime
# Processes and devices, precision, evaluation, hooks and progress, and stopping cleanly on a signal.

# %%
#| export
import contextlib
import csv
import json
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from fastprogress.fastprogress import IN_NOTEBOOK, ConsoleMasterBar, ConsoleProgressBar, NBMasterBar, NBProgressBar
from matplotlib.figure import Figure
from torch import nn
from torch.utils.data import Dataset, Subset

from convit_edu.config import PRECISIONS, TrainConfig, check_device
from convit_edu.gpsa import gate_values
from convit_edu.loaders import DeviceTransforms, build_loader

# %%
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Processes, devices, precision
#
# `torchrun` (and `srun … torchrun` under SLURM) starts one process per GPU and tells each its `RANK`,
# `LOCAL_RANK` and `WORLD_SIZE` through the environment; a plain `python` start has none of them and is a world
# of one. GPUs talk through NCCL, CPU processes through gloo — the same code, which is how CI tests the real
# distributed path with two CPU processes. Only rank 0 prints, writes logs and writes checkpoints; every
# number it logs is first summed over all ranks.
#
# Precision: bf16 autocast runs matmuls in bfloat16 (same exponent range as fp32, so no loss scaling); fp16
# needs a `GradScaler`, which scales the loss up so small gradients survive and skips steps whose gradients
# overflow; fp32 is exact and what the resume tests use. bf16 pays on GPUs (Ampere and later) and on CPUs
# with AVX-512 BF16 or AMX units; a CPU without them emulates it, and is *slower* in bf16 than in fp32 — see
# the measurement below. So `precision="auto"` means bf16 on a GPU that has it (fp16 on older ones); on a CPU,
# bf16 where the CPU says it has the units (the `avx512_bf16` or `amx_bf16` flags of `/proc/cpuinfo`, with
# PyTorch running its AVX-512 kernels), fp32 elsewhere — the flags rather than a timed trial, because a trial
# at start-up would cost seconds and vary with the load, while the flags decide the same way every time.
# `device="auto"` is CUDA, else Apple's MPS (whose precision stays fp32), else the CPU. On a GPU, fp32 runs its
# matmuls on tensor cores in TF32, and AdamW runs fused (one kernel for all parameters).

# %%
#| export
@dataclass
class World:
    """This process's place in the run: its rank among `world_size` processes and its device."""

    rank: int
    world_size: int
    device: torch.device
    owns_group: bool  # this call initialised the process group and must destroy it

    @property
    def main(self) -> bool:
        """Rank 0: the process that prints and writes."""
        return self.rank == 0


_LAUNCHERS = {  # the variables each launcher sets: (rank, world size, local rank)
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK"), "srun": ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID")}
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)  # longer than any wait between collectives (a checkpoint write)


def _world_from_env(env: Mapping[str, str] = os.environ) -> tuple[int, int, int, str | None]:
    """(rank, world size, local rank, launcher) from torchrun's variables, else from those srun sets for each
    task of a job step (the batch script itself, outside srun, is a world of one), else a world of one."""
    launcher = "torchrun" if "WORLD_SIZE" in env else "srun" if "SLURM_STEP_NUM_TASKS" in env else None
    if launcher is None:
        return 0, 1, 0, None
    try:
        rank, world_size, local_rank = (int(env[name]) for name in _LAUNCHERS[launcher])
    except (KeyError, ValueError):
        raise ValueError(f"{launcher} launch with incomplete variables: need integers in "
                         f"{', '.join(_LAUNCHERS[launcher])}") from None
    if not (world_size >= 1 and 0 <= rank < world_size and 0 <= local_rank <= rank):
        names = dict(zip(_LAUNCHERS[launcher], (rank, world_size, local_rank)))
        raise ValueError(f"inconsistent {launcher} world {names}: need 0 <= local rank <= rank < world size")
    if launcher == "srun" and world_size > 1 and not {"MASTER_ADDR", "MASTER_PORT"} <= set(env):
        raise ValueError(f"srun started {world_size} tasks but MASTER_ADDR / MASTER_PORT are not set: export "
                         "MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1) and MASTER_PORT=29500 "
                         "in the sbatch script, or launch with torchrun")
    return rank, world_size, local_rank, launcher


def init_world(device: str) -> World:
    """This process's world from the launcher's variables (`_world_from_env`), its device (with several GPUs,
    the local rank's), and the process group (NCCL on GPUs, gloo on CPUs) when there are several processes."""
    rank, world_size, local_rank, _ = _world_from_env()
    dev = resolve_device(device)
    if dev.type == "cuda":
        # one process per GPU; with one GPU visible per task (SLURM's --gpus-per-task) every local rank gets cuda:0
        dev = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # fp32 matmuls on tensor cores
    owns = world_size > 1 and not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method="env://", rank=rank,
                                world_size=world_size, timeout=PROCESS_GROUP_TIMEOUT)
    return World(rank, world_size, dev, owns)


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over every process, in place (a world of one: `t` as it is)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


def autocast(device: torch.device, precision: str):
    """Autocast for a resolved precision (fp32: none)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


# %%
#| export
def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX: Linux's /proc/cpuinfo flags), where bf16
    autocast is about twice as fast as fp32 on a training step; elsewhere bf16 is emulated and far slower."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: no flags to read, so no claim of native bf16
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags)) and torch.backends.cpu.get_cpu_capability() == "AVX512"


def resolve_device(device: str) -> torch.device:
    """"auto" -> CUDA if there is a GPU, else Apple's MPS, else the CPU; other names are checked."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else
                            "mps" if torch.backends.mps.is_available() else "cpu")
    check_device(device)
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for but CUDA is not available: use --device cpu")
    return torch.device(device)


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """"auto" -> bf16 on a GPU that supports it, fp16 on an older GPU; on a CPU bf16 where it is native
    (`cpu_has_native_bf16`), else fp32; fp32 on Apple's MPS. Other values are checked."""
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if device.type == "cuda" and precision in ("auto", "bf16") and not torch.cuda.is_bf16_supported():
        if precision == "bf16":
            raise ValueError("precision bf16 is not supported by this GPU: use --precision fp16 (or auto)")
        return "fp16"
    if precision == "auto":
        return "bf16" if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()) else "fp32"
    return precision


# %% [markdown]
# The same matrix product, the size of one MLP layer of ConViT-Ti on a batch of 64 images at 64 px, in fp32
# and in bf16 on this notebook's CPU:

# %%
# NBVAL_IGNORE_OUTPUT
import time

a, w = torch.randn(64 * 64, 192), torch.randn(768, 192)
for dtype in (torch.float32, torch.bfloat16):
    x, y = a.to(dtype), w.to(dtype)
    F.linear(x, y)
    t0 = time.perf_counter()
    for _ in range(5):
        F.linear(x, y)
    print(f"{str(dtype):<15} {(time.perf_counter() - t0) / 5 * 1e3:7.2f} ms   (CPU capability: "
          f"{torch.backends.cpu.get_cpu_capability()})")


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
# Its loader is chapter 18's `build_loader` (dataset order, the last batch kept), whose workers ignore SIGTERM and
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
        part = Subset(dataset, range(rank, len(dataset), world_size))
        loader = build_loader(part, batch_size, None, num_workers=num_workers, seed=0, drop_last=False,
                              pin_memory=device.type == "cuda")  # its workers ignore SIGTERM, as training's do
    else:  # this process's batches already (the DALI loader's `val`)
        loader = dataset
    modes = {name: m.training for name, m in models.items()}
    sums = torch.zeros(len(models), 4, dtype=torch.float64, device=device)  # loss, top-1, top-5 hits, images
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
                    (top == labels[:, None]).any(dim=1).sum(), torch.tensor(len(labels), device=device)]).double()
    for name, m in models.items():
        m.train(modes[name])
    rows = all_reduce(sums).tolist()  # the one host sync of an evaluation
    if rows[0][3] == 0:
        raise ValueError("the evaluation set is empty")
    scores = {name: {"loss": loss / n, "top1": 100 * top1 / n, "top5": 100 * top5 / n}
              for name, (loss, top1, top5, n) in zip(models, rows)}
    return scores if isinstance(model, dict) else scores[""]


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
# ## Hooks, state and progress
#
# The loop calls a few hooks on every rank, with a `TrainState` that holds the live objects. That is the whole
# extension interface: the analysis chapter records nonlocality and the gates σ(λ) during training through it,
# and a hook that sets `state.stop = True` ends the run cleanly (checkpoint, then return) — the same path a
# SIGTERM takes.

# %%
#| export
@dataclass
class TrainState:
    """What the hooks see: the bare model (not wrapped in DDP or compiled), the optimiser and the position."""

    cfg: TrainConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    rank: int
    world_size: int
    steps_per_epoch: int
    epoch: int = 0  # the current epoch, 0-based
    step: int = 0  # optimiser steps done in this epoch
    global_step: int = 0
    loss: float = float("nan")  # the loss last read back (every log_every steps), averaged over every process
    epoch_losses: list[float] = field(default_factory=list)  # the losses of this epoch's steps so far
    history: list[dict] = field(default_factory=list)  # one row per finished and evaluated epoch
    pending: dict | None = None  # the training half of the last epoch's row, while that epoch is being evaluated
    stop: bool = False  # set it to end the run cleanly after the current step
    seconds: float = 0.0  # wall-clock seconds of training and evaluation so far (each row's time_s)


class Callback:
    """Override any of these; `train` calls them on every process, rank 0 included."""

    def on_train_begin(self, state: TrainState) -> None: ...
    def on_step_end(self, state: TrainState) -> None: ...
    def on_epoch_end(self, state: TrainState) -> None: ...
    def on_train_end(self, state: TrainState) -> None: ...


@dataclass
class TrainResult:
    """What `train` returns. `stopped` says why it ended early ("SIGTERM", "SIGINT", "callback") or is None."""

    model: nn.Module
    ema: nn.Module | None
    history: list[dict]
    output: Path
    stopped: str | None


def gate_means(model: nn.Module) -> list[float]:
    """Mean σ(λ) over the heads of each layer that has a `gating_param` (Eq. 6), in layer order."""
    return [gate_values(m.gating_param.detach().float(), getattr(m, "gate_override", None)).mean().item()
            for m in model.modules() if isinstance(getattr(m, "gating_param", None), torch.Tensor)]


# %% [markdown]
# Progress is shown by rank 0 only: fastprogress bars with live curves (train and val loss, val top-1
# error) in a notebook, a console bar in a terminal, and plain lines (one every `log_every` steps and one
# per epoch) when the output goes to a file — CI logs and SLURM's `slurm-JOB.out` stay readable.

# %%
#| export
class Progress:
    """What rank 0 shows of a run: `mode` "bar" (fastprogress, live curves in a notebook), "lines" (one line per
    `log_every` steps and per epoch) or "none"; "auto" is a bar in a notebook or a terminal, lines elsewhere."""

    def __init__(self, mode: str, epochs: int, log_every: int):
        if mode == "auto":
            mode = "bar" if IN_NOTEBOOK or sys.stdout.isatty() else "lines"
        self.mode, self.epochs, self.log_every, self.notebook = mode, epochs, log_every, IN_NOTEBOOK
        self.master, self.losses, self.val_losses, self.val_errors = None, [], [], []

    def epochs_of(self, epochs: range):
        """`epochs`, under the master bar in bar mode."""
        if self.mode != "bar":
            return epochs
        self.master = (NBMasterBar if self.notebook else ConsoleMasterBar)(epochs, total=self.epochs)
        if self.notebook:
            self.master.names = ["train loss", "val loss", "val top-1 error"]
        return self.master

    def steps_of(self, steps: range):
        """An epoch's `steps`, under a child bar in bar mode."""
        if self.mode != "bar":
            return steps
        return (NBProgressBar if self.notebook else ConsoleProgressBar)(steps, parent=self.master)

    def step(self, state: TrainState, lr: float, images_per_s: float, data_wait: float, interval: float) -> None:
        """After a read-back: the loss, and in lines mode the rate, the speed and how long the interval's steps
        waited for data (`data_wait` of `interval` seconds: a share near 1 is a starving device)."""
        x = state.epoch + state.step / state.steps_per_epoch
        self.losses.append((x, state.loss))
        if self.mode == "bar" and self.master is not None:
            self.master.child.comment = f"loss {state.loss:.4f} data wait {100 * data_wait / interval:.0f} %"
            if self.notebook and state.step % self.log_every == 0:
                self._graph()
        elif self.mode == "lines" and (state.step % self.log_every == 0 or state.step == state.steps_per_epoch):
            print(f"epoch {state.epoch + 1}/{self.epochs} step {state.step}/{state.steps_per_epoch} "
                  f"loss {state.loss:.4f} lr {lr:.3e} {images_per_s:.0f} img/s data wait {data_wait:.2f} s "
                  f"({100 * data_wait / interval:.0f} %)", flush=True)

    def epoch_end(self, row: dict) -> None:
        """An evaluated epoch's log row: a line (written under the bar in bar mode), and the curves."""
        self.val_losses.append((row["epoch"], row["val_loss"]))
        self.val_errors.append((row["epoch"], 1 - row["val_top1"] / 100))
        line = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in row.items() if k != "gates")
        if self.mode == "bar" and self.master is not None:
            self.master.write(line)
            if self.notebook:
                self._graph()
        elif self.mode == "lines":
            print(line, flush=True)

    def _graph(self) -> None:
        curves = [list(zip(*points)) if points else [[], []]
                  for points in (self.losses, self.val_losses, self.val_errors)]
        self.master.update_graph(curves)


def write_logs(history: list[dict], output: Path) -> None:
    """log.jsonl (one JSON line per epoch) and log.csv, rewritten from the checkpointed history."""
    lines = "".join(json.dumps(row) + "\n" for row in history)
    (output / "log.jsonl.tmp").write_text(lines)
    os.replace(output / "log.jsonl.tmp", output / "log.jsonl")
    flat = [{**{k: v for k, v in row.items() if k != "gates"},
             **{f"gate_{i}": g for i, g in enumerate(row.get("gates", []))}} for row in history]
    with open(output / "log.csv.tmp", "w", newline="") as f:
        if flat:
            writer = csv.DictWriter(f, fieldnames=list(flat[-1]))
            writer.writeheader()
            writer.writerows(flat)
    os.replace(output / "log.csv.tmp", output / "log.csv")


# %%
#| export
def plot_history(history: list[dict]):
    """The curves of a run as a figure: loss with the learning rate of the schedule (right axis); top-1 and top-5
    of the model and its EMA; mean σ(λ) per layer."""
    epochs = [row["epoch"] for row in history]
    gates = [row["gates"] for row in history if row.get("gates")]
    fig = Figure(figsize=(11 if gates else 7.5, 3), dpi=80)
    axes = fig.subplots(1, 3 if gates else 2)
    axes[0].plot(epochs, [r["train_loss"] for r in history], "o-", label="train")
    axes[0].plot(epochs, [r["val_loss"] for r in history], "o-", label="val")
    axes[0].set(xlabel="epoch", ylabel="loss")
    schedule = axes[0].twinx()
    schedule.plot(epochs, [r["lr"] for r in history], ":", color="grey")
    schedule.set_ylabel("learning rate (dotted)", color="grey")
    for key in ("val_top1", "val_top5", "ema_top1", "ema_top5"):
        if key in history[0]:
            axes[1].plot(epochs, [r[key] for r in history], "o-", label=key)
    axes[1].set(xlabel="epoch", ylabel="accuracy (%)")
    if gates:
        for layer, values in enumerate(zip(*gates)):
            axes[2].plot(epochs[-len(gates):], values, label=f"layer {layer}")
        axes[2].set(xlabel="epoch", ylabel="mean σ(λ)", ylim=(0, 1))
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# %% [markdown]
# ## Stopping cleanly
#
# SLURM pre-empts or time-limits a job by sending SIGTERM, then SIGKILL a grace period later; Jupyter's
# *interrupt* sends SIGINT. Both only raise a flag here. The loop finishes the optimiser step it is in, sums the
# flag over ranks (so every process stops at the same step even when only one got the signal), writes a
# checkpoint and returns; `convit-edu train` then exits with status 0 and `--resume auto` continues. A loss
# that is not finite travels in the same all-reduce: every rank raises `FloatingPointError` at once, and no
# checkpoint ever holds non-finite weights, so the last checkpoint stays the last good state (chapter 23).

# %%
#| export
class StopSignals:
    """Turn SIGTERM and SIGINT into a flag for the duration of a run (main thread only), then restore."""

    def __init__(self):
        self.received: str | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
