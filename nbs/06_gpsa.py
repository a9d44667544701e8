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
# form to read; the models of chapter 08 train with another. This chapter derives a **fast** `GPSA` that gives
# the same numbers without ever building a batch × heads × L × L tensor, and PSA (Eq. 4) as a module for the
# paper's App. A ablation. Both stand on chapter 05's parts: the projections, the positional scores, the grid
# and Eq. 5's initialisation (`PositionalAttention`) and, for GPSA, the gate (`GatedAttention`); so they have the
# reference's constructor, parameters and checkpoint keys, and its weights load into them. Both export to
# `convit_edu/gpsa.py`.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp gpsa
# Gated positional self-attention (GPSA, Eq. 6-7) in its fast form, and PSA (Eq. 4), on the parts of gpsa_reference.

# %%
import torch
import torch.nn.functional as F

from convit_edu.checks import WrongAnswer, check_answer, expect_error
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
# * The first term is ordinary attention: `F.scaled_dot_product_attention` computes it with a fused kernel
#   (flash attention on GPUs and on CPUs) that never stores the L × L matrix and saves only the output and
#   one number per row for the backward pass.
# * The second term's attention P does not depend on the image: it is one (heads, L, L) tensor for the whole
#   batch, computed **once per forward**. It is applied to all images at once by folding the batch into the
#   columns of V: (heads, L, L) @ (heads, L, B·d). (Writing `P @ V` with broadcasting over the batch looks
#   the same but makes torch expand P into one copy per image — and keep that copy for the backward pass.)
# * The gate mixes the two *outputs* (B, heads, L, head_dim), never two (B, heads, L, L) matrices; the
#   normalisation is dropped (it is the identity, chapter 05).
#
# Attention dropout on A cannot be split this way (one mask on the mixed matrix is not two masks on its
# parts), so in training with `attn_drop > 0` the fast class computes the reference form; the ConViT/DeiT
# recipe uses no attention dropout, so the fast path is what trains. Asking for the attention matrix
# (`return_attention=True`) also computes it explicitly — only then.

# %%
#| export
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from convit_edu.gpsa_reference import GatedAttention, PositionalAttention


class GPSA(GatedAttention):
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
class PSA(PositionalAttention):
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
from convit_edu.gpsa import GPSA, PSA

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
# ## Speed and memory
#
# How much faster and leaner the fast layer is than the official form and the reference is measured in
# chapter 27, "One GPSA layer: official form, reference and fast".

# %% [markdown]
# ## Exercises
#
# **1. The fast form by hand.** Write `mix(content, pos_attn, v, sigma)`: given the content attention's output
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

# %% [markdown]
# **2. PSA through SDPA.** Write `psa_attend(q, k, v, scores)`: Eq. 4's attention output per head,
# softmax(QKᵀ/√d + scores)·V, for queries, keys and values (B, N_h, L, d) and the positional scores `scores` as
# `pos_proj` computes them from `rel_indices`, (L, L, N_h): one call of `F.scaled_dot_product_attention`, whose
# float `attn_mask` is *added* to the scaled content scores and broadcast over any dimension of size 1.

# %% tags=["solution"] jupyter={"source_hidden": true}
def psa_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=scores.permute(2, 0, 1))  # (N_h, L, L): one per head


# %%
# your answer: def psa_attend(q, k, v, scores): ...

# %%
from convit_edu.positional import rel_indices


def check_psa_attend(fn) -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 2, 4, 12, 8).unbind(0)  # B = 2, N_h = 4, L = 12, d = 8
    scores = torch.randn(12, 12, 4) * 3
    want = (q @ k.transpose(-2, -1) / 8**0.5 + scores.permute(2, 0, 1)).softmax(-1) @ v
    got = fn(q, k, v, scores)
    check_answer(got.shape == want.shape, f"psa_attend should return (B, N_h, L, d) = {tuple(want.shape)}, "
                 f"got {tuple(got.shape)}")
    check_answer(torch.allclose(got, want, atol=1e-5), "SDPA scales Q·Kᵀ by 1/√d itself and adds the mask as it is; "
                 "the mask of head h is scores[:, :, h], (query, key)")
    layer = PSA(32, 4)  # the same computation as the module's forward, on a 3 × 4 grid
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        got, want = layer._output(fn(*layer._projections(x), layer.pos_proj(rel_indices(3, 4)))), layer(x, (3, 4))
    check_answer(torch.allclose(got, want, atol=1e-5), "with a PSA layer's own scores, your output is not its forward")


check_psa_attend(psa_attend)
print("psa_attend equals softmax(QKᵀ/√d + scores)·V, and PSA's forward")
print(expect_error(lambda: check_psa_attend(lambda q, k, v, s: psa_attend(q, k, v, s / q.shape[-1] ** 0.5)),
                   WrongAnswer))
