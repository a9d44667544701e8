#!/usr/bin/env bash
# Table 2 at real widths, on one GPU (chapter 38 predicts its cost): DeiT-Ti (3 heads of 64) and ConViT-Ti (4 heads
# of 48, its first 10 blocks GPSA), width 192 and depth 12 as in the paper's Table 1, on the first 10 classes of
# the course's Tiny ImageNet at 64 px in 4-px patches (16 x 16 tokens), the CPU grid's recipe at a batch of 256:
# f = 0.1 first, then f = 1, seed 1, every run scored on the CPU grid's 1 500 test images. Each run prints its
# images and learning-rate sum before it trains; the command resumes where it stopped.
#   bash nbs/results/gpu/real-width/run.sh pack       # the 10 classes into data/tiny-imagenet-100-first10 (to carry)
#   bash nbs/results/gpu/real-width/run.sh            # the grid into nbs/results/gpu/real-width (IMAGES=... to change)
#   bash nbs/results/gpu/real-width/run.sh collect D  # its records (no checkpoints, no images) as D/real-width.tar.gz
#   DEVICE=cpu WORKERS=1 nice -n 19 bash nbs/results/gpu/real-width/run.sh  # on a CPU instead (hours; see README.md)
# On the lent machine (the device tool: at most 8 files come back, and files a call wrote that are neither tracked
# nor ignored are gone at the next call, so collect in the same call), carrying .whl and the packed classes:
#   python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; timeout 480 bash nbs/results/gpu/real-width/run.sh \
#   >$OUT/log.txt 2>&1; bash nbs/results/gpu/real-width/run.sh collect $OUT
# The first attempt (2026-11-27-h200-first-attempt/, its README) found each one-step epoch waiting on one loader
# worker; chapters 16-17 now share such a batch among the workers. The H100 rerun (README.md) finished three runs
# (a CPU the fourth) and found a checkpoint written at every epoch's end; chapter 28 now writes them at evaluated
# epochs.
set -euo pipefail
source=data/tiny-imagenet-100 first10=data/tiny-imagenet-100-first10 out=nbs/results/gpu/real-width
if [ "${1:-}" = collect ]; then
  tar -czf "${2:?the folder to write real-width.tar.gz in}/real-width.tar.gz" --exclude='*.pt' --exclude="$out/data" \
    --exclude="$out/*-attempt" "$out"
  exit 0
fi
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
  --seeds 1 --images-per-run "${IMAGES:-250000}" --num-workers "${WORKERS:-15}" --device "${DEVICE:-cuda}" --progress lines \
  --set img_size=64 --set global_batch=256 --set lr=4e-3 --model-arg patch_size=4 --model-arg embed_dim=192 \
  --model-arg num_heads=3 --model-arg depth=12 --convit-arg num_heads=4 --convit-arg local_up_to_layer=10 \
  --output "$out"
