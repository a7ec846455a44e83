package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// dispatchedCommands are the commands run() dispatches, read from its switch in main.go (not
// a list kept here): the ones an operator can type.
func dispatchedCommands(t *testing.T) []string {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, decl := range file.Decls {
		if fn, ok := decl.(*ast.FuncDecl); ok && fn.Name.Name == "run" {
			ast.Inspect(fn, func(n ast.Node) bool {
				if cc, ok := n.(*ast.CaseClause); ok {
					for _, e := range cc.List {
						if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
							if s, _ := strconv.Unquote(lit.Value); s != "help" && !strings.HasPrefix(s, "-") {
								cmds = append(cmds, s)
							}
						}
					}
				}
				return true
			})
		}
	}
	if len(cmds) < 10 {
		t.Fatalf("found only %v in run's switch", cmds)
	}
	return cmds
}

// helpChild names the commands whose -h a child process of the test binary is to print (see
// commandFlags), one to a line.
const helpChild = "TOLLGATE_TEST_HELP_OF"

// printHelpOf is the child's part: each command's -h (the flag package writes it to stderr),
// after a line naming the command. A child, so that no test swaps os.Stderr under goroutines
// other tests left writing to it.
func printHelpOf(cmds string) {
	for _, cmd := range strings.Split(cmds, "\n") {
		fmt.Fprintf(os.Stderr, "== %s\n", cmd)
		if err := run(append(strings.Fields(cmd), "-h")); !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "!! %v\n", err)
		}
	}
}

// commandFlags is the flags each of commands declares, as its -h lists them, -config and
// -debug aside: every command has those.
func commandFlags(t *testing.T, commands []string) map[string][]string {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^TestHelpListsEveryCommandWithItsFlags$", "-test.count=1")
	child.Env = append(os.Environ(), helpChild+"="+strings.Join(commands, "\n"), "MYSQL_DSN=nobody@tcp(127.0.0.1:1)/none")
	var stderr strings.Builder
	child.Stderr = &stderr
	if err := child.Run(); err != nil {
		t.Fatalf("the child printing -h: %v\n%s", err, stderr.String())
	}
	flags := map[string][]string{}
	cmd := ""
	for _, line := range strings.Split(stderr.String(), "\n") {
		if c, ok := strings.CutPrefix(line, "== "); ok {
			cmd = c
			flags[cmd] = []string{}
		} else if e, ok := strings.CutPrefix(line, "!! "); ok {
			t.Fatalf("gateway %s -h: %s, want its flags listed", cmd, e)
		} else if m := regexp.MustCompile(`^  -([a-z][a-z0-9-]*)`).FindStringSubmatch(line); m != nil && cmd != "" && m[1] != "config" && m[1] != "debug" {
			flags[cmd] = append(flags[cmd], m[1])
		}
	}
	for _, c := range commands {
		if _, ok := flags[c]; !ok {
			t.Fatalf("the child printed no -h of %s:\n%s", c, stderr.String())
		}
	}
	return flags
}

// namedFlags is the flags a text names (-name, [-plan P], -a|-b), not a minus sign or a
// word's hyphen.
func namedFlags(text string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?:^|[\s\[(|,])-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(text, -1) {
		out = append(out, m[1])
	}
	return out
}

// helpEntries splits the help's command list into each command's entry: its line and the
// lines indented under it, up to the next command.
func helpEntries(t *testing.T) map[string]string {
	t.Helper()
	list, _, ok := strings.Cut(usage, "\nEvery command reads")
	if !ok {
		t.Fatal("help does not say what every command reads")
	}
	entries := map[string]string{}
	current := ""
	start := regexp.MustCompile(`^  ([a-z][a-z-]*(?: [a-z]+)?)(?:\s{2,}|$)`)
	for _, line := range strings.Split(list, "\n") {
		if m := start.FindStringSubmatch(line); m != nil {
			current = m[1]
			entries[current] = line[len(m[0]):]
		} else if current != "" {
			entries[current] += "\n" + line
		}
	}
	return entries
}

// TestHelpListsEveryCommandWithItsFlags: README sends an operator to `gateway help` for "every
// command with all its flags". Every command run() dispatches must have its entry there, every
// flag the command declares must be in its entry, and every flag the entry names must be one
// the command declares (or, in a note on several commands, one of those it names): a flag
// added to a command and not to the help is one no operator finds, and one renamed in the code
// and not in the help is refused when typed as written.
func TestHelpListsEveryCommandWithItsFlags(t *testing.T) {
	if cmds := os.Getenv(helpChild); cmds != "" {
		printHelpOf(cmds) // this process is commandFlags' child
		return
	}
	entries := helpEntries(t)
	flags := commandFlags(t, dispatchedCommands(t))
	for cmd, declared := range flags {
		entry, ok := entries[cmd]
		if !ok {
			t.Errorf("gateway %s: no entry in the help", cmd)
			continue
		}
		named := namedFlags(entry)
		for _, f := range declared {
			if !slices.Contains(named, f) {
				t.Errorf("gateway %s declares -%s; its help entry does not name it:\n%s", cmd, f, entry)
			}
		}
		for _, f := range named {
			if f != "config" && f != "debug" && !slices.Contains(declared, f) && !flagOfACommandNamed(flags, cmd, entry, f) {
				t.Errorf("gateway %s's help entry names -%s, which it does not declare:\n%s", cmd, f, entry)
			}
		}
	}
	for cmd := range entries {
		if _, ok := flags[cmd]; !ok {
			t.Errorf("the help lists %q, which run() does not dispatch", cmd)
		}
	}
}

// flagOfACommandNamed reports whether f is a flag of a command other than self that text names
// ("user list", or "user show|set" for user show and user set).
func flagOfACommandNamed(flags map[string][]string, self, text, f string) bool {
	words := map[string]bool{}
	for _, w := range regexp.MustCompile(`[a-z][a-z-]*`).FindAllString(text, -1) {
		words[w] = true
	}
	for cmd, declared := range flags {
		if cmd == self || !slices.Contains(declared, f) {
			continue
		}
		named := true
		for _, w := range strings.Fields(cmd) {
			named = named && words[w]
		}
		if named {
			return true
		}
	}
	return false
}

// TestREADMECommandsNameRealFlags: README's "Operating it" lists the commands an operator runs;
// each flag a line of it names must be a flag of a command the line names, and the help's list
// of the environment must be README's table of it.
func TestREADMECommandsNameRealFlags(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	flags := commandFlags(t, dispatchedCommands(t))
	for cmd := range flags {
		flags[cmd] = append(flags[cmd], "config", "debug")
	}
	// A command line of its blocks (gateway ..., bin/gateway ...), or one quoted in its prose.
	var lines []string
	for _, line := range strings.Split(readme, "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(line), "bin/")
		if rest, ok := strings.CutPrefix(line, "gateway "); ok {
			lines = append(lines, rest)
		}
	}
	for _, m := range regexp.MustCompile("`(?:bin/)?gateway ([^`]*)`").FindAllStringSubmatch(readme, -1) {
		lines = append(lines, m[1])
	}
	for _, rest := range lines {
		for _, f := range namedFlags(rest) {
			if !flagOfACommandNamed(flags, "", rest, f) {
				t.Errorf("README: \"gateway %s\" names -%s, no command there has it", rest, f)
			}
		}
	}
	if len(lines) < 20 {
		t.Errorf("README has %d command lines (gateway ...): has its command block moved?", len(lines))
	}
	// A flag quoted alone in the prose (`-days`) is some command's.
	for _, m := range regexp.MustCompile("`-([a-z][a-z0-9-]*)[^`]*`").FindAllStringSubmatch(readme, -1) {
		if !flagOfACommandNamed(flags, "", strings.Join(slices.Collect(maps.Keys(flags)), " "), m[1]) {
			t.Errorf("README quotes %s; no command has -%s", m[0], m[1])
		}
	}

	// The environment: README's table rows, and the help's "and the environment: A, B, ...".
	var table []string
	if _, after, ok := strings.Cut(readme, "\n| variable | sets |\n"); ok {
		for _, row := range strings.Split(after, "\n") {
			cells := strings.Split(row, "|")
			if len(cells) < 3 {
				break
			}
			for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9_]*)`").FindAllStringSubmatch(cells[1], -1) {
				table = append(table, m[1])
			}
		}
	}
	_, env, _ := strings.Cut(usage, "the environment:")
	env, _, _ = strings.Cut(env, ".")
	help := regexp.MustCompile(`[A-Z][A-Z0-9_]+`).FindAllString(env, -1)
	slices.Sort(table)
	slices.Sort(help)
	if len(table) == 0 || !slices.Equal(table, help) {
		t.Errorf("gateway help names the environment %v; README's table %v", help, table)
	}
}

// TestComposeRunsTheCurrentCLI: docker-compose.yml (which README's `docker compose up` runs,
// and no test starts) runs the gateway image's commands; each must be a command run() still
// dispatches, with flags it declares, and each variable it sets for them one the gateway reads
// (README's table), or the stack breaks, or silently runs on defaults, at the next rename.
// `docker compose run --rm migrate demo-setup` (README, and the file's own header) runs the
// migrate service's image with that command. The migrate service runs as the image's
// MYSQL_USER, which owns the schema, and the gateway serves the same database as another
// account (DML only: TestComposeServesAsADMLOnlyAccount).
func TestComposeRunsTheCurrentCLI(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	compose := readCompose(t)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(readme), "\n| variable | sets |\n")
	table, _, _ = strings.Cut(table, "\n\n")
	flags := commandFlags(t, dispatchedCommands(t))
	for cmd := range flags {
		flags[cmd] = append(flags[cmd], "config", "debug")
	}
	check := func(where string, args []string) {
		t.Helper()
		cmd, rest := "", args
		for _, c := range slices.Sorted(maps.Keys(flags)) {
			if words := strings.Fields(c); len(args) >= len(words) && slices.Equal(args[:len(words)], words) && len(words) > len(strings.Fields(cmd)) {
				cmd, rest = c, args[len(words):]
			}
		}
		if cmd == "" {
			t.Errorf("%s runs gateway %v: no such command", where, args)
			return
		}
		for _, a := range rest {
			if f, ok := strings.CutPrefix(a, "-"); ok && !slices.Contains(flags[cmd], strings.SplitN(strings.TrimPrefix(f, "-"), "=", 2)[0]) {
				t.Errorf("%s runs gateway %s with %s, which it does not declare", where, cmd, a)
			}
		}
	}
	gateways := 0
	for name, s := range compose.Services {
		if s.Image != "tollgate:local" || len(s.Entrypoint) > 0 {
			continue // MySQL, Redis, and fakellm (the image's other binary)
		}
		gateways++
		check("docker-compose.yml's "+name, s.Command)
		for v := range s.Environment {
			if !strings.Contains(table, "`"+v+"`") {
				t.Errorf("docker-compose.yml's %s sets %s, which the gateway does not read (README's table has no row for it)", name, v)
			}
		}
	}
	if gateways < 2 {
		t.Errorf("docker-compose.yml runs %d services of the gateway image; want migrate and gateway at least", gateways)
	}
	db := compose.Services["mysql"]
	serveDSN, err := mysql.ParseDSN(compose.Services["gateway"].Environment["MYSQL_DSN"])
	if err != nil {
		t.Fatalf("docker-compose.yml's gateway MYSQL_DSN: %v", err)
	}
	migrateDSN, err := mysql.ParseDSN(compose.Services["migrate"].Environment["MYSQL_DSN"])
	if err != nil {
		t.Fatalf("docker-compose.yml's migrate MYSQL_DSN: %v", err)
	}
	if migrateDSN.User != db.Environment["MYSQL_USER"] || serveDSN.User == migrateDSN.User {
		t.Errorf("docker-compose.yml's migrate runs as %q and its gateway serves as %q; want migrate as the image's MYSQL_USER %q and the gateway as another account",
			migrateDSN.User, serveDSN.User, db.Environment["MYSQL_USER"])
	}
	if serveDSN.DBName != db.Environment["MYSQL_DATABASE"] || migrateDSN.DBName != db.Environment["MYSQL_DATABASE"] {
		t.Errorf("docker-compose.yml's gateway serves database %q and migrate migrates %q; its MySQL makes %q",
			serveDSN.DBName, migrateDSN.DBName, db.Environment["MYSQL_DATABASE"])
	}
	// The image's own default command (docker run tollgate:local).
	dockerfile, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^CMD (\[.*\])$`).FindSubmatch(dockerfile); m == nil {
		t.Error("Dockerfile has no CMD [...] line")
	} else {
		var args []string
		if err := json.Unmarshal(m[1], &args); err != nil {
			t.Fatalf("Dockerfile CMD %s: %v", m[1], err)
		}
		check("Dockerfile's CMD", args)
	}
	for _, m := range regexp.MustCompile(`docker compose run --rm migrate ([a-z -]+)`).FindAllStringSubmatch(string(raw)+string(readme), -1) {
		check("docker compose run --rm migrate", strings.Fields(m[1]))
	}
}
