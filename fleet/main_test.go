package fleet

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"go.uber.org/goleak"
)

// testCluster is the 3-node cluster the tests share; each test uses a
// Layout.Prefix of its own.
var testCluster *cluster

// natsURL is the test cluster's servers, comma-separated, for the
// examples (package fleet_test, through NATSURL in export_test.go).
var natsURL string

func TestMain(m *testing.M) {
	if os.Getenv("BGJOB_FLEET_CHILD") == "worker" {
		childWorker()
		return
	}
	dir, err := os.MkdirTemp("", "bgjob-fleet-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testCluster, err = startCluster(3, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start cluster:", err)
		os.Exit(1)
	}
	natsURL = testCluster.all()
	code := m.Run()
	testCluster.shutdown()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// childWorker is the test binary run as a worker process (the helper
// process of os/exec's tests): it serves a Registry to the fleet named by
// its environment, says "ready" on stdout, and runs until it is killed.
func childWorker() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child worker:", err)
		os.Exit(2)
	}
	nc, err := natsConnect(os.Getenv("BGJOB_FLEET_URL"))
	if err != nil {
		fail(err)
	}
	reg, err := bgjob.New(bgjob.Config{})
	if err != nil {
		fail(err)
	}
	cfg := WorkerConfig{
		Layout:    Layout{Prefix: os.Getenv("BGJOB_FLEET_PREFIX"), Pool: os.Getenv("BGJOB_FLEET_POOL"), Replicas: 3, OutputBytes: 16 << 20},
		Name:      os.Getenv("BGJOB_FLEET_NAME"),
		Heartbeat: 250 * time.Millisecond, HeartbeatTTL: time.Second, AckWait: 2 * time.Second,
	}
	if os.Getenv("BGJOB_FLEET_DIE_AFTER_CLAIM") != "" {
		cfg.afterClaim = func() {
			p, _ := os.FindProcess(os.Getpid())
			p.Kill() // SIGKILL: the claim is written, the job never starts
		}
	}
	w, err := NewWorker(nc, reg, cfg)
	if err != nil {
		fail(err)
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready", w.Name())
	out.Flush()
	<-context.Background().Done() // until SIGKILL
}
