# tkaot: `make build` compiles the default shape set into prebuilt/sm90 and prebuilt/sm100 (CPU + nvcc, no GPU);
# `make ext` compiles the launcher extension tkaot/_launch.abi3.so (system C compiler; optional);
# `make wheels` packs dist/tkaot-*.whl (runtime: pure, and with the extension) and dist/tkaot_sm90-*.whl
# and dist/tkaot_sm100-*.whl (prebuilt/<arch>), offline; `make test` runs the test suite; `make bench` runs the benchmarks on a GPU machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
STAMP := $(VENV)/.tkaot-installed

.PHONY: venv ext build wheels test test-gpu bench lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	# the CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[build,test]'
	touch $(STAMP)

venv: $(STAMP)

# Built beside, then swapped in: prebuilt/<arch> holds exactly the default set (no stale variants),
# and a failed build leaves the previous one in place. Unchanged variants come from the build cache.
# Every arch: sm90 (Hopper, run on an H200) and sm100 (Blackwell: built, not yet run on hardware).
# ascend950: AscendC sources + launch specs (any machine); binaries too where CANN's bisheng is on PATH
ARCHES ?= sm90 sm100 ascend950
build: $(STAMP)
	set -e; for arch in $(ARCHES); do \
		rm -rf prebuilt/.$$arch.new; \
		$(BIN)/tkaot-build build --shapeset default --arch $$arch --out prebuilt/.$$arch.new -j $(JOBS); \
		[ $$arch = ascend950 ] || $(BIN)/tkaot-build verify prebuilt/.$$arch.new; \
		rm -rf prebuilt/$$arch && mv prebuilt/.$$arch.new prebuilt/$$arch; \
	done

# Without a C compiler or Python headers this says so and tkaot keeps its ABI launcher.
ext: $(STAMP)
	$(BIN)/python -m build_tools.ext --optional

wheels: ext
	$(BIN)/python -m build_tools.wheel --out dist

test: ext
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

# GPU tests run with the machine's CUDA Python (the .venv holds a CPU build of torch)
test-gpu:
	$(PY) -m pytest -q -m gpu tests/gpu

# On a GPU machine, with the Python that has CUDA torch (and, for the peer columns, tile_kernels):
#   make bench PY=python3
bench:
	$(PY) -m bench.run --out bench/results
	$(PY) -m bench.decode
	$(PY) -m bench.report "$$(ls -t bench/results/*.json | head -1)" --md bench/RESULTS.md --png bench/results/latest.png

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build dist *.egg-info tkaot/_launch.abi3.so
