//go:build unix && !linux

package bgjob

// enforceable reports why limits l cannot be launched here, or nil: every
// limit is set on each process (there are no cgroups).
func enforceable(l Limits) *limitProblem { return rlimitsAllowed(l) }

// usage returns the rusage of the reaped shell.
func (p *process) usage() Usage { return p.used }

// liveUsage: nothing tells a running job's usage here.
func (p *process) liveUsage() (Usage, bool) { return Usage{}, false }

// limitHit returns the reason of the limit whose signal ended the job.
func (p *process) limitHit(l Limits, code int) string { return signalLimit(l, code) }

// inferable: every limit here is set on each process.
func (p *process) inferable(l Limits) Limits { return l }

// cpuBase: no cgroup here.
func (p *process) cpuBase() [2]int64 { return [2]int64{} }
