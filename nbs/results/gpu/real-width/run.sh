#!/usr/bin/env bash
# Table 2 at real widths, on one GPU (chapter 38 predicts its cost): DeiT-Ti (3 heads of 64) and ConViT-Ti (4 heads
# of 48, its first 10 blocks GPSA), width 192 and depth 12 as in the paper's Table 1, on the first 10 classes of
# the course's Tiny ImageNet at 64 px in 4-px patches (16 x 16 tokens), the CPU grid's recipe at a batch of 256:
# f = 0.1 first, then f = 1, seed 1, every run scored on the CPU grid's 1 500 test images. Each run prints its
# images and learning-rate sum before it trains; the command resumes where it stopped.
#   bash nbs/results/gpu/real-width/run.sh pack   # the 10 classes into data/tiny-imagenet-100-first10 (11 MB, to carry)
#   bash nbs/results/gpu/real-width/run.sh        # the grid into nbs/results/gpu/real-width (IMAGES=... to change)
set -euo pipefail
source=data/tiny-imagenet-100 first10=data/tiny-imagenet-100-first10
if [ "${1:-}" = pack ]; then
  for split in train val; do
    mkdir -p "$first10/$split"
    for class in $(LC_ALL=C ls "$source/$split" | head -10); do cp -r "$source/$split/$class" "$first10/$split/"; done
  done
  cp "$source/classes.txt" "$first10/"
  du -sh "$first10"
  exit 0
fi
[ -d "$first10" ] || first10=$source
python -m convit_edu.cli experiment sample-efficiency --data-root "$first10" --classes 10 --fractions 0.1 1.0 \
  --seeds 1 --images-per-run "${IMAGES:-250000}" --num-workers "${WORKERS:-15}" --device cuda --progress lines \
  --set img_size=64 --set global_batch=256 --set lr=4e-3 --model-arg patch_size=4 --model-arg embed_dim=192 \
  --model-arg num_heads=3 --model-arg depth=12 --convit-arg num_heads=4 --convit-arg local_up_to_layer=10 \
  --output nbs/results/gpu/real-width
