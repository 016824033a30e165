#!/usr/bin/env bash
# The serving benchmark on one GPU (issue 45 item 5): 1, 8, 16 and 32 clients through the live API
# against random-weight members with the real shapes of Qwen2.5-7B, Llama-3.1-8B and Gemma-2-9B in
# bf16 (docs/serve.md, "Many clients on a GPU"). Run from the repository root on the GPU machine:
#
#     OUT=/some/folder bash tools/gpu_serve_check.sh
#
# Needs nothing from the network: the members are built on the GPU from configs written in
# specfuse/bench/shapes.py, with an in-memory byte tokenizer. Writes $OUT/gpu-serve.{json,txt} and
# $OUT/gpu-serve.log. Expected about 3 minutes on an H200 or H100; --deadline 300 stops sending
# requests 300 s after the command starts, and `timeout 480` bounds the whole run.
# Exit status: 0 done; 1 a request failed (or the report is missing); 3 the deadline cut a level
# short or skipped one (the report is still written); anything else: the benchmark's own
# (2: bad input or a failed start; 124: timed out).
set -uo pipefail
: "${OUT:?set OUT to the folder for the report}"
PY=${PYTHON:-$(command -v python || command -v python3)}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1
"$PY" -c 'import sys, torch, transformers, fastapi, uvicorn, httpx
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"GPU seen: {torch.cuda.is_available()}), transformers {transformers.__version__}")' || exit 2

timeout 480 "$PY" -m specfuse.bench serve --shapes real --device cuda --dtype bfloat16 \
    --levels 1,8,16,32 --per-client 2 --min-requests 4 --max-tokens 64 --segment-len 10 \
    --deadline 300 --out "$OUT/gpu-serve" 2>&1 | tee "$OUT/gpu-serve.log"
status=${PIPESTATUS[0]}
if [ "$status" -ne 0 ]; then
    echo "the benchmark failed: exit status $status" >&2
    exit "$status"
fi

"$PY" - "$OUT/gpu-serve.json" <<'EOF'
import json
import sys

report = json.load(open(sys.argv[1]))
levels = report["levels"].values()
errors = sum(len(level["errors"]) for level in levels)
short = [level["clients"] for level in levels if level["cut_short"]]
print(f"check: {errors} failed requests; cut short: {short or 'none'}; skipped: {report['skipped'] or 'none'}; "
      f"{report['seconds']:.0f} s")
sys.exit(1 if errors else 3 if short or report["skipped"] else 0)
EOF
