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
# # Attention as convolution: a PSA layer with k² heads is a k×k convolution
#
# Chapter 03 placed each head's attention on one offset Δ_h of a kernel, with a sharpness α (Eq. 5). Here we
# build, from those pieces, a positional self-attention layer whose output *is* a given `nn.Conv2d`, and check
# it against torch to 10⁻⁴. The proof needs each head to be as wide as the input; a real ConViT layer's heads
# are narrower (D_h = D/N_h), and the last section shows the simpler operation such a layer tends to with a
# sharp α and a fully positional gate: a shift of each channel group, then a 1 × 1 projection (at the real
# initialization, a blurred version of it).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp conv_attention
# A multi-head positional self-attention layer that computes a given convolution (Cordonnier et al., 2020).

# %%
#| export
import torch
from torch import Tensor, nn

from convit_edu.conv_init import check_locality_strength, v_pos

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from einops import rearrange
from matplotlib import cbook
from PIL import Image
from torch import nn
from torchvision.transforms.functional import pil_to_tensor

from convit_edu.conv_init import head_centres, local_init, positional_attention
from convit_edu.positional import rel_indices

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Proof by execution: a PSA layer with k² heads *is* a k×k convolution
#
# Cordonnier et al. (2020, Theorem 1) prove that multi-head self-attention with N_h heads of width D_h, output
# width D_out and relative positional encodings (D_pos ≥ 3) can express any √N_h × √N_h convolution with
# min(D_h, D_out) output channels. Every head must carry enough channels for the whole kernel tap it applies;
# `ConvAsPSA` meets the condition by making each head as wide as the input (D_h = C_in, so the value
# projection has N_h · C_in outputs). The construction is Eq. 5 with one head per kernel tap:
#
# * the tokens are the pixels of the (zero-padded) input, so L = H·W and the features are the C_in channels;
# * W_qry = W_key = 0, so the content score is 0 and the attention is the positional softmax alone;
# * head h attends to offset Δ_h; as α → ∞ its attention becomes one-hot on the pixel query + Δ_h;
# * W_val copies the C_in channels into each head (D_h = C_in), and the output projection multiplies head h
#   by the kernel tap W[:, :, i, j] that sits at offset Δ_h, then adds the bias.
#
# Summed over heads, the output at the query is Σ_h W_{tap h} · x(query + Δ_h) + b: the convolution.
#
# Which query is the output pixel? `nn.Conv2d` computes output (r, s) from input rows r … r + k − 1 and columns
# s … s + k − 1 of the padded input. For odd k we take the middle pixel (r + c, s + c) as the query, and the
# offsets are exactly `head_centres(k²)`. For even k there is no middle pixel: we anchor the query at
# (r + a, s + a) with a = ⌊(k − 1)/2⌋, which moves the half-integer centres of the ConViT by +½ onto integer
# offsets — for k = 2 the taps are at Δ ∈ {0, 1}². With the ConViT's own (±½, ±½) centres each head would
# average four pixels (shown below), and no choice of weights gives a general 2×2 convolution.

# %%
#| export
from einops import rearrange
from torch.nn import functional as F

from convit_edu.positional import rel_indices


class ConvAsPSA(nn.Module):
    """A positional self-attention layer (Eq. 4-5, W_qry = W_key = 0) computing a given k×k convolution.

    Cordonnier et al. (2020): one head per kernel tap, centred at that tap's offset; ``v`` copies the input
    channels into every head (D_h = C_in), ``proj`` holds the taps of ``conv.weight`` and ``conv.bias``. The
    output approaches ``conv(images)`` as ``locality_strength`` (α) grows (error ~ e^{−α}). For even k the
    query is the pixel ⌊(k − 1)/2⌋ from the window's top-left corner, so every centre is an integer offset.
    Its heads are as wide as the input (N_h · C_in value channels): a ConViT layer's are not (D_h = D/N_h).
    """

    def __init__(self, conv: nn.Conv2d, locality_strength: float):
        super().__init__()
        alpha = check_locality_strength(locality_strength)
        k = conv.kernel_size[0]
        problems = {
            "kernel_size": (conv.kernel_size, (k, k)),
            "stride": (conv.stride, (1, 1)),
            "dilation": (conv.dilation, (1, 1)),
            "groups": (conv.groups, 1),
            "padding_mode": (conv.padding_mode, "zeros"),
        }
        for name, (value, wanted) in problems.items():
            if value != wanted:
                raise ValueError(
                    f"ConvAsPSA needs a square, dense, stride-1 convolution: conv.{name} is {value!r}, not {wanted!r}"
                )
        if isinstance(conv.padding, str):
            raise ValueError(f"ConvAsPSA needs a numeric conv.padding, got {conv.padding!r}")
        num_heads, c_in = k * k, conv.in_channels
        self.kernel_size, self.padding, self.num_heads = k, tuple(conv.padding), num_heads
        self.anchor = (k - 1) // 2
        h = torch.arange(num_heads)
        taps = torch.stack([h // k, h % k], dim=-1)  # (column, row) of head h = h1 + k·h2, as in head_centres
        self.register_buffer("centres", (taps - self.anchor).to(torch.float32), persistent=False)
        self.pos_proj = nn.Linear(3, num_heads)
        self.v = nn.Linear(c_in, num_heads * c_in, bias=False)
        self.proj = nn.Linear(num_heads * c_in, conv.out_channels)
        with torch.no_grad():
            self.pos_proj.weight.copy_(v_pos(self.centres, alpha))
            self.pos_proj.bias.zero_()
            self.v.weight.copy_(torch.eye(c_in).repeat(num_heads, 1))
            self.proj.weight.copy_(rearrange(conv.weight, "o c i j -> o (j i c)"))  # head index i + k·j
            self.proj.bias.copy_(conv.bias if conv.bias is not None else torch.zeros(conv.out_channels))

    def forward(self, images: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, C_out, H_out, W_out), the shape ``conv(images)`` has."""
        k, (ph, pw), a = self.kernel_size, self.padding, self.anchor
        if images.ndim != 4 or images.shape[1] * self.num_heads != self.v.out_features:
            raise ValueError(
                f"expected images (B, {self.v.out_features // self.num_heads}, H, W), got {tuple(images.shape)}"
            )
        x = F.pad(images, (pw, pw, ph, ph))
        height, width = x.shape[-2:]
        if height < k or width < k:
            raise ValueError(f"padded input {height}x{width} is smaller than the {k}x{k} kernel")
        rel = rel_indices(height, width, device=x.device, dtype=x.dtype)
        attn = self.pos_proj(rel).softmax(dim=1)  # (L queries, L keys, N_h): softmax over keys
        values = rearrange(self.v(rearrange(x, "b c h w -> b (h w) c")), "b l (n d) -> b n l d", n=self.num_heads)
        heads = torch.einsum("qkn,bnkd->bqnd", attn, values)
        y = rearrange(self.proj(heads.flatten(2)), "b (h w) c -> b c h w", h=height)
        return y[:, :, a : a + height - k + 1, a : a + width - k + 1]

# %% [markdown]
# A random 3×3 convolution from 3 to 8 channels, with padding 1, on a non-square 10×13 input, and a PSA with
# 9 heads at α = 20: the outputs agree to 1e-4. The centres are those of `head_centres(9)`.

# %%
torch.manual_seed(0)
x = torch.randn(2, 3, 10, 13)
conv3 = nn.Conv2d(3, 8, kernel_size=3, padding=1)
psa3 = ConvAsPSA(conv3, locality_strength=20.0)
assert torch.equal(psa3.centres, head_centres(9))
with torch.no_grad():
    y_conv, y_psa = conv3(x), psa3(x)
torch.testing.assert_close(y_psa, y_conv, atol=1e-4, rtol=0)
print(tuple(y_conv.shape), "max |PSA - conv| < 1e-4")

# %% [markdown]
# A 2×2 convolution with 4 heads (no padding), whose centres are the ConViT's (±½, ±½) moved by +½:

# %%
conv2 = nn.Conv2d(3, 8, kernel_size=2)
psa2 = ConvAsPSA(conv2, locality_strength=20.0)
torch.testing.assert_close(psa2.centres, head_centres(4) + 0.5)
print(psa2.centres.tolist())
with torch.no_grad():
    y_conv, y_psa = conv2(x), psa2(x)
torch.testing.assert_close(y_psa, y_conv, atol=1e-4, rtol=0)
print(tuple(y_conv.shape), "max |PSA - conv| < 1e-4")

# %% [markdown]
# And why the shift is needed: with the ConViT's own centre (½, ½), even at α = 20 a head splits its
# attention equally over four pixels.

# %%
pos_proj = nn.Linear(3, 4)
local_init(pos_proj, nn.Linear(3, 3), 20.0)
attn = positional_attention(pos_proj, 7, 7)[3, 3 * 7 + 3].detach()  # head 4, Δ = (½, ½), middle query
print(attn.reshape(7, 7)[2:6, 2:6])
top = attn.topk(5).values
torch.testing.assert_close(top[:4], torch.full((4,), 0.25))
assert top[4] < 1e-8

# %% [markdown]
# How exact is "exact"? At finite α each head leaks e^{−α} of weight to each of its four nearest neighbours,
# so the error falls exponentially with α, until float32 rounding (~1e-7) takes over:

# %%
alphas = [0.5, 1, 2, 4, 6, 8, 10, 12, 15, 20, 25]
errors = {}
for name, conv in (("3x3, 9 heads", conv3), ("2x2, 4 heads", conv2)):
    with torch.no_grad():
        errors[name] = [(ConvAsPSA(conv, a)(x) - conv(x)).abs().max().item() for a in alphas]
    falls = errors[name][: alphas.index(15)]
    assert all(e1 > e2 for e1, e2 in zip(falls, falls[1:])), errors[name]  # strictly falling up to α = 15
    assert all(e < 1e-5 for a, e in zip(alphas, errors[name]) if a >= 15), errors[name]  # float32 rounding
# printed to one digit while e^(−α) dominates; from α = 15 on, only the bound the assert checks (the rest is
# rounding noise, which differs from CPU to CPU)
for name, errs in errors.items():
    print(f"{name}: " + " ".join(f"{e:.0e}" if a < 15 else "<1e-5" for a, e in zip(alphas, errs)))

# %%
fig, ax = plt.subplots(figsize=(5, 3.2), dpi=80)
for name, errs in errors.items():
    ax.semilogy(alphas, errs, "o-", label=name)
ax.semilogy(alphas, [torch.tensor(-a).exp().item() for a in alphas], "k--", lw=1, label="e^(−α)")
ax.set_xlabel("locality strength α")
ax.set_ylabel("max |PSA − conv|")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What a ConViT layer computes at initialization
#
# A GPSA layer of the ConViT is initialised with Eq. 5 *and* W_val = I (`local_init`), but its heads share the
# D channels: head h reads and writes only its own D_h = D/N_h of them. With W_qry = W_key = 0 (content
# ignored) and a sharp α, head h's attention is one-hot on the pixel at offset Δ_h, so the heads' outputs put
# together are the input with channel group h **shifted** by Δ_h — a convolution whose kernel holds one 1 per
# channel, at its group's tap. The output projection W_out, a 1 × 1 convolution, comes after. So the layer is
# `proj ∘ shift`: each input channel reaches the output through **one** tap of the k × k window, where a
# general k × k convolution (what `ConvAsPSA` computes, with heads as wide as the input) sees every channel
# through all k² taps. Checked on 9 heads of 2 channels each (D = 18), away from the border (where the softmax
# renormalises over the keys that exist instead of reading zero padding):

# %%
heads, width, side = 9, 2, 7
pos_proj, v = nn.Linear(3, heads), nn.Linear(heads * width, heads * width)
local_init(pos_proj, v, 30.0)  # sharp: every head one-hot on its tap
image_in = torch.randn(heads * width, side, side)
attn = positional_attention(pos_proj, side, side).detach()  # (heads, L, L)
values = rearrange(v(rearrange(image_in, "c h w -> (h w) c")), "l (n d) -> n l d", n=heads).detach()
gpsa_out = rearrange(attn @ values, "n (h w) d -> (n d) h w", h=side)  # each head's channels, put together

shift = torch.zeros(heads * width, heads * width, 3, 3)  # the convolution it equals: one tap per channel
for h, (dx, dy) in enumerate(head_centres(heads).long().tolist()):
    for c in range(h * width, (h + 1) * width):
        shift[c, c, dy + 1, dx + 1] = 1.0
conv_out = F.conv2d(image_in[None], shift, padding=1)[0]
torch.testing.assert_close(gpsa_out[:, 1:-1, 1:-1], conv_out[:, 1:-1, 1:-1], atol=1e-5, rtol=0)
centre = (side // 2) * side + side // 2  # the output pixel whose inputs we trace, by differentiating the layer


def layer_at_centre(image: torch.Tensor) -> torch.Tensor:
    vals = rearrange(v(rearrange(image, "c h w -> (h w) c")), "l (n d) -> n l d", n=heads)
    return rearrange(attn @ vals, "n l d -> l (n d)")[centre]  # every output channel at that pixel


jacobian = torch.autograd.functional.jacobian(layer_at_centre, image_in)  # (out channel, in channel, row, col)
paths = (jacobian.abs() > 1e-3).nonzero()  # the (output channel, input channel, pixel) triples that carry weight
print(f"{len(paths)} (output channel, input channel, tap) paths; a general 3 × 3 convolution has "
      f"{(heads * width) ** 2 * 9}")
assert len(paths) == heads * width and (paths[:, 0] == paths[:, 1]).all()  # one tap, its own channel, per output

# %% [markdown]
# With the ConViT-Ti's 4 heads, the centres are (±½, ±½). In the limit assumed above (α → ∞, the gate fully
# positional) each head averages the four pixels around its centre, and the layer is a 2 × 2 box blur of each
# channel group, shifted by half a pixel in its own direction, followed by the 1 × 1 projection. At the real
# initialisation (α = 1, σ(1) = 0.73) that 2 × 2 block holds about 0.57 of a head's attention (0.73 × 0.77 from
# the positional softmax, computed below on a wide grid, plus the content term's small share): a blur, wider than
# the box. Training then widens what each head reads: content attention (through the gate, next chapter) and
# W_val, W_out move away from their initial values.

# %%
offsets = torch.arange(-20, 21, dtype=torch.float64)  # one axis; the head's centre at ½, between offsets 0 and 1
axis = (-((offsets - 0.5) ** 2)).exp()  # α = 1
block = torch.sigmoid(torch.tensor(1.0, dtype=torch.float64)) * (axis[20:22].sum() / axis.sum()) ** 2
print(f"positional share of a head's attention on its 2 x 2 block at init: {block:.3f}")
assert 0.55 < block < 0.58

# %% [markdown]
# ## What we have
#
# `convit_edu.conv_attention` exports `ConvAsPSA`: a k×k convolution written as positional attention with k²
# heads as wide as the input, exact up to e^{−α}. A ConViT layer, initialised by chapter 03's `local_init`
# with narrower heads, starts as a blurred shift of each channel group followed by a 1 × 1 projection (a
# shift in the limit of a sharp α and a fully positional gate). Chapter 05 keeps
# this positional attention but adds the content attention back in, in a separate softmax, with a learnable
# gate per head.

# %% [markdown]
# ## Exercises
#
# **1. A Sobel filter as attention.** The horizontal Sobel kernel [[−1, 0, 1], [−2, 0, 2], [−1, 0, 1]] finds
# vertical edges. Build `sobel_psa`, a `ConvAsPSA` that computes it (one input channel, one output channel, padding
# 1, no bias) to within 10⁻³ on a grey 32 × 32 version of chapter 03's photograph; the reference answer draws what it
# sees.

# %%
with cbook.get_sample_data("grace_hopper.jpg") as f:
    photo = Image.open(f).convert("RGB").resize((224, 224), Image.BICUBIC)

# %%
sobel_psa = ...  # your answer: sobel_psa = ConvAsPSA(...)

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal

SOBEL_X = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])


def check_sobel_psa(layer: nn.Module) -> None:
    check_answer(isinstance(layer, ConvAsPSA), f"build it with ConvAsPSA(conv, locality_strength), got a "
                 f"{type(layer).__name__}")
    image = pil_to_tensor(photo.convert("L").resize((32, 32), Image.BICUBIC))[None].float() / 255
    with torch.no_grad():
        out = layer(image)
    want = F.conv2d(image, SOBEL_X[None, None], padding=1)
    check_answer(out.shape == want.shape, f"output {tuple(out.shape)}, expected {tuple(want.shape)}: one input "
                 "and one output channel, padding 1")
    check_answer(not torch.allclose(out, F.conv2d(image, SOBEL_X.T[None, None], padding=1), atol=1e-3), "this finds "
                 "horizontal edges: the kernel is transposed; its rows run along y, its columns along x")
    error = float((out - want).abs().max())
    check_answer(error < 1e-3, f"off by up to {error:.2g}: check the bias (none), and that α is large enough for each "
                 "head to be one-hot on its tap (the error shrinks like e^(−α))")


def conv3x3(kernel: torch.Tensor, out_channels: int = 1) -> nn.Conv2d:
    """A 1-channel 3 × 3 convolution, padding 1, no bias, with `kernel` for each output channel."""
    conv = nn.Conv2d(1, out_channels, kernel_size=3, padding=1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(kernel.expand_as(conv.weight))
    return conv


grade("sobel_psa", sobel_psa, check_sobel_psa)
demonstrate(check_sobel_psa, {"the convolution itself": conv3x3(SOBEL_X),
                              "two output channels": ConvAsPSA(conv3x3(SOBEL_X, 2), locality_strength=20.0),
                              "the kernel transposed": ConvAsPSA(conv3x3(SOBEL_X.T), locality_strength=20.0),
                              "α = 1, the ConViT's": ConvAsPSA(conv3x3(SOBEL_X), locality_strength=1.0)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(sobel_psa):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    sobel = nn.Conv2d(1, 1, kernel_size=3, padding=1, bias=False)
    with torch.no_grad():
        sobel.weight.copy_(torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]))
    sobel_psa = ConvAsPSA(sobel, locality_strength=20.0)  # α large: each head one-hot on its tap

    grey = pil_to_tensor(photo.convert("L").resize((32, 32), Image.BICUBIC))[None].float() / 255
    with torch.no_grad():
        edges = sobel_psa(grey)[0, 0]
    fig, axes = plt.subplots(1, 2, figsize=(5, 2.5), dpi=80)
    axes[0].imshow(grey[0, 0], cmap="gray"), axes[0].set_title("input", fontsize=9)
    axes[1].imshow(edges, cmap="RdBu"), axes[1].set_title("Sobel-x by 9 attention heads", fontsize=9)
    for ax in axes:
        ax.set_xticks([]), ax.set_yticks([])
    plt.show()
    grade("sobel_psa", sobel_psa, check_sobel_psa)

# %% [markdown]
# **2. A shift as attention.** Find the 3 × 3 kernel `shift_kernel` (a (3, 3) tensor) with which
# `nn.Conv2d(1, 1, 3, padding=1, bias=False)` moves a one-channel image one pixel to the **right**:
# out[r, s] = x[r, s − 1], zeros coming in at the left edge. Built as a `ConvAsPSA`, only one of the 9 heads
# then reaches the output (the others get weight 0 in `proj`): predict its centre Δ_h, and set `shift_head` to
# its index h.

# %%
shift_kernel, shift_head = ..., ...  # your answer: shift_kernel = ...; shift_head = ...

# %%
def check_shift(kernel: torch.Tensor, head: int) -> None:
    kernel = torch.as_tensor(kernel, dtype=torch.float32)
    check_answer(tuple(kernel.shape) == (3, 3), f"the kernel is a (3, 3) tensor, got shape {tuple(kernel.shape)}")
    layer = ConvAsPSA(conv3x3(kernel), locality_strength=20.0)
    image = torch.arange(1.0, 21.0).reshape(1, 1, 4, 5)
    with torch.no_grad():
        out = layer(image)
    right, left = F.pad(image, (1, 0))[..., :-1], F.pad(image, (0, 1))[..., 1:]
    check_answer(not torch.allclose(out, left, atol=1e-3), "this kernel moves the image to the left: nn.Conv2d does "
                 "not flip its kernel (out[r, s] = Σ w[i, j]·x[r + i − 1, s + j − 1], a cross-correlation)")
    check_answer(torch.allclose(out, right, atol=1e-3), "out[r, s] must be x[r, s − 1]: a single 1 in the kernel, "
                 "in its middle row (rows of the kernel are y, columns x)")
    check_answer(isinstance(head, int) and not isinstance(head, bool) and 0 <= head < 9,
                 f"a head index is an int from 0 to 8, got {head!r}")
    busy = layer.proj.weight[0].nonzero().flatten().tolist()  # the heads whose output reaches proj
    dx, dy = (int(c) for c in layer.centres[head].tolist())
    check_answer([head] == busy, f"head {head} is centred at Δ = ({dx}, {dy}), (column, row) offsets; the output "
                 "at (r, s) copies the pixel at (r, s − 1). ConvAsPSA gives the tap in row i, column j to head i + 3·j")


def one_at(row: int, col: int) -> torch.Tensor:
    """A 3 × 3 kernel with a single 1."""
    return torch.zeros(3, 3).index_put_((torch.tensor(row), torch.tensor(col)), torch.tensor(1.0))


grade("shift_kernel, shift_head", (shift_kernel, shift_head), lambda answer: check_shift(*answer))
demonstrate(lambda answer: check_shift(*answer), {
    "a 2 × 2 kernel": (torch.eye(2), 0), "the kernel flipped, as a convolution would": (one_at(1, 2), 5),
    "the 1 in the middle column (a move down)": (one_at(0, 1), 3), "a head index of 9": (one_at(1, 0), 9),
    "the head the tap would have with a flipped kernel": (one_at(1, 0), 7)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(shift_kernel, shift_head):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    # nn.Conv2d does not flip its kernel: out[r, s] = Σ w[i, j]·x[r + i − 1, s + j − 1], so w[1, 0] reads x[r, s − 1]
    shift_kernel = torch.zeros(3, 3)
    shift_kernel[1, 0] = 1.0
    # ConvAsPSA gives the tap in row i, column j to head i + 3·j, centred at Δ = (j − 1, i − 1) = (−1, 0) here:
    # the only busy head looks one pixel to the left and copies it to the right
    shift_head = 1 + 3 * 0

    shift = nn.Conv2d(1, 1, kernel_size=3, padding=1, bias=False)
    with torch.no_grad():
        shift.weight.copy_(shift_kernel[None, None])
        small = torch.arange(1.0, 13.0).reshape(1, 1, 3, 4)
        moved = ConvAsPSA(shift, locality_strength=20.0)(small)
    print(small[0, 0].int())
    print(moved[0, 0].round().int())  # error ~ e^(−20): rounding gives the exact shifted image
    print(f"shift_head = {shift_head}, centred at Δ = {tuple(int(c) for c in ConvAsPSA(shift, 20.0).centres[shift_head])}")
    grade("shift_kernel, shift_head", (shift_kernel, shift_head), lambda answer: check_shift(*answer))
