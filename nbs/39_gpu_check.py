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
# # The GPU check: is this GPU set up right, and how fast does it train?
#
# Everything before this chapter was written and tested on CPUs. A GPU runs the same code with other kernels, other
# rounding, asynchronous execution and a data pipeline that must keep up, so the GPU path is *measured*, not assumed.
# One command does it, on a new GPU machine with no network, from the repository root:
# `convit-edu-check-gpu` (or `python -m convit_edu.gpu_check`). It runs **phases** in order of information per second
# — the environment, correctness, a short compiled training run, throughput, the real `convit-edu train` and `eval`
# on JPEGs with a resume, the rest — under one time budget, and writes `results.json` and `summary.txt` after every
# phase, so a machine taken away mid-run loses nothing. `--smoke` runs the same phases at toy size on a CPU in under a
# minute; CI runs it, so the check does not rot. It is a console script of its own, not a `convit-edu` sub-command:
# chapter 37's command line may import only the modules of the chapters before it, and the check runs that command.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpu_check
# The GPU check (`convit-edu-check-gpu`): correctness, host syncs, graph breaks, throughput and the real command line on
# one GPU, phase by phase under a time budget; `--smoke` runs the same phases at toy size on a CPU.

# %%
import contextlib
import io

import matplotlib.pyplot as plt

# %% [markdown]
# ## Sizes, phases and their results
#
# `CheckSizes.full()` is the GPU's work, at DESIGN §9's setting (224 px, bf16, batch 256, the paper's models).
# `CheckSizes.smoke()` is the same work on a CPU: every model cut to 2 blocks of width 36, 32-px images, a few dozen.
# A phase is a function of a `CheckContext` (sizes, a scratch folder, the environment, the budget's clock) that
# returns a `PhaseResult`: PASS or FAIL for a claim, INFO for a measurement, SKIP with its reason.

# %%
#| export
import argparse
import contextlib
import functools
import gc
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch._dynamo.utils import counters

from convit_edu.benchmarks import measure_model, train_step
from convit_edu.checkpoints import atomic_write, write_json
from convit_edu.checks import number, one_of
from convit_edu.config import TrainConfig, config_to_words
from convit_edu.dali import dali_available
from convit_edu.devices import autocast, resolve_precision
from convit_edu.distributed import init_world
from convit_edu.gpsa import GPSA
from convit_edu.gpsa_reference import GPSAReference
from convit_edu.optimisation import train_loss
from convit_edu.run_parts import check_output, versions
from convit_edu.training import Trainer
from convit_edu.zoo import create_model, model_config

STATUSES = ("PASS", "FAIL", "INFO", "SKIP")


@dataclass(frozen=True)
class CheckSizes:
    """How much work each phase does: `full()` on one GPU, `smoke()` the same phases on a CPU in under a minute."""

    mode: str
    device: str
    img_size: int
    num_classes: int
    shrink: dict  # ModelConfig overrides of every model ({}: the zoo's sizes)
    models: tuple  # the models whose training step is compared with the CPU's, and which Dynamo traces
    step_batch: int  # the training step compared with the CPU's (GPSA layers: twice that)
    batch: int  # the training runs and the throughput phases (the host-sync run: a quarter of it)
    steps: int  # optimiser steps per epoch of a run on synthetic images (timed steps of a throughput: half)
    sweep_batches: tuple  # eager ConViT-Ti
    jpegs: tuple  # classes, training and validation images per class, width, height
    workers: int | None  # loader processes (None: the loader's default, the CPUs less one)
    compile: bool  # on a CPU, Inductor's C++ build of even a 2-block model takes ~50 s: too long for a smoke test

    @classmethod
    def full(cls) -> "CheckSizes":
        return cls("full", "cuda", 224, 1000, {}, ("convit_tiny", "deit_tiny", "convit_small"), step_batch=8,
                   batch=256, steps=20, sweep_batches=(64, 128, 512), jpegs=(100, 80, 10, 500, 375), workers=None,
                   compile=True)

    @classmethod
    def smoke(cls) -> "CheckSizes":
        return cls("smoke", "cpu", 32, 10, {"depth": 2, "patch_size": 8, "embed_dim": 36}, ("convit_tiny", "deit_tiny"),
                   step_batch=2, batch=8, steps=4, sweep_batches=(4, 16), jpegs=(4, 8, 2, 64, 48), workers=1,
                   compile=False)

    def model_args(self, name: str) -> dict:
        """The ModelConfig overrides of zoo model `name` here: `shrink`, keeping a ConViT's last block an SA block."""
        if not self.shrink:
            return {}
        local = min(model_config(name).local_up_to_layer, self.shrink["depth"] - 1)
        return {**self.shrink, "local_up_to_layer": local}

    def model(self, name: str, drop_path_rate: float) -> torch.nn.Module:
        """Zoo model `name` at these sizes, initialised from seed 0: the same weights at every call."""
        torch.manual_seed(0)
        return create_model(name, img_size=self.img_size, num_classes=self.num_classes, drop_path_rate=drop_path_rate,
                            **self.model_args(name))

    def run(self, output: Path, model: str, batch: int, **changes) -> TrainConfig:
        """A silent run of `model` on `steps` batches of synthetic images per epoch, read back twice an epoch."""
        return TrainConfig(model=model, model_args=self.model_args(model), img_size=self.img_size, data="fake",
                           data_args={"num_train": batch * self.steps, "num_val": 2 * batch,
                                      "num_classes": self.num_classes}, batch_size=batch, warmup_epochs=0,
                           num_workers=self.workers, device=self.device, output=str(output), progress="none",
                           log_every=max(1, self.steps // 2), **changes)


@dataclass
class PhaseResult:
    """What a phase found: `status` (PASS, FAIL, INFO: a measurement, SKIP), one line of key numbers or the reason."""

    status: str
    summary: str
    details: dict = field(default_factory=dict)
    name: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        one_of("phase status", self.status, STATUSES)

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<16} {self.seconds:6.1f} s  {self.summary}"


@dataclass
class CheckContext:
    """What every phase gets: the sizes, a scratch folder, the environment, and the clock of the time budget."""

    sizes: CheckSizes
    work: Path
    environment: dict
    budget_s: float
    started: float = field(default_factory=time.monotonic)

    @property
    def device(self) -> torch.device:
        if self.sizes.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("torch sees no GPU: the full check needs one (--smoke runs the phases on the CPU)")
        return torch.device(self.sizes.device)

    @property
    def precision(self) -> str:
        return resolve_precision("auto", self.device)

    def seconds_left(self) -> float:
        return self.started + self.budget_s - time.monotonic()


# %% [markdown]
# ## ENV: what the numbers depend on
#
# The GPU, its driver (from `nvidia-smi` when the machine has it), CUDA, torch, torchvision and the CPU, and two
# things that break GPU runs without a clear message: the size of `/dev/shm` (loader workers hand their batches over
# in shared memory; containers often give 64 MiB) and whether the optional DALI imports. Full mode fails without a GPU.

# %%
#| export
def _nvidia_smi() -> dict:
    keys = ("name", "driver_version", "clocks.max.sm", "power.limit", "temperature.gpu")
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(keys)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except FileNotFoundError:
        return {}
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    return dict(zip(keys, (value.strip() for value in out.splitlines()[0].split(","))))


def collect_environment() -> dict:
    """The machine and the software a check's numbers depend on (the driver: nvidia-smi's, when there is one)."""
    gpu = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    smi = _nvidia_smi()
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **versions(), "cuda": torch.version.cuda,
        "gpu": gpu and gpu.name, "gpu_count": torch.cuda.device_count(), "driver": smi.get("driver_version"),
        "gpu_capability": gpu and f"{gpu.major}.{gpu.minor}", "gpu_sms": gpu and gpu.multi_processor_count,
        "gpu_memory_gib": gpu and round(gpu.total_memory / 2**30, 1), "cudnn": gpu and torch.backends.cudnn.version(),
        "nvidia_smi": smi, "cpu_count": os.cpu_count(),
        "cpu_model": next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), None),
        "fastprogress": importlib.metadata.version("fastprogress"), "dali": dali_available(),
        "shm_gib": round(shutil.disk_usage("/dev/shm").total / 2**30, 2) if Path("/dev/shm").is_dir() else None}


def check_env(ctx: CheckContext) -> PhaseResult:
    env = ctx.environment
    gpu = (f"{env['gpu']} (sm {env['gpu_capability']}, {env['gpu_memory_gib']} GiB, {env['gpu_sms']} SMs), driver "
           f"{env['driver'] or 'unknown (no nvidia-smi)'}, CUDA {env['cuda']}; ")
    line = (f"{gpu if env['gpu'] else ''}torch {env['torch']}, torchvision {env['torchvision']}; {env['cpu_count']} "
            f"CPUs ({env['cpu_model']}); /dev/shm {env['shm_gib']} GiB; DALI {'present' if env['dali'] else 'absent'}")
    if ctx.sizes.device == "cpu":
        return PhaseResult("INFO", line)
    if env["gpu"] is None:
        build = "a CPU-only build" if env["cuda"] is None else f"built for CUDA {env['cuda']}"
        return PhaseResult("FAIL", f"torch {env['torch']} ({build}) sees no GPU; nvidia-smi: "
                                   f"{env['nvidia_smi'] or 'absent'}")
    return PhaseResult("PASS", line)


# %% [markdown]
# ## Correctness: the GPU against the CPU, the fast GPSA against the reference
#
# One training step (forward, the training loss with label smoothing 0.1, backward) of the same model on the same
# images, on the GPU and on the CPU. In fp32 the two must agree to rounding, so **TF32 is off** here (the training loop
# turns it on: `init_world`), since TF32 keeps 10 bits of mantissa in matmuls. bf16 keeps 8, so its step is compared
# with the CPU's fp32 step at a looser tolerance. The numbers are the loss's relative error and the cosine between the
# two gradients, all parameters as one vector. Drop path is off: its random draws differ between devices. On a CPU
# (`--smoke`) the "GPU" is the CPU itself: fp32 compares it with itself, and only bf16 is a real comparison.
#
# The fast GPSA (chapter 06) is compared with the reference (chapter 05) on the GPU as `tests/gpsa_checks.py` does it:
# randomised gates, the outputs, and the gradients of the input and of every parameter but `pos_proj.bias` (whose
# gradient is zero in exact arithmetic: a shift of all of a head's positional scores leaves its softmax unchanged).

# %%
#| export
LIMITS = {"fp32": {"loss_rel": 1e-5, "grad_cos": 0.99999, "out_rel": 1e-5, "grad_rel": 1e-4},
          "bf16": {"loss_rel": 2e-2, "grad_cos": 0.99, "out_rel": 2e-2, "grad_rel": 5e-2}}


@contextlib.contextmanager
def exact_fp32():
    """fp32 matmuls and convolutions without TF32 on a GPU, inside the block."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _step(ctx: CheckContext, name: str, device: torch.device, precision: str) -> tuple[float, torch.Tensor]:
    """Loss and gradient (one fp64 vector on the CPU) of a training step of `name` on fixed random images."""
    s, gen = ctx.sizes, torch.Generator().manual_seed(1)
    images = torch.randn(s.step_batch, 3, s.img_size, s.img_size, generator=gen)
    targets = torch.randint(0, s.num_classes, (s.step_batch,), generator=gen)
    model = s.model(name, drop_path_rate=0.0).to(device)
    with exact_fp32(), autocast(device, resolve_precision(precision, device)):
        loss = train_loss(model(images.to(device)), targets.to(device), smoothing=0.1)
    loss.backward()
    return loss.item(), torch.cat([p.grad.double().flatten().cpu() for p in model.parameters()])


def check_step_vs_cpu(ctx: CheckContext) -> PhaseResult:
    device, rows = ctx.device, []
    for name in ctx.sizes.models:
        cpu_loss, cpu_grad = _step(ctx, name, torch.device("cpu"), "fp32")
        for precision in ("fp32", "bf16"):
            loss, grad = _step(ctx, name, device, precision)
            rows.append({"model": name, "precision": precision, "cpu_loss": cpu_loss, "loss": loss,
                         "loss_rel": abs(loss - cpu_loss) / abs(cpu_loss),
                         "grad_cos": torch.cosine_similarity(grad, cpu_grad, dim=0).item()})
    worst = {p: (max(r["loss_rel"] for r in rows if r["precision"] == p),
                 min(r["grad_cos"] for r in rows if r["precision"] == p)) for p in LIMITS}
    ok = all(rel <= LIMITS[p]["loss_rel"] and cos >= LIMITS[p]["grad_cos"] for p, (rel, cos) in worst.items())
    return PhaseResult("PASS" if ok else "FAIL", f"{device} vs cpu fp32, b{ctx.sizes.step_batch}: " + "; ".join(
        f"{p} loss rel ≤ {rel:.1e} (limit {LIMITS[p]['loss_rel']:g}), grad cos ≥ {cos:.6f} (limit "
        f"{LIMITS[p]['grad_cos']:g})" for p, (rel, cos) in worst.items()), {"rows": rows})


def _gpsa_grads(layer: torch.nn.Module, x: torch.Tensor, grid: int, precision: str) -> dict[str, torch.Tensor]:
    x = x.clone().requires_grad_()
    with exact_fp32(), autocast(x.device, precision):
        y = layer(x, grid_size=(grid, grid)).float()
    names, params = zip(*layer.named_parameters())
    weights = torch.linspace(-1, 1, y.shape[-1], device=x.device)  # a loss that weighs every output channel apart
    grads = torch.autograd.grad((y * weights).square().sum(), [x, *params])
    found = dict(zip(("out", "x", *names), (y.detach(), *grads)))
    del found["pos_proj.bias"]  # zero in exact arithmetic
    return found


def check_gpsa(ctx: CheckContext) -> PhaseResult:
    device, s, rows = ctx.device, ctx.sizes, []
    for name in ("convit_tiny", "convit_small"):  # their GPSA layers, on their token grid
        cfg = model_config(name, **s.model_args(name))
        grid, dim, heads = s.img_size // cfg.patch_size, cfg.embed_dim, cfg.num_heads
        torch.manual_seed(0)
        ref = GPSAReference(dim, heads).to(device)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * torch.randn_like(p))
            ref.gating_param.copy_(torch.linspace(-2, 2, heads))  # from mostly content to mostly position
        fast = GPSA(dim, heads).to(device)
        fast.load_state_dict(ref.state_dict())
        x = torch.randn(2 * s.step_batch, grid * grid, dim, device=device)
        want = _gpsa_grads(ref, x, grid, "fp32")
        for precision in LIMITS:
            got = _gpsa_grads(fast, x, grid, resolve_precision(precision, device))
            err = {k: float((got[k].double() - want[k].double()).norm() / want[k].double().norm()) for k in want}
            worst = max(err.keys() - {"out"}, key=err.get)
            rows.append({"embed_dim": dim, "heads": heads, "precision": precision, "out_rel": err["out"],
                         "worst_grad": worst, "grad_rel": err[worst]})
    ok = all(r["out_rel"] <= LIMITS[r["precision"]]["out_rel"] and r["grad_rel"] <= LIMITS[r["precision"]]["grad_rel"]
             for r in rows)
    return PhaseResult("PASS" if ok else "FAIL", f"on {device}, fast vs reference: " + "; ".join(
        f"D={r['embed_dim']} {r['precision']} out {r['out_rel']:.1e}, {r['worst_grad']} grad {r['grad_rel']:.1e}"
        for r in rows), {"rows": rows, "limits": LIMITS})


# %% [markdown]
# ## Graph breaks, recompiles and host synchronisations
#
# `torch.compile` traces the model's Python into one graph and fuses its kernels. Code it cannot trace (a `print`, an
# `.item()`, a branch on a tensor's value) **breaks** the graph, with a return to Python in between; a guard that
# fails (a new batch size, another dtype) **recompiles**, paying the compile again. `torch._dynamo.explain` traces each
# model in training mode under the run's autocast and reports its graphs and breaks, with reasons. The short compiled
# run trains ConViT-S for two epochs on synthetic images with the real loop (epoch 1 pays for the compile, epoch 2
# shows the steady speed) and counts the frames Dynamo compiles after the first step: each is a recompile.
#
# The host feeds the GPU through a queue of kernel launches and can run ahead of it. A **host synchronisation** in a
# step (`.item()`, `bool(tensor)`, a copy to the CPU, `torch.nonzero`) makes the host wait until the queue is empty,
# and then the GPU wait for the next launches: a stall in every step. The training loop reads its losses back only
# every `log_every` steps (`Trainer.read_back`, chapter 25). `fit_watched` runs the package's real `Trainer.step`
# from the third step on under CUDA's sync-debug mode, which warns at each sync, and counts the warnings by the line
# that caused them: none is the target (§9). A CPU has no queue and no sync-debug mode: the phase is skipped there.

# %%
#| export
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


def fit_watched(cfg: TrainConfig, count_from: int = 3) -> dict:
    """Train `cfg` with the package's `Trainer` in this process, watching its steps: on a GPU every optimiser step from
    step `count_from` on runs under CUDA's sync-debug mode (host syncs between read-backs, counted by the line causing
    them); Dynamo's frames compiled after the first step (recompiles) and graph breaks; the run's history."""
    torch._dynamo.reset()
    counters.clear()
    trainer = Trainer(cfg, init_world(cfg.device))
    step, sites, seen = trainer.step, Counter(), {"checked_steps": 0, "frames": 0}
    cuda = trainer.world.device.type == "cuda"

    def watched(batches) -> None:
        if trainer.state.global_step == 1:
            seen["frames"] = counters["frames"]["total"]
        if not cuda or trainer.state.global_step + 1 < count_from:
            return step(batches)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step(batches)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        seen["checked_steps"] += 1
        sites.update(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))

    trainer.step = watched
    try:
        history = trainer.fit().history
    finally:  # a cycle trainer -> watched -> trainer would leave the loaders to the garbage collector, whose
        del trainer.step  # finalisers close their queues first: the workers (which ignore SIGTERM) never stop
    return {"history": history, "syncs": sum(sites.values()) if cuda else None, "sync_sites": dict(sites),
            "checked_steps": seen["checked_steps"], "recompiles": counters["frames"]["total"] - seen["frames"],
            "graph_breaks": sum(counters["graph_break"].values())}


def check_host_syncs(ctx: CheckContext) -> PhaseResult:
    if ctx.device.type != "cuda":
        return PhaseResult("SKIP", f"CUDA's sync-debug mode counts host syncs on a GPU; the {ctx.device} has no queue")
    batch = ctx.sizes.batch // 4
    run = fit_watched(ctx.sizes.run(ctx.work / "syncs", "convit_tiny", batch, epochs=1, ema_decay=0.9999, clip_grad=1))
    where = ", ".join(f"{site} ×{n}" for site, n in run["sync_sites"].items()) or "none"
    return PhaseResult("PASS" if run["syncs"] == 0 else "FAIL", f"eager convit_tiny b{batch}, DeiT recipe, EMA, clip: "
                       f"{run['syncs']} syncs in {run['checked_steps']} steps between read-backs ({where})", run)


def check_compiled_train(ctx: CheckContext) -> PhaseResult:
    s = ctx.sizes  # no RandAugment: cheap images, so that the GPU, not the loader, sets the pace
    run = fit_watched(s.run(ctx.work / "compiled", "convit_small", s.batch, epochs=2, compile=s.compile,
                            aug_args={"randaugment_magnitude": None}))
    (first, last), syncs = run["history"], run["syncs"]
    ok = run["recompiles"] == 0 and run["graph_breaks"] == 0 and not syncs
    how = "compiled" if s.compile else "eager (smoke: no compile)"
    return PhaseResult("PASS" if ok else "FAIL", (
        f"convit_small b{s.batch} {how}: epoch 2 {last['images_per_s']:.0f} img/s, data wait "
        f"{last['data_wait_share']:.0%}; epoch 1 {first['epoch_time_s']:.1f} s, epoch 2 {last['epoch_time_s']:.1f} s; "
        f"{run['recompiles']} recompiles, {run['graph_breaks']} graph breaks, "
        + ("syncs not counted (no GPU)" if syncs is None else f"{syncs} syncs")), run)


# %% [markdown]
# ## Throughput against DESIGN §9
#
# The package's `measure_model` (chapter 27: a training step as `train` takes it and an inference forward, median
# images/s of interleaved steps, peak memory) for ConViT and DeiT, eager then compiled, with the seconds the first
# compiled step took. §9's targets for one H100 — ConViT-S ≥ 6000 training images/s compiled in bf16 at 224 px, and
# ≥ 0.8× DeiT-S — are **estimates** (`docs/reviews/gpu-readiness.md`), compared on a GPU only. The S models come
# before the JPEG runs, since the targets concern them; the Ti models and a batch sweep of ConViT-Ti come last.

# %%
#| export
S_TARGETS = {"convit_small_images_per_s": 6000.0, "convit_vs_deit": 0.8}  # DESIGN §9, one H100, compiled: estimates


def _rates(ctx: CheckContext, name: str, batch: int, compiled: bool) -> dict:
    device, s = ctx.device, ctx.sizes
    model, row = s.model(name, drop_path_rate=0.1).to(device), {"model": name, "batch": batch}
    row["mode"] = "compiled" if compiled else "eager"
    if compiled:
        model, start = torch.compile(model), time.perf_counter()
        train_step(model, batch, s.img_size, s.num_classes, ctx.precision, device)()
        if device.type == "cuda":  # the GPU works asynchronously: wait for it before reading the clock
            torch.cuda.synchronize(device)
        row["compile_s"] = time.perf_counter() - start
    return {**row, **measure_model(model, batch, s.img_size, steps=max(2, s.steps // 2), num_classes=s.num_classes,
                                   device=device, precision=ctx.precision)}


def _throughput(ctx: CheckContext, convit: str, deit: str, sweep: tuple = ()) -> PhaseResult:
    rows, ratios = [], {}
    for mode in ("eager", "compiled") if ctx.sizes.compile else ("eager",):
        for name in (convit, deit):  # a phase begun in time may run out of it: a compile takes a minute (estimate)
            if ctx.seconds_left() > (60 if mode == "compiled" else 0):
                rows.append(_rates(ctx, name, ctx.sizes.batch, mode == "compiled"))
        rate = {r["model"]: r["train_images_per_s"] for r in rows if r["mode"] == mode}
        if len(rate) == 2:
            ratios[mode] = rate[convit] / rate[deit]
    rows += [_rates(ctx, convit, batch, compiled=False) for batch in sweep if ctx.seconds_left() > 0]
    return PhaseResult("INFO", f"{ctx.precision}: " + ", ".join(
        f"{r['model']} {r['mode']} b{r['batch']} {r['train_images_per_s']:.0f} img/s ({r['peak_memory_mib'] / 1024:.1f}"
        f" GiB{', compile %.0f s' % r['compile_s'] if 'compile_s' in r else ''})" for r in rows) + "; ConViT/DeiT "
        + ", ".join(f"{mode} {ratio:.2f}×" for mode, ratio in ratios.items()), {"rows": rows, "ratios": ratios})


def check_throughput_small(ctx: CheckContext) -> PhaseResult:
    result = _throughput(ctx, "convit_small", "deit_small")
    compiled = {r["model"]: r["train_images_per_s"] for r in result.details["rows"] if r["mode"] == "compiled"}
    if ctx.device.type != "cuda" or len(compiled) < 2:
        return replace(result, summary=result.summary + "; §9's targets are for one H100, compiled: not compared")
    met = {"convit_small_images_per_s": compiled["convit_small"] >= S_TARGETS["convit_small_images_per_s"],
           "convit_vs_deit": compiled["convit_small"] / compiled["deit_small"] >= S_TARGETS["convit_vs_deit"]}
    note = f"; §9 estimates (ConViT-S ≥ 6000 img/s, ≥ 0.8× DeiT-S): {sum(met.values())} of 2 met"
    return replace(result, summary=result.summary + note, details={**result.details, "targets_met": met})


# %% [markdown]
# ## The real command line on JPEGs: train, resume, evaluate
#
# The check writes its own ImageFolder of photo-like JPEGs — smooth colour fields at two scales plus grain, 500 × 375
# at quality 90, so that decoding one costs what decoding a photograph does — and runs `python -m convit_edu.cli train`
# on it as a user would, in a process of its own; then `--resume auto` for one more epoch, and `eval` of the last
# checkpoint, whose top-1 must be the one the run logged. The run's `log.jsonl` gives the headline numbers: images/s
# and the **data-wait share**, the part of an epoch the step spent waiting for the loader. §9 wants it under 10 % for
# ConViT-S at 224 px on a 16-core machine. The torchvision loader decodes with PIL on the CPU, the `gpu-decode` loader
# on the GPU. The model runs eager here; a compiled one, being faster, would wait longer.

# %%
#| export
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


def run_cli(args: list[str], ctx: CheckContext) -> list[str]:
    """`python -m convit_edu.cli ARGS` in a process of its own, stopped a minute after the budget's end: its output
    lines, or a RuntimeError with its last line."""
    try:
        done = subprocess.run([sys.executable, "-m", "convit_edu.cli", *args], capture_output=True, text=True,
                              timeout=max(1.0, ctx.seconds_left() + 60))
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"convit-edu {args[0]} was stopped a minute after the budget's end") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"convit-edu {args[0]} exited with status {done.returncode}: {last}")
    return done.stdout.splitlines()


def check_jpeg_runs(ctx: CheckContext, loader: str) -> PhaseResult:
    if loader == "gpu-decode" and ctx.device.type != "cuda":
        return PhaseResult("SKIP", f"the gpu-decode loader decodes on a GPU; this check runs on the {ctx.device}")
    s, data, out = ctx.sizes, ctx.work / "jpeg", ctx.work / f"run-{loader}"
    cfg = TrainConfig(model="convit_small", model_args=s.model_args("convit_small"), img_size=s.img_size,
                      data="imagefolder", data_root=str(data), loader=loader, batch_size=s.batch, epochs=1,
                      warmup_epochs=0, num_workers=s.workers, device=str(ctx.device), output=str(out), progress="lines",
                      log_every=10)
    made = {} if data.is_dir() else make_jpegs(data, *s.jpegs)
    lines = run_cli(["train", *config_to_words(cfg)], ctx)
    lines += run_cli(["train", *config_to_words(replace(cfg, epochs=2, resume="auto"))], ctx)
    workers = [] if s.workers is None else ["--num-workers", str(s.workers)]
    scores = json.loads(run_cli(["eval", str(out / "last.pt"), "--device", str(ctx.device), "--batch-size",
                                 str(2 * s.batch), *workers], ctx)[-1])
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    resumed = json.loads((out / "invocations.jsonl").read_text().splitlines()[-1])["resumed_from"]
    details, problems = {**made, "log": rows, "eval": scores, "output_tail": lines[-12:]}, []
    if [r["epoch"] for r in rows] != [1, 2] or resumed is None:
        problems.append(f"the second run did not resume to epoch 2 (log.jsonl epochs {[r['epoch'] for r in rows]})")
    if abs(scores["top1"] - rows[-1]["val_top1"]) > 100 / scores["images"]:  # more than one image apart
        problems.append(f"eval's top-1 {scores['top1']:.2f} % is not the logged {rows[-1]['val_top1']:.2f} %")
    if problems:
        return PhaseResult("FAIL", "; ".join(problems), details)
    waits = [r["data_wait_share"] for r in rows]
    target = f" (§9 target < 10 %: {'met' if max(waits) < 0.1 else 'not met'})" if ctx.device.type == "cuda" else ""
    return PhaseResult("PASS", (
        f"convit_small eager b{s.batch}, {loader} loader: {rows[0]['images_per_s']:.0f} and "
        f"{rows[1]['images_per_s']:.0f} img/s, data wait {waits[0]:.0%} and {waits[1]:.0%}{target}; resumed to epoch "
        f"2; eval top-1 {scores['top1']:.1f} % as logged"), details)


# %% [markdown]
# ## Running the phases under a deadline
#
# `PHASES` is the order. A phase that would begin after the budget (`--budget-s`, 480 s by default, which leaves a
# minute of the 9 for the phase running when it ends) is SKIP (deadline); a phase that raises is FAIL with its error's
# first line (the traceback goes into `results.json`), and the check goes on. `--phases` runs some again, e.g. those a
# deadline skipped. Exit status: 0 when no phase failed, 1 when one did, 2 for bad arguments.

# %%
#| export
PHASES: dict[str, Callable[[CheckContext], PhaseResult]] = {
    "env": check_env, "step_vs_cpu": check_step_vs_cpu, "gpsa": check_gpsa, "graph_breaks": check_graph_breaks,
    "host_syncs": check_host_syncs, "compiled_train": check_compiled_train, "throughput_s": check_throughput_small,
    "jpeg_torchvision": functools.partial(check_jpeg_runs, loader="torchvision"),
    "jpeg_gpu_decode": functools.partial(check_jpeg_runs, loader="gpu-decode"),
    "throughput_ti": lambda ctx: _throughput(ctx, "convit_tiny", "deit_tiny", sweep=ctx.sizes.sweep_batches)}


def run_phase(name: str, phase: Callable[[CheckContext], PhaseResult], ctx: CheckContext) -> PhaseResult:
    """`phase(ctx)`, named and timed; an exception becomes a FAIL with its first line (the traceback in its details)."""
    start = time.perf_counter()
    try:
        result = phase(ctx)
    except Exception as e:  # one failure must not lose the phases after it
        first = (str(e).strip().splitlines() or [""])[0]
        result = PhaseResult("FAIL", f"{type(e).__name__}: {first}", {"traceback": traceback.format_exc()[-4000:]})
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return replace(result, name=name, seconds=time.perf_counter() - start)


def summary_text(ctx: CheckContext, results: list[PhaseResult]) -> str:
    env, counts = ctx.environment, Counter(r.status for r in results)
    head = (f"convit-edu GPU check ({ctx.sizes.mode}) on {env['gpu'] or 'the CPU: ' + str(env['cpu_model'])}, torch "
            f"{env['torch']}, {env['date_utc']}: {ctx.budget_s - ctx.seconds_left():.0f} s of a {ctx.budget_s:g} s "
            "budget")
    tail = ", ".join(f"{n} {status}" for status, n in counts.items()) + f": exit status {int('FAIL' in counts)}"
    return "\n".join([head, *(r.line() for r in results), tail]) + "\n"


def run_check(ctx: CheckContext, phases: dict[str, Callable[[CheckContext], PhaseResult]],
              output: Path) -> list[PhaseResult]:
    """Run `phases` in order under `ctx`'s budget, printing each one's line as it ends and writing `results.json` and
    `summary.txt` after each (atomically); then print the summary."""
    results = []
    for name, phase in phases.items():
        if ctx.seconds_left() <= 0:
            result = PhaseResult("SKIP", f"deadline: the {ctx.budget_s:g} s budget was spent before it began",
                                 name=name)
        else:
            result = run_phase(name, phase, ctx)
        results.append(result)
        print(result.line(), flush=True)
        write_json(output / "results.json", {
            "check": "convit-edu-check-gpu", "mode": ctx.sizes.mode, "budget_s": ctx.budget_s,
            "finished": len(results) == len(phases), "exit_status": int(any(r.status == "FAIL" for r in results)),
            "environment": ctx.environment, "sizes": asdict(ctx.sizes), "phases": [asdict(r) for r in results]})
        atomic_write(output / "summary.txt", lambda f: f.write(summary_text(ctx, results).encode()))
    print("\n" + summary_text(ctx, results), end="")
    return results


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line for the user, not the usage and an exit
        raise ValueError(message)


def main(argv: list[str] | None = None) -> int:
    """The `convit-edu-check-gpu` console script: 0 when no phase failed, 1 when one did, 2 for bad arguments."""
    parser = _Parser(prog="convit-edu-check-gpu", description="Is this GPU set up right, and how fast does it train? "
                     "Run it from the repository root; it needs no network.")
    parser.add_argument("--smoke", action="store_true", help="the same phases at toy size on the CPU")
    parser.add_argument("--budget-s", type=float, default=480.0, metavar="S",
                        help="no phase begins after S seconds (default: 480)")
    parser.add_argument("--output", type=Path, metavar="DIR",
                        help="results folder (default: nbs/results/gpu/<UTC time>-<GPU name>)")
    parser.add_argument("--phases", nargs="+", choices=list(PHASES), metavar="NAME",
                        help=f"run only these phases (and env): {', '.join(PHASES)}")
    try:
        args = parser.parse_args(argv)
        budget = number("--budget-s", args.budget_s, 0, open_low=True)
        environment = collect_environment()
        gpu = re.sub(r"[^a-z0-9]+", "-", (environment["gpu"] or "cpu").lower()).strip("-")
        output = args.output or Path("nbs/results/gpu") / f"{time.strftime('%Y-%m-%dT%H%MZ', time.gmtime())}-{gpu}"
        check_output(output)
    except ValueError as e:
        print(f"convit-edu-check-gpu: error: {e}", file=sys.stderr)
        return 2
    phases = {n: p for n, p in PHASES.items() if n == "env" or not args.phases or n in args.phases}
    with tempfile.TemporaryDirectory(prefix="convit-edu-gpu-check-") as work:
        ctx = CheckContext(CheckSizes.smoke() if args.smoke else CheckSizes.full(), Path(work), environment, budget)
        results = run_check(ctx, phases, output)
    print(f"results: {output / 'results.json'}")
    return int(any(r.status == "FAIL" for r in results))


if __name__ == "__main__" and Path(sys.argv[0]).name == "gpu_check.py":  # `python -m convit_edu.gpu_check`
    sys.exit(main())


# %% [markdown]
# ## The smoke check, here
#
# A student's laptop has no GPU, so the chapter runs `--smoke`: every phase at toy size on the CPU (in FAST mode, as in
# CI, only the quick ones; `tests/test_gpu_check.py` runs them all). The timings depend on the machine; which phases
# pass does not.

# %%
smoke_dir = Path(tempfile.mkdtemp()) / "smoke"
quick = ["--phases", "step_vs_cpu", "gpsa", "host_syncs", "throughput_s"] if FAST else []
with contextlib.redirect_stdout(io.StringIO()):
    status = main(["--smoke", "--output", str(smoke_dir), *quick])
plt.close("all")  # the training runs' curves, which a notebook would otherwise show
smoke = json.loads((smoke_dir / "results.json").read_text())

# %%
# NBVAL_IGNORE_OUTPUT
print((smoke_dir / "summary.txt").read_text())

# %%
assert status == 0 and smoke["finished"] and all(p["status"] in ("PASS", "INFO", "SKIP") for p in smoke["phases"])
step = {(r["model"], r["precision"]): r for r in smoke["phases"][1]["details"]["rows"]}
assert step["convit_tiny", "fp32"]["loss_rel"] == 0 and 0 < step["convit_tiny", "bf16"]["loss_rel"] < 2e-2
print("every phase passed, measured or was skipped; on the CPU, bf16's step differs from fp32's, within 2e-2")
print("host_syncs:", next(p["summary"] for p in smoke["phases"] if p["name"] == "host_syncs"))

# %% [markdown]
# The budget at work, and bad input: a budget spent before a phase begins skips it; a budget that is not a positive
# number, or an output folder that cannot be written, is one line naming the value, before any work.

# %%
with contextlib.redirect_stdout(io.StringIO()):
    main(["--smoke", "--budget-s", "1e-9", "--phases", "gpsa", "--output", str(smoke_dir / "late")])
print([(p["name"], p["status"], p["summary"]) for p in json.loads((smoke_dir / "late/results.json").read_text())[
    "phases"]])
for argv in (["--budget-s", "-5"], ["--budget-s", "soon"], ["--output", str(smoke_dir / "summary.txt" / "x")]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["--smoke", *argv]) == 2
    print(err.getvalue().strip().replace(str(smoke_dir), "TMP"))

# %% [markdown]
# ## Results measured on GPUs
#
# A GPU owner runs `convit-edu-check-gpu` from the repository root and commits the folder it writes under
# `nbs/results/gpu/` (see its `README.md`). This cell shows every committed summary.

# %%
committed = sorted(Path("results/gpu").glob("*/results.json"))
for path in committed:
    print((path.parent / "summary.txt").read_text())
if not committed:
    print("No GPU results are committed yet: no GPU figure of this course has been measured so far.")
