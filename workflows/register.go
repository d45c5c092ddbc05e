package workflows

import "go.temporal.io/sdk/workflow"

// Registrar is the part of a worker (or the test environment) that takes workflow registrations.
type Registrar interface {
	RegisterWorkflowWithOptions(w any, options workflow.RegisterOptions)
}

// Register registers every workflow under its explicit name.
func Register(r Registrar) {
	r.RegisterWorkflowWithOptions(Build, workflow.RegisterOptions{Name: BuildWorkflowName})
	r.RegisterWorkflowWithOptions(Rebuild, workflow.RegisterOptions{Name: RebuildWorkflowName})
	r.RegisterWorkflowWithOptions(Twin, workflow.RegisterOptions{Name: TwinWorkflowName})
	r.RegisterWorkflowWithOptions(SettleSpans, workflow.RegisterOptions{Name: SettleSpansWorkflowName})
	RegisterSessions(r)
	RegisterWebhooks(r)
}
