package fleet

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// cluster is a JetStream cluster of embedded NATS servers on loopback.
type cluster struct {
	servers []*server.Server
	urls    []string
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startCluster starts n servers, each with JetStream, routed to each
// other, and waits until JetStream has a meta leader.
func startCluster(n int, dir string) (*cluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var routes []*url.URL
	for i := range n {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", ports[n+i])})
	}
	c := &cluster{}
	for i := range n {
		o := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       ports[i],
			NoSigs:     true,
			NoLog:      true,
			JetStream:  true,
			StoreDir:   fmt.Sprintf("%s/n%d", dir, i+1),
			Cluster: server.ClusterOpts{
				Name: "bgjob-test",
				Host: "127.0.0.1",
				Port: ports[n+i],
			},
			Routes:                 routes,
			JetStreamMaxMemory:     256 << 20,
			JetStreamMaxStore:      2 << 30,
			DisableJetStreamBanner: true,
		}
		s, err := server.NewServer(o)
		if err != nil {
			c.shutdown()
			return nil, err
		}
		go s.Start() // the server's own goroutines; shutdown ends them
		c.servers = append(c.servers, s)
		c.urls = append(c.urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	for _, s := range c.servers {
		if !s.ReadyForConnections(20 * time.Second) {
			c.shutdown()
			return nil, fmt.Errorf("server %s not ready", s.Name())
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		current, leader := 0, false
		for _, s := range c.servers {
			if s.JetStreamIsCurrent() {
				current++
			}
			leader = leader || s.JetStreamIsLeader()
		}
		if current == n && leader {
			break
		}
		if time.Now().After(deadline) {
			c.shutdown()
			return nil, fmt.Errorf("no JetStream meta leader after 30s")
		}
		time.Sleep(50 * time.Millisecond) // the server offers no event for its meta leader's election
	}
	return c, nil
}

func (c *cluster) shutdown() {
	for _, s := range c.servers {
		s.Shutdown()
	}
	for _, s := range c.servers {
		s.WaitForShutdown()
	}
}

// all is every server's URL, for a connection that survives one of them.
func (c *cluster) all() string { return strings.Join(c.urls, ",") }

// connect connects to url (one server, or a list) and closes the
// connection when the test ends.
func connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.Timeout(5 * time.Second)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}
