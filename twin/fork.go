package twin

import "github.com/doppel-dev/doppel/jsonvalue"

// overlay is a session's rows beyond the base world: table → key → row (nil row: deleted). Rows in an overlay are
// never changed in place (a call's writes put new rows), so overlays may share them.
type overlay map[string]map[string]*jsonvalue.Object

// clone copies the overlay's maps, sharing the rows.
func (o overlay) clone() overlay {
	out := make(overlay, len(o))
	for t, rows := range o {
		m := make(map[string]*jsonvalue.Object, len(rows))
		for k, r := range rows {
			m[k] = r
		}
		out[t] = m
	}
	return out
}

func (th *tableHash) clone() *tableHash {
	c := &tableHash{keys: make(map[int][]string, len(th.keys)), dirty: make(map[int]bool, len(th.dirty)), digest: th.digest}
	for b, ks := range th.keys {
		c.keys[b] = append([]string(nil), ks...)
	}
	for b := range th.dirty {
		c.dirty[b] = true
	}
	if th.digests != nil {
		c.digests = append([]digest(nil), th.digests...)
	}
	return c
}

// Fork makes an independent session whose world is exactly this session's world now. It is copy-on-write: the
// fork copies the session's overlay maps (what its seed rows and writes cost) and shares every row and the base
// world; later writes to either session never reach the other. The fork keeps the spec and the opening world, so
// a diff against the opening world means the same in both.
func (s *Session) Fork() (*Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	f := &Session{rt: s.rt, spec: s.spec, world: s.world, clock: s.clock, over: overlay(s.over).clone(), opening: s.opening,
		hash: s.hash, dirty: s.dirty, traceID: s.traceID, traceAt: s.traceAt}
	if s.hashes != nil {
		f.hashes = make(map[string]*tableHash, len(s.hashes))
		for t, th := range s.hashes {
			f.hashes[t] = th.clone()
		}
	}
	return f, nil
}

// snapshot copies the session's overlay under its lock, so a diff reads a consistent world while calls go on.
func (s *Session) snapshot() (overlay, overlay, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, ErrClosed
	}
	return overlay(s.over).clone(), s.opening, nil
}
