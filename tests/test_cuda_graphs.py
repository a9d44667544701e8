"""The training step replayed from a CUDA graph (chapter 28's `28_cuda_graphs`, `TrainStep`, `29_graphed_step`): on
a CPU through the stand-in, which runs the same step under the rules of a capture; on a GPU (the last test only) a
real capture."""

from dataclasses import replace

import pytest
import torch
from torch import nn
from training_checks import StopAt

from convit_edu.augment import MixupCutmix
from convit_edu.benchmarks import OperationCounter
from convit_edu.config import TrainConfig
from convit_edu.cuda_graphs import (GRAPH_WARMUP, HOST_READS, MIX_NUMBERS, CaptureCheck, GraphCaptureError, StepGraph,
                                    fill, graph_ready, mix_numbers, mix_on_device, step_graphed)
from convit_edu.distributed import World
from convit_edu.run_state import read_checkpoint
from convit_edu.training import Trainer, graph_replay_difference, train

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = World(0, 1, torch.device("cpu"), False)


def tiny(**changes) -> TrainConfig:
    """A two-block ConViT (the first GPSA) on 16-px synthetic uint8 images, with DeiT's MixUp/CutMix, random erasing
    and drop path, gradient clipping and an EMA: every part of a step that a graph must hold."""
    cfg = TrainConfig(model="convit_tiny", img_size=16, model_args={"patch_size": 4, "embed_dim": 32, "num_heads": 4,
                      "depth": 2, "local_up_to_layer": 1}, data="fake",
                      data_args={"num_train": 48, "num_val": 8, "num_classes": 4, "image_size": 16}, epochs=1,
                      batch_size=8, clip_grad=1.0, ema_decay=0.9, precision="fp32", device="cpu", num_workers=0,
                      progress="none")
    return replace(cfg, **changes)


def weights(result) -> list[torch.Tensor]:
    return [*result.model.state_dict().values(), *result.ema.state_dict().values()]


def test_mix_on_device_gives_mixupcutmix_bit_for_bit_for_the_same_draw():
    mixup = MixupCutmix(num_classes=7, label_smoothing=0.1)
    images, labels = torch.randn(5, 3, 12, 10), torch.tensor([6, 0, 3, 3, 1])
    numbers, kinds = torch.zeros(len(MIX_NUMBERS)), set()
    for seed in range(60):
        torch.manual_seed(seed)
        expected = mixup(images, labels)
        torch.manual_seed(seed)
        fill(numbers.unbind(), mix_numbers(mixup, 12, 10))
        with CaptureCheck():
            got = mix_on_device(images, labels, numbers, mixup)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), seed
        kinds.add(float(numbers[-1]))
    assert kinds == {0.0, 1.0}  # both MixUp and CutMix drawn


@pytest.mark.parametrize("changes", [{}, {"accum_steps": 2, "distill_teacher": "deit_tiny", "data_args": {
    "num_train": 96, "num_val": 8, "num_classes": 4, "image_size": 16}}],
                         ids=["recipe", "accumulation-and-teacher"])
def test_the_replayed_step_trains_bit_for_bit_as_the_same_step_run_eagerly(changes):
    difference = graph_replay_difference(tiny(**changes), steps=GRAPH_WARMUP + 3)
    assert difference["eager"] == 0.0
    assert difference["off"] < 1e-6  # without graphs: AdamW unfused, rates in double precision


def test_a_graphed_run_stopped_after_its_capture_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    cfg = tiny(cuda_graphs="on", data_args={"num_train": 80, "num_val": 8, "num_classes": 4, "image_size": 16})
    straight = train(replace(cfg, output=str(tmp_path / "A")))
    train(replace(cfg, output=str(tmp_path / "B")), callbacks=[StopAt(0, 5)])  # of 10, after the capture at step 4
    assert read_checkpoint(tmp_path / "B" / "last.pt")["global_step"] == 5
    resumed = train(replace(cfg, output=str(tmp_path / "B"), resume="auto"))
    assert all(map(torch.equal, weights(straight), weights(resumed)))
    # a resume may turn graphs off (its optimiser's rates become numbers again): the same run, to rounding
    off = train(replace(cfg, cuda_graphs="off", output=str(tmp_path / "C"), resume=str(tmp_path / "B" / "last.pt")))
    assert max(float((a - b).abs().max()) for a, b in zip(weights(straight), weights(off))
               if a.is_floating_point()) < 1e-5


def test_an_eager_checkpoint_resumes_graphed_with_the_optimiser_in_its_graphed_form(tmp_path):
    cfg = tiny(epochs=2, data_args={"num_train": 64, "num_val": 8, "num_classes": 4, "image_size": 16})
    train(replace(cfg, output=str(tmp_path)), callbacks=[StopAt(0, 2)])
    trainer = Trainer(replace(cfg, cuda_graphs="on", output=str(tmp_path), resume="auto"), CPU)
    groups = trainer.state.optimizer.param_groups
    assert not any(g["fused"] for g in groups) and all(isinstance(g["lr"], float) for g in groups)  # as saved
    batches = trainer.data.loaders.epoch(trainer.state.epoch, start=trainer.state.step * 8)
    for _ in range(GRAPH_WARMUP + 2):
        trainer.train_step(batches)
    lr = trainer.state.schedule.rates(trainer.state.global_step - 1)
    assert all(g["fused"] and isinstance(g["lr"], torch.Tensor) for g in groups)
    assert [float(g["lr"]) for g in groups] == [torch.tensor(r).item() for r in lr]  # the last step's, as float32
    assert trainer.train_step.graph.replay is not None


def test_a_replayed_training_step_reads_nothing_back_from_the_device(tmp_path):
    trainer = Trainer(tiny(cuda_graphs="on", output=str(tmp_path)), CPU)
    batches = trainer.data.loaders.epoch(0)
    for _ in range(GRAPH_WARMUP + 1):  # the last one is the capture, under CaptureCheck
        trainer.train_step(batches)
    trainer.train_step(batches)  # a replay
    with OperationCounter() as counter:  # what a replay runs, counted
        trainer.train_step.graph.replay()
    names = {name.split(".")[0] for _, name in counter.counts}
    assert not names & set(HOST_READS) and counter.total("optimizer") <= 4  # fused AdamW: a few launches


def test_a_step_that_reads_the_device_back_is_refused_at_its_capture_naming_the_operation(tmp_path):
    trainer = Trainer(tiny(cuda_graphs="on", output=str(tmp_path)), CPU)
    forward = trainer.train_step.step_model.forward
    trainer.train_step.step_model.forward = lambda x: forward(x) * float(x.mean() > 0)  # a host read in the model
    batches = trainer.data.loaders.epoch(0)
    for _ in range(GRAPH_WARMUP):  # eager: a host read only costs time there
        trainer.train_step(batches)
    with pytest.raises(GraphCaptureError, match="_local_scalar_dense.*--cuda-graphs off"):
        trainer.train_step(batches)


def test_a_replay_whose_python_takes_another_path_than_its_capture_is_refused():
    calls = []

    def body(x):
        calls.append(1)
        return x * 2 if len(calls) < 6 else x + 1  # a branch on a host counter: a graph would freeze it

    graph = StepGraph(body, "cpu", warmup=2)
    for _ in range(5):
        graph(torch.ones(3))
    with pytest.raises(GraphCaptureError, match="another path than at its capture"):
        graph(torch.ones(3))


def test_the_static_buffers_hold_each_batch_and_a_batch_of_another_shape_is_refused_by_name():
    graph = StepGraph(lambda x, y: (x * y).sum(), "cpu", warmup=1)
    outputs = [graph(torch.full((2, 3), float(i)), torch.ones(2, 3)) for i in range(4)]
    assert [float(o) for o in outputs] == [0.0, 6.0, 12.0, 18.0]  # each call's inputs, replayed or not
    assert outputs[2].data_ptr() != graph.output.data_ptr()  # a copy: the next replay rewrites the graph's own
    with pytest.raises(ValueError, match=r"holds inputs \[\(\(2, 3\).*given \[\(\(1, 3\).*--cuda-graphs off"):
        graph(torch.ones(1, 3), torch.ones(1, 3))


def test_fp16_loss_scaling_with_the_fused_adamw_reads_nothing_back_and_skips_a_step_on_the_device():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    graph_ready(optimizer, torch.device("cpu"))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)

    def step(x):
        scaler.scale(model(x).square().mean()).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    step(torch.randn(3, 4))  # the scaler's lazy state, made eagerly (a graph's warm-up)
    with CaptureCheck():
        before = model.weight.detach().clone()
        step(torch.full((3, 4), float("inf")))
    assert torch.equal(model.weight, before) and scaler.get_scale() == 512.0  # skipped, the scale halved


def test_cuda_graphs_is_checked_in_the_config_and_on_with_ddp_is_refused_before_the_run_naming_the_flag():
    with pytest.raises(ValueError, match="cuda_graphs 'sometimes': choose one of auto, on, off"):
        TrainConfig(cuda_graphs="sometimes")
    two = World(0, 2, torch.device("cuda"), False)
    with pytest.raises(ValueError, match="2 processes: DDP.*--cuda-graphs off"):
        step_graphed(TrainConfig(cuda_graphs="on"), two)
    assert not step_graphed(TrainConfig(compile=True), two)  # auto: a DDP run stays eager
    one_gpu = World(0, 1, torch.device("cuda"), False)
    assert step_graphed(TrainConfig(compile=True), one_gpu) and not step_graphed(TrainConfig(), one_gpu)
    assert not step_graphed(TrainConfig(compile=True), CPU) and step_graphed(TrainConfig(cuda_graphs="on"), CPU)
    assert not step_graphed(TrainConfig(cuda_graphs="off", compile=True), one_gpu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real CUDA graph needs a GPU")
def test_on_a_gpu_the_captured_step_replays_the_eager_step_bit_for_bit(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        difference = graph_replay_difference(tiny(device="cuda"), steps=GRAPH_WARMUP + 3)
    finally:
        torch.use_deterministic_algorithms(False)
    assert difference["eager"] == 0.0 and difference["off"] < 1e-5
