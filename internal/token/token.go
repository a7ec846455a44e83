// Package token makes the random values the gateway marks its own work with: run ids, and the
// tokens that let a retry after a lost database or Redis reply recognise what its earlier
// attempt wrote (admissions, settlements, grants, a run's close mark).
package token

import (
	"crypto/rand"
	"encoding/hex"
)

// New is 128 random bits in hex: 32 characters, the width of the token columns (CHAR(32)).
func New() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on the systems Go supports
	}
	return hex.EncodeToString(b[:])
}
