"""A run's folder has one owner (`run_records.RunFolder` names, writes and reads its files; `RunWriter` decides when),
a run's schedule is a function of the step, and a loader is one entry of one table (issue 55)."""

import inspect
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_training import config, make_data, make_model
from training_checks import StopAt

from convit_edu import files, run_records, run_state
from convit_edu.augment import augmentation
from convit_edu.config import TrainConfig, resolve_config
from convit_edu.distributed import World
from convit_edu.loader_registry import LOADERS, LoaderKind
from convit_edu.loaders import build_loaders
from convit_edu.optimisation import build_optimizer, learning_rate_sum, run_schedule
from convit_edu.run_records import RunFolder, RunWriter
from convit_edu.run_state import TrainState
from convit_edu.schedule import deit_lr, scaled_lr
from convit_edu.training import train

pytestmark = pytest.mark.usefixtures("one_thread")

ONE = World(0, 1, torch.device("cpu"), False)


# ------------------------------------------------------------------------------------------------- the run folder


def test_every_file_a_run_writes_is_named_by_its_folder_and_written_whole_by_the_atomic_writer(tmp_path, monkeypatch):
    written = []
    for module in (files, run_records, run_state):  # every binding of the one atomic writer
        real = module.atomic_write
        monkeypatch.setattr(module, "atomic_write", lambda path, write, _real=real: written.append(Path(path).name)
                            or _real(path, write))
    result = train(config(tmp_path, epochs=2), model=make_model(), datasets=make_data())
    folder = RunFolder(tmp_path)
    named = {folder.last, folder.best, folder.info, folder.invocations, folder.log, folder.table, folder.curves}
    assert {p.name for p in tmp_path.iterdir()} == {p.name for p in named}  # nothing else, nothing half-written
    assert set(written) == {p.name for p in named} - {folder.best.name}  # best.pt: a second name, no bytes written
    assert folder.history() == result.history and folder.checkpoint()["history"] == result.history
    assert folder.run_info()["config"]["epochs"] == 2 and [s["resumed_from"] for s in folder.starts()] == [None]


def test_the_folders_readers_name_a_file_no_run_has_written(tmp_path):
    folder = RunFolder(tmp_path / "empty")
    assert not folder.holds_run()
    for read, name in ((folder.history, "log.jsonl"), (folder.run_info, "run.json"), (folder.starts,
                                                                                        "invocations.jsonl")):
        with pytest.raises(FileNotFoundError, match=f"{name} does not exist: no run has written it in"):
            read()
    with pytest.raises(FileNotFoundError, match="no checkpoint file at .*last.pt"):
        folder.checkpoint()


def small_state(global_step: int = 0, history: int = 0, pending: bool = False) -> TrainState:
    model = torch.nn.Linear(2, 2)
    state = TrainState(config("unused"), model, torch.optim.AdamW(model.parameters()), 0, 1, steps_per_epoch=550)
    state.step, state.global_step = global_step, global_step
    state.history = [{"epoch": 1, "step": i, "val_top1": 1.0} for i in range(history)]
    state.pending = {"epoch": 1} if pending else None
    return state


def test_the_writers_policy_is_told_by_events_not_epochs(tmp_path, monkeypatch):
    """What a run of many tiny epochs evaluated every N steps needs (issue 55's first user): the writer decides from
    what it is told — an evaluation begun, scored, the run returning — and its `due` counts optimiser steps; nothing
    in it is per epoch. Here evaluations at steps 300 and 600 of one long epoch, `ckpt_every` 0 (checkpoints only at
    evaluations) and, for the second writer, every 200 steps."""
    saved = []
    monkeypatch.setattr(run_records, "save_checkpoint", lambda ckpt, path: saved.append(ckpt["step"]))
    monkeypatch.setattr(run_records, "keep_as", lambda path, kept: saved.append(f"kept as {Path(kept).name}"))
    monkeypatch.setattr(run_records.RunFolder, "write_curves", lambda self, history: None)
    state = small_state()
    writer = RunWriter(RunFolder(tmp_path), ONE, ckpt_every=0, contents=lambda: {"step": state.global_step})
    writer.prepare()
    writer.start(state, {"config": {}}, resumed_from=None, changes={})
    assert not any(writer.due(small_state(step)) for step in range(1, 601))
    for step, improved in ((300, True), (600, False)):
        state.step = state.global_step = step
        state.pending = {"step": step}
        writer.evaluating(state)
        state.history.append({"step": step, "val_top1": 1.0})
        state.pending = None
        writer.scored(state, improved)
    writer.finished(state)
    assert saved == [300, "kept as best.pt", 600, 600]  # the last: last.pt with the second score, as the run returns
    assert [row["step"] for row in RunFolder(tmp_path).history()] == [300, 600]
    every = RunWriter(RunFolder(tmp_path), ONE, ckpt_every=200, contents=dict)
    assert [step for step in range(1, 601) if every.due(small_state(step))] == [200, 400, 600]


def test_a_run_that_returns_saves_only_what_last_pt_lacks(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(run_records, "save_checkpoint", lambda ckpt, path: saved.append(ckpt))
    monkeypatch.setattr(run_records.RunFolder, "write_curves", lambda self, history: None)
    state = small_state(global_step=40, history=2)
    writer = RunWriter(RunFolder(tmp_path), ONE, ckpt_every=0, contents=lambda: {"step": state.global_step})
    writer.prepare()
    writer.start(state, {"config": {}}, resumed_from=tmp_path / "last.pt", changes={})  # resumed from this position
    writer.finished(state)
    assert saved == []  # a resumed run that trains nothing writes nothing
    state.step = state.global_step = 41
    writer.finished(state)
    assert saved == [{"step": 41}]


# -------------------------------------------------------------------------------------- the schedule of the step


def test_the_schedule_is_a_function_of_the_step_with_deits_scaling_rule_written_once():
    cfg = TrainConfig(lr=5e-4, epochs=4, warmup_epochs=1, min_lr=1e-5, warmup_lr=1e-6, global_batch=1024)
    schedule = run_schedule(cfg, steps_per_epoch=25, global_batch=cfg.images_per_step())
    assert (schedule.total_steps, schedule.warmup_steps, schedule.peak_lr) == (100, 25, scaled_lr(5e-4, 1024))
    assert scaled_lr(5e-4, 1024) == 1e-3
    assert [schedule.lr(t) for t in (0, 25, 100)] == [deit_lr(t, 100, 25, 1e-3, 1e-5, 1e-6) for t in (0, 25, 100)]
    again = run_schedule(cfg, steps_per_epoch=25, global_batch=1024)  # a resumed run's, built afresh
    assert again == schedule and [again.lr(t) for t in range(100)] == [schedule.lr(t) for t in range(100)]
    assert learning_rate_sum(cfg, 25, world_size=1) == sum(schedule.lr(t) for t in range(100))


def test_a_checkpoint_holds_no_schedule_and_a_resume_that_mends_lr_steps_at_the_new_rate(tmp_path):
    cfg = config(tmp_path, epochs=2, ema_decay=None)
    train(cfg, model=make_model(), datasets=make_data(), callbacks=[StopAt(0, 5)])
    ckpt = run_state.read_checkpoint(tmp_path / "last.pt")
    assert "scheduler" not in ckpt and ckpt["global_step"] == 5
    mended = replace(cfg, lr=cfg.lr / 2, resume="auto")
    optimizer, schedule = build_optimizer(mended, make_model(), 8, 12, torch.device("cpu"))
    optimizer.load_state_dict(ckpt["optimizer"])  # the saved groups hold the old run's rate...
    schedule.set_lr(optimizer, ckpt["global_step"])  # ...which the step's own rate replaces
    assert optimizer.param_groups[0]["lr"] == run_schedule(mended, 12, 8).lr(5) == schedule.lr(5)


# ------------------------------------------------------------------------------------------------ the loader table


def test_a_new_loader_is_one_entry_of_the_table_and_a_run_trains_with_it(tmp_path, monkeypatch):
    built = []

    def counted_loaders(train_set, val_set, aug, *, device, **sizes):  # a module of its own would hold this
        built.append((aug, device, sizes))
        return build_loaders(train_set, val_set, **sizes)

    monkeypatch.setitem(LOADERS, "counted", LoaderKind(counted_loaders, "counts its builds"))
    result = train(config(tmp_path, epochs=1, loader="counted"), model=make_model(), datasets=make_data())
    assert len(result.history) == 1 and run_state.read_checkpoint(tmp_path / "last.pt")["config"]["loader"] == "counted"
    ((aug, device, sizes),) = built
    assert device == torch.device("cpu") and aug.img_size == 8
    assert sizes == {"batch_size": 8, "num_workers": 0, "repeats": 1, "num_replicas": 1, "rank": 0, "seed": 0}


def test_the_configs_checks_are_the_plain_values_of_the_loaders_entry(tmp_path, monkeypatch):
    monkeypatch.setitem(LOADERS, "strict", LoaderKind(build_loaders, "reads folders", reads_files=True,
                                                      crop="random_resized", repeats=False,
                                                      needs="convit_edu.no_such_module", install="install it so"))
    with pytest.raises(ValueError, match="loader 'strict' reads image files: it needs data 'imagefolder', not 'fake'"):
        TrainConfig(loader="strict")
    with pytest.raises(ValueError, match="crop 'random_resized' only .* not aug 'pad-crop-flip'"):
        TrainConfig(loader="strict", data="imagefolder", aug="pad-crop-flip")
    with pytest.raises(ValueError, match="no repeated augmentation: repeats 3 needs loader 'torchvision'"):
        TrainConfig(loader="strict", data="imagefolder", repeats=3)
    with pytest.raises(ImportError, match="needs convit_edu.no_such_module, which is not installed: install it so"):
        TrainConfig(loader="strict", data="imagefolder")
    monkeypatch.setitem(LOADERS, "strict", replace(LOADERS["strict"], needs=None))
    cfg, notes = resolve_config("imagenet", {"loader": "strict"})
    assert cfg.repeats == 1 and notes[0].startswith("loader strict has no repeated augmentation")
    with pytest.raises(ValueError, match="datasets passed to train\\(\\) need loader 'torchvision'"):
        train(config(tmp_path, data="imagefolder", loader="strict", aug="deit", aug_args={}), model=make_model(),
              datasets=make_data())


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_every_loader_of_the_table_is_built_the_one_way(name):
    """Each entry's `build` takes what a run passes it (run_setup.build_run_loaders): a loader whose builder does
    not (a loader module's signature changed) is caught here, not in a run."""
    inspect.signature(LOADERS[name].build).bind(
        [], [], augmentation("deit", 16), batch_size=8, num_workers=0, repeats=1, num_replicas=1, rank=0, seed=0,
        device=torch.device("cpu"))
