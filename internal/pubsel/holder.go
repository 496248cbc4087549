package pubsel

// remove drops a target no holder uses: its prober stops, its id is freed
// for reuse once onRemove (called first) has forgotten it. t.mu is held.
func (t *Tracker) remove(tg *target, onRemove func(id uint32)) {
	if tg.cancel != nil {
		tg.cancel()
	}
	delete(t.targets, tg.addr)
	t.publishAddrs()
	tg.removed.Store(true)
	st := *tg.status.Load()
	st.Active, st.Label = false, "removed"
	tg.setStatus(&st)
	if onRemove != nil {
		onRemove(tg.id)
	}
	t.free = append(t.free, tg.id)
	t.gen.Add(1)
}

// Holder is one user's claim on targets (a config generation's upstreams):
// a target stays probed while any holder (or Ensure) has it.
type Holder struct {
	t        *Tracker
	addrs    map[string]*target // under t.mu
	released bool
}

// Hold returns a new holder with no targets.
func (t *Tracker) Hold() *Holder { return &Holder{t: t, addrs: map[string]*target{}} }

// Ensure registers addr as a target held by h and returns its id.
func (h *Holder) Ensure(addr string) (uint32, error) {
	t := h.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.released {
		// A released holder's config may still serve its last requests
		// (Caddy cleans up without waiting for them): it finds the targets
		// others hold, but holds nothing new.
		if tg, ok := t.targets[addr]; ok {
			return tg.id, nil
		}
		return 0, ErrReleased
	}
	if tg, ok := h.addrs[addr]; ok {
		return tg.id, nil
	}
	tg, err := t.ensureLocked(addr)
	if err != nil {
		return 0, err
	}
	tg.refs++
	h.addrs[addr] = tg
	return tg.id, nil
}

// Release lets go of h's targets; those no other holder has are removed,
// and onRemove (if set) is called with each one's id before it is reused.
func (h *Holder) Release(onRemove func(id uint32)) {
	t := h.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.released {
		return
	}
	h.released = true
	for _, tg := range h.addrs {
		if tg.refs--; tg.refs == 0 && !tg.pinned {
			t.remove(tg, onRemove)
		}
	}
	h.addrs = nil
}
