package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// callerCausedInfoLines are the INFO lines of the proxy that a caller's own requests cause,
// the gateway, its stores and the provider all working: README's log paragraph names each,
// so an operator asked about one knows what it means. infoLinesOfFailures are the others, a
// store or Redis that failed or answered late. Every INFO line the proxy writes is in one of
// the two: a new one must be placed, and, when a caller causes it, documented.
var (
	callerCausedInfoLines = []string{
		"idempotent request replayed",
		"idempotent answer not stored: the key moved on to a later attempt while this one ran",
		"superseded idempotent attempt not recorded: the key moved on to a later attempt while it ran",
		"run cancelled: its session moved on",
		"billed at the price of the model that answered",
	}
	infoLinesOfFailures = []string{
		"the lost admission had held nothing",
		"lost admission released",
		"records of earlier answers not read; estimated from the request alone",
		"owner of an earlier answer not read; forwarded",
		"answer not recorded; a later request naming it is estimated without it",
		"run call recorded on a later try",
		"run call's record marked on a later try",
		"run tally written on a later try",
	}
)

// TestREADMELogsNameTheLinesACallerCauses: README's log paragraph named "request refused" as a
// refused call's line, but not "token count refused" nor "call ended before its answer", the
// same line under other messages (logRefusalAs), nor the INFO lines a caller's own requests
// cause (an Idempotency-Key replayed, a session's run replaced): an operator searching the log
// for a caller's 499 or a refused count found lines README never mentioned. Every message a
// refusal's line is written under (logRefusalAs, and relayUpstreamError's line for a caller
// that left) and every INFO line a caller causes must be named there, backquoted.
func TestREADMELogsNameTheLinesACallerCauses(t *testing.T) {
	refusals, infos := loggedMessages(t)
	if len(refusals) < 3 || len(infos) < 10 {
		t.Fatalf("found %d refusal messages and %d INFO lines; the source is no longer read as the test expects", len(refusals), len(infos))
	}
	for _, m := range infos {
		if !slices.Contains(callerCausedInfoLines, m) && !slices.Contains(infoLinesOfFailures, m) {
			t.Errorf("INFO line %q is in neither callerCausedInfoLines nor infoLinesOfFailures: place it (and document it if a caller causes it)", m)
		}
	}
	for _, m := range slices.Concat(callerCausedInfoLines, infoLinesOfFailures) {
		if !slices.Contains(infos, m) {
			t.Errorf("%q is listed as an INFO line, and the proxy writes no such INFO line", m)
		}
	}
	logs := readmeLogParagraph(t)
	for _, m := range slices.Concat(refusals, callerCausedInfoLines) {
		if !strings.Contains(logs, "`"+m+"`") {
			t.Errorf("README's log paragraph does not name the line %q, which a caller's request causes", m)
		}
	}
}

// loggedMessages reads the proxy's source for the messages of refusal lines (the literal
// message of each logRefusalAs and relayUpstreamError call) and of its INFO lines (the literal
// first argument of each .Info call).
func loggedMessages(t *testing.T) (refusals, infos []string) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	add := func(to *[]string, arg ast.Expr) {
		if m, ok := stringLit(arg); ok && !slices.Contains(*to, m) {
			*to = append(*to, m)
		}
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			switch fun := call.Fun.(type) {
			case *ast.Ident:
				if fun.Name == "logRefusalAs" && len(call.Args) > 1 {
					add(&refusals, call.Args[1])
				}
			case *ast.SelectorExpr:
				switch fun.Sel.Name {
				case "relayUpstreamError":
					add(&refusals, call.Args[len(call.Args)-1])
				case "Info":
					add(&infos, call.Args[0])
				}
			}
			return true
		})
	}
	return refusals, infos
}

// readmeLogParagraph is README's paragraph on the log, from "Logs are JSON lines" to the
// blank line that ends it.
func readmeLogParagraph(t *testing.T) string {
	t.Helper()
	return readmeText(t, "Logs are JSON lines", "\n\n")
}
