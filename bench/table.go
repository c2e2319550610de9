//go:build linux

package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/bgjob/bgjob"
)

// cell is one measured value; ok is false where the workload does not
// apply to the implementation or was not run ("n/a").
type cell struct {
	v  float64
	ok bool
}

func val(v float64) cell       { return cell{v: v, ok: true} }
func dur(d time.Duration) cell { return val(float64(d)) }

var na = cell{}

// row is one line of the table: a workload's metric for every
// implementation, and the target bgjob must meet, if any.
type row struct {
	workload, metric string
	cells            [nImpl]cell
	unit             func(float64) string
	target           string
	// check reports whether bgjob meets the target; nil for a row that
	// only informs.
	check func(c [nImpl]cell) bool
	note  string // why a row could not be measured
}

func (r row) result() string {
	switch {
	case r.note != "":
		return "SKIP"
	case r.check == nil:
		return ""
	case !r.cells[bgJob].ok:
		return "SKIP"
	case r.check(r.cells):
		return "PASS"
	}
	return "FAIL"
}

func fmtDur(v float64) string {
	d := time.Duration(v)
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f µs", v/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", v/1e6)
	}
	return fmt.Sprintf("%.2f s", v/1e9)
}

func fmtMiBps(v float64) string { return fmt.Sprintf("%.0f MiB/s", v) }
func fmtMiB(v float64) string   { return fmt.Sprintf("%.1f MiB", v) }
func fmtKiB(v float64) string   { return fmt.Sprintf("%.1f KiB", v/1024) }
func fmtNum(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func (r row) text(k int) string {
	c := r.cells[k]
	if !c.ok {
		return "n/a"
	}
	s := r.unit(c.v)
	if o := r.cells[osExec]; k != osExec && o.ok && o.v != 0 {
		s += fmt.Sprintf(" (%s×)", ratio(c.v/o.v))
	}
	return s
}

func ratio(x float64) string {
	switch {
	case x < 0.01:
		return fmt.Sprintf("%.4f", x)
	}
	// Three decimals, so that a ratio just over a limit (1.103 against
	// 1.10) does not print as the limit itself.
	return fmt.Sprintf("%.3f", x)
}

// render writes rows as one Markdown table and reports whether any row
// failed its target.
func render(w io.Writer, rows []row) (failed bool) {
	head := []string{"workload", "metric", implNames[osExec], implNames[goCmd], implNames[bgJob], "bgjob target", "result"}
	lines := [][]string{head}
	for _, r := range rows {
		res := r.result()
		failed = failed || res == "FAIL"
		lines = append(lines, []string{r.workload, r.metric, r.text(osExec), r.text(goCmd), r.text(bgJob), r.target, res})
	}
	width := make([]int, len(head))
	for _, l := range lines {
		for i, s := range l {
			width[i] = max(width[i], len([]rune(s)))
		}
	}
	line := func(l []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, s := range l {
			b.WriteString(" " + s + strings.Repeat(" ", width[i]-len([]rune(s))) + " |")
		}
		fmt.Fprintln(w, b.String())
	}
	line(lines[0])
	sep := make([]string, len(head))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, l := range lines[1:] {
		line(l)
	}
	for _, r := range rows {
		if r.note != "" {
			fmt.Fprintf(w, "\n%s / %s: not measured: %s\n", r.workload, r.metric, r.note)
		}
	}
	return failed
}

// Targets.
const (
	spawnMaxRatio    = 1.10 // with the job's session as its containment
	spawnCgroupRatio = 1.15 // with a cgroup of its own
	spawnArgsRatio   = 1.10 // Spec.Args (no shell) against os/exec of the same argv
	spawnLimitsRatio = 1.15 // with Limits set on each process, in the job's session
	sandboxRatio     = 1.10 // a sandboxed job against os/exec of the same bwrap command
	fgMaxP99         = time.Millisecond
	captureMinRatio  = 0.90
	captureWatchMin  = 0.85 // with 4 watches
	captureMaxRSSMiB = 48
	fanoutMaxGor     = 2
	fanoutMaxHeap    = 16 << 10
	statusMaxMedian  = 20 * time.Microsecond
	coalesceMaxJoin  = 5 * time.Microsecond
)

func relTo(limit float64, atMost bool) func(c [nImpl]cell) bool {
	return func(c [nImpl]cell) bool {
		if !c[osExec].ok || c[osExec].v == 0 {
			return false
		}
		x := c[bgJob].v / c[osExec].v
		if atMost {
			return x <= limit
		}
		return x >= limit
	}
}

func atMost(limit float64) func(c [nImpl]cell) bool {
	return func(c [nImpl]cell) bool { return c[bgJob].v <= limit }
}

func spawnRows(s spawnResult) []row {
	session := row{
		workload: "1 spawn", metric: "start+wait `true`, median (session)",
		cells: [nImpl]cell{dur(s.median[osExec]), dur(s.median[goCmd]), dur(s.session)},
		unit:  fmtDur, target: fmt.Sprintf("≤ %.2f× os/exec", spawnMaxRatio), check: relTo(spawnMaxRatio, true),
	}
	cgroup := row{
		workload: "1 spawn", metric: "start+wait `true`, median (cgroup)",
		cells: [nImpl]cell{dur(s.median[osExec]), na, dur(s.median[bgJob])},
		unit:  fmtDur, target: fmt.Sprintf("≤ %.2f× os/exec", spawnCgroupRatio), check: relTo(spawnCgroupRatio, true),
	}
	if s.contain != bgjob.ContainCgroup {
		cgroup.note = "no writable cgroup v2 hierarchy here: jobs got " + s.contain.String() + " containment"
	}
	// Spec.Args: the argv run with no shell, against os/exec of the same
	// argv; bgjob in the job's session, as the first row.
	args := row{
		workload: "1 spawn", metric: "start+wait argv `/bin/true`, median (Spec.Args, session)",
		cells: [nImpl]cell{dur(s.argvOS), na, dur(s.argvBgjob)},
		unit:  fmtDur, target: fmt.Sprintf("≤ %.2f× os/exec", spawnArgsRatio), check: relTo(spawnArgsRatio, true),
	}
	// Limits: the same command with limits the job's shell sets on
	// itself before it runs it, against plain os/exec.
	limits := row{
		workload: "1 spawn", metric: "start+wait `true` with Limits, median (session)",
		cells: [nImpl]cell{dur(s.median[osExec]), na, dur(s.limited)},
		unit:  fmtDur, target: fmt.Sprintf("≤ %.2f× os/exec", spawnLimitsRatio), check: relTo(spawnLimitsRatio, true),
	}
	return []row{session, cgroup, args, limits}
}

func sandboxRows(s sandboxResult) []row {
	r := row{
		workload: "1 spawn", metric: "start+wait sandboxed `true`, median",
		cells: [nImpl]cell{dur(s.osExec), na, dur(s.bgjob)},
		unit:  fmtDur, target: fmt.Sprintf("≤ %.2f× os/exec of the same bwrap", sandboxRatio), check: relTo(sandboxRatio, true),
		note: s.err,
	}
	if s.err != "" {
		r.cells = [nImpl]cell{na, na, na}
	}
	return []row{r}
}

func fgRows(f fgResult) []row {
	p99 := row{workload: "2 foreground latency", metric: "exit → return, p99", unit: fmtDur,
		target: "≤ " + fmtDur(float64(fgMaxP99)), check: atMost(float64(fgMaxP99)), note: f.err}
	med := row{workload: "2 foreground latency", metric: "exit → return, median", unit: fmtDur, note: f.err}
	if f.err == "" {
		for k := range nImpl {
			p99.cells[k], med.cells[k] = dur(f.p99[k]), dur(f.median[k])
		}
	}
	return []row{p99, med}
}

func captureRows(c [nImpl]captureResult, durable, watched captureResult, n int64) []row {
	size := fmtMiB(float64(n) / (1 << 20))
	if n >= 1<<30 {
		size = fmt.Sprintf("%.0f GiB", float64(n)/(1<<30))
	}
	tp := row{workload: "3 capture " + size, metric: "throughput, median run", unit: fmtMiBps,
		target: fmt.Sprintf("≥ %.2f× os/exec", captureMinRatio), check: relTo(captureMinRatio, false)}
	rss := row{workload: "3 capture " + size, metric: "peak RSS of the process", unit: fmtMiB,
		target: fmt.Sprintf("≤ %d MiB", captureMaxRSSMiB), check: atMost(captureMaxRSSMiB)}
	var notes []string
	for k := range nImpl {
		if c[k].err != "" {
			notes = append(notes, implNames[k]+": "+c[k].err)
			continue
		}
		tp.cells[k], rss.cells[k] = val(c[k].mibps), val(c[k].rssMiB)
	}
	if c[osExec].err != "" || c[bgJob].err != "" {
		tp.note = strings.Join(notes, "; ")
		rss.note = tp.note
	}
	dur := row{workload: "3 capture " + size, metric: "throughput, durable mode", unit: fmtMiBps,
		cells: [nImpl]cell{c[osExec].cellOf(), na, durable.cellOf()}, note: durable.err}
	// With watches: bgjob's column is the run with four of them.
	wtp := row{workload: "3 capture " + size, metric: "throughput, 4 watches", unit: fmtMiBps,
		cells:  [nImpl]cell{c[osExec].cellOf(), na, watched.cellOf()},
		target: fmt.Sprintf("≥ %.2f× os/exec", captureWatchMin), check: relTo(captureWatchMin, false), note: watched.err}
	wrss := row{workload: "3 capture " + size, metric: "peak RSS, 4 watches", unit: fmtMiB,
		cells:  [nImpl]cell{val(c[osExec].rssMiB), na, val(watched.rssMiB)},
		target: fmt.Sprintf("≤ %d MiB", captureMaxRSSMiB), check: atMost(captureMaxRSSMiB), note: watched.err}
	if c[osExec].err != "" {
		wrss.cells[osExec] = na
	}
	return []row{tp, rss, dur, wtp, wrss}
}

// cellOf is a capture's throughput, or n/a if it failed.
func (c captureResult) cellOf() cell {
	if c.err != "" {
		return na
	}
	return val(c.mibps)
}

func fanoutRows(f [nImpl]fanoutResult) []row {
	w := fmt.Sprintf("4 fan-out %d × sleep 1", f[bgJob].n)
	wall := row{workload: w, metric: "wall time", unit: fmtDur}
	gor := row{workload: w, metric: "goroutines / running job", unit: fmtNum,
		target: fmt.Sprintf("≤ %d", fanoutMaxGor), check: atMost(fanoutMaxGor)}
	heap := row{workload: w, metric: "heap / running job", unit: fmtKiB,
		target: "≤ " + fmtKiB(fanoutMaxHeap), check: atMost(fanoutMaxHeap)}
	for k := range nImpl {
		wall.cells[k], gor.cells[k], heap.cells[k] = dur(f[k].wall), val(f[k].goroutines), val(f[k].heap)
	}
	return []row{wall, gor, heap}
}

func statusRows(s statusResult) []row {
	w := fmt.Sprintf("5 status, %d retained", s.retained)
	mk := func(metric string, d time.Duration, checked bool) row {
		r := row{workload: w, metric: metric, unit: fmtDur}
		r.cells[bgJob] = dur(d)
		if checked {
			r.target, r.check = "≤ "+fmtDur(float64(statusMaxMedian)), atMost(float64(statusMaxMedian))
		}
		return r
	}
	return []row{
		mk("Status, median", s.status.median(), true),
		mk("Status, p99", s.status.p99(), false),
		mk("Read, median", s.read.median(), true),
		mk("Read, p99", s.read.p99(), false),
	}
}

func treeRows(t treeResult) []row {
	w := "7 dev server, " + t.mode
	quiet := row{workload: w, metric: "Status with Processes/Ports, median", unit: fmtDur,
		target: "≤ " + fmtDur(float64(statusMaxMedian)), check: atMost(float64(statusMaxMedian))}
	chatty := row{workload: w, metric: "Status listing anew (chatty server), median", unit: fmtDur}
	if t.err != "" {
		quiet.note, chatty.note = t.err, t.err
		return []row{quiet, chatty}
	}
	quiet.cells[bgJob] = dur(t.quiet.median())
	chatty.cells[bgJob] = dur(t.chatty.median())
	return []row{quiet, chatty}
}

func coalesceRows(c [nImpl]coalesceResult) []row {
	w := fmt.Sprintf("6 coalesce %d × Start", c[bgJob].n)
	procs := row{workload: w, metric: "processes spawned", unit: fmtNum, target: "= 1",
		check: func(c [nImpl]cell) bool { return c[bgJob].v == 1 }}
	per := row{workload: w, metric: "per joining call, median", unit: fmtDur,
		target: "≤ " + fmtDur(float64(coalesceMaxJoin)), check: atMost(float64(coalesceMaxJoin))}
	p99 := row{workload: w, metric: "per joining call, p99", unit: fmtDur}
	for _, k := range []int{osExec, bgJob} {
		procs.cells[k] = val(float64(c[k].processes))
		per.cells[k] = dur(c[k].perCall.median())
		p99.cells[k] = dur(c[k].perCall.p99())
	}
	return []row{procs, per, p99}
}
