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
# # The GPU check, part 1: is this GPU set up right?
#
# Everything before this chapter was written and tested on CPUs. A GPU runs the same code with other kernels, other
# rounding, asynchronous execution and a data pipeline that must keep up, so the GPU path is *measured*, not assumed.
# One command does it, on a new GPU machine with no network, from the repository root: `convit-edu check-gpu` (or
# `convit-edu-check-gpu`, `python -m convit_edu.gpu_check`). It runs **phases** in order of information per second —
# the environment, correctness, what a training step costs the GPU and the host, the real `convit-edu train` and
# `eval` on JPEGs with a resume — under one time budget, each with the seconds it is predicted to take, and writes
# `results.json` and `summary.txt` after every phase, so a machine taken away mid-run loses nothing. `--smoke` runs
# the same phases at toy size on a CPU in a minute or two; CI runs it, so the check does not rot.
#
# This chapter builds the phases, their results, the deadline they run under and the report of DESIGN §9's targets,
# and the phases that ask whether the GPU computes what the CPU does: the environment, a training step against the
# CPU's, the fast GPSA against the reference. The next chapter (`44_gpu_time`) asks where a training step's time goes,
# the GPU's or the host's, and whether a step replayed from a CUDA graph trains as the eager one does; chapter 45 asks
# how fast `convit-edu train` trains, and builds the command that runs every phase.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpu_check_correctness
# The GPU check's machinery (sizes, phases and their results, a deadline) and its correctness phases: the environment,
# a training step on the GPU against the CPU's, the fast GPSA against the reference.

# %%
import contextlib
import io
import json
import tempfile

# %% [markdown]
# ## Sizes, phases and their results
#
# `CheckSizes.full()` is the GPU's work, at the setting of DESIGN §9's targets (224 px, bf16, batch 256, the paper's
# models). `CheckSizes.smoke()` is the same work on a CPU: every model cut to 2 blocks of width 36, 32-px images, a few
# dozen. A phase (`Phase`) is a function of a `CheckContext` (sizes, a scratch folder, the environment, the budget's
# clock) that returns a `PhaseResult` — PASS or FAIL for a claim, INFO for a measurement, SKIP with its reason — and
# the seconds it is predicted to take at each size. A `Verdict` holds one of §9's targets against what was measured.

# %%
#| export
import contextlib
import gc
import importlib.metadata
import os
import shutil
import subprocess
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from convit_edu.files import write_json, write_text
from convit_edu.checks import one_of
from convit_edu.config import TrainConfig
from convit_edu.dali import dali_available
from convit_edu.devices import autocast, resolve_precision
from convit_edu.gpsa import GPSA
from convit_edu.gpsa_reference import GPSAReference
from convit_edu.optimisation import train_loss
from convit_edu.run_records import versions
from convit_edu.zoo import create_model, model_config

STATUSES = ("PASS", "FAIL", "INFO", "SKIP")


@dataclass(frozen=True)
class CheckSizes:
    """How much work each phase does: `full()` on one GPU, `smoke()` the same phases on a CPU in a minute or two."""

    mode: str
    device: str
    img_size: int
    num_classes: int  # of every model, and the classes of the JPEG folder
    shrink: dict  # ModelConfig overrides of every model ({}: the zoo's sizes)
    models: tuple  # the models whose training step is compared with the CPU's, and which Dynamo traces
    step_batch: int  # the training step compared with the CPU's (GPSA layers: twice; graphed training: 4 times)
    batch: int  # the training runs and the step measurements (the host-sync run: a quarter of it)
    steps: int  # timed steps of each step measurement; optimiser steps per epoch of a run on synthetic images
    profiled: int  # steps under the profiler
    jpegs: tuple  # training and validation JPEGs per class, width, height
    workers: int | None  # loader processes (None: the loader's default, the CPUs less one)
    compile: bool  # on a CPU, Inductor's C++ build of even a 2-block model takes ~50 s: too long for a smoke test
    log_every: int  # a progress line every this many steps in the JPEG runs (the data wait is read per line)
    matmul_n: int  # side of the square bf16 matmul that measures the peak a GPU reaches

    @classmethod
    def full(cls) -> "CheckSizes":
        return cls("full", "cuda", 224, 100, {}, ("convit_tiny", "deit_tiny", "convit_small"), step_batch=8,
                   batch=256, steps=20, profiled=3, jpegs=(80, 10, 500, 375), workers=None, compile=True,
                   log_every=10, matmul_n=8192)

    @classmethod
    def smoke(cls) -> "CheckSizes":
        return cls("smoke", "cpu", 32, 4, {"depth": 2, "patch_size": 8, "embed_dim": 36}, ("convit_tiny", "deit_tiny"),
                   step_batch=2, batch=8, steps=1, profiled=1, jpegs=(8, 2, 64, 48), workers=1, compile=False,
                   log_every=1, matmul_n=256)

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
    """What a phase found: `status` (PASS, FAIL, INFO: a measurement, SKIP), one line of key numbers or the reason;
    the seconds it took and was predicted to take."""

    status: str
    summary: str
    details: dict = field(default_factory=dict)
    name: str = ""
    seconds: float = 0.0
    predicted_s: float = 0.0

    def __post_init__(self) -> None:
        one_of("phase status", self.status, STATUSES)

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<16} {self.seconds:6.1f} s ({self.predicted_s:.0f} predicted)  {self.summary}"


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


@dataclass(frozen=True)
class Phase:
    """A phase of the check: `run(ctx)`, and the seconds it is predicted to take at full size on one H100 or H200
    (`full_s`: estimates from the H200 run of 2026-11-27, compiles included) and at smoke size on a 2-core CPU."""

    run: Callable[[CheckContext], PhaseResult]
    full_s: float = 0.0
    smoke_s: float = 0.0

    def predicted_s(self, sizes: CheckSizes) -> float:
        return self.full_s if sizes.mode == "full" else self.smoke_s


@dataclass(frozen=True)
class Verdict:
    """One of DESIGN §9's targets against what the check measured: PASS or FAIL on a GPU, INFO at the smoke's toy
    sizes on a CPU (which the targets are not for), SKIP when no phase measured it."""

    target: str
    status: str
    measured: str  # the value, as shown

    def __post_init__(self) -> None:
        one_of("verdict status", self.status, STATUSES)

    def line(self) -> str:
        return f"{self.status:<4}  {self.target}: {self.measured}"


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
# The fast GPSA (chapter 07) is compared with the reference (chapter 05) on the GPU as `tests/gpsa_checks.py` does it:
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
# ## Running the phases under a deadline
#
# `run_check` first prints its plan (each phase's predicted seconds, their sum and the budget), then runs the phases
# in order under one budget. A phase begins only when the seconds it is predicted to take are left: otherwise it is
# SKIP (deadline), and a later, cheaper phase may still run; so is every phase after a failed `env`, for with no GPU
# in sight there is nothing to check (`--smoke` checks the phases on the CPU). A phase that raises is FAIL with its
# error's first line (the traceback goes into `results.json`), and the check goes on. Each phase's line gives the
# seconds it took and was predicted to take. After every phase it judges the targets again (`targets`, when given)
# and writes `results.json` and `summary.txt` again, atomically: a machine taken away mid-run leaves the phases that
# ended. The exit status counts failed phases; a target missed is a verdict on the speed, not on the setup.

# %%
#| export
def run_phase(name: str, phase: Phase, ctx: CheckContext) -> PhaseResult:
    """`phase.run(ctx)`, named and timed; an exception becomes a FAIL with its first line (the traceback in its
    details)."""
    start = time.perf_counter()
    try:
        result = phase.run(ctx)
    except Exception as e:  # one failure must not lose the phases after it
        first = (str(e).strip().splitlines() or [""])[0]
        result = PhaseResult("FAIL", f"{type(e).__name__}: {first}", {"traceback": traceback.format_exc()[-4000:]})
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return replace(result, name=name, seconds=time.perf_counter() - start, predicted_s=phase.predicted_s(ctx.sizes))


def summary_text(ctx: CheckContext, results: list[PhaseResult], verdicts: list[Verdict] = ()) -> str:
    env, counts = ctx.environment, Counter(r.status for r in results)
    head = (f"convit-edu GPU check ({ctx.sizes.mode}) on {env['gpu'] or 'the CPU: ' + str(env['cpu_model'])}, torch "
            f"{env['torch']}, {env['date_utc']}: {ctx.budget_s - ctx.seconds_left():.0f} s of a {ctx.budget_s:g} s "
            f"budget ({sum(r.predicted_s for r in results):.0f} s predicted for these phases)")
    targets = ["targets (DESIGN §9):", *(v.line() for v in verdicts)] if verdicts else []
    tail = ", ".join(f"{n} {status}" for status, n in counts.items()) + f": exit status {int('FAIL' in counts)}"
    return "\n".join([head, *(r.line() for r in results), *targets, tail]) + "\n"


def run_check(ctx: CheckContext, phases: dict[str, Phase], output: Path,
              targets: Callable[[CheckContext, dict[str, PhaseResult]], list[Verdict]] | None = None
              ) -> list[PhaseResult]:
    """Run `phases` in order under `ctx`'s budget, each only when its predicted seconds are left, printing the plan
    first and each phase's line as it ends; after each, judge `targets` (on the results so far, by phase name) and
    write `results.json` and `summary.txt` (atomically); then print the summary."""
    plan = {name: phase.predicted_s(ctx.sizes) for name, phase in phases.items()}
    print(f"plan ({ctx.sizes.mode}): " + ", ".join(f"{n} {s:.0f} s" for n, s in plan.items())
          + f"; {sum(plan.values()):.0f} s predicted, a {ctx.budget_s:g} s budget", flush=True)
    results, verdicts = [], []
    for name, phase in phases.items():
        no_gpu = bool(results) and results[0].name == "env" and results[0].status == "FAIL"
        left = ctx.seconds_left()
        if no_gpu or left <= 0 or left < plan[name]:
            result = PhaseResult("SKIP", "no GPU to check: env failed (--smoke runs the phases on the CPU)" if no_gpu
                                 else f"deadline: {plan[name]:.0f} s predicted, {max(left, 0):.0f} s of the "
                                      f"{ctx.budget_s:g} s budget left", name=name, predicted_s=plan[name])
        else:
            result = run_phase(name, phase, ctx)
        results.append(result)
        print(result.line(), flush=True)
        verdicts = targets(ctx, {r.name: r for r in results}) if targets else []
        write_json(output / "results.json", {
            "check": "convit-edu-check-gpu", "mode": ctx.sizes.mode, "budget_s": ctx.budget_s,
            "finished": len(results) == len(phases), "exit_status": int(any(r.status == "FAIL" for r in results)),
            "environment": ctx.environment, "sizes": asdict(ctx.sizes), "phases": [asdict(r) for r in results],
            "targets": [asdict(v) for v in verdicts]})
        write_text(output / "summary.txt", summary_text(ctx, results, verdicts))
    print("\n" + summary_text(ctx, results, verdicts), end="")
    return results


# %% [markdown]
# ## The correctness phases, here
#
# A student's laptop has no GPU, so the chapter runs these phases at the smoke sizes on the CPU, as `--smoke` does:
# there the "GPU" is the CPU itself. The timings depend on the machine; which phases pass does not. The predicted
# seconds are those of the smoke sizes on a 2-core CPU (chapter 45's `PHASES` holds the full sizes' too).

# %%
work = Path(tempfile.mkdtemp())
ctx = CheckContext(CheckSizes.smoke(), work, collect_environment(), budget_s=480)
correctness = {"env": Phase(check_env, smoke_s=1), "step_vs_cpu": Phase(check_step_vs_cpu, smoke_s=8),
               "gpsa": Phase(check_gpsa, smoke_s=3)}
with contextlib.redirect_stdout(io.StringIO()) as printed:
    results = run_check(ctx, correctness, work / "check")
saved = json.loads((work / "check/results.json").read_text())

# %%
# NBVAL_IGNORE_OUTPUT
print(printed.getvalue())

# %%
assert saved["finished"] and [r.status for r in results] == ["INFO", "PASS", "PASS"]
step = {(r["model"], r["precision"]): r for r in results[1].details["rows"]}
assert step["convit_tiny", "fp32"]["loss_rel"] == 0 and 0 < step["convit_tiny", "bf16"]["loss_rel"] < 2e-2
print("on the CPU, fp32's step is the CPU's own and bf16's differs from it, within 2e-2; the fast GPSA agrees")

# %% [markdown]
# The deadline at work, a machine without a GPU, and a phase that breaks: a phase whose predicted seconds are not left
# is skipped, and a cheaper one after it still runs; a failed `env` skips the rest (here an environment with its GPU
# taken out, at the full sizes, which are for a GPU); a phase that raises fails with its error's first line, and the
# phases after it still run.

# %%
def broken(ctx: CheckContext) -> PhaseResult:
    raise RuntimeError("the GPU caught fire\nand a second line")


def still(ctx: CheckContext) -> PhaseResult:
    return PhaseResult("PASS", "still checked")


late = CheckContext(CheckSizes.smoke(), work, ctx.environment, budget_s=30)
with contextlib.redirect_stdout(io.StringIO()):
    skipped = run_check(late, {"env": Phase(check_env, smoke_s=1), "gpsa": Phase(check_gpsa, smoke_s=60),
                               "after": Phase(still, smoke_s=1)}, work / "late")
    no_gpu = run_check(CheckContext(CheckSizes.full(), work, {**ctx.environment, "gpu": None}, budget_s=480),
                       {"env": Phase(check_env), "gpsa": Phase(check_gpsa)}, work / "no_gpu")
    failed = run_check(ctx, {"broken": Phase(broken), "after": Phase(still)}, work / "broken")
print([(r.name, r.status, r.summary.split(",")[0]) for r in skipped[1:]])  # (the seconds left vary)
print([(r.name, r.status, r.summary) for r in failed])
print([(r.name, r.status) for r in no_gpu], no_gpu[1].summary)  # (env's line names this machine's torch)
assert [r.status for r in skipped] == ["INFO", "SKIP", "PASS"] and "Traceback" in failed[0].details["traceback"]
assert [r.status for r in no_gpu] == ["FAIL", "SKIP"] and "sees no GPU" in no_gpu[0].summary
