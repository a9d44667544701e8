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
# # Counting operations: one product with P or two, by what paces the device
#
# Chapter 07_gpsa built the fast `GPSA` and checked that it gives the reference's numbers. Its forward applies the
# positional attention P, the same for every image, in one of two ways: as one (heads, L, L) product for the whole
# batch, or as two small factors. Both are exact; they differ in what they cost, and what a cost is depends on the
# device. This chapter counts both kinds: the **operations** a training step issues, which on a GPU are kernel
# launches and set the pace of a small model's step, and the **multiply-adds**, which set a CPU's. From the counts
# follow the layer's choices, one product with P on a GPU and its factors on a CPU (`applies_factors`), and the gate's
# two forms. The operation counter (`OperationCounter`, `count_operations`, `layer_operations`) exports to
# `convit_edu/benchmarks.py`, with the other measuring tools (chapters 30–31).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp benchmarks

# %%
import contextlib

import matplotlib.pyplot as plt
import torch
from torch.utils.flop_counter import FlopCounterMode

from convit_edu.checks import check_answer
from convit_edu.gpsa import GPSA, gpu_path
from convit_edu.gpsa_reference import GPSAReference

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Counting operations: what a GPU launches
#
# On a GPU, torch runs each aten operation as a kernel (or a few) that the host launches, and each launch costs the
# host its own microseconds whatever the tensor's size: a small model's training step takes about the number of its
# operations times that cost (chapter 31 shows it in the first GPU figures). A layer is then fast when it issues few
# operations, and a CPU can count them. `OperationCounter` is a `TorchDispatchMode`: it sees every aten operation
# torch dispatches below autograd and autocast, forward and backward (autocast's casts included), and counts those
# that are not views — a view (a reshape, a transpose, most `rearrange`s) moves no data and launches nothing.
# `layer_operations` counts one forward and backward of a layer under bf16 autocast, the precision a GPU trains in.

# %%
#| export
from collections import Counter
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from convit_edu.gpsa import gpu_path

PHASES = ("forward", "backward", "optimizer")


class OperationCounter(TorchDispatchMode):
    """Counts the aten operations that run inside it and are not views, by phase and name: on a GPU each is a
    kernel launch or a few, so the count is a CPU's proxy of a step's launches (DESIGN §9). An operation's phase:
    ``backward`` when autograd's engine runs it, ``optimizer`` inside any optimiser's ``step``, else ``forward``
    (the model and the loss). ``counts[phase, name]`` holds the calls (what an operation runs itself is not seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[tuple[str, str]] = Counter()
        self._in_step = 0

    def __enter__(self) -> "OperationCounter":
        self._hooks = (register_optimizer_step_pre_hook(lambda *_: self._enter_step(1)),
                       register_optimizer_step_post_hook(lambda *_: self._enter_step(-1)))
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        super().__exit__(*exc)

    def _enter_step(self, change: int) -> None:
        self._in_step += change

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # not aten's: the profiler's marks; _unsafe_view: what reshape returns of a fresh copy, a view but by its schema
        if func.namespace == "aten" and not (func.is_view or func is torch.ops.aten._unsafe_view.default):
            in_backward = torch._C._current_graph_task_id() != -1  # autograd's engine is running a graph
            phase = "optimizer" if self._in_step else "backward" if in_backward else "forward"
            self.counts[phase, func.__name__] += 1
        return func(*args, **(kwargs or {}))

    def total(self, *phases: str) -> int:
        """The operations counted in ``phases`` (in every phase when none is named)."""
        if unknown := set(phases) - set(PHASES):
            raise ValueError(f"unknown phase {sorted(unknown)}: the phases are {PHASES}")
        return sum(n for (phase, _), n in self.counts.items() if phase in (phases or PHASES))


def count_operations(fn: Callable[[], object]) -> OperationCounter:
    """The operations that ``fn()`` runs (``OperationCounter``), its GPSA layers on the path they take on a GPU
    (``gpu_path``): the proxy of a GPU's launches."""
    with gpu_path(), OperationCounter() as counter:
        fn()
    return counter


def layer_operations(layer: nn.Module, x: Tensor) -> OperationCounter:
    """The operations of a forward of ``layer`` on ``x`` under bf16 autocast (on x's device) and of its backward into
    ``x`` and every parameter, for a gradient of ones made outside the count; after one forward not counted (at its
    first, a layer may build what it keeps, such as ``rel_indices``)."""
    x = x.detach().requires_grad_()
    inputs = [x, *(p for p in layer.parameters() if p.requires_grad)]
    with gpu_path(), torch.autocast(x.device.type, dtype=torch.bfloat16):
        layer(x)
    # an autocast region of its own, as a training step's: autocast casts each weight once per region
    with gpu_path(), OperationCounter() as counter, torch.autocast(x.device.type, dtype=torch.bfloat16):
        y = layer(x)
    grad = torch.ones_like(y)
    with gpu_path(), counter:
        torch.autograd.grad(y, inputs, grad)
    return counter


# %% [markdown]
# A GPSA layer of ConViT-Ti (4 heads) against the MHSA layer of DeiT-Ti (3 heads, with a qkv bias) that it stands
# in for, and against the reference, on a batch of two 14 × 14 grids. The counts do not depend on the batch, the
# grid or the CPU; on a CPU they include a few operations a GPU does not run (the denormal flush of chapter 05,
# and the fp32 round trip `fused_attention` makes for SDPA in bf16 on a CPU, MHSA's too).

# %%
from convit_edu.attention import MHSA
x = torch.randn(2, 196, 192)
counted = {"fast GPSA": layer_operations(GPSA(192, 4), x), "reference GPSA": layer_operations(GPSAReference(192, 4), x),
           "MHSA (DeiT-Ti)": layer_operations(MHSA(192, 3, qkv_bias=True), x)}
for name, ops in counted.items():
    forward, backward = ops.total("forward"), ops.total("backward")
    print(f"{name:<15} {forward:>3} forward + {backward:>3} backward = {forward + backward:>3} operations")
ratio = counted["fast GPSA"].total() / counted["MHSA (DeiT-Ti)"].total()
assert ratio <= 2, ratio
print(f"fast GPSA / MHSA: {ratio:.2f} (target: at most 2)")
assert layer_operations(GPSA(192, 4), torch.randn(3, 64, 192)).counts == counted["fast GPSA"].counts  # B 3, 8 x 8

# %% [markdown]
# Beyond MHSA's, the fast layer's operations are P (one product for the scores of every head and pair, the softmax,
# on a CPU the flush; their gradients), a copy of V into the (heads, L, B·d) layout the product reads, the product,
# the gate (`sigmoid`, and `lerp`, whose backward gives three gradients) and P's cast to bf16 and back. Two choices:
#
# **One product or two.** With Eq. 5's encoding r_δ = (δx, δy, δx² + δy²), a head's positional score is a part that
# depends only on the column offset δx plus a part that depends only on the row offset δy (the bias b shifts every
# score of the head alike, and a softmax does not see it):
#
# $$\mathbf{v}_{pos}^\top \mathbf{r}_\delta = \underbrace{w_1\,\delta_x + w_3\,\delta_x^2}_{s_x(\delta_x)}
#   + \underbrace{w_2\,\delta_y + w_3\,\delta_y^2}_{s_y(\delta_y)} + b
#   \quad\Longrightarrow\quad
#   \mathbf{P}_{(i,j),(k,l)} = \frac{e^{s_y(k-i)}\,e^{s_x(l-j)}}{\sum_{k'} e^{s_y(k'-i)} \sum_{l'} e^{s_x(l'-j)}}
#   = \mathbf{P}^y_{ik}\,\mathbf{P}^x_{jl},$$
#
# for a query at row i, column j and a key at row k, column l: P (L × L) is the Kronecker product P^y ⊗ P^x of a
# softmax over the rows (H × H) and one over the columns (W × W) — the positional attention of a one-column grid and of
# a one-row grid. Applying it as two small products, along the columns with P^x, then along the rows with P^y, takes
# L·(H + W) multiply-adds per channel instead of L²: for a 14 × 14 grid, 7 times fewer.

# %%
torch.manual_seed(0)
layer = GPSA(192, 4)
with torch.no_grad():
    layer.pos_proj.weight.add_(torch.randn_like(layer.pos_proj.weight) * 0.05)  # away from Eq. 5's initialisation
grid, N_h = (7, 12), 4
py, px = layer.positional_softmax((grid[0], 1)), layer.positional_softmax((1, grid[1]))  # one-column, one-row grids
kron = torch.einsum("hik,hjl->hijkl", py, px).reshape(N_h, 84, 84)
assert (kron - layer.positional_softmax(grid)).norm() <= 1e-6 * kron.norm()
assert all((mine - want).norm() <= 1e-6 * want.norm() for mine, want in zip(layer.positional_factors(grid), (py, px)))
print("P of the 7 x 12 grid = P of its one-column grid ⊗ P of its one-row grid, to 1e-6; positional_factors gives "
      "both")
rows, cols = 14, 14
print(f"P·V per channel on a {rows}x{cols} grid: {(rows * cols) ** 2} multiply-adds as one matrix, "
      f"{rows * cols * (rows + cols)} as two factors ({(rows * cols) ** 2 / (rows * cols * (rows + cols)):.0f}x fewer)")
i, j = 3, 5  # a query on the 7 x 12 grid: its row of P is the outer product of two rows of the factors
fig, axes = plt.subplots(1, 3, figsize=(9, 2.2), dpi=80, gridspec_kw={"width_ratios": [1, 12, 12]})
for ax, image, title in zip(axes, (py[0, i][:, None], px[0, j][None], kron[0, i * 12 + j].reshape(7, 12)),
                            (f"Py[{i}]", f"Px[{j}]", f"P's row for query ({i}, {j}) = Py[{i}] ⊗ Px[{j}]")):
    ax.imshow(image.detach(), cmap="viridis"), ax.set_title(title, fontsize=9), ax.set_xticks([]), ax.set_yticks([])
plt.show()

# %% [markdown]
# Which form is faster depends on what sets the pace:
#
# * **On a GPU, one product.** Each factor has its own scores, softmax, cast and gradients; the second product reads V
#   in a layout the first one leaves behind, a copy each way in the forward and in the backward; and a product over 14
#   terms keeps a GPU's matrix units mostly idle. An earlier version of this layer used the factors everywhere and
#   issued about four times MHSA's operations; a small model's GPU step is paced by its launches. One product costs
#   more arithmetic — three times L² − L·(H + W) multiply-adds per channel and image in a training step (counted
#   below), at 224 px 5 % of ConViT-Ti's training multiply-adds and 2.5 % of ConViT-S's, which chapter 31 counts — but
#   the copies and most operations go.
# * **On a CPU, the factors.** A CPU's step is paced by its multiply-adds rather than its launches, so there the time
#   follows the arithmetic (chapter 31 times ConViT-Ti against DeiT-Ti on one): ConViT-Ti's extra 5 % of multiply-adds
#   would be half of the 10 % that chapter 31's target (0.9× DeiT-Ti's images/s) leaves for all that GPSA adds. So
#   the layer asks `applies_factors(device)`: the factors (`positional_factors`, `_factored_output`) on a CPU, one
#   product elsewhere. Both are exact (checked in chapter 07_gpsa, and in `tests/test_gpsa.py` to 1e-10 in fp64). The
#   operation counts are the GPU's proxy, so they count the GPU's path on a CPU too (`count_operations` runs inside
#   `gpu_path()`).
#
# The multiply-adds, counted: `FlopCounterMode`, torch's counter of arithmetic, sees every matrix product (in FLOPs,
# two a multiply-add) but not SDPA's on a CPU (chapter 31), which both paths share. One forward and backward of a
# ConViT-Ti GPSA layer on a 14 × 14 grid, on each path: the one product takes three times (L² − L·(H + W))·D more
# multiply-adds per image, for P·V in the forward and, in the backward, for the gradients of V (Pᵀ·G) and of P (G·Vᵀ),
# as the factors take three times theirs; and one more product, for the whole batch: P's scores, `pos_proj` applied
# to the (L², 3) `rel_indices` (L²·3·N_h), and its weight's gradient, where the factors' path adds up broadcast offsets.

# %%
torch.manual_seed(0)
batch, (rows, cols), D, N_h = 2, (14, 14), 192, 4
length, x = rows * cols, torch.randn(batch, rows * cols, D, requires_grad=True)
layer = GPSA(D, N_h)
macs = {}
for path, label in ((contextlib.nullcontext, "two factors"), (gpu_path, "one product")):
    with FlopCounterMode(display=False) as flops, path():
        layer(x, (rows, cols)).sum().backward()
    macs[label] = flops.get_total_flops() // 2  # FLOPs: 2 a multiply-add
extra = macs["one product"] - macs["two factors"]
per_image = 3 * (length * length - length * (rows + cols)) * D
assert extra == batch * per_image + 2 * length * length * 3 * N_h
print(f"one product - two factors, forward and backward: {extra:,} multiply-adds = {batch} images x {per_image:,} "
      f"(3 x (L² - L·(H+W)) x D) + {2 * length * length * 3 * N_h:,} for P's scores")

# %% [markdown]
# **The gate by `lerp` on a GPU, folded into P^y on a CPU.** SDPA is linear in V, so (1 − σ)·SDPA(Q, K, V) = SDPA(Q, K,
# (1 − σ)·V): one could scale the rows of W_val by 1 − σ and P by σ/(1 − σ) = e^λ, and the two terms would mix by a
# plain sum, whose backward is free, where `lerp`'s backward makes four passes over the batch's outputs and a
# reduction for σ's gradient. But e^λ overflows (past λ ≈ 88 in fp32, 11 in fp16: a clamp, and fp16 would need
# `lerp` anyway), P·e^λ makes new denormal numbers of P's smallest entries whenever λ < 0, and the scalings, the
# clamp and the exponential are operations of their own, forward and backward, where the mix is one — on a GPU the
# launches weigh more than the passes. `lerp` is one form for every precision, any λ and `gate_override`.
#
# A CPU weighs passes, not launches, and its factors offer a cheaper place for σ: σ·P = (σ·P^y) ⊗ P^x, so σ scales the
# (heads, H, H) entries of P^y, never a batch-sized tensor, and cannot overflow (σ ≤ 1). Its only cost is the
# denormal numbers σ makes of P^y's smallest entries, flushed again (`flush_denormals`, chapter 05) on that small
# tensor. The mix is then one `addcmul`, position + (1 − σ)·content, whose backward needs the content (which SDPA keeps
# anyway) but not the positional output that `lerp`'s keeps: a batch-sized tensor less per layer for the backward
# pass, which chapter 30 weighs.

# %%
print(f"e^89 in fp32: {torch.tensor(89.0).exp().item()}; e^12 in fp16: {torch.tensor(12.0).exp().half().item()} "
      f"(facts of the formats, shown: the largest fp16 number is 65504)")

# %% [markdown]
# ## Exercises
#
# **1. P as two factors.** Write `apply_factors(py, px, v)`: P·V for every image and head, where
# P = P^y ⊗ P^x is given by its factors `py` (N_h, H, H) and `px` (N_h, W, W) and `v` is (B, N_h, L = H·W, d),
# tokens row-major — without building the (L, L) matrix. Hint: view each head's values as (H, W, d); P^x mixes
# along W, P^y along H.

# %%
apply_factors = ...  # your answer: def apply_factors(py, px, v): ...

# %%
from convit_edu.checks import demonstrate, grade, reveal


def kron(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """first ⊗ second for every head: (N_h, a, a) and (N_h, b, b) give (N_h, a·b, a·b), the L × L matrix."""
    return torch.einsum("hik,hjl->hijkl", first, second).flatten(3, 4).flatten(1, 2)


def check_apply_factors(fn) -> None:
    torch.manual_seed(7)
    layer = GPSA(24, 4)
    with torch.no_grad():
        layer.pos_proj.weight.add_(torch.randn_like(layer.pos_proj.weight))  # a non-symmetric P
    py, px = (layer.positional_softmax(grid).detach() for grid in ((3, 1), (1, 5)))  # P of a column, of a row
    v = torch.randn(2, 4, 15, 6)
    want = layer.positional_softmax((3, 5)).detach() @ v
    got = fn(py, px, v)
    check_answer(isinstance(got, torch.Tensor) and got.shape == want.shape,
                 f"apply_factors returns (B, N_h, L, d) = {tuple(want.shape)}: flatten the grid back into L")
    check_answer(not torch.allclose(got, kron(py.transpose(-2, -1), px.transpose(-2, -1)) @ v, atol=1e-5),
                 "the factors are applied transposed: P^y[h, i, k] takes key row k into query row i, summing over k")
    check_answer(torch.allclose(got, want, atol=1e-5), "token t = row·W + col: P^y mixes the rows (query row i, key "
                 "row k), P^x the columns, each head with its own factors")


grade("apply_factors", apply_factors, check_apply_factors)
demonstrate(check_apply_factors, {
    "the grid not flattened": lambda py, px, v: (kron(py, px) @ v).unflatten(2, (py.shape[-1], px.shape[-1])),
    "the factors transposed": lambda py, px, v: kron(py.transpose(-2, -1), px.transpose(-2, -1)) @ v,
    "the rows not mixed": lambda py, px, v: kron(torch.eye(py.shape[-1]).expand_as(py), px) @ v,
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(apply_factors):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def apply_factors(py: torch.Tensor, px: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        grid = v.unflatten(2, (py.shape[-1], px.shape[-1]))  # (B, N_h, H, W, d)
        return torch.einsum("hik,hjl,bhkld->bhijd", py, px, grid).flatten(2, 3)

    grade("apply_factors", apply_factors, check_apply_factors)

# %% [markdown]
# **2. The gate in one launch.** Write `gate_mix(content, position, sigma)`: Eq. 7's mix of a head's two outputs,
# (1 − σ)·content + σ·position, for `content` and `position` (B, N_h, L, d) and the gates `sigma` (N_h,), each head
# with its own — in **one** operation that `count_operations` counts. A view (`sigma.view(...)`, a reshape) moves no
# data and is not counted; each arithmetic operator is an operation, on a GPU a launch, of its own.

# %%
gate_mix = ...  # your answer: def gate_mix(content, position, sigma): ...

# %%
def check_gate_mix(fn) -> None:
    torch.manual_seed(3)
    content, position = torch.randn(2, 2, 4, 9, 6).unbind(0)  # B = 2, N_h = 4, L = 9, d = 6
    sigma = torch.tensor([0.1, 0.4, 0.7, 0.95])
    want = (1 - sigma.view(-1, 1, 1)) * content + sigma.view(-1, 1, 1) * position
    got = fn(content, position, sigma)
    check_answer(isinstance(got, torch.Tensor) and got.shape == want.shape,
                 f"gate_mix returns one output per head, (B, N_h, L, d) = {tuple(want.shape)}")
    check_answer(not torch.allclose(got, torch.lerp(position, content, sigma.view(-1, 1, 1)), atol=1e-6),
                 "σ weighs the position and 1 − σ the content (σ → 1 is the convolution-like head)")
    check_answer(torch.allclose(got, want, atol=1e-6), "each head h mixes with its own gate: (1 − σ_h)·content + "
                 "σ_h·position, σ_h broadcast over the head's (L, d) outputs")
    operations = count_operations(lambda: fn(content, position, sigma))
    counted = ", ".join(f"{n} {name}" for (_, name), n in operations.counts.items())
    check_answer(operations.total() == 1, f"the numbers are right, in {operations.total()} operations ({counted}): "
                 "torch has one operation for (1 − w)·a + w·b")


grade("gate_mix", gate_mix, check_gate_mix)
demonstrate(check_gate_mix, {
    "the heads merged, (B, L, N_h·d)": lambda c, p, s: torch.lerp(c, p, s.view(-1, 1, 1)).transpose(1, 2).flatten(2),
    "σ on the content": lambda c, p, s: torch.lerp(p, c, s.view(-1, 1, 1)),
    "one gate for all heads": lambda c, p, s: torch.lerp(c, p, s.mean()),
    "written out, (1 − σ)·c + σ·p": lambda c, p, s: (1 - s.view(-1, 1, 1)) * c + s.view(-1, 1, 1) * p,
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(gate_mix):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def gate_mix(content: torch.Tensor, position: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return torch.lerp(content, position, sigma.view(-1, 1, 1))  # the view launches nothing

    grade("gate_mix", gate_mix, check_gate_mix)
