package pricing

import (
	"reflect"
	"testing"
)

// TestUsageHasNegativeSeesEveryField: HasNegative is how the reconciler refuses a tally with
// impossible figures, so it must see each count of Usage, including one added after it was
// written: every int64 field is set negative in turn, by reflection, not by a list that could
// miss it.
func TestUsageHasNegativeSeesEveryField(t *testing.T) {
	if (Usage{}).HasNegative() {
		t.Fatal("zero usage reported negative")
	}
	typ := reflect.TypeOf(Usage{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() != reflect.Int64 {
			t.Fatalf("Usage.%s is a %s: extend HasNegative and this test to it", f.Name, f.Type)
		}
		var u Usage
		reflect.ValueOf(&u).Elem().Field(i).SetInt(-1)
		if !u.HasNegative() {
			t.Errorf("Usage{%s: -1}.HasNegative() = false", f.Name)
		}
		reflect.ValueOf(&u).Elem().Field(i).SetInt(1)
		if u.HasNegative() {
			t.Errorf("Usage{%s: 1}.HasNegative() = true", f.Name)
		}
	}
}
