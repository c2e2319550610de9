#!/usr/bin/env bash
# CI for examples/mcpserver: build the server, vet and test it (Go, with
# the race detector), then run the end-to-end test that drives the built
# binary with the official TypeScript MCP SDK client under node --test.
# Needs Go (the version in go.mod or a toolchain that can fetch it), a C
# compiler for -race, Node 20 or newer and npm with the registry reachable.
# Runs from any working directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

node_major=$(node -p 'process.versions.node.split(".")[0]')
if (( node_major < 20 )); then
	echo "mcpserver ci: Node 20 or newer is needed, found $(node --version)" >&2
	exit 1
fi

echo "== mcpserver: go build"
go build -o mcpserver .
echo "== mcpserver: go vet"
go vet ./...
echo "== mcpserver: go test -race"
go test -race -count=1 ./...
echo "== mcpserver: npm ci"
npm ci --no-audit --no-fund
echo "== mcpserver: node --test (TypeScript MCP SDK client, stdio)"
MCPSERVER_BIN="$PWD/mcpserver" node --test e2e/server.test.mjs
