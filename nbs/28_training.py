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
# # The training loop, hardened: `Trainer` and `train`
#
# The first training loop anyone writes is a dozen lines — chapter 11's `fit`, in short:
#
# ```python
# for epoch in range(epochs):
#     model.train()
#     for images, labels in train_loader:
#         for group in optimizer.param_groups:
#             group["lr"] = deit_lr(step, *schedule)
#         loss = F.cross_entropy(model(images), labels)
#         optimizer.zero_grad()
#         loss.backward()
#         optimizer.step()
#         step += 1
#     print(epoch, evaluate(model, val_set))
# ```
#
# This chapter is that loop, hardened with the pieces of chapters 12-27 for runs of days on many GPUs. Its
# shape stays; each line grows:
#
# * `for images, labels in train_loader` — this process's share of a sampler that can start mid-epoch, uint8
#   batches finished on the device, Mixup/CutMix, and a clock on how long the step waited for its data;
# * `group["lr"] = …` — the same function of the step (chapter 23's `RunSchedule`, the gates' group at its own scale);
# * `loss = …` — under autocast, with a teacher's answer for distillation, over `accum_steps` micro-batches
#   whose gradients DDP synchronises once;
# * `backward`, `step` — through the fp16 loss scaler and the gradient clipping, then the EMA of the weights;
# * `print(loss)` — the loss stays on the device and is read back once per `log_every` steps, with every
#   process's stop signals in the same all-reduce;
# * the end of an epoch — its evaluation, reported to the run's writer (chapter 27), which decides what to write: one
#   checkpoint, before the evaluation, kept as `best.pt` when it scores best, the logs (an epoch is a pass over the
#   images, or with `epoch_steps` a span of that many steps of a stream that cycles them: below);
# * and around it all: an exact resume, a clean stop on SIGTERM, non-finite numbers named, rank 0 the only writer.
#
# A run is one object, `Trainer` (in the spirit of miniai's `Learner`): built from a `TrainConfig`, it holds the
# data, the models and the run's state (chapter 26); its `step` and its `fit` each read top to bottom in one
# place, and it reports what happens to its writer (`RunWriter`), which decides what to write. `train(cfg)` builds
# one and fits it.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp training
# The training loop: a `Trainer` built from a config, and `train`, which builds one and fits it — from a laptop CPU
# to many GPUs.

# %%
#| export
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from convit_edu.augment import finish_batch
from convit_edu.config import TrainConfig
from convit_edu.cuda_graphs import MIX_NUMBERS, StepGraph, fill, graph_ready, mix_numbers, mix_on_device, step_graphed
from convit_edu.devices import autocast, resolve_precision
from convit_edu.distributed import StopSignals, World, all_reduce, init_world
from convit_edu.evaluation import evaluate
from convit_edu.optimisation import seed_step, train_loss, update_ema
from convit_edu.run_records import Progress, RunFolder, RunWriter, run_info
from convit_edu.run_setup import RunData, build_models, build_run_data, compile_cache, new_train_state, wrap_model
from convit_edu.run_state import (Callback, TrainState, checked_weights, loader_states, nonfinite_remedy, restore_run,
                                  resume_checkpoint, resume_weights, run_checkpoint)

# %% [markdown]
# ## The trainer
#
# What `train` returns first: the model, its EMA, the log, where it all is, and whether the run was stopped.

# %%
#| export
@dataclass
class TrainResult:
    """What `train` returns. `stopped` says why it ended early ("SIGTERM", "SIGINT", "callback") or is None."""

    model: nn.Module
    ema: nn.Module | None
    history: list[dict]
    output: Path
    stopped: str | None

# %% [markdown]
# ## The trainer
#
# `Trainer(cfg, world)` builds a run in chapter 27's order — output folder, data, models, resume checkpoint,
# optimisation — and restores a checkpoint with chapter 26's `resume_weights` and `restore_run`. Its state,
# `trainer.state`, is the one its hooks see. Three objects share the loop: `trainer.train_step`, a `TrainStep`, knows *how*
# a step runs and holds what only the step needs (the model wrapped for DDP and compiled, the teacher, the losses
# not read back yet); `trainer.records`, chapter 27's `RunWriter`, decides what is written in the run's folder,
# told what happened; the `Trainer` decides *when* — to read back, to evaluate, to stop — and reports it.
#
# **`step(batches)`**, one optimiser step: `accum_steps` micro-batches, each finished on the device, mixed
# (MixUp/CutMix) and run under autocast beside the teacher; DDP synchronises the gradients on the last one only.
# Then the scaler, the clipping, the optimiser at the rate of this step (the schedule's, a function of the global
# step: chapter 23) and the EMA. Every random draw in it is seeded from (seed, rank, epoch, step) first (chapter
# 23), so a resumed run draws the same. The host does only what must come from it — the batches, the MixUp/CutMix
# draw and the rate — and `step.on_device` the rest, reading nothing back: so that, when `cuda_graphs` says so
# (`step_graphed`), it can be captured in a CUDA graph and replayed (`28_cuda_graphs`, the chapter before), the
# batches copied into the graph's static buffers and the draw and the rate written into its tensors before each
# replay. The optimiser is then put in the form a graph replays (`graph_ready`) at the process's first step, after
# any resume, and the graph is captured after `GRAPH_WARMUP` eager steps: what it holds is what the checkpoint
# restored.
#
# **`step.read_back`**: the step's loss and whether it was finite stay **on the device**. Reading a number back
# (`.item()`, `.tolist()`) makes the CPU wait for the GPU to finish everything queued, and a GPU that waits
# for the CPU to queue the next step idles. So the loop reads back once per logging interval (`log_every`
# steps, the end of an epoch, a checkpoint or a stop): one all-reduce carries, for every process at once, the
# losses of the steps since the last read-back, whether each was finite, and whether a stop signal arrived, so
# that every process takes the same decision at the same step (a process alone reads back at the step after
# a signal, so that Ctrl-C stops within a step, not an interval). The price: a non-finite loss is noticed up to
# `log_every` steps late, after the optimiser has used it — which is why checkpoints refuse non-finite weights
# and the error names the last good checkpoint.
#
# **`train_epoch`** starts the sampler at the trainer's position (mid-epoch after a resume) and takes steps
# until the epoch is done or a stop is asked for (a signal on any process, or a hook's `state.stop`), reading
# back at each interval with the time its steps waited for data, and whenever the writer wants `last.pt`.
# **`end_epoch`** closes the epoch and, every `eval_every` epochs and after the last, reports that its evaluation
# begins; **`evaluate_epoch`** scores the model (and the EMA), appends the row to the log and reports the score.
#
# **`fit`**, the algorithm of a run: epoch after epoch, train the epoch; if it was stopped before its last
# step, return; otherwise end the epoch, and return there if a stop was asked for meanwhile. Then the writer's
# last word, the hooks' last call, and what happened.

# %%
#| export
def epoch_scores(state: TrainState, data: RunData, device: torch.device, precision: str) -> dict:
    """Validation loss, top-1 and top-5 of the model (and of its EMA), and the mean gate σ(λ) of each layer."""
    models = {"val": state.model, **({"ema": state.ema.module} if state.ema is not None else {})}
    result = evaluate(models, data.loaders.val, device=device, precision=precision, finish=data.device_transforms)
    scores = {f"{name}_{key}": value for name, metrics in result.items() for key, value in metrics.items()}
    return {**scores, "gates": getattr(state.model, "gate_means", list)()}  # (a model of yours may have none)


class TrainStep:
    """A run's optimiser step, called as `step(batches)`, and the read-back of its losses: the models (bare, wrapped
    for DDP, compiled), the data's device end and the state's schedule, optimiser, scaler and EMA; when
    `step_graphed`, the step on the device replayed from a CUDA graph (`StepGraph`, chapter 28's `28_cuda_graphs`)."""

    def __init__(self, cfg: TrainConfig, world: World, model: nn.Module, teacher: nn.Module | None, data: RunData,
                 state: TrainState, precision: str):
        self.cfg, self.world, self.model, self.teacher, self.data = cfg, world, model, teacher, data
        self.state, self.precision = state, precision
        self.wrapped, self.step_model = wrap_model(model, world, cfg.compile)
        self.unread: list[torch.Tensor] = []  # (loss, non-finite) of each step not read back yet, on the device
        self.mixing = (torch.zeros(cfg.accum_steps, len(MIX_NUMBERS), device=world.device)
                       if data.mixup is not None else None)  # each micro-batch's MixUp/CutMix draw, on the device
        self.graph = StepGraph(self.on_device, world.device) if step_graphed(cfg, world) else None

    def __call__(self, batches: Iterator) -> float:
        """One optimiser step over the next `accum_steps` micro-batches of `batches`; its loss stays on the device
        (in `self.unread`) until `read_back`. Returns the seconds the host waited for the loader."""
        cfg, s, data = self.cfg, self.state, self.data
        seed_step(cfg.seed, self.world.rank, s.epoch, s.step)  # Mixup/CutMix and drop path: a function of the place
        inputs, waited = [], 0.0
        for _ in range(cfg.accum_steps):
            t0 = time.perf_counter()
            inputs += next(batches)  # (images, labels)
            waited += time.perf_counter() - t0  # the host blocked on the loader: a starving device
        if self.mixing is not None:  # drawn on the host, read on the device
            for numbers, images in zip(self.mixing, inputs[::2]):
                fill(numbers.unbind(), mix_numbers(data.mixup, *images.shape[-2:]))
        if self.graph is None:
            s.schedule.set_lr(s.optimizer, s.global_step)
            self.unread.append(self.on_device(*(t.to(self.world.device, non_blocking=True) for t in inputs)))
        else:
            if self.graph.calls == 0:  # the optimiser as loaded (a resume's, see `graph_ready`), before the capture
                graph_ready(s.optimizer, self.world.device)
            fill([group["lr"] for group in s.optimizer.param_groups], s.schedule.rates(s.global_step))
            self.unread.append(self.graph(*inputs))
        s.step, s.global_step = s.step + 1, s.global_step + 1
        return waited

    def on_device(self, *inputs: torch.Tensor) -> torch.Tensor:
        """The step's work on the device, from its micro-batches (images, labels, images, labels, ...) on the device
        to the weights' and EMA's update: what a graph captures, so it reads nothing back and takes every number that
        changes between steps from a tensor. Returns (loss, non-finite) as one tensor."""
        cfg, s, data = self.cfg, self.state, self.data
        losses = []
        for micro in range(cfg.accum_steps):
            images = finish_batch(inputs[2 * micro], data.device_transforms, train=True)
            targets = inputs[2 * micro + 1]
            if self.mixing is not None:
                images, targets = mix_on_device(images, targets, self.mixing[micro], data.mixup)
            sync = micro == cfg.accum_steps - 1 or self.wrapped is self.model  # DDP: all-reduce the last one's gradients
            with contextlib.nullcontext() if sync else self.wrapped.no_sync():
                with autocast(self.world.device, self.precision):
                    with torch.no_grad():
                        teacher_logits = self.teacher(images) if self.teacher is not None else None
                    loss = train_loss(self.step_model(images), targets, teacher_logits, data.smoothing)
                s.scaler.scale(loss / cfg.accum_steps).backward()
            losses.append(loss.detach().float())
        loss = torch.stack(losses).mean()
        if cfg.clip_grad:
            s.scaler.unscale_(s.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad)
        s.scaler.step(s.optimizer)
        s.scaler.update()
        s.optimizer.zero_grad(set_to_none=True)
        if s.ema is not None:  # (a graph is captured after its warm-up: never at the first step)
            update_ema(s.ema, self.model, cfg.ema_decay, first=s.global_step == 0)
        return torch.stack([loss, (~torch.isfinite(loss)).float()])

    def read_back(self, received: bool, last_good: Callable[[], str]) -> bool:
        """The one host sync of a logging interval: the losses of the steps since the last one, summed over the
        processes with whether each `received` a stop signal; raises on a non-finite loss, naming `last_good()`.
        Returns whether any process received a signal."""
        s, world = self.state, self.world
        received = torch.tensor([[float(received), 0.0]], device=world.device)
        *steps, (signalled, _) = all_reduce(torch.cat([*[t[None] for t in self.unread], received])).tolist()
        self.unread.clear()
        for i, (loss_sum, bad_ranks) in enumerate(steps):
            if bad_ranks:
                raise FloatingPointError(
                    f"non-finite loss ({loss_sum / world.world_size}) at epoch {s.epoch + 1}, step "
                    f"{s.step - len(steps) + i + 1} (global step {s.global_step - len(steps) + i + 1}) on "
                    f"{bad_ranks:.0f} of {world.world_size} process(es), read back {len(steps) - i - 1} step(s) later "
                    f"(losses are read every log_every steps); the weights were not saved; {last_good()}: "
                    f"{nonfinite_remedy(self.precision)}")
        s.epoch_losses += [loss_sum / world.world_size for loss_sum, _ in steps]
        s.loss = s.epoch_losses[-1] if steps else s.loss
        return bool(signalled)


class Trainer:
    """A training run as one object: built from `cfg` on this process's `world` (`init_world`), restored from
    its checkpoint when `cfg.resume` says so, trained by `fit`. `model`, `datasets` = (train, val, class names),
    `teacher` and `callbacks` are as for `train`. The run's state is `self.state`, which the hooks see; what it
    writes, `self.records` decides."""

    def __init__(self, cfg: TrainConfig, world: World, *, model: nn.Module | None = None,
                 datasets: tuple | None = None, teacher: nn.Module | None = None, callbacks: Sequence[Callback] = ()):
        self.cfg, self.world, self.callbacks = cfg, world, list(callbacks)
        self.folder, self.precision = RunFolder(cfg.output), resolve_precision(cfg.precision, world.device)
        self.records = RunWriter(self.folder, world, cfg.ckpt_every, self.checkpoint)
        self.records.prepare()
        self.data = data = build_run_data(cfg, world, datasets)
        # the bare model: the hooks and the checkpoints see it
        self.model, self.teacher = build_models(cfg, data.num_classes, world.device, model, teacher)
        ckpt, path = resume_checkpoint(cfg.resume, self.folder.last, world)
        changes = resume_weights(ckpt, path, cfg, self.model, data.global_batch) if ckpt is not None else {}
        self.state = new_train_state(cfg, world, self.model, data, self.precision, step_graphed(cfg, world))
        self.train_step = TrainStep(cfg, world, self.model, self.teacher, data, self.state, self.precision)
        self.compiled = False  # the first compiled step is done (each epoch's `compile_s` and `data_wait`: seconds)
        self.progress = Progress(cfg.progress if world.main else "none", cfg.epochs, cfg.log_every)
        self.signals = StopSignals()
        if ckpt is not None:
            restore_run(ckpt, path, self.state, data.loaders, world, changes)
        info = run_info(cfg, world, batch_size=data.batch_size, global_batch=data.global_batch,
                        steps_per_epoch=data.steps_per_epoch, num_workers=data.num_workers, precision=self.precision)
        self.records.start(self.state, info, resumed_from=path, changes=changes)

    def train_epoch(self) -> tuple[str | None, int, float]:
        """Optimiser steps from the trainer's position until the epoch ends or a stop is asked for: (why it
        stopped or None, images trained on, seconds)."""
        cfg, s, data = self.cfg, self.state, self.data
        batches = data.loaders.epoch(s.epoch, start=s.step * cfg.accum_steps * data.batch_size)
        self.model.train()
        t0, images, self.data_wait, self.compile_s = time.perf_counter(), 0, 0.0, 0.0
        last = (t0, 0.0)  # time and data wait at the last read-back
        for _ in self.progress.steps_of(range(s.step, data.steps_per_epoch)):
            compiling = cfg.compile and not self.compiled
            self.data_wait += self.train_step(batches)
            if compiling:  # the host waited for the compiler, not for the device (which runs ahead)
                self.compile_s, self.compiled = time.perf_counter() - t0 - self.data_wait, True
            images += data.global_batch
            self._callback("on_step_end")
            save = self.records.due(s)
            alone_signalled = self.world.world_size == 1 and self.signals.received is not None  # stop at this step
            if not (s.step % cfg.log_every == 0 or s.step == data.steps_per_epoch or s.stop or save
                    or alone_signalled):
                continue  # no host sync: the device runs ahead
            signalled = self.train_step.read_back(self.signals.received is not None, self.records.last_good)
            now = time.perf_counter()
            self.progress.step(s, s.schedule.lr(s.global_step), images / (now - t0),
                               data_wait=self.data_wait - last[1], interval=now - last[0])
            last = (now, self.data_wait)
            if signalled or s.stop:
                return self._why(signalled), images, time.perf_counter() - t0
            if save:
                self.records.save(s)
        return None, images, time.perf_counter() - t0

    def end_epoch(self, images: int, seconds: float) -> None:
        """Close the finished epoch; when it is evaluated (every `eval_every` epochs and the last), report that
        its evaluation begins, then evaluate it."""
        s = self.state
        row = {"epoch": s.epoch + 1, "step": s.global_step,
               "train_loss": sum(s.epoch_losses) / max(1, len(s.epoch_losses)),
               "lr": s.schedule.lr(s.global_step), "images_per_s": images / seconds, "epoch_time_s": seconds,
               "data_wait_s": self.data_wait, "data_wait_share": self.data_wait / seconds, "compile_s": self.compile_s}
        s.epoch, s.step, s.epoch_losses, s.seconds = s.epoch + 1, 0, [], s.seconds + seconds
        if s.epoch % self.cfg.eval_every and s.epoch < self.cfg.epochs:  # not evaluated: no row, nothing written
            self._callback("on_epoch_end")
            return
        s.pending = row
        self.records.evaluating(s)
        self.evaluate_epoch()

    def evaluate_epoch(self) -> None:
        """Score the pending epoch, log it, and report the score (whether it is the best so far)."""
        s, t0 = self.state, time.perf_counter()
        row = {**s.pending, **epoch_scores(s, self.data, self.world.device, self.precision)}
        s.seconds += time.perf_counter() - t0
        row["time_s"] = s.seconds
        s.history.append(row)
        s.pending = None
        self.progress.epoch_end(row)
        improved = row["val_top1"] > s.best_top1
        s.best_top1 = max(s.best_top1, row["val_top1"])
        self.records.scored(s, improved)
        self._callback("on_epoch_end")

    def checkpoint(self) -> dict:
        """The run's checkpoint as it stands, built on every process (what `records` writes as `last.pt`): the
        weights, refused when non-finite with the last good checkpoint named, and every process's loader state."""
        s = self.state
        weights = checked_weights(self.model, s.global_step, self.records.last_good(), self.precision)
        return run_checkpoint(s, weights, loader_states(self.data.loaders, self.world), self.data.num_classes)

    def _why(self, signalled: bool) -> str:
        return (self.signals.received or "a signal to another process") if signalled else "callback"

    def _callback(self, hook: str) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(self.state)

    def fit(self) -> TrainResult:
        """Train from the trainer's position to the last epoch, or until a stop (SIGTERM/SIGINT on any process, a
        hook's `state.stop`); the writer's last word (`last.pt`, the curves), and what happened."""
        cfg, s = self.cfg, self.state
        self._callback("on_train_begin")
        stopped = None
        with self.signals, compile_cache(self.folder.compile_cache, cfg.compile):
            if s.pending is not None:  # resumed from a checkpoint written before its epoch was evaluated
                self.records.evaluating(s)
                self.evaluate_epoch()
            if self.progress.mode == "lines" and s.epoch < cfg.epochs:  # when a log reader may expect lines
                print(f"epochs {s.epoch + 1}-{cfg.epochs} of {self.data.steps_per_epoch} steps: a line every "
                      f"{cfg.log_every} steps and after each evaluated epoch", flush=True)
            for _ in self.progress.epochs_of(range(s.epoch, cfg.epochs)):  # each epoch_end moves s.epoch on
                stopped, images, seconds = self.train_epoch()
                if stopped and s.step < self.data.steps_per_epoch:
                    break
                self.end_epoch(images, seconds)
                signalled = all_reduce(torch.tensor(float(self.signals.received is not None),
                                                    device=self.world.device)).item()
                if (stopped or signalled or s.stop) and s.epoch < cfg.epochs:
                    stopped = stopped or self._why(bool(signalled))
                    break
            else:  # the last epoch ran to its end: a stop that came during it or its evaluation stops nothing
                stopped = None
            self.records.finished(s)
        self._callback("on_train_end")
        if self.world.main and stopped:
            print(f"stopped by {stopped} at epoch {s.epoch + 1}, step {s.step}: checkpoint {self.folder.last}; "
                  "continue with --resume auto", flush=True)
        return TrainResult(self.model, s.ema.module if s.ema is not None else None, s.history, self.folder.path,
                           stopped)


# %% [markdown]
# And the one entry point, for notebooks and the command line alike: this process's world, a trainer, `fit`.

# %%
#| export
def train(cfg: TrainConfig, *, model: nn.Module | None = None, datasets: tuple | None = None,
          teacher: nn.Module | None = None, callbacks: Sequence[Callback] = ()) -> TrainResult:
    """Train as `cfg` says, on one process or under `torchrun`; the single entry point of notebook and CLI.

    By default the model is `cfg.model` with `cfg.model_args` and the data `build_datasets(cfg.data)` with the
    augmentation `cfg.aug`; pass `model`, `datasets` = (train, val, class names) or `teacher` to use your own.
    Returns when the last epoch is done, or early (with a checkpoint) on SIGTERM/SIGINT or `state.stop`.
    """
    world = init_world(cfg.device)
    try:
        result = Trainer(cfg, world, model=model, datasets=datasets, teacher=teacher, callbacks=callbacks).fit()
        if world.owns_group:  # gloo's barrier first waits for every queued collective: no rank tears the group
            dist.barrier()    # down while its worker threads still hold work (an abort at exit, seen 1 run in ~20)
        return result
    finally:
        if world.owns_group:
            dist.destroy_process_group()

# %% [markdown]
# ### Every N steps, whatever a pass is
#
# The loop has one place where it evaluates, checkpoints and starts its loader again: the end of an epoch. A run of
# many passes over a small training set (Table 2's f = 0.1 on a GPU: 1 400 images, a pass every 10 steps of 128)
# would do all three at every pass, or skip the evaluations with `eval_every` and still drain and restart its
# loader each time. With `epoch_steps` (chapter 21) an epoch is a span of that many steps of a stream that cycles
# the images (chapter 16's `CyclingSampler`), so the same loop evaluates, writes `last.pt` and starts the loader once
# every `epoch_steps` × `eval_every` steps, and a pass ends in the middle of a batch with nothing done. Twenty
# synthetic images at a batch of 8 (two and a half batches a pass), in 4 epochs of 5 steps:

# %%
import tempfile
from dataclasses import replace

cycled = TrainConfig(model="deit_tiny", img_size=8, model_args={"patch_size": 4, "embed_dim": 16, "depth": 1,
                     "num_heads": 2}, data="fake", data_args={"num_train": 20, "num_val": 8, "image_size": 8},
                     aug="pad-crop-flip", epochs=4, epoch_steps=5, batch_size=8, warmup_epochs=1, precision="fp32",
                     num_workers=0, progress="none", output=tempfile.mkdtemp())
trainer, started, saved = Trainer(cycled, init_world(cycled.device)), [], []
epoch, save = trainer.data.loaders.epoch, trainer.records.save  # counted: each loader start, each last.pt written
trainer.data.loaders.epoch = lambda e, start=0: started.append(e) or epoch(e, start)
trainer.records.save = lambda state: saved.append(state.global_step) or save(state)
history = trainer.fit().history
steps, images = [row["step"] for row in history], cycled.epochs * cycled.epoch_steps * cycled.batch_size
assert steps == [5, 10, 15, 20] and started == [0, 1, 2, 3] and saved == [5, 10, 15, 20, 20] and images == 8 * 20
print(f"{images} images, {images // 20} passes over the 20: the loader started at epochs {started}, evaluated at "
      f"steps {steps}, last.pt written at steps {saved} (before each evaluation, and with the whole log at the end)")

# %% [markdown]
# Chapter 29 drives a trainer by hand — three steps, one read-back, a checkpoint resumed bit for bit, weights and
# losses gone non-finite — and then checks the loop's promises on whole runs.
