"""Does a width-96 run fit the budget? Training images/s of the pilots' ConViT and DeiT (12 x 12 grid: 48-px images
in 4-px patches, depth 6, 10 classes, batch 32, fp32, one thread) at width 72 in 9 heads and width 96 in 12 heads
(8 dimensions a head in both). Run from the repository root on an otherwise idle machine:
python nbs/results/pilots/cost/width96.py"""
import json
import subprocess
from pathlib import Path

import torch

from convit_edu.benchmarks import measure_model
from convit_edu.zoo import create_model

torch.set_num_threads(1)
torch.manual_seed(0)
rates = {}
for width in (72, 96):
    for name, extra in (("convit_tiny", dict(local_up_to_layer=4)), ("deit_tiny", {})):
        model = create_model(name, img_size=48, patch_size=4, embed_dim=width, num_heads=width // 8, depth=6,
                             num_classes=10, **extra)
        rates[f"{name}_width{width}"] = measure_model(model, 32, 48, steps=10, num_classes=10)["train_images_per_s"]
        print(name, width, f"{rates[f'{name}_width{width}']:.1f} train images/s")
lines = Path("/proc/cpuinfo").read_text().splitlines()
info = dict(map(str.strip, line.split(":", 1)) for line in lines if ":" in line)
cpu = f"{info['model name']} (model {info['model']}, avx512_bf16: {'avx512_bf16' in info['flags']})"
commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
out = {"cpu": cpu, "commit": commit, "threads": 1, "batch": 32, "train_images_per_s": rates}
Path(__file__).with_name("width96.json").write_text(json.dumps(out, indent=1) + "\n")
