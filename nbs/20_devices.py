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
# # Devices and precision
#
# Where a run computes and in which number format: the device (`auto`: CUDA, else Apple's MPS, else the
# CPU) and the precision (bf16 only where it pays). Every later chapter that runs a model asks these
# functions; the config (chapter 21) checks its `device` and `precision` with them.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp devices
# Devices and precision: which device a run uses, bf16 only where the hardware computes it natively, autocast.

# %%
#| export
import contextlib
from pathlib import Path

import torch

from convit_edu.checks import one_of

# %%
import torch
import torch.nn.functional as F

from convit_edu.checks import expect_error

torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## Precision, and where it pays
#
# bf16 autocast runs matmuls in bfloat16 (same exponent range as fp32, so no loss scaling); fp16 needs a
# `GradScaler`, which scales the loss up so small gradients survive and skips steps whose gradients overflow; fp32
# is exact and what the resume tests use. bf16 pays on GPUs (Ampere and later) and on CPUs with AVX-512 BF16 or AMX
# units (except in attention's kernel, below); a CPU without them emulates it, and is *slower* in bf16 than in fp32
# — see the measurement below. So `precision="auto"` means bf16 on a GPU that has it (fp16 on older ones); on a CPU,
# bf16 where the CPU says it has the units (the `avx512_bf16` or `amx_bf16` flags of `/proc/cpuinfo`, with PyTorch
# running its AVX-512 kernels), fp32 elsewhere — the flags rather than a timed trial, because a trial at start-up
# would cost seconds and vary with the load, while the flags decide the same way every time. `device="auto"` is
# CUDA, else Apple's MPS (whose precision stays fp32), else the CPU. On a GPU, fp32 runs its matmuls on tensor cores
# in TF32, and AdamW runs fused (one kernel for all parameters).

# %%
#| export
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def check_device(device: str) -> None:
    """A device name this project runs on: "auto", "cpu", "cuda", "cuda:N" or "mps"; ValueError otherwise."""
    try:
        parsed = torch.device(device) if device != "auto" else None
    except (RuntimeError, TypeError):
        parsed = None
    if device != "auto" and (parsed is None or parsed.type not in ("cpu", "cuda", "mps")):
        raise ValueError(f"device {device!r} is not one of auto, cpu, cuda, cuda:N or mps")


def autocast(device: torch.device, precision: str):
    """Autocast for a resolved precision (fp32: none)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


# %%
#| export
def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX: Linux's /proc/cpuinfo flags), where bf16
    autocast beat fp32 on a training step (an Intel Xeon with AMX, attention in fp32: by most for DeiT-Ti at 224 px,
    by little for chapter 37's models at 48 px; this chapter measures it); elsewhere bf16 is emulated, far slower."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: no flags to read, so no claim of native bf16
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags)) and torch.backends.cpu.get_cpu_capability() == "AVX512"


def resolve_device(device: str) -> torch.device:
    """"auto" -> CUDA if there is a GPU, else Apple's MPS, else the CPU; other names are checked, and refused with
    a ValueError when this machine lacks them (not torch's error at the first tensor moved there)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else
                            "mps" if torch.backends.mps.is_available() else "cpu")
    check_device(device)
    asked, gpus = torch.device(device), torch.cuda.device_count() if torch.cuda.is_available() else 0
    if asked.type == "cuda" and not gpus:
        raise ValueError(f"device {device!r} asked for but CUDA is not available: use --device cpu")
    if asked.type == "cuda" and asked.index is not None and asked.index >= gpus:
        raise ValueError(f"device {device!r} asked for but this machine shows {gpus} GPU(s) (cuda:0 to "
                         f"cuda:{gpus - 1}): choose one of them")
    if asked.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} asked for but Apple's MPS is not available here (a Mac with macOS 12.3 "
                         "or later): use --device cpu")
    return asked


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """"auto" -> bf16 on a GPU that supports it, fp16 on an older GPU; on a CPU bf16 where it is native
    (`cpu_has_native_bf16`), else fp32; fp32 on Apple's MPS. Other values are checked."""
    device = torch.device(device)
    one_of("precision", precision, PRECISIONS)  # the config's own check, for callers without a config
    if device.type == "cuda" and precision in ("auto", "bf16") and not torch.cuda.is_bf16_supported():
        if precision == "bf16":
            raise ValueError("precision bf16 is not supported by this GPU: use --precision fp16 (or auto)")
        return "fp16"
    if precision == "auto":
        return "bf16" if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()) else "fp32"
    return precision


# %% [markdown]
# The same matrix product, the size of one MLP layer of ConViT-Ti on a batch of 64 images at 64 px, in fp32
# and in bf16 on this notebook's CPU:

# %%
# NBVAL_IGNORE_OUTPUT
import time

a, w = torch.randn(64 * 64, 192), torch.randn(768, 192)
for dtype in (torch.float32, torch.bfloat16):
    x, y = a.to(dtype), w.to(dtype)
    F.linear(x, y)
    t0 = time.perf_counter()
    for _ in range(5):
        F.linear(x, y)
    print(f"{str(dtype):<15} {(time.perf_counter() - t0) / 5 * 1e3:7.2f} ms   (CPU capability: "
          f"{torch.backends.cpu.get_cpu_capability()})")


# %% [markdown]
# ### Attention stays in fp32 on a CPU
#
# Native bf16 matmuls do not make every bf16 kernel fast. SDPA's forward and backward (chapter 01), at the
# attention shapes of ConViT-Ti and of chapter 37's grid (heads of 8), on fp32 and on bf16 inputs:

# %%
# NBVAL_IGNORE_OUTPUT
def attention_ms(shape: tuple[int, ...], dtype: torch.dtype, reps: int = 5) -> float:
    """Median milliseconds of SDPA's forward and backward on random (batch, heads, tokens, head_dim) inputs."""
    q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v).sum().backward()
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[reps // 2] * 1e3


batch = 4 if FAST else 32
for label, (heads, tokens, head_dim) in {"ConViT-Ti, 224 px": (4, 197, 48), "the grid's, 48 px": (9, 145, 8)}.items():
    fp32, bf16 = (attention_ms((batch, heads, tokens, head_dim), dtype) for dtype in (torch.float32, torch.bfloat16))
    print(f"{label:<18} batch {batch}, {heads} heads of {head_dim}: fp32 {fp32:6.1f} ms, bf16 {bf16:6.1f} ms "
          f"({bf16 / fp32:.1f}x the time)")

# %% [markdown]
# So on a CPU `fused_attention`, which every attention layer calls, attends in fp32 while the rest of a step stays
# in bf16. A whole training step (forward under `autocast`, cross-entropy, backward, AdamW) of chapter 37's grid
# models (width 72, 9 heads of 8, 48 px, batch 32) and of DeiT-Ti at 224 px (batch 16), in fp32 and in bf16
# (full mode only: FAST mode times nothing):

# %%
# NBVAL_IGNORE_OUTPUT
from convit_edu.models import VisionTransformer
from convit_edu.zoo import model_config

grid = dict(img_size=48, patch_size=4, embed_dim=72, num_heads=9, depth=6, num_classes=10)
runs = {"grid's ConViT": (model_config("convit_tiny", local_up_to_layer=4, **grid), 32),
        "grid's DeiT": (model_config("deit_tiny", **grid), 32), "DeiT-Ti, 224 px": (model_config("deit_tiny"), 16)}


def step_seconds(config, batch: int, precision: str) -> float:
    """Seconds of one training step of a fresh model of ``config`` at ``precision`` (the median of 5)."""
    torch.manual_seed(0)
    model = VisionTransformer(config)
    optimizer = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(batch, 3, config.img_size, config.img_size), torch.randint(0, config.num_classes, (batch,))
    times = []
    for _ in range(6):  # the first is a warm-up
        t0 = time.perf_counter()
        with autocast(torch.device("cpu"), precision):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[2]


if not FAST:
    print(f"bf16 native on this CPU: {cpu_has_native_bf16()}")
    for label, (config, batch) in runs.items():
        fp32, bf16 = (step_seconds(config, batch, precision) for precision in ("fp32", "bf16"))
        print(f"{label:<16} batch {batch}: fp32 {batch / fp32:6.1f} images/s, bf16 {batch / bf16:6.1f} images/s "
              f"(bf16 {fp32 / bf16:.2f}x as fast)")

# %% [markdown]
# On the 2-core Intel Xeon with AMX these outputs come from, SDPA took 1.7 and 5.5 times as long in bf16 as in
# fp32 (1.6-3.1 and 4.8-6.7 over several runs), and with attention in fp32 a bf16 step ran 0.97 and 1.21 times as
# fast as an fp32 one for the grid's models (0.88-1.38 over runs: on this shared 2-core machine the small models'
# gain is near its noise) and 1.51 times for DeiT-Ti (1.31-2.12): `auto`'s bf16 is the right pick there, by a wide
# margin only for the larger model.
# (With SDPA in bf16, the grid's models had trained about 3 times slower in bf16 than in fp32 on that CPU, measured
# on 2026-11-28.) GPUs keep SDPA's bf16 kernels, their fast ones.

# %% [markdown]
# The flags decide, whatever the machine this notebook runs on: a CPU whose flags show AVX-512 BF16 is native
# (when PyTorch runs its AVX-512 kernels), one with AVX2 only is not; and a device name is checked before
# anything is built.

# %%
avx2 = "flags\t\t: fpu sse2 avx avx2 fma"
assert not cpu_has_native_bf16(avx2)
assert cpu_has_native_bf16(avx2 + " avx512f avx512_bf16") == (torch.backends.cpu.get_cpu_capability() == "AVX512")
assert resolve_precision("fp32", "cpu") == "fp32" and resolve_device("cpu") == torch.device("cpu")
print(expect_error(lambda: check_device("tpu")))
print(expect_error(lambda: resolve_precision("fp8", "cpu")))
