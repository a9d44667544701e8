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
# # Many processes: torchrun, srun, rank 0's writes and clean stops
#
# One process per GPU, on one node or many: how each process learns its place (torchrun's or SLURM's
# variables), how they sum numbers, why only rank 0 writes — and what happens when that write fails —, how a
# SIGTERM or Ctrl-C stops them all cleanly, and the SLURM batch script that saves and requeues a job
# (chapter 43 launches it).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp distributed
# Many processes: the world from torchrun or srun, sums over processes, rank 0's writes, clean stops, a SLURM script.

# %%
#| export
import os
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from convit_edu.devices import resolve_device

# %%
import torch

torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## One process or many
#
# `torchrun` (and `srun … torchrun` under SLURM) starts one process per GPU and tells each its `RANK`,
# `LOCAL_RANK` and `WORLD_SIZE` through the environment; a plain `python` start has none of them and is a world
# of one. GPUs talk through NCCL, CPU processes through gloo — the same code, which is how CI tests the real
# distributed path with two CPU processes. Only rank 0 prints, writes logs and writes checkpoints; every
# number it logs is first summed over all ranks.

# %%
#| export
@dataclass
class World:
    """This process's place in the run: its rank among `world_size` processes and its device."""

    rank: int
    world_size: int
    device: torch.device
    owns_group: bool  # this call initialised the process group and must destroy it

    @property
    def main(self) -> bool:
        """Rank 0: the process that prints and writes."""
        return self.rank == 0


_LAUNCHERS = {  # the variables each launcher sets: (rank, world size, local rank)
    "torchrun": ("RANK", "WORLD_SIZE", "LOCAL_RANK"), "srun": ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID")}
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)  # longer than any wait between collectives (a checkpoint write)


def _world_from_env(env: Mapping[str, str] = os.environ) -> tuple[int, int, int, str | None]:
    """(rank, world size, local rank, launcher) from torchrun's variables, else from those srun sets for each
    task of a job step (the batch script itself, outside srun, is a world of one), else a world of one."""
    launcher = "torchrun" if "WORLD_SIZE" in env else "srun" if "SLURM_STEP_NUM_TASKS" in env else None
    if launcher is None:
        return 0, 1, 0, None
    try:
        rank, world_size, local_rank = (int(env[name]) for name in _LAUNCHERS[launcher])
    except (KeyError, ValueError):
        raise ValueError(f"{launcher} launch with incomplete variables: need integers in "
                         f"{', '.join(_LAUNCHERS[launcher])}") from None
    if not (world_size >= 1 and 0 <= rank < world_size and 0 <= local_rank <= rank):
        names = dict(zip(_LAUNCHERS[launcher], (rank, world_size, local_rank)))
        raise ValueError(f"inconsistent {launcher} world {names}: need 0 <= local rank <= rank < world size")
    if launcher == "srun" and world_size > 1 and not {"MASTER_ADDR", "MASTER_PORT"} <= set(env):
        raise ValueError(f"srun started {world_size} tasks but MASTER_ADDR / MASTER_PORT are not set: export "
                         "MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1) and MASTER_PORT=29500 "
                         "in the sbatch script, or launch with torchrun")
    return rank, world_size, local_rank, launcher


def init_world(device: str) -> World:
    """This process's world from the launcher's variables (`_world_from_env`), its device (with several GPUs,
    the local rank's), and the process group (NCCL on GPUs, gloo on CPUs) when there are several processes."""
    rank, world_size, local_rank, _ = _world_from_env()
    dev = resolve_device(device)
    if dev.type == "cuda":
        dev = _process_gpu(dev, local_rank, world_size)
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # fp32 matmuls on tensor cores
    owns = world_size > 1 and not dist.is_initialized()
    if owns:  # NCCL told its GPU (`device_id`) connects at once, not lazily at the first collective
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", init_method="env://", rank=rank,
                                world_size=world_size, timeout=PROCESS_GROUP_TIMEOUT,
                                **({"device_id": dev} if dev.type == "cuda" else {}))
    return World(rank, world_size, dev, owns)


def _process_gpu(dev: torch.device, local_rank: int, world_size: int) -> torch.device:
    """The GPU of this process: the one `dev` names (`cuda:3`) for a single process; with several processes one
    each, the local rank's (modulo the visible GPUs: with one GPU per task, as SLURM's --gpus-per-task gives,
    every local rank gets cuda:0). That a named GPU exists, `resolve_device` (chapter 20) has checked."""
    if dev.index is None:
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    if world_size > 1:
        raise ValueError(f"device {str(dev)!r} names one GPU for {world_size} processes, which need one each: use "
                         "--device cuda (each process takes its local rank's GPU), and CUDA_VISIBLE_DEVICES to "
                         "choose which GPUs")
    return dev


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over every process, in place (a world of one: `t` as it is)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t

# %% [markdown]
# A world of one needs no process group, and a sum over it is the tensor itself; torchrun's variables make a
# world of many:

# %%
assert init_world("cpu") == World(0, 1, torch.device("cpu"), False)
assert _world_from_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}) == (3, 8, 3, "torchrun")
assert all_reduce(torch.tensor([2.0])).item() == 2.0
print("one process: rank 0 of 1, main; RANK=3 WORLD_SIZE=8 LOCAL_RANK=3 is rank 3 of 8")

# %% [markdown]
# Each task of an `srun` job step gets SLURM's own variables instead; a launch that is missing one, or whose
# numbers cannot be a world, stops before any process group waits for it:

# %%
from convit_edu.checks import expect_error

srun = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1", "MASTER_ADDR": "node1",
        "MASTER_PORT": "29500"}
assert _world_from_env(srun) == (5, 8, 1, "srun")
print(expect_error(lambda: _world_from_env({k: v for k, v in srun.items() if not k.startswith("MASTER")})))
print(expect_error(lambda: _world_from_env({"RANK": "8", "WORLD_SIZE": "8", "LOCAL_RANK": "0"})))
print(expect_error(lambda: _world_from_env({"RANK": "0", "WORLD_SIZE": "two", "LOCAL_RANK": "0"})))

# %% [markdown]
# ### Rank 0 writes
#
# Only rank 0 writes checkpoints and logs. A write that fails there — a full disk, a lost permission — must
# stop the others too: `run_on_main` runs the write on rank 0, then tells every process in one all-reduce
# whether it failed; without it the others would wait at their next collective for the process group's
# 30-minute timeout. The same pattern lets rank 0 build a run's datasets first: an ImageNet folder's 1.28 M
# file names are then listed once, by rank 0, which caches the list (chapter 13), and the others read the cache.

# %%
#| export
def run_on_main(world: World, what: str, write: Callable[[], Any]) -> Any:
    """`write()` on rank 0 only, then every process hears whether it failed, in one all-reduce: a full disk or a
    permission error on rank 0 stops every process at once with that error, instead of leaving the others
    waiting at their next collective until the process group's 30-minute timeout."""
    error = result = None
    if world.main:
        try:
            result = write()
        except Exception as e:  # raised below, once every process has heard of it
            error = e
    failed = world.world_size > 1 and all_reduce(torch.tensor(float(error is not None), device=world.device)).item()
    if error is not None:
        raise error
    if failed:
        raise OSError(f"rank 0 could not {what} (rank 0's output has its error): every process stops")
    return result

# %%
assert run_on_main(World(0, 1, torch.device("cpu"), False), "add", lambda: 2 + 3) == 5
message = expect_error(lambda: run_on_main(World(0, 1, torch.device("cpu"), False), "write", lambda: open("/", "w")), OSError)
assert "Is a directory" in message
print(message)

# %% [markdown]
# ## Stopping cleanly
#
# SLURM pre-empts or time-limits a job by sending SIGTERM, then SIGKILL a grace period later; Jupyter's
# *interrupt* sends SIGINT. Both only raise a flag here. The loop finishes the optimiser step it is in, sums the
# flag over ranks (so every process stops at the same step even when only one got the signal), writes a
# checkpoint and returns; `convit-edu train` then exits with status 0 and `--resume auto` continues. A second
# SIGINT is not caught: Ctrl-C twice interrupts at once, losing only the steps since the last checkpoint. A loss
# that is not finite travels in the same all-reduce: every rank raises `FloatingPointError` at once, and no
# checkpoint ever holds non-finite weights, so the last checkpoint stays the last good state (chapter 28).

# %%
#| export
class StopSignals:
    """Turn SIGTERM and SIGINT into a flag for the duration of a run (main thread only), then restore. A second
    SIGINT (Ctrl-C twice) is left to the handler that was there before: it interrupts at once."""

    def __init__(self):
        self.received: str | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        if signum == signal.SIGINT:
            signal.signal(signum, self._previous[signum] or signal.default_int_handler)

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

# %% [markdown]
# The flag, by experiment: a SIGTERM sent to this very process (what SLURM sends) inside a run is recorded and
# nothing else happens; after the run, the handlers that were there before are back.

# %%
before = signal.getsignal(signal.SIGTERM)
with StopSignals() as stop:
    os.kill(os.getpid(), signal.SIGTERM)  # without StopSignals, the default handler would end this process
    for _ in range(100):  # Python runs a signal's handler between bytecodes of the main thread
        if stop.received:
            break
assert stop.received == "SIGTERM", stop.received
assert signal.getsignal(signal.SIGTERM) is before
print(f"received {stop.received} as a flag; the previous SIGTERM handler is restored")

# %% [markdown]
# A first SIGINT is a flag too, and it hands SIGINT back at once: the next Ctrl-C meets the handler that was there
# before (here Python's, which raises `KeyboardInterrupt`).

# %%
before = signal.getsignal(signal.SIGINT)
with StopSignals() as stop:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100):
        if stop.received:
            break
    assert stop.received == "SIGINT" and signal.getsignal(signal.SIGINT) is before, signal.getsignal(signal.SIGINT)
print(f"received {stop.received} as a flag; a second one would meet {before.__name__}")

# %% [markdown]
# ### A SLURM batch script
#
# Five minutes before its time limit SLURM signals the batch script, which stops the job step (every rank saves
# `last.pt`) and requeues the job; `--resume auto` continues it. The script is a file of the package,
# `convit_edu/slurm/convit_small.sbatch` (`SBATCH_SCRIPT` is its path: copy it, edit the paths, `sbatch` it);
# chapter 43 walks through launching at every scale and checks its commands.

# %%
#| export
from importlib import resources

SBATCH_SCRIPT = resources.files("convit_edu") / "slurm" / "convit_small.sbatch"  # a file of the package

# %%
print(SBATCH_SCRIPT.read_text())

# %% [markdown]
# The two delays have to nest: torchrun's grace for the workers to write `last.pt` must end before the job's
# time limit, which is five minutes after SLURM's warning.

# %%
import re

script = SBATCH_SCRIPT.read_text()
warning = int(re.search(r"--signal=B:USR1@(\d+)", script).group(1))
grace = int(re.search(r"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=(\d+)", script).group(1))
assert warning == 5 * 60 and grace < warning, (warning, grace)
print(f"SLURM warns {warning} s before the limit; the workers get {grace} s to write last.pt")
