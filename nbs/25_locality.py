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
# # Locality: nonlocality and the gates, during training
#
# Section 4 of the paper asks what the attention heads actually do. Do plain self-attention (SA) layers become
# local when trained on images, as Cordonnier et al. suggested? Do the ConViT's GPSA layers, which *start*
# local, stay there? How much does each head rely on position rather than content? This chapter builds the
# first two of the paper's instruments so that they work on any `convit_edu` model — ours, or an official
# checkpoint loaded with `checkpoints.load_weights` (chapter 10):
#
# * the **nonlocality** of Eq. 8, per head and per layer, and its evolution during training (Fig. 5);
# * the **gates** σ(λ_h) of every head, as a heat map and over training (Fig. 6);
#
# and records both on a small DeiT and ConViT trained here. Chapter 26 adds attention maps and masking at test
# time, and applies all four to longer-trained models.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp locality
# Locality: nonlocality (Eq. 8) on each block's true input, the gates, and both recorded during training.
#
# A little longer than most chapters: each instrument is checked on attention whose answer is known before it is
# used on a training run.

# %%
# %matplotlib inline
import json
from pathlib import Path

import torch

from convit_edu.checks import expect_error
from convit_edu.conv_init import head_centres
from convit_edu.positional import rel_indices
from convit_edu.zoo import create_model

torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## Nonlocality, Eq. 8
#
# For one head h of layer ℓ, sum over every query patch q and key patch k the distance ‖δ_qk‖ between them,
# weighted by the attention A_qk that q pays to k, and average over the L queries:
#
# $$D^{\ell,h}_{loc} = \frac{1}{L}\sum_{q,k} A^{h,\ell}_{qk}\,\lVert\delta_{qk}\rVert, \qquad
#   D^{\ell}_{loc} = \frac{1}{N_h}\sum_h D^{\ell,h}_{loc}.$$
#
# Since each row of A sums to one, the inner sum is the *expected distance* from query q to where it looks,
# and D_loc is its average over the queries: "the number of patches between the centre of attention and the
# query patch". The unit is one patch (the distance between neighbouring patch centres); δ is the offset on
# the patch grid, the one `rel_indices` holds, whose third channel is ‖δ‖², so ‖δ‖ is its square root.
#
# Two decisions the equation leaves open, and ours:
#
# * **Which tokens.** Eq. 8 is about patches, but a DeiT (and a ConViT's SA layers, after the class token
#   joins) also has a class token, which has no position. We drop the class (and distillation) token's row and
#   column and **renormalise** each query's attention over the patches, so D_loc is the expected distance
#   *among the patches the query looks at*; otherwise a head that only reads the class token would look
#   perfectly "local" (distance 0).
# * **Which images.** The paper averages over a batch of 1024 images; we average over whatever batch we get.

# %%
#| export
import torch
from torch import Tensor

from convit_edu.positional import rel_indices


def patch_distances(grid_size: tuple[int, int], device: torch.device | str | None = None) -> Tensor:
    """‖δ_qk‖ between every query and key patch of a (rows, cols) grid, in patches: (L, L), L = rows · cols,
    tokens row-major. The square root of the third channel of ``rel_indices``."""
    return rel_indices(*grid_size, device=device)[..., 2].sqrt()


def nonlocality(attn: Tensor, grid_size: tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
    """Eq. 8 for every head: D_h = (1/L) Σ_{q,k} A_h[q, k] ‖δ_qk‖, averaged over the batch; shape (num_heads,).

    ``attn`` is (B, H, T, T) or (H, T, T) with T = num_prefix_tokens + L and L = rows · cols of ``grid_size``.
    Only patch tokens count: the rows and columns of the first ``num_prefix_tokens`` tokens (class,
    distillation) are dropped and each query's attention renormalised over the patches.
    """
    if attn.ndim not in (3, 4) or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attention must be (B, H, T, T) or (H, T, T), got shape {tuple(attn.shape)}")
    rows, cols = grid_size
    length = rows * cols
    if attn.shape[-1] != num_prefix_tokens + length:
        raise ValueError(
            f"attention over {attn.shape[-1]} tokens does not fit num_prefix_tokens {num_prefix_tokens} + a "
            f"{rows}x{cols} grid ({num_prefix_tokens + length} tokens)"
        )
    a = attn.float() if attn.ndim == 4 else attn.float()[None]
    a = a[..., num_prefix_tokens:, num_prefix_tokens:]
    if num_prefix_tokens:
        a = a / a.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(a.dtype).tiny)
    distances = patch_distances(grid_size, device=a.device)
    return torch.einsum("bhqk,qk->h", a, distances) / (a.shape[0] * length)


# %% [markdown]
# ### Checked on attention maps whose nonlocality we know
#
# A 3 × 3 grid, hand-made maps: a head attending only to its own patch (distance 0), a head attending to the
# patch on the right where there is one and to the left otherwise (distance 1 for every query), and a uniform
# head, whose nonlocality is the mean distance between two patches of the grid.

# %%
grid = (3, 3)
L = 9
d = patch_distances(grid)
print(d[4].view(3, 3))  # distances from the centre patch
assert torch.allclose(d[4].view(3, 3)[0], torch.tensor([2**0.5, 1.0, 2**0.5]))

self_only = torch.eye(L)
neighbour = torch.zeros(L, L)
for q in range(L):
    row, col = divmod(q, 3)
    neighbour[q, q + 1 if col < 2 else q - 1] = 1.0
uniform = torch.full((L, L), 1 / L)
maps = torch.stack([self_only, neighbour, uniform])  # (H=3, L, L)
D = nonlocality(maps, grid)
print("nonlocality per head:", D)
mean_distance = d.mean()  # the average of ‖δ‖ over all 81 (q, k) pairs
torch.testing.assert_close(D, torch.stack([torch.tensor(0.0), torch.tensor(1.0), mean_distance]))

# %% [markdown]
# With a class token in front (T = 1 + L), attention to it does not count, and what remains is renormalised:
# a query that sends half its attention to the class token and half to its right-hand neighbour still looks
# at distance 1. A batch is averaged.

# %%
with_cls = torch.zeros(1 + L, 1 + L)
with_cls[:, 0] = 0.5
with_cls[1:, 1:] = 0.5 * neighbour
with_cls[0, 0] = 1.0
batch = torch.stack([torch.stack([with_cls, with_cls]), torch.stack([with_cls, with_cls])])  # (B=2, H=2, T, T)
torch.testing.assert_close(nonlocality(batch, grid, num_prefix_tokens=1), torch.ones(2))
print(expect_error(lambda: nonlocality(maps, (4, 4))))

# %% [markdown]
# ## Nonlocality of a whole model, on each block's true input
#
# A layer's attention depends on its input, so the nonlocality of layer ℓ must be measured on what layer ℓ
# really receives in a forward pass: the output of layer ℓ − 1 (for a ConViT after its GPSA blocks, with the
# class token joined). `forward_features(..., return_attention=True)` (chapter 07) records exactly that, in
# one pass.
#
# The official ConViT's logging (`get_attention_map` in its `main.py`) did something else: it passes the raw
# patch embeddings `patch_embed(x)` — no positional embedding, no class token, no `norm1` — to the attention of
# *every* block, so every block but the first is measured on an input it never sees: not the attention the
# network computes. `model_nonlocality(..., inputs="embeddings")` reproduces the idea, not the letter: each
# block's own `norm1` and attention on the *first block's input* (patch plus positional embeddings), so that
# block 1 is measured exactly and every deeper block on the wrong input — the part of the error that grows with
# depth.

# %%
#| export
from torch import Tensor, nn

from convit_edu.checks import one_of

NONLOCALITY_INPUTS = ("block", "embeddings")


@torch.no_grad()
def model_nonlocality(model: nn.Module, images: Tensor, inputs: str = "block") -> Tensor:
    """Eq. 8 for every block and head of a ``convit_edu`` model on ``images``, in eval mode: (depth, num_heads).

    ``inputs="block"``: each block's attention on its true input, from one forward pass.
    ``inputs="embeddings"``: each block's attention on the embedded patches (the first block's input), as the
    official ConViT's logging computed it, a bug kept here to show the difference.
    """
    one_of("inputs", inputs, NONLOCALITY_INPUTS)
    was_training = model.training
    model.eval()
    try:
        record = model.forward_features(images, return_attention=inputs == "block",
                                        return_block_inputs=inputs == "embeddings")
        if inputs == "block":
            maps, prefixes = record.attentions, record.num_prefix_tokens
        else:
            first = record.block_inputs[0]
            maps = [block(first, record.grid_size, return_attention=True)[1] for block in model.blocks]
            prefixes = [record.num_prefix_tokens[0]] * len(maps)
    finally:
        model.train(was_training)
    return torch.stack([nonlocality(a, record.grid_size, p) for a, p in zip(maps, prefixes)])


# %% [markdown]
# On a freshly initialized ConViT (4 heads, 6 blocks of which 4 are GPSA, an 8 × 8 grid of 8-px patches) the
# GPSA layers start *local* (their positional attention peaks around offsets (±½, ±½), and σ(1) = 0.73 of the
# attention is positional), the SA blocks on top at the uniform value, the mean distance between two patches.
# The two ways of measuring agree closely at initialization, since with weights of standard deviation 0.02 no
# head reads content yet; they agree *exactly* on block 1 only, and chapter 26 shows how far apart they end up
# on trained models.

# %%
torch.manual_seed(0)
convit0 = create_model("convit_tiny", img_size=64, patch_size=8, embed_dim=48, num_heads=4, depth=6,
                       local_up_to_layer=4, num_classes=10)
images = torch.randn(8, 3, 64, 64)
true_inputs = model_nonlocality(convit0, images)
embeddings = model_nonlocality(convit0, images, inputs="embeddings")
uniform_value = patch_distances((8, 8)).mean()
print(f"mean distance of two patches on 8x8: {uniform_value:.3f}")
print(f"{'block':>5} {'true input':>11} {'embeddings':>11}")
for i, (a, b) in enumerate(zip(true_inputs.mean(1), embeddings.mean(1))):
    print(f"{i + 1:>5} {a:>11.3f} {b:>11.3f}")
torch.testing.assert_close(true_inputs[0], embeddings[0])
assert (true_inputs[:4].mean(1) < uniform_value - 2).all()  # GPSA blocks start local
torch.testing.assert_close(true_inputs[4:].mean(1), uniform_value.expand(2), atol=0.01, rtol=0)  # SA: uniform

# %%
#| export
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from convit_edu.checkpoints import read_state_dict
from convit_edu.gpsa import gate_values
from convit_edu.models import VisionTransformer


def _block_order(key: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\.(\d+)\.", f".{key}."))


def gates(source: VisionTransformer | Mapping | str | Path) -> Tensor:
    """σ(λ_h) (Eq. 7) of every GPSA layer, in block order, on the CPU: (num_gpsa_layers, num_heads).

    ``source`` is a model (its ``gates()``), or any checkpoint ``checkpoints.read_state_dict`` reads: a state dict,
    a ``convit-edu train`` or official checkpoint file, EMA weights.
    """
    if isinstance(source, VisionTransformer):
        values = source.gates()
    else:
        weights = read_state_dict(source)
        keys = sorted((k for k in weights if k.endswith("gating_param")), key=_block_order)
        values = torch.stack([gate_values(weights[k]) for k in keys]) if keys else torch.empty(0)
    if not len(values):
        raise ValueError("no gating_param found: a DeiT, or a ConViT whose positional layers are PSA, has no gates")
    return values.float().cpu()


# %% [markdown]
# At initialization every λ is 1, so every gate is σ(1) ≈ 0.731; from a state dict the same.

# %%
g0 = gates(convit0)
print(g0)
torch.testing.assert_close(g0, torch.full((4, 4), torch.sigmoid(torch.tensor(1.0)).item()))
torch.testing.assert_close(gates(convit0.state_dict()), g0)
torch.testing.assert_close(gates({"model": convit0.state_dict()}), g0)

# %% [markdown]
# ## Recording locality during training (Figs. 5 and 6)
#
# Figs. 5 and 6 follow the nonlocality of each layer and the gate of each head through training. A training
# callback (chapter 20's `Callback`) does it without touching the loop: `LocalityRecorder` keeps a fixed batch
# of images and, before training and every `every` optimiser steps, records `gates` and `model_nonlocality`
# (on the blocks' true inputs) in `records`; at the end it writes them as JSON, which `plot_nonlocality_history`
# and `plot_gate_history` draw in the paper's layout. On several processes only rank 0 records.

# %%
#| export
import json
from pathlib import Path

import torch
from matplotlib import colormaps
from matplotlib.figure import Figure
from torch import Tensor

from convit_edu.callbacks import Callback, TrainState
from convit_edu.checks import positive_int


class LocalityRecorder(Callback):
    """Record σ(λ) per head of every GPSA layer (the model's ``gates()``) and the nonlocality per head of every block
    (``model_nonlocality`` on the true inputs) on a fixed batch ``images``: before training, every ``every``
    optimiser steps and at the end. ``records`` holds one dict per point (step, epoch, gates, nonlocality).
    With ``path``, they are written there as JSON at every point, and a resumed run keeps the points its
    checkpoint had reached (those up to its step) and goes on from there."""

    def __init__(self, images: Tensor, every: int, path: str | Path | None = None) -> None:
        positive_int("every", every)  # optimiser steps
        self.images, self.every, self.path = images, every, Path(path) if path is not None else None
        self.records: list[dict] = []

    def _record(self, state: TrainState) -> None:
        if state.rank != 0 or (self.records and self.records[-1]["step"] == state.global_step):
            return
        model = state.model
        images = self.images.to(next(model.parameters()).device)
        self.records.append({
            "step": state.global_step,
            "epoch": state.global_step / state.steps_per_epoch,
            "gates": model.gates().tolist(),
            "nonlocality": model_nonlocality(model, images).tolist(),
        })
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.records) + "\n")
            tmp.replace(self.path)

    def on_train_begin(self, state: TrainState) -> None:
        if state.rank == 0 and self.path is not None and self.path.is_file() and state.global_step > 0:
            self.records = [r for r in read_locality(self.path) if r["step"] <= state.global_step]
        self._record(state)

    def on_step_end(self, state: TrainState) -> None:
        if state.global_step % self.every == 0:
            self._record(state)

    def on_train_end(self, state: TrainState) -> None:
        self._record(state)


def read_locality(path: str | Path) -> list[dict]:
    """Records written by ``LocalityRecorder``."""
    return json.loads(Path(path).read_text())


def _layer_colours(n: int) -> list:
    """``n`` colours from dark to light (viridis), one per layer, as the paper colours its layers."""
    return [colormaps["viridis"](i / max(n - 1, 1)) for i in range(n)]


def plot_nonlocality_history(histories: dict[str, list[dict]]) -> Figure:
    """Fig. 5: one panel per model (e.g. {"DeiT": records, "ConViT": records}), the nonlocality of each layer
    (mean over heads) against epochs, one line per layer; the panels share their y axis."""
    fig = Figure(figsize=(4 * len(histories), 3.2), dpi=80)
    axes = fig.subplots(1, len(histories), sharey=True, squeeze=False)[0]
    for ax, (name, records) in zip(axes, histories.items()):
        epochs = [r["epoch"] for r in records]
        per_layer = torch.tensor([r["nonlocality"] for r in records]).mean(-1)  # (points, depth)
        colours = _layer_colours(per_layer.shape[1])
        for layer in range(per_layer.shape[1]):
            ax.plot(epochs, per_layer[:, layer], color=colours[layer], label=f"layer {layer + 1}")
        ax.set(title=name, xlabel="epochs")
    axes[0].set_ylabel("nonlocality (patches)")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def plot_gate_history(records: list[dict]) -> Figure:
    """Fig. 6: one panel per gated layer, σ(λ_h) of each head (coloured) and their mean (black) over epochs."""
    epochs = [r["epoch"] for r in records]
    values = torch.tensor([r["gates"] for r in records])  # (points, layers, heads)
    layers, heads = values.shape[1:]
    fig = Figure(figsize=(2.4 * layers, 2.6), dpi=80)
    axes = fig.subplots(1, layers, sharey=True, squeeze=False)[0]
    for layer, ax in enumerate(axes):
        for head in range(heads):
            ax.plot(epochs, values[:, layer, head], linewidth=1, alpha=0.8)
        ax.plot(epochs, values[:, layer].mean(-1), color="black", linewidth=2)
        ax.set(title=f"layer {layer + 1}", xlabel="epochs", ylim=(0, 1))
    axes[0].set_ylabel("positional attention σ(λ)")
    fig.tight_layout()
    return fig


def plot_gates(values: Tensor, title: str = "σ(λ) per head") -> Figure:
    """A (layers, heads) heat map of the gates, values written in the cells: red is positional, white content."""
    values = values.detach().float().cpu()
    fig = Figure(figsize=(1 + 0.6 * values.shape[1], 0.8 + 0.45 * values.shape[0]), dpi=80)
    ax = fig.subplots()
    ax.imshow(values, cmap="Reds", vmin=0, vmax=1)
    for (layer, head), v in zip(torch.cartesian_prod(*map(torch.arange, values.shape)).tolist(), values.flatten()):
        ax.text(head, layer, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white" if v > 0.6 else "black")
    ax.set(xticks=range(values.shape[1]), xticklabels=[str(h + 1) for h in range(values.shape[1])],
           yticks=range(values.shape[0]), yticklabels=[str(i + 1) for i in range(values.shape[0])],
           xlabel="head", ylabel="layer", title=title)
    fig.tight_layout()
    return fig

# %% [markdown]
# ## Recording a training run
#
# Everything above works on any model. First the recorder on a real run: we train a small DeiT and ConViT — width
# 48, 4 heads, 6 blocks, the ConViT's first 4 blocks GPSA (the experiments of chapters 27-29 are wider, with 9
# heads) — on the first 10 classes of the shared Tiny ImageNet subset at 64 px in 8-px patches (synthetic images
# when the subset is absent), with DeiT's recipe, recording locality every few steps. One thread is as fast as two
# for models this small and does not fight the data-loader worker for the cores. In full mode each model gets one
# epoch of the 5 000 images (78 steps, about a minute each on a free core); FAST mode trains one step on 2 % of
# them, enough to run every cell.

# %%
from dataclasses import replace

from convit_edu.augment import build_transforms
from convit_edu.config import TrainConfig
from convit_edu.datasets import build_datasets, first_classes
from convit_edu.training import train

torch.set_num_threads(1)
data = first_classes("../../shared/data/tiny-imagenet-100.tar.gz", "../data/tiny-imagenet-100-first10", 10,
                     num_train=5000, num_val=500, image_size=64)
size = dict(patch_size=8, embed_dim=48, num_heads=4, depth=6)
base = TrainConfig(model="deit_tiny", model_args=size, img_size=64, **data, epochs=1,
                   fraction=0.02 if FAST else 1.0, batch_size=64, lr=8e-3, warmup_epochs=0.5, precision="fp32",
                   num_workers=1, seed=0, progress="none", output="runs/25_deit")
configs = {"DeiT": base,
           "ConViT": replace(base, model="convit_tiny", model_args={**size, "local_up_to_layer": 4},
                             output="runs/25_convit")}
_, val_tf = build_transforms(base.aug_config())
_, val_set, classes = build_datasets(base.data, base.data_root, val_transform=val_tf, max_classes=None,
                                     download=False, **base.data_args)
probe = torch.stack([val_set[i][0] for i in range(0, len(val_set), len(val_set) // 64)][:64])  # 64 val images
print(len(classes), "classes,", len(val_set), "validation images; probe batch", tuple(probe.shape))

# %%
# NBVAL_IGNORE_OUTPUT
import time

recorders = {}
for name, cfg in configs.items():
    recorders[name] = LocalityRecorder(probe, every=2 if FAST else 6, path=Path(cfg.output) / "locality.json")
    t0 = time.perf_counter()
    result = train(cfg, callbacks=[recorders[name]])
    print(f"{name}: {time.perf_counter() - t0:.0f} s, top-1 {result.history[-1]['val_top1']:.1f}% after "
          f"{cfg.epochs} epoch(s), {len(recorders[name].records)} locality records")

# %% [markdown]
# The recorder saw the model before the first step and every 6 steps after (every 2 in FAST mode), and wrote
# its records beside the run's logs; reading them back gives the same records:

# %%
for name, rec in recorders.items():
    first = rec.records[0]
    steps = [r["step"] for r in rec.records]
    assert steps[0] == 0 and steps == sorted(set(steps)) and all(s % rec.every == 0 for s in steps[1:-1])
    assert read_locality(Path(configs[name].output) / "locality.json") == rec.records
    assert len(first["nonlocality"]) == 6 and len(first["nonlocality"][0]) == 4
    print(f"{name}: layers x heads of nonlocality {len(first['nonlocality'])} x {len(first['nonlocality'][0])}, "
          f"gated layers {len(first['gates'])}")
assert recorders["DeiT"].records[0]["gates"] == [] and len(recorders["ConViT"].records[0]["gates"]) == 4

# %% [markdown]
# ### Fig. 5: nonlocality during training
#
# The paper (Fig. 5, DeiT-S and ConViT-S, 300 epochs on ImageNet, a 14 × 14 grid): every DeiT layer starts
# near the uniform value and **falls** in the first epochs — SA layers are pulled towards locality — after
# which the upper layers climb back up (long-range dependencies) while the lower ones stay local. The ConViT's
# GPSA layers start local and **rise**: they escape locality, but end below the DeiT.

# %%
# NBVAL_IGNORE_OUTPUT
plot_nonlocality_history({name: rec.records for name, rec in recorders.items()})

# %% [markdown]
# ### Fig. 6: the gates during training
#
# In the paper every layer's mean gate E_h σ(λ_h) falls during training: the ConViT shifts attention from
# position to content. By the end layers 6-10 of the ConViT-S ignore position, while some heads of layers 1-5
# keep a high gate; ConViT-Ti uses position up to layer 4.

# %%
# NBVAL_IGNORE_OUTPUT
plot_gate_history(recorders["ConViT"].records)

# %% [markdown]
# One epoch is 78 steps; the paper's curves span 375 000. So the curves above show the instrument more than the
# phenomenon: in one epoch the attention hardly leaves where it started. Chapter 26 reads the same instruments
# on models trained 48 times longer, and adds attention maps and masking at test time.

# %% [markdown]
# ## Exercises
#
# **1. A box blur's nonlocality.** A head whose queries attend equally to the patches of their 3 × 3 window
# (themselves included, clipped at the grid's edges) is a 3 × 3 box blur. On the 3 × 3 grid above, predict its
# nonlocality by hand (the distances printed above help), then build the (9, 9) map and check with
# `nonlocality`. Set `D_box`. Is it above or below the neighbour head's 1?

# %% tags=["solution"] jupyter={"source_hidden": true}
rows_cols = torch.tensor([divmod(q, 3) for q in range(L)])
box = ((rows_cols[:, None] - rows_cols[None]).abs().amax(-1) <= 1).float()  # the 3 × 3 window of each query
box = box / box.sum(-1, keepdim=True)  # 4 patches for a corner query, 6 for an edge one, 9 for the centre
D_box = nonlocality(box[None], grid).item()
assert abs(D_box - (4 * (2 + 2**0.5) / 4 + 4 * (3 + 2 * 2**0.5) / 6 + (4 + 4 * 2**0.5) / 9) / 9) < 1e-6  # by hand
print(f"D_box = {D_box:.3f} patches: below 1, since every query spends part of its attention on itself")

# %%
# your answer: D_box = ...

# %%
from convit_edu.checks import WrongAnswer, check_answer


def check_D_box(answer: float) -> None:
    cells = torch.tensor([divmod(q, 3) for q in range(9)])
    window = ((cells[:, None] - cells[None]).abs().amax(-1) <= 1).float()
    want = nonlocality((window / window.sum(-1, keepdim=True))[None], (3, 3)).item()
    check_answer(abs(float(answer) - want) < 1e-3, "the window is clipped at the edges: a corner query spreads "
                 "its attention over 4 patches, an edge query over 6, only the centre query over 9; each query's "
                 "attention sums to 1, and Eq. 8 averages over all 9 queries")


check_D_box(D_box)
print(expect_error(lambda: check_D_box((4 + 4 * 2**0.5) / 9), WrongAnswer))  # the centre query's alone

# %% [markdown]
# **2. The heads of a fresh GPSA layer.** With 9 heads (as in chapters 27–29) the convolutional initialization
# centres the heads on a 3 × 3 stencil, `head_centres(9)`. Predict: which head of the first GPSA layer is the
# most local, which four the least? Then build the model with seed 0, `create_model("convit_tiny", img_size=64,
# patch_size=8, embed_dim=72, num_heads=9, depth=6, local_up_to_layer=4, num_classes=10, locality_strength=2.0)`,
# and from `model_nonlocality` on the `images` above set `most_local` (a head number, from 1) and `least_local`
# (a set of four).

# %% tags=["solution"] jupyter={"source_hidden": true}
torch.manual_seed(0)
convit9 = create_model("convit_tiny", img_size=64, patch_size=8, embed_dim=72, num_heads=9, depth=6,
                       local_up_to_layer=4, num_classes=10, locality_strength=2.0)
per_head = model_nonlocality(convit9, images)[0]  # layer 1: (9,)
most_local = int(per_head.argmin()) + 1
least_local = {int(h) + 1 for h in per_head.topk(4).indices}
centres = head_centres(9)
print(f"most local: head {most_local}, centred at {centres[most_local - 1].tolist()} (on the query)")
print(f"least local: heads {sorted(least_local)}, centred at {[centres[h - 1].tolist() for h in sorted(least_local)]}")
# σ(1) of the attention is positional; the other 0.27 is near uniform at init, which bounds how local any head is
assert per_head.min() > (1 - torch.sigmoid(torch.tensor(1.0))) * uniform_value - 0.1

# %%
# your answer: most_local, least_local = ..., {...}

# %%
def check_heads(most: int, least: set[int]) -> None:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = create_model("convit_tiny", img_size=64, patch_size=8, embed_dim=72, num_heads=9, depth=6,
                             local_up_to_layer=4, num_classes=10, locality_strength=2.0)
    per_head = model_nonlocality(model, images)[0]
    check_answer(most == int(per_head.argmin()) + 1, "the most local head is the one centred on the query "
                 "itself: find the centre (0, 0) in head_centres(9), and number heads from 1")
    check_answer(set(least) == {int(h) + 1 for h in per_head.topk(4).indices}, "the least local heads are the "
                 "ones whose centre is farthest from the query: the corners of the stencil, at distance √2")


check_heads(most_local, least_local)
print(expect_error(lambda: check_heads(most_local, {2, 4, 6, 8}), WrongAnswer))
