#!/bin/sh
# The whole test suite: lint, types, import layers, then unit, integration and e2e tests
# (the last two against the real runsc, real SQLite/PostgreSQL and real HTTP).
set -eu
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || sh scripts/install.sh
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/pytest "$@"
