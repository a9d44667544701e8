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
# # Hooks, progress and logs
#
# What a run shows and keeps: the state the hooks see and the hooks themselves, what `train` returns, the progress
# bars and lines of rank 0, the log files (`log.jsonl`, `log.csv`) and the curves.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp callbacks
# Hooks (TrainState, Callback), what a run returns, progress bars and lines, the log files and the curves.

# %%
#| export
import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from fastprogress.fastprogress import IN_NOTEBOOK, ConsoleMasterBar, ConsoleProgressBar, NBMasterBar, NBProgressBar
from matplotlib.figure import Figure
from torch import nn

from convit_edu.files import atomic_write
from convit_edu.config import TrainConfig

# %%
import torch

torch.set_printoptions(precision=4, sci_mode=False)

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
    atomic_write(output / "log.jsonl", lambda f: f.write(lines.encode()))
    flat = [{**{k: v for k, v in row.items() if k != "gates"},
             **{f"gate_{i}": g for i, g in enumerate(row.get("gates", []))}} for row in history]
    table = io.StringIO(newline="")
    if flat:
        writer = csv.DictWriter(table, fieldnames=list(flat[-1]))
        writer.writeheader()
        writer.writerows(flat)
    atomic_write(output / "log.csv", lambda f: f.write(table.getvalue().encode()))


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
# What these write and show, checked on a made-up history of two epochs: `log.jsonl` holds the rows as they
# are, `log.csv` flattens the gates into one column per layer (a spreadsheet opens it), the curves get a third
# panel when there are gates, and a progress line in `lines` mode names the step, the loss, the rate, the speed
# and the interval's wait for data.

# %%
import contextlib
import csv as csv_module
import io as io_module
import json as json_module
import tempfile

history = [{"epoch": e, "step": 10 * e, "train_loss": 2.0 / e, "lr": 1e-3 / e, "images_per_s": 100.0,
            "epoch_time_s": 5.0, "data_wait_s": 0.5, "data_wait_share": 0.1, "val_loss": 1.5 / e,
            "val_top1": 30.0 * e, "val_top5": 60.0 + e, "gates": [0.73, 0.72 - 0.01 * e]} for e in (1, 2)]
with tempfile.TemporaryDirectory() as folder:
    write_logs(history, Path(folder))
    rows = [json_module.loads(line) for line in (Path(folder) / "log.jsonl").read_text().splitlines()]
    table = list(csv_module.DictReader(io_module.StringIO((Path(folder) / "log.csv").read_text())))
    left = sorted(p.name for p in Path(folder).iterdir())
assert rows == history and left == ["log.csv", "log.jsonl"]  # no temporary file left behind
assert table[1]["gate_1"] == "0.7" and "gates" not in table[0]
assert len(plot_history(history).axes) == 4  # loss (with the rate on a twin axis), accuracy, gates

state = TrainState(cfg=None, model=torch.nn.Linear(1, 1), optimizer=None, rank=0, world_size=1, steps_per_epoch=20,
                   step=10, loss=1.25)
printed = io_module.StringIO()
with contextlib.redirect_stdout(printed):
    Progress("lines", epochs=3, log_every=5).step(state, lr=1e-3, images_per_s=250.0, data_wait=0.3, interval=2.0)
line = printed.getvalue().strip()
assert line == "epoch 1/3 step 10/20 loss 1.2500 lr 1.000e-03 250 img/s data wait 0.30 s (15 %)", line
print(line)
