#!/usr/bin/env bash
# The model weights (fp32 state dicts, 1.6 MB) of the f = 1, seed 0 runs, for chapter 34's analyses; the runs'
# training checkpoints (with the optimizer state) stay on the machine that ran them. Run from the repository root.
set -euo pipefail
python -c "
import torch
for name in ('deit_f1_s0', 'convit_f1_s0'):
    state = torch.load(f'nbs/results/sample-efficiency/{name}/last.pt', map_location='cpu', weights_only=True)['model']
    torch.save({'model': state}, f'nbs/results/sample-efficiency/{name}/weights.pt')
"
