#!/usr/bin/env bash
# Run bgjob's tests as a Windows program under Wine.
#
# Installs Debian's wine and the mingw-w64 cross compiler when they are
# missing, makes a fresh Wine prefix under /tmp, builds the
# bcryptprimitives.dll shim that Go 1.22+ needs on Wine 8.0 (see
# .ci/wine/bcryptprimitives.c), cross-compiles the package's test binary
# for windows/amd64 and runs it with -test.v. It exits non-zero when a
# test fails. Extra arguments go to the test binary (e.g. -test.run=Tree).
#
# Idempotent and non-interactive; needs root (or sudo-less apt) only when
# something must be installed.
set -euo pipefail

cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
export WINEDEBUG=-all
# No Mono or Gecko prompts: the tests need neither.
export WINEDLLOVERRIDES="mscoree,mshtml="

need=()
command -v wine >/dev/null 2>&1 || need+=(wine wine64)
command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1 || need+=(gcc-mingw-w64-x86-64)
if [ ${#need[@]} -gt 0 ]; then
	echo "wine.sh: installing ${need[*]}"
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

work=$(mktemp -d /tmp/bgjob-wine.XXXXXX)
export WINEPREFIX="$work/prefix"
cleanup() {
	# Stop this prefix's wineserver (and so its processes), then drop
	# the prefix.
	WINEPREFIX="$WINEPREFIX" wineserver -k >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

echo "wine.sh: $(wine --version 2>/dev/null), prefix $WINEPREFIX"
wineboot -i >/dev/null 2>&1 || true
wineserver -w

x86_64-w64-mingw32-gcc -O2 -shared -s -o "$work/bcryptprimitives.dll" \
	.ci/wine/bcryptprimitives.c .ci/wine/bcryptprimitives.def -ladvapi32
cp "$work/bcryptprimitives.dll" "$WINEPREFIX/drive_c/windows/system32/"

GOOS=windows GOARCH=amd64 go vet ./...
GOOS=windows GOARCH=amd64 go test -c -o "$work/bgjob.test.exe" .

# The test binary is its own child (TestHelperProcess); Wine maps the
# Unix path to Z:\..., which is what os.Args[0] then holds.
#
# run NAME CMD...: run the test binary, fail unless it passed.
run() {
	local name=$1 rc
	shift
	echo "wine.sh: $name"
	set +e
	"$@" 2>&1 | tr -d '\r' | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g' | tee "$work/out.txt"
	rc=${PIPESTATUS[0]}
	set -e
	if [ "$rc" -ne 0 ] || grep -q -- '--- FAIL' "$work/out.txt" || ! grep -q '^PASS$' "$work/out.txt"; then
		echo "wine.sh: $name: tests failed (exit $rc)"
		exit 1
	fi
}

# Without a console, as under a service or CI: each job gets a hidden
# console of its own (and a conhost.exe in its Job Object).
run "host without a console" wine "$work/bgjob.test.exe" -test.v -test.timeout=10m "$@" </dev/null

# With a console (a pseudo-terminal from script(1)): jobs share the
# host's console, the case of a CLI run from a terminal.
if command -v script >/dev/null 2>&1 && [ $# -eq 0 ]; then
	run "host with a console" script -qec \
		"wine '$work/bgjob.test.exe' -test.v -test.timeout=10m -test.run='Windows|Job|Leftover|Await|Reader'" /dev/null </dev/null
fi
echo "wine.sh: tests passed"
