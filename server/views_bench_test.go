package server

import (
	"fmt"
	"testing"

	"github.com/greendot/greendot/presence"
)

// BenchmarkViewsRoute routes changes of one subject to a team of members
// who agree, and to one where each change follows a snapshot that
// disagreed (a mixed view: odds are made, then dropped by the change).
func BenchmarkViewsRoute(b *testing.B) {
	for _, mixed := range []bool{false, true} {
		b.Run(fmt.Sprintf("mixed=%v", mixed), func(b *testing.B) {
			v := newViews()
			v.read("t", seen("bob", presence.Online, 1), nil, false)
			reader := &client{}
			reader.noted.Store(true)
			d := make([]reach, 1)
			teams := []string{"t"}
			b.ReportAllocs()
			for i := range b.N {
				ver := uint64(2*i + 2)
				if mixed {
					v.read("t", seen("bob", presence.Away, ver), reader, true)
				}
				v.route(teams, change("bob", presence.Online+presence.State(i%2), ver+1), d)
			}
		})
	}
}
