package state

// Wake marks due the call that waits on the work kind/id, whose host learned that the work ended
// (a wait its host wakes: wire.Wait.Woken), so that the run's next step looks at it. It reports
// whether the state changed: false when no call of a going run waits on that work, or the look is
// due already.
func (st *State) Wake(kind, id string) bool {
	if st.Ended() {
		return false
	}
	for i := range st.Calls {
		c := &st.Calls[i]
		if c.Phase == PhaseWaiting && c.Wait != nil && c.Wait.Kind == kind && c.Wait.ID == id && !c.Wait.Due {
			c.Wait.Due = true
			return true
		}
	}
	return false
}
