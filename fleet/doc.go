// Package fleet runs bgjob jobs on many machines: a [Worker] serves a
// local [bgjob.Registry] to a fleet, and a [Client] offers the
// Registry's method set ([bgjob.Jobs]) over the fleet, so a host switches
// from local jobs to a fleet by construction only. It is built on NATS
// with JetStream (work queues, key-value buckets and streams, replicated
// by Raft across a cluster); it starts no server of its own.
//
//	nc, _ := nats.Connect("nats://a:4222,nats://b:4222,nats://c:4222")
//
//	// On each worker machine (the feed carries watches' matches):
//	feed := new(fleet.MatchFeed)
//	reg, _ := bgjob.New(bgjob.Config{OnMatch: feed.OnMatch})
//	w, _ := fleet.NewWorker(nc, reg, fleet.WorkerConfig{Layout: fleet.Layout{Replicas: 3}, Matches: feed})
//	defer reg.Close(ctx)
//	defer w.Close(ctx)
//
//	// In the host (any replica of it):
//	var jobs bgjob.Jobs
//	jobs, _ = fleet.NewClient(nc, fleet.ClientConfig{Layout: fleet.Layout{Replicas: 3}})
//	s, err := jobs.Start(ctx, bgjob.Spec{Command: "make test", Session: "alice"})
//
// # How a job runs
//
// Start writes the job's record to the jobs bucket with a
// compare-and-set on its key (SESSION.ID): a record of the same ID that
// is queued or running means the launch joins it (Joined, no process);
// otherwise the record is a new run, "queued", and the launch goes to
// the pool's work queue. A worker with a free slot takes it, claims the
// record (queued → claimed, compare-and-set, so one worker runs it),
// starts the job in its Registry, records it running, acknowledges the
// launch and answers the client. It then publishes the job's admitted
// output by offset to the output stream as it comes and, at the end,
// records the final snapshot and queues the completion. The matches of
// the job's watches, found by the worker's Registry and admitted there,
// reach the worker through its [MatchFeed] (the Registry's OnMatch) and
// are queued for the session, each taken once by [Client.Matches] or
// [Client.NextMatch]. Every record
// write is a compare-and-set on the key's last revision, so each change
// has one writer: the end of a run is written once, by its worker or by
// a reaper.
//
// Subjects and names, with P the Layout's Prefix ("bgjob"):
//
//	P_launch   stream, work queue   P.launch.POOL.SESSION    launches, each taken by one worker
//	P_jobs     key-value bucket     SESSION.ID               each job's record: phase, worker, snapshot
//	P_workers  key-value bucket     hb.WORKER                heartbeats, each expiring after HeartbeatTTL
//	                                config.idkey             the fleet's shared ID key
//	P_out      stream               P.out.SESSION.ID.RUN     admitted output chunks, by offset
//	P_done     stream, work queue   P.done.SESSION           completions, each taken once
//	P_match    stream, work queue   P.match.SESSION          matches of watches, each taken once
//	(core)     request-reply        P.rpc.WORKER.SESSION     Status, Read, ReadWait, Cancel, Write,
//	                                                         CloseInput, Resize, Screen, Watch, WaitFor
//	                                                         at the job's worker
//
// SESSION is [SessionToken] of the session's name.
//
// Every read that decides something (a record before a compare-and-set,
// a heartbeat before a loss is recorded, the output of an ended job) is
// answered by the stream's leader, never by a replica's direct get,
// which may not yet hold what the leader acknowledged.
//
// # Failures
//
//   - A worker that dies stops writing its heartbeat. When the heartbeat
//     expires, every worker's and client's reaper sees it go; the runs
//     the worker had started end Failed with Reason "worker lost", and
//     their completions are queued, once (compare-and-set, and the
//     completion's message ID is the run's). Outside durable mode the
//     dead worker's Registry stops its jobs (its guard process), so no
//     job runs on unobserved.
//   - A worker cut off from JetStream (a partition, a slow election)
//     for longer than HeartbeatTTL is taken for dead as above, though
//     its jobs run on. When its heartbeat is stored again, it sees the
//     gap (the answer came half of HeartbeatTTL or more after the last
//     stored heartbeat was sent: the server keeps a heartbeat for the
//     TTL cut to whole seconds) and, for a while after, checks its runs'
//     records at every beat: it stops (Registry.Cancel) the job of each
//     run the fleet settled without it — ended "worker lost", replaced
//     by a new run, or given to another worker — so that nothing runs
//     that the fleet reports ended. Such a job's end is not recorded
//     again and yields no second completion. A worker that never gets
//     back to JetStream cannot learn it: outside durable mode, its
//     jobs then run until they end or its host stops them.
//   - A worker that dies after it claimed a launch and before it
//     recorded the job running: at most once, by default, the launch ends
//     Failed, "worker lost" (it may or may not have started). With
//     ClientConfig.Rerun, it goes back to the queue and another worker
//     runs it once the pool's AckWait has passed.
//   - A launch no worker takes (every worker busy or none running) waits
//     in the work queue; Start returns ErrNoWorker when its ctx or
//     StartTimeout ends, having withdrawn it.
//   - A NATS server that dies: with three servers and Replicas 3, every
//     stream and bucket keeps a quorum, and clients and workers
//     connected with the list of servers reconnect to another. Requests
//     in flight are retried (writes by compare-and-set or with message
//     IDs, so a retry never applies twice) for up to about six times
//     Layout.RequestTimeout.
//   - A client that dies: its jobs go on; a completion it had taken but
//     not acknowledged is delivered again 30s later.
//   - A worker restarted under the same Name adopts the runs recorded as
//     its own (see [NewWorker]): with a durable Registry (StateDir) on
//     the same folder, within HeartbeatTTL, a running job is served
//     again and its output published on from where it was, and a job
//     that ended meanwhile gets its real end; a run its Registry does
//     not hold is recorded lost at once. [Worker.Detach] stops a worker
//     for such a restart without stopping its jobs.
//
// # Sessions and security
//
// Every subject and key of a job holds its session's token, so NATS
// permissions can confine a host's connection to a session. A client
// with ClientConfig.Scoped uses only its session's subjects, plus the
// JetStream API for its buckets and streams; a worker answers a request
// on a session's subject only for that session's jobs. A fleet that
// crosses machines should run NATS with TLS and a user per role, for
// example (nats-server configuration):
//
//	tls { cert_file: "server.pem", key_file: "server-key.pem", ca_file: "ca.pem", verify: true }
//	accounts {
//	  JOBS: {
//	    jetstream: enabled
//	    users: [
//	      # Workers and unscoped clients: the whole fleet.
//	      { user: worker, password: $WORKER_PASS, permissions: {
//	          publish: ["bgjob.>", "$JS.API.>", "$JS.ACK.>", "$KV.bgjob_jobs.>", "$KV.bgjob_workers.>", "_INBOX.>"],
//	          subscribe: ["bgjob.rpc.>", "_INBOX.>"] } }
//	      # A host scoped to session alice.
//	      { user: alice, password: $ALICE_PASS, permissions: {
//	          publish: ["bgjob.launch.*.alice", "bgjob.rpc.*.alice", "$KV.bgjob_jobs.alice.>",
//	                    "$JS.API.STREAM.MSG.GET.KV_bgjob_jobs", "$JS.API.STREAM.MSG.GET.bgjob_out",
//	                    "$JS.API.STREAM.INFO.*", "$JS.API.CONSUMER.CREATE.*.*.bgjob.done.alice",
//	                    "$JS.API.CONSUMER.CREATE.KV_bgjob_jobs.*.$KV.bgjob_jobs.alice.>",
//	                    "$JS.API.CONSUMER.MSG.NEXT.bgjob_done.done-alice", "$JS.ACK.bgjob_done.done-alice.>",
//	                    "$JS.API.CONSUMER.CREATE.*.*.bgjob.match.alice",
//	                    "$JS.API.CONSUMER.MSG.NEXT.bgjob_match.match-alice", "$JS.ACK.bgjob_match.match-alice.>",
//	                    "$JS.API.CONSUMER.DELETE.KV_bgjob_jobs.>", "$JS.API.INFO"],
//	          subscribe: ["_INBOX.>"] } }
//	    ]
//	  }
//	}
//
// The scoped user's list is a sketch of what its client sends, not a
// tested policy: this package's tests check the isolation of scoped
// clients and of the workers' requests, not NATS's permissions. In
// particular STREAM.MSG.GET cannot be limited to one session's keys by
// subject, so a user who may send it can read any record by its key:
// where sessions belong to parties that do not trust each other, give
// each its own Prefix (its own streams and buckets, and its own
// workers) or its own NATS account, rather than one fleet with subject
// permissions. The
// shared ID key (config.idkey in the workers bucket) must be readable
// only by workers and trusted clients: whoever has it can compute IDs.
// A scoped client should be given the key in ClientConfig.IDKey.
//
// # Limits
//
//   - A job's record is written four times (queued, claimed, running,
//     ended), each a replicated write: a fleet job costs a few
//     milliseconds more than a local one, and throughput is bound by
//     JetStream's writes, not by the workers (see the README's numbers).
//   - The output stream keeps each run's last 1,024 chunks, within
//     Layout.OutputBytes for the fleet and Layout.Retention in time;
//     reads of an ended job are served from it, so its head may be
//     Skipped where the local Registry would still hold it.
//   - List shows running jobs as their workers recorded them at their
//     start; Status gives the live text.
//   - IDs are the fleet's, a keyed hash of the Spec as the client gave
//     it: Dir "" and "." are different jobs here.
//   - Write sends at most 256 KiB per request; concurrent Writes to one
//     job may interleave between those pieces (locally they never do).
//   - Screen of an ended TTY job fails with ErrUnsupported: the emulator
//     lives on the worker, which lets the job go at its end.
//   - Readmit fails with ErrUnsupported: the Admitter runs on the
//     workers. Detach is Close: a client holds no job.
//   - Matches of watches (Spec.Watches, Watch) are carried only from
//     workers given a MatchFeed; a worker without one leaves them to its
//     Registry. The fleet keeps at most 16,384 undelivered matches per
//     session (the oldest go); a worker that cannot publish them as fast
//     as they come (NATS slow or away) drops those past 1,024 waiting,
//     and the session's next match counts them in Dropped, so that the
//     jobs' output is never held up by the fleet. Matches found after
//     the worker's Close or Detach are not carried; a worker that adopts
//     runs publishes the matches its Registry queued for them (with a
//     durable Registry, those of lines printed while no worker ran).
//     WaitFor works through the fleet: at the worker while the job runs,
//     over the published (admitted) output once it has ended.
//   - A queued launch is State Queued without a QueuePosition.
//   - A worker restarted after its heartbeat expired finds its jobs
//     recorded lost; a durable Registry's job still running then is
//     cancelled there, since the fleet told everyone it ended (as a
//     live worker's jobs are, after a partition: see Failures).
package fleet
