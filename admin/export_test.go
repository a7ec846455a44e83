package admin

import "time"

// SetRequestTimeout shortens the bound of one admin request (requestTimeout) until the
// returned func restores it: a test of what is answered past it need not wait a minute.
func SetRequestTimeout(d time.Duration) (restore func()) {
	old := requestTimeout
	requestTimeout = d
	return func() { requestTimeout = old }
}
