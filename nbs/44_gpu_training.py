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
# # The GPU check, part 3: the training loop on the GPU, and `convit-edu train` on JPEGs
#
# Chapter `44_gpu_time` measured a training step alone. This chapter checks the real training loop (chapter 28) on the
# GPU: compiled in one graph with no break, no host synchronisation inside a step, the same training when its steps
# are replayed from CUDA graphs as when they run eagerly; and then `convit-edu train` as a user runs it, on JPEGs,
# with each loader, a resume and an evaluation, reading from its progress lines how long the steps waited for data
# once the loader's start-up was over.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpu_check_training
# The GPU check's phases of the training loop: graph breaks, host syncs, graphed training against eager, and
# `convit-edu train` on JPEGs with each loader, its data wait in the steady state apart from the start-up.

# %%
import contextlib
import io
import tempfile

from convit_edu.gpu_check_correctness import CheckSizes, collect_environment

# %% [markdown]
# ## Graph breaks, recompiles and host synchronisations
#
# `torch.compile` traces the model's Python into one graph and fuses its kernels. Code it cannot trace (a `print`, an
# `.item()`, a branch on a tensor's value) **breaks** the graph, with a return to Python in between; a guard that
# fails (a new batch size, another dtype) **recompiles**, paying the compile again. `torch._dynamo.explain` traces each
# model in training mode under the run's autocast and reports its graphs and breaks, with reasons. The runs of
# `convit-edu train` below count both in the real loop, from torch's own log (`TORCH_LOGS`).
#
# The host feeds the GPU through a queue of kernel launches and can run ahead of it. A **host synchronisation** in a
# step (`.item()`, `bool(tensor)`, a copy to the CPU, `torch.nonzero`) makes the host wait until the queue is empty,
# and then the GPU wait for the next launches: a stall in every step (and inside a CUDA graph's capture, an error).
# The training loop reads its losses back only every `log_every` steps (`TrainStep.read_back`, chapter 28).
# `fit_watched` runs the package's real `TrainStep` from the third step on under CUDA's sync-debug mode, which warns
# at each sync, and counts the warnings by the line that caused them: none is the target (§9). A CPU has no queue and
# no sync-debug mode: the phase is skipped there.

# %%
#| export
import json
import os
import re
import subprocess
import sys
import threading
import traceback
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from convit_edu.config import TrainConfig
from convit_edu.config_words import config_to_words
from convit_edu.devices import autocast
from convit_edu.distributed import init_world
from convit_edu.gpu_check_correctness import CheckContext, PhaseResult, exact_fp32
from convit_edu.run_records import RunFolder
from convit_edu.run_setup import build_models
from convit_edu.training import Trainer


def check_graph_breaks(ctx: CheckContext) -> PhaseResult:
    rows = {}
    for name in ctx.sizes.models:
        torch._dynamo.reset()
        model = ctx.sizes.model(name, drop_path_rate=0.1).to(ctx.device).train()
        with autocast(ctx.device, ctx.precision):
            found = torch._dynamo.explain(model)(torch.randn(2, 3, ctx.sizes.img_size, ctx.sizes.img_size,
                                                             device=ctx.device))
        rows[name] = {"graphs": found.graph_count, "breaks": found.graph_break_count,
                      "reasons": [str(r.reason)[:300] for r in found.break_reasons[:5]]}
    ok = all(r["graphs"] == 1 and r["breaks"] == 0 for r in rows.values())
    return PhaseResult("PASS" if ok else "FAIL", f"train mode, {ctx.precision}: " + ", ".join(
        f"{n} {r['graphs']} graph(s) {r['breaks']} break(s)" for n, r in rows.items()), rows)


def is_sync_warning(message: Warning | str) -> bool:
    """Whether a warning is sync-debug mode's report of a synchronising CUDA call, not the notice that switching the
    mode on prints once ("Synchronization debug mode is a prototype feature and does not yet detect all
    synchronizing operations"), which mentions synchronizing too."""
    return "called a synchronizing CUDA operation" in str(message)


def fit_watched(cfg: TrainConfig, count_from: int = 3) -> dict:
    """Train `cfg` with the package's `Trainer` in this process, watching its steps: on a GPU every optimiser step from
    step `count_from` on runs under CUDA's sync-debug mode (host syncs between read-backs, counted by the line causing
    them); the run's history."""
    trainer = Trainer(cfg, init_world(cfg.device))
    step, sites, seen = trainer.train_step, Counter(), {"checked_steps": 0, "first": {}}
    cuda = trainer.world.device.type == "cuda"

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        """Called where the warning surfaces: each site's first time, its step, thread and Python stack are kept."""
        if not is_sync_warning(message):
            return
        site = f"{Path(filename).name}:{lineno}"
        sites[site] += 1
        stack = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} {f.name}"
                 for f in traceback.extract_stack()[-14:-1]]
        seen["first"].setdefault(site, {"step": trainer.state.global_step + 1,
                                        "thread": threading.current_thread().name, "stack": stack})

    class Watched:
        """The trainer's step, its steps from `count_from` on run under sync-debug mode; its read-back as it is."""

        read_back = step.read_back

        def __call__(self, batches) -> float:
            if not cuda or trainer.state.global_step + 1 < count_from:
                return step(batches)
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = record  # restored when the block ends
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    waited = step(batches)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            seen["checked_steps"] += 1
            return waited

    trainer.train_step = Watched()
    try:
        history = trainer.fit().history
    finally:  # a cycle trainer -> Watched -> trainer would leave the loaders to the garbage collector, whose
        trainer.train_step = step  # finalisers close their queues first and then wait for workers that ignore SIGTERM
    return {"history": history, "syncs": sum(sites.values()) if cuda else None, "sync_sites": dict(sites),
            "sync_first_seen": seen["first"], "checked_steps": seen["checked_steps"]}


def check_host_syncs(ctx: CheckContext) -> PhaseResult:
    if ctx.device.type != "cuda":
        return PhaseResult("SKIP", f"CUDA's sync-debug mode counts host syncs on a GPU; the {ctx.device} has no queue")
    batch = ctx.sizes.batch // 4
    run = fit_watched(ctx.sizes.run(ctx.work / "syncs", "convit_tiny", batch, epochs=1, ema_decay=0.9999, clip_grad=1))
    where = ", ".join(f"{site} ×{n}" for site, n in run["sync_sites"].items()) or "none"
    return PhaseResult("PASS" if run["syncs"] == 0 else "FAIL", f"eager convit_tiny b{batch}, DeiT recipe, EMA, clip: "
                       f"{run['syncs']} syncs in {run['checked_steps']} steps between read-backs ({where})", run)


# %% [markdown]
# ## Training with CUDA graphs against training without
#
# With `--compile` on a GPU, the training step (chapter 28) is captured in a **CUDA graph** (`TrainConfig.cuda_graphs`:
# `auto` does it when compiled on CUDA, `on` insists, `off` never): its kernels are recorded once and replayed as one
# launch per step, so the host no longer pays for each. A replay recomputes what the capture recorded — into the same
# tensors, from whatever the inputs hold then — so whatever the graph holds must be right at every step: the batch,
# the learning rate, the optimiser's state, the EMA. The phase trains the same two-block ConViT-Ti (a GPSA and an SA
# block: what a graph holds does not depend on depth) for four steps twice, from the same seed on the same batches, in
# fp32 without TF32: eagerly (`compile=False, cuda_graphs="off"`), and compiled with graphs (`cuda_graphs="on"`),
# with EMA and gradient clipping. The draws that compiling changes are off (drop path, MixUp/CutMix, erasing): Inductor
# draws its random numbers its own way. The two must agree to rounding: the losses of every step, and the weights and
# the EMA weights, whose distance apart is measured against the distance the eager run moved them (`pos_proj.bias`
# aside: its gradient is zero in exact arithmetic, for a shift of all of a head's positional scores leaves its softmax
# unchanged (chapter 07), so AdamW moves it by the sign of rounding noise). On a CPU graphs do not apply and both
# runs are eager.

# %%
#| export
GRAPH_LIMITS = {"loss_rel": 1e-4, "weights_rel": 1e-2}
GRAPH_STEPS = 4


def graph_run_config(ctx: CheckContext, output: Path, compile: bool, cuda_graphs: str) -> TrainConfig:
    """`GRAPH_STEPS` one-step epochs of a two-block ConViT-Ti on synthetic images in fp32, every draw that compiling
    changes off, EMA and clipping on."""
    s, batch = ctx.sizes, 4 * ctx.sizes.step_batch
    return TrainConfig(model="convit_tiny", model_args={**s.model_args("convit_tiny"), "depth": 2, "local_up_to_layer": 1},
                       img_size=s.img_size, data="fake", data_args={"num_train": batch, "num_val": batch,
                                                                    "num_classes": s.num_classes},
                       batch_size=batch, epochs=GRAPH_STEPS, warmup_epochs=0, precision="fp32", compile=compile,
                       cuda_graphs=cuda_graphs, drop_path_rate=0.0,
                       aug_args={"mixup_alpha": 0.0, "cutmix_alpha": 0.0, "erasing": 0.0}, ema_decay=0.99,
                       clip_grad=1.0, num_workers=0, device=s.device, output=str(output), progress="none")


def _apart(a: nn.Module, b: nn.Module, start: nn.Module) -> float:
    """‖a − b‖ / ‖b − start‖ over the parameters but `pos_proj.bias`: how far apart two trainings ended, against
    how far the second moved."""
    def flat(m: nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().double().flatten().cpu() for n, p in m.named_parameters()
                          if not n.endswith("pos_proj.bias")])
    return float((flat(a) - flat(b)).norm() / (flat(b) - flat(start)).norm())


def check_graphs_vs_eager(ctx: CheckContext) -> PhaseResult:
    graphs = "on" if ctx.device.type == "cuda" else "auto"  # a CPU has no graphs: auto runs eagerly there
    found = {}
    for name, compile, mode in (("eager", False, "off"), ("graphed", ctx.sizes.compile, graphs)):
        cfg = graph_run_config(ctx, ctx.work / f"graphs-{name}", compile, mode)
        world = init_world(cfg.device)  # (which turns TF32 on, for training)
        with exact_fp32():
            found[name] = Trainer(cfg, world).fit()
    eager, graphed = found["eager"], found["graphed"]
    start = build_models(cfg, ctx.sizes.num_classes, torch.device("cpu"))[0]  # seeded as both runs were
    losses = [(a["train_loss"], b["train_loss"]) for a, b in zip(eager.history, graphed.history)]
    details = {"losses": losses, "loss_rel": max(abs(b - a) / abs(a) for a, b in losses),
               "weights_rel": _apart(graphed.model, eager.model, start), "ema_rel": _apart(graphed.ema, eager.ema, start),
               "limits": GRAPH_LIMITS, "cuda_graphs": graphs, "compile": ctx.sizes.compile}
    ok = (len(losses) == GRAPH_STEPS and details["loss_rel"] <= GRAPH_LIMITS["loss_rel"]
          and max(details["weights_rel"], details["ema_rel"]) <= GRAPH_LIMITS["weights_rel"])
    how = "compiled, cuda_graphs on" if ctx.device.type == "cuda" else "on the CPU both eager (graphs are CUDA's)"
    return PhaseResult("PASS" if ok else "FAIL", (
        f"{len(losses)} fp32 steps, eager vs {how}: loss rel ≤ {details['loss_rel']:.1e} (limit "
        f"{GRAPH_LIMITS['loss_rel']:g}), weights {details['weights_rel']:.1e} and EMA {details['ema_rel']:.1e} of the "
        f"distance moved apart (limit {GRAPH_LIMITS['weights_rel']:g})"), details)


# %% [markdown]
# ## `convit-edu train` on JPEGs: each loader, a resume, an evaluation
#
# The check writes its own ImageFolder of photo-like JPEGs — smooth colour fields at two scales plus grain, 500 × 375
# at quality 90, so that decoding one costs what decoding a photograph does — and runs `python -m convit_edu.cli train`
# on it as a user would, in a process of its own, compiled and with CUDA graphs on a GPU. The torchvision loader's
# workers decode with PIL on the CPU; the `gpu-decode` loader (`19_gpu_decode`, `19_side_stream`) decodes on the
# training device, beside the step on a stream of its own, one batch ahead (and in `--smoke` on the CPU, where it runs
# too). One run per loader and model, ConViT-S and DeiT-S; the gpu-decode ConViT-S is then resumed (`--resume auto`)
# for one more epoch and its last checkpoint evaluated (`eval`), whose top-1 must be the one the run logged; torch's
# log of every run must hold no recompile and no graph break.
#
# **The data wait, in the steady state.** The share of an epoch its steps waited for the loader (`log.jsonl`'s
# `data_wait_share`) mixes two things: the loader's start-up (workers starting, each making a whole first batch;
# a compile, during which the workers fill their queues) and its pace once running. The first check's 28–32 % for the
# torchvision loader was all start-up: the first 10 of 31 steps, and none after (`gpu-results-reading.md` §4a).
# `data_wait_split` reads the run's progress lines (one every `log_every` steps: the epoch's images/s so far and the
# seconds the interval's steps waited) and keeps the first interval of each epoch apart as start-up; the rest is the
# **steady state**: its images/s and its data-wait share. A loader whose workers may queue more batches than an epoch
# holds (the torchvision loader: 4 a worker) fills them while the first step compiles, so its run trains two epochs
# and its second epoch is the one read; the gpu-decode loader works one batch ahead, and each of its epochs counts.

# %%
#| export
PROGRESS_LINE = re.compile(r"^epoch (\d+)/\d+ step (\d+)/\d+ loss \S+ lr \S+ (\d+) img/s data wait ([\d.]+) s \(\d+ %\)$")


def data_wait_split(lines: list[str], batch: int) -> list[dict]:
    """Per epoch of one process's progress lines (`--progress lines`, `batch` images a step, each epoch from its first
    step): its first interval (`startup`) and the rest (`steady`, None for an epoch of one interval), each with its
    steps, seconds, seconds waited for data, their share and images/s. An interval's seconds come from the epoch's
    images/s so far, printed with each line."""
    epochs: dict[int, list[tuple[int, float, float]]] = {}
    for line in lines:
        if match := PROGRESS_LINE.match(line):
            epoch, step, rate, wait = int(match[1]), int(match[2]), int(match[3]), float(match[4])
            if rate == 0:
                raise ValueError(f"progress line {line!r}: at 0 img/s its interval cannot be timed")
            epochs.setdefault(epoch, []).append((step, step * batch / rate, wait))

    def part(steps: int, seconds: float, wait: float) -> dict:
        return {"steps": steps, "seconds": seconds, "wait_s": wait, "wait_share": wait / seconds,
                "images_per_s": steps * batch / seconds}

    return [{"epoch": epoch, "startup": part(*points[0]),
             "steady": part(points[-1][0] - points[0][0], points[-1][1] - points[0][1], sum(w for *_, w in points[1:]))
             if len(points) > 1 else None} for epoch, points in epochs.items()]


def make_jpegs(root: Path, classes: int, train_per_class: int, val_per_class: int, width: int, height: int) -> dict:
    """An ImageFolder `root/{train,val}/cNNN/NNNN.jpg` of photo-like JPEGs at quality 90, a colour per class, written by
    a thread per CPU; their number and mean size in KiB."""
    jobs = [(root / split / f"c{c:03d}" / f"{i:04d}.jpg", c, i) for split, n in (("train", train_per_class),
            ("val", val_per_class)) for c in range(classes) for i in range(n)]

    def write(job: tuple[Path, int, int]) -> int:
        path, c, i = job
        rng = np.random.default_rng((c, i, int(path.parts[-3] == "val")))
        layers = [np.asarray(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).resize(
            (width, height), kind)) for (h, w), kind in (((3, 4), Image.Resampling.BICUBIC),
                                                         ((24, 32), Image.Resampling.BILINEAR))]
        pixels = (0.35 * np.random.default_rng(c).integers(0, 256, 3) + 0.45 * layers[0] + 0.2 * layers[1]
                  + rng.normal(0, 6, layers[0].shape))
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(path, quality=90)
        return path.stat().st_size

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        sizes = list(pool.map(write, jobs))
    return {"jpegs": len(sizes), "mean_kib": sum(sizes) / len(sizes) / 1024}


def run_cli(args: list[str], ctx: CheckContext) -> subprocess.CompletedProcess:
    """`python -m convit_edu.cli ARGS` in a process of its own, with torch logging its recompiles and graph breaks,
    stopped a minute after the budget's end; a RuntimeError with its last line when it fails."""
    try:
        done = subprocess.run([sys.executable, "-m", "convit_edu.cli", *args], capture_output=True, text=True,
                              timeout=max(1.0, ctx.seconds_left() + 60),
                              env={**os.environ, "TORCH_LOGS": "recompiles,graph_breaks"})
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"convit-edu {args[0]} was stopped a minute after the budget's end") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"convit-edu {args[0]} exited with status {done.returncode}: {last}")
    return done


def _steady(epoch: dict) -> str:
    s, first = epoch["steady"], epoch["startup"]
    steady = "no steady state" if s is None else (f"steady {s['images_per_s']:.0f} img/s, data wait {s['wait_share']:.0%}"
                                                   f" over {s['steps']} steps")
    return (f"epoch {epoch['epoch']} {steady} (start-up: {first['steps']} steps, {first['seconds']:.1f} s, "
            f"waited {first['wait_s']:.1f} s)")


def check_train(ctx: CheckContext, loader: str, model: str, epochs: int = 1, resume: bool = False) -> PhaseResult:
    """`convit-edu train` of `model` on the check's JPEGs with `loader` for `epochs` epochs (then, with `resume`, one
    more in a new process and `eval` of its checkpoint); the data wait of each epoch, start-up apart; the steady state
    of the last one (`steady`)."""
    s, data, out = ctx.sizes, ctx.work / "jpeg", ctx.work / f"run-{loader}-{model}"
    cfg = TrainConfig(model=model, model_args=s.model_args(model), img_size=s.img_size, data="imagefolder",
                      data_root=str(data), loader=loader, batch_size=s.batch, epochs=epochs, warmup_epochs=0,
                      num_workers=s.workers, device=str(ctx.device), compile=s.compile,
                      cuda_graphs="on" if ctx.device.type == "cuda" else "auto", output=str(out), progress="lines",
                      log_every=s.log_every)
    made = {} if data.is_dir() else make_jpegs(data, s.num_classes, *s.jpegs)
    runs = [run_cli(["train", *config_to_words(cfg)], ctx)]
    if resume:
        runs.append(run_cli(["train", *config_to_words(replace(cfg, epochs=epochs + 1, resume="auto"))], ctx))
    split = [epoch for done in runs for epoch in data_wait_split(done.stdout.splitlines(), s.batch)]
    logged = {kind: sum(done.stderr.count(f"[__{kind}] {what}") for done in runs)
              for kind, what in (("recompiles", "Recompiling function"), ("graph_breaks", "Graph break "))}
    run = RunFolder(out)
    rows = run.history()
    details = {**made, **logged, "cuda_graphs": cfg.cuda_graphs, "log": rows, "epochs": split,
               "steady": split[-1]["steady"], "output_tail": runs[-1].stdout.splitlines()[-12:]}
    problems = [f"{n} {kind.replace('_', ' ')} in the runs (torch's log)" for kind, n in logged.items() if n]
    if [r["epoch"] for r in rows] != list(range(1, epochs + 1 + resume)):
        problems.append(f"log.jsonl holds epochs {[r['epoch'] for r in rows]}, not 1-{epochs + resume}")
    if resume:
        workers = [] if s.workers is None else ["--num-workers", str(s.workers)]
        details["eval"] = scores = json.loads(run_cli(["eval", str(run.last), "--device", str(ctx.device), "--batch-size",
                                                       str(2 * s.batch), *workers], ctx).stdout.splitlines()[-1])
        if run.starts()[-1]["resumed_from"] is None:
            problems.append("the second run did not resume")
        if abs(scores["top1"] - rows[-1]["val_top1"]) > 100 / scores["images"]:  # more than one image apart
            problems.append(f"eval's top-1 {scores['top1']:.2f} % is not the logged {rows[-1]['val_top1']:.2f} %")
    how = f"{'compiled' if s.compile else 'eager'} b{s.batch}, {loader}, cuda_graphs {cfg.cuda_graphs}"
    checked = f"; resumed, eval top-1 {details['eval']['top1']:.1f} % as logged" if resume and not problems else ""
    return PhaseResult("FAIL" if problems else "PASS", f"{model} {how}: " + "; ".join(
        [_steady(e) for e in split] + problems) + f"; {logged['recompiles']} recompiles, {logged['graph_breaks']} "
        f"graph breaks{checked}", details)


# %% [markdown]
# ## Here, on a CPU
#
# The data wait of a made-up run at batch 256 with a line every 10 steps. Epoch 1: 1 280 img/s at step 10 (2 s, of
# which 1.5 s waiting: the start-up), 2 048 at step 20 (2.5 s), 2 560 at step 30 (3 s), 0.05 s waited in each of the
# last two intervals; so the steady state is 20 steps in 1 s, 5 120 img/s, a tenth of it waiting, where the whole
# epoch waited 1.6 s of 3. Epoch 2 prints one line, so it has a start-up and no steady state.

# %%
made_up = ["epochs 1-2 of 30 steps: a line every 10 steps and after each evaluated epoch",
           "epoch 1/2 step 10/30 loss 6.9000 lr 1.000e-03 1280 img/s data wait 1.50 s (75 %)",
           "epoch 1/2 step 20/30 loss 6.8000 lr 1.000e-03 2048 img/s data wait 0.05 s (10 %)",
           "epoch 1/2 step 30/30 loss 6.7000 lr 1.000e-03 2560 img/s data wait 0.05 s (10 %)",
           "epoch 1  step 30  train_loss 6.8  lr 0.001  images_per_s 2560  data_wait_share 0.5333",
           "epoch 2/2 step 30/30 loss 6.6000 lr 1.000e-03 2500 img/s data wait 0.30 s (10 %)"]
first, second = data_wait_split(made_up, batch=256)
print(first)
assert first["startup"] == {"steps": 10, "seconds": 2.0, "wait_s": 1.5, "wait_share": 0.75, "images_per_s": 1280.0}
steady = first["steady"]
assert steady["steps"] == 20 and abs(steady["seconds"] - 1) < 1e-12 and abs(steady["wait_s"] - 0.1) < 1e-12
assert abs(steady["wait_share"] - 0.1) < 1e-12 and abs(steady["images_per_s"] - 5120) < 1e-9
assert second["epoch"] == 2 and second["steady"] is None and second["startup"]["steps"] == 30

# %% [markdown]
# The loop's phases at the smoke sizes: graph breaks, host syncs (a CPU has no queue), the graphed training against the
# eager one (on a CPU both are eager).

# %%
# NBVAL_IGNORE_OUTPUT
# (the phase line names the precision `auto` picks: bf16 on a CPU with AVX-512 BF16, fp32 on others)
ctx = CheckContext(CheckSizes.smoke(), Path(tempfile.mkdtemp()), collect_environment(), budget_s=480)
with contextlib.redirect_stdout(io.StringIO()):
    breaks, syncs, graphs = check_graph_breaks(ctx), check_host_syncs(ctx), check_graphs_vs_eager(ctx)
print(breaks.summary)
print(syncs.status, syncs.summary)
assert breaks.status == "PASS" and syncs.status == "SKIP"

# %%
# NBVAL_IGNORE_OUTPUT
print(graphs.summary)

# %%
assert graphs.status == "PASS" and graphs.details["cuda_graphs"] == "auto"
assert graphs.details["loss_rel"] == graphs.details["weights_rel"] == graphs.details["ema_rel"] == 0
print(f"graphs do not apply on a CPU: {len(graphs.details['losses'])} steps with cuda_graphs auto equal the eager ones")

# %% [markdown]
# And, in full mode, `convit-edu train` on the smoke's JPEGs with the gpu-decode loader (decoding on the CPU here), a
# resume and an evaluation: three processes of their own (chapter 45's smoke check runs every loader).

# %%
# NBVAL_IGNORE_OUTPUT
if not FAST:
    with contextlib.redirect_stdout(io.StringIO()):
        jpeg = check_train(ctx, "gpu-decode", "convit_small", resume=True)
    print(jpeg.status, jpeg.summary)
    assert jpeg.status == "PASS" and [e["epoch"] for e in jpeg.details["epochs"]] == [1, 2]
    assert jpeg.details["steady"]["steps"] == ctx.sizes.num_classes * ctx.sizes.jpegs[0] // ctx.sizes.batch - 1
