package presence

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// refDeadlines is deadlines as container/heap would keep them.
type refDeadlines []deadline

func (d refDeadlines) Len() int           { return len(d) }
func (d refDeadlines) Less(i, j int) bool { return d[i].at.Before(d[j].at) }
func (d refDeadlines) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *refDeadlines) Push(x any)        { *d = append(*d, x.(deadline)) }
func (d *refDeadlines) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// deadlines' own push and pop give what container/heap gives, ties (many
// here: eight distinct times) in the same order, and pop in time order.
func TestDeadlinesPopAsContainerHeap(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	var got deadlines
	var want refDeadlines
	for step := range 20000 {
		if len(got) == 0 || r.IntN(3) > 0 {
			d := deadline{at: t0.Add(time.Duration(r.IntN(8)) * time.Second), key: fmt.Sprint(step)}
			got.push(d)
			heap.Push(&want, d)
			continue
		}
		g, w := got.pop(), heap.Pop(&want).(deadline)
		if g != w {
			t.Fatalf("step %d: popped %v, container/heap %v", step, g, w)
		}
		if len(got) > 0 && got[0].at.Before(g.at) {
			t.Fatalf("step %d: popped %v before %v", step, g.at, got[0].at)
		}
	}
	if cap(got) > len(got) && got[:cap(got)][len(got)].key != "" {
		t.Fatal("a popped deadline's id stays in the spare capacity")
	}
}
