package api

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// The streamed batch (@trpc/client's httpBatchStreamLink, trpc-accept: application/jsonl), as tRPC v11's
// jsonlStreamProducer writes it (packages/server/src/unstable-core-do-not-import/stream/jsonl.ts and the batch
// branch of http/resolveResponse.ts, trpc/trpc commit 340811ba5320637fbaf48fccf3dbfdd258bd34db): one JSON value a
// line. The first line is the head, an object keyed by batch index whose every value is a promise placeholder,
// [[0],[null,0,<chunk>]], chunk i standing for procedure i. Each later line settles one chunk as
// [<chunk>, 0 (fulfilled), <encoded value>]: a failed procedure settles to [[{"error": <shape>}]]; a successful one
// to [[{"result":0}],["result",0,<chunk'>]], whose chunk' settles to [[{"data":0}],["data",0,<chunk''>]], whose
// chunk'' settles to [[<data>]] — the nesting tRPC makes by wrapping result and data in promises. New chunk ids
// count on from the batch's length, in the order they are made. The answer is 200 whatever each procedure's
// status: each carries its own in its error shape. Procedures run in order, each line flushed as it is written.

// jsonlPromise is a chunk definition of an encoded value: [key, 0 (a promise), chunk id].
func jsonlPromise(key any, chunk int) []any { return []any{key, 0, chunk} }

func (t *trpc) stream(w http.ResponseWriter, r *http.Request, names []string, inputs []json.RawMessage) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Vary", "trpc-accept, accept")
	w.WriteHeader(http.StatusOK)
	flush := func() { _ = http.NewResponseController(w).Flush() }
	enc := json.NewEncoder(w) // Encode ends each value with the line's \n
	head := make(map[string]any, len(names))
	for i := range names {
		head[strconv.Itoa(i)] = []any{[]any{0}, jsonlPromise(nil, i)}
	}
	if enc.Encode(head) != nil {
		return
	}
	flush()
	next := len(names)
	for i, name := range names {
		_, res := t.call(r, name, inputs[i])
		var lines [][]any
		if res.Error != nil {
			lines = [][]any{{i, 0, []any{[]any{map[string]any{"error": res.Error}}}}}
		} else {
			result, data := next, next+1
			next += 2
			lines = [][]any{
				{i, 0, []any{[]any{map[string]any{"result": 0}}, jsonlPromise("result", result)}},
				{result, 0, []any{[]any{map[string]any{"data": 0}}, jsonlPromise("data", data)}},
				{data, 0, []any{[]any{res.Result.Data}}},
			}
		}
		for _, l := range lines {
			if enc.Encode(l) != nil {
				return
			}
		}
		flush()
	}
}
