#!/usr/bin/env bash
# The registered grid's Table 2 at f = 0.1 (chapter 38 reads the grid) on the next 10 classes of the course's Tiny
# ImageNet (--first-class 10): do the head start and the grid's verdict hold on other classes? The design of
# nbs/results/second-design/grid.sh, seeds 1-4; then Table 3's two fixed priors (the frozen GPSA, row f, and App.
# A's PSA) paired with the ConViT of each queue's first seed (1 and 2). Two queues, one core each; start queue 1
# first (it builds the split), queue 2 once nbs/results/other-classes/data/split.json exists:
#   bash nbs/results/other-classes/grid.sh 1 &  ...  bash nbs/results/other-classes/grid.sh 2 &
# Every command prints its expected hours and resumes where it stopped; run from the repository root.
set -euo pipefail
queue=${1:?queue 1 or 2}
export OMP_NUM_THREADS=1
out=nbs/results/other-classes
design=(--data-root data/tiny-imagenet-100 --classes 10 --first-class 10 --num-workers 1 --progress lines
        --images-per-run 60000 --set img_size=48 --model-arg patch_size=4 --set lr=0.032 --output $out)
seeds=(1 3)
[ "$queue" = 2 ] && seeds=(2 4)
for seed in "${seeds[@]}"; do
  python -m convit_edu.cli experiment sample-efficiency "${design[@]}" --fractions 0.1 --seeds "$seed"
done
for name in frozen_gpsa psa; do
  python -m convit_edu.cli experiment ablations "${design[@]}" --fraction 0.1 --seeds "${seeds[0]}" --names "$name"
done
