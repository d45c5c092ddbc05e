// Package wfclient is the callers' side of doppel's workflows: it starts them and sends them signals, updates and
// queries from outside. The API, the tool plane and the query service reach Temporal only through the small
// interfaces they declare, which cmd/doppel fills with this package's types; the workflows themselves are in
// workflows and query/flow, which import no Temporal client.
package wfclient

import (
	"context"
	"fmt"
	"maps"
	"slices"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/doppel-dev/doppel/workflows"
)

// Conn is what every starter holds: the Temporal client, the task queue doppel's workers poll, and whether the
// workflows it starts carry doppel's search attributes.
type Conn struct {
	Client    client.Client
	TaskQueue string
	// Tagged sets doppel's search attributes (workflows.Tags) on the workflows it starts. Leave it false where the
	// namespace lacks them (MissingSearchAttributes): the server refuses a start naming an unknown attribute.
	Tagged bool
}

// tags are the search attributes of a workflow about a workspace, an environment and a build, when Tagged.
func (c Conn) tags(workspaceID, envID, buildID string) temporal.SearchAttributes {
	if !c.Tagged {
		return temporal.SearchAttributes{}
	}
	return workflows.Tags(workspaceID, envID, buildID)
}

// SearchAttributes are doppel's custom search attributes and their types, to register on a namespace (`doppel dev`
// does at start; docs/temporal.md shows the commands for a cluster).
func SearchAttributes() map[string]enumspb.IndexedValueType {
	out := map[string]enumspb.IndexedValueType{}
	for _, k := range []temporal.SearchAttributeKeyKeyword{workflows.WorkspaceAttr, workflows.EnvAttr, workflows.BuildAttr} {
		out[k.GetName()] = enumspb.INDEXED_VALUE_TYPE_KEYWORD
	}
	return out
}

// MissingSearchAttributes answers, in order, the attributes of want the namespace does not have with their type.
func MissingSearchAttributes(ctx context.Context, c client.Client, namespace string, want map[string]enumspb.IndexedValueType) ([]string, error) {
	have, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return nil, fmt.Errorf("list the search attributes of %s: %w", namespace, err)
	}
	var missing []string
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if have.GetCustomAttributes()[name] != want[name] {
			missing = append(missing, name)
		}
	}
	return missing, nil
}

// CreateCommands are the Temporal CLI commands that register the named search attributes on namespace.
func CreateCommands(namespace string, names []string) []string {
	want := SearchAttributes()
	out := make([]string, 0, len(names))
	for _, n := range names {
		typ := "Keyword"
		if t, ok := want[n]; ok && t != enumspb.INDEXED_VALUE_TYPE_KEYWORD {
			typ = t.String()
		}
		out = append(out, fmt.Sprintf("temporal operator search-attribute create --namespace %s --name %s --type %s", namespace, n, typ))
	}
	return out
}
