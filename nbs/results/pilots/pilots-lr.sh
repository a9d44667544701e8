#!/usr/bin/env bash
# Issue 26's third pilot queue, added when pre-condition 3 failed on paper for the base design: at 60,000 images
# and batch 32 the schedule's learning rates sum to 0.93 (< 1.5). Double the base learning rate (peak 2e-3):
# the sum becomes 1.86. Same conventions as pilots.sh; run from the repository root.
set -euo pipefail
export OMP_NUM_THREADS=1
out=nbs/results/pilots
base=(--data-root data/tiny-imagenet-100-first10 --classes 10 --seeds 0 --num-workers 1 --progress lines
      --images-per-run 60000 --set img_size=48 --model-arg patch_size=4 --set lr=0.032)
python -m convit_edu.cli experiment sample-efficiency "${base[@]}" --fractions 0.1 --output $out/lr2x
python -m convit_edu.cli experiment sample-efficiency "${base[@]}" --fractions 1.0 --output $out/lr2x-f1
# Added when pre-condition 2 failed for the base design: does the trained attention matter at this learning rate?
python -m convit_edu.cli experiment ablations "${base[@]}" --fraction 0.1 --names frozen_gpsa --output $out/lr2x
# ... and at 90 000 images (pilots-more.sh's design)
python -m convit_edu.cli experiment ablations "${base[@]/60000/90000}" --fraction 0.1 --names frozen_gpsa \
  --output $out/lr2x-90k
