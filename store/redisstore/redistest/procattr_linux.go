package redistest

import "syscall"

// DieWithParent makes a child process killed when the process that started
// it dies, so a test that panics or times out leaves no redis-server (or
// greendot node) running behind it.
func DieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
