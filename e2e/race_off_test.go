//go:build !race

package e2e

// testsUnderRace: this test binary was built without -race.
const testsUnderRace = false
