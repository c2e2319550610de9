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
//	jobs := r.Session(client) // this client's jobs only
//	res, err := jobs.RunForeground(ctx, bgjob.Spec{Command: "make test"},
//		bgjob.Foreground{SoftCap: 20 * time.Second})
//	if err == nil {
//		err = res.Err() // the job never ran: its shell could not start
//	}
//	if err != nil { ... }
//	if res.Detached {
//		// Still running: hand res.ID to the caller, who polls it with
//		// Status or Read, streams it with Follow, blocks with Wait,
//		// or stops it with Cancel.
//		io.Copy(os.Stdout, jobs.Follow(ctx, res.ID, 0))
//	}
//
// bgjob runs jobs on this machine only (a Config.Launcher may run them
// elsewhere).
//
// Hooks ([Admitter], [Telemetry], [Config.OnComplete], [Config.OnMatch],
// [Config.Guard]) may call back into the registry, on any job, their own included, without a
// deadlock: a wait from a hook waits for the job to finish, not for its
// hooks, and a JobStarted hook that waits for its own job supervises it
// to its end right there.
//
// # Interactive jobs
//
// A job launched with [Spec.Interactive] keeps its standard input open:
// [Registry.Write] sends it bytes (waiting only while its pipe is full,
// as long as the call's ctx allows) and [Registry.CloseInput] sends end
// of file; a prompt, a REPL or cat can be driven to its end. With
// [Spec.TTY] the job runs on a pseudo-terminal of its own, its
// controlling terminal, so programs behave as for a person at a
// terminal: Write("\x03") interrupts the foreground process group as
// Ctrl-C does, [Registry.Resize] changes the size (SIGWINCH), and
// [Registry.Screen] renders the screen (rows and cursor) through a
// terminal emulator, for top, less or a progress bar. A TTY job's
// [Output.Text] is its stream with escape sequences removed, while
// [Registry.Read] serves the raw stream; both, and the screen, pass the
// Admitter. Interactive launches never coalesce: each is a conversation
// of its own. Errors say when a job takes no input ([ErrNotInteractive])
// or no longer does ([ErrInputClosed]).
//
// # Limits and usage
//
// [Config.Limits] bounds every job and [Spec.Limits] one job: memory, live
// processes, CPU cores, CPU time, file size and descriptors (see
// [Limits] for which mechanism enforces each where: a cgroup v2 controller
// for the whole tree where the host's cgroup offers it, else setrlimit on
// each process, the Job Object on Windows). A job a limit stopped ends with
// a [Snapshot.Reason] that names the limit and [CategoryLimit] in
// [Telemetry]. [Snapshot.Usage] tells the CPU time and peak memory every
// finished job used.
//
// # Sandbox
//
// [Config.Sandbox] or [Spec.Sandbox] confines a job: it may write its Dir,
// a private temporary directory and the paths listed, read the whole
// filesystem or only what is listed, and reach no network unless allowed
// (see [Sandbox]). Linux enforces it with bubblewrap in user namespaces,
// macOS with sandbox-exec; where it cannot be enforced the launch fails
// with [ErrUnsupported] and nothing runs. [Config.Launcher] rewrites every
// job's command line, after the sandbox, for a host's own runner.
//
// # Dev servers and queues
//
// A job's shell may leave processes running when it exits ("npm run dev
// &"). By default they are stopped then ([LeftoversStop]); with
// [Spec.Leftovers] set to [LeftoversWait] the job stays Running until the
// last of them has ended, its output still read, its timeouts, Cancel and
// Close still stopping the whole tree, and ends with the shell's exit
// code. [Registry.Status] and [Registry.List] show a running job's live
// processes ([Snapshot.Processes], command lines through the Admitter) and
// the TCP ports they listen on ([Snapshot.Ports]), on Linux; a listing is
// served again for up to a second while the job writes no output, since a
// fresh one reads /proc (see [Registry.Status] for its cost).
//
// With [Config.Queue], a launch beyond [Config.MaxRunning] waits instead of
// failing: the job is [Queued], with its place in [Snapshot.QueuePosition],
// and starts, highest [Spec.Priority] first and then in order of arrival,
// when a running job's end frees a slot (the end itself starts it; nothing
// polls). Cancel takes a job out of the queue, Close cancels the queue,
// [Config.MaxQueued] bounds it, and in durable mode it survives a restart.
//
// # Durable mode
//
// With [Config.StateDir] set (Linux only; New fails with
// [ErrUnsupported] elsewhere), every run of a job has a folder under that
// directory holding its record, its output (written by the job itself)
// and an exit marker written by a wrapper shell when the job's shell
// ends. A host that crashes or exits loses nothing: [New] on the same
// directory replays it. Finished jobs come back with their state, exit
// code and text; completions never delivered are queued again, once;
// jobs still running (the same PID with the same start time) are adopted
// and watched to their end, with their timeouts from their original
// start; jobs that ended while no host watched get the exit code of
// their marker, or become Failed ("lost") without one, or ("spawn
// aborted") if the host died while starting them; unreadable records are
// quarantined. [Registry.Detach] lets a host exit on purpose without
// stopping its jobs. While a Registry watches a job, its output file is
// held to [Config.MaxOutputBytes] on disk. Live behaviour (Read, Status,
// timeouts, Cancel, coalescing, admission, completions) is the same as in
// memory. The job's shell runs under a wrapper /bin/sh, so its PID is
// the wrapper's; the environment and stdin are never written to a
// record (a queued job keeps them in a file of mode 0600 until it
// starts, so that it can start after a restart). An interactive job
// reads a named pipe in its folder, held open by a small holder process,
// so a host that adopts it after a restart (or a crash) writes on, and
// CloseInput still ends it. TTY jobs are refused in durable mode with
// ErrUnsupported: a terminal lives in the host and would not survive its
// restart.
//
// # Watches
//
// A host that waits for a job to print something ("listening on",
// "ready in", "error") need not poll. A [Watch] on a job
// ([Spec.Watches], or [Registry.Watch] on a running one) matches a
// regexp against each line of its raw output, every byte of it (the
// bytes the head/tail buffer drops too, lines that come in many small
// writes), and makes a [Match] of each matching line, once or on every
// match: queued for the job's session ([Registry.Matches]) and passed to
// [Config.OnMatch], its line admitted by the Admitter first.
// [Registry.WaitFor] blocks until a line at or after an offset matches a
// pattern, the lines printed before the call included (those still
// held), or the job ends (an [*EndedError], wrapping [ErrJobEnded], with
// the final snapshot). Patterns with a literal that every match must
// hold cost little: lines are searched for the literals first (with
// four watches the 1 GiB capture runs at 0.98–1.00× its speed without them).
// Matches are bounded: while 1,024 of a job's matches wait for OnMatch,
// the registry reads no more of its output (the job's writes block),
// until a stop or the shell's exit, which never wait for OnMatch.
// In durable mode watches and undelivered matches survive a restart, and
// what a job printed while no host ran is matched by the next host, each
// match delivered once.
//
// # Jobs and IDs
//
// A job runs [Spec.Command] through the shell, or [Spec.Args], an
// argument vector, with no shell at all: nothing to quote, one exec
// fewer. A job whose process could not be started still exists (Failed,
// with the reason); [Snapshot.Err] reports it as an error wrapping
// [ErrSpawn].
//
// A job's [ID] is "job_" and 16 hex digits of a keyed BLAKE3 hash of its
// session, command (or argument vector), directory, timeouts, stdin and
// environment. A launch whose ID names a running job joins it instead of
// starting a second process; [Spec.Unique] opts out. IDs are capabilities:
// whoever knows one may poll and cancel the job, and without the
// registry's key nobody can guess one.
//
// # Sessions
//
// [Spec.Session] scopes a job to an owner, such as one client of a
// multi-client host. [Registry.Session] returns a view of the registry for
// one session, with the same methods: it fills Spec.Session in, and its
// Status, Read, ReadWait, Follow, Wait and Cancel answer [ErrNotFound] for
// another session's ID, exactly as for an unknown one. A host that hands
// each client its view needs no check of its own.
//
// # Concurrency
//
// A [Registry] is safe for concurrent use. Each running job has a
// supervisor, which reads its output, fires its timeouts, sees its shell
// exit and stops it. On Linux that is one goroutine per job (the output
// pipe and the shell's pidfd wait in one epoll set); elsewhere, and in
// durable mode, a second goroutine waits for the shell's exit. The
// caller of [Registry.RunForeground] that launches a job runs its
// supervisor itself until the job ends, detaches or its first progress
// report is due, so a short foreground job starts no goroutine at all
// (OnProgress is never called while it does; the hooks of the job's end
// are, as they would be in the job's own goroutine). A job that waits for
// its leftovers ([LeftoversWait]) has one more goroutine while its shell
// has exited and its tree lives, which waits for the tree to be empty. A
// queued job has no goroutine until it leaves the queue. Matches of
// watches are delivered by one goroutine of the registry, which runs
// while some wait for delivery and ends when none do. The registry
// starts no other goroutine (Close starts one while it waits), but for an
// interactive job whose Spec.Stdin does not fit into its input at once:
// a goroutine writes the rest, and ends when it is written or the input
// closes. A Write that waits for a full input waits in the runtime's
// poller, holding no thread. A TTY job's screen is rendered by the
// Screen call itself, from the output that came since the last one, so
// a job nobody looks at costs nothing.
// Hooks (Admitter, Telemetry, OnComplete, Guard) are never called under
// the registry's lock; they may run concurrently with each other.
//
// # Cancellation
//
// [Registry.Cancel], a timeout and [Registry.Close] stop a job the same
// way: SIGTERM to every process group of the job, then SIGKILL after
// [Config.KillGrace]. A job is done only when its shell has exited, its
// output pipe is drained (a process that holds it open delays the end by
// 200ms at most) and no process of the job is alive: leftovers are
// stopped the same way and counted in [Output.Notice]. The goroutine that
// owns the wait also sends every signal, and the shell is not reaped
// until it is done signalling, so a reused PID is never signalled.
//
// What "every process of the job" means is its containment
// ([Snapshot.Containment]). On Linux a job gets a cgroup v2 of its own
// wherever the host can make one ([Config.Cgroup]): its shell is spawned
// straight into it, nothing the job starts can leave it (setsid, double
// forks and daemons included), the stop ends with cgroup.kill, and the
// job is done when the cgroup is empty. Without a cgroup, a job is its
// session: every process group in it, and on Linux every process whose
// environment carries the job's marker (BGJOB_JOB), which setsid does not
// drop; a process that leaves the session and drops that variable too
// escapes. On Windows a job is its Job Object.
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
// offsets of the stream and never consumes it: read on from
// [Chunk.Next], never from Offset+len(Data). [Registry.ReadWait] is Read
// that waits until there is output at the offset or the job has ended,
// and [Registry.Follow] is an [io.Reader] over the output that blocks for
// new bytes and returns io.EOF at the job's end; both wake on the job's
// output, neither polls. NUL bytes and invalid UTF-8 are data.
//
// [Snapshot], [Output], [Chunk] and [Completion] marshal to JSON with
// snake_case names, states by name and times in RFC 3339.
//
// Text leaves the registry only through the [Admitter]: a running job's
// text on every Status, Read and List, a finished job's text once, when it
// ends, before it is kept, and a matched line once, before its Match is
// queued. An Admitter error withholds the text.
//
// # Retention
//
// A finished job can be polled if it was started by [Registry.Start] or
// detached from [Registry.RunForeground]; its end queues a [Completion]
// for its session, which [Registry.Completions] drains and
// [Registry.NextCompletion] waits for, each completion going to one
// caller. Finished jobs are kept within [Config.Retention] and
// evicted oldest first. A job that only RunForeground callers held and
// that ended inline is forgotten as soon as they have its result.
//
// # Platform differences
//
// On Unix each job runs in a new session (setsid); on Linux also in a
// cgroup of its own where the host can make one (see Cancellation). Durable mode needs Linux: pidfds watch an
// adopted process that is not the host's child, inotify wakes the reader
// of an output file. On Linux the waiter parks on a pidfd and
// leftover processes are found in /proc, ignoring zombies, which hold
// nothing; [Config.Subreaper] makes the host reap its jobs' orphans. On
// other Unix systems a kqueue reports the exit and the group is checked
// with kill(-pgid, 0). [Snapshot.Processes] and [Snapshot.Ports] are
// listed on Linux only; elsewhere they stay empty, and a job waiting for
// its leftovers has its tree looked at every half second at most, where
// Linux wakes on the tree's end (inotify on the cgroup, pidfds).
//
// TTY jobs run on a Linux pseudo-terminal (opened through x/sys/unix)
// and, on Windows, on a pseudo console (ConPTY, Windows 10 1809 and
// later); on other Unix systems a TTY launch fails with ErrUnsupported.
// Interactive pipes work everywhere.
//
// On Windows each job runs in a Job Object with kill-on-close, which
// also holds its [Limits], created suspended and resumed once assigned,
// so nothing escapes it and nothing runs unlimited. The polite
// step is CTRL_BREAK to the job's console process group, which reaches
// it only when the host has a console; a host without one (a service)
// goes straight to TerminateJobObject after the grace. Exit codes are the
// process's own (a killed process does not report 128+n).
package bgjob
