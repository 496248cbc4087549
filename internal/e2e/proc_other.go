//go:build !linux

package e2e

import "syscall"

func dieWithParent() *syscall.SysProcAttr { return nil }
