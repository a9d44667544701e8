#!/usr/bin/env bash
# The GPU check (chapters 44-45, `convit-edu check-gpu`) on a lent GPU machine, in one call of the device tool;
# README.md beside this file, "Running the check on a lent machine", says what it measures and what each call costs.
#   bash nbs/results/gpu/check.sh prepare     # here, once per checkout: the fastprogress wheel into .whl/ (ignored)
#   bash nbs/results/gpu/check.sh             # there: installs .whl, runs the check, its files into $OUT/gpu-check/
#   bash nbs/results/gpu/check.sh keep DIR    # here: DIR's files into nbs/results/gpu/<UTC time>-<GPU name>/
# The call: run(command="bash nbs/results/gpu/check.sh", carry=[".whl"], timeout_s=600). It ends within 9.5 minutes
# (a 480 s budget: a phase begins only when its predicted seconds are left; `timeout` stops it at 570 s whatever
# happens, and results.json holds every phase ended by then). What did not fit is SKIP (deadline); with device time
# left, a second call on the still-warm machine runs those phases, its compiles found in the first call's cache:
#   run(command="PHASES='pil_convit_s pil_deit_s' BUDGET=150 bash nbs/results/gpu/check.sh", carry=[".whl"], ...)
# Environment: BUDGET (seconds, default 480), PHASES (names, default every phase), SMOKE=1 (toy sizes on a CPU: how
# this script is tested without a GPU).
set -euo pipefail
wheel=fastprogress-1.0.3-py3-none-any.whl
if [ "${1:-}" = prepare ]; then
  [ -f ".whl/$wheel" ] || python3 -m pip download -q --no-deps -d .whl fastprogress==1.0.3
  git check-ignore -q .whl || { echo "add .whl/ to .gitignore (or .git/info/exclude): it is carried, not committed"; exit 1; }
  ls -l ".whl/$wheel"
  exit 0
fi
if [ "${1:-}" = keep ]; then  # the folder name the check gives by default, read from its own results
  from="${2:?the folder holding results.json, summary.txt and log.txt}"
  to=$(python3 -c 'import json, re, sys; e = json.load(open(sys.argv[1]))["environment"]
print("nbs/results/gpu/" + e["date_utc"][:16].replace(":", "") + "Z-" + re.sub("[^a-z0-9]+", "-", (e["gpu"] or "cpu").lower()).strip("-"))' "$from/results.json")
  mkdir -p "$to"
  cp "$from"/results.json "$from"/summary.txt "$from"/log.txt "$to"/
  echo "$to"
  exit 0
fi
out="${OUT:?the folder whose files come back: the device tool sets OUT}/gpu-check"
mkdir -p "$out"
if [ -d .whl ]; then  # the lent machine has torch, torchvision, numpy, Pillow, einops, matplotlib; not fastprogress
  site=$(mktemp -d /tmp/convit-edu-site.XXXXXX)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
  export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-/tmp/convit-edu-compile-cache}"
nvidia-smi 2>&1 | head -15 || true
# shellcheck disable=SC2086  # PHASES is a list of names
timeout 570 python3 -m convit_edu.gpu_check ${SMOKE:+--smoke} --budget-s "${BUDGET:-480}" --output "$out" \
  ${PHASES:+--phases $PHASES} 2>&1 | tee "$out/log.txt" || true
ls -l "$out"
