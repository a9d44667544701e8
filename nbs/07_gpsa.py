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
# # The fast GPSA, and PSA as a module
#
# Chapter 05 wrote gated positional self-attention (Eq. 6–7) down literally: `GPSAReference` builds both
# softmaxes and their mix as batch × heads × L × L tensors and keeps them for the backward pass. That is the
# form to read; the models of chapter 09 train with another. This chapter derives a **fast** `GPSA` that gives
# the same numbers without ever building a batch × heads × L × L tensor, in few operations — on a GPU each
# operation is a kernel launch, and launches, not arithmetic, set the pace of a small model's training step — and
# PSA (Eq. 4) as a module for the paper's App. A ablation. Both stand on chapter 05's parts: the projections, the
# positional scores, the grid and Eq. 5's initialisation (`PositionalAttention`) and, for GPSA, the gate
# (`GatedAttention`); so they have the reference's constructor, parameters and checkpoint keys, and its weights
# load into them. Both export to `convit_edu/gpsa.py`. The next chapter, 07_operation_counts, counts what the fast
# layer costs — the operations a GPU launches, the multiply-adds a CPU does — and derives from those counts the two
# ways the layer applies P, one product on a GPU and two factors on a CPU.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpsa
# Gated positional self-attention (GPSA, Eq. 6-7) in its fast form, and PSA (Eq. 4), on the base classes of
# gated_attention.

# %%
import contextlib

import torch
import torch.nn.functional as F
from einops import rearrange

from convit_edu.checks import check_answer
from convit_edu.gpsa_reference import GPSAReference

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## The fast GPSA
#
# Write A·V with Eq. 7 and distribute the product over the sum:
#
# $$\mathbf{A}^h\mathbf{V}^h = \big(1-\sigma_h\big)\,
#   \underbrace{\operatorname{softmax}\!\big(\mathbf{Q}^h\mathbf{K}^{h\top}/\sqrt{d}\big)\mathbf{V}^h}_{
#   \text{scaled dot-product attention}}
#   + \sigma_h\,\underbrace{\operatorname{softmax}\!\big(\mathbf{v}^{h\top}_{pos}\mathbf{r}\big)}_{
#   \mathbf{P}^h\text{: no batch index}}\,\mathbf{V}^h .$$
#
# * The first term is ordinary attention: SDPA (through chapter 01's `fused_attention`) computes it with a fused
#   kernel (flash or memory-efficient attention on GPUs, flash on CPUs) that never stores the L × L matrix and saves
#   only the output and one number per row for the backward pass.
# * The second term's attention P does not depend on the image: it is computed **once per forward**, (heads, L, L),
#   and applied to all images in **one** matrix product per head, by folding the batch into the columns of V:
#   (heads, L, L) @ (heads, L, B·d). (Writing `P @ V` with broadcasting over the batch looks the same but makes torch
#   expand P into one copy per image — and keep that copy for the backward pass.) That is the GPU's path; a CPU
#   applies P as two smaller factors instead, which take 7 times fewer multiply-adds at 14 × 14 (why, and why only
#   there: chapter 07_operation_counts, "One product or two").
# * The gate mixes the two *outputs* (B, heads, L, head_dim), never two (B, heads, L, L) matrices: `torch.lerp(content,
#   position, σ)` is (1 − σ)·content + σ·position in one operation. The normalisation is dropped (it is the
#   identity, chapter 05).
#
# Attention dropout on A cannot be split this way (one mask on the mixed matrix is not two masks on its
# parts), so in training with `attn_drop > 0` the fast class computes the reference form; the ConViT/DeiT
# recipe uses no attention dropout, so the fast path is what trains. Asking for the attention matrix
# (`return_attention=True`) also computes it explicitly — only then.

# %%
#| export
import contextlib
import contextvars
from collections.abc import Iterator

import torch
from einops import rearrange
from torch import Tensor

from convit_edu.attention import fused_attention
from convit_edu.gated_attention import (GatedAttention, PositionalAttention, flush_denormals,
                                        softmax_without_denormals)

_GPU_PATH = contextvars.ContextVar("convit_edu_gpu_path", default=False)


@contextlib.contextmanager
def gpu_path() -> Iterator[None]:
    """Inside, every GPSA layer takes the path it takes on a GPU whatever its device (``applies_factors`` is False):
    the operation counts (``count_operations``), a CPU's proxy of a GPU's launches, count that path."""
    token = _GPU_PATH.set(True)
    try:
        yield
    finally:
        _GPU_PATH.reset(token)


def applies_factors(device: torch.device) -> bool:
    """Whether a GPSA layer on ``device`` applies P as its two factors, P^y ⊗ P^x (on a CPU, whose time is its
    multiply-adds), rather than as one product (on a GPU, whose small steps' time is their launches)."""
    return device.type == "cpu" and not _GPU_PATH.get()


def _positional_output(p: Tensor, v: Tensor) -> Tensor:
    """P @ V for every image at once, (B, heads, L, d): one (heads, L, L) @ (heads, L, B·d) product, P shared by
    the batch (never copied per image)."""
    out = p.to(v.dtype) @ rearrange(v, "b h l d -> h l (b d)")
    return rearrange(out, "h l (b d) -> b h l d", b=v.shape[0])


def _factored_output(py: Tensor, px: Tensor, v: Tensor) -> Tensor:
    """(P^y ⊗ P^x) @ V for every image at once, (B, heads, L, d), tokens row-major: along the columns with P^x
    (heads, W, W), then along the rows with P^y (heads, H, H), each one product for the whole batch."""
    batch, rows = v.shape[0], py.shape[-1]
    by_cols = px.to(v.dtype) @ rearrange(v, "b h (y x) d -> h x (b y d)", y=rows)
    by_rows = py.to(v.dtype) @ rearrange(by_cols, "h j (b y d) -> h y (b j d)", b=batch, y=rows)
    return rearrange(by_rows, "h i (b j d) -> b h (i j) d", b=batch, j=px.shape[-1])


class GPSA(GatedAttention):
    """Gated positional self-attention, Eq. 6-7, fast: ``lerp(SDPA(Q, K, V), P @ V, σ)`` per head, the positional
    attention P computed once per forward and applied to the whole batch: on a GPU as one (heads, L, L) product, on
    a CPU as its row and column factors, the gate folded into them (``applies_factors``, ``_factored_mix``).

    Same constructor, parameters, checkpoint keys and outputs as ``GPSAReference``. No (B, heads, L, L) tensor is
    built unless ``return_attention=True`` (or attention dropout is active in training), which computes the
    reference form.
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
        if applies_factors(v.device):
            return self._output(self._factored_mix(fused_attention(q, k, v), v, grid))
        position = _positional_output(self.positional_softmax(grid), v)
        sigma = self.gate().to(v.dtype).view(-1, 1, 1)
        return self._output(torch.lerp(fused_attention(q, k, v), position, sigma))

    def _factored_mix(self, content: Tensor, v: Tensor, grid: tuple[int, int]) -> Tensor:
        """(1 − σ)·content + σ·(P^y ⊗ P^x) @ V, a CPU's path: the gate folded into P^y, σ·P = (σ·P^y) ⊗ P^x, with
        the entries σ makes denormal flushed again; one ``addcmul`` mixes."""
        py, px = self.positional_factors(grid)
        sigma = self.gate().to(py.dtype).view(-1, 1, 1)
        position = _factored_output(flush_denormals(py * sigma), px, v)
        return torch.addcmul(position, content, (1 - sigma).to(v.dtype))

    def positional_factors(self, grid_size: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """P^y (heads, rows, rows) and P^x (heads, cols, cols) with P = P^y ⊗ P^x (chapter 07_operation_counts,
        "One product or two"): softmaxes over the key's row, of w₂·δy + w₃·δy², and over its column, of w₁·δx +
        w₃·δx² (δ = key − query, as in ``rel_indices``), in at least fp32, without denormals (the CPU's path). The
        bias b, which a softmax does not see, joins the row scores so that every parameter is in the graph (DDP
        expects that)."""
        weight, bias = self.pos_proj.weight, self.pos_proj.bias
        dtype = torch.promote_types(weight.dtype, torch.float32)
        weight, bias = weight.to(dtype), bias.to(dtype)

        def along(size: int, w_offset: Tensor, shift: Tensor | float) -> Tensor:
            offsets = torch.arange(size, device=weight.device, dtype=dtype)
            delta = offsets[None, :] - offsets[:, None]  # [query, key] = key − query
            return softmax_without_denormals(w_offset[:, None, None] * delta + weight[:, 2, None, None] * delta**2
                                             + shift)

        rows, cols = grid_size
        return along(rows, weight[:, 1], bias[:, None, None]), along(cols, weight[:, 0], 0.0)


# %% [markdown]
# ## PSA as a module (App. A ablation)
#
# The paper's App. A compares GPSA with plain positional self-attention (Eq. 4, chapter 02): content and
# positional scores summed inside *one* softmax, no gate. Its fast form is also one SDPA call: the positional
# scores (heads, L, L) are an additive float `attn_mask`, broadcast over the batch.

# %%
#| export
class PSA(PositionalAttention):
    """Positional self-attention, Eq. 4: ``softmax(Q Kᵀ/√d + v_posᵀ r) V`` per head, with Eq. 5's v_pos and W_val = I
    (W_qry, W_key keep DeiT's random init, not 0).

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
        return self._output(fused_attention(q, k, v, attn_mask=scores))


# %% [markdown]
# ## Checks: one interface, the same numbers
#
# A layer of ConViT-Ti's size: D = 192, 4 heads (head_dim 48), a 14 × 14 grid. Copying the reference's
# weights into the fast layer works because the checkpoint keys are the same — and `rel_indices` is not among
# them. The parameter count, term by term: W_qry and W_key (2·D², no bias), W_val (D², no bias), the output
# projection (D² + D), v_pos (3·N_h weights + N_h biases) and λ (N_h).

# %%
from convit_edu.gpsa import GPSA, PSA, gpu_path

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
y_ref = ref(x, grid_size=(7, 12))
names = ["x", *dict(ref.named_parameters())]
g_ref = dict(zip(names, torch.autograd.grad(y_ref.square().sum(), [x, *ref.parameters()])))
ref_bias_noise = g_ref.pop("pos_proj.bias").abs().max()
for path, label in ((contextlib.nullcontext, "a CPU's path (P's factors)"), (gpu_path, "a GPU's (one product with P)")):
    with path():
        y_fast = fast(x, grid_size=(7, 12))
        g_fast = dict(zip(names, torch.autograd.grad(y_fast.square().sum(), [x, *fast.parameters()])))
    assert rel_err(y_fast, y_ref) <= 1e-5
    bias_noise = max(ref_bias_noise, g_fast.pop("pos_proj.bias").abs().max())
    assert bias_noise < 1e-5 * g_ref["pos_proj.weight"].abs().max(), bias_noise
    errors = {name: rel_err(g_fast[name], g_ref[name]) for name in g_ref}
    assert max(errors.values()) <= 1e-5, errors
    print(f"{label}, perturbed, 7x12 grid: output and the gradients of x and of all {len(errors) - 1} other "
          "parameters agree to a relative 1e-5")

# %% [markdown]
# The gate's two ends are the two pure forms: σ = 1 leaves only the positional attention P·V (a convolution-like
# layer), σ = 0 only content attention. Forced to each end (`gate_override`), the fast layer — P as one product for
# the batch, content through SDPA — against the reference forced to the same end, which materialises both softmaxes
# and mixes them.

# %%
with torch.no_grad():
    for sigma in (1.0, 0.0):
        fast.gate_override = ref.gate_override = sigma
        torch.testing.assert_close(fast(x.detach(), (7, 12)), ref(x.detach(), (7, 12)), rtol=1e-5, atol=1e-5)
    fast.gate_override = ref.gate_override = None
print("sigma = 1: the reference's pure positional attention; sigma = 0: its pure content attention")

# %% [markdown]
# ## Speed and memory
#
# Chapter 07_operation_counts counts the operations of the fast layer against MHSA's and the reference's, and why
# a GPU takes one product with P and a CPU its two factors. Chapter 30 measures how much faster and leaner the fast
# layer is than the official form and the reference ("One GPSA layer: official form, reference and fast"); chapter
# 31 counts whole training steps, ConViT-Ti against DeiT-Ti.

# %% [markdown]
# ## Exercises
#
# **1. The fast form by hand.** Write `mix(content, pos_attn, v, sigma)`: given the content attention's output
# `content` = softmax(QKᵀ/√d)·V and the values `v`, both (B, N_h, L, d), the positional attention `pos_attn`
# (N_h, L, L, the same for every image) and the gates `sigma` (N_h,), return Eq. 7's output per head,
# (1 − σ)·content + σ·(P·V), as (B, N_h, L, d) — without making a copy of P per image. (The models use the
# package's `GPSA`, whose forward does this with one product of P for the whole batch and a `lerp`.)

# %%
mix = ...  # your answer: def mix(content, pos_attn, v, sigma): ...

# %%
from convit_edu.checks import demonstrate, grade, reveal


def check_mix(fn) -> None:
    torch.manual_seed(5)
    ref = GPSAReference(32, 4).eval()
    with torch.no_grad():
        ref.gating_param.copy_(torch.tensor([-2.0, 0.0, 1.0, 3.0]))
        x = torch.randn(2, 16, 32)
        q, k, v = ref._projections(x)
        content, pos_attn, sigma = F.scaled_dot_product_attention(q, k, v), ref.positional_softmax((4, 4)), ref.gate()
        heads = fn(content, pos_attn, v, sigma)
        check_answer(heads.shape == v.shape, f"mix returns one output per head, (B, N_h, L, d) = {tuple(v.shape)}, "
                     f"got {tuple(heads.shape)}")
        got = ref._output(heads)
        ref.gating_param.neg_()  # σ(−λ) = 1 − σ(λ): the layer with the weights of its two parts swapped
        swapped = ref(x)
        ref.gating_param.neg_()
        transposed = ref._output(torch.lerp(content, pos_attn.transpose(-2, -1) @ v, sigma.view(-1, 1, 1)))
        want = ref(x)
    check_answer(not torch.allclose(got, swapped, atol=1e-5), "σ weighs the positional part and 1 − σ the content "
                 "part (σ → 1 is the convolution-like head)")
    check_answer(not torch.allclose(got, transposed, atol=1e-5), "P·V sums over P's *key* axis: the output of query i "
                 "is Σ_j P[h, i, j]·V[b, h, j], P's rows are the queries")
    check_answer(torch.allclose(got, want, atol=1e-5), "your output differs from the layer's: (1 − σ_h)·content + "
                 "σ_h·(P_h·V), each head h with its own gate and its own P")


grade("mix", mix, check_mix)
demonstrate(check_mix, {
    "the heads merged, (B, L, N_h·d)": lambda c, p, v, s: rearrange(torch.lerp(c, p @ v, s.view(-1, 1, 1)),
                                                                    "b h l d -> b l (h d)"),
    "σ on the content": lambda c, p, v, s: torch.lerp(c, p @ v, 1 - s.view(-1, 1, 1)),
    "P transposed": lambda c, p, v, s: torch.lerp(c, p.transpose(-2, -1) @ v, s.view(-1, 1, 1)),
    "one gate for all heads": lambda c, p, v, s: torch.lerp(c, p @ v, s.mean()),
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(mix):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def mix(content: torch.Tensor, pos_attn: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        position = torch.einsum("hqk,bhkd->bhqd", pos_attn, v)  # P is shared by the batch
        return torch.lerp(content, position, sigma.view(-1, 1, 1))

    grade("mix", mix, check_mix)

# %% [markdown]
# **2. PSA through SDPA.** Write `psa_attend(q, k, v, scores)`: Eq. 4's attention output per head,
# softmax(QKᵀ/√d + scores)·V, for queries, keys and values (B, N_h, L, d) and the positional scores `scores` as
# `pos_proj` computes them from `rel_indices`, (L, L, N_h): one call of `F.scaled_dot_product_attention`, whose
# float `attn_mask` is *added* to the scaled content scores and broadcast over any dimension of size 1.

# %%
psa_attend = ...  # your answer: def psa_attend(q, k, v, scores): ...

# %%
def check_psa_attend(fn) -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 2, 4, 12, 8).unbind(0)  # B = 2, N_h = 4, L = 12, d = 8
    scores = torch.randn(12, 12, 4) * 3
    masks = scores.permute(2, 0, 1)  # (N_h, query, key)
    want = (q @ k.transpose(-2, -1) / 8**0.5 + masks).softmax(-1) @ v
    got = fn(q, k, v, scores)
    check_answer(got.shape == want.shape, f"psa_attend returns one output per head, (B, N_h, L, d) = "
                 f"{tuple(want.shape)}, got {tuple(got.shape)}")
    check_answer(not torch.allclose(got, F.scaled_dot_product_attention(q, k, v, attn_mask=masks / 8**0.5), atol=1e-5),
                 "SDPA adds the mask as it is, after scaling Q·Kᵀ: the positional scores are not divided by √d")
    check_answer(not torch.allclose(got, F.scaled_dot_product_attention(q, k, v, attn_mask=masks.transpose(-2, -1)),
                                    atol=1e-5), "the mask of head h is scores[:, :, h] with its first axis the query "
                 "and its second the key, as rel_indices is laid out: (N_h, query, key)")
    check_answer(torch.allclose(got, want, atol=1e-5), "SDPA scales Q·Kᵀ by 1/√d itself: pass q, k and v as they are")


grade("psa_attend", psa_attend, check_psa_attend)
demonstrate(check_psa_attend, {
    "the heads merged": lambda q, k, v, s: rearrange(F.scaled_dot_product_attention(q, k, v, attn_mask=s.permute(2, 0, 1)),
                                                     "b h l d -> b l (h d)"),
    "the positional scores scaled too": lambda q, k, v, s: F.scaled_dot_product_attention(
        q, k, v, attn_mask=s.permute(2, 0, 1) / q.shape[-1] ** 0.5),
    "(N_h, key, query)": lambda q, k, v, s: F.scaled_dot_product_attention(q, k, v, attn_mask=s.permute(2, 1, 0)),
    "q scaled by hand as well": lambda q, k, v, s: F.scaled_dot_product_attention(
        q / q.shape[-1] ** 0.5, k, v, attn_mask=s.permute(2, 0, 1)),
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(psa_attend):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def psa_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=scores.permute(2, 0, 1))  # (N_h, L, L): one per head

    from convit_edu.positional import rel_indices

    layer, x = PSA(32, 4), torch.randn(2, 12, 32)  # the same computation as the module's forward, on a 3 × 4 grid
    with torch.no_grad():
        same = torch.allclose(layer._output(psa_attend(*layer._projections(x), layer.pos_proj(rel_indices(3, 4)))),
                              layer(x, (3, 4)), atol=1e-5)
    print(f"psa_attend with a PSA layer's own scores gives its forward: {same}")
    grade("psa_attend", psa_attend, check_psa_attend)
