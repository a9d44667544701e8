#!/usr/bin/env bash
# Model weights (fp32 state dicts, 0.7 MB) of two runs of ../commands.sh, for chapter 09; run from the repository root.
set -euo pipefail
python -c "
import torch
for name in ('deit_f1', 'convit_f1'):
    state = torch.load(f'nbs/results/cpu/{name}/last.pt', map_location='cpu', weights_only=True)['model']
    torch.save({'model': state}, f'nbs/results/cpu/weights/{name}.pt')
"
