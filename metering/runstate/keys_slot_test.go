package runstate_test

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/metering/runstate"
)

// hashTag is the part of key Redis Cluster hashes to pick its slot: the text between the first
// "{" and the first "}" after it, when that is not empty; else the whole key.
func hashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return key
	}
	return key[open+1 : open+1+end]
}

// TestEveryKeyIsTaggedWithItsOwner: DESIGN §9 — every Redis key of a run puts the run id in
// braces, Redis Cluster's hash tag, so the keys of one run share a slot and the scripts that
// touch several of them (a named run's reserve and release, a lease's beat and release) work
// unchanged on Cluster. Every method of Keys that names a key by an id (a run's, or a
// user's for the per-user keys) is found by reflection, so a key added later is held to it too;
// the key's hash tag must be that id, with a deployment's prefix or without.
func TestEveryKeyIsTaggedWithItsOwner(t *testing.T) {
	const id, other = "r_8f3a:x.y-z", "call-7"
	const user = uint64(42)
	checked := 0
	for _, prefix := range []string{"", "tollgate-test-1:"} {
		k := reflect.ValueOf(runstate.Keys{Prefix: prefix})
		kt := k.Type()
		for i := 0; i < kt.NumMethod(); i++ {
			m := kt.Method(i)
			ft := m.Type // the receiver is its first parameter
			if ft.NumOut() != 1 || ft.Out(0).Kind() != reflect.String || ft.NumIn() < 2 {
				continue // ReconcileLock: one key of the deployment, no owner
			}
			var args []reflect.Value
			var owner string
			switch ft.In(1).Kind() {
			case reflect.String:
				args, owner = []reflect.Value{reflect.ValueOf(id)}, id
			case reflect.Uint64:
				args, owner = []reflect.Value{reflect.ValueOf(user)}, strconv.FormatUint(user, 10)
			default:
				t.Errorf("Keys.%s: an owner of type %s this test does not know", m.Name, ft.In(1))
				continue
			}
			for j := 2; j < ft.NumIn(); j++ {
				if ft.In(j).Kind() != reflect.String {
					t.Fatalf("Keys.%s: parameter %d of type %s this test does not know", m.Name, j, ft.In(j))
				}
				args = append(args, reflect.ValueOf(other))
			}
			key := k.Method(i).Call(args)[0].String()
			if !strings.HasPrefix(key, prefix) {
				t.Errorf("Keys.%s with prefix %q: %q", m.Name, prefix, key)
			}
			if tag := hashTag(key); tag != owner {
				t.Errorf("Keys.%s: key %q hashes by %q, want its owner %q in braces", m.Name, key, tag, owner)
			}
			checked++
		}
	}
	if checked < 2*10 {
		t.Fatalf("only %d keys checked: Keys lost its methods?", checked)
	}
}
