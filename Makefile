# Two entry points: `make demo` and `make test`. Both install into .venv first when needed.
# TARGET=tpu (the default on a host with a TPU) also installs the TPU runtime (the `tpu`
# extra: torch_xla[tpu], which pins libtpu) and runs on PJRT_DEVICE=TPU; TARGET=cpu installs
# libtpu only as the TPU compiler for `b2t-plan --target` (the `tpu-compile` extra).
VENV    ?= .venv
PY      := $(VENV)/bin/python
DEMO    ?= demo_out
DEMO_CONFIG ?= configs/tiny.yaml
# The demo's data: b2t-synth's realistic preset (low SNR, coarticulation, drift across days,
# non-speech), so its PER and WER fall the way a real run's do (docs/benchmarks.md).
DEMO_DATA   ?= --preset realistic
DEMO_STEPS  ?= 300
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

# $(call current,OUT,INPUTS): a shell test, true when OUT exists and is newer than every INPUT.
current = test -e $(1) $(foreach i,$(2),-a $(1) -nt $(i))
# $(call unless_current,OUT,INPUTS,COMMAND): print and run COMMAND, unless OUT is current.
unless_current = if $(call current,$(1),$(2)); then echo "$(1) is up to date: skipped"; else echo "$(3)"; $(3); fi
BIN         = $(VENV)/bin
DEMO_RUN    = $(DEMO)/run
DEMO_WORDS  = --lexicon $(DEMO)/hdf5/lexicon.txt --lm $(DEMO)/lm.bin
DEMO_INPUTS = $(DEMO_RUN)/best.safetensors $(DEMO)/shards/manifest.json $(DEMO)/lm.bin $(DEMO)/hdf5/lexicon.txt
DEMO_VERIFY = $(BIN)/b2t-preprocess verify $(DEMO)/shards && touch $(DEMO)/verified
DEMO_LM     = $(BIN)/b2t-lm build $(DEMO)/hdf5/corpus.txt -o $(DEMO)/lm.bin
DEMO_VAL    = $(BIN)/b2t-eval $(DEMO_RUN)/best.safetensors $(DEMO)/shards --split val $(DEMO_WORDS) --out $(DEMO)/eval_val
DEMO_TEST   = $(BIN)/b2t-eval $(DEMO_RUN)/best.safetensors $(DEMO)/shards --split test $(DEMO_WORDS) \
              --out $(DEMO)/eval_test --csv $(DEMO)/submission.csv
DEMO_REPORT = $(BIN)/b2t-report $(DEMO_RUN) --eval $(DEMO)/eval_val
DEMO_SETS   = --set train.steps=$(DEMO_STEPS) --set optim.decay_steps=$(DEMO_STEPS) --set train.val_every=50
RESUME      = $(if $(wildcard $(DEMO_RUN)/last.safetensors),--resume)

# End to end on an embedded synthetic dataset: HDF5 -> shards -> compiled training ->
# PER/WER on val -> competition CSV for test -> the report. A re-run skips finished work:
# b2t-synth, b2t-preprocess and a finished b2t-train check and stop at once; each other
# step runs only when its output is missing or older than its inputs.
demo: install
	$(BIN)/b2t-synth $(DEMO)/hdf5 --sessions 5 --seed 0 $(DEMO_DATA) $(SYNTH_OPTS)
	$(BIN)/b2t-preprocess $(DEMO)/hdf5 $(DEMO)/shards --config $(DEMO_CONFIG) --workers 2
	@$(call unless_current,$(DEMO)/verified,$(DEMO)/shards/manifest.json,$(DEMO_VERIFY))
	$(BIN)/b2t-train $(DEMO)/shards $(DEMO_RUN) --config $(DEMO_CONFIG) --backend openxla $(DEMO_SETS) $(RESUME)
	@$(call unless_current,$(DEMO)/lm.bin,$(DEMO)/hdf5/corpus.txt,$(DEMO_LM))
	@$(call unless_current,$(DEMO)/eval_val/summary.json,$(DEMO_INPUTS),$(DEMO_VAL))
	@$(call unless_current,$(DEMO)/submission.csv,$(DEMO_INPUTS),$(DEMO_TEST))
	@$(call unless_current,$(DEMO_RUN)/report.png,$(DEMO_RUN)/metrics.jsonl $(DEMO)/eval_val/summary.json,$(DEMO_REPORT))

# The same job with the noise-separating family (configs/noise_tiny.yaml): the realistic
# data's structured non-speech component (rank 4) is what it separates.
demo-noise:
	$(MAKE) demo DEMO=demo_noise_out DEMO_CONFIG=configs/noise_tiny.yaml

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

# The figures of docs/benchmarks.md that these scripts print (minutes on a 2-core machine).
bench: install
	mkdir -p $(BENCH)
	$(PY) tools/bench_data.py --workdir $(BENCH)/data | tee $(BENCH)/bench_data.txt
	$(PY) tools/bench_compile.py --out $(BENCH)/compile | tee $(BENCH)/bench_compile.txt
	$(PY) tools/bench_families.py --workdir $(BENCH)/families | tee $(BENCH)/bench_families.txt

clean:
	rm -rf $(DEMO) demo_noise_out $(BENCH) .pytest_cache .hypothesis
