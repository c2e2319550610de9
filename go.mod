module github.com/bgjob/bgjob

go 1.24.0

require (
	github.com/zeebo/blake3 v0.2.4
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.41.0
)

require github.com/klauspost/cpuid/v2 v2.0.12 // indirect
