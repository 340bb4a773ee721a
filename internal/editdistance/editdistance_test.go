package editdistance

import "testing"

func TestBetween(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "abc", 3}, {"jobreaper", "jobreaper", 0}, {"jobreapr", "jobreaper", 1},
		{"jobrepaer", "jobreaper", 2}, {"stall-timout", "stall-timeout", 1}, {"public", "jobreaper", 8},
	} {
		if got := Between(c.a, c.b); got != c.want {
			t.Errorf("Between(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
		if got := Between(c.b, c.a); got != c.want {
			t.Errorf("Between(%q, %q) = %d, want %d (symmetric)", c.b, c.a, got, c.want)
		}
	}
}
