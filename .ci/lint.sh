#!/usr/bin/env bash
# Lint stage: ruff (lint and format check) over the package, the verification package, the
# tests, the development tools (tools/) and the examples, with the configuration in
# pyproject.toml ([tool.ruff]). Installs ruff in its own venv, the same version as
# .pre-commit-config.yaml. Exit status: 0 clean, 1 findings.
#
#   .ci/lint.sh                 # what CI runs
#   LINT_VENV=/tmp/ruff .ci/lint.sh   # reuse a venv between runs
#
# To fix findings locally: ruff check --fix PATHS; ruff format PATHS (or `pre-commit run -a`).
set -uo pipefail
cd "$(dirname "$0")/.."
RUFF_VERSION=0.17.6
PATHS=(alpha_mpi alpha_mpi_verify tests tools examples benchmarks)
VENV=${LINT_VENV:-$(mktemp -d)/ruff}
if [ ! -x "$VENV/bin/ruff" ] || [ "$("$VENV/bin/ruff" --version)" != "ruff $RUFF_VERSION" ]; then
  python3 -m venv "$VENV" && "$VENV/bin/python" -m pip install -q --disable-pip-version-check "ruff==$RUFF_VERSION" \
    || { echo "!! could not install ruff $RUFF_VERSION"; exit 1; }
fi
status=0
echo "== ruff check ${PATHS[*]}"
"$VENV/bin/ruff" check "${PATHS[@]}" || status=1
echo "== ruff format --check ${PATHS[*]}"
"$VENV/bin/ruff" format --check "${PATHS[@]}" || status=1
echo "== lint $( [ $status = 0 ] && echo passed || echo FAILED )"
exit $status
