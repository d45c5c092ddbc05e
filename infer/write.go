package infer

import "github.com/doppel-dev/doppel/twin"

// synthWrite learns a write's effect on its target row.
func (m *model) synthWrite(ti *toolInfo) {
	ti.kind = twin.KindWrite
	if m.synthTemplate(ti) {
		return
	}
	ti.kind = twin.KindWrite
	ti.notes = append(ti.notes, "write answered from recordings: its effect was not learned")
}
