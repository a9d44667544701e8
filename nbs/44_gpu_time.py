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
# # The GPU check, part 2: where a training step's time goes, the GPU's or the host's
#
# A GPU runs what the host (the CPU running Python) queues for it: each kernel is *launched* by the host, which then
# goes on to launch the next while the GPU computes. When the host needs longer to launch a step's kernels than the
# GPU needs to run them, the GPU waits and the step's time is the host's. The first GPU check (one H200, 2026-11-27,
# `nbs/results/gpu/`) measured exactly that without saying so: at batch 256, compiled, DeiT-Ti took 30.8 ms a step
# and DeiT-S 31.3 ms, with 3.7 times the FLOPs; ConViT-Ti 44.5 ms and ConViT-S 51.0 ms. When the GPU sets the pace,
# a Ti model trains two to two and a half times as fast as its S. So ConViT-S / DeiT-S = 0.61 there was a ratio of
# launch counts (`../shared/docs/reviews/gpu-results-reading.md` §1).
#
# This chapter builds what tells the two apart, per model: a step timed four ways (each step waited for; steps back to
# back; the host's issuing alone; steps replayed from a **CUDA graph**, which launches a whole step at once), what the
# GPU did according to `torch.profiler` (kernels, launches, the share of the time it was busy), and the arithmetic a
# step needs against what the GPU can do at most (MFU). The next chapter (`44_gpu_training`) trains with the real loop;
# chapter 45 runs all of it in one command.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpu_check_time
# The GPU check's measurements of a training step: timed four ways (synchronised, pipelined, the host's issue, replayed
# from a CUDA graph), profiled (kernels, launches, the GPU's busy share), its FLOPs and MFU.

# %%
import tempfile

from convit_edu.gpu_check_correctness import CheckSizes, collect_environment

# %% [markdown]
# ## Four clocks on one step
#
# `step_timings` times a step (a closure: chapter 31's `train_step`, say) after one warm-up:
#
# * **synchronised**: each step waited for before the next begins (`device_timer`, chapter 30), the median. The host's
#   issuing and the GPU's running are then in series: this is what the H200 run measured.
# * **pipelined**: the steps issued back to back and waited for once at the end. The slower of host and GPU sets the
#   pace, as in training, where the host waits only to read the losses back (chapter 28).
# * **host**: the issuing of those back-to-back steps alone, before the final wait. The host runs ahead of the GPU
#   until CUDA's queue of launches is full; when `host` is close to `pipelined`, the host sets the pace.
#
# The fourth clock is the same three on a step replayed from a CUDA graph (below): its host issues one launch a step,
# so its pipelined time is the GPU's. On a CPU the three are one: an operation is done when it returns.

# %%
#| export
import copy
import functools
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.flop_counter import FlopCounterMode

from convit_edu.benchmark_suite import compile_seconds, peak_matmul_flops
from convit_edu.benchmarks import count_operations, device_timer, interleaved_times, median, train_step
from convit_edu.config import TrainConfig
from convit_edu.cuda_graphs import StepGraph, fill, graph_ready
from convit_edu.devices import autocast
from convit_edu.gpu_check_correctness import CheckContext, PhaseResult
from convit_edu.optimisation import build_optimizer
from convit_edu.zoo import count_macs


def step_timings(step: Callable[[], object], steps: int, device: torch.device) -> dict:
    """Seconds a step of `step`, after one warm-up: `synchronised_s` (each step waited for; the median),
    `pipelined_s` (`steps` steps back to back, waited for once), `host_s` (issuing those steps, before the wait)."""
    timer = device_timer(device)
    synchronised = interleaved_times({"step": step}, reps=steps, warmup=1, timer=timer)["step"]
    start = timer()
    for _ in range(steps):
        step()
    issued = time.perf_counter()
    end = timer()
    return {"synchronised_s": median(synchronised), "pipelined_s": (end - start) / steps,
            "host_s": (issued - start) / steps}


# %% [markdown]
# ## A step replayed from a CUDA graph
#
# A **CUDA graph** records the kernels a piece of code launches on a stream (the *capture*, during which nothing runs)
# and launches them all again with one call (`replay`), with the same arguments: the same memory, read and written
# again. The host's cost of a step then no longer grows with its kernels. So the inputs must stay where the capture
# found them (the step reads fixed images here), the captured code may not wait for the GPU (no host synchronisation),
# and what it allocates comes from the graph's own memory pool, kept for its replays; torch's notes on CUDA graphs warm
# the code up on a side stream first, so that lazy work (here: `torch.compile`'s compile, autograd's first backward)
# happens before the capture.
#
# `graphed_train_step` is chapter 31's `train_step` replayed **whole** from a graph, as training replays its step: the
# forward (compiled, when asked), the backward and the optimiser in chapter 28's `StepGraph`, with the AdamW a graph can
# hold (`build_optimizer(..., graphed=True)`: fused, its step counts and its rate tensors on the device, `graph_ready`)
# and the rate written into that tensor before each replay (`fill`), as `TrainStep` does. So the check times the
# graph a run with `--cuda-graphs` would replay, not a graph of its own. On a CPU, `StepGraph`'s stand-in runs the step
# at every call under the capture's rules (chapter 28), and the step's bookkeeping is checked here against
# `train_step`'s.

# %%
#| export
def graphed_train_step(model: nn.Module, batch: int, img_size: int, num_classes: int, precision: str,
                       device: torch.device, compile: bool = False) -> Callable[[], None]:
    """`train_step`'s step (chapter 31: fixed random images, cross-entropy, the optimiser and rate `build_optimizer`
    makes) replayed from a CUDA graph as training replays it (`StepGraph`: forward of `torch.compile(model)` with
    `compile`, backward and the graph's AdamW, its rate `fill`ed before each call; the stand-in off CUDA); bf16 or fp32
    (fp16's gradient scaler reads the gradients back: not in a graph)."""
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"a graphed step runs in bf16 or fp32, not {precision!r} (fp16's scaler syncs with the host)")
    x = torch.randn(batch, 3, img_size, img_size, device=device)
    y = torch.randint(0, num_classes, (batch,), device=device)
    forward = torch.compile(model) if compile else model
    optimizer, schedule = build_optimizer(TrainConfig(), model, batch, steps_per_epoch=1, device=device, graphed=True)
    graph_ready(optimizer, device)

    def body(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with autocast(device, precision):
            out = forward(images)
            loss = F.cross_entropy(out[0] if isinstance(out, tuple) else out, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    graph = StepGraph(body, device)
    model.train()

    def step() -> None:
        fill([group["lr"] for group in optimizer.param_groups], schedule.rates(0))  # as train sets each step's rate
        graph(x, y)

    return step


# %% [markdown]
# ## What the GPU did: the profiler's trace
#
# `torch.profiler` with CUDA activity records every kernel, copy and fill the GPU ran (from CUPTI, kernels replayed from
# a graph included) and every launch call the host made, on one clock. `profile_activity` profiles a few steps inside
# a mark (`STEPS_MARK`, which ends after a final wait) and exports the trace; `trace_activity` reads it: per step, the
# kernels, copies and fills, the launch calls (`cudaGraphLaunch` among them), the operators the host ran, and the
# **busy share** — the time the GPU ran anything (the union of its intervals, overlaps counted once) over the
# mark's time. A share well below 1 is a GPU waiting for its host. On a CPU the trace holds the host's operators only:
# no device work, so no busy share.

# %%
#| export
STEPS_MARK = "convit_edu.steps"
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # the trace's categories of what runs on the GPU
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
            "cudaMemcpyAsync", "cudaMemsetAsync")  # the host's calls that queue GPU work


def _busy_us(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Microseconds of [start, end] that the union of `intervals` covers."""
    busy, covered = 0.0, start
    for a, b in sorted(intervals):
        lo, hi = max(a, covered), min(b, end)
        if hi > lo:
            busy, covered = busy + hi - lo, hi
    return busy


def trace_activity(trace: dict, steps: int) -> dict:
    """Per step of a Chrome trace that `profile_activity` wrote (times in µs): GPU kernels, copies, fills and their
    busy share of the `STEPS_MARK` window; the host's launch calls (graph launches apart) and operators; the kernels
    that took most of the GPU's time."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    marks = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == STEPS_MARK]
    if len(marks) != 1:
        raise ValueError(f"the trace holds {len(marks)} {STEPS_MARK!r} marks, not one: profile with profile_activity")
    start, end = marks[0]["ts"], marks[0]["ts"] + marks[0]["dur"]
    work = [e for e in events if e.get("cat") in DEVICE_WORK and e["ts"] < end and e["ts"] + e["dur"] > start]
    kinds = Counter(e["cat"] for e in work)
    launches = Counter(e["name"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                       and e["name"] in LAUNCHES)
    kernel_us = Counter()
    for e in work:
        kernel_us[e["name"]] += e["dur"] if e["cat"] == "kernel" else 0
    busy = _busy_us([(e["ts"], e["ts"] + e["dur"]) for e in work], start, end)
    return {"kernels": kinds["kernel"] / steps, "memcpys": kinds["gpu_memcpy"] / steps,
            "memsets": kinds["gpu_memset"] / steps, "launches": sum(launches.values()) / steps,
            "graph_launches": launches["cudaGraphLaunch"] / steps,
            "host_ops": sum(e.get("cat") == "cpu_op" for e in events) / steps,
            "wall_ms": (end - start) / 1e3 / steps, "gpu_ms": busy / 1e3 / steps if work else None,
            "busy_share": busy / (end - start) if work else None,
            "top_kernels": [(name[:120], us / 1e3 / steps) for name, us in kernel_us.most_common(8) if us]}


def profile_activity(step: Callable[[], object], steps: int, device: torch.device) -> dict:
    """`trace_activity` of `steps` steps of `step`, profiled with the host's and (on a GPU) CUDA's activity."""
    timer = device_timer(device)
    timer()  # nothing of earlier steps still queued
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        with record_function(STEPS_MARK):
            for _ in range(steps):
                step()
            timer()
    with tempfile.TemporaryDirectory(prefix="convit-edu-trace-") as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        return trace_activity(json.loads(path.read_text()), steps)


# %% [markdown]
# ## FLOPs, and the share of the peak (MFU)
#
# **MFU** (model FLOPs utilisation) is the arithmetic a training step needs over the time it took, as a share of the
# most the GPU can do: its bf16 dense tensor-core peak from NVIDIA's datasheets (989 TFLOP/s for an H100 SXM or an
# H200; half the figures with sparsity that the sheets print first). `training_flops` counts a step's FLOPs with
# `FlopCounterMode` over a forward and backward, as the model computes them (the fast GPSA's product with the
# positional attention P included, chapter 07). Fused attention (SDPA) is the counter's blind spot: it counts nothing
# for it on a CPU and something on a GPU (DESIGN §6), so whatever it counts there is taken out, and the attention is
# added from chapter 10's `count_macs` (Q·Kᵀ and A·V, 2 FLOPs a multiply-add, × 3: the forward, and the backward's two
# products of each). For an unlisted GPU, and on a CPU, the peak is what one large bf16 matmul reaches
# (`peak_matmul_flops`, chapter 41), and the report says so.

# %%
#| export
BF16_DENSE_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H200 NVL": 835.0, "H100": 989.0, "H200": 989.0,
                     "A100": 312.0}  # NVIDIA's datasheets; the first name a GPU's name contains counts


def training_flops(model: nn.Module, images: torch.Tensor, attention_macs: float, precision: str = "fp32") -> dict:
    """FLOPs per image of a forward and backward of `model` on `images` under `precision`'s autocast: `counted` by
    `FlopCounterMode` (fused attention left out), `attention` from its forward multiply-adds per image (×2 FLOPs ×3
    passes), and their `total`."""
    with FlopCounterMode(display=False) as counter, autocast(images.device, precision):
        out = model(images)
        (out[0] if isinstance(out, tuple) else out).float().sum().backward()
    model.zero_grad(set_to_none=True)
    ops = counter.get_flop_counts().get("Global", {})
    counted = sum(n for op, n in ops.items() if "attention" not in str(op)) / len(images)
    return {"counted": counted, "attention": 6 * attention_macs, "total": counted + 6 * attention_macs}


def bf16_peak(ctx: CheckContext) -> dict:
    """The GPU's bf16 dense peak in FLOP/s, from `BF16_DENSE_TFLOPS` by its name or else measured (one square bf16
    matmul of side `matmul_n`, the best of 5), with where it came from; the measured one beside it."""
    gpu = ctx.environment["gpu"] or ""
    measured = peak_matmul_flops(ctx.sizes.matmul_n, 5, torch.bfloat16, ctx.device)
    listed = next((name for name in BF16_DENSE_TFLOPS if name in gpu), None)
    if listed is None:
        return {"flops": measured, "source": f"measured: {ctx.sizes.matmul_n}² bf16 matmul", "measured": measured}
    return {"flops": BF16_DENSE_TFLOPS[listed] * 1e12, "source": f"datasheet: {listed}", "measured": measured}


# %% [markdown]
# ## The model phases
#
# `model_bench` measures one zoo model at the check's sizes and precision, batch 256 and 224 px on a GPU: its FLOPs; the
# CPU's count of its training step's operations, as chapter 31's `step_operations` counts them, on a CPU copy of it at
# batch 2 (the count depends on neither batch, grid nor width): the proxy chapters 07_operation_counts and 31 set their
# launch targets on, beside the kernels the GPU really ran (its forward and backward, that is: a CPU's AdamW runs ten
# operations a parameter, a GPU's fused one a few launches in all); then three steps, each timed (`step_timings`) and
# profiled: **eager**; **compiled** (`torch.compile`, with what the compile took: chapter 41's `compile_seconds`);
# **graphed** (the compiled step replayed whole from a CUDA graph, `graphed_train_step`). Images/s and MFU come from the
# pipelined time. `check_models` runs a ConViT and its DeiT and gives their ratios; on a CPU (no compile in the smoke),
# the graphed step is `StepGraph`'s stand-in. A step that fails (a graph that cannot be captured, say) is a FAIL naming
# it, and the steps measured before it are kept.

# %%
#| export
def _measured(step: Callable[[], object], ctx: CheckContext, batch: int, flops: float, peak: float) -> dict:
    found = {**step_timings(step, ctx.sizes.steps, ctx.device), **profile_activity(step, ctx.sizes.profiled, ctx.device)}
    rate = batch / found["pipelined_s"]
    return {**found, "images_per_s": rate, "mfu": flops * rate / peak}


def model_bench(ctx: CheckContext, name: str, peak: dict) -> dict:
    """Zoo model `name` at the check's sizes: FLOPs per image, the CPU's count of its training step's operations, and
    its eager, compiled and graphed training steps measured; a step that fails is named in `error`, and ends the row."""
    s, device, precision = ctx.sizes, ctx.device, ctx.precision
    model = s.model(name, drop_path_rate=0.1).to(device)
    cpu_step = train_step(copy.deepcopy(model).cpu(), 2, s.img_size, s.num_classes, "bf16")
    cpu_step()  # the first step makes the optimiser's state (as chapter 31's step_operations)
    ops = count_operations(cpu_step)
    images = torch.randn(1, 3, s.img_size, s.img_size, device=device)
    flops = training_flops(model, images, count_macs(model.config).attention, precision)
    row = {"model": name, "batch": s.batch, "precision": precision, "flops_per_image": flops, "peak": peak,
           "cpu_operations": {phase: ops.total(phase) for phase in ("forward", "backward", "optimizer")}}
    steps_of = functools.partial(train_step, model, s.batch, s.img_size, s.num_classes, precision, device)

    def compiled() -> Callable[[], None]:
        step = steps_of(compile=True)
        row["compile_s"] = compile_seconds({"train": steps_of()}, {"train": step}, device_timer(device))
        return step

    variants = {"eager": steps_of, **({"compiled": compiled} if s.compile else {}),
                "graphed": lambda: graphed_train_step(model, s.batch, s.img_size, s.num_classes, precision, device,
                                                      s.compile)}
    for variant, make in variants.items():
        try:
            row[variant] = _measured(make(), ctx, s.batch, flops["total"], peak["flops"])
        except Exception as e:  # a step that cannot be measured: named, the ones before it kept
            row["error"] = f"{variant}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
            break
    return row


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f} ms"


def _step_line(row: dict, variant: str) -> str:
    m = row[variant]
    busy = "" if m["busy_share"] is None else f", GPU busy {m['busy_share']:.0%}"
    return (f"{variant} {_ms(m['pipelined_s'])} ({_ms(m['synchronised_s'])} synchronised, host {_ms(m['host_s'])}; "
            f"{m['launches']:.0f} launches, {m['kernels']:.0f} kernels{busy})")


def _model_line(row: dict) -> str:
    graphed = row.get("graphed")
    head = row["model"] + (f" {graphed['images_per_s']:.0f} img/s graphed, MFU {graphed['mfu']:.0%}" if graphed else "")
    ops = row["cpu_operations"]
    failed = f"; FAILED {row['error']}" if "error" in row else ""
    return (head + ": " + "; ".join(_step_line(row, v) for v in ("graphed", "compiled", "eager") if v in row)
            + f"; CPU proxy {ops['forward'] + ops['backward']} forward and backward operations{failed}")


def check_models(ctx: CheckContext, convit: str, deit: str) -> PhaseResult:
    peak = bf16_peak(ctx)
    rows = [model_bench(ctx, name, peak) for name in (convit, deit)]
    ratios = {v: rows[0][v]["images_per_s"] / rows[1][v]["images_per_s"] for v in ("eager", "compiled", "graphed")
              if all(v in r for r in rows)}
    summary = (f"{ctx.precision} b{ctx.sizes.batch}, peak {peak['flops'] / 1e12:.3g} TFLOP/s ({peak['source']}): "
               + " | ".join(_model_line(r) for r in rows) + "; ConViT/DeiT "
               + ", ".join(f"{v} {x:.2f}×" for v, x in ratios.items()))
    return PhaseResult("FAIL" if any("error" in r for r in rows) else "INFO", summary,
                       {"rows": rows, "ratios": ratios, "peak": peak})


# %% [markdown]
# ## Here, on a CPU
#
# The graphed step's bookkeeping, with `StepGraph`'s stand-in for the graph: five steps (three eager, the capture, a
# replay) from the same seed train the model to the weights five of `train_step`'s reach, to 1e-8 (the graph's AdamW
# is the fused one, whose roundings differ from the default's), where four of them are 1e-6 away (the warm-up's first
# rate, 1e-6, is the rate of every step here).

# %%
def trained(make_step: Callable[[nn.Module], Callable[[], None]], steps: int = 5) -> torch.Tensor:
    torch.manual_seed(0)
    model = ctx.sizes.model("convit_tiny", drop_path_rate=0.1)
    step = make_step(model)
    for _ in range(steps):
        step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


ctx = CheckContext(CheckSizes.smoke(), Path(tempfile.mkdtemp()), collect_environment(), budget_s=480)
sizes = (8, ctx.sizes.img_size, ctx.sizes.num_classes, "bf16", torch.device("cpu"))
plain = trained(lambda model: train_step(model, *sizes))
replayed = trained(lambda model: graphed_train_step(model, *sizes))
one_fewer = trained(lambda model: train_step(model, *sizes), 4)
assert (plain - replayed).abs().max() < 1e-8 < 1e-7 < (plain - one_fewer).abs().max()
print("5 graphed steps = 5 of train_step's, to 1e-8 (4 of them: 1e-7 away at least)")

# %% [markdown]
# A trace, made up so that its numbers can be checked by hand: a 1 ms mark over 2 steps; three kernels, two of them
# overlapping (100–300 and 250–400 µs) and one running past the mark's end (900–1 100 µs); a copy (500–600 µs); four
# kernel launches, one graph launch and a copy's launch. The GPU was busy 300 + 100 + 100 µs of the 1 000: a half.

# %%
def event(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


made_up = {"traceEvents": [
    event("user_annotation", STEPS_MARK, 0, 1000), event("cpu_op", "aten::mm", 10, 50),
    event("kernel", "gemm", 100, 200), event("kernel", "softmax", 250, 150), event("kernel", "gemm", 900, 200),
    event("gpu_memcpy", "Memcpy HtoD", 500, 100), *(event("cuda_runtime", "cudaLaunchKernel", t, 5) for t in (1, 2, 3)),
    event("cuda_driver", "cuLaunchKernel", 4, 5), event("cuda_runtime", "cudaGraphLaunch", 6, 5),
    event("cuda_runtime", "cudaMemcpyAsync", 7, 5), event("cuda_runtime", "cudaStreamSynchronize", 8, 900)]}
found = trace_activity(made_up, steps=2)
print({k: v for k, v in found.items() if k != "top_kernels"}, found["top_kernels"])
assert found["busy_share"] == 0.5 and found["kernels"] == 1.5 and found["memcpys"] == 0.5
assert found["launches"] == 3 and found["graph_launches"] == 0.5 and found["top_kernels"][0] == ("gemm", 0.2)

# %% [markdown]
# The same reading of a real profile of two CPU steps: the host's operators, and no device work. (The profiler's
# library writes a few lines of its own, with the time, where a notebook shows them.)

# %%
# NBVAL_IGNORE_OUTPUT
cpu_profile = profile_activity(train_step(ctx.sizes.model("deit_tiny", 0.1), *sizes), 2, torch.device("cpu"))

# %%
assert cpu_profile["kernels"] == 0 and cpu_profile["busy_share"] is None and cpu_profile["host_ops"] > 100
print(f"on the CPU: no kernels, no busy share; more than 100 host operators a step")

# %% [markdown]
# FLOPs by hand: a linear layer of 4 inputs and 3 outputs on 2 images costs 2·2·4·3 = 48 FLOPs forward and 48 for its
# weight's gradient (the images need none): 48 an image. With 10 multiply-adds of attention an image, 6 · 10 = 60
# more. Fused attention that the counter does count (here on the meta device, where torch runs no arithmetic) is left
# out: a layer that calls the memory-efficient SDPA kernel directly adds nothing to `counted`.

# %%
linear = training_flops(nn.Linear(4, 3), torch.randn(2, 4), attention_macs=10)
print(linear)
assert linear == {"counted": 48, "attention": 60, "total": 108}


class FusedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(1, 16, 3, 2, 4).permute(2, 0, 3, 1, 4)
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[0]


fused = training_flops(FusedAttention().to("meta"), torch.randn(1, 16, 8, device="meta"), attention_macs=0)
assert fused["counted"] == 2 * 2 * 16 * 8 * 24  # the projection's forward and its weight's gradient
print(f"fused attention counted by the counter, left out: {fused['counted']:.0f} FLOPs are the projection's")

# %% [markdown]
# The model phase at the smoke sizes: ConViT-S and DeiT-S, cut to 2 blocks of width 36, eager and with the stand-in
# graph (no compile on a CPU).

# %%
# NBVAL_IGNORE_OUTPUT
models = check_models(ctx, "convit_small", "deit_small")
print(models.summary)

# %%
rows = {r["model"]: r for r in models.details["rows"]}
assert models.status == "INFO" and set(models.details["ratios"]) == {"eager", "graphed"}
assert rows["deit_small"]["peak"]["source"].startswith("measured") and rows["deit_small"]["graphed"]["kernels"] == 0
flops = {name: r["flops_per_image"] for name, r in rows.items()}
assert all(f["attention"] > 0 and f["total"] == f["counted"] + f["attention"] for f in flops.values())
ops = {name: r["cpu_operations"]["forward"] + r["cpu_operations"]["backward"] for name, r in rows.items()}
assert ops["convit_small"] > ops["deit_small"]
print("ConViT/DeiT measured eager and graphed (the CPU's stand-in); FLOPs are the counter's plus the attention's;")
print(f"the CPU proxy: ConViT-S runs {ops['convit_small'] / ops['deit_small']:.2f}× DeiT-S's forward and backward operations")
