package proxy

// TakeAnswerMemory takes all the room for whole answers in memory (max_response_memory), as
// answers held by callers reading at a trickle would, until the returned func gives it back:
// an answer read whole meanwhile finds none.
func (s *Server) TakeAnswerMemory() (giveBack func()) {
	n := s.cfg.Limits.ResponseMemoryBound()
	if !s.answers.sem.TryAcquire(n) {
		panic("proxy: answer memory in use")
	}
	return func() { s.answers.sem.Release(n) }
}
