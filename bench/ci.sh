#!/usr/bin/env bash
# CI entry point of the benchmark module: vet it, then run the quick
# benchmark. Targets missed print FAIL rows but do not fail CI (that needs
# -strict); a benchmark that cannot run does.
set -euo pipefail
cd "$(dirname "$0")"
go vet ./...
go run . -quick
