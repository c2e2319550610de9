//go:build !linux

// Command bench is Linux only: it reads the kernel's process events
// connector, /proc and rusage, and runs jobs on pseudo-terminals opened
// as bgjob opens them on Linux.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bench: Linux only")
	os.Exit(2)
}
