package diameter

import (
	"errors"
	"io"

	"github.com/fiorix/go-diameter/v4/diam"
)

// DefaultFramerBuffer is a Framer's buffer when none is given: a TCP
// segment's worth of messages many times over, and every message of
// DefaultMaxLength.
const DefaultFramerBuffer = 64 * 1024

// Framer reads whole messages off a stream through one buffer and hands
// each out as a slice of that buffer: no copy and no allocation when the
// message fits in it (a larger one, up to maxLen, is read into a slice of
// its own). One read of the stream takes in as many messages as the
// stream has ready, so framing costs no syscalls of its own: a reader
// that takes header and body apart costs two reads per message, this one
// a fraction of one.
type Framer struct {
	r          io.Reader
	buf        []byte
	start, end int // buffered bytes: buf[start:end]
	maxLen     int
	err        error // the stream's error, returned once the buffer is used up
}

// NewFramer returns a framer of r with a buffer of size bytes (0:
// DefaultFramerBuffer) for messages of at most maxLen bytes.
func NewFramer(r io.Reader, size, maxLen int) *Framer {
	if size <= 0 {
		size = DefaultFramerBuffer
	}
	return &Framer{r: r, buf: make([]byte, max(size, diam.HeaderLength)), maxLen: maxLen}
}

// Next returns the next whole message. The slice is valid until the next
// call. At the end of the stream between messages the error is io.EOF;
// a stream that ends inside one, or a header that does not check
// (ParseHeader's checks), is ErrMalformed.
func (f *Framer) Next() ([]byte, error) {
	if err := f.fill(diam.HeaderLength); err != nil {
		if f.end > f.start && errors.Is(err, io.EOF) {
			err = malformed("stream ends inside a header")
		}
		return nil, err
	}
	l, err := MessageLength(f.buf[f.start:], f.maxLen)
	if err != nil {
		return nil, err
	}
	if l > len(f.buf) {
		msg := make([]byte, l)
		n := copy(msg, f.buf[f.start:f.end])
		f.start, f.end = 0, 0
		if _, err := io.ReadFull(f.r, msg[n:]); err != nil {
			return nil, malformed("stream ends inside a message: %v", err)
		}
		return msg, nil
	}
	if err := f.fill(l); err != nil {
		return nil, malformed("stream ends inside a message: %v", err)
	}
	msg := f.buf[f.start : f.start+l : f.start+l]
	f.start += l
	return msg, nil
}

// Ready reports whether a whole message (with a header that checks) is
// buffered: Next will not read the stream.
func (f *Framer) Ready() bool {
	if f.end-f.start < diam.HeaderLength {
		return false
	}
	l, err := MessageLength(f.buf[f.start:], f.maxLen)
	return err == nil && f.end-f.start >= l
}

// Buffered returns how many bytes are buffered past the last message.
func (f *Framer) Buffered() int { return f.end - f.start }

// fill reads until n bytes are buffered (n ≤ len(buf)), moving the
// buffered bytes to the front when the rest of the buffer is too short.
func (f *Framer) fill(n int) error {
	if f.end-f.start >= n {
		return nil
	}
	if f.start+n > len(f.buf) {
		f.end = copy(f.buf, f.buf[f.start:f.end])
		f.start = 0
	} else if f.start == f.end {
		f.start, f.end = 0, 0
	}
	for f.end-f.start < n {
		if f.err != nil {
			return f.err
		}
		k, err := f.r.Read(f.buf[f.end:])
		f.end += k
		if err != nil {
			f.err = err
		} else if k == 0 {
			f.err = io.ErrNoProgress
		}
	}
	return nil
}
