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
# # The graphed training step, checked
#
# Chapter 28's `TrainStep` replays its work on the device from a CUDA graph when `cuda_graphs` says so (`28_cuda_graphs`
# built the pieces). This chapter checks the two promises of that on whole trainers: the replayed steps compute what
# the eager steps compute, bit for bit, and a graphed run stopped anywhere resumes to the weights of an uninterrupted
# one. On this CPU the graph is the stand-in (the same step, run under the capture's rules); on a GPU the GPU check
# (chapter 45) calls the same function on a real capture.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp training

# %% [markdown]
# ## Replayed against eager
#
# `graph_replay_difference` runs the first steps of a run three ways on the same seed and batches — replayed from its
# graph, the same step never captured (its warm-up form, forever), and with `cuda_graphs` "off" — and reports the
# largest difference in any weight of the model and its EMA. "off" differs from the graphed step only in how AdamW
# runs: on a GPU at rates in double precision instead of float32 tensors, on a CPU also unfused.

# %%
#| export
import tempfile
from dataclasses import replace

from convit_edu.config import TrainConfig
from convit_edu.cuda_graphs import GRAPH_WARMUP
from convit_edu.distributed import init_world
from convit_edu.training import Trainer, train


def graph_replay_difference(cfg: TrainConfig, steps: int = 2 * GRAPH_WARMUP, *,
                            datasets: tuple | None = None) -> dict[str, float]:
    """The largest difference in any weight (the model's and its EMA's) after the first `steps` optimiser steps of
    the run `cfg` on one process, between its step replayed from a graph (`cuda_graphs` "on": captured on a GPU after
    `GRAPH_WARMUP` eager steps, the stand-in elsewhere) and "eager", the same step never captured, and "off", the step
    of `cuda_graphs` "off" (AdamW's rates Python numbers, not float32 tensors; on a CPU, AdamW unfused). Same seed,
    same batches, temporary run folders. On a GPU, "eager" is 0 when the capture changes nothing, in fp32 with
    deterministic algorithms (some kernels otherwise add in an order that varies from run to run)."""
    if steps <= GRAPH_WARMUP:
        raise ValueError(f"steps {steps} must exceed the {GRAPH_WARMUP} eager warm-up steps: nothing would be replayed")
    world, weights = init_world(cfg.device), {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, graphs, warmup in (("graph", "on", GRAPH_WARMUP), ("eager", "on", steps), ("off", "off", None)):
            trainer = Trainer(replace(cfg, cuda_graphs=graphs, output=f"{tmp}/{name}", resume=None), world,
                              datasets=datasets)
            if steps > trainer.data.steps_per_epoch:
                raise ValueError(f"steps {steps} exceeds the {trainer.data.steps_per_epoch} steps of an epoch: "
                                 "give the run more images or fewer steps")
            if warmup is not None:
                trainer.train_step.graph.warmup = warmup
            batches = trainer.data.loaders.epoch(0)
            for _ in range(steps):
                trainer.train_step(batches)
            s = trainer.state
            weights[name] = [*s.model.state_dict().values(), *(s.ema.state_dict().values() if s.ema else [])]
    return {name: max(float((a.double() - b.double()).abs().max()) for a, b in zip(weights["graph"], weights[name])
                      if a.is_floating_point()) for name in ("eager", "off")}

# %% [markdown]
# A small ConViT (two blocks, the first GPSA) on 16-pixel synthetic images, with all of DeiT's recipe that runs in a
# step — MixUp/CutMix, random erasing, drop path — and gradient clipping and an EMA: three eager steps, a capture,
# three replays. (`tests/test_cuda_graphs.py` adds gradient accumulation and a distillation teacher.)

# %%
from pathlib import Path

import torch

from convit_edu.run_state import Callback

tiny = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 48, "depth": 2,
                   "local_up_to_layer": 1}, data="fake", data_args={"num_train": 48, "num_val": 8, "image_size": 16},
                   epochs=1, batch_size=8, clip_grad=1.0, ema_decay=0.9, precision="fp32", device="cpu",
                   num_workers=0, progress="none")
difference = graph_replay_difference(tiny)
assert difference["eager"] == 0 and difference["off"] < 1e-6
print(f"after 6 steps, replayed against eager: {difference['eager']}; against cuda_graphs off: below 1e-6")

# %% [markdown]
# ## A graphed run, stopped and resumed
#
# What a graph holds is restored before it is captured (`28_cuda_graphs`): the resumed process loads the checkpoint,
# `graph_ready` puts the optimiser back in its graphed form at the first step, three steps run eagerly and the fourth
# is captured around the restored tensors. Run A trains an epoch of twelve steps straight, graphed; run B is stopped
# after step 5 — after its capture — and run C resumes B's checkpoint, graphed too: C ends with A's weights and EMA,
# bit for bit. (A resume may also turn graphs off or on: `tests/test_cuda_graphs.py`.)

# %%
class StopAfterFive(Callback):
    def on_step_end(self, state):
        state.stop = state.epoch == 0 and state.step == 5


tmp = Path(tempfile.mkdtemp())
graphed = replace(tiny, cuda_graphs="on", epochs=1, data_args={"num_train": 96, "num_val": 8, "image_size": 16})
a = train(replace(graphed, output=str(tmp / "A")))
b = train(replace(graphed, output=str(tmp / "B")), callbacks=[StopAfterFive()])
c = train(replace(graphed, output=str(tmp / "B"), resume="auto"))
same = [torch.equal(x, y) for run in ("model", "ema") for x, y in
        zip(getattr(a, run).state_dict().values(), getattr(c, run).state_dict().values())]
assert b.stopped == "callback" and all(same) and a.history[-1]["step"] == c.history[-1]["step"] == 12
print(f"B stopped by a hook after step 5 of 12; C resumed it, graphed: {len(same)} tensors of weights and EMA, all "
      "bit for bit A's")
