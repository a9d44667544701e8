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
# # Gated positional self-attention (GPSA): the reference
#
# Chapter 02 built positional self-attention (PSA, Eq. 4), where content and position scores are *summed*
# before one softmax; chapter 03 initialised the positional part like a convolution (Eq. 5). This chapter
# builds the ConViT's layer, **gated** positional self-attention (Eq. 6–7), as a *reference* that writes the
# attention matrix down exactly as the paper does, and looks at it at initialisation; chapter 06 moves its gate.
# It exports `convit_edu/gpsa_reference.py`: the parts every positional layer shares, with the parameter names
# of the official checkpoints (`qk`, `v`, `proj`, `pos_proj`, `gating_param`), the gate, and `GPSAReference`.
# Chapter 07 builds the fast GPSA that the models train with, and PSA as a module, on the same parts.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpsa_reference
# Gated positional self-attention (GPSA, Eq. 6-7) computed literally, its attention matrix materialised: the
# reference that the fast GPSA is tested against.

# %%
import matplotlib.pyplot as plt
import torch

from convit_edu.checks import check_answer, expect_error
from convit_edu.conv_init import head_centres

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Eq. 6–7: two softmaxes and a gate
#
# In PSA a head whose positional scores are large simply drowns its content scores: both live in one softmax,
# and their balance depends on their scales. GPSA separates them. For head h,
#
# $$\mathbf{A}^h_{ij} = \big(1-\sigma(\lambda_h)\big)\,
#   \operatorname{softmax}_j\!\Big(\frac{\mathbf{Q}^h_i\mathbf{K}^{h\top}_j}{\sqrt{D_h}}\Big)
#   + \sigma(\lambda_h)\,\operatorname{softmax}_j\!\big(\mathbf{v}^{h\top}_{pos}\mathbf{r}_{ij}\big)
#   \qquad\text{(Eq. 7)}$$
#
# (the paper writes Eq. 7 without the 1/√D_h; the official code, and ours, scale the content scores as Eq. 1
# does, as chapter 02 noted for Eq. 4), followed by
# $\mathbf{A}^h_{ij} \leftarrow \mathbf{A}^h_{ij} / \sum_j \mathbf{A}^h_{ij}$ (Eq. 6's normalisation) and
# $\mathrm{GPSA}_h(\mathbf{X}) = \mathbf{A}^h\mathbf{X}\mathbf{W}^h_{val}$. The gate σ(λ_h) ∈ (0, 1) is a learnable
# *per-head* mixing weight: σ → 1 gives a purely positional (convolution-like) head, σ → 0 a purely content-based
# (ViT-like) head. The ConViT starts every λ_h at 1, so σ(1) ≈ 0.73: the layers begin mostly positional, i.e. mostly
# convolutional, and training decides where each head goes. A hand-sized example: one head, three tokens.

# %%
content_scores = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0], [0.0, 1.0, 3.0]])
position_scores = torch.tensor([[0.0, -1.0, -4.0], [-1.0, 0.0, -1.0], [-4.0, -1.0, 0.0]])  # −‖δ‖², Eq. 5
gate = torch.sigmoid(torch.tensor(1.0))
A = (1 - gate) * content_scores.softmax(-1) + gate * position_scores.softmax(-1)
print(f"sigma(lambda=1) = {gate:.4f}")
print("content attention:\n", content_scores.softmax(-1))
print("positional attention:\n", position_scores.softmax(-1))
print("gated attention A:\n", A)

# %% [markdown]
# ## Why the normalisation is a no-op
#
# Each softmax has rows that sum to one, and the gate mixes them with weights (1 − σ) and σ that also sum to
# one. So every row of A is a convex combination of two probability vectors and sums to one already:
# $\sum_j A_{ij} = (1-\sigma) \cdot 1 + \sigma \cdot 1 = 1$. Dividing by the row sum divides by one. The
# official code performs the division anyway; it changes nothing but rounding, and the fast implementation
# of chapter 07 leaves it out. (A check of row sums here would only repeat this algebra; the one that could fail is
# chapter 07's: its fast layer, without the division, against this chapter's reference, with it.)

# %% [markdown]
# ## The class token has no position
#
# The positional scores need a relative position δ for every pair (query, key): `rel_indices` has one row per
# *patch* of the H × W grid. The class token is not a patch: it has no place on the grid, so there is no δ
# between it and anything, and a GPSA layer cannot give it a positional score. (Inventing one would also
# pull the class token towards whatever patch that position points at, the opposite of its job of
# summarising the whole image.) The ConViT's answer (Fig. 4 of the paper) is to keep the class token out of
# the GPSA layers altogether and **concatenate it to the patches after the last GPSA block**; the remaining
# blocks are plain MHSA (chapter 01), which needs no positions. Our GPSA layers therefore accept exactly
# H·W tokens and say so when handed one more, as the cell after the implementation checks.
#
# ## The shared parts
#
# Both GPSAs (this chapter's reference, chapter 07's fast one) and PSA have the same projections, the same positional
# scores and the same grid handling. `qk` maps to queries and keys, `v` to the values (two layers, as in the official
# checkpoints; the forward stacks their weights and computes all three in one matmul), `pos_proj` maps the 3 channels
# of r_δ = (δx, δy, ‖δ‖²) to one score per head (its weight rows are the v_pos of Eq. 5), and `proj` mixes the heads.
# The positional scores of every head and every (query, key) pair come out of one product, v_pos·r_δ + b for all L²
# pairs at once, laid out heads first, (heads, L, L), as the softmax and the products after it read them. `rel_indices`
# is a buffer that is *not* saved in checkpoints. A layer told its grid at construction (`grid_size=(rows, cols)`, as
# the ConViT of chapter 09 does) builds it there, so the first forward finds it ready: a forward that assigns a new
# tensor to a buffer is one graph for `torch.compile` and the forwards after it another, which costs a second
# compilation. A layer built without a grid builds it at its first forward. Either way it is rebuilt when a forward
# sees another grid, and whenever the device or dtype of the layer changes, so a model moved to another device or dtype
# after a forward pass keeps working (the official code caches it for one device and size).
#
# Initialisation has one home, `init_weights`, which the constructor calls: DeiT's normal(0, 0.02) for the linear maps
# (what the whole model gives every other linear map, chapter 09), then Eq. 5 — chapter 03's `local_init` — for
# `pos_proj` and `v`. A model built of these layers does not initialise them again. These base classes,
# `PositionalAttention` and the gated `GatedAttention`, are the module `convit_edu.gated_attention`. On a CPU their
# positional softmax sets P's denormal numbers (below about 10⁻³⁸ in fp32) to zero, which changes no sum but spares the
# CPU its slow path for them (chapter 31 measures it); a GPU computes with them at full speed, and there P is the plain
# softmax.

# %%
#| export gated_attention
# The base classes of the positional attention layers: `PositionalAttention` (projections, positional scores, grid,
# Eq. 5's init), shared by PSA and both GPSAs, and `GatedAttention`, which adds the gate of Eq. 7.

# %%
#| export gated_attention
import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from convit_edu.checks import positive_int
from convit_edu.conv_init import local_init
from convit_edu.positional import rel_indices


class _SoftmaxWithoutDenormals(torch.autograd.Function):
    """Softmax over the last dim with denormal entries set to 0 in its output and in the gradient it sends back."""

    @staticmethod
    def forward(ctx, scores: Tensor) -> Tensor:
        probs = flush_denormals(scores.softmax(dim=-1))
        ctx.save_for_backward(probs)  # the flushed P: softmax's own backward would reuse the unflushed one
        return probs

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (probs,) = ctx.saved_tensors
        # softmax's Jacobian applied, P ⊙ (g − ⟨g, P⟩), by the kernel that softmax's own backward calls
        return flush_denormals(torch._softmax_backward_data(grad, probs, -1, probs.dtype))


def flush_denormals(x: Tensor) -> Tensor:
    """``x`` with every denormal entry set to 0, in one operation: ``hardshrink`` at the largest denormal number
    (``tiny·(1 − eps)``) keeps exactly the entries whose magnitude is at least ``finfo.tiny``."""
    info = torch.finfo(x.dtype)
    return F.hardshrink(x, info.tiny * (1 - info.eps))


def softmax_without_denormals(scores: Tensor) -> Tensor:
    """``scores.softmax(-1)`` with every denormal number (below about 1.2e-38 in fp32) set to 0, in the forward
    and in the backward pass: such numbers change no sum they enter, but x86 CPUs multiply them many times
    slower (chapter 31, "Denormal numbers")."""
    return _SoftmaxWithoutDenormals.apply(scores)


def _grid(length: int, grid_size: tuple[int, int] | None) -> tuple[int, int]:
    """The patch grid (rows, cols) of a sequence of ``length`` patch tokens; a clear error when they differ."""
    if grid_size is None:
        side = math.isqrt(length)
        if side * side != length:
            raise ValueError(
                f"sequence length {length} is not a square number of patches: pass grid_size=(rows, cols) "
                "for a non-square grid (and note that GPSA layers take patch tokens only, no class token)"
            )
        return side, side
    rows, cols = grid_size
    if rows * cols != length:
        raise ValueError(
            f"sequence length {length} does not match grid_size {tuple(grid_size)} = {rows * cols} patches "
            "(GPSA layers take the patch tokens only: the class token joins after the last GPSA block)"
        )
    return rows, cols


class PositionalAttention(nn.Module):
    """What GPSA (Eq. 6-7) and PSA (Eq. 4) share: projections, relative positions, positional scores.

    The base of ``GPSAReference`` and of chapter 07's ``GPSA`` and ``PSA``: the maps ``qk``, ``v``, ``proj`` and
    ``pos_proj`` (v_pos of Eq. 5), the ``rel_indices`` buffer of the patch grid (built for ``grid_size`` at
    construction when given, else at the first forward) and ``init_weights``; a subclass writes ``forward``.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        qkv_bias: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        locality_strength: float = 1.0,
        use_local_init: bool = True,
        grid_size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        if positive_int("embed_dim", embed_dim) % positive_int("num_heads", num_heads):
            raise ValueError(
                f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}: embed_dim = num_heads * head_dim"
            )
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.locality_strength, self.use_local_init = locality_strength, use_local_init
        self.qk = nn.Linear(embed_dim, 2 * embed_dim, bias=qkv_bias)
        self.v = nn.Linear(embed_dim, embed_dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.pos_proj = nn.Linear(3, num_heads)
        self.register_buffer("rel_indices", None, persistent=False)
        self._grid_size: tuple[int, int] | None = None
        if grid_size is not None:  # now: a forward that builds it is a graph that compile does not reuse
            rows, cols = grid_size
            self._relative_positions((positive_int("grid height", rows), positive_int("grid width", cols)))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """The ConViT's initialisation of the layer: DeiT's normal(0, 0.02) for every linear map, biases 0; then
        Eq. 5 (``local_init`` with α = ``locality_strength``) for ``pos_proj`` and ``v`` unless ``use_local_init``
        is False. The constructor calls it; a model built of these layers leaves them to it."""
        for linear in (self.qk, self.v, self.proj, self.pos_proj):
            nn.init.normal_(linear.weight, std=0.02)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        if self.use_local_init:
            local_init(self.pos_proj, self.v, self.locality_strength)

    def _projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values, each (B, heads, L, head_dim), from one product of ``x`` with ``qk`` and ``v``
        stacked (one GEMM, not two)."""
        bias = None if self.qk.bias is None else torch.cat([self.qk.bias, self.v.bias])
        qkv = F.linear(x, torch.cat([self.qk.weight, self.v.weight]), bias)
        qkv = rearrange(qkv, "b l (three h d) -> b l three h d", three=3, h=self.num_heads)
        # split where `three` lies (unbind), not moved to the front first: the backward then stacks the three
        # gradients straight into the product's layout, one copy where the moved split makes two
        q, k, v = (rearrange(t, "b l h d -> b h l d") for t in qkv.unbind(2))
        return q, k, v

    def _relative_positions(self, grid_size: tuple[int, int]) -> Tensor:
        """``rel_indices`` of the grid, (L, L, 3), on the device and dtype of ``pos_proj``: rebuilt when they change."""
        weight, rel = self.pos_proj.weight, self.rel_indices
        # (rows, cols) is remembered too: a 7x12 and a 12x7 grid have rel_indices of the same shape
        if rel is None or self._grid_size != grid_size or (rel.device, rel.dtype) != (weight.device, weight.dtype):
            self.rel_indices = rel = rel_indices(*grid_size, device=weight.device, dtype=weight.dtype)
            self._grid_size = grid_size
        return rel

    def positional_scores(self, grid_size: tuple[int, int]) -> Tensor:
        """v_pos^T r_δ + b for every head and (query, key) pair, (heads, L, L): one product per forward, not per
        sample, laid out heads first (``pos_proj`` applied to ``rel_indices`` as W_pos·rᵀ + b)."""
        rel = self._relative_positions(grid_size)
        length = rel.shape[0]
        # outside autocast: in bf16, ‖δ‖² up to hundreds would lose whole units of score before the softmax
        with torch.autocast(rel.device.type, enabled=False):
            scores = torch.addmm(self.pos_proj.bias[:, None], self.pos_proj.weight, rel.view(-1, 3).T)
        return scores.view(self.num_heads, length, length)

    def positional_softmax(self, grid_size: tuple[int, int]) -> Tensor:
        """P = softmax over keys of the positional scores, (heads, L, L), in at least fp32 (also under autocast);
        on a CPU without denormal numbers in P or in its gradient (`softmax_without_denormals`)."""
        scores = self.positional_scores(grid_size)
        if torch.finfo(scores.dtype).bits < 32:  # pos_proj in bf16 or fp16 (a model cast whole): the softmax in fp32
            scores = scores.float()
        # a CPU multiplies denormal numbers in micro-code, a GPU at full speed: only a CPU needs the flush
        return softmax_without_denormals(scores) if scores.device.type == "cpu" else scores.softmax(dim=-1)

    def _check_input(self, x: Tensor, grid_size: tuple[int, int] | None) -> tuple[int, int]:
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"{type(self).__name__} expects x of shape (batch, patches, embed_dim={self.embed_dim}), "
                f"got {tuple(x.shape)}"
            )
        return _grid(x.shape[1], grid_size)

    def _output(self, heads_out: Tensor) -> Tensor:
        return self.proj_drop(self.proj(rearrange(heads_out, "b h l d -> b l (h d)")))


def gate_values(gating_param: Tensor, gate_override: float | None = None) -> Tensor:
    """The gate of Eq. 7: σ(λ_h) for each head's ``gating_param`` λ_h; the constant ``gate_override`` for every
    head instead when it is set (SM F masking at test time)."""
    if gate_override is not None:
        return torch.full_like(gating_param, float(gate_override))
    return torch.sigmoid(gating_param)


class GatedAttention(PositionalAttention):
    """``PositionalAttention`` with the gate of Eq. 7: ``gating_param`` λ (one per head, initialised to 1), a
    test-time ``gate_override`` and Eq. 7's mixed attention matrix; the base of ``GPSAReference`` and of chapter
    07's fast ``GPSA``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gating_param = nn.Parameter(torch.ones(self.num_heads))
        self.gate_override: float | None = None

    def gate(self) -> Tensor:
        """σ(λ_h) per head, (heads,), as the forward mixes with it: ``gate_values`` of this layer's λ and override."""
        return gate_values(self.gating_param, self.gate_override)

    def _mixed_attention(self, q: Tensor, k: Tensor, grid: tuple[int, int]) -> Tensor:
        content = (q @ k.transpose(-2, -1) * self.head_dim**-0.5).softmax(dim=-1)
        position = self.positional_softmax(grid).to(content.dtype)
        sigma = self.gate().to(content.dtype).view(-1, 1, 1)
        return (1 - sigma) * content + sigma * position


# %% [markdown]
# ## The reference GPSA
#
# Exactly the equations: both softmaxes materialised as (B, heads, L, L) tensors, mixed, normalised (the
# no-op, kept here to stay literally faithful to Eq. 6), attention dropout on A, then A·V. This is the
# computation of the official code and of timm but for one thing: they expand `rel_indices` to the batch and
# so compute the positional softmax once per *image*, where it is the same for every image; here it is
# computed once per forward (chapter 30 measures what that saves). It is what to read, what to
# use for attention maps, and the yardstick chapter 07's fast version is tested against.

# %%
#| export
from torch import Tensor

from convit_edu.gated_attention import GatedAttention


class GPSAReference(GatedAttention):
    """Gated positional self-attention, Eq. 6-7, computed literally: the attention matrix is materialised.

    ``forward(x, grid_size=None, return_attention=False)``: ``x`` holds the patch tokens (B, L = rows·cols, D)
    of a ``grid_size`` = (rows, cols) grid (square when None). Parameters: ``qk``, ``v``, ``proj``,
    ``pos_proj`` (v_pos of Eq. 5, convolutional init with ``locality_strength`` α unless
    ``use_local_init=False``) and ``gating_param`` (λ, one per head, initialised to 1). The constructor's
    ``grid_size``, when given, builds the ``rel_indices`` buffer for that grid at once (else: at the first
    forward); a forward on another grid rebuilds it.
    """

    def forward(
        self, x: Tensor, grid_size: tuple[int, int] | None = None, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        grid = self._check_input(x, grid_size)
        q, k, v = self._projections(x)
        attn = self._mixed_attention(q, k, grid)
        attn = attn / attn.sum(dim=-1, keepdim=True)  # Eq. 6's normalisation: a no-op up to rounding
        y = self._output(self.attn_drop(attn) @ v)
        return (y, attn) if return_attention else y


# %%
# the class token has no place here: a 14 × 14 grid has 196 patches, and 197 tokens are refused, saying why
print(expect_error(lambda: GPSAReference(192, 4)(torch.randn(1, 197, 192))))

# %% [markdown]
# ## What the layer looks like at initialisation
#
# With the convolutional init (α = 1) each of the 4 heads attends around its own offset Δ_h of a 2 × 2
# kernel (half-integer centres, chapter 03), and σ(1) ≈ 0.73 of every head's attention is that positional
# part. The maps below are the full gated attention of a query in the middle of a 14 × 14 grid, for random
# input tokens: the positional bump dominates, the content part adds a faint uniform-ish floor. The peaks sit
# at the query (7, 7) plus an offset of (Δy, Δx) ∈ {−½, +½}² rounded to the grid: a 2 × 2 kernel around it.

# %%
torch.manual_seed(0)
layer = GPSAReference(192, 4)
with torch.no_grad():
    _, attn = layer(torch.randn(1, 196, 192), return_attention=True)
query = 7 * 14 + 7
fig, axes = plt.subplots(1, 4, figsize=(9, 2.6), dpi=80)
for h, ax in enumerate(axes):
    ax.imshow(attn[0, h, query].reshape(14, 14), cmap="viridis")
    ax.scatter([7], [7], marker="x", color="red", s=20)
    ax.set_title(f"head {h}, σ={layer.gate()[h]:.2f}", fontsize=9)
    ax.set_xticks([]), ax.set_yticks([])
plt.suptitle("GPSA at init: gated attention of the query marked ×", fontsize=10)
plt.tight_layout()
plt.show()
peaks = attn[0, :, query].argmax(-1)
print("peak (row, col) per head:", [(int(p) // 14, int(p) % 14) for p in peaks])
centres = head_centres(4)
for h, p in enumerate(peaks):
    row, col = int(p) // 14, int(p) % 14
    dx, dy = centres[h].tolist()
    assert abs(col - 7 - dx) <= 0.5 and abs(row - 7 - dy) <= 0.5, (h, row, col, dx, dy)
print("every head peaks within half a patch of query + Δ_h")

# %% [markdown]
# ## Exercises
#
# **1. A GPSA layer from scratch.** Write `my_gpsa(layer, x, rows, cols)`: the output of the GPSA layer
# `layer` on tokens `x` (B, L, D) of a rows × cols grid, from Eq. 6-7 and the layer's weights (`layer.qk`,
# `layer.v`, `layer.pos_proj`, `layer.gating_param`, `layer.proj`), with the relative positions r_ij =
# (δx, δy, ‖δ‖²), δ = key − query (δx the column offset, tokens row by row), built by hand — no
# `rel_indices`, no method of the layer. The content scores carry the 1/√D_h. (Chapter 07 builds the fast GPSA
# the models use; your layer is checked against this chapter's reference.)

# %%
my_gpsa = ...  # your answer: def my_gpsa(layer, x, rows, cols): ...

# %%
import copy
import functools
import math

from convit_edu.checks import demonstrate, grade, reveal


@torch.no_grad()
def as_if(layer: GPSAReference, x: torch.Tensor, rows: int, cols: int, slip: str = "") -> torch.Tensor:
    """The output of a copy of `layer` changed so that its forward makes `slip` (none: the layer's own output)."""
    layer = copy.deepcopy(layer)
    w = layer.pos_proj.weight
    if slip == "no 1/√D_h":
        layer.head_dim = 1  # the forward divides the scores by √head_dim
    elif slip == "σ on the content":
        layer.gating_param.neg_()  # σ(−λ) = 1 − σ(λ)
    elif slip == "δ = query − key":
        w[:, :2] = -w[:, :2]
    elif slip == "δx from the rows":
        w[:, :2] = w[:, [1, 0]].clone()
    return layer(x, grid_size=(rows, cols))


def check_gpsa(fn) -> None:
    torch.manual_seed(0)
    for rows, cols in ((4, 4), (3, 5)):
        random = GPSAReference(48, 4, locality_strength=1.0).eval()
        with torch.no_grad():  # random positional weights and gates, so that every term counts
            random.pos_proj.weight.normal_(), random.gating_param.normal_()
            x = torch.randn(2, rows * cols, 48)
            got = fn(random, x, rows, cols)

        def like(slip: str = "") -> bool:
            want = as_if(random, x, rows, cols, slip)
            return ((got - want).norm() / want.norm()).item() < 1e-5

        check_answer(not like("no 1/√D_h"), "the content scores are q·k/√D_h: divide by the square root of the head's "
                     "width before the softmax")
        check_answer(not like("σ on the content"), "σ(λ) weighs the positional softmax and 1 − σ(λ) the content one "
                     "(σ → 1 is a convolution-like head)")
        check_answer(not like("δ = query − key"), "δ is key − query: the positional score of a key to the right of "
                     "the query uses δx > 0")
        check_answer(like(), f"on a {rows} × {cols} grid your output differs by more than a relative 1e-5: δx is the "
                     "column offset and δy the row offset of tokens numbered row by row")


grade("my_gpsa", my_gpsa, check_gpsa)
demonstrate(check_gpsa, {slip: lambda layer, x, rows, cols, slip=slip: as_if(layer, x, rows, cols, slip)
                         for slip in ("no 1/√D_h", "σ on the content", "δ = query − key", "δx from the rows")})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(my_gpsa):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def my_gpsa(layer: GPSAReference, x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        h = layer.num_heads
        q, k = rearrange(layer.qk(x), "b l (two h d) -> two b h l d", two=2, h=h)
        v = rearrange(layer.v(x), "b l (h d) -> b h l d", h=h)
        r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        xy = torch.stack([c.flatten(), r.flatten()], dim=-1).float()  # (L, 2): (column, row) of each token
        delta = xy[None, :, :] - xy[:, None, :]  # [query, key] = key − query
        rel = torch.cat([delta, (delta**2).sum(-1, keepdim=True)], dim=-1)  # (L, L, 3)
        content = (q @ k.transpose(-2, -1) / layer.head_dim**0.5).softmax(-1)
        position = rearrange(layer.pos_proj(rel), "q k h -> h q k").softmax(-1)
        sigma = torch.sigmoid(layer.gating_param).view(-1, 1, 1)
        attn = (1 - sigma) * content + sigma * position
        attn = attn / attn.sum(-1, keepdim=True)  # Eq. 6's normalisation (a no-op but for rounding)
        return layer.proj(rearrange(attn @ v, "b h l d -> b l (h d)"))

    grade("my_gpsa", my_gpsa, check_gpsa)

# %% [markdown]
# **2. The query's own tap at init.** A fresh head h is a *blurred* tap of a convolution: how much of a query's
# attention does the key at the tap itself, query + Δ_h, get? Write `tap_share(rows, cols, query, offset,
# alpha, sigma)`: for the query at (row, col) = `query` of a rows × cols grid and a head of centre `offset` =
# (Δx, Δy) (whole patches: the 3 × 3 kernel of a 9-head layer), that share from Eq. 5 and Eq. 7 (gate σ), the
# content attention uniform (equal content scores). Only the keys on the grid share the positional softmax.

# %%
tap_share = ...  # your answer: def tap_share(rows, cols, query, offset, alpha, sigma): ...

# %%
@functools.cache
def layer_attention(rows: int, cols: int, alpha: float, sigma: float) -> torch.Tensor:
    """The attention of a 9-head GPSA layer on a rows × cols grid whose content attention is uniform (q, k = 0)."""
    layer = GPSAReference(72, 9, locality_strength=alpha)
    with torch.no_grad():
        layer.qk.weight.zero_(), layer.gating_param.fill_(math.log(sigma / (1 - sigma)) if sigma < 1 else math.inf)
        return layer(torch.randn(1, rows * cols, 72), grid_size=(rows, cols), return_attention=True)[1][0]


def layer_share(rows: int, cols: int, query: tuple[int, int], offset: tuple, alpha: float, sigma: float) -> float:
    """What a right answer computes, measured on the layer: the share of the tap query + offset."""
    head = head_centres(9).tolist().index([float(offset[0]), float(offset[1])])
    tap = (query[0] + int(offset[1])) * cols + query[1] + int(offset[0])
    return layer_attention(rows, cols, alpha, sigma)[head, query[0] * cols + query[1], tap].item()


def check_tap_share(fn) -> None:
    at_init = torch.sigmoid(torch.tensor(1.0)).item()
    for alpha, sigma in ((1.0, at_init), (2.0, 0.5)):  # at init, then a sharper head with its gate at 1/2
        for dx, dy in head_centres(9).tolist():
            for row, col in ((7, 7), (1, 1), (12, 6)):  # mid-grid, and two queries whose softmax the border cuts
                want = layer_share(14, 14, (row, col), (dx, dy), alpha, sigma)
                got = fn(14, 14, (row, col), (dx, dy), alpha, sigma)
                where = f"head centred at {(dx, dy)}, query {(row, col)}, α = {alpha}: {got:.3f}, the layer gives {want:.3f}"
                if alpha != 1.0:
                    check_answer(abs(got - want) < 1e-5, f"{where}: use the α and σ you are given (the check also "
                                 "tries a sharper head with its gate at 1/2)")
                elif (row, col) == (7, 7):
                    check_answer(abs(got - want) < 1e-5, f"{where}: Eq. 7 mixes σ·(positional share) with "
                                 "(1 − σ)·(content share), the content share 1/L for each of the L keys")
                else:
                    check_answer(abs(got - want) < 1e-5, f"{where}: near the border fewer keys share the positional "
                                 "softmax: normalise over the keys on the grid only")


def plane_share(rows, cols, query, offset, alpha, sigma):  # a slip: the positional softmax over the whole plane
    positional = layer_share(rows + 16, cols + 16, (query[0] + 8, query[1] + 8), offset, alpha, 1.0)
    return sigma * positional + (1 - sigma) / (rows * cols)


grade("tap_share", tap_share, check_tap_share)
demonstrate(check_tap_share, {
    "the content part left out": lambda *a: layer_share(*a) - (1 - a[-1]) / (a[0] * a[1]),
    "the positional softmax over the whole plane": plane_share,
    "σ(1) and α = 1 taken as fixed": lambda *a: layer_share(*a[:4], 1.0, torch.sigmoid(torch.tensor(1.0)).item()),
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(tap_share):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def tap_share(rows: int, cols: int, query: tuple[int, int], offset: tuple, alpha: float, sigma: float) -> float:
        r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        dx, dy = (c - query[1]).flatten().double(), (r - query[0]).flatten().double()  # δ = key − query
        scores = alpha * (2 * offset[0] * dx + 2 * offset[1] * dy - dx**2 - dy**2)  # Eq. 5: v_pos · r_δ
        tap = (query[0] + int(offset[1])) * cols + query[1] + int(offset[0])
        return sigma * scores.softmax(0)[tap].item() + (1 - sigma) / (rows * cols)  # Eq. 7, content uniform

    share, positional = (tap_share(14, 14, (7, 7), (0, 0), 1.0, s) for s in (torch.sigmoid(torch.tensor(1.0)).item(), 1.0))
    print(f"the query's own tap at init: {share:.2f} of its head's attention, about a quarter (softmax: {positional:.2f})")
    grade("tap_share", tap_share, check_tap_share)
