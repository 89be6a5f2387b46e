package hostbus

import (
	"regexp"
	"testing"
)

func TestNewUUID(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 100 {
		u := newUUID()
		if !re.MatchString(u) || seen[u] || !validIdempotencyKey(u) {
			t.Fatalf("newUUID() = %q (seen %v)", u, seen[u])
		}
		seen[u] = true
	}
}
