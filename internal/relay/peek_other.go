//go:build !unix

package relay

// readable does not wait where peeking is not available: the read that
// follows blocks, holding its buffer.
func (w *waiter) readable(uintptr) bool { return true }

const canReadDirect = false

// readDirect is not used where peeking is not available.
func (w *waiter) readDirect(uintptr) bool { return true }
