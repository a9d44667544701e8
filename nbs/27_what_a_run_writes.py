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
# # What a run writes
#
# A run leaves a folder behind: what it was, how it went, the checkpoints it can go on from. This chapter gives that
# folder one owner, `convit_edu.run_records`: `RunFolder` names every file a run writes, writes each whole or not at
# all (chapter 12) and is the one reader of them; `RunWriter` decides *when* each is written, told what happened by
# the training loop (chapter 28), and writes on rank 0, a failed write stopping every process (chapter 24). Then the
# progress a run shows, and the curves of its log.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp run_records
# A run's records: its folder — the name of every file a run writes, how each is written (whole or not at all) and
# read back, and when (`RunWriter`: the checkpoint policy, rank 0 the writer, an error stopping every process) — and
# the progress rank 0 shows.

# %%
#| export
import csv
import io
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
import torchvision
from fastprogress.fastprogress import IN_NOTEBOOK, ConsoleMasterBar, ConsoleProgressBar, NBMasterBar, NBProgressBar
from matplotlib.figure import Figure

import convit_edu
from convit_edu.config import TrainConfig
from convit_edu.distributed import World, run_on_main
from convit_edu.files import atomic_write, keep_as, write_text
from convit_edu.run_state import TrainState, read_checkpoint, save_checkpoint
from convit_edu.schedule import scaled_lr

# %%
import contextlib
import tempfile
from dataclasses import replace

from convit_edu.checks import expect_error

world = World(0, 1, torch.device("cpu"), False)  # one process on the CPU: rank 0 of 1
tmp = Path(tempfile.mkdtemp())
tiny = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 48, "depth": 2,
                   "local_up_to_layer": 1}, data="fake", data_args={"num_train": 64, "num_val": 16, "image_size": 16},
                   epochs=1, batch_size=8, precision="fp32", num_workers=0, progress="none", output=str(tmp / "run"))

# %% [markdown]
# ## The run's folder
#
# A run's folder holds, by name: `run.json` (the config, the world, the batch sizes, the learning rate, the
# versions, the command line) when it starts, and a line in `invocations.jsonl` every time it is started or resumed
# (a run extended with more epochs, or resumed on another number of GPUs, keeps the record of each start); chapter
# 26's checkpoints, `last.pt` and `best.pt` (a second name of one `last.pt`: the best-scoring one); the logs,
# `log.jsonl` and `log.csv`, one row per evaluation; the curves; a compiled run's `compile-cache`. One object owns
# those names and how each file is written and read, `RunFolder`: every file whole or not at all (chapter 12), and
# every part of the package that reads a run — a resume, `convit-edu eval`, the experiments (chapter 37), the GPU
# check (chapter 45) — reads it through the folder's readers. *When* each file is written, and by which process, is
# the run's writer's (below). Before any of it, the output folder must be writable.

# %%
#| export
class RunFolder:
    """The run folder `path`: the name of every file a run writes there, each written whole or not at all, and the
    one reader of them. `RunWriter` says when each is written."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.last = self.path / "last.pt"  # the checkpoint a run continues from (chapter 26)
        self.best = self.path / "best.pt"  # the `last` its best-scoring evaluation began from, under a second name
        self.info = self.path / "run.json"  # the run as it first started
        self.invocations = self.path / "invocations.jsonl"  # a line per start: where it resumed from, what changed
        self.log = self.path / "log.jsonl"  # a row per evaluation
        self.table = self.path / "log.csv"  # the same rows for a spreadsheet, a column per gate
        self.curves = self.path / "curves.png"  # the log's curves (`plot_history`)
        self.compile_cache = self.path / "compile-cache"  # torch.compile's cache of a compiled run (a folder)

    def holds_run(self) -> bool:
        """Whether a run has checkpointed here."""
        return self.last.is_file()

    def checkpoint(self) -> dict:
        """The checkpoint `last` (chapter 26's `read_checkpoint`)."""
        return read_checkpoint(self.last)

    def run_info(self) -> dict:
        """What `run.json` holds."""
        return json.loads(self._text(self.info))

    def history(self) -> list[dict]:
        """The log's rows, one per evaluation, in order."""
        return [json.loads(line) for line in self._text(self.log).splitlines() if line.strip()]

    def starts(self) -> list[dict]:
        """The lines of `invocations.jsonl`, one per start, in order."""
        return [json.loads(line) for line in self._text(self.invocations).splitlines() if line.strip()]

    def _text(self, path: Path) -> str:
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: no run has written it in {self.path} yet")
        return path.read_text()

    def write_start(self, info: dict, resumed_from: Path | None, changes: dict[str, list]) -> None:
        """`run.json` when a run first starts (a resumed run keeps it), and for every start a line in
        `invocations.jsonl`, with the checkpoint resumed from and the settings the resume changed ({setting: [old,
        new]})."""
        if resumed_from is None:
            write_text(self.info, json.dumps(info, indent=2, default=str) + "\n")
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resumed_from": resumed_from, "changed": changes, **info}
        earlier = self.invocations.read_text() if self.invocations.is_file() else ""
        write_text(self.invocations, earlier + json.dumps(line, default=str) + "\n")

    def write_checkpoint(self, checkpoint: dict) -> None:
        """`checkpoint` as `last` (chapter 26's `save_checkpoint`)."""
        save_checkpoint(checkpoint, self.last)

    def keep_best(self) -> None:
        """`last` as `best` too: a second name of the same bytes (chapter 12's `keep_as`)."""
        keep_as(self.last, self.best)

    def write_logs(self, history: list[dict]) -> None:
        """`log.jsonl` (a JSON line per row) and `log.csv`, from the whole `history`."""
        write_text(self.log, "".join(json.dumps(row) + "\n" for row in history))
        flat = [{**{k: v for k, v in row.items() if k != "gates"},
                 **{f"gate_{i}": g for i, g in enumerate(row.get("gates", []))}} for row in history]
        table = io.StringIO(newline="")
        if flat:
            writer = csv.DictWriter(table, fieldnames=list(flat[-1]))
            writer.writeheader()
            writer.writerows(flat)
        write_text(self.table, table.getvalue())

    def write_curves(self, history: list[dict]) -> None:
        """`curves.png`: `plot_history(history)`."""
        figure = plot_history(history)
        atomic_write(self.curves, lambda f: figure.savefig(f, format="png"))


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


def run_info(cfg: TrainConfig, world: World, *, batch_size: int, global_batch: int, steps_per_epoch: int,
             num_workers: int, precision: str) -> dict:
    """What `run.json` records of a run: its config, its world, its batch sizes and learning rate, its versions
    and its command line."""
    return {"config": asdict(cfg), "world_size": world.world_size, "batch_size": batch_size,
            "global_batch": global_batch, "scaled_lr": scaled_lr(cfg.lr, global_batch),
            "steps_per_epoch": steps_per_epoch, "num_workers": num_workers, "device": str(world.device),
            "precision": precision, "seed": cfg.seed, "versions": versions(), "command": sys.argv}


# %% [markdown]
# The output check makes the folder and sweeps a killed run's temporary files, and refuses a folder it cannot
# write — here one whose parent is a file:

# %%
output = Path(tiny.output)
check_output(output)
(output / ".last.pt.tmp").write_bytes(b"half a checkpoint")
check_output(output)
assert output.is_dir() and list(output.iterdir()) == []
(tmp / "a-file").write_text("not a folder")
message = expect_error(lambda: check_output(tmp / "a-file" / "run"))
assert "is not writable" in message
print(message)

# %% [markdown]
# The run's records, written and read back through the folder: a first start writes `run.json` and a line of
# `invocations.jsonl`; a resume that mends the learning rate leaves `run.json` as it was and adds a line that says
# from where it resumed and what changed. A file a run has not written yet is an error that names it.

# %%
folder = RunFolder(output)
sizes = dict(batch_size=8, global_batch=8, steps_per_epoch=8, num_workers=0, precision="fp32")
folder.write_start(run_info(tiny, world, **sizes), resumed_from=None, changes={})
first_record = folder.info.read_text()
folder.write_start(run_info(replace(tiny, lr=1e-3), world, **sizes), resumed_from=folder.last,
                   changes={"lr": [tiny.lr, 1e-3]})
run, starts = folder.run_info(), folder.starts()
assert folder.info.read_text() == first_record and run["config"] == asdict(tiny)
assert {"world_size", "batch_size", "global_batch", "scaled_lr", "versions", "command"} <= run.keys()
assert run["scaled_lr"] == scaled_lr(tiny.lr, 8) and set(run["versions"]) == {"python", "torch", "torchvision",
                                                                              "convit_edu"}
assert [s["resumed_from"] for s in starts] == [None, str(folder.last)]
assert starts[1]["changed"] == {"lr": [tiny.lr, 1e-3]} and starts[1]["config"]["lr"] == 1e-3
print("run.json:", ", ".join(run))
print("invocations.jsonl, (resumed?, changed) of each start:", [(s["resumed_from"] is not None, s["changed"])
                                                                for s in starts])
message = expect_error(folder.history, FileNotFoundError)
assert "log.jsonl does not exist" in message
print(message.replace(str(tmp), "TMP"))

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
history = [{"epoch": e, "step": 10 * e, "train_loss": 2.0 / e, "lr": 1e-3 / e, "images_per_s": 100.0,
            "epoch_time_s": 5.0, "data_wait_s": 0.5, "data_wait_share": 0.1, "val_loss": 1.5 / e,
            "val_top1": 30.0 * e, "val_top5": 60.0 + e, "gates": [0.73, 0.72 - 0.01 * e]} for e in (1, 2)]
with tempfile.TemporaryDirectory() as path:
    logged = RunFolder(path)
    logged.write_logs(history)
    logged.write_curves(history)
    rows, table = logged.history(), list(csv.DictReader(io.StringIO(logged.table.read_text())))
    left = sorted(p.name for p in Path(path).iterdir())
assert rows == history and left == ["curves.png", "log.csv", "log.jsonl"]  # no temporary file left behind
assert table[1]["gate_1"] == "0.7" and "gates" not in table[0]
assert len(plot_history(history).axes) == 4  # loss (with the rate on a twin axis), accuracy, gates

state = TrainState(cfg=None, model=torch.nn.Linear(1, 1), optimizer=None, rank=0, world_size=1, steps_per_epoch=20,
                   step=10, loss=1.25)
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    Progress("lines", epochs=3, log_every=5).step(state, lr=1e-3, images_per_s=250.0, data_wait=0.3, interval=2.0)
line = printed.getvalue().strip()
assert line == "epoch 1/3 step 10/20 loss 1.2500 lr 1.000e-03 250 img/s data wait 0.30 s (15 %)", line
print(line)

# %% [markdown]
# ## What a run writes, and when
#
# `RunFolder` says what each file of a run is called and how it is written; *when* each is written is the run's
# writer's, `RunWriter`: the training loop (chapter 28) reports what happened — a step done, an evaluation begun, an
# evaluation scored, the run returning — and the writer decides what to write, on rank 0, through chapter 24's
# `run_on_main`, so that a failed write (a full disk) stops every process at once with an error that names the file.
# Nothing in it counts epochs: a loop that evaluated every N optimiser steps would report the same events. Its
# policy:
#
# * **`last.pt` before each evaluation** (every `eval_every` epochs, and the last), so that a signal during a long
#   evaluation (an ImageNet pass takes minutes) loses nothing: the checkpoint keeps the epoch's training numbers as
#   `pending`, and a run resumed from it evaluates that epoch first. Other epochs end without a checkpoint: a run of
#   one-step epochs (Table 2's f = 0.1 on a GPU, chapter 38_why) spent more time writing `last.pt` at every epoch's end
#   than training. A crash loses at most `eval_every` epochs, or **`ckpt_every` optimiser steps** when that is set
#   (`due`: the trainer reads the device back first, so that a checkpoint never holds a step whose loss was not
#   checked).
# * **`best.pt` when an evaluation scores best**: the `last.pt` written as that evaluation began, under a second
#   name (chapter 12's `keep_as`), so an evaluated epoch writes its hundreds of megabytes once, not three times. The
#   link is right because nothing is written between an evaluation's start and its score: a writer that saved in
#   the background would chain the link after that write, here, and nowhere else.
# * **the logs after each evaluation**, rewritten from the whole history.
# * **when the run returns** (finished, or stopped anywhere: a signal, a hook's `state.stop`), `last.pt` once more if
#   it does not hold the run's position and whole log yet, and the curves. The writer knows what `last.pt` holds:
#   the position it last wrote (epoch, step, evaluations, an evaluation pending), or the one the run started from.
#
# The checkpoint itself is built by the trainer on every process (its weights checked finite, every process's
# loader state gathered: chapter 26), when the writer asks for it; a step that one day keeps state of its own (a
# captured CUDA graph's) adds it there, and nothing here changes.

# %%
#| export
def _position(state: TrainState) -> tuple:
    return state.epoch, state.step, len(state.history), state.pending is not None


class RunWriter:
    """What a run writes in its `folder`, and when, told what happened by the trainer: `last.pt` every
    `ckpt_every` optimiser steps (`due`), as each evaluation begins and when the run returns if it lags; `best.pt`
    when an evaluation scores best; the logs after each; the curves at the end. Rank 0 writes, and a failed write
    stops every process of `world`. `contents()` builds the checkpoint, on every process."""

    def __init__(self, folder: RunFolder, world: World, ckpt_every: int, contents: Callable[[], dict]):
        self.folder, self.world, self.ckpt_every, self.contents = folder, world, ckpt_every, contents
        self.holds: tuple | None = None  # the position `last.pt` holds (`_position`)

    def prepare(self) -> None:
        """Before the run is built: its folder, writable, without a killed run's temporary files."""
        self._on_main(f"write in the run folder {self.folder.path}", lambda: check_output(self.folder.path))

    def start(self, state: TrainState, info: dict, resumed_from: Path | None, changes: dict[str, list]) -> None:
        """The run starts at `state` (resumed from `resumed_from`, mended by `changes`): its records (`run_info`)."""
        self._on_main(f"write the run's records in {self.folder.path}",
                      lambda: self.folder.write_start(info, resumed_from, changes))
        self.holds = _position(state)  # nothing that last.pt lacks yet

    def due(self, state: TrainState) -> bool:
        """Whether `last.pt` is written after this optimiser step: every `ckpt_every` steps."""
        return bool(self.ckpt_every) and state.global_step % self.ckpt_every == 0

    def save(self, state: TrainState) -> None:
        """`last.pt` of the run as it stands."""
        checkpoint = self.contents()
        self._on_main(f"write the checkpoint {self.folder.last}", lambda: self.folder.write_checkpoint(checkpoint))
        self.holds = _position(state)

    def evaluating(self, state: TrainState) -> None:
        """An evaluation begins (its epoch's training numbers are `state.pending`): `last.pt` first."""
        self.save(state)

    def scored(self, state: TrainState, improved: bool) -> None:
        """The evaluation's row is in `state.history`: the logs, and `best.pt` when it `improved` the best score."""
        if improved:  # last.pt is still the file written as this evaluation began
            self._on_main(f"keep {self.folder.last} as {self.folder.best}", self.folder.keep_best)
        self._on_main(f"write the logs {self.folder.log}", lambda: self.folder.write_logs(state.history))

    def finished(self, state: TrainState) -> None:
        """The run returns, done or stopped: `last.pt` when it does not hold `state` yet, and the curves."""
        if _position(state) != self.holds:
            self.save(state)
        if state.history:
            self._on_main(f"draw the curves {self.folder.curves}", lambda: self.folder.write_curves(state.history))

    def last_good(self) -> str:
        """Where the run can be resumed from, for an error's message."""
        last = self.folder.last
        return f"{last} is the last good checkpoint" if last.exists() else "no checkpoint was written yet"

    def _on_main(self, what: str, write: Callable[[], object]) -> None:
        run_on_main(self.world, what, write)

# %% [markdown]
# The policy, driven by hand: a writer told of two evaluations (the first the best so far) and of the run's end
# writes `last.pt` as each evaluation begins and once more at the end, keeps the first one's as `best.pt`, and
# rewrites the logs after each; every 4 steps it would checkpoint when `ckpt_every` is 4. (The checkpoint here is a
# stand-in that says which step it holds.)

# %%
state = TrainState(cfg=tiny, model=torch.nn.Linear(1, 1), optimizer=None, rank=0, world_size=1, steps_per_epoch=8)
writer = RunWriter(RunFolder(tmp / "written"), world, ckpt_every=0, contents=lambda: {"step": state.global_step})
writer.prepare()
writer.start(state, run_info(tiny, world, **sizes), resumed_from=None, changes={})
for row, improved in zip(history, (True, False)):
    state.epoch, state.global_step, state.pending = row["epoch"], row["epoch"] * 8, row
    writer.evaluating(state)  # last.pt, holding the evaluation's step
    state.history, state.pending = state.history + [row], None
    writer.scored(state, improved)
writer.finished(state)
held = {p.name: torch.load(p, weights_only=True)["step"] for p in (writer.folder.last, writer.folder.best)}
assert held == {"last.pt": 16, "best.pt": 8} and writer.folder.history() == history and writer.folder.curves.exists()
every_4 = RunWriter(writer.folder, world, ckpt_every=4, contents=dict)
assert [step for step in range(1, 9) if every_4.due(replace(state, global_step=step))] == [4, 8]
print("held by last.pt and best.pt (steps):", held, "- written:", ", ".join(sorted(p.name for p in
                                                                                  writer.folder.path.iterdir())))
