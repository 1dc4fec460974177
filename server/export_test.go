package server

// HoldBigFrames takes every slot of the lane that a flooding connection's
// big frames are decoded in, until release is called.
func (s *Server) HoldBigFrames() (release func()) {
	for range cap(s.bigFrames) {
		s.bigFrames <- struct{}{}
	}
	return func() {
		for range cap(s.bigFrames) {
			<-s.bigFrames
		}
	}
}
