package devserver

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
)

// addSearchAttributes registers on namespace the custom search attributes it lacks, as `temporal operator
// search-attribute create` does, and waits until workflows can be listed by them (the namespace caches refresh);
// an attribute registered with another type is an error.
func addSearchAttributes(ctx context.Context, addr, namespace string, want map[string]enumspb.IndexedValueType, logger *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := client.DialContext(ctx, client.Options{HostPort: addr, Namespace: namespace, Logger: sdklog.NewStructuredLogger(logger)})
	if err != nil {
		return fmt.Errorf("devserver: search attributes: %w", err)
	}
	defer c.Close()
	have, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("devserver: list search attributes: %w", err)
	}
	missing := map[string]enumspb.IndexedValueType{}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		typ, ok := have.GetCustomAttributes()[name]
		switch {
		case !ok:
			missing[name] = want[name]
		case typ != want[name]:
			return fmt.Errorf("devserver: search attribute %s is a %s, not a %s", name, typ, want[name])
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if _, err := c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: namespace, SearchAttributes: missing}); err != nil {
		return fmt.Errorf("devserver: add search attributes: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(missing)) {
		for {
			_, err := c.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{Namespace: namespace,
				Query: name + " IS NOT NULL"})
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("devserver: search attribute %s not usable: %w", name, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}
