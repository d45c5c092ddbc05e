package usage

import (
	"github.com/doppel-dev/doppel/schema"
)

// Plans are the configured plans by name, with the plan of workspaces that name none.
type Plans struct {
	ByName map[string]Plan
	// Default names the plan of a workspace whose plan is "" ("" here: no plan, so no limits).
	Default string
}

// Of returns the name and plan of ws. A workspace on no plan, or on a plan the configuration no longer has, has no
// limits and its name says so.
func (p Plans) Of(ws *schema.Workspace) (string, Plan) {
	name := ws.Plan
	if name == "" {
		name = p.Default
	}
	if pl, ok := p.ByName[name]; ok {
		return name, pl
	}
	return name, Plan{}
}

// Has reports whether name is a configured plan.
func (p Plans) Has(name string) bool {
	_, ok := p.ByName[name]
	return ok
}
