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
# bf16 autocast runs matmuls in bfloat16 (same exponent range as fp32, so no loss scaling); fp16
# needs a `GradScaler`, which scales the loss up so small gradients survive and skips steps whose gradients
# overflow; fp32 is exact and what the resume tests use. bf16 pays on GPUs (Ampere and later) and on CPUs
# with AVX-512 BF16 or AMX units; a CPU without them emulates it, and is *slower* in bf16 than in fp32 — see
# the measurement below. So `precision="auto"` means bf16 on a GPU that has it (fp16 on older ones); on a CPU,
# bf16 where the CPU says it has the units (the `avx512_bf16` or `amx_bf16` flags of `/proc/cpuinfo`, with
# PyTorch running its AVX-512 kernels), fp32 elsewhere — the flags rather than a timed trial, because a trial
# at start-up would cost seconds and vary with the load, while the flags decide the same way every time.
# `device="auto"` is CUDA, else Apple's MPS (whose precision stays fp32), else the CPU. On a GPU, fp32 runs its
# matmuls on tensor cores in TF32, and AdamW runs fused (one kernel for all parameters).

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
    autocast is about twice as fast as fp32 on a training step; elsewhere bf16 is emulated and far slower."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: no flags to read, so no claim of native bf16
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return bool({"avx512_bf16", "amx_bf16"} & set(flags)) and torch.backends.cpu.get_cpu_capability() == "AVX512"


def resolve_device(device: str) -> torch.device:
    """"auto" -> CUDA if there is a GPU, else Apple's MPS, else the CPU; other names are checked."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else
                            "mps" if torch.backends.mps.is_available() else "cpu")
    check_device(device)
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for but CUDA is not available: use --device cpu")
    return torch.device(device)


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
