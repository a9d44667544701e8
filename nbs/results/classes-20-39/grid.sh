#!/usr/bin/env bash
# Issue 54, part 2: Table 2 at f = 0.1 on classes 20-39 of the course's Tiny ImageNet as one 20-way task, with the
# registered grid's recipe (nbs/results/second-design/grid.sh) and its budget in steps: batch 64 at lr 1.6e-2 (the
# same 2e-3 a step as 32 at 3.2e-2), 120 000 images (1 850 steps, 169 passes over the 700 images, learning-rate sum
# 1.86) and a warm-up of 20 000 images (311 steps, as the grid's 10 000 at batch 32). Only the classes and the test
# set (3 000 images) change. fp32, as the earlier grids ran: `auto` would pick bf16 on a CPU with AVX-512 BF16.
# The rule this run is read by is README.md, committed before the first step.
# Seeds 1-4 of the ConViT and the DeiT; then, if the time allows, Table 3's frozen GPSA and App. A's PSA with each
# queue's first seed. Two queues, one core each; start queue 1 first (it builds the split), queue 2 once
# nbs/results/classes-20-39/data/split.json exists:
#   bash nbs/results/classes-20-39/grid.sh 1 &  ...  bash nbs/results/classes-20-39/grid.sh 2 &
# Every command prints its expected hours and resumes where it stopped; run from the repository root.
set -euo pipefail
queue=${1:?queue 1 or 2}
export OMP_NUM_THREADS=1
out=nbs/results/classes-20-39
design=(--data-root data/tiny-imagenet-100 --classes 20 --first-class 20 --num-workers 1 --progress lines
        --images-per-run 120000 --warmup-images 20000 --set img_size=48 --model-arg patch_size=4
        --set global_batch=64 --set lr=0.016 --set precision=fp32 --output $out)
seeds=(1 3)
[ "$queue" = 2 ] && seeds=(2 4)
for seed in "${seeds[@]}"; do
  python -m convit_edu.cli experiment sample-efficiency "${design[@]}" --fractions 0.1 --seeds "$seed"
done
for name in frozen_gpsa psa; do
  python -m convit_edu.cli experiment ablations "${design[@]}" --fraction 0.1 --seeds "${seeds[0]}" --names "$name"
done
