package config

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readmeConfiguration is README's "Configuration" section: what an operator reads for the
// settings and the environment.
func readmeConfiguration(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	start := strings.Index(readme, "\n## Configuration\n")
	if start < 0 {
		t.Fatal(`README has no "## Configuration" section`)
	}
	section := readme[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	return section
}

// TestEveryVariableReadIsInTheREADMETable: README's environment table is the list of what the
// environment sets, and TestEveryREADMEVariableOverridesItsSetting holds each row to the code.
// This holds the other way: a variable applyEnv reads (found by the names it asks for, not a
// list kept here) must have its row, and a row must name a variable it reads; config.example.yaml,
// which says secrets and addresses come from the environment, must name it too.
func TestEveryVariableReadIsInTheREADMETable(t *testing.T) {
	read := map[string]bool{}
	Default().applyEnv(func(name string) string { read[name] = true; return "" })

	var rows []string
	inTable := false
	for _, line := range strings.Split(readmeConfiguration(t), "\n") {
		if strings.HasPrefix(line, "| variable |") {
			inTable = true
			continue
		}
		if inTable && !strings.HasPrefix(line, "|") {
			break
		}
		if cells := strings.Split(line, "|"); inTable && len(cells) > 2 {
			for _, m := range regexp.MustCompile("`([A-Z][A-Z0-9_]*)`").FindAllStringSubmatch(cells[1], -1) {
				rows = append(rows, m[1])
			}
		}
	}
	if len(rows) == 0 {
		t.Fatal("README's Configuration section has no environment table (| variable | sets |)")
	}
	example, err := os.ReadFile("../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range sortedKeys(read) {
		if !slices.Contains(rows, name) {
			t.Errorf("the gateway reads %s; README's environment table has no row for it", name)
		}
		if !regexp.MustCompile(`\b` + name + `\b`).Match(example) {
			t.Errorf("the gateway reads %s; config.example.yaml does not name it", name)
		}
	}
	for _, name := range rows {
		if !read[name] {
			t.Errorf("README's environment table names %s; the gateway does not read it", name)
		}
	}
}

// TestREADMEStatedDefaultsAreTheCodes: README gives a setting's default beside its name, as
// "`dedup.window` (5 s)" or "`limits.max_body_memory` (512 MiB, ...)", in a dozen places; each
// must be the default in force — Default()'s value, or what a 0 there derives (a body bound, a
// dead-instance bound) — or an operator sizes Redis or reads an incident by a number the code
// does not use.
func TestREADMEStatedDefaultsAreTheCodes(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	inForce := map[string]any{}
	for _, section := range []any{d.Limits, d.Holds, d.Dedup} {
		v := reflect.ValueOf(section)
		for i := range v.NumField() {
			tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("yaml"), ",")
			inForce[tag] = v.Field(i).Interface()
		}
	}
	bodyTotal, bodyPerCaller := d.Limits.BodyMemoryBounds()
	inForce["max_body_memory"], inForce["max_body_memory_per_caller"] = bodyTotal, bodyPerCaller
	inForce["max_response_memory"] = d.Limits.ResponseMemoryBound()
	inForce["max_response_memory_per_caller"] = d.Limits.ResponseMemoryPerCaller()
	inForce["max_replay_bytes_per_caller"] = d.Dedup.ReplayBytesPerCaller()
	inForce["dead_instance_after"] = d.Holds.DeadInstanceBound()

	units := map[string]float64{"ms": float64(time.Millisecond), "s": float64(time.Second), "min": float64(time.Minute),
		"h": float64(time.Hour), "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
	stated := regexp.MustCompile("`(?:(?:limits|holds|dedup)\\.)?([a-z0-9_]+)`[^`(\n]{0,3}\\(([0-9][0-9.]*) (ms|s|min|h|KiB|MiB|GiB)\\b")
	checked := 0
	for _, m := range stated.FindAllStringSubmatch(string(raw), -1) {
		want, ok := inForce[m[1]]
		if !ok {
			continue // not a setting (an error code's range, a server variable)
		}
		n, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("%s: %v", m[0], err)
		}
		checked++
		var got int64
		switch w := want.(type) {
		case time.Duration:
			got = int64(w)
		case int64:
			got = w
		case int:
			got = int64(w)
		default:
			t.Errorf("README states %q: %s is a %T, not a duration or a size", m[0], m[1], want)
			continue
		}
		if stated := int64(n * units[m[3]]); stated != got {
			t.Errorf("README states %q; the default in force is %v", m[0], want)
		}
	}
	if checked < 10 {
		t.Errorf("only %d defaults found stated in README: has the way it states them changed?", checked)
	}
}

// TestREADMENamesRealSettings: README names settings by their section (`holds.tally_ttl`) in
// a hundred places, the Known limits and alerts among them; each must be a setting of that
// section, or a renamed one leaves the operator looking for a name the file refuses.
func TestREADMENamesRealSettings(t *testing.T) {
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]reflect.Type{"limits": reflect.TypeOf(Limits{}), "holds": reflect.TypeOf(Holds{}), "dedup": reflect.TypeOf(Dedup{})}
	named := 0
	for _, m := range regexp.MustCompile("`(limits|holds|dedup)\\.([a-z0-9_]+)").FindAllStringSubmatch(string(raw), -1) {
		named++
		ty, found := sections[m[1]], false
		for i := range ty.NumField() {
			tag, _, _ := strings.Cut(ty.Field(i).Tag.Get("yaml"), ",")
			found = found || tag == m[2]
		}
		if !found {
			t.Errorf("README names %s.%s, which is no setting", m[1], m[2])
		}
	}
	if named < 20 {
		t.Errorf("README names only %d settings by their section: has the way it names them changed?", named)
	}
}
