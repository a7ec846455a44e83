package runstate_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering/runstate"
)

// scriptCalls are the methods that send a script with its keys: redis.Script's, and a
// Pipeliner's or client's own EVAL.
var scriptCalls = map[string]bool{"Run": true, "RunRO": true, "Eval": true, "EvalSha": true, "EvalRO": true, "EvalShaRO": true}

// TestEveryScriptsKeysShareTheirOwner: a Redis Cluster refuses a script whose keys are in more
// than one hash slot (CROSSSLOT), where one server runs it. Every script the gateway sends
// (found in its source, tests aside) names its keys as a []string literal of Keys calls, and
// the calls of one script name one owner, the same expression (a run id, a user id): each key
// carries its owner as its hash tag (TestEveryKeyIsTaggedWithItsOwner), so they share a slot.
// A script added with the key of another owner — a user's fingerprint beside a run's tally —
// fails here, as would one whose keys this test cannot read.
func TestEveryScriptsKeysShareTheirOwner(t *testing.T) {
	keyMethods := map[string]bool{}
	kt := reflect.TypeOf(runstate.Keys{})
	for i := 0; i < kt.NumMethod(); i++ {
		if m := kt.Method(i); m.Type.NumIn() >= 2 { // ReconcileLock names no owner
			keyMethods[m.Name] = true
		}
	}
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	multi := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if vs, ok := n.(*ast.ValueSpec); ok {
				for i, v := range vs.Values {
					if c, ok := v.(*ast.CallExpr); ok && types.ExprString(c.Fun) == "redis.NewScript" && !strings.HasSuffix(vs.Names[i].Name, "Script") {
						t.Errorf("%s: script %s: name it ...Script, so that this test finds where it is sent", fset.Position(vs.Pos()), vs.Names[i].Name)
					}
				}
				return true
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !scriptCalls[sel.Sel.Name] || len(call.Args) < 3 {
				return true
			}
			// A Script's methods (its var is named ...Script), or a client's or pipeline's EVAL:
			// the keys are the third argument of each.
			if id, ok := sel.X.(*ast.Ident); !strings.HasPrefix(sel.Sel.Name, "Eval") && !(ok && strings.HasSuffix(id.Name, "Script")) {
				return true
			}
			at := fset.Position(call.Pos())
			keys, ok := call.Args[2].(*ast.CompositeLit)
			if !ok || types.ExprString(keys.Type) != "[]string" {
				t.Errorf("%s: %s sends keys this test cannot read: name them as a []string literal of Keys calls", at, types.ExprString(call.Fun))
				return true
			}
			if len(keys.Elts) < 2 {
				return true
			}
			multi++
			owner := ""
			for _, e := range keys.Elts {
				kc, ok := e.(*ast.CallExpr)
				var method string
				if ok {
					if s, ok := kc.Fun.(*ast.SelectorExpr); ok {
						method = s.Sel.Name
					}
				}
				if !keyMethods[method] || len(kc.Args) == 0 {
					t.Errorf("%s: script key %s is not a Keys call naming its owner", at, types.ExprString(e))
					continue
				}
				o := types.ExprString(kc.Args[0])
				if owner == "" {
					owner = o
				} else if o != owner {
					t.Errorf("%s: script keys of two owners, %s and %s: in two hash slots on a Cluster", at, owner, o)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// reserve, release, close; a lease's beat and its release (alone and in a pipeline).
	if multi < 6 {
		t.Fatalf("only %d multi-key scripts found: the scan lost its way?", multi)
	}
}
