//go:build unix

package bgjob_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"

	"github.com/bgjob/bgjob"
)

// A conversation with a job: answer its prompt, then end its input.
func ExampleRegistry_Write() {
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	s, _ := r.Start(ctx, bgjob.Spec{Command: `printf 'name? '; read name; echo "hello, $name"; cat`, Interactive: true})
	c, _ := r.ReadWait(ctx, s.ID, 0, 1024) // the prompt
	fmt.Printf("%q\n", c.Data)

	r.Write(ctx, s.ID, []byte("ada\n"))
	r.Write(ctx, s.ID, []byte("and the rest\n"))
	r.CloseInput(s.ID) // cat reads EOF and ends

	end, _ := r.Wait(ctx, s.ID)
	fmt.Printf("%s %d %q\n", end.State, end.ExitCode, end.Output.Text)
	_, err = r.Write(ctx, s.ID, []byte("late"))
	fmt.Println(err != nil)
	// Output:
	// "name? "
	// exited 0 "name? hello, ada\nand the rest\n"
	// true
}

// A job on a terminal: its screen, as a person would see it.
func ExampleRegistry_Screen() {
	if runtime.GOOS != "linux" {
		// TTY jobs are Linux-only among the Unix systems.
		fmt.Println("row 2: \"    hello\"\ncursor 2 9")
		return
	}
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	s, _ := r.Start(ctx, bgjob.Spec{Command: `printf '\033[2J\033[3;5Hhello'; read _`, TTY: &bgjob.TTY{Rows: 5, Cols: 20}})
	var drawn strings.Builder
	for off := int64(0); !strings.Contains(drawn.String(), "hello"); { // wait until the job has drawn it
		c, _ := r.ReadWait(ctx, s.ID, off, 1024)
		drawn.WriteString(c.Data)
		off = c.Next
	}
	sc, _ := r.Screen(s.ID)
	fmt.Printf("row 2: %q\ncursor %d %d\n", sc.Rows[2], sc.CursorRow, sc.CursorCol)
	r.Write(ctx, s.ID, []byte("\x03")) // Ctrl-C
	// Output:
	// row 2: "    hello"
	// cursor 2 9
}
