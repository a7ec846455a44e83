package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/pricing"
)

// loadModels loads a config whose models section is models.
func loadModels(t *testing.T, models string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	conf := "mysql_dsn: u:p@tcp(127.0.0.1:3306)/tollgate\nredis_url: redis://127.0.0.1:6379/0\nmodels:\n" + models
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return Load(path)
}

// A model's long_context block becomes the price of the calls past its line, its cache prices
// left out at its long input price as a model's are at its input price.
func TestLongContextPriceIsRead(t *testing.T) {
	cfg, err := loadModels(t, `  gemini-2.5-pro:
    input: "1.25"
    cache_read: "0.31"
    output: "10.00"
    long_context: {above_prompt_tokens: 200000, input: "2.50", cache_read: "0.625", output: "15.00"}
  claude-sonnet-4-5:
    input: "3.00"
    output: "15.00"
    long_context: {above_prompt_tokens: 200000, input: "6.00", output: "22.50"}
  gpt-4o: {input: "2.50", output: "10.00"}
`)
	if err != nil {
		t.Fatal(err)
	}
	prices, err := cfg.PriceTable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model string
		long  *pricing.Price
	}{
		{"gemini-2.5-pro", &pricing.Price{Input: 2_500_000, CacheRead: 625_000, CacheWrite: 2_500_000, Output: 15_000_000}},
		{"claude-sonnet-4-5", &pricing.Price{Input: 6_000_000, CacheRead: 6_000_000, CacheWrite: 6_000_000, Output: 22_500_000}},
		{"gpt-4o", nil},
	} {
		p, _, err := prices.Lookup(c.model)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case c.long == nil && p.Long != nil:
			t.Errorf("%s: a long-context price %+v from no long_context", c.model, *p.Long)
		case c.long != nil && (p.Long == nil || *p.Long != *c.long || p.LongAbove != 200_000):
			t.Errorf("%s: long context %+v above %d, want %+v above 200000", c.model, p.Long, p.LongAbove, *c.long)
		}
	}
}

// A long_context block without its line or its input or output price, or with one of them
// empty or its line a fraction, stops the start with the field named: any of them read as 0
// would bill long calls free or never.
func TestLongContextPriceMustBeWhole(t *testing.T) {
	for _, c := range []struct{ block, want string }{
		{`{input: "2.50", output: "15.00"}`, "models.m.long_context.above_prompt_tokens: line 7: is missing"},
		{`{above_prompt_tokens: 200000, output: "15.00"}`, "models.m.long_context.input: line 7: is missing"},
		{`{above_prompt_tokens: 200000, input: "2.50"}`, "models.m.long_context.output: line 7: is missing"},
		{`{above_prompt_tokens: 200000, input: "2.50", output: "15.00", cache_read: }`, "models.m.long_context.cache_read: line 7: is empty"},
		{`{above_prompt_tokens: 200000.5, input: "2.50", output: "15.00"}`, "not a whole number"},
		{`{above_prompt_tokens: 0, input: "2.50", output: "15.00"}`, "long-context line 0 prompt tokens outside"},
		{`{above_prompt_tokens: 200000, input: "2.50", output: "15.00", ouput: "1"}`, `unknown setting "ouput"`},
		{`"2.50"`, "line 7: cannot unmarshal"},
	} {
		_, err := loadModels(t, "  m:\n    input: \"1.25\"\n    output: \"10.00\"\n    long_context: "+c.block+"\n")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("long_context %s: error %v, want one containing %q", c.block, err, c.want)
		}
	}
}

// A model that prices one-hour cache writes or audio apart takes the long-context price of
// each too: left out, a long call's one-hour writes were billed at the long cache-write price
// and its audio at the long text price — Claude's 1M beta writes an hour's cache at 12 USD/M
// past 200 k, billed 7.50; audio at 40 USD/M short was billed 5 past the line, so a longer
// prompt cost less than a shorter one. Written, or not priced by the model, it starts.
func TestLongContextPricesTheModelsParts(t *testing.T) {
	for _, c := range []struct{ part, short, long, want string }{
		{"cache_write_1h", `cache_write_1h: "6.00"`, ``, "models.m.long_context.cache_write_1h: "},
		{"audio_input", `audio_input: "40.00"`, ``, "models.m.long_context.audio_input: "},
		{"audio_output", `audio_output: "80.00"`, ``, "models.m.long_context.audio_output: "},
		{"cache_write_1h written", `cache_write_1h: "6.00"`, `, cache_write_1h: "12.00"`, ""},
		{"audio_input written", `audio_input: "40.00"`, `, audio_input: "80.00"`, ""},
		{"not priced by the model", ``, ``, ""},
	} {
		models := "  m:\n    input: \"3.00\"\n    output: \"15.00\"\n"
		if c.short != "" {
			models += "    " + c.short + "\n"
		}
		models += `    long_context: {above_prompt_tokens: 200000, input: "6.00", output: "22.50"` + c.long + "}\n"
		_, err := loadModels(t, models)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.part, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want one naming %q", c.part, err, c.want)
		}
	}
}

// A long-context line left out is named once, where it is missing: the price table's own
// check of the 0 it decoded as said the same thing again under "models" alone. A line
// outside its range is named by its path, as every other setting is.
func TestLongContextLineNamedOnce(t *testing.T) {
	_, err := loadModels(t, "  m:\n    input: \"1.25\"\n    output: \"10.00\"\n    long_context: {input: \"2.50\", output: \"15.00\"}\n")
	if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), "models.m.long_context.above_prompt_tokens: line 7: is missing") {
		t.Errorf("line left out: error %q, want the one line naming it missing", err)
	}
	for _, line := range []string{"-3", "2000000000000"} {
		_, err := loadModels(t, "  m:\n    input: \"1.25\"\n    output: \"10.00\"\n    long_context: {above_prompt_tokens: "+line+", input: \"2.50\", output: \"15.00\"}\n")
		if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.HasPrefix(err.Error(), "models.m.long_context.above_prompt_tokens: ") {
			t.Errorf("line %s: error %q, want one naming models.m.long_context.above_prompt_tokens", line, err)
		}
	}
}

// A long-context line written empty is refused without the advice to write 0, which is no
// line (0 stops the start in turn): its error names what to write instead.
func TestLongContextEmptyLineNotTold0(t *testing.T) {
	_, err := loadModels(t, "  m:\n    input: \"1.25\"\n    output: \"10.00\"\n    long_context: {above_prompt_tokens: , input: \"2.50\", output: \"15.00\"}\n")
	if err == nil || !strings.Contains(err.Error(), "models.m.long_context.above_prompt_tokens: line 7: is empty") || strings.Contains(err.Error(), "write 0") {
		t.Errorf("empty line: error %v, want it named empty without \"write 0\"", err)
	}
}
