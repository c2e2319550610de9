// Package bgjob runs shell commands as background jobs for a host program:
// an MCP server's shell tool, a coding-agent host, a CLI or a daemon.
//
// A host runs a command inline for a while and then lets go of it: the
// job keeps running, and its ID can be polled, read, waited on and
// cancelled. Each job is a whole process tree that is really stopped, its
// output is bounded in memory, and an output policy hook (the [Admitter])
// sees every byte before it is shown or kept.
//
//	r, err := bgjob.New(bgjob.Config{})
//	if err != nil { ... }
//	defer r.Close(context.Background())
//
//	res, err := r.RunForeground(ctx, bgjob.Spec{Command: "make test"},
//		bgjob.Foreground{SoftCap: 20 * time.Second})
//	if res.Detached {
//		// Still running: hand res.ID to the caller, who polls it with
//		// Status or Read, blocks with Wait, or stops it with Cancel.
//	}
//
// bgjob does not give a job a terminal (PTY) or take input after the
// start, and it runs jobs on this machine only. Durable mode (jobs that
// survive a host restart, [Config.StateDir]) is not in this version.
//
// # Jobs and IDs
//
// A job's [ID] is "job_" and 16 hex digits of a keyed BLAKE3 hash of its
// session, command, directory, timeouts, stdin and environment. A launch
// whose ID names a running job joins it instead of starting a second
// process; [Spec.Unique] opts out. IDs are capabilities: whoever knows one
// may poll and cancel the job, and without the registry's key nobody can
// guess one.
//
// # Concurrency
//
// A [Registry] is safe for concurrent use. Each running job has two
// goroutines: a supervisor, which reads its output, fires its timeouts
// and stops it, and a waiter, which reports the exit of its shell. The
// registry starts no other goroutine (Close starts one while it waits).
// Hooks (Admitter, Telemetry, OnComplete, Guard) are never called under
// the registry's lock; they may run concurrently with each other.
//
// # Cancellation
//
// [Registry.Cancel], a timeout and [Registry.Close] stop a job the same
// way: SIGTERM to its whole process group, then SIGKILL after
// [Config.KillGrace]. A job is done only when its shell has exited, its
// output pipe is drained (a process that holds it open delays the end by
// 200ms at most) and no process of its group is alive: leftovers are
// stopped the same way and counted in [Output.Notice]. The goroutine that
// owns the wait also sends every signal, and the shell is not reaped
// until it is done signalling, so a reused PID is never signalled.
//
// A context passed to a method bounds that call only: Start's ctx bounds
// validation and launch, RunForeground's the inline wait (ending it
// detaches), Wait's the wait. No context ever stops a job.
//
// # Output
//
// stdout and stderr share one pipe, so their order is kept. A job keeps
// the first [Config.HeadBytes] and the last [Config.TailBytes] of its
// output and counts what lies between; when bytes were dropped, the kept
// head ends and the tail begins at a line boundary, and [Output.Text]
// joins them with one omission line. [Registry.Read] serves absolute
// offsets of the stream and never consumes it. NUL bytes and invalid
// UTF-8 are data.
//
// Text leaves the registry only through the [Admitter]: a running job's
// text on every Status, Read and List, a finished job's text once, when it
// ends, before it is kept. An Admitter error withholds the text.
//
// # Retention
//
// A finished job can be polled if it was started by [Registry.Start] or
// detached from [Registry.RunForeground]; its end queues a [Completion]
// for its session. Finished jobs are kept within [Config.Retention] and
// evicted oldest first. A job that only RunForeground callers held and
// that ended inline is forgotten as soon as they have its result.
//
// # Platform differences
//
// On Unix each job runs in a new session (setsid), so its process group
// holds everything it starts. On Linux the waiter parks on a pidfd and
// leftover processes are found in /proc, ignoring zombies, which hold
// nothing; [Config.Subreaper] makes the host reap its jobs' orphans. On
// other Unix systems a kqueue reports the exit and the group is checked
// with kill(-pgid, 0).
//
// On Windows each job runs in a Job Object with kill-on-close, created
// suspended and resumed once assigned, so nothing escapes it. The polite
// step is CTRL_BREAK to the job's console process group, which reaches
// it only when the host has a console; a host without one (a service)
// goes straight to TerminateJobObject after the grace. Exit codes are the
// process's own (a killed process does not report 128+n).
package bgjob
