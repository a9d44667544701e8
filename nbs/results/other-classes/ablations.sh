#!/usr/bin/env bash
# Table 3's two fixed priors at f = 0.1 on the next 10 classes (--first-class 10), to check chapter 38's claim that
# they end above the trained ConViT: the frozen GPSA (row f) and App. A's PSA, at the design of grid.sh, paired with
# its ConViTs of seeds 1 (queue 1) and 2 (queue 2). Run after grid.sh (it builds the split); one core a queue:
#   bash nbs/results/other-classes/ablations.sh 1 &  bash nbs/results/other-classes/ablations.sh 2 &
# Every command prints its expected hours and resumes where it stopped; run from the repository root.
set -euo pipefail
queue=${1:?queue 1 or 2}
export OMP_NUM_THREADS=1
out=nbs/results/other-classes
design=(--data-root data/tiny-imagenet-100 --classes 10 --first-class 10 --num-workers 1 --progress lines
        --images-per-run 60000 --set img_size=48 --model-arg patch_size=4 --set lr=0.032 --output $out)
for name in frozen_gpsa psa; do
  python -m convit_edu.cli experiment ablations "${design[@]}" --fraction 0.1 --seeds "$queue" --names "$name"
done
