"""How llama.cpp's CPU kernels scale with the tokens of one decode call, per catalogue member: the
milliseconds a token and the GFLOP/s (2 × parameters × tokens) of a call of B tokens of one sequence,
with and without a logits row per token (a verify pass wants every row; a prefill only the last),
on all the process's cores. GFLOP/s counts the output head for every token: fair for "all" rows, an
overcount for "last" (llama.cpp skips the head's rows nobody wants). Run alone on the machine; for
an AVX2-only CPU's kernels on one with AVX-512, set LLAMA_CPP_LIB_PATH to an AVX2 build
(docs/serve.md, "Where the time goes, by CPU kind").

    python tools/llama_batch_kernels.py > results/bench/llama-batch-kernels-avx512.txt
"""

from __future__ import annotations

import os
import sys
import time

from specfuse.members.llamacpp.library import llama_cpp_kernels
from specfuse.models.catalogue import DEFAULT_MEMBERS
from specfuse.models.placement import load_members

SIZES = (1, 4, 16, 64)


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    members = load_members(list(DEFAULT_MEMBERS), quantize="gguf")
    load = os.getloadavg()[0]
    print(f"llama.cpp {llama_cpp_kernels()} kernels, {os.cpu_count()} cores, load average {load:.2f}")
    print(f"{'member':<22} {'B':>3} {'rows':>5} {'ms/token':>9} {'GFLOP/s':>8}")
    for m in members:
        for size in SIZES:
            for rows in (False, True):
                items = [(0, p, 100 + p % 50, rows) for p in range(size)]
                reps = max(2, 64 // size)
                seconds = []
                for _ in range(reps + 1):  # the first call allocates: not counted
                    m.lib.llama_memory_seq_rm(m.memory, 0, -1, -1)
                    m.cached[0] = []
                    began = time.perf_counter()
                    for _ in m._decode(items, "bench"):
                        pass
                    seconds.append(time.perf_counter() - began)
                per_token = sum(seconds[1:]) / reps / size
                gflops = 2 * m.parameters / per_token / 1e9
                which = "all" if rows else "last"
                print(f"{m.name:<22} {size:3d} {which:>5} {per_token * 1000:9.2f} {gflops:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
