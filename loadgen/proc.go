package loadgen

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// A server that is not greendot exposes none of its metrics: with
// Options.ServerPIDs the bench reads its CPU and RSS from /proc instead,
// which works for any local process.

// userHZ is the unit of the CPU times in /proc/<pid>/stat: USER_HZ, 100 on
// every Linux architecture Go builds for (sysconf needs cgo).
const userHZ = 100

// procSample reads the CPU time (utime + stime, every thread) and the RSS
// of each process and adds them up under the names /metrics gives them.
func procSample(pids []int) (Sample, error) {
	s := Sample{mCPU: 0, mRSS: 0}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil, fmt.Errorf("loadgen: server process: %w", err)
		}
		cpu, err := parseProcStatCPU(b)
		if err != nil {
			return nil, fmt.Errorf("loadgen: /proc/%d/stat: %w", pid, err)
		}
		kib, err := procStatusKiB(pid, "VmRSS")
		if err != nil {
			return nil, fmt.Errorf("loadgen: server process: %w", err)
		}
		s[mCPU] += cpu
		s[mRSS] += float64(kib) * 1024
	}
	return s, nil
}

// parseProcStatCPU returns utime + stime, in seconds, of a /proc/<pid>/stat
// line. The command name (field 2) may hold spaces and parentheses, so the
// fields are counted from the last ')'.
func parseProcStatCPU(b []byte) (float64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", truncate(string(b), 80))
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state): utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	var ticks float64
	for _, x := range f[11:13] {
		v, err := strconv.ParseUint(string(x), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpu time %q: %w", x, err)
		}
		ticks += float64(v)
	}
	return ticks / userHZ, nil
}
