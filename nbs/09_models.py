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
# Chapter 08 built the layers. This chapter assembles them into the model of Fig. 4 — a DeiT whose first
# `local_up_to_layer` = 10 of its 12 blocks use GPSA, with the class token joining only *after* the last GPSA
# block — from one validated configuration. Chapter 10 names the models of Table 1 and counts them.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp models
# The ConViT and DeiT models: the configuration and the vision transformer itself.

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
# too; chapter 10 exercises them.

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

    @property
    def pos_embed_prefix_slots(self) -> int:
        """Rows of ``pos_embed`` in front of the patches' rows: one per prefix token when those get a position
        (``class_token_pos_embed``), else none."""
        return self.num_prefix_tokens if self.class_token_pos_embed else 0


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
# ## The model
#
# `VisionTransformer` follows the picture at the top, with the names of the official checkpoints
# (`patch_embed.proj`, `pos_embed`, `cls_token`, `blocks.i.{norm1, attn, norm2, mlp.fc1, mlp.fc2}`, `norm`,
# `head`). Initialization is DeiT's (normal, std 0.02, zero biases), except for the positional layers, which
# initialized themselves (chapter 05: the same normal init, then Eq. 5). So Eq. 5 is applied once per layer, in one
# place, and the model's own init leaves those layers alone instead of overwriting Eq. 5 with the normal init (a
# model that did would have to apply Eq. 5 a second time; chapter 10 checks that a fresh ConViT-Ti's `v` is still the
# identity). `forward_features` can also return a `ForwardRecord` of every block's attention and input, for chapters
# 33-34; `distilled=True` adds DeiT's distillation token and head; `mask_pos_embed` drops the absolute positional
# embedding at test time (SM F, Table 5).

# %%
#| export
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from convit_edu.gpsa import GPSA
from convit_edu.gpsa_reference import GPSAReference
from convit_edu.layers import Block
from convit_edu.patches import PatchEmbed, resize_pos_embed


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
        self.pos_embed = nn.Parameter(torch.zeros(1, c.pos_embed_prefix_slots + c.num_patches, c.embed_dim))
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

    def gate_means(self) -> list[float]:
        """The mean σ(λ) over the heads of each GPSA layer, in layer order (``gates()`` averaged; one read of the
        device): what a run logs per epoch."""
        return self.gates().float().mean(dim=1).tolist()

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
        return resize_pos_embed(self.pos_embed, c.grid_size, grid, num_prefix_tokens=c.pos_embed_prefix_slots)

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
# ### Fig. 4, drawn from a model
#
# The picture at the top, drawn from a ConViT-Ti built here rather than from its configuration: each block's
# attention is read from the model (GPSA or MHSA), and the class token enters after the last GPSA block, so the
# GPSA blocks attend over the 196 patches and the SA blocks over 197 tokens.

# %%
import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from convit_edu.gpsa import GPSA


def draw_convit(model: VisionTransformer):
    """Fig. 4 of the paper for `model`: patch embedding, its blocks coloured by attention, the class token."""
    cfg = model.config
    kinds = ["GPSA" if isinstance(block.attn, GPSA) else "SA" for block in model.blocks]
    patches = (cfg.img_size // cfg.patch_size) ** 2
    fig, ax = plt.subplots(figsize=(10, 2.4), dpi=80)
    boxes = ["patches\n+ pos_embed", *kinds, "LayerNorm\nhead"]
    for i, label in enumerate(boxes):
        colour = {"GPSA": "#f4a261", "SA": "#2a9d8f"}.get(label, "#dddddd")
        ax.add_patch(FancyBboxPatch((i * 1.2, 0), 1.0, 1.0, boxstyle="round,pad=0.05", color=colour))
        ax.text(i * 1.2 + 0.5, 0.5, label, ha="center", va="center", fontsize=8 if label in kinds else 6.5)
        if i:
            ax.annotate("", (i * 1.2 - 0.05, 0.5), (i * 1.2 - 0.15, 0.5), arrowprops=dict(arrowstyle="->"))
    join = 1 + kinds.count("GPSA")  # the box before which the class token enters
    ax.annotate("class token", (join * 1.2 - 0.1, 1.05), (join * 1.2 - 0.1, 1.7), ha="center", fontsize=8,
                arrowprops=dict(arrowstyle="->", color="crimson"), color="crimson")
    gpsa, sa = kinds.count("GPSA"), len(kinds) - kinds.count("GPSA")
    ax.text(1.2 * (1 + (gpsa - 1) / 2) + 0.5, -0.35, f"GPSA: {patches} patch tokens", ha="center", fontsize=8)
    ax.text(1.2 * (join + (sa - 1) / 2) + 0.5, -0.35, f"SA: {patches + 1} tokens", ha="center", fontsize=8)
    ax.set(xlim=(-0.2, 1.2 * len(boxes)), ylim=(-0.6, 1.9), title=f"{cfg.depth} blocks, local_up_to_layer = "
           f"{cfg.local_up_to_layer}")
    ax.axis("off")
    return kinds


kinds = draw_convit(VisionTransformer(ModelConfig()))  # ModelConfig's defaults are ConViT-Ti's
assert kinds == ["GPSA"] * 10 + ["SA"] * 2  # read from the model's modules, not its config
print(" ".join(kinds))
plt.show()


# %% [markdown]
# ## Exercises
#
# **1. The forward pass, yours.** Write `my_forward(model, images)`: the logits of a ConViT `model` (eval mode, not
# distilled) from its parts — `model.patch_embed` (it returns the tokens and the grid), `model.pos_embed`,
# `model.cls_token`, `model.blocks` (each called as `block(tokens, grid)`), `model.norm`, `model.head` reading the
# class token — which joins the patch tokens after the last GPSA block (`model.config.local_up_to_layer`). (Chapter
# 10's zoo builds the package's `VisionTransformer`; your forward is checked against its logits.)

# %%
my_forward = ...  # your answer: def my_forward(model, images): ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal


def check_my_forward(fn) -> None:
    for gpsa_blocks in (2, 3):
        torch.manual_seed(gpsa_blocks)
        model = VisionTransformer(ModelConfig(img_size=32, patch_size=8, embed_dim=48, num_heads=4, depth=4,
                                              local_up_to_layer=gpsa_blocks, num_classes=10)).eval()
        images = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            got, want, without_pos_embed = fn(model, images), model(images), no_pos_embed(model, images)
        check_answer(got.shape == want.shape, f"the logits are (images, classes) = {tuple(want.shape)}, got "
                     f"{tuple(got.shape)}: the head maps the class token's features to the classes")
        check_answer(not torch.allclose(got, without_pos_embed, atol=1e-5), "pos_embed is added to the patch tokens, "
                     "once, before the first block (it has one slot per patch, none for the class token)")
        check_answer(torch.allclose(got, want, atol=1e-5), f"with {gpsa_blocks} GPSA blocks your logits differ: they "
                     "see the 16 patch tokens alone, the class token joins in front of them right after the last GPSA "
                     "block, and the head reads it (position 0) after the final norm")


def joined_late(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:  # a slip: one block too late
    tokens, grid = model.patch_embed(images)
    tokens = tokens + model.pos_embed
    for i, block in enumerate(model.blocks):
        if i == model.config.local_up_to_layer + 1:
            tokens = torch.cat([model.cls_token.expand(len(tokens), -1, -1), tokens], dim=1)
        tokens = block(tokens, grid)
    return model.head(model.norm(tokens)[:, 0])


def no_pos_embed(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:  # a slip: pos_embed forgotten
    model.mask_pos_embed = True  # the model's own switch (SM F): its forward without pos_embed
    try:
        return model(images)
    finally:
        model.mask_pos_embed = False


grade("my_forward", my_forward, check_my_forward)
demonstrate(check_my_forward, {
    "the class token's features, not its logits": lambda m, x: m.forward_features(x)[:, 0],
    "pos_embed forgotten": no_pos_embed,
    "the tokens averaged, no class token": lambda m, x: m.head(m.norm(m.patch_embed(x)[0]).mean(1)),
    "the class token joined one block late": joined_late,
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(my_forward):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def my_forward(model: VisionTransformer, images: torch.Tensor) -> torch.Tensor:
        tokens, grid = model.patch_embed(images)
        tokens = tokens + model.pos_embed  # (B, L, D): no slot for the class token
        cls = model.cls_token.expand(tokens.shape[0], -1, -1)
        for i, block in enumerate(model.blocks):
            if i == model.config.local_up_to_layer:  # after the last GPSA block
                tokens = torch.cat([cls, tokens], dim=1)
            tokens = block(tokens, grid)
        return model.head(model.norm(tokens)[:, 0])

    grade("my_forward", my_forward, check_my_forward)

# %% [markdown]
# **2. Stochastic depth in numbers.** ConViT-Ti trains with `drop_path_rate = 0.1`. On average, how many of its 24
# residual branches (attention and MLP, in 12 blocks) does one sample skip in a forward pass? Set `expected_skipped`.

# %%
expected_skipped = ...  # your answer: expected_skipped = ...

# %%
def check_expected_skipped(answer: float) -> None:
    convit_ti = VisionTransformer(ModelConfig(embed_dim=192, num_heads=4, img_size=32, drop_path_rate=0.1))
    want = sum(2 * block.drop_path.p for block in convit_ti.blocks)  # one DropPath per block, on both branches
    check_answer(abs(answer - want) < 1e-6 * want, f"{'too high' if answer > want else 'too low'}: the rate rises "
                 "linearly from 0 in the first block to 0.1 in the last, and applies to both of a block's branches")


grade("expected_skipped", expected_skipped, check_expected_skipped)
demonstrate(check_expected_skipped, {"every branch at the last block's rate (24 × 0.1)": 2.4,
                                     "one branch a block": 0.6})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(expected_skipped):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    expected_skipped = 2 * sum(0.1 * i / 11 for i in range(12))  # 0 to 0.1, linear in depth; two branches a block
    grade("expected_skipped", expected_skipped, check_expected_skipped)
