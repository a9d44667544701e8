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
# # The training step as one graph: CUDA graphs
#
# A GPU runs what the host asks of it, one kernel launch at a time. When the host takes longer to issue a step's
# launches than the GPU takes to run them, the GPU waits, and no faster kernel helps. A **CUDA graph** records a step's
# launches once (*capture*) and replays them all with one call (*replay*): the host then issues a step in
# microseconds, whatever its number of kernels. This chapter builds the pieces that let the production step of
# chapter 28's `Trainer` (`28_training`, next) run that way — `StepGraph`, MixUp/CutMix on the device, the optimiser
# in the form a graph replays — and says what a graph demands of a step: that everything in it be **static** except
# the values in a few tensors the host rewrites before each replay. On a computer without a GPU (this one, CI) there
# is no graph; a stand-in runs the same step under the rules a capture enforces, so those rules are checked here too.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp cuda_graphs
# The training step captured once in a CUDA graph and replayed (`StepGraph`), with what that demands of it: static
# inputs, the numbers that change between steps in device tensors (MixUp/CutMix's draw, AdamW's rates), nothing read
# back; on a device without CUDA graphs, a stand-in that checks a capture's rules (`CaptureCheck`).

# %% [markdown]
# ## Why: a step paced by its launches
#
# The first GPU figures (`nbs/results/gpu/`, an H200, bf16, compiled, batch 256) gave DeiT-Ti and DeiT-S the same
# time a step although DeiT-S does 3.7 times the multiply-adds (chapter 10's `count_macs`): the step's pace was set by
# the host launching its kernels (about 960 a step for DeiT-Ti and 1,260 for ConViT-Ti, compiled, by a CPU count of
# Inductor's kernels), at tens of microseconds each on that machine, not by the GPU's arithmetic
# (`gpu-results-reading.md` §1c).

# %%
import json
from pathlib import Path

from convit_edu.zoo import count_macs, create_model

runs = [json.loads((p / "results.json").read_text()) for p in sorted(Path("results/gpu").glob("*-nvidia-h200"))]
rows = [row for run in runs for phase in run["phases"] if phase["name"] in ("throughput_ti", "throughput_s")
        for row in phase["details"]["rows"] if row["mode"] == "compiled" and row["model"].startswith("deit")]
ms = {row["model"]: 1e3 * row["batch"] / row["train_images_per_s"] for row in rows}
macs = {name: count_macs(create_model(name).config).total() for name in ms}
print(f"H200, compiled, b256: DeiT-Ti {ms['deit_tiny']:.1f} ms a step, DeiT-S {ms['deit_small']:.1f} ms, for "
      f"{macs['deit_small'] / macs['deit_tiny']:.1f}x the multiply-adds")
assert ms["deit_small"] / ms["deit_tiny"] < 1.1 and macs["deit_small"] / macs["deit_tiny"] > 3.5

# %% [markdown]
# `torch.compile` fuses operations into fewer kernels but still launches each one from the host. Its
# `mode="reduce-overhead"` replays the compiled model's forward and backward from CUDA graphs — and nothing else: the
# optimiser, the gradient clipping, the EMA, MixUp/CutMix and erasing stay eager launches around it, each paying the
# host's cost again. So this package captures the **whole step** explicitly (`torch.cuda.graph`), the
# model compiled or not: forward, backward, loss scaling, clipping, the fused AdamW, the EMA, and the batch's
# device end. One replay a step; around it only what must come from the host: the batch, the learning rate and the
# MixUp/CutMix draw.
#
# ## What a graph holds, and what must therefore be static
#
# A capture records kernels with their arguments: the *addresses* of the tensors they read and write, and every number
# the host passed. A replay runs exactly those kernels on exactly those addresses. Hence:
#
# 1. **Inputs live at fixed addresses.** Each batch is copied into the graph's own *static* buffers before the
#    replay (on the training stream, where a loader's hand-off — chapter 19's `record_stream` — already put it).
# 2. **Shapes are fixed.** A graph of batch 256 replays batch 256; every train loader of the package drops its last
#    incomplete batch, and a batch of another shape is refused by name.
# 3. **Numbers from the host are frozen.** A Python float passed to a kernel (a learning rate, MixUp's λ, a CutMix box)
#    is baked into the graph. Numbers that change between steps must live in tensors on the device, which the host
#    fills before each replay: the rate of each parameter group (torch's fused AdamW takes a tensor `lr`), and the
#    MixUp/CutMix draw (`mix_on_device`).
# 4. **No reading back.** `.item()`, `float(t)`, a boolean mask's selection (its size depends on the data) make the
#    host wait for the GPU; during a capture that is an error, or, for a CPU tensor, a value frozen at capture.
# 5. **Python runs once.** Branches, counters and lists in the step's Python run at the capture only; the replay does
#    not run them. A step that takes another path at step 1,000 than at its capture is silently wrong.
# 6. **Randomness is replayed with new numbers.** Drop path, erasing and the noise of erasing draw on the GPU from
#    the Philox generator, whose seed and offset a graph reads from the generator at each replay. `seed_step` (chapter
#    23) reseeds the generator before every step, so a replayed step draws exactly what the eager step at that place
#    draws: randomness stays a function of the place (seed, rank, epoch, step), and a resume stays exact.
#
# ## The stand-in: the capture's rules, checked on any device
#
# `CaptureCheck` is a dispatch mode (chapter 07_operation_counts' `OperationCounter` is another) that sees every
# operation of a step. It refuses the operations whose result the host reads (`HOST_READS`, and indexing with a boolean
# mask), and, given the operations of a capture, refuses a replay that runs anything else in their place: rules 4 and 5,
# checked where there is no GPU. A CPU's eager operations differ a little from a GPU's (a few checks of `F.one_hot` read
# on the CPU only), so the step is written with the operations that read nothing back anywhere.

# %%
#| export
import warnings
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from convit_edu.augment import MixupCutmix
from convit_edu.config import TrainConfig
from convit_edu.distributed import World

HOST_READS = ("_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select", "_unique2", "unique_dim",
              "unique_consecutive", "bincount", "lift_fresh")  # .item(), bool(t), data-dependent shapes, torch.tensor


class GraphCaptureError(RuntimeError):
    """A training step that a CUDA graph cannot capture or replay as written, with the operation named."""


def _masked(args: tuple) -> bool:
    """Whether an indexing operation's indices hold a boolean mask (a selection whose size depends on the data)."""
    return len(args) > 1 and isinstance(args[1], (list, tuple)) and any(
        isinstance(t, Tensor) and t.dtype in (torch.bool, torch.uint8) for t in args[1])


class CaptureCheck(TorchDispatchMode):
    """What capturing a CUDA graph refuses, checked on any device while a step runs inside it: an operation whose
    result the host reads (`HOST_READS`, boolean-mask indexing) raises `GraphCaptureError`. With `captured`, the
    operations of a capture in order (an earlier check's `ops`), any other operation in their place raises too: a
    replay runs what was captured, whatever the step's Python would do now."""

    def __init__(self, captured: list[str] | None = None):
        super().__init__()
        self.captured, self.ops = captured, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "aten":
            name = func.overloadpacket.__name__
            if name in HOST_READS or (name in ("index", "index_put", "index_put_") and _masked(args)):
                raise GraphCaptureError(
                    f"the step runs aten.{func.__name__}, whose result the host reads (.item(), float(t), bool(t), a "
                    "mask's selection): a CUDA graph cannot wait for it, or freezes the value read at its capture; "
                    "keep the step's numbers in tensors (or train with --cuda-graphs off)")
            at = len(self.ops)
            if self.captured is not None and self.captured[at:at + 1] != [func.__name__]:
                then = self.captured[at] if at < len(self.captured) else "nothing (the capture had ended)"
                raise GraphCaptureError(
                    f"operation {at} of the replayed step is aten.{func.__name__} where its capture ran {then}: the "
                    "step's Python took another path than at its capture, which a graph cannot (a branch on a number "
                    "that changes between steps? pass that number in a tensor)")
            self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))

# %% [markdown]
# Two steps that a graph would get wrong, caught on the CPU: one reads its loss back (to print it, to decide whether
# to clip), the other clips only from its tenth step on (a branch on a counter that changes between steps).

# %%
from convit_edu.checks import expect_error

torch.set_printoptions(precision=4, sci_mode=False)
w = torch.ones(3)


def read_back() -> float:
    with CaptureCheck():
        return float(w.sum())


print(expect_error(read_back, GraphCaptureError))
calls = []


def clip_late(x: Tensor) -> Tensor:
    calls.append(1)
    return x.clamp(max=1.0) if len(calls) > 10 else x * 1.0


with CaptureCheck() as capture:
    clip_late(w)
for step in range(2, 13):
    try:
        with CaptureCheck(capture.ops):
            clip_late(w)
    except GraphCaptureError as e:
        print(f"step {step}: {type(e).__name__}: {e}")
        break
assert step == 11

# %% [markdown]
# ## MixUp/CutMix on the device
#
# Chapter 15's `MixupCutmix` draws λ (and CutMix's box) on the host, as Python numbers, and mixes with them: a graph
# would freeze its first draw (rule 3). `mix_numbers` makes the same draw — `MixupCutmix.draw`, from the same
# generator, so the same numbers — as the seven `MIX_NUMBERS` the host writes into a device tensor (`fill`) before the
# step; `mix_on_device` mixes with that tensor in tensor operations only: the blend of MixUp and the box of CutMix
# are both computed, and `torch.where` keeps the drawn one. The targets are the one-hot labels, smoothed, mixed with
# the same λ. For the same draw it gives, bit for bit, what `MixupCutmix` gives:

# %%
#| export
MIX_NUMBERS = ("lambda", "1 - lambda", "top", "bottom", "left", "right", "cutmix")  # one batch's MixUp/CutMix draw


def mix_numbers(mixup: MixupCutmix, height: int, width: int) -> tuple[float, ...]:
    """One batch's draw of ``mixup`` (``MixupCutmix.draw``, from torch's CPU generator) as the ``MIX_NUMBERS`` that
    ``mix_on_device`` reads: λ, 1 − λ (in double precision, as ``MixupCutmix`` computes it), CutMix's box
    (top, bottom, left, right; empty for MixUp) and whether it is CutMix (1.0) or MixUp (0.0)."""
    lam, box = mixup.draw(height, width)
    return (lam, 1 - lam, *(box if box is not None else (0, 0, 0, 0)), float(box is not None))


def mix_on_device(images: Tensor, labels: Tensor, numbers: Tensor,
                  mixup: MixupCutmix) -> tuple[Tensor, Tensor]:
    """``mixup(images, labels)`` (chapter 15: image j mixed with image B−1−j, soft smoothed targets) for the draw
    held in ``numbers`` (a device tensor of ``mix_numbers``), with tensor operations only: what a CUDA graph replays
    with new numbers at every step (Zhang et al. 2018; Yun et al. 2019)."""
    lam, rest, top, bottom, left, right, cutmix = numbers.unbind()
    rows = torch.arange(images.shape[-2], device=images.device)[:, None]
    cols = torch.arange(images.shape[-1], device=images.device)
    box = (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)
    partners = images.flip(0)
    mixed = torch.where(box, partners, torch.where(cutmix.bool(), images, images * lam + partners * rest))
    eps, classes = mixup.label_smoothing, mixup.num_classes
    one_hot = (labels[:, None] == torch.arange(classes, device=labels.device)).to(images.dtype)
    targets = one_hot * (1 - eps) + eps / classes
    return mixed, targets * lam + targets.flip(0) * rest


def fill(tensors: list[Tensor] | tuple[Tensor, ...], values: tuple[float, ...]) -> None:
    """Write each of ``values`` into the matching one-element tensor of ``tensors``, each a launch with the number as
    its argument: no copy from host memory, no wait for the device (before a replay, on the training stream)."""
    for tensor, value in zip(tensors, values, strict=True):
        tensor.fill_(value)

# %%
mixup = MixupCutmix(num_classes=5)
images, labels = torch.randn(6, 3, 8, 8), torch.tensor([0, 1, 2, 3, 4, 0])
numbers = torch.zeros(len(MIX_NUMBERS))
cutmixes = 0
for seed in range(200):
    torch.manual_seed(seed)
    expected = mixup(images, labels)
    torch.manual_seed(seed)
    fill(numbers.unbind(), mix_numbers(mixup, 8, 8))
    with CaptureCheck():
        mixed = mix_on_device(images, labels, numbers, mixup)
    assert all(torch.equal(a, b) for a, b in zip(mixed, expected)), seed
    cutmixes += int(numbers[-1])
print(f"200 draws, {cutmixes} CutMix and {200 - cutmixes} MixUp: images and targets bit for bit MixupCutmix's, "
      "with nothing read back")
assert 0 < cutmixes < 200

# %% [markdown]
# ## `StepGraph`: capture once, replay every step
#
# `StepGraph(body, device)` runs a step `body(*inputs) -> Tensor` (the step's loss, say). Each call copies the inputs
# into its static buffers, made at the first call (a batch of another shape is refused, naming both); then
#
# * the first `warmup` calls run the body eagerly — on a GPU on a side stream, as torch's recipe has it — so that its
#   lazy state (the optimiser's moments, the loss scaler's scale, a compiled model's kernels) is made outside the
#   graph, and the warm-up steps are ordinary training steps;
# * the next call captures the body (`torch.cuda.graph` with `capture_error_mode="thread_local"`, so that another
#   thread — chapter 19's decode thread — may synchronise its own stream meanwhile) and replays it;
# * every later call replays it.
#
# It returns a copy of the body's output, which every replay rewrites. On a device without CUDA graphs the stand-in
# "captures" by running the body under `CaptureCheck`, and "replays" by running it again under the check with the
# captured operations: the arithmetic of a replay, and the rules of a capture.

# %%
#| export
GRAPH_WARMUP = 3  # eager calls before the capture (torch's CUDA-graph recipe warms up three times)


class StepGraph:
    """``body(*inputs)``, a training step returning a tensor, run from static input buffers: eagerly for the first
    ``warmup`` calls, captured in a CUDA graph at the next one and replayed at every call after it. Where there are no
    CUDA graphs (a CPU), a stand-in runs the body at every call under ``CaptureCheck``'s rules instead."""

    def __init__(self, body: Callable[..., Tensor], device: torch.device | str, warmup: int = GRAPH_WARMUP):
        self.body, self.device, self.warmup = body, torch.device(device), warmup
        self.calls = 0
        self.static: list[Tensor] = []  # the inputs' buffers, on the device
        self.output: Tensor | None = None  # the captured body's output, rewritten by each replay
        self.replay: Callable[[], None] | None = None
        self.side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None  # the warm-up's stream

    def __call__(self, *inputs: Tensor) -> Tensor:
        """Copy ``inputs`` into the static buffers, then run, capture or replay the step; a copy of its output."""
        self._copy_in(inputs)
        if self.calls < self.warmup:
            output = self._eager()
        elif self.replay is None:
            output = self._capture()
        else:
            self.replay()
            output = self.output
        self.calls += 1
        return output.clone()

    def _copy_in(self, inputs: tuple[Tensor, ...]) -> None:
        if not self.static:
            self.static = [torch.empty_like(x, device=self.device) for x in inputs]
        held = [(tuple(b.shape), b.dtype) for b in self.static]
        given = [(tuple(x.shape), x.dtype) for x in inputs]
        if given != held:
            raise ValueError(f"the graphed step holds inputs {held} and was given {given}: a graph replays fixed "
                             "shapes (the package's loaders drop the last incomplete batch; for batches of varying "
                             "shapes train with --cuda-graphs off)")
        for buffer, x in zip(self.static, inputs):
            buffer.copy_(x, non_blocking=True)

    def _eager(self) -> Tensor:
        if self.side is None:
            return self.body(*self.static)
        current = torch.cuda.current_stream(self.device)
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*capturable=True.*")  # AdamW's: "not captured" (not yet)
            output = self.body(*self.static)
        current.wait_stream(self.side)
        return output

    def _capture(self) -> Tensor:
        if self.side is None:  # the stand-in: run it under the capture's rules, then replay it under them too
            with CaptureCheck() as capture:
                self.output = self.body(*self.static)
            self.replay = lambda: self._stand_in_replay(capture.ops)
            return self.output
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.output = self.body(*self.static)
        except RuntimeError as e:
            raise GraphCaptureError(f"the training step could not be captured in a CUDA graph ({e}); chapter 28 "
                                    "(28_cuda_graphs) lists what a graph holds; train with --cuda-graphs off") from e
        self.replay = graph.replay
        graph.replay()  # a capture records the step without running it
        return self.output

    def _stand_in_replay(self, captured: list[str]) -> None:
        with CaptureCheck(captured) as replay:
            output = self.body(*self.static)
        if len(replay.ops) != len(captured):
            raise GraphCaptureError(f"the replayed step ran {len(replay.ops)} operations where its capture ran "
                                    f"{len(captured)}: its Python took another path")
        self.output.copy_(output)

# %% [markdown]
# ## The optimiser as a graph replays it
#
# `build_optimizer(..., graphed=True)` (chapter 23) makes AdamW fused — one kernel over all the parameters, reading
# nothing back, on a CPU too — and, on a GPU, capturable (its step counts stay on the device). `graph_ready` then puts
# each group's rate in a float32 tensor on the device, which `fill` sets from the schedule (`RunSchedule.rates`) before
# each step. It runs again after a checkpoint is loaded, which brings back the saved groups' options and rates (and
# new moment tensors: so the graph is captured after any restore, never before). fp16's loss scaler needs nothing
# more: with a fused AdamW, `GradScaler.step` hands it the scale and the inf flag as tensors, and the kernel skips a
# step with non-finite gradients on the device.

# %%
#| export
def graph_ready(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """``optimizer`` (``build_optimizer(..., graphed=True)``'s AdamW) as a graph replays it, also after a checkpoint
    was loaded into it: every group with the options the optimiser was built with (fused; capturable on a GPU), its
    rate a float32 tensor on ``device`` (``fill`` sets it before each step), its step counts on ``device``."""
    for group in optimizer.param_groups:
        group.update(fused=optimizer.defaults["fused"], capturable=optimizer.defaults["capturable"])
        if not (isinstance(group["lr"], Tensor) and group["lr"].device == device):
            group["lr"] = torch.full((), float(group["lr"]), device=device)  # filled there: no copy, no wait
        for p in group["params"]:
            state = optimizer.state.get(p)
            if state:
                state["step"] = state["step"].to(device, torch.float32)

# %% [markdown]
# A small step of the production step's shape — a model with dropout, fused AdamW at the schedule's rates, clipping,
# an EMA of the weights, reseeded at every step — run eagerly, then through `StepGraph` (three eager steps, a capture,
# eight replays): the same weights and EMA, bit for bit.

# %%
from torch import nn
from torch.nn import functional as F

from convit_edu.optimisation import seed_step
from convit_edu.schedule import RunSchedule

schedule = RunSchedule(total_steps=12, warmup_steps=3, peak_lr=1e-2, min_lr=1e-4, warmup_lr=1e-4, scales=(1.0,))
torch.manual_seed(0)
data = [(torch.randn(16, 8), torch.randint(0, 4, (16,))) for _ in range(12)]


def toy_run(graphed: bool) -> list[Tensor]:
    """Twelve steps of a small classifier; its weights and their EMA after them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    graph_ready(optimizer, torch.device("cpu"))
    ema = [p.detach().clone() for p in model.parameters()]

    def body(x: Tensor, y: Tensor) -> Tensor:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch._foreach_lerp_(ema, [p.detach() for p in model.parameters()], 0.1)
        return loss.detach()

    step = StepGraph(body, "cpu") if graphed else body
    for t, (x, y) in enumerate(data):
        seed_step(0, 0, 0, t)  # the dropout masks: a function of the step
        fill([group["lr"] for group in optimizer.param_groups], schedule.rates(t))
        step(x, y)
    return [*model.state_dict().values(), *ema]


assert all(map(torch.equal, toy_run(graphed=False), toy_run(graphed=True)))
print("12 steps, eagerly and replayed (3 eager, a capture, 8 replays): weights and EMA bit for bit the same")

# %% [markdown]
# ## The run's switch: `cuda_graphs`
#
# `TrainConfig.cuda_graphs` (`--cuda-graphs`, chapter 21) is "auto" by default: the step is graphed when the model is
# compiled (`--compile`) on a CUDA device and one process trains — where the launches are what is left to remove.
# "on" graphs it wherever it runs (on a CPU, the stand-in: no faster, the same numbers, the rules checked); "off"
# never. `step_graphed` decides, before the run starts, and refuses what a graph cannot hold here, naming the flag
# that turns graphs off: DDP (several processes). Its gradient all-reduce inside a graph needs NCCL's capture
# support, DDP built on a side stream and eleven eager warm-up steps (torch's CUDA-graph notes), not built or checked
# on GPUs here; "auto" leaves a DDP run eager. The rest of a step is captured: gradient accumulation (a pair of static
# buffers per micro-batch), a distillation teacher's forward, fp16's loss scaler, the clipping, the EMA.

# %%
#| export
def step_graphed(cfg: TrainConfig, world: World) -> bool:
    """Whether the run ``cfg`` replays its training step from a graph (``StepGraph``) on this process's ``world``:
    ``cuda_graphs`` "on" (the stand-in off CUDA); "auto" when the model is compiled on a CUDA device in one process;
    "off" never. ValueError for "on" with what a graph cannot hold here: several processes (DDP)."""
    if cfg.cuda_graphs == "off":
        return False
    if world.world_size > 1:
        if cfg.cuda_graphs == "on":
            raise ValueError(f"cuda_graphs 'on' with {world.world_size} processes: DDP's gradient all-reduce is not "
                             "captured in a graph here (it needs NCCL capture, DDP built on a side stream and eleven "
                             "eager warm-up steps, not checked on GPUs yet): pass --cuda-graphs off (or auto, which "
                             "trains a DDP run eagerly)")
        return False
    return cfg.cuda_graphs == "on" or (cfg.compile and world.device.type == "cuda")

# %%
cpu, gpu = World(0, 1, torch.device("cpu"), False), World(0, 1, torch.device("cuda"), False)
assert step_graphed(TrainConfig(compile=True), gpu) and not step_graphed(TrainConfig(), gpu)
assert not step_graphed(TrainConfig(compile=True), cpu) and step_graphed(TrainConfig(cuda_graphs="on"), cpu)
assert not step_graphed(TrainConfig(compile=True), World(0, 2, torch.device("cuda"), False))
print("auto: graphed when compiled on a GPU in one process;", expect_error(
    lambda: step_graphed(TrainConfig(cuda_graphs="on"), World(0, 2, torch.device("cuda"), False))))
print(expect_error(lambda: TrainConfig(cuda_graphs="yes")))

# %% [markdown]
# ## How a resume stays exact, and what a GPU must confirm
#
# A graph holds addresses: the static input buffers, the model's weights and gradients, the optimiser's moments and
# step counts, the EMA, the loss scaler's scale, the rate tensors, the MixUp/CutMix numbers. None of them is saved
# *as the graph's*: a checkpoint holds their values (chapter 26), a resumed process loads them into its objects,
# `graph_ready` restores the optimiser's form, and only then — after `GRAPH_WARMUP` eager steps, which are ordinary
# steps of the same arithmetic — is the graph captured, around the restored tensors. The numbers the host writes
# before each replay (the rate, the MixUp/CutMix draw) and the generator's seed are functions of the step, so a
# resumed run writes the same ones. Chapter 28's `TrainStep` is built this way, and `29_graphed_step` resumes a
# graphed run bit for bit on the CPU.
#
# What the CPU cannot show is the GPU's side: that the capture succeeds (no operation of the step refuses it), that a
# replayed step equals the eager one (`graph_replay_difference`, in `29_graphed_step`; fp32 with deterministic
# algorithms), and what a replayed step costs. `tests/test_cuda_graphs.py` has a test of the first two that runs only
# on a GPU, and the GPU check (chapter 45) measures the third.
