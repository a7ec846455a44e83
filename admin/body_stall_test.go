package admin_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/admin"
)

// adminConn opens a connection to the fixture's server and sends head, a request's first bytes.
func (f *fixture) adminConn(t *testing.T, head string) net.Conn {
	t.Helper()
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Far past any bound the server keeps: a read that gets here found none.
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestStalledBodyIsCut: a write's body that stops arriving is cut within the request's bound
// (408), as a model call's is: the read had no deadline, and an operator's script stalled
// mid-body held its connection and goroutine for as long as it stayed connected, past the
// bound every admin request is said to have.
func TestStalledBodyIsCut(t *testing.T) {
	f := newFixture(t, adminToken)
	defer admin.SetRequestTimeout(500 * time.Millisecond)()
	c := f.adminConn(t, "POST /admin/users HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+adminToken+
		"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"name\":")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("status %d, want 408", resp.StatusCode)
	}
}

// TestOversizedBodyIsRefusedBeforeItIsSent: a Content-Length over the bound is refused 413 at
// once, before the server tells a client waiting on Expect: 100-continue to send it.
func TestOversizedBodyIsRefusedBeforeItIsSent(t *testing.T) {
	f := newFixture(t, adminToken)
	c := f.adminConn(t, "POST /admin/users HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+adminToken+
		"\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 100000000\r\n\r\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(line, "HTTP/1.1 413") {
		t.Errorf("first line %q, want a 413 before any 100 Continue", strings.TrimSpace(line))
	}
}
