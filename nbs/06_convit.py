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
# # The ConViT and DeiT models
#
# Chapters 01-05 built the attention layers: DeiT's `MHSA` and the ConViT's `GPSA`. This chapter assembles them
# into whole networks: the configuration, the patch embedding, the MLP with stochastic depth, the pre-norm
# block, and the model of Fig. 4 — a DeiT whose first `local_up_to_layer` = 10 of its 12 blocks use GPSA, with
# the class token joining only *after* the last GPSA block. Chapter 07 names the models of Table 1 and counts them.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp models
# The ConViT and DeiT models: the config, patch embedding, blocks, and the vision transformer itself.

# %%
import torch

from convit_edu.checks import expect_error

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## The architecture, in one picture
#
# ```
# image (B, 3, H, W)
#   └─ patch embedding: Conv2d(kernel = stride = 16)   → (B, L, D)      L = (H/16)·(W/16) patches
#   └─ + pos_embed (one learned slot per patch)
#   └─ blocks 1 … local_up_to_layer:   x + GPSA(LN(x)),  x + MLP(LN(x))     patches only
#   └─ concatenate the class token                       → (B, 1 + L, D)
#   └─ blocks local_up_to_layer+1 … depth:  x + MHSA(LN(x)), x + MLP(LN(x))
#   └─ LayerNorm, take the class token, Linear head      → (B, num_classes)
# ```
#
# DeiT is the same network with `MHSA` in every block (`local_up_to_layer = 0`, with qkv bias) and a class
# token that joins at the input, with its own slot in `pos_embed`. The ConViT's class token has no place on the
# patch grid that GPSA attends over by *relative* position, so it joins once the positional layers are done
# (Sec. 3, "Architectural details").
#
# ## The configuration
#
# Everything that defines a model is one frozen dataclass. `embed_dim` is always the total token width D_emb
# and `head_dim = embed_dim // num_heads` the width per head (the official code's `embed_dim` argument was the
# width per head, which broke checkpoint loading for its users). The ablation switches of the paper are fields
# too; chapter 07 exercises them.

# %%
#| export
from dataclasses import dataclass, fields

from convit_edu.checks import one_of, positive_int
from convit_edu.conv_init import check_locality_strength

LOCAL_ATTENTIONS = ("gpsa", "gpsa_reference", "psa")


@dataclass(frozen=True)
class ModelConfig:
    """A ConViT or DeiT (Sec. 3, Table 1). ``embed_dim`` is the total width D_emb, ``head_dim`` the width per head.

    Architecture: ``img_size`` (int or (height, width)) and ``patch_size`` fix the patch grid that ``pos_embed``
    is built for (the model also runs on other sizes, interpolating it); ``depth`` blocks of ``num_heads``
    heads, MLP width ``mlp_ratio * embed_dim``; ``qkv_bias`` for the query/key/value projections (DeiT: True,
    ConViT: False). The first ``local_up_to_layer`` blocks use positional attention, initialized as a
    convolution with ``locality_strength`` α > 0 (Eq. 5); the class token joins after them.
    ``class_token_pos_embed`` (DeiT) makes the class token join at the input with its own ``pos_embed`` slot;
    it requires ``local_up_to_layer = 0``. ``distilled`` adds DeiT's distillation token and head.

    Regularization: ``drop_rate`` (dropout after the positional embedding, the attention projection and in the
    MLP), ``attn_drop_rate`` (on attention weights), ``drop_path_rate`` (stochastic depth, rising linearly from
    0 in the first block to this value in the last).

    Ablations (Table 3, App. A): ``local_attention`` = "gpsa" (fast, default), "gpsa_reference" (materializes
    the attention, same weights) or "psa" (Eq. 4, no gating); ``use_local_init=False`` removes the
    convolutional initialization; ``freeze_gating`` freezes every λ at 0 (σ(λ) = 1/2: content and position get
    equal weight); ``freeze_gpsa`` freezes the whole attention of the positional layers. ``local_up_to_layer``
    sets the number of GPSA layers (0 gives a DeiT-like model whose class token has no positional slot).
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 192
    depth: int = 12
    num_heads: int = 4
    mlp_ratio: float = 4.0
    qkv_bias: bool = False
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    local_up_to_layer: int = 10
    locality_strength: float = 1.0
    class_token_pos_embed: bool = False
    distilled: bool = False
    local_attention: str = "gpsa"
    use_local_init: bool = True
    freeze_gating: bool = False
    freeze_gpsa: bool = False

    def __post_init__(self) -> None:
        size = self.img_size
        if isinstance(size, (tuple, list)):
            if len(size) != 2:
                raise ValueError(f"img_size must be an int or (height, width), got {size!r}")
            size = tuple(positive_int("img_size", s) for s in size)
        else:
            size = positive_int("img_size", size)
        object.__setattr__(self, "img_size", size)  # a list from a JSON config becomes a tuple
        for name in ("patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads"):
            positive_int(name, getattr(self, name))
        height, width = self.image_size
        for side, value in (("height", height), ("width", width)):
            if value % self.patch_size:
                raise ValueError(
                    f"img_size {value} (image {side}) is not divisible by patch_size {self.patch_size}"
                )
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}: embed_dim is the "
                f"total width, num_heads * head_dim (e.g. embed_dim={self.num_heads * 48} for head_dim 48)"
            )
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be positive, got {self.mlp_ratio}")
        for name in ("drop_rate", "attn_drop_rate", "drop_path_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.local_up_to_layer < self.depth:
            raise ValueError(
                f"local_up_to_layer {self.local_up_to_layer} must be in [0, depth) = [0, {self.depth}): the class "
                f"token joins after the last GPSA block and needs at least one SA block to read the patches"
            )
        if self.class_token_pos_embed and self.local_up_to_layer:
            raise ValueError(
                f"class_token_pos_embed (a DeiT class token joining at the input) needs local_up_to_layer=0, "
                f"got local_up_to_layer={self.local_up_to_layer}"
            )
        one_of("local_attention", self.local_attention, LOCAL_ATTENTIONS)
        if self.use_local_init:  # α is used by the convolutional initialization only
            check_locality_strength(self.locality_strength)
        for name in ("freeze_gating", "freeze_gpsa"):
            if getattr(self, name) and not self.local_up_to_layer:
                raise ValueError(f"{name} needs GPSA layers, but local_up_to_layer=0")
        if self.freeze_gating and self.local_attention == "psa":
            raise ValueError("freeze_gating needs gated layers, but local_attention='psa' has no gating_param")

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) in pixels."""
        return (self.img_size, self.img_size) if isinstance(self.img_size, int) else self.img_size

    @property
    def grid_size(self) -> tuple[int, int]:
        """(rows, columns) of the patch grid that ``pos_embed`` is built for."""
        height, width = self.image_size
        return height // self.patch_size, width // self.patch_size

    @property
    def num_patches(self) -> int:
        rows, cols = self.grid_size
        return rows * cols

    @property
    def head_dim(self) -> int:
        """Width of one head: embed_dim // num_heads (48 for ConViT-Ti/S/B, 64 for DeiT and the "+" models)."""
        return self.embed_dim // self.num_heads

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens in front of the patches once the class token has joined: class (+ distillation) token."""
        return 1 + int(self.distilled)


def config_fields() -> list[str]:
    """Names of the ``ModelConfig`` fields, the keys ``create_model`` accepts as overrides."""
    return [f.name for f in fields(ModelConfig)]


# %% [markdown]
# A config of a ConViT-Ti, and what it derives: 4 heads of width 48, a 14×14 grid of patches. A bad value is
# refused when the config is made, naming the value and what would be right:

# %%
cfg = ModelConfig(embed_dim=192, num_heads=4)
print(f"embed_dim {cfg.embed_dim} = num_heads {cfg.num_heads} x head_dim {cfg.head_dim}; grid {cfg.grid_size}")
assert (cfg.head_dim, cfg.grid_size, cfg.num_patches) == (48, (14, 14), 196)
print(expect_error(lambda: ModelConfig(embed_dim=200, num_heads=3)))

# %% [markdown]
# ## Patch embedding
#
# The ViT cuts a 224×224 image into 14×14 patches of 16×16 pixels and maps each flattened patch (3·16·16 = 768
# numbers) to a D_emb-dimensional token with one shared linear map: a `Conv2d` whose kernel and stride equal the
# patch size. `rearrange` turns its (B, D, H/p, W/p) output into the row-major tokens (B, L, D) that
# `rel_indices` assumes (token t = row·W + col). The module is `patch_embed.proj`, as in the official checkpoints.

# %%
#| export
import torch
from einops import rearrange
from torch import Tensor, nn


class PatchEmbed(nn.Module):
    """Cut images into patch_size×patch_size patches and embed each linearly (the ViT stem).

    ``forward(x)`` takes (B, in_chans, H, W) with H and W multiples of ``patch_size`` and returns the tokens
    (B, L, embed_dim), row-major over the patch grid, and the grid size (H / patch_size, W / patch_size).
    """

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.patch_size, self.in_chans = patch_size, in_chans
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        if x.ndim != 4:
            raise ValueError(f"expected images of shape (batch, channels, height, width), got {tuple(x.shape)}")
        if x.dtype != self.proj.weight.dtype and not torch.is_autocast_enabled(x.device.type):
            hint = "x.float() / 255, then normalise" if not x.is_floating_point() else f"x.to({self.proj.weight.dtype})"
            raise TypeError(f"expected {self.proj.weight.dtype} images like the model's weights, got {x.dtype}: "
                            f"pass {hint} (or run under torch.autocast)")
        if x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected images with in_chans={self.in_chans} channels, got {x.shape[1]} (shape {tuple(x.shape)})"
            )
        height, width = x.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(
                f"image size {height}x{width} is not divisible by patch_size {self.patch_size}: "
                f"resize or crop to a multiple of {self.patch_size}"
            )
        x = self.proj(x)
        grid = (x.shape[-2], x.shape[-1])
        return rearrange(x, "b d h w -> b (h w) d"), grid


# %% [markdown]
# Check: the convolution equals "flatten every patch, multiply by the same matrix", on a 2-channel 8×12 image
# cut into 4×4 patches (a 2×3 grid).

# %%
embed = PatchEmbed(patch_size=4, in_chans=2, embed_dim=5)
img = torch.randn(1, 2, 8, 12)
tokens, grid = embed(img)
patches = rearrange(img, "b c (h p) (w q) -> b (h w) (c p q)", p=4, q=4)  # row-major patches, flattened
by_hand = patches @ embed.proj.weight.flatten(1).T + embed.proj.bias
print("tokens", tuple(tokens.shape), "grid", grid, "| one patch flattened:", tuple(patches.shape))
torch.testing.assert_close(tokens, by_hand)

# %% [markdown]
# ## The MLP and stochastic depth
#
# Each block ends with a two-layer feed-forward network, width 4·D_emb with a GELU in between (`mlp.fc1`,
# `mlp.fc2`). DeiT trains with **stochastic depth** (drop path): in training, each sample skips the residual
# branch of a block with probability p, and the kept branches are scaled by 1/(1−p) so that the expected output
# is unchanged; at test time the branch is always used. p rises linearly with depth, from 0 in the first block
# to `drop_path_rate` (0.1 in the DeiT recipe) in the last.

# %%
#| export
import torch
from torch import Tensor, nn


class Mlp(nn.Module):
    """The feed-forward half of a block: Linear(D → hidden), GELU, dropout, Linear(hidden → D), dropout."""

    def __init__(self, embed_dim: int, hidden_dim: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, embed_dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: in training, zero the whole residual branch of a sample with probability ``p`` and
    scale the kept ones by 1/(1−p); the identity in eval mode."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop path probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p:.3f}"


# %% [markdown]
# Checks: in eval mode the identity; in training every sample is either dropped whole or scaled by 1/(1−p).

# %%
dp = DropPath(0.25)
x = torch.ones(4000, 3, 2)
torch.testing.assert_close(dp.eval()(x), x)
y = dp.train()(x)
per_sample = y.flatten(1)
assert torch.equal(per_sample, per_sample[:, :1].expand_as(per_sample))  # a sample is dropped or kept whole
assert set(per_sample[:, 0].unique().tolist()) == {0.0, torch.tensor(1 / 0.75).item()}
kept = (per_sample[:, 0] > 0).float().mean().item()
print(f"kept {kept:.3f} of the samples (expected 0.75), mean output {y.mean().item():.3f} (expected 1)")
assert abs(kept - 0.75) < 0.03 and abs(y.mean().item() - 1) < 0.04

# %% [markdown]
# ## The block
#
# Pre-norm, as in ViT and DeiT: x ← x + DropPath(Attn(LN(x))), then x ← x + DropPath(MLP(LN(x))), LayerNorm
# with ε = 10⁻⁶. The attention is `MHSA` (chapter 01) or one of the positional attentions of chapter 05:
# the fast `GPSA`, the `GPSAReference` that materializes the attention matrix (same weights, same keys), or
# the ungated `PSA` of Eq. 4 for the App. A ablation. Positional layers need the patch grid (H, W) to build
# `rel_indices`; the block hands them the grid the model is built for (`grid_size`, so that they build it at
# construction, chapter 05) and passes the grid of each input through.

# %%
#| export
import torch
from torch import Tensor, nn

from convit_edu.attention import MHSA
from convit_edu.checks import one_of
from convit_edu.gpsa import GPSA, PSA, GPSAReference


class Block(nn.Module):
    """Pre-norm transformer block: ``x + DropPath(attn(LN(x)))`` then ``x + DropPath(mlp(LN(x)))``.

    ``attention`` is "mhsa" (Eq. 1-3), "gpsa" (Eq. 6-7, fast), "gpsa_reference" (Eq. 6-7, materialized) or
    "psa" (Eq. 4). ``forward(x, grid_size, return_attention)`` returns the new tokens, and with
    ``return_attention`` also the attention weights (B, num_heads, L, L). The constructor's ``grid_size`` is the
    patch grid the positional layers build their ``rel_indices`` for at once (None: at their first forward).
    """

    def __init__(
        self, embed_dim: int, num_heads: int, attention: str = "mhsa", mlp_ratio: float = 4.0, qkv_bias: bool = False,
        drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0, locality_strength: float = 1.0,
        use_local_init: bool = True, grid_size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim, eps=1e-6)
        if attention == "mhsa":
            self.attn = MHSA(embed_dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)
        else:
            layers = {"gpsa": GPSA, "gpsa_reference": GPSAReference, "psa": PSA}
            self.attn = layers[one_of("attention", attention, ["mhsa", *layers])](
                embed_dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop,
                locality_strength=locality_strength, use_local_init=use_local_init, grid_size=grid_size,
            )
        self.is_positional = attention != "mhsa"
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(embed_dim, eps=1e-6)
        self.mlp = Mlp(embed_dim, int(embed_dim * mlp_ratio), drop=drop)

    def forward(
        self, x: Tensor, grid_size: tuple[int, int] | None = None, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        h = self.norm1(x)
        if self.is_positional:
            out = self.attn(h, grid_size=grid_size, return_attention=return_attention)
        else:
            out = self.attn(h, return_attention=return_attention)
        y, attn = out if return_attention else (out, None)
        x = x + self.drop_path(y)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return (x, attn) if return_attention else x


# %% [markdown]
# A GPSA block on a 3×4 grid of 12 tokens, and an MHSA block on 1 + 12 tokens; both keep the shape, and the
# attention weights they return are row-stochastic:

# %%
torch.manual_seed(0)
gpsa_block, mhsa_block = Block(48, 4, attention="gpsa"), Block(48, 4, attention="mhsa", qkv_bias=True)
x = torch.randn(2, 12, 48)
y, attn = gpsa_block(x, grid_size=(3, 4), return_attention=True)
print("GPSA block", tuple(x.shape), "->", tuple(y.shape), "attention", tuple(attn.shape))
y2, attn2 = mhsa_block(torch.randn(2, 13, 48), return_attention=True)
print("MHSA block", (2, 13, 48), "->", tuple(y2.shape), "attention", tuple(attn2.shape))
torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, 12))
torch.testing.assert_close(attn2.sum(-1), torch.ones(2, 4, 13))
torch.testing.assert_close(gpsa_block(x, grid_size=(3, 4)), y)  # the fast path gives the same tokens

# %% [markdown]
# ## Positional embeddings at another resolution
#
# `pos_embed` holds one learned vector per patch of the grid the model was built for. On an image of another
# size the grid changes (224 → 14×14, 160 → 10×10, 224×160 → 14×10), so we view the vectors as a
# D_emb-channel image of the old grid and resample it bicubically to the new one, as DeiT does to fine-tune at
# 384 px. Slots that do not belong to a patch (DeiT's class and distillation tokens) are carried over as they
# are. GPSA layers need nothing of the kind: their `rel_indices` are rebuilt for the new H×W grid.

# %%
#| export
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor


def resize_pos_embed(
    pos_embed: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int], num_prefix_tokens: int = 0
) -> Tensor:
    """Bicubically resample the patch slots of ``pos_embed`` (1, P + H·W, D) from grid ``old_grid`` = (H, W) to
    ``new_grid``; the first ``num_prefix_tokens`` slots P (class/distillation tokens) are kept as they are."""
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if pos_embed.ndim != 3 or pos_embed.shape[1] != num_prefix_tokens + old_grid[0] * old_grid[1]:
        raise ValueError(
            f"pos_embed of shape {tuple(pos_embed.shape)} does not hold {num_prefix_tokens} prefix slots + a "
            f"{old_grid[0]}x{old_grid[1]} grid"
        )
    if old_grid == new_grid:
        return pos_embed
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    image = rearrange(patches, "b (h w) d -> b d h w", h=old_grid[0], w=old_grid[1])
    image = F.interpolate(image.float(), size=new_grid, mode="bicubic", align_corners=False).to(pos_embed.dtype)
    return torch.cat([prefix, rearrange(image, "b d h w -> b (h w) d")], dim=1)


# %% [markdown]
# A smooth embedding stays smooth: an embedding whose first channel is the row index and whose second is the
# column index is resampled to one that still grows down the rows and is constant along each row (bicubic
# interpolation overshoots a little at the borders, it is not exact), and the class-token slot is untouched.

# %%
rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(6.0), indexing="ij")
plane = torch.stack([rows.flatten(), cols.flatten()], dim=-1)  # (24, 2): channel 0 = row, channel 1 = column
pos = torch.cat([torch.full((1, 2), -7.0), plane])[None]        # one class slot + a 4x6 grid
resized = resize_pos_embed(pos, (4, 6), (8, 12), num_prefix_tokens=1)
print("shape", tuple(pos.shape), "->", tuple(resized.shape))
torch.testing.assert_close(resized[0, 0], torch.tensor([-7.0, -7.0]))
new_rows = resized[0, 1:, 0].reshape(8, 12)
print("rows of the 4x6 grid seen on 8x12, first column:", new_rows[:, 0])
assert torch.all(new_rows.diff(dim=0) >= 0) and torch.allclose(new_rows, new_rows[:, :1].expand(8, 12))

# %% [markdown]
# ## The model
#
# `VisionTransformer` follows the picture at the top, with the names of the official checkpoints
# (`patch_embed.proj`, `pos_embed`, `cls_token`, `blocks.i.{norm1, attn, norm2, mlp.fc1, mlp.fc2}`, `norm`,
# `head`). Initialization is DeiT's (normal, std 0.02, zero biases), except for the positional layers, which
# initialized themselves (chapter 05: the same normal init, then Eq. 5): Eq. 5 is applied once per layer, in
# one place (the official ConViT applies it, overwrites it with the global init, and applies it again).
# `forward_features` can also return a `ForwardRecord` of every block's attention and input, for chapters
# 09-10; `distilled=True` adds DeiT's distillation token and head; `mask_pos_embed` drops the absolute
# positional embedding at test time (SM F, Table 5).

# %%
#| export
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from convit_edu.gpsa import GPSA, GPSAReference


@dataclass
class ForwardRecord:
    """What ``forward_features(..., return_attention / return_block_inputs)`` records, one entry per block.

    ``features``: the normalized output tokens (B, P + L, D). ``grid_size``: the patch grid (rows, cols) of
    this input. ``num_prefix_tokens[i]``: tokens in front of the patches in block i (0 in the GPSA blocks of a
    ConViT). ``attentions[i]``: attention weights (B, num_heads, T_i, T_i) of block i. ``block_inputs[i]``: the
    tokens (B, T_i, D) entering block i, before its first LayerNorm. The lists are None when not requested.
    """

    features: Tensor
    grid_size: tuple[int, int]
    num_prefix_tokens: list[int]
    attentions: list[Tensor] | None = None
    block_inputs: list[Tensor] | None = None


class VisionTransformer(nn.Module):
    """The ConViT (``local_up_to_layer`` > 0 GPSA blocks, class token joining after them, Fig. 4) and the DeiT
    (``local_up_to_layer = 0``, ``class_token_pos_embed``) of Table 1, built from a ``ModelConfig``.

    ``forward(x)`` takes images (B, in_chans, H, W), H and W multiples of ``patch_size`` (any size: ``pos_embed``
    is interpolated for a grid other than the config's) and returns logits (B, num_classes); with
    ``distilled`` it returns ``(class_logits, dist_logits)`` in training mode and their mean in eval mode.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch_embed = PatchEmbed(c.patch_size, c.in_chans, c.embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim))
        if c.distilled:
            self.dist_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim))
        prefix_slots = c.num_prefix_tokens if c.class_token_pos_embed else 0
        self.pos_embed = nn.Parameter(torch.zeros(1, prefix_slots + c.num_patches, c.embed_dim))
        self.pos_drop = nn.Dropout(c.drop_rate)
        drop_path_rates = [c.drop_path_rate * i / max(c.depth - 1, 1) for i in range(c.depth)]  # linear in depth
        self.blocks = nn.ModuleList(
            Block(
                c.embed_dim, c.num_heads,
                attention=c.local_attention if i < c.local_up_to_layer else "mhsa",
                mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias, drop=c.drop_rate, attn_drop=c.attn_drop_rate,
                drop_path=drop_path_rates[i], locality_strength=c.locality_strength,
                use_local_init=c.use_local_init, grid_size=c.grid_size,
            )
            for i in range(c.depth)
        )
        self.norm = nn.LayerNorm(c.embed_dim, eps=1e-6)
        self.head = nn.Linear(c.embed_dim, c.num_classes)
        if c.distilled:
            self.head_dist = nn.Linear(c.embed_dim, c.num_classes)
        self.mask_pos_embed = False
        self._init_weights()

    @property
    def local_layers(self) -> list[nn.Module]:
        """The positional attention modules (GPSA/PSA) of the first ``local_up_to_layer`` blocks."""
        return [block.attn for block in self.blocks[: self.config.local_up_to_layer]]

    @property
    def gated_layers(self) -> list[nn.Module]:
        """The GPSA layers: the ``local_layers`` that have a gate (none when they are PSA)."""
        return [layer for layer in self.local_layers if isinstance(layer, (GPSA, GPSAReference))]

    @torch.no_grad()
    def gates(self) -> Tensor:
        """σ(λ_h) (Eq. 7) of every head of every GPSA layer, as the forward mixes with them (``gate_override``
        included): (GPSA layers, num_heads), detached, on the model's device; (0, num_heads) without GPSA layers."""
        layers = self.gated_layers
        if not layers:
            return self.cls_token.new_zeros(0, self.config.num_heads)
        return torch.stack([layer.gate() for layer in layers])

    @torch.no_grad()
    def _init_weights(self) -> None:
        c = self.config
        # the positional layers initialized themselves (init_weights: this normal init, then Eq. 5)
        positional = {id(m) for layer in self.local_layers for m in layer.modules()}
        # DeiT's trunc_normal_(std=0.02) truncates at ±2, i.e. 100 standard deviations: it is a plain normal,
        # which normal_ samples many times faster
        for module in self.modules():
            if isinstance(module, nn.Linear) and id(module) not in positional:
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for token in (self.pos_embed, self.cls_token, getattr(self, "dist_token", None)):
            if token is not None:
                nn.init.normal_(token, std=0.02)
        for attn in self.local_layers:
            if c.freeze_gating:
                attn.gating_param.zero_()
                attn.gating_param.requires_grad_(False)
            if c.freeze_gpsa:
                attn.requires_grad_(False)

    def no_weight_decay(self) -> set[str]:
        """Parameters AdamW should not decay (DeiT recipe): the positional embedding and the extra tokens."""
        return {"pos_embed", "cls_token"} | ({"dist_token"} if self.config.distilled else set())

    def _prefix_tokens(self, batch: int) -> Tensor:
        tokens = [self.cls_token] + ([self.dist_token] if self.config.distilled else [])
        return torch.cat(tokens, dim=1).expand(batch, -1, -1)

    def _pos_embed_for(self, grid: tuple[int, int]) -> Tensor:
        c = self.config
        prefix_slots = c.num_prefix_tokens if c.class_token_pos_embed else 0
        return resize_pos_embed(self.pos_embed, c.grid_size, grid, num_prefix_tokens=prefix_slots)

    def forward_features(
        self, x: Tensor, return_attention: bool = False, return_block_inputs: bool = False
    ) -> Tensor | ForwardRecord:
        """Normalized output tokens (B, P + L, D), class token first; a ``ForwardRecord`` when asked for the
        per-block attention weights or inputs (one forward pass either way)."""
        c = self.config
        tokens, grid = self.patch_embed(x)
        prefix = self._prefix_tokens(tokens.shape[0])
        joined = c.class_token_pos_embed  # DeiT: the class token joins at the input, with its own pos slot
        if joined:
            tokens = torch.cat([prefix, tokens], dim=1)
        if not self.mask_pos_embed:
            tokens = tokens + self._pos_embed_for(grid)
        tokens = self.pos_drop(tokens)
        attentions, inputs, num_prefix = [], [], []
        for i, block in enumerate(self.blocks):
            if not joined and i == c.local_up_to_layer:  # ConViT: after the last GPSA block (Fig. 4)
                tokens, joined = torch.cat([prefix, tokens], dim=1), True
            num_prefix.append(prefix.shape[1] if joined else 0)
            if return_block_inputs:
                inputs.append(tokens)
            if return_attention:
                tokens, attn = block(tokens, grid, return_attention=True)
                attentions.append(attn)
            else:
                tokens = block(tokens, grid)
        tokens = self.norm(tokens)
        if not (return_attention or return_block_inputs):
            return tokens
        return ForwardRecord(
            features=tokens, grid_size=grid, num_prefix_tokens=num_prefix,
            attentions=attentions if return_attention else None,
            block_inputs=inputs if return_block_inputs else None,
        )

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        features = self.forward_features(x)
        logits = self.head(features[:, 0])
        if not self.config.distilled:
            return logits
        dist_logits = self.head_dist(features[:, 1])
        return (logits, dist_logits) if self.training else (logits + dist_logits) / 2


# %% [markdown]
# ## Exercises
#
# How they work (chapter 00): a collapsed `solution` cell, a cell for your answer that replaces it, a check.
#
# **1. Where the class token joins.** In a ConViT-Ti at 224 px (10 GPSA blocks, then 2 SA blocks), how many
# tokens does the attention of block 1 see, and of block 12? Set `tokens_block_1, tokens_block_12` without
# running the model.

# %% tags=["solution"] jupyter={"source_hidden": true}
tokens_block_1, tokens_block_12 = 196, 197  # 14 × 14 patches; the class token joins after the last GPSA block

# %%
# your answer: tokens_block_1, tokens_block_12 = ..., ...

# %%
from convit_edu.checks import WrongAnswer, check_answer


def check_tokens(answer: tuple[int, int]) -> None:
    convit_ti = VisionTransformer(ModelConfig(embed_dim=192, num_heads=4, depth=12, local_up_to_layer=10)).eval()
    with torch.no_grad():
        record = convit_ti.forward_features(torch.zeros(1, 3, 224, 224), return_attention=True)
    want = (record.attentions[0].shape[-1], record.attentions[-1].shape[-1])
    check_answer(answer[0] == want[0], "block 1 sees the patches of a 224-px image cut into 16-px patches — and "
                 "is there a class token yet?")
    check_answer(answer[1] == want[1], "by block 12 something has joined the patches")


check_tokens((tokens_block_1, tokens_block_12))
print(expect_error(lambda: check_tokens((197, 197)), WrongAnswer))

# %% [markdown]
# **2. Stochastic depth in numbers.** ConViT-Ti trains with the DeiT recipe's `drop_path_rate = 0.1`. On
# average, how many of its 24 residual branches (an attention and an MLP branch in each of 12 blocks) does one
# training sample skip in a forward pass? Set `expected_skipped`.

# %% tags=["solution"] jupyter={"source_hidden": true}
drop_probs = [0.1 * i / 11 for i in range(12)]  # linear in depth: 0 in the first block, 0.1 in the last
expected_skipped = 2 * sum(drop_probs)  # both branches of a block skip with its probability: 24 × mean 0.05
print(f"expected_skipped = {expected_skipped:.2f} branches")

# %%
# your answer: expected_skipped = ...

# %%
import math


def check_expected_skipped(answer: float) -> None:
    convit_ti = VisionTransformer(ModelConfig(embed_dim=192, num_heads=4, img_size=32, drop_path_rate=0.1))
    want = sum(2 * block.drop_path.p for block in convit_ti.blocks)  # one DropPath per block, on both branches
    check_answer(math.isclose(answer, want, rel_tol=1e-6), f"{'too high' if answer > want else 'too low'}: the drop "
                 "probability rises linearly from 0 in the first block to 0.1 in the last, and it applies to each "
                 "of a block's two residual branches")


check_expected_skipped(expected_skipped)
print(expect_error(lambda: check_expected_skipped(0.6), WrongAnswer))
