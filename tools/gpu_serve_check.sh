#!/usr/bin/env bash
# The serving benchmark on one GPU (issues 45 and 52): 1, 8, 16 and 32 clients through the live API
# against random-weight members with the real shapes of Qwen2.5-7B, Llama-3.1-8B and Gemma-2-9B in
# bf16 (docs/serve.md, "Many clients on a GPU"), once with eager drafting and once with the KV-slot
# drafting whose steps are captured as CUDA graphs (members/slots.py, docs/gpu.md), side by side:
# each level's tok/s, first segment, measured ÷ the weight-read ceiling, and the graphs' answers
# against the eager ones. Run from the repository root on the GPU machine:
#
#     OUT=/some/folder bash tools/gpu_serve_check.sh
#
# Needs nothing from the network: the members are built on the device from configs written in
# specfuse/bench/shapes.py, with an in-memory byte tokenizer. Writes $OUT/gpu-serve-{eager,graphs}.
# {json,txt,log} and $OUT/gpu-serve-compare.txt. Each path gets DEADLINE seconds (default 190:
# no request is sent after that, counted from its start) and `timeout DEADLINE+40`: both within
# 8 minutes on an H200. The same script on a CPU, in seconds, to prove it runs:
#
#     OUT=/tmp/check SHAPES=tiny DEVICE=cpu DTYPE=float32 LEVELS=1,4 PER_CLIENT=1 MAX_TOKENS=16 \
#         DEADLINE=120 bash tools/gpu_serve_check.sh
#
# Exit status: 0 done; 1 a request failed (or a report is missing); 3 the deadline cut a level
# short or skipped one (the reports are still written); anything else: the benchmark's own
# (2: bad input or a failed start; 124: timed out).
set -uo pipefail
: "${OUT:?set OUT to the folder for the report}"
PY=${PYTHON:-$(command -v python || command -v python3)}
SHAPES=${SHAPES:-real} DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16} LEVELS=${LEVELS:-1,8,16,32}
PER_CLIENT=${PER_CLIENT:-2} MAX_TOKENS=${MAX_TOKENS:-64} DEADLINE=${DEADLINE:-190}
PATHS=${PATHS:-eager graphs} EXTRA=${EXTRA:-}  # EXTRA: more flags for bench serve (--profile)
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false

if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1
fi
"$PY" -c 'import sys, torch, transformers, fastapi, uvicorn, httpx
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"GPU seen: {torch.cuda.is_available()}), transformers {transformers.__version__}")' || exit 2

status=0
labelled=()
for path in $PATHS; do
    echo "== decode $path"
    # A path is a --decode value, or graphs-off-OPTION[-OPTION]: the KV slots with those options off
    # (bench serve --slots-off), e.g. PATHS="graphs graphs-off-ahead-fold" to measure what they are worth;
    # either may end in -parallel: the members at once, each in its thread on its own CUDA stream
    # (--parallel on; one GPU's default is in turn), e.g. PATHS="graphs graphs-parallel", or in
    # -processes: the members at once, each in a worker process of its own (--processes); and before
    # that in -unfrozen: start-up's objects left in the garbage collector's full passes (--no-freeze).
    base=$path off=() parallel=() unfrozen=()
    [ "${base%-parallel}" != "$base" ] && parallel=(--parallel on) && base=${base%-parallel}
    [ "${base%-processes}" != "$base" ] && parallel=(--processes) && base=${base%-processes}
    [ "${base%-unfrozen}" != "$base" ] && unfrozen=(--no-freeze) && base=${base%-unfrozen}
    if [[ $base == *-off-* ]]; then
        opts=${base#*-off-}
        off=(--slots-off ${opts//-/ })
    fi
    timeout $((DEADLINE + 40)) "$PY" -m specfuse.bench serve --shapes "$SHAPES" --device "$DEVICE" \
        --dtype "$DTYPE" --decode "${base%%-off-*}" "${off[@]}" "${parallel[@]}" "${unfrozen[@]}" --levels "$LEVELS" --per-client "$PER_CLIENT" --min-requests 4 \
        --max-tokens "$MAX_TOKENS" --segment-len 10 --deadline "$DEADLINE" --out "$OUT/gpu-serve-$path" $EXTRA \
        2>&1 | tee "$OUT/gpu-serve-$path.log"
    code=${PIPESTATUS[0]}
    if [ "$code" -ne 0 ]; then
        echo "the benchmark failed ($path): exit status $code" >&2
        status=$code
        continue
    fi
    labelled+=("$path=$OUT/gpu-serve-$path.json")
done
if [ "${#labelled[@]}" -gt 0 ]; then
    "$PY" -m specfuse.bench.ceiling "${labelled[@]}" | tee "$OUT/gpu-serve-compare.txt"
fi
[ "$status" -ne 0 ] && exit "$status"

"$PY" - "$OUT" $PATHS <<'EOF'
import json
import sys
from pathlib import Path

out, paths = Path(sys.argv[1]), sys.argv[2:]
codes = []
for path in paths:
    report = json.loads((out / f"gpu-serve-{path}.json").read_text())
    levels = report["levels"].values()
    errors = sum(len(level["errors"]) for level in levels)
    short = [level["clients"] for level in levels if level["cut_short"]]
    print(f"check {path}: {errors} failed requests; cut short: {short or 'none'}; "
          f"skipped: {report['skipped'] or 'none'}; {report['seconds']:.0f} s")
    codes.append(1 if errors else 3 if short or report["skipped"] else 0)
sys.exit(1 if 1 in codes else max(codes, default=1))
EOF
