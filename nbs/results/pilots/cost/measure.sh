#!/usr/bin/env bash
# Issue 26's cost measurement, as it was run: one ConViT and one DeiT of the doubled-rate design (12 x 12 grid,
# lr 3.2e-2) side by side, one core each, with nothing else running (the pilots paused with SIGSTOP), 7 000 images
# each at f = FRACTION (1.0 by default; it was run at 1.0, then at 0.1). bash's `time` gives each command's wall
# clock ("real", copied into cost.json); the runs' logs are kept beside it. From the repository root; OUT defaults
# to a temporary folder.
set -euo pipefail
export OMP_NUM_THREADS=1
out=${OUT:-$(mktemp -d)}
common=(--data-root data/tiny-imagenet-100-first10 --classes 10 --seeds 0 --num-workers 1 --progress lines
        --images-per-run 7000 --set img_size=48 --model-arg patch_size=4 --set lr=0.032 --fraction "${FRACTION:-1.0}")
(time python -m convit_edu.cli experiment ablations "${common[@]}" --names convit --output "$out/convit" \
   > "$out/convit.log" 2>&1) 2> "$out/convit.time" &
(time python -m convit_edu.cli experiment ablations "${common[@]}" --names deit --output "$out/deit" \
   > "$out/deit.log" 2>&1) 2> "$out/deit.time" &
wait
cat "$out"/*.time
