package bgjob_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

const guardHostEnv = "BGJOB_TEST_GUARD_HOST"

// TestGuardHost is the host process of TestHostDeathStopsJobs: it starts
// jobs with grandchildren (some of them escaping with setsid), says
// "ready" and then dies as the parent asks: it is SIGKILLed or SIGTERMed,
// or returns from main without Close.
func TestGuardHost(t *testing.T) {
	env := os.Getenv(guardHostEnv) // "CGROUP TOKEN HOW"
	if env == "" {
		t.Skip("run by TestHostDeathStopsJobs")
	}
	f := strings.Fields(env)
	cgroup, token, how := f[0], f[1], f[2]
	if cgroup == "default" {
		cgroup = ""
	}
	r, err := bgjob.New(bgjob.Config{Cgroup: cgroup, KillGrace: 300 * time.Millisecond})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	h := markedSleeper(token)
	for _, cmd := range []string{
		h + " & " + h + " & wait",
		"setsid " + h + " & " + h,
		"( trap '' TERM; " + h + " ) & " + h, // a grandchild that ignores SIGTERM
	} {
		if _, err := r.Start(context.Background(), bgjob.Spec{Command: cmd, Env: helperEnv}); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
	}
	fmt.Println("ready")
	if how == "exit" {
		os.Exit(0) // no Close
	}
	select {} // until a signal
}

// However its host dies, a job does not outlive it (outside durable mode):
// the registry's guard stops every process of its jobs.
func TestHostDeathStopsJobs(t *testing.T) {
	modes := []string{"off"}
	if cgroupsHere(t) {
		modes = append(modes, "default")
	}
	for _, mode := range modes {
		for _, how := range []string{"sigkill", "sigterm", "exit"} {
			t.Run(mode+"/"+how, func(t *testing.T) {
				token := newToken(t)
				host := exec.Command(os.Args[0], "-test.run=^TestGuardHost$", "-test.count=1")
				host.Env = append(os.Environ(), guardHostEnv+"="+mode+" "+token+" "+how)
				host.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
				out, _ := host.StdoutPipe()
				if err := host.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					for _, pid := range marked(token) {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				})
				sc := bufio.NewScanner(out)
				for sc.Scan() && sc.Text() != "ready" {
					if strings.HasPrefix(sc.Text(), "error") {
						t.Fatal(sc.Text())
					}
				}
				awaitMarked(t, token, 6)
				switch how {
				case "sigkill":
					host.Process.Kill()
				case "sigterm":
					host.Process.Signal(syscall.SIGTERM)
				}
				host.Wait()
				// The guard stops them: SIGTERM, then SIGKILL after the
				// grace for the one that ignores it.
				for end := time.Now().Add(deadline); len(marked(token)) > 0; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(end) {
						t.Fatalf("processes %v of the dead host's jobs still run", marked(token))
					}
				}
			})
		}
	}
}
