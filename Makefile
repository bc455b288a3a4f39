# txlearn: the two commands a user needs are `make lab` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.txlearn-installed
WORK := work
TORCH_CPU := torch==2.13.0
# pytest workers: both cores; loadscope keeps each notebook on one worker (nbval needs that).
PYTEST_WORKERS ?= 2
# The capstone's training budget (seconds) under `make test`; `make course` runs the full default.
TEST_TRAIN_SECONDS ?= 8
# Debian packages the tests need (bubblewrap: the sandbox of `txlearn grade`). `make test` installs
# the missing ones with apt-get when run as root, else stops with the command to run; `make lab`
# never installs them.
DEBIAN_TEST_PACKAGES := bubblewrap

.PHONY: lab test course venv work build clean-venv help test-packages

help:
	@echo "make lab     set up .venv, copy your exercise notebooks into $(WORK)/, open JupyterLab"
	@echo "make test    set up .venv and run every test, lesson and exercise check"
	@echo "make course  execute every lesson at full budget into build/course/*.html"

# Recreate the venv when it is missing or not Python 3.11 (stale); reinstall when pyproject changes.
$(STAMP): pyproject.toml
	@if [ -x $(PY) ] && ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then \
		echo "$(VENV) is stale (not Python 3.11): recreating"; rm -rf $(VENV); fi
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	@# The local CPU wheel, where this machine has one, before anything can pull a CUDA build.
	$(PY) -m pip install --quiet $(TORCH_CPU) || echo "no local $(TORCH_CPU) wheel: pip will choose torch"
	$(PY) -m pip install --quiet -e .
	@touch $(STAMP)

venv: $(STAMP)

# Copy new student notebooks into the learner's working folder and add exercises that are new in
# the course to their copies; existing answers are never changed (a backup is kept in .backups/).
work: $(STAMP)
	$(VENV)/bin/txlearn update-work $(WORK)

# The server's root is the repository (lessons in notebooks/, answers in work/), opened at lesson
# 00. JupyterLab refuses to run as root unless told; containers often are root.
lab: work
	$(VENV)/bin/jupyter lab $$([ "$$(id -u)" = 0 ] && echo --allow-root) \
		--ServerApp.root_dir="$(CURDIR)" \
		--LabApp.default_url="/lab/tree/$$(ls notebooks/00_*.ipynb | head -n 1)" $(LAB_ARGS)

test-packages:
	@missing=""; for p in $(DEBIAN_TEST_PACKAGES); do \
		dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing the Debian packages the tests need:$$missing"; \
			apt-get update -q && apt-get install -y -q $$missing; \
		else \
			echo "make test needs the Debian packages:$$missing"; \
			echo "install them with: sudo apt-get update && sudo apt-get install -y$$missing"; \
			exit 1; \
		fi; \
	fi

test: $(STAMP) test-packages
	$(VENV)/bin/txlearn build --check
	@# One torch thread per worker: two workers on two cores, without oversubscription.
	TXLEARN_TRAIN_SECONDS=$(TEST_TRAIN_SECONDS) HF_HUB_OFFLINE=1 MPLBACKEND=Agg OMP_NUM_THREADS=1 \
		$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --nbval-lax \
		--nbval-current-env --nbval-cell-timeout=600 --durations=15 tests notebooks \
		exercises/solutions

course: $(STAMP)
	@mkdir -p build/course
	HF_HUB_OFFLINE=1 $(VENV)/bin/jupyter nbconvert --to html --execute \
		--ExecutePreprocessor.timeout=1200 --output-dir build/course notebooks/*.ipynb

clean-venv:
	rm -rf $(VENV)
