module github.com/bgjob/bgjob/bench

go 1.24.0

require github.com/bgjob/bgjob v0.0.0

require (
	github.com/go-cmd/cmd v1.4.4
	github.com/klauspost/cpuid/v2 v2.0.12 // indirect
	github.com/zeebo/blake3 v0.2.4 // indirect
	golang.org/x/sys v0.41.0
)

replace github.com/bgjob/bgjob => ..
