#!/usr/bin/env bash
# Rebuilds testdata/redact/clean/ from real command output on a
# development machine: nothing here is written by hand. Each file is cut
# at a size so that the corpus stays small (about 2 MiB). The output
# depends on the machine (module cache, git history), so a rebuild is a
# new corpus: commit it with the figures it gives.
#
#   bash testdata/redact/make-clean.sh /path/to/git/repo ...
#
# It needs: git, go, openssl, ssh-keygen, npm (for a lockfile only).
set -eu # no pipefail: head closes pipes early
out="$(cd "$(dirname "$0")" && pwd)/clean"
root="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$out"
cap() { head -c "$1"; } # keep the first N bytes

# git: logs with stats and diffs of Go code, as an agent reads them.
{
	for repo in "$@"; do
		git -C "$repo" log --stat --no-color -n 400
	done
} | cap 450000 >"$out/git-log.txt"
git -C "$root" log -p --no-color -n 60 -- registry.go supervise.go output.go retention.go job.go coalesce.go |
	cap 250000 >"$out/git-diff.txt"

# go: module lists and sums, a verbose test run, a build with -x.
find "$(go env GOMODCACHE)" -maxdepth 4 -name go.sum | sort | head -40 | xargs cat | cap 200000 >"$out/go-sum.txt"
(cd "$root" && go list -m -json all 2>/dev/null; go version -m "$(command -v go)") | cap 60000 >"$out/go-list.txt"
(cd "$(go env GOROOT)/src" && go test -v -count=1 encoding/base64 encoding/hex crypto/sha256 net/url mime 2>&1) |
	cap 150000 >"$out/go-test.txt"
(cd "$root" && go build -a -x -o /dev/null . 2>&1) | cap 150000 >"$out/go-build.txt"

# npm: a lockfile with integrity hashes and resolved URLs.
tmp=$(mktemp -d)
(cd "$tmp" && npm init -y >/dev/null && npm install --package-lock-only --ignore-scripts --no-audit --no-fund \
	express@4 typescript@5 eslint@8 jest@29 webpack@5 >/dev/null 2>&1 && cat package-lock.json) | cap 250000 >"$out/package-lock.json"
rm -rf "$tmp"

cat "$root/examples/mcpserver/package-lock.json" >>"$out/package-lock.json" 2>/dev/null || true

# packages installed on the machine, as dpkg lists them.
dpkg -l | cap 120000 >"$out/dpkg.txt"

# hashes, identifiers and certificates.
{
	find /usr/bin -maxdepth 1 -type f | sort | head -150 | xargs sha256sum
	find /usr/bin -maxdepth 1 -type f | sort | head -100 | xargs sha1sum
	find /usr/bin -maxdepth 1 -type f | sort | head -100 | xargs md5sum
	for i in $(seq 200); do cat /proc/sys/kernel/random/uuid; done
	for f in /etc/ssh/ssh_host_*_key.pub; do ssh-keygen -lf "$f"; ssh-keygen -E md5 -lf "$f"; done 2>/dev/null || true
} >"$out/hashes.txt"
{
	for f in $(ls /etc/ssl/certs/*.pem | sort | head -30); do
		openssl x509 -in "$f" -text
	done
} | cap 250000 >"$out/certs.txt"

# code as `cat` shows it: the standard library's HTTP auth and URL code.
src="$(go env GOROOT)/src"
cat "$src/net/url/url.go" "$src/net/http/request.go" "$src/net/http/client.go" "$src/net/smtp/auth.go" |
	cap 250000 >"$out/go-source.txt"
