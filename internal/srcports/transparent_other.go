//go:build !linux

package srcports

import "errors"

// setTransparent: binding a non-local source address (usip) is Linux's
// IP_TRANSPARENT; other systems refuse the dial.
func setTransparent(uintptr, string) error {
	return errors.New("usip (IP_TRANSPARENT) is only available on Linux")
}
