package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tollgate/tollgate/internal/fakellm"
	"github.com/tollgate/tollgate/internal/testenv"
)

// secretUpstream is a provider that misbehaves with the gateway's secrets in every way one
// can, chosen per request by X-Sec-Mode (which the gateway passes on as any caller header):
// it echoes the key it was sent in its errors, its error objects, its error events and a web
// page, and answers with a router's account headers. Without a mode
// it is fakellm. It keeps every request's headers, to check what reached it.
type secretUpstream struct {
	fake   http.Handler
	answer string // the text of mode "answer"

	mu   sync.Mutex
	seen []http.Header
}

func (u *secretUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.seen = append(u.seen, r.Header.Clone())
	u.mu.Unlock()
	echo := fmt.Sprintf("Incorrect API key provided: %s (Authorization: %s) in organization org-OperatorOrg123456",
		r.Header.Get("X-Api-Key"), r.Header.Get("Authorization"))
	quoted, _ := json.Marshal(echo)
	errJSON := fmt.Sprintf(`{"error":{"message":%s,"type":"invalid_request_error","code":"invalid_api_key"}}`, quoted)
	status := map[string]int{"401": 401, "403": 403, "400": 400, "404": 404, "422": 422, "429": 429, "500": 500, "503": 503}
	mode := r.Header.Get("X-Sec-Mode")
	switch {
	case status[mode] != 0:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status[mode])
		io.WriteString(w, errJSON)
	case mode == "302":
		// A redirect, which the gateway does not follow, to a host of the operator's.
		w.Header().Set("Location", "https://operator-internal.example/v1/chat/completions?key="+r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusFound)
	case mode == "200err":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, errJSON)
	case mode == "html":
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<html><body>"+echo+"</body></html>")
	case mode == "streamerr":
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"fake-gpt","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`+"\n\n")
		io.WriteString(w, "data: "+errJSON+"\n\n")
	case mode == "answer":
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"fake-gpt","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`, u.answer)
	case mode == "router":
		// LiteLLM's proxy answers with its key's spend and the provider's base URL; OpenAI
		// with the operator's organisation and project.
		h := w.Header()
		h.Set("X-Litellm-Key-Spend", "1234.5")
		h.Set("X-Litellm-Response-Cost", "0.0021")
		h.Set("X-Litellm-Model-Api-Base", "https://operator-internal.openai.azure.com")
		h.Set("Openai-Organization", "org-OperatorOrg123456")
		h.Set("Openai-Project", "proj_OperatorProj123456")
		u.fake.ServeHTTP(w, r)
	default:
		u.fake.ServeHTTP(w, r)
	}
}

// TestSecretsStayOutOfLogsAndAnswers runs the real binary at DEBUG with a DSN password, a Redis
// password, an upstream key and an admin token of its own, drives every path that meets one of
// them — keys wrong, revoked and right, an upstream that echoes the operator's key and its own
// address in each kind of error, the admin API with a wrong token and with its key commands,
// /metrics — and then reads its whole log and every answer it gave: none holds a secret, a
// caller's key past the prefix listings show, a prompt or an answer's text. What reached the
// upstream carries the operator's key and none of the caller's.
func TestSecretsStayOutOfLogsAndAnswers(t *testing.T) {
	w := newWorld(t)
	// Its gateway's account has no SUPER: another package's read_only spell would refuse its writes.
	testenv.NoReadOnlySpell(t, w.db)
	ctx := context.Background()
	tag := testenv.RandomID(6)

	// A database account and a Redis user of the test's own, with passwords nothing else uses.
	dsnPassword := "dsnpw" + testenv.RandomID(10)
	dbUser := "tgsec" + tag
	cfg, err := mysql.ParseDSN(w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		fmt.Sprintf("CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'", dbUser, dsnPassword),
		fmt.Sprintf("GRANT ALL PRIVILEGES ON `%s`.* TO '%s'@'127.0.0.1'", cfg.DBName, dbUser),
	} {
		if _, err := w.db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		_, _ = w.db.ExecContext(context.Background(), fmt.Sprintf("DROP USER '%s'@'127.0.0.1'", dbUser))
	})
	cfg.User, cfg.Passwd = dbUser, dsnPassword
	dsn := cfg.FormatDSN()

	redisPassword := "redispw" + testenv.RandomID(10)
	redisUser := "tgsec" + tag
	if err := w.rdb.Do(ctx, "ACL", "SETUSER", redisUser, "on", ">"+redisPassword, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { _ = w.rdb.Do(context.Background(), "ACL", "DELUSER", redisUser).Err() })
	redisURL := strings.Replace(w.redisURL, "redis://", "redis://"+redisUser+":"+redisPassword+"@", 1)

	// A key with characters a JSON encoder or a URL spells otherwise (/ + < & >): an echo
	// of it in a JSON error body is escaped, and must be left out in that spelling too.
	upstreamRandom := testenv.RandomID(20)
	upstreamKey := "sk-proj-op/" + upstreamRandom + "+<&>"
	adminToken := "admintok" + testenv.RandomID(12)
	prompt := "promptmark" + testenv.RandomID(8)
	up := &secretUpstream{fake: fakellm.New(fakellm.Config{}), answer: "answermark" + testenv.RandomID(8)}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)

	g, err := w.tryStart("sec", w.config, []string{"MYSQL_DSN=" + dsn, "REDIS_URL=" + redisURL, "UPSTREAM_URL=" + upstream.URL,
		"UPSTREAM_API_KEY=" + upstreamKey, "ADMIN_TOKEN=" + adminToken}, nil, "-debug")
	if err != nil {
		t.Fatal(err)
	}

	_, key := w.user("sec-user", 10, nil)
	_, revoked := w.user("sec-revoked", 10, nil)
	if err := w.store.RevokeKey(ctx, revoked); err != nil {
		t.Fatal(err)
	}
	wrongKey := "tg_" + testenv.RandomID(20)
	idemKey := "idemmark" + testenv.RandomID(8)

	var answers bytes.Buffer // every status line, header and body the gateway answered
	send := func(method, path, auth string, body []byte, hdr map[string]string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, g.url+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Fprintf(&answers, "%s %s -> %d\n", method, path, resp.StatusCode)
		_ = resp.Header.Write(&answers)
		answers.Write(b)
		answers.WriteString("\n\n")
		return resp.StatusCode, b
	}
	chat := func(stream bool) []byte { return chatBody(stream, 20, prompt) }
	expect := func(what string, got, want int, body []byte) {
		t.Helper()
		if got != want {
			t.Errorf("%s: status %d, want %d: %s", what, got, want, body)
		}
	}

	// Callers: right, wrong and revoked keys, in both places a key may travel, and the
	// caller's key sent in every other provider's credential header as well.
	others := map[string]string{"X-Api-Key": key, "Api-Key": key, "X-Goog-Api-Key": key}
	st, b := send("POST", "/v1/chat/completions", key, chat(false), others)
	expect("plain call", st, 200, b)
	st, b = send("POST", "/v1/chat/completions", key, chat(true), others)
	expect("streamed call", st, 200, b)
	st, b = send("POST", "/v1/chat/completions", key, chat(false), map[string]string{"X-Sec-Mode": "answer"})
	expect("answer call", st, 200, b)
	for _, k := range []string{wrongKey, revoked} {
		st, b = send("POST", "/v1/chat/completions", k, chat(false), nil)
		expect("refused key", st, 401, b)
		st, b = send("POST", "/v1/messages", "", []byte(`{"model":"fake-gpt","max_tokens":5,"messages":[]}`), map[string]string{"X-Api-Key": k})
		expect("refused x-api-key", st, 401, b)
		st, b = send("GET", "/v1/credits", k, nil, nil)
		expect("refused credits", st, 401, b)
	}
	// Idempotency-Key: answered, then replayed.
	for range 2 {
		st, b = send("POST", "/v1/chat/completions", key, chat(false), map[string]string{"Idempotency-Key": idemKey})
		expect("idempotent call", st, 200, b)
	}
	// The upstream echoing the operator's key and its own address, in each way it can.
	for _, mode := range []string{"401", "403", "400", "404", "422", "429", "500", "503", "200err", "html", "router", "302"} {
		send("POST", "/v1/chat/completions", key, []byte(strings.Replace(string(chat(false)), prompt, prompt+mode, 1)), map[string]string{"X-Sec-Mode": mode})
	}
	// A replay restores the headers the caller was sent, not the upstream's.
	for range 2 {
		st, b = send("POST", "/v1/chat/completions", key, chat(false), map[string]string{"X-Sec-Mode": "router", "Idempotency-Key": idemKey + "r"})
		expect("idempotent router call", st, 200, b)
	}
	if n := strings.Count(answers.String(), "Idempotent-Replayed: true"); n != 2 {
		t.Errorf("%d replays, want 2", n)
	}
	send("POST", "/v1/chat/completions", key, chat(true), map[string]string{"X-Sec-Mode": "streamerr"})
	send("GET", "/v1/credits", key, nil, nil)
	send("GET", "/v1/models", key, nil, nil)

	// The admin API: a wrong token (the right one's start), then the key commands, whose
	// answers show a new key once — to the operator, never in the log.
	st, b = send("GET", "/admin/users", adminToken[:len(adminToken)-1]+"x", nil, nil)
	expect("admin wrong token", st, 401, b)
	st, b = send("POST", "/admin/users/sec-user/keys", adminToken, nil, nil)
	expect("admin key create", st, 201, b)
	var created struct{ Key string }
	_ = json.Unmarshal(b, &created)
	adminShown := answers.Len() // answers before this point may show created.Key (its creation)
	st, b = send("POST", "/admin/users/sec-user/keys/revoke", adminToken, []byte(fmt.Sprintf(`{"prefix":%q}`, created.Key)), nil)
	expect("admin revoke by a whole key given as prefix", st, 400, b)
	st, b = send("POST", "/admin/keys/revoke", adminToken, []byte(fmt.Sprintf(`{"key":%q}`, created.Key)), nil)
	expect("admin key revoke", st, 200, b)
	st, b = send("POST", "/admin/keys/revoke", adminToken, []byte(fmt.Sprintf(`{"key":%q}`, wrongKey)), nil)
	expect("admin revoke of an unknown key", st, 404, b)
	st, b = send("GET", "/debug/pprof/", "", nil, nil)
	expect("pprof on the public listener", st, 404, b)
	send("GET", "/metrics", "", nil, nil)
	send("GET", "/readyz", "", nil, nil)

	// Every call settled, so that the settlements' lines are in the log read below; a hold
	// still live at the deadline fails the test rather than leaving its lines unread.
	waitFor(t, 20*time.Second, "every hold to settle before the gateway stops", func() bool { return w.liveHolds() == 0 })
	if err := g.cmd.Process.Signal(os.Interrupt); err == nil {
		_ = g.wait(t, 30*time.Second)
	}
	logText, err := os.ReadFile(g.log)
	if err != nil {
		t.Fatal(err)
	}

	// What reached the upstream: the operator's key, never a caller's.
	up.mu.Lock()
	for _, h := range up.seen {
		for name, vv := range h {
			for _, v := range vv {
				if strings.Contains(v, key[:len(key)-4]) {
					t.Errorf("the upstream was sent the caller's key in %s", name)
				}
			}
		}
		if got := h.Get("Authorization"); got != "Bearer "+upstreamKey {
			t.Errorf("the upstream's Authorization is %q, want the operator's key", got)
		}
	}
	up.mu.Unlock()

	// A caller's key may be named by the prefix listings show (holds.KeyPrefixLen, 10), no more.
	secrets := map[string]string{"DSN password": dsnPassword, "Redis password": redisPassword, "upstream key": upstreamKey,
		"upstream key's tail": upstreamKey[len(upstreamKey)-12:], "admin token": adminToken[:12],
		"caller key": key[:11], "caller key's tail": key[len(key)-12:], "wrong key": wrongKey[:11], "revoked key": revoked[:11],
		"created key": created.Key[:11], "upstream key in any spelling": upstreamRandom}
	logSecrets := map[string]string{"prompt": prompt, "answer": up.answer}
	for what, s := range secrets {
		if i := strings.Index(string(logText), s); i >= 0 {
			t.Errorf("the log holds the %s: …%s…", what, around(logText, i))
		}
		in := answers.Bytes()
		if what == "created key" || what == "caller key" || what == "caller key's tail" {
			in = in[adminShown:]
		}
		if i := bytes.Index(in, []byte(s)); i >= 0 {
			t.Errorf("an answer holds the %s: …%s…", what, around(in, i))
		}
	}
	for what, s := range logSecrets {
		if i := strings.Index(string(logText), s); i >= 0 {
			t.Errorf("the log holds the %s: …%s…", what, around(logText, i))
		}
	}
	// The upstream's address and the router's account headers stay the gateway's.
	for what, s := range map[string]string{"upstream address": strings.TrimPrefix(upstream.URL, "http://"),
		"router's key spend": "X-Litellm-Key-Spend", "router's provider base": "operator-internal", "organisation": "OperatorOrg123456",
		"project": "OperatorProj123456"} {
		if i := bytes.Index(answers.Bytes(), []byte(s)); i >= 0 {
			t.Errorf("an answer holds the %s: …%s…", what, around(answers.Bytes(), i))
		}
	}
	if t.Failed() {
		t.Logf("answers:\n%s", tail(answers.Bytes(), 6000))
	}
}

// around is the text of b near i, for a failure's message.
func around(b []byte, i int) string {
	return string(b[max(0, i-160):min(len(b), i+80)])
}

// TestCommandsDoNotPrintTheirSecrets: every command that is given a database it cannot use —
// a wrong password, nothing listening, a DSN that does not parse — or a Redis that refuses its
// password says why without the password.
func TestCommandsDoNotPrintTheirSecrets(t *testing.T) {
	w := newWorld(t)
	cfg, err := mysql.ParseDSN(w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	password := "dsnpw" + testenv.RandomID(10)
	cfg.Passwd = password
	wrongPassword := cfg.FormatDSN()
	cfg.Addr = "127.0.0.1:1" // nothing listens there (tcpmux: a port picked free and closed again can be another server's by then)
	nobody := cfg.FormatDSN()
	redisPassword := "redispw" + testenv.RandomID(10)
	wrongRedis := strings.Replace(w.redisURL, "redis://", "redis://nobody"+testenv.RandomID(3)+":"+redisPassword+"@", 1)
	dsns := []string{wrongPassword, nobody, strings.Replace(wrongPassword, "/"+cfg.DBName, cfg.DBName, 1),
		wrongPassword + "&timeout=" + password, "tollgate:" + password + "@tcp(127.0.0.1:1/x"}
	type run struct {
		dsn  string
		args []string
	}
	var runs []run
	for _, dsn := range dsns {
		for _, args := range [][]string{{"migrate"}, {"prune", "-days", "7"}, {"user", "list"}, {"demo-setup"}, {"audit"}, {"reconcile", "-once"}, {"serve"}} {
			runs = append(runs, run{dsn, args})
		}
	}
	// The database right, Redis refusing the password.
	runs = append(runs, run{w.dsn, []string{"serve"}}, run{w.dsn, []string{"reconcile", "-once"}})
	for _, rn := range runs {
		dsn, args := rn.dsn, rn.args
		{
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			cmd := exec.CommandContext(ctx, gatewayBin, args...)
			cmd.Env = append(os.Environ(), "MYSQL_DSN="+dsn, "REDIS_URL="+wrongRedis, "LISTEN_ADDR="+anyPort, "UPSTREAM_URL="+w.upstream.URL)
			out, err := cmd.CombinedOutput()
			cancel()
			if err == nil {
				t.Errorf("%v with DSN %q: no error", args, dsn)
			}
			for what, s := range map[string]string{"DSN password": password, "Redis password": redisPassword} {
				if i := bytes.Index(out, []byte(s)); i >= 0 {
					t.Errorf("%v printed the %s: …%s…", args, what, around(out, i))
				}
			}
		}
	}
}
