package state

// Ended reports whether the run is over: the model ended it, or the host did (End).
func (st *State) Ended() bool { return st.Status != "" || st.Outcome != nil }

// End ends a run that has not ended with the host's reason; a run that ended stays as it was.
func (st *State) End(reason, message string) {
	if st.Ended() {
		return
	}
	st.Outcome = &Outcome{Reason: reason, Message: message}
}
