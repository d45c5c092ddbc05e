// Package wfclient is the callers' side of doppel's workflows: it starts them and sends them signals, updates and
// queries from outside. The API, the tool plane and the query service reach Temporal only through the small
// interfaces they declare, which cmd/doppel fills with this package's types; the workflows themselves are in
// workflows and query/flow, which import no Temporal client.
package wfclient

import "go.temporal.io/sdk/client"

// Conn is what every starter holds: the Temporal client and the task queue doppel's workers poll.
type Conn struct {
	Client    client.Client
	TaskQueue string
}
