"""Why the PSA runs took longer than the grid's other runs: training images/s of the grid's ConViT (12 x 12 grid:
48-px images in 4-px patches, width 72, 9 heads, depth 6, 4 GPSA layers, 10 classes, batch 32, fp32, one thread)
with its GPSA layers and with App. A's PSA layers (Eq. 4) in their place, each as the runs trained and with the
CPU flushing denormal numbers to zero; and the share of denormal entries in the first layer's positional attention
at initialization. Run from the repository root on an otherwise idle machine:
python nbs/results/second-design/psa_speed.py
The committed psa_speed.json measured the code the grid trained with (its "commit"), before chapter 05's
positional_softmax flushed P's denormals: on code after it, the GPSA gets most of that speed back without a
flushing CPU."""
import json
import subprocess
from pathlib import Path

import torch

from convit_edu.benchmarks import measure_model
from convit_edu.zoo import create_model

torch.set_num_threads(1)
torch.manual_seed(0)
shape = dict(img_size=48, patch_size=4, embed_dim=72, num_heads=9, depth=6, num_classes=10, local_up_to_layer=4)
rates = {}
for local_attention in ("gpsa", "psa"):
    model = create_model("convit_tiny", local_attention=local_attention, **shape)
    for flush in (False, True):
        torch.set_flush_denormal(flush)
        key = local_attention + (" flush denormals" if flush else "")
        rates[key] = measure_model(model, 32, 48, steps=10, num_classes=10)["train_images_per_s"]
        print(key, f"{rates[key]:.1f} train images/s")
    torch.set_flush_denormal(False)
with torch.no_grad():
    attention = model.blocks[0].attn.positional_scores((12, 12)).softmax(dim=-1)
denormal = ((attention > 0) & (attention < torch.finfo(torch.float32).tiny)).float().mean().item()
lines = Path("/proc/cpuinfo").read_text().splitlines()
info = dict(map(str.strip, line.split(":", 1)) for line in lines if ":" in line)
cpu = f"{info['model name']} (model {info['model']}, avx512_bf16: {'avx512_bf16' in info['flags']})"
commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
out = {"cpu": cpu, "commit": commit, "threads": 1, "batch": 32, "train_images_per_s": rates,
       "positional_denormal_share": denormal}
Path(__file__).with_name("psa_speed.json").write_text(json.dumps(out, indent=1) + "\n")
