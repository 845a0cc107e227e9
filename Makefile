# Benchmarks (see docs/benchmarks.md): side-by-side comparisons, reported as ratios.
PYTHON ?= $(if $(wildcard .venv/bin/python),.venv/bin/python,python)

.PHONY: bench bench-quick bench-gpu

bench:  ## the full suite, into bench/results/suite.md
	PYTHONPATH=$(CURDIR) $(PYTHON) -m bench

bench-quick:  ## every benchmark at smoke sizes, into bench/.cache/suite-quick.md
	PYTHONPATH=$(CURDIR) $(PYTHON) -m bench --quick

bench-gpu:  ## the accelerator suite on a GPU, into bench/results/gpu-<device name>.md
	PYTHONPATH=$(CURDIR) $(PYTHON) -m bench --device cuda
