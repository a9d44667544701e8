#!/usr/bin/env bash
# Issue 26's fourth pilot queue, replacing the rest of pilots.sh's queue 2 (grid8, images90k, grid16-40k) after
# the base pilots failed pre-conditions 3 (learning rates summing to 0.93) and 4 (the ConViT at f = 1 still
# climbing, both models at f = 1 fitting only 65-67 % of their training images): the learning rate doubled AND
# 90 000 images per run (learning rates summing to 2.85), about the most a run can take within 25 minutes on
# one core of this CPU. Same conventions as pilots.sh; run from the repository root.
set -euo pipefail
export OMP_NUM_THREADS=1
out=nbs/results/pilots
base=(--data-root data/tiny-imagenet-100-first10 --classes 10 --seeds 0 --num-workers 1 --progress lines
      --images-per-run 90000 --set img_size=48 --model-arg patch_size=4 --set lr=0.032)
python -m convit_edu.cli experiment sample-efficiency "${base[@]}" --fractions 0.1 --output $out/lr2x-90k
python -m convit_edu.cli experiment sample-efficiency "${base[@]}" --fractions 1.0 --output $out/lr2x-90k-f1
