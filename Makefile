# Two entry points: `make demo` and `make test`. Both install into .venv first when needed.
# TARGET=tpu (the default on a host with a TPU) also installs the TPU runtime (the `tpu`
# extra: torch_xla[tpu], which pins libtpu) and runs on PJRT_DEVICE=TPU; TARGET=cpu installs
# libtpu only as the TPU compiler for `b2t-train --plan --target` (the `tpu-compile` extra).
VENV    ?= .venv
PY      := $(VENV)/bin/python
DEMO    ?= demo_out
DEMO_CONFIG ?= configs/tiny.yaml
SYNTH_OPTS  ?=
BENCH   ?= bench_out
TARGET  ?= $(if $(wildcard /dev/accel0 /dev/vfio/0),tpu,cpu)
ifeq ($(TARGET),tpu)
EXTRAS  := test,spmd,rescore,tpu
export PJRT_DEVICE ?= TPU
else ifeq ($(TARGET),cpu)
EXTRAS  := test,spmd,rescore,tpu-compile
export PJRT_DEVICE ?= CPU
else
$(error TARGET=$(TARGET): choose tpu or cpu)
endif
STAMP   := $(VENV)/.b2t-installed-$(TARGET)
BUILD_BINARY := $(VENV)/bin/build_binary

.PHONY: install demo demo-noise test test-all lint bench clean

install: $(STAMP) $(BUILD_BINARY)

# Re-runs only when pyproject.toml changes (or .venv is missing): idempotent and quick.
# The `spmd` extra (jax, torchax) is for XLA data-parallel runs; the suite tests them.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

# KenLM's build_binary, which `b2t-lm build -o lm.bin` runs: compiled from the pinned kenlm
# sdist's sources (g++ only, ~20 s of one core), once per .venv.
$(BUILD_BINARY): tools/build_kenlm_binary.sh | $(STAMP)
	bash tools/build_kenlm_binary.sh $(PY) $@

# End to end on an embedded synthetic dataset: HDF5 -> shards -> compiled training ->
# PER/WER on val -> competition CSV for test. Re-running resumes or skips finished work.
demo: install
	$(VENV)/bin/b2t-synth $(DEMO)/hdf5 --sessions 5 --seed 0 $(SYNTH_OPTS)
	$(VENV)/bin/b2t-preprocess $(DEMO)/hdf5 $(DEMO)/shards --config $(DEMO_CONFIG) --workers 2
	$(VENV)/bin/b2t-preprocess verify $(DEMO)/shards
	$(VENV)/bin/b2t-train $(DEMO)/shards $(DEMO)/run --config $(DEMO_CONFIG) --backend openxla \
		$(if $(wildcard $(DEMO)/run/last.safetensors),--resume)
	$(VENV)/bin/b2t-report $(DEMO)/run
	$(VENV)/bin/b2t-lm build $(DEMO)/hdf5/corpus.txt -o $(DEMO)/lm.bin
	$(VENV)/bin/b2t-eval $(DEMO)/run/best.safetensors $(DEMO)/shards --split val \
		--lexicon $(DEMO)/hdf5/lexicon.txt --lm $(DEMO)/lm.bin --out $(DEMO)/eval_val
	$(VENV)/bin/b2t-eval $(DEMO)/run/best.safetensors $(DEMO)/shards --split test \
		--lexicon $(DEMO)/hdf5/lexicon.txt --lm $(DEMO)/lm.bin --out $(DEMO)/eval_test --csv $(DEMO)/submission.csv

# The same job with the noise-separating family (configs/noise_tiny.yaml) on data with
# structured non-speech noise (a drifting rank-4 component per trial).
demo-noise:
	$(MAKE) demo DEMO=demo_noise_out DEMO_CONFIG=configs/noise_tiny.yaml SYNTH_OPTS="--structured-noise-rank 4"

lint: install
	$(VENV)/bin/ruff check b2t preprocess tests tools

# Test processes (pytest-xdist; a test file stays on one of them, so its fixtures are made
# once), each computing on one thread: most tests use one core, and more threads per process
# only contend (times: docs/testing.md). TEST_WORKERS=0 runs the suite in this process.
TEST_WORKERS ?= 2
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The default suite: every kind of test, the slow end-to-end twins left out (see README).
test: lint
	$(PYTEST)

# Everything, the `slow` tests included.
test-all: lint
	$(PYTEST) -m "slow or not slow"

# The figures of the README's Figures section (minutes on a 2-core machine).
bench: install
	mkdir -p $(BENCH)
	$(PY) tools/bench_data.py --workdir $(BENCH)/data | tee $(BENCH)/bench_data.txt
	$(PY) tools/bench_compile.py --out $(BENCH)/compile | tee $(BENCH)/bench_compile.txt
	$(PY) tools/bench_families.py --workdir $(BENCH)/families | tee $(BENCH)/bench_families.txt

clean:
	rm -rf $(DEMO) demo_noise_out $(BENCH) .pytest_cache .hypothesis
