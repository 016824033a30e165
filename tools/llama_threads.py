"""Each default member in llama.cpp (gguf) alone at 1 thread and at all of this machine's threads,
alternating, twice: whether a step's cost besides its reads is thread barriers (then fewer threads
would not be slower) or arithmetic (then time falls with more threads).

    python tools/llama_threads.py [--tokens 100]
"""

from __future__ import annotations

import argparse
import os
import statistics

from specfuse.models.catalogue import DEFAULT_MEMBERS
from specfuse.models.loading import load_member

PROMPT = "Write a long story about a lighthouse keeper."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=100, help="tokens decoded per timing (default 100)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"load average before: {os.getloadavg()[0]:.2f}; {cores} cores; {args.tokens} tokens, greedy")
    print(f"{'member':22} {'1 thread':>12} {f'{cores} threads':>12} {'speed-up':>9}")
    for name in DEFAULT_MEMBERS:
        member = load_member(name, quantize="gguf")
        member.generate_alone(PROMPT, 20)  # warm-up
        times: dict[int, list[float]] = {1: [], cores: []}
        for _ in range(2):
            for threads in times:
                member.set_threads(threads)
                n, seconds = member.generate_alone(PROMPT, args.tokens)
                times[threads].append(1000 * seconds / n)
        one, all_ = statistics.median(times[1]), statistics.median(times[cores])
        print(f"{name:22} {one:9.2f} ms {all_:9.2f} ms {one / all_:8.2f}×", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
