//go:build !linux

package bgjob

// cgroups is a registry's containment root: on systems other than Linux
// there is no cgroup, and a job's containment is its session (Unix) or
// its Job Object (Windows), made with its process.
type cgroups struct{}

// jobCgroup is a job's cgroup: none here.
type jobCgroup struct{}

func openCgroups(*Config) (*cgroups, error)         { return &cgroups{}, nil }
func (c *cgroups) place(_ *job, pl *plan) error     { return c.enforceableErr(pl.limits) }
func (*cgroups) enforceable(l Limits) *limitProblem { return enforceable(l) }
func (*cgroups) giveBack(*plan)                     {}
func (*cgroups) close()                             {}
func (*cgroups) retire(string)                      {}
func (*cgroups) disable(error)                      {}
func (*cgroups) clearExcept([]string)               {}
