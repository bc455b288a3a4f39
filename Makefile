# txlearn: the two commands a user needs are `make lab` and `make test`.
# The interpreter: `make lab PYTHON=python3.12` chooses one; left empty, tools/install.sh takes the
# newest python3.X (3.14 down to 3.10) on PATH that runs, else python3 if it is in range.
PYTHON ?=
VENV := .venv
PY := $(VENV)/bin/python
WORK := work
# pytest workers: both cores; loadscope keeps each notebook on one worker (nbval needs that).
PYTEST_WORKERS ?= 2
# The test files that take longest, longest first (measured on 2 cores).
LONGEST_TESTS := notebooks/10_decoder.ipynb tests/test_checks_catalogue.py tests/test_pipeline.py \
	tests/test_book.py exercises/solutions/10_decoder.ipynb notebooks/09_capstone.ipynb \
	tests/test_grading_attacks.py exercises/solutions/09_capstone.ipynb tests/test_gradescope.py \
	notebooks/04_positional.ipynb notebooks/08_complexity.ipynb tests/test_forkserver.py
# The capstone's training budget (seconds) under `make test`; `make course` runs the full default.
TEST_TRAIN_SECONDS ?= 8
# Debian packages the tests need (the book's browser test drives Chromium; the grader's tests
# sandbox submissions with bubblewrap). `make test` installs the missing ones when run as root;
# otherwise it stops and prints the command. `make lab` never installs them.
DEBIAN_TEST_PACKAGES := chromium bubblewrap

.PHONY: lab test book course venv venv-lab work build clean-venv help debian-test-packages

help:
	@echo "make lab     set up .venv, copy your exercise notebooks into $(WORK)/, open JupyterLab"
	@echo "make test    set up .venv and run every test, lesson and exercise check"
	@echo "make book    execute every lesson at full budget into an offline HTML book, build/book/"
	@echo "             (open build/book/index.html; the folder works offline and from a zip)"
	@echo "make course  the same as make book"

# The learner's install (`make lab`): the venv, PyTorch (a CPU-only build where one can be had),
# the package and its runtime dependencies, lesson 10's model; nothing the tests alone need.
# tools/install.sh keeps a venv of any supported Python and does nothing when nothing changed.
venv-lab:
	@sh tools/install.sh $(VENV) "$(PYTHON)"

# A contributor's venv (`make test`): the same, then the tests' own packages (pyproject's `test`
# extra).
venv:
	@sh tools/install.sh --test $(VENV) "$(PYTHON)"

# Copy new student notebooks into the learner's working folder and add exercises that are new in
# the course to their copies; existing answers are never changed (a backup is kept in .backups/).
work: venv-lab
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

test: venv debian-test-packages
	$(VENV)/bin/txlearn build --check
	@# One torch thread per worker: two workers on two cores, without oversubscription.
	@# The longest files are named first (a path given twice is collected once), so that the
	@# workers start on them and no long file is left running alone at the end.
	TXLEARN_TRAIN_SECONDS=$(TEST_TRAIN_SECONDS) HF_HUB_OFFLINE=1 MPLBACKEND=Agg OMP_NUM_THREADS=1 \
		$(VENV)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope --nbval-lax \
		--nbval-current-env --nbval-cell-timeout=600 --durations=30 $(LONGEST_TESTS) tests \
		notebooks exercises/solutions

# The capstone's training budget is never shortened here: only `make test` does that.
book: venv-lab
	env -u TXLEARN_TRAIN_SECONDS HF_HUB_OFFLINE=1 $(VENV)/bin/txlearn book build/book

course: book

clean-venv:
	rm -rf $(VENV)
