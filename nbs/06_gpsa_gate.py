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
# # Eq. 7 as the gate moves: from content to position
#
# Chapter 05 built the GPSA layer and looked at it at initialisation, σ(1) ≈ 0.73 of each head positional. This
# chapter moves the gate, the one number per head that training will move, and asks what it does to a head.
#
# The gate slides each head's attention along a straight line between two maps: its content attention
# (σ = 0, what a ViT head would do) and its positional attention (σ = 1, a blurred tap of a convolution).
# Below, one head of a freshly initialised layer reads the Grace Hopper photograph (patches of 16 pixels
# embedded by a random 16 × 16 convolution and a LayerNorm, as in chapter 03's Fig. 3), with its gate forced
# to five values (`gate_override`, the hook chapter 34_masking's masking uses), on one logarithmic colour scale. At
# initialization (weights of standard deviation 0.02) the content map is nearly uniform; we scale W_qry and
# W_key up 4 times so that it shows something, a random read-out of the picture — training (chapter 32) makes
# it useful. The ConViT starts at σ(1) = 0.73, the fourth map (fifth panel): mostly the positional bump (over half the
# attention on the four patches around query + Δ_h, where the content map puts less than uniform would), with the
# picture faintly behind it.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
import math

import matplotlib.pyplot as plt
import torch
from einops import rearrange
from torch import nn

from convit_edu.checks import check_answer
from convit_edu.conv_init import head_centres
from convit_edu.gpsa_reference import GPSAReference

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

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
dx, dy = head_centres(4)[head].tolist()  # (−½, −½): the bump covers the 4 patches around query + Δ_h
bump = [int((5 + dy + a) * 14 + 6 + dx + b) for a in (-0.5, 0.5) for b in (-0.5, 0.5)]
share = {sigma: round(mixed[sigma][bump].sum().item(), 3) for sigma in sigmas}
assert share[0.73] > 0.5 > share[0.5] and share[0.0] < 4 / 196, share  # at init: mostly the bump
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
print("share of the attention on the 4 patches around query + Δ_h, per σ:", share)

# %% [markdown]
# Eq. 7 is a straight line in σ: every map above is the two end maps, σ = 0 and σ = 1, mixed. So is the share of
# the bump, which falls from 0.73's value to the content map's as σ goes to 0 — training moves σ, and with it
# how convolutional the head is, along that line. Checked on the layer's own maps, to 10⁻⁶:

# %%
for sigma in sigmas:
    torch.testing.assert_close(mixed[sigma], torch.lerp(mixed[0.0], mixed[1.0], sigma), rtol=0, atol=1e-6)
    assert abs(mixed[sigma][bump].sum() - torch.lerp(mixed[0.0][bump].sum(), mixed[1.0][bump].sum(), sigma)) < 1e-6
print(f"the maps at σ = {', '.join(map(str, sigmas[1:-1]))} are the two end maps mixed by Eq. 7, to 1e-6, and so are "
      "their shares of the bump")

# %% [markdown]
# ## Exercises
#
# **1. The gate, read off a map.** Training moves σ; an attention map shows where a head looks. Write
# `sigma_of(attn, content, position)`: the gate σ of a head whose gated attention map is `attn`, given its content
# map (σ = 0) and its positional map (σ = 1), three tensors of the same shape. Use every key, not one (a key where the
# two end maps nearly agree says little about σ).

# %%
sigma_of = ...  # your answer: def sigma_of(attn, content, position): ...

# %%
from convit_edu.checks import demonstrate, grade, reveal


def check_sigma_of(fn) -> None:
    for sigma in (0.1, 0.45, 0.9):
        layer.gate_override = sigma
        with torch.no_grad():
            attn = layer(tokens, return_attention=True)[1][0, head, query]
        layer.gate_override = None
        got = fn(attn, mixed[0.0], mixed[1.0])
        check_answer(torch.as_tensor(got).numel() == 1, f"σ is one number for the whole map, got a tensor of shape "
                     f"{tuple(torch.as_tensor(got).shape)}")
        got = float(got)
        check_answer(abs(got - (1 - sigma)) > 1e-4, f"at σ = {sigma} you find {got:.3f} = 1 − σ: σ weighs the "
                     "positional map, 1 − σ the content map")
        check_answer(abs(got - sigma) < 1e-4, f"at σ = {sigma} you find {got:.3f}: the map is (1 − σ)·content + "
                     "σ·position, so attn − content = σ·(position − content); fit σ over every key")


grade("sigma_of", sigma_of, check_sigma_of)
demonstrate(check_sigma_of, {
    "one σ per key": lambda attn, content, position: (attn - content) / (position - content),
    "the weights swapped": lambda attn, content, position: 1 - ((attn - content) @ (position - content))
    / (position - content).square().sum(),
    "the content part forgotten (attn / position)": lambda attn, content, position: (attn @ position)
    / position.square().sum(),
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(sigma_of):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def sigma_of(attn: torch.Tensor, content: torch.Tensor, position: torch.Tensor) -> float:
        # attn − content = σ·(position − content): the least-squares σ over every key
        direction = position - content
        return float((attn - content) @ direction / (direction @ direction))

    grade("sigma_of", sigma_of, check_sigma_of)

# %% [markdown]
# **2. The gate at which a head is half convolutional.** Write `sigma_for_share(target, content, position, bump)`:
# the σ at which the head puts the share `target` of its attention on the keys `bump` (a list of key indices),
# from the two end maps. The check runs the layer at your σ and measures the share.

# %%
sigma_for_share = ...  # your answer: def sigma_for_share(target, content, position, bump): ...

# %%
def check_sigma_for_share(fn) -> None:
    for target in (0.25, 0.5):
        sigma = fn(target, mixed[0.0], mixed[1.0], bump)
        check_answer(0 <= sigma <= 1, f"σ = σ(λ) lies between 0 and 1, got {sigma:.3f} for the share {target} (a λ?)")
        layer.gate_override = sigma
        with torch.no_grad():
            got = layer(tokens, return_attention=True)[1][0, head, query][bump].sum().item()
        layer.gate_override = None
        check_answer(abs(got - target) < 1e-5, f"at your σ the layer puts {got:.3f} on the bump, not {target}: the "
                     "share is (1 − σ)·(content's share) + σ·(position's share); solve that for σ")


def as_lambda(target, content, position, bump):  # a slip: the gate's parameter λ, not σ(λ)
    low, high = content[bump].sum().item(), position[bump].sum().item()
    sigma = (target - low) / (high - low)
    return math.log(sigma / (1 - sigma))


grade("sigma_for_share", sigma_for_share, check_sigma_for_share)
demonstrate(check_sigma_for_share, {"the target itself as σ": lambda target, *maps: target, "λ, not σ": as_lambda})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(sigma_for_share):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def sigma_for_share(target: float, content: torch.Tensor, position: torch.Tensor, bump: list[int]) -> float:
        low, high = content[bump].sum().item(), position[bump].sum().item()  # the share at σ = 0 and at σ = 1
        return (target - low) / (high - low)  # the share is linear in σ

    half = sigma_for_share(0.5, mixed[0.0], mixed[1.0], bump)
    print(f"half the attention on the bump at σ = {half:.3f} (λ = {math.log(half / (1 - half)):.2f}); at init σ = 0.731")
    grade("sigma_for_share", sigma_for_share, check_sigma_for_share)
