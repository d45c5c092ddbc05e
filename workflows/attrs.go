package workflows

import (
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// Custom search attributes doppel sets on its workflows, so an operator can filter them in the Temporal UI by
// workspace, environment and build (`DoppelEnv = "env_…"`). A namespace must have them registered: `doppel dev`
// does at start; on a cluster see docs/temporal.md. Where the namespace lacks them, workflows start without any.
var (
	WorkspaceAttr = temporal.NewSearchAttributeKeyKeyword("DoppelWorkspace")
	EnvAttr       = temporal.NewSearchAttributeKeyKeyword("DoppelEnv")
	BuildAttr     = temporal.NewSearchAttributeKeyKeyword("DoppelBuild")
)

// Tags are the search attributes of a workflow about a workspace, an environment and a build; "" leaves one unset.
func Tags(workspaceID, envID, buildID string) temporal.SearchAttributes {
	var set []temporal.SearchAttributeUpdate
	for _, a := range []struct {
		key temporal.SearchAttributeKeyKeyword
		v   string
	}{{WorkspaceAttr, workspaceID}, {EnvAttr, envID}, {BuildAttr, buildID}} {
		if a.v != "" {
			set = append(set, a.key.ValueSet(a.v))
		}
	}
	return temporal.NewSearchAttributes(set...)
}

// ChildTags are the search attributes of a child workflow about buildID: the parent's, with DoppelBuild set to
// buildID when given. A parent started without doppel's attributes (its namespace lacks them) gives none.
func ChildTags(ctx workflow.Context, buildID string) temporal.SearchAttributes {
	parent := workflow.GetTypedSearchAttributes(ctx)
	if !parent.ContainsKey(EnvAttr) {
		return temporal.SearchAttributes{}
	}
	if buildID == "" {
		return temporal.NewSearchAttributes(parent.Copy())
	}
	return temporal.NewSearchAttributes(parent.Copy(), BuildAttr.ValueSet(buildID))
}
