package loadgen

import (
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"
)

// Histogram records durations in microseconds, in log-linear buckets (64
// per power of two: under 1.6% error), in memory bounded by the range, and
// merges: workers send theirs to the driver as JSON.
type Histogram struct {
	N       uint64         `json:"n"`
	SumUS   float64        `json:"sum_us"`
	MinUS   int64          `json:"min_us"`
	MaxUS   int64          `json:"max_us"`
	Buckets map[int]uint64 `json:"buckets,omitempty"` // bucket index → count
}

const subBits = 6 // 64 sub-buckets per power of two

func bucketOf(us int64) int {
	if us < 2<<subBits {
		return int(us)
	}
	shift := bits.Len64(uint64(us)) - (subBits + 1)
	top := us >> shift // in [64, 128)
	return 2<<subBits + (shift-1)<<subBits + int(top) - 1<<subBits
}

// bucketMid is the middle of bucket i, in microseconds.
func bucketMid(i int) float64 {
	if i < 2<<subBits {
		return float64(i)
	}
	j := i - 2<<subBits
	shift := j>>subBits + 1
	top := int64(j&(1<<subBits-1)) + 1<<subBits
	low := top << shift
	return float64(low) + float64(int64(1)<<shift-1)/2
}

// Record adds one value; a negative one counts as 0.
func (h *Histogram) Record(d time.Duration) {
	us := max(d.Microseconds(), 0)
	if h.Buckets == nil {
		h.Buckets = make(map[int]uint64)
	}
	if h.N == 0 || us < h.MinUS {
		h.MinUS = us
	}
	if us > h.MaxUS {
		h.MaxUS = us
	}
	h.N++
	h.SumUS += float64(us)
	h.Buckets[bucketOf(us)]++
}

// Merge adds o's values to h.
func (h *Histogram) Merge(o Histogram) {
	if o.N == 0 {
		return
	}
	if h.Buckets == nil {
		h.Buckets = make(map[int]uint64, len(o.Buckets))
	}
	if h.N == 0 || o.MinUS < h.MinUS {
		h.MinUS = o.MinUS
	}
	h.MaxUS = max(h.MaxUS, o.MaxUS)
	h.N += o.N
	h.SumUS += o.SumUS
	for i, c := range o.Buckets {
		h.Buckets[i] += c
	}
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1), 0 when empty. The extremes
// are exact; the rest is the middle of their bucket.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.N == 0 {
		return 0
	}
	if q <= 0 {
		return time.Duration(h.MinUS) * time.Microsecond
	}
	if q >= 1 {
		return time.Duration(h.MaxUS) * time.Microsecond
	}
	idx := make([]int, 0, len(h.Buckets))
	for i := range h.Buckets {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	rank := uint64(math.Ceil(q * float64(h.N)))
	var seen uint64
	for _, i := range idx {
		seen += h.Buckets[i]
		if seen >= rank {
			v := math.Min(math.Max(bucketMid(i), float64(h.MinUS)), float64(h.MaxUS))
			return time.Duration(v * float64(time.Microsecond))
		}
	}
	return time.Duration(h.MaxUS) * time.Microsecond
}

// Mean returns the average, 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.N == 0 {
		return 0
	}
	return time.Duration(h.SumUS / float64(h.N) * float64(time.Microsecond))
}

// Max returns the largest value recorded.
func (h *Histogram) Max() time.Duration { return time.Duration(h.MaxUS) * time.Microsecond }

// syncHist is a Histogram for many goroutines.
type syncHist struct {
	mu sync.Mutex
	h  Histogram
}

func (s *syncHist) Record(d time.Duration) {
	s.mu.Lock()
	s.h.Record(d)
	s.mu.Unlock()
}

// take returns a copy of the histogram.
func (s *syncHist) take() Histogram {
	s.mu.Lock()
	defer s.mu.Unlock()
	var c Histogram
	c.Merge(s.h)
	return c
}
