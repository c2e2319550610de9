//go:build !linux

package bgjob

// cgroups is a registry's containment root: on systems other than Linux
// there is no cgroup, and a job's containment is its session (Unix) or
// its Job Object (Windows), made with its process.
type cgroups struct{}

func openCgroups(*Config) (*cgroups, error) { return &cgroups{}, nil }
func (*cgroups) place(*job, *plan)          {}
func (*cgroups) giveBack(*plan)             {}
func (*cgroups) tidy()                      {}
func (*cgroups) close()                     {}
func (*cgroups) retire(string)              {}
func (*cgroups) disable(error)              {}
func (*cgroups) clearExcept([]string)       {}
