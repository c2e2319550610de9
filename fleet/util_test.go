package fleet

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/nats-io/nats.go"
)

// testLogger is the workers' and clients' Logger in tests: their
// warnings on stderr when BGJOB_FLEET_LOG is set, else nil.
func testLogger() *slog.Logger {
	if os.Getenv("BGJOB_FLEET_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

func natsConnect(url string) (*nats.Conn, error) {
	return nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
}

// testLayout is a Layout of the shared cluster for one test.
func testLayout(t testing.TB, pool string) Layout {
	return Layout{Prefix: "t" + nonce()[:10], Pool: pool, Replicas: 3, OutputBytes: 16 << 20}
}

// newWorker starts a worker with a Registry of its own on a connection to
// url; both are closed when the test ends.
func newWorker(t testing.TB, url string, l Layout, slots int, cfg bgjob.Config) (*Worker, *bgjob.Registry) {
	t.Helper()
	// Every test worker carries its matches to the fleet, unless the
	// test hooks OnMatch itself.
	var feed *MatchFeed
	if cfg.OnMatch == nil {
		feed = new(MatchFeed)
		cfg.OnMatch = feed.OnMatch
	}
	reg, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t, url)
	w, err := NewWorker(nc, reg, WorkerConfig{Layout: l, Slots: slots, Heartbeat: 250 * time.Millisecond, HeartbeatTTL: 5 * time.Second, AckWait: 2 * time.Second, Logger: testLogger(), Matches: feed})
	if err != nil {
		reg.Close(context.Background())
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.Close(ctx); err != nil {
			t.Errorf("worker close: %v", err)
		}
		reg.Close(ctx)
	})
	return w, reg
}

// newClient starts a client on a connection to url, closed when the test ends.
func newClient(t testing.TB, url string, cfg ClientConfig) *Client {
	t.Helper()
	nc := connect(t, url)
	if cfg.Logger == nil {
		cfg.Logger = testLogger()
	}
	c, err := NewClient(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func deadline(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func dontRandomize() nats.Option { return nats.DontRandomize() }
