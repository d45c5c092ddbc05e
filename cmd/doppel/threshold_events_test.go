package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/doppel-dev/doppel/activities"
	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
	"github.com/doppel-dev/doppel/schema/schematest"
	"github.com/doppel-dev/doppel/store"
	metering "github.com/doppel-dev/doppel/usage"
)

// The gate's threshold sink records one usage.threshold event per workspace, period, meter and threshold, however
// often it is told (each process tells it again after a restart), with the meter's reading as its data.
func TestThresholdEventsOncePerPeriod(t *testing.T) {
	ctx := context.Background()
	db := schematest.Open(t, schema.DriverSQLite)
	ws, err := store.CreateWorkspace(ctx, db, "acme")
	if err != nil {
		t.Fatal(err)
	}
	sink := thresholdEvents{&activities.EventLog{DB: db}}
	march := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	r := &metering.Reading{Start: march, End: march.AddDate(0, 1, 0)}
	m := metering.Value{Name: metering.MeterToolCalls, Used: 8, Limit: 10, Unit: "calls"}
	for range 3 {
		if err := sink.Threshold(ctx, ws, r, m, 80); err != nil {
			t.Fatal(err)
		}
	}
	april := &metering.Reading{Start: march.AddDate(0, 1, 0), End: march.AddDate(0, 2, 0)}
	if err := sink.Threshold(ctx, ws, april, m, 80); err != nil { // a new period: a new event
		t.Fatal(err)
	}
	evs, err := store.ListEvents(ctx, db, ws.ID, events.UsageThreshold, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 {
		t.Fatalf("%d usage.threshold events, want 2 (one per period)", len(evs))
	}
	var d events.UsageData
	if err := json.Unmarshal(evs[1].Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.Meter != metering.MeterToolCalls || d.Percent != 80 || d.Used != 8 || d.Limit != 10 || !d.PeriodStart.Equal(march) {
		t.Errorf("event data %+v", d)
	}
}
