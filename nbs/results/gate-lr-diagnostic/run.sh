#!/usr/bin/env bash
# A diagnostic, not a reproduction: the grid of nbs/results/second-design (seed 1, ConViT, f = 0.1 then f = 1)
# with one change, gate_lr_scale=100: the GPSA gates learn at 100 times the learning rate, so that their
# learning-rate sum (about 186) is the paper's (about 188) while every other parameter keeps the grid's (1.86).
# One core; resumes where it stopped; run from the repository root.
set -euo pipefail
export OMP_NUM_THREADS=1
out=nbs/results/gate-lr-diagnostic
design=(--data-root data/tiny-imagenet-100 --classes 10 --num-workers 1 --progress lines
        --images-per-run 60000 --set img_size=48 --model-arg patch_size=4 --set lr=0.032 --set gate_lr_scale=100
        --output $out)
for f in 0.1 1.0; do
  python -m convit_edu.cli experiment ablations "${design[@]}" --fraction $f --seeds 1 --names convit
done
