package config

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// README "Configuration" says config.example.yaml lists every setting: an operator looks a
// setting up there. Each one must be written in it as a setting (`name:`, commented out where
// it has no value to show), not only mentioned in prose, or a new setting lands in the code
// and nowhere an operator reads.
func TestExampleListsEverySetting(t *testing.T) {
	raw, err := os.ReadFile("../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type, string)
	walk = func(ty reflect.Type, at string) {
		switch ty.Kind() {
		case reflect.Map, reflect.Slice:
			walk(ty.Elem(), at)
			return
		case reflect.Struct:
		default:
			return
		}
		if seen[ty] || ty.PkgPath() != reflect.TypeOf(Config{}).PkgPath() {
			return // a setting's own value type (Credits, USDPerM) is no section
		}
		seen[ty] = true
		for i := range ty.NumField() {
			f := ty.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if tag == "" || tag == "-" {
				continue
			}
			written := regexp.MustCompile(`(?m)^[ \t]*(#[ \t]*)?(-[ \t]+)?` + regexp.QuoteMeta(tag) + `:`)
			if !written.Match(raw) {
				t.Errorf("%s%s is not listed in config.example.yaml", at, tag)
			}
			walk(f.Type, at+tag+".")
		}
	}
	walk(reflect.TypeOf(Config{}), "")
}
