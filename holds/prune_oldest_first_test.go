package holds_test

import (
	"fmt"
	"testing"

	"github.com/tollgate/tollgate/holds"
)

// TestPruneOfAFullDayKeepsItsFirstModelsAndAddsToThem: PruneSettled prunes batch at a time,
// oldest first, so on a day of more charged models than MaxPrunedModels the places go to the
// models of its earliest runs, and only the runs of models first met last are folded (no model
// used nothing, so none gives up its place). A prune that took the newest first kept the day's
// last models and folded its first. A later batch's run of a model that has its row is added
// into that row even though the day is full: it takes no new place, and its split by model is
// kept (it was folded when the batch did not look up which of its models had their rows).
func TestPruneOfAFullDayKeepsItsFirstModelsAndAddsToThem(t *testing.T) {
	f := newAcctFixture(t)
	const models = holds.MaxPrunedModels + 1
	u := f.user("oldest-first", "standard")
	for i := range models {
		f.settleAs(u, fmt.Sprintf("r_oldest_%d", i), fmt.Sprintf("gpt-4o-%04d", i), 1_000)
	}
	first, last := "gpt-4o-0000", fmt.Sprintf("gpt-4o-%04d", models-1)
	f.settleAs(u, "r_oldest_again", first, 2_000) // the day's newest run, of its first model
	f.ageRuns(u, 10)
	res, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, 10)
	if err != nil || res.Runs != models+1 {
		t.Fatalf("prune: %+v, %v; want %d runs pruned", res, err, models+1)
	}
	var rows []struct {
		Model string `db:"model"`
		Runs  int64  `db:"runs"`
	}
	if err := f.db.SelectContext(f.ctx(), &rows, "SELECT model, runs FROM pruned_runs WHERE user_id = ?", u.ID); err != nil {
		t.Fatal(err)
	}
	runs := map[string]int64{}
	for _, r := range rows {
		runs[r.Model] = r.Runs
	}
	if len(rows) != holds.MaxPrunedModels+1 || runs[first] != 2 || runs[last] != 0 || runs[holds.FoldedModel] != 1 {
		t.Errorf("pruned_runs: %d rows, %d runs in %s's, %d in %s's, %d folded; want %d rows, both runs of the first-settled "+
			"model in its own, the last-settled model's one run folded", len(rows), runs[first], first, runs[last], last,
			runs[holds.FoldedModel], holds.MaxPrunedModels+1)
	}
}

// TestPruneGivesADaysLastPlaceToTheBatchsDearestModel: of a batch's new models on a day with
// fewer free places than them, the dearest take the places and the rest are folded, so a day
// past its bound keeps the models it was charged most for; taken in the order of their names,
// the cheaper model met first by name kept the last place.
func TestPruneGivesADaysLastPlaceToTheBatchsDearestModel(t *testing.T) {
	f := newAcctFixture(t)
	u := f.user("dearest-first", "standard")
	for i := range holds.MaxPrunedModels - 1 {
		f.settleAs(u, fmt.Sprintf("r_dear_%d", i), fmt.Sprintf("gpt-4o-%04d", i), 1_000)
	}
	f.settleAs(u, "r_dear_cheap", "gpt-4o-aaa-cheap", 1_000)
	f.settleAs(u, "r_dear_dear", "gpt-4o-zzz-dear", 5_000)
	f.ageRuns(u, 10)
	// The first batch fills all places but one; the second has both new models.
	if _, err := f.store.PruneSettled(f.ctx(), holds.MinPruneAge, holds.MaxPrunedModels-1); err != nil {
		t.Fatal(err)
	}
	if r := f.prunedRuns(u); len(r) != holds.MaxPrunedModels+1 || r["gpt-4o-zzz-dear"] != 1 || r["gpt-4o-aaa-cheap"] != 0 || r[holds.FoldedModel] != 1 {
		t.Errorf("day's last place between a model charged 1000 and one charged 5000: %d rows, dear model's %d runs, "+
			"cheap model's %d, %d folded; want %d rows, the dear model's own, the cheap one folded",
			len(r), r["gpt-4o-zzz-dear"], r["gpt-4o-aaa-cheap"], r[holds.FoldedModel], holds.MaxPrunedModels+1)
	}
}
