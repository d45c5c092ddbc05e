//go:build unix

package devserver

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockDataDir takes an exclusive lock on dir/temporal.lock so two servers never share one database.
func lockDataDir(dir string) (release func(), err error) {
	path := dir + string(os.PathSeparator) + "temporal.lock"
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("devserver: DataDir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("devserver: DataDir %s is in use by another dev server", dir)
		}
		return nil, fmt.Errorf("devserver: DataDir lock: %w", err)
	}
	return func() { _ = f.Close() }, nil
}
