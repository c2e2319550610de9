//go:build !linux

// The bench measures Linux only (see main.go): elsewhere it says so, so
// that the module builds and vets on every system.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bench: Linux only")
	os.Exit(2)
}
