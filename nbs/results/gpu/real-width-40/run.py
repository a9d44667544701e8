"""Table 2 at real widths on 40 classes, on one GPU, as one command: README.md beside this file registers the design,
the budget rule and the rule the result is read by. Run from the repository root.

    python nbs/results/gpu/real-width-40/run.py pack     # here: the 40 classes and the fastprogress wheel, to carry
    python nbs/results/gpu/real-width-40/run.py gpu OUT --started EPOCH   # on the lent machine (README.md)
    tar xzf OUT/real-width-40.tar.gz -C nbs/results/gpu/real-width-40     # back here: the records

`gpu` unpacks the classes, makes the grids' split, starts the four runs (one process each, `child`), measures their
pace once all four are training (the probe), sets their steps from it (`budget.json`), lets them train, and writes
the summary (chapter 37's `write_summary`) and one archive of the records into OUT. Its runs live in
`runs/real-width-40` (ignored by git, so a warm machine keeps them between calls): called again there, it keeps
`budget.json`, skips the finished runs and resumes the others from their `last.pt`.
"""

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from convit_edu.datasets import ImageFolderDataset
from convit_edu.experiment_design import RunSpec, sample_efficiency_scale
from convit_edu.experiments import (fixed_test_split, folder_class_sizes, run_budget, run_config, train_run,
                                    write_summary)
from convit_edu.files import write_json
from convit_edu.run_state import Callback, TrainState
from convit_edu.training import train

RUNS = Path("runs/real-width-40")  # on the lent machine: ignored by git, kept between the calls of a warm machine
CARRY = Path("data/real-width-40")  # what travels (the device tool's `carry`): the packed classes and the wheel
ARCHIVE = "classes.tar.gz"
WHEEL = "fastprogress==1.0.3"  # the package imports it and the lent machine lacks it (1.0.3: no dependencies)
RESULTS = "real-width-40.tar.gz"


@dataclass(frozen=True)
class Design:
    """The registered design (README.md) as numbers: the data, the runs, their recipe and the budget rule."""

    classes: int = 40
    fraction: float = 0.1
    seeds: tuple[int, ...] = (1, 2)
    test_per_class: int = 100
    dev_per_class: int = 50
    evaluations: int = 20  # the dev score every 5 % of the steps, the checkpoint with it
    warmup: float = 0.1  # of the steps
    common: dict[str, Any] = field(default_factory=lambda: {
        "img_size": 48, "global_batch": 128, "lr": 8e-3, "clip_grad": 1.0, "drop_path_rate": 0.1,
        "model_args": {"patch_size": 4, "embed_dim": 192, "num_heads": 3, "depth": 12},
        "aug_args": {"randaugment_magnitude": 9, "erasing": 0.25}, "compile": True, "device": "cuda",
        "progress": "lines"})
    convit_args: dict[str, Any] = field(default_factory=lambda: {"num_heads": 4, "local_up_to_layer": 10})
    seconds: float = 480  # from the call's start to the records collected
    window_s: float = 15  # the probe: seconds of pace measured once every run is training
    start_s: float = 15  # allowed for the runs to start again after the probe
    end_s: float = 30  # allowed to score the runs, write their records and collect them
    safety: float = 0.9
    min_steps: int = 1000  # fewer: the call stops before training (README.md)
    probe_steps: int = 5000  # the runs' steps while probed (their evaluations then come every probe_steps / 20)


def run_specs(design: Design, data_root: Path, steps: int, workers: int) -> dict[str, RunSpec]:
    """The runs of ``design`` on the split ``data_root``, each ``steps`` optimiser steps in ``evaluations`` epochs of a
    stream cycling its images (``epoch_steps``), the warm-up its share of them, ``workers`` loader processes each."""
    scale = sample_efficiency_scale(data_root, design.classes, steps * design.common["global_batch"],
                                    convit_args=design.convit_args, num_workers=workers, **design.common)
    epochs = design.evaluations
    cycled = dict(epochs=epochs, epoch_steps=steps // epochs, warmup_epochs=design.warmup * epochs, eval_every=1)
    specs = [scale.run(model, design.fraction, seed) for seed in design.seeds for model in ("deit", "convit")]
    return {spec.name: replace(spec, config=replace(spec.config, **cycled)) for spec in specs}


def steps_for(design: Design, rate: float, seconds_left: float) -> int:
    """The budget rule: ⌊safety · rate · seconds_left / evaluations⌋ · evaluations optimiser steps (0 if no time)."""
    return max(0, int(design.safety * rate * seconds_left / design.evaluations)) * design.evaluations


# The probe: each run writes its pace (wall time, optimiser step) every few steps and stops when told.

class Pace(Callback):
    """Appends "time step" to ``path`` every ``every`` optimiser steps; asks the run to stop once ``stop`` exists."""

    def __init__(self, path: Path, stop: Path, every: int = 10):
        self.path, self.stop, self.every = path, stop, every

    def on_step_end(self, state: TrainState) -> None:
        if state.global_step % self.every == 0:
            with self.path.open("a") as f:
                f.write(f"{time.time():.3f} {state.global_step}\n")
            state.stop = self.stop.exists()


def read_pace(path: Path) -> list[tuple[float, int]]:
    if not path.is_file():
        return []
    return [(float(t), int(s)) for t, s in (line.split() for line in path.read_text().splitlines() if line.strip())]


def pace_rate(rows: list[tuple[float, int]], start: float, stop: float) -> float:
    """Optimiser steps per second between the first and the last of ``rows`` within [start, stop]."""
    inside = [(t, s) for t, s in rows if start <= t <= stop]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        raise ValueError(f"fewer than two pace points between {start:.1f} and {stop:.1f}: no rate")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


# A run's process: probed, then trained with the budget (or trained at once when budget.json exists).

def child(runs: Path, name: str) -> int:
    """Run ``name`` of the call in ``runs``: probed until the call says STOP (unless budget.json exists), then trained
    for the budget's steps (0: not at all); its record is chapter 37's ``record.json``."""
    parent, info = os.getppid(), json.loads((runs / "design.json").read_text())
    design = Design(**{**info["design"], "seeds": tuple(info["design"]["seeds"])})
    root, workers, probe, budget = Path(info["data_root"]), info["workers"], runs / "probe", runs / "budget.json"
    if not budget.is_file():
        spec = run_specs(design, root, design.probe_steps, workers)[name]
        shutil.rmtree(probe / name, ignore_errors=True)
        endless = run_config(spec, probe / name, epochs=10**6)  # it ends when the call says STOP
        train(endless, callbacks=[Pace(probe / f"pace-{name}.txt", probe / "STOP")])
        gc.collect()  # the probe's model, optimiser and loader workers go before the run's
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        (probe / f"probed-{name}").touch()
        while not budget.is_file():
            if os.getppid() != parent:  # the call is gone
                return 1
            time.sleep(0.2)
    steps = json.loads(budget.read_text())["steps"]
    if steps == 0:
        return 0
    record = train_run(run_specs(design, root, steps, workers)[name], runs, records=design.evaluations)
    return 0 if record is not None else 1


# The call: data, split, probe, budget, the four runs, the records.

def unpack(carry: Path, data: Path) -> Path:
    """The packed classes, extracted into ``data`` once."""
    root = data / "tiny-imagenet-100-first40"
    if not (root / "train").is_dir():
        with tarfile.open(carry / ARCHIVE) as tar:
            tar.extractall(data, filter="data")
    return root


def probe(design: Design, runs: Path, procs: dict[str, subprocess.Popen], started: float) -> dict:
    """Wait until every run has stepped twice after compiling, measure their pace for ``window_s`` more and stop
    the probe: the budget, its steps those of the budget rule, 0 when fewer than ``min_steps`` fit."""
    folder, last_start = runs / "probe", started + design.seconds - design.start_s - design.end_s

    def paces() -> dict[str, list[tuple[float, int]]]:  # read as they grow; an error if the probe cannot end
        failed = {name: p.returncode for name, p in procs.items() if p.poll() is not None}
        if failed or time.time() > last_start:
            raise RuntimeError(f"the probe ended without a pace: run(s) exited {failed} (their output: "
                               f"{runs}/NAME.out), {time.time() - started:.0f} s after the call began")
        time.sleep(0.2)
        return {name: read_pace(folder / f"pace-{name}.txt") for name in procs}

    rows = paces()
    while any(len(r) < 2 for r in rows.values()):
        rows = paces()
    start = max(r[1][0] for r in rows.values())  # every run has compiled and stepped
    while time.time() < start + design.window_s or any(sum(t >= start for t, _ in r) < 3 for r in rows.values()):
        rows = paces()  # the window, and three pace points of every run in it
    stop = time.time()
    (folder / "STOP").touch()
    while not all((folder / f"probed-{name}").exists() for name in procs):
        if any(p.poll() is not None for p in procs.values()):
            raise RuntimeError(f"a run exited at the end of its probe (its output: {runs}/NAME.out)")
        time.sleep(0.2)
    rates = {name: pace_rate(read_pace(folder / f"pace-{name}.txt"), start, stop) for name in procs}
    rate = min(r for name, r in rates.items() if name.startswith("convit"))
    left = started + design.seconds - time.time() - design.start_s - design.end_s
    steps = steps_for(design, rate, left)
    budget = {"steps": steps if steps >= design.min_steps else 0, "fitted_steps": steps, "rate": rate,
              "rates": rates, "window_s": stop - start, "probe_started_s": start - started, "seconds_left": left}
    print(f"probe: {', '.join(f'{n} {r:.1f}' for n, r in rates.items())} steps/s over {stop - start:.0f} s with all "
          f"{len(procs)} runs training, from {start - started:.0f} s after the call began; {left:.0f} s left to "
          f"train: {steps:,} steps fit", flush=True)
    return budget


def announce(spec: RunSpec) -> None:
    """The budget, before the first step: steps, images, passes, warm-up and learning-rate sum."""
    cfg = spec.config
    images, rates = run_budget(cfg, folder_class_sizes(cfg))
    kept = len(ImageFolderDataset(Path(cfg.data_root) / "train", max_classes=cfg.classes, fraction=cfg.fraction))
    print(f"budget: {cfg.epochs * cfg.epoch_steps:,} steps of {cfg.images_per_step()} images a run ({images:,} images, "
          f"{images / kept:.0f} passes over the {kept:,}), a warm-up of {round(cfg.warmup_epochs * cfg.epoch_steps)} "
          f"steps, learning-rate sum {rates:.2f}; the dev score every {cfg.epoch_steps} steps", flush=True)


def wait(procs: dict[str, subprocess.Popen], deadline: float) -> bool:
    """Wait for the runs until ``deadline``, then stop the ones still training (a later call resumes them from their
    checkpoint). Whether every run finished."""
    for name, p in procs.items():
        try:
            p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            print(f"{name} is still running at the deadline: stopped with a checkpoint", flush=True)
    stop(procs)
    return all(p.returncode == 0 for p in procs.values())


def stop(procs: dict[str, subprocess.Popen]) -> None:
    """SIGTERM to the runs still going (a run in training writes its checkpoint first), SIGKILL after 20 s."""
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def collect(runs: Path, out: Path) -> Path:
    """One archive of the records in ``out``: the runs' records, logs and outputs, the probe's paces, the summary;
    no checkpoint, compile cache or image."""
    paths = [p for pattern in ("*.json", "*.jsonl", "*.csv", "*.txt", "*.png", "*.out")
             for p in (*runs.glob(pattern), *runs.glob(f"*/{pattern}")) if p.parent.name != "data"]
    with tarfile.open(out / RESULTS, "w:gz") as tar:
        for path in sorted(paths):
            tar.add(path, str(path.relative_to(runs)))
    return out / RESULTS


def gpu(out: Path, started: float, design: Design = Design(), carry: Path = CARRY, data: Path = Path("data"),
        runs: Path = RUNS) -> int:
    """The whole call: ``design`` within ``design.seconds`` of ``started``, its records into ``out``. Exit status 0
    when every run finished."""
    split = fixed_test_split(unpack(carry, data), runs / "data", design.classes, design.test_per_class,
                             design.dev_per_class)
    names = list(run_specs(design, split, design.probe_steps, 0))
    cpus = len(os.sched_getaffinity(0))
    workers = max(0, (cpus - len(names)) // len(names))  # the cores left beside the runs, shared
    write_json(runs / "design.json", {"design": asdict(design), "data_root": str(split), "workers": workers})
    (runs / "probe").mkdir(exist_ok=True)
    (runs / "probe" / "STOP").unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": str(max(1, cpus // len(names))),
           "TORCHINDUCTOR_CACHE_DIR": str((runs / "compile-cache").resolve()), "PYTHONUNBUFFERED": "1"}
    todo = [name for name in names if not (runs / name / "record.json").is_file()]
    print(f"{len(todo)} of {len(names)} runs to train ({', '.join(todo) or 'none'}), {workers} loader workers each "
          f"on {cpus} CPUs", flush=True)
    procs = {name: subprocess.Popen([sys.executable, __file__, "child", str(runs), name], env=env,
                                    stdout=(runs / f"{name}.out").open("a"), stderr=subprocess.STDOUT)
             for name in todo}
    budget, finished = runs / "budget.json", False
    try:
        if procs and not budget.is_file():  # (a later call keeps it: the same runs, the same steps)
            probed = probe(design, runs, procs, started)
            if probed["steps"]:
                announce(next(iter(run_specs(design, split, probed["steps"], workers).values())))
            else:
                print(f"stopped: fewer than the {design.min_steps:,} steps the design needs fit (README.md)",
                      flush=True)
            write_json(budget, probed)  # the runs wait for it
        finished = wait(procs, started + design.seconds + 15) and (not procs or json.loads(budget.read_text())[
            "steps"] > 0)
    except RuntimeError as e:
        print(f"failed: {e}", flush=True)
    finally:
        stop(procs)  # none is left behind
    write_summary(runs)
    print((runs / "table.txt").read_text() if (runs / "table.txt").is_file() else "no run finished", flush=True)
    print(f"records: {collect(runs, out)}, {time.time() - started:.0f} s after the call began", flush=True)
    return 0 if finished else 1


def pack(source: Path, dest: Path, classes: int = 40, cap_mb: float = 45.0) -> Path:
    """The first ``classes`` classes of the course's folder ``source`` (train/ and val/, classes.txt) as
    ``dest/ARCHIVE``; a ValueError when it is larger than ``cap_mb`` megabytes."""
    dest.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in (source / "train").iterdir() if p.is_dir())[:classes]
    archive = dest / ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        for split in ("train", "val"):
            for name in names:
                tar.add(source / split / name, f"tiny-imagenet-100-first40/{split}/{name}")
        if (source / "classes.txt").is_file():
            tar.add(source / "classes.txt", "tiny-imagenet-100-first40/classes.txt")
    size = archive.stat().st_size / 1e6
    if size > cap_mb:
        archive.unlink()
        raise ValueError(f"{classes} classes of {source} pack to {size:.1f} MB, over the cap of {cap_mb:g} MB")
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="the classes and the wheel into data/real-width-40 (run here)")
    p.add_argument("--source", type=Path, default=Path("data/tiny-imagenet-100"))
    g = sub.add_parser("gpu", help="the whole call on the lent machine")
    g.add_argument("out", type=Path, help="where the records go ($OUT)")
    g.add_argument("--started", type=float, default=time.time(), help="the call's start (date +%%s)")
    c = sub.add_parser("child", help="one run's process (started by gpu)")
    c.add_argument("runs", type=Path)
    c.add_argument("name")
    args = parser.parse_args(argv)
    if args.command == "child":
        return child(args.runs, args.name)
    if args.command == "gpu":
        return gpu(args.out, args.started)
    archive = pack(args.source, CARRY)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d",
                    str(CARRY), WHEEL], check=True)
    print(f"{archive} ({archive.stat().st_size / 1e6:.1f} MB) and {WHEEL}: carry {CARRY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
