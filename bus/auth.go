package bus

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// authenticator admits the embedded server's clients from an identity
// table that is replaced whole when identities change. It is the server's
// CustomClientAuthentication, so adding or removing a node never reloads
// the server's options: nats-server reads its options without a lock in
// places (creating a stream, for one), and a ReloadOptions during such
// work is a data race inside the server. A changed table affects new
// connections only; Server disconnects the clients whose identity went
// away or changed (see Server.applyLocked).
type authenticator struct {
	table atomic.Pointer[authTable]
}

// authTable is immutable once stored: connected clients share its
// permission values.
type authTable struct {
	users map[string]*server.User     // by name
	nkeys map[string]*server.NkeyUser // by public key
}

// newAuthTable builds the server-side identities from users and nk, which
// the caller has validated and no longer changes.
func newAuthTable(users []User, nk []NKeyUser) *authTable {
	t := &authTable{
		users: make(map[string]*server.User, len(users)),
		nkeys: make(map[string]*server.NkeyUser, len(nk)),
	}
	for _, u := range users {
		pw := u.Password
		if u.PasswordSHA256 != "" {
			pw = hashedPasswordPrefix + strings.ToLower(u.PasswordSHA256)
		}
		t.users[u.Name] = &server.User{
			Username:    u.Name,
			Password:    pw,
			Permissions: serverPermissions(u.Permissions),
		}
	}
	for _, u := range nk {
		t.nkeys[u.PublicKey] = &server.NkeyUser{
			Nkey:        u.PublicKey,
			Permissions: serverPermissions(u.Permissions),
		}
	}
	return t
}

// serverPermissions copies p and completes it the way nats-server does for
// users in its configuration (validateResponsePermissions): a response
// permission needs a publish permission, with no blanket allow unless one
// was given, and zero limits mean the server's defaults.
func serverPermissions(p *server.Permissions) *server.Permissions {
	c := clonePermissions(p)
	if c == nil || c.Response == nil {
		return c
	}
	if c.Publish == nil {
		c.Publish = &server.SubjectPermission{}
	}
	if c.Publish.Allow == nil {
		c.Publish.Allow = []string{}
	}
	if c.Response.MaxMsgs == 0 {
		c.Response.MaxMsgs = server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS
	}
	if c.Response.Expires == 0 {
		c.Response.Expires = server.DEFAULT_ALLOW_RESPONSE_EXPIRATION
	}
	return c
}

// nkeyRegistrar is the part of nats-server's client that records an nkey
// user (the ClientAuthentication interface only has RegisterUser).
type nkeyRegistrar interface {
	RegisterNkeyUser(*server.NkeyUser) error
}

// Check implements server.Authentication with the rules of nats-server's
// own users and nkeys: a client that presents an nkey is judged by it
// alone and must sign the nonce of its INFO; otherwise name and password
// must match, compared in constant time.
func (a *authenticator) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	t := a.table.Load()
	if t == nil {
		return false
	}
	opts := c.GetOpts()
	if opts.Nkey != "" {
		u, ok := t.nkeys[opts.Nkey]
		if !ok || !verifyNonce(opts.Nkey, opts.Sig, c.GetNonce()) {
			return false
		}
		if r, ok := c.(nkeyRegistrar); ok {
			return r.RegisterNkeyUser(u) == nil
		}
		c.RegisterUser(&server.User{Username: u.Nkey, Permissions: u.Permissions})
		return true
	}
	u, ok := t.users[opts.Username]
	if !ok || opts.Username == "" {
		return false
	}
	if !passwordMatches(u.Password, opts.Password) {
		return false
	}
	c.RegisterUser(u)
	return true
}

// hashedPasswordPrefix marks a table password that is the hex SHA-256 of
// the real one (User.PasswordSHA256); only the table holds such values.
const hashedPasswordPrefix = "sha256:"

// passwordMatches compares a presented password with a table entry, in
// constant time.
func passwordMatches(stored, presented string) bool {
	if hex, ok := strings.CutPrefix(stored, hashedPasswordPrefix); ok {
		sum := sha256.Sum256([]byte(presented))
		return subtle.ConstantTimeCompare([]byte(hex), []byte(fmt.Sprintf("%x", sum))) == 1
	}
	return subtle.ConstantTimeCompare([]byte(stored), []byte(presented)) == 1
}

// verifyNonce reports whether sig (base64, URL or standard alphabet, as
// nats-server accepts) is the signature of nonce by the key pub.
func verifyNonce(pub, sig string, nonce []byte) bool {
	if sig == "" || len(nonce) == 0 {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		if raw, err = base64.StdEncoding.DecodeString(sig); err != nil {
			return false
		}
	}
	kp, err := nkeys.FromPublicKey(pub)
	if err != nil {
		return false
	}
	return kp.Verify(nonce, raw) == nil
}

// changedIdentities returns the connection user names (nats-server's
// authorized user: the name, or the public key) whose identity old has and
// next lacks or grants different permissions.
func changedIdentities(old, next *authTable) []string {
	if old == nil {
		return nil
	}
	var out []string
	for name, u := range old.users {
		if n, ok := next.users[name]; !ok || n.Password != u.Password || !samePermissions(n.Permissions, u.Permissions) {
			out = append(out, name)
		}
	}
	for key, u := range old.nkeys {
		if n, ok := next.nkeys[key]; !ok || !samePermissions(n.Permissions, u.Permissions) {
			out = append(out, key)
		}
	}
	return out
}

func samePermissions(a, b *server.Permissions) bool {
	if a == nil || b == nil {
		return a == b
	}
	return sameSubjects(a.Publish, b.Publish) && sameSubjects(a.Subscribe, b.Subscribe) && sameResponse(a.Response, b.Response)
}

func sameSubjects(a, b *server.SubjectPermission) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.Allow, b.Allow) && slices.Equal(a.Deny, b.Deny)
}

func sameResponse(a, b *server.ResponsePermission) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
