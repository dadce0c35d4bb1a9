//go:build unix

package monolock

import "syscall"

func init() {
	setReceiveBuffer = func(fd uintptr, n int) error {
		return syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, n)
	}
}
