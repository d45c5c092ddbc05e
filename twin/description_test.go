package twin_test

import (
	"testing"

	"github.com/doppel-dev/doppel/twin"
)

// A tool's listed description: its definition's, else a plain sentence from its name; never provenance.
func TestToolDescription(t *testing.T) {
	for _, c := range []struct {
		tool      twin.Tool
		desc, src string
	}{
		{twin.Tool{Name: "get_user_details", Description: "Get a user's profile.", DescriptionFrom: twin.DescribedByDefinition}, "Get a user's profile.", "definition"},
		{twin.Tool{Name: "get_user_details", Description: "Get user details.", DescriptionFrom: twin.DescribedByName}, "Get user details.", "name"},
		// Bundles built before DescriptionFrom: a definition's text stays, the generated one is replaced.
		{twin.Tool{Name: "get_user_details", Description: "Get a user's profile."}, "Get a user's profile.", "definition"},
		{twin.Tool{Name: "get_user_details", Description: "get user details (described from 121 recorded calls)"}, "Get user details.", "name"},
		{twin.Tool{Name: "list-all.flights"}, "List all flights.", "name"},
		{twin.Tool{Name: "_"}, "A tool.", "name"},
	} {
		desc, src := twin.ToolDescription(c.tool)
		if desc != c.desc || src != c.src {
			t.Errorf("%+v: %q from %s, want %q from %s", c.tool, desc, src, c.desc, c.src)
		}
	}
}
