//go:build windows

package bgjob

// enforceable reports why limits l cannot be launched here, or nil.
// FileSize and OpenFiles have no Job Object form.
func enforceable(l Limits) *limitProblem {
	switch {
	case l.FileSize > 0:
		return unsupported("Limits.FileSize", "Windows has no limit of a file's size for a job")
	case l.OpenFiles > 0:
		return unsupported("Limits.OpenFiles", "Windows has no limit of a process's handles for a job")
	case !l.IsZero():
		return unsupported("Limits", "not yet enforced on Windows")
	}
	return nil
}

// limitArgv: the Job Object enforces the limits, not the command line.
func limitArgv(*plan, bool) {}

func (p *process) usage() Usage                { return Usage{} }
func (p *process) liveUsage() (Usage, bool)    { return Usage{}, false }
func (p *process) limitHit(Limits, int) string { return "" }
func (p *process) inferable(l Limits) Limits   { return Limits{} }

// cpuBase: no cgroup here.
func (p *process) cpuBase() [2]int64 { return [2]int64{} }

// signalLimit: no signal ends a job on Windows.
func signalLimit(Limits, int) string { return "" }
