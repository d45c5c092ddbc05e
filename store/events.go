package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/uptrace/bun"

	"github.com/doppel-dev/doppel/events"
	"github.com/doppel-dev/doppel/schema"
)

// NewEvent makes an event of workspace ws: type typ about subject, with data encoded as JSON. dedup makes the
// event one however often it is recorded (e.g. "twin.ready:<handle>"); "" uses the event's own id.
func NewEvent(ws, typ, subject, dedup string, data any) (*schema.Event, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("store: event %s: %w", typ, err)
	}
	t := now()
	ev := &schema.Event{ID: schema.NewSortableID(schema.PrefixEvent, t), WorkspaceID: ws, Type: typ, Subject: subject,
		Data: raw, DedupKey: dedup, CreatedAt: t}
	if ev.DedupKey == "" {
		ev.DedupKey = ev.ID
	}
	return ev, nil
}

// RecordEvent records ev and one pending delivery per enabled endpoint of its workspace whose filter takes its
// type, and returns the deliveries' ids. Run it in the transaction of the change the event reports: the event and
// its deliveries are then durable exactly when the change is. An event whose dedup key is already recorded is
// not recorded again (nil ids).
func RecordEvent(ctx context.Context, db bun.IDB, ev *schema.Event) ([]string, error) {
	res, err := db.NewInsert().Model(ev).On("CONFLICT (dedup_key) DO NOTHING").Exec(ctx)
	if err != nil {
		return nil, wrap(err, "record event %s", ev.Type)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, nil
	}
	var eps []schema.WebhookEndpoint
	if err := db.NewSelect().Model(&eps).Column("id", "event_types").
		Where("workspace_id = ? AND NOT disabled", ev.WorkspaceID).Order("id").Scan(ctx); err != nil {
		return nil, wrap(err, "endpoints of %s", ev.WorkspaceID)
	}
	var ids []string
	for _, ep := range eps {
		if !events.Matches(ep.EventTypes, ev.Type) {
			continue
		}
		d, err := insertDelivery(ctx, db, ev, ep.ID)
		if err != nil {
			return nil, err
		}
		ids = append(ids, d.ID)
	}
	return ids, nil
}

func insertDelivery(ctx context.Context, db bun.IDB, ev *schema.Event, endpointID string) (*schema.WebhookDelivery, error) {
	t := now()
	d := &schema.WebhookDelivery{ID: schema.NewSortableID(schema.PrefixDelivery, t), WorkspaceID: ev.WorkspaceID,
		EndpointID: endpointID, EventID: ev.ID, Status: schema.DeliveryPending, CreatedAt: t, UpdatedAt: t}
	if _, err := db.NewInsert().Model(d).Exec(ctx); err != nil {
		return nil, wrap(err, "record delivery of %s to %s", ev.ID, endpointID)
	}
	return d, nil
}

// RecordTestEvent records a webhook.test event for one endpoint and its delivery, and returns the delivery.
func RecordTestEvent(ctx context.Context, db bun.IDB, ep *schema.WebhookEndpoint) (*schema.WebhookDelivery, error) {
	ev, err := NewEvent(ep.WorkspaceID, events.WebhookTest, ep.ID, "", events.TestData{EndpointID: ep.ID,
		Note: "a test event sent by webhooks.test"})
	if err != nil {
		return nil, err
	}
	var d *schema.WebhookDelivery
	err = inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		if _, err := tx.NewInsert().Model(ev).Exec(ctx); err != nil {
			return wrap(err, "record test event")
		}
		d, err = insertDelivery(ctx, tx, ev, ep.ID)
		return err
	})
	return d, err
}

// GetEvent returns an event by id (for workers).
func GetEvent(ctx context.Context, db bun.IDB, id string) (*schema.Event, error) {
	ev := new(schema.Event)
	if err := db.NewSelect().Model(ev).Where("id = ?", id).Scan(ctx); err != nil {
		return nil, wrap(err, "get event %q", id)
	}
	return ev, nil
}

// ListEvents returns a workspace's events newest first, of type typ when set, after the event before when set.
func ListEvents(ctx context.Context, db bun.IDB, ws, typ, before string, limit int) ([]schema.Event, error) {
	out := []schema.Event{}
	q := db.NewSelect().Model(&out).Where("workspace_id = ?", ws)
	if typ != "" {
		q = q.Where("type = ?", typ)
	}
	if before != "" {
		q = q.Where(beforeCursor("events"), before, before, before)
	}
	if err := q.Order("created_at DESC", "id DESC").Limit(int64(limit)).Scan(ctx); err != nil {
		return nil, wrap(err, "list events")
	}
	return out, nil
}

// beforeCursor selects the rows of table listed after the row whose id is the cursor, newest first: older by
// created_at, then by id (sortable ids made in the same millisecond do not order by time).
func beforeCursor(table string) string {
	at := "(SELECT created_at FROM " + table + " WHERE id = ?)"
	return "(created_at < " + at + " OR (created_at = " + at + " AND id < ?))"
}

// CreateEndpoint stores a new endpoint; ID and times are filled in.
func CreateEndpoint(ctx context.Context, db bun.IDB, ep *schema.WebhookEndpoint) error {
	t := now()
	ep.ID, ep.CreatedAt, ep.UpdatedAt = schema.NewID(schema.PrefixEndpoint), t, t
	if _, err := db.NewInsert().Model(ep).Exec(ctx); err != nil {
		return wrap(err, "create endpoint")
	}
	return nil
}

// GetEndpoint returns a workspace's endpoint; another workspace's is ErrNotFound.
func GetEndpoint(ctx context.Context, db bun.IDB, ws, id string) (*schema.WebhookEndpoint, error) {
	ep := new(schema.WebhookEndpoint)
	if err := db.NewSelect().Model(ep).Where("id = ? AND workspace_id = ?", id, ws).Scan(ctx); err != nil {
		return nil, wrap(err, "get endpoint %q", id)
	}
	return ep, nil
}

// ListEndpoints returns a workspace's endpoints, oldest first.
func ListEndpoints(ctx context.Context, db bun.IDB, ws string) ([]schema.WebhookEndpoint, error) {
	out := []schema.WebhookEndpoint{}
	if err := db.NewSelect().Model(&out).Where("workspace_id = ?", ws).Order("created_at", "id").Scan(ctx); err != nil {
		return nil, wrap(err, "list endpoints")
	}
	return out, nil
}

// UpdateEndpoint writes the given columns of ep (and updated_at).
func UpdateEndpoint(ctx context.Context, db bun.IDB, ep *schema.WebhookEndpoint, columns ...string) error {
	ep.UpdatedAt = now()
	res, err := db.NewUpdate().Model(ep).Column(append(columns, "updated_at")...).
		Where("id = ? AND workspace_id = ?", ep.ID, ep.WorkspaceID).Exec(ctx)
	if err != nil {
		return wrap(err, "update endpoint %q", ep.ID)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: update endpoint %q: %w", ep.ID, ErrNotFound)
	}
	return nil
}

// DeleteEndpoint deletes a workspace's endpoint with its deliveries; it reports whether it existed.
func DeleteEndpoint(ctx context.Context, db bun.IDB, ws, id string) (bool, error) {
	var existed bool
	err := inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		// Explicitly, not by ON DELETE CASCADE alone: SQLite enforces it only with foreign_keys on.
		if _, err := tx.NewDelete().Model((*schema.WebhookAttempt)(nil)).
			Where("delivery_id IN (SELECT id FROM webhook_deliveries WHERE endpoint_id = ? AND workspace_id = ?)", id, ws).
			Exec(ctx); err != nil {
			return err
		}
		if _, err := tx.NewDelete().Model((*schema.WebhookDelivery)(nil)).Where("endpoint_id = ? AND workspace_id = ?", id, ws).Exec(ctx); err != nil {
			return err
		}
		res, err := tx.NewDelete().Model((*schema.WebhookEndpoint)(nil)).Where("id = ? AND workspace_id = ?", id, ws).Exec(ctx)
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		existed = n > 0
		return nil
	})
	return existed, wrap(err, "delete endpoint %q", id)
}

// GetDelivery returns a delivery by id (for workers); with ws set, only that workspace's.
func GetDelivery(ctx context.Context, db bun.IDB, ws, id string) (*schema.WebhookDelivery, error) {
	d := new(schema.WebhookDelivery)
	q := db.NewSelect().Model(d).Where("id = ?", id)
	if ws != "" {
		q = q.Where("workspace_id = ?", ws)
	}
	if err := q.Scan(ctx); err != nil {
		return nil, wrap(err, "get delivery %q", id)
	}
	return d, nil
}

// ListDeliveries returns an endpoint's deliveries newest first, after the delivery before when set.
func ListDeliveries(ctx context.Context, db bun.IDB, endpointID, before string, limit int) ([]schema.WebhookDelivery, error) {
	out := []schema.WebhookDelivery{}
	q := db.NewSelect().Model(&out).Where("endpoint_id = ?", endpointID)
	if before != "" {
		q = q.Where(beforeCursor("webhook_deliveries"), before, before, before)
	}
	if err := q.Order("created_at DESC", "id DESC").Limit(int64(limit)).Scan(ctx); err != nil {
		return nil, wrap(err, "list deliveries")
	}
	return out, nil
}

// ListAttempts returns the attempts of the given deliveries, by delivery id, in attempt order.
func ListAttempts(ctx context.Context, db bun.IDB, deliveryIDs []string) (map[string][]schema.WebhookAttempt, error) {
	out := map[string][]schema.WebhookAttempt{}
	if len(deliveryIDs) == 0 {
		return out, nil
	}
	var as []schema.WebhookAttempt
	if err := db.NewSelect().Model(&as).Where("delivery_id IN (?)", bun.In(deliveryIDs)).Order("delivery_id", "n").Scan(ctx); err != nil {
		return nil, wrap(err, "list attempts")
	}
	for _, a := range as {
		out[a.DeliveryID] = append(out[a.DeliveryID], a)
	}
	return out, nil
}

// RecordAttempt logs one attempt of delivery d and moves d on: succeeded when ok, else still pending with the
// answer's status and error. It returns the attempt's number.
func RecordAttempt(ctx context.Context, db bun.IDB, d *schema.WebhookDelivery, a *schema.WebhookAttempt, ok bool) error {
	return inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		var n int64
		if err := tx.NewSelect().Model((*schema.WebhookAttempt)(nil)).ColumnExpr("COALESCE(MAX(n), 0)").
			Where("delivery_id = ?", d.ID).Scan(ctx, &n); err != nil {
			return wrap(err, "number attempt of %q", d.ID)
		}
		t := now()
		a.ID, a.DeliveryID, a.N, a.CreatedAt = schema.NewSortableID(schema.PrefixAttempt, t), d.ID, n+1, t
		if _, err := tx.NewInsert().Model(a).Exec(ctx); err != nil {
			return wrap(err, "record attempt of %q", d.ID)
		}
		d.Attempts, d.LastStatusCode, d.LastError, d.UpdatedAt = n+1, a.StatusCode, a.Error, t
		cols := []string{"attempts", "last_status_code", "last_error", "updated_at"}
		if ok {
			d.Status, d.FinishedAt = schema.DeliverySucceeded, &t
			cols = append(cols, "status", "finished_at")
		}
		if _, err := tx.NewUpdate().Model(d).Column(cols...).WherePK().Exec(ctx); err != nil {
			return wrap(err, "update delivery %q", d.ID)
		}
		return nil
	})
}

// FinishDelivery marks a pending delivery failed (its retry window passed); a delivery that succeeded meanwhile
// stays succeeded.
func FinishDelivery(ctx context.Context, db bun.IDB, id, reason string) error {
	t := now()
	_, err := db.NewUpdate().Model((*schema.WebhookDelivery)(nil)).Set("status = ?", schema.DeliveryFailed).
		Set("finished_at = ?", t).Set("updated_at = ?", t).Set("last_error = ?", reason).
		Where("id = ? AND status = ?", id, schema.DeliveryPending).Exec(ctx)
	return wrap(err, "fail delivery %q", id)
}

// ResetDelivery makes a delivery pending again for a redelivery (not yet dispatched); it answers false when the
// delivery is pending already.
func ResetDelivery(ctx context.Context, db bun.IDB, ws, id string) (bool, error) {
	res, err := db.NewUpdate().Model((*schema.WebhookDelivery)(nil)).Set("status = ?", schema.DeliveryPending).
		Set("dispatched = ?", false).Set("finished_at = NULL").Set("updated_at = ?", now()).
		Where("id = ? AND workspace_id = ? AND status <> ?", id, ws, schema.DeliveryPending).Exec(ctx)
	if err != nil {
		return false, wrap(err, "reset delivery %q", id)
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// MarkDispatched records that deliveries' workflows were started.
func MarkDispatched(ctx context.Context, db bun.IDB, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := db.NewUpdate().Model((*schema.WebhookDelivery)(nil)).Set("dispatched = ?", true).
		Where("id IN (?)", bun.In(ids)).Exec(ctx)
	return wrap(err, "mark deliveries dispatched")
}

// DeliveryWorkspaces answers the workspace of each delivery of ids that exists, by delivery id.
func DeliveryWorkspaces(ctx context.Context, db bun.IDB, ids []string) (map[string]string, error) {
	out := map[string]string{}
	if len(ids) == 0 {
		return out, nil
	}
	var rows []schema.WebhookDelivery
	err := db.NewSelect().Model(&rows).Column("id", "workspace_id").Where("id IN (?)", bun.In(ids)).Scan(ctx)
	if err != nil {
		return nil, wrap(err, "deliveries' workspaces")
	}
	for _, r := range rows {
		out[r.ID] = r.WorkspaceID
	}
	return out, nil
}

// Undispatched returns pending deliveries created before olderThan whose workflows were not started (the process
// that recorded them died first, or Temporal did not answer), oldest first.
func Undispatched(ctx context.Context, db bun.IDB, olderThan time.Time, limit int) ([]string, error) {
	var ids []string
	err := db.NewSelect().Model((*schema.WebhookDelivery)(nil)).Column("id").
		Where("NOT dispatched AND status = ? AND created_at < ?", schema.DeliveryPending, olderThan).
		Order("created_at").Limit(int64(limit)).Scan(ctx, &ids)
	return ids, wrap(err, "undispatched deliveries")
}

// CreateUpload stores an upload row; ID and time are filled in.
func CreateUpload(ctx context.Context, db bun.IDB, u *schema.Upload) error {
	u.ID, u.CreatedAt = schema.NewID(schema.PrefixUpload), now()
	if _, err := db.NewInsert().Model(u).Exec(ctx); err != nil {
		return wrap(err, "create upload")
	}
	return nil
}

// GetUpload returns a workspace's upload; another workspace's is ErrNotFound.
func GetUpload(ctx context.Context, db bun.IDB, ws, id string) (*schema.Upload, error) {
	u := new(schema.Upload)
	if err := db.NewSelect().Model(u).Where("id = ? AND workspace_id = ?", id, ws).Scan(ctx); err != nil {
		return nil, wrap(err, "get upload %q", id)
	}
	return u, nil
}

// PruneEvents deletes up to limit events recorded before before, with their deliveries and attempts, except events
// with a delivery still pending; it answers how many it deleted.
func PruneEvents(ctx context.Context, db bun.IDB, before time.Time, limit int) (int, error) {
	var ids []string
	err := db.NewSelect().Model((*schema.Event)(nil)).Column("id").Where("created_at < ?", before).
		Where("NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = event.id AND d.status = ?)", schema.DeliveryPending).
		Order("created_at").Limit(int64(limit)).Scan(ctx, &ids)
	if err != nil || len(ids) == 0 {
		return 0, wrap(err, "events to prune")
	}
	err = inTx(ctx, db, func(ctx context.Context, tx bun.Tx) error {
		if _, err := tx.NewDelete().Model((*schema.WebhookAttempt)(nil)).
			Where("delivery_id IN (SELECT id FROM webhook_deliveries WHERE event_id IN (?))", bun.In(ids)).Exec(ctx); err != nil {
			return err
		}
		if _, err := tx.NewDelete().Model((*schema.WebhookDelivery)(nil)).Where("event_id IN (?)", bun.In(ids)).Exec(ctx); err != nil {
			return err
		}
		_, err := tx.NewDelete().Model((*schema.Event)(nil)).Where("id IN (?)", bun.In(ids)).Exec(ctx)
		return err
	})
	if err != nil {
		return 0, wrap(err, "prune events")
	}
	return len(ids), nil
}
