// Package editdistance measures how far apart two names are, for the "did
// you mean" hints of the configuration, the command line and the schema
// check: one measure for all of them.
package editdistance

// Between is the Levenshtein distance between a and b (in bytes: the
// names it compares are ASCII): the fewest single-byte insertions,
// deletions and substitutions that turn a into b.
func Between(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
