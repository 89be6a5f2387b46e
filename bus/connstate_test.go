package bus

import (
	"errors"
	"testing"
	"time"
)

func TestConnectFailureWarnings(t *testing.T) {
	var st connState
	now := time.Unix(1000, 0)
	refused := errors.New("nats: Authorization Violation")
	if !st.noteFailure(refused, now) {
		t.Fatal("the first failure is not warned")
	}
	if st.noteFailure(refused, now.Add(time.Second)) {
		t.Fatal("the same failure is warned again within the interval")
	}
	if !st.noteFailure(errors.New("x509: certificate has expired"), now.Add(2*time.Second)) {
		t.Fatal("a new reason is not warned")
	}
	if !st.noteFailure(errors.New("x509: certificate has expired"), now.Add(2*time.Second+connectWarnEvery)) {
		t.Fatal("the same failure is not warned again after the interval")
	}
	if st.err() == nil {
		t.Fatal("the last error is not kept")
	}
}
