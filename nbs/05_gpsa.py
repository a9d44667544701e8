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
# # Gated positional self-attention (GPSA), reference and fast
#
# Chapter 02 built positional self-attention (PSA, Eq. 4), where content and position scores are *summed*
# before one softmax; chapter 03 initialised the positional part like a convolution (Eq. 5). This chapter
# builds the ConViT's layer, **gated** positional self-attention (Eq. 6–7), twice: a *reference* version that
# writes the attention matrix down exactly as the paper does, and a *fast* version that gives the same
# numbers without ever building a batch × heads × L × L tensor. Both export to `convit_edu/gpsa.py`, with
# the parameter names of the official checkpoints (`qk`, `v`, `proj`, `pos_proj`, `gating_param`), together
# with a PSA module for the paper's App. A ablation.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpsa
# Gated positional self-attention (GPSA, Eq. 6-7): a reference that materializes the attention, and the fast form.
#
# Longer than most chapters: the paper's central layer in two forms, the checks that they agree, a picture of
# Eq. 7 and two exercises (its timing section moved to chapter 27).

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Eq. 6–7: two softmaxes and a gate
#
# In PSA a head whose positional scores are large simply drowns its content scores: both live in one softmax,
# and their balance depends on their scales. GPSA separates them. For head h,
#
# $$\mathbf{A}^h_{ij} = \big(1-\sigma(\lambda_h)\big)\,\operatorname{softmax}_j\!\Big(\frac{\mathbf{Q}^h_i\mathbf{K}^{h\top}_j}{\sqrt{D_h}}\Big)
#   + \sigma(\lambda_h)\,\operatorname{softmax}_j\!\big(\mathbf{v}^{h\top}_{pos}\mathbf{r}_{ij}\big) \qquad\text{(Eq. 7)}$$
#
# (the paper writes Eq. 7 without the 1/√D_h; the official code, and ours, scale the content scores as Eq. 1
# does, as chapter 02 noted for Eq. 4),
#
# followed by $\mathbf{A}^h_{ij} \leftarrow \mathbf{A}^h_{ij} / \sum_j \mathbf{A}^h_{ij}$ (Eq. 6's
# normalisation) and $\mathrm{GPSA}_h(\mathbf{X}) = \mathbf{A}^h\mathbf{X}\mathbf{W}^h_{val}$. The gate
# σ(λ_h) ∈ (0, 1) is a learnable *per-head* mixing weight: σ → 1 gives a purely positional (convolution-like)
# head, σ → 0 a purely content-based (ViT-like) head. The ConViT starts every λ_h at 1, so σ(1) ≈ 0.73: the
# layers begin mostly positional, i.e. mostly convolutional, and training decides where each head goes.
#
# A hand-sized example: one head, three tokens.

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
# below leaves it out. Checked on the example and on random scores and gates:

# %%
torch.testing.assert_close(A.sum(-1), torch.ones(3))
scores_c, scores_p, lam = torch.randn(2, 5, 7, 7), torch.randn(2, 5, 7, 7) * 3, torch.randn(5) * 4
sig = torch.sigmoid(lam).view(5, 1, 1)
A_rand = (1 - sig) * scores_c.softmax(-1) + sig * scores_p.softmax(-1)
torch.testing.assert_close(A_rand / A_rand.sum(-1, keepdim=True), A_rand)
assert (A_rand.sum(-1) - 1).abs().max() < 1e-6
print("row sums before normalising: 1 to within 1e-6, so the division changes only rounding")

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
# H·W tokens and say so when handed one more, as the cells after the implementation check.
#
# ## The shared parts
#
# Both implementations, and PSA, have the same projections, the same positional scores and the same grid
# handling. `qk` produces queries and keys in one matmul, `v` the values, `pos_proj` maps the 3 channels of
# r_δ = (δx, δy, ‖δ‖²) to one score per head (its weight rows are the v_pos of Eq. 5), and `proj` mixes the
# heads. `rel_indices` is a buffer that is *not* saved in checkpoints. A layer told its grid at construction
# (`grid_size=(rows, cols)`, as the ConViT of chapter 08 does) builds it there, so the first forward finds it
# ready: a forward that assigns a new tensor to a buffer is one graph for `torch.compile` and the forwards
# after it another, which costs a second compilation. A layer built without a grid builds it at its first
# forward. Either way it is rebuilt when a forward sees another grid, and whenever the device or dtype of the
# layer changes, so a model moved to another device or dtype after a forward pass keeps working (the official
# code caches it for one device and one size and breaks there).
#
# Initialisation has one home, `init_weights`, which the constructor calls: DeiT's normal(0, 0.02) for the
# linear maps (what the whole model gives every other linear map, chapter 08), then Eq. 5 — chapter 03's
# `local_init` — for `pos_proj` and `v`. A model built of these layers does not initialise them again.

# %%
#| export
import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from convit_edu.checks import positive_int
from convit_edu.conv_init import local_init
from convit_edu.positional import rel_indices


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


class _PositionalAttention(nn.Module):
    """What GPSA (Eq. 6-7) and PSA (Eq. 4) share: projections, relative positions, positional scores."""

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
        if grid_size is not None:  # built now: a forward that builds it is a graph torch.compile does not reuse
            self._relative_positions(tuple(grid_size))
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
        """Queries, keys and values, each (B, heads, L, head_dim)."""
        q, k = rearrange(self.qk(x), "b l (two h d) -> two b h l d", two=2, h=self.num_heads)
        v = rearrange(self.v(x), "b l (h d) -> b h l d", h=self.num_heads)
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
        """v_pos^T r_δ for every head and (query, key) pair, (heads, L, L): once per forward, not per sample."""
        rel = self._relative_positions(grid_size)
        # outside autocast: in bf16, ‖δ‖² up to hundreds would lose whole units of score before the softmax
        with torch.autocast(rel.device.type, enabled=False):
            return rearrange(self.pos_proj(rel), "q k h -> h q k")

    def positional_softmax(self, grid_size: tuple[int, int]) -> Tensor:
        """P = softmax over keys of the positional scores, (heads, L, L), in at least fp32 (also under autocast)."""
        scores = self.positional_scores(grid_size)
        return scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(dim=-1)

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

def gate_means(model: nn.Module) -> list[float]:
    """Mean σ(λ) over the heads of each layer of ``model`` that has a ``gating_param`` (Eq. 6), in layer order,
    as the forward mixes with them (``gate_override`` included): what a run logs and a recorder keeps."""
    return [gate_values(m.gating_param.detach().float(), getattr(m, "gate_override", None)).mean().item()
            for m in model.modules() if isinstance(getattr(m, "gating_param", None), torch.Tensor)]


class _Gated(_PositionalAttention):
    """Adds the gate of Eq. 7: ``gating_param`` λ (one per head, initialised to 1) and a test-time override."""

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
# computed once per forward (chapter 27 measures what that saves). It is what to read, what to
# use for attention maps, and the yardstick the fast version is tested against.

# %%
#| export
class GPSAReference(_Gated):
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


# %% [markdown]
# ## The fast GPSA
#
# Write A·V with Eq. 7 and distribute the product over the sum:
#
# $$\mathbf{A}^h\mathbf{V}^h = \big(1-\sigma_h\big)\,\underbrace{\operatorname{softmax}\!\big(\mathbf{Q}^h\mathbf{K}^{h\top}/\sqrt{d}\big)\mathbf{V}^h}_{\text{scaled dot-product attention}}
#   + \sigma_h\,\underbrace{\operatorname{softmax}\!\big(\mathbf{v}^{h\top}_{pos}\mathbf{r}\big)}_{\mathbf{P}^h\text{: no batch index}}\,\mathbf{V}^h .$$
#
# * The first term is ordinary attention: `F.scaled_dot_product_attention` computes it with a fused kernel
#   (flash attention on GPUs and on CPUs) that never stores the L × L matrix and saves only the output and
#   one number per row for the backward pass.
# * The second term's attention P does not depend on the image: it is one (heads, L, L) tensor for the whole
#   batch, computed **once per forward**. It is applied to all images at once by folding the batch into the
#   columns of V: (heads, L, L) @ (heads, L, B·d). (Writing `P @ V` with broadcasting over the batch looks
#   the same but makes torch expand P into one copy per image — and keep that copy for the backward pass.)
# * The gate mixes the two *outputs* (B, heads, L, head_dim), never two (B, heads, L, L) matrices; the
#   normalisation is dropped (it is the identity, shown above).
#
# Attention dropout on A cannot be split this way (one mask on the mixed matrix is not two masks on its
# parts), so in training with `attn_drop > 0` the fast class computes the reference form; the ConViT/DeiT
# recipe uses no attention dropout, so the fast path is what trains. Asking for the attention matrix
# (`return_attention=True`) also computes it explicitly — only then.

# %%
#| export
class GPSA(_Gated):
    """Gated positional self-attention, Eq. 6-7, fast: ``(1 − σ)·SDPA(Q, K, V) + σ·(P @ V)``.

    Same constructor, parameters, checkpoint keys and outputs as ``GPSAReference``; P = softmax of the
    positional scores is computed once per forward for the whole batch, and no (B, heads, L, L) tensor is built
    unless ``return_attention=True`` (or attention dropout is active in training).
    """

    def forward(
        self, x: Tensor, grid_size: tuple[int, int] | None = None, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        grid = self._check_input(x, grid_size)
        q, k, v = self._projections(x)
        if return_attention or (self.training and self.attn_drop.p > 0):
            attn = self._mixed_attention(q, k, grid)
            y = self._output(self.attn_drop(attn) @ v)
            return (y, attn) if return_attention else y
        content = F.scaled_dot_product_attention(q, k, v)
        pos_attn = self.positional_softmax(grid).to(v.dtype)  # P: (heads, L, L)
        # P @ V for the whole batch as one (heads, L, L) @ (heads, L, B·d) product: a broadcast
        # (heads, L, L) @ (B, heads, L, d) would expand P to one copy per image (and save it for backward)
        values = rearrange(v, "b h l d -> h l (b d)")
        position = rearrange(pos_attn @ values, "h l (b d) -> b h l d", b=v.shape[0])
        sigma = self.gate().to(v.dtype).view(-1, 1, 1)
        return self._output(torch.lerp(content, position, sigma))


# %% [markdown]
# `torch.lerp(content, position, σ)` is (1 − σ)·content + σ·position in one fused operation.
#
# ## PSA as a module (App. A ablation)
#
# The paper's App. A compares GPSA with plain positional self-attention (Eq. 4, chapter 02): content and
# positional scores summed inside *one* softmax, no gate. Its fast form is also one SDPA call: the positional
# scores (heads, L, L) are an additive float `attn_mask`, broadcast over the batch.

# %%
#| export
class PSA(_PositionalAttention):
    """Positional self-attention, Eq. 4: ``softmax(Q Kᵀ/√d + v_posᵀ r) V`` per head, with the Eq. 5 init.

    Same constructor, forward signature and checkpoint keys as ``GPSA`` minus ``gating_param``; computed with
    SDPA and the positional scores as an additive mask unless the attention matrix is asked for (or attention
    dropout is active in training).
    """

    def forward(
        self, x: Tensor, grid_size: tuple[int, int] | None = None, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        grid = self._check_input(x, grid_size)
        q, k, v = self._projections(x)
        scores = self.positional_scores(grid).to(q.dtype)
        if return_attention or (self.training and self.attn_drop.p > 0):
            attn = (q @ k.transpose(-2, -1) * self.head_dim**-0.5 + scores).softmax(dim=-1)
            y = self._output(self.attn_drop(attn) @ v)
            return (y, attn) if return_attention else y
        return self._output(F.scaled_dot_product_attention(q, k, v, attn_mask=scores))


# %% [markdown]
# ## Checks: one interface, the same numbers
#
# A layer of ConViT-Ti's size: D = 192, 4 heads (head_dim 48), a 14 × 14 grid. Copying the reference's
# weights into the fast layer works because the checkpoint keys are the same — and `rel_indices` is not among
# them. The parameter count, term by term: W_qry and W_key (2·D², no bias), W_val (D², no bias), the output
# projection (D² + D), v_pos (3·N_h weights + N_h biases) and λ (N_h).

# %%
from convit_edu.gpsa import GPSA, GPSAReference, PSA

torch.manual_seed(0)
ref = GPSAReference(192, 4)
fast = GPSA(192, 4)
fast.load_state_dict(ref.state_dict())
print(sorted(ref.state_dict()))
print("parameters:", sum(p.numel() for p in ref.parameters()))
D, N_h = 192, 4
assert sum(p.numel() for p in ref.parameters()) == 2 * D * D + D * D + (D * D + D) + (3 * N_h + N_h) + N_h == 147_668
assert "rel_indices" not in ref.state_dict()

def rel_err(a, b):
    """‖a − b‖ / ‖b‖: the relative error of a whole tensor (elementwise ratios blow up near zero)."""
    return float((a - b).norm() / b.norm()) if not a.requires_grad else rel_err(a.detach(), b.detach())


x = torch.randn(2, 196, 192)
assert rel_err(fast(x), ref(x)) <= 1e-5
print("relative error fast vs reference at init: at most 1e-5")

# %% [markdown]
# The same after perturbing every weight and gate (the gates far from their initial value, in both
# directions), on a non-square 7 × 12 grid, for outputs and for the gradients of every parameter. One
# gradient is zero in exact arithmetic: `pos_proj.bias` shifts all of a head's positional scores by the same
# amount, and a softmax does not see such a shift — both implementations return rounding noise for it.

# %%
with torch.no_grad():
    for p in ref.parameters():
        p.add_(torch.randn_like(p) * 0.05)
    ref.gating_param.copy_(torch.tensor([-3.0, -0.5, 0.5, 3.0]))
fast.load_state_dict(ref.state_dict())
x = torch.randn(3, 84, 192, requires_grad=True)
y_ref, y_fast = ref(x, grid_size=(7, 12)), fast(x, grid_size=(7, 12))
assert rel_err(y_fast, y_ref) <= 1e-5
names = ["x", *dict(ref.named_parameters())]
g_ref = dict(zip(names, torch.autograd.grad(y_ref.square().sum(), [x, *ref.parameters()])))
g_fast = dict(zip(names, torch.autograd.grad(y_fast.square().sum(), [x, *fast.parameters()])))
bias_noise = max(g_ref.pop("pos_proj.bias").abs().max(), g_fast.pop("pos_proj.bias").abs().max())
assert bias_noise < 1e-5 * g_ref["pos_proj.weight"].abs().max(), bias_noise
errors = {name: rel_err(g_fast[name], g_ref[name]) for name in g_ref}
assert max(errors.values()) <= 1e-5, errors
print(f"perturbed, 7x12 grid: output and the gradients of x and of all {len(errors) - 1} other parameters "
      "agree to a relative 1e-5")

# %% [markdown]
# The gate's two ends are the two pure forms: σ = 1 leaves only the positional attention P·V (a
# convolution-like layer), σ = 0 only content attention — exactly chapter 01's self-attention with the same
# projections.

# %%
q, k, v = fast._projections(x.detach())
with torch.no_grad():
    fast.gate_override = 1.0
    P = fast.positional_scores((7, 12)).softmax(-1)
    torch.testing.assert_close(fast(x.detach(), (7, 12)), fast._output(P @ v))
    fast.gate_override = 0.0
    torch.testing.assert_close(fast(x.detach(), (7, 12)), fast._output(F.scaled_dot_product_attention(q, k, v)))
    fast.gate_override = None
print("sigma = 1: pure positional attention; sigma = 0: pure content attention")

# %% [markdown]
# And the class token has no place here: a 14 × 14 grid has 196 patches, and 197 tokens are refused with a
# message that says why.

# %%
from convit_edu.checks import expect_error

print(expect_error(lambda: fast(torch.randn(1, 197, 192))))

# %% [markdown]
# ## What the layer looks like at initialisation
#
# With the convolutional init (α = 1) each of the 4 heads attends around its own offset Δ_h of a 2 × 2
# kernel (half-integer centres, chapter 03), and σ(1) ≈ 0.73 of every head's attention is that positional
# part. The maps below are the full gated attention of a query in the middle of a 14 × 14 grid, for random
# input tokens: the positional bump dominates, the content part adds a faint uniform-ish floor.

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

# %% [markdown]
# The peaks sit at the query (7, 7) plus an offset of (Δy, Δx) ∈ {−½, +½}² rounded to the grid: a 2 × 2
# kernel around the query.

# %%
from convit_edu.conv_init import head_centres

centres = head_centres(4)
for h, p in enumerate(peaks):
    row, col = int(p) // 14, int(p) % 14
    dx, dy = centres[h].tolist()
    assert abs(col - 7 - dx) <= 0.5 and abs(row - 7 - dy) <= 0.5, (h, row, col, dx, dy)
print("every head peaks within half a patch of query + Δ_h")

# %% [markdown]
# ## Eq. 7 as the gate moves
#
# The gate slides each head's attention along a straight line between two maps: its content attention
# (σ = 0, what a ViT head would do) and its positional attention (σ = 1, a blurred tap of a convolution).
# Below, one head of a freshly initialised layer reads the Grace Hopper photograph (patches of 16 pixels
# embedded by a random 16 × 16 convolution and a LayerNorm, as in chapter 03's Fig. 3), with its gate forced
# to five values (`gate_override`, the hook chapter 30's masking uses), on one logarithmic colour scale. At
# initialization (weights of standard deviation 0.02) the content map is nearly uniform; we scale W_qry and
# W_key up 4 times so that it shows something, a random read-out of the picture — training (chapter 28) is
# what makes it useful. The ConViT starts
# at σ(1) = 0.73, the fourth panel: mostly the positional bump, with the picture faintly behind it.

# %%
from matplotlib import cbook
from PIL import Image
from torchvision.transforms.functional import pil_to_tensor

with cbook.get_sample_data("grace_hopper.jpg") as f:
    photo = Image.open(f).convert("RGB").resize((224, 224), Image.BICUBIC)
pixels = pil_to_tensor(photo)[None].float() / 255
torch.manual_seed(0)
embed, norm = nn.Conv2d(3, 192, kernel_size=16, stride=16), nn.LayerNorm(192)
tokens = norm(rearrange(embed((pixels - pixels.mean()) / pixels.std()), "1 d h w -> 1 (h w) d")).detach()
layer = GPSAReference(192, 4)
with torch.no_grad():
    layer.qk.weight.mul_(4)  # init's std 0.02 makes content attention nearly uniform: give it something to show
query, head, sigmas = 5 * 14 + 6, 0, (0.0, 0.27, 0.5, 0.73, 1.0)
mixed = {}
for sigma in sigmas:
    layer.gate_override = sigma
    with torch.no_grad():
        mixed[sigma] = layer(tokens, return_attention=True)[1][0, head, query]
layer.gate_override = None
for sigma in sigmas[1:-1]:  # Eq. 7 is linear in σ: every map lies between the two ends
    torch.testing.assert_close(mixed[sigma], (1 - sigma) * mixed[0.0] + sigma * mixed[1.0], atol=1e-6, rtol=0)
from matplotlib.colors import LogNorm

# (far from its centre the positional softmax underflows to 0: the scale starts at the content map's floor)
scale = LogNorm(vmin=float(mixed[0.0].min()) / 10, vmax=max(float(m.max()) for m in mixed.values()), clip=True)
fig, axes = plt.subplots(1, len(sigmas) + 1, figsize=(12, 2.3), dpi=80)
axes[0].imshow(photo)
axes[0].add_patch(plt.Rectangle((6 * 16, 5 * 16), 16, 16, fill=False, color="red", lw=2))
for ax, sigma in zip(axes[1:], sigmas):
    ax.imshow(mixed[sigma].reshape(14, 14), cmap="viridis", norm=scale)  # one log scale for all five
    ax.add_patch(plt.Rectangle((6 - 0.5, 5 - 0.5), 1, 1, fill=False, color="red"))
    ax.set_title({0.0: "σ = 0: content", 1.0: "σ = 1: position"}.get(sigma, f"σ = {sigma}"), fontsize=9)
for ax in axes:
    ax.set_xticks([]), ax.set_yticks([])
fig.tight_layout()
plt.show()
print("every intermediate map equals (1 - σ)·content + σ·position")

# %% [markdown]
# ## Speed and memory
#
# How much faster and leaner the fast layer is than the official form and the reference is measured in
# chapter 27, "One GPSA layer: official form, reference and fast".

# %% [markdown]
# ## Exercises
#
# **1. A GPSA layer from scratch.** Write `my_gpsa(layer, x, rows, cols)`: the output of the GPSA layer
# `layer` on tokens `x` (B, L, D) of a rows × cols grid, from Eq. 6-7 and the layer's weights (`layer.qk`,
# `layer.v`, `layer.pos_proj`, `layer.gating_param`, `layer.proj`), with the relative positions r_ij =
# (δx, δy, ‖δ‖²), δ = key − query (δx the column offset, tokens row by row), built by hand — no
# `rel_indices`, no method of the layer. The content scores carry the 1/√D_h.

# %% tags=["solution"] jupyter={"source_hidden": true}
def my_gpsa(layer: GPSA, x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
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

# %%
# your answer: def my_gpsa(layer, x, rows, cols): ...

# %%
from convit_edu.checks import WrongAnswer, check_answer


def check_gpsa(fn) -> None:
    torch.manual_seed(0)
    for rows, cols in ((4, 4), (3, 5)):
        random = GPSA(48, 4, locality_strength=1.0).eval()
        with torch.no_grad():  # random positional weights and gates, so that every term counts
            random.pos_proj.weight.normal_(), random.gating_param.normal_()
        x = torch.randn(2, rows * cols, 48)
        with torch.no_grad():
            err = ((fn(random, x, rows, cols) - random(x, grid_size=(rows, cols))).norm() /
                   random(x, grid_size=(rows, cols)).norm()).item()
        check_answer(err < 1e-5, f"on a {rows} × {cols} grid your output differs by more than a relative 1e-5: check "
                     "δ = key − query with δx the column offset, the 1/√D_h on the content scores, and which of "
                     "the two softmaxes σ(λ) weighs (σ → 1 is positional)")


def unscaled(layer: GPSA, x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:  # a wrong answer: no 1/√D_h
    saved = layer.head_dim
    layer.head_dim = 1  # my_gpsa divides by √head_dim: 1 leaves the content scores unscaled
    try:
        return my_gpsa(layer, x, rows, cols)
    finally:
        layer.head_dim = saved


check_gpsa(my_gpsa)
print("my_gpsa equals GPSA's forward to a relative 1e-5, on a square and a non-square grid")
print(expect_error(lambda: check_gpsa(unscaled), WrongAnswer))

# %% [markdown]
# **2. The fast form by hand.** Write `mix(content, pos_attn, v, sigma)`: given the content attention's output
# `content` = softmax(QKᵀ/√d)·V and the values `v`, both (B, N_h, L, d), the positional attention `pos_attn`
# (N_h, L, L, the same for every image) and the gates `sigma` (N_h,), return Eq. 7's output per head,
# (1 − σ)·content + σ·(P·V), as (B, N_h, L, d) — without making a copy of P per image.

# %% tags=["solution"] jupyter={"source_hidden": true}
def mix(content: torch.Tensor, pos_attn: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    position = torch.einsum("hqk,bhkd->bhqd", pos_attn, v)  # P is shared by the batch
    return torch.lerp(content, position, sigma.view(-1, 1, 1))


# %%
# your answer: def mix(content, pos_attn, v, sigma): ...

# %%
def check_mix(fn) -> None:
    torch.manual_seed(5)
    ref = GPSAReference(32, 4).eval()
    with torch.no_grad():
        ref.gating_param.copy_(torch.tensor([-2.0, 0.0, 1.0, 3.0]))
        x = torch.randn(2, 16, 32)
        q, k, v = ref._projections(x)
        got = ref._output(fn(F.scaled_dot_product_attention(q, k, v), ref.positional_softmax((4, 4)), v, ref.gate()))
        want = ref(x)
    check_answer(got.shape == want.shape, f"mix should return (B, N_h, L, d); the layer's output came out "
                 f"{tuple(got.shape)}")
    check_answer(torch.allclose(got, want, atol=1e-5), "each head's σ weighs the positional part and 1 − σ the "
                 "content part; P·V multiplies over the key axis of P and the token axis of V")


check_mix(mix)
print(expect_error(lambda: check_mix(lambda c, p, v, s: torch.lerp(c, p @ v, 1 - s.view(-1, 1, 1))), WrongAnswer))
