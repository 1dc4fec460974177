package presence

import (
	"testing"
	"time"
)

func TestStampKeepsTheInstantAndTheZeroTime(t *testing.T) {
	if s := stampOf(time.Time{}); s != 0 || !s.time().IsZero() {
		t.Fatalf("the zero time became %d, read back as %v", s, s.time())
	}
	for _, at := range []time.Time{time.Now(), time.Date(2261, 12, 31, 23, 59, 59, 999999999, time.UTC), time.Unix(1, 1)} {
		if got := stampOf(at).time(); !got.Equal(at) {
			t.Errorf("%v read back as %v", at, got)
		}
	}
}
