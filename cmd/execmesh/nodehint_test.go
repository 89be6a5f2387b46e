package main

import "testing"

func TestNearestName(t *testing.T) {
	known := []string{"side", "build-1", "gpu-box", "0f3a9c2e7b1d4a58"}
	cases := []struct {
		name, want string
	}{
		{"sidee", "side"},
		{"SIDE", "side"},
		{"sid", "side"},
		{"biuld-1", "build-1"},
		{"build-2", "build-1"},
		{"gpu-bx", "gpu-box"},
		{"0f3a9c2e7b1d4a59", "0f3a9c2e7b1d4a58"},
		// Nothing near enough to be a typo: no suggestion.
		{"nosuch", ""},
		{"laptop", ""},
	}
	for _, c := range cases {
		if got := nearestName(c.name, known); got != c.want {
			t.Errorf("nearestName(%q) = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	cases := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"side", "side", 0},
		{"side", "sidee", 1},
		{"side", "sdie", 2},
		{"kitten", "sitting", 3},
		{"", "abc", 3},
		{"héllo", "hello", 1},
	}
	for _, c := range cases {
		if got := editDistance(c.a, c.b); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
