#!/usr/bin/env bash
# Issue 26's pilots: single seed, one change each from the 12 x 12 base, scored on the dev images (val/) only.
# Two queues side by side, one core each:  bash nbs/results/pilots/pilots.sh 1 & bash nbs/results/pilots/pilots.sh 2
# Each command resumes where it stopped; run from the repository root.
set -euo pipefail
queue=${1:?queue 1 or 2}
export OMP_NUM_THREADS=1
out=nbs/results/pilots
base=(--data-root data/tiny-imagenet-100-first10 --classes 10 --seeds 0 --num-workers 1 --progress lines
      --images-per-run 60000)
grid12=(--set img_size=48 --model-arg patch_size=4)
se() { python -m convit_edu.cli experiment sample-efficiency "${base[@]}" "$@"; }
ab() { python -m convit_edu.cli experiment ablations "${base[@]}" --fraction 0.1 "$@"; }
full_aug=(--aug-arg "scale=(0.08, 1.0)" --aug-arg randaugment_magnitude=9 --aug-arg erasing=0.25
          --aug-arg mixup_alpha=0.8 --aug-arg cutmix_alpha=1.0 --aug-arg crop_ratio=0.875)
if [ "$queue" = 1 ]; then
  se --fractions 0.1 "${grid12[@]}" --output $out/grid12
  ab --names frozen_gpsa "${grid12[@]}" --output $out/grid12
  ab --names convit "${grid12[@]}" --convit-arg local_up_to_layer=5 --output $out/gpsa5
  se --fractions 0.1 "${grid12[@]}" "${full_aug[@]}" --output $out/aug-deit
  se --fractions 0.1 "${grid12[@]}" --model-arg embed_dim=96 --model-arg num_heads=12 --output $out/width96
else
  se --fractions 1.0 "${grid12[@]}" --output $out/grid12-f1
  ab --names convit "${grid12[@]}" --convit-arg locality_strength=2.0 --output $out/alpha2
  se --fractions 0.1 --output $out/grid8
  python -m convit_edu.cli experiment sample-efficiency "${base[@]/60000/90000}" --fractions 0.1 "${grid12[@]}" \
    --output $out/images90k
  python -m convit_edu.cli experiment sample-efficiency "${base[@]/60000/40000}" --fractions 0.1 \
    --model-arg patch_size=4 --output $out/grid16-40k
fi
