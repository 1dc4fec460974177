package server

import (
	"slices"
	"testing"
)

func TestTeamSetStaysSortedAndUnique(t *testing.T) {
	var s teamSet
	for _, team := range []string{"m", "a", "z", "m", "b"} {
		s.add(team)
	}
	if want := (teamSet{"a", "b", "m", "z"}); !slices.Equal(s, want) {
		t.Fatalf("after adds: %q, want %q", s, want)
	}
	s.remove("m")
	s.remove("absent")
	if want := (teamSet{"a", "b", "z"}); !slices.Equal(s, want) {
		t.Fatalf("after removes: %q, want %q", s, want)
	}
	for team, want := range map[string]bool{"a": true, "z": true, "m": false, "": false} {
		if got := s.has(team); got != want {
			t.Errorf("has(%q) = %v, want %v", team, got, want)
		}
	}
}
