//go:build !linux

package redistest

import "syscall"

// DieWithParent is a no-op where the kernel cannot tie a child's life to
// its parent's: a test that dies may leave processes behind there.
func DieWithParent() *syscall.SysProcAttr { return nil }
