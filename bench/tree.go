//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/bgjob/bgjob"
)

// treeResult: workload 7, Status of a running dev server whose snapshot
// lists its processes and ports.
type treeResult struct {
	mode           string // "cgroup" or "session"
	procs, ports   int    // what each Status listed
	quiet, chatty  stat   // Status of a quiet server (listing reused) and of a chatty one (listed anew)
	err            string // why the workload could not run
	containment    bgjob.Containment
	chattyListings int // calls whose job had written output since the call before
}

// listenChild is the bench binary as a dev server (-listen-child): it
// listens on an ephemeral loopback port, says so, and with chatty set
// writes a line every 500 µs, until it is killed.
func listenChild(chatty bool) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fatalf("listen child: %v", err)
	}
	fmt.Printf("port %d\n", l.Addr().(*net.TCPAddr).Port)
	if chatty {
		go func() {
			for range time.Tick(500 * time.Microsecond) {
				fmt.Println("request served")
			}
		}()
	}
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(1)
		}
		c.Close()
	}
}

// runTree starts a dev server as an agent would ("server & sleep &", the
// shell exiting, Spec.Leftovers LeftoversWait), waits until Status lists
// its two processes and its port, and times calls calls of Status: of a
// quiet server, whose listing is served again, and of a chatty one, whose
// output makes every Status list its tree anew. cgroup "off" runs the
// jobs in their session.
func runTree(calls int, cgroup string) treeResult {
	res := treeResult{mode: "cgroup"}
	if cgroup == "off" {
		res.mode = "session"
	}
	reg := newRegistry(bgjob.Config{Cgroup: cgroup, HeadBytes: 1 << 10, TailBytes: 4 << 10})
	defer closeRegistry(reg)
	self, err := os.Executable()
	if err != nil {
		fatalf("tree: %v", err)
	}
	for _, chatty := range []bool{false, true} {
		cmd := fmt.Sprintf("'%s' -listen-child", self)
		if chatty {
			cmd += " -chatty"
		}
		s, err := reg.Start(context.Background(), bgjob.Spec{Command: cmd + " & sleep 600 & exit 0", Leftovers: bgjob.LeftoversWait, Unique: true})
		if err != nil {
			fatalf("tree: %v", err)
		}
		res.containment = s.Containment
		if cgroup == "" && s.Containment != bgjob.ContainCgroup {
			res.err = "no cgroup here"
			reg.Cancel(s.ID)
			return res
		}
		for end := time.Now().Add(30 * time.Second); ; {
			if s, _ = reg.Status(s.ID); len(s.Ports) == 1 && len(s.Processes) == 2 && strings.Contains(s.Output.Text, "port ") {
				break
			}
			if time.Now().After(end) || s.State.Done() {
				fatalf("tree: the server's tree: %+v, ports %v, state %v, output %q", s.Processes, s.Ports, s.State, s.Output.Text)
			}
			time.Sleep(time.Millisecond) // until the processes have started
		}
		total := s.Output.Total
		for range calls {
			t := time.Now()
			s, err = reg.Status(s.ID)
			d := time.Since(t)
			if err != nil || len(s.Ports) != 1 {
				fatalf("tree: Status: %v, ports %v", err, s.Ports)
			}
			res.procs, res.ports = len(s.Processes), len(s.Ports)
			if chatty {
				res.chatty = append(res.chatty, d)
				if s.Output.Total != total {
					res.chattyListings++
				}
				total = s.Output.Total
				time.Sleep(time.Millisecond) // let a line come between calls
			} else {
				res.quiet = append(res.quiet, d)
			}
		}
		reg.Cancel(s.ID)
	}
	return res
}
