package main

import "testing"

func TestJoinCode(t *testing.T) {
	tests := []struct {
		name, out, want string
		ok              bool
	}{
		{"the printed line", "execmesh node --join eyJ2IjoxfQ\n", "eyJ2IjoxfQ", true},
		{"no code", "execmesh node --join \n", "", false},
		{"another command", "execmesh node --nats-url nats://x:4222\n", "", false},
		{"two lines", "execmesh node --join abc\nexecmesh node --join def\n", "", false},
		{"words after the code", "execmesh node --join abc --name x", "", false},
		{"nothing", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := joinCode(tc.out)
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("joinCode(%q) = %q, %v; want %q, ok %v", tc.out, got, err, tc.want, tc.ok)
			}
		})
	}
}
