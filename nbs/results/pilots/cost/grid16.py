"""Does a 16 x 16 grid pay for its cost? Training images/s of the pilots' ConViT and DeiT (width 72, 9 heads,
depth 6, 4-px patches, 10 classes, batch 32, fp32, one thread) at 48-px images (12 x 12) and 64-px (16 x 16).
Run from the repository root on an otherwise idle machine: python nbs/results/pilots/cost/grid16.py"""
import json
from pathlib import Path

import torch

from convit_edu.benchmarks import measure_model
from convit_edu.zoo import create_model

torch.set_num_threads(1)
torch.manual_seed(0)
shape = dict(patch_size=4, embed_dim=72, num_heads=9, depth=6, num_classes=10)
rates = {}
for img_size in (48, 64):
    for name, extra in (("convit_tiny", dict(local_up_to_layer=4)), ("deit_tiny", {})):
        model = create_model(name, img_size=img_size, **shape, **extra)
        result = measure_model(model, 32, img_size, steps=10, num_classes=10)
        rates[f"{name}_{img_size}px"] = result["train_images_per_s"]
        print(name, img_size, f"{result['train_images_per_s']:.1f} train images/s")
lines = Path("/proc/cpuinfo").read_text().splitlines()
info = dict(map(str.strip, line.split(":", 1)) for line in lines if ":" in line)
cpu = f"{info['model name']} (model {info['model']}, avx512_bf16: {'avx512_bf16' in info['flags']})"
out = {"cpu": cpu, "threads": 1, "batch": 32, "train_images_per_s": rates}
Path(__file__).with_name("grid16.json").write_text(json.dumps(out, indent=1) + "\n")
