package nodeagent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/execmesh/execmesh/bus"
	"github.com/execmesh/execmesh/internal/atomicfile"
	"github.com/execmesh/execmesh/protocol"
)

// Errors of joining by code.
var (
	// ErrBadJoinCode: the code does not decode.
	ErrBadJoinCode = errors.New("nodeagent: invalid join code")
	// ErrJoinRefused: the server or the gateway refused the code.
	ErrJoinRefused = errors.New("nodeagent: join refused")
)

// maxJoinCodeLen bounds a join code before decoding.
const maxJoinCodeLen = 8 << 10

// EncodeJoinCode returns the text form of c: unpadded base64url of its
// JSON, one shell word.
func EncodeJoinCode(c JoinCode) (string, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// DecodeJoinCode parses a join code and checks that it names at least one
// server, a valid prefix and a secret.
func DecodeJoinCode(code string) (JoinCode, error) {
	code = strings.TrimSpace(code)
	if code == "" || len(code) > maxJoinCodeLen {
		return JoinCode{}, fmt.Errorf("%w: empty or too long", ErrBadJoinCode)
	}
	raw, err := base64.RawURLEncoding.DecodeString(code)
	if err != nil {
		return JoinCode{}, fmt.Errorf("%w: not base64url: %w", ErrBadJoinCode, err)
	}
	var c JoinCode
	if err := decodeStrict("join code", raw, &c); err != nil {
		return JoinCode{}, fmt.Errorf("%w: %w", ErrBadJoinCode, err)
	}
	switch {
	case c.V != 1:
		return JoinCode{}, fmt.Errorf("%w: version %d is not supported", ErrBadJoinCode, c.V)
	case len(c.URLs) == 0:
		return JoinCode{}, fmt.Errorf("%w: no NATS server URL", ErrBadJoinCode)
	case c.Secret == "":
		return JoinCode{}, fmt.Errorf("%w: no secret", ErrBadJoinCode)
	}
	if err := protocol.ValidateSubjectPrefix(c.Prefix); err != nil {
		return JoinCode{}, fmt.Errorf("%w: %w", ErrBadJoinCode, err)
	}
	return c, nil
}

// join redeems code: it connects with the code's one-time credential,
// sends the node's public key with a signature made with its seed, and
// returns the gateway's answer. A credential the server refuses (the code
// was used, expired, or never issued) fails at once with ErrJoinRefused;
// unreachable servers are retried until ctx ends.
func (a *Agent) join(ctx context.Context, code JoinCode) (PairResponse, error) {
	kp, err := nkeys.FromSeed(a.id.Seed)
	if err != nil {
		return PairResponse{}, fmt.Errorf("nodeagent: join: %w", err)
	}
	sig, err := kp.Sign(JoinSignedText(code.Secret, a.id.PublicKey))
	kp.Wipe()
	if err != nil {
		return PairResponse{}, fmt.Errorf("nodeagent: join: sign: %w", err)
	}
	inboxOwner := a.id.NodeID
	if code.User != "" {
		inboxOwner = code.User
	}
	opts := []nats.Option{
		nats.Name("execmesh-node-join " + a.name),
		nats.CustomInboxPrefix(bus.InboxPrefix(inboxOwner)),
		nats.Timeout(5 * time.Second),
		nats.NoReconnect(),
	}
	if code.User != "" {
		opts = append(opts, nats.UserInfo(code.User, code.Secret))
	}
	if a.cfg.Client.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(a.cfg.Client.TLSCAFile))
	}
	url := strings.Join(code.URLs, ",")
	connect := func() (*nats.Conn, error) {
		for attempt := 0; ; attempt++ {
			nc, err := nats.Connect(url, opts...)
			if err == nil {
				return nc, nil
			}
			if isAuthError(err) {
				return nil, fmt.Errorf("%w: the NATS server at %s refused the join code's credential: the code was already used, has expired, or was never issued (%w)", ErrJoinRefused, url, err)
			}
			a.log.Info("join: NATS server not reachable yet; retrying", "urls", url, "err", err)
			if err := sleepCtx(ctx, min(time.Duration(attempt+1)*500*time.Millisecond, 3*time.Second)); err != nil {
				return nil, fmt.Errorf("nodeagent: join: cannot reach %s: %w", url, err)
			}
		}
	}
	nc, err := connect()
	if err != nil {
		return PairResponse{}, err
	}
	defer func() { nc.Close() }()

	req := PairRequest{
		Type: PairJoin, NodeID: a.id.NodeID, PublicKey: a.id.PublicKey, Name: a.name,
		Platform: a.platform, Version: a.cfg.Version, Instance: a.instance,
		JoinUser: code.User, JoinSecret: code.Secret,
		Signature: base64.RawURLEncoding.EncodeToString(sig),
	}
	body, _ := json.Marshal(req)
	subj := protocol.Subjects(code.Prefix).PairRequest
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		m, err := bus.RequestChunked(rctx, nc, subj, body, nil)
		cancel()
		if errors.Is(err, bus.ErrUnreachable) {
			// The server is up but the gateway is not serving yet.
			if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
				return PairResponse{}, fmt.Errorf("nodeagent: join: no gateway answers on %s: %w", subj, err)
			}
			continue
		}
		if err != nil && nc.IsClosed() && ctx.Err() == nil {
			// The server dropped the connection: when it was the one-time
			// user's removal (the code expired meanwhile), connecting
			// again says so; otherwise the request is sent again, which
			// is safe: a code is redeemed at most once.
			nc.Close()
			if nc, err = connect(); err != nil {
				return PairResponse{}, err
			}
			continue
		}
		if err != nil {
			return PairResponse{}, fmt.Errorf("nodeagent: join: %w", err)
		}
		var resp PairResponse
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			return PairResponse{}, fmt.Errorf("nodeagent: join: malformed answer: %w", err)
		}
		if resp.Error != nil {
			return resp, fmt.Errorf("%w: %s", ErrJoinRefused, resp.Error.Message)
		}
		if resp.Status != PairingPaired {
			return resp, fmt.Errorf("%w: the gateway answered %q", ErrJoinRefused, resp.Status)
		}
		return resp, nil
	}
}

// isAuthError reports whether err is the server refusing the credential.
func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// savedJoin is the JoinFile: where a node that joined by code connects on
// later starts.
type savedJoin struct {
	URLs     []string `json:"urls"`
	Prefix   string   `json:"prefix"`
	NodeID   string   `json:"nodeId"`
	Name     string   `json:"name,omitempty"`
	JoinedAt int64    `json:"joinedAt"`
}

func loadJoin(stateDir string) (*savedJoin, error) {
	if stateDir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(stateDir, JoinFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nodeagent: %w", err)
	}
	var s savedJoin
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("nodeagent: %s: %w", filepath.Join(stateDir, JoinFile), err)
	}
	if len(s.URLs) == 0 {
		return nil, nil
	}
	return &s, nil
}

func saveJoin(stateDir string, s savedJoin) error {
	if stateDir == "" {
		return errors.New("no state dir")
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(stateDir, JoinFile), append(b, '\n'), 0o600)
}
