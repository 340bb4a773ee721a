package asynqstate

import (
	"fmt"
	"testing"
)

// BenchmarkInspectorListerListActive measures one ListActive call of a
// queue holding n active tasks on the real Redis: the cost a pass pays per
// queue. ns/task is the cost per listed task.
func BenchmarkInspectorListerListActive(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("active=%d", n), func(b *testing.B) {
			lb := setupLister(b)
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("%s-%05d", lb.queue, i)
			}
			lb.runActive(b, ids...)
			b.ReportAllocs()
			for b.Loop() {
				tasks, err := lb.lister.ListActive(b.Context(), lb.queue)
				if err != nil || len(tasks.IDs) != n {
					b.Fatalf("listed %d tasks (err %v), want %d", len(tasks.IDs), err, n)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/task")
		})
	}
}
