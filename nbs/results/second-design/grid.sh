#!/usr/bin/env bash
# Issue 26's pre-registered grid at the design chapter 39's rule picked (the doubled learning rate: 12 x 12 grid,
# 48-px images in 4-px patches, 60 000 images per run, lr 3.2e-2): Table 2 at f = 0.1 and f = 1, seeds 1-4 (seed 0
# stays the pilots'), and Table 3's ablations at f = 0.1, seeds 1 and 3 (one per queue). Two queues side by side,
# one core each; start queue 1 first (it builds the test split), queue 2 once data/split.json exists:
#   bash nbs/results/second-design/grid.sh 1 &  ...  bash nbs/results/second-design/grid.sh 2 &
# Every command prints its expected hours and resumes where it stopped; run from the repository root.
set -euo pipefail
queue=${1:?queue 1 or 2}
export OMP_NUM_THREADS=1
out=nbs/results/second-design
design=(--data-root data/tiny-imagenet-100-first10 --classes 10 --num-workers 1 --progress lines
        --images-per-run 60000 --set img_size=48 --model-arg patch_size=4 --set lr=0.032 --output $out)
seeds=(1 2)
[ "$queue" = 2 ] && seeds=(3 4)
python -m convit_edu.cli experiment sample-efficiency "${design[@]}" --fractions 0.1 1.0 --seeds "${seeds[@]}"
python -m convit_edu.cli experiment ablations "${design[@]}" --fraction 0.1 --seeds "${seeds[0]}" \
  --names convit frozen_gate no_conv_init frozen_gpsa psa
