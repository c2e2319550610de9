#!/usr/bin/env bash
# Run every fuzz target of the root package for FUZZTIME each (30s by
# default), one after the other. The targets are found by grepping
# `func FuzzX(` in the package's *_test.go files, so new ones are picked
# up without editing this script. Each target's checked-in seed corpus
# (testdata/fuzz/FuzzX/) runs first, as in a plain `go test`; a failing
# input found by the fuzzer is written there too, to be committed with
# the fix.
#
#   .ci/fuzz.sh                 # all targets, 30s each
#   FUZZTIME=5m .ci/fuzz.sh     # longer
#   .ci/fuzz.sh FuzzJobID       # only the named targets
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
fuzztime="${FUZZTIME:-30s}"

if [ $# -gt 0 ]; then
	targets="$*"
else
	targets=$(grep -ho '^func Fuzz[A-Za-z0-9_]*' ./*_test.go | sed 's/^func //' | sort -u)
fi
if [ -z "$targets" ]; then
	echo "no fuzz targets found" >&2
	exit 1
fi

status=0
for t in $targets; do
	printf '\n=== %s (%s)\n' "$t" "$fuzztime"
	if ! go test -run XXX -fuzz "^${t}\$" -fuzztime "$fuzztime" -fuzzminimizetime "${FUZZMINIMIZETIME:-5s}" .; then
		echo "--- FAIL: $t (the failing input is under testdata/fuzz/$t/)"
		status=1
	fi
done
exit $status
