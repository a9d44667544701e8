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

# %%

# %% [markdown]
# # Checkpoints: official weights in, files that lose nothing
#
# The models of chapters 08-10 use the official ConViT's parameter names, so the official checkpoints, DeiT's
# and timm's load into them: this chapter writes the loader that reads them whatever their wrapping (a
# training checkpoint, an EMA, a `module.` prefix, a different head), checks it on models whose answer is
# known, and adds DeiT's hard-distillation token for the paper's Table 4. Then the other direction: every file a
# run writes (its checkpoints, chapter 26, its logs, the cached file lists of chapter 13) is written atomically,
# so that nothing is ever lost.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp pretrained
# Pretrained weights: official ConViT, DeiT and timm weights (and our own checkpoints) into this package's models.

# %%
#| export
import math
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from convit_edu.files import load_file
from convit_edu.models import VisionTransformer
from convit_edu.patches import resize_pos_embed
from convit_edu.zoo import MODEL_ZOO

# %%
import tempfile

import torch

from convit_edu.checks import expect_error
from convit_edu.zoo import create_model

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Loading official checkpoints
#
# The official ConViT release and timm's `convit_*` and `deit_*` models store their weights under the names
# our modules have, so loading is mostly `load_state_dict`. `load_weights` adds what real files need:
#
# * `read_state_dict` turns every source into a plain state dict: it reads a path or takes a mapping; it unwraps
#   the `{"model": ...}` (or `"state_dict"`) of the official releases and of our training checkpoints, strips
#   the `module.` / `_orig_mod.` prefixes that DDP, `torch.compile` and an EMA `AveragedModel` add, drops the
#   EMA's `n_averaged` counter, and ignores `rel_indices` (derived from the grid, rebuilt on demand);
# * a checkpoint for another image size has its `pos_embed` interpolated to the model's grid (DeiT's class
#   and distillation slots are kept as they are) — fine-tuning at 288 px from a 224 px checkpoint;
# * `ignore_head=True` leaves the model's own head(s), to fine-tune on another number of classes;
# * anything else that does not fit is an error that names the key, both shapes, and which model the
#   checkpoint looks like (`guess_architecture`).
#
# One thing a state dict cannot tell is the number of heads of an MHSA layer (its `qkv` weight is 3D×D for
# any split into heads); GPSA layers give it away through `pos_proj`.

# %%
#| export files
import argparse
from pathlib import Path

import torch


def load_file(path: str | Path) -> object:
    """``torch.load`` of a checkpoint file on the CPU, reading only tensors, numbers, strings and containers (no
    pickled code runs); errors say whether the file is missing, truncated or not a torch file, or holds objects
    that cannot be loaded safely."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):  # official files may store their args
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch's own messages run on for lines and advise loading unsafely: say what it means
        if "Unsupported global" in str(e):
            raise ValueError(f"{path} holds Python objects that cannot be loaded safely (only tensors, numbers, "
                             "strings and containers are read): it was not written by convit-edu or timm") from None
        raise ValueError(f"{path} is truncated or not a torch checkpoint ({type(e).__name__})") from None

# %%
#| export
_WRAPPERS = ("model", "state_dict")
_PREFIXES = ("module.", "_orig_mod.")
_NOT_WEIGHTS = ("n_averaged",)  # the number of models an EMA AveragedModel has averaged
_HEADS = ("head", "head_dist")


def read_state_dict(source: str | Path | Mapping) -> dict[str, Tensor]:
    """The plain state dict (parameter name -> tensor) of a checkpoint file or mapping: an official release or a
    ``convit-edu train`` checkpoint (``{"model": ...}`` / ``{"state_dict": ...}``), a timm or our own state
    dict, an EMA ``AveragedModel`` state dict; ``module.`` / ``_orig_mod.`` prefixes, ``n_averaged`` and
    ``rel_indices`` removed."""
    if isinstance(source, (str, Path)):
        source = load_file(source)
    if not isinstance(source, Mapping):
        raise TypeError(f"a checkpoint must be a path or a state dict (a mapping), got {type(source).__name__}")
    while any(isinstance(source.get(key), Mapping) for key in _WRAPPERS):
        source = next(source[key] for key in _WRAPPERS if isinstance(source.get(key), Mapping))
    state_dict = {}
    for key, value in source.items():
        if key in _NOT_WEIGHTS:
            continue
        if not isinstance(value, Tensor):
            raise ValueError(f"checkpoint entry {key!r} is a {type(value).__name__}, not a tensor")
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        if not key.endswith("rel_indices"):
            state_dict[key] = value
    return state_dict


def guess_architecture(state_dict: str | Path | Mapping) -> str:
    """A one-line description of the model a checkpoint belongs to, naming the zoo model it matches if any."""
    sd = read_state_dict(state_dict)
    if "patch_embed.proj.weight" not in sd or "pos_embed" not in sd:
        return f"not a ConViT/DeiT (no 'patch_embed.proj.weight' or 'pos_embed'; first keys {list(sd)[:4]})"
    embed_dim, _, patch_size, _ = sd["patch_embed.proj.weight"].shape
    blocks = sorted({int(k.split(".")[1]) for k in sd if k.startswith("blocks.")})
    depth = len(blocks)
    local = sum(f"blocks.{i}.attn.pos_proj.weight" in sd for i in blocks)
    heads = sd["blocks.0.attn.pos_proj.weight"].shape[0] if local else None
    qkv_bias = any(k.endswith(("attn.qkv.bias", "attn.qk.bias")) for k in sd)
    distilled = "dist_token" in sd
    slots = sd["pos_embed"].shape[1]
    patches = slots - (1 + int(distilled))
    class_slot = not local and patches > 0 and math.isqrt(patches) ** 2 == patches
    num_classes = sd["head.weight"].shape[0] if "head.weight" in sd else None
    details = (
        f"embed_dim {embed_dim}, depth {depth}, {local} GPSA layers"
        + (f", num_heads {heads}" if heads else "")
        + f", qkv_bias {qkv_bias}, patch_size {patch_size}, {slots} pos_embed slots, {num_classes} classes"
        + (", distilled" if distilled else "")
    )
    names = [
        name for name, c in MODEL_ZOO.items()
        if (c.embed_dim, c.depth, c.local_up_to_layer, c.qkv_bias, c.patch_size) == (embed_dim, depth, local, qkv_bias, patch_size)
        and heads in (None, c.num_heads) and c.class_token_pos_embed == class_slot
    ]
    return f"{names[0]} ({details})" if names else f"no zoo model ({details})"


def load_weights(
    model: VisionTransformer, path_or_state_dict: str | Path | Mapping, *, ignore_head: bool = False
) -> VisionTransformer:
    """Load official ConViT / DeiT, timm ``convit_*`` / ``deit_*`` or our own weights into ``model``, in place.

    Reads the weights with ``read_state_dict`` (any checkpoint it accepts, EMA weights included), interpolates ``pos_embed`` bicubically to the model's grid (prefix slots untouched); with ``ignore_head``
    the model keeps its own ``head`` (and ``head_dist``). Raises a ValueError naming every key whose shape
    differs, is missing or is unexpected, and the model the checkpoint looks like. Returns ``model``.
    """
    sd = read_state_dict(path_or_state_dict)
    own = model.state_dict()
    c = model.config
    if ignore_head:
        sd = {k: v for k, v in sd.items() if k.split(".")[0] not in _HEADS}
    pos = sd.get("pos_embed")
    prefix_slots = c.pos_embed_prefix_slots
    if pos is not None and pos.ndim == 3 and pos.shape != own["pos_embed"].shape and pos.shape[-1] == c.embed_dim:
        side = math.isqrt(max(pos.shape[1] - prefix_slots, 0))
        if side > 0 and side * side == pos.shape[1] - prefix_slots:
            sd["pos_embed"] = resize_pos_embed(pos, (side, side), c.grid_size, num_prefix_tokens=prefix_slots)
    problems = [
        f"key {k!r}: checkpoint shape {tuple(v.shape)}, model shape {tuple(own[k].shape)}"
        for k, v in sd.items() if k in own and v.shape != own[k].shape
    ]
    missing = [k for k in own if k not in sd and not (ignore_head and k.split(".")[0] in _HEADS)]
    unexpected = [k for k in sd if k not in own]
    for label, keys in (("missing from the checkpoint", missing), ("unexpected in the checkpoint", unexpected)):
        if keys:
            problems.append(f"{label}: {keys[:6]}" + (f" and {len(keys) - 6} more" if len(keys) > 6 else ""))
    if problems:
        hint = ""
        if all(p.startswith(("key 'head.", "key 'head_dist.")) for p in problems):
            hint = "\n(to fine-tune on another number of classes, pass ignore_head=True)"
        raise ValueError(
            "the checkpoint does not fit this model:\n  " + "\n  ".join(problems)
            + f"\nthe checkpoint looks like: {guess_architecture(sd)}"
            + f"\nthe model is:              {guess_architecture(own)}" + hint
        )
    model.load_state_dict(sd, strict=not ignore_head)
    return model


# %% [markdown]
# A round trip through a file, in the format of the official releases, then the same weights loaded into a
# model built for 288 px: its interpolated `pos_embed` is exactly what the 224 px model computes on the fly for
# a 288 px image, so the two agree. (The tests load timm's models with random weights and compare logits.) Last,
# the weights of an EMA `AveragedModel` as a training checkpoint stores them: `read_state_dict` gives the model's
# own keys.

# %%
import tempfile

from torch.optim.swa_utils import AveragedModel

torch.manual_seed(0)
convit_ti = create_model("convit_tiny")
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "convit_tiny.pth"
    torch.save({"model": convit_ti.state_dict()}, path)
    fresh = load_weights(create_model("convit_tiny"), path).eval()
    big = load_weights(create_model("convit_tiny", img_size=288), path).eval()
x224, x288 = torch.randn(2, 3, 224, 224), torch.randn(2, 3, 288, 288)
with torch.no_grad():
    torch.testing.assert_close(fresh(x224), convit_ti(x224))
    torch.testing.assert_close(big(x288), convit_ti(x288))
print("pos_embed", tuple(convit_ti.pos_embed.shape), "-> 288 px model", tuple(big.pos_embed.shape))
print("checkpoint looks like:", guess_architecture(convit_ti.state_dict()))

ema_weights = AveragedModel(convit_ti).state_dict()  # what training keeps for EMA (chapter 28)
print("EMA state dict:", list(ema_weights)[:2], "... and", list(ema_weights)[-1])
assert read_state_dict(ema_weights).keys() == convit_ti.state_dict().keys()

# %% [markdown]
# And the error for a checkpoint of another model: the weights of a ConViT-S loaded into a ConViT-Ti.

# %%
with torch.device("meta"):
    small_weights = create_model("convit_small", use_local_init=False).state_dict()
message = expect_error(lambda: load_weights(create_model("convit_tiny"), small_weights))
print("\n".join(message.splitlines()[:3] + ["  ..."] + message.splitlines()[-2:]))
assert "'blocks.0.attn.qk.weight': checkpoint shape (864, 432), model shape (384, 192)" in message
assert "looks like: convit_small" in message

# %% [markdown]
# ## Hard distillation
#
# DeiT's distilled models carry a second token, `dist_token`, next to the class token, and a second head,
# `head_dist`, trained against the hard labels of a CNN teacher (chapter 23). In training mode the model
# returns both logits; at test time the average of the two heads. In the ConViT the distillation token joins
# with the class token after the last GPSA layer; in the DeiT it has its own `pos_embed` slot.

# %%
torch.manual_seed(0)
for name in ("deit_tiny", "convit_tiny"):
    student = create_model(name, distilled=True, num_classes=10)
    images = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        class_logits, dist_logits = student.train()(images)
        averaged = student.eval()(images)
    torch.testing.assert_close(averaged, (class_logits + dist_logits) / 2)
    print(f"{name}: pos_embed {tuple(student.pos_embed.shape)}, no weight decay on {sorted(student.no_weight_decay())}")

# %% [markdown]
# ## Files that lose nothing
#
# A training checkpoint (chapter 26) holds everything a run needs to go on, hundreds of megabytes at ConViT-S, and
# it is replaced as the run goes on. It is written **atomically**: to a temporary file in the same folder, flushed
# to disk, then renamed over the old one. A rename within one file system is atomic, so a crash — a SIGKILL, a full
# disk, a node failure — at any moment leaves either the old file or the new one, never half of one. The logs,
# results and cached file lists are written the same way. A write that fails says which file it was writing: the
# error of a full disk (`[Errno 28] No space left on device`) names no file by itself.

# %%
#| export files
# Files written whole or not at all (atomic writes, text, JSON, a second name for a file), and torch files read safely. The
# package's ground floor: it imports nothing of the package, so the data wing (chapter 13 on) and a run's state
# (chapter 26) stand on it without standing on the models.

# %%
#| export files
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Any, Callable


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Write the file `path` atomically: `write(f)` fills a temporary file beside it (`.NAME.….tmp`), which is
    flushed to disk and renamed over `path`. Every file a run writes (checkpoints, logs, results, cached file
    lists) goes through here, so a crash at any moment leaves the old file or the new one, never half of one; a
    failed write's error names `path` (the error of a full disk names no file by itself)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if e.errno is None or e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def write_text(path: str | Path, text: str) -> Path:
    """`text` in `path`, atomically, its folders made: the one writer of a run's and a grid's text files (records,
    logs, tables, results)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda f: f.write(text.encode()))


def write_json(path: str | Path, value: Any) -> Path:
    """`value` as JSON in `path` (`write_text`): a grid's records and summary, benchmark results."""
    return write_text(path, json.dumps(value, indent=1, default=str) + "\n")


def keep_as(path: str | Path, kept: str | Path) -> Path:
    """Make `kept` a second name of the file `path`, atomically: a hard link, which writes no bytes (a run keeps
    its best epoch's `last.pt` as `best.pt` so; `last.pt` is later replaced by a new file, never rewritten in
    place, so `kept` keeps these bytes). Where the file system has no hard links, an atomic copy."""
    path, kept = Path(path), Path(kept)
    tmp = kept.with_name(f".{kept.name}.link.tmp")  # a `*.tmp` left by a kill is removed when a run starts
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:  # no hard links here (some network and FAT file systems)
        with open(path, "rb") as source:
            return atomic_write(kept, lambda f: shutil.copyfileobj(source, f))
    os.replace(tmp, kept)
    return kept


# %% [markdown]
# These live in `convit_edu/files.py`, the package's ground floor, not in `pretrained.py`, with `load_file`
# above: the data wing writes files too (chapter 13's cached file lists), a run reads its checkpoints back
# (chapter 26), and neither should have to import the models to do it.

# %% [markdown]
# A write that fails half-way (a full disk): the previous file stays whole, and no temporary file is left beside
# it. Then `keep_as`, which keeps a run's best epoch as `best.pt` without writing its hundreds of megabytes a
# second time: a hard link is a second name of the same bytes, and the next `last.pt` is a new file renamed over
# the old name, so `best.pt` still holds the epoch it was given.

# %%
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "last.pt"
    atomic_write(path, lambda f: f.write(b"epoch 1"))

    def half_then_full_disk(f):
        f.write(b"half of epoch 2")
        raise OSError(28, "No space left on device")

    message = expect_error(lambda: atomic_write(path, half_then_full_disk), OSError)
    assert path.read_bytes() == b"epoch 1" and [p.name for p in Path(folder).iterdir()] == ["last.pt"]
    keep_as(path, Path(folder) / "best.pt")  # the best epoch so far: a second name, no bytes written
    atomic_write(path, lambda f: f.write(b"epoch 2"))  # the next epoch
    assert (Path(folder) / "best.pt").read_bytes() == b"epoch 1" and path.read_bytes() == b"epoch 2"
    assert message.endswith(f"No space left on device: '{path}'")  # the error names the file
print(message.replace(folder, "FOLDER"))
