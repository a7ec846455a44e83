package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// loadYAML loads body (after a working DSN and Redis URL) as a config file.
func loadYAML(t *testing.T, body string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("mysql_dsn: x@tcp(h:1)/d\nredis_url: redis://h:1/0\n"+body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URL", "")
	t.Setenv("MYSQL_DSN", "")
	t.Setenv("UPSTREAM_URL", "")
	t.Setenv("UPSTREAM_API_KEY", "")
	return Load(path)
}

// An upstream's base_url is joined as base_url + "/v1/chat/completions" (and the caller's
// query): a query or fragment in it makes every call's URL wrong, a base_url that already ends
// in /v1 (what OpenAI's SDKs call their base URL) sends every call to /v1/v1/... and the
// provider's 404 is passed through to callers as theirs, and credentials in it go to the
// provider as basic auth and into error messages. Each must stop the start, naming the
// setting and not printing the credentials.
func TestUpstreamBaseURLShapeIsChecked(t *testing.T) {
	for _, tc := range []struct{ base, want string }{
		{"https://llm.internal/openai?api-version=2024-06-01", "query"},
		{"https://llm.internal/openai#frag", "fragment"},
		{"https://api.openai.com/v1", "/v1"},
		{"https://api.openai.com/v1/", "/v1"},
		{"https://svc:hunter2-upstream@llm.internal", "credentials"},
		{"https://hunter2-token@llm.internal", "credentials"},
		{"https://generativelanguage.googleapis.com/?key=hunter2-upstream", "query"},
		{"https://api.openai.com/v1?key=hunter2-upstream", "query"},
		{"ftp://llm.internal/?key=hunter2-upstream", "http(s)"},
	} {
		t.Run(tc.base, func(t *testing.T) {
			_, err := loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: "+tc.base+"\n    models: ['*']\n")
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), "upstreams[0].base_url") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name upstreams[0].base_url and %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error prints the credentials: %v", err)
			}
		})
	}
	for _, base := range []string{"https://api.openai.com", "https://api.openai.com/", "https://openrouter.ai/api", "http://127.0.0.1:9090"} {
		if _, err := loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: "+base+"\n    models: ['*']\n"); err != nil {
			t.Errorf("base_url %s refused: %v", base, err)
		}
	}
}

// api_key_env names an environment variable. An operator who pastes the key itself there (a
// common slip: the field is next to base_url) got "environment variable sk-... is empty": the
// key printed to stderr and from there to the deployment's logs.
func TestAPIKeyEnvThatIsNotAVariableNameIsRefusedWithoutPrintingIt(t *testing.T) {
	_, err := loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: https://api.openai.com\n    api_key_env: sk-proj-hunter2secret\n    models: ['*']\n")
	if err == nil || !strings.Contains(err.Error(), "upstreams[0].api_key_env") {
		t.Fatalf("error %v, want it to name upstreams[0].api_key_env", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error prints what may be the key itself: %v", err)
	}
	// A key made only of letters, digits and '_' (Groq's gsk_..., Mistral's) is a valid
	// variable name, unset: "environment variable gsk_... is empty" printed it.
	_, err = loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: https://api.openai.com\n    api_key_env: gsk_hunter2Secret9xQ\n    models: ['*']\n")
	if err == nil || !strings.Contains(err.Error(), "upstreams[0].api_key_env") {
		t.Fatalf("key-shaped variable name: error %v, want it to name upstreams[0].api_key_env", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error prints what may be the key itself: %v", err)
	}
	// A proper name that is unset is still named, so the operator knows what to export.
	_, err = loadYAML(t, "upstreams:\n  - name: a\n    kind: openai\n    base_url: https://api.openai.com\n    api_key_env: TOLLGATE_TEST_UNSET_KEY\n    models: ['*']\n")
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_TEST_UNSET_KEY") {
		t.Errorf("unset variable: error %v, want it to name TOLLGATE_TEST_UNSET_KEY", err)
	}
}

// A price or a plan amount left out (or left empty: `input:`) decoded as 0: a model whose
// output was never priced served its output free, and a plan without allowance_credits gave
// no daily allowance, both without a word at start. Zero written out is still accepted. The
// error says to write 0 only where 0 is accepted: left out, a hold or a count of calls was
// told "write 0 if 0 is meant", and 0 was refused in turn.
func TestMoneyFieldsLeftOutAreRefused(t *testing.T) {
	plan := func(skip string) string {
		out := "plans:\n  pro:\n"
		for _, l := range []string{"allowance_credits: 2000", "hold_normal_credits: 20", "hold_heavy_credits: 60",
			"heavy_after_turns: 4", "max_in_flight: 3", "max_run_cost_credits: 500"} {
			if strings.HasPrefix(l, skip+":") {
				l = skip + ":" // present, but empty: YAML's null
				if strings.HasPrefix(skip, "max_in_flight") {
					continue
				}
			}
			out += "    " + l + "\n"
		}
		return out
	}
	const zeroMeant, aboveZero = "write 0 if 0 is meant", "write a figure above 0"
	for _, tc := range []struct{ name, yaml, want, hint string }{
		{"output left out", "models:\n  m:\n    input: 1\n", "models.m.output", zeroMeant},
		{"input left out", "models:\n  m:\n    output: 1\n", "models.m.input", zeroMeant},
		{"input left empty", "models:\n  m:\n    input:\n    output: 1\n", "models.m.input", zeroMeant},
		{"cache_read left empty", "models:\n  m:\n    input: 1\n    output: 1\n    cache_read:\n", "models.m.cache_read", zeroMeant},
		{"allowance left empty", plan("allowance_credits"), "plans.pro.allowance_credits", zeroMeant},
		{"max_in_flight left out", plan("max_in_flight"), "plans.pro.max_in_flight", aboveZero},
		{"heavy_after_turns left empty", plan("heavy_after_turns"), "plans.pro.heavy_after_turns", aboveZero},
		{"hold_normal_credits left empty", plan("hold_normal_credits"), "plans.pro.hold_normal_credits", aboveZero},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadYAML(t, tc.yaml)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.hint) {
				t.Errorf("error %v, want it to name %s and say %q", err, tc.want, tc.hint)
			}
			if tc.hint == aboveZero && strings.Contains(err.Error(), zeroMeant) {
				t.Errorf("error %v tells the operator to write 0, which is refused", err)
			}
		})
	}
	cfg, err := loadYAML(t, "default_plan: pro\nmodels:\n  free-local:\n    input: 0\n    output: 0\n"+strings.Replace(plan(""), "allowance_credits: 2000", "allowance_credits: 0", 1))
	if err != nil {
		t.Fatalf("zero written out refused: %v", err)
	}
	if cfg.Plans["pro"].AllowanceCredits.Milli != 0 {
		t.Errorf("pro allowance = %+v", cfg.Plans["pro"].AllowanceCredits)
	}
}

// A plan field left out is named once, with its line: the checks of its (zero) value said
// the same thing again in other words ("max_in_flight: must be in [1, 10000], got 0" under
// "max_in_flight: is missing"), so a plan with four fields left out read as eight problems.
// What is wrong besides (a discount over 100 %) is still named.
func TestFieldLeftOutIsNamedOnce(t *testing.T) {
	_, err := loadYAML(t, "plans:\n  pro:\n    allowance_credits: 10\n    discount_bp: 20000\n    hold_heavy_credits:\n")
	if err == nil {
		t.Fatal("a plan with fields left out was accepted")
	}
	lines := strings.Split(err.Error(), "\n")
	for _, field := range []string{"hold_normal_credits", "hold_heavy_credits", "heavy_after_turns", "max_in_flight", "max_run_cost_credits"} {
		n := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "plans.pro."+field+":") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("plans.pro.%s named %d times, want once:\n%v", field, n, err)
		}
	}
	for _, want := range []string{"plans.pro.discount_bp: must be in [0, 10000]"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "hold_*_credits") {
		t.Errorf("the hold pair is named again as hold_*_credits:\n%v", err)
	}
}

// TestPlansSectionReplacesTheDemoPlans: a plans section added to the demo's plans (yaml.v3
// decodes into the existing map), so an operator who wrote plans "free" and "pro" still had
// the demo's "standard" — 2000 credits a day — and every user created without a plan got it.
// The section replaces the demo's now, as a models section does, and default_plan must name
// one of its plans.
func TestPlansSectionReplacesTheDemoPlans(t *testing.T) {
	const free = "plans:\n  free:\n    allowance_credits: 5\n    hold_normal_credits: 1\n    hold_heavy_credits: 2\n" +
		"    heavy_after_turns: 4\n    max_in_flight: 1\n    max_run_cost_credits: 5\n"
	cfg, err := loadYAML(t, "default_plan: free\n"+free)
	if err != nil {
		t.Fatal(err)
	}
	if names := sortedKeys(cfg.Plans); len(names) != 1 || names[0] != "free" {
		t.Errorf("plans %v, want just the configured free", names)
	}
	if got := cfg.Plan("gone"); got != cfg.Plans["free"] {
		t.Errorf("a plan no longer configured got %+v, want the default plan's terms", got)
	}
	if _, err := loadYAML(t, free); err == nil || !strings.Contains(err.Error(), "default_plan") || !strings.Contains(err.Error(), "free") {
		t.Errorf("plans without the default plan: %v, want default_plan refused, naming the configured plans", err)
	}
}

// A model named with a * is not a pattern over other models' fields: "gpt-*" is refused
// even when the model gpt-x leaves a price out.
func TestStarModelNotHiddenByAnotherModelsMissingField(t *testing.T) {
	_, err := loadYAML(t, "models:\n  'gpt-*':\n    input: 1\n    output: 1\n  gpt-x:\n    input: 1\n")
	if err == nil || !strings.Contains(err.Error(), "models.gpt-*:") || !strings.Contains(err.Error(), "models.gpt-x.output") {
		t.Errorf("error %v, want it to name models.gpt-* and models.gpt-x.output", err)
	}
}

// Model prices match by name, then by the longest configured name that prefixes the model:
// "gpt-*" (the upstreams' pattern syntax) is taken literally and prices no model, and a
// negative max_output_tokens is no limit, and a name with a comma is a router's fallback chain,
// which every call naming it is refused as (the price would be listed and never billed). Each
// must stop the start.
func TestModelEntriesAreChecked(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"models:\n  'gpt-*':\n    input: 1\n    output: 1\n", "models.gpt-*"},
		{"models:\n  'cheap,dear':\n    input: 1\n    output: 1\n", "models.cheap,dear"},
		{"models:\n  m:\n    input: 1\n    output: 1\n    max_output_tokens: -4\n", "models.m.max_output_tokens"},
	} {
		_, err := loadYAML(t, tc.yaml)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to name %s", tc.yaml, err, tc.want)
		}
	}
}

// An upstream's models are exact names, "prefix*" or "*". An entry with * elsewhere
// ("*-mini") is compared as an exact name and serves nothing; an entry that names no priced
// model ("gpt4o" for the priced "gpt-4o") serves nothing either, since unpriced models are
// refused. Both were typos that did nothing, silently: they must stop the start.
func TestUpstreamModelEntriesThatServeNothingAreRefused(t *testing.T) {
	const models = "models:\n  gpt-4o:\n    input: 2.5\n    output: 10\n  claude-sonnet-4:\n    input: 3\n    output: 15\n"
	up := func(entries string) string {
		return "upstreams:\n  - name: a\n    kind: openai\n    base_url: https://api.openai.com\n    models: " + entries + "\n"
	}
	for _, tc := range []struct{ entries, want string }{
		{"['*-mini']", "upstreams[0].models"},
		{"['gpt-*-mini']", "upstreams[0].models"},
		{"['']", "upstreams[0].models"},
		{"['gpt4o']", "gpt4o"},
		{"['o3-*']", "o3-*"},
	} {
		_, err := loadYAML(t, models+up(tc.entries))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "upstreams[0].models") {
			t.Errorf("models %s: error %v, want it to name upstreams[0].models and %q", tc.entries, err, tc.want)
		}
	}
	// Served: an exact priced name, a name priced by a prefix, a prefix of priced names, a
	// prefix priced by a shorter name, and "*".
	for _, entries := range []string{"['gpt-4o']", "['gpt-4o-mini']", "['gpt-*', 'claude-*']", "['gpt-4o-2024-*']", "['*']"} {
		if _, err := loadYAML(t, models+up(entries)); err != nil {
			t.Errorf("models %s refused: %v", entries, err)
		}
	}
}

// A priced model no upstream serves is refused on every request (model_not_served): valid,
// but worth a line in the log at start.
func TestWarningsNameAPricedModelNoUpstreamServes(t *testing.T) {
	c := Default()
	c.Upstreams = []Upstream{{Name: "a", Kind: "openai", BaseURL: "https://api.openai.com", Models: []string{"gpt-*"}}}
	c.Models["gpt-4o"] = c.Models["fake-gpt"]
	w := c.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], "models.fake-gpt") {
		t.Fatalf("warnings %v, want one naming models.fake-gpt", w)
	}
}

// A header_timeout past upstream_timeout never fires (the whole call is cut first), and an
// operator who raised it believes a slow first byte is allowed that long.
func TestWarningsNameAHeaderTimeoutPastTheCallsTimeout(t *testing.T) {
	c := Default()
	c.Limits.HeaderTimeout = c.Limits.UpstreamTimeout + time.Second
	w := c.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], "limits.header_timeout") {
		t.Fatalf("warnings %v, want one naming limits.header_timeout", w)
	}
}

// A max_response_bytes or max_replay_len without an upper bound let one call hold any amount
// in memory (a whole answer is read before it is relayed) or in Redis (a replay record).
func TestResponseAndReplaySizesAreBounded(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"limits:\n  max_response_bytes: 2147483648\n", "limits.max_response_bytes"},
		{"dedup:\n  max_replay_len: 134217728\n", "dedup.max_replay_len"},
	} {
		_, err := loadYAML(t, tc.yaml)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to name %s", tc.yaml, err, tc.want)
		}
	}
}

// A negative key_cache_ttl passed (only its upper bound was checked) and a replay_ttl under a
// millisecond passed as "positive" though it reaches Redis as PEXPIRE 0: the record is deleted
// at once, which is what the check on replay_ttl exists to refuse.
func TestDurationsOutOfRangeAreRefused(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"limits:\n  key_cache_ttl: -1s\n", "limits.key_cache_ttl"},
		{"dedup:\n  replay_ttl: 500us\n", "dedup.replay_ttl"},
	} {
		_, err := loadYAML(t, tc.yaml)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to name %s", tc.yaml, err, tc.want)
		}
	}
}

// A duration written as a bare number (`upstream_timeout: 30`) is refused by the YAML
// decoder as "cannot unmarshal !!int `30` into time.Duration": the message says what to write.
func TestBareNumberDurationSaysToGiveAUnit(t *testing.T) {
	_, err := loadYAML(t, "limits:\n  upstream_timeout: 30\n")
	if err == nil || !strings.Contains(err.Error(), "line 4") || !strings.Contains(err.Error(), "unit") {
		t.Fatalf("error %v, want the line and a word on the unit", err)
	}
}

// YAML decodes a number with a fraction into an integer setting by dropping the fraction:
// discount_bp: 12.5 gave 12 basis points, max_in_flight: 2.5 gave 2, without a word. A
// setting that counts must be written as a whole number.
func TestFractionInAnIntegerSettingIsRefused(t *testing.T) {
	const plan = "plans:\n  pro:\n    allowance_credits: 2000\n    hold_normal_credits: 20\n    hold_heavy_credits: 60\n    heavy_after_turns: 4\n    max_run_cost_credits: 500\n"
	for _, tc := range []struct{ yaml, want string }{
		{plan + "    max_in_flight: 3\n    discount_bp: 12.5\n", "plans.pro.discount_bp"},
		{plan + "    max_in_flight: 2.5\n", "plans.pro.max_in_flight"},
		{"credit_micro: 1000.5\n", "credit_micro"},
		{"limits:\n  max_body_bytes: 4194304.9\n", "limits.max_body_bytes"},
		{"models:\n  m:\n    input: 1\n    output: 1\n    max_output_tokens: 4096.5\n", "models.m.max_output_tokens"},
		// YAML reads a leading zero as octal: 0200 was 128, discount_bp: 0500 was 320.
		{"holds:\n  reconcile_batch: 0200\n", "holds.reconcile_batch"},
		{plan + "    max_in_flight: 3\n    discount_bp: 0500\n", "plans.pro.discount_bp"},
		{"holds:\n  reconcile_batch: 0x20\n", "holds.reconcile_batch"},
	} {
		_, err := loadYAML(t, tc.yaml)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to name %s", tc.yaml, err, tc.want)
		}
	}
	// Prices and credits are decimals: their fractions are theirs.
	if _, err := loadYAML(t, "default_plan: pro\n"+plan+"    max_in_flight: 3\n    discount_bp: 125\n"); err != nil {
		t.Errorf("whole numbers refused: %v", err)
	}
}

// listen_addr is host:port. `listen_addr: 8080` (a bare port, which YAML reads as a number and
// the decoder turns into "8080") was accepted and failed at net.Listen, after the database and
// Redis were opened, with a message that named neither the setting nor its variable.
func TestListenAddrWithoutPortIsNamed(t *testing.T) {
	_, err := loadYAML(t, "listen_addr: 8080\n")
	if err == nil || !strings.Contains(err.Error(), "listen_addr (LISTEN_ADDR)") {
		t.Fatalf("error %v, want it to name listen_addr (LISTEN_ADDR)", err)
	}
	if _, err := loadYAML(t, "listen_addr: ':8080'\n"); err != nil {
		t.Errorf(":8080 refused: %v", err)
	}
}

// config.example.yaml says it shows every setting with its default: it must load to exactly
// Default()'s scalars, so neither drifts from the other unnoticed.
func TestExampleShowsTheDefaults(t *testing.T) {
	t.Setenv("MYSQL_DSN", "u:p@tcp(127.0.0.1:3306)/tollgate")
	t.Setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
	t.Setenv("LISTEN_ADDR", "")
	cfg, err := Load("../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	if cfg.ListenAddr != d.ListenAddr || cfg.CreditMicro != d.CreditMicro || cfg.Limits != d.Limits || cfg.Holds != d.Holds || cfg.Dedup != d.Dedup {
		t.Errorf("example %+v %+v %+v, defaults %+v %+v %+v", cfg.Limits, cfg.Holds, cfg.Dedup, d.Limits, d.Holds, d.Dedup)
	}
	for name, p := range d.Plans {
		if cfg.Plans[name] != p {
			t.Errorf("plan %s: example %+v, default %+v", name, cfg.Plans[name], p)
		}
	}
	if cfg.Models["fake-gpt"] != d.Models["fake-gpt"] {
		t.Errorf("fake-gpt: example %+v, default %+v", cfg.Models["fake-gpt"], d.Models["fake-gpt"])
	}
}

// A plan may take its fields from another through a YAML merge key: those fields are
// written, and the check that a plan sets every amount must see them.
func TestPlanFieldsFromAMergeKeyCount(t *testing.T) {
	cfg, err := loadYAML(t, "plans:\n  standard: &std\n    allowance_credits: 2000\n    hold_normal_credits: 20\n    hold_heavy_credits: 60\n"+
		"    heavy_after_turns: 4\n    max_in_flight: 3\n    max_run_cost_credits: 500\n  pro:\n    <<: *std\n    max_in_flight: 10\n  same: *std\n"+
		"models:\n  base: &price\n    input: 1\n    output: 2\n  other:\n    <<: [*price]\n    cache_read: 0.5\n")
	if err != nil {
		t.Fatalf("merged fields not seen: %v", err)
	}
	if p := cfg.Plans["pro"]; p.MaxInFlight != 10 || p.AllowanceCredits.Milli != 2_000_000 {
		t.Errorf("pro = %+v", p)
	}
	// A merge key's list is looked through to its end: a required field from its second
	// mapping is written as much as one from its first.
	cfg, err = loadYAML(t, "plans:\n  standard: &std\n    allowance_credits: 2000\n    hold_normal_credits: 20\n    hold_heavy_credits: 60\n"+
		"    heavy_after_turns: 4\n    max_in_flight: 3\n    max_run_cost_credits: 500\n  pro:\n    <<: [{max_in_flight: 10}, *std]\n")
	if err != nil {
		t.Fatalf("fields of a merge list's second mapping not seen: %v", err)
	}
	if p := cfg.Plans["pro"]; p.MaxInFlight != 10 || p.AllowanceCredits.Milli != 2_000_000 {
		t.Errorf("pro from a merge list = %+v", p)
	}
}

// A setting written with no value (`window:`) is YAML's null, which leaves the field as it
// was: outside plans and models (whose entries start from zero, and are checked above) that is
// the default, as if the line were not there.
func TestSettingLeftEmptyKeepsItsDefault(t *testing.T) {
	cfg, err := loadYAML(t, "dedup:\n  window:\n  fail_open:\nholds:\n  reconcile_batch: ~\n")
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	if cfg.Dedup != d.Dedup || cfg.Holds.ReconcileBatch != d.Holds.ReconcileBatch {
		t.Errorf("empty settings: dedup %+v, reconcile_batch %d; want the defaults %+v, %d", cfg.Dedup, cfg.Holds.ReconcileBatch, d.Dedup, d.Holds.ReconcileBatch)
	}
}

// A model's optional bounds written with no value (`output_bound_field:`, as a template that
// renders nothing writes them) are YAML's null: the field keeps its zero value, which is its
// documented default (max_tokens; unknown), as if the line were not there. Only prices, whose
// zero is a free model, must be written out. The check for empty prices refused these too,
// advising "write 0", which output_bound_field then refuses.
func TestModelBoundsLeftEmptyKeepTheirDefaults(t *testing.T) {
	cfg, err := loadYAML(t, "models:\n  m:\n    input: 1\n    output: 2\n    max_output_tokens:\n    output_bound_field:\n")
	if err != nil {
		t.Fatalf("empty optional bounds refused: %v", err)
	}
	if m := cfg.Models["m"]; m.MaxOutputTokens != 0 || m.OutputBoundField != "" {
		t.Errorf("m = %+v, want the defaults", m)
	}
}
