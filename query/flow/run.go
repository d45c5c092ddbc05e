package flow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/doppel-dev/doppel/blob"
	"github.com/doppel-dev/doppel/llm"
	"github.com/doppel-dev/doppel/query"
)

// runRecord is a query's run as its activities keep it, so the workflow passes a key and not the conversation:
// the user's input, the conversation after it, the trace so far and the model's final answer. Each step writes
// a new record under its content address (a retried step writes its own, and only the key the workflow recorded
// is read); Earlier lists the records it follows, deleted once the query's row holds its result. The last record
// stays: the query's whole conversation, named in its history.
type runRecord struct {
	Input    string            `json:"input,omitempty"`
	Messages []llm.ChatMessage `json:"messages,omitempty"`
	Trace    []query.Span      `json:"trace,omitempty"`
	Response string            `json:"response,omitempty"`
	Earlier  []string          `json:"earlier,omitempty"`
}

// runPrefix is where a query's run records are kept.
func runPrefix(queryID string) string { return "queries/" + queryID + "/run" }

// readRun reads the run record at key; "" is the empty record a run starts from.
func (q *Activities) readRun(ctx context.Context, key string) (runRecord, error) {
	var rec runRecord
	if key == "" {
		return rec, nil
	}
	if q.Blobs == nil {
		return rec, errors.New("no blob store is configured for run records")
	}
	rc, err := q.Blobs.Get(ctx, key)
	if err != nil {
		return rec, fmt.Errorf("read run record %s: %w", key, err)
	}
	defer rc.Close()
	if err := json.NewDecoder(rc).Decode(&rec); err != nil {
		return rec, fmt.Errorf("decode run record %s: %w", key, err)
	}
	return rec, nil
}

// writeRun stores rec as the record following prev and answers its key. A failing store is tried three times.
func (q *Activities) writeRun(ctx context.Context, queryID, prev string, rec runRecord) (string, error) {
	if q.Blobs == nil {
		return "", errors.New("no blob store is configured for run records")
	}
	if prev != "" {
		rec.Earlier = append(rec.Earlier, prev)
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return "", err
	}
	for attempt := 1; ; attempt++ {
		key, err := blob.PutContent(ctx, q.Blobs, runPrefix(queryID), data, "application/json")
		if err == nil || attempt == 3 || ctx.Err() != nil {
			if err != nil {
				return "", fmt.Errorf("store run record of %s: %w", queryID, err)
			}
			return key, nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
}

// dropEarlier deletes the records the one at key follows; a failure is logged (they are garbage, not state).
func (q *Activities) dropEarlier(ctx context.Context, rec runRecord) {
	for _, k := range rec.Earlier {
		if err := q.Blobs.Delete(ctx, k); err != nil {
			q.log().Warn("delete an earlier run record", "key", k, "error", err)
		}
	}
}

// toolSpan is the trace's span of a tool call and its answer.
func toolSpan(tool, args string, ans ToolAnswer, replayed bool) query.Span {
	return query.Span{Kind: "tool", Label: tool, Dur: durText(ans.Took, ans.Ms), Detail: args, Result: ans.Content,
		Error: ans.Error || ans.Refused, Fidelity: ans.Fidelity, Rung: ans.Rung, Downgraded: ans.Downgraded, Replayed: replayed}
}

// durText is a step's time as text, to the microsecond (from took, or ms when took is unknown).
func durText(took time.Duration, ms int64) string {
	if took <= 0 {
		took = time.Duration(ms) * time.Millisecond
	}
	return took.Round(time.Microsecond).String()
}
