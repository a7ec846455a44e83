package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/holds"
	"github.com/tollgate/tollgate/proxy"
)

// TestOperatorActsOnUsersMidStreamChargesEachCallOnce: users' streams are held mid-answer
// while an operator, all at once, revokes one user's key, disables another, moves a third to
// another plan and refunds a fourth's prepaid credits. Every stream already admitted runs to
// its end and is charged exactly its usage, at the terms it was admitted with; nothing stays
// held; and with the key cache off (key_cache_ttl 0, so the documented window is none) the
// revoked key and the disabled user's key are refused from the next call on.
func TestOperatorActsOnUsersMidStreamChargesEachCallOnce(t *testing.T) {
	h, gate := gatedHarness(t, func(c *config.Config) {
		c.Limits.KeyCacheTTL = 0
		guest := c.Plans["guest"]
		guest.DiscountBP = 5_000 // a move to it must not reach the calls admitted before
		c.Plans["guest"] = guest
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const perRole, streams = 2, 2
	roles := []string{"revoke", "disable", "move", "refund"}
	type account struct {
		role string
		user holds.User
		key  string
	}
	var accounts []account
	for _, role := range roles {
		for range perRole {
			u, key := h.user("standard")
			if role == "refund" {
				if _, _, err := h.store.Grant(ctx, holds.GrantRequest{UserID: u.ID, AmountMicro: 5_000_000,
					IdempotencyKey: "topup-" + u.Name}); err != nil {
					t.Fatal(err)
				}
			}
			accounts = append(accounts, account{role, u, key})
		}
	}

	// Every stream is held after its first event until the operator is done.
	type held struct {
		acct   account
		resp   *http.Response
		br     *bufio.Reader
		letGo  func()
		runID  string
		answer string
	}
	var all []*held
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, a := range accounts {
		for j := range streams {
			hdr, letGo := heldMidStream(t, gate, fmt.Sprintf("s-%d-%d", i, j), slowStream(30, nil))
			wg.Go(func() {
				// Each its own message: the same body within the fingerprint window is a duplicate.
				body := strings.Replace(streamBody, "please", fmt.Sprintf("please (%d)", j), 1)
				resp := h.post(a.key, "/v1/chat/completions", body, hdr)
				if resp.StatusCode != http.StatusOK {
					t.Errorf("%s user's stream: %d", a.role, resp.StatusCode)
					resp.Body.Close()
					return
				}
				br := firstEvent(t, resp)
				mu.Lock()
				all = append(all, &held{acct: a, resp: resp, br: br, letGo: letGo, runID: resp.Header.Get(proxy.RunIDHeader)})
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// The operator, at once.
	for _, a := range accounts {
		wg.Go(func() {
			var err error
			switch a.role {
			case "revoke":
				_, err = h.store.RevokeAPIKey(ctx, a.key)
			case "disable":
				_, err = h.store.DisableUser(ctx, a.user.ID)
			case "move":
				err = h.store.ChangeUser(ctx, a.user.ID, holds.UserChange{Plan: "guest"})
			case "refund":
				_, _, err = h.store.Grant(ctx, holds.GrantRequest{UserID: a.user.ID, AmountMicro: -5_000_000,
					IdempotencyKey: "refund-" + a.user.Name})
				if errors.Is(err, holds.ErrGrantBelowZero) {
					err = nil // what the streams hold may not be refunded; the rest is the test
				}
			}
			if err != nil {
				t.Errorf("%s %s: %v", a.role, a.user.Name, err)
			}
		})
	}
	wg.Wait()
	for _, a := range accounts {
		if a.role != "revoke" && a.role != "disable" {
			continue
		}
		resp := h.post(a.key, "/v1/chat/completions", chatBody, nil)
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || errorCode(t, body) != "invalid_api_key" {
			t.Errorf("a %s user's call with the key cache off: %d %s, want 401 invalid_api_key", a.role, resp.StatusCode, body)
		}
	}

	for _, s := range all {
		s.letGo()
		wg.Go(func() {
			rest, err := io.ReadAll(s.br)
			s.resp.Body.Close()
			if err != nil {
				t.Errorf("%s user's stream: %v", s.acct.role, err)
			}
			s.answer = string(rest)
		})
	}
	wg.Wait()
	for _, s := range all {
		if !strings.Contains(s.answer, "[DONE]") {
			t.Errorf("%s user's stream did not run to its end: %q", s.acct.role, s.answer)
		}
		r := h.run(s.acct.user.ID, s.runID)
		if r.State != holds.StateSettled || r.OutTok != 30 || r.DiscountBP != 0 || r.ChargedMicro != fakeGPTCost(r.InTok, r.OutTok) {
			t.Errorf("%s user's stream: run %+v; want settled at its usage, 30 output tokens, no discount (standard's)", s.acct.role, r)
		}
	}
	if _, live := h.holdCount(); live != 0 {
		t.Errorf("%d holds left live", live)
	}
}
