package bus

import (
	"crypto/x509"
	"errors"
	"fmt"
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
	// An expired certificate's error carries the clock; the reason is
	// the same on every attempt.
	expired := func(at time.Time) error {
		return fmt.Errorf("nats: tls error: %w", x509.CertificateInvalidError{Reason: x509.Expired,
			Detail: fmt.Sprintf("current time %s is after 2026-01-01T00:00:00Z", at.Format(time.RFC3339))})
	}
	at := now.Add(3*time.Second + connectWarnEvery)
	if !st.noteFailure(expired(at), at) {
		t.Fatal("an expired certificate is not warned")
	}
	if st.noteFailure(expired(at.Add(5*time.Second)), at.Add(5*time.Second)) {
		t.Fatal("the same expired certificate is warned again within the interval, because the clock in its error moved")
	}
	if st.err() == nil {
		t.Fatal("the last error is not kept")
	}
}
