package holds_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tollgate/tollgate/holds"
)

// One caller's admission whose model name is not UTF-8 (the proxy reads it from the request
// body as raw bytes, and prices it by prefix) must not fail the other callers' admissions and
// settlements sharing its batch. The utf8mb4 column refused the bytes (Error 1366), the whole
// transaction failed, and every other user in the batch was told billing was unavailable.
func TestAModelNameThatIsNotUTF8FailsOnlyItsOwnAdmission(t *testing.T) {
	e := newStoreEnv(t)
	good, bad := e.user("poison-good", 5, nil), e.user("poison-bad", 5, nil)
	e.admit(good, "r_poison_prev", holds.StateRunning)
	settled, admitted, err := e.store.WriteBatch(context.Background(),
		[]holds.Settlement{{RunID: "r_poison_prev", UserID: good.ID, CostMicro: 5_000, Model: "fake-gpt\xff", Source: holds.SourceComplete}},
		[]holds.AdmitRequest{
			{RunID: "r_poison_good", UserID: good.ID, Model: "fake-gpt", State: holds.StateRunning, TTL: time.Minute, Fresh: true},
			{RunID: "r_poison_bad", UserID: bad.ID, Model: "fake-gpt-\xff\xfe", State: holds.StateRunning, TTL: time.Minute, Fresh: true},
		})
	if err != nil {
		t.Fatalf("batch failed as a whole: %v", err)
	}
	if settled[0].Err != nil || !settled[0].Applied || settled[0].ChargedMicro != 5_000 {
		t.Errorf("settlement: %+v", settled[0])
	}
	if admitted[0].Err != nil {
		t.Errorf("the good admission: %v", admitted[0].Err)
	}
	if !errors.Is(admitted[1].Err, holds.ErrInvalidModel) {
		t.Errorf("the bad admission: %+v, want %v", admitted[1], holds.ErrInvalidModel)
	}
	if r := e.run(good, "r_poison_prev"); r.State != holds.StateSettled || r.Model != "fake-gpt" {
		t.Errorf("settled run %+v: want settled, keeping the model it was admitted with", r)
	}
	if e.run(good, "r_poison_good").State != holds.StateRunning {
		t.Error("the good admission took no hold")
	}
	if _, err := e.store.Run(context.Background(), bad.ID, "r_poison_bad"); !errors.Is(err, holds.ErrRunNotFound) {
		t.Errorf("the bad admission left a hold: %v", err)
	}
}
