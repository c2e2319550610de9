package bgjob_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Helper modes that need Linux (see extraHelpers).
func init() {
	extraHelpers["serve"] = serveHelper
}

// serveHelper is "serve PID": it listens on an ephemeral loopback TCP
// port and says "port N"; says "parent gone" once process PID (the shell
// that started it, whose $$ it is given) has exited; and exits 0 when a
// client sends "quit". It stands for a dev server left running by a
// shell ("npm run dev &"); no python3 or other tool is needed.
func serveHelper(args []string) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	fmt.Printf("port %d\n", l.Addr().(*net.TCPAddr).Port)
	if len(args) > 0 {
		if pid, err := strconv.Atoi(args[0]); err == nil {
			go func() {
				fd, err := unix.PidfdOpen(pid, 0)
				if err == nil {
					pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
					for {
						if _, err := unix.Poll(pfd, -1); err != unix.EINTR {
							break
						}
					}
				}
				fmt.Println("parent gone")
			}()
		}
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return 1
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if strings.TrimSpace(line) == "quit" {
			return 0
		}
	}
}
