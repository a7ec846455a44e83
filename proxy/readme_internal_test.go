package proxy

import (
	"os"
	"strings"
	"testing"
)

// readmeText is the part of README a test holds the code to: from the line that begins with
// begin up to the first end after it (not included), or to README's end when none follows.
// The test fails when README cannot be read or has no such line.
func readmeText(t *testing.T, begin, end string) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start := strings.Index(readme, "\n"+begin)
	if start < 0 {
		t.Fatalf("README has no line beginning %q", begin)
	}
	text := readme[start+1:]
	if i := strings.Index(text, end); i >= 0 {
		text = text[:i]
	}
	return text
}
