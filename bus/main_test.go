package bus_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when any test leaves a goroutine behind
// (servers, connections, micro services, watchers).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
