package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestREADMEErrorsAgreeWithTheCodes holds README § Errors to the codes the gateway writes:
// every code of errorCodes (the model API's and the admin API's, the values of
// tollgate_error_answers_total's code label) is named there; every code the model API's table
// gives in its code column is one of them, since README says that label is "one of the
// gateway's own codes in the Errors table"; and each apiError the proxy writes with a constant
// status is documented under that status — in the row of the table that names its code, or as
// "STATUS `code`" in the section's text. A code added, renamed or given another status in the
// source without README following fails here.
func TestREADMEErrorsAgreeWithTheCodes(t *testing.T) {
	section := readmeErrorsSection(t)
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`(?:\\d{3} )?([a-z][a-z0-9_]*)`").FindAllStringSubmatch(section, -1) {
		named[m[1]] = true
	}
	for code := range errorCodes {
		if !named[code] {
			t.Errorf("errorCodes has %q, README § Errors does not name it", code)
		}
	}
	rows := readmeErrorRows(t, section)
	for code := range rows {
		if !errorCodes[code] {
			t.Errorf("README § Errors' table gives the code %q, which errorCodes does not have: the gateway writes no such code", code)
		}
	}
	written := writtenStatuses(t)
	if len(written) < 40 {
		t.Fatalf("found %d codes written with a constant status; the source is no longer read as the test expects", len(written))
	}
	for code, statuses := range written {
		for _, st := range statuses {
			if slices.Contains(rows[code], st) || strings.Contains(section, strconv.Itoa(st)+" `"+code+"`") {
				continue
			}
			t.Errorf("the proxy answers %q with status %d; README § Errors gives it %v", code, st, rows[code])
		}
	}
}

// readmeErrorsSection is README's "### Errors", up to the next "## " heading.
func readmeErrorsSection(t *testing.T) string {
	t.Helper()
	return readmeText(t, "### Errors\n", "\n## ")
}

// readmeErrorRows reads the Errors table: for each code its code column names (backquoted,
// outside the parentheses that explain it), the statuses of the rows naming it.
func readmeErrorRows(t *testing.T, section string) map[string][]int {
	t.Helper()
	rows := map[string][]int{}
	row := regexp.MustCompile(`^\| ([0-9, ]+) \| (.*?) \| `)
	code := regexp.MustCompile("`([a-z][a-z0-9_]*)`")
	for _, line := range strings.Split(section, "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var statuses []int
		for _, s := range strings.Split(m[1], ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				t.Fatalf("Errors table row %q: status %q", line, s)
			}
			statuses = append(statuses, n)
		}
		var outside strings.Builder
		depth := 0
		for _, r := range m[2] {
			switch {
			case r == '(':
				depth++
			case r == ')':
				depth--
			case depth == 0:
				outside.WriteRune(r)
			}
		}
		for _, c := range code.FindAllStringSubmatch(outside.String(), -1) {
			rows[c[1]] = append(rows[c[1]], statuses...)
		}
	}
	if len(rows) < 40 {
		t.Fatalf("read %d codes from README's Errors table; the table is no longer read as the test expects", len(rows))
	}
	return rows
}

// writtenStatuses finds, in the proxy's source, each apiError literal whose Status is a
// constant and the 400s errBadRequest writes: the statuses each code is answered with. A code
// built at run time ("invalid_"+field) or a status carried over from an upstream is left out.
func writtenStatuses(t *testing.T) map[string][]int {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int{}
	add := func(code string, st int) {
		if !slices.Contains(out[code], st) {
			out[code] = append(out[code], st)
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
			switch n := n.(type) {
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "errBadRequest" && len(n.Args) > 0 {
					if code, ok := stringLit(n.Args[0]); ok {
						add(code, http.StatusBadRequest)
					}
				}
			case *ast.CompositeLit:
				if id, ok := n.Type.(*ast.Ident); !ok || id.Name != "apiError" {
					return true
				}
				var code string
				status := 0
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					switch key := kv.Key.(*ast.Ident); {
					case key == nil:
					case key.Name == "Code":
						code, _ = stringLit(kv.Value)
					case key.Name == "Status":
						status = statusConst(t, fset, kv.Value)
					}
				}
				if code != "" && status != 0 {
					add(code, status)
				}
			}
			return true
		})
	}
	return out
}

// stringLit is the value of a string literal.
func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}

// statusConst is the value of a Status written as net/http's constant or statusClientClosed;
// 0 for one computed at run time (an upstream's own status).
func statusConst(t *testing.T, fset *token.FileSet, e ast.Expr) int {
	switch e := e.(type) {
	case *ast.Ident:
		if e.Name == "statusClientClosed" {
			return statusClientClosed
		}
	case *ast.SelectorExpr:
		if pkg, ok := e.X.(*ast.Ident); ok && pkg.Name == "http" {
			if st, ok := httpStatuses[e.Sel.Name]; ok {
				return st
			}
			t.Errorf("%s: http.%s is not in httpStatuses: add it", fset.Position(e.Pos()), e.Sel.Name)
		}
	}
	return 0
}

// httpStatuses are net/http's status constants the gateway answers with.
var httpStatuses = map[string]int{
	"StatusBadRequest": http.StatusBadRequest, "StatusUnauthorized": http.StatusUnauthorized,
	"StatusPaymentRequired": http.StatusPaymentRequired, "StatusForbidden": http.StatusForbidden,
	"StatusNotFound": http.StatusNotFound, "StatusMethodNotAllowed": http.StatusMethodNotAllowed,
	"StatusRequestTimeout": http.StatusRequestTimeout, "StatusConflict": http.StatusConflict,
	"StatusRequestEntityTooLarge": http.StatusRequestEntityTooLarge,
	"StatusUnsupportedMediaType":  http.StatusUnsupportedMediaType,
	"StatusUnprocessableEntity":   http.StatusUnprocessableEntity, "StatusTooManyRequests": http.StatusTooManyRequests,
	"StatusInternalServerError": http.StatusInternalServerError, "StatusBadGateway": http.StatusBadGateway,
	"StatusServiceUnavailable": http.StatusServiceUnavailable, "StatusGatewayTimeout": http.StatusGatewayTimeout,
}
