# pfcxl — thin wrappers over the `pfcxl` CLI. Quick start: `make demo`, then `make test`.
# Every target that needs tools runs `setup` first; setup is idempotent and quick once done.
PYTHON ?= python3
VENV ?= .venv
T ?= pf-nic
export PFCXL_VENV := $(abspath $(VENV))
# Python may write its bytecode caches (__pycache__, ignored by git): with PYTHONDONTWRITEBYTECODE
# set, as some CI images do, every pfcxl process and test worker compiles the sources it imports
# again (about 0.13 of the 0.35 CPU-s a short pfcxl command costs, measured) and pytest rewrites
# every test module's asserts again in each worker
unexport PYTHONDONTWRITEBYTECODE
PFCXL := $(VENV)/bin/pfcxl
PYTEST := $(VENV)/bin/pytest

.PHONY: help setup setup-timed engines demo bench boot tables test test-unit test-kernels ci

help:
	@echo "make demo        boot the default appliance (pf-nic), compare what the guest found with the topology, run the quick benchmarks"
	@echo "make bench       the quick benchmark suite with the fabric models fed by the traced accesses"
	@echo "make test        the whole suite: unit, component and integration tests (these boot guests under TCG)"
	@echo "make test-unit   only the unit tests (tests/unit): pure Python, no process started (see tests/conftest.py)"
	@echo "make test-kernels KERNELS=default,latest,PATH  discovery, data and KV checks on each kernel (slow)"
	@echo "make boot T=...  boot a topology and attach to its console (Ctrl-] leaves)"
	@echo "make tables T=.. write the topology's CEDT, CDATs and generic-port/HMAT options to tables-T/"
	@echo "make setup       install QEMU 10, the guest kernel and tools, and the Python env (idempotent)"
	@echo "make setup-timed setup, and build the timed QEMU that --clock virtual boots (once; make test needs it)"
	@echo "make engines     .venv-engines: LMCache, SGLang, vLLM and a CPU torch for the engine plugins' tests"
	@echo "Then: $(PFCXL) --help"

setup:
	@$(PYTHON) -m pfcxl.host_tools.provision

# setup and the timed QEMU of --clock virtual (built once from Debian's source: ~25 min on 2 cores)
setup-timed:
	@$(PYTHON) -m pfcxl.host_tools.provision --timed-qemu
# the serving engines' own venv (pfcxl/engines/, docs/kvstore.md "Serving engines"): 3.7 GB, apart
# from the main venv; tests/component/test_engines.py runs the engines with its interpreter
engines: setup
	@$(PYTHON) -m pfcxl.host_tools.provision --engines

demo: setup
	$(PFCXL) demo --topology $(T)
	$(PFCXL) bench --topology $(T) --suite quick --timing trace

bench: setup
	$(PFCXL) bench --topology $(T) --suite quick --timing trace

boot: setup
	$(PFCXL) boot --topology $(T)

tables: setup
	$(PFCXL) tables $(T) --out tables-$(T)

# One pytest worker more than the machine has CPUs: a worker spends part of its time waiting (on a
# guest's console, a service, a child), and with one worker per CPU the suite kept the CPUs only
# ~88% busy (175% of 2 CPUs, measured over a whole run). Whole modules go to the next free worker,
# the modules that boot guests first (tests/conftest.py orders them): the last 5% of a run whose
# workers stole single tests took a third of its time, a few long tests running on alone.
JOBS ?= $(shell echo $$(( $$(nproc) + 1 )))

test: setup-timed engines
	$(PYTEST) -n $(JOBS) --dist loadfile --durations=30 tests

# tests/unit holds the unit tests alone (tests/unit/test_markers.py), so only they are collected
test-unit: setup
	$(PYTEST) tests/unit

# the kernel matrix: default = setup's 6.12, latest or a version = a Debian kernel package,
# a path = a build tree or FILE:MODULES_DIR (tests/integration/test_kernel_matrix.py)
KERNELS ?= default,latest
test-kernels: setup
	$(PYTEST) -p no:xdist --durations=0 tests/integration/test_kernel_matrix.py --kernels $(KERNELS)

ci: test
