package bgjob_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The test binary doubles as the jobs' child process (the helper-process
// pattern of os/exec's tests): with BGJOB_TEST_HELPER=1 in its
// environment, TestMain runs one of the helper modes below instead of the
// tests.
func TestMain(m *testing.M) {
	if os.Getenv("BGJOB_TEST_HELPER") == "1" {
		os.Exit(helper(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// helperEnv is the Spec.Env that makes the test binary act as a helper.
var helperEnv = map[string]string{"BGJOB_TEST_HELPER": "1"}

func helper(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "helper: no mode")
		return 2
	}
	arg := func(i int) int {
		n, err := strconv.Atoi(args[i])
		if err != nil {
			panic(err)
		}
		return n
	}
	switch args[0] {
	case "exit": // exit CODE
		return arg(1)
	case "echo": // echo WORDS...: to stdout, then the same to stderr with "err:"
		fmt.Println(strings.Join(args[1:], " "))
		fmt.Fprintln(os.Stderr, "err:"+strings.Join(args[1:], " "))
		return 0
	case "lines": // lines N MS: N lines, one every MS milliseconds
		for i := range arg(1) {
			fmt.Printf("line %d\n", i)
			time.Sleep(time.Duration(arg(2)) * time.Millisecond)
		}
		return 0
	case "pattern": // pattern N: N bytes of the test pattern, in odd-sized writes
		w := bufio.NewWriterSize(os.Stdout, 1<<16)
		buf := make([]byte, 7919)
		for off, n := int64(0), int64(arg(1)); off < n; {
			k := min(int64(len(buf)), n-off)
			for i := range k {
				buf[i] = patternByte(off + i)
			}
			w.Write(buf[:k])
			off += k
		}
		w.Flush()
		return 0
	case "dribble": // dribble MS TEXT: TEXT one byte per write, MS milliseconds apart
		for i := 0; i < len(args[2]); i++ {
			os.Stdout.Write([]byte{args[2][i]})
			time.Sleep(time.Duration(arg(1)) * time.Millisecond)
		}
		return 0
	case "cat": // cat: stdin to stdout
		io.Copy(os.Stdout, os.Stdin)
		return 0
	case "ignoreterm": // ignoreterm: ignore SIGTERM, say so, wait forever
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ready")
		select {}
	case "noteterm": // noteterm: say "ready", then "term" at each SIGTERM, which it survives; wait forever
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		fmt.Println("ready")
		for range c {
			fmt.Println("term")
		}
		return 0
	case "openfiles": // openfiles N: open /dev/null N times, keeping each; on failure say why and exit 1
		var files []*os.File
		for range arg(1) {
			f, err := os.Open(os.DevNull)
			if err != nil {
				fmt.Fprintln(os.Stderr, "openfiles:", err)
				return 1
			}
			files = append(files, f)
		}
		fmt.Println("opened", len(files))
		return 0
	case "spin": // spin MS: use MS milliseconds of user CPU time, then exit
		want := time.Duration(arg(1)) * time.Millisecond
		for {
			if selfUserCPU() >= want {
				return 0
			}
			for i := 0; i < 1_000_000; i++ {
				spinSink += i
			}
		}
	case "hold": // hold: say "holding", then wait forever (SIGINT's default action ends it)
		fmt.Println("holding")
		select {}
	case "sleep": // sleep MS
		time.Sleep(time.Duration(arg(1)) * time.Millisecond)
		return 0
	case "spawn": // spawn MODE ARGS...: start a child helper holding our stdout, print its PID, exit
		c := exec.Command(os.Args[0], args[1:]...)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("child %d\n", c.Process.Pid)
		return 0
	case "tree": // tree N: a chain of N helpers, each the parent of the next; each says "pid P ppid Q", the last "ready"; wait forever
		fmt.Printf("pid %d ppid %d\n", os.Getpid(), os.Getppid())
		if n := arg(1); n > 1 {
			c := exec.Command(os.Args[0], "tree", strconv.Itoa(n-1))
			c.Stdout, c.Stderr = os.Stdout, os.Stderr
			if err := c.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			c.Wait()
			return 0
		}
		fmt.Println("ready")
		select {}
	}
	if h := extraHelpers[args[0]]; h != nil {
		return h(args[1:])
	}
	fmt.Fprintln(os.Stderr, "helper: unknown mode", args[0])
	return 2
}

// extraHelpers holds the helper modes that only some systems build (see
// the _linux_test.go files), by name.
var extraHelpers = map[string]func(args []string) int{}

// patternByte is byte i of the "pattern" helper's output: it differs for
// nearby offsets, so a byte served at the wrong offset shows.
// spinSink keeps the spin helper's loop from being optimised away.
var spinSink int

func patternByte(i int64) byte {
	return byte('a' + (i*7+i/26)%26)
}

// deadline bounds every wait in the tests.
const deadline = 30 * time.Second
