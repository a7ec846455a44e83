//go:build race

package e2e

// testsUnderRace: this test binary was built with -race, so the gateway it runs is too.
const testsUnderRace = true
