// Package layout holds the packages to DESIGN §1's dependency arrows. It has tests only.
package layout

import (
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/tollgate/tollgate"

// TestDependenciesPointOneWay: DESIGN §1 — cmd -> proxy -> {holds, metering, pricing,
// config}, metering -> pricing; holds never imports proxy or metering (the reconciler gets
// usage through an interface cmd wires); pricing is pure, with no I/O. Go refuses a cycle, not
// an arrow the wrong way that makes none yet (holds importing metering), which would make the
// next arrow the design needs impossible. Each package's own (non-test) imports are read from
// its files.
func TestDependenciesPointOneWay(t *testing.T) {
	// forbidden lists, for the packages under a path of the module (its subpackages too),
	// the imports they must not have: module paths (subpackages included) and, for pricing,
	// the standard library's I/O. Only cmd imports proxy; nothing imports cmd.
	forbidden := map[string][]string{
		"pricing":  {module, "net", "os", "io", "database/sql", "bufio"},
		"metering": {module + "/proxy", module + "/cmd"},
		"holds":    {module + "/proxy", module + "/metering", module + "/cmd"},
		"config":   {module + "/proxy", module + "/cmd"},
		"admin":    {module + "/proxy", module + "/cmd"},
		"internal": {module + "/proxy", module + "/cmd"},
		"proxy":    {module + "/cmd"},
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		top, _, _ := strings.Cut(rel, "/")
		rules, ok := forbidden[top]
		if !ok {
			return nil
		}
		pkg, err := build.ImportDir(path, 0)
		if _, none := err.(*build.NoGoError); none {
			return nil
		}
		if err != nil {
			return err
		}
		seen[top] = true
		for _, imp := range pkg.Imports {
			for _, bad := range rules {
				if imp == bad || strings.HasPrefix(imp, bad+"/") {
					t.Errorf("%s imports %s: DESIGN §1 has no such arrow", rel, imp)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for top := range forbidden {
		if !seen[top] {
			t.Errorf("no package found under %s: the test no longer sees the layout", top)
		}
	}
}

// TestREADMELayoutNamesEveryPackage: README § Layout says which directory holds what, and its
// dependency paragraph names the arrows; a package added to the tree (internal/jsontop was
// missing from both) must be placed there too. Every directory holding Go files, tests only
// included, is named in the Layout block: by its path (cmd/gateway/, e2e/), or, under
// internal/, by its own name in internal/'s entry.
func TestREADMELayoutNamesEveryPackage(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)\n## Layout\n\n```\n(.*?)\n```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("README has no ## Layout section opening with a code block")
	}
	layout := string(block[1])
	internalEntry := regexp.MustCompile(`(?ms)^internal/ .*?\n(?:[a-z])`).FindString(layout)
	if internalEntry == "" {
		t.Fatal("README's Layout block has no internal/ entry")
	}
	dirs := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			dirs[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 15 {
		t.Fatalf("found %d directories of Go files; the walk no longer sees the tree", len(dirs))
	}
	for dir := range dirs {
		if name, under := strings.CutPrefix(dir, "internal/"); under {
			if !regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\b`).MatchString(internalEntry) {
				t.Errorf("%s is not named in README Layout's internal/ entry", dir)
			}
			continue
		}
		if !regexp.MustCompile(`(^|[\s,])` + regexp.QuoteMeta(dir) + `(/|[\s,]|$)`).MatchString(layout) {
			t.Errorf("%s is not named in README's Layout block", dir)
		}
	}
}
