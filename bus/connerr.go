package bus

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// tlsCheckTimeout bounds one TLS check of one server (dial, INFO, TLS
// handshake).
const tlsCheckTimeout = 3 * time.Second

// tlsChecker finds the certificate problem that nats.go hides behind
// "nats: nkeys not supported by the server".
//
// nats.go reads the server's INFO before it starts TLS, and a client with
// an nkey gives up right there when the INFO carries no nonce, i.e. when
// the server does not ask for nkey authentication. A server that is not
// the deployment's (a stray or impostor server, a test server left on the
// address, a server restored without its auth file) is refused with that
// message even when its certificate would not verify either, and the
// certificate is what an operator needs to hear about. So on that error
// the checker connects to every configured server once more, without
// credentials and with the same dialer and TLS settings, and reports the
// TLS verification failures it gets. Nothing secret is sent: a handshake
// that fails verification ends the connection before CONNECT. Checks run
// at most once per connectWarnEvery; in between the last finding is
// reused.
type tlsChecker struct {
	urls []string
	opts []nats.Option

	mu    sync.Mutex
	at    time.Time // when the last check ran
	found error     // what it found, nil for nothing
}

// newTLSChecker prepares the checks for cfg: url is the comma-separated
// server list. It returns nil for in-process connections.
func newTLSChecker(cfg ClientConfig, url string) *tlsChecker {
	if cfg.InProcess != nil {
		return nil
	}
	opts := []nats.Option{
		nats.Name(strings.TrimSpace(cfg.Name + " (TLS check)")),
		nats.Timeout(tlsCheckTimeout),
		nats.NoReconnect(),
		nats.NoCallbacksAfterClientClose(),
	}
	if cfg.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCAFile))
	}
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCertFile, cfg.TLSKeyFile))
	}
	// The caller's options may bring a dialer or TLS settings of their
	// own; take those, and nothing else (handlers, credentials).
	o := nats.GetDefaultOptions()
	for _, opt := range cfg.Options {
		if opt != nil {
			_ = opt(&o)
		}
	}
	if o.CustomDialer != nil {
		opts = append(opts, nats.SetCustomDialer(o.CustomDialer))
	}
	switch {
	case o.TLSConfig != nil:
		opts = append(opts, nats.Secure(o.TLSConfig))
	case o.Secure:
		opts = append(opts, nats.Secure())
	}
	if o.TLSCertCB != nil || o.RootCAsCB != nil { // nats.RootCAs, nats.ClientCert
		opts = append(opts, nats.ClientTLSConfig(o.TLSCertCB, o.RootCAsCB))
	}
	if o.TLSHandshakeFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	return &tlsChecker{urls: strings.Split(url, ","), opts: opts}
}

// explain returns err, or, when err is nats.ErrNkeysNotSupported and a
// server's certificate fails verification, an error that leads with the
// verification failure and the server's URL and wraps both.
func (c *tlsChecker) explain(err error, now time.Time) error {
	if c == nil || !errors.Is(err, nats.ErrNkeysNotSupported) {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || now.Sub(c.at) >= connectWarnEvery {
		c.found, c.at = c.check(), now
	}
	if c.found == nil {
		return err
	}
	return fmt.Errorf("%w (nats.go stopped before the TLS handshake with \"%w\": the server does not ask for nkey authentication)", c.found, err)
}

// check connects to each server without credentials and returns the TLS
// failures, each prefixed with its server's URL.
func (c *tlsChecker) check() error {
	errs := make([]error, len(c.urls))
	var wg sync.WaitGroup
	for i, u := range c.urls {
		wg.Go(func() {
			nc, err := nats.Connect(u, c.opts...)
			if err == nil {
				nc.Close()
				return
			}
			if errors.Is(err, nats.ErrTLS) {
				errs[i] = fmt.Errorf("server %s: %w", redactURL(u), err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// failureReason is what makes two connection failures the same for the
// warning throttle: the error text, without the clock reading that an
// expired certificate's error carries ("current time … is after …"), in
// lower case (nats.go reports the same refusal as "nats: authorization
// violation" to one handler and "nats: Authorization Violation" to
// another).
func failureReason(err error) string {
	s := err.Error()
	var inv x509.CertificateInvalidError
	if errors.As(err, &inv) {
		s = strings.ReplaceAll(s, inv.Error(), fmt.Sprintf("x509 invalid certificate (reason %d)", inv.Reason))
	}
	return strings.ToLower(s)
}

// redactURL drops the user information (user, password or token) from a
// server URL for logs and errors.
func redactURL(s string) string {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil || u.User == nil {
		return strings.TrimSpace(s)
	}
	u.User = url.User("redacted")
	return u.String()
}

// RedactURLs returns comma-separated NATS URLs with any credentials in
// them replaced by "redacted", for logs and start-up messages.
func RedactURLs(s string) string { return redactURLs(s) }

// redactURLs is redactURL for a comma-separated list.
func redactURLs(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = redactURL(p)
	}
	return strings.Join(parts, ",")
}

// isAuthorizationError reports whether the server refused a connection's
// credentials (nats.go reports it as an error value or, from some
// handlers, only as text).
func isAuthorizationError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}
