"""A run a user can mend and watch: resume with a lower learning rate, a clipped gradient or another precision
(recorded), a loader's waiting time in the logs, every process stopped when rank 0 cannot write, and the
presets' notes (issue 23)."""

import json
import math
import time
from dataclasses import replace

import pytest
import torch
from test_training import config, make_data, make_model
from training_checks import StopAt

from convit_edu import cli, run_records
from convit_edu import config as config_module
from convit_edu.config import TrainConfig
from convit_edu.loader_registry import LOADERS
from convit_edu.run_state import Callback, read_checkpoint
from convit_edu.schedule import deit_lr, scaled_lr
from convit_edu.training import train

pytestmark = pytest.mark.usefixtures("one_thread")


def invocations(output) -> list[dict]:
    return [json.loads(line) for line in (output / "invocations.jsonl").read_text().splitlines()]


def test_a_stopped_run_resumes_with_a_lower_learning_rate_and_records_it(tmp_path, capsys):
    cfg = config(tmp_path, epochs=2, ema_decay=None)
    train(cfg, model=make_model(), datasets=make_data(), callbacks=[StopAt(0, 5)])
    lower = replace(cfg, lr=cfg.lr / 4, min_lr=1e-4, clip_grad=1.0, resume="auto")
    result = train(lower, model=make_model(), datasets=make_data())
    out = capsys.readouterr().out
    assert "lr 0.5 -> 0.125" in out and "min_lr 1e-05 -> 0.0001" in out and "clip_grad None -> 1.0" in out
    starts = invocations(tmp_path)
    assert starts[0]["changed"] == {} and starts[1]["changed"] == {
        "lr": [0.5, 0.125], "min_lr": [1e-05, 0.0001], "clip_grad": [None, 1.0]}
    # the last epoch's rate is the new schedule's, at the new peak and floor
    steps = 96 // 8
    new = deit_lr(2 * steps, 2 * steps, round(0.5 * steps), scaled_lr(0.125, 8), 1e-4, cfg.warmup_lr)
    assert result.history[-1]["lr"] == pytest.approx(new)
    assert read_checkpoint(tmp_path / "last.pt")["config"]["lr"] == 0.125


def test_the_first_step_after_a_resume_already_uses_the_changed_rate(tmp_path):
    cfg = config(tmp_path, epochs=2, ema_decay=None, warmup_epochs=0.0)
    train(cfg, model=make_model(), datasets=make_data(), callbacks=[StopAt(0, 5)])
    seen = []

    class FirstRate(StopAt):
        def on_step_end(self, state):
            seen.append(state.optimizer.param_groups[0]["lr"])  # the rate this step used
            super().on_step_end(state)

    train(replace(cfg, lr=0.05, resume="auto"), model=make_model(), datasets=make_data(), callbacks=[FirstRate(0, 6)])
    assert seen == [pytest.approx(deit_lr(5, 24, 0, scaled_lr(0.05, 8), cfg.min_lr, cfg.warmup_lr))]


def test_a_resume_may_change_the_precision_but_not_what_the_run_means(tmp_path):
    cfg = config(tmp_path, epochs=2)
    train(cfg, model=make_model(), datasets=make_data(), callbacks=[StopAt(0, 4)])
    for change, named in (({"seed": 3}, "seed 0 -> 3"), ({"warmup_epochs": 1.0}, "warmup_epochs 0.5 -> 1.0"),
                          ({"repeats": 2}, "repeats 1 -> 2"), ({"model": "convit_tiny"}, "model 'deit_tiny'")):
        with pytest.raises(ValueError, match=named) as e:
            train(replace(cfg, resume="auto", **change), model=make_model(), datasets=make_data())
        assert "a resume may change lr, min_lr, clip_grad, precision, data_root" in str(e.value)
    result = train(replace(cfg, precision="bf16", resume="auto"), model=make_model(), datasets=make_data())
    assert len(result.history) == 2 and invocations(tmp_path)[-1]["changed"] == {"precision": ["fp32", "bf16"]}


def test_every_epoch_row_records_how_long_the_steps_waited_for_data(tmp_path, capsys):
    class Slow(torch.utils.data.Dataset):  # a loader that cannot keep up: 20 ms per image
        def __init__(self, base):
            self.base = base

        def __len__(self):
            return len(self.base)

        def __getitem__(self, i):
            time.sleep(0.02)
            return self.base[i]

    train_set, val_set, classes = make_data(n_train=48)
    result = train(config(tmp_path, epochs=1, progress="lines", log_every=2), model=make_model(),
                   datasets=(Slow(train_set), val_set, classes))
    row = result.history[-1]
    assert 0.5 < row["data_wait_share"] <= 1 and row["data_wait_s"] >= 6 * 8 * 0.02 * 0.9
    assert math.isclose(row["data_wait_share"], row["data_wait_s"] / row["epoch_time_s"])
    header = (tmp_path / "log.csv").read_text().splitlines()[0].split(",")
    assert {"data_wait_s", "data_wait_share"} <= set(header)
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("epoch 1/1 step")]
    assert len(lines) == 3 and all("data wait" in line for line in lines), lines
    assert "epochs 1-1 of 6 steps: a line every 2 steps and after each evaluated epoch" in out  # said first
    assert out.index("epochs 1-1 of 6 steps: a line every 2 steps and after each evaluated epoch") < out.index(lines[0])


def test_a_failed_checkpoint_write_is_raised_with_its_own_error(tmp_path, monkeypatch):
    def disk_full(checkpoint, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_records, "save_checkpoint", disk_full)
    with pytest.raises(OSError, match="No space left on device"):
        train(config(tmp_path, epochs=1), model=make_model(), datasets=make_data())


def test_num_workers_none_is_the_loader_default_and_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(config_module, "default_num_workers", lambda: 0)
    train(config(tmp_path, epochs=1, num_workers=None), model=make_model(), datasets=make_data())
    assert json.loads((tmp_path / "run.json").read_text())["num_workers"] == 0


def test_the_imagenet_preset_with_the_dali_loader_drops_repeats_with_a_note(monkeypatch, capsys):
    monkeypatch.setitem(LOADERS, "dali", replace(LOADERS["dali"], needs=None))  # the config's check only; nothing runs
    assert cli.main(["train", "--preset", "imagenet", "--loader", "dali", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "note: loader dali has no repeated augmentation: the preset's repeats 3 becomes 1" in out
    assert json.loads(out[out.index("{"):])["repeats"] == 1
    assert cli.main(["train", "--preset", "imagenet", "--loader", "dali", "--repeats", "3", "--print-config"]) == 1
    assert "--loader 'dali' has no repeated augmentation: --repeats 3" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_steps_between_two_log_intervals_never_wait_for_the_gpu(tmp_path):
    """Between read-backs the host only queues work: every step that is not a logging step runs with CUDA's
    sync debugging set to raise on any synchronising call (a blocking copy, .item(), a mask built on the CPU)."""

    class NoSyncBetweenReadBacks(Callback):
        def on_step_end(self, state):  # the step that ends an interval reads back next: allow it; else forbid
            torch.cuda.set_sync_debug_mode("default" if state.step % state.cfg.log_every == 0 else "error")

        def on_train_end(self, state):
            torch.cuda.set_sync_debug_mode("default")

    cfg = TrainConfig(model="convit_tiny", model_args={"patch_size": 4, "depth": 2, "local_up_to_layer": 1},
                      img_size=16, data="fake", data_args={"num_train": 96, "num_val": 16, "image_size": 16},
                      epochs=1, batch_size=8, log_every=4, num_workers=0, device="cuda", progress="none",
                      output=str(tmp_path))
    try:
        result = train(cfg, callbacks=[NoSyncBetweenReadBacks()])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert result.history and result.history[-1]["step"] == 12
